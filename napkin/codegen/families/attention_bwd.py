"""Attention's backward as one fused kernel (FlashAttention-2 style) on mma.sync.

A diagram belongs here when it is the backward diagram :func:`napkin.diagrams.grad.grad` gives
for attention with ``save={"O", "P_lse"}`` (what :func:`napkin.perfmodel.saving.choose_saved`
picks): inputs ``Q[.., q, d]``, ``K[.., x, d]``, ``V[.., x, d]``, the cotangent ``dO[.., q, d]``, the
saved ``P_lse[.., q]`` and ``O[.., q, d]``; boxes

- ``S = Q·K`` over d, a chain of positive scales and masks, ``P = exp(S' − P_lse)`` (P recomputed
  from the saved log-sum-exp, natural log, as grad.py writes it);
- ``dP = dO·V`` over d, ``D = Σ_d dO·O`` (FlashAttention's row term), ``dS = c·P·(dP − D)`` (``c``:
  the positive scales after the product, the softmax scale);
- ``dQ = dS·K`` over x, ``dK = dS·Q`` over q, ``dV = dO·P`` over q — the three outputs.

Woven axes (heads, batch) must be carried by Q, K and V alike (GQA's shared K/V heads would sum
dK and dV over the query heads: refused, with the reason). Score maps other than scales and
masks (soft-capping, ALiBi) need their derivative inside the kernel: refused too.

Schedule (three launches, one :class:`~napkin.codegen.program.Program`):

1. a pre-pass: ``D`` per row in fp32 into a workspace, and the fp32 dQ workspace zeroed;
2. the kernel: blocks of ``BX`` keys (grid.x; 16 a warp: each warp keeps its keys' dK and dV,
   16 x d fp32, in registers), ``q`` streamed at SMEM in tiles of ``s_q = BQ`` (Q, dO
   double-buffered with cp.async); per tile S^T and dP^T are recomputed in
   registers, P^T and dS^T feed the dV and dK products as A fragments without leaving
   registers, and dS^T goes through shared memory for ``dQ_tile = dS·K``, which every block adds
   to the fp32 workspace with atomic adds (causal: the query tiles above the diagonal of a key
   block are skipped);
3. a conversion: dQ = c · workspace, rounded to the dtype.

The schedule the model prices streams ``q`` with one woven combination a block; ``x`` cannot be
grouped there (dQ sums over it), so the block's keys are said by its warps (``BX = 16 · warps``)
and the model sees one kernel of the whole diagram (the five products' FLOPs, the scores
recomputed), plus what it cannot see (:meth:`AttentionBackwardFamily.launch_estimate`): the key
blocks, the two small launches and the workspaces' HBM bytes, the dQ atomics
(``(Nx / BX) · Nq · d`` fp32 adds) and Q, dO re-read per key block at the L2, and the warps'
operand loads from shared memory (causal: only the tiles computed). Accumulating dQ
atomically rather than in a second launch streaming the keys: the second launch would recompute
S and P and dP again (two more of the five products, 40 % more tensor work) to save the atomics,
which move ``4 · d`` bytes per query row per key block — a small fraction of the block's
``2 · BX · d`` multiply-adds per query row once BX ≥ 64.

The saved log-sum-exp is stored in fp32 whatever the diagram's dtype (bf16 keeps 8 bits of a
number near ln(Nx): P would be off by up to 3 %): the program's launches declare ``P_lse`` as an
fp32 tensor, and :class:`~napkin.codegen.api.CompiledDiagram` takes its tensors' dtypes from
there.

>>> from napkin.diagrams import library
>>> b = library.get("attention_causal").grad(save={"O", "P_lse"})
>>> FAMILY.matches(b), FAMILY.matches(library.get("mha"))
(True, False)
>>> d = b.bind(h=2, q=1000, x=1000, d=128)
>>> prog = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_80")
>>> [k.name.rsplit("_", 1)[-1] for k in prog.launches][0], len(prog.launches)
('prep', 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...diagrams.diagram import Diagram
from ...diagrams.ops import Contract, Map, Value
from ...errors import CodegenError, NapkinError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment, comment_lines, ident
from . import per_diagram
from .attention_problem import woven_reason
from .contraction import _gpu_key, _smem_limit
from .epilogue import (FUNCTIONS, Param, check_index_size, contiguous_strides, ctype, float_param, int_param,
                       render, score_chain, short_hash, signature, stride_param, tensor_param)

__all__ = ["AttentionBackwardFamily", "BackwardProblem", "BackwardConfig", "analyze", "FAMILY", "CONFIGS"]

LOG2E = 1.4426950408889634

#: (BX keys a block, BQ queries a streamed tile) per head dimension, best first. BX / 16 warps,
#: each owning 16 keys; d = 128 keeps 64 + 64 fp32 accumulators of dK and dV and two 16 x BQ
#: score tiles a thread (255 registers at BQ = 64).
CONFIGS = {
    64: ((128, 64), (64, 64), (128, 128)),
    128: ((128, 64), (64, 64)),
}


@dataclass(frozen=True)
class BackwardProblem:
    """What the family read off a backward diagram."""

    Q: Value
    K: Value
    V: Value
    dO: Value
    lse: Value
    O: Value
    maps: tuple[Value, ...]  # the score chain between S and the subtraction of the lse
    ds_scale: float           # the positive scales after P * (dP - D)
    dQ: Value
    dK: Value
    dV: Value
    q: str
    x: str
    d: str
    woven: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class BackwardConfig:
    """``BX`` keys a block (16 a warp), ``BQ`` queries a streamed tile, head dimension ``D``."""

    BX: int
    BQ: int
    D: int

    @property
    def warps(self) -> int:
        return self.BX // 16

    @property
    def threads(self) -> int:
        return self.warps * 32

    def smem_bytes(self, elem: int = 2) -> int:
        lds = self.D + 8
        return (2 * self.BX * lds + 4 * self.BQ * lds + self.BX * (self.BQ + 8)) * elem + 4 * 4 * self.BQ

    def model_smem_bytes(self, elem: int = 2) -> int:
        """K and V of the block, two stages of the Q and dO tiles, the dS tile."""
        return (2 * self.BX * self.D + 4 * self.BQ * self.D + self.BX * self.BQ) * elem

    def model_regs(self) -> int:
        return 255  # __launch_bounds__(THREADS, 1): one block an SM, the whole register file

    def options(self) -> KernelOptions:
        """The typed options a schedule of this configuration carries."""
        return KernelOptions(engine="mma.sync", stages=2, warps=self.warps, blocks_per_sm=1,
                             regs_per_thread=self.model_regs())

    def problem(self) -> str | None:
        qt = self.BQ // 16
        if self.BX % 16 or self.BQ % 16 or self.D % 16:
            return "tiles must be multiples of 16"
        if self.warps % qt or self.D % (self.warps // qt) or (self.D // (self.warps // qt)) % 16:
            return (f"the dQ tile ({self.BQ} x {self.D}) does not split into 16-row, 16-column pieces over "
                    f"{self.warps} warps")
        return None


def _unary_chain(end: Value, start: Value) -> list[Value] | None:
    chain = []
    v = end
    while v is not start:
        if not isinstance(v.op, Map) or len(v.args) != 1:
            return None
        chain.append(v)
        v = v.args[0]
    return chain[::-1]


def _other(v: Value, one: Value) -> Value | None:
    """The argument of the two-argument box ``v`` that is not ``one`` (None unless exactly one is)."""
    if len(v.args) != 2 or sum(a is one for a in v.args) != 1:
        return None
    return v.args[1] if v.args[0] is one else v.args[0]


def _over(v: Value) -> tuple[str, ...]:
    return tuple(v.op.over) if isinstance(v.op, Contract) else ()


def _is_contract(v: Value, over: str) -> bool:
    return isinstance(v.op, Contract) and len(v.args) == 2 and _over(v) == (over,)


def _reason_or_problem(diagram: Diagram) -> BackwardProblem | str:
    outs = diagram.outputs
    if len(outs) != 3 or not all(_is_contract(o, o.op.over[0]) if isinstance(o.op, Contract) and len(o.op.over) == 1
                                 else False for o in outs):
        return "the attention backward writes three contractions (dQ, dK, dV)"
    # P = exp(sub(chain(S), lse))
    exps = [v for v in diagram.nodes if isinstance(v.op, Map) and v.op.fn == "exp" and len(v.args) == 1]
    found = None
    for P in exps:
        sub = P.args[0]
        if isinstance(sub.op, Map) and sub.op.fn == "sub" and len(sub.args) == 2 and sub.args[1].is_input:
            found = (P, sub)
    if found is None:
        return "no P = exp(S − P_lse) recomputed from a saved log-sum-exp"
    P, sub = found
    lse = sub.args[1]
    S = sub.args[0]
    while isinstance(S.op, Map) and len(S.args) == 1:
        S = S.args[0]
    if not isinstance(S.op, Contract) or len(S.args) != 2 or len(_over(S)) != 1:
        return "P does not read scores Q·K through unary maps"
    d = _over(S)[0]
    maps = _unary_chain(sub.args[0], S)
    for m in maps:
        fn = FUNCTIONS.get(m.op.fn)
        if not (m.op.fn == "scale" or (fn is not None and fn.is_mask)):
            return (f"score map {m.op.fn!r}: only positive scales and masks (their derivative passes the "
                    "gradient unchanged) are built into the backward kernel")
    x_cands = [a for a in S.args[1].axis_names if a != d and a not in S.args[0].axis_names]
    Q, K = S.args[0], S.args[1]
    if len(x_cands) != 1:  # the key input first
        x_cands = [a for a in S.args[0].axis_names if a != d and a not in S.args[1].axis_names]
        Q, K = S.args[1], S.args[0]
    if len(x_cands) != 1 or not Q.is_input or not K.is_input:
        return "the scores must contract a query input with a key input"
    x = x_cands[0]
    # the three outputs
    dV = next((o for o in outs if _is_contract(o, o.op.over[0]) and any(a is P for a in o.args)), None)
    if dV is None:
        return "no dV = Σ dO·P among the outputs"
    q = dV.op.over[0]
    dO = _other(dV, P)
    if dO is None:
        return "dV does not contract P with the cotangent dO"
    rest = [o for o in outs if o is not dV]
    dQ = next((o for o in rest if o.op.over == (x,) and any(a is K for a in o.args)), None)
    dK = next((o for o in rest if o.op.over == (q,) and any(a is Q for a in o.args)), None)
    if dQ is None or dK is None or dQ is dK:
        return "no dQ = Σ_x dS·K and dK = Σ_q dS·Q among the outputs"
    dS = _other(dQ, K)
    if dS is None or not any(a is dS for a in dK.args):
        return "dQ and dK do not read the same dS"
    # dS = scales(mul(P, sub(dP, D)))
    ds_scale = 1.0
    v = dS
    while isinstance(v.op, Map) and v.op.fn == "scale" and len(v.args) == 1:
        try:
            ds_scale *= float(v.op.param_values(diagram.sizes)[0])
        except Exception:  # noqa: BLE001 - a symbolic scale (1/√d unbound): known once bound
            ds_scale = math.nan
        v = v.args[0]
    if not (isinstance(v.op, Map) and v.op.fn == "mul" and len(v.args) == 2 and any(a is P for a in v.args)):
        return "dS is not (scales of) P·(dP − D)"
    sub2 = _other(v, P)
    if sub2 is None or not (isinstance(sub2.op, Map) and sub2.op.fn == "sub" and len(sub2.args) == 2):
        return "dS is not (scales of) P·(dP − D)"
    dP, Dv = sub2.args
    V = _other(dP, dO) if _is_contract(dP, d) else None
    if V is None:
        return "dP is not Σ_d dO·V"
    O = _other(Dv, dO) if _is_contract(Dv, d) else None
    if O is None:
        return "D is not Σ_d dO·O inside the diagram"
    if not all(a.is_input for a in (Q, K, V, dO, O, lse)):
        return "Q, K, V, dO, O and P_lse must be inputs"
    known = {id(n) for n in (S, *maps, sub, P, dP, Dv, sub2, v, dQ, dK, dV)}
    w = dS
    while w is not v:
        known.add(id(w))
        w = w.args[0]
    extra = [diagram.name_of(n) for n in diagram.nodes if id(n) not in known]
    if extra:
        return f"boxes {extra} are not part of the attention backward"
    woven = tuple(a for a in Q.axis_names if a not in (q, d))
    for arr, axes in ((K, (*woven, x, d)), (V, (*woven, x, d)), (dO, (*woven, q, d)), (O, (*woven, q, d)),
                      (lse, (*woven, q)), (dQ, (*woven, q, d)), (dK, (*woven, x, d)), (dV, (*woven, x, d))):
        if tuple(arr.axis_names) != axes:
            if set(arr.axis_names) < set(axes):
                return (f"{diagram.name_of(arr)}[{','.join(arr.axis_names)}] is broadcast along a woven axis "
                        "(GQA): dK and dV would sum over the query heads, not built")
            return f"{diagram.name_of(arr)}[{','.join(arr.axis_names)}] must be stored as [{','.join(axes)}]"
    if tuple(Q.axis_names) != (*woven, q, d):
        return f"Q[{','.join(Q.axis_names)}] must be stored as [{','.join((*woven, q, d))}]"
    dts = {a.dtype for a in (Q, K, V, dO, O)}
    if len(dts) != 1 or Q.dtype not in ("bf16", "fp16"):
        return f"dtype {Q.dtype}: the tensor-core template runs bf16 and fp16"
    return BackwardProblem(Q, K, V, dO, lse, O, tuple(maps), ds_scale, dQ, dK, dV, q, x, d, woven, Q.dtype)


def regions(diagram: Diagram) -> tuple[tuple[str, ...], ...]:
    """The boxes of each attention backward inside a larger diagram (a block's backward), for the
    planner's search order (:func:`napkin.codegen.planner._regions`): from each
    ``P = exp(S' − lse)``, the scores and their maps, ``dV`` (the contraction reading P),
    ``dS = scales(P·(dP − D))`` with the contractions ``dP`` and ``D``, and ``dQ``, ``dK`` (the
    contractions reading dS). Whether this family takes the run is :func:`_reason_or_problem`'s
    to say, as for any run.

    >>> from napkin.diagrams import library
    >>> b = library.get("attention_causal").grad(save={"O", "P_lse"})
    >>> sorted(regions(b)[0]) == sorted(b.name_of(v) for v in b.nodes)  # all of it
    True
    """
    out = []
    consumers = diagram.consumers

    def users(v):
        return consumers.get(id(v), ())

    for P in diagram.nodes:
        if not (isinstance(P.op, Map) and P.op.fn == "exp" and len(P.args) == 1):
            continue
        sub = P.args[0]
        if not (isinstance(sub.op, Map) and sub.op.fn == "sub" and len(sub.args) == 2):
            continue
        S = sub.args[0]
        chain = []
        while isinstance(S.op, Map) and len(S.args) == 1:
            chain.append(S)
            S = S.args[0]
        if not (isinstance(S.op, Contract) and len(S.args) == 2):
            continue
        dV = [u for u in users(P) if isinstance(u.op, Contract) and len(u.args) == 2]
        mul = [u for u in users(P) if isinstance(u.op, Map) and u.op.fn == "mul" and len(u.args) == 2]
        if len(dV) != 1 or len(mul) != 1:
            continue
        ds = [mul[0]]
        while len(users(ds[-1])) == 1 and isinstance(users(ds[-1])[0].op, Map) and users(ds[-1])[0].op.fn == "scale":
            ds.append(users(ds[-1])[0])
        grads = [u for u in users(ds[-1]) if isinstance(u.op, Contract)]
        sub2 = _other(mul[0], P)
        if len(grads) != 2 or sub2 is None or not (isinstance(sub2.op, Map) and sub2.op.fn == "sub"):
            continue
        terms = [a for a in sub2.args if isinstance(a.op, Contract)]
        boxes = [S, *reversed(chain), sub, P, *terms, sub2, *ds, dV[0], *grads]
        out.append(tuple(dict.fromkeys(diagram.name_of(v) for v in boxes)))
    return tuple(out)


@per_diagram
def _analysed(diagram: Diagram) -> BackwardProblem | str:
    return _reason_or_problem(diagram)


def analyze(diagram: Diagram) -> BackwardProblem:
    p = _analysed(diagram)
    if isinstance(p, str):
        raise CodegenError(f"attention_bwd family: diagram {diagram.name!r}: {p}")
    return p


def _masking(d: Diagram, p: BackwardProblem):
    """The score chain's C names, its code, the causal offset whose query tiles above a key
    block's diagonal are skipped (None: no causal mask), and whether every tile applies the masks."""
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    chain = score_chain(d, p.maps, index_vars=index_vars)
    if chain.nomask.lines:
        raise CodegenError("attention_bwd family: score maps other than scales and masks are not built")
    causal = None
    always_mask = False
    for fn, prm, axes in chain.masks:
        if fn == "causal" and axes == (p.q, p.x) and float(prm[0]).is_integer() and abs(prm[0]) < 2 ** 30:
            off = int(prm[0])
            causal = off if causal is None else min(causal, off)
        else:
            always_mask = True
    if causal is not None and len(chain.masks) > 1:
        always_mask = True
    return index_vars, chain, causal, always_mask


def visited_tiles(Nq: int, Nx: int, BX: int, BQ: int, causal: int | None) -> int:
    """(key block, query tile) pairs the kernel computes: all of them, or with a causal mask of
    offset ``causal`` those from the tile holding query ``x0 - causal`` on (as the template).

    >>> visited_tiles(1000, 1000, 128, 64, None), visited_tiles(1000, 1000, 128, 64, 0)
    (128, 72)
    """
    tq = math.ceil(Nq / BQ)
    if causal is None:
        return math.ceil(Nx / BX) * tq
    return sum(tq - min(max(x0 - causal, 0), Nq) // BQ for x0 in range(0, Nx, BX))


def _workspace_names(d: Diagram) -> tuple[str, str]:
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    names = ("dq_accum", "dO_dot_O")
    i = 0
    while any(n in taken for n in names):
        i += 1
        names = (f"dq_accum{i}", f"dO_dot_O{i}")
    return names


class AttentionBackwardFamily:
    """Attention's backward (dQ, dK, dV) in one mma.sync kernel, with a pre-pass and a dQ pass."""

    name = "attention_bwd"
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"engine", "stages", "warps", "warpgroups", "blocks_per_sm",
                              "regs_per_thread"})
    #: the planner's limits for runs this family may take (planner.py reads them): the backward has
    #: six contractions (S, dP, D, dQ, dK, dV) and up to 16 boxes with its masks and scales
    max_heavy_boxes = 6
    max_fused_boxes = 16

    def why_not(self, diagram: Diagram) -> str | None:
        p = _analysed(diagram)
        if isinstance(p, str):
            return p
        D = diagram.axes[p.d].size
        if isinstance(D, int) and D not in CONFIGS:
            return f"head dimension {D}: the backward template has tiles for {', '.join(map(str, CONFIGS))}"
        return None

    explain = why_not
    regions = staticmethod(regions)  # where it may sit in a larger diagram (the planner's search order)

    def matches(self, diagram: Diagram) -> bool:
        return self.why_not(diagram) is None

    def configs(self, D: int) -> list[BackwardConfig]:
        return [BackwardConfig(bx, bq, D) for bx, bq in CONFIGS[D]]

    def candidates(self, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
        p = analyze(diagram)
        D = diagram.axes[p.d].size
        if not isinstance(D, int):
            raise CodegenError("attention_bwd family: bind the head dimension before asking for candidates")
        limit = _smem_limit(gpu)
        from . import attention_bwd_wgmma  # the Hopper kernel (wgmma, TMA) where the GPU has wgmma

        return [self.schedule(diagram, c, gpu=gpu, dtype=dtype) for c in self.configs(D)
                if c.smem_bytes() <= limit and c.problem() is None] + attention_bwd_wgmma.candidates(
                    self, diagram, gpu, dtype)

    @staticmethod
    def _engine(schedule: Schedule) -> str | None:
        return schedule.kernels[0].options.engine if len(schedule.kernels) == 1 else None

    # what the Hopper kernel's module reads through the family (it does not import this module)
    problem = staticmethod(analyze)
    masking = staticmethod(_masking)
    workspace_names = staticmethod(_workspace_names)
    visited_tiles = staticmethod(visited_tiles)

    def schedule(self, diagram: Diagram, cfg: BackwardConfig, gpu="h100", dtype: str | None = None) -> Schedule:
        """``q`` streamed at SMEM (s_q = BQ), one combination of the woven axes a block, and the
        block's keys said by its warps (16 keys a warp: BX = 16 · warps). The model's relabelling
        cannot group ``x`` (dQ sums over it): it sees one kernel over the whole of ``x`` per
        woven combination, and :meth:`launch_estimate` states the key blocks it launches, the
        re-reads of Q and dO per key block and the dQ atomics."""
        p = analyze(diagram)
        s = Schedule.fused(diagram, groups={a: 1 for a in p.woven}, streams={p.q: cfg.BQ},
                           gpu=_gpu_key(gpu), dtype=dtype or p.dtype)
        return s.replace(kernels=(s.kernels[0].replace(family=self.name, options=cfg.options()),))

    def config_of(self, p: BackwardProblem, diagram: Diagram, schedule: Schedule) -> BackwardConfig:
        if len(schedule.kernels) != 1:
            raise CodegenError("attention_bwd family: the schedule must fuse every box into one kernel")
        D = diagram.axes[p.d].bound_size
        BQ = None
        for r in schedule.kernels[0].relabels:
            if r.is_symbolic:
                raise CodegenError(f"attention_bwd family: {r} has no size; bind {r.symbol} first")
            if r.kind == "stream" and r.axis == p.q and r.level == "SMEM":
                BQ = int(r.size)
            elif r.kind == "group" and r.axis in p.woven and int(r.size) == 1:
                pass
            else:
                raise CodegenError(f"attention_bwd family: the template cannot realise {r} (it streams "
                                   f"{p.q} at SMEM, one woven combination a block)")
        opts = schedule.kernels[0].options
        if opts.engine not in (None, "mma.sync"):
            raise CodegenError(f"attention_bwd family: engine {opts.engine} is not built here (mma.sync)")
        default = self.configs(D)[0] if D in CONFIGS else BackwardConfig(128, 64, D)
        cfg = BackwardConfig(16 * opts.warps if opts.warps else default.BX, BQ or default.BQ, D)
        why = cfg.problem()
        if why:
            raise CodegenError(f"attention_bwd family: {cfg.BX} keys a block ({cfg.warps} warps), "
                               f"s_{p.q}={cfg.BQ}, d={D}: {why}")
        if not 2 <= cfg.warps <= 16:
            raise CodegenError(f"attention_bwd family: {cfg.warps} warps a block (2 to 16)")
        return cfg

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu=None) -> dict:
        """The main launch (blocks, threads, registers, shared memory, the Q and dO tiles in flight),
        its query tiles a block, and what the model does not see: the pre-pass and the dQ
        conversion (two launches; D, the zeroed and re-read fp32 workspace, dQ written again), the
        dQ atomics (one fp32 add per query row, column and key block, at the L2: four adds of a
        warp's instruction share a 32-byte sector), Q and dO re-read by every key block, and the
        warps' operand loads from shared memory (``extra_smem_bytes``: each warp reads whole query
        tiles for its 16 keys; on an H200 these bring the prediction within 0-25 % of the
        measured time, against 1.8x optimistic without them)."""
        if self._engine(schedule) == "wgmma":
            from . import attention_bwd_wgmma

            return attention_bwd_wgmma.launch_estimate(self, diagram, schedule, gpu)
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        sz = diagram.sizes
        nz = math.prod(sz[a] for a in p.woven)
        Nq, Nx = sz[p.q], sz[p.x]
        kb = math.ceil(Nx / cfg.BX)
        rows = nz * Nq
        elem = 2
        ws = rows * cfg.D * 4
        est = dict(blocks=kb * nz, threads=cfg.threads, regs=cfg.model_regs(), smem=cfg.smem_bytes(),
                   in_flight_bytes_per_thread=2 * cfg.BQ * cfg.D * elem / cfg.threads,
                   stream_steps=math.ceil(Nq / cfg.BQ), threads_per_row=4)
        # the (key block, query tile) pairs computed: causal skips those above the diagonal (the
        # model's FLOPs stay dense, so a causal prediction is pessimistic; the terms below are not)
        visited = visited_tiles(Nq, Nx, cfg.BX, cfg.BQ, _masking(diagram, p)[2])
        share = visited / (kb * math.ceil(Nq / cfg.BQ))
        atomics = kb * rows * cfg.D * share
        # the FlashAttention-2 backward issues its five products and the exp between them from the
        # same warps (as the forward template): tensor, CUDA-core and SFU times add
        est.update(tensor_path="mma.sync", overlap_operands=False, overlap_compute=False)
        est["extra_launches"] = 2
        # prep: reads dO and O (D is the diagram's, counted), writes D and zeroes the workspace;
        # the conversion reads the workspace and writes dQ again (the model counted dQ once)
        est["extra_hbm_bytes"] = rows * 4 + ws + ws + rows * cfg.D * elem
        # L2: the dQ atomics (4 adds of a warp instruction share a 32-byte sector: 8 bytes each), and
        # Q, dO, lse and D read again by every key block after the first (the model reads them once)
        est["extra_l2_bytes"] = atomics * 8 + max(0.0, kb * share - 1) * rows * (2 * cfg.D * elem + 8)
        # SMEM -> registers: what the model's schedule (q streamed, x whole) cannot describe; every
        # warp's ldmatrix of a query tile (16-byte rows of 8 x 8 pieces, 512 bytes an x4 load):
        # S^T, dP^T: its 16 keys of K and V, the whole Q and dO tiles; dV, dK: dO and Q again;
        # dQ: the dS^T tile's 16-row piece and its DC columns of K per 16 keys
        qt, kd = cfg.BQ // 16, cfg.D // 16
        dc = cfg.D // (cfg.warps // qt)
        per_warp = kd * (2 + 2 * qt) + qt * kd * 2 + (cfg.BX // 16) * (1 + dc // 16)
        est["extra_smem_bytes"] = 512 * per_warp * cfg.warps * visited * nz
        return est

    def builds_for(self, schedule: Schedule, arch: str) -> bool:
        """Whether ``schedule`` can be built for ``arch`` (see :meth:`build_reason`)."""
        return self.build_reason(schedule, arch) is None

    def build_reason(self, schedule: Schedule, arch: str) -> str | None:
        """Why ``schedule`` cannot be built for ``arch``, or None: the wgmma kernel needs sm_90a,
        and a launch walks at most ``MAX_WOVEN`` combinations of the woven axes (grid.y, then grid.z)."""
        if self._engine(schedule) == "wgmma" and arch != "sm_90a":
            return f"its wgmma kernels need sm_90a, not {arch}"
        d = schedule.diagram
        try:
            p = analyze(d)
        except NapkinError:
            return None
        if all(isinstance(d.sizes.get(a), int) for a in p.woven):
            return woven_reason(math.prod(d.sizes[a] for a in p.woven))
        return None

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        reason = self.why_not(diagram)
        if reason:
            raise CodegenError(f"attention_bwd family: diagram {diagram.name!r}: {reason}")
        if not diagram.is_bound:
            raise CodegenError(f"attention_bwd family: bind the sizes of {diagram.name!r} first")
        if self._engine(schedule) == "wgmma":
            from . import attention_bwd_wgmma

            return attention_bwd_wgmma.lower(self, diagram, schedule, arch)
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        check_derived(self.name, schedule.kernels[0].name, schedule.kernels[0].options, cfg.options())
        smem = cfg.smem_bytes()
        limit = _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"attention_bwd family: the tiles need {smem} bytes of shared memory; "
                               f"{arch} allows {limit} per block")
        launches, buffers = self._launches(diagram, p, cfg)
        return Program(diagram, schedule, self.name, tuple(launches), tuple(buffers), dict(diagram.sizes))

    def _launches(self, d: Diagram, p: BackwardProblem, cfg: BackwardConfig):
        T = p.dtype
        sz = d.sizes
        Nq, Nx = sz[p.q], sz[p.x]
        check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30, "attention_bwd")
        check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30, "attention_bwd")
        nz = math.prod(sz[a] for a in p.woven)
        if why := woven_reason(nz):
            raise CodegenError(f"attention_bwd family: {why}")
        ws_dq, ws_D = _workspace_names(d)
        names = {id(v): d.name_of(v) for v in (p.dQ, p.dK, p.dV)}
        st = {k: contiguous_strides(v) for k, v in dict(Q=p.Q, K=p.K, V=p.V, dO=p.dO, O=p.O, lse=p.lse,
                                                          dQ=p.dQ, dK=p.dK, dV=p.dV).items()}
        woven = []
        wparams: dict[str, list[Param]] = {"main": [], "prep": [], "dq": []}
        for ax in p.woven:
            e = dict(size=ident(ax, "n_"), axis=ax)
            for k in st:
                e[f"s_{k}"] = ident(ax, f"s{k}_w_")
            woven.append(e)
            size = int_param(e["size"], sz[ax])
            wparams["main"] += [size] + [stride_param(e[f"s_{k}"], st[k][ax]) for k in
                                         ("Q", "K", "V", "dO", "lse", "dK", "dV")]
            wparams["prep"] += [size, stride_param(e["s_dO"], st["dO"][ax]), stride_param(e["s_O"], st["O"][ax])]
            wparams["dq"] += [size, stride_param(e["s_dQ"], st["dQ"][ax])]
        index_vars, chain, causal, always_mask = _masking(d, p)
        lse_arg = Param(Arg("tensor", p.lse.name, dtype="fp32", axes=p.lse.axis_names),
                        Code("const float* __restrict__ lse"))
        ws_dq_arg = Param(Arg("tensor", ws_dq, dtype="fp32", axes=()), Code("float* __restrict__ ws_dq"))
        ws_D_in = Param(Arg("tensor", ws_D, dtype="fp32", axes=()), Code("const float* __restrict__ ws_D"))
        ws_D_out = Param(Arg("tensor", ws_D, dtype="fp32", axes=()), Code("float* __restrict__ ws_D"))
        main: list[Param] = [
            tensor_param(p.Q, "Q", T), tensor_param(p.K, "K", T), tensor_param(p.V, "V", T),
            tensor_param(p.dO, "dO", T), lse_arg,
            tensor_param(p.dK, "dK", T, const=False, name=names[id(p.dK)]),
            tensor_param(p.dV, "dV", T, const=False, name=names[id(p.dV)]),
            ws_dq_arg, ws_D_in,
            int_param("Nq", Nq), int_param("Nx", Nx),
            int_param("sQ_q", st["Q"][p.q]), int_param("sK_x", st["K"][p.x]), int_param("sV_x", st["V"][p.x]),
            int_param("sdO_q", st["dO"][p.q]), int_param("sdK_x", st["dK"][p.x]), int_param("sdV_x", st["dV"][p.x]),
            float_param("scale_log2", chain.factor * LOG2E), float_param("ds_scale", p.ds_scale),
        ] + wparams["main"]
        prep: list[Param] = [
            tensor_param(p.dO, "dO", T), tensor_param(p.O, "O", T), ws_dq_arg, ws_D_out,
            int_param("n_woven", nz), int_param("Nq", Nq),
            int_param("sdO_q", st["dO"][p.q]), int_param("sO_q", st["O"][p.q]),
        ] + wparams["prep"]
        dq: list[Param] = [
            Param(Arg("tensor", ws_dq, dtype="fp32", axes=()), Code("const float* __restrict__ ws_dq")),
            tensor_param(p.dQ, "dQ", T, const=False, name=names[id(p.dQ)]),
            int_param("n_woven", nz), int_param("Nq", Nq), int_param("sdQ_q", st["dQ"][p.q]),
            float_param("ds_scale", p.ds_scale),
        ] + wparams["dq"]
        tag = short_hash(T, [str(x) for x in chain.full.lines], p.woven, causal, always_mask, cfg)
        kname = Code(f"napkin_attn_bwd_{T}_d{cfg.D}_x{cfg.BX}_q{cfg.BQ}_{tag}")
        legend = [
            "(sequence lengths and woven sizes are kernel arguments; D is compiled in)",
            f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()}, {p.dO.label()}, "
            f"{p.lse.label()} (fp32), {p.O.label()} -> {names[id(p.dQ)]}, {names[id(p.dK)]}, {names[id(p.dV)]}, {T}",
            f"  {p.x} -> keys Nx:    g_{p.x} = BX = {cfg.BX} (grid.x), w_{p.x} = 16 (a warp's keys)",
            f"  {p.q} -> queries Nq: s_{p.q} = BQ = {cfg.BQ} (streamed, two stages)",
            f"  {p.d} -> D = {cfg.D}",
        ] + [f"  {ax} -> woven (grid.y)" for ax in p.woven] + [
            f"  score maps: {', '.join(chain.boxes) or 'none'}; scale folded: {chain.factor:.6g}; "
            f"dS scale: {p.ds_scale:.6g}",
            f"  workspaces: {ws_dq} [woven][Nq][D], {ws_D} [woven][Nq] (fp32)",
        ]
        if causal is not None:
            legend.append(f"  causal (offset {causal}): query tiles above a key block's diagonal skipped")
        ctx = dict(kname=kname, T=ctype(T), D=cfg.D, BX=cfg.BX, BQ=cfg.BQ, FOLD=grid_folds(nz), NZ=nz,
                   params=signature(main), prep_params=signature(prep), dq_params=signature(dq),
                   woven=woven, legend=comment_lines(legend), CAUSAL=causal, ALWAYS_MASK=always_mask,
                   IDX_ROW=index_vars[p.q], IDX_COL=index_vars[p.x],
                   full_body=chain.full.body("        "), full_result=chain.full.result,
                   chain_desc=comment(", ".join(chain.boxes) or "none"))
        # one rendering per launch (each its own namespace): a program's source is its launches' sources
        src = {part: render("attention_bwd.cu.jinja", PART=part, ns=Code(f"{kname}_{part}"), **ctx)
               for part in ("prep", "main", "dq")}
        rows = nz * Nq
        tunables = (("BX", cfg.BX), ("BQ", cfg.BQ), ("D", cfg.D), ("causal", causal))
        common = dict(template="attention_bwd.cu.jinja")
        launches = [
            KernelLaunch(name=f"{kname}_prep", source=src["prep"], grid=(math.ceil(rows / 8), 1, 1), block=(256, 1, 1), shared_bytes=0,
                         args=tuple(x.arg for x in prep), tunables=(("D", cfg.D),), model_smem_bytes=0,
                         model_regs_per_thread=32, **common),
            KernelLaunch(name=str(kname), source=src["main"], grid=(math.ceil(Nx / cfg.BX), *fold_grid(nz)),
                         block=(cfg.threads, 1, 1),
                         shared_bytes=cfg.smem_bytes(), args=tuple(x.arg for x in main), tunables=tunables,
                         model_smem_bytes=cfg.model_smem_bytes(), model_regs_per_thread=cfg.model_regs(), **common),
            KernelLaunch(name=f"{kname}_dq", source=src["dq"], grid=(math.ceil(rows * (cfg.D // 4) / 256), 1, 1), block=(256, 1, 1),
                         shared_bytes=0, args=tuple(x.arg for x in dq), tunables=(("D", cfg.D),), model_smem_bytes=0,
                         model_regs_per_thread=32, **common),
        ]
        buffers = [Buffer(ws_dq, ("row", p.d), (rows, cfg.D), "fp32"), Buffer(ws_D, ("row",), (rows,), "fp32")]
        return launches, buffers


FAMILY = AttentionBackwardFamily()
