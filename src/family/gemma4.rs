//! `model_type: gemma4_text` (Gemma 4's text model) and `gemma4` (the
//! published checkpoints, multimodal: the text model's config is
//! `text_config` and its tensors sit under `language_model.`, or
//! `model.language_model.` as transformers saves them; the vision and
//! audio towers are skipped, so the model answers text only).
//!
//! What Gemma 4 does beyond the shared decoder: embeddings times the square
//! root of the hidden size; four norms per layer (plain RMSNorm scales);
//! q/k norms and a norm without a scale on the values; a softmax scale of
//! one; the tanh GELU; sliding-window layers where `layer_types` says
//! (their rope `rope_parameters.sliding_attention`) beside full ones with
//! wider heads (`global_head_dim`), their own rope (`full_attention`:
//! proportional, turning a quarter of each head) and in the larger models
//! their own KV heads, with values that are the keys
//! (`attention_k_eq_v`); in the small models the last
//! `num_kv_shared_layers` layers compute no keys and values and attend over
//! those of the last earlier layer of their kind (their MLPs twice as wide
//! with `use_double_wide_mlp`), and a per-layer input
//! (`hidden_size_per_layer_input`) gated into every layer's output; a
//! learned scalar on every layer's output; logits soft-capped at
//! `final_logit_softcapping`. The 26B A4B model (`enable_moe_block`) runs
//! routed experts beside each layer's dense MLP. Defaults and rules are
//! mlx-lm's `models/gemma4_text.py` and `gemma4.py`; a key a config sets to
//! null is unset there, not defaulted, and so it is here. Replies reason in
//! a `<|channel>thought` block the model opens and call tools as
//! `<|tool_call>call:name{...}<tool_call|>`.

use serde_json::{Value, json};

use super::config::{
    Activation, ConfigError, ConfigKeys, ExpertsConfig, ExpertsKind, FullAttention, Keys,
    ModelConfig, PerLayerInputConfig, RopeScaling, missing, windows_of_layer_types,
};
use super::synth::{Shape, SynthChoices, SynthRecipe, nest_under_text_config};
use super::{Family, ReplyStyle, ThinkMarkers, ToolCallSyntax, every_layout_readable};

/// Gemma 4 thinks in a thought channel it opens itself (when the template's
/// `enable_thinking` asks it to) and calls tools in its own syntax.
const GEMMA4_REPLIES: ReplyStyle = ReplyStyle {
    harmony: false,
    thinks: Some(ThinkMarkers::Channel),
    tool_calls: ToolCallSyntax::GemmaCall,
};

pub const GEMMA4_TEXT: Family = Family {
    model_type: "gemma4_text",
    class_name: "Gemma4ForCausalLM",
    about: "Gemma 4's text model, as the multimodal checkpoints hold it",
    settle: settle_text,
    unreadable_layout: every_layout_readable,
    reply: GEMMA4_REPLIES,
    synth: SynthRecipe {
        adjust,
        config: text_synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

pub const GEMMA4: Family = Family {
    model_type: "gemma4",
    class_name: "Gemma4ForConditionalGeneration",
    about: "Gemma 4 E2B, E4B, 26B A4B and 31B (multimodal checkpoints; Ondo reads the text model)",
    settle: settle_multimodal,
    unreadable_layout: every_layout_readable,
    reply: GEMMA4_REPLIES,
    synth: SynthRecipe {
        adjust,
        config: multimodal_synth_config,
        // Vision and audio towers: present in the published checkpoints,
        // read by neither Ondo nor mlx-lm's text model.
        extra_tensors: &[
            "vision_tower.encoder.layers.0.input_layernorm.weight",
            "embed_vision.embedding_pre_projection_norm.weight",
            "audio_tower.output_proj.bias",
        ],
        vision: None,
    },
};

/// The other parts of a multimodal checkpoint, in both spellings, whose
/// tensors are dropped (mlx-lm's `gemma4.sanitize` list).
const SKIPPED: &[&str] = &[
    "vision_tower.",
    "multi_modal_projector.",
    "audio_tower.",
    "embed_audio.",
    "embed_vision.",
    "vision_embedder.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "model.audio_tower.",
    "model.embed_audio.",
    "model.embed_vision.",
    "model.vision_embedder.",
];

/// mlx-lm's `ModelArgs` defaults for a Gemma 4 text config (the E2B
/// model's shape), for the keys a config leaves out.
fn text_defaults() -> Value {
    json!({
        "hidden_size": 1536,
        "num_hidden_layers": 35,
        "intermediate_size": 6144,
        "num_attention_heads": 8,
        "head_dim": 256,
        "global_head_dim": 512,
        "rms_norm_eps": 1.0e-6,
        "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144,
        "num_key_value_heads": 1,
        "num_global_key_value_heads": null,
        "num_kv_shared_layers": 20,
        "hidden_size_per_layer_input": 256,
        "rope_traditional": false,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {
                "partial_rotary_factor": 1.0,
                "rope_theta": 10_000.0,
                "rope_type": "default",
            },
        },
        "sliding_window": 512,
        "sliding_window_pattern": 5,
        "max_position_embeddings": 131072,
        "attention_k_eq_v": false,
        "final_logit_softcapping": 30.0,
        "use_double_wide_mlp": true,
        "enable_moe_block": false,
        "num_experts": null,
        "top_k_experts": null,
        "moe_intermediate_size": null,
        "layer_types": null,
        "tie_word_embeddings": true,
    })
}

/// `value` over mlx-lm's defaults: a key it sets, even to null, replaces
/// the default (mlx-lm's dataclass takes an explicit null as `None`).
fn over_defaults(defaults: Value, value: &Value) -> Value {
    let mut out = defaults;
    if let (Some(out_map), Some(given)) = (out.as_object_mut(), value.as_object()) {
        for (key, v) in given {
            out_map.insert(key.clone(), v.clone());
        }
    }
    out
}

/// Settles a `gemma4_text` config.
pub fn settle_text(value: &Value) -> Result<ModelConfig, ConfigError> {
    settle("gemma4_text", &over_defaults(text_defaults(), value))
}

/// Settles a multimodal `gemma4` config: its `text_config`, with the
/// top-level vocabulary size (mlx-lm's default where there is none) and
/// quantization, read from `language_model.` (or `model.language_model.`).
pub fn settle_multimodal(value: &Value) -> Result<ModelConfig, ConfigError> {
    let Some(text) = value.get("text_config").filter(|t| t.is_object()) else {
        return Err(missing("text_config"));
    };
    let mut text = over_defaults(text_defaults(), text);
    text["vocab_size"] = value.get("vocab_size").cloned().unwrap_or(json!(262_144));
    if let Some(quantization) = value.get("quantization") {
        text["quantization"] = quantization.clone();
    }
    let mut config = settle("gemma4", &text)?;
    config.read_inside_language_model(SKIPPED);
    Ok(config)
}

/// One kind of layer's rope as `rope_parameters` gives it: its base, and
/// its scaling where its type is not plain.
fn rope_of(params: &Value, kind: &str) -> (f32, Option<RopeScaling>) {
    let layer = params.get(kind).cloned().unwrap_or_else(|| json!({}));
    let theta = layer
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0) as f32;
    let scaling: Option<RopeScaling> = if layer.is_object() {
        serde_json::from_value(layer).ok()
    } else {
        None
    };
    let scaling = scaling.filter(|s| !matches!(s.kind(), None | Some("default")));
    (theta, scaling)
}

fn settle(model_type: &str, value: &Value) -> Result<ModelConfig, ConfigError> {
    let keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    let layers = keys.num_hidden_layers;
    let hidden = keys.hidden_size;
    let head_dim = keys.head_dim.unwrap_or(hidden / keys.num_attention_heads);
    let kv_heads = keys.num_key_value_heads.unwrap_or(keys.num_attention_heads);
    // Without `layer_types`, mlx-lm repeats `sliding_window_pattern - 1`
    // sliding layers and one full one.
    let mut typed = value.clone();
    if read.get("layer_types").is_none() {
        let pattern = read.required_count("sliding_window_pattern")? as usize;
        let types: Vec<&str> = (0..layers)
            .map(|i| {
                if (i + 1) % pattern == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        typed["layer_types"] = json!(types);
    }
    let layer_windows = windows_of_layer_types(&typed, layers)?;
    let params = read
        .get("rope_parameters")
        .cloned()
        .unwrap_or_else(|| text_defaults()["rope_parameters"].clone());
    let (full_theta, full_scaling) = rope_of(&params, "full_attention");
    let (sliding_theta, sliding_scaling) = rope_of(&params, "sliding_attention");
    if let Some(scaling) = sliding_scaling {
        return Err(ConfigError::Invalid {
            key: "rope_parameters.sliding_attention".into(),
            found: scaling.kind().unwrap_or_default().to_owned(),
            expected: "a plain rope (Ondo scales the full-attention layers' rope only)",
        });
    }
    let values_are_keys = read.flag("attention_k_eq_v")?.unwrap_or(false);
    let global_kv_heads = read.count("num_global_key_value_heads")?;
    let full_attention = FullAttention {
        head_dim: read
            .count("global_head_dim")?
            .map_or(head_dim, |dim| dim as i32),
        num_key_value_heads: match global_kv_heads {
            Some(heads) if values_are_keys => heads as i32,
            _ => kv_heads,
        },
        values_are_keys,
    };
    let kv_shared_layers = read.whole("num_kv_shared_layers")?.unwrap_or(0) as usize;
    if kv_shared_layers >= layers {
        return Err(ConfigError::Inconsistent(format!(
            "`num_kv_shared_layers` is {kv_shared_layers}, but the model has only {layers} layers"
        )));
    }
    let per_layer_width = read.whole("hidden_size_per_layer_input")?.unwrap_or(0);
    let per_layer_input = if per_layer_width > 0 {
        Some(PerLayerInputConfig {
            width: per_layer_width as i32,
            vocab_size: read.required_dim("vocab_size_per_layer_input")?,
        })
    } else {
        None
    };
    let experts = if read.flag("enable_moe_block")?.unwrap_or(false) {
        Some(ExpertsConfig {
            num_experts: read.required_dim("num_experts")?,
            num_experts_per_tok: read.required_dim("top_k_experts")?,
            moe_intermediate_size: read.required_dim("moe_intermediate_size")?,
            // Gemma 4 renormalizes by a softmax over the chosen experts.
            norm_topk_prob: false,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            kind: ExpertsKind::Gemma4,
            shared_expert_intermediate_size: None,
        })
    } else {
        None
    };
    // An explicit null unties the head in mlx-lm; absent, it is tied.
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let softcap = read.number("final_logit_softcapping")?.map(|c| c as f32);
    let mut config = ModelConfig::from_keys(model_type, keys, full_theta, tie);
    config.head_dim = head_dim;
    config.num_key_value_heads = kv_heads;
    config.rope_scaling = full_scaling;
    config.local_rope_theta = Some(sliding_theta);
    config.rotary_dims = head_dim;
    config.layer_windows = layer_windows;
    config.full_attention = Some(full_attention);
    config.qk_norm = true;
    config.value_norm = true;
    config.sandwich_norms = true;
    config.embed_scale = Some(f64::from(hidden).sqrt() as f32);
    config.activation = Activation::GeluApproxFused;
    config.attention_scale = 1.0;
    config.kv_shared_layers = kv_shared_layers;
    config.kv_shared_layers_double_mlp = read.flag("use_double_wide_mlp")?.unwrap_or(false);
    config.layer_scalar = true;
    config.final_logit_softcapping = softcap.filter(|&c| c != 0.0);
    config.per_layer_input = per_layer_input;
    config.experts = experts;
    if let Some(layer) = (0..layers).find(|&i| config.shares_kv(i) && config.kv_source(i).is_none())
    {
        return Err(ConfigError::Inconsistent(format!(
            "layer {layer} reads an earlier layer's keys and values, but no layer before the last {kv_shared_layers} is of its kind"
        )));
    }
    Ok(config)
}

/// A preset of fewer than four layers gets four, so that one layer of each
/// kind (sliding, full) computes keys and values and one reads them.
fn adjust(shape: &mut Shape) {
    shape.num_hidden_layers = shape.num_hidden_layers.max(4);
    shape.rope_scaling = None;
}

/// Gemma 4's own keys, as the published configs write them: every second
/// layer attends to everything, with heads twice as wide. A dense folder
/// has the small models' per-layer inputs (as wide as the hidden size, at
/// most 256) and shares keys and values in its second half, with MLPs
/// twice as wide there; a mixture (`shape.experts`) has the 26B model's
/// routed experts beside the dense MLP and full layers whose values are
/// their keys, with half the KV heads.
fn text_synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    let layers = shape.num_hidden_layers;
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if i % 2 == 1 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    if let Some(object) = config.as_object_mut() {
        object.remove("rope_theta");
        object.remove("mlp_bias");
    }
    config["layer_types"] = json!(types);
    config["sliding_window"] = json!(choices.sliding_window);
    config["global_head_dim"] = json!(2 * shape.head_dim);
    config["rope_parameters"] = json!({
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1_000_000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
    });
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["hidden_act"] = json!("gelu_pytorch_tanh");
    config["final_logit_softcapping"] = json!(30.0);
    config["vocab_size_per_layer_input"] = json!(shape.vocab_size);
    match shape.experts {
        None => {
            config["hidden_size_per_layer_input"] = json!(shape.hidden_size.min(256));
            config["num_kv_shared_layers"] = json!(layers / 2);
            config["use_double_wide_mlp"] = json!(true);
            config["attention_k_eq_v"] = json!(false);
            config["num_global_key_value_heads"] = Value::Null;
            config["enable_moe_block"] = json!(false);
            config["num_experts"] = Value::Null;
            config["top_k_experts"] = Value::Null;
            config["moe_intermediate_size"] = Value::Null;
        }
        Some(experts) => {
            config["hidden_size_per_layer_input"] = json!(0);
            config["num_kv_shared_layers"] = json!(0);
            config["use_double_wide_mlp"] = json!(false);
            config["attention_k_eq_v"] = json!(true);
            config["num_global_key_value_heads"] = json!((shape.num_key_value_heads / 2).max(1));
            config["enable_moe_block"] = json!(true);
            config["num_experts"] = json!(experts.num_experts);
            config["top_k_experts"] = json!(experts.experts_per_token);
            config["moe_intermediate_size"] = json!(experts.moe_intermediate_size);
        }
    }
}

/// The text model's keys under `text_config`, and at the top level what a
/// multimodal checkpoint keeps there (`nest_under_text_config`) with a
/// Gemma 4 vision config.
fn multimodal_synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    text_synth_config(config, shape, choices);
    nest_under_text_config(
        config,
        "gemma4_text",
        "gemma4",
        json!({"model_type": "gemma4_vision"}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer_types(pattern: usize, layers: usize) -> Vec<&'static str> {
        (0..layers)
            .map(|i| {
                if (i + 1) % pattern == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect()
    }

    /// Gemma 4 E2B's published config, the keys mlx-lm reads.
    fn e2b() -> Value {
        json!({
            "model_type": "gemma4",
            "architectures": ["Gemma4ForConditionalGeneration"],
            "text_config": {
                "model_type": "gemma4_text",
                "hidden_size": 1536, "num_hidden_layers": 35,
                "intermediate_size": 6144, "num_attention_heads": 8,
                "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
                "num_global_key_value_heads": null, "attention_k_eq_v": false,
                "sliding_window": 512, "vocab_size": 262144,
                "vocab_size_per_layer_input": 262144,
                "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 20,
                "use_double_wide_mlp": true, "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
                "enable_moe_block": false, "num_experts": null,
                "layer_types": layer_types(5, 35),
                "rope_parameters": {
                    "full_attention": {
                        "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0,
                        "rope_type": "proportional",
                    },
                    "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
                },
                "tie_word_embeddings": true,
            },
            "vision_config": {"model_type": "gemma4_vision"},
            "audio_config": {"model_type": "gemma4_audio"},
        })
    }

    /// Gemma 4 26B A4B's: experts beside the dense MLP, full layers whose
    /// values are their keys, nothing shared.
    fn a4b() -> Value {
        let mut value = e2b();
        let text = &mut value["text_config"];
        for (key, v) in [
            ("hidden_size", json!(2816)),
            ("num_hidden_layers", json!(30)),
            ("intermediate_size", json!(2112)),
            ("num_attention_heads", json!(16)),
            ("num_key_value_heads", json!(8)),
            ("num_global_key_value_heads", json!(2)),
            ("attention_k_eq_v", json!(true)),
            ("sliding_window", json!(1024)),
            ("hidden_size_per_layer_input", json!(0)),
            ("num_kv_shared_layers", json!(0)),
            ("use_double_wide_mlp", json!(false)),
            ("max_position_embeddings", json!(262144)),
            ("enable_moe_block", json!(true)),
            ("num_experts", json!(128)),
            ("top_k_experts", json!(8)),
            ("moe_intermediate_size", json!(704)),
            ("layer_types", json!(layer_types(6, 30))),
        ] {
            text[key] = v;
        }
        value
    }

    #[test]
    fn the_small_model_shares_keys_and_values_in_its_last_layers() {
        let config = settle_multimodal(&e2b()).unwrap();
        assert_eq!(config.weight_prefix, "language_model.model");
        assert_eq!(config.window_of(0), Some(512));
        assert_eq!(config.window_of(4), None);
        // Sliding layers: 256-wide heads, the whole head turned at base 1e4;
        // full ones: 512-wide, proportional at base 1e6.
        assert_eq!(
            (config.head_dim_of(0), config.rotary_dims_of(0)),
            (256, 256)
        );
        assert_eq!(
            (config.head_dim_of(4), config.rotary_dims_of(4)),
            (512, 512)
        );
        assert_eq!(config.local_rope_theta, Some(10_000.0));
        assert_eq!(config.rope_theta, 1_000_000.0);
        let scaling = config.rope_scaling.as_ref().unwrap();
        assert_eq!(scaling.kind(), Some("proportional"));
        assert_eq!(scaling.partial_rotary_factor, Some(0.25));
        assert_eq!(config.attention_scale, 1.0);
        // Layers 15 to 34 read layer 13's (sliding) or 14's (full) cache.
        assert!(!config.shares_kv(14) && config.shares_kv(15));
        assert_eq!(config.kv_source(15), Some(13));
        assert_eq!(config.kv_source(19), Some(14));
        assert_eq!(config.kv_source(34), Some(14));
        assert_eq!(config.kv_elements_of(15), 0);
        assert_eq!(config.kv_elements_of(13), 2 * 256);
        assert_eq!(config.kv_elements_of(14), 2 * 512);
        // Of the 15 layers with a cache, 12 slide.
        assert_eq!(config.sliding_layers(), Some((12, 512)));
        assert_eq!(config.intermediate_size_of(14), 6144);
        assert_eq!(config.intermediate_size_of(15), 2 * 6144);
        assert_eq!(
            config.per_layer_input,
            Some(PerLayerInputConfig {
                width: 256,
                vocab_size: 262144
            })
        );
        assert_eq!(config.final_logit_softcapping, Some(30.0));
        assert!(config.tie_word_embeddings && config.experts.is_none());
        assert_eq!(config.max_position_embeddings, Some(131072));
    }

    #[test]
    fn the_mixture_routes_beside_its_dense_mlp_and_its_full_layers_reuse_their_keys() {
        let config = settle_multimodal(&a4b()).unwrap();
        let experts = config.experts.as_ref().unwrap();
        assert_eq!(experts.kind, ExpertsKind::Gemma4);
        assert_eq!((experts.num_experts, experts.num_experts_per_tok), (128, 8));
        assert_eq!(config.expert_layers(), 30);
        assert_eq!(config.kv_shared_layers, 0);
        assert!(config.per_layer_input.is_none());
        // Sliding layers: 8 KV heads of 256 with their own values; full
        // ones: 2 of 512 whose values are their keys.
        assert_eq!((config.kv_heads_of(0), config.head_dim_of(0)), (8, 256));
        assert!(!config.values_are_keys(0));
        assert_eq!((config.kv_heads_of(5), config.head_dim_of(5)), (2, 512));
        assert!(config.values_are_keys(5));
        assert_eq!(config.sliding_layers(), Some((25, 1024)));
    }

    #[test]
    fn a_null_key_is_unset_as_in_mlx_lm() {
        let mut value = e2b();
        value["text_config"]["final_logit_softcapping"] = Value::Null;
        value["text_config"]["global_head_dim"] = Value::Null;
        value["text_config"]["hidden_size_per_layer_input"] = Value::Null;
        let config = settle_multimodal(&value).unwrap();
        assert_eq!(config.final_logit_softcapping, None);
        assert_eq!(config.head_dim_of(4), 256);
        assert_eq!(config.per_layer_input, None);
        // Absent keys take the defaults instead: a text config of nothing
        // but its type is the E2B shape, five layers to a full one.
        let bare = settle_text(&json!({"model_type": "gemma4_text"})).unwrap();
        assert_eq!(bare.num_hidden_layers, 35);
        assert_eq!(bare.window_of(3), Some(512));
        assert_eq!(bare.window_of(4), None);
        assert_eq!(bare.final_logit_softcapping, Some(30.0));
        assert!(bare.tie_word_embeddings);
    }

    #[test]
    fn shared_layers_without_an_earlier_layer_of_their_kind_are_refused() {
        let mut value = e2b();
        // Layers 0 to 3 slide; 4 (full) would read a full layer before it.
        value["text_config"]["num_hidden_layers"] = json!(5);
        value["text_config"]["layer_types"] = json!(layer_types(5, 5));
        value["text_config"]["num_kv_shared_layers"] = json!(1);
        let error = settle_multimodal(&value).unwrap_err();
        assert!(error.to_string().contains("layer 4"), "{error}");
    }
}
