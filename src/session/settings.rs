//! The settings a user changes in the app, kept in the run history's
//! settings table so the app and the command line share them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::chat::GenerationSettings;
use super::{KeepAlive, PoolSettings};
use crate::store::{Store, StoreError};

const SETTINGS_KEY: &str = "app_settings";

/// Light, dark, or whatever the system uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Theme {
    #[default]
    System,
    Light,
    Dark,
}

/// Everything the Settings screen shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

impl Default for AppSettings {
    fn default() -> Self {
        Self {
            keep_alive_minutes: Some(10),
            memory_budget_bytes: None,
            generation: GenerationSettings::default(),
            theme: Theme::System,
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
        self.generation.check()
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
    }
}
