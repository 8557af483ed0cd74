//! `ondo synth`: random-weight model folders that Ondo and mlx-lm both load.
//!
//! No weights can be downloaded on the machines Ondo is built on, so every
//! test and benchmark reads a folder written here: the same file names,
//! tensor names, quantized layout (packed uint32 with per-group scales and
//! biases) and configs as an mlx-community checkpoint, deterministic for a
//! seed. Folders are written next to the target and renamed into place, so a
//! killed process never leaves a half-written model behind.

pub mod bert;
pub mod embedding;
pub mod presets;
pub mod tokenizer;
pub mod weights;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

pub use presets::{ExpertShape, Preset, Shape, WeightDtype};

use crate::ErrorKind;
use crate::family::synth::SynthChoices;
use crate::family::{self, Family};
use crate::paths::DataDirs;

/// Everything that decides what `ondo synth` writes.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthOptions {
    pub preset: Preset,
    /// The family whose folder is written (its `model_type` and weight
    /// names).
    pub arch: &'static Family,
    /// 4 or 8 for affine quantization; `None` leaves the weights unquantized.
    pub bits: Option<u8>,
    /// Quantize the routed experts to mxfp4 (4-bit floats sharing a
    /// power-of-two scale per 32 values), the rest affine at `bits`, with
    /// per-module entries in config.json saying which is which.
    pub experts_mxfp4: bool,
    /// Give the model routed experts (8, 2 per token) where the preset has
    /// none: the mixture form of a family whose one `model_type` has dense
    /// and mixture checkpoints.
    pub experts: bool,
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
    /// A head of its own instead of the embedding's matrix, whatever the
    /// preset has.
    pub untied_head: bool,
    /// Decoder layers instead of the preset's.
    pub layers: Option<usize>,
}

impl SynthOptions {
    /// The preset's usual format: its default bits and dtype, group size 64,
    /// seed 0, 5 GB shards.
    pub fn for_preset(preset: Preset) -> Self {
        Self {
            bits: preset.default_bits,
            dtype: preset.default_dtype,
            preset,
            arch: &family::LLAMA,
            experts_mxfp4: false,
            experts: false,
            group_size: 64,
            seed: 0,
            max_shard_bytes: 5_000_000_000,
            force: false,
            sliding_window: DEFAULT_SLIDING_WINDOW,
            untied_head: false,
            layers: None,
        }
    }

    /// The shape after the family's own conventions are applied (and the
    /// experts asked for).
    pub fn shape(&self) -> Shape {
        let mut shape = self.preset.shape.clone();
        if let Some(layers) = self.layers {
            shape.num_hidden_layers = layers;
        }
        if self.experts && shape.experts.is_none() {
            shape.experts = Some(ExpertShape::eight_choose_two(&shape));
        }
        (self.arch.synth.adjust)(&mut shape);
        if self.untied_head {
            shape.tie_word_embeddings = false;
        }
        shape
    }

    fn choices(&self) -> SynthChoices {
        SynthChoices {
            sliding_window: self.sliding_window,
        }
    }
}

/// Gemma 3 1B's window.
pub const DEFAULT_SLIDING_WINDOW: usize = 512;

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
        "{arch} has no mixture-of-experts form for synth to write; pick an architecture whose dense and mixture checkpoints share one model_type, or one with experts of its own"
    )]
    ExpertsUnavailable { arch: String },
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
    #[error(
        "the config.json Ondo wrote for {model_type} does not settle ({message}); this is a bug in Ondo's synth"
    )]
    Config { model_type: String, message: String },
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
            | SynthError::ExpertsUnavailable { .. }
            | SynthError::GroupSizeMismatch { .. } => ErrorKind::InvalidInput,
            SynthError::TargetNotEmpty { .. } => ErrorKind::FolderNotEmpty,
            SynthError::Io { .. } => ErrorKind::Io,
            SynthError::Mlx { .. } => ErrorKind::Mlx,
            SynthError::Config { .. } => ErrorKind::Internal,
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
            arch: options.arch.model_type.to_owned(),
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
    let mut tokenizer = tokenizer::write_tokenizer(
        &tokenizer::TokenizerSpec {
            vocab_size: shape.tokenizer_vocab_size,
            seed: options.seed,
        },
        dir,
    )?;
    if let Some(vision) = &options.arch.synth.vision {
        let tokens: Vec<(&str, &str)> = vision.tokens.iter().map(|t| (t.text, t.name)).collect();
        tokenizer::add_vision_tokens(dir, &tokens, vision.marker, &mut tokenizer)?;
    }
    let PlannedModel { config, plan } = plan_model(options, &tokenizer)?;
    let written = weights::write_weights(options, &plan, dir, progress)?;
    write_json(&dir.join("config.json"), &config)?;
    if let Some(vision) = &options.arch.synth.vision {
        for (name, value) in (vision.processor_files)(&config) {
            write_json(&dir.join(name), &value)?;
        }
    }
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
        model_type: options.arch.model_type.to_owned(),
        parameters: written.parameters,
        bytes_on_disk,
        weight_files: written.files,
        tokenizer_vocab_size: tokenizer.vocab_size,
    })
}

/// A folder's config.json and its tensors, before anything is made.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedModel {
    pub config: serde_json::Value,
    pub plan: Vec<family::tensors::PlannedTensor>,
}

/// What `write_model` will write for these options and a tokenizer of this
/// vocabulary and these special ids: config.json as an mlx-community
/// checkpoint of the family writes it, and the tensors of the config the
/// family settles from it (what the engine and mlx-lm will read). Nothing is
/// computed, so any preset can be planned on any machine.
pub fn plan_model(
    options: &SynthOptions,
    tokenizer: &tokenizer::SynthTokenizer,
) -> Result<PlannedModel, SynthError> {
    validate(options)?;
    let mut shape = options.shape();
    // The embedding must at least cover every id the tokenizer can produce.
    shape.vocab_size = shape.vocab_size.max(tokenizer.vocab_size);
    let mut config = config_json(options, &shape, tokenizer);
    let settled = family::settle(&config).map_err(|error| SynthError::Config {
        model_type: options.arch.model_type.to_owned(),
        message: error.to_string(),
    })?;
    if options.experts && settled.experts.is_none() {
        return Err(SynthError::ExpertsUnavailable {
            arch: options.arch.model_type.to_owned(),
        });
    }
    let mut plan = family::tensors::plan(&settled);
    if let Some(vision) = &options.arch.synth.vision {
        plan.extend((vision.tensors)(&config));
    }
    if let Some(quantization) = quantization_json(options, &plan) {
        config["quantization"] = quantization.clone();
        config["quantization_config"] = quantization;
    }
    Ok(PlannedModel { config, plan })
}

/// `config.json` as an mlx-community checkpoint of this shape writes it,
/// before its quantization block (`quantization_json`).
fn config_json(
    options: &SynthOptions,
    shape: &Shape,
    tokenizer: &tokenizer::SynthTokenizer,
) -> serde_json::Value {
    let family = options.arch;
    let mut config = family::synth::shared_config(family.model_type, family.class_name, shape);
    config["bos_token_id"] = json!(tokenizer.bos_token_id);
    config["eos_token_id"] = json!(tokenizer.eos_token_ids);
    config["torch_dtype"] = json!(options.dtype.torch_name());
    config["ondo_synthetic"] = json!({
        "preset": options.preset.name,
        "seed": options.seed,
        "note": "random weights written by `ondo synth`: for speed tests, not for answers",
    });
    (family.synth.config)(&mut config, shape, &options.choices());
    if let Some(vision) = &family.synth.vision {
        // The image tokens take the tokenizer's last ids
        // (`tokenizer::add_vision_tokens`).
        let count = vision.tokens.len() as u32;
        let last = tokenizer.vocab_size as u32;
        let ids: Vec<u32> = (last.saturating_sub(count)..last).collect();
        (vision.config)(&mut config, shape, &ids);
        // mlx-vlm zeroes the embeddings of the pad id (default 0, a byte
        // token here) in a prompt with images.
        config["pad_token_id"] = json!(tokenizer.pad_token_id);
    }
    config
}

/// The quantization block, with the modules quantized otherwise than the
/// default by path, as mlx-lm's converter records them; `None` for an
/// unquantized folder.
fn quantization_json(
    options: &SynthOptions,
    plan: &[family::tensors::PlannedTensor],
) -> Option<serde_json::Value> {
    let bits = options.bits?;
    let mut quantization = json!({
        "group_size": options.group_size,
        "bits": bits,
        "mode": "affine",
    });
    for (module, params) in weights::module_quantization(options, plan) {
        quantization[module] = json!({
            "group_size": params.group_size,
            "bits": params.bits,
            "mode": params.mode_name(),
        });
    }
    Some(quantization)
}

pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), SynthError> {
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
            SynthError::ExpertsUnavailable { .. } => "invalid_input",
            SynthError::GroupSizeMismatch { .. } => "invalid_input",
            SynthError::Io { .. } => "io",
            SynthError::Mlx { .. } => "mlx",
            SynthError::Config { .. } => "internal",
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
            SynthError::ExpertsUnavailable {
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
            SynthError::Config {
                model_type: "gemma3".into(),
                message: "`text_config` is missing".into(),
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
