//! `model_type: gpt_oss` (gpt-oss 20B and 120B): attention with biases on
//! every projection and a learned sink logit per head, sliding-window
//! layers beside full ones as `layer_types` says (alternating, sliding
//! first, when it is missing), yarn rope, an untied head, and routed
//! experts in every layer (`ExpertsKind::GptOss`). Missing keys take
//! mlx-lm's defaults, the 20B model's values. The checkpoint is read in
//! the layout mlx-lm converts to (mlx-community's): each projection's
//! experts stacked under `mlp.experts.{gate,up,down}_proj`, not OpenAI's
//! fused `gate_up_proj_blocks`.

use std::path::Path;

use super::decoder::{ConfigKeys, DecoderConfig};
use super::experts::{ExpertsConfig, ExpertsKind};
use crate::engine::LoadError;

/// Settles a gpt-oss config.
pub fn config(value: &serde_json::Value, path: &Path) -> Result<DecoderConfig, LoadError> {
    let invalid = |message: String| LoadError::ConfigInvalid {
        path: path.to_owned(),
        message,
    };
    let mut keys = ConfigKeys::parse(value, path)?;
    keys.head_dim = Some(keys.head_dim.unwrap_or(64));
    keys.num_key_value_heads = Some(keys.num_key_value_heads.unwrap_or(8));
    let rope_theta = keys.rope_theta.unwrap_or(150_000.0);
    let layers = keys.num_hidden_layers;
    let number = |key: &str, default: f64| value[key].as_f64().unwrap_or(default);
    let window = number("sliding_window", 128.0) as i32;
    let layer_windows = match value["layer_types"].as_array() {
        Some(types) => types
            .iter()
            .map(|kind| match kind.as_str() {
                Some("sliding_attention") => Ok(Some(window)),
                Some("full_attention") => Ok(None),
                _ => Err(invalid(format!("layer_types has an unknown entry {kind}"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..layers)
            .map(|i| (i % 2 == 0).then_some(window))
            .collect(),
    };
    if layer_windows.len() != layers {
        return Err(invalid(format!(
            "layer_types names {} layers, num_hidden_layers says {layers}",
            layer_windows.len()
        )));
    }
    let experts = ExpertsConfig {
        num_experts: number("num_local_experts", 128.0) as i32,
        num_experts_per_tok: number("num_experts_per_tok", 4.0) as i32,
        moe_intermediate_size: keys.intermediate_size,
        norm_topk_prob: false,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        // mlx-lm clamps at 7.0, the value every gpt-oss config has.
        kind: ExpertsKind::GptOss {
            swiglu_limit: number("swiglu_limit", 7.0) as f32,
        },
    };
    let mut config = DecoderConfig::from_keys("gpt_oss", keys, rope_theta, false);
    config.qkv_bias = true;
    config.o_bias = true;
    config.attention_sinks = true;
    config.layer_windows = layer_windows;
    config.experts = Some(experts);
    Ok(config)
}
