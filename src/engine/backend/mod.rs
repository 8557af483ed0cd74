//! A platform's own kernels, behind one hook the model code calls. The
//! model code (`model/`) never names a backend: a linear layer asks
//! `matvec` for a decode step's quantized product and runs MLX's own
//! kernel where the answer is none, and a model hands `prepare` the
//! matrices of its decode step as it loads. One backend has kernels of
//! Ondo's own: MLX's CUDA backend, on Linux (`cuda/`, compiled only there).
//! On a Mac (Metal) and on the CPU every product is MLX's.

#[cfg(target_os = "linux")]
mod cuda;

use mlx_rs::Array;
use mlx_rs::error::Exception;

use crate::family::QuantParams;

/// A matrix quantized in MLX's affine mode, as a backend's kernel takes
/// it: the packed weight `[out, in * bits / 32]`, and per group a scale and
/// a bias.
#[derive(Clone, Copy)]
pub struct AffineMatrix<'a> {
    pub weight: &'a Array,
    pub scales: &'a Array,
    pub biases: &'a Array,
    pub params: QuantParams,
}

/// `x @ W.T`, or with `residual` `residual + x @ W.T` (rounded as MLX's
/// matmul followed by its add would be), through a backend's kernel where
/// one takes this product; `None` where MLX's own kernel computes it.
pub fn matvec(
    x: &Array,
    matrix: AffineMatrix,
    residual: Option<&Array>,
) -> Option<Result<Array, Exception>> {
    #[cfg(target_os = "linux")]
    if cuda::applies(x, matrix, residual) {
        return Some(cuda::matvec(x, matrix, residual));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (x, matrix, residual);
    None
}

/// As a model loads: readies the backend's kernels for the matrices of its
/// decode step (each with whether a residual add follows its product), so
/// that the first answer does not pay for building them. Nothing to do
/// where no backend has kernels of Ondo's own.
pub fn prepare<'a>(matrices: impl IntoIterator<Item = (AffineMatrix<'a>, bool)>) {
    #[cfg(target_os = "linux")]
    cuda::prepare(matrices);
    #[cfg(not(target_os = "linux"))]
    let _ = matrices;
}

/// The most sequences a batch decodes together on this backend: no bound
/// on the CPU and on a Mac, where one step over several rows costs little
/// more than over one (MLX reads each matrix once for all of them), nor on
/// MLX's CUDA backend while Ondo's kernel runs there (it reads each weight
/// once for up to 8 rows). Without that kernel (`ONDO_CUDA_MATVEC=0`) a
/// CUDA step's cost grows with its rows (MLX's 4-bit product for a few
/// vectors reads the weights again for nearly each: on an H200 at Llama
/// 3.2 3B's shape four streams decoded together gave 0.67x the tokens of
/// one stream alone, docs/BENCHMARKS.md), so requests there take turns.
pub fn batch_rows_limit() -> usize {
    if on_cuda() && !own_kernels_active() {
        1
    } else {
        usize::MAX
    }
}

/// Whether decode steps in this process run a kernel of Ondo's own, whose
/// sums round otherwise than MLX's: the benchmark's token check judges a
/// departure from mlx-lm by that.
pub fn own_kernels_active() -> bool {
    #[cfg(target_os = "linux")]
    return cuda::enabled();
    #[cfg(not(target_os = "linux"))]
    false
}

/// The backend kernels' own check against MLX, for `ondo doctor`: its name
/// and outcome, `None` where no kernel of Ondo's runs.
pub fn self_check() -> Option<(&'static str, Result<String, String>)> {
    #[cfg(target_os = "linux")]
    return cuda::check().map(|outcome| ("Ondo's CUDA kernel", outcome));
    #[cfg(not(target_os = "linux"))]
    None
}

/// Whether attention over a quantized KV cache runs as quantized matrix
/// products (mlx-lm's `quantized_scaled_dot_product_attention`). MLX 0.32's
/// CUDA backend has no quantized matmul for attention's shapes (a decode
/// step's `[1, 128] x [positions, 128]` per head fails with "No
/// implementation for problem shape"), so there one layer's keys and
/// values are dequantized for its attention instead: the cache is held in
/// 4 or 8 bits all the same, and a layer's float copy lives for its step.
pub fn attends_quantized_directly() -> bool {
    !on_cuda()
}

/// Whether MLX runs on its CUDA backend (asked of MLX once per process).
fn on_cuda() -> bool {
    static CUDA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CUDA.get_or_init(|| {
        let mut cuda = false;
        // SAFETY: the probe writes one bool through a valid pointer.
        let status = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
        status == 0 && cuda
    })
}
