"""A CPU interpreter that RUNS a scheduled diagram the way a kernel would, and counts what moves.

:func:`interpret` executes a :class:`~napkin.perfmodel.schedule.Schedule` in numpy (float64),
kernel by kernel, group by group (one loop iteration per thread block, slicing tiles of
``g_a`` along every grouped axis; a partial last group holds only its real elements) and,
inside a group, chunk by chunk along the streamed axis with real accumulators: sums for
contractions and sum/mean reductions (mean divides at the end), max/min for max/min, and
the online softmax — running max μ, running sum z and running output o, every chunk
rescaling by exp(μ_old − μ_new) — for a softmax followed by a contraction over the axis.

It counts every element moved between levels:

- ``HBM → SMEM`` loads of kernel inputs (inputs without the streamed axis once per group,
  the others once per step) and ``SMEM → HBM`` stores of kernel outputs; their sum is
  ``transfers["L2"]`` (and ``transfers["HBM"]``: no L2 reuse here), to be compared with the
  model's ``cost(..., l2_caching=False).H("L2")``;
- ``SMEM ↔ RF`` reads of SMEM-resident tiles by every box that uses them (once per group if
  the tile does not carry the streamed axis, else every step; times the number of warp
  tiles along RF-grouped axes the tile lacks) and writes of SMEM-resident arrays a box
  computes (accumulators once, when complete): ``transfers["SMEM"]``;

and the resident memory per level in every column, whose maximum is ``memory_peak``.
No torch is imported.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Schedule
>>> d = library.get("attention").bind(q=37, x=45, d=16)
>>> r = interpret(Schedule.fused(d, groups={"q": 16}, streams={"x": 16}), seed=0)
>>> r.transfers["L2"] == 2 * 37 * 16 + 2 * 45 * 16 * 3
True
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..diagrams.functions import ArrayOps, get_function
from ..errors import ScheduleError
from .legality import KernelPlan, analyze
from .masks import skippable_mask, visited
from .schedule import Schedule

__all__ = ["InterpretResult", "KernelRun", "interpret"]

_NP = ArrayOps("numpy")


@dataclass(frozen=True)
class KernelRun:
    """What one kernel moved and held."""

    name: str
    groups: int
    steps: int
    loads: int            # HBM → SMEM/RF elements
    stores: int           # → HBM elements
    smem_reads: int       # SMEM → RF elements
    smem_writes: int      # RF → SMEM elements
    memory_peak: dict     # level -> elements at the fullest column

    @property
    def transfers(self) -> dict[str, int]:
        t = self.loads + self.stores
        return {"HBM": t, "L2": t, "SMEM": self.smem_reads + self.smem_writes}


@dataclass(frozen=True)
class InterpretResult:
    """Outputs (name → float64 array), element counts per level, per-kernel detail, memory peaks."""

    outputs: dict
    transfers: dict
    per_kernel: tuple[KernelRun, ...]
    memory_peak: dict
    arrays: dict = field(default_factory=dict, repr=False)   # every array written to HBM


# ----------------------------------------------------------------------------- helpers


def _align(t: np.ndarray, have: tuple[str, ...], want: tuple[str, ...]) -> np.ndarray:
    """View ``t`` (axes ``have``) as broadcastable to axes ``want``."""
    order = [have.index(n) for n in want if n in have]
    if order != list(range(len(order))):
        t = np.transpose(t, order)
    shape, it = [], iter(t.shape)
    for n in want:
        shape.append(next(it) if n in have else 1)
    return t.reshape(shape)


def _einsum(args: list[np.ndarray], arg_axes: list[tuple[str, ...]], out_axes: tuple[str, ...]) -> np.ndarray:
    letters: dict[str, str] = {}
    for axes in (*arg_axes, out_axes):
        for a in axes:
            if a not in letters:
                if len(letters) == len(string.ascii_letters):
                    raise ScheduleError(f"the interpreter runs contractions over at most {len(string.ascii_letters)} "
                                        f"axes (einsum's subscripts); this one has more ({', '.join(letters)}, ...)")
                letters[a] = string.ascii_letters[len(letters)]
    spec = ",".join("".join(letters[a] for a in ax) for ax in arg_axes) + "->" + "".join(letters[a] for a in out_axes)
    return np.einsum(spec, *args, optimize=len(args) > 2)


def _safe_shift(c: np.ndarray) -> np.ndarray:
    """A shift as the kernels subtract it: ±inf replaced by 0 (NaN stays NaN)."""
    return np.where(np.isinf(c), 0.0, c)


def _ranges(n: int, g: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + g, n)) for lo in range(0, n, g)]


class _Run:
    """Executes one kernel of a plan; HBM is shared between kernels."""

    def __init__(self, plan: KernelPlan, n: dict[str, int], hbm: dict, param_sizes: dict):
        self.p = plan
        self.n = n
        self.hbm = hbm
        self.param_sizes = param_sizes
        self.loads = self.stores = self.reads = self.writes = 0
        self.peak = {"SMEM": 0, "RF": 0}
        self.s = plan.stream[0] if plan.stream else None
        self.ss = int(plan.stream[1]) if plan.stream else None
        self.G = {a: int(g) for a, g in plan.groups.items()}
        self.W = {a: int(w) for a, w in plan.rf_groups.items()}
        self.res_by_key = {r.key: r for r in plan.residents}
        self.mask = skippable_mask(plan, n)
        # sums of exp(x − running max) (legality.RescaledSum): their shift boxes, and each sum's
        # shift as the previous step left it
        self.shift_boxes = {id(r.shift_box): r for r in plan.rescaled.values()}
        self.shift_before: dict = {}
        # an rmsnorm over the streamed axis, its row scale factored out of the contraction it feeds
        # (the RMSNorm -> linear prologue): each such norm's sum of squares so far, and which values
        # still owe that norm's scale (the norm, products of it, the contraction's accumulator)
        self.sumsq: dict = {}
        self.owes: dict = {}

    # -- context
    def extent(self, a: str, ranges: dict) -> int:
        if a in ranges:
            lo, hi = ranges[a]
            return hi - lo
        return self.n[a]

    def rf_mult(self, axes: tuple[str, ...], ranges: dict) -> int:
        m = 1
        for a, w in self.W.items():
            if a not in axes:
                m *= -(-self.extent(a, ranges) // w)
        return m

    def name(self, v) -> str:
        return self.p.name_of(v)

    def key(self, a):
        """(env key, level, phase) of an array as box arguments see it."""
        r, internal = self.p.resolve(a)
        k = id(r) if internal else id(a)
        return k, self.p.level[k], self.p.phase[k]

    # -- HBM
    def hbm_data(self, v) -> np.ndarray:
        w = v
        while self.name(w) not in self.hbm:
            if w.op.kind != "rename":
                raise ScheduleError(f"interpreter: {self.name(v)} is read before any kernel wrote it")
            w = w.args[0]
        return self.hbm[self.name(w)]

    def load(self, v, ranges: dict) -> np.ndarray:
        data = self.hbm_data(v)
        idx = tuple(slice(*ranges[a]) if a in ranges else slice(None) for a in v.axis_names)
        tile = np.array(data[idx], dtype=np.float64)
        self.loads += tile.size
        return tile

    def store(self, v, data: np.ndarray, ranges: dict) -> None:
        name = self.name(v)
        if name not in self.hbm:
            self.hbm[name] = np.full(tuple(self.n[a] for a in v.axis_names), np.nan)
        idx = tuple(slice(*ranges[a]) if a in ranges else slice(None) for a in v.axis_names)
        self.hbm[name][idx] = data
        self.stores += data.size

    # -- memory
    def measure(self, col: int, live: dict) -> None:
        tot = {"SMEM": 0, "RF": 0}
        for key, arr in live.items():
            r = self.res_by_key[key]
            if r.start <= col <= r.end and r.level in tot:
                tot[r.level] += int(np.size(arr))
        for lv, t in tot.items():
            self.peak[lv] = max(self.peak[lv], t)

    # -- boxes
    def run_box(self, b, env: dict, acc: dict, online: dict, ranges: dict, first_step: bool, phase: str):
        p = self.p
        op = b.op
        args = []
        for a in b.args:
            k, lvl, ph = self.key(a)
            args.append(env[k])
        # SMEM → RF reads, once per distinct argument
        for a in dict.fromkeys(b.args):
            k, lvl, ph = self.key(a)
            if lvl != "SMEM":
                continue
            if phase == "body" and ph in ("pre", "acc", "running") and not first_step:
                # an invariant tile stays in registers across steps, as does a running max (or
                # its zero_inf) that the shift of a rescaled sum reads
                continue
            self.reads += int(np.size(env[k])) * self.rf_mult(a.axis_names, ranges)
        vph = p.phase[id(b)]
        arg_axes = [a.axis_names for a in b.args]
        kind = op.kind
        owing = [self.owes[id(a)] for a in b.args if id(a) in self.owes]
        owed = set(owing)
        if owed and (kind not in ("contract", "map") or (kind == "map" and op.fn not in ("mul", "scale"))
                     or len(owing) > 1):  # (two owing factors would owe the scale twice)
            raise ScheduleError(f"interpreter: {op.kind} {getattr(op, 'fn', '')!s} reads a value that still owes its "
                                "rmsnorm's row scale; only products and the contraction carry it")
        if owed:
            self.owes[id(b)] = owed.pop()
        if kind == "contract":
            onl = [i for i, a in enumerate(b.args) if id(a) in online]
            if vph == "acc":
                partial = _einsum(args, arg_axes, b.axis_names)
                if onl:
                    st = online[id(b.args[onl[0]])]
                    P = b.args[onl[0]]
                    rows = tuple(x for x in P.axis_names if x != self.s)
                    alpha = _align(st["alpha"], rows, b.axis_names)
                    acc[id(b)] = alpha * acc[id(b)] + partial
                else:
                    acc[id(b)] = acc[id(b)] + partial
                env[id(b)] = acc[id(b)]
                return
            out = _einsum(args, arg_axes, b.axis_names)
        elif kind == "map":
            f = get_function(op.fn)
            xs = [_align(t, ax, b.axis_names) for t, ax in zip(args, arg_axes)]
            if id(b) in self.shift_boxes and self.shift_boxes[id(b)].exact:
                # x − (running max): 0 where the max is still ±inf, as the kernel subtracts
                xs[1] = _safe_shift(xs[1])
            idx = []
            for a in op.index_axes:
                lo = ranges[a][0] if a in ranges else 0
                grid = np.arange(lo, lo + self.extent(a, ranges))
                idx.append(_align(grid, (a,), b.axis_names))
            nn = [self.n[a] for a in op.index_axes]
            out = f.impl(_NP, xs, op.param_values(self.param_sizes), idx, nn)
            shape = tuple(self.extent(a, ranges) for a in b.axis_names)
            out = np.array(np.broadcast_to(np.asarray(out, dtype=np.float64), shape))
        elif kind == "reduce":
            (x,) = args
            ax = b.args[0].axis_names.index(op.over)
            if vph == "acc":
                if id(b) in p.rescaled:  # Σ exp(x − c): what was summed so far moves to the new shift
                    r = p.rescaled[id(b)]
                    old, new = (_safe_shift(_align(v, r.shift.axis_names, b.axis_names))
                                for v in (self.shift_before[id(b)], env[id(r.shift)]))
                    alpha = np.where(old == new, 1.0, np.exp(np.where(old == new, 0.0, old - new)))
                    prev = acc[id(b)]
                    acc[id(b)] = np.where(prev == 0, 0.0, prev * alpha) + x.sum(ax)
                elif op.how in ("sum", "mean"):
                    acc[id(b)] = acc[id(b)] + x.sum(ax)
                elif op.how == "max":
                    acc[id(b)] = np.maximum(acc[id(b)], x.max(ax))
                else:
                    acc[id(b)] = np.minimum(acc[id(b)], x.min(ax))
                env[id(b)] = acc[id(b)]
                return
            out = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op.how](x, axis=ax)
        elif kind == "softmax":
            (x,) = args
            ax = b.axis_names.index(op.over)
            if vph == "online":
                st = online[id(b)]
                m_new = np.maximum(st["max"], x.max(axis=ax))
                m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
                st["alpha"] = np.exp(st["max"] - m_safe)
                pt = np.exp(x - np.expand_dims(m_safe, ax))
                st["sum"] = st["alpha"] * st["sum"] + pt.sum(axis=ax)
                st["max"] = m_new
                out = pt
            else:
                m = x.max(axis=ax, keepdims=True)
                e = np.exp(x - m)
                out = e / e.sum(axis=ax, keepdims=True)
        elif kind == "norm":
            (x,) = args
            ax = b.axis_names.index(op.over)
            if phase == "body" and op.over == self.s:
                if op.how != "rmsnorm":
                    raise ScheduleError(f"interpreter: {op.how} over the streamed axis {self.s!r} has no rule "
                                        "here (only an rmsnorm's row scale factors out of a contraction)")
                # the chunk passes unscaled; its squares add to the row's sum, and the scale
                # rsqrt(sum / n + eps) multiplies the contraction's sum once every chunk is in
                sq = (x * x).sum(ax)
                self.sumsq[id(b)] = sq if first_step else self.sumsq[id(b)] + sq
                self.owes[id(b)] = b
                env[id(b)] = x
                return
            if op.how == "layernorm":
                mean = x.mean(ax, keepdims=True)
                var = ((x - mean) ** 2).mean(ax, keepdims=True)
                out = (x - mean) / np.sqrt(var + op.eps)
            else:
                out = x / np.sqrt((x * x).mean(ax, keepdims=True) + op.eps)
        else:  # pragma: no cover - renames are not columns
            raise ScheduleError(f"interpreter: no rule for box {op.kind!r}")
        env[id(b)] = out
        if p.level[id(b)] == "SMEM":
            self.writes += int(out.size) * self.rf_mult(b.axis_names, ranges)

    # -- one kernel
    def _q_range(self, ranges: dict) -> tuple[int, int]:
        q_axis = self.mask[0]
        return ranges.get(q_axis, (0, self.n[q_axis]))

    def run(self) -> KernelRun:
        p = self.p
        s = self.s
        grouped = list(self.G)
        tiles = [_ranges(self.n[a], self.G[a]) for a in grouped]
        chunks = _ranges(self.n[s], self.ss) if s else [None]
        pre_cols = p.columns[:p.n_pre]
        body_cols = p.columns[p.n_pre:p.n_pre + p.n_body]
        post_cols = p.columns[p.n_pre + p.n_body:]
        col = {id(b): i for i, b in enumerate(p.columns)}
        n_groups = 0
        for combo in itertools.product(*tiles):
            n_groups += 1
            ranges = dict(zip(grouped, combo))
            env: dict = {}
            live: dict = {}
            acc: dict = {}
            online: dict = {}
            for a in p.inputs:
                if p.phase[id(a)] == "pre":
                    env[id(a)] = self.load(a, ranges)
                    live[self.name(a)] = env[id(a)]
            for b in pre_cols:
                self.run_box(b, env, acc, online, ranges, True, "pre")
                live[self.name(b)] = env[id(b)]
                self.measure(col[id(b)], live)
            if body_cols:
                # accumulators and online-softmax state, allocated before the loop
                for b in body_cols:
                    ph = p.phase[id(b)]
                    shape = tuple(self.extent(a, ranges) for a in b.axis_names)
                    if ph == "acc":
                        init = 0.0
                        if b.op.kind == "reduce" and b.op.how == "max":
                            init = -np.inf
                        elif b.op.kind == "reduce" and b.op.how == "min":
                            init = np.inf
                        acc[id(b)] = np.full(shape, init)
                        env[id(b)] = acc[id(b)]
                        live[self.name(b)] = acc[id(b)]
                    elif ph == "online":
                        rows = tuple(self.extent(a, ranges) for a in b.axis_names if a != s)
                        online[id(b)] = {"max": np.full(rows, -np.inf), "sum": np.zeros(rows)}
                        live[f"{self.name(b)}.max"] = online[id(b)]["max"]
                        live[f"{self.name(b)}.sum"] = online[id(b)]["sum"]
                first = True
                for chunk in chunks:
                    if self.mask is not None and not visited(self.mask[2:], self._q_range(ranges), chunk):
                        continue  # every score of this tile is masked: the kernel skips it
                    rs = {**ranges, s: chunk}
                    for a in p.inputs:
                        if p.phase[id(a)] == "chunk":
                            env[id(a)] = self.load(a, rs)
                            live[self.name(a)] = env[id(a)]
                    # the shifts of the rescaled sums as the last step left them (the max's identity
                    # before the first)
                    for b_id, r in p.rescaled.items():
                        self.shift_before[b_id] = env[id(r.shift)] if not first else np.full(
                            tuple(self.extent(a, ranges) for a in r.shift.axis_names), -np.inf)
                    for b in body_cols:
                        self.run_box(b, env, acc, online, rs, first, "body")
                        live[self.name(b)] = env[id(b)]
                        if id(b) in online:
                            live[f"{self.name(b)}.max"] = online[id(b)]["max"]
                            live[f"{self.name(b)}.sum"] = online[id(b)]["sum"]
                        self.measure(col[id(b)], live)
                    for v in p.stores:
                        if p.phase[id(v)] == "chunk":
                            self.store(v, env[id(v)], rs)
                    for a in p.inputs:
                        if p.phase[id(a)] == "chunk":
                            live.pop(self.name(a), None)
                    for b in body_cols:
                        if p.phase[id(b)] in ("chunk", "online"):
                            live.pop(self.name(b), None)
                    first = False
                # finalise accumulators
                for b in body_cols:
                    if p.phase[id(b)] != "acc":
                        continue
                    val = acc[id(b)]
                    if b.op.kind == "reduce" and b.op.how == "mean":
                        val = val / self.n[b.op.over]
                    r = p.rescaled.get(id(b))
                    if r is not None and r.exact:  # x − m is NaN at an infinite max
                        val = np.where(np.isfinite(_align(env[id(r.max)], r.max.axis_names, b.axis_names)), val, np.nan)
                    if b.op.kind == "contract":
                        onl = [a for a in b.args if id(a) in online]
                        if onl:
                            P = onl[0]
                            rows = tuple(x for x in P.axis_names if x != s)
                            val = val / _align(online[id(P)]["sum"], rows, b.axis_names)
                        if id(b) in self.owes:  # the rmsnorm's row scale, factored out of the sum
                            nb = self.owes.pop(id(b))
                            scale = 1.0 / np.sqrt(self.sumsq[id(nb)] / self.n[s] + nb.op.eps)
                            val = val * _align(scale, tuple(x for x in nb.axis_names if x != s), b.axis_names)
                    env[id(b)] = val
                    live[self.name(b)] = val
                    if p.level[id(b)] == "SMEM":
                        self.writes += int(val.size) * self.rf_mult(b.axis_names, ranges)
            for b in post_cols:
                self.run_box(b, env, acc, online, ranges, True, "post")
                live[self.name(b)] = env[id(b)]
                self.measure(col[id(b)], live)
            for v in p.stores:
                if p.phase[id(v)] != "chunk":
                    self.store(v, env[id(v)], ranges)
        steps = len(chunks) if s else 1
        return KernelRun(p.name, n_groups, steps, self.loads, self.stores, self.reads, self.writes, dict(self.peak))


# ----------------------------------------------------------------------------- entry point


def interpret(schedule: Schedule, inputs: Mapping[str, np.ndarray] | None = None, *,
              sizes: Mapping[str, int] | None = None, seed: int | None = None) -> InterpretResult:
    """Run ``schedule`` on ``inputs`` (name → array; missing ones drawn from N(0, 1) with ``seed``).

    ``sizes`` binds axis and tile sizes; unbound axes are also bound from the input shapes.
    Returns the outputs, the elements moved per level (``"HBM"``/``"L2"``: loads + stores at the
    block boundary, ``"SMEM"``: SMEM↔RF), per-kernel detail and the memory peaks (elements).
    A tile larger than its axis runs over the axis alone (:meth:`Schedule.clipped_view`), so a
    derived plan runs at any size.
    """
    sched = schedule.bind(sizes) if sizes else schedule
    d = sched.diagram
    inputs = {k: np.asarray(v, dtype=np.float64) for k, v in (inputs or {}).items()}
    unknown = set(inputs) - set(d.input_names)
    if unknown:
        raise ScheduleError(f"diagram {d.name!r} has no input {sorted(unknown)}; inputs are {list(d.input_names)}")
    bind = {}
    for v in d.inputs:
        if v.name in inputs:
            arr = inputs[v.name]
            if arr.ndim != len(v.axes):
                raise ScheduleError(f"input {v.label()}: expected {len(v.axes)} dimensions, got shape {arr.shape}")
            for ax, m in zip(v.axes, arr.shape):
                if ax.is_bound and ax.size != m:
                    raise ScheduleError(f"input {v.label()}: axis {ax.name!r} has size {ax.size} but the array has {m}")
                if not ax.is_bound:
                    if bind.setdefault(ax.name, int(m)) != m:
                        raise ScheduleError(f"input {v.label()}: axis {ax.name!r} has two sizes")
    if bind:
        sched = sched.bind(bind)
        d = sched.diagram
    if not d.is_bound:
        free = [n for n, a in d.axes.items() if not a.is_bound]
        raise ScheduleError(f"interpret needs sizes for axes {', '.join(free)} (sizes= or input arrays)")
    for k in sched.kernels:
        for r in k.relabels:
            if r.is_symbolic:
                raise ScheduleError(f"interpret needs a numeric size for {r.symbol} (pass sizes={{'{r.symbol}': ...}})")
    # a tile larger than its axis (a derived 16-row tile over 5 rows) holds only the axis, as a
    # partial last group holds only its real elements
    sched = sched.clipped_view()
    n = {a: int(ax.size) for a, ax in d.axes.items()}
    rng = np.random.default_rng(seed)
    hbm: dict[str, np.ndarray] = {}
    for v in d.inputs:
        shape = tuple(n[a] for a in v.axis_names)
        hbm[v.name] = inputs[v.name] if v.name in inputs else rng.standard_normal(shape)
    plans = analyze(sched)
    runs = []
    for p in plans:
        runs.append(_Run(p, n, hbm, d.sizes).run())
    outputs = {}
    for name, v in zip(d.output_names, d.outputs):
        w = v
        while d.name_of(w) not in hbm:
            w = w.args[0]
        outputs[name] = hbm[d.name_of(w)]
    transfers = {"HBM": 0, "L2": 0, "SMEM": 0}
    peak = {"SMEM": 0, "RF": 0}
    for r in runs:
        for k, v in r.transfers.items():
            transfers[k] += v
        for k, v in r.memory_peak.items():
            peak[k] = max(peak[k], v)
    return InterpretResult(outputs=outputs, transfers=transfers, per_kernel=tuple(runs), memory_peak=peak,
                           arrays=dict(hbm))
