//! `model_type: gemma3_text` (Gemma 3 1B and the text part of larger ones)
//! and `gemma3` (the multimodal checkpoints: the text model's config is
//! `text_config` and its tensors sit under `language_model.`; the vision
//! tower is skipped, so the model answers text only).
//!
//! What Gemma does differently from the shared decoder: embeddings scaled by
//! the square root of the hidden size (rounded to bfloat16 first), RMSNorm
//! scales stored minus one, four norms per layer (before and after each of
//! attention and MLP), q/k norms, a softmax scale from
//! `query_pre_attn_scalar`, the tanh GELU, and five sliding-window layers
//! (window `sliding_window`, rope base `rope_local_base_freq`) before each
//! full one (`sliding_window_pattern`). Missing keys take mlx-lm's defaults,
//! since the multimodal configs leave most of them out.

use std::path::Path;

use serde_json::{Value, json};

use super::decoder::{Activation, ConfigKeys, DecoderConfig};
use crate::engine::LoadError;

/// mlx-lm's defaults for a Gemma 3 text config, for the keys a config may
/// leave out.
fn text_defaults() -> Value {
    json!({
        "hidden_size": 1152,
        "num_hidden_layers": 26,
        "intermediate_size": 6912,
        "num_attention_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1.0e-6,
        "vocab_size": 262144,
        "num_key_value_heads": 1,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256.0,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 32768,
    })
}

/// `base` with `overrides`' keys laid over it (both objects).
fn merged(base: Value, overrides: &Value) -> Value {
    let mut out = base;
    if let (Some(out_map), Some(over)) = (out.as_object_mut(), overrides.as_object()) {
        for (key, value) in over {
            if !value.is_null() {
                out_map.insert(key.clone(), value.clone());
            }
        }
    }
    out
}

/// Settles a `gemma3_text` config.
pub fn text_config(value: &Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    settle("gemma3_text", &merged(text_defaults(), value), path)
}

/// Settles a multimodal `gemma3` config: its `text_config`, with the
/// top-level vocabulary size and quantization, read from `language_model.`.
pub fn multimodal_config(value: &Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let Some(text) = value.get("text_config").filter(|t| t.is_object()) else {
        return Err(LoadError::ConfigInvalid {
            path: path.to_owned(),
            message: "a gemma3 config needs `text_config` (the text model's settings)".into(),
        });
    };
    // mlx-lm's multimodal defaults differ from the text model's for these.
    let mut text = merged(
        merged(
            text_defaults(),
            &json!({"num_attention_heads": 8, "num_key_value_heads": 4}),
        ),
        text,
    );
    text["vocab_size"] = value.get("vocab_size").cloned().unwrap_or(json!(262_208));
    if let Some(quantization) = value.get("quantization") {
        text["quantization"] = quantization.clone();
    }
    let mut config = settle("gemma3", &text, path)?;
    config.weight_prefix = "language_model.model".into();
    config.head_prefix = "language_model.lm_head".into();
    config.skipped_prefixes = vec!["vision_tower.".into(), "multi_modal_projector.".into()];
    Ok(config)
}

fn settle(model_type: &str, value: &Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let invalid = |message: String| LoadError::ConfigInvalid {
        path: path.to_owned(),
        message,
    };
    let number = |key: &str| {
        value[key]
            .as_f64()
            .ok_or_else(|| invalid(format!("`{key}` is missing or not a number")))
    };
    let keys = ConfigKeys::parse(value, path)?;
    let rope_theta = keys.require_rope_theta(path)?;
    let window = number("sliding_window")? as i32;
    let pattern = number("sliding_window_pattern")? as usize;
    if window < 1 || pattern < 1 {
        return Err(invalid(format!(
            "sliding_window {window} and sliding_window_pattern {pattern} must be positive"
        )));
    }
    let scalar = number("query_pre_attn_scalar")? as f32;
    let local_base = number("rope_local_base_freq")? as f32;
    let hidden = keys.hidden_size;
    let layers = keys.num_hidden_layers;
    // The head is tied exactly when the checkpoint has none (mlx-lm decides
    // the same way); `Decoder::load` settles it from the tensors.
    let mut config = DecoderConfig::from_keys(model_type, keys, rope_theta, false);
    config.tie_when_no_head = true;
    config.qk_norm = true;
    config.norms_add_one = true;
    config.sandwich_norms = true;
    config.embed_scale = Some((f64::from(hidden)).sqrt() as f32);
    config.activation = Activation::GeluApprox;
    config.attention_scale = scalar.powf(-0.5);
    config.local_rope_theta = Some(local_base);
    config.layer_windows = (0..layers)
        .map(|i| ((i + 1) % pattern != 0).then_some(window))
        .collect();
    Ok(config)
}
