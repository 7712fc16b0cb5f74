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

#include "types.cuh"
#include "memory.cuh"
#include "reduce.cuh"
#include "mma.cuh"
#include "softmax.cuh"
#include "hopper.cuh"
#include "halfmath.cuh"

#endif  // NAPKIN_CUH
