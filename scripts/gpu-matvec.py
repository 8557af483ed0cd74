"""Bandwidth of the matrix-vector kernels a one-position decode step runs, at
the shapes of Llama 3.1 8B and 3.2 3B layers: MLX's own (4-bit, 8-bit, dense
bf16) and Ondo's 4-bit kernel (src/engine/model/qmv4.cuh, the source the
engine ships, compiled here by MLX the same way).

First a correctness check of Ondo's kernel against MLX's quantized_matmul in
fp32 (bf16, fp16 and fp32 activations; groups of 32, 64 and 128; shapes with
a partial last round and a row count no multiple of the rows per warp): its
error must be at most twice MLX's own at the same dtype. Then each shape is
benchmarked as many distinct weight copies (about 1 GiB, more than the L2
cache) multiplied by one input vector in one `eval`, so every call reads its
weights from device memory; median of 7. Small shapes are bound by the
host's cost per kernel here, not by the GPU.

    python scripts/gpu-matvec.py        # on the device, with MLX's CUDA wheel
"""

import pathlib
import sys
import time

import mlx.core as mx

SHAPES = [
    ("q or o, 4096x4096", 4096, 4096),
    ("k or v, 1024x4096", 1024, 4096),
    ("q, k, v joined, 6144x4096", 6144, 4096),
    ("gate and up joined, 28672x4096", 28672, 4096),
    ("down, 4096x14336", 4096, 14336),
    ("lm_head, 128256x4096", 128256, 4096),
    ("3B q, k, v joined, 5120x3072", 5120, 3072),
    ("3B down, 3072x8192", 3072, 8192),
]

# What src/engine/model/cuda_matvec.rs launches.
ROWS, CHUNKS, WARPS = 4, 2, 4
HEADER = (pathlib.Path(__file__).resolve().parent.parent / "src/engine/model/qmv4.cuh").read_text()
KERNEL = mx.fast.cuda_kernel(
    name="ondo_qmv4",
    input_names=["x", "w", "scales", "biases"],
    output_names=["y"],
    source="ondo_qmv4<T, GROUP, ROWS, CHUNKS>(x, w, scales, biases, y, w_shape[0], w_shape[1] * 8);",
    header=HEADER,
    ensure_row_contiguous=True,
)


def ondo_qmv4(x, w, scales, biases, group):
    n = w.shape[0]
    return KERNEL(
        inputs=[x, w, scales, biases],
        template=[("T", x.dtype), ("GROUP", group), ("ROWS", ROWS), ("CHUNKS", CHUNKS)],
        grid=(((n + ROWS - 1) // ROWS) * 32, 1, 1),
        threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(*x.shape[:-1], n)],
        output_dtypes=[x.dtype],
    )[0]


def check():
    failed = 0
    total = 0
    for dtype in [mx.bfloat16, mx.float16, mx.float32]:
        for group in [32, 64, 128]:
            for n, k in [(1024, 4096), (4096, 14336), (333, 2048), (6144, 3072)]:
                w, s, b = mx.quantize(mx.random.normal((n, k)).astype(dtype), group_size=group, bits=4)
                x = mx.random.normal((1, 1, k)).astype(dtype)
                f32 = mx.float32
                exact = mx.quantized_matmul(x.astype(f32), w, s.astype(f32), b.astype(f32), transpose=True, group_size=group, bits=4)
                scale = mx.abs(exact).max()
                mlx = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=4).astype(f32)
                ondo = ondo_qmv4(x, w, s, b, group).astype(f32)
                mlx_error = (mx.abs(mlx - exact).max() / scale).item()
                ondo_error = (mx.abs(ondo - exact).max() / scale).item()
                total += 1
                if ondo_error > max(2 * mlx_error, 1e-5):
                    failed += 1
                    print(f"WRONG {dtype} group {group} {n}x{k}: error {ondo_error:.2e}, MLX's {mlx_error:.2e}")
                elif group == 64 and n == 4096:
                    print(f"{str(dtype):14s} group {group} {n}x{k}: error {ondo_error:.2e}, MLX's {mlx_error:.2e}")
    print(f"Ondo's kernel: {total - failed} of {total} shapes within twice MLX's error", flush=True)
    return failed == 0


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


def main():
    mx.random.seed(0)
    ok = check()
    big = mx.random.normal((1 << 28,)).astype(mx.bfloat16)
    mx.eval(big)
    t = median_seconds(lambda: mx.sum(big))
    print(f"read of {big.nbytes >> 20} MiB (a sum): {big.nbytes / t / 1e9:.0f} GB/s")
    del big
    for name, rows, cols in SHAPES:
        x = mx.random.normal((1, 1, cols)).astype(mx.bfloat16)
        line = [f"{name:32s}"]
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
                line.append(f"Ondo 4-bit {gbs:5.0f}")
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
