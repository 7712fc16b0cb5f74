"""Operations (boxes) and the values (wire bundles) that flow between them.

A :class:`Value` is an array: a tuple of axes and a dtype, produced by an
operation from other values. Values are immutable and hashable; building one
checks it (axis sizes agree, contracted axes exist, dtypes match) and raises a
:class:`DiagramError` naming the operation and the axis when it does not.

Every operation is defined on a few axes of its own (the contracted axis, the
normalised axis) and **woven** over every other axis its inputs carry; an input
that lacks a woven axis is broadcast along it. That is how a matmul is a woven
dot product and multi-head attention is attention woven over heads.

>>> from napkin.diagrams import Axis, array, contract, softmax
>>> q, x, d = Axis("q"), Axis("x"), Axis("d", 64)
>>> Q, K = array("Q", q, d), array("K", x, d)
>>> S = contract(Q, K, over=d, name="S")
>>> S.axis_names
('q', 'x')
>>> softmax(S, over=x).axis_names
('q', 'x')
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import sympy

from ..dtypes import dtype as lookup_dtype
from ..errors import DiagramError, NapkinError
from .axes import Axis, as_axis_name, as_axis_names, check_name, is_name, shown
from .functions import check_int_param, check_param_relations, get_function

# ----------------------------------------------------------------------------- ops


@dataclass(frozen=True)
class Op:
    """Base of every box. Subclasses are frozen dataclasses of plain, hashable fields."""

    kind = "op"

    def label(self) -> str:
        """Short text drawn inside the box."""
        return self.kind

    def own_axes(self) -> tuple[str, ...]:
        """Axes the operation is defined on (not woven over): contracted or normalised axes."""
        return ()

    def infer(self, args: tuple["Value", ...]) -> tuple[tuple[Axis, ...], str]:
        """Output axes and dtype for these inputs; raise DiagramError if they do not fit."""
        raise NotImplementedError


@dataclass(frozen=True)
class InputOp(Op):
    """A diagram input: a named array with no producer."""

    kind = "input"

    def label(self) -> str:
        return "input"


@dataclass(frozen=True)
class Contract(Op):
    """Any einsum: multiply inputs elementwise (broadcast by axis name), sum over ``over``.

    The output keeps every other axis, in order of first appearance, unless ``out`` says.
    """

    over: tuple[str, ...]
    out: tuple[str, ...] | None = None
    kind = "contract"

    def label(self) -> str:
        return "Σ " + ",".join(self.over) if self.over else "⊙"

    def own_axes(self) -> tuple[str, ...]:
        return self.over

    def infer(self, args):
        where = f"contract over {','.join(self.over) or '(nothing)'}"
        if not args:
            raise DiagramError(f"{where}: needs at least one input array")
        twice = sorted({n for n in self.over if self.over.count(n) > 1})
        if twice:
            raise DiagramError(f"{where}: axis {twice[0]!r} is listed twice in over")
        dt = _common_dtype(args, where)
        axes = _union_axes(args, where)
        names = [a.name for a in axes]
        for name in self.over:
            carriers = [v for v in args if name in v.axis_names]
            if not carriers:
                raise DiagramError(f"{where}: axis {name!r} is not carried by any input "
                                   f"({_describe_args(args)})")
            if len(args) == 2 and len(carriers) == 1:
                lacking = next(v for v in args if name not in v.axis_names)
                raise DiagramError(
                    f"{where}: input {lacking.label()} lacks axis {name!r}; a contraction sums "
                    f"over an axis both operands carry ({_describe_args(args)})"
                )
        kept = [a for a in axes if a.name not in self.over]
        if self.out is not None:
            by_name = {a.name: a for a in kept}
            if sorted(self.out) != sorted(by_name):
                raise DiagramError(
                    f"{where}: out={list(self.out)} must list exactly the kept axes {sorted(by_name)}"
                )
            kept = [by_name[n] for n in self.out]
        del names
        return tuple(kept), dt


@dataclass(frozen=True)
class Map(Op):
    """An elementwise function from the whitelist, broadcasting its inputs by axis name.

    ``index_axes`` are the axes whose integer position the function reads (masks and
    score modifiers such as causal, sliding window and ALiBi). ``params`` are its scalar
    parameters: an ``int`` for an integer parameter (a mask's offset or window), else a
    finite float or a sympy expression in axis sizes built from numbers, ``+ - * / **``
    and ``sqrt`` (``1/sqrt(d)``), checked by :func:`map_fn` and again by :meth:`infer`.
    """

    fn: str
    params: tuple[float | int | sympy.Expr, ...] = ()
    index_axes: tuple[str, ...] = ()
    kind = "map"

    def param_values(self, sizes: Mapping[str, int | sympy.Expr]) -> tuple[float | int, ...]:
        """Scalar parameters as numbers: an integer parameter as an ``int``, any other as a finite
        ``float``; symbolic ones (``1/√d``) use the axis sizes given. A value that is not what the
        function takes (a fractional mask offset, a parameter that evaluates to inf, nan or a
        complex number) raises a DiagramError naming the function and the parameter."""
        f = get_function(self.fn)
        out = []
        for i, p in enumerate(self.params):
            if f.int_param(i):
                out.append(check_int_param(self.fn, i, p))
                continue
            where = f"map {self.fn}: parameter {f.param_name(i)}"
            if isinstance(p, sympy.Basic):
                _check_expr(p, where)
                subs = {s: sizes[s.name] for s in p.free_symbols if s.name in sizes}
                value = p.subs(subs)
                if value.free_symbols:
                    names = ", ".join(sorted(s.name for s in value.free_symbols))
                    raise DiagramError(f"map {self.fn}: parameter {p} needs the size of axis {names}")
                out.append(_finite_float(value, where, i in f.nonzero_params, fp32=True))
            else:
                out.append(_finite_float(p, where, i in f.nonzero_params, fp32=True))
        check_param_relations(self.fn, out)
        return tuple(out)

    def label(self) -> str:
        if self.params:
            return f"{self.fn}({', '.join(_fmt_param(p) for p in self.params)})"
        return self.fn

    def infer(self, args):
        f = get_function(self.fn)
        where = f"map {self.fn}"
        if len(args) != f.arity:
            raise DiagramError(f"{where}: takes {f.arity} array input(s), got {len(args)}")
        check_params(self.fn, self.params)
        if len(self.index_axes) != f.index_arity:
            raise DiagramError(f"{where}: reads {f.index_arity} index axes, got {len(self.index_axes)}")
        dt = _common_dtype(args, where)
        axes = _union_axes(args, where)
        names = {a.name for a in axes}
        if len(set(self.index_axes)) != len(self.index_axes):
            raise DiagramError(f"{where}: reads the positions of {', '.join(self.index_axes)}: an axis appears "
                               "twice; give distinct axes (the query axis, then the key axis)")
        for name in self.index_axes:
            if name not in names:
                raise DiagramError(f"{where}: index axis {name!r} is not carried by its input "
                                   f"({_describe_args(args)})")
        return axes, dt


@dataclass(frozen=True)
class Reduce(Op):
    """Sum, max, min or mean over one axis, woven over the rest."""

    how: str
    over: str
    kind = "reduce"

    def label(self) -> str:
        return f"{self.how} {self.over}"

    def own_axes(self) -> tuple[str, ...]:
        return (self.over,)

    def infer(self, args):
        if self.how not in ("sum", "max", "min", "mean"):
            raise DiagramError(f"reduce: unknown reduction {shown(self.how)}; use sum, max, min or mean")
        (x,) = args
        _require_axis(x, self.over, f"{self.how} over {self.over}")
        return tuple(a for a in x.axes if a.name != self.over), x.dtype


@dataclass(frozen=True)
class Softmax(Op):
    """softmax along one axis, woven over the rest."""

    over: str
    kind = "softmax"

    def label(self) -> str:
        return f"softmax {self.over}"

    def own_axes(self) -> tuple[str, ...]:
        return (self.over,)

    def infer(self, args):
        (x,) = args
        _require_axis(x, self.over, f"softmax over {self.over}")
        return x.axes, x.dtype


@dataclass(frozen=True)
class Norm(Op):
    """layernorm ((x − mean)/√(var + eps)) or rmsnorm (x/√(mean x² + eps)) along one axis."""

    how: str
    over: str
    eps: float
    kind = "norm"

    def label(self) -> str:
        return f"{self.how} {self.over}"

    def own_axes(self) -> tuple[str, ...]:
        return (self.over,)

    def infer(self, args):
        if self.how not in ("layernorm", "rmsnorm"):
            raise DiagramError(f"norm: unknown normalisation {shown(self.how)}")
        _check_eps(self.how, self.eps)
        (x,) = args
        _require_axis(x, self.over, f"{self.how} over {self.over}")
        return x.axes, x.dtype


@dataclass(frozen=True)
class Rename(Op):
    """Relabel axes (a free view): self-attention reads one token axis as queries q and keys x."""

    mapping: tuple[tuple[str, str], ...]
    kind = "rename"

    def label(self) -> str:
        return ", ".join(f"{a}→{b}" for a, b in self.mapping)

    def infer(self, args):
        (x,) = args
        m = dict(self.mapping)
        for old in m:
            _require_axis(x, old, f"rename {old}→{m[old]}")
        new = tuple(Axis(m.get(a.name, a.name), a.size) for a in x.axes)
        seen = set()
        for a in new:
            if a.name in seen:
                raise DiagramError(f"rename {self.label()}: axis {a.name!r} would appear twice")
            seen.add(a.name)
        return new, x.dtype


# -------------------------------------------------------------------------- values


class Value:
    """An array in a diagram: axes and dtype, produced by ``op`` from ``args``.

    Values are immutable and hashable (the hash is computed once, so large
    diagrams with shared sub-graphs stay cheap). Arithmetic operators build maps:
    ``S * 0.125``, ``X + Y``, ``-X``.
    """

    __slots__ = ("op", "args", "axes", "dtype", "name", "_hash")

    def __init__(self, op: Op, args: tuple["Value", ...], axes: tuple[Axis, ...], dtype: str,
                 name: str | None = None):
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "axes", tuple(axes))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_hash", hash((op, self.args, self.axes, dtype, name)))

    def __setattr__(self, key, value):
        raise AttributeError("napkin values are immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, Value) or self._hash != other._hash:
            return False
        return (self.op == other.op and self.axes == other.axes and self.dtype == other.dtype
                and self.name == other.name and self.args == other.args)

    # -- views
    @property
    def axis_names(self) -> tuple[str, ...]:
        """Names of the axes, in order."""
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis:
        """The axis called ``name``; DiagramError if this value does not carry it."""
        for a in self.axes:
            if a.name == name:
                return a
        raise DiagramError(f"{self.label()} has no axis {shown(name)}; it carries {list(self.axis_names)}")

    @property
    def is_input(self) -> bool:
        return isinstance(self.op, InputOp)

    def label(self) -> str:
        """Name and axes, e.g. ``Q[q,d]``."""
        return f"{self.name or self.op.kind}[{','.join(self.axis_names)}]"

    def depends_on(self, target: "Value") -> bool:
        """Whether this value is ``target`` or is computed from it (through any boxes).

        >>> from napkin.diagrams import Axis
        >>> x = array("X", Axis("a"))
        >>> (x * 2.0).depends_on(x), x.depends_on(x * 2.0)
        (True, False)
        """
        stack, seen = [self], set()
        while stack:
            u = stack.pop()
            if u is target:
                return True
            if id(u) not in seen:
                seen.add(id(u))
                stack.extend(u.args)
        return False

    def named(self, name: str) -> "Value":
        """The same value under another name."""
        return Value(self.op, self.args, self.axes, self.dtype, check_name(name, "array"))

    def __repr__(self) -> str:
        return f"<{self.label()} {self.dtype} = {self.op.label()}>"

    # -- arithmetic builds maps
    def __add__(self, other):
        return _binary_or_scalar("add", "shift", self, other, "+")

    __radd__ = __add__

    def __sub__(self, other):
        return _binary_or_scalar("sub", "shift", self, other, "-")

    def __rsub__(self, other):
        _scalar(other, f"{shown(other)} - {self.label()}")
        return (-self) + other

    def __mul__(self, other):
        return _binary_or_scalar("mul", "scale", self, other, "*")

    __rmul__ = __mul__

    def __truediv__(self, other):
        return _binary_or_scalar("div", "scale", self, other, "/")

    def __rtruediv__(self, other):
        raise DiagramError(f"{_short(other)} / {self.label()}: dividing a scalar by an array is not a "
                           "whitelisted map; build an array of the numerator and use map_fn('div', ...)")

    def __pow__(self, other):
        raise DiagramError(f"{self.label()} ** {_short(other)}: powers are not a whitelisted map operator; "
                           "use power(x, p) for a scalar exponent p (C's powf), square(x) or sqrt(x)")

    def __matmul__(self, other):
        raise DiagramError(f"{self.label()} @ ...: name the contracted axis with contract(a, b, over=axis)")

    __rmatmul__ = __matmul__

    def __neg__(self):
        return map_fn("neg", self)


def _fmt_param(p) -> str:
    if isinstance(p, sympy.Basic):
        return str(p).replace("sqrt", "√")
    if isinstance(p, int):
        return str(p)
    return f"{p:.4g}"


def _short(value) -> str:
    """A value for an error message, on one line (:func:`napkin.diagrams.axes.shown`)."""
    return shown(value)


#: The sympy node types a parameter expression may use: numbers, axis-size symbols, + * and ** (so
#: - and / and sqrt, which sympy writes with them). Anything else (functions, relations, undefined
#: functions whose names are free text) never reaches a label or generated code.
_EXPR_NODES = (sympy.Add, sympy.Mul, sympy.Pow, sympy.Symbol, sympy.Number, sympy.NumberSymbol)


def _check_expr(expr: sympy.Basic, where: str) -> sympy.Basic:
    """Refuse a parameter expression with anything but plain arithmetic on finite numbers and
    symbols named like axes (``1/sqrt(d)``); ``where`` names the function and the parameter."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Symbol):
            if type(node) is not sympy.Symbol or not is_name(node.name):
                raise DiagramError(f"{where}: symbol {node.name!r} is not an axis name (an ASCII letter "
                                   "followed by at most 31 ASCII letters, digits or '_')")
        elif isinstance(node, sympy.Number):
            if not (node.is_finite and node.is_real):
                raise DiagramError(f"{where}: {node} is not a finite real number")
        elif not isinstance(node, _EXPR_NODES):
            raise DiagramError(f"{where}: {_short(str(node))} is not plain arithmetic; a parameter may use "
                               "numbers, axis sizes, + - * / ** and sqrt only")
    return expr


#: The largest finite float32, and the smallest normal one: kernels compute in fp32, so a map
#: parameter must be finite there, and one the kernel divides by must not flush to 0.
FLT_MAX = 3.4028234663852886e38
FLT_MIN = 1.1754943508222875e-38


def _finite_float(value, where: str, nonzero: bool = False, fp32: bool = False) -> float:
    """``value`` (a real number or a number-valued sympy expression) as a finite float; ``fp32``:
    also finite in float32 (and, when ``nonzero``, not below its smallest normal magnitude)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, sympy.Basic)):
        raise DiagramError(f"{where}: {_short(value)} is not a number")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise DiagramError(f"{where}: {_short(value)} is not a finite real number") from None
    if not math.isfinite(v):
        raise DiagramError(f"{where}: {_short(value)} is not a finite real number")
    if nonzero and v == 0:
        raise DiagramError(f"{where}: must not be 0")
    if fp32 and abs(v) > FLT_MAX:
        raise DiagramError(f"{where}: {_short(value)} is beyond the float32 range kernels compute in "
                           f"(|value| <= {FLT_MAX:.7g})")
    if fp32 and nonzero and abs(v) < FLT_MIN:
        raise DiagramError(f"{where}: {_short(value)} is below the smallest normal float32 "
                           f"({FLT_MIN:.7g}); kernels divide by it")
    return v


def _as_param(p, fn: str = "", i: int = 0):
    """One float parameter of ``fn`` as stored in a Map: a finite float, or a checked sympy
    expression with free symbols (axis sizes bound later)."""
    f = get_function(fn) if fn else None
    where = f"map {fn}: parameter {f.param_name(i)}" if f else "scalar parameter"
    nonzero = bool(f and i in f.nonzero_params)
    if isinstance(p, sympy.Basic):
        _check_expr(p, where)
        return p if p.free_symbols else _finite_float(p, where, nonzero, fp32=True)
    return _finite_float(p, where, nonzero, fp32=True)


def check_params(fn: str, params) -> tuple:
    """The parameters of the whitelisted function ``fn`` as a Map stores them: an integer
    parameter (a mask's offset or window) as an ``int`` in its range, any other as a finite float
    or a checked sympy expression. A wrong count or value raises a DiagramError naming ``fn`` and
    the parameter.

    >>> check_params("causal", (2.0,)), check_params("scale", (1,))
    ((2,), (1.0,))
    """
    f = get_function(fn)
    if isinstance(params, (str, bytes)) or not isinstance(params, (tuple, list)):
        raise DiagramError(f"map {fn}: params must be a tuple of numbers, got {_short(params)}")
    if len(params) != f.n_params:
        raise DiagramError(f"map {fn}: takes {f.n_params} scalar parameter(s), got {len(params)}")
    out = tuple(check_int_param(fn, i, p) if f.int_param(i) else _as_param(p, fn, i)
                for i, p in enumerate(params))
    check_param_relations(fn, out)
    return out


def _scalar(other, where: str):
    """A scalar operand of array arithmetic: a finite float or a checked sympy expression."""
    if isinstance(other, bool) or not isinstance(other, (numbers.Real, sympy.Basic)):
        raise DiagramError(f"{where}: {_short(other)} is neither a napkin array nor a number")
    if isinstance(other, sympy.Basic):
        _check_expr(other, where)
        return other if other.free_symbols else _finite_float(other, where)
    return _finite_float(other, where)


def _binary_or_scalar(binary: str, unary: str, x: Value, other, symbol: str):
    if isinstance(other, Value):
        return map_fn(binary, x, other)
    where = f"{x.label()} {symbol} {_short(other)}"
    c = _scalar(other, where)
    if symbol == "-":
        c = -c
    elif symbol == "/":
        if c == 0:
            raise DiagramError(f"{where}: division by zero")
        c = 1 / c if isinstance(c, sympy.Basic) else 1.0 / c
        if not isinstance(c, sympy.Basic) and not math.isfinite(c):
            raise DiagramError(f"{where}: the reciprocal of the scalar is not a finite float")
    return map_fn(unary, x, params=(c,))


def _describe_args(args) -> str:
    return ", ".join(v.label() for v in args)


def _require_axis(x: Value, name: str, where: str) -> None:
    if name not in x.axis_names:
        raise DiagramError(f"{where}: input {x.label()} has no axis {name!r}")


def _common_dtype(args: Sequence[Value], where: str) -> str:
    dts = {v.dtype for v in args}
    if len(dts) > 1:
        detail = ", ".join(f"{v.label()} is {v.dtype}" for v in args)
        raise DiagramError(f"{where}: inputs have different dtypes ({detail}); cast them to one dtype")
    return args[0].dtype


def _union_axes(args: Sequence[Value], where: str) -> tuple[Axis, ...]:
    """Axes of all inputs by name, in order of first appearance; sizes must agree."""
    seen: dict[str, tuple[Axis, Value]] = {}
    order = []
    for v in args:
        for a in v.axes:
            if a.name in seen:
                other, owner = seen[a.name]
                if other.size != a.size:
                    raise DiagramError(
                        f"{where}: axis {a.name!r} has size {other.size} in {owner.label()} "
                        f"but {a.size} in {v.label()}"
                    )
            else:
                seen[a.name] = (a, v)
                order.append(a)
    return tuple(order)


def apply(op: Op, args: Sequence[Value], name: str | None = None) -> Value:
    """Apply an operation to values, checking them; the one place values are built."""
    args = tuple(args)
    if not isinstance(op, Op):
        raise DiagramError(f"apply: {_short(op)} is not a napkin box")
    for v in args:
        if not isinstance(v, Value):
            raise DiagramError(f"{op.kind}: expected napkin arrays as inputs, got {type(v).__name__}")
    if name is not None:
        check_name(name, "array")
    axes, dt = op.infer(args)
    return Value(op, args, axes, dt, name)


# ------------------------------------------------------------------------- builders


def array(name: str, *axes: Axis, dtype: str = "bf16") -> Value:
    """A named input array carrying ``axes`` (an Axis each, or a tuple of them).

    >>> from napkin.diagrams import axes
    >>> a, b = axes("a b")
    >>> array("A", a, b).label()
    'A[a,b]'
    """
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    check_name(name, "array")
    names = set()
    for a in axes:
        if not isinstance(a, Axis):
            raise DiagramError(f"array {name!r}: expected Axis objects, got {shown(a)}")
        if a.name in names:
            raise DiagramError(f"array {name!r}: axis {a.name!r} appears twice")
        names.add(a.name)
    return Value(InputOp(), (), tuple(axes), dtype_name(dtype, f"array {name!r}"), name)


def dtype_name(dtype, where: str) -> str:
    """The napkin name of ``dtype`` (a name such as ``"bf16"`` or ``"float16"``, or a DType); an
    unknown one raises a DiagramError that starts with ``where``.

    >>> dtype_name("float16", "array 'X'")
    'fp16'
    """
    from ..dtypes import DType

    if not isinstance(dtype, (str, DType)):
        raise DiagramError(f"{where}: unknown dtype {shown(dtype)}; use a dtype name such as 'bf16'")
    try:
        return lookup_dtype(dtype).name
    except NapkinError as e:
        raise DiagramError(f"{where}: {e}") from None


def contract(*xs: Value, over, out=None, name: str | None = None) -> Value:
    """Multiply ``xs`` (broadcast by axis name) and sum over the axes ``over``.

    >>> from napkin.diagrams import axes
    >>> a, b, c = axes("a b c")
    >>> C = contract(array("A", a, b), array("B", b, c), over=b)
    >>> C.axis_names
    ('a', 'c')
    """
    return apply(Contract(as_axis_names(over), None if out is None else as_axis_names(out)), xs, name)


def map_fn(fn: str, *xs: Value, params: Sequence[float] = (), index_axes=(), name: str | None = None) -> Value:
    """Apply the whitelisted elementwise function ``fn`` (see ``functions.FUNCTIONS``)."""
    if not isinstance(fn, str):
        raise DiagramError(f"map_fn: the function must be a name from the whitelist, got {_short(fn)}")
    return apply(Map(fn, check_params(fn, params), as_axis_names(index_axes)), xs, name)


def reduce(x: Value, over, how: str = "sum", name: str | None = None) -> Value:
    """Reduce ``x`` over one axis, or several, with ``how`` in sum, max, min, mean.

    Several axes (a list or tuple) give one reduction box per axis, in the order given, the last
    one named ``name``: a sum (max, min) over several axes is the sum of sums, and a mean over
    several axes the mean of means (every slice has the same count). The planner fuses the chain
    into one kernel, so this costs nothing over a single box.

    >>> from napkin.diagrams import axes
    >>> a, b, c = axes("a b c")
    >>> y = reduce(array("X", a, b, c), (a, c), "sum", name="Y")
    >>> y.axis_names, y.name, y.args[0].op.label()
    (('b',), 'Y', 'sum a')
    """
    if isinstance(over, (Axis, str)):
        return apply(Reduce(how, as_axis_name(over)), (x,), name)
    names = _checked_axes(over, x, _short(how))
    for n in names[:-1]:
        x = apply(Reduce(how, n), (x,), None)
    return apply(Reduce(how, names[-1]), (x,), name)


def sum_over(x: Value, over, name: str | None = None) -> Value:
    """Σ over one axis, or over several (a list or tuple: see :func:`reduce`)."""
    return reduce(x, over, "sum", name)


def max_over(x: Value, over, name: str | None = None) -> Value:
    """max over one axis, or over several (see :func:`reduce`)."""
    return reduce(x, over, "max", name)


def min_over(x: Value, over, name: str | None = None) -> Value:
    """min over one axis, or over several (see :func:`reduce`)."""
    return reduce(x, over, "min", name)


def mean_over(x: Value, over, name: str | None = None) -> Value:
    """mean over one axis, or over several (see :func:`reduce`)."""
    return reduce(x, over, "mean", name)


def _checked_axes(over, x, how: str) -> tuple[str, ...]:
    """The axis names of the sequence ``over``: at least one, none twice, each carried by ``x``
    (else a DiagramError naming ``how``)."""
    names = as_axis_names(over)
    if not names:
        raise DiagramError(f"{how} over no axes: give at least one axis")
    if len(set(names)) != len(names):
        raise DiagramError(f"{how} over {', '.join(names)}: an axis appears twice")
    if isinstance(x, Value):
        for n in names:
            _require_axis(x, n, f"{how} over {', '.join(names)}")
    return names


def _row_axes(over, x, how: str) -> tuple[str, ...]:
    """The axis names of the row a softmax, logsumexp or norm runs along: one axis, or several (a
    list or tuple, checked as :func:`reduce` checks them: torch's ``nn.LayerNorm((c, h, w))``)."""
    if isinstance(over, (Axis, str)):
        return (as_axis_name(over),)
    return _checked_axes(over, x, how)


def softmax(x: Value, over, name: str | None = None) -> Value:
    """softmax along ``over``, woven over every other axis.

    A lone softmax cannot be streamed along ``over`` (it needs the whole row);
    a softmax followed by a contraction over the same axis can.

    Over several axes (a list or tuple), the softmax of the flattened row is written out as
    boxes: ``e = exp(x − max_over(x, over))``, ``e / sum_over(e, over)``; the row-wise family
    runs the chain as one kernel.

    >>> from napkin.diagrams import axes
    >>> a, b, c = axes("a b c")
    >>> softmax(array("X", a, b, c), (b, c), name="Y").axis_names
    ('a', 'b', 'c')
    """
    names = _row_axes(over, x, "softmax")
    if len(names) == 1:
        return apply(Softmax(names[0]), (x,), name)
    e = exp(x - max_over(x, names))
    return map_fn("div", e, sum_over(e, names), name=name)


def _check_eps(how: str, eps) -> float:
    """``eps`` of a normalisation as a float: a finite number > 0 that float32, which kernels add it
    in, holds as a normal number (1e-300 became 0 in the kernel and a constant row NaN), else a
    DiagramError."""
    v = _finite_float(eps, f"{how}: eps", fp32=True)
    if v <= 0:
        raise DiagramError(f"{how}: eps: {_short(eps)} is not > 0")
    if v < FLT_MIN:
        raise DiagramError(f"{how}: eps: {_short(eps)} is below the smallest normal float32 ({FLT_MIN:.7g}), "
                           "which kernels add it in: it would be 0 there")
    return v


def layernorm(x: Value, over, eps: float = 1e-5, name: str | None = None) -> Value:
    """(x − mean)/√(var + eps) along ``over`` (no affine: multiply and add a weight and bias).

    ``eps`` must be a finite number > 0. Over several axes (a list or tuple: torch's
    ``nn.LayerNorm((c, h, w))``, a batch norm's statistics over ``(n, s)``), the norm of the
    flattened row is written out as boxes, as the library's ``group_norm`` is: ``D = x − mean``,
    ``D·rsqrt(mean(D²) + eps)`` (the biased variance, as torch).

    >>> from napkin.diagrams import axes
    >>> n, c, s = axes("n c s")
    >>> layernorm(array("X", n, c, s), (c, s), name="Y").axis_names
    ('n', 'c', 's')
    """
    e = _check_eps("layernorm", eps)
    names = _row_axes(over, x, "layernorm")
    if len(names) == 1:
        return apply(Norm("layernorm", names[0], e), (x,), name)
    d = x - mean_over(x, names)
    return map_fn("mul", d, rsqrt(mean_over(square(d), names) + e), name=name)


def rmsnorm(x: Value, over, eps: float = 1e-6, name: str | None = None) -> Value:
    """x/√(mean(x²) + eps) along ``over``; ``eps`` must be a finite number > 0.

    Over several axes (a list or tuple), written out as boxes: ``x·rsqrt(mean(x²) + eps)``.
    """
    e = _check_eps("rmsnorm", eps)
    names = _row_axes(over, x, "rmsnorm")
    if len(names) == 1:
        return apply(Norm("rmsnorm", names[0], e), (x,), name)
    return map_fn("mul", x, rsqrt(mean_over(square(x), names) + e), name=name)


def rename(x: Value, mapping: Mapping | None = None, /, name: str | None = None, **more) -> Value:
    """Relabel axes: ``rename(X, q=Axis("x"))``, ``rename(X, q="x")``, or with a mapping (for an
    axis called ``name``): ``rename(X, {"name": "n"})``.

    >>> from napkin.diagrams import axes
    >>> q, x, e = axes("q x e")
    >>> rename(array("X", x, e), x="k").axis_names
    ('k', 'e')
    """
    if mapping is not None and not isinstance(mapping, Mapping):
        raise DiagramError(f"rename: the mapping must map old axis names to new ones, got {shown(mapping)}")
    both = {**(mapping or {}), **more}
    pairs = tuple((check_name(old, "axis"), as_axis_name(new)) for old, new in both.items())
    return apply(Rename(pairs), (x,), name)


def _unary(fn: str, doc: str):
    def build(x: Value, name: str | None = None) -> Value:
        return map_fn(fn, x, name=name)

    build.__name__ = fn
    build.__doc__ = doc
    return build


exp = _unary("exp", "eˣ elementwise.")
log = _unary("log", "ln x elementwise.")
tanh = _unary("tanh", "tanh elementwise.")
gelu = _unary("gelu", "GELU (erf form, as torch's default) elementwise.")
silu = _unary("silu", "SiLU x·σ(x) elementwise.")
relu = _unary("relu", "max(x, 0) elementwise.")
square = _unary("square", "x² elementwise.")
sqrt = _unary("sqrt", "√x elementwise: sqrt(-0.0) = -0.0, NaN below 0.")
rsqrt = _unary("rsqrt", "1/√x elementwise (torch.rsqrt): rsqrt(±0) = ±inf, rsqrt(inf) = 0, NaN below 0.")
erf = _unary("erf", "erf x elementwise.")
absolute = _unary("abs", "|x| elementwise (the whitelisted map ``abs``; named as NumPy's ``absolute`` so a "
                         "star import does not hide Python's ``abs``).")
sigmoid = _unary("sigmoid", "σ(x) = 1/(1 + e⁻ˣ) elementwise (torch.sigmoid): 0 at -inf, 1 at inf.")
mish = _unary("mish", "x·tanh(softplus(x)) elementwise (torch.nn.functional.mish; NaN at -inf, as torch).")
selu = _unary("selu", "SELU elementwise (torch.nn.functional.selu, its alpha and scale).")
hardswish = _unary("hardswish", "x·relu6(x + 3)/6 elementwise (torch.nn.functional.hardswish; NaN at -inf, "
                                "as torch).")
hardsigmoid = _unary("hardsigmoid", "relu6(x + 3)/6 elementwise (torch.nn.functional.hardsigmoid).")


def minimum(x: Value, y: Value, name: str | None = None) -> Value:
    """min(x, y) elementwise, broadcast by axis name, as ``fminf``: a NaN operand gives the other one
    (as torch.fmin; torch.minimum would give NaN) and -0.0 orders below +0.0."""
    return map_fn("minimum", x, y, name=name)


def maximum(x: Value, y: Value, name: str | None = None) -> Value:
    """max(x, y) elementwise, broadcast by axis name, as ``fmaxf``: a NaN operand gives the other one
    (as torch.fmax; torch.maximum would give NaN) and +0.0 orders above -0.0."""
    return map_fn("maximum", x, y, name=name)


def power(x: Value, p: float, name: str | None = None) -> Value:
    """x^p for a scalar exponent ``p`` (finite), as C's ``powf``: a negative x with a non-integer
    ``p`` gives NaN, pow(x, 0) = 1. (``x ** p`` is refused, naming this builder.)"""
    return map_fn("pow", x, params=(p,), name=name)


def hardtanh(x: Value, min_val: float = -1.0, max_val: float = 1.0, name: str | None = None) -> Value:
    """x clamped to ``[min_val, max_val]`` (torch.nn.functional.hardtanh); see :func:`clamp`."""
    return map_fn("hardtanh", x, params=(min_val, max_val), name=name)


def clamp(x: Value, lo: float, hi: float, name: str | None = None) -> Value:
    """x clamped to ``[lo, hi]``: the ``hardtanh`` map. ``lo`` and ``hi`` are finite fp32 numbers (or
    expressions in axis sizes) with ``lo <= hi``, else a DiagramError; ±inf is refused, as for every
    map parameter (for a bound on one side only, pass ±3.4028234663852886e38, which maps ±inf to that
    bound). NaN stays NaN, and x is returned unchanged unless it lies strictly outside, so -0.0 stays
    -0.0 with ``lo = 0``.

    >>> from napkin.diagrams import Axis
    >>> clamp(array("X", Axis("r")), 0.0, 6.0).op.label()
    'hardtanh(0, 6)'
    """
    return map_fn("hardtanh", x, params=(lo, hi), name=name)


def softplus(x: Value, beta: float = 1.0, threshold: float = 20.0, name: str | None = None) -> Value:
    """log(1 + e^(beta·x))/beta elementwise, and x where beta·x > threshold, as
    torch.nn.functional.softplus; ``beta`` > 0. Computed so that it never overflows."""
    return map_fn("softplus", x, params=(beta, threshold), name=name)


def elu(x: Value, alpha: float = 1.0, name: str | None = None) -> Value:
    """x for x >= 0, alpha·(eˣ − 1) below (torch.nn.functional.elu)."""
    return map_fn("elu", x, params=(alpha,), name=name)


def leaky_relu(x: Value, negative_slope: float = 0.01, name: str | None = None) -> Value:
    """x for x > 0, negative_slope·x otherwise (torch.nn.functional.leaky_relu)."""
    return map_fn("leaky_relu", x, params=(negative_slope,), name=name)


def logsumexp(x: Value, over, name: str | None = None) -> Value:
    """log Σ_over eˣ, woven over every other axis (``over`` one axis or several), as
    torch.logsumexp: composed of existing boxes,
    ``m = zero_inf(max_over(x))``, ``log(sum_over(exp(x − m))) + m``.

    Subtracting the row's max keeps every exponent <= 0 (no overflow). ``zero_inf`` replaces a max
    of ±inf by 0 (as torch.logsumexp does): a row of only -inf then gives log(0) + 0 = -inf rather
    than -inf − (-inf) = NaN, and a row holding +inf gives +inf. A NaN in the row gives NaN.

    >>> from napkin.diagrams import Axis
    >>> logsumexp(array("X", Axis("r"), Axis("c")), over="c").axis_names
    ('r',)
    """
    names = _row_axes(over, x, "logsumexp")
    over = names[0] if len(names) == 1 else names
    m = map_fn("zero_inf", max_over(x, over))
    return map_fn("add", log(sum_over(exp(x - m), over)), m, name=name)


def shifted_exp(v: Value) -> "tuple[Value, Value, Value, bool] | None":
    """``(x, c, m, exact)`` when ``v`` is ``exp(x − c)`` with ``c`` a max reduction ``m`` (``exact``)
    or ``zero_inf(m)``: the terms of the sum a softmax or :func:`logsumexp` is written out with, which
    an online pass can rescale as its running max grows. None for any other box.

    >>> from napkin.diagrams import Axis
    >>> X = array("X", Axis("r"), Axis("c"))
    >>> m = max_over(X, "r")
    >>> x, c, mm, exact = shifted_exp(exp(map_fn("sub", X, m)))
    >>> x is X and c is m and mm is m and exact
    True
    """
    if not (isinstance(v.op, Map) and v.op.fn == "exp"):
        return None
    sub = v.args[0]
    if not (isinstance(sub.op, Map) and sub.op.fn == "sub" and len(sub.args) == 2):
        return None
    x, c = sub.args
    zeroed = isinstance(c.op, Map) and c.op.fn == "zero_inf"
    m = c.args[0] if zeroed else c
    if not (isinstance(m.op, Reduce) and m.op.how == "max"):
        return None
    return x, c, m, not zeroed


def scale(x: Value, c: float, name: str | None = None) -> Value:
    """c·x; ``c`` is a finite number or a sympy expression in axis sizes (``1/sqrt(d)``)."""
    return map_fn("scale", x, params=(c,), name=name)


def softcap(x: Value, cap: float, name: str | None = None) -> Value:
    """cap·tanh(x/cap): logit soft-capping (Gemma 2); ``cap`` is finite and not 0."""
    return map_fn("softcap", x, params=(cap,), name=name)


def causal(scores: Value, q, x, offset: int = 0, name: str | None = None) -> Value:
    """Mask keys after the query: keep ``x ≤ q + offset`` (−inf elsewhere).

    ``offset`` is an integer with ``|offset| ≤ 2^62`` (``3.0`` is taken as 3; ``0.5``, nan, inf
    and symbols are refused), so the kernel and the reference compare the same integers.

    >>> from napkin.diagrams import axes
    >>> q, x = axes("q x")
    >>> causal(array("S", q, x), q, x, offset=-1.0).op.params
    (-1,)
    """
    return map_fn("causal", scores, params=(offset,), index_axes=(q, x), name=name)


def sliding_window(scores: Value, q, x, window: int, name: str | None = None) -> Value:
    """Keep the last ``window`` keys up to the query: ``q − window < x ≤ q``; ``window`` is an
    integer in ``[1, 2^62]``."""
    return map_fn("sliding_window", scores, params=(window,), index_axes=(q, x), name=name)


def tril(x: Value, i, j, diagonal: int = 0, name: str | None = None) -> Value:
    """The lower triangle of ``x`` over its axes ``i`` (rows) and ``j`` (columns), as torch.tril:
    ``x`` where ``j ≤ i + diagonal``, +0.0 above (a NaN there too). ``diagonal`` is an integer as
    :func:`causal`'s offset is. A triangular matrix product is ``tril(contract(A, B, over=k), a, n)``:
    the zeros are written by the product's own epilogue.

    >>> from napkin.diagrams import axes
    >>> a, n = axes("a n")
    >>> tril(array("C", a, n), a, n, diagonal=-1).op.label()
    'tril(-1)'
    """
    return map_fn("tril", x, params=(diagonal,), index_axes=(i, j), name=name)


def triu(x: Value, i, j, diagonal: int = 0, name: str | None = None) -> Value:
    """The upper triangle of ``x`` over its axes ``i`` (rows) and ``j`` (columns), as torch.triu:
    ``x`` where ``j ≥ i + diagonal``, +0.0 below (a NaN there too)."""
    return map_fn("triu", x, params=(diagonal,), index_axes=(i, j), name=name)


def alibi(scores: Value, h, q, x, name: str | None = None) -> Value:
    """ALiBi bias: ``s − m_h·|q − x|`` with per-head slopes ``m_h = 2^(−8(h+1)/H)``."""
    return map_fn("alibi", scores, index_axes=(h, q, x), name=name)
