//! How fast this machine can stream memory through MLX, measured once and
//! kept, so decode speed can be shown against its ceiling: a decode step reads
//! every weight and the whole KV cache, so tokens/s x bytes per token can
//! never beat the memory bandwidth.

use std::time::Instant;

use mlx_rs::{Array, ops};

use super::SessionPool;
use crate::engine::{RunError, mlx_failure};
use crate::store::Store;

/// Bytes streamed per measurement: large enough to leave every cache far
/// behind, small enough for an 8 GB Mac.
const PROBE_BYTES: usize = 256 << 20;
const PROBE_REPEATS: usize = 5;

/// Measures the read bandwidth MLX reaches on its default device, in GB/s
/// (10^9 bytes): the best of a few full reductions over a large array.
pub fn measure_bandwidth_gbps(pool: &SessionPool) -> Result<f64, RunError> {
    pool.call(|| -> Result<f64, String> {
        let elements = (PROBE_BYTES / 4) as i32;
        let data = ops::ones::<f32>(&[elements]).map_err(|e| mlx_failure(&e))?;
        data.eval().map_err(|e| mlx_failure(&e))?;
        let mut best = f64::INFINITY;
        // The first pass also compiles the kernel; the best of the rest counts.
        for _ in 0..=PROBE_REPEATS {
            let start = Instant::now();
            let total: Array = data.sum(None).map_err(|e| mlx_failure(&e))?;
            total.eval().map_err(|e| mlx_failure(&e))?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(PROBE_BYTES as f64 / best / 1e9)
    })?
    .map_err(RunError::Internal)
}

/// The stored bandwidth of this machine and backend, measuring it the first
/// time (about a second).
pub fn bandwidth_gbps(
    pool: &SessionPool,
    store: &mut Store,
    backend: &str,
    device: &str,
) -> Result<f64, RunError> {
    let key = setting_key(backend, device);
    if let Some(stored) = store
        .setting(&key)
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok())
    {
        return Ok(stored);
    }
    let measured = measure_bandwidth_gbps(pool)?;
    // Not being able to store it only means measuring again next time.
    let _ = store.set_setting(&key, &format!("{measured:.3}"));
    Ok(measured)
}

/// The stored bandwidth, without measuring.
pub fn stored_bandwidth_gbps(store: &Store, backend: &str, device: &str) -> Option<f64> {
    store
        .setting(&setting_key(backend, device))
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok())
}

fn setting_key(backend: &str, device: &str) -> String {
    format!("memory_bandwidth_gbps/{backend}/{device}")
}
