//! The chat commands: one turn streamed over a channel, stopped on request,
//! recorded in the history; the conversation's KV cache stays warm between
//! turns (the pool's policy decides how long).

use ondo::engine::chat_template::ChatMessage;
use ondo::engine::{CancelToken, Prompt};
use ondo::run_kinds::RunKind;
use ondo::session::chat::{ChatEvent, ChatFeatures, GenerationSettings};
use ondo::session::record::RunContext;
use ondo::store::RunRecord;
use tauri::ipc::Channel;

use crate::commands::on_blocking_thread;
use crate::error::CommandError;
use crate::state::AppState;

/// Answers the last user message of `messages` with `model` ("tiny", a
/// folder, or a repo id in the cache), streaming the text to `on_event`;
/// returns the run's record (the footer's numbers). `think` is the chat's
/// Think switch where the model has one (`chat_features`): whether it
/// reasons before answering; `None` leaves that to the template.
#[tauri::command]
#[specta::specta]
#[allow(clippy::too_many_arguments)] // the command's arguments are the UI's form
pub async fn chat_send<R: tauri::Runtime>(
    app: tauri::AppHandle<R>,
    state: tauri::State<'_, AppState>,
    model: String,
    conversation_id: String,
    system_prompt: Option<String>,
    messages: Vec<ChatMessage>,
    settings: GenerationSettings,
    think: Option<bool>,
    on_event: Channel<ChatEvent>,
) -> Result<RunRecord, CommandError> {
    settings.check().map_err(CommandError::InvalidInput)?;
    if messages
        .last()
        .is_none_or(|m| m.role != "user" || m.content.trim().is_empty())
    {
        return Err(CommandError::InvalidInput(
            "the conversation must end with a message from you".into(),
        ));
    }
    let title = messages
        .iter()
        .find(|m| m.role == "user")
        .map(|m| m.content.chars().take(60).collect::<String>());
    // A model split over several machines answers through its rank 0.
    if let Some(split) = state.split_running(&model) {
        let cancel = stoppable(&state, &conversation_id);
        let turn = crate::split::ChatTurn {
            conversation_id: conversation_id.clone(),
            title: title.unwrap_or_default(),
            system_prompt,
            messages,
            settings,
            think,
        };
        let result = crate::split::chat(&state, split, cancel, turn, on_event).await;
        return finished(&app, &state, &conversation_id, result);
    }
    let model = crate::models::resolve(&state, &model).await?;
    let cancel = stoppable(&state, &conversation_id);
    let mut prompt = Prompt::chat(system_prompt, messages);
    if let Some(think) = think {
        prompt = prompt.with_thinking(think);
    }
    let request = settings.turn_request(&model.dir, &conversation_id, prompt);
    let context = RunContext {
        conversation_id: Some(conversation_id.clone()),
        conversation_title: title,
        ..model.run_context(RunKind::Chat)
    };
    let pool = state.pool.clone();
    let result = on_blocking_thread(move || {
        let (_, record) = pool.run(request, context, cancel, |event| {
            if let Some(event) = ChatEvent::from_run_event(event) {
                // A closed window stops hearing; the turn still completes.
                let _ = on_event.send(event);
            }
        })?;
        Ok(record)
    })
    .await;
    finished(&app, &state, &conversation_id, result)
}

/// A stop for the answer being written in `conversation_id` (`chat_stop`).
fn stoppable(state: &AppState, conversation_id: &str) -> CancelToken {
    let cancel = CancelToken::new();
    state
        .chats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(conversation_id.to_owned(), cancel.clone());
    cancel
}

/// The turn's end: nothing left to stop, and a recorded run announced.
fn finished<R: tauri::Runtime>(
    app: &tauri::AppHandle<R>,
    state: &AppState,
    conversation_id: &str,
    result: Result<RunRecord, CommandError>,
) -> Result<RunRecord, CommandError> {
    state
        .chats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(conversation_id);
    if let Ok(record) = &result {
        crate::events::runs_changed(app, &record.run_id);
    }
    result
}

/// What the chat offers for `model`: a Think switch where its chat template
/// reads `enable_thinking`.
#[tauri::command]
#[specta::specta]
pub async fn chat_features(
    state: tauri::State<'_, AppState>,
    model: String,
) -> Result<ChatFeatures, CommandError> {
    // The built-in tiny model's template takes no options, and resolving it
    // here would write it before anyone chats with it.
    if model.trim().eq_ignore_ascii_case(ondo::resolve::TINY) {
        return Ok(ChatFeatures::default());
    }
    let model = crate::models::resolve(&state, &model).await?;
    on_blocking_thread(move || Ok(ChatFeatures::of_model_dir(&model.dir))).await
}

/// Stops the answer being written in a conversation; true if one was.
#[tauri::command]
#[specta::specta]
pub fn chat_stop(state: tauri::State<'_, AppState>, conversation_id: String) -> bool {
    match state
        .chats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&conversation_id)
    {
        Some(cancel) => {
            cancel.cancel();
            true
        }
        None => false,
    }
}

/// Lets a conversation's KV cache go (New conversation).
#[tauri::command]
#[specta::specta]
pub fn chat_forget(
    state: tauri::State<'_, AppState>,
    conversation_id: String,
) -> Result<(), CommandError> {
    Ok(state.pool.forget_conversation(&conversation_id)?)
}
