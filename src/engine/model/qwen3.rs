//! `model_type: qwen3` (Qwen3 dense models): the dense decoder with an
//! RMSNorm over each head's queries and keys before rope, no projection
//! biases, and `rope_theta` and `tie_word_embeddings` required in config.json.

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use crate::engine::LoadError;

/// Settles a Qwen3 config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let keys = ConfigKeys::parse(value, path)?;
    let rope_theta = keys.require_rope_theta(path)?;
    let tie = keys.require_tie_word_embeddings(path)?;
    let bias = keys.attention_bias.unwrap_or(false);
    let mut config = DecoderConfig::from_keys("qwen3", keys, rope_theta, tie);
    config.qkv_bias = bias;
    config.o_bias = bias;
    config.qk_norm = true;
    Ok(config)
}
