//! The decoder every family shares: RMSNorm, grouped-query attention with
//! rope, a gated MLP. What differs between families is a field of
//! `family::ModelConfig`, filled in by each family's description: projection
//! biases, q/k norms, fused projections (phi3), norms that add one, scaled
//! embeddings and norms around both sublayers (gemma3), sliding-window
//! layers beside full ones, partial rotary dimensions, rope scaling
//! (llama3, linear, longrope, yarn, proportional), an attention output
//! gated by a sigmoid (Qwen 3.5), and Gemma 4's full layers with their own
//! heads (values that may be the keys), value norms, layers that attend
//! over an earlier layer's keys and values, layer scalars, routed experts
//! beside the dense MLP and soft-capped logits. Layers that mix positions
//! otherwise (LFM2's short convolutions, Qwen 3.5's gated DeltaNet) and
//! Gemma 4's per-layer inputs have their own files.

use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{Array, ops};

use super::activation;
use super::experts::SparseExperts;
use super::gated_delta::GatedDelta;
use super::per_layer_input::{PerLayerGate, PerLayerInputs};
use super::short_conv::ShortConv;
use super::{JointProjection, Linear, QuantConfig};
use crate::engine::LoadError;
use crate::engine::cache::{
    AttentionMask, CachedKv, ConvState, KvQuantization, LayerCache, RecurrentState,
    quantized_attention,
};
use crate::engine::distributed::Split;
use crate::engine::distributed::pipeline::Stage;
use crate::engine::distributed::tensor::{self, TensorShards};
use crate::engine::weights::WeightMap;
use crate::family::{Activation, ModelConfig, PositionQueryScale, RopeScaling};

/// Rotary position embedding over a head's first `dims` dimensions: a base
/// and a position scale, or precomputed frequencies (llama3, longrope,
/// yarn), and for longrope and yarn a scale applied to the rotated
/// dimensions first.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    /// Positions are multiplied by this (linear scaling: `1 / factor`).
    position_scale: f32,
    /// When set, `base` is unused.
    freqs: Option<Array>,
    /// Multiplies the rotated dimensions before rotating (longrope, yarn).
    input_scale: Option<InputScale>,
}

/// Rope's input scale, and that factor as a scalar of each dtype it has
/// been applied in: made once, where a scalar made per call is an array MLX
/// creates and casts (an AsType primitive) on every rope call of a step.
struct InputScale {
    factor: f32,
    scalars: std::sync::Mutex<Vec<(mlx_rs::Dtype, Array)>>,
}

impl InputScale {
    fn new(factor: f32) -> Self {
        Self {
            factor,
            scalars: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The factor as a scalar of `dtype` (so multiplying keeps x's dtype, as
    /// mlx-lm's Python float does).
    fn scalar(&self, dtype: mlx_rs::Dtype) -> Result<Array, Exception> {
        let mut made = self
            .scalars
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, scalar)) = made.iter().find(|(d, _)| *d == dtype) {
            return Ok(scalar.clone());
        }
        let scalar = Array::from_f32(self.factor).as_dtype(dtype)?;
        scalar.eval()?;
        made.push((dtype, scalar.clone()));
        Ok(scalar)
    }
}

impl Rope {
    /// The rope of `config`'s full-attention layers (`local: false`) or of
    /// its sliding-window layers, which use `local_rope_theta` unscaled
    /// when the family has one, turning each head's first `dims`
    /// dimensions.
    fn new(
        config: &ModelConfig,
        config_path: &Path,
        local: bool,
        dims: i32,
    ) -> Result<Self, LoadError> {
        let mut rope = Self {
            dims,
            traditional: config.rope_traditional,
            base: config.rope_theta,
            position_scale: 1.0,
            freqs: None,
            input_scale: None,
        };
        if local && let Some(base) = config.local_rope_theta {
            rope.base = base;
            return Ok(rope);
        }
        let Some(s) = &config.rope_scaling else {
            return Ok(rope);
        };
        let invalid = |message: String| LoadError::ConfigInvalid {
            path: config_path.to_owned(),
            message,
        };
        match s.kind() {
            // "default" and linear scaling with factor 1 are plain rope.
            Some("default") | None => {}
            Some("linear") => rope.position_scale = 1.0 / s.factor,
            Some("llama3") => rope.freqs = Some(llama3_freqs(dims, config.rope_theta, s)?),
            Some("longrope") | Some("su") => {
                let long = s
                    .long_factor
                    .as_ref()
                    .ok_or_else(|| invalid("rope_scaling `longrope` has no long_factor".into()))?;
                if long.len() as i32 != dims / 2 {
                    return Err(invalid(format!(
                        "rope_scaling long_factor has {} values; {} rotated dimensions need {}",
                        long.len(),
                        dims,
                        dims / 2
                    )));
                }
                let original = s.original_max_position_embeddings.unwrap_or(4096.0);
                let longest = config.max_position_embeddings.unwrap_or(131_072) as f32;
                let (freqs, scale) = longrope(dims, config.rope_theta, long, longest, original)?;
                rope.freqs = Some(freqs);
                rope.input_scale = Some(InputScale::new(scale));
            }
            Some("yarn") => {
                let (freqs, mscale) = yarn(dims, config.rope_theta, s)?;
                rope.freqs = Some(freqs);
                rope.input_scale = (mscale != 1.0).then(|| InputScale::new(mscale));
            }
            Some("proportional") => {
                let share = f64::from(s.partial_rotary_factor.unwrap_or(1.0));
                let turned = (f64::from(dims) * share) as i32;
                if !(0..=dims).contains(&turned) {
                    return Err(invalid(format!(
                        "rope_scaling `proportional` turns {turned} of {dims} dimensions"
                    )));
                }
                rope.freqs = Some(proportional_freqs(
                    dims,
                    turned,
                    config.rope_theta,
                    s.factor,
                )?);
            }
            Some(other) => {
                return Err(invalid(format!(
                    "rope_scaling type `{other}` is not supported yet"
                )));
            }
        }
        Ok(rope)
    }

    /// Rotates `x` for positions starting at `offset`: an int32 scalar
    /// array shared by every layer of a step (one upload per step, where an
    /// integer offset makes MLX create and upload a scalar per call, two per
    /// layer), or one offset per row of a batch.
    fn apply(&self, x: &Array, offset: &Array) -> Result<Array, Exception> {
        let scaled;
        let x = match &self.input_scale {
            None => x,
            Some(scale) => {
                scaled = scale_leading_dims(x, self.dims, &scale.scalar(x.dtype())?)?;
                &scaled
            }
        };
        match &self.freqs {
            Some(freqs) => {
                fast::rope_dynamic(x, self.dims, self.traditional, None, 1.0, offset, freqs)
            }
            None => fast::rope_dynamic(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.position_scale,
                offset,
                None,
            ),
        }
    }
}

/// `x` with its first `dims` features (last axis) multiplied by `factor`, a
/// scalar of x's dtype, the rest unchanged: what mlx-lm's
/// `x.at[..., :dims].multiply` computes.
fn scale_leading_dims(x: &Array, dims: i32, factor: &Array) -> Result<Array, Exception> {
    let width = x.shape().last().copied().unwrap_or(0);
    if dims >= width {
        return ops::multiply(x, factor);
    }
    let rank = x.ndim();
    let head = x.index((Ellipsis, ..dims));
    let tail = x.index((Ellipsis, dims..));
    ops::concatenate(&[ops::multiply(&head, factor)?, tail], rank as i32 - 1)
}

/// Frequencies `base^(2i/dims)` in f32, as mlx-lm computes them.
pub(super) fn base_freqs(dims: i32, base: f32) -> Result<Array, Exception> {
    let exponents = ops::divide(
        Array::arange::<_, f32>(0.0, dims as f32, 2.0)?,
        Array::from_f32(dims as f32),
    )?;
    ops::power(Array::from_f32(base), &exponents)
}

/// Gemma 4's proportional rope over `dims` dimensions: the first `turned`
/// of them turn at `factor * base^(2i/dims)` (the exponent over the whole
/// head, not over the turned part), the rest at an infinite wavelength,
/// which leaves them as they are; in f32 as mlx-lm computes them.
fn proportional_freqs(dims: i32, turned: i32, base: f32, factor: f32) -> Result<Array, Exception> {
    let exponents = ops::divide(
        Array::arange::<_, f32>(0.0, turned as f32, 2.0)?,
        Array::from_f32(dims as f32),
    )?;
    let freqs = ops::multiply(
        Array::from_f32(factor),
        ops::power(Array::from_f32(base), &exponents)?,
    )?;
    let still = ops::full::<f32>(&[(dims - turned) / 2], Array::from_f32(f32::INFINITY))?;
    let freqs = ops::concatenate(&[freqs, still], 0)?;
    freqs.eval()?;
    Ok(freqs)
}

/// longrope (Phi-3.5, Phi-4-mini): the base frequencies times the long
/// factors, and the rotated dimensions scaled by
/// `sqrt(1 + ln(longest / original) / ln(original))` when the model was
/// extended past its original context.
fn longrope(
    dims: i32,
    base: f32,
    long_factor: &[f32],
    longest: f32,
    original: f32,
) -> Result<(Array, f32), Exception> {
    let factors = Array::from_slice(long_factor, &[long_factor.len() as i32]);
    let freqs = ops::multiply(&factors, base_freqs(dims, base)?)?;
    freqs.eval()?;
    let factor = f64::from(longest) / f64::from(original);
    let scale = if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / f64::from(original).ln()).sqrt()
    };
    Ok((freqs, scale as f32))
}

/// yarn (gpt-oss): frequencies blended between interpolated and original
/// across the correction range, and the attention scale `mscale`.
fn yarn(dims: i32, base: f32, s: &RopeScaling) -> Result<(Array, f32), Exception> {
    let factor = f64::from(s.factor);
    let original = f64::from(s.original_max_position_embeddings.unwrap_or(4096.0));
    let beta_fast = f64::from(s.beta_fast.unwrap_or(32.0));
    let beta_slow = f64::from(s.beta_slow.unwrap_or(1.0));
    let base64 = f64::from(base);
    let correction_dim = |rotations: f64| {
        f64::from(dims) * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base64.ln())
    };
    let low = correction_dim(beta_fast).floor().max(0.0);
    let high = correction_dim(beta_slow).ceil().min(f64::from(dims - 1));
    let get_mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let mscale = get_mscale(factor, f64::from(s.mscale.unwrap_or(1.0)))
        / get_mscale(factor, f64::from(s.mscale_all_dim.unwrap_or(0.0)));
    let freq_extra = base_freqs(dims, base)?;
    let freq_inter = ops::multiply(Array::from_f32(s.factor), &freq_extra)?;
    let high = if low == high { high + 0.001 } else { high };
    let ramp = ops::divide(
        ops::subtract(
            Array::arange::<_, f32>(0.0, (dims / 2) as f32, 1.0)?,
            Array::from_f32(low as f32),
        )?,
        Array::from_f32((high - low) as f32),
    )?;
    let ramp = ops::clip(&ramp, (0.0f32, 1.0f32))?;
    let freq_mask = ops::subtract(Array::from_f32(1.0), &ramp)?;
    let numerator = ops::multiply(&freq_inter, &freq_extra)?;
    let denominator = ops::add(
        ops::multiply(&freq_inter, &freq_mask)?,
        ops::multiply(
            &freq_extra,
            ops::subtract(Array::from_f32(1.0), &freq_mask)?,
        )?,
    )?;
    let freqs = ops::divide(&numerator, &denominator)?;
    freqs.eval()?;
    Ok((freqs, mscale as f32))
}

/// Llama 3's scaled rope frequencies, computed with the same f32 operations
/// in the same order as mlx-lm so both runs rotate identically.
fn llama3_freqs(dims: i32, base: f32, s: &RopeScaling) -> Result<Array, Exception> {
    let low_freq_factor = s.low_freq_factor.unwrap_or(1.0);
    let high_freq_factor = s.high_freq_factor.unwrap_or(4.0);
    let old_context = s.original_max_position_embeddings.unwrap_or(8192.0);
    let low_freq_wavelen = old_context / low_freq_factor;
    let high_freq_wavelen = old_context / high_freq_factor;

    let exponents = ops::divide(Array::arange::<_, i32>(0, dims, 2)?, Array::from_int(dims))?;
    let freqs = ops::power(Array::from_f32(base), &exponents)?;
    let wavelens = ops::multiply(Array::from_f32(2.0 * std::f32::consts::PI), &freqs)?;
    let scaled = ops::multiply(&freqs, Array::from_f32(s.factor))?;
    let freqs = ops::select(
        &ops::gt(&wavelens, Array::from_f32(low_freq_wavelen))?,
        &scaled,
        &freqs,
    )?;
    let is_medium = ops::logical_and(
        &ops::gt(&wavelens, Array::from_f32(high_freq_wavelen))?,
        &ops::lt(&wavelens, Array::from_f32(low_freq_wavelen))?,
    )?;
    let smooth = ops::divide(
        ops::subtract(
            ops::divide(Array::from_f32(old_context), &wavelens)?,
            Array::from_f32(low_freq_factor),
        )?,
        Array::from_f32(high_freq_factor - low_freq_factor),
    )?;
    let denominator = ops::add(
        ops::divide(
            ops::subtract(Array::from_f32(1.0), &smooth)?,
            Array::from_f32(s.factor),
        )?,
        &smooth,
    )?;
    let smooth_freqs = ops::divide(&freqs, &denominator)?;
    let out = ops::select(&is_medium, &smooth_freqs, &freqs)?;
    out.eval()?;
    Ok(out)
}

/// An attention layer's projections of its input.
enum Projections {
    /// Queries, keys and values.
    Qkv(JointProjection<3>),
    /// Queries and keys; the values are the keys (Gemma 4's
    /// `attention_k_eq_v` layers).
    Qk(JointProjection<2>),
    /// Queries alone: the keys and values are an earlier layer's (Gemma
    /// 4's KV-shared layers).
    Q(Linear),
}

impl Projections {
    /// The layers a one-position input runs.
    fn decode_layers(&self) -> Vec<&Linear> {
        match self {
            Projections::Qkv(qkv) => qkv.decode_layers(),
            Projections::Qk(qk) => qk.decode_layers(),
            Projections::Q(q) => vec![q],
        }
    }

    fn parameters(&self) -> u64 {
        match self {
            Projections::Qkv(qkv) => qkv.parameters(),
            Projections::Qk(qk) => qk.parameters(),
            Projections::Q(q) => q.parameters(),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            Projections::Qkv(qkv) => qkv.arrays(),
            Projections::Qk(qk) => qk.arrays(),
            Projections::Q(q) => q.arrays(),
        }
    }
}

struct Attention {
    /// q, k and v (or fewer: `Projections`).
    proj: Projections,
    o_proj: Linear,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    /// Per-head RMSNorm weights of queries and keys (qwen3, gemma3).
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    eps: f32,
    /// Rotates this layer's queries and keys (a sliding-window layer may
    /// have its own base); `None` for a layer without rope (smollm3).
    rope: Option<Rope>,
    /// gpt-oss's per-head sink logits.
    sinks: Option<Array>,
    /// `q_proj` also gives a gate per output element, applied as a sigmoid
    /// to the attention's output (Qwen 3.5).
    output_gate: bool,
    /// Values RMS-normed without a scale (Gemma 4).
    value_norm: bool,
}

struct Mlp {
    /// gate and up.
    gate_up: JointProjection<2>,
    down_proj: Linear,
    activation: Activation,
}

/// A layer's feed-forward: one dense MLP, routed experts, or both side by
/// side.
enum FeedForward {
    Dense(Mlp),
    Experts(SparseExperts),
    Beside(Box<MlpBesideExperts>),
}

/// Gemma 4's feed-forward with experts: the dense MLP and the routed
/// experts side by side, each between norms of its own, their outputs
/// summed (the layer's pre- and post-feed-forward norms around both).
struct MlpBesideExperts {
    mlp: Mlp,
    /// After the dense MLP (`post_feedforward_layernorm_1`).
    mlp_post_norm: Array,
    experts: SparseExperts,
    /// Before and after the experts (`pre_feedforward_layernorm_2`,
    /// `post_feedforward_layernorm_2`); the router reads the layer's
    /// input as it is.
    experts_pre_norm: Array,
    experts_post_norm: Array,
}

impl MlpBesideExperts {
    /// The block's output for the residual stream `h` and `normed`, `h`
    /// through the layer's pre-feed-forward norm.
    fn forward(&self, h: &Array, normed: &Array, eps: f32) -> Result<Array, Exception> {
        let dense = self.mlp.forward(normed)?;
        let dense = fast::rms_norm(&dense, Some(&self.mlp_post_norm), eps)?;
        let routed_input = fast::rms_norm(h, Some(&self.experts_pre_norm), eps)?;
        let routed = self.experts.forward_routed_by(h, &routed_input)?;
        let routed = fast::rms_norm(&routed, Some(&self.experts_post_norm), eps)?;
        ops::add(&dense, &routed)
    }

    fn parameters(&self) -> u64 {
        let norms = [
            &self.mlp_post_norm,
            &self.experts_pre_norm,
            &self.experts_post_norm,
        ];
        self.mlp.gate_up.parameters()
            + self.mlp.down_proj.parameters()
            + self.experts.parameters()
            + norms.iter().map(|a| a.size() as u64).sum::<u64>()
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut out = self.mlp.arrays();
        out.extend(self.experts.arrays());
        out.extend([
            &self.mlp_post_norm,
            &self.experts_pre_norm,
            &self.experts_post_norm,
        ]);
        out
    }
}

/// What mixes positions in a layer: attention over the KV cache, or a
/// short convolution over its state (LFM2).
enum Mixer {
    Attention(Attention),
    ShortConv(ShortConv),
    GatedDelta(GatedDelta),
}

impl Mixer {
    /// The projection of the mixer's output back to the hidden size.
    fn out_proj(&self) -> &Linear {
        match self {
            Mixer::Attention(attn) => &attn.o_proj,
            Mixer::ShortConv(conv) => &conv.out_proj,
            Mixer::GatedDelta(delta) => &delta.out_proj,
        }
    }
}

struct Layer {
    input_layernorm: Array,
    mixer: Mixer,
    /// Before the MLP; with sandwich norms, applied to the attention's
    /// output instead (gemma's naming).
    post_attention_layernorm: Array,
    /// Gemma's norm before the MLP and after it.
    pre_feedforward_layernorm: Option<Array>,
    post_feedforward_layernorm: Option<Array>,
    mlp: FeedForward,
    /// The sliding window this layer attends over (its cache holds it),
    /// `None` for full attention.
    window: Option<i32>,
    /// The earlier layer whose keys and values this one attends over; it
    /// then keeps no cache (Gemma 4's KV-shared layers).
    kv_source: Option<usize>,
    /// A later layer attends over this one's keys and values.
    kv_read_later: bool,
    /// Gates this layer's slice of the per-layer inputs into its output
    /// (Gemma 4).
    per_layer_gate: Option<PerLayerGate>,
    /// Multiplies the layer's output (Gemma 4's `layer_scalar`, `[1]`).
    layer_scalar: Option<Array>,
}

/// A loaded decoder. The KV cache lives outside, one per layer that keeps
/// one (`make_cache`).
pub struct Decoder {
    embed_tokens: Linear,
    layers: Vec<Layer>,
    norm: Array,
    /// `None` when the head is tied to the embedding.
    lm_head: Option<Linear>,
    eps: f32,
    /// Multiplies the embeddings (gemma): rounded to bfloat16 as mlx-lm
    /// rounds it, in the model's float dtype.
    embed_scale: Option<Array>,
    /// Multiplies the queries by position (ministral3).
    query_scale: Option<PositionQueryScale>,
    /// Gemma 4's second embedding, a slice of it per layer.
    per_layer_inputs: Option<PerLayerInputs>,
    /// Logits are `tanh(x / c) * c`: `c`, and `c` in the model's float
    /// dtype.
    logit_softcap: Option<(f32, Array)>,
    /// A 3-D rope for image tokens (Qwen3-VL).
    mrope: Option<Mrope>,
    /// This rank's layers when the model is split across ranks (pipeline
    /// parallel): `layers` holds only those, from global index `first`.
    stage: Option<Stage>,
    /// This rank's share of every layer's heads and MLP width when the
    /// model is split by heads (tensor parallel): the output and down
    /// projections' products are summed across the ranks.
    tensor: Option<TensorShards>,
}

/// The names of the tensors in `w` that start with `prefix`.
fn names_starting_with(w: &WeightMap, prefix: &str) -> Vec<String> {
    w.tensors
        .keys()
        .filter(|k| k.starts_with(prefix))
        .cloned()
        .collect()
}

/// A norm scale as the layers apply it: gemma stores `w - 1`.
pub(super) fn norm_scale(weight: Array, adds_one: bool) -> Result<Array, LoadError> {
    if !adds_one {
        return Ok(weight);
    }
    let one = Array::from_f32(1.0).as_dtype(weight.dtype())?;
    Ok(ops::add(&one, &weight)?)
}

/// An image's rows in a prefill chunk: from position `at` (counted from
/// the chunk's first token) on, `rows` `[1, n, hidden]` take the place of
/// the image tokens' embeddings, and `deepstack[j]` `[1, n, hidden]` is
/// added to their hidden states after text layer `j` (Qwen3-VL).
pub struct ImageInsert {
    pub at: i32,
    pub rows: Array,
    pub deepstack: Vec<Array>,
}

/// What a prompt's images bring to one prefill chunk.
#[derive(Default)]
pub struct ChunkImages {
    pub inserts: Vec<ImageInsert>,
    /// A 3-D rope's time, row and column positions `[3, length]` of the
    /// chunk's tokens, where an image token lies among them.
    pub positions: Option<Array>,
    /// Otherwise added to the cache's position: what the images before
    /// the chunk saved of a 3-D rope's positions.
    pub shift: i32,
    /// The prompt has images and the model a 3-D rope: the prefill turns
    /// its text by angles too, as the reference does for such a prompt
    /// (a prompt of text alone turns through the fused kernel, as a text
    /// model's).
    pub rope_3d: bool,
}

impl ChunkImages {
    /// No images, positions shifted by `shift` (decoding after images).
    pub fn shifted(shift: i32) -> Self {
        Self {
            shift,
            ..Self::default()
        }
    }
}

/// Where the rope turns a step's tokens.
pub(crate) enum RopeAt {
    /// From this position (an int32 scalar), or one per batch row.
    Offset(Array),
    /// By these angles' cosines and sines `[1, 1, length, dims]`, in the
    /// model's dtype (a 3-D rope).
    Angles { cos: Array, sin: Array },
}

/// `x` `[B, H, L, D]` with its first `dims` features turned by `cos` and
/// `sin` (rotate-half pairing), the rest as they are.
fn rotate_by_angles(x: &Array, cos: &Array, sin: &Array, dims: i32) -> Result<Array, Exception> {
    let head = x.shape()[3];
    let turned = if dims < head {
        x.index((.., .., .., ..dims))
    } else {
        x.clone()
    };
    let half = dims / 2;
    let swapped = ops::concatenate(
        &[
            ops::negative(turned.index((.., .., .., half..)))?,
            turned.index((.., .., .., ..half)),
        ],
        -1,
    )?;
    let out = ops::add(
        &ops::multiply(&turned, cos)?,
        &ops::multiply(&swapped, sin)?,
    )?;
    if dims < head {
        ops::concatenate(&[out, x.index((.., .., .., dims..))], -1)
    } else {
        Ok(out)
    }
}

/// `h` `[B, L, hidden]` with each `(at, rows [1, n, hidden])` spliced in at
/// positions `at..at + n` as `combine(old, rows)` (the old rows those
/// positions had), in order and without overlap.
fn splice_rows(
    h: &Array,
    rows: &[(i32, Array)],
    combine: impl Fn(&Array, &Array) -> Result<Array, Exception>,
) -> Result<Array, Exception> {
    let length = h.shape()[1];
    let mut pieces = Vec::with_capacity(2 * rows.len() + 1);
    let mut at = 0;
    for (position, new) in rows {
        let count = new.shape()[1];
        if *position < at || position + count > length {
            return Err(Exception::custom(format!(
                "{count} image rows at {position} do not fit {length} positions"
            )));
        }
        if *position > at {
            pieces.push(h.index((.., at..*position, ..)));
        }
        pieces.push(combine(
            &h.index((.., *position..position + count, ..)),
            new,
        )?);
        at = position + count;
    }
    if at < length {
        pieces.push(h.index((.., at.., ..)));
    }
    ops::concatenate(&pieces, 1)
}

/// A 3-D rope (Qwen3-VL's): each rotated frequency turns with the
/// position on one axis, time, row or column, interleaved.
struct Mrope {
    /// The axis (0 time, 1 row, 2 column) of each frequency.
    axis: Vec<usize>,
    /// `1 / base^(2i / dims)`, float32.
    inverse: Array,
}

impl Mrope {
    fn new(section: [usize; 3], dims: i32, base: f32) -> Result<Self, Exception> {
        let frequencies = (dims / 2) as usize;
        // Frequency 1, 4, 7, ... turns with the row and 2, 5, 8, ... with
        // the column, as far as each axis's share goes; the rest with time.
        let mut axis = vec![0usize; frequencies];
        for (a, offset) in [(1usize, 1usize), (2, 2)] {
            let mut f = offset;
            while f < (section[a] * 3).min(frequencies) {
                axis[f] = a;
                f += 3;
            }
        }
        // What turns a position into an angle: `1 / base^(2i / dims)`.
        let inverse = ops::divide(Array::from_f32(1.0), base_freqs(dims, base)?)?;
        Ok(Self { axis, inverse })
    }

    /// The cosines and sines for `positions` `[3, L]` (int32), in `dtype`.
    fn angles(&self, positions: &Array, dtype: mlx_rs::Dtype) -> Result<RopeAt, Exception> {
        let length = positions.shape()[1];
        let axis: Vec<i32> = self.axis.iter().map(|&a| a as i32).collect();
        let chosen = positions
            .take_axis(Array::from_slice(&axis, &[axis.len() as i32]), 0)?
            .transpose_axes(&[1, 0])?
            .as_type::<f32>()?;
        let angles = ops::multiply(&chosen, &self.inverse)?;
        let angles = ops::concatenate(&[&angles, &angles], -1)?.reshape(&[1, 1, length, -1])?;
        Ok(RopeAt::Angles {
            cos: ops::cos(&angles)?.as_dtype(dtype)?,
            sin: ops::sin(&angles)?.as_dtype(dtype)?,
        })
    }
}

impl Decoder {
    /// Builds the model from a config and takes exactly its tensors from
    /// `weights` (anything left over is an error).
    pub fn load(
        config: &ModelConfig,
        config_path: &Path,
        weights: WeightMap,
    ) -> Result<Self, LoadError> {
        Self::load_split(config, config_path, weights, None)
    }

    /// `load`, keeping only this rank's part of a model split over ranks:
    /// a pipeline stage's layers (the others' weights are never read: MLX
    /// reads a tensor from its file when it is first evaluated), or a
    /// tensor shard's slice of every layer.
    pub fn load_split(
        config: &ModelConfig,
        config_path: &Path,
        mut weights: WeightMap,
        split: Option<Split>,
    ) -> Result<Self, LoadError> {
        let (stage, tensor) = match split {
            Some(Split::Pipeline(stage)) => (Some(stage), None),
            Some(Split::Tensor(shards)) => (None, Some(shards)),
            None => (None, None),
        };
        // A tensor shard's layers have its share of the heads and width.
        let sharded;
        let whole = config;
        let config = match &tensor {
            Some(shards) => {
                sharded = tensor::shard_config(config, shards.size());
                &sharded
            }
            None => config,
        };
        let first = stage.as_ref().map_or(0, |s| s.first);
        let quant = config.quantization.as_ref();
        let hidden = config.hidden_size;
        let heads = config.num_attention_heads;
        let adds_one = config.norms_add_one;
        let root = config.weight_prefix.as_str();
        let w = &mut weights;
        for (from, to) in &config.renamed_prefixes {
            for k in names_starting_with(w, from) {
                if let Some(tensor) = w.tensors.remove(&k) {
                    w.tensors
                        .insert(format!("{to}{}", &k[from.len()..]), tensor);
                }
            }
        }
        for prefix in &config.skipped_prefixes {
            for k in names_starting_with(w, prefix) {
                w.discard(&k);
            }
        }
        if config.gated_delta.is_some() {
            super::gated_delta::read_transformers_layout(w)?;
        }
        if let Some(shards) = &tensor {
            tensor::shard_weights(w, whole, root, shards.rank(), shards.size())?;
        }
        let embed_tokens = Linear::load(
            w,
            &format!("{root}.embed_tokens"),
            config.vocab_size,
            hidden,
            quant,
            false,
        )?;
        let per_layer_inputs = match &config.per_layer_input {
            Some(per_layer) => Some(PerLayerInputs::load(w, config, per_layer, quant)?),
            None => None,
        };
        let norm = |w: &mut WeightMap, name: String, size: i32| -> Result<Array, LoadError> {
            norm_scale(w.take_float(&name, &[size])?, adds_one)
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        let join = join_projections();
        let sources: Vec<usize> = (0..config.num_hidden_layers)
            .filter_map(|i| config.kv_source(i))
            .collect();
        for i in 0..config.num_hidden_layers {
            let p = format!("{root}.layers.{i}");
            if stage.as_ref().is_some_and(|s| !s.owns(i)) {
                for k in names_starting_with(w, &format!("{p}.")) {
                    w.discard(&k);
                }
                continue;
            }
            let (qkv_bias, o_bias) = (config.qkv_bias, config.o_bias);
            let names = config.names;
            let (kv_heads, head_dim) = (config.kv_heads_of(i), config.head_dim_of(i));
            let shares_kv = config.shares_kv(i);
            let kv_source = config.kv_source(i);
            if let Some(source) = kv_source
                && source < first
            {
                return Err(LoadError::ConfigInvalid {
                    path: config_path.to_owned(),
                    message: format!(
                        "layer {i} reads layer {source}'s keys and values, which another rank \
                         holds when the model is split there: run it on fewer ranks"
                    ),
                });
            }
            // Within this rank's layers, counted from its first.
            let kv_source = kv_source.map(|source| source - first);
            if shares_kv && kv_source.is_none() {
                return Err(LoadError::ConfigInvalid {
                    path: config_path.to_owned(),
                    message: format!(
                        "layer {i} reads an earlier layer's keys and values, but no earlier layer of its kind computes any"
                    ),
                });
            }
            if shares_kv {
                // transformers checkpoints keep these layers' own keys'
                // and values' projections and norm, which nothing reads
                // (mlx-lm drops them too).
                for part in ["k_proj.", "v_proj.", "k_norm."] {
                    for k in names_starting_with(w, &format!("{p}.self_attn.{part}")) {
                        w.discard(&k);
                    }
                }
            }
            let input_layernorm = norm(w, format!("{p}.{}.weight", names.input_norm), hidden)?;
            let (q_norm, k_norm) = if config.qk_norm && config.attends(i) {
                let q_norm = norm(
                    w,
                    format!("{p}.self_attn.{}.weight", names.q_norm),
                    head_dim,
                )?;
                let k_norm = if shares_kv {
                    None
                } else {
                    Some(norm(
                        w,
                        format!("{p}.self_attn.{}.weight", names.k_norm),
                        head_dim,
                    )?)
                };
                (Some(q_norm), k_norm)
            } else {
                (None, None)
            };
            let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
            // A gated attention's `q_proj` gives the gate beside each query.
            let q_proj_width = if config.attention_output_gate {
                2 * q_width
            } else {
                q_width
            };
            let short_conv = config
                .short_conv
                .as_ref()
                .filter(|_| config.is_conv_layer(i));
            let gated_delta = config
                .gated_delta
                .as_ref()
                .filter(|_| config.is_delta_layer(i));
            let proj = match config.attends(i) {
                false => None,
                true if config.fused_projections => Some(Projections::Qkv(JointProjection::split(
                    Linear::load(
                        w,
                        &format!("{p}.self_attn.qkv_proj"),
                        q_width + 2 * kv_width,
                        hidden,
                        quant,
                        qkv_bias,
                    )?,
                    [q_width, kv_width, kv_width],
                )?)),
                true => {
                    let mut proj = |name: &str, out: i32| {
                        Linear::load(
                            w,
                            &format!("{p}.self_attn.{name}"),
                            out,
                            hidden,
                            quant,
                            qkv_bias,
                        )
                    };
                    let q = proj("q_proj", q_proj_width)?;
                    Some(if shares_kv {
                        Projections::Q(q)
                    } else if config.values_are_keys(i) {
                        let parts = [q, proj("k_proj", kv_width)?];
                        Projections::Qk(if join {
                            JointProjection::join(parts)?
                        } else {
                            JointProjection::apart(parts)
                        })
                    } else {
                        let parts = [q, proj("k_proj", kv_width)?, proj("v_proj", kv_width)?];
                        Projections::Qkv(if join {
                            JointProjection::join(parts)?
                        } else {
                            JointProjection::apart(parts)
                        })
                    })
                }
            };
            let inter = config.intermediate_size_of(i);
            let mlp = match &config.experts {
                Some(experts) if experts.is_sparse(i) => {
                    let block = experts.kind.block_prefix(&p);
                    let routed = SparseExperts::load(
                        w,
                        &block,
                        hidden,
                        experts,
                        quant,
                        config.rms_norm_eps,
                    )?;
                    if experts.kind.beside_dense_mlp() {
                        FeedForward::Beside(Box::new(MlpBesideExperts {
                            mlp: Mlp::load(w, &p, config, inter, quant, join)?,
                            mlp_post_norm: norm(
                                w,
                                format!("{p}.post_feedforward_layernorm_1.weight"),
                                hidden,
                            )?,
                            experts: routed,
                            experts_pre_norm: norm(
                                w,
                                format!("{p}.pre_feedforward_layernorm_2.weight"),
                                hidden,
                            )?,
                            experts_post_norm: norm(
                                w,
                                format!("{p}.post_feedforward_layernorm_2.weight"),
                                hidden,
                            )?,
                        }))
                    } else {
                        FeedForward::Experts(routed)
                    }
                }
                _ => FeedForward::Dense(Mlp::load(w, &p, config, inter, quant, join)?),
            };
            let window = config.window_of(i);
            let sinks = if config.attention_sinks {
                Some(w.take_float(&format!("{p}.self_attn.sinks"), &[heads])?)
            } else {
                None
            };
            let (pre_feedforward_layernorm, post_feedforward_layernorm) = if config.sandwich_norms {
                (
                    Some(norm(
                        w,
                        format!("{p}.pre_feedforward_layernorm.weight"),
                        hidden,
                    )?),
                    Some(norm(
                        w,
                        format!("{p}.post_feedforward_layernorm.weight"),
                        hidden,
                    )?),
                )
            } else {
                (None, None)
            };
            let mixer = match (short_conv, gated_delta, proj) {
                (Some(conv), _, _) => {
                    Mixer::ShortConv(ShortConv::load(w, &p, hidden, conv, quant)?)
                }
                (None, Some(delta), _) => Mixer::GatedDelta(GatedDelta::load(
                    w,
                    &p,
                    hidden,
                    delta,
                    config.rms_norm_eps,
                    quant,
                    join,
                )?),
                (None, None, Some(proj)) => Mixer::Attention(Attention {
                    proj,
                    o_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.{}", names.o_proj),
                        hidden,
                        heads * head_dim,
                        quant,
                        o_bias,
                    )?,
                    heads,
                    kv_heads,
                    head_dim,
                    scale: config.attention_scale,
                    q_norm,
                    k_norm,
                    eps: config.rms_norm_eps,
                    rope: if config.uses_rope(i) {
                        Some(Rope::new(
                            config,
                            config_path,
                            window.is_some(),
                            config.rotary_dims_of(i),
                        )?)
                    } else {
                        None
                    },
                    sinks,
                    output_gate: config.attention_output_gate,
                    value_norm: config.value_norm,
                }),
                (None, None, None) => {
                    return Err(LoadError::ConfigInvalid {
                        path: config_path.to_owned(),
                        message: format!("layer {i} is neither attention nor a convolution"),
                    });
                }
            };
            let per_layer_gate = match &config.per_layer_input {
                Some(per_layer) => Some(PerLayerGate::load(w, &p, config, per_layer, quant)?),
                None => None,
            };
            let layer_scalar = if config.layer_scalar {
                Some(w.take_float(&format!("{p}.layer_scalar"), &[1])?)
            } else {
                None
            };
            layers.push(Layer {
                input_layernorm,
                mixer,
                post_attention_layernorm: norm(
                    w,
                    format!("{p}.{}.weight", names.mlp_norm),
                    hidden,
                )?,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
                mlp,
                window,
                kv_source,
                kv_read_later: sources.contains(&i),
                per_layer_gate,
                layer_scalar,
            });
        }
        let final_norm = norm(
            w,
            format!("{root}.{}.weight", config.names.final_norm),
            hidden,
        )?;
        let head = config.head_prefix.as_str();
        // Gemma's head is tied exactly when the checkpoint has none, as
        // mlx-lm decides; the other families say so in config.json.
        let tied = if config.tie_when_no_head {
            !w.contains(&format!("{head}.weight")) && !w.contains(&format!("{head}.scales"))
        } else {
            config.tie_word_embeddings
        };
        let lm_head = if tied {
            // Some exports keep a copy of the tied head; mlx-lm drops it too.
            w.discard(&format!("{head}.weight"));
            None
        } else {
            Some(Linear::load(
                w,
                head,
                config.vocab_size,
                hidden,
                quant,
                false,
            )?)
        };
        // Precomputed rope tables that some exports carry are not weights.
        let rotary: Vec<String> = w
            .tensors
            .keys()
            .filter(|k| k.contains("rotary_emb.inv_freq"))
            .cloned()
            .collect();
        for k in rotary {
            w.discard(&k);
        }
        weights.finish(&config.model_type)?;
        let float_dtype = final_norm.dtype();
        let in_float_dtype = |value: f32| -> Result<Array, Exception> {
            let scalar = Array::from_f32(value).as_dtype(float_dtype)?;
            scalar.eval()?;
            Ok(scalar)
        };
        let embed_scale = config.embed_scale.map(in_float_dtype).transpose()?;
        let logit_softcap = match config.final_logit_softcapping {
            Some(cap) => Some((cap, in_float_dtype(cap)?)),
            None => None,
        };
        let decoder = Self {
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            eps: config.rms_norm_eps,
            embed_scale,
            query_scale: config.query_scale,
            per_layer_inputs,
            logit_softcap,
            mrope: match config.mrope_section {
                Some(section) => {
                    let mrope = Mrope::new(section, config.rotary_dims, config.rope_theta)?;
                    mrope.inverse.eval()?;
                    Some(mrope)
                }
                None => None,
            },
            stage,
            tensor,
        };
        decoder.prepare_decode();
        Ok(decoder)
    }

    /// The matrices a one-position step multiplies by: each layer's joined
    /// projections (or their parts), output projection and down projection,
    /// and the head.
    fn decode_matrices(&self) -> Vec<(&Linear, bool)> {
        let mut matrices = Vec::new();
        for layer in &self.layers {
            // Without norms after the sublayers, the output projection and
            // the MLP's down projection feed a residual add directly
            // (`Layer::finish`).
            let adds_residual = layer.pre_feedforward_layernorm.is_none();
            let mixing = match &layer.mixer {
                Mixer::Attention(attn) => attn.proj.decode_layers(),
                Mixer::ShortConv(conv) => conv.decode_layers(),
                Mixer::GatedDelta(delta) => delta.decode_layers(),
            };
            matrices.extend(mixing.into_iter().map(|m| (m, false)));
            matrices.push((layer.mixer.out_proj(), adds_residual));
            let dense = match &layer.mlp {
                FeedForward::Dense(mlp) => Some(mlp),
                FeedForward::Beside(block) => Some(&block.mlp),
                FeedForward::Experts(_) => None,
            };
            if let Some(mlp) = dense {
                matrices.extend(mlp.gate_up.decode_layers().into_iter().map(|m| (m, false)));
                matrices.push((&mlp.down_proj, adds_residual));
            }
            if let Some(gate) = &layer.per_layer_gate {
                matrices.extend(gate.decode_layers().into_iter().map(|m| (m, false)));
            }
        }
        matrices.push((self.lm_head.as_ref().unwrap_or(&self.embed_tokens), false));
        matrices
    }

    /// Readies, at load, a backend's kernels for the matrices of a decode
    /// step (`backend::prepare`; on CUDA that compiles Ondo's kernel, seconds
    /// of NVRTC), so the cost is counted in the load, where a cold start
    /// expects it, and not in the first answer.
    fn prepare_decode(&self) {
        crate::engine::backend::prepare(
            self.decode_matrices()
                .into_iter()
                .filter_map(|(matrix, adds_residual)| Some((matrix.affine()?, adds_residual))),
        );
    }

    /// This rank's part when the model is split across ranks.
    pub fn stage(&self) -> Option<&Stage> {
        self.stage.as_ref()
    }

    /// The ranks this model is split over, when it is.
    pub fn split_group(&self) -> Option<&crate::engine::distributed::Group> {
        match (&self.stage, &self.tensor) {
            (Some(stage), _) => Some(stage.group()),
            (None, Some(shards)) => Some(shards.group()),
            (None, None) => None,
        }
    }

    /// The hidden states this rank sent on and nothing here reads, built
    /// since the last call: evaluate it where only the caches are.
    pub fn take_sent(&self) -> Option<Array> {
        self.stage.as_ref().and_then(Stage::take_sent)
    }

    /// The dtype of the norm weights: the model's compute dtype.
    pub fn float_dtype(&self) -> String {
        format!("{:?}", self.norm.dtype()).to_lowercase()
    }

    /// One empty cache per layer that keeps one (a layer that reads an
    /// earlier layer's keys and values keeps none): a sliding-window
    /// layer's rotates at its window (keeping no leading tokens, as mlx-lm
    /// does); a full layer's grows, or rotates at `max_kv_size` positions
    /// keeping the first `ROTATING_KEEP` tokens; a convolution layer's is
    /// its state. A full layer's growing cache is quantized by `quantize`
    /// once it holds `quantize.start` positions (windowed and rotating
    /// caches stay in floats, as in mlx-lm).
    pub fn make_cache(
        &self,
        max_kv_size: Option<usize>,
        quantize: Option<KvQuantization>,
    ) -> Vec<LayerCache> {
        self.layers
            .iter()
            .filter(|layer| layer.kv_source.is_none())
            .map(|layer| match (&layer.mixer, layer.window) {
                (Mixer::ShortConv(conv), _) => LayerCache::Conv(ConvState::new(conv.kernel())),
                (Mixer::GatedDelta(delta), _) => {
                    LayerCache::Recurrent(RecurrentState::new(delta.conv_kernel()))
                }
                (Mixer::Attention(_), Some(window)) => LayerCache::window(window),
                (Mixer::Attention(_), None) => LayerCache::attention(max_kv_size, quantize),
            })
            .collect()
    }

    /// Parameters as loaded: every matrix's elements before packing, norms,
    /// biases and sinks (a quantized matrix's scales and biases not counted).
    pub fn parameters(&self) -> u64 {
        let size = |a: &Array| a.size() as u64;
        let mut total = self.embed_tokens.parameters() + size(&self.norm);
        total += self.lm_head.as_ref().map_or(0, Linear::parameters);
        for layer in &self.layers {
            total += size(&layer.input_layernorm) + size(&layer.post_attention_layernorm);
            total += layer
                .pre_feedforward_layernorm
                .iter()
                .map(size)
                .sum::<u64>();
            total += layer
                .post_feedforward_layernorm
                .iter()
                .map(size)
                .sum::<u64>();
            total += match &layer.mixer {
                Mixer::Attention(attn) => {
                    attn.proj.parameters()
                        + attn.o_proj.parameters()
                        + [&attn.q_norm, &attn.k_norm, &attn.sinks]
                            .into_iter()
                            .flatten()
                            .map(size)
                            .sum::<u64>()
                }
                Mixer::ShortConv(conv) => conv.parameters(),
                Mixer::GatedDelta(delta) => delta.parameters(),
            };
            total += match &layer.mlp {
                FeedForward::Dense(mlp) => mlp.gate_up.parameters() + mlp.down_proj.parameters(),
                FeedForward::Experts(experts) => experts.parameters(),
                FeedForward::Beside(block) => block.parameters(),
            };
            total += layer
                .per_layer_gate
                .as_ref()
                .map_or(0, PerLayerGate::parameters);
            total += layer.layer_scalar.iter().map(size).sum::<u64>();
        }
        total += self
            .per_layer_inputs
            .as_ref()
            .map_or(0, PerLayerInputs::parameters);
        total
    }

    /// Each layer's sliding window as its cache is made (`None`: the layer
    /// attends to everything, or keeps no KV cache), and the elements one
    /// position adds to its cache (a key and a value vector per KV head;
    /// none for a convolution layer, whose state is constant, or for a
    /// layer that reads an earlier layer's keys and values).
    pub fn layer_caches(&self) -> Vec<(Option<i32>, u64)> {
        self.layers
            .iter()
            .map(|layer| match &layer.mixer {
                Mixer::Attention(attn) if layer.kv_source.is_none() => (
                    layer.window,
                    2 * attn.kv_heads.max(0) as u64 * attn.head_dim.max(0) as u64,
                ),
                Mixer::Attention(_) | Mixer::ShortConv(_) | Mixer::GatedDelta(_) => (None, 0),
            })
            .collect()
    }

    /// The attention layers whose cache grows (no window, their own keys
    /// and values): the layers a quantized KV cache quantizes.
    fn growing_attention(&self) -> impl Iterator<Item = &Attention> {
        self.layers.iter().filter_map(|layer| match &layer.mixer {
            Mixer::Attention(attn) if layer.kv_source.is_none() && layer.window.is_none() => {
                Some(attn)
            }
            _ => None,
        })
    }

    /// The head dimension of each layer a quantized KV cache quantizes.
    pub fn growing_head_dims(&self) -> Vec<i32> {
        self.growing_attention().map(|attn| attn.head_dim).collect()
    }

    /// Whether a layer a quantized KV cache quantizes has attention sinks
    /// (which attention over a quantized cache does not take).
    pub fn growing_attention_has_sinks(&self) -> bool {
        self.growing_attention().any(|attn| attn.sinks.is_some())
    }

    /// Every weight array, to evaluate (make resident) after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed_tokens.arrays();
        for layer in &self.layers {
            out.push(&layer.input_layernorm);
            out.push(&layer.post_attention_layernorm);
            out.extend(layer.pre_feedforward_layernorm.iter());
            out.extend(layer.post_feedforward_layernorm.iter());
            match &layer.mixer {
                Mixer::Attention(attn) => {
                    out.extend(attn.q_norm.iter());
                    out.extend(attn.k_norm.iter());
                    out.extend(attn.sinks.iter());
                    out.extend(attn.proj.arrays());
                    out.extend(attn.o_proj.arrays());
                }
                Mixer::ShortConv(conv) => out.extend(conv.arrays()),
                Mixer::GatedDelta(delta) => out.extend(delta.arrays()),
            }
            out.extend(layer.mlp.arrays());
            if let Some(gate) = &layer.per_layer_gate {
                out.extend(gate.arrays());
            }
            out.extend(layer.layer_scalar.iter());
        }
        if let Some(per_layer) = &self.per_layer_inputs {
            out.extend(per_layer.arrays());
        }
        out.push(&self.norm);
        if let Some(head) = &self.lm_head {
            out.extend(head.arrays());
        }
        out
    }

    /// Hidden states of the last layer (after the final norm) for `tokens`
    /// `[batch, length]`, extending `cache` (one per layer that keeps one,
    /// in order: `make_cache`) by `length` positions.
    pub fn hidden(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array, Exception> {
        self.hidden_with(tokens, &ChunkImages::default(), cache)
    }

    /// `hidden`, with what a prompt's images bring to these tokens
    /// (`ChunkImages`): embeddings in place of the image tokens', rows
    /// DeepStack adds after the first layers, and a 3-D rope's positions.
    pub fn hidden_with(
        &self,
        tokens: &Array,
        images: &ChunkImages,
        cache: &mut [LayerCache],
    ) -> Result<Array, Exception> {
        let length = tokens.shape()[1];
        self.check_cache_count(cache)?;
        // Layers of one kind (full, or one window size) hold the same
        // positions, so one mask serves each kind: made from the first
        // cache of that kind.
        let masks = self.masks(cache, |kv| kv.mask(length))?;
        // Every layer has seen the same tokens, so one rope offset serves
        // them all: one scalar per step.
        let position = cache.first().map_or(0, LayerCache::offset);
        if let Some(kv) = cache.iter().find(|kv| kv.offset() != position) {
            return Err(Exception::custom(format!(
                "the layers' caches are out of step: {} and {position} positions",
                kv.offset()
            )));
        }
        let h = self.embed_with(tokens, &images.inserts)?;
        let shifted = position + images.shift;
        // A 3-D rope turns a prompt's chunk by its angles, as the reference
        // does (text turns all three axes alike); a decode step by its
        // shifted position, the same angles through the fused kernel.
        let offset = match (&self.mrope, &images.positions) {
            (Some(mrope), Some(positions)) => mrope.angles(positions, h.dtype())?,
            (Some(mrope), None) if images.rope_3d && length > 1 => {
                let row = Array::arange::<_, i32>(shifted, shifted + length, 1)?;
                let positions = ops::broadcast_to(&row.reshape(&[1, length])?, &[3, length])?;
                mrope.angles(&positions, h.dtype())?
            }
            _ => RopeAt::Offset(Array::from_int(shifted)),
        };
        let query_scale = match &self.query_scale {
            Some(scale) => position_query_scale(scale, length, position, h.dtype())?,
            None => None,
        };
        self.run_layers(
            tokens,
            h,
            cache,
            &offset,
            &masks,
            query_scale.as_ref(),
            &images.inserts,
        )
    }

    /// Hidden states of the last layer for one new token per row of a
    /// batched cache (`tokens` `[B, 1]`), row `r` at its own position
    /// `positions[r]` (the tokens it has seen), extending every row by one
    /// position. The batched KV layers' masks hide each row's padding; a
    /// layer that reads an earlier layer's keys and values reads that
    /// layer's batched ones, under the same mask.
    pub fn hidden_rows(
        &self,
        tokens: &Array,
        positions: &[i32],
        cache: &mut [LayerCache],
    ) -> Result<Array, Exception> {
        let shape = tokens.shape();
        if shape.len() != 2 || shape[1] != 1 || shape[0] as usize != positions.len() {
            return Err(Exception::custom(format!(
                "a batched step takes one token per row, [{}, 1], not {shape:?}",
                positions.len()
            )));
        }
        self.check_cache_count(cache)?;
        let masks = self.masks(cache, LayerCache::batch_mask)?;
        let offsets = RopeAt::Offset(Array::from_slice(positions, &[shape[0]]));
        let h = self.embed(tokens)?;
        let query_scale = match &self.query_scale {
            Some(scale) => rows_query_scale(scale, positions, h.dtype())?,
            None => None,
        };
        self.run_layers(
            tokens,
            h,
            cache,
            &offsets,
            &masks,
            query_scale.as_ref(),
            &[],
        )
    }

    /// An error unless `cache` has one cache per layer that keeps one.
    fn check_cache_count(&self, cache: &[LayerCache]) -> Result<(), Exception> {
        let kept = self.layers.iter().filter(|l| l.kv_source.is_none()).count();
        if cache.len() != kept {
            return Err(Exception::custom(format!(
                "a cache of {} layers for a model whose {kept} layers keep one",
                cache.len()
            )));
        }
        Ok(())
    }

    /// The attention mask of each kind of attention layer (full, or one
    /// window size), made by `mask` from the first cache of that kind.
    fn masks(
        &self,
        cache: &[LayerCache],
        mask: impl Fn(&LayerCache) -> Result<AttentionMask, Exception>,
    ) -> Result<Vec<(Option<i32>, AttentionMask)>, Exception> {
        let mut masks: Vec<(Option<i32>, AttentionMask)> = Vec::with_capacity(2);
        let attending = self
            .layers
            .iter()
            .filter(|layer| layer.kv_source.is_none())
            .zip(cache.iter())
            .filter(|(layer, _)| matches!(layer.mixer, Mixer::Attention(_)));
        for (layer, kv) in attending {
            if !masks.iter().any(|(window, _)| *window == layer.window) {
                masks.push((layer.window, mask(kv)?));
            }
        }
        Ok(masks)
    }

    /// The embeddings of `tokens`, scaled where the family scales them.
    fn embed(&self, tokens: &Array) -> Result<Array, Exception> {
        self.embed_with(tokens, &[])
    }

    /// `embed`, with `inserts` (see `hidden_with`) in place of their
    /// positions' embeddings before the scale, cast to the embeddings'
    /// dtype.
    fn embed_with(&self, tokens: &Array, inserts: &[ImageInsert]) -> Result<Array, Exception> {
        let mut h = self.embed_tokens.embed(tokens)?;
        if !inserts.is_empty() {
            let rows: Vec<(i32, Array)> = inserts.iter().map(|i| (i.at, i.rows.clone())).collect();
            h = splice_rows(&h, &rows, |old, rows| rows.as_dtype(old.dtype()))?;
        }
        match &self.embed_scale {
            Some(scale) => ops::multiply(&h, scale),
            None => Ok(h),
        }
    }

    /// `tokens`' embeddings `h` through every layer and the final norm
    /// (`cache`: one per layer that keeps one, in order), rope rotating
    /// from `offset` (a scalar, or one per row), each attention layer
    /// masked by its kind's mask, the queries scaled by `query_scale`
    /// where a family scales them by position, and each layer given its
    /// slice of the per-layer inputs where the family has them.
    #[allow(clippy::too_many_arguments)]
    fn run_layers(
        &self,
        tokens: &Array,
        mut h: Array,
        cache: &mut [LayerCache],
        offset: &RopeAt,
        masks: &[(Option<i32>, AttentionMask)],
        query_scale: Option<&Array>,
        images: &[ImageInsert],
    ) -> Result<Array, Exception> {
        let per_layer = match &self.per_layer_inputs {
            Some(inputs) => Some(inputs.inputs(tokens, &h)?),
            None => None,
        };
        // A stage after the first runs on the hidden states the stage
        // before it sends (the embedding above only gave their shape).
        if let Some(stage) = &self.stage {
            h = stage.receive(h)?;
        }
        let first = self.stage.as_ref().map_or(0, |s| s.first);
        // Each layer's own cache, `None` for a layer that reads an earlier
        // layer's keys and values.
        let mut caches = cache.iter_mut();
        let layer_caches = self.layers.iter().map(|layer| match layer.kv_source {
            Some(_) => None,
            None => caches.next(),
        });
        // The keys and values each layer attended over, kept for the later
        // layers that read them.
        let mut attended: Vec<Option<CachedKv>> = vec![None; self.layers.len()];
        for (local, (layer, kv)) in self.layers.iter().zip(layer_caches).enumerate() {
            // The layer's index in the whole model.
            let i = first + local;
            let mask = masks
                .iter()
                .find(|(window, _)| *window == layer.window)
                .map_or(&AttentionMask::None, |(_, mask)| mask);
            let normed = fast::rms_norm(&h, Some(&layer.input_layernorm), self.eps)?;
            let mixed = match (&layer.mixer, kv) {
                (Mixer::Attention(attn), kv) => {
                    let (mut q, own, gate) = attn.project(&normed, offset)?;
                    if let Some(scale) = query_scale {
                        q = ops::multiply(&q, scale)?;
                    }
                    let cached = match (own, kv, layer.kv_source) {
                        (Some((k, v)), Some(kv), _) => kv.update_and_fetch_cached(&k, &v)?,
                        (None, None, Some(source)) => {
                            attended.get(source).cloned().flatten().ok_or_else(|| {
                                Exception::custom(format!(
                                    "layer {i} reads layer {source}'s keys and values, which it has not made"
                                ))
                            })?
                        }
                        _ => {
                            return Err(Exception::custom(format!(
                                "layer {i}'s keys and values have nowhere to go or come from"
                            )));
                        }
                    };
                    let out = attn.attend(&q, &cached, gate, mask)?;
                    if layer.kv_read_later {
                        attended[local] = Some(cached);
                    }
                    out
                }
                (Mixer::ShortConv(conv), Some(kv)) => conv.mix(&normed, kv)?,
                (Mixer::GatedDelta(delta), Some(kv)) => delta.mix(&normed, kv)?,
                (Mixer::ShortConv(_) | Mixer::GatedDelta(_), None) => {
                    return Err(Exception::custom(format!("layer {i} has no state")));
                }
            };
            h = layer.finish(&h, &mixed, self.eps, self.tensor.as_ref())?;
            if let (Some(gate), Some(inputs)) = (&layer.per_layer_gate, &per_layer) {
                h = gate.apply(&h, &inputs.index((.., .., i as i32, ..)), self.eps)?;
            }
            if let Some(scalar) = &layer.layer_scalar {
                h = ops::multiply(&h, scalar)?;
            }
            // DeepStack: an image's rows from an early vision block join
            // its tokens' hidden states after the first text layers.
            let added: Vec<(i32, Array)> = images
                .iter()
                .filter_map(|image| image.deepstack.get(i).map(|rows| (image.at, rows.clone())))
                .collect();
            if !added.is_empty() {
                h = splice_rows(&h, &added, |old, rows| {
                    ops::add(old, &rows.as_dtype(old.dtype())?)
                })?;
            }
        }
        if let Some(stage) = &self.stage {
            h = stage.pass_on(h)?;
        }
        fast::rms_norm(&h, Some(&self.norm), self.eps)
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed_tokens.forward(hidden)?,
        };
        let Some((cap, scalar)) = &self.logit_softcap else {
            return Ok(logits);
        };
        let cast;
        let scalar = if scalar.dtype() == logits.dtype() {
            scalar
        } else {
            cast = Array::from_f32(*cap).as_dtype(logits.dtype())?;
            &cast
        };
        ops::multiply(ops::tanh(&ops::divide(&logits, scalar)?)?, scalar)
    }
}

/// The queries' scale for `length` positions from `offset`, `[length, 1]`
/// in `dtype`: `1 + beta * ln(1 + floor(p / original))` at position `p`,
/// with mlx-lm's operations in its order (`_get_llama_4_attn_scale`).
/// `None` while every position is below the original context, where the
/// scale is exactly one.
pub fn position_query_scale(
    scale: &PositionQueryScale,
    length: i32,
    offset: i32,
    dtype: mlx_rs::Dtype,
) -> Result<Option<Array>, Exception> {
    let original = scale.original_max_position_embeddings;
    if i64::from(offset) + i64::from(length) <= i64::from(original) {
        return Ok(None);
    }
    let positions = ops::add(
        Array::arange::<_, i32>(0, length, 1)?,
        Array::from_int(offset),
    )?;
    let windows = ops::floor(&ops::divide(&positions, Array::from_int(original as i32))?)?;
    let grown = ops::log(&ops::add(Array::from_f32(1.0), &windows)?)?;
    let factor = ops::add(
        Array::from_f32(1.0),
        ops::multiply(Array::from_f32(scale.beta), &grown)?,
    )?;
    Ok(Some(factor.reshape(&[length, 1])?.as_dtype(dtype)?))
}

/// The queries' scale of one position per row, row `r` at `positions[r]`,
/// `[B, 1, 1, 1]` in `dtype`: `position_query_scale`'s operations on every
/// row at once. `None` while every row is below the original context.
fn rows_query_scale(
    scale: &PositionQueryScale,
    positions: &[i32],
    dtype: mlx_rs::Dtype,
) -> Result<Option<Array>, Exception> {
    let original = scale.original_max_position_embeddings;
    if positions
        .iter()
        .all(|&p| i64::from(p) < i64::from(original))
    {
        return Ok(None);
    }
    let rows = positions.len() as i32;
    let positions = Array::from_slice(positions, &[rows]);
    let windows = ops::floor(&ops::divide(&positions, Array::from_int(original as i32))?)?;
    let grown = ops::log(&ops::add(Array::from_f32(1.0), &windows)?)?;
    let factor = ops::add(
        Array::from_f32(1.0),
        ops::multiply(Array::from_f32(scale.beta), &grown)?,
    )?;
    Ok(Some(factor.reshape(&[rows, 1, 1, 1])?.as_dtype(dtype)?))
}

impl Layer {
    /// The rest of the layer after attention: the output projection of the
    /// attention's `heads`, the residual adds, the MLP and its norms.
    /// On a tensor shard (`shards`), the output and down projections give
    /// partial sums that the ranks add up before the residual adds.
    fn finish(
        &self,
        h: &Array,
        heads: &Array,
        eps: f32,
        shards: Option<&TensorShards>,
    ) -> Result<Array, Exception> {
        match (&self.pre_feedforward_layernorm, shards) {
            (None, None) => {
                let h = self.mixer.out_proj().forward_add(heads, h)?;
                let normed = fast::rms_norm(&h, Some(&self.post_attention_layernorm), eps)?;
                self.mlp.forward_add(&normed, &h, eps)
            }
            (None, Some(shards)) => {
                let h = ops::add(h, &summed(self.mixer.out_proj(), heads, shards)?)?;
                let normed = fast::rms_norm(&h, Some(&self.post_attention_layernorm), eps)?;
                ops::add(&h, &self.mlp.forward_summed(&normed, shards)?)
            }
            (Some(pre_feedforward), shards) => {
                let attn = match shards {
                    None => self.mixer.out_proj().forward(heads)?,
                    Some(shards) => summed(self.mixer.out_proj(), heads, shards)?,
                };
                let attn = fast::rms_norm(&attn, Some(&self.post_attention_layernorm), eps)?;
                let h = residual_add(h, &attn)?;
                let normed = fast::rms_norm(&h, Some(pre_feedforward), eps)?;
                let mut out = match shards {
                    None => self.mlp.forward(&h, &normed, eps)?,
                    Some(shards) => self.mlp.forward_summed(&normed, shards)?,
                };
                if let Some(post) = &self.post_feedforward_layernorm {
                    out = fast::rms_norm(&out, Some(post), eps)?;
                }
                residual_add(&h, &out)
            }
        }
    }
}

/// A projection cut by input columns across tensor shards: this rank's
/// partial product, summed over the ranks, then the layer's bias once.
fn summed(linear: &Linear, x: &Array, shards: &TensorShards) -> Result<Array, Exception> {
    let total = shards.sum(&linear.product(x)?)?;
    match linear.bias() {
        Some(bias) => ops::add(&total, bias),
        None => Ok(total),
    }
}

/// `x + y`; in float16 added in float32 and clipped to float16's range
/// first, as gemma's residual stream needs (its activations outgrow
/// float16, and mlx-lm clips the same way).
fn residual_add(x: &Array, y: &Array) -> Result<Array, Exception> {
    if x.dtype() != mlx_rs::Dtype::Float16 {
        return ops::add(x, y);
    }
    let bound = 65504.0f32;
    let sum = ops::add(
        x.as_dtype(mlx_rs::Dtype::Float32)?,
        y.as_dtype(mlx_rs::Dtype::Float32)?,
    )?;
    ops::clip(&sum, (-bound, bound))?.as_dtype(mlx_rs::Dtype::Float16)
}

/// Whether projections stored apart but alike (q, k and v; gate and up) are
/// joined for decode steps. On a GPU every matmul is a kernel the host
/// queues, and the joined ones made a 3B decode step 1.00-1.23x as fast on
/// the H200; on the CPU they made `small`'s fp32 decode about 0.9x as fast,
/// so there the parts run. `ONDO_JOIN_PROJECTIONS=1` or `=0` decides
/// instead, for measurements and for the parity test of the joined path.
pub fn join_projections() -> bool {
    crate::environment::JOIN_PROJECTIONS
        .switch()
        .unwrap_or_else(super::default_device_is_gpu)
}

/// The two parts of a split in two.
fn two(parts: Vec<Array>) -> Result<[Array; 2], Exception> {
    <[Array; 2]>::try_from(parts)
        .map_err(|_| Exception::custom("a split in two gave another count"))
}

impl Attention {
    /// Queries, keys and values of `x` as heads, `[B, heads, L, D]`, with
    /// the queries and keys rotated for positions from `offset` (no keys and
    /// values for a layer that reads an earlier layer's); and, for a gated
    /// attention, the output's gate `[B, L, heads * D]`.
    #[allow(clippy::type_complexity)]
    fn project(
        &self,
        x: &Array,
        offset: &RopeAt,
    ) -> Result<(Array, Option<(Array, Array)>, Option<Array>), Exception> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        // A decode step has one position, and then `[B, 1, H, D]` and
        // `[B, H, 1, D]` list the same values in the same order: one reshape
        // does what reshape-then-transpose does, one primitive fewer for each
        // of q, k, v and the output, per layer and token (the host's dispatch
        // of primitives is what bounds decoding on a GPU).
        let split = |y: Array, heads: i32| -> Result<Array, Exception> {
            if l == 1 {
                y.reshape(&[b, heads, 1, self.head_dim])
            } else {
                y.reshape(&[b, l, heads, self.head_dim])?
                    .transpose_axes(&[0, 2, 1, 3])
            }
        };
        // One position through the joined projection, without q/k norms: the
        // output `[B, 1, (H + 2 KV) D]` is already `[B, H + 2 KV, 1, D]`,
        // heads of q, then k, then v. One rope call rotates the q and k heads
        // together (the same positions, the same frequencies), and q, k and
        // v are views into it: one kernel fewer per layer than roping q and
        // k apart. Each split is one primitive with two views, where two
        // slices were two (the host's dispatch of primitives bounds an 8B
        // decode step on the H200).
        if let (1, Projections::Qkv(qkv), None, None, false, false) = (
            l,
            &self.proj,
            &self.q_norm,
            &self.k_norm,
            self.output_gate,
            self.value_norm,
        ) && let Some(qkv_proj) = qkv.joined()
        {
            let rotated = self.heads + self.kv_heads;
            let heads =
                qkv_proj
                    .forward(x)?
                    .reshape(&[b, rotated + self.kv_heads, 1, self.head_dim])?;
            let [qk, v] = two(heads.split_at_indices(&[rotated], 1)?)?;
            let [q, k] = two(self
                .rotate(&qk, offset)?
                .split_at_indices(&[self.heads], 1)?)?;
            return Ok((q, Some((k, v)), None));
        }
        let (q, kv) = match &self.proj {
            Projections::Qkv(qkv) => {
                let [q, k, v] = qkv.forward(x)?;
                (q, Some((k, v)))
            }
            // The values are the keys as projected, before their norm.
            Projections::Qk(qk) => {
                let [q, k] = qk.forward(x)?;
                (q, Some((k.clone(), k)))
            }
            Projections::Q(q) => (q.forward(x)?, None),
        };
        // A gated attention's heads are each `[query, gate]`.
        let (q, gate) = if self.output_gate {
            let [q, gate] = two(q
                .reshape(&[b, l, self.heads, 2 * self.head_dim])?
                .split_at_indices(&[self.head_dim], -1)?)?;
            (q, Some(gate.reshape(&[b, l, self.heads * self.head_dim])?))
        } else {
            (q, None)
        };
        let mut q = split(q, self.heads)?;
        if let Some(weight) = &self.q_norm {
            q = fast::rms_norm(&q, Some(weight), self.eps)?;
        }
        // Rope positions count every token seen, also those a rotating
        // cache has dropped.
        let q = self.rotate(&q, offset)?;
        let kv = match kv {
            Some((k, v)) => {
                let mut k = split(k, self.kv_heads)?;
                let mut v = split(v, self.kv_heads)?;
                if let Some(weight) = &self.k_norm {
                    k = fast::rms_norm(&k, Some(weight), self.eps)?;
                }
                if self.value_norm {
                    v = fast::rms_norm(&v, None, self.eps)?;
                }
                Some((self.rotate(&k, offset)?, v))
            }
            None => None,
        };
        Ok((q, kv, gate))
    }

    /// `x` rotated for positions from `offset`, or as it is in a layer
    /// without rope.
    fn rotate(&self, x: &Array, offset: &RopeAt) -> Result<Array, Exception> {
        match (&self.rope, offset) {
            (Some(rope), RopeAt::Offset(offset)) => rope.apply(x, offset),
            (Some(rope), RopeAt::Angles { cos, sin }) => rotate_by_angles(x, cos, sin, rope.dims),
            (None, _) => Ok(x.clone()),
        }
    }

    /// Attends `q` over the cached keys and values (what the cache holds,
    /// or an earlier layer's; float, or quantized); the heads come back
    /// joined, `[B, L, heads * D]`, for the output projection, times the
    /// sigmoid of `gate` where there is one.
    fn attend(
        &self,
        q: &Array,
        cached: &CachedKv,
        gate: Option<Array>,
        mask: &AttentionMask,
    ) -> Result<Array, Exception> {
        let shape = q.shape();
        let (b, l) = (shape[0], shape[2]);
        let o = match cached {
            CachedKv::Float(k, v) => fast::scaled_dot_product_attention(
                q,
                k,
                v,
                self.scale,
                fused_mask(mask),
                self.sinks.as_ref(),
            )?,
            CachedKv::Quantized(k, v, quantization) => {
                if self.sinks.is_some() {
                    return Err(Exception::custom(
                        "this model's attention has sinks, which attention over a quantized KV \
                         cache does not take (mlx-lm refuses them too); run it without kv_bits",
                    ));
                }
                if crate::engine::backend::attends_quantized_directly() {
                    quantized_attention(q, k, v, self.scale, mask, *quantization)?
                } else {
                    let (k, v) = (k.dequantize(*quantization)?, v.dequantize(*quantization)?);
                    fast::scaled_dot_product_attention(
                        q,
                        &k,
                        &v,
                        self.scale,
                        fused_mask(mask),
                        None,
                    )?
                }
            }
        };
        let o = if l == 1 {
            o.reshape(&[b, 1, self.heads * self.head_dim])?
        } else {
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.heads * self.head_dim])?
        };
        match gate {
            Some(gate) => ops::multiply(&o, ops::sigmoid(&gate)?),
            None => Ok(o),
        }
    }
}

/// `mask` as MLX's fused attention takes it.
fn fused_mask(mask: &AttentionMask) -> Option<ScaledDotProductAttentionMask<'_>> {
    match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
        AttentionMask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
    }
}

impl Mlp {
    /// Loads `{p}.mlp`'s gate and up (stored apart or as one; joined for
    /// decode steps when `join`) and down projections, `inter` wide.
    fn load(
        w: &mut WeightMap,
        p: &str,
        config: &ModelConfig,
        inter: i32,
        quant: Option<&QuantConfig>,
        join: bool,
    ) -> Result<Self, LoadError> {
        let names = config.names;
        let (hidden, mlp_bias) = (config.hidden_size, config.mlp_bias);
        let gate_up = if config.fused_projections {
            JointProjection::split(
                Linear::load(
                    w,
                    &format!("{p}.mlp.gate_up_proj"),
                    2 * inter,
                    hidden,
                    quant,
                    mlp_bias,
                )?,
                [inter, inter],
            )?
        } else {
            let parts = [
                Linear::load(
                    w,
                    &format!("{p}.{}.{}", names.mlp, names.gate_up_down[0]),
                    inter,
                    hidden,
                    quant,
                    mlp_bias,
                )?,
                Linear::load(
                    w,
                    &format!("{p}.{}.{}", names.mlp, names.gate_up_down[1]),
                    inter,
                    hidden,
                    quant,
                    mlp_bias,
                )?,
            ];
            if join {
                JointProjection::join(parts)?
            } else {
                JointProjection::apart(parts)
            }
        };
        Ok(Mlp {
            gate_up,
            down_proj: Linear::load(
                w,
                &format!("{p}.{}.{}", names.mlp, names.gate_up_down[2]),
                hidden,
                inter,
                quant,
                mlp_bias,
            )?,
            activation: config.activation,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut out = self.gate_up.arrays();
        out.extend(self.down_proj.arrays());
        out
    }

    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        self.down_proj.forward(&self.activated(x)?)
    }

    /// `residual + forward(x)`, the add made by the down projection.
    fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array, Exception> {
        self.down_proj.forward_add(&self.activated(x)?, residual)
    }

    fn activated(&self, x: &Array) -> Result<Array, Exception> {
        let [gate, up] = self.gate_up.forward(x)?;
        match self.activation {
            Activation::Silu => activation::swiglu(&gate, &up),
            Activation::GeluApprox => activation::geglu_approx(&gate, &up),
            Activation::GeluApproxFused => activation::geglu_approx_fused(&gate, &up),
        }
    }
}

impl FeedForward {
    /// The output for `normed`, the residual stream `h` through the norm
    /// before the feed-forward (routed experts beside the dense MLP read
    /// `h` itself).
    fn forward(&self, h: &Array, normed: &Array, eps: f32) -> Result<Array, Exception> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(normed),
            FeedForward::Experts(experts) => experts.forward(normed),
            FeedForward::Beside(block) => block.forward(h, normed, eps),
        }
    }

    /// `residual + forward(x)`, for a layer whose norm before the
    /// feed-forward is its only one there.
    fn forward_add(&self, x: &Array, residual: &Array, eps: f32) -> Result<Array, Exception> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward_add(x, residual),
            other => ops::add(residual, &other.forward(residual, x, eps)?),
        }
    }

    /// `forward` on a tensor shard: the dense MLP's down projection summed
    /// across the ranks (the only feed-forward a shard has).
    fn forward_summed(&self, x: &Array, shards: &TensorShards) -> Result<Array, Exception> {
        match self {
            FeedForward::Dense(mlp) => summed(&mlp.down_proj, &mlp.activated(x)?, shards),
            _ => Err(Exception::custom(
                "a layer with experts cannot be cut by heads across ranks",
            )),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.arrays(),
            FeedForward::Experts(experts) => experts.arrays(),
            FeedForward::Beside(block) => block.arrays(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_scale_past_the_original_context_by_the_log_of_its_multiples() {
        let scale = PositionQueryScale {
            beta: 0.1,
            original_max_position_embeddings: 16,
        };
        let f32 = mlx_rs::Dtype::Float32;
        // Every position below 16: exactly one, so nothing to multiply.
        assert!(position_query_scale(&scale, 16, 0, f32).unwrap().is_none());
        // Positions 14 to 17, then 40 alone: floor(p / 16) is 0, 0, 1, 1
        // and 2, so 1, 1, 1 + 0.1 ln 2 and 1 + 0.1 ln 3.
        let values = position_query_scale(&scale, 4, 14, f32).unwrap().unwrap();
        assert_eq!(values.shape(), &[4, 1]);
        let expected = [1.0, 1.0, 1.069_314_7, 1.069_314_7];
        for (got, want) in values.as_slice::<f32>().iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        let one = position_query_scale(&scale, 1, 40, mlx_rs::Dtype::Bfloat16)
            .unwrap()
            .unwrap();
        assert_eq!(one.dtype(), mlx_rs::Dtype::Bfloat16);
        let value = one.as_dtype(f32).unwrap().as_slice::<f32>()[0];
        // 1.1098612 rounded to bfloat16 (8 bits of mantissa): 1.109375.
        assert_eq!(value, 1.109_375);
    }

    /// A batch's rows, each at its own position, get the scale each would
    /// get alone, bit for bit; below the original context, none at all.
    #[test]
    fn each_row_of_a_batch_scales_its_queries_as_it_would_alone() {
        let scale = PositionQueryScale {
            beta: 0.1,
            original_max_position_embeddings: 16,
        };
        let f32 = mlx_rs::Dtype::Float32;
        assert!(
            rows_query_scale(&scale, &[3, 15, 0], f32)
                .unwrap()
                .is_none()
        );
        let positions = [3, 16, 47, 15];
        let rows = rows_query_scale(&scale, &positions, f32).unwrap().unwrap();
        assert_eq!(rows.shape(), &[4, 1, 1, 1]);
        for (row, &position) in positions.iter().enumerate() {
            let alone = position_query_scale(&scale, 1, position, f32)
                .unwrap()
                .map_or(1.0, |a| a.as_slice::<f32>()[0]);
            assert_eq!(rows.as_slice::<f32>()[row], alone, "position {position}");
        }
    }

    #[test]
    fn rope_input_scale_is_made_once_per_dtype_in_that_dtype() {
        let scale = InputScale::new(1.25);
        let bf16 = scale.scalar(mlx_rs::Dtype::Bfloat16).unwrap();
        assert_eq!(bf16.dtype(), mlx_rs::Dtype::Bfloat16);
        assert_eq!(
            bf16.as_dtype(mlx_rs::Dtype::Float32)
                .unwrap()
                .try_item_exact::<f32>()
                .unwrap(),
            1.25
        );
        scale.scalar(mlx_rs::Dtype::Bfloat16).unwrap();
        assert_eq!(
            scale.scalars.lock().unwrap().len(),
            1,
            "made once per dtype"
        );
        let f32 = scale.scalar(mlx_rs::Dtype::Float32).unwrap();
        assert_eq!(f32.dtype(), mlx_rs::Dtype::Float32);
        assert_eq!(scale.scalars.lock().unwrap().len(), 2);
        // Multiplying keeps x's dtype, as mlx-lm's Python float does.
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let scaled = scale_leading_dims(&x, 2, &bf16).unwrap();
        assert_eq!(scaled.dtype(), mlx_rs::Dtype::Bfloat16);
        let values = scaled.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        assert_eq!(values.as_slice::<f32>(), &[1.25, 2.5, 3.0, 4.0]);
    }
}
