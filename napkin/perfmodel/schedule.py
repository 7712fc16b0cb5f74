"""Schedules: how a diagram is run — which boxes fuse into one kernel, which axes are
tiled (grouped) or streamed at which memory level, and where every array lives.

A schedule is a plain immutable value, like a diagram. The performance model
costs it, the CPU interpreter runs it, codegen lowers it to CUDA, and rendering
colours the diagram with it.

- ``Relabel(axis, size, level, kind)``: ``kind="group"`` partitions ``axis`` into
  groups of ``size`` at ``level`` (tiling: one group per block or warp);
  ``kind="stream"`` walks ``axis`` in chunks of ``size`` inside a kernel, keeping an
  accumulator.
- ``Kernel``: a set of boxes fused into one kernel, its relabellings, and the level
  each array it touches lives at (inputs and outputs cross from HBM).
- ``Schedule``: the diagram, its kernels in order, the GPU and dtype it targets.

>>> from napkin.diagrams import library
>>> s = Schedule.fused(library.get("attention"), groups={"q": 128}, streams={"x": 64})
>>> [(r.axis, r.size, r.kind) for r in s.kernels[0].relabels]
[('q', 128, 'group'), ('x', 64, 'stream')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import sympy

from ..diagrams.diagram import Diagram
from ..errors import ScheduleError

LEVELS = ("HBM", "L2", "SMEM", "RF", "TC")


@dataclass(frozen=True)
class Relabel:
    """Group (tile) or stream one axis at one memory level."""

    axis: str
    size: int | sympy.Symbol
    level: str = "SMEM"
    kind: str = "group"

    def __post_init__(self):
        if self.kind not in ("group", "stream"):
            raise ScheduleError(f"relabel of axis {self.axis!r}: kind must be 'group' or 'stream', "
                                f"got {self.kind!r}")
        if self.level not in LEVELS:
            raise ScheduleError(f"relabel of axis {self.axis!r}: unknown level {self.level!r}; "
                                f"levels are {', '.join(LEVELS)}")
        if isinstance(self.size, int) and self.size <= 0:
            raise ScheduleError(f"{self.kind} of axis {self.axis!r}: size must be positive, got {self.size}")

    @property
    def symbol(self) -> str:
        """The paper's label for the relabelled axis: ``g_q`` or ``s_x``."""
        return f"{'g' if self.kind == 'group' else 's'}_{self.axis}"

    def __str__(self) -> str:
        return f"{self.axis} → {self.symbol}={self.size}@{self.level}"


@dataclass(frozen=True)
class Kernel:
    """Boxes fused into one kernel (named by the arrays they compute) and how it runs."""

    name: str
    boxes: tuple[str, ...]
    relabels: tuple[Relabel, ...] = ()
    placement: tuple[tuple[str, str], ...] = ()  # (array name, level) for arrays held below HBM

    @property
    def groups(self) -> tuple[Relabel, ...]:
        return tuple(r for r in self.relabels if r.kind == "group")

    @property
    def streams(self) -> tuple[Relabel, ...]:
        return tuple(r for r in self.relabels if r.kind == "stream")

    def level_of(self, array: str, default: str = "RF") -> str:
        """Where ``array`` lives inside this kernel."""
        return dict(self.placement).get(array, default)


@dataclass(frozen=True)
class Schedule:
    """A diagram split into kernels, with relabellings and levels, for one GPU and dtype."""

    diagram: Diagram
    kernels: tuple[Kernel, ...]
    gpu: str = "h100"
    dtype: str = "bf16"
    notes: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def fused(cls, diagram: Diagram, groups: Mapping[str, int] | None = None,
              streams: Mapping[str, int] | None = None, level: str = "SMEM", gpu: str = "h100",
              dtype: str = "bf16") -> "Schedule":
        """Every box in one kernel, with the given groups and streams at ``level``."""
        rel = [Relabel(a, s, level, "group") for a, s in (groups or {}).items()]
        rel += [Relabel(a, s, level, "stream") for a, s in (streams or {}).items()]
        boxes = tuple(diagram.name_of(v) for v in diagram.nodes)
        return cls(diagram, (Kernel("fused", boxes, tuple(rel)),), gpu, dtype)

    @classmethod
    def unfused(cls, diagram: Diagram, gpu: str = "h100", dtype: str = "bf16") -> "Schedule":
        """Every box its own kernel: each intermediate goes through HBM (the naive algorithm)."""
        ks = tuple(Kernel(diagram.name_of(v), (diagram.name_of(v),)) for v in diagram.nodes)
        return cls(diagram, ks, gpu, dtype)
