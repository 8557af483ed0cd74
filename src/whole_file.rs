//! Writing a file the user keeps (a report, the list of model folders) so
//! that it is replaced in one step: whoever reads it, and whatever happens
//! during the write (a full disk, a writer that fails half-way, a crash),
//! finds the old file or the new one, never half of the new.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Replaces `path` with `bytes` in one step (see `write_atomically_with`).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(path, |file| file.write_all(bytes))
}

/// Replaces `path` with what `write` writes, in one step: `write` fills a
/// temporary file in the same folder, which is flushed to the disk and then
/// renamed over `path` (a rename within one folder is atomic). When `write`
/// or any step fails, the temporary file is removed and `path` keeps what
/// it held.
pub fn write_atomically_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let temporary = temporary_beside(path)?;
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        write(&mut file)?;
        // On the disk before the rename, so a crash cannot leave the new
        // name on an empty file.
        file.sync_all()?;
        drop(file);
        fs::rename(&temporary, path)?;
        // The rename itself lives in the folder; best effort, since some
        // file systems cannot sync a folder.
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty())
            && let Ok(folder) = File::open(folder)
        {
            let _ = folder.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

/// A name in `path`'s folder that no other writer uses: hidden, with this
/// process's id and a count, so two writes at once never share one.
fn temporary_beside(path: &Path) -> io::Result<PathBuf> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names a folder, not a file", path.display()),
        )
    })?;
    let write = WRITES.fetch_add(1, Ordering::Relaxed);
    Ok(path.with_file_name(format!(
        ".{}.{}-{write}.partial",
        name.to_string_lossy(),
        std::process::id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(folder: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_new_bytes_replace_the_old_and_nothing_else_is_left() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("report.md");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second, longer").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second, longer");
        assert_eq!(entries(folder.path()), ["report.md"]);
    }

    #[test]
    fn a_write_that_fails_half_way_leaves_the_old_file_intact() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("report.html");
        fs::write(&path, b"the old report").unwrap();
        let error = write_atomically_with(&path, |file| {
            file.write_all(b"<html>half of a new rep")?;
            Err(io::Error::other("the disk is full"))
        })
        .unwrap_err();
        assert_eq!(error.to_string(), "the disk is full");
        assert_eq!(fs::read(&path).unwrap(), b"the old report");
        assert_eq!(
            entries(folder.path()),
            ["report.html"],
            "a temporary file was left"
        );
    }

    #[test]
    fn a_rename_that_fails_leaves_the_old_file_and_no_temporary() {
        let folder = tempfile::tempdir().unwrap();
        // A folder cannot be replaced by a file: the rename fails after the
        // bytes were written.
        let path = folder.path().join("runs.csv");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("kept"), b"old").unwrap();
        assert!(write_atomically(&path, b"a,b\n").is_err());
        assert_eq!(fs::read(path.join("kept")).unwrap(), b"old");
        assert_eq!(entries(folder.path()), ["runs.csv"]);
    }

    #[test]
    fn a_missing_folder_is_an_error_and_creates_nothing() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("not-here/report.json");
        let error = write_atomically(&path, b"{}").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(entries(folder.path()), Vec::<String>::new());
    }
}
