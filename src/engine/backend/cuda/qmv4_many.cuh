// Ondo's matrix product for 4-bit affine quantized weights at several
// positions (a batch's decode step) on MLX's CUDA backend, built on
// qmv4.cuh's helpers. It is its own MLX kernel, with qmv4.cuh and this file
// as its header, so that the one-position kernel's source, which MLX copies
// and hashes on every call, stays as small as it was.

// Several positions at once, M of them (a batch's decode step, one position
// per sequence): the same walk over the weights as ondo_qmv4 with one chunk
// a round, each 16-byte chunk of a row loaded once and used for up to VECS
// positions. Past one position the arithmetic, not the reads, bounds the
// product, so each weight is unpacked once for all of them: a word's 8
// nibbles become 8 floats already times the group's scale (the masked
// nibble q*16^i + 2^23 as a float f, and scale * (f - 2^23) in one FFMA
// whose addend, -scale * 2^23, is exact), and each position then costs one
// FFMA per weight, with its activations pre-scaled by 16^-i as in
// ondo_qmv4. The bias term, bias times the sum of the chunk's activations,
// is added once per chunk. Past VECS positions the warp walks its rows
// again for the next VECS (rows it has just read, so mostly from the L2).
// Output m of row r is y[m * N + r], and so is the residual's value.
template <int GROUP, int ROWS, int SPLIT, int WARPS, int VECS, int K, int N, typename T>
__device__ __forceinline__ void ondo_qmv4_many(
    const T* x,
    const ondo_u32* w,
    const T* scales,
    const T* biases,
    T* y,
    const T* residual,
    int m) {
  constexpr int n = N;
  static_assert(WARPS % SPLIT == 0, "a block holds whole row sets");
  static_assert(VECS * ROWS <= 32, "a lane per output sums the split");
  const int lane = threadIdx.x;
  const int part = threadIdx.y;
  const int warp = threadIdx.z * SPLIT + part;
  const int row0 = (blockIdx.z * (WARPS / SPLIT) + threadIdx.z) * ROWS;
  constexpr int chunks = K >> 5;
  constexpr int groups = K / GROUP;
  const uint4* packed = reinterpret_cast<const uint4*>(w);
  // 16-byte loads holding one word's 8 activations.
  constexpr int XLOADS = 8 * sizeof(T) / 16;

  for (int v0 = 0; v0 < m; v0 += VECS) {
    const int count = min(VECS, m - v0);
    const T* xv = x + static_cast<unsigned long long>(v0) * K;
    float acc[VECS][ROWS];
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        acc[v][r] = 0.0f;
      }
    }
    const int first = row0 < n ? lane + 32 * part : chunks;
    for (int c = first; c < chunks; c += 32 * SPLIT) {
      uint4 q[ROWS];
      float scale[ROWS];
      float bias[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const unsigned long long row = min(row0 + r, n - 1);
        const unsigned long long group = row * groups + (c * 32) / GROUP;
        q[r] = packed[row * chunks + c];
        scale[r] = ondo_float(scales[group]);
        bias[r] = ondo_float(biases[group]);
      }
      float xsum[VECS];
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
        xsum[v] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float xs[VECS][8];
#pragma unroll
        for (int v = 0; v < VECS; ++v) {
          if (v < count) {
            uint4 raw[XLOADS];
            const uint4* xword = reinterpret_cast<const uint4*>(
                xv + static_cast<unsigned long long>(v) * K + c * 32 + j * 8);
#pragma unroll
            for (int i = 0; i < XLOADS; ++i) {
              raw[i] = xword[i];
            }
            const T* xt = reinterpret_cast<const T*>(raw);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float value = ondo_float(xt[i]);
              xsum[v] += value;
              xs[v][i] = value * ondo_nibble_scale(i);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const ondo_u32 word = j == 0 ? q[r].x : j == 1 ? q[r].y : j == 2 ? q[r].z : q[r].w;
          const ondo_u32 high = word >> 12;
          const float offset = -8388608.0f * scale[r];
          float wv[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const ondo_u32 bits = i < 5 ? (word & (0xFu << (4 * i))) : (high & (0xFu << (4 * (i - 3))));
            wv[i] = fmaf(scale[r], __uint_as_float(bits | 0x4B000000u), offset);
          }
#pragma unroll
          for (int v = 0; v < VECS; ++v) {
            if (v < count) {
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                acc[v][r] = fmaf(xs[v][i], wv[i], acc[v][r]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          acc[v][r] = fmaf(bias[r], xsum[v], acc[v][r]);
        }
      }
    }
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
          acc[v][r] += __shfl_xor_sync(0xffffffffu, acc[v][r], offset);
        }
      }
    }
    if constexpr (SPLIT > 1) {
      __shared__ float partial[WARPS][VECS * ROWS];
      if (lane == 0) {
#pragma unroll
        for (int v = 0; v < VECS; ++v) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            partial[warp][v * ROWS + r] = acc[v][r];
          }
        }
      }
      __syncthreads();
      const int v = lane / ROWS;
      const int r = lane % ROWS;
      if (part == 0 && lane < VECS * ROWS && v < count && row0 + r < n) {
        float sum = 0.0f;
#pragma unroll
        for (int p = 0; p < SPLIT; ++p) {
          sum += partial[warp + p][lane];
        }
        const unsigned long long at = static_cast<unsigned long long>(v0 + v) * N;
        ondo_finish(y + at, residual != nullptr ? residual + at : nullptr, row0 + r, sum);
      }
      // The next pass writes the same shared sums.
      __syncthreads();
    } else if (lane == 0) {
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (v < count && row0 + r < n) {
            const unsigned long long at = static_cast<unsigned long long>(v0 + v) * N;
            ondo_finish(y + at, residual != nullptr ? residual + at : nullptr, row0 + r, acc[v][r]);
          }
        }
      }
    }
  }
}
