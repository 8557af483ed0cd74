//! The commands through the real IPC path (`mock_builder` + `get_ipc_response`)
//! and the real core, in a temporary data folder and an empty Hugging Face
//! cache: what the UI sends, and that the answers carry every field the UI
//! reads (ui/src/lib/backend.ts).

use std::sync::LazyLock;

use serde_json::{Value, json};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{INVOKE_KEY, MockRuntime, get_ipc_response, mock_builder, mock_context};
use tauri::webview::InvokeRequest;
use tauri::{WebviewWindow, WebviewWindowBuilder};

/// A data folder of its own for this test binary, set in the environment
/// before any test builds an app.
static DATA_ROOT: LazyLock<tempfile::TempDir> = LazyLock::new(|| {
    let root = tempfile::tempdir().unwrap();
    // SAFETY: every test forces this value before it does anything else, so
    // no other thread of this process reads the environment meanwhile.
    unsafe {
        std::env::set_var("ONDO_HOME", root.path().join("ondo"));
        std::env::set_var("HF_HUB_CACHE", root.path().join("hub"));
    }
    root
});

fn popover() -> WebviewWindow<MockRuntime> {
    LazyLock::force(&DATA_ROOT);
    let app = ondo_app::run_app(mock_builder())
        .build(mock_context(tauri::test::noop_assets()))
        .unwrap();
    WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap()
}

fn invoke(popover: &WebviewWindow<MockRuntime>, cmd: &str, args: Value) -> Result<Value, Value> {
    let request = InvokeRequest {
        cmd: cmd.into(),
        callback: CallbackFn(0),
        error: CallbackFn(1),
        url: "tauri://localhost".parse().unwrap(),
        body: InvokeBody::Json(args),
        headers: Default::default(),
        invoke_key: INVOKE_KEY.to_string(),
    };
    get_ipc_response(popover, request).map(|body| body.deserialize::<Value>().unwrap())
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
fn an_empty_library_offers_the_recommended_model() {
    let status = invoke(&popover(), "library_status", Value::Null).unwrap();
    assert_eq!(status["downloaded"], json!([]));
    assert_eq!(
        status["recommended_model_id"],
        "mlx-community/Llama-3.2-3B-Instruct-4bit"
    );
    assert_eq!(status["downloads_available"], false);
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
