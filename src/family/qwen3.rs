//! `model_type: qwen3` (Qwen3 dense models): the dense decoder with an
//! RMSNorm over each head's queries and keys before rope, no projection
//! biases, and `rope_theta` and `tie_word_embeddings` required in
//! config.json. Qwen3 opens a `<think>` block itself when it reasons.

use serde_json::Value;

use super::config::{ConfigError, ConfigKeys, ModelConfig};
use super::synth::PLAIN_ROPE;
use super::{Family, ReplyStyle, ThinkMarkers, ToolCallSyntax, every_layout_readable};

pub const QWEN3: Family = Family {
    model_type: "qwen3",
    class_name: "Qwen3ForCausalLM",
    about: "Qwen3's dense models",
    settle,
    unreadable_layout: every_layout_readable,
    reply: THINKING_QWEN,
    synth: PLAIN_ROPE,
};

/// Qwen3's replies: reasoning in a `<think>` block the model opens, tool
/// calls in `<tool_call>` tags.
pub(super) const THINKING_QWEN: ReplyStyle = ReplyStyle {
    harmony: false,
    thinks: Some(ThinkMarkers::Tags),
    tool_calls: ToolCallSyntax::Tagged,
};

/// Settles a Qwen3 config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let keys = ConfigKeys::parse(value)?;
    let rope_theta = keys.require_rope_theta()?;
    let tie = keys.require_tie_word_embeddings()?;
    let bias = keys.attention_bias.unwrap_or(false);
    let mut config = ModelConfig::from_keys("qwen3", keys, rope_theta, tie);
    config.qkv_bias = bias;
    config.o_bias = bias;
    config.qk_norm = true;
    Ok(config)
}
