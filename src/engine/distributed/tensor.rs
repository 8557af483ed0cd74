//! Tensor parallelism: every rank holds a slice of every layer, and the
//! ranks compute each layer together. The queries', keys', values', gate's
//! and up projections are cut by output rows (each rank computes its own
//! heads and its own share of the MLP's width); the attention's output
//! projection and the MLP's down projection are cut by input columns, so
//! each rank's product is a partial sum that one `all_sum` completes (the
//! layer's bias, if any, added once after it). This is mlx-lm's `shard`
//! (`shard_linear`'s "all-to-sharded" and "sharded-to-all"): the same
//! slices, the same sums, so the same numbers.
//!
//! Two sums a layer make each decode step latency-bound on a slow link,
//! where the pipeline split (`pipeline`) sends one hidden state a step; in
//! exchange every rank works on every token.

use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;

use super::Group;
use crate::engine::LoadError;
use crate::engine::weights::WeightMap;
use crate::family::config::ModelConfig;

/// One rank's part of a model split by heads and MLP columns.
pub struct TensorShards {
    group: Group,
}

impl std::fmt::Debug for TensorShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorShards")
            .field("rank", &self.group.rank())
            .field("size", &self.group.size())
            .finish()
    }
}

impl TensorShards {
    pub fn new(group: Group) -> Self {
        Self { group }
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn size(&self) -> usize {
        self.group.size()
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The sum of every rank's partial `x`, on every rank.
    pub fn sum(&self, x: &Array) -> Result<Array, Exception> {
        if super::compute::computing_alone() {
            return Ok(x.clone());
        }
        self.group.all_sum(x)
    }
}

/// Why `config`'s layers cannot be cut by heads over `size` ranks, if they
/// cannot: only layers of plain attention and one dense MLP are, with
/// heads, KV heads and MLP width that the ranks divide evenly.
pub fn refusal(config: &ModelConfig, size: usize) -> Option<String> {
    let n = size as i32;
    let shape = if config.experts.is_some() {
        Some("routed experts")
    } else if config.short_conv.is_some() || config.gated_delta.is_some() {
        Some("layers that are not attention")
    } else if config.fused_projections {
        Some("q, k and v stored as one matrix")
    } else if config.full_attention.is_some() || config.kv_shared_layers > 0 {
        Some("layers of different heads")
    } else if config.attention_output_gate || config.attention_sinks {
        Some("per-head gates or sinks")
    } else if config.per_layer_input.is_some() {
        Some("per-layer inputs")
    } else {
        None
    };
    if let Some(shape) = shape {
        return Some(format!(
            "{} has {shape}, which Ondo does not cut by heads: split it by layers \
             (--split pipeline)",
            config.model_type
        ));
    }
    let parts = [
        ("attention heads", config.num_attention_heads),
        ("KV heads", config.num_key_value_heads),
        ("MLP width", config.intermediate_size),
    ];
    if let Some((what, count)) = parts.iter().find(|(_, count)| count % n != 0) {
        return Some(format!(
            "its {count} {what} do not divide over {size} ranks: split it by layers \
             (--split pipeline) or use a number of ranks that divides them"
        ));
    }
    if let Some(quant) = &config.quantization {
        let group = quant.group_size;
        let widths = [
            (
                "attention output",
                config.num_attention_heads * config.head_dim,
            ),
            ("MLP", config.intermediate_size),
        ];
        if let Some((what, width)) = widths.iter().find(|(_, w)| (w / n) % group != 0) {
            return Some(format!(
                "each rank's share of the {what}'s {width} inputs is not a whole number of \
                 quantization groups of {group}: split it by layers (--split pipeline)"
            ));
        }
    }
    None
}

/// `config` as one rank of `size` sees its layers: its share of the heads,
/// KV heads and MLP width (each head keeps its size and scale).
pub fn shard_config(config: &ModelConfig, size: usize) -> ModelConfig {
    let n = size as i32;
    ModelConfig {
        num_attention_heads: config.num_attention_heads / n,
        num_key_value_heads: config.num_key_value_heads / n,
        intermediate_size: config.intermediate_size / n,
        ..config.clone()
    }
}

/// Replaces every layer's projection tensors under `root.layers.N` in `w`
/// by `rank`'s slice of them, copied out so that the whole tensor is freed
/// once read. Rows for the projections into heads and MLP width; columns
/// for the projections out of them, whose bias stays whole (added after the
/// sum).
pub fn shard_weights(
    w: &mut WeightMap,
    config: &ModelConfig,
    root: &str,
    rank: usize,
    size: usize,
) -> Result<(), LoadError> {
    let names = config.names;
    for i in 0..config.num_hidden_layers {
        let p = format!("{root}.layers.{i}");
        let by_rows = [
            format!("{p}.self_attn.q_proj"),
            format!("{p}.self_attn.k_proj"),
            format!("{p}.self_attn.v_proj"),
            format!("{p}.{}.{}", names.mlp, names.gate_up_down[0]),
            format!("{p}.{}.{}", names.mlp, names.gate_up_down[1]),
        ];
        let by_columns = [
            format!("{p}.self_attn.{}", names.o_proj),
            format!("{p}.{}.{}", names.mlp, names.gate_up_down[2]),
        ];
        let mut cut = Vec::new();
        for prefix in &by_rows {
            for part in ["weight", "scales", "biases", "bias"] {
                cut.push((format!("{prefix}.{part}"), Axis::Rows));
            }
        }
        for prefix in &by_columns {
            for part in ["weight", "scales", "biases"] {
                cut.push((format!("{prefix}.{part}"), Axis::Columns));
            }
        }
        let mut made = Vec::new();
        for (name, axis) in cut {
            if !w.contains(&name) {
                continue;
            }
            let stored = w.take_stored(&name)?;
            let slice = slice_of(&stored.array, axis, rank, size).map_err(|message| {
                LoadError::Split(format!("tensor `{name}` in {}: {message}", stored.file))
            })?;
            made.push(slice.clone());
            w.insert(name, slice, stored.file);
        }
        // One layer at a time: each whole tensor is read, cut and freed
        // before the next layer's are read.
        mlx_rs::transforms::eval(made.iter())?;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Axis {
    Rows,
    Columns,
}

/// `rank`'s contiguous `1/size` of `array` along `axis` (the first, or the
/// last), as a copy of its own.
fn slice_of(array: &Array, axis: Axis, rank: usize, size: usize) -> Result<Array, String> {
    let shape = array.shape();
    let dim = match axis {
        Axis::Rows => shape.first().copied(),
        Axis::Columns => shape.last().copied(),
    }
    .unwrap_or(0);
    let n = size as i32;
    if dim == 0 || dim % n != 0 {
        return Err(format!(
            "its {dim} {} do not divide over {size} ranks",
            match axis {
                Axis::Rows => "rows",
                Axis::Columns => "columns",
            }
        ));
    }
    let (start, end) = (dim / n * rank as i32, dim / n * (rank as i32 + 1));
    let part = match (axis, shape.len()) {
        (Axis::Rows, _) | (Axis::Columns, 1) => array.index(start..end),
        (Axis::Columns, _) => array.index((.., start..end)),
    };
    part.contiguous().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_takes_its_own_rows_or_columns_in_rank_order() {
        let x = Array::from_slice(&(0..24).map(|v| v as f32).collect::<Vec<_>>(), &[4, 6]);
        let rows = slice_of(&x, Axis::Rows, 1, 2).unwrap();
        assert_eq!(rows.shape(), &[2, 6]);
        assert_eq!(rows.as_slice::<f32>()[0], 12.0);
        let columns = slice_of(&x, Axis::Columns, 2, 3).unwrap();
        assert_eq!(columns.shape(), &[4, 2]);
        assert_eq!(
            columns.as_slice::<f32>(),
            &[4., 5., 10., 11., 16., 17., 22., 23.]
        );
        let error = slice_of(&x, Axis::Rows, 0, 3).unwrap_err();
        assert!(
            error.contains("4 rows") && error.contains("3 ranks"),
            "{error}"
        );
    }
}
