//! How fast the ranks reach each other, measured through the same MLX
//! operations a split model uses: an activation passed from rank to rank
//! around the group (what pipeline parallelism does once per step), and a
//! sum across ranks (what tensor parallelism does twice per layer).

use std::time::Instant;

use mlx_rs::Dtype;
use mlx_rs::error::Exception;
use serde::Serialize;

use super::Group;

/// One message size's timings, on rank 0.
#[derive(Debug, Clone, Serialize)]
pub struct LinkTiming {
    pub bytes: u64,
    /// Median time for one hop of the relay (rank to next rank), in
    /// milliseconds: the round around the group over the number of hops.
    pub hop_ms: f64,
    /// Bytes over `hop_ms`, in GB/s.
    pub hop_gbps: f64,
    /// Median time of one sum of the message across every rank, in ms.
    pub all_sum_ms: f64,
    /// The fastest hop and sum seen: what the link itself costs, without
    /// the waits a busy machine adds to some of them.
    pub hop_best_ms: f64,
    pub all_sum_best_ms: f64,
}

/// Message sizes worth knowing: a decode step's activation for a
/// 4096-wide model in 16-bit floats, a 512-token prefill chunk of it, and
/// a large transfer that shows the link's bandwidth.
pub const PROBE_BYTES: [u64; 3] = [8 << 10, 4 << 20, 32 << 20];

/// Passes a message of `bytes` around the group `rounds` times and sums it
/// across the ranks `rounds` times; every rank must call this with the same
/// arguments. Rank 0's timings are the ones that mean something (the
/// others wait for it).
pub fn probe(group: &Group, bytes: u64, rounds: usize) -> Result<LinkTiming, Exception> {
    let elements = (bytes / 2).max(1) as i32;
    let message = mlx_rs::ops::ones::<f32>(&[elements])?.as_dtype(Dtype::Float16)?;
    message.eval()?;
    let (rank, size) = (group.rank(), group.size());
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;
    let mut rounds_ms = Vec::with_capacity(rounds);
    let mut sums_ms = Vec::with_capacity(rounds);
    // One round unmeasured: the first use of each connection.
    for round in 0..=rounds {
        let started = Instant::now();
        if rank == 0 {
            // Rank 0 passes the message on before it waits for it to come
            // back: two evaluations, since a receive has no input that
            // could order it after the send.
            group.send(&message, next)?.eval()?;
            group.recv_like(&message, previous)?.eval()?;
        } else {
            let got = group.recv_like(&message, previous)?;
            group.send(&got, next)?.eval()?;
        }
        let relay = started.elapsed().as_secs_f64() * 1e3;
        if round > 0 {
            rounds_ms.push(relay);
        }
    }
    // The sums back to back, after one that lines the ranks up: a sum
    // timed while another rank is still finishing the relay would time
    // the wait.
    group.all_sum(&message)?.eval()?;
    for _ in 0..rounds.max(1) * 2 {
        let started = Instant::now();
        group.all_sum(&message)?.eval()?;
        sums_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let best = |values: &[f64]| values.iter().copied().fold(f64::INFINITY, f64::min);
    let (hop_best_ms, all_sum_best_ms) = (best(&rounds_ms) / size as f64, best(&sums_ms));
    let hop_ms = median(&mut rounds_ms) / size as f64;
    Ok(LinkTiming {
        bytes,
        hop_ms,
        hop_gbps: if hop_ms > 0.0 {
            bytes as f64 / (hop_ms * 1e6)
        } else {
            0.0
        },
        all_sum_ms: median(&mut sums_ms),
        hop_best_ms,
        all_sum_best_ms,
    })
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
