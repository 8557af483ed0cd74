//! `ondo runs` and `ondo report`: the run history side by side in the
//! terminal, and written out in a format to share.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::paths::DataDirs;
use crate::report::ReportFormat;
use crate::run_kinds::{LoadKind, LoopShape, PrefixSource, RunKind};
use crate::store::{RunQuery, RunRecord, Store};
use crate::text_table::{self, Column, TableStyle};
use crate::units::human_bytes;

/// Which runs: the filters `runs` and `report` share.
#[derive(Debug, Args)]
pub struct Selection {
    /// The last N runs (newest last).
    #[arg(long, default_value_t = 20)]
    last: usize,
    /// Only runs of this model (as named when it ran: repo id, folder, `tiny`).
    #[arg(long)]
    model: Option<String>,
    /// Only the runs of one benchmark (its id, or `latest`).
    #[arg(long)]
    bench: Option<String>,
    /// Only runs of one kind: run, chat, bench, bench_cold, demo, endpoint, api.
    #[arg(long)]
    kind: Option<RunKind>,
    /// Only runs with this decode loop shape.
    #[arg(long = "loop", value_enum)]
    loop_shape: Option<LoopShape>,
    /// Only runs with this prefill step size.
    #[arg(long)]
    prefill_step_size: Option<u64>,
    /// Only runs with this KV cache bound (0: only runs without one).
    #[arg(long)]
    max_kv_size: Option<u64>,
    /// Only runs whose cached prompt came from here: none (all prefilled),
    /// memory (the conversation's cache) or disk (a saved prompt cache).
    #[arg(long, value_name = "none|memory|disk", value_parser = prefix_source)]
    prefix: Option<PrefixSource>,
    /// Include benchmark warm-up runs.
    #[arg(long)]
    include_warmup: bool,
}

fn open_store() -> Result<Store, CliError> {
    Ok(Store::open_default(&DataDirs::from_env().data_dir)?)
}

/// The history's query for what `selection` asks (`--bench latest` names
/// the latest benchmark's id).
fn query(store: &Store, selection: &Selection) -> Result<RunQuery, CliError> {
    let bench_id = match selection.bench.as_deref() {
        Some("latest") => Some(store.latest_bench_id()?.ok_or_else(|| {
            CliError::new(
                ErrorKind::InvalidInput,
                "no benchmark has been recorded yet (ondo bench MODEL records one)",
            )
        })?),
        other => other.map(str::to_owned),
    };
    Ok(RunQuery {
        last: Some(selection.last),
        model_id: selection.model.clone(),
        bench_id,
        kind: selection.kind,
        conversation_id: None,
        include_warmup: selection.include_warmup,
        loop_shape: selection.loop_shape,
        prefill_step_size: selection.prefill_step_size,
        max_kv_size: selection.max_kv_size,
        prefix_source: selection.prefix,
    })
}

fn prefix_source(value: &str) -> Result<PrefixSource, String> {
    match value {
        "none" | "memory" | "disk" => Ok(PrefixSource::parse(value)),
        other => Err(format!("`{other}`: say none, memory or disk")),
    }
}

fn select(store: &Store, selection: &Selection) -> Result<Vec<RunRecord>, CliError> {
    Ok(store.runs(&query(store, selection)?)?)
}

#[derive(Debug, Args)]
#[command(after_help = "\
Each row is one run: cold (the weights were loaded) or warm, the time to first
token (prefill), the prompt tokens with those a warm conversation reused from
its KV cache, prefill and decode speed, peak MLX memory and the worst memory
pressure seen while it ran.

Examples:
  ondo runs                       the last 20 runs
  ondo runs --bench latest        the last benchmark, warm-ups left out
  ondo runs --model tiny --last 5")]
pub struct RunsArgs {
    #[command(flatten)]
    selection: Selection,
}

/// Prints recorded runs side by side.
pub fn runs(args: RunsArgs) -> Result<ExitCode, CliError> {
    let store = open_store()?;
    let runs = select(&store, &args.selection)?;
    if runs.is_empty() {
        println!("No runs recorded yet. Try: ondo run tiny \"hello\"   or   ondo bench tiny");
        return Ok(ExitCode::SUCCESS);
    }
    let columns = [
        Column::left("time"),
        Column::left("kind"),
        Column::left("model"),
        Column::right("load"),
        Column::right("TTFT ms"),
        Column::right("prompt"),
        Column::right("prefill t/s"),
        Column::right("gen"),
        Column::right("decode t/s"),
        Column::right("peak"),
        Column::right("pressure"),
        Column::right("loop"),
    ];
    let rows: Vec<Vec<String>> = runs.iter().map(row).collect();
    print!("{}", text_table::render(TableStyle::Plain, &columns, &rows));
    Ok(ExitCode::SUCCESS)
}

fn row(r: &RunRecord) -> Vec<String> {
    // "2026-11-29T15:04:05.123Z" -> "11-29 15:04:05"
    let time = r
        .created_at
        .get(5..19)
        .map_or(r.created_at.clone(), |t| t.replace('T', " "));
    let load = if r.fresh_process {
        format!("fresh {:.0}ms", r.cold_start_ms.unwrap_or(0.0))
    } else if r.load_kind == LoadKind::Cold {
        format!("cold {:.0}ms", r.load_ms)
    } else {
        "warm".to_owned()
    };
    let prompt = if r.cached_tokens > 0 {
        format!("{} ({} cached)", r.prompt_tokens, r.cached_tokens)
    } else {
        r.prompt_tokens.to_string()
    };
    let model = if r.model_id.chars().count() > 40 {
        format!(
            "…{}",
            r.model_id
                .chars()
                .rev()
                .take(39)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<String>()
        )
    } else {
        r.model_id.clone()
    };
    let kind = match (&r.kind, &r.server_name) {
        (RunKind::Endpoint, Some(server)) => format!("endpoint {server}"),
        (kind, _) => kind.to_string(),
    };
    // What a server's run cannot show from the client: its load, its
    // prefill alone, its memory, its loop.
    let endpoint = r.kind == RunKind::Endpoint;
    let unknown = || "—".to_owned();
    vec![
        time,
        if r.warmup {
            format!("{kind} (warm-up)")
        } else if let Some(agent) = &r.user_agent {
            // Which program asked, shortened: "api (OpenAI/Python 3.57.0)".
            let agent: String = agent.chars().take(24).collect();
            format!("{kind} ({agent})")
        } else {
            kind
        },
        model,
        if endpoint { unknown() } else { load },
        format!("{:.1}", r.ttft_ms),
        prompt,
        if endpoint {
            unknown()
        } else {
            format!("{:.0}", r.prefill_tps)
        },
        r.generated_tokens.to_string(),
        format!("{:.1}", r.decode_tps),
        if endpoint {
            unknown()
        } else {
            human_bytes(r.mlx_peak_bytes)
        },
        r.pressure_max.clone(),
        if endpoint {
            unknown()
        } else {
            r.loop_shape.to_string()
        },
    ]
}

#[derive(Debug, Args)]
#[command(after_help = "\
Formats: json (versioned schema, docs/REPORT_SCHEMA.md), jsonl (one run per
line), csv, md (like llama-bench: only the columns that vary, mean ± sd) and
html (one self-contained page with charts: prefill and decode per run, cold
vs warm, the memory timeline).

Examples:
  ondo report --bench latest --format md
  ondo report --last 50 --out runs.html
  ondo report --model tiny --format csv > tiny.csv")]
pub struct ReportArgs {
    #[command(flatten)]
    selection: Selection,
    /// json, jsonl, csv, md or html [default: from --out's extension, else md].
    #[arg(long)]
    format: Option<String>,
    /// Write to this file instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Writes recorded runs as a report.
pub fn report(args: ReportArgs) -> Result<ExitCode, CliError> {
    let format: ReportFormat = match (&args.format, &args.out) {
        (Some(f), _) => f.parse()?,
        (None, Some(path)) => path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(|e| e.parse().ok())
            .unwrap_or(ReportFormat::Markdown),
        (None, None) => ReportFormat::Markdown,
    };
    let store = open_store()?;
    let query = query(&store, &args.selection)?;
    let runs = store.runs(&query)?;
    let title = crate::report::title_for(&query, runs.len());
    let rendered = crate::report::render_runs(&store, &runs, title, format);
    match &args.out {
        Some(path) => {
            // An older report at `path` stays whole until this one is.
            crate::whole_file::write_atomically(path, &rendered.bytes)
                .map_err(|e| CliError::new(ErrorKind::Io, format!("{}: {e}", path.display())))?;
            eprintln!("wrote {} runs to {}", rendered.runs, path.display());
        }
        None => {
            std::io::Write::write_all(&mut std::io::stdout().lock(), &rendered.bytes)
                .map_err(|e| CliError::new(ErrorKind::Io, e.to_string()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
