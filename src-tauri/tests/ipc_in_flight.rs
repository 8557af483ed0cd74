//! What the user does to work in progress, through the commands the pages
//! call and the real core: Stop on an answer being written, Stop on a
//! benchmark, a chat sent while a benchmark runs, and a download paused
//! half-way and continued, against a hub on 127.0.0.1 (crates/ondo-testhub).
//! Each starts the work on one thread and acts on it from another, as the
//! page does while the first call is still pending.

mod support;

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use ondo::synth::{self, SynthOptions};
use ondo_testhub::TestHub;
use serde_json::{Value, json};
use support::invoke;
use tauri::WebviewWindow;
use tauri::test::MockRuntime;

/// A model the test hub serves.
const HUB_MODEL: &str = "ondo-test/tiny";

/// This binary's data folder, Hugging Face cache and hub, set in the
/// environment before any test builds an app.
struct Fixture {
    root: tempfile::TempDir,
    hub: TestHub,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let root = tempfile::tempdir().unwrap();
    // The tiny model in shards of about 2 MB, so a download has several
    // files and a pause lands inside one.
    let served = root.path().join("served/tiny");
    let options = SynthOptions {
        max_shard_bytes: 2_000_000,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, &served, &mut |_| {}).unwrap();
    let hub = TestHub::start().unwrap();
    hub.add_repo(HUB_MODEL, &served).unwrap();
    // SAFETY: every test forces this value before it does anything else, so
    // no other thread of this process reads the environment meanwhile.
    unsafe {
        std::env::set_var("ONDO_HOME", root.path().join("ondo"));
        std::env::set_var("HF_HUB_CACHE", root.path().join("hub"));
        std::env::set_var("HF_ENDPOINT", hub.url());
        std::env::remove_var("HF_HUB_OFFLINE");
        std::env::remove_var("HF_TOKEN");
        std::env::set_var("ONDO_NO_KEYCHAIN", "1");
    }
    Fixture { root, hub }
});

fn popover() -> WebviewWindow<MockRuntime> {
    LazyLock::force(&FIXTURE);
    support::popover()
}

/// Waits until `done` holds, for as long as a busy machine may need.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "waited in vain for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn chat_turn(conversation: &str, messages: Value, max_tokens: u64, channel: u32) -> Value {
    json!({
        "model": "tiny",
        "conversationId": conversation,
        "systemPrompt": null,
        "messages": messages,
        "settings": { "max_tokens": max_tokens },
        "onEvent": format!("__CHANNEL__:{channel}"),
    })
}

/// A benchmark of the tiny model long enough to be stopped half-way.
fn long_benchmark(channel: u32) -> Value {
    json!({
        "request": {
            "model": "tiny",
            "shape": {
                "prompt_tokens": [16],
                "generate_tokens": 8,
                "repetitions": 1000,
                "warmup": 0,
                "loops": ["sync"],
                "prefill_step_size": 2048,
                "max_kv_size": null,
                "vary": null,
                "cold_repetitions": 0,
            },
        },
        "onEvent": format!("__CHANNEL__:{channel}"),
    })
}

fn runs(window: &WebviewWindow<MockRuntime>, filter: Value) -> Vec<Value> {
    invoke(window, "list_runs", json!({ "filter": filter }))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn bench_runs(window: &WebviewWindow<MockRuntime>) -> Vec<Value> {
    runs(
        window,
        json!({ "kind": "bench", "include_warmup": true, "last": 10000 }),
    )
}

/// Whether the pool is answering with the tiny model now.
fn tiny_is_busy(window: &WebviewWindow<MockRuntime>) -> bool {
    let status = invoke(window, "pool_status", Value::Null).unwrap();
    status["resident"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["model_id"] == "tiny" && m["busy"] == true)
}

#[test]
fn stop_ends_the_answer_being_written_which_is_recorded_as_cancelled() {
    let window = popover();
    // A first turn loads the model, so the stop below lands in decoding.
    let question = json!([{ "role": "user", "content": "Tell me a long story." }]);
    invoke(
        &window,
        "chat_send",
        chat_turn("warm-up", question.clone(), 2, 1),
    )
    .unwrap();

    let limit = 3000;
    let record = std::thread::scope(|scope| {
        let answer = scope.spawn(|| {
            invoke(
                &window,
                "chat_send",
                chat_turn("stopped", question.clone(), limit, 2),
            )
        });
        wait_until("the answer to start", || tiny_is_busy(&window));
        // Some tokens arrive first: the stop cuts an answer under way.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            invoke(&window, "chat_stop", json!({ "conversationId": "stopped" })).unwrap(),
            true
        );
        answer.join().unwrap()
    })
    .unwrap();
    assert_eq!(record["stop_reason"], "cancelled", "{record}");
    let generated = record["generated_tokens"].as_u64().unwrap();
    assert!(generated > 0 && generated < limit, "{generated} tokens");
    assert_eq!(record["conversation_id"], "stopped");
    // The history has the partial answer as it was stopped.
    let recorded = runs(&window, json!({ "kind": "chat", "last": 50 }));
    let stopped = recorded
        .iter()
        .find(|r| r["run_id"] == record["run_id"])
        .unwrap_or_else(|| panic!("not in the history: {recorded:?}"));
    assert_eq!(stopped["stop_reason"], "cancelled");
    assert_eq!(stopped["generated_tokens"], generated);
    // Nothing is left to stop, and the conversation goes on, warm.
    assert_eq!(
        invoke(&window, "chat_stop", json!({ "conversationId": "stopped" })).unwrap(),
        false
    );
    let next = json!([
        { "role": "user", "content": "Tell me a long story." },
        { "role": "assistant", "content": "Once upon a time" },
        { "role": "user", "content": "Go on." },
    ]);
    let record = invoke(&window, "chat_send", chat_turn("stopped", next, 4, 3)).unwrap();
    assert_eq!(record["generated_tokens"], 4);
    assert_eq!(record["load_kind"], "warm");
}

#[test]
fn stopping_a_benchmark_keeps_the_runs_it_finished() {
    let window = popover();
    let before = bench_runs(&window).len();
    let error = std::thread::scope(|scope| {
        let bench = scope.spawn(|| invoke(&window, "run_benchmark", long_benchmark(10)));
        wait_until("two recorded benchmark runs", || {
            bench_runs(&window).len() >= before + 2
        });
        assert_eq!(
            invoke(&window, "cancel_benchmark", Value::Null).unwrap(),
            true
        );
        bench.join().unwrap()
    })
    .unwrap_err();
    assert_eq!(error["kind"], "cancelled", "{error}");
    let message = error["message"].as_str().unwrap();
    assert_eq!(
        ondo::error_kind::out_of_place_in_the_app(message),
        None,
        "{message}"
    );

    // The runs finished before the stop (and the one under way when it
    // came) are in the history, all of one benchmark, each whole.
    let finished: Vec<Value> = bench_runs(&window).split_off(before);
    assert!(
        (2..1000).contains(&finished.len()),
        "{} runs recorded",
        finished.len()
    );
    let bench_id = &finished[0]["bench_id"];
    assert!(bench_id.is_string());
    for run in &finished {
        assert_eq!(&run["bench_id"], bench_id);
        assert_eq!(run["generated_tokens"], 8, "{run}");
        assert_ne!(run["stop_reason"], "cancelled", "{run}");
    }
    // Stopped means stopped: no more runs arrive.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(bench_runs(&window).len(), before + finished.len());
    assert_eq!(
        invoke(&window, "cancel_benchmark", Value::Null).unwrap(),
        false
    );
}

#[test]
fn a_chat_sent_during_a_benchmark_is_answered_between_its_runs_and_recorded() {
    let window = popover();
    let before = bench_runs(&window).len();
    let (chat, bench) = std::thread::scope(|scope| {
        let bench = scope.spawn(|| invoke(&window, "run_benchmark", long_benchmark(20)));
        wait_until("a recorded benchmark run", || {
            bench_runs(&window).len() > before
        });
        let question = json!([{ "role": "user", "content": "Are you busy?" }]);
        let chat = invoke(
            &window,
            "chat_send",
            chat_turn("during-bench", question, 6, 21),
        );
        // The benchmark goes on after the answer. Its next run starts when
        // its thread gets back to the engine, so wait for one to be
        // recorded before stopping it (a stop between runs starts no more,
        // and on a loaded machine the stop could otherwise come first).
        if let Ok(answer) = &chat {
            wait_until("a benchmark run recorded after the chat", || {
                let history = runs(&window, json!({ "include_warmup": true, "last": 10000 }));
                history
                    .iter()
                    .position(|r| r["run_id"] == answer["run_id"])
                    .is_some_and(|at| history[at + 1..].iter().any(|r| r["bench_id"].is_string()))
            });
        }
        // The answer did not wait for the benchmark's end: it still runs.
        let still_running = invoke(&window, "cancel_benchmark", Value::Null).unwrap();
        assert_eq!(still_running, true, "the benchmark ended before the chat");
        (chat, bench.join().unwrap())
    });
    let chat = chat.unwrap();
    assert_eq!(chat["kind"], "chat");
    assert_eq!(chat["generated_tokens"], 6);
    assert_eq!(bench.unwrap_err()["kind"], "cancelled");

    // In the history in the order they reached the engine: the chat
    // between benchmark runs, some before it and at least one after.
    let history = runs(&window, json!({ "include_warmup": true, "last": 10000 }));
    let at = history
        .iter()
        .position(|r| r["run_id"] == chat["run_id"])
        .expect("the chat is in the history");
    let bench_id = &history[at - 1]["bench_id"];
    assert!(bench_id.is_string(), "{}", history[at - 1]);
    assert!(
        history[at + 1..].iter().any(|r| &r["bench_id"] == bench_id),
        "no run of the benchmark came after the chat"
    );
}

/// The blobs of `HUB_MODEL` still being written, with their sizes.
fn partial_blobs(cache: &Path) -> Vec<(PathBuf, u64)> {
    let blobs = cache.join("models--ondo-test--tiny/blobs");
    std::fs::read_dir(blobs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .map(|e| (e.path(), e.metadata().map_or(0, |m| m.len())))
        .collect()
}

#[test]
fn a_paused_download_keeps_what_arrived_and_the_next_one_continues_it() {
    let window = popover();
    let fixture = &*FIXTURE;
    let cache = fixture.root.path().join("hub");
    // Slow enough to be paused half-way through a shard.
    fixture.hub.set_bytes_per_second(Some(1_000_000));
    let download = json!({ "model": HUB_MODEL, "onEvent": "__CHANNEL__:30" });
    let error = std::thread::scope(|scope| {
        let pull = scope.spawn(|| invoke(&window, "download_model", download.clone()));
        wait_until("part of a file", || {
            partial_blobs(&cache)
                .iter()
                .any(|(_, size)| *size > 200_000)
        });
        assert_eq!(
            invoke(&window, "cancel_download", json!({ "model": HUB_MODEL })).unwrap(),
            true
        );
        pull.join().unwrap()
    })
    .unwrap_err();
    assert_eq!(error["kind"], "cancelled", "{error}");
    let kept = partial_blobs(&cache);
    let kept_bytes: u64 = kept.iter().map(|(_, size)| size).sum();
    assert!(
        kept_bytes > 200_000,
        "the partial file was not kept: {kept:?}"
    );
    assert_eq!(
        invoke(&window, "cancel_download", json!({ "model": HUB_MODEL })).unwrap(),
        false
    );

    // Downloading again continues from the kept bytes instead of starting over.
    fixture.hub.set_bytes_per_second(None);
    let served_before = fixture.hub.body_bytes_served();
    let summary = invoke(&window, "download_model", download).unwrap();
    let total = summary["total_bytes"].as_u64().unwrap();
    let fetched = summary["fetched_bytes"].as_u64().unwrap();
    assert!(
        fetched + kept_bytes <= total,
        "fetched {fetched} of {total} with {kept_bytes} kept"
    );
    assert!(fixture.hub.body_bytes_served() - served_before <= total - kept_bytes);
    assert!(
        fixture
            .hub
            .requests()
            .iter()
            .any(|r| r.range.as_deref().is_some_and(|range| range != "bytes=0-")),
        "no request resumed a file"
    );
    assert!(partial_blobs(&cache).is_empty());

    // The whole model is in the library and answers.
    let models = invoke(&window, "list_models", Value::Null).unwrap();
    assert!(
        models["library"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == HUB_MODEL),
        "{models}"
    );
    let chat = json!({
        "model": HUB_MODEL,
        "conversationId": "downloaded",
        "systemPrompt": null,
        "messages": [{ "role": "user", "content": "hi" }],
        "settings": { "max_tokens": 3 },
        "onEvent": "__CHANNEL__:31",
    });
    let record = invoke(&window, "chat_send", chat).unwrap();
    assert_eq!(record["generated_tokens"], 3);
    assert_eq!(record["model_id"], HUB_MODEL);
}
