//! `model_type: mistral` (Mistral 7B and its fine-tunes): computed exactly as
//! Llama is (mlx-lm maps it to llama too). Its `sliding_window` is not
//! applied, also as mlx-lm does; answers longer than the window differ from
//! a windowed implementation.

use std::path::Path;

use super::decoder::DecoderConfig;
use crate::engine::LoadError;

/// Settles a Mistral config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let mut config = super::llama::config(value, path)?;
    config.model_type = "mistral".into();
    Ok(config)
}
