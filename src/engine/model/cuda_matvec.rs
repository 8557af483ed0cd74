//! A decode step's 4-bit matrix-vector products on MLX's CUDA backend,
//! through Ondo's own kernel (`qmv4.cuh`), which MLX compiles at first use.
//! Off unless `ONDO_CUDA_MATVEC=1`.
//!
//! Why it exists: on the H200, MLX's CUDA kernel for a 4-bit matrix times
//! one vector reads the weights at 0.4-0.86 TB/s of the card's 3.4 TB/s,
//! which held an 8B decode step at a quarter of the bandwidth roofline (MLX's
//! 8-bit and dense kernels reach two to three times that). Ondo's kernel
//! keeps more bytes in flight per warp, splits the rows of a narrow matrix
//! over several warps, and unpacks without conversions; with it, 8B decodes
//! at 1.54x mlx-lm's rate and a third of the roofline, against a quarter
//! without (docs/BENCHMARKS.md, "Ondo's own 4-bit matrix-vector kernel on
//! CUDA" and "One kernel per shape, 8 rows per warp, narrow matrices split
//! over warps").
//!
//! Why it is off by default: it sums in another order than MLX's kernel (its
//! error against an fp32 reference is about half of MLX's), so greedy tokens
//! part from mlx-lm's at the first near-tie, within the first ten tokens on
//! the random-weight benchmark models, and the benchmark's token check could
//! no longer tell a rounding difference from a bug.
//!
//! Where it applies: MLX's CUDA backend with the GPU as default device,
//! affine 4-bit weights in groups of 32, 64 or 128 with biases, one position
//! (a decode step), scales in the activations' dtype, and a matrix of at
//! least `MIN_WEIGHTS` (MLX takes a custom kernel at a higher host cost than
//! its own, about 11 microseconds a call against 4 measured from Python,
//! which only the large
//! matrices repay). Everything else, prefill included, and every Mac (Metal
//! has its own kernels) runs MLX's `quantized_matmul`.
//!
//! Each dtype, group size and matrix shape is its own kernel, which MLX
//! compiles with NVRTC at its first call (about 1.6 s each on the H200; a
//! model has two to four) and caches on disk. For measurements,
//! `ONDO_CUDA_MATVEC_MIN`, `ONDO_CUDA_MATVEC_LAUNCH` and
//! `ONDO_CUDA_MATVEC_SPLIT` override the threshold and the launch.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock};

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::QuantMode;
use super::quantized::QuantParams;

/// The kernel's source, shared with `scripts/gpu-matvec.py`.
const SOURCE: &str = include_str!("qmv4.cuh");
/// MLX caches a compiled kernel on disk by its name alone (under the system's
/// temporary folder), so the name carries the source's hash: a new Ondo with
/// a changed kernel must not run the old one's cached code.
const SOURCE_HASH: u64 = fnv1a(SOURCE.as_bytes());
/// Rows per warp and 16-byte chunks per row a lane loads before any
/// arithmetic, and warps per block. On the H200, 8 rows of one chunk beat 4
/// rows of two (the same 4 KB in flight per warp, with each activation
/// converted once for 8 rows): 8B decode 231.3 and 267.9 tok/s against 217.3
/// and 249.9 in the same two rounds (docs/BENCHMARKS.md).
const ROWS: i32 = 8;
const CHUNKS: i32 = 1;
const WARPS: i32 = 4;
/// Rows per warp and chunks in flight: `ROWS` and `CHUNKS`, or
/// `ONDO_CUDA_MATVEC_LAUNCH=ROWSxCHUNKS` (as `8x1`) for measurements.
fn rows_and_chunks() -> (i32, i32) {
    static LAUNCH: OnceLock<(i32, i32)> = OnceLock::new();
    *LAUNCH.get_or_init(|| {
        std::env::var("ONDO_CUDA_MATVEC_LAUNCH")
            .ok()
            .and_then(|v| {
                let (rows, chunks) = v.split_once('x')?;
                Some((rows.trim().parse().ok()?, chunks.trim().parse().ok()?))
            })
            .filter(|&(rows, chunks)| matches!(rows, 1 | 2 | 4 | 8) && matches!(chunks, 1 | 2 | 4))
            .unwrap_or((ROWS, CHUNKS))
    })
}

/// Warps a launch should have to keep the H200's 132 SMs reading: fewer row
/// sets than this get their rows split over 2 or 4 warps each.
const TARGET_WARPS: i32 = 4096;

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// One instance of the kernel: one per activation dtype, group size and
/// matrix shape, with the numbers written into its body so that a call
/// passes no template arguments or shapes for MLX to format and the compiler
/// sees every loop bound. MLX compiles each at first use and keeps the
/// module; a model has a handful of shapes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Instance {
    dtype: Dtype,
    group: i32,
    n: i32,
    k: i32,
}

/// MLX's handle to an instance, and the threads its launch needs.
#[derive(Clone, Copy)]
struct Kernel {
    handle: mlx_sys::mlx_fast_cuda_kernel,
    threads: i32,
}

// SAFETY: the handle is an immutable description (name, source, argument
// names) that MLX only reads when a call builds a primitive from it.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// The smallest matrix the kernel takes, in weights (out x in). On the H200,
/// 8B decode was 1.25x as fast with the kernel for the MLP's gate/up and down
/// and the head only, 1.20x with it for every matrix, and 3B slower with it
/// for every matrix: the attention's projections save less GPU time than a
/// custom kernel costs the host. The same held for the kernel as it is now
/// (8 rows per warp, split rows): 8B 241.4 tok/s with this threshold, 220.4
/// with the kernel for every matrix.
const MIN_WEIGHTS: i64 = 1 << 25;

/// Whether decode steps use Ondo's kernel in this process: asked for with
/// `ONDO_CUDA_MATVEC=1`, and MLX runs on a CUDA GPU.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ONDO_CUDA_MATVEC").as_deref() == Ok("1") && available())
}

/// Whether the kernel can run here: MLX's backend is CUDA, its default
/// device the GPU, and MLX takes the kernel's source (asked with a small
/// instance; making a handle compiles nothing).
fn available() -> bool {
    cuda_is_default()
        && kernel_for(Instance {
            dtype: Dtype::Bfloat16,
            group: 64,
            n: 32,
            k: 1024,
        })
        .is_some()
}

/// True when MLX's backend is CUDA and its default device the GPU.
fn cuda_is_default() -> bool {
    let mut cuda = false;
    // SAFETY: the probe writes one bool through a valid pointer.
    let status = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
    status == 0 && cuda && super::default_device_is_gpu()
}

/// How many warps share a row set of an `n` x `k` matrix: enough for about
/// `TARGET_WARPS` in all, at most 4, and no more than the row has rounds of
/// `32 * 32 * CHUNKS` weights to share. `ONDO_CUDA_MATVEC_SPLIT` fixes it
/// (1, 2 or 4) for measurements.
fn split_for(n: i32, k: i32) -> i32 {
    static FIXED: OnceLock<Option<i32>> = OnceLock::new();
    let fixed = *FIXED.get_or_init(|| {
        std::env::var("ONDO_CUDA_MATVEC_SPLIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| matches!(v, 1 | 2 | 4))
    });
    if let Some(split) = fixed {
        return split;
    }
    let (rows, chunks) = rows_and_chunks();
    let sets = (n + rows - 1) / rows;
    let rounds = (k / (32 * 32 * chunks)).max(1);
    let mut split = 1;
    while split < 4 && split * 2 <= rounds && sets * split < TARGET_WARPS {
        split *= 2;
    }
    split
}

fn dtype_tag(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "bf16",
        Dtype::Float16 => "f16",
        _ => "f32",
    }
}

/// The name MLX compiles and caches an instance under: the source's hash,
/// then everything that is written into the kernel's body.
fn kernel_name(source_hash: u64, instance: Instance, rows: i32, chunks: i32, split: i32) -> String {
    let Instance { dtype, group, n, k } = instance;
    format!(
        "ondo_qmv4_{source_hash:016x}_{}_g{group}_{n}x{k}_r{rows}c{chunks}s{split}",
        dtype_tag(dtype)
    )
}

fn kernel_for(instance: Instance) -> Option<Kernel> {
    static KERNELS: OnceLock<Mutex<HashMap<Instance, Option<Kernel>>>> = OnceLock::new();
    let mut kernels = KERNELS.get_or_init(Default::default).lock().ok()?;
    *kernels
        .entry(instance)
        .or_insert_with(|| make_kernel(instance))
}

fn make_kernel(instance: Instance) -> Option<Kernel> {
    let Instance { group, n, k, .. } = instance;
    let (rows, chunks) = rows_and_chunks();
    let split = split_for(n, k);
    let blocks = ((n + rows - 1) / rows * split + WARPS - 1) / WARPS;
    let name = CString::new(kernel_name(SOURCE_HASH, instance, rows, chunks, split)).ok()?;
    let body = CString::new(format!(
        "ondo_qmv4<{group}, {rows}, {chunks}, {split}, {WARPS}>(x, w, scales, biases, y, {n}, {k});"
    ))
    .ok()?;
    let header = CString::new(SOURCE).ok()?;
    let mut inputs = [c"x", c"w", c"scales", c"biases"].map(CStr::as_ptr);
    let mut output = c"y".as_ptr();
    // SAFETY: the strings outlive the calls; mlx-c copies them into its own
    // vectors and kernel object; the vectors are freed here.
    unsafe {
        let input_names = mlx_sys::mlx_vector_string_new_data(inputs.as_mut_ptr(), inputs.len());
        let output_names = mlx_sys::mlx_vector_string_new_data(&mut output, 1);
        let handle = mlx_sys::mlx_fast_cuda_kernel_new(
            name.as_ptr(),
            input_names,
            output_names,
            body.as_ptr(),
            header.as_ptr(),
            true,
            0,
        );
        mlx_sys::mlx_vector_string_free(input_names);
        mlx_sys::mlx_vector_string_free(output_names);
        (!handle.ctx.is_null()).then_some(Kernel {
            handle,
            threads: blocks * 32 * WARPS,
        })
    }
}

/// Whether `x @ W.T` for this matrix (with its affine biases) and input is
/// one the kernel computes
/// (the cached switch first: every matmul of a CPU run asks).
pub fn applies(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: &Array,
    params: QuantParams,
) -> bool {
    if !enabled() {
        return false;
    }
    let k = x.shape().last().copied().unwrap_or(0);
    params.mode == QuantMode::Affine
        && params.bits == 4
        && matches!(params.group_size, 32 | 64 | 128)
        && k > 0
        && x.size() == k as usize
        && weight.ndim() == 2
        && weight.shape()[1] * 8 == k
        && weight.dtype() == Dtype::Uint32
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && scales.dtype() == x.dtype()
        && biases.dtype() == x.dtype()
        && i64::from(weight.shape()[0]) * i64::from(k) >= min_weights()
}

/// `MIN_WEIGHTS`, or `ONDO_CUDA_MATVEC_MIN` for measurements.
fn min_weights() -> i64 {
    static MIN: OnceLock<i64> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("ONDO_CUDA_MATVEC_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MIN_WEIGHTS)
    })
}

/// `x @ W.T` for one position `x` `[.., K]` and a 4-bit affine `W` `[N, K/8]`,
/// as `[.., N]` in `x`'s dtype. Call only where `applies` said yes.
pub fn matvec(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: &Array,
    params: QuantParams,
) -> Result<Array, Exception> {
    let n = weight.shape()[0];
    let instance = Instance {
        dtype: x.dtype(),
        group: params.group_size,
        n,
        k: weight.shape()[1] * 8,
    };
    let kernel = kernel_for(instance)
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel is not available"))?;
    let mut out_shape = x.shape().to_vec();
    if let Some(last) = out_shape.last_mut() {
        *last = n;
    }
    let dtype = x.dtype() as mlx_sys::mlx_dtype;
    let stream = Stream::thread_local_or_default();
    // SAFETY: the config and the vectors are made and freed here; the input
    // arrays are borrowed for the call; the output taken from the vector is
    // handed to an `Array`, which frees it.
    unsafe {
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let mut status = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            config,
            out_shape.as_ptr(),
            out_shape.len(),
            dtype,
        );
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, kernel.threads, 1, 1);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, 32 * WARPS, 1, 1);
        let inputs = [
            x.as_ptr(),
            weight.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
        ];
        let input_vector = mlx_sys::mlx_vector_array_new_data(inputs.as_ptr(), inputs.len());
        let mut outputs = mlx_sys::mlx_vector_array_new();
        if status == 0 {
            status = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut outputs,
                kernel.handle,
                input_vector,
                config,
                stream.as_ptr(),
            );
        }
        let mut result = mlx_sys::mlx_array_new();
        if status == 0 && mlx_sys::mlx_vector_array_size(outputs) == 1 {
            status = mlx_sys::mlx_vector_array_get(&mut result, outputs, 0);
        } else {
            status = 1;
        }
        mlx_sys::mlx_vector_array_free(outputs);
        mlx_sys::mlx_vector_array_free(input_vector);
        mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        if status != 0 {
            mlx_sys::mlx_array_free(result);
            return Err(Exception::custom(format!(
                "MLX could not build Ondo's 4-bit matrix-vector kernel for {:?} by {:?}",
                x.shape(),
                weight.shape()
            )));
        }
        Ok(Array::from_ptr(result))
    }
}

#[cfg(test)]
mod tests {
    /// Without CUDA (every CI run, every Mac) asking for the kernel changes
    /// nothing: it is never built and decode steps stay on MLX's matmul
    /// (`tests/parity.rs` runs a whole generation so asked, against mlx-lm).
    #[test]
    fn without_cuda_the_kernel_is_not_available() {
        assert!(!super::available());
    }

    /// Matrices with few rows get their rows shared by more warps, as far as
    /// their rows have rounds to share; wide ones keep one warp per row set.
    #[test]
    fn few_rows_are_split_over_more_warps() {
        use super::split_for;
        // Llama 3.1 8B: down (4096 x 14336), q or o, joined gate and up, head.
        assert_eq!(split_for(4096, 14336), 4);
        assert_eq!(split_for(4096, 4096), 4);
        assert_eq!(split_for(28672, 4096), 2);
        assert_eq!(split_for(128256, 4096), 1);
        // 3B: joined q, k, v has three rounds of 1024 weights per row.
        assert_eq!(split_for(5120, 3072), 2);
        assert_eq!(split_for(3072, 8192), 4);
    }

    /// The kernel's name changes with its source, so MLX's on-disk cache of
    /// compiled kernels, keyed by name, cannot hand a new Ondo an old kernel;
    /// and with every number its body is built from.
    #[test]
    fn the_kernel_name_carries_the_source_and_the_launch() {
        use super::{Instance, kernel_name};
        let instance = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
            n: 4096,
            k: 14336,
        };
        let name = |source: &str, instance, split| {
            kernel_name(super::fnv1a(source.as_bytes()), instance, 8, 1, split)
        };
        let shipped = name(super::SOURCE, instance, 4);
        assert_eq!(shipped, name(super::SOURCE, instance, 4));
        let edited = format!("{}\n// edited", super::SOURCE);
        assert_ne!(shipped, name(&edited, instance, 4));
        assert_ne!(shipped, name(super::SOURCE, instance, 2));
        for other in [
            Instance {
                dtype: mlx_rs::Dtype::Float16,
                ..instance
            },
            Instance {
                group: 32,
                ..instance
            },
            Instance {
                n: 4097,
                ..instance
            },
            Instance {
                k: 4096,
                ..instance
            },
        ] {
            assert_ne!(shipped, name(super::SOURCE, other, 4));
        }
    }
}
