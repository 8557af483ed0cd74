//! Every kind of error Ondo reports, by one stable snake_case name: what the
//! app branches on (it arrives in TypeScript as a union of these names, so a
//! kind without a headline there is a type error), what the CLI picks its
//! hint by, and what `--json` prints. Each layer's error enum maps its
//! variants to these in its `kind()`; the names never change, since the
//! UI and scripts depend on them.

use std::fmt;

/// Declares `ErrorKind` with each variant's wire name written once: the
/// serde name (and so the TypeScript literal), `as_str` and `ALL` all come
/// from the same line.
macro_rules! error_kinds {
    ($($(#[doc = $doc:literal])+ $variant:ident => $name:literal,)+) => {
        /// Why something failed, as a stable snake_case name: what the app
        /// branches on, what the CLI picks its hint by, what `--json` prints.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "specta", derive(specta::Type))]
        pub enum ErrorKind {
            $($(#[doc = $doc])+ #[serde(rename = $name)] $variant,)+
        }

        impl ErrorKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$variant,)+];

            /// The stable name: `repo_not_found`, `disk_full`, ...
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorKind::$variant => $name,)+
                }
            }
        }
    };
}

error_kinds! {
    // The shell's own.
    /// Arguments the command cannot use (a bad setting, an empty prompt, a
    /// second benchmark while one runs).
    InvalidInput => "invalid_input",
    /// The built-in tiny model could not be written or found.
    ModelUnavailable => "model_unavailable",
    /// Something inside Ondo broke (a panic, a thread that died): a bug.
    Internal => "internal",

    // Naming a model.
    /// A model name that is neither downloaded, a folder nor `tiny`.
    ModelNotFound => "model_not_found",
    /// Text that cannot name a model at all (empty, or not a path, repo id or `tiny`).
    NotAModelName => "not_a_model_name",

    // The hub and downloads.
    /// Not an `org/name` repo id.
    InvalidRepoId => "invalid_repo_id",
    /// Not a branch, tag or commit the hub accepts.
    InvalidRevision => "invalid_revision",
    /// The hub has no such repo (or it is private and no token was sent).
    RepoNotFound => "repo_not_found",
    /// The repo has no such branch, tag or commit.
    RevisionNotFound => "revision_not_found",
    /// The repo has no such file.
    EntryNotFound => "entry_not_found",
    /// The repo is gated or private and no token was sent.
    Unauthorized => "unauthorized",
    /// The token was sent but has not been granted access to the repo.
    Forbidden => "forbidden",
    /// The hub rejected the token itself (expired, revoked, mistyped).
    TokenRefused => "token_refused",
    /// The hub asked Ondo to slow down.
    RateLimited => "rate_limited",
    /// The hub failed on its side (a 5xx answer).
    ServerError => "server_error",
    /// The storage server kept refusing a download link, fresh ones too.
    LinkExpired => "link_expired",
    /// The hub could not be reached at all.
    Unreachable => "unreachable",
    /// Offline mode is on and the model is not downloaded.
    NotCachedOffline => "not_cached_offline",
    /// The disk is full (downloads, or the run history).
    DiskFull => "disk_full",
    /// A downloaded file's sha256 did not match the hub's; it was deleted.
    ChecksumMismatch => "checksum_mismatch",
    /// The connection kept dropping; what arrived is kept.
    Interrupted => "interrupted",
    /// Stopped by the user (a download, a benchmark).
    Cancelled => "cancelled",
    /// Another process is downloading the same file right now.
    Busy => "busy",
    /// The repo is not a model Ondo can run.
    NotAModel => "not_a_model",
    /// The model's architecture (`model_type`) is one the engine does not
    /// run yet; said before anything is downloaded.
    UnsupportedModelType => "unsupported_model_type",
    /// The hub answered with an HTTP status Ondo has no better name for.
    Http => "http",
    /// The hub's answer could not be read.
    BadResponse => "bad_response",
    /// A file or folder could not be read or written.
    Io => "io",
    /// The model is not among the downloaded ones or added folders.
    NotInLibrary => "not_in_library",

    // The engine.
    /// The model folder could not be loaded (missing or damaged files, an
    /// unsupported architecture or quantization).
    Load => "load",
    /// Nothing to answer.
    EmptyPrompt => "empty_prompt",
    /// The prompt is longer than the model reads.
    PromptTooLong => "prompt_too_long",
    /// The model's chat template failed or refused the conversation.
    ChatTemplate => "chat_template",
    /// The tokenizer failed.
    Tokenizer => "tokenizer",
    /// Generation settings out of range.
    InvalidSettings => "invalid_settings",
    /// MLX failed while generating (often: out of memory).
    Mlx => "mlx",
    /// The engine thread is gone.
    EngineStopped => "engine_stopped",

    // Benchmarks.
    /// The mlx-lm side of a comparison could not run.
    Peer => "peer",
    /// A server to benchmark could not be reached at its URL.
    EndpointUnreachable => "endpoint_unreachable",
    /// A server to benchmark asked for an API key, or refused the one sent.
    EndpointRefused => "endpoint_refused",
    /// A server to benchmark does not serve the model named (or several,
    /// and none was named).
    EndpointModelNotFound => "endpoint_model_not_found",
    /// A server to benchmark failed a request or sent what could not be read.
    EndpointFailed => "endpoint_failed",

    // The run history.
    /// The run history failed in a way Ondo has no better name for.
    History => "history",
    /// The run history's file or folder cannot be created or written.
    HistoryUnwritable => "history_unwritable",
    /// The run history's file is damaged or not a database.
    HistoryCorrupt => "history_corrupt",
    /// The run history was written by a newer Ondo.
    HistoryTooNew => "history_too_new",
    /// Another Ondo process kept the run history locked.
    HistoryBusy => "history_busy",

    // The local server.
    /// The server would listen beyond this machine without an API key.
    ApiKeyRequired => "api_key_required",
    /// The server's address could not be taken (in use, or not this machine's).
    AddressUnavailable => "address_unavailable",
    /// A request came without the server's API key, or with another.
    ApiKeyRefused => "api_key_refused",
    /// A request named a host other than this machine (a web page reaching
    /// the server through DNS rebinding).
    HostRefused => "host_refused",
    /// A web page from an origin the server does not allow.
    OriginRefused => "origin_refused",
    /// A request body over the server's limit.
    BodyTooLarge => "body_too_large",
    /// No route at that path (or not for that method).
    NoSuchRoute => "no_such_route",
    /// Too many requests wait for the engine already.
    QueueFull => "queue_full",
    /// A request waited for the engine longer than the server's limit.
    QueueTimeout => "queue_timeout",

    // Synthetic models.
    /// The folder to write a model into already holds files.
    FolderNotEmpty => "folder_not_empty",

    // MLX on a Mac.
    /// MLX found no Metal GPU (a virtual machine, a session without the GPU).
    MetalUnavailable => "metal_unavailable",
    /// MLX's Metal kernels (mlx.metallib) are missing or would not load.
    MetalKernelsUnavailable => "metal_kernels_unavailable",

    // Several machines.
    /// A rank of a run split across processes or machines could not join the
    /// others, differs from them, or was lost.
    Distributed => "distributed",
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lets tests and callers compare with the stable name directly.
impl PartialEq<&str> for ErrorKind {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl PartialEq<str> for ErrorKind {
    fn eq(&self, name: &str) -> bool {
        self.as_str() == name
    }
}

/// What makes a message wrong for the app, if anything: a command of the
/// CLI (`ondo pull`), a flag (`--max-kv-size`), or a source location that
/// MLX or Rust appended (`io.cpp:76`, `/rustc/...`). Core messages say what
/// to do in neutral words; the CLI adds its own hints after them. The
/// tests of each error layer check every variant with this.
pub fn out_of_place_in_the_app(message: &str) -> Option<&'static str> {
    let flag = message.char_indices().any(|(at, c)| {
        c == '-'
            && message[at..].starts_with("--")
            && message[at + 2..].starts_with(|next: char| next.is_ascii_lowercase())
            && message[..at]
                .chars()
                .next_back()
                .is_none_or(|before| before.is_whitespace() || "(`'\"".contains(before))
    });
    if flag {
        return Some("a command-line flag");
    }
    if message.contains("ondo ") || message.contains("`ondo") {
        return Some("an ondo command");
    }
    if message.contains("/rustc/") || message.contains(".rs:") {
        return Some("a Rust source location");
    }
    if [".cpp:", ".c:", ".h:", ".mm:", ".metal:"]
        .iter()
        .any(|extension| message.contains(extension))
    {
        return Some("an MLX source location");
    }
    None
}

/// The check every error layer's tests run on one example of each of its
/// variants: each keeps its stable kind name
/// (`expected`, written out by hand in the layer's test), and each message
/// speaks to the app and the CLI alike.
#[cfg(test)]
pub(crate) fn check_layer<E: fmt::Display + fmt::Debug>(
    examples: &[E],
    kind: impl Fn(&E) -> ErrorKind,
    expected: impl Fn(&E) -> &'static str,
) {
    for error in examples {
        assert_eq!(kind(error).as_str(), expected(error), "{error:?}");
        assert_eq!(serde_json::to_value(kind(error)).unwrap(), expected(error));
        let message = error.to_string();
        assert_eq!(out_of_place_in_the_app(&message), None, "{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn each_kind_serializes_as_its_name() {
        for &kind in ErrorKind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::Value::String(kind.as_str().into()));
            let back: ErrorKind = serde_json::from_value(json).unwrap();
            assert_eq!(back, kind);
        }
    }

    #[test]
    fn cli_words_and_source_locations_are_out_of_place_in_the_app() {
        for message in [
            "run `ondo pull org/name` again",
            "set a rotating cache (--max-kv-size 4096)",
            "--bits 3 is not supported",
            "failed at /Users/x/mlx/c/io.cpp:76",
            "panicked at /rustc/1234abcd/library/core/src/option.rs:21:5",
            "at src/engine/load.rs:12:9",
        ] {
            assert!(out_of_place_in_the_app(message).is_some(), "{message}");
        }
        for message in [
            "the download is incomplete: download it again",
            "/cache/models--mlx-community--Qwen3-0.6B-4bit/blobs is full",
            "another Ondo is downloading it",
            "the shortcut CommandOrControl+Shift+O is taken",
        ] {
            assert_eq!(out_of_place_in_the_app(message), None, "{message}");
        }
    }

    #[test]
    fn names_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for &kind in ErrorKind::ALL {
            let name = kind.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name} is not snake_case"
            );
        }
    }
}
