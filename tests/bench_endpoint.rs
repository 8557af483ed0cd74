//! `ondo bench --endpoint`: other programs' servers benchmarked side by side
//! with Ondo's engine, through the real `ondo` command, over real HTTP on
//! loopback, into a real run history.
//!
//! - `mlx_lm.server` from the project venv serves the same synthetic folder
//!   as Ondo's engine: the OpenAI dialect, its raw completion route, its
//!   usage counts and its refusals, and greedy text equal to Ondo's.
//! - A stand-in for Ollama written here (Ollama itself cannot be installed
//!   on these machines) speaks Ollama's wire format: `/api/version`,
//!   `/api/tags`, and `/api/generate` streaming one JSON object a line with
//!   nanosecond durations at the end, at a pace it sets, so that what Ondo
//!   measures at the client can be checked against known timings. It also
//!   asks for a key when told to.
//!
//! - `ondo serve`, Ondo's own server, in both its dialects, beside the
//!   engine in process: the same text, its own counts, and its requests in
//!   the same history as runs of kind `api`.

mod common;

use std::convert::Infallible;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use ondo::run_kinds::RunKind;
use ondo::store::record::EndpointDialect;
use ondo::store::{RunQuery, RunRecord, Store};
use serde_json::{Value, json};

/// `ondo ARGS` with its own data folder; the output, whatever the status.
fn ondo(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(args)
        .env("ONDO_HOME", root.join("ondo"))
        .env("HF_HOME", root.join("hf"))
        .env("ONDO_NO_KEYCHAIN", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn succeeded(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "ondo failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "ondo should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn history(root: &Path, kind: Option<RunKind>) -> Vec<RunRecord> {
    Store::open_default(&root.join("ondo"))
        .unwrap()
        .runs(&RunQuery {
            kind,
            include_warmup: true,
            ..RunQuery::default()
        })
        .unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn side<'a>(result: &'a Value, name: &str) -> &'a Value {
    result["sides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no side {name}: {result:#}"))
}

fn row<'a>(result: &'a Value, name: &str) -> &'a Value {
    result["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["side"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {result:#}"))
}

fn median(summary: &Value) -> f64 {
    summary["median"].as_f64().unwrap()
}

/// `mlx_lm.server` serving one folder on a free port, stopped on drop.
struct MlxLmServer {
    child: Child,
    port: u16,
    _hf_cache: tempfile::TempDir,
}

impl MlxLmServer {
    fn start(python: &Path, model: &Path) -> Self {
        // An empty cache of its own, so its model list names only the folder
        // (it fails listing without one) and it never goes to the hub.
        let hf_cache = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(python)
            .args(["-m", "mlx_lm.server", "--model"])
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .env("HF_HUB_CACHE", hf_cache.path())
            .env("HF_HUB_OFFLINE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Self {
            child,
            port,
            _hf_cache: hf_cache,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok();
            if ready {
                return server;
            }
            assert!(Instant::now() < deadline, "mlx_lm.server did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MlxLmServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn synth_tiny(root: &Path) -> PathBuf {
    let dir = root.join("tiny-folder");
    let out = ondo(root, &["synth", "tiny", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn mlx_lm_server_runs_beside_ondos_engine_on_the_same_folder() {
    let python = common::python();
    let root = tempfile::tempdir().unwrap();
    let folder = synth_tiny(root.path());
    let folder_text = folder.to_str().unwrap();
    let server = MlxLmServer::start(&python, &folder);
    let endpoint = format!("mlx=http://127.0.0.1:{}/v1#{folder_text}", server.port);
    let result = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            folder_text,
            "--endpoint",
            &endpoint,
            "--prompt-tokens",
            "40",
            "--gen",
            "8",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--loop",
            "pipelined",
            "--json",
        ],
    ));

    assert_eq!(result["reference"], "ondo pipelined");
    let mlx = side(&result, "mlx");
    assert_eq!(mlx["dialect"], "openai");
    assert_eq!(
        mlx["endpoint_url"],
        format!("http://127.0.0.1:{}/v1/completions", server.port),
        "the raw completion route, so no chat template adds tokens"
    );
    // Greedy, raw prompt, same weights: the same text as Ondo's engine.
    assert_eq!(mlx["same_text_as_ondo"], true, "{result:#}");

    let (ours, theirs) = (row(&result, "ondo pipelined"), row(&result, "mlx"));
    // Sized with the folder's tokenizer: the server counts what Ondo counted.
    assert_eq!(
        median(&theirs["server_prompt_tokens"]),
        median(&theirs["sent_prompt_tokens"])
    );
    assert_eq!(
        median(&ours["sent_prompt_tokens"]),
        median(&theirs["sent_prompt_tokens"])
    );
    let sent = median(&ours["sent_prompt_tokens"]);
    assert!((38.0..=40.0).contains(&sent), "{sent} tokens for 40");
    for r in [ours, theirs] {
        assert!(median(&r["ttft_ms"]) > 0.0);
        assert!(median(&r["decode_tps"]) > 0.0);
        assert_eq!(
            r["ttft_ms"]["samples"].as_array().unwrap().len(),
            2,
            "warm-up dropped"
        );
    }
    assert!(theirs["decode_ratio"].as_f64().unwrap() > 0.0);
    assert!(ours["decode_ratio"].is_null(), "the reference has no ratio");

    // Every run is in the history under one benchmark, the server's with its name.
    let runs = history(root.path(), None);
    let bench_id = result["bench_id"].as_str().unwrap();
    assert_eq!(runs.len(), 6, "{runs:#?}");
    assert!(runs.iter().all(|r| r.bench_id.as_deref() == Some(bench_id)));
    let served: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.kind == RunKind::Endpoint)
        .collect();
    assert_eq!(served.len(), 3);
    assert_eq!(served.iter().filter(|r| r.warmup).count(), 1);
    for run in served {
        assert_eq!(run.server_name.as_deref(), Some("mlx"));
        assert_eq!(run.endpoint_dialect, Some(EndpointDialect::OpenAi));
        assert_eq!(run.model_id, folder_text);
        assert_eq!(run.model_type, "llama", "described from the folder here");
        assert_eq!(run.server_prompt_tokens, Some(run.prompt_tokens));
        assert!(
            run.cached_tokens <= 1,
            "each prompt starts differently, so only BOS can come from its cache: {run:#?}"
        );
        assert_eq!(run.test.as_deref(), Some("pp40+tg8"));
        assert!(run.ttft_ms > 0.0 && run.decode_tps > 0.0);
        assert!(!run.endpoint_url.as_deref().unwrap().contains('#'));
    }
    let listed = ondo(root.path(), &["runs", "--bench", "latest"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(text.matches("endpoint mlx").count(), 2, "{text}");

    // Without Ondo's engine: a bare address is asked for its dialect, the
    // server named by its address, the prompts still sized with the folder's
    // tokenizer (Ondo finds the folder the server names).
    let alone = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            "--endpoint",
            &format!("{}#{folder_text}", server.url()),
            "--prompt-tokens",
            "24",
            "--gen",
            "4",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--json",
        ],
    ));
    let name = format!("127.0.0.1:{}", server.port);
    assert_eq!(alone["reference"], name.as_str());
    assert_eq!(side(&alone, &name)["dialect"], "openai");
    assert_eq!(alone["sides"].as_array().unwrap().len(), 1);
    assert_eq!(alone["prompt_sizing"], format!("{folder_text}'s tokenizer"));

    // A model the server does not have is named, with what it has.
    let stderr = failed(&ondo(
        root.path(),
        &[
            "bench",
            "--endpoint",
            &format!("{}/v1#no-such/model", server.url()),
            "--gen",
            "4",
            "--reps",
            "1",
        ],
    ));
    assert!(stderr.contains("has no model 'no-such/model'"), "{stderr}");
    assert!(
        stderr.contains(folder_text),
        "what it serves is listed: {stderr}"
    );
    assert!(
        stderr.contains("hint: name the model after '#'"),
        "{stderr}"
    );
}

/// `ondo serve` on a free port with the test's data folder, stopped on drop.
struct OndoServe(Child);

impl OndoServe {
    fn start(root: &Path) -> (Self, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ondo"))
            .args(["serve", "--port", "0"])
            .env("ONDO_HOME", root.join("ondo"))
            .env("HF_HOME", root.join("hf"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        (Self(child), url)
    }
}

impl Drop for OndoServe {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ondo bench --concurrency`: the same streams at once on Ondo's engine
/// and on mlx_lm.server, each stream recorded with its round's concurrency
/// and aggregate rate, and the HTML report charting the aggregate against
/// the streams.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn streams_at_once_are_measured_on_the_engine_and_on_mlx_lm_server() {
    let python = common::python();
    let root = tempfile::tempdir().unwrap();
    let folder = synth_tiny(root.path());
    let folder_text = folder.to_str().unwrap();
    let server = MlxLmServer::start(&python, &folder);
    let endpoint = format!("mlx=http://127.0.0.1:{}/v1#{folder_text}", server.port);
    let result = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            folder_text,
            "--endpoint",
            &endpoint,
            "--concurrency",
            "1,3",
            "--prompt-tokens",
            "24",
            "--gen",
            "12",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--json",
        ],
    ));
    assert_eq!(result["sides"], json!(["ondo", "mlx"]));
    assert_eq!(result["reference"], "ondo");
    let rows = result["rows"].as_array().unwrap();
    let levels: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["side"].as_str().unwrap().to_owned(),
                r["concurrency"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        levels,
        [("ondo", 1), ("mlx", 1), ("ondo", 3), ("mlx", 3)]
            .map(|(s, n)| (s.to_owned(), n))
            .to_vec()
    );
    for row in rows {
        assert!(median(&row["aggregate_tps"]) > 0.0, "{row}");
        assert!(
            median(&row["ttft_p95_ms"]) >= median(&row["ttft_p50_ms"]),
            "{row}"
        );
        assert_eq!(row["aggregate_tps"]["samples"].as_array().unwrap().len(), 2);
        let is_ondo = row["side"] == "ondo";
        assert_eq!(row["peak_bytes"].is_null(), !is_ondo, "{row}");
        assert_eq!(row["aggregate_ratio"].is_null(), is_ondo, "{row}");
        if row["concurrency"] == 1 {
            assert_eq!(row["scaling"], 1.0);
        }
    }
    // Every stream is in the history: 2 rounds of 1 and 2 of 3 on each
    // side, each with its round's concurrency and aggregate rate; Ondo's
    // three streams shared a batch.
    let runs = history(root.path(), None);
    assert_eq!(runs.len(), 2 * (2 + 6));
    assert!(
        runs.iter()
            .all(|r| r.aggregate_tps.is_some_and(|a| a > 0.0))
    );
    let ondo_three: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.kind == RunKind::Bench && r.concurrency == Some(3))
        .collect();
    assert_eq!(ondo_three.len(), 6);
    assert!(ondo_three.iter().any(|r| r.batch_max_rows >= Some(2)));
    let bench_id = result["bench_id"].as_str().unwrap();
    let html = root.path().join("concurrency.html");
    let out = ondo(
        root.path(),
        &[
            "report",
            "--bench",
            bench_id,
            "--out",
            html.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Streams at once: aggregate decode"), "{page}");
    assert!(page.contains("ondo ×3") && page.contains("mlx ×1"));
}

#[test]
fn ondo_serve_is_benchmarked_like_any_server_in_both_its_dialects() {
    let root = tempfile::tempdir().unwrap();
    let (_server, url) = OndoServe::start(root.path());
    let result = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            "tiny",
            "--endpoint",
            &format!("serve-openai={url}/v1#tiny"),
            "--endpoint",
            &format!("serve-ollama={url}/api#tiny"),
            "--prompt-tokens",
            "40",
            "--gen",
            "8",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--loop",
            "pipelined",
            "--json",
        ],
    ));
    for (name, dialect) in [("serve-openai", "openai"), ("serve-ollama", "ollama")] {
        let server = side(&result, name);
        assert_eq!(server["dialect"], dialect);
        // The same engine, greedy, the same raw prompt: the same text.
        assert_eq!(server["same_text_as_ondo"], true, "{name}: {result:#}");
        let theirs = row(&result, name);
        assert_eq!(
            median(&theirs["server_prompt_tokens"]),
            median(&theirs["sent_prompt_tokens"]),
            "{name}"
        );
        assert!(median(&theirs["ttft_ms"]) > 0.0 && median(&theirs["decode_tps"]) > 0.0);
    }
    // The client recorded each request as an endpoint run; the server, each
    // one it answered as an api run, in the same history.
    let client_side = history(root.path(), Some(RunKind::Endpoint));
    let server_side = history(root.path(), Some(RunKind::Api));
    assert_eq!(client_side.len(), 6, "{client_side:#?}");
    assert_eq!(server_side.len(), 6, "{server_side:#?}");
    assert!(
        server_side
            .iter()
            .all(|r| r.model_id == "tiny" && r.generated_tokens == 8),
        "{server_side:#?}"
    );
}

/// What the stand-in for Ollama was asked.
#[derive(Default)]
struct Asked {
    paths: Vec<String>,
    generate_bodies: Vec<Value>,
    /// When each generation was asked for.
    generate_at: Vec<Instant>,
}

/// The stand-in's behaviour.
#[derive(Clone)]
struct FakeOllama {
    asked: Arc<Mutex<Asked>>,
    /// `Authorization: Bearer` it requires, if any.
    key: Option<&'static str>,
}

/// Its pace: the first token after the "prefill", then one per step.
const FAKE_PREFILL: Duration = Duration::from_millis(150);
const FAKE_STEP: Duration = Duration::from_millis(20);
const FAKE_MODEL: &str = "fake-llm:latest";

impl FakeOllama {
    fn refused(&self, headers: &HeaderMap) -> Option<Response> {
        let key = self.key?;
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        (sent != Some(key)).then(|| {
            (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": "unauthorized"})),
            )
                .into_response()
        })
    }
}

async fn fake_version(State(fake): State<FakeOllama>, headers: HeaderMap) -> Response {
    fake.asked.lock().unwrap().paths.push("/api/version".into());
    if let Some(refused) = fake.refused(&headers) {
        return refused;
    }
    Json(json!({"version": "0.12.3"})).into_response()
}

async fn fake_tags(State(fake): State<FakeOllama>, headers: HeaderMap) -> Response {
    fake.asked.lock().unwrap().paths.push("/api/tags".into());
    if let Some(refused) = fake.refused(&headers) {
        return refused;
    }
    Json(json!({"models": [{"name": FAKE_MODEL, "model": FAKE_MODEL, "size": 1}]})).into_response()
}

async fn fake_generate(
    State(fake): State<FakeOllama>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    {
        let mut asked = fake.asked.lock().unwrap();
        asked.paths.push("/api/generate".into());
        asked.generate_bodies.push(body.clone());
        asked.generate_at.push(Instant::now());
    }
    if let Some(refused) = fake.refused(&headers) {
        return refused;
    }
    let model = body["model"].as_str().unwrap_or_default();
    if model != FAKE_MODEL && format!("{model}:latest") != FAKE_MODEL {
        let message = format!("model \"{model}\" not found, try pulling it first");
        return (StatusCode::NOT_FOUND, Json(json!({"error": message}))).into_response();
    }
    let tokens = body["options"]["num_predict"].as_u64().unwrap_or(8);
    // Its own prompt count: one token a word.
    let prompt_tokens = body["prompt"]
        .as_str()
        .unwrap_or_default()
        .split(' ')
        .count() as u64;
    let lines = futures_util::stream::iter(0..=tokens).then(move |i| async move {
        if i < tokens {
            tokio::time::sleep(if i == 0 { FAKE_PREFILL } else { FAKE_STEP }).await;
            let line = json!({"model": FAKE_MODEL, "response": " tok", "done": false});
            Ok::<_, Infallible>(format!("{line}\n"))
        } else {
            let line = json!({
                "model": FAKE_MODEL,
                "response": "",
                "done": true,
                "done_reason": "length",
                "total_duration": 400_000_000u64,
                "load_duration": 1_500_000u64,
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": FAKE_PREFILL.as_nanos() as u64,
                "eval_count": tokens,
                "eval_duration": (FAKE_STEP * tokens as u32).as_nanos() as u64,
            });
            Ok(format!("{line}\n"))
        }
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap()
}

/// Starts the stand-in on a free port; it lives as long as the test process.
fn start_fake_ollama(key: Option<&'static str>) -> (u16, Arc<Mutex<Asked>>) {
    let fake = FakeOllama {
        asked: Arc::default(),
        key,
    };
    let asked = fake.asked.clone();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new()
                .route("/api/version", get(fake_version))
                .route("/api/tags", get(fake_tags))
                .route("/api/generate", post(fake_generate))
                .with_state(fake);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (port, asked)
}

#[test]
fn ollamas_dialect_is_timed_at_the_client_beside_its_own_durations() {
    let root = tempfile::tempdir().unwrap();
    let (port, asked) = start_fake_ollama(None);
    let result = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            "--endpoint",
            &format!("http://127.0.0.1:{port}#fake-llm"),
            "--prompt-tokens",
            "32",
            "--gen",
            "5",
            "--reps",
            "3",
            "--warmup",
            "1",
            "--json",
        ],
    ));
    // Found by asking /api/version; named by its version.
    let ollama = side(&result, "ollama 0.12.3");
    assert_eq!(ollama["dialect"], "ollama");
    assert_eq!(
        ollama["endpoint_url"],
        format!("http://127.0.0.1:{port}/api/generate")
    );
    let r = row(&result, "ollama 0.12.3");
    // At the client: the first token after the stand-in's prefill, then
    // four more 20 ms apart.
    let ttft = median(&r["ttft_ms"]);
    assert!((150.0..1000.0).contains(&ttft), "TTFT {ttft} ms");
    let decode = median(&r["decode_tps"]);
    assert!((10.0..=51.0).contains(&decode), "decode {decode} tok/s");
    // Its own numbers, from nanoseconds: 5 tokens in 100 ms, 32-ish in 150 ms.
    assert_eq!(median(&r["own_decode_tps"]), 50.0);
    let own_prompt = median(&r["server_prompt_tokens"]);
    assert!((own_prompt / 0.150 - median(&r["own_prefill_tps"])).abs() < 1e-6);
    assert_eq!(median(&r["generated_tokens"]), 5.0);
    // No tokenizer for this model here: sized by characters, and said so.
    assert_eq!(result["prompt_sizing"], "about 4 characters a token");
    assert!(
        result["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("characters a token")),
        "{result:#}"
    );

    // What it was asked: the raw route, greedy, the plan's tokens, the model
    // from the fragment; prompts that differ from their first word.
    let asked = asked.lock().unwrap();
    assert_eq!(asked.generate_bodies.len(), 4);
    for body in &asked.generate_bodies {
        assert_eq!(body["model"], "fake-llm");
        assert_eq!(body["raw"], true);
        assert_eq!(body["stream"], true);
        assert_eq!(body["options"]["temperature"], 0);
        assert_eq!(body["options"]["num_predict"], 5);
    }
    let first_words: std::collections::HashSet<&str> = asked
        .generate_bodies
        .iter()
        .map(|b| b["prompt"].as_str().unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(first_words.len(), 4);
    assert!(asked.paths.iter().all(|p| !p.contains('#')));
    drop(asked);

    // The history keeps the server's own numbers in milliseconds.
    let runs = history(root.path(), Some(RunKind::Endpoint));
    assert_eq!(runs.len(), 4);
    let measured = &runs[1];
    assert_eq!(measured.server_name.as_deref(), Some("ollama 0.12.3"));
    assert_eq!(measured.endpoint_dialect, Some(EndpointDialect::Ollama));
    assert_eq!(measured.server_load_ms, Some(1.5));
    assert_eq!(measured.server_prefill_ms, Some(150.0));
    assert_eq!(measured.server_decode_ms, Some(100.0));
    assert_eq!(measured.server_decode_tps, Some(50.0));
    assert_eq!(measured.generated_tokens, 5);
    assert!(measured.ttft_ms >= 150.0);
    // Ondo's build and this machine, but no MLX: the server computed.
    let provenance = &measured.provenance;
    assert!(!provenance.app_version.is_empty() && !provenance.cpu.is_empty());
    assert!(provenance.ram_bytes > 0, "{provenance:?}");
    assert_eq!(
        (
            provenance.mlx_version.as_str(),
            provenance.mlx_rs_version.as_str()
        ),
        ("", "")
    );
    assert_eq!(provenance.backend, "");
    // The pool watched this machine's memory during the request.
    let levels = ["normal", "warning", "critical", "unknown"];
    assert!(
        levels.contains(&measured.pressure_max.as_str()),
        "{measured:#?}"
    );
}

#[test]
fn several_servers_alternate_who_goes_first_and_divide_by_the_first() {
    let root = tempfile::tempdir().unwrap();
    let (first_port, first) = start_fake_ollama(None);
    let (second_port, second) = start_fake_ollama(None);
    let result = succeeded(&ondo(
        root.path(),
        &[
            "bench",
            "--endpoint",
            &format!("http://127.0.0.1:{first_port}/api#fake-llm"),
            "--endpoint",
            &format!("http://127.0.0.1:{second_port}/api#fake-llm"),
            "--prompt-tokens",
            "16",
            "--gen",
            "2",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--json",
        ],
    ));
    // Two servers that call themselves the same are told apart.
    assert_eq!(result["reference"], "ollama 0.12.3");
    let second_row = row(&result, "ollama 0.12.3 (2)");
    assert!(second_row["ttft_ratio"].as_f64().unwrap() > 0.0);
    assert!(row(&result, "ollama 0.12.3")["ttft_ratio"].is_null());
    // The first round starts with the first server, the second with the other.
    let (first, second) = (first.lock().unwrap(), second.lock().unwrap());
    assert_eq!((first.generate_at.len(), second.generate_at.len()), (2, 2));
    assert!(first.generate_at[0] < second.generate_at[0]);
    assert!(second.generate_at[1] < first.generate_at[1]);
    // The same prompt for both in each round.
    for round in 0..2 {
        assert_eq!(
            first.generate_bodies[round]["prompt"],
            second.generate_bodies[round]["prompt"]
        );
    }
}

#[test]
fn refusals_and_wrong_addresses_are_named_with_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    let (port, _) = start_fake_ollama(Some("sesame"));
    let bench = |endpoint: String, extra: &[&str]| {
        let mut args = vec![
            "bench".to_owned(),
            "--endpoint".to_owned(),
            endpoint,
            "--prompt-tokens".to_owned(),
            "8".to_owned(),
            "--gen".to_owned(),
            "2".to_owned(),
            "--reps".to_owned(),
            "1".to_owned(),
            "--warmup".to_owned(),
            "0".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ondo(root.path(), &args)
    };
    let url = format!("http://127.0.0.1:{port}#fake-llm");

    let stderr = failed(&bench(url.clone(), &[]));
    assert!(
        stderr.contains("asks for an API key (401: unauthorized)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: pass the server's key with --api-key KEY"),
        "{stderr}"
    );

    let stderr = failed(&bench(url.clone(), &["--api-key", "wrong"]));
    assert!(stderr.contains("refused the API key"), "{stderr}");
    assert!(
        !stderr.contains("wrong"),
        "the key is not printed: {stderr}"
    );

    succeeded(&bench(url.clone(), &["--api-key", "sesame", "--json"]));
    // In the URL instead: the key stays out of the record.
    succeeded(&bench(
        format!("http://:sesame@127.0.0.1:{port}#fake-llm"),
        &["--json"],
    ));
    let runs = history(root.path(), Some(RunKind::Endpoint));
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter()
            .all(|r| !r.endpoint_url.as_deref().unwrap().contains("sesame"))
    );

    let stderr = failed(&bench(
        format!("http://127.0.0.1:{port}#llama3.2"),
        &["--api-key", "sesame"],
    ));
    assert!(
        stderr.contains("ollama 0.12.3 has no model 'llama3.2'") && stderr.contains(FAKE_MODEL),
        "{stderr}"
    );

    let nobody = free_port();
    let stderr = failed(&bench(format!("http://127.0.0.1:{nobody}#m"), &[]));
    assert!(
        stderr.contains(&format!("could not reach http://127.0.0.1:{nobody}/")),
        "{stderr}"
    );
    assert!(stderr.contains("hint: start the server first"), "{stderr}");

    let stderr = failed(&bench(format!("127.0.0.1:{port}#fake-llm"), &[]));
    assert!(stderr.contains("write it as URL#MODEL"), "{stderr}");
}
