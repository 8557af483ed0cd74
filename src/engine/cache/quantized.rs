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
                let room =
                    |last: i32, dtype: Dtype| ops::zeros_dtype(&[b, h, steps * STEP, last], dtype);
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

#[cfg(test)]
mod tests {
    use super::super::LayerCache;
    use super::*;
    use mlx_rs::random;

    const EIGHT: KvQuantization = KvQuantization {
        bits: 8,
        group_size: 32,
        start: 0,
    };

    /// `[b, h, n, d]` normal values from `seed`.
    fn normal(shape: &[i32], seed: u64) -> Array {
        let key = random::key(seed).unwrap();
        random::normal::<f32>(shape, 0.0, 1.0, &key).unwrap()
    }

    fn floats(a: &Array) -> Vec<f32> {
        let a = a.as_dtype(Dtype::Float32).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    fn largest_difference(a: &Array, b: &Array) -> f32 {
        let (a, b) = (floats(a), floats(b));
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// What quantizing `x` at once and reading it back gives.
    fn round_trip(x: &Array, q: KvQuantization) -> Array {
        QuantizedArrays::quantize(x, q)
            .unwrap()
            .dequantize(q)
            .unwrap()
    }

    #[test]
    fn positions_come_back_as_quantizing_them_at_once_gives_across_growth() {
        for bits in [4, 8] {
            let q = KvQuantization { bits, ..EIGHT };
            let keys = normal(&[1, 2, 300, 64], 1);
            let values = normal(&[1, 2, 300, 64], 2);
            let mut cache = QuantizedKvCache::new(q);
            cache
                .update_and_fetch(
                    &keys.index((.., .., ..260, ..)),
                    &values.index((.., .., ..260, ..)),
                )
                .unwrap();
            let mut last = None;
            for p in 260..300 {
                last = Some(
                    cache
                        .update_and_fetch(
                            &keys.index((.., .., p..p + 1, ..)),
                            &values.index((.., .., p..p + 1, ..)),
                        )
                        .unwrap(),
                );
            }
            assert_eq!(cache.offset(), 300);
            let (k, v) = last.unwrap();
            assert_eq!(k.packed.shape(), &[1, 2, 300, 64 * bits / 32]);
            // Positions are quantized on their own: exactly as all at once.
            assert_eq!(
                floats(&k.dequantize(q).unwrap()),
                floats(&round_trip(&keys, q))
            );
            assert_eq!(
                floats(&v.dequantize(q).unwrap()),
                floats(&round_trip(&values, q))
            );
            // And within the quantization's error of the floats.
            let error = largest_difference(&k.dequantize(q).unwrap(), &keys);
            let bound = if bits == 8 { 0.03 } else { 0.5 };
            assert!(error < bound, "{bits} bits: error {error}");
        }
    }

    #[test]
    fn a_growing_cache_switches_once_it_holds_the_start_and_keeps_its_positions() {
        let q = KvQuantization { start: 5, ..EIGHT };
        let keys = normal(&[1, 1, 8, 32], 3);
        let mut cache = LayerCache::attention(None, Some(q));
        let chunk = keys.index((.., .., ..4, ..));
        cache.update_and_fetch(&chunk, &chunk).unwrap();
        let step = |cache: &mut LayerCache, p: i32| {
            let k = keys.index((.., .., p..p + 1, ..));
            cache.update_and_fetch_cached(&k, &k).unwrap()
        };
        // 4 positions: below the start, the fifth is written in floats.
        assert!(matches!(step(&mut cache, 4), CachedKv::Float(..)));
        assert!(matches!(cache, LayerCache::Growing(_)));
        // 5 positions: the next pass finds the cache quantized.
        let CachedKv::Quantized(k, _, _) = step(&mut cache, 5) else {
            panic!("the cache holds the start: it is quantized");
        };
        assert!(matches!(cache, LayerCache::Quantized(_)));
        assert_eq!(cache.offset(), 6);
        let held = keys.index((.., .., ..6, ..));
        assert_eq!(
            floats(&k.dequantize(q).unwrap()),
            floats(&round_trip(&held, q))
        );
        // A bounded cache never quantizes.
        let mut bounded = LayerCache::attention(Some(64), Some(q));
        for p in 0..8 {
            let k = keys.index((.., .., p..p + 1, ..));
            assert!(matches!(
                bounded.update_and_fetch_cached(&k, &k).unwrap(),
                CachedKv::Float(..)
            ));
        }
        // Nor does an empty one at start 0 before its first pass: the first
        // chunk attends in floats, as mlx-lm's first chunk does.
        let mut from_zero = LayerCache::attention(None, Some(EIGHT));
        assert!(matches!(
            from_zero.update_and_fetch_cached(&chunk, &chunk).unwrap(),
            CachedKv::Float(..)
        ));
        assert!(matches!(step(&mut from_zero, 4), CachedKv::Quantized(..)));
    }

    #[test]
    fn trim_drops_positions_exactly_and_bytes_count_packed_scales_and_biases() {
        let keys = normal(&[1, 1, 10, 64], 4);
        let mut cache = LayerCache::Quantized(QuantizedKvCache::new(EIGHT));
        cache.update_and_fetch(&keys, &keys).unwrap();
        // Per position and side: 64 bytes of 8-bit elements, 2 groups of 32
        // with a 4-byte scale and a 4-byte bias each.
        assert_eq!(cache.nbytes(), 10 * 2 * (64 + 2 * 2 * 4));
        assert!(cache.can_trim());
        assert_eq!(cache.trim(4).unwrap(), 4);
        assert_eq!(cache.offset(), 6);
        assert_eq!(cache.nbytes(), 6 * 2 * (64 + 2 * 2 * 4));
        let other = normal(&[1, 1, 2, 64], 5);
        let (k, _) = cache.update_and_fetch(&other, &other).unwrap();
        let expected =
            ops::concatenate(&[keys.index((.., .., ..6, ..)), other.clone()], 2).unwrap();
        assert_eq!(floats(&k), floats(&round_trip(&expected, EIGHT)));
        assert_eq!(
            EIGHT.bytes_per_position(64, 4),
            64 + 2 * 2 * 4,
            "the estimate counts what the cache holds"
        );
    }

    /// Float attention over what the quantized cache stands for.
    fn float_attention(
        q: &Array,
        k: &QuantizedArrays,
        v: &QuantizedArrays,
        scale: f32,
        mask: &AttentionMask,
    ) -> Array {
        use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
        let mask = match mask {
            AttentionMask::None => None,
            AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            AttentionMask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        };
        let (k, v) = (k.dequantize(EIGHT).unwrap(), v.dequantize(EIGHT).unwrap());
        fast::scaled_dot_product_attention(q, &k, &v, scale, mask, None).unwrap()
    }

    #[test]
    fn attention_over_the_quantized_cache_equals_attention_over_what_it_holds() {
        // Four query heads over two KV heads (grouped), a causal chunk, a
        // decode step, and a batch whose first row is padded.
        let keys = normal(&[2, 2, 9, 32], 6);
        let values = normal(&[2, 2, 9, 32], 7);
        let (k, v) = (
            QuantizedArrays::quantize(&keys, EIGHT).unwrap(),
            QuantizedArrays::quantize(&values, EIGHT).unwrap(),
        );
        let padded = Array::from_slice(
            &[
                [false; 3].as_slice(),
                [true; 6].as_slice(),
                [true; 9].as_slice(),
            ]
            .concat(),
            &[2, 1, 1, 9],
        );
        let cases = [
            (normal(&[2, 4, 5, 32], 8), AttentionMask::Causal),
            (normal(&[2, 4, 1, 32], 9), AttentionMask::None),
            (normal(&[2, 4, 1, 32], 10), AttentionMask::Array(padded)),
        ];
        for (i, (queries, mask)) in cases.iter().enumerate() {
            let ours = quantized_attention(queries, &k, &v, 0.2, mask, EIGHT).unwrap();
            let reference = float_attention(queries, &k, &v, 0.2, mask);
            assert_eq!(ours.shape(), reference.shape());
            let difference = largest_difference(&ours, &reference);
            assert!(difference < 1e-4, "case {i}: {difference}");
        }
    }

    /// `[1, 1, n, 32]` keys whose every element is its position.
    fn positions(start: i32, n: i32) -> Array {
        let data: Vec<f32> = (start..start + n)
            .flat_map(|p| std::iter::repeat_n(p as f32, 32))
            .collect();
        Array::from_slice(&data, &[1, 1, n, 32])
    }

    /// The positions a quantized layer holds, read back (row `row`).
    fn held(cache: &LayerCache) -> Vec<f32> {
        let LayerCache::Quantized(c) = cache else {
            panic!("a quantized cache stays one");
        };
        let (k, _) = c.used().unwrap();
        floats(&k.dequantize(EIGHT).unwrap())
            .chunks(32)
            .map(|c| c[0])
            .collect()
    }

    fn quantized_rows(lengths: &[i32]) -> Vec<LayerCache> {
        lengths
            .iter()
            .enumerate()
            .map(|(r, &n)| {
                let mut c = LayerCache::Quantized(QuantizedKvCache::new(EIGHT));
                let start = 10 * r as i32;
                c.update_and_fetch(&positions(start, n), &positions(start, n))
                    .unwrap();
                c
            })
            .collect()
    }

    #[test]
    fn quantized_rows_batch_step_and_come_apart_as_each_alone() {
        let lengths = [2, 5, 3];
        let mut alone = quantized_rows(&lengths);
        let mut batch = LayerCache::stack(&quantized_rows(&lengths)).unwrap();
        assert_eq!(batch.rows(), 3);
        assert_eq!(batch.offset(), 5);
        let LayerCache::Quantized(c) = &batch else {
            panic!("quantized rows stack into a quantized batch");
        };
        assert_eq!(c.left_padding(), &[3, 0, 2]);
        let AttentionMask::Array(mask) = batch.batch_mask().unwrap() else {
            panic!("padded rows need a mask");
        };
        assert_eq!(mask.shape(), &[3, 1, 1, 6]);
        // Two decode steps for every row, then each row taken out.
        for step in 0..2 {
            let next: Vec<f32> = lengths
                .iter()
                .enumerate()
                .map(|(r, &n)| (10 * r as i32 + n + step) as f32)
                .collect();
            let data: Vec<f32> = next.iter().flat_map(|&p| [p; 32]).collect();
            let keys = Array::from_slice(&data, &[3, 1, 1, 32]);
            batch.update_and_fetch(&keys, &keys).unwrap();
            for (row, cache) in alone.iter_mut().enumerate() {
                let one = positions(next[row] as i32, 1);
                cache.update_and_fetch(&one, &one).unwrap();
            }
        }
        let offsets: Vec<i32> = lengths.iter().map(|n| n + 2).collect();
        let rows = batch.split(&offsets).unwrap();
        for (row, cache) in rows.iter().enumerate() {
            assert_eq!(cache.offset(), offsets[row]);
            assert_eq!(held(cache), held(&alone[row]), "row {row}");
        }
        // Filtering to the shorter rows drops the padding they share.
        let two = batch.filter(&[0, 2]).unwrap();
        assert_eq!(two.offset(), 5);
        assert_eq!(held(&two.split_row(0, 4).unwrap()), held(&alone[0]));
        // A float row joining a quantized batch is quantized with it.
        let mut float = LayerCache::attention(None, Some(EIGHT));
        float
            .update_and_fetch(&positions(40, 4), &positions(40, 4))
            .unwrap();
        let wider = batch.extend(&[float]).unwrap();
        assert_eq!(wider.rows(), 4);
        assert_eq!(
            held(&wider.split_row(3, 4).unwrap()),
            vec![40., 41., 42., 43.]
        );
        // Other bits do not batch with these.
        let mut four =
            LayerCache::Quantized(QuantizedKvCache::new(KvQuantization { bits: 4, ..EIGHT }));
        four.update_and_fetch(&positions(0, 1), &positions(0, 1))
            .unwrap();
        assert!(batch.extend(&[four]).is_err());
    }

    #[test]
    fn settings_that_cannot_quantize_are_named() {
        assert!(EIGHT.check(&[64, 128]).is_ok());
        let three = KvQuantization { bits: 3, ..EIGHT };
        assert!(three.check(&[64]).unwrap_err().contains("4 or 8"));
        let odd = KvQuantization {
            group_size: 128,
            ..EIGHT
        };
        assert!(odd.check(&[64]).unwrap_err().contains("head dimension 64"));
    }
}
