//! Embeddings end to end on a synthetic Qwen3-Embedding-shaped folder
//! (`ondo synth tiny --arch qwen3 --embedding`): `ondo embed`'s vectors
//! equal mlx-lm's model body pooled at the last token and normalized
//! (tests/python/embed_reference.py), a batch equals each input alone, and
//! a real `ondo serve` answers the official `openai` and `ollama` clients
//! with the same vectors, refuses bad requests in each dialect's shape,
//! refuses chat on an embedding model (and embeddings of a chat model),
//! and records every call as a run of kind `embed`.

mod common;
#[path = "common/served.rs"]
mod served;

use std::path::{Path, PathBuf};
use std::process::Command;

use ondo::run_kinds::RunKind;
use ondo::store::{RunQuery, Store};
use serde_json::{Value, json};
use served::Served;

const EMBEDDER: &str = "ondo-test/embedder";
const CHATTER: &str = "ondo-test/chatter";

/// Texts of different lengths, so a batch pads.
const TEXTS: [&str; 4] = [
    "a cat sat",
    "The sea was calm and the boats came home before the storm.",
    "embeddings",
    "Ondo runs language models on this machine and says where the time goes.",
];

/// Ondo's data and a Hugging Face cache with an embedding model and a chat
/// model in it.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        let home = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        home.cache_model(EMBEDDER, &["--arch", "qwen3", "--embedding"]);
        home.cache_model(CHATTER, &["--arch", "qwen3"]);
        home
    }

    fn cache_model(&self, repo_id: &str, synth_args: &[&str]) -> PathBuf {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let repo = self
            .dir
            .path()
            .join("hf/hub")
            .join(format!("models--{}", repo_id.replace('/', "--")));
        let snapshot = repo.join("snapshots").join(commit);
        let written = self
            .ondo()
            .args(["synth", "tiny"])
            .arg(&snapshot)
            .args(synth_args)
            .output()
            .unwrap();
        assert!(written.status.success(), "{written:?}");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        snapshot
    }

    fn model_dir(&self, repo_id: &str) -> PathBuf {
        self.dir
            .path()
            .join("hf/hub")
            .join(format!("models--{}", repo_id.replace('/', "--")))
            .join("snapshots/0123456789abcdef0123456789abcdef01234567")
    }

    fn ondo(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command
            .env("ONDO_HOME", self.dir.path().join("ondo"))
            .env("HF_HOME", self.dir.path().join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("HF_HUB_CACHE")
            .env_remove("ONDO_API_KEY");
        command
    }

    /// `ondo embed --json` of `texts`.
    fn embed(&self, texts: &[&str], extra: &[&str]) -> Value {
        let output = self
            .ondo()
            .args(["embed", EMBEDDER])
            .args(texts)
            .arg("--json")
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn embed_runs(&self) -> Vec<ondo::store::RunRecord> {
        let store = Store::open_default(&self.dir.path().join("ondo")).unwrap();
        store
            .runs(&RunQuery {
                kind: Some(RunKind::Embed),
                last: Some(1000),
                ..RunQuery::default()
            })
            .unwrap()
    }
}

fn vectors(value: &Value) -> Vec<Vec<f64>> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn assert_close(found: &[Vec<f64>], expected: &[Vec<f64>], what: &str) {
    assert_eq!(found.len(), expected.len(), "{what}");
    for (i, (f, e)) in found.iter().zip(expected).enumerate() {
        let similarity = cosine(f, e);
        assert!(
            similarity > 1.0 - 1e-4,
            "{what}: vector {i} has cosine {similarity} to the reference"
        );
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn vectors_equal_mlx_lm_and_a_batch_equals_each_alone() {
    let home = Home::new();
    let batch = home.embed(&TEXTS, &[]);
    let batched = vectors(&batch["embeddings"]);
    assert_eq!(batch["dimensions"], 256);
    for vector in &batched {
        let norm = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "not normalized: {norm}");
    }

    let reference = Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/embed_reference.py"))
        .arg(home.model_dir(EMBEDDER))
        .arg(json!(TEXTS).to_string())
        .output()
        .unwrap();
    assert!(reference.status.success(), "{reference:?}");
    let reference: Value = serde_json::from_slice(&reference.stdout).unwrap();
    assert_eq!(reference["tokens"], batch["tokens_per_input"]);
    assert_close(&batched, &vectors(&reference["embeddings"]), "mlx-lm");

    let alone: Vec<Vec<f64>> = TEXTS
        .iter()
        .map(|text| vectors(&home.embed(&[text], &[])["embeddings"]).remove(0))
        .collect();
    assert_close(&batched, &alone, "one by one");

    // A Matryoshka prefix: the first dimensions, normalized again.
    let short = vectors(&home.embed(&TEXTS[..1], &["--dimensions", "32"])["embeddings"]);
    assert_close(&short, &[batched[0][..32].to_vec()], "dimensions 32");

    // Recorded: one run per call, its tokens those of every input.
    let runs = home.embed_runs();
    assert_eq!(runs.len(), 1 + TEXTS.len() + 1);
    let total: u64 = batch["tokens_per_input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(
        runs.iter()
            .any(|r| r.prompt_tokens == total && r.generated_tokens == 0)
    );
    assert!(runs.iter().all(|r| r.prefill_ms > 0.0));
}

fn openai_error(answer: &(u16, Value), status: u16, mentions: &str) {
    assert_eq!(answer.0, status, "{answer:?}");
    let message = answer.1["error"]["message"].as_str().unwrap_or_default();
    assert!(
        answer.1["error"]["type"].is_string() && message.contains(mentions),
        "{answer:?}"
    );
    assert!(!message.contains("/tmp"), "a server path leaked: {message}");
}

fn ollama_error(answer: &(u16, Value), status: u16, mentions: &str) {
    assert_eq!(answer.0, status, "{answer:?}");
    let message = answer.1["error"].as_str().unwrap_or_default();
    assert!(message.contains(mentions), "{answer:?}");
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn official_clients_get_the_vectors_and_bad_requests_their_dialects_errors() {
    let home = Home::new();
    let expected = vectors(&home.embed(&TEXTS, &["--no-history"])["embeddings"]);
    let served = Served::start(home.ondo());

    let clients = Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/embed_clients.py"))
        .args([&served.url, EMBEDDER, &json!(TEXTS).to_string()])
        .output()
        .unwrap();
    assert!(
        clients.status.success(),
        "{}",
        String::from_utf8_lossy(&clients.stderr)
    );
    let got: Value = serde_json::from_slice(&clients.stdout).unwrap();
    let openai = &got["openai"];
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["model"], EMBEDDER);
    assert_eq!(openai["indices"], json!([0, 1, 2, 3]));
    assert_eq!(openai["objects"][0], "embedding");
    assert_close(&vectors(&openai["embeddings"]), &expected, "openai float");
    assert_close(
        &vectors(&openai["base64_decoded_by_sdk"]),
        &expected,
        "openai base64 (SDK)",
    );
    assert_close(
        &[serde_json::from_value(openai["base64_wire_first"].clone()).unwrap()],
        &expected[..1],
        "openai base64 (wire)",
    );
    assert_close(
        &[serde_json::from_value(openai["single"].clone()).unwrap()],
        &expected[..1],
        "openai single",
    );
    assert_eq!(openai["short"].as_array().unwrap().len(), 16);
    assert!(openai["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        openai["usage"]["prompt_tokens"],
        openai["usage"]["total_tokens"]
    );

    let ollama = &got["ollama"];
    assert_close(&vectors(&ollama["embeddings"]), &expected, "ollama embed");
    assert_close(
        &vectors(&ollama["single"]),
        &expected[..1],
        "ollama embed one",
    );
    assert_close(
        &[serde_json::from_value(ollama["legacy"].clone()).unwrap()],
        &expected[..1],
        "ollama embeddings",
    );
    assert_eq!(
        ollama["prompt_eval_count"],
        openai["usage"]["prompt_tokens"]
    );
    assert!(ollama["total_duration"].as_u64().unwrap() > 0);

    // Token ids as input: the same tokens give the same vector.
    let ids = json!([[5, 6, 7, 8], [9, 10]]);
    let by_ids = served.post("/v1/embeddings", &json!({"model": EMBEDDER, "input": ids}));
    assert_eq!(by_ids.0, 200, "{by_ids:?}");
    assert_eq!(by_ids.1["usage"]["prompt_tokens"], 6);
    let flat = served.post(
        "/v1/embeddings",
        &json!({"model": EMBEDDER, "input": [5, 6, 7, 8]}),
    );
    assert_close(
        &[vectors(&json!([flat.1["data"][0]["embedding"]]))[0].clone()],
        &[vectors(&json!([by_ids.1["data"][0]["embedding"]]))[0].clone()],
        "token ids",
    );

    // Bad requests, each in its dialect's shape; the server serves on.
    let v1 = |body: Value| served.post("/v1/embeddings", &body);
    openai_error(&v1(json!({"model": EMBEDDER, "input": []})), 400, "empty");
    openai_error(&v1(json!({"model": EMBEDDER, "input": ""})), 400, "empty");
    openai_error(
        &v1(json!({"model": EMBEDDER, "input": {"a": 1}})),
        400,
        "input",
    );
    openai_error(
        &v1(json!({"model": EMBEDDER, "input": "x", "encoding_format": "int8"})),
        400,
        "base64",
    );
    openai_error(
        &v1(json!({"model": EMBEDDER, "input": "x", "dimensions": 4096})),
        400,
        "dimensions",
    );
    openai_error(
        &v1(json!({"model": EMBEDDER, "input": [[99999]]})),
        400,
        "vocabulary",
    );
    openai_error(&v1(json!({"input": "x"})), 400, "model");
    openai_error(&v1(json!({"model": "nobody/here", "input": "x"})), 404, "");
    // A chat model makes no embeddings, and an embedding model no chat.
    openai_error(
        &v1(json!({"model": CHATTER, "input": "x"})),
        400,
        "not an embedding model",
    );
    let chat = served.post(
        "/v1/chat/completions",
        &json!({"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    openai_error(&chat, 400, "embedding model");
    // Longer than the context (4096 tokens): OpenAI refuses, Ollama cuts
    // unless told not to.
    let long = "word ".repeat(6000);
    openai_error(
        &v1(json!({"model": EMBEDDER, "input": long})),
        400,
        "context",
    );
    let cut = served.post("/api/embed", &json!({"model": EMBEDDER, "input": long}));
    assert_eq!(cut.0, 200, "{cut:?}");
    assert_eq!(cut.1["prompt_eval_count"], 4096);
    ollama_error(
        &served.post(
            "/api/embed",
            &json!({"model": EMBEDDER, "input": long, "truncate": false}),
        ),
        400,
        "context",
    );
    ollama_error(
        &served.post("/api/embed", &json!({"model": EMBEDDER, "input": [1, 2]})),
        400,
        "input",
    );
    ollama_error(
        &served.post(
            "/api/embed",
            &json!({"model": EMBEDDER, "input": "x", "keep_alive": "soon"}),
        ),
        400,
        "keep_alive",
    );
    ollama_error(
        &served.post("/api/embed", &json!({"model": CHATTER, "input": "x"})),
        400,
        "not an embedding model",
    );
    ollama_error(
        &served.post(
            "/api/chat",
            &json!({"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}], "stream": false}),
        ),
        400,
        "embedding model",
    );
    ollama_error(
        &served.post("/api/embeddings", &json!({"model": EMBEDDER})),
        400,
        "prompt",
    );
    // Ollama's clients read what a model can do from /api/show.
    let shown = served.post("/api/show", &json!({"model": EMBEDDER}));
    assert_eq!(shown.1["capabilities"], json!(["embedding"]), "{shown:?}");
    let still = v1(json!({"model": EMBEDDER, "input": TEXTS[0]}));
    assert_eq!(still.0, 200, "{still:?}");

    // Every embedding served is in the history as kind embed.
    let runs = home.embed_runs();
    assert!(runs.len() >= 10, "{} embed runs recorded", runs.len());
    assert!(runs.iter().all(|r| r.model_id == EMBEDDER));
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn bert_vectors_equal_a_reference_and_a_batch_equals_each_alone() {
    let home = tempfile::tempdir().unwrap();
    let ondo = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command.env("ONDO_HOME", home.path().join("ondo"));
        command
    };
    for pooling in ["cls", "mean"] {
        let dir = home.path().join(format!("bert-{pooling}"));
        let written = ondo()
            .args(["synth", "tiny"])
            .arg(&dir)
            .args(["--encoder", "bert", "--pooling", pooling])
            .output()
            .unwrap();
        assert!(written.status.success(), "{written:?}");
        let embed = |texts: &[&str]| -> Value {
            let output = ondo()
                .arg("embed")
                .arg(&dir)
                .args(texts)
                .args(["--json", "--no-history"])
                .output()
                .unwrap();
            assert!(output.status.success(), "{output:?}");
            serde_json::from_slice(&output.stdout).unwrap()
        };
        let batch = embed(&TEXTS);
        let batched = vectors(&batch["embeddings"]);
        let reference = Command::new(common::python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/bert_reference.py"))
            .arg(&dir)
            .arg(json!(TEXTS).to_string())
            .output()
            .unwrap();
        assert!(reference.status.success(), "{reference:?}");
        let reference: Value = serde_json::from_slice(&reference.stdout).unwrap();
        assert_eq!(reference["tokens"], batch["tokens_per_input"], "{pooling}");
        assert_close(&batched, &vectors(&reference["embeddings"]), pooling);
        let alone: Vec<Vec<f64>> = TEXTS
            .iter()
            .map(|text| vectors(&embed(&[text])["embeddings"]).remove(0))
            .collect();
        assert_close(&batched, &alone, &format!("{pooling} one by one"));
    }
    // An encoder cannot chat, and says so.
    let chat = ondo()
        .arg("run")
        .arg(home.path().join("bert-cls"))
        .args(["hi", "--no-history"])
        .output()
        .unwrap();
    assert!(!chat.status.success());
    assert!(
        String::from_utf8_lossy(&chat.stderr).contains("embedding model"),
        "{chat:?}"
    );
}
