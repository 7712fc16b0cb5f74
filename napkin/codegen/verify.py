"""Checking generated kernels against the PyTorch reference.

For every shape of a sweep: fresh random normal inputs (never zeros), outputs filled with NaN
before the run (an element the kernel never writes stays NaN and fails), the compiled diagram
run on them, and the diagram's reference run in float64 on the same inputs. The score of each
output is the relative error ‖out − ref‖ / ‖ref‖ (NaN or inf anywhere in ``out`` is a failure),
against 1e-2 for bf16/fp16, 1e-5 for fp32 and 5e-2 for fp8 (e4m3 keeps 3 mantissa bits: rounding
an output alone costs about 3.6 %, the fp8 attention kernel's stated tolerance is 5 %).

A plan of several kernels passes its intermediates through HBM in their own dtype, as eager
PyTorch does; its outputs are judged against the reference that rounds them at the same kernel
boundaries (:func:`boundary_reference`: each kernel's sub-diagram in float64, its outputs rounded
to their dtype), and the distance from the exact reference is reported beside it
(``exact_error``), so a kernel that is wrong still fails while bf16 intermediates do not.

Nothing is raised on a mismatch, nor on a kernel that fails to compile or launch: the
:class:`VerifyReport` says so (``ok`` is False), so the CLI can print it and exit non-zero.

The default sweep: the sizes given (when the diagram is bound or sizes are given), the same
sizes made ragged (not multiples of any tile: ``n → n − 1``, odd), and a tiny odd shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..errors import LaunchError, NapkinError

__all__ = ["verify", "verify_compiled", "boundary_reference", "VerifyReport", "VerifyRow", "default_shapes",
           "TOLERANCE"]

#: Relative-error tolerance per input dtype.
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-5, "fp8": 5e-2}

_TINY = (5, 3, 7, 2, 9, 11, 13, 6)


@dataclass(frozen=True)
class VerifyRow:
    """One output at one shape."""

    shape: dict
    output: str
    rel_error: float
    tolerance: float
    ok: bool
    family: str = ""
    schedule: str = ""
    error: str = ""          # a compile or launch failure, when there is one
    nan_count: int = 0
    exact_error: float | None = None  # against the exact reference, for plans of several kernels


@dataclass
class VerifyReport:
    """Every output at every shape; ``ok`` when all passed."""

    diagram: str
    dtype: str
    rows: list = field(default_factory=list)
    #: what the plans said aloud (a kernel on the scalar fallback), once each
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def failures(self) -> list:
        return [r for r in self.rows if not r.ok]

    @property
    def worst(self) -> float:
        errs = [r.rel_error for r in self.rows]
        return max(errs) if errs else math.nan

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"verify {self.diagram} ({self.dtype}): {'OK' if self.ok else 'FAILED'}"
        table = [("shape", "output", "rel error", "tolerance", "result", "family", "schedule")]
        for r in self.rows:
            shape = " ".join(f"{k}={v}" for k, v in r.shape.items())
            err = "nan" if math.isnan(r.rel_error) else f"{r.rel_error:.2e}"
            res = "ok" if r.ok else ("ERROR" if r.error else "FAIL")
            if r.nan_count:
                res += f" ({r.nan_count} NaN)"
            if r.exact_error is not None:  # several kernels: judged against their rounded boundaries
                err += f" (exact {r.exact_error:.1e})"
            table.append((shape, r.output, err, f"{r.tolerance:.0e}", res, r.family, r.schedule))
        widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
        lines = [head] + [f"  slow path: {n}" for n in self.notes]
        for row in table:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        for r in self.rows:
            if r.error:
                first = r.error.strip().splitlines()[0] if r.error.strip() else r.error
                lines.append(f"  error at {' '.join(f'{k}={v}' for k, v in r.shape.items())}: {first}")
        return "\n".join(lines)


def _free_axes(diagram) -> list[str]:
    """Axes whose size is their own (not another axis's symbol, as x = q after a rename)."""
    out = []
    for n, a in diagram.axes.items():
        if a.is_bound or getattr(a.size, "name", n) == n:
            out.append(n)
    return out


def default_shapes(diagram, sizes: Mapping[str, int] | None = None) -> list[dict]:
    """The sweep: the given sizes (or the diagram's own when bound), ragged sizes (n−1, odd, not
    tile multiples) and a tiny odd shape. Sizes of axes that follow another are left out."""
    free = _free_axes(diagram)
    base = {}
    for n in free:
        a = diagram.axes[n]
        if sizes and n in sizes:
            base[n] = int(sizes[n])
        elif a.is_bound:
            base[n] = a.size
    shapes = []
    if len(base) == len(free) and base:
        shapes.append(dict(base))
        ragged = {}
        for n, s in base.items():
            r = s - 1 if s > 2 else s
            if r > 2 and r % 2 == 0:
                r -= 1
            ragged[n] = max(1, r)
        if ragged != base:
            shapes.append(ragged)
    else:
        mid = {n: base.get(n, 61 + 2 * i) for i, n in enumerate(free)}
        shapes.append(mid)
    tiny = {n: _TINY[i % len(_TINY)] for i, n in enumerate(free)}
    if tiny not in shapes:
        shapes.append(tiny)
    return shapes


def _rel_error(out, ref) -> tuple[float, int]:
    import torch

    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    bad = int((~torch.isfinite(o)).sum().item())
    if bad:
        return math.nan, bad
    diff = torch.linalg.vector_norm((o - r).flatten())
    norm = torch.linalg.vector_norm(r.flatten())
    if not torch.isfinite(norm):
        return math.nan, 0
    if norm.item() == 0.0:
        return float(diff.item()), 0
    return float((diff / norm).item()), 0


def verify_compiled(compiled, *, seed: int | None = None, tolerance: float | None = None) -> list[VerifyRow]:
    """Check one compiled diagram on fresh random inputs; one row per output."""
    import torch

    from ..diagrams.reference import random_inputs
    from ..dtypes import torch_dtype

    d = compiled.diagram
    dt = sorted(d.dtypes)[0] if d.dtypes else "bf16"
    tol = TOLERANCE.get(dt, 1e-2) if tolerance is None else tolerance
    shape = {n: d.axes[n].bound_size for n in _free_axes(d)}
    fam = compiled.family
    sched = _schedule_text(compiled)
    inputs = random_inputs(d, device="cuda", seed=seed)
    # the kernels may store an input in another dtype than the diagram's (a saved log-sum-exp in fp32)
    stored = getattr(compiled, "_dtypes", None) or {}
    inputs = {k: v.to(torch_dtype(stored.get(k, d.value(k).dtype))) for k, v in inputs.items()}
    outs = compiled.empty_outputs(device="cuda", fill=float("nan"))
    compiled(**inputs, out=outs)
    torch.cuda.synchronize()
    ref = d.reference({k: v.to(torch.float64) for k, v in inputs.items()}, dtype=torch.float64)
    plan = getattr(compiled, "plan", None)
    bounded = boundary_reference(plan, inputs) if plan is not None and len(plan.kernels) > 1 else None
    rows = []
    for n in compiled.output_names:
        if bounded is not None:
            err, nans = _rel_error(outs[n], bounded[n])
            exact = _rel_error(outs[n], ref[n])[0]
        else:
            (err, nans), exact = _rel_error(outs[n], ref[n]), None
        ok = not math.isnan(err) and err <= tol
        rows.append(VerifyRow(shape, n, err, tol, ok, fam, sched, nan_count=nans, exact_error=exact))
    return rows


def boundary_reference(plan, inputs) -> dict:
    """The outputs of ``plan`` computed kernel by kernel in float64, every array passed between
    kernels rounded to its dtype (what the plan's HBM buffers hold); ``inputs`` by name."""
    import torch

    from ..dtypes import torch_dtype
    from .partition import kernel_problem

    d = plan.diagram
    # a plan that folds axes runs on arrays of the folded shapes (the same bytes)
    shape = {v.name: tuple(a.bound_size for a in v.axes) for v in (*d.inputs, *d.outputs)}
    env = {n: t.reshape(shape[n]) if n in shape else t for n, t in inputs.items()}
    for pk in plan.kernels:
        sub, _ = kernel_problem(d, pk.boxes, pk.name)
        got = sub.reference({n: env[n].to(torch.float64) for n in sub.input_names}, dtype=torch.float64)
        for n, v in zip(sub.output_names, sub.outputs):
            env[n] = got[n].to(torch_dtype(v.dtype))
    out_shape = {n: tuple(a.bound_size for a in v.axes) for n, v in zip(plan.interface.output_names,
                                                                       plan.interface.outputs)}
    return {n: env[n].to(torch.float64).reshape(out_shape[n]) for n in d.output_names}


def _schedule_text(compiled) -> str:
    parts = []
    for k in compiled.schedule.kernels:
        rel = ",".join(f"{r.axis}:{r.symbol}={r.size}@{r.level}" for r in k.relabels)
        parts.append(rel)
    tun = compiled.program.launches[0].tunables if compiled.program.launches else ()
    tuned = " ".join(f"{k}={v}" for k, v in tun)
    n = len(compiled.schedule.kernels)
    desc = f"{n} kernel{'s' if n != 1 else ''}"
    rel = "; ".join(p for p in parts if p)
    return " ".join(x for x in (desc, rel, tuned) if x)


def verify(diagram, *, sizes: Mapping[str, int] | None = None, dtype: str = "bf16",
           shapes: Sequence[Mapping[str, int]] | None = None, gpu=None, seed: int | None = None,
           family: str | None = None, schedule=None) -> VerifyReport:
    """Compile and check ``diagram`` over a sweep of shapes (see the module docstring).

    ``shapes`` replaces the default sweep; ``family``/``schedule`` are passed to compile (a
    schedule is bound to each shape). Needs a CUDA GPU (LaunchError otherwise).
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        raise LaunchError("verify needs torch with CUDA") from e
    if not torch.cuda.is_available():
        raise LaunchError("verify needs a CUDA GPU (torch.cuda.is_available() is False)")
    from .api import compile as compile_diagram
    from .lower import prepare

    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    base = diagram.with_dtype(dtype) if dtype else diagram
    report = VerifyReport(diagram.name, dtype or "")
    sweep = list(shapes) if shapes is not None else default_shapes(base, sizes)
    for i, shp in enumerate(sweep):
        shp = dict(shp)
        try:
            d = prepare(base, sizes=shp)
        except NapkinError as e:
            report.rows.append(VerifyRow(shp, "*", math.nan, TOLERANCE.get(dtype, 1e-2), False, error=str(e)))
            continue
        try:
            sched = schedule.bind(shp) if schedule is not None else None
            cd = compile_diagram(d, gpu=gpu, schedule=sched, family=family)
            report.notes.extend(n for n in getattr(cd.plan, "notes", ()) if n not in report.notes)
            rows = verify_compiled(cd, seed=None if seed is None else seed + i)
        except Exception as e:  # noqa: BLE001 - a failing kernel is reported, never raised
            rows = [VerifyRow(shp, n, math.nan, TOLERANCE.get(dtype, 1e-2), False, family or "", "",
                              error=f"{type(e).__name__}: {e}") for n in d.output_names]
        report.rows.extend(rows)
    return report
