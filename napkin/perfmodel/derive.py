"""Derive the IO-aware algorithm: the Napkin method as a search.

The method, step by step (each step is a schedule, costed and printed):

1. **naive** — every box its own kernel (elementwise maps ride along as epilogues);
   every intermediate goes through HBM.
2. **fuse** — merge a kernel into its consumer wherever the merged kernel has a legal
   schedule that is predicted faster (the fusion theorem decides what is legal: a
   softmax joins the contraction over its axis, maps join anything woven over them).
3. **group** — tile the woven axes (``q → g_q``): inputs lacking a grouped axis are
   re-read once per group, so larger groups cut traffic; capacity caps them.
4. **stream** — walk an accumulable axis in chunks (``x → s_x``): memory falls from the
   whole axis to a chunk, which frees room for larger groups.

The last step searches integer tile sizes under the capacity, divisibility and
occupancy limits and keeps the schedule with the least predicted time. The result
is a :class:`Derivation`: every step with its H and M, the ranked candidates, and
why the winner wins.

>>> from napkin.diagrams import library
>>> der = derive(library.get("attention"), "h100", sizes={"q": 4096, "x": 4096, "d": 128})
>>> [s.title for s in der.steps]
['naive', 'fuse', 'group', 'stream']
>>> sorted(r.axis for r in der.best.kernels[0].relabels)
['q', 'x']
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import NapkinError, ScheduleError
from .cost import Cost, cost
from .hardware import GPU, get_gpu
from .legality import analyze, check_schedule
from .predict import SchedulePrediction, predict_schedule
from .schedule import Kernel, Relabel, Schedule

#: Tile sizes the search tries (then the axis size itself, when smaller or not a power of two).
TILE_SIZES = (16, 32, 64, 128, 256)
#: Small groups tried on grouped axes too (one row per block for row-wise ops, one head per block).
SMALL_GROUPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Candidate:
    """One schedule the search looked at: its cost and predicted time, or why it was refused."""

    schedule: Schedule
    cost: Cost | None
    prediction: SchedulePrediction | None
    refused: str | None = None

    @property
    def seconds(self) -> float:
        return self.prediction.seconds if self.prediction is not None else float("inf")

    def describe(self) -> str:
        """The relabellings of every kernel, e.g. ``q→g_q=128, x→s_x=64``."""
        parts = []
        for k in self.schedule.kernels:
            rel = ", ".join(f"{r.axis}→{r.symbol}={r.size}" for r in k.relabels) or "whole"
            parts.append(rel if len(self.schedule.kernels) == 1 else f"[{k.name}: {rel}]")
        return " ".join(parts)


@dataclass(frozen=True)
class Step:
    """One step of the method: its schedule, costs and a sentence on what changed.

    ``H`` and ``M`` are the symbolic transfer (at the block boundary, L2→SMEM) and
    the memory a block holds (SMEM), in axis-size and tile symbols, as the paper
    writes them; the candidate carries the numbers.
    """

    title: str
    candidate: Candidate
    note: str
    H: object = None
    M: object = None


@dataclass(frozen=True)
class Derivation:
    """The derivation of one diagram on one GPU: steps, ranking and the chosen schedule."""

    diagram_name: str
    gpu: GPU
    dtype: str
    sizes: dict
    steps: tuple[Step, ...]
    ranked: tuple[Candidate, ...]
    why: str
    thresholds: dict = field(default_factory=dict)
    hardware_notes: tuple[str, ...] = ()

    @property
    def best(self) -> Schedule:
        return self.ranked[0].schedule

    @property
    def best_candidate(self) -> Candidate:
        return self.ranked[0]

    def __str__(self) -> str:
        return format_derivation(self)

    def to_dict(self) -> dict:
        """JSON-safe form (a stable interface of ``napkin derive --json``)."""
        def cand(c: Candidate) -> dict:
            out = {"schedule": schedule_dict(c.schedule), "refused": c.refused}
            if c.cost is not None:
                out["levels"] = {k: v.to_dict() for k, v in c.cost.levels.items()}
                out["flops"] = float(c.cost.total_flops)
            if c.prediction is not None:
                out["predicted_seconds"] = c.prediction.seconds
                out["tflops"] = c.prediction.tflops
                out["bound"] = c.prediction.bound
            return out

        return {
            "diagram": self.diagram_name, "gpu": self.gpu.key, "dtype": self.dtype, "sizes": self.sizes,
            "steps": [{"title": s.title, "note": s.note, **cand(s.candidate)} for s in self.steps],
            "best": cand(self.ranked[0]), "ranked": [cand(c) for c in self.ranked],
            "why": self.why, "thresholds": self.thresholds, "hardware_notes": list(self.hardware_notes),
        }


def schedule_dict(s: Schedule) -> dict:
    """A schedule as plain data: kernels with their boxes and relabellings."""
    return {"kernels": [{
        "name": k.name, "boxes": list(k.boxes),
        "relabels": [{"axis": r.axis, "size": int(r.size), "level": r.level, "kind": r.kind,
                      "symbol": r.symbol} for r in k.relabels],
    } for k in s.kernels], "gpu": s.gpu, "dtype": s.dtype}


# ----------------------------------------------------------------------------- evaluation


def evaluate(schedule: Schedule, gpu: GPU) -> Candidate:
    """Cost and predict one schedule; a refused schedule keeps the reason."""
    try:
        check_schedule(schedule, gpu)
        c = cost(schedule, gpu)
        p = predict_schedule(schedule, gpu, the_cost=c)
    except ScheduleError as e:
        return Candidate(schedule, None, None, str(e))
    return Candidate(schedule, c, p)


def _plain_cost(schedule: Schedule, gpu: GPU) -> Candidate:
    """Cost without hardware checks (naive schedules hold whole arrays: they cannot run, but they cost)."""
    c = cost(schedule, gpu, l2_caching=False)
    return Candidate(schedule, c, None, None)


def rank_key(c: Candidate) -> tuple:
    """Order candidates by predicted time; near-ties (within 0.1%) go to less HBM traffic, then less SMEM."""
    if c.prediction is None:
        return (float("inf"),)
    time_bin = round(math.log(max(c.seconds, 1e-15)) / math.log(1.001))
    return (time_bin, float(c.cost.H_bytes("HBM")), float(c.cost.M_bytes("SMEM")))


# ----------------------------------------------------------------------------- search space


def kernel_subdiagram(diagram, boxes) -> "Diagram":
    """One kernel as a diagram of its own: its HBM inputs become input arrays, its stored arrays outputs.

    A kernel's cost depends only on what it reads and writes, so each kernel is searched alone.
    """
    from ..diagrams.diagram import Diagram
    from ..diagrams.ops import apply, array

    names = set(boxes)
    memo: dict[int, object] = {}
    inputs: dict[str, object] = {}
    for v in diagram.nodes:
        n = diagram.name_of(v)
        if n not in names:
            continue
        args = []
        for a in v.args:
            if id(a) in memo:
                args.append(memo[id(a)])
                continue
            an = diagram.name_of(a)
            if an not in inputs:
                inputs[an] = array(an, *a.axes, dtype=a.dtype)
            args.append(inputs[an])
        memo[id(v)] = apply(v.op, args, n)
    outs = []
    for v in diagram.nodes:
        if diagram.name_of(v) not in names:
            continue
        readers = diagram.consumers.get(id(v), ())
        if any(v is o for o in diagram.outputs) or any(diagram.name_of(c) not in names for c in readers):
            outs.append(memo[id(v)])
    return Diagram(diagram.name, outs, list(inputs.values()))


def _groupable_streamable(schedule: Schedule, index: int) -> tuple[list[str], list[str]]:
    """(axes a group may tile, axes a stream may walk) of one kernel, before the legality check.

    An axis a box contracts or normalises cannot be grouped; whether a stream has an
    accumulator is left to the legality rules when each candidate is evaluated.
    """
    plan = analyze(schedule)[index]
    own = {a for b in plan.boxes for a in b.op.own_axes()}
    return [a for a in plan.sizes if a not in own], list(plan.sizes)


def _sizes_for(n: int, small_ok: bool) -> list[int]:
    opts = [t for t in TILE_SIZES if t < n]
    opts.append(n)
    if small_ok:
        opts += [t for t in SMALL_GROUPS if t < n]
    return sorted(set(opts))


def kernel_options(schedule: Schedule, index: int, *, allow_group: bool = True, allow_stream: bool = True,
                   fixed: Mapping[str, tuple[int, str, str]] | None = None) -> list[tuple[Relabel, ...]]:
    """Every relabelling of one kernel the search tries (groups × at most one stream)."""
    sizes = analyze(schedule)[index].sizes
    groupable, streamable = _groupable_streamable(schedule, index)
    fixed = {a: v for a, v in (fixed or {}).items() if a in sizes}
    group_choices: list[list[Relabel | None]] = []
    for a in groupable:
        if a in fixed and fixed[a][2] == "group":
            group_choices.append([Relabel(a, fixed[a][0], fixed[a][1], "group")])
            continue
        if not allow_group:
            continue
        group_choices.append([None] + [Relabel(a, g, "SMEM", "group") for g in _sizes_for(sizes[a], True)
                                       if g < sizes[a] or g == 1])
    for a, (size, level, kind) in fixed.items():
        if kind == "group" and a not in groupable:
            group_choices.append([Relabel(a, size, level, "group")])  # refused with its reason when evaluated
    fixed_streams = [Relabel(a, size, level, "stream") for a, (size, level, kind) in fixed.items()
                     if kind == "stream"]
    stream_choices: list[Relabel | None] = [None]
    if fixed_streams:
        stream_choices = fixed_streams
    elif allow_stream:
        for a in streamable:
            stream_choices += [Relabel(a, t, "SMEM", "stream") for t in _sizes_for(sizes[a], False) if t < sizes[a]]
    out = []
    for combo in itertools.product(*group_choices) if group_choices else [()]:
        groups = tuple(r for r in combo if r is not None)
        for st in stream_choices:
            if st is not None and any(g.axis == st.axis for g in groups):
                continue
            out.append(groups + ((st,) if st is not None else ()))
    return out


def best_for_kernel(schedule: Schedule, index: int, gpu: GPU, *, allow_group=True, allow_stream=True,
                    fixed=None) -> tuple[Candidate, list[Candidate]]:
    """Search the relabellings of kernel ``index`` alone; (best, every candidate tried).

    Candidates are single-kernel schedules of the kernel's own sub-diagram.
    """
    k = schedule.kernels[index]
    sub = kernel_subdiagram(schedule.diagram, k.boxes)
    base = Schedule(sub, (Kernel(k.name, k.boxes, (), k.placement),), schedule.gpu, schedule.dtype)
    tried = []
    for rel in kernel_options(base, 0, allow_group=allow_group, allow_stream=allow_stream, fixed=fixed):
        tried.append(evaluate(Schedule(sub, (base.kernels[0].replace(relabels=rel),), schedule.gpu,
                                       schedule.dtype), gpu))
    ok = sorted((c for c in tried if c.refused is None), key=rank_key)
    if not ok:
        # The candidates with the fewest relabellings first: their refusal names the pinned constraint.
        by_size = sorted((c for c in tried if c.refused), key=lambda c: len(c.schedule.kernels[0].relabels))
        reasons = list(dict.fromkeys(c.refused for c in by_size))
        return Candidate(base, None, None, f"kernel {k.name}: no legal tiling fits: " + "; ".join(reasons[:3])
                         ), tried
    return ok[0], tried


def _with_relabels(schedule: Schedule, index: int, relabels) -> Schedule:
    ks = list(schedule.kernels)
    ks[index] = ks[index].replace(relabels=tuple(relabels))
    return Schedule(schedule.diagram, tuple(ks), schedule.gpu, schedule.dtype)


def best_relabelling(schedule: Schedule, gpu: GPU, **kw) -> tuple[Candidate, list[Candidate]]:
    """The best tiling of every kernel (each searched alone), evaluated as a whole.

    For a one-kernel schedule the candidates tried are returned as whole schedules too.
    """
    current = schedule
    tried_all: list[Candidate] = []
    for i in range(len(schedule.kernels)):
        best, tried = best_for_kernel(current, i, gpu, **kw)
        if best.refused is not None:
            return Candidate(current, None, None, best.refused), tried_all
        current = _with_relabels(current, i, best.schedule.kernels[0].relabels)
        if len(schedule.kernels) == 1:
            tried_all = [Candidate(_with_relabels(schedule, 0, c.schedule.kernels[0].relabels), c.cost,
                                   c.prediction, c.refused) for c in tried]
    whole = evaluate(current, gpu)
    return whole, tried_all


# ----------------------------------------------------------------------------- fusion


def _reads_from(schedule: Schedule, k: int, i: int) -> bool:
    """Does kernel k read an array computed by kernel i?"""
    d = schedule.diagram
    made = set(schedule.kernels[i].boxes)
    boxes = set(schedule.kernels[k].boxes)
    return any(d.name_of(a) in made for v in d.nodes if d.name_of(v) in boxes for a in v.args)


def _merge(schedule: Schedule, i: int, j: int) -> tuple[Schedule, int] | None:
    """Merge kernels i < j into one (boxes in diagram order, no relabels yet) and its index, or None
    when a kernel between them forbids it: the merged kernel runs at j if nothing between reads i,
    else at i if j reads nothing computed between."""
    d = schedule.diagram
    between = range(i + 1, j)
    if not any(_reads_from(schedule, k, i) for k in between):
        at = j
    elif not any(_reads_from(schedule, j, k) for k in between):
        at = i
    else:
        return None
    order = {d.name_of(v): n for n, v in enumerate(d.nodes)}
    ks = list(schedule.kernels)
    boxes = tuple(sorted(ks[i].boxes + ks[j].boxes, key=order.__getitem__))
    merged = Kernel(ks[i].name, boxes)
    ks[at] = merged
    del ks[j if at == i else i]
    return Schedule(d, tuple(ks), schedule.gpu, schedule.dtype), (at if at == i else j - 1)


def start_partition(diagram, gpu: str, dtype: str) -> Schedule:
    """The naive kernels fusion starts from: every contraction, reduction, softmax and norm its own
    kernel; elementwise maps join their producer's kernel (epilogues); a rename joins the kernel of its
    consumer, which then reads the renamed view straight from HBM."""
    kernels: list[list[str]] = []
    where: dict[int, int] = {}
    pending: dict[int, list[str]] = {}
    consumers = diagram.consumers
    for v in diagram.nodes:
        name = diagram.name_of(v)
        if v.op.kind == "rename" and len(consumers.get(id(v), ())) == 1 and not any(
                v is o for o in diagram.outputs):
            pending[id(v)] = pending.pop(id(v.args[0]), []) + [name]
            continue
        carried = [n for a in v.args for n in pending.pop(id(a), [])]
        producers = [where[id(a)] for a in v.args if id(a) in where]
        if v.op.kind in ("map", "rename") and producers:
            k = max(producers)
        else:
            kernels.append([])
            k = len(kernels) - 1
        kernels[k] += carried + [name]
        where[id(v)] = k
    return Schedule(diagram, tuple(Kernel(_kernel_name(diagram, b), tuple(b)) for b in kernels), gpu, dtype)


def _kernel_name(diagram, boxes: list[str]) -> str:
    ops = {diagram.name_of(v): v for v in diagram.nodes}
    main = [b for b in boxes if ops[b].op.kind not in ("map", "rename")]
    return main[0] if main else boxes[0]


def _producer_consumer_pairs(schedule: Schedule) -> list[tuple[int, int]]:
    d = schedule.diagram
    where = {b: n for n, k in enumerate(schedule.kernels) for b in k.boxes}
    pairs = set()
    for v in d.nodes:
        j = where[d.name_of(v)]
        for a in v.args:
            if a.is_input:
                continue
            i = where.get(d.name_of(a))
            if i is not None and i != j:
                pairs.add((i, j))
    return sorted(pairs)


def fuse_greedily(schedule: Schedule, gpu: GPU, progress: Callable[[str], None] | None = None
                  ) -> tuple[Candidate, list[str]]:
    """Merge adjacent producer/consumer kernels while the merged kernel has a legal tiling that is
    predicted faster than the two apart. Each kernel is searched alone, so a merge re-searches one."""
    times = []
    relabeled = schedule
    for i in range(len(schedule.kernels)):
        best, _ = best_for_kernel(relabeled, i, gpu)
        if best.refused is not None:
            raise ScheduleError(best.refused)
        relabeled = _with_relabels(relabeled, i, best.schedule.kernels[0].relabels)
        times.append(best.seconds)
    log: list[str] = []
    improved = True
    while improved and len(relabeled.kernels) > 1:
        improved = False
        for i, j in _producer_consumer_pairs(relabeled):
            got = _merge(relabeled, i, j) if i < j else None
            if got is None:
                continue
            merged, at = got
            try:
                analyze(merged)
            except ScheduleError:
                continue
            best, _ = best_for_kernel(merged, at, gpu)
            if best.refused is None and best.seconds < (times[i] + times[j]) * 0.999:
                a, b = relabeled.kernels[i].name, relabeled.kernels[j].name
                log.append(f"fuse {a} + {b}: {(times[i] + times[j]) * 1e6:.1f} → {best.seconds * 1e6:.1f} µs")
                if progress:
                    progress(log[-1])
                relabeled = _with_relabels(merged, at, best.schedule.kernels[0].relabels)
                rest = [t for n, t in enumerate(times) if n not in (i, j)]
                rest.insert(at, best.seconds)
                times = rest
                improved = True
                break
    return evaluate(relabeled, gpu), log


# ----------------------------------------------------------------------------- derive


def derive(diagram, gpu: str | GPU = "h100", dtype: str = "bf16", sizes: Mapping[str, int] | None = None, *,
           fixed: Mapping[str, tuple[int, str, str]] | None = None, top: int = 5,
           progress: Callable[[str], None] | None = None) -> Derivation:
    """Derive the IO-aware schedule of ``diagram`` on ``gpu`` (see the module docstring).

    ``fixed`` pins relabellings the user chose: ``{"q": (128, "SMEM", "group"),
    "x": (64, "SMEM", "stream")}``; everything else is searched.
    """
    g = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    d = diagram.bind(sizes) if sizes else diagram
    if not d.is_bound:
        missing = [n for n, a in d.axes.items() if not a.is_bound]
        raise NapkinError(f"derive needs a size for every axis; missing: {', '.join(missing)} "
                          f"(for example -s {missing[0]}=4096)")
    d = d.with_dtype(dtype)
    say = progress or (lambda _msg: None)

    naive_s = Schedule.unfused(d, gpu=g.key, dtype=dtype)
    naive = _plain_cost(naive_s, g)
    say("naive: costed")

    fused_whole = Schedule(d, (Kernel("fused", tuple(d.name_of(v) for v in d.nodes)),), g.key, dtype)
    try:
        analyze(fused_whole)
        fuse_all_ok = True
    except ScheduleError as e:
        fuse_all_ok = False
        fuse_refusal = str(e)

    steps: list[Step] = [Step("naive", naive, "every box its own kernel; intermediates go through HBM",
                              *_symbolic(naive_s))]

    if fuse_all_ok:
        final, tried = best_relabelling(fused_whole, g, fixed=fixed)
        if final.refused is not None and fixed:
            pinned = ", ".join(f"{kind} {a}={size}@{level}" for a, (size, level, kind) in fixed.items())
            raise ScheduleError(f"{d.name}: the pinned relabelling ({pinned}) cannot run: "
                                + final.refused.split(": no legal tiling fits: ", 1)[-1])
        if final.refused is not None:
            fuse_all_ok = False
            fuse_refusal = final.refused
    if fuse_all_ok:
        fused = _plain_cost(fused_whole, g)
        dh = float(naive.cost.H("HBM")) - float(fused.cost.H("HBM"))
        steps.append(Step("fuse", fused, f"all boxes in one kernel: intermediates never reach HBM "
                                         f"(H falls by {dh:.4g} elements); the whole problem must fit",
                          *_symbolic(fused_whole)))
        only_groups = _keep(final.schedule, "group")
        grouped = evaluate(only_groups, g)
        if grouped.refused is not None:
            grouped = Candidate(only_groups, _plain_cost(only_groups, g).cost, None, grouped.refused)
        steps.append(Step("group", grouped, _group_note(grouped), *_symbolic(only_groups)))
        steps.append(Step("stream", final, _stream_note(final, grouped), *_symbolic(final.schedule)))
        log = []
    else:
        if fixed:
            raise ScheduleError(f"{d.name}: --group/--stream apply to a diagram that fuses into one kernel; "
                                f"this one cannot ({fuse_refusal.split(';')[0]})")
        say(f"cannot fuse everything ({fuse_refusal.split(';')[0]}); fusing greedily")
        final, log = fuse_greedily(start_partition(d, g.key, dtype), g, say)
        steps.append(Step("fuse", final, "greedy fusion of producer/consumer kernels: " + ("; ".join(log)
                                                                                          or "nothing to gain")))
        tried = []
        grouped = final
    if final.refused is not None:
        raise ScheduleError(f"derive found no legal schedule for {d.name} on {g.name}: {final.refused}")

    ranked = sorted({id(c): c for c in [final, *tried] if c.refused is None}.values(), key=rank_key)
    ranked = _dedupe(ranked)[:max(1, top)]
    why = _why(ranked, g)
    from .occupancy import compute_bound_thresholds

    th = compute_bound_thresholds(g, dtype if dtype in ("fp16", "bf16", "fp8") else "fp16")
    thresholds = {"flops_per_value": th.flops_per_value, "matmul_min_contraction": th.matmul_min_contraction,
                  "attention_min_g_q": th.attention_min_g_q, "matmul_min_memory_kib": th.matmul_min_memory_kib}
    return Derivation(d.name, g, dtype, dict(d.sizes), tuple(steps), tuple(ranked), why, thresholds,
                      _hardware_notes(d, g))


def _is_attention(diagram) -> bool:
    """A softmax whose output feeds a contraction over the same axis (the streamable pair)."""
    for v in diagram.nodes:
        if v.op.kind == "contract":
            for a in v.args:
                if a.op.kind == "softmax" and a.op.over in v.op.own_axes():
                    return True
    return False


def _hardware_notes(diagram, gpu: GPU) -> tuple[str, ...]:
    """For attention on Hopper, the paper's warpgroup analysis (DESIGN §4.4) at this head dim."""
    if not (gpu.has_wgmma and _is_attention(diagram) and "d" in diagram.axes):
        return ()
    from .occupancy import hopper_attention_analysis

    try:
        a = hopper_attention_analysis(gpu, w_q=128, s_x=64, d=int(diagram.axes["d"].size))
    except NapkinError:
        return ()
    return ("the paper's Hopper configuration (wgmma, QK in fp8, PV in fp16):",
            *a.summary().splitlines())


def _keep(schedule: Schedule, kind: str) -> Schedule:
    """The schedule with only the relabellings of one kind."""
    ks = tuple(k.replace(relabels=tuple(r for r in k.relabels if r.kind == kind)) for k in schedule.kernels)
    return Schedule(schedule.diagram, ks, schedule.gpu, schedule.dtype)


def _symbolic(schedule: Schedule) -> tuple[object, object]:
    """(H at the block boundary, M per block) with axis sizes and tiles as symbols."""
    ks = tuple(k.replace(relabels=tuple(Relabel(r.axis, None, r.level, r.kind) for r in k.relabels))
               for k in schedule.kernels)
    sym = Schedule(schedule.diagram, ks, None, schedule.dtype)
    try:
        c = cost(sym, False, symbolic=True, l2_caching=False)
    except (ScheduleError, TypeError, ValueError):
        return None, None
    return c.H("L2"), c.M("SMEM")


def _only(fixed, kind):
    return {a: v for a, v in (fixed or {}).items() if v[2] == kind}


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen, out = set(), []
    for c in cands:
        key = c.describe()
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _group_note(c: Candidate) -> str:
    if c.refused is not None:
        return f"with these groups but no stream the block does not fit: {c.refused.split(';')[0]}"
    return (f"best grouping without streaming: {c.describe()}; inputs lacking a grouped axis are re-read "
            f"per group")


def _stream_note(c: Candidate, grouped: Candidate) -> str:
    if c.refused is not None:
        return c.refused
    streams = [r for k in c.schedule.kernels for r in k.streams]
    if not streams:
        return "streaming does not help here: " + c.describe()
    s = streams[0]
    return (f"stream {s.axis} in chunks of {s.size}: memory holds a chunk instead of the whole axis, "
            f"so groups can grow; chosen {c.describe()}")


def _why(ranked: list[Candidate], gpu: GPU) -> str:
    best = ranked[0]
    p = best.prediction
    k = max(p.kernels, key=lambda kk: kk.seconds)
    text = (f"{best.describe()} is predicted fastest: {p.seconds * 1e6:.1f} µs ({p.tflops:.0f} TFLOP/s, "
            f"{p.gbps:.0f} GB/s of HBM), bound by {p.bound}; {k.blocks} blocks, {k.blocks_per_sm} per SM "
            f"(limited by {k.limited_by}), {k.smem_bytes / 1024:.0f} KiB SMEM and {k.regs_per_thread} registers "
            f"per thread.")
    if len(ranked) > 1:
        r = ranked[1]
        text += (f" Runner-up {r.describe()}: {r.seconds * 1e6:.1f} µs "
                 f"({(r.seconds / p.seconds - 1) * 100:.1f}% slower, bound by {r.prediction.bound}).")
    return text


# ----------------------------------------------------------------------------- printing


def _fmt_num(x) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


def format_derivation(der: Derivation) -> str:
    """The derivation as the method prints it: naive → fuse → group → stream, then the winner."""
    lines = [f"derive {der.diagram_name} on {der.gpu.name} ({der.dtype}); sizes "
             + ", ".join(f"{k}={v}" for k, v in der.sizes.items())]
    for i, s in enumerate(der.steps, 1):
        c = s.candidate
        lines.append(f"{i}. {s.title}: {c.describe()}")
        if s.H is not None:
            lines.append(f"   H = {s.H}")
            lines.append(f"   M = {s.M}")
        if c.cost is not None:
            lines.append(f"   H[HBM] = {_fmt_num(c.cost.H('HBM'))} elements ({_fmt_num(c.cost.H_bytes('HBM'))} B), "
                         f"H[L2→SMEM] = {_fmt_num(c.cost.H('L2'))}, M[SMEM] = {_fmt_num(c.cost.M_bytes('SMEM'))} B per "
                         f"block")
        if c.prediction is not None:
            lines.append(f"   predicted {c.prediction.seconds * 1e6:.1f} µs, bound by {c.prediction.bound}")
        lines.append(f"   {s.note}")
    lines.append("candidates (best first):")
    for c in der.ranked:
        lines.append(f"   {c.seconds * 1e6:9.1f} µs  {c.prediction.tflops:7.1f} TFLOP/s  {c.describe()}")
    t = der.thresholds
    if t:
        lines.append(f"compute-bound threshold: {t['flops_per_value']:.1f} FLOP per value moved "
                     f"(matmul needs b ≥ {t['matmul_min_contraction']:.0f}, attention g_q ≥ "
                     f"{t['attention_min_g_q']:.0f}; a square-tiled matmul needs {t['matmul_min_memory_kib']:.0f} "
                     f"KiB of fast memory)")
    lines.append("why: " + der.why)
    lines += list(der.hardware_notes)
    return "\n".join(lines)
