//! `ondo serve` as other programs meet it: the real binary on a free port,
//! driven by the official `openai` (chat completions and the Responses API),
//! `anthropic` and `ollama` Python packages (from the project venv) and by
//! plain HTTP. Greedy answers equal `ondo run`'s;
//! streamed answers equal whole ones; twelve streams at once all finish
//! right; a client that hangs up frees the engine; every bad request gets its
//! status and a JSON error (naming no path on the server) and the server
//! serves on; only this machine, an allowed origin and the right key get in;
//! a client that sends nothing loses its connection and connections are
//! bounded; Ctrl-C answers what is in flight.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ondo::app_settings::AppSettings;
use ondo::run_kinds::{LoopShape, RunKind};
use ondo::session::chat::GenerationSettings;
use ondo::store::{RunQuery, Store};
use serde_json::{Value, json};

const SYSTEM: &str = "You answer briefly.";
const USER: &str = "Tell me about the sea.";
const MAX_TOKENS: usize = 12;
/// A synthetic model in the test's Hugging Face cache, named by repo id.
const VARIED: &str = "ondo-test/varied";
/// One whose chat template opens `<think>` when asked to think.
const THINKER: &str = "ondo-test/thinker";

/// One that answers by rote (tests/python/make_tool_caller.py): a tool call
/// when its turn opens, " sunny" after a tool's result.
const CALLER: &str = "ondo-test/caller";

/// Renders tools, tool calls in `<tool_call>` tags (so replies are read
/// for them) and tool results; after a result, the reply starts `Weather:`.
const TOOL_TEMPLATE: &str = "{{ bos_token }}\
{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}<|eot_id|>{% endif %}\
{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}\
{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n\
{% if messages[-1].role == 'tool' %}Weather:{% endif %}{% endif %}";

/// The call the rote model makes, as one token of its vocabulary.
const ROTE_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// A generation prompt that opens `<think>` when `enable_thinking` is set,
/// and renders tools.
const THINKING_TEMPLATE: &str = "{{ bos_token }}\
{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}<|eot_id|>{% endif %}\
{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}";

/// Ondo's data and a Hugging Face cache of its own, with two models in it.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        let home = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        home.cache_model(VARIED, &["--arch", "qwen3", "--seed", "1"]);
        let thinker = home.cache_model(THINKER, &[]);
        std::fs::write(thinker.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
        home
    }

    /// Writes a synthetic model where a download of `repo_id` would be.
    fn cache_model(&self, repo_id: &str, synth_args: &[&str]) -> PathBuf {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let repo = self
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

    /// Writes the rote tool caller ([`CALLER`]): a call when its turn
    /// opens, " sunny" after a tool's result.
    fn cache_rote_caller(&self) {
        let caller = self.cache_model(CALLER, &[]);
        std::fs::write(caller.join("chat_template.jinja"), TOOL_TEMPLATE).unwrap();
        let rules = json!({"call": ROTE_CALL, "\n\n": [ROTE_CALL], ":": [" sunny"]});
        let made = Command::new(common::python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/make_tool_caller.py"))
            .arg(&caller)
            .arg(rules.to_string())
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `ondo` binary with this home's environment.
    fn ondo(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ondo"));
        command
            .env("ONDO_HOME", self.path().join("ondo"))
            .env("HF_HOME", self.path().join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("HF_HUB_CACHE")
            .env_remove("ONDO_API_KEY");
        command
    }

    /// `ondo run`'s answer, as JSON.
    fn ondo_run(&self, model: &str, prompt: &str, extra: &[&str]) -> Value {
        let output = self
            .ondo()
            .args(["run", model, prompt, "--json", "--no-history"])
            .args(["--max-tokens", &MAX_TOKENS.to_string()])
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// The API runs in the history, oldest first.
    fn api_runs(&self) -> Vec<ondo::store::RunRecord> {
        let store = Store::open_default(&self.path().join("ondo")).unwrap();
        store
            .runs(&RunQuery {
                kind: Some(RunKind::Api),
                last: Some(1000),
                ..RunQuery::default()
            })
            .unwrap()
    }
}

/// A running `ondo serve` and what it logged.
struct Served {
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Served {
    fn start(home: &Home, args: &[&str]) -> Self {
        let mut child = home
            .ondo()
            .args(["serve", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = BufReader::new(child.stderr.take().unwrap());
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in stderr.lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            });
        }
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {first:?}; log: {:?}", log.lock().unwrap()))
            .to_owned();
        Self { child, url, log }
    }

    fn address(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn interrupt(&self) {
        // SAFETY: a plain signal to the child this test started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
    }

    fn post(&self, path: &str, body: &Value) -> Answer {
        http(
            &self.address(),
            "POST",
            path,
            &[],
            body.to_string().as_bytes(),
        )
    }

    fn get(&self, path: &str) -> Answer {
        http(&self.address(), "GET", path, &[], b"")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer, the body de-chunked.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on its own connection, read to the end.
fn http(address: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    // A server may answer (413) before reading a large body.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..end]).trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.extend(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 2 + size + 2..];
    }
    body
}

/// Runs one of the client scripts under tests/python with `common::python()`.
fn python_client(script: &str, served: &Served, scenario: &str, args: Value) -> Value {
    let python = common::python();
    let output: Output = Command::new(python)
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/python")
                .join(script),
        )
        .args([&served.url, scenario, &args.to_string()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script} {scenario}: {}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        served.log().join("\n")
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} {scenario} printed what is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn chat_body(model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        "max_tokens": MAX_TOKENS,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// The `data:` payloads of a server-sent event stream.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn real_openai_and_ollama_clients_get_what_ondo_run_says() {
    let home = Home::new();
    let expected = home.ondo_run(VARIED, USER, &["--system-prompt", SYSTEM]);
    let expected_text = expected["text"].as_str().unwrap();
    let raw_expected = home.ondo_run(VARIED, USER, &["--raw"]);
    let served = Served::start(&home, &[]);
    let args = json!({
        // Repo ids match without regard to case.
        "model": "ONDO-TEST/Varied",
        "system": SYSTEM,
        "user": USER,
        "max_tokens": MAX_TOKENS,
    });
    let openai = python_client("openai_client.py", &served, "basics", args.clone());
    let models: Vec<&str> = openai["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(models, ["tiny", THINKER, VARIED]);
    assert_eq!(openai["model"], VARIED);

    let chat = &openai["chat"];
    assert_eq!(
        chat["text"], expected_text,
        "the API's greedy answer differs from ondo run's"
    );
    assert_eq!(chat["model"], VARIED);
    assert_eq!(chat["finish_reason"], "length");
    assert_eq!(chat["usage"]["prompt_tokens"], expected["prompt_tokens"]);
    assert_eq!(chat["usage"]["completion_tokens"], MAX_TOKENS);
    assert_eq!(
        chat["usage"]["total_tokens"],
        expected["prompt_tokens"].as_u64().unwrap() + MAX_TOKENS as u64
    );
    let ondo = &chat["ondo"];
    assert_eq!(ondo["load_kind"], "cold");
    assert!(ondo["load_ms"].as_f64().unwrap() > 0.0);
    assert!(ondo["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(ondo["decode_tps"].as_f64().unwrap() > 0.0);
    assert!(ondo["mlx_peak_bytes"].as_u64().unwrap() > 0);
    assert!(ondo["run_id"].as_str().unwrap().starts_with("r-"));

    let streamed = &openai["streamed"];
    assert_eq!(
        streamed["text"], chat["text"],
        "streamed and whole answers differ"
    );
    assert_eq!(streamed["finish_reason"], "length");
    assert_eq!(streamed["role_chunks"], 1);
    // One chunk per token (empty while the detokenizer holds a word spelled
    // over several tokens).
    assert_eq!(streamed["content_chunks"], MAX_TOKENS, "{streamed}");
    assert_eq!(streamed["usage"]["completion_tokens"], MAX_TOKENS);
    assert_eq!(streamed["ondo"]["load_kind"], "warm");
    // The same prompt again continues its conversation's cache.
    assert!(
        streamed["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // A follow-up turn prefills only what is new.
    let follow_up = &openai["follow_up"];
    let cached = follow_up["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = follow_up["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= expected["prompt_tokens"].as_u64().unwrap() - 1,
        "{follow_up}"
    );
    assert!(cached < prompt);
    assert_eq!(follow_up["ondo"]["cached_tokens"], cached);
    assert_eq!(
        follow_up["ondo"]["prefill_tokens"].as_u64().unwrap(),
        prompt - cached
    );

    // Completions continue the raw text, as `ondo run --raw` does.
    assert_eq!(openai["completion"]["text"], raw_expected["text"]);
    assert_eq!(openai["completion_streamed"], openai["completion"]["text"]);
    assert_eq!(openai["completion"]["finish_reason"], "length");

    let args = json!({"model": VARIED, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS});
    let ollama = python_client("ollama_client.py", &served, "basics", args);
    let models: Vec<&str> = ollama["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(models, ["tiny", THINKER, VARIED]);
    for (name, answer) in [
        ("chat", &ollama["chat"]),
        ("chat_streamed", &ollama["chat_streamed"]),
        ("generate", &ollama["generate"]),
    ] {
        assert_eq!(answer["text"], expected_text, "{name}");
        assert_eq!(answer["done"], true, "{name}");
        assert_eq!(answer["done_reason"], "length", "{name}");
        assert_eq!(answer["eval_count"], MAX_TOKENS, "{name}");
        assert_eq!(
            answer["prompt_eval_count"], expected["prompt_tokens"],
            "{name}"
        );
        let total = answer["total_duration"].as_u64().unwrap();
        let eval = answer["eval_duration"].as_u64().unwrap();
        let prompt_eval = answer["prompt_eval_duration"].as_u64().unwrap();
        // Nanoseconds: a tiny model's decode takes well over a microsecond.
        assert!(eval > 1_000 && prompt_eval > 1_000, "{name}: {answer}");
        assert!(total >= eval + prompt_eval, "{name}: {answer}");
        assert_eq!(answer["load_duration"], 0, "{name}: warm by now");
    }
    // A line per token, and the last with the counters.
    assert_eq!(ollama["chat_streamed"]["parts"], MAX_TOKENS + 1, "{ollama}");
    assert_eq!(ollama["generate_streamed"], expected_text);
    assert_eq!(ollama["show"]["family"], "qwen3");
    // The synthetic template reads neither tools nor a thinking switch.
    assert_eq!(ollama["show"]["capabilities"], json!(["completion"]));
    assert_eq!(ollama["show"]["quantization_level"], "F32");
    assert!(ollama["show"]["context_length"].as_u64().unwrap() > 0);
    assert_eq!(ollama["ps"], json!([VARIED]));

    // Every generation is a recorded run of kind api, with its client.
    let runs = home.api_runs();
    // Five OpenAI generations, then four Ollama ones.
    assert_eq!(runs.len(), 9, "{:?}", served.log());
    assert!(runs.iter().all(|r| r.model_id == VARIED));
    let agents: Vec<&str> = runs
        .iter()
        .filter_map(|r| r.user_agent.as_deref())
        .collect();
    assert!(agents[0].starts_with("OpenAI/Python"), "{agents:?}");
    assert!(agents[8].starts_with("ollama-python"), "{agents:?}");
    let listed = home
        .ondo()
        .args(["runs", "--kind", "api", "--last", "1"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("api (ollama-python"), "{listed}");

    // The log has a line per request with where the time went.
    let log = served.log().join("\n");
    assert!(
        log.contains(&format!(
            "POST /v1/chat/completions · {VARIED} · 200 · prompt "
        )),
        "{log}"
    );
    assert!(log.contains("TTFT ") && log.contains(" tok/s"), "{log}");
    assert!(log.contains("GET /api/tags · 200"), "{log}");
}

/// The events of an Anthropic stream: each `event:` name with its data.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            let (name, data) = event
                .split_once('\n')
                .unwrap_or_else(|| panic!("no data in {event:?}"));
            let name = name.strip_prefix("event: ").unwrap().to_owned();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name, data)
        })
        .collect()
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn the_real_anthropic_client_gets_what_ondo_run_says() {
    let home = Home::new();
    let expected = home.ondo_run(VARIED, USER, &["--system-prompt", SYSTEM]);
    let prompt_tokens = expected["prompt_tokens"].as_u64().unwrap();
    let served = Served::start(&home, &[]);
    let args = json!({"model": VARIED, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS});
    let got = python_client("anthropic_client.py", &served, "basics", args);

    let whole = &got["whole"];
    assert_eq!(
        whole["text"], expected["text"],
        "the Messages API's greedy answer differs from ondo run's"
    );
    assert_eq!(whole["type"], "message");
    assert_eq!(whole["role"], "assistant");
    assert_eq!(whole["model"], VARIED);
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert_eq!(whole["content"][0]["type"], "text");
    assert_eq!(whole["stop_reason"], "max_tokens");
    assert!(whole["stop_sequence"].is_null());
    // A first request reads nothing from the cache: every prompt token is
    // an input token.
    assert_eq!(
        whole["usage"],
        json!({
            "input_tokens": prompt_tokens,
            "output_tokens": MAX_TOKENS,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }),
        "{whole}"
    );
    assert_eq!(whole["ondo"]["load_kind"], "cold");
    assert!(whole["ondo"]["run_id"].as_str().unwrap().starts_with("r-"));

    // Streamed, through the client's own stream helper: the same answer.
    let streamed = &got["streamed"];
    assert_eq!(streamed["text"], whole["text"], "streamed and whole differ");
    assert_eq!(streamed["text_events"], whole["text"]);
    assert_eq!(streamed["stop_reason"], "max_tokens");
    assert_eq!(streamed["usage"]["output_tokens"], MAX_TOKENS);
    let events: Vec<&str> = streamed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for name in [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "text",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ] {
        assert!(events.contains(&name), "no {name} in {events:?}");
    }
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    // The same prompt again: all but the last token come from the cache.
    let usage = &streamed["usage"];
    let cached = usage["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached > 0, "{usage}");
    assert_eq!(
        cached + usage["input_tokens"].as_u64().unwrap(),
        prompt_tokens
    );

    // Counted without generating: the prompt the template builds.
    assert_eq!(got["count_tokens"], prompt_tokens);
    assert_eq!(got["count_tokens_blocks"], prompt_tokens);

    // A follow-up turn prefills only what is new.
    let follow_up = &got["follow_up"]["usage"];
    let cached = follow_up["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached >= prompt_tokens - 1, "{follow_up}");
    assert!(follow_up["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(got["follow_up"]["ondo"]["cached_tokens"], cached);

    // Every generation is a recorded run of kind api, with its client.
    let runs = home.api_runs();
    assert_eq!(runs.len(), 3, "{:?}", served.log());
    assert!(runs.iter().all(|r| r.model_id == VARIED));
    assert!(
        runs.iter().all(|r| r
            .user_agent
            .as_deref()
            .is_some_and(|a| a.starts_with("Anthropic/Python"))),
        "{runs:?}"
    );
    let log = served.log().join("\n");
    assert!(
        log.contains(&format!("POST /v1/messages · {VARIED} · 200 · prompt ")),
        "{log}"
    );
    assert!(
        log.contains("POST /v1/messages/count_tokens · 200"),
        "{log}"
    );

    // On the wire, as Anthropic sends it: named events, a ping after the
    // start, Ondo's record on the message's delta.
    let wire = served.post(
        "/v1/messages",
        &json!({
            "model": VARIED, "max_tokens": 4, "stream": true, "temperature": 0,
            "messages": [{"role": "user", "content": USER}],
        }),
    );
    assert_eq!(wire.status, 200, "{}", wire.text());
    assert_eq!(wire.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&wire.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(
        events
            .iter()
            .all(|(name, data)| data["type"] == name.as_str())
    );
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 4);
    assert_eq!(delta["ondo"]["generated_tokens"], 4);

    // A stop sequence ends the reply where the text first reaches it, and
    // is named: the greedy answer's last characters (the model's words
    // are the same each time).
    let text = whole["text"].as_str().unwrap();
    let stop: String = text
        .chars()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let stopped = served
        .post(
            "/v1/messages",
            &json!({
                "model": VARIED, "max_tokens": MAX_TOKENS, "temperature": 0,
                "system": SYSTEM, "stop_sequences": ["never said", stop],
                "messages": [{"role": "user", "content": USER}],
            }),
        )
        .json();
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], stop.as_str());
    let cut = stopped["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(&stop),
        "{cut:?} of {text:?}"
    );

    // `thinking` switches the template's reasoning on: it comes back as a
    // thinking block, streamed as thinking deltas and an empty signature.
    // (Sampled: greedy random weights repeat one token, which may be blank.)
    let thinking = json!({
        "model": THINKER, "max_tokens": MAX_TOKENS, "temperature": 1.0,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": USER}],
    });
    let thought = served.post("/v1/messages", &thinking).json();
    assert_eq!(thought["content"][0]["type"], "thinking", "{thought}");
    assert!(
        !thought["content"][0]["thinking"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{thought}"
    );
    let mut streamed_thinking = thinking.clone();
    streamed_thinking["stream"] = json!(true);
    let events = sse_events(&served.post("/v1/messages", &streamed_thinking).text());
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .map(|(_, data)| data["delta"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(deltas.first(), Some(&"thinking_delta"), "{events:?}");
    assert!(deltas.contains(&"signature_delta"), "{events:?}");
    let mut plain = thinking.clone();
    plain["thinking"] = json!({"type": "disabled"});
    let plain = served.post("/v1/messages", &plain).json();
    assert_eq!(plain["content"][0]["type"], "text", "{plain}");
    let prompt = |answer: &Value| {
        answer["usage"]["input_tokens"].as_u64().unwrap()
            + answer["usage"]["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert!(
        prompt(&plain) < prompt(&thought),
        "the switched-off template opens no <think>"
    );

    // What it refuses, as the client's exceptions.
    let refused = python_client("anthropic_client.py", &served, "errors", json!({}));
    for (case, status, exception, error_type, words) in [
        (
            "no_max_tokens",
            400,
            "BadRequestError",
            "invalid_request_error",
            "max_tokens is required",
        ),
        (
            // Read, and refused by the model, which has no vision tower.
            "image",
            400,
            "BadRequestError",
            "invalid_request_error",
            "reads text only",
        ),
        (
            "unknown_block",
            400,
            "BadRequestError",
            "invalid_request_error",
            "'hologram'",
        ),
        (
            "unknown_model",
            404,
            "NotFoundError",
            "not_found_error",
            "org/missing",
        ),
        (
            "count_unknown_model",
            404,
            "NotFoundError",
            "not_found_error",
            "org/missing",
        ),
    ] {
        let got = &refused[case];
        assert_eq!(got["status"], status, "{case}: {got}");
        assert_eq!(got["exception"], exception, "{case}: {got}");
        assert_eq!(got["body"]["type"], "error", "{case}: {got}");
        assert_eq!(got["body"]["error"]["type"], error_type, "{case}: {got}");
        let message = got["body"]["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{case}: {message}");
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn an_anthropic_client_gets_tool_use_and_sends_the_result_back() {
    let home = Home::new();
    home.cache_rote_caller();
    let served = Served::start(&home, &[]);
    let args = json!({"model": CALLER, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS});
    let got = python_client("anthropic_client.py", &served, "tools", args);

    // The model's call comes back as a tool_use block, and the reply ends
    // for it.
    let call = &got["call"];
    assert_eq!(call["stop_reason"], "tool_use", "{call}");
    let content = call["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{call}");
    assert_eq!(content[0]["type"], "tool_use");
    assert_eq!(content[0]["name"], "get_weather");
    assert_eq!(content[0]["input"], json!({"city": "Paris"}));
    assert!(
        content[0]["id"].as_str().unwrap().starts_with("toolu_"),
        "{call}"
    );
    // Streamed, the input arrives as JSON text the client puts together.
    let streamed = &got["streamed"];
    assert_eq!(streamed["stop_reason"], "tool_use", "{streamed}");
    assert_eq!(streamed["content"][0]["type"], "tool_use");
    assert_eq!(streamed["content"][0]["input"], json!({"city": "Paris"}));
    assert!(
        streamed["events"]
            .as_array()
            .unwrap()
            .contains(&json!("input_json")),
        "{streamed}"
    );
    // The result went back into the prompt, and the model answered it.
    let answered = &got["answered"];
    assert_eq!(answered["stop_reason"], "end_turn", "{answered}");
    assert_eq!(
        answered["text"].as_str().unwrap().trim(),
        "sunny",
        "{answered}"
    );
    let prompt = |usage: &Value| {
        usage["input_tokens"].as_u64().unwrap() + usage["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert!(prompt(&answered["usage"]) > prompt(&call["usage"]) + 5);
    // tool_choice none: the tools are not offered, and what the model says
    // is its text, markers and all.
    let refused = &got["tool_choice_none"];
    assert_eq!(refused["stop_reason"], "end_turn", "{refused}");
    assert_eq!(refused["content"].as_array().unwrap().len(), 1);
    assert!(
        refused["text"].as_str().unwrap().contains("<tool_call>"),
        "{refused}"
    );
    assert!(prompt(&refused["usage"]) + 10 < prompt(&call["usage"]));
    // count_tokens counts the tools as the template renders them.
    assert_eq!(
        got["count_tokens"].as_u64().unwrap(),
        prompt(&call["usage"])
    );
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn the_real_openai_client_speaks_the_responses_api() {
    let home = Home::new();
    let expected = home.ondo_run(VARIED, USER, &["--system-prompt", SYSTEM]);
    let prompt_tokens = expected["prompt_tokens"].as_u64().unwrap();
    let served = Served::start(&home, &[]);
    let args = json!({"model": VARIED, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS});
    let got = python_client("responses_client.py", &served, "basics", args);

    // The greedy answer is ondo run's, as the client reads it (its
    // output_text, put together from the output items).
    let whole = &got["whole"];
    assert_eq!(
        whole["output_text"], expected["text"],
        "the Responses API's greedy answer differs from ondo run's"
    );
    assert_eq!(whole["object"], "response");
    assert!(
        whole["id"].as_str().unwrap().starts_with("resp_"),
        "{whole}"
    );
    assert_eq!(whole["model"], VARIED);
    assert_eq!(whole["status"], "incomplete");
    assert_eq!(
        whole["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(whole["instructions"], SYSTEM);
    assert_eq!(whole["metadata"], json!({"purpose": "test"}));
    let output = whole["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{whole}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert!(output[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(output[0]["content"][0]["type"], "output_text");
    assert_eq!(
        whole["usage"],
        json!({
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": MAX_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + MAX_TOKENS as u64,
        }),
        "{whole}"
    );
    assert_eq!(whole["ondo"]["load_kind"], "cold");

    // Streamed through the client's helper: the same text, in OpenAI's
    // events, and the same prompt read from the cache but for its last token.
    let streamed = &got["streamed"];
    assert_eq!(streamed["output_text"], whole["output_text"]);
    assert_eq!(streamed["text_deltas"], whole["output_text"]);
    assert_eq!(streamed["status"], "incomplete");
    assert_eq!(
        streamed["usage"]["input_tokens_details"]["cached_tokens"],
        prompt_tokens - 1
    );
    let events: Vec<&str> = streamed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let deltas = events
        .iter()
        .filter(|e| **e == "response.output_text.delta")
        .count();
    assert!(deltas > 1, "{events:?}");
    let others: Vec<&str> = events
        .iter()
        .copied()
        .filter(|e| *e != "response.output_text.delta")
        .collect();
    assert_eq!(
        others,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );

    // previous_response_id continues the conversation: its prompt holds
    // the first turn's, which the cache gives back.
    let follow_up = &got["follow_up"];
    assert_eq!(follow_up["previous_response_id"], whole["id"]);
    let usage = &follow_up["usage"];
    assert!(
        usage["input_tokens"].as_u64().unwrap() > prompt_tokens + MAX_TOKENS as u64 / 2,
        "{usage}"
    );
    assert!(
        usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= prompt_tokens,
        "{usage}"
    );
    // One not stored is not there to continue.
    assert_eq!(got["unstored"]["store"], false);
    let missing = &got["after_unstored"];
    assert_eq!(missing["status"], 404, "{missing}");
    assert_eq!(missing["exception"], "NotFoundError");
    assert_eq!(
        missing["body"]["message"],
        format!(
            "Previous response with id '{}' not found.",
            got["unstored"]["id"].as_str().unwrap()
        )
    );
    assert_eq!(missing["body"]["type"], "invalid_request_error");
    // Retrieved as it was answered; deleted, it is gone.
    assert_eq!(got["retrieved"], got["whole"]);
    assert_eq!(got["after_delete"]["status"], 404);
    assert_eq!(got["after_delete"]["exception"], "NotFoundError");
    let deleted = http(
        &served.address(),
        "DELETE",
        &format!("/v1/responses/{}", follow_up["id"].as_str().unwrap()),
        &[],
        b"",
    );
    assert_eq!(
        deleted.json(),
        json!({"id": follow_up["id"], "object": "response", "deleted": true})
    );
    let again = http(
        &served.address(),
        "DELETE",
        &format!("/v1/responses/{}", follow_up["id"].as_str().unwrap()),
        &[],
        b"",
    );
    assert_eq!(again.status, 404);
    assert_eq!(again.json()["error"]["type"], "invalid_request_error");

    // The same conversation through chat completions: the same words.
    let chat = served
        .post(
            "/v1/chat/completions",
            &chat_body(VARIED, json!({"temperature": 0})),
        )
        .json();
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        whole["output_text"]
    );

    // Every generation is a recorded run, logged under its route.
    let runs = home.api_runs();
    assert_eq!(runs.len(), 5, "{:?}", served.log());
    assert!(
        runs[..4].iter().all(|r| r
            .user_agent
            .as_deref()
            .is_some_and(|a| a.starts_with("OpenAI/Python"))),
        "{runs:?}"
    );
    let log = served.log().join("\n");
    assert!(
        log.contains(&format!("POST /v1/responses · {VARIED} · 200 · prompt ")),
        "{log}"
    );

    // On the wire: named events, numbered in order, the item's id in each
    // delta, Ondo's record on the final response.
    let wire = served.post(
        "/v1/responses",
        &json!({"model": VARIED, "input": USER, "max_output_tokens": 4, "temperature": 0,
                "stream": true}),
    );
    assert_eq!(wire.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&wire.text());
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i, "{name}");
    }
    let (_, added) = &events[2];
    let item_id = added["item"]["id"].as_str().unwrap();
    assert_eq!(added["item"]["status"], "in_progress");
    let (_, delta) = &events[4];
    assert_eq!(delta["item_id"], item_id);
    assert_eq!(
        (&delta["output_index"], &delta["content_index"]),
        (&json!(0), &json!(0))
    );
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(last["response"]["ondo"]["generated_tokens"], 4);
    assert_eq!(last["response"]["output"][0]["id"], item_id);

    // `reasoning.effort` switches the template's thinking on: the reasoning
    // comes back as a reasoning item, streamed as reasoning_text deltas.
    // (Sampled: greedy random weights repeat one token, which may be blank.)
    let thinking = json!({
        "model": THINKER, "input": USER, "max_output_tokens": MAX_TOKENS,
        "temperature": 1.0, "reasoning": {"effort": "medium"},
    });
    let thought = served.post("/v1/responses", &thinking).json();
    let item = &thought["output"][0];
    assert_eq!(item["type"], "reasoning", "{thought}");
    assert!(item["id"].as_str().unwrap().starts_with("rs_"), "{thought}");
    assert_eq!(item["content"][0]["type"], "reasoning_text");
    assert!(!item["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(
        thought["usage"]["output_tokens_details"]["reasoning_tokens"],
        thought["ondo"]["reasoning_tokens"]
    );
    let mut streamed_thinking = thinking.clone();
    streamed_thinking["stream"] = json!(true);
    let events = sse_events(&served.post("/v1/responses", &streamed_thinking).text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta"
        ],
        "{names:?}"
    );
    assert!(names.contains(&"response.reasoning_text.done"), "{names:?}");
    let mut plain = thinking.clone();
    plain["reasoning"] = json!({"effort": "none"});
    let plain = served.post("/v1/responses", &plain).json();
    assert!(
        plain["usage"]["input_tokens"].as_u64() < thought["usage"]["input_tokens"].as_u64(),
        "the switched-off template opens no <think>"
    );

    // A body that is not a request, and an item this server does not read:
    // 400 in OpenAI's shape, and the server serves on.
    for body in [
        json!({"input": "no model"}),
        json!({"model": VARIED, "input": [{"type": "item_reference", "id": "x"}]}),
    ] {
        let refused = served.post("/v1/responses", &body);
        assert_eq!(refused.status, 400, "{}", refused.text());
        assert_eq!(refused.json()["error"]["type"], "invalid_request_error");
    }

    // What it refuses, as the client's exceptions.
    let refused = python_client("responses_client.py", &served, "errors", json!({}));
    for (case, status, exception, words) in [
        (
            "json_schema",
            400,
            "BadRequestError",
            "text.format: the schema cannot be enforced",
        ),
        ("image", 400, "BadRequestError", "reads text only"),
        ("unknown_model", 404, "NotFoundError", "org/missing"),
        (
            "unknown_previous",
            404,
            "NotFoundError",
            "'resp_missing' not found",
        ),
    ] {
        let got = &refused[case];
        assert_eq!(got["status"], status, "{case}: {got}");
        assert_eq!(got["exception"], exception, "{case}: {got}");
        let message = got["body"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{case}: {message}");
    }
    // A hosted tool (as Codex CLI may send beside its functions) is not
    // offered to the model, and the request is answered.
    assert_eq!(
        refused["web_search"]["status"], 200,
        "{}",
        refused["web_search"]
    );
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_responses_client_gets_function_calls_and_sends_the_output_back() {
    let home = Home::new();
    home.cache_rote_caller();
    let served = Served::start(&home, &[]);
    let args = json!({"model": CALLER, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS});
    let got = python_client("responses_client.py", &served, "tools", args);

    // The model's call comes back as a function_call item.
    let call = &got["call"];
    assert_eq!(call["status"], "completed", "{call}");
    let output = call["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{call}");
    assert_eq!(output[0]["type"], "function_call");
    assert_eq!(output[0]["name"], "get_weather");
    assert_eq!(output[0]["status"], "completed");
    let arguments: Value = serde_json::from_str(output[0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert!(output[0]["id"].as_str().unwrap().starts_with("fc_"));
    assert!(output[0]["call_id"].as_str().unwrap().starts_with("call_"));
    // Streamed, the arguments arrive in their own events.
    let streamed = &got["streamed"];
    assert_eq!(streamed["output"][0]["type"], "function_call", "{streamed}");
    assert_eq!(streamed["argument_deltas"], output[0]["arguments"]);
    for name in [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.completed",
    ] {
        assert!(
            streamed["events"]
                .as_array()
                .unwrap()
                .contains(&json!(name)),
            "no {name}: {streamed}"
        );
    }
    // The output went back (after the stored call, and with the whole
    // conversation sent again), and the model answered it.
    for case in ["answered", "resent"] {
        let answered = &got[case];
        assert_eq!(answered["status"], "completed", "{case}: {answered}");
        assert_eq!(
            answered["output_text"].as_str().unwrap().trim(),
            "sunny",
            "{case}: {answered}"
        );
    }
    assert_eq!(
        got["answered"]["usage"]["input_tokens"],
        got["resent"]["usage"]["input_tokens"]
    );
    assert!(
        got["answered"]["usage"]["input_tokens"].as_u64().unwrap()
            > call["usage"]["input_tokens"].as_u64().unwrap() + 5
    );
    // tool_choice none: no tools offered, the markers are text.
    let refused = &got["tool_choice_none"];
    assert_eq!(refused["output"][0]["type"], "message", "{refused}");
    assert!(
        refused["output_text"]
            .as_str()
            .unwrap()
            .contains("<tool_call>"),
        "{refused}"
    );
}

/// A person, as the structured-output tests ask for one: every string
/// bounded, so even random weights finish the object within the budget.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "role": {"enum": ["admin", "user"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["role", "age"],
        "additionalProperties": false,
    })
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn outputs_held_to_a_json_schema_are_valid_through_every_official_client() {
    let home = Home::new();
    let schema = person_schema();
    let budget = 300;
    // ondo run holds its answer to the same schema: the greedy answer every
    // dialect must give.
    let output = home
        .ondo()
        .args(["run", VARIED, USER, "--json", "--no-history"])
        .args(["--max-tokens", &budget.to_string()])
        .args(["--json-schema", &schema.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let expected: Value = serde_json::from_slice(&output.stdout).unwrap();
    let expected_text = expected["text"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(expected_text)
        .unwrap_or_else(|e| panic!("ondo run's held answer is not JSON: {e}: {expected_text:?}"));
    assert!(
        parsed["role"] == "admin" || parsed["role"] == "user",
        "{parsed}"
    );
    assert_eq!(expected["stop_reason"], "eos", "{expected}");
    assert_eq!(expected["constraint"]["kind"], "json_schema");

    let served = Served::start(&home, &[]);
    let args = json!({"model": VARIED, "user": USER, "max_tokens": budget, "schema": schema});
    let got = python_client("structured_client.py", &served, "dialects", args);
    for dialect in [
        "chat",
        "chat_streamed",
        "responses",
        "ollama_chat",
        "anthropic",
    ] {
        assert_eq!(got[dialect]["valid"], true, "{dialect}: {}", got[dialect]);
    }
    // "json" bounds no string: random weights may run out of tokens inside
    // one, but what they wrote is an object's start, and a finished one is
    // an object.
    let any_object = &got["ollama_generate_json"];
    assert!(
        any_object["text"].as_str().unwrap().starts_with('{'),
        "{any_object}"
    );
    if any_object["done_reason"] == "stop" {
        assert_eq!(any_object["valid"], true, "{any_object}");
    }
    // One prompt, one greedy walk through one grammar: the same text.
    for dialect in [
        "chat",
        "chat_streamed",
        "responses",
        "ollama_chat",
        "anthropic",
    ] {
        assert_eq!(got[dialect]["text"], expected_text, "{dialect}");
    }
    assert_eq!(got["chat"]["finish_reason"], "stop");
    assert_eq!(got["anthropic"]["stop_reason"], "end_turn");
    assert_eq!(got["responses"]["format_echoed"], "json_schema");
    // The SDKs' own helpers parse the reply into the model they asked with.
    for helper in ["chat_parse", "responses_parse"] {
        let person = &got[helper]["parsed"];
        assert!(person["age"].is_i64(), "{helper}: {}", got[helper]);
    }
    let ondo = &got["chat"]["ondo"];
    assert_eq!(ondo["constraint"]["kind"], "json_schema", "{ondo}");
    assert!(ondo["constraint"]["masks"].as_u64().unwrap() > 0, "{ondo}");

    // The history says which runs were held, and what a mask cost.
    let runs = home.api_runs();
    assert!(!runs.is_empty());
    for run in &runs {
        let kind = run.constraint.as_deref();
        assert!(
            kind == Some("json_schema") || kind == Some("json_object") || kind == Some("tool_call"),
            "{:?}",
            run.constraint
        );
        assert!(run.mask_ms_per_token.is_some_and(|ms| ms > 0.0), "{run:?}");
    }

    // A call forced by tool_choice is a call, its arguments held to the
    // tool's parameters, even from random weights.
    let parameters = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": false,
    });
    let args = json!({"model": VARIED, "max_tokens": budget, "parameters": parameters});
    let called = python_client("structured_client.py", &served, "tools", args);
    for dialect in ["chat", "responses", "anthropic"] {
        let got = &called[dialect];
        assert_eq!(got["names"], json!(["get_weather"]), "{dialect}: {got}");
        assert_eq!(got["arguments"][0]["valid"], true, "{dialect}: {got}");
    }
    assert_eq!(called["chat"]["finish_reason"], "tool_calls");
    assert_eq!(called["anthropic"]["stop_reason"], "tool_use");

    // A schema the grammar engine refuses is each dialect's 400, quoting it.
    let refused = python_client(
        "structured_client.py",
        &served,
        "errors",
        json!({"model": VARIED}),
    );
    for client in ["openai", "ollama", "anthropic"] {
        assert_eq!(
            refused[client]["status"], 400,
            "{client}: {}",
            refused[client]
        );
        let message = refused[client]["message"].as_str().unwrap();
        assert!(message.contains("strng"), "{client}: {message}");
    }
}

#[test]
fn each_final_answer_carries_ondos_record_and_streams_end_with_done() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    let whole = served.post("/v1/chat/completions", &chat_body("tiny", json!({})));
    assert_eq!(whole.status, 200, "{}", whole.text());
    let whole = whole.json();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["ondo"]["model"], "tiny");

    let streamed = served.post(
        "/v1/chat/completions",
        &chat_body("tiny", json!({"stream": true})),
    );
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    let events = sse_data(&streamed.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["ondo"]["generated_tokens"], MAX_TOKENS);
    assert!(last.get("usage").is_none(), "usage only when asked for");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // Ollama streams JSON lines by default, the counters on the last.
    let lines = served.post(
        "/api/generate",
        &json!({"model": "tiny", "prompt": USER, "options": {"num_predict": 4}}),
    );
    assert_eq!(lines.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = lines
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert!(lines[..4].iter().all(|l| l["done"] == false));
    assert_eq!(lines[4]["eval_count"], 4);
    assert!(lines[4]["ondo"]["run_id"].is_string());
    let version = served.get("/api/version").json();
    assert!(version["version"].is_string());
    assert_eq!(served.get("/").text(), "Ondo is running");
}

#[test]
fn templates_get_thinking_and_tools_from_the_request() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    // Sampled: greedy random weights repeat one token, which may be blank.
    let sampled = |extra: Value| {
        let mut body = chat_body(THINKER, json!({"temperature": 1.0, "seed": 7}));
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // The template opens <think>: everything the model says is reasoning.
    let thinking = served
        .post(
            "/v1/chat/completions",
            &sampled(json!({"chat_template_kwargs": {"enable_thinking": true}})),
        )
        .json();
    let message = &thinking["choices"][0]["message"];
    assert!(
        !message["reasoning_content"].as_str().unwrap().is_empty(),
        "{thinking}"
    );
    assert_eq!(message["content"], "");
    // Every generated token was reasoning but an end of sequence, which
    // writes no text; all of them are counted and timed.
    let usage = &thinking["usage"];
    let end_of_sequence = u64::from(thinking["choices"][0]["finish_reason"] == "stop");
    let reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        reasoning_tokens,
        usage["completion_tokens"].as_u64().unwrap() - end_of_sequence,
        "{thinking}"
    );
    let ondo = &thinking["ondo"];
    assert_eq!(ondo["reasoning_tokens"], reasoning_tokens);
    let (reasoning_ms, decode_ms) = (
        ondo["reasoning_ms"].as_f64().unwrap(),
        ondo["decode_ms"].as_f64().unwrap(),
    );
    assert!(
        reasoning_ms > 0.0 && reasoning_ms <= decode_ms,
        "reasoning {reasoning_ms} ms of {decode_ms} ms decoding"
    );
    let plain = served
        .post("/v1/chat/completions", &sampled(json!({})))
        .json();
    assert!(
        plain["choices"][0]["message"]
            .get("reasoning_content")
            .is_none()
    );
    assert_eq!(
        plain["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );
    assert_eq!(plain["ondo"]["reasoning_ms"], 0.0);
    assert!(plain["usage"]["prompt_tokens"].as_u64() < thinking["usage"]["prompt_tokens"].as_u64());
    // Streamed, the reasoning comes as reasoning_content deltas.
    let streamed = served.post(
        "/v1/chat/completions",
        &sampled(json!({"stream": true, "chat_template_kwargs": {"enable_thinking": true}})),
    );
    let chunks: Vec<Value> = sse_data(&streamed.text())
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .collect();
    let delta_text = |field: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][field].as_str().map(str::to_owned))
            .collect()
    };
    // (Sampled after a cache hit, the words may differ from the first.)
    assert!(!delta_text("reasoning_content").is_empty(), "{chunks:?}");
    assert_eq!(delta_text("content"), "");
    // Ollama's think is the same switch, and the reasoning its `thinking`.
    let ollama = served
        .post(
            "/api/chat",
            &json!({
                "model": THINKER, "stream": false, "think": true,
                "messages": [{"role": "user", "content": USER}],
                "options": {"num_predict": 6, "temperature": 1.0, "seed": 7},
            }),
        )
        .json();
    assert!(
        !ollama["message"]["thinking"].as_str().unwrap().is_empty(),
        "{ollama}"
    );
    // The history keeps the count for each of those runs.
    let recorded: Vec<(u64, u64)> = home
        .api_runs()
        .iter()
        .map(|r| (r.generated_tokens, r.reasoning_tokens))
        .collect();
    assert!(recorded.contains(&(
        usage["completion_tokens"].as_u64().unwrap(),
        reasoning_tokens
    )));
    assert!(
        recorded
            .iter()
            .any(|&(generated, reasoning)| generated > 0 && reasoning == 0)
    );

    // The official clients read the reasoning where their servers put it.
    let args = json!({
        "model": THINKER, "system": SYSTEM, "user": USER, "max_tokens": MAX_TOKENS, "seed": 7,
    });
    // Without Python (ONDO_SKIP_PYTHON), the checks above still ran.
    if !cfg!(ondo_skip_python) {
        let got = python_client("openai_client.py", &served, "thinking", args.clone());
        for way in ["whole", "streamed"] {
            let answer = &got[way];
            assert!(!answer["reasoning"].as_str().unwrap().is_empty(), "{got}");
            assert_eq!(answer["text"].as_str().unwrap_or(""), "", "{got}");
            assert!(
                answer["usage"]["reasoning_tokens"].as_u64().unwrap() > 0,
                "{got}"
            );
        }
        let got = python_client("ollama_client.py", &served, "thinking", args);
        for way in ["whole", "streamed"] {
            assert!(!got[way]["thinking"].as_str().unwrap().is_empty(), "{got}");
            assert_eq!(got[way]["text"], "", "{got}");
        }
    }
    // Ollama's clients learn from /api/show that this model takes tools and
    // thinks (its template reads both).
    let shown = served.post("/api/show", &json!({"model": THINKER})).json();
    assert_eq!(
        shown["capabilities"],
        json!(["completion", "tools", "thinking"]),
        "{shown}"
    );
    // Tools reach the template.
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let with_tools = served
        .post("/v1/chat/completions", &sampled(json!({"tools": tools})))
        .json();
    assert!(
        with_tools["usage"]["prompt_tokens"].as_u64().unwrap()
            > plain["usage"]["prompt_tokens"].as_u64().unwrap() + 10
    );
}

/// `ondo run` on a model whose template always opens `<think>`: the
/// reasoning goes to stderr (plain, not a terminal) or nowhere with
/// `--hide-thinking`, stdout keeps the answer alone, and the record counts
/// the reasoning tokens.
#[test]
fn ondo_run_prints_the_reasoning_apart_or_hides_it() {
    let home = Home::new();
    let thinker = home.path().join("always-thinks");
    std::fs::create_dir_all(&thinker).unwrap();
    let source = home.cache_model("ondo-test/source", &[]);
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), thinker.join(entry.file_name())).unwrap();
    }
    std::fs::write(
        thinker.join("chat_template.jinja"),
        THINKING_TEMPLATE.replace("{% if enable_thinking %}<think>\n{% endif %}", "<think>\n"),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let output = home
            .ondo()
            .arg("run")
            .arg(&thinker)
            .args([USER, "--no-history", "--temp", "1", "--seed", "7"])
            .args(["--max-tokens", &MAX_TOKENS.to_string()])
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        (
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        )
    };
    let recorded = home.ondo_run(
        thinker.to_str().unwrap(),
        USER,
        &["--temp", "1", "--seed", "7"],
    );
    let reasoning = recorded["reasoning"].as_str().unwrap();
    assert!(!reasoning.trim().is_empty(), "{recorded}");
    assert_eq!(recorded["text"], "");
    let generated = recorded["generated_tokens"].as_u64().unwrap();
    let end_of_sequence = u64::from(recorded["stop_reason"] == "eos");
    assert_eq!(recorded["reasoning_tokens"], generated - end_of_sequence);

    let (stdout, stderr) = run(&[]);
    assert_eq!(stdout.trim(), "", "the answer is empty: it only thought");
    assert!(stderr.contains(reasoning.trim()), "{stderr}");
    assert!(
        !stderr.contains("\x1b["),
        "no escape codes off a terminal: {stderr:?}"
    );
    assert!(
        stderr.contains("tokens of those"),
        "the footer counts it: {stderr}"
    );

    let (stdout, stderr) = run(&["--hide-thinking"]);
    assert_eq!(stdout.trim(), "");
    assert!(!stderr.contains(reasoning.trim()), "{stderr}");
    assert!(
        stderr.contains("tokens of those"),
        "still counted: {stderr}"
    );

    let help = home.ondo().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("--hide-thinking"), "{help}");
    assert!(help.contains("dimmed"), "{help}");
}

/// `ondo run --think on|off` becomes the template's `enable_thinking`: on,
/// the prompt opens `<think>` (one more prompt token at least) and all the
/// model says is reasoning; off, it answers. A model whose template has no
/// switch runs as before, with a note; a value other than on/off is refused
/// with what to say.
#[test]
fn ondo_run_think_switch_reaches_the_template() {
    let home = Home::new();
    let sampled = ["--temp", "1", "--seed", "7"];
    let on = home.ondo_run(THINKER, USER, &[&sampled[..], &["--think", "on"]].concat());
    let off = home.ondo_run(THINKER, USER, &[&sampled[..], &["--think", "off"]].concat());
    let prompt_tokens = |v: &Value| v["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens(&on) > prompt_tokens(&off), "{on}\n{off}");
    assert!(!on["reasoning"].as_str().unwrap().trim().is_empty(), "{on}");
    assert_eq!(on["text"], "", "{on}");
    assert_eq!(off["reasoning"], "", "{off}");
    assert!(!off["text"].as_str().unwrap().trim().is_empty(), "{off}");

    let plain = home
        .ondo()
        .args(["run", VARIED, USER, "--no-history", "--max-tokens", "2"])
        .args(["--think", "off"])
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    let stderr = String::from_utf8(plain.stderr).unwrap();
    assert!(stderr.contains("no thinking switch"), "{stderr}");

    let wrong = home
        .ondo()
        .args(["run", THINKER, USER, "--think", "maybe"])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let stderr = String::from_utf8(wrong.stderr).unwrap();
    assert!(stderr.contains("say `on` or `off`"), "{stderr}");
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn twelve_streams_at_once_share_the_batch_and_each_get_their_own_answer() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    let args = json!({"model": VARIED, "system": SYSTEM, "max_tokens": 16, "clients": 12});
    let got = python_client("openai_client.py", &served, "concurrent", args);
    let streamed = got["streamed"].as_array().unwrap();
    let alone = got["alone"].as_array().unwrap();
    assert_eq!(streamed.len(), 12);
    for (n, (stream, whole)) in streamed.iter().zip(alone).enumerate() {
        assert_eq!(stream["text"], *whole, "client {n}");
        assert_eq!(stream["finish_reason"], "length", "client {n}");
        assert_eq!(stream["usage"]["completion_tokens"], 16, "client {n}");
    }
    // Eight (the default batch) decoded together; the rest waited for a
    // turn, and joined the batch as places came free.
    let rows = |s: &Value| s["ondo"]["batch"]["max_rows"].as_u64().unwrap();
    let widest = streamed.iter().map(rows).max().unwrap();
    assert!((2..=8).contains(&widest), "{streamed:?}");
    let queued = streamed
        .iter()
        .filter(|s| s["ondo"]["queued_ms"].as_f64().unwrap() > 0.0)
        .count();
    assert!(queued >= 1, "{streamed:?}");
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_client_that_drops_its_stream_frees_the_engine() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    // Uncancelled, 30 000 tokens would hold the engine for many seconds.
    let args = json!({
        "model": VARIED, "system": SYSTEM, "user": USER, "long_tokens": 30000,
    });
    let got = python_client("openai_client.py", &served, "drop", args);
    assert_eq!(got["received"], 5);
    let before = got["before"].as_f64().unwrap();
    let after = got["after"].as_f64().unwrap();
    // A normal TTFT (some slack for a busy machine), nowhere near the rest
    // of the long answer.
    assert!(
        after < (before * 10.0).max(1.0),
        "before {before} s, after {after} s"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served
        .log()
        .iter()
        .any(|l| l.contains("cancelled: the client went away"))
    {
        assert!(Instant::now() < deadline, "{:?}", served.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let dropped = home
        .api_runs()
        .into_iter()
        .find(|r| r.stop_reason == ondo::run_kinds::StopReason::Cancelled)
        .unwrap();
    assert!(dropped.generated_tokens < 30000);
}

#[test]
fn bad_requests_get_their_status_and_a_json_error_and_the_server_serves_on() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    let address = served.address();
    let send = |method: &str, path: &str, body: &[u8]| http(&address, method, path, &[], body);
    let openai_error = |answer: &Answer, status: u16, code: &str| {
        assert_eq!(answer.status, status, "{}", answer.text());
        let body = answer.json();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
        assert!(body["error"]["type"].is_string());
    };
    let chat = "/v1/chat/completions";
    let good = chat_body("tiny", json!({}));
    let with = |extra: Value| {
        let mut body = good.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    for (body, status, code) in [
        (b"{not json".to_vec(), 400, "invalid_input"),
        (b"".to_vec(), 400, "invalid_input"),
        (b"[]".to_vec(), 400, "invalid_input"),
        (b"null".to_vec(), 400, "invalid_input"),
        (vec![0xff, 0xfe, 0x00], 400, "invalid_input"),
        (b"{\"model\": \"tiny\"}".to_vec(), 400, "invalid_input"),
        ("[".repeat(100_000).into_bytes(), 400, "invalid_input"),
        (with(json!({"n": 2})), 400, "invalid_input"),
        (with(json!({"max_tokens": -1})), 400, "invalid_input"),
        (with(json!({"max_tokens": 1e300})), 400, "invalid_input"),
        (with(json!({"temperature": 99})), 400, "invalid_settings"),
        (with(json!({"top_p": "high"})), 400, "invalid_input"),
        (
            with(json!({"messages": [{"role": "pirate", "content": "arr"}]})),
            400,
            "invalid_input",
        ),
        (with(json!({"messages": []})), 400, "invalid_input"),
        (
            with(json!({"messages": [{"role": "user", "content": "   "}]})),
            400,
            "empty_prompt",
        ),
        (
            with(json!({"model": "org/missing"})),
            404,
            "model_not_found",
        ),
        (
            with(json!({"model": "/etc/passwd"})),
            400,
            "not_a_model_name",
        ),
        (with(json!({"model": "../../etc"})), 400, "not_a_model_name"),
    ] {
        let answer = send("POST", chat, &body);
        openai_error(&answer, status, code);
    }
    // An unknown model's message lists what there is.
    let missing = send("POST", chat, &with(json!({"model": "org/missing"}))).json();
    let message = missing["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tiny") && message.contains(VARIED),
        "{message}"
    );
    // Over the body limit.
    let huge = vec![b' '; ondo::api::MAX_BODY_BYTES + 1];
    openai_error(&send("POST", chat, &huge), 413, "body_too_large");
    openai_error(&send("GET", chat, b""), 404, "no_such_route");
    openai_error(&send("POST", "/v1/nothing", b"{}"), 404, "no_such_route");
    // Embeddings are served (tests/embeddings.rs); a body without a model is 400.
    openai_error(&send("POST", "/v1/embeddings", b"{}"), 400, "invalid_input");
    let completions = |extra: Value| {
        let mut body = json!({"model": "tiny", "prompt": "Once", "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        send("POST", "/v1/completions", body.to_string().as_bytes())
    };
    openai_error(
        &completions(json!({"prompt": ["a", "b"]})),
        400,
        "invalid_input",
    );
    openai_error(&completions(json!({"echo": true})), 400, "invalid_input");
    openai_error(
        &completions(json!({"prompt": [99999999]})),
        400,
        "invalid_settings",
    );

    // Ollama's shape: {"error": "..."}.
    for (path, body, status) in [
        ("/api/chat", b"{oops".to_vec(), 400),
        ("/api/chat", br#"{"model": "org/missing", "messages": [{"role": "user", "content": "hi"}]}"#.to_vec(), 404),
        ("/api/chat", br#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "soon"}"#.to_vec(), 400),
        ("/api/generate", br#"{"model": "tiny", "prompt": "hi", "images": ["aGk="]}"#.to_vec(), 400),
        ("/api/generate", br#"{"model": "tiny", "prompt": "hi", "options": {"num_ctx": -3}}"#.to_vec(), 400),
        ("/api/show", b"{}".to_vec(), 400),
        ("/api/pull", b"{}".to_vec(), 404),
    ] {
        let answer = send("POST", path, &body);
        assert_eq!(answer.status, status, "{path}: {}", answer.text());
        assert!(answer.json()["error"].is_string(), "{path}: {}", answer.text());
    }

    // Anthropic's shape, {"type": "error", "error": {"type", "message"}},
    // whatever is wrong with the request (a body that is not JSON too).
    let messages = |body: Value| send("POST", "/v1/messages", body.to_string().as_bytes());
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (answer, status, error_type) in [
        (
            send("POST", "/v1/messages", b"{not json"),
            400,
            "invalid_request_error",
        ),
        (
            send("POST", "/v1/messages", b""),
            400,
            "invalid_request_error",
        ),
        (
            messages(json!({"model": "tiny", "messages": hi})),
            400,
            "invalid_request_error",
        ),
        (
            messages(json!({"model": "tiny", "max_tokens": 4, "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://a.example/b.png"}}]},
            ]})),
            400,
            "invalid_request_error",
        ),
        (
            messages(json!({"model": "tiny", "max_tokens": 4, "temperature": 99, "messages": hi})),
            400,
            "invalid_request_error",
        ),
        (
            messages(
                json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "  "}]}),
            ),
            400,
            "invalid_request_error",
        ),
        (
            messages(json!({"model": "org/missing", "max_tokens": 4, "messages": hi})),
            404,
            "not_found_error",
        ),
        (
            send("POST", "/v1/messages/count_tokens", b"{oops"),
            400,
            "invalid_request_error",
        ),
        (
            send("POST", "/v1/messages/batches", b"{}"),
            404,
            "not_found_error",
        ),
        (send("GET", "/v1/messages", b""), 404, "not_found_error"),
        (
            send("POST", "/v1/messages", &huge),
            413,
            "request_too_large",
        ),
    ] {
        assert_eq!(answer.status, status, "{}", answer.text());
        let body = answer.json();
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], error_type, "{body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    // Any anthropic-version is fine.
    let versioned = http(
        &address,
        "POST",
        "/v1/messages",
        &[("anthropic-version", "2023-06-01")],
        json!({"model": "tiny", "max_tokens": 3, "messages": hi})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(versioned.status, 200, "{}", versioned.text());
    assert_eq!(versioned.json()["usage"]["output_tokens"], 3);

    // After all that, it answers.
    let fine = send("POST", chat, &good.to_string().into_bytes());
    assert_eq!(fine.status, 200, "{}", fine.text());
    assert_eq!(fine.json()["usage"]["completion_tokens"], MAX_TOKENS);
    assert!(
        served
            .log()
            .iter()
            .any(|l| l.contains("· 400 · invalid_input: "))
    );
}

#[test]
fn only_this_machine_allowed_origins_and_the_key_get_in() {
    let home = Home::new();
    let served = Served::start(&home, &["--allow-origin", "https://app.example/"]);
    let address = served.address();
    // DNS rebinding: a page of evil.example that resolves to 127.0.0.1.
    let rebound = http(
        &address,
        "GET",
        "/v1/models",
        &[("Host", "evil.example")],
        b"",
    );
    assert_eq!(rebound.status, 403);
    assert_eq!(rebound.json()["error"]["code"], "host_refused");
    let localhost = http(
        &address,
        "GET",
        "/api/tags",
        &[("Host", "localhost:1")],
        b"",
    );
    assert_eq!(localhost.status, 200);
    // Web pages: only allowed origins, with CORS headers.
    let evil = http(
        &address,
        "GET",
        "/api/tags",
        &[("Origin", "https://evil.example")],
        b"",
    );
    assert_eq!(evil.status, 403);
    assert!(
        evil.json()["error"]
            .as_str()
            .unwrap()
            .contains("evil.example")
    );
    assert_eq!(evil.header("access-control-allow-origin"), None);
    let app = http(
        &address,
        "GET",
        "/api/tags",
        &[("Origin", "https://app.example")],
        b"",
    );
    assert_eq!(app.status, 200);
    assert_eq!(
        app.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let preflight = http(
        &address,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        b"",
    );
    assert_eq!(preflight.status, 204);
    assert!(
        preflight
            .header("access-control-allow-headers")
            .unwrap()
            .contains("authorization")
    );
    drop(served);

    // Every network without a key: refused before it starts.
    let open = home
        .ondo()
        .args(["serve", "--host", "0.0.0.0", "--port", "0"])
        .output()
        .unwrap();
    assert!(!open.status.success());
    let said = String::from_utf8_lossy(&open.stderr);
    assert!(
        said.contains("API key") && said.contains("--api-key"),
        "{said}"
    );

    // With a key, every route wants it.
    let keyed = Served::start(&home, &["--api-key", "s3cret"]);
    let address = keyed.address();
    for (headers, status) in [
        (vec![], 401),
        (vec![("Authorization", "Bearer wrong")], 401),
        (vec![("Authorization", "s3cret")], 401),
        (vec![("Authorization", "Bearer s3cret")], 200),
    ] {
        let answer = http(&address, "GET", "/v1/models", &headers, b"");
        assert_eq!(answer.status, status, "{headers:?}");
        if status == 401 {
            assert_eq!(answer.json()["error"]["code"], "api_key_refused");
            assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
        }
        let ollama = http(&address, "GET", "/api/tags", &headers, b"");
        assert_eq!(ollama.status, status, "{headers:?}");
    }
    // Anthropic's clients send the key as x-api-key; either header does.
    let count = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
    for (headers, status) in [
        (vec![("x-api-key", "s3cret")], 200),
        (vec![("x-api-key", "wrong")], 401),
        (
            vec![
                ("x-api-key", "placeholder"),
                ("Authorization", "Bearer s3cret"),
            ],
            200,
        ),
        (vec![("Authorization", "Bearer s3cret")], 200),
        (vec![], 401),
    ] {
        let answer = http(
            &address,
            "POST",
            "/v1/messages/count_tokens",
            &headers,
            count.to_string().as_bytes(),
        );
        assert_eq!(answer.status, status, "{headers:?}: {}", answer.text());
        if status == 401 {
            assert_eq!(answer.json()["error"]["type"], "authentication_error");
        }
        let models = http(&address, "GET", "/v1/models", &headers, b"");
        assert_eq!(models.status, status, "{headers:?}");
    }
    let args = json!({"key": "not-the-key"});
    // Without Python (ONDO_SKIP_PYTHON), the checks above and below still run.
    if !cfg!(ondo_skip_python) {
        let got = python_client("openai_client.py", &keyed, "wrong_key", args);
        assert_eq!(got["status"], 401);
        let got = python_client(
            "anthropic_client.py",
            &keyed,
            "keys",
            json!({"key": "s3cret"}),
        );
        assert_eq!(got["x_api_key"]["status"], 200, "{got}");
        assert_eq!(got["bearer"]["status"], 200, "{got}");
        assert_eq!(got["wrong"]["status"], 401, "{got}");
        assert_eq!(got["wrong"]["exception"], "AuthenticationError", "{got}");
        assert_eq!(
            got["wrong"]["body"]["error"]["type"],
            "authentication_error"
        );
    }
    drop(keyed);
    // The key from the environment, on every network.
    let everywhere = home
        .ondo()
        .env("ONDO_API_KEY", "from-env")
        .args(["serve", "--host", "0.0.0.0", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut everywhere = ChildGuard(everywhere);
    let mut line = String::new();
    BufReader::new(everywhere.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .split(':')
        .nth(2)
        .and_then(|p| p.split_whitespace().next())
        .unwrap();
    let address = format!("127.0.0.1:{port}");
    let refused = http(&address, "GET", "/api/version", &[], b"");
    assert_eq!(refused.status, 401);
    let allowed = http(
        &address,
        "GET",
        "/api/version",
        &[("Authorization", "Bearer from-env")],
        b"",
    );
    assert_eq!(allowed.status, 200);
}

/// Kills a child when the test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Opens a long stream and returns once its headers arrived, with the
/// connection still open (the answer still coming).
fn open_stream(address: &str, body: &Value) -> (TcpStream, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while !received.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0, "closed before the headers");
        received.extend(&buffer[..n]);
    }
    (stream, received)
}

#[test]
fn a_short_request_beside_a_long_answer_joins_its_batch_without_waiting() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    let address = served.address();
    let long = chat_body(
        "tiny",
        json!({"stream": true, "max_tokens": 30000, "ignore_eos": true}),
    );
    let (running, _) = open_stream(&address, &long);
    std::thread::sleep(Duration::from_millis(300));
    let short = served.post(
        "/v1/chat/completions",
        &chat_body("tiny", json!({"max_tokens": 8, "ignore_eos": true})),
    );
    assert_eq!(short.status, 200, "{}", short.text());
    let ondo = &short.json()["ondo"];
    assert_eq!(ondo["queued_ms"].as_f64(), Some(0.0), "{ondo}");
    assert_eq!(ondo["batch"]["max_rows"], 2, "{ondo}");
    assert_eq!(ondo["generated_tokens"], 8, "{ondo}");
    drop(running);
}

#[test]
fn a_full_queue_and_a_long_wait_are_told_so() {
    let home = Home::new();
    let served = Served::start(
        &home,
        &[
            "--max-batch",
            "1",
            "--max-waiting",
            "1",
            "--wait-limit",
            "2",
        ],
    );
    let address = served.address();
    let long = chat_body(
        "tiny",
        json!({"stream": true, "max_tokens": 30000, "ignore_eos": true}),
    );
    let (running, _) = open_stream(&address, &long);
    // One may wait; it waits two seconds at most.
    let waiting = {
        let address = address.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let answer = http(
                &address,
                "POST",
                "/v1/chat/completions",
                &[],
                chat_body("tiny", json!({})).to_string().as_bytes(),
            );
            (answer, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let full = served.post(
        "/api/chat",
        &json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(full.status, 503, "{}", full.text());
    assert!(full.json()["error"].as_str().unwrap().contains("waiting"));
    assert!(full.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    // Anthropic's clients are told as Anthropic tells them: 529 overloaded.
    let overloaded = served.post(
        "/v1/messages",
        &json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(overloaded.status, 529, "{}", overloaded.text());
    assert_eq!(overloaded.json()["error"]["type"], "overloaded_error");
    assert!(overloaded.header("retry-after").is_some());
    // A request that only loads or unloads a model (tiny is loaded, so it
    // has nothing to wait for but its turn) is refused the same way.
    for (path, body) in [
        ("/api/generate", json!({"model": "tiny"})),
        ("/api/chat", json!({"model": "tiny", "keep_alive": 0})),
    ] {
        let refused = served.post(path, &body);
        assert_eq!(refused.status, 503, "{path} {body}: {}", refused.text());
        assert!(
            refused.json()["error"]
                .as_str()
                .unwrap()
                .contains("waiting")
        );
        assert!(refused.header("retry-after").is_some());
    }
    let (waited, took) = waiting.join().unwrap();
    assert_eq!(waited.status, 503, "{}", waited.text());
    assert_eq!(waited.json()["error"]["code"], "queue_timeout");
    assert!(waited.header("retry-after").is_some());
    assert!(took >= Duration::from_secs(2), "{took:?}");
    // Now first in line, a load waits for its turn no longer than a
    // generation does.
    let started = Instant::now();
    let load = served.post("/api/generate", &json!({"model": "tiny"}));
    assert_eq!(load.status, 503, "{}", load.text());
    assert!(load.json()["error"].as_str().unwrap().contains("waited"));
    assert!(load.header("retry-after").is_some());
    assert!(started.elapsed() >= Duration::from_secs(2));
    drop(running);
    // The dropped stream frees the engine; the next request is served.
    let fine = served.post("/v1/chat/completions", &chat_body("tiny", json!({})));
    assert_eq!(fine.status, 200, "{}", fine.text());
    let loaded = served.post("/api/generate", &json!({"model": "tiny"}));
    assert_eq!(loaded.status, 200, "{}", loaded.text());
    assert_eq!(loaded.json()["done_reason"], "load");
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn keep_alive_goes_through_the_pool() {
    let home = Home::new();
    let served = Served::start(&home, &[]);
    let args = json!({"model": VARIED, "system": SYSTEM, "user": USER, "max_tokens": 4});
    let seen = python_client("ollama_client.py", &served, "keep_alive", args);
    assert_eq!(seen["load"]["done_reason"], "load");
    let (model, expires) = (&seen["load"]["ps"][0][0], &seen["load"]["ps"][0][1]);
    assert_eq!(model, VARIED);
    let expires = chrono::DateTime::parse_from_rfc3339(expires.as_str().unwrap()).unwrap();
    let left = expires
        .signed_duration_since(chrono::Utc::now())
        .num_seconds();
    assert!((200..=300).contains(&left), "{left} s left of 5 minutes");
    let forever =
        chrono::DateTime::parse_from_rfc3339(seen["forever"][0][1].as_str().unwrap()).unwrap();
    assert!(forever.signed_duration_since(chrono::Utc::now()).num_days() > 365 * 50);
    assert_eq!(seen["after_zero"], json!([]), "keep_alive 0 left it loaded");
    assert_eq!(seen["unload"]["done_reason"], "unload");
    assert_eq!(seen["unload"]["ps"], json!([]));
}

/// Reads until the server closes the connection; how long that took.
fn time_until_closed(stream: &mut TcpStream) -> Duration {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("still open after {:?}", started.elapsed())
            }
            Err(_) => return started.elapsed(),
        }
    }
}

#[test]
fn a_client_that_sends_nothing_loses_its_connection_and_connections_are_bounded() {
    let home = Home::new();
    // One request at a time, so that one waits behind another.
    let served = Served::start(&home, &["--idle-timeout", "2", "--max-batch", "1"]);
    let address = served.address();
    let closed_in_time = |took: Duration| {
        assert!(
            (Duration::from_millis(1500)..Duration::from_secs(10)).contains(&took),
            "closed after {took:?}, with an idle timeout of 2 s"
        );
    };
    // A connection that sends nothing.
    let mut silent = TcpStream::connect(&address).unwrap();
    closed_in_time(time_until_closed(&mut silent));
    // One that sends its head a line at a time (slowloris): bytes keep
    // coming, but the head never ends.
    let mut trickle = TcpStream::connect(&address).unwrap();
    let mut writer = trickle.try_clone().unwrap();
    let host = address.clone();
    std::thread::spawn(move || {
        let _ = write!(writer, "GET /api/version HTTP/1.1\r\nHost: {host}\r\n");
        for n in 0..100 {
            std::thread::sleep(Duration::from_millis(300));
            if write!(writer, "X-Slow-{n}: 1\r\n").is_err() {
                break;
            }
        }
    });
    closed_in_time(time_until_closed(&mut trickle));
    // A kept-alive connection, answered, then idle.
    let mut kept = TcpStream::connect(&address).unwrap();
    write!(kept, "GET /api/version HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    kept.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    closed_in_time(time_until_closed(&mut kept));

    // Waiting for the engine is not idle: a request queued behind a long
    // answer for longer than the idle timeout is still answered.
    let long = chat_body(
        "tiny",
        json!({"stream": true, "max_tokens": 30000, "ignore_eos": true}),
    );
    let (running, _) = open_stream(&address, &long);
    let behind = {
        let address = address.clone();
        std::thread::spawn(move || {
            http(
                &address,
                "POST",
                "/v1/chat/completions",
                &[],
                chat_body("tiny", json!({})).to_string().as_bytes(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(3500));
    drop(running);
    let behind = behind.join().unwrap();
    assert_eq!(behind.status, 200, "{}", behind.text());
    assert!(behind.json()["ondo"]["queued_ms"].as_f64().unwrap() > 2000.0);
    drop(served);

    // Two places: a third connection waits to be accepted until one of the
    // two closes.
    let served = Served::start(&home, &["--max-connections", "2"]);
    let address = served.address();
    let first = TcpStream::connect(&address).unwrap();
    let _second = TcpStream::connect(&address).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (answered, answers) = std::sync::mpsc::channel();
    {
        let address = address.clone();
        std::thread::spawn(move || {
            let _ = answered.send(http(&address, "GET", "/api/version", &[], b"").status);
        });
    }
    assert!(
        answers.recv_timeout(Duration::from_secs(2)).is_err(),
        "a third connection was served while two were open"
    );
    drop(first);
    assert_eq!(answers.recv_timeout(Duration::from_secs(10)), Ok(200));
}

/// Sets `key` of a cached model's config.json.
fn edit_config(snapshot: &Path, key: &str, value: Value) {
    let path = snapshot.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn a_model_that_does_not_load_is_422_and_no_error_names_a_server_path() {
    let home = Home::new();
    let unsupported = home.cache_model("ondo-test/unsupported", &[]);
    edit_config(&unsupported, "model_type", json!("mamba_of_the_future"));
    let truncated = home.cache_model("ondo-test/truncated", &[]);
    let weights = truncated.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let short = home.cache_model("ondo-test/short", &[]);
    edit_config(&short, "max_position_embeddings", json!(16));
    let served = Served::start(&home, &[]);
    let server_paths: Vec<String> = [
        home.path().to_owned(),
        std::fs::canonicalize(home.path()).unwrap(),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let check = |what: &str, answer: &Answer, status: u16, words: &[&str]| {
        let text = answer.text();
        assert_eq!(answer.status, status, "{what}: {text}");
        for path in &server_paths {
            assert!(!text.contains(path.as_str()), "{what} names {path}: {text}");
        }
        let body = answer.json();
        let message = body["error"]["message"]
            .as_str()
            .or(body["error"].as_str())
            .unwrap_or_else(|| panic!("{what}: no error message in {body}"));
        for word in words {
            assert!(message.contains(word), "{what}: {message}");
        }
    };
    let cannot_load = [
        "is on this server but cannot be loaded",
        "Pick another model",
    ];

    // Present but not loadable: 422 in both dialects, streamed or not, and
    // for a request that only loads.
    let answer = served.post(
        "/v1/chat/completions",
        &chat_body("ondo-test/unsupported", json!({})),
    );
    check("unsupported", &answer, 422, &cannot_load);
    assert_eq!(answer.json()["error"]["code"], "load");
    check(
        "unsupported's model_type",
        &answer,
        422,
        &["ondo-test/unsupported", "mamba_of_the_future"],
    );
    let answer = served.post(
        "/v1/chat/completions",
        &chat_body("ondo-test/truncated", json!({"stream": true})),
    );
    check("truncated, streamed", &answer, 422, &cannot_load);
    let answer = served.post(
        "/api/chat",
        &json!({"model": "ondo-test/truncated", "messages": [{"role": "user", "content": "hi"}]}),
    );
    check("truncated, Ollama", &answer, 422, &cannot_load);
    let answer = served.post("/api/generate", &json!({"model": "ondo-test/unsupported"}));
    check("unsupported, load only", &answer, 422, &cannot_load);

    // Not here: named, with what there is, and not where it was looked for.
    let answer = served.post("/v1/chat/completions", &chat_body("org/missing", json!({})));
    check("missing", &answer, 404, &["org/missing", "tiny", VARIED]);
    let answer = served.post(
        "/api/chat",
        &json!({"model": "org/missing", "messages": [{"role": "user", "content": "hi"}]}),
    );
    check("missing, Ollama", &answer, 404, &["org/missing"]);
    check(
        "missing, by id",
        &served.get("/v1/models/org/missing"),
        404,
        &["org/missing"],
    );

    // Longer than the model reads, and a token it does not have: the
    // model by its name.
    let long = "word ".repeat(100);
    let answer = served.post(
        "/v1/chat/completions",
        &json!({"model": "ondo-test/short", "messages": [{"role": "user", "content": long}]}),
    );
    check(
        "too long",
        &answer,
        400,
        &["ondo-test/short reads at most 16"],
    );
    let answer = served.post(
        "/api/generate",
        &json!({"model": "ondo-test/short", "prompt": long, "stream": false}),
    );
    check("too long, Ollama", &answer, 400, &["ondo-test/short"]);
    let answer = served.post(
        "/v1/completions",
        &json!({"model": VARIED, "prompt": [99999999], "max_tokens": 1}),
    );
    check(
        "token out of range",
        &answer,
        400,
        &["outside the vocabulary of ondo-test/varied"],
    );

    // What a client reads of a model names no folder either.
    for (what, answer) in [
        ("show", served.post("/api/show", &json!({"model": VARIED}))),
        ("tags", served.get("/api/tags")),
        ("ps", served.get("/api/ps")),
        ("models", served.get("/v1/models")),
    ] {
        assert_eq!(answer.status, 200, "{what}: {}", answer.text());
        for path in &server_paths {
            assert!(
                !answer.text().contains(path.as_str()),
                "{what}: {}",
                answer.text()
            );
        }
    }
    // The server's own log keeps the paths, for the person running it.
    let log = served.log().join("\n");
    assert!(log.contains(&server_paths[0]), "{log}");
}

#[test]
fn saved_settings_apply_from_the_next_request_a_request_sets_its_own_engine_knobs_and_no_history_leaves_the_history_alone()
 {
    let home = Home::new();
    let data = home.path().join("ondo");
    let served = Served::start(&home, &[]);
    // The app saves its settings while the server runs.
    let save_max_tokens = |max_tokens: usize| {
        let mut store = Store::open_default(&data).unwrap();
        AppSettings {
            generation: GenerationSettings {
                max_tokens,
                ..GenerationSettings::default()
            },
            ..AppSettings::default()
        }
        .save(&mut store)
        .unwrap();
    };
    let generated = || {
        let body = json!({
            "model": "tiny", "ignore_eos": true,
            "messages": [{"role": "user", "content": USER}],
        });
        let answer = served.post("/v1/chat/completions", &body);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
    };
    save_max_tokens(3);
    assert_eq!(generated(), 3);
    save_max_tokens(5);
    assert_eq!(generated(), 5);

    // A request sets Ondo's engine knobs for itself (OpenAI's `ondo`
    // object, Ollama's `num_batch`); the history records what ran.
    let recorded = |answer: Answer| {
        assert_eq!(answer.status, 200, "{}", answer.text());
        let run_id = answer.json()["ondo"]["run_id"].as_str().unwrap().to_owned();
        Store::open_default(&data)
            .unwrap()
            .run(&run_id)
            .unwrap()
            .unwrap()
    };
    let knobs = json!({"prefill_step_size": 16, "loop": "sync", "kv_bits": 8});
    let run = recorded(served.post(
        "/v1/chat/completions",
        &chat_body("tiny", json!({ "ondo": knobs })),
    ));
    assert_eq!(
        (run.prefill_step_size, run.loop_shape, run.kv_bits),
        (16, LoopShape::Sync, Some(8))
    );
    let bounded = json!({"ondo": {"max_kv_size": 512}});
    let run = recorded(served.post("/v1/chat/completions", &chat_body("tiny", bounded)));
    assert_eq!(run.max_kv_size, Some(512));
    let run = recorded(served.post(
        "/api/chat",
        &json!({"model": "tiny", "stream": false, "options": {"num_batch": 24, "num_predict": 2},
                "messages": [{"role": "user", "content": USER}]}),
    ));
    assert_eq!(run.prefill_step_size, 24);
    let defaults = GenerationSettings::default();
    let run = recorded(served.post("/v1/chat/completions", &chat_body("tiny", json!({}))));
    assert_eq!(
        (run.prefill_step_size, run.loop_shape, run.kv_bits),
        (defaults.prefill_step_size as u64, defaults.loop_shape, None)
    );
    for (knobs, named) in [
        (json!({"prefill_step": 16}), "prefill_step"),
        (json!({"kv_bits": 3}), "kv"),
        (json!({"prefill_step_size": 0}), "prefill step size"),
    ] {
        let refused = served.post(
            "/v1/chat/completions",
            &chat_body("tiny", json!({ "ondo": knobs })),
        );
        assert_eq!(refused.status, 400, "{knobs}: {}", refused.text());
        let message = refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(named), "{knobs}: {message}");
    }
    drop(served);

    // With --no-history, no request opens the history, so none makes it.
    let history = data.join(ondo::store::DB_FILE_NAME);
    for file in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{file}", history.display()));
    }
    let mut served = Served::start(&home, &["--no-history"]);
    let chat = |model: &str| {
        json!({"model": model, "max_tokens": 4, "stream": false,
               "messages": [{"role": "user", "content": USER}]})
    };
    for (what, answer, status) in [
        ("models", served.get("/v1/models"), 200),
        ("model", served.get(&format!("/v1/models/{VARIED}")), 200),
        ("tags", served.get("/api/tags"), 200),
        ("ps", served.get("/api/ps"), 200),
        (
            "show",
            served.post("/api/show", &json!({"model": VARIED})),
            200,
        ),
        (
            "chat",
            served.post("/v1/chat/completions", &chat("tiny")),
            200,
        ),
        ("Ollama chat", served.post("/api/chat", &chat(VARIED)), 200),
        (
            "load",
            served.post("/api/generate", &json!({"model": VARIED})),
            200,
        ),
        (
            "unload",
            served.post("/api/generate", &json!({"model": VARIED, "keep_alive": 0})),
            200,
        ),
        (
            "missing",
            served.post("/api/chat", &chat("org/missing")),
            404,
        ),
    ] {
        assert_eq!(answer.status, status, "{what}: {}", answer.text());
    }
    served.interrupt();
    assert!(wait_for_exit(&mut served).success());
    assert!(!history.exists(), "--no-history made {}", history.display());
}

/// Reads a stream until `events` server-sent events have come: past the
/// first tokens, while MLX's CPU backend compiles kernels through
/// `system()`, which ignores SIGINT for the whole process (a Ctrl-C then is
/// lost, as it would be for any program).
fn read_events(stream: &mut TcpStream, received: &mut Vec<u8>, events: usize) {
    let mut buffer = [0u8; 4096];
    while received.windows(6).filter(|w| w == b"data: ").count() < events {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0, "closed early");
        received.extend(&buffer[..n]);
    }
}

/// Waits for the server process to end.
fn wait_for_exit(served: &mut Served) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running after the answer; log: {:?}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_answers_the_requests_in_flight_then_stops() {
    let home = Home::new();
    let mut served = Served::start(&home, &[]);
    let address = served.address();
    let body = chat_body(
        "tiny",
        json!({"stream": true, "max_tokens": 1500, "ignore_eos": true}),
    );
    let (mut stream, mut received) = open_stream(&address, &body);
    read_events(&mut stream, &mut received, 20);
    served.interrupt();
    let _ = stream.read_to_end(&mut received);
    let answer = parse_answer(&received);
    let events = sse_data(&answer.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["ondo"]["generated_tokens"], 1500, "cut short");
    let status = wait_for_exit(&mut served);
    assert!(status.success(), "{status:?}");
    assert!(TcpStream::connect(&address).is_err(), "still listening");
    let log = served.log().join("\n");
    assert!(
        log.contains("stopping after 1 request(s) in flight"),
        "{log}"
    );

    // A second Ctrl-C cancels what is in flight instead of waiting for it.
    let mut served = Served::start(&home, &[]);
    let address = served.address();
    let body = chat_body(
        "tiny",
        json!({"stream": true, "max_tokens": 30000, "ignore_eos": true}),
    );
    let (mut stream, mut received) = open_stream(&address, &body);
    read_events(&mut stream, &mut received, 20);
    served.interrupt();
    std::thread::sleep(Duration::from_millis(300));
    served.interrupt();
    let _ = stream.read_to_end(&mut received);
    let events = sse_data(&parse_answer(&received).text());
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["ondo"]["stop_reason"], "cancelled");
    assert!(last["ondo"]["generated_tokens"].as_u64().unwrap() < 30000);
    assert!(wait_for_exit(&mut served).success());
}
