//! The database's shape: versioned migrations keyed by `PRAGMA user_version`,
//! then the `runs` columns and indexes that follow RunRecord.
//!
//! Two mechanisms on purpose. A structural change (a new table, a rename) is
//! a migration and bumps the version, and an older Ondo then refuses the file.
//! A new RunRecord field is only a new nullable-or-defaulted column, added at
//! open without a version bump, so an older Ondo keeps reading and writing
//! the same history (the same rule as RECORD_SCHEMA_VERSION).

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;
use super::columns::run_column_types;

/// Schema steps in order; a database's `user_version` is how many it has
/// applied. Append, never edit: a released step has already run on users'
/// machines.
const MIGRATIONS: &[&str] = &[
    // 1. `runs` starts with its key only: its other columns come from
    // RunRecord's field list (`add_run_columns`).
    "CREATE TABLE runs (
        run_id TEXT PRIMARY KEY NOT NULL
    ) STRICT;

    CREATE TABLE memory_samples (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        -- position in the timeline: t_ms alone may repeat
        seq INTEGER NOT NULL,
        t_ms REAL,
        level TEXT NOT NULL,
        used_bytes INTEGER NOT NULL,
        app_bytes INTEGER NOT NULL,
        wired_bytes INTEGER NOT NULL,
        compressed_bytes INTEGER NOT NULL,
        swap_used_bytes INTEGER NOT NULL,
        footprint_bytes INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE conversations (
        conversation_id TEXT PRIMARY KEY NOT NULL,
        model_id TEXT NOT NULL,
        title TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT;

    CREATE TABLE pool_events (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        model_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        bytes INTEGER
    ) STRICT;

    CREATE TABLE settings (
        key TEXT PRIMARY KEY NOT NULL,
        value TEXT NOT NULL
    ) STRICT;",
];

/// The `user_version` this build writes and the newest it can read.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Indexes on `runs`: (name, columns). They live here, not in a migration,
/// because on a fresh database the columns appear only after the migrations.
/// `created_at, run_id`: runs are listed in time order, ties by id.
const RUN_INDEXES: &[(&str, &str)] = &[
    ("runs_by_created_at", "created_at, run_id"),
    ("runs_by_model_id", "model_id"),
    ("runs_by_bench_id", "bench_id"),
    ("runs_by_conversation_id", "conversation_id"),
];

/// Brings the database at `path` up to this build's schema. Safe when several
/// processes open it at once: each step takes the write lock, then looks
/// again at what is left to do.
pub(super) fn prepare(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let fail = |error| StoreError::from_sqlite(path, error);
    let found = user_version(conn).map_err(fail)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = step as u32 + 1;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        if user_version(&tx).map_err(fail)? < version {
            tx.execute_batch(sql).map_err(fail)?;
            tx.pragma_update(None, "user_version", version)
                .map_err(fail)?;
        }
        tx.commit().map_err(fail)?;
    }
    if runs_table_is_current(conn).map_err(fail)? {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail)?;
    add_run_columns(&tx).map_err(fail)?;
    tx.commit().map_err(fail)
}

fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

fn existing_run_columns(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut statement = conn.prepare("SELECT name FROM pragma_table_info('runs')")?;
    statement.query_map([], |row| row.get(0))?.collect()
}

fn existing_run_indexes(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut statement = conn.prepare("SELECT name FROM pragma_index_list('runs')")?;
    statement.query_map([], |row| row.get(0))?.collect()
}

fn runs_table_is_current(conn: &Connection) -> rusqlite::Result<bool> {
    let columns = existing_run_columns(conn)?;
    let indexes = existing_run_indexes(conn)?;
    Ok(run_column_types()
        .iter()
        .all(|column| columns.iter().any(|c| c == column.name))
        && RUN_INDEXES
            .iter()
            .all(|(name, _)| indexes.iter().any(|i| i == name)))
}

/// Adds RunRecord's columns that the table lacks (all of them on a fresh
/// database), then the indexes over them.
fn add_run_columns(conn: &Connection) -> rusqlite::Result<()> {
    let existing = existing_run_columns(conn)?;
    for column in run_column_types() {
        if !existing.iter().any(|name| name == column.name) {
            conn.execute(
                &format!(
                    "ALTER TABLE runs ADD COLUMN \"{}\" {}",
                    column.name,
                    column.definition()
                ),
                [],
            )?;
        }
    }
    for (name, columns) in RUN_INDEXES {
        conn.execute(
            &format!("CREATE INDEX IF NOT EXISTS {name} ON runs ({columns})"),
            [],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RUN_COLUMNS;

    fn fresh() -> (tempfile::TempDir, Connection, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ondo.sqlite3");
        let mut conn = Connection::open(&path).unwrap();
        prepare(&mut conn, &path).unwrap();
        (dir, conn, path)
    }

    #[test]
    fn a_fresh_database_has_the_latest_version_and_every_run_column() {
        let (_dir, conn, _) = fresh();
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        // Name, declared type and NOT NULL as the field list says.
        let mut statement = conn
            .prepare("SELECT name, type, \"notnull\" FROM pragma_table_info('runs') ORDER BY cid")
            .unwrap();
        let table: Vec<(String, String, bool)> = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected: Vec<(String, String, bool)> = run_column_types()
            .iter()
            .map(|c| {
                let not_null = c.default.is_some();
                (c.name.to_owned(), c.sql_type.to_owned(), not_null)
            })
            .collect();
        assert_eq!(table, expected);
        assert_eq!(table.len(), RUN_COLUMNS.len());
        assert!(runs_table_is_current(&conn).unwrap());
    }

    #[test]
    fn preparing_again_changes_nothing() {
        let (_dir, mut conn, path) = fresh();
        let schema = |conn: &Connection| -> Vec<String> {
            let mut statement = conn
                .prepare("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
                .unwrap();
            statement
                .query_map([], |row| row.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let before = schema(&conn);
        let changes_before = conn.total_changes();
        prepare(&mut conn, &path).unwrap();
        assert_eq!(schema(&conn), before);
        assert_eq!(conn.total_changes(), changes_before);
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let (_dir, mut conn, path) = fresh();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let error = prepare(&mut conn, &path).unwrap_err();
        assert!(
            matches!(error, StoreError::TooNew { found, known, .. } if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION)
        );
        let message = error.to_string();
        assert!(message.contains("made by a newer Ondo"), "{message}");
        assert!(
            message.contains("update Ondo to keep using this history"),
            "{message}"
        );
    }

    #[test]
    fn a_column_missing_from_an_older_database_is_added_with_its_default() {
        let (_dir, mut conn, path) = fresh();
        conn.execute("INSERT INTO runs (run_id) VALUES ('r-old')", [])
            .unwrap();
        // What a database made before these fields existed looks like.
        conn.execute_batch(
            "DROP INDEX runs_by_model_id;
             ALTER TABLE runs DROP COLUMN model_id;
             ALTER TABLE runs DROP COLUMN seed;",
        )
        .unwrap();
        assert!(!runs_table_is_current(&conn).unwrap());
        prepare(&mut conn, &path).unwrap();
        assert!(runs_table_is_current(&conn).unwrap());
        let (model_id, seed): (String, Option<i64>) = conn
            .query_row(
                "SELECT model_id, seed FROM runs WHERE run_id = 'r-old'",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((model_id.as_str(), seed), ("", None));
    }
}
