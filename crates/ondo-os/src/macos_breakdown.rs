//! The macOS snapshot from raw readings: the pressure level's meaning and
//! the Activity Monitor formulas. Kept apart from the system calls in
//! `macos.rs` so that tests run on any OS.

use crate::pressure::{LevelSource, MemorySnapshot, PressureLevel};

/// Page counts from `host_statistics64(HOST_VM_INFO64)`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct VmPageCounts {
    pub active: u64,
    pub inactive: u64,
    pub speculative: u64,
    pub wire: u64,
    pub compressor: u64,
    pub purgeable: u64,
    pub external: u64,
}

/// What one macOS snapshot is made from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MacosReadings {
    /// `hw.memsize`.
    pub total_bytes: u64,
    /// `vm_page_size`.
    pub page_bytes: u64,
    pub pages: VmPageCounts,
    /// `kern.memorystatus_vm_pressure_level`, `None` if the sysctl failed.
    pub pressure_level_value: Option<i32>,
    pub swap_used_bytes: u64,
    pub swap_total_bytes: u64,
    /// `ri_phys_footprint` of this process.
    pub process_footprint_bytes: u64,
}

/// `kern.memorystatus_vm_pressure_level`: 1 normal, 2 warning, 4 critical
/// (the kernel's `kVMPressure*` values).
pub(crate) fn level_from_sysctl(value: Option<i32>) -> PressureLevel {
    match value {
        Some(1) => PressureLevel::Normal,
        Some(2) => PressureLevel::Warning,
        Some(4) => PressureLevel::Critical,
        _ => PressureLevel::Unknown,
    }
}

/// Applies the formulas most tools use to match Activity Monitor
/// (docs/ARCHITECTURE.md, "Memory pressure"):
/// used = active + inactive + speculative + wire + compressor - purgeable - external;
/// app = used - wire - compressor; cached = purgeable + external.
/// Available is total - used: the free pages plus the cached files.
pub(crate) fn snapshot(readings: &MacosReadings, taken_at_unix_ms: u64) -> MemorySnapshot {
    let pages = &readings.pages;
    let bytes = |count: u64| count.saturating_mul(readings.page_bytes);
    let used_pages =
        (pages.active + pages.inactive + pages.speculative + pages.wire + pages.compressor)
            .saturating_sub(pages.purgeable + pages.external);
    let used_bytes = bytes(used_pages).min(readings.total_bytes);
    let wired_bytes = bytes(pages.wire);
    let compressed_bytes = bytes(pages.compressor);
    MemorySnapshot {
        taken_at_unix_ms,
        level: level_from_sysctl(readings.pressure_level_value),
        level_source: LevelSource::MacosPressureSysctl,
        total_bytes: readings.total_bytes,
        available_bytes: readings.total_bytes - used_bytes,
        used_bytes,
        app_bytes: used_bytes
            .saturating_sub(wired_bytes)
            .saturating_sub(compressed_bytes),
        wired_bytes,
        compressed_bytes,
        cached_bytes: bytes(pages.purgeable + pages.external),
        swap_used_bytes: readings.swap_used_bytes,
        swap_total_bytes: readings.swap_total_bytes,
        process_footprint_bytes: readings.process_footprint_bytes,
        psi: None,
        swap_in_pages: None,
        swap_out_pages: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 16 * 1024;

    #[test]
    fn sysctl_values_map_to_levels() {
        assert_eq!(level_from_sysctl(Some(1)), PressureLevel::Normal);
        assert_eq!(level_from_sysctl(Some(2)), PressureLevel::Warning);
        assert_eq!(level_from_sysctl(Some(4)), PressureLevel::Critical);
        assert_eq!(level_from_sysctl(Some(3)), PressureLevel::Unknown);
        assert_eq!(level_from_sysctl(Some(0)), PressureLevel::Unknown);
        assert_eq!(level_from_sysctl(None), PressureLevel::Unknown);
    }

    #[test]
    fn breakdown_matches_the_activity_monitor_formulas() {
        // A 32 GiB M-series machine (2,097,152 pages of 16 KiB).
        let readings = MacosReadings {
            total_bytes: 2_097_152 * PAGE,
            page_bytes: PAGE,
            pages: VmPageCounts {
                active: 600_000,
                inactive: 550_000,
                speculative: 20_000,
                wire: 300_000,
                compressor: 100_000,
                purgeable: 10_000,
                external: 400_000,
            },
            pressure_level_value: Some(2),
            swap_used_bytes: 1 << 30,
            swap_total_bytes: 2 << 30,
            process_footprint_bytes: 5 << 30,
        };
        let s = snapshot(&readings, 7);
        assert_eq!(s.used_bytes, 1_160_000 * PAGE);
        assert_eq!(s.app_bytes, 760_000 * PAGE);
        assert_eq!(s.wired_bytes, 300_000 * PAGE);
        assert_eq!(s.compressed_bytes, 100_000 * PAGE);
        assert_eq!(s.cached_bytes, 410_000 * PAGE);
        assert_eq!(s.used_bytes + s.available_bytes, s.total_bytes);
        assert_eq!(s.level, PressureLevel::Warning);
        assert_eq!(s.level_source, LevelSource::MacosPressureSysctl);
        assert_eq!(s.swap_used_bytes, 1 << 30);
        assert_eq!(s.process_footprint_bytes, 5 << 30);
        assert_eq!((s.psi, s.swap_in_pages), (None, None));
    }

    #[test]
    fn inconsistent_counts_do_not_underflow() {
        let readings = MacosReadings {
            total_bytes: 100 * PAGE,
            page_bytes: PAGE,
            pages: VmPageCounts {
                active: 5,
                wire: 500,
                external: 10,
                ..VmPageCounts::default()
            },
            pressure_level_value: None,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            process_footprint_bytes: 0,
        };
        let s = snapshot(&readings, 0);
        assert_eq!(s.used_bytes, s.total_bytes);
        assert_eq!(s.available_bytes, 0);
        assert_eq!(s.app_bytes, 0);
        assert_eq!(s.level, PressureLevel::Unknown);
    }
}
