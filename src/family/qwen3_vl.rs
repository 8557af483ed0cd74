//! `model_type: qwen3_vl` (Qwen3-VL's dense models): Qwen3's text model
//! (`text_config`, tensors under `language_model.model.`; transformers'
//! `model.language_model.` read too) with a vision tower of its own
//! (`engine::model::qwen_vision`). Its rope is 3-D for image tokens
//! (`rope_scaling.mrope_section`: the rotated frequencies split between
//! time, row and column, interleaved); text positions turn all three
//! axes alike, which is Qwen3's rope, so a prompt without images runs as
//! Qwen3 does. Missing keys take mlx-vlm's defaults.

use serde_json::{Value, json};

use super::config::{ConfigError, ConfigKeys, Keys, ModelConfig, missing};
use super::synth::{
    Shape, SynthChoices, SynthRecipe, VisionSynth, VisionToken, nest_under_text_config, plain_rope,
};
use super::tensors::{PlannedTensor, TensorKind};
use super::{Family, every_layout_readable};

pub const QWEN3_VL: Family = Family {
    model_type: "qwen3_vl",
    class_name: "Qwen3VLForConditionalGeneration",
    about: "Qwen3-VL's dense models (text, and images at their own size through Qwen's vision tower)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: super::qwen3::THINKING_QWEN,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: synth_config,
        extra_tensors: &[],
        vision: Some(VisionSynth {
            tokens: QWEN_VISION_TOKENS,
            marker: QWEN_IMAGE_MARKER,
            config: vision_synth_config,
            tensors: vision_tensors,
            processor_files,
        }),
    },
};

/// The frequencies of each of time, row and column when a config names
/// none (mlx-vlm's default).
const DEFAULT_MROPE_SECTION: [usize; 3] = [24, 20, 20];

/// Settles a Qwen3-VL config: its `text_config`, with the top-level
/// quantization and (where the text config has none) tied head.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let Some(text) = value.get("text_config").filter(|t| t.is_object()) else {
        return Err(missing("text_config"));
    };
    let mut text = text.clone();
    for key in ["quantization", "tie_word_embeddings"] {
        if text.get(key).is_none()
            && let Some(top) = value.get(key)
        {
            text[key] = top.clone();
        }
    }
    let read = Keys::of(&text);
    let mut keys = ConfigKeys::parse(&text)?;
    let rope_theta = keys.require_rope_theta()?;
    // The section sits in `rope_scaling`, or with transformers 5 in
    // `rope_parameters`; the rope itself is plain (type `default`).
    let section = ["rope_scaling", "rope_parameters"]
        .iter()
        .filter_map(|key| read.get(key))
        .find_map(|r| r.get("mrope_section"))
        .cloned();
    let section = match section {
        None => DEFAULT_MROPE_SECTION,
        Some(v) => serde_json::from_value::<[usize; 3]>(v.clone()).map_err(|_| {
            ConfigError::Inconsistent(format!(
                "rope_scaling.mrope_section is {v}, not three whole numbers"
            ))
        })?,
    };
    if keys
        .rope_scaling
        .as_ref()
        .is_some_and(|s| !matches!(s.kind(), None | Some("default")))
    {
        return Err(ConfigError::Inconsistent(
            "Qwen3-VL's rope_scaling names a scaling other than `default`; Ondo reads its 3-D \
             rope unscaled"
                .into(),
        ));
    }
    keys.rope_scaling = None;
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let bias = keys.attention_bias.unwrap_or(false);
    let mut config = ModelConfig::from_keys("qwen3_vl", keys, rope_theta, tie);
    config.qkv_bias = bias;
    config.o_bias = bias;
    config.qk_norm = true;
    let frequencies = (config.rotary_dims / 2) as usize;
    if section.iter().sum::<usize>() > frequencies {
        return Err(ConfigError::Inconsistent(format!(
            "rope_scaling.mrope_section {section:?} asks for more than the {frequencies} \
             frequencies a head of {} rotates",
            config.rotary_dims
        )));
    }
    config.mrope_section = Some(section);
    config.read_inside_language_model(&["vision_tower.", "model.visual."]);
    Ok(config)
}

/// The text model's keys under `text_config` (Qwen3's, with the 3-D rope's
/// sections), and at the top level a Qwen3-VL vision config.
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    // Half of each head's frequencies, split 3:2:2 (24/20/20 of Qwen3-VL's
    // 64, 12/10/10 of a 64-wide head's 32).
    let frequencies = shape.head_dim / 2;
    let row = frequencies * 5 / 16;
    let section = [frequencies - 2 * row, row, row];
    config["rope_scaling"] = json!({
        "rope_type": "default", "mrope_section": section, "mrope_interleaved": true,
    });
    config["attention_bias"] = json!(false);
    config["hidden_act"] = json!("silu");
    // mlx-vlm reads the head's tie from the text config; transformers from
    // the top level.
    let tie = config["tie_word_embeddings"].clone();
    nest_under_text_config(config, "qwen3_vl_text", "qwen3_vl", json!({}));
    config["tie_word_embeddings"] = tie;
}

/// The vision keys of a synthetic folder: a model the size of Qwen3-VL 4B
/// or larger gets its tower (24 blocks of 1024, DeepStack after blocks 5,
/// 11 and 17); a smaller one a small tower with every part of it (3 blocks
/// of 32, DeepStack after the first two).
fn vision_synth_config(config: &mut Value, shape: &Shape, ids: &[u32]) {
    let vision = if shape.hidden_size >= 2048 {
        json!({"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
               "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17]})
    } else {
        json!({"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1]})
    };
    write_vision_config(config, vision, json!("qwen3_vl"), shape, ids);
}

/// Writes `vision` (a tower's sizes) as `config`'s vision config with what
/// every Qwen tower shares (16-pixel patches, two frames, 2x2 merges, tanh
/// GELU, the text width out), and the vision tokens' ids.
pub(super) fn write_vision_config(
    config: &mut Value,
    mut vision: Value,
    model_type: Value,
    shape: &Shape,
    ids: &[u32],
) {
    vision["model_type"] = model_type;
    vision["patch_size"] = json!(16);
    vision["temporal_patch_size"] = json!(2);
    vision["spatial_merge_size"] = json!(2);
    vision["in_channels"] = json!(3);
    vision["out_hidden_size"] = json!(shape.hidden_size);
    vision["hidden_act"] = json!("gelu_pytorch_tanh");
    config["vision_config"] = vision;
    write_token_ids(config, ids);
}

/// The vision tokens' ids (`ids`, in `QWEN_VISION_TOKENS`' order) at the
/// top level of config.json.
fn write_token_ids(config: &mut Value, ids: &[u32]) {
    for (token, id) in QWEN_VISION_TOKENS.iter().zip(ids) {
        config[token.config_key] = json!(id);
    }
}

/// The Qwen vision tokens, as the tokenizers of Qwen3-VL and Qwen 3.5
/// have them.
pub(super) const QWEN_VISION_TOKENS: &[VisionToken] = &[
    VisionToken {
        text: "<|vision_start|>",
        config_key: "vision_start_token_id",
        name: "vision_start_token",
    },
    VisionToken {
        text: "<|vision_end|>",
        config_key: "vision_end_token_id",
        name: "vision_end_token",
    },
    VisionToken {
        text: "<|image_pad|>",
        config_key: "image_token_id",
        name: "image_token",
    },
    VisionToken {
        text: "<|video_pad|>",
        config_key: "video_token_id",
        name: "video_token",
    },
];

/// What a Qwen chat template writes for an image.
pub(super) const QWEN_IMAGE_MARKER: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// The tower's tensors for `config`, named and laid out as mlx-community's
/// conversions store them (the patch kernel channels last).
pub(super) fn vision_tensors(config: &Value) -> Vec<PlannedTensor> {
    let vision = &config["vision_config"];
    let size = |key: &str| vision[key].as_i64().unwrap_or(0) as i32;
    let (h, i, k, o) = (
        size("hidden_size"),
        size("intermediate_size"),
        size("patch_size"),
        size("out_hidden_size"),
    );
    let joined = h * size("spatial_merge_size").pow(2);
    let tensor =
        |name: String, shape: Vec<i32>, kind: TensorKind| PlannedTensor { name, shape, kind };
    let mut plan = vec![
        tensor(
            "vision_tower.patch_embed.proj.weight".into(),
            vec![h, size("temporal_patch_size"), k, k, 3],
            TensorKind::FloatMatrix,
        ),
        tensor(
            "vision_tower.patch_embed.proj.bias".into(),
            vec![h],
            TensorKind::Bias,
        ),
        tensor(
            "vision_tower.pos_embed.weight".into(),
            vec![size("num_position_embeddings"), h],
            TensorKind::FloatMatrix,
        ),
    ];
    let dense = |plan: &mut Vec<PlannedTensor>, name: String, out: i32, inp: i32| {
        plan.push(tensor(
            format!("{name}.weight"),
            vec![out, inp],
            TensorKind::FloatMatrix,
        ));
        plan.push(tensor(format!("{name}.bias"), vec![out], TensorKind::Bias));
    };
    let norm = |plan: &mut Vec<PlannedTensor>, name: String, width: i32| {
        plan.push(tensor(
            format!("{name}.weight"),
            vec![width],
            TensorKind::Gain,
        ));
        plan.push(tensor(
            format!("{name}.bias"),
            vec![width],
            TensorKind::Bias,
        ));
    };
    for n in 0..size("depth") {
        let p = format!("vision_tower.blocks.{n}");
        norm(&mut plan, format!("{p}.norm1"), h);
        norm(&mut plan, format!("{p}.norm2"), h);
        dense(&mut plan, format!("{p}.attn.qkv"), 3 * h, h);
        dense(&mut plan, format!("{p}.attn.proj"), h, h);
        dense(&mut plan, format!("{p}.mlp.linear_fc1"), i, h);
        dense(&mut plan, format!("{p}.mlp.linear_fc2"), h, i);
    }
    let merger = |plan: &mut Vec<PlannedTensor>, p: String, after_join: bool| {
        norm(
            plan,
            format!("{p}.norm"),
            if after_join { joined } else { h },
        );
        dense(plan, format!("{p}.linear_fc1"), joined, joined);
        dense(plan, format!("{p}.linear_fc2"), o, joined);
    };
    merger(&mut plan, "vision_tower.merger".into(), false);
    let taps = vision["deepstack_visual_indexes"]
        .as_array()
        .map_or(0, Vec::len);
    for n in 0..taps {
        merger(
            &mut plan,
            format!("vision_tower.deepstack_merger_list.{n}"),
            true,
        );
    }
    plan
}

/// Qwen3-VL's preprocessor_config.json (16-pixel patches merged 2x2, each
/// image between 64 and 1,024 patches here so a test's images stay small)
/// and processor_config.json.
pub(super) fn processor_files(_: &Value) -> [(&'static str, Value); 2] {
    [
        (
            "preprocessor_config.json",
            json!({
                "size": {"shortest_edge": 4096, "longest_edge": 262_144},
                "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "do_rescale": true, "rescale_factor": 1.0 / 255.0, "do_normalize": true,
                "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast",
            }),
        ),
        (
            "processor_config.json",
            json!({"processor_class": "Qwen3VLProcessor"}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_3d_rope_sections_are_read_and_checked_against_the_head() {
        let text = json!({
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "rms_norm_eps": 1e-6, "vocab_size": 1000, "rope_theta": 5e6,
            "rope_scaling": {"rope_type": "default", "mrope_section": [12, 10, 10]},
        });
        let config = settle(&json!({"model_type": "qwen3_vl", "text_config": text})).unwrap();
        assert_eq!(config.mrope_section, Some([12, 10, 10]));
        assert!(config.rope_scaling.is_none() && config.qk_norm);
        assert_eq!(config.weight_prefix, "language_model.model");
        let mut wide = text.clone();
        wide["rope_scaling"]["mrope_section"] = json!([24, 20, 20]);
        let error = settle(&json!({"model_type": "qwen3_vl", "text_config": wide})).unwrap_err();
        assert!(error.to_string().contains("32 frequencies"), "{error}");
        let error = settle(&json!({"model_type": "qwen3_vl"})).unwrap_err();
        assert!(error.to_string().contains("text_config"), "{error}");
    }
}
