//! The KV cache, outside the model: one per attention layer. It grows in
//! steps of `STEP` positions and writes each new position into the spare
//! room, so a decode step costs a slice update rather than a copy of the
//! whole cache (what concatenating per token would cost).

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{Array, ops};

/// Positions added whenever the cache runs out of room.
pub const STEP: i32 = 256;

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
        k.try_index_mut((.., .., previous..self.offset, ..), keys)?;
        v.try_index_mut((.., .., previous..self.offset, ..), values)?;
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
}
