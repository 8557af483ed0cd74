"""Ondo's 4-bit matrix-vector kernel through MLX, as the engine runs it
(src/engine/backend/cuda/mod.rs; scripts/qmv4_build.py mirrors its layouts):
an MLX custom kernel with src/engine/backend/cuda/qmv4.cuh, without comments, as
its header and the matrix's shape and layout written into its body; here
each shape is its own kernel, where the engine puts all of a model's shapes
in one, branching on them.

First a correctness check of Ondo's kernel against MLX's quantized_matmul in
fp32 (bf16, fp16 and fp32 activations; groups of 32, 64 and 128; shapes with
a partial last round and a row count no multiple of the rows per warp, and
the one-position products of the Llama 3.2 1B shape that every family's
synthetic folder at that shape runs, its o_proj with the residual add and
its tied head; the engine's layout and a row set split over 4 and 2 warps): its error must be at
most twice MLX's own at the same dtype, and with a residual stream its output
must be its product followed by MLX's add, bit for bit. Then the host's cost per call, MLX's
kernel against Ondo's, on a matrix small enough that the GPU is not the
bound. Then each shape is benchmarked as many distinct weight copies (about
1 GiB, more than the L2 cache) multiplied by one input vector in one `eval`,
median of 7; for the small shapes that measures MLX's host more than the GPU
(scripts/gpu-qmv-lab.py times the GPU alone).

    python scripts/gpu-matvec.py           # on the device, with MLX's CUDA wheel
    python scripts/gpu-matvec.py --check   # the correctness check alone
    python scripts/gpu-matvec.py --check --quick   # bf16, groups of 64
    python scripts/gpu-matvec.py --host    # the check and the host's cost
    python scripts/gpu-matvec.py --many    # the check, then B vectors at once: MLX's against Ondo's
"""

import hashlib
import pathlib
import sys
import time

import mlx.core as mx

from qmv4_build import CUDA_TYPE, SOURCE, WARPS, kernel_name, launch_for, layout_for

# The check's shapes (rows, row length): partial rounds, a row count no
# multiple of the rows per warp, and the products of the 1B shape (a model
# of hidden size 2048: qwen3_moe's synthetic folder at llama-3.2-1b runs its
# o_proj with the residual add and its tied head on Ondo's kernel).
CHECK_SHAPES = [
    (1024, 4096),
    (4096, 14336),
    (333, 2048),
    (6144, 3072),
    (2048, 2048),  # 1B o_proj, checked with a residual stream too
    (128256, 2048),  # 1B tied head
]
# Shapes whose group-64 error is printed, not only counted.
SHOWN_SHAPES = [(4096, 4096), (4096, 14336), (2048, 2048), (128256, 2048)]
SHAPES = [
    ("q or o, 4096x4096", 4096, 4096),
    ("k or v, 1024x4096", 1024, 4096),
    ("q, k, v joined, 6144x4096", 6144, 4096),
    ("gate and up joined, 28672x4096", 28672, 4096),
    ("down, 4096x14336", 4096, 14336),
    ("lm_head, 128256x4096", 128256, 4096),
    ("3B q, k, v joined, 5120x3072", 5120, 3072),
    ("3B o, 3072x3072", 3072, 3072),
    ("3B gate and up joined, 16384x3072", 16384, 3072),
    ("3B down, 3072x8192", 3072, 8192),
]
DTYPE_TAG = {mx.bfloat16: "bf16", mx.float16: "f16", mx.float32: "f32"}
# MLX keeps compiled kernels by name, so the name carries the source's hash.
# The several-positions kernel is its own, with qmv4_many.cuh after qmv4.cuh.
MANY_SOURCE = (pathlib.Path(__file__).resolve().parent.parent / "src/engine/backend/cuda/qmv4_many.cuh").read_text()
SOURCE_HASH = hashlib.sha256((SOURCE + MANY_SOURCE).encode()).hexdigest()[:12]


def compact(source):
    return "\n".join(l.strip() for l in source.splitlines() if l.strip() and not l.strip().startswith("//"))


HEADER = compact(SOURCE)
MANY_HEADER = HEADER + "\n" + compact(MANY_SOURCE)
_kernels = {}


def kernel_for(dtype, group, n, k, layout, many=False):
    key = (DTYPE_TAG[dtype], group, n, k, layout, many)
    if key not in _kernels:
        rows, chunks, split = layout
        t = CUDA_TYPE[key[0]]
        args = (
            f"(reinterpret_cast<const {t}*>(x), w, reinterpret_cast<const {t}*>(scales), "
            f"reinterpret_cast<const {t}*>(biases), reinterpret_cast<{t}*>(y), r"
        )
        residual = f"const {t}* r = residual_ndim > 1 ? reinterpret_cast<const {t}*>(residual) : nullptr;\n"
        if many:
            vecs = min(8, 32 // rows)
            body = (
                residual + "int m = 1;\nfor (int i = 0; i + 1 < x_ndim; ++i) { m *= x_shape[i]; }\n"
                f"ondo_qmv4_many<{group}, {rows}, {split}, {WARPS}, {vecs}, {k}, {n}>{args}, m);"
            )
        else:
            body = residual + f"ondo_qmv4<{group}, {rows}, {chunks}, {split}, {WARPS}, {k}, {n}>{args});"
        _kernels[key] = mx.fast.cuda_kernel(
            name=kernel_name(*key[:5]) + ("_many" if many else "") + "_" + SOURCE_HASH,
            input_names=["x", "w", "scales", "biases", "residual"],
            output_names=["y"],
            source=body,
            header=MANY_HEADER if many else HEADER,
            ensure_row_contiguous=True,
        )
    return _kernels[key]


def ondo_qmv4(x, w, scales, biases, group, layout=None, residual=None):
    """x @ w.T, or residual + x @ w.T in one kernel; as the engine, a call
    without a residual passes a one-element placeholder."""
    n, k = w.shape[0], w.shape[1] * 8
    layout = layout or layout_for(n, k)
    grid, block = launch_for(n, layout)
    if residual is None:
        residual = mx.zeros((1,), dtype=x.dtype)
    many = x.size // k > 1
    return kernel_for(x.dtype, group, n, k, layout, many)(
        inputs=[x, w, scales, biases, residual],
        grid=grid,
        threadgroup=block,
        output_shapes=[(*x.shape[:-1], n)],
        output_dtypes=[x.dtype],
    )[0]


def check():
    failed = 0
    total = 0
    # --quick: bf16 in groups of 64 alone, 18 compiles instead of 126.
    quick = "--quick" in sys.argv
    for dtype in [mx.bfloat16] if quick else [mx.bfloat16, mx.float16, mx.float32]:
        for group in [64] if quick else [32, 64, 128]:
            for n, k in CHECK_SHAPES:
                w, s, b = mx.quantize(mx.random.normal((n, k)).astype(dtype), group_size=group, bits=4)
                x = mx.random.normal((1, 1, k)).astype(dtype)
                f32 = mx.float32
                exact = mx.quantized_matmul(x.astype(f32), w, s.astype(f32), b.astype(f32), transpose=True, group_size=group, bits=4)
                scale = mx.abs(exact).max()
                mlx = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=4).astype(f32)
                mlx_error = (mx.abs(mlx - exact).max() / scale).item()
                # The engine's layout, and a row set split over 4 warps (2 for bf16 too).
                rows, chunks, _ = layout_for(n, k)
                splits = [None, (rows, chunks, 4)] + ([(rows, chunks, 2)] if dtype == mx.bfloat16 else [])
                for launch in splits:
                    ondo = ondo_qmv4(x, w, s, b, group, launch).astype(f32)
                    ondo_error = (mx.abs(ondo - exact).max() / scale).item()
                    total += 1
                    if ondo_error > max(2 * mlx_error, 1e-5):
                        failed += 1
                        print(f"WRONG {dtype} group {group} {n}x{k} launch {launch}: error {ondo_error:.2e}, MLX's {mlx_error:.2e}")
                    elif group == 64 and (n, k) in SHOWN_SHAPES and launch is None:
                        print(f"{str(dtype):14s} group {group} {n}x{k}: error {ondo_error:.2e}, MLX's {mlx_error:.2e}")
                    # With a residual the kernel must give the bits of its
                    # product followed by MLX's add, exactly.
                    r = mx.random.normal((1, 1, n)).astype(dtype)
                    fused = ondo_qmv4(x, w, s, b, group, launch, residual=r)
                    apart = r + ondo_qmv4(x, w, s, b, group, launch)
                    total += 1
                    if not mx.array_equal(fused, apart).item():
                        failed += 1
                        differ = (fused != apart).sum().item()
                        print(f"WRONG residual {dtype} group {group} {n}x{k} launch {launch}: {differ} of {n} outputs differ")
    # Several positions at once (a batch's decode step): within one walk
    # over the rows (5) and past it (11), bf16 in groups of 64, the engine's
    # layout and a split over 4 warps.
    for n, k in CHECK_SHAPES:
        w, s, b = mx.quantize(mx.random.normal((n, k)).astype(mx.bfloat16), group_size=64, bits=4)
        for positions in [2, 5, 11]:
            x = mx.random.normal((positions, 1, k)).astype(mx.bfloat16)
            f32 = mx.float32
            exact = mx.quantized_matmul(x.astype(f32), w, s.astype(f32), b.astype(f32), transpose=True, group_size=64, bits=4)
            scale = mx.abs(exact).max()
            mlx = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4).astype(f32)
            mlx_error = (mx.abs(mlx - exact).max() / scale).item()
            rows, chunks, _ = layout_for(n, k)
            for launch in [None, (rows, chunks, 4)]:
                ondo = ondo_qmv4(x, w, s, b, 64, launch).astype(f32)
                ondo_error = (mx.abs(ondo - exact).max() / scale).item()
                total += 1
                if ondo_error > max(2 * mlx_error, 1e-5):
                    failed += 1
                    print(f"WRONG {positions} positions {n}x{k} launch {launch}: error {ondo_error:.2e}, MLX's {mlx_error:.2e}")
                r = mx.random.normal((positions, 1, n)).astype(mx.bfloat16)
                fused = ondo_qmv4(x, w, s, b, 64, launch, residual=r)
                apart = r + ondo_qmv4(x, w, s, b, 64, launch)
                total += 1
                if not mx.array_equal(fused, apart).item():
                    failed += 1
                    print(f"WRONG residual {positions} positions {n}x{k} launch {launch}")
                # Each position's outputs are that position's product alone.
                one = mx.concatenate([ondo_qmv4(x[i : i + 1], w, s, b, 64, launch) for i in range(positions)])
                total += 1
                if not mx.allclose(ondo.astype(mx.bfloat16), one, rtol=1e-2, atol=1e-2).item():
                    failed += 1
                    print(f"WRONG {positions} positions {n}x{k}: a row is not its own product")
    print(f"Ondo's kernel: {total - failed} of {total} cases right (within twice MLX's error; with a residual, MLX's add exactly)", flush=True)
    return failed == 0


def host_cost():
    """Microseconds per call to build and to evaluate 2000 independent calls
    on one small matrix (a few microseconds of GPU work each)."""
    n, k, calls = 512, 2048, 2000
    w, s, b = mx.quantize(mx.random.normal((n, k)).astype(mx.bfloat16), group_size=64, bits=4)
    x = mx.random.normal((1, 1, k)).astype(mx.bfloat16)
    mx.eval(w, s, b, x, ondo_qmv4(x, w, s, b, 64))
    for name, call in [
        ("MLX quantized_matmul", lambda: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)),
        ("Ondo's kernel", lambda: ondo_qmv4(x, w, s, b, 64)),
        ("MLX add (for scale)", lambda: x + x),
    ]:
        builds, evals = [], []
        for _ in range(5):
            mx.synchronize()
            start = time.perf_counter()
            outs = [call() for _ in range(calls)]
            built = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            builds.append((built - start) / calls * 1e6)
            evals.append((time.perf_counter() - built) / calls * 1e6)
        print(f"host per call, {name:22s}: build {sorted(builds)[2]:5.2f} us, eval {sorted(evals)[2]:5.2f} us", flush=True)


def median_seconds(make, reps=7):
    runs = []
    for _ in range(reps):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(make())
        mx.synchronize()
        runs.append(time.perf_counter() - start)
    return sorted(runs)[len(runs) // 2]


def copies_for(nbytes):
    return max(2, min(64, (1 << 30) // nbytes))


def bandwidth(weights, make_call):
    """GB/s of the weights (each a tuple of arrays) read by one call each."""
    nbytes = sum(a.nbytes for w in weights for a in w)
    return nbytes / median_seconds(lambda: [make_call(w) for w in weights]) / 1e9


def many():
    """Time per call of a batch's product, B vectors at once, MLX's
    quantized_matmul against Ondo's kernel, on the 3B shapes: each as many
    weight copies as fill 1 GiB, one call each in one eval, median of 7,
    relative to MLX's one-vector call."""
    print("B vectors at once, time per call relative to MLX's call for one vector (3B shapes, bf16, groups of 64)")
    levels = [1, 2, 4, 8, 16, 32]
    print(f"{'matrix':34s} " + " ".join(f"{'B=' + str(b):>15s}" for b in levels) + "   (MLX / Ondo)")
    for name, rows, cols in SHAPES[6:] + [("3B head, 128256x3072", 128256, 3072)]:
        copies = copies_for(rows * cols // 2)
        weights = [
            mx.quantize(mx.random.normal((rows, cols)).astype(mx.bfloat16), group_size=64, bits=4)
            for _ in range(copies)
        ]
        mx.eval(weights)
        base = None
        cells = []
        for b in levels:
            x = mx.random.normal((b, 1, cols)).astype(mx.bfloat16)
            mx.eval(x)
            mlx = median_seconds(lambda: [mx.quantized_matmul(x, *w, transpose=True, group_size=64, bits=4) for w in weights]) / copies
            ondo = median_seconds(lambda: [ondo_qmv4(x, *w, 64) for w in weights]) / copies
            base = base or mlx
            cells.append(f"{mlx / base:6.2f}/{ondo / base:5.2f}")
        print(f"{name:34s} " + " ".join(f"{c:>15s}" for c in cells) + f"   (MLX B=1: {base * 1e6:.1f} us)", flush=True)
        del weights
        mx.clear_cache()


def main():
    mx.random.seed(0)
    w, s, b = mx.quantize(mx.random.normal((512, 2048)).astype(mx.bfloat16), group_size=64, bits=4)
    x = mx.random.normal((1, 1, 2048)).astype(mx.bfloat16)
    mx.eval(w, s, b, x)
    start = time.perf_counter()
    mx.eval(ondo_qmv4(x, w, s, b, 64))
    print(f"first call of a bf16 group-64 kernel (NVRTC): {time.perf_counter() - start:.2f} s", flush=True)
    ok = check()
    if "--many" in sys.argv:
        many()
        sys.exit(0 if ok else 1)
    if "--check" in sys.argv:
        sys.exit(0 if ok else 1)
    host_cost()
    if "--host" in sys.argv:
        sys.exit(0 if ok else 1)
    big = mx.random.normal((1 << 28,)).astype(mx.bfloat16)
    mx.eval(big)
    t = median_seconds(lambda: mx.sum(big))
    print(f"read of {big.nbytes >> 20} MiB (a sum): {big.nbytes / t / 1e9:.0f} GB/s")
    del big
    for name, rows, cols in SHAPES:
        x = mx.random.normal((1, 1, cols)).astype(mx.bfloat16)
        line = [f"{name:34s}"]
        for bits in [4, 8]:
            copies = copies_for(rows * cols * bits // 8)
            weights = [
                mx.quantize(mx.random.normal((rows, cols)).astype(mx.bfloat16), group_size=64, bits=bits)
                for _ in range(copies)
            ]
            mx.eval(weights)
            gbs = bandwidth(weights, lambda w: mx.quantized_matmul(x, *w, transpose=True, group_size=64, bits=bits))
            line.append(f"MLX {bits}-bit {gbs:5.0f}")
            if bits == 4:
                gbs = bandwidth(weights, lambda w: ondo_qmv4(x, *w, 64))
                line.append(f"Ondo 4-bit {gbs:5.0f} ({'/'.join(map(str, layout_for(rows, cols)))})")
            del weights
            mx.clear_cache()
        if rows * cols * 2 <= (1 << 30):
            weights = [(mx.random.normal((rows, cols)).astype(mx.bfloat16),) for _ in range(copies_for(rows * cols * 2))]
            mx.eval(weights)
            gbs = bandwidth(weights, lambda w: x @ w[0].T)
            line.append(f"dense bf16 {gbs:5.0f}")
            del weights
            mx.clear_cache()
        print(" | ".join(line), "GB/s", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
