"""Legality of schedules, and the per-kernel analysis the cost model and the interpreter share.

:func:`analyze` turns a :class:`~napkin.perfmodel.schedule.Schedule` into one
:class:`KernelPlan` per kernel — its HBM inputs and outputs, the phase of every array
with respect to the streamed axis, where each array lives, and the liveness interval
of every resident array — and refuses what the method forbids. :func:`check_schedule`
adds the hardware checks (divisibility for tensor cores and vector loads, capacity).
Every refusal is a :class:`~napkin.errors.ScheduleError` whose message names the axis,
the box and the reason.

The rules (FlashAttention on a Napkin, docs/architecture.md §4):

- **Grouping** axis ``a`` is legal only if every box of the kernel is woven over ``a``:
  no box contracts, reduces or normalises it (grouping ``d`` or ``x`` in attention, or
  ``b`` in a matmul, is refused). Boxes that do not carry ``a`` are recomputed per group.
- **Streaming** axis ``s`` needs an accumulator: contractions (sum) and reductions
  (sum/max/min/mean) over ``s`` are streamable; a softmax over ``s`` is streamable only
  when its output is consumed solely by contractions over ``s`` in the same kernel
  (online softmax: running max μ, running sum z, running output o, rescaled by
  exp(μ_old − μ_new)); a sum over ``s`` of ``exp(x − c)``, with ``c`` the max of ``x`` over ``s``
  (or ``zero_inf`` of it) in the same kernel, is streamable the same way (the sum is rescaled by
  exp(c_old − c_new); :class:`RescaledSum`), so the box ``x − c`` may read the running ``c``;
  layernorm/rmsnorm are not. Boxes woven over ``s`` keep
  streamability (the fusion theorem). A box that carries ``s`` may not read a value that
  is complete only after the stream ends (that would need a second pass). One streamed
  axis per kernel; streams live at SMEM (the block's loop).
- Groups and streams never exceed their axis; RF (per-warp) groups never exceed the
  block's tile.
- With a GPU: tensor-core mma shapes per dtype (m16n8k16 for fp16/bf16) on the axes a
  contraction maps to m, n, k; a warp (32) spans a streamed reduction axis; the block tile
  splits evenly into warp tiles; 16-byte vector access on the contiguous axis of every
  array crossing HBM (8 bf16 values) — all hard, combined per axis by LCM; 128-byte
  coalescing (64 bf16 values) is a soft preference reported as a warning. Axes held whole
  in an mma must be a multiple of the mma dimension (no remainder handling). Tiles over
  the per-block SMEM or register capacity are refused.

Phases (with stream axis ``s``): ``pre`` arrays do not depend on ``s`` (loaded or computed
once per group), ``chunk`` arrays carry ``s`` (one chunk per step), ``acc`` arrays are
accumulated over ``s`` (complete after the loop), ``online`` is a streamed softmax, ``running``
is ``zero_inf`` of a running max (recomputed every step, complete after the loop), and
``post`` arrays are computed after the loop from accumulators. Columns run pre boxes,
then body boxes (every step), then post boxes.

Liveness (memory M): kernel inputs without ``s`` are loaded when the group starts, inputs
with ``s`` at the start of every step, and stay until their last use (to the end of the
loop if a body box uses them); accumulators (and online-softmax state) are allocated
when the loop starts and live until their last use (to the end of the kernel if stored);
other arrays live from the box that computes them to their last use; a stored output
lives until it is written (the end of its step for chunks, the end of the kernel
otherwise). Renames are free views of their input.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
import sympy

from ..diagrams.ops import Value, shifted_exp
from ..dtypes import dtype as lookup_dtype
from ..errors import ScheduleError

# ``Schedule`` and ``Relabel`` in annotations are napkin.perfmodel.schedule's; they stay names
# only (no import, not even for type checking): schedule imports this module to check relabels,
# and the package has no import cycle (tests/test_layers.py).

#: Levels a relabelling may name (the same tuple as ``napkin.perfmodel.schedule.RELABEL_LEVELS``;
#: kept here so that this module imports neither the schedule nor the cost module, which both
#: import it).
RELABEL_LEVELS = ("SMEM", "RF")

__all__ = [
    "DEFAULT_MMA_SHAPES",
    "RELABEL_LEVELS",
    "column_memory",
    "peak_memory",
    "TENSOR_DTYPES",
    "KernelPlan",
    "Resident",
    "TileConstraint",
    "analyze",
    "check_schedule",
    "mma_mapping",
    "relabel_problem",
    "tile_constraints",
]

#: dtypes whose contractions run on tensor cores (fp32 runs on CUDA cores; tf32 must be asked for).
TENSOR_DTYPES = ("fp16", "bf16", "fp8", "tf32")

#: (m, n, k) of ``mma.sync`` per dtype, used when no GPU profile is given.
DEFAULT_MMA_SHAPES = {"fp16": (16, 8, 16), "bf16": (16, 8, 16), "tf32": (16, 8, 8), "fp8": (16, 8, 32)}

WARP_SIZE = 32
VECTOR_BYTES = 16
COALESCE_BYTES = 128


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Resident:
    """An array that occupies memory at ``level`` from column ``start`` to ``end`` (inclusive)."""

    key: str                     # array name (online-softmax state: "P.max", "P.sum")
    axes: tuple[str, ...]
    dtype: str
    level: str
    start: int
    end: int
    kind: str                    # "input", "value", "state"
    accumulator: bool = False    # output of a contraction or reduction (or online state)


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """One kernel of a schedule, analysed. Arrays are diagram values; ``name`` gives their names."""

    index: int
    kernel: object
    boxes: tuple[Value, ...]               # every box of the kernel, topological order
    inputs: tuple[Value, ...]              # loaded from HBM (a rename of an outside array loads the view)
    outputs: tuple[Value, ...]             # computed here and needed later (diagram outputs, later kernels)
    stores: tuple[Value, ...]              # what is written to HBM (outputs resolved through renames)
    groups: dict                           # SMEM groups: axis -> size
    stream: tuple | None                   # (axis, size) or None
    rf_groups: dict                        # RF (per-warp) groups: axis -> size
    sizes: dict                            # every axis the kernel touches -> its size
    phase: dict                            # id(array) -> pre | chunk | acc | online | running | post
    box_phase: dict                        # id(box) -> pre | body | post
    level: dict                            # id(array) -> SMEM | RF (inputs and computed arrays)
    root: dict                             # id(rename output computed here) -> the array it views
    online: dict                           # id(softmax) -> consumer contractions
    columns: tuple[Value, ...]             # non-rename boxes in execution order: pre, body, post
    n_pre: int
    n_body: int
    residents: tuple[Resident, ...]
    uses: dict                             # id(array) -> tuple of (column, box) reading it
    names: dict = field(repr=False)        # id(value) -> name
    computed: frozenset = frozenset()      # ids of arrays computed by non-rename boxes of this kernel
    #: further contracted axes walked one index at a time outside the stream's loop (a sum over
    #: (h, d) streams d and walks h): extent 1 in every tile, one loop of the stream per index
    outer_streams: tuple[str, ...] = ()
    #: id(sum over s) -> :class:`RescaledSum`: sums of exp(x − running max) rescaled as the max grows
    rescaled: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.name

    def name_of(self, v: Value) -> str:
        return self.names[id(v)]

    def resolve(self, v: Value) -> tuple[Value, bool]:
        """(the array ``v`` is stored as, True if it is computed in this kernel)."""
        r = self.root.get(id(v))
        if r is not None:
            return r, True
        return v, id(v) in self.computed

    @property
    def body_range(self) -> range:
        return range(self.n_pre, self.n_pre + self.n_body)

    @property
    def stream_axis(self) -> str | None:
        return self.stream[0] if self.stream else None

    def box_axes(self, b: Value) -> set[str]:
        """Every axis box ``b`` touches (its inputs' and its output's)."""
        out = set(b.axis_names)
        for a in b.args:
            out.update(a.axis_names)
        return out


def _outer_streams(streams: list[Relabel], boxes, kname: str) -> tuple[list[Relabel], tuple[str, ...]]:
    """(the kernel's one stream, the axes walked one index at a time around it).

    A kernel streams one axis: its loop. Several streams are one loop only when they are the
    axes of one sum: every box that carries a further streamed axis contracts it together with
    the main one, and the further ones are streamed in chunks of 1 (one index at a time, nested
    outside the main stream's chunks)."""
    if len(streams) <= 1:
        return streams, ()
    wider = [r for r in streams if not (_is_num(r.size) and int(r.size) == 1)]
    main = wider[0] if len(wider) == 1 else (streams[-1] if not wider else None)
    outer = [r for r in streams if r is not main]
    ok = main is not None
    for r in outer if ok else ():
        for b in boxes:
            if b.op.kind == "rename":  # a free view: the boxes reading it are checked
                continue
            if r.axis in b.axis_names or any(r.axis in a.axis_names for a in b.args):
                over = getattr(b.op, "over", None)
                over = tuple(over) if isinstance(over, (tuple, list)) else (over,)
                if b.op.kind != "contract" or r.axis not in over or main.axis not in over:
                    ok = False
    if not ok:
        raise ScheduleError(
            f"kernel {kname!r}: streams axes {', '.join(repr(r.axis) for r in streams)}; a kernel streams "
            "one axis (its loop) — stream one and group or keep the others whole (several streams are one "
            "loop only when one contraction sums over all of them and all but one stream chunks of 1)")
    return [main], tuple(r.axis for r in outer)


def _verb(b: Value, axis: str) -> str:
    op = b.op
    if op.kind == "contract":
        return f"contracts over {axis}"
    if op.kind == "reduce":
        return f"reduces over {axis} ({op.how})"
    if op.kind == "softmax":
        return f"normalises over {axis} (softmax)"
    if op.kind == "norm":
        return f"normalises over {axis} ({op.how})"
    return f"is defined on {axis}"


#: Maps linear in one argument: a per-row scale of that argument passes through them unchanged.
_SCALE_THROUGH = ("mul", "scale")


def _row_scale_factors_out(b: Value, s: str, d, in_kernel, out_ids, outputs) -> bool:
    """Whether rmsnorm box ``b`` over the streamed axis ``s`` reaches, inside the kernel and only
    through multiplications, contractions over ``s`` alone: Σ_s (x·r)·y = r·Σ_s x·y for the row
    scale r = 1/√(mean x² + eps), so the stream needs no whole row (RMSNorm → linear)."""
    if b.op.how != "rmsnorm":
        return False
    outs = out_ids | {id(v) for v in outputs}
    stack, seen = [b], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        cons = d.consumers.get(id(v), ())
        if id(v) in outs or not cons:
            return False
        for c in cons:
            if id(c) not in in_kernel or sum(1 for a in c.args if a is v) != 1:
                return False
            if c.op.kind == "contract" and s in c.op.over:
                continue
            others = [a for a in c.args if a is not v]
            if c.op.kind == "map" and c.op.fn in _SCALE_THROUGH and s in c.axis_names and \
                    not any(a.depends_on(b) for a in others):  # x·r times r again is not linear in r
                stack.append(c)
                continue
            return False
    return True


def _lone_softmax_reason(axis: str) -> str:
    return (f"softmax over {axis} needs the whole row before it can write any output; it becomes "
            f"streamable only when followed by a contraction over {axis}, which supplies the accumulator")


def _is_num(x) -> bool:
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_number)


#: analyze() results by schedule (a schedule is an immutable value; the entry goes when it does).
_PLANS: dict[int, tuple[weakref.ref, tuple[KernelPlan, ...]]] = {}


def _forget(key: int):
    def drop(_ref) -> None:
        _PLANS.pop(key, None)
    return drop


def analyze(schedule: Schedule) -> tuple[KernelPlan, ...]:
    """Analyse every kernel of ``schedule``; raise ScheduleError on anything illegal.

    The result is remembered for the life of the schedule object (schedules are immutable), so
    that checking, costing and predicting one schedule analyse it once."""
    key = id(schedule)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    plans = _analyze(schedule)
    try:
        _PLANS[key] = (weakref.ref(schedule, _forget(key)), plans)
    except TypeError:  # not weak-referenceable: no memo
        pass
    return plans


#: Per diagram (a few, most recent first): {boxes of every kernel: (kernel of each box, boxes of
#: each kernel in topological order)}. Relabel checks try many schedules with one partition.
_PARTITIONS: "OrderedDict[int, tuple[object, dict]]" = OrderedDict()


def _partition(schedule: Schedule) -> tuple[dict[int, int], list[list[Value]]]:
    d = schedule.diagram
    key = tuple(k.boxes for k in schedule.kernels)
    entry = _PARTITIONS.get(id(d))
    if entry is None or entry[0] is not d:
        entry = (d, {})
        _PARTITIONS[id(d)] = entry
        while len(_PARTITIONS) > 16:
            _PARTITIONS.popitem(last=False)
    else:
        _PARTITIONS.move_to_end(id(d))
    known = entry[1]
    hit = known.get(key)
    if hit is not None:
        return hit
    kernel_of_box: dict[int, int] = {}
    by_name = {d.name_of(v): v for v in d.nodes}
    for i, k in enumerate(schedule.kernels):
        for b in k.boxes:
            kernel_of_box[id(by_name[b])] = i
    boxes_of: list[list[Value]] = [[] for _ in schedule.kernels]
    for v in d.nodes:
        i = kernel_of_box.get(id(v))
        if i is not None:
            boxes_of[i].append(v)
    if len(known) >= 16:
        known.pop(next(iter(known)))
    known[key] = (kernel_of_box, boxes_of)
    return kernel_of_box, boxes_of


def _analyze(schedule: Schedule, only: int | None = None) -> tuple[KernelPlan, ...]:
    d = schedule.diagram
    names = d.names
    kernel_of_box, boxes_of = _partition(schedule)
    out_ids = {id(v) for v in d.outputs}
    plans = []
    for i, k in enumerate(schedule.kernels):
        if only is not None and i != only:
            continue
        boxes = tuple(boxes_of[i])
        for b in boxes:
            for a in b.args:
                _check_order(schedule, i, b, a, names, kernel_of_box)
        plans.append(_plan_kernel(schedule, i, boxes, names, kernel_of_box, out_ids))
    return tuple(plans)


def _check_order(schedule: Schedule, i: int, b: Value, a: Value, names: dict, kernel_of_box: dict) -> None:
    """Refuse box ``b`` of kernel ``i`` reading ``a`` before a kernel computes it.

    A rename is a free view of the storage of the array it views: reading it reads that array,
    so the read depends on the kernel that computes the array at the end of ``a``'s chain of
    views (none for a diagram input), not on the kernel the rename boxes sit in — a rename may
    sit in a later kernel than a reader of the view (the backward of transformer_block reads
    ``dVp``, a view of ``dV``, in ``dWv`` before the kernel holding the rename box)."""
    chain = _view_chain(a)
    j = kernel_of_box.get(id(chain[-1]))
    if j is None or j < i:
        return
    kname = schedule.kernels[i].name
    via = f" (a view of {names[id(chain[-1])]})" if len(chain) > 1 else ""
    if j > i:
        raise ScheduleError(
            f"kernel {kname!r}: box {names[id(b)]} reads {names[id(a)]}{via}, which kernel "
            f"{schedule.kernels[j].name!r} computes later; kernels run in order")
    # the viewed array is computed here: the kernel reads it through the views only when the
    # renames are here too (a view placed in another kernel would be loaded from HBM before
    # this kernel has written it)
    for v in chain[:-1]:
        m = kernel_of_box.get(id(v))
        if m != i:
            where = f"kernel {schedule.kernels[m].name!r}" if m is not None else "no kernel"
            raise ScheduleError(
                f"kernel {kname!r}: box {names[id(b)]} reads {names[id(a)]}{via}, which this kernel computes, "
                f"but the rename {names[id(v)]} sits in {where}; a view of an array computed in a kernel is "
                "read there only through renames in the same kernel")


def _view_chain(v: Value) -> list[Value]:
    """``v`` and the values down a chain of renames to the array it views (the last)."""
    out = [v]
    while out[-1].op.kind == "rename":
        out.append(out[-1].args[0])
    return out


def _plan_kernel(schedule: Schedule, index: int, boxes: tuple[Value, ...], names: dict,
                 kernel_of_box: dict, out_ids: set) -> KernelPlan:
    d = schedule.diagram
    k = schedule.kernels[index]
    kname = k.name
    in_kernel = {id(b) for b in boxes}
    computed = {id(b) for b in boxes if b.op.kind != "rename"}

    # ---- axes the kernel touches
    sizes: dict[str, object] = {}
    for b in boxes:
        for v in (b, *b.args):
            for ax in v.axes:
                sizes.setdefault(ax.name, ax.size)
    box_list = ", ".join(names[id(b)] for b in boxes)

    # ---- relabels
    groups: dict[str, object] = {}
    rf_groups: dict[str, object] = {}
    streams: list[Relabel] = []
    for r in k.relabels:
        where = f"kernel {kname!r}"
        if r.axis not in sizes:
            raise ScheduleError(
                f"{where}: cannot {r.kind} axis {r.axis!r}: no box of the kernel ({box_list}) carries it; "
                f"the kernel's axes are {', '.join(sizes)}")
        if r.level not in RELABEL_LEVELS:
            raise ScheduleError(
                f"{where}: cannot {r.kind} axis {r.axis!r} at {r.level}: relabels live at "
                f"{' or '.join(RELABEL_LEVELS)} (one group per thread block at SMEM, per warp at RF)")
        if r.kind == "stream":
            if r.level == "RF":
                raise ScheduleError(
                    f"{where}: cannot stream axis {r.axis!r} at RF: streams are the block's loop and live "
                    "at SMEM (per-warp streams are not modelled)")
            streams.append(r)
        else:
            target = groups if r.level == "SMEM" else rf_groups
            if r.axis in target:
                raise ScheduleError(f"{where}: axis {r.axis!r} is grouped twice at {r.level}")
            target[r.axis] = r.size
    streams, outer_streams = _outer_streams(streams, boxes, kname)
    stream = (streams[0].axis, streams[0].size) if streams else None
    s = stream[0] if stream else None
    if s is not None and s in groups:
        raise ScheduleError(f"kernel {kname!r}: axis {s!r} is both grouped and streamed at SMEM; "
                            "choose one")
    if s is not None and s in rf_groups:
        raise ScheduleError(f"kernel {kname!r}: axis {s!r} is streamed, so it cannot also be grouped per "
                            "warp at RF (warp tiles partition the block's grouped or whole axes)")

    for level_name, table in (("SMEM", groups), ("RF", rf_groups)):
        for a in table:
            for b in boxes:
                if a in b.op.own_axes():
                    raise ScheduleError(
                        f"cannot group axis {a!r} in kernel {kname!r}: box {names[id(b)]} {_verb(b, a)}; "
                        "a grouped axis must be one every box of the kernel is woven over")
    # sizes never exceed their axis
    for r in k.relabels:
        n = sizes[r.axis]
        if _is_num(n) and _is_num(r.size) and int(r.size) > int(n):
            what = "group" if r.kind == "group" else "stream chunk"
            raise ScheduleError(
                f"{r.kind} {r.symbol}={r.size} exceeds axis {r.axis!r} of size {n} (kernel {kname!r}): a {what} "
                "cannot be larger than its axis")
    for a, w in rf_groups.items():
        outer = groups.get(a, sizes[a])
        if _is_num(outer) and _is_num(w) and int(w) > int(outer):
            raise ScheduleError(
                f"kernel {kname!r}: RF group w_{a}={w} exceeds the block's tile of axis {a!r} ({outer}); "
                "a warp tile must fit inside the block tile")

    # ---- renames: free views; resolve to the array they view
    root: dict[int, Value] = {}
    for b in boxes:
        if b.op.kind != "rename":
            continue
        v = b
        while id(v) in in_kernel and v.op.kind == "rename":
            v = v.args[0]
        if id(v) in computed:
            root[id(b)] = v
            relabelled = set(groups) | set(rf_groups) | ({s} if s else set())
            touched = {x for pair in b.op.mapping for x in pair}
            bad = sorted(touched & relabelled)
            # a view read inside the kernel would need tiles of the other axis; one only stored is fine
            read_here = any(id(c) in in_kernel for c in _consumers_through_renames(d, b))
            if bad and read_here:
                raise ScheduleError(
                    f"kernel {kname!r}: box {names[id(b)]} renames {b.op.label()} inside the kernel, so axis "
                    f"{bad[0]!r} cannot be grouped or streamed here (the view would mix tiles of two axes)")

    def resolve(a: Value) -> tuple[Value, bool]:
        if id(a) in root:
            return root[id(a)], True
        return a, id(a) in computed

    # ---- inputs, outputs, stores
    inputs: list[Value] = []
    seen: set[int] = set()
    for b in boxes:
        if b.op.kind == "rename":
            continue
        for a in b.args:
            r, internal = resolve(a)
            if not internal and id(a) not in seen:
                seen.add(id(a))
                inputs.append(a)
    outputs: list[Value] = []
    for b in boxes:
        cons = d.consumers.get(id(b), ())
        if id(b) in out_ids or any(kernel_of_box.get(id(c), -1) > index for c in cons):
            outputs.append(b)
    stores: list[Value] = []
    stored: set[int] = set()
    for v in outputs:
        r, internal = resolve(v)
        if internal and id(r) not in stored:
            stored.add(id(r))
            stores.append(r)

    # ---- placement
    # the names along each chain of views the kernel reads, down to the array viewed (a kernel
    # that renames X reads X from HBM: a family places X)
    touched_names = ({names[id(v)] for v in (*boxes, *inputs)}
                     | {names[id(c)] for a in (*inputs, *(b for b in boxes if b.op.kind == "rename"))
                        for c in _view_chain(a)}
                     # a view of an array this kernel computes, stored under the view's name (an output)
                     | {names[id(v)] for v in d.nodes if v.op.kind == "rename" and id(_view_chain(v)[-1]) in computed})
    for arr, lvl in k.placement:
        if arr not in touched_names:
            raise ScheduleError(f"kernel {kname!r}: placement names array {arr!r}, which the kernel does not "
                                f"touch; its arrays are {', '.join(sorted(touched_names))}")
    place = dict(k.placement)
    level: dict[int, str] = {}
    for a in inputs:
        level[id(a)] = place.get(names[id(a)], place.get(names[id(_view_chain(a)[-1])], "SMEM"))
    for b in boxes:
        if id(b) in computed:
            level[id(b)] = place.get(names[id(b)], "SMEM" if id(b) in stored else "RF")
        elif id(b) in root:
            level[id(b)] = level.get(id(root[id(b)]), "RF")

    # ---- the sums of exp(x − max) over s beside the max over s (softmax statistics, logsumexp):
    # streamable with the sum rescaled when the running max grows
    rescaled = _online_pairs(boxes, s, d, in_kernel, {id(v) for v in outputs}) if s is not None else {}
    shifts = {id(r.shift_box): r for r in rescaled.values()}
    running = {id(r.shift): r for r in rescaled.values() if r.shift is not r.max}

    # ---- phases
    phase: dict[int, str] = {}
    for a in inputs:
        phase[id(a)] = "chunk" if (s is not None and s in a.axis_names) else "pre"

    def aphase(a: Value) -> str:
        r, internal = resolve(a)
        return phase[id(r)] if internal else phase[id(a)]

    for b in boxes:
        bname = names[id(b)]
        if b.op.kind == "rename":
            if id(b) in root:
                phase[id(b)] = phase[id(root[id(b)])]
                if phase[id(b)] == "online":
                    raise ScheduleError(
                        f"kernel {kname!r}: box {bname} renames the streamed softmax {names[id(root[id(b)])]}; "
                        f"{_lone_softmax_reason(s)}, read directly")
            else:  # a view of an array in HBM (read by a later kernel only): there from the start
                phase.setdefault(id(b), "pre")
            continue
        if s is None:
            phase[id(b)] = "pre"
            continue
        own = set(b.op.own_axes())
        aps = [(a, aphase(a)) for a in b.args]
        late = [a for a, p in aps if p in ("acc", "post", "running")]
        if id(b) in running:  # zero_inf of the running max, recomputed every step
            phase[id(b)] = "running"
            continue
        if id(b) in shifts:  # x − (running shift): the sum it feeds is rescaled as the max grows
            phase[id(b)] = "chunk"
            continue
        onl = [a for a, p in aps if p == "online"]
        if s in own:
            kind = b.op.kind
            if kind == "norm" and not _row_scale_factors_out(b, s, d, in_kernel, out_ids, outputs):
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} ({b.op.how} over {s}) needs the "
                    f"mean{' and variance' if b.op.how == 'layernorm' else ' square'} of the whole row before "
                    f"it can write any output; {b.op.how} over {s} has no accumulator and cannot be streamed")
            if late:
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} {_verb(b, s)} but reads "
                    f"{names[id(late[0])]}, which is complete only after the stream over {s} ends "
                    "(it would need a second pass)")
            if onl and kind != "contract":
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} reads the softmax "
                    f"{names[id(onl[0])]} but is not a contraction over {s}; {_lone_softmax_reason(s)}")
            if len(onl) > 1:
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} contracts two streamed "
                    f"softmaxes ({', '.join(names[id(a)] for a in onl)}); one online softmax per contraction")
            # an rmsnorm whose row scale factors out of a contraction over s passes its chunk on
            # unscaled (the kernel accumulates the mean square and scales the sum at the end)
            phase[id(b)] = "online" if kind == "softmax" else "chunk" if kind == "norm" else "acc"
        elif s in b.axis_names:
            if late:
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} carries {s} but reads "
                    f"{names[id(late[0])]}, which is complete only after the stream over {s} ends "
                    "(it would need a second pass)")
            if onl:
                raise ScheduleError(
                    f"cannot stream axis {s!r} in kernel {kname!r}: box {bname} reads the softmax "
                    f"{names[id(onl[0])]} but is not a contraction over {s}; {_lone_softmax_reason(s)}")
            phase[id(b)] = "chunk"
        else:
            phase[id(b)] = "post" if late else "pre"

    online: dict[int, tuple[Value, ...]] = {}
    for b in boxes:
        if phase.get(id(b)) != "online":
            continue
        bname = names[id(b)]
        cons = d.consumers.get(id(b), ())
        problem = None
        if id(b) in {id(v) for v in outputs}:
            problem = f"here {bname} is an output of the kernel"
        elif not cons:
            problem = f"here nothing reads {bname}"
        else:
            for c in cons:
                if id(c) not in in_kernel:
                    problem = f"here {names[id(c)]} reads it in another kernel"
                elif c.op.kind != "contract" or s not in c.op.over:
                    problem = f"here {names[id(c)]} reads it and is not a contraction over {s}"
                elif sum(1 for a in c.args if a is b) != 1:
                    problem = f"here {names[id(c)]} reads it more than once"
                elif set(c.op.over) & set(b.axis_names) != {s}:
                    extra = sorted((set(c.op.over) & set(b.axis_names)) - {s})
                    problem = (f"here {names[id(c)]} also contracts {bname} over {', '.join(extra)}, "
                               "so the rescaling by exp(μ_old − μ_new) cannot be applied")
                if problem:
                    break
        if problem:
            raise ScheduleError(
                f"cannot stream axis {s!r} in kernel {kname!r}: box {bname}: {_lone_softmax_reason(s)} ({problem})")
        online[id(b)] = tuple(cons)

    # ---- columns
    box_phase: dict[int, str] = {}
    for b in boxes:
        p = phase[id(b)]
        box_phase[id(b)] = "body" if p in ("chunk", "acc", "online", "running") else p
    real = [b for b in boxes if b.op.kind != "rename"]
    pre = [b for b in real if box_phase[id(b)] == "pre"]
    body = [b for b in real if box_phase[id(b)] == "body"]
    post = [b for b in real if box_phase[id(b)] == "post"]
    columns = tuple(pre + body + post)
    col = {id(b): i for i, b in enumerate(columns)}
    n_pre, n_body = len(pre), len(body)
    ncol = len(columns)
    first_body, last_body = n_pre, n_pre + n_body - 1

    uses: dict[int, list] = {}
    for b in columns:
        for a in dict.fromkeys(b.args):
            r, internal = resolve(a)
            key = id(r) if internal else id(a)
            uses.setdefault(key, []).append((col[id(b)], b))

    residents: list[Resident] = []

    def in_body(cols) -> bool:
        return any(first_body <= c <= last_body for c in cols) if n_body else False

    for a in inputs:
        ucols = [c for c, _ in uses.get(id(a), ())]
        if phase[id(a)] == "chunk":
            start, end = first_body, max(ucols)
        else:
            start, end = 0, max(ucols)
            if in_body(ucols):
                end = max(end, last_body)
        residents.append(Resident(names[id(a)], a.axis_names, a.dtype, level[id(a)], start, end, "input"))
    store_ids = {id(v) for v in stores}
    for b in columns:
        c = col[id(b)]
        ucols = [x for x, _ in uses.get(id(b), ())]
        p = phase[id(b)]
        is_store = id(b) in store_ids
        acc = b.op.kind in ("contract", "reduce") and bool(b.op.own_axes())
        if p in ("chunk", "online"):
            start, end = c, max(ucols + [c])
            if is_store:
                end = max(end, last_body)
        elif p in ("acc", "running"):
            start, end = first_body, max(ucols + [last_body])
            if is_store:
                end = ncol - 1
        else:
            start, end = c, max(ucols + [c])
            if p == "pre" and in_body(ucols):
                end = max(end, last_body)
            if is_store:
                end = ncol - 1
        residents.append(Resident(names[id(b)], b.axis_names, b.dtype, level[id(b)], start, end, "value", acc))
        if p == "online":
            row_axes = tuple(x for x in b.axis_names if x != s)
            for tag in ("max", "sum"):
                residents.append(Resident(f"{names[id(b)]}.{tag}", row_axes, b.dtype, level[id(b)],
                                          first_body, last_body, "state", True))

    return KernelPlan(
        index=index, kernel=k, boxes=boxes, inputs=tuple(inputs), outputs=tuple(outputs), stores=tuple(stores),
        groups=groups, stream=stream, outer_streams=outer_streams, rf_groups=rf_groups, sizes=sizes, phase=phase, box_phase=box_phase,
        level=level, root=root, online=online, columns=columns, n_pre=n_pre, n_body=n_body,
        residents=tuple(residents), uses={k2: tuple(v) for k2, v in uses.items()}, names=names,
        computed=frozenset(computed), rescaled=rescaled,
    )


@dataclass(frozen=True)
class RescaledSum:
    """A sum over the streamed axis ``s`` of ``exp(x − c)``, where ``c`` is the max of ``x`` over
    ``s`` (``max``) or ``zero_inf`` of it (``shift``; the max itself when ``exact``), computed in the
    same kernel: an online softmax's normaliser, or logsumexp's sum. Each step subtracts the running
    shift, and the sum so far is multiplied by exp(c_old − c_new) when the max grows, so one pass
    gives Σ exp(x − c_final). The shift uses 0 where an exact max is still ±inf (no NaN from
    −inf − (−inf)); an exact max that ends infinite makes the sum NaN, as the written-out boxes
    compute it (x − m is NaN for the values equal to it)."""

    sum: Value          # the reduction over s being rescaled
    max: Value          # the max over s
    shift: Value        # c: the max itself, or zero_inf(max)
    shift_box: Value    # x − c
    exact: bool


def _online_pairs(boxes, s: str, d, in_kernel: set, kernel_outputs: set) -> dict[int, "RescaledSum"]:
    """id(sum) -> :class:`RescaledSum` for the sums of the kernel that can be rescaled online.

    The pattern: ``m = max_s(...max(x))`` (a chain of max reductions ending over ``s``), ``c = m`` or
    ``zero_inf(m)``, ``d = x − c``, ``e = exp(d)``, then sums of ``e`` ending over ``s``; ``d``, ``e``
    and the sums before the last are read only by the next box and are no output of the kernel."""
    out: dict[int, RescaledSum] = {}

    def sole(v):
        cons = [c for c in d.consumers.get(id(v), ()) if id(c) in in_kernel]
        ok = id(v) not in kernel_outputs and len(d.consumers.get(id(v), ())) == 1 and len(cons) == 1
        return cons[0] if ok else None

    for e in boxes:
        found = shifted_exp(e)
        if found is None:
            continue
        x, c, m, exact = found
        sub = e.args[0]
        if (s not in sub.axis_names or m.op.over != s or sole(sub) is not e
                or not all(id(v) in in_kernel for v in (sub, c, m))):
            continue
        first = m
        while (id(first.args[0]) in in_kernel and first.args[0].op.kind == "reduce"
               and first.args[0].op.how == "max"):
            first = first.args[0]
        if first.args[0] is not x:
            continue
        t = sole(e)
        while t is not None and t.op.kind == "reduce" and t.op.how == "sum" and t.op.over != s:
            t = sole(t)
        if t is None or not (t.op.kind == "reduce" and t.op.how == "sum" and t.op.over == s):
            continue
        out[id(t)] = RescaledSum(t, m, c, sub, exact)
    return out


def column_memory(plan: KernelPlan, tile, bytes_per_value, levels=("SMEM", "RF"), zero=0) -> dict:
    """Per level, per column of ``plan``: ``(elements, bytes, {array: bytes})`` resident there.

    ``tile(axes)`` gives the elements of a resident array's tile (any arithmetic: ints or sympy),
    ``bytes_per_value(resident)`` its bytes per value. The liveness rules are the plan's
    (:class:`Resident` intervals); the cost model's M and the capacity check both read this.
    """
    ncol = len(plan.columns)
    out = {lv: [[zero, zero, {}] for _ in range(ncol)] for lv in levels}
    for r in plan.residents:
        cols = out.get(r.level)
        if cols is None:
            continue
        t = tile(r.axes)
        b = t * bytes_per_value(r)
        for c in range(max(0, r.start), min(ncol - 1, r.end) + 1):
            e = cols[c]
            e[0] = e[0] + t
            e[1] = e[1] + b
            e[2][r.key] = e[2].get(r.key, 0) + b
    return {lv: [tuple(e) for e in cols] for lv, cols in out.items()}


def peak_memory(plan: KernelPlan, accumulator_dtype: str | None = None,
                levels=("SMEM", "RF")) -> dict[str, tuple[int, dict]] | None:
    """Numeric M per block: ``{level: (bytes at the fullest column, {array: bytes} there)}``, or
    None when a size or tile of the kernel is symbolic. Tile extents: the group size of a grouped
    axis, the chunk of the streamed one, the whole axis otherwise (the cost model's M)."""
    ext: dict[str, int] = {}
    for a, n in plan.sizes.items():
        if a in plan.groups:
            n = plan.groups[a]
        elif plan.stream and plan.stream[0] == a:
            n = plan.stream[1]
        elif a in plan.outer_streams:
            n = 1
        if not _is_num(n):
            return None
        ext[a] = int(n)

    def tile(axes) -> int:
        t = 1
        for a in axes:
            t *= ext[a]
        return t

    def bpv(r: Resident) -> int:
        dt = accumulator_dtype if (accumulator_dtype and r.accumulator) else r.dtype
        return lookup_dtype(dt).bytes

    out = {}
    for lv, cols in column_memory(plan, tile, bpv, levels).items():
        if not cols:
            out[lv] = (0, {})
            continue
        i = max(range(len(cols)), key=lambda j: cols[j][1])
        out[lv] = (cols[i][1], cols[i][2])
    return out


def _consumers_through_renames(d, v) -> list:
    out, stack = [], [v]
    while stack:
        w = stack.pop()
        for c in d.consumers.get(id(w), ()):
            if c.op.kind == "rename":
                stack.append(c)
            else:
                out.append(c)
    return out


def relabel_problem(schedule: Schedule, kernel_index: int, relabel: Relabel) -> str | None:
    """Why ``relabel`` (already in kernel ``kernel_index``) makes ``schedule`` illegal, or None.

    A relabel changes one kernel, so only that kernel is analysed (the others are as legal as
    they were): adding relabels to every kernel of an N-kernel schedule costs O(N) analyses of
    one kernel, not O(N) analyses of the whole schedule."""
    try:
        _analyze(schedule, only=kernel_index)
    except ScheduleError as e:
        return str(e)
    return None


# ----------------------------------------------------------------------------- tensor cores


def mma_mapping(b: Value) -> dict[str, tuple[str, ...]] | None:
    """The axes a two-operand contraction maps to the mma's m, n and k sides (None if it cannot).

    m: output axes only the first operand carries; n: output axes only the second carries;
    k: the contracted axes; batch: output axes both carry (one mma each). The innermost axis of
    each side (last in the operand's order) carries the mma dimension.
    """
    if b.op.kind != "contract" or len(b.args) != 2 or not b.op.over:
        return None
    A, B = b.args
    if A is B:
        return None
    over = set(b.op.over)
    m = tuple(x for x in A.axis_names if x not in over and x not in B.axis_names)
    n = tuple(x for x in B.axis_names if x not in over and x not in A.axis_names)
    k = tuple(x for x in A.axis_names if x in over)
    if not (m and n and k):
        return None
    batch = tuple(x for x in b.axis_names if x in A.axis_names and x in B.axis_names)
    return {"m": m, "n": n, "k": k, "batch": batch}


def tensor_core_box(b: Value, gpu=None) -> tuple[dict, tuple[int, int, int]] | None:
    """(mma mapping, (m, n, k) shape) when box ``b`` runs on tensor cores, else None."""
    if b.dtype not in TENSOR_DTYPES:
        return None
    mapping = mma_mapping(b)
    if mapping is None:
        return None
    shapes = dict(DEFAULT_MMA_SHAPES)
    if gpu is not None and getattr(gpu, "mma_shapes", None):
        shapes.update({k2: tuple(v) for k2, v in gpu.mma_shapes.items()})
    shape = shapes.get(b.dtype)
    if shape is None:
        return None
    return mapping, tuple(shape)


# ----------------------------------------------------------------------------- constraints


@dataclass
class TileConstraint:
    """Divisibility required of one axis's tile in one kernel, with the reasons."""

    axis: str
    multiple: int = 1
    reasons: list[str] = field(default_factory=list)
    soft_multiple: int = 1
    soft_reasons: list[str] = field(default_factory=list)
    whole_multiple: int = 1              # required of the axis size when the axis is held whole
    whole_reasons: list[str] = field(default_factory=list)

    def require(self, m: int, reason: str) -> None:
        self.multiple = math.lcm(self.multiple, int(m))
        self.reasons.append(reason)

    def prefer(self, m: int, reason: str) -> None:
        self.soft_multiple = math.lcm(self.soft_multiple, int(m))
        self.soft_reasons.append(reason)

    def require_whole(self, m: int, reason: str) -> None:
        self.whole_multiple = math.lcm(self.whole_multiple, int(m))
        self.whole_reasons.append(reason)


def _kernel_constraints(plan: KernelPlan, gpu) -> dict[str, TileConstraint]:
    out: dict[str, TileConstraint] = {}

    def get(a: str) -> TileConstraint:
        return out.setdefault(a, TileConstraint(a))

    s = plan.stream_axis
    relabelled = set(plan.groups) | ({s} if s else set())
    for b in plan.columns:
        bname = plan.name_of(b)
        tc = tensor_core_box(b, gpu)
        if tc is not None:
            mapping, shape = tc
            dims = {"m": shape[0], "n": shape[1], "k": shape[2]}
            for side in ("m", "n", "k"):
                axis = mapping[side][-1]
                reason = (f"box {bname}: tensor-core mma m{shape[0]}n{shape[1]}k{shape[2]} ({b.dtype}) maps "
                          f"{axis} to {side}={dims[side]}")
                get(axis).require(dims[side], reason)
                get(axis).require_whole(dims[side], reason)
        if b.op.kind == "reduce" and s == b.op.over:
            get(s).require(WARP_SIZE, f"box {bname}: a warp ({WARP_SIZE} threads) spans {s} in the reduction "
                                      f"{b.op.how} over {s}")
    for a, w in plan.rf_groups.items():
        if _is_num(w):
            get(a).require(int(w), f"the block's tile of {a} splits evenly into warp tiles w_{a}={w}")
    for v in (*plan.inputs, *plan.stores):
        if not v.axes:
            continue
        axis = v.axis_names[-1]
        nbytes = lookup_dtype(v.dtype).bytes
        vec = max(1, VECTOR_BYTES // nbytes)
        coal = max(1, COALESCE_BYTES // nbytes)
        name = plan.name_of(v)
        if axis in relabelled:
            get(axis).require(vec, f"array {name}: 16-byte vector access on its contiguous axis {axis} "
                                   f"({vec} {v.dtype} values)")
        get(axis).prefer(coal, f"array {name}: 128-byte coalesced rows on its contiguous axis {axis} "
                               f"({coal} {v.dtype} values)")
    return out


def tile_constraints(schedule: Schedule, gpu) -> dict[str, dict[str, TileConstraint]]:
    """Per kernel name, per axis: the divisibility its tile needs on ``gpu`` (LCM of every reason)."""
    from .hardware import get_gpu

    g = get_gpu(gpu) if gpu is not None else None
    return {p.name: _kernel_constraints(p, g) for p in analyze(schedule)}


def _tile_of(plan: KernelPlan, axis: str):
    if axis in plan.groups:
        return plan.groups[axis], f"g_{axis}"
    if plan.stream and plan.stream[0] == axis:
        return plan.stream[1], f"s_{axis}"
    if axis in plan.outer_streams:
        return 1, f"s_{axis}"
    return None, None


def check_schedule(schedule: Schedule, gpu=None, *, sizes: Mapping | None = None) -> list[str]:
    """Check ``schedule`` on ``gpu`` (a name or GPU; None: structural checks only).

    Raises ScheduleError on the first hard failure; returns warnings (soft preferences
    such as 128-byte coalescing) otherwise.
    """
    if sizes:
        schedule = schedule.bind(sizes)
    plans = analyze(schedule)
    warnings: list[str] = []
    if gpu is None:
        return warnings
    from .hardware import get_gpu

    g = get_gpu(gpu)
    for plan in plans:
        cons = _kernel_constraints(plan, g)
        for axis, c in cons.items():
            tile, sym = _tile_of(plan, axis)
            n = plan.sizes.get(axis)
            w = plan.rf_groups.get(axis)
            if w is not None and _is_num(w) and c.whole_multiple > 1 and int(w) % c.whole_multiple:
                raise ScheduleError(
                    f"kernel {plan.name!r}: warp tile w_{axis}={w} on axis {axis!r} must be a multiple of "
                    f"{c.whole_multiple}: " + "; ".join(c.whole_reasons))
            if tile is not None:
                if _is_num(tile) and int(tile) % c.multiple:
                    raise ScheduleError(
                        f"kernel {plan.name!r}: tile {sym}={tile} on axis {axis!r} must be a multiple of "
                        f"{c.multiple}: " + "; ".join(c.reasons))
                if _is_num(tile) and c.soft_multiple > 1 and int(tile) % c.soft_multiple:
                    warnings.append(f"kernel {plan.name!r}: tile {sym}={tile} on axis {axis!r} is not a multiple "
                                    f"of {c.soft_multiple} (" + "; ".join(c.soft_reasons) + ")")
            else:
                if c.whole_multiple > 1 and _is_num(n) and int(n) % c.whole_multiple:
                    raise ScheduleError(
                        f"kernel {plan.name!r}: axis {axis!r} (size {n}) is held whole in a tensor-core mma and "
                        f"must be a multiple of {c.whole_multiple}: there is no remainder handling for it ("
                        + "; ".join(c.whole_reasons) + ")")
                rf = plan.rf_groups.get(axis)
                if rf is not None and _is_num(rf) and _is_num(n) and int(n) % int(rf):
                    raise ScheduleError(
                        f"kernel {plan.name!r}: axis {axis!r} (size {n}) is held whole in the block and must be a "
                        f"multiple of its warp tile w_{axis}={rf}: the block's tile splits evenly into warp tiles")
                if c.soft_multiple > 1 and _is_num(n) and int(n) % c.soft_multiple:
                    warnings.append(f"kernel {plan.name!r}: axis {axis!r} (size {n}) is not a multiple of "
                                    f"{c.soft_multiple} (" + "; ".join(c.soft_reasons) + ")")
    # capacity (M per block at SMEM and RF, from the plans' liveness; no cost model needed)
    for plan in plans:
        peaks = peak_memory(plan)
        if peaks is None:
            continue
        for lname, label in (("SMEM", "shared memory"), ("RF", "registers")):
            if lname not in g.level_names():
                continue
            lv = g.level(lname)
            cap = lv.per_block_bytes or lv.capacity_bytes
            if cap is None:
                continue
            need, detail = peaks[lname]
            if need > cap:
                parts = ", ".join(f"{n} {b / 1024:.1f} KiB" for n, b in detail.items())
                raise ScheduleError(
                    f"kernel {plan.name!r}: its tile needs {need / 1024:.1f} KiB of {label} ({lname}) per block"
                    + (f" at the fullest column ({parts})" if parts else "")
                    + f" but {g.name} allows {cap / 1024:.1f} KiB per block; use smaller groups or streams")
    return warnings
