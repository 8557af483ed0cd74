//! Pipeline parallelism: each rank holds a contiguous range of a model's
//! layers (and the KV cache of those layers), receives the hidden states
//! from the rank before it in the pipeline, runs its layers and passes the
//! result on. The rank with the last layers is rank 0, which serves and
//! samples; the final hidden states are then gathered on every rank, so
//! every rank computes the same logits and draws the same token, and the
//! ranks stay in step without telling each other anything more.
//!
//! The split is mlx-lm's (`PipelineMixin.pipeline`): as even as it can be,
//! the lower ranks taking one layer more where the count does not divide,
//! the highest rank running the first layers.

use std::cell::RefCell;
use std::sync::OnceLock;

use mlx_rs::Array;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;

use super::{Group, Launch};

/// The launch this process joined (`set_joined`), if it is one rank of
/// several.
static JOINED: OnceLock<Launch> = OnceLock::new();

/// Records that this process joined `launch`'s group: every model it loads
/// from now on is split across the ranks.
pub fn set_joined(launch: Launch) {
    let _ = JOINED.set(launch);
}

/// The launch this process joined, if any.
pub fn joined() -> Option<&'static Launch> {
    JOINED.get().filter(|launch| launch.size > 1)
}

pub use crate::family::shards::layer_range;

/// One rank's part of a split model.
pub struct Stage {
    group: Group,
    /// The global index of this rank's first layer.
    pub first: usize,
    /// One past its last layer.
    pub end: usize,
    /// The send of the last hidden states built, which nothing on this rank
    /// reads: `fill_cache` evaluates it with the caches (`take_sent`).
    sent: RefCell<Option<Array>>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("rank", &self.group.rank())
            .field("size", &self.group.size())
            .field("layers", &(self.first..self.end))
            .finish()
    }
}

impl Stage {
    /// This process's stage of a model of `layers` layers in `launch`.
    pub fn of_launch(launch: &Launch, layers: usize) -> Result<Option<Self>, String> {
        // MLX keeps the group it made at the join: this returns it at once.
        let group = Group::init(launch.backend)?;
        let (first, end) = layer_range(layers, group.rank(), group.size())?;
        Ok(Some(Self {
            group,
            first,
            end,
            sent: RefCell::new(None),
        }))
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

    pub fn owns(&self, layer: usize) -> bool {
        (self.first..self.end).contains(&layer)
    }

    /// The hidden states this rank's first layer reads: `h` itself on the
    /// rank running the model's first layers, else the previous stage's,
    /// received (`h` only gives the shape and dtype).
    pub fn receive(&self, h: Array) -> Result<Array, Exception> {
        self.sent.replace(None);
        if self.rank() + 1 == self.size() || super::compute::computing_alone() {
            return Ok(h);
        }
        self.group.recv_like(&h, self.rank() + 1)
    }

    /// Passes this rank's output on to the next stage and returns the
    /// model's final hidden states (rank 0's), gathered on every rank.
    pub fn pass_on(&self, h: Array) -> Result<Array, Exception> {
        if super::compute::computing_alone() {
            return Ok(h);
        }
        let rows = h.shape()[0];
        let h = if self.rank() == 0 {
            h
        } else {
            let sent = self.group.send(&h, self.rank() - 1)?;
            self.sent.replace(Some(sent.clone()));
            sent
        };
        Ok(self.group.all_gather(&h)?.index(0..rows))
    }

    /// The send of the last hidden states built, if it has not been taken:
    /// to be evaluated where only the caches are (a prefill chunk).
    pub fn take_sent(&self) -> Option<Array> {
        self.sent.take()
    }
}
