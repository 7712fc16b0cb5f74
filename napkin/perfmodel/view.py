"""Views of a scheduled diagram: the diagram coloured by level, and its pseudocode.

- :func:`scheduled_svg` draws the diagram with every array's wires coloured by the
  level it lives at while its kernel runs (HBM between kernels, SMEM tiles, register
  intermediates) and relabelled axes shown on their wires (``q → g_q``, ``x → s_x``). In a plan
  of several kernels each array shows the tiles of the one kernel that uses it
  (:func:`array_labels`), an array passed between kernels (an HBM buffer) shows none, and each box
  is tagged with its kernel (``k2 · Σ e``).
- :func:`pseudocode` writes each kernel as the method reads it — init, loop body,
  finalize — with the memory held at SMEM and in registers in each column.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Schedule
>>> d = library.get("attention").bind(q=1024, x=1024, d=64)
>>> s = Schedule.fused(d, groups={"q": 128}, streams={"x": 64})
>>> level_colors(s)["S"], level_colors(s)["Q"]
('RF', 'SMEM')
>>> "for each chunk of x" in pseudocode(s)
True
"""

from __future__ import annotations

import math

from ..dtypes import dtype as lookup_dtype
from .legality import KernelPlan, analyze
from .plan import Plan
from .schedule import Kernel, Schedule


def level_colors(schedule: Schedule) -> dict[str, str]:
    """Array name → the level it lives at (kernel-local level; HBM for arrays between kernels and
    for inputs that several kernels read)."""
    out: dict[str, str] = {}
    plans = analyze(schedule)
    d = schedule.diagram
    for p in plans:
        for v in (*p.inputs, *p.boxes):
            name = d.name_of(v)
            level = p.level.get(id(v), "RF")
            if out.get(name) not in ("SMEM",):
                out[name] = level
    between = {d.name_of(v) for p in plans for v in p.stores} - set(d.output_names)
    shared = {name for name, used in _users(schedule).items() if len(used) > 1}
    for name in between | (shared & set(d.input_names)):
        out[name] = "HBM"
    for v in d.inputs:
        out.setdefault(v.name, "HBM")
    return out


def _kernel_labels(kernel: Kernel) -> dict[str, str]:
    """Axis name → the label of its SMEM relabelling in ``kernel`` (``g_q=128``; the first wins)."""
    out: dict[str, str] = {}
    for r in kernel.relabels:
        if r.level in ("SMEM",) and r.axis not in out:
            out[r.axis] = f"{r.symbol}={r.size}" if not r.is_symbolic else r.symbol
    return out


def relabel_labels(schedule: Schedule) -> dict[str, str]:
    """Axis name → the label drawn on its wire, e.g. ``g_q=128`` (the first relabelling wins).

    One label per axis: right for a schedule of one kernel; :func:`array_labels` labels each
    array by its own kernel."""
    out: dict[str, str] = {}
    for k in schedule.kernels:
        for axis, label in _kernel_labels(k).items():
            out.setdefault(axis, label)
    return out


def kernel_numbers(schedule: Schedule) -> dict[str, int]:
    """Box (array) name → the kernel that computes it, numbered from 1 in launch order."""
    return {b: i for i, k in enumerate(schedule.kernels, 1) for b in k.boxes}


def _users(schedule: Schedule) -> dict[str, set[int]]:
    """Array name → the kernels (numbered from 1) that compute or read it."""
    d = schedule.diagram
    users: dict[str, set[int]] = {}
    for i, k in enumerate(schedule.kernels, 1):
        for b in k.boxes:
            users.setdefault(b, set()).add(i)
            for a in d.value(b).args:
                users.setdefault(d.name_of(a), set()).add(i)
    return users


def label_kernels(schedule: Schedule) -> dict[str, int]:
    """Array name → the one kernel whose tiles its wires show (see :func:`array_labels`); arrays
    used by several kernels (HBM buffers between them) are left out."""
    return {name: next(iter(used)) for name, used in _users(schedule).items() if len(used) == 1}


def array_labels(schedule: Schedule) -> dict[str, dict[str, str]]:
    """Array name → {axis: label} of the one kernel that uses it: the kernel that computes it, or
    for an input of the diagram the one kernel that reads it. An array that more than one kernel
    uses (written by one and read by another, or an input several read) is an HBM buffer between
    kernels and has no tiles: ``{}``. Labels are the SMEM relabellings (``g_q=128``, ``s_x=64``)
    of the array's own axes.

    >>> from napkin.diagrams import library
    >>> d = library.get("attention").bind(q=1024, x=1024, d=64)
    >>> array_labels(Schedule.fused(d, groups={"q": 128}, streams={"x": 64}))["O"]
    {'q': 'g_q=128'}
    """
    d = schedule.diagram
    owner = label_kernels(schedule)
    labels = [_kernel_labels(k) for k in schedule.kernels]
    out: dict[str, dict[str, str]] = {}
    for v in (*d.inputs, *d.nodes):
        name = d.name_of(v)
        k = owner.get(name)
        out[name] = {} if k is None else {a: lab for a, lab in labels[k - 1].items() if a in v.axis_names}
    return out


def scheduled_svg(schedule: Schedule | Plan, **options) -> str:
    """The diagram of ``schedule`` (or of a plan) drawn with wires coloured by level and relabelled
    axes: one kernel's relabellings on every wire, or, for several kernels, each array's own
    kernel's (:func:`array_labels`) and each box tagged with its kernel."""
    from ..diagrams.render import render_svg

    if isinstance(schedule, Plan):
        schedule = schedule.schedule
    colors = level_colors(schedule)
    if len(schedule.kernels) <= 1:
        return render_svg(schedule.diagram, wire_colors=colors, relabels=relabel_labels(schedule), **options)
    return render_svg(schedule.diagram, wire_colors=colors, array_relabels=array_labels(schedule),
                      kernels={**label_kernels(schedule), **kernel_numbers(schedule)}, **options)


def _extent(plan: KernelPlan, axis: str):
    if axis in plan.groups:
        return plan.groups[axis]
    if plan.stream and plan.stream[0] == axis:
        return plan.stream[1]
    if axis in plan.outer_streams:
        return 1
    return plan.sizes[axis]


def _tile(plan: KernelPlan, axes) -> str:
    parts = []
    for a in axes:
        if a in plan.groups:
            parts.append(f"g_{a}")
        elif (plan.stream and plan.stream[0] == a) or a in plan.outer_streams:
            parts.append(f"s_{a}")
        else:
            parts.append(a)
    return "[" + ",".join(parts) + "]"


def _bytes(plan: KernelPlan, axes, dt: str) -> float:
    n = 1
    for a in axes:
        e = _extent(plan, a)
        n *= e if isinstance(e, int) else math.nan
    return n * lookup_dtype(dt).bytes


def _fmt_bytes(b: float) -> str:
    if b != b:  # symbolic sizes
        return "—"
    if b >= 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b:.0f} B"


def _held(plan: KernelPlan, column: int) -> str:
    smem = rf = 0.0
    for r in plan.residents:
        if r.start <= column <= r.end:
            b = _bytes(plan, r.axes, r.dtype)
            if r.level == "SMEM":
                smem += b
            else:
                rf += b
    return f"SMEM {_fmt_bytes(smem)}, RF {_fmt_bytes(rf)}"


def pseudocode(schedule: Schedule) -> str:
    """Each kernel as init → loop body → finalize, with the memory held per column."""
    d = schedule.diagram
    lines = []
    for p in analyze(schedule):
        grid = " × ".join(f"{a}/g_{a}" for a in p.groups) or "1"
        lines.append(f"kernel {p.name}: one block per group ({grid} blocks)")
        for a, g in p.groups.items():
            lines.append(f"  group {a} → g_{a} = {g}")
        for a, w in p.rf_groups.items():
            lines.append(f"  per warp {a} → w_{a} = {w}")
        if p.stream:
            lines.append(f"  stream {p.stream[0]} → s_{p.stream[0]} = {p.stream[1]}")
        pre_inputs = [v for v in p.inputs if p.phase.get(id(v)) != "chunk"]
        chunk_inputs = [v for v in p.inputs if p.phase.get(id(v)) == "chunk"]
        indent = "  "
        lines.append(f"{indent}for each group:")
        indent += "  "
        for v in pre_inputs:
            lines.append(f"{indent}load {d.name_of(v)}{_tile(p, v.axis_names)} HBM → {p.level.get(id(v), 'SMEM')}")
        for i, b in enumerate(p.columns):
            if i == p.n_pre and p.stream:
                accs = [r for r in p.residents if r.accumulator and p.stream[0] not in r.axes]
                if accs:
                    lines.append(f"{indent}init " + ", ".join(
                        f"{r.key}{_tile(p, r.axes)}@{r.level}" for r in accs))
                lines.append(f"{indent}for each chunk of {p.stream[0]} (s_{p.stream[0]} = {p.stream[1]}):")
                indent += "  "
                for v in chunk_inputs:
                    lines.append(f"{indent}load {d.name_of(v)}{_tile(p, v.axis_names)} HBM → "
                                 f"{p.level.get(id(v), 'SMEM')}")
            if i == p.n_pre + p.n_body and p.stream:
                indent = indent[:-2]
                lines.append(f"{indent}finalize:")
            args = ", ".join(d.name_of(a) for a in b.args)
            online = " (online: rescale by exp(μ_old − μ_new))" if id(b) in p.online else ""
            lines.append(f"{indent}{d.name_of(b)}{_tile(p, b.axis_names)} = {b.op.label()}({args}){online}"
                         f"    # {p.level.get(id(b), 'RF')}; holds {_held(p, i)}")
        if p.stream and p.n_pre + p.n_body == len(p.columns):
            indent = indent[:-2]
            if p.online:
                lines.append(f"{indent}finalize: divide each running output by its running sum")
        for v in p.stores:
            lines.append(f"{indent}store {d.name_of(v)}{_tile(p, v.axis_names)} → HBM")
        lines.append("")
    return "\n".join(lines).rstrip()
