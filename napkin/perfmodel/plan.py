"""The plan: what derive derives and what lowering builds (docs/architecture.md, "The plan").

A :class:`Plan` is an immutable value: the diagram partitioned into kernels (fused sub-diagrams,
in launch order), and for each kernel the code-generation family that builds it, its tiles and
streams per level (:class:`~napkin.perfmodel.schedule.Relabel`), its typed launch options
(:class:`~napkin.perfmodel.schedule.KernelOptions`) and the model's prediction. It is made by
:func:`napkin.codegen.planner.derive`; :func:`napkin.codegen.lower.lower` builds it and decides
nothing. It prints, serialises (:meth:`Plan.to_dict`, one JSON form shared by ``napkin derive
--json`` and ``napkin generate --json``) and reads back (:meth:`Plan.from_dict`).

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Kernel, KernelOptions, Relabel
>>> d = library.get("softmax").bind(r=8, x=1000)
>>> k = Kernel("P", ("P",), (Relabel("r", 1, "SMEM", "group"),), family="rowwise",
...            options=KernelOptions(threads_per_row=128))
>>> plan = Plan(d, "h100", "sm_90a", "bf16", (PlannedKernel(k, 2e-6, "HBM"),))
>>> plan.kernels[0].family, plan.to_dict()["kernels"][0]["options"]
('rowwise', {'threads_per_row': 128})
>>> Plan.from_dict(d, plan.to_dict()) == plan
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from ..diagrams.diagram import Diagram
from ..diagrams.expand import expand
from ..diagrams.fold import AxisFold, fold
from ..errors import DiagramError, ScheduleError
from .schedule import Kernel, KernelOptions, Relabel, Schedule

__all__ = ["Plan", "PlannedKernel", "FALLBACK", "describe_kernel", "tiles_text"]

#: The family name of the scalar last resort (one simple kernel per box).
FALLBACK = "fallback"


def tiles_text(kernel: Kernel, whole: str = "whole", axes: bool = True) -> str:
    """A kernel's tiles and streams, ``q→g_q=128, q→w_q=16@RF, x→s_x=64`` (SMEM unless named;
    ``axes=False``: the symbols alone, ``g_q=128, w_q=16@RF, s_x=64``)."""
    return ", ".join((f"{r.axis}→" if axes else "") + f"{r.symbol}={r.size}"
                     + ("" if r.level == "SMEM" else f"@{r.level}") for r in kernel.relabels) or whole


def describe_kernel(kernel: Kernel) -> str:
    """``family: tiles (options)``: one line for a kernel of a plan or a family's configuration."""
    opts = f" ({kernel.options})" if kernel.options.to_dict() else ""
    return f"{kernel.family}: {tiles_text(kernel)}{opts}"


@dataclass(frozen=True)
class PlannedKernel:
    """One kernel of a plan: the schedule kernel (boxes, tiles, family, options) and its prediction.

    ``seconds`` is the one prediction function's time for this kernel alone
    (:func:`napkin.codegen.select.predict_schedule`), ``bound`` what limits it, ``why`` a sentence
    on why the family and configuration were chosen (the runner-up, or why nothing faster runs it).
    """

    kernel: Kernel
    seconds: float
    bound: str = ""
    why: str = field(default="", compare=False)

    def __post_init__(self):
        if not isinstance(self.kernel, Kernel):
            raise ScheduleError(f"a planned kernel needs a Kernel, got {type(self.kernel).__name__}")
        if not self.kernel.family:
            raise ScheduleError(f"planned kernel {self.kernel.name!r} names no family")

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def family(self) -> str:
        return self.kernel.family

    @property
    def boxes(self) -> tuple[str, ...]:
        return self.kernel.boxes

    def describe(self) -> str:
        """``attention: q→g_q=128, x→s_x=64 (engine=mma.sync, stages=2)``."""
        return describe_kernel(self.kernel)

    def to_dict(self) -> dict:
        k = self.kernel
        return {
            "name": k.name, "family": k.family, "boxes": list(k.boxes),
            "tiles": [{"axis": r.axis, "kind": r.kind, "level": r.level, "size": int(r.size), "symbol": r.symbol}
                      for r in k.relabels],
            "options": k.options.to_dict(),
            "placement": [[a, lvl] for a, lvl in k.placement],
            "predicted_seconds": self.seconds, "bound": self.bound,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "PlannedKernel":
        try:
            rel = tuple(Relabel(t["axis"], int(t["size"]), t["level"], t["kind"]) for t in data.get("tiles", ()))
            k = Kernel(data["name"], tuple(data["boxes"]), rel, tuple(tuple(p) for p in data.get("placement", ())),
                       family=data["family"], options=KernelOptions.from_dict(data.get("options", {})))
            return cls(k, float(data["predicted_seconds"]), str(data.get("bound", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ScheduleError(f"a plan's kernel entry is malformed ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class Plan:
    """The diagram split into kernels, each with the family that builds it and how (see module doc).

    ``gpu`` is the profile key the plan was ranked on, ``arch`` the architecture it builds for,
    ``dtype`` the compute dtype. ``seconds`` is the predicted time of the whole plan: kernels run
    one after another, so it is the sum of theirs. ``expanded`` names the softmax and norm boxes of
    the source diagram that the plan runs as their primitive boxes
    (:func:`napkin.diagrams.expand.expand`); ``diagram`` is then the expanded diagram.
    ``folds`` lists the runs of axes the plan runs as one (:mod:`napkin.diagrams.fold`): the plan's
    ``diagram`` is then the folded one and ``source`` the diagram it was folded from, whose
    shapes a compiled diagram takes (:attr:`interface`; the bytes are the same).
    """

    diagram: Diagram
    gpu: str
    arch: str
    dtype: str
    kernels: tuple[PlannedKernel, ...]
    notes: tuple[str, ...] = field(default=(), compare=False)
    expanded: tuple[str, ...] = ()
    folds: tuple[AxisFold, ...] = ()
    source: Diagram | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "expanded", tuple(self.expanded))
        object.__setattr__(self, "folds", tuple(self.folds))
        if self.folds and self.source is None:
            raise ScheduleError(f"plan of {self.diagram.name!r}: folded axes {[f.axis for f in self.folds]} "
                                "need the diagram they were folded from (source=)")
        self.schedule  # noqa: B018 - validates: every box in exactly one kernel, names unique

    @property
    def interface(self) -> Diagram:
        """The diagram whose arrays a caller passes and gets: ``source`` where axes were folded,
        else ``diagram``."""
        return self.source if self.folds else self.diagram

    @property
    def schedule(self) -> Schedule:
        """The plan as a schedule of the whole diagram (for the cost model, interpreter, rendering)."""
        return Schedule(self.diagram, tuple(k.kernel for k in self.kernels), self.gpu, self.dtype)

    @property
    def seconds(self) -> float:
        return math.fsum(k.seconds for k in self.kernels)

    @property
    def families(self) -> tuple[str, ...]:
        """The family of every kernel, in launch order."""
        return tuple(k.family for k in self.kernels)

    @property
    def uses_fallback(self) -> bool:
        return FALLBACK in self.families

    def kernel(self, name: str) -> PlannedKernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise ScheduleError(f"plan has no kernel {name!r}; kernels: {', '.join(k.name for k in self.kernels)}")

    def to_dict(self) -> dict:
        """The plan as JSON-safe data (the ``plan`` member of ``napkin derive --json`` and
        ``napkin generate --json``)."""
        return {
            "diagram": self.diagram.name, "gpu": self.gpu, "arch": self.arch, "dtype": self.dtype,
            "sizes": {n: int(s) for n, s in self.interface.sizes.items()},  # the axes a caller binds
            "predicted_seconds": self.seconds,
            "kernels": [k.to_dict() for k in self.kernels],
            **({"expanded": list(self.expanded)} if self.expanded else {}),
            **({"folds": [f.to_dict() for f in self.folds]} if self.folds else {}),
        }

    @classmethod
    def from_dict(cls, diagram: Diagram, data: Mapping) -> "Plan":
        """Read a plan back for ``diagram`` (bound to the plan's sizes and dtype)."""
        try:
            sizes = {n: int(v) for n, v in dict(data.get("sizes", {})).items()}
            d = diagram.bind({n: v for n, v in sizes.items() if n in diagram.axes and not diagram.axes[n].is_bound})
            d = d.with_dtype(data["dtype"]) if d.dtypes != {data["dtype"]} else d
            expanded = tuple(str(n) for n in data.get("expanded", ()))
            if expanded:
                d = expand(d, expanded)
            folds = tuple(AxisFold.from_dict(f) for f in data.get("folds", ()))
            source, d = (d, fold(d, folds)) if folds else (None, d)
            kernels = tuple(PlannedKernel.from_dict(k) for k in data["kernels"])
            return cls(d, str(data["gpu"]), str(data["arch"]), str(data["dtype"]), kernels, expanded=expanded,
                       folds=folds, source=source)
        except DiagramError as e:
            raise ScheduleError(f"not a plan of {diagram.name!r}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise ScheduleError(f"not a plan of {diagram.name!r} ({type(e).__name__}: {e})") from None

    def summary(self) -> str:
        """One line per kernel: name, family, tiles and options, predicted time."""
        n = len(self.kernels)
        lines = [f"plan of {self.diagram.name} on {self.gpu} ({self.arch}, {self.dtype}): {n} kernel"
                 f"{'s' if n != 1 else ''}, {self.seconds * 1e6:.1f} µs predicted"]
        for f in self.folds:
            lines.append(f"  axes {', '.join(f.parts)} run as one axis {f.axis} ({' x '.join(map(str, f.sizes))})")
        for k in self.kernels:
            lines.append(f"  {k.name:<12} {k.seconds * 1e6:9.1f} µs  {k.describe()}  [{' '.join(k.boxes)}]")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
