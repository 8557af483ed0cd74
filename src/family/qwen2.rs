//! `model_type: qwen2` (Qwen2, Qwen2.5): the dense decoder with biases on
//! the q, k and v projections (none on the output projection), rope theta
//! 1,000,000 unless set, and a tied head unless the config says otherwise.

use serde_json::Value;

use super::config::{ConfigError, ConfigKeys, ModelConfig};
use super::synth::PLAIN_ROPE;
use super::{Family, ReplyStyle, every_layout_readable};

pub const QWEN2: Family = Family {
    model_type: "qwen2",
    class_name: "Qwen2ForCausalLM",
    about: "Qwen2 and Qwen2.5",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle::PLAIN,
    synth: PLAIN_ROPE,
};

/// Settles a Qwen2 config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let keys = ConfigKeys::parse(value)?;
    let rope_theta = keys.rope_theta.unwrap_or(1_000_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(true);
    let mut config = ModelConfig::from_keys("qwen2", keys, rope_theta, tie);
    config.qkv_bias = true;
    Ok(config)
}
