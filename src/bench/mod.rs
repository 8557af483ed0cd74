//! Benchmarks. For now: Ondo against Python mlx-lm on the same model folder
//! in the same run (DESIGN.md, "Benchmarks"): alternating sides, warm-up
//! repetitions excluded, median and spread over the rest, synthetic prompts
//! that differ per repetition, and a fresh-process cold start for each side.

pub mod peer;
pub mod plan;
pub mod summary;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ErrorKind;
use crate::engine::generate::LoopShape;
use crate::engine::{CancelToken, EngineHandle, GenerateRequest, Prompt, RunError};
use peer::{MlxLmPeer, PeerError};
pub use summary::Summary;

/// What to compare.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PeerComparisonPlan {
    pub model_dir: PathBuf,
    pub prompt_tokens: Vec<usize>,
    pub generate_tokens: usize,
    pub repetitions: usize,
    pub warmup: usize,
    pub loops: Vec<LoopShape>,
    pub prefill_step_size: usize,
    /// Fresh processes per side for the cold start; 0 skips it.
    pub cold_repetitions: usize,
    /// Python with mlx-lm for the peer side; `None` measures Ondo alone.
    pub python: Option<PathBuf>,
}

/// One side's numbers at one prompt length.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SideResult {
    /// "mlx-lm", "ondo pipelined" or "ondo sync".
    pub side: String,
    pub prompt_tokens: usize,
    pub generate_tokens: usize,
    pub ttft_ms: Summary,
    /// Prompt tokens / time to first token (mlx-lm's convention; for token
    /// prompts it is the prefill rate).
    pub prompt_tps: Summary,
    /// `(generated - 1) / decode_s`.
    pub decode_tps: Summary,
    pub mlx_peak_bytes: Summary,
}

/// Process start to first token, per side.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ColdStart {
    pub ondo_ms: Summary,
    pub mlx_lm_ms: Option<Summary>,
}

/// Where and with what the comparison ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct BenchEnvironment {
    pub ondo_version: String,
    pub build_profile: String,
    pub mlx_version: String,
    pub backend: String,
    pub mlx_lm_version: Option<String>,
    pub cpu: String,
    pub os: String,
    pub memory_bytes: u64,
    pub model_type: String,
    pub quantization: String,
    pub weights_bytes: u64,
}

/// The whole result, kept with its plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PeerComparison {
    pub plan: PeerComparisonPlan,
    pub environment: BenchEnvironment,
    pub results: Vec<SideResult>,
    pub cold_start: Option<ColdStart>,
    /// Ondo's greedy tokens equalled mlx-lm's in every measured repetition
    /// (`None` without the peer).
    pub same_tokens: Option<bool>,
}

/// Why a benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Engine(#[from] RunError),
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error("{0}")]
    Plan(String),
    /// Stopped by the user; the runs that finished are recorded.
    #[error("the benchmark was stopped after {done} of {total} runs")]
    Cancelled { done: usize, total: usize },
}

impl BenchError {
    /// A short machine-readable name for clients (the app's error kinds).
    pub fn kind(&self) -> ErrorKind {
        match self {
            BenchError::Engine(e) => e.kind(),
            BenchError::Peer(_) => ErrorKind::Peer,
            BenchError::Plan(_) => ErrorKind::InvalidInput,
            BenchError::Cancelled { .. } => ErrorKind::Cancelled,
        }
    }
}

/// A prompt of `n` ordinary token ids, different for each repetition so
/// no cache can carry one repetition's work into the next.
pub fn synthetic_prompt(n: usize, repetition: usize, vocab: u32) -> Vec<u32> {
    // Stay clear of the special tokens at the end of the vocabulary.
    let ordinary = vocab.saturating_sub(256).max(1);
    let seed = repetition as u64 * 1_000_003 + 17;
    (0..n as u64)
        .map(|i| ((i * 7919 + seed * 104_729) % ordinary as u64) as u32)
        .collect()
}

impl PeerComparisonPlan {
    fn check(&self) -> Result<(), BenchError> {
        check_shape(self.repetitions, &self.prompt_tokens, self.generate_tokens)
    }
}

/// What every benchmark needs to measure anything.
pub(crate) fn check_shape(
    repetitions: usize,
    prompt_tokens: &[usize],
    generate_tokens: usize,
) -> Result<(), BenchError> {
    if repetitions == 0 || prompt_tokens.is_empty() || generate_tokens < 2 {
        return Err(BenchError::Plan(
            "a benchmark needs at least 1 repetition, 1 prompt length and 2 generated \
             tokens (decode speed is measured after the first)"
                .into(),
        ));
    }
    if prompt_tokens.contains(&0) {
        return Err(BenchError::Plan("prompt lengths must be at least 1".into()));
    }
    Ok(())
}

/// Runs `plan`; `progress` hears (done, total) after each measurement.
pub fn compare_with_mlx_lm(
    plan: &PeerComparisonPlan,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PeerComparison, BenchError> {
    plan.check()?;
    let runtime = crate::metrics::mlx_runtime::MlxRuntime::detect();
    let engine = EngineHandle::spawn()?;
    let resident = engine.load(&plan.model_dir)?;
    let vocab = model_vocab(&plan.model_dir)?;
    let mut peer = match &plan.python {
        Some(python) => Some(MlxLmPeer::start(python, &plan.model_dir)?),
        None => None,
    };
    let rounds = plan.warmup + plan.repetitions;
    // Ondo's loop shapes, then the peer when there is one.
    let sides = plan.loops.len() + usize::from(peer.is_some());
    let total = plan.prompt_tokens.len() * rounds * sides
        + plan.cold_repetitions * (sides - plan.loops.len() + 1);
    let mut done = 0;
    let mut results = Vec::new();
    let mut same_tokens = true;
    for &length in &plan.prompt_tokens {
        // Samples per side: ttft, prompt tps, decode tps, peak bytes.
        let mut samples = vec![[const { Vec::new() }; 4]; sides];
        for round in 0..rounds {
            let prompt = synthetic_prompt(length, round, vocab);
            let measured = round >= plan.warmup;
            // Alternate who goes first, so neither side always runs on a
            // machine the other has just warmed (or heated).
            let mut order: Vec<usize> = (0..sides).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut ondo_tokens = None;
            let mut peer_tokens = None;
            for side in order {
                let row = if side < plan.loops.len() {
                    let request = GenerateRequest {
                        max_tokens: plan.generate_tokens,
                        prefill_step_size: plan.prefill_step_size,
                        loop_shape: plan.loops[side],
                        ignore_eos: true,
                        ..GenerateRequest::new(
                            &plan.model_dir,
                            Prompt::Tokens {
                                ids: prompt.clone(),
                            },
                        )
                    };
                    let outcome = engine.generate_blocking(request, CancelToken::new(), |_| {})?;
                    ondo_tokens.get_or_insert(outcome.token_ids);
                    let s = outcome.stats;
                    [
                        s.ttft_ms,
                        s.prompt_tps,
                        s.decode_tps,
                        s.mlx_peak_bytes as f64,
                    ]
                } else if let Some(peer) = peer.as_mut() {
                    let run =
                        peer.generate(&prompt, plan.generate_tokens, plan.prefill_step_size, None)?;
                    let decode = run.decode_tps.unwrap_or(0.0);
                    peer_tokens = Some(run.generated_ids);
                    [
                        run.ttft_ms,
                        run.prefill_tps,
                        decode,
                        run.peak_memory_bytes as f64,
                    ]
                } else {
                    continue;
                };
                if measured {
                    for (metric, value) in row.into_iter().enumerate() {
                        samples[side][metric].push(value);
                    }
                }
                done += 1;
                progress(done, total);
            }
            if measured && ondo_tokens != peer_tokens {
                same_tokens = false;
            }
        }
        let name = |side: usize| {
            if side < plan.loops.len() {
                format!("ondo {}", plan.loops[side])
            } else {
                "mlx-lm".to_owned()
            }
        };
        // mlx-lm first: the reference row the ratios divide by.
        let peer_side = (sides > plan.loops.len()).then_some(plan.loops.len());
        for side in peer_side.into_iter().chain(0..plan.loops.len()) {
            let s = &samples[side];
            results.push(SideResult {
                side: name(side),
                prompt_tokens: length,
                generate_tokens: plan.generate_tokens,
                ttft_ms: Summary::from_samples(&s[0]),
                prompt_tps: Summary::from_samples(&s[1]),
                decode_tps: Summary::from_samples(&s[2]),
                mlx_peak_bytes: Summary::from_samples(&s[3]),
            });
        }
    }
    let cold_start = if plan.cold_repetitions > 0 {
        let prompt = synthetic_prompt(plan.prompt_tokens[0], 0, vocab);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..plan.cold_repetitions {
            ours.push(ondo_cold_start(&plan.model_dir, &prompt)?);
            done += 1;
            progress(done, total);
            if let Some(python) = &plan.python {
                let run = peer::cold_start(python, &plan.model_dir, &prompt)?;
                theirs.push(run.process_to_first_token_ms.unwrap_or(0.0));
                done += 1;
                progress(done, total);
            }
        }
        Some(ColdStart {
            ondo_ms: Summary::from_samples(&ours),
            mlx_lm_ms: plan.python.as_ref().map(|_| Summary::from_samples(&theirs)),
        })
    } else {
        None
    };
    let memory = ondo_os::memory_totals().map(|m| m.total_bytes).unwrap_or(0);
    Ok(PeerComparison {
        plan: plan.clone(),
        environment: BenchEnvironment {
            ondo_version: env!("CARGO_PKG_VERSION").to_owned(),
            build_profile: crate::doctor::build_profile().to_owned(),
            mlx_version: runtime.mlx_version,
            backend: runtime.backend.to_string(),
            mlx_lm_version: peer.as_ref().map(|p| p.info.mlx_lm_version.clone()),
            cpu: ondo_os::cpu_name().unwrap_or_else(|| "unknown".into()),
            os: ondo_os::os_description(),
            memory_bytes: memory,
            model_type: resident.model_type,
            quantization: resident.quantization,
            weights_bytes: resident.weights_bytes,
        },
        results,
        cold_start,
        same_tokens: peer.is_some().then_some(same_tokens),
    })
}

pub(crate) fn model_vocab(dir: &Path) -> Result<u32, BenchError> {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| BenchError::Plan(format!("{}: {e}", dir.display())))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| BenchError::Plan(e.to_string()))?;
    Ok(value["vocab_size"].as_u64().unwrap_or(256) as u32)
}

/// A fresh `ondo run` process: spawn to first token, in milliseconds.
fn ondo_cold_start(model_dir: &Path, prompt: &[u32]) -> Result<f64, BenchError> {
    let step = crate::engine::generate::DEFAULT_PREFILL_STEP_SIZE;
    plan::fresh_process_run(model_dir, prompt, 1, step, LoopShape::Pipelined).map(|(_, ms)| ms)
}

/// Set by a parent that times a child `ondo run` from its spawn: the wall
/// clock in nanoseconds since the Unix epoch.
pub const SPAWNED_AT_ENV: &str = "ONDO_SPAWNED_AT_NS";

/// `ours / theirs`, or 0 when there is nothing to divide by.
pub fn ratio(ours: f64, theirs: f64) -> f64 {
    if theirs != 0.0 { ours / theirs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind each variant has always had; an engine error keeps its own.
    /// Exhaustive: a new variant does not compile until it has a line here;
    /// give it an example in `one_of_each` too.
    fn kind_name(error: &BenchError) -> &'static str {
        match error {
            BenchError::Engine(_) => "empty_prompt",
            BenchError::Peer(peer::PeerError::Start { .. }) => "peer",
            BenchError::Peer(peer::PeerError::Failed(_)) => "peer",
            BenchError::Plan(_) => "invalid_input",
            BenchError::Cancelled { .. } => "cancelled",
        }
    }

    fn one_of_each() -> Vec<BenchError> {
        vec![
            BenchError::Engine(RunError::EmptyPrompt),
            BenchError::Peer(peer::PeerError::Start {
                python: ".venv/bin/python".into(),
                message: "No such file or directory (os error 2)".into(),
            }),
            BenchError::Peer(peer::PeerError::Failed("mlx_lm is not installed".into())),
            BenchError::Plan("give at least one loop shape".into()),
            BenchError::Cancelled { done: 3, total: 12 },
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind() {
        for error in one_of_each() {
            assert_eq!(error.kind().as_str(), kind_name(&error), "{error:?}");
        }
    }

    #[test]
    fn every_message_speaks_to_the_app_and_the_cli_alike() {
        for error in one_of_each() {
            let message = error.to_string();
            assert_eq!(
                crate::error_kind::out_of_place_in_the_app(&message),
                None,
                "{message}"
            );
        }
    }

    #[test]
    fn synthetic_prompts_differ_per_repetition_and_avoid_special_tokens() {
        let a = synthetic_prompt(64, 0, 2048);
        let b = synthetic_prompt(64, 1, 2048);
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_eq!(a, synthetic_prompt(64, 0, 2048), "repeatable");
        assert!(a.iter().chain(&b).all(|&t| t < 2048 - 256));
    }
}
