//! What one generation cost, with the run record's field names (what each
//! clock measures: docs/ARCHITECTURE.md, "What the timings mean"): the
//! record the engine hands out with `RunEvent::Finished`.

use serde::{Deserialize, Serialize};

use super::constrain::ConstraintStats;
use super::sample::SamplerSettings;
use crate::run_kinds::{LoadKind, LoopShape, PrefixSource, StopReason};

/// Timings, counts and memory of one run. Durations in milliseconds, rates
/// in tokens per second, memory in bytes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RunStats {
    /// The model folder that ran.
    pub model_dir: String,
    pub model_type: String,
    /// "4bit", "8bit" or the float dtype of the weights ("float32", ...).
    pub quantization: String,
    pub weights_bytes: u64,
    pub load_kind: LoadKind,
    /// Start of load to weights evaluated and resident; 0 when warm.
    pub load_ms: f64,
    /// Request accepted (after load) to first token id available.
    pub ttft_ms: f64,
    /// First prompt chunk submitted to logits of the last prompt token.
    pub prefill_ms: f64,
    /// First token available to last token available.
    pub decode_ms: f64,
    /// Tokens of the whole prompt, `cached_tokens + prefill_tokens`.
    pub prompt_tokens: usize,
    /// Prompt tokens the conversation's cache already held.
    pub cached_tokens: usize,
    /// Where those came from: none, the conversation in memory, or a
    /// prompt cache on disk.
    #[serde(default)]
    pub prefix_source: PrefixSource,
    /// Bytes read from the disk for them (0 unless from disk).
    #[serde(default)]
    pub prefix_read_bytes: u64,
    /// Time reading them took: part of the time to first token, before
    /// the prefill.
    #[serde(default)]
    pub prefix_read_ms: f64,
    /// Prompt tokens run through the model by this request.
    pub prefill_tokens: usize,
    pub generated_tokens: usize,
    /// Generated tokens that were reasoning (a `<think>` block, gpt-oss's
    /// analysis channel), markers included; counted in `generated_tokens`
    /// and in every rate too.
    pub reasoning_tokens: usize,
    /// The decode time of the reasoning tokens: each one's time since the
    /// token before it (what "thought for" means in the app).
    pub reasoning_ms: f64,
    /// `prefill_tokens / prefill_s`.
    pub prefill_tps: f64,
    /// `(generated_tokens - 1) / decode_s`: the first token belongs to prefill.
    pub decode_tps: f64,
    /// mlx-lm's convention: tokens given to the model / time to first token.
    pub prompt_tps: f64,
    /// mlx-lm's convention: generated tokens / time since the first token.
    pub generation_tps: f64,
    /// MLX's peak allocation during this request (reset at its start).
    pub mlx_peak_bytes: u64,
    /// MLX allocations in use when the run ended (weights, cache, buffers).
    pub mlx_active_bytes: u64,
    /// Freed buffers MLX keeps for reuse when the run ended.
    pub mlx_cache_bytes: u64,
    /// Bytes of the positions the KV cache holds after the run.
    pub kv_cache_bytes: u64,
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    pub prefill_step_size: usize,
    pub max_kv_size: Option<usize>,
    /// Bits per element of the KV cache when it is quantized (4 or 8);
    /// `None`: in the model's float dtype.
    #[serde(default)]
    pub kv_bits: Option<u8>,
    /// Images the prompt showed, the prompt tokens they filled, and what
    /// encoding them took (decoding, resizing, the vision tower and the
    /// projector): inside the time to first token, before the prefill.
    #[serde(default)]
    pub images: usize,
    #[serde(default)]
    pub image_tokens: usize,
    #[serde(default)]
    pub image_encode_ms: f64,
    pub sampler: SamplerSettings,
    pub stop_reason: StopReason,
    /// The stop string the text reached, when one ended the run.
    #[serde(default)]
    pub stop_string: Option<String>,
    /// Whether the prompt went through the model's chat template.
    pub chat_template: bool,
    /// The batch the run shared with other runs on the same model; `None`
    /// for a run that had the engine to itself (a benchmark's sync loop,
    /// a graph count).
    #[serde(default)]
    pub batch: Option<BatchShare>,
    /// The grammar the reply was held to, and what holding it cost; `None`
    /// for free text.
    #[serde(default)]
    pub constraint: Option<ConstraintStats>,
}

/// How a run shared the engine's batch: the rows of the forward passes it
/// was in, how long it waited to be let in, and how its prompt's prefill
/// was cut up between the others' decode steps.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct BatchShare {
    /// Fewest, median and most sequences in a pass it was in (1, 1, 1: it
    /// was alone the whole time).
    pub min_rows: usize,
    pub median_rows: usize,
    pub max_rows: usize,
    /// From the engine receiving the request to the batch taking it in.
    pub admission_wait_ms: f64,
    /// What it waited for, when it waited: "memory" (its KV cache did not
    /// fit beside the batch's), "batch_full", "another_model",
    /// "kv_settings" (its KV cache quantized otherwise than the batch's).
    pub waited_for: Option<String>,
    /// Prefill chunks its prompt took, and how many of them ran while other
    /// sequences were decoding (each delayed their next token by one chunk).
    pub prefill_chunks: usize,
    pub interleaved_chunks: usize,
}

impl BatchShare {
    /// The pass sizes' fewest, median and most (all 1 for no passes).
    pub fn rows(sizes: &[usize]) -> (usize, usize, usize) {
        if sizes.is_empty() {
            return (1, 1, 1);
        }
        let mut sorted = sizes.to_vec();
        sorted.sort_unstable();
        (
            sorted[0],
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1],
        )
    }

    /// Whether no other sequence ever shared a pass with it.
    pub fn alone(&self) -> bool {
        self.max_rows <= 1
    }

    /// A few words for footers and logs: "alone", or "batch 2-6 (median 4)".
    pub fn describe(&self) -> String {
        let mut words = if self.alone() {
            "alone".to_owned()
        } else if self.min_rows == self.max_rows {
            format!("batch of {}", self.max_rows)
        } else {
            format!(
                "batch {}-{} (median {})",
                self.min_rows, self.max_rows, self.median_rows
            )
        };
        if self.admission_wait_ms >= 1.0 {
            let why = self
                .waited_for
                .as_deref()
                .map_or(String::new(), |w| format!(" for {}", w.replace('_', " ")));
            words.push_str(&format!(", waited {:.0} ms{why}", self.admission_wait_ms));
        }
        if self.interleaved_chunks > 0 {
            words.push_str(&format!(
                ", {} of {} prefill chunks between others' steps",
                self.interleaved_chunks, self.prefill_chunks
            ));
        }
        words
    }
}

/// `count / (ms / 1000)`, 0 when nothing was timed.
pub fn per_second(count: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        count as f64 / (ms / 1e3)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_uses_design_field_names() {
        let value = serde_json::to_value(RunStats::default()).unwrap();
        for key in [
            "ttft_ms",
            "prefill_ms",
            "decode_ms",
            "load_ms",
            "prefill_tps",
            "decode_tps",
            "prompt_tps",
            "generation_tps",
            "cached_tokens",
            "prefill_tokens",
            "mlx_peak_bytes",
            "kv_cache_bytes",
            "loop",
            "load_kind",
            "stop_reason",
        ] {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        assert_eq!(value["load_kind"], "cold");
        assert_eq!(value["stop_reason"], "max_tokens");
    }

    #[test]
    fn a_batch_share_names_its_sizes_and_says_when_a_run_was_alone() {
        assert_eq!(BatchShare::rows(&[3, 1, 4, 4, 2]), (1, 3, 4));
        assert_eq!(BatchShare::rows(&[]), (1, 1, 1));
        let alone = BatchShare {
            min_rows: 1,
            median_rows: 1,
            max_rows: 1,
            ..BatchShare::default()
        };
        assert_eq!(alone.describe(), "alone");
        let shared = BatchShare {
            min_rows: 2,
            median_rows: 4,
            max_rows: 6,
            admission_wait_ms: 120.0,
            waited_for: Some("batch_full".into()),
            prefill_chunks: 3,
            interleaved_chunks: 2,
        };
        assert_eq!(
            shared.describe(),
            "batch 2-6 (median 4), waited 120 ms for batch full, 2 of 3 prefill chunks between others' steps"
        );
    }

    #[test]
    fn rates_of_nothing_are_zero() {
        assert_eq!(per_second(10, 0.0), 0.0);
        assert_eq!(per_second(10, 500.0), 20.0);
    }
}
