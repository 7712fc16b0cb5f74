"""The cost of a scheduled diagram: transfers H, memory M and compute per level, symbolic and numeric.

What the numbers mean
---------------------
Levels are ``HBM → L2 → SMEM → RF → TC``. **H[ℓ] is the traffic read from or written to
level ℓ by the level below it**, in elements (``H_elements``) and bytes (``H_bytes``, each
array at its own dtype):

- ``H["HBM"]``: DRAM traffic (what L2 reads from and writes back to HBM);
- ``H["L2"]``: L2↔SMEM traffic — every block load and store passes L2. For a kernel input X
  it is ``size(X)·Π_{a grouped, a ∉ X} n_a/g_a`` (re-read once per group along every grouped
  axis X lacks; streaming does not change it), for a stored output Y the same. Symbolic
  sizes give the exact ``n/g``; numeric sizes ``ceil(n/g)`` (a partial last group moves only
  its real elements). Matmul ``abc(1/g_a + 1/g_c) + ac``; attention ``2qd + 2xdq/g_q``;
  unfused attention ``+ 4qx``.
- Without L2 reuse ``H["HBM"] == H["L2"]``. With ``l2_caching=True`` (docs/architecture.md §4.3) the L2,
  shared by the P concurrently active blocks (SMs × blocks per SM), acts for traffic from
  HBM as if its memory were theirs combined, while it fits: ``H["HBM"]`` is the same formula
  with each grouped axis's group enlarged by a factor f_a, Π f_a ≤ P' (P' = how many block
  working sets fit in L2, at most P), choosing the integer split that minimises traffic
  (e.g. √P'×√P' for a square 2-D grid). It needs numeric sizes and a GPU (or an explicit
  ``concurrent_blocks``, then split evenly, P^(1/k) per axis); otherwise it is not applied
  and a note says so. Numeric sizes also try the **raster** rule and keep whichever moves
  less: blocks launch in an order of the grouped axes (outer → inner, ``l2_order``; axes every
  array carries outermost); an array whose sharing blocks (the grouped axes it lacks) are all
  inner to the grouped axes it carries is read by consecutive blocks, so its slab (its tile
  along the axes it carries) crosses HBM once while the slabs live at once
  (``ceil(P'/sharers) + 1`` of each such array) fit in L2 (``l2_read_once``); the other arrays
  get the concurrency of P' consecutive blocks in that order. GQA is the case it is for: the
  query heads and query tiles sharing a K/V head run together, and K and V cross HBM once per
  K/V head, not once per query head. Reuse through L2 between kernels is not modelled. Both
  searches try every split and order (interchangeable axes in one order only) while there are
  at most ``SPLITS_MAX`` splits and ``RASTER_ORDERS_MAX`` orders; past that (a contraction with
  a dozen grouped axes of different kinds), a few even splits and heuristic orders.
- ``H["SMEM"]``: SMEM↔RF traffic. Every SMEM-resident tile is read into registers once per
  use (box reading it) per group — kept in registers across stream steps if it does not
  carry the streamed axis — and every SMEM-resident array a box computes is written from
  registers once (accumulators when complete). RF (per-warp) groups ``w_a`` apply the same
  formula inside the block tile: a tile lacking a warp-grouped axis is read once per warp
  tile, ``Π (g_a/w_a)`` times. Without RF relabels the block is one RF tile.
- ``H["RF"]``: RF→tensor-core operand traffic: every mma reads its A and B fragments, so a
  contraction on tensor cores moves ``size(A)·(extent of its n side)/n + size(B)·(m side)/m``
  (accumulator fragments stay put). Contractions on CUDA cores add nothing here.
- ``H["TC"] = 0``.

**M[ℓ]** is the largest total size of arrays resident at ℓ in any column (box) of a
kernel, with the liveness rules of :mod:`napkin.perfmodel.legality` and tile extents g_a
(grouped), s_a (streamed), n_a (whole): per block for SMEM and RF (attention fused:
``2d(g_q + s_x)``; matmul ``g_a g_c + s_b(g_a + g_c)``). Kernel inputs and outputs (with
their accumulators) live at SMEM, intermediates and online-softmax state in registers
unless ``Kernel.placement`` says otherwise; register copies of SMEM operands are transient
and not counted. ``M["L2"]`` is the combined working set of the concurrently active blocks
(one block when that number is unknown); ``M["HBM"]`` the arrays live in DRAM while the
busiest kernel runs; ``M["TC"] = 0``. Bytes use each array's dtype; ``accumulator_dtype``
(e.g. ``"fp32"``) counts accumulators (outputs of contractions and reductions, softmax
state) at that dtype instead. Across kernels H adds up and M is the maximum.

**Compute**: a contraction costs 2·Π(every axis it touches) FLOPs, on tensor cores when its
dtype is fp16/bf16/fp8/tf32 and it maps to an mma (two operands with m, n and k sides),
else on CUDA cores; maps cost ``FUNCTIONS[fn].flops`` per output element on CUDA cores and
``.sfu`` on the special-function unit; softmax 4 FLOPs + 1 exp per element, plus when
streamed (online) one exp per row per step (the rescale factor), one multiply per row and
per running-output element per step and one division per output element at the end;
layernorm 5 and rmsnorm 3 FLOPs per element plus one rsqrt (SFU) per row; reductions 1 FLOP
per input element (mean one more per output). A box that does not carry a grouped axis
is recomputed in every group along it. ``total_flops`` = tensor + CUDA-core FLOPs.

``groups`` is the number of thread blocks launched (summed over kernels) and ``steps`` the
stream steps per block (summed over kernels); each :class:`KernelCost` has its own, and the
facts of a block's latency chain that the runtime prediction reads
(:func:`napkin.perfmodel.predict.block_latency`): ``stream`` (the streamed axis), ``mean_steps``
(steps a block runs on average when fully masked chunks are skipped), ``reductions`` and
``reductions_per_step`` (dependent cross-thread reductions outside and inside the loop).

Numeric costs never touch sympy (plain ints and Fractions); symbolic maxima drop dominated
terms by comparing monomial coefficients (all symbols are positive), so the cost of a schedule
of hundreds of kernels stays linear-ish in its size.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Schedule
>>> c = cost(Schedule.fused(library.get("matmul"), groups={"a": None, "c": None}, streams={"b": None}, gpu=None))
>>> c.H("L2")
a*b*c/g_c + a*b*c/g_a + a*c
>>> c.M("SMEM")
g_a*g_c + g_a*s_b + g_c*s_b
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import sympy

from ..diagrams.axes import size_symbol
from ..diagrams.functions import get_function, half_form
from ..dtypes import dtype as lookup_dtype
from ..errors import ScheduleError
from .legality import KernelPlan, analyze, column_memory, tensor_core_box
from .masks import visit_fractions
from .roofline import Work
from .schedule import LEVELS, Schedule

__all__ = ["COMPUTE_KINDS", "Cost", "KernelCost", "LevelCost", "cost"]

COMPUTE_KINDS = ("tensor", "cuda", "sfu")


# ----------------------------------------------------------------------------- arithmetic


class _Num:
    """Numeric arithmetic: exact ints, ceil for group counts."""

    symbolic = False

    @staticmethod
    def groups(n, g):
        return -(-int(n) // int(g))

    @staticmethod
    def tiles(n, g):
        """Extents of the tiles of an axis of size n in groups of g."""
        n, g = int(n), int(g)
        full, rem = divmod(n, g)
        return [(g, full)] + ([(rem, 1)] if rem else [])

    @classmethod
    def subcount(cls, n, g, w):
        """Σ over the groups of size g of ceil(extent / w)."""
        return sum(cnt * cls.groups(ext, w) for ext, cnt in cls.tiles(n, g))

    @staticmethod
    def div(a, b):
        return a / b

    @staticmethod
    def max(values):
        return max(values) if values else 0

    zero = 0


class _Sym:
    """Symbolic arithmetic: exact n/g."""

    symbolic = True

    @staticmethod
    def groups(n, g):
        return sympy.sympify(n) / sympy.sympify(g)

    @staticmethod
    def subcount(n, g, w):
        return sympy.sympify(n) / sympy.sympify(w)

    @staticmethod
    def div(a, b):
        return sympy.sympify(a) / sympy.sympify(b)

    @staticmethod
    def max(values):
        """The maximum of symbolic sizes: values another one provably dominates are dropped (a
        difference whose every monomial has a non-negative coefficient, all symbols being
        positive), the rest kept in a Max. Linear-time bookkeeping per pair, no sympy
        inequality solving, so a schedule of hundreds of kernels stays fast."""
        vals = list(dict.fromkeys(sympy.expand(v) for v in values))
        if not vals:
            return sympy.Integer(0)
        if len(vals) == 1:
            return vals[0]
        coeffs = [_monomials(v) for v in vals]
        keep = []
        for i, v in enumerate(vals):
            ci = coeffs[i]
            dominated = False
            for j, cj in enumerate(coeffs):
                if j == i or cj is None or ci is None:
                    continue
                if _dominates(cj, ci) and (not _dominates(ci, cj) or j < i):
                    dominated = True
                    break
            if not dominated:
                keep.append(v)
        if len(keep) == 1:
            return keep[0]
        return sympy.Max(*keep) if len(keep) <= 4 else sympy.Max(*keep, evaluate=False)

    zero = sympy.Integer(0)


def _monomials(expr) -> dict | None:
    """{monomial: coefficient} of an expanded expression whose monomials are positive (products
    and powers of positive symbols), or None when one may not be."""
    out: dict = {}
    for term in sympy.Add.make_args(expr):
        coeff, mono = term.as_coeff_Mul()
        if coeff.is_Integer:
            c = int(coeff)
        elif coeff.is_Rational:
            c = Fraction(int(coeff.p), int(coeff.q))
        elif coeff.is_Float:
            c = float(coeff)
        else:
            return None
        if mono != 1 and not _positive(mono):
            return None
        out[mono] = out.get(mono, 0) + c
    return out


@lru_cache(maxsize=4096)
def _positive(mono) -> bool:
    return bool(mono.is_positive)


def _dominates(a: dict, b: dict) -> bool:
    """a − b has no negative coefficient (so a ≥ b for positive symbols)."""
    for m, c in b.items():
        if a.get(m, 0) - c < 0:
            return False
    return all(c >= 0 for m, c in a.items() if m not in b)


def _total(values, ar):
    """Σ values: one sympy Add for symbolic terms (no quadratic re-flattening), else sum."""
    values = list(values)
    if ar.symbolic:
        return sympy.Add(*values) if values else sympy.Integer(0)
    return sum(values, 0)


def _exact(x):
    """A Fraction from mask skipping as an int when whole, else a float."""
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


def _prod(values, one=1):
    out = one
    for v in values:
        out = out * v
    return out


def _simplify(x):
    if isinstance(x, sympy.Basic):
        return sympy.expand(x) if not isinstance(x, sympy.Max) else x
    return x


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class LevelCost:
    """Transfers and memory at one level (see the module docstring for what each means)."""

    name: str
    H_elements: object
    H_bytes: object
    H_per_group_elements: object
    M_elements: object
    M_bytes: object

    def to_dict(self) -> dict:
        return {k: _jsonable(getattr(self, k)) for k in
                ("H_elements", "H_bytes", "H_per_group_elements", "M_elements", "M_bytes")}


@dataclass(frozen=True)
class KernelCost:
    """The cost of one kernel."""

    name: str
    boxes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    groups: object                      # thread blocks: Π ceil(n_a/g_a)
    steps: object                       # stream steps per block
    tiles: dict                         # symbol -> size (g_q, s_x, w_q)
    levels: dict                        # level -> LevelCost
    flops: dict                         # tensor / cuda / sfu
    concurrent_blocks: object = None    # blocks sharing L2 in the L2 rule (None: not applied)
    l2_split: dict = field(default_factory=dict)  # axis -> group enlargement factor in L2
    resident_bytes: dict = field(default_factory=dict)  # level -> {array: bytes} at the fullest column
    notes: tuple[str, ...] = ()
    stream: str | None = None           # the streamed axis (None: the kernel has no loop)
    mean_steps: object = None           # loop steps a block runs on average: steps, less fully masked chunks
    reductions: int = 0                 # dependent cross-thread reductions in a block's chain outside its loop
    reductions_per_step: int = 0        # ... in every step of its loop (online softmax: the running max)
    l2_order: tuple[str, ...] = ()      # launch order (outer → inner) of the grouped axes some array lacks that
                                        # the L2 raster rule assumed (the others outermost); () for the split
    l2_read_once: tuple[str, ...] = ()  # arrays read from HBM once because the blocks sharing them run together

    def H(self, level: str):
        return self.levels[level].H_elements

    def M(self, level: str):
        return self.levels[level].M_elements

    def to_dict(self) -> dict:
        return {
            "name": self.name, "boxes": list(self.boxes), "inputs": list(self.inputs),
            "outputs": list(self.outputs), "groups": _jsonable(self.groups), "steps": _jsonable(self.steps),
            "tiles": {k: _jsonable(v) for k, v in self.tiles.items()},
            "levels": {k: v.to_dict() for k, v in self.levels.items()},
            "flops": {k: _jsonable(v) for k, v in self.flops.items()},
            "concurrent_blocks": _jsonable(self.concurrent_blocks),
            "l2_split": {k: _jsonable(v) for k, v in self.l2_split.items()},
            "resident_bytes": {lv: {a: _jsonable(b) for a, b in d.items()} for lv, d in self.resident_bytes.items()},
            "notes": list(self.notes),
            "stream": self.stream, "mean_steps": _jsonable(self.mean_steps), "reductions": self.reductions,
            "reductions_per_step": self.reductions_per_step, "l2_order": list(self.l2_order),
            "l2_read_once": list(self.l2_read_once),
        }


@dataclass(frozen=True)
class Cost:
    """The cost of a schedule: per level H and M, FLOPs per unit, per kernel detail."""

    levels: dict
    flops: dict
    total_flops: object
    groups: object
    steps: object
    per_kernel: tuple[KernelCost, ...]
    is_symbolic: bool
    notes: tuple[str, ...] = ()
    schedule: Schedule | None = field(default=None, compare=False, repr=False)
    gpu: object = field(default=None, compare=False, repr=False)
    options: dict = field(default_factory=dict, compare=False, repr=False)

    def H(self, level: str = "HBM"):
        """Transfer at ``level`` in elements."""
        return self.levels[level].H_elements

    def H_bytes(self, level: str = "HBM"):
        return self.levels[level].H_bytes

    def M(self, level: str = "SMEM"):
        """Memory at ``level`` in elements."""
        return self.levels[level].M_elements

    def M_bytes(self, level: str = "SMEM"):
        return self.levels[level].M_bytes

    def numeric(self, sizes: Mapping | None = None) -> Cost:
        """The same cost with axis and tile sizes bound (ceil group counts, not n/g)."""
        if self.schedule is None:
            raise ScheduleError("this Cost does not remember its schedule; call cost() with sizes")
        opts = dict(self.options)
        opts["symbolic"] = False
        return cost(self.schedule, self.gpu, sizes=sizes, **opts)

    def subs(self, values: Mapping) -> Cost:
        """Substitute values into a symbolic cost (exact n/g arithmetic, no ceilings)."""
        sub = {(size_symbol(k) if isinstance(k, str) else k): v for k, v in values.items()}
        extra = {}
        for k, v in values.items():
            if isinstance(k, str):
                extra[sympy.Symbol(k, integer=True, positive=True)] = v

        def f(x):
            if isinstance(x, sympy.Basic):
                return x.subs(sub).subs(extra)
            return x

        def lv(c: LevelCost) -> LevelCost:
            return LevelCost(c.name, *(f(getattr(c, n)) for n in
                                       ("H_elements", "H_bytes", "H_per_group_elements", "M_elements", "M_bytes")))

        return dataclasses.replace(
            self, levels={k: lv(v) for k, v in self.levels.items()},
            flops={k: f(v) for k, v in self.flops.items()}, total_flops=f(self.total_flops),
            groups=f(self.groups), steps=f(self.steps))

    def to_work(self, dtype: str | None = None):
        """A :class:`napkin.perfmodel.roofline.Work` (numeric costs only) for runtime prediction."""
        if self.is_symbolic:
            raise ScheduleError("to_work needs a numeric cost; call .numeric(sizes) first")
        dt = dtype or (self.schedule.dtype if self.schedule is not None else "bf16")
        return Work(flops={k: float(v) for k, v in self.flops.items()},
                    bytes={k: float(v.H_bytes) for k, v in self.levels.items() if k != "TC"},
                    dtype=dt if dt in ("fp16", "bf16", "fp8", "tf32", "fp64") else "fp16")

    def to_dict(self) -> dict:
        """JSON-safe: numbers as int/float, symbolic expressions as strings."""
        return {
            "diagram": self.schedule.diagram.name if self.schedule is not None else None,
            "is_symbolic": self.is_symbolic,
            "levels": {k: v.to_dict() for k, v in self.levels.items()},
            "flops": {k: _jsonable(v) for k, v in self.flops.items()},
            "total_flops": _jsonable(self.total_flops),
            "groups": _jsonable(self.groups),
            "steps": _jsonable(self.steps),
            "kernels": [k.to_dict() for k in self.per_kernel],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        name = self.schedule.diagram.name if self.schedule is not None else "schedule"
        nk = len(self.per_kernel)
        head = (f"cost of {name}: {nk} kernel{'s' if nk != 1 else ''}, {_fmt(self.groups)} group(s), "
                f"{_fmt(self.steps)} step(s){' (symbolic)' if self.is_symbolic else ''}")
        rows = [("level", "H elements", "H bytes", "H per group", "M elements", "M bytes")]
        for k, v in self.levels.items():
            rows.append((k, _fmt(v.H_elements), _fmt(v.H_bytes), _fmt(v.H_per_group_elements),
                         _fmt(v.M_elements), _fmt(v.M_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [head]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append("  flops: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.flops.items())
                     + f"; total {_fmt(self.total_flops)}")
        if nk > 1:
            for kc in self.per_kernel:
                lines.append(f"  kernel {kc.name} ({' '.join(kc.boxes)}): groups {_fmt(kc.groups)}, steps "
                             f"{_fmt(kc.steps)}, H[L2] {_fmt(kc.H('L2'))}, M[SMEM] {_fmt(kc.M('SMEM'))}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _fmt(x) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}".replace(",", "_") if abs(x) >= 10**6 else str(x)
    if isinstance(x, float):
        return f"{x:.6g}"
    if isinstance(x, sympy.Basic):
        if x.is_number:
            return _fmt(int(x)) if x.is_integer else f"{float(x):.6g}"
        return str(x)
    return str(x)


def _jsonable(x):
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, sympy.Basic):
        if x.is_number:
            return int(x) if x.is_integer else float(x)
        return str(x)
    if hasattr(x, "__index__"):
        return int(x)
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return str(x)


# ----------------------------------------------------------------------------- the model


def _bytes_of(dt: str) -> int:
    return lookup_dtype(dt).bytes


class _KernelModel:
    """Every figure of one kernel, for given axis sizes and tile sizes, in one arithmetic."""

    def __init__(self, plan: KernelPlan, n: dict, ar, gpu, accumulator_dtype):
        self.plan, self.n, self.ar, self.gpu = plan, n, ar, gpu
        self.acc_dt = accumulator_dtype
        one = sympy.Integer(1) if ar.symbolic else 1
        self.one = one
        self.G = dict(plan.groups)
        self.W = dict(plan.rf_groups)
        self.s = plan.stream[0] if plan.stream else None
        self.ss = plan.stream[1] if plan.stream else None
        self.N = {a: ar.groups(n[a], g) for a, g in self.G.items()}
        self.outer = tuple(plan.outer_streams)
        self.steps = ar.groups(n[self.s], self.ss) if self.s else one
        for a in self.outer:  # walked one index at a time around the stream's loop
            self.steps = self.steps * n[a]
        # Fully masked (query tile, key chunk) pairs are skipped (napkin.perfmodel.masks): numeric only.
        if ar.symbolic:
            self.f_steps = self.f_loads = self.f_warp_loads = self.f_area = one
        else:
            self.f_steps, self.f_loads, self.f_warp_loads, self.f_area = visit_fractions(plan, n)
        self.n_groups = _prod(self.N.values(), one)
        # R_a: how many RF tiles along a over the whole kernel (block groups × warp tiles per group)
        self.R = {}
        for a in set(self.G) | set(self.W):
            if a in self.W:
                outer = self.G.get(a, n[a])
                self.R[a] = ar.subcount(n[a], outer, self.W[a])
            else:
                self.R[a] = self.N[a]

    # -- sizes
    def size(self, axes) -> object:
        return _prod((self.n[a] for a in axes), self.one)

    def ext(self, a):
        if a in self.G:
            return self.G[a]
        if a == self.s:
            return self.ss
        if a in self.outer:
            return self.one
        return self.n[a]

    def tile(self, axes) -> object:
        return _prod((self.ext(a) for a in axes), self.one)

    def f_l2(self, axes) -> object:
        return _prod((self.N[a] for a in self.G if a not in axes), self.one)

    def f_smem(self, axes) -> object:
        return _prod((self.R[a] for a in self.R if a not in axes), self.one)

    def redundancy(self, b) -> object:
        ax = self.plan.box_axes(b)
        return _prod((self.N[a] for a in self.G if a not in ax), self.one)

    # -- transfers
    def transfers(self):
        p, ar = self.plan, self.ar
        H_l2 = ar.zero
        per_group_l2 = ar.zero
        H_l2_bytes = ar.zero
        for v in (*p.inputs, *p.stores):
            t = self.size(v.axis_names) * self.f_l2(v.axis_names)
            if self.s in v.axis_names and self.f_loads != 1:
                t = _exact(t * self.f_loads)
            H_l2 = H_l2 + t
            H_l2_bytes = H_l2_bytes + t * _bytes_of(v.dtype)
            per_group_l2 = per_group_l2 + self._full_tile_l2(v.axis_names)
        H_sm = ar.zero
        H_sm_bytes = ar.zero
        per_group_sm = ar.zero
        for b in p.columns:
            for a in dict.fromkeys(b.args):
                r, internal = p.resolve(a)
                lvl = p.level[id(r)] if internal else p.level[id(a)]
                if lvl != "SMEM":
                    continue
                t = self.size(a.axis_names) * self.f_smem(a.axis_names)
                if self.s in a.axis_names and self.f_warp_loads != 1:
                    t = _exact(t * self.f_warp_loads)
                H_sm = H_sm + t
                H_sm_bytes = H_sm_bytes + t * _bytes_of(a.dtype)
                per_group_sm = per_group_sm + self._full_tile_smem(a.axis_names)
            if p.level[id(b)] == "SMEM":
                t = self.size(b.axis_names) * self.f_smem(b.axis_names)
                H_sm = H_sm + t
                H_sm_bytes = H_sm_bytes + t * _bytes_of(b.dtype)
                per_group_sm = per_group_sm + self._full_tile_smem(b.axis_names)
        H_tc = ar.zero
        H_tc_bytes = ar.zero
        for b in p.columns:
            tc = tensor_core_box(b, self.gpu)
            if tc is None:
                continue
            mapping, shape = tc
            A, B = b.args
            red = self.redundancy(b)
            if p.box_phase.get(id(b)) == "body" and self.f_area != 1:
                red = _exact(red * self.f_area)  # skipped (fully masked) tiles issue no mma
            tA = self.size(A.axis_names) * self._mma_side(mapping["n"], shape[1]) * red
            tB = self.size(B.axis_names) * self._mma_side(mapping["m"], shape[0]) * red
            H_tc = H_tc + tA + tB
            H_tc_bytes = H_tc_bytes + tA * _bytes_of(A.dtype) + tB * _bytes_of(B.dtype)
        return {
            "L2": (H_l2, H_l2_bytes, per_group_l2),
            "SMEM": (H_sm, H_sm_bytes, per_group_sm),
            "RF": (H_tc, H_tc_bytes, ar.div(H_tc, self.n_groups) if self.ar.symbolic else self._per_group(H_tc)),
        }

    def _per_group(self, total):
        if self.ar.symbolic:
            return self.ar.div(total, self.n_groups)
        return total / self.n_groups if self.n_groups else 0

    def _full_tile_l2(self, axes):
        return self.size_tile_full(axes)

    def size_tile_full(self, axes):
        return _prod(((self.G[a] if a in self.G else self.n[a]) for a in axes), self.one)

    def _full_tile_smem(self, axes):
        t = self.size_tile_full(axes)
        for a, w in self.W.items():
            if a in axes:
                continue
            outer = self.G.get(a, self.n[a])
            t = t * (self.ar.div(outer, w) if self.ar.symbolic else -(-int(outer) // int(w)))
        return t

    def _mma_side(self, side_axes, dim):
        """Σ over the kernel's tiles of the side's extent in mma units (innermost axis / dim)."""
        out = self.one
        for i, a in enumerate(side_axes):
            t = dim if i == len(side_axes) - 1 else 1
            if self.ar.symbolic:
                out = out * self.ar.div(self.n[a], t)
            else:
                if a in self.G:
                    out = out * _Num.subcount(self.n[a], self.G[a], t)
                elif a == self.s:
                    out = out * _Num.subcount(self.n[a], self.ss, t)
                elif a in self.outer:
                    out = out * _Num.subcount(self.n[a], 1, t)
                else:
                    out = out * -(-int(self.n[a]) // t)
        return out

    # -- memory
    def memory(self):
        acc = self.acc_dt

        def bpv(r):
            return _bytes_of(acc) if (acc and r.accumulator) else _bytes_of(r.dtype)

        cols = column_memory(self.plan, self.tile, bpv, ("SMEM", "RF"), self.ar.zero)
        out = {}
        resident = {}
        for lv, per in cols.items():
            out[lv] = (self.ar.max([e for e, _, _ in per]), self.ar.max([b for _, b, _ in per]))
            if not self.ar.symbolic and per:
                i = max(range(len(per)), key=lambda j: per[j][1])
                resident[lv] = per[i][2]
        return out, resident

    # -- the latency chain of a block (how many dependent cross-thread reductions it runs)
    def reductions(self) -> tuple[int, int]:
        """(reductions outside the loop, reductions in every step): softmax and layernorm reduce
        twice (max and sum; mean and variance), rmsnorm and a reduce box once; an online softmax
        takes its running max every step and its sum once at the end; a reduction accumulated
        over the streamed axis keeps per-thread partials and combines them once. Contractions
        accumulate in each thread's fragments (no cross-thread chain)."""
        p, s = self.plan, self.s
        per_block = per_step = 0
        for b in p.columns:
            op = b.op
            if op.kind == "reduce":
                n = 1
            elif op.kind == "softmax":
                n = 2
            elif op.kind == "norm":
                n = 2 if op.how == "layernorm" else 1
            else:
                continue
            if id(b) in p.online:
                per_step += 1
                per_block += 1
            elif p.box_phase.get(id(b)) == "body":
                if s is not None and s in op.own_axes():
                    per_block += 1
                else:
                    per_step += n
            else:
                per_block += n
        return per_block, per_step

    # -- compute
    def flops(self):
        p, ar = self.plan, self.ar
        fl = {"tensor": ar.zero, "cuda": ar.zero, "sfu": ar.zero}
        for b in p.columns:
            red = self.redundancy(b)
            if p.box_phase.get(id(b)) == "body" and self.f_area != 1:
                red = _exact(red * self.f_area)
            op = b.op
            kind = op.kind
            if kind == "contract":
                if op.over:
                    f = 2 * self.size(sorted(p.box_axes(b)))
                    unit = "tensor" if tensor_core_box(b, self.gpu) is not None else "cuda"
                else:
                    f = (len(b.args) - 1) * self.size(b.axis_names)
                    unit = "cuda"
                fl[unit] = fl[unit] + f * red
            elif kind == "map":
                cuda, sfu = get_function(op.fn).cost(half=half_form(b.dtype))
                sz = self.size(b.axis_names)
                fl["cuda"] = fl["cuda"] + cuda * sz * red
                fl["sfu"] = fl["sfu"] + sfu * sz * red
            elif kind == "reduce":
                fl["cuda"] = fl["cuda"] + self.size(b.args[0].axis_names) * red
                if op.how == "mean":
                    fl["cuda"] = fl["cuda"] + self.size(b.axis_names) * red
                if id(b) in p.rescaled:  # exp(c_old − c_new) and the multiply, every step
                    steps = _exact(self.steps * self.f_steps) if self.f_steps != 1 else self.steps
                    rows = self.size(b.axis_names) * self.redundancy(b)
                    fl["sfu"] = fl["sfu"] + rows * steps
                    fl["cuda"] = fl["cuda"] + rows * steps
            elif kind == "softmax":
                sz = self.size(b.axis_names)
                fl["cuda"] = fl["cuda"] + 4 * sz * red
                fl["sfu"] = fl["sfu"] + sz * red
                if id(b) in p.online:
                    rows = self.size([a for a in b.axis_names if a != op.over])
                    steps = _exact(self.steps * self.f_steps) if self.f_steps != 1 else self.steps
                    base = self.redundancy(b)
                    fl["sfu"] = fl["sfu"] + rows * steps * base
                    fl["cuda"] = fl["cuda"] + rows * steps * base
                    for c in p.online[id(b)]:
                        oc = self.size(c.axis_names) * self.redundancy(c)
                        fl["cuda"] = fl["cuda"] + oc * steps + oc
            elif kind == "norm":
                sz = self.size(b.axis_names)
                rows = self.size([a for a in b.axis_names if a != op.over])
                per = 5 if op.how == "layernorm" else 3
                fl["cuda"] = fl["cuda"] + per * sz * red
                fl["sfu"] = fl["sfu"] + rows * red
        return fl

    # -- L2 rule
    def concurrent_blocks(self, M_smem_bytes, M_rf_bytes, given=None):
        """Blocks active at once (SMs × blocks per SM by SMEM, registers and the block limit), or None."""
        if given is not None:
            return given if self.ar.symbolic else min(int(given), int(self.n_groups))
        gpu = self.gpu
        if gpu is None or self.ar.symbolic:
            return None
        bps = gpu.max_blocks_per_sm
        if M_smem_bytes:
            alloc = -(-int(M_smem_bytes) // gpu.smem_alloc_unit) * gpu.smem_alloc_unit + gpu.smem_reserved_per_block
            bps = min(bps, int(gpu.level("SMEM").capacity_bytes // alloc))
        if M_rf_bytes:
            bps = min(bps, int(gpu.regs_per_sm_bytes // int(M_rf_bytes)))
        return min(gpu.sms * max(1, bps), int(self.n_groups))

    def hbm(self, P, M_smem_bytes, l2_caching):
        """(H_HBM elements and bytes or None, blocks sharing L2, split, note, order, read once)
        under the L2 rule (see the module docstring): the best of the concurrent split and the
        raster rule."""
        p, ar = self.plan, self.ar
        arrays = [(p.name_of(v), v.axis_names, _bytes_of(v.dtype)) for v in (*p.inputs, *p.stores)]
        vals = [(ax, nb) for _, ax, nb in arrays]
        relevant = [a for a in self.G if any(a not in ax for ax in (x[1] for x in arrays))]
        if not l2_caching or not relevant:
            return None, None, {}, None, (), ()
        if P is None:
            why = "symbolic sizes (pass concurrent_blocks= or numeric sizes)" if ar.symbolic else "no GPU given"
            return None, None, {}, f"L2 caching not applied: {why}", (), ()
        if ar.symbolic:
            f = {a: sympy.sympify(P) ** sympy.Rational(1, len(relevant)) for a in relevant}
            H, Hb = self._hbm_with(f, vals)
            return (H, Hb), P, f, None, (), ()
        fit = int(P)
        gpu = self.gpu
        l2cap = None
        if gpu is not None and "L2" in gpu.level_names():
            l2cap = gpu.level("L2").capacity_bytes
        if l2cap and M_smem_bytes:
            fit = min(fit, int(l2cap // int(M_smem_bytes)))
        if fit < 2:
            return None, fit, {}, f"L2 caching not applied: {fit} block working set(s) fit in L2", (), ()
        N = {a: int(self.N[a]) for a in relevant}
        # per array: (elements, bytes per value, axes it lacks, slab elements, name)
        items = []
        for name, ax, nb in arrays:
            size = int(self.size(ax))
            lacks = tuple(a for a in relevant if a not in ax)
            carried = 1
            for a in self.G:
                if a in ax:
                    carried *= int(self.N[a])
            items.append((size, nb, lacks, size // max(1, carried), name))

        def traffic(f, once=frozenset()):
            H = Hb = 0
            for size, nb, lacks, _slab, name in items:
                t = size
                if name not in once:
                    for a in lacks:
                        t *= -(-N[a] // f[a])
                H += t
                Hb += t * nb
            return H, Hb

        # the concurrent split: Π f_a ≤ fit blocks' tiles combined (only the least f per quotient
        # ceil(N/f) matters, so f runs over those breakpoints)
        # (interchangeable axes: the same group count, lacked by the same arrays; see _raster_orders)
        lacks_of = [it[2] for it in items]
        best = None
        tried = 0
        for f in _splits(relevant, fit, N, _alike(relevant, N, lacks_of)):
            tried += 1
            if tried > SPLITS_MAX:  # many grouped axes: a few even splits instead of all of them
                for g in _even_splits(relevant, fit, N):
                    H = traffic(g)
                    if H[0] < best[0][0]:
                        best = (H, g, (), ())
                break
            H = traffic(f)
            if best is None or H[0] < best[0][0]:
                best = (H, f, (), ())
        # the raster: blocks launched in an order (outer -> inner); an array whose sharing blocks
        # (the grouped axes it lacks) are innermost is read once while its slabs fit in L2
        if len(relevant) > 1 or any(it[2] for it in items):
            for order in _raster_orders(relevant, N, lacks_of):
                pos = {a: i for i, a in enumerate(order)}
                f, rem = {}, fit
                for a in reversed(order):
                    f[a] = min(N[a], rem)
                    rem = rem // N[a] if f[a] == N[a] else 1
                    rem = max(1, rem)
                cands = []
                for size, nb, lacks, slab, name in items:
                    if not lacks:
                        continue
                    carried = [a for a in relevant if a not in lacks]
                    if carried and min(pos[a] for a in lacks) < max(pos[a] for a in carried):
                        continue
                    span = math.prod(N[a] for a in lacks)
                    live = -(-fit // span) + 1
                    cands.append((slab * nb * live, name))
                once, used = [], 0
                for foot, name in sorted(cands):
                    if l2cap is None or used + foot <= l2cap:
                        once.append(name)
                        used += foot
                H = traffic(f, frozenset(once))
                if H[0] < best[0][0]:
                    best = (H, f, order, tuple(once))
        return best[0], fit, best[1], None, best[2], best[3]

    def _hbm_with(self, f, vals):
        H = self.ar.zero
        Hb = self.ar.zero
        for axes, nbytes in vals:
            t = self.size(axes)
            for a in self.G:
                if a in axes:
                    continue
                if a in f:
                    t = t * (self.ar.div(self.N[a], f[a]) if self.ar.symbolic else -(-int(self.N[a]) // int(f[a])))
                else:
                    t = t * self.N[a]
            H = H + t
            Hb = Hb + t * nbytes
        return H, Hb


#: The raster rule tries every launch order of the grouped axes some array lacks (up to
#: interchangeable axes) while there are at most this many; more try :func:`_heuristic_orders`.
RASTER_ORDERS_MAX = 5040


def _raster_orders(relevant, N, lacks):
    """Launch orders (outer → inner) of the axes ``relevant`` the raster rule tries.

    An order's traffic depends on each axis only through its group count ``N[a]`` and the arrays
    that lack it (``lacks``: per array, the axes it lacks), so two axes alike in both are
    interchangeable: swapping them in an order swaps their L2 factors and leaves every array's
    traffic and whether it is read once unchanged. The orders are those of
    ``itertools.permutations(relevant)`` in which interchangeable axes keep their order in
    ``relevant``, in the same (lexicographic) order: the first order of least traffic is the one
    all permutations would give. When there are more than :data:`RASTER_ORDERS_MAX` of them
    (n! grows past any budget: a contraction with 10 grouped axes of 10 kinds has 3.6 million), a
    few heuristic orders are tried instead (:func:`_heuristic_orders`).

    >>> list(_raster_orders(["a", "b", "c"], {"a": 2, "b": 2, "c": 4}, [("a", "b"), ("c",)]))
    [('a', 'b', 'c'), ('a', 'c', 'b'), ('c', 'a', 'b')]
    """
    sig = {a: (N[a], tuple(a in ax for ax in lacks)) for a in relevant}
    classes: dict[tuple, list[str]] = {}
    for a in relevant:
        classes.setdefault(sig[a], []).append(a)
    count = math.factorial(len(relevant))
    for members in classes.values():
        count //= math.factorial(len(members))
    if count > RASTER_ORDERS_MAX:
        yield from _heuristic_orders(relevant, N, lacks)
        return
    order: list[str] = []
    nxt = {c: 0 for c in classes}  # the next unused axis of each class

    def walk():
        if len(order) == len(relevant):
            yield tuple(order)
            return
        for a in relevant:
            c = sig[a]
            if nxt[c] < len(classes[c]) and classes[c][nxt[c]] == a:
                nxt[c] += 1
                order.append(a)
                yield from walk()
                order.pop()
                nxt[c] -= 1

    yield from walk()


def _heuristic_orders(relevant, N, lacks):
    """A few launch orders for many grouped axes: ``relevant``'s own order and its reverse, the
    axes by group count (fewest and most groups innermost), and per array that lacks some of them
    the axes it carries outside the axes it lacks (it is read once when the blocks sharing it run
    together), the lacked axes by their own order and by group count either way. Inner axes take
    the L2 factors first."""
    rel = tuple(relevant)
    seen: set[tuple] = set()
    by_n = tuple(sorted(rel, key=lambda a: N[a]))
    cands = [rel, rel[::-1], by_n, by_n[::-1]]
    for ax in lacks:
        inner = [a for a in rel if a in ax]
        if not inner:
            continue
        outer = tuple(a for a in rel if a not in ax)
        for tail in (inner, sorted(inner, key=lambda a: N[a]), sorted(inner, key=lambda a: -N[a])):
            cands.append(outer + tuple(tail))
            cands.append(tuple(sorted(outer, key=lambda a: N[a])) + tuple(tail))
    for o in cands:
        if o not in seen:
            seen.add(o)
            yield o


def _breakpoints(n: int, budget: int) -> list[int]:
    """The least f ≤ budget for every value of ceil(n / f), ascending (ceil(n/k) for k = 1..n).

    The walk starts at the first k whose ceil(n/k) fits the budget, so it takes at most ``budget``
    steps whatever ``n`` (from k = 1 it took 2·√n: an axis of 2^48 held ``napkin cost`` for
    minutes).

    >>> _breakpoints(10, 4)
    [1, 2, 3, 4]
    >>> _breakpoints(2 ** 48, 3)
    [1, 2, 3]
    """
    out = set()
    k = max(1, -(-n // max(1, budget)))
    while k <= n:
        f = -(-n // k)
        if f <= budget:
            out.add(f)
        # next k with a different ceil(n/k)
        q = -(-n // k)
        if q <= 1:
            break
        k = max(k + 1, -(-n // (q - 1)))
    out.add(1)
    return sorted(out)


def _splits(axes, budget, limits, alike=None):
    """Integer factors f_a ≥ 1, f_a ≤ limits[a], Π f_a ≤ budget (the last axis takes the most left);
    the leading axes run over the least f for each value of ceil(limits[a] / f) (larger f with
    the same quotient only spends budget), in lexicographic order.

    ``alike`` maps a leading axis to an earlier leading axis interchangeable with it (see
    :func:`_alike`): its factor is then at least that axis's. The splits left out are the
    others' factors permuted among interchangeable axes — the same traffic, later in the order —
    so the first split of least traffic is the same.

    >>> [tuple(f.values()) for f in _splits(["a", "b", "c"], 4, {"a": 2, "b": 2, "c": 8})]
    [(1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1)]
    >>> [tuple(f.values()) for f in _splits(["a", "b", "c"], 4, {"a": 2, "b": 2, "c": 8}, {"b": "a"})]
    [(1, 1, 4), (1, 2, 2), (2, 2, 1)]
    """
    axes = tuple(axes)
    alike = alike or {}
    if not axes:
        yield {}
        return
    chosen: dict = {}

    def walk(i: int, left: int):
        a = axes[i]
        if i == len(axes) - 1:
            yield {**chosen, a: max(1, min(left, limits[a]))}
            return
        lo = chosen[alike[a]] if a in alike else 1
        for f in _breakpoints(int(limits[a]), left):
            if f < lo:
                continue
            chosen[a] = f
            yield from walk(i + 1, left // f)
        chosen.pop(a, None)

    yield from walk(0, budget)


#: The concurrent L2 split tries at most this many splits (every split, for a few grouped axes);
#: past it, the even splits of :func:`_even_splits`.
SPLITS_MAX = 20_000


def _alike(axes, limits, lacks) -> dict:
    """Leading axis (all but the last of ``axes``) -> the previous leading axis interchangeable with
    it: the same group count ``limits[a]`` and lacked by the same arrays (``lacks``: per array,
    the axes it lacks), so that permuting their L2 factors leaves the traffic as it is."""
    last: dict = {}
    out = {}
    for a in tuple(axes)[:-1]:
        key = (limits[a], tuple(a in ax for ax in lacks))
        if key in last:
            out[a] = last[key]
        last[key] = a
    return out


def _even_splits(axes, budget, limits):
    """The budget spread evenly: factors doubled in turn (axes with the most groups first) while
    they fit, and each axis alone taking all it can."""
    f = {a: 1 for a in axes}
    used, grew = 1, True
    by_n = sorted(axes, key=lambda a: -limits[a])
    while grew:
        grew = False
        for a in by_n:
            g = min(int(limits[a]), f[a] * 2)
            if g > f[a] and used // f[a] * g <= budget:
                used = used // f[a] * g
                f[a] = g
                grew = True
    yield f
    for a in axes:
        yield {**{b: 1 for b in axes}, a: max(1, min(budget, int(limits[a])))}


# ----------------------------------------------------------------------------- entry point


def cost(schedule: Schedule, gpu=None, *, sizes: Mapping | None = None, symbolic: bool | None = None,
         l2_caching: bool = True, concurrent_blocks=None, accumulator_dtype: str | None = None) -> Cost:
    """Cost ``schedule`` on ``gpu`` (a name or GPU; None: ``schedule.gpu``; False: no hardware).

    ``sizes`` binds axis sizes and tile symbols (``{"q": 4096, "g_q": 128}``). ``symbolic``:
    None — symbolic when any size is; True — every axis size as its symbol (tile sizes as
    given); False — refuse unbound sizes. ``l2_caching`` applies the L2 rule to H["HBM"];
    ``concurrent_blocks`` overrides the number of concurrently active blocks it uses.
    ``accumulator_dtype`` counts accumulators at that dtype in M bytes. The structural legality
    analysis always runs (illegal schedules raise ScheduleError); hardware checks (divisibility,
    capacity) are in :func:`napkin.perfmodel.legality.check_schedule`.
    """
    from .hardware import get_gpu

    if gpu is None:
        gpu = schedule.gpu
    g = get_gpu(gpu) if gpu not in (None, False) else None
    sched = schedule.bind(sizes) if sizes else schedule
    plans = analyze(sched)

    # axis sizes
    n: dict[str, object] = {}
    for p in plans:
        for a, sz in p.sizes.items():
            n.setdefault(a, sz)
    for a, ax in sched.diagram.axes.items():
        n.setdefault(a, ax.size)
    if symbolic:
        n = {a: (size_symbol(a) if isinstance(v, int) else v) for a, v in n.items()}
    any_sym = any(not isinstance(v, int) for v in n.values()) or any(
        r.is_symbolic for k in sched.kernels for r in k.relabels)
    if symbolic is False and any_sym:
        free = sorted({str(s) for v in n.values() if isinstance(v, sympy.Basic) for s in v.free_symbols}
                      | set(sched.tile_symbols))
        raise ScheduleError(f"numeric cost needs sizes for {', '.join(free)}")
    ar = _Sym if any_sym else _Num
    if ar.symbolic:
        n = {a: sympy.sympify(v) for a, v in n.items()}

    kernels: list[KernelCost] = []
    notes: list[str] = []
    for p in plans:
        km = _KernelModel(p, n, ar, g, accumulator_dtype)
        tr = km.transfers()
        mem, resident = km.memory()
        fl = km.flops()
        smem_b = mem["SMEM"][1] if not ar.symbolic else None
        blocks = km.concurrent_blocks(smem_b, mem["RF"][1] if not ar.symbolic else None, concurrent_blocks)
        hbm, P, split, note, order, once = km.hbm(blocks, smem_b, l2_caching)
        if hbm is None:
            hbm = (tr["L2"][0], tr["L2"][1], tr["L2"][2])
        else:
            hbm = (hbm[0], hbm[1], km._per_group(hbm[0]))
        knotes = (note,) if note else ()
        Pm = blocks if blocks is not None else 1
        lv = {
            "HBM": LevelCost("HBM", _simplify(hbm[0]), _simplify(hbm[1]), _simplify(hbm[2]),
                             ar.zero, ar.zero),
            "L2": LevelCost("L2", _simplify(tr["L2"][0]), _simplify(tr["L2"][1]), _simplify(tr["L2"][2]),
                            _simplify(mem["SMEM"][0] * Pm), _simplify(mem["SMEM"][1] * Pm)),
            "SMEM": LevelCost("SMEM", _simplify(tr["SMEM"][0]), _simplify(tr["SMEM"][1]), _simplify(tr["SMEM"][2]),
                              _simplify(mem["SMEM"][0]), _simplify(mem["SMEM"][1])),
            "RF": LevelCost("RF", _simplify(tr["RF"][0]), _simplify(tr["RF"][1]), _simplify(tr["RF"][2]),
                            _simplify(mem["RF"][0]), _simplify(mem["RF"][1])),
            "TC": LevelCost("TC", ar.zero, ar.zero, ar.zero, ar.zero, ar.zero),
        }
        tiles = {}
        for r in p.kernel.relabels:
            tiles[r.symbol] = r.size
        red_block, red_step = km.reductions()
        mean_steps = km.steps
        if km.s is not None and not ar.symbolic and km.f_steps != 1:
            mean_steps = float(km.steps * km.f_steps)
        kernels.append(KernelCost(
            name=p.name, boxes=tuple(p.name_of(b) for b in p.boxes),
            inputs=tuple(p.name_of(v) for v in p.inputs), outputs=tuple(p.name_of(v) for v in p.stores),
            groups=_simplify(km.n_groups), steps=_simplify(km.steps), tiles=tiles, levels=lv,
            flops={k: _simplify(v) for k, v in fl.items()}, concurrent_blocks=P, l2_split=split,
            resident_bytes=resident, notes=knotes, stream=km.s, mean_steps=_simplify(mean_steps),
            reductions=red_block, reductions_per_step=red_step, l2_order=tuple(order), l2_read_once=tuple(once)))
        for nt in knotes:
            if nt not in notes:
                notes.append(nt)

    # HBM memory: arrays live in DRAM while each kernel runs
    m_hbm, m_hbm_b = _hbm_memory(sched, plans, n, ar)
    levels = {}
    for name in LEVELS:
        ks = [k.levels[name] for k in kernels]
        H = _simplify(_total((k.H_elements for k in ks), ar))
        Hb = _simplify(_total((k.H_bytes for k in ks), ar))
        Hg = _simplify(_total((k.H_per_group_elements for k in ks), ar))
        if name == "HBM":
            M, Mb = m_hbm, m_hbm_b
        else:
            M = ar.max([k.M_elements for k in ks])
            Mb = ar.max([k.M_bytes for k in ks])
        levels[name] = LevelCost(name, H, Hb, Hg, M, Mb)
    flops = {u: _simplify(_total((k.flops[u] for k in kernels), ar)) for u in COMPUTE_KINDS}
    total = _simplify(flops["tensor"] + flops["cuda"])
    groups = _simplify(_total((k.groups for k in kernels), ar))
    steps = _simplify(_total((k.steps for k in kernels), ar))
    return Cost(levels=levels, flops=flops, total_flops=total, groups=groups, steps=steps,
                per_kernel=tuple(kernels), is_symbolic=ar.symbolic, notes=tuple(notes), schedule=sched,
                gpu=g if g is not None else False,
                options={"l2_caching": l2_caching, "concurrent_blocks": concurrent_blocks,
                         "accumulator_dtype": accumulator_dtype})


def _hbm_memory(sched: Schedule, plans, n, ar):
    """(M elements, M bytes) at HBM: the diagram's inputs plus the stored arrays live while the
    busiest kernel runs (a stored array lives from the kernel that writes it to its last reader,
    to the end for outputs). One sweep over the kernels (the inputs, live throughout, are added
    once outside the maximum)."""
    d = sched.diagram
    one = sympy.Integer(1) if ar.symbolic else 1
    size = lambda v: _prod((n[a] for a in v.axis_names), one)
    stored_in: dict[int, int] = {}
    for p in plans:
        for v in p.stores:
            stored_in[id(v)] = p.index
    by_id = {id(v): v for v in (*d.inputs, *d.nodes)}

    def hbm_root(v):
        while id(v) not in stored_in and not v.is_input and v.op.kind == "rename":
            v = v.args[0]
        return v

    last_use: dict[int, int] = {}
    for p in plans:
        for v in p.inputs:
            r = hbm_root(v)
            last_use[id(r)] = max(last_use.get(id(r), -1), p.index)
    out_ids = {id(hbm_root(v)) for v in d.outputs}
    end = len(plans) - 1
    base = _total((size(v) for v in d.inputs), ar)
    base_b = _total((size(v) * _bytes_of(v.dtype) for v in d.inputs), ar)
    if not plans:
        return base, base_b
    starts: list[list] = [[] for _ in range(len(plans) + 1)]
    stops: list[list] = [[] for _ in range(len(plans) + 1)]
    for vid, k in stored_in.items():
        v = by_id[vid]
        last = end if vid in out_ids else max(last_use.get(vid, k), k)
        item = (size(v), size(v) * _bytes_of(v.dtype))
        starts[k].append(item)
        stops[last + 1].append(item)
    if ar.symbolic:
        live: list = []
        totals, totals_b = [], []
        for i in range(len(plans)):
            for item in stops[i]:
                live.remove(item)
            live.extend(starts[i])
            totals.append(_total((e for e, _ in live), ar))
            totals_b.append(_total((b for _, b in live), ar))
        return _simplify(base + ar.max(totals)), _simplify(base_b + ar.max(totals_b))
    cur = cur_b = 0
    best = best_b = 0
    for i in range(len(plans)):
        for e, b in stops[i]:
            cur -= e
            cur_b -= b
        for e, b in starts[i]:
            cur += e
            cur_b += b
        best, best_b = max(best, cur), max(best_b, cur_b)
    return base + best, base_b + best_b
