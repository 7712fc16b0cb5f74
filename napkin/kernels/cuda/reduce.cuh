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
//   pair_sum<EXACT>                       the sum the written-out diagram computes, from the pair
//   exp2_ftz, LOG2E, LN2                  2^x in one special-function op (subnormals flushed),
//                                         and the constants that turn e^x into 2^x and back
//   last_to_arrive                        the handshake of a reduction split over the blocks of a
//                                         launch: true in the last of `count` blocks to arrive
//
// The pair lets a row kernel find its softmax's max and sum in one round over the block (one
// barrier) instead of two dependent rounds. Every lane of a butterfly ends with the same bits: the
// merge is symmetric.
#ifndef NAPKIN_REDUCE_CUH
#define NAPKIN_REDUCE_CUH

#include "types.cuh"

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

// 2^x in one special-function op, subnormal results flushed to zero (ex2.approx.ftz): a term of
// a sum of exps that is at least 1, where a term under 2^-126 changes nothing.
NAPKIN_DEVICE float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// log2(e) and ln(2): e^(x - m) = 2^(x * LOG2E - m * LOG2E), one FMA and one exp2_ftz a value.
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// The largest |max| for which the shift m * LOG2E may be rounded once and subtracted from each
// x * LOG2E by an FMA: the rounding (half an ulp of m * LOG2E, at most 2^-11 below 8192 · LOG2E)
// scales every term of the sum alike by at most 2^-11 · ln 2, under a 16-bit value's rounding.
// Past it the error grows with |max| (at 1e30 it is 2^72 and the terms overflow): the exact path.
constexpr float FMA_SHIFT_MAX = 8192.f;

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
// sum is rescaled once for the N values, not once per value. Where FAST (16-bit values) and the
// new max is at most FMA_SHIFT_MAX in size, each exp is one FMA and one exp2_ftz. Otherwise a value equal to the new max
// adds 1 without an exp, as merge_max_sumexp does, so a max of -inf or +inf counts the values
// equal to it (merging them one by one gives the same). The N exps are independent.
template <int N, bool FAST>
NAPKIN_DEVICE void fold_max_sumexp(float& m, float& s, const float (&x)[N]) {
  float mm = m;
#pragma unroll
  for (int i = 0; i < N; ++i) mm = max_nan(mm, x[i]);
  if (FAST && fabsf(mm) <= FMA_SHIFT_MAX) {
    // a new max of moderate size (the usual case): every value is below it, equal to it or -inf,
    // so no select for infinities; each exp one FMA and one exp2_ftz. The sum so far was taken
    // against the old max's rounded shift, so it is rescaled by the difference of the two rounded
    // shifts (0 when the old max was -inf or far below)
    const float shift = __fmul_rn(mm, LOG2E);
    float t = s * exp2_ftz(__fmul_rn(m, LOG2E) - shift);
#pragma unroll
    for (int i = 0; i < N; ++i) t += exp2_ftz(fmaf(x[i], LOG2E, -shift));
    m = mm;
    s = t;
    return;
  }
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

// The pair's sum as the written-out diagram computes it, from the running (max m, sum s of
// exp(x - m)): with the max itself as the shift (EXACT) an infinite max makes x - m NaN for the
// values equal to it, so the sum is NaN; with zero_inf(max) as the shift a max of -inf gives 0
// and one of +inf gives +inf (s counts the values equal to an infinite max; NaN stays NaN).
template <bool EXACT>
NAPKIN_DEVICE float pair_sum(float m, float s) {
  if (!(fabsf(m) > 3.4028234663852886e38f)) return s;
  return EXACT ? __int_as_float(0x7fc00000) : s * (m > 0.f ? __int_as_float(0x7f800000) : 0.f);
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
