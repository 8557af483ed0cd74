//! `model_type: llama` (Llama 2, 3, 3.1, 3.2): the dense decoder with rope
//! theta 10000 unless set, llama3 rope scaling, a tied head unless the
//! config says otherwise, and `attention_bias` on all four projections.
//! Llama 3.1 and 3.2 write tool calls as bare JSON.

use serde_json::Value;

use super::config::{ConfigError, ConfigKeys, ModelConfig};
use super::synth::PRESET_AS_IS;
use super::{Family, ReplyStyle, ToolCallSyntax, every_layout_readable};

pub const LLAMA: Family = Family {
    model_type: "llama",
    class_name: "LlamaForCausalLM",
    about: "Llama 2, 3, 3.1, 3.2 and the many models built on them",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle {
        harmony: false,
        thinks: None,
        tool_calls: ToolCallSyntax::BareJson,
    },
    synth: PRESET_AS_IS,
};

/// Settles a Llama config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let keys = ConfigKeys::parse(value)?;
    let rope_theta = keys.rope_theta.unwrap_or(10_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let bias = keys.attention_bias.unwrap_or(false);
    let mut config = ModelConfig::from_keys("llama", keys, rope_theta, tie);
    config.qkv_bias = bias;
    config.o_bias = bias;
    Ok(config)
}
