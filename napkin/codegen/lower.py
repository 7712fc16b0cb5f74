"""Lowering a diagram to a :class:`~napkin.codegen.plan.Program`: pick the family, the schedule,
generate the launches.

Families are tried in order (:data:`napkin.codegen.families.ORDER`: rowwise, contraction,
attention, fallback); the first that takes the diagram lowers it, with the schedule
:mod:`napkin.codegen.select` ranks fastest unless one is given. A family that accepts a diagram
but then fails (a missing template, an unsupported corner) hands over to the next one, and the
program's ``notes`` say so; naming a family (``family="rowwise"``) turns that into an error.

>>> from napkin.diagrams import library
>>> p = lower(library.get("softmax"), sizes={"r": 8, "x": 1000}, gpu="h100")
>>> p.family, len(p.launches), p.launches[0].block[0] % 32
('rowwise', 1, 0)
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping

from ..diagrams.axes import NAME_RE
from ..diagrams.diagram import Diagram
from ..errors import CodegenError, DiagramError, NapkinError, ScheduleError
from ..perfmodel.schedule import Schedule
from .plan import Buffer, KernelLaunch, Program

__all__ = ["lower", "prepare", "resolve_gpu", "choose_family", "check_program", "unbound_axes",
           "SMEM_TOLERANCE", "REG_BAND"]

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: How far the cost model's memory may be from a family's own footprint before it is ignored
#: (a factor either way: a unit mix-up, per warp against per block, is far outside it).
REG_BAND = 4.0
#: Shared-memory bytes of slack between a model's footprint and what ptxas reports.
SMEM_TOLERANCE = 256


def unbound_axes(diagram: Diagram) -> list[str]:
    return [n for n, a in diagram.axes.items() if not a.is_bound]


def prepare(diagram, *, sizes: Mapping[str, int] | None = None, dtype: str | None = None) -> Diagram:
    """A bound diagram in ``dtype``: a library name is looked up, ``sizes`` bound (axes whose size
    follows another axis, like ``x = q`` after a rename, are left to follow it)."""
    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    if not isinstance(diagram, Diagram):
        raise CodegenError(f"expected a Diagram or a library name, got {type(diagram).__name__}")
    if sizes:
        free = {}
        for n, s in dict(sizes).items():
            a = diagram.axes.get(n)
            if a is None:
                raise DiagramError(f"diagram {diagram.name!r} has no axis {n!r}; its axes are "
                                   f"{list(diagram.axes)}")
            follows = not a.is_bound and getattr(a.size, "name", n) != n
            if not follows:
                free[n] = s
        diagram = diagram.bind(free)
    if dtype is not None:
        diagram = diagram.with_dtype(dtype)
    passthrough = [n for n, v in zip(diagram.output_names, diagram.outputs) if v.is_input]
    if passthrough:
        raise CodegenError(f"diagram {diagram.name!r}: output(s) {', '.join(passthrough)} are inputs passed "
                           "through; generated code computes every output (drop them or apply a box)")
    missing = unbound_axes(diagram)
    if missing:
        raise CodegenError(f"diagram {diagram.name!r}: axes {', '.join(missing)} have no size; give them "
                           f"(sizes={{{', '.join(repr(m) + ': ...' for m in missing)}}})")
    return diagram


def resolve_gpu(gpu=None):
    """A GPU profile: the one given (object, name or profile path), else the GPU at hand, else h100."""
    from ..perfmodel.hardware import GPU, get_gpu, match_device_name

    if isinstance(gpu, GPU):
        return gpu
    if gpu is not None:
        return get_gpu(gpu)
    try:
        import sys

        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            if torch.cuda.is_available():
                return get_gpu(match_device_name(torch.cuda.get_device_name()))
    except NapkinError:
        pass
    except Exception:  # noqa: BLE001 - no device to ask
        pass
    return get_gpu("h100")


def _explain(fam, diagram) -> str | None:
    if hasattr(fam, "explain"):
        try:
            return fam.explain(diagram)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
    try:
        return None if fam.matches(diagram) else "it does not take this diagram"
    except Exception as e:  # noqa: BLE001
        return f"matches() failed: {type(e).__name__}: {e}"


def choose_family(diagram: Diagram, family=None) -> list:
    """The families to try for ``diagram``, in order (only ``family`` when one is named)."""
    from . import families

    if family is not None:
        fam = families.get(family)
        why = _explain(fam, diagram)
        if why is not None:
            raise CodegenError(f"family {fam.name} cannot generate diagram {diagram.name!r}: {why}")
        return [fam]
    out = []
    why: dict[str, str] = {}
    for fam in families.available():
        reason = _explain(fam, diagram)
        if reason is None:
            out.append(fam)
        else:
            why[fam.name] = reason
    if not out:
        errs = families.import_errors()
        # the last family (the fallback) takes any valid diagram: its reason is the one that matters
        last = next(reversed(why.items()), None)
        raise CodegenError(f"no code-generation family takes diagram {diagram.name!r}"
                           + (f": {last[0]}: {last[1]}" if last else "")
                           + (f" (families that failed to import: {', '.join(errs)})" if errs else ""))
    return out


def _fit_schedule(schedule: Schedule, diagram: Diagram) -> Schedule:
    if schedule.diagram == diagram:
        return schedule
    try:
        return schedule.replace(diagram=diagram)
    except ScheduleError as e:
        raise CodegenError(f"the schedule given does not fit diagram {diagram.name!r}: {e}") from None


def check_program(program: Program) -> Program:
    """Refuse a program whose launches name unknown tensors or are not launchable."""
    d = program.diagram
    known = set(d.input_names) | set(d.output_names) | {b.name for b in program.buffers}
    seen = set()
    for b in program.buffers:
        if not NAME_RE.match(b.name):
            raise CodegenError(f"buffer name {b.name!r} is not a checked identifier")
    for k in program.launches:
        if not _C_IDENT.match(k.name):
            raise CodegenError(f"kernel name {k.name!r} is not a C identifier")
        if k.name in seen:
            raise CodegenError(f"two launches are called {k.name!r}")
        seen.add(k.name)
        if re.search(rf"\b{re.escape(k.name)}\b", k.source) is None:
            raise CodegenError(f"launch {k.name}: its source does not define it")
        if k.threads > 1024 or k.threads < 1 or min(k.grid) < 1:
            raise CodegenError(f"launch {k.name}: grid {k.grid} block {k.block} cannot be launched")
        if k.grid[0] > 2 ** 31 - 1 or k.grid[1] > 65535 or k.grid[2] > 65535:
            raise CodegenError(f"launch {k.name}: grid {k.grid} is beyond CUDA's limits (x < 2^31, "
                               "y and z <= 65535)")
        for a in k.args:
            if a.kind in ("tensor", "tmap") and a.name not in known:
                raise CodegenError(f"launch {k.name}: argument {a.name!r} is neither an input, an output "
                                   "nor a buffer of the program")
            if a.kind not in ("tensor", "tmap", "int", "i64", "float"):
                raise CodegenError(f"launch {k.name}: argument {a.name!r} has unknown kind {a.kind!r}")
    return program


def _apply_model_footprint(program: Program, gpu) -> Program:
    """Take a launch's shared-memory budget from the cost model's M_SMEM (per block): where the
    family gave none, and, for families that opt in (``smem_from_cost = True``), where it agrees
    with the family's footprint within SMEM_TOLERANCE or a factor REG_BAND (else the family's is
    kept and the notes say why). Registers stay the family's budget (its kernel asks
    ptxas for it); the cost model's M_RF is given in the notes. Applied to one-kernel,
    one-launch programs, where the launch is the schedule's kernel."""
    if len(program.launches) != 1 or len(program.schedule.kernels) != 1:
        return program
    from .select import model_footprint

    feet = model_footprint(program.schedule, gpu)
    if not feet or len(feet) != 1:
        return program
    m = feet[0]
    k = program.launches[0]
    notes = list(program.notes)
    changes = {}
    from . import families

    try:
        opted_in = bool(getattr(families.get(program.family), "smem_from_cost", False))
    except NapkinError:
        opted_in = False
    if "SMEM" in m and k.model_smem_bytes is None:
        changes["model_smem_bytes"] = int(math.ceil(m["SMEM"]))
    elif "SMEM" in m and opted_in:
        smem = int(math.ceil(m["SMEM"]))
        fam = k.model_smem_bytes
        if (fam <= SMEM_TOLERANCE and smem <= SMEM_TOLERANCE) or (fam and 1 / REG_BAND <= smem / fam <= REG_BAND):
            changes["model_smem_bytes"] = smem
        else:
            notes.append(f"cost model M_SMEM={smem} B/block disagrees with the {program.family} footprint "
                         f"{fam} B; kept the footprint")
    if "RF_elements" in m:
        notes.append(f"cost model M_RF = {m['RF_elements']:.0f} values per block "
                     f"({m['RF_elements'] / max(1, k.threads):.1f} per thread); the register budget "
                     f"model_regs_per_thread = {k.model_regs_per_thread} is the {program.family} footprint")
    if changes:
        notes.append("model footprint from the cost model: " + ", ".join(f"{a}={b}" for a, b in changes.items()))
        k = dataclasses.replace(k, **changes)
    return dataclasses.replace(program, launches=(k,), notes=tuple(notes))


def lower(diagram, schedule: Schedule | None = None, *, gpu=None, dtype: str | None = None,
          sizes: Mapping[str, int] | None = None, family=None, arch: str | None = None) -> Program:
    """Lower ``diagram`` (bound by ``sizes``, cast to ``dtype``) to a Program for ``arch``
    (default: the GPU profile's). The schedule is ranked by the performance model unless given."""
    d = prepare(diagram, sizes=sizes, dtype=dtype)
    gpu_p = resolve_gpu(gpu)
    arch = arch or gpu_p.arch
    dt = dtype or next(iter(sorted(d.dtypes)), "bf16")
    from .select import choose_schedule

    notes: list[str] = []
    fams = choose_family(d, family)
    last: Exception | None = None
    for fam in fams:
        try:
            sched = _fit_schedule(schedule, d) if schedule is not None else choose_schedule(d, fam, gpu_p, dt, arch=arch)
            prog = fam.lower(d, sched, arch)
            if not isinstance(prog, Program):
                raise CodegenError(f"family {fam.name}: lower() returned {type(prog).__name__}, not a Program")
            prog = check_program(prog)
            prog = dataclasses.replace(prog, notes=tuple(notes) + tuple(prog.notes))
            return _apply_model_footprint(prog, gpu_p)
        except Exception as e:  # noqa: BLE001
            if family is not None:
                if isinstance(e, NapkinError):
                    raise
                raise CodegenError(f"family {fam.name} failed on {d.name!r}: {type(e).__name__}: {e}") from e
            notes.append(f"family {fam.name} failed ({type(e).__name__}: {e}); tried the next")
            last = e
    raise CodegenError(f"no family could lower {d.name!r}: " + "; ".join(notes)) from last


def buffers_bytes(program: Program) -> int:
    """Bytes of intermediate HBM buffers a program allocates."""
    from ..dtypes import dtype as lookup

    return sum(math.prod(b.shape) * lookup(b.dtype).bytes for b in program.buffers)


__all__ += ["buffers_bytes", "Buffer", "KernelLaunch"]
