//! `ondo run` and `ondo chat`: clients of the session pool (every turn is a
//! `pool.run`, recorded like any other run) that stream the answer and
//! print where the time went.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::engine::chat_template::ChatMessage;
use crate::engine::constrain::OutputConstraint;
use crate::engine::{CancelToken, GenerateRequest, Prompt, RunEvent, RunStats};
use crate::paths::DataDirs;
use crate::resolve::{NamedBy, ResolvedModel, resolve_model};
use crate::run_kinds::{PrefixSource, RunKind};
use crate::session::chat::{ChatFeatures, GenerationSettings};
use crate::session::{PoolSettings, SessionPool};
use crate::store::Store;
use crate::units::human_bytes;

/// What `run` and `chat` share: the model, the generation settings (the
/// same settings the app's Settings screen edits) and how to run.
#[derive(Debug, Args)]
pub struct GenerationArgs {
    /// A model folder, a downloaded repo id
    /// (mlx-community/Llama-3.2-3B-Instruct-4bit), or `tiny` for the
    /// built-in synthetic model. Repo ids are looked up in the models folder
    /// the app's Settings name, then the Hugging Face cache.
    model: String,
    #[command(flatten)]
    settings: GenerationSettings,
    /// A system message put before the conversation.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Stop when the answer reaches this text (repeatable; not printed).
    #[arg(long = "stop")]
    stop_strings: Vec<String>,
    /// Keep generating past end-of-sequence tokens (for timing exactly
    /// --max-tokens tokens).
    #[arg(long)]
    ignore_eos: bool,
    /// Load even when the fit estimate says the model will not fit in the
    /// memory available (it may swap or fail).
    #[arg(long)]
    load_anyway: bool,
    /// Do not record this run in the history (`ondo runs`).
    #[arg(long)]
    no_history: bool,
    /// Print only the answer of a model that thinks first (Qwen3,
    /// DeepSeek-R1, gpt-oss), not its reasoning. The reasoning is still
    /// generated, timed and counted in the footer.
    #[arg(long)]
    hide_thinking: bool,
    /// Ask a model whose chat template has a thinking switch (Qwen3 and its
    /// kin read `enable_thinking`) to reason before answering (`on`) or to
    /// answer at once (`off`). Unset, the template's own default. Models
    /// without the switch ignore it (a note says so).
    #[arg(long, value_name = "on|off", value_parser = on_or_off)]
    think: Option<bool>,
    /// Hold the answer to JSON valid against this JSON schema: a file, or
    /// the schema itself ('{"type": "object", ...}'). Each token is drawn
    /// only among those the schema allows; the footer says what working
    /// that out cost per token.
    #[arg(long, value_name = "FILE|SCHEMA", conflicts_with = "json_object")]
    json_schema: Option<String>,
    /// Hold the answer to a JSON object (any keys and values).
    #[arg(long)]
    json_object: bool,
    /// Neither read a saved prompt cache from the disk nor save this
    /// conversation's there (the whole prompt is prefilled; see `ondo cache`).
    #[arg(long)]
    no_disk_cache: bool,
    /// Start from this prompt cache (a file `mlx_lm.cache_prompt` wrote, or
    /// one `ondo cache ls` lists) and read the prompt as what follows it,
    /// as `mlx_lm.generate --prompt-cache-file` does.
    #[arg(long, value_name = "FILE")]
    prompt_cache_file: Option<std::path::PathBuf>,
}

/// `--json-schema`'s value: the schema itself, or a file holding it.
fn read_schema(value: &str) -> Result<serde_json::Value, String> {
    let text = if value.trim_start().starts_with(['{', '[']) || value.trim() == "true" {
        value.to_owned()
    } else {
        std::fs::read_to_string(value)
            .map_err(|e| format!("--json-schema {value}: {e}; give a file or the schema itself"))?
    };
    serde_json::from_str(&text).map_err(|e| format!("--json-schema: not JSON: {e}"))
}

/// `--think`'s value.
fn on_or_off(value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        other => Err(format!("`{other}`: say `on` or `off`")),
    }
}

impl GenerationArgs {
    /// How the reply is printed: the reasoning shown or not, dimmed where
    /// it goes to a terminal (and `NO_COLOR` is not set).
    fn terminal_reply(&self) -> TerminalReply {
        TerminalReply {
            show_reasoning: !self.hide_thinking,
            dim_reasoning: std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            reasoning_shown: false,
        }
    }

    fn request(&self, model_dir: &Path, prompt: Prompt) -> GenerateRequest {
        let prompt = match self.think {
            Some(think) => prompt.with_thinking(think),
            None => prompt,
        };
        GenerateRequest {
            stop_strings: self.stop_strings.clone(),
            ignore_eos: self.ignore_eos,
            disk_cache: !self.no_disk_cache,
            prompt_cache_file: self.prompt_cache_file.clone(),
            ..self.settings.request(model_dir, prompt)
        }
        .hold_to(self.constraint().ok().flatten())
    }

    /// What --json-schema or --json-object hold the answer to.
    fn constraint(&self) -> Result<Option<OutputConstraint>, String> {
        if self.json_object {
            return Ok(Some(OutputConstraint::JsonObject));
        }
        let Some(value) = &self.json_schema else {
            return Ok(None);
        };
        let constraint = OutputConstraint::JsonSchema {
            schema: read_schema(value)?,
            strict: true,
        };
        constraint
            .check()
            .map_err(|e| format!("--json-schema cannot be enforced: {e}"))?;
        Ok(Some(constraint))
    }

    /// The pool this command runs through and the model it names, with the
    /// settings and the fit checked first.
    fn start(&self) -> Result<(SessionPool, ResolvedModel), CliError> {
        self.start_as(None).map(|(pool, model, _)| (pool, model))
    }

    /// `start`, for one rank of a split run when `split`: the rank holds
    /// only its share of the layers, so the whole model need not fit here.
    /// The pool and the model; as one rank of `launch`, also the ranks it
    /// joined (this rank fetching its share of the model where it lacks it).
    #[allow(clippy::type_complexity)]
    fn start_as(
        &self,
        launch: Option<&crate::engine::distributed::Launch>,
    ) -> Result<
        (
            SessionPool,
            ResolvedModel,
            Option<Vec<crate::engine::distributed::handshake::RankIdentity>>,
        ),
        CliError,
    > {
        self.settings
            .check()
            .map_err(|e| CliError::new(ErrorKind::InvalidSettings, e))?;
        self.constraint()
            .map_err(|e| CliError::new(ErrorKind::InvalidSettings, e))?;
        if let Some(Err(e)) = crate::environment::MEMORY_LIMIT.bytes() {
            return Err(CliError::new(ErrorKind::InvalidSettings, e));
        }
        let pool = session_pool(self.no_history)?;
        let (model, ranks) = match launch {
            Some(launch) => {
                let (model, ranks) = super::launch::join_with_model(&pool, &self.model, launch)?;
                (model, Some(ranks))
            }
            None => {
                let model = resolve_model(&pool, &self.model, NamedBy::Local)
                    .map_err(|e| CliError::from(e).about(&self.model))?;
                check_fit(&model.dir, self)?;
                (model, None)
            }
        };
        if self.think.is_some() && !ChatFeatures::of_model_dir(&model.dir).thinking_switch {
            eprintln!(
                "note: this model's chat template has no thinking switch (it does not read \
                 enable_thinking), so --think changes nothing"
            );
        }
        Ok((pool, model, ranks))
    }
}

#[derive(Debug, Args)]
#[command(after_help = "\
The answer streams to stdout; the timings follow on stderr:
  load     reading the weights (cold runs only; 0 when the model was warm)
  TTFT     time to first token: prefill, one pass over the whole prompt
  decode   every later token, one pass each, while the KV cache grows
           (a thinking model's reasoning tokens included, counted apart)

A model that thinks before answering (Qwen3, DeepSeek-R1, gpt-oss) has its
reasoning printed on stderr before the answer, dimmed on a terminal;
--hide-thinking leaves it out. Either way stdout holds only the answer.
--think off asks a model with a thinking switch (Qwen3) not to reason at all:
a shorter answer, no reasoning tokens to wait for.

A model too large for one machine runs split over several: --hostfile names
them (this one first; Ondo starts the others over ssh), or start the same
command on each with mlx.launch. --split pipeline (the default) gives each
machine a range of layers: any family, the memory of all of them, the speed
of one. --split tensor gives each a share of every layer's heads: both work
on every token, which pays on a fast link (Thunderbolt) and costs on a slow
one. Before loading, rank 0 prints who holds what and whether each share
fits that machine's memory.

Examples:
  ondo run tiny \"Why is the sky blue?\"
  ondo run ./my-model \"Summarise:\" --max-tokens 64 --loop sync
  ondo run mlx-community/Qwen3-0.6B-4bit \"hi\" --think off
  ondo run mlx-community/Qwen3-0.6B-4bit \"hi\" --json
  ondo run mlx-community/gemma-3-4b-it-4bit --image shot.png \"What does this say?\"
  ondo run ./Llama-3.3-70B-Instruct-4bit \"hi\" --hostfile hosts.json --split tensor")]
pub struct RunArgs {
    #[command(flatten)]
    generation: GenerationArgs,
    /// What to ask. Goes through the model's chat template unless --raw.
    #[arg(required_unless_present = "prompt_ids", default_value = "")]
    prompt: String,
    /// Token ids to send as they are (comma-separated), instead of a prompt;
    /// benchmarks use this for exact lengths.
    #[arg(long, value_delimiter = ',', hide = true)]
    prompt_ids: Option<Vec<u32>>,
    /// Send the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Show the model an image with the question (PNG, JPEG, WebP or GIF,
    /// and HEIC on a Mac; repeatable, in order). Needs a model with a vision
    /// tower (Gemma 3 4B and larger, Qwen3-VL, Qwen 3.5); the footer says
    /// what encoding it took.
    #[arg(long = "image", value_name = "FILE", conflicts_with_all = ["raw", "prompt_ids"])]
    images: Vec<std::path::PathBuf>,
    /// Print one JSON record (timings, counts, memory, text, token_ids)
    /// instead of the streamed text and footer.
    #[arg(long)]
    json: bool,
    /// On a run started as one rank of several (mlx.launch): divide the
    /// model by layers (`pipeline`, the default: any family, one small
    /// message per step, the ranks take turns) or by heads (`tensor`: every
    /// rank works on every layer, two sums per layer, so it wants a fast
    /// link; dense attention families). Same as ONDO_SPLIT.
    #[arg(long, value_enum, value_name = "HOW")]
    split: Option<crate::engine::distributed::SplitKind>,
    /// Split the model over these machines, starting the other ranks
    /// yourself instead of through mlx.launch: a JSON list of hosts, rank 0
    /// (this machine) first, as host names (["studio-1.local",
    /// "studio-2.local"]) or as mlx.launch's hostfile ([{"ssh": "studio-2",
    /// "ips": ["10.0.0.2"]}, ...]). Every other host is reached over ssh
    /// (keys, no password) and runs this same command with the same Ondo at
    /// the same path; this machine's entries start here.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Type a message and press Enter. The model stays loaded and the conversation's
KV cache stays warm, so each later turn only prefills the new tokens (see
`cached` in the footer). A thinking model's reasoning is printed dimmed
before its answer; --hide-thinking leaves it out, and --think off asks a model
with a thinking switch (Qwen3) not to reason at all.
  /reset   start a new conversation     /exit   quit (or Ctrl-D)")]
pub struct ChatArgs {
    #[command(flatten)]
    generation: GenerationArgs,
}

/// Refuses to load a model the fit estimate says will not fit, unless the
/// user asked to load anyway; warns when it is tight.
fn check_fit(dir: &Path, args: &GenerationArgs) -> Result<(), String> {
    use crate::hub::fit::Verdict;
    let Some(estimate) = fit_estimate(dir, args) else {
        // The engine's loader names what is wrong with the folder.
        return Ok(());
    };
    let line = crate::cli::models::verdict_line(&estimate);
    match estimate.verdict {
        Verdict::Fits => Ok(()),
        Verdict::Tight => {
            eprintln!("{line}");
            Ok(())
        }
        Verdict::WillNotFit if args.load_anyway => {
            eprintln!("{line}; loading anyway (--load-anyway)");
            Ok(())
        }
        Verdict::WillNotFit => Err(format!(
            "{line}\n{}\nPass --load-anyway to try regardless (the system may swap heavily).",
            estimate
                .advice
                .iter()
                .map(|a| format!("  - {a}"))
                .collect::<Vec<_>>()
                .join("\n")
        )),
    }
}

/// The fit estimate of the model in `dir` with these settings on this
/// machine; `None` when the folder does not say enough.
fn fit_estimate(dir: &Path, args: &GenerationArgs) -> Option<crate::hub::fit::FitEstimate> {
    use crate::hub::sizing;
    let facts = sizing::facts_from_folder(dir).ok()?;
    let context = args
        .settings
        .max_kv_size
        .map_or(crate::hub::fit::DEFAULT_CONTEXT_TOKENS, |n| n as u64);
    let settings = &args.settings;
    // A bounded cache rotates in floats; a growing one may be quantized.
    let kv_bits = settings
        .kv_bits
        .filter(|_| settings.max_kv_size.is_none())
        .map(|bits| crate::hub::fit::KvCacheBits {
            bits: u64::from(bits),
            group_size: u64::from(settings.kv_group_size),
            start: settings.quantized_kv_start as u64,
        });
    Some(facts.estimate_held_in(context, sizing::MachineMemory::read(None), kv_bits))
}

/// The timings footer, in the order the costs happen.
pub fn footer(stats: &RunStats) -> String {
    let mut lines = Vec::new();
    let load = if stats.load_ms > 0.0 {
        format!("load {:.0} ms", stats.load_ms)
    } else {
        "no load".to_owned()
    };
    lines.push(format!(
        "{} · {} · TTFT {:.1} ms · {} · stop: {}",
        stats.load_kind, load, stats.ttft_ms, stats.quantization, stats.stop_reason
    ));
    if stats.images > 0 {
        lines.push(format!(
            "images   {:>5} tokens of {} image{} encoded in {:.1} ms (before the prefill)",
            stats.image_tokens,
            stats.images,
            if stats.images == 1 { "" } else { "s" },
            stats.image_encode_ms
        ));
    }
    let cached = match stats.prefix_source {
        _ if stats.cached_tokens == 0 => String::new(),
        PrefixSource::Disk => format!(
            " ({} cached, read from disk: {} in {:.1} ms)",
            stats.cached_tokens,
            human_bytes(stats.prefix_read_bytes),
            stats.prefix_read_ms
        ),
        _ => format!(" ({} cached)", stats.cached_tokens),
    };
    lines.push(format!(
        "prefill  {:>5} tokens{cached} {:>9.1} tok/s  {:>8.1} ms",
        stats.prefill_tokens, stats.prefill_tps, stats.prefill_ms
    ));
    lines.push(format!(
        "decode   {:>5} tokens {:>9.1} tok/s  {:>8.1} ms  loop {}",
        stats.generated_tokens, stats.decode_tps, stats.decode_ms, stats.loop_shape
    ));
    if stats.reasoning_tokens > 0 {
        lines.push(format!(
            "thinking {:>5} tokens of those {:>20.1} ms",
            stats.reasoning_tokens, stats.reasoning_ms
        ));
    }
    let kv_bits = stats
        .kv_bits
        .map(|bits| format!(" in {bits} bits"))
        .unwrap_or_default();
    lines.push(format!(
        "memory   peak {} · KV cache {}{kv_bits} · weights {}",
        human_bytes(stats.mlx_peak_bytes),
        human_bytes(stats.kv_cache_bytes),
        human_bytes(stats.weights_bytes)
    ));
    if let Some(batch) = &stats.batch {
        lines.push(format!("batch    {}", batch.describe()));
    }
    if let Some(held) = &stats.constraint {
        lines.push(format!(
            "held to  {} · mask {:.3} ms/token · compile {:.1} ms",
            held.kind.replace('_', " "),
            held.mask_ms_per_token,
            held.compile_ms
        ));
    }
    if crate::session::record::build_profile() == "debug" {
        lines.push("note: debug build; use --release for timings worth comparing".into());
    }
    lines.join("\n")
}

/// The files of `--image`, each in base64 as a message carries it.
fn read_images(paths: &[std::path::PathBuf]) -> Result<Vec<String>, CliError> {
    use base64::Engine as _;
    paths
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).map_err(|e| {
                CliError::new(
                    ErrorKind::InvalidSettings,
                    format!("--image {}: {e}", path.display()),
                )
            })?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        })
        .collect()
}

/// Ends a rank whose split run stops making progress. A rank that dies
/// mid-step usually surfaces as MLX's error on the next evaluation, but a
/// collective can also wait forever on a peer that is gone; a rank that
/// sees no token for `ONDO_RANK_STALL_TIMEOUT_S` (300 s) says which ranks
/// it ran with and exits, which releases its memory.
struct StallWatch {
    started: std::time::Instant,
    /// Milliseconds from `started` to the last token.
    last_beat_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallWatch {
    fn start(
        launch: crate::engine::distributed::Launch,
        ranks: Vec<crate::engine::distributed::handshake::RankIdentity>,
    ) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let limit = crate::environment::RANK_STALL_TIMEOUT_S
            .parsed::<f64>()
            .filter(|s| *s > 0.0)
            .unwrap_or(300.0);
        let started = std::time::Instant::now();
        let last_beat_ms = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (beat, finished) = (Arc::clone(&last_beat_ms), Arc::clone(&done));
        std::thread::spawn(move || {
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(200));
                let now = started.elapsed().as_millis() as u64;
                let quiet_s = now.saturating_sub(beat.load(Ordering::Relaxed)) as f64 / 1e3;
                if quiet_s > limit && !finished.load(Ordering::Relaxed) {
                    let said = format!(
                        "no token for {limit:.0} s ({})",
                        crate::environment::RANK_STALL_TIMEOUT_S.name
                    );
                    eprintln!(
                        "error: {}",
                        crate::engine::distributed::link_lost(&ranks, &launch, &said)
                    );
                    if let Some(hint) = crate::cli::error::hint(ErrorKind::Distributed, None) {
                        eprintln!("hint: {hint}");
                    }
                    std::process::exit(1);
                }
            }
        });
        Self {
            started,
            last_beat_ms,
            done,
        }
    }

    /// A token arrived.
    fn beat(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_beat_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What rank 0 prints before a split run: who holds what (each rank's
/// layers, or its share of every layer, and their weight bytes from the
/// folder's safetensors headers) and whether each rank's share fits its own
/// memory budget (from the introductions). Every rank computes the same
/// verdict from the same facts, so a share that will not fit ends every
/// rank with the same error (unless --load-anyway) before any loads.
pub(crate) fn split_plan(
    dir: &Path,
    launch: &crate::engine::distributed::Launch,
    ranks: &[crate::engine::distributed::handshake::RankIdentity],
    whole: Option<crate::hub::fit::FitEstimate>,
    load_anyway: bool,
) -> Result<String, String> {
    use crate::engine::distributed::SplitKind;
    use crate::hub::fit::{Verdict, estimate_share};
    use crate::units::human_bytes;
    let head = format!(
        "split {} over {} ranks over MLX's {} backend",
        launch.split.described(),
        launch.size,
        launch.backend
    );
    let layers = crate::hub::sizing::facts_from_folder(dir)
        .map(|facts| facts.shape.num_hidden_layers as usize)
        .ok();
    let bytes = crate::hub::sizing::layer_bytes(dir).ok();
    let (Some(layers), Some(bytes)) = (layers, bytes) else {
        return Ok(head);
    };
    let mut parts = Vec::new();
    let mut needs = Vec::new();
    let mut short = Vec::new();
    let mut tight = false;
    for rank in ranks {
        let share = crate::hub::RankPart {
            rank: rank.rank,
            ..launch.part()
        };
        let (kv_fraction, what) = match launch.split {
            SplitKind::Pipeline => {
                let Ok((first, end)) = crate::engine::distributed::pipeline::layer_range(
                    layers,
                    rank.rank,
                    launch.size,
                ) else {
                    continue;
                };
                (
                    (end - first) as f64 / layers as f64,
                    format!("layers {first}-{}", end - 1),
                )
            }
            SplitKind::Tensor => (
                1.0 / launch.size as f64,
                format!("1/{} of every layer", launch.size),
            ),
        };
        // What the rank read from its own files; this rank's folder may
        // hold only its own layers.
        let held = match rank.share_bytes {
            0 => bytes.of_share(layers, share).unwrap_or(0),
            held => held,
        };
        let name = format!("rank {} ({})", rank.rank, rank.host);
        parts.push(format!("{name} {what}, {} of weights", human_bytes(held)));
        let (Some(whole), true) = (&whole, rank.budget_bytes > 0) else {
            continue;
        };
        let share = estimate_share(whole, held, kv_fraction, rank.budget_bytes);
        needs.push(format!(
            "{} of {} on {name}",
            human_bytes(share.needed_bytes),
            human_bytes(share.budget_bytes)
        ));
        match share.verdict {
            Verdict::Fits => {}
            Verdict::Tight => tight = true,
            Verdict::WillNotFit => short.push(format!(
                "{name} needs {} with {} free",
                human_bytes(share.needed_bytes),
                human_bytes(share.budget_bytes)
            )),
        }
    }
    let mut plan = format!("{head}: {}", parts.join("; "));
    if needs.is_empty() {
        return Ok(plan);
    }
    let context = whole.as_ref().map_or(0, |w| w.context_tokens);
    if short.is_empty() {
        let verdict = if tight { "tight" } else { "fits" };
        plan.push_str(&format!(
            "\nfit: {verdict} split over {} ranks at {context} tokens of context (needs {})",
            launch.size,
            needs.join(", ")
        ));
        return Ok(plan);
    }
    let line = format!(
        "fit: will not fit split over {} ranks at {context} tokens of context: {}",
        launch.size,
        short.join("; ")
    );
    if load_anyway {
        plan.push_str(&format!("\n{line}; loading anyway (--load-anyway)"));
        return Ok(plan);
    }
    Err(format!(
        "{plan}\n{line}\n  - split over more ranks, or give those machines more memory ({}, \
         other apps)\n  - choose a more quantized model, or a shorter context \
         (--max-kv-size)\nPass --load-anyway to try regardless (the system may swap heavily).",
        crate::environment::MEMORY_LIMIT.name
    ))
}

pub fn run(mut args: RunArgs) -> Result<ExitCode, CliError> {
    // Started as one rank of several (mlx.launch): every rank runs this same
    // command on its share of the layers; rank 0 answers and records, the
    // others compute in step and print nothing. A saved prompt cache would
    // hold only this rank's layers, so none is read or written.
    let (launch, started) = super::launch::this_launch(
        args.hostfile.as_deref(),
        args.split,
        super::launch::WhenARankFails::EndThisProcess,
    )?;
    // A launch of one rank runs as a process alone.
    let launch = launch.filter(|launch| launch.size > 1);
    let follower = launch.as_ref().is_some_and(|l| l.rank != 0);
    if launch.is_some() {
        args.generation.no_disk_cache = true;
        args.generation.no_history |= follower;
    }
    let (pool, model, ranks) = args.generation.start_as(launch.as_ref())?;
    if let (Some(launch), Some(ranks)) = (&launch, &ranks) {
        let plan = split_plan(
            &model.dir,
            launch,
            ranks,
            fit_estimate(&model.dir, &args.generation),
            args.generation.load_anyway,
        )
        .map_err(CliError::from)?;
        if launch.rank == 0 {
            eprintln!("{plan}");
        }
    }
    let stall_watch = launch
        .clone()
        .zip(ranks.clone())
        .map(|(launch, ranks)| StallWatch::start(launch, ranks));
    let prompt = if let Some(ids) = args.prompt_ids {
        Prompt::Tokens { ids }
    } else if args.raw {
        Prompt::Raw { text: args.prompt }
    } else {
        Prompt::chat(
            args.generation.system_prompt.clone(),
            vec![ChatMessage {
                images: read_images(&args.images)?,
                ..ChatMessage::user(args.prompt)
            }],
        )
    };
    let request = args.generation.request(&model.dir, prompt);
    let context = model.run_context(RunKind::Run);
    // A parent timing this process from its spawn (`ondo bench`'s cold
    // start) passes the spawn time; the first token's is taken here.
    let spawned_at = crate::environment::SPAWNED_AT_NS.parsed::<u128>();
    let mut first_token_at = None;
    let mut terminal = args.generation.terminal_reply();
    let (outcome, record) = pool
        .run(request, context, CancelToken::new(), |event| {
            if let RunEvent::Delta { .. } = event {
                first_token_at.get_or_insert_with(crate::bench::peer::wall_clock_ns);
                if let Some(watch) = &stall_watch {
                    watch.beat();
                }
                if !args.json && !follower {
                    terminal.show(event, &mut std::io::stdout(), &mut std::io::stderr());
                }
            }
        })
        .map_err(|e| match (&launch, &ranks) {
            (Some(launch), Some(ranks))
                if crate::engine::distributed::is_link_failure(&e.to_string()) =>
            {
                CliError::new(
                    ErrorKind::Distributed,
                    crate::engine::distributed::link_lost(ranks, launch, &e.to_string()),
                )
            }
            _ => CliError::from(e).about(&args.generation.model),
        })?;
    drop(stall_watch);
    if follower {
        return Ok(ExitCode::SUCCESS);
    }
    // The ranks this process started end with their last collective.
    if let Some(started) = started {
        started.finish(std::time::Duration::from_secs(30));
    }
    if let Some(err) = pool.last_store_error() {
        eprintln!("note: the run was not recorded in the history: {err}");
    }
    if args.json {
        let mut json = serde_json::to_value(&outcome.stats).map_err(|e| e.to_string())?;
        if let (Some(spawned), Some(first)) = (spawned_at, first_token_at) {
            json["cold_start_ms"] = (first.saturating_sub(spawned) as f64 / 1e6).into();
        }
        if record.split.is_some()
            && let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&record)
        {
            // The record's split fields, whatever they are.
            for (name, value) in fields.into_iter().filter(|(n, _)| n.starts_with("split")) {
                json[name] = value;
            }
        }
        json["run_id"] = record.run_id.into();
        json["text"] = outcome.text.into();
        json["reasoning"] = outcome.reasoning.into();
        json["token_ids"] = outcome.token_ids.into();
        println!("{json}");
        return Ok(ExitCode::SUCCESS);
    }
    println!();
    eprintln!("{}", footer(&outcome.stats));
    if let Some(line) = split_line(&record, outcome.stats.decode_tps) {
        eprintln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a split run's decode step went: the step measured, each rank's
/// share computed alone (by layers the ranks take turns, so their times
/// add up; by heads they work at once) and the links' estimate.
fn split_line(record: &crate::store::RunRecord, decode_tps: f64) -> Option<String> {
    let how = record.split.as_deref()?;
    let ranks: Vec<f64> = record
        .split_rank_step_ms
        .as_deref()?
        .split(", ")
        .filter_map(|ms| ms.parse().ok())
        .collect();
    let each: Vec<String> = ranks
        .iter()
        .enumerate()
        .map(|(rank, ms)| format!("rank {rank}'s {ms:.2} ms"))
        .collect();
    let step = if decode_tps > 0.0 {
        format!("a decode step took {:.2} ms; ", 1e3 / decode_tps)
    } else {
        String::new()
    };
    let links = record
        .split_step_link_ms
        .map_or(String::new(), |ms| format!("; the links about {ms:.2} ms"));
    let (by, together) = if how == "tensor" {
        (
            "by heads",
            format!(
                "at once: {:.2} ms",
                ranks.iter().copied().fold(0.0, f64::max)
            ),
        )
    } else {
        (
            "by layers",
            format!("in turn: {:.2} ms", ranks.iter().sum::<f64>()),
        )
    };
    let prefill = match (record.split_prefill_bytes, record.split_prefill_link_ms) {
        (Some(bytes), Some(ms)) => format!(
            "\nthe prefill of {} tokens moved {} from a rank, about {ms:.2} ms on the links of \
             its {:.2} ms",
            record.prefill_tokens,
            crate::units::human_bytes(bytes),
            record.prefill_ms
        ),
        _ => String::new(),
    };
    Some(format!(
        "split {by}: {step}computed alone, {} ({together}){links}{prefill}",
        each.join(", ")
    ))
}

/// Streams a reply to the terminal: the answer on stdout, the reasoning on
/// stderr, so `ondo run ... > answer.txt` keeps only the answer.
struct TerminalReply {
    /// Print the reasoning (not `--hide-thinking`).
    show_reasoning: bool,
    /// Wrap it in ANSI dim: only for a terminal, where the codes are read
    /// rather than stored.
    dim_reasoning: bool,
    /// Reasoning was shown and the answer has not started yet.
    reasoning_shown: bool,
}

const ANSI_DIM: &str = "\x1b[2m";
const ANSI_RESET: &str = "\x1b[0m";

impl TerminalReply {
    /// Prints one event's answer to `answer_out` and its reasoning to
    /// `reasoning_out`. Every piece of reasoning closes its own dim, so a
    /// run stopped mid-thought leaves the terminal as it was.
    fn show(
        &mut self,
        event: &RunEvent,
        answer_out: &mut dyn Write,
        reasoning_out: &mut dyn Write,
    ) {
        let RunEvent::Delta {
            text, reasoning, ..
        } = event
        else {
            return;
        };
        if !reasoning.is_empty() && self.show_reasoning {
            let _ = if self.dim_reasoning {
                write!(reasoning_out, "{ANSI_DIM}{reasoning}{ANSI_RESET}")
            } else {
                write!(reasoning_out, "{reasoning}")
            };
            let _ = reasoning_out.flush();
            self.reasoning_shown = true;
        }
        if !text.is_empty() {
            if std::mem::take(&mut self.reasoning_shown) {
                let _ = write!(reasoning_out, "\n\n");
                let _ = reasoning_out.flush();
            }
            let _ = answer_out.write_all(text.as_bytes());
            let _ = answer_out.flush();
        }
    }
}

/// A session pool (and its engine) that records into the run history
/// (unless asked not to, or the history cannot be opened: then it says so).
pub(crate) fn session_pool(no_history: bool) -> Result<SessionPool, CliError> {
    let store = if no_history {
        None
    } else {
        match Store::open_default(&DataDirs::from_env().data_dir) {
            Ok(store) => Some(store),
            Err(err) => {
                eprintln!("note: runs will not be recorded: {err}");
                None
            }
        }
    };
    // The prompt cache on disk, within the budget the app's Settings name.
    let saved = store
        .as_ref()
        .map(crate::app_settings::AppSettings::load)
        .unwrap_or_default();
    let pool = SessionPool::start(PoolSettings::default(), store)?;
    pool.set_prompt_cache(saved.prompt_cache_settings(&DataDirs::from_env()))?;
    Ok(pool)
}

pub fn chat(args: ChatArgs) -> Result<ExitCode, CliError> {
    let (pool, model) = args.generation.start()?;
    // The model loads with the first turn, so that turn is recorded as the
    // cold start it is (with its load time) and later turns as warm.
    eprintln!(
        "{}: the first answer loads it (cold start); later turns find it warm. \
         /reset starts over, /exit or Ctrl-D quits",
        model.name
    );
    let mut messages: Vec<ChatMessage> = Vec::new();
    // Conversation ids are unique across processes: the history keeps them.
    let session = crate::session::record::new_run_id().replacen("r-", "c-", 1);
    let mut conversation = 1u64;
    let stdin = std::io::stdin();
    loop {
        eprint!("\n> ");
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                pool.forget_conversation(&format!("{session}-{conversation}"))?;
                conversation += 1;
                messages.clear();
                eprintln!("(new conversation)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::user(line));
        let conversation_id = format!("{session}-{conversation}");
        let request = GenerateRequest {
            conversation: Some(conversation_id.clone()),
            ..args.generation.request(
                &model.dir,
                Prompt::chat(args.generation.system_prompt.clone(), messages.clone()),
            )
        };
        let context = crate::session::record::RunContext {
            conversation_id: Some(conversation_id),
            conversation_title: (messages.len() == 1).then(|| line.chars().take(60).collect()),
            ..model.run_context(RunKind::Chat)
        };
        let mut terminal = args.generation.terminal_reply();
        let streamed = pool
            .run(request, context, CancelToken::new(), |event| {
                terminal.show(event, &mut std::io::stdout(), &mut std::io::stderr())
            })
            .map(|(outcome, _)| outcome)
            .map_err(|e| {
                let error = CliError::from(e).about(&args.generation.model);
                match error.hint() {
                    Some(hint) => format!("{error}\nhint: {hint}"),
                    None => error.to_string(),
                }
            });
        match streamed {
            Ok(outcome) => {
                println!();
                eprintln!("{}", footer(&outcome.stats));
                messages.push(outcome.to_message());
            }
            Err(message) => {
                // The engine keeps serving; the turn is dropped.
                messages.pop();
                eprintln!("error: {message}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(reasoning: &str, text: &str) -> RunEvent {
        RunEvent::Delta {
            text: text.into(),
            reasoning: reasoning.into(),
            tool_calls: Vec::new(),
            token_ids: Vec::new(),
        }
    }

    /// What a terminal shows of a thinking model's reply: (stdout, stderr).
    fn printed(show_reasoning: bool, dim_reasoning: bool) -> (String, String) {
        let mut terminal = TerminalReply {
            show_reasoning,
            dim_reasoning,
            reasoning_shown: false,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for event in [
            delta("The user ", ""),
            delta("greets me.", ""),
            delta("", "Hello"),
            delta("", "!"),
        ] {
            terminal.show(&event, &mut out, &mut err);
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn the_reasoning_goes_to_stderr_dimmed_only_on_a_terminal() {
        assert_eq!(
            printed(true, true),
            (
                "Hello!".to_owned(),
                "\x1b[2mThe user \x1b[0m\x1b[2mgreets me.\x1b[0m\n\n".to_owned()
            )
        );
        assert_eq!(
            printed(true, false),
            ("Hello!".to_owned(), "The user greets me.\n\n".to_owned())
        );
    }

    #[test]
    fn hide_thinking_prints_the_answer_alone() {
        assert_eq!(printed(false, true), ("Hello!".to_owned(), String::new()));
    }

    #[test]
    fn the_footer_counts_the_reasoning_apart() {
        let stats = RunStats {
            generated_tokens: 120,
            reasoning_tokens: 80,
            reasoning_ms: 1234.5,
            ..RunStats::default()
        };
        let printed = footer(&stats);
        assert!(printed.contains("decode     120 tokens"), "{printed}");
        assert!(
            printed.contains("thinking    80 tokens of those"),
            "{printed}"
        );
        assert!(printed.contains("1234.5 ms"), "{printed}");
        let plain = footer(&RunStats {
            generated_tokens: 12,
            ..RunStats::default()
        });
        assert!(!plain.contains("thinking"), "{plain}");
    }
}
