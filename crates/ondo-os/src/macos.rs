//! macOS probes: `sysctlbyname` for totals, names and the pressure level,
//! Mach `host_statistics64` for page counts, `proc_pid_rusage` for this
//! process's footprint. The formulas live in `macos_breakdown.rs`.

use std::{ffi::CStr, io, mem, sync::OnceLock};

use crate::MemoryTotals;
use crate::macos_breakdown::{self, MacosReadings, VmPageCounts};
use crate::pressure::{MemorySnapshot, unix_ms_now};

/// Reads a fixed-size integer sysctl.
fn sysctl_value<T: Copy + Default>(name: &CStr) -> io::Result<T> {
    let mut value = T::default();
    sysctl_into(name, &mut value)?;
    Ok(value)
}

/// Reads a fixed-size sysctl (an integer or a C struct) into `value`.
fn sysctl_into<T: Copy>(name: &CStr, value: &mut T) -> io::Result<()> {
    let mut size = mem::size_of::<T>();
    // SAFETY: `value` is a valid, writable T and `size` holds its exact size;
    // the kernel writes at most `size` bytes and updates `size`.
    let status = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            (value as *mut T).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads a string sysctl.
fn sysctl_string(name: &CStr) -> io::Result<String> {
    let mut size: libc::size_t = 0;
    // SAFETY: a null buffer asks only for the size, written into `size`.
    let status = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            std::ptr::null_mut(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buffer = vec![0u8; size];
    // SAFETY: `buffer` has `size` writable bytes, as the kernel just asked for.
    let status = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            buffer.as_mut_ptr().cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    buffer.truncate(size);
    let text = CStr::from_bytes_until_nul(&buffer)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&buffer).into_owned());
    Ok(text)
}

pub(crate) fn memory_totals() -> io::Result<MemoryTotals> {
    let total_bytes: u64 = sysctl_value(c"hw.memsize")?;
    // The percentage that `memory_pressure -Q` prints as free.
    let free_percent: libc::c_int = sysctl_value(c"kern.memorystatus_level")?;
    let free_percent = u64::try_from(free_percent.clamp(0, 100)).unwrap_or(0);
    Ok(MemoryTotals {
        total_bytes,
        available_bytes: total_bytes / 100 * free_percent,
    })
}

pub(crate) fn cpu_name() -> Option<String> {
    sysctl_string(c"machdep.cpu.brand_string").ok()
}

pub(crate) fn product_version() -> Option<String> {
    sysctl_string(c"kern.osproductversion").ok()
}

pub(crate) fn os_description() -> String {
    match product_version() {
        Some(version) => format!("macOS {version}"),
        None => "macOS".to_owned(),
    }
}

pub(crate) fn memory_snapshot() -> io::Result<MemorySnapshot> {
    let taken_at_unix_ms = unix_ms_now();
    // SAFETY: xsw_usage is plain integers, for which all zeros is valid.
    let mut swap: libc::xsw_usage = unsafe { mem::zeroed() };
    sysctl_into(c"vm.swapusage", &mut swap)?;
    let readings = MacosReadings {
        total_bytes: sysctl_value(c"hw.memsize")?,
        // SAFETY: libSystem sets vm_page_size before main and never changes it.
        page_bytes: unsafe { libc::vm_page_size } as u64,
        pages: vm_page_counts()?,
        // A failed read is reported as an unknown level, not as no snapshot.
        pressure_level_value: sysctl_value::<libc::c_int>(c"kern.memorystatus_vm_pressure_level")
            .ok(),
        swap_used_bytes: swap.xsu_used,
        swap_total_bytes: swap.xsu_total,
        process_footprint_bytes: process_footprint_bytes()?,
    };
    Ok(macos_breakdown::snapshot(&readings, taken_at_unix_ms))
}

/// The host port, asked for once: every `mach_host_self()` call adds a
/// reference to the port right that we would otherwise have to release.
// libc deprecates its Mach bindings in favour of the mach2 crate; this one is
// correct and not worth a dependency.
#[allow(deprecated)]
fn host_port() -> libc::mach_port_t {
    static HOST_PORT: OnceLock<libc::mach_port_t> = OnceLock::new();
    // SAFETY: takes no arguments and cannot fail.
    *HOST_PORT.get_or_init(|| unsafe { libc::mach_host_self() })
}

fn vm_page_counts() -> io::Result<VmPageCounts> {
    // SAFETY: vm_statistics64 is plain integers, for which all zeros is valid.
    let mut stats: libc::vm_statistics64 = unsafe { mem::zeroed() };
    let mut count = libc::HOST_VM_INFO64_COUNT;
    // SAFETY: `stats` is writable for `count` integer_t words, which is what
    // HOST_VM_INFO64_COUNT measures; the kernel writes at most `count` words
    // (fewer on releases with a shorter struct) and updates `count`.
    let status = unsafe {
        libc::host_statistics64(
            host_port(),
            libc::HOST_VM_INFO64,
            (&mut stats as *mut libc::vm_statistics64).cast(),
            &mut count,
        )
    };
    if status != libc::KERN_SUCCESS {
        return Err(io::Error::other(format!(
            "host_statistics64(HOST_VM_INFO64) failed with kern_return_t {status}"
        )));
    }
    Ok(VmPageCounts {
        active: stats.active_count.into(),
        inactive: stats.inactive_count.into(),
        speculative: stats.speculative_count.into(),
        wire: stats.wire_count.into(),
        compressor: stats.compressor_page_count.into(),
        purgeable: stats.purgeable_count.into(),
        external: stats.external_page_count.into(),
    })
}

/// This process's `ri_phys_footprint`: what Activity Monitor's Memory column
/// shows, counting compressed and swapped pages that RSS leaves out.
fn process_footprint_bytes() -> io::Result<u64> {
    // SAFETY: rusage_info_v4 is plain integers, for which all zeros is valid.
    let mut usage: libc::rusage_info_v4 = unsafe { mem::zeroed() };
    // SAFETY: with RUSAGE_INFO_V4 the kernel writes one rusage_info_v4 into
    // the buffer, which `usage` is; libc types the buffer as rusage_info_t*.
    let status = unsafe {
        libc::proc_pid_rusage(
            libc::getpid(),
            libc::RUSAGE_INFO_V4,
            (&mut usage as *mut libc::rusage_info_v4).cast(),
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usage.ri_phys_footprint)
}
