//! Ondo's desktop shell: builds the Tauri app (commands, popover window, tray
//! icon) around the `ondo` core. Domain work stays in the core.

mod chat;
mod commands;
mod desktop;
mod error;
mod events;
mod models;
mod runs;
mod server;
mod split;
mod state;
#[cfg(desktop)]
mod tray;
mod window;

pub use error::CommandError;

use ondo::session::PressureSource;
use tauri::{App, AppHandle, Builder, Manager, RunEvent, Runtime};

/// Every command the pages may call, in one list: `with_commands!(m)` hands
/// it to the macro `m`. The invoke handler is built from it
/// (`invoke_handler`), and so are the TypeScript bindings (`export_bindings`),
/// so a command cannot be callable without being typed or typed without
/// being callable. `<tauri::Wry>` marks a command generic over the runtime:
/// the bindings describe it at the real runtime; the handler leaves the
/// runtime to the app it is built into (the tests' mock runtime included).
macro_rules! with_commands {
    ($then:ident) => {
        $then![
            commands::doctor_report,
            commands::startup_check,
            commands::prepare_builtin_model,
            commands::run_test_generation<tauri::Wry>,
            models::list_models,
            models::fit_model,
            models::download_model<tauri::Wry>,
            models::cancel_download,
            models::delete_model<tauri::Wry>,
            models::run_timeline,
            models::memory_now,
            models::pool_status,
            models::unload_model,
            models::get_settings,
            models::set_settings<tauri::Wry>,
            models::prompt_cache_status,
            models::clear_prompt_cache,
            chat::chat_send<tauri::Wry>,
            chat::chat_stop,
            chat::chat_forget,
            chat::chat_features,
            runs::list_runs,
            runs::run_benchmark<tauri::Wry>,
            runs::cancel_benchmark,
            runs::export_runs,
            server::server_status,
            split::split_start,
            split::split_status,
            split::split_stop,
            desktop::open_window<tauri::Wry>,
            desktop::choose_export_path<tauri::Wry>,
            desktop::choose_folder<tauri::Wry>,
        ]
    };
}

/// Tauri's handler for the list (runtime generics are inferred).
macro_rules! invoke_handler {
    ($($($segment:ident)::+ $(<$runtime:ty>)?),* $(,)?) => {
        tauri::generate_handler![$($($segment)::+),*]
    };
}

/// The list described for the bindings, at the real runtime.
macro_rules! described_commands {
    ($($($segment:ident)::+ $(<$runtime:ty>)?),* $(,)?) => {
        tauri_specta::collect_commands![$($($segment)::+ $(::<$runtime>)?),*]
    };
}

/// Starts the desktop app and runs it until the user quits from the tray.
pub fn run() {
    // Before any MLX work and any thread: the settings MLX reads once, and,
    // run from Ondo.app, the bundle's kernels.
    ondo::engine::mlx_settings::apply();
    ondo::metallib::use_bundled_kernels();
    #[cfg(target_os = "linux")]
    give_the_webview_a_language();
    let app = run_app(
        desktop::with_plugins(tauri::Builder::default()),
        Box::new(ondo::session::system_pressure_level),
    )
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
/// `tauri::test::mock_builder()`; `run` passes the real one. The session
/// pool (and the engine thread inside it that owns every MLX object) starts
/// here; all commands share it. The pool reacts to the memory pressure
/// `pressure` reads: `run` passes the system's; tests about something else
/// pass a fixed level, so that a busy machine's pressure cannot trim the
/// caches they look at.
pub fn run_app<R: Runtime>(builder: Builder<R>, pressure: PressureSource) -> Builder<R> {
    let builder = match state::AppState::start(pressure) {
        Ok(state) => builder.manage(state),
        // Without an engine the commands answer with an error the UI shows.
        Err(error) => {
            eprintln!("ondo-app: {error}");
            builder
        }
    };
    builder
        .invoke_handler(with_commands!(invoke_handler))
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
                .with_store(|store| ondo::app_settings::AppSettings::load(store))
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

/// Where the generated bindings live, relative to the workspace root.
pub const BINDINGS_PATH: &str = "ui/src/lib/bindings.ts";

/// The TypeScript the UI imports for every command and the types they take
/// and return, generated from the Rust signatures.
pub fn typescript_bindings() -> Result<String, String> {
    let file = tempfile_path();
    tauri_specta::Builder::<tauri::Wry>::new()
        .commands(with_commands!(described_commands))
        // The app-wide events' names and payloads, and every error kind as a
        // list the UI's tests walk (its type is the union of the names).
        .typ::<events::AppEvent>()
        .constant("ERROR_KINDS", ondo::ErrorKind::ALL)
        // A rejected call rejects the promise with the CommandError, as
        // `invoke` does, rather than wrapping every result in an object.
        .error_handling(tauri_specta::ErrorHandlingMode::Throw)
        // u64 and usize become `number`. Ours are bytes, milliseconds and
        // token counts, all far below 2^53, where `number` is exact.
        .dangerously_cast_bigints_to_number()
        // Defaults and limits are defined once, in the core; the forms read
        // these instead of writing the numbers again.
        .constant("DEFAULT_SETTINGS", ondo::app_settings::AppSettings::default())
        .constant(
            "GENERATION_LIMITS",
            ondo::session::chat::GenerationSettings::LIMITS,
        )
        .constant("DEFAULT_BENCH_SHAPE", ondo::bench::BenchShape::default())
        .constant("BENCH_LIMITS", ondo::bench::BENCH_LIMITS)
        // The ports the app's local server may use (its defaults are in
        // DEFAULT_SETTINGS).
        .constant(
            "LOCAL_SERVER_PORTS",
            ondo::app_settings::LOCAL_SERVER_PORTS,
        )
        // One TypeScript type per Rust type: split serialize/deserialize
        // types would put Channel payloads in the wrong half.
        .disable_serde_phases()
        .export(
            specta_typescript::Typescript::default().header(
                "// Generated from the Rust commands by src-tauri/tests/bindings.rs. To change it,\n\
                 // change the Rust types, then run\n\
                 //   ONDO_WRITE_BINDINGS=1 cargo test -p ondo-app --test bindings\n",
            ),
            &file,
        )
        .map_err(|error| error.to_string())?;
    let text = std::fs::read_to_string(&file).map_err(|error| error.to_string());
    let _ = std::fs::remove_file(&file);
    text
}

/// A file of this call's own in the temp folder: the exporter only writes
/// to a path, and two calls at once (tests) must not share one.
fn tempfile_path() -> std::path::PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("ondo-bindings-{}-{call}.ts", std::process::id()))
}
