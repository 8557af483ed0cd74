//! The one error type every command returns; the UI receives it as
//! `{ kind, message }` and branches on `kind`.

use serde::ser::SerializeStruct;

use ondo::resolve::ResolveError;
use ondo::synth::SynthError;

/// Why a command failed. `message` (the `Display` text) says what happened and
/// what to do; `kind` is stable for the UI to match on.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The UI sent arguments the command cannot use.
    #[error("{0}")]
    InvalidInput(String),
    /// The built-in tiny model could not be written or found.
    #[error("Could not prepare the built-in tiny model: {0}")]
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
    /// The run history could not be read or written.
    #[error("The run history: {0}")]
    History(String),
    /// The background task that did the work died (a panic in the core).
    #[error("Ondo hit an internal error ({0}); please report it with the steps that led here")]
    Internal(String),
}

impl CommandError {
    /// The machine-readable name of the variant, in snake_case.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidInput(_) => "invalid_input",
            Self::ModelUnavailable(_) => "model_unavailable",
            Self::Model(error) => error.kind(),
            Self::Hub(error) => error.kind(),
            Self::History(_) => "history",
            Self::Run(error) => error.kind(),
            Self::Bench(error) => error.kind(),
            Self::Internal(_) => "internal",
        }
    }
}

impl serde::Serialize for CommandError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("CommandError", 2)?;
        fields.serialize_field("kind", self.kind())?;
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
    kind: String,
    /// What happened and what to do.
    message: String,
}

impl specta::Type for CommandError {
    fn definition(types: &mut specta::Types) -> specta::datatype::DataType {
        CommandErrorShape::definition(types)
    }
}
