//! Sequences decoded together in one `Batch` give what each gives alone
//! through `TokenSteps`, for every family at the tiny shape (floats, on the
//! CPU): three prompts of different lengths crossing the sliding windows,
//! one row sampled at a temperature beside greedy ones; a sequence joining
//! mid-batch, one leaving at its `max_tokens`, one cancelled, and a KV
//! cache bounded by `max_kv_size`, none changing the others' tokens; a row
//! that left goes on alone from the cache it left with; and mlx-lm's own
//! continuous batching (`BatchGenerator`) gives the same tokens and
//! log-probabilities on the same prompts.
//!
//! "The same" is exact where the batched products round as the single
//! ones do (the log-probabilities are compared over the whole vocabulary);
//! where they do not, a token may part at a near tie only, under the rule
//! `bench::token_check` judges Ondo's own kernel by: the alone run's gap
//! between the two tokens within `NEAR_TIE_ROUNDINGS` times how far the
//! batch moved a log-probability at that step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mlx_rs::Array;
use ondo::bench::token_check::NEAR_TIE_ROUNDINGS;
use ondo::engine::CancelToken;
use ondo::engine::batch::{Batch, BatchEvent, NewSequence, SequenceId};
use ondo::engine::cache::LayerCache;
use ondo::engine::generate::TokenSteps;
use ondo::engine::load::LoadedModel;
use ondo::engine::sample::{Sampler, SamplerSettings};
use ondo::family::{self, FAMILIES, Family};
use ondo::run_kinds::StopReason;
use ondo::synth::{self, SynthOptions};

mod common;
use common::python;

/// Prompts are prefilled in chunks this long, alone and in the batch, so
/// the longer ones take several.
const PREFILL_STEP: usize = 16;

/// A window the longer prompts cross while prefilling, and the shorter
/// ones while decoding.
const SLIDING_WINDOW: usize = 24;

/// How synth writes a tiny model of `family`.
fn options(family: &'static Family) -> SynthOptions {
    SynthOptions {
        arch: family,
        sliding_window: SLIDING_WINDOW,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    }
}

/// A tiny model of `family`, written under `root`.
fn synthesize(root: &Path, family: &'static Family) -> PathBuf {
    let dir = root.join(family.model_type);
    synth::write_model(&options(family), &dir, &mut |_| {}).unwrap();
    dir
}

/// The tiny models of `family`, each with a name: as synth writes it, and
/// with routed experts too where the family has a mixture of its own
/// `model_type` that the plain model lacks (Gemma 4's: values that are the
/// keys, full layers with KV heads of their own, experts beside the dense
/// MLP, where the plain one has KV-shared layers and per-layer inputs).
fn variants(root: &Path, family: &'static Family) -> Vec<(String, PathBuf)> {
    let mut out = vec![(family.model_type.to_owned(), synthesize(root, family))];
    let plain = options(family);
    if plain.shape().experts.is_some() {
        return out;
    }
    let mixture = SynthOptions {
        experts: true,
        ..plain
    };
    let dir = root.join(format!("{}-experts", family.model_type));
    match synth::write_model(&mixture, &dir, &mut |_| {}) {
        Ok(_) => out.push((format!("{} with experts", family.model_type), dir)),
        Err(synth::SynthError::ExpertsUnavailable { .. }) => {}
        Err(error) => panic!("{} with experts: {error}", family.model_type),
    }
    out
}

/// A prompt of `n` ordinary token ids, different for each `seed`.
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13 + seed * 131) % 1900)
        .collect()
}

fn greedy() -> SamplerSettings {
    SamplerSettings::default()
}

fn sampled(seed: u64) -> SamplerSettings {
    SamplerSettings {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(seed),
        ..SamplerSettings::default()
    }
}

/// Greedy, but a repeated token less likely: without it, a tiny random
/// model mostly repeats the last token of its prompt.
fn greedy_penalized() -> SamplerSettings {
    SamplerSettings {
        repetition_penalty: Some(1.5),
        ..SamplerSettings::default()
    }
}

fn floats(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(mlx_rs::Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// Tokens and, for each, the log-probabilities it was drawn from.
#[derive(Default)]
struct Run {
    tokens: Vec<u32>,
    logprobs: Vec<Vec<f32>>,
}

/// `prompt` alone through `TokenSteps`, `tokens` long, on `cache`.
fn alone_on(
    model: &LoadedModel,
    cache: &mut [LayerCache],
    prompt: &[u32],
    settings: &SamplerSettings,
    tokens: usize,
) -> Run {
    let mut steps = TokenSteps::new(&model.model, cache, prompt)
        .unwrap()
        .with_prefill_step_size(PREFILL_STEP)
        .with_sampler(Sampler::new(settings.clone()).unwrap());
    let mut run = Run::default();
    for _ in 0..tokens {
        run.tokens.push(steps.next().unwrap().unwrap());
        run.logprobs.push(floats(steps.last_logprobs().unwrap()));
    }
    run
}

fn alone(
    model: &LoadedModel,
    prompt: &[u32],
    settings: &SamplerSettings,
    tokens: usize,
    max_kv_size: Option<usize>,
) -> Run {
    let mut cache = model.model.make_cache(max_kv_size, None);
    alone_on(model, &mut cache, prompt, settings, tokens)
}

/// One sequence of a batched run.
struct Plan {
    prompt: Vec<u32>,
    settings: SamplerSettings,
    max_tokens: usize,
    /// Joins before this step of the batch (0: before the first).
    joins_at: usize,
    /// Cancelled once it has this many tokens.
    cancel_after: Option<usize>,
}

impl Plan {
    fn new(prompt: Vec<u32>, settings: SamplerSettings, max_tokens: usize) -> Self {
        Self {
            prompt,
            settings,
            max_tokens,
            joins_at: 0,
            cancel_after: None,
        }
    }
}

/// How a sequence of a batched run went.
struct Batched {
    run: Run,
    reason: StopReason,
    cache: Vec<LayerCache>,
    /// The largest batch it was in.
    widest: usize,
}

/// The plans run together in one batch, each with its own sampler and
/// limits, joining and being cancelled as they say.
fn batched(model: &LoadedModel, plans: &[Plan], max_kv_size: Option<usize>) -> Vec<Batched> {
    let mut batch = Batch::new().with_prefill_step_size(PREFILL_STEP);
    let mut ids: HashMap<SequenceId, usize> = HashMap::new();
    let cancels: Vec<CancelToken> = plans.iter().map(|_| CancelToken::new()).collect();
    let mut runs: Vec<Run> = plans.iter().map(|_| Run::default()).collect();
    let mut done: Vec<Option<Batched>> = plans.iter().map(|_| None).collect();
    let last_join = plans.iter().map(|p| p.joins_at).max().unwrap_or(0);
    let mut step = 0;
    while step <= last_join || !batch.is_empty() {
        for (i, plan) in plans.iter().enumerate().filter(|(_, p)| p.joins_at == step) {
            let id = batch
                .join(NewSequence {
                    prompt: plan.prompt.clone(),
                    cache: model.model.make_cache(max_kv_size, None),
                    sampler: Sampler::new(plan.settings.clone()).unwrap(),
                    max_tokens: plan.max_tokens,
                    stop_tokens: Vec::new(),
                    cancel: Some(cancels[i].clone()),
                    prefill_step_size: None,
                    constraint: None,
                    images: None,
                })
                .unwrap();
            ids.insert(id, i);
        }
        for event in batch.step(&model.model).unwrap() {
            match event {
                BatchEvent::Token {
                    id,
                    token,
                    logprobs,
                } => {
                    let i = ids[&id];
                    runs[i].tokens.push(token);
                    runs[i].logprobs.push(floats(&logprobs));
                    if plans[i].cancel_after == Some(runs[i].tokens.len()) {
                        cancels[i].cancel();
                    }
                }
                BatchEvent::Finished(finished) => {
                    let i = ids[&finished.id];
                    assert_eq!(finished.generated, runs[i].tokens.len());
                    done[i] = Some(Batched {
                        run: std::mem::take(&mut runs[i]),
                        reason: finished.reason,
                        cache: finished.cache,
                        widest: finished.batch_sizes.iter().copied().max().unwrap_or(0),
                    });
                }
            }
        }
        step += 1;
        assert!(step < 1000, "the batch never drained");
    }
    done.into_iter()
        .map(|d| d.expect("every sequence finishes"))
        .collect()
}

/// The largest difference between two log-probability vectors.
fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vocabulary size");
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

/// How a batched run compared with the same sequence alone.
#[derive(Debug, Default)]
struct Comparison {
    /// The largest difference of a log-probability at any step compared.
    largest: f32,
    /// Where the tokens parted, at a near tie.
    parted_at: Option<usize>,
}

/// `ours` (a batched run) gives `alone`'s tokens, each drawn from
/// log-probabilities within `tolerance` of alone's, over `ours`' length;
/// a token may part at a near tie only, after which nothing is compared
/// (the two runs read different tokens from there on).
fn compare(alone: &Run, ours: &Run, tolerance: f32, what: &str) -> Comparison {
    assert!(
        ours.tokens.len() <= alone.tokens.len(),
        "{what}: more tokens than asked for"
    );
    let mut comparison = Comparison::default();
    for (i, (&ours_token, &alone_token)) in ours.tokens.iter().zip(&alone.tokens).enumerate() {
        let moved = largest_difference(&ours.logprobs[i], &alone.logprobs[i]);
        comparison.largest = comparison.largest.max(moved);
        assert!(
            moved <= tolerance,
            "{what}: step {i}'s log-probabilities moved by {moved:e} (allowed {tolerance:e})"
        );
        if ours_token != alone_token {
            let own = &alone.logprobs[i];
            let gap = f64::from(own[alone_token as usize] - own[ours_token as usize]);
            assert!(
                gap <= NEAR_TIE_ROUNDINGS * f64::from(moved),
                "{what}: token {i} is {ours_token} in the batch and {alone_token} alone, {gap:e} \
                 apart in log-probability where the batch moved them by {moved:e}: not a near tie"
            );
            comparison.parted_at = Some(i);
            break;
        }
    }
    comparison
}

/// Tokens each family's batch decodes per sequence.
const TOKENS: usize = 10;

/// For every family, and its mixture of experts where synth writes one
/// (`variants`): three prompts (5, 23 and 41 tokens: one within the
/// sliding window, two across it, prefilled in 1, 2 and 3 chunks) decoded
/// together give each one's tokens alone, the middle one sampled at a
/// temperature with its own seed, the longest greedy with a repetition
/// penalty. The families whose batched products round
/// exactly as single ones are held to exactly equal log-probabilities.
#[test]
fn every_family_decodes_a_batch_as_each_sequence_alone() {
    let root = tempfile::tempdir().unwrap();
    let mut report = Vec::new();
    let models = FAMILIES.iter().flat_map(|f| variants(root.path(), f));
    for (name, dir) in models {
        let model = LoadedModel::load(&dir).unwrap();
        let plans = [
            Plan::new(prompt(5, 0), greedy(), TOKENS),
            Plan::new(prompt(23, 1), sampled(7), TOKENS),
            Plan::new(prompt(41, 2), greedy_penalized(), TOKENS),
        ];
        let ours = batched(&model, &plans, None);
        for (i, (plan, ours)) in plans.iter().zip(&ours).enumerate() {
            let what = format!("{name} sequence {i}");
            assert_eq!(ours.reason, StopReason::MaxTokens, "{what}");
            assert_eq!(ours.run.tokens.len(), TOKENS, "{what}");
            assert_eq!(ours.widest, plans.len(), "{what}: decoded together");
            let reference = alone(&model, &plan.prompt, &plan.settings, TOKENS, None);
            let comparison = compare(&reference, &ours.run, exactness(&model), &what);
            report.push(format!("{what}: {comparison:?}"));
            // The cache it leaves with holds its prompt and every token fed
            // back (all but the last).
            let held = ours.cache.first().map_or(0, LayerCache::offset) as usize;
            assert_eq!(held, plan.prompt.len() + TOKENS - 1, "{what}");
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// How far a batched log-probability may be from its value alone: a few
/// float32 roundings for a model without sliding windows (exact where the
/// CPU's matrix product sums a batch's rows as it sums one row; on an
/// AVX-512 Xeon one step moved by one rounding, 9.5e-7). A sliding window's batched cache
/// rotates all rows alike, so a row whose window has turned holds its keys
/// in another order than alone, and attention sums them in that order: its
/// log-probabilities move by a few float32 roundings (1.2e-5 at most here),
/// and its tokens may part at a near tie.
fn exactness(model: &LoadedModel) -> f32 {
    let windowed = model
        .model
        .layer_caches()
        .iter()
        .any(|(window, _)| window.is_some());
    if windowed { 2e-5 } else { 4e-6 }
}

/// Sequence 1 joins while 0 decodes, 2 leaves at its `max_tokens`, 3 is
/// cancelled after 3 tokens, 4 joins after 2 and 3 have left; every
/// sequence's tokens equal its tokens alone (the cancelled one's up to
/// where it stopped), on llama, Qwen 3.5 (gated DeltaNet states beside
/// attention) and Gemma 3 (sliding windows). The one that left at its
/// `max_tokens` goes on alone from the cache it left with, as it would
/// have gone on in one run.
#[test]
fn joining_leaving_and_cancelled_sequences_leave_the_others_tokens_unchanged() {
    let root = tempfile::tempdir().unwrap();
    for family in [&family::LLAMA, &family::QWEN3_5, &family::GEMMA3_TEXT] {
        let dir = synthesize(root.path(), family);
        let model = LoadedModel::load(&dir).unwrap();
        let plans = [
            Plan::new(prompt(30, 0), sampled(3), 16),
            Plan {
                joins_at: 4,
                ..Plan::new(prompt(45, 1), greedy_penalized(), 8)
            },
            Plan::new(prompt(9, 2), sampled(11), 3),
            Plan {
                cancel_after: Some(3),
                ..Plan::new(prompt(17, 3), greedy(), 12)
            },
            Plan {
                joins_at: 9,
                ..Plan::new(prompt(12, 4), sampled(5), 5)
            },
        ];
        let ours = batched(&model, &plans, None);
        let reasons: Vec<StopReason> = ours.iter().map(|b| b.reason).collect();
        use StopReason::{Cancelled, MaxTokens};
        assert_eq!(
            reasons,
            [MaxTokens, MaxTokens, MaxTokens, Cancelled, MaxTokens],
            "{}",
            family.model_type
        );
        assert_eq!(ours[3].run.tokens.len(), 3, "cancelled after 3 tokens");
        for (i, (plan, ours)) in plans.iter().zip(&ours).enumerate() {
            let what = format!("{} sequence {i}", family.model_type);
            let reference = alone(&model, &plan.prompt, &plan.settings, plan.max_tokens, None);
            compare(&reference, &ours.run, exactness(&model), &what);
        }
        // Sequence 2 left with its prompt and its first two tokens cached:
        // fed its third, it goes on as a run of all of them alone does (to
        // within rounding: the run alone prefills what the batch decoded).
        let Batched { run, mut cache, .. } = ours.into_iter().nth(2).unwrap();
        assert_eq!(
            cache[0].offset() as usize,
            plans[2].prompt.len() + 2,
            "{}",
            family.model_type
        );
        let going_on = alone_on(&model, &mut cache, &run.tokens[2..], &greedy(), 4);
        let whole = [plans[2].prompt.clone(), run.tokens.clone()].concat();
        let fresh = alone(&model, &whole, &greedy(), 4, None);
        compare(
            &fresh,
            &going_on,
            1e-4,
            &format!("{} going on alone", family.model_type),
        );
    }
}

/// A KV cache bounded by `max_kv_size` (keeping the first 4 tokens and
/// the latest) batches as it runs alone: prompts on both sides of the
/// bound, decoded past it. Every layer's cache rotates, so log-probabilities
/// move by roundings as a sliding window's do (`exactness`).
#[test]
fn bounded_caches_batch_as_they_run_alone() {
    let root = tempfile::tempdir().unwrap();
    let dir = synthesize(root.path(), &family::LLAMA);
    let model = LoadedModel::load(&dir).unwrap();
    let bound = Some(20);
    let plans = [
        Plan::new(prompt(6, 0), sampled(1), 24),
        Plan::new(prompt(31, 1), greedy(), 24),
        Plan {
            joins_at: 5,
            ..Plan::new(prompt(14, 2), sampled(2), 12)
        },
    ];
    let ours = batched(&model, &plans, bound);
    for (i, (plan, ours)) in plans.iter().zip(&ours).enumerate() {
        let reference = alone(&model, &plan.prompt, &plan.settings, plan.max_tokens, bound);
        let comparison = compare(
            &reference,
            &ours.run,
            1e-5,
            &format!("bounded sequence {i}"),
        );
        eprintln!("bounded sequence {i}: {comparison:?}");
    }
}

/// mlx-lm's greedy tokens and log-probabilities for `prompts` decoded
/// together by its `BatchGenerator`.
fn mlx_lm_batched(
    python: &Path,
    dir: &Path,
    prompts: &[Vec<u32>],
    tokens: usize,
    scratch: &Path,
) -> Vec<Run> {
    let logprobs_file = scratch.join("batch-logprobs.json");
    let output = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mlx_lm_batch_generate.py"))
        .arg(dir)
        .args(["--prompts", &serde_json::to_string(prompts).unwrap()])
        .args(["--max-tokens", &tokens.to_string()])
        .arg("--logprobs-out")
        .arg(&logprobs_file)
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "mlx-lm batch: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let ids: Vec<Vec<u32>> = serde_json::from_value(value["generated_ids"].clone()).unwrap();
    let logprobs: Vec<Vec<Vec<f32>>> =
        serde_json::from_slice(&std::fs::read(&logprobs_file).unwrap()).unwrap();
    ids.into_iter()
        .zip(logprobs)
        .map(|(tokens, logprobs)| Run { tokens, logprobs })
        .collect()
}

/// Ondo's batch and mlx-lm's `BatchGenerator` decode the same three
/// prompts to the same greedy tokens from log-probabilities within 1e-5,
/// for llama and for Qwen 3.5 (gated DeltaNet layers, whose states mlx-lm
/// masks while it prefills the prompts together, and Ondo prefills alone).
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_batch_decodes_as_mlx_lms_batch_generator() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for family in [&family::LLAMA, &family::QWEN3_5] {
        let dir = synthesize(root.path(), family);
        let model = LoadedModel::load(&dir).unwrap();
        let prompts = vec![prompt(5, 0), prompt(23, 1), prompt(41, 2)];
        let reference = mlx_lm_batched(&python, &dir, &prompts, TOKENS, root.path());
        let plans: Vec<Plan> = prompts
            .iter()
            .map(|p| Plan::new(p.clone(), greedy(), TOKENS))
            .collect();
        let ours = batched(&model, &plans, None);
        for (i, (theirs, ours)) in reference.iter().zip(&ours).enumerate() {
            let what = format!("{} sequence {i} against mlx-lm", family.model_type);
            assert_eq!(ours.run.tokens, theirs.tokens, "{what}");
            let comparison = compare(theirs, &ours.run, 1e-5, &what);
            eprintln!("{what}: {comparison:?}");
        }
    }
}
