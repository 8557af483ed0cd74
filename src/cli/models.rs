//! `ondo pull`, `ls`, `rm`, `fit` and `search`: getting models and knowing
//! what is on this machine, over `crate::hub`.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::hub::{
    DownloadCancel, DownloadEvent, DownloadOptions, Hub, HubConfig, HubError, ModelRef, OnCancel,
    catalog,
    fit::{FitEstimate, Verdict},
    http::{BusyWait, WaitWatch},
    library::{self, LibraryModel, ModelSource},
    sizing::{self, MachineMemory, ModelFacts},
};
use crate::paths::DataDirs;
use crate::text_table::{self, Column, TableStyle};
use crate::units::human_bytes;

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            CliError::new(
                ErrorKind::Internal,
                format!("cannot start the async runtime: {e}"),
            )
        })
}

fn hub() -> Result<(Hub, DataDirs), CliError> {
    let dirs = DataDirs::from_env();
    let hub = Hub::new(HubConfig::from_env(&dirs))?;
    Ok((hub, dirs))
}

/// A hub error, about `model` when the command named one; with `--json` also printed as
/// `{"error": {kind, message, hint}}` on stdout so scripts can branch on
/// the kind.
fn fail(err: HubError, model: Option<&str>, json: bool) -> CliError {
    let mut error = CliError::from(err);
    error.model = model.map(str::to_owned);
    if json {
        println!("{}", error.to_json());
    }
    error
}

/// MLX's recommended working set on a Mac (None on Linux's CPU backend).
fn working_set() -> Option<u64> {
    if cfg!(target_os = "macos") {
        crate::metrics::mlx_runtime::MlxRuntime::detect().recommended_working_set_bytes
    } else {
        None
    }
}

// ---------------------------------------------------------------- pull

#[derive(Debug, Args)]
pub struct PullArgs {
    /// The model on the hub: ORG/NAME or ORG/NAME@REVISION (a branch, tag or
    /// commit), for example mlx-community/Qwen3-0.6B-4bit.
    model: String,
    /// Context length the fit verdict shown before the download assumes.
    #[arg(long, default_value_t = crate::hub::fit::DEFAULT_CONTEXT_TOKENS)]
    context: u64,
    /// On Ctrl-C, delete the unfinished file instead of keeping it for resume.
    #[arg(long)]
    discard_partial: bool,
    /// Print one JSON record (the summary, or the error with its kind) and no progress bar.
    #[arg(long)]
    json: bool,
}

/// Downloads a model into the shared Hugging Face cache.
pub fn pull(args: PullArgs) -> Result<ExitCode, CliError> {
    let model = match ModelRef::parse(&args.model) {
        Ok(model) => model,
        Err(err) => return Err(fail(err, Some(&args.model), args.json)),
    };
    let (hub, _dirs) = hub()?;
    let rt = runtime()?;
    let cancel = DownloadCancel::new();
    let on_cancel = if args.discard_partial {
        OnCancel::RemovePartial
    } else {
        OnCancel::KeepPartial
    };
    let result = rt.block_on(async {
        if !hub.config().offline && !args.json {
            // The verdict before the bytes: a model that cannot run here is
            // better known before gigabytes arrive.
            let mut on_wait = |wait: BusyWait| {
                let wait_ms = wait.wait.as_millis() as u64;
                let line = busy_line(
                    wait.file.as_deref(),
                    wait.status,
                    wait_ms,
                    wait.attempt,
                    wait.attempts,
                );
                eprintln!("  {line}");
            };
            let mut watch = WaitWatch {
                on_wait: Some(&mut on_wait),
                cancel: None,
            };
            match hub.facts_from_hub_watched(&model, &mut watch).await {
                Ok(facts) => {
                    let estimate = facts.estimate(args.context, MachineMemory::read(working_set()));
                    eprintln!("{}", verdict_line(&estimate));
                }
                // Waited out already: the download would only wait again.
                // An architecture the engine does not run is refused here,
                // before any weights.
                Err(
                    err @ (HubError::RateLimited { .. }
                    | HubError::ServerError { .. }
                    | HubError::UnsupportedModelType { .. }),
                ) => {
                    return Err(err);
                }
                // The download names any other problem in its own words.
                Err(_) => {}
            }
        }
        let ctrl_c = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    cancel.cancel();
                }
            })
        };
        let mut bar = PullProgress::new(args.json, std::io::stderr().is_terminal());
        let result = hub
            .download(
                &model,
                DownloadOptions {
                    on_cancel,
                    share: None,
                },
                &mut |event| bar.show(&event),
                &cancel,
            )
            .await;
        ctrl_c.abort();
        bar.finish();
        result
    });
    match result {
        Ok(summary) => {
            if args.json {
                println!("{}", serde_json::to_string(&summary).expect("plain data"));
            } else {
                let fetched = if summary.fetched_bytes == 0 {
                    "already downloaded".to_owned()
                } else {
                    format!(
                        "fetched {} in {:.1} s",
                        human_bytes(summary.fetched_bytes),
                        summary.download_ms / 1e3
                    )
                };
                println!("{model}: {fetched}");
                println!("  {}", summary.snapshot_dir.display());
                println!("  run it: ondo run {model} \"Hello\"");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(HubError::Cancelled) if on_cancel == OnCancel::KeepPartial => {
            eprintln!("paused: what arrived is kept; run `ondo pull {model}` again to continue");
            Err(fail(HubError::Cancelled, Some(&args.model), args.json))
        }
        Err(err) => Err(fail(err, Some(&args.model), args.json)),
    }
}

/// Downloads what one rank of a split model reads of `model` (the files
/// holding its layers, when split by layers) into the Hugging Face cache,
/// with plain progress lines labelled with the rank. Returns the snapshot
/// folder.
pub(crate) fn fetch_share(
    model: &ModelRef,
    share: crate::hub::RankPart,
) -> Result<std::path::PathBuf, CliError> {
    let (hub, _dirs) = hub()?;
    let rt = runtime()?;
    let cancel = DownloadCancel::new();
    let mut bar = PullProgress::new(false, false);
    bar.label = format!("rank {}: ", share.rank);
    let summary = rt
        .block_on(hub.download(
            model,
            DownloadOptions {
                on_cancel: OnCancel::KeepPartial,
                share: Some(share),
            },
            &mut |event| bar.show(&event),
            &cancel,
        ))
        .map_err(|err| fail(err, Some(&model.to_string()), false))?;
    if summary.fetched_bytes > 0 {
        eprintln!(
            "rank {}: fetched {} of {model} in {:.1} s",
            share.rank,
            human_bytes(summary.fetched_bytes),
            summary.download_ms / 1e3
        );
    }
    Ok(summary.snapshot_dir)
}

/// A progress bar with bytes, speed and ETA, or plain lines when stderr is
/// not a terminal (logs, CI).
struct PullProgress {
    bar: Option<ProgressBar>,
    plain: bool,
    /// `--json`: stdout carries the record, stderr nothing.
    silent: bool,
    last_plain_percent: u64,
    /// Put before each plain line ("rank 1: "): several ranks may print to
    /// one terminal.
    label: String,
}

impl PullProgress {
    fn new(silent: bool, terminal: bool) -> Self {
        Self {
            bar: None,
            plain: !terminal,
            silent,
            last_plain_percent: 0,
            label: String::new(),
        }
    }

    fn show(&mut self, event: &DownloadEvent) {
        if self.silent {
            return;
        }
        match event {
            DownloadEvent::Planned {
                model,
                files,
                total_bytes,
                present_bytes,
                ..
            } => {
                let already = if *present_bytes > 0 {
                    format!(", {} already here", human_bytes(*present_bytes))
                } else {
                    String::new()
                };
                eprintln!(
                    "{}{model}: {files} files, {}{already}",
                    self.label,
                    human_bytes(*total_bytes)
                );
                if !self.plain {
                    let bar = ProgressBar::new(*total_bytes);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                        )
                        .expect("valid template")
                        .progress_chars("=> "),
                    );
                    bar.set_position(*present_bytes);
                    bar.enable_steady_tick(Duration::from_millis(200));
                    self.bar = Some(bar);
                }
            }
            DownloadEvent::Progress {
                file,
                done_bytes,
                total_bytes,
                bytes_per_second,
                eta_seconds,
                ..
            } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(*done_bytes);
                    bar.set_message(file.clone());
                } else if *total_bytes > 0 {
                    let percent = done_bytes * 100 / total_bytes;
                    if percent >= self.last_plain_percent + 10 {
                        self.last_plain_percent = percent - percent % 10;
                        let eta = eta_seconds.map_or(String::new(), |s| format!(", {s:.0} s left"));
                        eprintln!(
                            "{}  {percent}% {}/s{eta}",
                            self.label,
                            human_bytes(*bytes_per_second as u64)
                        );
                    }
                }
            }
            DownloadEvent::Retrying {
                file,
                attempt,
                detail,
            } => {
                let line = format!("  {file}: {detail}; resuming (attempt {attempt})");
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
            }
            DownloadEvent::HubBusy {
                file,
                status,
                wait_ms,
                attempt,
                attempts,
            } => {
                let line = busy_line(file.as_deref(), *status, *wait_ms, *attempt, *attempts);
                // In the bar's own line while it waits; the next progress
                // puts the file name back.
                match &self.bar {
                    Some(bar) => bar.set_message(line),
                    None => eprintln!("  {line}"),
                }
            }
            DownloadEvent::FileDone { .. } => {}
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// "hub busy (503) on config.json, retrying in 4 s, attempt 2 of 6"
fn busy_line(file: Option<&str>, status: u16, wait_ms: u64, attempt: u32, attempts: u32) -> String {
    let on = file.map_or(String::new(), |file| format!(" on {file}"));
    format!(
        "hub busy ({status}){on}, retrying in {} s, attempt {attempt} of {attempts}",
        wait_ms.div_ceil(1000).max(1)
    )
}

// ---------------------------------------------------------------- ls

#[derive(Debug, Args)]
pub struct LsArgs {
    /// List the curated catalog instead, with a fit verdict for this machine.
    #[arg(long)]
    catalog: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the models on this machine (or the catalog).
pub fn ls(args: LsArgs) -> Result<ExitCode, CliError> {
    let dirs = DataDirs::from_env();
    if args.catalog {
        return list_catalog(&dirs, args.json);
    }
    let models = library::scan(&dirs);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&models).expect("plain data")
        );
        return Ok(ExitCode::SUCCESS);
    }
    if models.is_empty() {
        println!(
            "No models yet in {} or {}.\nGet one: ondo pull {}   (or try `ondo run tiny \"hi\"` with the built-in speed-test model)",
            dirs.hf_cache_dir.display(),
            dirs.models_dir.display(),
            catalog::DEFAULT_MODEL
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 6]> = models.iter().map(library_row).collect();
    let columns = ["MODEL", "SIZE", "QUANT", "PARAMS", "TYPE", "REVISION"].map(Column::left);
    print!("{}", text_table::render(TableStyle::Plain, &columns, &rows));
    for model in &models {
        for note in [&model.problem, &model.unsupported].into_iter().flatten() {
            println!("note: {}: {note}", model.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn library_row(model: &LibraryModel) -> [String; 6] {
    let name = match model.source {
        ModelSource::HubCache => model.id.clone(),
        ModelSource::Folder => format!("{} (folder)", model.id),
        ModelSource::Ondo => format!("{} (ondo)", model.id),
    };
    let name = if !model.complete {
        format!("{name} [incomplete]")
    } else if model.unsupported.is_some() {
        format!("{name} [not supported yet]")
    } else if model.embedding {
        format!("{name} [embedding]")
    } else {
        name
    };
    let revision = match (&model.commit, model.revisions.first()) {
        (Some(commit), Some(rev)) => format!("{rev} {}", &commit[..commit.len().min(8)]),
        (Some(commit), None) => commit[..commit.len().min(8)].to_owned(),
        _ => "-".to_owned(),
    };
    [
        name,
        human_bytes(model.size_on_disk_bytes),
        model.quantization.clone().unwrap_or_else(|| "-".into()),
        model.parameters.map_or("-".into(), human_count),
        model.model_type.clone().unwrap_or_else(|| "-".into()),
        revision,
    ]
}

fn list_catalog(dirs: &DataDirs, json: bool) -> Result<ExitCode, CliError> {
    let offers = sizing::catalog_offers(
        &dirs.hf_cache_dir,
        crate::hub::fit::DEFAULT_CONTEXT_TOKENS,
        MachineMemory::read(working_set()),
    );
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&offers).expect("plain data")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let table: Vec<[String; 6]> = offers
        .iter()
        .map(|offer| {
            let entry = offer.entry;
            let mark = if offer.downloaded {
                " (downloaded)"
            } else if offer.unsupported.is_some() {
                " (not supported yet)"
            } else {
                ""
            };
            [
                format!("{}{mark}", entry.repo_id),
                format!("~{}", human_bytes(entry.size_bytes)),
                entry.quantization.to_owned(),
                parameters_cell(entry.parameters, offer.fit.active_parameters),
                verdict_word(offer.fit.verdict).to_owned(),
                entry.note.to_owned(),
            ]
        })
        .collect();
    let columns = ["MODEL", "SIZE", "QUANT", "PARAMS", "FIT@4K", "NOTE"].map(Column::left);
    print!(
        "{}",
        text_table::render(TableStyle::Plain, &columns, &table)
    );
    for offer in &offers {
        if let Some(reason) = &offer.unsupported {
            println!("note: {}: {reason}", offer.entry.repo_id);
        }
    }
    println!("Download one: ondo pull MODEL   (sizes are approximate until the hub is asked)");
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------- rm

#[derive(Debug, Args)]
pub struct RmArgs {
    /// A repo id in the Hugging Face cache, or a folder added to the library
    /// (its files are left alone; it is only forgotten).
    model: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,
}

/// Removes a model from the library.
pub fn rm(args: RmArgs) -> Result<ExitCode, CliError> {
    let dirs = DataDirs::from_env();
    let as_path = Path::new(&args.model);
    if as_path.is_dir()
        && library::user_folders(&dirs)
            .iter()
            .any(|f| same_path(f, as_path))
    {
        library::remove_folder(&dirs, as_path)?;
        crate::session::prompt_cache::clear(&dirs.prompt_cache_dir(), Some(as_path));
        println!("forgot {} (its files are untouched)", as_path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let model = ModelRef::parse(&args.model).map_err(|e| CliError::from(e).about(&args.model))?;
    let Some(entry) = library::find_cached(&dirs.hf_cache_dir, &model.repo_id) else {
        let message = format!(
            "{} is not in the Hugging Face cache at {}",
            model.repo_id,
            dirs.hf_cache_dir.display()
        );
        return Err(CliError::new(ErrorKind::NotInLibrary, message).about(&args.model));
    };
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return Err(CliError::new(
                ErrorKind::InvalidInput,
                format!(
                    "this would delete {} ({}); pass --yes to confirm",
                    model.repo_id,
                    human_bytes(entry.size_on_disk_bytes)
                ),
            ));
        }
        eprint!(
            "Delete {} ({}) from {}? It is shared with mlx-lm and transformers. [y/N] ",
            model.repo_id,
            human_bytes(entry.size_on_disk_bytes),
            dirs.hf_cache_dir.display()
        );
        std::io::stderr().flush().ok();
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer).ok();
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("kept {}", model.repo_id);
            return Ok(ExitCode::SUCCESS);
        }
    }
    // Its prompt caches go with it (matched by folder, so first).
    crate::session::prompt_cache::clear(
        &dirs.prompt_cache_dir(),
        Some(&dirs.hf_cache_dir.join(model.cache_folder_name())),
    );
    let freed = library::delete_cached(&dirs.hf_cache_dir, &model)?;
    println!("removed {}, freed {}", model.repo_id, human_bytes(freed));
    Ok(ExitCode::SUCCESS)
}

fn same_path(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    canon(a) == canon(b)
}

// ---------------------------------------------------------------- fit

#[derive(Debug, Args)]
pub struct FitArgs {
    /// A model folder, a repo id (looked up in the cache, then on the hub
    /// without downloading, then in the catalog), or `tiny`.
    model: String,
    /// Context to size the KV cache for: prompt and answer together, in tokens.
    #[arg(long, default_value_t = crate::hub::fit::DEFAULT_CONTEXT_TOKENS)]
    context: u64,
    /// Print the estimate as JSON (weights_bytes, kv_cache_bytes,
    /// overhead_bytes, available_bytes, verdict, ...).
    #[arg(long)]
    json: bool,
}

/// Says whether a model fits in this machine's memory, and what to change if not.
pub fn fit(args: FitArgs) -> Result<ExitCode, CliError> {
    let (facts, label) =
        model_facts(&args.model).map_err(|e| fail(e, Some(&args.model), args.json))?;
    let estimate = facts.estimate(args.context, MachineMemory::read(working_set()));
    if args.json {
        let mut record = serde_json::to_value(&estimate).expect("plain data");
        record["model"] = label.into();
        record["source"] = facts.source.into();
        println!(
            "{}",
            serde_json::to_string_pretty(&record).expect("plain data")
        );
    } else {
        println!("{label} at {} tokens of context:", args.context);
        let window = estimate
            .kv_cache_note
            .as_ref()
            .map_or(String::new(), |note| format!("; {note}"));
        println!(
            "  weights   {:>10}\n  KV cache  {:>10}  ({} per token, {}{window})\n  overhead  {:>10}\n  needed    {:>10}\n  available {:>10}{}",
            human_bytes(estimate.weights_bytes),
            human_bytes(estimate.kv_cache_bytes),
            human_bytes(estimate.kv_bytes_per_token),
            facts.shape.kv_dtype.name(),
            human_bytes(estimate.overhead_bytes),
            human_bytes(estimate.needed_bytes),
            human_bytes(estimate.available_bytes),
            estimate
                .working_set_bytes
                .map_or(String::new(), |w| format!(
                    "  (GPU working set {})",
                    human_bytes(w)
                )),
        );
        if let Some(parameters) = estimate.parameters {
            let experts = estimate
                .experts_note
                .as_ref()
                .map_or(String::new(), |note| format!(" ({note})"));
            println!(
                "  parameters {}{experts}",
                parameters_cell(parameters, estimate.active_parameters)
            );
        }
        println!("{}", verdict_line(&estimate));
        for advice in &estimate.advice {
            println!("  - {advice}");
        }
        if facts.source == "catalog" {
            println!("  (sizes from Ondo's catalog, approximate: the hub could not be asked)");
        }
    }
    Ok(match estimate.verdict {
        Verdict::WillNotFit => ExitCode::from(2),
        _ => ExitCode::SUCCESS,
    })
}

/// Finds the facts for what the user typed: `tiny`, then what the hub
/// client resolves (folder, cache, hub, catalog).
fn model_facts(text: &str) -> Result<(ModelFacts, String), HubError> {
    let dirs = DataDirs::from_env();
    if text == "tiny" {
        let dir = crate::synth::builtin_tiny_model(&dirs).map_err(|e| HubError::NotAModel {
            repo_id: "tiny".into(),
            reason: e.to_string(),
        })?;
        return Ok((sizing::facts_from_folder(&dir)?, "tiny (built-in)".into()));
    }
    let hub = Hub::new(HubConfig::from_env(&dirs))?;
    runtime()
        .map_err(|error| HubError::Unreachable {
            endpoint: hub.config().endpoint.clone(),
            detail: error.message,
        })?
        .block_on(hub.facts_for(text))
}

pub(crate) fn verdict_word(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Fits => "fits",
        Verdict::Tight => "tight",
        Verdict::WillNotFit => "will not fit",
    }
}

/// One line: the verdict with the two numbers behind it.
pub(crate) fn verdict_line(estimate: &FitEstimate) -> String {
    format!(
        "fit: {} (needs {} of {} available at {} tokens of context)",
        verdict_word(estimate.verdict),
        human_bytes(estimate.needed_bytes),
        human_bytes(estimate.budget_bytes),
        estimate.context_tokens
    )
}

// ---------------------------------------------------------------- search

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Part of a model's name, for example "qwen3 4bit" or "llama-3.2".
    text: String,
    /// Most results to show.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    #[arg(long)]
    json: bool,
}

/// Searches the hub for MLX models by name.
pub fn search(args: SearchArgs) -> Result<ExitCode, CliError> {
    let (hub, dirs) = hub()?;
    // The hub searches for one substring; words are matched in order as one.
    let query = args.text.split_whitespace().collect::<Vec<_>>().join("-");
    let hits = runtime()?.block_on(hub.search(&query, args.limit));
    let hits = match hits {
        Ok(hits) => hits,
        Err(err) => {
            let offline: Vec<&catalog::CatalogEntry> = catalog::catalog()
                .iter()
                .filter(|e| words_match(e.repo_id, &args.text))
                .collect();
            if offline.is_empty() || args.json {
                return Err(fail(err, None, args.json));
            }
            eprintln!("{err}\nFrom Ondo's catalog instead:");
            for entry in offline {
                println!("{}  ~{}", entry.repo_id, human_bytes(entry.size_bytes));
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&hits).expect("plain data")
        );
        return Ok(ExitCode::SUCCESS);
    }
    if hits.is_empty() {
        println!("No MLX models match \"{}\".", args.text);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 3]> = hits
        .iter()
        .map(|hit| {
            let mut marks = Vec::new();
            if library::find_cached(&dirs.hf_cache_dir, &hit.id).is_some() {
                marks.push("downloaded".to_owned());
            }
            if catalog::find(&hit.id).is_some() {
                marks.push("in catalog".to_owned());
            }
            if let Some(reason) = &hit.unsupported {
                marks.push(reason.clone());
            }
            [hit.id.clone(), human_count(hit.downloads), marks.join(", ")]
        })
        .collect();
    let columns = ["MODEL", "DOWNLOADS", ""].map(Column::left);
    print!("{}", text_table::render(TableStyle::Plain, &columns, &rows));
    Ok(ExitCode::SUCCESS)
}

fn words_match(id: &str, text: &str) -> bool {
    let id = id.to_lowercase();
    text.split_whitespace()
        .all(|w| id.contains(&w.to_lowercase()))
}

// ---------------------------------------------------------------- shared

/// "30.5B, 3.35B active per token" for a mixture of experts, "3.2B" otherwise.
fn parameters_cell(parameters: u64, active_parameters: Option<u64>) -> String {
    match active_parameters {
        Some(active) => format!(
            "{}, {} active per token",
            human_count(parameters),
            human_count(active)
        ),
        None => human_count(parameters),
    }
}

/// 1.2B, 350M, 12K.
fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.0}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
