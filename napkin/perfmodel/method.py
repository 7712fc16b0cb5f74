"""The Napkin method, narrated for a plan (docs/architecture.md, "derive").

The planner (:mod:`napkin.codegen.planner`) decides; this module tells how its plan follows from
the method of "FlashAttention on a Napkin", each step costed by the model:

1. **naive**: every box its own kernel (elementwise maps ride along as epilogues); every
   intermediate goes through HBM.
2. **fuse**: the plan's kernels, untiled: intermediates inside a kernel never reach HBM, but
   each kernel would have to hold its whole problem.
3. **group**: the plan's groups (``q → g_q``): inputs lacking a grouped axis are re-read once
   per group, so larger groups cut traffic; capacity caps them.
4. **stream**: the plan's streams (``x → s_x``): memory falls from the whole axis to a chunk,
   which frees room for larger groups. This step is the plan, with its predicted time.

``H`` and ``M`` of each step are also given in axis-size and tile symbols, as the paper writes
them (at the block boundary, L2→SMEM, and per block at SMEM).

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.plan import Plan, PlannedKernel
>>> from napkin.perfmodel.schedule import Kernel, Relabel
>>> d = library.get("attention").bind(q=4096, x=4096, d=128)
>>> k = Kernel("O", tuple(d.name_of(v) for v in d.nodes),
...            (Relabel("q", 128, "SMEM", "group"), Relabel("x", 64, "SMEM", "stream")), family="attention")
>>> steps = method_steps(Plan(d, "h100", "sm_90a", "bf16", (PlannedKernel(k, 1e-4, "tensor"),)))
>>> [s.title for s in steps]
['naive', 'fuse', 'group', 'stream']
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NapkinError, ScheduleError
from .cost import Cost, cost
from .hardware import GPU, get_gpu
from .plan import Plan
from .schedule import Relabel, Schedule

__all__ = ["Step", "method_steps", "step_dict", "format_steps", "thresholds", "hardware_notes", "symbolic_HM"]

#: Past this many kernels the steps are not written out in symbols (sympy on a long chain costs
#: more than the whole search, and the formula is not one a reader would read).
SYMBOLIC_MAX_KERNELS = 4


@dataclass(frozen=True)
class Step:
    """One step of the method: its schedule, cost, a sentence, and H, M in symbols."""

    title: str
    schedule: Schedule
    cost: Cost | None
    note: str
    H: object = None
    M: object = None
    seconds: float | None = None


def _keep(schedule: Schedule, kind: str | None) -> Schedule:
    """The schedule with only the relabellings of one kind (None: none at all)."""
    ks = tuple(k.replace(relabels=tuple(r for r in k.relabels if kind is not None and r.kind == kind))
               for k in schedule.kernels)
    return Schedule(schedule.diagram, ks, schedule.gpu, schedule.dtype)


def symbolic_HM(schedule: Schedule) -> tuple[object, object]:
    """(H at the block boundary, M per block) with axis sizes and tiles as symbols (None, None
    where the model cannot write them)."""
    if len(schedule.kernels) > SYMBOLIC_MAX_KERNELS:
        return None, None
    # a group of one (one head per block) is no tunable: it stays 1, the other tiles become symbols
    ks = tuple(k.replace(relabels=tuple(Relabel(r.axis, 1 if r.size == 1 else None, r.level, r.kind)
                                        for r in k.relabels))
               for k in schedule.kernels)
    sym = Schedule(schedule.diagram, ks, None, schedule.dtype)
    try:
        c = cost(sym, False, symbolic=True, l2_caching=False)
    except (ScheduleError, TypeError, ValueError):
        return None, None
    return c.H("L2"), c.M("SMEM")


def _plain(schedule: Schedule, gpu: GPU) -> Cost | None:
    try:
        return cost(schedule, gpu, l2_caching=False)
    except ScheduleError:
        return None


def method_steps(plan: Plan) -> tuple[Step, ...]:
    """naive → fuse → group → stream for ``plan`` (see the module docstring)."""
    gpu = get_gpu(plan.gpu)
    s = plan.schedule
    naive = Schedule.unfused(plan.diagram, gpu=plan.gpu, dtype=plan.dtype)
    fused = _keep(s, None)
    grouped = _keep(s, "group")
    c0, c1 = _plain(naive, gpu), _plain(fused, gpu)
    n = len(s.kernels)
    if c0 is not None and c1 is not None:
        dh = float(c0.H("HBM")) - float(c1.H("HBM"))
        change = (f"H falls by {dh:.4g} elements" if dh >= 0 else
                  f"H rises by {-dh:.4g} elements: this partition passes more between kernels than the naive "
                  "one, where every map rides with its producer")
        fuse_note = (f"{n} kernel{'s' if n != 1 else ''} ({' | '.join('+'.join(k.boxes) for k in s.kernels)}): "
                     f"intermediates inside a kernel never reach HBM ({change}); untiled, "
                     "each kernel must hold its whole problem")
    else:
        fuse_note = f"{n} kernel{'s' if n != 1 else ''}: " + " | ".join("+".join(k.boxes) for k in s.kernels)
    groups = [f"{r.axis}→{r.symbol}={r.size}" for k in s.kernels for r in k.groups if r.level == "SMEM"]
    warps = [f"{r.axis}→{r.symbol}={r.size}" for k in s.kernels for r in k.groups if r.level != "SMEM"]
    streams = [f"{r.axis}→{r.symbol}={r.size}" for k in s.kernels for r in k.streams]
    steps = [
        Step("naive", naive, c0, "every box its own kernel; intermediates go through HBM", *symbolic_HM(naive)),
        Step("fuse", fused, c1, fuse_note, *symbolic_HM(fused)),
        Step("group", grouped, _plain(grouped, gpu),
             ("groups " + ", ".join(groups) + (f" (warp tiles {', '.join(warps)})" if warps else "")
              + ": inputs lacking a grouped axis are re-read once per group")
             if groups else "no axis is grouped", *symbolic_HM(grouped)),
        Step("stream", s, _plain(s, gpu),
             ("streams " + ", ".join(streams) + ": memory holds a chunk instead of the whole axis, so groups "
              "can grow; this is the plan") if streams else "nothing is streamed; this is the plan",
             *symbolic_HM(s), seconds=plan.seconds),
    ]
    return tuple(steps)


def step_dict(step: Step) -> dict:
    out = {"title": step.title, "note": step.note,
           "kernels": [{"boxes": list(k.boxes), "tiles": [{"axis": r.axis, "kind": r.kind, "level": r.level,
                                                           "size": int(r.size)} for r in k.relabels]}
                       for k in step.schedule.kernels]}
    if step.cost is not None:
        out["levels"] = {k: v.to_dict() for k, v in step.cost.levels.items()}
        out["flops"] = float(step.cost.total_flops)
    if step.H is not None:
        out["H"], out["M"] = str(step.H), str(step.M)
    if step.seconds is not None:
        out["predicted_seconds"] = step.seconds
    return out


def _fmt_num(x) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


def _fmt_bytes(b: float) -> str:
    """Bytes in KiB, MiB or GiB (1024-based, the unit convention of docs/architecture.md §4.4)."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def format_steps(plan: Plan, steps) -> str:
    """The steps as the method prints them."""
    d = plan.diagram
    # the sizes the caller bound, then the axes the plan runs as one (the steps' formulas use those)
    sizes = ", ".join(f"{k}={v}" for k, v in plan.interface.sizes.items())
    runs = "".join(f"; {' x '.join(f.parts)} run as {f.axis}={f.size}" for f in plan.folds)
    lines = [f"derive {d.name} on {get_gpu(plan.gpu).name} ({plan.dtype}, {plan.arch}); sizes {sizes}{runs}"]
    for i, s in enumerate(steps, 1):
        lines.append(f"{i}. {s.title}: {s.note}")
        if s.H is not None:
            lines.append(f"   H = {s.H}")
            lines.append(f"   M = {s.M}")
        if s.cost is not None:
            lines.append(f"   H[HBM] = {_fmt_num(s.cost.H('HBM'))} elements ({_fmt_num(s.cost.H_bytes('HBM'))} B), "
                         f"H[L2→SMEM] = {_fmt_num(s.cost.H('L2'))}, M[SMEM] = "
                         f"{_fmt_bytes(float(s.cost.M_bytes('SMEM')))} per block")
        if s.seconds is not None:
            lines.append(f"   predicted {s.seconds * 1e6:.1f} µs")
    return "\n".join(lines)


def thresholds(gpu: GPU, dtype: str) -> dict:
    """The compute-bound thresholds of docs/architecture.md §4.4 for this GPU and dtype."""
    from .occupancy import compute_bound_thresholds

    th = compute_bound_thresholds(gpu, dtype if dtype in ("fp16", "bf16", "fp8") else "fp16")
    return {"flops_per_value": th.flops_per_value, "matmul_min_contraction": th.matmul_min_contraction,
            "attention_min_g_q": th.attention_min_g_q, "matmul_min_memory_kib": th.matmul_min_memory_kib}


def _is_attention(diagram) -> bool:
    """A softmax whose output feeds a contraction over the same axis (the streamable pair)."""
    for v in diagram.nodes:
        if v.op.kind == "contract":
            for a in v.args:
                if a.op.kind == "softmax" and a.op.over in v.op.own_axes():
                    return True
    return False


def hardware_notes(diagram, gpu: GPU) -> tuple[str, ...]:
    """For attention on Hopper, the paper's warpgroup analysis (docs/architecture.md §4.4) at this head dim."""
    if not (gpu.has_wgmma and _is_attention(diagram) and "d" in diagram.axes):
        return ()
    from .occupancy import hopper_attention_analysis

    try:
        a = hopper_attention_analysis(gpu, w_q=128, s_x=64, d=int(diagram.axes["d"].size))
    except NapkinError:
        return ()
    return ("the paper's Hopper configuration (wgmma, QK in fp8, PV in fp16; napkin builds it with both products "
            "in fp8 for --dtype fp8 on sm_90a, the attention family's fp8 template):", *a.summary().splitlines())
