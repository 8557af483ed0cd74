//! `ondo demo`.

use std::process::ExitCode;

use clap::Args;

use crate::cli::error::CliError;
use crate::demo::{DemoRun, run_demo};
use crate::resolve::{NamedBy, TINY, resolve_model};
use crate::run_kinds::LoopShape;
use crate::units::human_bytes;

#[derive(Debug, Args)]
#[command(after_help = "\
The first run pays for loading the weights (cold); the second finds them
resident (warm) and goes straight to prefill. Prefill is the time to the first
token; decode is every token after it. Random weights: the text is noise.")]
pub struct DemoArgs {
    /// Model to use: a folder, a downloaded repo id, or `tiny` (the built-in
    /// synthetic model, written on first use into Ondo's data folder).
    #[arg(long, default_value = TINY)]
    model: String,
    /// Prompt to send (the same one both times).
    #[arg(long, default_value = "Explain in one paragraph why the sky is blue.")]
    prompt: String,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Decode loop shape: `pipelined` queues the next step before reading a
    /// token; `sync` reads each token before building the next step.
    #[arg(long = "loop", value_enum, default_value_t = LoopShape::Pipelined)]
    loop_shape: LoopShape,
    /// Print the two runs as JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Do not record the two runs in the history (`ondo runs`).
    #[arg(long)]
    no_history: bool,
}

pub fn run(args: DemoArgs) -> Result<ExitCode, CliError> {
    let pool = crate::cli::run::session_pool(args.no_history)?;
    let model = resolve_model(&pool, &args.model, NamedBy::Local)
        .map_err(|e| CliError::from(e).about(&args.model))?;
    // The same pool twice: the first run loads (cold), the second finds the
    // model resident (warm).
    let once = || {
        run_demo(
            &pool,
            &model,
            &args.prompt,
            args.max_tokens,
            args.loop_shape,
        )
        .map_err(|e| CliError::from(e).about(&args.model))
    };
    let cold = once()?;
    let warm = once()?;
    if args.json {
        for run in [&cold, &warm] {
            println!("{}", serde_json::to_string(run).map_err(|e| e.to_string())?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!("model: {} (decode loop: {})", model.name, args.loop_shape);
    println!(
        "{:<5} {:>9} {:>7} {:>9} {:>13} {:>6} {:>12} {:>10}",
        "run", "load ms", "prompt", "TTFT ms", "prefill tok/s", "gen", "decode tok/s", "peak mem"
    );
    for run in [&cold, &warm] {
        print_row(run);
    }
    println!();
    println!("text (random weights): {}", cold.text.trim());
    if crate::session::record::build_profile() == "debug" {
        println!("note: debug build; build with --release for timings worth comparing");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_row(r: &DemoRun) {
    println!(
        "{:<5} {:>9.1} {:>7} {:>9.1} {:>13.0} {:>6} {:>12.1} {:>10}",
        r.load_kind,
        r.load_ms,
        r.prompt_tokens,
        r.ttft_ms,
        r.prefill_tps,
        r.generated_tokens,
        r.decode_tps,
        human_bytes(r.mlx_peak_bytes as u64)
    );
}
