//! The MLX side of Ondo: load a model folder, run it, yield tokens. It never
//! downloads, pools or records (see DESIGN.md, "Boundaries").

pub mod cache;
pub mod chat_template;
pub mod detokenize;
pub mod generate;
pub mod load;
pub mod model;
pub mod reply;
pub mod request;
pub mod sample;
pub mod stats;
pub mod stream;
pub mod thread;
pub mod weights;

pub use reply::{FunctionCall, ReplyFormat, ToolCall};
pub use request::{CancelToken, GenerateRequest, Prompt, RunError, RunEvent};
pub use stats::{LoadKind, RunStats, StopReason};
pub use thread::EngineHandle;

use std::path::PathBuf;

/// Why a model folder could not be loaded. Each variant names the file and,
/// where there is one, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{dir} has no config.json; is this a model folder? (`ondo synth tiny DIR` writes one)")]
    ConfigMissing { dir: PathBuf },
    #[error("{path} is not a valid model config: {message}")]
    ConfigInvalid { path: PathBuf, message: String },
    #[error("model_type `{model_type}` in {path} is not supported yet; supported: {supported}")]
    UnsupportedModelType {
        model_type: String,
        path: PathBuf,
        supported: String,
    },
    #[error(
        "{dir} has no model*.safetensors files; the download may be incomplete (run `ondo pull` again)"
    )]
    NoWeightFiles { dir: PathBuf },
    #[error(
        "{file} is listed in model.safetensors.index.json but missing; the download is incomplete (run `ondo pull` again)"
    )]
    ShardMissing { file: PathBuf },
    #[error("could not read {file}: {message}")]
    WeightFileUnreadable { file: PathBuf, message: String },
    #[error("tensor `{tensor}` is missing from the weights in {dir}")]
    TensorMissing { tensor: String, dir: PathBuf },
    #[error("tensor `{tensor}` in {file} is not part of a {model_type} model of this config")]
    TensorUnexpected {
        tensor: String,
        file: String,
        model_type: String,
    },
    #[error("tensor `{tensor}` in {file} has shape {found:?}, but the config says {expected:?}")]
    TensorShape {
        tensor: String,
        file: String,
        expected: Vec<i32>,
        found: Vec<i32>,
    },
    #[error("tensor `{tensor}` in {file} has dtype {found}, expected {expected}")]
    TensorDtype {
        tensor: String,
        file: String,
        expected: String,
        found: String,
    },
    #[error(
        "quantization {detail} in {path} is not supported; Ondo reads affine 4- and 8-bit with group size 32, 64 or 128"
    )]
    UnsupportedQuantization { detail: String, path: PathBuf },
    #[error("MLX failed while loading: {0}")]
    Mlx(String),
}

impl From<mlx_rs::error::Exception> for LoadError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        LoadError::Mlx(e.to_string())
    }
}
