//! What can go wrong when getting a model, each with what to do about it.

use std::path::PathBuf;

use super::{config::TokenSource, fit::human_bytes};

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
        "{file} of {repo_id} arrived corrupted ({algorithm} {actual}, the hub says {expected}); the damaged file was deleted, pull again to fetch it anew"
    )]
    ChecksumMismatch {
        repo_id: String,
        file: String,
        /// `sha256` for LFS files, `git blob id` for the others.
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "the hub at {endpoint} is limiting how often it may be asked (429 Too Many Requests) and {}; requests with a Hugging Face token get a higher limit",
        gave_up_waiting(*attempts, *asked_wait_seconds, *max_wait_seconds)
    )]
    RateLimited {
        endpoint: String,
        /// Requests sent in all, the last one included.
        attempts: u32,
        /// The hub's `Retry-After` when it was beyond what Ondo waits.
        asked_wait_seconds: Option<u64>,
        max_wait_seconds: u64,
    },
    #[error(
        "the hub at {endpoint} is failing (HTTP {status}) and {}",
        gave_up_waiting(*attempts, *asked_wait_seconds, *max_wait_seconds)
    )]
    ServerError {
        endpoint: String,
        status: u16,
        attempts: u32,
        asked_wait_seconds: Option<u64>,
        max_wait_seconds: u64,
    },
    #[error(
        "the hub at {endpoint} refused your Hugging Face token, read from {}: it is mistyped, expired or revoked. Replace it with a current one (huggingface.co/settings/tokens), or remove it: public models download without a token",
        token_source.map_or("the configuration", TokenSource::describe)
    )]
    TokenRefused {
        endpoint: String,
        token_source: Option<TokenSource>,
    },
    #[error(
        "the storage server kept refusing the download link of {file} (HTTP {status}: {detail}), even after the hub was asked for a fresh link; what arrived is kept, try again in a few minutes"
    )]
    LinkExpired {
        file: String,
        status: u16,
        detail: String,
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
            Self::RateLimited { .. } => "rate_limited",
            Self::ServerError { .. } => "server_error",
            Self::TokenRefused { .. } => "token_refused",
            Self::LinkExpired { .. } => "link_expired",
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

/// How waiting for a busy hub ended, and when to try again.
fn gave_up_waiting(
    attempts: u32,
    asked_wait_seconds: Option<u64>,
    max_wait_seconds: u64,
) -> String {
    match asked_wait_seconds {
        Some(asked) => format!(
            "asked to wait {}, longer than the {} Ondo waits at a time; what arrived is kept, try again after that",
            human_seconds(asked),
            human_seconds(max_wait_seconds)
        ),
        None => format!(
            "still was after {attempts} tries; what arrived is kept, try again in a few minutes"
        ),
    }
}

/// "45 s", "3 min", "2 h": a wait as a person would say it.
fn human_seconds(seconds: u64) -> String {
    match seconds {
        0..120 => format!("{seconds} s"),
        120..3600 => format!("{} min", seconds.div_ceil(60)),
        _ => format!("{} h", (seconds + 1800) / 3600),
    }
}

/// Whether an I/O error means the disk (or a quota) is full.
pub(crate) fn is_disk_full(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || matches!(err.raw_os_error(), Some(28) | Some(122))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_as_a_person_would_say_them() {
        assert_eq!(human_seconds(1), "1 s");
        assert_eq!(human_seconds(60), "60 s");
        assert_eq!(human_seconds(150), "3 min");
        assert_eq!(human_seconds(3600), "1 h");
        assert_eq!(human_seconds(5 * 3600 + 100), "5 h");
    }

    #[test]
    fn busy_errors_say_when_to_try_again() {
        let beyond = HubError::RateLimited {
            endpoint: "https://huggingface.co".into(),
            attempts: 1,
            asked_wait_seconds: Some(7200),
            max_wait_seconds: 60,
        };
        assert_eq!(beyond.kind(), "rate_limited");
        let text = beyond.to_string();
        assert!(
            text.contains("asked to wait 2 h, longer than the 60 s"),
            "{text}"
        );
        let after_tries = HubError::ServerError {
            endpoint: "https://huggingface.co".into(),
            status: 503,
            attempts: 6,
            asked_wait_seconds: None,
            max_wait_seconds: 60,
        };
        assert_eq!(after_tries.kind(), "server_error");
        let text = after_tries.to_string();
        assert!(
            text.contains("(HTTP 503) and still was after 6 tries"),
            "{text}"
        );
        assert!(!text.contains("ondo"), "{text}");
    }
}
