"""Schedules: how a diagram is run — which boxes fuse into one kernel, which axes are
tiled (grouped) or streamed at which memory level, and where every array lives.

A schedule is a plain immutable value, like a diagram. The performance model
(:mod:`napkin.perfmodel.cost`) costs it, the CPU interpreter
(:mod:`napkin.perfmodel.interpreter`) runs it, codegen lowers it to CUDA, and
rendering colours the diagram with it.

- ``Relabel(axis, size, level, kind)``: ``kind="group"`` partitions ``axis`` into
  groups of ``size`` at ``level`` (tiling: one group per thread block at ``SMEM``, one
  per warp at ``RF``); ``kind="stream"`` walks ``axis`` in chunks of ``size`` inside a
  kernel, keeping an accumulator. A size of ``None`` stands for the paper's symbol
  (``g_q``, ``s_x``; ``w_q`` for a per-warp RF group).
- ``Kernel``: boxes fused into one kernel (named by the arrays they compute,
  ``diagram.name_of(v)``), its relabellings, and placement overrides (the level each
  array it touches lives at; by default kernel inputs and outputs at SMEM,
  intermediates in registers).
- ``Schedule``: the diagram, its kernels in order, the GPU and dtype it targets.

Kernel semantics (shared by the cost model and the interpreter): a kernel's *inputs*
are the arrays its boxes read that are computed elsewhere (diagram inputs or earlier
kernels); its *outputs* are the arrays it computes that are diagram outputs or are read
by a later kernel. Inputs and outputs cross HBM; everything else stays on chip.
Renames are free views: they never move data.

>>> from napkin.diagrams import library
>>> s = Schedule.fused(library.get("attention"), groups={"q": 128}, streams={"x": 64})
>>> [(r.axis, r.size, r.kind) for r in s.kernels[0].relabels]
[('q', 128, 'group'), ('x', 64, 'stream')]
>>> [k.boxes for k in Schedule.unfused(library.get("attention")).kernels]
[('S', 'S_scaled'), ('P',), ('O',)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import sympy

from ..diagrams.diagram import Diagram
from ..errors import ScheduleError

LEVELS = ("HBM", "L2", "SMEM", "RF", "TC")

#: Levels a relabelling may name: SMEM (one group per thread block) and RF (per warp).
RELABEL_LEVELS = ("SMEM", "RF")

#: Levels an array may be placed at inside a kernel.
PLACEMENT_LEVELS = ("SMEM", "RF")
#: Families whose group tiles always compute whole (tensor-core tiles on zero-filled operands): the
#: model costs an axis they tile padded to a multiple of the tile (:meth:`Schedule.padded_view`).
WHOLE_TILE_FAMILIES = ("contraction", "attention")


def tile_symbol(name: str) -> sympy.Symbol:
    """The positive-integer sympy symbol of a tile size (``g_q``, ``s_x``, ``w_q``)."""
    return sympy.Symbol(name, integer=True, positive=True)


def _prefix(kind: str, level: str) -> str:
    if level == "RF":
        return "w" if kind == "group" else "t"
    return "g" if kind == "group" else "s"


@dataclass(frozen=True)
class Relabel:
    """Group (tile) or stream one axis at one memory level.

    ``size`` is a positive int, a sympy expression, or ``None`` for the paper's symbol
    (:attr:`symbol`: ``g_q`` for an SMEM group, ``s_x`` for a stream, ``w_q`` for an RF group).
    """

    axis: str
    size: int | sympy.Expr | None = None
    level: str = "SMEM"
    kind: str = "group"

    def __post_init__(self):
        if self.kind not in ("group", "stream"):
            raise ScheduleError(f"relabel of axis {self.axis!r}: kind must be 'group' or 'stream', "
                                f"got {self.kind!r}")
        if self.level not in LEVELS:
            raise ScheduleError(f"relabel of axis {self.axis!r}: unknown level {self.level!r}; "
                                f"levels are {', '.join(LEVELS)}")
        size = self.size
        if size is None:
            size = tile_symbol(self.symbol)
        elif isinstance(size, bool):
            raise ScheduleError(f"{self.kind} of axis {self.axis!r}: size {size!r} is not an integer")
        elif isinstance(size, sympy.Basic):
            if isinstance(size, sympy.Integer):
                size = int(size)
        elif hasattr(size, "__index__"):
            size = int(size)
        else:
            raise ScheduleError(f"{self.kind} of axis {self.axis!r}: size {size!r} is not an integer "
                                "or a symbol")
        if isinstance(size, int) and size <= 0:
            raise ScheduleError(f"{self.kind} of axis {self.axis!r}: size must be positive, got {size}")
        object.__setattr__(self, "size", size)

    @property
    def symbol(self) -> str:
        """The paper's label for the relabelled axis: ``g_q`` or ``s_x`` (``w_q`` per warp)."""
        return f"{_prefix(self.kind, self.level)}_{self.axis}"

    @property
    def is_symbolic(self) -> bool:
        return not isinstance(self.size, int)

    def __str__(self) -> str:
        return f"{self.axis} → {self.symbol}={self.size}@{self.level}"


#: Instruction paths a kernel may name (``KernelOptions.engine``).
ENGINES = ("wgmma", "mma.sync", "simt", "scalar")


#: KernelOptions fields that are flags (True or False), not counts.
_FLAG_OPTIONS = ("persistent", "swap_ab", "streamed", "row_in_smem")


@dataclass(frozen=True)
class KernelOptions:
    """How one kernel runs beyond its tiles: the launch facts a family's template is built with.

    Every field is optional (``None``: the family's default). Relabellings say the tiles and
    streams per level; these say the rest, as typed fields (never note strings):

    - ``engine``: the tensor-core or core instruction path (:data:`ENGINES`);
    - ``stages``: pipeline depth (cp.async stages, or slots of a TMA ring; the pointwise
      family's vector loads a thread issues before it uses the first);
    - ``warps``: warps per block; ``warpgroups``: consumer warpgroups (wgmma);
    - ``threads_per_row``: threads sharing one row (row-wise kernels), or one reduced element
      (pointwise reductions);
    - ``blocks_per_sm``: residency the register budget is sized for;
    - ``regs_per_thread``: the register budget the kernel is compiled with;
    - ``splits``: blocks that share one reduced element (a split reduction: fp32 partials in HBM
      and a second, combining launch);
    - ``persistent``: True where the kernel's blocks stay on their SMs and walk its tiles (one
      block an SM) instead of one tile a block;
    - ``swap_ab``: True where a contraction's operands trade places on the tensor cores: the
      tile's rows are the output's last axis and its few columns the output's rows (a product
      of a few vectors by a matrix puts the matrix on the wgmma's 64 rows, the vectors on its
      N of 8 to 64), and the tile leaves transposed;
    - ``streamed``: True where a row-wise kernel reads its row again in every pass (``stages``
      chunks a thread in flight) instead of holding it in registers: a row too long for them;
    - ``row_in_smem``: True where such a streamed row keeps the inputs its later passes read
      again in shared memory, copied there before its first pass (HBM reads each row once);
    - ``cluster``: blocks of a thread-block cluster (Hopper) that share one such row, each
      keeping its part (``threads_per_row`` then counts the threads of all of them).

    >>> KernelOptions(engine="wgmma", stages=4).to_dict()
    {'engine': 'wgmma', 'stages': 4}
    """

    engine: str | None = None
    stages: int | None = None
    warps: int | None = None
    warpgroups: int | None = None
    threads_per_row: int | None = None
    blocks_per_sm: int | None = None
    regs_per_thread: int | None = None
    splits: int | None = None
    persistent: bool | None = None
    swap_ab: bool | None = None
    streamed: bool | None = None
    row_in_smem: bool | None = None
    cluster: int | None = None

    def __post_init__(self):
        if self.engine is not None and self.engine not in ENGINES:
            raise ScheduleError(f"unknown engine {self.engine!r}; engines are {', '.join(ENGINES)}")
        for name in _FLAG_OPTIONS:
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ScheduleError(f"kernel option {name} must be True or False, got {v!r}")
        for f in dataclasses.fields(self):
            if f.name == "engine" or f.name in _FLAG_OPTIONS:
                continue
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not hasattr(v, "__index__") or int(v) < 1:
                raise ScheduleError(f"kernel option {f.name} must be a positive integer, got {v!r}")
            object.__setattr__(self, f.name, int(v))

    def to_dict(self) -> dict:
        """The fields that are set (a stable, JSON-able form)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: Mapping) -> "KernelOptions":
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ScheduleError(f"unknown kernel option(s) {', '.join(extra)}; options are {', '.join(sorted(known))}")
        return cls(**dict(data))

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_dict().items())

    @staticmethod
    def value_of(name: str, text: str):
        """One option's value from its text in :meth:`__str__` (a recorded description's):
        the engine's name as it is, a flag from ``True`` or ``False``, a count from its digits.

        >>> KernelOptions.value_of("persistent", "True"), KernelOptions.value_of("stages", "4")
        (True, 4)
        """
        if name == "engine":
            return text
        if name in _FLAG_OPTIONS:
            if text not in ("True", "False"):
                raise ScheduleError(f"kernel option {name} must be True or False, got {text!r}")
            return text == "True"
        try:
            return int(text)
        except ValueError:
            raise ScheduleError(f"kernel option {name} must be a positive integer, got {text!r}") from None


@dataclass(frozen=True)
class Kernel:
    """Boxes fused into one kernel (named by the arrays they compute) and how it runs.

    ``family`` names the code-generation family that builds it (None: not planned yet) and
    ``options`` its typed launch options (:class:`KernelOptions`).
    """

    name: str
    boxes: tuple[str, ...]
    relabels: tuple[Relabel, ...] = ()
    placement: tuple[tuple[str, str], ...] = ()  # (array name, level) overrides
    family: str | None = None
    options: KernelOptions = KernelOptions()

    def __post_init__(self):
        if not isinstance(self.options, KernelOptions):
            raise ScheduleError(f"kernel {self.name!r}: options must be KernelOptions, got {self.options!r}")
        object.__setattr__(self, "boxes", tuple(self.boxes))
        object.__setattr__(self, "relabels", tuple(self.relabels))
        if isinstance(self.placement, Mapping):
            object.__setattr__(self, "placement", tuple(self.placement.items()))
        else:
            object.__setattr__(self, "placement", tuple(tuple(p) for p in self.placement))
        for r in self.relabels:
            if not isinstance(r, Relabel):
                raise ScheduleError(f"kernel {self.name!r}: relabels must be Relabel values, got {r!r}")
        for arr, lvl in self.placement:
            if lvl not in PLACEMENT_LEVELS:
                raise ScheduleError(f"kernel {self.name!r}: array {arr!r} cannot be placed at {lvl!r}; "
                                    f"arrays inside a kernel live at {' or '.join(PLACEMENT_LEVELS)}")

    @property
    def groups(self) -> tuple[Relabel, ...]:
        """Every group relabelling (any level)."""
        return tuple(r for r in self.relabels if r.kind == "group")

    @property
    def streams(self) -> tuple[Relabel, ...]:
        """Every stream relabelling (any level)."""
        return tuple(r for r in self.relabels if r.kind == "stream")

    def relabels_at(self, level: str, kind: str | None = None) -> tuple[Relabel, ...]:
        """The relabellings at ``level`` (of ``kind`` if given)."""
        return tuple(r for r in self.relabels if r.level == level and (kind is None or r.kind == kind))

    def level_of(self, array: str, default: str = "RF") -> str:
        """Where ``array`` lives inside this kernel (placement override, else ``default``)."""
        return dict(self.placement).get(array, default)

    def replace(self, **changes) -> Kernel:
        """A copy with some fields changed (``relabels=...``, ``placement=...``)."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        rel = ", ".join(str(r) for r in self.relabels) or "no relabels"
        fam = f" {self.family}" if self.family else ""
        opts = f" ({self.options})" if self.options.to_dict() else ""
        return f"kernel {self.name}{fam}: {' '.join(self.boxes)} [{rel}]{opts}"


def _parse_relabel_spec(spec: Mapping | None, kind: str, default_level: str) -> list[Relabel]:
    """``{"q": 128}``, ``{"q": None}``, ``{"q": (128, "SMEM")}`` or ``{"q": [(128, "SMEM"), (16, "RF")]}``."""
    out: list[Relabel] = []
    for axis, value in (spec or {}).items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ScheduleError(f"{kind} of axis {axis!r}: expected (size, level), got {item!r}")
                size, level = item
            else:
                size, level = item, default_level
            out.append(Relabel(axis, size, level, kind))
    return out


@dataclass(frozen=True)
class Schedule:
    """A diagram split into kernels, with relabellings and levels, for one GPU and dtype.

    ``gpu`` names the target (the cost model uses it when no GPU is passed; ``None`` means
    no hardware); ``dtype`` is the compute dtype codegen targets (the cost model counts
    bytes with each array's own dtype).
    """

    diagram: Diagram
    kernels: tuple[Kernel, ...]
    gpu: str | None = "h100"
    dtype: str = "bf16"
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not isinstance(self.diagram, Diagram):
            raise ScheduleError(f"a schedule needs a Diagram, got {type(self.diagram).__name__}")
        if not self.kernels:
            raise ScheduleError(f"schedule of {self.diagram.name!r} has no kernels")
        known = {self.diagram.name_of(v) for v in self.diagram.nodes}
        seen: dict[str, str] = {}
        names = set()
        for k in self.kernels:
            if not isinstance(k, Kernel):
                raise ScheduleError(f"schedule kernels must be Kernel values, got {k!r}")
            if k.name in names:
                raise ScheduleError(f"two kernels are called {k.name!r}; kernel names must be unique")
            names.add(k.name)
            if not k.boxes:
                raise ScheduleError(f"kernel {k.name!r} has no boxes")
            for b in k.boxes:
                if b not in known:
                    raise ScheduleError(
                        f"kernel {k.name!r}: diagram {self.diagram.name!r} has no box {b!r}; its boxes are "
                        f"{', '.join(self.diagram.name_of(v) for v in self.diagram.nodes)}")
                if b in seen:
                    raise ScheduleError(f"box {b!r} is in two kernels ({seen[b]!r} and {k.name!r})")
                seen[b] = k.name
        missing = [b for b in (self.diagram.name_of(v) for v in self.diagram.nodes) if b not in seen]
        if missing:
            raise ScheduleError(f"schedule of {self.diagram.name!r} runs no kernel for box(es) "
                                f"{', '.join(missing)}; every box must be in one kernel")

    # ------------------------------------------------------------------ builders
    @classmethod
    def fused(cls, diagram: Diagram, groups: Mapping | None = None, streams: Mapping | None = None,
              level: str = "SMEM", gpu: str | None = "h100", dtype: str | None = None,
              rf_groups: Mapping | None = None, placement: Mapping | None = None) -> Schedule:
        """Every box in one kernel, with the given groups and streams at ``level``.

        Sizes may be ints, ``None`` (the symbols ``g_q``/``s_x``) or ``(size, level)`` pairs;
        ``rf_groups`` adds per-warp groups at RF (``{"q": 16}``).
        """
        rel = _parse_relabel_spec(groups, "group", level)
        rel += _parse_relabel_spec(rf_groups, "group", "RF")
        rel += _parse_relabel_spec(streams, "stream", level)
        boxes = tuple(diagram.name_of(v) for v in diagram.nodes)
        return cls(diagram, (Kernel("fused", boxes, tuple(rel), tuple((placement or {}).items())),),
                   gpu, dtype or _diagram_dtype(diagram))

    @classmethod
    def unfused(cls, diagram: Diagram, groups: Mapping | None = None, streams: Mapping | None = None,
                gpu: str | None = "h100", dtype: str | None = None, level: str = "SMEM",
                rf_groups: Mapping | None = None) -> Schedule:
        """The naive algorithm: every non-elementwise box its own kernel, each intermediate
        through HBM; elementwise maps (and renames) fuse into the kernel of their producer
        (an epilogue). Unfused attention has kernels S (with the scale), P, O.

        ``groups``/``streams`` apply to every kernel where they are legal (an axis the
        kernel touches, grouped only where no box contracts or normalises it, streamed only
        where an accumulator exists); elsewhere they are dropped.
        """
        kernels = _unfused_kernels(diagram)
        sched = cls(diagram, tuple(kernels), gpu, dtype or _diagram_dtype(diagram))
        rel = _parse_relabel_spec(groups, "group", level)
        rel += _parse_relabel_spec(rf_groups, "group", "RF")
        rel += _parse_relabel_spec(streams, "stream", level)
        return sched._with_legal_relabels(rel) if rel else sched

    @classmethod
    def from_spec(cls, diagram: Diagram, groups: Mapping | None = None, streams: Mapping | None = None,
                  fuse: str = "all", *, rf_groups: Mapping | None = None, placement: Mapping | None = None,
                  gpu: str | None = "h100", dtype: str | None = None) -> Schedule:
        """A schedule from a compact spec.

        ``groups={"q": 128}`` or ``{"q": (128, "SMEM")}`` or ``{"q": [(128, "SMEM"), (16, "RF")]}``;
        ``streams={"x": 64}``; ``None`` sizes are symbols. ``fuse="all"`` puts every box in one
        kernel (relabels must all be legal there); ``fuse="none"`` is :meth:`unfused` (relabels
        applied where legal).
        """
        if fuse == "all":
            return cls.fused(diagram, groups, streams, gpu=gpu, dtype=dtype, rf_groups=rf_groups,
                             placement=placement)
        if fuse == "none":
            s = cls.unfused(diagram, groups, streams, gpu=gpu, dtype=dtype, rf_groups=rf_groups)
            if placement:
                s = s.replace(kernels=tuple(
                    k.replace(placement=tuple((a, l) for a, l in placement.items() if a in _touched(s, k)))
                    for k in s.kernels))
            return s
        raise ScheduleError(f"fuse must be 'all' or 'none', got {fuse!r}")

    def _with_legal_relabels(self, relabels: Iterable[Relabel]) -> Schedule:
        from .legality import relabel_problem

        kernels = list(self.kernels)
        for r in relabels:
            for i, k in enumerate(kernels):
                candidate = k.replace(relabels=k.relabels + (r,))
                trial = dataclasses.replace(self, kernels=tuple(kernels[:i] + [candidate] + kernels[i + 1:]))
                if relabel_problem(trial, i, r) is None:
                    kernels[i] = candidate
        return dataclasses.replace(self, kernels=tuple(kernels))

    # ------------------------------------------------------------------ views and edits
    def replace(self, **changes) -> Schedule:
        """A copy with some fields changed (``kernels=...``, ``gpu=...``)."""
        return dataclasses.replace(self, **changes)

    def padded_view(self) -> Schedule:
        """The schedule as the model costs it: where a tile overhangs its axis (a 128-row tile on
        45 rows), the kernel runs one whole, partly idle tile, so the axis is costed padded to the
        tile (the model's own rule, a group no larger than its axis, then holds). The tensor-core
        families (:data:`WHOLE_TILE_FAMILIES`) also run the last of several tiles whole (a
        192-column tile twice over 256 columns computes 384): their group tiles pad the axis to a
        multiple of the tile, so a tile that wastes half its work is not ranked with one that fits.

        >>> from napkin.diagrams import library
        >>> s = Schedule.fused(library.get("matmul").bind(a=45, b=64, c=64), groups={"a": 128})
        >>> s.padded_view().diagram.sizes["a"]
        128
        >>> k = Schedule.fused(library.get("matmul").bind(a=64, b=64, c=256), groups={"c": 192}).kernels[0]
        >>> s = Schedule(library.get("matmul").bind(a=64, b=64, c=256), (k.replace(family="contraction"),))
        >>> s.padded_view().diagram.sizes["c"]
        384
        """
        d = self.diagram
        grow: dict[str, int] = {}
        for k in self.kernels:
            whole = k.family in WHOLE_TILE_FAMILIES
            for r in k.relabels:
                n = d.axes[r.axis].size if r.axis in d.axes else None
                if not (isinstance(r.size, int) and isinstance(n, int)):
                    continue
                if r.size > n:
                    grow[r.axis] = max(grow.get(r.axis, 0), r.size)
                elif whole and r.kind == "group" and n % r.size:
                    grow[r.axis] = max(grow.get(r.axis, 0), -(-n // r.size) * r.size)
        if not grow:
            return self
        try:
            return self.replace(diagram=d.bind(grow))
        except Exception:  # noqa: BLE001 - a diagram that cannot take the padded sizes: cost as given
            return self

    def clipped_view(self) -> Schedule:
        """The schedule as it runs over the real elements: a tile that overhangs its axis (a
        16-row tile on 5 rows, a 128-key chunk of 100 keys) holds only the axis, as a partial
        last tile holds only its real elements, and a warp tile at most its block's. What the CPU
        interpreter executes and counts (the cost model prices the whole tile:
        :meth:`padded_view`).

        >>> from napkin.diagrams import library
        >>> s = Schedule.fused(library.get("attention").bind(q=5, x=100, d=16), groups={"q": 16},
        ...                    streams={"x": 128}, rf_groups={"q": 16})
        >>> [(r.symbol, r.size) for r in s.clipped_view().kernels[0].relabels]
        [('g_q', 5), ('w_q', 5), ('s_x', 100)]
        """
        d = self.diagram
        kernels, changed = [], False
        for k in self.kernels:
            block: dict[str, int] = {}
            for r in k.relabels:
                n = d.axes[r.axis].size if r.axis in d.axes else None
                if r.level == "SMEM" and isinstance(r.size, int) and isinstance(n, int):
                    block[r.axis] = min(r.size, n)
            rels = []
            for r in k.relabels:
                n = d.axes[r.axis].size if r.axis in d.axes else None
                cap = block.get(r.axis, n) if r.level == "RF" else n
                if isinstance(r.size, int) and isinstance(cap, int) and r.size > cap:
                    rels.append(dataclasses.replace(r, size=cap))
                    changed = True
                else:
                    rels.append(r)
            kernels.append(k.replace(relabels=tuple(rels)))
        return self.replace(kernels=tuple(kernels)) if changed else self

    def kernel(self, name: str) -> Kernel:
        """The kernel called ``name``."""
        for k in self.kernels:
            if k.name == name:
                return k
        raise ScheduleError(f"schedule has no kernel {name!r}; kernels: {', '.join(k.name for k in self.kernels)}")

    def kernel_of(self, box: str) -> Kernel:
        """The kernel that runs box ``box``."""
        for k in self.kernels:
            if box in k.boxes:
                return k
        raise ScheduleError(f"no kernel runs box {box!r}")

    @property
    def tile_symbols(self) -> dict[str, sympy.Expr]:
        """Symbolic tile sizes by name (``g_q`` → the symbol)."""
        out = {}
        for k in self.kernels:
            for r in k.relabels:
                for s in getattr(r.size, "free_symbols", ()):
                    out[s.name] = s
        return out

    def bind(self, sizes: Mapping[str, int] | None = None, /, **more) -> Schedule:
        """Give axis sizes (``q=4096``) and symbolic tile sizes (``g_q=128``) values."""
        all_sizes = {**(sizes or {}), **more}
        if not all_sizes:
            return self
        axis_sizes, tiles = {}, {}
        tile_names = self.tile_symbols
        for k, v in all_sizes.items():
            if k in tile_names:
                tiles[k] = v
            elif k in self.diagram.axes:
                if not self.diagram.axes[k].is_bound:
                    # an axis whose size is another axis's symbol (x = q after a rename) follows it
                    sz = self.diagram.axes[k].size
                    if isinstance(sz, sympy.Symbol) and sz.name != k and sz.name in all_sizes:
                        continue
                    axis_sizes[k] = v
                elif self.diagram.axes[k].size != v:
                    axis_sizes[k] = v
            else:
                raise ScheduleError(
                    f"cannot bind {k!r}: it is neither an axis of {self.diagram.name!r} "
                    f"({', '.join(self.diagram.axes)}) nor a tile symbol of the schedule "
                    f"({', '.join(tile_names) or 'none'})")
        diagram = self.diagram.bind(axis_sizes) if axis_sizes else self.diagram
        if tiles:
            subs = {tile_names[k]: v for k, v in tiles.items()}
            kernels = tuple(k.replace(relabels=tuple(
                dataclasses.replace(r, size=sympy.sympify(r.size).subs(subs)) if r.is_symbolic else r
                for r in k.relabels)) for k in self.kernels)
        else:
            kernels = self.kernels
        return dataclasses.replace(self, diagram=diagram, kernels=kernels)

    def summary(self) -> str:
        plural = "s" if len(self.kernels) != 1 else ""
        lines = [f"schedule of {self.diagram.name} ({len(self.kernels)} kernel{plural}, gpu {self.gpu}, {self.dtype})"]
        for k in self.kernels:
            lines.append("  " + str(k))
            if k.placement:
                lines.append("    placement: " + ", ".join(f"{a}@{l}" for a, l in k.placement))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _diagram_dtype(diagram: Diagram) -> str:
    dts = sorted(diagram.dtypes)
    return dts[0] if len(dts) == 1 else "bf16"


def _touched(schedule: Schedule, kernel: Kernel) -> set[str]:
    d = schedule.diagram
    out = set(kernel.boxes)
    for v in d.nodes:
        if d.name_of(v) in kernel.boxes:
            out.update(d.name_of(a) for a in v.args)
    return out


def _unfused_kernels(diagram: Diagram) -> list[Kernel]:
    """Every non-map box its own kernel; maps and renames join the kernel of their latest producer."""
    kernels: list[list[str]] = []
    where: dict[int, int] = {}
    for v in diagram.nodes:
        name = diagram.name_of(v)
        if v.op.kind in ("map", "rename"):
            producers = [where[id(a)] for a in v.args if id(a) in where]
            if producers:
                k = max(producers)
                kernels[k].append(name)
                where[id(v)] = k
                continue
        kernels.append([name])
        where[id(v)] = len(kernels) - 1
    return [Kernel(boxes[0], tuple(boxes)) for boxes in kernels]
