//! `model_type: qwen3_moe` (Qwen3's mixture-of-experts models, such as
//! Qwen3-30B-A3B): Qwen3's attention (q/k norms, no biases) with routed
//! experts in place of the dense MLP in the layers `decoder_sparse_step` and
//! `mlp_only_layers` choose (see `experts::ExpertsConfig`).

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use super::experts::ExpertsConfig;
use crate::engine::LoadError;

/// Settles a Qwen3-MoE config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let mut keys = ConfigKeys::parse(value, path)?;
    let rope_theta = keys.require_rope_theta(path)?;
    let tie = keys.require_tie_word_embeddings(path)?;
    // mlx-lm's qwen3_moe builds plain rope from rope_theta and never reads
    // rope_scaling; the same here, so both rotate alike.
    keys.rope_scaling = None;
    let experts: ExpertsConfig =
        serde_json::from_value(value.clone()).map_err(|e| LoadError::ConfigInvalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    let mut config = DecoderConfig::from_keys("qwen3_moe", keys, rope_theta, tie);
    config.qk_norm = true;
    config.experts = Some(experts);
    Ok(config)
}
