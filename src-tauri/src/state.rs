//! What the app keeps for its whole life: the session pool (one engine,
//! warm models, the run history) and the hub client, plus the downloads in
//! flight so they can be cancelled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ondo::engine::{CancelToken, EngineHandle};
use ondo::hub::{DownloadCancel, Hub, HubConfig};
use ondo::paths::DataDirs;
use ondo::session::SessionPool;
use ondo::store::Store;

pub struct AppState {
    pub pool: Arc<SessionPool>,
    pub hub: Hub,
    pub downloads: Mutex<HashMap<String, DownloadCancel>>,
    /// The answer being written in each conversation, to stop it.
    pub chats: Mutex<HashMap<String, CancelToken>>,
}

impl AppState {
    /// Starts the engine and opens the history; a history that cannot be
    /// opened leaves the app working without one (and says why on stderr).
    pub fn start(engine: EngineHandle) -> Result<Self, String> {
        let dirs = DataDirs::from_env();
        let store = match Store::open_default(&dirs.data_dir) {
            Ok(store) => Some(store),
            Err(err) => {
                eprintln!("ondo-app: runs will not be recorded: {err}");
                None
            }
        };
        // The pool starts with the policy the user saved.
        let pool_settings = store
            .as_ref()
            .map(|s| ondo::session::settings::AppSettings::load(s).pool_settings())
            .unwrap_or_default();
        let hub = Hub::new(HubConfig::from_env(&dirs)).map_err(|e| e.to_string())?;
        Ok(Self {
            pool: Arc::new(SessionPool::new(engine, pool_settings, store)),
            hub,
            downloads: Mutex::new(HashMap::new()),
            chats: Mutex::new(HashMap::new()),
        })
    }
}
