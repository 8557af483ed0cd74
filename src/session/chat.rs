//! A chat turn as a client (the app) sends it: the settings a user can set,
//! checked, turned into an engine request; and the events a chat window needs
//! while the answer streams.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::chat_template::ChatTemplate;
use crate::engine::generate::DEFAULT_PREFILL_STEP_SIZE;
use crate::engine::request::{DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START};
use crate::engine::sample::SamplerSettings;
use crate::engine::{GenerateRequest, Prompt, RunEvent};
use crate::run_kinds::{LoadKind, LoopShape};

/// Conversations decoded together by default. Eight: on the CPU here a
/// batch of eight decodes about 6x the tokens of one stream in the same
/// time (docs/BENCHMARKS.md, "Continuous batching"), the gain flattening
/// past it, while eight sequences' KV caches at a 4k context stay small
/// beside a 3B model's weights; mlx_lm.server's prompt concurrency is 8
/// too, and LM Studio's MLX engine takes 4.
pub const DEFAULT_MAX_BATCH: usize = 8;

/// How to generate: the one definition of each setting's default, limits
/// and meaning. The CLI's flags (`ondo run`, `ondo chat`), the app's
/// Settings form (through the generated bindings and `GenerationLimits`) and
/// the local server's request fields all read this type. Defaults are
/// mlx-lm's where it has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct GenerationSettings {
    /// Most tokens to generate.
    #[arg(long, short = 'm', default_value_t = GenerationSettings::DEFAULT.max_tokens)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy (always the most likely token).
    #[arg(long = "temp", default_value_t = GenerationSettings::DEFAULT.temperature)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this mass (0 or 1: off).
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.top_p)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.top_k)]
    pub top_k: u32,
    /// Drop tokens less likely than this fraction of the most likely (0: off).
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.min_p)]
    pub min_p: f32,
    /// Penalise tokens seen in the last 20 (1.1 is a gentle push; off by default).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Seed for sampling, for answers you can reproduce.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Decode loop shape: `pipelined` queues the next step before reading a
    /// token; `sync` reads each token before building the next step.
    #[serde(rename = "loop")]
    #[arg(long = "loop", value_enum, default_value_t = GenerationSettings::DEFAULT.loop_shape)]
    pub loop_shape: LoopShape,
    /// Prompt tokens per prefill pass. Smaller lowers peak memory on long
    /// prompts; larger is faster until memory runs short.
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.prefill_step_size)]
    pub prefill_step_size: usize,
    /// Keep at most this many positions in the KV cache (a rotating cache
    /// that keeps the first tokens): bounded memory for long conversations.
    #[arg(long)]
    pub max_kv_size: Option<usize>,
    /// Hold the KV cache in 4 or 8 bits per element once it has
    /// --quantized-kv-start positions: a long context in about a quarter
    /// (4) or a half (8) of the memory of a 16-bit cache, for a small loss
    /// of accuracy (mlx-lm's --kv-bits). Unset: the model's float dtype. A
    /// bounded cache (--max-kv-size) and sliding windows stay in floats.
    #[arg(long, value_parser = parse_kv_bits)]
    pub kv_bits: Option<u8>,
    /// Elements of a head's key or value sharing one scale and one bias in
    /// the quantized KV cache: 32, 64 or 128. Smaller groups follow the
    /// values more closely and take more memory (a scale and a bias per
    /// group).
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.kv_group_size)]
    pub kv_group_size: u32,
    /// Positions the KV cache holds in full precision before --kv-bits
    /// quantizes it (all of it at once, then each new position): short
    /// conversations keep full precision, long ones save memory. 0
    /// quantizes from the first prefill chunk on.
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.quantized_kv_start)]
    pub quantized_kv_start: usize,
    /// Most conversations decoded together in one batch (1: one at a time).
    /// Several clients of the local server, or the app beside them, share
    /// a step: each step reads the weights once for all of them.
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.max_batch)]
    pub max_batch: usize,
    /// The largest image file taken, in MiB (20 is what hosted APIs take
    /// per image); a larger one is refused before it is decoded.
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.max_image_mib)]
    pub max_image_mib: u32,
    /// The most pixels an image may have, in millions (32: a phone's
    /// 24-megapixel photo passes); read from the file's header, so a larger
    /// one is refused before it is decoded.
    #[arg(long, default_value_t = GenerationSettings::DEFAULT.max_image_megapixels)]
    pub max_image_megapixels: u32,
}

/// `--kv-bits`: 4 or 8, or a message that says so.
fn parse_kv_bits(text: &str) -> Result<u8, String> {
    match text.trim().parse::<u8>() {
        Ok(bits @ (4 | 8)) => Ok(bits),
        _ => Err(format!(
            "'{text}' is not a KV cache width; the KV cache can be held in 4 or 8 bits"
        )),
    }
}

/// The ranges each setting accepts (`GenerationSettings::check` applies
/// them; the app's form shows them).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct GenerationLimits {
    pub max_tokens: (usize, usize),
    pub temperature: (f32, f32),
    /// top p and min p are probabilities.
    pub probability: (f32, f32),
    pub top_k: (u32, u32),
    pub repetition_penalty: (f32, f32),
    pub prefill_step_size: (usize, usize),
    /// The smallest KV bound that still holds a prompt and its answer.
    pub max_kv_size: (usize, usize),
    pub max_batch: (usize, usize),
    /// Positions held in floats before the KV cache is quantized.
    pub quantized_kv_start: (usize, usize),
    /// An image's file in MiB: two at the most fill the server's 64 MiB
    /// body in base64.
    pub max_image_mib: (u32, u32),
    pub max_image_megapixels: (u32, u32),
}

impl GenerationSettings {
    pub const DEFAULT: GenerationSettings = GenerationSettings {
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
        kv_bits: None,
        kv_group_size: DEFAULT_KV_GROUP_SIZE,
        quantized_kv_start: DEFAULT_QUANTIZED_KV_START,
        max_batch: DEFAULT_MAX_BATCH,
        max_image_mib: 20,
        max_image_megapixels: 32,
    };

    pub const LIMITS: GenerationLimits = GenerationLimits {
        max_tokens: (1, 32_768),
        temperature: (0.0, 5.0),
        probability: (0.0, 1.0),
        top_k: (0, 100_000),
        repetition_penalty: (0.5, 2.0),
        prefill_step_size: (1, 65_536),
        // A bound beyond what a model reads is harmless: the cache only grows
        // as far as the conversation does.
        max_kv_size: (16, 1 << 32),
        max_batch: (1, 64),
        quantized_kv_start: (0, 1 << 32),
        max_image_mib: (1, 24),
        max_image_megapixels: (1, 200),
    };
}

impl Default for GenerationSettings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl GenerationSettings {
    /// Says what is wrong with settings a form, a flag or a request let
    /// through, naming the setting and its range.
    pub fn check(&self) -> Result<(), String> {
        let limits = Self::LIMITS;
        let within = |value: f64, (low, high): (f64, f64)| (low..=high).contains(&value);
        let pair = |(low, high): (f32, f32)| (f64::from(low), f64::from(high));
        let (low, high) = limits.max_tokens;
        if !(low..=high).contains(&self.max_tokens) {
            return Err(format!(
                "max tokens is {}; choose between {low} and {high}",
                self.max_tokens
            ));
        }
        if !within(f64::from(self.temperature), pair(limits.temperature)) {
            return Err(format!(
                "temperature must be between {} (greedy) and {}",
                limits.temperature.0, limits.temperature.1
            ));
        }
        if !within(f64::from(self.top_p), pair(limits.probability))
            || !within(f64::from(self.min_p), pair(limits.probability))
        {
            return Err("top p and min p are probabilities, between 0 and 1".into());
        }
        if self.top_k > limits.top_k.1 {
            return Err(format!("top k must be at most {}", limits.top_k.1));
        }
        if let Some(penalty) = self.repetition_penalty
            && !within(f64::from(penalty), pair(limits.repetition_penalty))
        {
            let (low, high) = limits.repetition_penalty;
            return Err(format!(
                "the repetition penalty must be between {low} and {high} (1 is none)"
            ));
        }
        let (low, high) = limits.prefill_step_size;
        if !(low..=high).contains(&self.prefill_step_size) {
            return Err(format!(
                "the prefill step size must be between {low} and {high} tokens"
            ));
        }
        let (low, high) = limits.max_batch;
        if !(low..=high).contains(&self.max_batch) {
            return Err(format!(
                "the largest batch must be between {low} (one conversation at a time) and {high}"
            ));
        }
        let (low, high) = limits.max_image_mib;
        if !(low..=high).contains(&self.max_image_mib) {
            return Err(format!(
                "the largest image must be between {low} and {high} MiB"
            ));
        }
        let (low, high) = limits.max_image_megapixels;
        if !(low..=high).contains(&self.max_image_megapixels) {
            return Err(format!(
                "the most pixels an image may have must be between {low} and {high} million"
            ));
        }
        if let Some(bound) = self.max_kv_size {
            let (low, high) = limits.max_kv_size;
            if !(low..=high).contains(&bound) {
                return Err(format!(
                    "the KV cache bound must be between {low} and {high} positions"
                ));
            }
        }
        if let Some(bits) = self.kv_bits
            && !matches!(bits, 4 | 8)
        {
            return Err(format!(
                "kv bits is {bits}; the KV cache can be held in 4 or 8 bits (or unset, for the \
                 model's float dtype)"
            ));
        }
        if !matches!(self.kv_group_size, 32 | 64 | 128) {
            return Err(format!(
                "the KV group size is {}; choose 32, 64 or 128 elements",
                self.kv_group_size
            ));
        }
        let (low, high) = limits.quantized_kv_start;
        if !(low..=high).contains(&self.quantized_kv_start) {
            return Err(format!(
                "the quantized KV start must be between {low} and {high} positions"
            ));
        }
        Ok(())
    }

    /// The engine request for `prompt` with these settings.
    pub fn request(&self, model_dir: &Path, prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
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
            kv_bits: self.kv_bits,
            kv_group_size: self.kv_group_size,
            quantized_kv_start: self.quantized_kv_start,
            loop_shape: self.loop_shape,
            max_batch: self.max_batch,
            image_limits: self.image_limits(),
            ..GenerateRequest::new(model_dir, prompt)
        }
    }

    /// How large an image these settings take.
    pub fn image_limits(&self) -> crate::vision::ImageLimits {
        crate::vision::ImageLimits {
            max_bytes: u64::from(self.max_image_mib) << 20,
            max_pixels: u64::from(self.max_image_megapixels) * 1_000_000,
        }
    }

    /// The engine request for one turn of a conversation.
    pub fn turn_request(
        &self,
        model_dir: &Path,
        conversation_id: &str,
        prompt: Prompt,
    ) -> GenerateRequest {
        GenerateRequest {
            conversation: Some(conversation_id.to_owned()),
            ..self.request(model_dir, prompt)
        }
    }
}

/// What the app's chat offers for a model, read from its folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ChatFeatures {
    /// The chat template reads `enable_thinking` (Qwen3 and its kin): the
    /// chat shows a Think switch, and each turn tells the template whether
    /// the model should reason before it answers.
    pub thinking_switch: bool,
    /// The model has a vision tower: the chat takes images (dropped,
    /// pasted or picked); without one it says so before sending.
    #[serde(default)]
    pub sees_images: bool,
}

impl ChatFeatures {
    /// Reads the folder's chat template. A folder without one offers
    /// nothing, and so does one whose template is unreadable: the first
    /// turn names that error.
    pub fn of_model_dir(dir: &Path) -> Self {
        let template = ChatTemplate::from_model_dir(dir).ok().flatten();
        Self {
            thinking_switch: template.is_some_and(|t| t.takes_enable_thinking()),
            sees_images: crate::engine::vision::folder_sees_images(dir),
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
    /// More of the answer, and more of the reasoning a thinking model
    /// writes before it (shown apart, folded away); either may be empty.
    Delta { text: String, reasoning: String },
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
            RunEvent::Delta {
                text, reasoning, ..
            } if !text.is_empty() || !reasoning.is_empty() => Some(Self::Delta {
                text: text.clone(),
                reasoning: reasoning.clone(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_limits_default_to_the_engine_s_and_are_checked() {
        let settings = GenerationSettings::default();
        assert_eq!(
            settings.image_limits(),
            crate::vision::ImageLimits::default()
        );
        let big = GenerationSettings {
            max_image_mib: 500,
            ..settings.clone()
        };
        assert!(big.check().unwrap_err().contains("MiB"));
        let wide = GenerationSettings {
            max_image_megapixels: 0,
            ..settings
        };
        assert!(wide.check().unwrap_err().contains("million"));
    }

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
    fn kv_cache_quantization_is_checked_and_reaches_the_request() {
        let defaults = GenerationSettings::default();
        assert_eq!(
            (
                defaults.kv_bits,
                defaults.kv_group_size,
                defaults.quantized_kv_start
            ),
            (None, 64, 5000),
            "mlx-lm's defaults"
        );
        let four = GenerationSettings {
            kv_bits: Some(4),
            quantized_kv_start: 0,
            ..defaults.clone()
        };
        assert!(four.check().is_ok());
        let request = four.request(Path::new("m"), Prompt::user("hi"));
        let q = request.kv_quantization().unwrap();
        assert_eq!((q.bits, q.group_size, q.start), (4, 64, 0));
        assert_eq!(
            defaults
                .request(Path::new("m"), Prompt::user("hi"))
                .kv_quantization(),
            None
        );
        let three = GenerationSettings {
            kv_bits: Some(3),
            ..defaults.clone()
        };
        assert!(three.check().unwrap_err().contains("4 or 8 bits"));
        let odd = GenerationSettings {
            kv_group_size: 48,
            ..defaults
        };
        assert!(odd.check().unwrap_err().contains("32, 64 or 128"));
        assert!(parse_kv_bits("8").is_ok());
        assert!(parse_kv_bits("16").unwrap_err().contains("4 or 8 bits"));
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
    fn the_answer_and_the_reasoning_are_streamed_apart() {
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
            serde_json::json!({"event": "delta", "text": "hi", "reasoning": ""})
        );
        let thinking = RunEvent::Delta {
            text: String::new(),
            reasoning: "Let me see".into(),
            tool_calls: Vec::new(),
            token_ids: vec![2],
        };
        assert_eq!(
            ChatEvent::from_run_event(&thinking),
            Some(ChatEvent::Delta {
                text: String::new(),
                reasoning: "Let me see".into()
            })
        );
    }

    #[test]
    fn the_think_switch_is_offered_where_the_template_reads_enable_thinking() {
        let folder = |template: Option<&str>| {
            let dir = tempfile::tempdir().unwrap();
            if let Some(template) = template {
                let config = serde_json::json!({"chat_template": template});
                std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string())
                    .unwrap();
            }
            dir
        };
        let qwen3_like = folder(Some(
            "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}",
        ));
        assert!(ChatFeatures::of_model_dir(qwen3_like.path()).thinking_switch);
        let plain = folder(Some("{{ messages[0]['content'] }}"));
        assert!(!ChatFeatures::of_model_dir(plain.path()).thinking_switch);
        let none = folder(None);
        assert_eq!(
            ChatFeatures::of_model_dir(none.path()),
            ChatFeatures::default()
        );
        let broken = folder(Some("{% if enable_thinking %}"));
        assert!(!ChatFeatures::of_model_dir(broken.path()).thinking_switch);
    }

    #[test]
    fn the_think_switch_becomes_the_templates_option() {
        let Prompt::Chat {
            template_options, ..
        } = Prompt::user("hi").with_thinking(false)
        else {
            panic!("a chat prompt");
        };
        assert_eq!(
            template_options["enable_thinking"],
            serde_json::json!(false)
        );
        let raw = Prompt::Raw { text: "hi".into() };
        assert_eq!(raw.clone().with_thinking(true), raw);
    }
}
