//! A model folder on disk turned into a served repo: file list, sizes, hashes
//! and a commit sha that changes exactly when the content does.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// Files at least this big are stored in LFS on the real hub, whatever their name.
const LFS_MIN_BYTES: u64 = 10 * 1024 * 1024;

/// A repo as the server sees it, fixed at the time of `TestHub::add_repo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRepo {
    /// `org/name`.
    pub repo_id: String,
    /// 40 hex digits; `main` and this sha both resolve.
    pub commit: String,
    /// Sorted by `path`.
    pub files: Vec<ServedFile>,
}

/// One file of a served repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedFile {
    /// Relative to the repo root, with '/' separators.
    pub path: String,
    /// Where the bytes are read from on every request.
    pub disk_path: PathBuf,
    pub size_bytes: u64,
    /// 64 hex digits of the content's sha256.
    pub sha256: String,
    /// The git blob id (sha1 of `blob <size>\0` and the bytes) of what git
    /// stores: the content itself, or for an LFS file its pointer file.
    pub blob_id: String,
    /// Served through a redirect to `/storage/{sha256}`, as the hub does for LFS files.
    pub lfs: bool,
}

impl ServedRepo {
    /// Reads and hashes every file under `folder`. The files must not change
    /// afterwards: they are served from disk against these hashes.
    pub(crate) fn scan(repo_id: &str, folder: &Path) -> io::Result<ServedRepo> {
        if !is_valid_repo_id(repo_id) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("repo id {repo_id:?} is not of the form org/name"),
            ));
        }
        let mut files = Vec::new();
        collect_files(folder, "", &mut files)?;
        files.sort_by(|a, b| a.path.cmp(&b.path));

        let mut commit = Sha256::new();
        for file in &files {
            commit.update(file.path.as_bytes());
            commit.update([0]);
            commit.update(file.sha256.as_bytes());
            commit.update([b'\n']);
        }
        let commit = hex(&commit.finalize())[..40].to_string();
        Ok(ServedRepo {
            repo_id: repo_id.to_string(),
            commit,
            files,
        })
    }
}

/// `org/name` with two non-empty parts and no `..` anywhere.
pub(crate) fn is_valid_repo_id(repo_id: &str) -> bool {
    match repo_id.split_once('/') {
        Some((org, name)) => {
            !org.is_empty() && !name.is_empty() && !name.contains('/') && !repo_id.contains("..")
        }
        None => false,
    }
}

fn collect_files(dir: &Path, prefix: &str, files: &mut Vec<ServedFile>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{prefix}{name}");
        let disk_path = entry.path();
        // fs::metadata follows symlinks, so linked model files are served too.
        let metadata = fs::metadata(&disk_path)?;
        if metadata.is_dir() {
            collect_files(&disk_path, &format!("{path}/"), files)?;
            continue;
        }
        let size_bytes = metadata.len();
        let bytes = fs::read(&disk_path)?;
        let sha256 = hex(&Sha256::digest(&bytes));
        let lfs = name.ends_with(".safetensors") || size_bytes >= LFS_MIN_BYTES;
        let blob_id = if lfs {
            git_blob_id(lfs_pointer(&sha256, size_bytes).as_bytes())
        } else {
            git_blob_id(&bytes)
        };
        files.push(ServedFile {
            lfs,
            blob_id,
            sha256,
            size_bytes,
            disk_path,
            path,
        });
    }
    Ok(())
}

/// The file git stores in place of an LFS file's content.
pub(crate) fn lfs_pointer(sha256: &str, size_bytes: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size_bytes}\n")
}

/// The name git gives a blob: sha1 over `blob <size>\0` and the bytes.
pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hex(&hasher.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex sha256 of a string, for ids that only need to be stable.
pub(crate) fn sha256_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_need_org_and_name_without_dotdot() {
        assert!(is_valid_repo_id("mlx-community/Qwen3-0.6B-4bit"));
        assert!(!is_valid_repo_id("noslash"));
        assert!(!is_valid_repo_id("a/b/c"));
        assert!(!is_valid_repo_id("/b"));
        assert!(!is_valid_repo_id("a/.."));
        assert!(!is_valid_repo_id("../b"));
    }

    #[test]
    fn commit_follows_content() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("config.json"), b"{}").unwrap();
        fs::write(dir.path().join("sub/model.safetensors"), b"weights").unwrap();
        let first = ServedRepo::scan("org/name", dir.path()).unwrap();
        let again = ServedRepo::scan("org/name", dir.path()).unwrap();
        assert_eq!(first.commit, again.commit);
        assert_eq!(first.commit.len(), 40);
        let paths: Vec<_> = first.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["config.json", "sub/model.safetensors"]);
        assert!(!first.files[0].lfs);
        assert!(first.files[1].lfs);

        // Blob ids are git's: `git hash-object` gives the same.
        assert_eq!(
            first.files[0].blob_id,
            "9e26dfeeb6e641a33dae4961196235bdb965b21b"
        );
        assert_eq!(first.files[0].blob_id, git_blob_id(b"{}"));

        fs::write(dir.path().join("config.json"), b"{\"a\":1}").unwrap();
        let changed = ServedRepo::scan("org/name", dir.path()).unwrap();
        assert_ne!(first.commit, changed.commit);
    }
}
