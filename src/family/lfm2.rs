//! `model_type: lfm2` (Liquid AI's LFM2): most layers are gated short
//! convolutions over time (`in_proj` to two gates and an input, a depthwise
//! causal convolution of `conv_L_cache` positions, `out_proj`), whose cache
//! is the last `conv_L_cache - 1` inputs whatever the context; the others
//! (`full_attn_idxs`, or `layer_types` naming `full_attention`) are
//! grouped-query attention with q/k norms (`q_layernorm`, `k_layernorm`)
//! and plain rope. The MLP is SwiGLU (`w1`, `w3`, `w2` under
//! `feed_forward`) of `block_ff_dim`, cut to two thirds and rounded up to
//! `block_multiple_of` when `block_auto_adjust_ff_dim` says so; each head
//! is `hidden_size / num_attention_heads` wide whatever `head_dim` says;
//! the head is always the embedding (mlx-lm's `as_linear`); the final norm
//! is `embedding_norm`. Defaults and rules are mlx-lm's `models/lfm2.py`.
//! Tool calls are a Python-style list between `<|tool_call_start|>` and
//! `<|tool_call_end|>`.

use serde_json::{Value, json};

use super::config::{
    ConfigError, ConfigKeys, Keys, ModelConfig, ShortConvConfig, TensorNames, missing,
};
use super::synth::{Shape, SynthChoices, SynthRecipe};
use super::{Family, ReplyStyle, ToolCallSyntax, every_layout_readable};

pub const LFM2: Family = Family {
    model_type: "lfm2",
    class_name: "Lfm2ForCausalLM",
    about: "Liquid AI's LFM2 (short convolutions beside attention)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle {
        harmony: false,
        thinks: None,
        tool_calls: ToolCallSyntax::PythonList,
    },
    synth: SynthRecipe {
        adjust,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// LFM2's checkpoint names.
const NAMES: TensorNames = TensorNames {
    input_norm: "operator_norm",
    mlp_norm: "ffn_norm",
    o_proj: "out_proj",
    q_norm: "q_layernorm",
    k_norm: "k_layernorm",
    mlp: "feed_forward",
    gate_up_down: ["w1", "w3", "w2"],
    final_norm: "embedding_norm",
};

/// The MLP's width as mlx-lm's `MLP` computes it from `block_ff_dim`.
fn ff_dim(read: &Keys) -> Result<u64, ConfigError> {
    let stated = match read.count("block_ff_dim")? {
        Some(n) => n,
        None => read
            .count("intermediate_size")?
            .ok_or_else(|| missing("block_ff_dim"))?,
    };
    let adjust = read
        .flag("block_auto_adjust_ff_dim")?
        .ok_or_else(|| missing("block_auto_adjust_ff_dim"))?;
    if !adjust {
        return Ok(stated);
    }
    let mut ff = 2 * stated / 3;
    if let Some(multiplier) = read.number("block_ffn_dim_multiplier")? {
        ff = (multiplier * ff as f64) as u64;
    }
    let multiple = read.required_count("block_multiple_of")?;
    Ok(multiple * ff.div_ceil(multiple))
}

/// Settles an LFM2 config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let read = Keys::of(value);
    let ff = ff_dim(&read)?;
    let norm_eps = read.required_number("norm_eps")?;
    let kernel = read.required_count("conv_L_cache")?;
    let conv_bias = read
        .flag("conv_bias")?
        .ok_or_else(|| missing("conv_bias"))?;
    // The shared keys under LFM2's names; `head_dim` is not read (each
    // head is hidden / heads wide).
    let mut shared = value.clone();
    shared["intermediate_size"] = json!(ff);
    shared["rms_norm_eps"] = json!(norm_eps);
    shared["head_dim"] = Value::Null;
    let mut keys = ConfigKeys::parse(&shared)?;
    // Plain rope from rope_theta (or rope_parameters), as mlx-lm builds it.
    keys.rope_scaling = None;
    let rope_theta = keys.rope_theta.unwrap_or(1_000_000.0);
    let layers = keys.num_hidden_layers;
    let attention: Vec<usize> = match read.get("full_attn_idxs") {
        Some(_) => read.whole_list("full_attn_idxs")?,
        None => {
            let Some(Value::Array(types)) = read.get("layer_types") else {
                return Err(missing("full_attn_idxs"));
            };
            types
                .iter()
                .enumerate()
                .filter(|(_, t)| t.as_str() == Some("full_attention"))
                .map(|(i, _)| i)
                .collect()
        }
    };
    let mut config = ModelConfig::from_keys("lfm2", keys, rope_theta, true);
    config.qk_norm = true;
    config.names = NAMES;
    config.short_conv = Some(ShortConvConfig {
        kernel: i32::try_from(kernel).map_err(|_| ConfigError::Invalid {
            key: "conv_L_cache".into(),
            found: kernel.to_string(),
            expected: "a convolution of a few positions",
        })?,
        bias: conv_bias,
        layers: (0..layers).map(|i| !attention.contains(&i)).collect(),
    });
    Ok(config)
}

/// LFM2's conventions: plain rope with a base of one million, the head tied
/// to the embedding, heads of hidden / heads.
fn adjust(shape: &mut Shape) {
    super::synth::plain_rope(shape);
    shape.tie_word_embeddings = true;
    shape.head_dim = shape.hidden_size / shape.num_attention_heads.max(1);
}

/// LFM2's own keys: every second layer attends (so a two-layer preset has
/// one of each kind), the rest convolve over 3 positions; the MLP width is
/// written as LFM2's configs write it (three halves of the width it
/// computes, cut back by `block_auto_adjust_ff_dim`).
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    let stated = shape.intermediate_size * 3 / 2;
    config["intermediate_size"] = json!(stated);
    config["block_ff_dim"] = json!(stated);
    config["block_dim"] = json!(shape.hidden_size);
    config["block_multiple_of"] = json!(256);
    config["block_ffn_dim_multiplier"] = json!(1.0);
    config["block_auto_adjust_ff_dim"] = json!(true);
    config["norm_eps"] = json!(shape.rms_norm_eps);
    config["conv_bias"] = json!(false);
    config["conv_L_cache"] = json!(3);
    let types: Vec<&str> = (0..shape.num_hidden_layers)
        .map(|i| if i % 2 == 1 { "full_attention" } else { "conv" })
        .collect();
    config["layer_types"] = json!(types);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LFM2-1.2B's published config.json, the keys mlx-lm reads.
    fn lfm2_1_2b() -> Value {
        json!({
            "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
            "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 128000,
            "norm_eps": 1e-5, "conv_bias": false, "conv_L_cache": 3,
            "block_dim": 2048, "block_ff_dim": 12288, "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true,
            "rope_theta": 1000000.0, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        })
    }

    #[test]
    fn lfm2_1_2b_settles_to_its_shape() {
        let config = settle(&lfm2_1_2b()).unwrap();
        assert_eq!(config.intermediate_size, 8192);
        assert_eq!(config.head_dim, 64);
        assert!(config.tie_word_embeddings && config.qk_norm);
        assert_eq!(config.state_layers(), Some((10, 2 * 2048, 0)));
        assert!(!config.is_conv_layer(2) && config.is_conv_layer(0));
        let mut by_types = lfm2_1_2b();
        by_types.as_object_mut().unwrap().remove("full_attn_idxs");
        by_types["layer_types"] = json!(
            (0..16)
                .map(|i| if [2, 5, 8, 10, 12, 14].contains(&i) {
                    "full_attention"
                } else {
                    "conv"
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(settle(&by_types).unwrap(), config);
    }

    #[test]
    fn a_config_without_layer_kinds_names_the_key() {
        let mut config = lfm2_1_2b();
        config.as_object_mut().unwrap().remove("full_attn_idxs");
        assert_eq!(settle(&config).unwrap_err(), missing("full_attn_idxs"));
    }
}
