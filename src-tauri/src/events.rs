//! The app-wide events the shell emits, each name and payload defined once
//! here: `AppEvent` goes into the generated bindings, where the pages read
//! the names and payload types from it. Per-call progress goes over a
//! command's own channel instead; these are for state every window shares.

use serde::Serialize;
use tauri::{AppHandle, Emitter, Runtime};

use crate::desktop::AppView;

/// An event with its name (what a page listens for) and its payload.
#[derive(Debug, Clone, Serialize, specta::Type)]
#[serde(tag = "name", content = "payload")]
pub enum AppEvent {
    /// The warm models changed (loaded, unloaded, busy or idle).
    #[serde(rename = "ondo://engine-state")]
    EngineState {
        resident: Vec<ondo::session::PooledModel>,
    },
    /// The memory-pressure level changed.
    #[serde(rename = "ondo://pressure-level")]
    PressureLevel { level: ondo_os::PressureLevel },
    /// A model was downloaded, deleted or added.
    #[serde(rename = "ondo://models-changed")]
    ModelsChanged {},
    /// A run was recorded (chat, test generation or a benchmark's run): its
    /// id, or the benchmark's while one runs.
    #[serde(rename = "ondo://runs-changed")]
    RunsChanged { run_id: String },
    /// The settings were saved (in any window).
    #[serde(rename = "ondo://settings-changed")]
    SettingsChanged(ondo::app_settings::AppSettings),
    /// The local server started, stopped, failed to start, or its requests
    /// changed (served, waiting, the client in flight).
    #[serde(rename = "ondo://local-server")]
    LocalServer(crate::server::LocalServerState),
    /// The tray menu asks a window to show a view (`models` goes to the
    /// popover, the others to the main window).
    #[serde(rename = "ondo://navigate")]
    Navigate { view: NavigateView },
}

/// The views the tray menu can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, specta::Type)]
#[serde(rename_all = "snake_case")]
pub enum NavigateView {
    /// The popover's Models section.
    Models,
    /// The main window's Runs view.
    Runs,
    /// The main window's Settings view.
    Settings,
}

impl From<AppView> for NavigateView {
    fn from(view: AppView) -> Self {
        match view {
            AppView::Runs => NavigateView::Runs,
            AppView::Settings => NavigateView::Settings,
        }
    }
}

impl AppEvent {
    /// The name and the payload, as a listener receives them.
    fn name_and_payload(&self) -> Result<(String, serde_json::Value), serde_json::Error> {
        let mut tagged = serde_json::to_value(self)?;
        let name = tagged["name"].as_str().unwrap_or_default().to_owned();
        Ok((name, tagged["payload"].take()))
    }

    /// Sends the event to every window; a window that is gone just misses it.
    pub fn send<R: Runtime>(&self, app: &AppHandle<R>) {
        self.deliver(|name, payload| app.emit(name, payload));
    }

    /// Sends the event to one window (by label).
    pub fn send_to<R: Runtime>(&self, app: &AppHandle<R>, window: &str) {
        self.deliver(|name, payload| app.emit_to(window, name, payload));
    }

    fn deliver(&self, emit: impl FnOnce(&str, serde_json::Value) -> tauri::Result<()>) {
        let sent = self
            .name_and_payload()
            .map_err(|error| error.to_string())
            .and_then(|(name, payload)| emit(&name, payload).map_err(|e| e.to_string()));
        if let Err(error) = sent {
            eprintln!("ondo-app: could not send {self:?}: {error}");
        }
    }
}

pub fn runs_changed<R: Runtime>(app: &AppHandle<R>, run_id: &str) {
    AppEvent::RunsChanged {
        run_id: run_id.to_owned(),
    }
    .send(app);
}

pub fn models_changed<R: Runtime>(app: &AppHandle<R>) {
    AppEvent::ModelsChanged {}.send(app);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_get_the_name_and_the_bare_payload() {
        let (name, payload) = AppEvent::RunsChanged {
            run_id: "r-1".into(),
        }
        .name_and_payload()
        .unwrap();
        assert_eq!(name, "ondo://runs-changed");
        assert_eq!(payload, serde_json::json!({ "run_id": "r-1" }));

        let (name, payload) = AppEvent::ModelsChanged {}.name_and_payload().unwrap();
        assert_eq!(name, "ondo://models-changed");
        assert_eq!(payload, serde_json::json!({}));

        let (name, payload) = AppEvent::Navigate {
            view: AppView::Settings.into(),
        }
        .name_and_payload()
        .unwrap();
        assert_eq!(name, "ondo://navigate");
        assert_eq!(payload, serde_json::json!({ "view": "settings" }));

        let settings = ondo::app_settings::AppSettings::default();
        let (name, payload) = AppEvent::SettingsChanged(settings.clone())
            .name_and_payload()
            .unwrap();
        assert_eq!(name, "ondo://settings-changed");
        assert_eq!(payload, serde_json::to_value(&settings).unwrap());
    }
}
