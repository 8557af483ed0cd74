//! The cache of a model, outside the model: one `LayerCache` per layer (but
//! a layer that reads an earlier layer's keys and values), of one of five
//! kinds.
//!
//! - `KvCache` (growing KV) grows in steps of `STEP` positions and writes
//!   each new position into the spare room, so a decode step costs a slice
//!   update rather than a copy of the whole cache.
//! - `QuantizedKvCache` is a growing cache held in 4 or 8 bits (mlx-lm's
//!   `kv_bits`): a growing cache made with a `KvQuantization` becomes one
//!   once it holds `quantized_kv_start` positions (`quantized`).
//! - `RotatingKvCache` holds at most `max_kv_size` positions for long
//!   conversations (or a sliding window): it keeps the first tokens and
//!   overwrites the oldest of the rest, with mlx-lm's semantics.
//! - `ConvState` holds the last `kernel - 1` inputs of a short causal
//!   convolution (LFM2's short-convolution layers): constant in length.
//! - `RecurrentState` holds a gated-delta layer's convolution inputs and its
//!   recurrent matrix `[B, heads, v_dim, k_dim]`: constant in length too.
//!
//! KV kinds can drop their last positions exactly (`trim`); state kinds
//! cannot (every token is mixed into the state), so a prefix is reused
//! through a `CacheSnapshot` taken at a token boundary: the state layers'
//! arrays (small and constant-size; MLX arrays are immutable, so a handle
//! keeps those values) and the position, to which the KV layers are
//! trimmed. KV layers are never snapshotted by keeping array handles: a
//! second reference to a KV buffer stops MLX from donating it to the next
//! slice update, and every decode step's write would become a copy.
//!
//! The batch operations (`stack`, `split`, `filter`, in `batch`) join
//! one-row caches into one batch, take it apart again and keep some rows: the KV kinds
//! left-pad each row to the longest and record each row's padding, as
//! mlx-lm's `BatchKVCache` does.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Stream, ops};

mod batch;
pub mod file;
mod quantized;

pub use quantized::{
    CachedKv, KvQuantization, QuantizedArrays, QuantizedKvCache, quantized_attention,
};

/// Positions added whenever the cache runs out of room.
pub const STEP: i32 = 256;

/// `cache` (`[B, H, positions, D]`) with `update` written over positions
/// `start..stop`, as one `SliceUpdate`. mlx-rs's index assignment does the
/// same write between two reshapes (dropping the update's leading unit axes
/// and restoring them): two more primitives per write, four per layer per
/// token, each one more node for the host to build and hand to the GPU.
fn write_positions(
    cache: &Array,
    update: &Array,
    start: i32,
    stop: i32,
) -> Result<Array, Exception> {
    let shape = cache.shape();
    if shape.len() != 4 {
        return Err(Exception::custom(format!(
            "a KV cache has 4 axes, this one {shape:?}"
        )));
    }
    let starts = [0, 0, start, 0];
    let stops = [shape[0], shape[1], stop, shape[3]];
    let strides = [1; 4];
    let stream = Stream::thread_local_or_default();
    // SAFETY: every pointer is valid for the call; `result` is either
    // handed to an `Array` (which frees it) or freed here.
    unsafe {
        let mut result = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_slice_update(
            &mut result,
            cache.as_ptr(),
            update.as_ptr(),
            starts.as_ptr(),
            starts.len(),
            stops.as_ptr(),
            stops.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(result);
            return Err(Exception::custom(format!(
                "MLX could not write positions {start}..{stop} of a KV cache of shape {shape:?} \
                 with an update of shape {:?}",
                update.shape()
            )));
        }
        Ok(Array::from_ptr(result))
    }
}

/// Why a cache cannot do what was asked of it.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(
        "a {kind} cannot drop positions (every token is mixed into its state); restore a \
         snapshot taken at or before the position, or start over"
    )]
    CannotTrim { kind: &'static str },
    #[error(
        "a rotating KV cache that has wrapped no longer holds the positions it would go back \
         to; start over"
    )]
    Wrapped,
    #[error("{0}")]
    Mismatch(String),
    #[error(transparent)]
    Mlx(#[from] Exception),
}

/// Keys and values of one attention layer, `[batch, kv_heads, positions, head_dim]`.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions in use; the arrays may hold more (spare room).
    offset: i32,
    /// In a batch: the padding positions before each row's first token
    /// (rows are left-padded to the longest). Empty for one row.
    left_padding: Vec<i32>,
    /// Quantize the cache once it holds `start` positions; `None`: stay
    /// in floats.
    quantize: Option<KvQuantization>,
}

impl KvCache {
    /// An empty cache that becomes a quantized one once it holds
    /// `quantize.start` positions (never, for `None`).
    pub fn quantizing(quantize: Option<KvQuantization>) -> Self {
        Self {
            quantize,
            ..Self::default()
        }
    }

    /// The settings this cache quantizes with once due.
    pub fn quantization(&self) -> Option<KvQuantization> {
        self.quantize
    }

    /// Whether the next forward pass should find this cache quantized: it
    /// holds positions, at least `start` of them.
    fn quantization_due(&self) -> Option<KvQuantization> {
        self.quantize
            .filter(|q| self.offset > 0 && self.offset >= q.start)
    }

    /// Positions already cached (the rope offset of the next token).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// In a batch, the padding positions before each row's first token.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// The used keys and values, without spare room.
    fn used(&self) -> Option<(Array, Array)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((
            k.index((.., .., ..self.offset, ..)),
            v.index((.., .., ..self.offset, ..)),
        ))
    }

    /// A cache holding exactly `keys` and `values` (`[B, H, n, D]`).
    fn holding(
        keys: Array,
        values: Array,
        left_padding: Vec<i32>,
        quantize: Option<KvQuantization>,
    ) -> Self {
        let offset = keys.shape()[2];
        Self {
            keys: Some(keys),
            values: Some(values),
            offset,
            left_padding,
            quantize,
        }
    }

    /// Appends `keys` and `values` (`[B, H, n, D]`) and returns the keys and
    /// values of every cached position.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        let added = keys.shape()[2];
        let previous = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if previous + added > capacity {
            let steps = (added + STEP - 1) / STEP;
            let grow = |existing: Option<Array>, new: &Array| -> Result<Array, Exception> {
                let shape = new.shape();
                let room =
                    ops::zeros_dtype(&[shape[0], shape[1], steps * STEP, shape[3]], new.dtype())?;
                match existing {
                    // Cut unused spare room first so the used part stays contiguous.
                    Some(old) => {
                        let used = old.index((.., .., ..previous, ..));
                        ops::concatenate(&[used, room], 2)
                    }
                    None => Ok(room),
                }
            };
            self.keys = Some(grow(self.keys.take(), keys)?);
            self.values = Some(grow(self.values.take(), values)?);
        }
        self.offset += added;
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            return Err(Exception::custom("KV cache lost its arrays"));
        };
        *k = write_positions(k, keys, previous, self.offset)?;
        *v = write_positions(v, values, previous, self.offset)?;
        Ok((
            k.index((.., .., ..self.offset, ..)),
            v.index((.., .., ..self.offset, ..)),
        ))
    }

    /// Forgets the last `n` positions (for reuse of a shared prefix); returns
    /// how many were dropped.
    pub fn trim(&mut self, n: i32) -> i32 {
        let dropped = n.clamp(0, self.offset);
        self.offset -= dropped;
        dropped
    }

    /// Bytes of the positions in use.
    pub fn nbytes(&self) -> usize {
        let per_array = |a: &Option<Array>| {
            a.as_ref().map_or(0, |a| {
                let capacity = a.shape()[2].max(1) as usize;
                a.nbytes() / capacity * self.offset as usize
            })
        };
        per_array(&self.keys) + per_array(&self.values)
    }

    /// The arrays to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
}

/// Leading positions a rotating cache never overwrites: the first tokens
/// (often the BOS and the start of the system prompt) that attention leans
/// on. mlx-lm keeps 4 as well.
pub const ROTATING_KEEP: i32 = 4;

/// The mask an attention call needs for the positions it adds.
pub enum AttentionMask {
    /// One query position: it may see every cached key.
    None,
    /// Several positions, each seeing the keys up to itself.
    Causal,
    /// An explicit boolean mask, true where a query sees a key: `[queries,
    /// keys]` (a window), or `[B, 1, 1, keys]` (a batch's rows, each
    /// without its padding).
    Array(Array),
}

/// Keys and values of one layer holding at most `max_size` positions once
/// the conversation is longer (plus the positions of one prefill chunk, so
/// every token of the chunk still sees `max_size` keys).
pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Every position seen, also those dropped (the rope offset).
    offset: i32,
    max_size: i32,
    keep: i32,
    /// Where the next single position is written.
    write_at: i32,
    /// In a batch: each row's padding, as the positions `start..end` of
    /// `offset`'s count (rows are aligned on their newest position, and a
    /// shorter row's padding sits after its kept positions and before the
    /// rest). Empty for one row.
    padding: Vec<(i32, i32)>,
}

/// Where a rotating cache writes its next single position.
struct NextSlot {
    /// Slots added first (the cache grows toward `max_size` in steps).
    room: i32,
    /// The oldest positions after the kept ones dropped first (a prefill
    /// chunk leaves the cache longer than `max_size`).
    excess: i32,
    /// The slot written.
    slot: i32,
}

impl RotatingKvCache {
    pub fn new(max_size: i32, keep: i32) -> Self {
        Self {
            keys: None,
            values: None,
            offset: 0,
            max_size: max_size.max(keep + 1),
            keep,
            write_at: 0,
            padding: Vec::new(),
        }
    }

    /// Drops `n` positions right after the kept ones, appending `append`.
    fn drop_after_keep(
        &self,
        n: i32,
        v: &Array,
        append: Option<&Array>,
    ) -> Result<Array, Exception> {
        let mut parts = if n > 0 {
            vec![
                v.index((.., .., ..self.keep, ..)),
                v.index((.., .., (n + self.keep).., ..)),
            ]
        } else {
            vec![v.clone()]
        };
        parts.extend(append.cloned());
        ops::concatenate(&parts, 2)
    }

    /// The positions in the order they were seen (undoing the rotation),
    /// without unused room.
    fn in_time_order(&self, v: &Array) -> Result<Array, Exception> {
        let length = v.shape()[2];
        if self.write_at == length {
            Ok(v.clone())
        } else if self.write_at < self.offset {
            ops::concatenate(
                &[
                    v.index((.., .., ..self.keep, ..)),
                    v.index((.., .., self.write_at.., ..)),
                    v.index((.., .., self.keep..self.write_at, ..)),
                ],
                2,
            )
        } else {
            Ok(v.index((.., .., ..self.write_at, ..)))
        }
    }

    /// Several positions at once (a prefill chunk): concatenated in time
    /// order after dropping what no new position may see.
    fn append_many(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array), Exception> {
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(old_k), Some(old_v)) => {
                let old_k = self.in_time_order(&old_k)?;
                let old_v = self.in_time_order(&old_v)?;
                self.write_at = old_k.shape()[2];
                let excess = self.write_at - self.max_size + 1;
                (
                    self.drop_after_keep(excess, &old_k, Some(keys))?,
                    self.drop_after_keep(excess, &old_v, Some(values))?,
                )
            }
            _ => (keys.clone(), values.clone()),
        };
        self.offset += keys.shape()[2];
        self.write_at = k.shape()[2];
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }

    /// Slots the cache has now, used or not.
    fn capacity(&self) -> i32 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2])
    }

    /// Where the next single position goes (`append_one` writes it there;
    /// a batch's mask reads where each position will be).
    fn next_slot(&self) -> NextSlot {
        let capacity = self.capacity();
        let grows = self.keys.is_none() || (self.offset >= capacity && capacity < self.max_size);
        let room = if grows {
            STEP.min(self.max_size - self.offset)
        } else {
            0
        };
        let excess = (capacity + room - self.max_size).max(0);
        let mut slot = if grows { self.offset } else { self.write_at };
        if excess > 0 || slot == self.max_size {
            slot = self.keep;
        }
        NextSlot { room, excess, slot }
    }

    /// The position (of `offset`'s count) each of the first
    /// `min(offset, capacity)` slots holds, for a cache of `capacity` slots
    /// that has seen `offset` positions and writes next at `write_at`: in
    /// order until it has dropped any; then the kept ones, the newest up to
    /// `write_at`, and the oldest from there on.
    fn slot_positions(offset: i32, capacity: i32, write_at: i32, keep: i32) -> Vec<i32> {
        (0..offset.min(capacity))
            .map(|slot| {
                if offset <= capacity || slot < keep {
                    slot
                } else if slot < write_at {
                    offset - write_at + slot
                } else {
                    offset - write_at + slot - (capacity - keep)
                }
            })
            .collect()
    }

    /// One position (a decode step): written in place, over the oldest
    /// position after the kept ones once the cache is full.
    fn append_one(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array), Exception> {
        let next = self.next_slot();
        if next.room > 0 {
            let shape = keys.shape();
            let room = |dtype| ops::zeros_dtype(&[shape[0], shape[1], next.room, shape[3]], dtype);
            let (new_k, new_v) = (room(keys.dtype())?, room(values.dtype())?);
            match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => {
                    self.keys = Some(ops::concatenate(&[k, new_k], 2)?);
                    self.values = Some(ops::concatenate(&[v, new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) else {
            return Err(Exception::custom("rotating KV cache lost its arrays"));
        };
        let (mut k, mut v) = if next.excess > 0 {
            (
                self.drop_after_keep(next.excess, &k, None)?,
                self.drop_after_keep(next.excess, &v, None)?,
            )
        } else {
            (k, v)
        };
        let at = next.slot;
        k = write_positions(&k, keys, at, at + 1)?;
        v = write_positions(&v, values, at, at + 1)?;
        self.offset += 1;
        self.write_at = at + 1;
        let length = k.shape()[2];
        let out = if self.offset < length {
            (
                k.index((.., .., ..self.offset, ..)),
                v.index((.., .., ..self.offset, ..)),
            )
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }

    /// The mask for `n` new positions: causal, windowed once the cache
    /// would let a position see more than `max_size` keys.
    fn mask(&self, n: i32) -> Result<AttentionMask, Exception> {
        if n <= 1 {
            return Ok(AttentionMask::None);
        }
        let seen = (self.max_size - 1).min(self.offset);
        if seen + n <= self.max_size {
            return Ok(AttentionMask::Causal);
        }
        // Query i (at position seen + i) sees key j when j <= seen + i and
        // j > seen + i - max_size.
        let keys = Array::arange::<_, i32>(0, seen + n, 1)?.reshape(&[1, seen + n])?;
        let queries = Array::arange::<_, i32>(seen, seen + n, 1)?.reshape(&[n, 1])?;
        let causal = ops::ge(&queries, &keys)?;
        let window = ops::lt(&queries, ops::add(&keys, Array::from_int(self.max_size))?)?;
        Ok(AttentionMask::Array(ops::logical_and(&causal, &window)?))
    }
}

/// The last `kernel - 1` inputs of a short causal convolution over time,
/// `[B, kernel - 1, channels]`: what the next positions' convolution reads
/// before their own inputs. Its size does not depend on the context.
#[derive(Clone)]
pub struct ConvState {
    /// `None` before the first position (zeros, as the convolution's
    /// left padding).
    inputs: Option<Array>,
    kernel: i32,
    /// Positions seen.
    offset: i32,
}

impl ConvState {
    /// An empty state for a convolution of `kernel` positions.
    pub fn new(kernel: i32) -> Self {
        Self {
            inputs: None,
            kernel: kernel.max(1),
            offset: 0,
        }
    }

    /// Inputs the state keeps (`kernel - 1`).
    pub fn kept(&self) -> i32 {
        self.kernel - 1
    }

    /// Positions seen so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Puts the held inputs before `x` (`[B, n, channels]`) and keeps the
    /// last `kernel - 1` of the result; returns the `[B, kernel - 1 + n,
    /// channels]` inputs a convolution without padding reads to give `n`
    /// outputs.
    pub fn extend(&mut self, x: &Array) -> Result<Array, Exception> {
        let shape = x.shape();
        if shape.len() != 3 {
            return Err(Exception::custom(format!(
                "a convolution state takes [batch, positions, channels], not {shape:?}"
            )));
        }
        let (batch, added, channels) = (shape[0], shape[1], shape[2]);
        let keep = self.kept();
        self.offset += added;
        if keep == 0 {
            return Ok(x.clone());
        }
        let held = match self.inputs.take() {
            Some(held) => held,
            None => ops::zeros_dtype(&[batch, keep, channels], x.dtype())?,
        };
        let padded = ops::concatenate(&[held, x.clone()], 1)?;
        let total = keep + added;
        self.inputs = Some(if added == 1 {
            // A decode step's inputs are `kernel` positions: a view of them
            // keeps nothing larger alive.
            padded.index((.., (total - keep).., ..))
        } else {
            // A chunk's are thousands: a view would keep the whole chunk's
            // buffer alive (and every snapshot of it), so gather the rows
            // into a buffer of their own.
            let rows = Array::arange::<_, i32>(total - keep, total, 1)?;
            padded.take_axis(&rows, 1)?
        });
        Ok(padded)
    }

    /// Bytes of the kept inputs.
    pub fn nbytes(&self) -> usize {
        self.inputs.as_ref().map_or(0, Array::nbytes)
    }

    fn arrays(&self) -> Vec<&Array> {
        self.inputs.iter().collect()
    }
}

/// A gated-delta (DeltaNet) layer's state: the short convolution before the
/// recurrence and the recurrent matrix `[B, heads, v_dim, k_dim]` each
/// position updates. Both are constant in context length.
#[derive(Clone)]
pub struct RecurrentState {
    pub conv: ConvState,
    matrix: Option<Array>,
}

impl RecurrentState {
    /// An empty state whose convolution spans `conv_kernel` positions.
    pub fn new(conv_kernel: i32) -> Self {
        Self {
            conv: ConvState::new(conv_kernel),
            matrix: None,
        }
    }

    /// Positions seen (counted by the convolution, which every position
    /// passes through).
    pub fn offset(&self) -> i32 {
        self.conv.offset()
    }

    /// The recurrent matrix, `None` before the first position (zeros).
    pub fn matrix(&self) -> Option<&Array> {
        self.matrix.as_ref()
    }

    /// Replaces the recurrent matrix with the one after the latest positions.
    pub fn set_matrix(&mut self, matrix: Array) {
        self.matrix = Some(matrix);
    }

    /// Bytes of the convolution inputs and the matrix.
    pub fn nbytes(&self) -> usize {
        self.conv.nbytes() + self.matrix.as_ref().map_or(0, Array::nbytes)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut out = self.conv.arrays();
        out.extend(self.matrix.iter());
        out
    }
}

/// One layer's cache, of one of the five kinds.
pub enum LayerCache {
    Growing(KvCache),
    Quantized(QuantizedKvCache),
    Rotating(RotatingKvCache),
    Conv(ConvState),
    Recurrent(RecurrentState),
}

impl LayerCache {
    /// A growing cache, or a rotating one of `max_kv_size` positions.
    pub fn new(max_kv_size: Option<usize>) -> Self {
        match max_kv_size {
            Some(size) => LayerCache::Rotating(RotatingKvCache::new(
                i32::try_from(size).unwrap_or(i32::MAX),
                ROTATING_KEEP,
            )),
            None => LayerCache::Growing(KvCache::default()),
        }
    }

    /// A full attention layer's cache: rotating at `max_kv_size`
    /// positions, or growing, and then quantized by `quantize` once due.
    /// A rotating cache is never quantized (mlx-lm does not quantize
    /// `RotatingKVCache`: its `to_quantized` raises "not yet implemented").
    pub fn attention(max_kv_size: Option<usize>, quantize: Option<KvQuantization>) -> Self {
        match max_kv_size {
            Some(_) => Self::new(max_kv_size),
            None => LayerCache::Growing(KvCache::quantizing(quantize)),
        }
    }

    /// The cache of a sliding-window layer: it holds the last `window`
    /// positions (plus one prefill chunk) and keeps no leading tokens, as
    /// mlx-lm's sliding-window layers do.
    pub fn window(window: i32) -> Self {
        LayerCache::Rotating(RotatingKvCache::new(window, 0))
    }

    /// Positions seen so far (the rope offset of the next token).
    pub fn offset(&self) -> i32 {
        match self {
            LayerCache::Growing(c) => c.offset(),
            LayerCache::Quantized(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset,
            LayerCache::Conv(c) => c.offset(),
            LayerCache::Recurrent(c) => c.offset(),
        }
    }

    /// What the kind is, in words (for errors).
    pub fn kind(&self) -> &'static str {
        match self {
            LayerCache::Growing(_) => "growing KV cache",
            LayerCache::Quantized(_) => "quantized KV cache",
            LayerCache::Rotating(_) => "rotating KV cache",
            LayerCache::Conv(_) => "convolution state",
            LayerCache::Recurrent(_) => "recurrent state",
        }
    }

    /// Whether the layer keeps a state of constant size rather than keys
    /// and values (what a snapshot holds).
    pub fn is_state(&self) -> bool {
        matches!(self, LayerCache::Conv(_) | LayerCache::Recurrent(_))
    }

    /// Appends `[B, H, n, D]` keys and values; returns what attention sees
    /// as floats (a quantized cache's dequantized).
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        self.update_and_fetch_cached(keys, values)?.into_float()
    }

    /// A growing cache whose quantization is due becomes a quantized one
    /// (before the forward pass that writes to it, so every layer of a
    /// model switches at the same token: they hold the same positions).
    pub fn quantize_if_due(&mut self) -> Result<(), Exception> {
        if let LayerCache::Growing(c) = self
            && let Some(q) = c.quantization_due()
        {
            *self = LayerCache::Quantized(QuantizedKvCache::from_float(c, q)?);
        }
        Ok(())
    }

    /// Appends `[B, H, n, D]` keys and values; returns what attention
    /// reads: floats, or the quantized cache as it is held. A growing
    /// cache whose quantization is due is quantized first.
    pub fn update_and_fetch_cached(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<CachedKv, Exception> {
        self.quantize_if_due()?;
        let float = |(k, v)| CachedKv::Float(k, v);
        match self {
            LayerCache::Growing(c) => c.update_and_fetch(keys, values).map(float),
            LayerCache::Quantized(c) => {
                let (k, v) = c.update_and_fetch(keys, values)?;
                Ok(CachedKv::Quantized(k, v, c.quantization()))
            }
            LayerCache::Rotating(c) if keys.shape()[2] == 1 => {
                c.append_one(keys, values).map(float)
            }
            LayerCache::Rotating(c) => c.append_many(keys, values).map(float),
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => Err(Exception::custom(format!(
                "an attention layer was given a {} instead of a KV cache",
                self.kind()
            ))),
        }
    }

    /// The attention mask for `n` positions about to be added.
    pub fn mask(&self, n: i32) -> Result<AttentionMask, Exception> {
        match self {
            LayerCache::Growing(_) | LayerCache::Quantized(_) if n > 1 => Ok(AttentionMask::Causal),
            LayerCache::Rotating(c) => c.mask(n),
            _ => Ok(AttentionMask::None),
        }
    }

    /// True while the last positions can still be dropped exactly (a
    /// rotating cache that has wrapped has overwritten what came before;
    /// a state mixes every position in).
    pub fn can_trim(&self) -> bool {
        match self {
            LayerCache::Growing(_) | LayerCache::Quantized(_) => true,
            LayerCache::Rotating(c) => c.offset < c.max_size,
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => false,
        }
    }

    /// Forgets the last `n` positions; returns how many were dropped, or
    /// why it cannot.
    pub fn trim(&mut self, n: i32) -> Result<i32, CacheError> {
        if n <= 0 {
            return Ok(0);
        }
        match self {
            LayerCache::Growing(c) => Ok(c.trim(n)),
            LayerCache::Quantized(c) => Ok(c.trim(n)),
            LayerCache::Rotating(c) if c.offset < c.max_size => {
                let dropped = n.clamp(0, c.offset);
                c.offset -= dropped;
                c.write_at -= dropped;
                Ok(dropped)
            }
            LayerCache::Rotating(_) => Err(CacheError::Wrapped),
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => {
                Err(CacheError::CannotTrim { kind: self.kind() })
            }
        }
    }

    /// Bytes of the positions or state held.
    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Growing(c) => c.nbytes(),
            LayerCache::Quantized(c) => c.nbytes(),
            LayerCache::Rotating(c) => {
                let held = |a: &Option<Array>| {
                    a.as_ref().map_or(0, |a| {
                        let capacity = a.shape()[2].max(1) as usize;
                        a.nbytes() / capacity * (c.offset.min(capacity as i32) as usize)
                    })
                };
                held(&c.keys) + held(&c.values)
            }
            LayerCache::Conv(c) => c.nbytes(),
            LayerCache::Recurrent(c) => c.nbytes(),
        }
    }

    /// The arrays to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Growing(c) => c.state(),
            LayerCache::Quantized(c) => c.state(),
            LayerCache::Rotating(c) => c.keys.iter().chain(c.values.iter()).collect(),
            LayerCache::Conv(c) => c.arrays(),
            LayerCache::Recurrent(c) => c.arrays(),
        }
    }

    /// The convolution state of a short-convolution layer.
    pub fn conv_mut(&mut self) -> Result<&mut ConvState, Exception> {
        match self {
            LayerCache::Conv(c) => Ok(c),
            other => Err(Exception::custom(format!(
                "a convolution layer was given a {} instead of a convolution state",
                other.kind()
            ))),
        }
    }

    /// The state of a gated-delta layer.
    pub fn recurrent_mut(&mut self) -> Result<&mut RecurrentState, Exception> {
        match self {
            LayerCache::Recurrent(c) => Ok(c),
            other => Err(Exception::custom(format!(
                "a gated-delta layer was given a {} instead of a recurrent state",
                other.kind()
            ))),
        }
    }

    /// A copy of a state layer's arrays (handles: MLX arrays never change),
    /// `None` for KV layers.
    fn snapshot(&self) -> Option<LayerCache> {
        match self {
            LayerCache::Conv(c) => Some(LayerCache::Conv(c.clone())),
            LayerCache::Recurrent(c) => Some(LayerCache::Recurrent(c.clone())),
            LayerCache::Growing(_) | LayerCache::Quantized(_) | LayerCache::Rotating(_) => None,
        }
    }
}

/// A model's cache as it was at a token boundary, for reusing a prefix of
/// a model with state layers: each state layer's arrays (small, constant
/// in length; held as handles, which is free until the live state moves
/// on, and then costs `nbytes`), and the position, to which the KV layers
/// are trimmed when it is restored (KV layers keep nothing here: see the
/// module comment on donation).
pub struct CacheSnapshot {
    /// Tokens the cache had seen.
    pub position: usize,
    layers: Vec<Option<LayerCache>>,
}

impl CacheSnapshot {
    /// The state layers of `cache` as they are now; `None` when it has no
    /// state layers (a KV cache is trimmed exactly instead).
    pub fn take(cache: &[LayerCache]) -> Option<Self> {
        if !cache.iter().any(LayerCache::is_state) {
            return None;
        }
        let position = cache.first().map_or(0, LayerCache::offset).max(0) as usize;
        Some(Self {
            position,
            layers: cache.iter().map(LayerCache::snapshot).collect(),
        })
    }

    /// Bytes the snapshot's state arrays hold.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().flatten().map(LayerCache::nbytes).sum()
    }

    /// Puts `cache` back at this snapshot's position: the state layers
    /// replaced by the snapshot's, the KV layers trimmed. Fails (leaving
    /// the cache to be started over) when the cache is behind the snapshot,
    /// has other layers, or a KV layer cannot be trimmed.
    pub fn restore(&self, cache: &mut [LayerCache]) -> Result<(), CacheError> {
        if cache.len() != self.layers.len() {
            return Err(CacheError::Mismatch(format!(
                "a snapshot of {} layers cannot restore a cache of {}",
                self.layers.len(),
                cache.len()
            )));
        }
        let position = i32::try_from(self.position).unwrap_or(i32::MAX);
        for (layer, kept) in cache.iter_mut().zip(&self.layers) {
            let behind = layer.offset() - position;
            if behind < 0 {
                return Err(CacheError::Mismatch(format!(
                    "the cache holds {} positions, fewer than the snapshot's {position}",
                    layer.offset()
                )));
            }
            match kept.as_ref().and_then(LayerCache::snapshot) {
                Some(state) => *layer = state,
                None => {
                    layer.trim(behind)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn positions(start: i32, n: i32) -> Array {
        // [1, 1, n, 2] with values equal to the position, to see where they land.
        let data: Vec<f32> = (start..start + n)
            .flat_map(|p| [p as f32, p as f32])
            .collect();
        Array::from_slice(&data, &[1, 1, n, 2])
    }

    #[test]
    fn positions_come_back_in_order_across_growth() {
        let mut cache = KvCache::default();
        let (k, _) = cache
            .update_and_fetch(&positions(0, 300), &positions(0, 300))
            .unwrap();
        assert_eq!(k.shape(), &[1, 1, 300, 2]);
        for p in 300..520 {
            cache
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
        }
        let (k, v) = cache
            .update_and_fetch(&positions(520, 5), &positions(520, 5))
            .unwrap();
        assert_eq!(cache.offset(), 525);
        k.eval().unwrap();
        let expected: Vec<f32> = (0..525).flat_map(|p| [p as f32, p as f32]).collect();
        assert_eq!(k.as_slice::<f32>(), &expected[..]);
        v.eval().unwrap();
        assert_eq!(v.as_slice::<f32>(), &expected[..]);
    }

    /// A decode step's cache write is one primitive, and the read of the
    /// used positions one more: nothing around them for the host to handle.
    #[test]
    fn a_decode_steps_cache_write_and_read_are_two_primitives() {
        let mut cache = KvCache::default();
        let (k, v) = cache
            .update_and_fetch(&positions(0, 3), &positions(0, 3))
            .unwrap();
        mlx_rs::transforms::eval([&k, &v]).unwrap();
        let (k, _) = cache
            .update_and_fetch(&positions(3, 1), &positions(3, 1))
            .unwrap();
        let size = crate::engine::anatomy::graph_size(&[&k]).unwrap();
        assert_eq!(size.nodes, 2, "{size:?}");
        k.eval().unwrap();
        let got: Vec<f32> = k.as_slice::<f32>().iter().step_by(2).copied().collect();
        assert_eq!(got, vec![0., 1., 2., 3.]);
    }

    #[test]
    fn trim_then_append_overwrites_the_dropped_positions() {
        let mut cache = KvCache::default();
        cache
            .update_and_fetch(&positions(0, 10), &positions(0, 10))
            .unwrap();
        assert_eq!(cache.trim(4), 4);
        let (k, _) = cache
            .update_and_fetch(&positions(100, 2), &positions(100, 2))
            .unwrap();
        k.eval().unwrap();
        let got: Vec<f32> = k.as_slice::<f32>().iter().step_by(2).copied().collect();
        assert_eq!(got, vec![0., 1., 2., 3., 4., 5., 100., 101.]);
        assert_eq!(cache.trim(100), 8);
    }

    #[test]
    fn bytes_count_only_used_positions() {
        let mut cache = KvCache::default();
        cache
            .update_and_fetch(&positions(0, 3), &positions(0, 3))
            .unwrap();
        // 3 positions x 2 values x 4 bytes, keys and values.
        assert_eq!(cache.nbytes(), 48);
    }

    pub(super) fn read_positions(k: &Array) -> Vec<f32> {
        k.eval().unwrap();
        k.as_slice::<f32>().iter().step_by(2).copied().collect()
    }

    #[test]
    fn rotating_cache_keeps_the_first_tokens_and_the_latest() {
        let mut cache = LayerCache::new(Some(8));
        cache
            .update_and_fetch(&positions(0, 6), &positions(0, 6))
            .unwrap();
        let mut last = None;
        for p in 6..13 {
            last = Some(
                cache
                    .update_and_fetch(&positions(p, 1), &positions(p, 1))
                    .unwrap()
                    .0,
            );
        }
        assert_eq!(cache.offset(), 13);
        let mut held = read_positions(&last.unwrap());
        held.sort_by(f32::total_cmp);
        // The 4 kept, then the 4 most recent.
        assert_eq!(held, vec![0., 1., 2., 3., 9., 10., 11., 12.]);
        assert!(!cache.can_trim());
        assert_eq!(cache.nbytes(), 8 * 2 * 4 * 2);
    }

    #[test]
    fn rotating_cache_chunk_after_wrap_comes_back_in_time_order() {
        let mut cache = LayerCache::new(Some(8));
        for p in 0..11 {
            cache
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
        }
        let (k, _) = cache
            .update_and_fetch(&positions(11, 3), &positions(11, 3))
            .unwrap();
        // max_size - 1 old positions (kept + newest) then the chunk, in order.
        assert_eq!(
            read_positions(&k),
            vec![0., 1., 2., 3., 8., 9., 10., 11., 12., 13.]
        );
    }

    #[test]
    fn rotating_mask_is_windowed_only_when_needed() {
        let cache = LayerCache::new(Some(8));
        assert!(matches!(cache.mask(1).unwrap(), AttentionMask::None));
        assert!(matches!(cache.mask(8).unwrap(), AttentionMask::Causal));
        let AttentionMask::Array(mask) = cache.mask(10).unwrap() else {
            panic!("a 10-position chunk in an 8-position cache needs a window");
        };
        assert_eq!(mask.shape(), &[10, 10]);
        mask.eval().unwrap();
        let row9: Vec<bool> = mask.as_slice::<bool>()[90..100].to_vec();
        // Position 9 sees positions 2..=9.
        let expected: Vec<bool> = (0..10).map(|j| (2..=9).contains(&j)).collect();
        assert_eq!(row9, expected);
    }

    /// `[1, n, 2]` inputs whose values are their positions.
    pub(super) fn inputs(start: i32, n: i32) -> Array {
        let data: Vec<f32> = (start..start + n)
            .flat_map(|p| [p as f32, -(p as f32)])
            .collect();
        Array::from_slice(&data, &[1, n, 2])
    }

    pub(super) fn values(a: &Array) -> Vec<f32> {
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn a_conv_state_gives_the_same_inputs_in_chunks_as_in_one_pass() {
        let mut whole = ConvState::new(3);
        let padded = whole.extend(&inputs(0, 5)).unwrap();
        // Two zero positions of left padding, then the five inputs.
        assert_eq!(padded.shape(), &[1, 7, 2]);
        let mut stepped = ConvState::new(3);
        stepped.extend(&inputs(0, 3)).unwrap();
        stepped.extend(&inputs(3, 1)).unwrap();
        let last = stepped.extend(&inputs(4, 1)).unwrap();
        // The last step reads positions 2, 3 and 4: kernel 3.
        assert_eq!(values(&last), vec![2., -2., 3., -3., 4., -4.]);
        assert_eq!(stepped.offset(), 5);
        let whole_kept = values(whole.inputs.as_ref().unwrap());
        assert_eq!(whole_kept, values(stepped.inputs.as_ref().unwrap()));
        // 2 inputs x 2 channels x 4 bytes, whatever the positions seen.
        assert_eq!(whole.nbytes(), 16);
        stepped.extend(&inputs(5, 300)).unwrap();
        assert_eq!(stepped.nbytes(), 16);
    }

    #[test]
    fn state_layers_say_they_cannot_trim_and_kv_layers_trim_exactly() {
        let mut conv = LayerCache::Conv(ConvState::new(3));
        conv.conv_mut().unwrap().extend(&inputs(0, 4)).unwrap();
        assert!(!conv.can_trim());
        let error = conv.trim(1).unwrap_err();
        assert!(matches!(error, CacheError::CannotTrim { .. }));
        assert!(error.to_string().contains("convolution state"), "{error}");
        assert_eq!(conv.offset(), 4, "a refused trim changes nothing");
        let mut recurrent = LayerCache::Recurrent(RecurrentState::new(4));
        assert!(
            recurrent
                .trim(1)
                .unwrap_err()
                .to_string()
                .contains("recurrent state")
        );
        let mut kv = LayerCache::new(None);
        kv.update_and_fetch(&positions(0, 6), &positions(0, 6))
            .unwrap();
        assert_eq!(kv.trim(2).unwrap(), 2);
        assert_eq!(kv.offset(), 4);
        let mut wrapped = LayerCache::new(Some(4));
        for p in 0..6 {
            wrapped
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
        }
        assert!(matches!(wrapped.trim(1), Err(CacheError::Wrapped)));
    }

    #[test]
    fn a_recurrent_state_counts_its_convolution_and_its_matrix() {
        let mut state = RecurrentState::new(4);
        state.conv.extend(&inputs(0, 10)).unwrap();
        // [B=1, heads=2, v_dim=3, k_dim=4] in f32.
        state.set_matrix(ops::ones::<f32>(&[1, 2, 3, 4]).unwrap());
        let layer = LayerCache::Recurrent(state);
        assert_eq!(layer.nbytes(), 3 * 2 * 4 + 2 * 3 * 4 * 4);
        assert_eq!(layer.offset(), 10);
        assert!(layer.is_state());
    }

    /// A hybrid cache: a growing KV layer and a convolution layer, fed the
    /// same positions.
    fn feed(cache: &mut [LayerCache], start: i32, n: i32) {
        for layer in cache.iter_mut() {
            match layer {
                LayerCache::Conv(c) => {
                    c.extend(&inputs(start, n)).unwrap();
                }
                kv => {
                    kv.update_and_fetch(&positions(start, n), &positions(start, n))
                        .unwrap();
                }
            }
        }
    }

    fn conv_inputs(cache: &[LayerCache]) -> Vec<f32> {
        match &cache[1] {
            LayerCache::Conv(c) => values(c.inputs.as_ref().unwrap()),
            _ => unreachable!(),
        }
    }

    #[test]
    fn restoring_a_snapshot_puts_state_and_kv_back_at_its_position() {
        let mut cache = vec![LayerCache::new(None), LayerCache::Conv(ConvState::new(3))];
        assert!(
            CacheSnapshot::take(&cache[..1]).is_none(),
            "KV alone needs none"
        );
        feed(&mut cache, 0, 5);
        let snapshot = CacheSnapshot::take(&cache).unwrap();
        assert_eq!(snapshot.position, 5);
        assert_eq!(snapshot.nbytes(), 16);
        feed(&mut cache, 5, 1);
        feed(&mut cache, 6, 3);
        snapshot.restore(&mut cache).unwrap();
        assert!(cache.iter().all(|l| l.offset() == 5));
        assert_eq!(conv_inputs(&cache), vec![3., -3., 4., -4.]);
        // Going on from the snapshot equals having fed the other tokens
        // from the start.
        feed(&mut cache, 50, 2);
        let mut fresh = vec![LayerCache::new(None), LayerCache::Conv(ConvState::new(3))];
        feed(&mut fresh, 0, 5);
        feed(&mut fresh, 50, 2);
        assert_eq!(conv_inputs(&cache), conv_inputs(&fresh));
        let (k, _) = cache[0]
            .update_and_fetch(&positions(9, 1), &positions(9, 1))
            .unwrap();
        assert_eq!(read_positions(&k), vec![0., 1., 2., 3., 4., 50., 51., 9.]);
        // A snapshot ahead of the cache cannot be restored.
        let mut behind = vec![LayerCache::new(None), LayerCache::Conv(ConvState::new(3))];
        feed(&mut behind, 0, 2);
        assert!(snapshot.restore(&mut behind).is_err());
    }

    #[test]
    fn a_recurrent_layer_goes_back_to_its_snapshot_matrix_and_inputs() {
        let mut state = RecurrentState::new(3);
        state.conv.extend(&inputs(0, 4)).unwrap();
        state.set_matrix(ops::ones::<f32>(&[1, 2, 3, 4]).unwrap());
        let mut cache = vec![LayerCache::new(None), LayerCache::Recurrent(state)];
        cache[0]
            .update_and_fetch(&positions(0, 4), &positions(0, 4))
            .unwrap();
        let snapshot = CacheSnapshot::take(&cache).unwrap();
        // The matrix and the convolution's 2 inputs, in f32.
        assert_eq!(snapshot.nbytes(), 24 * 4 + 2 * 2 * 4);
        let recurrent = cache[1].recurrent_mut().unwrap();
        recurrent.conv.extend(&inputs(4, 3)).unwrap();
        let doubled = ops::multiply(recurrent.matrix().unwrap(), Array::from_f32(2.0)).unwrap();
        recurrent.set_matrix(doubled);
        cache[0]
            .update_and_fetch(&positions(4, 3), &positions(4, 3))
            .unwrap();
        snapshot.restore(&mut cache).unwrap();
        assert!(cache.iter().all(|l| l.offset() == 4));
        let LayerCache::Recurrent(back) = &cache[1] else {
            panic!("a restored recurrent layer stays one");
        };
        assert_eq!(values(back.matrix().unwrap()), vec![1.; 24]);
        assert_eq!(
            values(back.conv.inputs.as_ref().unwrap()),
            vec![2., -2., 3., -3.]
        );
    }
}
