//! The settings a user changes in the app, kept in the run history's
//! settings table so the app, the command line and the local server share
//! them. They are the app's, not any one part's: the session pool takes the
//! policy they ask for (`pool_settings`), the hub the models folder
//! (`hub_config`), the server its port, key and origins.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::hub::HubConfig;
use crate::paths::DataDirs;
use crate::session::chat::GenerationSettings;
use crate::session::prompt_cache::DiskCacheSettings;
use crate::session::{KeepAlive, PoolSettings};
use crate::store::{Store, StoreError};

const SETTINGS_KEY: &str = "app_settings";

/// Light, dark, or whatever the system uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum Theme {
    #[default]
    System,
    Light,
    Dark,
}

/// Everything the Settings screen shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct AppSettings {
    /// Minutes an idle model stays loaded; `None`: until memory is needed.
    pub keep_alive_minutes: Option<u64>,
    /// Most bytes of weights and KV caches kept warm; `None`: no bound but
    /// memory pressure.
    pub memory_budget_bytes: Option<u64>,
    /// Most bytes of prompt caches saved on disk; `None`: the smaller of
    /// 20 GiB and a quarter of the free space; 0: none saved or read.
    pub prompt_cache_budget_bytes: Option<u64>,
    /// Defaults for new conversations.
    pub generation: GenerationSettings,
    pub theme: Theme,
    /// Where the app downloads models; `None`: the Hugging Face cache, shared
    /// with mlx-lm and transformers.
    pub models_folder: Option<PathBuf>,
    /// Start in the menu bar when the user logs in.
    pub launch_at_login: bool,
    /// The key combination that toggles the popover from any app, in Tauri's
    /// accelerator syntax; `None`: no shortcut.
    pub global_shortcut: Option<String>,
    /// The local server the app runs for other programs (off until the
    /// user turns it on).
    pub local_server: LocalServerSettings,
}

/// The port Ondo's local server listens on unless told otherwise (`ondo
/// serve --port`, the app's Settings): not Ollama's (11434), LM Studio's
/// (1234), mlx_lm.server's (8080) or Docker Model Runner's (12434), so Ondo
/// can run beside any of them.
pub const DEFAULT_PORT: u16 = 11480;

/// The local server as the app runs it: on this machine's loopback address
/// only (the app offers no other, so a key is a choice, not a requirement),
/// on a port the user picks. The app's shell starts the server with these,
/// the rest of its configuration as `ServerConfig`'s defaults have it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(default)]
pub struct LocalServerSettings {
    /// Serve while the app runs (and start with it).
    pub enabled: bool,
    /// The port on 127.0.0.1, within `LOCAL_SERVER_PORTS`.
    pub port: u16,
    /// When set, every request must send `Authorization: Bearer <key>` (or,
    /// as Anthropic's clients do, `x-api-key: <key>`).
    /// Kept in the run history's settings table with the other settings.
    pub api_key: Option<String>,
    /// Web origins (`https://app.example`, or `*` for any) whose pages may
    /// call the server; empty: no web page may.
    pub allowed_origins: Vec<String>,
}

/// The ports the app's server may use: the ones below 1024 are the
/// system's own services', which an app cannot listen on everywhere.
pub const LOCAL_SERVER_PORTS: (u16, u16) = (1024, u16::MAX);

/// Written without the key, so that no log line carries it.
impl std::fmt::Debug for LocalServerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalServerSettings")
            .field("enabled", &self.enabled)
            .field("port", &self.port)
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .field("allowed_origins", &self.allowed_origins)
            .finish()
    }
}

impl Default for LocalServerSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            port: DEFAULT_PORT,
            api_key: None,
            allowed_origins: Vec::new(),
        }
    }
}

impl LocalServerSettings {
    /// Says what is wrong: a port out of range, a key a header cannot
    /// carry, an origin that is not `scheme://host[:port]`.
    pub fn check(&self) -> Result<(), String> {
        let (low, high) = LOCAL_SERVER_PORTS;
        if !(low..=high).contains(&self.port) {
            return Err(format!(
                "the local server's port must be from {low} to {high}, not {}",
                self.port
            ));
        }
        if let Some(key) = &self.api_key
            && key
                .trim()
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Err(
                "the local server's API key may hold only letters, digits and punctuation \
                 (no spaces), since clients send it in a header"
                    .into(),
            );
        }
        for origin in &self.allowed_origins {
            let origin = origin.trim();
            if !origin.is_empty() && !is_web_origin(origin) {
                return Err(format!(
                    "'{origin}' is not a web origin; write it like https://app.example or \
                     http://localhost:3000 (no path), or * for any"
                ));
            }
        }
        Ok(())
    }
}

/// `*`, or `http(s)://host[:port]` with nothing after (a trailing `/` aside),
/// which is what a browser sends as `Origin`.
fn is_web_origin(text: &str) -> bool {
    if text == "*" {
        return true;
    }
    let Some(rest) = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
    else {
        return false;
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = match authority.strip_prefix('[') {
        // An IPv6 address: [::1]:8080
        Some(bracketed) => match bracketed.split_once(']') {
            Some((address, after)) => (
                address,
                match after {
                    "" => None,
                    after => match after.strip_prefix(':') {
                        Some(port) => Some(port),
                        None => return false,
                    },
                },
            ),
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    host_ok && port_ok
}

/// The popover's shortcut until the user picks another.
pub const DEFAULT_GLOBAL_SHORTCUT: &str = "CommandOrControl+Shift+O";

impl Default for AppSettings {
    fn default() -> Self {
        Self {
            keep_alive_minutes: Some(10),
            memory_budget_bytes: None,
            prompt_cache_budget_bytes: None,
            generation: GenerationSettings::default(),
            theme: Theme::System,
            models_folder: None,
            launch_at_login: false,
            global_shortcut: Some(DEFAULT_GLOBAL_SHORTCUT.to_owned()),
            local_server: LocalServerSettings::default(),
        }
    }
}

impl AppSettings {
    /// The stored settings, or the defaults (also when the stored ones are
    /// from an Ondo that wrote fields this one does not know).
    pub fn load(store: &Store) -> Self {
        store
            .setting(SETTINGS_KEY)
            .ok()
            .flatten()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    pub fn save(&self, store: &mut Store) -> Result<(), StoreError> {
        let text = serde_json::to_string(self).expect("plain data");
        store.set_setting(SETTINGS_KEY, &text)
    }

    /// Says what is wrong with settings a form let through.
    pub fn check(&self) -> Result<(), String> {
        if self.keep_alive_minutes == Some(0) {
            return Err("keep-alive must be at least a minute (or off: keep models loaded)".into());
        }
        if self.memory_budget_bytes.is_some_and(|b| b < 256 << 20) {
            return Err("a memory budget under 256 MiB cannot hold a model".into());
        }
        if let Some(folder) = &self.models_folder
            && !folder.is_absolute()
        {
            return Err(format!(
                "the models folder must be a full path, not '{}'",
                folder.display()
            ));
        }
        if self
            .global_shortcut
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err("leave the shortcut off rather than empty".into());
        }
        self.local_server.check()?;
        self.generation.check()
    }

    /// The hub settings from the environment, with the models folder the
    /// user chose in place of the shared cache.
    pub fn hub_config(&self, dirs: &DataDirs) -> HubConfig {
        let mut config = HubConfig::from_env(dirs);
        if let Some(folder) = &self.models_folder {
            config.cache_dir = folder.clone();
        }
        config
    }

    /// The prompt cache on disk these settings ask for, in `dirs`' folder
    /// (`None`: off).
    pub fn prompt_cache_settings(&self, dirs: &DataDirs) -> Option<DiskCacheSettings> {
        let folder = dirs.prompt_cache_dir();
        let free = crate::paths::free_disk_bytes(&folder);
        crate::session::prompt_cache::settings(folder, self.prompt_cache_budget_bytes, free)
    }

    /// The pool's policy these settings ask for.
    pub fn pool_settings(&self) -> PoolSettings {
        PoolSettings {
            keep_alive: match self.keep_alive_minutes {
                Some(minutes) => KeepAlive::For(Duration::from_secs(minutes * 60)),
                None => KeepAlive::Forever,
            },
            memory_budget_bytes: self.memory_budget_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_survive_a_restart_and_unknown_fields_do_not_break_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open_default(dir.path()).unwrap();
        assert_eq!(AppSettings::load(&store), AppSettings::default());
        let mine = AppSettings {
            keep_alive_minutes: None,
            memory_budget_bytes: Some(8 << 30),
            theme: Theme::Dark,
            ..AppSettings::default()
        };
        mine.save(&mut store).unwrap();
        drop(store);
        let store = Store::open_default(dir.path()).unwrap();
        assert_eq!(AppSettings::load(&store), mine);
        assert_eq!(mine.pool_settings().keep_alive, KeepAlive::Forever);
        let newer: AppSettings =
            serde_json::from_str(r#"{"theme": "light", "a_future_field": 1}"#).unwrap();
        assert_eq!(newer.theme, Theme::Light);
        assert_eq!(newer.keep_alive_minutes, Some(10));
    }

    #[test]
    fn bad_settings_are_named() {
        let zero = AppSettings {
            keep_alive_minutes: Some(0),
            ..AppSettings::default()
        };
        assert!(zero.check().unwrap_err().contains("keep-alive"));
        let tiny = AppSettings {
            memory_budget_bytes: Some(1),
            ..AppSettings::default()
        };
        assert!(tiny.check().unwrap_err().contains("budget"));
        let relative = AppSettings {
            models_folder: Some(PathBuf::from("models")),
            ..AppSettings::default()
        };
        assert!(relative.check().unwrap_err().contains("full path"));
        let blank = AppSettings {
            global_shortcut: Some("  ".into()),
            ..AppSettings::default()
        };
        assert!(blank.check().unwrap_err().contains("shortcut"));
    }

    #[test]
    fn the_local_server_is_off_by_default_on_the_servers_own_port() {
        let server = AppSettings::default().local_server;
        assert!(!server.enabled);
        assert_eq!(server.port, DEFAULT_PORT);
        assert_eq!(server.api_key, None);
        // Settings saved by an Ondo without the server read as off.
        let older: AppSettings = serde_json::from_str(r#"{"theme": "dark"}"#).unwrap();
        assert_eq!(older.local_server, LocalServerSettings::default());
    }

    #[test]
    fn the_key_stays_out_of_debug_output() {
        let server = LocalServerSettings {
            api_key: Some("sk-secret-1".into()),
            ..LocalServerSettings::default()
        };
        let settings = AppSettings {
            local_server: server,
            ..AppSettings::default()
        };
        let printed = format!("{settings:?}");
        assert!(!printed.contains("sk-secret-1"), "{printed}");
        assert!(printed.contains("(set)"), "{printed}");
    }

    #[test]
    fn bad_local_server_settings_are_named() {
        let check = |server: LocalServerSettings| {
            AppSettings {
                local_server: server,
                ..AppSettings::default()
            }
            .check()
        };
        let low = check(LocalServerSettings {
            port: 80,
            ..LocalServerSettings::default()
        });
        assert!(low.unwrap_err().contains("from 1024 to 65535"));
        assert!(
            check(LocalServerSettings {
                port: 0,
                ..LocalServerSettings::default()
            })
            .is_err()
        );
        let spaced = check(LocalServerSettings {
            api_key: Some("two words".into()),
            ..LocalServerSettings::default()
        });
        assert!(spaced.unwrap_err().contains("API key"));
        for origin in [
            "app.example",
            "https://app.example/page",
            "ftp://app.example",
            "https://",
            "https://app.example:99999",
            "https://a b.example",
            "https://[::1",
        ] {
            let refused = check(LocalServerSettings {
                allowed_origins: vec![origin.into()],
                ..LocalServerSettings::default()
            });
            assert!(
                refused.as_ref().is_err_and(|e| e.contains(origin)),
                "{origin}: {refused:?}"
            );
        }
        let fine = check(LocalServerSettings {
            enabled: true,
            port: 65535,
            api_key: Some("sk-ondo-abc_123".into()),
            allowed_origins: vec![
                "*".into(),
                "https://app.example".into(),
                "http://localhost:3000/".into(),
                "http://[::1]:8080".into(),
                "".into(),
            ],
        });
        assert_eq!(fine, Ok(()));
    }

    #[test]
    fn the_chosen_models_folder_replaces_the_shared_cache() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().as_os_str().to_owned();
        let dirs = DataDirs::from_lookup(|name| (name == "HF_HOME").then(|| home.clone()));
        let shared = AppSettings::default().hub_config(&dirs);
        assert_eq!(shared.cache_dir, dirs.hf_cache_dir);
        let chosen = AppSettings {
            models_folder: Some(dir.path().join("elsewhere")),
            ..AppSettings::default()
        };
        assert_eq!(
            chosen.hub_config(&dirs).cache_dir,
            dir.path().join("elsewhere")
        );
    }
}
