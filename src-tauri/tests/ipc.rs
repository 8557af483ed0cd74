//! The commands through the real IPC path (`mock_builder` + `get_ipc_response`)
//! and the real core, in a temporary data folder and an empty Hugging Face
//! cache: what the UI sends, and that the answers carry every field the UI
//! reads (ui/src/lib/backend.ts).

mod support;

use std::sync::LazyLock;

use serde_json::{Value, json};
use support::invoke;
use tauri::WebviewWindow;
use tauri::test::MockRuntime;

/// A data folder of its own for this test binary, set in the environment
/// before any test builds an app.
static DATA_ROOT: LazyLock<tempfile::TempDir> = LazyLock::new(support::offline_data_folder);

fn popover() -> WebviewWindow<MockRuntime> {
    LazyLock::force(&DATA_ROOT);
    support::popover()
}

#[test]
fn doctor_report_answers_with_versions_memory_and_checks() {
    let report = invoke(&popover(), "doctor_report", Value::Null).unwrap();
    assert_eq!(report["ondo_version"], env!("CARGO_PKG_VERSION"));
    assert!(
        report["mlx_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    assert!(["metal", "cuda", "cpu"].contains(&report["backend"].as_str().unwrap()));
    assert!(report["device"].is_string());
    assert!(report["total_memory_bytes"].as_u64().is_some_and(|b| b > 0));
    assert!(report["available_memory_bytes"].as_u64().is_some());
    assert!(report["checks"].as_array().is_some_and(|c| !c.is_empty()));
    assert!(
        report["data_dir"]
            .as_str()
            .unwrap()
            .starts_with(DATA_ROOT.path().to_str().unwrap())
    );
}

#[test]
fn the_start_up_check_passes_where_mlx_computes() {
    // Off a Mac there is no Metal to check; on a Mac whose MLX finds its
    // kernels it computes on the GPU. Either way the popover shows no note.
    assert_eq!(
        invoke(&popover(), "startup_check", Value::Null),
        Ok(Value::Null)
    );
}

#[test]
fn errors_reach_the_ui_as_kind_and_message() {
    let args = json!({
        "model": { "kind": "builtin_tiny" },
        "prompt": "Why is the sky blue?",
        "maxTokens": 0,
    });
    let error = invoke(&popover(), "run_test_generation", args).unwrap_err();
    assert_eq!(error["kind"], "invalid_input");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("between 1 and")),
        "{error}"
    );
    assert_eq!(error.as_object().map(|o| o.len()), Some(2), "{error}");
}

#[test]
fn the_tiny_model_runs_and_answers_what_the_ui_reads() {
    let popover = popover();
    let prepared = invoke(&popover, "prepare_builtin_model", Value::Null).unwrap();
    let model_dir = prepared["model_dir"].as_str().unwrap();
    assert!(model_dir.starts_with(DATA_ROOT.path().to_str().unwrap()));

    let args = json!({
        "model": { "kind": "builtin_tiny" },
        "prompt": "Explain in one sentence why the sky is blue.",
        "maxTokens": 8,
    });
    let run = invoke(&popover, "run_test_generation", args).unwrap();
    assert_eq!(run["model_dir"], model_dir);
    assert_eq!(run["load_kind"], "cold");
    assert_eq!(run["generated_tokens"], 8);
    assert!(run["prompt_tokens"].as_u64().is_some_and(|n| n > 0));
    for field in [
        "load_ms",
        "ttft_ms",
        "prefill_ms",
        "decode_ms",
        "prefill_tps",
        "decode_tps",
    ] {
        assert!(
            run[field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {run}"
        );
    }
    for field in ["kv_cache_bytes", "mlx_peak_bytes"] {
        assert!(run[field].as_u64().is_some(), "{field}: {run}");
    }
    assert!(run["text"].is_string());
}

#[test]
fn the_models_screen_gets_the_catalog_with_verdicts_and_offline_mode() {
    let view = invoke(&popover(), "list_models", Value::Null).unwrap();
    let catalog = view["catalog"].as_array().unwrap();
    assert_eq!(
        catalog[0]["entry"]["repo_id"],
        "mlx-community/Llama-3.2-3B-Instruct-4bit"
    );
    assert_eq!(view["default_model"], catalog[0]["entry"]["repo_id"]);
    for offer in catalog {
        assert!(
            ["fits", "tight", "will_not_fit"].contains(&offer["fit"]["verdict"].as_str().unwrap())
        );
        assert!(offer["fit"]["weights_bytes"].as_u64().unwrap() > 0);
        assert_eq!(offer["downloaded"], false);
        // A family the engine does not run yet is listed with the reason
        // the Download button shows; the others have none.
        let family = offer["entry"]["family"].as_str().unwrap();
        let runs = ondo::family::find(family).is_some();
        match offer["unsupported"].as_str() {
            None => assert!(runs, "{offer}"),
            Some(reason) => {
                assert!(!runs, "{offer}");
                assert!(
                    reason.starts_with(&format!("not supported yet: model_type {family} (")),
                    "{reason}"
                );
            }
        }
    }
    // Mixtures of experts say how many parameters work on each token.
    let moe = catalog
        .iter()
        .find(|offer| offer["entry"]["family"] == "qwen3_moe")
        .unwrap();
    assert!(
        moe["fit"]["active_parameters"].as_u64().unwrap()
            < moe["fit"]["parameters"].as_u64().unwrap() / 5,
        "{moe}"
    );
    assert_eq!(view["offline"], true);
}

#[test]
fn hub_errors_keep_the_hubs_kind() {
    let popover = popover();
    let error = invoke(
        &popover,
        "fit_model",
        json!({ "model": "../etc", "context": 4096 }),
    )
    .unwrap_err();
    assert_eq!(error["kind"], "invalid_repo_id", "{error}");
    // Offline, a catalog model is still sized (approximately, from the catalog).
    let fit = invoke(
        &popover,
        "fit_model",
        json!({ "model": "mlx-community/Qwen3-0.6B-4bit", "context": 100000000u64 }),
    )
    .unwrap();
    assert_eq!(fit["verdict"], "will_not_fit", "{fit}");
    assert!(fit["advice"].as_array().is_some_and(|a| !a.is_empty()));
    let error = invoke(
        &popover,
        "delete_model",
        json!({ "model": "acme/not-here" }),
    )
    .unwrap_err();
    assert_eq!(error["kind"], "not_in_library", "{error}");
    assert_eq!(
        invoke(&popover, "cancel_download", json!({ "model": "acme/x" })).unwrap(),
        false
    );
}

#[test]
fn runs_are_recorded_with_memory_and_can_be_exported() {
    let popover = popover();
    let args = json!({
        "model": { "kind": "builtin_tiny" },
        "prompt": "Count to three.",
        "maxTokens": 6,
    });
    invoke(&popover, "run_test_generation", args).unwrap();
    let runs = invoke(&popover, "list_runs", json!({ "filter": { "last": 50 } })).unwrap();
    let last = runs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["generated_tokens"], 6);
    assert_eq!(last["model_id"], "tiny");
    assert!(["cold", "warm"].contains(&last["load_kind"].as_str().unwrap()));
    let timeline = invoke(&popover, "run_timeline", json!({ "runId": last["run_id"] })).unwrap();
    assert!(
        timeline.as_array().is_some_and(|t| t.len() >= 2),
        "{timeline}"
    );

    let memory = invoke(&popover, "memory_now", Value::Null).unwrap();
    assert!(["normal", "warning", "critical"].contains(&memory["level"].as_str().unwrap()));
    assert!(memory["used_bytes"].as_u64().unwrap() > 0);
    let pool = invoke(&popover, "pool_status", Value::Null).unwrap();
    let tiny = pool["resident"]
        .as_array()
        .and_then(|r| r.iter().find(|m| m["model_id"] == "tiny"))
        .unwrap_or_else(|| panic!("tiny is warm: {pool}"))
        .clone();
    assert!(tiny["weights_bytes"].as_u64().unwrap() > 0);
    let unloaded = invoke(
        &popover,
        "unload_model",
        json!({ "modelDir": tiny["model_dir"] }),
    )
    .unwrap();
    assert_eq!(unloaded, true);
    let pool = invoke(&popover, "pool_status", Value::Null).unwrap();
    assert!(
        !pool["resident"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["model_id"] == "tiny"),
        "{pool}"
    );
    assert_eq!(
        invoke(
            &popover,
            "unload_model",
            json!({ "modelDir": tiny["model_dir"] })
        )
        .unwrap(),
        false
    );

    let path = DATA_ROOT.path().join("runs.html");
    let written = invoke(
        &popover,
        "export_runs",
        json!({ "filter": { "last": 50, "model_id": "tiny" }, "format": "html", "path": path }),
    )
    .unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert_eq!(written["bytes"].as_u64().unwrap(), html.len() as u64);
    assert!(written["runs"].as_u64().unwrap() >= 1, "{written}");
    assert!(html.contains("<svg") && html.contains("tiny"));
    // The format is typed: one the app does not offer is refused before
    // the command runs, and nothing is written.
    let refused = DATA_ROOT.path().join("runs.pdf");
    let error = invoke(
        &popover,
        "export_runs",
        json!({ "filter": { "last": 5 }, "format": "pdf", "path": refused }),
    )
    .unwrap_err();
    assert!(
        error.as_str().is_some_and(|text| text.contains("pdf")),
        "{error}"
    );
    assert!(!refused.exists());
    // No dialog under the test runtime: the command says so instead of hanging.
    let error = invoke(&popover, "choose_export_path", json!({ "format": "csv" })).unwrap_err();
    assert_eq!(error["kind"], "invalid_input");
}

#[test]
fn a_benchmark_runs_with_progress_is_recorded_and_exported_as_csv() {
    let window = popover();
    let request = json!({
        "model": "tiny",
        "shape": {
            "prompt_tokens": [16, 32],
            "generate_tokens": 4,
            "repetitions": 2,
            "warmup": 1,
            "loops": ["sync", "pipelined"],
            "prefill_step_size": 2048,
            "max_kv_size": null,
            "vary": null,
            "cold_repetitions": 0,
        },
    });
    let result = invoke(
        &window,
        "run_benchmark",
        json!({ "request": request, "onEvent": "__CHANNEL__:7" }),
    )
    .unwrap();
    let bench_id = result["bench_id"].as_str().unwrap().to_owned();
    // 2 prompt lengths x 2 loop shapes, 1 warm-up + 2 measured each.
    assert_eq!(result["runs"], 12, "{result}");
    let cases = result["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    assert!(
        cases
            .iter()
            .all(|c| c["decode_tps"]["samples"].as_array().unwrap().len() == 2)
    );
    assert_eq!(
        invoke(&window, "cancel_benchmark", Value::Null).unwrap(),
        false
    );

    let measured = invoke(
        &window,
        "list_runs",
        json!({ "filter": { "bench_id": bench_id } }),
    )
    .unwrap();
    assert_eq!(
        measured.as_array().unwrap().len(),
        8,
        "warm-ups are left out"
    );
    let all = invoke(
        &window,
        "list_runs",
        json!({ "filter": { "bench_id": bench_id, "include_warmup": true } }),
    )
    .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 12);

    let path = DATA_ROOT.path().join("bench.csv");
    invoke(
        &window,
        "export_runs",
        json!({ "filter": { "bench_id": bench_id }, "format": "csv", "path": path }),
    )
    .unwrap();
    let csv = std::fs::read_to_string(&path).unwrap();
    assert_eq!(csv.lines().count(), 1 + 8, "{csv}");
    // The loop filter applies to the list and the export alike.
    let sync_only = json!({ "bench_id": bench_id, "loop": "sync" });
    let listed = invoke(&window, "list_runs", json!({ "filter": sync_only })).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 4);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["loop"] == "sync")
    );
    let exported = invoke(
        &window,
        "export_runs",
        json!({ "filter": sync_only, "format": "jsonl", "path": DATA_ROOT.path().join("sync.jsonl") }),
    )
    .unwrap();
    assert_eq!(exported["runs"], 4, "{exported}");
    // Exports replace their file in one step and leave no temporary beside it.
    let leftovers: Vec<_> = std::fs::read_dir(DATA_ROOT.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The newest two runs are pipelined; asking for the last two sync runs
    // must find the older ones (the filter is in the query, before LIMIT).
    let sync = invoke(
        &window,
        "list_runs",
        json!({ "filter": { "last": 2, "bench_id": bench_id, "loop": "sync" } }),
    )
    .unwrap();
    let sync = sync.as_array().unwrap();
    assert_eq!(sync.len(), 2, "{sync:?}");
    assert!(sync.iter().all(|r| r["loop"] == "sync"));

    let bad = json!({ "model": "tiny", "shape": { "prompt_tokens": [], "generate_tokens": 4,
        "repetitions": 1, "warmup": 0, "loops": ["sync"], "prefill_step_size": 2048,
        "max_kv_size": null, "vary": null, "cold_repetitions": 0 } });
    let error = invoke(
        &window,
        "run_benchmark",
        json!({ "request": bad, "onEvent": "__CHANNEL__:8" }),
    )
    .unwrap_err();
    assert_eq!(error["kind"], "invalid_input", "{error}");
}

#[test]
fn a_chat_turn_streams_is_recorded_and_the_next_turn_is_warm() {
    let popover = popover();
    let settings = json!({ "max_tokens": 6 });
    let first = json!({
        "model": "tiny",
        "conversationId": "ipc-chat",
        "systemPrompt": null,
        "messages": [{ "role": "user", "content": "Tell me about the sea." }],
        "settings": settings,
        "onEvent": "__CHANNEL__:1",
    });
    let record = invoke(&popover, "chat_send", first).unwrap();
    assert_eq!(record["kind"], "chat");
    assert_eq!(record["conversation_id"], "ipc-chat");
    assert_eq!(record["generated_tokens"], 6);
    let second = json!({
        "model": "tiny",
        "conversationId": "ipc-chat",
        "systemPrompt": null,
        "messages": [
            { "role": "user", "content": "Tell me about the sea." },
            { "role": "assistant", "content": "It is wide." },
            { "role": "user", "content": "And the sky?" },
        ],
        "settings": settings,
        "onEvent": "__CHANNEL__:2",
    });
    let record = invoke(&popover, "chat_send", second).unwrap();
    assert_eq!(record["load_kind"], "warm");
    assert!(record["cached_tokens"].as_u64().unwrap() > 0, "{record}");
    assert_eq!(
        invoke(
            &popover,
            "chat_stop",
            json!({ "conversationId": "ipc-chat" })
        )
        .unwrap(),
        false
    );
    invoke(
        &popover,
        "chat_forget",
        json!({ "conversationId": "ipc-chat" }),
    )
    .unwrap();

    let bad = json!({
        "model": "tiny",
        "conversationId": "ipc-chat",
        "systemPrompt": null,
        "messages": [{ "role": "assistant", "content": "hi" }],
        "settings": { "max_tokens": 0 },
        "onEvent": "__CHANNEL__:3",
    });
    let error = invoke(&popover, "chat_send", bad).unwrap_err();
    assert_eq!(error["kind"], "invalid_input", "{error}");
    let missing = json!({
        "model": "acme/not-downloaded",
        "conversationId": "x",
        "systemPrompt": null,
        "messages": [{ "role": "user", "content": "hi" }],
        "settings": {},
        "onEvent": "__CHANNEL__:4",
    });
    let error = invoke(&popover, "chat_send", missing).unwrap_err();
    assert_eq!(error["kind"], "model_not_found", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("acme/not-downloaded"), "{message}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("acme/not-downloaded"), "{message}");
}

/// The tiny model's chat format with a generation prompt that opens
/// `<think>` unless `enable_thinking` is false, as Qwen3's template does.
const THINKING_TEMPLATE: &str = "{{- bos_token -}}\
{%- for message in messages -%}\
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}\
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}\
{%- if enable_thinking is not defined or enable_thinking -%}{{- '<think>\n' -}}{%- endif -%}\
{%- endif -%}";

#[test]
fn the_think_switch_is_offered_where_the_template_reads_it_and_decides_the_reasoning() {
    let popover = popover();
    assert_eq!(
        invoke(&popover, "chat_features", json!({ "model": "tiny" })).unwrap(),
        json!({ "thinking_switch": false, "sees_images": false })
    );
    let tiny = invoke(&popover, "prepare_builtin_model", Value::Null).unwrap();
    let source = std::path::PathBuf::from(tiny["model_dir"].as_str().unwrap());
    let thinker = DATA_ROOT.path().join("thinking-model");
    std::fs::create_dir_all(&thinker).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), thinker.join(entry.file_name())).unwrap();
    }
    std::fs::write(thinker.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
    assert_eq!(
        invoke(&popover, "chat_features", json!({ "model": thinker })).unwrap(),
        json!({ "thinking_switch": true, "sees_images": false })
    );

    let turn = |think: bool, channel: u32| {
        let request = json!({
            "model": thinker,
            "conversationId": format!("think-{think}"),
            "systemPrompt": null,
            "messages": [{ "role": "user", "content": "What is two and two?" }],
            // Sampled: greedy random weights may repeat one blank token.
            "settings": { "max_tokens": 6, "temperature": 1.0, "seed": 7 },
            "think": think,
            "onEvent": format!("__CHANNEL__:{channel}"),
        });
        invoke(&popover, "chat_send", request).unwrap()
    };
    // Switched on, the template opens <think>: every token the model writes
    // is reasoning (an end of sequence writes none), and all are counted.
    let thought = turn(true, 41);
    let generated = thought["generated_tokens"].as_u64().unwrap();
    let end_of_sequence = u64::from(thought["stop_reason"] == "eos");
    assert!(generated > end_of_sequence, "{thought}");
    assert_eq!(
        thought["reasoning_tokens"].as_u64().unwrap(),
        generated - end_of_sequence,
        "{thought}"
    );
    // Switched off, the model answers at once.
    let answered = turn(false, 42);
    assert_eq!(answered["reasoning_tokens"], 0, "{answered}");
    assert_eq!(answered["reasoning_ms"], 0.0, "{answered}");
    assert!(
        answered["prompt_tokens"].as_u64() < thought["prompt_tokens"].as_u64(),
        "no <think> in the prompt: {answered}"
    );
}

#[test]
fn a_damaged_model_folder_is_explained_without_cli_words_or_source_paths() {
    let popover = popover();
    let tiny = invoke(&popover, "prepare_builtin_model", Value::Null).unwrap();
    let source = std::path::PathBuf::from(tiny["model_dir"].as_str().unwrap());
    let chat = |folder: &std::path::Path, id: &str| {
        let request = json!({
            "model": folder,
            "conversationId": id,
            "systemPrompt": null,
            "messages": [{ "role": "user", "content": "hi" }],
            "settings": { "max_tokens": 2 },
            "onEvent": "__CHANNEL__:9",
        });
        invoke(&popover, "chat_send", request).unwrap_err()
    };

    // Weights that MLX cannot read: its own message, without the C++ and
    // Rust source locations it arrives with.
    let damaged = DATA_ROOT.path().join("damaged-model");
    std::fs::create_dir_all(&damaged).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), damaged.join(entry.file_name())).unwrap();
    }
    std::fs::write(
        damaged.join("model.safetensors"),
        b"\x08\0\0\0\0\0\0\0not json",
    )
    .unwrap();
    let error = chat(&damaged, "damaged");
    assert_eq!(error["kind"], "load", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("model.safetensors"), "{message}");
    assert_eq!(
        ondo::error_kind::out_of_place_in_the_app(message),
        None,
        "{message}"
    );

    // No weights at all: what to do, in words that fit the app.
    std::fs::remove_file(damaged.join("model.safetensors")).unwrap();
    let error = chat(&damaged, "no-weights");
    assert_eq!(error["kind"], "load", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("download the model again"), "{message}");
    assert_eq!(
        ondo::error_kind::out_of_place_in_the_app(message),
        None,
        "{message}"
    );
}

#[test]
fn settings_are_checked_applied_and_kept() {
    let window = popover();
    let mut settings = invoke(&window, "get_settings", Value::Null).unwrap();
    assert_eq!(settings["keep_alive_minutes"], 10);
    assert_eq!(settings["theme"], "system");
    settings["theme"] = json!("dark");
    settings["keep_alive_minutes"] = Value::Null;
    settings["generation"]["loop"] = json!("sync");
    invoke(
        &window,
        "set_settings",
        json!({ "settings": settings.clone() }),
    )
    .unwrap();
    // A new app (a restart) reads them back.
    let again = invoke(&popover(), "get_settings", Value::Null).unwrap();
    assert_eq!(again, settings);
    settings["keep_alive_minutes"] = json!(0);
    let error = invoke(&window, "set_settings", json!({ "settings": settings })).unwrap_err();
    assert_eq!(error["kind"], "invalid_input");
    assert!(error["message"].as_str().unwrap().contains("keep-alive"));
    settings["keep_alive_minutes"] = json!(5);
    settings["global_shortcut"] = json!("Shift+Nonsense+Q");
    let error = invoke(
        &window,
        "set_settings",
        json!({ "settings": settings.clone() }),
    )
    .unwrap_err();
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("CommandOrControl"),
        "{error}"
    );

    // Another models folder: created, and the library now looks there.
    let folder = DATA_ROOT.path().join("my-models");
    settings["global_shortcut"] = json!("CommandOrControl+Shift+O");
    settings["models_folder"] = json!(folder);
    invoke(&window, "set_settings", json!({ "settings": settings })).unwrap();
    assert!(folder.is_dir());
    let models = invoke(&window, "list_models", Value::Null).unwrap();
    assert_eq!(models["hf_cache_dir"], json!(folder));

    // Put the defaults back for the other tests of this binary.
    invoke(&window, "set_settings", json!({ "settings": {} })).unwrap();
}
