//! `model_type: llama` (Llama 2, 3, 3.1, 3.2): the dense decoder with rope
//! theta 10000 unless set, llama3 rope scaling, a tied head unless the
//! config says otherwise, and `attention_bias` on all four projections.

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use crate::engine::LoadError;

/// Settles a Llama config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let keys = ConfigKeys::parse(value, path)?;
    let rope_theta = keys.rope_theta.unwrap_or(10_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let bias = keys.attention_bias.unwrap_or(false);
    let mut config = DecoderConfig::from_keys("llama", keys, rope_theta, tie);
    config.qkv_bias = bias;
    config.o_bias = bias;
    Ok(config)
}
