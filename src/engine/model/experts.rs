//! Routed experts (mixture of experts): a router picks `top_k` of
//! `num_experts` gated feed-forwards (SwiGLU, or Gemma 4's GEGLU) for each
//! token, and the token's output is their sum weighted by the router's
//! scores. Only the chosen experts' matrices are multiplied, through MLX's
//! gather matmuls, so a token costs `top_k` experts' work while every
//! expert stays resident.
//!
//! The computation follows mlx-lm's `SwitchGLU` operation for operation, so
//! both produce the same floats: softmax in full precision (or GLM's
//! grouped choice by corrected sigmoid scores), the top k by
//! `argpartition`, the gather matmuls on the experts' stacked `[E, out, in]`
//! matrices, and, when many tokens are routed at once (a prefill), the
//! token copies sorted by expert first so each expert's rows are read in one
//! run.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{Array, ops};

use super::{
    JointProjection, Linear, QuantConfig, QuantizedMatrix, activation, quantized, stored_params,
};
use crate::engine::LoadError;
use crate::engine::weights::WeightMap;
use crate::family::{ExpertsConfig, ExpertsKind};

/// From this many (token, expert) pairs on, tokens are sorted by expert
/// before the gather matmuls (mlx-lm's threshold: below it a decode step's
/// few pairs would pay for two argsorts and gain nothing).
const SORT_FROM_PAIRS: usize = 64;

/// The experts' matrices of one projection, stacked `[E, out, in]`: in
/// floats, or quantized (each expert's rows in groups, as one matrix's).
enum StackedMatrix {
    Dense { weight: Array },
    Quantized(QuantizedMatrix),
}

/// One projection of every expert, with each expert's bias `[E, out]` when
/// the family has them.
struct StackedLinear {
    matrix: StackedMatrix,
    bias: Option<Array>,
}

impl StackedLinear {
    /// Loads `{prefix}.weight` (and its scales, and biases for affine, when
    /// the checkpoint quantized it; see `QuantConfig`), and `{prefix}.bias`
    /// when `has_bias`.
    fn load(
        weights: &mut WeightMap,
        prefix: &str,
        experts: i32,
        out_features: i32,
        in_features: i32,
        quant: Option<&QuantConfig>,
        has_bias: bool,
    ) -> Result<Self, LoadError> {
        let bias = if has_bias {
            Some(weights.take_float(&format!("{prefix}.bias"), &[experts, out_features])?)
        } else {
            None
        };
        let matrix = match stored_params(weights, prefix, in_features, quant)? {
            Some(params) => StackedMatrix::Quantized(QuantizedMatrix::take(
                weights,
                prefix,
                &[experts],
                out_features,
                in_features,
                params,
            )?),
            None => StackedMatrix::Dense {
                weight: weights.take_float(
                    &format!("{prefix}.weight"),
                    &[experts, out_features, in_features],
                )?,
            },
        };
        Ok(Self { matrix, bias })
    }

    /// `x @ W[e].T (+ b[e])` for each row's expert `e` in `indices`;
    /// `sorted` tells MLX the indices ascend.
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array, Exception> {
        let y = match &self.matrix {
            StackedMatrix::Dense { weight } => {
                ops::gather_mm(x, weight.swap_axes(-1, -2)?, None, indices, sorted)?
            }
            StackedMatrix::Quantized(matrix) => quantized::gather_qmm(
                x,
                &matrix.weight,
                &matrix.scales,
                matrix.biases.as_ref(),
                indices,
                matrix.params,
                sorted,
            )?,
        };
        match &self.bias {
            Some(bias) => ops::add(
                &y,
                ops::expand_dims(ops::indexing::take_axis(bias, indices, 0)?, -2)?,
            ),
            None => Ok(y),
        }
    }

    fn parameters(&self) -> u64 {
        let matrix = match &self.matrix {
            StackedMatrix::Dense { weight } => weight.size() as u64,
            StackedMatrix::Quantized(matrix) => matrix.parameters(),
        };
        matrix + self.bias.as_ref().map_or(0, |b| b.size() as u64)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut out = match &self.matrix {
            StackedMatrix::Dense { weight } => vec![weight],
            StackedMatrix::Quantized(matrix) => matrix.arrays(),
        };
        out.extend(&self.bias);
        out
    }
}

/// One sparse layer's feed-forward: the router and the experts' SwiGLUs.
pub struct SparseExperts {
    /// `[E, hidden]`: one logit per expert.
    router: Linear,
    /// Gemma 4's router norms its input first: its `router.scale` times
    /// `hidden^-0.5`, and the norm's epsilon.
    router_norm: Option<(Array, f32)>,
    /// Gemma 4's `router.per_expert_scale` `[E]`: each chosen expert's
    /// weight is multiplied by its own.
    expert_scales: Option<Array>,
    gate_proj: StackedLinear,
    up_proj: StackedLinear,
    down_proj: StackedLinear,
    top_k: i32,
    norm_topk_prob: bool,
    kind: ExpertsKind,
    /// GLM's score-correction bias `[E]` (float32), added to the scores
    /// that choose the experts but not to those that weight them.
    score_correction: Option<Array>,
    /// A dense SwiGLU every token goes through too, weighted by the
    /// sigmoid of its gate (Qwen 3.5) or not (GLM-4.5).
    shared: Option<Box<SharedExpert>>,
}

/// The shared expert: `down(swiglu(gate(x), up(x)))`, times
/// `sigmoid(shared_expert_gate(x))` where it has a gate, added to the
/// routed experts' sum.
struct SharedExpert {
    gate_up: JointProjection<2>,
    down_proj: Linear,
    /// `[1, hidden]`: one gate logit per token.
    gate: Option<Linear>,
}

impl SharedExpert {
    /// Loads `{prefix}.{module}`'s projections and `{prefix}.{gate}`, by
    /// the names `ExpertsKind::shared_expert_names` gives.
    fn load(
        weights: &mut WeightMap,
        prefix: &str,
        hidden: i32,
        width: i32,
        kind: ExpertsKind,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let (module, gate_name) = kind.shared_expert_names();
        let mut linear = |name: &str, out: i32, inp: i32| {
            Linear::load(weights, &format!("{prefix}.{name}"), out, inp, quant, false)
        };
        let parts = [
            linear(&format!("{module}.gate_proj"), width, hidden)?,
            linear(&format!("{module}.up_proj"), width, hidden)?,
        ];
        let down_proj = linear(&format!("{module}.down_proj"), hidden, width)?;
        let gate = match gate_name {
            Some(name) => Some(linear(name, 1, hidden)?),
            None => None,
        };
        let gate_up = if super::decoder::join_projections() {
            JointProjection::join(parts)?
        } else {
            JointProjection::apart(parts)
        };
        Ok(Self {
            gate_up,
            down_proj,
            gate,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let [gate, up] = self.gate_up.forward(x)?;
        let y = self.down_proj.forward(&activation::swiglu(&gate, &up)?)?;
        match &self.gate {
            Some(gate) => ops::multiply(ops::sigmoid(gate.forward(x)?)?, &y),
            None => Ok(y),
        }
    }

    fn parameters(&self) -> u64 {
        self.gate_up.parameters()
            + self.down_proj.parameters()
            + self.gate.as_ref().map_or(0, Linear::parameters)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut out = self.gate_up.arrays();
        out.extend(self.down_proj.arrays());
        if let Some(gate) = &self.gate {
            out.extend(gate.arrays());
        }
        out
    }
}

impl SparseExperts {
    /// Loads the router and the stacked experts of the block at `prefix`
    /// (`ExpertsKind::block_prefix`), under the family's names (Qwen3-MoE:
    /// `{prefix}.gate` and `{prefix}.switch_mlp`; gpt-oss: `{prefix}.router`
    /// and `{prefix}.experts`; Gemma 4: `{prefix}.router.proj` with its
    /// scales and `{prefix}.experts.switch_glu`), the layout mlx-community
    /// checkpoints store. Per-expert tensors as transformers saves them
    /// (`{prefix}.experts.{e}.gate_proj.weight`, ..., or one
    /// `{prefix}.experts.gate_up_proj`) are stacked or split here first, as
    /// mlx-lm's loader does. `eps` is the model's RMSNorm epsilon.
    pub fn load(
        weights: &mut WeightMap,
        prefix: &str,
        hidden: i32,
        config: &ExpertsConfig,
        quant: Option<&QuantConfig>,
        eps: f32,
    ) -> Result<Self, LoadError> {
        let experts = config.num_experts;
        let inter = config.moe_intermediate_size;
        let (router_name, experts_name, biases) = config.kind.tensor_names();
        let switch = format!("{prefix}.{experts_name}");
        match config.kind {
            ExpertsKind::Qwen3Moe => {
                stack_per_expert_tensors(weights, prefix, &switch, experts)?;
                split_fused_expert_tensors(weights, prefix, &switch)?;
            }
            ExpertsKind::Glm4Moe { .. } => {
                stack_per_expert_tensors(weights, prefix, &switch, experts)?
            }
            ExpertsKind::Gemma4 => split_fused_expert_tensors(weights, prefix, &switch)?,
            ExpertsKind::GptOss { .. } => {}
        }
        let (router_norm, expert_scales) = if config.kind == ExpertsKind::Gemma4 {
            let scale = weights.take_float(&format!("{prefix}.router.scale"), &[hidden])?;
            let root =
                Array::from_f32(f64::from(hidden).powf(-0.5) as f32).as_dtype(scale.dtype())?;
            let norm = ops::multiply(&scale, &root)?;
            norm.eval()?;
            let scales =
                weights.take_float(&format!("{prefix}.router.per_expert_scale"), &[experts])?;
            (Some((norm, eps)), Some(scales))
        } else {
            (None, None)
        };
        let mut stacked = |name: &str, out: i32, inp: i32| {
            StackedLinear::load(
                weights,
                &format!("{switch}.{name}"),
                experts,
                out,
                inp,
                quant,
                biases,
            )
        };
        let gate_proj = stacked("gate_proj", inter, hidden)?;
        let up_proj = stacked("up_proj", inter, hidden)?;
        let down_proj = stacked("down_proj", hidden, inter)?;
        let shared = match config.shared_expert_intermediate_size {
            Some(width) => Some(Box::new(SharedExpert::load(
                weights,
                prefix,
                hidden,
                width,
                config.kind,
                quant,
            )?)),
            None => None,
        };
        let score_correction = match config.kind.score_correction() {
            Some(name) => {
                Some(weights.take_float(&format!("{prefix}.{router_name}.{name}"), &[experts])?)
            }
            None => None,
        };
        Ok(Self {
            router: Linear::load(
                weights,
                &format!("{prefix}.{router_name}"),
                experts,
                hidden,
                quant,
                biases,
            )?,
            router_norm,
            expert_scales,
            gate_proj,
            up_proj,
            down_proj,
            top_k: config.num_experts_per_tok,
            norm_topk_prob: config.norm_topk_prob,
            kind: config.kind,
            score_correction,
            shared,
        })
    }

    /// The block's output for `x` `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array, Exception> {
        self.forward_routed_by(x, x)
    }

    /// The experts' output for `x` `[B, L, hidden]`, routed by what the
    /// router makes of `routed` (Gemma 4 routes by the layer's input and
    /// gives the experts its own norm of it).
    pub fn forward_routed_by(&self, routed: &Array, x: &Array) -> Result<Array, Exception> {
        let k = self.top_k;
        let logits = match &self.router_norm {
            Some((weight, eps)) => {
                self.router
                    .forward(&mlx_rs::fast::rms_norm(routed, Some(weight), *eps)?)?
            }
            None => self.router.forward(routed)?,
        };
        // The k largest land in the last k places, in no particular order.
        let top_k = |values: &Array| -> Result<Array, Exception> {
            Ok(ops::argpartition_axis(values, -k, -1)?.index((Ellipsis, -k..)))
        };
        let (indices, scores) = match self.kind {
            ExpertsKind::Qwen3Moe => {
                let gates = ops::softmax_axis(&logits, -1, true)?;
                let indices = top_k(&gates)?;
                let mut scores = ops::indexing::take_along_axis(&gates, &indices, -1)?;
                if self.norm_topk_prob {
                    scores = ops::divide(&scores, ops::sum_axis(&scores, -1, true)?)?;
                }
                (indices, scores)
            }
            ExpertsKind::GptOss { .. } => {
                let indices = top_k(&logits)?;
                let chosen = ops::indexing::take_along_axis(&logits, &indices, -1)?;
                (indices, ops::softmax_axis(&chosen, -1, true)?)
            }
            ExpertsKind::Glm4Moe {
                groups,
                chosen_groups,
                routed_scaling_factor,
            } => self.choose_in_groups(&logits, groups, chosen_groups, routed_scaling_factor)?,
            // As gpt-oss, but the softmax as mlx-lm's Gemma 4 asks for it
            // (not `precise`), then each expert's own scale.
            ExpertsKind::Gemma4 => {
                let indices = top_k(&logits)?;
                let chosen = ops::indexing::take_along_axis(&logits, &indices, -1)?;
                let weights = ops::softmax_axis(&chosen, -1, false)?;
                let scores = match &self.expert_scales {
                    Some(scales) => {
                        ops::multiply(&weights, ops::indexing::take_axis(scales, &indices, 0)?)?
                    }
                    None => weights,
                };
                (indices, scores)
            }
        };
        let y = self.experts(x, &indices)?;
        let weighted = ops::multiply(&y, ops::expand_dims(&scores, -1)?)?;
        let sum = ops::sum_axis(&weighted, -2, false)?;
        let routed = match (self.kind, &self.shared) {
            // mlx-lm casts Qwen3-MoE's and GLM's sums back to the experts'
            // dtype and leaves gpt-oss's, and Qwen 3.5's beside a shared
            // expert, as the product made it.
            (ExpertsKind::Qwen3Moe, None) | (ExpertsKind::Glm4Moe { .. }, _) => {
                sum.as_dtype(y.dtype())?
            }
            _ => sum,
        };
        match &self.shared {
            Some(shared) => ops::add(&routed, &shared.forward(x)?),
            None => Ok(routed),
        }
    }

    /// GLM's choice of experts for the router's `logits`, and their
    /// weights (float32), with mlx-lm's `group_expert_select` operations in
    /// its order: sigmoid scores, corrected by the bias to choose; the
    /// groups outside the best `chosen_groups` (each scored by its two best
    /// corrected scores) zeroed; the top k of what remains; the uncorrected
    /// scores of those, rescaled to sum to one with `norm_topk_prob` (when
    /// k > 1), times `scaling`.
    fn choose_in_groups(
        &self,
        logits: &Array,
        groups: i32,
        chosen_groups: i32,
        scaling: f32,
    ) -> Result<(Array, Array), Exception> {
        let k = self.top_k;
        let scores = ops::sigmoid(logits.as_dtype(mlx_rs::Dtype::Float32)?)?;
        let mut corrected = match &self.score_correction {
            Some(bias) => ops::add(&scores, bias)?,
            None => scores.clone(),
        };
        let dropped = groups - chosen_groups;
        if groups > 1 && dropped > 0 {
            let grouped = ops::unflatten(&corrected, -1, &[groups, -1])?;
            let group_scores =
                ops::sum_axis(&ops::indexing::topk_axis(&grouped, 2, -1)?, -1, true)?;
            let worst = ops::argpartition_axis(&group_scores, dropped - 1, -2)?.index((
                Ellipsis,
                ..dropped,
                ..,
            ));
            let zeroed = grouped.put_along_axis(&worst, Array::from_f32(0.0), -2)?;
            corrected = ops::flatten(&zeroed, -2, -1)?;
        }
        let indices =
            ops::argpartition_axis(&ops::negative(&corrected)?, k - 1, -1)?.index((Ellipsis, ..k));
        let mut weights = ops::indexing::take_along_axis(&scores, &indices, -1)?;
        if k > 1 && self.norm_topk_prob {
            weights = ops::divide(&weights, ops::sum_axis(&weights, -1, true)?)?;
        }
        let weights = ops::multiply(&weights, Array::from_f32(scaling))?;
        Ok((indices, weights))
    }

    /// The experts' activation of `gate` and `up`.
    fn activation(&self, gate: &Array, up: &Array) -> Result<Array, Exception> {
        match self.kind {
            ExpertsKind::Qwen3Moe | ExpertsKind::Glm4Moe { .. } => activation::swiglu(gate, up),
            ExpertsKind::GptOss { swiglu_limit } => {
                activation::clamped_swiglu(gate, up, swiglu_limit)
            }
            ExpertsKind::Gemma4 => activation::geglu_approx_fused(gate, up),
        }
    }

    /// Each token through each of its experts: `[B, L, k, hidden]`.
    fn experts(&self, x: &Array, indices: &Array) -> Result<Array, Exception> {
        // `[B, L, 1, 1, hidden]`: one row per token, broadcast against its k
        // expert indices by the gather matmuls.
        let x = ops::expand_dims_axes(x, &[-2, -3])?;
        let index_shape = indices.shape().to_vec();
        if indices.size() < SORT_FROM_PAIRS {
            let up = self.up_proj.forward(&x, indices, false)?;
            let gate = self.gate_proj.forward(&x, indices, false)?;
            let y = self
                .down_proj
                .forward(&self.activation(&gate, &up)?, indices, false)?;
            return ops::squeeze_axes(&y, &[-2]);
        }
        // One row per (token, expert) pair, ordered by expert.
        let k = index_shape[index_shape.len() - 1];
        let flat = indices.flatten(None, None)?;
        let order = ops::argsort_axis(&flat, 0)?;
        let inverse = ops::argsort_axis(&order, 0)?;
        let token_of_pair = ops::floor_divide(&order, Array::from_slice(&[k as u32], &[]))?;
        let rows = ops::indexing::take_axis(&x.flatten(0, -3)?, &token_of_pair, 0)?;
        let sorted = ops::indexing::take_axis(&flat, &order, 0)?;
        let up = self.up_proj.forward(&rows, &sorted, true)?;
        let gate = self.gate_proj.forward(&rows, &sorted, true)?;
        let y = self
            .down_proj
            .forward(&self.activation(&gate, &up)?, &sorted, true)?;
        // Back to token order, `[B, L, k, 1, hidden]`.
        let y = ops::indexing::take_axis(&y, &inverse, 0)?;
        let mut shape = index_shape;
        shape.extend_from_slice(&y.shape()[1..]);
        ops::squeeze_axes(&y.reshape(&shape)?, &[-2])
    }

    /// Parameters of the router and of every expert.
    pub fn parameters(&self) -> u64 {
        let router_scales = self.router_norm.iter().map(|(norm, _)| norm);
        self.router.parameters()
            + router_scales
                .chain(&self.expert_scales)
                .map(|a| a.size() as u64)
                .sum::<u64>()
            + [&self.gate_proj, &self.up_proj, &self.down_proj]
                .iter()
                .map(|stacked| stacked.parameters())
                .sum::<u64>()
            + self.shared.as_ref().map_or(0, |shared| shared.parameters())
            + self
                .score_correction
                .as_ref()
                .map_or(0, |bias| bias.size() as u64)
    }

    /// Every array, for evaluation after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.router.arrays();
        out.extend(self.router_norm.iter().map(|(norm, _)| norm));
        out.extend(&self.expert_scales);
        for stacked in [&self.gate_proj, &self.up_proj, &self.down_proj] {
            out.extend(stacked.arrays());
        }
        if let Some(shared) = &self.shared {
            out.extend(shared.arrays());
        }
        out.extend(&self.score_correction);
        out
    }
}

/// Replaces the experts' tensors as transformers saves Qwen 3.5's,
/// `{prefix}.experts.gate_up_proj` `[E, 2 I, hidden]` (gate rows, then up)
/// and `{prefix}.experts.down_proj`, with `{switch}.{proj}.weight` each, as
/// mlx-lm's loader does.
fn split_fused_expert_tensors(
    weights: &mut WeightMap,
    prefix: &str,
    switch: &str,
) -> Result<(), LoadError> {
    let fused = format!("{prefix}.experts.gate_up_proj");
    if !weights.contains(&fused) {
        return Ok(());
    }
    let gate_up = weights.take_stored(&fused)?;
    let rows = gate_up.array.shape().get(1).copied().unwrap_or(0);
    let [gate, up] = <[Array; 2]>::try_from(gate_up.array.split_at_indices(&[rows / 2], 1)?)
        .map_err(|_| Exception::custom("a split in two gave another count"))?;
    weights.insert(
        format!("{switch}.gate_proj.weight"),
        gate,
        gate_up.file.clone(),
    );
    weights.insert(format!("{switch}.up_proj.weight"), up, gate_up.file);
    let down = weights.take_stored(&format!("{prefix}.experts.down_proj"))?;
    weights.insert(format!("{switch}.down_proj.weight"), down.array, down.file);
    Ok(())
}

/// Replaces per-expert tensors `{prefix}.experts.{e}.{proj}.weight` (and
/// their `.scales`/`.biases`) with one stacked `{switch}.{proj}.*` each, so a
/// checkpoint saved expert by expert loads like a stacked one.
fn stack_per_expert_tensors(
    weights: &mut WeightMap,
    prefix: &str,
    switch: &str,
    experts: i32,
) -> Result<(), LoadError> {
    for proj in ["gate_proj", "up_proj", "down_proj"] {
        for part in ["weight", "scales", "biases"] {
            if !weights.contains(&format!("{prefix}.experts.0.{proj}.{part}")) {
                continue;
            }
            let mut parts = Vec::with_capacity(usize::try_from(experts).unwrap_or(0));
            for e in 0..experts {
                parts.push(weights.take_stored(&format!("{prefix}.experts.{e}.{proj}.{part}"))?);
            }
            let arrays: Vec<&Array> = parts.iter().map(|p| &p.array).collect();
            let stacked = ops::stack(&arrays, 0)?;
            let file = parts.first().map(|p| p.file.clone()).unwrap_or_default();
            weights.insert(format!("{switch}.{proj}.{part}"), stacked, file);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(step: usize, mlp_only: Vec<usize>) -> ExpertsConfig {
        ExpertsConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 64,
            norm_topk_prob: true,
            decoder_sparse_step: step,
            mlp_only_layers: mlp_only,
            kind: ExpertsKind::default(),
            shared_expert_intermediate_size: None,
        }
    }

    #[test]
    fn sparse_layers_follow_the_step_and_the_dense_list() {
        let every = config(1, vec![]);
        assert!((0..4).all(|i| every.is_sparse(i)));
        let alternate = config(2, vec![3]);
        let sparse: Vec<usize> = (0..6).filter(|&i| alternate.is_sparse(i)).collect();
        assert_eq!(
            sparse,
            vec![1, 5],
            "odd layers, less the dense-only layer 3"
        );
        let none = ExpertsConfig {
            num_experts: 0,
            ..config(1, vec![])
        };
        assert!(!none.is_sparse(0));
    }
}
