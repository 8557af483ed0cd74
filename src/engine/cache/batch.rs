//! The batch operations of the cache: one-row caches joined into one batch
//! (`stack`), taken apart again (`split`), and cut to some rows (`filter`).

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

use super::{CacheError, ConvState, KvCache, LayerCache, RecurrentState};

impl LayerCache {
    /// One-row caches of the same kind joined into one batch: KV rows are
    /// left-padded to the longest (each row's padding recorded), states
    /// stacked on the batch axis (their size does not depend on length).
    pub fn stack(rows: &[LayerCache]) -> Result<LayerCache, CacheError> {
        let Some(first) = rows.first() else {
            return Err(CacheError::Mismatch("no caches to stack".into()));
        };
        let mismatch = || {
            CacheError::Mismatch(format!(
                "caches of different kinds cannot be stacked (the first is a {})",
                first.kind()
            ))
        };
        match first {
            LayerCache::Growing(_) => {
                let kv: Vec<&KvCache> = rows
                    .iter()
                    .map(|r| match r {
                        LayerCache::Growing(c) => Ok(c),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(LayerCache::Growing(stack_kv(&kv)?))
            }
            LayerCache::Conv(c) => {
                let inputs = rows
                    .iter()
                    .map(|r| match r {
                        LayerCache::Conv(c) => Ok(c.inputs.as_ref()),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(LayerCache::Conv(ConvState {
                    inputs: stack_states(&inputs)?,
                    kernel: c.kernel,
                    offset: rows.iter().map(LayerCache::offset).max().unwrap_or(0),
                }))
            }
            LayerCache::Recurrent(c) => {
                let parts = rows
                    .iter()
                    .map(|r| match r {
                        LayerCache::Recurrent(c) => Ok((c.conv.inputs.as_ref(), c.matrix.as_ref())),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let (inputs, matrices): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
                Ok(LayerCache::Recurrent(RecurrentState {
                    conv: ConvState {
                        inputs: stack_states(&inputs)?,
                        kernel: c.conv.kernel,
                        offset: rows.iter().map(LayerCache::offset).max().unwrap_or(0),
                    },
                    matrix: stack_states(&matrices)?,
                }))
            }
            LayerCache::Rotating(_) => Err(CacheError::Mismatch(
                "rotating KV caches are not batched yet; use growing ones".into(),
            )),
        }
    }

    /// The batch taken apart into one-row caches, each without its padding.
    pub fn split(&self) -> Result<Vec<LayerCache>, CacheError> {
        let rows = self.rows()?;
        (0..rows).map(|row| self.select(&[row])).collect()
    }

    /// Keeps the rows `keep` (in that order), as a batch.
    pub fn filter(&self, keep: &[usize]) -> Result<LayerCache, CacheError> {
        self.select(keep)
    }

    /// Rows of the batch (0 while empty).
    pub fn rows(&self) -> Result<usize, CacheError> {
        let first = self.state().first().map(|a| a.shape()[0]).unwrap_or(0);
        Ok(first.max(0) as usize)
    }

    /// The rows `keep` of the batch; padding every kept row has is dropped.
    fn select(&self, keep: &[usize]) -> Result<LayerCache, CacheError> {
        let indices: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let pick = |a: &Array| -> Result<Array, Exception> {
            a.take_axis(Array::from_slice(&indices, &[indices.len() as i32]), 0)
        };
        let pick_state = |a: Option<&Array>| a.map(pick).transpose();
        match self {
            LayerCache::Growing(c) => {
                let Some((k, v)) = c.used() else {
                    return Ok(LayerCache::Growing(KvCache::default()));
                };
                let padding: Vec<i32> = keep
                    .iter()
                    .map(|&r| c.left_padding.get(r).copied().unwrap_or(0))
                    .collect();
                // Padding every kept row has is not needed any more.
                let shared = padding.iter().copied().min().unwrap_or(0);
                let (k, v) = (pick(&k)?, pick(&v)?);
                let (k, v) = (
                    k.index((.., .., shared.., ..)),
                    v.index((.., .., shared.., ..)),
                );
                let left: Vec<i32> = padding.iter().map(|p| p - shared).collect();
                let left = if keep.len() == 1 { Vec::new() } else { left };
                Ok(LayerCache::Growing(KvCache::holding(k, v, left)))
            }
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
            LayerCache::Rotating(_) => Err(CacheError::Mismatch(
                "rotating KV caches are not batched yet; use growing ones".into(),
            )),
        }
    }
}

/// Growing KV caches of one row each, left-padded with zeros to the
/// longest and joined on the batch axis.
fn stack_kv(rows: &[&KvCache]) -> Result<KvCache, CacheError> {
    let longest = rows.iter().map(|c| c.offset).max().unwrap_or(0);
    let Some((template, _)) = rows.iter().find_map(|c| c.used()) else {
        return Ok(KvCache::default());
    };
    let shape = template.shape().to_vec();
    let mut keys = Vec::with_capacity(rows.len());
    let mut values = Vec::with_capacity(rows.len());
    let mut padding = Vec::with_capacity(rows.len());
    for row in rows {
        if row.left_padding.len() > 1 {
            return Err(CacheError::Mismatch(
                "a batch cannot be stacked again; split it first".into(),
            ));
        }
        let pad = longest - row.offset;
        let zeros = |dtype| ops::zeros_dtype(&[1, shape[1], pad, shape[3]], dtype);
        let (k, v) = match row.used() {
            Some((k, v)) if pad > 0 => (
                ops::concatenate(&[zeros(k.dtype())?, k], 2)?,
                ops::concatenate(&[zeros(v.dtype())?, v], 2)?,
            ),
            Some(kv) => kv,
            None => (zeros(template.dtype())?, zeros(template.dtype())?),
        };
        keys.push(k);
        values.push(v);
        padding.push(pad);
    }
    Ok(KvCache::holding(
        ops::concatenate(&keys, 0)?,
        ops::concatenate(&values, 0)?,
        padding,
    ))
}

/// States of one row each joined on the batch axis; a row that has seen
/// nothing yet holds zeros, as its first step would start from.
fn stack_states(rows: &[Option<&Array>]) -> Result<Option<Array>, CacheError> {
    let Some(template) = rows.iter().flatten().next() else {
        return Ok(None);
    };
    let mut shape = template.shape().to_vec();
    shape[0] = 1;
    let parts = rows
        .iter()
        .map(|row| match row {
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
        assert_eq!(batch.rows().unwrap(), 2);
        let rows = batch.split().unwrap();
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
    }

    #[test]
    fn state_rows_stack_split_and_filter_on_the_batch_axis() {
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
        assert_eq!(batch.rows().unwrap(), 3);
        // Three rows of 2 inputs x 2 channels x 4 bytes.
        assert_eq!(batch.nbytes(), 48);
        let rows = batch.split().unwrap();
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
        let two = batch.filter(&[2, 0]).unwrap();
        assert_eq!(two.rows().unwrap(), 2);
        assert_eq!(kept(&two)[4..], [2., -2., 3., -3.]);
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
