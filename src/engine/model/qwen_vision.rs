//! Qwen3-VL's eyes (and Qwen 3.5's: the same tower without DeepStack): a
//! vision transformer over an image at about its own size.
//!
//! The image arrives as patches (`crate::vision::PatchGridProcessor`), the
//! `merge` x `merge` patches of each image token consecutive. Each patch is
//! embedded with one matrix (the checkpoint's 3-D convolution, whose stride
//! equals its kernel, is exactly a matrix over the flattened patch); a
//! learned position table made for a square grid is interpolated
//! bilinearly to the image's grid and added. Pre-norm blocks follow
//! (LayerNorm, attention over the whole image with a 2-D rotary position
//! per patch: half the rotated features turn with the patch's row, half
//! with its column; LayerNorm, a tanh-GELU MLP). The merger normalizes each
//! patch, joins each token's patches into one row and projects it to the
//! language model's width through an exact-GELU MLP. Qwen3-VL also taps
//! some early blocks (`deepstack_visual_indexes`): their states, joined and
//! projected by mergers of their own, are added to the image tokens'
//! hidden states after the first text layers.
//!
//! Weight names are mlx-community's (`vision_tower.*`); the patch kernel is
//! read in MLX's layout `[out, time, k, k, channels]` or PyTorch's
//! `[out, channels, time, k, k]`. A quantized tower is dequantized at load,
//! as Gemma 3's is.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, fast, ops};
use serde::Deserialize;

use super::QuantConfig;
use super::activation::{gelu_approx, gelu_exact};
use super::bert::{Dense, LayerNorm};
use super::decoder::base_freqs;
use super::siglip::{take_dense, take_matrix};
use crate::engine::LoadError;
use crate::engine::weights::WeightMap;

/// The `vision_config` keys the tower reads, with mlx-vlm's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QwenVisionConfig {
    #[serde(default = "default_depth")]
    pub depth: usize,
    #[serde(default = "default_hidden")]
    pub hidden_size: usize,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: usize,
    #[serde(default = "default_heads")]
    pub num_heads: usize,
    #[serde(default = "default_patch")]
    pub patch_size: usize,
    #[serde(default = "default_temporal")]
    pub temporal_patch_size: usize,
    #[serde(default = "default_merge")]
    pub spatial_merge_size: usize,
    #[serde(default = "default_out")]
    pub out_hidden_size: usize,
    #[serde(default = "default_positions")]
    pub num_position_embeddings: usize,
    #[serde(default = "default_channels")]
    pub in_channels: usize,
    #[serde(default)]
    pub deepstack_visual_indexes: Vec<usize>,
}

fn default_depth() -> usize {
    32
}
fn default_hidden() -> usize {
    1280
}
fn default_intermediate() -> usize {
    3420
}
fn default_heads() -> usize {
    16
}
fn default_patch() -> usize {
    14
}
fn default_temporal() -> usize {
    2
}
fn default_merge() -> usize {
    2
}
fn default_out() -> usize {
    1536
}
fn default_positions() -> usize {
    2304
}
fn default_channels() -> usize {
    3
}

/// The LayerNorms' epsilon (fixed in the model, not in its config).
const EPS: f32 = 1e-6;

/// The rotary base of the patches' 2-D positions.
const ROPE_BASE: f32 = 10_000.0;

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Dense,
    proj: Dense,
    fc1: Dense,
    fc2: Dense,
}

/// Joins each image token's patches and projects them to the text width.
struct Merger {
    norm: LayerNorm,
    fc1: Dense,
    fc2: Dense,
    /// Normalizes the joined row (DeepStack's mergers) rather than each
    /// patch (the main merger).
    after_join: bool,
}

impl Merger {
    fn take(
        w: &mut WeightMap,
        prefix: &str,
        config: &QwenVisionConfig,
        after_join: bool,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let h = config.hidden_size;
        let joined = h * config.spatial_merge_size * config.spatial_merge_size;
        Ok(Self {
            norm: LayerNorm::take(
                w,
                &format!("{prefix}.norm"),
                if after_join { joined } else { h },
            )?,
            fc1: take_dense(w, &format!("{prefix}.linear_fc1"), joined, joined, quant)?,
            fc2: take_dense(
                w,
                &format!("{prefix}.linear_fc2"),
                config.out_hidden_size,
                joined,
                quant,
            )?,
            after_join,
        })
    }

    /// `[patches, hidden]` into `[patches / merge², out_hidden]`.
    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let joined = self.fc1.weight.shape()[1];
        let normed = if self.after_join {
            self.norm.forward(&x.reshape(&[-1, joined])?, EPS)?
        } else {
            self.norm.forward(x, EPS)?.reshape(&[-1, joined])?
        };
        self.fc2.forward(&gelu_exact(&self.fc1.forward(&normed)?)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        vec![
            &self.norm.weight,
            &self.norm.bias,
            &self.fc1.weight,
            &self.fc1.bias,
            &self.fc2.weight,
            &self.fc2.bias,
        ]
    }
}

/// One image's image tokens: the main features and DeepStack's.
pub struct QwenImageFeatures {
    /// `[tokens, out_hidden]`.
    pub main: Array,
    /// One `[tokens, out_hidden]` per tapped block, in order.
    pub deepstack: Vec<Array>,
}

/// The tower, loaded.
pub struct QwenVision {
    pub config: QwenVisionConfig,
    /// `[hidden, channels * time * k * k]` over a patch flattened channel,
    /// time, row, column.
    patch_weight: Array,
    patch_bias: Array,
    /// `[side * side, hidden]`: positions on a square grid.
    position_table: Array,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
}

impl QwenVision {
    /// Takes the tower's tensors (`vision_tower.*`) from `weights`, each
    /// shape checked against `config`; its output width must be the text
    /// model's `text_hidden`.
    pub fn load(
        config: QwenVisionConfig,
        text_hidden: usize,
        weights: &mut WeightMap,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let h = config.hidden_size;
        let side = (config.num_position_embeddings as f64).sqrt() as usize;
        let problem = if config.num_heads == 0 || !h.is_multiple_of(config.num_heads) {
            Some(format!(
                "hidden_size {h} does not split into {} heads",
                config.num_heads
            ))
        } else if !(h / config.num_heads).is_multiple_of(4) {
            Some(format!(
                "a head of {} features cannot turn half with rows and half with columns",
                h / config.num_heads
            ))
        } else if side * side != config.num_position_embeddings || side == 0 {
            Some(format!(
                "num_position_embeddings {} is not a square grid",
                config.num_position_embeddings
            ))
        } else if config.out_hidden_size != text_hidden {
            Some(format!(
                "out_hidden_size {} is not the text model's width {text_hidden}",
                config.out_hidden_size
            ))
        } else if let Some(&deepest) = config.deepstack_visual_indexes.iter().max()
            && deepest >= config.depth
        {
            Some(format!(
                "deepstack_visual_indexes names block {deepest} of {}",
                config.depth
            ))
        } else {
            None
        };
        if let Some(message) = problem {
            return Err(LoadError::ConfigInvalid {
                path: weights.dir.join("config.json"),
                message: format!("vision_config: {message}"),
            });
        }
        let w = weights;
        let (t, k, c) = (
            config.temporal_patch_size as i32,
            config.patch_size as i32,
            config.in_channels as i32,
        );
        let hi = h as i32;
        let kernel_name = "vision_tower.patch_embed.proj.weight".to_owned();
        let kernel = w.take_stored(&kernel_name)?;
        let stored = kernel.array.shape().to_vec();
        // As a matrix over the patch flattened channel, time, row, column
        // (the processor's order).
        let patch_weight = if stored == [hi, t, k, k, c] {
            kernel.array.transpose_axes(&[0, 4, 1, 2, 3])?
        } else if stored == [hi, c, t, k, k] {
            kernel.array
        } else {
            return Err(LoadError::TensorShape {
                tensor: kernel_name,
                file: kernel.file,
                expected: vec![hi, t, k, k, c],
                found: stored,
            });
        }
        .reshape(&[hi, c * t * k * k])?;
        let patch_bias = w.take_float("vision_tower.patch_embed.proj.bias", &[hi])?;
        let position_table = take_matrix(
            w,
            "vision_tower.pos_embed",
            config.num_position_embeddings,
            h,
            quant,
        )?;
        let i = config.intermediate_size;
        let mut blocks = Vec::with_capacity(config.depth);
        for n in 0..config.depth {
            let p = format!("vision_tower.blocks.{n}");
            blocks.push(Block {
                norm1: LayerNorm::take(w, &format!("{p}.norm1"), h)?,
                norm2: LayerNorm::take(w, &format!("{p}.norm2"), h)?,
                qkv: take_dense(w, &format!("{p}.attn.qkv"), 3 * h, h, quant)?,
                proj: take_dense(w, &format!("{p}.attn.proj"), h, h, quant)?,
                fc1: take_dense(w, &format!("{p}.mlp.linear_fc1"), i, h, quant)?,
                fc2: take_dense(w, &format!("{p}.mlp.linear_fc2"), h, i, quant)?,
            });
        }
        let merger = Merger::take(w, "vision_tower.merger", &config, false, quant)?;
        let deepstack = (0..config.deepstack_visual_indexes.len())
            .map(|n| {
                Merger::take(
                    w,
                    &format!("vision_tower.deepstack_merger_list.{n}"),
                    &config,
                    true,
                    quant,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            config,
            patch_weight,
            patch_bias,
            position_table,
            blocks,
            merger,
            deepstack,
        })
    }

    /// Every weight array (to evaluate at load and count bytes).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.patch_weight, &self.patch_bias, &self.position_table];
        for b in &self.blocks {
            for dense in [&b.qkv, &b.proj, &b.fc1, &b.fc2] {
                all.push(&dense.weight);
                all.push(&dense.bias);
            }
            for norm in [&b.norm1, &b.norm2] {
                all.push(&norm.weight);
                all.push(&norm.bias);
            }
        }
        all.extend(self.merger.arrays());
        for m in &self.deepstack {
            all.extend(m.arrays());
        }
        all
    }

    /// The dtype the tower computes in (its weights').
    pub fn dtype(&self) -> Dtype {
        self.patch_weight.dtype()
    }

    /// The learned positions of a `rows` x `cols` patch grid `[patches,
    /// hidden]`, in the patches' order: the square table sampled
    /// bilinearly at evenly spaced points from corner to corner. The
    /// sample points and weights are MLX's float32 arithmetic (its
    /// `linspace`), so they round as the reference's do.
    fn positions(&self, rows: i32, cols: i32) -> Result<Array, Exception> {
        let side = (self.config.num_position_embeddings as f64).sqrt() as i32;
        let last = (side - 1) as f32;
        let points = |n: i32| -> Result<(Array, Array, Array), Exception> {
            let at = ops::linspace::<f32, f32>(
                0.0,
                last,
                ops::LinspaceOptions {
                    count: n,
                    endpoint: true,
                },
            )?;
            let floor = at.as_type::<i32>()?;
            let ceil = ops::minimum(
                &ops::add(&floor, Array::from_int(1))?,
                Array::from_int(side - 1),
            )?;
            let frac = ops::subtract(&at, &floor.as_type::<f32>()?)?;
            Ok((floor, ceil, frac))
        };
        let (row_floor, row_ceil, dr) = points(rows)?;
        let (col_floor, col_ceil, dc) = points(cols)?;
        let one = Array::from_f32(1.0);
        let (ur, uc) = (ops::subtract(&one, &dr)?, ops::subtract(&one, &dc)?);
        let column = |a: &Array| a.reshape(&[-1, 1]);
        let row = |a: &Array| a.reshape(&[1, -1]);
        let side_a = Array::from_int(side);
        let index = |r: &Array, c: &Array| -> Result<Array, Exception> {
            ops::add(&column(&ops::multiply(r, &side_a)?)?, &row(c)?)?.reshape(&[-1])
        };
        let weight = |a: &Array, b: &Array| -> Result<Array, Exception> {
            ops::multiply(&column(a)?, &row(b)?)?
                .reshape(&[-1, 1])?
                .as_dtype(self.position_table.dtype())
        };
        let corners = [
            (index(&row_floor, &col_floor)?, weight(&ur, &uc)?),
            (index(&row_floor, &col_ceil)?, weight(&ur, &dc)?),
            (index(&row_ceil, &col_floor)?, weight(&dr, &uc)?),
            (index(&row_ceil, &col_ceil)?, weight(&dr, &dc)?),
        ];
        let mut sum: Option<Array> = None;
        for (index, weight) in &corners {
            let term = ops::multiply(&self.position_table.take_axis(index, 0)?, weight)?;
            sum = Some(match sum {
                Some(s) => ops::add(&s, &term)?,
                None => term,
            });
        }
        let m = self.config.spatial_merge_size as i32;
        let h = self.config.hidden_size as i32;
        sum.expect("four corners")
            .reshape(&[rows / m, m, cols / m, m, h])?
            .transpose_axes(&[0, 2, 1, 3, 4])?
            .reshape(&[rows * cols, h])
    }

    /// The rotary angles `[patches, head_dim / 2]` of a `rows` x `cols`
    /// grid, in the patches' order: the row's angles, then the column's.
    fn angles(&self, rows: i32, cols: i32) -> Result<Array, Exception> {
        let head_dim = (self.config.hidden_size / self.config.num_heads) as i32;
        let dim = head_dim / 2;
        let inverse = ops::divide(Array::from_f32(1.0), base_freqs(dim, ROPE_BASE)?)?;
        let table = ops::outer(&Array::arange::<_, f32>(0, rows.max(cols), 1)?, &inverse)?;
        let m = self.config.spatial_merge_size as i32;
        let (mut row_at, mut col_at) = (Vec::new(), Vec::new());
        for block_row in 0..rows / m {
            for block_col in 0..cols / m {
                for inner_row in 0..m {
                    for inner_col in 0..m {
                        row_at.push(block_row * m + inner_row);
                        col_at.push(block_col * m + inner_col);
                    }
                }
            }
        }
        let n = row_at.len() as i32;
        let by_row = table.take_axis(Array::from_slice(&row_at, &[n]), 0)?;
        let by_col = table.take_axis(Array::from_slice(&col_at, &[n]), 0)?;
        ops::concatenate(&[by_row, by_col], -1)
    }

    /// The image tokens of one image's `patches` `[rows * cols,
    /// patch_values]` (in the tower's dtype) on a `rows` x `cols` grid.
    pub fn encode(
        &self,
        patches: &Array,
        rows: usize,
        cols: usize,
    ) -> Result<QwenImageFeatures, Exception> {
        let (rows, cols) = (rows as i32, cols as i32);
        let n = rows * cols;
        let h = self.config.hidden_size as i32;
        let heads = self.config.num_heads as i32;
        let head_dim = h / heads;
        let embedded = ops::addmm(&self.patch_bias, patches, self.patch_weight.t(), None, None)?;
        let mut x = ops::add(&embedded, &self.positions(rows, cols)?)?;
        // cos and sin over a whole head: the angles twice, for the halves
        // rotate_half pairs.
        let angles = self.angles(rows, cols)?;
        let angles = ops::concatenate(&[&angles, &angles], -1)?.reshape(&[n, 1, head_dim])?;
        let (cos, sin) = (ops::cos(&angles)?, ops::sin(&angles)?);
        let rotate = |x: &Array| -> Result<Array, Exception> {
            let half = head_dim / 2;
            let (first, second) = (x.index((.., .., ..half)), x.index((.., .., half..)));
            let turned = ops::concatenate(&[&ops::negative(&second)?, &first], -1)?;
            ops::add(&ops::multiply(x, &cos)?, &ops::multiply(&turned, &sin)?)?.as_dtype(x.dtype())
        };
        // The fused attention kernels take head sizes of 64, 80 and 128: a
        // smaller head is padded with zeros there (which changes no score)
        // and the padding cut from the output.
        let padded = [64, 80, 128]
            .into_iter()
            .find(|&p| head_dim <= p)
            .unwrap_or(head_dim);
        let pad = |x: Array| -> Result<Array, Exception> {
            if padded == head_dim {
                return Ok(x);
            }
            let zeros = ops::zeros_dtype(&[1, heads, n, padded - head_dim], x.dtype())?;
            ops::concatenate(&[x, zeros], -1)
        };
        let scale = (head_dim as f32).powf(-0.5);
        let mut deepstack = Vec::with_capacity(self.deepstack.len());
        for (number, block) in self.blocks.iter().enumerate() {
            let normed = block.norm1.forward(&x, EPS)?;
            let qkv = block
                .qkv
                .forward(&normed)?
                .reshape(&[n, 3, heads, head_dim])?;
            let part = |i: i32| qkv.index((.., i, .., ..));
            let heads_first = |x: Array| {
                x.reshape(&[1, n, heads, head_dim])?
                    .transpose_axes(&[0, 2, 1, 3])
            };
            let q = pad(heads_first(rotate(&part(0))?)?)?;
            let k = pad(heads_first(rotate(&part(1))?)?)?;
            let v = pad(heads_first(part(2))?)?;
            let attended = fast::scaled_dot_product_attention(q, k, v, scale, None, None)?
                .index((.., .., .., ..head_dim))
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[n, h])?;
            x = ops::add(&x, &block.proj.forward(&attended)?)?;
            let inner = gelu_approx(&block.fc1.forward(&block.norm2.forward(&x, EPS)?)?)?;
            x = ops::add(&x, &block.fc2.forward(&inner)?)?;
            if let Some(tap) = self
                .config
                .deepstack_visual_indexes
                .iter()
                .position(|&i| i == number)
            {
                deepstack.push(self.deepstack[tap].forward(&x)?);
            }
        }
        Ok(QwenImageFeatures {
            main: self.merger.forward(&x)?,
            deepstack,
        })
    }
}
