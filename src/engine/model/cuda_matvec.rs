//! A decode step's 4-bit matrix-vector products on MLX's CUDA backend,
//! through Ondo's own kernel (`qmv4.cuh`), which MLX compiles with NVRTC.
//! On wherever MLX runs on a CUDA GPU; `ONDO_CUDA_MATVEC=0` turns it off.
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
//! What it changes: it sums in another order than MLX's kernel (its error
//! against an fp32 reference is about half of MLX's), so greedy tokens can
//! part from mlx-lm's at a near-tie. The benchmark's token check scores each
//! such departure against the model in float32 (`bench::token_check`): a
//! departure within what rounding explains is a near tie, one beyond it a
//! bug.
//!
//! Where it applies: MLX's CUDA backend with the GPU as default device,
//! affine 4-bit weights in groups of 32, 64 or 128 with biases, one position
//! (a decode step), scales in the activations' dtype, and a matrix of at
//! least `MIN_WEIGHTS` (MLX takes a custom kernel at a higher host cost than
//! its own, about 11 microseconds a call against 4 measured from Python,
//! which only the large matrices repay). Everything else, prefill included,
//! and every Mac (Metal has its own kernels) runs MLX's `quantized_matmul`.
//!
//! Each activation dtype and group size is its own kernel (a model has one),
//! with a branch for each matrix shape the model's decode step takes. MLX
//! compiles it with NVRTC at its first call, 2-3 s on the H200, in every
//! process (MLX keeps custom kernels in memory only); `prepare` builds and
//! compiles it as the model loads, so the first answer does not pay for it.
//! For measurements, `ONDO_CUDA_MATVEC_MIN`, `ONDO_CUDA_MATVEC_LAUNCH` and
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
/// MLX keeps compiled kernels by name alone (its own also on disk, under the
/// system's temporary folder), so the name carries the source's hash: a
/// changed kernel must never run under an old one's name.
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

/// One compiled instance of the kernel per activation dtype and group size
/// (a model has one), specialised for the matrix shapes its model's decode
/// step takes: NVRTC costs 2-3 s an instance on the H200, in every
/// process, since MLX keeps custom kernels in memory only. One instance per
/// shape, as before, made an 8B model's load 6.7-9.6 s against 1.4-1.7 s without
/// the kernel; one instance with a run-time shape compiled once but decoded
/// 8B 0.86x as fast, its rounds no longer unrolled.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Instance {
    dtype: Dtype,
    group: i32,
}

/// A shape an instance is specialised for: the row's length and the warps
/// that share a row set. The rows come with each call (`w_shape[0]`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Spec {
    k: i32,
    split: i32,
}

/// MLX's handle to an instance, and the shapes it was built for.
#[derive(Clone)]
struct Kernel {
    handle: mlx_sys::mlx_fast_cuda_kernel,
    specs: Vec<Spec>,
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

/// Whether decode steps use Ondo's kernel in this process: MLX runs on a
/// CUDA GPU, and `ONDO_CUDA_MATVEC=0` did not turn it off.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ONDO_CUDA_MATVEC").as_deref() != Ok("0") && available())
}

/// Whether the kernel can run here: MLX's backend is CUDA, its default
/// device the GPU, and MLX takes the kernel's source (asked with a small
/// instance; making a handle compiles nothing).
fn available() -> bool {
    if !cuda_is_default() {
        return false;
    }
    let probe = Instance {
        dtype: Dtype::Bfloat16,
        group: 64,
    };
    match make_kernel(probe, vec![Spec { k: 1024, split: 1 }]) {
        Some(kernel) => {
            // SAFETY: the probe's handle was made here and is used nowhere else.
            unsafe { mlx_sys::mlx_fast_cuda_kernel_free(kernel.handle) };
            true
        }
        None => false,
    }
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

/// The name MLX compiles and keeps an instance under: the source's hash,
/// then everything that is written into the kernel's body.
fn kernel_name(source_hash: u64, instance: Instance, specs: &[Spec]) -> String {
    let Instance { dtype, group } = instance;
    let (rows, chunks) = rows_and_chunks();
    let mut name = format!(
        "ondo_qmv4_{source_hash:016x}_{}_g{group}_r{rows}c{chunks}w{WARPS}",
        dtype_tag(dtype)
    );
    for Spec { k, split } in specs {
        name.push_str(&format!("_{k}s{split}"));
    }
    name
}

/// The kernel's body: the specialisation for the call's row length and
/// split (the block's y size), chosen by branches every thread of a launch
/// takes alike.
fn kernel_body(group: i32, specs: &[Spec]) -> String {
    let (rows, chunks) = rows_and_chunks();
    let mut body = String::from("const int n = w_shape[0];\nconst int k = w_shape[1] * 8;\n");
    for (i, Spec { k, split }) in specs.iter().enumerate() {
        let branch = if i == 0 { "if" } else { "else if" };
        body.push_str(&format!(
            "{branch} (k == {k} && blockDim.y == {split}) {{\n  \
             ondo_qmv4<{group}, {rows}, {chunks}, {split}, {WARPS}, {k}>(x, w, scales, biases, y, \
             n);\n}}\n"
        ));
    }
    body
}

/// A call's launch for an `n` x `k` matrix, in MLX's terms (the grid in
/// threads): blocks of 32 lanes x `split` warps per row set x the row sets
/// that fill `WARPS` warps, laid along z, which allows 65535 blocks (at
/// least 2 million rows, more than any vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Launch {
    grid: [i32; 3],
    block: [i32; 3],
}

fn launch_for(n: i32, k: i32) -> Launch {
    let (rows, _) = rows_and_chunks();
    let split = split_for(n, k);
    let sets_per_block = WARPS / split;
    let blocks = ((n + rows - 1) / rows + sets_per_block - 1) / sets_per_block;
    Launch {
        grid: [32, split, blocks * sets_per_block],
        block: [32, split, sets_per_block],
    }
}

/// CUDA's limit on a grid's z size, in blocks.
const MAX_BLOCKS_Z: i32 = 65535;

/// The instances made so far, each with the shapes it was built for.
fn kernels() -> &'static Mutex<HashMap<Instance, Kernel>> {
    static KERNELS: OnceLock<Mutex<HashMap<Instance, Kernel>>> = OnceLock::new();
    KERNELS.get_or_init(Default::default)
}

/// The instance for this dtype and group if it was built for `spec`.
fn kernel_for(instance: Instance, spec: Spec) -> Option<mlx_sys::mlx_fast_cuda_kernel> {
    let kernels = kernels().lock().ok()?;
    let kernel = kernels.get(&instance)?;
    kernel.specs.contains(&spec).then_some(kernel.handle)
}

fn make_kernel(instance: Instance, mut specs: Vec<Spec>) -> Option<Kernel> {
    specs.sort();
    specs.dedup();
    let name = CString::new(kernel_name(SOURCE_HASH, instance, &specs)).ok()?;
    let body = CString::new(kernel_body(instance.group, &specs)).ok()?;
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
        (!handle.ctx.is_null()).then_some(Kernel { handle, specs })
    }
}

/// The instance and shape the kernel would compute `x @ W.T` with for one
/// position, for this matrix with its affine biases, whether or not an
/// instance was built for it yet.
fn candidate(
    weight: &Array,
    scales: &Array,
    biases: &Array,
    params: QuantParams,
) -> Option<(Instance, Spec)> {
    let dtype = scales.dtype();
    let n = *weight.shape().first()?;
    let k = weight.shape().get(1)? * 8;
    let takes = params.mode == QuantMode::Affine
        && params.bits == 4
        && matches!(params.group_size, 32 | 64 | 128)
        && weight.ndim() == 2
        && k > 0
        && k % 32 == 0
        && weight.dtype() == Dtype::Uint32
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && biases.dtype() == dtype
        && i64::from(n) * i64::from(k) >= min_weights();
    let launch = launch_for(n, k);
    (takes && launch.grid[2] / launch.block[2] <= MAX_BLOCKS_Z).then_some((
        Instance {
            dtype,
            group: params.group_size,
        },
        Spec {
            k,
            split: launch.block[1],
        },
    ))
}

/// Whether `x @ W.T` for this matrix (with its affine biases) and input is
/// one the kernel computes: one position, and an instance built for the
/// matrix's shape as its model loaded (`prepare`). The cached switch comes
/// first: every matmul of a CPU run asks.
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
    x.size() == k as usize
        && x.dtype() == scales.dtype()
        && weight.shape().get(1).is_some_and(|&packed| packed * 8 == k)
        && candidate(weight, scales, biases, params)
            .is_some_and(|(instance, spec)| kernel_for(instance, spec).is_some())
}

/// Builds and compiles, as a model loads, the kernel for every matrix of
/// its decode step that takes it (`matrices`: weight, scales, biases and
/// quantization of each): one instance per activation dtype and group size,
/// specialised for the shapes among them, widened if an earlier model in
/// this process built it for others. NVRTC runs at an instance's first call,
/// so one call per shape on a zero vector, evaluated, moves that cost out of
/// the first answer and checks each specialisation runs. A kernel that does
/// not build costs the model nothing but the speed: its matmuls stay on
/// MLX's kernel, and one line on stderr says why.
pub fn prepare<'a>(
    matrices: impl IntoIterator<Item = (&'a Array, &'a Array, &'a Array, QuantParams)>,
) {
    if !enabled() {
        return;
    }
    let mut wanted: HashMap<Instance, Vec<Matrix<'a>>> = HashMap::new();
    for (weight, scales, biases, params) in matrices {
        if let Some((instance, spec)) = candidate(weight, scales, biases, params) {
            let shapes = wanted.entry(instance).or_default();
            if !shapes.iter().any(|m| m.spec == spec) {
                shapes.push(Matrix {
                    spec,
                    weight,
                    scales,
                    biases,
                    params,
                });
            }
        }
    }
    for (instance, shapes) in wanted {
        let Ok(mut built_kernels) = kernels().lock() else {
            return;
        };
        let before = built_kernels.get(&instance).cloned();
        let built = before.as_ref().map(|k| k.specs.clone()).unwrap_or_default();
        if shapes.iter().all(|m| built.contains(&m.spec)) {
            continue;
        }
        let specs = built
            .into_iter()
            .chain(shapes.iter().map(|m| m.spec))
            .collect();
        match make_kernel(instance, specs) {
            Some(kernel) => built_kernels.insert(instance, kernel),
            None => continue,
        };
        drop(built_kernels);
        let compiled = shapes.iter().try_for_each(Matrix::compile);
        let Ok(mut built_kernels) = kernels().lock() else {
            return;
        };
        // The handle no longer kept: the one replaced, or on failure the new
        // one, with the one before put back.
        let discarded = match compiled {
            Ok(()) => before,
            Err(error) => {
                eprintln!(
                    "ondo: Ondo's CUDA matrix-vector kernel did not build ({error}); decode \
                     steps use MLX's own kernel"
                );
                match before {
                    Some(kernel) => built_kernels.insert(instance, kernel),
                    None => built_kernels.remove(&instance),
                }
            }
        };
        if let Some(kernel) = discarded {
            // SAFETY: the map no longer holds this handle, and graphs built
            // with it keep their own copy of the kernel's name and source.
            unsafe { mlx_sys::mlx_fast_cuda_kernel_free(kernel.handle) };
        }
    }
}

/// One shape a model's instance is built for, with a matrix of that shape.
struct Matrix<'a> {
    spec: Spec,
    weight: &'a Array,
    scales: &'a Array,
    biases: &'a Array,
    params: QuantParams,
}

impl Matrix<'_> {
    /// One call on a zero vector, evaluated: compiles the instance at its
    /// first call, and runs this shape's branch once.
    fn compile(&self) -> Result<(), Exception> {
        let x = mlx_rs::ops::zeros_dtype(&[1, 1, self.spec.k], self.scales.dtype())?;
        matvec(&x, self.weight, self.scales, self.biases, self.params)?.eval()
    }
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
    let (n, k) = (weight.shape()[0], weight.shape()[1] * 8);
    let launch = launch_for(n, k);
    let instance = Instance {
        dtype: x.dtype(),
        group: params.group_size,
    };
    let spec = Spec {
        k,
        split: launch.block[1],
    };
    let handle = kernel_for(instance, spec)
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel was not built for this matrix"))?;
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
        let ([gx, gy, gz], [bx, by, bz]) = (launch.grid, launch.block);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, gx, gy, gz);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, bx, by, bz);
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
                handle,
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

    /// A launch covers every row exactly once per warp of a split: whole
    /// row sets of `WARPS` warps per block, the split along y.
    #[test]
    fn a_launch_covers_every_row_set() {
        use super::{Launch, WARPS, launch_for};
        for (n, k) in [
            (4096, 14336),
            (28672, 4096),
            (128256, 4096),
            (5120, 3072),
            (1000, 4096),
        ] {
            let Launch { grid, block } = launch_for(n, k);
            let split = super::split_for(n, k);
            assert_eq!(block, [32, split, WARPS / split], "{n}x{k}");
            assert_eq!(grid[..2], block[..2], "{n}x{k}");
            let sets = grid[2];
            assert_eq!(sets % block[2], 0, "whole blocks: {n}x{k}");
            assert!(
                sets * 8 >= n && (sets - block[2]) * 8 < n,
                "{n}x{k}: {sets} sets"
            );
        }
    }

    /// The kernel's name changes with its source, so a changed kernel never
    /// runs under an old one's name in MLX's cache of compiled kernels; and
    /// with every number its body is built from, the shapes included.
    #[test]
    fn the_kernel_name_carries_the_source_and_the_launch() {
        use super::{Instance, Spec, kernel_name};
        let instance = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
        };
        let specs = [Spec { k: 4096, split: 2 }, Spec { k: 14336, split: 4 }];
        let name = |source: &str, instance, specs: &[Spec]| {
            kernel_name(super::fnv1a(source.as_bytes()), instance, specs)
        };
        let shipped = name(super::SOURCE, instance, &specs);
        assert_eq!(shipped, name(super::SOURCE, instance, &specs));
        let edited = format!("{}\n// edited", super::SOURCE);
        assert_ne!(shipped, name(&edited, instance, &specs));
        assert_ne!(shipped, name(super::SOURCE, instance, &specs[..1]));
        assert_ne!(
            shipped,
            name(
                super::SOURCE,
                instance,
                &[specs[0], Spec { k: 14336, split: 2 }]
            )
        );
        for other in [
            Instance {
                dtype: mlx_rs::Dtype::Float16,
                ..instance
            },
            Instance {
                group: 32,
                ..instance
            },
        ] {
            assert_ne!(shipped, name(super::SOURCE, other, &specs));
        }
    }

    /// One instance holds a specialisation per shape of its model, each
    /// taken by the calls of that row length and split, with the numbers
    /// written in (8B's gate and up, down and head).
    #[test]
    fn an_instance_has_a_branch_per_shape() {
        use super::{Spec, kernel_body};
        let body = kernel_body(
            64,
            &[
                Spec { k: 4096, split: 1 },
                Spec { k: 4096, split: 2 },
                Spec { k: 14336, split: 4 },
            ],
        );
        assert!(body.contains("const int n = w_shape[0];"), "{body}");
        for (condition, call) in [
            (
                "if (k == 4096 && blockDim.y == 1)",
                "ondo_qmv4<64, 8, 1, 1, 4, 4096>(",
            ),
            (
                "else if (k == 4096 && blockDim.y == 2)",
                "ondo_qmv4<64, 8, 1, 2, 4, 4096>(",
            ),
            (
                "else if (k == 14336 && blockDim.y == 4)",
                "ondo_qmv4<64, 8, 1, 4, 4, 14336>(",
            ),
        ] {
            let at = body
                .find(condition)
                .unwrap_or_else(|| panic!("{condition}: {body}"));
            assert!(body[at..].contains(call), "{call}: {body}");
        }
        assert_eq!(body.matches("ondo_qmv4<").count(), 3, "{body}");
    }
}
