//! A Hugging Face hub for Ondo's tests: serves model folders on 127.0.0.1 with
//! the hub's download protocol (repo info, resolve, LFS redirects to expiring
//! storage links, relative redirects of small files to the resolve cache,
//! ranges, error codes, git blob ids), answers as the real hub does where it
//! differs from its documentation (401 for an unknown repo without a token,
//! gated repos whose info is public), and misbehaves on request (busy
//! answers, a `main` that moves mid-download, refused tokens, dropped and
//! corrupted transfers) so download error paths can be tested. It runs its
//! own tokio runtime on its own thread, so sync tests can use it directly.

mod file_body;
mod repo;
mod server;

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::oneshot;

pub use repo::{ServedFile, ServedRepo, git_blob_id};
use server::{BusyAnswer, Shared};

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// As sent (still percent-encoded), without the query.
    pub path: String,
    pub query: Option<String>,
    /// The `Range` header, verbatim.
    pub range: Option<String>,
    /// The token of an `Authorization: Bearer` header.
    pub token: Option<String>,
    pub status: u16,
}

/// A running test hub. Dropping it stops the server and cuts any transfers
/// still in flight.
pub struct TestHub {
    url: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestHub {
    /// Starts an empty hub on a free port of 127.0.0.1.
    pub fn start() -> io::Result<TestHub> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared::new(url.clone()));
        let app = server::router(shared.clone());
        let (shutdown, shutdown_requested) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ondo-testhub".to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        result = axum::serve(listener, app) => {
                            if let Err(error) = result {
                                eprintln!("ondo-testhub: server stopped: {error}");
                            }
                        }
                        _ = shutdown_requested => {}
                    }
                });
                // Not a graceful shutdown: a throttled transfer must not keep
                // a test waiting in Drop. Dropping the tasks closes their sockets.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(TestHub {
            url,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash: the hub endpoint to
    /// give the client.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Serves every file under `folder` as repo `repo_id` (`org/name`),
    /// replacing any repo of that id. Files are hashed now and read from disk
    /// on each request, so they must not change while served.
    pub fn add_repo(&self, repo_id: &str, folder: impl AsRef<Path>) -> io::Result<ServedRepo> {
        let repo = ServedRepo::scan(repo_id, folder.as_ref())?;
        let mut state = self.shared.state();
        state.repos.insert(repo.repo_id.clone(), repo.clone());
        state
            .older_commits
            .retain(|old| old.repo_id != repo.repo_id);
        state.main_moves.remove(&repo.repo_id);
        Ok(repo)
    }

    /// After `file_requests` more requests for files of `repo_id` (resolve
    /// requests, by any revision), `main` moves to a new commit with the
    /// files of `folder`, as when someone pushes during a download. The
    /// commit it left is still served by its sha. Returns the new commit.
    pub fn move_main_after(
        &self,
        repo_id: &str,
        file_requests: usize,
        folder: impl AsRef<Path>,
    ) -> io::Result<ServedRepo> {
        let next = ServedRepo::scan(repo_id, folder.as_ref())?;
        let mut state = self.shared.state();
        if !state.repos.contains_key(repo_id) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{repo_id} is not served"),
            ));
        }
        state
            .main_moves
            .insert(repo_id.to_string(), (file_requests.max(1), next.clone()));
        Ok(next)
    }

    /// The commit that `main` resolves to, if the repo is served.
    pub fn commit_of(&self, repo_id: &str) -> Option<String> {
        let state = self.shared.state();
        state.repos.get(repo_id).map(|repo| repo.commit.clone())
    }

    /// With `Some(token)`, the repo is gated as on the hub: its info is
    /// served to anyone (with `"gated": "manual"`), while its files need
    /// `Authorization: Bearer <token>`: 401 `GatedRepo` without one, 403 with
    /// another. Storage links stay open: they are signed.
    pub fn set_gated(&self, repo_id: &str, token: Option<&str>) {
        let mut state = self.shared.state();
        match token {
            Some(token) => state
                .gate_tokens
                .insert(repo_id.to_string(), token.to_string()),
            None => state.gate_tokens.remove(repo_id),
        };
    }

    /// The next `count` requests whose path contains `path_contains` (`""`
    /// for any; `"/resolve/"` for files; `"/storage/"` for the CDN) are
    /// answered `status` (429, or a 5xx such as 503) with `Retry-After:
    /// retry_after` when given (seconds, or an HTTP date), before any other
    /// check, as the hub answers under load. Calls queue: the first that
    /// matches a request answers it.
    pub fn answer_busy(
        &self,
        path_contains: &str,
        count: usize,
        status: u16,
        retry_after: Option<&str>,
    ) {
        if count == 0 {
            return;
        }
        self.shared.state().busy_answers.push_back(BusyAnswer {
            path_contains: path_contains.to_string(),
            left: count,
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            retry_after: retry_after.map(str::to_string),
        });
    }

    /// Requests bearing `token` get 401 with `X-Error-Code: RepoNotFound` and
    /// "Invalid credentials in Authorization header", whatever they ask of
    /// the hub, public repos included: what the hub answers a mistyped,
    /// expired or revoked token.
    pub fn refuse_token(&self, token: &str) {
        self.shared.state().refused_tokens.insert(token.to_string());
    }

    /// How long the storage links handed out from now on work (an hour
    /// unless set). Storage answers an expired link 403 "Request has
    /// expired", as S3 does; a transfer already under way runs to its end.
    pub fn set_link_lifetime(&self, lifetime: Duration) {
        self.shared.state().link_lifetime = Some(lifetime);
    }

    /// Limits every file body to about this many bytes per second (`None` or
    /// 0: full speed). Applies to transfers already in flight too.
    pub fn set_bytes_per_second(&self, bytes_per_second: Option<u64>) {
        self.shared.state().bytes_per_second = bytes_per_second.filter(|&rate| rate > 0);
    }

    /// The next `count` file bodies longer than `after_bytes` send that many
    /// bytes and then drop the connection, with the full Content-Length
    /// advertised, so the client sees a truncated body. Shorter bodies (such
    /// as a `Range: bytes=0-0` probe) are served whole and do not count.
    pub fn drop_next_transfers(&self, count: usize, after_bytes: u64) {
        let mut state = self.shared.state();
        state.drops_left = count;
        state.drop_after_bytes = after_bytes;
    }

    /// From now on the file's body is served with its middle byte (offset
    /// `size / 2`) flipped, while info and headers still give the true sha256
    /// and size. Corruption follows the content, so every served file with the
    /// same sha256 is affected. Returns false if there is no such file.
    pub fn corrupt(&self, repo_id: &str, path: &str) -> bool {
        let mut state = self.shared.state();
        let Some(sha256) = state
            .repos
            .get(repo_id)
            .and_then(|repo| repo.files.iter().find(|file| file.path == path))
            .map(|file| file.sha256.clone())
        else {
            return false;
        };
        state.corrupted_sha256.insert(sha256);
        true
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.state().requests.clone()
    }

    /// File-body bytes handed to clients so far, over all responses.
    pub fn body_bytes_served(&self) -> u64 {
        self.shared.body_bytes_served.load(Ordering::Relaxed)
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
