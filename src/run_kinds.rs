//! How a run is classified: what it was for, whether it loaded its model,
//! which decode loop it ran and why it stopped. The engine sets the last
//! three and the record keeps all four, so they live below both: the store
//! and the report read them without reaching into the engine.

use serde::{Deserialize, Serialize};

/// What a run was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// `ondo run`: one prompt.
    #[default]
    Run,
    /// A turn of a conversation (the app's chat, `ondo chat`).
    Chat,
    /// A repetition of a benchmark (`ondo bench`, the Runs window's
    /// Benchmark, Ondo's side of `ondo bench --peer`).
    Bench,
    /// A benchmark's cold start in a fresh process.
    BenchCold,
    /// `ondo demo`: one cold and one warm generation.
    Demo,
    /// A request to another program's server (`ondo bench --endpoint`),
    /// timed by Ondo as its client.
    Endpoint,
    /// A request to the local server (`ondo serve`, the app's Local
    /// server), from another program.
    Api,
    /// Embeddings (`ondo embed`, `/v1/embeddings`, `/api/embed`): one
    /// forward pass over the inputs, no decode.
    Embed,
    /// A kind written by a newer Ondo sharing this history.
    #[serde(other)]
    Other,
}

impl RunKind {
    /// Every kind this Ondo writes (for filters and help texts).
    pub const ALL: [RunKind; 8] = [
        RunKind::Run,
        RunKind::Chat,
        RunKind::Bench,
        RunKind::BenchCold,
        RunKind::Demo,
        RunKind::Endpoint,
        RunKind::Api,
        RunKind::Embed,
    ];

    /// The name the history and the reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Run => "run",
            RunKind::Chat => "chat",
            RunKind::Bench => "bench",
            RunKind::BenchCold => "bench_cold",
            RunKind::Demo => "demo",
            RunKind::Endpoint => "endpoint",
            RunKind::Api => "api",
            RunKind::Embed => "embed",
            RunKind::Other => "other",
        }
    }
}

impl std::fmt::Display for RunKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        RunKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = RunKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown run kind '{text}'; one of {}", names.join(", "))
            })
    }
}

/// Whether the model had to be loaded for this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum LoadKind {
    /// The model was loaded by this request (`load_ms` > 0).
    #[default]
    Cold,
    /// The model was already resident.
    Warm,
}

impl std::fmt::Display for LoadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LoadKind::Cold => "cold",
            LoadKind::Warm => "warm",
        })
    }
}

/// Where a run's cached prompt tokens came from: the third state beside
/// cold and warm (a warm model may still prefill a long prompt again, or
/// read it back from the disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum PrefixSource {
    /// Nothing was reused: the whole prompt was prefilled.
    #[default]
    None,
    /// The conversation's KV cache in memory.
    Memory,
    /// A prompt cache saved on disk, read back.
    Disk,
}

impl PrefixSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixSource::None => "none",
            PrefixSource::Memory => "memory",
            PrefixSource::Disk => "disk",
        }
    }

    /// The value `as_str` gave; anything else (a newer Ondo's word) reads
    /// as none.
    pub fn parse(text: &str) -> Self {
        match text {
            "memory" => PrefixSource::Memory,
            "disk" => PrefixSource::Disk,
            _ => PrefixSource::None,
        }
    }
}

impl std::fmt::Display for PrefixSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// The text reached one of the request's stop strings.
    StopString,
    /// `max_tokens` were generated.
    #[default]
    MaxTokens,
    /// The caller cancelled.
    Cancelled,
    /// The model ended its turn (EOS) right after calling tools: it waits
    /// for their results.
    ToolCalls,
    /// A reason a newer Ondo wrote into the shared history; this one never
    /// stops for it.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Eos => "eos",
            StopReason::StopString => "stop_string",
            StopReason::MaxTokens => "max_tokens",
            StopReason::Cancelled => "cancelled",
            StopReason::ToolCalls => "tool_calls",
            StopReason::Other => "other",
        })
    }
}

/// How the decode loop waits for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "lowercase")]
pub enum LoopShape {
    /// One sync per token: evaluate, read, then build the next step.
    Sync,
    /// Queue step n+1 before reading token n (mlx-lm's loop).
    #[default]
    Pipelined,
}

impl std::fmt::Display for LoopShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LoopShape::Sync => "sync",
            LoopShape::Pipelined => "pipelined",
        })
    }
}
