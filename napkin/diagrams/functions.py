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

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable

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
    other as a float literal. ``param_names`` name the parameters in error messages;
    ``nonzero_params`` lists those that must not be 0 (a divisor).
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
            self.maximum = torch.maximum
            self.fmax = torch.fmax
            self.where = torch.where
            self.abs = torch.abs
        else:
            import numpy as np

            self.m = np
            self.erf = _numpy_erf
            self.maximum = np.maximum
            self.fmax = np.fmax
            self.where = np.where
            self.abs = np.abs
        self.exp = self.m.exp
        self.log = self.m.log
        self.tanh = self.m.tanh
        self.sqrt = self.m.sqrt

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


def _alibi_slope(h, n_heads, m):
    # Press et al.: slopes form the geometric sequence 2^(-8(h+1)/H).
    return m.exp(-(8.0 * (h + 1) / n_heads) * math.log(2.0))


FUNCTIONS: dict[str, ElementwiseFn] = {}


def _register(fn: ElementwiseFn) -> None:
    FUNCTIONS[fn.name] = fn


for _fn in [
    ElementwiseFn("add", 2, lambda m, xs, p, i, n: xs[0] + xs[1], "({x0} + {x1})", doc="x + y"),
    ElementwiseFn("sub", 2, lambda m, xs, p, i, n: xs[0] - xs[1], "({x0} - {x1})", doc="x - y"),
    ElementwiseFn("mul", 2, lambda m, xs, p, i, n: xs[0] * xs[1], "({x0} * {x1})", doc="x * y"),
    ElementwiseFn("div", 2, lambda m, xs, p, i, n: xs[0] / xs[1], "({x0} / {x1})", doc="x / y"),
    ElementwiseFn("maximum", 2, lambda m, xs, p, i, n: m.fmax(xs[0], xs[1]), "fmaxf({x0}, {x1})",
                  doc="max(x, y) (as fmaxf: a NaN operand gives the other one)"),
    ElementwiseFn("scale", 1, lambda m, xs, p, i, n: xs[0] * p[0], "({x0} * {p0})", n_params=1,
                  param_names=("c",), doc="c * x"),
    ElementwiseFn("shift", 1, lambda m, xs, p, i, n: xs[0] + p[0], "({x0} + {p0})", n_params=1,
                  param_names=("c",), doc="x + c"),
    ElementwiseFn("neg", 1, lambda m, xs, p, i, n: -xs[0], "(-{x0})", doc="-x"),
    ElementwiseFn("square", 1, lambda m, xs, p, i, n: xs[0] * xs[0], "({x0} * {x0})", doc="x²"),
    ElementwiseFn("exp", 1, lambda m, xs, p, i, n: m.exp(xs[0]), "__expf({x0})", sfu=1, doc="eˣ"),
    ElementwiseFn("log", 1, lambda m, xs, p, i, n: m.log(xs[0]), "__logf({x0})", sfu=1, doc="ln x"),
    ElementwiseFn("sqrt", 1, lambda m, xs, p, i, n: m.sqrt(xs[0]), "sqrtf({x0})", sfu=1, doc="√x"),
    ElementwiseFn("tanh", 1, lambda m, xs, p, i, n: m.tanh(xs[0]), "tanhf({x0})", sfu=1, doc="tanh x"),
    ElementwiseFn("relu", 1, lambda m, xs, p, i, n: m.relu(xs[0]), "fmaxf({x0}, 0.0f)",
                  doc="max(x, 0) as fmaxf(x, 0): relu(-0.0) = +0.0, relu(NaN) = 0"),
    ElementwiseFn(
        "gelu", 1,
        lambda m, xs, p, i, n: 0.5 * xs[0] * (1.0 + m.erf(xs[0] * _INV_SQRT2)),
        "(0.5f * {x0} * (1.0f + erff({x0} * 0.70710678118654752f)))",
        flops=4, sfu=1, doc="x·Φ(x) (exact, erf form, as torch.nn.functional.gelu)",
    ),
    ElementwiseFn(
        "silu", 1,
        lambda m, xs, p, i, n: xs[0] / (1.0 + m.exp(-xs[0])),
        "({x0} / (1.0f + __expf(-{x0})))",
        flops=3, sfu=1, doc="x·σ(x)",
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
        "alibi", 1,
        lambda m, xs, p, i, n: xs[0] - _alibi_slope(m.cast_like(i[0], xs[0]), n[0], m) * m.abs(i[1] - i[2]),
        "({x0} - exp2f(-8.0f * (float)({i0} + 1) / (float)({n0})) * fabsf((float)({i1} - {i2})))",
        index_arity=3, flops=4, sfu=1,
        doc="ALiBi: s − m_h·|q − x| with head slopes m_h = 2^(−8(h+1)/H)",
    ),
]:
    _register(_fn)


def get_function(name: str) -> ElementwiseFn:
    """Look up a whitelisted elementwise function; unknown names raise a DiagramError."""
    if not isinstance(name, str) or name not in FUNCTIONS:
        raise DiagramError(
            f"unknown elementwise function {_show(name)}; known: {', '.join(sorted(FUNCTIONS))}"
        )
    return FUNCTIONS[name]


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
