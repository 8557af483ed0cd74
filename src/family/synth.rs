//! How `ondo synth` writes a folder of a family. The preset shapes
//! (`synth::presets`) are the same for every family; a family's recipe
//! adjusts a shape to the family's conventions (its rope base, experts, a
//! tied or untied head) and writes the config.json keys only that family
//! has. The tensors follow from the config the family then settles
//! (`tensors::plan`), so what synth writes is what the engine reads.

use serde::Serialize;
use serde_json::{Value, json};

/// Llama 3's rope scaling (`rope_type: llama3`) as its config writes it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: u32,
}

/// The routed experts of a mixture-of-experts model, in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ExpertShape {
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Width of each expert's SwiGLU.
    pub moe_intermediate_size: usize,
}

impl ExpertShape {
    /// 8 experts, 2 per token, each half as wide as the dense MLP: a token
    /// computes as much as in the dense model of the same shape, while
    /// four times the MLP weights stay resident.
    pub fn eight_choose_two(shape: &Shape) -> Self {
        Self {
            num_experts: 8,
            experts_per_token: 2,
            moe_intermediate_size: shape.intermediate_size / 2,
        }
    }
}

/// The shape of a model: everything `config.json` says about its tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Rows of the embedding; may exceed the tokenizer's vocabulary, as in
    /// real checkpoints.
    pub vocab_size: usize,
    /// Tokens the synthetic BPE tokenizer learns (specials included).
    pub tokenizer_vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    /// Routed experts in place of the dense MLP; `None` for dense models.
    pub experts: Option<ExpertShape>,
}

/// What the person asking for a folder chose beyond the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthChoices {
    /// The sliding window of the families that have sliding-window layers,
    /// in positions (small values let tests cross it cheaply).
    pub sliding_window: usize,
}

/// A family's part in `ondo synth`.
#[derive(Debug)]
pub struct SynthRecipe {
    /// Adjusts a preset's shape to the family's conventions.
    pub adjust: fn(&mut Shape),
    /// Writes the family's own keys into config.json, after the keys every
    /// family shares (`shared_config`).
    pub config: fn(&mut Value, &Shape, &SynthChoices),
    /// Tensors of other parts of a checkpoint (a vision tower) that a real
    /// one has and neither Ondo nor mlx-lm's text model reads, written as
    /// one small norm scale each.
    pub extra_tensors: &'static [&'static str],
    /// The vision tower a multimodal family's folder carries, for Ondo's
    /// vision path and mlx-vlm to read.
    pub vision: Option<VisionSynth>,
}

/// A family's vision tower in `ondo synth`: random weights in the real
/// layout, the processor's files and the tokens that mark images.
#[derive(Debug)]
pub struct VisionSynth {
    /// The tokens the processor marks images with, added to the tokenizer
    /// as special tokens after its own (they take its last ids), each with
    /// the config.json key that holds its id and the name
    /// tokenizer_config.json's `extra_special_tokens` gives it.
    pub tokens: &'static [VisionToken],
    /// What the chat template writes for each image (the processor then
    /// expands it into the image's tokens).
    pub marker: &'static str,
    /// Writes the vision keys into config.json (the token ids in
    /// `tokens`' order).
    pub config: fn(&mut Value, &Shape, &[u32]),
    /// The tower's and projector's tensors for that config.
    pub tensors: fn(&Value) -> Vec<super::tensors::PlannedTensor>,
    /// preprocessor_config.json and processor_config.json for that config.
    pub processor_files: fn(&Value) -> [(&'static str, Value); 2],
}

#[derive(Debug)]
pub struct VisionToken {
    pub text: &'static str,
    pub config_key: &'static str,
    pub name: &'static str,
}

/// The config.json keys every family's folder has, from the shape.
pub fn shared_config(model_type: &str, class_name: &str, shape: &Shape) -> Value {
    let mut config = serde_json::json!({
        "architectures": [class_name],
        "model_type": model_type,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "attention_bias": false,
        "mlp_bias": false,
        "hidden_act": "silu",
    });
    if let Some(scaling) = shape.rope_scaling {
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        });
    }
    config
}

/// The preset as it is (the presets are Llama's shapes) and no keys of
/// its own.
pub const PRESET_AS_IS: SynthRecipe = SynthRecipe {
    adjust: shape_as_is,
    config: no_own_keys,
    extra_tensors: &[],
    vision: None,
};

/// Plain rope (`plain_rope`) and no keys of its own.
pub const PLAIN_ROPE: SynthRecipe = SynthRecipe {
    adjust: plain_rope,
    config: no_own_keys,
    extra_tensors: &[],
    vision: None,
};

/// The shape as is: the family's conventions are the preset's (Llama).
fn shape_as_is(_: &mut Shape) {}

/// No keys beyond the shared ones.
fn no_own_keys(_: &mut Value, _: &Shape, _: &SynthChoices) {}

/// Plain rope with a base of one million and no scaling, as Mistral, Qwen,
/// Gemma and Phi configs have.
pub fn plain_rope(shape: &mut Shape) {
    shape.rope_theta = 1_000_000.0;
    shape.rope_scaling = None;
}

/// A text model's config moved under `text_config` (its type
/// `text_model_type`), and at the top level what a multimodal checkpoint
/// keeps there: its type and class, the vocabulary, the token ids, the
/// dtype and `vision_config`.
pub fn nest_under_text_config(
    config: &mut Value,
    text_model_type: &str,
    model_type: &str,
    vision_config: Value,
) {
    let Some(text) = config.as_object_mut() else {
        return;
    };
    let mut top = serde_json::Map::new();
    let mut take = |key: &str, moved: bool| {
        let value = if moved {
            text.remove(key)
        } else {
            text.get(key).cloned()
        };
        if let Some(value) = value {
            top.insert(key.to_owned(), value);
        }
    };
    take("architectures", true);
    for key in ["vocab_size", "eos_token_id", "bos_token_id", "torch_dtype"] {
        take(key, false);
    }
    let synthetic = text.remove("ondo_synthetic");
    text.insert("model_type".into(), json!(text_model_type));
    top.insert("model_type".into(), json!(model_type));
    top.insert("vision_config".into(), vision_config);
    if let Some(synthetic) = synthetic {
        top.insert("ondo_synthetic".into(), synthetic);
    }
    top.insert("text_config".into(), Value::Object(std::mem::take(text)));
    *config = Value::Object(top);
}
