"""The one planner: derive a :class:`~napkin.perfmodel.plan.Plan` (docs/architecture.md, "The planner").

``derive`` searches what can run, and nothing else:

1. **Partitions.** The diagram's boxes (renames are free views, never units) are split into
   kernels. A kernel is a run of consecutive boxes of a topological order, which makes it convex
   (no path leaves it and comes back), so every partition of the order into runs is a valid
   launch sequence. Dynamic programming over the runs gives the cheapest partition of one order
   in O(boxes × :data:`MAX_FUSED_BOXES`) kernel evaluations; up to three orders are searched (the
   diagram's depth-first order; the one that visits a box's last argument first, which keeps
   a consumer's producers together: attention's ``S … P`` stays next to ``O`` even when ``V`` is
   computed in between; and, where a family finds **regions** in the diagram, the second order
   with each region's boxes made consecutive, so that a family taking a large connected
   sub-diagram sees it whole: attention's backward inside a block's backward, whose boxes the
   other orders interleave with the cotangent dO's producers), and the cheaper plan wins. Each
   boundary is therefore fused or not as the model says: a fusion is picked only where its kernel
   is predicted faster than the kernels it replaces.
2. **Kernels.** For one run of boxes, every family is asked whether it builds that sub-diagram
   (``explain``: a cheap structural check, before anything is costed). A family that does
   declares the configurations its template builds (``candidates``: a schedule with tiles per
   level and typed :class:`~napkin.perfmodel.schedule.KernelOptions`), keeps those it can build
   for the target arch (``builds_for``), and each is timed by the one prediction function
   (:func:`napkin.codegen.select.predict_schedule`). The fastest configuration of any family is
   the kernel's. The scalar ``fallback`` takes one box at a time, only as the last resort.
3. **Memo.** Every run is analysed once (keyed by its boxes) across the orders.

>>> from napkin.diagrams import library
>>> der = derive(library.get("softmax"), "h100", "bf16", sizes={"r": 4096, "x": 4096})
>>> der.plan.families
('rowwise',)
>>> der.plan.kernels[0].kernel.options.threads_per_row is not None
True
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..diagrams.diagram import Diagram
from ..diagrams.expand import expand, expandable
from ..diagrams.fold import fold, foldable, summed_folds
from ..diagrams.ops import Norm, Softmax
from ..dtypes import canonical as canonical_dtype
from ..dtypes import dtype as lookup_dtype
from ..errors import CodegenError, NapkinError, ScheduleError
from ..perfmodel.hardware import check_arch, gpu_ref
from ..perfmodel.plan import FALLBACK, Plan, PlannedKernel, describe_kernel, tiles_text
from ..perfmodel.schedule import Kernel, Relabel, Schedule
from .partition import attach_renames, is_connected, kernel_problem, plan_units
from .program import check_options

__all__ = ["derive", "Derivation", "KernelChoice", "Option", "MAX_FUSED_BOXES", "MAX_HEAVY_BOXES", "MAX_PLANNED_BOXES",
           "SearchLimitError", "check_search_size"]

#: The most boxes one kernel may hold (the longest fusion any family builds: attention with its
#: masks and score maps, or a norm with its prologue and epilogue maps).
MAX_FUSED_BOXES = 12
#: The most boxes that are not elementwise one kernel may hold (attention: two contractions and a
#: softmax); longer runs are refused before any family is asked. A family may declare larger limits
#: for the runs it takes (``max_heavy_boxes``, ``max_fused_boxes``: attention's backward holds six
#: contractions in up to 16 boxes); only such a family is asked about such runs, and only about
#: those with at most its number of heavy boxes.
MAX_HEAVY_BOXES = 3
#: A stretch of elementwise boxes (maps and renames) longer than MAX_FUSED_BOXES is also tried
#: whole, as one run from its first box (one run more where the stretch ends, not a wider window):
#: a chain of maps is one kernel however long (up to the family's ``max_elementwise_boxes``, this
#: at most), never a kernel every MAX_FUSED_BOXES boxes with the values through HBM between them.
MAX_ELEMENTWISE_BOXES = 256
#: The most boxes (renames left out) one derive call plans: the search evaluates at most
#: 2 orders × MAX_PLANNED_BOXES × MAX_FUSED_BOXES = 24,000 runs of boxes (about 15 s for a chain of
#: 1000 matmuls on one core; a third order, where a family finds regions, re-uses most of the
#: runs analysed). Larger diagrams are refused before anything is costed.
MAX_PLANNED_BOXES = 1000

#: A softmax or norm box the row-wise family runs over rows of more than LONG_ROW 16-bit values is
#: also planned written out (its reductions and maps: the chain kernel, which streams a long row,
#: keeps it in shared memory or holds it at two blocks an SM where the box's own kernel holds one),
#: and kept so where the model predicts that at most LONG_ROW_GAIN of its own kernel's time. At 8192
#: values and under the model priced the two alike at every size tried (rows of 1024-8192, bf16 and
#: fp32, softmax, layernorm, rmsnorm). H200, L2 flushed, the planner's picks, own kernel -> written
#: out (`long_row_composites_s34.txt`, us): bf16 softmax over 4096 x 16384 98.7 -> 75.9, 8192 x 32001
#: 386.4 -> 315.1; layernorm over 4096 x 16384 93.3 -> 80.5; rmsnorm over 4096 x 16384 87.1 -> 66.7,
#: 8192 x 32001 372.9 -> 301.1; 8192 x 8192 unchanged (not tried). fp32 measured mixed and keeps its
#: own kernels: layernorm over 8192 x 32001 1046.0 -> 736.8 (its own plan was two kernels), 4096 x
#: 16384 143.4 -> 136.1, rmsnorm 132.9 -> 133.5, but softmax over 4096 x 16385 179.1 -> 213.7
LONG_ROW = 8192
LONG_ROW_GAIN = 0.95

#: A diagram with axes folded (:mod:`napkin.diagrams.fold`) is planned so only when the model
#: predicts it at most this fraction of the plan with every axis its own.
FOLD_GAIN = 0.98
#: Diagrams with at least this many boxes say on stderr how the search goes.
PROGRESS_BOXES = 24
#: Fusion decisions printed (``--json`` has them all).
SHOWN_DECISIONS = 24


class SearchLimitError(ScheduleError):
    """A diagram larger than the planner searches (:data:`MAX_PLANNED_BOXES`)."""


@dataclass(frozen=True)
class Option:
    """One configuration of one family for one kernel, with its predicted time."""

    family: str
    schedule: Schedule  # one kernel, over the kernel's sub-diagram
    seconds: float
    bound: str = ""

    def describe(self) -> str:
        return describe_kernel(self.schedule.kernels[0].replace(family=self.family))


@dataclass(frozen=True)
class KernelChoice:
    """What the planner found for one run of boxes: the ranked options, or why none runs it."""

    boxes: tuple[str, ...]
    ranked: tuple[Option, ...] = ()
    refusals: tuple[tuple[str, str], ...] = ()  # (family or "planner", why it does not build this run)

    @property
    def best(self) -> Option | None:
        return self.ranked[0] if self.ranked else None

    @property
    def seconds(self) -> float:
        return self.ranked[0].seconds if self.ranked else math.inf

    def refusal(self) -> str:
        return "; ".join(f"{f}: {why}" for f, why in self.refusals) or "no family builds it"


@dataclass(frozen=True)
class Derivation:
    """The result of :func:`derive`: the plan, the method's steps that lead to it, and why.

    ``plan`` is what :func:`napkin.codegen.lower.lower` builds; ``steps`` narrate it as the
    Napkin method does (naive → fuse → group → stream, each costed); ``decisions`` say for every
    boundary between kernels why it was or was not fused; ``alternatives`` are the runner-up
    configurations of the plan's costliest kernel.
    """

    plan: Plan
    steps: tuple = ()
    decisions: tuple[str, ...] = ()
    alternatives: tuple[Option, ...] = ()
    thresholds: dict = field(default_factory=dict)
    hardware_notes: tuple[str, ...] = ()

    @property
    def best(self) -> Schedule:
        """The plan as a schedule of the whole diagram."""
        return self.plan.schedule

    @property
    def seconds(self) -> float:
        return self.plan.seconds

    def to_dict(self) -> dict:
        """JSON-safe form: ``plan`` (the same object ``napkin generate --json`` prints), the steps,
        the decisions and the alternatives."""
        from ..perfmodel.method import step_dict

        return {
            "plan": self.plan.to_dict(),
            "steps": [step_dict(s) for s in self.steps],
            "decisions": list(self.decisions),
            "alternatives": [{"kernel": o.describe(), "predicted_seconds": o.seconds} for o in self.alternatives],
            "thresholds": self.thresholds, "hardware_notes": list(self.hardware_notes),
        }

    def __str__(self) -> str:
        from ..perfmodel.method import format_steps

        lines = [format_steps(self.plan, self.steps)]
        lines.append(str(self.plan))
        if self.decisions:
            lines.append("fusion:")
            lines += [f"   {d}" for d in self.decisions[:SHOWN_DECISIONS]]
            if len(self.decisions) > SHOWN_DECISIONS:
                lines.append(f"   … and {len(self.decisions) - SHOWN_DECISIONS} more (all of them in --json)")
        if self.alternatives:
            lines.append("alternatives for the costliest kernel (predicted):")
            lines += [f"   {o.seconds * 1e6:9.1f} µs  {o.describe()}" for o in self.alternatives]
        t = self.thresholds
        if t:
            lines.append(f"compute-bound threshold: {t['flops_per_value']:.1f} FLOP per value moved "
                         f"(matmul needs b ≥ {t['matmul_min_contraction']:.0f}, attention g_q ≥ "
                         f"{t['attention_min_g_q']:.0f})")
        lines += list(self.hardware_notes)
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the search


def _orders(diagram: Diagram, families: Sequence = ()) -> list[tuple[str, ...]]:
    """Topological orders of the units searched: the diagram's own (depth-first, first argument
    first), the one that visits a box's last argument first, and that one with the regions of
    ``families`` (:func:`_regions`) each made consecutive; an order equal to an earlier one is
    searched once."""
    units = set(plan_units(diagram))
    first = tuple(n for n in plan_units(diagram))
    order: list[str] = []
    seen: set[int] = set()
    stack = [(v, False) for v in diagram.outputs]
    while stack:
        v, expanded = stack.pop()
        if id(v) in seen or v.is_input:
            continue
        if expanded:
            seen.add(id(v))
            n = diagram.name_of(v)
            if n in units:
                order.append(n)
            continue
        stack.append((v, True))
        for a in v.args:  # pushed in order, so the last argument is visited first
            if id(a) not in seen:
                stack.append((a, False))
    second = tuple(order)
    out = [first] if second == first else [first, second]
    # a region already consecutive in a searched order needs no third one (the search costs as
    # much again)
    apart = [r for r in _regions(diagram, families) if not any(_consecutive(o, r) for o in out)]
    third = _grouped(diagram, second, apart)
    if third is not None and third not in out:
        out.append(third)
    return out


def _consecutive(order: tuple[str, ...], boxes: tuple[str, ...]) -> bool:
    at = sorted(order.index(b) for b in boxes)
    return at[-1] - at[0] == len(at) - 1


def _unit_args(diagram: Diagram, units: set[str]) -> dict[str, set[str]]:
    """For each unit, the units it reads (through views; inputs left out)."""
    out: dict[str, set[str]] = {}
    for v in diagram.nodes:
        n = diagram.name_of(v)
        if n not in units:
            continue
        got: set[str] = set()
        stack = list(v.args)
        while stack:
            a = stack.pop()
            if a.is_input:
                continue
            m = diagram.name_of(a)
            if m in units:
                got.add(m)
            else:  # a view: the unit it shows
                stack.extend(a.args)
        out[n] = got
    return out


def _regions(diagram: Diagram, families: Sequence) -> list[tuple[str, ...]]:
    """The regions the families find in ``diagram`` (a family's optional ``regions(diagram)``: box
    sets it could take as one kernel, found by its recogniser on the whole diagram), as units,
    those of two boxes or more that are convex (no path leaves one and comes back, so they can be
    consecutive in a topological order) and do not overlap an earlier one. A region is a hint to
    the search order only: the run is analysed, and refused or priced, like any other."""
    units = set(plan_units(diagram))
    args = _unit_args(diagram, units)
    users: dict[str, set[str]] = {}
    for n, got in args.items():
        for a in got:
            users.setdefault(a, set()).add(n)
    out: list[tuple[str, ...]] = []
    taken: set[str] = set()
    for fam in families:
        find = getattr(fam, "regions", None)
        if not callable(find):
            continue
        try:
            found = find(diagram)
        except NapkinError:
            continue
        for r in found:
            boxes = tuple(dict.fromkeys(b for b in r if b in units))
            if len(boxes) < 2 or taken.intersection(boxes) or not _convex(set(boxes), users):
                continue
            out.append(boxes)
            taken.update(boxes)
    return out


def _convex(region: set[str], users: dict[str, set[str]]) -> bool:
    """Whether no path from ``region`` through boxes outside it comes back into it."""
    stack = [u for b in region for u in users.get(b, ()) if u not in region]
    outside: set[str] = set()
    while stack:
        n = stack.pop()
        if n in outside:
            continue
        outside.add(n)
        for u in users.get(n, ()):
            if u in region:
                return False
            stack.append(u)
    return True


def _grouped(diagram: Diagram, base: tuple[str, ...], regions: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """``base`` (a topological order of the units) with each region's boxes consecutive: regions
    contracted to one node each, then a topological order that always takes the ready node
    earliest in ``base`` (a region at its earliest box), each region's boxes in ``base``'s order.
    None without regions."""
    if not regions:
        return None
    pos = {n: i for i, n in enumerate(base)}
    node = {n: ("box", n) for n in base}
    for i, r in enumerate(regions):
        for b in r:
            node[b] = ("region", i)
    members: dict[tuple, list[str]] = {}
    for n in base:
        members.setdefault(node[n], []).append(n)
    preds: dict[tuple, set[tuple]] = {k: set() for k in members}
    for n, got in _unit_args(diagram, set(base)).items():
        preds[node[n]].update(node[a] for a in got if node[a] != node[n])
    succs: dict[tuple, set[tuple]] = {k: set() for k in members}
    for k, ps in preds.items():
        for p in ps:
            succs[p].add(k)
    waiting = {k: len(ps) for k, ps in preds.items()}
    ready = [(pos[members[k][0]], k) for k, c in waiting.items() if c == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, k = heapq.heappop(ready)
        out.extend(members[k])
        for s in succs[k]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (pos[members[s][0]], s))
    return tuple(out) if len(out) == len(base) else None


class _Planner:
    """One derive call: the diagram, the target, the families, the memo of evaluated runs."""

    def __init__(self, diagram: Diagram, gpu, arch: str, dtype: str, families: Sequence,
                 fixed: Mapping[str, tuple[int, str, str]] | None, progress: Callable[[str], None] | None):
        self.d = diagram
        self.gpu = gpu
        self.arch = arch
        self.dtype = dtype
        self.families = list(families)
        self.fixed = dict(fixed or {})
        self.say = progress or (lambda _m: None)
        self.memo: dict[frozenset, KernelChoice] = {}
        self.shapes: dict[tuple, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # a reduction of a reduction (group norm's mean over c of the mean over s) continues one
        # reduction over several axes, which a kernel runs as one: only the first of such a chain
        # counts towards MAX_HEAVY_BOXES
        self.heavy = {self.d.name_of(v) for v in self.d.nodes if v.op.kind not in ("map", "rename")
                      and not (v.op.kind == "reduce" and v.args[0].op.kind == "reduce")}
        self.elementwise = {self.d.name_of(v) for v in self.d.nodes if v.op.kind in ("map", "rename")}
        self.evaluated = 0
        # the longest run any family takes (the DP's window) and the most heavy boxes of one
        self.max_fused = max([MAX_FUSED_BOXES] + [_limit(f, "max_fused_boxes", MAX_FUSED_BOXES) for f in self.families])
        self.max_heavy = max([MAX_HEAVY_BOXES] + [_limit(f, "max_heavy_boxes", MAX_HEAVY_BOXES) for f in self.families])
        self.max_elementwise = min(MAX_ELEMENTWISE_BOXES, max(
            [MAX_FUSED_BOXES] + [_limit(f, "max_elementwise_boxes", MAX_FUSED_BOXES) for f in self.families]))

    # -------------------------------------------------------------- one kernel
    def _pinned_ok(self, sched: Schedule, sub: Diagram) -> bool:
        """Whether a configuration carries every relabelling the user pinned on its axes."""
        have = {(r.axis, int(r.size), r.level, r.kind) for r in sched.kernels[0].relabels}
        for axis, (size, level, kind) in self.fixed.items():
            if axis in sub.axes and (axis, size, level, kind) not in have:
                return False
        return True

    def evaluate(self, boxes: tuple[str, ...]) -> KernelChoice:
        key = frozenset(boxes)
        if key in self.memo:
            return self.memo[key]
        choice = self._evaluate(boxes)
        self.memo[key] = choice
        return choice

    def _same_problem(self, boxes: tuple[str, ...], sub: Diagram) -> KernelChoice | None:
        """A run whose sub-diagram has the structure of one analysed before (the K and V projections
        of a block, the layers of a stack: the same operations, axes, sizes and dtypes; only the
        array names differ) gets that run's options, renamed; None when none matches."""
        shape, names = _structure(sub)
        seen = self.shapes.get(shape)
        if seen is None:
            self.shapes[shape] = (boxes, names)
            return None
        old_boxes, old_names = seen
        rename = dict(zip(old_names, names))
        done = self.memo.get(frozenset(old_boxes))
        if done is None:
            return None
        ranked = []
        for o in done.ranked:
            k = o.schedule.kernels[0]
            k = k.replace(boxes=tuple(rename.get(b, b) for b in k.boxes),
                          placement=tuple((rename.get(a, a), lvl) for a, lvl in k.placement))
            ranked.append(Option(o.family, Schedule(sub, (k,), o.schedule.gpu, o.schedule.dtype), o.seconds,
                                 o.bound))
        return KernelChoice(boxes, tuple(ranked), done.refusals)

    def _evaluate(self, boxes: tuple[str, ...]) -> KernelChoice:
        from .select import predict_schedule

        heavy = sum(b in self.heavy for b in boxes)
        if len(boxes) > 1 and heavy > self.max_heavy:
            return KernelChoice(boxes, refusals=(("planner", f"more than {self.max_heavy} boxes that are "
                                                  "not elementwise: no family fuses that many"),))
        # past the default limits only a family that declares larger ones is asked, and only about
        # runs within them: at most as many heavy boxes as it declares, or a stretch of maps alone
        families = self.families
        if len(boxes) > MAX_FUSED_BOXES and all(b in self.elementwise for b in boxes):  # a long chain of maps
            families = [f for f in families if len(boxes) <= min(self.max_elementwise, _limit(
                f, "max_elementwise_boxes", MAX_FUSED_BOXES))]
            if not families:
                return KernelChoice(boxes, refusals=(("planner", f"{len(boxes)} elementwise boxes: more than any "
                                                      f"family fuses ({self.max_elementwise})"),))
        elif len(boxes) > MAX_FUSED_BOXES or (len(boxes) > 1 and heavy > MAX_HEAVY_BOXES):
            families = [f for f in families if len(boxes) <= _limit(f, "max_fused_boxes", MAX_FUSED_BOXES)
                        and heavy <= _limit(f, "max_heavy_boxes", MAX_HEAVY_BOXES)
                        and _limit(f, "max_heavy_boxes", MAX_HEAVY_BOXES) > MAX_HEAVY_BOXES]
            if not families:
                return KernelChoice(boxes, refusals=(("planner", f"{len(boxes)} boxes, {heavy} not elementwise: "
                                                      "no family fuses that many"),))
        if not is_connected(self.d, boxes):
            return KernelChoice(boxes, refusals=(("planner", "the boxes are not connected"),))
        name = _kernel_name(self.d, boxes)
        try:
            sub, _ = kernel_problem(self.d, boxes, name)
        except NapkinError as e:
            return KernelChoice(boxes, refusals=(("planner", str(e)),))
        same = self._same_problem(boxes, sub)
        if same is not None:
            return same
        self.evaluated += 1
        options: list[Option] = []
        refusals: list[tuple[str, str]] = []
        for fam in families:
            if fam.name == FALLBACK and len(boxes) > 1:
                continue  # the last resort runs one box per kernel
            why = _explain(fam, sub)
            if why is not None:
                refusals.append((fam.name, why))
                continue
            try:
                cands = list(fam.candidates(sub, self.gpu, self.dtype))
            except NapkinError as e:
                refusals.append((fam.name, str(e)))
                continue
            builds_for = getattr(fam, "builds_for", None)
            if builds_for is not None:
                buildable = [s for s in cands if builds_for(s, self.arch)]
                if cands and not buildable:
                    # (a family that says why: a limit of its launch rather than of the arch)
                    build_reason = getattr(fam, "build_reason", None)
                    why = build_reason(cands[0], self.arch) if build_reason is not None else None
                    refusals.append((fam.name, why or f"none of its configurations builds for {self.arch}"))
                cands = buildable
            if self.fixed:
                pinned = [s for s in cands if self._pinned_ok(s, sub)]
                if cands and not pinned:
                    refusals.append((fam.name, "none of its configurations has the pinned tiles ("
                                     + ", ".join(_pin_text(a, v) for a, v in self.fixed.items() if a in sub.axes)
                                     + "); it builds " + "; ".join(sorted({tiles_text(s.kernels[0], "no tiles", axes=False) for s in cands})[:6])))
                cands = pinned
            got = 0
            last_err = None
            for s in cands:
                s = _with_family(s, fam.name)
                try:
                    r = predict_schedule(sub, fam, s, self.gpu)
                except ScheduleError as e:
                    last_err = str(e)
                    if fam.name != FALLBACK:
                        continue
                    # the last resort runs what the model cannot describe (a copy of a view):
                    # it is timed by the plain estimate, every input read and output written once
                    from .select import local_estimate
                    r = local_estimate(s, self.gpu)
                if math.isfinite(r.seconds):
                    options.append(Option(fam.name, s, r.seconds, r.bound))
                    got += 1
            if cands and not got:
                refusals.append((fam.name, f"the model refuses every configuration ({last_err})"))
        # the fallback last whatever its time; ties keep the family order, then the family's own
        options.sort(key=lambda o: (o.family == FALLBACK, o.seconds))
        return KernelChoice(boxes, tuple(options), tuple(refusals))

    # -------------------------------------------------------------- partitions
    def partition(self, order: tuple[str, ...]) -> tuple[tuple[int, float], list[KernelChoice]]:
        """The cheapest split of ``order`` into runs (dynamic programming over run ends).

        Cost is (boxes on the scalar fallback, predicted seconds), compared in that order: the
        fallback is the last resort, so a plan that puts fewer boxes on it always wins."""
        n = len(order)
        inf = (n + 1, math.inf)
        best: list[tuple[int, float]] = [(0, 0.0)] + [inf] * n
        back: list[KernelChoice | None] = [None] * (n + 1)
        stretch = self._elementwise_stretches(order)
        for j in range(1, n + 1):
            for i in (*stretch.get(j, ()), *range(max(0, j - self.max_fused), j)):
                if not math.isfinite(best[i][1]):
                    continue
                c = self.evaluate(order[i:j])
                if c.best is None:
                    continue
                slow = len(c.boxes) if c.best.family == FALLBACK else 0
                t = (best[i][0] + slow, best[i][1] + c.seconds)
                if t[0] < best[j][0] or (t[0] == best[j][0] and t[1] < best[j][1] * (1 - 1e-9)):
                    best[j], back[j] = t, c
        if not math.isfinite(best[n][1]):
            return inf, []
        runs: list[KernelChoice] = []
        j = n
        while j > 0:
            c = back[j]
            runs.append(c)
            j -= len(c.boxes)
        return best[n], runs[::-1]

    def _elementwise_stretches(self, order: tuple[str, ...]) -> dict[int, tuple[int, ...]]:
        """``{run end: (run start,)}``: the runs past the DP's window that :data:`MAX_ELEMENTWISE_BOXES`
        adds. A stretch of elementwise boxes longer than the window is one run; one longer than
        ``max_elementwise`` gives two, its first ``max_elementwise`` boxes and its last."""
        out: dict[int, tuple[int, ...]] = {}
        start = 0
        for j in range(1, len(order) + 1):
            if order[j - 1] not in self.elementwise:
                start = j
                continue
            if j < len(order) and order[j] in self.elementwise:
                continue  # the stretch goes on
            length = j - start
            if length > self.max_fused:
                if length <= self.max_elementwise:
                    out[j] = (start,)
                else:
                    out[start + self.max_elementwise] = (start,)
                    out[j] = (j - self.max_elementwise,)
            start = j
        return out

    def plan(self) -> tuple[Plan, list[KernelChoice]]:
        orders = _orders(self.d, self.families)
        results = []
        for i, order in enumerate(orders):
            if len(order) >= PROGRESS_BOXES:  # a search long enough to be worth a line
                self.say(f"partitions of {len(order)} boxes, order {i + 1} of {len(orders)}")
            results.append(self.partition(order))
        total, runs = min(results, key=lambda r: (r[0][0], r[0][1], len(r[1])))
        if not runs:
            raise ScheduleError(self._no_plan(orders[0]))
        boxes = attach_renames(self.d, [c.boxes for c in runs])
        kernels = []
        for c, bx in zip(runs, boxes):
            o = c.best
            k0 = o.schedule.kernels[0]
            name = _kernel_name(self.d, c.boxes)
            kernel = Kernel(name, bx, k0.relabels, k0.placement, family=o.family, options=k0.options)
            kernels.append(PlannedKernel(kernel, o.seconds, o.bound, _why_kernel(c)))
        return Plan(self.d, gpu_ref(self.gpu), self.arch, self.dtype, tuple(kernels)), runs

    def _no_plan(self, order) -> str:
        # the whole diagram's refusals first: where one family takes such a diagram, its reason
        # (a head dimension, a dtype) is the one to read, and a box alone is refused by all
        whole = ""
        if 1 < len(order) <= self.max_fused:
            w = self.evaluate(tuple(order))
            whole = f"as one kernel, {w.refusal()}; "
        for b in order:
            c = self.evaluate((b,))
            if c.best is None:
                pin = " with the pinned tiling" if self.fixed else ""
                return (f"{_overlong_pins(self.d, self.fixed)}derive found no kernel that runs box {b!r} of "
                        f"{self.d.name!r}{pin} on {self.gpu.name} ({self.arch}): {whole}box {b!r} alone, "
                        f"{c.refusal()}")
        return f"derive found no plan for {self.d.name!r}" + (f": {whole[:-2]}" if whole else "")

    def decisions(self, runs: list[KernelChoice]) -> list[str]:
        """For every boundary between consecutive kernels, and every fused kernel: why."""
        out = []
        for c in runs:
            if len(c.boxes) > 1:
                apart = sum(self.evaluate((b,)).seconds for b in c.boxes)
                apart_s = f"{apart * 1e6:.1f} µs one box per kernel" if math.isfinite(apart) else \
                    "one box per kernel cannot run"
                out.append(f"fused {'+'.join(c.boxes)}: {c.seconds * 1e6:.1f} µs against {apart_s}")
        for a, b in zip(runs, runs[1:]):
            if len(a.boxes) + len(b.boxes) > self.max_fused:  # the longest run any family takes
                out.append(f"kept {_short(a.boxes)} | {_short(b.boxes)} apart: more than {self.max_fused} boxes")
                continue
            if not _reads(self.d, a.boxes, b.boxes):
                continue
            both = self.evaluate(a.boxes + b.boxes)
            if both.best is None:
                out.append(f"kept {_short(a.boxes)} | {_short(b.boxes)} apart: no family fuses them "
                           f"({_first_reasons(both)})")
            else:
                out.append(f"kept {_short(a.boxes)} | {_short(b.boxes)} apart: fused would take "
                           f"{both.seconds * 1e6:.1f} µs ({both.best.family}) against "
                           f"{(a.seconds + b.seconds) * 1e6:.1f} µs apart")
        return out


# ----------------------------------------------------------------------------- helpers


def _structure(sub: Diagram) -> tuple[tuple, tuple[str, ...]]:
    """(the structure of a kernel's sub-diagram without its array names, those names in order):
    inputs (axes with sizes, dtype), boxes (operation, arguments by position, axes, dtype) and
    outputs by position. Two runs with the same structure are the same problem."""
    names = [v.name for v in sub.inputs] + [sub.name_of(v) for v in sub.nodes]
    pos = {n: i for i, n in enumerate(names)}
    ins = tuple((tuple((a.name, a.size) for a in v.axes), v.dtype) for v in sub.inputs)
    boxes = tuple((repr(v.op), tuple(pos[sub.name_of(a)] for a in v.args),
                   tuple((a.name, a.size) for a in v.axes), v.dtype) for v in sub.nodes)
    outs = tuple(pos[n] for n in sub.output_names)
    return (ins, boxes, outs), tuple(names)


def _check_pins(d: Diagram, fixed: Mapping[str, tuple[int, str, str]]) -> None:
    """Refuse, naming why, a pinned stream of an axis no box sums over and a pinned group of one no
    box keeps: no family could honour them, and their refusals would not say so.

    >>> from napkin.diagrams import library
    >>> _check_pins(library.get("matmul"), {"a": (64, "SMEM", "stream")})
    Traceback (most recent call last):
    ...
    napkin.errors.ScheduleError: stream a=64: no box sums over axis 'a' (the boxes of 'matmul' sum over b)
    """
    summed = sorted({x for v in d.nodes for x in v.op.own_axes()})
    kept = {x for v in d.nodes for x in v.axis_names}
    for a, (size, _level, kind) in fixed.items():
        if kind == "stream" and a not in summed:
            sums = f"the boxes of {d.name!r} sum over {', '.join(summed)}" if summed else f"no box of {d.name!r} sums"
            raise ScheduleError(f"stream {a}={size}: no box sums over axis {a!r} ({sums})")
        if kind == "group" and a not in kept:
            raise ScheduleError(f"group {a}={size}: no box keeps axis {a!r} (it is summed over); a group tiles an "
                                "axis of a box's result: stream it instead")


def _overlong_pins(d: Diagram, fixed: Mapping[str, tuple[int, str, str]]) -> str:
    """The pins longer than their axis, said first where nothing honours the pins (a family may
    still build a tile that overhangs a short axis, so they are not refused outright), else "".

    >>> from napkin.diagrams import library
    >>> _overlong_pins(library.get("attention").bind(q=128, x=128, d=64), {"x": (1000, "SMEM", "stream")})
    'the pinned stream x=1000 is longer than axis x (128 values), which is likely why: '
    """
    long = [f"{kind} {a}={size} is longer than axis {a} ({d.sizes[a]} values)"
            for a, (size, _level, kind) in fixed.items()
            if isinstance(d.sizes.get(a), int) and size > d.sizes[a]]
    return f"the pinned {'; '.join(long)}, which is likely why: " if long else ""


def _limit(fam, attr: str, default: int) -> int:
    """A family's declared limit (``max_fused_boxes``, ``max_heavy_boxes``), else the default."""
    v = getattr(fam, attr, None)
    return int(v) if isinstance(v, int) and v > 0 else default


def _explain(fam, diagram) -> str | None:
    if hasattr(fam, "explain"):
        try:
            return fam.explain(diagram)
        except NapkinError as e:
            return str(e)
    try:
        return None if fam.matches(diagram) else "it does not take this sub-diagram"
    except NapkinError as e:
        return str(e)


def _with_family(s: Schedule, family: str) -> Schedule:
    ks = tuple(k if k.family == family else k.replace(family=family) for k in s.kernels)
    return s if ks == s.kernels else s.replace(kernels=ks)


def _pin_text(axis: str, spec) -> str:
    size, level, kind = spec
    return f"{kind} {axis}={size}@{level}"


def _kernel_name(diagram: Diagram, boxes: Sequence[str]) -> str:
    """A kernel is named by its main box: the last box that is not elementwise, else the last."""
    values = {diagram.name_of(v): v for v in diagram.nodes}
    main = [b for b in boxes if values[b].op.kind not in ("map", "rename")]
    return (main or list(boxes))[-1]


def _short(boxes: Sequence[str]) -> str:
    return "+".join(boxes) if len(boxes) <= 3 else f"{boxes[0]}+…+{boxes[-1]}"


def _reads(diagram: Diagram, first: Sequence[str], second: Sequence[str]) -> bool:
    made = set(first)
    for v in diagram.nodes:
        if diagram.name_of(v) in second:
            stack = list(v.args)
            while stack:
                a = stack.pop()
                if a.is_input:
                    continue
                if diagram.name_of(a) in made:
                    return True
                if a.op.kind == "rename":
                    stack += list(a.args)
    return False


def _first_reasons(c: KernelChoice) -> str:
    reasons = [f"{f}: {why}" for f, why in c.refusals if f != FALLBACK]
    return "; ".join(reasons[:3]) or c.refusal()


def _why_kernel(c: KernelChoice) -> str:
    best = c.best
    text = f"{best.describe()} predicted fastest ({best.seconds * 1e6:.1f} µs, {best.bound}-bound)"
    others = [o for o in c.ranked[1:] if o.describe() != best.describe()]
    if others:
        o = others[0]
        text += f"; runner-up {o.describe()} at {o.seconds * 1e6:.1f} µs"
    if best.family == FALLBACK:
        text += "; on the scalar fallback because " + (_first_reasons(c) or "no other family takes it")
    return text


# ----------------------------------------------------------------------------- derive


def derive(diagram, gpu=None, dtype: str | None = None, sizes: Mapping[str, int] | None = None, *,
           arch: str | None = None, fixed: Mapping[str, tuple[int, str, str]] | None = None,
           families: Sequence | None = None, exclude_engines: Sequence[str] = (), top: int = 5,
           progress: Callable[[str], None] | None = None, explain: bool = True, fold_axes: bool = True) -> Derivation:
    """Derive the plan of ``diagram`` (a Diagram or library name) on ``gpu`` (a profile or name;
    default: the GPU at hand, else h100), for ``arch`` (default: the profile's).

    ``fixed`` pins relabellings (``{"q": (128, "SMEM", "group")}``): only configurations that
    carry them are searched. ``families`` restricts the families (names or objects);
    ``exclude_engines`` drops configurations on those engines (``("wgmma",)``). ``explain=False``
    skips the method's steps and the fusion decisions (what :func:`napkin.codegen.compile` needs).
    ``fold_axes=False`` keeps every axis its own (no :mod:`napkin.diagrams.fold`: a plan that is
    re-bound to other sizes, as a dynamic diagram's is).
    """
    from . import families as fam_registry
    from .prepare import prepare
    from .select import resolve_gpu

    if isinstance(diagram, Diagram):  # before binding: binding a huge diagram is itself slow
        check_search_size(diagram)
    dtype = canonical_dtype(dtype)
    d = prepare(diagram, sizes=sizes, dtype=dtype)
    g = resolve_gpu(gpu)
    arch = check_arch(arch or g.arch)
    dt = dtype or _diagram_dtype(d)
    if dt == "fp8" and (arch != "sm_90a" or "fp8" not in g.tensor_flops):  # said first, not after every family
        raise ScheduleError(f"fp8 runs on Hopper's fp8 tensor cores (sm_90a); {g.name} ({arch}) has none: "
                            "plan in bf16 or fp16 there")
    fams = [fam_registry.get(f) for f in families] if families else fam_registry.available()
    if exclude_engines:
        fams = [_Without(f, tuple(exclude_engines)) for f in fams]
    if fixed is not None and not isinstance(fixed, Mapping):
        raise ScheduleError(f"fixed must map axis names to (size, level, kind), got {type(fixed).__name__}")
    unknown = [a for a in (fixed or {}) if a not in d.axes]
    if unknown:
        raise ScheduleError(f"diagram {d.name!r} has no axis {unknown[0]!r} to group or stream; its axes are "
                            f"{list(d.axes)}")
    for a, pin in (fixed or {}).items():
        if not (isinstance(pin, tuple) and len(pin) == 3 and isinstance(pin[0], int)
                and not isinstance(pin[0], bool) and pin[0] > 0):
            raise ScheduleError(f"fixed[{a!r}]: expected (size, level, kind) with a positive integer size, "
                                f"got {pin!r}")
        Relabel(a, *pin)  # the level and kind, checked as any relabelling's
    _check_pins(d, fixed or {})
    planner = _Planner(d, g, arch, dt, fams, fixed, progress)
    plan, runs = planner.plan()

    def replan(other: Diagram):
        """(planner, plan, runs) of ``other`` (the diagram written out or with axes folded), or
        None where it cannot be planned."""
        p = _Planner(other, g, arch, dt, fams, fixed, progress)
        try:
            return (p, *p.plan())
        except ScheduleError:
            return None

    expansion = ()
    composite = _composites_on_fallback(plan)
    if composite:
        # a softmax or norm no family takes whole (its axis is not innermost): its parts, reductions
        # over the axis and maps, run on the fast families; a view written as an output is a copy
        # (a product of one factor) the pointwise family runs; a contraction in a layout the
        # contraction family does not read runs on operands copied into one it does. Compared as
        # the partitions are: fewer boxes on the scalar fallback first (its price at small sizes is
        # a guess the external suites measure at 100-1000x slower than eager), then the predicted
        # time. The contractions are also tried apart from the rest: a relaid contraction may be
        # refused where the one fused with a copy was the only thing on the fallback
        summed = {d.name_of(v) for v in d.nodes if v.op.kind == "contract"}
        tries = dict.fromkeys(t for t in (composite, tuple(n for n in composite if n not in summed),
                                          tuple(n for n in composite if n in summed)) if t)
        best = (_slow_boxes(plan), plan.seconds)
        for names in tries:
            tried = replan(expand(d, names))
            if tried is None:
                continue
            wide, wide_plan, wide_runs = tried
            if (_slow_boxes(wide_plan), wide_plan.seconds) < best:
                best = (_slow_boxes(wide_plan), wide_plan.seconds)
                expansion = (f"wrote out {', '.join(names)} as reductions, maps and copies: no family takes "
                             f"{'it' if len(names) == 1 else 'them'} whole, and the parts run on fast families "
                             f"({wide_plan.seconds * 1e6:.1f} µs against {plan.seconds * 1e6:.1f} µs on the "
                             "scalar fallback)",)
                chosen = (wide, wide_plan, wide_runs, names)
        if expansion:
            planner, wide_plan, runs, names = chosen
            d = planner.d
            plan = dataclasses.replace(wide_plan, expanded=names)
    long_rows = () if expansion else _long_row_composites(plan)
    if long_rows:
        # a softmax or norm box over rows longer than LONG_ROW values: the row-wise family's own
        # kernel holds the row in registers, few blocks an SM (one at 32000 bf16 values, 1024
        # threads), where its written-out chain may stream the row, keep it in shared memory or
        # hold it at two blocks an SM. Kept where the model predicts it faster by LONG_ROW_GAIN
        wide, wide_plan, wide_runs = replan(expand(d, long_rows)) or (None, None, None)
        if wide_plan is not None and (_slow_boxes(wide_plan), wide_plan.seconds) < (
                _slow_boxes(plan), plan.seconds * LONG_ROW_GAIN):
            expansion = (f"wrote out {', '.join(long_rows)} as reductions and maps: over rows of more than "
                         f"{LONG_ROW} values the written-out chain is predicted faster than the row-wise "
                         f"family's own kernel ({wide_plan.seconds * 1e6:.1f} µs against {plan.seconds * 1e6:.1f} µs)",)
            planner, runs, d = wide, wide_runs, wide.d
            plan = dataclasses.replace(wide_plan, expanded=long_rows)
    folding = ()
    # (attention keeps its axes: its family packs the query heads that share a K/V head itself,
    # and its kernels were measured on those tiles)
    folds = (foldable(d) if fold_axes and not expansion
             and not any(f.startswith("attention") for f in plan.families) else ())
    if folds and not any(a in f.parts for f in folds for a in (fixed or {})):
        # axes side by side in every array that no box treats apart ([b, s, e] activations of a
        # linear layer) run as one: a tile of the contraction spans their product, not the
        # innermost one alone. Kept where the model predicts it faster (by FOLD_GAIN): an equal
        # plan keeps the diagram's own axes, so its kernels read as the user wrote them. But a sum
        # over a run of axes folded is one loop over one axis, never slower to walk (no partial
        # chunk at the end of each inner index, one alignment to check): there a tie folds
        folded, fplan, fruns = replan(fold(d, folds)) or (None, None, None)
        better = False
        if fplan is not None:
            summed = bool(summed_folds(d, folds))
            mine = (_slow_boxes(fplan), fplan.seconds)
            own = (_slow_boxes(plan), plan.seconds * (1.0 if summed else FOLD_GAIN))
            better = mine <= own if summed else mine < own
        if better:
            runs_text = "; ".join(f"{', '.join(f.parts)} as {f.axis}" for f in folds)
            folding = (f"ran the axes {runs_text}: they lie side by side in every array and no box treats them "
                       f"apart, so a tile spans their product ({fplan.seconds * 1e6:.1f} µs against "
                       f"{plan.seconds * 1e6:.1f} µs with each axis its own)",)
            plan = dataclasses.replace(fplan, folds=folds, source=d)
            planner, runs, d = folded, fruns, folded.d
    plan = _with_fallback_note(plan)
    if not explain:
        return Derivation(plan)
    from ..perfmodel.method import hardware_notes, method_steps, thresholds

    costliest = max(runs, key=lambda c: c.seconds)
    alternatives = tuple(costliest.ranked[:max(1, top)])
    return Derivation(plan, method_steps(plan), expansion + folding + tuple(planner.decisions(runs)), alternatives,
                      thresholds(g, dt), hardware_notes(d, g))


def _slow_boxes(plan: Plan) -> int:
    """How many boxes of ``plan`` run on the scalar fallback (renames left out: a view attached to
    the kernel that makes its array is no work of its own; a kernel of views alone, a copy, counts
    one)."""
    views = {plan.diagram.name_of(v) for v in plan.diagram.nodes if v.op.kind == "rename"}
    return sum(max(1, sum(b not in views for b in k.boxes)) for k in plan.kernels if k.family == FALLBACK)


def _long_row_composites(plan: Plan) -> tuple[str, ...]:
    """The softmax and norm boxes of ``plan`` that the row-wise family runs whole over rows of more
    than :data:`LONG_ROW` 16-bit values (what :func:`derive` also tries written out)."""
    d = plan.diagram
    if lookup_dtype(plan.dtype).bytes != 2:
        return ()
    boxes = {b for k in plan.kernels if k.family == "rowwise" for b in k.boxes}
    out = []
    for v in d.nodes:
        if isinstance(v.op, (Softmax, Norm)) and d.name_of(v) in boxes and v.axis(v.op.over).bound_size > LONG_ROW:
            out.append(d.name_of(v))
    return tuple(out)


def _composites_on_fallback(plan: Plan) -> tuple[str, ...]:
    """The softmax, norm, contraction and output rename boxes of ``plan``'s kernels on the scalar
    fallback (what :func:`~napkin.diagrams.expand.expand` can write out as boxes the fast families
    take), and the output renames of arrays such a kernel makes (the kernel that makes an array
    writes its views that are outputs too: a view of a sum of products keeps that sum off the
    pointwise family)."""
    d = plan.diagram
    can = set(expandable(d))
    slow = [b for k in plan.kernels if k.family == FALLBACK for b in k.boxes]
    out = [b for b in slow if b in can]
    for v in d.outputs:
        n = d.name_of(v)
        if v.is_input or v.op.kind != "rename" or n not in can or n in out:
            continue
        src = v
        while not src.is_input and src.op.kind == "rename":
            src = src.args[0]
        if not src.is_input and d.name_of(src) in slow:
            out.append(n)
    return tuple(out)


def check_search_size(diagram: Diagram) -> None:
    """SearchLimitError when ``diagram`` has more boxes than :func:`derive` plans
    (:data:`MAX_PLANNED_BOXES`); cheap, so callers check before binding sizes too."""
    boxes = len(plan_units(diagram))
    if boxes > MAX_PLANNED_BOXES:
        raise SearchLimitError(
            f"diagram {diagram.name!r} has {boxes} boxes, more than the {MAX_PLANNED_BOXES} derive plans in one call "
            f"(its search evaluates up to {2 * MAX_FUSED_BOXES} runs of boxes per box); split it into diagrams of "
            f"at most {MAX_PLANNED_BOXES} boxes and plan each")


def _diagram_dtype(d: Diagram) -> str:
    dts = sorted(d.dtypes)
    return dts[0] if len(dts) == 1 else "bf16"


class _Without:
    """A family whose configurations on some engines are left out (the no-TMA rebuild)."""

    def __init__(self, fam, engines: tuple[str, ...]):
        self._fam, self._engines = fam, engines
        self.name = fam.name

    def __getattr__(self, item):
        return getattr(self._fam, item)

    def candidates(self, diagram, gpu, dtype):
        return [s for s in self._fam.candidates(diagram, gpu, dtype)
                if not any(k.options.engine in self._engines for k in s.kernels)]


def plan_schedule(diagram, schedule: Schedule, gpu=None, *, family=None, dtype: str | None = None,
                  sizes: Mapping[str, int] | None = None, arch: str | None = None) -> Plan:
    """The plan that runs ``schedule`` as given (its partition, tiles and options): each kernel is
    built by its own family, else by ``family``, else by the first family that takes its
    sub-diagram. Each kernel is predicted by the one prediction function (inf where the model
    refuses it). For a schedule a user wrote by hand; :func:`derive` plans everything else."""
    from . import families as fam_registry
    from .prepare import prepare
    from .select import predict_schedule, resolve_gpu

    dtype = canonical_dtype(dtype)
    d = prepare(diagram, sizes=sizes, dtype=dtype)
    g = resolve_gpu(gpu)
    arch = check_arch(arch or g.arch)
    dt = dtype or canonical_dtype(schedule.dtype) or _diagram_dtype(d)
    if schedule.diagram != d:
        try:
            schedule = schedule.replace(diagram=d)
        except ScheduleError as e:
            raise CodegenError(f"the schedule given does not fit diagram {d.name!r}: {e}") from None
    named = fam_registry.get(family) if family is not None else None
    kernels = []
    for k in schedule.kernels:
        sub, kept = kernel_problem(d, k.boxes, k.name)
        if k.family is not None and named is not None and k.family != named.name:
            raise CodegenError(f"kernel {k.name} of the schedule names family {k.family}, but family {named.name} "
                               "was asked for")
        if k.family is not None:
            fam = fam_registry.get(k.family)
        elif named is not None:
            fam = named
        else:
            fam = next((f for f in fam_registry.available() if _explain(f, sub) is None), None)
            if fam is None:
                raise CodegenError(f"no code-generation family builds kernel {k.name} of {d.name!r}")
        why = _explain(fam, sub)
        if why is not None:
            raise CodegenError(f"family {fam.name} cannot generate kernel {k.name} of {d.name!r}: {why}")
        check_options(fam, k.name, k.options)
        kernel = k.replace(family=fam.name)
        one = _kernel_alone(sub, kept, kernel, gpu_ref(g), dt)
        try:
            r = predict_schedule(sub, fam, one, g)
            seconds, bound = r.seconds, r.bound
        except ScheduleError as e:
            seconds, bound = math.inf, f"refused by the model: {e}"
        kernels.append(PlannedKernel(kernel, seconds, bound, "as given"))
    return _with_fallback_note(Plan(d, gpu_ref(g), arch, dt, tuple(kernels)))


def _kernel_alone(sub: Diagram, kept, kernel, gpu_key: str, dtype: str) -> Schedule:
    """The one-kernel schedule of ``kernel`` over its sub-diagram ``sub`` (its boxes as
    :func:`~napkin.codegen.partition.kernel_problem` kept them, its placements of the arrays
    ``sub`` holds): what the one prediction function ranks for that kernel."""
    arrays = {sub.name_of(v) for v in (*sub.inputs, *sub.nodes)}
    return Schedule(sub, (kernel.replace(boxes=kept, placement=tuple(p for p in kernel.placement if p[0] in arrays)),),
                    gpu_key, dtype)


def kernel_predictions(plan: Plan) -> list:
    """The performance model's :class:`~napkin.perfmodel.predict.KernelPrediction` of each kernel of
    ``plan`` with its family's launch (residency, roofline, latency chain, the launch facts the
    family states), as the planner predicted it; a kernel the model refuses is left out. For
    ``napkin cost --explain``.

    >>> from napkin.diagrams import library
    >>> plan = derive(library.get("softmax").with_dtype("bf16").bind(r=4096, x=4096), "h100").plan
    >>> [k.name for k in kernel_predictions(plan)] == [k.name for k in plan.kernels]
    True
    """
    from . import families as fam_registry
    from .select import predict_schedule, resolve_gpu

    g = resolve_gpu(plan.gpu)
    out = []
    for pk in plan.kernels:
        sub, kept = kernel_problem(plan.diagram, pk.kernel.boxes, pk.name)
        try:
            r = predict_schedule(sub, fam_registry.get(pk.family), _kernel_alone(sub, kept, pk.kernel, gpu_ref(g),
                                                                                  plan.dtype), g)
        except ScheduleError:
            continue
        if r.kernel is not None:
            out.append(r.kernel)
    return out


__all__ += ["kernel_predictions"]


def _with_fallback_note(plan: Plan) -> Plan:
    """The plan, saying aloud which kernels run on the scalar fallback."""
    slow = [k.name for k in plan.kernels if k.family == FALLBACK]
    if not slow:
        return plan
    return dataclasses.replace(
        plan, notes=(f"kernel(s) {', '.join(slow)} run on the scalar fallback (slow): no fast family builds them",))


__all__ += ["plan_schedule"]
