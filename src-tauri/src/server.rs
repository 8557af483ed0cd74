//! The local server the app runs for other programs (the core's
//! `api::LocalServer` over the app's own session pool): started with the
//! app when Settings say so, started, restarted or stopped when the
//! settings change, and what it is doing for the popover's line. A server
//! that cannot start never stops the app; the popover says why instead.

use std::sync::{Arc, Mutex, MutexGuard};

use ondo::ErrorKind;
use ondo::api::{ApiError, LocalServer, RequestLogger, ServerConfig, ServerStatus};
use ondo::app_settings::LocalServerSettings;
use ondo::session::SessionPool;
use tauri::{AppHandle, Runtime};

use crate::error::CommandError;
use crate::state::AppState;

/// What to do with the server when the settings are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerChange {
    /// Nothing to do: off and staying off, or serving as asked already.
    Keep,
    Start,
    /// The port, key or origins changed: the old server lets go of its
    /// port before the new one takes it.
    Restart,
    Stop,
}

/// The change from the server now running with `running` (`None`: none
/// runs, whether off or failed to start) to what `wanted` asks for. A
/// server that failed to start is tried again on every save while enabled.
pub fn change_for(running: Option<&ServerConfig>, wanted: &LocalServerSettings) -> ServerChange {
    match (running, wanted.enabled) {
        (None, false) => ServerChange::Keep,
        (None, true) => ServerChange::Start,
        (Some(_), false) => ServerChange::Stop,
        (Some(config), true) if *config == server_config(wanted) => ServerChange::Keep,
        (Some(_), true) => ServerChange::Restart,
    }
}

/// What the server is started with: the settings' port, key and origins
/// (blanks left out) on the loopback address, everything else as
/// `ServerConfig` has it.
fn server_config(wanted: &LocalServerSettings) -> ServerConfig {
    ServerConfig {
        port: wanted.port,
        api_key: wanted
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .map(str::to_owned),
        allowed_origins: wanted
            .allowed_origins
            .iter()
            .map(|origin| origin.trim().to_owned())
            .filter(|origin| !origin.is_empty())
            .collect(),
        ..ServerConfig::default()
    }
}

/// Why the server is not serving although it is turned on, as the UI
/// receives any command's error.
#[derive(Debug, Clone, PartialEq, serde::Serialize, specta::Type)]
pub struct ServerFailure {
    pub kind: ErrorKind,
    /// What happened and what to do.
    pub message: String,
}

/// The popover's line: off, serving (with what it is doing), or turned on
/// but not serving, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize, specta::Type)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LocalServerState {
    Off,
    On { status: ServerStatus },
    Failed { error: ServerFailure },
}

impl LocalServerState {
    /// The same state without the clock of the request in flight: what
    /// the watcher compares, since only a change of this is news.
    pub fn without_clock(&self) -> Self {
        let mut state = self.clone();
        if let LocalServerState::On { status } = &mut state
            && let Some(client) = &mut status.in_flight
        {
            client.running_ms = 0;
        }
        state
    }
}

/// The server the app runs, or why it does not.
#[derive(Default)]
pub struct AppServer {
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    running: Option<(LocalServer, ServerConfig)>,
    failure: Option<ServerFailure>,
}

impl AppServer {
    /// Makes the server what `wanted` asks for; a start that fails leaves
    /// it off, remembered for the popover, and is returned. Blocks while a
    /// server stops (it cancels what it is answering first).
    pub fn apply(
        &self,
        pool: &Arc<SessionPool>,
        wanted: &LocalServerSettings,
    ) -> Result<(), ApiError> {
        let mut slot = self.lock();
        let change = change_for(slot.running.as_ref().map(|(_, config)| config), wanted);
        if matches!(change, ServerChange::Stop | ServerChange::Restart)
            && let Some((server, _)) = slot.running.take()
        {
            stop_now(server);
        }
        if !wanted.enabled {
            slot.failure = None;
        }
        if !matches!(change, ServerChange::Start | ServerChange::Restart) {
            return Ok(());
        }
        let config = server_config(wanted);
        match LocalServer::start(pool.clone(), config.clone(), log_request()) {
            Ok(server) => {
                slot.running = Some((server, config));
                slot.failure = None;
                Ok(())
            }
            Err(error) => {
                slot.failure = Some(ServerFailure {
                    kind: error.kind(),
                    message: error.to_string(),
                });
                Err(error)
            }
        }
    }

    /// What the popover's line shows.
    pub fn state(&self) -> LocalServerState {
        let slot = self.lock();
        match (&slot.running, &slot.failure) {
            (Some((server, _)), _) => LocalServerState::On {
                status: server.status(),
            },
            (None, Some(failure)) => LocalServerState::Failed {
                error: failure.clone(),
            },
            (None, None) => LocalServerState::Off,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Stops a server without making the user wait for its answers: the port
/// is let go at once, the answer under way ends at its next token.
fn stop_now(mut server: LocalServer) {
    server.stop_accepting();
    server.cancel_in_flight();
    server.stop();
}

/// A line on stderr per request (never the key: requests' logs carry none).
fn log_request() -> RequestLogger {
    Arc::new(|log| {
        let model = log.model.as_deref().unwrap_or("-");
        eprintln!(
            "ondo-app: local server: {} {} {model}",
            log.route, log.status
        );
    })
}

type State<'a> = tauri::State<'a, AppState>;

/// The local server's state for the popover's line.
#[tauri::command]
#[specta::specta]
pub fn server_status(state: State<'_>) -> LocalServerState {
    state.server.state()
}

/// Applies the saved server settings after `set_settings` kept them, and
/// tells every window.
pub async fn apply_settings<R: Runtime>(
    app: &AppHandle<R>,
    state: &AppState,
    wanted: LocalServerSettings,
) -> Result<(), CommandError> {
    let server = state.server.clone();
    let pool = state.pool.clone();
    let applied = crate::commands::on_blocking_thread(move || {
        server.apply(&pool, &wanted).map_err(CommandError::from)
    })
    .await;
    crate::events::AppEvent::LocalServer(state.server.state()).send(app);
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(enabled: bool, port: u16) -> LocalServerSettings {
        LocalServerSettings {
            enabled,
            port,
            ..LocalServerSettings::default()
        }
    }

    #[test]
    fn the_server_starts_stops_and_restarts_only_when_the_settings_ask() {
        let off = wanted(false, 11480);
        let on = wanted(true, 11480);
        let running = server_config(&on);
        assert_eq!(change_for(None, &off), ServerChange::Keep);
        assert_eq!(change_for(None, &on), ServerChange::Start);
        assert_eq!(change_for(Some(&running), &on), ServerChange::Keep);
        assert_eq!(change_for(Some(&running), &off), ServerChange::Stop);
        // Turning it off stops it whatever else changed with it.
        assert_eq!(
            change_for(Some(&running), &wanted(false, 2000)),
            ServerChange::Stop
        );
        assert_eq!(
            change_for(Some(&running), &wanted(true, 2000)),
            ServerChange::Restart
        );
        let keyed = LocalServerSettings {
            api_key: Some("sk-1".into()),
            ..on.clone()
        };
        assert_eq!(change_for(Some(&running), &keyed), ServerChange::Restart);
        let with_origin = LocalServerSettings {
            allowed_origins: vec!["https://app.example".into()],
            ..on.clone()
        };
        assert_eq!(
            change_for(Some(&running), &with_origin),
            ServerChange::Restart
        );
        // Blanks the server ignores are no reason to drop its clients.
        let blanks = LocalServerSettings {
            api_key: Some(" ".into()),
            allowed_origins: vec!["".into()],
            ..on
        };
        assert_eq!(change_for(Some(&running), &blanks), ServerChange::Keep);
    }

    #[test]
    fn by_default_the_server_is_the_cores_own_on_this_machine_only() {
        let config = server_config(&LocalServerSettings::default());
        assert_eq!(config.port, ServerConfig::default().port);
        assert!(config.socket_address().unwrap().ip().is_loopback());
        assert_eq!(config.api_key, None);
    }

    #[test]
    fn the_server_starts_with_a_blank_key_and_blank_origins_left_out() {
        let server = LocalServerSettings {
            api_key: Some("  ".into()),
            allowed_origins: vec![" https://app.example ".into(), "".into()],
            ..LocalServerSettings::default()
        };
        let config = server_config(&server);
        assert_eq!(config.api_key, None);
        assert_eq!(config.allowed_origins, ["https://app.example"]);
        let keyed = LocalServerSettings {
            api_key: Some(" sk-ondo-1 ".into()),
            ..LocalServerSettings::default()
        };
        assert_eq!(server_config(&keyed).api_key.as_deref(), Some("sk-ondo-1"));
    }

    #[test]
    fn the_watcher_ignores_the_clock_of_the_request_in_flight() {
        let status = |running_ms| LocalServerState::On {
            status: ServerStatus {
                url: "http://127.0.0.1:11480".into(),
                requests_served: 3,
                waiting: 0,
                in_flight: Some(ondo::api::ClientInFlight {
                    route: "POST /v1/chat/completions".into(),
                    model: "tiny".into(),
                    user_agent: Some("curl/8.5.0".into()),
                    running_ms,
                }),
            },
        };
        assert_eq!(status(10).without_clock(), status(900).without_clock());
        assert_ne!(status(10), status(900));
    }
}
