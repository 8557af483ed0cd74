//! The gated DeltaNet layer (Qwen 3.5's and Qwen3-Next's linear
//! attention), in place of attention: `in_proj_qkv` (in Qwen3-Next the
//! first rows of each key head's group of `in_proj_qkvz`) through a
//! depthwise causal convolution and a SiLU gives queries, keys and values; the queries and keys are
//! L2-normalized per head (the queries also scaled by `1 / key_head_dim`);
//! then, position by position, a recurrent matrix per value head
//! `[value_head_dim, key_head_dim]` decays by `g`, learns `beta` of the
//! difference between the value and what it recalls for the key, and is
//! read with the query. The output goes through an RMSNorm gated by the
//! SiLU of `in_proj_z`, then `out_proj`. The cache is a `RecurrentState`:
//! the convolution's last inputs and the float32 matrix, constant in the
//! context's length.
//!
//! The recurrence is mlx-lm's `gated_delta_ops` operation for operation
//! (what mlx-lm runs wherever Metal is not: one step's decay, recall, delta
//! and readout, compiled, stepped over the positions), so both give the
//! same floats; a decode step is that compiled step once.

use std::cell::RefCell;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp, NewAxis};
use mlx_rs::transforms::compile::compile;
use mlx_rs::{Array, Dtype, fast, ops};

use super::{JointProjection, Linear, QuantConfig};
use crate::engine::LoadError;
use crate::engine::cache::LayerCache;
use crate::engine::weights::WeightMap;
use crate::family::{DeltaProjections, GatedDeltaConfig};

/// The epsilon of the reference L2 norm of queries and keys (added to the
/// sum of squares).
const L2_EPS: f64 = 1e-6;

/// The projections of a gated DeltaNet layer's input, as its checkpoint
/// stores them (`DeltaProjections`); joined for a decode step where they
/// are stored alike and the decoder joins projections.
enum InProjection {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a`.
    Apart(JointProjection<4>),
    /// `in_proj_qkvz` and `in_proj_ba`, their rows grouped by key head.
    GroupedByKeyHead(JointProjection<2>),
}

impl InProjection {
    fn parameters(&self) -> u64 {
        match self {
            InProjection::Apart(parts) => parts.parameters(),
            InProjection::GroupedByKeyHead(parts) => parts.parameters(),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            InProjection::Apart(parts) => parts.arrays(),
            InProjection::GroupedByKeyHead(parts) => parts.arrays(),
        }
    }

    fn decode_layers(&self) -> Vec<&Linear> {
        match self {
            InProjection::Apart(parts) => parts.decode_layers(),
            InProjection::GroupedByKeyHead(parts) => parts.decode_layers(),
        }
    }
}

pub struct GatedDelta {
    in_proj: InProjection,
    pub(super) out_proj: Linear,
    /// The depthwise kernel `[conv_dim, kernel, 1]`, as MLX's conv1d takes it.
    conv_weight: Array,
    dt_bias: Array,
    /// `-exp(A_log)` in float32, the decay's rate: a constant of the
    /// weights, computed once at load rather than in every step.
    decay_rate: Array,
    /// The gated RMSNorm's scale `[value_head_dim]`.
    norm: Array,
    eps: f32,
    key_heads: i32,
    value_heads: i32,
    key_head_dim: i32,
    value_head_dim: i32,
    conv_dim: i32,
}

impl GatedDelta {
    /// Loads `{p}.linear_attn`'s projections, kernel, decay and norm.
    pub fn load(
        w: &mut WeightMap,
        p: &str,
        hidden: i32,
        delta: &GatedDeltaConfig,
        eps: f32,
        quant: Option<&QuantConfig>,
        join: bool,
    ) -> Result<Self, LoadError> {
        let prefix = format!("{p}.linear_attn");
        let heads = delta.value_heads;
        let mut proj = |name: &str, out: i32, inp: i32| {
            Linear::load(w, &format!("{prefix}.{name}"), out, inp, quant, false)
        };
        let in_proj = match delta.projections {
            DeltaProjections::Apart => InProjection::Apart(joint(
                [
                    proj("in_proj_qkv", delta.conv_dim(), hidden)?,
                    proj("in_proj_z", delta.value_dim(), hidden)?,
                    proj("in_proj_b", heads, hidden)?,
                    proj("in_proj_a", heads, hidden)?,
                ],
                join,
            )?),
            DeltaProjections::GroupedByKeyHead => InProjection::GroupedByKeyHead(joint(
                [
                    proj("in_proj_qkvz", delta.conv_dim() + delta.value_dim(), hidden)?,
                    proj("in_proj_ba", 2 * heads, hidden)?,
                ],
                join,
            )?),
        };
        let out_proj = proj("out_proj", hidden, delta.value_dim())?;
        Ok(Self {
            in_proj,
            out_proj,
            conv_weight: w.take_float(
                &format!("{prefix}.conv1d.weight"),
                &[delta.conv_dim(), delta.conv_kernel, 1],
            )?,
            dt_bias: w.take_float(&format!("{prefix}.dt_bias"), &[heads])?,
            decay_rate: decay_rate(&w.take_float(&format!("{prefix}.A_log"), &[heads])?)?,
            norm: w.take_float(&format!("{prefix}.norm.weight"), &[delta.value_head_dim])?,
            eps,
            key_heads: delta.key_heads,
            value_heads: heads,
            key_head_dim: delta.key_head_dim,
            value_head_dim: delta.value_head_dim,
            conv_dim: delta.conv_dim(),
        })
    }

    /// The layer's output for `x` (`[B, L, hidden]`) before `out_proj`,
    /// `[B, L, value_dim]`, extending the layer's state by `L` positions.
    pub fn mix(&self, x: &Array, cache: &mut LayerCache) -> Result<Array, Exception> {
        let shape = x.shape();
        let (batch, length) = (shape[0], shape[1]);
        let state = cache.recurrent_mut()?;
        let [qkv, z, b, a] = self.project(x)?;
        let z = z.reshape(&[batch, length, self.value_heads, self.value_head_dim])?;
        let conv_input = state.conv.extend(&qkv)?;
        let convolved = ops::conv1d(&conv_input, &self.conv_weight, 1, 0, 1, self.conv_dim)?;
        let convolved = ops::multiply(&convolved, ops::sigmoid(&convolved)?)?;
        let key_dim = self.key_heads * self.key_head_dim;
        let [q, k, v] =
            <[Array; 3]>::try_from(convolved.split_at_indices(&[key_dim, 2 * key_dim], -1)?)
                .map_err(|_| Exception::custom("a split in three gave another count"))?;
        let q = q.reshape(&[batch, length, self.key_heads, self.key_head_dim])?;
        let k = k.reshape(&[batch, length, self.key_heads, self.key_head_dim])?;
        let v = v.reshape(&[batch, length, self.value_heads, self.value_head_dim])?;
        let (q, k) = self.normalize(&q, &k)?;
        let beta = ops::sigmoid(&b)?;
        let g = self.decay(&a)?;
        let matrix = match state.matrix() {
            Some(matrix) => matrix.clone(),
            None => ops::zeros_dtype(
                &[
                    batch,
                    self.value_heads,
                    self.value_head_dim,
                    self.key_head_dim,
                ],
                Dtype::Float32,
            )?,
        };
        let (y, matrix) = self.recur(q, k, &v, &g, &beta, matrix)?;
        state.set_matrix(matrix);
        let out = gated_rms_norm(&y, &z, &self.norm, self.eps)?;
        out.reshape(&[batch, length, self.value_heads * self.value_head_dim])
    }

    /// The projections of `x` (`[B, L, hidden]`): the convolution's input
    /// (every query head, every key head, every value head), the output
    /// gates `z`, and `b` and `a` per value head. Rows grouped by key head
    /// are split and regathered into that order as mlx-lm's
    /// `fix_query_key_value_ordering` does.
    fn project(&self, x: &Array) -> Result<[Array; 4], Exception> {
        let parts = match &self.in_proj {
            InProjection::Apart(parts) => return parts.forward(x),
            InProjection::GroupedByKeyHead(parts) => parts,
        };
        let shape = x.shape();
        let (batch, length) = (shape[0], shape[1]);
        let [qkvz, ba] = parts.forward(x)?;
        let (key_heads, key_dim) = (self.key_heads, self.key_head_dim);
        // The value heads that share each key head, as wide as they are.
        let shared = self.value_heads / key_heads.max(1) * self.value_head_dim;
        let grouped = |y: Array| y.reshape(&[batch, length, key_heads, -1]);
        let flat = |y: &Array| y.reshape(&[batch, length, -1]);
        let [q, k, v, z] = <[Array; 4]>::try_from(
            grouped(qkvz)?.split_at_indices(&[key_dim, 2 * key_dim, 2 * key_dim + shared], -1)?,
        )
        .map_err(|_| Exception::custom("a split in four gave another count"))?;
        let [b, a] = <[Array; 2]>::try_from(
            grouped(ba)?.split_at_indices(&[self.value_heads / key_heads.max(1)], -1)?,
        )
        .map_err(|_| Exception::custom("a split in two gave another count"))?;
        let qkv = ops::concatenate(&[flat(&q)?, flat(&k)?, flat(&v)?], -1)?;
        Ok([qkv, flat(&z)?, flat(&b)?, flat(&a)?])
    }

    /// Queries and keys L2-normalized per head, the queries also scaled by
    /// `1 / key_head_dim` (the readout's scale, folded in): mlx-lm's
    /// `normalize_qk`, an RMSNorm with the epsilon rescaled to match.
    fn normalize(&self, q: &Array, k: &Array) -> Result<(Array, Array), Exception> {
        let inv_scale = f64::from(self.key_head_dim).powf(-0.5);
        let inv_squared = inv_scale * inv_scale;
        let eps = (L2_EPS * inv_squared) as f32;
        let scalar =
            |value: f64, like: &Array| Array::from_f32(value as f32).as_dtype(like.dtype());
        let q = ops::multiply(scalar(inv_squared, q)?, fast::rms_norm(q, None, eps)?)?;
        let k = ops::multiply(scalar(inv_scale, k)?, fast::rms_norm(k, None, eps)?)?;
        Ok((q, k))
    }

    /// Each position's decay per head, float32:
    /// `exp(-exp(A_log) * softplus(a + dt_bias))`.
    fn decay(&self, a: &Array) -> Result<Array, Exception> {
        let shifted = ops::add(a, &self.dt_bias)?;
        let zero = Array::from_f32(0.0).as_dtype(shifted.dtype())?;
        let softplus = ops::logaddexp(&shifted, &zero)?;
        ops::exp(ops::multiply(&self.decay_rate, &softplus)?)
    }

    /// The recurrence over the positions of `q`, `k` (`[B, L, Hk, Dk]`),
    /// `v` (`[B, L, Hv, Dv]`), `g` and `beta` (`[B, L, Hv]`) from `matrix`:
    /// the outputs `[B, L, Hv, Dv]` in the queries' dtype and the matrix
    /// after the last position.
    fn recur(
        &self,
        q: Array,
        k: Array,
        v: &Array,
        g: &Array,
        beta: &Array,
        mut matrix: Array,
    ) -> Result<(Array, Array), Exception> {
        let length = q.shape()[1];
        let repeat = self.value_heads / self.key_heads.max(1);
        let (q, k) = if repeat > 1 {
            (
                Array::repeat_axis::<f32>(q, repeat, -2)?,
                Array::repeat_axis::<f32>(k, repeat, -2)?,
            )
        } else {
            (q, k)
        };
        let mut outputs = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
        for t in 0..length {
            let inputs = [
                q.index((.., t)),
                k.index((.., t)),
                v.index((.., t)),
                g.index((.., t)),
                beta.index((.., t)),
                matrix,
            ];
            let [y, next] = <[Array; 2]>::try_from(STEP.with_borrow_mut(|step| step(&inputs))?)
                .map_err(|_| Exception::custom("a recurrence step gave other than two arrays"))?;
            outputs.push(y);
            matrix = next;
        }
        // A decode step's one output needs only its axis, not a copy.
        let y = match <[Array; 1]>::try_from(outputs) {
            Ok([y]) => ops::expand_dims(&y, 1)?,
            Err(outputs) => ops::stack(&outputs, 1)?,
        };
        Ok((y, matrix))
    }

    pub fn parameters(&self) -> u64 {
        let size = |a: &Array| a.size() as u64;
        self.in_proj.parameters()
            + self.out_proj.parameters()
            + [
                &self.conv_weight,
                &self.dt_bias,
                &self.decay_rate,
                &self.norm,
            ]
            .into_iter()
            .map(size)
            .sum::<u64>()
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.in_proj.arrays();
        out.extend(self.out_proj.arrays());
        out.extend([
            &self.conv_weight,
            &self.dt_bias,
            &self.decay_rate,
            &self.norm,
        ]);
        out
    }

    /// The matrices a one-position step multiplies by.
    pub fn decode_layers(&self) -> Vec<&Linear> {
        self.in_proj.decode_layers()
    }

    /// Positions the convolution spans.
    pub fn conv_kernel(&self) -> i32 {
        self.conv_weight.shape()[1]
    }
}

/// Parts stored apart, joined for decode steps where `join`.
fn joint<const N: usize>(parts: [Linear; N], join: bool) -> Result<JointProjection<N>, Exception> {
    if join {
        JointProjection::join(parts)
    } else {
        Ok(JointProjection::apart(parts))
    }
}

/// The norms a transformers checkpoint of a gated DeltaNet model stores
/// minus one (Qwen 3.5's `1 + w` norms), by the end of their names.
const SHIFTED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// Reads a checkpoint saved by transformers as mlx-lm's converter would
/// have written it (mlx-lm's `sanitize`): told by a convolution kernel laid
/// out `[channels, 1, kernel]`, each kernel is moved to `[channels, kernel,
/// 1]` and the norms stored minus one get their one back. A checkpoint in
/// MLX's layout is left as it is.
pub fn read_transformers_layout(w: &mut WeightMap) -> Result<(), LoadError> {
    let kernels: Vec<String> = w
        .tensors
        .iter()
        .filter(|(name, stored)| {
            name.ends_with("conv1d.weight") && stored.array.shape().last() != Some(&1)
        })
        .map(|(name, _)| name.clone())
        .collect();
    if kernels.is_empty() {
        return Ok(());
    }
    for name in kernels {
        let stored = w.take_stored(&name)?;
        let moved = stored.array.swap_axes(1, 2)?;
        w.insert(name, moved, stored.file);
    }
    let norms: Vec<String> = w
        .tensors
        .iter()
        .filter(|(name, stored)| {
            stored.array.ndim() == 1 && SHIFTED_NORMS.iter().any(|end| name.ends_with(end))
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in norms {
        let stored = w.take_stored(&name)?;
        let one = Array::from_f32(1.0).as_dtype(stored.array.dtype())?;
        let restored = ops::add(&stored.array, &one)?;
        w.insert(name, restored, stored.file);
    }
    Ok(())
}

/// `-exp(A_log)` in float32, evaluated.
fn decay_rate(a_log: &Array) -> Result<Array, LoadError> {
    let rate = ops::negative(ops::exp(a_log.as_dtype(Dtype::Float32)?)?)?;
    rate.eval()?;
    Ok(rate)
}

/// A kept compiled function of arrays.
type CompiledStep = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>, Exception>>;

thread_local! {
    /// One position of the recurrence, compiled once per thread (and traced
    /// once per shape) as mlx-lm compiles `_gated_delta_step_ops`: its
    /// elementwise operations run as fused kernels, and a step is replayed
    /// rather than built operation by operation. Thread-local because MLX's
    /// compile cache is not shared across threads safely.
    static STEP: RefCell<CompiledStep> = RefCell::new(Box::new(compile(step, false)));
}

/// One position of the recurrence: `q`, `k` `[B, H, Dk]`, `v` `[B, H, Dv]`,
/// `g`, `beta` `[B, H]` and the matrix `[B, H, Dv, Dk]` give the output
/// `[B, H, Dv]` in the queries' dtype and the next matrix. The matrix decays
/// by `g`, recalls `matrix . k`, adds `k` times `beta` of the difference to
/// `v`, and is read with `q` (mlx-lm's `_gated_delta_step_ops`).
fn step(inputs: &[Array]) -> Result<Vec<Array>, Exception> {
    let [q, k, v, g, beta, matrix] = inputs else {
        return Err(Exception::custom("a recurrence step takes six arrays"));
    };
    let matrix = ops::multiply(matrix, g.index((Ellipsis, NewAxis, NewAxis)))?;
    let k_row = k.index((Ellipsis, NewAxis, ..));
    let recalled = ops::sum_axis(&ops::multiply(&matrix, &k_row)?, -1, false)?;
    let delta = ops::multiply(
        ops::subtract(v, &recalled)?,
        beta.index((Ellipsis, NewAxis)),
    )?;
    let matrix = ops::add(
        &matrix,
        ops::multiply(&k_row, delta.index((Ellipsis, NewAxis)))?,
    )?;
    let read = ops::multiply(&matrix, q.index((Ellipsis, NewAxis, ..)))?;
    let y = ops::sum_axis(&read, -1, false)?.as_dtype(q.dtype())?;
    Ok(vec![y, matrix])
}

/// `rms_norm(y) * silu(z)`, the product in float32 and cast back to y's
/// dtype (mlx-lm's `Qwen3NextRMSNormGated` with `precise_swiglu`).
fn gated_rms_norm(y: &Array, z: &Array, weight: &Array, eps: f32) -> Result<Array, Exception> {
    let normed = fast::rms_norm(y, Some(weight), eps)?;
    let z = z.as_dtype(Dtype::Float32)?;
    let gate = ops::multiply(&z, ops::sigmoid(&z)?)?;
    ops::multiply(&gate, normed.as_dtype(Dtype::Float32)?)?.as_dtype(y.dtype())
}
