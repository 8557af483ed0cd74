//! Another program's model server as a benchmark side (`ondo bench
//! --endpoint`): naming it (`[NAME=]URL#MODEL`), finding its dialect
//! (OpenAI or Ollama), and timing one streamed generation at a time from
//! the arrival of its bytes. The requests ask for what a benchmark needs:
//! the raw completion route (no chat template, so the prompt is the text
//! sent), greedy, and the plan's tokens with EOS ignored where the server
//! takes `ignore_eos`. docs/ARCHITECTURE.md ("Benchmarks") says why each
//! choice was made.

use std::str::FromStr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::{StatusCode, Url, header};
use serde_json::{Value, json};

use crate::ErrorKind;
use crate::run_kinds::StopReason;
use crate::store::record::EndpointDialect;

/// How long connecting may take before a server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest silence a stream may keep before it counts as broken off: a
/// long prompt's prefill on a slow machine sends nothing for minutes.
const SILENCE_TIMEOUT: Duration = Duration::from_secs(600);

/// An endpoint as the user wrote it: `[NAME=]URL#MODEL`, the model in the
/// fragment (which is never sent), a key in the URL's password if any.
#[derive(Clone, PartialEq)]
pub struct EndpointSpec {
    /// The label written before `=`, shown instead of a detected name.
    pub name: Option<String>,
    /// The URL without credentials and fragment.
    pub url: Url,
    /// The model written after `#`.
    pub model: Option<String>,
    /// The URL's password (`http://:KEY@host:port`), sent as a bearer token.
    api_key: Option<String>,
}

/// Keys stay out of logs and panics.
impl std::fmt::Debug for EndpointSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointSpec")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl FromStr for EndpointSpec {
    type Err = EndpointError;

    fn from_str(text: &str) -> Result<Self, EndpointError> {
        let wrong = |reason: &str| EndpointError::NotAnEndpoint {
            text: without_password(text),
            reason: reason.to_owned(),
        };
        // A label is what comes before the first '=' when that part could
        // not be the start of a URL (a URL's '=' sits in its query).
        let (name, url_text) = match text.split_once('=') {
            Some((head, rest)) if !head.is_empty() && !head.contains(['/', ':', '?', '#', '@']) => {
                (Some(head.trim().to_owned()), rest)
            }
            _ => (None, text),
        };
        let mut url = Url::parse(url_text.trim()).map_err(|e| wrong(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(wrong(
                "only http:// and https:// servers can be benchmarked",
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(wrong("the URL names no host"));
        }
        let model = url
            .fragment()
            .map(percent_decoded)
            .filter(|m| !m.trim().is_empty());
        let api_key = url.password().map(percent_decoded);
        url.set_fragment(None);
        // Setting these only fails on URLs that cannot have credentials,
        // which http(s) URLs always can.
        let _ = url.set_password(None);
        let _ = url.set_username("");
        Ok(Self {
            name,
            url,
            model,
            api_key,
        })
    }
}

/// `text` with the credentials of its URL left out, for messages.
fn without_password(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = text[authority_start..]
        .find(['/', '#', '?'])
        .map_or(text.len(), |i| authority_start + i);
    match text[authority_start..authority_end].rfind('@') {
        Some(at) => format!(
            "{}{}",
            &text[..authority_start],
            &text[authority_start + at + 1..]
        ),
        None => text.to_owned(),
    }
}

/// `%2F` and friends decoded; invalid escapes kept as written.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why an endpoint could not be benchmarked.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "'{text}' is not an endpoint ({reason}); write it as URL#MODEL, for example \
         http://127.0.0.1:11434#llama3.2"
    )]
    NotAnEndpoint { text: String, reason: String },
    #[error(
        "could not reach {url} ({message}); check that the server is running and listens there"
    )]
    Unreachable { url: String, message: String },
    #[error("{}", refused_message(.url, *.status, *.key_sent, .message))]
    Refused {
        url: String,
        status: u16,
        key_sent: bool,
        message: String,
    },
    #[error(
        "{server} has no model '{model}' ({message}); name one it serves after '#' in the \
         endpoint's URL{}", offered(.available)
    )]
    ModelNotFound {
        server: String,
        model: String,
        message: String,
        available: Vec<String>,
    },
    #[error(
        "{server} serves {}; name the one to benchmark after '#' in the endpoint's URL{}",
        if .available.is_empty() { "models it does not list" } else { "several models" },
        offered(.available)
    )]
    ModelNotNamed {
        server: String,
        available: Vec<String>,
    },
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error(
        "{url} has no completion route here (404); an OpenAI-style server answers under /v1 and Ollama under /api"
    )]
    NoRoute { url: String },
    #[error("{url} sent an answer that could not be read: {message}")]
    BadAnswer { url: String, message: String },
}

fn refused_message(url: &str, status: u16, key_sent: bool, message: &str) -> String {
    if key_sent {
        format!("{url} refused the API key ({status}: {message}); check the key the server expects")
    } else {
        format!("{url} asks for an API key ({status}: {message}); give the key the server expects")
    }
}

fn offered(available: &[String]) -> String {
    if available.is_empty() {
        String::new()
    } else {
        format!(": {}", available.join(", "))
    }
}

impl EndpointError {
    /// What clients branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EndpointError::NotAnEndpoint { .. } => ErrorKind::InvalidInput,
            EndpointError::Unreachable { .. } => ErrorKind::EndpointUnreachable,
            EndpointError::Refused { .. } => ErrorKind::EndpointRefused,
            EndpointError::ModelNotFound { .. } | EndpointError::ModelNotNamed { .. } => {
                ErrorKind::EndpointModelNotFound
            }
            EndpointError::Status { .. }
            | EndpointError::NoRoute { .. }
            | EndpointError::BadAnswer { .. } => ErrorKind::EndpointFailed,
        }
    }
}

/// The route a generation is asked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// OpenAI `completions`: the prompt as text, no template.
    Completions,
    /// OpenAI `chat/completions` with one user message, for servers without
    /// the raw route (the server's chat template then adds tokens).
    ChatCompletions,
    /// Ollama `generate` with `raw: true`.
    Generate,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Completions => "completions",
            Route::ChatCompletions => "chat/completions",
            Route::Generate => "generate",
        }
    }
}

/// What the server reported about one generation, where it did: OpenAI's
/// `usage` (counts only), Ollama's final line (counts and durations).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerReport {
    /// `usage.prompt_tokens`, `prompt_eval_count`.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`, `eval_count`.
    pub generated_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`: reused from its cache.
    pub cached_tokens: Option<u64>,
    /// Milliseconds, from Ollama's `load_duration`.
    pub load_ms: Option<f64>,
    /// Milliseconds, from Ollama's `prompt_eval_duration`.
    pub prefill_ms: Option<f64>,
    /// Milliseconds, from Ollama's `eval_duration`.
    pub decode_ms: Option<f64>,
}

impl ServerReport {
    /// Prompt tokens over the server's prefill time, per second.
    pub fn prefill_tps(&self) -> Option<f64> {
        rate(self.prompt_tokens?, self.prefill_ms?)
    }

    /// Generated tokens over the server's decode time (Ollama's "eval rate").
    pub fn decode_tps(&self) -> Option<f64> {
        rate(self.generated_tokens?, self.decode_ms?)
    }
}

fn rate(tokens: u64, ms: f64) -> Option<f64> {
    (ms > 0.0).then(|| tokens as f64 / (ms / 1000.0))
}

/// One streamed generation as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointRun {
    /// The text that arrived (reasoning, where a server splits it off, first).
    pub text: String,
    /// Sending the request to the first text arriving; NaN when none came.
    pub ttft_ms: f64,
    /// The first text arriving to the last.
    pub decode_ms: f64,
    /// Stream events that carried text (one per token on the servers known).
    pub text_events: usize,
    pub stop_reason: StopReason,
    pub server: ServerReport,
}

impl EndpointRun {
    /// The server's own count where it gives one, else the events that
    /// carried text.
    pub fn generated_tokens(&self) -> u64 {
        self.server
            .generated_tokens
            .unwrap_or(self.text_events as u64)
    }

    /// `(generated - 1) / decode_s`, as Ondo's own decode rate is defined.
    pub fn decode_tps(&self) -> f64 {
        let tokens = self.generated_tokens();
        if tokens < 2 || self.decode_ms <= 0.0 {
            return f64::NAN;
        }
        (tokens - 1) as f64 / (self.decode_ms / 1000.0)
    }
}

/// A connected endpoint: its dialect found, its model chosen.
pub struct Endpoint {
    /// As the tables and records name it.
    pub name: String,
    pub model: String,
    pub dialect: EndpointDialect,
    /// What the server listed (for messages; may be empty).
    pub available: Vec<String>,
    /// Where the routes are: `http://host:port/v1/` or `.../api/`.
    base: Url,
    route: Route,
    /// Send `ignore_eos` (turned off if the server refuses the field).
    ignore_eos: bool,
    api_key: Option<String>,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Endpoint {
    /// Finds the dialect and the model. A URL whose path ends in `/api` is
    /// Ollama's, any other path an OpenAI-style base (`/v1`); a bare
    /// `host:port` is asked `GET /api/version`, which only Ollama answers
    /// with a version. `api_key` is used when the URL carries none.
    pub fn connect(spec: &EndpointSpec, api_key: Option<&str>) -> Result<Self, EndpointError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| EndpointError::Unreachable {
                url: spec.url.to_string(),
                message: format!("no network runtime: {e}"),
            })?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("ondo/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(SILENCE_TIMEOUT)
            // A fresh connection per request: a kept-alive one that sat idle
            // while other sides ran may have been closed by the server (Ondo
            // closes idle ones after 30 s, uvicorn after 5), and the next
            // request on it would fail before a byte came back. On loopback
            // a connection costs far less than the generation timed.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| EndpointError::Unreachable {
                url: spec.url.to_string(),
                message: e.to_string(),
            })?;
        let api_key = spec.api_key.clone().or(api_key.map(str::to_owned));
        let probe = Probe {
            http: &http,
            api_key: api_key.as_deref(),
        };
        let found = runtime.block_on(probe.run(spec))?;
        Ok(Self {
            name: found.name,
            model: found.model,
            dialect: found.dialect,
            available: found.available,
            route: match found.dialect {
                EndpointDialect::OpenAi => Route::Completions,
                EndpointDialect::Ollama => Route::Generate,
            },
            base: found.base,
            ignore_eos: true,
            api_key,
            http,
            runtime,
        })
    }

    /// The URL of the route generations go to, without credentials.
    pub fn route_url(&self) -> String {
        self.url(self.route.path()).to_string()
    }

    fn url(&self, path: &str) -> Url {
        self.base.join(path).unwrap_or_else(|_| self.base.clone())
    }

    /// Streams one greedy generation of up to `max_tokens` after `prompt`,
    /// timing it from the moment the request is sent. `context_tokens`
    /// asks Ollama for a context that holds prompt and answer (its default
    /// would cut a long prompt).
    pub fn generate(
        &mut self,
        prompt: &str,
        max_tokens: usize,
        context_tokens: Option<usize>,
    ) -> Result<EndpointRun, EndpointError> {
        loop {
            let body = self.body(prompt, max_tokens, context_tokens);
            let url = self.url(self.route.path());
            let attempt = self.runtime.block_on(stream_generation(
                &self.http,
                url.clone(),
                self.api_key.as_deref(),
                body,
                self.dialect,
            ));
            match attempt {
                Ok(run) => return Ok(run),
                Err(Failure::Status { status, body }) => {
                    let message = error_message(&body);
                    let json_error = serde_json::from_str::<Value>(&body)
                        .is_ok_and(|v| v.get("error").is_some() || v.get("detail").is_some());
                    match status {
                        StatusCode::NOT_FOUND
                            if self.route == Route::Completions && !json_error =>
                        {
                            // No raw route here: the chat route is the next best.
                            self.route = Route::ChatCompletions;
                        }
                        StatusCode::NOT_FOUND if !json_error => {
                            return Err(EndpointError::NoRoute {
                                url: url.to_string(),
                            });
                        }
                        StatusCode::NOT_FOUND => {
                            return Err(EndpointError::ModelNotFound {
                                server: self.name.clone(),
                                model: self.model.clone(),
                                message,
                                available: self.available.clone(),
                            });
                        }
                        StatusCode::BAD_REQUEST
                            if self.ignore_eos && message.contains("ignore_eos") =>
                        {
                            self.ignore_eos = false;
                        }
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                            return Err(EndpointError::Refused {
                                url: url.to_string(),
                                status: status.as_u16(),
                                key_sent: self.api_key.is_some(),
                                message,
                            });
                        }
                        _ => {
                            return Err(EndpointError::Status {
                                url: url.to_string(),
                                status: status.as_u16(),
                                message,
                            });
                        }
                    }
                }
                Err(Failure::Unreachable(message)) => {
                    return Err(EndpointError::Unreachable {
                        url: url.to_string(),
                        message,
                    });
                }
                Err(Failure::Unreadable(message)) => {
                    return Err(EndpointError::BadAnswer {
                        url: url.to_string(),
                        message,
                    });
                }
            }
        }
    }

    fn body(&self, prompt: &str, max_tokens: usize, context_tokens: Option<usize>) -> Value {
        match self.route {
            Route::Generate => {
                let mut options = json!({
                    "temperature": 0,
                    "num_predict": max_tokens,
                    "seed": 0,
                });
                if let Some(n) = context_tokens {
                    options["num_ctx"] = json!(n);
                }
                json!({
                    "model": self.model,
                    "prompt": prompt,
                    "raw": true,
                    "stream": true,
                    "options": options,
                })
            }
            Route::Completions | Route::ChatCompletions => {
                let mut body = json!({
                    "model": self.model,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": true,
                    "stream_options": {"include_usage": true},
                });
                if self.route == Route::Completions {
                    body["prompt"] = json!(prompt);
                } else {
                    body["messages"] = json!([{"role": "user", "content": prompt}]);
                }
                if self.ignore_eos {
                    body["ignore_eos"] = json!(true);
                }
                body
            }
        }
    }
}

/// What the first requests found out about a server.
struct Found {
    name: String,
    model: String,
    dialect: EndpointDialect,
    base: Url,
    available: Vec<String>,
}

struct Probe<'a> {
    http: &'a reqwest::Client,
    api_key: Option<&'a str>,
}

impl Probe<'_> {
    async fn get(&self, url: &Url) -> Result<reqwest::Response, EndpointError> {
        let mut request = self.http.get(url.clone());
        if let Some(key) = self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| EndpointError::Unreachable {
                url: url.to_string(),
                message: connection_message(&e),
            })?;
        if matches!(
            response.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            return Err(EndpointError::Refused {
                url: url.to_string(),
                status,
                key_sent: self.api_key.is_some(),
                message: error_message(&body),
            });
        }
        Ok(response)
    }

    /// A JSON answer to a GET, or `None` for any answer that is not one
    /// (a missing route, a server that failed writing it).
    async fn get_json(&self, url: &Url) -> Result<(Option<Value>, Option<String>), EndpointError> {
        let response = self.get(url).await?;
        let server = response
            .headers()
            .get(header::SERVER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if !response.status().is_success() {
            return Ok((None, server));
        }
        let value = response
            .text()
            .await
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        Ok((value, server))
    }

    async fn run(&self, spec: &EndpointSpec) -> Result<Found, EndpointError> {
        let root = spec.url.clone();
        let path = root.path().trim_end_matches('/').to_owned();
        let at = |path: &str| {
            let mut url = root.clone();
            url.set_path(path);
            url.set_query(None);
            url
        };
        let ollama_version =
            |value: Option<Value>| value.and_then(|v| v["version"].as_str().map(str::to_owned));
        let (dialect, base, version) = if path.ends_with("/api") {
            let (value, _) = self.get_json(&at(&format!("{path}/version"))).await?;
            (
                EndpointDialect::Ollama,
                at(&format!("{path}/")),
                ollama_version(value),
            )
        } else if !path.is_empty() {
            (EndpointDialect::OpenAi, at(&format!("{path}/")), None)
        } else {
            let (value, _) = self.get_json(&at("/api/version")).await?;
            match ollama_version(value) {
                Some(version) => (EndpointDialect::Ollama, at("/api/"), Some(version)),
                None => (EndpointDialect::OpenAi, at("/v1/"), None),
            }
        };

        let listing = match dialect {
            EndpointDialect::Ollama => base.join("tags"),
            EndpointDialect::OpenAi => base.join("models"),
        }
        .unwrap_or_else(|_| base.clone());
        let (listed, server_header) = self.get_json(&listing).await?;
        let entries: Vec<Value> = listed
            .as_ref()
            .and_then(|v| match dialect {
                EndpointDialect::Ollama => v["models"].as_array(),
                EndpointDialect::OpenAi => v["data"].as_array(),
            })
            .cloned()
            .unwrap_or_default();
        let id_of = |entry: &Value| {
            let key = match dialect {
                EndpointDialect::Ollama => "name",
                EndpointDialect::OpenAi => "id",
            };
            entry[key].as_str().map(str::to_owned)
        };
        let available: Vec<String> = entries.iter().filter_map(id_of).collect();

        let host = match root.port_or_known_default() {
            Some(port) => format!("{}:{port}", root.host_str().unwrap_or_default()),
            None => root.host_str().unwrap_or_default().to_owned(),
        };
        let detected = match (&version, dialect) {
            (Some(version), EndpointDialect::Ollama) => Some(format!("ollama {version}")),
            _ => server_header.as_deref().and_then(product_name),
        };

        let model = match &spec.model {
            Some(model) => {
                // Ollama answers to `name` and `name:latest` alike.
                let listed = available
                    .iter()
                    .any(|m| m == model || *m == format!("{model}:latest"));
                if dialect == EndpointDialect::Ollama && !available.is_empty() && !listed {
                    return Err(EndpointError::ModelNotFound {
                        server: spec.name.clone().or(detected).unwrap_or(host),
                        model: model.clone(),
                        message: "not among the models it lists".into(),
                        available,
                    });
                }
                model.clone()
            }
            None if available.len() == 1 => available[0].clone(),
            None => {
                return Err(EndpointError::ModelNotNamed {
                    server: spec.name.clone().or(detected).unwrap_or(host),
                    available,
                });
            }
        };
        let owned_by = entries
            .iter()
            .find(|e| id_of(e).as_deref() == Some(model.as_str()))
            .and_then(|e| e["owned_by"].as_str())
            .filter(|owner| !GENERIC_OWNERS.contains(owner))
            .map(str::to_owned);
        let name = spec.name.clone().or(detected).or(owned_by).unwrap_or(host);
        Ok(Found {
            name,
            model,
            dialect,
            base,
            available,
        })
    }
}

/// `owned_by` values that name an account, not the server.
const GENERIC_OWNERS: &[&str] = &[
    "",
    "organization_owner",
    "owner",
    "system",
    "user",
    "library",
    "openai",
];

/// The product in a `Server` header, unless it is a general-purpose HTTP
/// library or web server that says nothing about what serves the model.
fn product_name(server: &str) -> Option<String> {
    const GENERIC: &[&str] = &[
        "basehttp",
        "python",
        "uvicorn",
        "hypercorn",
        "gunicorn",
        "werkzeug",
        "nginx",
        "apache",
        "caddy",
        "envoy",
        "cloudflare",
    ];
    let product = server.split_whitespace().next()?.split('/').next()?;
    let generic = GENERIC.iter().any(|g| product.eq_ignore_ascii_case(g))
        || server.to_ascii_lowercase().contains("python");
    (!generic && !product.is_empty()).then(|| product.to_owned())
}

/// The server's own words for an error: OpenAI's `error.message`, a plain
/// `error` string (Ollama, mlx_lm.server), FastAPI's `detail`, or the
/// body's first line.
fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let error = v.get("error").or(v.get("detail"))?;
        error
            .get("message")
            .and_then(Value::as_str)
            .or(error.as_str())
            .map(str::to_owned)
    });
    let text = from_json.unwrap_or_else(|| body.lines().next().unwrap_or_default().to_owned());
    let text = text.trim();
    const LONGEST: usize = 300;
    if text.is_empty() {
        "no message".into()
    } else if text.chars().count() > LONGEST {
        format!("{}…", text.chars().take(LONGEST).collect::<String>())
    } else {
        text.to_owned()
    }
}

fn connection_message(error: &reqwest::Error) -> String {
    use std::error::Error;
    // The innermost cause says it best ("Connection refused (os error 111)").
    let mut cause: &dyn Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Why a generation request did not give a run.
enum Failure {
    Status { status: StatusCode, body: String },
    Unreachable(String),
    Unreadable(String),
}

async fn stream_generation(
    http: &reqwest::Client,
    url: Url,
    api_key: Option<&str>,
    body: Value,
    dialect: EndpointDialect,
) -> Result<EndpointRun, Failure> {
    let mut request = http.post(url).json(&body);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let sent = Instant::now();
    let response = request
        .send()
        .await
        .map_err(|e| Failure::Unreachable(connection_message(&e)))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(Failure::Status { status, body });
    }
    let mut reader = StreamReader::new(dialect, sent);
    let mut bytes = response.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk.map_err(|e| Failure::Unreadable(connection_message(&e)))?;
        reader
            .push(&chunk, Instant::now())
            .map_err(Failure::Unreadable)?;
        if reader.done {
            break;
        }
    }
    reader.finish().map_err(Failure::Unreadable)
}

/// Reads a generation's stream as it arrives: server-sent events
/// (`data: {...}` lines, `data: [DONE]` at the end) for OpenAI, one JSON
/// object per line for Ollama. Each line is timed by the arrival of the
/// bytes that completed it.
struct StreamReader {
    dialect: EndpointDialect,
    sent: Instant,
    pending: Vec<u8>,
    first: Option<Instant>,
    last: Option<Instant>,
    text: String,
    text_events: usize,
    stop_reason: StopReason,
    server: ServerReport,
    done: bool,
}

impl StreamReader {
    fn new(dialect: EndpointDialect, sent: Instant) -> Self {
        Self {
            dialect,
            sent,
            pending: Vec::new(),
            first: None,
            last: None,
            text: String::new(),
            text_events: 0,
            stop_reason: StopReason::Other,
            server: ServerReport::default(),
            done: false,
        }
    }

    fn push(&mut self, bytes: &[u8], arrived: Instant) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            self.line(line.trim(), arrived)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<EndpointRun, String> {
        if !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
            let arrived = self.last.unwrap_or(self.sent);
            self.line(line.trim(), arrived)?;
        }
        if !self.done {
            return Err("the stream ended before the server said it was done".into());
        }
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1000.0;
        Ok(EndpointRun {
            ttft_ms: self.first.map_or(f64::NAN, |first| ms(self.sent, first)),
            decode_ms: match (self.first, self.last) {
                (Some(first), Some(last)) => ms(first, last),
                _ => 0.0,
            },
            text: self.text,
            text_events: self.text_events,
            stop_reason: self.stop_reason,
            server: self.server,
        })
    }

    fn arrived_text(&mut self, piece: &str, at: Instant) {
        if piece.is_empty() {
            return;
        }
        self.first.get_or_insert(at);
        self.last = Some(at);
        self.text_events += 1;
        self.text.push_str(piece);
    }

    fn line(&mut self, line: &str, at: Instant) -> Result<(), String> {
        if line.is_empty() || self.done {
            return Ok(());
        }
        match self.dialect {
            EndpointDialect::OpenAi => self.openai_line(line, at),
            EndpointDialect::Ollama => self.ollama_line(line, at),
        }
    }

    fn openai_line(&mut self, line: &str, at: Instant) -> Result<(), String> {
        // Comments (": keepalive") and other fields carry nothing to time.
        let Some(data) = line.strip_prefix("data:") else {
            return Ok(());
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let event: Value =
            serde_json::from_str(data).map_err(|e| format!("{e} in the event {data}"))?;
        if let Some(error) = event.get("error").filter(|e| !e.is_null()) {
            return Err(format!(
                "the server stopped with an error: {}",
                error_message(&json!({ "error": error }).to_string())
            ));
        }
        if let Some(choice) = event["choices"].get(0) {
            let delta = &choice["delta"];
            let mut piece = String::new();
            for reasoning in ["reasoning_content", "reasoning"] {
                piece.push_str(delta[reasoning].as_str().unwrap_or_default());
            }
            piece.push_str(delta["content"].as_str().unwrap_or_default());
            piece.push_str(choice["text"].as_str().unwrap_or_default());
            self.arrived_text(&piece, at);
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.stop_reason = stop_reason(reason);
            }
        }
        if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
            self.server.prompt_tokens = usage["prompt_tokens"].as_u64();
            self.server.generated_tokens = usage["completion_tokens"].as_u64();
            self.server.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
        }
        Ok(())
    }

    fn ollama_line(&mut self, line: &str, at: Instant) -> Result<(), String> {
        let event: Value =
            serde_json::from_str(line).map_err(|e| format!("{e} in the line {line}"))?;
        if let Some(error) = event["error"].as_str() {
            return Err(format!("the server stopped with an error: {error}"));
        }
        let mut piece = event["thinking"].as_str().unwrap_or_default().to_owned();
        piece.push_str(event["response"].as_str().unwrap_or_default());
        self.arrived_text(&piece, at);
        if event["done"].as_bool() == Some(true) {
            // Ollama's durations are nanoseconds.
            let ms = |key: &str| event[key].as_f64().map(|ns| ns / 1e6);
            self.server = ServerReport {
                prompt_tokens: event["prompt_eval_count"].as_u64(),
                generated_tokens: event["eval_count"].as_u64(),
                cached_tokens: None,
                load_ms: ms("load_duration"),
                prefill_ms: ms("prompt_eval_duration"),
                decode_ms: ms("eval_duration"),
            };
            self.stop_reason = stop_reason(event["done_reason"].as_str().unwrap_or_default());
            self.done = true;
        }
        Ok(())
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "length" => StopReason::MaxTokens,
        "stop" => StopReason::Eos,
        "tool_calls" => StopReason::ToolCalls,
        _ => StopReason::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_rides_in_the_fragment_and_credentials_leave_the_url() {
        let spec: EndpointSpec = "http://:sekrit@127.0.0.1:8080/v1#mlx-community/Qwen3-0.6B-4bit"
            .parse()
            .unwrap();
        assert_eq!(spec.url.as_str(), "http://127.0.0.1:8080/v1");
        assert_eq!(spec.model.as_deref(), Some("mlx-community/Qwen3-0.6B-4bit"));
        assert_eq!(spec.api_key.as_deref(), Some("sekrit"));
        assert_eq!(spec.name, None);
        assert!(!format!("{spec:?}").contains("sekrit"));

        let named: EndpointSpec = "lmstudio=http://localhost:1234/v1#qwen3-0.6b"
            .parse()
            .unwrap();
        assert_eq!(named.name.as_deref(), Some("lmstudio"));
        assert_eq!(named.url.as_str(), "http://localhost:1234/v1");

        // A query's '=' is part of the URL, and a folder may be the model.
        let query: EndpointSpec = "http://h:1/v1?x=y#/tmp/my%20model".parse().unwrap();
        assert_eq!(query.name, None);
        assert_eq!(query.model.as_deref(), Some("/tmp/my model"));

        let bare: EndpointSpec = "http://127.0.0.1:11434".parse().unwrap();
        assert_eq!(bare.model, None);
    }

    #[test]
    fn what_is_not_an_endpoint_is_named_with_an_example() {
        for text in ["127.0.0.1:8080#tiny", "ftp://h/#m", "not a url"] {
            let error = text.parse::<EndpointSpec>().unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidInput);
            assert!(error.to_string().contains("URL#MODEL"), "{error}");
        }
        let error = "ftp://:sekrit@h:1/#m".parse::<EndpointSpec>().unwrap_err();
        assert!(!error.to_string().contains("sekrit"), "{error}");
    }

    fn read(dialect: EndpointDialect, lines: &[(&str, u64)]) -> EndpointRun {
        let sent = Instant::now();
        let mut reader = StreamReader::new(dialect, sent);
        for (bytes, at_ms) in lines {
            reader
                .push(bytes.as_bytes(), sent + Duration::from_millis(*at_ms))
                .unwrap();
        }
        reader.finish().unwrap()
    }

    #[test]
    fn server_sent_events_are_timed_by_arrival_with_the_usage_kept() {
        let run = read(
            EndpointDialect::OpenAi,
            &[
                (": keepalive 1/3\n\n", 5),
                (
                    "data: {\"choices\":[{\"text\":\"Hel\",\"finish_reason\":null}]}\n\n",
                    40,
                ),
                // An event split across two reads counts when it completes.
                ("data: {\"choices\":[{\"text\":\"lo\",", 50),
                ("\"finish_reason\":null}]}\n\n", 60),
                (
                    "data: {\"choices\":[{\"text\":\"!\",\"finish_reason\":\"length\"}]}\n\n",
                    80,
                ),
                (
                    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":129,\"completion_tokens\":3,\
                     \"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: [DONE]\n\n",
                    81,
                ),
            ],
        );
        assert_eq!(run.text, "Hello!");
        assert_eq!(run.ttft_ms, 40.0);
        assert_eq!(run.decode_ms, 40.0);
        assert_eq!(run.text_events, 3);
        assert_eq!(run.stop_reason, StopReason::MaxTokens);
        assert_eq!(run.server.prompt_tokens, Some(129));
        assert_eq!(run.server.cached_tokens, Some(1));
        assert_eq!(run.generated_tokens(), 3);
        assert_eq!(run.decode_tps(), 2.0 / 0.040);
    }

    #[test]
    fn chat_deltas_count_reasoning_and_content() {
        let run = read(
            EndpointDialect::OpenAi,
            &[
                (
                    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n",
                    3,
                ),
                (
                    "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n",
                    10,
                ),
                (
                    "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n",
                    20,
                ),
                ("data: [DONE]\n", 21),
            ],
        );
        assert_eq!(run.text, "hmok");
        assert_eq!(run.ttft_ms, 10.0, "the role-only event carries no token");
        assert_eq!(run.stop_reason, StopReason::Eos);
        assert_eq!(run.server, ServerReport::default());
        assert_eq!(run.generated_tokens(), 2, "counted by events without usage");
    }

    #[test]
    fn ollama_lines_carry_nanosecond_durations() {
        let run = read(
            EndpointDialect::Ollama,
            &[
                ("{\"response\":\"a\",\"done\":false}\n", 100),
                (
                    "{\"response\":\"b\",\"done\":false}\n{\"response\":\"c\",\"done\":false}\n",
                    150,
                ),
                (
                    "{\"response\":\"\",\"done\":true,\"done_reason\":\"length\",\
                     \"total_duration\":250000000,\"load_duration\":2500000,\
                     \"prompt_eval_count\":64,\"prompt_eval_duration\":80000000,\
                     \"eval_count\":3,\"eval_duration\":60000000}",
                    160,
                ),
            ],
        );
        assert_eq!(run.text, "abc");
        assert_eq!(run.ttft_ms, 100.0);
        assert_eq!(run.decode_ms, 50.0);
        assert_eq!(run.server.load_ms, Some(2.5));
        assert_eq!(run.server.prefill_ms, Some(80.0));
        assert_eq!(run.server.decode_ms, Some(60.0));
        assert_eq!(run.server.prefill_tps(), Some(800.0));
        assert_eq!(run.server.decode_tps(), Some(50.0));
        assert_eq!(run.stop_reason, StopReason::MaxTokens);
    }

    #[test]
    fn a_stream_that_breaks_off_or_reports_an_error_is_not_a_run() {
        let sent = Instant::now();
        let mut reader = StreamReader::new(EndpointDialect::OpenAi, sent);
        reader
            .push(b"data: {\"choices\":[{\"text\":\"a\"}]}\n", sent)
            .unwrap();
        assert!(reader.finish().unwrap_err().contains("ended before"));

        let mut reader = StreamReader::new(EndpointDialect::OpenAi, sent);
        let error = reader
            .push(b"data: {\"error\":{\"message\":\"out of memory\"}}\n", sent)
            .unwrap_err();
        assert!(error.contains("out of memory"), "{error}");
    }

    #[test]
    fn server_headers_name_products_not_http_libraries() {
        assert_eq!(product_name("llama.cpp").as_deref(), Some("llama.cpp"));
        assert_eq!(product_name("ondo/0.1.0").as_deref(), Some("ondo"));
        assert_eq!(product_name("BaseHTTP/0.6 Python/3.11.7"), None);
        assert_eq!(product_name("uvicorn"), None);
    }

    #[test]
    fn error_bodies_give_the_servers_own_words() {
        assert_eq!(
            error_message(r#"{"error":{"message":"model \"x\" not found","type":"not_found"}}"#),
            "model \"x\" not found"
        );
        assert_eq!(
            error_message(r#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(error_message("404 page not found\n"), "404 page not found");
        assert_eq!(error_message(""), "no message");
    }
}
