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
//   tma_load_3d / 4d / 5d(smem, map, x, y, z[, w[, v]], bar)  the same for 3- to 5-D maps
//   tma_store_2d(map, smem, x, y), tma_store_3d(map, smem, x, y, z)
//                                       TMA tensor copy of a shared-memory box to element
//                                       coordinates (x innermost, y, z) of the map's tensor, in this
//                                       thread's bulk group (bulk_commit / bulk_wait_read); parts of
//                                       the box outside the tensor are not written
//   named_barrier_sync(id, threads)     a barrier among `threads` threads (bar.sync id; id 0 is
//                                       __syncthreads), for warp-specialised kernels
//   cluster_rank(), cluster_arrive_relaxed(), cluster_wait(), cluster_sync()
//                                       a block's rank in its cluster and the cluster's barrier
//   store_in_block(p, rank, v)          a float (or float4) stored at the place of p in block rank's
//                                       shared memory
//   load_from_block(p, rank)            the float4 at the place of p in block rank's shared memory
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

#include "types.cuh"
#include "memory.cuh"

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

// 3-, 4- and 5-D boxes (a tensor map whose dimensions are some of an array's axes in another order
// than memory's: the innermost, the tile's rows, then one per batch or outer-sum axis)
NAPKIN_DEVICE void tma_load_3d(void* smem, const TensorMap* map, int x, int y, int z, u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_addr(smem)), "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar))
      : "memory");
}

NAPKIN_DEVICE void tma_load_4d(void* smem, const TensorMap* map, int x, int y, int z, int w, u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(smem_addr(smem)), "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(z), "r"(w),
        "r"(smem_addr(bar))
      : "memory");
}

NAPKIN_DEVICE void tma_load_5d(void* smem, const TensorMap* map, int x, int y, int z, int w, int v, u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
      ::"r"(smem_addr(smem)), "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(v),
        "r"(smem_addr(bar))
      : "memory");
}

NAPKIN_DEVICE void tma_store_2d(const TensorMap* map, const void* smem, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
      ::"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(smem)), "r"(x), "r"(y)
      : "memory");
}

NAPKIN_DEVICE void tma_store_3d(const TensorMap* map, const void* smem, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
      ::"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(smem)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

NAPKIN_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Thread-block clusters. A block may store into another block's shared memory only once that
// block has started: every thread arrives (cluster_arrive_relaxed) when it starts and waits
// (cluster_wait) before its first such store. cluster_sync is a barrier of every thread of the
// cluster that orders the stores before it (shared memory of any block) before the reads after it.
NAPKIN_DEVICE int cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}
NAPKIN_DEVICE void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
NAPKIN_DEVICE void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
NAPKIN_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Stores v at the place of `p` (this block's shared memory) in block `rank` of the cluster.
NAPKIN_DEVICE void store_in_block(float* p, int rank, float v) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nst.shared::cluster.f32 [ra], %2;\n}\n"
      ::"r"(smem_addr(p)), "r"(rank), "f"(v) : "memory");
}
NAPKIN_DEVICE void store_in_block(float4* p, int rank, float4 v) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "st.shared::cluster.v4.f32 [ra], {%2, %3, %4, %5};\n}\n"
      ::"r"(smem_addr(p)), "r"(rank), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
// The float4 at the place of `p` (this block's shared memory) in block `rank` of the cluster.
NAPKIN_DEVICE float4 load_from_block(const float4* p, int rank) {
  float4 v;
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %4, %5;\n"
      "ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [ra];\n}\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(smem_addr(p)), "r"(rank) : "memory");
  return v;
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
