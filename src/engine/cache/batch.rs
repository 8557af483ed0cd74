//! The batch operations of the cache: one-row caches joined into one batch
//! (`stack`), more rows joined to a batch (`extend`), a row taken out at its
//! own position (`split_row`), the batch cut to some rows (`filter`), and
//! the mask a batched decode step needs (`batch_mask`).
//!
//! A batch's KV rows are aligned on their newest position, as mlx-lm's
//! `BatchKVCache` and `BatchRotatingKVCache` align them: a shorter row is
//! padded with zeros before its positions, each row's padding is recorded,
//! and the mask hides it. Every row then writes its next position into the
//! same slot, so a decode step's write is one slice update for the whole
//! batch, and a rotating cache rotates all rows alike: padding is what a
//! row's window drops first, so each row keeps exactly the positions it
//! would keep alone. A rotating cache that keeps its first tokens keeps
//! each row's own (its padding sits after them). State kinds (convolution,
//! recurrent) stack on the batch axis: their size does not depend on the
//! positions seen, and a batch only ever feeds them real tokens (one per
//! row and step), so no padding reaches a state.

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

use super::{
    AttentionMask, CacheError, ConvState, KvCache, LayerCache, QuantizedArrays, QuantizedKvCache,
    RecurrentState, RotatingKvCache,
};

impl LayerCache {
    /// One-row caches of the same kind joined into one batch: KV rows are
    /// padded to the longest (each row's padding recorded), states stacked
    /// on the batch axis (their size does not depend on length).
    pub fn stack(rows: &[LayerCache]) -> Result<LayerCache, CacheError> {
        let Some(first) = rows.first() else {
            return Err(CacheError::Mismatch("no caches to stack".into()));
        };
        if let Some(batch) = rows.iter().find(|r| r.rows() > 1) {
            return Err(CacheError::Mismatch(format!(
                "a batch of {} rows cannot be stacked again; extend it instead",
                batch.rows()
            )));
        }
        match first {
            LayerCache::Growing(_) | LayerCache::Quantized(_) => {
                join_growing(&rows.iter().collect::<Vec<_>>())
            }
            LayerCache::Rotating(_) => {
                Ok(LayerCache::Rotating(stack_rotating(&rotating_rows(rows)?)?))
            }
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => join_states(None, rows),
        }
    }

    /// This batch with `rows` (one-row caches of the same kind) joined
    /// after its own rows. The batch must have seen a position (a batch is
    /// made by `stack` and runs a step before it takes more rows).
    pub fn extend(&self, rows: &[LayerCache]) -> Result<LayerCache, CacheError> {
        if rows.is_empty() {
            return self.filter(&(0..self.rows()).collect::<Vec<_>>());
        }
        let empty = || {
            CacheError::Mismatch(
                "a batch that has seen no position cannot take more rows; stack them together"
                    .into(),
            )
        };
        match self {
            LayerCache::Growing(batch) if batch.keys.is_none() => Err(empty()),
            LayerCache::Quantized(batch) if batch.keys.is_none() => Err(empty()),
            LayerCache::Rotating(batch) if batch.keys.is_none() => Err(empty()),
            LayerCache::Conv(_) | LayerCache::Recurrent(_)
                if self.rows() == 0 && rows.iter().any(|r| r.rows() > 0) =>
            {
                Err(empty())
            }
            LayerCache::Growing(_) | LayerCache::Quantized(_) => {
                let mut blocks = vec![self];
                blocks.extend(rows);
                join_growing(&blocks)
            }
            LayerCache::Rotating(batch) => {
                // Windows are small: take the batch apart and stack every
                // row anew, in one frame with the joining ones.
                let own: Vec<RotatingKvCache> = (0..self.rows())
                    .map(|row| batch.row(row, 0))
                    .collect::<Result<_, _>>()?;
                let mut all: Vec<&RotatingKvCache> = own.iter().collect();
                all.extend(rotating_rows(rows)?);
                Ok(LayerCache::Rotating(stack_rotating(&all)?))
            }
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => join_states(Some(self), rows),
        }
    }

    /// Row `row` of the batch as a cache of its own, at its own position
    /// `offset` (the tokens it has seen: a batch counts its positions for
    /// all rows alike, padding included), without its padding.
    pub fn split_row(&self, row: usize, offset: i32) -> Result<LayerCache, CacheError> {
        let rows = self.rows();
        if row >= rows.max(1) {
            return Err(CacheError::Mismatch(format!(
                "row {row} of a batch of {rows} rows"
            )));
        }
        match self {
            LayerCache::Growing(_) | LayerCache::Quantized(_) => {
                let single = self.select(&[row])?;
                if rows > 0 && single.offset() != offset {
                    return Err(CacheError::Mismatch(format!(
                        "row {row} holds {} positions, not the {offset} it has seen",
                        single.offset()
                    )));
                }
                Ok(single)
            }
            LayerCache::Rotating(c) => Ok(LayerCache::Rotating(c.row(row, offset)?)),
            LayerCache::Conv(_) | LayerCache::Recurrent(_) => {
                let mut single = self.select(&[row])?;
                single.set_state_offset(offset);
                Ok(single)
            }
        }
    }

    /// Every row of the batch as a cache of its own, row `r` at position
    /// `offsets[r]`.
    pub fn split(&self, offsets: &[i32]) -> Result<Vec<LayerCache>, CacheError> {
        offsets
            .iter()
            .enumerate()
            .map(|(row, &offset)| self.split_row(row, offset))
            .collect()
    }

    /// Keeps the rows `keep` (in that order), as a batch.
    pub fn filter(&self, keep: &[usize]) -> Result<LayerCache, CacheError> {
        self.select(keep)
    }

    /// Rows of the batch (0 while it holds nothing).
    pub fn rows(&self) -> usize {
        let first = self.state().first().map(|a| a.shape()[0]).unwrap_or(0);
        first.max(0) as usize
    }

    /// The attention mask for one new position per row of a batch: `[B, 1,
    /// 1, keys]`, true where a row's key is its own (not padding), for the
    /// keys the cache holds once it has written that position; `None` when
    /// no row's padding is among them.
    pub fn batch_mask(&self) -> Result<AttentionMask, Exception> {
        match self {
            LayerCache::Growing(c) => left_padding_mask(c.offset, &c.left_padding),
            LayerCache::Quantized(c) => left_padding_mask(c.offset, &c.left_padding),
            LayerCache::Rotating(c) if !c.padding.is_empty() => c.batch_mask(),
            _ => Ok(AttentionMask::None),
        }
    }

    /// Sets a state layer's count of positions seen (a row taken out of a
    /// batch has seen its own).
    fn set_state_offset(&mut self, offset: i32) {
        match self {
            LayerCache::Conv(c) => c.offset = offset,
            LayerCache::Recurrent(c) => c.conv.offset = offset,
            LayerCache::Growing(_) | LayerCache::Quantized(_) | LayerCache::Rotating(_) => {}
        }
    }

    /// The rows `keep` of the batch; padding every kept row has is dropped
    /// from a growing cache.
    fn select(&self, keep: &[usize]) -> Result<LayerCache, CacheError> {
        let indices: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let pick = |a: &Array| -> Result<Array, Exception> {
            a.take_axis(Array::from_slice(&indices, &[indices.len() as i32]), 0)
        };
        let pick_state = |a: Option<&Array>| a.map(pick).transpose();
        match self {
            LayerCache::Growing(c) => {
                let Some((k, v)) = c.used() else {
                    return Ok(LayerCache::Growing(KvCache::quantizing(c.quantize)));
                };
                let (parts, left) = select_positions(&[k, v], &c.left_padding, keep)?;
                let [k, v]: [Array; 2] = parts.try_into().map_err(|_| lost())?;
                Ok(LayerCache::Growing(KvCache::holding(
                    k, v, left, c.quantize,
                )))
            }
            LayerCache::Quantized(c) => {
                let Some((k, v)) = c.used() else {
                    return Ok(LayerCache::Quantized(QuantizedKvCache::new(c.quantization)));
                };
                let all: Vec<Array> = k.parts().into_iter().chain(v.parts()).cloned().collect();
                let (parts, left) = select_positions(&all, &c.left_padding, keep)?;
                let [kp, ks, kb, vp, vs, vb]: [Array; 6] = parts.try_into().map_err(|_| lost())?;
                Ok(LayerCache::Quantized(QuantizedKvCache::holding(
                    QuantizedArrays::from_parts([kp, ks, kb]),
                    QuantizedArrays::from_parts([vp, vs, vb]),
                    left,
                    c.quantization,
                )))
            }
            LayerCache::Rotating(c) => Ok(LayerCache::Rotating(RotatingKvCache {
                keys: pick_state(c.keys.as_ref())?,
                values: pick_state(c.values.as_ref())?,
                offset: c.offset,
                max_size: c.max_size,
                keep: c.keep,
                write_at: c.write_at,
                padding: keep
                    .iter()
                    .map(|&r| c.padding.get(r).copied().unwrap_or((0, 0)))
                    .collect(),
            })),
            LayerCache::Conv(c) => Ok(LayerCache::Conv(ConvState {
                inputs: pick_state(c.inputs.as_ref())?,
                kernel: c.kernel,
                offset: c.offset,
            })),
            LayerCache::Recurrent(c) => Ok(LayerCache::Recurrent(RecurrentState {
                conv: ConvState {
                    inputs: pick_state(c.conv.inputs.as_ref())?,
                    kernel: c.conv.kernel,
                    offset: c.conv.offset,
                },
                matrix: pick_state(c.matrix.as_ref())?,
            })),
        }
    }
}

/// Caches stacked together must be of one kind.
fn mismatch(first: &LayerCache) -> CacheError {
    CacheError::Mismatch(format!(
        "caches of different kinds cannot be stacked (the first is a {})",
        first.kind()
    ))
}

/// An error for arrays that should be there and are not.
fn lost() -> CacheError {
    CacheError::Mismatch("a KV cache lost some of its arrays".into())
}

/// `[B, 1, 1, keys]`, true where a row's key is its own and not its left
/// padding, for the keys a growing cache of `offset` positions holds once
/// it has written one more; `None` when no row has padding.
fn left_padding_mask(offset: i32, left_padding: &[i32]) -> Result<AttentionMask, Exception> {
    if !left_padding.iter().any(|&p| p > 0) {
        return Ok(AttentionMask::None);
    }
    let keys = offset + 1;
    let rows = left_padding.len() as i32;
    let slots = Array::arange::<_, i32>(0, keys, 1)?.reshape(&[1, keys])?;
    let padding = Array::from_slice(left_padding, &[rows, 1]);
    Ok(AttentionMask::Array(
        ops::ge(&slots, &padding)?.reshape(&[rows, 1, 1, keys])?,
    ))
}

/// The rows `keep` of a growing cache's position arrays (`[B, H, n, _]`
/// each, keys and values, or their quantized parts) and each kept row's
/// padding; padding every kept row has is dropped.
fn select_positions(
    parts: &[Array],
    left_padding: &[i32],
    keep: &[usize],
) -> Result<(Vec<Array>, Vec<i32>), Exception> {
    let indices: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
    let indices = Array::from_slice(&indices, &[indices.len() as i32]);
    let padding: Vec<i32> = keep
        .iter()
        .map(|&r| left_padding.get(r).copied().unwrap_or(0))
        .collect();
    // Padding every kept row has is not needed any more.
    let shared = padding.iter().copied().min().unwrap_or(0);
    let parts = parts
        .iter()
        .map(|a| Ok(a.take_axis(&indices, 0)?.index((.., .., shared.., ..))))
        .collect::<Result<Vec<_>, Exception>>()?;
    let left: Vec<i32> = padding.iter().map(|p| p - shared).collect();
    let left = if keep.len() == 1 { Vec::new() } else { left };
    Ok((parts, left))
}

/// Growing caches (float or quantized; a batch, or one row each) joined
/// into one batch. When any is quantized, the float ones are quantized
/// with its settings first: one batch holds one kind of arrays. (A row
/// may so be quantized earlier than it would be alone; a batch switches
/// as a whole, when its longest row reaches `quantized_kv_start`.)
fn join_growing(blocks: &[&LayerCache]) -> Result<LayerCache, CacheError> {
    let quantized = blocks.iter().find_map(|b| match b {
        LayerCache::Quantized(c) => Some(c.quantization),
        _ => None,
    });
    match quantized {
        None => {
            let rows = blocks
                .iter()
                .map(|r| match r {
                    LayerCache::Growing(c) => Ok(c),
                    other => Err(mismatch(other)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(LayerCache::Growing(join_kv(&rows)?))
        }
        Some(q) => {
            let converted = blocks
                .iter()
                .map(|r| match r {
                    LayerCache::Growing(c) => Ok(Some(QuantizedKvCache::from_float(c, q)?)),
                    LayerCache::Quantized(c) if c.quantization == q => Ok(None),
                    LayerCache::Quantized(c) => Err(CacheError::Mismatch(format!(
                        "quantized caches of {} bits in groups of {} and of {} bits in groups \
                         of {} cannot be stacked",
                        q.bits, q.group_size, c.quantization.bits, c.quantization.group_size
                    ))),
                    other => Err(mismatch(other)),
                })
                .collect::<Result<Vec<_>, CacheError>>()?;
            let rows: Vec<&QuantizedKvCache> = blocks
                .iter()
                .zip(&converted)
                .filter_map(|(block, converted)| match (block, converted) {
                    (_, Some(c)) => Some(c),
                    (LayerCache::Quantized(c), None) => Some(c),
                    _ => None,
                })
                .collect();
            Ok(LayerCache::Quantized(join_quantized(&rows, q)?))
        }
    }
}

/// Quantized blocks joined as `join_kv` joins float ones.
fn join_quantized(
    blocks: &[&QuantizedKvCache],
    q: super::KvQuantization,
) -> Result<QuantizedKvCache, CacheError> {
    let joined = join_blocks(
        &blocks
            .iter()
            .map(|c| PositionBlock {
                parts: c
                    .used()
                    .map(|(k, v)| k.parts().into_iter().chain(v.parts()).cloned().collect()),
                offset: c.offset,
                left_padding: &c.left_padding,
            })
            .collect::<Vec<_>>(),
    )?;
    let Some((parts, padding)) = joined else {
        return Ok(QuantizedKvCache::new(q));
    };
    let [kp, ks, kb, vp, vs, vb]: [Array; 6] = parts.try_into().map_err(|_| lost())?;
    Ok(QuantizedKvCache::holding(
        QuantizedArrays::from_parts([kp, ks, kb]),
        QuantizedArrays::from_parts([vp, vs, vb]),
        padding,
        q,
    ))
}

/// A joined batch's position arrays and each row's padding.
type JoinedBlocks = (Vec<Array>, Vec<i32>);

/// One block of a growing batch to join: its position arrays (`None`: one
/// row that has seen nothing), the positions it holds and its rows'
/// padding (empty for one row).
struct PositionBlock<'a> {
    parts: Option<Vec<Array>>,
    offset: i32,
    left_padding: &'a [i32],
}

/// Blocks aligned on their newest position: each block's arrays padded
/// with zeros before its positions to the longest and joined on the batch
/// axis, every row's padding recorded (empty for a single row); `None`
/// when no block holds anything.
fn join_blocks(blocks: &[PositionBlock]) -> Result<Option<JoinedBlocks>, CacheError> {
    let longest = blocks.iter().map(|c| c.offset).max().unwrap_or(0);
    let Some(template) = blocks.iter().find_map(|c| c.parts.as_ref()) else {
        return Ok(None);
    };
    let mut joined: Vec<Vec<Array>> = vec![Vec::with_capacity(blocks.len()); template.len()];
    let mut padding = Vec::with_capacity(blocks.len());
    for block in blocks {
        let pad = longest - block.offset;
        let rows = block.parts.as_ref().map_or(1, |p| p[0].shape()[0]);
        for (i, like) in template.iter().enumerate() {
            let shape = like.shape();
            let zeros = || ops::zeros_dtype(&[rows, shape[1], pad, shape[3]], like.dtype());
            let part = match &block.parts {
                Some(parts) if pad > 0 => ops::concatenate(&[zeros()?, parts[i].clone()], 2)?,
                Some(parts) => parts[i].clone(),
                None => zeros()?,
            };
            joined[i].push(part);
        }
        if block.left_padding.is_empty() {
            padding.extend(std::iter::repeat_n(pad, rows as usize));
        } else {
            padding.extend(block.left_padding.iter().map(|p| p + pad));
        }
    }
    let padding = if padding.len() == 1 {
        Vec::new()
    } else {
        padding
    };
    let parts = joined
        .iter()
        .map(|parts| ops::concatenate(parts, 0))
        .collect::<Result<Vec<_>, Exception>>()?;
    Ok(Some((parts, padding)))
}

/// The rotating caches `rows`, which must rotate alike.
fn rotating_rows(rows: &[LayerCache]) -> Result<Vec<&RotatingKvCache>, CacheError> {
    rows.iter()
        .map(|r| match r {
            LayerCache::Rotating(c) => Ok(c),
            other => Err(mismatch(other)),
        })
        .collect()
}

/// Growing KV blocks (a batch, or one row) aligned on their newest
/// position: each padded with zeros before its positions to the longest
/// and joined on the batch axis, every row's padding recorded. An empty
/// block is one row that has seen nothing.
fn join_kv(blocks: &[&KvCache]) -> Result<KvCache, CacheError> {
    let quantize = blocks.first().and_then(|c| c.quantize);
    let joined = join_blocks(
        &blocks
            .iter()
            .map(|c| PositionBlock {
                parts: c.used().map(|(k, v)| vec![k, v]),
                offset: c.offset,
                left_padding: &c.left_padding,
            })
            .collect::<Vec<_>>(),
    )?;
    let Some((parts, padding)) = joined else {
        return Ok(KvCache::quantizing(quantize));
    };
    let [k, v]: [Array; 2] = parts.try_into().map_err(|_| lost())?;
    Ok(KvCache::holding(k, v, padding, quantize))
}

/// Rotating caches of one row each in one batch: each row in the order
/// its positions came, its kept positions first, then zeros, then the
/// rest, so that every row's newest position is in the same slot; each
/// row's padding recorded. A row shorter than the kept positions has its
/// padding right after what it has (and later positions go to the rotating
/// part: only a prompt shorter than `keep` tokens differs from its run
/// alone, and only once the cache has wrapped).
fn stack_rotating(rows: &[&RotatingKvCache]) -> Result<RotatingKvCache, CacheError> {
    let Some(first) = rows.first() else {
        return Err(CacheError::Mismatch("no caches to stack".into()));
    };
    let (max_size, keep) = (first.max_size, first.keep);
    if let Some(other) = rows
        .iter()
        .find(|c| c.max_size != max_size || c.keep != keep)
    {
        return Err(CacheError::Mismatch(format!(
            "rotating caches of {max_size} positions keeping {keep} and of {} keeping {} \
             cannot be stacked",
            other.max_size, other.keep
        )));
    }
    let contents = rows
        .iter()
        .map(|c| match (&c.keys, &c.values) {
            (Some(k), Some(v)) => Ok(Some((c.in_time_order(k)?, c.in_time_order(v)?))),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>, Exception>>()?;
    let held_by =
        |content: &Option<(Array, Array)>| content.as_ref().map_or(0, |(k, _)| k.shape()[2]);
    let rest = contents
        .iter()
        .map(|c| (held_by(c) - keep).max(0))
        .max()
        .unwrap_or(0);
    let length = keep + rest;
    let Some((template, _)) = contents.iter().flatten().next() else {
        return Ok(RotatingKvCache {
            padding: vec![(0, 0); rows.len()],
            ..RotatingKvCache::new(max_size, keep)
        });
    };
    let shape = template.shape().to_vec();
    let mut keys = Vec::with_capacity(rows.len());
    let mut values = Vec::with_capacity(rows.len());
    let mut padding = Vec::with_capacity(rows.len());
    for content in &contents {
        let held = held_by(content);
        let kept = held.min(keep);
        let pad = length - held;
        let zeros = |dtype| ops::zeros_dtype(&[1, shape[1], pad, shape[3]], dtype);
        let row = |a: &Array| -> Result<Array, Exception> {
            if pad == 0 {
                return Ok(a.clone());
            }
            ops::concatenate(
                &[
                    a.index((.., .., ..kept, ..)),
                    zeros(a.dtype())?,
                    a.index((.., .., kept.., ..)),
                ],
                2,
            )
        };
        let (k, v) = match content {
            Some((k, v)) => (row(k)?, row(v)?),
            None => (zeros(template.dtype())?, zeros(template.dtype())?),
        };
        keys.push(k);
        values.push(v);
        padding.push((kept, kept + pad));
    }
    Ok(RotatingKvCache {
        keys: Some(ops::concatenate(&keys, 0)?),
        values: Some(ops::concatenate(&values, 0)?),
        offset: length,
        max_size,
        keep,
        write_at: length,
        padding,
    })
}

impl RotatingKvCache {
    /// The slots of row `row` in the order their positions came, without
    /// its padding.
    fn row_slots(&self, row: usize) -> Vec<i32> {
        let (start, end) = self.padding.get(row).copied().unwrap_or((0, 0));
        let positions =
            Self::slot_positions(self.offset, self.capacity(), self.write_at, self.keep);
        let mut slots: Vec<(i32, i32)> = positions
            .into_iter()
            .enumerate()
            .filter(|&(_, position)| position < start || position >= end)
            .map(|(slot, position)| (position, slot as i32))
            .collect();
        slots.sort_unstable();
        slots.into_iter().map(|(_, slot)| slot).collect()
    }

    /// Row `row` as a rotating cache of its own that has seen `offset`
    /// positions: its positions in the order they came, without padding.
    fn row(&self, row: usize, offset: i32) -> Result<RotatingKvCache, CacheError> {
        let (Some(keys), Some(values)) = (&self.keys, &self.values) else {
            return Ok(RotatingKvCache {
                offset,
                ..RotatingKvCache::new(self.max_size, self.keep)
            });
        };
        let slots = self.row_slots(row);
        let held = slots.len() as i32;
        let r = row as i32;
        let take = |a: &Array| -> Result<Array, Exception> {
            let a = a.index((r..r + 1, .., .., ..));
            if slots.iter().copied().eq(0..held) {
                Ok(a.index((.., .., ..held, ..)))
            } else {
                a.take_axis(Array::from_slice(&slots, &[held]), 2)
            }
        };
        Ok(RotatingKvCache {
            keys: Some(take(keys)?),
            values: Some(take(values)?),
            offset,
            max_size: self.max_size,
            keep: self.keep,
            write_at: held,
            padding: Vec::new(),
        })
    }

    /// The batch's mask for one new position per row (see
    /// `LayerCache::batch_mask`): where each slot's position will be once
    /// the next one is written, against each row's padding.
    fn batch_mask(&self) -> Result<AttentionMask, Exception> {
        let next = self.next_slot();
        let capacity = if next.excess > 0 {
            self.max_size
        } else {
            self.capacity() + next.room
        };
        let positions = Self::slot_positions(self.offset + 1, capacity, next.slot + 1, self.keep);
        let padded = self.padding.iter().any(|&(start, end)| {
            positions
                .iter()
                .any(|&position| position >= start && position < end)
        });
        if !padded {
            return Ok(AttentionMask::None);
        }
        let keys = positions.len() as i32;
        let rows = self.padding.len() as i32;
        let positions = Array::from_slice(&positions, &[1, keys]);
        let (starts, ends): (Vec<i32>, Vec<i32>) = self.padding.iter().copied().unzip();
        let starts = Array::from_slice(&starts, &[rows, 1]);
        let ends = Array::from_slice(&ends, &[rows, 1]);
        let own = ops::logical_or(&ops::lt(&positions, &starts)?, &ops::ge(&positions, &ends)?)?;
        Ok(AttentionMask::Array(own.reshape(&[rows, 1, 1, keys])?))
    }
}

/// State layers (convolution or recurrent) joined on the batch axis:
/// `batch`'s rows (when there is a batch) and then `rows`, one row each. A
/// row that has seen nothing holds zeros, as its first step would start
/// from.
fn join_states(batch: Option<&LayerCache>, rows: &[LayerCache]) -> Result<LayerCache, CacheError> {
    let Some(first) = batch.or(rows.first()) else {
        return Err(CacheError::Mismatch("no caches to stack".into()));
    };
    let all: Vec<&LayerCache> = batch.into_iter().chain(rows).collect();
    let offset = all.iter().map(|c| c.offset()).max().unwrap_or(0);
    match first {
        LayerCache::Conv(c) => {
            let inputs = all
                .iter()
                .map(|r| match r {
                    LayerCache::Conv(c) => Ok(c.inputs.as_ref()),
                    other => Err(mismatch(other)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(LayerCache::Conv(ConvState {
                inputs: join_arrays(&inputs)?,
                kernel: c.kernel,
                offset,
            }))
        }
        LayerCache::Recurrent(c) => {
            let parts = all
                .iter()
                .map(|r| match r {
                    LayerCache::Recurrent(c) => Ok((c.conv.inputs.as_ref(), c.matrix.as_ref())),
                    other => Err(mismatch(other)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (inputs, matrices): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
            Ok(LayerCache::Recurrent(RecurrentState {
                conv: ConvState {
                    inputs: join_arrays(&inputs)?,
                    kernel: c.conv.kernel,
                    offset,
                },
                matrix: join_arrays(&matrices)?,
            }))
        }
        other => Err(mismatch(other)),
    }
}

/// Arrays of one or more rows each joined on the batch axis; a missing one
/// is one row of zeros.
fn join_arrays(parts: &[Option<&Array>]) -> Result<Option<Array>, CacheError> {
    let Some(template) = parts.iter().flatten().next() else {
        return Ok(None);
    };
    let mut shape = template.shape().to_vec();
    shape[0] = 1;
    let parts = parts
        .iter()
        .map(|part| match part {
            Some(a) => Ok((*a).clone()),
            None => ops::zeros_dtype(&shape, template.dtype()),
        })
        .collect::<Result<Vec<_>, Exception>>()?;
    Ok(Some(ops::concatenate(&parts, 0)?))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{inputs, positions, read_positions, values};
    use super::*;

    #[test]
    fn kv_rows_of_different_lengths_stack_left_padded_and_split_back() {
        let mut short = LayerCache::new(None);
        short
            .update_and_fetch(&positions(0, 2), &positions(0, 2))
            .unwrap();
        let mut long = LayerCache::new(None);
        long.update_and_fetch(&positions(10, 5), &positions(10, 5))
            .unwrap();
        let batch = LayerCache::stack(&[short, long]).unwrap();
        let LayerCache::Growing(kv) = &batch else {
            panic!("a stack of growing caches is one");
        };
        assert_eq!(kv.left_padding(), &[3, 0]);
        assert_eq!(batch.offset(), 5);
        assert_eq!(batch.rows(), 2);
        let rows = batch.split(&[2, 5]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].offset(), 2);
        assert_eq!(rows[1].offset(), 5);
        let LayerCache::Growing(row0) = &rows[0] else {
            panic!("rows of a growing batch are growing caches");
        };
        assert_eq!(read_positions(&row0.used().unwrap().0), vec![0., 1.]);
        // A row split off keeps growing.
        let mut row1 = rows.into_iter().nth(1).unwrap();
        let (k, _) = row1
            .update_and_fetch(&positions(15, 1), &positions(15, 1))
            .unwrap();
        assert_eq!(read_positions(&k), vec![10., 11., 12., 13., 14., 15.]);
        // Keeping only the short row drops the padding it no longer needs.
        let kept = batch.filter(&[0]).unwrap();
        assert_eq!(kept.offset(), 2);
        // A row asked for at a position it does not hold is refused.
        assert!(batch.split_row(0, 3).is_err());
    }

    /// `[B, 1, 1, keys]` booleans of a mask, one row of keys per batch row.
    fn mask_rows(mask: &AttentionMask) -> Vec<Vec<bool>> {
        let AttentionMask::Array(mask) = mask else {
            panic!("a batch with padding needs a mask array");
        };
        mask.eval().unwrap();
        let keys = *mask.shape().last().unwrap() as usize;
        mask.as_slice::<bool>()
            .chunks(keys)
            .map(<[bool]>::to_vec)
            .collect()
    }

    /// `[B, 1, n, 2]` keys with row `r`'s values `values[r]`.
    fn rows_of(values: &[f32]) -> Array {
        let data: Vec<f32> = values.iter().flat_map(|&v| [v, v]).collect();
        Array::from_slice(&data, &[values.len() as i32, 1, 1, 2])
    }

    #[test]
    fn a_growing_batch_masks_each_rows_padding_and_takes_joining_rows() {
        let mut short = LayerCache::new(None);
        short
            .update_and_fetch(&positions(0, 1), &positions(0, 1))
            .unwrap();
        let mut long = LayerCache::new(None);
        long.update_and_fetch(&positions(10, 3), &positions(10, 3))
            .unwrap();
        let mut batch = LayerCache::stack(&[short, long]).unwrap();
        // The next step writes slot 3: the short row's slots 0 and 1 are padding.
        assert_eq!(
            mask_rows(&batch.batch_mask().unwrap()),
            vec![vec![false, false, true, true], vec![true; 4]]
        );
        batch
            .update_and_fetch(&rows_of(&[1., 13.]), &rows_of(&[1., 13.]))
            .unwrap();
        let mut joining = LayerCache::new(None);
        joining
            .update_and_fetch(&positions(20, 6), &positions(20, 6))
            .unwrap();
        let batch = batch.extend(&[joining]).unwrap();
        assert_eq!(batch.rows(), 3);
        let LayerCache::Growing(kv) = &batch else {
            panic!("a growing batch stays one");
        };
        assert_eq!(kv.left_padding(), &[4, 2, 0]);
        let rows = batch.split(&[2, 4, 6]).unwrap();
        let held = |row: &LayerCache| match row {
            LayerCache::Growing(c) => read_positions(&c.used().unwrap().0),
            _ => unreachable!(),
        };
        assert_eq!(held(&rows[0]), vec![0., 1.]);
        assert_eq!(held(&rows[1]), vec![10., 11., 12., 13.]);
        assert_eq!(held(&rows[2]), vec![20., 21., 22., 23., 24., 25.]);
        // Without the longest row, the shorter ones' shared padding goes.
        let two = batch.filter(&[0, 1]).unwrap();
        assert_eq!(two.offset(), 4);
        assert_eq!(
            mask_rows(&two.batch_mask().unwrap()),
            vec![vec![false, false, true, true, true], vec![true; 5]]
        );
        let alike = LayerCache::stack(&[rows.into_iter().nth(2).unwrap()]).unwrap();
        assert!(matches!(alike.batch_mask().unwrap(), AttentionMask::None));
    }

    /// A one-row rotating cache fed positions `0..n` one at a time.
    fn rotating(max_size: i32, keep: i32, n: i32) -> LayerCache {
        let mut cache = LayerCache::Rotating(RotatingKvCache::new(max_size, keep));
        for p in 0..n {
            cache
                .update_and_fetch(&positions(p, 1), &positions(p, 1))
                .unwrap();
        }
        cache
    }

    /// A one-row rotating cache fed positions `0..n` in one prefill chunk
    /// (it holds them all until its next position).
    fn rotating_chunk(max_size: i32, keep: i32, n: i32) -> LayerCache {
        let mut cache = LayerCache::Rotating(RotatingKvCache::new(max_size, keep));
        cache
            .update_and_fetch(&positions(0, n), &positions(0, n))
            .unwrap();
        cache
    }

    /// What a one-row cache attends over at its next position `p`, sorted.
    fn next_keys(cache: &mut LayerCache, p: i32) -> Vec<f32> {
        let (k, _) = cache
            .update_and_fetch(&positions(p, 1), &positions(p, 1))
            .unwrap();
        let mut held = read_positions(&k);
        held.sort_by(f32::total_cmp);
        held
    }

    /// A batch of rotating caches attends, in each row, over exactly the
    /// positions the row's cache alone holds, step after step, across the
    /// window's wrap, whether it keeps its first tokens or not; and a row
    /// split off at the end holds them in order and goes on alone.
    #[test]
    fn rotating_rows_in_a_batch_see_what_they_would_see_alone() {
        for keep in [0, 2] {
            // The last row's prompt came in one chunk longer than the window.
            let lengths = [3, 9, 6, 10];
            let make = |row: usize, n: i32| match row {
                3 => rotating_chunk(6, keep, n),
                _ => rotating(6, keep, n),
            };
            let mut alone: Vec<LayerCache> = lengths
                .iter()
                .enumerate()
                .map(|(r, &n)| make(r, n))
                .collect();
            let rows: Vec<LayerCache> = lengths
                .iter()
                .enumerate()
                .map(|(r, &n)| make(r, n))
                .collect();
            let mut batch = LayerCache::stack(&rows).unwrap();
            for step in 0..8 {
                let next: Vec<f32> = lengths.iter().map(|&n| (n + step) as f32).collect();
                let mask = batch.batch_mask().unwrap();
                let (k, _) = batch
                    .update_and_fetch(&rows_of(&next), &rows_of(&next))
                    .unwrap();
                k.eval().unwrap();
                let keys = k.shape()[2] as usize;
                let held: Vec<f32> = k.as_slice::<f32>().iter().step_by(2).copied().collect();
                let own = match &mask {
                    AttentionMask::None => vec![vec![true; keys]; lengths.len()],
                    mask => mask_rows(mask),
                };
                assert!(own.iter().all(|row| row.len() == keys), "step {step}");
                for (row, cache) in alone.iter_mut().enumerate() {
                    let mut seen: Vec<f32> = held[row * keys..(row + 1) * keys]
                        .iter()
                        .zip(&own[row])
                        .filter(|(_, own)| **own)
                        .map(|(v, _)| *v)
                        .collect();
                    seen.sort_by(f32::total_cmp);
                    let expected = next_keys(cache, next[row] as i32);
                    assert_eq!(seen, expected, "keep {keep}, step {step}, row {row}");
                }
            }
            let positions_seen: Vec<i32> = lengths.iter().map(|n| n + 8).collect();
            let mut rows = batch.split(&positions_seen).unwrap();
            for (row, cache) in rows.iter_mut().enumerate() {
                assert_eq!(cache.offset(), positions_seen[row]);
                let p = positions_seen[row];
                assert_eq!(
                    next_keys(cache, p),
                    next_keys(&mut alone[row], p),
                    "keep {keep}, row {row} alone again"
                );
            }
        }
    }

    #[test]
    fn a_rotating_batch_takes_a_joining_row_and_keeps_windows_apart() {
        let mut batch = LayerCache::stack(&[rotating(4, 0, 2), rotating(4, 0, 7)]).unwrap();
        batch
            .update_and_fetch(&rows_of(&[2., 7.]), &rows_of(&[2., 7.]))
            .unwrap();
        let batch = batch.extend(&[rotating(4, 0, 1)]).unwrap();
        assert_eq!(batch.rows(), 3);
        let rows = batch.split(&[3, 8, 1]).unwrap();
        let held = |row: &LayerCache| match row {
            LayerCache::Rotating(c) => read_positions(c.keys.as_ref().unwrap()),
            _ => unreachable!(),
        };
        assert_eq!(held(&rows[0]), vec![0., 1., 2.]);
        assert_eq!(held(&rows[1]), vec![4., 5., 6., 7.]);
        assert_eq!(held(&rows[2]), vec![0.]);
        let mixed = LayerCache::stack(&[rotating(4, 0, 1), rotating(5, 0, 1)]);
        assert!(mixed.is_err(), "windows of different sizes do not batch");
    }

    #[test]
    fn state_rows_stack_split_extend_and_filter_on_the_batch_axis() {
        let mut a = ConvState::new(3);
        a.extend(&inputs(0, 4)).unwrap();
        let mut b = ConvState::new(3);
        b.extend(&inputs(100, 1)).unwrap();
        let empty = ConvState::new(3);
        let batch = LayerCache::stack(&[
            LayerCache::Conv(a),
            LayerCache::Conv(b),
            LayerCache::Conv(empty),
        ])
        .unwrap();
        assert_eq!(batch.rows(), 3);
        // Three rows of 2 inputs x 2 channels x 4 bytes.
        assert_eq!(batch.nbytes(), 48);
        let rows = batch.split(&[4, 1, 0]).unwrap();
        let kept = |l: &LayerCache| match l {
            LayerCache::Conv(c) => values(c.inputs.as_ref().unwrap()),
            _ => unreachable!(),
        };
        assert_eq!(kept(&rows[0]), vec![2., -2., 3., -3.]);
        assert_eq!(kept(&rows[1]), vec![0., 0., 100., -100.]);
        assert_eq!(
            kept(&rows[2]),
            vec![0.; 4],
            "a row that saw nothing holds zeros"
        );
        assert_eq!(rows[1].offset(), 1, "a row split off has its own position");
        let two = batch.filter(&[2, 0]).unwrap();
        assert_eq!(two.rows(), 2);
        assert_eq!(kept(&two)[4..], [2., -2., 3., -3.]);
        let mut c = ConvState::new(3);
        c.extend(&inputs(7, 2)).unwrap();
        let three = two.extend(&[LayerCache::Conv(c)]).unwrap();
        assert_eq!(three.rows(), 3);
        assert_eq!(kept(&three)[8..], [7., -7., 8., -8.]);
        let mut r = RecurrentState::new(2);
        r.set_matrix(ops::ones::<f32>(&[1, 2, 3, 4]).unwrap());
        let stacked = LayerCache::stack(&[
            LayerCache::Recurrent(r.clone()),
            LayerCache::Recurrent(RecurrentState::new(2)),
        ])
        .unwrap();
        let LayerCache::Recurrent(both) = &stacked else {
            panic!("recurrent rows stack into a recurrent state");
        };
        assert_eq!(both.matrix().unwrap().shape(), &[2, 2, 3, 4]);
        assert_eq!(values(both.matrix().unwrap())[24..], [0.; 24]);
        assert!(LayerCache::stack(&[LayerCache::Recurrent(r), LayerCache::new(None)]).is_err());
    }
}
