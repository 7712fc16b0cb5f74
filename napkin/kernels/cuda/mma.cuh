// mma.cuh — register tiles on the tensor cores: mma.sync m16n8k16, bf16 or fp16 in, fp32 out.
//
// Everything is built from 16x16 pieces held by one warp. For lane l, let g = l / 4 (0..7) and
// t = l % 4 (0..3); a piece's elements sit in registers as follows:
//   FragA<T>  A operand, 16 (m) x 16 (k): x[0] = (g, 2t..2t+1), x[1] = (g+8, 2t..2t+1),
//             x[2] = (g, 2t+8..2t+9), x[3] = (g+8, 2t+8..2t+9); two values per u32, lower column
//             in the low half
//   FragB<T>  B operand, 16 (k) x 16 (n), as two n8 halves: x[0] = (k 2t..2t+1, n g),
//             x[1] = (k 2t+8..2t+9, n g), x[2], x[3] the same for n g+8
//   FragC     fp32 accumulator 16 x 16: x[0] = (g, 2t), x[1] = (g, 2t+1), x[2] = (g+8, 2t),
//             x[3] = (g+8, 2t+1), x[4..7] the same for columns 8 + (2t, 2t+1)
// TileA<T, M, K>, TileB<T, K, N> and TileC<M, N> are arrays of pieces (dimensions multiples of 16).
//
// Provides:
//   ldmatrix_x4, ldmatrix_x4_trans     the raw ldmatrix wrappers
//   load_a(a, smem, ld)                A from row-major [m][k] shared memory
//   load_b(b, smem, ld)                B from row-major [k][n] shared memory (ldmatrix .trans)
//   load_b_t(b, smem, ld)              B from its transpose, row-major [n][k] (e.g. K in Q K^T)
//   mma_m16n8k16<T>, mma(c, a, b)      c += a b on pieces or on whole tiles
//   fill, scale, scale_rows            accumulator initialisation and scaling
//   to_a(a, c)                         an fp32 accumulator as the A operand of the next product
//                                      (P V in attention), without a trip through shared memory
//   row_max, row_sum                   per-row reductions of an accumulator (quad shuffles)
//   for_each(c, f)                     f(row, col, value&) on every element this lane holds
//   store_c(gmem, ld, c, rows, cols)   bounds-checked store to global memory as T
//   load_c(c, gmem, ld, rows, cols, fill)
//                                      bounds-checked load from global memory into a fragment
// Shared-memory rows passed to the loads must be 16-byte aligned (ld * sizeof(T) % 16 == 0).
// The per-row arrays of row_max / row_sum / scale_rows are float[M / 16][2]: index [i][h] is tile
// row 16 i + g + 8 h.
#ifndef NAPKIN_MMA_CUH
#define NAPKIN_MMA_CUH

#include "types.cuh"
#include "memory.cuh"
#include "reduce.cuh"

namespace napkin {

template <typename T>
struct FragA {
  u32 x[4];
};

template <typename T>
struct FragB {
  u32 x[4];
};

struct FragC {
  float x[8];
};

template <typename T, int M, int K>
struct TileA {
  static_assert(M % 16 == 0 && K % 16 == 0, "tile sizes are multiples of 16");
  static constexpr int rows = M, cols = K, M16 = M / 16, K16 = K / 16;
  FragA<T> f[M / 16][K / 16];
};

template <typename T, int K, int N>
struct TileB {
  static_assert(K % 16 == 0 && N % 16 == 0, "tile sizes are multiples of 16");
  static constexpr int rows = K, cols = N, K16 = K / 16, N16 = N / 16;
  FragB<T> f[K / 16][N / 16];
};

template <int M, int N>
struct TileC {
  static_assert(M % 16 == 0 && N % 16 == 0, "tile sizes are multiples of 16");
  static constexpr int rows = M, cols = N, M16 = M / 16, N16 = N / 16;
  FragC f[M / 16][N / 16];
};

// ---- ldmatrix -------------------------------------------------------------------------------

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register r[i] gets
// its (row g, columns 2t, 2t+1).
NAPKIN_DEVICE void ldmatrix_x4(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// As ldmatrix_x4 with each matrix transposed: r[i] gets (rows 2t, 2t+1; column g) of matrix i.
NAPKIN_DEVICE void ldmatrix_x4_trans(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// A piece from row-major [m][k] shared memory whose top-left element is at s.
template <typename T>
NAPKIN_DEVICE void load_a(FragA<T>& a, const T* s, int ld) {
  const int lane = static_cast<int>(lane_id());
  ldmatrix_x4(a.x, s + (lane & 15) * ld + (lane >> 4) * 8);
}

// A B piece from row-major [k][n] shared memory whose top-left element is at s.
template <typename T>
NAPKIN_DEVICE void load_b(FragB<T>& b, const T* s, int ld) {
  const int lane = static_cast<int>(lane_id());
  ldmatrix_x4_trans(b.x, s + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
}

// A B piece from its transpose: row-major [n][k] shared memory, top-left element at s.
template <typename T>
NAPKIN_DEVICE void load_b_t(FragB<T>& b, const T* s, int ld) {
  const int lane = static_cast<int>(lane_id());
  ldmatrix_x4(b.x, s + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
}

template <typename T, int M, int K>
NAPKIN_DEVICE void load_a(TileA<T, M, K>& a, const T* s, int ld) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int k = 0; k < K / 16; ++k) load_a(a.f[i][k], s + i * 16 * ld + k * 16, ld);
}

template <typename T, int K, int N>
NAPKIN_DEVICE void load_b(TileB<T, K, N>& b, const T* s, int ld) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
#pragma unroll
    for (int j = 0; j < N / 16; ++j) load_b(b.f[k][j], s + k * 16 * ld + j * 16, ld);
}

template <typename T, int K, int N>
NAPKIN_DEVICE void load_b_t(TileB<T, K, N>& b, const T* s, int ld) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
#pragma unroll
    for (int j = 0; j < N / 16; ++j) load_b_t(b.f[k][j], s + j * 16 * ld + k * 16, ld);
}

// ---- mma ------------------------------------------------------------------------------------

// d[0..3] += A (16x16) B (16x8) with fp32 accumulation.
template <typename T>
NAPKIN_DEVICE void mma_m16n8k16(float* d, const u32 (&a)[4], u32 b0, u32 b1);

template <>
NAPKIN_DEVICE void mma_m16n8k16<__nv_bfloat16>(float* d, const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
NAPKIN_DEVICE void mma_m16n8k16<__half>(float* d, const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a b on one 16x16x16 piece.
template <typename T>
NAPKIN_DEVICE void mma(FragC& c, const FragA<T>& a, const FragB<T>& b) {
  mma_m16n8k16<T>(c.x, a.x, b.x[0], b.x[1]);
  mma_m16n8k16<T>(c.x + 4, a.x, b.x[2], b.x[3]);
}

// c += a b on whole tiles: (M x K) (K x N).
template <typename T, int M, int N, int K>
NAPKIN_DEVICE void mma(TileC<M, N>& c, const TileA<T, M, K>& a, const TileB<T, K, N>& b) {
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
#pragma unroll
    for (int i = 0; i < M / 16; ++i)
#pragma unroll
      for (int j = 0; j < N / 16; ++j) mma(c.f[i][j], a.f[i][k], b.f[k][j]);
}

// ---- accumulators ---------------------------------------------------------------------------

template <int M, int N>
NAPKIN_DEVICE void fill(TileC<M, N>& c, float value) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) c.f[i][j].x[e] = value;
}

template <int M, int N>
NAPKIN_DEVICE void scale(TileC<M, N>& c, float factor) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) c.f[i][j].x[e] *= factor;
}

// Multiplies row 16 i + g + 8 h by factor[i][h].
template <int M, int N>
NAPKIN_DEVICE void scale_rows(TileC<M, N>& c, const float (&factor)[M / 16][2]) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) c.f[i][j].x[e] *= factor[i][(e >> 1) & 1];
}

// Calls f(row, col, value&) for every element of the tile this lane holds (tile coordinates).
template <int M, int N, typename F>
NAPKIN_DEVICE void for_each(TileC<M, N>& c, F f) {
  const int lane = static_cast<int>(lane_id());
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int row = i * 16 + g + ((e >> 1) & 1) * 8;
        const int col = j * 16 + (e >> 2) * 8 + 2 * t + (e & 1);
        f(row, col, c.f[i][j].x[e]);
      }
}

// The accumulator (M x N, fp32) rounded to T and laid out as an A operand (M x N, N playing k).
template <typename T, int M, int N>
NAPKIN_DEVICE void to_a(TileA<T, M, N>& a, const TileC<M, N>& c) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j) {
      const float* x = c.f[i][j].x;
      a.f[i][j].x[0] = Traits<T>::pack2(x[0], x[1]);
      a.f[i][j].x[1] = Traits<T>::pack2(x[2], x[3]);
      a.f[i][j].x[2] = Traits<T>::pack2(x[4], x[5]);
      a.f[i][j].x[3] = Traits<T>::pack2(x[6], x[7]);
    }
}

// Row maxima of the tile, combined over the quad: out[i][h] is row 16 i + g + 8 h.
template <int M, int N>
NAPKIN_DEVICE void row_max(float (&out)[M / 16][2], const TileC<M, N>& c) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = neg_inf();
#pragma unroll
      for (int j = 0; j < N / 16; ++j) {
        const float* x = c.f[i][j].x;
        v = fmaxf(v, fmaxf(fmaxf(x[2 * h], x[2 * h + 1]), fmaxf(x[4 + 2 * h], x[5 + 2 * h])));
      }
      out[i][h] = quad_max(v);
    }
}

// Row sums of the tile, combined over the quad: out[i][h] is row 16 i + g + 8 h.
template <int M, int N>
NAPKIN_DEVICE void row_sum(float (&out)[M / 16][2], const TileC<M, N>& c) {
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < N / 16; ++j) {
        const float* x = c.f[i][j].x;
        v += (x[2 * h] + x[2 * h + 1]) + (x[4 + 2 * h] + x[5 + 2 * h]);
      }
      out[i][h] = quad_sum(v);
    }
}

// Writes the tile to row-major global memory at gmem (row stride ld elements) as T; only the
// `rows` x `cols` elements from the tile's origin are written (either may be <= 0: no store).
template <typename T, int M, int N>
NAPKIN_DEVICE void store_c(T* gmem, int ld, const TileC<M, N>& c, int rows, int cols) {
  const int lane = static_cast<int>(lane_id());
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = i * 16 + g + 8 * h;
      if (row >= rows) continue;
      T* p = gmem + static_cast<i64>(row) * ld;
#pragma unroll
      for (int j = 0; j < N / 16; ++j)
#pragma unroll
        for (int n8 = 0; n8 < 2; ++n8) {
          const int col = j * 16 + n8 * 8 + 2 * t;
          const float v0 = c.f[i][j].x[4 * n8 + 2 * h];
          const float v1 = c.f[i][j].x[4 * n8 + 2 * h + 1];
          if (col + 1 < cols) {
            Traits<T>::store2(p + col, v0, v1);
          } else if (col < cols) {
            p[col] = Traits<T>::from_float(v0);
          }
        }
    }
}

// Reads row-major global memory (element type T, row stride ld) into the tile; elements outside
// `rows` x `cols` from the tile's origin read as `fill`.
template <typename T, int M, int N>
NAPKIN_DEVICE void load_c(TileC<M, N>& c, const T* gmem, int ld, int rows, int cols, float fill) {
  const int lane = static_cast<int>(lane_id());
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int row = i * 16 + g + ((e >> 1) & 1) * 8;
        const int col = j * 16 + (e >> 2) * 8 + 2 * t + (e & 1);
        c.f[i][j].x[e] = (row < rows && col < cols)
                             ? Traits<T>::to_float(gmem[static_cast<i64>(row) * ld + col])
                             : fill;
      }
}

}  // namespace napkin

#endif  // NAPKIN_MMA_CUH
