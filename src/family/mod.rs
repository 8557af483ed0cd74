//! What Ondo knows about each model family, in one place and without MLX:
//! the `model_type` it answers to, how its config.json settles into the
//! shape the engine builds (the keys it reads and their defaults, layer
//! kinds and sliding windows, experts), the tensors that shape has, how its
//! replies mark reasoning and tool calls, and how `ondo synth` writes a
//! folder of it. The engine, the fit estimate, synth, the catalog and the
//! reply splitter all read these descriptions, so they cannot disagree
//! about a family. docs/ADDING_A_FAMILY.md says how to add one.

pub mod config;
pub mod embedding;
pub mod quant;
pub mod shards;
pub mod synth;
pub mod tensors;

mod gemma3;
mod gemma4;
mod glm4_moe;
mod gpt_oss;
mod lfm2;
mod llama;
mod ministral3;
mod mistral;
mod mistral3;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;
mod qwen3_vl;
mod smollm3;

use serde_json::Value;

pub use config::{
    Activation, ConfigError, DeltaProjections, ExpertsConfig, ExpertsKind, FullAttention,
    GatedDeltaConfig, ModelConfig, PerLayerInputConfig, PositionQueryScale, RopeScaling,
    ShortConvConfig, TensorNames,
};
pub use gemma3::{GEMMA3, GEMMA3_TEXT};
pub use gemma4::{GEMMA4, GEMMA4_TEXT};
pub use glm4_moe::GLM4_MOE;
pub use gpt_oss::GPT_OSS;
pub use lfm2::LFM2;
pub use llama::LLAMA;
pub use ministral3::MINISTRAL3;
pub use mistral::MISTRAL;
pub use mistral3::MISTRAL3;
pub use phi3::PHI3;
pub use quant::{QuantConfig, QuantMode, QuantParams};
pub use qwen2::QWEN2;
pub use qwen3::QWEN3;
pub use qwen3_5::{QWEN3_5, QWEN3_5_MOE};
pub use qwen3_moe::QWEN3_MOE;
pub use qwen3_next::QWEN3_NEXT;
pub use qwen3_vl::QWEN3_VL;
pub use smollm3::SMOLLM3;
pub use synth::SynthRecipe;

/// One model family: everything about it that is not computation.
#[derive(Debug)]
pub struct Family {
    /// The top-level `model_type` of config.json this family reads.
    pub model_type: &'static str,
    /// `architectures[0]` of config.json, as transformers names the class.
    pub class_name: &'static str,
    /// Which models these are, in a line (`ondo synth --help` lists it).
    pub about: &'static str,
    /// Settles a config.json into the shape the engine builds, applying the
    /// family's defaults (mlx-lm's, so a config that leaves keys out loads
    /// the same model in both).
    pub settle: fn(&Value) -> Result<ModelConfig, ConfigError>,
    /// A checkpoint of this type whose tensors are laid out in a way the
    /// engine does not read, told from its config before anything is
    /// downloaded: what it is and which checkpoint to take instead.
    pub unreadable_layout: fn(&Value) -> Option<&'static str>,
    /// How the family's replies mark reasoning and tool calls.
    pub reply: ReplyStyle,
    /// How `ondo synth` writes a folder of this family.
    pub synth: SynthRecipe,
}

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        self.model_type == other.model_type
    }
}

impl Eq for Family {}

/// What a family's replies look like where its chat template does not say
/// (`engine::reply::ReplyFormat::detect` reads the template first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyStyle {
    /// Replies are harmony messages (channels for reasoning and answer).
    pub harmony: bool,
    /// The model may open a reasoning block itself at the start of a
    /// reply, between these markers.
    pub thinks: Option<ThinkMarkers>,
    /// How it writes a tool call in plain text.
    pub tool_calls: ToolCallSyntax,
}

impl ReplyStyle {
    /// Plain answers; tool calls in the most common convention.
    pub const PLAIN: ReplyStyle = ReplyStyle {
        harmony: false,
        thinks: None,
        tool_calls: ToolCallSyntax::Tagged,
    };
}

/// The markers around a reasoning block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkMarkers {
    /// `<think>...</think>` (Qwen3, DeepSeek-R1, SmolLM3).
    Tags,
    /// `<|channel>thought...<channel|>` (Gemma 4): special tokens, so the
    /// reply is decoded with them.
    Channel,
}

/// How a family writes tool calls in plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallSyntax {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number
    /// of them, anywhere in the answer (Qwen2.5, Qwen3, Hermes); inside the
    /// tags also Qwen 3.5's `<function=name>` form and GLM-4.5's
    /// `name<arg_key>key</arg_key><arg_value>value</arg_value>`.
    Tagged,
    /// The answer is one or more JSON objects `{"name": ..., "parameters":
    /// {...}}` separated by `;`, optionally after `<|python_tag|>` (Llama
    /// 3.1, 3.2): only at the start of the answer.
    BareJson,
    /// `<|tool_call_start|>[name(key="value", n=1), ...]<|tool_call_end|>`:
    /// a Python-style list of calls with keyword arguments (LFM2).
    PythonList,
    /// `[TOOL_CALLS]name[ARGS]{...}`, repeated, a `[CALL_ID]id` allowed
    /// before `[ARGS]` (Ministral 3, Mistral Small 3.x), or `[TOOL_CALLS][{"name":
    /// ..., "arguments": {...}}]` (Mistral 7B v0.3). No marker ends them: the
    /// calls run to the end of the reply.
    Mistral,
    /// `<|tool_call>call:name{key:<|"|>value<|"|>,n:1}<tool_call|>`: Gemma
    /// 4's calls, keys bare and strings between `<|"|>` (special tokens,
    /// so the reply is decoded with them).
    GemmaCall,
}

/// Every family Ondo runs, in the order Ondo lists them.
pub static FAMILIES: [&Family; 20] = [
    &LLAMA,
    &MISTRAL,
    &QWEN2,
    &QWEN3,
    &QWEN3_MOE,
    &GPT_OSS,
    &GEMMA3_TEXT,
    &GEMMA3,
    &PHI3,
    &SMOLLM3,
    &MINISTRAL3,
    &MISTRAL3,
    &LFM2,
    &QWEN3_5,
    &QWEN3_5_MOE,
    &QWEN3_VL,
    &GLM4_MOE,
    &QWEN3_NEXT,
    &GEMMA4_TEXT,
    &GEMMA4,
];

/// The family that reads config.json's `model_type`.
pub fn find(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_type == model_type)
}

/// The `model_type`s Ondo runs, in order.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.model_type).collect()
}

/// The `model_type` a config names at its top level: the one that decides
/// which family reads it.
pub fn model_type(config: &Value) -> Option<&str> {
    config.get("model_type").and_then(Value::as_str)
}

/// The family of a parsed config.json, or why there is none.
pub fn of_config(config: &Value) -> Result<&'static Family, ConfigError> {
    let name = model_type(config).unwrap_or_default();
    find(name).ok_or_else(|| ConfigError::UnsupportedModelType {
        model_type: name.to_owned(),
        supported: model_types().join(", "),
    })
}

/// Settles a parsed config.json with its family's rules.
pub fn settle(config: &Value) -> Result<ModelConfig, ConfigError> {
    (of_config(config)?.settle)(config)
}

/// A layout every family reads.
fn every_layout_readable(_: &Value) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_type_names_one_family() {
        for (i, family) in FAMILIES.iter().enumerate() {
            assert_eq!(find(family.model_type), Some(*family));
            assert!(
                FAMILIES[..i]
                    .iter()
                    .all(|other| other.model_type != family.model_type),
                "{} listed twice",
                family.model_type
            );
        }
        assert_eq!(find("mamba"), None);
    }

    #[test]
    fn an_unknown_model_type_names_the_ones_that_run() {
        let error = settle(&serde_json::json!({"model_type": "mamba"})).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("mamba") && text.contains("llama, mistral"),
            "{text}"
        );
        let error = settle(&serde_json::json!({"hidden_size": 8})).unwrap_err();
        assert!(matches!(error, ConfigError::UnsupportedModelType { .. }));
    }
}
