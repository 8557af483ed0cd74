//! Downloading a model into the shared Hugging Face cache.
//!
//! hf-hub 0.5 gives the cache paths; its own `download` is not used: it
//! keeps a whole chunk in memory (by default the whole file), writes its own
//! trailer format into `.incomplete` files that Python's tools do not
//! continue, checks no checksums and reports errors without the hub's status.
//! So the transfer here is ours, written the way huggingface_hub writes:
//! bytes appended to `blobs/<etag>.incomplete` and resumed from its length
//! with an HTTP Range (across restarts and between Ondo and the Python
//! tools), a `.locks/` file so two processes never write one blob, every
//! file checked against the hub's hash before it is renamed into place (the
//! sha256 of an LFS file, the git blob id of any other), and snapshot links
//! relative to the blob.
//!
//! Against the real hub a download also has to pin the commit the revision
//! names at the start and fetch every file by that commit (someone may push
//! to `main` meanwhile), and ask the hub again for a storage link that
//! expired before the file was complete. Waiting out a busy hub and
//! following its redirects is the work of `Hub::send` in `hub::http`.

use std::{
    collections::VecDeque,
    io::{Read, Write},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use reqwest::{Method, StatusCode, Url, header};
use serde::Serialize;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::{
    Hub, HubError, ModelRef, RepoFile, RepoInfo,
    error::is_disk_full,
    http::{BusyWait, HubRequest, WaitWatch, root_cause},
};

/// How often one file's storage link may be refused as expired and asked
/// for anew before the download gives up on it.
const MAX_FRESH_LINKS: u32 = 3;

/// Which files a model needs to run: configs, tokenizer files, chat
/// templates and the `model*.safetensors` weights (not `consolidated.*`
/// duplicates, PyTorch or GGUF copies, READMEs or images). The same choice
/// mlx-lm makes, so a model pulled by either is complete for both.
pub fn needed_for_inference(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".json")
        || name.ends_with(".jinja")
        || name.ends_with(".txt")
        || name.ends_with(".tiktoken")
        || name == "tokenizer.model"
        || name == "tiktoken.model"
        || (name.starts_with("model") && name.ends_with(".safetensors"))
}

/// What happens to a partly downloaded file when a download is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum OnCancel {
    /// Keep it so the next pull continues where this one stopped (pause).
    KeepPartial,
    /// Delete it.
    RemovePartial,
}

/// Stops a download from another task or thread.
#[derive(Clone, Default)]
pub struct DownloadCancel {
    cancelled: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl DownloadCancel {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// What a download reports while it runs.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum DownloadEvent {
    /// The files are known; `present_bytes` are already on disk (whole
    /// files, or the start of partial ones).
    Planned {
        model: String,
        commit: String,
        files: usize,
        total_bytes: u64,
        present_bytes: u64,
    },
    /// Bytes arrived. Sent at most every 100 ms.
    Progress {
        file: String,
        file_bytes: u64,
        file_total_bytes: u64,
        done_bytes: u64,
        total_bytes: u64,
        /// Over the last few seconds.
        bytes_per_second: f64,
        eta_seconds: Option<f64>,
    },
    /// The transfer stopped and is being resumed from where it was.
    Retrying {
        file: String,
        attempt: u32,
        detail: String,
    },
    /// The hub answered busy (429) or failing (5xx); the same request goes
    /// again after the wait.
    HubBusy {
        /// The file asked for; `None` while asking for the repo's file list.
        file: Option<String>,
        /// 429, or the 5xx status.
        status: u16,
        wait_ms: u64,
        /// The try that comes after the wait (2 for the first retry).
        attempt: u32,
        /// Tries in all before giving up.
        attempts: u32,
    },
    FileDone {
        file: String,
        /// Its bytes were checked against the hub's hash of them (the
        /// sha256 of an LFS file, the git blob id of any other).
        verified: bool,
        /// Bytes sent over the network for it in this run.
        fetched_bytes: u64,
    },
}

/// What a finished download left in the cache.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DownloadSummary {
    pub model: String,
    pub commit: String,
    /// `snapshots/<commit>`: the folder to load.
    pub snapshot_dir: PathBuf,
    pub files: usize,
    pub total_bytes: u64,
    pub fetched_bytes: u64,
    /// Request to all files present and verified (the run record's
    /// `download_ms`, docs/REPORT_SCHEMA.md).
    pub download_ms: f64,
}

/// How a download behaves.
#[derive(Debug, Clone, Copy)]
pub struct DownloadOptions {
    pub on_cancel: OnCancel,
    /// Fetch only what this rank of a split model reads: the files holding
    /// its layers (by layers), the rest as usual. `None`: the whole model.
    pub share: Option<crate::family::shards::RankPart>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        Self {
            on_cancel: OnCancel::KeepPartial,
            share: None,
        }
    }
}

impl Hub {
    /// Downloads what `model` needs into the cache, or finds it there.
    /// Offline mode resolves from the cache only.
    pub async fn download(
        &self,
        model: &ModelRef,
        options: DownloadOptions,
        sink: &mut (dyn FnMut(DownloadEvent) + Send),
        cancel: &DownloadCancel,
    ) -> Result<DownloadSummary, HubError> {
        let started = Instant::now();
        if self.config.offline {
            return self.cached_snapshot(model, started);
        }
        let repo_dir = self.config.cache_dir.join(model.cache_folder_name());
        let cache_repo = self.cache.repo(model.hf_repo());
        let (info, files) = {
            let mut on_wait = |wait: BusyWait| sink(DownloadEvent::hub_busy(wait));
            let mut watch = WaitWatch {
                on_wait: Some(&mut on_wait),
                cancel: Some(cancel),
            };
            let info = self.repo_info_watched(model, &mut watch).await?;
            let files = model_files(&info)?;
            // A model the engine cannot run is refused before any weights
            // arrive, not after gigabytes that cannot load.
            let at_commit = ModelRef {
                repo_id: model.repo_id.clone(),
                revision: info.commit.clone(),
            };
            let config = self
                .read_json_file(&at_commit, &files, &cache_repo, &mut watch, "config.json")
                .await?;
            super::architecture::check_config(&config).map_err(|unsupported| {
                HubError::UnsupportedModelType {
                    model: model.to_string(),
                    unsupported,
                }
            })?;
            let files = match options.share {
                Some(share) => {
                    self.files_of_share(&at_commit, files, &config, share, &cache_repo, &mut watch)
                        .await?
                }
                None => files,
            };
            (info, files)
        };
        // Every file is fetched by this commit: `main` may move while we work.
        let commit = info.commit.as_str();

        let present_bytes: u64 = files
            .iter()
            .map(|f| present_len(&cache_repo.blob_path(&f.blob_id), f.size_bytes))
            .sum();
        let total_bytes: u64 = files.iter().map(|f| f.size_bytes).sum();
        sink(DownloadEvent::Planned {
            model: model.to_string(),
            commit: commit.to_owned(),
            files: files.len(),
            total_bytes,
            present_bytes,
        });
        check_free_space(model, &self.config.cache_dir, total_bytes - present_bytes)?;

        let mut progress = Progress::new(total_bytes, present_bytes);
        let mut fetched_bytes = 0;
        for file in &files {
            let blob = cache_repo.blob_path(&file.blob_id);
            let fetched = if present_len(&blob, file.size_bytes) == file.size_bytes && blob.exists()
            {
                0
            } else {
                self.fetch_blob(
                    model,
                    commit,
                    &repo_dir,
                    file,
                    &blob,
                    options,
                    &mut progress,
                    sink,
                    cancel,
                )
                .await?
            };
            fetched_bytes += fetched;
            link_into_snapshot(&cache_repo.pointer_path(commit), &file.path, &blob)?;
            sink(DownloadEvent::FileDone {
                file: file.path.clone(),
                verified: ContentHash::for_file(file).is_some() && fetched > 0,
                fetched_bytes: fetched,
            });
        }
        // The ref is written last: a revision that resolves names a complete snapshot.
        cache_repo
            .create_ref(commit)
            .map_err(HubError::io(repo_dir.join("refs")))?;
        Ok(DownloadSummary {
            model: model.to_string(),
            commit: commit.to_owned(),
            snapshot_dir: cache_repo.pointer_path(commit),
            files: files.len(),
            total_bytes,
            fetched_bytes,
            download_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The files a rank of a split model needs: every file but the weight
    /// files that hold only other ranks' layers, as the index lays them out.
    async fn files_of_share(
        &self,
        model: &ModelRef,
        files: Vec<RepoFile>,
        config: &serde_json::Value,
        share: crate::family::shards::RankPart,
        cache_repo: &hf_hub::CacheRepo,
        watch: &mut WaitWatch<'_>,
    ) -> Result<Vec<RepoFile>, HubError> {
        const INDEX: &str = "model.safetensors.index.json";
        if !files.iter().any(|file| file.path == INDEX) {
            return Ok(files);
        }
        let not_a_model = |reason: String| HubError::NotAModel {
            repo_id: model.repo_id.clone(),
            reason,
        };
        let settled =
            crate::family::settle(config).map_err(|e| not_a_model(format!("config.json: {e}")))?;
        let index = self
            .read_json_file(model, &files, cache_repo, watch, INDEX)
            .await?;
        let reads = |name: &str| share.reads(&settled, name);
        let needed = crate::family::shards::files_holding(&index, Some(&reads));
        Ok(files
            .into_iter()
            .filter(|file| !file.path.ends_with(".safetensors") || needed.contains(&file.path))
            .collect())
    }

    /// A small JSON file of the repo at `model`'s commit (config.json, the
    /// weights index): from the cache when an earlier pull left its blob
    /// whole, else read into memory and checked against its hash (the
    /// download writes it to the cache with the other files).
    async fn read_json_file(
        &self,
        model: &ModelRef,
        files: &[RepoFile],
        cache_repo: &hf_hub::CacheRepo,
        watch: &mut WaitWatch<'_>,
        path: &str,
    ) -> Result<serde_json::Value, HubError> {
        let wanted_file = files.iter().find(|file| file.path == path);
        let cached = wanted_file.and_then(|file| {
            std::fs::read(cache_repo.blob_path(&file.blob_id))
                .ok()
                .filter(|bytes| bytes.len() as u64 == file.size_bytes)
        });
        let bytes = match cached {
            Some(bytes) => bytes,
            None => {
                let bytes = self.read_small_file(model, path, watch).await?;
                // Checked as the download checks it, so a damaged config is
                // named as damaged rather than judged.
                if let Some(mut hash) = wanted_file.and_then(ContentHash::for_file) {
                    hash.update(&bytes);
                    let (algorithm, expected) = (hash.algorithm(), hash.expected().to_owned());
                    let actual = hash.finish();
                    if actual != expected {
                        return Err(HubError::ChecksumMismatch {
                            repo_id: model.repo_id.clone(),
                            file: path.to_owned(),
                            algorithm,
                            expected,
                            actual,
                        });
                    }
                }
                bytes
            }
        };
        serde_json::from_slice(&bytes).map_err(|err| HubError::NotAModel {
            repo_id: model.repo_id.clone(),
            reason: format!("{path} is not valid JSON: {err}"),
        })
    }

    /// Offline: the snapshot the revision names, if the cache has one with a config.
    fn cached_snapshot(
        &self,
        model: &ModelRef,
        started: Instant,
    ) -> Result<DownloadSummary, HubError> {
        let not_cached = || HubError::NotCachedOffline {
            model: model.to_string(),
        };
        let repo_dir = self.config.cache_dir.join(model.cache_folder_name());
        let commit = if model.revision.len() == 40
            && model.revision.chars().all(|c| c.is_ascii_hexdigit())
        {
            model.revision.clone()
        } else {
            std::fs::read_to_string(repo_dir.join("refs").join(&model.revision))
                .map_err(|_| not_cached())?
                .trim()
                .to_owned()
        };
        let snapshot_dir = repo_dir.join("snapshots").join(&commit);
        if !snapshot_dir.join("config.json").is_file() {
            return Err(not_cached());
        }
        Ok(DownloadSummary {
            model: model.to_string(),
            commit,
            snapshot_dir,
            files: 0,
            total_bytes: 0,
            fetched_bytes: 0,
            download_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Fetches one file into its blob by `commit`, resuming a partial one,
    /// retrying dropped transfers, asking for a fresh storage link when one
    /// expires, and checking its hash. Returns the bytes fetched.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_blob(
        &self,
        model: &ModelRef,
        commit: &str,
        repo_dir: &Path,
        file: &RepoFile,
        blob: &Path,
        options: DownloadOptions,
        progress: &mut Progress,
        sink: &mut (dyn FnMut(DownloadEvent) + Send),
        cancel: &DownloadCancel,
    ) -> Result<u64, HubError> {
        let blobs_dir = blob.parent().unwrap_or(repo_dir);
        std::fs::create_dir_all(blobs_dir).map_err(HubError::io(blobs_dir))?;
        let _lock = BlobLock::acquire(&self.config.cache_dir, model, &file.blob_id)?;
        // Another process may have finished it while we waited for nothing.
        if present_len(blob, file.size_bytes) == file.size_bytes && blob.exists() {
            return Ok(0);
        }
        let partial = partial_path(blob);
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&partial)
            .map_err(HubError::io(&partial))?;
        let mut have = out.metadata().map_err(HubError::io(&partial))?.len();
        if have > file.size_bytes {
            out.set_len(0).map_err(HubError::io(&partial))?;
            have = 0;
        }
        // The hash must cover the bytes kept from an earlier run too.
        let mut hash = ContentHash::for_file(file);
        if let Some(hash) = hash.as_mut()
            && have > 0
        {
            hash_existing(&partial, have, hash)?;
        }
        let mut transfer = Transfer {
            resolve_url: self.file_url(model, commit, &file.path)?,
            source: None,
            partial: &partial,
            out: &mut out,
            have,
            hash: &mut hash,
            fetched: 0,
        };
        let mut drops = 0u32;
        let mut fresh_links = 0u32;
        while transfer.have < file.size_bytes {
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(TransferStop::Cancelled),
                result = self.transfer(model, file, &mut transfer, progress, sink) => result,
            };
            match outcome {
                Ok(()) => {}
                Err(TransferStop::Cancelled) => {
                    drop(out);
                    if options.on_cancel == OnCancel::RemovePartial {
                        let _ = std::fs::remove_file(&partial);
                    }
                    return Err(HubError::Cancelled);
                }
                // A signed storage link is good for a while only; the hub
                // hands out a fresh one for the same commit and file.
                Err(TransferStop::Fatal(HubError::LinkExpired { status, .. }))
                    if fresh_links < MAX_FRESH_LINKS =>
                {
                    fresh_links += 1;
                    transfer.source = None;
                    sink(DownloadEvent::Retrying {
                        file: file.path.clone(),
                        attempt: fresh_links,
                        detail: format!(
                            "the storage link expired (HTTP {status}); asking the hub for a fresh one"
                        ),
                    });
                }
                Err(TransferStop::Fatal(err)) => return Err(err),
                Err(TransferStop::Dropped(detail)) => {
                    drops += 1;
                    if drops > self.config.retries {
                        return Err(HubError::Interrupted {
                            file: file.path.clone(),
                            detail,
                        });
                    }
                    sink(DownloadEvent::Retrying {
                        file: file.path.clone(),
                        attempt: drops,
                        detail,
                    });
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(resume_backoff(drops)) => {}
                    }
                }
            }
        }
        let fetched = transfer.fetched;
        out.sync_all().map_err(HubError::io(&partial))?;
        drop(out);
        if let Some(hash) = hash {
            let (algorithm, expected) = (hash.algorithm(), hash.expected().to_owned());
            let actual = hash.finish();
            if !actual.eq_ignore_ascii_case(&expected) {
                let _ = std::fs::remove_file(&partial);
                return Err(HubError::ChecksumMismatch {
                    repo_id: model.repo_id.clone(),
                    file: file.path.clone(),
                    algorithm,
                    expected,
                    actual,
                });
            }
        }
        std::fs::rename(&partial, blob).map_err(HubError::io(blob))?;
        Ok(fetched)
    }

    /// One HTTP request for the rest of a file, appended as it arrives.
    async fn transfer(
        &self,
        model: &ModelRef,
        file: &RepoFile,
        transfer: &mut Transfer<'_>,
        progress: &mut Progress,
        sink: &mut (dyn FnMut(DownloadEvent) + Send),
    ) -> Result<(), TransferStop> {
        // Resumes go straight to the storage link the hub gave last time,
        // as long as it works; the first request asks the hub.
        let request = HubRequest {
            method: Method::GET,
            url: transfer
                .source
                .clone()
                .unwrap_or_else(|| transfer.resolve_url.clone()),
            range: (transfer.have > 0).then(|| format!("bytes={}-", transfer.have)),
            model,
            file: Some(&file.path),
        };
        let sent = {
            let mut on_wait = |wait: BusyWait| sink(DownloadEvent::hub_busy(wait));
            let mut watch = WaitWatch {
                on_wait: Some(&mut on_wait),
                cancel: None,
            };
            self.send(&request, &mut watch).await
        };
        let response = match sent {
            Ok(response) => response,
            // A connection that fails between chunks is retried like a drop.
            Err(HubError::Unreachable { detail, .. })
            | Err(HubError::Interrupted { detail, .. }) => {
                return Err(TransferStop::Dropped(detail));
            }
            Err(err) => return Err(TransferStop::Fatal(err)),
        };
        transfer.source = Some(response.url().clone());
        match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                let start = content_range_start(response.headers());
                if start != Some(transfer.have) {
                    transfer.restart(progress)?;
                    return Err(TransferStop::Dropped(
                        "the server resumed at another offset; starting the file over".into(),
                    ));
                }
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                transfer.restart(progress)?;
                return Err(TransferStop::Dropped(
                    "the partial file was longer than the server's; starting over".into(),
                ));
            }
            _ if transfer.have > 0 => {
                // The server ignored the Range: take the whole file again.
                transfer.restart(progress)?;
            }
            _ => {}
        }
        let mut body = response.bytes_stream();
        loop {
            let next = tokio::time::timeout(self.config.read_timeout, body.next()).await;
            let chunk = match next {
                Err(_) => {
                    return Err(TransferStop::Dropped(format!(
                        "nothing arrived for {} s",
                        self.config.read_timeout.as_secs()
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(err))) => return Err(TransferStop::Dropped(root_cause(&err))),
                Ok(Some(Ok(chunk))) => chunk,
            };
            let room = file.size_bytes.saturating_sub(transfer.have) as usize;
            let chunk = &chunk[..chunk.len().min(room)];
            transfer.out.write_all(chunk).map_err(|err| {
                TransferStop::Fatal(if is_disk_full(&err) {
                    HubError::DiskFull {
                        model: model.to_string(),
                        dir: self.config.cache_dir.clone(),
                        needed_bytes: file.size_bytes - transfer.have,
                        available_bytes: free_disk_bytes(&self.config.cache_dir).unwrap_or(0),
                    }
                } else {
                    HubError::Io {
                        path: transfer.partial.to_owned(),
                        source: err,
                    }
                })
            })?;
            if let Some(hash) = transfer.hash.as_mut() {
                hash.update(chunk);
            }
            transfer.have += chunk.len() as u64;
            transfer.fetched += chunk.len() as u64;
            progress.advance(chunk.len() as u64);
            if let Some(event) = progress.event(&file.path, transfer.have, file.size_bytes, false) {
                sink(event);
            }
            if transfer.have >= file.size_bytes {
                break;
            }
        }
        if let Some(event) = progress.event(&file.path, transfer.have, file.size_bytes, true) {
            sink(event);
        }
        if transfer.have < file.size_bytes {
            return Err(TransferStop::Dropped(format!(
                "the connection closed after {} of {} bytes",
                transfer.have, file.size_bytes
            )));
        }
        Ok(())
    }
}

impl DownloadEvent {
    fn hub_busy(wait: BusyWait) -> Self {
        Self::HubBusy {
            file: wait.file,
            status: wait.status,
            wait_ms: wait.wait.as_millis() as u64,
            attempt: wait.attempt,
            attempts: wait.attempts,
        }
    }
}

/// One file's transfer across its requests: where its bytes go and come from.
struct Transfer<'a> {
    /// `/resolve/<commit>/<path>` on the hub.
    resolve_url: Url,
    /// Where the bytes came from last time: the storage link (or the hub's
    /// `resolve-cache` URL) the resolve URL redirected to.
    source: Option<Url>,
    partial: &'a Path,
    out: &'a mut std::fs::File,
    /// Bytes in the partial file.
    have: u64,
    hash: &'a mut Option<ContentHash>,
    /// Bytes received in this run.
    fetched: u64,
}

impl Transfer<'_> {
    /// Drops what the partial file holds, to take the file from its start.
    fn restart(&mut self, progress: &mut Progress) -> Result<(), TransferStop> {
        self.out
            .set_len(0)
            .map_err(|err| TransferStop::Fatal(HubError::io(self.partial)(err)))?;
        progress.retract(self.have);
        self.have = 0;
        if let Some(hash) = self.hash.as_mut() {
            hash.restart();
        }
        Ok(())
    }
}

enum TransferStop {
    Cancelled,
    /// Worth resuming.
    Dropped(String),
    Fatal(HubError),
}

/// How long to wait before resuming a dropped transfer for the `attempt`th time.
fn resume_backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * 2u64.pow(attempt.min(5)))
}

/// What a file's bytes must hash to, and the hash of what has arrived.
enum ContentHash {
    /// LFS files: the sha256 of the bytes.
    Sha256 { running: Sha256, expected: String },
    /// Other files: the git blob id, sha1 over `blob <size>\0` and the bytes.
    GitBlob {
        running: Sha1,
        size_bytes: u64,
        expected: String,
    },
}

impl ContentHash {
    /// The check the hub's info allows for `file`, if any: a blob id that is
    /// not a sha1 (40 hex digits) cannot be checked here.
    fn for_file(file: &RepoFile) -> Option<Self> {
        if let Some(sha256) = &file.sha256 {
            return Some(Self::Sha256 {
                running: Sha256::new(),
                expected: sha256.clone(),
            });
        }
        let is_sha1 =
            file.blob_id.len() == 40 && file.blob_id.chars().all(|c| c.is_ascii_hexdigit());
        is_sha1.then(|| Self::GitBlob {
            running: git_blob_hasher(file.size_bytes),
            size_bytes: file.size_bytes,
            expected: file.blob_id.clone(),
        })
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256 { running, .. } => running.update(bytes),
            Self::GitBlob { running, .. } => running.update(bytes),
        }
    }

    /// Back to the hash of no bytes, for a file taken again from its start.
    fn restart(&mut self) {
        match self {
            Self::Sha256 { running, .. } => *running = Sha256::new(),
            Self::GitBlob {
                running,
                size_bytes,
                ..
            } => *running = git_blob_hasher(*size_bytes),
        }
    }

    fn algorithm(&self) -> &'static str {
        match self {
            Self::Sha256 { .. } => "sha256",
            Self::GitBlob { .. } => "git blob id",
        }
    }

    fn expected(&self) -> &str {
        match self {
            Self::Sha256 { expected, .. } | Self::GitBlob { expected, .. } => expected,
        }
    }

    /// The hash of everything that arrived, in lowercase hex.
    fn finish(self) -> String {
        match self {
            Self::Sha256 { running, .. } => format!("{:x}", running.finalize()),
            Self::GitBlob { running, .. } => format!("{:x}", running.finalize()),
        }
    }
}

/// A sha1 primed the way git names a blob: `blob <size>\0`, then the bytes.
fn git_blob_hasher(size_bytes: u64) -> Sha1 {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {size_bytes}\0").as_bytes());
    hasher
}

fn content_range_start(headers: &header::HeaderMap) -> Option<u64> {
    let value = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// The files of `info` that a model needs, checked to include a config and weights.
fn model_files(info: &RepoInfo) -> Result<Vec<RepoFile>, HubError> {
    let files: Vec<RepoFile> = info
        .files
        .iter()
        .filter(|f| needed_for_inference(&f.path))
        .cloned()
        .collect();
    let not_a_model = |reason: &str| HubError::NotAModel {
        repo_id: info.repo_id.clone(),
        reason: reason.to_owned(),
    };
    if !files.iter().any(|f| f.path == "config.json") {
        return Err(not_a_model("it has no config.json"));
    }
    if !files.iter().any(|f| f.path.ends_with(".safetensors")) {
        return Err(not_a_model(
            "it has no model*.safetensors weights (MLX needs safetensors; GGUF and PyTorch files are not used)",
        ));
    }
    Ok(files)
}

/// Bytes of a file already on disk: the whole blob, or its partial start.
fn present_len(blob: &Path, size: u64) -> u64 {
    if let Ok(meta) = std::fs::metadata(blob) {
        return if meta.len() == size { size } else { 0 };
    }
    std::fs::metadata(partial_path(blob))
        .map(|m| m.len().min(size))
        .unwrap_or(0)
}

/// `blobs/<etag>.incomplete`, the name huggingface_hub resumes from too.
fn partial_path(blob: &Path) -> PathBuf {
    PathBuf::from(format!("{}.incomplete", blob.display()))
}

fn hash_existing(path: &Path, len: u64, hash: &mut ContentHash) -> Result<(), HubError> {
    let mut file = std::fs::File::open(path).map_err(HubError::io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = file.read(&mut buf[..want]).map_err(HubError::io(path))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(())
}

/// `snapshots/<commit>/<path>` as a relative link to the blob, like the
/// Python tools make, so the cache can be moved as a whole.
fn link_into_snapshot(snapshot_dir: &Path, repo_path: &str, blob: &Path) -> Result<(), HubError> {
    let link = snapshot_dir.join(repo_path);
    let parent = link.parent().unwrap_or(snapshot_dir);
    std::fs::create_dir_all(parent).map_err(HubError::io(parent))?;
    let depth = repo_path.matches('/').count();
    let mut target = PathBuf::from("../".repeat(depth + 2));
    target.push("blobs");
    target.push(blob.file_name().unwrap_or_default());
    if std::fs::symlink_metadata(&link).is_ok() {
        std::fs::remove_file(&link).map_err(HubError::io(&link))?;
    }
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, &link).map_err(HubError::io(&link))?;
    #[cfg(not(unix))]
    std::fs::copy(blob, &link).map_err(HubError::io(&link))?;
    Ok(())
}

/// An exclusive lock on one blob, in the same place and of the same kind
/// (flock) as huggingface_hub's, so Ondo and the Python tools never write
/// one blob at the same time.
struct BlobLock {
    _file: std::fs::File,
}

impl BlobLock {
    fn acquire(cache_dir: &Path, model: &ModelRef, blob_id: &str) -> Result<Self, HubError> {
        let dir = cache_dir.join(".locks").join(model.cache_folder_name());
        std::fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
        let path = dir.join(format!("{blob_id}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(HubError::io(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(HubError::Busy { path }),
            Err(std::fs::TryLockError::Error(err)) => Err(HubError::io(path)(err)),
        }
    }
}

/// Refuses to start when the rest of the model cannot fit on the disk.
fn check_free_space(model: &ModelRef, cache_dir: &Path, needed_bytes: u64) -> Result<(), HubError> {
    let Some(available_bytes) = free_disk_bytes(cache_dir) else {
        return Ok(());
    };
    if needed_bytes > available_bytes {
        return Err(HubError::DiskFull {
            model: model.to_string(),
            dir: cache_dir.to_owned(),
            needed_bytes,
            available_bytes,
        });
    }
    Ok(())
}

pub use crate::paths::free_disk_bytes;

/// Byte counts and a speed over a sliding window of a few seconds, so the ETA
/// follows the connection as it is now, not its average since the start.
struct Progress {
    total_bytes: u64,
    done_bytes: u64,
    window: VecDeque<(Instant, u64)>,
    last_event: Option<Instant>,
}

impl Progress {
    const WINDOW: Duration = Duration::from_secs(3);
    const EVERY: Duration = Duration::from_millis(100);

    fn new(total_bytes: u64, done_bytes: u64) -> Self {
        Self {
            total_bytes,
            done_bytes,
            window: VecDeque::new(),
            last_event: None,
        }
    }

    fn advance(&mut self, bytes: u64) {
        let now = Instant::now();
        self.done_bytes += bytes;
        self.window.push_back((now, bytes));
        while self
            .window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Self::WINDOW)
        {
            self.window.pop_front();
        }
    }

    fn retract(&mut self, bytes: u64) {
        self.done_bytes = self.done_bytes.saturating_sub(bytes);
    }

    fn bytes_per_second(&self) -> f64 {
        let Some((first, _)) = self.window.front() else {
            return 0.0;
        };
        let span = first.elapsed().as_secs_f64().max(0.05);
        let bytes: u64 = self.window.iter().map(|(_, b)| b).sum();
        bytes as f64 / span
    }

    fn event(
        &mut self,
        file: &str,
        file_bytes: u64,
        file_total: u64,
        force: bool,
    ) -> Option<DownloadEvent> {
        let now = Instant::now();
        if !force
            && self
                .last_event
                .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return None;
        }
        self.last_event = Some(now);
        let speed = self.bytes_per_second();
        let left = self.total_bytes.saturating_sub(self.done_bytes);
        Some(DownloadEvent::Progress {
            file: file.to_owned(),
            file_bytes,
            file_total_bytes: file_total,
            done_bytes: self.done_bytes,
            total_bytes: self.total_bytes,
            bytes_per_second: speed,
            eta_seconds: (speed > 0.0).then(|| left as f64 / speed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_what_inference_needs() {
        for yes in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer.model",
            "chat_template.jinja",
            "merges.txt",
        ] {
            assert!(needed_for_inference(yes), "{yes}");
        }
        for no in [
            "README.md",
            ".gitattributes",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "model.gguf",
            "original/consolidated.00.pth",
            "figure.png",
        ] {
            assert!(!needed_for_inference(no), "{no}");
        }
    }

    #[test]
    fn progress_speed_and_eta_follow_the_recent_window() {
        let mut p = Progress::new(1000, 0);
        p.advance(100);
        std::thread::sleep(Duration::from_millis(60));
        p.advance(100);
        let Some(DownloadEvent::Progress {
            done_bytes,
            bytes_per_second,
            eta_seconds,
            ..
        }) = p.event("f", 200, 1000, true)
        else {
            panic!("no event")
        };
        assert_eq!(done_bytes, 200);
        assert!(bytes_per_second > 0.0);
        let eta = eta_seconds.unwrap();
        assert!((eta - 800.0 / bytes_per_second).abs() < 1e-6);
        // Throttled: a second event right away is skipped unless forced.
        assert!(p.event("f", 200, 1000, false).is_none());
    }

    #[test]
    fn content_range_start_is_read() {
        let mut h = header::HeaderMap::new();
        h.insert(header::CONTENT_RANGE, "bytes 100-199/200".parse().unwrap());
        assert_eq!(content_range_start(&h), Some(100));
    }
}
