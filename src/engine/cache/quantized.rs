//! A KV cache held in 4 or 8 bits, with mlx-lm's semantics (`kv_bits`,
//! `kv_group_size`, `quantized_kv_start`), and attention over it.
//!
//! Keys and values are quantized along the head dimension with MLX's
//! affine quantization: each group of `group_size` elements of one
//! position keeps a scale and a bias (in the model's float dtype) and its
//! elements in `bits` bits, packed into `uint32`s. Positions are quantized
//! independently of each other, so a cache grows, trims and batches on the
//! positions axis exactly as the float one does, and a quantized position
//! never changes once written.
//!
//! A growing cache made with a `KvQuantization` switches to this kind at
//! the start of the first forward pass after it holds `start` positions
//! (its whole content is quantized then, and every later position as it
//! comes). mlx-lm checks after each forward pass (each prefill chunk and
//! each decode step) whether the cache's offset reached
//! `quantized_kv_start`; checking before the next pass sees the same
//! offsets, so both quantize at the same token. Rotating caches (a bounded
//! `max_kv_size`, sliding windows) stay in floats: mlx-lm's
//! `RotatingKVCache.to_quantized` raises "not yet implemented", so its
//! `maybe_quantize_kv_cache` never converts one either.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, ops};

use super::{AttentionMask, KvCache, STEP, write_positions};

/// How a growing KV cache is quantized, and from when: mlx-lm's `kv_bits`,
/// `kv_group_size` and `quantized_kv_start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    /// Bits per element: 4 or 8.
    pub bits: i32,
    /// Elements of one position sharing a scale and a bias: 32, 64 or 128.
    pub group_size: i32,
    /// The cache is quantized once it holds this many positions.
    pub start: i32,
}

impl KvQuantization {
    /// Elements one `uint32` holds.
    fn per_word(&self) -> i32 {
        32 / self.bits
    }

    /// Says why these settings cannot quantize keys and values of
    /// `head_dims` elements per head (one per layer quantized), if they
    /// cannot.
    pub fn check(&self, head_dims: &[i32]) -> Result<(), String> {
        if !matches!(self.bits, 4 | 8) {
            return Err(format!(
                "kv_bits is {}; a quantized KV cache holds 4 or 8 bits per element",
                self.bits
            ));
        }
        if !matches!(self.group_size, 32 | 64 | 128) {
            return Err(format!(
                "kv_group_size is {}; MLX quantizes in groups of 32, 64 or 128 elements",
                self.group_size
            ));
        }
        if let Some(dim) = head_dims.iter().find(|&&d| d % self.group_size != 0) {
            return Err(format!(
                "kv_group_size {} does not divide the model's head dimension {dim}; \
                 choose a group size that does (32 divides more)",
                self.group_size
            ));
        }
        Ok(())
    }

    /// Bytes one position of `elements` float elements takes once
    /// quantized, its scales and biases (`float_bytes` each) included.
    pub fn bytes_per_position(&self, elements: u64, float_bytes: u64) -> u64 {
        let packed = elements * self.bits as u64 / 8;
        let groups = elements / self.group_size.max(1) as u64;
        packed + 2 * groups * float_bytes
    }
}

/// One side (keys or values) of a quantized cache, `[B, H, positions, _]`
/// each: the packed elements (`uint32`), and a scale and a bias per group.
#[derive(Clone)]
pub struct QuantizedArrays {
    pub packed: Array,
    pub scales: Array,
    pub biases: Array,
}

impl QuantizedArrays {
    /// `x` (`[B, H, n, D]`) quantized along its last axis.
    pub fn quantize(x: &Array, q: KvQuantization) -> Result<Self, Exception> {
        let (packed, scales, biases) = ops::quantize(x, q.group_size, q.bits)?;
        Ok(Self {
            packed,
            scales,
            biases,
        })
    }

    /// The float array these stand for, in the scales' dtype.
    pub fn dequantize(&self, q: KvQuantization) -> Result<Array, Exception> {
        ops::dequantize(
            &self.packed,
            &self.scales,
            &self.biases,
            q.group_size,
            q.bits,
        )
    }

    /// The three arrays, in the order they are stored.
    pub fn parts(&self) -> [&Array; 3] {
        [&self.packed, &self.scales, &self.biases]
    }

    /// The same operation applied to each of the three arrays.
    pub fn map(&self, f: impl Fn(&Array) -> Result<Array, Exception>) -> Result<Self, Exception> {
        Ok(Self {
            packed: f(&self.packed)?,
            scales: f(&self.scales)?,
            biases: f(&self.biases)?,
        })
    }

    /// Rebuilt from three arrays in `parts`' order.
    pub fn from_parts(parts: [Array; 3]) -> Self {
        let [packed, scales, biases] = parts;
        Self {
            packed,
            scales,
            biases,
        }
    }

    /// The first `n` positions.
    fn head(&self, n: i32) -> Result<Self, Exception> {
        self.map(|a| Ok(a.index((.., .., ..n, ..))))
    }

    /// Positions the arrays have room for.
    fn capacity(&self) -> i32 {
        self.packed.shape()[2]
    }

    /// Bytes of `positions` positions (all three arrays).
    fn bytes_of(&self, positions: i32) -> usize {
        let capacity = self.capacity().max(1) as usize;
        self.parts()
            .iter()
            .map(|a| a.nbytes() / capacity * positions.max(0) as usize)
            .sum()
    }
}

/// What attention reads from a layer's cache after the new positions are
/// written: float keys and values, or quantized ones with their settings.
#[derive(Clone)]
pub enum CachedKv {
    Float(Array, Array),
    Quantized(QuantizedArrays, QuantizedArrays, KvQuantization),
}

impl CachedKv {
    /// Float keys and values (a quantized cache's dequantized): what a
    /// test or a caller that does not attend itself reads.
    pub fn into_float(self) -> Result<(Array, Array), Exception> {
        match self {
            CachedKv::Float(k, v) => Ok((k, v)),
            CachedKv::Quantized(k, v, q) => Ok((k.dequantize(q)?, v.dequantize(q)?)),
        }
    }
}

/// Keys and values of one attention layer held quantized, growing in steps
/// of `STEP` positions like `KvCache`.
pub struct QuantizedKvCache {
    pub(super) keys: Option<QuantizedArrays>,
    pub(super) values: Option<QuantizedArrays>,
    /// Positions in use; the arrays may hold more (spare room).
    pub(super) offset: i32,
    /// In a batch: the padding positions before each row's first token.
    /// Empty for one row.
    pub(super) left_padding: Vec<i32>,
    pub(super) quantization: KvQuantization,
}

impl QuantizedKvCache {
    /// An empty cache quantizing with `quantization`.
    pub fn new(quantization: KvQuantization) -> Self {
        Self {
            keys: None,
            values: None,
            offset: 0,
            left_padding: Vec::new(),
            quantization,
        }
    }

    /// `float`'s positions quantized (its spare room left behind), its
    /// batch padding kept.
    pub fn from_float(float: &KvCache, quantization: KvQuantization) -> Result<Self, Exception> {
        let mut cache = Self::new(quantization);
        cache.left_padding = float.left_padding.clone();
        if let Some((k, v)) = float.used() {
            cache.keys = Some(QuantizedArrays::quantize(&k, quantization)?);
            cache.values = Some(QuantizedArrays::quantize(&v, quantization)?);
            cache.offset = float.offset;
        }
        Ok(cache)
    }

    /// Positions already cached (the rope offset of the next token).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The settings the cache quantizes with.
    pub fn quantization(&self) -> KvQuantization {
        self.quantization
    }

    /// In a batch, the padding positions before each row's first token.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// The used keys and values, without spare room.
    pub(super) fn used(&self) -> Option<(QuantizedArrays, QuantizedArrays)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((k.head(self.offset).ok()?, v.head(self.offset).ok()?))
    }

    /// A cache holding exactly `keys` and `values`.
    pub(super) fn holding(
        keys: QuantizedArrays,
        values: QuantizedArrays,
        left_padding: Vec<i32>,
        quantization: KvQuantization,
    ) -> Self {
        let offset = keys.capacity();
        Self {
            keys: Some(keys),
            values: Some(values),
            offset,
            left_padding,
            quantization,
        }
    }

    /// Quantizes and appends `keys` and `values` (`[B, H, n, D]`); returns
    /// every cached position, quantized.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(QuantizedArrays, QuantizedArrays), Exception> {
        let q = self.quantization;
        let added = keys.shape()[2];
        let previous = self.offset;
        let capacity = self.keys.as_ref().map_or(0, QuantizedArrays::capacity);
        if previous + added > capacity {
            let steps = (added + STEP - 1) / STEP;
            let grow = |existing: Option<QuantizedArrays>,
                        new: &Array|
             -> Result<QuantizedArrays, Exception> {
                let shape = new.shape();
                let (b, h, dim) = (shape[0], shape[1], shape[3]);
                let room = |last: i32, dtype: Dtype| {
                    ops::zeros_dtype(&[b, h, steps * STEP, last], dtype)
                };
                let groups = dim / q.group_size;
                let fresh = QuantizedArrays {
                    packed: room(dim / q.per_word(), Dtype::Uint32)?,
                    scales: room(groups, new.dtype())?,
                    biases: room(groups, new.dtype())?,
                };
                match existing {
                    // Cut unused spare room first so the used part stays contiguous.
                    Some(old) => {
                        let used = old.head(previous)?;
                        let parts = [
                            ops::concatenate(&[&used.packed, &fresh.packed], 2)?,
                            ops::concatenate(&[&used.scales, &fresh.scales], 2)?,
                            ops::concatenate(&[&used.biases, &fresh.biases], 2)?,
                        ];
                        Ok(QuantizedArrays::from_parts(parts))
                    }
                    None => Ok(fresh),
                }
            };
            self.keys = Some(grow(self.keys.take(), keys)?);
            self.values = Some(grow(self.values.take(), values)?);
        }
        self.offset += added;
        let new_keys = QuantizedArrays::quantize(keys, q)?;
        let new_values = QuantizedArrays::quantize(values, q)?;
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            return Err(Exception::custom("quantized KV cache lost its arrays"));
        };
        let end = self.offset;
        let write = |held: &QuantizedArrays, new: &QuantizedArrays| {
            Ok::<_, Exception>(QuantizedArrays {
                packed: write_positions(&held.packed, &new.packed, previous, end)?,
                scales: write_positions(&held.scales, &new.scales, previous, end)?,
                biases: write_positions(&held.biases, &new.biases, previous, end)?,
            })
        };
        *k = write(k, &new_keys)?;
        *v = write(v, &new_values)?;
        Ok((k.head(end)?, v.head(end)?))
    }

    /// Forgets the last `n` positions; returns how many were dropped.
    pub fn trim(&mut self, n: i32) -> i32 {
        let dropped = n.clamp(0, self.offset);
        self.offset -= dropped;
        dropped
    }

    /// Bytes of the positions in use: packed elements, scales and biases.
    pub fn nbytes(&self) -> usize {
        let side = |s: &Option<QuantizedArrays>| s.as_ref().map_or(0, |a| a.bytes_of(self.offset));
        side(&self.keys) + side(&self.values)
    }

    /// The arrays to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<&Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flat_map(QuantizedArrays::parts)
            .collect()
    }
}

/// The most negative finite value of `dtype`: what a hidden score becomes,
/// so that softmax gives it no weight.
fn lowest(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// Attention of `queries` (`[B, heads, L, D]`) over quantized keys and
/// values (`[B, kv_heads, K, _]`), `[B, heads, L, D_v]` out: the scaled
/// queries times the keys (a quantized matmul against the transposed
/// keys), masked, a softmax in float32 precision, times the values (a
/// quantized matmul). Query heads sharing a KV head (grouped-query
/// attention) are reshaped into `[B, kv_heads, repeats, L, D]` so each
/// group meets its own KV head without copying the cache.
pub fn quantized_attention(
    queries: &Array,
    keys: &QuantizedArrays,
    values: &QuantizedArrays,
    scale: f32,
    mask: &AttentionMask,
    q: KvQuantization,
) -> Result<Array, Exception> {
    let shape = queries.shape();
    let (b, heads, l, d) = (shape[0], shape[1], shape[2], shape[3]);
    let kv_heads = keys.packed.shape()[1];
    let repeats = heads / kv_heads.max(1);
    let scale = Array::from_f32(scale).as_dtype(queries.dtype())?;
    let mut scaled = ops::multiply(queries, &scale)?;
    let grouped = |side: &QuantizedArrays| side.map(|a| a.expand_dims(-3));
    let (keys, values) = if repeats > 1 {
        scaled = scaled.reshape(&[b, kv_heads, repeats, l, d])?;
        (grouped(keys)?, grouped(values)?)
    } else {
        (keys.clone(), values.clone())
    };
    let mut scores = ops::quantized_matmul(
        &scaled,
        &keys.packed,
        &keys.scales,
        &keys.biases,
        true,
        q.group_size,
        q.bits,
    )?;
    let key_count = *scores.shape().last().unwrap_or(&0);
    let mask = match mask {
        AttentionMask::None => None,
        // The queries are the last `l` of the `key_count` positions.
        AttentionMask::Causal => {
            let queries_at =
                Array::arange::<_, i32>(key_count - l, key_count, 1)?.reshape(&[l, 1])?;
            let keys_at = Array::arange::<_, i32>(0, key_count, 1)?.reshape(&[1, key_count])?;
            Some(ops::ge(&queries_at, &keys_at)?)
        }
        AttentionMask::Array(m) if repeats > 1 && m.ndim() > 3 => Some(m.expand_dims(-3)?),
        AttentionMask::Array(m) => Some(m.clone()),
    };
    if let Some(mask) = mask {
        scores = if mask.dtype() == Dtype::Bool {
            let hidden = Array::from_f32(lowest(scores.dtype())).as_dtype(scores.dtype())?;
            ops::select(&mask, &scores, &hidden)?
        } else {
            ops::add(&scores, &mask)?
        };
    }
    let weights = ops::softmax_axis(&scores, -1, true)?;
    let out = ops::quantized_matmul(
        &weights,
        &values.packed,
        &values.scales,
        &values.biases,
        false,
        q.group_size,
        q.bits,
    )?;
    if repeats > 1 {
        let value_dim = *out.shape().last().unwrap_or(&d);
        out.reshape(&[b, heads, l, value_dim])
    } else {
        Ok(out)
    }
}
