"""The whitelist of elementwise functions a diagram may use.

Every elementwise box (``exp``, ``gelu``, a causal mask, ALiBi, ...) is one entry
here. An entry knows how to run on PyTorch tensors and on numpy arrays (the same
code, given the array module), its CUDA C++ expression, and its cost: FLOPs on the
CUDA cores and operations on the special-function unit (exp, tanh, erf). Only
these entries reach generated CUDA, so a diagram can never inject source code.

Index functions (masks and score modifiers) also read the integer position along
some axes: a causal mask reads the query index and the key index. A mask's parameters
(the causal offset, the window) are integers (:class:`IntParam`): the reference and the
kernel compare integer positions exactly, so a fractional, non-finite or huge value is
refused when the diagram is built, never truncated in one place and not in the other.

>>> FUNCTIONS["gelu"].arity
1
>>> FUNCTIONS["causal"].index_arity
2
>>> FUNCTIONS["sliding_window"].int_params
(IntParam(index=0, lo=1, hi=4611686018427387904),)
>>> check_int_param("causal", 0, 3.0)
3
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable

from ..dtypes import dtype as lookup_dtype
from ..errors import DiagramError

_INV_SQRT2 = 1.0 / math.sqrt(2.0)

#: The largest magnitude of an integer parameter (a mask offset or window): an index (below
#: 2^48, :data:`napkin.diagrams.axes.MAX_AXIS_SIZE`) plus or minus it stays inside 64-bit integers.
MAX_INT_PARAM = 2 ** 62


@dataclass(frozen=True)
class IntParam:
    """Parameter ``index`` of a function is an integer in ``[lo, hi]`` (masks compare positions)."""

    index: int
    lo: int = -MAX_INT_PARAM
    hi: int = MAX_INT_PARAM


@dataclass(frozen=True)
class ElementwiseFn:
    """One whitelisted elementwise function.

    ``impl(m, xs, params, idx, sizes)`` computes it with array module ``m`` (a
    :class:`ArrayOps`): ``xs`` are the broadcast array inputs, ``params`` the scalar
    parameters, ``idx`` broadcast index arrays for the index axes and ``sizes`` the
    sizes of those axes. ``cuda`` is a C++ expression in ``{x0}``, ``{p0}``, ``{i0}``,
    ``{n0}`` (inputs, parameters, indices, index-axis sizes), in fp32; an integer
    parameter (``int_params``) is written as a ``long long`` literal (``3LL``), any
    other as a float literal. ``cuda_half`` (where it differs) is the form for kernels that store
    their values in 16-bit floats: the special-function unit's approximations with the same edge
    values, within 2^-15 relative of the exact function, far under bf16's and fp16's rounding
    (``napkin/kernels/cuda/halfmath.cuh`` says why and how). ``param_names`` name the parameters in error messages;
    ``nonzero_params`` lists those that must not be 0 (a divisor), ``positive_params`` those that
    must be > 0 (softplus's beta) and ``ordered_params`` pairs ``(i, j)`` with ``params[i] <=
    params[j]`` (a clamp's bounds); :func:`check_param_relations` checks the last two.
    """

    name: str
    arity: int
    impl: Callable = field(repr=False)
    cuda: str
    n_params: int = 0
    index_arity: int = 0
    flops: int = 1
    sfu: int = 0
    doc: str = ""
    is_mask: bool = False
    param_names: tuple[str, ...] = ()
    int_params: tuple[IntParam, ...] = ()
    nonzero_params: tuple[int, ...] = ()
    positive_params: tuple[int, ...] = ()
    ordered_params: tuple[tuple[int, int], ...] = ()
    cuda_half: str = ""
    #: FMA issue slots one evaluation takes, measured: (the fp32 form, the 16-bit kernels' form);
    #: empty where not measured (see :data:`MEASURED_SLOTS` and :meth:`cost`)
    slots: tuple[float, float] = ()

    def form(self, half: bool = False) -> str:
        """The CUDA form: ``cuda_half`` for a kernel of 16-bit values where there is one, else ``cuda``.

        >>> FUNCTIONS["log"].form(half=True)
        'napkin::hm_log({x0})'
        >>> FUNCTIONS["relu"].form(half=True) == FUNCTIONS["relu"].cuda
        True
        """
        return self.cuda_half if half and self.cuda_half else self.cuda

    def cost(self, half: bool = False) -> tuple[int, int]:
        """(CUDA-core FLOPs, special-function operations) one evaluation costs the model, in the
        form a kernel of 16-bit values (``half``) or of fp32 values computes: twice the measured
        FMA issue slots, rounded (the CUDA-core rate counts an FMA as two FLOPs; whole numbers keep
        the cost model's sums exact), which take in the special-function unit's share under the
        throughput they were measured at, else the entry's ``flops`` and ``sfu``.

        >>> FUNCTIONS["erf"].cost(), FUNCTIONS["erf"].cost(half=True), FUNCTIONS["relu"].cost()
        ((51, 0), (51, 0), (2, 0))
        >>> FUNCTIONS["causal"].cost()
        (1, 0)
        """
        if not self.slots:
            return self.flops, self.sfu
        return round(2 * self.slots[1 if half else 0]), 0

    def param_name(self, i: int) -> str:
        """The name of parameter ``i`` (``offset``, ``window``, ``c``...)."""
        return self.param_names[i] if i < len(self.param_names) else f"p{i}"

    def int_param(self, i: int) -> "IntParam | None":
        """The integer declaration of parameter ``i``, or None for a float parameter."""
        return next((p for p in self.int_params if p.index == i), None)


class ArrayOps:
    """The few array functions elementwise maps need, for torch and for numpy."""

    def __init__(self, module_name: str):
        self.name = module_name
        if module_name == "torch":
            import torch

            self.m = torch
            self.erf = torch.erf
            self.erfc = torch.erfc
            self.maximum = torch.maximum
            self.fmax = torch.fmax
            self.where = torch.where
            self.abs = torch.abs
        else:
            import numpy as np

            self.m = np
            self.erf = _numpy_erf
            self.erfc = _numpy_erfc
            self.maximum = np.maximum
            self.fmax = np.fmax
            self.where = np.where
            self.abs = np.abs
        self.exp = self.m.exp
        self.log = self.m.log
        self.tanh = self.m.tanh
        self.sqrt = self.m.sqrt
        self.log1p = self.m.log1p
        self.expm1 = self.m.expm1
        self.signbit = self.m.signbit

    def quiet(self):
        """A context in which numpy does not warn of overflow, 0/0 or inf - inf (the functions
        define those results: inf, NaN); nothing for torch, which never warns."""
        if self.name == "torch":
            return contextlib.nullcontext()
        return self.m.errstate(all="ignore")

    def select(self, cond, a, b, like):
        """``cond ? a : b`` elementwise, the C conditional the CUDA forms use (a NaN compares false,
        so it takes ``b``). ``a`` or ``b`` may be a number, taken in ``like``'s dtype as ``where``
        takes it (one beyond fp16's range becomes ±inf there, not an error)."""
        if isinstance(a, numbers.Real) and isinstance(b, numbers.Real):
            a = self.where(cond, self.full_like(like, 0.0), self.full_like(like, 0.0)) + a
        return self.where(cond, a, b)

    def fmin(self, a, b):
        """``fminf`` on the GPU: a NaN operand gives the other one, and -0.0 orders below +0.0 (PTX
        min; torch.fmin and numpy's fmin return their first operand of a pair of zeros)."""
        with self.quiet():
            r = self.m.fmin(a, b)
            zeros = (a == 0) & (b == 0)
            return self.where(zeros, self.where(self.signbit(a), a, b), r)

    def fmax_exact(self, a, b):
        """``fmaxf`` on the GPU: a NaN operand gives the other one, +0.0 orders above -0.0."""
        with self.quiet():
            r = self.m.fmax(a, b)
            zeros = (a == 0) & (b == 0)
            return self.where(zeros, self.where(self.signbit(a), b, a), r)

    def rsqrt(self, x):
        """1/√x: rsqrt(±0) = ±inf, rsqrt(inf) = 0, rsqrt(x < 0) = NaN."""
        if self.name == "torch":
            return self.m.rsqrt(x)
        with self.quiet():
            return 1.0 / self.m.sqrt(x)

    def pow(self, x, p: float):
        """C's ``pow(x, p)`` for a scalar exponent: pow(x, 0) = 1 (NaN included), a negative base
        with a non-integer exponent gives NaN, pow(-inf, 0.5) = inf and pow(-0.0, 0.5) = +0.0.
        (torch.pow with a Python float exponent 0.5 takes sqrt there, giving NaN and -0.0; a tensor
        exponent keeps C's rules, so the exponent is passed as one.)"""
        with self.quiet():
            return self.m.pow(x, self.full_like(x, p)) if self.name == "torch" else \
                self.m.power(x, self.full_like(x, p))

    def sigmoid(self, x):
        """1/(1 + e⁻ˣ): sigmoid(-inf) = 0, sigmoid(inf) = 1."""
        if self.name == "torch":
            return self.m.sigmoid(x)
        with self.quiet():
            return 1.0 / (1.0 + self.m.exp(-x))

    def full_like(self, x, value):
        """An array shaped and typed like ``x`` filled with ``value``."""
        if self.name == "torch":
            return self.m.full_like(x, value)
        return self.m.full_like(x, value, dtype=x.dtype)

    def cast_like(self, idx, x):
        """Integer positions ``idx`` as floats of ``x``'s dtype (so float64 references stay float64)."""
        if self.name == "torch":
            return idx.to(x.dtype)
        return idx.astype(x.dtype)

    def neg_inf(self, x):
        """-inf shaped like x."""
        return self.full_like(x, -math.inf)

    def relu(self, x):
        """``fmaxf(x, 0.0f)`` exactly: x where x > 0, else +0.0, so relu(-inf) = 0, relu(+inf) = inf,
        relu(-0.0) = relu(-5) = +0.0 and relu(NaN) = 0 (fmaxf returns the other operand of a NaN)."""
        return self.where(x > 0, x, self.full_like(x, 0.0))


def _numpy_erf(x):
    import numpy as np

    # numpy has no erf; math.erf per element is exact and the interpreter's arrays are small.
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


def _numpy_erfc(x):
    import numpy as np

    return np.vectorize(math.erfc, otypes=[x.dtype])(x)


def _alibi_slope(h, n_heads, m):
    # Press et al.: slopes form the geometric sequence 2^(-8(h+1)/H).
    return m.exp(-(8.0 * (h + 1) / n_heads) * math.log(2.0))


#: SELU's constants (Klambauer et al. 2017), as torch.nn.functional.selu spells them.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_SELU_SA = SELU_SCALE * SELU_ALPHA


def _lit(v: float) -> str:
    """A float constant of a CUDA form, as an fp32 literal (the shortest form of the double)."""
    return repr(float(v)) + "f"


def _hardtanh(m, xs, p, i, n):
    x = xs[0]
    return m.select(x < p[0], p[0], m.select(x > p[1], p[1], x, x), x)


def _softplus(m, xs, p, i, n):
    x = xs[0]
    beta, threshold = p
    with m.quiet():
        z = x * beta
        soft = (m.select(z > 0, z, 0.0, z) + m.log1p(m.exp(-m.abs(z)))) / beta
        return m.select(z > threshold, x, soft, x)


def _mish(m, xs, p, i, n):
    x = xs[0]
    with m.quiet():
        return x * m.tanh(m.log1p(m.exp(x)))


def _selu(m, xs, p, i, n):
    x = xs[0]
    with m.quiet():
        return m.select(x < 0, _SELU_SA * m.expm1(x), SELU_SCALE * x, x)


def _elu(m, xs, p, i, n):
    x = xs[0]
    with m.quiet():
        return m.select(x < 0, p[0] * m.expm1(x), x, x)


def _leaky_relu(m, xs, p, i, n):
    x = xs[0]
    with m.quiet():
        return m.select(x > 0, x, x * p[0], x)


def _relu6_over_6(m, t):
    """fminf(fmaxf(t, 0), 6) / 6: NaN gives 0, as fmaxf does."""
    r = m.select(t > 0, t, 0.0, t)
    return m.select(r < 6.0, r, 6.0, t) / 6.0


def _hardswish(m, xs, p, i, n):
    x = xs[0]
    with m.quiet():
        return x * _relu6_over_6(m, x + 3.0)


def _hardsigmoid(m, xs, p, i, n):
    t = xs[0] + 3.0
    return m.select(t < 0, 0.0, m.select(t > 6.0, 1.0, t / 6.0, t), t)


def _zero_inf(m, xs, p, i, n):
    x = xs[0]
    return m.select(m.abs(x) == math.inf, 0.0, x, x)


FUNCTIONS: dict[str, ElementwiseFn] = {}


def _register(fn: ElementwiseFn) -> None:
    FUNCTIONS[fn.name] = fn


for _fn in [
    ElementwiseFn("add", 2, lambda m, xs, p, i, n: xs[0] + xs[1], "({x0} + {x1})", doc="x + y"),
    ElementwiseFn("sub", 2, lambda m, xs, p, i, n: xs[0] - xs[1], "({x0} - {x1})", doc="x - y"),
    ElementwiseFn("mul", 2, lambda m, xs, p, i, n: xs[0] * xs[1], "({x0} * {x1})", doc="x * y"),
    ElementwiseFn("div", 2, lambda m, xs, p, i, n: xs[0] / xs[1], "({x0} / {x1})", doc="x / y",
                  cuda_half="napkin::hm_div({x0}, {x1})"),
    ElementwiseFn("maximum", 2, lambda m, xs, p, i, n: m.fmax_exact(xs[0], xs[1]), "fmaxf({x0}, {x1})",
                  doc="max(x, y) as fmaxf: a NaN operand gives the other one (torch.fmax; torch.maximum "
                      "would give NaN), and +0.0 orders above -0.0"),
    ElementwiseFn("minimum", 2, lambda m, xs, p, i, n: m.fmin(xs[0], xs[1]), "fminf({x0}, {x1})",
                  doc="min(x, y) as fminf: a NaN operand gives the other one (torch.fmin; torch.minimum "
                      "would give NaN; both NaN gives NaN), and -0.0 orders below +0.0"),
    ElementwiseFn("scale", 1, lambda m, xs, p, i, n: xs[0] * p[0], "({x0} * {p0})", n_params=1,
                  param_names=("c",), doc="c * x"),
    ElementwiseFn("shift", 1, lambda m, xs, p, i, n: xs[0] + p[0], "({x0} + {p0})", n_params=1,
                  param_names=("c",), doc="x + c"),
    ElementwiseFn("neg", 1, lambda m, xs, p, i, n: -xs[0], "(-{x0})", doc="-x"),
    ElementwiseFn("square", 1, lambda m, xs, p, i, n: xs[0] * xs[0], "({x0} * {x0})", doc="x²"),
    ElementwiseFn("exp", 1, lambda m, xs, p, i, n: m.exp(xs[0]), "__expf({x0})", sfu=1, doc="eˣ"),
    ElementwiseFn("log", 1, lambda m, xs, p, i, n: m.log(xs[0]), "logf({x0})", sfu=1,
                  cuda_half="napkin::hm_log({x0})",
                  doc="ln x with logf: log(0) = -inf, log(x < 0) = NaN, accurate near 1 and for subnormal x "
                      "(__logf's error near 1 is absolute, 2^-21.4, so log(1 + 1e-4) lost 3 digits)"),
    ElementwiseFn("sqrt", 1, lambda m, xs, p, i, n: m.sqrt(xs[0]), "sqrtf({x0})", sfu=1,
                  doc="√x: sqrt(-0.0) = -0.0, sqrt(x < 0) = NaN, sqrt(inf) = inf"),
    ElementwiseFn("rsqrt", 1, lambda m, xs, p, i, n: m.rsqrt(xs[0]), "rsqrtf({x0})", sfu=1,
                  doc="1/√x as torch.rsqrt: rsqrt(±0) = ±inf, rsqrt(inf) = 0, rsqrt(x < 0) = NaN"),
    ElementwiseFn("erf", 1, lambda m, xs, p, i, n: m.erf(xs[0]), "erff({x0})", sfu=1,
                  doc="erf x: erf(±inf) = ±1, erf(-0.0) = -0.0"),
    ElementwiseFn("abs", 1, lambda m, xs, p, i, n: m.abs(xs[0]), "fabsf({x0})",
                  doc="|x|: abs(-0.0) = +0.0, abs(NaN) = NaN"),
    ElementwiseFn("pow", 1, lambda m, xs, p, i, n: m.pow(xs[0], p[0]), "powf({x0}, {p0})",
                  n_params=1, flops=8, sfu=2, param_names=("exponent",),
                  cuda_half="napkin::hm_pow({x0}, {p0})",
                  doc="x^p for a scalar p, as C's powf (torch.pow with a tensor exponent): pow(x, 0) = 1 "
                      "(NaN included), a negative x with a non-integer p gives NaN, pow(-inf, 0.5) = inf, "
                      "pow(-0.0, 0.5) = +0.0, pow(±0, p < 0) = inf (-inf for -0.0 and odd integer p)"),
    ElementwiseFn("tanh", 1, lambda m, xs, p, i, n: m.tanh(xs[0]), "tanhf({x0})", sfu=1, doc="tanh x"),
    ElementwiseFn("relu", 1, lambda m, xs, p, i, n: m.relu(xs[0]), "fmaxf({x0}, 0.0f)",
                  doc="max(x, 0) as fmaxf(x, 0): relu(-0.0) = +0.0, relu(NaN) = 0"),
    ElementwiseFn("sigmoid", 1, lambda m, xs, p, i, n: m.sigmoid(xs[0]), "(1.0f / (1.0f + expf(-{x0})))",
                  flops=2, sfu=1, cuda_half="napkin::hm_sigmoid({x0})",
                  doc="σ(x) = 1/(1 + e⁻ˣ) as torch.sigmoid: σ(-inf) = 0 (expf(inf) = inf), σ(inf) = 1, "
                      "σ(NaN) = NaN"),
    ElementwiseFn("hardtanh", 1, _hardtanh,
                  "(({x0} < {p0}) ? {p0} : (({x0} > {p1}) ? {p1} : {x0}))",
                  n_params=2, flops=2, param_names=("min_val", "max_val"), ordered_params=((0, 1),),
                  doc="clamp x to [min_val, max_val] (finite, min_val <= max_val) as "
                      "torch.nn.functional.hardtanh: x unless it lies strictly outside, so NaN stays NaN "
                      "and -0.0 stays -0.0"),
    ElementwiseFn("softplus", 1, _softplus,
                  "((({x0} * {p0}) > {p1}) ? {x0} : ((fmaxf({x0} * {p0}, 0.0f) + "
                  "log1pf(expf(-fabsf({x0} * {p0})))) / {p0}))",
                  n_params=2, flops=7, sfu=2, param_names=("beta", "threshold"), nonzero_params=(0,),
                  positive_params=(0,),
                  cuda_half="napkin::hm_select(({x0} * {p0}) > {p1}, {x0}, (fmaxf({x0} * {p0}, 0.0f) + "
                            "napkin::hm_log1p(__expf(-fabsf({x0} * {p0})))) / {p0})",
                  doc="log(1 + e^(beta·x))/beta, and x where beta·x > threshold, as "
                      "torch.nn.functional.softplus; computed as (max(z, 0) + log1p(e^-|z|))/beta "
                      "(z = beta·x), which never overflows (where torch's exp would, a threshold above "
                      "88 in fp32, it gives x rather than inf); softplus(-inf) = 0, softplus(NaN) = NaN"),
    ElementwiseFn("mish", 1, _mish,
                  "(({x0} > 20.0f) ? {x0} : ({x0} * ((expf({x0}) * (expf({x0}) + 2.0f)) / "
                  "(expf({x0}) * (expf({x0}) + 2.0f) + 2.0f))))",
                  flops=6, sfu=1,
                  cuda_half="napkin::hm_select({x0} > 20.0f, {x0}, {x0} * __fdividef(__expf({x0}) * (__expf({x0}) + 2.0f), "
                            "__expf({x0}) * (__expf({x0}) + 2.0f) + 2.0f))",
                  doc="x·tanh(softplus(x)) as torch.nn.functional.mish, computed with one exponential: "
                      "tanh(log(1 + n)) = n(n + 2)/(n(n + 2) + 2) for n = eˣ (exact algebra, where "
                      "tanh, log1p and exp would each cost a libm call), and x itself past 20, where "
                      "the factor rounds to 1 in fp32 (and n² would overflow past 44); mish(inf) = inf, "
                      "mish(-inf) = -inf·0 = NaN as torch gives"),
    ElementwiseFn("selu", 1, _selu,
                  "(({x0} < 0.0f) ? (" + _lit(_SELU_SA) + " * expm1f({x0})) : (" + _lit(SELU_SCALE)
                  + " * {x0}))",
                  flops=2, sfu=1,
                  cuda_half="napkin::hm_select({x0} < 0.0f, " + _lit(_SELU_SA) + " * napkin::hm_expm1({x0}), "
                            + _lit(SELU_SCALE) + " * {x0})",
                  doc="scale·x for x >= 0, scale·alpha·(eˣ - 1) below, as torch.nn.functional.selu "
                      "(alpha = 1.6732632423543772848, scale = 1.0507009873554804934): selu(-inf) = "
                      "-scale·alpha, selu(-0.0) = -0.0"),
    ElementwiseFn("elu", 1, _elu, "(({x0} < 0.0f) ? ({p0} * expm1f({x0})) : {x0})",
                  n_params=1, flops=2, sfu=1, param_names=("alpha",),
                  cuda_half="napkin::hm_select({x0} < 0.0f, {p0} * napkin::hm_expm1({x0}), {x0})",
                  doc="x for x >= 0, alpha·(eˣ - 1) below, as torch.nn.functional.elu: elu(-inf) = "
                      "-alpha, elu(-0.0) = -0.0"),
    ElementwiseFn("leaky_relu", 1, _leaky_relu, "(({x0} > 0.0f) ? {x0} : ({x0} * {p0}))",
                  n_params=1, flops=2, param_names=("negative_slope",),
                  doc="x for x > 0, negative_slope·x otherwise, as torch.nn.functional.leaky_relu "
                      "(so leaky_relu(-inf) = NaN when negative_slope = 0, -inf·0)"),
    ElementwiseFn("hardswish", 1, _hardswish,
                  "({x0} * (fminf(fmaxf({x0} + 3.0f, 0.0f), 6.0f) / 6.0f))",
                  flops=5,
                  doc="x·relu6(x + 3)/6 as torch.nn.functional.hardswish, multiplied as x·(relu6(x + 3)/6) "
                      "so a large x does not overflow; hardswish(-inf) = -inf·0 = NaN as torch gives"),
    ElementwiseFn("hardsigmoid", 1, _hardsigmoid,
                  "(((({x0} + 3.0f) < 0.0f) ? 0.0f : ((({x0} + 3.0f) > 6.0f) ? 1.0f : "
                  "(({x0} + 3.0f) / 6.0f))))",
                  flops=4,
                  doc="relu6(x + 3)/6 as torch.nn.functional.hardsigmoid: 0 below -3, 1 above 3, "
                      "hardsigmoid(NaN) = NaN"),
    ElementwiseFn("zero_inf", 1, _zero_inf, "((fabsf({x0}) > 3.4028234663852886e38f) ? 0.0f : {x0})", flops=2,
                  doc="x with ±inf replaced by 0 (NaN stays NaN): the shift logsumexp subtracts, so a row "
                      "of -inf gives log(0) = -inf and not NaN (as torch.logsumexp). |x| > FLT_MAX is the "
                      "test (NVRTC's kernels have no INFINITY macro without a math header)"),
    ElementwiseFn("gate", 2, lambda m, xs, p, i, n: m.select(xs[1] > 0, xs[0], 0.0, xs[0]),
                  "(({x1} > 0.0f) ? {x0} : 0.0f)",
                  doc="x where c > 0, else +0.0 (a NaN c gives 0, and x is not read there), as "
                      "torch.where(c > 0, x, 0): the kinks of relu, clamp, abs, max and the masks in the "
                      "backward diagrams Diagram.grad writes"),
    ElementwiseFn(
        "gelu", 1,
        lambda m, xs, p, i, n: 0.5 * xs[0] * m.erfc(xs[0] * -_INV_SQRT2),
        "(0.5f * {x0} * (1.0f + erff({x0} * 0.70710678118654752f)))",
        flops=4, sfu=1,
        doc="x·Φ(x) (exact, erf form, as torch.nn.functional.gelu); the reference computes "
            "x·erfc(-x/√2)/2, which 1 + erf(x/√2) equals but loses to cancellation below x = -5 "
            "(torch's own form gives -0.0 there, where the value is about -e^(-x²/2)/√(2π))",
        cuda_half="napkin::hm_gelu({x0})",
    ),
    ElementwiseFn(
        "silu", 1,
        lambda m, xs, p, i, n: xs[0] / (1.0 + m.exp(-xs[0])),
        "({x0} / (1.0f + __expf(-{x0})))",
        flops=3, sfu=1, doc="x·σ(x)", cuda_half="napkin::hm_silu({x0})",
    ),
    ElementwiseFn(
        "softcap", 1,
        lambda m, xs, p, i, n: p[0] * m.tanh(xs[0] / p[0]),
        "({p0} * tanhf({x0} / {p0}))",
        n_params=1, flops=2, sfu=1, param_names=("cap",), nonzero_params=(0,),
        doc="c·tanh(x/c) (logit soft-capping)",
    ),
    ElementwiseFn(
        "causal", 1,
        lambda m, xs, p, i, n: m.where(i[1] <= i[0] + p[0], xs[0], m.neg_inf(xs[0])),
        "(({i1} <= {i0} + {p0}) ? {x0} : -INFINITY)",
        n_params=1, index_arity=2, flops=1, is_mask=True, param_names=("offset",), int_params=(IntParam(0),),
        doc="keep key x where x ≤ q + offset (offset 0: top-left aligned, as SDPA is_causal)",
    ),
    ElementwiseFn(
        "sliding_window", 1,
        lambda m, xs, p, i, n: m.where((i[1] <= i[0]) & (i[1] > i[0] - p[0]), xs[0], m.neg_inf(xs[0])),
        "((({i1} <= {i0}) && ({i1} > {i0} - {p0})) ? {x0} : -INFINITY)",
        n_params=1, index_arity=2, flops=2, is_mask=True, param_names=("window",),
        int_params=(IntParam(0, 1, MAX_INT_PARAM),),
        doc="causal and keep only the last w keys: q − w < x ≤ q",
    ),
    ElementwiseFn(
        "tril", 1,
        lambda m, xs, p, i, n: m.select(i[1] <= i[0] + p[0], xs[0], 0.0, xs[0]),
        "(({i1} <= {i0} + {p0}) ? {x0} : 0.0f)",
        n_params=1, index_arity=2, flops=1, param_names=("diagonal",), int_params=(IntParam(0),),
        doc="x where column j ≤ row i + diagonal, +0.0 above (torch.tril: a NaN above is 0 too)",
    ),
    ElementwiseFn(
        "triu", 1,
        lambda m, xs, p, i, n: m.select(i[1] >= i[0] + p[0], xs[0], 0.0, xs[0]),
        "(({i1} >= {i0} + {p0}) ? {x0} : 0.0f)",
        n_params=1, index_arity=2, flops=1, param_names=("diagonal",), int_params=(IntParam(0),),
        doc="x where column j ≥ row i + diagonal, +0.0 below (torch.triu: a NaN below is 0 too)",
    ),
    ElementwiseFn(
        "alibi", 1,
        lambda m, xs, p, i, n: xs[0] - _alibi_slope(m.cast_like(i[0], xs[0]), n[0], m) * m.abs(i[1] - i[2]),
        "({x0} - exp2f(-8.0f * (float)({i0} + 1) / (float)({n0})) * fabsf((float)({i1} - {i2})))",
        index_arity=3, flops=4, sfu=1,
        doc="ALiBi: s − m_h·|q − x| with head slopes m_h = 2^(−8(h+1)/H)",
    ),
]:
    _register(_fn)


#: FMA issue slots one evaluation of each function's forms takes: (the fp32 form, the 16-bit
#: kernels' form, the same where it has none). Measured on an H200 by ``benchmarks/fn_cost.py``
#: (``benchmarks/results/nvidia-h200/fn_cost.jsonl``): 8 independent values a thread, the function
#: applied 64 times each, against the same loop with one FMA in its place, so the special-function
#: unit's share is in the count. libm's fp32 forms are the dear ones: erff 25.6 slots, logf 24.7,
#: powf 66.9, an IEEE division 15.6, where an add takes 1. A form with a branch was timed on its
#: common side (x in [0.3, 1]); the 16-bit forms have none.
MEASURED_SLOTS: dict[str, tuple[float, float]] = {
    "add": (1.0, 1.0), "sub": (1.0, 1.0), "mul": (1.1, 1.1), "div": (15.6, 7.0), "maximum": (1.0, 1.0),
    "minimum": (1.0, 1.0), "scale": (1.2, 1.2), "shift": (1.2, 1.2), "neg": (0.8, 0.8), "square": (0.7, 0.7),
    "exp": (6.1, 6.1), "log": (24.7, 7.6), "sqrt": (11.6, 11.6), "rsqrt": (5.8, 5.8), "erf": (25.6, 25.6),
    "abs": (0.8, 0.8), "pow": (66.9, 15.6), "tanh": (16.3, 16.3), "relu": (1.1, 1.1), "sigmoid": (24.6, 13.2),
    "hardtanh": (4.4, 4.4), "softplus": (44.1, 15.1), "mish": (33.1, 13.5), "selu": (6.7, 10.0),
    "elu": (6.3, 8.9), "leaky_relu": (1.9, 1.9), "hardswish": (16.6, 16.6), "hardsigmoid": (21.8, 21.8),
    "gelu": (29.0, 20.3), "silu": (23.0, 20.7), "softcap": (30.6, 30.6),
}
for _name, _slots in MEASURED_SLOTS.items():
    FUNCTIONS[_name] = dataclasses.replace(FUNCTIONS[_name], slots=_slots)


def half_form(dtype: str) -> bool:
    """Whether a kernel whose values are ``dtype`` computes its maps in the 16-bit forms
    (``cuda_half``): its results are rounded to at most 11 significant bits (bf16, fp16, fp8), so
    the forms' 2^-15 relative error never shows; fp32 kernels keep libm's forms.

    >>> half_form("bf16"), half_form("fp32")
    (True, False)
    """
    return lookup_dtype(dtype).bytes < 4


def get_function(name: str) -> ElementwiseFn:
    """Look up a whitelisted elementwise function; unknown names raise a DiagramError."""
    if not isinstance(name, str) or name not in FUNCTIONS:
        raise DiagramError(
            f"unknown elementwise function {_show(name)}; known: {', '.join(sorted(FUNCTIONS))}"
        )
    return FUNCTIONS[name]


def check_param_relations(fn: str, values) -> None:
    """Refuse parameters of ``fn`` that break its relations: one that must be > 0 (softplus's
    beta) or bounds out of order (a clamp's ``min_val > max_val``). Parameters that are not numbers
    yet (sympy expressions in unbound axis sizes) are checked once they are.

    >>> check_param_relations("hardtanh", (-1.0, 1.0))
    """
    f = get_function(fn)
    for i in f.positive_params:
        v = values[i] if i < len(values) else None
        if isinstance(v, numbers.Real) and not v > 0:
            raise DiagramError(f"map {fn}: parameter {f.param_name(i)} must be > 0, got {_show(v)}")
    for i, j in f.ordered_params:
        a = values[i] if i < len(values) else None
        b = values[j] if j < len(values) else None
        if isinstance(a, numbers.Real) and isinstance(b, numbers.Real) and not a <= b:
            raise DiagramError(f"map {fn}: parameter {f.param_name(i)} ({_show(a)}) must not exceed "
                               f"{f.param_name(j)} ({_show(b)})")


def check_int_param(fn: str, i: int, value) -> int:
    """Parameter ``i`` of the integer-parameter function ``fn`` as an ``int`` within its range.

    Accepts an int (not a bool), an integral finite float (``3.0`` becomes ``3``) or an integral
    sympy number; anything else (0.5, nan, inf, 1e300, True, "3", a sympy symbol) raises a
    DiagramError naming the function and the parameter.

    >>> check_int_param("causal", 0, -2.0)
    -2
    """
    f = get_function(fn)
    decl = f.int_param(i)
    where = f"{fn}: {f.param_name(i)}"
    if decl is None:
        raise DiagramError(f"{where} is not an integer parameter")
    out = _as_int(value)
    if out is None:
        raise DiagramError(f"{where} must be a finite integer, got {_show(value)}")
    if not decl.lo <= out <= decl.hi:
        raise DiagramError(f"{where} must lie in [{_show(decl.lo)}, {_show(decl.hi)}], got {_show(value)}")
    return out


def _as_int(value) -> int | None:
    """``value`` as an exact int, or None when it is not an integral finite real number."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
        return int(v) if math.isfinite(v) and v.is_integer() else None
    return None


def _show(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if value == MAX_INT_PARAM:
            return "2^62"
        if value == -MAX_INT_PARAM:
            return "-2^62"
    from .axes import shown

    return shown(value)
