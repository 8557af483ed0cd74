//! A decode step's 4-bit matrix-vector products on MLX's CUDA backend,
//! through Ondo's own kernel (`qmv4.cuh`), which Ondo compiles with NVRTC and
//! MLX runs as a precompiled kernel. On wherever MLX runs on a CUDA GPU;
//! `ONDO_CUDA_MATVEC=0` turns it off.
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
//! least `MIN_WEIGHTS` (a custom kernel costs MLX's host more per call than
//! its own, which only the large matrices repay). Everything else, prefill
//! included, and every Mac (Metal has its own kernels) runs MLX's
//! `quantized_matmul`.
//!
//! How it is built: `prepare`, as a model loads, writes one `extern "C"`
//! kernel per matrix shape of the model's decode step (dtype, group size,
//! rows, row length and launch all compiled in), compiles them with NVRTC
//! (MLX's CUDA build links it, so it is in the process) for the GPU's own
//! architecture, and runs each once. MLX then takes the binary through
//! `precompiled_cuda_kernel` (mlx-c functions Ondo adds, third_party/
//! mlx-sys/PATCHES.md): it loads it at the first call and keeps it. MLX's
//! own way in for custom kernels (`cuda_kernel`) compiled the source behind
//! MLX's device header, 2-3 s per instance in every process (it keeps custom
//! kernels in memory only). Either way MLX copies the source or binary into
//! every call's primitive and hashes it to find the loaded module, so each
//! kernel is its own NVRTC program and binary (about 30 KB). For measurements,
//! `ONDO_CUDA_MATVEC_MIN`, `ONDO_CUDA_MATVEC_LAUNCH` and
//! `ONDO_CUDA_MATVEC_SPLIT` override the threshold and the launch.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::QuantMode;
use super::quantized::QuantParams;

/// The kernel's source, shared with `scripts/gpu-qmv-lab.py`.
const SOURCE: &str = include_str!("qmv4.cuh");
/// MLX keeps loaded kernels by name for the life of the process, so the name
/// carries the source's hash: a changed kernel must never run under an old
/// one's name.
const SOURCE_HASH: u64 = fnv1a(SOURCE.as_bytes());
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

/// The layout for an `n` x `k` matrix, chosen from the GPU's own time of
/// every layout on the 8B and 3B shapes (`scripts/gpu-qmv-lab.py --sweep`
/// on the H200, docs/BENCHMARKS.md), where it is within 2% of the best on
/// every shape: 4 rows per warp; 2 chunks where a row is whole rounds of
/// 2048 weights, else 1 (3B's 3072); a row set split over as many warps as
/// it has rounds, up to 4, unless the matrix has rows enough to fill the GPU
/// without (the heads of 128256 rows). 8B's matrix-vector products per step
/// take 2.25 ms of GPU time this way against 2.56 ms with the earlier fixed
/// 8 rows of one chunk; 3B's 1.30 against 1.76. `ONDO_CUDA_MATVEC_LAUNCH=
/// ROWSxCHUNKS` (as `8x1`) and `ONDO_CUDA_MATVEC_SPLIT` (1, 2 or 4) fix them
/// for measurements.
fn layout_for(n: i32, k: i32) -> Layout {
    /// `ONDO_CUDA_MATVEC_LAUNCH` as (rows, chunks), `ONDO_CUDA_MATVEC_SPLIT`.
    type Fixed = (Option<(i32, i32)>, Option<i32>);
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    let (fixed_launch, fixed_split) = *FIXED.get_or_init(|| {
        let launch = std::env::var("ONDO_CUDA_MATVEC_LAUNCH")
            .ok()
            .and_then(|v| {
                let (rows, chunks) = v.split_once('x')?;
                Some((rows.trim().parse().ok()?, chunks.trim().parse().ok()?))
            })
            .filter(|&(rows, chunks)| matches!(rows, 1 | 2 | 4 | 8) && matches!(chunks, 1 | 2 | 4));
        let split = std::env::var("ONDO_CUDA_MATVEC_SPLIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| matches!(v, 1 | 2 | 4));
        (launch, split)
    });
    let (rows, chunks) = fixed_launch.unwrap_or((4, if k % 2048 == 0 { 2 } else { 1 }));
    let sets = (n + rows - 1) / rows;
    let rounds = (k / (32 * 32 * chunks)).max(1);
    let mut split = 1;
    while split < 4 && split * 2 <= rounds && sets * split < FULL_GPU_WARPS {
        split *= 2;
    }
    Layout {
        rows,
        chunks,
        split: fixed_split.unwrap_or(split),
    }
}

/// Row sets past which a matrix fills the H200 without a split: 8B's and
/// 3B's heads (32064 sets of 4 rows) ran 0-10% slower split, the 28672-row
/// gate and up (7168 sets) 3% faster.
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

/// A compiled kernel as mlx-c holds it: its name (the `extern "C"`
/// function's) and its binary.
struct Kernel {
    handle: mlx_sys::mlx_fast_cuda_precompiled,
}

// SAFETY: the handle holds two immutable strings, which MLX only reads when
// a call copies them into a primitive.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    fn new(name: &str, image: &[u8]) -> Option<Kernel> {
        let name = CString::new(name).ok()?;
        // SAFETY: mlx-c copies the name and the image into its own strings.
        let handle = unsafe {
            mlx_sys::mlx_fast_cuda_precompiled_new(
                name.as_ptr(),
                image.as_ptr().cast(),
                image.len(),
            )
        };
        (!handle.ctx.is_null()).then_some(Kernel { handle })
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: the handle was made by `new` and is freed once; primitives
        // built from it hold their own copies of its strings.
        unsafe { mlx_sys::mlx_fast_cuda_precompiled_free(self.handle) };
    }
}

/// The smallest matrix the kernel takes, in weights (out x in). On the H200,
/// 8B decode was 1.25x as fast with the kernel for the MLP's gate/up and down
/// and the head only, 1.20x with it for every matrix, and 3B slower with it
/// for every matrix: the attention's projections save less GPU time than a
/// custom kernel costs the host. The same held for the kernel as it is now
/// (8 rows per warp, split rows): 8B 241.4 tok/s with this threshold, 220.4
/// with the kernel for every matrix.
const MIN_WEIGHTS: i64 = 1 << 25;

/// Whether decode steps use Ondo's kernel in this process: MLX runs on a
/// CUDA GPU, NVRTC and the GPU's architecture are at hand, and
/// `ONDO_CUDA_MATVEC=0` did not turn it off.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var("ONDO_CUDA_MATVEC").as_deref() != Ok("0")
            && cuda_is_default()
            && nvrtc::architecture().is_some()
    })
}

/// True when MLX's backend is CUDA and its default device the GPU.
fn cuda_is_default() -> bool {
    let mut cuda = false;
    // SAFETY: the probe writes one bool through a valid pointer.
    let status = unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
    status == 0 && cuda && super::default_device_is_gpu()
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

/// A kernel's name: the source's hash, then everything compiled into it.
fn kernel_name(source_hash: u64, instance: Instance, spec: Spec) -> String {
    let Instance { dtype, group } = instance;
    let Spec { n, k, layout } = spec;
    let Layout {
        rows,
        chunks,
        split,
    } = layout;
    format!(
        "ondo_qmv4_{source_hash:016x}_{}_g{group}_{n}x{k}_r{rows}c{chunks}s{split}w{WARPS}",
        dtype_tag(dtype)
    )
}

/// The source NVRTC compiles: qmv4.cuh and one `extern "C"` kernel per
/// shape, every number written in.
fn kernel_source(kernels: &[(Instance, Spec)]) -> String {
    let mut source = String::from(SOURCE);
    for &(instance, spec) in kernels {
        let Spec { n, k, layout } = spec;
        let Layout {
            rows,
            chunks,
            split,
        } = layout;
        let t = cuda_type(instance.dtype);
        source.push_str(&format!(
            "\nextern \"C\" __global__ void __launch_bounds__({threads}) {name}(\n    const {t}* \
             x, const ondo_u32* w, const {t}* scales, const {t}* biases, {t}* y) {{\n  \
             ondo_qmv4<{group}, {rows}, {chunks}, {split}, {WARPS}, {k}, {n}>(x, w, scales, \
             biases, y);\n}}\n",
            threads = 32 * WARPS,
            name = kernel_name(SOURCE_HASH, instance, spec),
            group = instance.group,
        ));
    }
    source
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

/// The kernels compiled so far in this process, by what they compute.
type Compiled = Mutex<HashMap<(Instance, Spec), Arc<Kernel>>>;

fn kernels() -> &'static Compiled {
    static KERNELS: OnceLock<Compiled> = OnceLock::new();
    KERNELS.get_or_init(Default::default)
}

fn kernel_for(instance: Instance, spec: Spec) -> Option<Arc<Kernel>> {
    kernels().lock().ok()?.get(&(instance, spec)).cloned()
}

/// The kernel and shape that would compute `x @ W.T` with for one position,
/// for this matrix with its affine biases, whether or not it was compiled.
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
        && n > 0
        && k > 0
        && k % 32 == 0
        && weight.dtype() == Dtype::Uint32
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && biases.dtype() == dtype
        && i64::from(n) * i64::from(k) >= min_weights();
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
/// one the kernel computes: one position, and a kernel compiled for the
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

/// Compiles, as a model loads, the kernel for every matrix of its decode
/// step that takes it (`matrices`: weight, scales, biases and quantization
/// of each) and was not compiled yet in this process: NVRTC, about a tenth
/// of a second a shape. Each kernel then runs once on a zero vector,
/// evaluated, which has MLX load it. A kernel that does not build or run
/// costs the model nothing but the speed: its matmuls stay on MLX's kernel,
/// and one line on stderr says why.
pub fn prepare<'a>(
    matrices: impl IntoIterator<Item = (&'a Array, &'a Array, &'a Array, QuantParams)>,
) {
    if !enabled() {
        return;
    }
    let Some(arch) = nvrtc::architecture() else {
        return;
    };
    let mut wanted: Vec<((Instance, Spec), Matrix<'a>)> = Vec::new();
    for (weight, scales, biases, params) in matrices {
        if let Some(key) = candidate(weight, scales, biases, params)
            && kernel_for(key.0, key.1).is_none()
            && !wanted.iter().any(|(k, _)| *k == key)
        {
            wanted.push((
                key,
                Matrix {
                    weight,
                    scales,
                    biases,
                },
            ));
        }
    }
    for ((instance, spec), matrix) in wanted {
        let name = kernel_name(SOURCE_HASH, instance, spec);
        let built = nvrtc::compile(&kernel_source(&[(instance, spec)]), arch)
            .and_then(|image| {
                Kernel::new(&name, &image).ok_or_else(|| "mlx-c refused it".to_string())
            })
            .and_then(|kernel| {
                matrix
                    .run(&kernel, spec)
                    .map(|()| kernel)
                    .map_err(|error| error.to_string())
            });
        match built {
            Ok(kernel) => {
                if let Ok(mut compiled) = kernels().lock() {
                    compiled.insert((instance, spec), Arc::new(kernel));
                }
            }
            Err(why) => eprintln!(
                "ondo: Ondo's CUDA matrix-vector kernel did not build for {} x {} ({why}); \
                 those matmuls use MLX's own kernel",
                spec.n, spec.k
            ),
        }
    }
}

/// A matrix of a shape `prepare` compiles a kernel for.
struct Matrix<'a> {
    weight: &'a Array,
    scales: &'a Array,
    biases: &'a Array,
}

impl Matrix<'_> {
    /// One call on a zero vector, evaluated.
    fn run(&self, kernel: &Kernel, spec: Spec) -> Result<(), Exception> {
        let x = mlx_rs::ops::zeros_dtype(&[1, 1, spec.k], self.scales.dtype())?;
        call(kernel, spec, &x, self.weight, self.scales, self.biases)?.eval()
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
    let (instance, spec) = candidate(weight, scales, biases, params)
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel does not take this matrix"))?;
    let kernel = kernel_for(instance, spec)
        .ok_or_else(|| Exception::custom("Ondo's CUDA kernel was not built for this matrix"))?;
    call(&kernel, spec, x, weight, scales, biases)
}

/// One call of a compiled kernel, as one MLX primitive.
fn call(
    kernel: &Kernel,
    spec: Spec,
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: &Array,
) -> Result<Array, Exception> {
    let n = spec.n;
    let Launch { grid, block } = launch_for(n, spec.layout);
    let mut out_shape = x.shape().to_vec();
    if let Some(last) = out_shape.last_mut() {
        *last = n;
    }
    let inputs = [
        x.as_ptr(),
        weight.as_ptr(),
        scales.as_ptr(),
        biases.as_ptr(),
    ];
    let stream = Stream::thread_local_or_default();
    // SAFETY: the kernel's handle and the inputs are borrowed for the call
    // (MLX copies what it keeps); the output is handed to an `Array`, which
    // frees it.
    unsafe {
        let mut result = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_fast_cuda_precompiled_apply(
            &mut result,
            kernel.handle,
            inputs.as_ptr(),
            inputs.len(),
            out_shape.as_ptr(),
            out_shape.len(),
            x.dtype() as mlx_sys::mlx_dtype,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(result);
            return Err(Exception::custom(format!(
                "MLX could not run Ondo's 4-bit matrix-vector kernel for {:?} by {:?}",
                x.shape(),
                weight.shape()
            )));
        }
        Ok(Array::from_ptr(result))
    }
}

/// NVRTC and the GPU's architecture, from the libraries MLX's CUDA build
/// links (libnvrtc, libcuda): wherever MLX runs on CUDA they are in the
/// process, and elsewhere the kernel is off.
mod nvrtc {
    use std::ffi::{CStr, c_char, c_int, c_void};
    use std::sync::OnceLock;

    /// Looks a function up among the libraries loaded in the process.
    fn symbol(name: &CStr) -> Option<*mut c_void> {
        // SAFETY: dlsym with RTLD_DEFAULT reads the loaded libraries' tables.
        let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!found.is_null()).then_some(found)
    }

    /// The default GPU's compute capability as NVRTC names it (`sm_90`).
    pub(super) fn architecture() -> Option<&'static str> {
        static ARCH: OnceLock<Option<String>> = OnceLock::new();
        ARCH.get_or_init(|| {
            type Init = unsafe extern "C" fn(u32) -> c_int;
            type Get = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
            type Attribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
            // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
            const MAJOR: c_int = 75;
            const MINOR: c_int = 76;
            // SAFETY: the three driver functions have these C signatures;
            // cuInit is idempotent (MLX has already called it).
            unsafe {
                let init: Init = std::mem::transmute(symbol(c"cuInit")?);
                let get: Get = std::mem::transmute(symbol(c"cuDeviceGet")?);
                let attribute: Attribute = std::mem::transmute(symbol(c"cuDeviceGetAttribute")?);
                symbol(c"nvrtcCompileProgram")?;
                let (mut device, mut major, mut minor) = (0, 0, 0);
                (init(0) == 0
                    && get(&mut device, 0) == 0
                    && attribute(&mut major, MAJOR, device) == 0
                    && attribute(&mut minor, MINOR, device) == 0)
                    .then(|| format!("sm_{major}{minor}"))
            }
        })
        .as_deref()
    }

    /// Compiles `source` to a CUBIN for `arch`; the error is NVRTC's log.
    pub(super) fn compile(source: &str, arch: &str) -> Result<Vec<u8>, String> {
        type Program = *mut c_void;
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
        type Read = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
        let lookup =
            |name: &CStr| symbol(name).ok_or_else(|| format!("no {name:?} in the process"));
        let source = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
        let option = std::ffi::CString::new(format!("--gpu-architecture={arch}"))
            .map_err(|e| e.to_string())?;
        // SAFETY: the NVRTC functions have these C signatures; the program
        // is destroyed on every path after it was made; the buffers are
        // sized by NVRTC's own answers.
        unsafe {
            let create: Create = std::mem::transmute(lookup(c"nvrtcCreateProgram")?);
            let compile: Compile = std::mem::transmute(lookup(c"nvrtcCompileProgram")?);
            let log_size: Size = std::mem::transmute(lookup(c"nvrtcGetProgramLogSize")?);
            let log: Read = std::mem::transmute(lookup(c"nvrtcGetProgramLog")?);
            let cubin_size: Size = std::mem::transmute(lookup(c"nvrtcGetCUBINSize")?);
            let cubin: Read = std::mem::transmute(lookup(c"nvrtcGetCUBIN")?);
            let destroy: Destroy = std::mem::transmute(lookup(c"nvrtcDestroyProgram")?);
            let mut program: Program = std::ptr::null_mut();
            let status = create(
                &mut program,
                source.as_ptr(),
                c"ondo_qmv4.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if status != 0 {
                return Err(format!("nvrtcCreateProgram returned {status}"));
            }
            let options = [option.as_ptr()];
            let result = if compile(program, 1, options.as_ptr()) == 0 {
                let mut size = 0;
                let mut image = Vec::new();
                if cubin_size(program, &mut size) == 0 {
                    image.resize(size, 0u8);
                }
                (!image.is_empty() && cubin(program, image.as_mut_ptr().cast()) == 0)
                    .then_some(image)
                    .ok_or_else(|| "NVRTC gave no binary".to_string())
            } else {
                let mut size = 0;
                log_size(program, &mut size);
                let mut text = vec![0u8; size.max(1)];
                log(program, text.as_mut_ptr().cast());
                Err(String::from_utf8_lossy(&text)
                    .trim_end_matches('\0')
                    .trim()
                    .to_string())
            };
            destroy(&mut program);
            result
        }
    }
}

#[cfg(test)]
mod tests {
    /// Without CUDA (every CI run, every Mac) asking for the kernel changes
    /// nothing: it is never built and decode steps stay on MLX's matmul
    /// (`tests/parity.rs` runs a whole generation so asked, against mlx-lm).
    #[test]
    fn without_cuda_the_kernel_is_not_available() {
        assert!(!super::enabled());
        assert!(super::nvrtc::architecture().is_none());
    }

    /// The layouts the lab chose for the 8B and 3B shapes: 4 rows per warp,
    /// 2 chunks where rows are whole 2048-weight rounds, a row set split
    /// over as many warps as it has rounds (at most 4) unless the matrix
    /// fills the GPU without.
    #[test]
    fn each_shape_gets_the_layout_measured_best() {
        use super::{Layout, layout_for};
        let layout = |rows, chunks, split| Layout {
            rows,
            chunks,
            split,
        };
        // Llama 3.1 8B: q, k and v joined; o; gate and up joined; down; head.
        assert_eq!(layout_for(6144, 4096), layout(4, 2, 2));
        assert_eq!(layout_for(4096, 4096), layout(4, 2, 2));
        assert_eq!(layout_for(28672, 4096), layout(4, 2, 2));
        assert_eq!(layout_for(4096, 14336), layout(4, 2, 4));
        assert_eq!(layout_for(128256, 4096), layout(4, 2, 1));
        // 3B: rows of 3072 weights are three rounds of one chunk.
        assert_eq!(layout_for(5120, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(3072, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(16384, 3072), layout(4, 1, 2));
        assert_eq!(layout_for(3072, 8192), layout(4, 2, 4));
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
    /// runs under an old one's name in MLX's table of loaded kernels; and
    /// with every number compiled into it.
    #[test]
    fn the_kernel_name_carries_the_source_and_the_shape() {
        use super::{Instance, Spec, kernel_name};
        let instance = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
        };
        let spec = Spec {
            n: 4096,
            k: 14336,
            layout: super::layout_for(4096, 14336),
        };
        let name = |source: &str, instance, spec| {
            kernel_name(super::fnv1a(source.as_bytes()), instance, spec)
        };
        let shipped = name(super::SOURCE, instance, spec);
        assert_eq!(shipped, name(super::SOURCE, instance, spec));
        assert!(
            shipped.ends_with("_bf16_g64_4096x14336_r4c2s4w4"),
            "{shipped}"
        );
        let edited = format!("{}\n// edited", super::SOURCE);
        assert_ne!(shipped, name(&edited, instance, spec));
        for other in [
            Spec { n: 4095, ..spec },
            Spec { k: 4096, ..spec },
            Spec {
                layout: super::Layout {
                    split: 2,
                    ..spec.layout
                },
                ..spec
            },
        ] {
            assert_ne!(shipped, name(super::SOURCE, instance, other));
        }
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
            assert_ne!(shipped, name(super::SOURCE, other, spec));
        }
    }

    /// The source NVRTC compiles has one `extern "C"` kernel per shape,
    /// named as MLX is asked for it, with the activations' type and every
    /// number written in (8B's gate and up, down and head in bf16, and one
    /// fp16 matrix), and no `#include`: it needs no header.
    #[test]
    fn the_source_has_a_kernel_per_shape() {
        use super::{Instance, Spec, kernel_name, kernel_source, layout_for};
        let bf16 = Instance {
            dtype: mlx_rs::Dtype::Bfloat16,
            group: 64,
        };
        let f16 = Instance {
            dtype: mlx_rs::Dtype::Float16,
            group: 32,
        };
        let spec = |n, k| Spec {
            n,
            k,
            layout: layout_for(n, k),
        };
        let kernels = [
            (bf16, spec(28672, 4096)),
            (bf16, spec(4096, 14336)),
            (bf16, spec(128256, 4096)),
            (f16, spec(1000, 3072)),
        ];
        let source = kernel_source(&kernels);
        assert!(!source.contains("#include"));
        for ((instance, spec), (t, call)) in kernels.iter().zip([
            ("ondo_bf16", "ondo_qmv4<64, 4, 2, 2, 4, 4096, 28672>("),
            ("ondo_bf16", "ondo_qmv4<64, 4, 2, 4, 4, 14336, 4096>("),
            ("ondo_bf16", "ondo_qmv4<64, 4, 2, 1, 4, 4096, 128256>("),
            ("ondo_f16", "ondo_qmv4<32, 4, 1, 2, 4, 3072, 1000>("),
        ]) {
            let name = kernel_name(super::SOURCE_HASH, *instance, *spec);
            let head = format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {name}(\n    const {t}* x,"
            );
            let at = source
                .find(&head)
                .unwrap_or_else(|| panic!("{head}: {source}"));
            let end = at + source[at..].find("\n}\n").expect("the kernel ends");
            assert!(
                source[at..end].contains(call),
                "{call}: {}",
                &source[at..end]
            );
        }
        assert_eq!(source.matches("extern \"C\"").count(), 4);
    }
}
