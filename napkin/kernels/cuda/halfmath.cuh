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
// Provides: hm_select, hm_log, hm_log1p, hm_expm1, hm_sigmoid, hm_silu, hm_gelu, hm_div, hm_recip /
// hm_div_by, hm_pow.
// napkin.diagrams.functions' half forms (ElementwiseFn.cuda_half) call them; tests/diagrams/
// test_functions_edges.py checks them on the host (exact libm in place of the approximations) and
// test_functions_gpu.py on the GPU.
#ifndef NAPKIN_HALFMATH_CUH
#define NAPKIN_HALFMATH_CUH

#include "types.cuh"

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

// hm_div by a divisor shared by many dividends (a row's sum): its scaled reciprocal taken once,
// then one product a value. __fdividef(x, y) is x times the approximate reciprocal of y
// (div.approx.f32: d = a * (1/b)), so hm_div_by(x, hm_recip(y)) gives hm_div(x, y)'s bits with one
// special-function op a row instead of one a value.
struct HmRecip {
  float r;   // 1 / y, of y / 4 where |y| > 2^126
  bool big;  // the dividend is scaled by 1/4 too
};
NAPKIN_DEVICE HmRecip hm_recip(float y) {
  const bool big = fabsf(y) > 8.50705917e37f;
  return HmRecip{__fdividef(1.0f, big ? y * 0.25f : y), big};
}
NAPKIN_DEVICE float hm_div_by(float x, HmRecip d) { return (d.big ? x * 0.25f : x) * d.r; }

// x^p for the diagram's literal exponent p, with powf's edge values. powf carries log2 x in two
// floats (about 40 instructions): |x|^1.5 over 8192 x 4096 bf16 ran at 29 % of the copy rate on an
// H200. Here exp2f(p * __log2f(|x|)) (two special-function ops): __log2f's error is 2^-22 absolute
// on [0.5, 2] (|p| <= 64 keeps p times it under 2^-16 relative of the result) and 2 ULP elsewhere,
// which with the product's rounding is |t| * 2^-21.7 absolute on t = p * log2|x|; |t| < 128 for a
// normal result, so within 2^-15.2 relative, and exp2f adds 2 ULP. __log2f flushes a subnormal
// input to zero, so one is scaled by 2^24 first. The sign: a negative x (or -0.0, -inf) with an odd
// integer p gives -|x|^p, with a non-integer p NaN (but -0.0 and -inf, whose powers are +0 or +inf
// as powf gives). p is a literal, so every test of p folds away; p of 0, 1 and 2 are exact, and a
// |p| above 64 takes powf.
NAPKIN_DEVICE float hm_pow(float x, float p) {
  if (p == 0.0f) return 1.0f;  // pow(NaN, 0) = 1 too
  if (p == 1.0f) return x;
  if (p == 2.0f) return x * x;
  if (!(fabsf(p) <= 64.0f)) return powf(x, p);
  const bool integer = truncf(p) == p;
  const bool odd = integer && fmodf(p, 2.0f) != 0.0f;
  const float ax = fabsf(x);
  const bool tiny = ax < 1.17549435e-38f;
  const float l = __log2f(tiny ? ax * 16777216.0f : ax) - (tiny ? 24.0f : 0.0f);
  const float r = exp2f(p * l);
  const bool negative = copysignf(1.0f, x) < 0.0f;
  const float signed_r = hm_select(odd && negative, -r, r);
  return hm_select(!integer && x < 0.0f && ax <= 3.40282347e38f, sqrtf(-1.0f), signed_r);
}

}  // namespace napkin

#endif  // NAPKIN_HALFMATH_CUH
