//! Memory pressure and the Activity Monitor style breakdown, one record for
//! every OS: the types, and `memory_snapshot()` which picks the OS probe.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How hard the OS is working to find memory, in the three colours of
/// Activity Monitor's pressure graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum PressureLevel {
    Normal,
    Warning,
    Critical,
    /// The OS did not say (the probe failed or returned a value we do not know).
    Unknown,
}

impl PressureLevel {
    /// The more severe of two levels, for "the worst level during a run".
    /// Normal < Warning < Critical; Unknown ranks below Normal so that one
    /// failed reading does not hide a real one.
    pub fn worst(a: PressureLevel, b: PressureLevel) -> PressureLevel {
        if b.severity() > a.severity() { b } else { a }
    }

    fn severity(self) -> u8 {
        match self {
            PressureLevel::Unknown => 0,
            PressureLevel::Normal => 1,
            PressureLevel::Warning => 2,
            PressureLevel::Critical => 3,
        }
    }
}

/// Which OS signal decided a snapshot's `level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum LevelSource {
    /// macOS `kern.memorystatus_vm_pressure_level`, the kernel's own verdict.
    MacosPressureSysctl,
    /// Linux pressure stall information (`/proc/pressure/memory`).
    LinuxPsi,
    /// Linux `MemAvailable` as a share of `MemTotal`; the only signal when the
    /// kernel has no PSI, and the deciding one when it is the worse of the two.
    LinuxMemAvailable,
}

/// Linux pressure stall information for memory: the share of time in which
/// some (or all non-idle) tasks waited for memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Psi {
    /// Percent of the last 10 s in which at least one task stalled on memory.
    pub some_avg10: f64,
    /// Percent of the last 60 s in which at least one task stalled on memory.
    pub some_avg60: f64,
    /// Percent of the last 10 s in which all non-idle tasks stalled at once.
    pub full_avg10: f64,
    /// Percent of the last 60 s in which all non-idle tasks stalled at once.
    pub full_avg60: f64,
    /// Cumulative "some" stall time since boot, in microseconds (take deltas).
    pub some_total_us: u64,
    /// Cumulative "full" stall time since boot, in microseconds (take deltas).
    pub full_total_us: u64,
}

/// One reading of the machine's memory, with the labels Activity Monitor uses.
/// All sizes are bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct MemorySnapshot {
    /// When the reading was taken, milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    pub level: PressureLevel,
    pub level_source: LevelSource,
    /// Installed RAM.
    pub total_bytes: u64,
    /// RAM a new allocation could get without swapping; always `total - used`.
    pub available_bytes: u64,
    /// "Memory Used".
    pub used_bytes: u64,
    /// "App Memory": used minus wired and compressed.
    pub app_bytes: u64,
    /// "Wired Memory": pages the OS cannot page out (on macOS this includes
    /// GPU buffers that MLX holds).
    pub wired_bytes: u64,
    /// "Compressed": RAM that holds compressed pages.
    pub compressed_bytes: u64,
    /// "Cached Files": file pages the OS can drop when it needs the RAM.
    pub cached_bytes: u64,
    pub swap_used_bytes: u64,
    pub swap_total_bytes: u64,
    /// This process's own share: macOS `ri_phys_footprint`; Linux RssAnon +
    /// RssShmem + VmSwap, the nearest match (file pages left out).
    pub process_footprint_bytes: u64,
    /// Linux only; `None` on macOS and on kernels without PSI.
    pub psi: Option<Psi>,
    /// Pages swapped in since boot (Linux `pswpin`); `None` where unknown.
    pub swap_in_pages: Option<u64>,
    /// Pages swapped out since boot (Linux `pswpout`); `None` where unknown.
    pub swap_out_pages: Option<u64>,
}

/// Reads memory pressure and the memory breakdown of this machine now.
pub fn memory_snapshot() -> io::Result<MemorySnapshot> {
    #[cfg(target_os = "linux")]
    {
        crate::linux_pressure::memory_snapshot()
    }
    #[cfg(target_os = "macos")]
    {
        crate::macos::memory_snapshot()
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "memory pressure probes exist for Linux and macOS only",
        ))
    }
}

/// Now, in milliseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_orders_normal_warning_critical_with_unknown_lowest() {
        use PressureLevel::*;
        assert_eq!(PressureLevel::worst(Normal, Warning), Warning);
        assert_eq!(PressureLevel::worst(Critical, Warning), Critical);
        assert_eq!(PressureLevel::worst(Unknown, Normal), Normal);
        assert_eq!(PressureLevel::worst(Critical, Unknown), Critical);
        assert_eq!(PressureLevel::worst(Unknown, Unknown), Unknown);
        let run = [Normal, Warning, Unknown, Normal];
        assert_eq!(run.into_iter().fold(Unknown, PressureLevel::worst), Warning);
    }

    #[test]
    fn serializes_with_snake_case_names() {
        let snapshot = MemorySnapshot {
            taken_at_unix_ms: 1,
            level: PressureLevel::Warning,
            level_source: LevelSource::LinuxMemAvailable,
            total_bytes: 10,
            available_bytes: 4,
            used_bytes: 6,
            app_bytes: 6,
            wired_bytes: 0,
            compressed_bytes: 0,
            cached_bytes: 0,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            process_footprint_bytes: 0,
            psi: None,
            swap_in_pages: None,
            swap_out_pages: None,
        };
        let json = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(json["level"], "warning");
        assert_eq!(json["level_source"], "linux_mem_available");
        assert_eq!(json["used_bytes"], 6);
        let back: MemorySnapshot = serde_json::from_value(json).unwrap();
        assert_eq!(back, snapshot);

        let names = [
            (LevelSource::MacosPressureSysctl, "macos_pressure_sysctl"),
            (LevelSource::LinuxPsi, "linux_psi"),
        ];
        for (source, name) in names {
            assert_eq!(serde_json::to_value(source).unwrap(), name);
        }
        for (level, name) in [
            (PressureLevel::Normal, "normal"),
            (PressureLevel::Critical, "critical"),
            (PressureLevel::Unknown, "unknown"),
        ] {
            assert_eq!(serde_json::to_value(level).unwrap(), name);
        }
    }
}
