//! What can go wrong with the run history, each with what to do about it.

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

use super::BUSY_TIMEOUT;
use crate::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot create the folder {} for the run history ({source}): check that Ondo may write there",
        folder.display()
    )]
    CreateFolder {
        folder: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot open or write the run history at {} ({source}): check that the file and its folder are writable",
        path.display()
    )]
    CannotWrite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "{} is damaged or is not an SQLite database ({source}): move it aside (keep it if the history matters) and Ondo will start a new history there",
        path.display()
    )]
    Corrupt {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "{} was made by a newer Ondo (schema version {found}, this build knows up to {known}): update Ondo to keep using this history",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: u32,
        known: u32,
    },
    #[error(
        "the disk holding {} is full, so nothing was written to the run history: free some space and try again",
        path.display()
    )]
    DiskFull { path: PathBuf },
    #[error(
        "the run history at {} stayed locked by another Ondo process for over {} s: try again; if it keeps happening, quit the other Ondo processes (the app, or Ondo commands running in a terminal)",
        path.display(), BUSY_TIMEOUT.as_secs()
    )]
    Busy { path: PathBuf },
    #[error(
        "a run with id {run_id} is already recorded: run ids must be unique, so the caller made the same id twice (a bug; please report it)"
    )]
    DuplicateRun { run_id: String },
    #[error(
        "the run history at {} failed: {source} (a bug in Ondo if it happens again; please report it)",
        path.display()
    )]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

impl StoreError {
    /// A stable name for the app and the CLI's hints.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::CreateFolder { .. } | Self::CannotWrite { .. } => ErrorKind::HistoryUnwritable,
            Self::Corrupt { .. } => ErrorKind::HistoryCorrupt,
            Self::TooNew { .. } => ErrorKind::HistoryTooNew,
            Self::DiskFull { .. } => ErrorKind::DiskFull,
            Self::Busy { .. } => ErrorKind::HistoryBusy,
            Self::DuplicateRun { .. } | Self::Sqlite { .. } => ErrorKind::History,
        }
    }

    /// Names what SQLite reported in terms of what the user can do.
    pub(super) fn from_sqlite(path: &Path, source: rusqlite::Error) -> Self {
        let path = path.to_owned();
        match source.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                Self::Corrupt { path, source }
            }
            Some(ErrorCode::DiskFull) => Self::DiskFull { path },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Self::Busy { path },
            Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
                Self::CannotWrite { path, source }
            }
            _ => Self::Sqlite { path, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_failure(code: std::ffi::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn sqlite_codes_become_errors_that_say_what_to_do() {
        let path = Path::new("/data/ondo.sqlite3");
        let full = StoreError::from_sqlite(path, sqlite_failure(rusqlite::ffi::SQLITE_FULL));
        assert!(matches!(full, StoreError::DiskFull { .. }));
        assert!(full.to_string().contains("free some space"), "{full}");

        let corrupt = StoreError::from_sqlite(path, sqlite_failure(rusqlite::ffi::SQLITE_NOTADB));
        let message = corrupt.to_string();
        assert!(matches!(corrupt, StoreError::Corrupt { .. }));
        assert!(message.contains("/data/ondo.sqlite3"), "{message}");
        assert!(message.contains("move it aside"), "{message}");

        let busy = StoreError::from_sqlite(path, sqlite_failure(rusqlite::ffi::SQLITE_BUSY));
        assert!(matches!(busy, StoreError::Busy { .. }));

        let read_only =
            StoreError::from_sqlite(path, sqlite_failure(rusqlite::ffi::SQLITE_READONLY));
        assert!(read_only.to_string().contains("writable"), "{read_only}");
        assert_eq!(read_only.kind(), ErrorKind::HistoryUnwritable);
    }

    /// The kind of each variant. Exhaustive: a new variant does not compile
    /// until it has a line here; give it an example in `one_of_each` too.
    fn kind_name(error: &StoreError) -> &'static str {
        match error {
            StoreError::CreateFolder { .. } => "history_unwritable",
            StoreError::CannotWrite { .. } => "history_unwritable",
            StoreError::Corrupt { .. } => "history_corrupt",
            StoreError::TooNew { .. } => "history_too_new",
            StoreError::DiskFull { .. } => "disk_full",
            StoreError::Busy { .. } => "history_busy",
            StoreError::DuplicateRun { .. } => "history",
            StoreError::Sqlite { .. } => "history",
        }
    }

    fn one_of_each() -> Vec<StoreError> {
        let path = || PathBuf::from("/data/ondo.sqlite3");
        vec![
            StoreError::CreateFolder {
                folder: "/data".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            },
            StoreError::CannotWrite {
                path: path(),
                source: sqlite_failure(rusqlite::ffi::SQLITE_READONLY),
            },
            StoreError::Corrupt {
                path: path(),
                source: sqlite_failure(rusqlite::ffi::SQLITE_NOTADB),
            },
            StoreError::TooNew {
                path: path(),
                found: 9,
                known: 4,
            },
            StoreError::DiskFull { path: path() },
            StoreError::Busy { path: path() },
            StoreError::DuplicateRun {
                run_id: "r-1".into(),
            },
            StoreError::Sqlite {
                path: path(),
                source: sqlite_failure(rusqlite::ffi::SQLITE_MISMATCH),
            },
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        crate::error_kind::check_layer(&one_of_each(), |e| e.kind(), kind_name);
    }
}
