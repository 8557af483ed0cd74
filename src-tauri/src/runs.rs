//! The commands of the Runs window: the history filtered, a benchmark plan
//! run with progress over a channel (one at a time, stoppable), and reports
//! written where the user chose. Each calls the core.

use std::path::PathBuf;

use ondo::bench::plan::{self, BenchProgress, CaseSummary};
use ondo::bench::{BenchPlan, BenchShape, Summary};
use ondo::engine::CancelToken;
use ondo::report::ReportFormat;
use ondo::run_kinds::{LoopShape, PrefixSource, RunKind};
use ondo::store::{RunQuery, RunRecord, Store};
use serde::{Deserialize, Serialize};
use tauri::ipc::Channel;
use tauri::{AppHandle, Runtime};

use crate::commands::on_blocking_thread;
use crate::error::CommandError;
use crate::events;
use crate::state::AppState;

type State<'a> = tauri::State<'a, AppState>;

/// The most runs one screen or report reads.
pub const MAX_RUNS: usize = 10_000;

/// Which runs a screen or an export covers (`RunFilter` in backend.ts).
#[derive(Debug, Clone, Default, Deserialize, specta::Type)]
#[serde(default)]
pub struct RunFilter {
    pub last: Option<usize>,
    pub model_id: Option<String>,
    pub kind: Option<RunKind>,
    pub bench_id: Option<String>,
    pub include_warmup: bool,
    /// Only runs with this decode loop shape.
    #[serde(rename = "loop")]
    pub loop_shape: Option<LoopShape>,
    pub prefill_step_size: Option<u64>,
    /// Only runs with this KV bound (0: only unbounded runs).
    pub max_kv_size: Option<u64>,
    /// Only runs whose cached prompt tokens came from here (none, memory,
    /// disk).
    pub prefix_source: Option<PrefixSource>,
}

impl RunFilter {
    /// The runs the filter selects, oldest first: every filter is part of
    /// the history's query, so the newest N are the newest N that match.
    fn select(&self, store: &Store) -> Result<Vec<RunRecord>, ondo::store::StoreError> {
        store.runs(&self.query())
    }

    fn query(&self) -> RunQuery {
        RunQuery {
            last: Some(self.last.unwrap_or(MAX_RUNS).clamp(1, MAX_RUNS)),
            model_id: self.model_id.clone().filter(|m| !m.is_empty()),
            bench_id: self.bench_id.clone().filter(|b| !b.is_empty()),
            kind: self.kind,
            include_warmup: self.include_warmup,
            loop_shape: self.loop_shape,
            prefill_step_size: self.prefill_step_size,
            max_kv_size: self.max_kv_size,
            prefix_source: self.prefix_source,
            conversation_id: None,
        }
    }
}

/// A benchmark as the Benchmark dialog asks for it.
#[derive(Debug, Clone, Deserialize, specta::Type)]
pub struct BenchRequest {
    /// "tiny", a folder, or a downloaded repo id.
    pub model: String,
    pub shape: BenchShape,
}

/// Streamed while a benchmark runs.
#[derive(Debug, Clone, Serialize, specta::Type)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BenchEvent {
    Progress {
        done: usize,
        total: usize,
        what: String,
    },
}

/// What a finished benchmark returns (its runs are in the history).
#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct BenchResult {
    pub bench_id: String,
    pub runs: usize,
    pub cases: Vec<CaseSummary>,
    pub cold_start_ms: Option<Summary>,
    pub memory_bandwidth_gbps: Option<f64>,
    pub warnings: Vec<String>,
}

/// Recorded runs, oldest first.
#[tauri::command]
#[specta::specta]
pub fn list_runs(state: State<'_>, filter: RunFilter) -> Result<Vec<RunRecord>, CommandError> {
    crate::models::history(&state, |store| filter.select(store))
}

/// Runs a benchmark plan through the session pool, streaming progress;
/// refuses a second one while one runs.
#[tauri::command]
#[specta::specta]
pub async fn run_benchmark<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_>,
    request: BenchRequest,
    on_event: Channel<BenchEvent>,
) -> Result<BenchResult, CommandError> {
    let cancel = CancelToken::new();
    {
        let mut running = state.bench.lock().unwrap_or_else(|p| p.into_inner());
        if running.is_some() {
            return Err(CommandError::InvalidInput(
                "a benchmark is already running; wait for it or stop it first".into(),
            ));
        }
        *running = Some(cancel.clone());
    }
    let result = benchmark(&app, &state, request, cancel, on_event).await;
    *state.bench.lock().unwrap_or_else(|p| p.into_inner()) = None;
    result
}

async fn benchmark<R: Runtime>(
    app: &AppHandle<R>,
    state: &AppState,
    request: BenchRequest,
    cancel: CancelToken,
    on_event: Channel<BenchEvent>,
) -> Result<BenchResult, CommandError> {
    let model = crate::models::resolve(state, &request.model).await?;
    let plan = BenchPlan::new(&model, request.shape);
    let pool = state.pool.clone();
    let app = app.clone();
    let outcome = on_blocking_thread(move || {
        let mut last_done = 0;
        let mut progress = |p: BenchProgress| {
            if p.done != last_done {
                // A run finished and was recorded: the Runs table can show it.
                last_done = p.done;
                events::runs_changed(&app, "bench");
            }
            // A closed window stops hearing; the benchmark goes on.
            let _ = on_event.send(BenchEvent::Progress {
                done: p.done,
                total: p.total,
                what: p.what,
            });
        };
        plan::run_plan(&pool, &plan, &cancel, &mut progress).map_err(CommandError::from)
    })
    .await?;
    Ok(BenchResult {
        bench_id: outcome.bench_id,
        runs: outcome.records.len(),
        cases: outcome.cases,
        cold_start_ms: outcome.cold_start_ms,
        memory_bandwidth_gbps: outcome.memory_bandwidth_gbps,
        warnings: outcome.warnings,
    })
}

/// Stops the running benchmark after its run in progress; true if one ran.
#[tauri::command]
#[specta::specta]
pub fn cancel_benchmark(state: State<'_>) -> bool {
    match state
        .bench
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        Some(cancel) => {
            cancel.cancel();
            true
        }
        None => false,
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize, specta::Type)]
pub struct Exported {
    pub runs: usize,
    pub bytes: u64,
    pub path: PathBuf,
}

/// Writes the runs `filter` selects to `path` in `format` (json, jsonl, csv,
/// md, html).
#[tauri::command]
#[specta::specta]
pub fn export_runs(
    state: State<'_>,
    filter: RunFilter,
    format: ReportFormat,
    path: PathBuf,
) -> Result<Exported, CommandError> {
    let query = filter.query();
    let rendered = crate::models::history(&state, |store| {
        let runs = filter.select(store)?;
        let title = ondo::report::title_for(&query, runs.len());
        Ok(ondo::report::render_runs(store, &runs, title, format))
    })?;
    write_whole(&path, &rendered.bytes)?;
    Ok(Exported {
        runs: rendered.runs,
        bytes: rendered.bytes.len() as u64,
        path,
    })
}

/// Replaces `path` in one step, so a failed export never leaves half a
/// report where an old one was.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> Result<(), CommandError> {
    ondo::whole_file::write_atomically(path, bytes).map_err(|e| {
        CommandError::InvalidInput(format!(
            "could not write {}: {e}; choose another folder",
            path.display()
        ))
    })
}

/// The file name the save dialog proposes for a report in `format`.
pub fn suggested_report_name(format: ReportFormat, today: &str) -> String {
    format!("ondo-runs-{today}.{}", format.extension())
}
