//! The `ondo` command: thin parsing and printing over the core library.

mod bench;
mod cache;
mod doctor;
pub mod error;
mod history;
mod launch;
mod models;
pub mod run;
mod serve;
mod synth;

use clap::{Parser, Subcommand};

/// Run language models locally on MLX and see where the time and the memory go.
///
/// A model answers in two phases: prefill runs the whole prompt through the
/// weights once (time to first token), then decode makes one token per pass
/// while the KV cache grows (tokens per second). Loading the weights (cold
/// start) is a third cost that a warm model skips. Ondo measures all three.
#[derive(Debug, Parser)]
#[command(name = "ondo", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what Ondo runs on (MLX version, backend, memory, folders) and
    /// check that MLX computes correctly here.
    Doctor(doctor::DoctorArgs),
    /// Write a model folder with random weights that Ondo and mlx-lm load,
    /// for tests and speed measurements without downloading anything.
    Synth(synth::SynthArgs),
    /// Make the tiny synthetic model and time one cold and one warm
    /// generation: load, prefill and decode.
    Demo(crate::cli::demo::DemoArgs),
    /// Answer one prompt: stream the text, then show load, prefill (time to
    /// first token) and decode speed, and memory.
    Run(run::RunArgs),
    /// Talk with a model in the terminal; later turns reuse the warm model
    /// and the conversation's KV cache.
    Chat(run::ChatArgs),
    /// Turn texts into vectors with an embedding model (Qwen3-Embedding):
    /// prints dimensions, tokens and time; --json prints the vectors.
    Embed(embed::EmbedArgs),
    /// Time prefill, decode and cold start over repetitions (median and
    /// spread), optionally against Python mlx-lm on the same model.
    Bench(bench::BenchArgs),
    /// Serve the models to other programs over HTTP, in the OpenAI (chat
    /// completions and Responses), Anthropic and Ollama dialects, on this
    /// machine's warm pool (every request recorded).
    Serve(serve::ServeArgs),
    /// Download a model from the Hugging Face hub into the shared cache
    /// (resumable: Ctrl-C pauses, the same command continues).
    Pull(models::PullArgs),
    /// List the models on this machine: the Hugging Face cache (shared with
    /// mlx-lm and transformers), added folders, and Ondo's own.
    Ls(models::LsArgs),
    /// Delete a model from the Hugging Face cache, or forget an added folder.
    Rm(models::RmArgs),
    /// Will a model fit in memory? Weights + KV cache at a context + overhead,
    /// against what is free, with what to change when it does not.
    Fit(models::FitArgs),
    /// Search the hub for MLX models by name.
    Search(models::SearchArgs),
    /// Recorded runs side by side: cold vs warm, prefill vs decode, memory.
    Runs(history::RunsArgs),
    /// Write recorded runs as JSON, JSONL, CSV, Markdown or an HTML page with charts.
    Report(history::ReportArgs),
    /// The prompt caches saved on disk (long prompts not prefilled twice,
    /// also after a restart): list them, or remove a model's or all.
    Cache(cache::CacheArgs),
}

mod demo;
mod embed;

/// Parses the command line, runs the command, and returns the exit code.
/// A failure prints its message, then a hint in the terminal's words.
pub fn main() -> std::process::ExitCode {
    // Before any MLX work and any thread: the settings MLX reads once, and,
    // run from Ondo.app, the bundle's kernels.
    crate::engine::mlx_settings::apply();
    crate::metallib::use_bundled_kernels();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => run::chat(args),
        Command::Embed(args) => embed::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Pull(args) => models::pull(args),
        Command::Ls(args) => models::ls(args),
        Command::Rm(args) => models::rm(args),
        Command::Fit(args) => models::fit(args),
        Command::Search(args) => models::search(args),
        Command::Runs(args) => history::runs(args),
        Command::Cache(args) => cache::run(args),
        Command::Report(args) => history::report(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", error.message);
            if let Some(hint) = error.hint() {
                eprintln!("hint: {hint}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
