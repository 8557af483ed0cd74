//! Ondo's 4-bit matrix-vector kernel on MLX's CUDA backend (`qmv4.cuh`),
//! for a decode step's products; MLX compiles it with NVRTC. It applies
//! wherever MLX runs on a CUDA GPU, unless `ONDO_CUDA_MATVEC=0`.
//!
//! Why: a decode step reads every weight once, and MLX's CUDA kernel for a
//! 4-bit matrix times one vector reads them well below the card's bandwidth
//! (docs/BENCHMARKS.md, "On a GPU", has the current figures). This kernel
//! keeps more bytes in flight per warp, splits the rows of a narrow matrix
//! over several warps, and unpacks without conversions.
//!
//! What it changes: it sums in another order than MLX's kernel (its error
//! against float32 is at most MLX's), so greedy tokens can part from
//! mlx-lm's at a near tie; the benchmark's token check scores each such
//! departure (`bench::token_check`).
//!
//! Where it applies: the GPU as MLX's default device, affine 4-bit weights
//! in groups of 32, 64 or 128 with biases, up to `MAX_POSITIONS` positions
//! (a decode step of one sequence or of a batch), scales in the
//! activations' dtype, and a matrix of at least `MIN_WEIGHTS` (a custom
//! kernel costs MLX's host more per call than its own, which only large
//! matrices repay). Where a residual add follows the product (the
//! attention's output projection and the MLP's down projection of a layer
//! without norms after them), the kernel makes the add too, rounding as
//! MLX's matmul and add would: one kernel fewer, so every such product
//! repays the call (`MIN_WEIGHTS_WITH_ADD`). Everything else, a prefill's
//! chunks of more than `MAX_POSITIONS` tokens included, runs MLX's
//! `quantized_matmul`.
//!
//! Several positions (a batch's decode step, a sequence per row) go
//! through `ondo_qmv4_many`, which reads each weight once for up to 8 of
//! them: MLX's 4-bit product for a few vectors reads the weights again for
//! nearly each one (its time grows about linearly past 2 on the H200), so a
//! batch decoded through it gains nothing there.
//!
//! How it is built: one MLX custom kernel per activation dtype and group
//! size, with a branch for each matrix shape of the model's decode step,
//! rows, row length and layout compiled into each. MLX compiles it at its
//! first call (seconds, once per process), so `prepare` builds it and runs
//! each shape once as the model loads. MLX copies and hashes a custom
//! kernel's source on every call, so the source it gets is the kernel
//! without its comments. The `ONDO_CUDA_MATVEC_*` variables
//! (`crate::environment`) override the threshold, the launch and the
//! source, for measurements.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock};

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::AffineMatrix;
use crate::environment;
use crate::family::{QuantMode, QuantParams};

/// The kernel's source, shared with `scripts/gpu-qmv-lab.py` (which compiles
/// it without MLX to time it on the GPU alone).
const SOURCE: &str = include_str!("qmv4.cuh");

/// The several-positions kernel's own source (`ondo_qmv4_many`), which
/// builds on `SOURCE`'s helpers.
const MANY_SOURCE: &str = include_str!("qmv4_many.cuh");

/// The source this process builds: `SOURCE`, or for measurements the file
/// `ONDO_CUDA_MATVEC_SOURCE` names (a variant of `qmv4.cuh` timed in the
/// engine without a rebuild; one that cannot be read is an error there, not
/// a silent fall back to the shipped kernel).
fn source() -> &'static str {
    static CHOSEN: OnceLock<String> = OnceLock::new();
    CHOSEN.get_or_init(|| match environment::CUDA_MATVEC_SOURCE.os_value() {
        Some(path) => std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}={}: {e}",
                environment::CUDA_MATVEC_SOURCE.name,
                path.to_string_lossy()
            )
        }),
        None => SOURCE.to_owned(),
    })
}

/// MLX keeps compiled kernels by name for the life of the process, so the
/// name carries the source's hash: a changed kernel must never run under an
/// old one's name.
fn source_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| fnv1a(source().as_bytes()))
}

/// The source without comments, blank lines and indentation: what MLX gets
/// as the kernel's header, which it copies into every call's source and
/// hashes (8.0 KB with the comments, 4.5 KB without).
fn compact_source() -> &'static str {
    static COMPACT: OnceLock<String> = OnceLock::new();
    COMPACT.get_or_init(|| compact(source()))
}

/// The several-positions kernel's header: the one-position kernel's, then
/// `MANY_SOURCE`, each without comments.
fn compact_many_source() -> &'static str {
    static COMPACT: OnceLock<String> = OnceLock::new();
    COMPACT.get_or_init(|| format!("{}\n{}", compact_source(), compact(MANY_SOURCE)))
}

fn compact(source: &str) -> String {
    source
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}
/// Warps per block.
const WARPS: i32 = 4;

/// How the kernel reads an `n` x `k` matrix: rows per warp, 16-byte chunks
/// of each row a lane loads per round before any arithmetic, and warps that
/// share a row set (each taking every `split`-th round, their sums added
/// through shared memory).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Layout {
    rows: i32,
    chunks: i32,
    split: i32,
}

/// The layout for an `n` x `k` matrix, the one the GPU's own time of every
/// layout on the 8B and 3B shapes ranked best (`scripts/gpu-qmv-lab.py
/// --sweep`; docs/benchmarks-log.md has the sweeps): 4 rows per warp; one
/// chunk a round (with every load of a round issued before its arithmetic,
/// two chunks hold twice the registers and fewer warps fit); a row set split
/// over as many warps as it has rounds, up to 4, while the grid stays within
/// `FULL_GPU_WARPS`. `ONDO_CUDA_MATVEC_LAUNCH` and `ONDO_CUDA_MATVEC_SPLIT`
/// fix them for measurements.
fn layout_for(n: i32, k: i32) -> Layout {
    /// `ONDO_CUDA_MATVEC_LAUNCH` as (rows, chunks), `ONDO_CUDA_MATVEC_SPLIT`.
    type Fixed = (Option<(i32, i32)>, Option<i32>);
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    let (fixed_launch, fixed_split) = *FIXED.get_or_init(|| {
        let launch = environment::CUDA_MATVEC_LAUNCH
            .value()
            .and_then(|v| {
                let (rows, chunks) = v.split_once('x')?;
                Some((rows.trim().parse().ok()?, chunks.trim().parse().ok()?))
            })
            .filter(|&(rows, chunks)| matches!(rows, 1 | 2 | 4 | 8) && matches!(chunks, 1 | 2 | 4));
        let split = environment::CUDA_MATVEC_SPLIT
            .parsed()
            .filter(|v| matches!(v, 1 | 2 | 4));
        (launch, split)
    });
    let (rows, chunks) = fixed_launch.unwrap_or((4, 1));
    let sets = (n + rows - 1) / rows;
    let rounds = (k / (32 * 32 * chunks)).max(1);
    let mut split = 1;
    while split < 4 && split * 2 <= rounds && sets * split * 2 <= FULL_GPU_WARPS {
        split *= 2;
    }
    Layout {
        rows,
        chunks,
        split: fixed_split.unwrap_or(split),
    }
}

/// Warps (row sets times their split) a split grid stays within: a grid
/// past it already fills the GPU, and splitting it further only adds the
/// sums through shared memory (a vocabulary-sized head is never split).
const FULL_GPU_WARPS: i32 = 16384;

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// What a kernel is compiled for besides its shape: the activations' dtype
/// (scales and biases share it) and the quantization group size.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Instance {
    dtype: Dtype,
    group: i32,
}

/// A matrix shape a kernel is compiled for, rows and row length, and how
/// it reads it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Spec {
    n: i32,
    k: i32,
    layout: Layout,
}

/// MLX's handles to an instance, the one-position kernel and the
/// several-positions one, the shapes they were built for, and what a call
/// without a residual passes in the residual's place.
#[derive(Clone)]
struct Kernel {
    handle: mlx_sys::mlx_fast_cuda_kernel,
    many: mlx_sys::mlx_fast_cuda_kernel,
    specs: Vec<Spec>,
    no_residual: Array,
}

impl Kernel {
    /// Frees both handles.
    ///
    /// # Safety
    /// Nothing may use the handles afterwards (graphs built with them keep
    /// their own copy of the kernel's name and source).
    unsafe fn free(&self) {
        // SAFETY: as the caller promises.
        unsafe {
            mlx_sys::mlx_fast_cuda_kernel_free(self.handle);
            mlx_sys::mlx_fast_cuda_kernel_free(self.many);
        }
    }
}

// SAFETY: the handle is an immutable description (name, source, argument
// names) that MLX only reads when a call builds a primitive from it; the
// placeholder is an evaluated one-element array that calls only read.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// The smallest matrix the kernel takes, in weights (out x in): below it, a
/// custom kernel's call costs MLX's host more than the GPU time it saves
/// (measured on the H200 with the 8B and 3B shapes: an 8B step's joined q,
/// k and v repay it, a 3B step's do not; docs/benchmarks-log.md).
const MIN_WEIGHTS: i64 = 1 << 24;

/// The smallest matrix the kernel takes where a residual add follows the
/// product (the attention's output projection, the MLP's down projection):
/// there the kernel's call replaces MLX's matmul and its add, two kernels.
const MIN_WEIGHTS_WITH_ADD: i64 = 0;

/// Whether decode steps use Ondo's kernel in this process: MLX runs on a
/// CUDA GPU, and `ONDO_CUDA_MATVEC=0` did not turn it off.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| environment::CUDA_MATVEC.switch() != Some(false) && available())
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
    let spec = Spec {
        n: 1024,
        k: 1024,
        layout: layout_for(1024, 1024),
    };
    match make_kernel(probe, vec![spec]) {
        Some(kernel) => {
            // SAFETY: the probe's handles were made here and are used nowhere else.
            unsafe { kernel.free() };
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
    status == 0 && cuda && crate::engine::model::default_device_is_gpu()
}

fn dtype_tag(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "bf16",
        Dtype::Float16 => "f16",
        _ => "f32",
    }
}

/// The kernel's type for the activations' dtype (qmv4.cuh).
fn cuda_type(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "ondo_bf16",
        Dtype::Float16 => "ondo_f16",
        _ => "float",
    }
}

/// The name MLX compiles and keeps an instance under: the source's hash,
/// then everything that is written into the kernel's body.
fn kernel_name(source_hash: u64, instance: Instance, specs: &[Spec]) -> String {
    let Instance { dtype, group } = instance;
    let mut name = format!(
        "ondo_qmv4_{source_hash:016x}_{}_g{group}_w{WARPS}",
        dtype_tag(dtype)
    );
    for Spec { n, k, layout } in specs {
        let Layout {
            rows,
            chunks,
            split,
        } = layout;
        name.push_str(&format!("_{n}x{k}r{rows}c{chunks}s{split}"));
    }
    name
}

/// The kernel's body: a branch per shape, each taken by the calls of that
/// matrix (every thread of a launch alike), with the numbers written in.
/// MLX's signature has its own 16-bit float types; qmv4.cuh names its own,
/// of the same bits.
fn kernel_body(instance: Instance, specs: &[Spec]) -> String {
    let t = cuda_type(instance.dtype);
    let mut body = format!(
        "const int n = w_shape[0];\nconst int k = w_shape[1] * 8;\nconst {t}* r = residual_ndim > 1 ? \
         reinterpret_cast<const {t}*>(residual) : nullptr;\n"
    );
    for (i, Spec { n, k, layout }) in specs.iter().enumerate() {
        let Layout {
            rows,
            chunks,
            split,
        } = layout;
        let branch = if i == 0 { "if" } else { "else if" };
        body.push_str(&format!(
            "{branch} (n == {n} && k == {k}) {{\n  ondo_qmv4<{group}, {rows}, {chunks}, {split}, \
             {WARPS}, {k}, {n}>(reinterpret_cast<const {t}*>(x), w, reinterpret_cast<const \
             {t}*>(scales), reinterpret_cast<const {t}*>(biases), reinterpret_cast<{t}*>(y), \
             r);\n}}\n",
            group = instance.group,
        ));
    }
    body
}

/// The several-positions kernel's body: the positions counted from `x`'s
/// leading dimensions, then a branch per shape as in `kernel_body`.
fn many_kernel_body(instance: Instance, specs: &[Spec]) -> String {
    let t = cuda_type(instance.dtype);
    let mut body = format!(
        "const int n = w_shape[0];\nconst int k = w_shape[1] * 8;\nint m = 1;\nfor (int i = 0; i + 1 \
         < x_ndim; ++i) {{\nm *= x_shape[i];\n}}\nconst {t}* r = residual_ndim > 1 ? \
         reinterpret_cast<const {t}*>(residual) : nullptr;\n"
    );
    for (i, Spec { n, k, layout }) in specs.iter().enumerate() {
        let Layout { rows, split, .. } = layout;
        let branch = if i == 0 { "if" } else { "else if" };
        let vecs = positions_per_pass(*rows);
        body.push_str(&format!(
            "{branch} (n == {n} && k == {k}) {{\n  ondo_qmv4_many<{group}, {rows}, {split}, \
             {WARPS}, {vecs}, {k}, {n}>(reinterpret_cast<const {t}*>(x), w, \
             reinterpret_cast<const {t}*>(scales), reinterpret_cast<const {t}*>(biases), \
             reinterpret_cast<{t}*>(y), r, m);\n}}\n",
            group = instance.group,
        ));
    }
    body
}

/// The positions a warp takes in one walk over its rows when a call has
/// several (`ondo_qmv4_many`): as many as give one lane per output of the
/// warp's rows (8 with 4 rows per warp), each adding its sums to the
/// registers the walk holds.
fn positions_per_pass(rows: i32) -> i32 {
    (32 / rows).min(8)
}

/// The most positions one call takes: a batch's decode step has one per
/// sequence. Past it (a prefill's chunk) MLX's kernel, built for many
/// positions, computes the product.
const MAX_POSITIONS: usize = 32;

/// A call's launch for an `n` x `k` matrix, in MLX's terms (the grid in
/// threads): blocks of 32 lanes x `split` warps per row set x the row sets
/// that fill `WARPS` warps, laid along z, which allows 65535 blocks (at
/// least 2 million rows, more than any vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Launch {
    grid: [i32; 3],
    block: [i32; 3],
}

fn launch_for(n: i32, layout: Layout) -> Launch {
    let Layout { rows, split, .. } = layout;
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

/// The instance for this dtype and group if it was built for `spec`: its
/// handle for a call of `positions` positions and its placeholder for a
/// call without a residual.
fn kernel_for(
    instance: Instance,
    spec: Spec,
    positions: usize,
) -> Option<(mlx_sys::mlx_fast_cuda_kernel, Array)> {
    let kernels = kernels().lock().ok()?;
    let kernel = kernels.get(&instance)?;
    let handle = if positions > 1 {
        kernel.many
    } else {
        kernel.handle
    };
    kernel
        .specs
        .contains(&spec)
        .then(|| (handle, kernel.no_residual.clone()))
}

fn make_kernel(instance: Instance, mut specs: Vec<Spec>) -> Option<Kernel> {
    specs.sort();
    specs.dedup();
    let name = kernel_name(source_hash(), instance, &specs);
    // A call without a residual passes a one-dimensional placeholder, which
    // the body tells from a residual stream ([.., n]) by its rank.
    let no_residual = mlx_rs::ops::zeros_dtype(&[1], instance.dtype).ok()?;
    no_residual.eval().ok()?;
    let handle = new_kernel(&name, &kernel_body(instance, &specs), compact_source())?;
    let many_name = format!("{name}_many{:016x}", fnv1a(MANY_SOURCE.as_bytes()));
    let Some(many) = new_kernel(
        &many_name,
        &many_kernel_body(instance, &specs),
        compact_many_source(),
    ) else {
        // SAFETY: the handle was made here and is used nowhere else.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_free(handle) };
        return None;
    };
    Some(Kernel {
        handle,
        many,
        specs,
        no_residual,
    })
}

/// MLX's handle to one custom kernel of Ondo's inputs and output (nothing
/// is compiled until its first call).
fn new_kernel(name: &str, body: &str, header: &str) -> Option<mlx_sys::mlx_fast_cuda_kernel> {
    let name = CString::new(name).ok()?;
    let body = CString::new(body).ok()?;
    let header = CString::new(header).ok()?;
    let mut inputs = [c"x", c"w", c"scales", c"biases", c"residual"].map(CStr::as_ptr);
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
        (!handle.ctx.is_null()).then_some(handle)
    }
}

/// The kernel and shape that would compute `x @ W.T` with for a decode step,
/// for this matrix with its affine biases, whether or not it was compiled;
/// `adds_residual` when a residual add follows the product (which the
/// kernel then makes, so smaller matrices repay its call).
fn candidate(matrix: AffineMatrix, adds_residual: bool) -> Option<(Instance, Spec)> {
    let AffineMatrix {
        weight,
        scales,
        biases,
        params,
    } = matrix;
    let dtype = scales.dtype();
    let n = *weight.shape().first()?;
    let k = weight.shape().get(1)? * 8;
    let takes = params.mode == QuantMode::Affine
        && params.bits == 4
        && matches!(params.group_size, 32 | 64 | 128)
        && weight.ndim() == 2
        && n > 0
        && k > 0
        && k % 32 == 0
        && weight.dtype() == Dtype::Uint32
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && biases.dtype() == dtype
        && i64::from(n) * i64::from(k) >= min_weights(adds_residual);
    let layout = layout_for(n, k);
    let launch = launch_for(n, layout);
    (takes && launch.grid[2] / launch.block[2] <= MAX_BLOCKS_Z).then_some((
        Instance {
            dtype,
            group: params.group_size,
        },
        Spec { n, k, layout },
    ))
}

/// Whether `x @ W.T` for this matrix (with its affine biases) and input is
/// one the kernel computes: at most `MAX_POSITIONS` positions, and a kernel compiled for the
/// matrix's shape as its model loaded (`prepare`); with `residual`,
/// `residual + x @ W.T`, for a residual stream of the output's shape and
/// dtype. The cached switch comes first: every matmul of a CPU run asks.
pub fn applies(x: &Array, matrix: AffineMatrix, residual: Option<&Array>) -> bool {
    if !enabled() {
        return false;
    }
    let k = x.shape().last().copied().unwrap_or(0);
    let n = matrix.weight.shape().first().copied().unwrap_or(0);
    let positions = if k > 0 { x.size() / k as usize } else { 0 };
    (1..=MAX_POSITIONS).contains(&positions)
        && x.dtype() == matrix.scales.dtype()
        && matrix
            .weight
            .shape()
            .get(1)
            .is_some_and(|&packed| packed * 8 == k)
        && residual.is_none_or(|r| fused_residual() && takes_residual(r, x, n))
        && candidate(matrix, residual.is_some())
            .is_some_and(|(instance, spec)| kernel_for(instance, spec, positions).is_some())
}

/// A residual the kernel adds: `n` values for each of `x`'s positions, in
/// its dtype, of rank 2 or more (a rank-1 input is what the body reads as
/// none).
fn takes_residual(residual: &Array, x: &Array, n: i32) -> bool {
    let k = x.shape().last().copied().unwrap_or(0).max(1) as usize;
    residual.dtype() == x.dtype()
        && residual.ndim() >= 2
        && residual.size() == x.size() / k * n as usize
        && residual.shape().last() == Some(&n)
}

/// Whether the kernel makes the residual add that follows a product
/// (`ONDO_CUDA_MATVEC_RESIDUAL=0` leaves it to MLX, for measurements).
fn fused_residual() -> bool {
    static FUSED: OnceLock<bool> = OnceLock::new();
    *FUSED.get_or_init(|| environment::CUDA_MATVEC_RESIDUAL.switch() != Some(false))
}

/// Builds and compiles, as a model loads, the kernel for every matrix of
/// its decode step that takes it (`matrices`, each with whether a residual
/// add follows it): one instance per activation dtype and group size,
/// with a branch for each shape among them, widened if an earlier model in
/// this process built it for others. NVRTC runs at an instance's first call,
/// so one call per shape on a zero vector, evaluated, moves that cost out of
/// the first answer and checks each branch runs. A kernel that does not
/// build costs the model nothing but the speed: its matmuls stay on MLX's
/// kernel, and one line on stderr says why.
pub fn prepare<'a>(matrices: impl IntoIterator<Item = (AffineMatrix<'a>, bool)>) {
    if !enabled() {
        return;
    }
    let mut wanted: HashMap<Instance, Vec<(Spec, AffineMatrix<'a>)>> = HashMap::new();
    for (matrix, adds_residual) in matrices {
        let adds_residual = adds_residual && fused_residual();
        if let Some((instance, spec)) = candidate(matrix, adds_residual) {
            let shapes = wanted.entry(instance).or_default();
            if !shapes.iter().any(|(s, _)| *s == spec) {
                shapes.push((spec, matrix));
            }
        }
    }
    for (instance, shapes) in wanted {
        let Ok(mut built_kernels) = kernels().lock() else {
            return;
        };
        let before = built_kernels.get(&instance).cloned();
        let built = before.as_ref().map(|k| k.specs.clone()).unwrap_or_default();
        if shapes.iter().all(|(spec, _)| built.contains(spec)) {
            continue;
        }
        let specs = built
            .into_iter()
            .chain(shapes.iter().map(|(spec, _)| *spec))
            .collect();
        match make_kernel(instance, specs) {
            Some(kernel) => built_kernels.insert(instance, kernel),
            None => continue,
        };
        drop(built_kernels);
        let compiled = shapes
            .iter()
            .try_for_each(|(spec, matrix)| compile(*matrix, instance, *spec));
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
            unsafe { kernel.free() };
        }
    }
}

/// A call on one zero vector and one on two, evaluated: compiles both
/// kernels of the instance at their first call, and runs this shape's
/// branch of each once.
fn compile(matrix: AffineMatrix, instance: Instance, spec: Spec) -> Result<(), Exception> {
    for positions in [1, 2] {
        let x = mlx_rs::ops::zeros_dtype(&[positions, 1, spec.k], matrix.scales.dtype())?;
        let (handle, no_residual) = kernel_for(instance, spec, positions as usize)
            .ok_or_else(|| Exception::custom("the instance was not built"))?;
        call(handle, spec, &x, matrix, &no_residual)?.eval()?;
    }
    Ok(())
}

/// `MIN_WEIGHTS` (`MIN_WEIGHTS_WITH_ADD` for a product a residual add
/// follows), or `ONDO_CUDA_MATVEC_MIN` (`ONDO_CUDA_MATVEC_MIN_ADD`) for
/// measurements.
fn min_weights(adds_residual: bool) -> i64 {
    static MIN: OnceLock<[i64; 2]> = OnceLock::new();
    MIN.get_or_init(|| {
        [
            environment::CUDA_MATVEC_MIN.parsed().unwrap_or(MIN_WEIGHTS),
            environment::CUDA_MATVEC_MIN_ADD
                .parsed()
                .unwrap_or(MIN_WEIGHTS_WITH_ADD),
        ]
    })[usize::from(adds_residual)]
}

/// `x @ W.T` for the positions of `x` `[.., K]` and a 4-bit affine `W` `[N, K/8]`,
/// as `[.., N]` in `x`'s dtype; with `residual`, `residual + x @ W.T`, each
/// output rounded as MLX's matmul and add would. Call only where `applies`
/// said yes.
pub fn matvec(
    x: &Array,
    matrix: AffineMatrix,
    residual: Option<&Array>,
) -> Result<Array, Exception> {
    let (instance, spec) = candidate(matrix, residual.is_some())
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel does not take this matrix"))?;
    let positions = x.size() / spec.k.max(1) as usize;
    let (handle, no_residual) = kernel_for(instance, spec, positions)
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel was not built for this matrix"))?;
    let residual = residual.unwrap_or(&no_residual);
    call(handle, spec, x, matrix, residual)
}

/// One call of an instance, for the shape `spec`, as one MLX primitive;
/// `residual` is a residual stream to add or the instance's placeholder.
fn call(
    handle: mlx_sys::mlx_fast_cuda_kernel,
    spec: Spec,
    x: &Array,
    matrix: AffineMatrix,
    residual: &Array,
) -> Result<Array, Exception> {
    let AffineMatrix {
        weight,
        scales,
        biases,
        ..
    } = matrix;
    let Launch { grid, block } = launch_for(spec.n, spec.layout);
    let mut out_shape = x.shape().to_vec();
    if let Some(last) = out_shape.last_mut() {
        *last = spec.n;
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
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid[0], grid[1], grid[2]);
        status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
            config, block[0], block[1], block[2],
        );
        let inputs = [
            x.as_ptr(),
            weight.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            residual.as_ptr(),
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

/// `ondo doctor`'s check of the kernel where it runs: random 4-bit weights
/// of a 4096 x 4096 and a 4097 x 4096 matrix (the smallest the kernel takes
/// without a residual add, and a row count no multiple of the rows per
/// warp) in bf16, groups of 64, at one position and at several (5, within
/// one walk over the rows, and 11, past it),
/// against MLX's quantized product in float32. The kernel's error must be
/// at most twice MLX's own kernel's in bf16 (it is about half), and with a
/// residual its output must be its product followed by MLX's add, bit for
/// bit. `None` where the kernel does not run.
pub fn check() -> Option<Result<String, String>> {
    if !enabled() {
        return None;
    }
    let shapes = [
        (4096, 4096, 1),
        (4097, 4096, 1),
        (4096, 4096, 5),
        (4097, 4096, 11),
    ];
    Some(
        shapes
            .iter()
            .map(|&(n, k, positions)| {
                check_shape(n, k, positions).unwrap_or_else(|e| Err(crate::engine::mlx_failure(&e)))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|details| details.join("; ")),
    )
}

fn check_shape(n: i32, k: i32, positions: i32) -> Result<Result<String, String>, Exception> {
    use mlx_rs::{ops, random};
    let params = QuantParams {
        group_size: 64,
        bits: 4,
        mode: QuantMode::Affine,
    };
    let key = random::key(u64::from(n.unsigned_abs()))?;
    let w = random::normal::<f32>(&[n, k], None, None, &key)?.as_dtype(Dtype::Bfloat16)?;
    let (weight, scales, biases) = crate::engine::model::quantized::quantize(&w, params)?;
    let biases = biases.ok_or_else(|| Exception::custom("affine weights without biases"))?;
    let x = random::normal::<f32>(&[positions, 1, k], None, None, &random::key(7)?)?
        .as_dtype(Dtype::Bfloat16)?;
    let residual = random::normal::<f32>(&[positions, 1, n], None, None, &random::key(8)?)?
        .as_dtype(Dtype::Bfloat16)?;
    let matrix = AffineMatrix {
        weight: &weight,
        scales: &scales,
        biases: &biases,
        params,
    };
    prepare([(matrix, false), (matrix, true)]);
    if !applies(&x, matrix, None) || !applies(&x, matrix, Some(&residual)) {
        return Ok(Err(format!(
            "the kernel did not build for {n}x{k} at {positions} positions; decode steps use \
             MLX's kernel (see the line ondo printed about it)"
        )));
    }
    let f32 = Dtype::Float32;
    let mlx_product = |x: &Array, scales: &Array, biases: &Array| {
        crate::engine::model::quantized::quantized_matmul(x, &weight, scales, Some(biases), params)
    };
    let exact = mlx_product(
        &x.as_dtype(f32)?,
        &scales.as_dtype(f32)?,
        &biases.as_dtype(f32)?,
    )?;
    let mlx = mlx_product(&x, &scales, &biases)?.as_dtype(f32)?;
    let ondo = matvec(&x, matrix, None)?;
    let fused = matvec(&x, matrix, Some(&residual))?;
    let apart = ops::add(&residual, &ondo)?;
    let scale = ops::abs(&exact)?.max(None)?;
    let error = |y: &Array| -> Result<f32, Exception> {
        ops::divide(ops::abs(ops::subtract(y, &exact)?)?.max(None)?, &scale)?
            .try_item_exact::<f32>()
            .map_err(|e| Exception::custom(e.to_string()))
    };
    let ondo_error = error(&ondo.as_dtype(f32)?)?;
    let mlx_error = error(&mlx)?;
    let same_bits = ops::array_eq(&fused, &apart, None)?
        .try_item_exact::<bool>()
        .map_err(|e| Exception::custom(e.to_string()))?;
    if ondo_error > (2.0 * mlx_error).max(1e-5) {
        return Ok(Err(format!(
            "{n}x{k} bf16, {positions} positions: error {ondo_error:.2e} against float32, over twice MLX's \
             {mlx_error:.2e}; Ondo's CUDA kernel computes wrong results here: turn it off \
             with ONDO_CUDA_MATVEC=0"
        )));
    }
    if !same_bits {
        return Ok(Err(format!(
            "{n}x{k} bf16, {positions} positions: the kernel's residual add differs from its \
             product plus MLX's add; \
             turn it off with ONDO_CUDA_MATVEC_RESIDUAL=0"
        )));
    }
    Ok(Ok(format!(
        "{n}x{k} x{positions} bf16 error {ondo_error:.1e} (MLX {mlx_error:.1e}), residual add exact"
    )))
}

#[cfg(test)]
mod tests {

    /// The layouts the lab chose for the 8B and 3B shapes: 4 rows per warp,
    /// one chunk a round, a row set split over as many warps as it has
    /// rounds (at most 4) while the grid stays within a full GPU.
    #[test]
    fn each_shape_gets_the_layout_measured_best() {
        use super::{Layout, layout_for};
        let layout = |rows, chunks, split| Layout {
            rows,
            chunks,
            split,
        };
        // Llama 3.1 8B: q, k and v joined; o; gate and up joined; down; head.
        assert_eq!(layout_for(6144, 4096), layout(4, 1, 4));
        assert_eq!(layout_for(4096, 4096), layout(4, 1, 4));
        assert_eq!(layout_for(28672, 4096), layout(4, 1, 2));
        assert_eq!(layout_for(4096, 14336), layout(4, 1, 4));
        assert_eq!(layout_for(128256, 4096), layout(4, 1, 1));
        // 3B: rows of 3072 weights are three rounds.
        assert_eq!(layout_for(5120, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(3072, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(16384, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(3072, 8192), layout(4, 1, 4));
        assert_eq!(layout_for(128256, 3072), layout(4, 1, 1));
    }

    /// A launch covers every row exactly once per warp of a split: whole
    /// row sets of `WARPS` warps per block, the split along y.
    #[test]
    fn a_launch_covers_every_row_set() {
        use super::{Launch, WARPS, launch_for, layout_for};
        for (n, k) in [
            (4096, 14336),
            (28672, 4096),
            (128256, 4096),
            (5120, 3072),
            (1000, 4096),
            (1001, 3072),
        ] {
            let layout = layout_for(n, k);
            let Launch { grid, block } = launch_for(n, layout);
            assert_eq!(block, [32, layout.split, WARPS / layout.split], "{n}x{k}");
            assert_eq!(grid[..2], block[..2], "{n}x{k}");
            let sets = grid[2];
            assert_eq!(sets % block[2], 0, "whole blocks: {n}x{k}");
            assert!(
                sets * layout.rows >= n && (sets - block[2]) * layout.rows < n,
                "{n}x{k}: {sets} sets"
            );
        }
    }

    /// The kernel's name changes with its source, so a changed kernel never
    /// runs under an old one's name in MLX's cache of compiled kernels; and
    /// with every number its body is built from, the shapes included.
    #[test]
    fn the_kernel_name_carries_the_source_and_the_shapes() {
        use super::{Instance, Spec, kernel_name, layout_for};
        let instance = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
        };
        let spec = |n, k| Spec {
            n,
            k,
            layout: layout_for(n, k),
        };
        let specs = [spec(28672, 4096), spec(4096, 14336)];
        let name = |source: &str, instance, specs: &[Spec]| {
            kernel_name(super::fnv1a(source.as_bytes()), instance, specs)
        };
        let shipped = name(super::SOURCE, instance, &specs);
        assert_eq!(shipped, name(super::SOURCE, instance, &specs));
        assert!(
            shipped.ends_with("_bf16_g64_w4_28672x4096r4c1s2_4096x14336r4c1s4"),
            "{shipped}"
        );
        let edited = format!("{}\n// edited", super::SOURCE);
        assert_ne!(shipped, name(&edited, instance, &specs));
        assert_ne!(shipped, name(super::SOURCE, instance, &specs[..1]));
        let split_other = Spec {
            layout: super::Layout {
                split: 1,
                ..specs[1].layout
            },
            ..specs[1]
        };
        assert_ne!(
            shipped,
            name(super::SOURCE, instance, &[specs[0], split_other])
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

    /// One instance holds a branch per shape of its model, each taken by the
    /// calls of that matrix, with the activations' type and every number
    /// written in (8B's gate and up, down and head in bf16, and an fp16
    /// instance with 3B's row length).
    #[test]
    fn an_instance_has_a_branch_per_shape() {
        use super::{Instance, Spec, kernel_body, layout_for};
        let spec = |n, k| Spec {
            n,
            k,
            layout: layout_for(n, k),
        };
        let bf16 = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
        };
        let body = kernel_body(
            bf16,
            &[spec(28672, 4096), spec(4096, 14336), spec(128256, 4096)],
        );
        assert!(body.contains("const int n = w_shape[0];"), "{body}");
        // The residual is read only when the fifth input is a residual
        // stream (rank 2 or more), never from the one-value placeholder.
        assert!(
            body.contains(
                "const ondo_bf16* r = residual_ndim > 1 ? reinterpret_cast<const \
                 ondo_bf16*>(residual) : nullptr;"
            ),
            "{body}"
        );
        assert_eq!(
            body.matches("reinterpret_cast<ondo_bf16*>(y), r);").count(),
            3,
            "{body}"
        );
        for (condition, call) in [
            (
                "if (n == 28672 && k == 4096)",
                "ondo_qmv4<64, 4, 1, 2, 4, 4096, 28672>(reinterpret_cast<const ondo_bf16*>(x), w,",
            ),
            (
                "else if (n == 4096 && k == 14336)",
                "ondo_qmv4<64, 4, 1, 4, 4, 14336, 4096>(",
            ),
            (
                "else if (n == 128256 && k == 4096)",
                "ondo_qmv4<64, 4, 1, 1, 4, 4096, 128256>(",
            ),
        ] {
            let at = body
                .find(condition)
                .unwrap_or_else(|| panic!("{condition}: {body}"));
            assert!(body[at..].contains(call), "{call}: {body}");
        }
        assert_eq!(body.matches("ondo_qmv4<").count(), 3, "{body}");
        assert!(!body.contains("ondo_qmv4_many"), "{body}");
        // Several positions (a batch's step): their own kernel, the walk
        // that reads each weight once for 8 of them, the positions counted
        // from x's leading dimensions.
        let many = super::many_kernel_body(
            bf16,
            &[spec(28672, 4096), spec(4096, 14336), spec(128256, 4096)],
        );
        assert!(many.contains("m *= x_shape[i];"), "{many}");
        assert!(
            many.contains("ondo_qmv4_many<64, 4, 2, 4, 8, 4096, 28672>("),
            "{many}"
        );
        assert_eq!(
            many.matches("reinterpret_cast<ondo_bf16*>(y), r, m);")
                .count(),
            3,
            "{many}"
        );
        assert_eq!(many.matches("ondo_qmv4<").count(), 0, "{many}");
        let f16 = Instance {
            dtype: mlx_rs::Dtype::Float16,
            group: 32,
        };
        let body = kernel_body(f16, &[spec(1000, 3072)]);
        assert!(
            body.contains(
                "ondo_qmv4<32, 4, 1, 2, 4, 3072, 1000>(reinterpret_cast<const ondo_f16*>(x)"
            ),
            "{body}"
        );
    }

    /// The kernel adds a residual stream of one position, the product's
    /// width and the activations' dtype; anything else keeps MLX's add.
    #[test]
    fn only_a_residual_of_the_products_shape_is_added_in_the_kernel() {
        use mlx_rs::Dtype;
        let zeros = |shape: &[i32], dtype| mlx_rs::ops::zeros_dtype(shape, dtype).unwrap();
        let x = zeros(&[1, 1, 256], Dtype::Bfloat16);
        let takes = |r: &mlx_rs::Array| super::takes_residual(r, &x, 512);
        assert!(takes(&zeros(&[1, 1, 512], Dtype::Bfloat16)));
        assert!(takes(&zeros(&[1, 512], Dtype::Bfloat16)));
        // The placeholder's rank, another width, more positions, another dtype.
        assert!(!takes(&zeros(&[512], Dtype::Bfloat16)));
        assert!(!takes(&zeros(&[1, 1, 256], Dtype::Bfloat16)));
        assert!(!takes(&zeros(&[1, 2, 512], Dtype::Bfloat16)));
        assert!(!takes(&zeros(&[1, 1, 512], Dtype::Float32)));
        // A batch's step: a residual of the product's positions, and no other.
        let rows = zeros(&[3, 1, 256], Dtype::Bfloat16);
        assert!(super::takes_residual(
            &zeros(&[3, 1, 512], Dtype::Bfloat16),
            &rows,
            512
        ));
        assert!(!super::takes_residual(
            &zeros(&[1, 1, 512], Dtype::Bfloat16),
            &rows,
            512
        ));
        assert!(!super::takes_residual(
            &zeros(&[4, 1, 512], Dtype::Bfloat16),
            &rows,
            512
        ));
    }

    /// What MLX gets as the header is the kernel without its comments,
    /// blank lines and indentation, and nothing of the code lost; the
    /// several-positions kernel's header adds its own source, and the
    /// one-position kernel's does not carry it.
    #[test]
    fn the_header_is_the_source_without_comments() {
        let many = super::compact_many_source();
        assert!(many.starts_with(super::compact_source()));
        assert!(!super::compact_source().contains("ondo_qmv4_many"));
        for line in super::MANY_SOURCE.lines().map(str::trim) {
            if !line.is_empty() && !line.starts_with("//") {
                assert!(many.contains(line), "{line}");
            }
        }
        let compact = super::compact_source();
        assert!(
            compact.len() * 3 < super::SOURCE.len() * 2,
            "{}",
            compact.len()
        );
        assert!(!compact.contains("//"));
        for line in super::SOURCE.lines().map(str::trim) {
            if !line.is_empty() && !line.starts_with("//") {
                assert!(compact.contains(line), "{line}");
            }
        }
    }
}
