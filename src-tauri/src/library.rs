//! What the Models section shows: the models already in the Hugging Face cache
//! (read by the core's library) and the catalog's recommended download.

use std::path::PathBuf;

use ondo::hub::{catalog, library};
use ondo::paths::DataDirs;

/// The catalog's default model (DESIGN.md): small enough for most Macs, good
/// enough to chat with.
pub const RECOMMENDED_MODEL_ID: &str = catalog::DEFAULT_MODEL;

/// The local library as the UI sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, specta::Type)]
pub struct LibraryStatus {
    /// Repo ids (`ORG/NAME`) with a complete snapshot in the hub cache, sorted.
    pub downloaded: Vec<String>,
    /// What the UI offers to download first.
    pub recommended_model_id: String,
    /// False until the app has its download screen (the core and `ondo pull`
    /// can download); the UI disables the button.
    pub downloads_available: bool,
    /// Where Ondo keeps models it made itself (the built-in tiny model).
    pub models_dir: PathBuf,
    /// The hub cache shared with mlx-lm and transformers.
    pub hf_cache_dir: PathBuf,
}

impl LibraryStatus {
    /// Reads the library from disk. A missing cache folder is an empty library.
    pub fn read(dirs: &DataDirs) -> Self {
        Self {
            downloaded: library::scan_hub_cache(&dirs.hf_cache_dir)
                .into_iter()
                .filter(|model| model.complete)
                .map(|model| model.id)
                .collect(),
            recommended_model_id: RECOMMENDED_MODEL_ID.to_owned(),
            downloads_available: false,
            models_dir: dirs.models_dir.clone(),
            hf_cache_dir: dirs.hf_cache_dir.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    fn dirs_in(root: &Path) -> DataDirs {
        DataDirs {
            data_dir: root.join("ondo"),
            models_dir: root.join("ondo/models"),
            hf_cache_dir: root.join("hub"),
        }
    }

    fn add_snapshot(hub: &Path, folder: &str, with_config: bool) {
        let snapshot = hub.join(folder).join("snapshots/0123abcd");
        fs::create_dir_all(&snapshot).unwrap();
        if with_config {
            fs::write(snapshot.join("config.json"), "{}").unwrap();
            fs::write(snapshot.join("model.safetensors"), b"").unwrap();
        }
    }

    #[test]
    fn a_missing_cache_is_an_empty_library() {
        let root = tempfile::tempdir().unwrap();
        let status = LibraryStatus::read(&dirs_in(root.path()));
        assert!(status.downloaded.is_empty());
        assert_eq!(status.recommended_model_id, RECOMMENDED_MODEL_ID);
        assert!(!status.downloads_available);
    }

    #[test]
    fn lists_models_with_a_loadable_snapshot_only() {
        let root = tempfile::tempdir().unwrap();
        let hub = root.path().join("hub");
        add_snapshot(&hub, "models--mlx-community--Qwen3-0.6B-4bit", true);
        add_snapshot(&hub, "models--acme--half-downloaded", false);
        add_snapshot(&hub, "datasets--acme--not-a-model", true);
        add_snapshot(
            &hub,
            "models--mlx-community--Llama-3.2-1B-Instruct-4bit",
            true,
        );
        let status = LibraryStatus::read(&dirs_in(root.path()));
        assert_eq!(
            status.downloaded,
            [
                "mlx-community/Llama-3.2-1B-Instruct-4bit",
                "mlx-community/Qwen3-0.6B-4bit",
            ]
        );
    }
}
