//! The local server as the app runs it, through the real IPC path and real
//! HTTP on loopback: it starts with the app when Settings say so, answers
//! clients from the app's own pool, restarts on a new port or key, says
//! when its port is taken, and lets go of its port when turned off.

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::LazyLock;
use std::time::Duration;

use ondo::app_settings::{AppSettings, LocalServerSettings};
use serde_json::{Value, json};
use support::invoke;
use tauri::WebviewWindow;
use tauri::test::MockRuntime;

/// A data folder of its own for this test binary, set in the environment
/// before any test builds an app.
static DATA_ROOT: LazyLock<tempfile::TempDir> = LazyLock::new(support::offline_data_folder);

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .is_ok()
}

fn saved_with(window: &WebviewWindow<MockRuntime>, server: LocalServerSettings) -> Value {
    let mut settings = invoke(window, "get_settings", Value::Null).unwrap();
    settings["local_server"] = serde_json::to_value(server).unwrap();
    settings
}

fn set_server(
    window: &WebviewWindow<MockRuntime>,
    server: LocalServerSettings,
) -> Result<Value, Value> {
    let settings = saved_with(window, server);
    invoke(window, "set_settings", json!({ "settings": settings }))
}

/// A client's request, answered by the app's server: the status and body.
fn ask(
    port: u16,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut request = reqwest::Client::new()
            .request(method, format!("http://127.0.0.1:{port}{path}"))
            .header("user-agent", "ipc-server-test/1")
            .timeout(Duration::from_secs(120));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    })
}

fn chat(port: u16, key: Option<&str>) -> (u16, Value) {
    let body = json!({
        "model": "tiny",
        "messages": [{ "role": "user", "content": "Say hello" }],
        "max_tokens": 4,
    });
    ask(
        port,
        reqwest::Method::POST,
        "/v1/chat/completions",
        key,
        Some(body),
    )
}

#[test]
fn the_app_serves_other_programs_as_its_settings_say() {
    LazyLock::force(&DATA_ROOT);
    // Turned on in a previous session: the app starts it.
    let first_port = free_port();
    let saved = AppSettings {
        local_server: LocalServerSettings {
            enabled: true,
            port: first_port,
            ..LocalServerSettings::default()
        },
        ..AppSettings::default()
    };
    let dirs = ondo::paths::DataDirs::from_env();
    let mut store = ondo::store::Store::open_default(&dirs.data_dir).unwrap();
    saved.save(&mut store).unwrap();
    drop(store);

    let window = support::popover();
    let status = invoke(&window, "server_status", Value::Null).unwrap();
    assert_eq!(status["state"], "on", "{status}");
    assert_eq!(
        status["status"]["url"],
        format!("http://127.0.0.1:{first_port}")
    );
    assert_eq!(status["status"]["requests_served"], 0);

    // A client lists the models and gets an answer from tiny.
    let (code, models) = ask(first_port, reqwest::Method::GET, "/v1/models", None, None);
    assert_eq!(code, 200, "{models}");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"tiny"), "{ids:?}");
    let (code, answer) = chat(first_port, None);
    assert_eq!(code, 200, "{answer}");
    assert!(answer["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let status = invoke(&window, "server_status", Value::Null).unwrap();
    assert_eq!(status["status"]["requests_served"], 1, "{status}");
    // The request is a run in the app's history, under the client's name.
    let runs = invoke(
        &window,
        "list_runs",
        json!({ "filter": { "last": 5, "kind": "api" } }),
    )
    .unwrap();
    assert!(
        runs.to_string().contains("ipc-server-test/1"),
        "the API request should be recorded: {runs}"
    );

    // A new port and a key: the server moves, and asks for the key.
    let second_port = free_port();
    set_server(
        &window,
        LocalServerSettings {
            enabled: true,
            port: second_port,
            api_key: Some("sk-ondo-test".into()),
            allowed_origins: Vec::new(),
        },
    )
    .unwrap();
    assert!(!listening(first_port), "the old port should be let go");
    assert_eq!(chat(second_port, None).0, 401);
    assert_eq!(chat(second_port, Some("sk-ondo-test")).0, 200);

    // A port another program holds: the settings are kept, and the error
    // says the port is taken, here and in the popover's line.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let error = set_server(
        &window,
        LocalServerSettings {
            enabled: true,
            port: taken_port,
            ..LocalServerSettings::default()
        },
    )
    .unwrap_err();
    assert_eq!(error["kind"], "address_unavailable", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&taken_port.to_string()),
        "{error}"
    );
    let status = invoke(&window, "server_status", Value::Null).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["error"]["kind"], "address_unavailable");
    assert!(!listening(second_port));
    let kept = invoke(&window, "get_settings", Value::Null).unwrap();
    assert_eq!(kept["local_server"]["port"], taken_port);

    // A bad port never reaches the server.
    let error = set_server(
        &window,
        LocalServerSettings {
            enabled: true,
            port: 80,
            ..LocalServerSettings::default()
        },
    )
    .unwrap_err();
    assert_eq!(error["kind"], "invalid_input", "{error}");

    // Turned off: nothing listens and the line is gone.
    drop(taken);
    let third_port = free_port();
    set_server(
        &window,
        LocalServerSettings {
            enabled: true,
            port: third_port,
            ..LocalServerSettings::default()
        },
    )
    .unwrap();
    assert!(listening(third_port));
    set_server(
        &window,
        LocalServerSettings {
            enabled: false,
            port: third_port,
            ..LocalServerSettings::default()
        },
    )
    .unwrap();
    assert!(
        !listening(third_port),
        "a server turned off must close its port"
    );
    assert_eq!(
        invoke(&window, "server_status", Value::Null).unwrap(),
        json!({ "state": "off" })
    );
}

#[test]
fn the_app_starts_without_its_server_when_the_port_is_taken() {
    LazyLock::force(&DATA_ROOT);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let saved = AppSettings {
        local_server: LocalServerSettings {
            enabled: true,
            port,
            ..LocalServerSettings::default()
        },
        ..AppSettings::default()
    };
    let dirs = ondo::paths::DataDirs::from_env();
    let mut store = ondo::store::Store::open_default(&dirs.data_dir).unwrap();
    saved.save(&mut store).unwrap();
    drop(store);

    let window = support::popover();
    let status = invoke(&window, "server_status", Value::Null).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["error"]["kind"], "address_unavailable");
    // The rest of the app works.
    assert_eq!(
        invoke(&window, "startup_check", Value::Null),
        Ok(Value::Null)
    );
    drop(taken);
}
