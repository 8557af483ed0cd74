//! The one flat record of a run: every timing, count, memory figure, setting
//! and the provenance, with units in the field names. The store keeps it, the
//! report writers print it, and nothing in it needs the engine's types.

use serde::{Deserialize, Serialize};

use crate::run_kinds::{LoadKind, LoopShape, PrefixSource, RunKind, StopReason};

/// The protocol an endpoint run spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub enum EndpointDialect {
    /// OpenAI's `/v1/completions` (or `/v1/chat/completions`), server-sent events.
    #[serde(rename = "openai")]
    OpenAi,
    /// Ollama's `/api/generate`, one JSON object per line.
    #[serde(rename = "ollama")]
    Ollama,
}

impl std::fmt::Display for EndpointDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EndpointDialect::OpenAi => "openai",
            EndpointDialect::Ollama => "ollama",
        })
    }
}

/// Now, as the record and the history write times: RFC 3339 in UTC with
/// milliseconds.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Bumped when a field is renamed or removed (adding one does not).
pub const RECORD_SCHEMA_VERSION: u32 = 1;

/// One run: a chat turn, a CLI run, or one repetition of a benchmark.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RunRecord {
    /// Unique; time-ordered ("r-<unix ms>-<random>").
    pub run_id: String,
    /// RFC 3339 UTC, when the request was made.
    pub created_at: String,
    pub kind: RunKind,
    /// Groups the runs of one `ondo bench` invocation.
    pub bench_id: Option<String>,
    /// The test's shape, llama-bench style: "pp128+tg128".
    pub test: Option<String>,
    /// 0-based repetition within its test.
    pub repetition: Option<u32>,
    /// A warm-up repetition: recorded, excluded from statistics.
    pub warmup: bool,
    pub conversation_id: Option<String>,
    /// The program that asked, as its `User-Agent` header names it (runs of
    /// kind `api`).
    pub user_agent: Option<String>,

    // The model.
    /// Repo id (`org/name`) or folder.
    pub model_id: String,
    pub model_path: String,
    pub model_revision: Option<String>,
    pub model_type: String,
    pub quantization: String,
    pub parameters: Option<u64>,
    pub weights_bytes: u64,

    // Timings (docs/ARCHITECTURE.md, "What the timings mean").
    pub download_ms: f64,
    pub load_ms: f64,
    pub ttft_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// The part of `decode_ms` spent on reasoning tokens (0 when the model
    /// did not think).
    pub reasoning_ms: f64,
    /// Process start (or request, when warm) to first token; fresh-process runs.
    pub cold_start_ms: Option<f64>,
    pub prefill_tps: f64,
    pub decode_tps: f64,
    /// mlx-lm's conventions, to compare one to one with `mlx_lm.generate`.
    pub prompt_tps: f64,
    pub generation_tps: f64,

    // Counts.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    /// Generated tokens that were reasoning (`<think>`, gpt-oss's analysis
    /// channel), markers included; part of `generated_tokens`.
    pub reasoning_tokens: u64,

    // Memory.
    pub mlx_peak_bytes: u64,
    pub mlx_active_bytes: u64,
    pub mlx_cache_bytes: u64,
    pub kv_cache_bytes: u64,
    /// This process's physical footprint at the end of the run.
    pub footprint_bytes: u64,
    /// "normal", "warning", "critical" or "unknown".
    pub pressure_start: String,
    pub pressure_max: String,
    pub pressure_end: String,
    /// Swap used at the end minus at the start (negative: swap shrank).
    pub swap_delta_bytes: i64,

    // Decode against the machine's memory bandwidth.
    /// Bytes read per decoded token: the weights plus the KV cache.
    pub decode_bytes_per_token: Option<u64>,
    /// This machine's measured memory bandwidth, GB/s (10^9 bytes).
    pub memory_bandwidth_gbps: Option<f64>,
    /// decode_tps x bytes per token as a percentage of that bandwidth.
    pub decode_roofline_pct: Option<f64>,

    // Run shape.
    pub load_kind: LoadKind,
    /// The run paid for a process start too (bench_cold).
    pub fresh_process: bool,
    /// Where the cached prompt tokens came from: none, the conversation in
    /// memory, or a prompt cache on disk (the third state beside cold and
    /// warm).
    #[serde(default)]
    pub prefix_source: PrefixSource,
    /// Bytes read from a prompt cache on disk, and the time reading took
    /// (part of the time to first token); `None` unless read from disk.
    pub prefix_read_bytes: Option<u64>,
    pub prefix_read_ms: Option<f64>,
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    pub prefill_step_size: u64,
    pub max_kv_size: Option<u64>,
    /// Bits per element of a quantized KV cache (4 or 8); `None`: float.
    #[serde(default)]
    pub kv_bits: Option<u64>,
    /// Images the prompt showed (0 for text).
    #[serde(default)]
    pub images: u64,
    /// Prompt tokens the images filled, and what encoding them took
    /// (inside the time to first token); `None` without images.
    #[serde(default)]
    pub image_tokens: Option<u64>,
    #[serde(default)]
    pub image_encode_ms: Option<f64>,
    pub max_tokens: u64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: u64,
    pub min_p: f64,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop_reason: StopReason,
    /// Set when the run failed; the timings then cover what happened.
    pub error: Option<String>,

    // An endpoint run (kind `endpoint`): the server and what it said of
    // itself. Ondo's own fields above are measured at the client: TTFT from
    // sending the request to the first text arriving, decode over the
    // arrivals after it; `prompt_tokens` is Ondo's count of the text sent.
    /// What the server calls itself, or the name given to it.
    pub server_name: Option<String>,
    /// The route asked, without credentials: `http://127.0.0.1:8080/v1/completions`.
    pub endpoint_url: Option<String>,
    pub endpoint_dialect: Option<EndpointDialect>,
    /// The prompt's tokens as the server counted them (OpenAI `usage`,
    /// Ollama `prompt_eval_count`).
    pub server_prompt_tokens: Option<u64>,
    /// The server's own durations, where it reports them (Ollama's
    /// `load_duration`, `prompt_eval_duration`, `eval_duration`).
    pub server_load_ms: Option<f64>,
    pub server_prefill_ms: Option<f64>,
    pub server_decode_ms: Option<f64>,
    /// The server's own rates: its prompt tokens over its prefill time, its
    /// generated tokens over its decode time (Ollama's convention).
    pub server_prefill_tps: Option<f64>,
    pub server_decode_tps: Option<f64>,

    // Sharing the engine (a run in Ondo's batch; `None` for a run that had
    // the engine to itself, and for an endpoint run).
    /// Fewest, median and most sequences in a forward pass it was in.
    pub batch_min_rows: Option<u64>,
    pub batch_median_rows: Option<u64>,
    pub batch_max_rows: Option<u64>,
    /// From the engine receiving the request to the batch taking it in.
    pub admission_wait_ms: Option<f64>,
    /// What it waited for: "memory", "batch_full", "another_model",
    /// "kv_settings" (a KV cache quantized otherwise than the batch's) or
    /// "batch_to_drain" (the batch finishing before a run alone).
    pub waited_for: Option<String>,
    /// Its prompt's prefill chunks, and those that ran between the other
    /// sequences' decode steps.
    pub prefill_chunks: Option<u64>,
    pub interleaved_chunks: Option<u64>,

    // Output held to a grammar (`None` for free text).
    /// "json_object" or "json_schema".
    pub constraint: Option<String>,
    /// Host time working out which tokens the grammar allows, per token.
    pub mask_ms_per_token: Option<f64>,

    // A concurrency benchmark (`ondo bench --concurrency`): the streams sent
    // at once in this run's round, and the tokens all of them generated over
    // the round's wall time (first request sent to last token arriving), the
    // same on every stream's record of the round.
    pub concurrency: Option<u64>,
    pub aggregate_tps: Option<f64>,

    // A model split over several ranks (`None` for a model one process
    // held): how, over what, among whom, and what a decode step moved
    // between them.
    /// "pipeline" (a range of layers each) or "tensor" (a share of every
    /// layer's heads).
    pub split: Option<String>,
    pub split_ranks: Option<u64>,
    /// MLX's distributed backend: "ring", "jaccl" or "nccl".
    pub split_backend: Option<String>,
    /// Each rank's host, in rank order, comma-separated.
    pub split_hosts: Option<String>,
    /// The most bytes any rank sends in one decode step.
    pub split_step_bytes: Option<u64>,
    /// One decode step's time on the links, estimated from a decode step's
    /// message timed when the ranks joined (part of each step's time).
    pub split_step_link_ms: Option<f64>,
    /// The most bytes any rank sends over this run's prefill (every chunk
    /// of the prompt and the first token's step).
    pub split_prefill_bytes: Option<u64>,
    /// That prefill's time on the links, estimated from two message sizes
    /// timed when the ranks joined (part of the time to first token).
    pub split_prefill_link_ms: Option<f64>,
    /// Each rank's compute time for one decode step of its share, timed
    /// alone when it loaded (ms, in rank order, comma-separated): what a
    /// step costs apart from the links and the waits.
    pub split_rank_step_ms: Option<String>,
    /// Prompt tokens a second each rank computes through its share, timed
    /// alone when it loaded (in rank order, comma-separated).
    pub split_rank_prefill_tps: Option<String>,

    /// Where and with what the run happened; its fields are the record's
    /// own (columns, report fields), not a nested object.
    #[serde(flatten)]
    pub provenance: Provenance,
}

/// Where and with what a run happened: Ondo's build, the MLX it ran on and
/// the machine. The same for every run of a process.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Provenance {
    pub app_version: String,
    pub app_commit: String,
    /// "debug" or "release".
    pub build_profile: String,
    pub mlx_version: String,
    pub mlx_rs_version: String,
    /// "metal", "cpu" or "cuda".
    pub backend: String,
    pub os: String,
    pub cpu: String,
    pub ram_bytes: u64,
}

/// One point of a run's memory timeline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct MemorySample {
    /// Since the run's request, in milliseconds.
    pub t_ms: f64,
    /// "normal", "warning", "critical" or "unknown".
    pub level: String,
    pub used_bytes: u64,
    pub app_bytes: u64,
    pub wired_bytes: u64,
    pub compressed_bytes: u64,
    pub swap_used_bytes: u64,
    pub footprint_bytes: u64,
}

/// Something the session pool did, and why.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PoolEvent {
    /// RFC 3339 UTC.
    pub at: String,
    /// "load", "hit", "evict", "unload", "trim_caches", "clear_mlx_cache".
    pub action: String,
    pub model_id: String,
    /// "first use", "keep-alive expired", "memory budget", "pressure warning",
    /// "pressure critical", "user", ...
    pub reason: String,
    /// Bytes the action freed or took (weights, caches), when known.
    pub bytes: Option<u64>,
}
