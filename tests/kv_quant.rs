//! A KV cache held in 4 or 8 bits (`kv_bits`, `kv_group_size`,
//! `quantized_kv_start`) gives mlx-lm's greedy tokens and, at every step,
//! its log-probabilities: the same switch to the quantized cache at the
//! same token, the same quantized attention. (A tiny random model's greedy
//! tokens barely move, so the log-probabilities are what tells a
//! quantized cache from a float one.)
//! Rows with a quantized cache decoded in one batch give what each gives
//! alone (mlx-lm cannot batch quantized caches; Ondo can).

use std::path::{Path, PathBuf};
use std::process::Command;

use ondo::engine::batch::{Batch, BatchEvent, NewSequence};
use ondo::engine::cache::{KvQuantization, LayerCache};
use ondo::engine::generate::TokenSteps;
use ondo::engine::load::LoadedModel;
use ondo::engine::sample::{Sampler, SamplerSettings};
use ondo::synth::{self, SynthOptions};

mod common;
use common::python;

/// Prompt tokens per prefill pass, here and in mlx-lm: the prompts below
/// take several, so a start inside the prompt switches between chunks.
const PREFILL_STEP: usize = 32;

/// The tiny preset (float32, head dimension 64, grouped-query attention)
/// written under `root`.
fn tiny(root: &Path) -> PathBuf {
    let dir = root.join("tiny");
    let options = SynthOptions::for_preset(synth::preset_named("tiny").unwrap());
    synth::write_model(&options, &dir, &mut |_| {}).unwrap();
    dir
}

/// A prompt of `n` ordinary token ids, different for each `seed`.
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13 + seed * 131) % 1900)
        .collect()
}

/// Greedy ids, each step's log-probabilities, and the cache classes a
/// run ended with (mlx-lm's names).
struct Generated {
    ids: Vec<u32>,
    logprobs: Vec<Vec<f32>>,
    classes: String,
}

/// mlx-lm's greedy run.
fn mlx_lm(dir: &Path, ids: &[u32], tokens: usize, q: KvQuantization) -> Generated {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mlx_lm_generate.py");
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let logits = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(python())
        .arg(script)
        .arg(dir)
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--max-tokens", &tokens.to_string()])
        .args(["--prefill-step-size", &PREFILL_STEP.to_string()])
        .args(["--kv-bits", &q.bits.to_string()])
        .args(["--kv-group-size", &q.group_size.to_string()])
        .args(["--quantized-kv-start", &q.start.to_string()])
        .arg("--all-logits-out")
        .arg(logits.path())
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "mlx-lm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let generated = value["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let logprobs = serde_json::from_slice(&std::fs::read(logits.path()).unwrap()).unwrap();
    Generated {
        ids: generated,
        logprobs,
        classes: value["kv_cache"].as_str().unwrap_or("").to_owned(),
    }
}

/// Ondo's greedy run through `TokenSteps`, its cache quantized by `q`
/// (`None`: floats); the classes say whether every layer ended quantized.
fn ondo(model: &LoadedModel, ids: &[u32], tokens: usize, q: Option<KvQuantization>) -> Generated {
    let mut cache = model.model.make_cache(None, q);
    let mut steps = TokenSteps::new(&model.model, &mut cache, ids)
        .unwrap()
        .with_prefill_step_size(PREFILL_STEP);
    let mut generated = Generated {
        ids: Vec::new(),
        logprobs: Vec::new(),
        classes: String::new(),
    };
    for _ in 0..tokens {
        generated.ids.push(steps.next().unwrap().unwrap());
        let logprobs = steps.last_logprobs().unwrap();
        logprobs.eval().unwrap();
        generated.logprobs.push(logprobs.as_slice::<f32>().to_vec());
    }
    drop(steps);
    generated.classes = if all_quantized(&cache) {
        "QuantizedKVCache".into()
    } else {
        "floats".into()
    };
    generated
}

/// The largest difference between two runs' log-probabilities, over every
/// step and the whole vocabulary.
fn largest_difference(a: &Generated, b: &Generated) -> f32 {
    assert_eq!(a.logprobs.len(), b.logprobs.len(), "steps");
    a.logprobs
        .iter()
        .zip(&b.logprobs)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len(), "vocabulary");
            a.iter().zip(b).map(|(x, y)| (x - y).abs())
        })
        .fold(0.0, f32::max)
}

/// How far Ondo's log-probabilities may be from mlx-lm's with a float
/// cache: float32 roundings (about 2e-6 here: Ondo fuses some operations
/// mlx-lm does apart, and its matrix products run on another BLAS).
const TOLERANCE: f32 = 1e-4;

/// The same with a quantized cache, which can amplify those roundings: an
/// element that lands on the other side of a quantization step than
/// mlx-lm's moves a log-probability by that step's effect (1.3e-4 here at
/// 8 bits from the first position), still far below what quantizing moves
/// them (over 5e-3 from the float cache's, checked below).
const QUANTIZED_TOLERANCE: f32 = 4e-4;

fn all_quantized(cache: &[LayerCache]) -> bool {
    cache.iter().all(|l| matches!(l, LayerCache::Quantized(_)))
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn greedy_tokens_with_a_quantized_cache_equal_mlx_lms() {
    let root = tempfile::tempdir().unwrap();
    let dir = tiny(root.path());
    let model = LoadedModel::load(&dir).unwrap();
    let ids = prompt(90, 0);
    const TOKENS: usize = 12;
    let float = ondo(&model, &ids, TOKENS, None);
    // mlx-lm with a start it never reaches: its float cache, the baseline
    // the quantized runs are held to.
    let never = KvQuantization {
        bits: 8,
        group_size: 64,
        start: 100_000,
    };
    let float_reference = mlx_lm(&dir, &ids, TOKENS, never);
    assert_eq!(float_reference.classes, "KVCache");
    let baseline = largest_difference(&float, &float_reference);
    eprintln!("floats: {baseline:e} from mlx-lm");
    assert!(baseline <= TOLERANCE, "floats: {baseline:e} from mlx-lm's");
    // From the start (the first chunk attends in floats, then the cache is
    // quantized), from inside the prompt (after its second chunk), and
    // from inside the reply (a decode step switches).
    for (bits, start) in [(4, 0), (8, 0), (4, 40), (8, 40), (4, 95)] {
        let q = KvQuantization {
            bits,
            group_size: 64,
            start,
        };
        let what = format!("{bits} bits from {start}");
        let reference = mlx_lm(&dir, &ids, TOKENS, q);
        assert!(
            reference.classes.contains("QuantizedKVCache"),
            "{what}: {}",
            reference.classes
        );
        let ours = ondo(&model, &ids, TOKENS, Some(q));
        assert_eq!(
            ours.classes, "QuantizedKVCache",
            "{what}: Ondo's cache is quantized"
        );
        assert_eq!(
            ours.ids, reference.ids,
            "{what}: Ondo's greedy tokens equal mlx-lm's"
        );
        let difference = largest_difference(&ours, &reference);
        assert!(
            difference <= QUANTIZED_TOLERANCE,
            "{what}: log-probabilities {difference:e} from mlx-lm's"
        );
        // The quantized cache moves them far more than that from floats.
        let moved = largest_difference(&ours, &float);
        eprintln!("{what}: {difference:e} from mlx-lm, {moved:e} from floats");
        assert!(
            moved > 10.0 * QUANTIZED_TOLERANCE,
            "{what}: only {moved:e} from the float cache's"
        );
    }
    // Groups of 32 too.
    let q = KvQuantization {
        bits: 4,
        group_size: 32,
        start: 10,
    };
    let reference = mlx_lm(&dir, &ids, TOKENS, q);
    let ours = ondo(&model, &ids, TOKENS, Some(q));
    assert_eq!(ours.ids, reference.ids, "groups of 32");
    assert!(
        largest_difference(&ours, &reference) <= TOLERANCE,
        "groups of 32"
    );
}

fn floats(a: &mlx_rs::Array) -> Vec<f32> {
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// How far a batched row's log-probabilities may be from its own alone.
/// Its quantized keys and values are the same bits either way (positions
/// are quantized on their own, padding is masked), so only the order of
/// a sum over more keys can differ.
const BATCH_TOLERANCE: f32 = 1e-5;

#[test]
fn quantized_rows_decoded_in_one_batch_equal_each_row_alone() {
    let root = tempfile::tempdir().unwrap();
    let dir = tiny(root.path());
    let model = LoadedModel::load(&dir).unwrap();
    const TOKENS: usize = 10;
    for bits in [4, 8] {
        let q = KvQuantization {
            bits,
            group_size: 64,
            start: 0,
        };
        let prompts = [prompt(5, 1), prompt(23, 2), prompt(41, 3)];
        let mut batch = Batch::new().with_prefill_step_size(16);
        let mut ids = Vec::new();
        for p in &prompts {
            ids.push(
                batch
                    .join(NewSequence {
                        prompt: p.clone(),
                        cache: model.model.make_cache(None, Some(q)),
                        sampler: Sampler::new(SamplerSettings::default()).unwrap(),
                        max_tokens: TOKENS,
                        stop_tokens: Vec::new(),
                        cancel: None,
                        prefill_step_size: None,
                        constraint: None,
                        images: None,
                    })
                    .unwrap(),
            );
        }
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
        let mut logprobs: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
        let mut widest = vec![0; prompts.len()];
        let mut caches: Vec<Option<Vec<LayerCache>>> = (0..prompts.len()).map(|_| None).collect();
        let mut steps = 0;
        while !batch.is_empty() {
            for event in batch.step(&model.model).unwrap() {
                match event {
                    BatchEvent::Token {
                        id,
                        token,
                        logprobs: drawn_from,
                    } => {
                        let row = ids.iter().position(|&i| i == id).unwrap();
                        tokens[row].push(token);
                        logprobs[row].push(floats(&drawn_from));
                    }
                    BatchEvent::Finished(finished) => {
                        let row = ids.iter().position(|&i| i == finished.id).unwrap();
                        widest[row] = finished.batch_sizes.iter().copied().max().unwrap_or(0);
                        caches[row] = Some(finished.cache);
                    }
                }
            }
            steps += 1;
            assert!(steps < 200, "the batch never drained");
        }
        for (row, p) in prompts.iter().enumerate() {
            let what = format!("{bits} bits, row {row}");
            assert_eq!(widest[row], prompts.len(), "{what}: decoded together");
            let mut cache = model.model.make_cache(None, Some(q));
            let mut steps = TokenSteps::new(&model.model, &mut cache, p)
                .unwrap()
                .with_prefill_step_size(16);
            let mut alone = Vec::new();
            for (step, batched) in logprobs[row].iter().enumerate() {
                alone.push(steps.next().unwrap().unwrap());
                let own = floats(steps.last_logprobs().unwrap());
                let moved = batched
                    .iter()
                    .zip(&own)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    moved <= BATCH_TOLERANCE,
                    "{what}: step {step}'s log-probabilities moved {moved:e} in the batch"
                );
            }
            assert_eq!(tokens[row], alone, "{what}: the batch's tokens are its own");
            let left_with = caches[row].take().unwrap();
            assert!(all_quantized(&left_with), "{what}");
            assert_eq!(
                left_with[0].offset() as usize,
                p.len() + TOKENS - 1,
                "{what}: the cache it leaves with holds its prompt and its tokens"
            );
        }
    }
}

/// A conversation keeps its cache while the KV settings stay; a request
/// asking for other bits (or none) starts it over, as a different
/// `max_kv_size` does; a head dimension the group size does not divide is
/// refused with a message that says so.
#[test]
fn a_conversation_asked_for_other_kv_settings_starts_over() {
    use ondo::engine::stream::{self, Conversation, RunSetting};
    use ondo::engine::{CancelToken, GenerateRequest, Prompt};
    let root = tempfile::tempdir().unwrap();
    let dir = tiny(root.path());
    let model = LoadedModel::load(&dir).unwrap();
    let first = prompt(40, 0);
    let request = |ids: Vec<u32>, kv_bits: Option<u8>| GenerateRequest {
        kv_bits,
        quantized_kv_start: 0,
        max_tokens: 3,
        ..GenerateRequest::new(&dir, Prompt::Tokens { ids })
    };
    let eight = request(first.clone(), Some(8));
    let mut conversation = Conversation::new(&model, None, eight.kv_quantization());
    let setting = RunSetting {
        load_kind: ondo::run_kinds::LoadKind::Warm,
        load_ms: 0.0,
        accepted_at: std::time::Instant::now(),
        batch: None,
    };
    let outcome = stream::run(
        &model,
        &mut conversation,
        &eight,
        setting,
        None,
        &CancelToken::new(),
        &mut |_| {},
    )
    .unwrap();
    assert!(all_quantized(&conversation.cache));
    assert!(outcome.stats.kv_cache_bytes > 0);
    let longer = [first.clone(), prompt(5, 9)].concat();
    let same = stream::prepare(
        &model,
        &mut conversation,
        &request(longer.clone(), Some(8)),
        None,
    );
    assert_eq!(
        same.unwrap().cached,
        first.len(),
        "the same settings reuse the prefix"
    );
    let other = stream::prepare(
        &model,
        &mut conversation,
        &request(longer.clone(), Some(4)),
        None,
    );
    assert_eq!(other.unwrap().cached, 0, "other bits start over");
    assert_eq!(conversation.kv_quantization.map(|q| q.bits), Some(4));
    let floats = stream::prepare(
        &model,
        &mut conversation,
        &request(longer.clone(), None),
        None,
    );
    assert_eq!(floats.unwrap().cached, 0);
    assert!(conversation.kv_quantization.is_none());
    let odd = GenerateRequest {
        kv_group_size: 128,
        ..request(longer, Some(4))
    };
    let Err(error) = stream::prepare(&model, &mut conversation, &odd, None) else {
        panic!("groups of 128 cannot split a head of 64");
    };
    assert!(error.to_string().contains("head dimension 64"), "{error}");
}
