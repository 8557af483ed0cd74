//! A decode step's 4-bit matrix-vector products on MLX's CUDA backend,
//! through Ondo's own kernel (`qmv4.cuh`), which MLX compiles at first use.
//! Off unless `ONDO_CUDA_MATVEC=1`.
//!
//! Why it exists: on the H200, MLX's CUDA kernel for a 4-bit matrix times
//! one vector reads the weights at 0.4-0.86 TB/s of the card's 3.4 TB/s,
//! which held an 8B decode step at a quarter of the bandwidth roofline (MLX's
//! 8-bit and dense kernels reach two to three times that). Ondo's kernel
//! keeps more bytes in flight per warp and unpacks without conversions; with
//! it, 8B decodes 1.25x as fast (docs/BENCHMARKS.md, "Ondo's own 4-bit
//! matrix-vector kernel on CUDA").
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
//! least `MIN_WEIGHTS` (MLX's graph takes a custom kernel at a higher host
//! cost than its own, which only the large matrices repay). Everything else,
//! prefill included, and every Mac (Metal has its own kernels) runs MLX's
//! `quantized_matmul`.

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::QuantMode;
use super::quantized::QuantParams;

/// The kernel's source, shared with `scripts/gpu-matvec.py`.
const SOURCE: &str = include_str!("qmv4.cuh");
/// The kernel's body: MLX writes the signature (one pointer per input and
/// output, `w_shape` because the body names it).
const BODY: &str =
    "ondo_qmv4<T, GROUP, ROWS, CHUNKS>(x, w, scales, biases, y, w_shape[0], w_shape[1] * 8);";
/// Rows per warp and 16-byte chunks per row a lane loads before any
/// arithmetic, and warps per block: the best of the shapes measured on the
/// H200 (docs/BENCHMARKS.md).
const ROWS: i32 = 4;
const CHUNKS: i32 = 2;
const WARPS: i32 = 4;

/// MLX's handle to the kernel, made once; MLX compiles it per dtype and
/// group size at first use and keeps the module.
struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle is an immutable description (name, source, argument
// names) that MLX only reads when a call builds a primitive from it.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// The smallest matrix the kernel takes, in weights (out x in). On the H200,
/// 8B decode was 1.25x as fast with the kernel for the MLP's gate/up and down
/// and the head only, 1.20x with it for every matrix, and 3B slower with it
/// for every matrix: the attention's projections save less GPU time than a
/// custom kernel costs the host.
const MIN_WEIGHTS: i64 = 1 << 25;

/// Whether decode steps use Ondo's kernel in this process: asked for with
/// `ONDO_CUDA_MATVEC=1`, and MLX runs on a CUDA GPU.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ONDO_CUDA_MATVEC").as_deref() == Ok("1") && available())
}

/// Whether the kernel can run here: MLX's backend is CUDA, its default
/// device the GPU, and MLX took the kernel's source.
fn available() -> bool {
    cuda_is_default() && kernel().is_some()
}

/// True when MLX's backend is CUDA and its default device the GPU.
fn cuda_is_default() -> bool {
    let mut cuda = false;
    // SAFETY: the probe writes one bool through a valid pointer.
    let status = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
    status == 0 && cuda && super::default_device_is_gpu()
}

fn kernel() -> Option<&'static Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let mut inputs = [c"x", c"w", c"scales", c"biases"].map(CStr::as_ptr);
            let mut output = c"y".as_ptr();
            let source = CString::new(BODY).ok()?;
            let header = CString::new(SOURCE).ok()?;
            // SAFETY: the strings outlive the calls; mlx-c copies them into
            // its own vectors and kernel object; the vectors are freed here.
            unsafe {
                let input_names =
                    mlx_sys::mlx_vector_string_new_data(inputs.as_mut_ptr(), inputs.len());
                let output_names = mlx_sys::mlx_vector_string_new_data(&mut output, 1);
                let handle = mlx_sys::mlx_fast_cuda_kernel_new(
                    c"ondo_qmv4".as_ptr(),
                    input_names,
                    output_names,
                    source.as_ptr(),
                    header.as_ptr(),
                    true,
                    0,
                );
                mlx_sys::mlx_vector_string_free(input_names);
                mlx_sys::mlx_vector_string_free(output_names);
                (!handle.ctx.is_null()).then_some(Kernel(handle))
            }
        })
        .as_ref()
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
    let kernel =
        kernel().ok_or_else(|| Exception::custom("Ondo's CUDA kernel is not available"))?;
    let n = weight.shape()[0];
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
        let threads = ((n + ROWS - 1) / ROWS) * 32;
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, threads, 1, 1);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, 32 * WARPS, 1, 1);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
            config,
            c"T".as_ptr(),
            dtype,
        );
        for (name, value) in [
            (c"GROUP", params.group_size),
            (c"ROWS", ROWS),
            (c"CHUNKS", CHUNKS),
        ] {
            status |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                config,
                name.as_ptr(),
                value,
            );
        }
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
                kernel.0,
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
}
