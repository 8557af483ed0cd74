//! The one error type every command returns; the UI receives it as
//! `{ kind, message }` and branches on `kind`.

use serde::ser::SerializeStruct;

use ondo::ErrorKind;
use ondo::resolve::ResolveError;
use ondo::store::StoreError;
use ondo::synth::SynthError;

/// Why a command failed. `message` (the `Display` text) says what happened and
/// what to do; `kind` is stable for the UI to match on.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The UI sent arguments the command cannot use.
    #[error("{0}")]
    InvalidInput(String),
    /// The built-in tiny model could not be written or found (the UI's
    /// headline says so; the message is the core's).
    #[error("{0}")]
    ModelUnavailable(#[from] SynthError),
    /// A model name led nowhere; `kind` is the resolver's
    /// (`model_not_found`, `not_a_model_name`, `model_unavailable`).
    #[error("{0}")]
    Model(#[from] ResolveError),
    /// Finding, sizing or downloading a model failed; `kind` is the hub's own
    /// (`repo_not_found`, `unauthorized`, `disk_full`, ...).
    #[error("{0}")]
    Hub(#[from] ondo::hub::HubError),
    /// The engine refused or failed the request (bad prompt, model that does
    /// not load, ...); `kind` is the engine's own.
    #[error("{0}")]
    Run(#[from] ondo::engine::RunError),
    /// A benchmark could not run or was stopped; `kind` is the bench's own
    /// (`cancelled`, `invalid_input`, or the engine's).
    #[error("{0}")]
    Bench(#[from] ondo::bench::BenchError),
    /// The run history could not be read or written; `kind` is the
    /// store's own (`history_corrupt`, `history_busy`, `disk_full`, ...).
    #[error("{0}")]
    History(#[from] StoreError),
    /// MLX cannot use this Mac's GPU (`metal_unavailable`,
    /// `metal_kernels_unavailable`), as the start-up check found.
    #[error("{0}")]
    Metal(#[from] ondo::metallib::MetalError),
    /// The local server could not start (`address_unavailable`: the port
    /// is taken), or the settings it was given cannot be served.
    #[error("{0}")]
    Server(#[from] ondo::api::ApiError),
    /// A model split over several machines did not answer or could not
    /// start; `kind` is the split's (`distributed`, `busy`, `cancelled`).
    #[error("{message}")]
    Split { kind: ErrorKind, message: String },
    /// The background task that did the work died (a panic in the core).
    #[error("Ondo hit an internal error ({0}); please report it with the steps that led here")]
    Internal(String),
}

impl CommandError {
    /// What the UI branches on: the shell's own kind, or the core's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidInput(_) => ErrorKind::InvalidInput,
            Self::ModelUnavailable(_) => ErrorKind::ModelUnavailable,
            Self::Model(error) => error.kind(),
            Self::Hub(error) => error.kind(),
            Self::History(error) => error.kind(),
            Self::Run(error) => error.kind(),
            Self::Bench(error) => error.kind(),
            Self::Metal(error) => error.kind(),
            Self::Server(error) => error.kind(),
            Self::Split { kind, .. } => *kind,
            Self::Internal(_) => ErrorKind::Internal,
        }
    }
}

impl serde::Serialize for CommandError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("CommandError", 2)?;
        fields.serialize_field("kind", &self.kind())?;
        fields.serialize_field("message", &self.to_string())?;
        fields.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_kind_and_message() {
        let error = CommandError::InvalidInput("max_tokens must be between 1 and 512".into());
        let json = serde_json::to_value(&error).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "kind": "invalid_input",
                "message": "max_tokens must be between 1 and 512",
            })
        );
    }

    /// The kind of each variant as the UI has always received it (the
    /// core's errors keep their own). Exhaustive: a new variant does not
    /// compile until it has a line here; give it an example in
    /// `one_of_each` too.
    fn kind_name(error: &CommandError) -> &'static str {
        match error {
            CommandError::InvalidInput(_) => "invalid_input",
            CommandError::ModelUnavailable(_) => "model_unavailable",
            CommandError::Model(_) => "model_not_found",
            CommandError::Hub(_) => "disk_full",
            CommandError::Run(_) => "prompt_too_long",
            CommandError::Bench(_) => "cancelled",
            CommandError::History(_) => "history_too_new",
            CommandError::Metal(_) => "metal_kernels_unavailable",
            CommandError::Server(_) => "address_unavailable",
            CommandError::Split { .. } => "distributed",
            CommandError::Internal(_) => "internal",
        }
    }

    fn one_of_each() -> Vec<CommandError> {
        vec![
            CommandError::InvalidInput("max_tokens must be between 1 and 512".into()),
            CommandError::ModelUnavailable(SynthError::TargetNotEmpty {
                dir: "/data/models/tiny".into(),
            }),
            CommandError::Model(ondo::resolve::ResolveError::NotFound {
                name: "acme/missing".into(),
                looked_in: "/cache/hub".into(),
                available: vec!["tiny".into()],
            }),
            CommandError::Hub(ondo::hub::HubError::DiskFull {
                model: "mlx-community/Qwen3-0.6B-4bit".into(),
                dir: "/cache/hub".into(),
                needed_bytes: 3 << 30,
                available_bytes: 1 << 30,
            }),
            CommandError::Run(ondo::engine::RunError::PromptTooLong(
                "the prompt has 9000 tokens but /models/tiny reads at most 8192; shorten it, \
                 or bound the KV cache to 8192 tokens"
                    .into(),
            )),
            CommandError::Bench(ondo::bench::BenchError::Cancelled { done: 2, total: 8 }),
            CommandError::History(StoreError::TooNew {
                path: "/data/ondo.sqlite3".into(),
                found: 9,
                known: 4,
            }),
            CommandError::Metal(ondo::metallib::MetalError::KernelsMissing {
                looked_in: vec![
                    "/Applications/Ondo.app/Contents/Resources/mlx.metallib".into(),
                    "/Applications/Ondo.app/Contents/Frameworks/mlx.metallib".into(),
                ],
            }),
            CommandError::Server(ondo::api::ApiError::AddressUnavailable {
                address: "127.0.0.1:11480".into(),
                message: "Address already in use (os error 98)".into(),
            }),
            CommandError::Split {
                kind: ErrorKind::Distributed,
                message: "the split model cannot answer: rank 1 (studio-2) stopped; stop the \
                          split and start it again"
                    .into(),
            },
            CommandError::Internal("task panicked".into()),
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind() {
        for error in one_of_each() {
            let json = serde_json::to_value(&error).unwrap();
            assert_eq!(json["kind"], kind_name(&error), "{error:?}");
        }
    }

    #[test]
    fn no_message_names_a_cli_flag_or_a_source_file() {
        for error in one_of_each() {
            let message = error.to_string();
            assert_eq!(
                ondo::error_kind::out_of_place_in_the_app(&message),
                None,
                "{message}"
            );
        }
    }

    #[test]
    fn internal_errors_tell_the_user_what_to_do() {
        let json = serde_json::to_value(CommandError::Internal("task panicked".into())).unwrap();
        assert_eq!(json["kind"], "internal");
        let message = json["message"].as_str().unwrap();
        assert!(message.contains("task panicked"), "{message}");
        assert!(message.contains("report"), "{message}");
    }
}

/// What a failed command sends, as the generated bindings describe it (the
/// `Serialize` impl above writes exactly these two fields).
#[derive(serde::Serialize, specta::Type)]
#[serde(rename = "CommandError")]
#[allow(dead_code)] // only its shape is used
struct CommandErrorShape {
    /// Stable, snake_case: `invalid_input`, `repo_not_found`, `cancelled`, ...
    kind: ErrorKind,
    /// What happened and what to do.
    message: String,
}

impl specta::Type for CommandError {
    fn definition(types: &mut specta::Types) -> specta::datatype::DataType {
        CommandErrorShape::definition(types)
    }
}
