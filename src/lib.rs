//! Ondo's core: everything but the desktop shell. The CLI, the app and the
//! local API are all clients of this library.

pub mod api;
pub mod app_settings;
pub mod bench;
pub mod cli;
pub mod demo;
pub mod doctor;
pub mod engine;
pub mod environment;
pub mod error_kind;
pub mod family;
pub mod hub;
pub mod metallib;
pub mod metrics;
pub mod paths;
pub mod report;
pub mod resolve;
pub mod run_kinds;
pub mod served_split;
pub mod session;
pub mod store;
pub mod synth;
pub mod text_table;
pub mod units;
pub mod vision;
pub mod whole_file;

pub use error_kind::ErrorKind;

/// On Linux every allocation of the process, Rust's and the C and C++
/// libraries' (MLX's host code, the CUDA driver's), goes to mimalloc: its
/// `override` feature defines `malloc` and `free` in the binary, which the
/// dynamic linker prefers to glibc's. MLX's host code allocates and frees
/// small blocks for every primitive it evaluates: in a profile of an 8B
/// decode step on CUDA, glibc was the library with the most samples, its
/// `malloc`, `free` and locks among its largest symbols; on the CPU backend
/// a `tiny` decode ran about 1.25x as fast with mimalloc
/// (docs/benchmarks-log.md, "A profile of the host's step, a faster
/// allocator"). Naming it here also keeps the linker from dropping it. A
/// Mac keeps its system allocator.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator behind `malloc` in this process, for `ondo doctor`.
pub fn allocator() -> &'static str {
    if cfg!(target_os = "linux") {
        "mimalloc, for the whole process"
    } else {
        "the system's"
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// Memory a shared library allocates comes from mimalloc too, not only
    /// Rust's: `strdup` allocates inside glibc, as MLX's C++ code and the
    /// CUDA driver allocate inside theirs.
    #[test]
    fn shared_libraries_allocate_from_mimalloc() {
        // SAFETY: strdup copies a valid C string; the copy is freed once.
        let copy = unsafe { libc::strdup(c"ondo".as_ptr()) };
        assert!(!copy.is_null());
        // SAFETY: mimalloc only compares the address with its own regions.
        let from_mimalloc = unsafe { libmimalloc_sys::mi_is_in_heap_region(copy.cast()) };
        // SAFETY: allocated above, freed here alone.
        unsafe { libc::free(copy.cast()) };
        assert!(from_mimalloc, "glibc's malloc served a shared library");
    }
}
