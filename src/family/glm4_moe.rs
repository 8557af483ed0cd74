//! `model_type: glm4_moe` (GLM-4.5, GLM-4.5-Air, GLM-4.6): attention with
//! biases on q, k and v (`attention_bias`), q/k norms where `use_qk_norm`
//! says, and rope on the first `partial_rotary_factor` of each head; the
//! first `first_k_dense_replace` layers keep a dense MLP, the others route
//! each token to `num_experts_per_tok` of `n_routed_experts` experts chosen
//! by sigmoid scores with a learned correction, within the best
//! `topk_group` of `n_group` groups, weighted times `routed_scaling_factor`
//! (`ExpertsKind::Glm4Moe`), beside `n_shared_experts` ungated shared
//! experts. The head is never tied. The multi-token-prediction layer a
//! checkpoint keeps after the last (`model.layers.{num_hidden_layers}`) is
//! dropped. Rules are mlx-lm's `models/glm4_moe.py`, which has no defaults
//! for these keys. Replies think in `<think>` and call tools in
//! `<tool_call>` tags holding the name and `<arg_key>`/`<arg_value>` pairs.

use serde_json::{Value, json};

use super::config::{
    ConfigError, ConfigKeys, ExpertsConfig, ExpertsKind, Keys, ModelConfig, missing,
};
use super::synth::{ExpertShape, Shape, SynthChoices, SynthRecipe, plain_rope};
use super::{Family, ReplyStyle, ThinkMarkers, ToolCallSyntax, every_layout_readable};

pub const GLM4_MOE: Family = Family {
    model_type: "glm4_moe",
    class_name: "Glm4MoeForCausalLM",
    about: "GLM-4.5 and GLM-4.6 mixtures of experts (GLM-4.5-Air; grouped routing, shared experts)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle {
        harmony: false,
        thinks: Some(ThinkMarkers::Tags),
        tool_calls: ToolCallSyntax::Tagged,
    },
    synth: SynthRecipe {
        adjust,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// A true/false key mlx-lm requires.
fn required_flag(read: &Keys, key: &str) -> Result<bool, ConfigError> {
    read.flag(key)?.ok_or_else(|| missing(key))
}

/// Settles a GLM-4.5 config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    let rope_theta = keys.require_rope_theta()?;
    // Required by mlx-lm, which gives the model its own head whatever it says.
    keys.require_tie_word_embeddings()?;
    // mlx-lm builds plain rope from `rope_theta` and never reads
    // `rope_scaling`; the same here, so both rotate alike.
    keys.rope_scaling = None;
    keys.rope_traditional = false;
    keys.head_dim = Some(read.required_dim("head_dim")?);
    let bias = required_flag(&read, "attention_bias")?;
    let qk_norm = required_flag(&read, "use_qk_norm")?;
    let partial = read.required_number("partial_rotary_factor")?;
    if let Some(method) = read.get("topk_method")
        && method.as_str() != Some("noaux_tc")
    {
        return Err(ConfigError::Invalid {
            key: "topk_method".into(),
            found: method.to_string(),
            expected: "not `noaux_tc`, the only routing mlx-lm and Ondo read for GLM",
        });
    }
    let layers = keys.num_hidden_layers;
    // Without routed experts every layer is dense, as in mlx-lm.
    let experts = match read.whole("n_routed_experts")? {
        Some(count) if count > 0 => Some(experts(&read, layers)?),
        _ => None,
    };
    let mut config = ModelConfig::from_keys("glm4_moe", keys, rope_theta, false);
    config.rotary_dims = (f64::from(config.head_dim) * partial) as i32;
    config.qkv_bias = bias;
    config.qk_norm = qk_norm;
    config.experts = experts;
    config.skipped_prefixes = vec![format!("model.layers.{layers}.")];
    Ok(config)
}

/// The routed experts of every layer from `first_k_dense_replace` on.
fn experts(read: &Keys, layers: usize) -> Result<ExpertsConfig, ConfigError> {
    let num_experts = read.required_dim("n_routed_experts")?;
    let top_k = read.required_dim("num_experts_per_tok")?;
    let groups = read.required_dim("n_group")?;
    let chosen_groups = read.required_dim("topk_group")?;
    let inter = read.required_dim("moe_intermediate_size")?;
    let inconsistent = |message: String| Err(ConfigError::Inconsistent(message));
    if groups == 0 || num_experts % groups != 0 {
        return inconsistent(format!(
            "`n_routed_experts` ({num_experts}) is not a multiple of `n_group` ({groups})"
        ));
    }
    if groups > 1 && num_experts / groups < 2 {
        return inconsistent(format!(
            "`n_group` ({groups}) leaves fewer than two experts a group; a group is scored by its best two"
        ));
    }
    if chosen_groups == 0 || chosen_groups > groups {
        return inconsistent(format!(
            "`topk_group` ({chosen_groups}) is not between 1 and `n_group` ({groups})"
        ));
    }
    if top_k == 0 || top_k > chosen_groups * (num_experts / groups) {
        return inconsistent(format!(
            "`num_experts_per_tok` ({top_k}) is not between 1 and the experts of `topk_group` groups"
        ));
    }
    let dense = read
        .whole("first_k_dense_replace")?
        .ok_or_else(|| missing("first_k_dense_replace"))? as usize;
    let shared = match read.whole("n_shared_experts")? {
        Some(count) => Some(
            i32::try_from(count)
                .ok()
                .and_then(|count| count.checked_mul(inter))
                .ok_or_else(|| ConfigError::Invalid {
                    key: "n_shared_experts".into(),
                    found: count.to_string(),
                    expected: "too large for a tensor dimension",
                })?,
        ),
        None => None,
    };
    Ok(ExpertsConfig {
        num_experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: inter,
        norm_topk_prob: required_flag(read, "norm_topk_prob")?,
        decoder_sparse_step: 1,
        mlp_only_layers: (0..dense.min(layers)).collect(),
        kind: ExpertsKind::Glm4Moe {
            groups,
            chosen_groups,
            routed_scaling_factor: read.required_number("routed_scaling_factor")? as f32,
        },
        shared_expert_intermediate_size: shared,
    })
}

/// GLM-4.5's rope base, its own head, and 8 experts of which 2 work on
/// each token unless the preset has its own.
fn adjust(shape: &mut Shape) {
    plain_rope(shape);
    shape.tie_word_embeddings = false;
    if shape.experts.is_none() {
        shape.experts = Some(ExpertShape::eight_choose_two(shape));
    }
}

/// GLM-4.5's own keys, with values that exercise every part mlx-lm reads:
/// q, k and v biases and q/k norms (GLM-4.6's), half of each head rotated,
/// the first layer dense, two groups of experts of which one is chosen
/// (where the experts split so), a shared expert as wide as each, and
/// GLM-4.5's routed scaling of 2.5.
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    config["attention_bias"] = json!(true);
    config["use_qk_norm"] = json!(true);
    config["partial_rotary_factor"] = json!(0.5);
    config["first_k_dense_replace"] = json!(1);
    config["num_nextn_predict_layers"] = json!(1);
    config["rope_scaling"] = Value::Null;
    if let Some(object) = config.as_object_mut() {
        object.remove("mlp_bias");
    }
    if let Some(experts) = shape.experts {
        let per_group = experts.num_experts / 2;
        let groups = if experts.num_experts % 2 == 0
            && per_group >= 2
            && per_group >= experts.experts_per_token
        {
            2
        } else {
            1
        };
        config["n_routed_experts"] = json!(experts.num_experts);
        config["num_experts_per_tok"] = json!(experts.experts_per_token);
        config["moe_intermediate_size"] = json!(experts.moe_intermediate_size);
        config["n_shared_experts"] = json!(1);
        config["n_group"] = json!(groups);
        config["topk_group"] = json!(1);
        config["routed_scaling_factor"] = json!(2.5);
        config["norm_topk_prob"] = json!(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GLM-4.5-Air's published config.json, the keys mlx-lm reads.
    fn glm_4_5_air() -> Value {
        json!({
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "attention_bias": true, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "partial_rotary_factor": 0.5,
            "intermediate_size": 10944, "max_position_embeddings": 131072,
            "moe_intermediate_size": 1408, "norm_topk_prob": true,
            "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
            "n_routed_experts": 128, "n_shared_experts": 1,
            "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
            "first_k_dense_replace": 1, "num_hidden_layers": 46,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
            "rope_theta": 1000000, "num_nextn_predict_layers": 1,
            "tie_word_embeddings": false, "use_qk_norm": false, "vocab_size": 151552,
        })
    }

    #[test]
    fn glm_4_5_air_routes_in_all_but_its_first_layer_beside_a_shared_expert() {
        let config = settle(&glm_4_5_air()).unwrap();
        assert_eq!(config.rotary_dims, 64);
        assert!(config.qkv_bias && !config.o_bias && !config.qk_norm);
        assert!(!config.tie_word_embeddings);
        let experts = config.experts.as_ref().unwrap();
        assert_eq!(
            experts.kind,
            ExpertsKind::Glm4Moe {
                groups: 1,
                chosen_groups: 1,
                routed_scaling_factor: 1.0
            }
        );
        assert_eq!(experts.shared_expert_intermediate_size, Some(1408));
        assert!(!experts.is_sparse(0) && experts.is_sparse(1) && experts.is_sparse(45));
        assert_eq!(config.expert_layers(), 45);
        // The multi-token-prediction layer after the last is not read.
        assert_eq!(config.skipped_prefixes, ["model.layers.46."]);
    }

    #[test]
    fn keys_mlx_lm_requires_are_required_and_groups_must_divide_the_experts() {
        let mut value = glm_4_5_air();
        value
            .as_object_mut()
            .unwrap()
            .remove("routed_scaling_factor");
        assert_eq!(
            settle(&value).unwrap_err(),
            missing("routed_scaling_factor")
        );
        let mut value = glm_4_5_air();
        value["n_group"] = json!(3);
        let error = settle(&value).unwrap_err().to_string();
        assert!(error.contains("`n_group` (3)"), "{error}");
        let mut value = glm_4_5_air();
        value["topk_method"] = json!("greedy");
        assert!(
            settle(&value)
                .unwrap_err()
                .to_string()
                .contains("topk_method")
        );
        // No routed experts: every layer dense.
        let mut value = glm_4_5_air();
        value["n_routed_experts"] = Value::Null;
        assert_eq!(settle(&value).unwrap().experts, None);
    }
}
