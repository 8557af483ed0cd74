"""Bandwidth of MLX's matrix-vector kernels at the shapes of a Llama 3.1 8B
layer: what a one-position decode step can reach at best on this device.

Each shape is benchmarked as many distinct weight copies (about 1 GiB, more
than the L2 cache) multiplied by one input vector in one `eval`, so every
call reads its weights from device memory; median of 7. Prints one line per
kernel: microseconds per call and GB/s of weights read.

    python scripts/gpu-matvec.py        # on the device, with MLX's CUDA wheel
"""

import time

import mlx.core as mx

SHAPES = [
    ("q or o, 4096x4096", 4096, 4096),
    ("k or v, 1024x4096", 1024, 4096),
    ("q, k, v joined, 6144x4096", 6144, 4096),
    ("gate or up, 14336x4096", 14336, 4096),
    ("gate and up joined, 28672x4096", 28672, 4096),
    ("down, 4096x14336", 4096, 14336),
    ("lm_head, 128256x4096", 128256, 4096),
]


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


def main():
    mx.random.seed(0)
    big = mx.random.normal((1 << 28,)).astype(mx.bfloat16)
    mx.eval(big)
    t = median_seconds(lambda: mx.sum(big))
    print(f"read of {big.nbytes >> 20} MiB (a sum): {big.nbytes / t / 1e9:.0f} GB/s")
    del big
    for bits, group in [(4, 64), (8, 64)]:
        for name, rows, cols in SHAPES:
            copies = copies_for(rows * cols * bits // 8)
            weights = [
                mx.quantize(mx.random.normal((rows, cols)).astype(mx.bfloat16), group_size=group, bits=bits)
                for _ in range(copies)
            ]
            mx.eval(weights)
            x = mx.random.normal((1, cols)).astype(mx.bfloat16)
            nbytes = sum(a.nbytes for w in weights for a in w)
            t = median_seconds(
                lambda: [
                    mx.quantized_matmul(x, *w, transpose=True, group_size=group, bits=bits) for w in weights
                ]
            )
            print(f"{bits}-bit g{group} {name:32s} x{copies:3d}: {t / copies * 1e6:8.1f} us/call, {nbytes / t / 1e9:6.0f} GB/s", flush=True)
            del weights
            mx.clear_cache()
    for name, rows, cols in SHAPES[:-1]:
        copies = copies_for(rows * cols * 2)
        weights = [mx.random.normal((rows, cols)).astype(mx.bfloat16) for _ in range(copies)]
        mx.eval(weights)
        x = mx.random.normal((1, cols)).astype(mx.bfloat16)
        t = median_seconds(lambda: [x @ w.T for w in weights])
        nbytes = sum(w.nbytes for w in weights)
        print(f"dense bf16 {name:32s} x{copies:3d}: {t / copies * 1e6:8.1f} us/call, {nbytes / t / 1e9:6.0f} GB/s", flush=True)
        del weights
        mx.clear_cache()


if __name__ == "__main__":
    main()
