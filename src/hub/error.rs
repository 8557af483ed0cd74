//! What can go wrong when getting a model, each with what to do about it.

use std::path::PathBuf;

use super::fit::human_bytes;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("'{repo_id}' is not a valid repo id: {reason}")]
    InvalidRepoId { repo_id: String, reason: String },
    #[error(
        "'{revision}' is not a valid revision: use a branch, tag or commit such as main or refs/pr/1"
    )]
    InvalidRevision { revision: String },
    #[error(
        "{repo_id} was not found on {endpoint}: check the spelling (ondo search finds models by name); a private repo also answers this way without a token"
    )]
    RepoNotFound { repo_id: String, endpoint: String },
    #[error("{repo_id} has no revision '{revision}': try main, or a commit listed on the hub")]
    RevisionNotFound { repo_id: String, revision: String },
    #[error("{repo_id} has no file '{file}'")]
    EntryNotFound { repo_id: String, file: String },
    #[error(
        "{repo_id} needs a Hugging Face token (it is gated or private): accept its terms on the hub, then set HF_TOKEN or run `huggingface-cli login`{keychain}"
    )]
    Unauthorized {
        repo_id: String,
        keychain: &'static str,
    },
    #[error(
        "the token was refused for {repo_id}: access has not been granted yet; request it on the model's page on the hub, or check that HF_TOKEN is the right token"
    )]
    Forbidden { repo_id: String },
    #[error(
        "cannot reach the hub at {endpoint} ({detail}): check the network, or set HF_HUB_OFFLINE=1 to use only what is already downloaded"
    )]
    Unreachable { endpoint: String, detail: String },
    #[error(
        "{model} is not in the local cache and offline mode is on (HF_HUB_OFFLINE): unset it to download, or pick a model from `ondo ls`"
    )]
    NotCachedOffline { model: String },
    #[error(
        "not enough disk space in {}: {model} needs {} more and {} is free; free some space (ondo rm removes models) and pull again, finished files are kept",
        dir.display(), human_bytes(*needed_bytes), human_bytes(*available_bytes)
    )]
    DiskFull {
        model: String,
        dir: PathBuf,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error(
        "{file} of {repo_id} arrived corrupted (sha256 {actual}, the hub says {expected}); the damaged file was deleted, pull again to fetch it anew"
    )]
    ChecksumMismatch {
        repo_id: String,
        file: String,
        expected: String,
        actual: String,
    },
    #[error(
        "the download of {file} kept failing ({detail}); what arrived is kept, pull again to continue from there"
    )]
    Interrupted { file: String, detail: String },
    #[error("download cancelled")]
    Cancelled,
    #[error(
        "another download is writing {} right now (another Ondo window, ondo pull, or a Python tool); wait for it to finish",
        path.display()
    )]
    Busy { path: PathBuf },
    #[error("{repo_id} does not look like a model Ondo can run: {reason}")]
    NotAModel { repo_id: String, reason: String },
    #[error("the hub answered {status} for {url}: {body}")]
    Http {
        status: u16,
        url: String,
        body: String,
    },
    #[error("the hub sent something unexpected for {url}: {detail}")]
    BadResponse { url: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not in the library")]
    NotInLibrary(String),
}

impl HubError {
    /// A stable name for the UI and `--json` to branch on.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRepoId { .. } => "invalid_repo_id",
            Self::InvalidRevision { .. } => "invalid_revision",
            Self::RepoNotFound { .. } => "repo_not_found",
            Self::RevisionNotFound { .. } => "revision_not_found",
            Self::EntryNotFound { .. } => "entry_not_found",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Forbidden { .. } => "forbidden",
            Self::Unreachable { .. } => "unreachable",
            Self::NotCachedOffline { .. } => "not_cached_offline",
            Self::DiskFull { .. } => "disk_full",
            Self::ChecksumMismatch { .. } => "checksum_mismatch",
            Self::Interrupted { .. } => "interrupted",
            Self::Cancelled => "cancelled",
            Self::Busy { .. } => "busy",
            Self::NotAModel { .. } => "not_a_model",
            Self::Http { .. } => "http",
            Self::BadResponse { .. } => "bad_response",
            Self::Io { .. } => "io",
            Self::NotInLibrary(_) => "not_in_library",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Whether an I/O error means the disk (or a quota) is full.
pub(crate) fn is_disk_full(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || matches!(err.raw_os_error(), Some(28) | Some(122))
}
