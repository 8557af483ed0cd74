//! The plain data that crosses into and out of the engine thread: what to
//! generate, the events that come back, the cancellation token, the errors.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::LoadError;
use super::anatomy::StepAnatomy;
use super::cache::KvQuantization;
use super::chat_template::{ChatMessage, ChatTemplateError, ENABLE_THINKING};
use super::constrain::OutputConstraint;
use super::generate::DEFAULT_PREFILL_STEP_SIZE;
use super::reply::ToolCall;
use super::sample::{SamplerError, SamplerSettings};
use super::stats::RunStats;
use crate::ErrorKind;
use crate::run_kinds::{LoadKind, LoopShape};

/// What the model is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Prompt {
    /// A conversation rendered with the model's chat template (plain text
    /// when the model has none), ending with a generation prompt.
    Chat {
        system_prompt: Option<String>,
        messages: Vec<ChatMessage>,
        /// Tools the model may call: OpenAI-style function schemas
        /// (`{"type": "function", "function": {"name", "description",
        /// "parameters"}}`), given to the template as `tools`. When present,
        /// the reply's tool calls are read out of its text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "specta", specta(optional))]
        tools: Option<Vec<serde_json::Value>>,
        /// Further template variables, such as Qwen3's `enable_thinking`
        /// (what OpenAI-style clients send as `chat_template_kwargs`).
        #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
        #[cfg_attr(feature = "specta", specta(optional))]
        template_options: serde_json::Map<String, serde_json::Value>,
    },
    /// Text tokenized as it is (with the tokenizer's BOS), no template.
    Raw { text: String },
    /// Token ids as they are: benchmarks use these for exact lengths.
    Tokens { ids: Vec<u32> },
}

impl Prompt {
    /// One user message.
    pub fn user(text: impl Into<String>) -> Self {
        Prompt::chat(None, vec![ChatMessage::user(text)])
    }

    /// A conversation without tools or template options.
    pub fn chat(system_prompt: Option<String>, messages: Vec<ChatMessage>) -> Self {
        Prompt::Chat {
            system_prompt,
            messages,
            tools: None,
            template_options: serde_json::Map::new(),
        }
    }

    /// Asks a thinking model to reason first or not (the chat template's
    /// `enable_thinking`, which templates that do not read it ignore); only
    /// a chat has a template to ask.
    pub fn with_thinking(mut self, think: bool) -> Self {
        if let Prompt::Chat {
            template_options, ..
        } = &mut self
        {
            template_options.insert(ENABLE_THINKING.into(), serde_json::Value::Bool(think));
        }
        self
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct GenerateRequest {
    /// The model folder (config.json, safetensors, tokenizer).
    pub model_dir: PathBuf,
    /// Requests with the same conversation id share one KV cache, so a
    /// follow-up only prefills the tokens the cache does not hold.
    pub conversation: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub sampler: SamplerSettings,
    pub prefill_step_size: usize,
    /// Hold at most this many positions (a rotating cache that keeps the
    /// first tokens); `None` lets the cache grow.
    pub max_kv_size: Option<usize>,
    /// Hold the KV cache in this many bits per element (4 or 8) once it
    /// has `quantized_kv_start` positions; `None` keeps it in the model's
    /// float dtype. A bounded (`max_kv_size`) cache stays in floats.
    #[serde(default)]
    pub kv_bits: Option<u8>,
    /// Elements of one head's key or value sharing a scale and a bias in
    /// the quantized cache (32, 64 or 128).
    #[serde(default = "default_kv_group_size")]
    pub kv_group_size: u32,
    /// Positions the cache holds in floats before it is quantized.
    #[serde(default = "default_quantized_kv_start")]
    pub quantized_kv_start: usize,
    pub loop_shape: LoopShape,
    /// Generation stops when the text reaches one of these (not included).
    pub stop_strings: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// Send a delta for every token, instead of merging them per 16 ms
    /// frame: its text, or nothing while the text is held back (a character
    /// or a word spelled over several tokens, a possible marker). The local
    /// server streams one chunk per token, as OpenAI and Ollama clients
    /// expect, and a client that times the stream sees each token arrive.
    #[serde(default)]
    pub delta_every_token: bool,
    /// Count the nodes of one decode step's graph (the benchmark's anatomy;
    /// MLX prints the graph once, which a chat need not pay for).
    #[serde(default)]
    pub count_graph_nodes: bool,
    /// The most sequences this request shares a batch with, itself
    /// included; 1 runs it with the engine to itself (the benchmarks' way).
    #[serde(default = "one")]
    pub max_batch: usize,
    /// Weights and KV caches may take at most this many bytes when this
    /// request joins a batch (the pool's memory budget); `None`: only the
    /// system's free memory bounds them.
    #[serde(default)]
    pub memory_budget_bytes: Option<u64>,
    /// Hold the reply to a grammar (JSON, a JSON schema); `None`: free text.
    #[serde(default)]
    pub constraint: Option<OutputConstraint>,
    /// Read a saved prompt cache from the disk where one holds more of the
    /// prompt than memory does, and save this conversation's cache there
    /// when it leaves memory. Benchmarks that time a prefill turn it off.
    #[serde(default = "yes")]
    pub disk_cache: bool,
    /// How large an image in the prompt may be (bytes and pixels, checked
    /// before it is decoded).
    #[serde(default)]
    pub image_limits: crate::vision::ImageLimits,
    /// Start from this prompt cache file (mlx-lm's layout, as
    /// `mlx_lm.cache_prompt` writes it) and read the prompt as what follows
    /// it, the way `mlx_lm.generate --prompt-cache-file` does: a chat is
    /// rendered and cut where its last message's text starts.
    #[serde(default)]
    pub prompt_cache_file: Option<PathBuf>,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// mlx-lm's `kv_group_size` default.
pub const DEFAULT_KV_GROUP_SIZE: u32 = 64;
/// mlx-lm's `quantized_kv_start` default (`DEFAULT_QUANTIZED_KV_START`).
pub const DEFAULT_QUANTIZED_KV_START: usize = 5000;

fn default_kv_group_size() -> u32 {
    DEFAULT_KV_GROUP_SIZE
}

fn default_quantized_kv_start() -> usize {
    DEFAULT_QUANTIZED_KV_START
}

impl GenerateRequest {
    /// How the request's KV cache is quantized, `None` when it is not.
    pub fn kv_quantization(&self) -> Option<KvQuantization> {
        self.kv_bits.map(|bits| KvQuantization {
            bits: i32::from(bits),
            group_size: i32::try_from(self.kv_group_size).unwrap_or(i32::MAX),
            start: i32::try_from(self.quantized_kv_start).unwrap_or(i32::MAX),
        })
    }

    /// Holds the reply to `constraint`. A model that thinks first is asked
    /// not to (unless the request asked for thinking itself): the grammar
    /// holds every token of the reply, reasoning included, and JSON has no
    /// room for it.
    pub fn hold_to(mut self, constraint: Option<OutputConstraint>) -> Self {
        if constraint.is_some()
            && let Prompt::Chat {
                template_options, ..
            } = &mut self.prompt
        {
            template_options
                .entry(ENABLE_THINKING)
                .or_insert(serde_json::Value::Bool(false));
        }
        self.constraint = constraint;
        self
    }

    /// Defaults like mlx-lm's: greedy, 256 tokens, prefill step 2048.
    pub fn new(model_dir: impl Into<PathBuf>, prompt: Prompt) -> Self {
        Self {
            model_dir: model_dir.into(),
            conversation: None,
            prompt,
            max_tokens: 256,
            sampler: SamplerSettings::default(),
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
            max_kv_size: None,
            kv_bits: None,
            kv_group_size: DEFAULT_KV_GROUP_SIZE,
            quantized_kv_start: DEFAULT_QUANTIZED_KV_START,
            loop_shape: LoopShape::default(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            delta_every_token: false,
            count_graph_nodes: false,
            max_batch: 1,
            memory_budget_bytes: None,
            constraint: None,
            disk_cache: true,
            prompt_cache_file: None,
            image_limits: crate::vision::ImageLimits::default(),
        }
    }
}

/// What a request streams back, in order: `Started`, any number of
/// `Delta`s, then exactly one of `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum RunEvent {
    /// The model is resident and the prompt tokenized; prefill begins.
    Started {
        load_kind: LoadKind,
        load_ms: f64,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// What the newest tokens said, split (see `engine::reply`): answer
    /// text, reasoning and complete tool calls, any of them empty (all are
    /// empty while a character or a marker is incomplete), and the token ids
    /// it came from. Within one delta the reasoning came first, then the
    /// text, then the calls.
    Delta {
        /// More of the answer.
        text: String,
        /// More of the reasoning.
        #[serde(default)]
        reasoning: String,
        /// Tool calls completed by these tokens.
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
        token_ids: Vec<u32>,
    },
    /// The whole reply, split, and its statistics.
    Finished {
        /// The answer: what the model said minus reasoning and tool calls.
        text: String,
        #[serde(default)]
        reasoning: String,
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
        /// Everything the model said, as decoded, before the split.
        #[serde(default)]
        raw_text: String,
        token_ids: Vec<u32>,
        stats: Box<RunStats>,
        /// Where the decode steps spent the host's time (benchmarks).
        #[serde(default)]
        anatomy: StepAnatomy,
    },
    Failed {
        error: RunError,
    },
}

/// Where a request's events go; called on the engine thread, so it should
/// hand the event on and return quickly.
pub type EventSink = Box<dyn FnMut(RunEvent) + Send>;

/// Asks a running request to stop; checked between any two steps (prefill
/// chunks and decode tokens). Cloning shares the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a request failed. The engine thread keeps serving afterwards.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case", tag = "kind", content = "message")]
pub enum RunError {
    #[error("{0}")]
    Load(String),
    #[error("the prompt is empty; type something to send")]
    EmptyPrompt,
    #[error("{0}")]
    PromptTooLong(String),
    #[error("{0}")]
    ChatTemplate(String),
    #[error("tokenizing failed: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    InvalidSettings(String),
    #[error(
        "MLX failed while generating: {0}; if memory ran out, try a smaller model or a shorter context"
    )]
    Mlx(String),
    #[error("the engine stopped unexpectedly ({0}); the next request starts it fresh")]
    Internal(String),
    #[error("the engine thread is gone; restart Ondo")]
    EngineStopped,
    /// The model cannot be divided over the ranks this process joined.
    #[error("{0}")]
    Distributed(String),
}

impl RunError {
    /// A short name for the UI to branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RunError::Load(_) => ErrorKind::Load,
            RunError::EmptyPrompt => ErrorKind::EmptyPrompt,
            RunError::PromptTooLong(_) => ErrorKind::PromptTooLong,
            RunError::ChatTemplate(_) => ErrorKind::ChatTemplate,
            RunError::Tokenizer(_) => ErrorKind::Tokenizer,
            RunError::InvalidSettings(_) => ErrorKind::InvalidSettings,
            RunError::Mlx(_) => ErrorKind::Mlx,
            RunError::Internal(_) => ErrorKind::Internal,
            RunError::EngineStopped => ErrorKind::EngineStopped,
            RunError::Distributed(_) => ErrorKind::Distributed,
        }
    }
}

impl From<LoadError> for RunError {
    fn from(e: LoadError) -> Self {
        match e {
            // Nothing is wrong with the folder: the ranks cannot divide it.
            LoadError::Split(_) => RunError::Distributed(e.to_string()),
            e => RunError::Load(e.to_string()),
        }
    }
}

impl From<ChatTemplateError> for RunError {
    fn from(e: ChatTemplateError) -> Self {
        RunError::ChatTemplate(e.to_string())
    }
}

impl From<SamplerError> for RunError {
    fn from(e: SamplerError) -> Self {
        RunError::InvalidSettings(e.to_string())
    }
}

impl From<mlx_rs::error::Exception> for RunError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        RunError::Mlx(super::mlx_failure(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind each variant has always had; it is also the serde tag the
    /// history and the UI read. Exhaustive: a new variant does not compile
    /// until it has a line here; give it an example in `one_of_each` too.
    fn kind_name(error: &RunError) -> &'static str {
        match error {
            RunError::Load(_) => "load",
            RunError::EmptyPrompt => "empty_prompt",
            RunError::PromptTooLong(_) => "prompt_too_long",
            RunError::ChatTemplate(_) => "chat_template",
            RunError::Tokenizer(_) => "tokenizer",
            RunError::InvalidSettings(_) => "invalid_settings",
            RunError::Mlx(_) => "mlx",
            RunError::Internal(_) => "internal",
            RunError::EngineStopped => "engine_stopped",
            RunError::Distributed(_) => "distributed",
        }
    }

    fn one_of_each() -> Vec<RunError> {
        vec![
            RunError::Load("/models/tiny has no config.json".into()),
            RunError::EmptyPrompt,
            RunError::PromptTooLong("the prompt has 9000 tokens".into()),
            RunError::ChatTemplate("the chat template rejected the conversation".into()),
            RunError::Tokenizer("unknown token".into()),
            RunError::InvalidSettings("top-p 2 is outside [0, 1]".into()),
            RunError::Mlx("[eval] out of memory".into()),
            RunError::Internal("a loaded model vanished".into()),
            RunError::EngineStopped,
            RunError::Distributed(
                "the model cannot be split across the ranks: its 4 attention heads do not divide \
                 over 3 ranks"
                    .into(),
            ),
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        crate::error_kind::check_layer(&one_of_each(), |e| e.kind(), kind_name);
        // The serialized tag (in RunEvent::Failed) is the same name.
        for error in one_of_each() {
            let json = serde_json::to_value(&error).unwrap();
            assert_eq!(json["kind"], kind_name(&error), "{json}");
        }
    }
}
