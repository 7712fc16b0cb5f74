"""The streamed attention family: FlashAttention-2 style forward on mma.sync.

A diagram belongs here when it is ``O = softmax_x(mods(Q·K over d))·V``: one contraction of two
inputs ``Q[.., q, d]`` and ``K[.., x, d]``, a chain of unary whitelisted maps on the scores
(scale, soft-capping, ALiBi, causal and sliding-window masks — read off the diagram's Map boxes),
a softmax over the key axis ``x`` and a contraction with ``V[.., x, d]`` over ``x``; woven over any
further axes of Q (heads ``h``, GQA query groups ``j``), K and V broadcast along those they lack.
The library's ``attention``, ``mha``, ``attention_causal``, ``gqa``, ``attention_window``,
``attention_alibi`` and ``attention_softcap`` are all of this shape. bf16 and fp16 only: fp32
attention is left to the fallback family.

Schedule: group ``q`` at SMEM (``g_q`` rows per thread block) and at RF (``w_q`` rows per warp,
16 or 32), stream ``x`` at SMEM in chunks of ``s_x`` (K/V pipeline of ``stages=N``, default 2).
Positive scales fold into the softmax's exp2; masks that come last let whole key blocks be
skipped (causal, sliding window) and leave the per-element mask to the blocks on the boundary.
Head dimensions: every multiple of 16 up to 256 (64, 80, 96, 128, 192 and 256 have their own
tile tables, :data:`CONFIGS`); others are refused with the reason (the mma's k step is 16, and
the output tile lives in registers).

Decode and short queries (q from 1 to 64 against long x) get two more things, both chosen by the
model among the candidates:

- **packed rows** (GQA): the woven axes K and V lack (``j``, the query heads sharing a key/value
  head) are grouped whole with ``q`` into one tile of ``warps · w_q`` rows, so a key/value head
  is read once for all its query heads; the schedule says it as a group of ``j`` at SMEM;
- **split x** (``KernelOptions.splits``): ``splits`` blocks share one query tile, each streaming
  an equal share of its key chunks and writing its rows' ``O / l`` (fp32) and log2-sum-exp2 to an
  HBM workspace; the last of a tile's splits to arrive (a self-resetting arrival counter per
  tile, in a persistent workspace zeroed once: ``Buffer.zeroed``) combines them in a fixed order
  and writes O, so a split costs no second launch. ``launch_estimate`` states the workspace
  bytes;
- **warps along x** (``KernelOptions.threads_per_row = 4 · WX``): a 16-row tile's block has WX
  warps, each walking its share of every chunk's keys; their maxima, sums and outputs merge
  through shared memory after the loop, in warp order.

>>> from napkin.diagrams import library
>>> fam = AttentionFamily()
>>> fam.matches(library.get("gqa")), fam.matches(library.get("mlp"))
(True, False)
>>> d = library.get("attention_causal").bind(h=2, q=1000, x=1000, d=128)
>>> prog = fam.lower(d, fam.candidates(d, "h100", "bf16")[0], "sm_90a")
>>> prog.launches[0].grid, prog.launches[0].block
((8, 2, 1), (128, 1, 1))
>>> g = library.get("gqa").bind(h=8, j=4, q=1, x=8192, d=128)
>>> best = fam.config_of(analyze(g), g, rank_first(g))
>>> best.packed, best.BQ, best.splits > 1
(True, 16, True)
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

from ...diagrams.axes import is_name
from ...diagrams.diagram import Diagram
from ...diagrams.ops import Contract, Map, Softmax, Value
from ...dtypes import dtype as lookup_dtype
from ...errors import CodegenError, NapkinError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment, comment_lines, ident
from .attention_problem import MAX_WOVEN, AttentionProblem, woven_reason
from .contraction import _gpu_key, _smem_limit
from .epilogue import (Param, check_index_size, contiguous_strides, ctype, float_param, index_size_problem,
                       int_param, render, score_chain, short_hash, signature, stride_param, tensor_param)

__all__ = ["AttentionFamily", "AttentionProblem", "AttentionConfig", "analyze", "FAMILY", "CONFIGS",
           "PLAIN_CONFIGS", "DECODE_CONFIGS", "HEAD_DIMS", "MAX_SPLITS", "COMBINE_BATCH", "combine_batch",
           "combine_tail_round_trips"]

LOG2E = 1.4426950408889634
PAD = 8

#: (g_q, s_x, w_q, stages, thread blocks per SM assumed) per head dimension, best first; a head
#: dimension between two keys takes the larger key's table (d = 112 the table of 128).
#: The blocks per SM set the register budget (``__launch_bounds__``): 65536 / (threads x blocks).
#: Configurations whose S and O tiles overflow 255 registers (w_q = 32 with s_x = 64 at d = 128,
#: s_x = 128 at d = 64) are left out: they spill.
#: With w_q = 32 and d > 64 the S tile of a 64-key chunk does not fit beside O: such chunks are
#: walked in register sub-chunks of t_x = 32 keys (a stream of x at RF; see AttentionConfig.SX).
#: d = 192 and 256 keep w_q = 16 (the output tile alone is 96 or 128 registers a thread) and
#: 64-row blocks (two stages of 64-key chunks fit the 163 KiB of an sm_80 block at d = 192).
CONFIGS = {
    64: ((128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    80: ((128, 32, 32, 2, 2), (128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    96: ((128, 32, 32, 2, 2), (128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    128: ((128, 32, 32, 2, 2), (128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    192: ((64, 32, 16, 2, 2), (64, 64, 16, 2, 1)),
    256: ((64, 32, 16, 2, 2), (64, 64, 16, 2, 1)),
}

#: The head dimensions with their own tile tables (every multiple of 16 up to 256 runs).
HEAD_DIMS = tuple(sorted(CONFIGS))

#: Kept for callers that asked for configurations of plain attention (no score modifiers).
PLAIN_CONFIGS = {d: () for d in CONFIGS}

#: Small query tiles for decode and short queries (at most 64 rows of a key/value head: q, or q
#: times the packed query heads): (g_q, s_x, w_q, stages, blocks per SM, warps along x). A tile of
#: 16 or 32 rows is one or two warps' worth; its block keeps four warps busy by splitting every
#: chunk's keys over WX warps (each a sub-chunk of s_x / WX keys, merged after the loop), as one
#: warp alone issues from one of an SM's four schedulers (an H100 measured a one-warp decode block
#: at a quarter of the copy rate). Deeper K/V pipelines, as a block has little else to overlap
#: its loads with. Offered beside CONFIGS, with and without packing and splits; the model picks.
#: Keys as in CONFIGS. At d = 256 a 16-row tile takes four warps along x (two, each holding a
#: 16 x 256 output beside its 16-key scores, spill when the merge writes O itself).
#: At d = 128 the 16-row tile runs 64-key chunks three deep: two sweeps of GQA decode on an H200
#: (8 K/V heads, x = 4k-128k, L2 flushed; benchmarks/decode_sweep.py, its results in
#: benchmarks/results/nvidia-h200/decode_sweep.json) measured it faster at every x than the same
#: tile two deep (3-12 % at that tile's best split count, 3 blocks an SM; 10-21 % at 16 splits),
#: 128-key chunks two deep (3-14 %) and 64-key chunks four deep (1-5 %), where the model ties the
#: depths or prefers the fewer, larger steps. Those tiles are not offered at d = 128.
DECODE_CONFIGS = {
    64: ((16, 64, 16, 3, 2, 4), (16, 128, 16, 2, 2, 4), (32, 64, 16, 3, 2, 2), (64, 64, 16, 3, 2, 1)),
    128: ((16, 64, 16, 3, 2, 4), (32, 64, 16, 3, 2, 2), (64, 64, 16, 2, 2, 1)),
    192: ((16, 64, 16, 2, 2, 4), (16, 32, 16, 3, 2, 2), (32, 32, 16, 3, 2, 2), (64, 32, 16, 2, 2, 1)),
    256: ((16, 64, 16, 2, 1, 4), (32, 32, 16, 3, 2, 2), (64, 32, 16, 2, 2, 1)),
}

#: Queries (q) up to which the small tiles of DECODE_CONFIGS, packing and split-only candidates
#: are offered.
DECODE_ROWS = 64

#: The most blocks one query tile's keys are split over (grid.z); a split keeps at least
#: MIN_SPLIT_CHUNKS chunks of keys, so that its pipeline fills.
MAX_SPLITS = 128
MIN_SPLIT_CHUNKS = 2

#: The most splits one thread of a tile's combine (in the last split block to arrive) loads at
#: once (registers: a float4 and a float each; the loop's registers are free by then).
COMBINE_BATCH = 16


#: Memory round trips a split tile's last block waits for besides the combine's loads: its rows'
#: partials stored, the fence, the arrival on the tile's counter. With one round trip a batch of
#: COMBINE_BATCH partials (:func:`combine_tail_round_trips`) this is the measured tail, from a
#: block's loop end to O written (H200, GQA decode at d = 128, per-block %globaltimer stamps of
#: benchmarks/decode_timeline.py: 3.2 us at 16 splits, one batch; 4.3-5.4 us at 32, two; 6.0-8.9
#: us at 49, four), against the profile's 0.8 us memory latency: 3.2, 4.0 and 5.6 us.
SPLIT_TAIL_ROUND_TRIPS = 3


def combine_tail_round_trips(splits: int) -> int:
    """Memory round trips from a split block's loop end to the tile's O: the partials' stores,
    fence and arrival, then one a batch of :func:`combine_batch` partials the last block loads.

    >>> combine_tail_round_trips(16), combine_tail_round_trips(49)
    (4, 7)
    """
    return SPLIT_TAIL_ROUND_TRIPS + math.ceil(splits / combine_batch(splits))


def combine_batch(splits: int) -> int:
    """The splits NB whose partials a thread of the combine loads before it uses any: all of them
    up to COMBINE_BATCH, so the combine waits about one L2 round trip a COMBINE_BATCH splits.

    >>> combine_batch(9), combine_batch(33)
    (9, 16)
    """
    return max(1, min(COMBINE_BATCH, splits))


def rank_first(diagram: Diagram, gpu: str = "h100"):
    """The schedule the model ranks first among the family's candidates (for examples and tests)."""
    from ..select import rank

    return rank(diagram, FAMILY, gpu, diagram.dtypes and sorted(diagram.dtypes)[0] or "bf16")[0].schedule


@dataclass(frozen=True)
class AttentionConfig:
    """One tile configuration: ``BQ`` rows per block (g_q, or the packed rows), ``BX`` keys per
    chunk (s_x), ``WQ`` rows per warp (w_q), the K/V pipeline's ``stages``, the head dimension
    ``D``, the blocks per SM the register budget assumes, ``sx`` keys per register sub-chunk (0:
    the default rule), ``splits`` blocks sharing one query tile's keys (a workspace, combined by
    the last of them to arrive, when > 1), ``packed``: the woven axes K and V lack share the tile's rows
    with q (GQA decode), and ``wx`` warps along x sharing each warp tile's rows (each walks
    every WX-th sub-chunk of a chunk; merged through shared memory after the loop)."""

    BQ: int
    BX: int
    WQ: int
    stages: int
    D: int
    blocks_per_sm: int = 1
    sx: int = 0  # t_x: keys per register sub-chunk (0: the default rule)
    splits: int = 1
    packed: bool = False
    wx: int = 1

    @property
    def SX(self) -> int:
        """Keys of S held in registers at once: BX, or 32 when a w_q = 32 warp's WQ x BX scores
        would not fit beside its WQ x D output (d > 64); a chunk's share of one warp along x
        (BX / WX) where WX > 1."""
        if self.sx:
            return self.sx
        if self.wx > 1:
            return self.BX // self.wx
        return 32 if (self.WQ == 32 and self.D > 64 and self.BX > 32) else self.BX

    @property
    def threads(self) -> int:
        return self.BQ // self.WQ * self.wx * 32

    @property
    def q_in_regs(self) -> bool:
        """Q fragments stay in registers when they take at most 32 registers a thread."""
        return (self.WQ // 16) * (self.D // 16) * 4 <= 32

    def smem_bytes(self, elem: int = 2) -> int:
        tiles = (self.BQ + 2 * self.stages * self.BX) * (self.D + PAD) * elem
        if self.wx == 1:
            return tiles
        # the merge after the loop reuses it: per warp along x, a max and a sum per row and the
        # rows' fp32 outputs (rows of D + 4)
        return max(tiles, 4 * self.wx * self.BQ * (2 + self.D + 4))

    def model_smem_bytes(self, elem: int = 2) -> int:
        """The model's accounting: K and V chunks times the stages, plus the Q tile."""
        return (2 * self.BX * self.D * self.stages + self.BQ * self.D) * elem

    def model_regs(self) -> int:
        """The register budget per thread: what keeps ``blocks_per_sm`` blocks resident."""
        return min(255, 65536 // (self.threads * self.blocks_per_sm) // 8 * 8)

    def options(self) -> KernelOptions:
        """The typed options a schedule of this configuration carries."""
        # the threads sharing a row of S: the 4 lanes of an mma fragment row in each warp along x
        return KernelOptions(engine="mma.sync", stages=self.stages, warps=self.threads // 32,
                             threads_per_row=4 * self.wx if self.wx > 1 else None,
                             blocks_per_sm=self.blocks_per_sm, regs_per_thread=self.model_regs(),
                             splits=self.splits if self.splits > 1 else None)

    @property
    def kv_copies(self) -> int:
        """16-byte copies of K (and as many of V) a thread issues for one chunk."""
        return -(-self.BX * (self.D // 8) // self.threads)

    @property
    def kv_unroll(self) -> int:
        """How far the chunk's copy loop is unrolled: all of it up to 16 copies a thread, else 8
        (the addresses of 32 copies, held at once by a one-warp block, spill)."""
        return self.kv_copies if self.kv_copies <= 16 else 8

    @property
    def kv_columns(self) -> bool:
        """Whether the K/V loader keeps one column of 16-byte pieces per thread (the pieces of a
        row divide the threads and the chunk's rows split evenly), else it walks the chunk as a
        flat run of pieces (d = 80, 96, ...)."""
        per_row = self.D // 8
        return self.threads % per_row == 0 and self.BX % (self.threads // per_row) == 0


def _chain(S: Value, P: Value) -> list[Value] | None:
    """The unary maps from S to the softmax's input, in order (None if not such a chain)."""
    chain = []
    v = P.args[0]
    while v is not S:
        if not isinstance(v.op, Map) or len(v.args) != 1:
            return None
        chain.append(v)
        v = v.args[0]
    return list(reversed(chain))


def _lse_nodes(L: Value, X: Value) -> list[Value] | None:
    """The boxes of ``L = log(Σ_x exp(X − z)) + z`` with ``z = zero_inf(max_x X)`` (the log-sum-exp
    :func:`napkin.diagrams.grad.forward_with_saves` outputs for a softmax of X), or None."""
    def fn(v, name, n=1):
        return isinstance(v.op, Map) and v.op.fn == name and len(v.args) == n

    if not fn(L, "add", 2):
        return None
    lg, z = L.args
    if not (fn(lg, "log") and fn(z, "zero_inf") and getattr(z.args[0].op, "how", None) == "max"):
        return None
    sm = lg.args[0]
    if getattr(sm.op, "how", None) != "sum" or not fn(sm.args[0], "exp") or not fn(sm.args[0].args[0], "sub", 2):
        return None
    sub = sm.args[0].args[0]
    mx = z.args[0]
    if sub.args[0] is not X or sub.args[1] is not z or mx.args[0] is not X:
        return None
    return [L, lg, z, mx, sm, sm.args[0], sub]


def _reason_or_problem(diagram: Diagram) -> AttentionProblem | str:
    lse = None
    if len(diagram.outputs) == 2:  # the forward with its saved log-sum-exp (grad's P_lse)
        lse = diagram.outputs[1]
    elif len(diagram.outputs) != 1:
        return "attention writes one output (and its rows' log-sum-exp)"
    O = diagram.outputs[0]
    if not isinstance(O.op, Contract) or len(O.args) != 2 or len(O.op.over) != 1:
        return "the output is not a contraction of the probabilities with V over one axis"
    x = O.op.over[0]
    softmaxes = [a for a in O.args if isinstance(a.op, Softmax)]
    if len(softmaxes) != 1:
        return "the output contraction does not read a softmax"
    P = softmaxes[0]
    V = O.args[1] if O.args[0] is P else O.args[0]
    if P.op.over != x or not V.is_input:
        return f"the softmax must run over the contracted axis {x!r} and V must be an input"
    S = P.args[0]
    while isinstance(S.op, Map) and len(S.args) == 1:
        S = S.args[0]
    if not isinstance(S.op, Contract) or len(S.args) != 2 or len(S.op.over) != 1:
        return "the softmax does not read scores Q·K (through unary maps)"
    d = S.op.over[0]
    chain = _chain(S, P)
    if chain is None:
        return "the score modifiers are not a chain of unary maps"
    Qs = [a for a in S.args if x not in a.axis_names]
    Ks = [a for a in S.args if x in a.axis_names]
    if len(Qs) != 1 or len(Ks) != 1 or not Qs[0].is_input or not Ks[0].is_input:
        return "the scores must contract a query input (without x) with a key input (with x)"
    Q, K = Qs[0], Ks[0]
    known = {id(v) for v in (S, P, O, *chain)}
    lse_boxes = [] if lse is None else _lse_nodes(lse, P.args[0])
    if lse_boxes is None:
        return "the second output is not the log-sum-exp of the softmax's scores"
    known |= {id(v) for v in lse_boxes}
    extra = [diagram.name_of(v) for v in diagram.nodes if id(v) not in known]
    if extra:
        return f"boxes {extra} are not part of the attention pattern"
    for v in (S, P, *chain):
        users = diagram.consumers.get(id(v), ())
        if len(users) != (3 if lse is not None and v is P.args[0] else 1):  # the softmax (and the lse's max, sub)
            return f"{diagram.name_of(v)} is read by {len(users)} boxes"
    dv_axes = [n for n in V.axis_names if n != x and n not in Q.axis_names]
    dv = d if d in V.axis_names else (dv_axes[0] if len(dv_axes) == 1 else None)
    if dv is None:
        return f"V {V.label()} needs one value axis (the head dimension)"
    q_cands = [n for n in Q.axis_names if n != d and n not in K.axis_names and n not in V.axis_names]
    if not q_cands:
        return f"Q {Q.label()} has no query axis"
    q = None
    for m in chain:
        ia = m.op.index_axes
        if x in ia:
            for n in ia:
                if n in q_cands:
                    q = n
    if q is None:
        q = "q" if "q" in q_cands else q_cands[-1]
    woven = tuple(n for n in Q.axis_names if n not in (q, d))
    for n in K.axis_names:
        if n not in (x, d) and n not in woven:
            return f"K's axis {n!r} is neither the key, the head dimension nor woven"
    for n in V.axis_names:
        if n not in (x, dv) and n not in woven:
            return f"V's axis {n!r} is neither the key, the value dimension nor woven"
    if set(O.axis_names) != set(woven) | {q, dv}:
        return f"the output carries {list(O.axis_names)}"
    for arr, last in ((Q, d), (K, d), (V, dv), (O, dv)):
        if arr.axis_names[-1] != last:
            return f"{diagram.name_of(arr)}[{','.join(arr.axis_names)}] must be stored with {last!r} last"
    if len({v.dtype for v in (Q, K, V)}) != 1:
        return "Q, K, V have different dtypes"
    return AttentionProblem(Q, K, V, S, tuple(chain), P, O, q, x, d, dv, woven, Q.dtype, lse)


def regions(diagram: Diagram) -> tuple[tuple[str, ...], ...]:
    """The boxes of each attention inside a larger diagram, for the planner's search order
    (:func:`napkin.codegen.planner._regions`): the scores ``Q·K``, their unary maps, the softmax,
    ``P·V``, and the rows' log-sum-exp where the diagram also computes it (the forward of a
    training step that saves it), so that one run of the order holds what this family fuses.
    Whether it really takes the run is :func:`_reason_or_problem`'s to say, as for any run.

    >>> from napkin.diagrams import library
    >>> regions(library.get("transformer_block"))
    (('S', 'S_scaled', 'S_masked', 'P', 'O'),)
    """
    out = []
    consumers = diagram.consumers
    for P in diagram.nodes:
        if not isinstance(P.op, Softmax):
            continue
        Os = [u for u in consumers.get(id(P), ()) if isinstance(u.op, Contract) and len(u.args) == 2
              and tuple(u.op.over) == (P.op.over,)]
        S = P.args[0]
        chain = []
        while isinstance(S.op, Map) and len(S.args) == 1:
            chain.append(S)
            S = S.args[0]
        if len(Os) != 1 or not (isinstance(S.op, Contract) and len(S.args) == 2):
            continue
        boxes = [S, *reversed(chain), P, Os[0]]
        for L in consumers.get(id(P.args[0]), ()):  # the lse's max reads the scores: walk up to its add
            for top in _users_closure(consumers, L):
                found = _lse_nodes(top, P.args[0])
                if found:
                    boxes += found[::-1]
        out.append(tuple(dict.fromkeys(diagram.name_of(v) for v in boxes)))
    return tuple(out)


def _users_closure(consumers, v: Value, depth: int = 4) -> list[Value]:
    """``v`` and the boxes reading it, up to ``depth`` steps on (the lse's boxes from its max)."""
    out, frontier = [v], [v]
    for _ in range(depth):
        frontier = [u for w in frontier for u in consumers.get(id(w), ())]
        out += frontier
    return out


def analyze(diagram: Diagram) -> AttentionProblem:
    p = _reason_or_problem(diagram)
    if isinstance(p, str):
        raise CodegenError(f"attention family: diagram {diagram.name!r}: {p}")
    return p


def head_dim_problem(D: int) -> str | None:
    """Why the template cannot take head dimension ``D``, or None: the mma's k step is 16 (Q·K
    contracts d in steps of 16, P·V writes d in 16-column pieces), and the warp's output tile
    (w_q x d fp32) lives in registers, 128 of them a thread at d = 256.

    >>> head_dim_problem(96) is None, head_dim_problem(72)
    (True, 'head dimension 72 is not a multiple of 16 (the mma.sync k step); the template takes 16, 32, ..., 256 (64, 80, 96, 128, 192 and 256 have their own tile tables)')
    """
    if D % 16 or D < 16 or D > 256:
        why = "is not a multiple of 16 (the mma.sync k step)" if D % 16 or D < 16 else \
            "is over 256 (the output tile lives in registers: 128 a thread at d = 256)"
        return (f"head dimension {D} {why}; the template takes 16, 32, ..., 256 "
                f"({', '.join(map(str, HEAD_DIMS[:-1]))} and {HEAD_DIMS[-1]} have their own tile tables)")
    return None


def loader_problem(cfg: "AttentionConfig") -> str | None:
    """Why the template cannot load the tiles of this configuration, or None (any head dimension
    :func:`head_dim_problem` takes: where d/8 pieces a row do not divide the threads the loader
    walks the chunk as a flat run of pieces)."""
    return head_dim_problem(cfg.D)


def _dbound(D: int, table=None) -> int:
    for bound in sorted(table or CONFIGS):
        if D <= bound:
            return bound
    raise CodegenError(f"attention family: head dimension {D} is over 256")


class AttentionFamily:
    """Streamed attention forward, bf16/fp16, mma.sync with the online softmax in registers."""

    name = "attention"
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"engine", "stages", "warps", "warpgroups", "threads_per_row",
                              "blocks_per_sm", "regs_per_thread", "splits", "persistent"})
    #: the planner's limits for runs this family may take: with the saved log-sum-exp (the forward
    #: of a backward) two contractions, the softmax and the lse's max and sum, in up to 14 boxes
    max_heavy_boxes = 5
    max_fused_boxes = 14

    def why_not(self, diagram: Diagram) -> str | None:
        p = _reason_or_problem(diagram)
        if isinstance(p, str):
            return p
        if p.dtype == "fp8":  # the Hopper fp8 template's own checks (the GPU's in its candidates)
            from . import attention_fp8

            return attention_fp8.structure_reason(p, diagram)
        if p.dtype not in ("bf16", "fp16"):
            return f"dtype {p.dtype}: the tensor-core template runs bf16 and fp16 (fp32 goes to the fallback)"
        sz = diagram.sizes
        why = index_size_problem(sz, [(sz.get(p.q), f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16),
                                      (sz.get(p.x), f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16)],
                                 "attention")
        if why:
            return why
        for ax in (p.d, p.dv):
            size = diagram.axes[ax].size
            if isinstance(size, int):
                why = head_dim_problem(size)
                if why:
                    return f"{ax}: {why}"
        sd, sv = diagram.axes[p.d].size, diagram.axes[p.dv].size
        if isinstance(sd, int) and isinstance(sv, int) and sd != sv:
            return f"head dimensions differ ({p.d}={sd}, {p.dv}={sv})"
        return None

    def matches(self, diagram: Diagram) -> bool:
        return self.why_not(diagram) is None

    explain = why_not  # the family protocol's name: None if it takes the diagram, else why not
    regions = staticmethod(regions)  # where it may sit in a larger diagram (the planner's search order)

    def configs(self, D: int, plain: bool = False, decode: bool = False) -> list[AttentionConfig]:
        """The tile configurations for head dimension D, best first (``plain``: the diagram has
        no score modifier but the scale, which frees the registers of the mask code; ``decode``:
        the small query tiles of :data:`DECODE_CONFIGS` too)."""
        table = (PLAIN_CONFIGS[_dbound(D)] if plain else ()) + CONFIGS[_dbound(D)]
        if decode:
            table = DECODE_CONFIGS[_dbound(D, DECODE_CONFIGS)] + table
        out = []
        for bq, bx, wq, st, nb, *wx in table:
            c = AttentionConfig(bq, bx, wq, st, D, nb, wx=wx[0] if wx else 1)
            if c not in out:
                out.append(c)
        return out

    @staticmethod
    def packed_axes(p: AttentionProblem) -> tuple[str, ...]:
        """The woven axes K and V lack (GQA's query heads per key/value head), in Q's order: the
        axes a packed tile shares its rows with q over."""
        return tuple(a for a in p.woven if a not in p.K.axis_names and a not in p.V.axis_names)

    def _rows(self, p: AttentionProblem, sz, cfg: AttentionConfig) -> int:
        """Rows of one tile space: q, times the packed axes when the configuration packs."""
        return sz[p.q] * (math.prod(sz[a] for a in self.packed_axes(p)) if cfg.packed else 1)

    def _base_blocks(self, p: AttentionProblem, sz, cfg: AttentionConfig) -> int:
        """Blocks before any split: the tiles of the row space times the woven combinations."""
        kept = [a for a in p.woven if not (cfg.packed and a in self.packed_axes(p))]
        return math.ceil(self._rows(p, sz, cfg) / cfg.BQ) * math.prod(sz[a] for a in kept)

    def split_choices(self, p: AttentionProblem, sz, cfg: AttentionConfig, sms: int) -> list[int]:
        """The splits offered for a configuration: 1, and where its tiles give fewer blocks than
        the SMs, enough to fill them about 1, 2 and 4 times over (the fewest splits that cover
        those rounds; for decode tiles the most that fit in them, where those leave at most a
        tenth of the SMs idle), and the most that still run as one wave
        (every block resident at once: ``SMs · blocks_per_sm`` blocks, so no split waits for
        another's SM), each split keeping at least MIN_SPLIT_CHUNKS chunks of keys. The model
        ranks them: more splits stream more bytes at once but write more partials, which the
        last block of a tile to arrive reads back in more batches.

        >>> from napkin.diagrams import library
        >>> d = library.get("gqa").bind(h=8, j=4, q=1, x=32768, d=128)
        >>> cfg = AttentionConfig(16, 64, 16, 2, 128, 3, packed=True, wx=4)
        >>> FAMILY.split_choices(analyze(d), d.sizes, cfg, 132)  # 8 blocks: 16, 33, 49 (3 a SM), 66
        [1, 16, 33, 49, 66]
        """
        base = self._base_blocks(p, sz, cfg)
        chunks = math.ceil(sz[p.x] / cfg.BX)
        room = min(MAX_SPLITS, chunks // MIN_SPLIT_CHUNKS)
        out = {1}
        if base < sms and room >= 2:
            # k rounds of the SMs: the fewest splits that cover them; for decode tiles (a few query
            # rows streaming K and V) the most whose blocks fit in them instead, where those leave
            # at most a tenth of the SMs idle (8 heads on 132 SMs: 16 splits, 4 SMs idle, ran GQA
            # decode at x = 16k in 25.8 us on an H200, and 17, whose 4 extra blocks double up on 4
            # SMs, in 29.9). A prefill tile keeps the covering count: one 4096-query head on 4
            # splits, a block an SM, ran 63.6 us against 61.1 on 8 (two an SM)
            decode = sz[p.q] <= DECODE_ROWS
            for k in (1, 2, 4):
                fit, cover = math.floor(k * sms / base), math.ceil(k * sms / base)
                n = fit if decode and fit * base >= 0.9 * k * sms else cover
                out.add(max(2, min(room, n)))
            wave = sms * max(1, cfg.blocks_per_sm) // base
            if wave >= 2:
                out.add(min(room, wave))
        return sorted(out)

    @staticmethod
    def is_plain(diagram: Diagram) -> bool:
        """Whether the only score modifiers are positive scales."""
        p = analyze(diagram)
        for m in p.maps:
            if m.op.fn != "scale":
                return False
            try:
                if m.op.param_values(diagram.sizes)[0] <= 0:
                    return False
            except Exception:  # noqa: BLE001 - symbolic: decide once bound
                return False
        return True

    def candidates(self, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
        """Every configuration that fits the GPU's shared memory: the tile tables for the head
        dimension, and where there are at most DECODE_ROWS queries (decode, short queries) the
        small tiles too, packed with the query heads K and V lack (GQA) and unpacked, without tiles
        whose whole warps hold no query, each with the splits of x that fill the SMs
        (:meth:`split_choices`; split only, where splits can fill them)."""
        p = analyze(diagram)
        D = diagram.axes[p.d].size
        if not isinstance(D, int):
            raise CodegenError("attention family: bind the head dimension before asking for candidates")
        if p.dtype == "fp8":  # fp8 runs on the Hopper fp8 template only
            from . import attention_fp8

            return attention_fp8.candidates(self, diagram, gpu, dtype)
        sz = diagram.sizes
        limit = _smem_limit(gpu)
        sms = _sms_of(gpu)
        packs = self.packed_axes(p)
        # the log-sum-exp output is written by the plain tiles (no decode tiles, splits or packing)
        decode = sz[p.q] <= DECODE_ROWS and p.lse is None
        out = []
        lse_rows: set[tuple[int, int]] = set()
        for c in self.configs(D, self.is_plain(diagram), decode=decode):
            if c.smem_bytes() > limit or loader_problem(c) is not None:
                continue
            if p.lse is not None:  # the model sees x whole here: one schedule per row tiling
                if (c.BQ, c.WQ) in lse_rows:
                    continue
                lse_rows.add((c.BQ, c.WQ))
            variants = [c]
            if decode and packs and 2 * sz[p.q] <= c.BQ and c.WQ == 16:  # two query heads or more a tile
                variants.append(replace(c, packed=True))
            for v in variants:
                if decode and v.BQ > 16 * -(-self._rows(p, sz, v) // 16):
                    continue  # whole warps of rows that hold no query: the smaller tiles do it
                splits = self.split_choices(p, sz, v, sms) if p.lse is None else [1]
                if (decode or v.threads < 128) and len(splits) > 1:
                    # tiles that leave SMs idle are offered split only: one block of a decode tile
                    # (16 rows of which a few hold queries, a chunk's products one dependent chain
                    # a warp) keeps an SM far from the per-SM rates the model assumes, and a block
                    # of one or two warps issues from one or two of its four schedulers
                    splits = splits[1:]
                for k in splits:
                    out.append(self.schedule(diagram, replace(v, splits=k), gpu=gpu, dtype=dtype))
        # the Hopper template (wgmma + TMA, the log-sum-exp output too), after the mma.sync tiles:
        # a tie keeps mma.sync
        from . import attention_wgmma

        return out + attention_wgmma.candidates(self, diagram, gpu, dtype)

    #: Queries up to which the decode tiles are offered (the wgmma template only above it).
    decode_rows = DECODE_ROWS

    @staticmethod
    def problem(diagram: Diagram) -> AttentionProblem:
        """What the family reads off ``diagram`` (:func:`analyze`; the wgmma module's entry)."""
        return analyze(diagram)

    @staticmethod
    def _engine(schedule: Schedule) -> str | None:
        return schedule.kernels[0].options.engine if len(schedule.kernels) == 1 else None

    def builds_for(self, schedule: Schedule, arch: str) -> bool:
        """Whether ``schedule`` can be built for ``arch`` (see :meth:`build_reason`)."""
        return self.build_reason(schedule, arch) is None

    def build_reason(self, schedule: Schedule, arch: str) -> str | None:
        """Why ``schedule`` cannot be built for ``arch``, or None: the wgmma template needs
        sm_90a, and a launch walks at most :data:`MAX_WOVEN` combinations of the woven axes (its
        grid.y, then grid.z; packed axes share a tile's rows and do not count)."""
        if self._engine(schedule) == "wgmma" and arch != "sm_90a":
            return f"its wgmma kernels need sm_90a, not {arch}"
        d = schedule.diagram
        try:
            p = analyze(d)
            if not all(isinstance(d.sizes.get(a), int) for a in p.woven) or \
                    math.prod(d.sizes[a] for a in p.woven) <= MAX_WOVEN:
                return None
            cfg = self.config_of(p, d, schedule)  # (only past the limit: packed axes do not count)
        except NapkinError:  # (lowering says what is wrong with the configuration itself)
            return None
        return woven_reason(math.prod(d.sizes[a] for a in p.woven if not (cfg.packed and a in self.packed_axes(p))))

    def schedule(self, diagram: Diagram, cfg: AttentionConfig, gpu="h100", dtype: str | None = None) -> Schedule:
        """The schedule a configuration stands for. Unpacked: one combination of the woven axes
        per block (a group of 1 on each) and ``g_q = BQ``. Packed: the tile's rows spread over q
        first, then the packed axes from the innermost (q = 1 with 4 query heads a key/value
        head: ``g_q = 1, g_j = 4``), the warps saying the tile's size (``BQ = warps · w_q``)."""
        p = analyze(diagram)
        # warps along x take BX / WX keys of a chunk each: the warps (threads_per_row) say it
        plain_sx = cfg.BX // cfg.wx if cfg.wx > 1 else cfg.BX
        streams = {p.x: cfg.BX} if cfg.SX == plain_sx else {p.x: [(cfg.BX, "SMEM"), (cfg.SX, "RF")]}
        if p.lse is not None:
            # the diagram's log-sum-exp subtracts the row's max before summing (two passes over x
            # as written; the kernel's online softmax keeps both in one): the model sees x whole,
            # which moves the same HBM bytes, and the chunk is the table's for these row tiles
            streams = {}
        groups = {a: 1 for a in p.woven}
        groups[p.q] = cfg.BQ
        rf = {p.q: cfg.WQ}
        if cfg.packed:
            groups.update(self._spread(p, diagram.sizes, cfg.BQ))
            rf = self._spread(p, {**diagram.sizes, **groups}, cfg.WQ)
        s = Schedule.fused(diagram, groups=groups, streams=streams,
                           rf_groups=rf, gpu=_gpu_key(gpu), dtype=dtype or p.dtype)
        return s.replace(kernels=(s.kernels[0].replace(family=self.name, options=cfg.options()),))

    def _spread(self, p: AttentionProblem, sz, rows: int) -> dict[str, int]:
        """``rows`` of a packed tile as groups: q first, then the packed axes from the innermost
        (a group no larger than its axis)."""
        out = {p.q: min(rows, sz[p.q])}
        room = rows // out[p.q]
        for a in reversed(self.packed_axes(p)):
            out[a] = max(1, min(sz[a], room))
            room //= out[a]
        return out

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu=None) -> dict:
        """Blocks (tiles x woven combinations x splits), threads, register budget, shared memory
        and bytes in flight per thread (the K and V chunks loaded STAGES - 1 ahead); with splits,
        the steps of one split's loop, the workspace the splits write and the last of each tile's
        splits reads back (``extra_hbm_bytes``), and that combine's tail as the memory round trips
        it waits for (``extra_round_trips``, :func:`combine_tail_round_trips`): after the slowest
        split it stores its partials, fences, arrives and loads the partials in batches, so the
        tail grows with the splits (it was priced as one launch whatever the splits, and the
        planner took 49 splits where 16 measured 30.1 against 25.3 us: H200, GQA decode, x = 16384)."""
        if analyze(diagram).dtype == "fp8":
            from . import attention_fp8

            return attention_fp8.launch_estimate(self, diagram, schedule, gpu)
        if self._engine(schedule) == "wgmma":
            from . import attention_wgmma

            return attention_wgmma.launch_estimate(self, diagram, schedule, gpu)
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        sz = diagram.sizes
        est = dict(blocks=self._base_blocks(p, sz, cfg) * cfg.splits, threads=cfg.threads, regs=cfg.model_regs(),
                   smem=cfg.smem_bytes(2),
                   in_flight_bytes_per_thread=2 * cfg.BX * cfg.D * 2 * max(1, cfg.stages - 1) / cfg.threads,
                   # a row of S lives in the 4 lanes of an mma.m16n8k16 fragment row: its max and sum
                   # in the loop are 2 shuffle stages (the WX warps along x merge once, after it)
                   threads_per_row=4,
                   # K and V chunks (8-32 KB a stage) loaded STAGES - 1 ahead: a step's barrier and
                   # restart pass while they are in flight (measured: H200 GQA decode, 16 splits of
                   # 32 steps 38.8 us of kernels at x = 32k against 41.2 for 33 splits of 16)
                   issue_overlaps_memory=True)
        if cfg.splits > 1:
            rows = sz[p.q] * math.prod(sz[a] for a in p.woven)
            est["stream_steps"] = math.ceil(math.ceil(sz[p.x] / cfg.BX) / cfg.splits)
            est["extra_round_trips"] = combine_tail_round_trips(cfg.splits)  # the tail (see above)
            est["extra_hbm_bytes"] = 2 * 4 * cfg.splits * rows * (cfg.D + 1)
        reloads = self.kv_reloads(p, sz, cfg)
        if reloads:
            # tiles that stream the same key/value head's chunks apart, where one packed tile could
            # stream them for all its query heads: an unpacked tile that could pack two query heads
            # or more, whose blocks each load the K and V chunks (the cost model, a few query rows
            # padded to the tile, does not count it); or a packed tile too small for its heads'
            # rows, whose re-reads the cost model counts from L2 and under the HBM time. Measured
            # on an H200 at q = 7, x = 131072, d = 128 (8 K/V heads of 4): two 16-row tiles a head
            # and 16 splits 201.6 us, one 32-row tile and 33 splits 160.9, where the model tied them
            kv = sum(math.prod(sz[a] for a in t.axis_names) for t in (p.K, p.V)) * lookup_dtype(p.dtype).bytes
            est["extra_l2_bytes"] = reloads * kv
        return est

    def kv_reloads(self, p: AttentionProblem, sz, cfg: AttentionConfig) -> int:
        """How many more times than needed the decode tiles of ``cfg`` stream one key/value head's
        chunks: the tiles a head's query rows take (each query head apart when unpacked) less the
        fewest that the largest packing tile of :data:`DECODE_CONFIGS` at its head dimension would
        take. 0 outside decode, without packed axes, and for an unpacked tile too small to pack two
        query heads."""
        shared = math.prod(sz[a] for a in self.packed_axes(p))
        q = sz[p.q]
        if q > DECODE_ROWS or shared <= 1:
            return 0
        if not cfg.packed and 2 * q > cfg.BQ:
            return 0
        tiles = math.ceil(q * shared / cfg.BQ) if cfg.packed else shared * math.ceil(q / cfg.BQ)
        widest = max(c[0] for c in DECODE_CONFIGS[_dbound(cfg.D, DECODE_CONFIGS)] if c[2] == 16)
        return max(0, tiles - math.ceil(q * shared / widest))

    def config_of(self, p: AttentionProblem, diagram: Diagram, schedule: Schedule) -> AttentionConfig:
        if len(schedule.kernels) != 1:
            raise CodegenError("attention family: the schedule must fuse every box into one kernel "
                               f"(it has {len(schedule.kernels)}); unfused attention is the fallback's")
        D = diagram.axes[p.d].bound_size
        plain = self.is_plain(diagram)
        default = self.configs(D, plain)[0]
        BQ = BX = WQ = SX = None
        woven_groups: dict[str, int] = {}
        warp_groups: dict[str, int] = {}  # a packed warp tile's groups of the packed axes
        for r in schedule.kernels[0].relabels:
            if r.is_symbolic:
                raise CodegenError(f"attention family: {r} has no size; bind {r.symbol} first")
            if r.kind == "group" and r.axis == p.q and r.level == "SMEM":
                BQ = int(r.size)
            elif r.kind == "group" and r.axis == p.q and r.level == "RF":
                WQ = int(r.size)
            elif r.kind == "stream" and r.axis == p.x and r.level == "SMEM":
                BX = int(r.size)
            elif r.kind == "stream" and r.axis == p.x and r.level == "RF":
                SX = int(r.size)
            elif r.kind == "group" and r.axis in p.woven and r.level == "SMEM":
                woven_groups[r.axis] = int(r.size)
            elif r.kind == "group" and r.axis in self.packed_axes(p) and r.level == "RF":
                warp_groups[r.axis] = int(r.size)
            else:
                raise CodegenError(f"attention family: the template cannot realise {r} (it groups "
                                   f"{p.q} at SMEM and RF and streams {p.x} at SMEM)")
        packs = self.packed_axes(p)
        for a, g in woven_groups.items():
            if g != 1 and a not in packs:
                raise CodegenError(f"attention family: the template cannot realise a group of {g} on {a!r}: "
                                   f"one combination of the woven axes K and V have a block, only the axes "
                                   f"they lack ({', '.join(packs) or 'none here'}) pack into a tile")
        packed = any(woven_groups.get(a, 1) > 1 for a in packs)
        if any(g > 1 for g in warp_groups.values()) and not packed:
            raise CodegenError(f"attention family: a warp tile groups {', '.join(warp_groups)} but the block "
                               "does not pack them")
        opts = schedule.kernels[0].options
        if opts.engine not in (None, "mma.sync"):
            raise CodegenError(f"attention family: engine {opts.engine} is not built here (mma.sync)")
        tpr = opts.threads_per_row or 4
        if tpr % 4 or tpr // 4 not in (1, 2, 4, 8):
            raise CodegenError(f"attention family: {tpr} threads a row: the 4 lanes of an mma row in 1, 2, 4 "
                               "or 8 warps along the keys")
        wx = tpr // 4
        if packed:
            Nq = diagram.sizes[p.q]
            if BQ is not None and BQ != Nq:
                raise CodegenError(f"attention family: a tile packing {', '.join(packs)} with {p.q} holds the "
                                   f"whole {p.q} axis (g_{p.q} = {Nq}, not {BQ})")
            rows = Nq * math.prod(woven_groups.get(a, 1) for a in packs)
            # the warp's packed rows, in mma tiles of 16 rows
            wrows = (WQ or 16) * math.prod(warp_groups.values())
            WQ = 16 if wrows <= 16 else 32
            BQ = opts.warps // wx * WQ if opts.warps else -(-rows // WQ) * WQ
            if rows > BQ:
                raise CodegenError(f"attention family: {rows} packed rows do not fit a tile of {BQ} "
                                   f"({opts.warps} warps, {wx} along {p.x}, of w_{p.q}={WQ})")
        BQ = BQ or default.BQ
        if BX is None and p.lse is not None:  # x whole in the model: the table's chunk for these rows
            BX = next((c.BX for c in self.configs(D, plain) if c.BQ == BQ and c.WQ == (WQ or c.WQ)), None)
        BX = BX or default.BX
        WQ = WQ or (default.WQ if BQ % default.WQ == 0 else 16)
        stages, blocks = opts.stages or 2, opts.blocks_per_sm
        if blocks is None:
            known = [c for c in self.configs(D, plain, decode=True) if (c.BQ, c.BX, c.WQ, c.wx) == (BQ, BX, WQ, wx)]
            blocks = known[0].blocks_per_sm if known else 1
        splits = opts.splits or 1
        cfg = AttentionConfig(BQ, BX, WQ, stages, D, blocks, SX or 0, splits, packed, wx)
        if cfg.sx and cfg.sx == AttentionConfig(BQ, BX, WQ, stages, D, blocks, 0, splits, packed, wx).SX:
            cfg = replace(cfg, sx=0)  # the default rule's sub-chunk: the same configuration
        what = f"attention family: g_{p.q}={BQ}, w_{p.q}={WQ}, s_{p.x}={BX}, stages={stages}, d={D}"
        if opts.warps and opts.warps * 32 != cfg.threads:
            raise CodegenError(f"{what}: {opts.warps} warps, but {BQ // WQ} warps along {p.q} times {wx} along "
                               f"{p.x} are {cfg.threads // 32}")
        if wx > 1 and (BX // cfg.SX) % wx:
            raise CodegenError(f"{what}: {wx} warps along {p.x} do not share the {BX // cfg.SX} sub-chunks of "
                               f"t_{p.x}={cfg.SX} evenly")
        if splits > MAX_SPLITS:
            raise CodegenError(f"{what}: {splits} splits of {p.x}; at most {MAX_SPLITS}")
        if WQ not in (16, 32) or BQ % WQ:
            raise CodegenError(f"{what}: w_{p.q} must be 16 or 32 and divide g_{p.q}")
        if BX % 16 or BX > 128 or BX < 16:
            raise CodegenError(f"{what}: s_{p.x} must be a multiple of 16, at most 128")
        if cfg.SX % 16 or BX % cfg.SX:
            raise CodegenError(f"{what}: the register stream t_{p.x}={cfg.SX} must be a multiple of 16 "
                               f"dividing s_{p.x}")
        if not 32 <= cfg.threads <= 512 or (wx > 1 and BQ // WQ * wx > 8):
            raise CodegenError(f"{what}: {cfg.threads} threads per block")
        if not 2 <= stages <= 4:
            raise CodegenError(f"{what}: stages must be 2 to 4")
        if WQ * (D + cfg.SX) > 32 * (128 + 64):
            raise CodegenError(f"{what}: the warp's S and O tiles do not fit in registers")
        problem = loader_problem(cfg)
        if problem:
            raise CodegenError(f"{what}: {problem}")
        return cfg

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        reason = self.why_not(diagram)
        if reason:
            raise CodegenError(f"attention family: diagram {diagram.name!r}: {reason}")
        if not diagram.is_bound:
            raise CodegenError(f"attention family: bind the sizes of {diagram.name!r} first")
        if analyze(diagram).dtype == "fp8":
            from . import attention_fp8

            return attention_fp8.lower(self, diagram, schedule, arch)
        if self._engine(schedule) == "wgmma":
            from . import attention_wgmma

            return attention_wgmma.lower(self, diagram, schedule, arch)
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        check_derived(self.name, schedule.kernels[0].name, schedule.kernels[0].options, cfg.options())
        launches, buffers = self._launches(diagram, p, cfg, arch)
        return Program(diagram, schedule, self.name, tuple(launches), tuple(buffers), dict(diagram.sizes))

    def _launches(self, d: Diagram, p: AttentionProblem, cfg: AttentionConfig,
                  arch: str) -> tuple[list[KernelLaunch], list[Buffer]]:
        """The attention launch, and with splits its two fp32 workspaces (the partial outputs and
        log-sum-exps) and the tiles' arrival counters (32-bit words in a zeroed fp32 buffer: zero
        bits; kept from call to call, each launch leaving them zero)."""
        ws = _workspace_names(d) if cfg.splits > 1 else None
        main = self._launch(d, p, cfg, arch, ws)
        if ws is None:
            return [main], []
        sz = d.sizes
        nrows = self._rows(p, sz, cfg)
        rows = nrows * math.prod(sz[a] for a in p.woven if not (cfg.packed and a in self.packed_axes(p)))
        check_index_size(rows, "the rows of the split workspace", 0, "attention")
        buffers = [Buffer(ws[0], ("split", "row", p.dv), (cfg.splits, rows, cfg.D), "fp32"),
                   Buffer(ws[1], ("split", "row"), (cfg.splits, rows), "fp32"),
                   Buffer(ws[2], ("tile",), (main.grid[0] * main.grid[1],), "fp32", zeroed=True)]
        return [main], buffers

    def _axis_params(self, d: Diagram, p: AttentionProblem, cfg: AttentionConfig, fixed: set[str]):
        """The kept woven axes (grid.y) and the packed ones, each a dict of the C names of its
        index, size and strides, with their parameters."""
        sz = d.sizes
        sQ, sK, sV, sO = (contiguous_strides(v) for v in (p.Q, p.K, p.V, p.O))
        packs = self.packed_axes(p) if cfg.packed else ()

        # the fixed stride names are prefix + axis name too: a woven axis called q or x (the query
        # axis being named otherwise) takes another prefix, never a duplicate parameter
        def woven_name(ax: str, prefix: str) -> Code:
            name = ident(ax, prefix)
            return name if name not in fixed else ident(ax, prefix[:-1] + "w_")

        params: list[Param] = []
        woven, packed = [], []
        for ax in p.woven:
            n = sz[ax]
            names = dict(idx=ident(ax, "i_"), size=ident(ax, "n_"), sQ=woven_name(ax, "sQ_"),
                         sK=woven_name(ax, "sK_"), sV=woven_name(ax, "sV_"), sO=woven_name(ax, "sO_"),
                         s=ident(ax, "st_"), axis=ax)
            params += [int_param(names["size"], n),
                       stride_param(names["sQ"], sQ[ax], f"stride of {p.Q.label()} along {ax}")]
            if ax not in packs:
                params += [stride_param(names["sK"], sK.get(ax, 0), f"stride of {p.K.label()} along {ax}"),
                           stride_param(names["sV"], sV.get(ax, 0), f"stride of {p.V.label()} along {ax}")]
            params.append(stride_param(names["sO"], sO[ax], f"stride of the output along {ax}"))
            (packed if ax in packs else woven).append(names)
        return woven, packed, params

    def _launch(self, d: Diagram, p: AttentionProblem, cfg: AttentionConfig, arch: str,
                ws: tuple[str, str] | None = None) -> KernelLaunch:
        T = p.dtype
        sz = d.sizes
        Nq, Nx = sz[p.q], sz[p.x]
        sQ, sK, sV, sO = (contiguous_strides(v) for v in (p.Q, p.K, p.V, p.O))
        # query and key positions are 32-bit ints, summed with tiles and mask offsets (< 2^30)
        check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16, "attention")
        check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16, "attention")
        nrows = self._rows(p, sz, cfg)
        if cfg.packed:
            check_index_size(nrows, f"the packed rows of {p.Q.label()}", 2 ** 16, "attention")
        params: list[Param] = [
            tensor_param(p.Q, "Q", T), tensor_param(p.K, "K", T), tensor_param(p.V, "V", T),
            tensor_param(p.O, "O", T, const=False, name=d.output_names[0]),
            int_param("Nq", Nq), int_param("Nx", Nx),
            int_param("sQ_q", sQ[p.q], f"row stride of {p.Q.label()}"),
            int_param("sK_x", sK[p.x], f"row stride of {p.K.label()}"),
            int_param("sV_x", sV[p.x], f"row stride of {p.V.label()}"),
            int_param("sO_q", sO[p.q], f"row stride of {d.output_names[0]}[{','.join(p.O.axis_names)}]"),
        ]
        if cfg.packed:
            params.append(int_param("Np", nrows, "packed rows"))
        fixed = {str(x.decl).split()[-1] for x in params}
        woven, packed, more = self._axis_params(d, p, cfg, fixed)
        params += more
        if p.lse is not None:  # the rows' log-sum-exp (fp32, natural log), for the backward
            if ws is not None or cfg.wx > 1 or cfg.packed:
                raise CodegenError("attention family: the log-sum-exp output is written by the plain tiles "
                                   "(no splits of x, warps along x or packed rows)")
            sL = contiguous_strides(p.lse)
            params += [Param(Arg("tensor", d.output_names[1], dtype="fp32", axes=p.lse.axis_names),
                             Code("float* __restrict__ Lse")), int_param("sL_q", sL[p.q])]
            for ax in woven:
                ax["sL"] = ident(ax["axis"], "sL_")
                params.append(stride_param(ax["sL"], sL[ax["axis"]], "stride of the log-sum-exp"))
        nz = math.prod(sz[a] for a in p.woven if not (cfg.packed and a in self.packed_axes(p)))
        if why := woven_reason(nz):
            raise CodegenError(f"attention family: {why}")
        if grid_folds(nz) and cfg.splits > 1:
            raise CodegenError(f"attention family: {nz} woven combinations run past grid.y into grid.z, "
                               f"which the {cfg.splits} splits of {p.x} would take; run it unsplit")
        if ws is not None:
            params += [Param(Arg("tensor", ws[0], dtype="fp32", axes=()), Code("float* __restrict__ ws_o")),
                       Param(Arg("tensor", ws[1], dtype="fp32", axes=()), Code("float* __restrict__ ws_lse")),
                       Param(Arg("tensor", ws[2], dtype="fp32", axes=()), Code("unsigned int* __restrict__ arrivals"))]
        index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
        chain = score_chain(d, p.maps, index_vars=index_vars)
        # query and key indices reach the score modifiers as floats (exact below 2^24): one add
        # per score instead of an int -> float conversion on the slow conversion unit
        float_idx = max(Nq, Nx) < 2 ** 24
        params.append(float_param("scale_log2", chain.factor * LOG2E))

        causal = window = None
        always_mask = False
        if chain.masks:
            if not chain.masks_last:
                always_mask = True
            else:
                for fn, prm, axes in chain.masks:
                    if abs(float(prm[0])) >= 2 ** 30:  # block skipping adds offsets in 32-bit ints
                        always_mask = True
                    elif fn == "causal" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                        off = int(prm[0])
                        causal = off if causal is None else min(causal, off)
                    elif fn == "sliding_window" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                        w = int(prm[0])
                        window = w if window is None else min(window, w)
                    else:
                        always_mask = True
        reverse = causal is not None and window is None

        smem = cfg.smem_bytes(2)
        limit = _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"attention family: the tiles need {smem} bytes of shared memory; "
                               f"{arch} allows {limit} per block")
        tag = short_hash(T, [str(x) for x in chain.full.lines], [str(x) for x in chain.nomask.lines],
                         p.woven, causal, window, always_mask, cfg, float_idx,
                         *(("lse",) if p.lse is not None else ()))
        sub = f"t{cfg.SX}" if cfg.SX != cfg.BX else ""
        more = (f"_wx{cfg.wx}" if cfg.wx > 1 else "") + ("_p" if cfg.packed else "") \
            + (f"_k{cfg.splits}" if cfg.splits > 1 else "") + ("_lse" if p.lse is not None else "")
        kname = Code(f"napkin_attn_{T}_d{cfg.D}_q{cfg.BQ}_x{cfg.BX}{sub}_w{cfg.WQ}_s{cfg.stages}{more}_{tag}")
        chain_desc = ", ".join(chain.boxes) or "none"
        ctx = dict(
            kname=kname, T=ctype(T), D=cfg.D, BQ=cfg.BQ, BX=cfg.BX, SX=cfg.SX, WQ=cfg.WQ, STAGES=cfg.stages,
            Q_IN_REGS=cfg.q_in_regs, MIN_BLOCKS=cfg.blocks_per_sm, params=signature(params), woven=woven,
            legend=comment_lines(self._legend(d, p, cfg, chain, causal, window)),
            REVERSE=reverse, CAUSAL=causal, WINDOW=window, ALWAYS_MASK=always_mask,
            IDX_ROW=index_vars[p.q], IDX_COL=index_vars[p.x],
            FLOAT_IDX=float_idx, IDX_TYPE=Code("const float" if float_idx else "const int"),
            ROW_BASE=Code("frow_lo" if float_idx else "row_lo"), COL_BASE=Code("fx0" if float_idx else "x0"),
            full_body=chain.full.body("        "), full_result=chain.full.result,
            nomask_body=chain.nomask.body("        "), nomask_result=chain.nomask.result,
            NOMASK_NEEDED=bool(chain.nomask.lines), chain_desc=comment(chain_desc),
            PACKED=cfg.packed, packed=packed, packed_desc=comment(", ".join(self.packed_axes(p))),
            NROWS=Code("Np" if cfg.packed else "Nq"), SPLIT=ws is not None, ws_o=Code("ws_o"), ws_lse=Code("ws_lse"),
            MASK_RANGE=causal is not None or window is not None, KV_COLUMNS=cfg.kv_columns,
            KV_UNROLL=cfg.kv_unroll, WX=cfg.wx, LSE=p.lse is not None,
            SPLITS=cfg.splits, NB=combine_batch(cfg.splits), FOLD=grid_folds(nz), NZ=nz,
        )
        source = render("attention_fwd.cu.jinja", **ctx)
        gy, gz = fold_grid(nz)
        grid = (math.ceil(nrows / cfg.BQ), gy, gz * cfg.splits)
        tunables = (("BQ", cfg.BQ), ("BX", cfg.BX), ("SX", cfg.SX), ("WQ", cfg.WQ), ("stages", cfg.stages), ("D", cfg.D),
                    ("blocks_per_sm", cfg.blocks_per_sm),
                    ("q_in_regs", cfg.q_in_regs), ("causal", causal), ("window", window),
                    ("splits", cfg.splits), ("packed", cfg.packed), ("wx", cfg.wx))
        return KernelLaunch(
            name=str(kname), source=source, grid=grid, block=(cfg.threads, 1, 1), shared_bytes=smem,
            args=tuple(x.arg for x in params), template="attention_fwd.cu.jinja", tunables=tunables,
            model_smem_bytes=cfg.model_smem_bytes(2), model_regs_per_thread=cfg.model_regs(),
        )

    @staticmethod
    def _legend(d: Diagram, p: AttentionProblem, cfg: AttentionConfig, chain, causal, window) -> list[str]:
        lines = [
            "(sequence lengths and woven sizes are kernel arguments; D is compiled in)",
            f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()} -> "
            f"{d.output_names[0]}[{','.join(p.O.axis_names)}], {p.dtype}",
            f"  {p.q} -> queries Nq: g_{p.q} = BQ = {cfg.BQ}, w_{p.q} = WQ = {cfg.WQ}",
            f"  {p.x} -> keys Nx:    s_{p.x} = BX = {cfg.BX}, stages = {cfg.stages}, t_{p.x} = SX = {cfg.SX}",
            f"  {p.d} -> D = {cfg.D}" + (f" (values: {p.dv})" if p.dv != p.d else ""),
        ]
        packs = AttentionFamily.packed_axes(p) if cfg.packed else ()
        for ax in p.woven:
            if ax in packs:
                lines.append(f"  {ax} -> packed with {p.q} into the tile's rows; K, V broadcast along it")
                continue
            lines.append(f"  {ax} -> woven (grid.y)"
                         + ("" if ax in p.K.axis_names else "; K, V broadcast along it"))
        if cfg.wx > 1:
            lines.append(f"  {p.x} shared by WX = {cfg.wx} warps of each row block (t_{p.x} = {cfg.SX} keys each a chunk)")
        if cfg.splits > 1:
            lines.append(f"  {p.x} split over grid.z = {cfg.splits} blocks a tile; partials combined by the last "
                         "of them to arrive")
        lines.append(f"  score modifiers: {', '.join(chain.boxes) or 'none'}; softmax scale folded: "
                     f"{chain.factor:.6g}")
        if causal is not None:
            lines.append(f"  causal (offset {causal}): key blocks above the diagonal skipped")
        if window is not None:
            lines.append(f"  sliding window {window}: key blocks outside it skipped")
        return lines


def _workspace_names(d: Diagram) -> tuple[str, str, str]:
    """Names for the split workspaces (partial outputs, log-sum-exps, arrival counters) that no
    array of the diagram has."""
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    base = d.name if is_name(f"{d.name}_opart") else "attn"
    names = (f"{base}_opart", f"{base}_lse", f"{base}_arrivals")
    if any(n in taken or not is_name(n) for n in names):
        h = hashlib.sha1(d.name.encode()).hexdigest()[:10]
        names = (f"opart_{h}", f"lse_{h}", f"arrivals_{h}")
    return names


def _sms_of(gpu) -> int:
    """The SM count of a GPU profile (object or name); 132 where none is known."""
    sms = getattr(gpu, "sms", None)
    if sms:
        return int(sms)
    try:
        from ..select import resolve_gpu

        return int(resolve_gpu(_gpu_key(gpu) if gpu is not None else None).sms)
    except Exception:  # noqa: BLE001 - no profile by that name: a full-size part
        return 132


FAMILY = AttentionFamily()
