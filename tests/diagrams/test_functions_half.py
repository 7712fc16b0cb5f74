"""The 16-bit forms of the elementwise functions (``ElementwiseFn.cuda_half``, ``halfmath.cuh``).

A bf16 or fp16 kernel rounds its results to 8 or 11 significant bits, so its maps use faster forms
built on the special-function unit's approximations (``__expf``, ``__logf``, ``__fdividef``). The
claim, in ``napkin/kernels/cuda/halfmath.cuh``: each form is within 2^-15 relative of the exact
function wherever the result is a normal fp32 number (within FLT_MIN of it below), with the fp32
form's edge values (NaN, ±inf, the sign of zero).

The host check compiles each half form with the approximations *emulated at their documented worst
error* (CUDA's math API: ``__expf`` 2 + floor(1.173·|x|) ULP; ``__logf`` 2^-21.41 absolute on
[0.5, 2], 3 ULP elsewhere; ``__log2f`` 2^-22 absolute on [0.5, 2], 2 ULP elsewhere, a subnormal
input flushed to zero; ``exp2f`` 2 ULP; ``__fdividef`` 2 ULP, and 0 for a divisor beyond 2^126), once pushed up
and once down, and once exact: the bound must hold in all three, so the polynomials' thresholds,
coefficients and branches are checked, not only the edge values. ``test_functions_gpu.py`` runs
the real forms on the GPU (fp32 outputs, against the same bound, and bf16 kernels).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from napkin.codegen.render import Code, half_math, map_expr
from napkin.diagrams.functions import FUNCTIONS
from napkin.kernels.library import header_text

from test_functions_edges import CXX, FLT_MIN, NVCC, UNARY_CASES, fp32_disagreement, inputs, reference, run_host

#: The bound of the half forms, relative.
HALF_REL = 2.0 ** -15

#: Inputs at the forms' seams: the polynomial thresholds (|u| = 1/32 around 0 and around 1), -80 and
#: -87.3 (where __expf's e^x leaves the normal numbers: silu's product), sigmoid's divisor passing
#: 2^126 (x near -87.34), mish's 20.
SEAMS = [0.03125, -0.03125, 0.0312, -0.0312, 0.0313, -0.0313, 1.03125, 0.96875, 1.0312, 0.9688, 1.0313,
         0.9687, 1.0 + 2 ** -23, 1.0 - 2 ** -24, 2 ** -20, -2 ** -20, 0.5, 2.0, 0.4999, 2.0001, -80.0, -80.001,
         -79.999, -87.3, -87.34, -87.4, 19.999, 20.0, 20.001, -0.0, 1e-30, -1e-30, 7.0, -7.0, 15.9, -15.9]

HALF_CASES = [(fn, p) for fn, p in UNARY_CASES if FUNCTIONS[fn].cuda_half]

#: The approximations at their documented worst error, pushed by NAPKIN_S (+1, -1 or 0 for exact).
EMULATION = r"""
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#define NAPKIN_DEVICE static inline
static const double NAPKIN_S = SIGN;
static inline float emulated_expf(float x) {
  const float e = expf(x);
  if (!std::isfinite(e) || e == 0.0f) return e;
  return (float)((double)e * (1.0 + NAPKIN_S * (2.0 + std::floor(std::fabs(1.173 * x))) * 0x1p-23));
}
static inline float emulated_logf(float x) {
  const float l = logf(x);
  if (!std::isfinite(l)) return l;
  if (x >= 0.5f && x <= 2.0f) return (float)((double)l + NAPKIN_S * std::pow(2.0, -21.41));
  return (float)((double)l * (1.0 + NAPKIN_S * 3.0 * 0x1p-23));
}
static inline float emulated_log2f(float x) {
  if (std::fabs(x) < 0x1p-126f) x = std::copysign(0.0f, x);  // the device flushes a subnormal input
  const float l = log2f(x);
  if (!std::isfinite(l)) return l;
  if (x >= 0.5f && x <= 2.0f) return (float)((double)l + NAPKIN_S * 0x1p-22);
  return (float)((double)l * (1.0 + NAPKIN_S * 2.0 * 0x1p-23));
}
static inline float emulated_exp2f(float x) {
  const float e = exp2f(x);
  if (!std::isfinite(e) || e == 0.0f) return e;
  return (float)((double)e * (1.0 + NAPKIN_S * 2.0 * 0x1p-23));
}
static inline float emulated_fdividef(float a, float b) {
  if (std::fabs(b) > 0x1p126f) return std::isinf(a) ? NAN : a * 0.0f * (b < 0 ? -1.0f : 1.0f);
  int e;
  if (std::frexp(b, &e) == 0.5f || std::frexp(b, &e) == -0.5f) return a / b;  // rcp of 2^k is exact
  return (float)((double)(a / b) * (1.0 + NAPKIN_S * 2.0 * 0x1p-23));
}
#define __expf emulated_expf
#define __logf emulated_logf
#define __fdividef emulated_fdividef
#define __log2f emulated_log2f
#define exp2f emulated_exp2f
static inline float f_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
"""


def half_inputs() -> np.ndarray:
    return np.concatenate([inputs(seed=2), np.array(SEAMS, dtype=np.float32)])


def half_disagreement(got: float, want64: float) -> str | None:
    """Why ``got`` breaks the half forms' claim against the float64 reference (None: it keeps it):
    the fp32 forms' edge rules, then 2^-15 relative for a normal result."""
    edge = fp32_disagreement(got, want64, ulps=math.inf)
    with np.errstate(over="ignore"):
        want = float(np.float32(want64))
    if edge is not None or not math.isfinite(want) or want64 == 0 or abs(want64) < FLT_MIN:
        return edge
    rel = abs(got - want64) / abs(want64)
    return None if rel <= HALF_REL else f"relative error 2^{math.log2(rel):.1f}"


def half_bound_failures(got_rows, x64: np.ndarray) -> list[str]:
    """Every input where a half form of HALF_CASES (row k of ``got_rows``) breaks the claim."""
    bad = []
    for k, (fn, params) in enumerate(HALF_CASES):
        want = reference("torch", fn, params, x64)
        for xi, g, w in zip(x64.tolist(), list(got_rows[k]), want.tolist()):
            why = half_disagreement(float(g), w)
            if why:
                bad.append(f"{fn}{params}({xi!r}) = {float(g)!r}, reference {w!r}: {why}")
    return bad


def run_half_host(sign: int, x: np.ndarray, tmp) -> dict[int, np.ndarray]:
    """Each half form of HALF_CASES on ``x``, compiled with the approximations pushed by ``sign``."""
    # the header's functions on the host: its include of the device types gives way to NAPKIN_DEVICE above
    header = header_text("halfmath.cuh").replace('#include "types.cuh"', "")
    prelude = EMULATION.replace("SIGN", f"{float(sign)!r}") + header
    return run_host([(fn, params, 1) for fn, params in HALF_CASES], [x], tmp, prelude=prelude, half=True,
                    stem=f"half{sign}")


def test_the_functions_with_half_forms_are_the_costly_ones():
    have = {fn for fn, f in FUNCTIONS.items() if f.cuda_half}
    assert {"log", "sigmoid", "silu", "softplus", "mish", "selu", "elu"} <= have
    for fn in have:  # a half form differs from the fp32 one, and names only napkin's helpers
        f = FUNCTIONS[fn]
        assert f.cuda_half != f.cuda
        assert not any(libm in f.cuda_half for libm in ("logf(", "log1pf(", "expm1f(", " expf(")), fn


def test_half_forms_are_taken_for_16_bit_kernels_only():
    assert half_math("bf16") and half_math("fp16") and not half_math("fp32")
    assert map_expr("selu", [Code("x")], half=True) != map_expr("selu", [Code("x")])
    assert map_expr("relu", [Code("x")], half=True) == map_expr("relu", [Code("x")])


@pytest.mark.skipif(CXX is None and NVCC is None, reason="no host C++ compiler (g++ or nvcc) here")
@pytest.mark.parametrize("sign", [1, -1, 0], ids=["approximations high", "approximations low", "exact"])
def test_half_forms_keep_their_bound_at_the_approximations_worst(sign, tmp_path):
    x = half_inputs()
    got = run_half_host(sign, x, tmp_path)
    bad = half_bound_failures([got[k].tolist() for k in range(len(HALF_CASES))], x.astype(np.float64))
    assert not bad, f"{len(bad)} disagreements:\n" + "\n".join(bad[:40])


def test_a_wrong_coefficient_is_caught(tmp_path, monkeypatch):
    """The check above can fail: without log's cubic term the bound breaks near 1 ± 1/32."""
    if CXX is None and NVCC is None:
        pytest.skip("no host C++ compiler (g++ or nvcc) here")
    import test_functions_half as me

    good = header_text("halfmath.cuh")
    assert good.count("0.333333343f") == 2
    monkeypatch.setattr(me, "header_text", lambda name: good.replace("0.333333343f", "0.0f"))
    x = np.array([0.0312, -0.0312, 1.0312, 0.9688], dtype=np.float32)
    got = run_half_host(0, x, tmp_path)
    k = next(i for i, (fn, _) in enumerate(HALF_CASES) if fn == "log")
    want = reference("torch", "log", (), x.astype(np.float64))
    assert any(half_disagreement(g, w) for g, w in zip(got[k].tolist(), want.tolist()))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_half_forms_compile_without_branches(tmp_path):
    """Each half form selects between sides it has computed (``hm_select``) instead of branching:
    a branch around ``__logf`` or ``__expf`` diverges under random signs and keeps the compiler
    from interleaving the vectors a thread holds in flight (selu then hardtanh over 8192 x 4096
    bf16 on an H200: 39.1 us with eight vectors a thread and the branches, 35.1 without). The PTX
    of a kernel that applies one form to one value holds no ``bra`` instruction. silu keeps its
    branch below -80, which no warp diverges on (see ``hm_silu``); a pow of an exponent beyond 64
    is libm's powf."""
    import re
    import subprocess

    from napkin.kernels.library import inline_library

    body = []
    # (a pow of |p| > 64 is powf itself: hm_pow's bound holds below that)
    cases = [(fn, params) for fn, params in HALF_CASES
             if fn != "silu" and not (fn == "pow" and abs(params[0]) > 64)]
    for k, (fn, params) in enumerate(cases):
        body.append(f"extern \"C\" __global__ void k{k}(const float* in, float* out) {{\n"
                    f"  const float v0 = in[threadIdx.x];\n"
                    f"  out[threadIdx.x] = {map_expr(fn, [Code('v0')], params, half=True)};\n}}\n")
    src = tmp_path / "forms.cu"
    src.write_text(inline_library('#include "halfmath.cuh"\n' + "".join(body), filename="forms.cu"))
    ptx = tmp_path / "forms.ptx"
    subprocess.run([NVCC, "-ptx", "-std=c++17", "-O3", "-arch=sm_90a", "-o", str(ptx), str(src)],
                   check=True, capture_output=True, timeout=300)
    text = ptx.read_text()
    kernels = re.split(r"\.visible \.entry ", text)[1:]
    assert len(kernels) == len(cases)
    branchy = [cases[int(re.match(r"k(\d+)", k).group(1))] for k in kernels
               if re.search(r"^\s*(@!?%p\d+\s+)?bra(\.uni)?\s", k, re.M)]
    assert not branchy, f"half forms that branch: {branchy}"
