//! Where Ondo keeps its files: its own data folder and the shared Hugging Face
//! cache, each overridable through the environment the way users expect.

use std::path::{Path, PathBuf};

/// The folders Ondo reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DataDirs {
    /// Ondo's own data (run history, settings, built-in models): `ONDO_HOME`,
    /// else the platform's application-data folder plus `ondo`.
    pub data_dir: PathBuf,
    /// Models Ondo made itself (the built-in tiny model) or that the user added.
    pub models_dir: PathBuf,
    /// The Hugging Face hub cache shared with mlx-lm and transformers:
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub hf_cache_dir: PathBuf,
}

impl DataDirs {
    /// Where prompt caches saved to the disk go.
    pub fn prompt_cache_dir(&self) -> PathBuf {
        self.data_dir.join("prompt-cache")
    }

    /// Resolves the folders from the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var_os(name).filter(|v| !v.is_empty()))
    }

    /// Resolves the folders from any environment lookup (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> Self {
        let home = dirs::home_dir().unwrap_or_else(|| PathBuf::from("."));
        let data_dir = lookup(crate::environment::HOME.name)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                dirs::data_dir()
                    .unwrap_or_else(|| home.join(".local/share"))
                    .join("ondo")
            });
        let hf_cache_dir = lookup("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| lookup("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
            .unwrap_or_else(|| home.join(".cache/huggingface/hub"));
        Self {
            models_dir: data_dir.join("models"),
            data_dir,
            hf_cache_dir,
        }
    }
}

/// Free bytes for an unprivileged user on the filesystem holding `path` (or
/// its nearest existing parent).
pub fn free_disk_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    statvfs_available(existing)
}

#[cfg(unix)]
fn statvfs_available(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer of the right type;
    // the struct is read only when the call succeeded.
    let stats = unsafe {
        if libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return None;
        }
        stats.assume_init()
    };
    #[allow(clippy::unnecessary_cast)] // the field types differ between Linux and macOS
    Some(stats.f_bavail as u64 * stats.f_frsize as u64)
}

#[cfg(not(unix))]
fn statvfs_available(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn dirs_with(vars: &[(&str, &str)]) -> DataDirs {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        DataDirs::from_lookup(|name| map.get(name).map(Into::into))
    }

    #[test]
    fn ondo_home_moves_all_of_ondos_own_data() {
        let dirs = dirs_with(&[("ONDO_HOME", "/tmp/o")]);
        assert_eq!(dirs.data_dir, PathBuf::from("/tmp/o"));
        assert_eq!(dirs.models_dir, PathBuf::from("/tmp/o/models"));
    }

    #[test]
    fn hub_cache_follows_the_python_tools_precedence() {
        let dirs = dirs_with(&[("HF_HOME", "/h"), ("HF_HUB_CACHE", "/c")]);
        assert_eq!(dirs.hf_cache_dir, PathBuf::from("/c"));
        let dirs = dirs_with(&[("HF_HOME", "/h")]);
        assert_eq!(dirs.hf_cache_dir, PathBuf::from("/h/hub"));
        let dirs = dirs_with(&[]);
        assert!(dirs.hf_cache_dir.ends_with(".cache/huggingface/hub"));
    }
}
