//! A chat turn as a client (the app) sends it: the settings a user can set,
//! checked, turned into an engine request; and the events a chat window needs
//! while the answer streams.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::generate::{DEFAULT_PREFILL_STEP_SIZE, LoopShape};
use crate::engine::sample::SamplerSettings;
use crate::engine::{GenerateRequest, LoadKind, Prompt, RunEvent};

/// The generation settings of the app's Settings screen, with mlx-lm's
/// defaults where it has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct GenerationSettings {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    pub prefill_step_size: usize,
    pub max_kv_size: Option<usize>,
}

impl Default for GenerationSettings {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            temperature: 0.0,
            top_p: 0.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: None,
            seed: None,
            loop_shape: LoopShape::Pipelined,
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
            max_kv_size: None,
        }
    }
}

/// The most tokens one answer may ask for.
pub const MAX_ANSWER_TOKENS: usize = 32_768;

impl GenerationSettings {
    /// Says what is wrong with settings a form let through.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_ANSWER_TOKENS).contains(&self.max_tokens) {
            return Err(format!(
                "max tokens is {}; choose between 1 and {MAX_ANSWER_TOKENS}",
                self.max_tokens
            ));
        }
        if !(0.0..=5.0).contains(&self.temperature) {
            return Err("temperature must be between 0 (greedy) and 5".into());
        }
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            return Err("top p and min p are probabilities, between 0 and 1".into());
        }
        if self.prefill_step_size == 0 {
            return Err("the prefill step size must be at least 1 token".into());
        }
        if self.max_kv_size.is_some_and(|n| n < 16) {
            return Err("a KV cache bound below 16 positions cannot hold a prompt".into());
        }
        Ok(())
    }

    /// The engine request for one turn of a conversation.
    pub fn request(
        &self,
        model_dir: &Path,
        conversation_id: &str,
        prompt: Prompt,
    ) -> GenerateRequest {
        GenerateRequest {
            conversation: Some(conversation_id.to_owned()),
            max_tokens: self.max_tokens,
            sampler: SamplerSettings {
                temperature: self.temperature,
                top_p: self.top_p,
                min_p: self.min_p,
                top_k: self.top_k,
                repetition_penalty: self.repetition_penalty,
                seed: self.seed,
                ..SamplerSettings::default()
            },
            prefill_step_size: self.prefill_step_size,
            max_kv_size: self.max_kv_size,
            loop_shape: self.loop_shape,
            ..GenerateRequest::new(model_dir, prompt)
        }
    }
}

/// What a chat window hears while an answer streams; the finished run's
/// record comes back as the command's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ChatEvent {
    /// The model is resident (loaded now, or warm) and prefill begins.
    Started {
        load_kind: LoadKind,
        load_ms: f64,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// More text of the answer.
    Delta { text: String },
}

impl ChatEvent {
    /// The streamed part of an engine event; the end comes as the result.
    pub fn from_run_event(event: &RunEvent) -> Option<Self> {
        match event {
            RunEvent::Started {
                load_kind,
                load_ms,
                prompt_tokens,
                cached_tokens,
            } => Some(Self::Started {
                load_kind: *load_kind,
                load_ms: *load_ms,
                prompt_tokens: *prompt_tokens,
                cached_tokens: *cached_tokens,
            }),
            RunEvent::Delta { text, .. } if !text.is_empty() => {
                Some(Self::Delta { text: text.clone() })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_bad_values_are_named() {
        assert!(GenerationSettings::default().check().is_ok());
        let bad = GenerationSettings {
            max_tokens: 0,
            ..GenerationSettings::default()
        };
        assert!(bad.check().unwrap_err().contains("max tokens"));
        let bad = GenerationSettings {
            top_p: 1.5,
            ..GenerationSettings::default()
        };
        assert!(bad.check().unwrap_err().contains("top p"));
    }

    #[test]
    fn settings_read_what_the_ui_sends_with_defaults_for_the_rest() {
        let s: GenerationSettings =
            serde_json::from_str(r#"{"max_tokens": 64, "loop": "sync"}"#).unwrap();
        assert_eq!(s.max_tokens, 64);
        assert_eq!(s.loop_shape, LoopShape::Sync);
        assert_eq!(s.prefill_step_size, DEFAULT_PREFILL_STEP_SIZE);
    }

    #[test]
    fn only_text_and_the_start_are_streamed() {
        let empty = RunEvent::Delta {
            text: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            token_ids: vec![1],
        };
        assert_eq!(ChatEvent::from_run_event(&empty), None);
        let delta = RunEvent::Delta {
            text: "hi".into(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            token_ids: vec![1],
        };
        assert_eq!(
            serde_json::to_value(ChatEvent::from_run_event(&delta).unwrap()).unwrap(),
            serde_json::json!({"event": "delta", "text": "hi"})
        );
    }
}
