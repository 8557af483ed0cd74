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
//! since the multimodal configs leave most of them out; the one exception is
//! the multimodal models' context, 131,072 tokens as transformers has it
//! (the 4B and larger models are trained for it; mlx-lm's dataclass default
//! of 32,768 is the 1B model's).

use serde_json::{Value, json};

use super::config::{Activation, ConfigError, ConfigKeys, Keys, ModelConfig, merged, missing};
use super::synth::{
    Shape, SynthChoices, SynthRecipe, VisionSynth, VisionToken, nest_under_text_config, plain_rope,
};
use super::tensors::{PlannedTensor, TensorKind};
use super::{Family, ReplyStyle, every_layout_readable};

pub const GEMMA3_TEXT: Family = Family {
    model_type: "gemma3_text",
    class_name: "Gemma3ForCausalLM",
    about: "Gemma 3 1B, and the text model of the larger Gemma 3 checkpoints",
    settle: settle_text,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle::PLAIN,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: text_synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

pub const GEMMA3: Family = Family {
    model_type: "gemma3",
    class_name: "Gemma3ForConditionalGeneration",
    about: "Gemma 3 4B, 12B and 27B (multimodal checkpoints: text, and images through the SigLIP tower)",
    settle: settle_multimodal,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle::PLAIN,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: multimodal_synth_config,
        extra_tensors: &[],
        vision: Some(VisionSynth {
            tokens: &[
                VisionToken {
                    text: "<start_of_image>",
                    config_key: "boi_token_index",
                    name: "boi_token",
                },
                VisionToken {
                    text: "<end_of_image>",
                    config_key: "eoi_token_index",
                    name: "eoi_token",
                },
                VisionToken {
                    text: "<image_soft_token>",
                    config_key: "image_token_index",
                    name: "image_token",
                },
            ],
            marker: "<start_of_image>",
            config: vision_synth_config,
            tensors: vision_tensors,
            processor_files,
        }),
    },
};

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

/// Settles a `gemma3_text` config.
pub fn settle_text(value: &Value) -> Result<ModelConfig, ConfigError> {
    settle("gemma3_text", &merged(text_defaults(), value))
}

/// Settles a multimodal `gemma3` config: its `text_config`, with the
/// top-level vocabulary size and quantization, read from `language_model.`.
pub fn settle_multimodal(value: &Value) -> Result<ModelConfig, ConfigError> {
    let Some(text) = value.get("text_config").filter(|t| t.is_object()) else {
        return Err(missing("text_config"));
    };
    // mlx-lm's multimodal defaults differ from the text model's for the
    // heads; the context is the larger models' (see the module comment).
    let defaults = merged(
        text_defaults(),
        &json!({
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "max_position_embeddings": 131_072,
        }),
    );
    let mut text = merged(defaults, text);
    text["vocab_size"] = value.get("vocab_size").cloned().unwrap_or(json!(262_208));
    if let Some(quantization) = value.get("quantization") {
        text["quantization"] = quantization.clone();
    }
    let mut config = settle("gemma3", &text)?;
    config.weight_prefix = "language_model.model".into();
    config.head_prefix = "language_model.lm_head".into();
    config.skipped_prefixes = vec!["vision_tower.".into(), "multi_modal_projector.".into()];
    Ok(config)
}

fn settle(model_type: &str, value: &Value) -> Result<ModelConfig, ConfigError> {
    let keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    let rope_theta = keys.require_rope_theta()?;
    let window = read.required_count("sliding_window")? as i32;
    let pattern = read.required_count("sliding_window_pattern")? as usize;
    let scalar = read.required_number("query_pre_attn_scalar")? as f32;
    let local_base = read.required_number("rope_local_base_freq")? as f32;
    let hidden = keys.hidden_size;
    let layers = keys.num_hidden_layers;
    // The head is tied exactly when the checkpoint has none (mlx-lm decides
    // the same way); the engine settles it from the tensors. Gemma 3's
    // checkpoints have none, which is what the tensor plan expects unless
    // the config says otherwise.
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let mut config = ModelConfig::from_keys(model_type, keys, rope_theta, tie);
    config.tie_when_no_head = true;
    config.qk_norm = true;
    config.norms_add_one = true;
    config.sandwich_norms = true;
    // mlx-lm rounds the scale to bfloat16 before casting it to the
    // model's dtype.
    config.embed_scale = Some(bfloat16_rounded(f64::from(hidden).sqrt() as f32));
    config.activation = Activation::GeluApprox;
    config.attention_scale = scalar.powf(-0.5);
    config.local_rope_theta = Some(local_base);
    config.layer_windows = (0..layers)
        .map(|i| ((i + 1) % pattern != 0).then_some(window))
        .collect();
    Ok(config)
}

/// `x` rounded to the nearest bfloat16 (ties to even), as a float32.
fn bfloat16_rounded(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounding = 0x7fff + ((bits >> 16) & 1);
    f32::from_bits(bits.wrapping_add(rounding) & 0xffff_0000)
}

/// Gemma's own keys: every second layer attends to everything, so a
/// two-layer preset still has one layer of each kind.
fn text_synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    config["rope_local_base_freq"] = json!(10_000.0);
    config["query_pre_attn_scalar"] = json!(shape.head_dim);
    config["sliding_window"] = json!(choices.sliding_window);
    config["sliding_window_pattern"] = json!(2);
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["hidden_act"] = json!("gelu_pytorch_tanh");
    config["final_logit_softcapping"] = Value::Null;
    config["attn_logit_softcapping"] = Value::Null;
}

/// The text model's keys under `text_config`, and at the top level what a
/// multimodal checkpoint keeps there (`nest_under_text_config`) with a
/// SigLIP vision config.
fn multimodal_synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    text_synth_config(config, shape, choices);
    nest_under_text_config(
        config,
        "gemma3_text",
        "gemma3",
        json!({"model_type": "siglip_vision_model"}),
    );
}

/// The vision keys of a synthetic multimodal folder: a model the size of
/// Gemma 3 4B or larger gets Gemma 3's own tower (SigLIP so400m at 896
/// pixels, 256 tokens an image); a smaller one a small tower with every
/// part of the real one (112 pixels in 14-pixel patches, pooled to 16
/// tokens).
fn vision_synth_config(config: &mut Value, shape: &Shape, ids: &[u32]) {
    let (mut vision, tokens) = if shape.hidden_size >= 2048 {
        (
            json!({"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                   "num_attention_heads": 16, "patch_size": 14, "image_size": 896}),
            256,
        )
    } else {
        (
            json!({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "patch_size": 14, "image_size": 112}),
            16,
        )
    };
    vision["model_type"] = json!("siglip_vision_model");
    vision["layer_norm_eps"] = json!(1e-6);
    vision["vision_use_head"] = json!(false);
    config["vision_config"] = vision;
    config["mm_tokens_per_image"] = json!(tokens);
    // The width image features are divided by before the embedding scale:
    // mlx-vlm reads it at the top level (2048 when absent); transformers'
    // model, which Ondo follows, uses the text model's.
    config["hidden_size"] = config["text_config"]["hidden_size"].clone();
    config["text_config"]["mm_tokens_per_image"] = json!(tokens);
    for (key, id) in ["boi_token_index", "eoi_token_index", "image_token_index"]
        .iter()
        .zip(ids)
    {
        config[*key] = json!(id);
    }
}

/// The tower's and projector's tensors for `config`, named and laid out as
/// mlx-community's conversions store them (the patch kernel channels last).
fn vision_tensors(config: &Value) -> Vec<PlannedTensor> {
    let vision = &config["vision_config"];
    let size = |key: &str| vision[key].as_i64().unwrap_or(0) as i32;
    let (h, i, k) = (
        size("hidden_size"),
        size("intermediate_size"),
        size("patch_size"),
    );
    let grid = size("image_size") / k.max(1);
    let text_hidden = config["text_config"]["hidden_size"].as_i64().unwrap_or(0) as i32;
    let root = "vision_tower.vision_model";
    let tensor =
        |name: String, shape: Vec<i32>, kind: TensorKind| PlannedTensor { name, shape, kind };
    let mut plan = vec![
        tensor(
            format!("{root}.embeddings.patch_embedding.weight"),
            vec![h, k, k, 3],
            TensorKind::FloatMatrix,
        ),
        tensor(
            format!("{root}.embeddings.patch_embedding.bias"),
            vec![h],
            TensorKind::Bias,
        ),
        tensor(
            format!("{root}.embeddings.position_embedding.weight"),
            vec![grid * grid, h],
            TensorKind::FloatMatrix,
        ),
    ];
    for n in 0..size("num_hidden_layers") {
        let p = format!("{root}.encoder.layers.{n}");
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            plan.push(tensor(
                format!("{p}.self_attn.{proj}.weight"),
                vec![h, h],
                TensorKind::FloatMatrix,
            ));
            plan.push(tensor(
                format!("{p}.self_attn.{proj}.bias"),
                vec![h],
                TensorKind::Bias,
            ));
        }
        for norm in ["layer_norm1", "layer_norm2"] {
            plan.push(tensor(
                format!("{p}.{norm}.weight"),
                vec![h],
                TensorKind::Gain,
            ));
            plan.push(tensor(
                format!("{p}.{norm}.bias"),
                vec![h],
                TensorKind::Bias,
            ));
        }
        plan.push(tensor(
            format!("{p}.mlp.fc1.weight"),
            vec![i, h],
            TensorKind::FloatMatrix,
        ));
        plan.push(tensor(
            format!("{p}.mlp.fc1.bias"),
            vec![i],
            TensorKind::Bias,
        ));
        plan.push(tensor(
            format!("{p}.mlp.fc2.weight"),
            vec![h, i],
            TensorKind::FloatMatrix,
        ));
        plan.push(tensor(
            format!("{p}.mlp.fc2.bias"),
            vec![h],
            TensorKind::Bias,
        ));
    }
    plan.push(tensor(
        format!("{root}.post_layernorm.weight"),
        vec![h],
        TensorKind::Gain,
    ));
    plan.push(tensor(
        format!("{root}.post_layernorm.bias"),
        vec![h],
        TensorKind::Bias,
    ));
    // Stored minus one (Gemma's RMSNorm), so the scale is one more.
    plan.push(tensor(
        "multi_modal_projector.mm_soft_emb_norm.weight".into(),
        vec![h],
        TensorKind::Gain,
    ));
    plan.push(tensor(
        "multi_modal_projector.mm_input_projection_weight".into(),
        vec![h, text_hidden],
        TensorKind::FloatMatrix,
    ));
    plan
}

/// Gemma 3's preprocessor_config.json (a square resize with Pillow's
/// bilinear filter, pixels scaled to [-1, 1], pan-and-scan off) and
/// processor_config.json, for `config`'s image size and tokens.
fn processor_files(config: &Value) -> [(&'static str, Value); 2] {
    let side = config["vision_config"]["image_size"].clone();
    let tokens = config["mm_tokens_per_image"].clone();
    [
        (
            "preprocessor_config.json",
            json!({
                "do_convert_rgb": null,
                "do_normalize": true,
                "do_pan_and_scan": null,
                "do_rescale": true,
                "do_resize": true,
                "image_mean": [0.5, 0.5, 0.5],
                "image_processor_type": "Gemma3ImageProcessor",
                "image_seq_length": tokens,
                "image_std": [0.5, 0.5, 0.5],
                "pan_and_scan_max_num_crops": null,
                "pan_and_scan_min_crop_size": null,
                "pan_and_scan_min_ratio_to_activate": null,
                "processor_class": "Gemma3Processor",
                "resample": 2,
                "rescale_factor": 1.0 / 255.0,
                "size": {"height": side, "width": side},
            }),
        ),
        (
            "processor_config.json",
            json!({"image_seq_length": tokens, "processor_class": "Gemma3Processor"}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedding_scale_is_rounded_to_bfloat16_as_mlx_lm_rounds_it() {
        // sqrt(1152) = 33.94...: bfloat16 steps by 0.25 there, so 34.
        assert_eq!(bfloat16_rounded(1152f32.sqrt()), 34.0);
        assert_eq!(bfloat16_rounded(16.0), 16.0);
        // A tie rounds to the even neighbour: 1 + 2^-8 lies halfway
        // between 1 and 1 + 2^-7.
        assert_eq!(bfloat16_rounded(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(bfloat16_rounded(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        let config = settle_text(&json!({"hidden_size": 1152})).unwrap();
        assert_eq!(config.embed_scale, Some(34.0));
    }
}
