//! `ondo bench`: Ondo's engine timed on one model, optionally side by side
//! with Python mlx-lm on the same folder in the same run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::concurrency::{ConcurrencyPlan, ConcurrencyResult};
use crate::bench::endpoint::EndpointSpec;
use crate::bench::image::{ImageBenchOutcome, ImagePlan};
use crate::bench::plan::{BenchOutcome, VarySetting};
use crate::bench::side_by_side::{EndpointComparison, EndpointPlan};
use crate::bench::{self, BenchPlan, BenchShape, PeerComparison, Summary, ratio};
use crate::cli::error::CliError;
use crate::engine::CancelToken;
use crate::report::{Report, ReportFormat};
use crate::resolve::{NamedBy, resolve_model};
use crate::session::SessionPool;
use crate::text_table::{self, Column, TableStyle};
use crate::units::{human_bytes, mib};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Peer {
    /// Python mlx-lm (`stream_generate`), the reference implementation.
    MlxLm,
    /// Python mlx-vlm (its `generate_step`), the reference for images
    /// (with --image).
    MlxVlm,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Method: every side runs the same synthetic prompt (different in each
repetition, so no cache carries work over), greedy, exactly --gen tokens (EOS
ignored). Sides alternate who goes first; warm-up repetitions are dropped;
the table shows the median with min-max. Ratios are Ondo / mlx-lm: above 1 is
faster for tok/s, below 1 is less memory or a quicker start. Cold start is a
fresh process from spawn to first token. Greedy tokens are compared in every
measured repetition; where they differ, mlx-lm runs that prompt again: if it
repeats itself the difference is Ondo's (a bug: exit status 1), if not (a
GPU's reductions at a near-tie) the table says where each side departed.
Ondo's rows also show a decode step's anatomy: host time building and
queueing it, host time waiting for its token, and the nodes in one step's
graph (about the kernels a GPU launches per token).

Without --peer, Ondo runs alone: every combination of --prompt-tokens,
--loop and the --vary values, each run recorded in the history with its memory
timeline (ondo runs, ondo report), cold starts in fresh processes, decode shown
as a share of this machine's memory bandwidth (measured once), and a warning
when memory pressure left normal or the build is a debug build.

With --endpoint, other programs' servers run the same plan, side by side
with Ondo's engine (when MODEL is given) or on their own: any server that
speaks OpenAI's API (mlx_lm.server, LM Studio, llama.cpp, vLLM) or Ollama's.
The model rides in the URL's fragment, which is never sent: URL#MODEL. A URL
ending in /v1 (or any other path) is OpenAI's dialect, one ending in /api
Ollama's; a bare host:port is asked which it is. A label before '='
names the side (mlx=http://...). Every side gets the same text prompts
(sized with the model's tokenizer where Ondo has the model, else about four
characters a token; each server's own count is kept), greedy, --gen tokens
with EOS ignored where the server takes ignore_eos, through the raw
completion route so no chat template adds tokens. TTFT and decode are
measured as the stream arrives; the server's own numbers (Ollama's
durations) are shown beside them. Cold starts are Ondo's own benchmark's:
a server's process is not Ondo's to start.

With --concurrency 1,2,4,8, each side gets that many streams at once,
one level after another, each stream its own prompt: the aggregate decode
rate (every stream's tokens over the round's wall time, from the first
request sent to the last token), each stream's own rate, TTFT at the
median and the 95th percentile, and Ondo's peak memory. Ondo's engine
decodes a level's streams in one batch; a server does what it does.

With --image FILE, the prompt is a question about the image (--question),
each repetition opening with its own system turn so no cache carries the
image over: the vision tower and projector are timed as a phase of their
own (encode), then the prefill, the first token and the decode. With --peer
mlx-vlm, Python mlx-vlm answers the same question about the same files
(its processor, then generate_step), alternating with Ondo; the ratios are
Ondo's first loop shape over mlx-vlm, and its greedy tokens are compared.

With --hostfile hosts.json (one machine per rank, this one first, as
`ondo run --hostfile` takes it), the model runs in one process and split
over those machines (--split pipeline,tensor: by layers, by heads), each
repetition a fresh `ondo run` per side, alternating: prefill, TTFT and
decode per side, decode against one process, whether the greedy tokens
stayed the same, and what each decode step moved between the ranks.

Build with --release (`make release`) before trusting the numbers.

Examples:
  ondo bench tiny --peer mlx-lm --prompt-tokens 128 --gen 128 --reps 5
  python -m mlx_lm.server --model ./models/tiny --port 8080 &
  ondo bench ./models/tiny --endpoint mlx=http://127.0.0.1:8080/v1#./models/tiny
  ondo bench --endpoint http://127.0.0.1:11434#llama3.2:1b \
      --endpoint http://localhost:1234/v1#qwen3-0.6b --api-key KEY
  ondo bench tiny --concurrency 1,2,4,8 --endpoint mlx=http://127.0.0.1:8080/v1#./models/tiny
  ondo bench ./gemma-3-4b-it-4bit --image shot.png --peer mlx-vlm --gen 64
  ondo bench ./Llama-3.3-70B-Instruct-4bit --hostfile hosts.json --split tensor
  ondo bench tiny --prompt-tokens 128,1024 --loop sync,pipelined \\
      --vary prefill_step_size=512,2048 --report bench.html")]
pub struct BenchArgs {
    /// A model folder, a downloaded repo id, or `tiny` (optional with
    /// --endpoint: the servers then run without Ondo's engine).
    model: Option<String>,
    #[command(flatten)]
    shape: BenchShape,
    /// Also run this implementation on the same folder, alternating.
    #[arg(long, value_enum, conflicts_with = "endpoints")]
    peer: Option<Peer>,
    /// A server to benchmark alongside: [NAME=]URL#MODEL (repeatable).
    #[arg(long = "endpoint", value_name = "URL#MODEL")]
    endpoints: Vec<EndpointSpec>,
    /// Send this many streams at once, each level in turn (1,2,4,8,16):
    /// aggregate and per-stream tok/s, TTFT p50/p95, on Ondo's engine and
    /// every --endpoint.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N,N,...",
        conflicts_with = "peer"
    )]
    concurrency: Vec<usize>,
    /// The API key for endpoints whose URL carries none (sent as a bearer token).
    #[arg(long, value_name = "KEY", requires = "endpoints")]
    api_key: Option<String>,
    /// Ask about this image instead of a synthetic prompt (repeatable; PNG,
    /// JPEG, WebP or GIF): the vision tower's encode is timed as a phase of
    /// its own beside the prefill and the decode. With --peer mlx-vlm,
    /// mlx-vlm answers the same question about the same files.
    #[arg(
        long = "image",
        value_name = "FILE",
        conflicts_with_all = ["endpoints", "concurrency"]
    )]
    images: Vec<PathBuf>,
    /// Also run the model split over these machines (a JSON list of
    /// hosts, this one first, as `ondo run --hostfile` takes it), against
    /// it in one process here.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["endpoints", "concurrency", "images", "peer"]
    )]
    hostfile: Option<PathBuf>,
    /// The splits to run with --hostfile: pipeline (by layers), tensor (by
    /// heads), or both.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "HOW,...",
        default_value = "pipeline,tensor",
        requires = "hostfile"
    )]
    split: Vec<crate::engine::distributed::SplitKind>,
    /// The question asked about the --image files.
    #[arg(long, default_value = "Describe this image in detail.")]
    question: String,
    /// Python with mlx-lm (or mlx-vlm) for the peer [default: $ONDO_PYTHON, .venv/bin/python, python3].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Print the whole result (plan, environment, raw samples) as JSON.
    #[arg(long)]
    json: bool,
    /// Print the table as Markdown (for docs/BENCHMARKS.md).
    #[arg(long)]
    markdown: bool,
    /// Also write the runs as a report; the format follows the extension
    /// (.json .jsonl .csv .md .html). Repeatable.
    #[arg(long = "report", value_name = "FILE")]
    reports: Vec<PathBuf>,
}

pub fn run(args: BenchArgs) -> Result<ExitCode, CliError> {
    for path in &args.reports {
        report_format(path)?;
    }
    let pool = crate::cli::run::session_pool(false)?;
    let model = match &args.model {
        Some(name) => Some(
            resolve_model(&pool, name, NamedBy::Local)
                .map_err(|e| CliError::from(e).about(name))?,
        ),
        None if args.endpoints.is_empty() => {
            return Err(CliError::from(
                "name a model (a folder, a downloaded repo id, or tiny), or a server with \
                 --endpoint URL#MODEL",
            ));
        }
        None => None,
    };
    if !args.images.is_empty() {
        let Some(model) = model else {
            return Err(CliError::from(
                "name the vision model to ask about the --image files",
            ));
        };
        if args.peer == Some(Peer::MlxLm) {
            return Err(CliError::from(
                "mlx-lm reads no images: compare an image benchmark with --peer mlx-vlm",
            ));
        }
        let plan = ImagePlan {
            plan: BenchPlan::new(&model, args.shape.clone()),
            images: args.images.clone(),
            question: args.question.clone(),
        };
        return run_image_plan(&pool, &plan, &args);
    }
    if args.peer == Some(Peer::MlxVlm) {
        return Err(CliError::from(
            "--peer mlx-vlm compares answers about images: add --image FILE",
        ));
    }
    if let Some(hostfile) = &args.hostfile {
        let Some(model) = model else {
            return Err(CliError::from("name the model to split with --hostfile"));
        };
        let plan = bench::split::SplitPlan {
            plan: BenchPlan::new(&model, args.shape.clone()),
            hostfile: hostfile.clone(),
            splits: args.split.clone(),
        };
        return run_split_plan(&pool, &plan, &args);
    }
    if !args.concurrency.is_empty() {
        let plan = ConcurrencyPlan {
            ondo: model.map(|m| BenchPlan::new(&m, args.shape.clone())),
            shape: args.shape.clone(),
            levels: args.concurrency.clone(),
            endpoints: args.endpoints.clone(),
            api_key: args.api_key.clone(),
        };
        return run_concurrency_plan(&pool, &plan, &args);
    }
    if !args.endpoints.is_empty() {
        let plan = EndpointPlan {
            ondo: model.map(|m| BenchPlan::new(&m, args.shape.clone())),
            shape: args.shape.clone(),
            endpoints: args.endpoints.clone(),
            api_key: args.api_key.clone(),
        };
        return compare_endpoints(&pool, &plan, &args);
    }
    let Some(model) = model else {
        return Err(CliError::from("name a model to benchmark"));
    };
    let plan = BenchPlan::new(&model, args.shape.clone());
    if args.peer.is_some() {
        compare(&pool, &plan, &args)
    } else {
        run_plan(&pool, &plan, &args)
    }
}

fn progress_bar(template: &str, json: bool) -> Result<ProgressBar, String> {
    let bar = ProgressBar::new(1).with_style(
        ProgressStyle::with_template(template)
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    Ok(bar)
}

/// Ondo against mlx-lm, alternating; Ondo's runs recorded in the history.
fn compare(pool: &SessionPool, plan: &BenchPlan, args: &BenchArgs) -> Result<ExitCode, CliError> {
    if !args.reports.is_empty() {
        return Err(CliError::from(
            "--report writes Ondo's own benchmark; for the comparison use --json or --markdown, \
                 or `ondo report --bench latest`",
        ));
    }
    let python = bench::peer::find_python(args.python.as_deref());
    let bar = progress_bar("{msg} [{bar:30}] {pos}/{len} runs, {elapsed}", args.json)?;
    bar.set_message("benchmarking");
    let result = bench::compare_with_mlx_lm(pool, plan, &python, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let result = result?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", table(&result, args.markdown));
        eprintln!(
            "Ondo's runs are in the history: ondo runs --bench {}",
            result.bench_id
        );
    }
    Ok(if result.token_verdict == bench::TokenVerdict::Different {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Servers (and Ondo's engine) side by side; every run recorded.
fn compare_endpoints(
    pool: &SessionPool,
    plan: &EndpointPlan,
    args: &BenchArgs,
) -> Result<ExitCode, CliError> {
    if !args.reports.is_empty() {
        return Err(CliError::from(
            "--report writes Ondo's own benchmark; for servers use --json or --markdown, or \
             `ondo report --bench latest` (every run of the comparison is recorded)",
        ));
    }
    let bar = progress_bar("{msg} [{bar:30}] {pos}/{len} runs, {elapsed}", args.json)?;
    bar.set_message("benchmarking");
    let result = bench::side_by_side::compare_with_endpoints(
        pool,
        plan,
        &CancelToken::new(),
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    );
    bar.finish_and_clear();
    let result = result?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", endpoint_table(&result, args.markdown));
    }
    Ok(ExitCode::SUCCESS)
}

/// Several streams at once on every side (`--concurrency`).
fn run_concurrency_plan(
    pool: &SessionPool,
    plan: &ConcurrencyPlan,
    args: &BenchArgs,
) -> Result<ExitCode, CliError> {
    if !args.reports.is_empty() {
        return Err(CliError::from(
            "--report writes Ondo's own benchmark; for a concurrency run use --json or \
             --markdown, or `ondo report --bench latest --format html` (every stream is \
             recorded, with its round's aggregate rate)",
        ));
    }
    let bar = progress_bar("{msg} [{bar:30}] {pos}/{len} rounds, {elapsed}", args.json)?;
    bar.set_message("streams at once");
    let result =
        bench::concurrency::run_concurrency(pool, plan, &CancelToken::new(), &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        });
    bar.finish_and_clear();
    let result = result?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", concurrency_table(&result, args.markdown));
    }
    Ok(ExitCode::SUCCESS)
}

/// The concurrency plan's table: one row per side and stream count.
pub fn concurrency_table(r: &ConcurrencyResult, markdown: bool) -> String {
    let e = &r.environment;
    let shape = &r.shape;
    let mut out = String::new();
    out.push_str(&format!(
        "sides: {} · streams at once: {} · prompts sized with {} · generate {} each · {} \
         rounds after {} warm-up · bench {}\n",
        r.sides.join(", "),
        r.levels
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        r.prompt_sizing,
        shape.generate_tokens,
        shape.repetitions,
        shape.warmup,
        r.bench_id
    ));
    out.push_str(&format!(
        "client: {} · {} · {:.0} GiB · Ondo {} ({}) · MLX {} ({})\n",
        e.cpu,
        e.os,
        e.memory_bytes as f64 / (1u64 << 30) as f64,
        e.ondo_version,
        e.build_profile,
        e.mlx_version,
        e.backend,
    ));
    out.push_str(&format!(
        "aggregate: every stream's tokens over the round's wall time; scaling: over the \
         side's own lowest level; ratio: over {}'s aggregate at the same level\n\n",
        r.reference
    ));
    let columns = [
        Column::left("side"),
        Column::right("prompt"),
        Column::right("streams"),
        Column::right("aggregate tok/s"),
        Column::right("scaling"),
        Column::right("ratio"),
        Column::right("per stream tok/s"),
        Column::right("TTFT p50 ms"),
        Column::right("TTFT p95 ms"),
        Column::right("peak"),
    ];
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            vec![
                row.side.clone(),
                row.prompt_tokens.to_string(),
                row.concurrency.to_string(),
                cell(&row.aggregate_tps, 1),
                format!("{:.2}x", row.scaling),
                row.aggregate_ratio
                    .map_or("—".to_owned(), |v| format!("{v:.2}x")),
                cell(&row.stream_decode_tps, 1),
                cell(&row.ttft_p50_ms, 1),
                cell(&row.ttft_p95_ms, 1),
                row.peak_bytes
                    .as_ref()
                    .map_or("—".to_owned(), |p| human_bytes(p.median as u64)),
            ]
        })
        .collect();
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    for warning in &r.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out.push_str(&format!(
        "recorded: ondo runs --bench {0} · ondo report --bench {0} --format html\n",
        r.bench_id
    ));
    out
}

/// The servers' comparison: who the sides are, then one row per side and
/// prompt length with ratios against the reference side.
pub fn endpoint_table(r: &EndpointComparison, markdown: bool) -> String {
    let e = &r.environment;
    let shape = &r.shape;
    let mut out = String::new();
    for side in &r.sides {
        let place = match (&side.endpoint_url, side.dialect) {
            (Some(url), Some(dialect)) => format!("{url} ({dialect})"),
            _ => "Ondo's engine, in this process".to_owned(),
        };
        let agreement = match side.same_text_as_ondo {
            Some(true) => " · greedy text equal to Ondo's",
            Some(false) => " · greedy text DIFFERENT from Ondo's on the same folder",
            None => "",
        };
        out.push_str(&format!(
            "{}: {} at {place}{agreement}\n",
            side.name, side.model
        ));
    }
    out.push_str(&format!(
        "prompts sized with {} · generate {} · {} reps after {} warm-up · bench {}\n",
        r.prompt_sizing, shape.generate_tokens, shape.repetitions, shape.warmup, r.bench_id
    ));
    out.push_str(&format!(
        "client: {} · {} · {:.0} GiB · Ondo {} ({}) · MLX {} ({})\n",
        e.cpu,
        e.os,
        e.memory_bytes as f64 / (1u64 << 30) as f64,
        e.ondo_version,
        e.build_profile,
        e.mlx_version,
        e.backend,
    ));
    out.push_str(&format!(
        "ratios: each side's median over {}'s; TTFT and decode as the stream arrived\n\n",
        r.reference
    ));
    let columns = [
        Column::left("side"),
        Column::right("prompt"),
        Column::right("server counted"),
        Column::right("TTFT ms"),
        Column::right("ratio"),
        Column::right("prompt tok/s"),
        Column::right("decode tok/s"),
        Column::right("ratio"),
        Column::right("own decode tok/s"),
    ];
    let ratio_cell = |value: Option<f64>| value.map_or("—".to_owned(), |v| format!("{v:.2}x"));
    let rows: Vec<Vec<String>> = r
        .results
        .iter()
        .map(|result| {
            vec![
                result.side.clone(),
                format!("{:.0}", result.sent_prompt_tokens.median),
                result
                    .server_prompt_tokens
                    .as_ref()
                    .map_or("—".to_owned(), |s| format!("{:.0}", s.median)),
                cell(&result.ttft_ms, 1),
                ratio_cell(result.ttft_ratio),
                cell(&result.prompt_tps, 0),
                cell(&result.decode_tps, 1),
                ratio_cell(result.decode_ratio),
                result
                    .own_decode_tps
                    .as_ref()
                    .map_or("—".to_owned(), |s| cell(s, 1)),
            ]
        })
        .collect();
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    for warning in &r.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out.push_str(&format!(
        "recorded: ondo runs --bench {0} · ondo report --bench {0} --format md\n",
        r.bench_id
    ));
    out
}

/// Ondo alone, with the plan's cases, recorded in the run history.
fn run_plan(pool: &SessionPool, plan: &BenchPlan, args: &BenchArgs) -> Result<ExitCode, CliError> {
    let bar = progress_bar("{bar:30} {pos}/{len} runs {elapsed} {msg}", args.json)?;
    let outcome = bench::plan::run_plan(pool, plan, &CancelToken::new(), &mut |p| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        bar.set_message(p.what);
    });
    bar.finish_and_clear();
    let outcome = outcome?;
    let title = format!(
        "ondo bench {} ({})",
        outcome.plan.model_id, outcome.bench_id
    );
    write_reports(args, &outcome.records, &title, pool)?;
    if args.json {
        print_json(&outcome)?;
    } else {
        print!("{}", plan_table(&outcome, args.markdown));
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the runs to every --report file.
fn write_reports(
    args: &BenchArgs,
    records: &[crate::store::RunRecord],
    title: &str,
    pool: &SessionPool,
) -> Result<(), CliError> {
    for path in &args.reports {
        write_report(path, records, title.to_owned(), pool)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// A question about images, timed (and, with --peer mlx-vlm, compared).
fn run_image_plan(
    pool: &SessionPool,
    plan: &ImagePlan,
    args: &BenchArgs,
) -> Result<ExitCode, CliError> {
    let python =
        (args.peer == Some(Peer::MlxVlm)).then(|| bench::peer::find_python(args.python.as_deref()));
    let bar = progress_bar("{msg} [{bar:30}] {pos}/{len} runs, {elapsed}", args.json)?;
    bar.set_message(if python.is_some() {
        "loading mlx-vlm, then benchmarking"
    } else {
        "benchmarking"
    });
    let outcome =
        bench::image::run_image_bench(pool, plan, python.as_deref(), &mut |done, total| {
            bar.set_message("benchmarking");
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        });
    bar.finish_and_clear();
    let outcome = outcome?;
    let title = format!(
        "ondo bench {} --image ({})",
        plan.plan.model_id, outcome.bench_id
    );
    let table = || image_table(&outcome, args.markdown);
    show_outcome(
        args,
        pool,
        &outcome,
        &outcome.records,
        &title,
        table,
        "Ondo's runs",
    )
}

/// Writes a benchmark's reports, then prints its outcome: as JSON, or as
/// its table and where `whose` runs are kept.
fn show_outcome<T: serde::Serialize>(
    args: &BenchArgs,
    pool: &SessionPool,
    outcome: &T,
    records: &[crate::store::RunRecord],
    title: &str,
    table: impl FnOnce() -> String,
    whose: &str,
) -> Result<ExitCode, CliError> {
    write_reports(args, records, title, pool)?;
    if args.json {
        print_json(outcome)?;
    } else {
        print!("{}", table());
        if let Some(bench_id) = records.first().and_then(|r| r.bench_id.as_deref()) {
            eprintln!("{whose} are in the history: ondo runs --bench {bench_id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One process against the model split over the hostfile's machines.
fn run_split_plan(
    pool: &SessionPool,
    plan: &bench::split::SplitPlan,
    args: &BenchArgs,
) -> Result<ExitCode, CliError> {
    let bar = progress_bar("{msg} [{bar:30}] {pos}/{len} runs, {elapsed}", args.json)?;
    bar.set_message("benchmarking");
    let outcome = bench::split::run_split_bench(pool, plan, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let outcome = outcome?;
    let title = format!(
        "ondo bench {} --hostfile ({})",
        plan.plan.model_id, outcome.bench_id
    );
    let table = || split_table(&outcome, args.markdown);
    show_outcome(
        args,
        pool,
        &outcome,
        &outcome.records,
        &title,
        table,
        "The runs",
    )
}

/// The split benchmark's table: one row per side, median (min–max).
pub fn split_table(r: &bench::split::SplitBenchOutcome, markdown: bool) -> String {
    let mut out = format!(
        "model: {} · prompt {} · generate {} · {} reps after {} warm-up · hosts: {} ({})\n\
         each side a fresh `ondo run`; link ms: a decode step's time on the links, estimated \
         from a timing taken when the ranks joined\n\n",
        r.model_dir.display(),
        r.prompt_tokens,
        r.generate_tokens,
        r.repetitions,
        r.warmup,
        if r.hosts.is_empty() {
            "?".to_owned()
        } else {
            r.hosts.join(", ")
        },
        r.backend.as_deref().unwrap_or("?"),
    );
    let columns = [
        Column::left("side"),
        Column::right("prefill tok/s"),
        Column::right("TTFT ms"),
        Column::right("decode tok/s"),
        Column::right("vs one process"),
        Column::right("bytes a step"),
        Column::right("link ms a step"),
        Column::right("prefill: bytes, link ms"),
        Column::right("compute ms a step (each rank alone)"),
        Column::left("tokens"),
    ];
    let rows: Vec<Vec<String>> = r
        .sides
        .iter()
        .map(|side| {
            vec![
                side.side.clone(),
                cell(&side.prefill_tps, 1),
                cell(&side.ttft_ms, 1),
                cell(&side.decode_tps, 1),
                side.decode_ratio
                    .map_or("—".into(), |ratio| format!("{ratio:.2}x")),
                side.step_bytes.map_or("—".into(), human_bytes),
                side.step_link_ms
                    .as_ref()
                    .map_or("—".into(), |s| format!("{:.2}", s.median)),
                match (side.prefill_bytes, &side.prefill_link_ms) {
                    (Some(bytes), Some(ms)) => {
                        format!("{}, {:.2}", human_bytes(bytes), ms.median)
                    }
                    _ => "—".into(),
                },
                side.rank_step_ms.clone().unwrap_or_else(|| "—".into()),
                match side.same_tokens_as_one_process {
                    None => "—".into(),
                    Some(true) => "same".into(),
                    Some(false) => "differ".into(),
                },
            ]
        })
        .collect();
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    out
}

/// The image benchmark's table: one row per side, median (min–max).
pub fn image_table(r: &ImageBenchOutcome, markdown: bool) -> String {
    let e = &r.environment;
    let mut out = String::new();
    let files: Vec<String> = r
        .images
        .iter()
        .map(|f| {
            format!(
                "{} ({}x{}, {})",
                f.path.display(),
                f.width,
                f.height,
                human_bytes(f.bytes)
            )
        })
        .collect();
    out.push_str(&format!(
        "model: {} ({} {}, {}) · {} · generate {} · {} reps after {} warm-up\n",
        r.model_dir.display(),
        e.model_type,
        e.quantization,
        human_bytes(e.weights_bytes),
        files.join(", "),
        r.generate_tokens,
        r.repetitions,
        r.warmup,
    ));
    out.push_str(&format!(
        "machine: {} · {} · {:.0} GiB · MLX {} ({}) · mlx-vlm {} · Ondo {} ({})\n",
        e.cpu,
        e.os,
        e.memory_bytes as f64 / (1u64 << 30) as f64,
        e.mlx_version,
        e.backend,
        r.mlx_vlm_version.as_deref().unwrap_or("not run"),
        e.ondo_version,
        e.build_profile,
    ));
    out.push_str(
        "TTFT: request to first token (decode and resize, vision tower, prefill); encode: \
         the vision tower and projector alone\n\n",
    );
    let columns = [
        Column::left("side"),
        Column::right("prompt"),
        Column::right("image tokens"),
        Column::right("encode ms"),
        Column::right("prefill ms"),
        Column::right("TTFT ms"),
        Column::right("decode tok/s"),
        Column::right("peak MiB"),
    ];
    let optional =
        |s: &Option<Summary>, digits| s.as_ref().map_or("—".into(), |s| cell(s, digits));
    let rows: Vec<Vec<String>> = r
        .sides
        .iter()
        .map(|side| {
            vec![
                side.side.clone(),
                side.prompt_tokens.to_string(),
                side.image_tokens.map_or("—".into(), |n| n.to_string()),
                optional(&side.image_encode_ms, 1),
                optional(&side.prefill_ms, 1),
                cell(&side.ttft_ms, 1),
                cell(&side.decode_tps, 1),
                format!("{:.1}", mib(side.peak_bytes.median)),
            ]
        })
        .collect();
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    if let (Some(ttft), Some(decode)) = (r.ttft_ratio, r.decode_ratio) {
        out.push_str(&format!(
            "\n{} / mlx-vlm: TTFT {ttft:.2}x (below 1 is quicker), decode {decode:.2}x (above 1 \
             is faster)",
            r.sides.first().map_or("ondo", |s| s.side.as_str()),
        ));
        match r.same_tokens_as_mlx_vlm {
            Some(true) => out.push_str(" · same greedy tokens in every repetition\n"),
            Some(false) => {
                out.push_str(" · greedy tokens differ from mlx-vlm's in at least one repetition\n")
            }
            None => out.push('\n'),
        }
    }
    out
}

fn report_format(path: &std::path::Path) -> Result<ReportFormat, String> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    ext.parse().map_err(|_| {
        format!(
            "{}: the report format comes from the extension: .json .jsonl .csv .md .html",
            path.display()
        )
    })
}

fn write_report(
    path: &std::path::Path,
    records: &[crate::store::RunRecord],
    title: String,
    pool: &crate::session::SessionPool,
) -> Result<(), String> {
    let format = report_format(path)?;
    let timelines = pool
        .with_store(|store| crate::report::timelines_of(store, records))
        .unwrap_or_default();
    let report = Report {
        runs: records,
        timelines: &timelines,
        title,
        generated_at: crate::store::now_rfc3339(),
    };
    crate::whole_file::write_atomically_with(path, |file| {
        let mut out = std::io::BufWriter::new(file);
        crate::report::write(&report, format, &mut out)?;
        std::io::Write::flush(&mut out)
    })
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// The plan's cases as a table: median (min–max) of the measured runs.
fn plan_table(outcome: &BenchOutcome, markdown: bool) -> String {
    let mut out = String::new();
    let first = outcome.records.first();
    if let Some(r) = first {
        out.push_str(&format!(
            "model: {} ({} {}, {}) · {} reps after {} warm-up · bench {}\n",
            outcome.plan.model_id,
            r.model_type,
            r.quantization,
            human_bytes(r.weights_bytes),
            outcome.plan.shape.repetitions,
            outcome.plan.shape.warmup,
            outcome.bench_id,
        ));
        out.push_str(&format!(
            "machine: {} · {} · {:.0} GiB · MLX {} ({}) · Ondo {} {} ({}){}\n\n",
            r.provenance.cpu,
            r.provenance.os,
            r.provenance.ram_bytes as f64 / (1u64 << 30) as f64,
            r.provenance.mlx_version,
            r.provenance.backend,
            r.provenance.app_version,
            r.provenance.app_commit,
            r.provenance.build_profile,
            outcome
                .memory_bandwidth_gbps
                .map_or(String::new(), |bw| format!(" · memory {bw:.1} GB/s")),
        ));
    }
    let varied = outcome.plan.shape.vary.as_ref().map(|v| match v.setting {
        VarySetting::PrefillStepSize => "prefill step",
        VarySetting::MaxKvSize => "max KV",
    });
    let mut columns = vec![Column::left("test"), Column::right("loop")];
    columns.extend(varied.map(Column::right));
    columns.extend(
        [
            "TTFT ms",
            "prefill tok/s",
            "decode tok/s",
            "peak MiB",
            "roofline %",
            "build ms/step",
            "wait ms/step",
            "nodes/step",
        ]
        .map(Column::right),
    );
    let rows: Vec<Vec<String>> = outcome
        .cases
        .iter()
        .map(|c| {
            let mut row = vec![c.case.test.clone(), c.case.loop_shape.to_string()];
            if let Some(v) = &outcome.plan.shape.vary {
                row.push(match v.setting {
                    VarySetting::PrefillStepSize => c.case.prefill_step_size.to_string(),
                    VarySetting::MaxKvSize => {
                        c.case.max_kv_size.map_or("-".into(), |n| n.to_string())
                    }
                });
            }
            row.extend([
                cell(&c.ttft_ms, 1),
                cell(&c.prefill_tps, 0),
                cell(&c.decode_tps, 1),
                format!("{:.1}", mib(c.mlx_peak_bytes.median)),
                c.decode_roofline_pct
                    .as_ref()
                    .map_or("-".into(), |s| format!("{:.1}", s.median)),
                c.anatomy
                    .as_ref()
                    .map_or("-".into(), |a| format!("{:.3}", a.host_build_ms.median)),
                c.anatomy
                    .as_ref()
                    .map_or("-".into(), |a| format!("{:.3}", a.wait_ms.median)),
                c.anatomy
                    .as_ref()
                    .and_then(|a| a.graph_nodes)
                    .map_or("-".into(), |n| n.to_string()),
            ]);
            row
        })
        .collect();
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    if let Some(cold) = &outcome.cold_start_ms {
        out.push_str(&format!(
            "\ncold start (fresh process, spawn to first token, {} runs): {} ms\n",
            cold.samples.len(),
            cell(cold, 0)
        ));
    }
    for warning in &outcome.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out.push_str(&format!(
        "recorded: ondo report --bench {} --format md\n",
        outcome.bench_id
    ));
    out
}

fn cell(s: &Summary, digits: usize) -> String {
    format!(
        "{:.digits$} ({:.digits$}–{:.digits$})",
        s.median, s.min, s.max
    )
}

/// The comparison as a text or Markdown table, ratios against mlx-lm.
pub fn table(r: &PeerComparison, markdown: bool) -> String {
    let e = &r.environment;
    let mut out = String::new();
    let shape = &r.plan.shape;
    let kv = shape
        .kv_bits
        .map(|bits| {
            format!(
                " · KV cache in {bits} bits (groups of {}, from position {}) on both sides",
                shape.kv_group_size, shape.quantized_kv_start
            )
        })
        .unwrap_or_default();
    out.push_str(&format!(
        "model: {} ({} {}, {}) · generate {} · {} reps after {} warm-up · prefill step {}{kv}\n",
        r.plan.model_dir.display(),
        e.model_type,
        e.quantization,
        human_bytes(e.weights_bytes),
        shape.generate_tokens,
        shape.repetitions,
        shape.warmup,
        shape.prefill_step_size,
    ));
    out.push_str(&format!(
        "machine: {} · {} · {:.0} GiB · MLX {} ({}) · mlx-lm {} · Ondo {} ({})\n\n",
        e.cpu,
        e.os,
        e.memory_bytes as f64 / (1u64 << 30) as f64,
        e.mlx_version,
        e.backend,
        e.mlx_lm_version.as_deref().unwrap_or("not run"),
        e.ondo_version,
        e.build_profile,
    ));
    let columns = [
        Column::left("side"),
        Column::right("prompt"),
        Column::right("TTFT ms"),
        Column::right("prompt tok/s"),
        Column::right("vs mlx-lm"),
        Column::right("decode tok/s"),
        Column::right("vs mlx-lm"),
        Column::right("peak MiB"),
        Column::right("vs mlx-lm"),
        Column::right("build ms/step"),
        Column::right("wait ms/step"),
        Column::right("nodes/step"),
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for result in &r.results {
        let reference = r
            .results
            .iter()
            .find(|x| x.side == "mlx-lm" && x.prompt_tokens == result.prompt_tokens);
        let vs = |ours: &Summary, pick: fn(&bench::SideResult) -> &Summary| match reference {
            Some(reference) if result.side != "mlx-lm" => {
                format!("{:.2}x", ratio(ours.median, pick(reference).median))
            }
            _ => "—".to_owned(),
        };
        let anatomy = result.anatomy.as_ref();
        let peak = Summary::from_samples(
            &result
                .mlx_peak_bytes
                .samples
                .iter()
                .map(|b| mib(*b))
                .collect::<Vec<_>>(),
        );
        rows.push(vec![
            result.side.clone(),
            result.prompt_tokens.to_string(),
            cell(&result.ttft_ms, 1),
            cell(&result.prompt_tps, 0),
            vs(&result.prompt_tps, |x| &x.prompt_tps),
            cell(&result.decode_tps, 1),
            vs(&result.decode_tps, |x| &x.decode_tps),
            format!("{:.1}", peak.median),
            vs(&result.mlx_peak_bytes, |x| &x.mlx_peak_bytes),
            anatomy.map_or("—".into(), |a| format!("{:.3}", a.host_build_ms.median)),
            anatomy.map_or("—".into(), |a| format!("{:.3}", a.wait_ms.median)),
            anatomy
                .and_then(|a| a.graph_nodes)
                .map_or("—".into(), |n| n.to_string()),
        ]);
    }
    out.push_str(&text_table::render(table_style(markdown), &columns, &rows));
    if let Some(cold) = &r.cold_start {
        out.push_str(&format!(
            "\ncold start (spawn to first token, median of {}): ondo {} ms",
            cold.ondo_ms.samples.len(),
            cell(&cold.ondo_ms, 0)
        ));
        if let Some(theirs) = &cold.mlx_lm_ms {
            out.push_str(&format!(
                " · mlx-lm {} ms · ratio {:.2}x",
                cell(theirs, 0),
                ratio(cold.ondo_ms.median, theirs.median)
            ));
        }
        out.push('\n');
    }
    out.push_str(&r.token_check.describe());
    out.push('\n');
    if e.build_profile == "debug" {
        out.push_str("warning: debug build; run `make release` and bench again\n");
    }
    out
}

fn table_style(markdown: bool) -> TableStyle {
    if markdown {
        TableStyle::Markdown
    } else {
        TableStyle::Plain
    }
}
