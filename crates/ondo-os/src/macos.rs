//! macOS probes through `sysctlbyname`; the full Activity Monitor breakdown
//! (host_statistics64) belongs to the memory-pressure work.

use std::{ffi::CStr, io, mem};

use crate::MemoryTotals;

/// Reads a fixed-size integer sysctl.
fn sysctl_value<T: Copy + Default>(name: &CStr) -> io::Result<T> {
    let mut value = T::default();
    let mut size = mem::size_of::<T>();
    // SAFETY: `value` is a valid, writable T and `size` holds its exact size;
    // the kernel writes at most `size` bytes and updates `size`.
    let status = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            (&mut value as *mut T).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
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

pub(crate) fn os_description() -> String {
    match sysctl_string(c"kern.osproductversion") {
        Ok(version) => format!("macOS {version}"),
        Err(_) => "macOS".to_owned(),
    }
}
