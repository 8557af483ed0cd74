//! The HTTP side: routes, the hub's JSON and headers, its error codes, the
//! ways the real hub answers that a client must cope with (busy answers,
//! relative redirects, expiring storage links, a branch that moves, a token
//! it refuses), and the request log.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{
    ACCEPT_RANGES, AUTHORIZATION, AsHeaderName, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG,
    IntoHeaderName, LOCATION, RANGE, RETRY_AFTER,
};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::LoggedRequest;
use crate::file_body::{ByteRange, Transfer};
use crate::repo::{ServedFile, ServedRepo, is_valid_repo_id, lfs_pointer, sha256_hex};

/// Every repo gets these, so `filter=mlx` finds them all.
const TAGS: [&str; 3] = ["mlx", "safetensors", "text-generation"];
const LAST_MODIFIED: &str = "2026-01-01T00:00:00.000Z";
/// How long a storage link is good for unless a test says otherwise: the
/// hub's CDN links last about an hour.
pub(crate) const DEFAULT_LINK_LIFETIME: Duration = Duration::from_secs(3600);
/// What the hub says, in `X-Error-Message` and the body, to a token it does not know.
pub(crate) const INVALID_TOKEN_MESSAGE: &str = "Invalid credentials in Authorization header";

/// State shared by the server thread and the `TestHub` handle.
pub(crate) struct Shared {
    /// `http://127.0.0.1:PORT`, for redirects and error messages.
    pub base_url: String,
    state: Mutex<HubState>,
    pub body_bytes_served: AtomicU64,
}

#[derive(Default)]
pub(crate) struct HubState {
    /// Each repo at the commit `main` points to.
    pub repos: BTreeMap<String, ServedRepo>,
    /// Commits `main` pointed to before it moved: still served by their sha,
    /// as the hub serves any commit of a repo's history.
    pub older_commits: Vec<ServedRepo>,
    /// Repo id to the commit `main` moves to after that many more file requests.
    pub main_moves: HashMap<String, (usize, ServedRepo)>,
    /// Repo id to the one token that may read its files.
    pub gate_tokens: HashMap<String, String>,
    /// Tokens answered 401 "Invalid credentials" whatever they ask for.
    pub refused_tokens: HashSet<String>,
    /// Answers given before anything else, oldest first.
    pub busy_answers: VecDeque<BusyAnswer>,
    /// How long a storage link works after the hub hands it out; `None`
    /// until set, meaning [`DEFAULT_LINK_LIFETIME`].
    pub link_lifetime: Option<Duration>,
    /// Content hashes whose bodies are served with a byte flipped.
    pub corrupted_sha256: HashSet<String>,
    pub bytes_per_second: Option<u64>,
    pub drops_left: usize,
    pub drop_after_bytes: u64,
    pub requests: Vec<LoggedRequest>,
}

/// A 429 or 5xx the hub gives under load, to requests whose path contains
/// `path_contains`.
pub(crate) struct BusyAnswer {
    pub path_contains: String,
    pub left: usize,
    pub status: StatusCode,
    pub retry_after: Option<String>,
}

impl HubState {
    /// The repo at `revision`: `main`, or the sha of any commit it had.
    fn repo_at(&self, repo_id: &str, revision: &str) -> Option<&ServedRepo> {
        let main = self.repos.get(repo_id)?;
        if revision == "main" || revision == main.commit {
            return Some(main);
        }
        self.older_commits
            .iter()
            .find(|repo| repo.repo_id == repo_id && repo.commit == revision)
    }

    /// Counts a file request of `repo_id` towards a pending move of `main`.
    fn count_file_request(&mut self, repo_id: &str) {
        let Some((left, _)) = self.main_moves.get_mut(repo_id) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left > 0 {
            return;
        }
        if let Some((_, next)) = self.main_moves.remove(repo_id)
            && let Some(previous) = self.repos.insert(repo_id.to_string(), next)
        {
            self.older_commits.push(previous);
        }
    }
}

impl Shared {
    pub(crate) fn new(base_url: String) -> Shared {
        Shared {
            base_url,
            state: Mutex::default(),
            body_bytes_served: AtomicU64::new(0),
        }
    }

    /// A panic elsewhere must not take the server down with it: the state
    /// stays consistent because every update is a single assignment or push.
    pub(crate) fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/models", get(search))
        .route("/api/models/{org}/{name}", get(info_at_main))
        .route("/api/models/{org}/{name}/revision/{revision}", get(info))
        .route("/api/models/{org}/{name}/tree/{revision}", get(tree))
        .route("/{org}/{name}/resolve/{revision}/{*path}", get(resolve))
        .route(
            "/api/resolve-cache/models/{org}/{name}/{commit}/{*path}",
            get(resolve_cache),
        )
        .route("/storage/{sha256}", get(storage))
        .fallback(unknown_route)
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            answer_before_routes,
        ))
        .layer(middleware::from_fn_with_state(shared.clone(), log_request))
        .with_state(shared)
}

async fn log_request(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let range = header_str(request.headers(), RANGE).map(str::to_string);
    let token = bearer_token(request.headers()).map(str::to_string);
    let response = next.run(request).await;
    shared.state().requests.push(LoggedRequest {
        method,
        path,
        query,
        range,
        token,
        status: response.status().as_u16(),
    });
    response
}

/// What the hub answers before looking at the route: 429 and 5xx under
/// load, and 401 to a token it does not know (on its own routes; the
/// storage host does not read tokens).
async fn answer_before_routes(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let busy = {
        let mut state = shared.state();
        let busy = state
            .busy_answers
            .iter_mut()
            .find(|answer| path.contains(&answer.path_contains))
            .map(|answer| {
                answer.left -= 1;
                (answer.status, answer.retry_after.clone())
            });
        state.busy_answers.retain(|answer| answer.left > 0);
        busy
    };
    if let Some((status, retry_after)) = busy {
        let message = if status == StatusCode::TOO_MANY_REQUESTS {
            "You have been rate-limited; you can retry this action later.".to_string()
        } else {
            format!("{status}: the hub is overloaded, retry later")
        };
        let mut response = HubError::new(status, None, message).into_response();
        if let Some(retry_after) = retry_after {
            set(response.headers_mut(), RETRY_AFTER, &retry_after);
        }
        return response;
    }
    let refused = bearer_token(request.headers())
        .is_some_and(|token| shared.state().refused_tokens.contains(token));
    if refused && !path.starts_with("/storage/") {
        // The real hub sends RepoNotFound with it, even for a public repo.
        return HubError::new(
            StatusCode::UNAUTHORIZED,
            Some("RepoNotFound"),
            INVALID_TOKEN_MESSAGE.to_string(),
        )
        .into_response();
    }
    next.run(request).await
}

/// An error as the hub sends it: a status, `X-Error-Code`, and `{"error": ...}`.
struct HubError {
    status: StatusCode,
    code: Option<&'static str>,
    message: String,
}

impl HubError {
    fn new(status: StatusCode, code: Option<&'static str>, message: String) -> HubError {
        HubError {
            status,
            code,
            message,
        }
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, axum::Json(json!({ "error": self.message }))).into_response();
        if let Some(code) = self.code {
            set(response.headers_mut(), "x-error-code", code);
        }
        set(response.headers_mut(), "x-error-message", &self.message);
        response
    }
}

async fn unknown_route(State(shared): State<Arc<Shared>>, uri: Uri) -> HubError {
    HubError::new(
        StatusCode::NOT_FOUND,
        None,
        format!("Not Found: {}{uri}", shared.base_url),
    )
}

/// What a request wants of a repo: gating hides only the files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Info,
    Files,
}

/// Finds a repo at a revision the way the hub checks a request: id, then
/// access, then revision.
fn find_repo(
    shared: &Shared,
    org: &str,
    name: &str,
    revision: &str,
    access: Access,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<ServedRepo, HubError> {
    let repo_id = format!("{org}/{name}");
    if !is_valid_repo_id(&repo_id) {
        return Err(HubError::new(
            StatusCode::BAD_REQUEST,
            None,
            format!("Invalid repo id: {repo_id:?}"),
        ));
    }
    let bearer = bearer_token(headers);
    let state = shared.state();
    if !state.repos.contains_key(&repo_id) {
        // Without a token the hub cannot tell a missing repo from a private
        // one the caller might own, and answers 401 for both.
        let status = if bearer.is_some() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::UNAUTHORIZED
        };
        return Err(HubError::new(
            status,
            Some("RepoNotFound"),
            format!("Repository Not Found for url: {}{uri}.", shared.base_url),
        ));
    }
    if let (Access::Files, Some(token)) = (access, state.gate_tokens.get(&repo_id)) {
        match bearer {
            Some(given) if given == token => {}
            Some(_) => {
                return Err(HubError::new(
                    StatusCode::FORBIDDEN,
                    Some("GatedRepo"),
                    format!(
                        "Access to model {repo_id} is restricted and you are not in the authorized list. Visit {}/{repo_id} to ask for access.",
                        shared.base_url
                    ),
                ));
            }
            None => {
                return Err(HubError::new(
                    StatusCode::UNAUTHORIZED,
                    Some("GatedRepo"),
                    format!(
                        "Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
                    ),
                ));
            }
        }
    }
    state.repo_at(&repo_id, revision).cloned().ok_or_else(|| {
        HubError::new(
            StatusCode::NOT_FOUND,
            Some("RevisionNotFound"),
            format!("Invalid rev id: {revision}"),
        )
    })
}

#[derive(serde::Deserialize)]
struct InfoQuery {
    blobs: Option<String>,
}

async fn info_at_main(
    State(shared): State<Arc<Shared>>,
    Path((org, name)): Path<(String, String)>,
    Query(query): Query<InfoQuery>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, HubError> {
    info_response(&shared, &org, &name, "main", &query, &headers, &uri)
}

async fn info(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision)): Path<(String, String, String)>,
    Query(query): Query<InfoQuery>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, HubError> {
    info_response(&shared, &org, &name, &revision, &query, &headers, &uri)
}

fn info_response(
    shared: &Shared,
    org: &str,
    name: &str,
    revision: &str,
    query: &InfoQuery,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Response, HubError> {
    let repo = find_repo(shared, org, name, revision, Access::Info, headers, uri)?;
    let with_blobs = matches!(query.blobs.as_deref(), Some("true" | "1"));
    let siblings: Vec<Value> = repo
        .files
        .iter()
        .map(|file| {
            if !with_blobs {
                return json!({ "rfilename": file.path });
            }
            let mut sibling = json!({
                "rfilename": file.path,
                "blobId": file.blob_id,
                "size": file.size_bytes,
            });
            if file.lfs {
                sibling["lfs"] = json!({
                    "sha256": file.sha256,
                    "size": file.size_bytes,
                    "pointerSize": lfs_pointer(&file.sha256, file.size_bytes).len(),
                });
            }
            sibling
        })
        .collect();
    let gated = shared.state().gate_tokens.contains_key(&repo.repo_id);
    let mut body = summary(&repo);
    body["sha"] = json!(repo.commit);
    body["private"] = json!(false);
    body["gated"] = if gated { json!("manual") } else { json!(false) };
    body["siblings"] = json!(siblings);
    Ok(axum::Json(body).into_response())
}

/// The repo's file listing, as newer huggingface_hub releases ask for it
/// before downloading a snapshot (`tree/REV?recursive=true`).
async fn tree(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision)): Path<(String, String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, HubError> {
    let repo = find_repo(
        &shared,
        &org,
        &name,
        &revision,
        Access::Info,
        &headers,
        &uri,
    )?;
    let entries: Vec<Value> = repo
        .files
        .iter()
        .map(|file| {
            let mut entry = json!({
                "type": "file",
                "path": file.path,
                "size": file.size_bytes,
                "oid": file.blob_id,
            });
            if file.lfs {
                entry["lfs"] = json!({
                    "oid": file.sha256,
                    "size": file.size_bytes,
                    "pointerSize": lfs_pointer(&file.sha256, file.size_bytes).len(),
                });
            }
            entry
        })
        .collect();
    Ok(axum::Json(entries).into_response())
}

/// The fields that both search results and repo info carry.
fn summary(repo: &ServedRepo) -> Value {
    let (downloads, likes) = popularity(&repo.repo_id);
    json!({
        "_id": sha256_hex(&repo.repo_id)[..24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "downloads": downloads,
        "likes": likes,
        "tags": TAGS,
        "library_name": "mlx",
        "pipeline_tag": "text-generation",
        "lastModified": LAST_MODIFIED,
    })
}

/// The part of a repo's config.json the hub's search includes; `None` when
/// the repo has no readable config.json.
fn config_summary(repo: &ServedRepo) -> Option<Value> {
    let file = repo.files.iter().find(|f| f.path == "config.json")?;
    let config: Value = serde_json::from_slice(&std::fs::read(&file.disk_path).ok()?).ok()?;
    let mut trimmed = json!({});
    for key in ["architectures", "model_type"] {
        if let Some(value) = config.get(key) {
            trimmed[key] = value.clone();
        }
    }
    Some(trimmed)
}

/// Download and like counts that differ between repos but never between
/// runs, so sorting by them is testable.
fn popularity(repo_id: &str) -> (u64, u64) {
    let hash = sha256_hex(repo_id);
    let downloads = u64::from_str_radix(&hash[..8], 16).unwrap_or(0) % 100_000;
    (downloads, downloads / 10)
}

async fn search(
    State(shared): State<Arc<Shared>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> axum::Json<Vec<Value>> {
    let value_of = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let search = value_of("search").unwrap_or("").to_lowercase();
    // The hub takes filters repeated or comma-separated; every one must match.
    let filters: Vec<&str> = pairs
        .iter()
        .filter(|(key, _)| key == "filter")
        .flat_map(|(_, value)| value.split(','))
        .filter(|tag| !tag.is_empty())
        .collect();
    let limit = value_of("limit").and_then(|l| l.parse::<usize>().ok());
    let descending = value_of("direction") == Some("-1");
    // `config=true` (huggingface_hub's `fetch_config`) adds each repo's
    // config, as the hub does: only its `architectures` and `model_type`.
    let with_config = value_of("config").is_some_and(|v| v.eq_ignore_ascii_case("true"));

    let mut found: Vec<Value> = shared
        .state()
        .repos
        .values()
        .filter(|repo| repo.repo_id.to_lowercase().contains(&search))
        .filter(|_| filters.iter().all(|tag| TAGS.contains(tag)))
        .map(|repo| {
            let mut hit = summary(repo);
            if let Some(config) = with_config.then(|| config_summary(repo)).flatten() {
                hit["config"] = config;
            }
            hit
        })
        .collect();
    if let Some(key @ ("downloads" | "likes")) = value_of("sort") {
        found.sort_by_key(|repo| repo[key].as_u64().unwrap_or(0));
    }
    if descending {
        found.reverse();
    }
    if let Some(limit) = limit {
        found.truncate(limit);
    }
    axum::Json(found)
}

async fn resolve(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, HubError> {
    let repo = find_repo(
        &shared,
        &org,
        &name,
        &revision,
        Access::Files,
        &headers,
        &uri,
    )?;
    shared.state().count_file_request(&repo.repo_id);
    let file = file_of(&repo, &path, &revision)?;
    let mut response = if file.lfs {
        // The hub answers LFS files with a redirect to its CDN, and puts the
        // content's identity in the X-Linked-* headers.
        let mut response = StatusCode::FOUND.into_response();
        let headers = response.headers_mut();
        set(headers, LOCATION, &storage_link(&shared, &file.sha256));
        set(headers, ETAG, &format!("\"{}\"", file.sha256));
        set(headers, "x-linked-etag", &format!("\"{}\"", file.sha256));
        set(headers, "x-linked-size", &file.size_bytes.to_string());
        set(headers, ACCEPT_RANGES, "bytes");
        response
    } else {
        // Small files too are a redirect on the real hub: a relative one to
        // its resolve cache, by commit, naming what was asked in the query.
        let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
        let asked = format!("/{org}/{name}/resolve/{revision}/{path}");
        let location = format!(
            "/api/resolve-cache/models/{org}/{name}/{}/{}?{}=&etag={}",
            repo.commit,
            escape(&path, true),
            escape(&asked, false),
            escape(&format!("\"{}\"", file.blob_id), false),
        );
        let headers = response.headers_mut();
        set(headers, LOCATION, &location);
        set(headers, ETAG, &format!("\"{}\"", file.blob_id));
        response
    };
    set(response.headers_mut(), "x-repo-commit", &repo.commit);
    Ok(response)
}

/// Where the hub's small-file redirects lead: the file by commit.
async fn resolve_cache(
    State(shared): State<Arc<Shared>>,
    Path((org, name, commit, path)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, HubError> {
    let repo = find_repo(&shared, &org, &name, &commit, Access::Files, &headers, &uri)?;
    let file = file_of(&repo, &path, &commit)?;
    let mut response = serve_file(&shared, &method, &headers, &file, &file.blob_id).await?;
    set(response.headers_mut(), "x-repo-commit", &repo.commit);
    Ok(response)
}

/// The file at `path` of `repo`, refusing paths that climb out of it.
fn file_of(repo: &ServedRepo, path: &str, revision: &str) -> Result<ServedFile, HubError> {
    if path.split('/').any(|part| part == "..") {
        return Err(HubError::new(
            StatusCode::BAD_REQUEST,
            None,
            format!("Invalid file path: {path:?}"),
        ));
    }
    repo.files
        .iter()
        .find(|file| file.path == path)
        .cloned()
        .ok_or_else(|| {
            HubError::new(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                format!(
                    "Entry not found: {path} is not in {} at {revision}",
                    repo.repo_id
                ),
            )
        })
}

/// A link to the content on the "CDN": another host name for this server
/// (clients must not send the hub's token there), signed with an expiry
/// time as the hub's CDN links are.
fn storage_link(shared: &Shared, sha256: &str) -> String {
    let lifetime = shared
        .state()
        .link_lifetime
        .unwrap_or(DEFAULT_LINK_LIFETIME);
    let expires_ms = unix_ms(SystemTime::now() + lifetime);
    format!(
        "{}/storage/{sha256}?expires={expires_ms}",
        shared.base_url.replace("127.0.0.1", "localhost"),
    )
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[derive(serde::Deserialize)]
struct StorageQuery {
    /// Milliseconds since the Unix epoch.
    expires: Option<u64>,
}

async fn storage(
    State(shared): State<Arc<Shared>>,
    Path(sha256): Path<String>,
    Query(query): Query<StorageQuery>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    // A signed link carries its own authorisation; S3 refuses a request
    // that brings a second one.
    if headers.contains_key(AUTHORIZATION) {
        return Err(HubError::new(
            StatusCode::BAD_REQUEST,
            None,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string parameter or the Authorization header should be specified".to_string(),
        ));
    }
    if query
        .expires
        .is_none_or(|expires| expires <= unix_ms(SystemTime::now()))
    {
        return Err(HubError::new(
            StatusCode::FORBIDDEN,
            None,
            "Request has expired".to_string(),
        ));
    }
    let file = {
        let state = shared.state();
        state
            .repos
            .values()
            .chain(&state.older_commits)
            .flat_map(|repo| &repo.files)
            .find(|file| file.sha256 == sha256)
            .cloned()
    };
    let Some(file) = file else {
        return Err(HubError::new(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            format!("No stored object with sha256 {sha256}"),
        ));
    };
    serve_file(&shared, &method, &headers, &file, &file.sha256).await
}

/// The bytes of a file, whole or the requested range, with whatever
/// misbehaviour the test has asked for.
async fn serve_file(
    shared: &Arc<Shared>,
    method: &Method,
    headers: &HeaderMap,
    file: &ServedFile,
    etag: &str,
) -> Result<Response, HubError> {
    let total = file.size_bytes;
    let (status, start, len) = match ByteRange::parse(header_str(headers, RANGE), total) {
        ByteRange::Whole => (StatusCode::OK, 0, total),
        ByteRange::Part { start, end } => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        ByteRange::Unsatisfiable => {
            let mut response = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            set(
                response.headers_mut(),
                CONTENT_RANGE,
                &format!("bytes */{total}"),
            );
            return Ok(response);
        }
    };

    let body = if method == Method::HEAD || len == 0 {
        axum::body::Body::empty()
    } else {
        let mut transfer = Transfer::open(&file.disk_path, start, len, shared.clone())
            .await
            .map_err(|error| {
                HubError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    None,
                    format!("cannot read {}: {error}", file.disk_path.display()),
                )
            })?;
        let mut state = shared.state();
        if state.corrupted_sha256.contains(&file.sha256) {
            transfer.flip_at = Some(total / 2);
        }
        // A body that ends before the cut point would not be cut, so it does
        // not use up one of the drops.
        if state.drops_left > 0 && len > state.drop_after_bytes {
            state.drops_left -= 1;
            transfer.cut_after_bytes = Some(state.drop_after_bytes);
        }
        drop(state);
        transfer.into_body()
    };

    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    set(headers, CONTENT_LENGTH, &len.to_string());
    set(headers, CONTENT_TYPE, "application/octet-stream");
    set(headers, ETAG, &format!("\"{etag}\""));
    set(headers, ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        let end = start + len - 1;
        set(
            headers,
            CONTENT_RANGE,
            &format!("bytes {start}-{end}/{total}"),
        );
    }
    Ok(response)
}

fn header_str(headers: &HeaderMap, name: impl AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The token of `Authorization: Bearer <token>`, if one was sent.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    header_str(headers, AUTHORIZATION)
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Percent-escapes all but unreserved characters (and `/` when `keep_slash`).
fn escape(text: &str, keep_slash: bool) -> String {
    let mut escaped = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                escaped.push(byte as char)
            }
            b'/' if keep_slash => escaped.push('/'),
            _ => escaped.push_str(&format!("%{byte:02X}")),
        }
    }
    escaped
}

/// Sets a header whose value we built ourselves; values that are not valid
/// header text (never, for ours) are left out rather than panicking.
fn set(headers: &mut HeaderMap, name: impl IntoHeaderName, value: &str) {
    if let Ok(value) = value.parse() {
        headers.insert(name, value);
    }
}
