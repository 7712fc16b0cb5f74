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
