"""The GPU's own time for Ondo's 4-bit matrix-vector kernel, without MLX.

`scripts/gpu-matvec.py` times the kernel through MLX, where a small matrix
costs the host more per call than the GPU (a custom kernel costs MLX about
11 microseconds of host time a call), so its small shapes measure the host.
This script drives the GPU through the CUDA driver API (ctypes), compiles
src/engine/backend/cuda/qmv4.cuh with NVRTC (the source needs no header; one
`extern "C"` kernel per shape, its numbers compiled in as the engine's
branches have them, with the layout backend/cuda/mod.rs picks), records each
measurement as a CUDA graph and times replays of it with CUDA events:
nothing but the GPU is in the numbers.

What it prints:
- a read of 1 GiB (a sum) and an empty kernel, the card's two floors;
- a correctness check of every kernel it times, against a plain fp32
  kernel written here (one warp per row), as the largest error over the
  largest output; bf16 output rounding alone is about 0.002;
- per matrix shape of the model, the GPU time of one call and its bandwidth,
  as the mean over one call per layer, each on that layer's own weights (the
  whole model is on the card, so every call reads device memory, as in a
  decode step), for the engine's layout (`layout_for` in backend/cuda/mod.rs) and,
  with --sweep, every launch shape;
- one decode step's matrix-vector products, every layer's in order and the
  head, as one graph: the GPU time the kernel takes per token, against what
  the card's read rate allows.

    python3 scripts/gpu-qmv-lab.py                # 8B shapes
    python3 scripts/gpu-qmv-lab.py --model 3b --sweep
    python3 scripts/gpu-qmv-lab.py --source variant.cuh   # a changed kernel
Needs an NVIDIA GPU, its driver, and NVRTC (the `nvidia-cuda-nvrtc` wheel
MLX's CUDA build depends on).
"""

import array
import ctypes
import pathlib
import statistics
import sys
import time

import qmv4_build
from qmv4_build import compile_cubin, kernel_source, launch_for, layout_for
from qmv4_build import kernel_name as build_name

# (name, rows, row length) of one layer's matrices, then the head; layers.
MODELS = {
    "8b": ([("q, k, v", 6144, 4096), ("o", 4096, 4096), ("gate, up", 28672, 4096), ("down", 4096, 14336)],
           ("head", 128256, 4096), 32),
    "3b": ([("q, k, v", 5120, 3072), ("o", 3072, 3072), ("gate, up", 16384, 3072), ("down", 3072, 8192)],
           ("head", 128256, 3072), 28),
    "1b": ([("q, k, v", 3072, 2048), ("o", 2048, 2048), ("gate, up", 16384, 2048), ("down", 2048, 8192)],
           ("head", 128256, 2048), 16),
}
GROUP = 64


# ---------------------------------------------------------------- CUDA ----

cuda = None  # the driver, loaded by Gpu(): --compile-only runs without one


def ck(result, what):
    if result != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else result}")


def elapsed_ms(start, end):
    ms = ctypes.c_float()
    fn = getattr(cuda, "cuEventElapsedTime_v2", None) or cuda.cuEventElapsedTime
    ck(fn(ctypes.byref(ms), start, end), "cuEventElapsedTime")
    return ms.value


class Gpu:
    def __init__(self):
        global cuda
        cuda = ctypes.CDLL("libcuda.so.1")
        ck(cuda.cuInit(0), "cuInit")
        self.dev = ctypes.c_int()
        ck(cuda.cuDeviceGet(ctypes.byref(self.dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
        ck(cuda.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.stream = ctypes.c_void_p()
        ck(cuda.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, self.dev)
        self.name = name.value.decode()
        self.cc = (self.attribute(75), self.attribute(76))
        self.sms = self.attribute(16)
        self.l2 = self.attribute(38)
        self.events = [self.event() for _ in range(2)]

    def attribute(self, which):
        v = ctypes.c_int()
        ck(cuda.cuDeviceGetAttribute(ctypes.byref(v), which, self.dev), "cuDeviceGetAttribute")
        return v.value

    def event(self):
        e = ctypes.c_void_p()
        ck(cuda.cuEventCreate(ctypes.byref(e), 0), "cuEventCreate")
        return e

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        ck(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), f"cuMemAlloc {nbytes >> 20} MiB")
        return p.value

    def to_host(self, ptr, nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        ck(cuda.cuStreamSynchronize(self.stream), "sync")
        ck(cuda.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes)), "cuMemcpyDtoH")
        return buf.raw

    def launch(self, fn, grid, block, args, shared=0):
        """Arguments: Ptr and Count pass 64 bits, float 32-bit float, int 32-bit int."""
        holders = []
        for a in args:
            if isinstance(a, (Ptr, Count)):
                holders.append(ctypes.c_uint64(a.value))
            elif isinstance(a, float):
                holders.append(ctypes.c_float(a))
            else:
                holders.append(ctypes.c_int(a))
        params = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        ck(cuda.cuLaunchKernel(fn, *grid, *block, shared, self.stream, params, None), "cuLaunchKernel")

    def graph(self, launches):
        """Records the launches (fn, grid, block, args) as one graph."""
        ck(cuda.cuStreamBeginCapture_v2(self.stream, 2), "cuStreamBeginCapture")
        for fn, grid, block, args in launches:
            self.launch(fn, grid, block, args)
        g = ctypes.c_void_p()
        ck(cuda.cuStreamEndCapture(self.stream, ctypes.byref(g)), "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        ck(cuda.cuGraphInstantiateWithFlags(ctypes.byref(exe), g, ctypes.c_ulonglong(0)), "cuGraphInstantiate")
        return g, exe

    def time_graph(self, launches, reps=25, warmup=3):
        """Median and spread (min, max) in ms of replays of the launches' graph."""
        g, exe = self.graph(launches)
        for _ in range(warmup):
            ck(cuda.cuGraphLaunch(exe, self.stream), "cuGraphLaunch")
        times = []
        start, end = self.events
        for _ in range(reps):
            ck(cuda.cuEventRecord(start, self.stream), "cuEventRecord")
            ck(cuda.cuGraphLaunch(exe, self.stream), "cuGraphLaunch")
            ck(cuda.cuEventRecord(end, self.stream), "cuEventRecord")
            ck(cuda.cuEventSynchronize(end), "cuEventSynchronize")
            times.append(elapsed_ms(start, end))
        cuda.cuGraphExecDestroy(exe)
        cuda.cuGraphDestroy(g)
        return statistics.median(times), min(times), max(times)


class Ptr:
    """A device pointer argument."""

    def __init__(self, value):
        self.value = value


class Count(Ptr):
    """A 64-bit count argument."""


def compile_module(gpu, code):
    cubin, seconds = compile_cubin(code, f"sm_{gpu.cc[0]}{gpu.cc[1]}")
    module = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    return module, seconds, len(cubin)


def function(module, name):
    fn = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction {name}")
    return fn


# ------------------------------------------------------------- kernels ----

HELPERS = r"""
__device__ __forceinline__ ondo_u32 lab_hash(unsigned long long i, ondo_u32 seed) {
  ondo_u32 h = static_cast<ondo_u32>(i) * 0x9E3779B1u ^ static_cast<ondo_u32>(i >> 32) * 0x85EBCA77u ^ seed;
  h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
  return h;
}
extern "C" __global__ void lab_fill_words(ondo_u32* p, unsigned long long count, ondo_u32 seed) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < count; i += 256ull * gridDim.x)
    p[i] = lab_hash(i, seed);
}
extern "C" __global__ void lab_fill_bf16(ondo_bf16* p, unsigned long long count, ondo_u32 seed, float lo, float hi) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < count; i += 256ull * gridDim.x)
    ondo_store(&p[i], lo + (hi - lo) * (lab_hash(i, seed) >> 8) * (1.0f / 16777216.0f));
}
// One warp per row, in fp32 from the same bf16 inputs: the reference.
extern "C" __global__ void lab_reference(const ondo_bf16* x, const ondo_u32* w, const ondo_bf16* scales,
    const ondo_bf16* biases, float* y, int n, int k, int group) {
  const int row = blockIdx.x * 4 + threadIdx.y;
  if (row >= n) return;
  float acc = 0.0f;
  for (int word = threadIdx.x; word < k / 8; word += 32) {
    const ondo_u32 bits = w[static_cast<unsigned long long>(row) * (k / 8) + word];
    const int g = word * 8 / group;
    const float s = ondo_float(scales[static_cast<unsigned long long>(row) * (k / group) + g]);
    const float b = ondo_float(biases[static_cast<unsigned long long>(row) * (k / group) + g]);
    for (int i = 0; i < 8; ++i)
      acc += ondo_float(x[word * 8 + i]) * (s * static_cast<float>((bits >> (4 * i)) & 15u) + b);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x == 0) y[row] = acc;
}
// A sum of 16-byte words: the card's read rate.
extern "C" __global__ void lab_read(const uint4* p, unsigned long long count, ondo_u32* out) {
  ondo_u32 acc = 0;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < count; i += 256ull * gridDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
extern "C" __global__ void lab_empty() {}
"""


def kernel_name(n, k, launch):
    rows, chunks, split, warps = launch
    return build_name("bf16", GROUP, n, k, (rows, chunks, split), warps)


def lab_source(shapes, launches_for):
    return kernel_source(
        [("bf16", GROUP, n, k, (rows, chunks, split), warps)
         for n, k in shapes for rows, chunks, split, warps in launches_for(n, k)],
        extra=HELPERS,
    )


def launch_dims(n, launch):
    """The engine's launch (backend/cuda/mod.rs's `launch_for`), in blocks."""
    rows, chunks, split, warps = launch
    grid, block = launch_for(n, (rows, chunks, split), warps)
    return (1, 1, grid[2] // block[2]), block


def all_launches(n, k):
    out = []
    for rows in (4, 8):
        for chunks in (1, 2):
            rounds = max(1, k // (1024 * chunks))
            for warps in (4, 8):
                for split in (1, 2, 4, 8):
                    if split <= warps and split <= rounds:
                        out.append((rows, chunks, split, warps))
    return out


class Matrix:
    def __init__(self, gpu, fill, n, k, seed):
        self.n, self.k = n, k
        self.w = gpu.alloc(n * k // 2)
        self.s = gpu.alloc(n * k // GROUP * 2)
        self.b = gpu.alloc(n * k // GROUP * 2)
        words, bf16 = fill
        big = (gpu.sms * 8, 1, 1)
        gpu.launch(words, big, (256, 1, 1), [Ptr(self.w), Count(n * k // 8), seed])
        gpu.launch(bf16, big, (256, 1, 1), [Ptr(self.s), Count(n * k // GROUP), seed + 1, -0.02, 0.02])
        gpu.launch(bf16, big, (256, 1, 1), [Ptr(self.b), Count(n * k // GROUP), seed + 2, -0.01, 0.01])

    @property
    def nbytes(self):
        return self.n * self.k // 2 + 2 * (self.n * self.k // GROUP * 2)


def main():
    args = sys.argv[1:]
    model = args[args.index("--model") + 1] if "--model" in args else "8b"
    sweep = "--sweep" in args
    if "--source" in args:  # a variant of qmv4.cuh in place of the shipped one
        qmv4_build.SOURCE = pathlib.Path(args[args.index("--source") + 1]).read_text()
    layer_shapes, head, layers = MODELS[model]
    if "--compile-only" in args:  # NVRTC alone, for sm_90: no GPU needed
        shapes = sorted({(n, k) for _, n, k in layer_shapes} | {(head[1], head[2])})
        code = lab_source(shapes, lambda n, k: all_launches(n, k) if sweep else [(*layout_for(n, k), 4)])
        cubin, seconds = compile_cubin(code, "sm_90")
        print(f"compiled {code.count('extern')} kernels for sm_90 in {seconds:.2f} s, {len(cubin) >> 10} KiB")
        return
    gpu = Gpu()
    print(f"{gpu.name}, sm_{gpu.cc[0]}{gpu.cc[1]}, {gpu.sms} SMs, L2 {gpu.l2 >> 20} MiB; model {model}: "
          f"{layers} layers", flush=True)
    shapes = sorted({(n, k) for _, n, k in layer_shapes} | {(head[1], head[2])})

    def engine(n, k):
        return (*layout_for(n, k), 4)

    def launches_for(n, k):
        found = [engine(n, k)]
        return found + [l for l in all_launches(n, k) if l not in found] if sweep else found

    code = lab_source(shapes, launches_for)
    module, seconds, size = compile_module(gpu, code)
    count = sum(len(launches_for(n, k)) for n, k in shapes)
    print(f"NVRTC: {count} kernels in {seconds:.2f} s ({size >> 10} KiB); no header", flush=True)
    # Floors: a read of 1 GiB, and an empty kernel in a graph.
    read = function(module, "lab_read")
    nbytes = 1 << 30
    buf = gpu.alloc(nbytes)
    out = gpu.alloc(64)
    ms, lo, hi = gpu.time_graph([(read, (gpu.sms * 16, 1, 1), (256, 1, 1), [Ptr(buf), Count(nbytes // 16), Ptr(out)])])
    print(f"read of 1 GiB: {nbytes / ms / 1e6:.0f} GB/s ({lo:.3f}-{hi:.3f} ms)", flush=True)
    empty = function(module, "lab_empty")
    ms, _, _ = gpu.time_graph([(empty, (1, 1, 1), (32, 1, 1), [])] * 100)
    print(f"empty kernel in a graph: {ms * 1000 / 100:.2f} us each", flush=True)

    words = function(module, "lab_fill_words")
    bf16 = function(module, "lab_fill_bf16")
    started = time.perf_counter()
    weights = {}
    for layer in range(layers):
        for name, n, k in layer_shapes:
            weights[(name, layer)] = Matrix(gpu, (words, bf16), n, k, 1000 * layer + n)
    weights[(head[0], 0)] = Matrix(gpu, (words, bf16), head[1], head[2], 7)
    xs = {}
    for k in sorted({k for _, k in shapes}):
        xs[k] = gpu.alloc(k * 2)
        gpu.launch(bf16, (8, 1, 1), (256, 1, 1), [Ptr(xs[k]), Count(k), 99 + k, -1.0, 1.0])
    ys = {n: gpu.alloc(n * 4) for n, _ in shapes}
    ck(cuda.cuStreamSynchronize(gpu.stream), "fill")
    total = sum(m.nbytes for m in weights.values())
    print(f"weights on the card: {total / 2**30:.2f} GiB, filled in {time.perf_counter() - started:.1f} s", flush=True)

    reference = function(module, "lab_reference")
    bad = 0
    rows = []
    for name, n, k in layer_shapes + [head]:
        count_layers = layers if name != head[0] else 1
        mats = [weights[(name, layer)] for layer in range(count_layers)]
        m0 = mats[0]
        gpu.launch(reference, (-(-n // 4), 1, 1), (32, 4, 1), [Ptr(xs[k]), Ptr(m0.w), Ptr(m0.s), Ptr(m0.b), Ptr(ys[n]), n, k, GROUP])
        exact = memoryview(gpu.to_host(ys[n], n * 4)).cast("f")
        scale = max(abs(v) for v in exact)
        results = []
        for launch in launches_for(n, k):
            fn = function(module, kernel_name(n, k, launch))
            grid, block = launch_dims(n, launch)
            gpu.launch(fn, grid, block, [Ptr(xs[k]), Ptr(m0.w), Ptr(m0.s), Ptr(m0.b), Ptr(ys[n])])
            raw = memoryview(gpu.to_host(ys[n], n * 2)).cast("H")
            got = memoryview(array.array("I", (v << 16 for v in raw))).cast("B").cast("f")
            error = max(abs(a - b) for a, b in zip(got, exact)) / scale
            if error > 0.01:
                bad += 1
            calls = [(fn, grid, block, [Ptr(xs[k]), Ptr(m.w), Ptr(m.s), Ptr(m.b), Ptr(ys[n])]) for m in mats]
            reps = max(1, 32 // len(calls))
            ms, lo, hi = gpu.time_graph(calls * reps)
            us = ms * 1000 / (len(calls) * reps)
            results.append((us, launch, error, lo * 1000 / (len(calls) * reps), hi * 1000 / (len(calls) * reps)))
        engine_us = results[0][0]
        line = [f"{name:9s} {n}x{k}: engine {'/'.join(map(str, results[0][1]))} {engine_us:6.2f} us "
                f"({m0.nbytes / engine_us / 1e3:5.0f} GB/s, {results[0][3]:.2f}-{results[0][4]:.2f}), error {results[0][2]:.4f}"]
        if sweep:
            best = sorted(results)[:4]
            line.append("best: " + ", ".join(f"{'/'.join(map(str, l))} {us:.2f} us ({m0.nbytes / us / 1e3:.0f} GB/s)"
                                              for us, l, _, _, _ in best))
            worst_error = max(r[2] for r in results)
            line.append(f"largest error of {len(results)} launches {worst_error:.4f}")
        print(" | ".join(line), flush=True)
        rows.append((name, n, k, results))

    # One decode step's matrix-vector products: layer by layer, then the head.
    def step(choose):
        calls = []
        for layer in range(layers):
            for name, n, k in layer_shapes:
                launch = choose(name, n, k)
                grid, block = launch_dims(n, launch)
                m = weights[(name, layer)]
                calls.append((function(module, kernel_name(n, k, launch)), grid, block,
                              [Ptr(xs[k]), Ptr(m.w), Ptr(m.s), Ptr(m.b), Ptr(ys[n])]))
        name, n, k = head
        launch = choose(name, n, k)
        grid, block = launch_dims(n, launch)
        m = weights[(name, 0)]
        calls.append((function(module, kernel_name(n, k, launch)), grid, block,
                      [Ptr(xs[k]), Ptr(m.w), Ptr(m.s), Ptr(m.b), Ptr(ys[n])]))
        return gpu.time_graph(calls, reps=15)

    ms, lo, hi = step(lambda name, n, k: engine(n, k))
    print(f"one step's {layers * len(layer_shapes) + 1} matrix-vector products, engine launches: {ms:.3f} ms "
          f"({lo:.3f}-{hi:.3f}), {total / ms / 1e6:.0f} GB/s", flush=True)
    if sweep:
        best = {(n, k): min(results)[1] for _, n, k, results in rows}
        ms, lo, hi = step(lambda name, n, k: best[(n, k)])
        print(f"  with each shape's best launch: {ms:.3f} ms ({lo:.3f}-{hi:.3f}), {total / ms / 1e6:.0f} GB/s; "
              + ", ".join(f"{n}x{k} {'/'.join(map(str, l))}" for (n, k), l in best.items()), flush=True)
    print(f"checked: {'all within 0.01' if bad == 0 else f'{bad} launches WRONG'}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
