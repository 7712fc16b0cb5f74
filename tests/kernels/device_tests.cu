// device_tests.cu — test kernels that exercise every primitive of the napkin device library.
//
// Compiled by the nvcc tests (sm_80 and sm_90a: must build without spills) and by the GPU tests
// (NVRTC through napkin.kernels.compile_kernel), which run each kernel against torch.
#include "napkin.cuh"

using namespace napkin;

typedef __nv_bfloat16 bf16;
typedef __half f16;

// ---- type traits ------------------------------------------------------------------------------

// out[i] = pack2(x[2i], x[2i+1]); back[2i], back[2i+1] = unpack2(out[i]); conv[j] = from(to(x[j])).
template <typename T>
__device__ void pack_test(const float* x, u32* out, float* back, T* conv, int pairs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const u32 p = Traits<T>::pack2(x[2 * i], x[2 * i + 1]);
  out[i] = p;
  float lo, hi;
  Traits<T>::unpack2(p, lo, hi);
  back[2 * i] = lo;
  back[2 * i + 1] = hi;
  conv[2 * i] = from_float<T>(x[2 * i]);
  conv[2 * i + 1] = from_float<T>(to_float<T>(from_float<T>(x[2 * i + 1])));
}

extern "C" __global__ void pack_bf16(const float* x, u32* out, float* back, bf16* conv,
                                     int pairs) {
  pack_test<bf16>(x, out, back, conv, pairs);
}

extern "C" __global__ void pack_f16(const float* x, u32* out, float* back, f16* conv, int pairs) {
  pack_test<f16>(x, out, back, conv, pairs);
}

// ---- 16-byte vectors with tails ---------------------------------------------------------------

// One thread per 16-byte chunk of a row: Y[r, c] = X[r, c] for c < cols (row stride ld, which
// need not keep rows aligned); Z (row stride zld, a multiple of the vector size) receives the
// whole loaded vectors, so its tail columns show the fill value.
template <typename T>
__device__ void vec_copy(const T* X, T* Y, T* Z, int rows, int cols, int ld, int zld, float fill) {
  constexpr int V = Vec16<T>::size;
  const int r = blockIdx.y;
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (r >= rows || col >= cols) return;
  Vec16<T> v;
  load_vec(v, X + static_cast<i64>(r) * ld, col, cols, from_float<T>(fill));
  store_vec(Y + static_cast<i64>(r) * ld, col, cols, v);
  store_vec(Z + static_cast<i64>(r) * zld, col, zld, v);
}

extern "C" __global__ void vec_copy_f16(const f16* X, f16* Y, f16* Z, int rows, int cols, int ld,
                                        int zld, float fill) {
  vec_copy<f16>(X, Y, Z, rows, cols, ld, zld, fill);
}

extern "C" __global__ void vec_copy_f32(const float* X, float* Y, float* Z, int rows, int cols,
                                        int ld, int zld, float fill) {
  vec_copy<float>(X, Y, Z, rows, cols, ld, zld, fill);
}

// ---- 16 bytes at any address ------------------------------------------------------------------

// Thread t reads the 16 bytes at X + t (any byte offset in a line; X's buffer is 16-byte aligned)
// with load16_shifted and writes the first min(16, n - t) of them to Y + 16 t: the caller checks
// those against X[t ..]; a thread whose 16 bytes would end past n asks for fewer, and its read
// must then stay inside the lines holding X[t .. n).
extern "C" __global__ void shifted_bytes(const unsigned char* X, unsigned char* Y, int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int want = n - t < 16 ? n - t : 16;
  const uint4 v = load16_shifted(X + t, want);
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (i < want) Y[16 * t + i] = static_cast<unsigned char>(w[i >> 2] >> (8 * (i & 3)));
  }
}

// ---- cp.async multi-stage pipeline ------------------------------------------------------------

// Block b streams the 64-column band b of X (rows x cols, row stride ld) through a STAGES-deep
// cp.async pipeline of 32-row tiles, and writes every whole tile, zero-filled parts included, to
// Y (row stride yld, rows_p x cols_p: rows and cols rounded up to the tile). Y must equal X where
// X exists and be 0 elsewhere.
template <typename T, int STAGES>
__device__ void pipeline_copy(const T* X, T* Y, int rows, int cols, int ld, int rows_p,
                              int cols_p, int yld) {
  constexpr int TR = 32, TC = 64, NT = 128, PAD = 16 / sizeof(T);
  __shared__ __align__(16) T tile[STAGES][TR][TC + PAD];
  const int tid = threadIdx.x;
  const int c0 = blockIdx.x * TC;
  const int ntiles = (rows + TR - 1) / TR;
  const T* band = X + c0;
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles)
      load_tile_async<T, TR, TC, NT>(&tile[s][0][0], TC + PAD, band + static_cast<i64>(s) * TR * ld,
                                     ld, rows - s * TR, cols - c0, tid);
    cp_async_commit();
  }
  for (int t = 0; t < ntiles; ++t) {
    pipeline_wait<STAGES>();
    const int nt = t + STAGES - 1;
    if (nt < ntiles)
      load_tile_async<T, TR, TC, NT>(&tile[nt % STAGES][0][0], TC + PAD,
                                     band + static_cast<i64>(nt) * TR * ld, ld, rows - nt * TR,
                                     cols - c0, tid);
    cp_async_commit();
    store_tile<T, TR, TC, NT>(Y + static_cast<i64>(t) * TR * yld + c0, yld, &tile[t % STAGES][0][0],
                              TC + PAD, rows_p - t * TR, cols_p - c0, tid);
  }
  cp_async_wait_all();
}

extern "C" __global__ void __launch_bounds__(128)
    pipeline_copy_f16(const f16* X, f16* Y, int rows, int cols, int ld, int rows_p, int cols_p,
                      int yld) {
  pipeline_copy<f16, 3>(X, Y, rows, cols, ld, rows_p, cols_p, yld);
}

extern "C" __global__ void __launch_bounds__(128)
    pipeline_copy_f32(const float* X, float* Y, int rows, int cols, int ld, int rows_p,
                      int cols_p, int yld) {
  pipeline_copy<float, 4>(X, Y, rows, cols, ld, rows_p, cols_p, yld);
}

// Synchronous tile copy (load_tile through registers), one 32 x 64 tile per block.
extern "C" __global__ void __launch_bounds__(128)
    tile_copy_bf16(const bf16* X, bf16* Y, int rows, int cols, int ld) {
  constexpr int TR = 32, TC = 64, NT = 128, PAD = 8;
  __shared__ __align__(16) bf16 tile[TR][TC + PAD];
  const int r0 = blockIdx.y * TR, c0 = blockIdx.x * TC;
  const i64 off = static_cast<i64>(r0) * ld + c0;
  load_tile<bf16, TR, TC, NT>(&tile[0][0], TC + PAD, X + off, ld, rows - r0, cols - c0,
                              threadIdx.x);
  __syncthreads();
  store_tile<bf16, TR, TC, NT>(Y + off, ld, &tile[0][0], TC + PAD, rows - r0, cols - c0,
                               threadIdx.x);
}

// ---- reductions ---------------------------------------------------------------------------------

// One warp per row: sums[r], maxes[r] over X[r, :cols] with warp_sum / warp_max.
extern "C" __global__ void warp_reduce_rows(const float* X, float* sums, float* maxes, int rows,
                                            int cols) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(lane_id());
  if (warp >= rows) return;
  const float* x = X + static_cast<i64>(warp) * cols;
  float s = 0.f, m = neg_inf();
  for (int c = lane; c < cols; c += 32) {
    s += x[c];
    m = fmaxf(m, x[c]);
  }
  s = warp_sum(s);
  m = warp_max(m);
  if (lane == 0) {
    sums[warp] = s;
    maxes[warp] = m;
  }
}

// One block per row (any multiple of 32 threads): block_sum / block_max over X[r, :cols].
extern "C" __global__ void block_reduce_rows(const float* X, float* sums, float* maxes, int cols) {
  __shared__ float scratch[32];
  const float* x = X + static_cast<i64>(blockIdx.x) * cols;
  float s = 0.f, m = neg_inf();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    s += x[c];
    m = fmaxf(m, x[c]);
  }
  s = block_sum(s, scratch);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = s;
    maxes[blockIdx.x] = m;
  }
}

// A row sum split over the blocks of one launch: block (r, s) of a 2-D block of threads adds its
// slice of row r (split s of gridDim.y), writes the partial, and the last split of row r to arrive
// (last_to_arrive on counters[r]) adds the partials in split order into sums[r].
extern "C" __global__ void split_row_sums(const float* X, float* partials, unsigned int* counters,
                                          float* sums, int cols) {
  __shared__ float scratch[32];
  const int tid = threadIdx.x + blockDim.x * threadIdx.y;
  const int threads = blockDim.x * blockDim.y;
  const int splits = gridDim.y, r = blockIdx.x, s = blockIdx.y;
  const int per = (cols + splits - 1) / splits;
  const float* x = X + static_cast<i64>(r) * cols;
  float v = 0.f;
  for (int c = s * per + tid; c < min(cols, (s + 1) * per); c += threads) v += x[c];
  v = block_sum(v, scratch);
  if (tid == 0) partials[static_cast<i64>(s) * gridDim.x + r] = v;
  if (!last_to_arrive(&counters[r], splits)) return;
  if (tid == 0) {
    float a = __ldcg(&partials[r]);
    for (int k = 1; k < splits; ++k) a += __ldcg(&partials[static_cast<i64>(k) * gridDim.x + r]);
    sums[r] = a;
  }
}

// One warp per 16 x 32 accumulator tile of X (rows x cols): load_c, row_sum / row_max (quad
// shuffles), for_each (adds row * 1000 + col), store_c back to Y; out-of-range elements read as 0
// for the sum and -inf for the max.
extern "C" __global__ void fragment_rows(const float* X, float* Y, float* sums, float* maxes,
                                         int rows, int cols) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int r0 = warp * 16;
  if (r0 >= rows) return;
  const int lane = static_cast<int>(lane_id());
  const int g = lane >> 2, t = lane & 3;
  const float* x = X + static_cast<i64>(r0) * cols;
  TileC<16, 32> c;
  float rs[1][2], rm[1][2];
  load_c(c, x, cols, rows - r0, cols, 0.f);
  row_sum(rs, c);
  load_c(c, x, cols, rows - r0, cols, neg_inf());
  row_max(rm, c);
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + g + 8 * h;
    if (row < rows && t == h) {
      sums[row] = rs[0][h];
      maxes[row] = rm[0][h];
    }
  }
  load_c(c, x, cols, rows - r0, cols, 0.f);
  for_each(c, [r0](int row, int col, float& v) { v += (r0 + row) * 1000.f + col; });
  store_c(Y + static_cast<i64>(r0) * cols, cols, c, rows - r0, cols);
}

// ---- tensor-core tiles ----------------------------------------------------------------------------

// C (M x N, TO) = alpha * A (M x K, row-major) B, with B given as [K][N] (B_KN) or as its
// transpose [N][K]. 64 x 64 block tiles, 4 warps of 32 x 32, K streamed in steps of 32 through a
// 3-stage cp.async pipeline; any M, N, K (rows of A and B unaligned when K or N is not a multiple
// of 8 take the scalar path).
template <typename T, typename TO, bool B_KN>
__device__ void gemm(const T* A, const T* B, TO* C, int M, int N, int K, float alpha) {
  constexpr int BM = 64, BN = 64, BK = 32, STAGES = 3, NT = 128, PAD = 8;
  constexpr int B_ROWS = B_KN ? BK : BN;
  constexpr int B_COLS = B_KN ? BN : BK;
  __shared__ __align__(16) T sA[STAGES][BM][BK + PAD];
  __shared__ __align__(16) T sB[STAGES][B_ROWS][B_COLS + PAD];
  const int tid = threadIdx.x;
  const int warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = (K + BK - 1) / BK;

  auto load_stage = [&](int slot, int kt) {
    const int k0 = kt * BK;
    load_tile_async<T, BM, BK, NT>(&sA[slot][0][0], BK + PAD, A + static_cast<i64>(m0) * K + k0, K,
                                   M - m0, K - k0, tid);
    if (B_KN) {
      load_tile_async<T, B_ROWS, B_COLS, NT>(&sB[slot][0][0], B_COLS + PAD,
                                             B + static_cast<i64>(k0) * N + n0, N, K - k0, N - n0,
                                             tid);
    } else {
      load_tile_async<T, B_ROWS, B_COLS, NT>(&sB[slot][0][0], B_COLS + PAD,
                                             B + static_cast<i64>(n0) * K + k0, K, N - n0, K - k0,
                                             tid);
    }
  };

  TileC<32, 32> acc;
  fill(acc, 0.f);
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    pipeline_wait<STAGES>();
    const int next = kt + STAGES - 1;
    if (next < KT) load_stage(next % STAGES, next);
    cp_async_commit();
    const int slot = kt % STAGES;
    TileA<T, 32, BK> a;
    TileB<T, BK, 32> b;
    load_a(a, &sA[slot][wm * 32][0], BK + PAD);
    if (B_KN) {
      load_b(b, &sB[slot][0][wn * 32], B_COLS + PAD);
    } else {
      load_b_t(b, &sB[slot][wn * 32][0], B_COLS + PAD);
    }
    mma(acc, a, b);
  }
  cp_async_wait_all();
  scale(acc, alpha);
  const int r = m0 + wm * 32, c = n0 + wn * 32;
  store_c(C + static_cast<i64>(r) * N + c, N, acc, M - r, N - c);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_bf16_kn_f32(const bf16* A, const bf16* B, float* C, int M, int N, int K, float alpha) {
  gemm<bf16, float, true>(A, B, C, M, N, K, alpha);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_bf16_nk_bf16(const bf16* A, const bf16* B, bf16* C, int M, int N, int K, float alpha) {
  gemm<bf16, bf16, false>(A, B, C, M, N, K, alpha);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_f16_kn_f16(const f16* A, const f16* B, f16* C, int M, int N, int K, float alpha) {
  gemm<f16, f16, true>(A, B, C, M, N, K, alpha);
}

extern "C" __global__ void __launch_bounds__(128)
    gemm_f16_nk_f32(const f16* A, const f16* B, float* C, int M, int N, int K, float alpha) {
  gemm<f16, float, false>(A, B, C, M, N, K, alpha);
}

// One warp: the fp32 16 x 32 matrix X becomes an A operand through to_a (rounded to bf16), and
// Y (16 x 16) = to_a(X) B with B (32 x 16, [k][n]) staged in shared memory.
extern "C" __global__ void to_a_bf16(const float* X, const bf16* B, float* Y) {
  __shared__ __align__(16) bf16 sB[32][16 + 8];
  for (int i = threadIdx.x; i < 32 * 16; i += 32) sB[i / 16][i % 16] = B[i];
  __syncwarp();
  TileC<16, 32> x;
  load_c(x, X, 32, 16, 32, 0.f);
  TileA<bf16, 16, 32> a;
  to_a(a, x);
  TileB<bf16, 32, 16> b;
  load_b(b, &sB[0][0], 16 + 8);
  TileC<16, 16> y;
  fill(y, 0.f);
  mma(y, a, b);
  store_c(Y, 16, y, 16, 16);
}

// ---- online softmax ------------------------------------------------------------------------------

// One warp per row: Y[r] = softmax(scale * X[r]) over cols, streaming 32 columns at a time with
// OnlineSoftmax; -inf entries are masked, a fully masked row gives zeros. lse[r] is the row's
// natural log-sum-exp of scale * X[r].
extern "C" __global__ void softmax_rows(const float* X, float* Y, float* lse, int rows, int cols,
                                        float scale) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(lane_id());
  if (row >= rows) return;
  const float* x = X + static_cast<i64>(row) * cols;
  const float sl2 = softmax_scale_log2(scale);
  OnlineSoftmax st;
  st.init();
  for (int c0 = 0; c0 < cols; c0 += 32) {
    const int c = c0 + lane;
    const float v = c < cols ? x[c] * sl2 : neg_inf();
    st.update_max(warp_max(v));
    st.add(warp_sum(exp2f(v - st.offset())));
  }
  const float inv = st.inv_sum();
  for (int c = lane; c < cols; c += 32) {
    Y[static_cast<i64>(row) * cols + c] = exp2f(x[c] * sl2 - st.offset()) * inv;
  }
  if (lane == 0) lse[row] = st.lse();
}

// Attention on tensor cores, head dim 64: O = softmax(scale Q K^T + mask) V for Q (nq x 64),
// K, V (nk x 64), all row-major; 4 warps of 16 query rows per block, keys streamed 32 at a time.
// mask_mode 0: none; 1: causal (key j > query i masked); 2: rows with i % 3 == 0 fully masked.
// O is fp32; lse gets each row's natural log-sum-exp.
template <typename T>
__device__ void attention(const T* Q, const T* K, const T* V, float* O, float* lse, int nq, int nk,
                          float scale, int mask_mode) {
  constexpr int D = 64, BQ = 64, BKV = 32, NT = 128, PAD = 8;
  __shared__ __align__(16) T sQ[BQ][D + PAD];
  __shared__ __align__(16) T sK[BKV][D + PAD];
  __shared__ __align__(16) T sV[BKV][D + PAD];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int q0 = blockIdx.x * BQ;
  const int wq = q0 + warp * 16;

  load_tile_async<T, BQ, D, NT>(&sQ[0][0], D + PAD, Q + static_cast<i64>(q0) * D, D, nq - q0, D,
                                tid);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  TileA<T, 16, D> q;
  load_a(q, &sQ[warp * 16][0], D + PAD);

  TileC<16, D> o;
  fill(o, 0.f);
  SoftmaxTile<16> st;
  st.init();
  const float sl2 = softmax_scale_log2(scale);

  for (int k0 = 0; k0 < nk; k0 += BKV) {
    __syncthreads();  // everyone is done with the previous K, V
    load_tile_async<T, BKV, D, NT>(&sK[0][0], D + PAD, K + static_cast<i64>(k0) * D, D, nk - k0, D,
                                   tid);
    load_tile_async<T, BKV, D, NT>(&sV[0][0], D + PAD, V + static_cast<i64>(k0) * D, D, nk - k0, D,
                                   tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    TileB<T, D, BKV> kt;
    load_b_t(kt, &sK[0][0], D + PAD);
    TileC<16, BKV> s;
    fill(s, 0.f);
    mma(s, q, kt);
    mask_cols(s, nk - k0);
    if (mask_mode != 0) {
      for_each(s, [=](int row, int col, float& v) {
        const int qi = wq + row, kj = k0 + col;
        if ((mask_mode == 1 && kj > qi) || (mask_mode == 2 && qi % 3 == 0)) v = neg_inf();
      });
    }
    online_softmax_step(st, s, sl2, o);

    TileA<T, 16, BKV> p;
    to_a(p, s);
    TileB<T, BKV, D> v;
    load_b(v, &sV[0][0], D + PAD);
    mma(o, p, v);
  }
  online_softmax_finish(st, o);
  store_c(O + static_cast<i64>(wq) * D, D, o, nq - wq, D);
  const int lane = static_cast<int>(lane_id());
  if ((lane & 3) == 0) {
    for (int h = 0; h < 2; ++h) {
      const int row = wq + (lane >> 2) + 8 * h;
      if (row < nq) lse[row] = st.row[0][h].lse();
    }
  }
}

extern "C" __global__ void __launch_bounds__(128)
    attention_bf16(const bf16* Q, const bf16* K, const bf16* V, float* O, float* lse, int nq,
                   int nk, float scale, int mask_mode) {
  attention<bf16>(Q, K, V, O, lse, nq, nk, scale, mask_mode);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_f16(const f16* Q, const f16* K, const f16* V, float* O, float* lse, int nq, int nk,
                  float scale, int mask_mode) {
  attention<f16>(Q, K, V, O, lse, nq, nk, scale, mask_mode);
}

// ---- Hopper -------------------------------------------------------------------------------------

// Block b moves floats [1024 b, 1024 b + count) of X into shared memory with a bulk (TMA) copy
// completing on an mbarrier, doubles and increments them with ordinary stores, fences them for the
// async proxy, meets on a second mbarrier that every thread arrives on, and writes them to Y with
// a bulk copy: Y = 2 X + 1. n must be a multiple of 4. On GPUs before sm_90 the kernel traps.
extern "C" __global__ void hopper_bulk_roundtrip(const float* X, float* Y, int n) {
#if NAPKIN_HAS_HOPPER
  constexpr int CHUNK = 1024;
  __shared__ __align__(128) float buf[CHUNK];
  __shared__ __align__(8) u64 bar;
  __shared__ __align__(8) u64 written;
  const int base = blockIdx.x * CHUNK;
  const int count = n - base < CHUNK ? n - base : CHUNK;
  const u32 bytes = static_cast<u32>(count) * 4u;
  if (threadIdx.x == 0) {
    mbarrier_init(&bar, 1);
    mbarrier_init(&written, blockDim.x);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, bytes);
    bulk_copy_g2s(buf, X + base, bytes, &bar);
  }
  mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < count; i += blockDim.x) buf[i] = 2.f * buf[i] + 1.f;
  fence_proxy_async();
  mbarrier_arrive(&written);
  mbarrier_wait(&written, 0);
  if (threadIdx.x == 0) {
    bulk_copy_s2g(Y + base, buf, bytes);
    bulk_commit();
    bulk_wait_read<0>();
    bulk_wait<0>();
  }
#else
  __trap();
#endif
}

#if NAPKIN_HAS_WGMMA
// Present only for sm_90a: proves the wgmma ordering wrappers assemble (no wgmma is issued).
extern "C" __global__ void hopper_wgmma_fences(float* Y) {
  wgmma_fence();
  wgmma_commit();
  wgmma_wait<0>();
  Y[threadIdx.x] = 1.f;
}
#endif

// ---- dynamic shared memory ------------------------------------------------------------------------

// Y[i] = X[n - 1 - i] through n floats of dynamic shared memory (one block; n * 4 bytes may be
// above the 48 KB default, which the launcher raises).
extern "C" __global__ void dyn_smem_reverse(const float* X, float* Y, int n) {
  extern __shared__ __align__(16) float dsm[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) dsm[i] = X[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) Y[i] = dsm[n - 1 - i];
}
