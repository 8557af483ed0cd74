"""Ondo's 4-bit matrix-vector kernel for the scripts that measure it
(gpu-qmv-lab.py, gpu-matvec.py): the layout and launch
src/engine/backend/cuda/mod.rs picks for a matrix, and, for the lab, which
times the kernel without MLX, a standalone source (qmv4.cuh needs no header;
one `extern "C"` kernel per shape, every number compiled in) and NVRTC,
found among the NVIDIA libraries MLX's CUDA wheel depends on.
"""

import ctypes
import glob
import os
import pathlib
import sys
import time

SOURCE = (pathlib.Path(__file__).resolve().parent.parent / "src/engine/backend/cuda/qmv4.cuh").read_text()
WARPS = 4
FULL_GPU_WARPS = 16384
CUDA_TYPE = {"bf16": "ondo_bf16", "f16": "ondo_f16", "f32": "float"}


def layout_for(n, k):
    """backend/cuda/mod.rs's `layout_for`: (rows, chunks, split)."""
    rows, chunks = 4, 1
    sets = -(-n // rows)
    rounds = max(1, k // (32 * 32 * chunks))
    split = 1
    while split < 4 and split * 2 <= rounds and sets * split * 2 <= FULL_GPU_WARPS:
        split *= 2
    return rows, chunks, split


def kernel_name(dtype, group, n, k, layout, warps=WARPS):
    rows, chunks, split = layout
    return f"ondo_qmv4_{dtype}_g{group}_{n}x{k}_r{rows}c{chunks}s{split}w{warps}"


def kernel_source(kernels, extra=""):
    """kernels: (dtype tag, group, n, k, (rows, chunks, split)[, warps])."""
    code = SOURCE + extra
    for dtype, group, n, k, layout, *more in kernels:
        warps = more[0] if more else WARPS
        rows, chunks, split = layout
        t = CUDA_TYPE[dtype]
        code += (
            f'\nextern "C" __global__ void __launch_bounds__({32 * warps}) '
            f"{kernel_name(dtype, group, n, k, layout, warps)}(\n    const {t}* x, const ondo_u32* w, "
            f"const {t}* scales, const {t}* biases, {t}* y) {{\n  ondo_qmv4<{group}, {rows}, {chunks}, "
            f"{split}, {warps}, {k}, {n}>(x, w, scales, biases, y);\n}}\n"
        )
    return code


def launch_for(n, layout, warps=WARPS):
    """backend/cuda/mod.rs's `launch_for`: grid in threads and block, as MLX takes them."""
    rows, _, split = layout
    per_block = warps // split
    blocks = -(-(-(-n // rows)) // per_block)
    return (32, split, blocks * per_block), (32, split, per_block)


def _load_nvrtc():
    names = []
    try:
        import nvidia  # the pip packages MLX's CUDA wheel depends on

        for root in nvidia.__path__:
            names += glob.glob(os.path.join(root, "**", "libnvrtc.so*"), recursive=True)
    except ImportError:
        pass
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        names += glob.glob(os.path.join(d, "libnvrtc.so*")) if d else []
    names = [n for n in names if "builtins" not in n and "alt" not in os.path.basename(n)]
    for name in sorted(names, reverse=True) + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit("no NVRTC library found (pip install nvidia-cuda-nvrtc)")


_nvrtc = None


def compile_cubin(code, arch):
    """A CUBIN for `arch` (as `sm_90`) and the seconds NVRTC took."""
    global _nvrtc
    _nvrtc = _nvrtc or _load_nvrtc()
    prog = ctypes.c_void_p()
    if _nvrtc.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"ondo_qmv4.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    started = time.perf_counter()
    result = _nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    seconds = time.perf_counter() - started
    size = ctypes.c_size_t()
    if result != 0:
        _nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        _nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(f"NVRTC failed:\n{log.value.decode()[-4000:]}")
    _nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    _nvrtc.nvrtcGetCUBIN(prog, cubin)
    _nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw, seconds
