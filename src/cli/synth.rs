//! `ondo synth`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::ErrorKind;
use crate::cli::error::CliError;
use crate::family::{self, Family};
use crate::synth::{self, SynthOptions, WeightDtype};
use crate::units::human_bytes;

#[derive(Debug, Args)]
#[command(after_help = "\
Presets:
  tiny          2 layers, hidden 256, vocab 2k, fp32: tests and CPU benchmarks
  small         8 layers, hidden 1024, vocab 8k, fp32: weight-bound benchmarks
  llama-3.2-1b  the real Llama 3.2 1B shape, 4-bit bf16 (for a GPU or a Mac)
  llama-3.2-3b  the real Llama 3.2 3B shape, 4-bit bf16 (for a GPU or a Mac)
  llama-3.1-8b  the real Llama 3.1 8B shape, untied head, 4-bit bf16 (GPU or Mac)

Examples:
  ondo synth tiny ./models/tiny
  ondo synth small ./models/small-q4 --bits 4 --group-size 64
  ondo synth tiny ./models/qwen-tiny --arch qwen3 --seed 7
  ondo synth tiny ./models/moe-tiny --arch qwen3_moe --bits 4   # 8 experts, 2 per token
  ondo synth tiny ./models/moe-mx --arch qwen3_moe --bits 8 --experts-mxfp4
  ondo synth tiny ./models/oss-tiny --arch gpt_oss --bits 8 --experts-mxfp4   # like MXFP4-Q8
  ondo synth tiny ./models/gemma-tiny --arch gemma3_text --sliding-window 32
  ondo synth tiny ./models/phi-tiny --arch phi3 --bits 4
  ondo synth tiny ./models/gemma4-moe --arch gemma4 --experts --bits 4
  ondo synth tiny ./models/embed-tiny --arch qwen3 --embedding   # like Qwen3-Embedding
  ondo synth small ./models/bge-small --encoder bert              # like bge-small (CLS)
  ondo synth tiny ./models/minilm --encoder bert --pooling mean   # like all-MiniLM
  python -m mlx_lm generate --model ./models/tiny --prompt hi   # mlx-lm loads it too")]
pub struct SynthArgs {
    /// Preset shape: tiny, small, llama-3.2-1b, llama-3.2-3b or llama-3.1-8b.
    preset: String,
    /// Folder to write; must be empty or new unless --force.
    out: PathBuf,
    /// Model family: config.json's model_type, which decides the weight
    /// names and the family's own config keys (`-` for `_` works too).
    #[arg(long, value_parser = FamilyArg, default_value = "llama")]
    arch: &'static Family,
    /// Quantize the matrices to 4 or 8 bits (affine), or `none` [default: the
    /// preset's usual format].
    #[arg(long, value_parser = parse_bits)]
    bits: Option<Bits>,
    /// Quantize the routed experts to mxfp4 instead (with --arch qwen3_moe
    /// and --bits 4 or 8 for the other matrices).
    #[arg(long)]
    experts_mxfp4: bool,
    /// Give the model routed experts (8, 2 per token): the mixture form of
    /// a family whose dense and mixture checkpoints share a model_type
    /// (gemma4_text, gemma4).
    #[arg(long)]
    experts: bool,
    /// Elements that share one scale and bias when quantized: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    group_size: u32,
    /// Floating-point type of unquantized weights, scales and biases
    /// [default: the preset's].
    #[arg(long, value_enum)]
    dtype: Option<WeightDtype>,
    /// Random seed; the same seed writes the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Split the weights into shards above this size, like large checkpoints
    /// (e.g. 500MB, 2GB).
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    max_shard_size: u64,
    /// Replace the folder's contents if it is not empty.
    #[arg(long)]
    force: bool,
    /// Families with sliding-window layers (Gemma 3 and 4, gpt-oss, Ministral 3):
    /// the positions those layers attend over; the other layers attend to
    /// everything. Small windows let a short prompt cross it.
    #[arg(long, default_value_t = synth::DEFAULT_SLIDING_WINDOW)]
    sliding_window: usize,
    /// Give the model a head of its own instead of the embedding's matrix
    /// (as the larger checkpoints of most families have). With random
    /// weights a tied head mostly repeats a token whatever the prompt; an
    /// untied one answers differently to different prompts and images.
    #[arg(long)]
    untied_head: bool,
    /// Decoder layers instead of the preset's (a small model with many
    /// layers, to split across ranks or to time per-layer work).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=512))]
    layers: Option<u16>,
    /// Write an embedding model: sentence-transformers' modules.json and
    /// 1_Pooling/config.json (last-token pooling, normalized, as
    /// Qwen3-Embedding), and a tokenizer that appends <|end_of_text|> to
    /// every input. `ondo embed` and /v1/embeddings then take it.
    #[arg(long)]
    embedding: bool,
    /// Write an encoder embedding model instead of a decoder: `bert` (the
    /// bge / all-MiniLM / e5 form, WordPiece tokenizer, float32) of the
    /// preset's width, depth and heads.
    #[arg(long, value_parser = ["bert"])]
    encoder: Option<String>,
    /// With --encoder: how the vectors are pooled, `cls` (bge) or `mean`
    /// (all-MiniLM, e5).
    #[arg(long, value_parser = ["cls", "mean"], default_value = "cls")]
    pooling: String,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

/// `--arch`: a family by its model_type; `--help` lists them with what
/// each covers.
#[derive(Clone, Copy)]
struct FamilyArg;

impl clap::builder::TypedValueParser for FamilyArg {
    type Value = &'static Family;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let name = value.to_string_lossy().replace('-', "_");
        family::find(&name).ok_or_else(|| {
            let mut error = clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd);
            use clap::error::{ContextKind, ContextValue};
            if let Some(arg) = arg {
                error.insert(
                    ContextKind::InvalidArg,
                    ContextValue::String(arg.to_string()),
                );
            }
            error.insert(
                ContextKind::InvalidValue,
                ContextValue::String(value.to_string_lossy().into_owned()),
            );
            error.insert(
                ContextKind::ValidValue,
                ContextValue::Strings(
                    family::model_types()
                        .iter()
                        .map(|t| t.to_string())
                        .collect(),
                ),
            );
            error
        })
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(family::FAMILIES.iter().map(|f| {
            clap::builder::PossibleValue::new(f.model_type).help(f.about)
        })))
    }
}

#[derive(Debug, Clone, Copy)]
struct Bits(Option<u8>);

fn parse_bits(text: &str) -> Result<Bits, String> {
    match text {
        "4" => Ok(Bits(Some(4))),
        "8" => Ok(Bits(Some(8))),
        "none" => Ok(Bits(None)),
        other => Err(format!("`{other}` is not 4, 8 or none")),
    }
}

/// Parses sizes like `500MB`, `2GB`, `1048576`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 500MB or 2GB"))?;
    let scale = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("unknown unit in `{text}`; use B, KB, MB, GB")),
    };
    Ok((number * scale) as u64)
}

pub fn run(args: SynthArgs) -> Result<ExitCode, CliError> {
    let preset = synth::preset_named(&args.preset)?;
    let mut options = SynthOptions::for_preset(preset);
    options.arch = args.arch;
    if let Some(Bits(bits)) = args.bits {
        options.bits = bits;
    }
    if let Some(dtype) = args.dtype {
        options.dtype = dtype;
    }
    options.group_size = args.group_size;
    options.experts_mxfp4 = args.experts_mxfp4;
    options.experts = args.experts;
    options.seed = args.seed;
    options.max_shard_bytes = args.max_shard_size;
    options.force = args.force;
    options.sliding_window = args.sliding_window.max(1);
    options.untied_head = args.untied_head;
    options.layers = args.layers.map(usize::from);

    if args.encoder.is_some() {
        let dir_used = std::fs::read_dir(&args.out).is_ok_and(|mut d| d.next().is_some());
        if dir_used && !args.force {
            return Err(synth::SynthError::TargetNotEmpty { dir: args.out }.into());
        }
        let pooling = if args.pooling == "mean" {
            crate::family::embedding::Pooling::Mean
        } else {
            crate::family::embedding::Pooling::Cls
        };
        let written = synth::bert::write_bert(&options.shape(), &args.out, args.seed, pooling)?;
        println!(
            "wrote a bert encoder ({}, {:.1}M parameters, vocab {}, {} pooling) to {}",
            args.preset,
            written.parameters as f64 / 1e6,
            written.vocab_size,
            pooling.as_str(),
            args.out.display()
        );
        println!("random weights: for speed tests, not for meaning");
        return Ok(ExitCode::SUCCESS);
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} writing tensors [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let summary = synth::write_model(&options, &args.out, &mut |p| {
        bar.set_length(p.tensors_total as u64);
        bar.set_position(p.tensors_done as u64);
        bar.set_message(p.current);
    })?;
    bar.finish_and_clear();
    if args.embedding {
        synth::embedding::make_embedding_folder(
            &args.out,
            crate::family::embedding::Pooling::LastToken,
        )?;
    }

    if args.json {
        let text = serde_json::to_string_pretty(&summary)
            .map_err(|e| CliError::new(ErrorKind::Internal, e.to_string()))?;
        println!("{text}");
    } else {
        let quant = match options.bits {
            Some(bits) => format!("{bits}-bit, group {}", options.group_size),
            None => "unquantized".to_owned(),
        };
        println!(
            "wrote {} ({} {}, {:.1}M parameters, {quant}, {:?}) to {}",
            summary.preset,
            summary.model_type,
            human_bytes(summary.bytes_on_disk),
            summary.parameters as f64 / 1e6,
            options.dtype,
            summary.dir.display()
        );
        println!("weights: {}", summary.weight_files.join(", "));
        println!("random weights: for speed tests, not for answers");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_takes_every_family_by_its_model_type() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            synth: SynthArgs,
        }
        for family in family::FAMILIES {
            let cli = Cli::try_parse_from(["ondo", "tiny", "/tmp/m", "--arch", family.model_type])
                .unwrap();
            assert_eq!(cli.synth.arch, family);
        }
        let hyphen =
            Cli::try_parse_from(["ondo", "tiny", "/tmp/m", "--arch", "qwen3-moe"]).unwrap();
        assert_eq!(hyphen.synth.arch.model_type, "qwen3_moe");
        let error = Cli::try_parse_from(["ondo", "tiny", "/tmp/m", "--arch", "mamba"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("mamba") && error.contains("gpt_oss"),
            "{error}"
        );
    }

    #[test]
    fn sizes_parse_in_decimal_and_binary_units() {
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("2GiB"), Ok(2 * 1024 * 1024 * 1024));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("lots").is_err());
    }
}
