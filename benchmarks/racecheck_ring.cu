// racecheck_ring.cu — what compute-sanitizer racecheck reports for a TMA-style ring slot read
// with plain loads (attention_bwd_wgmma's L and D rows): a producer warp fills slot s, consumer
// warps wait on full[s], read it, and release it with one arrival a warp on empty[s].
//
//   nvcc -arch sm_90a -lineinfo -I napkin/kernels/cuda -o /tmp/ring benchmarks/racecheck_ring.cu
//   compute-sanitizer --tool racecheck --racecheck-report all /tmp/ring MODE
//
// MODE 0: the slot filled by a bulk async copy completing on full[s] (complete_tx), as the kernel
//         does. H100, CUDA 13 (2026-11-24, the three modes then run in one process, 25,795
//         per-byte reports of which racecheck displayed 100): every displayed one is a WAR hazard
//         between a consumer's read and the bulk copy into the slot, although the reads are
//         ordered before that copy by the arrival on empty[s] (release) and the producer's wait
//         (acquire). attention_bwd_wgmma's L and D rows get the same reports.
// MODE 1: the slot filled by the producer warp's plain stores, released by lane 0's arrival on
//         full[s]. Alone under racecheck (H100, CUDA 13, 2026-11-24): 13,889 reports, every
//         displayed one a RAW hazard between a producer store (line 44) and a consumer read
//         (line 57) although the arrival on full[s] (release) and the wait (acquire) order them:
//         the arrival and the wait between plain accesses are not seen either. The Hopper
//         attention kernel's persistent blocks hand each tile's number to the consumers this way
//         (a plain store, published by the arrival on qbar, rewritten two tiles later after the
//         consumers' arrival on qempty): racecheck reports that as 64 WAR hazards
//         (benchmarks/sanitize.py's persistent_walk case), and the same change in
//         attention_bwd_wgmma turned its reports into RAW ones.
// MODE 2: MODE 0 with the consumers' fence.proxy.async before their arrival on empty[s]. Alone
//         under racecheck (same run): 5,953 reports, WAR between a consumer read and the bulk
//         copy, as in MODE 0: the proxy fence changes nothing the tool sees.
// Each prints the consumers' sum (94.0 for block 0's first consumer thread) to show it ran.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "hopper.cuh"
using namespace napkin;
constexpr int STAGES = 2, N = 128, CONS = 4;  // 4 consumer warps
__global__ void ring(const float* __restrict__ g, float* out, int iters, int mode) {
#if defined(__CUDA_ARCH__)
  __shared__ __align__(128) float buf[STAGES][N];
  __shared__ __align__(8) u64 full[STAGES], empty[STAGES];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) { mbarrier_init(&full[s], 1); mbarrier_init(&empty[s], CONS); }
    fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    for (int it = 0; it < iters; ++it) {
      const int s = it % STAGES;
      if (it >= STAGES) mbarrier_wait(&empty[s], ((it / STAGES) - 1) & 1);
      if (mode == 1) {
        const float4 v = reinterpret_cast<const float4*>(g + it * N)[lane];
        reinterpret_cast<float4*>(buf[s])[lane] = v;
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&full[s]);
      } else if (lane == 0) {
        mbarrier_arrive_expect_tx(&full[s], N * 4);
        bulk_copy_g2s(buf[s], g + it * N, N * 4, &full[s]);
      }
    }
  } else {
    float acc = 0.f;
    for (int it = 0; it < iters; ++it) {
      const int s = it % STAGES;
      mbarrier_wait(&full[s], (it / STAGES) & 1);
      for (int c = lane; c < N; c += 32) acc += buf[s][c] * (warp + 1);
      if (mode == 2) fence_proxy_async();
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&empty[s]);
    }
    out[blockIdx.x * 128 + tid - 32] = acc;
  }
#endif
}
int main(int argc, char** argv) {
  const int iters = 8;
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  if (mode < 0 || mode > 2) {
    fprintf(stderr, "MODE must be 0, 1 or 2\n");
    return 2;
  }
  float *g, *out;
  cudaMalloc(&g, iters * N * 4);
  cudaMalloc(&out, 128 * 4 * 2);
  float h[iters * N];
  for (int i = 0; i < iters * N; ++i) h[i] = (i % 7) * 0.5f;
  cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice);
  ring<<<2, 32 * (CONS + 1)>>>(g, out, iters, mode);
  cudaError_t e = cudaDeviceSynchronize();
  float o[2];
  cudaMemcpy(o, out, 8, cudaMemcpyDeviceToHost);
  printf("mode %d: %s out[0] %.1f\n", mode, cudaGetErrorString(e), o[0]);
  return e == cudaSuccess ? 0 : 1;
}
