//! The commands the UI invokes. Each one checks its input, calls the core on a
//! blocking thread (the core's work is synchronous file and MLX work that must
//! not stall the event loop), and returns data or a `CommandError`. Everything
//! that touches MLX goes through the session pool, the one way into the
//! engine thread (MLX is not thread-safe).

use std::path::PathBuf;

use ondo::demo::{self, DemoRun};
use ondo::doctor::DoctorReport;
use ondo::resolve::{NamedBy, TINY, resolve_model};
use ondo::run_kinds::LoopShape;

use crate::error::CommandError;
use crate::state::AppState;

type State<'a> = tauri::State<'a, AppState>;

/// The most tokens one test generation may ask for: enough to measure decode,
/// few enough to finish quickly on a CPU.
pub const MAX_TEST_TOKENS: usize = 256;

/// The longest prompt a test generation accepts, in characters.
pub const MAX_TEST_PROMPT_CHARS: usize = 4000;

pub(crate) async fn on_blocking_thread<T, F>(work: F) -> Result<T, CommandError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, CommandError> + Send + 'static,
{
    tauri::async_runtime::spawn_blocking(work)
        .await
        .map_err(|join_error| CommandError::Internal(join_error.to_string()))?
}

/// Which model a test generation runs. Downloaded models join when the core
/// has a local library to resolve them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, specta::Type)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelChoice {
    /// The random-weight model Ondo writes itself: for speed tests only.
    BuiltinTiny,
}

/// The built-in tiny model, once written.
#[derive(Debug, Clone, serde::Serialize, specta::Type)]
pub struct PreparedModel {
    pub model_dir: PathBuf,
}

/// Versions, backend, device, memory and MLX self-tests.
#[tauri::command]
#[specta::specta]
pub async fn doctor_report(state: State<'_>) -> Result<DoctorReport, CommandError> {
    let pool = state.pool.clone();
    on_blocking_thread(move || Ok(pool.call(DoctorReport::collect)?)).await
}

/// What the start-up check found: fails with `metal_unavailable` or
/// `metal_kernels_unavailable` (what is missing and where it was looked
/// for) when MLX cannot use this Mac's GPU; succeeds elsewhere.
#[tauri::command]
#[specta::specta]
pub fn startup_check(state: State<'_>) -> Result<(), CommandError> {
    match &state.mlx_problem {
        Some(problem) => Err(CommandError::Metal(problem.clone())),
        None => Ok(()),
    }
}

/// Writes the built-in tiny model if it is not there yet.
#[tauri::command]
#[specta::specta]
pub async fn prepare_builtin_model(state: State<'_>) -> Result<PreparedModel, CommandError> {
    let pool = state.pool.clone();
    on_blocking_thread(move || {
        let model = resolve_model(&pool, TINY, NamedBy::Local)?;
        Ok(PreparedModel {
            model_dir: model.dir,
        })
    })
    .await
}

/// Generates once with the chosen model through the session pool (loading
/// it cold the first time, warm after), records it, and returns the timings.
#[tauri::command]
#[specta::specta]
pub async fn run_test_generation<R: tauri::Runtime>(
    handle: tauri::AppHandle<R>,
    state: State<'_>,
    model: ModelChoice,
    prompt: String,
    max_tokens: usize,
) -> Result<DemoRun, CommandError> {
    check_test_request(&prompt, max_tokens)?;
    let name = match model {
        ModelChoice::BuiltinTiny => TINY,
    };
    let pool = state.pool.clone();
    let run = on_blocking_thread(move || {
        let model = resolve_model(&pool, name, NamedBy::Local)?;
        Ok(demo::run_demo(
            &pool,
            &model,
            &prompt,
            max_tokens,
            LoopShape::default(),
        )?)
    })
    .await?;
    crate::events::runs_changed(&handle, "test");
    Ok(run)
}

/// Rejects prompts and token limits a test generation cannot use.
fn check_test_request(prompt: &str, max_tokens: usize) -> Result<(), CommandError> {
    if prompt.trim().is_empty() {
        return Err(CommandError::InvalidInput(
            "The prompt is empty; type a few words to generate from".into(),
        ));
    }
    let prompt_chars = prompt.chars().count();
    if prompt_chars > MAX_TEST_PROMPT_CHARS {
        return Err(CommandError::InvalidInput(format!(
            "The prompt has {prompt_chars} characters; a test generation takes at most \
             {MAX_TEST_PROMPT_CHARS}"
        )));
    }
    if !(1..=MAX_TEST_TOKENS).contains(&max_tokens) {
        return Err(CommandError::InvalidInput(format!(
            "max_tokens is {max_tokens}; choose between 1 and {MAX_TEST_TOKENS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_an_ordinary_request() {
        assert!(check_test_request("Why is the sky blue?", 32).is_ok());
    }

    #[test]
    fn rejects_an_empty_prompt() {
        let error = check_test_request("  \n", 32).unwrap_err();
        assert_eq!(error.kind(), "invalid_input");
    }

    #[test]
    fn rejects_token_limits_outside_the_range() {
        assert!(check_test_request("hi", 0).is_err());
        assert!(check_test_request("hi", MAX_TEST_TOKENS + 1).is_err());
        assert!(check_test_request("hi", MAX_TEST_TOKENS).is_ok());
    }

    #[test]
    fn rejects_an_overlong_prompt() {
        let prompt = "x".repeat(MAX_TEST_PROMPT_CHARS + 1);
        let error = check_test_request(&prompt, 8).unwrap_err();
        assert!(error.to_string().contains("at most"), "{error}");
    }

    #[test]
    fn model_choice_reads_the_tagged_form_the_ui_sends() {
        let choice: ModelChoice = serde_json::from_str(r#"{ "kind": "builtin_tiny" }"#).unwrap();
        assert_eq!(choice, ModelChoice::BuiltinTiny);
    }
}
