"""Differentiating a diagram: the backward diagram of reverse-mode differentiation.

:func:`grad` (``Diagram.grad``) turns a forward diagram into its **backward diagram**, itself an
ordinary diagram of the same boxes, so it renders, plans, generates and runs as a PyTorch
reference like any other:

- its inputs are the forward's inputs, then one **cotangent** per forward output, named ``d`` +
  the output's name and carrying that output's axes, then the **saved** forward arrays (``save=``);
- its outputs are the gradients, ``d`` + the input's name, of the inputs in ``wrt`` (default:
  every input), each carrying its input's axes in its input's order.

Every box contributes its vector–Jacobian product (VJP) as boxes:

- a contraction gives one contraction per operand (``C = A·B``: ``dA = dC·Bᵀ``, ``dB = Aᵀ·dC``);
- softmax gives ``P ⊙ (dP − rowsum(dP ⊙ P))``; when P feeds only ``O = Σ_x P·V``, the row sum is
  FlashAttention's ``rowsum(dO ⊙ O)`` (the same number, computed from O rather than from P);
- layernorm and rmsnorm give ``r·(g − mean(g) − y·mean(g·y))`` (rmsnorm without ``mean(g)``), with
  ``r = 1/√(var + eps)`` and ``y`` the normalised row;
- each elementwise function its derivative, with the kinks where PyTorch's autograd of the
  reference puts them (``relu'(0) = 0``; ``clamp`` passes the bounds themselves); a kink is the
  ``gate`` map (``x where c > 0, else 0``), so an infinity on the side not taken never becomes NaN;
- sum, mean, max and min reductions (max and min share the gradient evenly between ties, as
  ``torch.amax``), renames, and masks: a mask's gradient passes where the mask keeps the score and
  is 0 where it masks; when the masked scores only feed softmaxes (attention), whose gradient is
  already 0 there, it passes unchanged (ALiBi's bias always passes);
- an input broadcast along an axis gets its gradient summed over that axis.

A forward value the backward needs (P for dV, the operands of a contraction, a map's input) is
either **recomputed** in the backward diagram from the forward's inputs (the default) or
**saved**: a name in ``save`` makes it an extra input of the backward diagram, named as the
forward array. Besides arrays, the statistics of a row may be saved: ``P_lse`` (the log-sum-exp of
softmax ``P``, from which ``P = exp(S − P_lse)`` is recomputed elementwise, as FlashAttention's
backward does) and ``N_rstd`` / ``N_mean`` (the 1/√(var + eps) and mean of norm ``N``).
:func:`saveable` lists what may be saved; :func:`forward_with_saves` is the forward diagram that
also outputs it. Which to save is a performance question: :mod:`napkin.perfmodel.saving` decides
(this module never imports the performance model).

>>> from napkin.diagrams import library
>>> b = library.get("matmul").grad()
>>> b.input_names, b.output_names
(('A', 'B', 'dC'), ('dA', 'dB'))
>>> [n.op.label() for n in b.nodes]
['Σ c', 'Σ a']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import sympy

from ..errors import DiagramError
from .axes import is_name, shown
from .functions import SELU_ALPHA, SELU_SCALE, get_function
from .ops import (Contract, Map, Norm, Reduce, Rename, Softmax, Value, apply, array, contract, erf, exp,
                  logsumexp, map_fn, mean_over, rename, rsqrt, sigmoid, softplus, square, sum_over, tanh)

__all__ = ["Saved", "forward_with_saves", "grad", "inputs_read", "saveable", "recomputed_from_statistics"]

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@dataclass(frozen=True)
class Saved:
    """A forward array the backward diagram reads, which may be saved instead of recomputed.

    ``name`` is the backward diagram's input when saved; ``kind`` is ``"value"`` (the forward
    array ``of`` itself), ``"lse"`` (the log-sum-exp of softmax ``of`` over ``over``), ``"rstd"`` or
    ``"mean"`` (the 1/√(var + eps) and mean of norm ``of`` over ``over``); ``axes`` its axes.
    """

    name: str
    kind: str
    of: str
    axes: tuple[str, ...]
    dtype: str
    over: str | None = None


# ----------------------------------------------------------------------------- helpers


def _size_of(v: Value, axis: str):
    return v.axis(axis).size


def _inverse_size(size):
    """1/n as a float (an int n) or a sympy expression (a size symbol)."""
    return sympy.Integer(1) / size if isinstance(size, sympy.Basic) else 1.0 / size


def _ones(like: Value) -> Value:
    """1 everywhere ``like`` is (C's pow(x, 0) is 1 for every x, NaN and infinities included)."""
    return map_fn("pow", like, params=(0.0,))


def _gate(x: Value, c: Value) -> Value:
    return map_fn("gate", x, c)


def _sum_product(factors: list[Value], target: tuple[str, ...], full: Iterable[str], sizes: dict) -> Value:
    """Σ over the axes not in ``target`` of the product of ``factors``, each broadcast to ``full``.

    Axes the factors carry but ``target`` does not are summed (a contraction when two factors
    carry them); axes of ``full`` that no factor carries and ``target`` lacks multiply by their size.
    The result carries the axes of ``target`` that some factor carries (a gradient may be
    broadcast along the rest).
    """
    carried: list[str] = []
    for f in factors:
        for a in f.axis_names:
            if a not in carried:
                carried.append(a)
    over = [a for a in carried if a not in target]
    size_axes = [a for a in full if a not in target and a not in carried]
    kept = tuple(a for a in target if a in carried)
    if len(factors) == 1:
        out = factors[0]
        for a in over:
            out = sum_over(out, a)
    elif not over:
        out = factors[0]
        for f in factors[1:]:
            out = out * f
    elif len(factors) == 2:
        f1, f2 = factors
        for a in [a for a in over if a in f1.axis_names and a not in f2.axis_names]:
            f1 = sum_over(f1, a)
        for a in [a for a in over if a in f2.axis_names and a not in f1.axis_names]:
            f2 = sum_over(f2, a)
        both = tuple(a for a in over if a in f1.axis_names and a in f2.axis_names)
        out = contract(f1, f2, over=both, out=kept) if both else f1 * f2
    else:
        out = _sum_product(_pairwise(factors, target, sizes), target, (), sizes)
    if size_axes:
        factor = sympy.Integer(1)
        for a in size_axes:
            factor = factor * sympy.sympify(sizes[a])
        out = out * (factor if factor.free_symbols else float(factor))
    return out


def _pairwise(factors: list[Value], target: tuple[str, ...], sizes: dict) -> list[Value]:
    """Three or more factors combined two at a time until two are left (so every contraction has two
    operands, as the tensor-core families take): a factor whose axes another carries is multiplied
    into it elementwise; else the two sharing the most axes no other factor or ``target`` needs are
    contracted over them."""
    factors = list(factors)
    while len(factors) > 2:
        pair = next(((i, j) for i, fi in enumerate(factors) for j, fj in enumerate(factors)
                     if i != j and set(fi.axis_names) <= set(fj.axis_names)), None)
        if pair is not None:
            i, j = pair
            merged = factors[j] * factors[i]
        else:
            def private(i, j):
                rest = {a for k, f in enumerate(factors) if k not in (i, j) for a in f.axis_names}
                return [a for a in factors[i].axis_names if a in factors[j].axis_names
                        and a not in rest and a not in target]
            i, j = max(((i, j) for i in range(len(factors)) for j in range(i + 1, len(factors))),
                       key=lambda ij: len(private(*ij)))
            keep = tuple(a for f in (factors[i], factors[j]) for a in f.axis_names
                         if a not in private(i, j))
            merged = _sum_product([factors[i], factors[j]], tuple(dict.fromkeys(keep)), (), sizes)
        factors = [f for k, f in enumerate(factors) if k not in (i, j)] + [merged]
    return factors


_COMMUTATIVE = ("add", "mul", "maximum", "minimum")


def _in_order(v: Value, order: tuple[str, ...], free) -> Value | None:
    """``v`` rebuilt so that its axes come in ``order`` by reordering the operands of commutative maps
    along its last maps (no transpose), or None. ``free(u)``: whether box ``u`` may be rebuilt (nothing
    else reads it)."""
    if v.axis_names == order:
        return v
    if v.is_input or not isinstance(v.op, Map) or v.op.index_axes or not free(v):
        return None
    args = list(v.args)
    orders = [args, args[::-1]] if v.op.fn in _COMMUTATIVE and len(args) == 2 else [args]
    for candidate in orders:
        if tuple(dict.fromkeys(a for x in candidate for a in x.axis_names)) == order:
            return apply(v.op, candidate, v.name)
    for candidate in orders:
        if set(candidate[0].axis_names) == set(order):
            first = _in_order(candidate[0], order, free)
            if first is not None:
                return apply(v.op, [first, *candidate[1:]], v.name)
    return None


def _is_passthrough_index_map(fn: str) -> bool:
    """An index map whose derivative in its array input is 1 (ALiBi adds a bias)."""
    return fn == "alibi"


def _is_zeroing_index_map(fn: str) -> bool:
    """An index map that keeps x or writes +0.0 by index (tril, triu): its derivative is 1 where it
    keeps x and 0 elsewhere, as a -inf mask's is, but a softmax after it does not zero the rest."""
    return fn in ("tril", "triu")


# ----------------------------------------------------------------------------- the builder


class _Backward:
    """One reverse-mode pass over a forward diagram (see :func:`grad`)."""

    def __init__(self, diagram, wrt, save):
        self.d = diagram
        self.wrt = wrt
        self.save = frozenset(save)
        self.sizes = {n: a.size for n, a in diagram.axes.items()}
        self.memo: dict[int, Value] = {id(v): v for v in diagram.inputs}
        self.saved_inputs: dict[str, Value] = {}
        self.demanded: dict[str, Saved] = {}   # what the VJPs read from the forward, by name
        self.inputs_read: list[str] = []       # the forward inputs the VJPs read
        self.totals: dict[int, Value] = {}
        self.stats_memo: dict[tuple[int, str], Value] = {}
        self.labels: dict[int, str] = {}        # gradient id → "d" + the forward array's name

    # -- forward values inside the backward diagram
    def _saved_input(self, name: str, axes, dtype: str) -> Value:
        if name not in self.saved_inputs:
            self.saved_inputs[name] = array(name, *axes, dtype=dtype)
        return self.saved_inputs[name]

    def _demand(self, v: Value) -> None:
        if v.is_input:
            if v.name not in self.inputs_read:
                self.inputs_read.append(v.name)
            return
        name = self.d.name_of(v)
        self.demanded.setdefault(name, Saved(name, "value", name, v.axis_names, v.dtype))

    def fwd(self, v: Value) -> Value:
        """The forward value ``v`` as the VJPs read it (so demanded: it may be saved)."""
        self._demand(v)
        return self._value(v)

    def _value(self, v: Value) -> Value:
        """``v`` in the backward diagram: an input, a saved array, or recomputed from its arguments."""
        if id(v) in self.memo:
            return self.memo[id(v)]
        name = self.d.name_of(v)
        if name in self.save:
            out = self._saved_input(name, v.axes, v.dtype)
        elif isinstance(v.op, Softmax) and f"{name}_lse" in self.save:
            # P = exp(S − lse): elementwise once the row's log-sum-exp is known (FlashAttention).
            lse = self._stat(v, "lse")
            out = exp(self._value(v.args[0]) - lse, name=name)
        elif isinstance(v.op, Norm):
            out = self._normalised(v, name)
        else:
            out = apply(v.op, [self._value(a) for a in v.args], name)
        self.memo[id(v)] = out
        return out

    def _stat_saved(self, v: Value, kind: str) -> Saved:
        name = self.d.name_of(v)
        rows = tuple(a for a in v.axis_names if a != v.op.over)
        return Saved(f"{name}_{kind}", kind, name, rows, v.dtype, v.op.over)

    def _stat(self, v: Value, kind: str) -> Value:
        """A row statistic of softmax or norm ``v``: saved, or recomputed from its input."""
        key = (id(v), kind)
        if key in self.stats_memo:
            return self.stats_memo[key]
        s = self._stat_saved(v, kind)
        self.demanded.setdefault(s.name, s)
        if s.name in self.save:
            out = self._saved_input(s.name, [v.axis(a) for a in s.axes], v.dtype)
        else:
            x = self._value(v.args[0])
            over = v.op.over
            if kind == "lse":
                out = logsumexp(x, over, name=s.name)
            elif kind == "mean":
                out = mean_over(x, over, name=s.name)
            else:  # rstd
                xc = self._centred(v) if v.op.how == "layernorm" else x
                out = rsqrt(mean_over(square(xc), over) + v.op.eps, name=s.name)
        self.stats_memo[key] = out
        return out

    def _centred(self, v: Value) -> Value:
        """x − mean of layernorm ``v``'s row (one box, read by its rstd and its output)."""
        key = (id(v), "centred")
        if key not in self.stats_memo:
            self.stats_memo[key] = self._value(v.args[0]) - self._stat(v, "mean")
        return self.stats_memo[key]

    def _normalised(self, v: Value, name: str) -> Value:
        """A norm's output as (x − mean)·rstd (layernorm) or x·rstd (rmsnorm), sharing the statistics
        the norm's own VJP reads."""
        x = self._centred(v) if v.op.how == "layernorm" else self._value(v.args[0])
        return (x * self._stat(v, "rstd")).named(name)

    # -- the reverse pass
    def run(self):
        d = self.d
        cotangents = []
        used = set(d.input_names)
        for out_name, v in zip(d.output_names, d.outputs):
            if v.is_input:  # its cotangent would be called like the input's gradient (dX for both)
                raise DiagramError(f"grad of {d.name!r}: output {out_name!r} is an input passed through; the "
                                   "backward takes outputs computed by boxes (drop it or apply a box)")
            cname = _grad_name(out_name, f"the cotangent of output {out_name!r}")
            if cname in used:
                raise DiagramError(f"grad of {d.name!r}: the cotangent of output {out_name!r} is called {cname!r}, "
                                   f"which the diagram already uses for an input; rename one of them")
            used.add(cname)
            cotangents.append(array(cname, *v.axes, dtype=v.dtype))
        relevant = self._relevant()
        adj: dict[int, list[Value]] = {}
        for v, c in zip(d.outputs, cotangents):
            if id(v) in relevant:
                adj.setdefault(id(v), []).append(c)
        for v in reversed(d.nodes):
            if id(v) not in adj:
                continue
            g = self._total(v, adj.pop(id(v)))
            self.totals[id(v)] = g
            need = {i for i, a in enumerate(v.args) if id(a) in relevant}
            for i, contribution in self._vjp(v, g, need):
                if i in need and contribution is not None:
                    adj.setdefault(id(v.args[i]), []).append(contribution)
        grads = []
        for x in self.wrt:
            contributions = adj.get(id(x), [])
            g = self._sum(contributions) if contributions else _ones(x) * 0.0
            grads.append(self._fit(g, x))
        return cotangents, grads

    def _relevant(self) -> set[int]:
        """Ids of the values that depend on an input in ``wrt`` (only they carry gradients)."""
        out = {id(x) for x in self.wrt}
        for v in self.d.nodes:
            if any(id(a) in out for a in v.args):
                out.add(id(v))
        return out

    @staticmethod
    def _sum(contributions: list[Value]) -> Value:
        total = contributions[0]
        for c in contributions[1:]:
            total = total + c
        return total

    def _total(self, v: Value, contributions: list[Value]) -> Value:
        g = self._sum(contributions)
        name = _grad_name(self.d.name_of(v), None)
        if name is not None and not g.is_input and g.name is None:
            self.labels.setdefault(id(g), name)  # applied by _relabel: dP, dS read like the paper
        return g

    def _fit(self, g: Value, x: Value) -> Value:
        """The gradient of input ``x`` with exactly ``x``'s axes (the order: :func:`_ordered`)."""
        if set(g.axis_names) != set(x.axis_names):
            g = _ones(x) * g  # broadcast along the axes the gradient is constant over
        return g

    # -- vector–Jacobian products
    def _vjp(self, v: Value, g: Value, need: set[int]) -> list[tuple[int, Value | None]]:
        """The gradients of the arguments of box ``v`` (those in ``need``) given its gradient ``g``."""
        op = v.op
        if isinstance(op, Contract):
            return self._vjp_contract(v, g, need)
        if isinstance(op, Map):
            return self._vjp_map(v, g, need)
        if isinstance(op, Reduce):
            return [(0, self._vjp_reduce(v, g))]
        if isinstance(op, Softmax):
            return [(0, self._vjp_softmax(v, g))]
        if isinstance(op, Norm):
            return [(0, self._vjp_norm(v, g))]
        if isinstance(op, Rename):
            back = {new: old for old, new in op.mapping if new in g.axis_names}
            return [(0, rename(g, back) if back else g)]
        raise DiagramError(f"grad of {self.d.name!r}: box {self.d.name_of(v)} ({op.kind}) has no derivative rule")

    def _vjp_contract(self, v: Value, g: Value, need: set[int]):
        full = []
        for a in v.args:
            for n in a.axis_names:
                if n not in full:
                    full.append(n)
        out = []
        for j, a in enumerate(v.args):
            if j not in need:
                continue
            others = [self.fwd(b) for i, b in enumerate(v.args) if i != j]
            out.append((j, _sum_product([g, *others], a.axis_names, full, self.sizes)))
        return out

    def _to_arg(self, expr: Value, v: Value, i: int) -> Value:
        """``expr`` (a gradient over ``v``'s axes) summed over the axes argument ``i`` is broadcast along."""
        return _sum_product([expr], v.args[i].axis_names, v.axis_names, self.sizes)

    def _vjp_map(self, v: Value, g: Value, need: set[int]):
        op: Map = v.op
        fn = op.fn
        f = get_function(fn)
        if f.index_arity:
            return [(0, self._vjp_index_map(v, g))]
        if f.arity == 2:
            return self._vjp_binary(v, g, need)
        rule = _UNARY_RULES.get(fn)
        if rule is None:
            raise DiagramError(f"grad of {self.d.name!r}: the elementwise function {fn!r} (box "
                               f"{self.d.name_of(v)}) has no derivative rule")
        p = op.params
        expr = rule(self, v, g, p)
        return [(0, None if expr is None else self._to_arg(expr, v, 0))]

    def _vjp_binary(self, v: Value, g: Value, need: set[int]):
        fn = v.op.fn
        a, b = v.args
        x = lambda: self.fwd(a)  # noqa: E731 - read only where a rule needs it (so only then saveable)
        y = lambda: self.fwd(b)  # noqa: E731
        if fn == "mul":
            return [(0, _sum_product([g, y()], a.axis_names, v.axis_names, self.sizes) if 0 in need else None),
                    (1, _sum_product([g, x()], b.axis_names, v.axis_names, self.sizes) if 1 in need else None)]
        if fn == "add":
            rules = (lambda: g, lambda: g)
        elif fn == "sub":
            rules = (lambda: g, lambda: -g)
        elif fn == "div":
            rules = (lambda: g / y(), lambda: -((g * x()) / square(y())))
        elif fn in ("maximum", "minimum"):
            # fmax (fmin) passes a tie to its first operand, as torch.fmax (torch.fmin)
            second = lambda: _gate(g, (y() - x()) if fn == "maximum" else (x() - y()))  # noqa: E731
            rules = (lambda: g - second(), second)
        elif fn == "gate":
            # gate(x, c) is x or 0 by the sign of c: no gradient flows into the condition.
            rules = (lambda: _gate(g, y()), lambda: None)
        else:
            raise DiagramError(f"grad of {self.d.name!r}: the elementwise function {fn!r} (box "
                               f"{self.d.name_of(v)}) has no derivative rule")
        out = []
        for i in sorted(need):
            expr = rules[i]()
            out.append((i, None if expr is None else self._to_arg(expr, v, i)))
        return out

    def _vjp_index_map(self, v: Value, g: Value) -> Value:
        op: Map = v.op
        if _is_passthrough_index_map(op.fn):
            return g
        zeroing = _is_zeroing_index_map(op.fn)
        if not (get_function(op.fn).is_mask or zeroing):
            raise DiagramError(f"grad of {self.d.name!r}: the index map {op.fn!r} (box {self.d.name_of(v)}) "
                               "has no derivative rule")
        if not zeroing and self._feeds_only_softmax(v):
            return g  # the softmax's gradient is already 0 where the mask put -inf
        src = g if set(op.index_axes) <= set(g.axis_names) else self.fwd(v.args[0])
        kept = apply(op, [_ones(src)])  # 1 where the map keeps x, -inf (a mask) or 0 (tril) elsewhere
        return _gate(g, kept)

    def _feeds_only_softmax(self, v: Value) -> bool:
        """Whether every use of ``v`` is a softmax, directly or through further masks and biases."""
        if any(o is v for o in self.d.outputs):
            return False
        for c in self.d.consumers.get(id(v), ()):
            if isinstance(c.op, Softmax):
                continue
            if isinstance(c.op, Map) and get_function(c.op.fn).index_arity and c.args[0] is v \
                    and self._feeds_only_softmax(c):
                continue
            return False
        return True

    def _vjp_reduce(self, v: Value, g: Value) -> Value:
        op: Reduce = v.op
        if op.how == "sum":
            return g
        if op.how == "mean":
            return g * _inverse_size(_size_of(v.args[0], op.over))
        src = v.args[0]
        x = self.fwd(src)
        if self.d.name_of(src) in self.save or any(src is i for i in self.d.inputs):
            m = self.fwd(v)
        else:
            # x is recomputed here, and may differ from the forward's in its last bits (a softmax
            # rebuilt from its saved log-sum-exp is exp(S − lse), not exp(S − max)/sum): a tie test
            # against a saved max could find no maximum in a row and divide 0 by 0, so the max is
            # taken again over the values the test reads
            m = apply(op, (x,), None)
        ones = _ones(x)
        below = (m - x) if op.how == "max" else (x - m)
        hit = ones - _gate(ones, below)             # 1 where x attains the max (min), else 0
        count = sum_over(hit, op.over)
        return (g / count) * hit                    # ties share the gradient, as torch.amax

    def _vjp_softmax(self, v: Value, g: Value) -> Value:
        P = self.fwd(v)
        rows = tuple(a for a in v.axis_names if a != v.op.over)
        o = self._attention_output(v)
        if o is not None:
            # rowsum(dP ⊙ P) = rowsum(dO ⊙ O) when O = Σ_x P·V is P's only use (FlashAttention's D).
            D = _sum_product([self.totals[id(o)], self.fwd(o)], rows, o.axis_names, self.sizes).named("D")
        else:
            D = _sum_product([g, P], rows, v.axis_names, self.sizes)
        return P * (g - D)

    def _attention_output(self, v: Value) -> Value | None:
        """The contraction O = Σ_x P·V when it is softmax ``v``'s only use (and O has a gradient)."""
        if any(o is v for o in self.d.outputs):
            return None
        users = self.d.consumers.get(id(v), ())
        if len(users) != 1:
            return None
        o = users[0]
        if not isinstance(o.op, Contract) or len(o.args) != 2 or o.op.over != (v.op.over,):
            return None
        if sum(a is v for a in o.args) != 1 or id(o) not in self.totals:
            return None
        return o

    def _vjp_norm(self, v: Value, g: Value) -> Value:
        op: Norm = v.op
        y = self.fwd(v)
        r = self._stat(v, "rstd")
        rows = tuple(a for a in v.axis_names if a != op.over)
        inv_n = _inverse_size(_size_of(v, op.over))
        gy = _sum_product([g, y], rows, v.axis_names, self.sizes) * inv_n
        inner = g - y * gy
        if op.how == "layernorm":
            inner = inner - _sum_product([g], rows, v.axis_names, self.sizes) * inv_n
        return inner * r   # inner carries the row axis in the input's order: no transpose later


# ----------------------------------------------------------------------------- unary rules
# Each takes (builder, box, g, params) and returns the gradient over the box's axes (or None: 0).


def _x(b: _Backward, v: Value) -> Value:
    return b.fwd(v.args[0])


def _y(b: _Backward, v: Value) -> Value:
    return b.fwd(v)


def _pow_rule(b, v, g, p):
    exponent = p[0]
    if not isinstance(exponent, sympy.Basic) and exponent == 0:
        return None  # x⁰ = 1: no gradient (torch gives 0 there too, NaN and inf included)
    return (g * map_fn("pow", _x(b, v), params=(exponent - 1,))) * exponent


def _hardtanh_rule(b, v, g, p):
    x = _x(b, v)
    lo, hi = p
    # The reference selects x unless x < lo or x > hi: the bounds themselves pass the gradient.
    return g - _gate(g, lo - x) - _gate(g, x - hi)


def _softplus_rule(b, v, g, p):
    x = _x(b, v)
    beta, threshold = p
    z = x * beta
    gs = g * sigmoid(z)
    return gs + _gate(g - gs, z - threshold)   # above the threshold softplus is x: gradient g


def _mish_rule(b, v, g, p):
    x = _x(b, v)
    t = tanh(softplus(x))
    return g * (t + x * (1.0 - square(t)) * sigmoid(x))


def _exp_below(b, v, g, scale_below: float, scale_above: float):
    """x < 0: g·scale_below·eˣ; x >= 0: g·scale_above (elu, selu; the gate keeps eˣ's overflow out)."""
    x = _x(b, v)
    below = _gate((g * exp(x)) * scale_below, -x)
    return below + (g - _gate(g, -x)) * scale_above


def _elu_rule(b, v, g, p):
    return _exp_below(b, v, g, p[0], 1.0)


def _selu_rule(b, v, g, p):
    return _exp_below(b, v, g, SELU_SCALE * SELU_ALPHA, SELU_SCALE)


def _leaky_relu_rule(b, v, g, p):
    x = _x(b, v)
    slope = p[0]
    return g * slope + _gate(g * (1 - slope), x)


def _hardswish_rule(b, v, g, p):
    x = _x(b, v)
    inside = _gate(_gate((g * x) * (1.0 / 6.0), x + 3.0), 3.0 - x)  # -3 < x < 3: x/6 more
    return g * map_fn("hardsigmoid", x) + inside


def _hardsigmoid_rule(b, v, g, p):
    x = _x(b, v)
    g6 = g * (1.0 / 6.0)
    return g6 - _gate(g6, -(x + 3.0)) - _gate(g6, x - 3.0)   # -3 <= x <= 3: 1/6


def _gelu_rule(b, v, g, p):
    x = _x(b, v)
    cdf = (erf(x * _INV_SQRT2) + 1.0) * 0.5
    pdf = exp(square(x) * -0.5) * _INV_SQRT_2PI
    return g * (cdf + x * pdf)


def _silu_rule(b, v, g, p):
    x = _x(b, v)
    s = sigmoid(x)
    return g * (s * (x * (1.0 - s) + 1.0))


def _softcap_rule(b, v, g, p):
    t = _y(b, v) * (1 / p[0])
    return g * (1.0 - square(t))


_UNARY_RULES = {
    "neg": lambda b, v, g, p: -g,
    "scale": lambda b, v, g, p: g * p[0],
    "shift": lambda b, v, g, p: g,
    "square": lambda b, v, g, p: (g * _x(b, v)) * 2.0,
    "exp": lambda b, v, g, p: g * _y(b, v),
    "log": lambda b, v, g, p: g / _x(b, v),
    "sqrt": lambda b, v, g, p: (g / _y(b, v)) * 0.5,
    "rsqrt": lambda b, v, g, p: ((g * _y(b, v)) * square(_y(b, v))) * -0.5,
    "erf": lambda b, v, g, p: (g * exp(-square(_x(b, v)))) * _TWO_OVER_SQRT_PI,
    "abs": lambda b, v, g, p: _gate(g, _x(b, v)) - _gate(g, -_x(b, v)),
    "pow": _pow_rule,
    "tanh": lambda b, v, g, p: g * (1.0 - square(_y(b, v))),
    "relu": lambda b, v, g, p: _gate(g, _x(b, v)),
    "sigmoid": lambda b, v, g, p: g * (_y(b, v) * (1.0 - _y(b, v))),
    "hardtanh": _hardtanh_rule,
    "softplus": _softplus_rule,
    "mish": _mish_rule,
    "selu": _selu_rule,
    "elu": _elu_rule,
    "leaky_relu": _leaky_relu_rule,
    "hardswish": _hardswish_rule,
    "hardsigmoid": _hardsigmoid_rule,
    # zero_inf replaces ±inf by 0: gradient 1 where x is finite (x − x + 1 is 1 there, NaN elsewhere).
    "zero_inf": lambda b, v, g, p: _gate(g, (_x(b, v) - _x(b, v)) + 1.0),
    "gelu": _gelu_rule,
    "silu": _silu_rule,
    "softcap": _softcap_rule,
}


# ----------------------------------------------------------------------------- the entry points


def _grad_name(name: str, what: str | None) -> str | None:
    """``d`` + ``name``; a name too long to be one raises naming ``what`` (None: returns None)."""
    out = "d" + name
    if is_name(out):
        return out
    if what is None:
        return None
    raise DiagramError(f"{what} would be called {shown(out)}, which is longer than 32 characters; "
                       "give it a shorter name")


def _wrt_inputs(diagram, wrt) -> tuple[Value, ...]:
    if wrt is None:
        return diagram.inputs
    if isinstance(wrt, (str, Value)):
        wrt = [wrt]
    if not isinstance(wrt, (list, tuple, set, frozenset)):
        raise DiagramError(f"grad of {diagram.name!r}: wrt must be input names, got {shown(wrt)}")
    by_name = {v.name: v for v in diagram.inputs}
    out: list[Value] = []
    for w in wrt:
        name = w.name if isinstance(w, Value) and w.is_input else w
        if not isinstance(name, str) or name not in by_name:
            raise DiagramError(f"grad of {diagram.name!r}: {shown(name if isinstance(name, str) else w)} is not an "
                               f"input; inputs are {list(diagram.input_names)}")
        if by_name[name] not in out:
            out.append(by_name[name])
    if not out:
        raise DiagramError(f"grad of {diagram.name!r}: wrt names no input; inputs are {list(diagram.input_names)}")
    order = {id(v): i for i, v in enumerate(diagram.inputs)}
    return tuple(sorted(out, key=lambda v: order[id(v)]) if isinstance(wrt, (set, frozenset)) else out)


def _check_save(diagram, save) -> frozenset[str]:
    if save is None:
        return frozenset()
    if isinstance(save, str) or not isinstance(save, (list, tuple, set, frozenset)):
        raise DiagramError(f"grad of {diagram.name!r}: save must be a set of names, got {shown(save)}")
    bad = [s for s in save if not isinstance(s, str)]
    if bad:
        raise DiagramError(f"grad of {diagram.name!r}: save must be a set of names, got {shown(bad[0])}")
    return frozenset(save)


def _backward_name(diagram, name: str | None) -> str:
    if name is not None:
        return name
    out = f"{diagram.name}_grad"
    return out if is_name(out) else f"{diagram.name[:27]}_grad"


def saveable(diagram, wrt=None) -> tuple[Saved, ...]:
    """What the backward diagram of ``diagram`` reads from the forward pass, each of which may be
    saved (a name for ``grad``'s ``save=``) or recomputed: forward arrays in topological order,
    each softmax's and norm's row statistics after it.

    >>> from napkin.diagrams import library
    >>> [(s.name, s.kind) for s in saveable(library.get("softmax"))]
    [('P', 'value'), ('P_lse', 'lse')]
    >>> [s.name for s in saveable(library.get("rmsnorm"))]
    ['N', 'N_rstd']
    """
    b = _Backward(diagram, _wrt_inputs(diagram, wrt), frozenset())
    b.run()
    order = {diagram.name_of(v): i for i, v in enumerate(diagram.nodes)}
    out = []
    for s in b.demanded.values():
        if s.kind == "value":
            out.append(s)
    softmaxes = {s.of for s in out if isinstance(diagram.value(s.of).op, Softmax)}
    for name in softmaxes:  # the lse is an alternative to saving P: listed only where P is read
        v = diagram.value(name)
        out.append(b._stat_saved(v, "lse"))
    out.extend(s for s in b.demanded.values() if s.kind in ("rstd", "mean"))
    kinds = {"value": 0, "lse": 1, "mean": 2, "rstd": 3}
    return tuple(sorted(out, key=lambda s: (order.get(s.of, -1), kinds[s.kind])))


def recomputed_from_statistics(diagram, save, wrt=None) -> tuple[str, ...]:
    """The forward arrays the backward reads that it would recompute from a norm statistic in
    ``save`` (``N_rstd``, ``N_mean``) while an array in ``save`` was computed from them in the
    forward: the norm's output ``N = x·rstd`` and the elementwise maps of it and of inputs
    (``Xn = N·g``) that a saved array depends on, those not saved already, in topological order.

    A statistic is saved in the diagram's dtype, so in bf16 it keeps 8 bits, and an array
    recomputed from it differs from the forward's by up to 2⁻⁹ of its row, while the arrays saved
    from the forward (a projection Q, attention's O) were computed from the forward's own. The
    backward then reads two versions of one array: keys and values recomputed from the new ``Xn``
    beside the forward's O, so ``D = rowsum(dO·O)`` no longer equals ``rowsum(P·dP)`` and the
    cancellation in ``dS = P·(dP − D)`` is lost (the transformer block's dWq, dWk and dg1 went
    from about 0.7 % to 1 % relative error this way). A saved log-sum-exp counts as such an
    array: ``P = exp(S − lse)`` sums to 1 only with the forward's scores. Saving these arrays as
    well gives the backward the forward's operands. Where nothing saved depends on them (a norm alone, or
    followed by a projection that is recomputed), the recomputation is consistent with itself
    and nothing is listed.

    >>> from napkin.diagrams import library
    >>> block = library.get("transformer_block")
    >>> recomputed_from_statistics(block, {"N1_rstd", "Qp", "O"})
    ('N1', 'Xn')
    >>> recomputed_from_statistics(block, {"N1_rstd", "Qp", "O", "N1"}), recomputed_from_statistics(block, {"N1_rstd"})
    (('Xn',), ())
    >>> recomputed_from_statistics(block, {"N1_rstd", "P_lse"})
    ('N1', 'Xn')
    """
    _check_diagram(diagram, "recomputed_from_statistics")
    save = _check_save(diagram, save)
    known = {s.name: s for s in saveable(diagram, wrt)}
    values = {n for n, s in known.items() if s.kind == "value"}
    reached: set[int] = set()
    for n in save:
        s = known.get(n)
        if s is not None and s.kind in ("rstd", "mean"):
            reached.add(id(diagram.value(s.of)))
    for v in diagram.nodes:  # topological: a map is reached once every argument is reached or an input
        if id(v) in reached or not isinstance(v.op, Map) or v.op.index_axes:
            continue
        if any(id(a) in reached for a in v.args) and all(id(a) in reached or a.is_input for a in v.args):
            reached.add(id(v))
    feeds_saved: set[int] = set()  # every array a saved array (or a saved log-sum-exp) was computed from
    stack = [diagram.value(n) for n in save if n in values]
    stack += [diagram.value(known[n].of) for n in save if n in known and known[n].kind == "lse"]
    while stack:
        for a in stack.pop().args:
            if id(a) not in feeds_saved:
                feeds_saved.add(id(a))
                stack.append(a)
    return tuple(n for v in diagram.nodes if id(v) in reached and id(v) in feeds_saved
                 and (n := diagram.name_of(v)) in values and n not in save)


def inputs_read(diagram, wrt=None) -> tuple[str, ...]:
    """The forward inputs the backward diagram's VJPs read (a contraction's operands, a map's input),
    whatever is saved: recomputing a forward array from inputs outside this list reads them again.

    >>> from napkin.diagrams import library
    >>> inputs_read(library.get("mlp"))
    ('W', 'X')
    """
    b = _Backward(diagram, _wrt_inputs(diagram, wrt), frozenset())
    b.run()
    return tuple(b.inputs_read)


def grad(diagram, wrt=None, save=(), name: str | None = None):
    """The backward diagram of ``diagram`` (see the module docstring).

    ``wrt``: input names (default: every input); ``save``: names from :func:`saveable` that the
    backward takes as inputs rather than recomputing; ``name``: the backward diagram's name
    (default ``NAME_grad``). An unknown name in ``wrt`` or ``save``, a function without a
    derivative, or a gradient name that collides with another raises a DiagramError naming it.

    >>> from napkin.diagrams import library
    >>> b = library.get("softmax").grad(save={"P"})
    >>> b.input_names, b.output_names
    (('X', 'dP', 'P'), ('dX',))
    """
    _check_diagram(diagram, "grad")
    wrt_inputs = _wrt_inputs(diagram, wrt)
    save = _check_save(diagram, save)
    known: dict[str, Saved] = {}
    if save:
        known = {s.name: s for s in saveable(diagram, [v.name for v in wrt_inputs])}
        unknown = sorted(save - set(known))
        if unknown:
            raise DiagramError(f"grad of {diagram.name!r}: cannot save {unknown}: the backward reads "
                               f"{sorted(known) or 'nothing from the forward'}")
    b = _Backward(diagram, wrt_inputs, save)
    cotangents, grads = b.run()
    grads = _relabel(_ordered(grads, [x.axis_names for x in wrt_inputs]), b.labels)
    for s in save:  # a saved array the gradients turned out not to read (N_mean beside N) is still an input
        if s not in b.saved_inputs:
            entry = known[s]
            b._saved_input(s, [diagram.axes[a] for a in entry.axes], entry.dtype)
    saved = [b.saved_inputs[n] for n in sorted(b.saved_inputs, key=lambda n: _saved_order(diagram, n))]
    inputs = [*diagram.inputs, *cotangents, *saved]
    taken = {v.name for v in inputs}
    outs = []
    for x, g in zip(wrt_inputs, grads):
        gname = _grad_name(x.name, f"the gradient of input {x.name!r}")
        if gname in taken:
            raise DiagramError(f"grad of {diagram.name!r}: the gradient of input {x.name!r} is called {gname!r}, "
                               "which the backward diagram already uses for an input; rename one of them")
        taken.add(gname)
        outs.append((gname, g))
    return type(diagram)(_backward_name(diagram, name), tuple(_named_outputs(outs)), inputs,
                   description=f"backward of {diagram.name}")


def _saved_order(diagram, name: str):
    order = {diagram.name_of(v): i for i, v in enumerate(diagram.nodes)}
    base = name.rsplit("_", 1)[0] if name not in order else name
    return (order.get(base, len(order)), name)


def _ordered(grads: list[Value], orders: list[tuple[str, ...]]) -> list[Value]:
    """Each gradient with its input's axis order: its last maps' commutative operands reordered where
    that is enough and nothing else reads them, else a transposing contraction."""
    users = _consumers(grads)
    outputs = [id(g) for g in grads]

    def free(u: Value) -> bool:
        return outputs.count(id(u)) <= 1 and len(users.get(id(u), ())) <= 1

    out = []
    for g, order in zip(grads, orders):
        if g.axis_names != order:
            g = _in_order(g, order, lambda u, top=g: (u is top and outputs.count(id(u)) == 1 and id(u) not in users)
                          or (u is not top and free(u))) or contract(g, over=(), out=order)
        out.append(g)
    return out


def _consumers(values: list[Value]) -> dict[int, set[int]]:
    """For each box reachable from ``values``, the ids of the boxes that read it."""
    out: dict[int, set[int]] = {}
    seen: set[int] = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        for a in v.args:
            out.setdefault(id(a), set()).add(id(v))
            stack.append(a)
    return out


def _check_diagram(diagram, where: str) -> None:
    # The class is not imported: diagram.py imports this module (Diagram.grad).
    if type(diagram).__name__ != "Diagram" or not hasattr(diagram, "nodes"):
        raise DiagramError(f"{where}: expected a Diagram, got {shown(diagram)}")


def _relabel(values: list[Value], labels: dict[int, str]) -> list[Value]:
    """``values`` rebuilt with the boxes in ``labels`` named (every reference to a box follows it, so
    naming never copies a box)."""
    memo: dict[int, Value] = {}
    order: list[Value] = []
    stack = [(v, False) for v in reversed(values)]
    while stack:
        v, expanded = stack.pop()
        if id(v) in memo:
            continue
        if v.is_input:
            memo[id(v)] = v
        elif expanded:
            args = [memo[id(a)] for a in v.args]
            name = v.name if v.name is not None else labels.get(id(v))
            same = name == v.name and all(x is y for x, y in zip(args, v.args))
            memo[id(v)] = v if same else Value(v.op, tuple(args), v.axes, v.dtype, name)
            order.append(v)
        else:
            stack.append((v, True))
            stack.extend((a, False) for a in reversed(v.args) if id(a) not in memo)
    return [memo[id(v)] for v in values]


def _named_outputs(outs: list[tuple[str, Value]]) -> list[Value]:
    """Name each gradient; one that is an input, a rename (a view), another output, or read by
    another box gets a copy box (scale by 1) so that every output is a distinct computed array."""
    users = _consumers([g for _, g in outs])
    seen: set[int] = set()
    named = []
    for gname, g in outs:
        if g.is_input or isinstance(g.op, Rename) or id(g) in seen or id(g) in users:
            named.append(map_fn("scale", g, params=(1.0,), name=gname))
        else:
            named.append(g.named(gname))
        seen.add(id(g))
    return named


def forward_with_saves(diagram, save=(), name: str | None = None):
    """``diagram`` with the arrays of ``save`` (names from :func:`saveable`) as extra outputs, after
    its own, so that one forward run gives the backward diagram its saved inputs. A saved array that
    is already an output is not repeated. Statistics are computed as :func:`grad` recomputes them:
    ``P_lse`` as ``logsumexp``, ``N_rstd`` as 1/√(mean((x − mean)²) + eps), ``N_mean`` as the mean.

    A norm whose statistic is saved is written out as those statistics' boxes: ``N = (x − mean)·rstd``
    (layernorm) or ``x·rstd`` (rmsnorm), the same boxes the backward recomputes it with. The norm box
    itself keeps its statistics inside its kernel (the row-wise norm kernel writes none), so beside
    it they would take a second pass over the row, a kernel of their own; written out, the norm and
    its statistics are one chain of maps and reductions over the row, one kernel that writes ``Y``
    and the statistics (8 bytes a row more).

    >>> from napkin.diagrams import library
    >>> f = forward_with_saves(library.get("rmsnorm"), {"N_rstd"})
    >>> f.output_names
    ('Y', 'N_rstd')
    >>> [v.op.label() for v in f.nodes]  # no norm box: x·rsqrt(mean(x²) + eps)
    ['square', 'mean x', 'shift(1e-06)', 'rsqrt', 'mul', 'mul']
    """
    _check_diagram(diagram, "forward_with_saves")
    save = _check_save(diagram, save)
    known = {s.name: s for s in saveable(diagram)}
    unknown = sorted(save - set(known))
    if unknown:
        raise DiagramError(f"forward of {diagram.name!r}: cannot save {unknown}; saveable: {sorted(known)}")
    memo: dict[int, Value] = {id(v): v for v in diagram.inputs}
    b = _Backward(diagram, diagram.inputs, frozenset())
    b.memo = memo  # the statistics' boxes read the forward's arrays as they are built
    written_out = {known[s].of for s in save if known[s].kind in ("mean", "rstd")}
    for v in diagram.nodes:  # every box under its display name, so a saved name is that array's
        n = diagram.name_of(v)
        memo[id(v)] = b._normalised(v, n) if n in written_out else apply(v.op, [memo[id(a)] for a in v.args], n)
    outs = [memo[id(v)] for v in diagram.outputs]
    for s in sorted(save, key=lambda n: _saved_order(diagram, n)):
        entry = known[s]
        v = diagram.value(entry.of)
        extra = memo[id(v)] if entry.kind == "value" else b._stat(v, entry.kind)
        if not any(o is extra for o in outs):
            outs.append(extra)
    return type(diagram)(name or diagram.name, tuple(outs), diagram.inputs, diagram.description)

