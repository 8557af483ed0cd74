//! What only a desktop session has: the system dialogs, the global
//! shortcut, launch at login, the main window with the Runs and Settings
//! views, and the watcher that tells every window when memory pressure
//! changes. The plugins behind them are registered by `run` only; under
//! the test runtime the commands say the feature is missing instead.

use std::path::PathBuf;
use std::time::Duration;

use ondo::app_settings::AppSettings;
use ondo::report::ReportFormat;
use tauri::{AppHandle, Manager, Runtime, WebviewUrl, WebviewWindowBuilder};
use tauri_plugin_dialog::Dialog;
use tauri_plugin_global_shortcut::{GlobalShortcut, Shortcut, ShortcutState};

use crate::error::CommandError;
use crate::events;
use crate::window;

/// The label of the main window (Runs and Settings).
pub const WORKSPACE_LABEL: &str = "workspace";

/// The main window's title (the popover's is "Ondo").
pub const WORKSPACE_TITLE: &str = "Ondo: Runs and Settings";

/// How often the watcher reads the system's memory and the warm models.
const STATE_POLL: Duration = Duration::from_secs(1);

/// The views the main window shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, specta::Type)]
#[serde(rename_all = "snake_case")]
pub enum AppView {
    Runs,
    Settings,
}

impl AppView {
    fn name(self) -> &'static str {
        match self {
            AppView::Runs => "runs",
            AppView::Settings => "settings",
        }
    }
}

/// The plugins a desktop session adds to `builder`.
pub fn with_plugins<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        .plugin(tauri_plugin_dialog::init())
        .plugin(
            tauri_plugin_global_shortcut::Builder::new()
                .with_handler(|app, _shortcut, event| {
                    if event.state == ShortcutState::Pressed
                        && let Err(error) = window::toggle(app)
                    {
                        eprintln!("ondo-app: could not toggle the popover: {error}");
                    }
                })
                .build(),
        )
        .plugin(tauri_plugin_autostart::init(
            tauri_plugin_autostart::MacosLauncher::LaunchAgent,
            None,
        ))
}

/// Opens the main window on `view`, or brings it forward and switches it.
pub fn open_workspace<R: Runtime>(app: &AppHandle<R>, view: AppView) -> tauri::Result<()> {
    if let Some(workspace) = app.get_webview_window(WORKSPACE_LABEL) {
        workspace.show()?;
        workspace.unminimize()?;
        workspace.set_focus()?;
        events::AppEvent::Navigate { view: view.into() }.send(app);
        return Ok(());
    }
    // The page reads its first view from the fragment; later switches come
    // as NAVIGATE events.
    let url = WebviewUrl::App(PathBuf::from(format!("index.html#{}", view.name())));
    WebviewWindowBuilder::new(app, WORKSPACE_LABEL, url)
        .title(WORKSPACE_TITLE)
        .inner_size(1080.0, 740.0)
        .min_inner_size(720.0, 480.0)
        .build()?;
    Ok(())
}

/// Opens (or focuses) the main window on a view.
#[tauri::command]
#[specta::specta]
pub fn open_window<R: Runtime>(app: AppHandle<R>, view: AppView) -> Result<(), CommandError> {
    open_workspace(&app, view).map_err(|e| CommandError::Internal(e.to_string()))
}

/// Asks where to save a report in `format`; `None` when the user cancels.
#[tauri::command]
#[specta::specta]
pub async fn choose_export_path<R: Runtime>(
    app: AppHandle<R>,
    format: ReportFormat,
) -> Result<Option<PathBuf>, CommandError> {
    let today = ondo::store::now_rfc3339();
    let name = crate::runs::suggested_report_name(format, today.get(..10).unwrap_or("report"));
    let dialog = file_dialog(&app)?
        .set_title("Export runs")
        .set_file_name(name)
        .add_filter(format_label(format), &[format.extension()]);
    let dialog = match dirs_next_documents() {
        Some(folder) => dialog.set_directory(folder),
        None => dialog,
    };
    let chosen =
        crate::commands::on_blocking_thread(move || Ok(dialog.blocking_save_file())).await?;
    chosen.map(into_path).transpose()
}

/// Asks for a folder (the models folder); `None` when the user cancels.
#[tauri::command]
#[specta::specta]
pub async fn choose_folder<R: Runtime>(app: AppHandle<R>) -> Result<Option<PathBuf>, CommandError> {
    let dialog = file_dialog(&app)?.set_title("Choose the models folder");
    let chosen =
        crate::commands::on_blocking_thread(move || Ok(dialog.blocking_pick_folder())).await?;
    chosen.map(into_path).transpose()
}

fn file_dialog<R: Runtime>(
    app: &AppHandle<R>,
) -> Result<tauri_plugin_dialog::FileDialogBuilder<R>, CommandError> {
    let dialog = app.try_state::<Dialog<R>>().ok_or_else(|| {
        CommandError::InvalidInput("this session has no file dialogs; type a path instead".into())
    })?;
    Ok(dialog.file())
}

fn into_path(chosen: tauri_plugin_dialog::FilePath) -> Result<PathBuf, CommandError> {
    chosen
        .into_path()
        .map_err(|e| CommandError::InvalidInput(format!("that location cannot be used: {e}")))
}

fn format_label(format: ReportFormat) -> &'static str {
    match format {
        ReportFormat::Json => "JSON report",
        ReportFormat::Jsonl => "JSON Lines",
        ReportFormat::Csv => "CSV table",
        ReportFormat::Markdown => "Markdown table",
        ReportFormat::Html => "HTML page with charts",
    }
}

/// The user's Documents folder when there is one (where people look for a
/// saved report first).
fn dirs_next_documents() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let documents = home.join("Documents");
    documents.is_dir().then_some(documents)
}

/// Checks the parts of `settings` only the desktop knows how to read.
pub fn check(settings: &AppSettings) -> Result<(), CommandError> {
    if let Some(text) = &settings.global_shortcut {
        text.parse::<Shortcut>().map_err(|e| {
            CommandError::InvalidInput(format!(
                "the shortcut '{text}' is not one the system understands ({e}); \
                 write it like CommandOrControl+Shift+O"
            ))
        })?;
    }
    Ok(())
}

/// Applies the desktop settings: the global shortcut and launch at login.
/// A part that cannot be applied (another app holds the shortcut) is named
/// in the error; the rest still takes effect.
pub fn apply<R: Runtime>(app: &AppHandle<R>, settings: &AppSettings) -> Result<(), String> {
    let mut problems = Vec::new();
    if let Some(shortcuts) = app.try_state::<GlobalShortcut<R>>() {
        let _ = shortcuts.unregister_all();
        if let Some(text) = &settings.global_shortcut
            && let Err(error) = shortcuts.register(text.as_str())
        {
            problems.push(format!(
                "the shortcut {text} could not be registered ({error}); another app may use it"
            ));
        }
    }
    if let Some(autostart) = app.try_state::<tauri_plugin_autostart::AutoLaunchManager>() {
        let wanted = settings.launch_at_login;
        if autostart.is_enabled().ok() != Some(wanted) {
            let result = if wanted {
                autostart.enable()
            } else {
                autostart.disable()
            };
            if let Err(error) = result {
                problems.push(format!("launch at login could not be changed ({error})"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Requests the local server has answered (0 when it is not serving).
fn served(state: Option<&crate::server::LocalServerState>) -> u64 {
    match state {
        Some(crate::server::LocalServerState::On { status }) => status.requests_served,
        _ => 0,
    }
}

/// Tells every window when the memory-pressure level changes, when the
/// warm models change, and when the local server's state does (the
/// popover's gauge polls for the breakdown; these are the states every
/// window shows).
pub fn watch_pressure_and_engine<R: Runtime>(app: AppHandle<R>) {
    let spawned = std::thread::Builder::new()
        .name("ondo-state-watch".into())
        .spawn(move || {
            let mut last_level = None;
            let mut last_models: Option<Vec<(String, bool)>> = None;
            let mut last_server: Option<crate::server::LocalServerState> = None;
            loop {
                if let Ok(snapshot) = ondo_os::memory_snapshot()
                    && last_level != Some(snapshot.level)
                {
                    let level = snapshot.level;
                    events::AppEvent::PressureLevel { level }.send(&app);
                    last_level = Some(level);
                }
                if let Some(state) = app.try_state::<crate::state::AppState>() {
                    let resident = state.pool.resident();
                    // Idle times tick on their own; only a change of what is
                    // loaded or busy is news.
                    let shape: Vec<(String, bool)> = resident
                        .iter()
                        .map(|m| (m.model_id.clone(), m.busy))
                        .collect();
                    if last_models.as_ref() != Some(&shape) {
                        events::AppEvent::EngineState { resident }.send(&app);
                        last_models = Some(shape);
                    }
                    let server = state.server.state();
                    let news = server.without_clock();
                    if last_server.as_ref() != Some(&news) {
                        if served(last_server.as_ref()) < served(Some(&news)) {
                            // The request was recorded as a run: the Runs
                            // window shows it.
                            events::runs_changed(&app, "api");
                        }
                        events::AppEvent::LocalServer(server).send(&app);
                        last_server = Some(news);
                    }
                }
                std::thread::sleep(STATE_POLL);
            }
        });
    if let Err(error) = spawned {
        eprintln!("ondo-app: memory pressure and warm models will not be watched: {error}");
    }
}
