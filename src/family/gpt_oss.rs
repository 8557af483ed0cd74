//! `model_type: gpt_oss` (gpt-oss 20B and 120B): attention with biases on
//! every projection and a learned sink logit per head, sliding-window
//! layers beside full ones as `layer_types` says (alternating, sliding
//! first, when it is missing), yarn rope, an untied head, and routed
//! experts in every layer (`ExpertsKind::GptOss`). Missing keys take
//! mlx-lm's defaults, the 20B model's values. The checkpoint is read in
//! the layout mlx-lm converts to (mlx-community's): each projection's
//! experts stacked under `mlp.experts.{gate,up,down}_proj`, not OpenAI's
//! fused `gate_up_proj_blocks`. Replies are harmony messages.

use serde_json::{Value, json};

use super::config::{ConfigError, ConfigKeys, ExpertsConfig, ExpertsKind, Keys, ModelConfig};
use super::synth::{ExpertShape, Shape, SynthChoices, SynthRecipe};
use super::{Family, ReplyStyle, ToolCallSyntax};

pub const GPT_OSS: Family = Family {
    model_type: "gpt_oss",
    class_name: "GptOssForCausalLM",
    about: "gpt-oss 20B and 120B (MLX conversions: experts in mxfp4 or affine)",
    settle,
    unreadable_layout,
    reply: ReplyStyle {
        harmony: true,
        thinks: None,
        tool_calls: ToolCallSyntax::Tagged,
    },
    synth: SynthRecipe {
        adjust,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// OpenAI's own gpt-oss repos keep the experts as `*_blocks`/`*_scales`
/// tensors (`quantization_config.quant_method: mxfp4`, no MLX
/// `quantization`); the engine reads the layout MLX's conversion writes.
fn unreadable_layout(config: &Value) -> Option<&'static str> {
    let original = config.get("quantization").is_none()
        && config["quantization_config"]["quant_method"].as_str() == Some("mxfp4");
    original.then_some(
        "OpenAI's original gpt-oss checkpoint (its experts in `_blocks` and `_scales` \
         tensors, not MLX's layout); take the MLX conversion instead, e.g. \
         mlx-community/gpt-oss-20b-MXFP4-Q8",
    )
}

/// Settles a gpt-oss config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    keys.head_dim = Some(keys.head_dim.unwrap_or(64));
    keys.num_key_value_heads = Some(keys.num_key_value_heads.unwrap_or(8));
    let rope_theta = keys.rope_theta.unwrap_or(150_000.0);
    let layers = keys.num_hidden_layers;
    let window = read.count("sliding_window")?.unwrap_or(128) as i32;
    let layer_windows = match read.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .map(|kind| match kind.as_str() {
                Some("sliding_attention") => Ok(Some(window)),
                Some("full_attention") => Ok(None),
                _ => Err(ConfigError::Invalid {
                    key: "layer_types".into(),
                    found: kind.to_string(),
                    expected: "an entry other than sliding_attention or full_attention",
                }),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: "layer_types".into(),
                found: other.to_string(),
                expected: "not a list",
            });
        }
        // mlx-lm alternates, sliding first, over pairs of layers; an odd
        // count would leave its last layer without a type (mlx-lm then
        // skips that layer), so it is refused here.
        None if layers % 2 == 0 => (0..layers)
            .map(|i| (i % 2 == 0).then_some(window))
            .collect(),
        None => {
            return Err(ConfigError::Inconsistent(format!(
                "without layer_types, gpt-oss alternates sliding and full layers in pairs, \
                 but num_hidden_layers is {layers}, an odd number; add layer_types"
            )));
        }
    };
    if layer_windows.len() != layers {
        return Err(ConfigError::Inconsistent(format!(
            "layer_types names {} layers, num_hidden_layers says {layers}",
            layer_windows.len()
        )));
    }
    let count = |key: &str, default: u64| -> Result<i32, ConfigError> {
        Ok(read.count(key)?.unwrap_or(default) as i32)
    };
    let experts = ExpertsConfig {
        num_experts: count("num_local_experts", 128)?,
        num_experts_per_tok: count("num_experts_per_tok", 4)?,
        moe_intermediate_size: keys.intermediate_size,
        norm_topk_prob: false,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        // mlx-lm clamps at 7.0, the value every gpt-oss config has.
        kind: ExpertsKind::GptOss {
            swiglu_limit: read.number("swiglu_limit")?.unwrap_or(7.0) as f32,
        },
        shared_expert_intermediate_size: None,
    };
    let mut config = ModelConfig::from_keys("gpt_oss", keys, rope_theta, false);
    config.qkv_bias = true;
    config.o_bias = true;
    config.attention_sinks = true;
    config.layer_windows = layer_windows;
    config.experts = Some(experts);
    Ok(config)
}

/// gpt-oss's experts are `intermediate_size` wide and it has no dense MLP;
/// its head is never tied; rope base 150,000 with yarn (in the config).
fn adjust(shape: &mut Shape) {
    let experts = shape
        .experts
        .unwrap_or_else(|| ExpertShape::eight_choose_two(shape));
    shape.experts = Some(experts);
    shape.intermediate_size = experts.moe_intermediate_size;
    shape.tie_word_embeddings = false;
    shape.rope_theta = 150_000.0;
    shape.rope_scaling = None;
}

fn synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    let layer_types: Vec<&str> = (0..shape.num_hidden_layers)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["layer_types"] = json!(layer_types);
    config["sliding_window"] = json!(choices.sliding_window);
    config["attention_bias"] = json!(true);
    config["swiglu_limit"] = json!(7.0);
    // gpt-oss 20B's yarn, over the preset's context.
    config["rope_scaling"] = json!({
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": (shape.max_position_embeddings / 32).max(1),
        "truncate": false,
    });
    if let Some(experts) = shape.experts {
        config["num_local_experts"] = json!(experts.num_experts);
        config["num_experts_per_tok"] = json!(experts.experts_per_token);
    }
}
