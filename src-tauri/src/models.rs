//! The commands of the Models and Runs screens: the library with the catalog
//! and fit verdicts, downloads streamed over a channel (cancellable), deleting,
//! the run history, reports, and the memory gauge. Each calls the core.

use std::path::PathBuf;

use ondo::hub::library::{self, LibraryModel};
use ondo::hub::sizing::{self, CatalogOffer, MachineMemory};
use ondo::hub::{
    DownloadCancel, DownloadEvent, DownloadOptions, DownloadSummary, ModelRef, OnCancel,
};
use ondo::session::PooledModel;
use ondo::store::{MemorySample, PoolEvent};
use tauri::ipc::Channel;
use tauri::{AppHandle, Runtime};

use crate::error::CommandError;
use crate::state::AppState;

/// What the Models screen shows.
#[derive(Debug, Clone, serde::Serialize, specta::Type)]
pub struct ModelsView {
    pub library: Vec<LibraryModel>,
    pub catalog: Vec<CatalogOffer>,
    pub default_model: &'static str,
    pub hf_cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE` is on: downloads are refused.
    pub offline: bool,
}

/// The warm pool as the gauge's tooltip and the Models screen show it.
#[derive(Debug, Clone, serde::Serialize, specta::Type)]
pub struct PoolStatus {
    pub resident: Vec<PooledModel>,
    pub events: Vec<PoolEvent>,
}

type State<'a> = tauri::State<'a, AppState>;

/// The library, and the catalog with a verdict for this machine.
#[tauri::command]
#[specta::specta]
pub async fn list_models(state: State<'_>) -> Result<ModelsView, CommandError> {
    let dirs = state.dirs();
    let offline = state.hub().config().offline;
    crate::commands::on_blocking_thread(move || {
        Ok(ModelsView {
            library: library::scan(&dirs),
            catalog: sizing::catalog_offers(
                &dirs.hf_cache_dir,
                ondo::hub::fit::DEFAULT_CONTEXT_TOKENS,
                MachineMemory::read(None),
            ),
            default_model: ondo::hub::catalog::DEFAULT_MODEL,
            hf_cache_dir: dirs.hf_cache_dir,
            offline,
        })
    })
    .await
}

/// Whether a model (folder, cached or on the hub) fits at `context` tokens.
#[tauri::command]
#[specta::specta]
pub async fn fit_model(
    state: State<'_>,
    model: String,
    context: u64,
) -> Result<ondo::hub::fit::FitEstimate, CommandError> {
    let (facts, _) = state.hub().facts_for(&model).await?;
    Ok(facts.estimate(context, MachineMemory::read(None)))
}

/// Downloads a model, streaming progress to `on_event`. A second call for a
/// model already downloading is refused; `cancel_download` pauses (what
/// arrived is kept and the next download continues from it).
#[tauri::command]
#[specta::specta]
pub async fn download_model<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_>,
    model: String,
    on_event: Channel<DownloadEvent>,
) -> Result<DownloadSummary, CommandError> {
    let model = ModelRef::parse(&model)?;
    let cancel = DownloadCancel::new();
    {
        let mut downloads = state.downloads.lock().unwrap_or_else(|p| p.into_inner());
        if downloads.contains_key(&model.repo_id) {
            return Err(CommandError::InvalidInput(format!(
                "{model} is already downloading"
            )));
        }
        downloads.insert(model.repo_id.clone(), cancel.clone());
    }
    let mut sink = |event: DownloadEvent| {
        // A closed window only stops the progress, not the download.
        let _ = on_event.send(event);
    };
    let options = DownloadOptions {
        on_cancel: OnCancel::KeepPartial,
        share: None,
    };
    let result = state
        .hub()
        .download(&model, options, &mut sink, &cancel)
        .await;
    state
        .downloads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&model.repo_id);
    let summary = result?;
    crate::events::models_changed(&app);
    Ok(summary)
}

/// Stops a download in flight; true if there was one.
#[tauri::command]
#[specta::specta]
pub fn cancel_download(state: State<'_>, model: String) -> bool {
    let repo_id = model.split('@').next().unwrap_or(&model).to_owned();
    match state
        .downloads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&repo_id)
    {
        Some(cancel) => {
            cancel.cancel();
            true
        }
        None => false,
    }
}

/// Deletes a downloaded model from the cache; the bytes freed.
#[tauri::command]
#[specta::specta]
pub async fn delete_model<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_>,
    model: String,
) -> Result<u64, CommandError> {
    let model = ModelRef::parse(&model)?;
    let cache_dir = state.hub().config().cache_dir.clone();
    let freed = crate::commands::on_blocking_thread(move || {
        // Its prompt caches go with it (matched by folder, so first).
        ondo::session::prompt_cache::clear(
            &ondo::paths::DataDirs::from_env().prompt_cache_dir(),
            Some(&cache_dir.join(model.cache_folder_name())),
        );
        Ok(library::delete_cached(&cache_dir, &model)?)
    })
    .await?;
    crate::events::models_changed(&app);
    Ok(freed)
}

/// The folder of the model the UI names: "tiny" (the built-in model,
/// written on first use), a folder, or a downloaded repo id, resolved by the
/// core as for the CLI and the server.
pub(crate) async fn resolve(
    state: &AppState,
    model: &str,
) -> Result<ondo::resolve::ResolvedModel, CommandError> {
    let pool = state.pool.clone();
    let model = model.to_owned();
    crate::commands::on_blocking_thread(move || {
        Ok(ondo::resolve::resolve_model(
            &pool,
            &model,
            ondo::resolve::NamedBy::Local,
        )?)
    })
    .await
}

/// One run's memory timeline.
#[tauri::command]
#[specta::specta]
pub fn run_timeline(state: State<'_>, run_id: String) -> Result<Vec<MemorySample>, CommandError> {
    history(&state, |store| store.timeline(&run_id))
}

/// The system's memory now: pressure level and the Activity Monitor breakdown.
#[tauri::command]
#[specta::specta]
pub fn memory_now(state: State<'_>) -> Result<ondo_os::MemorySnapshot, CommandError> {
    state
        .pool
        .memory_now()
        .ok_or_else(|| CommandError::Internal("memory could not be read on this system".into()))
}

/// The resident models and what the pool did recently.
#[tauri::command]
#[specta::specta]
pub fn pool_status(state: State<'_>) -> PoolStatus {
    PoolStatus {
        resident: state.pool.resident(),
        events: state.pool.events(),
    }
}

/// Unloads a warm model now (its memory goes back); false if it was not
/// loaded. A model in use finishes its answer first.
#[tauri::command]
#[specta::specta]
pub fn unload_model(state: State<'_>, model_dir: PathBuf) -> Result<bool, CommandError> {
    Ok(state.pool.unload(&model_dir)?)
}

pub(crate) fn history<T>(
    state: &AppState,
    read: impl FnOnce(&mut ondo::store::Store) -> Result<T, ondo::store::StoreError>,
) -> Result<T, CommandError> {
    state
        .pool
        .with_store(read)
        .ok_or_else(|| CommandError::Internal("the run history could not be opened".into()))?
        .map_err(CommandError::History)
}

/// The prompt cache on disk: its folder, what it holds now and its budget.
#[tauri::command]
#[specta::specta]
pub async fn prompt_cache_status(
    state: State<'_>,
) -> Result<ondo::session::prompt_cache::PromptCacheStatus, CommandError> {
    let settings = get_settings(state);
    crate::commands::on_blocking_thread(move || {
        let dirs = ondo::paths::DataDirs::from_env();
        Ok(ondo::session::prompt_cache::status(
            &dirs.prompt_cache_dir(),
            settings.prompt_cache_settings(&dirs).as_ref(),
        ))
    })
    .await
}

/// Removes every saved prompt cache (later prompts prefill in full once);
/// how many files went.
#[tauri::command]
#[specta::specta]
pub async fn clear_prompt_cache() -> Result<u32, CommandError> {
    crate::commands::on_blocking_thread(move || {
        let folder = ondo::paths::DataDirs::from_env().prompt_cache_dir();
        let removed = ondo::session::prompt_cache::clear(&folder, None);
        Ok(u32::try_from(removed).unwrap_or(u32::MAX))
    })
    .await
}

/// The Settings screen's values (defaults until the user changes them).
#[tauri::command]
#[specta::specta]
pub fn get_settings(state: State<'_>) -> ondo::app_settings::AppSettings {
    state
        .pool
        .with_store(|store| ondo::app_settings::AppSettings::load(store))
        .unwrap_or_default()
}

/// Checks, keeps and applies new settings (keep-alive, memory budget,
/// models folder, shortcut, launch at login, and the local server, which
/// starts, restarts or stops as they ask). Saved settings whose server
/// cannot start answer with the server's error (`address_unavailable`
/// when the port is taken).
#[tauri::command]
#[specta::specta]
pub async fn set_settings<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_>,
    settings: ondo::app_settings::AppSettings,
) -> Result<(), CommandError> {
    settings.check().map_err(CommandError::InvalidInput)?;
    crate::desktop::check(&settings)?;
    let folder_changed = state
        .apply_models_folder(&settings)
        .map_err(CommandError::InvalidInput)?;
    state.pool.set_settings(settings.pool_settings());
    if get_settings(state.clone()).prompt_cache_budget_bytes != settings.prompt_cache_budget_bytes {
        let pool = state.pool.clone();
        let wanted = settings.prompt_cache_settings(&ondo::paths::DataDirs::from_env());
        crate::commands::on_blocking_thread(move || Ok(pool.set_prompt_cache(wanted)?)).await?;
    }
    history(&state, |store| settings.save(store))?;
    if folder_changed {
        crate::events::models_changed(&app);
    }
    crate::events::AppEvent::SettingsChanged(settings.clone()).send(&app);
    crate::server::apply_settings(&app, &state, settings.local_server.clone()).await?;
    crate::desktop::apply(&app, &settings)
        .map_err(|problem| CommandError::InvalidInput(format!("Saved, but {problem}")))
}
