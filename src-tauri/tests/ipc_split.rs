//! A model split over several machines from the app, through the real IPC
//! path: the popover starts Ondo's command as rank 0 of two ranks on this
//! machine (ring backend on 127.0.0.1), follows the ranks until they serve,
//! chats with the split model (the record says how it was split), hears of
//! a rank killed mid-life, and stopping ends every rank.

mod support;

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use ondo::synth::{self, SynthOptions};
use serde_json::{Value, json};
use support::invoke;
use tauri::WebviewWindow;
use tauri::test::MockRuntime;

/// A data folder of its own and a 4-layer model, set up before any test
/// builds an app.
static FIXTURE: LazyLock<(tempfile::TempDir, PathBuf)> = LazyLock::new(|| {
    let root = support::offline_data_folder();
    // SAFETY: as in `offline_data_folder`, before any thread starts.
    unsafe { std::env::set_var("ONDO_RANK_JOIN_TIMEOUT_S", "30") };
    let model = root.path().join("split-me");
    let options = SynthOptions {
        layers: Some(4),
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    };
    synth::write_model(&options, &model, &mut |_| {}).unwrap();
    // Room for a prompt long enough to be stopped during its prefill.
    let config = model.join("config.json");
    let mut settings: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    settings["max_position_embeddings"] = json!(32768);
    std::fs::write(&config, settings.to_string()).unwrap();
    (root, model)
});

fn popover() -> WebviewWindow<MockRuntime> {
    LazyLock::force(&FIXTURE);
    // The app finds Ondo's command beside itself: in a build tree, one
    // folder up from this test binary.
    let exe = std::env::current_exe().unwrap();
    let ondo = exe.parent().unwrap().join("../ondo");
    assert!(
        ondo.is_file(),
        "{} is missing: build it first (cargo build --bin ondo; cargo test --workspace does)",
        ondo.display()
    );
    support::popover()
}

/// Follows `split_status` until its state is `state`, within `limit`.
fn wait_for(popover: &WebviewWindow<MockRuntime>, state: &str, limit: Duration) -> Value {
    let until = Instant::now() + limit;
    loop {
        let view = invoke(popover, "split_status", Value::Null).unwrap();
        if view["status"]["state"]["state"] == state {
            return view;
        }
        assert!(
            Instant::now() < until,
            "no {state} within {limit:?}: {view:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn chat(popover: &WebviewWindow<MockRuntime>, model: &Path, n: u32) -> Result<Value, Value> {
    chat_about(popover, model, n, "Tell me about the sea.")
}

fn chat_about(
    popover: &WebviewWindow<MockRuntime>,
    model: &Path,
    n: u32,
    question: &str,
) -> Result<Value, Value> {
    invoke(
        popover,
        "chat_send",
        json!({
            "model": model,
            "conversationId": format!("split-{n}"),
            "systemPrompt": null,
            "messages": [{ "role": "user", "content": question }],
            "settings": { "max_tokens": 6, "temperature": 0.0, "prefill_step_size": 32 },
            "think": null,
            "onEvent": format!("__CHANNEL__:{n}"),
        }),
    )
}

/// The processes whose command line names `model` (every rank does).
fn ranks_of(model: &Path) -> Vec<(u32, String)> {
    let model = model.to_string_lossy();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let line = std::fs::read(entry.path().join("cmdline")).ok()?;
            let line = String::from_utf8_lossy(&line).replace('\0', " ");
            (line.contains(" serve ") && line.contains(model.as_ref())).then_some((pid, line))
        })
        .collect()
}

#[test]
fn a_model_split_from_the_app_answers_shows_a_lost_rank_and_stops_every_rank() {
    let popover = popover();
    let model = FIXTURE.1.clone();
    let ask = json!({
        "model": model,
        "hosts": ["localhost", " 127.0.0.1 ", ""],
        "split": "pipeline",
    });
    let started = invoke(&popover, "split_start", json!({ "ask": ask })).unwrap();
    assert_eq!(started["status"]["state"]["state"], "starting", "{started}");
    assert_eq!(
        started["last_ask"]["hosts"],
        json!(["localhost", " 127.0.0.1 ", ""])
    );
    // One split at a time.
    let again = invoke(&popover, "split_start", json!({ "ask": ask })).unwrap_err();
    assert!(
        again["message"]
            .as_str()
            .unwrap()
            .contains("stop that split first"),
        "{again}"
    );
    // Rank 0's hosts file is in Ondo's data folder (an app killed leaves
    // nothing in the temp folder), ready for `ondo serve --hostfile`.
    let hosts_file = FIXTURE
        .0
        .path()
        .join("ondo")
        .join(ondo::served_split::HOSTS_FILE_NAME);
    let written: Value = serde_json::from_slice(&std::fs::read(&hosts_file).unwrap()).unwrap();
    assert_eq!(written, json!(["localhost", "127.0.0.1"]));
    let serving = wait_for(&popover, "serving", Duration::from_secs(120));
    let said = serving["status"]["lines"].to_string();
    assert!(said.contains("over 2 ranks"), "{said}");

    // A chat with the split model answers through rank 0, and the record
    // the Runs window reads says how it was split.
    let record = chat(&popover, &model, 1).unwrap();
    assert_eq!(record["split"], "pipeline", "{record}");
    assert_eq!(record["split_ranks"], 2, "{record}");
    assert_eq!(record["generated_tokens"], 6, "{record}");
    // The chat's engine knobs, not rank 0's defaults, ran the turn.
    assert_eq!(record["prefill_step_size"], 32, "{record}");
    assert!(
        record["split_prefill_bytes"].as_u64().unwrap() > 0,
        "{record}"
    );
    // Rank 0 records the request; the app files it as the conversation's
    // turn, its client named, and the Runs window lists it with the chats.
    assert_eq!(record["kind"], "chat", "{record}");
    assert_eq!(record["conversation_id"], "split-1", "{record}");
    assert_eq!(
        record["user_agent"],
        ondo::served_split::APP_CHAT_AGENT,
        "{record}"
    );
    let chats = invoke(
        &popover,
        "list_runs",
        json!({ "filter": { "last": 50, "kind": "chat" } }),
    )
    .unwrap();
    assert!(
        chats
            .to_string()
            .contains(record["run_id"].as_str().unwrap()),
        "{chats}"
    );

    // Stopped during a long prompt's prefill: every rank stops at the same
    // chunk, and the turn is recorded as stopped, under its conversation,
    // as an unsplit model's stopped turn is.
    let long_question = "the sea and the sky ".repeat(1800);
    let stopped = std::thread::scope(|scope| {
        let answer = scope.spawn(|| chat_about(&popover, &model, 4, &long_question));
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            invoke(
                &popover,
                "chat_stop",
                json!({ "conversationId": "split-4" })
            )
            .unwrap(),
            true
        );
        answer.join().unwrap()
    })
    .unwrap();
    assert_eq!(stopped["stop_reason"], "cancelled", "{stopped}");
    assert_eq!(stopped["kind"], "chat", "{stopped}");
    assert_eq!(stopped["conversation_id"], "split-4", "{stopped}");
    assert_eq!(stopped["split_ranks"], 2, "{stopped}");
    assert_eq!(stopped["generated_tokens"], 0, "{stopped}");

    // Rank 1 killed: the popover hears which rank was lost, and a chat
    // with the split model says so rather than waiting.
    let ranks = ranks_of(&model);
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    let (rank_1, _) = ranks
        .iter()
        .find(|(_, line)| !line.contains("--hostfile"))
        .unwrap();
    kill_now(*rank_1);
    let lost = wait_for(&popover, "lost", Duration::from_secs(30));
    let reason = lost["status"]["state"]["reason"].as_str().unwrap();
    assert!(reason.contains("rank 1"), "{reason}");
    let refused = chat(&popover, &model, 2).unwrap_err();
    assert_eq!(refused["kind"], "distributed", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("rank 1"),
        "{refused}"
    );

    // Stopped: every rank has ended, and the model runs here alone again.
    let stopped = invoke(&popover, "split_stop", Value::Null).unwrap();
    assert_eq!(stopped["status"]["state"]["state"], "ended", "{stopped}");
    assert_eq!(ranks_of(&model), vec![], "ranks left running");
    let alone = chat(&popover, &model, 3).unwrap();
    assert!(alone["split"].is_null(), "{alone}");
    assert_eq!(alone["kind"], "chat", "{alone}");
}

/// SIGKILL, through the `kill` command.
fn kill_now(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
