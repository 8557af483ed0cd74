//! `model_type: phi3` (Phi-3, Phi-3.5, Phi-4-mini): the dense decoder with
//! q, k and v in one `qkv_proj` and gate and up in one `gate_up_proj`, the
//! head size `hidden_size / num_attention_heads`, rope over the first
//! `partial_rotary_factor` of each head, and longrope (`su`) scaling whose
//! long factors apply at every length, as mlx-lm applies them (transformers
//! uses the short factors below the original context, so its answers to
//! short prompts differ slightly from both).

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use crate::engine::LoadError;

/// Settles a Phi-3 config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let mut keys = ConfigKeys::parse(value, path)?;
    // The head size is always derived; a `head_dim` key is not read.
    keys.head_dim = None;
    let rope_theta = keys.rope_theta.unwrap_or(10_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let partial = value["partial_rotary_factor"].as_f64().unwrap_or(1.0);
    let original = value["original_max_position_embeddings"]
        .as_f64()
        .unwrap_or(4096.0) as f32;
    let mut config = DecoderConfig::from_keys("phi3", keys, rope_theta, tie);
    config.max_position_embeddings = Some(config.max_position_embeddings.unwrap_or(131_072));
    config.fused_projections = true;
    config.rotary_dims = (f64::from(config.head_dim) * partial) as i32;
    if let Some(scaling) = config.rope_scaling.as_mut() {
        let kind = scaling
            .rope_type
            .as_deref()
            .or(scaling.legacy_type.as_deref());
        match kind {
            Some("longrope") | Some("su") => {
                if scaling.long_factor.is_none() {
                    return Err(LoadError::ConfigInvalid {
                        path: path.to_owned(),
                        message: "rope_scaling `longrope` needs long_factor".into(),
                    });
                }
                // Phi keeps the original context at the top level.
                scaling.original_max_position_embeddings = Some(original);
            }
            Some("linear") => {}
            // mlx-lm runs other types as plain rope (with a warning).
            _ => config.rope_scaling = None,
        }
    }
    Ok(config)
}
