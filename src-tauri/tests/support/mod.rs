//! The harness of the IPC tests: the app built on Tauri's mock runtime
//! around the real core, and a command called through the real IPC path
//! (`get_ipc_response`), as the pages call it. Each test binary sets its
//! own environment (data folder, Hugging Face cache, hub) before the first
//! app is built.

use serde_json::Value;
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{INVOKE_KEY, MockRuntime, get_ipc_response, mock_builder, mock_context};
use tauri::webview::InvokeRequest;
use tauri::{WebviewWindow, WebviewWindowBuilder};

use ondo_os::PressureLevel;

/// A new app (a fresh start: its own session pool and engine over the
/// data folder in the environment) and its popover window. The pool sees
/// normal memory pressure whatever this machine is doing: a busy test
/// machine must not trim the caches or unload the models these tests look at.
pub fn popover() -> WebviewWindow<MockRuntime> {
    let app = ondo_app::run_app(mock_builder(), Box::new(|| PressureLevel::Normal))
        .build(mock_context(tauri::test::noop_assets()))
        .unwrap();
    WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap()
}

/// Calls `cmd` with `args` (camelCase keys, as the pages send them); the
/// answer, or the error as the page would receive it.
pub fn invoke(window: &WebviewWindow<MockRuntime>, cmd: &str, args: Value) -> Result<Value, Value> {
    let request = InvokeRequest {
        cmd: cmd.into(),
        callback: CallbackFn(0),
        error: CallbackFn(1),
        url: "tauri://localhost".parse().unwrap(),
        body: InvokeBody::Json(args),
        headers: Default::default(),
        invoke_key: INVOKE_KEY.to_string(),
    };
    get_ipc_response(window, request).map(|body| body.deserialize::<Value>().unwrap())
}

/// A data folder of its own for a test binary, offline, in the environment:
/// Ondo's data, an empty Hugging Face cache, no hub (fits of hub models fall
/// back to the catalog) and no keychain. Call it before any app is built.
#[allow(dead_code)] // ipc_in_flight's binary sets a hub of its own instead
pub fn offline_data_folder() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    // SAFETY: each test binary calls this (through a LazyLock every test
    // forces first) before it starts a thread that reads the environment.
    unsafe {
        std::env::set_var("ONDO_HOME", root.path().join("ondo"));
        std::env::set_var("HF_HUB_CACHE", root.path().join("hub"));
        std::env::set_var("HF_HUB_OFFLINE", "1");
        std::env::set_var("ONDO_NO_KEYCHAIN", "1");
    }
    root
}
