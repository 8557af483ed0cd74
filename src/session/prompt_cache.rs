//! The prompt cache on disk as the CLI and the app show it: what the
//! folder holds, and clearing it. The engine saves and reads the files
//! (`engine::disk_cache`); the pool hands it the settings
//! (`SessionPool::set_prompt_cache`), which the caller makes from Ondo's
//! folders and the user's budget (`app_settings::prompt_cache_settings`).

use std::path::{Path, PathBuf};

use crate::engine::disk_cache;
pub use crate::engine::disk_cache::{DiskCacheSettings, SavedPrefix, settings};

/// What the folder holds now, for Settings and `ondo cache`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PromptCacheStatus {
    pub folder: PathBuf,
    /// Bytes its files take now.
    pub bytes: u64,
    /// The budget in force (the default's value when none is set).
    pub budget_bytes: u64,
    pub enabled: bool,
    pub saved: Vec<SavedPrefix>,
}

/// What `folder` holds, under `settings` (`None`: the cache is off).
pub fn status(folder: &Path, settings: Option<&DiskCacheSettings>) -> PromptCacheStatus {
    PromptCacheStatus {
        folder: folder.to_owned(),
        bytes: disk_cache::folder_bytes(folder),
        budget_bytes: settings.map_or(0, |s| s.budget_bytes),
        enabled: settings.is_some(),
        saved: disk_cache::list(folder),
    }
}

/// Removes the saved caches in `folder` of the model in `model_dir` (every
/// one when `None`); returns how many files went.
pub fn clear(folder: &Path, model_dir: Option<&Path>) -> usize {
    disk_cache::remove(folder, model_dir)
}
