//! The run history in SQLite: every run with its memory timeline, the
//! conversations, what the session pool did, and a few per-machine settings.
//! Several processes (the app, `ondo bench`, `ondo run`) may write at once.

mod columns;
mod error;
pub mod record;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::run_kinds::{LoopShape, PrefixSource, RunKind};

use columns::{ColumnValue, RUN_COLUMN_LIST, read_column, run_from_row, run_values};

pub use columns::RUN_COLUMNS;
pub use error::StoreError;
pub use record::{
    MemorySample, PoolEvent, Provenance, RECORD_SCHEMA_VERSION, RunRecord, now_rfc3339,
};
pub use schema::SCHEMA_VERSION;

/// The history's file name inside Ondo's data folder.
pub const DB_FILE_NAME: &str = "ondo.sqlite3";

/// How long a write waits for another process's write to finish. Ondo's
/// transactions last milliseconds; this covers a slow disk and a checkpoint.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// An open run history.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// Which runs to list. The default lists every run except warm-ups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Only the newest N (still listed oldest first).
    pub last: Option<usize>,
    pub model_id: Option<String>,
    pub bench_id: Option<String>,
    pub kind: Option<RunKind>,
    pub conversation_id: Option<String>,
    /// Warm-up repetitions are recorded but left out unless asked for.
    pub include_warmup: bool,
    /// Only runs with this decode loop shape.
    pub loop_shape: Option<LoopShape>,
    pub prefill_step_size: Option<u64>,
    /// Only runs with this KV bound; 0: only runs without one.
    pub max_kv_size: Option<u64>,
    /// Only runs whose cached prompt tokens came from here.
    pub prefix_source: Option<PrefixSource>,
}

static INSERT_RUN: LazyLock<String> = LazyLock::new(|| {
    let placeholders = vec!["?"; RUN_COLUMNS.len()].join(", ");
    format!(
        "INSERT INTO runs ({}) VALUES ({placeholders})",
        *RUN_COLUMN_LIST
    )
});

static SELECT_RUNS: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {} FROM runs", *RUN_COLUMN_LIST));

impl Store {
    /// Opens (creating if needed) the history at `path` and brings its schema
    /// up to date.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(folder).map_err(|source| StoreError::CreateFolder {
                folder: folder.to_owned(),
                source,
            })?;
        }
        let fail = |error| StoreError::from_sqlite(path, error);
        let mut conn = Connection::open(path).map_err(fail)?;
        // First, so that everything after it waits for other writers too.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        // The busy timeout does not cover everything at open: two processes
        // switching a fresh file to WAL at once each hold a read lock and want
        // the write lock, and SQLite answers one of them "busy" at once rather
        // than let both wait forever. Every step below is safe to repeat, so a
        // busy open is retried until the same timeout as a busy write.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(2);
        loop {
            match Self::configure(&mut conn, path) {
                Err(StoreError::Busy { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                done => break done?,
            }
        }
        Ok(Store {
            conn,
            path: path.to_owned(),
        })
    }

    /// The connection's settings and the schema, each safe to apply again.
    fn configure(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
        let fail = |error| StoreError::from_sqlite(path, error);
        // WAL: readers never wait for the writer, and writers append instead
        // of rewriting pages in place. The answer (the mode in force) is not
        // checked: where WAL is refused, the rollback journal is just slower.
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
            .map_err(fail)?;
        // NORMAL with WAL: a commit is in the WAL before commit returns, so a
        // killed process loses nothing it committed; only a power cut or an
        // OS crash can drop the last commits, and the file stays consistent.
        // FULL would fsync every run for a risk we do not need to cover.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(fail)?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(fail)?;
        schema::prepare(conn, path)
    }

    /// Opens `data_dir/ondo.sqlite3`; pass `DataDirs::from_env().data_dir`,
    /// which honours ONDO_HOME.
    pub fn open_default(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open(&data_dir.join(DB_FILE_NAME))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fail(&self, error: rusqlite::Error) -> StoreError {
        StoreError::from_sqlite(&self.path, error)
    }

    /// Records a run and its memory timeline together: both or neither.
    pub fn insert_run(
        &mut self,
        record: &RunRecord,
        timeline: &[MemorySample],
    ) -> Result<(), StoreError> {
        let fail = |error| StoreError::from_sqlite(&self.path, error);
        // IMMEDIATE: take the write lock up front, where the busy timeout
        // applies, rather than upgrading from a read lock mid-transaction.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        tx.prepare_cached(&INSERT_RUN)
            .and_then(|mut statement| {
                statement.execute(rusqlite::params_from_iter(run_values(record)))
            })
            .map_err(|error| {
                if is_primary_key_violation(&error) {
                    StoreError::DuplicateRun {
                        run_id: record.run_id.clone(),
                    }
                } else {
                    fail(error)
                }
            })?;
        {
            let mut insert_sample = tx
                .prepare_cached(
                    "INSERT INTO memory_samples (run_id, seq, t_ms, level, used_bytes, app_bytes,
                        wired_bytes, compressed_bytes, swap_used_bytes, footprint_bytes)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                )
                .map_err(fail)?;
            for (seq, sample) in timeline.iter().enumerate() {
                insert_sample
                    .execute(params![
                        record.run_id,
                        seq as i64,
                        sample.t_ms.to_column(),
                        sample.level,
                        sample.used_bytes.to_column(),
                        sample.app_bytes.to_column(),
                        sample.wired_bytes.to_column(),
                        sample.compressed_bytes.to_column(),
                        sample.swap_used_bytes.to_column(),
                        sample.footprint_bytes.to_column(),
                    ])
                    .map_err(fail)?;
            }
        }
        tx.commit().map_err(fail)
    }

    /// Sets the aggregate rate of a concurrency benchmark's round on each of
    /// its runs (known only once the last of them has ended).
    pub fn set_aggregate_tps(&mut self, run_ids: &[String], tps: f64) -> Result<(), StoreError> {
        let fail = |error| StoreError::from_sqlite(&self.path, error);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        for run_id in run_ids {
            tx.execute(
                "UPDATE runs SET aggregate_tps = ?1 WHERE run_id = ?2",
                rusqlite::params![tps, run_id],
            )
            .map_err(fail)?;
        }
        tx.commit().map_err(fail)
    }

    /// Files a run that another Ondo process recorded as an API request
    /// (rank 0 of a split model, answering this app's chat) under the
    /// app's conversation: kind `chat`, the conversation's id, and the
    /// conversation created or retitled. Returns the run as it now reads;
    /// `None` when no run has that id.
    pub fn file_under_chat(
        &mut self,
        run_id: &str,
        conversation_id: &str,
        title: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let Some(mut run) = self.run(run_id)? else {
            return Ok(None);
        };
        self.upsert_conversation(conversation_id, &run.model_id, title)?;
        self.conn
            .execute(
                "UPDATE runs SET kind = ?1, conversation_id = ?2 WHERE run_id = ?3",
                params![RunKind::Chat.to_column(), conversation_id, run_id],
            )
            .map_err(|error| self.fail(error))?;
        run.kind = RunKind::Chat;
        run.conversation_id = Some(conversation_id.to_owned());
        Ok(Some(run))
    }

    /// One run by id.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.conn
            .prepare_cached(&format!("{} WHERE run_id = ?1", *SELECT_RUNS))
            .and_then(|mut statement| statement.query_row([run_id], run_from_row).optional())
            .map_err(|error| self.fail(error))
    }

    /// The runs that match, oldest first (by `created_at`, then run id).
    pub fn runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut conditions = Vec::new();
        let mut values = Vec::new();
        // Every filter is in the query, before LIMIT: the newest N *matching*
        // runs, never the newest N runs filtered afterwards.
        let wanted = [
            ("model_id", query.model_id.clone().map(Value::Text)),
            ("bench_id", query.bench_id.clone().map(Value::Text)),
            ("kind", query.kind.map(|k| k.to_column())),
            (
                "conversation_id",
                query.conversation_id.clone().map(Value::Text),
            ),
            ("loop", query.loop_shape.map(|l| l.to_column())),
            ("prefix_source", query.prefix_source.map(|p| p.to_column())),
            (
                "prefill_step_size",
                query.prefill_step_size.map(|n| n.to_column()),
            ),
            (
                "max_kv_size",
                query.max_kv_size.filter(|&n| n > 0).map(|n| n.to_column()),
            ),
        ];
        for (column, value) in wanted {
            if let Some(value) = value {
                conditions.push(format!("\"{column}\" = ?"));
                values.push(value);
            }
        }
        if query.max_kv_size == Some(0) {
            conditions.push("max_kv_size IS NULL".to_owned());
        }
        if !query.include_warmup {
            conditions.push("warmup = 0".to_owned());
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        // Newest first so that LIMIT keeps the last N; reversed below.
        // A negative LIMIT is SQLite's "no limit".
        let limit = query
            .last
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        values.push(Value::Integer(limit));
        let sql = format!(
            "{}{filter} ORDER BY created_at DESC, run_id DESC LIMIT ?",
            *SELECT_RUNS
        );
        let mut runs = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut statement| {
                statement
                    .query_map(rusqlite::params_from_iter(values), run_from_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|error| self.fail(error))?;
        runs.reverse();
        Ok(runs)
    }

    /// A run's memory timeline in the order it was recorded; empty for an
    /// unknown run.
    pub fn timeline(&self, run_id: &str) -> Result<Vec<MemorySample>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT t_ms, level, used_bytes, app_bytes, wired_bytes, compressed_bytes,
                    swap_used_bytes, footprint_bytes
                 FROM memory_samples WHERE run_id = ?1 ORDER BY seq",
            )
            .and_then(|mut statement| {
                statement
                    .query_map([run_id], |row| {
                        Ok(MemorySample {
                            t_ms: read_column(row, 0)?,
                            level: row.get(1)?,
                            used_bytes: read_column(row, 2)?,
                            app_bytes: read_column(row, 3)?,
                            wired_bytes: read_column(row, 4)?,
                            compressed_bytes: read_column(row, 5)?,
                            swap_used_bytes: read_column(row, 6)?,
                            footprint_bytes: read_column(row, 7)?,
                        })
                    })?
                    .collect()
            })
            .map_err(|error| self.fail(error))
    }

    /// The bench id of the newest benchmark run, for "report the last bench".
    pub fn latest_bench_id(&self) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row(
                "SELECT bench_id FROM runs WHERE bench_id IS NOT NULL
                 ORDER BY created_at DESC, run_id DESC LIMIT 1",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(|error| self.fail(error))
    }

    /// How many runs are recorded, warm-ups included.
    pub fn run_count(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT count(*) FROM runs", [], |row| row.get(0))
            .map_err(|error| self.fail(error))
    }

    /// Creates the conversation, or updates its model, title and
    /// `updated_at`; `created_at` stays the first time it was seen.
    pub fn upsert_conversation(
        &mut self,
        conversation_id: &str,
        model_id: &str,
        title: &str,
    ) -> Result<(), StoreError> {
        let now = now_rfc3339();
        self.conn
            .execute(
                "INSERT INTO conversations (conversation_id, model_id, title, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?4)
                 ON CONFLICT (conversation_id) DO UPDATE SET
                    model_id = excluded.model_id,
                    title = excluded.title,
                    updated_at = excluded.updated_at",
                params![conversation_id, model_id, title, now],
            )
            .map(drop)
            .map_err(|error| self.fail(error))
    }

    /// Records what the pool did. Only the newest `POOL_EVENTS_KEPT` are kept:
    /// a menu-bar app that runs for months writes one per answer, and the
    /// events explain the recent past, not the history (the runs do that).
    pub fn insert_pool_event(&mut self, event: &PoolEvent) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO pool_events (at, action, model_id, reason, bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    event.at,
                    event.action,
                    event.model_id,
                    event.reason,
                    event.bytes.to_column()
                ],
            )
            .map_err(|error| self.fail(error))?;
        let id = self.conn.last_insert_rowid();
        // Pruning in batches keeps the insert cheap.
        if id % Self::POOL_EVENTS_PRUNE_EVERY == 0 {
            self.conn
                .execute(
                    "DELETE FROM pool_events WHERE id <= ?1",
                    params![id - Self::POOL_EVENTS_KEPT],
                )
                .map_err(|error| self.fail(error))?;
        }
        Ok(())
    }

    /// How many pool events stay in the history.
    pub const POOL_EVENTS_KEPT: i64 = 5_000;
    const POOL_EVENTS_PRUNE_EVERY: i64 = 100;

    /// The newest `limit` pool events, oldest first (in the order recorded).
    pub fn pool_events(&self, limit: usize) -> Result<Vec<PoolEvent>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut events = self
            .conn
            .prepare_cached(
                "SELECT at, action, model_id, reason, bytes FROM pool_events
                 ORDER BY id DESC LIMIT ?1",
            )
            .and_then(|mut statement| {
                statement
                    .query_map([limit], |row| {
                        Ok(PoolEvent {
                            at: row.get(0)?,
                            action: row.get(1)?,
                            model_id: row.get(2)?,
                            reason: row.get(3)?,
                            bytes: read_column(row, 4)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|error| self.fail(error))?;
        events.reverse();
        Ok(events)
    }

    /// Stores a per-machine value (e.g. the measured memory bandwidth),
    /// replacing any earlier one.
    pub fn set_setting(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [key, value],
            )
            .map(drop)
            .map_err(|error| self.fail(error))
    }

    pub fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |row| {
                row.get(0)
            })
            .optional()
            .map_err(|error| self.fail(error))
    }
}

fn is_primary_key_violation(error: &rusqlite::Error) -> bool {
    error.sqlite_error().is_some_and(|e| {
        e.code == ErrorCode::ConstraintViolation
            && e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    })
}

#[cfg(test)]
mod tests;
