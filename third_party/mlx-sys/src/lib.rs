#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Ondo patch: mlx-rs seeds its random state with the macOS-only
/// `mach_approximate_time`; elsewhere this stand-in answers with a monotonic
/// clock in nanoseconds, so `random::*` and `Embedding::new` link.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
