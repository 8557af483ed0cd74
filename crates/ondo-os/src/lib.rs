//! Operating-system probes that Ondo needs and MLX does not provide: how much
//! memory the machine has, how it is used and how hard the OS is working to
//! find more (memory pressure), and what the processor is.
//!
//! This crate has no MLX dependency so that its macOS code type-checks with
//! `cargo check --target aarch64-apple-darwin` on any machine.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
mod linux_pressure;
#[cfg(target_os = "macos")]
mod macos;
// Pure formulas, compiled into tests everywhere so that Linux CI checks them.
#[cfg(any(target_os = "macos", test))]
mod macos_breakdown;
mod pressure;
mod sampler;

use std::io;

pub use pressure::{LevelSource, MemorySnapshot, PressureLevel, Psi, memory_snapshot};
pub use sampler::PressureSampler;

/// Physical memory of the machine, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryTotals {
    /// Installed RAM.
    pub total_bytes: u64,
    /// Memory the OS could give a new allocation without swapping
    /// (Linux: `MemAvailable`; macOS: the free share of `kern.memorystatus_level`).
    pub available_bytes: u64,
}

/// Reads the machine's memory totals.
pub fn memory_totals() -> io::Result<MemoryTotals> {
    #[cfg(target_os = "linux")]
    {
        linux::memory_totals()
    }
    #[cfg(target_os = "macos")]
    {
        macos::memory_totals()
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "memory probes exist for Linux and macOS only",
        ))
    }
}

/// The processor's marketing name ("Apple M2 Pro", "AMD EPYC 7B13"), or
/// `None` when the OS does not say.
pub fn cpu_name() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        linux::cpu_name()
    }
    #[cfg(target_os = "macos")]
    {
        macos::cpu_name()
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

/// The macOS version ("14.5"); `None` on other systems or when it cannot be
/// read.
pub fn macos_version() -> Option<String> {
    #[cfg(target_os = "macos")]
    {
        macos::product_version()
    }
    #[cfg(not(target_os = "macos"))]
    {
        None
    }
}

/// This machine's name on the network ("studio-2.local"), as `hostname`
/// prints it; "unknown host" where the OS gives none.
pub fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(name) if status == 0 && !name.is_empty() => name.to_owned(),
        _ => "unknown host".to_owned(),
    }
}

/// The OS name and version as one line ("Debian GNU/Linux 12 (bookworm)",
/// "macOS 15.1").
pub fn os_description() -> String {
    #[cfg(target_os = "linux")]
    {
        linux::os_description()
    }
    #[cfg(target_os = "macos")]
    {
        macos::os_description()
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        std::env::consts::OS.to_owned()
    }
}
