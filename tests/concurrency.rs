//! Several clients at once on one engine: requests that arrive together
//! share a batch and each answers exactly as it would alone, a cancelled
//! one leaves the others' tokens unchanged, a request for another model
//! waits for the batch to drain, one whose KV cache does not fit the
//! memory budget waits for room, and every run's record says what it
//! shared and what it waited for.

use std::path::Path;
use std::sync::Barrier;

use ondo::engine::chat_template::ChatMessage;
use ondo::engine::sample::SamplerSettings;
use ondo::engine::stats::BatchShare;
use ondo::engine::stream::RunOutcome;
use ondo::engine::{CancelToken, GenerateRequest, Prompt, RunEvent};
use ondo::run_kinds::{RunKind, StopReason};
use ondo::session::record::RunContext;
use ondo::session::{PoolSettings, SessionPool};
use ondo::store::{RunQuery, RunRecord, Store};
use ondo::synth::{self, SynthOptions};
use ondo_os::PressureLevel;

fn tiny(dir: &Path, seed: u64) {
    let options = SynthOptions {
        seed,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, dir, &mut |_| {}).unwrap();
}

fn pool(root: &Path, settings: PoolSettings) -> SessionPool {
    let store = Store::open_default(&root.join("ondo")).unwrap();
    SessionPool::start_with_pressure_source(
        settings,
        Some(store),
        Box::new(|| PressureLevel::Normal),
    )
    .unwrap()
}

fn context() -> RunContext {
    RunContext {
        kind: RunKind::Api,
        model_id: "tiny".into(),
        ..RunContext::default()
    }
}

/// A chat request on `dir`, `tokens` long whatever the model draws, in a
/// batch of at most `max_batch`.
fn request(dir: &Path, text: &str, tokens: usize, max_batch: usize) -> GenerateRequest {
    GenerateRequest {
        max_tokens: tokens,
        ignore_eos: true,
        max_batch,
        ..GenerateRequest::new(
            dir,
            Prompt::chat(None, vec![ChatMessage::user(text.to_owned())]),
        )
    }
}

/// The prompts of the tests: different lengths, so the rows of a batch sit
/// at different positions.
const PROMPTS: [&str; 4] = [
    "hi",
    "What is the weather like on the coast today, and tomorrow?",
    "Tell me a story about a cat who learned to sail across a lake at night.",
    "List three colours.",
];

/// Each request alone (a batch of 1), one after another.
fn alone(pool: &SessionPool, requests: &[GenerateRequest]) -> Vec<RunOutcome> {
    requests
        .iter()
        .map(|r| {
            let request = GenerateRequest {
                max_batch: 1,
                ..r.clone()
            };
            pool.run(request, context(), CancelToken::new(), |_| {})
                .unwrap()
                .0
        })
        .collect()
}

/// The requests sent at once from their own threads; each one's outcome
/// (or error) and record, in the requests' order. `cancel_after` cancels
/// request `i` once it has `n` tokens.
fn together(
    pool: &SessionPool,
    requests: &[GenerateRequest],
    cancel_after: Option<(usize, usize)>,
) -> Vec<(RunOutcome, RunRecord)> {
    let start = Barrier::new(requests.len());
    std::thread::scope(|scope| {
        let runs: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let start = &start;
                scope.spawn(move || {
                    let cancel = CancelToken::new();
                    let mine = cancel.clone();
                    let mut seen = 0;
                    start.wait();
                    pool.run(request.clone(), context(), cancel, move |event| {
                        if let RunEvent::Delta { token_ids, .. } = event {
                            seen += token_ids.len();
                            if cancel_after.is_some_and(|(who, n)| who == i && seen >= n) {
                                mine.cancel();
                            }
                        }
                    })
                    .unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// The records of the runs that waited to join the batch.
fn waited(runs: &[(RunOutcome, RunRecord)]) -> Vec<&RunRecord> {
    runs.iter()
        .map(|(_, r)| r)
        .filter(|r| r.waited_for.is_some())
        .collect()
}

fn share(record: &RunRecord) -> (u64, u64) {
    (
        record
            .batch_min_rows
            .expect("a batched run records its batch"),
        record
            .batch_max_rows
            .expect("a batched run records its batch"),
    )
}

#[test]
fn requests_sent_together_share_a_batch_and_each_answers_as_it_would_alone() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("tiny");
    tiny(&model, 1);
    let pool = pool(root.path(), PoolSettings::default());
    let mut requests: Vec<GenerateRequest> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, text)| request(&model, text, 48 + 8 * i, 8))
        .collect();
    // One samples at a temperature with a seed of its own.
    requests[2].sampler = SamplerSettings {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(7),
        ..SamplerSettings::default()
    };
    let expected = alone(&pool, &requests);
    let runs = together(&pool, &requests, None);
    for (i, ((outcome, record), alone)) in runs.iter().zip(&expected).enumerate() {
        assert_eq!(
            outcome.token_ids, alone.token_ids,
            "request {i} in a batch differs from the same request alone"
        );
        assert_eq!(outcome.text, alone.text);
        assert_eq!(outcome.stats.stop_reason, StopReason::MaxTokens);
        assert!(alone.stats.batch.is_none(), "a batch of 1 runs alone");
        assert!(outcome.stats.batch.is_some());
        let (min, max) = share(record);
        assert!(min >= 1 && max <= 4, "request {i}: rows {min}..{max}");
    }
    let widest = runs.iter().map(|(_, r)| share(r).1).max().unwrap();
    assert!(widest >= 2, "no two requests ever shared a step");
    // The history keeps what each run shared.
    let stored = pool
        .with_store(|store| store.runs(&RunQuery::default()).unwrap())
        .unwrap();
    let batched: Vec<&RunRecord> = stored
        .iter()
        .filter(|r| r.batch_max_rows.is_some())
        .collect();
    assert_eq!(batched.len(), requests.len());
    assert!(batched.iter().any(|r| r.batch_max_rows >= Some(2)));
    assert_eq!(
        stored.iter().filter(|r| r.batch_max_rows.is_none()).count(),
        requests.len(),
        "the runs alone record no batch"
    );
}

#[test]
fn a_request_cancelled_in_a_batch_leaves_the_others_tokens_unchanged() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("tiny");
    tiny(&model, 2);
    let pool = pool(root.path(), PoolSettings::default());
    let requests: Vec<GenerateRequest> = PROMPTS
        .iter()
        .map(|text| request(&model, text, 64, 8))
        .collect();
    let expected = alone(&pool, &requests);
    let runs = together(&pool, &requests, Some((1, 5)));
    let (cancelled, _) = &runs[1];
    assert_eq!(cancelled.stats.stop_reason, StopReason::Cancelled);
    assert!(cancelled.token_ids.len() < 64);
    assert_eq!(
        cancelled.token_ids[..],
        expected[1].token_ids[..cancelled.token_ids.len()],
        "the cancelled request's tokens before it left are its own"
    );
    for i in [0, 2, 3] {
        assert_eq!(runs[i].0.token_ids, expected[i].token_ids, "request {i}");
        assert_eq!(runs[i].0.stats.stop_reason, StopReason::MaxTokens);
    }
}

#[test]
fn a_request_for_another_model_waits_for_the_batch_to_drain() {
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (root.path().join("first"), root.path().join("second"));
    tiny(&first, 3);
    tiny(&second, 4);
    let pool = pool(root.path(), PoolSettings::default());
    let requests = [
        request(&first, PROMPTS[1], 200, 8),
        request(&second, PROMPTS[0], 16, 8),
    ];
    let expected = alone(&pool, &requests);
    let runs = together(&pool, &requests, None);
    for (i, ((outcome, _), alone)) in runs.iter().zip(&expected).enumerate() {
        assert_eq!(outcome.token_ids, alone.token_ids, "request {i}");
    }
    // Whichever came first, the other waited for its model's batch to end
    // and never shared a step with it.
    let waited = waited(&runs);
    assert_eq!(waited.len(), 1, "exactly one waited");
    assert_eq!(waited[0].waited_for.as_deref(), Some("another_model"));
    assert!(waited[0].admission_wait_ms.unwrap() > 0.0);
    assert!(runs.iter().all(|(_, r)| share(r) == (1, 1)));
}

#[test]
fn a_request_for_a_cache_quantized_otherwise_waits_for_the_batch_to_drain() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("tiny");
    tiny(&model, 6);
    let pool = pool(root.path(), PoolSettings::default());
    let quantized = GenerateRequest {
        kv_bits: Some(8),
        kv_group_size: 32,
        quantized_kv_start: 0,
        ..request(&model, PROMPTS[0], 16, 8)
    };
    let requests = [request(&model, PROMPTS[1], 200, 8), quantized];
    let expected = alone(&pool, &requests);
    let runs = together(&pool, &requests, None);
    for (i, ((outcome, _), alone)) in runs.iter().zip(&expected).enumerate() {
        assert_eq!(outcome.token_ids, alone.token_ids, "request {i}");
    }
    let waited = waited(&runs);
    assert_eq!(waited.len(), 1, "exactly one waited");
    assert_eq!(waited[0].waited_for.as_deref(), Some("kv_settings"));
    assert_eq!(runs[1].1.kv_bits, Some(8));
    assert_eq!(runs[0].1.kv_bits, None);
    assert!(runs.iter().all(|(_, r)| share(r) == (1, 1)));
}

#[test]
fn a_request_whose_cache_does_not_fit_the_budget_waits_for_room() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("tiny");
    tiny(&model, 5);
    // Room for the weights and a few hundred positions of KV cache (the
    // tiny model's are 2 KiB each), not for four thousand.
    let weights = {
        let pool = pool(root.path(), PoolSettings::default());
        let request = request(&model, PROMPTS[0], 1, 1);
        pool.run(request, context(), CancelToken::new(), |_| {})
            .unwrap()
            .0
            .stats
            .weights_bytes
    };
    let budget = weights + 2 * 1024 * 1024;
    let pool = pool(
        root.path(),
        PoolSettings {
            memory_budget_bytes: Some(budget),
            ..PoolSettings::default()
        },
    );
    let small = request(&model, PROMPTS[1], 300, 8);
    let large = request(&model, PROMPTS[3], 4000, 8);
    // The large one must arrive second: send the small one, then the large
    // once the small one has its first token.
    let first_token = std::sync::mpsc::channel::<()>();
    let (small_run, large_run) = std::thread::scope(|scope| {
        let pool = &pool;
        let tell = first_token.0;
        let small_run = scope.spawn(move || {
            let mut told = false;
            pool.run(small, context(), CancelToken::new(), move |event| {
                if !told && matches!(event, RunEvent::Delta { .. }) {
                    told = true;
                    let _ = tell.send(());
                }
            })
            .unwrap()
        });
        first_token.1.recv().unwrap();
        let large_run = pool
            .run(large, context(), CancelToken::new(), |_| {})
            .unwrap();
        (small_run.join().unwrap(), large_run)
    });
    let (small_outcome, small_record) = small_run;
    let (large_outcome, large_record) = large_run;
    assert_eq!(small_outcome.token_ids.len(), 300);
    assert_eq!(large_outcome.token_ids.len(), 4000);
    assert_eq!(large_record.waited_for.as_deref(), Some("memory"));
    assert!(large_record.admission_wait_ms.unwrap() > 0.0);
    assert_eq!(share(&small_record), (1, 1), "nobody joined the small one");
    let words = large_outcome.stats.batch.as_ref().map(BatchShare::describe);
    assert!(
        words.as_deref().is_some_and(|w| w.contains("for memory")),
        "{words:?}"
    );
}

#[test]
fn a_long_prompt_joining_a_decoding_batch_is_prefilled_in_chunks_between_its_steps() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("tiny");
    tiny(&model, 6);
    let pool = pool(root.path(), PoolSettings::default());
    let decoding = request(&model, PROMPTS[1], 600, 8);
    let long = GenerateRequest {
        max_tokens: 4,
        ignore_eos: true,
        max_batch: 8,
        ..GenerateRequest::new(
            &model,
            Prompt::Tokens {
                ids: (0..1500u32).map(|i| (i * 7 + 3) % 2000 + 10).collect(),
            },
        )
    };
    let first_token = std::sync::mpsc::channel::<()>();
    let (decoding_run, long_run) = std::thread::scope(|scope| {
        let pool = &pool;
        let tell = first_token.0;
        let decoding_run = scope.spawn(move || {
            let mut told = false;
            pool.run(decoding, context(), CancelToken::new(), move |event| {
                if !told && matches!(event, RunEvent::Delta { .. }) {
                    told = true;
                    let _ = tell.send(());
                }
            })
            .unwrap()
        });
        first_token.1.recv().unwrap();
        let long_run = pool
            .run(long, context(), CancelToken::new(), |_| {})
            .unwrap();
        (decoding_run.join().unwrap(), long_run)
    });
    let share = long_run.0.stats.batch.clone().unwrap();
    // Every chunk ran between the other's decode steps, none larger than
    // the budget: at least three for 1,499 tokens.
    assert_eq!(share.interleaved_chunks, share.prefill_chunks, "{share:?}");
    let budget = ondo::engine::batch::PREFILL_BUDGET;
    assert!(
        share.prefill_chunks >= 1499usize.div_ceil(budget),
        "{share:?}"
    );
    assert_eq!(share.max_rows, 2, "{share:?}");
    assert_eq!(long_run.0.token_ids.len(), 4);
    assert_eq!(decoding_run.0.token_ids.len(), 600);
    let record = &decoding_run.1;
    assert_eq!(record.interleaved_chunks, Some(0));
    assert_eq!(record.batch_max_rows, Some(2));
}
