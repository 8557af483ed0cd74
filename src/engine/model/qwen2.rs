//! `model_type: qwen2` (Qwen2, Qwen2.5): the dense decoder with biases on
//! the q, k and v projections (none on the output projection), rope theta
//! 1,000,000 unless set, and a tied head unless the config says otherwise.

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use crate::engine::LoadError;

/// Settles a Qwen2 config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let keys = ConfigKeys::parse(value, path)?;
    let rope_theta = keys.rope_theta.unwrap_or(1_000_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let mut config = DecoderConfig::from_keys("qwen2", keys, rope_theta, tie);
    config.qkv_bias = true;
    Ok(config)
}
