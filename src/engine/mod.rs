//! The MLX side of Ondo: load a model folder, run it, yield tokens. It never
//! downloads, pools or records (docs/ARCHITECTURE.md, "Layout": who uses
//! whom).

pub mod anatomy;
pub mod backend;
pub mod batch;
pub mod cache;
pub mod chat_template;
pub mod constrain;
pub mod detokenize;
pub mod disk_cache;
pub mod distributed;
pub mod embed;
pub mod generate;
pub mod load;
pub mod mlx_settings;
pub mod model;
pub mod reply;
pub mod request;
pub mod sample;
pub mod stats;
pub mod stream;
pub mod thread;
pub mod vision;
pub mod weights;

pub use anatomy::StepAnatomy;
pub use reply::{FunctionCall, ReplyFormat, ToolCall};
pub use request::{CancelToken, GenerateRequest, Prompt, RunError, RunEvent};
pub use stats::RunStats;
pub use thread::EngineHandle;

use std::path::PathBuf;

/// Why a model folder could not be loaded. Each variant names the file and,
/// where there is one, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "{dir} has no config.json, so it is not a model folder: pick the folder that holds config.json and the .safetensors files"
    )]
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
        "{dir} has no model*.safetensors files; the download may be incomplete: download the model again"
    )]
    NoWeightFiles { dir: PathBuf },
    #[error(
        "{file} is listed in model.safetensors.index.json but missing; the download is incomplete: download the model again"
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
        "quantization {detail} in {path} is not supported; Ondo reads affine 4- and 8-bit with group size 32, 64 or 128, and mxfp4"
    )]
    UnsupportedQuantization { detail: String, path: PathBuf },
    #[error("MLX failed while loading: {0}")]
    Mlx(String),
    #[error("the model cannot be split across the ranks: {0}")]
    Split(String),
}

impl LoadError {
    /// A config.json its family cannot settle, named with its path.
    pub fn from_config(error: crate::family::ConfigError, path: &std::path::Path) -> Self {
        use crate::family::ConfigError;
        match error {
            ConfigError::UnsupportedModelType {
                model_type,
                supported,
            } => LoadError::UnsupportedModelType {
                model_type,
                path: path.to_owned(),
                supported,
            },
            ConfigError::UnsupportedQuantization { detail } => LoadError::UnsupportedQuantization {
                detail,
                path: path.to_owned(),
            },
            other => LoadError::ConfigInvalid {
                path: path.to_owned(),
                message: other.to_string(),
            },
        }
    }
}

impl From<mlx_rs::error::Exception> for LoadError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        LoadError::Mlx(mlx_failure(&e))
    }
}

/// What MLX said, without where in its source it said it. MLX's C layer
/// appends " at /path/mlx/c/io.cpp:76" to each message and mlx-rs the Rust
/// caller's location, then quotes the whole; users need neither. Every
/// MLX error becomes text here, on its way into Ondo's errors.
pub(crate) fn mlx_failure(error: &impl std::fmt::Display) -> String {
    without_source_locations(&error.to_string())
}

/// `text` without " at FILE:LINE[:COLUMN]" wherever FILE is a source file,
/// and without the quotes mlx-rs puts around the message.
fn without_source_locations(text: &str) -> String {
    let mut kept = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" at ") {
        let after = &rest[at + " at ".len()..];
        let end = after
            .find(|c: char| c.is_whitespace() || c == '"')
            .unwrap_or(after.len());
        if is_source_location(&after[..end]) {
            kept.push_str(&rest[..at]);
            rest = &after[end..];
        } else {
            kept.push_str(&rest[..at + " at ".len()]);
            rest = after;
        }
    }
    kept.push_str(rest);
    let kept = kept.trim();
    match kept.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
        Some(quoted) => unescape_debug(quoted),
        None => kept.to_owned(),
    }
}

/// `path/file.cpp:76` or `src/x.rs:12:5`: a path to a source file with a line.
fn is_source_location(token: &str) -> bool {
    let mut path = token.trim_end_matches([',', ';', ')']);
    let mut numbers = 0;
    while numbers < 2 {
        match path.rsplit_once(':') {
            Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
                path = head;
                numbers += 1;
            }
            _ => break,
        }
    }
    let source_file = path.rsplit_once('.').is_some_and(|(_, extension)| {
        matches!(
            extension,
            "c" | "cc" | "cpp" | "cxx" | "h" | "hpp" | "m" | "mm" | "metal" | "rs"
        )
    });
    numbers > 0 && source_file && (path.contains('/') || path.contains('\\'))
}

/// Undoes the escapes of Rust's `{:?}` for the characters MLX messages hold.
fn unescape_debug(quoted: &str) -> String {
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            text.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => text.push('\n'),
            Some('t') => text.push('\t'),
            Some(other) => text.push(other),
            None => text.push('\\'),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx_messages_lose_their_source_locations_and_keep_the_rest() {
        // As mlx-rs prints an exception from MLX's C layer.
        let from_c = r#""[load_safetensors] Failed to open file /tmp/m/model.safetensors at /home/dev/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/mlx-sys-0.2.0/src/mlx-c/mlx/c/io.cpp:76" at /home/dev/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/mlx-rs-0.33.0/src/ops/io.rs:59:25"#;
        assert_eq!(
            mlx_failure(&from_c),
            "[load_safetensors] Failed to open file /tmp/m/model.safetensors"
        );
        // A Rust location inside the standard library.
        let from_rust = r#""[matmul] Last dimension of first input with shape (1,4) must match second to last dimension of second input with shape (8,2)." at /rustc/17067e9ac6d7e98f18d4d1e2a3b8e1c1e5a4f6a2/library/core/src/ops/function.rs:250:5"#;
        assert_eq!(
            mlx_failure(&from_rust),
            "[matmul] Last dimension of first input with shape (1,4) must match second to last dimension of second input with shape (8,2)."
        );
        // Quotes inside the message survive; words after "at" that are no
        // location stay.
        let plain = r#""[eval] the "cache" arrays ran out of memory at step 3" at src/engine/cache.rs:61:24"#;
        assert_eq!(
            mlx_failure(&plain),
            r#"[eval] the "cache" arrays ran out of memory at step 3"#
        );
        assert_eq!(
            mlx_failure(&"KV cache lost its arrays"),
            "KV cache lost its arrays"
        );
    }

    /// Exhaustive: a new variant does not compile until it has a line here
    /// and an example in the test below.
    fn variant_name(error: &LoadError) -> &'static str {
        match error {
            LoadError::ConfigMissing { .. } => "ConfigMissing",
            LoadError::ConfigInvalid { .. } => "ConfigInvalid",
            LoadError::UnsupportedModelType { .. } => "UnsupportedModelType",
            LoadError::NoWeightFiles { .. } => "NoWeightFiles",
            LoadError::ShardMissing { .. } => "ShardMissing",
            LoadError::WeightFileUnreadable { .. } => "WeightFileUnreadable",
            LoadError::TensorMissing { .. } => "TensorMissing",
            LoadError::TensorUnexpected { .. } => "TensorUnexpected",
            LoadError::TensorShape { .. } => "TensorShape",
            LoadError::TensorDtype { .. } => "TensorDtype",
            LoadError::UnsupportedQuantization { .. } => "UnsupportedQuantization",
            LoadError::Mlx(_) => "Mlx",
            LoadError::Split(_) => "Split",
        }
    }

    #[test]
    fn every_load_error_speaks_to_the_app_and_the_cli_alike() {
        let dir = || PathBuf::from("/models/tiny");
        let tensor = || "model.layers.0.self_attn.q_proj.weight".to_owned();
        let errors = [
            LoadError::ConfigMissing { dir: dir() },
            LoadError::ConfigInvalid {
                path: dir().join("config.json"),
                message: "expected value at line 1 column 1".into(),
            },
            LoadError::UnsupportedModelType {
                model_type: "mamba".into(),
                path: dir().join("config.json"),
                supported: "llama, qwen2, qwen3".into(),
            },
            LoadError::NoWeightFiles { dir: dir() },
            LoadError::ShardMissing {
                file: dir().join("model-00002-of-00002.safetensors"),
            },
            LoadError::WeightFileUnreadable {
                file: dir().join("model.safetensors"),
                message: "[load_safetensors] Failed to open file".into(),
            },
            LoadError::TensorMissing {
                tensor: tensor(),
                dir: dir(),
            },
            LoadError::TensorUnexpected {
                tensor: tensor(),
                file: "model.safetensors".into(),
                model_type: "llama".into(),
            },
            LoadError::TensorShape {
                tensor: tensor(),
                file: "model.safetensors".into(),
                expected: vec![256, 256],
                found: vec![256, 128],
            },
            LoadError::TensorDtype {
                tensor: tensor(),
                file: "model.safetensors".into(),
                expected: "float32".into(),
                found: "int8".into(),
            },
            LoadError::UnsupportedQuantization {
                detail: "3 bits".into(),
                path: dir().join("config.json"),
            },
            LoadError::Mlx("[eval] out of memory".into()),
            LoadError::Split("a model of 2 layers cannot be split over 3 ranks".into()),
        ];
        let names: std::collections::HashSet<_> = errors.iter().map(variant_name).collect();
        assert_eq!(names.len(), errors.len(), "a variant is listed twice");
        for error in errors {
            let message = error.to_string();
            assert_eq!(
                crate::error_kind::out_of_place_in_the_app(&message),
                None,
                "{message}"
            );
            // It reaches users as a run error of kind `load`, or, for a
            // model the ranks cannot divide, `distributed`.
            let expected = match error {
                LoadError::Split(_) => crate::ErrorKind::Distributed,
                _ => crate::ErrorKind::Load,
            };
            assert_eq!(RunError::from(error).kind(), expected);
        }
    }

    #[test]
    fn a_real_mlx_failure_reads_without_source_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, b"not a safetensors file at all").unwrap();
        let error = mlx_rs::Array::load_safetensors(&file).unwrap_err();
        // What MLX and mlx-rs print: with the C++ and the Rust locations.
        assert!(
            crate::error_kind::out_of_place_in_the_app(&error.to_string()).is_some(),
            "{error}"
        );
        let message = mlx_failure(&error);
        assert!(!message.is_empty());
        assert_eq!(
            crate::error_kind::out_of_place_in_the_app(&message),
            None,
            "{message} (from {error})"
        );
    }
}
