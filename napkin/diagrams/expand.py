"""Composite boxes written out as the primitive boxes they are made of.

Softmax, layernorm and rmsnorm are single boxes in a diagram, which is how the row-wise family
fuses them into one kernel. Where no family takes such a box whole (the row-wise family needs the
reduced axis innermost, so a softmax over the outer axis of ``X[a, b]`` is not a row it can
read), the box can still run on the fast families as its parts: reductions over the axis (the
pointwise family reduces over any axis, with coalesced reads) and elementwise maps.
:func:`expand` writes the named boxes out:

- ``softmax_a(x)``: ``m = max_a x``, ``s = Σ_a exp(x − m)``, ``exp(x − m) / s``;
- ``layernorm_a(x)``: ``μ = mean_a x``, ``v = mean_a (x − μ)²``, ``(x − μ) · rsqrt(v + eps)``;
- ``rmsnorm_a(x)``: ``ms = mean_a x²``, ``x · rsqrt(ms + eps)``;
- a rename that is an output (a view written to HBM: ``Y[n,j] = rename(X[k,j], k→n)``): the
  view kept, under ``<name>_view``, and copied by a product of one factor over no axis
  (``contract(view, over=())``), which the pointwise family runs as a map reading the view;
- a contraction of two operands over at least one axis (the layouts the contraction family does
  not read: a batch axis innermost, contracted axes in different orders, …): each operand copied,
  where its layout differs, into ``A'[batch…, free…, over…]`` and ``B'[batch…, over…, free…]``
  (``<name>_a``, ``<name>_b``), the contraction in that layout, ``C'[batch…, freeA…, freeB…]``
  (``<name>_c``, where the result's own order differs, then copied into it), batch and free axes
  in the result's order; the copies are products of one factor, as above, and the sum is the
  same sum; an operand that is a view of the array the other operand reads (``X·Xᵀ``, written
  with a rename) is copied in any case, into whichever layout the family reads keeps its
  innermost axis (a copy row by row, not a transpose);
- a contraction of one operand (``contract(X[a,b], over=b)``, an einsum ``"ab->a"``): the sum
  over those axes as reductions (``<name>_sum``), copied into the result's order where it differs;
- a contraction of three operands or more (``contract(A[a,k], g[k], B[n,k], over=k)``, a
  quadratic form ``u·M·v``): each operand whose axes another one holds multiplied into that one
  (``<name>_prod``: an elementwise product, no larger than it), then, while more than two are
  left, the first two contracted over the summed axes no other operand holds (``<name>_part``);
  an axis summed that only one of the last operands holds is summed in it first; the last two (a
  contraction in their own layouts) or the last one (a reduction) make the result;
- a map over no axis (a loss's scale, a cotangent's negation): made again for each box that reads
  it (``<name>_<reader>``), so it runs inside its readers' kernels instead of a kernel of one value
  on the scalar fallback (kept under its own name where it is an output);

(the output recomputes ``exp(x − m)`` and ``x − μ`` from ``x``: the kernel that reduces cannot
write the output, so a value it passed on would be written to HBM and read back), each exactly
the computation the box's PyTorch reference does (``torch.softmax`` also subtracts
the row's max; a copy is exact), so the diagram's meaning is unchanged. The last box of each
chain keeps the composite's name, so outputs and readers are untouched; the boxes before it are
named ``<name>_max``, ``<name>_exp`` … (with a number appended where a name is taken). The result is a
function of the diagram and the names only, so a plan made on it can be read back
(:meth:`napkin.perfmodel.plan.Plan.from_dict` expands again).

The planner (:func:`napkin.codegen.planner.derive`) expands only boxes that would otherwise run
on the scalar fallback, and keeps the expansion when it puts fewer boxes on the fallback, else
when the model predicts it faster.

>>> from napkin.diagrams import Diagram, array, axes, softmax
>>> a, b = axes("a b")
>>> d = Diagram("col_softmax", softmax(array("X", a, b), a, name="Y"))
>>> e = expand(d, ["Y"])
>>> [e.name_of(v) for v in e.nodes], e.output_names
(['Y_max', 'Y_shifted_again', 'Y_exp_again', 'Y_shifted', 'Y_exp', 'Y_sum', 'Y'], ('Y',))
"""

from __future__ import annotations

from typing import Iterable

from ..errors import DiagramError
from .diagram import Diagram
from .ops import (Contract, Map, Norm, Rename, Softmax, Value, apply, exp, map_fn, max_over, mean_over, rsqrt,
                  square, sum_over)

__all__ = ["expand", "expandable"]


def expandable(diagram: Diagram) -> tuple[str, ...]:
    """The names of the boxes of ``diagram`` that :func:`expand` can write out (softmax, the norms,
    renames that are outputs, contractions over at least one axis and maps over no axis)."""
    outs = {id(v) for v in diagram.outputs}
    return tuple(diagram.name_of(v) for v in diagram.nodes
                 if isinstance(v.op, (Softmax, Norm)) or (isinstance(v.op, Rename) and id(v) in outs)
                 or (isinstance(v.op, Contract) and v.op.over) or _scalar_map(v))


def _scalar_map(v: Value) -> bool:
    """A map over no axis (a loss's scale, a cotangent's negation): one value, cheap to compute again."""
    return isinstance(v.op, Map) and not v.axis_names


def expand(diagram: Diagram, names: Iterable[str]) -> Diagram:
    """``diagram`` with the composite boxes called ``names`` written out as primitive boxes (see the
    module docstring); a name that is not such a box is a DiagramError."""
    wanted = tuple(dict.fromkeys(names))
    known = set(expandable(diagram))
    bad = [n for n in wanted if n not in known]
    if bad:
        raise DiagramError(f"diagram {diagram.name!r}: {', '.join(map(repr, bad))} "
                           f"{'is' if len(bad) == 1 else 'are'} not a softmax or norm box it can expand, nor a "
                           "rename written as an output, a contraction over an axis or a map over no axis"
                           f" (those are: {', '.join(sorted(known)) or 'none'})")
    if not wanted:
        return diagram
    used = set(diagram.names.values())
    memo: dict[int, Value] = {id(v): v for v in diagram.inputs}
    scalars = {id(v) for v in diagram.nodes if diagram.name_of(v) in wanted and _scalar_map(v)}

    def arg(a: Value, reader: Value) -> Value:  # a scalar map is made again for each box reading it
        if id(a) not in scalars:
            return memo[id(a)]
        name = _fresh(f"{diagram.name_of(a)}_{diagram.name_of(reader)}", used)
        return apply(a.op, [arg(x, reader) for x in a.args], name)

    for v in diagram.nodes:
        args = [arg(a, v) for a in v.args]
        name = diagram.name_of(v)
        if name in wanted and isinstance(v.op, Rename):
            view = apply(v.op, args, _fresh(f"{name}_view", used))
            memo[id(v)] = _copy(view, view.axis_names, name)
        elif name in wanted and isinstance(v.op, Contract) and len(args) == 2:
            memo[id(v)] = _relaid(v, args, name, used)
        elif name in wanted and isinstance(v.op, Contract):
            memo[id(v)] = _split(v, args, name, used)
        elif name in wanted and id(v) in scalars:
            memo[id(v)] = apply(v.op, args, v.name)  # kept where it is an output
        elif name in wanted:
            memo[id(v)] = _written_out(v.op, args[0], name, used)
        else:
            memo[id(v)] = apply(v.op, args, v.name)
    outs = tuple(memo[id(v)] for v in diagram.outputs)
    outs = tuple(o if o.name or o.is_input else o.named(n) for o, n in zip(outs, diagram.output_names))
    return Diagram(diagram.name, outs, diagram.inputs, diagram.description)


def _fresh(base: str, used: set[str]) -> str:
    name, i = base, 1
    while name in used:
        i += 1
        name = f"{base}{i}"
    used.add(name)
    return name


def _copy(x: Value, order: tuple[str, ...], name: str) -> Value:
    """``x`` copied into the axis order ``order`` (a product of one factor over no axis)."""
    return apply(Contract((), order), (x,), name)


def _relaid(v: Value, args: list[Value], name: str, used: set[str]) -> Value:
    """Contraction ``v`` of two operands in the layout the contraction family reads (see the
    module docstring); its last box is called ``name``."""
    a, b = args
    over = tuple(v.op.over)
    out = v.axis_names
    in_a, in_b = set(a.axis_names), set(b.axis_names)
    batch = tuple(x for x in out if x in in_a and x in in_b)
    free_a = tuple(x for x in out if x in in_a and x not in in_b)
    free_b = tuple(x for x in out if x in in_b and x not in in_a)
    # an axis summed over that only one operand holds stays that operand's alone
    over_a, over_b = tuple(x for x in over if x in in_a), tuple(x for x in over if x in in_b)
    want_a = _target(a, batch + free_a + over_a, batch + over_a + free_a)
    want_b = _target(b, batch + over_b + free_b, batch + free_b + over_b)
    # a view of the array the other operand reads (X·Xᵀ) is copied whatever its layout: one kernel
    # cannot read a tensor under two sets of axes
    shared = _viewed(a) is _viewed(b)
    if a.axis_names != want_a or (shared and isinstance(a.op, Rename)):
        a = _copy(a, want_a, _fresh(f"{name}_a", used))
    if b.axis_names != want_b or (shared and isinstance(b.op, Rename)):
        b = _copy(b, want_b, _fresh(f"{name}_b", used))
    made = batch + free_a + free_b
    if made == out:
        return apply(Contract(over, out), (a, b), name)
    return _copy(apply(Contract(over, made), (a, b), _fresh(f"{name}_c", used)), out, name)


def _split(v: Value, args: list[Value], name: str, used: set[str]) -> Value:
    """Contraction ``v`` of one operand, or of three or more, as maps, reductions and contractions
    of two operands (see the module docstring); its last box is called ``name``."""
    over, out = tuple(v.op.over), v.axis_names
    ops = list(args)
    folded = True
    while len(ops) > 1 and folded:  # an operand another one holds: multiplied into it
        folded = False
        for i, x in enumerate(ops):
            host = next((j for j, y in enumerate(ops) if j != i and set(x.axis_names) <= set(y.axis_names)), None)
            if host is not None:
                ops[host] = map_fn("mul", ops[host], x, name=_fresh(f"{name}_prod", used))
                del ops[i]
                folded = True
                break
    while len(ops) > 2:  # the first two, over what no other operand holds
        a, b, rest = ops[0], ops[1], ops[2:]
        mine = tuple(x for x in over if (x in a.axis_names or x in b.axis_names)
                     and not any(x in r.axis_names for r in rest))
        keep = tuple(dict.fromkeys(x for x in (*a.axis_names, *b.axis_names) if x not in mine))
        ops = [_pair(a, b, mine, keep, _fresh(f"{name}_part", used), used), *rest]
    left = tuple(x for x in over if any(x in o.axis_names for o in ops))
    if len(ops) == 2:  # in the operands' own layouts: the planner may relay the pair
        return _pair(ops[0], ops[1], left, out, name, used)
    x = ops[0]
    made = tuple(a for a in x.axis_names if a not in left)
    if made == out:
        return sum_over(x, left, name=name)
    return _copy(sum_over(x, left, name=_fresh(f"{name}_sum", used)), out, name)


def _pair(a: Value, b: Value, summed: tuple[str, ...], out: tuple[str, ...], name: str, used: set[str]) -> Value:
    """``Σ_summed a·b`` in the order ``out``: an axis summed that one operand alone holds is summed
    in it first (a contraction of two operands sums over axes both carry)."""
    pair = [a, b]
    for i, o in enumerate(pair):
        alone = tuple(x for x in summed if x in o.axis_names and x not in pair[1 - i].axis_names)
        if alone:
            pair[i] = sum_over(o, alone, name=_fresh(f"{name}_sum", used))
    both = tuple(x for x in summed if all(x in o.axis_names for o in pair))
    return apply(Contract(both, out), tuple(pair), name)


def _viewed(x: Value) -> Value:
    """The array ``x`` is a view of (``x`` itself when it is no rename)."""
    while isinstance(x.op, Rename):
        x = x.args[0]
    return x


def _target(x: Value, usual: tuple[str, ...], other: tuple[str, ...]) -> tuple[str, ...]:
    """The layout an operand of a relaid contraction is copied into: ``usual`` (rows ``[free][over]``
    for A, ``[over][free]`` for B), except for a view (a rename: the kernel would read one tensor
    under two sets of axes, ``X·Xᵀ``), copied into whichever of the two layouts the contraction
    family reads keeps its innermost axis innermost: a copy row by row, not a transpose."""
    if isinstance(x.op, Rename) and other[-1:] == x.axis_names[-1:] and usual[-1:] != x.axis_names[-1:]:
        return other
    return usual


def _written_out(op, x: Value, name: str, used: set[str]) -> Value:
    """The primitive chain of one softmax or norm box over ``x``; its last box is called ``name``."""
    def n(part: str) -> str:
        return _fresh(f"{name}_{part}", used)

    a = op.over
    # The output's maps recompute the values the statistic was taken of (x − m, its exp; x − μ) from
    # x instead of reading them: a kernel that reduces over a strided axis cannot also write the
    # output (that needs the statistic), so a value it passed on would be one more array written
    # to HBM and read back; x is read anyway.
    if isinstance(op, Softmax):
        m = max_over(x, a, name=n("max"))
        s = sum_over(exp(map_fn("sub", x, m, name=n("shifted")), name=n("exp")), a, name=n("sum"))
        e = exp(map_fn("sub", x, m, name=n("shifted_again")), name=n("exp_again"))
        return map_fn("div", e, s, name=name)
    if op.how == "layernorm":
        mu = mean_over(x, a, name=n("mean"))
        c = map_fn("sub", x, mu, name=n("centred"))
        var = mean_over(square(c, name=n("square")), a, name=n("var"))
        r = rsqrt(map_fn("shift", var, params=(op.eps,), name=n("eps")), name=n("rstd"))
        return map_fn("mul", map_fn("sub", x, mu, name=n("centred_again")), r, name=name)
    ms = mean_over(square(x, name=n("square")), a, name=n("meansq"))
    r = rsqrt(map_fn("shift", ms, params=(op.eps,), name=n("eps")), name=n("rstd"))
    return map_fn("mul", x, r, name=name)
