//! The session pool and the run history as a user meets them: a second turn
//! is warm and reuses the conversation's cache, idle models go after their
//! keep-alive, the memory budget evicts the least recently used, pressure
//! gives memory back, every run lands in SQLite with its memory timeline, and
//! a benchmark killed half-way leaves every finished run readable.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use ondo::engine::chat_template::ChatMessage;
use ondo::engine::{CancelToken, GenerateRequest, Prompt, RunEvent};
use ondo::run_kinds::{LoadKind, RunKind, StopReason};
use ondo::session::record::RunContext;
use ondo::session::{KeepAlive, PoolSettings, SessionPool};
use ondo::store::{RunQuery, Store};
use ondo::synth::{self, SynthOptions};
use ondo_os::PressureLevel;

fn tiny(dir: &Path, seed: u64) {
    let options = SynthOptions {
        seed,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, dir, &mut |_| {}).unwrap();
}

fn chat_request(dir: &Path, conversation: &str, messages: Vec<ChatMessage>) -> GenerateRequest {
    GenerateRequest {
        max_tokens: 8,
        conversation: Some(conversation.to_owned()),
        ..GenerateRequest::new(dir, Prompt::chat(None, messages))
    }
}

fn context(model: &str) -> RunContext {
    RunContext {
        kind: RunKind::Chat,
        model_id: model.into(),
        ..RunContext::default()
    }
}

/// A pool that sees normal memory pressure whatever the machine is doing:
/// a busy test machine must not trim caches in tests about something else.
fn pool_with(root: &Path, settings: PoolSettings) -> SessionPool {
    let store = Store::open_default(&root.join("ondo")).unwrap();
    SessionPool::start_with_pressure_source(
        settings,
        Some(store),
        Box::new(|| PressureLevel::Normal),
    )
    .unwrap()
}

fn actions(pool: &SessionPool) -> Vec<(String, String)> {
    pool.events()
        .into_iter()
        .map(|e| (e.action, e.reason))
        .collect()
}

/// A pool that reads the pressure level from `level` (0 normal, 1 warning,
/// 2 critical), which the test turns.
fn pool_under(root: &Path, settings: PoolSettings, level: &Arc<AtomicU8>) -> SessionPool {
    let level = level.clone();
    let store = Store::open_default(&root.join("ondo")).unwrap();
    SessionPool::start_with_pressure_source(
        settings,
        Some(store),
        Box::new(move || match level.load(Ordering::SeqCst) {
            0 => PressureLevel::Normal,
            1 => PressureLevel::Warning,
            _ => PressureLevel::Critical,
        }),
    )
    .unwrap()
}

/// Checks the pool's pressure now and waits until `done` holds: the pool's
/// own background check may be the one that acts on a new level, and it
/// finishes on its own time (longer on a busy machine).
fn tick_until(pool: &SessionPool, what: &str, done: impl Fn(&SessionPool) -> bool) {
    pool.tick();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(pool) {
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {:?}",
            actions(pool)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_turn_is_warm_and_reuses_the_conversation_cache() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let pool = pool_with(root.path(), PoolSettings::default());
    let mut messages = vec![ChatMessage::user("Tell me about the sea.")];
    let (first, first_record) = pool
        .run(
            chat_request(&dir, "c1", messages.clone()),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(first_record.load_kind, LoadKind::Cold);
    assert!(first.stats.load_ms > 0.0);
    messages.push(ChatMessage::assistant(first.text));
    messages.push(ChatMessage::user("And the sky?"));
    let (second, second_record) = pool
        .run(
            chat_request(&dir, "c1", messages),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(second_record.load_kind, LoadKind::Warm);
    assert_eq!(second.stats.load_ms, 0.0);
    assert!(second.stats.cached_tokens > 0, "no cache reuse");
    assert_eq!(
        second.stats.cached_tokens + second.stats.prefill_tokens,
        second.stats.prompt_tokens
    );
    let acts = actions(&pool);
    assert_eq!(acts[0], ("load".into(), "first use".into()));
    assert_eq!(acts[1].0, "hit");

    // Both runs are in the history, with provenance and a memory timeline.
    let runs = pool
        .with_store(|s| {
            s.runs(&RunQuery {
                last: Some(10),
                ..RunQuery::default()
            })
            .unwrap()
        })
        .unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].cached_tokens, second.stats.cached_tokens as u64);
    assert_eq!(runs[0].conversation_id.as_deref(), Some("c1"));
    let provenance = &runs[0].provenance;
    assert!(!provenance.app_commit.is_empty() && provenance.mlx_version.starts_with("0."));
    assert_eq!(
        provenance.mlx_rs_version,
        ondo::session::record::MLX_RS_VERSION
    );
    assert_eq!(
        provenance,
        pool.provenance(),
        "the pool's provenance, as recorded"
    );
    assert_eq!(runs[0].pressure_start, "normal");
    let timeline = pool
        .with_store(|s| s.timeline(&runs[0].run_id).unwrap())
        .unwrap();
    assert!(timeline.len() >= 2, "{timeline:?}");
    assert!(
        timeline
            .iter()
            .all(|s| s.used_bytes > 0 && s.footprint_bytes > 0)
    );
    assert!(pool.last_store_error().is_none());
}

#[test]
fn keep_alive_expiry_unloads_an_idle_model() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let settings = PoolSettings {
        keep_alive: KeepAlive::For(Duration::from_millis(300)),
        memory_budget_bytes: None,
    };
    let pool = pool_with(root.path(), settings);
    pool.run(
        chat_request(&dir, "c", vec![ChatMessage::user("hi")]),
        context("tiny"),
        CancelToken::new(),
        |_| {},
    )
    .unwrap();
    assert_eq!(pool.resident().len(), 1);
    assert!(pool.resident()[0].expires_in_ms.unwrap() <= 300);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pool.resident().is_empty() {
        assert!(Instant::now() < deadline, "never unloaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The pool drops the model from its list and notes why before the engine
    // lets go (`Shared::unload`), so the engine may take a moment longer.
    while !pool.engine_resident().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the engine still holds it");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(actions(&pool).contains(&("unload".into(), "keep-alive expired".into())));
    // The next run loads again.
    let (_, record) = pool
        .run(
            chat_request(&dir, "c", vec![ChatMessage::user("hi")]),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(record.load_kind, LoadKind::Cold);
    // Forever keeps it.
    pool.set_settings(PoolSettings {
        keep_alive: KeepAlive::Forever,
        memory_budget_bytes: None,
    });
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(pool.resident().len(), 1);
}

#[test]
fn a_run_may_be_heard_on_the_engine_thread_and_is_recorded_the_same() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let pool = pool_with(root.path(), PoolSettings::default());
    let heard: Arc<std::sync::Mutex<Vec<(String, String)>>> = Arc::default();
    let listener = heard.clone();
    let (outcome, record) = pool
        .run_on_engine_thread(
            GenerateRequest {
                delta_every_token: true,
                ..chat_request(&dir, "c", vec![ChatMessage::user("hi")])
            },
            context("tiny"),
            CancelToken::new(),
            move |event| {
                let kind = serde_json::to_value(event).unwrap()["event"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let thread = std::thread::current().name().unwrap_or("").to_owned();
                listener.lock().unwrap().push((kind, thread));
            },
        )
        .unwrap();
    let heard = heard.lock().unwrap().clone();
    assert!(
        heard.iter().all(|(_, thread)| thread == "ondo-engine"),
        "{heard:?}"
    );
    let kinds: Vec<&str> = heard.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"started"));
    assert_eq!(kinds.last(), Some(&"finished"));
    assert_eq!(
        kinds.iter().filter(|k| **k == "delta").count(),
        outcome.token_ids.len()
    );
    let runs = pool
        .with_store(|s| s.runs(&RunQuery::default()).unwrap())
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, record.run_id);
    assert_eq!(runs[0].generated_tokens, outcome.token_ids.len() as u64);
}

#[test]
fn a_preloaded_model_answers_warm() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let pool = pool_with(root.path(), PoolSettings::default());
    assert!(pool.preload(&dir, "tiny").unwrap());
    assert!(!pool.preload(&dir, "tiny").unwrap(), "loaded twice");
    assert_eq!(pool.resident().len(), 1);
    assert!(actions(&pool).contains(&("load".into(), "preload asked".into())));
    let (_, record) = pool
        .run(
            chat_request(&dir, "c", vec![ChatMessage::user("hi")]),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(record.load_kind, LoadKind::Warm);
    let missing = pool.preload(&root.path().join("nothing"), "nothing");
    assert_eq!(missing.unwrap_err().kind(), "load");
    assert_eq!(pool.resident().len(), 1);
}

#[test]
fn a_model_can_have_a_keep_alive_of_its_own() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    tiny(&a, 1);
    tiny(&b, 2);
    let settings = PoolSettings {
        keep_alive: KeepAlive::For(Duration::from_millis(300)),
        memory_budget_bytes: None,
    };
    let pool = pool_with(root.path(), settings);
    let run = |dir: &Path| {
        pool.run(
            chat_request(dir, "c", vec![ChatMessage::user("hi")]),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap()
    };
    run(&a);
    run(&b);
    // Forever outlives the pool's 300 ms; zero unloads at once.
    assert!(pool.keep_model_alive(&a, Some(KeepAlive::Forever)).unwrap());
    assert_eq!(
        pool.resident()
            .iter()
            .find(|m| m.model_dir == a)
            .unwrap()
            .expires_in_ms,
        None
    );
    assert!(
        pool.keep_model_alive(&b, Some(KeepAlive::For(Duration::ZERO)))
            .unwrap()
    );
    let resident: Vec<PathBuf> = pool.resident().into_iter().map(|m| m.model_dir).collect();
    assert_eq!(resident, vec![a.clone()], "b stayed loaded");
    assert!(
        !pool.keep_model_alive(&b, None).unwrap(),
        "b is not resident"
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(pool.resident().len(), 1, "a was unloaded");
    // Back to the pool's keep-alive: it goes like any idle model.
    assert!(pool.keep_model_alive(&a, None).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pool.resident().is_empty() {
        assert!(Instant::now() < deadline, "never unloaded");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_memory_budget_evicts_the_least_recently_used_model() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("c"),
    );
    tiny(&a, 1);
    tiny(&b, 2);
    tiny(&c, 3);
    // Room for two tiny models, not three.
    let one = std::fs::metadata(a.join("model.safetensors"))
        .unwrap()
        .len();
    let settings = PoolSettings {
        keep_alive: KeepAlive::Forever,
        memory_budget_bytes: Some(one * 2 + one / 2),
    };
    let pool = pool_with(root.path(), settings);
    let go = |dir: &PathBuf, name: &str| {
        pool.run(
            chat_request(dir, name, vec![ChatMessage::user("hi")]),
            context(name),
            CancelToken::new(),
            |_| {},
        )
        .unwrap()
    };
    go(&a, "a");
    go(&b, "b");
    go(&a, "a"); // a is now more recent than b
    go(&c, "c");
    let mut resident: Vec<String> = pool.resident().into_iter().map(|m| m.model_id).collect();
    resident.sort();
    assert_eq!(resident, ["a", "c"]);
    let evicted: Vec<_> = pool
        .events()
        .into_iter()
        .filter(|e| e.action == "unload")
        .map(|e| (e.model_id, e.reason))
        .collect();
    assert_eq!(evicted, [("b".to_owned(), "memory budget".to_owned())]);
}

#[test]
fn memory_pressure_trims_caches_then_unloads_idle_models() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let level = Arc::new(AtomicU8::new(0));
    let pool = pool_under(
        root.path(),
        PoolSettings {
            keep_alive: KeepAlive::Forever,
            memory_budget_bytes: None,
        },
        &level,
    );
    let messages = vec![ChatMessage::user("Tell me about the sea.")];
    let (first, _) = pool
        .run(
            chat_request(&dir, "c", messages.clone()),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert!(pool.resident()[0].kv_cache_bytes > 0);

    level.store(1, Ordering::SeqCst);
    tick_until(&pool, "the cache trim", |pool| {
        actions(pool).contains(&("trim_caches".into(), "pressure warning".into()))
    });
    assert_eq!(pool.resident()[0].kv_cache_bytes, 0);
    // The conversation starts over: nothing is cached for the next turn.
    let mut next = messages;
    next.push(ChatMessage::assistant(first.text));
    next.push(ChatMessage::user("More?"));
    let (second, _) = pool
        .run(
            chat_request(&dir, "c", next),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(second.stats.cached_tokens, 0);
    assert_eq!(second.stats.load_kind, ondo::run_kinds::LoadKind::Warm);

    level.store(2, Ordering::SeqCst);
    tick_until(&pool, "the unload and the MLX cache clear", |pool| {
        actions(pool).contains(&("clear_mlx_cache".into(), "pressure critical".into()))
    });
    assert!(pool.resident().is_empty());
    let acts = actions(&pool);
    assert!(
        acts.contains(&("unload".into(), "pressure critical".into())),
        "{acts:?}"
    );
    assert!(
        acts.contains(&("clear_mlx_cache".into(), "pressure critical".into())),
        "{acts:?}"
    );
    // Every event is in the store too.
    let stored = pool.with_store(|s| s.pool_events(100).unwrap()).unwrap();
    assert_eq!(stored.len(), pool.events().len());
}

#[test]
fn critical_pressure_unloads_idle_models_least_recently_used_first() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    tiny(&a, 1);
    tiny(&b, 2);
    let level = Arc::new(AtomicU8::new(0));
    let pool = pool_under(
        root.path(),
        PoolSettings {
            keep_alive: KeepAlive::Forever,
            memory_budget_bytes: None,
        },
        &level,
    );
    let go = |dir: &PathBuf, name: &str| {
        pool.run(
            chat_request(dir, name, vec![ChatMessage::user("hi")]),
            context(name),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    };
    go(&a, "a");
    go(&b, "b");
    go(&a, "a"); // b is now the least recently used
    assert_eq!(pool.resident().len(), 2);

    level.store(2, Ordering::SeqCst);
    tick_until(&pool, "the MLX cache clear", |pool| {
        actions(pool).contains(&("clear_mlx_cache".into(), "pressure critical".into()))
    });
    assert!(pool.resident().is_empty());
    assert!(
        pool.engine_resident().unwrap().is_empty(),
        "the engine still holds a model"
    );
    let unloads = |events: Vec<ondo::store::PoolEvent>| -> Vec<(String, String)> {
        events
            .into_iter()
            .filter(|e| e.action == "unload")
            .map(|e| (e.model_id, e.reason))
            .collect()
    };
    let expected = [
        ("b".to_owned(), "pressure critical".to_owned()),
        ("a".to_owned(), "pressure critical".to_owned()),
    ];
    assert_eq!(unloads(pool.events()), expected);
    // The history keeps them, in the same order.
    let stored = unloads(pool.with_store(|s| s.pool_events(100).unwrap()).unwrap());
    assert_eq!(stored, expected);
}

/// Token ids every tiny model knows, in no pattern the model could shortcut.
fn prompt_ids(count: usize) -> Vec<u32> {
    (0..count).map(|i| 10 + (i * 7919 % 1987) as u32).collect()
}

#[test]
fn a_cancelled_long_prefill_stops_early_and_the_next_turn_builds_on_what_it_computed() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    tiny(&dir, 0);
    let pool = pool_with(root.path(), PoolSettings::default());
    const STEP: usize = 64;
    let request = |ids: &[u32], conversation: Option<&str>| GenerateRequest {
        max_tokens: 8,
        prefill_step_size: STEP,
        conversation: conversation.map(str::to_owned),
        ..GenerateRequest::new(&dir, Prompt::Tokens { ids: ids.to_vec() })
    };
    let long = prompt_ids(4000);

    // Stop it once prefill has begun (Started comes after the load), with a
    // few chunks done so there is a partial cache to continue from.
    let cancel = CancelToken::new();
    let cancelled_at = std::cell::Cell::new(None);
    let (stopped, record) = pool
        .run(
            request(&long, Some("long")),
            context("tiny"),
            cancel.clone(),
            |event| {
                if matches!(event, RunEvent::Started { .. }) {
                    std::thread::sleep(Duration::from_millis(50));
                    cancel.cancel();
                    cancelled_at.set(Some(Instant::now()));
                }
            },
        )
        .unwrap();
    let stop_took = cancelled_at.get().unwrap().elapsed();
    assert_eq!(record.stop_reason, StopReason::Cancelled);
    assert_eq!(record.generated_tokens, 0);
    assert!(stopped.token_ids.is_empty());
    assert_eq!(record.prompt_tokens, long.len() as u64);
    let computed = record.prefill_tokens as usize;
    assert!(
        computed > 0 && computed.is_multiple_of(STEP),
        "prefill computes whole chunks: {computed}"
    );
    // Far from the whole prompt: it stopped at the next chunk, not at the end.
    assert!(
        computed <= long.len() / 2,
        "{computed} of {} prompt tokens were computed; the cancel came after 50 ms",
        long.len()
    );
    assert!(
        record.prefill_ms > 0.0 && record.ttft_ms == 0.0,
        "{record:?}"
    );
    eprintln!(
        "cancelled after {computed} tokens in {:.0} ms; the run returned {:.0} ms after the cancel",
        record.prefill_ms,
        stop_took.as_secs_f64() * 1e3
    );
    let history = pool
        .with_store(|s| s.runs(&RunQuery::default()).unwrap())
        .unwrap();
    assert_eq!(history.last().unwrap().stop_reason, StopReason::Cancelled);

    // The engine serves the next turn, which continues from the chunks the
    // cancelled one computed, and answers exactly as a fresh one-pass run
    // of the same prompt: the partial cache holds nothing stale.
    let mut follow_up = long.clone();
    follow_up.extend(prompt_ids(40)[24..].iter().copied());
    let (continued, continued_record) = pool
        .run(
            request(&follow_up, Some("long")),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(continued_record.load_kind, LoadKind::Warm);
    assert_eq!(continued.stats.cached_tokens, computed);
    assert_eq!(
        continued.stats.cached_tokens + continued.stats.prefill_tokens,
        follow_up.len()
    );
    let (fresh, _) = pool
        .run(
            request(&follow_up, None),
            context("tiny"),
            CancelToken::new(),
            |_| {},
        )
        .unwrap();
    assert_eq!(fresh.stats.cached_tokens, 0);
    assert!(!fresh.token_ids.is_empty());
    assert_eq!(continued.token_ids, fresh.token_ids);
}

fn ondo(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(args)
        .env("ONDO_HOME", home)
        .env("ONDO_NO_KEYCHAIN", "1")
        .output()
        .unwrap()
}

#[test]
fn a_bench_writes_every_report_format_and_the_history_shows_it() {
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("ondo");
    let out = root.path().join("reports");
    std::fs::create_dir_all(&out).unwrap();
    let files: Vec<PathBuf> = ["json", "jsonl", "csv", "md", "html"]
        .iter()
        .map(|ext| out.join(format!("bench.{ext}")))
        .collect();
    let mut args = vec![
        "bench",
        "tiny",
        "--prompt-tokens",
        "16,64",
        "--gen",
        "8",
        "--reps",
        "2",
        "--warmup",
        "1",
        "--loop",
        "sync,pipelined",
        "--vary",
        "prefill_step_size=16,2048",
        "--cold",
        "1",
    ];
    for file in &files {
        args.push("--report");
        args.push(file.to_str().unwrap());
    }
    let bench = ondo(&home, &args);
    let stdout = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    // 2 prompt lengths x 2 step sizes x 2 loops, each a row.
    assert_eq!(
        stdout.matches("pp16+tg8").count() + stdout.matches("pp64+tg8").count(),
        8,
        "{stdout}"
    );
    assert!(stdout.contains("cold start"), "{stdout}");
    assert!(stdout.contains("roofline"), "{stdout}");
    // Every case shows its decode step's graph size, counted in its warm-up.
    assert!(stdout.contains("nodes/step"), "{stdout}");
    for row in stdout.lines().filter(|l| l.contains("+tg8 ")) {
        let nodes: u64 = row.split_whitespace().last().unwrap().parse().unwrap();
        assert!(nodes > 20, "{row}");
    }
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(text.len() > 100, "{} is nearly empty", file.display());
    }
    // 8 cases x 3 rounds (1 warm-up) + 1 cold run.
    let jsonl = std::fs::read_to_string(&files[1]).unwrap();
    assert_eq!(jsonl.lines().count(), 8 * 3 + 1);
    let csv = std::fs::read_to_string(&files[2]).unwrap();
    assert_eq!(csv.lines().count(), 1 + 8 * 3 + 1);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(json["schema_version"], ondo::store::RECORD_SCHEMA_VERSION);
    let html = std::fs::read_to_string(&files[4]).unwrap();
    assert!(html.contains("<svg") && !html.contains("<script"));

    // The history has them.
    let runs = ondo(&home, &["runs", "--bench", "latest", "--last", "100"]);
    let text = String::from_utf8_lossy(&runs.stdout);
    assert!(
        runs.status.success(),
        "{}",
        String::from_utf8_lossy(&runs.stderr)
    );
    assert_eq!(text.lines().count(), 1 + 8 * 2 + 1, "{text}");
    let csv = ondo(
        &home,
        &[
            "report",
            "--bench",
            "latest",
            "--format",
            "csv",
            "--last",
            "100",
            "--include-warmup",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&csv.stdout).lines().count(),
        1 + 8 * 3 + 1
    );

    // `--out` replaces an older file whole, and the title names the
    // benchmark `latest` stood for.
    let kept = out.join("kept.md");
    std::fs::write(&kept, "an older report").unwrap();
    let written = ondo(
        &home,
        &[
            "report",
            "--bench",
            "latest",
            "--out",
            kept.to_str().unwrap(),
        ],
    );
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let text = std::fs::read_to_string(&kept).unwrap();
    let bench_id = json["runs"][0]["bench_id"].as_str().unwrap();
    assert!(
        text.contains(&format!("Ondo benchmark {bench_id}")),
        "{}",
        &text[..text.len().min(300)]
    );
    assert!(!text.contains("an older report"));
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bench.csv",
            "bench.html",
            "bench.json",
            "bench.jsonl",
            "bench.md",
            "kept.md"
        ]
    );
}

#[test]
fn killing_a_bench_leaves_every_finished_run_readable() {
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("ondo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args([
            "bench",
            "tiny",
            "--prompt-tokens",
            "32",
            "--gen",
            "16",
            "--reps",
            "500",
            "--warmup",
            "0",
            "--loop",
            "pipelined",
            "--cold",
            "0",
        ])
        .env("ONDO_HOME", &home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let db = home.join("ondo.sqlite3");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the bench recorded too few runs");
        assert!(child.try_wait().unwrap().is_none(), "the bench ended early");
        let count = Store::open(&db)
            .ok()
            .and_then(|s| s.run_count().ok())
            .unwrap_or(0);
        if count >= 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let store = Store::open(&db).unwrap();
    let runs = store
        .runs(&RunQuery {
            last: Some(1000),
            include_warmup: true,
            ..RunQuery::default()
        })
        .unwrap();
    assert!(runs.len() >= 5);
    for run in &runs {
        assert_eq!(run.generated_tokens, 16, "{run:?}");
        assert!(!store.timeline(&run.run_id).unwrap().is_empty());
    }
    // And `ondo runs` reads it.
    let listed = ondo(&home, &["runs", "--last", "1000"]);
    assert!(listed.status.success());
}

#[test]
fn the_recorded_mlx_rs_version_is_the_pinned_one() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let pinned = format!(
        "mlx-rs = {{ version = \"={}\"",
        ondo::session::record::MLX_RS_VERSION
    );
    assert!(
        manifest.contains(&pinned),
        "Cargo.toml no longer pins mlx-rs {}",
        ondo::session::record::MLX_RS_VERSION
    );
}
