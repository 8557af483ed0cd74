//! The settings a user changes in the app, kept in the run history's
//! settings table so the app and the command line share them.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::chat::GenerationSettings;
use super::{KeepAlive, PoolSettings};
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
}

/// The popover's shortcut until the user picks another.
pub const DEFAULT_GLOBAL_SHORTCUT: &str = "CommandOrControl+Shift+O";

impl Default for AppSettings {
    fn default() -> Self {
        Self {
            keep_alive_minutes: Some(10),
            memory_budget_bytes: None,
            generation: GenerationSettings::default(),
            theme: Theme::System,
            models_folder: None,
            launch_at_login: false,
            global_shortcut: Some(DEFAULT_GLOBAL_SHORTCUT.to_owned()),
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
        self.generation.check()
    }

    /// The hub settings from the environment, with the models folder the
    /// user chose in place of the shared cache.
    pub fn hub_config(&self, dirs: &crate::paths::DataDirs) -> crate::hub::HubConfig {
        let mut config = crate::hub::HubConfig::from_env(dirs);
        if let Some(folder) = &self.models_folder {
            config.cache_dir = folder.clone();
        }
        config
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
    fn the_chosen_models_folder_replaces_the_shared_cache() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().as_os_str().to_owned();
        let dirs =
            crate::paths::DataDirs::from_lookup(|name| (name == "HF_HOME").then(|| home.clone()));
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
