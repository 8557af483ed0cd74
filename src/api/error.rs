//! What the local server refuses and why: one error type for the layer,
//! one table from an error's kind to its HTTP status, and the body each
//! dialect expects (`{"error": {"message", "type", "param", "code"}}` for
//! OpenAI clients, `{"error": "message"}` for Ollama's).

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ErrorKind;
use crate::engine::RunError;
use crate::resolve::ResolveError;

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
        "the request body is larger than {} MiB; send a shorter conversation",
        limit_bytes >> 20
    )]
    BodyTooLarge { limit_bytes: usize },
    #[error(
        "this server needs its API key: send the header 'Authorization: Bearer <key>' with the key it was started with"
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
        "there is no {method} {path} here; the routes are under /v1 (OpenAI) and /api (Ollama)"
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
            ApiError::Run(error) => error.kind(),
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
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Which API shape a route speaks, so its errors come in that shape too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Ollama,
}

impl Dialect {
    /// The dialect of a path: `/v1/...` is OpenAI's, the rest Ollama's.
    pub fn of_path(path: &str) -> Self {
        if path == "/v1" || path.starts_with("/v1/") {
            Dialect::OpenAi
        } else {
            Dialect::Ollama
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
    let message = error.to_string();
    match dialect {
        Dialect::OpenAi => serde_json::json!({
            "error": {
                "message": message,
                "type": openai_error_type(error.status()),
                "param": serde_json::Value::Null,
                "code": error.kind().as_str(),
            }
        }),
        Dialect::Ollama => serde_json::json!({ "error": message }),
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
        let status = self.error.status();
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
        assert_eq!(Dialect::of_path("/v1/models"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/api/tags"), Dialect::Ollama);
        assert_eq!(Dialect::of_path("/v10"), Dialect::Ollama);
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
    }
}
