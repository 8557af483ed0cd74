//! The layers every family's model is built from: linear layers in floats
//! or quantized (with their joined forms for decode steps), the decoder, the
//! routed experts and the activations. What a family is (its config keys,
//! defaults and layer kinds) is `crate::family`'s; field names follow the
//! checkpoint's tensor names, so loading needs no rename table; loading is
//! strict (see `weights::WeightMap`).

pub mod activation;
pub mod bert;
pub mod decoder;
pub mod experts;
pub mod gated_delta;
pub mod per_layer_input;
pub mod quantized;
pub mod qwen_vision;
pub mod short_conv;
pub mod siglip;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, ops};

pub use crate::family::{QuantConfig, QuantMode, QuantParams};

use super::LoadError;
use super::backend::{self, AffineMatrix};
use super::weights::WeightMap;

/// A quantized matrix `[.., out, packed in]`: packed weight, per-group scales
/// and, for affine, per-group biases.
pub struct QuantizedMatrix {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub params: QuantParams,
}

impl QuantizedMatrix {
    /// Takes `{prefix}.weight`, `.scales` (and `.biases` for affine),
    /// checking their shapes for `[leading.., out, in]` and their dtypes
    /// for the mode.
    fn take(
        weights: &mut WeightMap,
        prefix: &str,
        leading: &[i32],
        out_features: i32,
        in_features: i32,
        params: QuantParams,
    ) -> Result<Self, LoadError> {
        let shape = |last: i32| -> Vec<i32> {
            leading
                .iter()
                .copied()
                .chain([out_features, last])
                .collect()
        };
        let packed_in = in_features * params.bits / 32;
        let groups = in_features / params.group_size;
        let weight = weights.take_packed(&format!("{prefix}.weight"), &shape(packed_in))?;
        let scales_name = format!("{prefix}.scales");
        let (scales, biases) = if params.has_biases() {
            (
                weights.take_float(&scales_name, &shape(groups))?,
                Some(weights.take_float(&format!("{prefix}.biases"), &shape(groups))?),
            )
        } else {
            (weights.take_exponents(&scales_name, &shape(groups))?, None)
        };
        Ok(Self {
            weight,
            scales,
            biases,
            params,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        [&self.weight, &self.scales]
            .into_iter()
            .chain(&self.biases)
            .collect()
    }

    /// The matrix as a backend's kernel takes it, when it is affine with
    /// group biases.
    fn affine(&self) -> Option<AffineMatrix<'_>> {
        Some(AffineMatrix {
            weight: &self.weight,
            scales: &self.scales,
            biases: self.biases.as_ref()?,
            params: self.params,
        })
        .filter(|_| self.params.mode == QuantMode::Affine)
    }

    /// The matrix's parameters (its elements before packing), not counting
    /// scales and biases.
    pub fn parameters(&self) -> u64 {
        let words = self.weight.size() as u64;
        words * 32 / self.params.bits.max(1) as u64
    }
}

/// How `Linear::load` and the experts find a module's matrix stored, as
/// mlx-lm decides: in floats without a quantization block; else the
/// module's own entry when config.json names it; else, when the checkpoint
/// has its `.scales`, what the tensors' shapes and the scales' dtype say (a
/// converter may leave modules unnamed whose parameters differ from the
/// default); else unquantized.
pub fn stored_params(
    weights: &WeightMap,
    prefix: &str,
    in_features: i32,
    quant: Option<&QuantConfig>,
) -> Result<Option<QuantParams>, LoadError> {
    let Some(quant) = quant else {
        return Ok(None);
    };
    if let Some(entry) = quant.modules.get(prefix) {
        return Ok(*entry);
    }
    let (Some(weight), Some(scales)) = (
        weights.peek(&format!("{prefix}.weight")),
        weights.peek(&format!("{prefix}.scales")),
    ) else {
        return Ok(None);
    };
    let groups = scales.shape().last().copied().unwrap_or(0);
    let packed = weight.shape().last().copied().unwrap_or(0);
    if groups <= 0 || in_features <= 0 {
        return Ok(Some(quant.default_params()));
    }
    let group_size = in_features / groups;
    let bits = packed * 32 / in_features;
    let mode = if scales.dtype() != Dtype::Uint8 {
        QuantMode::Affine
    } else {
        match (bits, group_size) {
            (4, 16) => QuantMode::Nvfp4,
            (8, 32) => QuantMode::Mxfp8,
            _ => QuantMode::Mxfp4,
        }
    };
    let params = QuantParams {
        group_size,
        bits,
        mode,
    };
    if params.check().is_err() {
        return Err(LoadError::UnsupportedQuantization {
            detail: format!(
                "mode {mode:?}, bits {bits}, group size {group_size} (as the tensors of {prefix} say)"
            ),
            path: weights.dir.join("config.json"),
        });
    }
    Ok(Some(params))
}

/// Whether MLX's default device is a GPU (Metal or CUDA), where the engine
/// picks the shapes of work that suit a GPU.
pub fn default_device_is_gpu() -> bool {
    matches!(
        mlx_rs::Device::try_default().and_then(|d| d.get_type()),
        Ok(mlx_rs::DeviceType::Gpu)
    )
}

/// A dense or quantized matrix `[out, in]` with an optional bias.
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        matrix: QuantizedMatrix,
        bias: Option<Array>,
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
        quant: Option<&QuantConfig>,
        has_bias: bool,
    ) -> Result<Self, LoadError> {
        let bias = if has_bias {
            Some(weights.take_float(&format!("{prefix}.bias"), &[out_features])?)
        } else {
            None
        };
        match stored_params(weights, prefix, in_features, quant)? {
            Some(params) => Ok(Linear::Quantized {
                matrix: QuantizedMatrix::take(
                    weights,
                    prefix,
                    &[],
                    out_features,
                    in_features,
                    params,
                )?,
                bias,
            }),
            None => Ok(Linear::Dense {
                weight: weights
                    .take_float(&format!("{prefix}.weight"), &[out_features, in_features])?,
                bias,
            }),
        }
    }

    /// `x @ W.T (+ b)`.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let y = self.product(x)?;
        match self.bias() {
            Some(b) => ops::add(&y, b),
            None => Ok(y),
        }
    }

    /// `x @ W.T`, without the bias.
    pub fn product(&self, x: &Array) -> Result<Array, Exception> {
        match self {
            Linear::Dense { weight, .. } => ops::matmul(x, weight.transpose()?),
            Linear::Quantized { matrix, .. } => {
                let (weight, scales, biases) =
                    (&matrix.weight, &matrix.scales, matrix.biases.as_ref());
                match matrix
                    .affine()
                    .and_then(|affine| backend::matvec(x, affine, None))
                {
                    Some(product) => product,
                    None => quantized::quantized_matmul(x, weight, scales, biases, matrix.params),
                }
            }
        }
    }

    /// `residual + (x @ W.T (+ b))`: the sublayer's output added to the
    /// residual stream. Where a backend's kernel takes the product (a decode
    /// step on CUDA) it makes both: one kernel fewer, the same bits as the
    /// matmul and the add.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array, Exception> {
        if let Linear::Quantized { matrix, bias: None } = self
            && let Some(product) = matrix
                .affine()
                .and_then(|affine| backend::matvec(x, affine, Some(residual)))
        {
            return product;
        }
        ops::add(residual, &self.forward(x)?)
    }

    /// The matrix as a backend's kernel takes it: affine quantized, with
    /// group biases (a bias of the layer's own is added after).
    pub fn affine(&self) -> Option<AffineMatrix<'_>> {
        match self {
            Linear::Quantized { matrix, .. } => matrix.affine(),
            Linear::Dense { .. } => None,
        }
    }

    /// One layer computing all of `parts` of the same input, their outputs
    /// side by side in order, or `None` when they are not stored alike (one
    /// quantized and one not, different quantization, a bias on some).
    /// Quantized matrices are concatenated along the output axis (packed
    /// weights, scales and biases alike): quantization groups run along the
    /// input axis, so every output is computed from the same numbers as
    /// before. The result is evaluated at once, so the parts' memory is
    /// freed when the caller drops them.
    pub fn concatenate(parts: &[Linear]) -> Result<Option<Linear>, Exception> {
        let stack = |arrays: &[&Array]| ops::concatenate(arrays, 0);
        let biases: Vec<&Array> = parts.iter().filter_map(Linear::bias).collect();
        if parts.len() < 2 || (!biases.is_empty() && biases.len() != parts.len()) {
            return Ok(None);
        }
        let bias = if biases.is_empty() {
            None
        } else {
            Some(stack(&biases)?)
        };
        let fused = if let Some(weights) = parts
            .iter()
            .map(|p| match p {
                Linear::Dense { weight, .. } => Some(weight),
                Linear::Quantized { .. } => None,
            })
            .collect::<Option<Vec<&Array>>>()
        {
            Linear::Dense {
                weight: stack(&weights)?,
                bias,
            }
        } else {
            let Some(matrices) = parts
                .iter()
                .map(|p| match p {
                    Linear::Quantized { matrix, .. } => Some(matrix),
                    Linear::Dense { .. } => None,
                })
                .collect::<Option<Vec<&QuantizedMatrix>>>()
            else {
                return Ok(None);
            };
            let params = matrices[0].params;
            let has_biases = matrices[0].biases.is_some();
            if matrices
                .iter()
                .any(|m| m.params != params || m.biases.is_some() != has_biases)
            {
                return Ok(None);
            }
            let each = |get: fn(&QuantizedMatrix) -> Option<&Array>| -> Vec<&Array> {
                matrices.iter().filter_map(|m| get(m)).collect()
            };
            let group_biases = if has_biases {
                Some(stack(&each(|m| m.biases.as_ref()))?)
            } else {
                None
            };
            Linear::Quantized {
                matrix: QuantizedMatrix {
                    weight: stack(&each(|m| Some(&m.weight)))?,
                    scales: stack(&each(|m| Some(&m.scales)))?,
                    biases: group_biases,
                    params,
                },
                bias,
            }
        };
        mlx_rs::transforms::eval(fused.arrays())?;
        Ok(Some(fused))
    }

    /// The layer's own bias, added after the product.
    pub fn bias(&self) -> Option<&Array> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }

    /// Output features (rows of the matrix).
    pub fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { weight, .. } => weight.shape()[0],
            Linear::Quantized { matrix, .. } => matrix.weight.shape()[0],
        }
    }

    /// The layer computing outputs `start..end` only: its arrays are views
    /// of these rows, evaluated, so they share this layer's memory (a slice
    /// of whole rows is contiguous: the kernels read it without a copy).
    pub fn rows(&self, start: i32, end: i32) -> Result<Linear, Exception> {
        use mlx_rs::ops::indexing::IndexOp;
        let cut = |a: &Array| a.index(start..end);
        let part = match self {
            Linear::Dense { weight, bias } => Linear::Dense {
                weight: cut(weight),
                bias: bias.as_ref().map(cut),
            },
            Linear::Quantized { matrix, bias } => Linear::Quantized {
                matrix: QuantizedMatrix {
                    weight: cut(&matrix.weight),
                    scales: cut(&matrix.scales),
                    biases: matrix.biases.as_ref().map(cut),
                    params: matrix.params,
                },
                bias: bias.as_ref().map(cut),
            },
        };
        mlx_rs::transforms::eval(part.arrays())?;
        Ok(part)
    }

    /// Rows of the matrix for token ids: the embedding lookup. Quantized
    /// rows are dequantized after the gather, so only they are expanded.
    pub fn embed(&self, ids: &Array) -> Result<Array, Exception> {
        match self {
            Linear::Dense { weight, .. } => ops::indexing::take_axis(weight, ids, 0),
            Linear::Quantized { matrix, .. } => {
                let w = ops::indexing::take_axis(&matrix.weight, ids, 0)?;
                let s = ops::indexing::take_axis(&matrix.scales, ids, 0)?;
                let b = match &matrix.biases {
                    Some(biases) => Some(ops::indexing::take_axis(biases, ids, 0)?),
                    None => None,
                };
                quantized::dequantize(&w, &s, b.as_ref(), matrix.params)
            }
        }
    }

    /// Parameters: the matrix's elements (before any packing) and the bias.
    pub fn parameters(&self) -> u64 {
        let (matrix, bias) = match self {
            Linear::Dense { weight, bias } => (weight.size() as u64, bias),
            Linear::Quantized { matrix, bias } => (matrix.parameters(), bias),
        };
        matrix + bias.as_ref().map_or(0, |b| b.size() as u64)
    }

    /// Bytes the layer's arrays hold.
    pub fn nbytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// Every array, for evaluation after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense { weight, bias } => std::iter::once(weight).chain(bias).collect(),
            Linear::Quantized { matrix, bias } => matrix.arrays().into_iter().chain(bias).collect(),
        }
    }
}

/// Projections of one input (q, k and v; gate and up), each its own layer,
/// and, where they are stored alike and the decoder joins them (on a GPU:
/// `decoder::join_projections`), also one layer whose rows are theirs side
/// by side: the parts are then views into it, so nothing is held twice.
///
/// A one-position step (decode) runs the joined layer: one matmul where the
/// parts would be N, and on a GPU every matmul is a kernel the host queues
/// per step. A longer input (a prefill chunk) runs the parts: their outputs
/// are separate arrays, which the next operation may reuse for its own
/// output, where views into one joined output hold all of it until the last
/// is read (a 2048-token prefill of an 8B model peaked 1.3x higher that way).
pub struct JointProjection<const N: usize> {
    parts: [Linear; N],
    joined: Option<Linear>,
    /// Where the joined output splits into the parts' (their widths summed).
    bounds: Vec<i32>,
}

impl<const N: usize> JointProjection<N> {
    /// Parts run apart at every length.
    pub fn apart(parts: [Linear; N]) -> Self {
        Self {
            parts,
            joined: None,
            bounds: Vec::new(),
        }
    }

    /// From parts stored apart; joined when they are stored alike.
    pub fn join(parts: [Linear; N]) -> Result<Self, Exception> {
        let Some(joined) = Linear::concatenate(&parts)? else {
            return Ok(Self::apart(parts));
        };
        let widths = parts.each_ref().map(Linear::out_features);
        drop(parts);
        Self::split(joined, widths)
    }

    /// From one stored layer (phi3's `qkv_proj`, `gate_up_proj`) whose rows
    /// are the parts', `widths` rows each in order.
    pub fn split(joined: Linear, widths: [i32; N]) -> Result<Self, Exception> {
        let mut start = 0;
        let mut parts = Vec::with_capacity(N);
        let mut bounds = Vec::with_capacity(N);
        for width in widths {
            parts.push(joined.rows(start, start + width)?);
            start += width;
            bounds.push(start);
        }
        bounds.pop();
        if start != joined.out_features() {
            return Err(Exception::custom(format!(
                "a joined projection of {} outputs split as {widths:?}",
                joined.out_features()
            )));
        }
        let parts: [Linear; N] = parts
            .try_into()
            .map_err(|_| Exception::custom("projection parts miscounted"))?;
        Ok(Self {
            parts,
            joined: Some(joined),
            bounds,
        })
    }

    /// The layers a one-position input runs: the joined one, or the parts.
    pub fn decode_layers(&self) -> Vec<&Linear> {
        match &self.joined {
            Some(joined) => vec![joined],
            None => self.parts.iter().collect(),
        }
    }

    /// The joined layer, where there is one.
    pub fn joined(&self) -> Option<&Linear> {
        self.joined.as_ref()
    }

    /// Each part's output for `x` (`[..., L, in]`), in order.
    pub fn forward(&self, x: &Array) -> Result<[Array; N], Exception> {
        let positions = x.shape().iter().rev().nth(1).copied().unwrap_or(1);
        let outputs = match &self.joined {
            Some(joined) if positions == 1 => {
                ops::split_at_indices(joined.forward(x)?, &self.bounds, -1)?
            }
            _ => self
                .parts
                .iter()
                .map(|p| p.forward(x))
                .collect::<Result<Vec<_>, _>>()?,
        };
        outputs
            .try_into()
            .map_err(|_| Exception::custom("a projection's output did not split as its parts"))
    }

    /// Parameters of the parts (a joined layer holds the same ones).
    pub fn parameters(&self) -> u64 {
        self.parts.iter().map(Linear::parameters).sum()
    }

    /// Every array once (the parts' are views into the joined layer's).
    pub fn arrays(&self) -> Vec<&Array> {
        match &self.joined {
            Some(joined) => joined.arrays(),
            None => self.parts.iter().flat_map(Linear::arrays).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::engine::weights::StoredTensor;

    fn config(value: serde_json::Value) -> QuantConfig {
        QuantConfig::from_value(&value).expect("a quantization block")
    }

    fn weights(tensors: Vec<(&str, Array)>) -> WeightMap {
        WeightMap {
            dir: "/models/m".into(),
            tensors: tensors
                .into_iter()
                .map(|(name, array)| {
                    let stored = StoredTensor {
                        array,
                        file: "model.safetensors".into(),
                    };
                    (name.to_owned(), stored)
                })
                .collect::<HashMap<_, _>>(),
        }
    }

    fn zeros(shape: &[i32], dtype: Dtype) -> Array {
        Array::zeros::<f32>(shape).unwrap().as_dtype(dtype).unwrap()
    }

    /// A module config.json names is read as named, whatever its tensors
    /// hold; `false` means floats.
    #[test]
    fn named_modules_are_read_as_named() {
        let q = config(serde_json::json!({
            "group_size": 64,
            "bits": 4,
            "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
            "model.layers.0.mlp.switch_mlp.up_proj": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
            "lm_head": false,
        }));
        let empty = weights(vec![]);
        let params = |prefix| stored_params(&empty, prefix, 256, Some(&q)).unwrap();
        assert_eq!(
            params("model.layers.0.mlp.gate"),
            Some(QuantParams {
                group_size: 64,
                bits: 8,
                mode: QuantMode::Affine
            })
        );
        assert_eq!(
            params("model.layers.0.mlp.switch_mlp.up_proj").map(|p| p.mode),
            Some(QuantMode::Mxfp4)
        );
        assert_eq!(params("lm_head"), None);
        assert_eq!(stored_params(&empty, "lm_head", 256, None).unwrap(), None);
    }

    /// A module config.json does not name is read as its tensors say, as
    /// mlx-lm does: a converter may quantize it otherwise than the default.
    #[test]
    fn unnamed_modules_are_read_as_their_tensors_say() {
        let q = config(serde_json::json!({"group_size": 64, "bits": 4}));
        let w = weights(vec![
            // 8-bit in groups of 128: 256 inputs pack into 64 words, 2 groups.
            ("a.weight", zeros(&[16, 64], Dtype::Uint32)),
            ("a.scales", zeros(&[16, 2], Dtype::Float32)),
            // mxfp4: uint8 exponents, 4 bits in groups of 32.
            ("b.weight", zeros(&[16, 32], Dtype::Uint32)),
            ("b.scales", zeros(&[16, 8], Dtype::Uint8)),
            ("c.weight", zeros(&[16, 256], Dtype::Float32)),
        ]);
        let params = |prefix| stored_params(&w, prefix, 256, Some(&q)).unwrap();
        assert_eq!(
            params("a"),
            Some(QuantParams {
                group_size: 128,
                bits: 8,
                mode: QuantMode::Affine
            })
        );
        assert_eq!(
            params("b"),
            Some(QuantParams {
                group_size: 32,
                bits: 4,
                mode: QuantMode::Mxfp4
            })
        );
        assert_eq!(params("c"), None);
    }

    use mlx_rs::ops::indexing::IndexOp;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
    }

    fn quantized_linear(
        out: i32,
        input: i32,
        seed: u64,
        params: QuantParams,
        bias: bool,
    ) -> Linear {
        let (weight, scales, biases) =
            quantized::quantize(&random(&[out, input], seed), params).expect("quantizes");
        Linear::Quantized {
            matrix: QuantizedMatrix {
                weight,
                scales,
                biases,
                params,
            },
            bias: bias.then(|| random(&[out], seed + 100)),
        }
    }

    /// Every output of the fused layer, split where the parts end, must be
    /// bit for bit the separate layers' output: token parity rests on it.
    fn assert_fused_equals_separate(parts: &[Linear], x: &Array) {
        let fused = Linear::concatenate(parts)
            .unwrap()
            .expect("stored alike, so fused");
        let whole = fused.forward(x).unwrap();
        let mut at = 0;
        for part in parts {
            let separate = part.forward(x).unwrap();
            let width = separate.shape()[2];
            assert_same_bits(&whole.index((.., .., at..at + width)), &separate);
            at += width;
        }
        assert_eq!(at, whole.shape()[2]);
    }

    #[test]
    fn projections_stored_alike_fuse_into_one_with_the_same_outputs() {
        let x = random(&[1, 3, 128], 1);
        let mxfp4 = QuantParams {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4,
        };
        for params in [affine(4), mxfp4] {
            for bias in [false, true] {
                assert_fused_equals_separate(&three_parts(params, bias), &x);
            }
        }
        let dense = [
            Linear::Dense {
                weight: random(&[40, 128], 5),
                bias: None,
            },
            Linear::Dense {
                weight: random(&[24, 128], 6),
                bias: None,
            },
        ];
        assert_fused_equals_separate(&dense, &x);
    }

    #[test]
    fn projections_stored_differently_stay_apart() {
        let dense = Linear::Dense {
            weight: random(&[32, 128], 3),
            bias: None,
        };
        let mixed = [quantized_linear(32, 128, 2, affine(4), false), dense];
        assert!(Linear::concatenate(&mixed).unwrap().is_none());
        let bits = [
            quantized_linear(32, 128, 2, affine(4), false),
            quantized_linear(32, 128, 3, affine(8), false),
        ];
        assert!(Linear::concatenate(&bits).unwrap().is_none());
        let some_bias = [
            quantized_linear(32, 128, 2, affine(4), true),
            quantized_linear(32, 128, 3, affine(4), false),
        ];
        assert!(Linear::concatenate(&some_bias).unwrap().is_none());
    }

    /// Affine quantization at `bits`, groups of 64 (mlx-lm's default).
    fn affine(bits: i32) -> QuantParams {
        QuantParams {
            group_size: 64,
            bits,
            mode: QuantMode::Affine,
        }
    }

    fn three_parts(params: QuantParams, bias: bool) -> [Linear; 3] {
        [
            quantized_linear(96, 128, 2, params, bias),
            quantized_linear(32, 128, 3, params, bias),
            quantized_linear(32, 128, 4, params, bias),
        ]
    }

    fn assert_same_bits(a: &Array, b: &Array) {
        let (a, b) = (a.reshape(&[-1]).unwrap(), b.reshape(&[-1]).unwrap());
        mlx_rs::transforms::eval([&a, &b]).unwrap();
        let bits =
            |v: &Array| -> Vec<u32> { v.as_slice::<f32>().iter().map(|f| f.to_bits()).collect() };
        assert_eq!(bits(&a), bits(&b));
    }

    #[test]
    fn a_joint_projection_gives_each_part_its_own_output_at_any_length() {
        let affine4 = affine(4);
        for bias in [false, true] {
            let joint = JointProjection::join(three_parts(affine4, bias)).unwrap();
            assert!(joint.joined().is_some(), "stored alike, so joined");
            // One position runs the joined matmul, five run the parts.
            for positions in [1, 5] {
                let x = random(&[1, positions, 128], 7);
                let outputs = joint.forward(&x).unwrap();
                for (output, part) in outputs.iter().zip(three_parts(affine4, bias)) {
                    assert_eq!(output.shape(), &[1, positions, part.out_features()]);
                    assert_same_bits(output, &part.forward(&x).unwrap());
                }
            }
        }
    }

    #[test]
    fn a_joint_projection_holds_its_weights_once() {
        let parts = three_parts(affine(4), true);
        let stored: usize = parts.iter().map(Linear::nbytes).sum();
        let joint = JointProjection::join(parts).unwrap();
        let held: usize = joint.arrays().iter().map(|a| a.nbytes()).sum();
        assert_eq!(held, stored);
    }

    #[test]
    fn a_stored_joined_projection_splits_into_its_rows() {
        let dense = Linear::Dense {
            weight: random(&[64, 128], 8),
            bias: Some(random(&[64], 9)),
        };
        let x = random(&[1, 4, 128], 10);
        let whole = dense.forward(&x).unwrap();
        let joint = JointProjection::split(dense, [40, 24]).unwrap();
        let [first, second] = joint.forward(&x).unwrap();
        assert_same_bits(&first, &whole.index((.., .., ..40)));
        assert_same_bits(&second, &whole.index((.., .., 40..)));
        let dense = Linear::Dense {
            weight: random(&[64, 128], 8),
            bias: None,
        };
        let error = JointProjection::split(dense, [40, 20])
            .err()
            .expect("rows left over");
        assert!(error.to_string().contains("64 outputs"), "{error}");
    }
}
