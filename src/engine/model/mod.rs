//! Model architectures, one file per `model_type`, and the layers they share.
//! Field names follow the checkpoint's tensor names, so loading needs no
//! rename table; loading is strict (see `weights::WeightMap`).

pub mod decoder;
pub mod gemma3;
pub mod llama;
pub mod mistral;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};
use serde::Deserialize;

use super::LoadError;
use super::weights::WeightMap;

/// `quantization` in config.json (mlx-lm's format).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct QuantConfig {
    pub group_size: i32,
    pub bits: i32,
    #[serde(default)]
    pub mode: Option<QuantMode>,
}

/// Only affine quantization is read; other modes are named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    Affine,
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl QuantConfig {
    /// Rejects what the layers below cannot compute.
    pub fn validate(&self, path: &std::path::Path) -> Result<(), LoadError> {
        let mode_ok = matches!(self.mode, None | Some(QuantMode::Affine));
        if !mode_ok || !matches!(self.bits, 4 | 8) || !matches!(self.group_size, 32 | 64 | 128) {
            return Err(LoadError::UnsupportedQuantization {
                detail: format!(
                    "mode {:?}, bits {}, group size {}",
                    self.mode.unwrap_or(QuantMode::Affine),
                    self.bits,
                    self.group_size
                ),
                path: path.to_owned(),
            });
        }
        Ok(())
    }
}

/// A dense or affine-quantized matrix `[out, in]` with an optional bias.
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        bias: Option<Array>,
        group_size: i32,
        bits: i32,
    },
}

impl Linear {
    /// Loads `{prefix}.weight` (and `.scales`/`.biases` when the checkpoint
    /// quantized this layer, `.bias` when `has_bias`).
    pub fn load(
        weights: &mut WeightMap,
        prefix: &str,
        out_features: i32,
        in_features: i32,
        quant: Option<QuantConfig>,
        has_bias: bool,
    ) -> Result<Self, LoadError> {
        let bias = if has_bias {
            Some(weights.take_float(&format!("{prefix}.bias"), &[out_features])?)
        } else {
            None
        };
        let scales_name = format!("{prefix}.scales");
        match quant {
            Some(q) if weights.contains(&scales_name) => {
                let packed_in = in_features * q.bits / 32;
                let groups = in_features / q.group_size;
                Ok(Linear::Quantized {
                    weight: weights
                        .take_packed(&format!("{prefix}.weight"), &[out_features, packed_in])?,
                    scales: weights.take_float(&scales_name, &[out_features, groups])?,
                    biases: weights
                        .take_float(&format!("{prefix}.biases"), &[out_features, groups])?,
                    bias,
                    group_size: q.group_size,
                    bits: q.bits,
                })
            }
            _ => Ok(Linear::Dense {
                weight: weights
                    .take_float(&format!("{prefix}.weight"), &[out_features, in_features])?,
                bias,
            }),
        }
    }

    /// `x @ W.T (+ b)`.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let (y, bias) = match self {
            Linear::Dense { weight, bias } => (ops::matmul(x, weight.transpose()?)?, bias),
            Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                group_size,
                bits,
            } => (
                ops::quantized_matmul(x, weight, scales, biases, true, *group_size, *bits)?,
                bias,
            ),
        };
        match bias {
            Some(b) => ops::add(&y, b),
            None => Ok(y),
        }
    }

    /// Rows of the matrix for token ids: the embedding lookup. Quantized
    /// rows are dequantized after the gather, so only they are expanded.
    pub fn embed(&self, ids: &Array) -> Result<Array, Exception> {
        match self {
            Linear::Dense { weight, .. } => ops::indexing::take_axis(weight, ids, 0),
            Linear::Quantized {
                weight,
                scales,
                biases,
                group_size,
                bits,
                ..
            } => {
                let w = ops::indexing::take_axis(weight, ids, 0)?;
                let s = ops::indexing::take_axis(scales, ids, 0)?;
                let b = ops::indexing::take_axis(biases, ids, 0)?;
                ops::dequantize(&w, &s, &b, *group_size, *bits)
            }
        }
    }

    /// Bytes the layer's arrays hold.
    pub fn nbytes(&self) -> usize {
        match self {
            Linear::Dense { weight, bias } => {
                weight.nbytes() + bias.as_ref().map_or(0, |b| b.nbytes())
            }
            Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                ..
            } => {
                weight.nbytes()
                    + scales.nbytes()
                    + biases.nbytes()
                    + bias.as_ref().map_or(0, |b| b.nbytes())
            }
        }
    }

    /// Every array, for evaluation after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense { weight, bias } => std::iter::once(weight).chain(bias).collect(),
            Linear::Quantized {
                weight,
                scales,
                biases,
                bias,
                ..
            } => [weight, scales, biases].into_iter().chain(bias).collect(),
        }
    }
}

/// The architectures Ondo can run, by `model_type`.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma3",
    "phi3",
];

/// Settles config.json for its `model_type`, or names what is unsupported.
pub fn decoder_config(
    value: &serde_json::Value,
    path: &std::path::Path,
) -> Result<decoder::DecoderConfig, LoadError> {
    let model_type = value["model_type"].as_str().unwrap_or_default();
    match model_type {
        "llama" => llama::config(value, path),
        "mistral" => mistral::config(value, path),
        "qwen2" => qwen2::config(value, path),
        "qwen3" => qwen3::config(value, path),
        "gemma3_text" => gemma3::text_config(value, path),
        "gemma3" => gemma3::multimodal_config(value, path),
        "phi3" => phi3::config(value, path),
        _ => Err(LoadError::UnsupportedModelType {
            model_type: model_type.to_owned(),
            path: path.to_owned(),
            supported: SUPPORTED_MODEL_TYPES.join(", "),
        }),
    }
}
