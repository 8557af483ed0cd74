//! `model_type: ministral3` (Ministral 3, the text model): a Llama without
//! biases whose rope comes from `rope_parameters` (yarn, with its
//! `rope_theta`), whose layers attend over everything or over the latest
//! `sliding_window` positions as `layer_types` says (all of them full when
//! absent), and whose queries are multiplied past the original context by
//! `1 + llama_4_scaling_beta * ln(1 + floor(p / original_max_position_embeddings))`
//! at position `p`. The head is tied unless the config says otherwise.
//!
//! Replies call tools as `[TOOL_CALLS]name[ARGS]{...}`.
//!
//! Mistral publishes its instruct models in FP8 (`weight_scale_inv`
//! tensors beside the weights), which is not MLX's layout: those are refused
//! before download, naming an MLX conversion to take instead.

use serde_json::{Value, json};

use super::config::{
    ConfigError, ConfigKeys, Keys, ModelConfig, PositionQueryScale, RopeScaling, missing,
    windows_of_layer_types,
};
use super::synth::{Shape, SynthChoices, SynthRecipe, plain_rope};
use super::{Family, ReplyStyle, ToolCallSyntax};

/// Mistral's instruct models answer plainly and call tools after a
/// `[TOOL_CALLS]` control token, in this family and in `mistral3`.
pub const MISTRAL_REPLIES: ReplyStyle = ReplyStyle {
    harmony: false,
    thinks: None,
    tool_calls: ToolCallSyntax::Mistral,
};

pub const MINISTRAL3: Family = Family {
    model_type: "ministral3",
    class_name: "Ministral3ForCausalLM",
    about: "Ministral 3's text model",
    settle,
    unreadable_layout: fp8_checkpoint,
    reply: MISTRAL_REPLIES,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// Mistral's own FP8 checkpoints of Ministral 3 (and of the multimodal
/// Mistral 3 models, whose config nests the text model's).
pub(super) fn fp8_checkpoint(config: &Value) -> Option<&'static str> {
    let fp8 = |c: &Value| c["quantization_config"]["quant_method"].as_str() == Some("fp8");
    let original =
        config.get("quantization").is_none() && (fp8(config) || fp8(&config["text_config"]));
    original.then_some(
        "Mistral's FP8 checkpoint (8-bit float weights with `weight_scale_inv` tensors, \
         not MLX's layout); take an MLX conversion instead, e.g. \
         mlx-community/Ministral-3-3B-Instruct-2512-4bit",
    )
}

/// A key of `rope_parameters`, named as such in its error.
fn nested(error: ConfigError) -> ConfigError {
    match error {
        ConfigError::Missing { key } => missing(&format!("rope_parameters.{key}")),
        ConfigError::Invalid {
            key,
            found,
            expected,
        } => ConfigError::Invalid {
            key: format!("rope_parameters.{key}"),
            found,
            expected,
        },
        other => other,
    }
}

/// Settles a Ministral 3 text config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let Some(params) = Keys::of(value).get("rope_parameters") else {
        return Err(missing("rope_parameters"));
    };
    let rope = Keys::of(params);
    let rope_theta = rope.required_number("rope_theta").map_err(nested)? as f32;
    let beta = rope
        .required_number("llama_4_scaling_beta")
        .map_err(nested)? as f32;
    let original = rope
        .required_count("original_max_position_embeddings")
        .map_err(nested)?;
    let original = u32::try_from(original).map_err(|_| ConfigError::Invalid {
        key: "rope_parameters.original_max_position_embeddings".into(),
        found: original.to_string(),
        expected: "a context length",
    })?;
    // mlx-lm reads the scaling's type from `type`, then `rope_type`.
    let mut scaling: RopeScaling =
        serde_json::from_value(params.clone()).map_err(|_| ConfigError::Invalid {
            key: "rope_parameters".into(),
            found: params.to_string(),
            expected: "a rope scaling object",
        })?;
    scaling.rope_type = scaling.legacy_type.clone().or(scaling.rope_type);
    keys.rope_scaling = match scaling.kind() {
        None | Some("default") => None,
        _ => Some(scaling),
    };
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let layers = keys.num_hidden_layers;
    let mut config = ModelConfig::from_keys("ministral3", keys, rope_theta, tie);
    // Ministral 3's projections have no biases, whatever a config says.
    config.mlp_bias = false;
    config.layer_windows = windows_of_layer_types(value, layers)?;
    config.query_scale = Some(PositionQueryScale {
        beta,
        original_max_position_embeddings: original,
    });
    Ok(config)
}

/// Ministral 3's rope stretch: its 262,144 positions over 16,384 original.
const YARN_FACTOR: usize = 16;

/// The keys as Ministral 3's text config has them: the rope only under
/// `rope_parameters` (the original context a sixteenth of the preset's, so
/// that a prompt of a few hundred tokens crosses it), and every other
/// layer sliding over the chosen window, the last one full.
fn synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    let layers = shape.num_hidden_layers;
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if (layers - 1 - i).is_multiple_of(2) {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    config["rope_parameters"] = json!({
        "type": "yarn",
        "rope_type": "yarn",
        "rope_theta": shape.rope_theta,
        "factor": YARN_FACTOR as f64,
        "original_max_position_embeddings": (shape.max_position_embeddings / YARN_FACTOR).max(1),
        "max_position_embeddings": shape.max_position_embeddings,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    });
    config["layer_types"] = json!(types);
    config["sliding_window"] = json!(choices.sliding_window);
    if let Some(fields) = config.as_object_mut() {
        for key in ["rope_theta", "rope_scaling", "attention_bias", "mlp_bias"] {
            fields.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ministral 3 3B's text config as published.
    fn published() -> Value {
        json!({
            "model_type": "ministral3", "hidden_size": 3072, "intermediate_size": 9216,
            "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 131072, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 262144, "sliding_window": null,
            "rope_parameters": {
                "type": "yarn", "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
            },
        })
    }

    #[test]
    fn rope_and_query_scale_come_from_rope_parameters() {
        let config = settle(&published()).unwrap();
        assert_eq!(config.rope_theta, 1e6);
        let scaling = config.rope_scaling.as_ref().unwrap();
        assert_eq!(scaling.kind(), Some("yarn"));
        assert_eq!(scaling.factor, 16.0);
        assert_eq!(scaling.original_max_position_embeddings, Some(16384.0));
        assert_eq!(
            config.query_scale,
            Some(PositionQueryScale {
                beta: 0.1,
                original_max_position_embeddings: 16384
            })
        );
        assert!(config.tie_word_embeddings, "tied unless said otherwise");
        assert!(config.layer_windows.is_empty(), "all layers full");
        let mut missing_beta = published();
        missing_beta["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("llama_4_scaling_beta");
        assert_eq!(
            settle(&missing_beta).unwrap_err().to_string(),
            "`rope_parameters.llama_4_scaling_beta` is missing"
        );
    }

    #[test]
    fn layer_types_give_sliding_layers_beside_full_ones() {
        let mut config = published();
        config["num_hidden_layers"] = json!(3);
        config["sliding_window"] = json!(4096);
        config["layer_types"] = json!(["sliding_attention", "sliding_attention", "full_attention"]);
        let settled = settle(&config).unwrap();
        assert_eq!(settled.layer_windows, [Some(4096), Some(4096), None]);
        config["layer_types"] = json!(["sliding_attention", "full_attention"]);
        let text = settle(&config).unwrap_err().to_string();
        assert!(text.contains("`layer_types` names 2 layers"), "{text}");
        config["layer_types"] = json!(vec!["sliding_attention"; 3]);
        let text = settle(&config).unwrap_err().to_string();
        assert!(text.contains("no full_attention layer"), "{text}");
        config["layer_types"] = json!(["sliding_attention", "sliding_attention", "full_attention"]);
        config["sliding_window"] = Value::Null;
        let text = settle(&config).unwrap_err().to_string();
        assert!(text.contains("`sliding_window` is not set"), "{text}");
    }

    #[test]
    fn mistral_fp8_checkpoints_are_refused_with_the_mlx_conversion_named() {
        let mut config = published();
        assert_eq!(fp8_checkpoint(&config), None);
        config["quantization_config"] =
            json!({"quant_method": "fp8", "activation_scheme": "static"});
        let reason = fp8_checkpoint(&config).unwrap();
        assert!(reason.contains("mlx-community/Ministral-3"), "{reason}");
        // An MLX conversion keeps the original block beside its own.
        config["quantization"] = json!({"group_size": 64, "bits": 4});
        assert_eq!(fp8_checkpoint(&config), None);
    }
}
