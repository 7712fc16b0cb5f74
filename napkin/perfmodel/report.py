"""What ``napkin cost`` reports: per level H, M, FLOPs and the predicted time of a plan.

The plan is the one :func:`napkin.codegen.planner.derive` derives (with the relabellings the user
pinned, ``--group q=128 --stream x=64``); its predicted time is the plan's own, the one
prediction function's, which ``napkin derive`` prints and the benchmark checks. The JSON form is
a stable interface:

``{"diagram", "gpu", "dtype", "sizes", "plan", "schedule_text", "levels": {HBM|L2|SMEM|RF|TC:
{"H_elements", "H_bytes", "H_per_group_elements", "M_elements", "M_bytes"}}, "flops",
"flops_by_unit", "predicted_seconds", "tflops", "hbm_gbps", "bound", "kernels", "symbolic"?}``

>>> parse_relabel("q=64@RF", "group")
('q', (64, 'RF', 'group'))
"""

from __future__ import annotations

from typing import Iterable, Mapping

from ..errors import ScheduleError
from .cost import cost
from .hardware import get_gpu
from .method import SYMBOLIC_MAX_KERNELS, symbolic_HM
from .plan import Plan
from .schedule import LEVELS


def parse_relabel(text: str, kind: str, default_level: str = "SMEM") -> tuple[str, tuple[int, str, str]]:
    """Parse ``axis=size`` or ``axis=size@LEVEL`` (a CLI ``--group``/``--stream`` value)."""
    axis, eq, rest = text.partition("=")
    if not eq or not axis:
        raise ScheduleError(f"--{kind} {text!r}: expected AXIS=SIZE or AXIS=SIZE@LEVEL (for example q=128)")
    size_text, at, level = rest.partition("@")
    level = level.upper() if at else default_level
    if level not in LEVELS:
        raise ScheduleError(f"--{kind} {text!r}: unknown level {level!r}; levels are {', '.join(LEVELS)}")
    try:
        size = int(size_text)
    except ValueError:
        raise ScheduleError(f"--{kind} {text!r}: size {size_text!r} is not an integer") from None
    if size <= 0:
        raise ScheduleError(f"--{kind} {text!r}: size must be positive")
    return axis.strip(), (size, level, kind)


def parse_relabels(groups: Iterable[str] | None, streams: Iterable[str] | None) -> dict:
    """``--group``/``--stream`` values → the ``fixed`` mapping derive takes."""
    fixed: dict = {}
    for text, kind in [(t, "group") for t in groups or ()] + [(t, "stream") for t in streams or ()]:
        axis, spec = parse_relabel(text, kind)
        if axis in fixed:
            raise ScheduleError(f"axis {axis!r} is relabelled twice (--group/--stream)")
        fixed[axis] = spec
    return fixed


def _check_fixed_axes(diagram, fixed: Mapping) -> None:
    unknown = [a for a in fixed if a not in diagram.axes]
    if unknown:
        raise ScheduleError(f"diagram {diagram.name!r} has no axis {unknown[0]!r} to group or stream; "
                            f"its axes are {list(diagram.axes)}")


def cost_report(plan: Plan, *, symbolic: bool = False) -> dict:
    """Cost a plan per level and give its predicted time (the plan's); a JSON-safe dict."""
    g = get_gpu(plan.gpu)
    c = cost(plan.schedule.padded_view(), g)  # a tile that overhangs its axis is costed whole
    flops = float(c.total_flops)
    seconds = plan.seconds
    slowest = max(plan.kernels, key=lambda k: k.seconds)
    hbm = float(c.levels["HBM"].H_bytes)
    out = {
        "diagram": plan.diagram.name, "gpu": g.key, "gpu_name": g.name, "dtype": plan.dtype,
        "sizes": {n: int(v) for n, v in plan.diagram.sizes.items()}, "plan": plan.to_dict(),
        "schedule_text": " | ".join(f"{k.name}: {k.describe()}" for k in plan.kernels),
        "levels": {k: v.to_dict() for k, v in c.levels.items()},
        "flops": flops, "flops_by_unit": {k: float(v) for k, v in c.flops.items()},
        "predicted_seconds": seconds, "tflops": flops / seconds / 1e12 if seconds > 0 else 0.0,
        "hbm_gbps": hbm / seconds / 1e9 if seconds > 0 else 0.0, "bound": slowest.bound,
        "kernels": [{"name": k.name, "family": k.family, "predicted_seconds": k.seconds, "bound": k.bound}
                    for k in plan.kernels],
    }
    if symbolic:
        H, M = symbolic_HM(plan.schedule.padded_view())
        if H is None:
            out["symbolic"] = {"note": f"not written in symbols: a plan of {len(plan.kernels)} kernels (at most "
                                       f"{SYMBOLIC_MAX_KERNELS}) or one the model cannot write so"}
        else:
            out["symbolic"] = {"H_L2": str(H), "M_SMEM": str(M)}
    return out


def _num(x) -> str:
    v = float(x)
    if v == int(v) and abs(v) < 1e7:
        return f"{int(v):,}"
    return f"{v:.4g}"


def _bytes(b) -> str:
    v = float(b)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def format_cost_report(rep: dict) -> str:
    """The report as a plain-text table (the CLI prints it with rich)."""
    lines = [f"{rep['diagram']} on {rep['gpu_name']} ({rep['dtype']}); sizes "
             + ", ".join(f"{k}={v}" for k, v in rep["sizes"].items()),
             f"plan: {rep['schedule_text']}",
             f"{'level':<6} {'H elements':>16} {'H bytes':>12} {'M per block':>12}"]
    for name, lv in rep["levels"].items():
        lines.append(f"{name:<6} {_num(lv['H_elements']):>16} {_bytes(lv['H_bytes']):>12} "
                     f"{_bytes(lv['M_bytes']):>12}")
    units = ", ".join(f"{k} {_num(v)}" for k, v in rep["flops_by_unit"].items())
    lines.append(f"FLOPs: {_num(rep['flops'])} ({units})")
    lines.append(f"predicted: {rep['predicted_seconds'] * 1e6:.1f} µs, {rep['tflops']:.1f} TFLOP/s, "
                 f"{rep['hbm_gbps']:.0f} GB/s of HBM, bound by {rep['bound']}")
    if "symbolic" in rep and "note" in rep["symbolic"]:
        lines.append(f"symbols: {rep['symbolic']['note']}")
    elif "symbolic" in rep:
        lines.append(f"H (L2→SMEM) = {rep['symbolic']['H_L2']}")
        lines.append(f"M (SMEM)    = {rep['symbolic']['M_SMEM']}")
    return "\n".join(lines)
