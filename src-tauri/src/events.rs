//! The app-wide events the shell emits (ui/src/lib/backend.ts `AppEvents`
//! lists the same names and payloads). Per-call progress goes over a
//! command's own channel instead; these are for state every window shares.

use serde::Serialize;
use tauri::{AppHandle, Emitter, Runtime};

/// The warm models changed (loaded, unloaded, busy or idle): `{ resident }`.
pub const ENGINE_STATE: &str = "ondo://engine-state";
/// The memory-pressure level changed: `{ level }`.
pub const PRESSURE_LEVEL: &str = "ondo://pressure-level";
/// A model was downloaded, deleted or added: `{}`.
pub const MODELS_CHANGED: &str = "ondo://models-changed";
/// A run was recorded: `{ run_id }` (a benchmark's id while one runs).
pub const RUNS_CHANGED: &str = "ondo://runs-changed";
/// The settings were saved: the whole `AppSettings`.
pub const SETTINGS_CHANGED: &str = "ondo://settings-changed";
/// The tray menu asks a window to show a view: `{ view }`.
pub const NAVIGATE: &str = "ondo://navigate";

#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct PressureLevel {
    pub level: ondo_os::PressureLevel,
}

#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct EngineState {
    pub resident: Vec<ondo::session::PooledModel>,
}

#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct RunsChanged {
    pub run_id: String,
}

#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct Navigate {
    pub view: String,
}

/// Sends `payload` to every window; a window that is gone just misses it.
pub fn tell_all<R: Runtime, T: Serialize + Clone>(app: &AppHandle<R>, event: &str, payload: T) {
    if let Err(error) = app.emit(event, payload) {
        eprintln!("ondo-app: could not send {event}: {error}");
    }
}

pub fn runs_changed<R: Runtime>(app: &AppHandle<R>, run_id: &str) {
    tell_all(
        app,
        RUNS_CHANGED,
        RunsChanged {
            run_id: run_id.to_owned(),
        },
    );
}

pub fn models_changed<R: Runtime>(app: &AppHandle<R>) {
    tell_all(app, MODELS_CHANGED, serde_json::json!({}));
}
