//! Orders: how rank 0 of a split model that serves requests (`ondo serve
//! --hostfile`) tells the other ranks what to run next. The others wait in
//! a gather for rank 0's order; each order is a whole generation request,
//! which every rank then runs on its part of the model in step (the same
//! prompt, sampler and seed give every rank the same tokens, and the
//! per-step stop flag in `generate` ends them together). A rank that cannot
//! run it says so in the answer that follows every order, before any rank
//! starts the model's collectives.

use std::sync::atomic::{AtomicBool, Ordering};

use mlx_rs::Array;
use serde::{Deserialize, Serialize};

use super::Group;
use crate::engine::request::GenerateRequest;

/// What rank 0 asks of the other ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "order")]
pub enum Order {
    /// Run this generation on your part of the model (its model folder is
    /// rank 0's: each rank runs it on its own copy).
    Generate { request: Box<GenerateRequest> },
    /// Rank 0 stops serving: leave the group and end.
    Finish,
}

/// Whether this process is rank 0 of a split model that serves requests:
/// its engine gives the other ranks an order before each generation on it.
static SERVING: AtomicBool = AtomicBool::new(false);

/// Makes this process (rank 0) give orders for the split model's runs.
pub fn start_serving() {
    SERVING.store(true, Ordering::Relaxed);
}

pub fn is_serving() -> bool {
    SERVING.load(Ordering::Relaxed)
}

/// Every rank's `own` bytes, in rank order, gathered on every rank. Parts
/// of any length: the lengths are gathered first, then the parts padded to
/// the longest (MLX's gather concatenates equal shapes).
pub fn gather_bytes(group: &Group, own: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let failed = |e: mlx_rs::error::Exception| e.what().to_owned();
    let length = i32::try_from(own.len()).map_err(|_| "a message over 2 GiB".to_owned())?;
    let lengths = group
        .all_gather(&Array::from_slice(&[length], &[1]))
        .map_err(failed)?;
    lengths.eval().map_err(failed)?;
    let lengths: Vec<usize> = lengths
        .as_slice::<i32>()
        .iter()
        .map(|&n| n.max(0) as usize)
        .collect();
    let longest = lengths.iter().copied().max().unwrap_or(0).max(1);
    let mut padded = own.to_vec();
    padded.resize(longest, 0);
    let part = Array::from_slice(&padded, &[1, longest as i32]);
    let all = group.all_gather(&part).map_err(failed)?;
    all.eval().map_err(failed)?;
    let bytes: &[u8] = all.as_slice();
    Ok(bytes
        .chunks(longest)
        .zip(&lengths)
        .map(|(chunk, &n)| chunk[..n.min(chunk.len())].to_vec())
        .collect())
}

/// Rank 0 gives `order` to every other rank.
pub fn send(group: &Group, order: &Order) -> Result<(), String> {
    let bytes = serde_json::to_vec(order).map_err(|e| e.to_string())?;
    gather_bytes(group, &bytes)
        .map(drop)
        .map_err(|e| format!("the order could not reach the other ranks: {e}"))
}

/// A rank other than 0 waits for rank 0's next order.
pub fn receive(group: &Group) -> Result<Order, String> {
    let parts = gather_bytes(group, &[])
        .map_err(|e| format!("waiting for rank 0's next order failed: {e}"))?;
    let first = parts.first().ok_or("the gather returned no ranks")?;
    serde_json::from_slice(first)
        .map_err(|e| format!("rank 0 sent an order this Ondo cannot read ({e})"))
}

/// Every rank says whether it can run the order it was given (`Err` with
/// the reason); every rank learns the first rank that cannot, so either
/// all of them run it or none does. The outer `Err` is a failed link.
pub fn answer(group: &Group, own: Result<(), String>) -> Result<Result<(), String>, String> {
    let said = serde_json::to_vec(&own).map_err(|e| e.to_string())?;
    let parts = gather_bytes(group, &said)
        .map_err(|e| format!("the ranks could not answer the order: {e}"))?;
    for (rank, part) in parts.iter().enumerate() {
        let answer: Result<(), String> = serde_json::from_slice(part)
            .unwrap_or_else(|e| Err(format!("it answered in a way this Ondo cannot read ({e})")));
        if let Err(reason) = answer {
            return Ok(Err(format!("rank {rank} cannot run it: {reason}")));
        }
    }
    Ok(Ok(()))
}
