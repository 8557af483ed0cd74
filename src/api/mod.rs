//! The local server: other programs use Ondo's warm models over HTTP, in
//! the OpenAI dialect (`/v1/...`, chat completions and the Responses API),
//! the Anthropic dialect (`/v1/messages`)
//! and the Ollama dialect (`/api/...`). It is
//! a client of the session pool like the app and the CLI, so an API request
//! and a chat in the popover share the warm models, the keep-alive and the
//! memory-pressure policy, and every request is a recorded run (kind `api`).
//!
//! The server listens on 127.0.0.1 unless told otherwise, and anywhere else
//! only with an API key (see `access`). The engine runs one generation at a
//! time: requests wait their turn in arrival order (`queue`). Connections
//! are bounded in number, and one whose client sends nothing is closed
//! (`connections`). Each final response carries Ondo's own record of the
//! request under `ondo`.

mod access;
mod anthropic;
mod connections;
mod conversations;
mod embeddings;
pub mod error;
pub mod generation;
mod images;
mod ollama;
mod openai;
mod output_format;
mod queue;
mod responses;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

pub use error::{ApiError, ApiFailure, Dialect};
pub use generation::{OndoRecord, RequestLog};

use crate::app_settings::AppSettings;
use crate::app_settings::DEFAULT_PORT;
use crate::engine::{CancelToken, RunError};
use crate::hub::library::LibraryModel;
use crate::paths::DataDirs;
use crate::resolve::{
    NamedBy, ResolvedModel, TINY, downloaded_models, model_folders, resolve_model_in,
};
use crate::session::SessionPool;
use conversations::ConversationIndex;
use generation::Ask;
use queue::EngineQueue;

/// The largest request body the server reads: room for a conversation with
/// two images at the largest size an image may have (20 MiB each, a third
/// more in base64). A larger body is refused by its length, unread.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// How the server listens and whom it lets in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct ServerConfig {
    /// The address to listen on: `127.0.0.1` (this machine only), another
    /// address of this machine, or `0.0.0.0` (every network, which needs an
    /// API key). `localhost` means 127.0.0.1.
    pub host: String,
    /// 0 lets the system choose a free port.
    pub port: u16,
    /// When set, every request must send `Authorization: Bearer <key>` (or,
    /// as Anthropic's clients do, `x-api-key: <key>`).
    pub api_key: Option<String>,
    /// Web origins (`https://app.example`) whose pages may call the server;
    /// `*` allows any. Empty: no web page may.
    pub allowed_origins: Vec<String>,
    /// Requests that may wait for the engine at once; more are refused with
    /// 503 and Retry-After.
    pub max_waiting: usize,
    /// The longest a request waits for the engine, in seconds.
    pub wait_limit_s: u64,
    /// Most requests decoded together in one batch; `None`: the app's saved
    /// generation setting (`GenerationSettings::max_batch`).
    pub max_batch: Option<usize>,
    /// Connections open at once; the next waits to be accepted until one
    /// closes.
    pub max_connections: usize,
    /// How long the server waits for a client that sends nothing, in
    /// seconds: for a request's head from when it could come (a new or
    /// idle connection), for the rest of a body since its last bytes. The
    /// connection is then closed.
    pub idle_timeout_s: u64,
    /// Model folders the server was started with (`ondo serve ./folder`),
    /// which clients name by the folder's name: a client may never name a
    /// path itself.
    #[serde(skip)]
    pub named_folders: Vec<ResolvedModel>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: Ipv4Addr::LOCALHOST.to_string(),
            port: DEFAULT_PORT,
            api_key: None,
            allowed_origins: Vec::new(),
            max_waiting: 64,
            wait_limit_s: 300,
            max_batch: None,
            // Room for every request the queue takes and the clients' idle
            // connections besides, well under the 256 files a process may
            // open by default on macOS (each connection is one).
            max_connections: 128,
            // Long enough for any client that means to send (they send at
            // once); an idle connection in a client's pool is closed after
            // it, which clients expect (they open another).
            idle_timeout_s: 30,
            named_folders: Vec::new(),
        }
    }
}

impl ServerConfig {
    /// The address to bind, refusing one beyond this machine without a key.
    pub fn socket_address(&self) -> Result<SocketAddr, ApiError> {
        let host = self.host.trim();
        let ip = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .map_err(|_| ApiError::AddressUnavailable {
                    address: host.to_owned(),
                    message: "that is not an IP address of this machine (such as 127.0.0.1)".into(),
                })?
        };
        if !ip.is_loopback() && self.key().is_none() {
            return Err(ApiError::KeyRequired {
                host: host.to_owned(),
            });
        }
        Ok(SocketAddr::new(ip, self.port))
    }

    /// The API key, if one is set (an empty one is none).
    fn key(&self) -> Option<&str> {
        self.api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
    }
}

/// What the server is doing now (for the app's popover line).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ServerStatus {
    /// Where clients reach it: `http://127.0.0.1:11480`.
    pub url: String,
    /// Generations finished since it started (answered or cancelled).
    pub requests_served: u64,
    /// Requests waiting for the engine.
    pub waiting: usize,
    /// The request the engine is working on, if any.
    pub in_flight: Option<ClientInFlight>,
}

/// The request being answered now.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ClientInFlight {
    /// Method and path: `POST /v1/chat/completions`.
    pub route: String,
    pub model: String,
    /// The client's `User-Agent`.
    pub user_agent: Option<String>,
    /// Since its turn at the engine began.
    pub running_ms: u64,
}

/// Hears one line per request (the CLI prints it; the app may show it).
pub type RequestLogger = Arc<dyn Fn(&RequestLog) + Send + Sync>;

/// The requests at the engine now: for the status, and to cancel them all.
#[derive(Default)]
struct Flights {
    running: Mutex<HashMap<u64, (ClientInFlight, Instant, CancelToken)>>,
    next_id: AtomicU64,
    served: AtomicU64,
    /// Everything was cancelled: requests still waiting stop as they start.
    all_cancelled: std::sync::atomic::AtomicBool,
}

/// Ends a flight when dropped, counting it as served.
struct Flight<'f> {
    flights: &'f Flights,
    id: u64,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        lock(&self.flights.running).remove(&self.id);
        self.flights.served.fetch_add(1, Ordering::AcqRel);
    }
}

impl Flights {
    fn begin(&self, ask: &Ask, model: &str, cancel: CancelToken) -> Flight<'_> {
        self.begin_route(ask.route, ask.user_agent.clone(), model, cancel)
    }

    /// As `begin`, for a request that is no generation (embeddings).
    fn begin_route(
        &self,
        route: &str,
        user_agent: Option<String>,
        model: &str,
        cancel: CancelToken,
    ) -> Flight<'_> {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel);
        let client = ClientInFlight {
            route: route.to_owned(),
            model: model.to_owned(),
            user_agent,
            running_ms: 0,
        };
        if self.all_cancelled.load(Ordering::Acquire) {
            cancel.cancel();
        }
        lock(&self.running).insert(id, (client, Instant::now(), cancel));
        Flight { flights: self, id }
    }

    fn current(&self) -> Option<ClientInFlight> {
        lock(&self.running)
            .values()
            .min_by_key(|(_, since, _)| *since)
            .map(|(client, since, _)| ClientInFlight {
                running_ms: since.elapsed().as_millis() as u64,
                ..client.clone()
            })
    }

    /// Cancels the runs under way and, when `and_waiting`, those that start
    /// from now on.
    fn cancel_all(&self, and_waiting: bool) {
        if and_waiting {
            self.all_cancelled.store(true, Ordering::Release);
        }
        for (_, _, cancel) in lock(&self.running).values() {
            cancel.cancel();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What every request handler shares.
pub(crate) struct ServerState {
    pool: Arc<SessionPool>,
    queue: EngineQueue,
    conversations: Mutex<ConversationIndex>,
    /// `tiny` resolved once: writing it (the first time) needs the engine,
    /// which a request should not wait for behind another's generation.
    tiny: Mutex<Option<ResolvedModel>>,
    /// `ServerConfig::named_folders`.
    named_folders: Vec<ResolvedModel>,
    flights: Flights,
    on_request: RequestLogger,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    responses: Arc<Mutex<responses::ResponseStore>>,
}

impl ServerState {
    /// The settings the app saved, read once for each request that needs
    /// them and passed on (so a change the app saves applies from the next
    /// request): from the pool's history, or the defaults when it keeps
    /// none (`--no-history`), and then the history's file is never opened.
    async fn saved_settings(&self) -> AppSettings {
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            pool.with_store(|store| AppSettings::load(store))
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
    }

    /// The model a client names, looked for where `settings` say.
    async fn resolve(&self, name: &str, settings: &AppSettings) -> Result<ResolvedModel, ApiError> {
        if name.trim().eq_ignore_ascii_case(TINY)
            && let Some(tiny) = lock(&self.tiny).clone()
        {
            return Ok(tiny);
        }
        if let Some(named) = self
            .named_folders
            .iter()
            .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
        {
            return Ok(named.clone());
        }
        let pool = self.pool.clone();
        let name = name.to_owned();
        let folders = model_folders(settings, &DataDirs::from_env());
        let model = tokio::task::spawn_blocking(move || {
            resolve_model_in(&pool, &name, NamedBy::Client, &folders)
        })
        .await
        .map_err(|e| ApiError::Run(RunError::Internal(e.to_string())))??;
        if model.name == TINY {
            *lock(&self.tiny) = Some(model.clone());
        }
        Ok(model)
    }

    /// The downloaded models a client may name (`tiny` aside), in the
    /// folders `settings` name.
    async fn downloaded_models(&self, settings: &AppSettings) -> Vec<LibraryModel> {
        let folders = model_folders(settings, &DataDirs::from_env());
        let named = self.named_folders.clone();
        tokio::task::spawn_blocking(move || {
            named
                .iter()
                .map(|m| {
                    crate::hub::library::describe_folder(
                        m.name.clone(),
                        crate::hub::library::ModelSource::Folder,
                        &m.dir,
                    )
                })
                .chain(downloaded_models(&folders))
                .collect()
        })
        .await
        .unwrap_or_default()
    }
}

/// A running server. Dropping it stops it as `stop` does.
pub struct LocalServer {
    address: SocketAddr,
    state: Arc<ServerState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LocalServer {
    /// Listens as `config` says and serves from its own threads until
    /// stopped; `on_request` hears a line per request. It may be called
    /// from inside an async runtime (the app's): it blocks on nothing.
    pub fn start(
        pool: Arc<SessionPool>,
        config: ServerConfig,
        on_request: RequestLogger,
    ) -> Result<Self, ApiError> {
        let address = config.socket_address()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ondo-api")
            .enable_all()
            .build()
            .map_err(|e| ApiError::Start(e.to_string()))?;
        let listener = {
            let _inside = runtime.enter();
            listen(address).map_err(|e| ApiError::address_unavailable(address, &e))?
        };
        let address = listener
            .local_addr()
            .map_err(|e| ApiError::address_unavailable(address, &e))?;
        let max_batch = config.max_batch.unwrap_or_else(|| {
            pool.with_store(|store| AppSettings::load(store).generation.max_batch)
                .unwrap_or(crate::session::chat::DEFAULT_MAX_BATCH)
        });
        let state = Arc::new(ServerState {
            pool,
            queue: EngineQueue::new(
                max_batch,
                config.max_waiting,
                Duration::from_secs(config.wait_limit_s.max(1)),
            ),
            conversations: Mutex::new(ConversationIndex::default()),
            tiny: Mutex::new(None),
            named_folders: config.named_folders.clone(),
            flights: Flights::default(),
            on_request,
            responses: Arc::default(),
        });
        let rules = access::AccessRules {
            loopback_only_hosts: address.ip().is_loopback(),
            api_key: config.key().map(str::to_owned),
            allowed_origins: config
                .allowed_origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_owned())
                .filter(|o| !o.is_empty())
                .collect(),
        };
        let app = router(state.clone(), rules)
            .into_make_service_with_connect_info::<connections::ConnectionWatch>();
        let listener = connections::BoundedListener::new(
            listener,
            config.max_connections,
            Duration::from_secs(config.idle_timeout_s.max(1)),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ondo-api-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    // Errors here are a single connection's: the server
                    // goes on until stopped.
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await;
                });
            })
            .map_err(|e| ApiError::Start(e.to_string()))?;
        Ok(Self {
            address,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port the system chose for 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:11480`: what a client's base URL starts with.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Requests served, waiting and in flight now.
    pub fn status(&self) -> ServerStatus {
        ServerStatus {
            url: self.url(),
            requests_served: self.state.flights.served.load(Ordering::Acquire),
            waiting: self.state.queue.waiting(),
            in_flight: self.state.flights.current(),
        }
    }

    /// Stops taking connections; requests in flight (and those waiting for
    /// the engine) are still answered. `stop` then waits for them.
    pub fn stop_accepting(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether every connection is closed after `stop_accepting`.
    pub fn is_stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Cancels the generation under way (at its next step); once the
    /// server is stopping, those still waiting for the engine too, as they
    /// start: for a stop that cannot wait.
    pub fn cancel_in_flight(&self) {
        self.state.flights.cancel_all(self.stop.is_none());
    }

    /// Stops taking connections and waits until the requests in flight are
    /// answered. Blocks: call it off an async runtime's threads.
    pub fn stop(mut self) {
        self.stop_and_wait();
    }

    fn stop_and_wait(&mut self) {
        self.stop_accepting();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop_and_wait();
    }
}

/// A listening socket that a restarted server can take again at once (while
/// the last one's closed connections linger in TIME_WAIT).
fn listen(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

/// Marks a response whose request the run's end logs (with its figures).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoggedAtRunEnd;

fn router(state: Arc<ServerState>, rules: access::AccessRules) -> Router {
    Router::new()
        .route("/", get(root).head(root))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::openai_embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(embeddings::ollama_embed))
        .route("/api/embeddings", post(embeddings::ollama_embeddings))
        .fallback(no_such_route)
        .method_not_allowed_fallback(no_such_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            Arc::new(rules),
            access::enforce,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), log_requests))
        .layer(middleware::from_fn(connections::watch_requests))
        .with_state(state)
}

/// What Ollama's root answers, so tools that probe for a server find one.
async fn root() -> &'static str {
    "Ondo is running"
}

async fn no_such_route(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let dialect = Dialect::of_path(&path);
    let error = ApiError::NoSuchRoute {
        method: request.method().to_string(),
        path,
    };
    ApiFailure::new(dialect, error).into_response()
}

/// Logs every request that the end of its run does not log itself.
async fn log_requests(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let route = format!("{} {}", request.method(), request.uri().path());
    let user_agent = user_agent(request.headers());
    let response = next.run(request).await;
    if response.extensions().get::<LoggedAtRunEnd>().is_none() {
        let status = response.status().as_u16();
        let log = RequestLog {
            error: response
                .extensions()
                .get::<error::LoggedError>()
                .map(|e| format!("{}: {}", e.kind, e.message)),
            ..RequestLog::plain(&route, status, user_agent)
        };
        (state.on_request)(&log);
    }
    response
}

/// The client's `User-Agent`, when it sent one.
fn user_agent(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A request body read as `T`, or why not (413 over the limit, else 400).
fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge {
                limit_bytes: MAX_BODY_BYTES,
            }
        } else {
            ApiError::MalformedBody(rejection.body_text())
        }
    })?;
    // Read as a JSON value first, then into `T` from it: the value's
    // strings are moved on, never copied, where serde buffers (flattened
    // fields, untagged enums) and `T` holds `Value`s. Read straight into
    // `T`, a 50 MB image was copied three times before its size was known.
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::MalformedBody(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| ApiError::MalformedBody(e.to_string()))
}

/// Now as RFC 3339 UTC (Ollama's `created_at`).
fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_names_the_default_port() {
        let readme = include_str!("../../README.md");
        assert!(
            readme.contains(&format!("http://127.0.0.1:{DEFAULT_PORT}")),
            "README.md should say where the server listens by default"
        );
    }

    #[test]
    fn beyond_this_machine_only_with_a_key() {
        let config = ServerConfig::default();
        assert_eq!(
            config.socket_address().unwrap(),
            SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))
        );
        let open = ServerConfig {
            host: "0.0.0.0".into(),
            ..ServerConfig::default()
        };
        assert!(matches!(
            open.socket_address(),
            Err(ApiError::KeyRequired { .. })
        ));
        let blank_key = ServerConfig {
            api_key: Some("  ".into()),
            ..open.clone()
        };
        assert!(matches!(
            blank_key.socket_address(),
            Err(ApiError::KeyRequired { .. })
        ));
        let keyed = ServerConfig {
            api_key: Some("k".into()),
            ..open
        };
        assert!(keyed.socket_address().is_ok());
        let named = ServerConfig {
            host: "localhost".into(),
            port: 0,
            ..ServerConfig::default()
        };
        assert!(named.socket_address().unwrap().ip().is_loopback());
        let ipv6 = ServerConfig {
            host: "[::1]".into(),
            ..ServerConfig::default()
        };
        assert!(ipv6.socket_address().unwrap().ip().is_loopback());
        let nonsense = ServerConfig {
            host: "my laptop".into(),
            ..ServerConfig::default()
        };
        assert!(matches!(
            nonsense.socket_address(),
            Err(ApiError::AddressUnavailable { .. })
        ));
    }
}
