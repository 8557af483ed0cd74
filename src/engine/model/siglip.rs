//! Gemma 3's eyes: a SigLIP vision tower and the projector that turns its
//! patches into the language model's embeddings.
//!
//! The tower cuts a square image into `patch_size` patches, embeds each
//! with one matrix (the checkpoint's convolution, whose stride equals its
//! kernel, is exactly a matrix over the flattened patch), adds a learned
//! position per patch, and runs pre-norm encoder layers (LayerNorm,
//! attention in both directions, LayerNorm, an exact-GELU MLP), then a
//! final LayerNorm. The projector average-pools the patch grid down to
//! `mm_tokens_per_image` tokens, normalizes them with Gemma's RMSNorm
//! (scale stored minus one) and projects them to the text model's width.
//! Weight names are mlx-community's (`vision_tower.vision_model.*`,
//! `multi_modal_projector.*`); a patch kernel stored in PyTorch's layout
//! `[out, channels, k, k]` is read as well as MLX's `[out, k, k, channels]`.
//! Conversions that quantized the tower (mlx-vlm quantizes it unless told
//! to skip it) are read too: each quantized matrix is dequantized once at
//! load, so the tower computes in floats either way.

use mlx_rs::error::Exception;
use mlx_rs::{Array, fast, ops};
use serde::Deserialize;

use super::activation::gelu_exact;
use super::bert::{Dense, LayerNorm};
use super::{QuantConfig, QuantizedMatrix, quantized, stored_params};
use crate::engine::LoadError;
use crate::engine::weights::WeightMap;

/// The float matrix `{prefix}.weight` `[out, in]`, dequantized where the
/// checkpoint stores it quantized.
pub(super) fn take_matrix(
    w: &mut WeightMap,
    prefix: &str,
    out: usize,
    inp: usize,
    quant: Option<&QuantConfig>,
) -> Result<Array, LoadError> {
    let (out, inp) = (out as i32, inp as i32);
    match stored_params(w, prefix, inp, quant)? {
        Some(params) => {
            let m = QuantizedMatrix::take(w, prefix, &[], out, inp, params)?;
            Ok(quantized::dequantize(
                &m.weight,
                &m.scales,
                m.biases.as_ref(),
                params,
            )?)
        }
        None => w.take_float(&format!("{prefix}.weight"), &[out, inp]),
    }
}

/// A dense layer with its bias, its matrix dequantized where stored
/// quantized.
pub(super) fn take_dense(
    w: &mut WeightMap,
    prefix: &str,
    out: usize,
    inp: usize,
    quant: Option<&QuantConfig>,
) -> Result<Dense, LoadError> {
    Ok(Dense {
        weight: take_matrix(w, prefix, out, inp, quant)?,
        bias: w.take_float(&format!("{prefix}.bias"), &[out as i32])?,
    })
}

/// The `vision_config` keys SigLIP reads, with transformers' defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SiglipConfig {
    #[serde(default = "default_hidden")]
    pub hidden_size: usize,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: usize,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "default_heads")]
    pub num_attention_heads: usize,
    #[serde(default = "default_patch")]
    pub patch_size: usize,
    #[serde(default = "default_image")]
    pub image_size: usize,
    #[serde(default = "default_channels")]
    pub num_channels: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f32,
}

fn default_hidden() -> usize {
    768
}
fn default_intermediate() -> usize {
    3072
}
fn default_layers() -> usize {
    12
}
fn default_heads() -> usize {
    12
}
fn default_patch() -> usize {
    16
}
fn default_image() -> usize {
    224
}
fn default_channels() -> usize {
    3
}
fn default_eps() -> f32 {
    1e-6
}

/// The final LayerNorm's epsilon: MLX's default, which mlx-vlm's tower
/// keeps (the encoder's norms take the config's).
const POST_NORM_EPS: f32 = 1e-5;

struct EncoderLayer {
    q_proj: Dense,
    k_proj: Dense,
    v_proj: Dense,
    out_proj: Dense,
    layer_norm1: LayerNorm,
    layer_norm2: LayerNorm,
    fc1: Dense,
    fc2: Dense,
}

/// Gemma 3's vision tower and projector, loaded.
pub struct Gemma3Vision {
    pub config: SiglipConfig,
    /// Patch embedding as a matrix `[hidden, k * k * channels]` over a
    /// patch flattened row by row, channels last.
    patch_weight: Array,
    patch_bias: Array,
    positions: Array,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
    /// `1 + w`: Gemma's RMSNorm scale as stored plus one.
    soft_emb_norm: Array,
    /// `[vision hidden, text hidden]`.
    projection: Array,
    /// Pooled tokens per side of the grid (16 for 256 tokens an image).
    tokens_per_side: i32,
}

impl Gemma3Vision {
    /// Takes the tower's and projector's tensors from `weights` (the
    /// names under `vision_tower.` and `multi_modal_projector.`), checking
    /// each one's shape against `config`, `text_hidden` and
    /// `tokens_per_image`.
    pub fn load(
        config: SiglipConfig,
        text_hidden: usize,
        tokens_per_image: usize,
        weights: &mut WeightMap,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let h = config.hidden_size;
        let i = config.intermediate_size;
        let (k, c) = (config.patch_size as i32, config.num_channels as i32);
        let grid = config.image_size / config.patch_size.max(1);
        let side = (tokens_per_image as f64).sqrt().round() as usize;
        if config.patch_size == 0
            || !config.image_size.is_multiple_of(config.patch_size)
            || side * side != tokens_per_image
            || side == 0
            || !grid.is_multiple_of(side)
            || !h.is_multiple_of(config.num_attention_heads.max(1))
        {
            return Err(LoadError::ConfigInvalid {
                path: weights.dir.join("config.json"),
                message: format!(
                    "the vision tower's image_size {} is not a whole number of patches of {}, or \
                     its {grid}x{grid} patches do not pool evenly into mm_tokens_per_image {} \
                     (a square), or hidden_size {h} does not split into {} heads",
                    config.image_size,
                    config.patch_size,
                    tokens_per_image,
                    config.num_attention_heads
                ),
            });
        }
        let root = "vision_tower.vision_model";
        let w = weights;
        let kernel_name = format!("{root}.embeddings.patch_embedding.weight");
        let kernel = w.take_stored(&kernel_name)?;
        let stored = kernel.array.shape().to_vec();
        // MLX's layout keeps the two kernel axes together; PyTorch's puts
        // the channels between them and the output.
        let kernel = if stored == [h as i32, k, k, c] {
            kernel.array
        } else if stored == [h as i32, c, k, k] {
            kernel.array.transpose_axes(&[0, 2, 3, 1])?
        } else {
            return Err(LoadError::TensorShape {
                tensor: kernel_name,
                file: kernel.file,
                expected: vec![h as i32, k, k, c],
                found: stored,
            });
        };
        let patch_weight = kernel.reshape(&[h as i32, k * k * c])?;
        let patch_bias = w.take_float(
            &format!("{root}.embeddings.patch_embedding.bias"),
            &[h as i32],
        )?;
        let positions = take_matrix(
            w,
            &format!("{root}.embeddings.position_embedding"),
            grid * grid,
            h,
            quant,
        )?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for n in 0..config.num_hidden_layers {
            let p = format!("{root}.encoder.layers.{n}");
            layers.push(EncoderLayer {
                q_proj: take_dense(w, &format!("{p}.self_attn.q_proj"), h, h, quant)?,
                k_proj: take_dense(w, &format!("{p}.self_attn.k_proj"), h, h, quant)?,
                v_proj: take_dense(w, &format!("{p}.self_attn.v_proj"), h, h, quant)?,
                out_proj: take_dense(w, &format!("{p}.self_attn.out_proj"), h, h, quant)?,
                layer_norm1: LayerNorm::take(w, &format!("{p}.layer_norm1"), h)?,
                layer_norm2: LayerNorm::take(w, &format!("{p}.layer_norm2"), h)?,
                fc1: take_dense(w, &format!("{p}.mlp.fc1"), i, h, quant)?,
                fc2: take_dense(w, &format!("{p}.mlp.fc2"), h, i, quant)?,
            });
        }
        let post_layernorm = LayerNorm::take(w, &format!("{root}.post_layernorm"), h)?;
        let norm = w.take_float("multi_modal_projector.mm_soft_emb_norm.weight", &[h as i32])?;
        let one = Array::from_f32(1.0).as_dtype(norm.dtype())?;
        let soft_emb_norm = ops::add(&one, &norm)?;
        let projection = w.take_float(
            "multi_modal_projector.mm_input_projection_weight",
            &[h as i32, text_hidden as i32],
        )?;
        Ok(Self {
            config,
            patch_weight,
            patch_bias,
            positions,
            layers,
            post_layernorm,
            soft_emb_norm,
            projection,
            tokens_per_side: side as i32,
        })
    }

    /// Every weight array (to evaluate at load and count bytes).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![
            &self.patch_weight,
            &self.patch_bias,
            &self.positions,
            &self.post_layernorm.weight,
            &self.post_layernorm.bias,
            &self.soft_emb_norm,
            &self.projection,
        ];
        for l in &self.layers {
            for dense in [&l.q_proj, &l.k_proj, &l.v_proj, &l.out_proj, &l.fc1, &l.fc2] {
                all.push(&dense.weight);
                all.push(&dense.bias);
            }
            for norm in [&l.layer_norm1, &l.layer_norm2] {
                all.push(&norm.weight);
                all.push(&norm.bias);
            }
        }
        all
    }

    /// The dtype the tower computes in (its weights').
    pub fn dtype(&self) -> mlx_rs::Dtype {
        self.patch_weight.dtype()
    }

    /// The tower's last states `[n, patches, hidden]` for `pixels`
    /// `[n, image_size, image_size, channels]` (channels last).
    pub fn tower(&self, pixels: &Array) -> Result<Array, Exception> {
        let n = pixels.shape()[0];
        let k = self.config.patch_size as i32;
        let c = self.config.num_channels as i32;
        let grid = (self.config.image_size / self.config.patch_size) as i32;
        let h = self.config.hidden_size as i32;
        let patches = pixels
            .reshape(&[n, grid, k, grid, k, c])?
            .transpose_axes(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[n, grid * grid, k * k * c])?;
        let embedded = ops::addmm(
            &self.patch_bias,
            &patches,
            self.patch_weight.t(),
            None,
            None,
        )?;
        let mut x = ops::add(&embedded, &self.positions)?;
        let heads = self.config.num_attention_heads as i32;
        let head_dim = h / heads;
        let scale = (head_dim as f32).powf(-0.5);
        let eps = self.config.layer_norm_eps;
        let length = grid * grid;
        let split = |x: Array| -> Result<Array, Exception> {
            x.reshape(&[n, length, heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])
        };
        for layer in &self.layers {
            let normed = layer.layer_norm1.forward(&x, eps)?;
            let q = split(layer.q_proj.forward(&normed)?)?;
            let key = split(layer.k_proj.forward(&normed)?)?;
            let v = split(layer.v_proj.forward(&normed)?)?;
            let attended = fast::scaled_dot_product_attention(q, key, v, scale, None, None)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[n, length, h])?;
            let x1 = ops::add(&x, &layer.out_proj.forward(&attended)?)?;
            let inner = gelu_exact(&layer.fc1.forward(&layer.layer_norm2.forward(&x1, eps)?)?)?;
            x = ops::add(&x1, &layer.fc2.forward(&inner)?)?;
        }
        self.post_layernorm.forward(&x, POST_NORM_EPS)
    }

    /// The image tokens `[n, mm_tokens_per_image, text hidden]` for tower
    /// states `[n, patches, hidden]`: the grid average-pooled, normalized
    /// and projected.
    pub fn project(&self, states: &Array) -> Result<Array, Exception> {
        let n = states.shape()[0];
        let d = states.shape()[2];
        let grid = (self.config.image_size / self.config.patch_size) as i32;
        let side = self.tokens_per_side;
        let kernel = grid / side;
        let pooled = states
            .reshape(&[n, side, kernel, side, kernel, d])?
            .mean_axes(&[2, 4], None)?
            .reshape(&[n, side * side, d])?;
        let normed = fast::rms_norm(
            &pooled,
            Some(&self.soft_emb_norm),
            self.config.layer_norm_eps,
        )?;
        ops::matmul(&normed, &self.projection)?.as_dtype(states.dtype())
    }

    /// Image tokens for `pixels` (see `tower` and `project`).
    pub fn encode(&self, pixels: &Array) -> Result<Array, Exception> {
        self.project(&self.tower(pixels)?)
    }
}
