"""One kernel of a partition as a diagram of its own (docs/architecture.md, "Partitions").

The planner costs, and lowering builds, each kernel of a plan from the same sub-diagram, made
here by :func:`kernel_problem`: the kernel's boxes, with every array it reads from outside as an
input (an HBM tensor: a diagram input or a buffer written by an earlier kernel) and every array
it computes that the diagram outputs or a later kernel reads as an output. Names are kept, so a
sub-diagram's inputs and outputs are the names of the HBM tensors the launches read and write.

A rename is a free view: it is never a unit of a partition (except an output that shows a
diagram input, which a kernel copies). A box that reads a rename of an array
computed outside its kernel reads that array straight from HBM, seen with the renamed axes (the
input keeps the HBM tensor's name). A rename that is a diagram output is computed by the kernel
of the array it renames (it is in that sub-diagram, as a box and an output).

>>> from napkin.diagrams import library
>>> d = library.get("transformer_block")
>>> units = plan_units(d)
>>> "K" in units, "S" in units
(False, True)
>>> sub, boxes = kernel_problem(d, ("S", "S_scaled", "S_masked", "P", "O"), "O")
>>> sub.input_names, sub.output_names
(('Qp', 'Kp', 'Vp'), ('O',))
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

from ..diagrams.axes import check_name
from ..diagrams.diagram import Diagram
from ..diagrams.ops import Rename, Value, apply, array

__all__ = ["plan_units", "kernel_problem", "attach_renames", "is_connected"]


def _is_copy(diagram: Diagram, v: Value) -> bool:
    """A rename that is a diagram output and shows a diagram input: a kernel must copy it."""
    if not any(v is o for o in diagram.outputs):
        return False
    while isinstance(v.op, Rename):
        v = v.args[0]
    return v.is_input


def _is_view(diagram: Diagram, v: Value) -> bool:
    """A rename (a view, never a unit of a partition), unless a kernel must copy it."""
    return isinstance(v.op, Rename) and not _is_copy(diagram, v)


def plan_units(diagram: Diagram) -> tuple[str, ...]:
    """The boxes a partition is made of, in the diagram's order: every box but the renames."""
    return tuple(diagram.name_of(v) for v in diagram.nodes if not _is_view(diagram, v))


def _source(diagram: Diagram, v: Value) -> Value:
    """The array a chain of views shows (``v`` itself when it is no view)."""
    while _is_view(diagram, v):
        v = v.args[0]
    return v


def attach_renames(diagram: Diagram, kernels: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Give every view to the kernel of its first reader (so a schedule runs every box), or to the
    kernel of the array it shows when nothing reads it. ``kernels`` are tuples of unit boxes."""
    where = {b: i for i, k in enumerate(kernels) for b in k}
    out = [list(k) for k in kernels]
    consumers = diagram.consumers
    for v in diagram.nodes:
        if not _is_view(diagram, v):
            continue
        name = diagram.name_of(v)
        readers = [diagram.name_of(c) for c in consumers.get(id(v), ())]
        stack = list(readers)
        target = None
        while stack:  # a view of a view: the first real reader decides
            r = stack.pop(0)
            if r in where:
                target = where[r]
                break
            rv = diagram.value(r)
            stack += [diagram.name_of(c) for c in consumers.get(id(rv), ())]
        if target is None:
            target = where.get(diagram.name_of(_source(diagram, v)), 0)
        out[target].append(name)
        where[name] = target
    order = {diagram.name_of(v): i for i, v in enumerate(diagram.nodes)}
    return [tuple(sorted(k, key=order.__getitem__)) for k in out]


def is_connected(diagram: Diagram, boxes: Sequence[str]) -> bool:
    """Whether the boxes form one piece when arrays between them (through views) are wires. A box
    that reads nothing but diagram inputs is wired to the boxes that read one of the same inputs
    too: fused, they read it once (a layernorm backward's ``dbeta = Σ_r dY`` beside the row kernel
    that reads dY)."""
    names = set(boxes)
    if len(names) <= 1:
        return True
    values = {diagram.name_of(v): v for v in diagram.nodes if diagram.name_of(v) in names}
    adj: dict[str, set[str]] = {n: set() for n in names}
    readers: dict[int, set[str]] = {}
    for n, v in values.items():
        for a in v.args:
            src = diagram.name_of(_source(diagram, a)) if not a.is_input else None
            if src in names and src != n:
                adj[n].add(src)
                adj[src].add(n)
            if _source(diagram, a).is_input:
                readers.setdefault(id(_source(diagram, a)), set()).add(n)
    for n, v in values.items():
        if v.args and all(_source(diagram, a).is_input for a in v.args):
            for a in v.args:
                for m in readers[id(_source(diagram, a))] - {n}:
                    adj[n].add(m)
                    adj[m].add(n)
    start = next(iter(names))
    seen, stack = {start}, [start]
    while stack:
        for m in adj[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return len(seen) == len(names)


def _bound_op(op, diagram: Diagram):
    """A map whose parameters name axes the kernel may not carry (``scale(1/√d)`` on scores that
    have no ``d``) gets their values, so the sub-diagram stands alone."""
    params = getattr(op, "params", ())
    if not any(getattr(p, "free_symbols", None) for p in params):
        return op
    return dataclasses.replace(op, params=op.param_values(diagram.sizes))


def kernel_problem(diagram: Diagram, boxes: Sequence[str], name: str) -> tuple[Diagram, tuple[str, ...]]:
    """The sub-diagram one kernel runs (see the module docstring) and the boxes it holds (the
    kernel's boxes less the views it reads through). The sub-diagram is called
    ``<diagram>_<name>``, so generated entry points of different kernels differ."""
    check_name(name, "kernel")
    names = set(boxes)
    memo: dict[int, Value] = {}
    inputs: dict[str, Value] = {}
    kept: list[str] = []

    def resolve(a: Value) -> Value:
        if id(a) in memo:
            return memo[id(a)]
        src = _source(diagram, a)
        inside = not src.is_input and diagram.name_of(src) in names
        if inside and src is not a:
            # a view of an array this kernel computes: keep the rename box inside the kernel
            memo[id(a)] = apply(a.op, [resolve(a.args[0])], diagram.name_of(a))
            kept.append(diagram.name_of(a))
            return memo[id(a)]
        if inside:
            return memo[id(src)]
        hbm = diagram.name_of(src)
        if a is not src and hbm in direct:
            # the kernel also reads this HBM array as it is (S beside a transposed view of S): the
            # array is the input under its own axes and the view a box over it, whichever comes first
            memo[id(a)] = apply(a.op, [resolve(a.args[0])], diagram.name_of(a))
            kept.append(diagram.name_of(a))
            return memo[id(a)]
        key = f"{hbm}\0{','.join(a.axis_names)}"
        if key not in inputs:
            if any(k.split("\0")[0] == hbm for k in inputs):
                # one HBM tensor seen under two sets of axes: keep the view as a box
                memo[id(a)] = apply(a.op, [resolve(a.args[0])], diagram.name_of(a))
                kept.append(diagram.name_of(a))
                return memo[id(a)]
            inputs[key] = array(hbm, *a.axes, dtype=a.dtype)
        memo[id(a)] = inputs[key]
        return inputs[key]

    names = {n for n in names if not _is_view(diagram, diagram.value(n))}
    direct = {diagram.name_of(a) for v in diagram.nodes if diagram.name_of(v) in names for a in v.args
              if _source(diagram, a) is a and (a.is_input or diagram.name_of(a) not in names)}
    for v in diagram.nodes:
        n = diagram.name_of(v)
        if n not in names:
            continue
        memo[id(v)] = apply(_bound_op(v.op, diagram), [resolve(a) for a in v.args], n)
        kept.append(n)
    for o in diagram.outputs:  # an output that is a view of an array this kernel computes
        if _is_view(diagram, o) and not _source(diagram, o).is_input and diagram.name_of(_source(diagram, o)) in names:
            resolve(o)
    outs = []
    consumers = diagram.consumers
    computed = set(kept)
    for v in diagram.nodes:
        n = diagram.name_of(v)
        if n not in computed:  # read from HBM (an input of this kernel), not computed here
            continue

        def read_outside(u: Value) -> bool:
            for c in consumers.get(id(u), ()):
                if _is_view(diagram, c):
                    if read_outside(c):
                        return True
                elif diagram.name_of(c) not in names:
                    return True
            return False

        if any(v is o for o in diagram.outputs) or read_outside(v):
            outs.append(memo[id(v)])
    order = {diagram.name_of(v): i for i, v in enumerate(diagram.nodes)}
    kept = sorted(set(kept), key=order.__getitem__)
    return Diagram(sub_name(diagram.name, name), outs, list(inputs.values())), tuple(kept)


def sub_name(diagram: str, kernel: str) -> str:
    """``<diagram>_<kernel>``, shortened with a hash of the whole where it would pass the 32
    characters a name may have (generated entry points are built from it)."""
    full = f"{diagram}_{kernel}"
    if len(full) <= 32:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[:23]}_{digest}"
