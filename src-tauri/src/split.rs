//! A model split over several machines, from the popover: started as the
//! core's `ServedSplit` (Ondo's command as rank 0, a child of the app),
//! its progress and faults for the popover, and the chat's turns with the
//! split model sent to it. One split at a time.

use std::sync::Arc;
use std::time::Duration;

use ondo::engine::CancelToken;
use ondo::engine::chat_template::ChatMessage;
use ondo::run_kinds::RunKind;
use ondo::served_split::{APP_CHAT_AGENT, ServedSplit, SplitAsk, SplitState, SplitStatus};
use ondo::session::chat::{ChatEvent, GenerationSettings};
use ondo::store::{RunQuery, RunRecord};
use tauri::ipc::Channel;

use crate::commands::on_blocking_thread;
use crate::error::CommandError;
use crate::state::AppState;

/// The history's setting that keeps the last split asked for, to offer it
/// again.
const LAST_ASK: &str = "split.last_ask";

/// The split for the popover: the one running (or how the last one
/// ended), and what was last asked for.
#[derive(Debug, Clone, serde::Serialize, specta::Type)]
pub struct SplitView {
    pub status: Option<SplitStatus>,
    pub last_ask: Option<SplitAsk>,
}

fn view(state: &AppState) -> SplitView {
    let last_ask = state
        .pool
        .with_store(|store| store.setting(LAST_ASK).ok().flatten())
        .flatten()
        .and_then(|text| serde_json::from_str(&text).ok());
    SplitView {
        status: state.split().map(|split| split.status()),
        last_ask,
    }
}

/// Starts splitting `ask.model` over `ask.hosts` (this Mac first) and
/// returns at once; `split_status` follows the ranks as they start.
#[tauri::command]
#[specta::specta]
pub fn split_start(
    state: tauri::State<'_, AppState>,
    ask: SplitAsk,
) -> Result<SplitView, CommandError> {
    let mut slot = state.split.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(running) = slot.as_ref() {
        let status = running.status();
        if !matches!(status.state, SplitState::Ended { .. }) {
            return Err(CommandError::InvalidInput(format!(
                "{} is split already: stop that split first (one at a time)",
                status.ask.model
            )));
        }
    }
    let exe = std::env::current_exe().map_err(|e| CommandError::Internal(e.to_string()))?;
    let program = ondo::served_split::ondo_command(&exe).map_err(CommandError::InvalidInput)?;
    let split = ServedSplit::start(ask.clone(), &program, &state.dirs().data_dir)
        .map_err(CommandError::InvalidInput)?;
    *slot = Some(Arc::new(split));
    drop(slot);
    if let Ok(text) = serde_json::to_string(&ask) {
        state
            .pool
            .with_store(|store| store.set_setting(LAST_ASK, &text));
    }
    Ok(view(&state))
}

#[tauri::command]
#[specta::specta]
pub fn split_status(state: tauri::State<'_, AppState>) -> SplitView {
    view(&state)
}

/// Stops the split: the answer in flight finishes, every rank ends and
/// gives its memory back.
#[tauri::command]
#[specta::specta]
pub async fn split_stop(state: tauri::State<'_, AppState>) -> Result<SplitView, CommandError> {
    if let Some(split) = state.split() {
        on_blocking_thread(move || {
            split.stop();
            Ok(())
        })
        .await?;
    }
    Ok(view(&state))
}

/// One chat turn with the split model (`chat_send` hands it here when the
/// split runs the chat's model): streamed from rank 0, stopped by
/// `chat_stop` (the connection closes, which cancels the run), and the
/// record rank 0 wrote in the history returned, filed under the chat's
/// conversation, a stopped turn's as well.
pub async fn chat(
    state: &AppState,
    split: Arc<ServedSplit>,
    cancel: CancelToken,
    turn: ChatTurn,
    on_event: Channel<ChatEvent>,
) -> Result<RunRecord, CommandError> {
    let ChatTurn {
        conversation_id,
        title,
        system_prompt,
        messages,
        settings,
        think,
    } = turn;
    let asked_at = ondo::store::now_rfc3339();
    let answer = split.chat(system_prompt, messages, &settings, think, |event| {
        // A closed window stops hearing; the turn still completes.
        let _ = on_event.send(event);
    });
    let answered = tokio::select! {
        answered = answer => Some(answered),
        () = cancelled(&cancel) => None,
    };
    let run_id = match answered {
        Some(answered) => answered.map_err(|e| CommandError::Split {
            kind: e.kind,
            message: e.message,
        })?,
        // The answer's connection is closed: rank 0 stops at its next step
        // (or prefill chunk) and records the turn, which the chat then
        // shows as it shows a stopped turn of an unsplit model.
        None => stopped_run(state, &asked_at)
            .await
            .ok_or_else(|| CommandError::Split {
                kind: ondo::ErrorKind::Cancelled,
                message: "stopped".into(),
            })?,
    };
    // Rank 0 wrote the record, as an API request, before its last chunk;
    // it is this conversation's turn, and the Runs window lists it so.
    state
        .pool
        .with_store(|store| store.file_under_chat(&run_id, &conversation_id, &title))
        .transpose()?
        .flatten()
        .ok_or_else(|| {
            CommandError::Internal(format!(
                "the split's run {run_id} is not in the history this app reads"
            ))
        })
}

/// One chat turn for a split model, as the chat window sent it.
pub struct ChatTurn {
    pub conversation_id: String,
    /// The conversation's title in the history (its first message, cut).
    pub title: String,
    pub system_prompt: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub settings: GenerationSettings,
    pub think: Option<bool>,
}

/// How long a stopped turn waits for rank 0's record: its ranks stop
/// together at the next decode step or prefill chunk, and a chunk of a
/// large model can take seconds.
const STOPPED_RECORD_WAIT: Duration = Duration::from_secs(15);

/// The id of the run rank 0 recorded for the app's chat turn asked at
/// `asked_at` and stopped since (the newest from the app's client, not yet
/// filed under a chat); None when none arrived in time.
async fn stopped_run(state: &AppState, asked_at: &str) -> Option<String> {
    let query = RunQuery {
        kind: Some(RunKind::Api),
        last: Some(20),
        ..RunQuery::default()
    };
    let until = tokio::time::Instant::now() + STOPPED_RECORD_WAIT;
    while tokio::time::Instant::now() < until {
        let recent = state
            .pool
            .with_store(|store| store.runs(&query))
            .and_then(Result::ok)
            .unwrap_or_default();
        // Record times share one format (UTC, milliseconds), so they
        // compare as text. Any stop reason: an answer that ended just as
        // Stop was pressed is recorded as it ended.
        let stopped = recent.into_iter().rev().find(|run| {
            run.user_agent.as_deref() == Some(APP_CHAT_AGENT) && run.created_at.as_str() >= asked_at
        });
        if let Some(run) = stopped {
            return Some(run.run_id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn cancelled(cancel: &CancelToken) {
    while !cancel.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
