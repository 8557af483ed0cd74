//! How a failed command ends: the error's own message (neutral words the
//! app shows too), then a hint in the terminal's words (commands, flags,
//! environment variables) picked by the error's kind from one table.

use std::fmt;

use crate::ErrorKind;
use crate::api::ApiError;
use crate::bench::BenchError;
use crate::engine::RunError;
use crate::hub::HubError;
use crate::report::ReportError;
use crate::resolve::ResolveError;
use crate::store::StoreError;
use crate::synth::SynthError;

/// Why a command failed: the kind (when the error has one), what happened
/// and what to do, and the model it was about (hints name it).
#[derive(Debug)]
pub struct CliError {
    /// `None` for messages written in the CLI's words already.
    pub kind: Option<ErrorKind>,
    /// What happened and what to do.
    pub message: String,
    /// What the user typed to name the model, when there was one.
    pub model: Option<String>,
}

impl CliError {
    /// An error of `kind` the CLI itself found.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind: Some(kind),
            message: message.into(),
            model: None,
        }
    }

    /// The same error, about `model`.
    pub fn about(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// What to do, in the CLI's words, when the message's neutral advice
    /// has a command or a flag behind it.
    pub fn hint(&self) -> Option<String> {
        hint(self.kind?, self.model.as_deref())
    }

    /// `{"error": {"kind", "message", "hint"}}`: what `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "kind": self.kind,
                "message": self.message,
                "hint": self.hint(),
            }
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The CLI's own words, from commands not yet typed (their messages name
/// flags themselves).
impl From<String> for CliError {
    fn from(message: String) -> Self {
        Self {
            kind: None,
            message,
            model: None,
        }
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        Self::from(message.to_owned())
    }
}

macro_rules! from_layer_error {
    ($($error:ty),+) => {
        $(impl From<$error> for CliError {
            fn from(error: $error) -> Self {
                Self::new(error.kind(), error.to_string())
            }
        })+
    };
}

from_layer_error!(
    ApiError,
    HubError,
    RunError,
    BenchError,
    StoreError,
    SynthError,
    ResolveError
);

impl From<ReportError> for CliError {
    fn from(error: ReportError) -> Self {
        Self::new(ErrorKind::InvalidInput, error.to_string())
    }
}

/// The one table of the CLI's hints: for a kind (and the model the command
/// was about), the command, flag or variable that does what the message
/// says to do. `None` where the message needs nothing more.
pub fn hint(kind: ErrorKind, model: Option<&str>) -> Option<String> {
    let model = model.unwrap_or("MODEL");
    let pull_again = format!("run `ondo pull {model}` again");
    Some(match kind {
        ErrorKind::InvalidRepoId | ErrorKind::RepoNotFound => {
            "`ondo search WORDS` finds MLX models on the hub by name".to_owned()
        }
        ErrorKind::Unauthorized | ErrorKind::Forbidden | ErrorKind::TokenRefused => format!(
            "export HF_TOKEN=hf_... (or run `huggingface-cli login`), then {pull_again}"
        ),
        ErrorKind::RateLimited => format!(
            "wait a minute, then {pull_again}; a token (HF_TOKEN) raises the hub's limit"
        ),
        ErrorKind::ServerError | ErrorKind::LinkExpired | ErrorKind::Interrupted | ErrorKind::ChecksumMismatch => {
            pull_again
        }
        ErrorKind::UnsupportedModelType => {
            "`ondo ls --catalog` lists models Ondo runs; `ondo search WORDS` marks the ones it does not"
                .to_owned()
        }
        ErrorKind::Unreachable => {
            "HF_HUB_OFFLINE=1 keeps Ondo from asking the hub; `ondo ls` lists what is downloaded"
                .to_owned()
        }
        ErrorKind::NotCachedOffline => {
            "`ondo ls` lists the downloaded models; unset HF_HUB_OFFLINE to download".to_owned()
        }
        ErrorKind::DiskFull => format!(
            "`ondo ls` shows what each model takes and `ondo rm ORG/NAME` deletes one; then {pull_again}"
        ),
        ErrorKind::NotInLibrary | ErrorKind::ModelNotFound => format!(
            "`ondo pull {model}` downloads it; `ondo ls` lists the models here, and `tiny` is always there"
        ),
        ErrorKind::NotAModelName => {
            "name a downloaded repo id (ORG/NAME), a model folder, or tiny; `ondo ls` lists them"
                .to_owned()
        }
        ErrorKind::Load => format!(
            "a model from the hub is fetched again with `ondo pull {model}`; `ondo synth tiny DIR` writes a test model folder"
        ),
        ErrorKind::PromptTooLong => {
            "pass --max-kv-size N to keep the start and the latest N tokens".to_owned()
        }
        ErrorKind::Mlx => {
            "`ondo fit MODEL --context N` says what fits; --max-kv-size N bounds the KV cache"
                .to_owned()
        }
        ErrorKind::Peer => {
            "pass --python PATH (or set ONDO_PYTHON) to a Python with mlx-lm; `make setup` installs one"
                .to_owned()
        }
        ErrorKind::EndpointUnreachable => {
            "start the server first (for example `python -m mlx_lm.server --model DIR --port 8080`), \
             then --endpoint http://127.0.0.1:8080#MODEL"
                .to_owned()
        }
        ErrorKind::EndpointRefused => {
            "pass the server's key with --api-key KEY, or in the URL: --endpoint http://:KEY@HOST:PORT#MODEL"
                .to_owned()
        }
        ErrorKind::EndpointModelNotFound => {
            "name the model after '#': --endpoint URL#MODEL (`ollama list`, or GET /v1/models, shows a server's)"
                .to_owned()
        }
        ErrorKind::HistoryUnwritable | ErrorKind::HistoryCorrupt | ErrorKind::HistoryTooNew => {
            "set ONDO_HOME to another folder to keep a separate history there".to_owned()
        }
        ErrorKind::FolderNotEmpty => "pass --force to replace what is there".to_owned(),
        ErrorKind::MetalKernelsUnavailable => {
            "in a checkout, `scripts/setup.sh mac` unpacks MLX's wheel (libmlx.dylib beside \
             mlx.metallib) and `make dmg` builds an app that carries both"
                .to_owned()
        }
        ErrorKind::Distributed => {
            "start every rank with the same Ondo and model snapshot; `mlx.launch --hostfile \
             hosts.json --backend ring -- ondo doctor --distributed` checks the ranks and their links"
                .to_owned()
        }
        ErrorKind::ApiKeyRequired => {
            "pass --api-key KEY (or set ONDO_API_KEY), or leave --host at 127.0.0.1".to_owned()
        }
        ErrorKind::AddressUnavailable => {
            "pick another --port (0 lets the system choose one)".to_owned()
        }
        ErrorKind::InvalidInput
        | ErrorKind::ModelUnavailable
        | ErrorKind::Internal
        | ErrorKind::InvalidRevision
        | ErrorKind::RevisionNotFound
        | ErrorKind::EntryNotFound
        | ErrorKind::Cancelled
        | ErrorKind::Busy
        | ErrorKind::NotAModel
        | ErrorKind::Http
        | ErrorKind::BadResponse
        | ErrorKind::Io
        | ErrorKind::EmptyPrompt
        | ErrorKind::ChatTemplate
        | ErrorKind::Tokenizer
        | ErrorKind::InvalidSettings
        | ErrorKind::EngineStopped
        | ErrorKind::History
        | ErrorKind::HistoryBusy
        | ErrorKind::MetalUnavailable
        | ErrorKind::EndpointFailed
        | ErrorKind::ApiKeyRefused
        | ErrorKind::HostRefused
        | ErrorKind::OriginRefused
        | ErrorKind::BodyTooLarge
        | ErrorKind::NoSuchRoute
        | ErrorKind::QueueFull
        | ErrorKind::QueueTimeout => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_model_the_command_was_about() {
        let error = CliError::new(ErrorKind::Interrupted, "the download kept failing")
            .about("mlx-community/Qwen3-0.6B-4bit");
        assert_eq!(
            error.hint().as_deref(),
            Some("run `ondo pull mlx-community/Qwen3-0.6B-4bit` again")
        );
    }

    #[test]
    fn messages_without_a_kind_have_no_hint() {
        let error = CliError::from("--max-tokens must be at least 1".to_owned());
        assert_eq!(error.hint(), None);
        assert_eq!(error.to_json()["error"]["kind"], serde_json::Value::Null);
    }

    #[test]
    fn a_layer_error_keeps_its_kind_and_message() {
        let error = CliError::from(HubError::Cancelled);
        assert_eq!(error.kind, Some(ErrorKind::Cancelled));
        assert_eq!(error.message, HubError::Cancelled.to_string());
        let json = error.to_json();
        assert_eq!(json["error"]["kind"], "cancelled");
        assert_eq!(json["error"]["hint"], serde_json::Value::Null);
    }
}
