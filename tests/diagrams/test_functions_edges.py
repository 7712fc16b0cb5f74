"""The elementwise functions users write (issue #12 part 4): each one's reference (torch and numpy)
follows torch.nn.functional, and its CUDA form agrees with the reference at the edges.

Edges: ±inf, NaN, ±0.0, ±FLT_MAX and other large magnitudes, subnormal and tiny magnitudes, the
kinks of each function (±3 for the hard functions, the clamp bounds, softplus's threshold), and
random values. The rules, the same here and on the GPU (``test_functions_gpu.py``):

- NaN-ness is equal, infinities are equal (sign included);
- a zero where the float64 reference is exactly zero has the reference's sign, except for
  ``minimum``/``maximum`` on the host: glibc's fminf/fmaxf return their first operand of a pair of
  zeros, while the GPU (PTX min/max, and the reference) orders -0.0 below +0.0; the GPU test
  checks that sign;
- a result whose reference is subnormal (below FLT_MIN) may be any value within FLT_MIN of it
  (fp32 expf underflows there: sigmoid(-100) is 0 in fp32 arithmetic, 3.7e-44 in float64);
- any other finite result lies within a few fp32 ULP of the float64 reference (``ULPS``).

The CUDA forms are evaluated on the CPU by a small C++ program (g++, else nvcc host code; skipped
without either), as ``tests/test_mask_property.py`` does: device-only functions are mapped to host
ones (``__expf`` to ``expf``, ``rsqrtf(x)`` to ``1.0f / sqrtf(x)``), so the host check is of each
expression's structure at the edges (branches, overflow, NaN paths) with exact libm functions; the
GPU test checks CUDA's own math functions.
"""

from __future__ import annotations

import math
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import napkin.diagrams as nd
from napkin.codegen.render import Code, map_expr
from napkin.diagrams import Axis, Diagram, array, map_fn
from napkin.diagrams.functions import FUNCTIONS, SELU_ALPHA, SELU_SCALE, ArrayOps
from napkin.errors import DiagramError

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
NVCC = shutil.which("nvcc")

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
FLT_TRUE_MIN = 1.401298464324817e-45

#: fp32 edge inputs (exactly representable in fp32).
EDGES = [
    -math.inf, math.inf, math.nan, -0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 6.0, -6.0,
    2.9999998, -2.9999998, 3.0000002, -3.0000002, 5.0, 10.0, -10.0, 20.0, -20.0, 20.5, 30.0, -30.0,
    88.0, -88.0, 88.7, -88.7, 89.0, -89.0, 100.0, -100.0, 104.0, -104.0, 1e4, -1e4, 1e30, -1e30, 3e38, -3e38,
    FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, 1e-40, -1e-40, FLT_TRUE_MIN, -FLT_TRUE_MIN, 1e-20, -1e-20,
    1e-7, -1e-7, 1.0000001, 0.99999994, 1e-3, -1e-3,
]
EDGES = [float(np.float32(v)) for v in EDGES]


def inputs(seed: int = 0, n: int = 200) -> np.ndarray:
    """The edges and random values (normal at three scales), as float32."""
    rng = np.random.default_rng(seed)
    rand = np.concatenate([rng.standard_normal(n), 4 * rng.standard_normal(n), 40 * rng.standard_normal(n)])
    return np.concatenate([np.array(EDGES, dtype=np.float32), rand.astype(np.float32)])


#: Every function with no index axes, and the parameters it is checked at.
UNARY_CASES: list[tuple[str, tuple]] = [
    ("neg", ()), ("square", ()), ("exp", ()), ("log", ()), ("sqrt", ()), ("rsqrt", ()), ("erf", ()),
    ("abs", ()), ("tanh", ()), ("relu", ()), ("gelu", ()), ("silu", ()), ("sigmoid", ()), ("mish", ()),
    ("selu", ()), ("hardswish", ()), ("hardsigmoid", ()), ("zero_inf", ()),
    ("scale", (0.125,)), ("scale", (-3.0,)), ("shift", (1.5,)), ("softcap", (30.0,)), ("softcap", (-5.0,)),
    ("hardtanh", (-1.0, 1.0)), ("hardtanh", (0.0, 6.0)), ("hardtanh", (-2.5, -2.5)), ("hardtanh", (-3e38, 1e-3)),
    ("softplus", (1.0, 20.0)), ("softplus", (2.0, 5.0)), ("softplus", (0.5, 100.0)), ("softplus", (1.0, 1e30)),
    ("softplus", (1e-3, -4.0)),
    ("elu", (1.0,)), ("elu", (0.5,)), ("elu", (-1.0,)), ("elu", (0.0,)),
    ("leaky_relu", (0.01,)), ("leaky_relu", (0.2,)), ("leaky_relu", (-1.0,)), ("leaky_relu", (0.0,)),
    ("pow", (2.0,)), ("pow", (3.0,)), ("pow", (0.5,)), ("pow", (-0.5,)), ("pow", (-1.0,)), ("pow", (-2.0,)),
    ("pow", (0.0,)), ("pow", (1.5,)), ("pow", (1 / 3,)), ("pow", (7.0,)), ("pow", (-3.0,)), ("pow", (2.5,)),
    ("pow", (-37.5,)), ("pow", (100.0,)),
]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "gate"]

#: fp32 ULPs allowed against the float64 reference (CUDA's own functions are within 1 to 4 ULP; a
#: composed form adds its roundings). pow: the kernel's exponent is an fp32 literal, so pow(x, 1/3)
#: is off by a relative |ln x|·|1/3 − fp32(1/3)| <= 103·1e-8 (9 ULP) at the ends of the fp32 range.
ULPS = {"pow": 16, "mish": 8, "softcap": 8, "gelu": 8, "silu": 8, "softplus": 6}
DEFAULT_ULPS = 4
#: Allowances of existing forms left as they are: gelu's erf form 0.5·x·(1 + erf(x/√2)), as torch's
#: own fp32 gelu computes it, cancels below x = -3 (1 + erf(..) loses erf's digits near -1): an
#: absolute |x|·2^-22; silu's x/(1 + e⁻ˣ) gives -0.0 where e⁻ˣ overflows (x < -88.7) though the true
#: value, down to -2.7e-37, is a normal fp32 number: an absolute 3e-37.
ATOL_X = {"gelu": 2.0 ** -22}
ATOL = {"silu": 3e-37}
#: ULPs growing with |x|: exp and silu use the intrinsic __expf (left as it is: the softmax-like
#: composed diagrams rely on its speed), whose error CUDA documents as 2 + floor(1.173·|x|) ULP.
ULPS_X = {"exp": 1.173, "silu": 1.173}


def ulps_at(fn: str, x: float) -> float:
    """The ULPs allowed for ``fn`` at input ``x``."""
    u = ULPS.get(fn, DEFAULT_ULPS)
    if fn in ULPS_X and math.isfinite(x):
        u += ULPS_X[fn] * abs(x)
    return u


def allowance(fn: str, x: float) -> float:
    """The absolute allowance of ``fn`` at input ``x`` (0 for most functions)."""
    extra = ATOL.get(fn, 0.0)
    if fn in ATOL_X and math.isfinite(x):
        extra += abs(x) * ATOL_X[fn]
    return extra


def test_every_elementwise_function_has_a_case():
    covered = {fn for fn, _ in UNARY_CASES} | set(BINARY)
    plain = {f.name for f in FUNCTIONS.values() if f.index_arity == 0 and not f.is_mask}
    assert plain <= covered, sorted(plain - covered)


# ----------------------------------------------------------------------------- the references


def reference(module: str, fn: str, params: tuple, *xs: np.ndarray) -> np.ndarray:
    """FUNCTIONS[fn] on arrays ``xs``, with torch or numpy."""
    ops = ArrayOps(module)
    if module == "torch":
        return FUNCTIONS[fn].impl(ops, [torch.from_numpy(x) for x in xs], params, [], []).numpy()
    return np.asarray(FUNCTIONS[fn].impl(ops, list(xs), params, [], []))


def torch_functional(fn: str, params: tuple, *xs: torch.Tensor) -> torch.Tensor:
    """What torch calls the function (torch.nn.functional and friends)."""
    x = xs[0]
    return {
        "sigmoid": lambda: torch.sigmoid(x),
        "hardtanh": lambda: F.hardtanh(x, *params),
        "softplus": lambda: F.softplus(x, beta=params[0], threshold=params[1]),
        "mish": lambda: F.mish(x),
        "selu": lambda: F.selu(x),
        "elu": lambda: F.elu(x, alpha=params[0]),
        "leaky_relu": lambda: F.leaky_relu(x, params[0]),
        "hardswish": lambda: F.hardswish(x),
        "hardsigmoid": lambda: F.hardsigmoid(x),
        "abs": lambda: torch.abs(x),
        "pow": lambda: torch.pow(x, torch.full_like(x, params[0])),
        "sqrt": lambda: torch.sqrt(x),
        "rsqrt": lambda: torch.rsqrt(x),
        "erf": lambda: torch.erf(x),
        "log": lambda: torch.log(x),
        "exp": lambda: torch.exp(x),
        "relu": lambda: F.relu(x),
        "minimum": lambda: torch.fmin(x, xs[1]),
        "maximum": lambda: torch.fmax(x, xs[1]),
        "zero_inf": lambda: x.masked_fill(x.abs() == math.inf, 0.0),
    }[fn]()


def same_bits_or_close(got: float, want: float, rel: float, zero_sign: bool = True) -> bool:
    """NaN-ness, infinities and zeros (with their sign, if ``zero_sign``) equal, else within ``rel``."""
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want) or want == 0:
        if got != want:
            return False
        return not zero_sign or math.copysign(1, got) == math.copysign(1, want)
    return math.isfinite(got) and abs(got - want) <= rel * abs(want)


TORCH_CASES = [(fn, p) for fn, p in UNARY_CASES
               if fn in ("sigmoid", "hardtanh", "softplus", "mish", "selu", "elu", "leaky_relu", "hardswish",
                         "hardsigmoid", "abs", "pow", "sqrt", "rsqrt", "erf", "log", "exp", "zero_inf")
               and not (fn == "softplus" and p[1] > 700)]  # torch's exp overflows there; napkin's form does not
# (relu is fmaxf(x, 0): relu(NaN) = 0 and relu(-0.0) = +0.0 where F.relu keeps both; test_relu_edges.py)


@pytest.mark.parametrize("module", ["torch", "numpy"])
@pytest.mark.parametrize("fn,params", TORCH_CASES, ids=[f"{f}{p}" for f, p in TORCH_CASES])
def test_reference_is_torchs_definition(module, fn, params):
    x = inputs().astype(np.float64)
    got = reference(module, fn, params, x)
    want = torch_functional(fn, params, torch.from_numpy(x)).numpy()
    for xi, g, w in zip(x.tolist(), got.tolist(), want.tolist()):
        assert same_bits_or_close(g, w, 1e-12), (module, fn, params, xi, g, w)


@pytest.mark.parametrize("module", ["torch", "numpy"])
@pytest.mark.parametrize("fn", ["minimum", "maximum"])
def test_minimum_and_maximum_are_fmin_and_fmax(module, fn):
    x = inputs(n=20).astype(np.float64)
    a, b = np.repeat(x, len(x)), np.tile(x, len(x))
    got = reference(module, fn, (), a, b)
    want = torch_functional(fn, (), torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for ai, bi, g, w in zip(a.tolist(), b.tolist(), got.tolist(), want.tolist()):
        # torch.fmin/fmax return the first of two zeros; napkin orders them as the GPU does (below)
        assert same_bits_or_close(g, w, 0.0, zero_sign=False), (module, fn, ai, bi, g, w)
    # the NaN rule: NaN only when both are NaN (torch.minimum would give NaN for either)
    assert np.array_equal(np.isnan(got), np.isnan(a) & np.isnan(b))
    zeros = reference(module, fn, (), np.array([-0.0, 0.0]), np.array([0.0, -0.0]))
    assert np.signbit(zeros).tolist() == ([True, True] if fn == "minimum" else [False, False])


def test_selu_constants_are_torchs():
    assert SELU_ALPHA == 1.6732632423543772848170429916717
    assert SELU_SCALE == 1.0507009873554804934193349852946
    x = torch.linspace(-20, 20, 4001, dtype=torch.float64)
    assert torch.allclose(torch.from_numpy(reference("torch", "selu", (), x.numpy())), F.selu(x),
                          rtol=1e-15, atol=0)


def test_named_edges():
    """The edges each function's doc promises, in the float64 reference."""
    inf, nan = math.inf, math.nan

    def r(fn, x, *p):
        return float(reference("torch", fn, tuple(p), np.array([x], dtype=np.float64))[0])

    assert r("sigmoid", -inf) == 0 and r("sigmoid", inf) == 1 and math.isnan(r("sigmoid", nan))
    assert r("softplus", -inf, 1.0, 20.0) == 0 and r("softplus", inf, 1.0, 20.0) == inf
    assert r("softplus", 1e6, 1.0, 1e30) == 1e6  # no overflow, whatever the threshold
    assert math.isnan(r("mish", -inf)) and r("mish", inf) == inf
    assert math.isnan(r("hardswish", -inf)) and r("hardswish", inf) == inf and r("hardswish", 3e38) == 3e38
    assert r("hardsigmoid", -inf) == 0 and r("hardsigmoid", inf) == 1 and math.isnan(r("hardsigmoid", nan))
    assert math.isnan(r("hardtanh", nan, 0.0, 1.0)) and math.copysign(1, r("hardtanh", -0.0, 0.0, 1.0)) < 0
    assert r("selu", -inf) == -SELU_SCALE * SELU_ALPHA and math.copysign(1, r("selu", -0.0)) < 0
    assert r("elu", -inf, 2.0) == -2.0 and math.copysign(1, r("elu", -0.0, -1.0)) < 0
    assert math.isnan(r("leaky_relu", -inf, 0.0)) and r("leaky_relu", -inf, 0.1) == -inf
    assert r("pow", -inf, 0.5) == inf and math.copysign(1, r("pow", -0.0, 0.5)) > 0
    assert math.isnan(r("pow", -8.0, 1 / 3)) and r("pow", nan, 0.0) == 1.0 and r("pow", -0.0, -1.0) == -inf
    assert r("rsqrt", -0.0) == -inf and r("rsqrt", 0.0) == inf and r("rsqrt", inf) == 0
    assert math.copysign(1, r("sqrt", -0.0)) < 0 and math.isnan(r("sqrt", -1e-45))
    assert r("log", 0.0) == -inf and r("log", -0.0) == -inf and math.isnan(r("log", -1e-45))
    assert r("abs", -0.0) == 0 and math.copysign(1, r("abs", -0.0)) > 0
    assert r("erf", -inf) == -1 and math.copysign(1, r("erf", -0.0)) < 0
    assert r("zero_inf", -inf) == 0 and r("zero_inf", inf) == 0 and math.isnan(r("zero_inf", nan))


# ----------------------------------------------------------------------------- the CUDA forms on the host

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#define __expf expf
#define __logf logf
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float f_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
"""


def _bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _float(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def _array(name: str, values) -> str:
    return f"static const uint32_t {name}[] = {{{', '.join(f'0x{_bits(float(v)):08x}u' for v in values)}}};\n"


def run_host(cases: list[tuple[str, tuple, int]], xs: list[np.ndarray], tmp, *, prelude: str = PRELUDE,
             half: bool = False, stem: str = "fns") -> dict:
    """Evaluate ``map_expr`` of each (fn, params, arity) on the fp32 inputs ``xs`` (one array per
    operand, all of one length), the 16-bit forms if ``half``, after ``prelude``; returns case
    index → float32 results."""
    src = prelude + "".join(_array(f"IN{j}", x.tolist()) for j, x in enumerate(xs))
    body = []
    for k, (fn, params, arity) in enumerate(cases):
        expr = map_expr(fn, [Code(f"v{j}") for j in range(arity)], params, half=half)
        body.append(f'    std::printf("{k} %d %08x\\n", i, (unsigned)bits_of({expr}));')
    n = len(xs[0])
    loads = " ".join(f"const float v{j} = f_of(IN{j}[i]);" for j in range(len(xs)))
    src += ("int main() {\n  for (int i = 0; i < " + str(n) + "; ++i) {\n    " + loads + "\n"
            + "\n".join(body) + "\n  }\n  return 0;\n}\n")
    cpp, exe = tmp / f"{stem}.cpp", tmp / stem
    cpp.write_text(src)
    if CXX:
        cmd = [CXX, "-std=c++17", "-O1", "-fno-fast-math", "-ffp-contract=off", "-o", str(exe), str(cpp)]
    else:
        cmd = [NVCC, "-std=c++17", "-x", "cu", "-o", str(exe), str(cpp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"the CUDA forms do not compile on the host:\n{r.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = {k: np.zeros(n, dtype=np.float32) for k in range(len(cases))}
    for line in out.splitlines():
        k, i, b = line.split()
        got[int(k)][int(i)] = _float(int(b, 16))
    return got


def fp32_disagreement(got: float, want64: float, ulps: float, zero_sign: bool = True, atol: float = 0.0
                      ) -> str | None:
    """Why the fp32 result ``got`` disagrees with the float64 reference ``want64`` (None: agrees)."""
    with np.errstate(over="ignore"):
        want = float(np.float32(want64))
    if math.isnan(want64):
        return None if math.isnan(got) else "not NaN"
    if math.isnan(got):
        return "NaN"
    if math.isinf(want):
        return None if got == want else "not the infinity"
    if want64 == 0:
        if got != 0:
            return "not zero"
        if zero_sign and math.copysign(1, got) != math.copysign(1, want64):
            return "zero of the other sign"
        return None
    if abs(want) < FLT_MIN:
        return None if abs(got - want64) <= max(FLT_MIN, atol) else "off by more than FLT_MIN (subnormal reference)"
    if not math.isfinite(got):
        return "not finite"
    with np.errstate(over="ignore"):
        ulp = float(np.spacing(np.float32(abs(want))))
    return None if abs(got - want64) <= ulps * ulp + atol else f"{abs(got - want64) / ulp:.1f} ULP off"


@pytest.mark.skipif(CXX is None and NVCC is None, reason="no host C++ compiler (g++ or nvcc) here")
def test_cuda_forms_agree_with_the_reference_on_the_host(tmp_path):
    x = inputs()
    cases = [(fn, p, 1) for fn, p in UNARY_CASES]
    got = run_host(cases, [x], tmp_path)
    x64 = x.astype(np.float64)
    bad = []
    for k, (fn, params, _) in enumerate(cases):
        want = reference("torch", fn, params, x64)
        for xi, g, w in zip(x64.tolist(), got[k].tolist(), want.tolist()):
            why = fp32_disagreement(g, w, ulps_at(fn, xi), atol=allowance(fn, xi))
            if why:
                bad.append(f"{fn}{params}({xi!r}) = {g!r}, reference {w!r}: {why}")
    assert not bad, "\n".join(bad[:40])


@pytest.mark.skipif(CXX is None and NVCC is None, reason="no host C++ compiler (g++ or nvcc) here")
def test_binary_cuda_forms_agree_with_the_reference_on_the_host(tmp_path):
    x = np.array(EDGES, dtype=np.float32)
    a, b = np.repeat(x, len(x)), np.tile(x, len(x))
    cases = [(fn, (), 2) for fn in BINARY]
    got = run_host(cases, [a, b], tmp_path)
    bad = []
    for k, (fn, _, _) in enumerate(cases):
        want = reference("torch", fn, (), a.astype(np.float64), b.astype(np.float64))
        for ai, bi, g, w in zip(a.tolist(), b.tolist(), got[k].tolist(), want.tolist()):
            # glibc's fminf/fmaxf return the first of two zeros; the GPU test checks the sign
            why = fp32_disagreement(g, w, DEFAULT_ULPS, zero_sign=fn not in ("minimum", "maximum"))
            if why:
                bad.append(f"{fn}({ai!r}, {bi!r}) = {g!r}, reference {w!r}: {why}")
    assert not bad, "\n".join(bad[:40])


# ----------------------------------------------------------------------------- builders


def test_builders_are_exported():
    for name in ["sigmoid", "hardtanh", "clamp", "softplus", "mish", "selu", "elu", "leaky_relu", "hardswish",
                 "hardsigmoid", "absolute", "power", "sqrt", "rsqrt", "erf", "log", "minimum", "maximum",
                 "logsumexp"]:
        assert name in nd.__all__ and callable(getattr(nd, name)), name
    assert "abs" not in nd.__all__ and "pow" not in nd.__all__  # a star import keeps Python's abs and pow


def test_builders_build_their_maps():
    r = Axis("r", 4)
    X, Y = array("X", r, dtype="fp32"), array("Y", r, dtype="fp32")
    assert nd.clamp(X, 0, 6).op.params == (0.0, 6.0) and nd.clamp(X, 0, 6).op.fn == "hardtanh"
    assert nd.hardtanh(X).op.params == (-1.0, 1.0)
    assert nd.softplus(X).op.params == (1.0, 20.0)
    assert nd.elu(X).op.params == (1.0,) and nd.leaky_relu(X).op.params == (0.01,)
    assert nd.power(X, 0.5).op.fn == "pow" and nd.power(X, 3).op.params == (3.0,)
    with pytest.raises(DiagramError, match="power"):
        X ** 2
    assert nd.absolute(X).op.fn == "abs" and nd.minimum(X, Y).op.fn == "minimum"
    for fn in ["sigmoid", "mish", "selu", "hardswish", "hardsigmoid", "sqrt", "rsqrt", "erf"]:
        assert getattr(nd, fn)(X).op.fn == fn


@pytest.mark.parametrize("build", [
    lambda X: nd.clamp(X, 1.0, 0.0),
    lambda X: nd.hardtanh(X, 2.0, -2.0),
    lambda X: map_fn("hardtanh", X, params=(0.5, 0.25)),
    lambda X: nd.clamp(X, -math.inf, 0.0),
    lambda X: nd.clamp(X, 0.0, math.nan),
    lambda X: nd.softplus(X, beta=0.0),
    lambda X: nd.softplus(X, beta=-1.0),
    lambda X: nd.softplus(X, threshold=math.inf),
    lambda X: nd.power(X, math.nan),
    lambda X: nd.power(X, math.inf),
    lambda X: nd.elu(X, alpha=1e39),
])
def test_bad_parameters_are_refused(build):
    X = array("X", Axis("r", 4), dtype="fp32")
    with pytest.raises(DiagramError):
        build(X)


def test_symbolic_bounds_are_checked_once_bound():
    import sympy

    n = Axis("n")
    X = array("X", Axis("r", 4), n, dtype="fp32")
    bad = Diagram("c", nd.clamp(X, sympy.Symbol("n"), 3.0, name="Y"))  # lo = n > 3 once n = 8
    with pytest.raises(DiagramError, match="must not exceed"):
        bad.bind(n=8).reference(dtype=torch.float64, seed=0)
    ok = bad.bind(n=2).reference(dtype=torch.float64, seed=0)["Y"]
    assert float(ok.min()) >= 2.0 and float(ok.max()) <= 3.0


# ----------------------------------------------------------------------------- logsumexp


def lse_rows() -> torch.Tensor:
    inf, nan = math.inf, math.nan
    rows = [
        [-inf] * 7,                                  # all -inf: -inf, not NaN
        [-inf, 1.0, -inf, 2.0, -inf, -inf, -inf],
        [inf, 1.0, 2.0, 3.0, -inf, 0.0, 0.0],        # +inf: +inf
        [inf, -inf, -inf, -inf, -inf, -inf, -inf],
        [nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],         # NaN: NaN
        [nan, -inf, -inf, -inf, -inf, -inf, -inf],
        [1e30, 1e30, -1e30, 0.0, 1.0, 2.0, 3.0],    # exp would overflow unshifted
        [-1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30],
        [3e38, 3e38, 3e38, 3e38, 3e38, 3e38, 3e38],  # the sum exceeds FLT_MAX: log of it does not
        [0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0],
        [1e-45, -1e-45, 1e-40, 0.0, 0.0, 0.0, 0.0],
    ]
    g = torch.Generator().manual_seed(0)
    rand = torch.randn(8, 7, generator=g, dtype=torch.float64) * torch.tensor([[1.0], [10.0], [100.0], [1.0],
                                                                              [0.1], [30.0], [3.0], [50.0]],
                                                                             dtype=torch.float64)
    return torch.cat([torch.tensor(rows, dtype=torch.float64), rand])


def assert_lse_agrees(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float, what: str):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (what, got, want)
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf]), (what, got, want)
    fin = torch.isfinite(want)
    assert torch.isfinite(got[fin]).all(), (what, got, want)
    assert torch.allclose(got[fin], want[fin], rtol=rtol, atol=atol), (what, got, want)


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-13), (torch.float32, 1e-6)])
def test_logsumexp_is_torchs(dtype, rtol):
    x = lse_rows().to(dtype)
    r, c = Axis("r", x.shape[0]), Axis("c", x.shape[1])
    d = Diagram("lse", nd.logsumexp(array("X", r, c, dtype="fp32"), over=c, name="L"))
    got = d.reference({"X": x})["L"]
    assert got.dtype == dtype
    assert_lse_agrees(got, torch.logsumexp(x, dim=1), rtol, 1e-6, "reference")
    assert float(got[0]) == -math.inf and float(got[2]) == math.inf and math.isnan(float(got[4]))


def test_logsumexp_weaves_and_keeps_other_axes():
    b, r, c = Axis("b", 2), Axis("r", 3), Axis("c", 5)
    X = array("X", r, c, b, dtype="fp32")
    L = nd.logsumexp(X, over="c", name="L")
    assert L.axis_names == ("r", "b")
    x = torch.randn(3, 5, 2, dtype=torch.float64)
    got = Diagram("lse", L).reference({"X": x})["L"]
    assert torch.allclose(got, torch.logsumexp(x, dim=1), rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_every_function_runs_in_the_reference_in_each_dtype(dtype):
    """The reference computes in the inputs' dtype: a parameter beyond fp16's range (a clamp bound of
    -3e38) becomes -inf there rather than an error."""
    r = Axis("r", 64)
    want = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    for fn, params in UNARY_CASES:
        d = Diagram("t", map_fn(fn, array("X", r, dtype=dtype), params=params, name="Y"))
        assert d.reference(seed=0)["Y"].dtype == want, fn
