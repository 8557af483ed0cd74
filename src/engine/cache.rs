//! The KV cache, outside the model: one per attention layer. `KvCache` grows
//! in steps of `STEP` positions and writes each new position into the spare
//! room, so a decode step costs a slice update rather than a copy of the
//! whole cache (what concatenating per token would cost). `RotatingKvCache`
//! holds at most `max_kv_size` positions for long conversations: it keeps
//! the first tokens and overwrites the oldest of the rest, with mlx-lm's
//! semantics so both produce the same tokens.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Stream, ops};

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

/// Keys and values of one attention layer, `[batch, kv_heads, positions, head_dim]`.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions in use; the arrays may hold more (spare room).
    offset: i32,
}

impl KvCache {
    /// Positions already cached (the rope offset of the next token).
    pub fn offset(&self) -> i32 {
        self.offset
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
    /// An explicit boolean mask `[queries, keys]` (a window).
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

    /// One position (a decode step): written in place, over the oldest
    /// position after the kept ones once the cache is full.
    fn append_one(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array), Exception> {
        let previous = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if self.keys.is_none() || (previous >= capacity && capacity < self.max_size) {
            let shape = keys.shape();
            let room_size = STEP.min(self.max_size - previous);
            let room = |dtype| ops::zeros_dtype(&[shape[0], shape[1], room_size, shape[3]], dtype);
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
            self.write_at = previous;
        }
        let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) else {
            return Err(Exception::custom("rotating KV cache lost its arrays"));
        };
        let excess = k.shape()[2] - self.max_size;
        let (mut k, mut v) = if excess > 0 {
            self.write_at = self.max_size;
            (
                self.drop_after_keep(excess, &k, None)?,
                self.drop_after_keep(excess, &v, None)?,
            )
        } else {
            (k, v)
        };
        if self.write_at == self.max_size {
            self.write_at = self.keep;
        }
        let at = self.write_at;
        k = write_positions(&k, keys, at, at + 1)?;
        v = write_positions(&v, values, at, at + 1)?;
        self.offset += 1;
        self.write_at += 1;
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

/// One layer's cache, of either kind.
pub enum LayerCache {
    Growing(KvCache),
    Rotating(RotatingKvCache),
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

    /// Positions seen so far (the rope offset of the next token).
    /// The cache of a sliding-window layer: it holds the last `window`
    /// positions (plus one prefill chunk) and keeps no leading tokens, as
    /// mlx-lm's sliding-window layers do.
    pub fn window(window: i32) -> Self {
        LayerCache::Rotating(RotatingKvCache::new(window, 0))
    }

    pub fn offset(&self) -> i32 {
        match self {
            LayerCache::Growing(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset,
        }
    }

    /// Appends `[B, H, n, D]` keys and values; returns what attention sees.
    pub fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), Exception> {
        match self {
            LayerCache::Growing(c) => c.update_and_fetch(keys, values),
            LayerCache::Rotating(c) if keys.shape()[2] == 1 => c.append_one(keys, values),
            LayerCache::Rotating(c) => c.append_many(keys, values),
        }
    }

    /// The attention mask for `n` positions about to be added.
    pub fn mask(&self, n: i32) -> Result<AttentionMask, Exception> {
        match self {
            LayerCache::Growing(_) if n > 1 => Ok(AttentionMask::Causal),
            LayerCache::Growing(_) => Ok(AttentionMask::None),
            LayerCache::Rotating(c) => c.mask(n),
        }
    }

    /// True while the last positions can still be dropped exactly (a
    /// rotating cache that has wrapped has overwritten what came before).
    pub fn can_trim(&self) -> bool {
        match self {
            LayerCache::Growing(_) => true,
            LayerCache::Rotating(c) => c.offset < c.max_size,
        }
    }

    /// Forgets the last `n` positions; returns how many were dropped.
    pub fn trim(&mut self, n: i32) -> i32 {
        match self {
            LayerCache::Growing(c) => c.trim(n),
            LayerCache::Rotating(c) => {
                let dropped = n.clamp(0, c.offset);
                c.offset -= dropped;
                c.write_at -= dropped;
                dropped
            }
        }
    }

    /// Bytes of the positions held.
    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Growing(c) => c.nbytes(),
            LayerCache::Rotating(c) => {
                let held = |a: &Option<Array>| {
                    a.as_ref().map_or(0, |a| {
                        let capacity = a.shape()[2].max(1) as usize;
                        a.nbytes() / capacity * (c.offset.min(capacity as i32) as usize)
                    })
                };
                held(&c.keys) + held(&c.values)
            }
        }
    }

    /// The arrays to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Growing(c) => c.state(),
            LayerCache::Rotating(c) => c.keys.iter().chain(c.values.iter()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions(start: i32, n: i32) -> Array {
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

    fn read_positions(k: &Array) -> Vec<f32> {
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
}
