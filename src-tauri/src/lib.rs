//! Ondo's desktop shell: builds the Tauri app (commands, popover window, tray
//! icon) around the `ondo` core. Domain work stays in the core.

mod chat;
mod commands;
mod desktop;
mod error;
mod events;
mod library;
mod models;
mod runs;
mod state;
#[cfg(desktop)]
mod tray;
mod window;

pub use error::CommandError;

use tauri::{App, AppHandle, Builder, Manager, RunEvent, Runtime};

/// Starts the desktop app and runs it until the user quits from the tray.
pub fn run() {
    #[cfg(target_os = "linux")]
    give_the_webview_a_language();
    let app = run_app(desktop::with_plugins(tauri::Builder::default()))
        .setup(|app| Ok(set_up_desktop(app)?))
        .build(tauri::generate_context!());
    match app {
        Ok(app) => app.run(keep_running_without_windows),
        Err(error) => {
            eprintln!("ondo-app: could not start: {error}");
            std::process::exit(1);
        }
    }
}

/// Adds Ondo's commands and window behaviour to `builder`. Tests pass
/// `tauri::test::mock_builder()`; `run` passes the real one. The engine
/// thread that owns every MLX object starts here; all commands share it.
pub fn run_app<R: Runtime>(builder: Builder<R>) -> Builder<R> {
    let builder = match ondo::engine::EngineHandle::spawn()
        .map_err(|e| e.to_string())
        .and_then(|engine| Ok((engine.clone(), state::AppState::start(engine)?)))
    {
        Ok((engine, state)) => builder.manage(engine).manage(state),
        // Without an engine the commands answer with an error the UI shows.
        Err(error) => {
            eprintln!("ondo-app: {error}");
            builder
        }
    };
    builder
        .invoke_handler(tauri::generate_handler![
            commands::doctor_report,
            commands::library_status,
            commands::prepare_builtin_model,
            commands::run_test_generation,
            models::list_models,
            models::fit_model,
            models::download_model,
            models::cancel_download,
            models::delete_model,
            models::recent_runs,
            models::run_timeline,
            models::memory_now,
            models::pool_status,
            models::unload_model,
            models::get_settings,
            models::set_settings,
            chat::chat_send,
            chat::chat_stop,
            chat::chat_forget,
            runs::list_runs,
            runs::run_benchmark,
            runs::cancel_benchmark,
            runs::export_runs,
            desktop::open_window,
            desktop::choose_export_path,
            desktop::choose_folder,
        ])
        .on_window_event(window::on_window_event)
}

/// Under the C or POSIX locale WebKitGTK reports "C" as `navigator.language`,
/// which the page's `Intl` formatters (the charts') refuse as a language
/// tag. WebKit takes the page's language from the messages locale, so
/// naming English there fixes the page; numbers, dates and text encoding
/// keep the user's locale.
#[cfg(target_os = "linux")]
fn give_the_webview_a_language() {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    // LC_ALL overrides everything; a user who set it gets what they asked for.
    if var("LC_ALL").is_some() {
        return;
    }
    let messages = var("LC_MESSAGES").or_else(|| var("LANG"));
    let posix =
        messages.is_none_or(|value| matches!(value.split('.').next(), Some("" | "C" | "POSIX")));
    if posix {
        // SAFETY: called first thing in `run`, before the app starts any thread.
        unsafe { std::env::set_var("LC_MESSAGES", "en_US.UTF-8") };
    }
}

/// What only a real desktop session has: the menu-bar policy, the tray icon,
/// and the popover when `--show` was given.
fn set_up_desktop<R: Runtime>(app: &mut App<R>) -> tauri::Result<()> {
    // A menu-bar app: no Dock icon and no app menu.
    #[cfg(target_os = "macos")]
    app.set_activation_policy(tauri::ActivationPolicy::Accessory);
    app.manage(window::TrayAnchor::default());
    #[cfg(desktop)]
    {
        tray::create(app.handle())?;
        desktop::watch_pressure_and_engine(app.handle().clone());
        // The shortcut and launch at login the user saved.
        if let Some(state) = app.try_state::<state::AppState>() {
            let settings = state
                .pool
                .with_store(|store| ondo::session::settings::AppSettings::load(store))
                .unwrap_or_default();
            if let Err(problem) = desktop::apply(app.handle(), &settings) {
                eprintln!("ondo-app: {problem}");
            }
        }
    }
    let args: Vec<String> = std::env::args().collect();
    if window::shown_at_start(args.iter().cloned()) {
        window::show(app.handle())?;
    }
    if let Some(view) = window::view_at_start(args) {
        desktop::open_workspace(app.handle(), view)?;
    }
    Ok(())
}

/// A tray app lives on with no window open: only an exit with an explicit
/// code (Quit in the tray menu) ends it.
fn keep_running_without_windows<R: Runtime>(_app: &AppHandle<R>, event: RunEvent) {
    if let RunEvent::ExitRequested {
        code: None, api, ..
    } = event
    {
        api.prevent_exit();
    }
}
