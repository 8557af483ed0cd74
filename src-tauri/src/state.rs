//! What the app keeps for its whole life: the session pool (one engine,
//! warm models, the run history) and the hub client, plus the downloads,
//! answers and benchmark in flight so they can be stopped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use ondo::app_settings::AppSettings;
use ondo::engine::CancelToken;
use ondo::hub::{DownloadCancel, Hub};
use ondo::metallib::MetalError;
use ondo::paths::DataDirs;
use ondo::served_split::ServedSplit;
use ondo::session::{PressureSource, SessionPool};
use ondo::store::Store;

use crate::server::AppServer;

pub struct AppState {
    pub pool: Arc<SessionPool>,
    /// Rebuilt when the user picks another models folder.
    hub: RwLock<Hub>,
    pub downloads: Mutex<HashMap<String, DownloadCancel>>,
    /// The answer being written in each conversation, to stop it.
    pub chats: Mutex<HashMap<String, CancelToken>>,
    /// The benchmark running now (one at a time: two would measure each other).
    pub bench: Mutex<Option<CancelToken>>,
    /// Why MLX cannot use this Mac's GPU, as the start-up check found it (no
    /// Metal device, no kernels): the popover says so at the top. `None`
    /// when MLX works, and always where MLX has no Metal backend.
    pub mlx_problem: Option<MetalError>,
    /// The local server for other programs (when Settings turn it on).
    pub server: Arc<AppServer>,
    /// The model split over several machines, run by a child process (one
    /// at a time), or how the last one ended.
    pub split: Mutex<Option<Arc<ServedSplit>>>,
}

impl AppState {
    /// Opens the history and starts the session pool with its engine (the
    /// one way into the engine: every command's run goes through the pool),
    /// reading memory pressure from `pressure`, then checks through it that
    /// MLX can use this Mac's GPU; a history that cannot be opened leaves the
    /// app working without one (and says why on stderr).
    pub fn start(pressure: PressureSource) -> Result<Self, String> {
        let dirs = DataDirs::from_env();
        let store = match Store::open_default(&dirs.data_dir) {
            Ok(store) => Some(store),
            Err(err) => {
                eprintln!("ondo-app: runs will not be recorded: {err}");
                None
            }
        };
        // The pool and the hub start with what the user saved.
        let settings = store.as_ref().map(AppSettings::load).unwrap_or_default();
        let hub = Hub::new(settings.hub_config(&dirs)).map_err(|e| e.to_string())?;
        let pool =
            SessionPool::start_with_pressure_source(settings.pool_settings(), store, pressure)
                .map_err(|e| e.to_string())?;
        // The first MLX work: on a Mac it creates MLX's Metal device and loads
        // its kernels, so a bundle without them is reported here, with where
        // they were looked for, instead of failing at the first model.
        let mlx_problem = pool
            .call(ondo::metallib::check)
            .map_err(|e| e.to_string())?
            .err();
        if let Some(problem) = &mlx_problem {
            eprintln!("ondo-app: {problem}");
        }
        if let Err(error) = pool.set_prompt_cache(settings.prompt_cache_settings(&dirs)) {
            eprintln!("ondo-app: the prompt cache on disk is off: {error}");
        }
        let pool = Arc::new(pool);
        // The server starts with the app when it is turned on; one that
        // cannot (its port taken) leaves the app running and the popover
        // saying why.
        let server = Arc::new(AppServer::default());
        if let Err(error) = server.apply(&pool, &settings.local_server) {
            eprintln!("ondo-app: the local server did not start: {error}");
        }
        Ok(Self {
            pool,
            hub: RwLock::new(hub),
            downloads: Mutex::new(HashMap::new()),
            chats: Mutex::new(HashMap::new()),
            bench: Mutex::new(None),
            mlx_problem,
            server,
            split: Mutex::new(None),
        })
    }

    /// The split run now or last (a cheap clone of the handle).
    pub fn split(&self) -> Option<Arc<ServedSplit>> {
        self.split.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The split that runs `model` (as the chat names it), unless it ended:
    /// the chat's turns with that model go to it.
    pub fn split_running(&self, model: &str) -> Option<Arc<ServedSplit>> {
        self.split().filter(|split| {
            split.runs(model)
                && !matches!(
                    split.status().state,
                    ondo::served_split::SplitState::Ended { .. }
                )
        })
    }

    /// The hub client (a cheap clone, so no lock is held across an await).
    pub fn hub(&self) -> Hub {
        self.hub.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Points downloads and the library at the models folder `settings`
    /// name (created if missing); true when it changed.
    pub fn apply_models_folder(&self, settings: &AppSettings) -> Result<bool, String> {
        let config = settings.hub_config(&DataDirs::from_env());
        if config.cache_dir == self.hub().config().cache_dir {
            return Ok(false);
        }
        std::fs::create_dir_all(&config.cache_dir).map_err(|e| {
            format!(
                "the models folder {} cannot be used ({e}); choose another",
                config.cache_dir.display()
            )
        })?;
        let hub = Hub::new(config).map_err(|e| e.to_string())?;
        *self.hub.write().unwrap_or_else(|p| p.into_inner()) = hub;
        Ok(true)
    }

    /// Ondo's folders with the Hugging Face cache replaced by the models
    /// folder in use.
    pub fn dirs(&self) -> DataDirs {
        DataDirs {
            hf_cache_dir: self.hub().config().cache_dir.clone(),
            ..DataDirs::from_env()
        }
    }
}
