//! `ondo embed`: texts in, vectors out, on the same warm pool and history
//! as `ondo run`.

use std::process::ExitCode;

use clap::Args;

use crate::cli::error::CliError;
use crate::cli::run::session_pool;
use crate::engine::embed::{EmbedInput, EmbedRequest};
use crate::resolve::{NamedBy, resolve_model};
use crate::run_kinds::RunKind;

#[derive(Debug, Args)]
#[command(after_help = "\
An embedding model turns each text into one vector of numbers; texts that
mean similar things get vectors that point the same way (compare them by
cosine similarity). Search, clustering and RAG tools store these vectors.

All the texts run together as one batch: one forward pass over every text,
padded to the longest. Ondo prints for each text its tokens and the first
values of its vector, then the vectors' dimensions, the tokens in all and
the time; --json prints the whole vectors.

The model must be an embedding model: a folder with sentence-transformers'
modules.json and 1_Pooling/config.json, such as Qwen3-Embedding (last-token
pooling). A chat model is refused. Every call is recorded in the history
as a run of kind embed (`ondo runs --kind embed`).

Examples:
  ondo synth tiny ./models/embed-tiny --arch qwen3 --embedding
  ondo embed ./models/embed-tiny \"a cat sat\" \"a dog stood\"
  ondo embed mlx-community/Qwen3-Embedding-0.6B-4bit-DWQ \"hello\" --dimensions 256
  ondo embed ./models/embed-tiny \"hello\" --json > vectors.json")]
pub struct EmbedArgs {
    /// A model folder or a downloaded repo id of an embedding model.
    model: String,
    /// The texts to embed; each gets one vector.
    #[arg(required = true)]
    texts: Vec<String>,
    /// Keep only the first N dimensions of each vector, normalized again
    /// (for models trained for it, such as Qwen3-Embedding).
    #[arg(long)]
    dimensions: Option<usize>,
    /// Refuse a text longer than the model's context instead of cutting it
    /// to the context.
    #[arg(long)]
    no_truncate: bool,
    /// Print the vectors and the timings as JSON.
    #[arg(long)]
    json: bool,
    /// Do not record this run in the history (`ondo runs`).
    #[arg(long)]
    no_history: bool,
}

pub fn run(args: EmbedArgs) -> Result<ExitCode, CliError> {
    let pool = session_pool(args.no_history)?;
    let model = resolve_model(&pool, &args.model, NamedBy::Local)
        .map_err(|e| CliError::from(e).about(&args.model))?;
    let request = EmbedRequest {
        model_dir: model.dir.clone(),
        inputs: args.texts.iter().cloned().map(EmbedInput::Text).collect(),
        truncate: !args.no_truncate,
        dimensions: args.dimensions,
    };
    let context = model.run_context(RunKind::Embed);
    let (outcome, record) = pool
        .embed(request, context)
        .map_err(|e| CliError::from(e).about(&args.model))?;
    if let Some(err) = pool.last_store_error() {
        eprintln!("note: the run was not recorded in the history: {err}");
    }
    let stats = &outcome.stats;
    let dimensions = outcome.vectors.first().map_or(0, Vec::len);
    if args.json {
        let json = serde_json::json!({
            "run_id": record.run_id,
            "model": args.model,
            "dimensions": dimensions,
            "tokens_per_input": outcome.tokens_per_input,
            "prompt_tokens": stats.prompt_tokens,
            "truncated_inputs": outcome.truncated_inputs,
            "load_kind": stats.load_kind,
            "load_ms": stats.load_ms,
            "embed_ms": stats.prefill_ms,
            "embeddings": outcome.vectors,
        });
        println!("{json}");
        return Ok(ExitCode::SUCCESS);
    }
    for ((text, vector), tokens) in args
        .texts
        .iter()
        .zip(&outcome.vectors)
        .zip(&outcome.tokens_per_input)
    {
        let head: Vec<String> = vector.iter().take(4).map(|x| format!("{x:+.4}")).collect();
        let shown: String = text.chars().take(40).collect();
        println!("{tokens:>5} tokens  [{}, ...]  {shown:?}", head.join(", "));
    }
    eprintln!(
        "{} vectors of {dimensions} dimensions, {} tokens in {:.1} ms ({:.0} tok/s){}",
        outcome.vectors.len(),
        stats.prompt_tokens,
        stats.prefill_ms,
        stats.prefill_tps,
        if stats.load_ms > 0.0 {
            format!(", after a load of {:.0} ms", stats.load_ms)
        } else {
            String::new()
        }
    );
    if outcome.truncated_inputs > 0 {
        eprintln!(
            "note: {} text(s) were cut to the model's context",
            outcome.truncated_inputs
        );
    }
    Ok(ExitCode::SUCCESS)
}
