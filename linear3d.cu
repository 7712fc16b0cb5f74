// napkin generated CUDA: diagram linear3d, family contraction, dtype bf16, gpu h200, arch sm_90a
//
// diagram linear3d
//   axes:    b_s=12800, e=768, f=3072
//   input    X[b_s,e] bf16
//   input    W[f,e] bf16
//   input    bias[f] bf16
//   box      Yl[b_s,f] = sum  e(X, W)  woven over b_s,f
//   box      add[b_s,f] = add(Yl, bias)
//   box      Y[b_s,f] = gelu(add)
//   output   Y[b_s,f] bf16
//
// plan (1 kernel, 78.1 us predicted on h200; napkin derive --json prints the same plan):
//   kernel Yl [contraction]: Yl add Y  78.1 us predicted, tensor-bound
//     tiles: b_s -> g_b_s=128@SMEM, f -> g_f=256@SMEM, b_s -> w_b_s=64@RF, f -> w_f=256@RF, e -> s_e=64@SMEM
//     options: engine=wgmma, stages=4, warpgroups=2, blocks_per_sm=1, regs_per_thread=232
//
// launches, in order (1):
//   1. napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e  grid (132, 1, 1)  block (384, 1, 1)  dynamic smem 216192 B  template matmul_wgmma.cu.jinja
//      args: tensor map of X: bf16[b_s,e], box (64, 128), tensor map of W: bf16[f,e], box (64, 256), Y: bf16[b_s,f], M: int = 12800, N: int = 3072, K: int = 768, ldy: int = 3072, bias: bf16[f]
//      tunables: BM=128, BN=256, BK=64, WM=64, WN=256, stages=4, engine=wgmma, a_kmajor=True, b_kmajor=True, persistent=True
//      model: 232 registers/thread, 196608 B shared memory/block
// note: Yl: cost model M_RF = 65536 values per block (170.7 per thread); the register budget model_regs_per_thread = 232 is the contraction footprint
//
// build: nvcc -cubin -gencode=arch=compute_90a,code=sm_90a <this file>

// matmul_wgmma.cu.jinja — tiled contraction on Hopper's warpgroup tensor-core path (sm_90a):
// TMA bulk tensor copies into 128-byte-swizzled shared tiles, wgmma from shared memory, fp32
// accumulation in registers, a fused elementwise epilogue.
//
// Legend: diagram axes -> template symbols -> tunables
// (sizes are kernel arguments: one kernel serves every shape)
// diagram linear3d_Yl: X[b_s,e] x W[f,e] -> Y[b_s,f], bf16
//   b_s -> M (rows, any size):    g_b_s = BM = 128, w_b_s = WM = 64
//   f -> N (columns, any size): g_f = BN = 256, w_f = WN = 256
//   e -> K (summed, any size):  s_e = BK = 64, stages = 4
//   engine: wgmma + TMA, 2 consumer warpgroup(s) of 64 rows, one producer warpgroup
//   A stored [a][b], B stored [c][b]
//   epilogue: add, Y
//
//   Y[batch..., a, c] = epilogue( sum_b A[.., a, b] * B[.., b, c] )      (A, B in either axis order)
//
//   a (rows, M)     grouped at SMEM in blocks of BM = g_a; each consumer warpgroup owns WM = w_a
//                   rows of it (BM / WM consumers), in wgmma pieces of 64 rows
//   c (columns, N)  grouped at SMEM in blocks of BN = g_c = w_c: one wgmma is 64 x BN x 16
//   b (depth, K)    streamed at SMEM in chunks of BK = s_b = 64 (one 128-byte swizzle row of
//                   bf16/fp16), STAGES-deep ring of shared buffers
//   batch axes      part of the work item's number (below); outer sum axes (a
//                   sum over several axes) walked one index at a time around the chunks of b.
//                   Each operand's tensor map is two-dimensional, [every axis but the last][last
//                   axis]: a batch or outer-sum index moves its tiles down by whole rows
//   prologue        (PROLOGUE: RMSNorm -> linear) each consumer warpgroup rewrites its WM rows of
//                   the A slot in place before its wgmma read it: x -> x * G[k] (when there is a
//                   G), accumulating sum_k x^2 per row from the original x (every k of a row
//                   passes through the block); the epilogue multiplies row r's sums by
//                   rsqrt(sum / K + EPS) (the row scale factors out of the sum over k)
//   row reduction   (RED: softmax, logsumexp, sum, max, min or mean along c, after maps) row r
//                   of a 64-row piece lives in the 4 lanes of one quad, so the epilogue reduces
//                   the tile's part of it in registers and two shuffles. One tile spans the row
//                   (N <= BN): a softmax rescales its values before the staging tile, the others
//                   write one value a row (Y[a]); the maps after the reduction ("post") run on
//                   its result. ROWSPLIT (a wider row, tiles_n column tiles): each block
//                   writes its rows' fp32 partials to WS[row][tile] (a softmax also its logits,
//                   less the tile's max, to Y) and a second launch (matmul_wgmma_rowcombine) combines them
//   split sum       (SPLITS > 1, a small output over a long sum) the chunks are shared out over
//                   SPLITS blocks per tile; each writes its fp32 partial tile to the workspace WS
//                   from its registers, and a second launch (matmul_combine) adds them in a fixed
//                   order and applies the epilogue
//   dual (DUAL)     two sums of A with B and B2 (SwiGLU's gate and up): the B ring slot holds
//                   BNO rows of each, one wgmma of N = BN = 2 BNO computes both, and the epilogue
//                   combines column j of the first (acc) with column j of the second (acc2)
//
// Work items: one BM x BNO output tile (of one batch element, one share of a split sum), numbered
// batch-major, then split, then tile in grouped order (GROUP_M block rows walked together, so the
// blocks running at once share their A and B tiles in L2).
// Schedule, per thread block, warp-specialised; PERSISTENT: a grid of at most one block per SM
// walks work items blockIdx.x, blockIdx.x + gridDim.x, .. (else one item per block):
//   warpgroup 0 (producer, one thread): for each chunk of b of each of its items, wait until its
//     ring slot is free ("empty" mbarrier), announce the bytes on the slot's "full" mbarrier, TMA
//     A and B HBM -> SMEM (boxes past M, N or K read as zero: any size runs). The ring position
//     runs on across items: the next item's chunks load while the consumers store this one's;
//   warpgroups 1.. (consumers): wait for "full", issue BK / 16 wgmma per 64-row piece (operands
//     read straight from SMEM through descriptors), keep one chunk's wgmma in flight, release
//     the previous chunk's slot to the producer (the last one once every wgmma has finished);
//   staggered consumers (STAGGER, a setting, off by default; PERSISTENT, two consumers sharing a
//     tile): consumer 1 starts LEAD = STAGES - 2 chunks after consumer 0 (named barrier 6), and
//     the shared ring keeps them about that far apart, so each one's epilogue overlaps the other's
//     last or first chunks of a tile (one warpgroup's wgmma keep every tensor core of the SM busy)
//     instead of both storing at once;
//   ping-pong (PINGPONG): the two consumer warpgroups own whole tiles (WM = BM), a block's work
//     items alternating between them (even ones to consumer 0, odd ones to consumer 1): while one
//     runs its main loop, the other runs its epilogue, so the tensor cores never wait for a
//     store. The ring carries the items in order, so each consumer skips the other's chunks (its
//     count of ring positions runs on over them), and two named barriers pass the main loop from
//     one to the other: a consumer starts an item's loop once the other has waited on every slot
//     of the item before (then no slot's phase it waits on is two behind: the parities stay exact);
//   epilogue: the fp32 accumulators get the fused maps and are rounded to T into a padded SMEM
//   staging tile, which leaves with 16-byte stores (rows and columns past M, N are never
//   written). PERSISTENT: each consumer stages its rows 64 x 64 at a time in a buffer of its own
//   behind the ring (the ring is refilling); otherwise (prologue, row reduction) the whole tile is
//   staged in the ring's memory, all copies done. PERSISTENT with an operand tiled like the output
//   (tiles: a residual E[.., a, c], c contiguous, the output's dtype): each 64 x 64 block of it is
//   copied into the staging block first, read there, and overwritten by the results.
//   CLAMPED (every operand with the output's row and column axes is staged, or there is none,
//   and a consumer of two 64-row pieces does not read both a row and a column operand): each
//   element runs the maps at its indices clamped into M x N (the value of one outside is never
//   stored), so a row vector's reads need no branch and are made once a row.
// Registers move from the producer to the consumers with setmaxnreg.
// napkin.cuh — the napkin device library: include this one file from a generated kernel.
//
// Header-only CUDA C++ in namespace napkin, compiling with nvcc and with NVRTC (no host standard
// headers; only cuda_fp16.h and cuda_bf16.h). The parts:
//   types.cuh    value-type traits (float, __half, __nv_bfloat16), packing, lane_id
//   memory.cuh   16-byte vector loads/stores, cp.async pipelines, tile copies with bounds
//   reduce.cuh   warp, quad and block reductions
//   mma.cuh      16x16 register tiles on mma.sync m16n8k16 (ldmatrix, mma, to_a, store_c)
//   softmax.cuh  the online softmax in base 2 with safe fully masked rows
//   hopper.cuh   sm_90 fences, mbarriers and bulk copies; sm_90a wgmma ordering
//   halfmath.cuh elementwise functions for kernels whose values are 16-bit (bf16, fp16)
#ifndef NAPKIN_CUH
#define NAPKIN_CUH

// types.cuh — value types of the napkin device library.
//
// Provides: integer aliases that need no <cstdint> (u32, u64, i64), NAPKIN_DEVICE, the infinity
// constants, lane_id(), and Traits<T> for float, __half and __nv_bfloat16: to_float / from_float,
// pack2 / unpack2 (two values in one 32-bit register, the first in the low half, as mma operands
// hold them) and store2 (two neighbouring values to memory, one 32-bit store where aligned).
// Only cuda_fp16.h and cuda_bf16.h are included, so the file compiles with nvcc and NVRTC alike.
#ifndef NAPKIN_TYPES_CUH
#define NAPKIN_TYPES_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define NAPKIN_DEVICE __device__ __forceinline__

namespace napkin {

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

NAPKIN_DEVICE float pos_inf() { return __int_as_float(0x7f800000); }
NAPKIN_DEVICE float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

// The lane of the calling thread inside its warp (correct for 1-, 2- and 3-D blocks).
NAPKIN_DEVICE u32 lane_id() {
  u32 lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// Whether pointer p is aligned to `bytes` (a power of two).
NAPKIN_DEVICE bool is_aligned(const void* p, u32 bytes) {
  return (reinterpret_cast<u64>(p) & static_cast<u64>(bytes - 1)) == 0;
}

template <typename T>
struct Traits;

template <>
struct Traits<float> {
  static constexpr int bytes = 4;
  NAPKIN_DEVICE static float to_float(float x) { return x; }
  NAPKIN_DEVICE static float from_float(float x) { return x; }
  // Two neighbouring values p[0] = a, p[1] = b; one 8-byte store when p is 8-byte aligned.
  NAPKIN_DEVICE static void store2(float* p, float a, float b) {
    if (is_aligned(p, 8)) {
      *reinterpret_cast<float2*>(p) = make_float2(a, b);
    } else {
      p[0] = a;
      p[1] = b;
    }
  }
};

template <>
struct Traits<__half> {
  static constexpr int bytes = 2;
  NAPKIN_DEVICE static float to_float(__half x) { return __half2float(x); }
  NAPKIN_DEVICE static __half from_float(float x) { return __float2half_rn(x); }
  // Round lo and hi to fp16 (nearest even) and pack them: lo in bits 0-15, hi in bits 16-31.
  NAPKIN_DEVICE static u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  NAPKIN_DEVICE static void unpack2(u32 v, float& lo, float& hi) {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16)));
  }
  NAPKIN_DEVICE static void store2(__half* p, float a, float b) {
    if (is_aligned(p, 4)) {
      *reinterpret_cast<u32*>(p) = pack2(a, b);
    } else {
      p[0] = from_float(a);
      p[1] = from_float(b);
    }
  }
};

template <>
struct Traits<__nv_bfloat16> {
  static constexpr int bytes = 2;
  NAPKIN_DEVICE static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  NAPKIN_DEVICE static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  // Round lo and hi to bf16 (nearest even) and pack them: lo in bits 0-15, hi in bits 16-31.
  NAPKIN_DEVICE static u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  NAPKIN_DEVICE static void unpack2(u32 v, float& lo, float& hi) {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xffff0000u);
  }
  NAPKIN_DEVICE static void store2(__nv_bfloat16* p, float a, float b) {
    if (is_aligned(p, 4)) {
      *reinterpret_cast<u32*>(p) = pack2(a, b);
    } else {
      p[0] = from_float(a);
      p[1] = from_float(b);
    }
  }
};

template <typename T>
NAPKIN_DEVICE float to_float(T x) { return Traits<T>::to_float(x); }

template <typename T>
NAPKIN_DEVICE T from_float(float x) { return Traits<T>::from_float(x); }

}  // namespace napkin

#endif  // NAPKIN_TYPES_CUH
// memory.cuh — moving tiles between global memory, shared memory and registers.
//
// Provides:
//   Vec16<T>, load16 / store16           one 16-byte (uint4) access
//   load_vec / store_vec                 16 bytes of a row with a bounds-checked scalar fallback
//                                        for the row's tail and for unaligned addresses
//   smem_addr                            a shared-memory pointer as the 32-bit address PTX wants
//   cp_async16                           cp.async.cg 16-byte copy global -> shared; the bytes past
//                                        src_bytes are zero-filled (src_bytes = 0: all zeros, and
//                                        the source is not read)
//   cp_async_commit / cp_async_wait<N> / cp_async_wait_all / pipeline_wait<STAGES>
//                                        commit groups for multi-stage pipelines
//   load_tile_async / load_tile          a ROWS x COLS tile global -> shared, zero outside the
//                                        valid rows x cols
//   store_tile                           a ROWS x COLS tile shared -> global, only the valid part
//
// A multi-stage pipeline with one commit group per stage reads:
//   for (s = 0; s < STAGES - 1; ++s) { if (s < n) load(s % STAGES, s); cp_async_commit(); }
//   for (k = 0; k < n; ++k) {
//     pipeline_wait<STAGES>();                   // stage k has landed; slot (k-1) % STAGES is free
//     if (k + STAGES - 1 < n) load((k + STAGES - 1) % STAGES, k + STAGES - 1);
//     cp_async_commit();                         // commit even when empty: keeps the count
//     compute(k % STAGES);
//   }
#ifndef NAPKIN_MEMORY_CUH
#define NAPKIN_MEMORY_CUH

// (napkin: types.cuh already included)

namespace napkin {

// 16 bytes of T, aligned so that it moves as one uint4.
template <typename T>
struct __align__(16) Vec16 {
  static constexpr int size = 16 / static_cast<int>(sizeof(T));
  T x[16 / sizeof(T)];
};

NAPKIN_DEVICE uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
NAPKIN_DEVICE void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// v = row[col .. col + size); elements at index >= limit read as `fill`. One 16-byte load when the
// whole vector is inside the row and its address is 16-byte aligned, scalar loads otherwise.
template <typename T>
NAPKIN_DEVICE void load_vec(Vec16<T>& v, const T* row, int col, int limit, T fill) {
  constexpr int N = Vec16<T>::size;
  const T* p = row + col;
  if (col + N <= limit && is_aligned(p, 16)) {
    *reinterpret_cast<uint4*>(v.x) = load16(p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v.x[i] = (col + i < limit) ? p[i] : fill;
  }
}

// row[col .. col + size) = v, writing only the elements at index < limit.
template <typename T>
NAPKIN_DEVICE void store_vec(T* row, int col, int limit, const Vec16<T>& v) {
  constexpr int N = Vec16<T>::size;
  T* p = row + col;
  if (col + N <= limit && is_aligned(p, 16)) {
    store16(p, *reinterpret_cast<const uint4*>(v.x));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (col + i < limit) p[i] = v.x[i];
    }
  }
}

// p rounded down to a multiple of 16 bytes.
NAPKIN_DEVICE const void* align_down16(const void* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<u64>(p) & ~static_cast<u64>(15));
}

// The 32-bit shared-state-space address of a pointer into shared memory.
NAPKIN_DEVICE u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// Asynchronous 16-byte copy global -> shared (both 16-byte aligned). The first src_bytes (0..16)
// come from gmem, the rest of the 16 bytes are written as zeros; with src_bytes = 0 nothing is
// read. Completes at the cp_async_wait of the commit group it was issued in.
NAPKIN_DEVICE void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  const unsigned char* s = static_cast<const unsigned char*>(gmem);
  unsigned char* d = static_cast<unsigned char*>(smem);
  for (int i = 0; i < 16; ++i) d[i] = i < src_bytes ? s[i] : 0;
#endif
}

// Closes the group of cp.async copies issued since the last commit.
NAPKIN_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N committed groups are still in flight (this thread's copies only).
template <int N>
NAPKIN_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Waits for every copy this thread issued.
NAPKIN_DEVICE void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// In a STAGES-deep pipeline with one commit group per stage: waits for the oldest stage, then a
// block barrier makes it visible to every thread (and frees the slot computed on last).
template <int STAGES>
NAPKIN_DEVICE void pipeline_wait() {
  static_assert(STAGES >= 2, "a pipeline needs at least two stages");
  cp_async_wait<STAGES - 2>();
  __syncthreads();
}

// The zero of T.
template <typename T>
NAPKIN_DEVICE T zero() { return Traits<T>::from_float(0.f); }

// Starts the copy of a ROWS x COLS tile from global memory (row stride g_ld elements, of which
// `rows` x `cols` from the tile's origin exist) into shared memory (row stride s_ld elements; the
// smem rows must be 16-byte aligned). Elements outside the valid part become zero. NTHREADS
// threads share the work, tid in [0, NTHREADS). Whole, aligned 16-byte chunks go through
// cp.async (a chunk that straddles `cols` copies its valid prefix and zero-fills the rest, one
// wholly outside is zero-filled); a chunk whose global address is not 16-byte aligned is copied
// with scalar loads and ordinary shared stores (visible after the next __syncthreads, like the
// rest). ROLLED keeps the loop over a thread's chunks rolled (a kernel whose registers are all
// taken, the persistent wgmma consumers' epilogue, copies without the unrolled chunks' addresses).
template <typename T, int ROWS, int COLS, int NTHREADS, bool ROLLED = false>
NAPKIN_DEVICE void load_tile_async(T* smem, int s_ld, const T* gmem, int g_ld, int rows, int cols,
                                   int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll (ROLLED ? 1 : ITERS)
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    T* s = smem + r * s_ld + col;
    const T* g = gmem + static_cast<i64>(r) * g_ld + col;
    const bool inside = r < rows && col < cols;
    if (inside && !is_aligned(g, 16)) {
#pragma unroll
      for (int i = 0; i < V; ++i) s[i] = (col + i < cols) ? g[i] : zero<T>();
    } else {
      // Valid prefix from global, zero-fill for the rest; a chunk wholly outside reads nothing
      // and is pointed at the (16-byte aligned down) tile origin.
      const int n = inside ? (cols - col < V ? cols - col : V) : 0;
      const void* src = inside ? static_cast<const void*>(g) : align_down16(gmem);
      cp_async16(s, src, n * static_cast<int>(sizeof(T)));
    }
  }
}

// The same tile copy done synchronously through registers with 16-byte loads (no cp.async);
// the caller still needs a __syncthreads before other threads read the tile.
template <typename T, int ROWS, int COLS, int NTHREADS>
NAPKIN_DEVICE void load_tile(T* smem, int s_ld, const T* gmem, int g_ld, int rows, int cols,
                             int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    Vec16<T> v;
    if (r < rows) {
      load_vec(v, gmem + static_cast<i64>(r) * g_ld, col, cols, zero<T>());
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) v.x[i] = zero<T>();
    }
    store16(smem + r * s_ld + col, *reinterpret_cast<const uint4*>(v.x));
  }
}

// Writes the valid `rows` x `cols` part of a ROWS x COLS shared-memory tile (row stride s_ld,
// 16-byte aligned rows) to global memory (row stride g_ld); nothing outside it is written.
template <typename T, int ROWS, int COLS, int NTHREADS>
NAPKIN_DEVICE void store_tile(T* gmem, int g_ld, const T* smem, int s_ld, int rows, int cols,
                              int tid) {
  constexpr int V = Vec16<T>::size;
  static_assert(COLS % V == 0, "tile columns must be a whole number of 16-byte chunks");
  constexpr int PER_ROW = COLS / V;
  constexpr int CHUNKS = ROWS * PER_ROW;
  constexpr int ITERS = (CHUNKS + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * NTHREADS + tid;
    if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
    const int r = c / PER_ROW;
    const int col = (c % PER_ROW) * V;
    if (r < rows && col < cols) {
      Vec16<T> v;
      *reinterpret_cast<uint4*>(v.x) = load16(smem + r * s_ld + col);
      store_vec(gmem + static_cast<i64>(r) * g_ld, col, cols, v);
    }
  }
}

}  // namespace napkin

#endif  // NAPKIN_MEMORY_CUH
// reduce.cuh — reductions across the threads of a warp, of an mma quad, and of a block.
//
// Provides max_nan and min_nan (a NaN operand gives NaN, as torch.amax and amin do: fmaxf and
// fminf would give the other operand), the operators SumOp, MaxOp and MinOp built on them (with
// their identities), and
//   warp_reduce<Op>, warp_sum, warp_max   all 32 lanes (butterfly __shfl_xor_sync; every lane
//                                         gets the result)
//   quad_reduce<Op>, quad_sum, quad_max   the 4 lanes 4g..4g+3 that hold one row of an mma
//                                         accumulator fragment
//   block_reduce<Op>, block_sum, block_max
//                                         the whole block, through 32 floats of shared scratch;
//                                         every thread gets the result; the block's thread count
//                                         must be a multiple of 32 and every thread must call it
//   merge_max_sumexp, fold_max_sumexp, xor_reduce_max_sumexp, block_reduce_max_sumexp
//                                         the pair (max m, sum of exp(x - m)) of an online softmax
//   last_to_arrive                        the handshake of a reduction split over the blocks of a
//                                         launch: true in the last of `count` blocks to arrive
//
// The pair lets a row kernel find its softmax's max and sum in one round over the block (one
// barrier) instead of two dependent rounds. Every lane of a butterfly ends with the same bits: the
// merge is symmetric.
#ifndef NAPKIN_REDUCE_CUH
#define NAPKIN_REDUCE_CUH

// (napkin: types.cuh already included)

namespace napkin {

// One instruction each on sm_80 and later (max.NaN / min.NaN): a reduction's max of a line holding
// a NaN is NaN, as the reference's amax says, where fmaxf would drop the NaN and return the max of
// the rest.
NAPKIN_DEVICE float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
NAPKIN_DEVICE float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

struct SumOp {
  NAPKIN_DEVICE static float identity() { return 0.f; }
  NAPKIN_DEVICE float operator()(float a, float b) const { return a + b; }
};

struct MaxOp {
  NAPKIN_DEVICE static float identity() { return neg_inf(); }
  NAPKIN_DEVICE float operator()(float a, float b) const { return max_nan(a, b); }
};

struct MinOp {
  NAPKIN_DEVICE static float identity() { return pos_inf(); }
  NAPKIN_DEVICE float operator()(float a, float b) const { return min_nan(a, b); }
};

// Reduces over the aligned group of WIDTH lanes (a power of two up to 32) holding this lane.
template <typename Op, int WIDTH>
NAPKIN_DEVICE float xor_reduce(float v) {
  Op op;
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <typename Op>
NAPKIN_DEVICE float warp_reduce(float v) { return xor_reduce<Op, 32>(v); }
NAPKIN_DEVICE float warp_sum(float v) { return warp_reduce<SumOp>(v); }
NAPKIN_DEVICE float warp_max(float v) { return warp_reduce<MaxOp>(v); }

template <typename Op>
NAPKIN_DEVICE float quad_reduce(float v) { return xor_reduce<Op, 4>(v); }
NAPKIN_DEVICE float quad_sum(float v) { return quad_reduce<SumOp>(v); }
NAPKIN_DEVICE float quad_max(float v) { return quad_reduce<MaxOp>(v); }

// Block-wide reduction. `scratch` is 32 floats of shared memory; it may be reused as soon as the
// call returns (the function ends with a barrier).
template <typename Op>
NAPKIN_DEVICE float block_reduce(float v, float* scratch) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int nwarps = (blockDim.x * blockDim.y * blockDim.z) / 32;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  v = warp_reduce<Op>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : Op::identity();
  v = warp_reduce<Op>(v);
  __syncthreads();
  return v;
}

NAPKIN_DEVICE float block_sum(float v, float* scratch) { return block_reduce<SumOp>(v, scratch); }
NAPKIN_DEVICE float block_max(float v, float* scratch) { return block_reduce<MaxOp>(v, scratch); }

// e^x: __expf where FAST (kernels of 16-bit values, whose rounding hides its error), else expf.
template <bool FAST>
NAPKIN_DEVICE float exp_of(float x) { return FAST ? __expf(x) : expf(x); }

// (m, s) merged with (mb, sb), each the max of some values and the sum of exp(value - max): the
// larger max, each sum rescaled to it. A side whose max is the merged one is not rescaled, so two
// sides that saw only -inf (max -inf, sum 0) merge into the same, not into NaN. Symmetric: the
// merge of b into a and of a into b give the same bits.
template <bool FAST>
NAPKIN_DEVICE void merge_max_sumexp(float& m, float& s, float mb, float sb) {
  const float mm = max_nan(m, mb);
  s = (m == mm ? s : s * exp_of<FAST>(m - mm)) + (mb == mm ? sb : sb * exp_of<FAST>(mb - mm));
  m = mm;
}

// (m, s) with the N values x[0 .. N) folded in (each a pair (x, 1)): the larger max first, so the
// sum is rescaled once for the N values, not once per value. A value equal to the new max adds 1
// without an exp, as merge_max_sumexp does, so a max of -inf or +inf counts the values equal to it
// (merging them one by one gives the same). The N exps are independent.
template <int N, bool FAST>
NAPKIN_DEVICE void fold_max_sumexp(float& m, float& s, const float (&x)[N]) {
  float mm = m;
#pragma unroll
  for (int i = 0; i < N; ++i) mm = max_nan(mm, x[i]);
  // every exp computed, then selected: no branch around it (x - mm is NaN where both are the
  // same infinity, and that exp is not the one kept)
  const float rescale = exp_of<FAST>(m - mm);
  float t = m == mm ? s : s * rescale;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float e = exp_of<FAST>(x[i] - mm);
    t += x[i] == mm ? 1.f : e;
  }
  m = mm;
  s = t;
}

template <int WIDTH, bool FAST>
NAPKIN_DEVICE void xor_reduce_max_sumexp(float& m, float& s) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) {
    const float mb = __shfl_xor_sync(0xffffffffu, m, offset);
    const float sb = __shfl_xor_sync(0xffffffffu, s, offset);
    merge_max_sumexp<FAST>(m, s, mb, sb);
  }
}

// The block's (m, s) in every thread, with one barrier; `scratch` holds 64 floats and is used once.
template <bool FAST>
NAPKIN_DEVICE void block_reduce_max_sumexp(float& m, float& s, float* scratch) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int nwarps = (blockDim.x * blockDim.y * blockDim.z) / 32;
  const int lane = tid & 31;
  xor_reduce_max_sumexp<32, FAST>(m, s);
  if (lane == 0) {
    scratch[tid >> 5] = m;
    scratch[32 + (tid >> 5)] = s;
  }
  __syncthreads();
  m = lane < nwarps ? scratch[lane] : neg_inf();
  s = lane < nwarps ? scratch[32 + lane] : 0.f;
  xor_reduce_max_sumexp<32, FAST>(m, s);
}

// A reduction split over `count` blocks of one launch, each of which has written its partials to
// global memory: every block arrives at `*counter` once, and the call returns true in every thread
// of the last block to arrive, which may then read all the partials (each block's writes were
// fenced before it arrived, and the last one fences again before it reads). The counter must be
// zero when the launch starts; the last block resets it, ready for the next launch, so a counter
// in a workspace zero-filled once serves every later launch on the same stream. Every thread of
// the block must call it; a block that gets false should return without touching the partials.
//
//   if (!napkin::last_to_arrive(&counters[tile], SPLITS)) return;
//   ... add up the SPLITS partials of this tile in split order ...
NAPKIN_DEVICE bool last_to_arrive(unsigned int* counter, unsigned int count) {
  __threadfence();  // this block's partials are visible device-wide before it arrives
  __syncthreads();  // every thread's partials are written and fenced before thread 0 arrives
  int last = 0;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    last = atomicAdd(counter, 1u) == count - 1;
    if (last) *counter = 0u;  // every block has arrived: none adds to it again in this launch
  }
  if (!__syncthreads_or(last)) return false;
  __threadfence();  // the other blocks' partials are read after their arrivals
  return true;
}

}  // namespace napkin

#endif  // NAPKIN_REDUCE_CUH
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

// (napkin: types.cuh already included)
// (napkin: memory.cuh already included)
// (napkin: reduce.cuh already included)

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
// softmax.cuh — the online (streamed) softmax, in base 2.
//
// Scores are scaled once by scale * log2(e) (softmax_scale_log2), so that every exponential is a
// single exp2f: softmax(scale * s)_j = exp2(x_j - m) / sum_k exp2(x_k - m) with x = s * scale_log2.
// A row whose scores so far are all -inf (fully masked) keeps m = -inf; its offset is taken as 0,
// so exp2(-inf - 0) = 0 and no (-inf) - (-inf) = NaN appears; its sum stays 0, and the final
// normalisation turns 0 / 0 into 0, not NaN.
//
// Provides:
//   LOG2E, softmax_scale_log2(scale)
//   softmax_offset(m)                   m, or 0 when m = -inf
//   OnlineSoftmax                       one row's running max m and sum l: init, update_max
//                                       (returns the rescale factor exp2(m_old - m_new)), add,
//                                       offset, inv_sum, lse (natural-log log-sum-exp)
//   SoftmaxTile<M>                      the running state of the M rows of an mma tile
//   online_softmax_step(st, s, scale_log2, o)
//                                       folds a score tile into the state: s becomes the
//                                       unnormalised probabilities exp2(s scale_log2 - m_new) and
//                                       the output accumulator o is rescaled by exp2(m_old - m_new)
//   online_softmax_finish(st, o)        divides o by the row sums (0 for fully masked rows)
//   mask_cols(s, cols)                  sets scores in tile columns >= cols to -inf
#ifndef NAPKIN_SOFTMAX_CUH
#define NAPKIN_SOFTMAX_CUH

// (napkin: types.cuh already included)
// (napkin: reduce.cuh already included)
// (napkin: mma.cuh already included)

namespace napkin {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// The factor that turns raw scores into base-2 exponents: softmax(scale * s) uses exp2(s * this).
NAPKIN_DEVICE float softmax_scale_log2(float scale) { return scale * LOG2E; }

// The value subtracted before exponentiating: the running max, or 0 while it is -inf.
NAPKIN_DEVICE float softmax_offset(float m) { return m == neg_inf() ? 0.f : m; }

// Running state of one softmax row; values are in base-2 units (already times scale * log2 e).
struct OnlineSoftmax {
  float m;  // running max
  float l;  // running sum of exp2(x - softmax_offset(m))

  NAPKIN_DEVICE void init() {
    m = neg_inf();
    l = 0.f;
  }
  // Takes a new chunk's max into the running max and rescales the running sum; returns the
  // factor exp2(m_old - m_new) by which anything accumulated so far (such as an output row) must
  // be multiplied.
  NAPKIN_DEVICE float update_max(float chunk_max) {
    const float m_new = fmaxf(m, chunk_max);
    const float alpha = exp2f(m - softmax_offset(m_new));
    m = m_new;
    l *= alpha;
    return alpha;
  }
  // What to subtract from x before exp2 for the current chunk.
  NAPKIN_DEVICE float offset() const { return softmax_offset(m); }
  // Adds the chunk's sum of exp2(x - offset()).
  NAPKIN_DEVICE void add(float chunk_sum) { l += chunk_sum; }
  // 1 / l, or 0 for a row with nothing unmasked.
  NAPKIN_DEVICE float inv_sum() const { return l > 0.f ? 1.f / l : 0.f; }
  // log(sum exp(scale * s)) in natural units; -inf for a fully masked row.
  NAPKIN_DEVICE float lse() const { return l > 0.f ? (m + log2f(l)) * LN2 : neg_inf(); }
};

// Running state of the M rows of an accumulator tile; row[i][h] is tile row 16 i + g + 8 h.
template <int M>
struct SoftmaxTile {
  OnlineSoftmax row[M / 16][2];

  NAPKIN_DEVICE void init() {
#pragma unroll
    for (int i = 0; i < M / 16; ++i) {
      row[i][0].init();
      row[i][1].init();
    }
  }
};

// Sets the scores of tile columns >= cols to -inf (the keys past the end of the sequence).
template <int M, int N>
NAPKIN_DEVICE void mask_cols(TileC<M, N>& s, int cols) {
  for_each(s, [cols](int, int col, float& v) {
    if (col >= cols) v = neg_inf();
  });
}

// One streaming step: s (raw scores, -inf where masked) becomes exp2(s * scale_log2 - m_new),
// the row states take in the chunk, and o is rescaled by exp2(m_old - m_new) row by row.
// scale_log2 must be positive.
template <int M, int N, int D>
NAPKIN_DEVICE void online_softmax_step(SoftmaxTile<M>& st, TileC<M, N>& s, float scale_log2,
                                       TileC<M, D>& o) {
  scale(s, scale_log2);
  float mx[M / 16][2];
  row_max(mx, s);
  float alpha[M / 16][2];
  float offset[M / 16][2];
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[i][h] = st.row[i][h].update_max(mx[i][h]);
      offset[i][h] = st.row[i][h].offset();
    }
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float& x = s.f[i][j].x[e];
        x = exp2f(x - offset[i][(e >> 1) & 1]);
      }
  float sum[M / 16][2];
  row_sum(sum, s);
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) st.row[i][h].add(sum[i][h]);
  scale_rows(o, alpha);
}

// Normalises the output accumulator by the row sums (rows with nothing unmasked become 0).
template <int M, int D>
NAPKIN_DEVICE void online_softmax_finish(const SoftmaxTile<M>& st, TileC<M, D>& o) {
  float inv[M / 16][2];
#pragma unroll
  for (int i = 0; i < M / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) inv[i][h] = st.row[i][h].inv_sum();
  scale_rows(o, inv);
}

}  // namespace napkin

#endif  // NAPKIN_SOFTMAX_CUH
// hopper.cuh — the sm_90 (Hopper) path: asynchronous-proxy fences, mbarriers, bulk copies
// (the TMA engine) and the warpgroup mma (wgmma) ordering instructions.
//
// NAPKIN_HAS_HOPPER is 1 when compiling device code for sm_90 or newer, else 0; everything below
// exists only then, so a kernel for sm_80 that includes this file compiles and must simply not
// call it. NAPKIN_HAS_WGMMA is 1 only for the arch-specific target sm_90a, which wgmma needs.
//
// Provides (sm_90+):
//   fence_proxy_async()                 orders this thread's ordinary shared-memory writes before
//                                       later reads by the async proxy (TMA stores, wgmma
//                                       operands); call it in each writing thread, then a barrier
//   mbarrier_init(bar, count)           a 64-bit shared-memory barrier expecting `count` arrivals
//   fence_mbarrier_init()               makes initialised barriers visible (before the
//                                       __syncthreads that follows the init)
//   mbarrier_arrive(bar)                one arrival; returns the phase token
//   mbarrier_arrive_expect_tx(bar, bytes)
//                                       one arrival that also announces `bytes` of async copies
//   mbarrier_try_wait_parity(bar, parity), mbarrier_wait(bar, parity)
//                                       test / wait for the completion of phase `parity` (0, 1, 0..)
//   bulk_copy_g2s(smem, gmem, bytes, bar)
//                                       TMA copy global -> shared; completes `bytes` on bar
//                                       (bytes a multiple of 16, both addresses 16-byte aligned)
//   bulk_copy_s2g(gmem, smem, bytes), bulk_commit(), bulk_wait_read<N>(), bulk_wait<N>()
//                                       TMA copy shared -> global and its bulk-group completion
//   TensorMap                           a CUDA tensor map (CUtensorMap: 128 opaque bytes the host
//                                       encodes); pass it as `const __grid_constant__ TensorMap`
//   prefetch_tensormap(map)             fetch the map's descriptor ahead of the first copy
//   tma_load_2d(smem, map, x, y, bar)   TMA tensor copy of the box at element coordinates (x
//                                       innermost, y) into shared memory, completing on bar; parts
//                                       of the box outside the tensor read as zero
//   named_barrier_sync(id, threads)     a barrier among `threads` threads (bar.sync id; id 0 is
//                                       __syncthreads), for warp-specialised kernels
// Provides (sm_90a):
//   wgmma_fence(), wgmma_commit(), wgmma_wait<N>()
//                                       the ordering around warpgroup mma instructions
//   wgmma_desc_sw128(addr, lbo, sbo)    the 64-bit shared-memory matrix descriptor of an operand
//                                       stored in 128-byte swizzled rows (what TMA writes with
//                                       CU_TENSOR_MAP_SWIZZLE_128B); byte offsets as in PTX
//   setmaxnreg_inc<N>(), setmaxnreg_dec<N>()
//                                       move registers between warpgroups (needs a register cap at
//                                       entry: __launch_bounds__(threads, 1))
//   pack2_e4m3(a, b), pack4_e4m3(a, b, c, d)
//                                       floats rounded to fp8 e4m3 (saturating), packed low byte
//                                       first: the 8-bit wgmma's register A fragments
#ifndef NAPKIN_HOPPER_CUH
#define NAPKIN_HOPPER_CUH

// (napkin: types.cuh already included)
// (napkin: memory.cuh already included)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NAPKIN_HAS_HOPPER 1
#else
#define NAPKIN_HAS_HOPPER 0
#endif

#if NAPKIN_HAS_HOPPER && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NAPKIN_HAS_WGMMA 1
#else
#define NAPKIN_HAS_WGMMA 0
#endif

#if NAPKIN_HAS_HOPPER

namespace napkin {

NAPKIN_DEVICE void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

NAPKIN_DEVICE void mbarrier_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

NAPKIN_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

NAPKIN_DEVICE u64 mbarrier_arrive(u64* bar) {
  u64 state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];\n"
               : "=l"(state)
               : "r"(smem_addr(bar))
               : "memory");
  return state;
}

NAPKIN_DEVICE u64 mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
  u64 state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  return state;
}

// Whether the phase with the given parity has completed (may wait a short while in hardware).
NAPKIN_DEVICE bool mbarrier_try_wait_parity(u64* bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

NAPKIN_DEVICE void mbarrier_wait(u64* bar, u32 parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

NAPKIN_DEVICE void bulk_copy_g2s(void* smem, const void* gmem, u32 bytes, u64* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(smem_addr(smem)), "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

NAPKIN_DEVICE void bulk_copy_s2g(void* gmem, const void* smem, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
}

NAPKIN_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most N bulk groups still read their shared-memory source.
template <int N>
NAPKIN_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Waits until at most N bulk groups are still incomplete (writes visible).
template <int N>
NAPKIN_DEVICE void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// The host's CUtensorMap: 128 bytes, 64-byte aligned (cuda.h is not available under NVRTC).
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

NAPKIN_DEVICE void prefetch_tensormap(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

NAPKIN_DEVICE void tma_load_2d(void* smem, const TensorMap* map, int x, int y, u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_addr(smem)), "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

NAPKIN_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#if NAPKIN_HAS_WGMMA
// Descriptor bits: [0,14) start address >> 4, [16,30) leading-dimension byte offset >> 4,
// [32,46) stride-dimension byte offset >> 4, [62,64) swizzle mode (1 = 128 bytes). The swizzle is
// a function of the address bits, so the operand's 1024-byte swizzle atoms must be 1024-aligned;
// a start address inside an atom (a 16-deep k slice of a K-major row) is then still valid.
NAPKIN_DEVICE u64 wgmma_desc_sw128(u32 addr, u32 lbo, u32 sbo) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<u64>((sbo & 0x3FFFF) >> 4) << 32) | (static_cast<u64>(1) << 62);
}

template <int N>
NAPKIN_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
NAPKIN_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

NAPKIN_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
NAPKIN_DEVICE void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
NAPKIN_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// fp8 (e4m3) operands of the 8-bit wgmma (k = 32; both shared-memory operands K-major).
// pack2_e4m3(a, b) rounds two floats to e4m3 (round to nearest, saturating at +-448; NaN stays
// NaN) as a 16-bit pair, a in the low byte; pack4_e4m3(a, b, c, d) four of them in one 32-bit
// register, a in byte 0: the byte order of a register A fragment (byte v holds k offset v).
NAPKIN_DEVICE u32 pack2_e4m3(float a, float b) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));  // first operand: high byte
  return r;
}
NAPKIN_DEVICE u32 pack4_e4m3(float a, float b, float c, float d) {
  return pack2_e4m3(a, b) | (pack2_e4m3(c, d) << 16);
}
#endif  // NAPKIN_HAS_WGMMA

}  // namespace napkin

#endif  // NAPKIN_HAS_HOPPER

#endif  // NAPKIN_HOPPER_CUH
// halfmath.cuh — elementwise functions for kernels that store their values in 16-bit floats.
//
// A kernel whose arrays are bf16 or fp16 computes in fp32 and rounds each result to 8 (bf16) or 11
// (fp16) significant bits: half an ULP there is 2^-9 or 2^-12 relative. libm's fp32 functions are
// correct to an fp32 ULP (2^-24) and cost 25-30 instructions each (logf, log1pf, expm1f; an IEEE
// division about 10), which makes a bf16 chain of two or three of them compute-bound: softplus then
// log ran at 38 % of the copy rate on an H100. The forms here use the special-function unit's
// approximations (__expf, __logf, __fdividef: 2-4 instructions each) and are within 2^-15 relative
// of the exact function wherever the result is a normal fp32 number (within FLT_MIN of it below):
// far under the 16-bit rounding, so the rounded result is the correctly rounded one but for results
// within a few fp32 ULP of a rounding boundary. Where an approximation loses relative accuracy (__logf near
// 1, where its error is 2^-21.4 absolute; e^x - 1 near 0) a short Taylor polynomial takes over: for
// |u| < 1/32 its first omitted term is below 2^-17 relative. The edge values are those of the fp32
// forms in napkin/diagrams/functions.py: ±inf, NaN and the sign of zero.
//
// The forms compute both sides of a test and then select (hm_select, a selp): a ternary with
// __logf or __expf on one side compiles to a branch, which diverges under random signs (and then
// runs both sides anyway) and keeps the compiler from interleaving the values a thread holds in
// flight. Measured on an H200, bf16 over 8192 x 4096, eight vectors a thread, kernels' time:
// log(softplus(x) + 1) 47.9 us with the branches and 37.6 without, selu then hardtanh 39.1 and 35.1,
// mish 36.7 and 34.5. hm_silu alone keeps its branch (see there).
//
// Provides: hm_select, hm_log, hm_log1p, hm_expm1, hm_sigmoid, hm_silu, hm_gelu, hm_div.
// napkin.diagrams.functions' half forms (ElementwiseFn.cuda_half) call them; tests/diagrams/
// test_functions_edges.py checks them on the host (exact libm in place of the approximations) and
// test_functions_gpu.py on the GPU.
#ifndef NAPKIN_HALFMATH_CUH
#define NAPKIN_HALFMATH_CUH

// (napkin: types.cuh already included)

namespace napkin {

// c ? a : b with both already computed, as a selp on the device (the host build of
// the tests takes the plain ternary).
NAPKIN_DEVICE float hm_select(bool c, float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("{\n .reg .pred p;\n setp.ne.u32 p, %3, 0;\n selp.f32 %0, %1, %2, p;\n}"
      : "=f"(r) : "f"(a), "f"(b), "r"(static_cast<unsigned>(c)));
  return r;
#else
  return c ? a : b;
#endif
}

// ln(1 + u): u - u^2/2 + u^3/3 for |u| < 1/32 (omitted u^4/4: < 2^-17.6 relative), else __logf(1 + u)
// (1 + u is then at least 2^-5 from 1, so __logf's 2^-21.4 absolute error is under 2^-16 relative).
// hm_log1p(-1) = -inf, u < -1 gives NaN, -0.0 stays -0.0.
NAPKIN_DEVICE float hm_log1p(float u) {
  const float poly = u * (1.0f + u * (-0.5f + u * 0.333333343f));
  return hm_select(fabsf(u) < 0.03125f, poly, __logf(1.0f + u));
}

// ln x, through hm_log1p near 1 (x - 1 is exact there); __logf elsewhere: hm_log(0) = -inf,
// x < 0 gives NaN, inf gives inf, subnormal x keeps __logf's relative accuracy.
NAPKIN_DEVICE float hm_log(float x) {
  const float u = x - 1.0f;
  const float poly = u * (1.0f + u * (-0.5f + u * 0.333333343f));
  return hm_select(fabsf(u) < 0.03125f, poly, __logf(x));
}

// e^x - 1: x + x^2/2 + x^3/6 for |x| < 1/32 (omitted x^4/24: < 2^-19 relative), else __expf(x) - 1
// (the subtraction is exact to an ULP of the result there). -inf gives -1, -0.0 stays -0.0.
NAPKIN_DEVICE float hm_expm1(float x) {
  const float poly = x * (1.0f + x * (0.5f + x * 0.166666672f));
  return hm_select(fabsf(x) < 0.03125f, poly, __expf(x) - 1.0f);
}

// 1/(1 + e^-x). __fdividef returns 0 for a divisor beyond 2^126, that is for x below -87.3, where
// the exact value is below 2^-126 (FLT_MIN). sigmoid(-inf) = 0, sigmoid(inf) = 1.
NAPKIN_DEVICE float hm_sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

// x/(1 + e^-x). Below x = -80, x·e^x (e^x/(1 + e^x) differs from e^x by a relative e^x < 2^-115),
// where __fdividef would return 0 for a result near -1e-36. silu(-inf) = -inf·0 = NaN, as
// torch.nn.functional.silu and the fp32 form give. The one form here that keeps a branch: it is
// taken only below -80, so a warp never diverges on it, and the branch-free forms tried (one
// exponential of -|x| and a select) cost the mma.sync 128 x 256 contraction's epilogue 4-8 bytes
// of spills on sm_90a, where the accumulators hold 255 registers.
NAPKIN_DEVICE float hm_silu(float x) {
  return x < -80.0f ? x * __expf(x) : __fdividef(x, 1.0f + __expf(-x));
}

// x·Φ(x) = x·(1 + erf(x/√2))/2, the erf form of GELU, from erfc(z) for z = |x|/√2 as
// t·exp(-z² + P(t)), t = 1/(1 + z/2), with P the degree-9 Chebyshev fit of Numerical Recipes'
// erfcc (relative error under 1.2e-7 for every z >= 0): x·erfc(z)/2 below 0, where 1 + erf would
// cancel, and x·(2 - erfc(z))/2 from 0 (2 - erfc lies in [1, 2]). No branch (libm's erff has
// several); about 15 instructions and one exponential. __expf's error grows with its argument
// (2 + 1.17·|a| ULP) and reaches 2^-16 relative where the result leaves the normal numbers
// (x near -13.2); z² rounds within 2^-24 relative. gelu(-inf) = -inf·0 = NaN as the fp32 form's
// erff gives; gelu(inf) = inf, gelu(-0.0) = -0.0.
NAPKIN_DEVICE float hm_gelu(float x) {
  const float z = fabsf(x) * 0.707106781f;
  const float t = __fdividef(1.0f, 1.0f + 0.5f * z);
  const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                  t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                  t * (-0.82215223f + t * 0.17087277f))))))));
  const float c = t * __expf(p - z * z);
  return 0.5f * x * hm_select(x < 0.0f, c, 2.0f - c);
}

// x / y: __fdividef (2 ULP), both scaled by 1/4 where |y| > 2^126, the range where it returns 0
// (the scaling is exact but for a subnormal x, whose quotient by such a y underflows anyway).
// The IEEE division's code (a Newton step and a slow path for special operands) held a softmax's
// output map over 4096² bf16 to 37.6 µs on an H100 (60 % of the copy rate) at eight vectors in
// flight per thread, against 23.2 µs with a product in its place. ±inf, NaN, ±0.0 and subnormal
// divisors give what the IEEE division gives.
NAPKIN_DEVICE float hm_div(float x, float y) {
  const bool big = fabsf(y) > 8.50705917e37f;
  return __fdividef(big ? x * 0.25f : x, big ? y * 0.25f : y);
}

}  // namespace napkin

#endif  // NAPKIN_HALFMATH_CUH

#endif  // NAPKIN_CUH
#ifndef INFINITY  // the whitelisted masks write -INFINITY; NVRTC need not define it
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e_cfg {
typedef __nv_bfloat16 T;
constexpr int BM = 128;              // g_a: rows of the block tile
constexpr int BN = 256;              // the wgmma N: g_c columns of the block tile (twice them, dual)
constexpr bool DUAL = false;         // two sums share the A tiles (B2 after B in each slot)
constexpr int BNO = DUAL ? BN / 2 : BN;   // g_c: output columns of the block tile
constexpr int BK = 64;                    // s_b: 64 elements = one 128-byte swizzled row
constexpr int WM = 64;              // w_a: rows per consumer warpgroup
constexpr int STAGES = 4;      // slots in the shared-memory ring
constexpr int GROUP_M = 8;    // block rows walked together (L2 reuse of B)
constexpr bool A_KMAJOR = true; // A stored [a][b] (true) or [b][a] (false)
constexpr bool B_KMAJOR = true; // B stored [c][b] (true, nn.Linear) or [b][c] (false)
constexpr bool PINGPONG = false;  // two consumers, each owning whole tiles, alternating items
constexpr int CONSUMERS = PINGPONG ? 2 : BM / WM;  // consumer warpgroups
constexpr int READERS = PINGPONG ? 1 : CONSUMERS;  // consumer warpgroups reading each ring slot
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int MT = WM / 64;               // 64-row wgmma pieces per consumer
constexpr int ROW = 128;                  // bytes of one swizzled row (BK elements)
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int C_LD = BNO + 8;             // the staging tile [BM][BNO + 8]: conflict-free writes
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;
constexpr bool PROLOGUE = false;   // RMSNorm over k of A, folded into the A tiles
constexpr bool PERSISTENT = true;  // blocks walk several work items (see the schedule)
// chunks consumer 0 runs ahead of consumer 1 (staggered epilogues; 0: none). A slot is refilled
// once both have released it, one chunk after they issue its wgmma: STAGES - 2 keeps the leader
// from waiting on the follower
constexpr int LEAD = (false && PERSISTENT && !PINGPONG && CONSUMERS == 2) ? STAGES - 2 : 0;
constexpr int CLUSTER = 1;    // blocks of a cluster: tiles CLUSTER apart in a, one B tile
static_assert(CLUSTER == 1 || (CLUSTER == 2 && PERSISTENT && !DUAL), "clusters of 2, persistent, one sum");
static_assert(!PINGPONG || (WM == BM && PERSISTENT && CLUSTER == 1), "ping-pong: whole tiles a consumer, persistent, no cluster");
constexpr int E_LD = 64 + 8;              // a consumer's own staging block [64][64 + 8] (PERSISTENT)
constexpr int E_BYTES = PERSISTENT ? CONSUMERS * 64 * E_LD * 2 : 0;
static_assert(BM % WM == 0 && WM % 64 == 0 && BN % 64 == 0 && BN <= 256, "64-row pieces, 64-column blocks, N <= 256");
static_assert(STAGES <= 8, "the barriers take 128 bytes behind the ring");
static_assert(STAGE_BYTES % 1024 == 0, "every tile starts on a 1024-byte swizzle atom");
static_assert(BM * C_LD * 2 <= STAGES * STAGE_BYTES, "the staging tile fits in the ring");
static_assert(!PERSISTENT || (BNO % 64 == 0 && !PROLOGUE), "persistent blocks stage 64-column blocks beside the ring");

// One work item: its tile's first row and column, its chunks KT0 .. KT0 + KT - 1 of the sum, its
// share of a split sum, its batch element (zb) and that element's index along each batch axis.
struct Item {
  int m0, n0, KT0, KT, split, zb;
  int bi[1];
};

// Operand descriptors (128-byte swizzle). K-major ([rows][64 k]): 8-row groups 1024 bytes apart
// (SBO), a 16-deep k slice starts 32 bytes further into the row. MN-major ([64 k][64 mn] blocks):
// 8-deep k groups 1024 bytes apart (SBO), 64-wide mn blocks BK * 128 bytes apart (LBO), a 16-deep
// k slice starts 16 rows further.
__device__ __forceinline__ napkin::u64 desc_a(napkin::u32 tile, int piece, int kk) {
  if (A_KMAJOR) return napkin::wgmma_desc_sw128(tile + piece * 64 * ROW + kk * 32, 16, 1024);
  return napkin::wgmma_desc_sw128(tile + piece * BK * ROW + kk * 16 * ROW, BK * ROW, 1024);
}
__device__ __forceinline__ napkin::u64 desc_b(napkin::u32 tile, int kk) {
  if (B_KMAJOR) return napkin::wgmma_desc_sw128(tile + kk * 32, 16, 1024);
  return napkin::wgmma_desc_sw128(tile + kk * 16 * ROW, BK * ROW, 1024);
}

// The other half of a named barrier: bar.arrive counts this warp's threads toward `threads` and
// goes on (the ping-pong consumers hand the main loop to each other with it).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Cluster helpers (CLUSTER > 1): this block's rank, a barrier of every thread of the cluster, an
// arrival on the barrier at the same place in block `rank`'s shared memory, and a TMA copy that
// lands at the same place in every block of `mask` (completing on each one's barrier there).
__device__ __forceinline__ int cluster_rank() {
  napkin::u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void arrive_in(napkin::u64* bar, int rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
      ::"r"(napkin::smem_addr(bar)), "r"(rank) : "memory");
}
__device__ __forceinline__ void tma_load_2d_multicast(void* smem, const napkin::TensorMap* map, int x, int y,
                                                      napkin::u64* bar, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {" "%2, %3}], [%4], %5;\n"  // (split so that the template engine reads no tag)
      ::"r"(napkin::smem_addr(smem)), "l"(reinterpret_cast<napkin::u64>(map)), "r"(x), "r"(y),
        "r"(napkin::smem_addr(bar)), "h"(mask)
      : "memory");
}

// d[64 x BN piece] += A(desc) * B(desc): one wgmma.m64nNk16, fp32 accumulators in registers.
__device__ __forceinline__ void wgmma_piece(float (&d)[BN / 2], napkin::u64 da, napkin::u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}
}  // namespace napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e_cfg

extern "C" __global__ void __launch_bounds__(napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e_cfg::THREADS, 1)napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e(
    const __grid_constant__ napkin::TensorMap tmA,
    const __grid_constant__ napkin::TensorMap tmB,
    __nv_bfloat16* __restrict__ Y,
    int M,
    int N,
    int K,
    int ldy,
    const __nv_bfloat16* __restrict__ x_bias)
{
#if NAPKIN_HAS_WGMMA
  using namespace napkin_mm_wgmma_bf16_128x256x64_w64_s4_kk_6fb8cc1e_cfg;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // the swizzle atoms need 1024-byte alignment: round the dynamic base up (the launch asks for
  // 1024 bytes more than the ring, and 128 for the barriers behind it)
  unsigned char* ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<napkin::u64>(smem_raw) + 1023) & ~static_cast<napkin::u64>(1023));
  napkin::u64* full = reinterpret_cast<napkin::u64*>(ring + STAGES * STAGE_BYTES);
  napkin::u64* empty = full + STAGES;

  // ---- the work items: tiles x shares of the sum x batch elements (a cluster's item: CLUSTER tiles
  // of consecutive block rows, one to each of its blocks)
  const int tiles_m = (M + BM * CLUSTER - 1) / (BM * CLUSTER), tiles_n = (N + BNO - 1) / BNO;
  const int TILES = tiles_m * tiles_n;
  const int per_group = GROUP_M * tiles_n;
  const int KT_IN = (K + BK - 1) / BK;  // chunks of b per index of the outer sum axes
  const int WORK = TILES * 1;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      napkin::mbarrier_init(&full[s], 1);                 // the producer's expect_tx arrival
      napkin::mbarrier_init(&empty[s], READERS * 4 * CLUSTER);  // one arrival per reading consumer warp of the cluster
    }
    napkin::fence_mbarrier_init();
  }
  __syncthreads();
  const int crank = 0;

  // ---- work item `work`'s coordinates (the producer and the consumers walk the same items)
  auto item_of = [&](int work) -> Item {
    Item c;
    const int pid = work % TILES;  // grouped rasterisation over (a, c) tiles
    c.split = 0;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = (tiles_m - first_m < GROUP_M) ? tiles_m - first_m : GROUP_M;
    c.m0 = ((first_m + (pid % per_group) % group_rows) * CLUSTER + crank) * BM;
    c.n0 = ((pid % per_group) / group_rows) * BNO;
    // its chunks KT0 .. KT0 + KT - 1: its share of the sum (the last shares may be empty)
    const int KT_ALL = KT_IN;
    c.KT0 = 0;
    c.KT = KT_ALL;
    c.zb = 0;
    return c;
  };
  const int ctid = tid - 128;              // consumers: 0 .. 128 * CONSUMERS
  const int cw = wg - 1;                   // this consumer: 0 .. CONSUMERS - 1
  const int row0 = PINGPONG ? 0 : cw * WM; // its rows of the tile: row0 .. row0 + WM - 1
  const int lane = tid & 31;
  // chunks through the ring so far: the producer's and every consumer's count agree, and run on
  // across work items (a slot's phase is (it / STAGES) & 1)
  int it = 0;
  if (wg == 0) {
    // ---------------- producer: TMA HBM -> SMEM, STAGES chunks ahead
    napkin::setmaxnreg_dec<PRODUCER_REGS>();
    if (tid == 0) {
      napkin::prefetch_tensormap(&tmA);
      napkin::prefetch_tensormap(&tmB);
      for (int work = blockIdx.x / CLUSTER; work < WORK; work += gridDim.x / CLUSTER) {
        const Item c = item_of(work);
        const int m0 = c.m0, n0 = c.n0, KT0 = c.KT0, KT = c.KT;
        // this batch element's first row in each operand's flattened rows
        const int row_a = 0;
        const int row_b = 0;
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int s = it % STAGES;
        if (it >= STAGES) napkin::mbarrier_wait(&empty[s], ((it / STAGES) - 1) & 1);
        unsigned char* a_s = ring + s * STAGE_BYTES;
        unsigned char* b_s = a_s + A_BYTES;
        napkin::mbarrier_arrive_expect_tx(&full[s], STAGE_BYTES);
        const int k0 = (KT0 + kt) * BK;
        const int ra = row_a, rb = row_b;
        if (A_KMAJOR) {
          napkin::tma_load_2d(a_s, &tmA, k0, ra + m0, &full[s]);
        } else {
#pragma unroll
          for (int j = 0; j < BM / 64; ++j) napkin::tma_load_2d(a_s + j * BK * ROW, &tmA, m0 + 64 * j, ra + k0, &full[s]);
        }
        if (B_KMAJOR) {
          napkin::tma_load_2d(b_s, &tmB, k0, rb + n0, &full[s]);
        } else {
#pragma unroll
          for (int j = 0; j < BNO / 64; ++j) napkin::tma_load_2d(b_s + j * BK * ROW, &tmB, n0 + 64 * j, rb + k0, &full[s]);
        }
      }
      }
    }
  } else {
    // ---------------- consumers: wgmma from SMEM, accumulators in registers
    napkin::setmaxnreg_inc<CONSUMER_REGS>();
    // a slot is free for the next copy once every consumer warp of the cluster has read it (the
    // copies into it come from every block: each block's "empty" counts the cluster's warps)
    auto release = [&](napkin::u64* bar) {
      napkin::mbarrier_arrive(bar);
    };
    // the stagger: consumer 1 waits until consumer 0 has issued LEAD chunks (or all of its own)
    bool lead_given = LEAD == 0 || cw != 0;
    if (LEAD > 0 && cw == 1) napkin::named_barrier_sync(6, 256);
    int nth = 0;  // this block's items so far (PINGPONG: consumer nth % 2 takes item nth)
    for (int work = blockIdx.x / CLUSTER; work < WORK; work += gridDim.x / CLUSTER, ++nth) {
    const Item c = item_of(work);
    const int m0 = c.m0, n0 = c.n0, KT = c.KT;
    T* const Yt = Y + (0);
    float d[MT][BN / 2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < BN / 2; ++j) d[i][j] = 0.f;
    const napkin::u32 ring_addr = napkin::smem_addr(ring);
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int s = it % STAGES;
      napkin::mbarrier_wait(&full[s], (it / STAGES) & 1);
      const napkin::u32 a_t = ring_addr + s * STAGE_BYTES, b_t = a_t + A_BYTES;
      napkin::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
        for (int i = 0; i < MT; ++i) wgmma_piece(d[i], desc_a(a_t, row0 / 64 + i, kk), desc_b(b_t, kk));
      napkin::wgmma_commit();
      if (!lead_given && it + 1 >= LEAD) {  // consumer 0 has issued LEAD chunks: consumer 1 may start
        named_barrier_arrive(6, 256);
        lead_given = true;
      }
      // one chunk's wgmma stay in flight; the one before has finished reading its slot
      napkin::wgmma_wait<1>();
      if (kt > 0 && lane == 0) release(&empty[(it - 1) % STAGES]);
    }
    napkin::wgmma_wait<0>();
    // the epilogue reads the accumulators only after the wait: without this fence the compiler
    // may move those reads above it (the asm names no accumulator), and ptxas then serializes
    // every wgmma of the loop (warning C7514; a split row sum ran 2.3 % slower on an H100)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < BN / 2; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
    // the last chunk's slot: every wgmma has read it
    if (KT > 0 && lane == 0) release(&empty[(it - 1) % STAGES]);

    // ---- epilogue in registers (fp32), rounded to T into the staging tile. Accumulator layout
    // of a 64 x BN piece: register r of lane l in warp w is row w*16 + l/4 + 8*((r/2)%2),
    // column (r/4)*8 + 2*(l%4) + r%2.
    // this consumer's own staging block behind the ring (below)
    T* sE = reinterpret_cast<T*>(ring + STAGES * STAGE_BYTES + 128) + cw * 64 * E_LD;
    auto epilogue = [&](float acc, int i_b_s, int i_f) -> float {
      const float e1 = napkin::to_float(x_bias[(long long)(i_f)]);
      const float e2 = (acc + e1);
      const float e3 = napkin::hm_gelu(e2);
      return e3;
    };
    const int w = (ctid / 32) % 4, g = lane >> 2, t = lane & 3;
    // ---- this consumer's rows leave 64 x 64 at a time through its own staging block behind the
    // ring (the producer is already filling the ring with the next item's chunks); a warpgroup
    // barrier before the block is read and another before it is written again
    const int ct = ctid - cw * 128;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int cb = 0; cb < BNO / 64; ++cb) {
        const int r0 = m0 + row0 + i * 64, c0 = n0 + cb * 64;  // the block's first row and column
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = w * 16 + g + 8 * h;
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = cb * 8 + jj, col = jj * 8 + 2 * t;
            float v0 = d[i][4 * j + 2 * h], v1 = d[i][4 * j + 2 * h + 1];
            // every element runs the maps at its indices clamped into M x N (store_tile leaves
            // those outside): behind a bounds check each read waited for the one before (H100,
            // 4096 x 128 x 128 bf16 divided by a row vector: 6.5 us of kernel with the branches,
            // 4.1 clamped, 3.8 for the product alone)
            const int erow = min(r0 + row, M - 1), gcol = c0 + col;
            v0 = epilogue(v0, erow, min(gcol, N - 1));
            v1 = epilogue(v1, erow, min(gcol + 1, N - 1));
            *reinterpret_cast<napkin::u32*>(sE + row * E_LD + col) = napkin::Traits<T>::pack2(v0, v1);
          }
        }
        napkin::named_barrier_sync(2 + cw, 128);
        napkin::store_tile<T, 64, 64, 128>(Yt + static_cast<long long>(r0) * ldy + c0, ldy, sE, E_LD, M - r0, N - c0, ct);
        napkin::named_barrier_sync(2 + cw, 128);
      }
    }
    if (!lead_given) named_barrier_arrive(6, 256);  // fewer than LEAD chunks in all: consumer 1 waits for none
  }
#else
  // built for a target without wgmma: the launcher never picks this template there
  __trap();
#endif
}
