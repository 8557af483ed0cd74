// Ondo's matrix-vector product for 4-bit affine quantized weights, for one
// position on MLX's CUDA backend (a decode step). A decode step is bound by
// reading the weights once, so this kernel is written for the bandwidth:
// each lane reads 16 bytes of a row per
// load, a warp reads 512 contiguous bytes, and with one chunk a round every
// warp has all ROWS rows' loads in flight before it does any arithmetic
// (the round's loop says what that took).
//
// Layout (MLX's affine mode): row r of the packed weight holds K/8 words,
// value k in bits 4*(k%8) of word k/8; scales and biases are [N, K/GROUP] in
// the activations' type; y[r] = sum over groups g of
//   scale[r,g] * sum(x*q) + bias[r,g] * sum(x)   (accumulated in fp32).
//
// Unpacking without conversions: a nibble masked in place (bits 4i..4i+3,
// value q*16^i) and OR'd into the mantissa of 2^23, whose last place is 1,
// gives 2^23 + q*16^i; subtracting 2^23 leaves q*16^i exactly, and an x
// pre-scaled by 16^-i makes the product x*q exactly: one LOP3, one FADD and
// one FFMA per value. Nibbles 5-7 would reach the exponent and are shifted
// down by 12 bits first.
//
// The source needs no header, so scripts/gpu-qmv-lab.py can compile it
// without MLX and time it on the GPU alone: it names its own 16-bit float
// types and converts them by their bits, rounding as MLX's kernels do (to
// nearest, ties to even); the engine's kernel body (backend/cuda/mod.rs) casts
// MLX's pointers to them.

typedef unsigned int ondo_u32;
struct ondo_bf16 {
  unsigned short bits;
};
struct ondo_f16 {
  unsigned short bits;
};

__device__ __forceinline__ float ondo_float(float v) {
  return v;
}
__device__ __forceinline__ float ondo_float(ondo_bf16 v) {
  return __uint_as_float(static_cast<ondo_u32>(v.bits) << 16);
}
__device__ __forceinline__ float ondo_float(ondo_f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ void ondo_store(float* y, float v) {
  *y = v;
}
__device__ __forceinline__ void ondo_store(ondo_bf16* y, float v) {
  const ondo_u32 u = __float_as_uint(v);
  // A NaN stays a NaN (rounding could carry it into infinity).
  y->bits = (u & 0x7FFFFFFFu) > 0x7F800000u
      ? static_cast<unsigned short>((u >> 16) | 0x40u)
      : static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void ondo_store(ondo_f16* y, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  y->bits = h;
}

__device__ __forceinline__ float ondo_nibble(ondo_u32 word, ondo_u32 mask) {
  return __uint_as_float((word & mask) | 0x4B000000u) - 8388608.0f;
}

// Dot product of one word's 8 values with 8 pre-scaled activations.
__device__ __forceinline__ float ondo_dot8(ondo_u32 word, const float* xs) {
  const ondo_u32 high = word >> 12;
  float d = xs[0] * ondo_nibble(word, 0x0000Fu);
  d = fmaf(xs[1], ondo_nibble(word, 0x000F0u), d);
  d = fmaf(xs[2], ondo_nibble(word, 0x00F00u), d);
  d = fmaf(xs[3], ondo_nibble(word, 0x0F000u), d);
  d = fmaf(xs[4], ondo_nibble(word, 0xF0000u), d);
  d = fmaf(xs[5], ondo_nibble(high, 0x00F00u), d);
  d = fmaf(xs[6], ondo_nibble(high, 0x0F000u), d);
  d = fmaf(xs[7], ondo_nibble(high, 0xF0000u), d);
  return d;
}
// The power of two each of a word's 8 activations is pre-scaled by.
__device__ __forceinline__ constexpr float ondo_nibble_scale(int i) {
  return i == 0 ? 1.0f
      : i == 1 ? 0.0625f
      : (i == 2 || i == 5) ? 0.00390625f
      : (i == 3 || i == 6) ? 0.000244140625f
      : 0.0000152587890625f;
}

// Writes output `row`: the sum rounded to T, and with a residual stream the
// sum so rounded plus the residual's value, rounded again: the bits MLX's
// matmul followed by its add give (two 16-bit values' fp32 sum rounds to the
// 16 bits their exact sum does), with one kernel fewer.
template <typename T>
__device__ __forceinline__ void ondo_finish(T* y, const T* residual, int row, float v) {
  if (residual != nullptr) {
    T rounded;
    ondo_store(&rounded, v);
    v = ondo_float(rounded) + ondo_float(residual[row]);
  }
  ondo_store(&y[row], v);
}

// A set of SPLIT warps computes ROWS consecutive outputs; lane l of the
// set's warp p reads the 16-byte chunks l + 32 * (CHUNKS * p + j) of each
// row (32 values per chunk, all in one group since GROUP is a multiple of
// 32), CHUNKS of them per round, and the set's warps add their sums through
// shared memory. A block is 32 x SPLIT x (WARPS / SPLIT) threads: lanes, the
// warps that share a row set, and row sets; blocks run along z. SPLIT > 1 is
// for matrices with few rows, whose one warp per row set would leave the GPU
// short of loads in flight. K and N, the row's length and the row count, are
// compile-time numbers: with the rounds per row known the compiler unrolls
// them, which a run-time length does not allow (it was slower). T, the
// activations' type, is deduced from the pointers, so a caller names only
// the numbers.
template <int GROUP, int ROWS, int CHUNKS, int SPLIT, int WARPS, int K, int N, typename T>
__device__ __forceinline__ void ondo_qmv4(
    const T* x,
    const ondo_u32* w,
    const T* scales,
    const T* biases,
    T* y,
    const T* residual = nullptr) {
  constexpr int n = N;
  static_assert(WARPS % SPLIT == 0, "a block holds whole row sets");
  const int lane = threadIdx.x;
  const int part = threadIdx.y;
  const int warp = threadIdx.z * SPLIT + part;
  const int row0 = (blockIdx.z * (WARPS / SPLIT) + threadIdx.z) * ROWS;
  constexpr int chunks = K >> 5;
  constexpr int groups = K / GROUP;
  const uint4* packed = reinterpret_cast<const uint4*>(w);
  constexpr int XLOADS = 32 * sizeof(T) / 16;

  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    acc[r] = 0.0f;
  }
  // A row set past the last row (the grid is whole blocks) computes nothing
  // but still meets the block's barrier below.
  const int first = row0 < n ? lane + 32 * CHUNKS * part : chunks;
  for (int base = first; base < chunks; base += 32 * CHUNKS * SPLIT) {
    uint4 q[CHUNKS][ROWS];
    float scale[CHUNKS][ROWS];
    float bias[CHUNKS][ROWS];
    uint4 raw[CHUNKS][XLOADS];
#pragma unroll
    for (int u = 0; u < CHUNKS; ++u) {
      // A chunk past the row's end (the last round of a row whose chunk
      // count is not a multiple of the round) rereads chunk `lane`, which
      // exists since base > lane, and is multiplied by zero below.
      const int c = base + 32 * u < chunks ? base + 32 * u : lane;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const unsigned long long row = min(row0 + r, n - 1);
        const unsigned long long group = row * groups + (c * 32) / GROUP;
        q[u][r] = packed[row * chunks + c];
        scale[u][r] = ondo_float(scales[group]);
        bias[u][r] = ondo_float(biases[group]);
      }
      const uint4* xchunk = reinterpret_cast<const uint4*>(x + c * 32);
#pragma unroll
      for (int i = 0; i < XLOADS; ++i) {
        raw[u][i] = xchunk[i];
      }
    }
    // Without a use of every load before the arithmetic, ptxas sinks each
    // load to just before its first use, so a warp has few loads in flight
    // while it computes (the SASS shows the loads of a round interleaved
    // with its FFMAs). A branch on the XOR of one word of each load (its
    // body a no-op, taken only for one value in 2^32) keeps every load of
    // the round ahead of the first FFMA, which made the products faster on
    // the H200 (docs/benchmarks-log.md). With two chunks a round the round
    // holds twice the registers, fewer warps fit, and it was slower, so it
    // is for one chunk only.
    if constexpr (CHUNKS == 1) {
      ondo_u32 seen = 0;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        seen ^= q[0][r].x ^ __float_as_uint(scale[0][r]) ^ __float_as_uint(bias[0][r]);
      }
#pragma unroll
      for (int i = 0; i < XLOADS; ++i) {
        seen ^= raw[0][i].x;
      }
      if (seen == 0x9E3779B9u) {
        asm volatile("nanosleep.u32 0;");
      }
    }
#pragma unroll
    for (int u = 0; u < CHUNKS; ++u) {
      const float live = base + 32 * u < chunks ? 1.0f : 0.0f;
      const T* xt = reinterpret_cast<const T*>(raw[u]);
      float xs[32];
      float xsum = 0.0f;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float v = ondo_float(xt[i]) * live;
        xsum += v;
        xs[i] = v * ondo_nibble_scale(i & 7);
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float d = ondo_dot8(q[u][r].x, xs);
        d += ondo_dot8(q[u][r].y, xs + 8);
        d += ondo_dot8(q[u][r].z, xs + 16);
        d += ondo_dot8(q[u][r].w, xs + 24);
        acc[r] = fmaf(scale[u][r], d, fmaf(bias[u][r], xsum, acc[r]));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    }
  }
  if constexpr (SPLIT > 1) {
    __shared__ float partial[WARPS][ROWS];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        partial[warp][r] = acc[r];
      }
    }
    __syncthreads();
    if (part == 0 && lane < ROWS && row0 + lane < n) {
      float v = 0.0f;
#pragma unroll
      for (int p = 0; p < SPLIT; ++p) {
        v += partial[warp + p][lane];
      }
      ondo_finish(y, residual, row0 + lane, v);
    }
  } else if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (row0 + r < n) {
        ondo_finish(y, residual, row0 + r, acc[r]);
      }
    }
  }
}
