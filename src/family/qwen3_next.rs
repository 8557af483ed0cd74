//! `model_type: qwen3_next` (Qwen3-Next): Qwen 3.5's layers before it was
//! multimodal. Three of every four layers (`full_attention_interval`) are
//! gated DeltaNet layers whose input projections are two tensors grouped by
//! key head (`in_proj_qkvz`, `in_proj_ba`; `DeltaProjections`), the others
//! gated attention with q/k norms and rope on the first
//! `partial_rotary_factor` of each head (`rope_theta` and `rope_scaling` at
//! the top level). The MLP is routed experts beside a shared expert
//! weighted by the sigmoid of its own gate, in the layers
//! `decoder_sparse_step` and `mlp_only_layers` choose, a dense SwiGLU in
//! the others. The tensors are under `model.`; the multi-token-prediction
//! head (`mtp.`) is skipped. Rules are mlx-lm's `models/qwen3_next.py`,
//! which requires most keys. Replies think in `<think>` and call tools in
//! `<tool_call>` tags, as Qwen3's.

use serde_json::{Value, json};

use super::config::{
    ConfigError, ConfigKeys, DeltaProjections, ExpertsConfig, ExpertsKind, Keys, ModelConfig,
    missing,
};
use super::qwen3_5::{gated_attention, gated_delta, gated_delta_keys, shared_expert_mixture_keys};
use super::synth::{ExpertShape, Shape, SynthChoices, SynthRecipe};
use super::{Family, every_layout_readable};

pub const QWEN3_NEXT: Family = Family {
    model_type: "qwen3_next",
    class_name: "Qwen3NextForCausalLM",
    about: "Qwen3-Next (gated DeltaNet layers beside gated attention; routed and shared experts)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: super::qwen3::THINKING_QWEN,
    synth: SynthRecipe {
        adjust,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// Settles a Qwen3-Next config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    let rope_theta = keys.require_rope_theta()?;
    keys.rope_traditional = false;
    keys.head_dim = Some(read.required_dim("head_dim")?);
    let partial = read.required_number("partial_rotary_factor")?;
    keys.rope_scaling = keys
        .rope_scaling
        .filter(|s| !matches!(s.kind(), None | Some("default")));
    let bias = keys.attention_bias.unwrap_or(false);
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let delta = gated_delta(
        &read,
        keys.num_hidden_layers,
        DeltaProjections::GroupedByKeyHead,
    )?;
    let experts = experts(&read)?;
    let mut config = ModelConfig::from_keys("qwen3_next", keys, rope_theta, tie);
    gated_attention(&mut config, bias, partial);
    config.gated_delta = Some(delta);
    config.experts = experts;
    config.skipped_prefixes = vec!["mtp.".into()];
    Ok(config)
}

/// The routed experts and the shared expert beside them, in the layers the
/// step and the dense list leave them; `None` without experts.
fn experts(read: &Keys) -> Result<Option<ExpertsConfig>, ConfigError> {
    let num_experts = read.required_dim("num_experts")?;
    // Required by mlx-lm whether or not there are experts.
    let step = read.required_dim("decoder_sparse_step")? as usize;
    if read.get("mlp_only_layers").is_none() {
        return Err(missing("mlp_only_layers"));
    }
    let mlp_only_layers = read.whole_list("mlp_only_layers")?;
    let experts = ExpertsConfig {
        num_experts,
        num_experts_per_tok: read.required_dim("num_experts_per_tok")?,
        moe_intermediate_size: read.required_dim("moe_intermediate_size")?,
        norm_topk_prob: read.flag("norm_topk_prob")?.unwrap_or(false),
        decoder_sparse_step: step,
        mlp_only_layers,
        kind: ExpertsKind::Qwen3Moe,
        shared_expert_intermediate_size: Some(
            read.required_dim("shared_expert_intermediate_size")?,
        ),
    };
    Ok((num_experts > 0).then_some(experts))
}

/// Qwen3-Next's rope base, and 8 experts of which 2 work on each token
/// unless the preset has its own.
fn adjust(shape: &mut Shape) {
    shape.rope_theta = 10_000_000.0;
    shape.rope_scaling = None;
    if shape.experts.is_none() {
        shape.experts = Some(ExpertShape::eight_choose_two(shape));
    }
}

/// Qwen3-Next's own keys: the gated DeltaNet layers' as Qwen 3.5's synth
/// writes them, a quarter of each head rotated, and experts in every
/// layer beside a shared one.
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    gated_delta_keys(config, shape);
    config["partial_rotary_factor"] = json!(0.25);
    config["rope_scaling"] = Value::Null;
    if let Some(experts) = shape.experts {
        shared_expert_mixture_keys(config, &experts);
        config["decoder_sparse_step"] = json!(1);
        config["mlp_only_layers"] = json!([]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-Next-80B-A3B-Instruct's published config.json, the keys
    /// mlx-lm reads.
    fn qwen3_next_80b() -> Value {
        json!({
            "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "attention_bias": false, "decoder_sparse_step": 1,
            "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
            "hidden_size": 2048, "intermediate_size": 5120,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_value_head_dim": 128, "max_position_embeddings": 262144,
            "mlp_only_layers": [], "moe_intermediate_size": 512,
            "norm_topk_prob": true, "num_attention_heads": 16, "num_experts": 512,
            "num_experts_per_tok": 10, "num_hidden_layers": 48,
            "num_key_value_heads": 2, "partial_rotary_factor": 0.25,
            "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000000,
            "shared_expert_intermediate_size": 512, "tie_word_embeddings": false,
            "vocab_size": 151936,
        })
    }

    #[test]
    fn qwen3_next_80b_has_grouped_delta_layers_and_experts_in_every_layer() {
        let config = settle(&qwen3_next_80b()).unwrap();
        assert_eq!(config.rotary_dims, 64);
        assert_eq!(config.rope_theta, 1e7);
        assert!(config.attention_output_gate && config.qk_norm);
        assert_eq!(config.weight_prefix, "model");
        let delta = config.gated_delta.as_ref().unwrap();
        assert_eq!(delta.projections, DeltaProjections::GroupedByKeyHead);
        assert!(config.is_delta_layer(0) && !config.is_delta_layer(3));
        // 36 layers: a [3, 8192] convolution state beside a [32, 128, 128]
        // float32 matrix.
        assert_eq!(config.state_layers(), Some((36, 3 * 8192, 32 * 128 * 128)));
        let experts = config.experts.as_ref().unwrap();
        assert_eq!(experts.shared_expert_intermediate_size, Some(512));
        assert_eq!(config.expert_layers(), 48);
    }

    #[test]
    fn the_sparse_step_and_dense_list_choose_the_expert_layers() {
        let mut value = qwen3_next_80b();
        value["decoder_sparse_step"] = json!(2);
        value["mlp_only_layers"] = json!([3]);
        assert_eq!(settle(&value).unwrap().expert_layers(), 23);
        value["num_experts"] = json!(0);
        assert_eq!(settle(&value).unwrap().experts, None);
        value.as_object_mut().unwrap().remove("mlp_only_layers");
        assert_eq!(settle(&value).unwrap_err(), missing("mlp_only_layers"));
    }
}
