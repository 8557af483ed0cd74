//! Benchmarks (docs/ARCHITECTURE.md, "Benchmarks"): what a benchmark
//! measures (`BenchShape`), Ondo's own plans (`plan`), and Ondo against
//! Python mlx-lm on the same model folder in the same run: alternating
//! sides, warm-up repetitions excluded, median and spread over the rest,
//! synthetic prompts that differ per repetition, and a fresh-process cold
//! start for each side. Every Ondo run goes through the session pool and is
//! recorded.

pub mod concurrency;
pub mod endpoint;
pub mod image;
pub mod peer;
pub mod plan;
pub mod side_by_side;
pub mod split;
pub mod summary;
pub mod text_prompt;
pub mod token_check;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ErrorKind;
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunError, StepAnatomy};
use crate::run_kinds::{LoopShape, RunKind};
use crate::session::SessionPool;
use crate::session::chat::GenerationSettings;
use crate::session::record::RunContext;
use crate::store::RunRecord;
use peer::{MlxLmPeer, PeerError};
pub use summary::Summary;
pub use token_check::{TokenCheck, TokenVerdict};

/// What a benchmark measures, defined once: `ondo bench`'s flags, the
/// Runs window's Benchmark form (through the generated bindings) and the
/// mlx-lm comparison all read this type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct BenchShape {
    /// Prompt lengths in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = BenchShape::default().prompt_tokens)]
    pub prompt_tokens: Vec<usize>,
    /// Tokens to generate per run (decode is timed after the first).
    #[arg(long = "gen", default_value_t = BenchShape::default().generate_tokens)]
    pub generate_tokens: usize,
    /// Measured repetitions per case (at least 5 for a median you can quote).
    #[arg(long = "reps", default_value_t = BenchShape::default().repetitions)]
    pub repetitions: usize,
    /// Unmeasured repetitions first (kernel compilation, caches).
    #[arg(long, default_value_t = BenchShape::default().warmup)]
    pub warmup: usize,
    /// Decode loop shapes to run, comma-separated.
    #[arg(
        long = "loop",
        value_enum,
        value_delimiter = ',',
        default_values_t = BenchShape::default().loops
    )]
    pub loops: Vec<LoopShape>,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = BenchShape::default().prefill_step_size)]
    pub prefill_step_size: usize,
    /// KV cache bound for every run (a rotating cache keeping the first tokens).
    #[arg(long)]
    pub max_kv_size: Option<usize>,
    /// Vary one setting across values, everything else fixed:
    /// prefill_step_size=512,2048 or max_kv_size=1024,4096.
    #[arg(long)]
    pub vary: Option<plan::Vary>,
    /// Hold the KV cache in 4 or 8 bits (mlx-lm's --kv-bits), on Ondo's
    /// engine and on the mlx-lm peer alike.
    #[arg(long)]
    #[serde(default)]
    pub kv_bits: Option<u8>,
    /// Elements sharing one scale and bias in the quantized KV cache.
    #[arg(long, default_value_t = BenchShape::default().kv_group_size)]
    #[serde(default = "default_kv_group_size")]
    pub kv_group_size: u32,
    /// Positions held in floats before the KV cache is quantized (mlx-lm's
    /// default 5000; 0 quantizes from the first decode step).
    #[arg(long, default_value_t = BenchShape::default().quantized_kv_start)]
    #[serde(default = "default_quantized_kv_start")]
    pub quantized_kv_start: usize,
    /// Fresh-process cold starts (0 skips them).
    #[arg(long = "cold", default_value_t = BenchShape::default().cold_repetitions)]
    pub cold_repetitions: usize,
}

impl Default for BenchShape {
    fn default() -> Self {
        Self {
            prompt_tokens: vec![128],
            generate_tokens: 128,
            repetitions: 5,
            warmup: 1,
            loops: vec![LoopShape::Pipelined, LoopShape::Sync],
            prefill_step_size: crate::engine::generate::DEFAULT_PREFILL_STEP_SIZE,
            max_kv_size: None,
            vary: None,
            kv_bits: None,
            kv_group_size: crate::engine::request::DEFAULT_KV_GROUP_SIZE,
            quantized_kv_start: crate::engine::request::DEFAULT_QUANTIZED_KV_START,
            cold_repetitions: 3,
        }
    }
}

fn default_kv_group_size() -> u32 {
    crate::engine::request::DEFAULT_KV_GROUP_SIZE
}

fn default_quantized_kv_start() -> usize {
    crate::engine::request::DEFAULT_QUANTIZED_KV_START
}

impl BenchShape {
    /// `request` with this benchmark's KV cache settings.
    pub fn with_kv(&self, request: GenerateRequest) -> GenerateRequest {
        GenerateRequest {
            kv_bits: self.kv_bits,
            kv_group_size: self.kv_group_size,
            quantized_kv_start: self.quantized_kv_start,
            ..request
        }
    }

    /// The KV cache settings as the mlx-lm peer takes them.
    fn peer_kv(&self) -> peer::PeerKv {
        peer::PeerKv {
            kv_bits: self.kv_bits,
            kv_group_size: self.kv_group_size,
            quantized_kv_start: self.quantized_kv_start,
        }
    }
}

/// The ranges a benchmark's numbers must fall in: enough for any study,
/// little enough that a typo does not start a week-long run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BenchLimits {
    pub prompt_tokens: (usize, usize),
    pub generate_tokens: (usize, usize),
    pub repetitions: (usize, usize),
    pub warmup: (usize, usize),
    pub cold_repetitions: (usize, usize),
    pub prefill_step_size: (usize, usize),
    pub max_kv_size: (usize, usize),
}

pub const BENCH_LIMITS: BenchLimits = BenchLimits {
    prompt_tokens: (1, 131_072),
    generate_tokens: (2, 8192),
    repetitions: (1, 1000),
    warmup: (0, 100),
    cold_repetitions: (0, 100),
    prefill_step_size: (1, 131_072),
    max_kv_size: GenerationSettings::LIMITS.max_kv_size,
};

impl BenchShape {
    /// What every benchmark needs to measure anything, within `BENCH_LIMITS`.
    pub fn check(&self) -> Result<(), BenchError> {
        let limits = BENCH_LIMITS;
        let outside = |value: usize, (low, high): (usize, usize)| !(low..=high).contains(&value);
        if self.prompt_tokens.is_empty()
            || self
                .prompt_tokens
                .iter()
                .any(|&n| outside(n, limits.prompt_tokens))
        {
            let (low, high) = limits.prompt_tokens;
            return Err(BenchError::Plan(format!(
                "give at least one prompt length, each from {low} to {high} tokens"
            )));
        }
        if self.loops.is_empty() {
            return Err(BenchError::Plan("give at least one loop shape".into()));
        }
        let numbers = [
            (
                "tokens to generate (decode is timed after the first)",
                self.generate_tokens,
                limits.generate_tokens,
            ),
            ("repetitions", self.repetitions, limits.repetitions),
            ("warm-up repetitions", self.warmup, limits.warmup),
            (
                "cold starts",
                self.cold_repetitions,
                limits.cold_repetitions,
            ),
            (
                "the prefill step size",
                self.prefill_step_size,
                limits.prefill_step_size,
            ),
        ];
        for (what, value, (low, high)) in numbers {
            if !(low..=high).contains(&value) {
                return Err(BenchError::Plan(format!(
                    "{what} must be from {low} to {high}, not {value}"
                )));
            }
        }
        if let Some(bits) = self.kv_bits {
            let quantization = crate::engine::cache::KvQuantization {
                bits: i32::from(bits),
                group_size: self.kv_group_size as i32,
                start: self.quantized_kv_start as i32,
            };
            quantization.check(&[]).map_err(BenchError::Plan)?;
            if self.max_kv_size.is_some() || self.vary.is_some() {
                return Err(BenchError::Plan(
                    "--kv-bits quantizes a growing KV cache; a bounded one (--max-kv-size) \
                     stays in floats, in mlx-lm too: give one or the other"
                        .into(),
                ));
            }
        }
        let kv_values = self.max_kv_size.into_iter().chain(
            self.vary
                .iter()
                .filter(|v| v.setting == plan::VarySetting::MaxKvSize)
                .flat_map(|v| v.values.iter().copied()),
        );
        for bound in kv_values {
            if outside(bound, limits.max_kv_size) {
                let (low, high) = limits.max_kv_size;
                return Err(BenchError::Plan(format!(
                    "a KV cache bound must be from {low} to {high} positions, not {bound}"
                )));
            }
        }
        Ok(())
    }
}

/// The model a benchmark runs, as its records name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct BenchPlan {
    pub model_dir: PathBuf,
    /// Repo id, `tiny` or the folder as the user named it.
    pub model_id: String,
    pub model_revision: Option<String>,
    pub parameters: Option<u64>,
    #[serde(flatten)]
    pub shape: BenchShape,
}

impl BenchPlan {
    /// The plan for `model` with `shape`.
    pub fn new(model: &crate::resolve::ResolvedModel, shape: BenchShape) -> Self {
        let context = model.run_context(crate::run_kinds::RunKind::Bench);
        Self {
            model_dir: model.dir.clone(),
            model_id: context.model_id,
            model_revision: context.model_revision,
            parameters: context.parameters,
            shape,
        }
    }

    /// The record's context for a run of this plan.
    pub(crate) fn context(&self, kind: crate::run_kinds::RunKind) -> RunContext {
        RunContext {
            kind,
            model_id: self.model_id.clone(),
            model_revision: self.model_revision.clone(),
            parameters: self.parameters,
            ..RunContext::default()
        }
    }
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
    /// Where Ondo's decode steps spent the host's time (`None` for mlx-lm,
    /// whose loop Ondo does not see inside).
    #[serde(default)]
    pub anatomy: Option<AnatomySummary>,
}

/// Ondo's decode steps at one prompt length, over the measured runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct AnatomySummary {
    /// Host time per step building the graph and queueing it.
    pub host_build_ms: Summary,
    /// Host time per step waiting for the token once asked for it.
    pub wait_ms: Summary,
    /// Nodes in one decode step's graph (counted in a warm-up run, so the
    /// count's own cost stays out of the measured ones).
    pub graph_nodes: Option<usize>,
    /// Scalar constants among that graph's inputs, made afresh each step.
    pub scalar_inputs: Option<usize>,
}

impl AnatomySummary {
    /// Over the measured runs' anatomies, the graph's size from the run that
    /// counted it (`None` without measured runs).
    pub fn from_runs(measured: &[StepAnatomy], counted: Option<&StepAnatomy>) -> Option<Self> {
        if measured.is_empty() {
            return None;
        }
        let of = |metric: fn(&StepAnatomy) -> f64| {
            Summary::from_samples(&measured.iter().map(metric).collect::<Vec<_>>())
        };
        Some(Self {
            host_build_ms: of(|a| a.host_build_ms),
            wait_ms: of(|a| a.wait_ms),
            graph_nodes: counted.and_then(|a| a.graph_nodes),
            scalar_inputs: counted.and_then(|a| a.scalar_inputs),
        })
    }
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
    pub bench_id: String,
    pub plan: BenchPlan,
    pub environment: BenchEnvironment,
    pub results: Vec<SideResult>,
    pub cold_start: Option<ColdStart>,
    /// Ondo's greedy tokens against mlx-lm's in every measured repetition,
    /// mlx-lm asked again where they differ (`bench::token_check`).
    pub token_check: TokenCheck,
    /// What the check concludes (also in `token_check`, spelled out for
    /// readers of the JSON).
    pub token_verdict: TokenVerdict,
}

/// Why a benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Engine(#[from] RunError),
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error(transparent)]
    Endpoint(#[from] endpoint::EndpointError),
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
            BenchError::Endpoint(e) => e.kind(),
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

/// Runs `plan` on Ondo (through `pool`, every run recorded as part of one
/// benchmark) and on mlx-lm (`python`) alternately; `progress` hears
/// (done, total) after each measurement.
pub fn compare_with_mlx_lm(
    pool: &SessionPool,
    plan: &BenchPlan,
    python: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PeerComparison, BenchError> {
    let shape = &plan.shape;
    shape.check()?;
    if shape.vary.is_some() || shape.max_kv_size.is_some() {
        return Err(BenchError::Plan(
            "the comparison with mlx-lm runs one setting at a time; varying a setting or \
             bounding the KV cache applies to Ondo's own benchmark"
                .into(),
        ));
    }
    let bench_id = plan::new_bench_id();
    let provenance = pool.provenance();
    let vocab = model_vocab(&plan.model_dir)?;
    let mut peer = MlxLmPeer::start(python, &plan.model_dir)?;
    let rounds = shape.warmup + shape.repetitions;
    // Ondo's loop shapes, then the peer.
    let sides = shape.loops.len() + 1;
    let peer_side = shape.loops.len();
    let total = shape.prompt_tokens.len() * rounds * sides + shape.cold_repetitions * 2;
    let mut done = 0;
    let mut results = Vec::new();
    // Asking whether the kernel runs probes MLX, which happens on the
    // engine thread like all MLX work (docs/ARCHITECTURE.md, "One door
    // into the engine").
    let own_cuda_kernel = pool.call(crate::engine::backend::own_kernels_active)?;
    let mut token_check = TokenCheck {
        own_cuda_kernel,
        ..TokenCheck::default()
    };
    let mut described: Option<RunRecord> = None;
    for &length in &shape.prompt_tokens {
        let test = format!("pp{length}+tg{}", shape.generate_tokens);
        // Samples per side: ttft, prompt tps, decode tps, peak bytes; and
        // Ondo's step anatomies (measured runs, and the one that counted).
        let mut samples = vec![[const { Vec::new() }; 4]; sides];
        let mut anatomies: Vec<Vec<StepAnatomy>> = vec![Vec::new(); sides];
        let mut counted: Vec<Option<StepAnatomy>> = vec![None; sides];
        for round in 0..rounds {
            let prompt = synthetic_prompt(length, round, vocab);
            let measured = round >= shape.warmup;
            // Alternate who goes first, so neither side always runs on a
            // machine the other has just warmed (or heated).
            let mut order: Vec<usize> = (0..sides).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut ondo_tokens = None;
            let mut peer_tokens = None;
            for side in order {
                let row = if side == peer_side {
                    let run = peer.generate(
                        &prompt,
                        shape.generate_tokens,
                        shape.prefill_step_size,
                        None,
                        &shape.peer_kv(),
                    )?;
                    let decode = run.decode_tps.unwrap_or(0.0);
                    peer_tokens = Some(run.generated_ids);
                    [
                        run.ttft_ms,
                        run.prefill_tps,
                        decode,
                        run.peak_memory_bytes as f64,
                    ]
                } else {
                    let request = shape.with_kv(GenerateRequest {
                        max_tokens: shape.generate_tokens,
                        prefill_step_size: shape.prefill_step_size,
                        loop_shape: shape.loops[side],
                        ignore_eos: true,
                        // Counting prints the graph once: only in the
                        // first warm-up, never in a measured run.
                        count_graph_nodes: round == 0 && !measured,
                        // A benchmark times prefill: no prompt cache read from the disk.
                        disk_cache: false,
                        ..GenerateRequest::new(
                            &plan.model_dir,
                            Prompt::Tokens {
                                ids: prompt.clone(),
                            },
                        )
                    });
                    let context = RunContext {
                        bench_id: Some(bench_id.clone()),
                        test: Some(test.clone()),
                        repetition: Some(round as u32),
                        warmup: !measured,
                        ..plan.context(RunKind::Bench)
                    };
                    let (outcome, record) =
                        pool.run(request, context, CancelToken::new(), |_| {})?;
                    ondo_tokens.get_or_insert(outcome.token_ids);
                    let s = outcome.stats;
                    if outcome.anatomy.graph_nodes.is_some() {
                        counted[side] = Some(outcome.anatomy);
                    }
                    if measured {
                        anatomies[side].push(outcome.anatomy);
                    }
                    described.get_or_insert(record);
                    [
                        s.ttft_ms,
                        s.prompt_tps,
                        s.decode_tps,
                        s.mlx_peak_bytes as f64,
                    ]
                };
                if measured {
                    for (metric, value) in row.into_iter().enumerate() {
                        samples[side][metric].push(value);
                    }
                }
                done += 1;
                progress(done, total);
            }
            if measured {
                let ondo = ondo_tokens.unwrap_or_default();
                let reference = peer_tokens.unwrap_or_default();
                // mlx-lm is asked again only when the sides differ: its two
                // answers tell a bug from a device that does not repeat
                // itself (not timed, not a sample).
                let again = if ondo == reference {
                    None
                } else {
                    Some(
                        peer.generate(
                            &prompt,
                            shape.generate_tokens,
                            shape.prefill_step_size,
                            None,
                            &shape.peer_kv(),
                        )?
                        .generated_ids,
                    )
                };
                let score = score_departure(&mut peer, &prompt, &ondo, &reference)?;
                token_check.add(
                    length,
                    round - shape.warmup,
                    token_check::judge(&ondo, &reference, again.as_deref()),
                    score,
                );
            }
        }
        let name = |side: usize| {
            if side == peer_side {
                "mlx-lm".to_owned()
            } else {
                format!("ondo {}", shape.loops[side])
            }
        };
        // mlx-lm first: the reference row the ratios divide by.
        for side in std::iter::once(peer_side).chain(0..shape.loops.len()) {
            let s = &samples[side];
            results.push(SideResult {
                side: name(side),
                prompt_tokens: length,
                generate_tokens: shape.generate_tokens,
                ttft_ms: Summary::from_samples(&s[0]),
                prompt_tps: Summary::from_samples(&s[1]),
                decode_tps: Summary::from_samples(&s[2]),
                mlx_peak_bytes: Summary::from_samples(&s[3]),
                anatomy: AnatomySummary::from_runs(&anatomies[side], counted[side].as_ref()),
            });
        }
    }
    let cold_start = if shape.cold_repetitions > 0 {
        let prompt = synthetic_prompt(shape.prompt_tokens[0], 0, vocab);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for repetition in 0..shape.cold_repetitions {
            let record = plan::cold_start_run(pool, plan, &bench_id, repetition, &prompt, 1)?;
            ours.push(record.cold_start_ms.unwrap_or(f64::NAN));
            done += 1;
            progress(done, total);
            let run = peer::cold_start(python, &plan.model_dir, &prompt)?;
            theirs.push(run.process_to_first_token_ms.unwrap_or(0.0));
            done += 1;
            progress(done, total);
        }
        Some(ColdStart {
            ondo_ms: Summary::from_samples(&ours),
            mlx_lm_ms: Some(Summary::from_samples(&theirs)),
        })
    } else {
        None
    };
    let described = described.unwrap_or_default();
    Ok(PeerComparison {
        bench_id,
        plan: plan.clone(),
        environment: BenchEnvironment {
            ondo_version: provenance.app_version.clone(),
            build_profile: provenance.build_profile.clone(),
            mlx_version: provenance.mlx_version.clone(),
            backend: provenance.backend.clone(),
            mlx_lm_version: Some(peer.info.mlx_lm_version.clone()),
            cpu: provenance.cpu.clone(),
            os: provenance.os.clone(),
            memory_bytes: provenance.ram_bytes,
            model_type: described.model_type,
            quantization: described.quantization,
            weights_bytes: described.weights_bytes,
        },
        results,
        cold_start,
        token_verdict: token_check.verdict(),
        token_check,
    })
}

pub(crate) fn model_vocab(dir: &Path) -> Result<u32, BenchError> {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| BenchError::Plan(format!("{}: {e}", dir.display())))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| BenchError::Plan(e.to_string()))?;
    Ok(value["vocab_size"].as_u64().unwrap_or(256) as u32)
}

/// `ours / theirs`, or 0 when there is nothing to divide by.
pub fn ratio(ours: f64, theirs: f64) -> f64 {
    if theirs != 0.0 { ours / theirs } else { 0.0 }
}

/// mlx-lm's scores for the two tokens where Ondo's greedy tokens first left
/// its own (`token_check::TieScore`), or `None` where they did not or one
/// side simply ended. Not timed: asked only when the sides differ.
fn score_departure(
    peer: &mut MlxLmPeer,
    prompt: &[u32],
    ondo: &[u32],
    reference: &[u32],
) -> Result<Option<token_check::TieScore>, BenchError> {
    let Some(at) = token_check::first_departure(ondo, reference) else {
        return Ok(None);
    };
    let (Some(&ondo_token), Some(&reference_token)) = (ondo.get(at), reference.get(at)) else {
        return Ok(None);
    };
    let context: Vec<u32> = prompt.iter().chain(&reference[..at]).copied().collect();
    // Ondo prefills all but the last prompt token in chunks of several
    // positions with MLX's own kernels (`engine::generate::TokenSteps`,
    // as mlx-lm does), and its own CUDA kernel takes one-position products
    // only: its computation can differ from mlx-lm's from the last prompt
    // position on, so that is where routing is scored.
    let last_prompt_position = prompt.len().saturating_sub(1);
    let score = peer.score(
        &context,
        [reference_token, ondo_token],
        last_prompt_position,
    )?;
    let routing = score.routing.map(|r| token_check::RoutingTie {
        layer: r.layer,
        position: r.position,
        token: r.position.saturating_sub(last_prompt_position),
        top_k: r.top_k,
        experts: r.experts,
        ranks: r.ranks,
        margin_f32: r.margin_f32,
        rounding: r.rounding,
    });
    Ok(Some(token_check::TieScore::new(
        reference_token,
        ondo_token,
        score.logits_f32[0] - score.logits_f32[1],
        score.rounding,
        routing,
    )))
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
            BenchError::Peer(peer::PeerError::Failed(_) | peer::PeerError::VlmFailed(_)) => "peer",
            BenchError::Endpoint(error) => match error {
                endpoint::EndpointError::NotAnEndpoint { .. } => "invalid_input",
                endpoint::EndpointError::Unreachable { .. } => "endpoint_unreachable",
                endpoint::EndpointError::Refused { .. } => "endpoint_refused",
                endpoint::EndpointError::ModelNotFound { .. }
                | endpoint::EndpointError::ModelNotNamed { .. } => "endpoint_model_not_found",
                endpoint::EndpointError::Status { .. }
                | endpoint::EndpointError::NoRoute { .. }
                | endpoint::EndpointError::BadAnswer { .. } => "endpoint_failed",
            },
            BenchError::Plan(_) => "invalid_input",
            BenchError::Cancelled { .. } => "cancelled",
        }
    }

    fn one_of_each() -> Vec<BenchError> {
        vec![
            BenchError::Engine(RunError::EmptyPrompt),
            BenchError::Peer(peer::PeerError::Start {
                peer: "mlx-lm",
                python: ".venv/bin/python".into(),
                message: "No such file or directory (os error 2)".into(),
            }),
            BenchError::Peer(peer::PeerError::Failed("mlx_lm is not installed".into())),
            BenchError::Peer(peer::PeerError::VlmFailed(
                "mlx_vlm is not installed".into(),
            )),
            BenchError::Endpoint(endpoint::EndpointError::NotAnEndpoint {
                text: "127.0.0.1:8080#tiny".into(),
                reason: "relative URL without a base".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::Unreachable {
                url: "http://127.0.0.1:8080/api/version".into(),
                message: "Connection refused (os error 111)".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::Refused {
                url: "http://127.0.0.1:8080/v1/models".into(),
                status: 401,
                key_sent: false,
                message: "missing bearer token".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::Refused {
                url: "http://127.0.0.1:8080/v1/models".into(),
                status: 401,
                key_sent: true,
                message: "invalid key".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::ModelNotFound {
                server: "ollama 0.12.3".into(),
                model: "llama3.2".into(),
                message: "not among the models it lists".into(),
                available: vec!["qwen3:0.6b".into()],
            }),
            BenchError::Endpoint(endpoint::EndpointError::ModelNotNamed {
                server: "lmstudio".into(),
                available: vec!["qwen3-0.6b".into(), "llama-3.2-1b".into()],
            }),
            BenchError::Endpoint(endpoint::EndpointError::Status {
                url: "http://127.0.0.1:8080/v1/completions".into(),
                status: 500,
                message: "internal error".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::NoRoute {
                url: "http://127.0.0.1:8080/v2/chat/completions".into(),
            }),
            BenchError::Endpoint(endpoint::EndpointError::BadAnswer {
                url: "http://127.0.0.1:8080/v1/completions".into(),
                message: "the stream ended before the server said it was done".into(),
            }),
            BenchError::Plan("give at least one loop shape".into()),
            BenchError::Cancelled { done: 3, total: 12 },
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        crate::error_kind::check_layer(&one_of_each(), |e| e.kind(), kind_name);
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
