//! `model_type: qwen3_moe` (Qwen3's mixture-of-experts models, such as
//! Qwen3-30B-A3B): Qwen3's attention (q/k norms, no biases) with routed
//! experts in place of the dense MLP in the layers `decoder_sparse_step` and
//! `mlp_only_layers` choose (see `ExpertsConfig::is_sparse`).

use serde_json::{Value, json};

use super::config::{ConfigError, ConfigKeys, ExpertsConfig, ExpertsKind, Keys, ModelConfig};
use super::synth::{ExpertShape, Shape, SynthChoices, SynthRecipe, plain_rope};
use super::{Family, every_layout_readable};

pub const QWEN3_MOE: Family = Family {
    model_type: "qwen3_moe",
    class_name: "Qwen3MoeForCausalLM",
    about: "Qwen3's mixture-of-experts models (Qwen3-30B-A3B, Qwen3-235B-A22B)",
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

/// Settles a Qwen3-MoE config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let rope_theta = keys.require_rope_theta()?;
    let tie = keys.require_tie_word_embeddings()?;
    // mlx-lm's qwen3_moe builds plain rope from rope_theta and never reads
    // rope_scaling; the same here, so both rotate alike.
    keys.rope_scaling = None;
    let read = Keys::of(value);
    let experts = ExpertsConfig {
        num_experts: read.required_dim("num_experts")?,
        num_experts_per_tok: read.required_dim("num_experts_per_tok")?,
        moe_intermediate_size: read.required_dim("moe_intermediate_size")?,
        norm_topk_prob: read.flag("norm_topk_prob")?.unwrap_or(false),
        decoder_sparse_step: read.whole("decoder_sparse_step")?.unwrap_or(1) as usize,
        mlp_only_layers: read.whole_list("mlp_only_layers")?,
        kind: ExpertsKind::Qwen3Moe,
        shared_expert_intermediate_size: None,
    };
    let mut config = ModelConfig::from_keys("qwen3_moe", keys, rope_theta, tie);
    config.qk_norm = true;
    config.experts = Some(experts);
    Ok(config)
}

/// Qwen's rope, and 8 experts of which 2 work on each token unless the
/// preset has its own.
fn adjust(shape: &mut Shape) {
    plain_rope(shape);
    if shape.experts.is_none() {
        shape.experts = Some(ExpertShape::eight_choose_two(shape));
    }
}

fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    if let Some(experts) = shape.experts {
        config["num_experts"] = json!(experts.num_experts);
        config["num_experts_per_tok"] = json!(experts.experts_per_token);
        config["moe_intermediate_size"] = json!(experts.moe_intermediate_size);
        config["norm_topk_prob"] = json!(true);
        config["decoder_sparse_step"] = json!(1);
        config["mlp_only_layers"] = json!([]);
    }
}
