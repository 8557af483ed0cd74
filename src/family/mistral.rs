//! `model_type: mistral` (Mistral 7B and its fine-tunes): computed exactly as
//! Llama is (mlx-lm maps it to llama too). Its `sliding_window` is not
//! applied, also as mlx-lm does; answers longer than the window differ from
//! a windowed implementation.

use serde_json::Value;

use super::config::{ConfigError, ModelConfig};
use super::synth::PLAIN_ROPE;
use super::{Family, ReplyStyle, every_layout_readable};

pub const MISTRAL: Family = Family {
    model_type: "mistral",
    class_name: "MistralForCausalLM",
    about: "Mistral 7B and its fine-tunes",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle::PLAIN,
    synth: PLAIN_ROPE,
};

/// Settles a Mistral config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut config = super::llama::settle(value)?;
    config.model_type = "mistral".into();
    Ok(config)
}
