"""Axes that always travel together, run as one axis.

A linear layer on activations ``X[b, s, e]`` (``Y[b, s, f] = Σ_e X·W[f, e]``) is one matrix
product of ``b·s`` rows: ``b`` and ``s`` sit side by side, in that order, in every array that
carries either, and no box treats them apart (none sums over one of them, masks by its index or
renames it). The contraction family tiles one row axis and walks the others one index at a
time, so at ``s = 50`` a 128-row tile would hold 50 rows. :func:`foldable` finds such runs of
axes and :func:`fold` rewrites the diagram with each run as one axis (``b_s`` of size
``b·s``); every array keeps its bytes in the same order, so a kernel of the folded diagram reads
and writes the caller's tensors as they are (only their shapes are written differently). A run
summed over as a whole is one axis too: a contraction of ``A[a, h, d]`` with ``B[n, h, d]`` over
``(h, d)`` is one matrix product with ``K = h·d``, where a tile would otherwise take ``d`` at a
time and walk ``h`` one index at a time.

The planner (:func:`napkin.codegen.planner.derive`) plans the folded diagram beside the diagram
and keeps it when the model predicts it faster; the plan records the folds
(:attr:`napkin.perfmodel.plan.Plan.folds`) and the diagram it was folded from, whose shapes
the compiled diagram takes.

Folding is offered only where it can pay: diagrams with a contraction, bound sizes, and runs of
fewer than 2^31 indices (kernels index rows in 32 bits). A run may end at an array's innermost
axis: the folded innermost axis is the same contiguous bytes, only longer, so a row that was a
16-byte multiple still is one.

>>> from napkin.diagrams import Diagram, array, axes, contract
>>> b, s, e, f = axes("b s e f")
>>> d = Diagram("linear", contract(array("X", b, s, e), array("W", f, e), over=e, out=(b, s, f), name="Y"))
>>> folds = foldable(d.bind(b=256, s=50, e=768, f=3072))
>>> folds
(AxisFold(axis='b_s', parts=('b', 's'), sizes=(256, 50)),)
>>> [v.label() for v in fold(d.bind(b=256, s=50, e=768, f=3072), folds).inputs]
['X[b_s,e]', 'W[f,e]']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..errors import DiagramError
from .axes import Axis
from .diagram import Diagram
from .ops import Contract, InputOp, Map, Norm, Reduce, Rename, Softmax, Value, apply

__all__ = ["AxisFold", "foldable", "fold", "summed_folds", "unfolded_shape"]


@dataclass(frozen=True)
class AxisFold:
    """``parts`` (outermost first, of ``sizes``) run as the one axis ``axis`` of their product."""

    axis: str
    parts: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def to_dict(self) -> dict:
        return {"axis": self.axis, "parts": list(self.parts), "sizes": [int(s) for s in self.sizes]}

    @classmethod
    def from_dict(cls, data: Mapping) -> "AxisFold":
        parts, sizes = tuple(str(p) for p in data["parts"]), tuple(int(s) for s in data["sizes"])
        if len(parts) < 2 or len(parts) != len(sizes):
            raise ValueError(f"a fold of {list(parts)} with sizes {list(sizes)}")
        return cls(str(data["axis"]), parts, sizes)


def _named_axes(v: Value) -> set[str] | None:
    """The axes box ``v`` refers to by name one at a time (those it reduces along, masks by,
    renames); None for a box of a kind this module does not know (nothing is folded then). A
    contraction names none here: it sums over a set of axes, which a whole run may join
    (:func:`foldable` checks that no run is split by it)."""
    op = v.op
    if isinstance(op, Contract):
        return set()
    if isinstance(op, Map):
        return set(op.index_axes)
    if isinstance(op, (Reduce, Softmax, Norm)):
        return {op.over}
    if isinstance(op, Rename):
        return {a for pair in op.mapping for a in pair}
    return None


def foldable(diagram: Diagram) -> tuple[AxisFold, ...]:
    """The runs of axes of the bound ``diagram`` that :func:`fold` can run as one (see the module
    docstring); empty when there are none, or the diagram has no contraction."""
    nodes = list(diagram.nodes)
    if not any(isinstance(v.op, Contract) for v in nodes):
        return ()
    sizes = diagram.sizes
    if not all(isinstance(s, int) for s in sizes.values()):
        return ()
    named: set[str] = set()
    for v in nodes:
        got = _named_axes(v)
        if got is None:
            return ()
        named |= got
    values = [*diagram.inputs, *nodes]
    free = [a for a in sizes if a not in named]
    # the contractions summing over each axis: a run's axes are summed over by the same ones
    # (all of the run or none of it), so the run is one axis of each sum
    summed_by = {a: frozenset(i for i, v in enumerate(nodes) if isinstance(v.op, Contract) and a in v.op.over)
                 for a in free}

    def together(p: str, q: str) -> bool:
        """Whether every array carrying p or q carries both, q right after p, and every
        contraction sums over both or neither."""
        if summed_by[p] != summed_by[q]:
            return False
        seen = False
        for v in values:
            names = v.axis_names
            if p in names or q in names:
                if p not in names or q not in names or names.index(q) != names.index(p) + 1:
                    return False
                seen = True
        return seen

    follows = {}
    for p in free:
        for q in free:
            if p != q and together(p, q):
                follows[p] = q
    heads = [p for p in follows if p not in follows.values()]
    limit = 2 ** 31 - 1  # kernels index a row in 32 bits: a run longer than that stays apart
    taken = set(sizes)
    out = []
    for p in heads:
        run = [p]
        while (run[-1] in follows and follows[run[-1]] not in run
               and math.prod(int(sizes[a]) for a in run) * int(sizes[follows[run[-1]]]) <= limit):
            run.append(follows[run[-1]])
        if len(run) < 2:
            continue
        name = "_".join(run)
        while name in taken:
            name += "_"
        taken.add(name)
        out.append(AxisFold(name, tuple(run), tuple(int(sizes[a]) for a in run)))
    return tuple(sorted(out, key=lambda f: f.parts))


def _rewrite(names: Sequence[str], folds: Iterable[AxisFold]) -> tuple[str, ...]:
    """``names`` with each fold's run of parts replaced by its axis."""
    out = list(names)
    for f in folds:
        k = len(f.parts)
        for i in range(len(out) - k + 1):
            if tuple(out[i:i + k]) == f.parts:
                out[i:i + k] = [f.axis]
                break
    return tuple(out)


def _rewrite_over(over: Sequence[str], folds: Iterable[AxisFold]) -> tuple[str, ...]:
    """The axes a contraction sums over, with each fold whose parts it sums over replaced by the
    fold's axis (where its first part stood); a DiagramError for a fold it sums in part."""
    out = list(over)
    for f in folds:
        hit = [a for a in f.parts if a in out]
        if not hit:
            continue
        if len(hit) != len(f.parts):
            raise DiagramError(f"fold {f.axis}: a contraction sums over {hit} but not over all of {list(f.parts)}")
        at = min(out.index(a) for a in f.parts)
        out = [a for a in out if a not in f.parts]
        out.insert(at, f.axis)
    return tuple(out)


def fold(diagram: Diagram, folds: Sequence[AxisFold]) -> Diagram:
    """``diagram`` with each fold's parts run as its one axis (the module docstring). A
    DiagramError when a fold does not fit the diagram (its parts are not side by side in every
    array, a box names one of them): what :func:`foldable` returns always fits."""
    if not folds:
        return diagram
    sizes = diagram.sizes
    for f in folds:
        if tuple(sizes.get(a) for a in f.parts) != f.sizes:
            raise DiagramError(f"fold {f.axis}: the axes {list(f.parts)} of {diagram.name!r} are not of sizes "
                               f"{list(f.sizes)}")
    axis_of = {f.axis: Axis(f.axis, f.size) for f in folds}

    def axes_of(v: Value) -> tuple[Axis, ...]:
        names = _rewrite(v.axis_names, folds)
        by_name = {a.name: a for a in v.axes}
        return tuple(axis_of.get(n) or by_name[n] for n in names)

    memo: dict[int, Value] = {}
    for v in diagram.inputs:
        memo[id(v)] = Value(InputOp(), (), axes_of(v), v.dtype, v.name)
    for v in diagram.nodes:
        op = v.op
        if isinstance(op, Contract):
            op = Contract(_rewrite_over(op.over, folds), None if op.out is None else _rewrite(op.out, folds))
        nv = apply(op, [memo[id(a)] for a in v.args], v.name)
        if nv.axis_names != _rewrite(v.axis_names, folds):
            raise DiagramError(f"fold: box {diagram.name_of(v)!r} of {diagram.name!r} would carry "
                               f"{list(nv.axis_names)}, not {list(_rewrite(v.axis_names, folds))}")
        memo[id(v)] = nv
    outs = tuple(memo[id(v)] for v in diagram.outputs)
    outs = tuple(o if o.name or o.is_input else o.named(n) for o, n in zip(outs, diagram.output_names))
    return Diagram(diagram.name, outs, [memo[id(v)] for v in diagram.inputs], diagram.description)


def summed_folds(diagram: Diagram, folds: Sequence[AxisFold]) -> tuple[AxisFold, ...]:
    """The folds of ``diagram`` (unfolded) whose parts a contraction sums over: each becomes the
    one axis a kernel's loop walks, where the diagram's own axes are a loop nested in another.

    >>> from napkin.diagrams import array, axes, contract
    >>> a, h, d, n = axes("a h d n")
    >>> dg = Diagram("c", contract(array("A", a, h, d), array("B", n, h, d), over=(h, d), name="C"))
    >>> dg = dg.bind(a=8, h=4, d=16, n=8)
    >>> [f.axis for f in summed_folds(dg, foldable(dg))]
    ['h_d']
    """
    over = {a for v in diagram.nodes if isinstance(v.op, Contract) for a in v.op.over}
    return tuple(f for f in folds if f.parts[0] in over)


def unfolded_shape(value: Value, folds: Sequence[AxisFold]) -> tuple[int, ...]:
    """The shape of a folded diagram's array in the diagram it was folded from.

    >>> from napkin.diagrams import array
    >>> unfolded_shape(array("X", Axis("b_s", 12800), Axis("e", 768)), [AxisFold("b_s", ("b", "s"), (256, 50))])
    (256, 50, 768)
    """
    by_axis = {f.axis: f for f in folds}
    shape: list[int] = []
    for a in value.axes:
        f = by_axis.get(a.name)
        shape.extend(f.sizes if f is not None else (a.bound_size,))
    return tuple(shape)
