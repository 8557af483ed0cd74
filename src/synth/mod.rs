//! `ondo synth`: random-weight model folders that Ondo and mlx-lm both load.
//!
//! No weights can be downloaded on the machines Ondo is built on, so every
//! test and benchmark reads a folder written here: the same file names,
//! tensor names, quantized layout (packed uint32 with per-group scales and
//! biases) and configs as an mlx-community checkpoint, deterministic for a
//! seed. Folders are written next to the target and renamed into place, so a
//! killed process never leaves a half-written model behind.

pub mod presets;
pub mod tokenizer;
pub mod weights;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

pub use presets::{Arch, ExpertShape, Preset, Shape, WeightDtype};

use crate::ErrorKind;
use crate::paths::DataDirs;

/// Everything that decides what `ondo synth` writes.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthOptions {
    pub preset: Preset,
    pub arch: Arch,
    /// 4 or 8 for affine quantization; `None` leaves the weights unquantized.
    pub bits: Option<u8>,
    /// Quantize the routed experts to mxfp4 (4-bit floats sharing a
    /// power-of-two scale per 32 values), the rest affine at `bits`, with
    /// per-module entries in config.json saying which is which.
    pub experts_mxfp4: bool,
    pub group_size: u32,
    pub dtype: WeightDtype,
    pub seed: u64,
    /// Above this many bytes of tensors, the weights are split into shards
    /// with an index, as large checkpoints are.
    pub max_shard_bytes: u64,
    /// Replace a non-empty target folder.
    pub force: bool,
    /// Gemma 3's sliding window in positions (its other layers attend to
    /// everything); small values let tests cross the window cheaply.
    pub sliding_window: usize,
}

impl SynthOptions {
    /// The preset's usual format: its default bits and dtype, group size 64,
    /// seed 0, 5 GB shards.
    pub fn for_preset(preset: Preset) -> Self {
        Self {
            bits: preset.default_bits,
            dtype: preset.default_dtype,
            preset,
            arch: Arch::Llama,
            experts_mxfp4: false,
            group_size: 64,
            seed: 0,
            max_shard_bytes: 5_000_000_000,
            force: false,
            sliding_window: DEFAULT_SLIDING_WINDOW,
        }
    }

    /// The shape after the architecture's own conventions are applied.
    pub fn shape(&self) -> Shape {
        let mut shape = self.preset.shape.clone();
        if self.arch != Arch::Llama {
            // Mistral and Qwen use plain rope with a larger base, no llama3 scaling.
            shape.rope_theta = 1_000_000.0;
            shape.rope_scaling = None;
        }
        if self.arch == Arch::Qwen3Moe && shape.experts.is_none() {
            shape.experts = Some(ExpertShape::eight_choose_two(&shape));
        }
        if self.arch == Arch::GptOss {
            let experts = shape
                .experts
                .unwrap_or_else(|| ExpertShape::eight_choose_two(&shape));
            shape.experts = Some(experts);
            // gpt-oss's experts are `intermediate_size` wide, and it has
            // no dense MLP; its head is never tied.
            shape.intermediate_size = experts.moe_intermediate_size;
            shape.tie_word_embeddings = false;
            shape.rope_theta = 150_000.0;
        }
        shape
    }
}

/// Gemma 3 1B's window.
pub const DEFAULT_SLIDING_WINDOW: usize = 512;

/// longrope's stretch of a synthetic Phi folder: the preset's context is
/// written as 32 times the original one (Phi-4-mini's 131072 over 4096), so
/// the rotated dimensions are scaled as Phi-4-mini's are.
const PHI_CONTEXT_STRETCH: usize = 32;

/// Phi-4-mini rotates the first three quarters of each head.
const PHI_PARTIAL_ROTARY: f64 = 0.75;

/// What `ondo synth` wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SynthSummary {
    pub dir: PathBuf,
    pub preset: String,
    pub model_type: String,
    pub parameters: u64,
    pub bytes_on_disk: u64,
    pub weight_files: Vec<String>,
    pub tokenizer_vocab_size: usize,
}

/// Why `ondo synth` could not write a model.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown preset `{given}`; valid presets: {valid}")]
    UnknownPreset { given: String, valid: String },
    #[error("{dir} is not empty; pick an empty or new folder, or have Ondo replace what is there")]
    TargetNotEmpty { dir: PathBuf },
    #[error("{bits}-bit quantization is not supported; use 4 or 8 bits, or none")]
    UnsupportedBits { bits: u8 },
    #[error(
        "mxfp4 experts need a model with routed experts ({arch} has none) whose other matrices are quantized to 4 or 8 bits; pick such an architecture and bit width"
    )]
    Mxfp4ExpertsUnavailable { arch: String },
    #[error(
        "a quantization group size of {group_size} does not divide the hidden size {hidden}; use 32, 64 or 128"
    )]
    GroupSizeMismatch { group_size: u32, hidden: usize },
    #[error(
        "could not write {path}: {source}; check that the folder is writable and its disk has room"
    )]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("MLX failed while making tensor {tensor}: {message}")]
    Mlx { tensor: String, message: String },
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerSynthError),
}

impl SynthError {
    /// A stable name for the app and the CLI's hints.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SynthError::UnknownPreset { .. }
            | SynthError::UnsupportedBits { .. }
            | SynthError::Mxfp4ExpertsUnavailable { .. }
            | SynthError::GroupSizeMismatch { .. } => ErrorKind::InvalidInput,
            SynthError::TargetNotEmpty { .. } => ErrorKind::FolderNotEmpty,
            SynthError::Io { .. } => ErrorKind::Io,
            SynthError::Mlx { .. } => ErrorKind::Mlx,
            SynthError::Tokenizer(tokenizer::TokenizerSynthError::VocabTooSmall { .. }) => {
                ErrorKind::InvalidInput
            }
            SynthError::Tokenizer(tokenizer::TokenizerSynthError::Build { .. }) => {
                ErrorKind::Internal
            }
            SynthError::Tokenizer(
                tokenizer::TokenizerSynthError::CreateDir { .. }
                | tokenizer::TokenizerSynthError::WriteFile { .. },
            ) => ErrorKind::Io,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Looks up a preset, or says which ones exist.
pub fn preset_named(name: &str) -> Result<Preset, SynthError> {
    presets::find(name).ok_or_else(|| SynthError::UnknownPreset {
        given: name.to_owned(),
        valid: presets::names().join(", "),
    })
}

fn validate(options: &SynthOptions) -> Result<(), SynthError> {
    if let Some(bits) = options.bits
        && bits != 4
        && bits != 8
    {
        return Err(SynthError::UnsupportedBits { bits });
    }
    let shape = options.shape();
    if options.experts_mxfp4 && (shape.experts.is_none() || options.bits.is_none()) {
        return Err(SynthError::Mxfp4ExpertsUnavailable {
            arch: options.arch.model_type().to_owned(),
        });
    }
    let group = options.group_size as usize;
    if options.bits.is_some()
        && (!matches!(group, 32 | 64 | 128)
            || !shape.hidden_size.is_multiple_of(group)
            || !shape.intermediate_size.is_multiple_of(group)
            || shape
                .experts
                .is_some_and(|e| !e.moe_intermediate_size.is_multiple_of(group)))
    {
        return Err(SynthError::GroupSizeMismatch {
            group_size: options.group_size,
            hidden: shape.hidden_size,
        });
    }
    Ok(())
}

fn is_empty_dir(dir: &Path) -> Result<bool, SynthError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io_err(dir)(e)),
    }
}

/// Writes a model folder at `dir` and reports what it holds.
pub fn write_model(
    options: &SynthOptions,
    dir: &Path,
    progress: &mut dyn FnMut(weights::Progress),
) -> Result<SynthSummary, SynthError> {
    validate(options)?;
    if !options.force && !is_empty_dir(dir)? {
        return Err(SynthError::TargetNotEmpty {
            dir: dir.to_owned(),
        });
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io_err(parent))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_owned());
    // Unique per call, so two writers (threads or processes) never share one.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = parent.join(format!(".{name}.synth-{}-{call}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    }
    fs::create_dir_all(&staging).map_err(io_err(&staging))?;

    let result = write_into(options, &staging, progress);
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => {
            // Best effort: the staging folder is ours alone and worthless now.
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    if dir.exists() {
        fs::remove_dir_all(dir).map_err(io_err(dir))?;
    }
    fs::rename(&staging, dir).map_err(io_err(dir))?;
    Ok(SynthSummary {
        dir: dir.to_owned(),
        ..summary
    })
}

fn write_into(
    options: &SynthOptions,
    dir: &Path,
    progress: &mut dyn FnMut(weights::Progress),
) -> Result<SynthSummary, SynthError> {
    let shape = options.shape();
    let tokenizer = tokenizer::write_tokenizer(
        &tokenizer::TokenizerSpec {
            vocab_size: shape.tokenizer_vocab_size,
            seed: options.seed,
        },
        dir,
    )?;
    // The embedding must at least cover every id the tokenizer can produce.
    let mut shape = shape;
    shape.vocab_size = shape.vocab_size.max(tokenizer.vocab_size);
    let written = weights::write_weights(options, &shape, dir, progress)?;

    let config = config_json(options, &shape, &tokenizer);
    write_json(&dir.join("config.json"), &config)?;
    let generation = json!({
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_ids,
        "do_sample": false,
        "transformers_version": "4.46.0",
    });
    write_json(&dir.join("generation_config.json"), &generation)?;
    let bytes_on_disk = folder_bytes(dir)?;
    Ok(SynthSummary {
        dir: dir.to_owned(),
        preset: options.preset.name.to_owned(),
        model_type: options.arch.model_type().to_owned(),
        parameters: written.parameters,
        bytes_on_disk,
        weight_files: written.files,
        tokenizer_vocab_size: tokenizer.vocab_size,
    })
}

/// `config.json` as an mlx-community checkpoint of this shape writes it.
fn config_json(
    options: &SynthOptions,
    shape: &Shape,
    tokenizer: &tokenizer::SynthTokenizer,
) -> serde_json::Value {
    let mut config = json!({
        "architectures": [options.arch.class_name()],
        "model_type": options.arch.model_type(),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "attention_bias": false,
        "mlp_bias": false,
        "hidden_act": "silu",
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_ids,
        "torch_dtype": options.dtype.torch_name(),
        "ondo_synthetic": {
            "preset": options.preset.name,
            "seed": options.seed,
            "note": "random weights written by `ondo synth`: for speed tests, not for answers",
        },
    });
    if let Some(scaling) = shape.rope_scaling {
        config["rope_scaling"] = json!({
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        });
    }
    if options.arch == Arch::GptOss {
        let layer_types: Vec<&str> = (0..shape.num_hidden_layers)
            .map(|i| {
                if i % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        config["layer_types"] = json!(layer_types);
        config["sliding_window"] = json!(options.sliding_window);
        config["attention_bias"] = json!(true);
        config["swiglu_limit"] = json!(7.0);
        // gpt-oss 20B's yarn, over the preset's context.
        config["rope_scaling"] = json!({
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": (shape.max_position_embeddings / 32).max(1),
            "truncate": false,
        });
        if let Some(experts) = shape.experts {
            config["num_local_experts"] = json!(experts.num_experts);
            config["num_experts_per_tok"] = json!(experts.experts_per_token);
        }
    } else if let Some(experts) = shape.experts {
        config["num_experts"] = json!(experts.num_experts);
        config["num_experts_per_tok"] = json!(experts.experts_per_token);
        config["moe_intermediate_size"] = json!(experts.moe_intermediate_size);
        config["norm_topk_prob"] = json!(true);
        config["decoder_sparse_step"] = json!(1);
        config["mlp_only_layers"] = json!([]);
    }
    match options.arch {
        arch if arch.is_gemma3() => {
            let text = config
                .as_object_mut()
                .map(std::mem::take)
                .unwrap_or_default();
            let mut text = serde_json::Value::Object(text);
            text["rope_local_base_freq"] = json!(10_000.0);
            text["query_pre_attn_scalar"] = json!(shape.head_dim);
            text["sliding_window"] = json!(options.sliding_window);
            // Every second layer attends to everything: a two-layer preset
            // still has one of each kind.
            text["sliding_window_pattern"] = json!(2);
            text["hidden_activation"] = json!("gelu_pytorch_tanh");
            text["hidden_act"] = json!("gelu_pytorch_tanh");
            text["final_logit_softcapping"] = serde_json::Value::Null;
            text["attn_logit_softcapping"] = serde_json::Value::Null;
            config = if arch == Arch::Gemma3 {
                let synthetic = text["ondo_synthetic"].take();
                let top = json!({
                    "architectures": [arch.class_name()],
                    "model_type": "gemma3",
                    "vocab_size": shape.vocab_size,
                    "eos_token_id": tokenizer.eos_token_ids,
                    "bos_token_id": tokenizer.bos_token_id,
                    "torch_dtype": options.dtype.torch_name(),
                    "vision_config": {"model_type": "siglip_vision_model"},
                    "ondo_synthetic": synthetic,
                });
                text["model_type"] = json!("gemma3_text");
                if let Some(fields) = text.as_object_mut() {
                    fields.remove("architectures");
                    fields.remove("ondo_synthetic");
                }
                let mut top = top;
                top["text_config"] = text;
                top
            } else {
                text
            };
        }
        Arch::Phi3 => {
            let rotary = (shape.head_dim as f64 * PHI_PARTIAL_ROTARY) as usize;
            // Factors that differ per frequency, as real long factors do.
            let factors: Vec<f64> = (0..rotary / 2)
                .map(|i| 1.0 + i as f64 / (rotary / 2) as f64)
                .collect();
            config["partial_rotary_factor"] = json!(PHI_PARTIAL_ROTARY);
            config["original_max_position_embeddings"] =
                json!((shape.max_position_embeddings / PHI_CONTEXT_STRETCH).max(1));
            config["rope_scaling"] = json!({
                "type": "longrope",
                "long_factor": factors,
                "short_factor": vec![1.0; rotary / 2],
            });
            config.as_object_mut().map(|c| c.remove("head_dim"));
        }
        _ => {}
    }
    if let Some(bits) = options.bits {
        let mut quantization = json!({
            "group_size": options.group_size,
            "bits": bits,
            "mode": "affine",
        });
        // Modules quantized otherwise than the default, by path, as
        // mlx-lm's converter records them.
        for (module, params) in weights::module_quantization(options, shape) {
            quantization[module] = json!({
                "group_size": params.group_size,
                "bits": params.bits,
                "mode": params.mode_name(),
            });
        }
        config["quantization"] = quantization.clone();
        config["quantization_config"] = quantization;
    }
    config
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), SynthError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| SynthError::Io {
        path: path.to_owned(),
        source: std::io::Error::other(e),
    })?;
    fs::write(path, text + "\n").map_err(io_err(path))
}

fn folder_bytes(dir: &Path) -> Result<u64, SynthError> {
    let mut total = 0;
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        total += entry.metadata().map_err(io_err(&entry.path()))?.len();
    }
    Ok(total)
}

/// Where the built-in tiny model lives, writing it on first use: the model
/// the app offers when nothing has been downloaded.
pub fn builtin_tiny_model(dirs: &DataDirs) -> Result<PathBuf, SynthError> {
    let dir = dirs.models_dir.join("ondo-builtin-tiny");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    // One writer at a time in this process; the loser finds it written.
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _writing = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let options = SynthOptions {
        force: true,
        ..SynthOptions::for_preset(preset_named("tiny")?)
    };
    write_model(&options, &dir, &mut |_| {})?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::tokenizer::TokenizerSynthError;
    use super::*;

    /// The kind of each variant. Exhaustive: a new variant does not compile
    /// until it has a line here; give it an example in `one_of_each` too.
    fn kind_name(error: &SynthError) -> &'static str {
        match error {
            SynthError::UnknownPreset { .. } => "invalid_input",
            SynthError::TargetNotEmpty { .. } => "folder_not_empty",
            SynthError::UnsupportedBits { .. } => "invalid_input",
            SynthError::Mxfp4ExpertsUnavailable { .. } => "invalid_input",
            SynthError::GroupSizeMismatch { .. } => "invalid_input",
            SynthError::Io { .. } => "io",
            SynthError::Mlx { .. } => "mlx",
            SynthError::Tokenizer(TokenizerSynthError::VocabTooSmall { .. }) => "invalid_input",
            SynthError::Tokenizer(TokenizerSynthError::Build { .. }) => "internal",
            SynthError::Tokenizer(TokenizerSynthError::CreateDir { .. }) => "io",
            SynthError::Tokenizer(TokenizerSynthError::WriteFile { .. }) => "io",
        }
    }

    fn one_of_each() -> Vec<SynthError> {
        let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        vec![
            SynthError::UnknownPreset {
                given: "huge".into(),
                valid: "tiny, small".into(),
            },
            SynthError::TargetNotEmpty {
                dir: "/models/tiny".into(),
            },
            SynthError::UnsupportedBits { bits: 3 },
            SynthError::Mxfp4ExpertsUnavailable {
                arch: "llama".into(),
            },
            SynthError::GroupSizeMismatch {
                group_size: 96,
                hidden: 256,
            },
            SynthError::Io {
                path: "/models/tiny/config.json".into(),
                source: io(),
            },
            SynthError::Mlx {
                tensor: "model.embed_tokens.weight".into(),
                message: "[random] out of memory".into(),
            },
            SynthError::Tokenizer(TokenizerSynthError::VocabTooSmall {
                requested: 10,
                minimum: 262,
                specials: 6,
            }),
            SynthError::Tokenizer(TokenizerSynthError::Build {
                step: "training the BPE",
                reason: "no words".into(),
            }),
            SynthError::Tokenizer(TokenizerSynthError::CreateDir {
                path: "/models/tiny".into(),
                source: io(),
            }),
            SynthError::Tokenizer(TokenizerSynthError::WriteFile {
                path: "/models/tiny/tokenizer.json".into(),
                source: Box::new(io()),
            }),
        ]
    }

    #[test]
    fn every_variant_keeps_its_kind_and_speaks_plainly() {
        crate::error_kind::check_layer(&one_of_each(), |e| e.kind(), kind_name);
    }
}
