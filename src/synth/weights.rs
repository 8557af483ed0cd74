//! The tensors of a synthetic checkpoint: the family's tensor plan
//! (`family::tensors`, names and shapes exactly as mlx-community writes
//! them), filled with random values from MLX's counter-based RNG keyed by
//! (seed, tensor name), so a tensor's values do not depend on which other
//! tensors were made before it. Norm scales are ones; biases are drawn wider
//! than matrices (normal(0, 0.1) against 0.02), so they visibly change an
//! output; other gains are drawn between 0.5 and 1.5. A quantized model's routers are 8-bit in groups of 64 whatever
//! the rest, as mlx-lm's converter keeps Qwen3-MoE's (GLM's stay in floats,
//! and its score corrections in float32).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use mlx_rs::{Array, random};

use crate::engine::model::quantized;
use crate::family::tensors::{PlannedTensor, TensorKind};
use crate::family::{QuantMode, QuantParams};

use super::{SynthError, SynthOptions, io_err};

/// How a synthetic tensor is quantized (the synth side of what the engine
/// reads as `QuantParams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthQuant {
    pub group_size: i32,
    pub bits: i32,
    pub mxfp4: bool,
}

impl SynthQuant {
    /// `mode` as config.json writes it.
    pub fn mode_name(&self) -> &'static str {
        if self.mxfp4 { "mxfp4" } else { "affine" }
    }

    fn params(&self) -> QuantParams {
        QuantParams {
            group_size: self.group_size,
            bits: self.bits,
            mode: if self.mxfp4 {
                QuantMode::Mxfp4
            } else {
                QuantMode::Affine
            },
        }
    }
}

/// The router's quantization in a quantized mixture-of-experts model.
const ROUTER_QUANT: SynthQuant = SynthQuant {
    group_size: 64,
    bits: 8,
    mxfp4: false,
};

/// mxfp4's only layout: 4-bit values in groups of 32.
const MXFP4: SynthQuant = SynthQuant {
    group_size: 32,
    bits: 4,
    mxfp4: true,
};

/// How a tensor of `kind` is quantized, if at all.
fn quant_of(options: &SynthOptions, kind: TensorKind) -> Option<SynthQuant> {
    let bits = i32::from(options.bits?);
    let default = SynthQuant {
        group_size: i32::try_from(options.group_size).unwrap_or(64),
        bits,
        mxfp4: false,
    };
    match kind {
        TensorKind::NormScale
        | TensorKind::Bias
        | TensorKind::Conv
        | TensorKind::LogDecay
        | TensorKind::FloatRouter
        | TensorKind::ScoreCorrection
        | TensorKind::FloatMatrix
        | TensorKind::Gain => None,
        TensorKind::Matrix => Some(default),
        TensorKind::Router => Some(ROUTER_QUANT),
        TensorKind::Experts if options.experts_mxfp4 => Some(MXFP4),
        TensorKind::Experts => Some(default),
    }
}

/// The dtype a tensor of `kind` is stored in before any quantization: the
/// folder's, but float32 for `A_log` and a score-correction bias.
fn stored_dtype(options: &SynthOptions, kind: TensorKind) -> mlx_rs::Dtype {
    match kind {
        TensorKind::LogDecay | TensorKind::ScoreCorrection => mlx_rs::Dtype::Float32,
        _ => options.dtype.to_mlx(),
    }
}

/// The modules whose quantization differs from the default, by module path
/// (the tensor name without `.weight`), for config.json.
pub fn module_quantization(
    options: &SynthOptions,
    plan: &[PlannedTensor],
) -> Vec<(String, SynthQuant)> {
    let Some(default) = quant_of(options, TensorKind::Matrix) else {
        return Vec::new();
    };
    plan.iter()
        .filter_map(|t| {
            let quant = quant_of(options, t.kind)?;
            let module = t.name.strip_suffix(".weight")?.to_owned();
            (quant != default).then_some((module, quant))
        })
        .collect()
}

/// Progress of `write_weights`, reported after each tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub current: String,
}

/// FNV-1a over the seed and the tensor name: a stable per-tensor RNG key.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The stored arrays for one planned tensor: one array, or the packed
/// weight with its scales and biases.
fn make_tensor(
    options: &SynthOptions,
    tensor: &PlannedTensor,
) -> Result<Vec<(String, Array)>, mlx_rs::error::Exception> {
    let values = match tensor.kind {
        TensorKind::NormScale => Array::ones::<f32>(&tensor.shape)?,
        TensorKind::Matrix
        | TensorKind::Bias
        | TensorKind::Router
        | TensorKind::FloatRouter
        | TensorKind::ScoreCorrection
        | TensorKind::Experts
        | TensorKind::FloatMatrix
        | TensorKind::Conv => {
            let key = random::key(tensor_seed(options.seed, &tensor.name))?;
            // A convolution kernel spans a few positions: weights of a
            // matrix's scale would leave its layer nearly silent. A score
            // correction as wide as the scores' spread changes which
            // experts are chosen.
            let scale = match tensor.kind {
                TensorKind::Bias | TensorKind::ScoreCorrection => 0.1,
                TensorKind::Conv => 0.5,
                _ => 0.02,
            };
            random::normal::<f32>(&tensor.shape[..], 0.0, scale, &key)?
        }
        // Gains between 0.5 and 1.5: near what a model learns, and far
        // enough from one that a gain the engine forgot changes the output.
        TensorKind::Gain => {
            let key = random::key(tensor_seed(options.seed, &tensor.name))?;
            random::uniform::<f32, f32>(0.5, 1.5, &tensor.shape[..], &key)?
        }
        // The log of a decay rate between 1 and 16 per head, as mlx-lm
        // initializes it (from 0, which would stop the decay).
        TensorKind::LogDecay => {
            let key = random::key(tensor_seed(options.seed, &tensor.name))?;
            mlx_rs::ops::log(&random::uniform::<f32, f32>(
                1.0,
                16.0,
                &tensor.shape[..],
                &key,
            )?)?
        }
    }
    .as_dtype(stored_dtype(options, tensor.kind))?;
    let out = match quant_of(options, tensor.kind) {
        Some(quant) => {
            let (packed, scales, biases) = quantized::quantize(&values, quant.params())?;
            let stem = tensor
                .name
                .strip_suffix(".weight")
                .unwrap_or(&tensor.name)
                .to_owned();
            let mut arrays = vec![
                (tensor.name.clone(), packed),
                (format!("{stem}.scales"), scales),
            ];
            if let Some(biases) = biases {
                arrays.push((format!("{stem}.biases"), biases));
            }
            arrays
        }
        None => vec![(tensor.name.clone(), values)],
    };
    mlx_rs::transforms::eval(out.iter().map(|(_, a)| a))?;
    Ok(out)
}

/// The arrays `make_tensor` stores for `tensor`, by name, shape and dtype,
/// without making them: the matrix itself, or its packed weight (uint32,
/// the input axis packed 32 / bits to a word) with per-group scales (the
/// weights' dtype, or uint8 exponents for mxfp4) and, for affine, biases.
pub fn stored_layout(
    options: &SynthOptions,
    tensor: &PlannedTensor,
) -> Vec<(String, Vec<i32>, mlx_rs::Dtype)> {
    let dtype = options.dtype.to_mlx();
    let Some(quant) = quant_of(options, tensor.kind) else {
        return vec![(
            tensor.name.clone(),
            tensor.shape.clone(),
            stored_dtype(options, tensor.kind),
        )];
    };
    let (leading, inputs) = tensor.shape.split_at(tensor.shape.len().saturating_sub(1));
    let inputs = inputs.first().copied().unwrap_or(0);
    let with_last = |last: i32| -> Vec<i32> { leading.iter().copied().chain([last]).collect() };
    let stem = tensor.name.strip_suffix(".weight").unwrap_or(&tensor.name);
    let groups = with_last(inputs / quant.group_size);
    let mut arrays = vec![(
        tensor.name.clone(),
        with_last(inputs * quant.bits / 32),
        mlx_rs::Dtype::Uint32,
    )];
    if quant.mxfp4 {
        arrays.push((format!("{stem}.scales"), groups, mlx_rs::Dtype::Uint8));
    } else {
        arrays.push((format!("{stem}.scales"), groups.clone(), dtype));
        arrays.push((format!("{stem}.biases"), groups, dtype));
    }
    arrays
}

/// What `write_weights` produced.
pub struct WrittenWeights {
    pub files: Vec<String>,
    pub parameters: u64,
}

/// Writes the safetensors file(s) of `plan` and the family's extra
/// tensors, plus `model.safetensors.index.json` when the tensors exceed one
/// shard.
pub fn write_weights(
    options: &SynthOptions,
    plan: &[PlannedTensor],
    dir: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<WrittenWeights, SynthError> {
    let extra = options
        .arch
        .synth
        .extra_tensors
        .iter()
        .map(|name| PlannedTensor {
            name: (*name).to_owned(),
            shape: vec![16],
            kind: TensorKind::NormScale,
        });
    let plan: Vec<PlannedTensor> = plan.iter().cloned().chain(extra).collect();
    let parameters = plan.iter().map(PlannedTensor::elements).sum();
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);

    let mut shards: Vec<Vec<String>> = Vec::new();
    let mut pending: Vec<(String, Array)> = Vec::new();
    let mut pending_bytes = 0u64;
    let mut total_bytes = 0u64;
    let flush = |pending: &mut Vec<(String, Array)>,
                 shards: &mut Vec<Vec<String>>|
     -> Result<(), SynthError> {
        if pending.is_empty() {
            return Ok(());
        }
        let path = dir.join(format!("shard-{:05}.safetensors", shards.len() + 1));
        Array::save_safetensors(pending.iter().map(|(n, a)| (n, a)), &metadata, &path).map_err(
            |e| SynthError::Io {
                path: path.clone(),
                source: std::io::Error::other(crate::engine::mlx_failure(&e)),
            },
        )?;
        shards.push(pending.drain(..).map(|(n, _)| n).collect());
        Ok(())
    };

    // A quantized Gemma 3 checkpoint (mlx-vlm's conversion) carries a copy
    // of its tied embedding as the head, quantized: mlx-vlm fills a missing
    // head from the embedding's packed weight alone, without its scales,
    // and could not load the folder without one.
    let head_copy = (options.arch.model_type == "gemma3" && options.bits.is_some()).then_some((
        "language_model.model.embed_tokens.",
        "language_model.lm_head.",
    ));
    for (index, tensor) in plan.iter().enumerate() {
        let mut arrays = make_tensor(options, tensor).map_err(|e| SynthError::Mlx {
            tensor: tensor.name.clone(),
            message: crate::engine::mlx_failure(&e),
        })?;
        if let Some((embed, head)) = head_copy
            && tensor.name.starts_with(embed)
        {
            let copies: Vec<(String, Array)> = arrays
                .iter()
                .map(|(name, array)| (name.replacen(embed, head, 1), array.clone()))
                .collect();
            arrays.extend(copies);
        }
        let bytes: u64 = arrays.iter().map(|(_, a)| a.nbytes() as u64).sum();
        if pending_bytes > 0 && pending_bytes + bytes > options.max_shard_bytes {
            flush(&mut pending, &mut shards)?;
            pending_bytes = 0;
        }
        pending_bytes += bytes;
        total_bytes += bytes;
        pending.extend(arrays);
        progress(Progress {
            tensors_done: index + 1,
            tensors_total: plan.len(),
            current: tensor.name.clone(),
        });
    }
    flush(&mut pending, &mut shards)?;

    let count = shards.len();
    let mut files = Vec::with_capacity(count);
    let mut weight_map = BTreeMap::new();
    for (i, names) in shards.iter().enumerate() {
        let final_name = if count == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let from = dir.join(format!("shard-{:05}.safetensors", i + 1));
        let to = dir.join(&final_name);
        fs::rename(&from, &to).map_err(io_err(&to))?;
        for name in names {
            weight_map.insert(name.clone(), final_name.clone());
        }
        files.push(final_name);
    }
    if count > 1 {
        let index = serde_json::json!({
            "metadata": { "total_size": total_bytes, "total_parameters": parameters },
            "weight_map": weight_map,
        });
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).map_err(|e| SynthError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        fs::write(&path, text + "\n").map_err(io_err(&path))?;
    }
    Ok(WrittenWeights { files, parameters })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets;

    /// What `stored_layout` says is what `make_tensor` makes, for a matrix
    /// in floats, affine 4-bit and mxfp4 experts.
    #[test]
    fn the_stored_layout_is_what_is_made() {
        let mut options = SynthOptions::for_preset(presets::find("tiny").unwrap());
        let tensors = [
            PlannedTensor {
                name: "m.weight".into(),
                shape: vec![64, 128],
                kind: TensorKind::Matrix,
            },
            PlannedTensor {
                name: "e.weight".into(),
                shape: vec![4, 64, 128],
                kind: TensorKind::Experts,
            },
            PlannedTensor {
                name: "n.weight".into(),
                shape: vec![128],
                kind: TensorKind::NormScale,
            },
        ];
        for (bits, mxfp4) in [(None, false), (Some(4), false), (Some(8), true)] {
            options.bits = bits;
            options.experts_mxfp4 = mxfp4;
            for tensor in &tensors {
                let made: Vec<_> = make_tensor(&options, tensor)
                    .unwrap()
                    .into_iter()
                    .map(|(name, array)| (name, array.shape().to_vec(), array.dtype()))
                    .collect();
                assert_eq!(made, stored_layout(&options, tensor), "{tensor:?} {bits:?}");
            }
        }
    }
}
