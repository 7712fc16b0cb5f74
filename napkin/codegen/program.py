"""Kernel plans: what lowering produces and the runtime launches.

Lowering a scheduled diagram gives a :class:`Program`: an ordered tuple of
:class:`KernelLaunch` (CUDA source, entry point, grid, block, shared memory and the
launch arguments by name) plus the intermediate buffers to allocate. A program is
a plain value that can be printed and written to a ``.cu`` file without a GPU.

A code-generation **family** (row-wise, tiled contraction, streamed attention,
fallback) implements :class:`Family`: it recognises the diagrams it can run fast,
proposes the tile configurations its template supports as schedules (the
performance model ranks them), and lowers one schedule to launches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from ..diagrams.diagram import Diagram
from ..errors import CodegenError
from ..perfmodel.schedule import Schedule


#: The most blocks a launch's grid.y (and grid.z) holds.
MAX_GRID_Y = 65535


def fold_grid(n: int) -> tuple[int, int]:
    """(grid.y, grid.z) of a launch whose blocks walk ``n`` items along grid.y (a batch, the heads
    of attention): ``(n, 1)`` up to :data:`MAX_GRID_Y`, else as few grid.z slices as hold them,
    grid.y as even as it goes. The kernel's item is ``blockIdx.y + gridDim.y * blockIdx.z`` (the
    order of ``n`` along grid.y alone), and the last slice's blocks past ``n`` return at once.

    >>> fold_grid(4096), fold_grid(65536), fold_grid(200000)
    ((4096, 1), (32768, 2), (50000, 4))
    """
    if not grid_folds(n):
        return n, 1
    z = -(-n // MAX_GRID_Y)
    return -(-n // z), z


def grid_folds(n: int) -> bool:
    """Whether ``n`` items run past grid.y into grid.z (:func:`fold_grid`): the kernel then reads
    its item from both and returns past ``n``."""
    return n > MAX_GRID_Y


@dataclass(frozen=True)
class Arg:
    """One launch argument: a tensor (by array name) or a scalar value."""

    kind: str  # "tensor", "tmap" (a TMA tensor map of a tensor), "int" (32-bit), "i64" or "float"
    name: str
    value: int | float | tuple[int, ...] | None = None  # a tensor map's box (inner, outer)
    dtype: str | None = None  # napkin dtype name of a tensor argument
    axes: tuple[str, ...] = ()  # axis names of a tensor argument, in memory order (contiguous)
    # a tensor map's dimensions as positions in ``axes``, innermost first (the first is the last
    # axis); empty: the packed view (the last axis, then every other flattened: tma.map_dims)
    view: tuple[int, ...] = ()

    def scalar(self):
        """The launch value of a scalar argument, typed as the kernel declares it: a 64-bit integer
        (``i64``), an ``int`` or a ``float``.

        >>> Arg("int", "M", value=7).scalar(), type(Arg("i64", "s", value=7).scalar()).__name__
        (7, 'int64')
        """
        if self.kind == "i64":
            import numpy

            return numpy.int64(self.value)
        if self.kind == "int":
            return int(self.value)
        return float(self.value)


@dataclass(frozen=True)
class KernelLaunch:
    """One generated kernel and how to launch it."""

    name: str  # CUDA entry point (extern "C")
    source: str  # CUDA C++ that includes "napkin.cuh"
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[Arg, ...]
    template: str  # template file it came from
    tunables: tuple[tuple[str, object], ...] = ()
    model_smem_bytes: int | None = None  # shared memory the performance model assumed
    model_regs_per_thread: int | None = None  # register budget the model assumed

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Buffer:
    """An intermediate array that lives in HBM between two kernels, or a family's workspace.

    ``zeroed``: a persistent workspace, zero-filled once when it is made and then kept (per
    device and CUDA stream) for every later call, not allocated per call. The kernels that use it
    must leave it zero when they finish: a split reduction's self-resetting arrival counters (the
    last block of a tile to arrive combines the partials and resets its counter), whose 32-bit
    words are zero bits in any dtype, so it saves a zeroing launch per call.

    >>> Buffer("arrivals", ("tile",), (8,), "fp32", zeroed=True).zeroed
    True
    """

    name: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    zeroed: bool = False


@dataclass(frozen=True)
class Program:
    """Every launch of a lowered diagram, in order, with its intermediates."""

    diagram: Diagram
    schedule: Schedule
    family: str
    launches: tuple[KernelLaunch, ...]
    buffers: tuple[Buffer, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # how lowering got here (families tried, model footprints used)
    plan: object = None  # the napkin.perfmodel.plan.Plan this program builds (None: one family's own)

    def source(self) -> str:
        """All kernels' source, concatenated (the device library still #included)."""
        return "\n\n".join(k.source for k in self.launches)


class Family(Protocol):
    """A code-generation family: recognise, propose tile configurations, lower.

    Optional hooks lowering and selection use when a family has them: ``explain(diagram)``
    (None when it takes the diagram, else why not) and ``launch_estimate(diagram, schedule,
    gpu)`` (a dict of ``blocks``, ``threads``, ``regs``, ``smem``, ``in_flight_bytes_per_thread``,
    ``idle_lanes`` for the launch a schedule stands for; see :mod:`napkin.codegen.select`), and
    ``options_read`` (the :class:`~napkin.perfmodel.schedule.KernelOptions` fields it reads;
    planning and lowering refuse a kernel that sets another (:func:`check_options`)).
    """

    name: str

    def matches(self, diagram: Diagram) -> bool:
        """True if this family can generate a kernel for the (bound) diagram."""

    def candidates(self, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
        """Schedules (tile configurations) its template supports for these sizes."""

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        """Generate the launches for one schedule."""


def check_options(family, kernel: str, options) -> None:
    """Refuses ``options`` (a :class:`~napkin.perfmodel.schedule.KernelOptions`) where they set a
    field ``family`` does not read: an option its template ignores would be silently dropped, so a
    hand-written schedule asking a contraction for ``row_in_smem`` is an error, not a no-op. A
    family without ``options_read`` (one registered from outside) is taken at its word.

    >>> from napkin.codegen import families
    >>> from napkin.perfmodel.schedule import KernelOptions
    >>> check_options(families.get("pointwise"), "k0", KernelOptions(warps=8, stages=4))
    >>> check_options(families.get("pointwise"), "k0", KernelOptions(warps=8, swap_ab=True))
    Traceback (most recent call last):
    ...
    napkin.errors.CodegenError: kernel k0: family pointwise does not read option swap_ab=True (it reads regs_per_thread, splits, stages, threads_per_row, warps)
    """
    read = getattr(family, "options_read", None)
    if read is None:
        return
    unread = {k: v for k, v in options.to_dict().items() if k not in read}
    if unread:
        given = ", ".join(f"{k}={v}" for k, v in unread.items())
        raise CodegenError(f"kernel {kernel}: family {family.name} does not read option{'s' if len(unread) > 1 else ''} "
                           f"{given} (it reads {', '.join(sorted(read))})")


#: the value of a KernelOptions field that means the family's default, which a plan may spell out
#: (a split count of 1 is no split)
NEUTRAL_OPTIONS = {"splits": 1, "cluster": 1, "persistent": False, "swap_ab": False, "streamed": False,
                   "row_in_smem": False}


def check_derived(family: str, kernel: str, options, derived) -> None:
    """Refuses the ``options`` a schedule gives where a field they set differs from ``derived``,
    the options of the configuration the family built from that schedule: a value the family does
    not follow (``warps=2`` on tiles that take 4 warps, a register budget the kernel is not built
    with) would otherwise be replaced without a word.

    >>> from napkin.perfmodel.schedule import KernelOptions
    >>> check_derived("contraction", "k0", KernelOptions(stages=3, splits=1), KernelOptions(stages=3, warps=4))
    >>> check_derived("contraction", "k0", KernelOptions(stages=3, warps=2), KernelOptions(stages=3, warps=4))
    Traceback (most recent call last):
    ...
    napkin.errors.CodegenError: kernel k0: the contraction family builds warps=4 from this schedule, not warps=2 (its tiles and engine decide it; leave an option out to take the family's)
    """
    want = derived.to_dict()
    wrong = {k: v for k, v in options.to_dict().items() if want.get(k, NEUTRAL_OPTIONS.get(k)) != v}
    if wrong:
        built = ", ".join(f"{k}={want[k]}" if k in want else f"no {k}" for k in wrong)
        given = ", ".join(f"{k}={v}" for k, v in wrong.items())
        raise CodegenError(f"kernel {kernel}: the {family} family builds {built} from this schedule, not {given} "
                           f"(its tiles and engine decide {'them' if len(wrong) > 1 else 'it'}; leave an option out to take "
                           "the family's)")
