//! What the local server refuses and why: one error type for the layer,
//! one table from an error's kind to its HTTP status, and the body each
//! dialect expects (`{"error": {"message", "type", "param", "code"}}` for
//! OpenAI clients, `{"type": "error", "error": {"type", "message"}}` for
//! Anthropic's, `{"error": "message"}` for Ollama's). The server's log
//! gets each error's whole message; a client gets it without the server's
//! paths (`client_message`), since a client must not learn where anything
//! lives on the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ErrorKind;
use crate::engine::RunError;
use crate::resolve::{ResolveError, ResolvedModel};

/// Why the server did not start, or did not answer a request as asked.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "listening on {host} would let other machines use the models; set an API key to allow it, or listen on 127.0.0.1 only"
    )]
    KeyRequired { host: String },
    #[error("cannot listen on {address}: {message}; choose another port or address")]
    AddressUnavailable { address: String, message: String },
    #[error("the local server could not start: {0}")]
    Start(String),
    #[error("the request body is not valid JSON for this route: {0}")]
    MalformedBody(String),
    #[error("{0}")]
    InvalidField(String),
    #[error("{0}")]
    InvalidSettings(String),
    #[error(
        "the request body is larger than {} MiB; send a shorter conversation, or smaller images \
         (each at most 20 MiB)",
        limit_bytes >> 20
    )]
    BodyTooLarge { limit_bytes: usize },
    #[error(
        "this server needs its API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with the key it was started with"
    )]
    KeyRefused,
    #[error(
        "the Host header '{host}' does not name this machine; a server on the loopback address answers only requests for localhost or 127.0.0.1"
    )]
    HostRefused { host: String },
    #[error(
        "requests from web pages at {origin} are not allowed; allow that origin in the server's settings to let it in"
    )]
    OriginRefused { origin: String },
    #[error(
        "there is no {method} {path} here; the routes are under /v1 (OpenAI), /v1/messages (Anthropic) and /api (Ollama)"
    )]
    NoSuchRoute { method: String, path: String },
    #[error(
        "{waiting} requests are already waiting for the engine; try again in {} s",
        retry_after.as_secs()
    )]
    QueueFull {
        waiting: usize,
        retry_after: Duration,
    },
    #[error(
        "the request waited {} s for the engine, longer than this server allows; try again in {} s",
        waited.as_secs(),
        retry_after.as_secs()
    )]
    QueueTimeout {
        waited: Duration,
        retry_after: Duration,
    },
    #[error("the server is stopping and takes no new requests")]
    Stopping,
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Run(#[from] RunError),
    /// A run of a model the server found failed; `folder` is where the
    /// model is, which the engine's words may name.
    #[error("{error}")]
    ModelRun {
        model: String,
        folder: PathBuf,
        error: RunError,
    },
    /// The model is there but its folder does not load (damaged or missing
    /// files, an architecture or quantization Ondo does not run).
    #[error("{model} cannot be loaded: {reason}")]
    ModelUnloadable {
        model: String,
        folder: PathBuf,
        reason: String,
    },
}

impl ApiError {
    /// What clients branch on; it also picks the HTTP status.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::KeyRequired { .. } => ErrorKind::ApiKeyRequired,
            ApiError::AddressUnavailable { .. } => ErrorKind::AddressUnavailable,
            ApiError::Start(_) => ErrorKind::Internal,
            ApiError::MalformedBody(_) | ApiError::InvalidField(_) => ErrorKind::InvalidInput,
            ApiError::InvalidSettings(_) => ErrorKind::InvalidSettings,
            ApiError::BodyTooLarge { .. } => ErrorKind::BodyTooLarge,
            ApiError::KeyRefused => ErrorKind::ApiKeyRefused,
            ApiError::HostRefused { .. } => ErrorKind::HostRefused,
            ApiError::OriginRefused { .. } => ErrorKind::OriginRefused,
            ApiError::NoSuchRoute { .. } => ErrorKind::NoSuchRoute,
            ApiError::QueueFull { .. } => ErrorKind::QueueFull,
            ApiError::QueueTimeout { .. } => ErrorKind::QueueTimeout,
            ApiError::Stopping => ErrorKind::EngineStopped,
            ApiError::Resolve(error) => error.kind(),
            ApiError::Run(error) | ApiError::ModelRun { error, .. } => error.kind(),
            ApiError::ModelUnloadable { .. } => ErrorKind::Load,
        }
    }

    /// A run of `model` that failed with `error`.
    pub(crate) fn of_run(model: &ResolvedModel, error: RunError) -> Self {
        match error {
            RunError::Load(reason) => ApiError::ModelUnloadable {
                model: model.name.clone(),
                folder: model.dir.clone(),
                reason,
            },
            error => ApiError::ModelRun {
                model: model.name.clone(),
                folder: model.dir.clone(),
                error,
            },
        }
    }

    /// What a client is told: the message without the server's paths (a
    /// model's folder is named by the model's name, any other path not at
    /// all), and for a model that is not here or does not load, words for
    /// someone who can only pick another model or ask the server's owner.
    pub fn client_message(&self) -> String {
        match self {
            ApiError::Resolve(ResolveError::NotFound {
                name, available, ..
            }) => format!(
                "{name} is not downloaded on this server; the models it serves: {}",
                available.join(", ")
            ),
            ApiError::Resolve(error @ ResolveError::Tiny(_)) => {
                without_paths(&error.to_string(), None)
            }
            ApiError::Run(error) => without_paths(&error.to_string(), None),
            ApiError::ModelRun {
                model,
                folder,
                error,
            } => without_paths(&error.to_string(), Some((folder, model))),
            ApiError::ModelUnloadable {
                model,
                folder,
                reason,
            } => {
                let reason = without_paths(reason, Some((folder, model)));
                let end = if reason.ends_with(['.', '?', '!']) {
                    ""
                } else {
                    "."
                };
                format!(
                    "{model} is on this server but cannot be loaded: {reason}{end} Pick another \
                     model, or ask whoever runs the server to download it again (or to update \
                     Ondo, if it does not run this kind of model yet)"
                )
            }
            other => other.to_string(),
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        http_status(self.kind())
    }

    /// How long a client should wait before asking again, for the errors
    /// that pass with time.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::QueueFull { retry_after, .. }
            | ApiError::QueueTimeout { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Binding `address` failed.
    pub(crate) fn address_unavailable(address: SocketAddr, error: &std::io::Error) -> Self {
        ApiError::AddressUnavailable {
            address: address.to_string(),
            message: error.to_string(),
        }
    }
}

/// What a client reads where the server's words named a path.
const HIDDEN_PATH: &str = "a path on this server";

/// `text` with `model`'s folder (and, in the Hugging Face cache, its repo
/// folder) named by the model's name, and every other absolute path
/// replaced by words.
fn without_paths(text: &str, model: Option<(&PathBuf, &String)>) -> String {
    let mut text = text.to_owned();
    if let Some((folder, name)) = model {
        for place in spellings_of(folder) {
            text = text.replace(&place, name);
        }
    }
    hide_absolute_paths(&text)
}

/// A model folder as the server's words may spell it: as resolved and as
/// the engine opened it (symbolic links resolved), with the cache's repo
/// folder around a snapshot; the longest first, so a folder is replaced
/// before the folder that holds it.
fn spellings_of(folder: &Path) -> Vec<String> {
    let mut folders = vec![folder.to_owned()];
    folders.extend(std::fs::canonicalize(folder));
    let repos: Vec<PathBuf> = folders
        .iter()
        .filter_map(|f| {
            let snapshots = f.parent()?;
            let repo = snapshots.parent()?;
            (snapshots.file_name()? == "snapshots").then(|| repo.to_owned())
        })
        .collect();
    folders.extend(repos);
    let mut spellings: Vec<String> = folders
        .iter()
        .map(|f| f.display().to_string())
        .filter(|f| f.len() > 1)
        .collect();
    spellings.sort_by_key(|s| std::cmp::Reverse(s.len()));
    spellings.dedup();
    spellings
}

/// `text` with each absolute path (a word that starts with `/`) replaced
/// by words: for paths the server's words name that no folder above
/// covers (a file MLX could not open, the data folder).
fn hide_absolute_paths(text: &str) -> String {
    let ends_path = |c: char| c.is_whitespace() || "'\"`)]},".contains(c);
    let mut hidden = String::with_capacity(text.len());
    let mut rest = text;
    let mut at_word_start = true;
    while let Some(c) = rest.chars().next() {
        let after = &rest[c.len_utf8()..];
        let starts_path = c == '/'
            && at_word_start
            && after
                .chars()
                .next()
                .is_some_and(|n| !ends_path(n) && n != '/');
        if starts_path {
            let end = rest.find(ends_path).unwrap_or(rest.len());
            let path = rest[..end].trim_end_matches(['.', ':', ';']);
            hidden.push_str(HIDDEN_PATH);
            rest = &rest[path.len()..];
            at_word_start = false;
            continue;
        }
        hidden.push(c);
        at_word_start = c.is_whitespace() || "('\"`[{=".contains(c);
        rest = after;
    }
    hidden
}

/// The one table of HTTP statuses: each kind the server can meet, by what
/// the client did wrong (4xx) or what went wrong here (5xx).
pub fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput
        | ErrorKind::InvalidSettings
        | ErrorKind::NotAModelName
        | ErrorKind::EmptyPrompt
        | ErrorKind::PromptTooLong
        | ErrorKind::ChatTemplate => StatusCode::BAD_REQUEST,
        ErrorKind::ApiKeyRefused => StatusCode::UNAUTHORIZED,
        ErrorKind::HostRefused | ErrorKind::OriginRefused => StatusCode::FORBIDDEN,
        ErrorKind::ModelNotFound | ErrorKind::NoSuchRoute => StatusCode::NOT_FOUND,
        ErrorKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::QueueFull | ErrorKind::QueueTimeout | ErrorKind::EngineStopped => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        // A model that is there but does not load stays so until someone at
        // the server mends its folder. Servers answer 503 for a model still
        // loading (llama.cpp's server, Hugging Face's Inference API), which
        // passes with time; this does not, and clients retry a 5xx (OpenAI's
        // SDKs do, twice), each retry loading the model again for nothing.
        // Not 404 either, which says the model is not there. 422: the
        // request is well formed but asks for what this server cannot do;
        // OpenAI's SDKs raise it as its own exception and do not retry it.
        ErrorKind::Load => StatusCode::UNPROCESSABLE_ENTITY,
        // A model split over several machines lost one of them: this server
        // answered for machines behind it, and one of them failed, as a
        // gateway's upstream does (the message names the rank and host).
        ErrorKind::Distributed => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Which API shape a route speaks, so its errors come in that shape too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Dialect {
    /// The dialect of a path: `/v1/messages...` is Anthropic's, the rest
    /// of `/v1/...` OpenAI's, everything else Ollama's.
    pub fn of_path(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else if path == "/v1" || path.starts_with("/v1/") {
            Dialect::OpenAi
        } else {
            Dialect::Ollama
        }
    }

    /// The status `error` is answered with in this dialect: the one table's,
    /// except that Anthropic's clients are told the engine is busy with 529
    /// (`overloaded_error`), as Anthropic's own API tells them.
    pub fn status(self, error: &ApiError) -> StatusCode {
        let status = error.status();
        if self == Dialect::Anthropic && status == StatusCode::SERVICE_UNAVAILABLE {
            StatusCode::from_u16(529).unwrap_or(status)
        } else {
            status
        }
    }
}

/// An error on its way to a client, in the dialect of the route it asked.
#[derive(Debug)]
pub struct ApiFailure {
    pub dialect: Dialect,
    pub error: ApiError,
    /// The run that failed logged it already (with its model).
    logged: bool,
}

impl ApiFailure {
    pub fn new(dialect: Dialect, error: impl Into<ApiError>) -> Self {
        Self {
            dialect,
            error: error.into(),
            logged: false,
        }
    }

    pub fn openai(error: impl Into<ApiError>) -> Self {
        Self::new(Dialect::OpenAi, error)
    }

    pub fn ollama(error: impl Into<ApiError>) -> Self {
        Self::new(Dialect::Ollama, error)
    }

    pub fn anthropic(error: impl Into<ApiError>) -> Self {
        Self::new(Dialect::Anthropic, error)
    }

    /// The same failure, already in the log (a run's end wrote it).
    pub(crate) fn logged(mut self) -> Self {
        self.logged = true;
        self
    }

    /// The JSON body for this error in its dialect.
    pub fn body(&self) -> serde_json::Value {
        error_body(self.dialect, &self.error)
    }
}

/// An error as a dialect writes it: in a response body, or in a stream that
/// had begun when it failed.
pub fn error_body(dialect: Dialect, error: &ApiError) -> serde_json::Value {
    let message = error.client_message();
    match dialect {
        Dialect::OpenAi => serde_json::json!({
            "error": {
                "message": message,
                "type": openai_error_type(error.status()),
                "param": serde_json::Value::Null,
                "code": error.kind().as_str(),
            }
        }),
        Dialect::Anthropic => serde_json::json!({
            "type": "error",
            "error": {
                "type": anthropic_error_type(dialect.status(error)),
                "message": message,
            }
        }),
        Dialect::Ollama => serde_json::json!({ "error": message }),
    }
}

/// Anthropic's error `type` for a status, as its own API names them.
fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        status if (400..500).contains(&status) => "invalid_request_error",
        _ => "api_error",
    }
}

/// OpenAI's `type` for a status, as its own API names them.
fn openai_error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        status if status.is_client_error() => "invalid_request_error",
        _ => "server_error",
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let status = self.dialect.status(&self.error);
        let mut response = (status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(wait) = self.error.retry_after() {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(wait.as_secs().max(1)),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.logged {
            response.extensions_mut().insert(super::LoggedAtRunEnd);
        }
        response.extensions_mut().insert(LoggedError {
            kind: self.error.kind(),
            message: self.error.to_string(),
        });
        response
    }
}

/// Rides on an error response so the request log can say what it was.
#[derive(Debug, Clone)]
pub(crate) struct LoggedError {
    pub kind: ErrorKind,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind each variant has always had (for `Resolve` and `Run`, the
    /// kind of the example below). Exhaustive: a new variant does not
    /// compile until it has a line here and an example below.
    fn kind_name(error: &ApiError) -> &'static str {
        match error {
            ApiError::KeyRequired { .. } => "api_key_required",
            ApiError::AddressUnavailable { .. } => "address_unavailable",
            ApiError::Start(_) => "internal",
            ApiError::MalformedBody(_) | ApiError::InvalidField(_) => "invalid_input",
            ApiError::InvalidSettings(_) => "invalid_settings",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::KeyRefused => "api_key_refused",
            ApiError::HostRefused { .. } => "host_refused",
            ApiError::OriginRefused { .. } => "origin_refused",
            ApiError::NoSuchRoute { .. } => "no_such_route",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::QueueTimeout { .. } => "queue_timeout",
            ApiError::Stopping => "engine_stopped",
            ApiError::Resolve(_) => "model_not_found",
            ApiError::Run(_) => "empty_prompt",
            ApiError::ModelRun { .. } => "prompt_too_long",
            ApiError::ModelUnloadable { .. } => "load",
        }
    }

    fn one_of_each() -> Vec<(ApiError, u16)> {
        let wait = Duration::from_secs(3);
        vec![
            (
                ApiError::KeyRequired {
                    host: "0.0.0.0".into(),
                },
                500,
            ),
            (
                ApiError::AddressUnavailable {
                    address: "127.0.0.1:11480".into(),
                    message: "Address already in use (os error 98)".into(),
                },
                500,
            ),
            (ApiError::Start("no threads".into()), 500),
            (
                ApiError::MalformedBody("expected value at line 1 column 1".into()),
                400,
            ),
            (ApiError::InvalidField("n must be 1".into()), 400),
            (
                ApiError::InvalidSettings("temperature must be between 0 and 5".into()),
                400,
            ),
            (
                ApiError::BodyTooLarge {
                    limit_bytes: 4 << 20,
                },
                413,
            ),
            (ApiError::KeyRefused, 401),
            (
                ApiError::HostRefused {
                    host: "evil.example".into(),
                },
                403,
            ),
            (
                ApiError::OriginRefused {
                    origin: "https://evil.example".into(),
                },
                403,
            ),
            (
                ApiError::NoSuchRoute {
                    method: "GET".into(),
                    path: "/v2/chat".into(),
                },
                404,
            ),
            (
                ApiError::QueueFull {
                    waiting: 64,
                    retry_after: wait,
                },
                503,
            ),
            (
                ApiError::QueueTimeout {
                    waited: Duration::from_secs(300),
                    retry_after: wait,
                },
                503,
            ),
            (ApiError::Stopping, 503),
            (
                ApiError::Resolve(ResolveError::NotFound {
                    name: "org/missing".into(),
                    looked_in: "/cache".into(),
                    available: vec!["tiny".into()],
                }),
                404,
            ),
            (ApiError::Run(RunError::EmptyPrompt), 400),
            (
                ApiError::ModelRun {
                    model: "org/model".into(),
                    folder: "/cache/models--org--model/snapshots/abc".into(),
                    error: RunError::PromptTooLong(
                        "the prompt has 9000 tokens but /cache/models--org--model/snapshots/abc reads at most 4096".into(),
                    ),
                },
                400,
            ),
            (
                ApiError::ModelUnloadable {
                    model: "org/model".into(),
                    folder: "/cache/models--org--model/snapshots/abc".into(),
                    reason: "model_type `mamba` in /cache/models--org--model/snapshots/abc/config.json is not supported yet".into(),
                },
                422,
            ),
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        let errors: Vec<ApiError> = one_of_each().into_iter().map(|(e, _)| e).collect();
        let variants: std::collections::HashSet<_> =
            errors.iter().map(std::mem::discriminant).collect();
        // Two variants share a kind (invalid_input), so count the variants.
        assert_eq!(variants.len(), errors.len(), "a variant is listed twice");
        crate::error_kind::check_layer(&errors, ApiError::kind, kind_name);
    }

    #[test]
    fn every_error_has_its_status() {
        for (error, status) in one_of_each() {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
        }
    }

    #[test]
    fn each_dialect_gets_its_own_error_shape() {
        let failure = ApiFailure::openai(ApiError::InvalidField("n must be 1".into()));
        let body = failure.body();
        assert_eq!(body["error"]["message"], "n must be 1");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "invalid_input");
        assert!(body["error"]["param"].is_null());
        let failure = ApiFailure::ollama(ApiError::KeyRefused);
        assert!(failure.body()["error"].as_str().unwrap().contains("Bearer"));
        let failure = ApiFailure::anthropic(ApiError::InvalidField("max_tokens".into()));
        assert_eq!(
            failure.body(),
            serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens"}})
        );
        let body = ApiFailure::anthropic(ApiError::KeyRefused).body();
        assert_eq!(body["error"]["type"], "authentication_error");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-api-key")
        );
        assert_eq!(Dialect::of_path("/v1/messages"), Dialect::Anthropic);
        assert_eq!(
            Dialect::of_path("/v1/messages/count_tokens"),
            Dialect::Anthropic
        );
        assert_eq!(Dialect::of_path("/v1/messagesx"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/v1/models"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/api/tags"), Dialect::Ollama);
        assert_eq!(Dialect::of_path("/v10"), Dialect::Ollama);
    }

    #[test]
    fn a_client_never_reads_a_server_path() {
        let folder = PathBuf::from("/srv/hf hub/models--org--model/snapshots/abc");
        let model = ResolvedModel {
            name: "org/model".into(),
            dir: folder.clone(),
        };
        let run = |error: RunError| ApiError::of_run(&model, error);
        for (error, says) in [
            (
                run(RunError::PromptTooLong(
                    "the prompt has 9000 tokens but /srv/hf hub/models--org--model/snapshots/abc reads at most 4096".into(),
                )),
                "but org/model reads at most 4096",
            ),
            (
                run(RunError::InvalidSettings(
                    "token id 99999 is outside the vocabulary of /srv/hf hub/models--org--model/snapshots/abc (512 ids)".into(),
                )),
                "vocabulary of org/model (512 ids)",
            ),
            (
                run(RunError::Load(
                    "could not read /srv/hf hub/models--org--model/blobs/e3b0c4: unexpected end of file".into(),
                )),
                "could not read org/model/blobs/e3b0c4: unexpected end",
            ),
            (
                run(RunError::Mlx("[load] Failed to open /tmp/x.safetensors.".into())),
                "Failed to open a path on this server.",
            ),
            (
                ApiError::Resolve(ResolveError::Tiny(
                    "cannot write (/home/me/.ondo/models/tiny): disk full".into(),
                )),
                "cannot write (a path on this server): disk full",
            ),
            (
                ApiError::Resolve(ResolveError::NotFound {
                    name: "org/missing".into(),
                    looked_in: "/srv/hf hub".into(),
                    available: vec!["tiny".into(), "org/model".into()],
                }),
                "the models it serves: tiny, org/model",
            ),
        ] {
            let told = error.client_message();
            assert!(told.contains(says), "{told}");
            assert!(!told.contains("/srv") && !told.contains("/tmp"), "{told}");
            assert!(!told.contains("/home"), "{told}");
            for dialect in [Dialect::OpenAi, Dialect::Anthropic, Dialect::Ollama] {
                let body = error_body(dialect, &error).to_string();
                assert!(!body.contains("/srv") && !body.contains("/home"), "{body}");
            }
        }
        // The server's log keeps the whole message.
        let unloadable = run(RunError::Load(format!(
            "{}/config.json is not a valid model config: EOF",
            folder.display()
        )));
        assert!(
            unloadable
                .to_string()
                .contains("/srv/hf hub/models--org--model")
        );
        let told = unloadable.client_message();
        assert!(told.starts_with("org/model is on this server but cannot be loaded: org/model/config.json is not a valid model config"), "{told}");
        assert!(told.contains("EOF. Pick another model"), "{told}");
        let asked = run(RunError::Load("is this a model?".into())).client_message();
        assert!(asked.contains("model? Pick"), "{asked}");
        assert_eq!(unloadable.status().as_u16(), 422);
        // A client's own words are its own: a route or a name it sent.
        let route = ApiError::NoSuchRoute {
            method: "GET".into(),
            path: "/v2/chat".into(),
        };
        assert!(route.client_message().contains("/v2/chat"));
        let name = ApiError::Resolve(ResolveError::NotAModelName {
            name: "/etc/passwd".into(),
        });
        assert!(name.client_message().contains("'/etc/passwd'"));
    }

    #[test]
    fn waits_come_with_retry_after_and_refused_keys_with_the_scheme() {
        let response = ApiFailure::openai(ApiError::QueueFull {
            waiting: 3,
            retry_after: Duration::from_millis(200),
        })
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let response = ApiFailure::ollama(ApiError::KeyRefused).into_response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        // Anthropic's clients read a busy server as 529 overloaded_error.
        let full = ApiFailure::anthropic(ApiError::QueueFull {
            waiting: 3,
            retry_after: Duration::from_secs(2),
        });
        assert_eq!(full.body()["error"]["type"], "overloaded_error");
        let response = full.into_response();
        assert_eq!(response.status().as_u16(), 529);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }
}
