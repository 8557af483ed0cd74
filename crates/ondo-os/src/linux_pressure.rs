//! Linux memory pressure: PSI, the `/proc/meminfo` breakdown mapped onto
//! Activity Monitor's labels, swap counters and this process's footprint.
//!
//! Everything is parsed from `&str` so that tests feed recorded `/proc` files.

use std::{fs, io};

use crate::linux::{meminfo_bytes, parse_meminfo};
use crate::pressure::{LevelSource, MemorySnapshot, PressureLevel, Psi, unix_ms_now};

pub(crate) fn memory_snapshot() -> io::Result<MemorySnapshot> {
    let meminfo = fs::read_to_string("/proc/meminfo")?;
    // Missing without CONFIG_PSI, and unreadable (EOPNOTSUPP) when booted with
    // psi=0: either way the level falls back to the MemAvailable ratio.
    let pressure = fs::read_to_string("/proc/pressure/memory").ok();
    let vmstat = fs::read_to_string("/proc/vmstat").ok();
    let self_status = fs::read_to_string("/proc/self/status")?;
    let texts = ProcTexts {
        meminfo: &meminfo,
        pressure: pressure.as_deref(),
        vmstat: vmstat.as_deref(),
        self_status: &self_status,
    };
    snapshot_from_proc(&texts, unix_ms_now())
}

/// The `/proc` files one snapshot is made from.
pub(crate) struct ProcTexts<'a> {
    pub meminfo: &'a str,
    /// `/proc/pressure/memory`, `None` when the kernel has no PSI.
    pub pressure: Option<&'a str>,
    pub vmstat: Option<&'a str>,
    /// `/proc/self/status`.
    pub self_status: &'a str,
}

/// Builds a snapshot from `/proc` texts.
///
/// The breakdown maps meminfo onto Activity Monitor's labels (a project
/// decision, so that one gauge reads the same on both OSes):
/// - used = MemTotal - MemAvailable (old kernels: MemFree + Cached stands in
///   for MemAvailable);
/// - cached = Cached + Buffers - Shmem, at least 0: Shmem (tmpfs, shared
///   anonymous memory) sits in Cached but cannot be dropped like file pages;
/// - wired = Unevictable; not + Mlocked, which is a subset of Unevictable.
///   Unlike macOS, kernel memory (slab, page tables) is not in it and so
///   lands in app;
/// - compressed = Zswap, the RAM the zswap pool holds (0 without the line);
/// - app = used - wired - compressed, at least 0;
/// - swap used = SwapTotal - SwapFree.
pub(crate) fn snapshot_from_proc(
    texts: &ProcTexts,
    taken_at_unix_ms: u64,
) -> io::Result<MemorySnapshot> {
    let totals = parse_meminfo(texts.meminfo)?;
    let field = |name: &str| meminfo_bytes(texts.meminfo, name).unwrap_or(0);

    let total_bytes = totals.total_bytes;
    let available_bytes = totals.available_bytes.min(total_bytes);
    let used_bytes = total_bytes - available_bytes;
    let cached_bytes = field("Cached")
        .saturating_add(field("Buffers"))
        .saturating_sub(field("Shmem"));
    let wired_bytes = field("Unevictable");
    let compressed_bytes = field("Zswap");
    let app_bytes = used_bytes
        .saturating_sub(wired_bytes)
        .saturating_sub(compressed_bytes);
    let swap_total_bytes = field("SwapTotal");
    let swap_used_bytes = swap_total_bytes.saturating_sub(field("SwapFree"));

    let psi = texts.pressure.and_then(parse_psi);
    let (level, level_source) = pressure_level(psi.as_ref(), available_bytes, total_bytes);
    let swap_in_pages = texts.vmstat.and_then(|text| vmstat_counter(text, "pswpin"));
    let swap_out_pages = texts
        .vmstat
        .and_then(|text| vmstat_counter(text, "pswpout"));

    Ok(MemorySnapshot {
        taken_at_unix_ms,
        level,
        level_source,
        total_bytes,
        available_bytes,
        used_bytes,
        app_bytes,
        wired_bytes,
        compressed_bytes,
        cached_bytes,
        swap_used_bytes,
        swap_total_bytes,
        process_footprint_bytes: process_footprint_bytes(texts.self_status),
        psi,
        swap_in_pages,
        swap_out_pages,
    })
}

/// Maps PSI and the MemAvailable ratio onto the three levels (a project
/// decision, so that Linux shows the colours macOS does):
/// - critical: PSI `full avg10` > 10 (every non-idle task waited for memory
///   in over a tenth of the last 10 s), or MemAvailable < 5 % of MemTotal;
/// - warning: PSI `some avg10` > 10, or MemAvailable < 15 %;
/// - normal otherwise.
///
/// PSI measures what reclaim costs, so it is the source when the kernel has
/// it; the ratio still counts because memory can be nearly gone before
/// anything has stalled, and it is named the source when it alone gave the
/// worse level. Without PSI the ratio is all there is.
pub(crate) fn pressure_level(
    psi: Option<&Psi>,
    available_bytes: u64,
    total_bytes: u64,
) -> (PressureLevel, LevelSource) {
    let by_ratio = if total_bytes == 0 {
        PressureLevel::Unknown
    } else if available_bytes.saturating_mul(100) < total_bytes.saturating_mul(5) {
        PressureLevel::Critical
    } else if available_bytes.saturating_mul(100) < total_bytes.saturating_mul(15) {
        PressureLevel::Warning
    } else {
        PressureLevel::Normal
    };
    let Some(psi) = psi else {
        return (by_ratio, LevelSource::LinuxMemAvailable);
    };
    let by_psi = if psi.full_avg10 > 10.0 {
        PressureLevel::Critical
    } else if psi.some_avg10 > 10.0 {
        PressureLevel::Warning
    } else {
        PressureLevel::Normal
    };
    let level = PressureLevel::worst(by_psi, by_ratio);
    let source = if level == by_psi {
        LevelSource::LinuxPsi
    } else {
        LevelSource::LinuxMemAvailable
    };
    (level, source)
}

/// Parses `/proc/pressure/memory`:
/// `some avg10=1.00 avg60=0.50 avg300=0.10 total=123456` and a `full` line.
/// `None` unless both lines parse.
pub(crate) fn parse_psi(text: &str) -> Option<Psi> {
    let (some_avg10, some_avg60, some_total_us) = parse_stall_line(text, "some")?;
    let (full_avg10, full_avg60, full_total_us) = parse_stall_line(text, "full")?;
    Some(Psi {
        some_avg10,
        some_avg60,
        full_avg10,
        full_avg60,
        some_total_us,
        full_total_us,
    })
}

/// One PSI line as (avg10 %, avg60 %, total µs).
fn parse_stall_line(text: &str, kind: &str) -> Option<(f64, f64, u64)> {
    let pairs = text
        .lines()
        .find_map(|line| line.strip_prefix(kind)?.strip_prefix(' '))?;
    let value = |key: &str| {
        pairs.split_whitespace().find_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            (name == key).then_some(value)
        })
    };
    Some((
        value("avg10")?.parse().ok()?,
        value("avg60")?.parse().ok()?,
        value("total")?.parse().ok()?,
    ))
}

/// One `name value` counter of `/proc/vmstat`.
pub(crate) fn vmstat_counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        if key == name {
            value.trim().parse().ok()
        } else {
            None
        }
    })
}

/// This process's share of RAM and swap from `/proc/self/status`:
/// RssAnon + RssShmem + VmSwap.
///
/// Why these: macOS's `ri_phys_footprint` counts a process's anonymous memory
/// whether resident, compressed or swapped, and leaves out clean file pages;
/// RssFile (an mmap'd model file, say) is page cache that the kernel can drop
/// and that the breakdown already shows as cached. `/proc/self/smaps_rollup`
/// gives the same sums but walks every page table under the mmap lock on each
/// read, which a 4 Hz sampler should not do beside a process with tens of GB
/// mapped; status reads counters the kernel keeps anyway.
/// Kernels before 4.5 lack RssAnon, so VmRSS + VmSwap stands in.
pub(crate) fn process_footprint_bytes(status: &str) -> u64 {
    let field = |name: &str| meminfo_bytes(status, name);
    let swap = field("VmSwap").unwrap_or(0);
    match field("RssAnon") {
        Some(anon) => anon
            .saturating_add(field("RssShmem").unwrap_or(0))
            .saturating_add(swap),
        None => field("VmRSS").unwrap_or(0).saturating_add(swap),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MEMINFO_WITH_SWAP: &str = include_str!("../tests/fixtures/meminfo_with_swap.txt");
    const MEMINFO_NO_SWAP: &str = include_str!("../tests/fixtures/meminfo_no_swap.txt");
    const MEMINFO_OLD_KERNEL: &str = include_str!("../tests/fixtures/meminfo_old_kernel.txt");
    const PSI_QUIET: &str = include_str!("../tests/fixtures/psi_quiet.txt");
    const PSI_SOME_STALLS: &str = include_str!("../tests/fixtures/psi_some_stalls.txt");
    const PSI_FULL_STALLS: &str = include_str!("../tests/fixtures/psi_full_stalls.txt");
    const VMSTAT: &str = include_str!("../tests/fixtures/vmstat.txt");
    const SELF_STATUS: &str = include_str!("../tests/fixtures/self_status.txt");

    fn snapshot(meminfo: &str, pressure: Option<&str>) -> MemorySnapshot {
        let texts = ProcTexts {
            meminfo,
            pressure,
            vmstat: Some(VMSTAT),
            self_status: SELF_STATUS,
        };
        snapshot_from_proc(&texts, 42).unwrap()
    }

    #[test]
    fn breakdown_of_a_machine_using_swap_and_zswap() {
        let s = snapshot(MEMINFO_WITH_SWAP, Some(PSI_QUIET));
        assert_eq!(s.taken_at_unix_ms, 42);
        assert_eq!(s.total_bytes, 65_536_000 * KIB);
        assert_eq!(s.available_bytes, 20_971_520 * KIB);
        assert_eq!(s.used_bytes, 44_564_480 * KIB);
        // Cached 16777216 + Buffers 524288 - Shmem 1048576.
        assert_eq!(s.cached_bytes, 16_252_928 * KIB);
        // Unevictable only: Mlocked (65536 kB) is inside it.
        assert_eq!(s.wired_bytes, 131_072 * KIB);
        assert_eq!(s.compressed_bytes, 1_048_576 * KIB);
        assert_eq!(s.app_bytes, (44_564_480 - 131_072 - 1_048_576) * KIB);
        assert_eq!(s.swap_total_bytes, 8_388_608 * KIB);
        assert_eq!(s.swap_used_bytes, 2_097_152 * KIB);
        assert_eq!(s.used_bytes + s.available_bytes, s.total_bytes);
        assert_eq!(s.level, PressureLevel::Normal);
        assert_eq!(s.level_source, LevelSource::LinuxPsi);
    }

    #[test]
    fn machine_without_swap_and_low_available_is_a_ratio_warning() {
        let s = snapshot(MEMINFO_NO_SWAP, None);
        assert_eq!(s.swap_total_bytes, 0);
        assert_eq!(s.swap_used_bytes, 0);
        // No Zswap line on this kernel.
        assert_eq!(s.compressed_bytes, 0);
        // MemAvailable is 12 % of MemTotal.
        assert_eq!(s.psi, None);
        assert_eq!(s.level, PressureLevel::Warning);
        assert_eq!(s.level_source, LevelSource::LinuxMemAvailable);

        // Quiet PSI does not hide a low ratio, and the ratio is named as the cause.
        let s = snapshot(MEMINFO_NO_SWAP, Some(PSI_QUIET));
        assert_eq!(s.level, PressureLevel::Warning);
        assert_eq!(s.level_source, LevelSource::LinuxMemAvailable);
    }

    #[test]
    fn old_kernel_without_memavailable_uses_free_plus_cached() {
        let s = snapshot(MEMINFO_OLD_KERNEL, None);
        assert_eq!(s.available_bytes, (131_072 + 196_608) * KIB);
        assert_eq!(s.used_bytes + s.available_bytes, s.total_bytes);
        // 3.9 % available.
        assert_eq!(s.level, PressureLevel::Critical);
        assert_eq!(s.level_source, LevelSource::LinuxMemAvailable);
    }

    #[test]
    fn parses_quiet_psi() {
        let psi = parse_psi(PSI_QUIET).unwrap();
        assert_eq!(psi.some_avg10, 0.0);
        assert_eq!(psi.full_avg60, 0.0);
        assert_eq!(psi.some_total_us, 1_843_112);
        assert_eq!(psi.full_total_us, 912_004);
    }

    #[test]
    fn some_stalls_over_ten_percent_are_a_warning() {
        let psi = parse_psi(PSI_SOME_STALLS).unwrap();
        assert_eq!(psi.some_avg10, 25.0);
        assert_eq!(psi.some_avg60, 8.12);
        assert_eq!(psi.full_avg10, 3.5);
        let s = snapshot(MEMINFO_WITH_SWAP, Some(PSI_SOME_STALLS));
        assert_eq!(s.level, PressureLevel::Warning);
        assert_eq!(s.level_source, LevelSource::LinuxPsi);
        assert_eq!(s.psi, Some(psi));
    }

    #[test]
    fn full_stalls_over_ten_percent_are_critical() {
        let psi = parse_psi(PSI_FULL_STALLS).unwrap();
        assert_eq!(psi.full_avg10, 15.0);
        assert_eq!(psi.full_total_us, 48_211_907);
        let s = snapshot(MEMINFO_WITH_SWAP, Some(PSI_FULL_STALLS));
        assert_eq!(s.level, PressureLevel::Critical);
        assert_eq!(s.level_source, LevelSource::LinuxPsi);
    }

    #[test]
    fn missing_or_garbled_psi_falls_back_to_the_ratio() {
        assert_eq!(parse_psi(""), None);
        assert_eq!(
            parse_psi("some avg10=1.00 avg60=0.00 avg300=0.00 total=5\n"),
            None
        );
        assert_eq!(
            parse_psi(
                "some avg10=x avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\n"
            ),
            None
        );
        let s = snapshot(MEMINFO_WITH_SWAP, Some("garbage"));
        assert_eq!(s.psi, None);
        assert_eq!(s.level, PressureLevel::Normal);
        assert_eq!(s.level_source, LevelSource::LinuxMemAvailable);
    }

    #[test]
    fn thresholds_are_strict() {
        let psi = |some_avg10, full_avg10| Psi {
            some_avg10,
            some_avg60: 0.0,
            full_avg10,
            full_avg60: 0.0,
            some_total_us: 0,
            full_total_us: 0,
        };
        let level = |p: Option<&Psi>, available| pressure_level(p, available, 100).0;
        assert_eq!(level(None, 15), PressureLevel::Normal);
        assert_eq!(level(None, 14), PressureLevel::Warning);
        assert_eq!(level(None, 5), PressureLevel::Warning);
        assert_eq!(level(None, 4), PressureLevel::Critical);
        assert_eq!(level(Some(&psi(10.0, 10.0)), 50), PressureLevel::Normal);
        assert_eq!(level(Some(&psi(10.01, 0.0)), 50), PressureLevel::Warning);
        assert_eq!(level(Some(&psi(10.01, 10.01)), 50), PressureLevel::Critical);
        assert_eq!(pressure_level(None, 0, 0).0, PressureLevel::Unknown);
    }

    #[test]
    fn cached_never_goes_below_zero() {
        let text = "MemTotal: 1000 kB\nMemAvailable: 500 kB\nCached: 100 kB\nBuffers: 0 kB\nShmem: 200 kB\n";
        assert_eq!(snapshot(text, None).cached_bytes, 0);
    }

    #[test]
    fn reads_swap_counters_from_vmstat() {
        assert_eq!(vmstat_counter(VMSTAT, "pswpin"), Some(1_204_551));
        assert_eq!(vmstat_counter(VMSTAT, "pswpout"), Some(3_377_020));
        assert_eq!(vmstat_counter(VMSTAT, "pswp"), None);
        let s = snapshot(MEMINFO_WITH_SWAP, None);
        assert_eq!(s.swap_in_pages, Some(1_204_551));
        assert_eq!(s.swap_out_pages, Some(3_377_020));

        let texts = ProcTexts {
            meminfo: MEMINFO_WITH_SWAP,
            pressure: None,
            vmstat: None,
            self_status: SELF_STATUS,
        };
        let s = snapshot_from_proc(&texts, 0).unwrap();
        assert_eq!((s.swap_in_pages, s.swap_out_pages), (None, None));
    }

    #[test]
    fn footprint_is_anonymous_and_shared_memory_plus_swap() {
        // RssFile (an mmap'd model) is left out.
        assert_eq!(
            process_footprint_bytes(SELF_STATUS),
            (2_048_000 + 4_096 + 1_024) * KIB
        );
        let old_kernel = "VmRSS:\t  300 kB\nVmSwap:\t 20 kB\n";
        assert_eq!(process_footprint_bytes(old_kernel), 320 * KIB);
    }

    #[test]
    fn this_machine_reports_a_consistent_snapshot() {
        let s = memory_snapshot().unwrap();
        assert!(s.total_bytes > 0);
        assert!(s.available_bytes <= s.total_bytes);
        assert_eq!(s.used_bytes + s.available_bytes, s.total_bytes);
        assert!(s.app_bytes <= s.used_bytes);
        assert!(s.swap_used_bytes <= s.swap_total_bytes);
        assert!(s.process_footprint_bytes > 0);
        assert_ne!(s.level, PressureLevel::Unknown);
        assert!(s.taken_at_unix_ms > 1_600_000_000_000);
    }
}
