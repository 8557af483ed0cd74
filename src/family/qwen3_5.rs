//! `model_type: qwen3_5` and `qwen3_5_moe` (Qwen 3.5, dense and mixture of
//! experts): three of every four layers (`full_attention_interval`) are
//! gated DeltaNet layers, a short causal convolution and a gated delta-rule
//! recurrence whose state is a float32 matrix per head whatever the
//! context; the others are gated attention (`q_proj` gives the queries and
//! a sigmoid gate on the output, q/k norms, rope on the first quarter of
//! each head, `partial_rotary_factor` and `rope_theta` under
//! `rope_parameters`). The MLP is SwiGLU, or in `qwen3_5_moe` routed
//! experts in every layer beside a shared expert weighted by the sigmoid of
//! its own gate. The checkpoints are multimodal: the text model is
//! `text_config` (or the whole config where there is none), its tensors
//! under `language_model.model.` (transformers: `model.language_model.`);
//! the vision tower is Qwen3-VL's without DeepStack (read by
//! `engine::vision`; its image tokens turn by a 3-D rope in the attention
//! layers, `mrope_section`), the multi-token-prediction head (`mtp.`) is
//! skipped. Defaults and rules are mlx-lm's `models/qwen3_5.py`. Replies
//! think in `<think>` and call tools in `<tool_call>` tags, as Qwen3's.

use serde_json::{Value, json};

use super::config::{
    ConfigError, ConfigKeys, DeltaProjections, ExpertsConfig, ExpertsKind, GatedDeltaConfig, Keys,
    ModelConfig, RopeScaling, merged,
};
use super::synth::{
    ExpertShape, Shape, SynthChoices, SynthRecipe, VisionSynth, nest_under_text_config,
};
use super::{Family, every_layout_readable};

pub const QWEN3_5: Family = Family {
    model_type: "qwen3_5",
    class_name: "Qwen3_5ForConditionalGeneration",
    about: "Qwen 3.5's dense models (gated DeltaNet layers beside gated attention; text and images)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: super::qwen3::THINKING_QWEN,
    synth: SynthRecipe {
        adjust: dense,
        config: synth_config,
        extra_tensors: EXTRA_TENSORS,
        vision: Some(VISION),
    },
};

pub const QWEN3_5_MOE: Family = Family {
    model_type: "qwen3_5_moe",
    class_name: "Qwen3_5MoeForConditionalGeneration",
    about: "Qwen 3.5's mixtures of experts (gated DeltaNet layers, routed and shared experts; text and images)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: super::qwen3::THINKING_QWEN,
    synth: SynthRecipe {
        adjust: mixture,
        config: synth_config,
        extra_tensors: EXTRA_TENSORS,
        vision: Some(VISION),
    },
};

/// A multi-token-prediction head: present in the published checkpoints,
/// read by neither Ondo nor mlx-lm.
const EXTRA_TENSORS: &[&str] = &["mtp.norm.weight"];

/// Qwen 3.5's vision tower in a synth folder: Qwen3-VL's tower without
/// DeepStack (mlx-vlm's Qwen 3.5 refuses DeepStack taps), which mlx-lm's
/// text model skips.
const VISION: VisionSynth = VisionSynth {
    tokens: super::qwen3_vl::QWEN_VISION_TOKENS,
    marker: super::qwen3_vl::QWEN_IMAGE_MARKER,
    config: vision_synth_config,
    tensors: super::qwen3_vl::vision_tensors,
    processor_files: super::qwen3_vl::processor_files,
};

/// The vision keys of a synthetic folder: a model the size of Qwen 3.5 2B
/// or larger gets its tower (27 blocks of 1152); a smaller one 2 blocks of
/// 32.
fn vision_synth_config(config: &mut Value, shape: &Shape, ids: &[u32]) {
    let model_type = config["model_type"].clone();
    let mut vision = if shape.hidden_size >= 2048 {
        json!({"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
               "num_position_embeddings": 2304})
    } else {
        json!({"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "num_position_embeddings": 64})
    };
    vision["deepstack_visual_indexes"] = json!([]);
    super::qwen3_vl::write_vision_config(config, vision, model_type, shape, ids);
}

/// mlx-lm's `TextModelArgs` defaults for the keys a config may leave out.
fn defaults() -> Value {
    json!({
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "rms_norm_eps": 1e-6, "vocab_size": 151936,
        "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "linear_num_value_heads": 64, "linear_num_key_heads": 16,
        "linear_key_head_dim": 192, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "tie_word_embeddings": false,
        "attention_bias": false, "full_attention_interval": 4,
        "num_experts": 0, "num_experts_per_tok": 0,
        "shared_expert_intermediate_size": 0, "moe_intermediate_size": 0,
        "norm_topk_prob": true,
        "rope_parameters": {
            "type": "default", "mrope_section": [11, 11, 10],
            "rope_theta": 100000, "partial_rotary_factor": 0.25,
        },
    })
}

/// Settles a Qwen 3.5 config (dense or mixture): its `text_config`, or the
/// config itself where it has none.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let model_type = super::model_type(value).unwrap_or("qwen3_5").to_owned();
    let mut text = value
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(value)
        .clone();
    if text.get("quantization").is_none()
        && let Some(quantization) = value.get("quantization")
    {
        text["quantization"] = quantization.clone();
    }
    let text = merged(defaults(), &text);
    let read = Keys::of(&text);
    let mut keys = ConfigKeys::parse(&text)?;
    // mlx-lm takes the rope from `rope_parameters` alone (its own default
    // when the config has none): the base, the rotated share of each head,
    // and a scaling when its type is not `default`.
    let params = read
        .get("rope_parameters")
        .cloned()
        .unwrap_or_else(|| defaults()["rope_parameters"].clone());
    let rope_theta = params["rope_theta"].as_f64().unwrap_or(100_000.0) as f32;
    let partial = params["partial_rotary_factor"].as_f64().unwrap_or(0.25);
    // Image tokens turn by a 3-D position in the attention layers.
    let mrope_section = match params.get("mrope_section") {
        None | Some(Value::Null) => [11, 11, 10],
        Some(v) => serde_json::from_value::<[usize; 3]>(v.clone()).map_err(|_| {
            ConfigError::Inconsistent(format!(
                "rope_parameters.mrope_section is {v}, not three whole numbers"
            ))
        })?,
    };
    let scaling: Option<RopeScaling> = serde_json::from_value(params).ok();
    keys.rope_scaling = scaling.filter(|s| !matches!(s.kind(), None | Some("default")));
    let bias = keys.attention_bias.unwrap_or(false);
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let gated_delta = gated_delta(&read, keys.num_hidden_layers, DeltaProjections::Apart)?;
    let num_experts = read.required_dim("num_experts")?;
    let experts = (num_experts > 0)
        .then(|| -> Result<ExpertsConfig, ConfigError> {
            Ok(ExpertsConfig {
                num_experts,
                num_experts_per_tok: read.required_dim("num_experts_per_tok")?,
                moe_intermediate_size: read.required_dim("moe_intermediate_size")?,
                norm_topk_prob: read.flag("norm_topk_prob")?.unwrap_or(true),
                // Every layer routes: mlx-lm's Qwen 3.5 reads no sparse step.
                decoder_sparse_step: 1,
                mlp_only_layers: Vec::new(),
                kind: ExpertsKind::Qwen3Moe,
                shared_expert_intermediate_size: Some(
                    read.required_dim("shared_expert_intermediate_size")?,
                ),
            })
        })
        .transpose()?;
    let mut config = ModelConfig::from_keys(&model_type, keys, rope_theta, tie);
    gated_attention(&mut config, bias, partial);
    config.mrope_section = Some(mrope_section);
    config.gated_delta = Some(gated_delta);
    config.experts = experts;
    config.read_inside_language_model(&[
        "vision_tower.",
        "model.visual.",
        "mtp.",
        "language_model.mtp.",
    ]);
    Ok(config)
}

/// The gated DeltaNet layers of a Qwen 3.5 or Qwen3-Next config: all but
/// every `full_attention_interval`-th of `layers`, their heads from the
/// `linear_*` keys.
pub(super) fn gated_delta(
    read: &Keys,
    layers: usize,
    projections: DeltaProjections,
) -> Result<GatedDeltaConfig, ConfigError> {
    let interval = read.required_count("full_attention_interval")? as usize;
    let gated_delta = GatedDeltaConfig {
        key_heads: read.required_dim("linear_num_key_heads")?,
        value_heads: read.required_dim("linear_num_value_heads")?,
        key_head_dim: read.required_dim("linear_key_head_dim")?,
        value_head_dim: read.required_dim("linear_value_head_dim")?,
        conv_kernel: read.required_dim("linear_conv_kernel_dim")?,
        projections,
        layers: (0..layers).map(|i| (i + 1) % interval != 0).collect(),
    };
    if gated_delta.key_heads == 0 || gated_delta.value_heads % gated_delta.key_heads != 0 {
        return Err(ConfigError::Inconsistent(format!(
            "`linear_num_value_heads` ({}) is not a multiple of `linear_num_key_heads` ({})",
            gated_delta.value_heads, gated_delta.key_heads
        )));
    }
    Ok(gated_delta)
}

/// Qwen 3.5's and Qwen3-Next's gated attention: q/k norms, biases on all
/// four projections where `bias`, the output gated by `q_proj`'s second
/// half, rope on the first `partial` of each head.
pub(super) fn gated_attention(config: &mut ModelConfig, bias: bool, partial: f64) {
    config.rotary_dims = (f64::from(config.head_dim) * partial) as i32;
    config.qk_norm = true;
    config.qkv_bias = bias;
    config.o_bias = bias;
    config.attention_output_gate = true;
}

/// Qwen 3.5's rope base.
fn dense(shape: &mut Shape) {
    shape.rope_theta = 10_000_000.0;
    shape.rope_scaling = None;
}

/// The dense conventions, and 8 experts of which 2 work on each token
/// unless the preset has its own.
fn mixture(shape: &mut Shape) {
    dense(shape);
    if shape.experts.is_none() {
        shape.experts = Some(ExpertShape::eight_choose_two(shape));
    }
}

/// Qwen 3.5's own keys: a full-attention layer every fourth (every second
/// in a preset of fewer than four layers, so the tiny one has one of each
/// kind), gated DeltaNet heads as wide as the attention's, the rope under
/// `rope_parameters`, the experts with a shared one as wide as each; then
/// the text model nested under `text_config` as the published checkpoints
/// have it.
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    gated_delta_keys(config, shape);
    if let Some(object) = config.as_object_mut() {
        object.remove("rope_theta");
    }
    config["rope_parameters"] = json!({
        "rope_type": "default",
        "rope_theta": shape.rope_theta,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": true,
    });
    let (text_type, model_type) = match shape.experts {
        Some(experts) => {
            shared_expert_mixture_keys(config, &experts);
            ("qwen3_5_moe_text", "qwen3_5_moe")
        }
        None => ("qwen3_5_text", "qwen3_5"),
    };
    nest_under_text_config(
        config,
        text_type,
        model_type,
        json!({"model_type": model_type, "depth": 1}),
    );
}

/// The keys of the gated DeltaNet layers in a synth folder: a
/// full-attention layer every fourth (every second in a preset of fewer
/// than four layers, so the tiny one has one of each kind), as many value
/// heads as attention heads and as many key heads as KV heads (so several
/// value heads share a key head), each as wide as an attention head.
pub(super) fn gated_delta_keys(config: &mut Value, shape: &Shape) {
    let layers = shape.num_hidden_layers.max(1);
    let interval = if layers >= 4 { 4 } else { layers.min(2) };
    config["full_attention_interval"] = json!(interval);
    config["linear_num_key_heads"] = json!(shape.num_key_value_heads);
    config["linear_num_value_heads"] = json!(shape.num_attention_heads);
    config["linear_key_head_dim"] = json!(shape.head_dim);
    config["linear_value_head_dim"] = json!(shape.head_dim);
    config["linear_conv_kernel_dim"] = json!(4);
    config["hidden_act"] = json!("silu");
    if let Some(object) = config.as_object_mut() {
        object.remove("mlp_bias");
    }
}

/// The keys of routed experts beside a shared expert as wide as each, the
/// chosen experts' weights rescaled to sum to one.
pub(super) fn shared_expert_mixture_keys(config: &mut Value, experts: &ExpertShape) {
    config["num_experts"] = json!(experts.num_experts);
    config["num_experts_per_tok"] = json!(experts.experts_per_token);
    config["moe_intermediate_size"] = json!(experts.moe_intermediate_size);
    config["shared_expert_intermediate_size"] = json!(experts.moe_intermediate_size);
    config["norm_topk_prob"] = json!(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3.5-0.8B's published text config, the keys mlx-lm reads.
    fn qwen3_5_small() -> Value {
        json!({
            "model_type": "qwen3_5",
            "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 1024,
                "intermediate_size": 3584, "num_hidden_layers": 24,
                "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                "vocab_size": 248320, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 262144, "tie_word_embeddings": true,
                "linear_num_key_heads": 16, "linear_num_value_heads": 16,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
                "rope_parameters": {
                    "rope_type": "default", "rope_theta": 10_000_000,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": true,
                },
            },
            "vision_config": {"model_type": "qwen3_5"},
        })
    }

    #[test]
    fn the_text_model_settles_with_three_delta_layers_in_four() {
        let config = settle(&qwen3_5_small()).unwrap();
        assert_eq!(config.model_type, "qwen3_5");
        assert_eq!(config.rotary_dims, 64);
        assert_eq!(config.rope_theta, 1e7);
        assert_eq!(config.rope_scaling, None);
        assert!(config.attention_output_gate && config.qk_norm);
        assert!(config.is_delta_layer(0) && !config.is_delta_layer(3));
        assert!(config.attends(3) && !config.attends(2));
        // 18 layers: a [3, 6144] convolution state beside a [16, 128, 128]
        // float32 matrix.
        assert_eq!(config.state_layers(), Some((18, 3 * 6144, 16 * 128 * 128)));
        assert_eq!(config.weight_prefix, "language_model.model");
        // Without `text_config`, the config is the text config itself.
        let text = qwen3_5_small()["text_config"].clone();
        let mut bare = settle(&text).unwrap();
        bare.model_type = "qwen3_5".into();
        assert_eq!(bare, config);
    }

    #[test]
    fn a_mixture_routes_in_every_layer_beside_a_shared_expert() {
        let mut value = qwen3_5_small();
        value["model_type"] = json!("qwen3_5_moe");
        let text = &mut value["text_config"];
        text["num_experts"] = json!(256);
        text["num_experts_per_tok"] = json!(8);
        text["moe_intermediate_size"] = json!(512);
        text["shared_expert_intermediate_size"] = json!(512);
        text["decoder_sparse_step"] = json!(2);
        let config = settle(&value).unwrap();
        let experts = config.experts.as_ref().unwrap();
        assert!(experts.norm_topk_prob);
        assert_eq!(experts.shared_expert_intermediate_size, Some(512));
        assert_eq!(config.expert_layers(), 24, "mlx-lm reads no sparse step");
    }
}
