//! The prompt cache on disk as the pool sets it up: where it lives (the
//! `prompt-cache` folder of Ondo's data folder), its budget, and how much
//! of a prompt is worth a file. The engine saves and reads the files
//! (`engine::disk_cache`); this side only decides the settings and offers
//! the listing, the size and the clearing that the CLI and the app show.

use std::path::Path;

use crate::engine::disk_cache::{self, DEFAULT_MIN_TOKENS, DiskCacheSettings, SavedPrefix};
use crate::environment;
use crate::paths::{DataDirs, free_disk_bytes};

/// The settings for `dirs` with `budget_bytes` (`None`: the smaller of 20
/// GiB and a quarter of the free space; `Some(0)`: off). `None` when the
/// cache is off (a zero budget, or `ONDO_PROMPT_CACHE=0`).
pub fn settings_for(dirs: &DataDirs, budget_bytes: Option<u64>) -> Option<DiskCacheSettings> {
    if environment::PROMPT_CACHE.switch() == Some(false) || budget_bytes == Some(0) {
        return None;
    }
    let folder = dirs.prompt_cache_dir();
    let budget_bytes =
        budget_bytes.unwrap_or_else(|| disk_cache::default_budget(free_disk_bytes(&folder)));
    Some(DiskCacheSettings {
        folder,
        budget_bytes,
        min_tokens: environment::PROMPT_CACHE_MIN_TOKENS
            .parsed()
            .unwrap_or(DEFAULT_MIN_TOKENS),
    })
}

/// What the folder holds now, for Settings and `ondo cache`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PromptCacheStatus {
    pub folder: std::path::PathBuf,
    /// Bytes its files take now.
    pub bytes: u64,
    /// The budget in force (the default's value when none is set).
    pub budget_bytes: u64,
    pub enabled: bool,
    pub saved: Vec<SavedPrefix>,
}

pub fn status(dirs: &DataDirs, budget_bytes: Option<u64>) -> PromptCacheStatus {
    let folder = dirs.prompt_cache_dir();
    let settings = settings_for(dirs, budget_bytes);
    PromptCacheStatus {
        bytes: disk_cache::folder_bytes(&folder),
        budget_bytes: settings.as_ref().map_or(0, |s| s.budget_bytes),
        enabled: settings.is_some(),
        saved: disk_cache::list(&folder),
        folder,
    }
}

/// Removes the saved caches of the model in `model_dir` (every one when
/// `None`); returns how many files went.
pub fn clear(dirs: &DataDirs, model_dir: Option<&Path>) -> usize {
    disk_cache::remove(&dirs.prompt_cache_dir(), model_dir)
}
