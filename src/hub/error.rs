//! What can go wrong when getting a model, each with what to do about it.

use std::path::PathBuf;

use super::config::TokenSource;
use crate::ErrorKind;
use crate::units::human_bytes;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("'{repo_id}' is not a valid repo id: {reason}")]
    InvalidRepoId { repo_id: String, reason: String },
    #[error(
        "'{revision}' is not a valid revision: use a branch, tag or commit such as main or refs/pr/1"
    )]
    InvalidRevision { revision: String },
    #[error(
        "{repo_id} was not found on {endpoint}: check the spelling, or search the hub for the model's name; a private repo also answers this way without a token"
    )]
    RepoNotFound { repo_id: String, endpoint: String },
    #[error("{repo_id} has no revision '{revision}': try main, or a commit listed on the hub")]
    RevisionNotFound { repo_id: String, revision: String },
    #[error("{repo_id} has no file '{file}'")]
    EntryNotFound { repo_id: String, file: String },
    #[error(
        "{repo_id} needs a Hugging Face token (it is gated or private): accept its terms on the model's page on the hub, then give Ondo a token: set HF_TOKEN or sign in with huggingface-cli login{keychain}"
    )]
    Unauthorized {
        repo_id: String,
        keychain: &'static str,
    },
    #[error(
        "the token was refused for {repo_id}: access has not been granted yet; request it on the model's page on the hub, or check that Ondo has the token (HF_TOKEN) of the account that was granted access"
    )]
    Forbidden { repo_id: String },
    #[error(
        "cannot reach the hub at {endpoint} ({detail}): check the network; models already downloaded still run (HF_HUB_OFFLINE=1 stops Ondo asking the hub)"
    )]
    Unreachable { endpoint: String, detail: String },
    #[error(
        "{model} is not downloaded and offline mode is on (HF_HUB_OFFLINE): unset it to download, or pick a model that is already downloaded"
    )]
    NotCachedOffline { model: String },
    #[error(
        "not enough disk space in {}: {model} needs {} more and {} is free; free some space (deleting a model you no longer use frees its size) and download it again: finished files are kept",
        dir.display(), human_bytes(*needed_bytes), human_bytes(*available_bytes)
    )]
    DiskFull {
        model: String,
        dir: PathBuf,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error(
        "{file} of {repo_id} arrived corrupted ({algorithm} {actual}, the hub says {expected}); the damaged file was deleted: download the model again to fetch it anew"
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
        "the download of {file} kept failing ({detail}); what arrived is kept: download the model again to continue from there"
    )]
    Interrupted { file: String, detail: String },
    #[error("the download was stopped")]
    Cancelled,
    #[error(
        "another download is writing {} right now (another Ondo, or a Python tool such as huggingface-cli); wait for it to finish, then try again",
        path.display()
    )]
    Busy { path: PathBuf },
    #[error("{repo_id} does not look like a model Ondo can run: {reason}")]
    NotAModel { repo_id: String, reason: String },
    #[error("{model} is {unsupported}; choose a model of one of those types")]
    UnsupportedModelType {
        /// The repo id or folder, as named.
        model: String,
        unsupported: super::architecture::Unsupported,
    },
    #[error(
        "the hub answered {status} for {url}: {body}; try again later, and check the model id if it persists"
    )]
    Http {
        status: u16,
        url: String,
        body: String,
    },
    #[error("the hub sent something unexpected for {url}: {detail}; try again later")]
    BadResponse { url: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0} is not among the models on this machine: download it first, or pick one that is downloaded"
    )]
    NotInLibrary(String),
}

impl HubError {
    /// A stable name for the UI and `--json` to branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidRepoId { .. } => ErrorKind::InvalidRepoId,
            Self::InvalidRevision { .. } => ErrorKind::InvalidRevision,
            Self::RepoNotFound { .. } => ErrorKind::RepoNotFound,
            Self::RevisionNotFound { .. } => ErrorKind::RevisionNotFound,
            Self::EntryNotFound { .. } => ErrorKind::EntryNotFound,
            Self::Unauthorized { .. } => ErrorKind::Unauthorized,
            Self::Forbidden { .. } => ErrorKind::Forbidden,
            Self::Unreachable { .. } => ErrorKind::Unreachable,
            Self::NotCachedOffline { .. } => ErrorKind::NotCachedOffline,
            Self::DiskFull { .. } => ErrorKind::DiskFull,
            Self::ChecksumMismatch { .. } => ErrorKind::ChecksumMismatch,
            Self::RateLimited { .. } => ErrorKind::RateLimited,
            Self::ServerError { .. } => ErrorKind::ServerError,
            Self::TokenRefused { .. } => ErrorKind::TokenRefused,
            Self::LinkExpired { .. } => ErrorKind::LinkExpired,
            Self::Interrupted { .. } => ErrorKind::Interrupted,
            Self::Cancelled => ErrorKind::Cancelled,
            Self::Busy { .. } => ErrorKind::Busy,
            Self::NotAModel { .. } => ErrorKind::NotAModel,
            Self::UnsupportedModelType { .. } => ErrorKind::UnsupportedModelType,
            Self::Http { .. } => ErrorKind::Http,
            Self::BadResponse { .. } => ErrorKind::BadResponse,
            Self::Io { .. } => ErrorKind::Io,
            Self::NotInLibrary(_) => ErrorKind::NotInLibrary,
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

    /// The kind each variant has always had (the UI and scripts match on
    /// these). Exhaustive: a new variant does not compile until it has a line
    /// here; give it an example in `one_of_each` too.
    fn kind_name(error: &HubError) -> &'static str {
        match error {
            HubError::InvalidRepoId { .. } => "invalid_repo_id",
            HubError::InvalidRevision { .. } => "invalid_revision",
            HubError::RepoNotFound { .. } => "repo_not_found",
            HubError::RevisionNotFound { .. } => "revision_not_found",
            HubError::EntryNotFound { .. } => "entry_not_found",
            HubError::Unauthorized { .. } => "unauthorized",
            HubError::Forbidden { .. } => "forbidden",
            HubError::Unreachable { .. } => "unreachable",
            HubError::NotCachedOffline { .. } => "not_cached_offline",
            HubError::DiskFull { .. } => "disk_full",
            HubError::ChecksumMismatch { .. } => "checksum_mismatch",
            HubError::RateLimited { .. } => "rate_limited",
            HubError::ServerError { .. } => "server_error",
            HubError::TokenRefused { .. } => "token_refused",
            HubError::LinkExpired { .. } => "link_expired",
            HubError::Interrupted { .. } => "interrupted",
            HubError::Cancelled => "cancelled",
            HubError::Busy { .. } => "busy",
            HubError::NotAModel { .. } => "not_a_model",
            HubError::UnsupportedModelType { .. } => "unsupported_model_type",
            HubError::Http { .. } => "http",
            HubError::BadResponse { .. } => "bad_response",
            HubError::Io { .. } => "io",
            HubError::NotInLibrary(_) => "not_in_library",
        }
    }

    fn one_of_each() -> Vec<HubError> {
        let repo_id = || "mlx-community/Qwen3-0.6B-4bit".to_owned();
        let endpoint = || "https://huggingface.co".to_owned();
        vec![
            HubError::InvalidRepoId {
                repo_id: "qwen".into(),
                reason: "it needs an organisation and a name, like org/name".into(),
            },
            HubError::InvalidRevision {
                revision: "a b".into(),
            },
            HubError::RepoNotFound {
                repo_id: repo_id(),
                endpoint: endpoint(),
            },
            HubError::RevisionNotFound {
                repo_id: repo_id(),
                revision: "v9".into(),
            },
            HubError::EntryNotFound {
                repo_id: repo_id(),
                file: "config.json".into(),
            },
            HubError::Unauthorized {
                repo_id: repo_id(),
                keychain: super::super::config::keychain::hint(),
            },
            HubError::Forbidden { repo_id: repo_id() },
            HubError::Unreachable {
                endpoint: endpoint(),
                detail: "connection refused".into(),
            },
            HubError::NotCachedOffline { model: repo_id() },
            HubError::DiskFull {
                model: repo_id(),
                dir: "/cache/hub".into(),
                needed_bytes: 3 << 30,
                available_bytes: 1 << 30,
            },
            HubError::ChecksumMismatch {
                repo_id: repo_id(),
                file: "model.safetensors".into(),
                algorithm: "sha256",
                expected: "ab12".into(),
                actual: "cd34".into(),
            },
            HubError::RateLimited {
                endpoint: endpoint(),
                attempts: 6,
                asked_wait_seconds: Some(7200),
                max_wait_seconds: 60,
            },
            HubError::ServerError {
                endpoint: endpoint(),
                status: 503,
                attempts: 6,
                asked_wait_seconds: None,
                max_wait_seconds: 60,
            },
            HubError::TokenRefused {
                endpoint: endpoint(),
                token_source: None,
            },
            HubError::LinkExpired {
                file: "model.safetensors".into(),
                status: 403,
                detail: "Request has expired".into(),
            },
            HubError::Interrupted {
                file: "model.safetensors".into(),
                detail: "connection reset".into(),
            },
            HubError::Cancelled,
            HubError::Busy {
                path: "/cache/hub/models--org--name/blobs/ab12.incomplete".into(),
            },
            HubError::NotAModel {
                repo_id: repo_id(),
                reason: "it has no config.json".into(),
            },
            HubError::UnsupportedModelType {
                model: "mlx-community/Mamba-2.8B-4bit".into(),
                unsupported: super::super::architecture::Unsupported {
                    model_type: Some("mamba".into()),
                    layout: None,
                },
            },
            HubError::Http {
                status: 418,
                url: "https://huggingface.co/api/models/org/name".into(),
                body: "I'm a teapot".into(),
            },
            HubError::BadResponse {
                url: "https://huggingface.co/api/models/org/name".into(),
                detail: "not JSON".into(),
            },
            HubError::Io {
                path: "/cache/hub".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            },
            HubError::NotInLibrary(repo_id()),
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        crate::error_kind::check_layer(&one_of_each(), |e| e.kind(), kind_name);
    }

    #[test]
    fn an_unsupported_architecture_names_its_type_and_what_runs() {
        let error = HubError::UnsupportedModelType {
            model: "org/Mamba".into(),
            unsupported: super::super::architecture::Unsupported {
                model_type: Some("mamba".into()),
                layout: None,
            },
        };
        let message = error.to_string();
        assert!(
            message.starts_with(
                "org/Mamba is not supported yet: model_type mamba (Ondo runs: llama, "
            ),
            "{message}"
        );
        assert!(
            message.ends_with("); choose a model of one of those types"),
            "{message}"
        );
    }

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
