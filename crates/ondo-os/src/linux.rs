//! Linux probes: `/proc/meminfo`, `/proc/cpuinfo`, `/etc/os-release`.

use std::{fs, io};

use crate::MemoryTotals;

pub(crate) fn memory_totals() -> io::Result<MemoryTotals> {
    parse_meminfo(&fs::read_to_string("/proc/meminfo")?)
}

/// One `Name:   123 kB` line of `/proc/meminfo`, in bytes; `None` when the
/// kernel does not have that line.
pub(crate) fn meminfo_bytes(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib.saturating_mul(1024))
    })
}

/// Parses the kB lines of `/proc/meminfo` that the totals need.
pub(crate) fn parse_meminfo(text: &str) -> io::Result<MemoryTotals> {
    let field = |name: &str| meminfo_bytes(text, name);
    let total_bytes = field("MemTotal").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "/proc/meminfo has no MemTotal line",
        )
    })?;
    // Kernels before 3.14 lack MemAvailable; free + page cache is the old estimate.
    let available_bytes = field("MemAvailable")
        .or_else(|| Some(field("MemFree")? + field("Cached").unwrap_or(0)))
        .unwrap_or(0);
    Ok(MemoryTotals {
        total_bytes,
        available_bytes,
    })
}

pub(crate) fn cpu_name() -> Option<String> {
    let text = fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_owned())
    })
}

pub(crate) fn os_description() -> String {
    let pretty = fs::read_to_string("/etc/os-release").ok().and_then(|text| {
        text.lines().find_map(|line| {
            let value = line.strip_prefix("PRETTY_NAME=")?;
            Some(value.trim_matches('"').to_owned())
        })
    });
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    match pretty {
        Some(name) if !kernel.is_empty() => format!("{name}, Linux {kernel}"),
        Some(name) => name,
        None => format!("Linux {kernel}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_total_and_available_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\nCached: 5 kB\n";
        let totals = parse_meminfo(text).unwrap();
        assert_eq!(totals.total_bytes, 24_576_000 * 1024);
        assert_eq!(totals.available_bytes, 20_480_000 * 1024);
    }

    #[test]
    fn old_kernels_without_memavailable_use_free_plus_cached() {
        let text = "MemTotal: 1000 kB\nMemFree: 100 kB\nCached: 300 kB\n";
        assert_eq!(parse_meminfo(text).unwrap().available_bytes, 400 * 1024);
    }

    #[test]
    fn missing_total_is_an_error() {
        assert!(parse_meminfo("MemFree: 1 kB\n").is_err());
    }

    #[test]
    fn this_machine_reports_plausible_memory() {
        let totals = crate::memory_totals().unwrap();
        assert!(totals.total_bytes > 256 * 1024 * 1024);
        assert!(totals.available_bytes <= totals.total_bytes);
    }
}
