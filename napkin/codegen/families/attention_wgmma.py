"""The attention family's Hopper path: the forward on wgmma and TMA, warp-specialised (sm_90a).

The same diagrams as :mod:`napkin.codegen.families.attention` (``O = softmax_x(mods(Q·K))·V``),
the same schedule axes, another engine: a producer warpgroup copies the Q tile once and the K and
V chunks into a ring of ``stages`` shared slots with TMA (mbarriers), and ``warpgroups``
consumer warpgroups of 64 query rows each compute ``S = Q·Kᵀ`` with wgmma from shared memory,
the online softmax in registers, and ``O += P·V`` with wgmma taking P from registers
(``attention_wgmma.cu.jinja``). The schedule says it as ``g_q = 64·warpgroups`` (SMEM),
``w_q = 64`` (RF: one wgmma M), ``s_x`` at SMEM, and ``KernelOptions(engine="wgmma",
warpgroups=.., stages=..)``. §4.4 of the design derives how many consumer warpgroups fit: the
registers of a warpgroup's S (64 x s_x), P and O (64 x d) tiles and the shared memory of the ring
give two at d = 128, two or three at d = 64 (:data:`CONFIGS`).

The loop (a configuration's ``overlap``, ``one_p`` and ``pingpong``): one chunk at a time (S, the
softmax, P·V), or two stages, where chunk j's softmax runs while chunk j - 1's P·V is in flight
(§4.4's exp beside wgmma), its P in a second register buffer or, with ``one_p``, left in S's
registers until that P·V is done (FA3's layout); ping-pong makes the two consumer warpgroups take
turns issuing their products. K and V are released apart, so chunk j + 2's K lands while chunk j's
softmax and P·V run. Scores with a modifier (ALiBi, soft-capping) or, over 176-key chunks with
ping-pong, a mask keep one chunk at a time (:func:`loop_for`: the registers).

Offered (by :meth:`AttentionFamily.candidates`) where the GPU has wgmma, the head dimension is one
of :data:`HEAD_DIMS` (64, 80, 96, 128, 192, 256), q is more than the decode tiles' 64 rows, and each
of Q, K, V is stored as rows of d (its q or x the second-to-last axis, every other axis whole rows),
which the two-dimensional tensor maps need; the model ranks them with the mma.sync tiles and the
planner takes whichever it predicts faster. The forward with its log-sum-exp output (the backward's
saves) runs here too. Head dimensions 80 and 96 keep shared rows of DP = 128 (TMA zero-fills the
columns past d; Q·Kᵀ contracts d / 16 steps only and P·V is one wgmma of N = d, so the padding costs
shared memory, not products); 192 and 256 take chunks of 64 to 112 keys beside O's 96 or 128
registers a consumer thread.

GQA packing (``pack`` heads of the one axis K and V lack, :data:`PACKS`): a tile's BQ rows are
``BQ / pack`` queries of ``pack`` consecutive query heads, one TMA box of Q a head, so a K/V chunk is
loaded once for all of them; the schedule says it as ``g_q = BQ / pack`` and a group of ``pack`` on
that axis. It moves the same bytes as unpacked tiles over long sequences; it pays where ``q`` is not
a multiple of BQ (fewer padded rows) and on causal diagrams (a tile's key range ends at its
``BQ / pack`` queries' diagonal). Offered after the unpacked tiles (a tie keeps them), not with the
log-sum-exp output or score modifiers that read the head index.
Not here: the split x of decode (the mma.sync path), head dimensions without a table.

Persistent blocks (``KernelOptions(persistent=True)``, :data:`PERSISTENT` says which
configurations take them): one block an SM walking tiles that an atomic counter hands out (a
zeroed one-word workspace a CUDA stream, left zero by the taker of the last tile), longest first
over sections of heads (:func:`l2_section`), the next tile's Q and first K/V chunk copied while
this tile's last P·V and epilogue run. ``launch_estimate`` prices it (a fill once a block; the
tail each order of tiles leaves: :func:`tile_tail`); each persistent configuration's twin of one
tile a block is offered behind it. Measured against one tile a block (H100): +5-12 % at d = 64,
+1-30 % causal with 128-key chunks at d = 128, -3 to -13 % with d = 128's 176-key chunks from seq
4k (those stay one tile a block; docs/attention_hopper_gap.md).

Measured (H100, bf16, 16 heads, 16k tokens a batch; ``benchmarks/attention_wgmma.py``): at seq 16k
580 TFLOP/s at d = 128 (0.88x SDPA-cuDNN, 1.69x SDPA-flash), 572 causal (0.99x, 1.80x), 455 at
d = 64 (0.95x, 1.52x); at seq 1k 0.54-0.66x cuDNN (eight chunks a block: the block's start-up and
its end are not overlapped with another tile's work). Seq 2k-8k: d = 96 405-486 (0.89-0.99x
cuDNN, 1.33-1.43x flash), causal 322-479 (0.95-1.10x cuDNN); d = 256 523-640 (0.84-0.91x cuDNN,
1.71-1.98x flash), causal 461-597 (0.82-0.92x); d = 192 595-625 at 4k-8k (0.87-0.95x cuDNN);
GQA (4 query heads a K/V head, d = 128) 454-590, packed tiles within the run-to-run spread of the
unpacked ones.

>>> from napkin.diagrams import library
>>> from napkin.codegen.families.attention import analyze
>>> d = library.get("mha").bind(h=16, q=4096, x=4096, d=128)
>>> wgmma_reason(analyze(d), d, "h100"), wgmma_reason(analyze(d), d, "a100-80gb")
(None, 'a100-80gb (sm_80) has no wgmma (it needs sm_90a)')
>>> [(c.BQ, c.BX, c.overlap, c.one_p) for c in configs(128)][0], [(c.BQ, c.BX, c.overlap) for c in configs(64)][0]
((128, 128, True, True), (128, 128, True))
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, replace

from ...diagrams.axes import is_name
from ...diagrams.diagram import Diagram
from ...errors import CodegenError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment, comment_lines, ident
from .attention_problem import AttentionProblem, woven_reason
from .contraction import _gpu_key, _sm_count, _smem_limit, wgmma_target_reason
from .epilogue import (Param, check_index_size, contiguous_strides, ctype, float_param, int_param, render,
                       score_chain, short_hash, signature, stride_param, tensor_param, tensormap_param)

__all__ = ["WgmmaAttentionConfig", "CONFIGS", "HEAD_DIMS", "configs", "wgmma_reason", "candidates", "schedule",
           "config_of", "launch_estimate", "lower", "lower_config", "TEMPLATE"]

TEMPLATE = "attention_wgmma.cu.jinja"

#: (consumer warpgroups, s_x, stages, two stages) per head dimension. The registers of one
#: consumer thread hold S (s_x / 2 fp32), P (s_x / 4; twice with two stages) and O (d / 2): at
#: d = 128 and s_x = 128 that is 160 of the 240 two consumers get from setmaxnreg (three would
#: get 160). ptxas allocates the whole kernel within the cap at entry (65536 / threads: 168 for two
#: consumers, 128 for three), so three consumers take chunks of 64 keys (64 x 128 chunks spill
#: there). Shared memory: Q (64 x consumers x d) and stages x (K + V chunks), 160 KiB at d = 128
#: with two stages of 128 keys. The two-stage loop (S of chunk j and its softmax beside P V of
#: chunk j - 1) measured faster at d = 64 and slower at d = 128 (H200, 16k tokens: 459 against 436
#: TFLOP/s at d = 64, 494 against 570 at d = 128), so each head dimension keeps its faster loop.
#: Head dimensions that are not whole 64-column blocks (80, 96) keep their shared tiles DP wide (D
#: rounded up to 64; TMA zero-fills the columns past D): Q K^T contracts D / 16 steps only and P V
#: is one wgmma of N = D, so the padding costs shared memory and no products. There three consumers
#: of 64-key chunks in two stages ran fastest (H100, 16 heads, 16k tokens, d = 96, seq 8k: 553
#: TFLOP/s against 497 for two consumers of 128 keys one stage at a time and 402 in two stages; the
#: model prices the two-consumer tiles ahead, as a 192-row tile leaves a partial last wave, so they
#: are not offered). d = 192 and 256 hold O in 96 or 128 registers a consumer thread: chunks of 112
#: and 80 keys keep S beside it (ptxas then spills 8 bytes with some score modifiers, outside the
#: products' loop), and two stages of those chunks fill the shared memory (216 and 224 KiB with the
#: Q tile); at d = 256, 80-key chunks ran at 654 TFLOP/s against 558 for 64 (seq 8k), one consumer
#: at 427, the two-stage loop (two P buffers beside O: ptxas spills) at 479, with ping-pong 488;
#: at d = 192 the two-stage loop ran at 508 against 629 one chunk at a time.
#: At d = 128 (twenty-ninth session, H200): with K and V released apart (the producer copies chunk
#: j + 2's K while chunk j's softmax and P V run; one barrier for both, released after P V, kept the
#: two-stage loop a chunk short of its prefetch) the two-stage loop with one P buffer (``one_p``)
#: is faster than one chunk at a time: 128-key chunks persistent 505-549 against 448-480 TFLOP/s at
#: seq 2k, 570-594 against 542-596 at 8k-16k, causal 411-422 / 525-540 / 553-556 against 388-404 /
#: 503-506 / 529-535; 176-key chunks with ping-pong 581-606 at 8k-16k but 345-471 at 2k
#: (``benchmarks/results/nvidia-h200/attention_loops_s29.jsonl``); the planner's picks in one call
#: +2-8 % at all ten d = 128 points (``attention_wgmma.json``, BENCHMARKS.md). Entries:
#: (consumers, s_x, stages, two stages[, ping-pong, one P buffer]).
CONFIGS = {
    64: ((2, 128, 3, True), (2, 128, 4, True), (3, 64, 4, True)),
    80: ((3, 64, 3, True), (3, 64, 4, True)),
    96: ((3, 64, 3, True),),
    128: ((2, 128, 2, True, False, True), (2, 128, 3, True, False, True), (2, 176, 2, True, True, True)),
    192: ((2, 112, 2, False), (2, 96, 2, False), (2, 64, 3, False)),
    256: ((2, 80, 2, False), (2, 64, 2, False)),
}

#: The head dimensions the template is offered for.
HEAD_DIMS = tuple(sorted(CONFIGS))

#: The chunk sizes (s_x) whose configurations run persistent blocks, per head dimension: a block
#: an SM walking tiles handed out by an atomic counter (each block's first tile by its index), in
#: FA3's longest-first order over sections of heads (:func:`l2_section`); the producer copies the
#: next tile's first K/V chunks into the slots the last tile frees and its Q as soon as the
#: consumers' last S = Q K^T of the tile is done, so the next tile's loads overlap this tile's last
#: P V and its epilogue, and there is no block start-up a tile. Not with GQA packing (ping-pong
#: takes it: both warpgroups take the same turns a tile). Measured on an H100 (bf16, 16 heads, 16k tokens, two runs,
#: docs/attention_hopper_gap.md): d = 64 (128-key chunks, two stages) faster at every point of
#: issue #13's sweep (+5-12 % non-causal, +1-11 % causal); d = 128 with 128-key chunks (the
#: causal tiles) +30 % at seq 1k, +10-13 % at 2k, +7 % at 4k, even at 8k-16k; d = 128 with
#: 176-key chunks (the non-causal tiles) slower from seq 4k (-3 %, -6 to -9 % at 8k, -8 to -10 %
#: at 16k, whatever the section size), so those stay one tile a block. Head dimensions not
#: measured stay one tile a block.
PERSISTENT = {64: (128,), 128: (128,)}

#: L2 bytes a persistent kernel's tile order lets the K and V of the heads at work take at once
#: (FA3's scheduler takes 32 MB of the H100's 50: the rest holds Q, O and other traffic).
L2_SECTION_BYTES = 32 * 2 ** 20

LOG2E = 1.4426950408889634


def l2_section(Nx: int, DP: int) -> int:
    """Woven combinations (heads) whose K and V (``Nx`` rows of ``DP`` 16-bit columns each) fit
    :data:`L2_SECTION_BYTES` together, at least 1: a persistent kernel hands out the tiles of that
    many heads longest first before it starts the next heads.

    >>> l2_section(16384, 64), l2_section(16384, 128), l2_section(1024, 64)
    (8, 4, 128)
    """
    return max(1, L2_SECTION_BYTES // (2 * Nx * DP * 2))

#: Registers per producer thread after setmaxnreg (it issues TMA copies only).
PRODUCER_REGS = 24


@dataclass(frozen=True)
class WgmmaAttentionConfig:
    """``consumers`` warpgroups of 64 query rows (``BQ = 64 · consumers``), ``BX`` keys per
    chunk, a ring of ``stages`` K/V slots, head dimension ``D``."""

    D: int
    BX: int
    consumers: int
    stages: int
    overlap: bool = False  # two stages inside a warpgroup: S of chunk j beside P V of chunk j - 1
    pingpong: bool = False  # two consumers take turns issuing their products (needs overlap)
    one_p: bool = False  # two stages with one P buffer: probabilities packed once the P V in flight is done
    pack: int = 1  # GQA: heads of the packed axis sharing the tile's rows (BQ / pack queries each)
    pad_pv: bool = False  # P V at N = DP (the zero columns too) instead of N = D
    persistent: bool = False  # one block an SM walking tiles (the table: :data:`PERSISTENT`)

    @property
    def BQ(self) -> int:
        return 64 * self.consumers

    @property
    def QT(self) -> int:
        """Queries of one head in the tile (BQ, or BQ / pack when packed)."""
        return self.BQ // self.pack

    @property
    def DP(self) -> int:
        """The shared tiles' row: D rounded up to whole 64-column (128-byte swizzled) blocks."""
        return -(-self.D // 64) * 64

    @property
    def NV(self) -> int:
        """The N of the P V product: D (80 and 96 are wgmma N sizes), or DP with ``pad_pv``."""
        return self.DP if self.pad_pv else self.D

    def variant_reason(self) -> str | None:
        """Why the template cannot build this combination of variants, or None.

        >>> WgmmaAttentionConfig(64, 128, 2, 2, overlap=True, persistent=True, pack=2).variant_reason()
        'persistent blocks do not take GQA packing'
        """
        if self.pingpong and (self.consumers != 2 or not self.overlap):
            return "ping-pong takes two consumer warpgroups, each with its two stages"
        if self.one_p and not self.overlap:
            return "one P buffer is a variant of the two-stage loop"
        if self.persistent and self.pack > 1:
            return "persistent blocks do not take GQA packing"
        return None

    def consumer_need(self) -> int:
        """Registers a consumer thread's tiles take: S (BX / 2 fp32), P (BX / 4, twice with two
        stages and two P buffers) and O (NV / 2)."""
        return self.BX // 2 + self.BX // 4 * (2 if self.overlap and not self.one_p else 1) + self.NV // 2

    def fits_registers(self) -> bool:
        """Whether S, P and O and some 24 more registers fit what a consumer thread gets."""
        return self.consumer_need() + 24 <= self.consumer_regs()

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    def consumer_regs(self) -> int:
        """Registers a consumer thread gets from setmaxnreg: what the producer's 24 leave of the
        SM's 64 Ki, at most 240."""
        return min(240, (65536 - 128 * PRODUCER_REGS) // (128 * self.consumers) // 8 * 8)

    def entry_regs(self) -> int:
        """The register cap at entry (``__launch_bounds__(threads, 1)``)."""
        return min(255, 65536 // self.threads // 8 * 8)

    def smem_bytes(self) -> int:
        """Dynamic shared memory: the tiles, 1 KiB to align them on a swizzle atom, 256 B of barriers."""
        return self.model_smem_bytes() + 1024 + 256

    def model_smem_bytes(self) -> int:
        """The model's accounting: the Q tile and the stages' K and V chunks (bf16/fp16), rows of DP."""
        return (self.BQ * self.DP + 2 * self.stages * self.BX * self.DP) * 2

    def options(self) -> KernelOptions:
        return KernelOptions(engine="wgmma", stages=self.stages, warpgroups=self.consumers, blocks_per_sm=1,
                             regs_per_thread=self.consumer_regs(), persistent=True if self.persistent else None)


def configs(D: int, masked: bool = False, modified: bool = False) -> list[WgmmaAttentionConfig]:
    """The configurations for head dimension ``D``, best first (none where it has no table), with
    the loop each runs for scores with masks (``masked``) or with score modifiers (``modified``:
    :func:`loop_for`).

    >>> [(c.BX, c.overlap, c.pingpong) for c in configs(128)]
    [(128, True, False), (128, True, False), (176, True, True)]
    >>> [(c.BX, c.overlap, c.pingpong) for c in configs(128, masked=True)]
    [(128, True, False), (128, True, False), (176, False, False)]
    """
    out = []
    for c, bx, st, two, *more in CONFIGS.get(D, ()):
        pp, one_p = (*more, False, False)[:2]
        cfg = WgmmaAttentionConfig(D, bx, c, st, overlap=two, pingpong=pp, one_p=one_p,
                                   persistent=bx in PERSISTENT.get(D, ()))
        out.append(loop_for(cfg, masked, modified))
    return out


def loop_for(cfg: WgmmaAttentionConfig, masked: bool, modified: bool) -> WgmmaAttentionConfig:
    """The loop ``cfg`` runs for scores with masks or modifiers. The two-stage loop with one P
    buffer holds S, the P in flight and O at once: beside a score modifier's per-score work (ALiBi's
    bias: 148-152 bytes of spills at d = 128) and, with ping-pong over 176-key chunks, beside a
    mask's (12-20 bytes), ptxas spills, so those run one chunk at a time (the loop measured before,
    which builds without spills there)."""
    if cfg.one_p and (modified or (masked and cfg.pingpong)):
        return replace(cfg, overlap=False, one_p=False, pingpong=False)
    return cfg


def score_kinds(p: AttentionProblem, diagram: Diagram) -> tuple[bool, bool]:
    """(masked, modified): whether the scores pass a mask, and a map other than a positive scale."""
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    chain = score_chain(diagram, p.maps, index_vars=index_vars)
    return bool(chain.masks), bool(chain.nomask.lines)


def _rows_layout_problem(v, row_axis: str, last: str, sizes) -> str | None:
    """Why ``v`` is not stored as whole rows of its last axis with ``row_axis`` second to last
    (the tensor map's rows), or None."""
    names = v.axis_names
    if len(names) < 2 or names[-2] != row_axis:
        return (f"{v.label()} must be stored with {row_axis!r} second to last (its TMA tiles are runs of "
                f"whole rows of {last!r})")
    return None


def wgmma_reason(p: AttentionProblem, diagram: Diagram, gpu=None, arch: str | None = None,
                 dtype: str | None = None) -> str | None:
    """Why the wgmma template cannot run this attention, or None if it can."""
    why = wgmma_target_reason(dtype or p.dtype, gpu, arch)
    if why:
        return why
    D = diagram.axes[p.d].size
    if isinstance(D, int) and D not in CONFIGS:
        return f"head dimension {D}: the wgmma template takes {', '.join(map(str, HEAD_DIMS))}"
    if p.dv != p.d:
        return "the wgmma template needs V's value axis to be the head dimension"
    for v, row in ((p.Q, p.q), (p.K, p.x), (p.V, p.x)):
        why = _rows_layout_problem(v, row, p.d, diagram.sizes)
        if why:
            return why
    return tma_rows_reason(p, diagram.sizes)


def tma_rows_reason(p: AttentionProblem, sz) -> str | None:
    """Why Q, K or V has too many rows for a TMA coordinate (32-bit), or None."""
    for v in (p.Q, p.K, p.V):
        if all(isinstance(sz.get(a), int) for a in v.axis_names):
            rows = math.prod(sz[a] for a in v.axis_names[:-1])
            if rows >= 2 ** 31 - 2 ** 16:
                return f"{v.label()} has {rows} rows; TMA coordinates are 32-bit"
    return None


#: Heads of a packed axis a tile may hold (each keeps at least 16 queries of the tile's rows).
PACKS = (2, 4, 8)


def _packed_axes(p: AttentionProblem) -> tuple[str, ...]:
    """The woven axes K and V lack (GQA's query heads per K/V head), in Q's order."""
    return tuple(a for a in p.woven if a not in p.K.axis_names and a not in p.V.axis_names)


def pack_reason(p: AttentionProblem, diagram: Diagram) -> str | None:
    """Why the query heads that share a K/V head (GQA's ``j``) cannot share a tile's rows, or None:
    one such axis, no log-sum-exp output, and score modifiers that do not read its index (a tile's
    rows then hold several heads)."""
    packs = _packed_axes(p)
    if len(packs) != 1:
        return f"packing takes one axis that K and V lack ({len(packs)} here)"
    if p.lse is not None:
        return "the forward with its log-sum-exp output runs unpacked"
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    chain = score_chain(diagram, p.maps, index_vars=index_vars)
    text = " ".join(str(x) for x in (*chain.full.lines, *chain.nomask.lines))
    if str(index_vars[packs[0]]) in text:
        return f"a score modifier reads the index of {packs[0]!r}"
    return None


def schedule(fam, diagram: Diagram, cfg: WgmmaAttentionConfig, gpu="h100", dtype: str | None = None) -> Schedule:
    """The schedule of a configuration: one woven combination per block, ``g_q = BQ`` at SMEM,
    ``w_q = 64`` at RF (a consumer warpgroup's rows), ``s_x = BX`` at SMEM. Packed (``pack`` heads
    of the axis K and V lack): ``g_q = BQ / pack`` and a group of ``pack`` on that axis at SMEM; a
    warpgroup's 64 rows are ``w_q = min(64, g_q)`` queries times the heads that fill them."""
    p = fam.problem(diagram)
    groups = {a: 1 for a in p.woven}
    groups[p.q] = cfg.QT
    rf = {p.q: min(64, cfg.QT)}
    if cfg.pack > 1:
        why = pack_reason(p, diagram)
        if why:
            raise CodegenError(f"attention family (wgmma): packing {cfg.pack} heads: {why}")
        (j,) = _packed_axes(p)
        groups[j] = cfg.pack
        if cfg.QT < 64:
            rf[j] = 64 // cfg.QT
    # with the log-sum-exp output the model sees x whole (the diagram's log-sum-exp is two passes
    # over x as written; the kernel's online softmax keeps both in one): the chunk is the table's
    streams = {} if p.lse is not None else {p.x: cfg.BX}
    s = Schedule.fused(diagram, groups=groups, streams=streams, rf_groups=rf, gpu=_gpu_key(gpu),
                       dtype=dtype or p.dtype)
    return s.replace(kernels=(s.kernels[0].replace(family=fam.name, options=cfg.options()),))


def candidates(fam, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
    """The wgmma schedules for ``diagram`` on ``gpu``: none where the template cannot run it or
    q fits the family's decode tiles (``fam.decode_rows``); else one per configuration that fits
    the shared memory. ``fam`` is the attention family (``fam.problem`` reads a diagram)."""
    p = fam.problem(diagram)
    if wgmma_reason(p, diagram, gpu, dtype=dtype) is not None:
        return []
    sz = diagram.sizes
    if not isinstance(sz.get(p.q), int) or sz[p.q] <= fam.decode_rows:
        return []
    limit = _smem_limit(gpu)
    out, seen = [], set()
    packs = () if pack_reason(p, diagram) else [g for g in PACKS if g <= sz[_packed_axes(p)[0]]]
    for c in configs(diagram.axes[p.d].bound_size, *score_kinds(p, diagram)):
        key = (c.consumers, c.stages) if p.lse is not None else c  # x whole: one chunk per row tiling
        if c.smem_bytes() <= limit and key not in seen:
            seen.add(key)
            out.append(schedule(fam, diagram, c, gpu, dtype))
            # persistent tiles also one tile a block, for an autotuner to measure (the model ranks
            # them behind: a fill a tile, the grid's order of causal tiles)
            if c.persistent:
                out.append(schedule(fam, diagram, replace(c, persistent=False), gpu, dtype))
            # GQA packed after the unpacked tiles (a tie keeps them): BQ / g queries of g heads
            out += [schedule(fam, diagram, replace(c, pack=g, persistent=False), gpu, dtype) for g in packs
                    if c.BQ % g == 0 and (c.BQ // g) % 16 == 0]
    return out


def read_tiles(p: AttentionProblem, sched: Schedule, family: str, does: str,
               packs: tuple[str, ...] = ()) -> tuple[int | None, int | None, int | None, int, int | None]:
    """The tiles a Hopper attention schedule's relabels ask for: ``(BQ, WQ, BX, pack, wpack)`` —
    ``g_q`` at SMEM, ``w_q`` at RF, ``s_x`` at SMEM, the group of the ``packs`` axes at SMEM (1
    when none) and at RF; None where the schedule does not say. A size not bound yet, or a relabel
    the template cannot realise, raises, naming ``family`` and what its template ``does``::

        BQ, WQ, BX, pack, wpack = read_tiles(p, sched, "attention family (wgmma)", "it groups q ...")
    """
    BQ = BX = WQ = wpack = None
    pack = 1
    for r in sched.kernels[0].relabels:
        if r.is_symbolic:
            raise CodegenError(f"{family}: {r} has no size; bind {r.symbol} first")
        if r.kind == "group" and r.axis == p.q and r.level == "SMEM":
            BQ = int(r.size)
        elif r.kind == "group" and r.axis == p.q and r.level == "RF":
            WQ = int(r.size)
        elif r.kind == "stream" and r.axis == p.x and r.level == "SMEM":
            BX = int(r.size)
        elif r.kind == "group" and r.axis in p.woven and r.level == "SMEM" and r.size == 1:
            continue
        elif r.kind == "group" and r.axis in packs and r.level == "SMEM":
            pack = int(r.size)
        elif r.kind == "group" and r.axis in packs and r.level == "RF":
            wpack = int(r.size)
        else:
            raise CodegenError(f"{family}: the template cannot realise {r} ({does})")
    return BQ, WQ, BX, pack, wpack


def config_of(p: AttentionProblem, diagram: Diagram, sched: Schedule) -> WgmmaAttentionConfig:
    """The configuration a wgmma schedule asks for, checked against what the template builds."""
    D = diagram.axes[p.d].bound_size
    BQ, WQ, BX, pack, wpack = read_tiles(
        p, sched, "attention family (wgmma)",
        f"it groups {p.q} at SMEM and in 64-row warpgroups at RF, streams {p.x} at SMEM, one combination "
        "of the woven axes a block", packs=_packed_axes(p))
    opts = sched.kernels[0].options
    table = configs(D, *score_kinds(p, diagram)) if isinstance(D, int) else []
    if not table:
        raise CodegenError(f"attention family (wgmma): head dimension {D}; the template takes "
                           f"{', '.join(map(str, HEAD_DIMS))}")
    if BQ is not None:
        BQ *= pack  # the tile's rows: g_q queries of each of the packed heads
    consumers = opts.warpgroups or (BQ // 64 if BQ else table[0].consumers)
    stages = opts.stages or table[0].stages
    if BX is None:  # x whole in the model (the log-sum-exp output): the table's chunk for these rows
        same = [c for c in table if (c.consumers, c.stages) == (consumers, stages)] or table
        BX = same[0].BX
    cfg = WgmmaAttentionConfig(D, BX, consumers, stages, pack=pack)
    known = [c for c in table if (c.BX, c.consumers, c.stages) == (cfg.BX, cfg.consumers, cfg.stages)]
    if known:  # the loop the table measured fastest for these tiles
        cfg = replace(cfg, overlap=known[0].overlap, pingpong=known[0].pingpong, one_p=known[0].one_p,
                      pad_pv=known[0].pad_pv)
    cfg = replace(cfg, persistent=bool(opts.persistent))
    what = f"attention family (wgmma): g_{p.q}={BQ}, w_{p.q}={WQ}, s_{p.x}={cfg.BX}, warpgroups={consumers}"
    if BQ is not None and BQ != cfg.BQ:
        raise CodegenError(f"{what}: g_{p.q} must be 64 x the consumer warpgroups ({cfg.BQ})"
                           + (f" over the {pack} packed heads" if pack > 1 else ""))
    if pack > 1:
        why = pack_reason(p, diagram)
        if why:
            raise CodegenError(f"{what}: {why}")
        if cfg.BQ % pack or cfg.QT % 16:
            raise CodegenError(f"{what}: {pack} packed heads need whole runs of 16 rows each in {cfg.BQ}")
        if wpack not in (None, max(1, 64 // cfg.QT)):
            raise CodegenError(f"{what}: a warpgroup's 64 rows hold {max(1, 64 // cfg.QT)} packed heads, "
                               f"not {wpack}")
    if WQ not in (None, min(64, cfg.QT)):
        raise CodegenError(f"{what}: w_{p.q} is one wgmma's 64 rows")
    if not 1 <= consumers <= 3:
        raise CodegenError(f"{what}: 1 to 3 consumer warpgroups")
    if cfg.BX % 16 or not 16 <= cfg.BX <= 256:
        raise CodegenError(f"{what}: s_{p.x} must be a multiple of 16 up to 256 (one wgmma's N)")
    if cfg.variant_reason():
        raise CodegenError(f"{what}: {cfg.variant_reason()}")
    if not 2 <= cfg.stages <= 6:
        raise CodegenError(f"{what}: stages must be 2 to 6")
    if not cfg.fits_registers():
        raise CodegenError(f"{what}: S, P and O need {cfg.consumer_need()} registers a thread; {consumers} "
                           f"consumers get {cfg.consumer_regs()}")
    return cfg


def launch_estimate(fam, diagram: Diagram, sched: Schedule, gpu=None) -> dict:
    """Blocks, threads, registers, shared memory and bytes in flight (the ring's K and V chunks
    over the block's threads), and how it issues: wgmma reads its operands from shared memory
    itself (the datasheet tensor path, operand traffic overlapped); the tensor, CUDA-core and SFU
    terms add (``overlap_compute=False``): what a warpgroup's two-stage loop and the other
    warpgroup hide of its softmax is not credited (one chunk at a time measured within a few per
    cent of the sum; the two-stage loop at d = 128 runs up to 19 % faster than it from seq 4k).

    The per-SM tail is the one the tiles' order gives (:func:`tile_tail`): one tile a block, the
    hardware hands the grid's tiles out in order (a head's longest rows first where causal, head
    after head), so a causal grid ends on the last heads' tiles of every length; persistent
    blocks take them longest first over a section of heads. A persistent launch is its grid
    (an SM's worth of blocks: a block's pipeline fill once, its steps those of all its tiles);
    one tile a block pays a fill every round of the busiest SM."""
    p = fam.problem(diagram)
    cfg = config_of(p, diagram, sched)
    sz = diagram.sizes
    packs = _packed_axes(p) if cfg.pack > 1 else ()
    n_bx = math.ceil(sz[p.q] / cfg.QT) * (-(-sz[packs[0]] // cfg.pack) if packs else 1)
    nz = math.prod(sz[a] for a in p.woven if a not in packs)
    est = dict(blocks=n_bx * nz, threads=cfg.threads, regs=cfg.entry_regs(), smem=cfg.smem_bytes(),
               in_flight_bytes_per_thread=2 * cfg.BX * cfg.DP * 2 * cfg.stages / cfg.threads,
               threads_per_row=4, tensor_path="peak", overlap_operands=True, overlap_compute=False)
    sms = _sm_count(sched.gpu if gpu is None else _gpu_key(gpu))
    chunks = _tile_chunks(p, diagram, cfg) if not packs else [math.ceil(sz[p.x] / cfg.BX)] * n_bx
    # fewer tiles than SMs: the roofline's sms / blocks, as every family's launch is priced
    tail = tile_tail(chunks, nz, sms, cfg.persistent, l2_section(sz[p.x], cfg.DP)) if n_bx * nz >= sms else None
    if tail is not None:
        est["tail_factor"] = tail
    if cfg.persistent:
        grid = min(n_bx * nz, sms)
        est.update(blocks=grid, stream_steps=sum(chunks) * nz / grid)
    return est


def _tile_chunks(p: AttentionProblem, diagram: Diagram, cfg: WgmmaAttentionConfig) -> list[int]:
    """The key chunks each q tile walks (unpacked tiles), in the order of ``bx`` (the kernel's
    ``set_tile``: the longest rows first where causal), as the masks leave them."""
    sz = diagram.sizes
    Nq, Nx = sz[p.q], sz[p.x]
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    causal, window, _ = _masks(p, score_chain(diagram, p.maps, index_vars=index_vars))
    n_bx = math.ceil(Nq / cfg.BQ)
    out = []
    for bx in range(n_bx):
        q0 = (n_bx - 1 - bx if causal is not None and window is None else bx) * cfg.BQ
        x_lo, x_hi = 0, Nx
        if causal is not None:
            x_hi = min(Nx, q0 + cfg.BQ + causal)
        if window is not None:
            x_lo = max(0, q0 - window + 1)
            x_hi = min(x_hi, q0 + cfg.BQ)
        out.append(max(0, -(-x_hi // cfg.BX) - x_lo // cfg.BX) if x_hi > x_lo else 0)
    return out


#: Tiles beyond which :func:`tile_tail` does not simulate the hand-out (the roofline's
#: ``ceil(blocks / SMs)`` tail then stands for it).
TAIL_TILES = 1 << 16


def tile_tail(chunks: list[int], nz: int, sms: int, persistent: bool, section: int) -> float | None:
    """The busiest SM's chunks over the even share when ``nz`` heads of q tiles walking
    ``chunks[bx]`` key chunks (plus one for the tile's Q and epilogue) are handed out to ``sms``
    SMs one at a time, each to the first SM free: one tile a block in the grid's order (q tiles
    fastest, head after head), persistent in the kernel's (``split_tile``: heads fastest inside
    sections of ``section`` heads, q tiles slowest). None past :data:`TAIL_TILES` tiles.

    >>> round(tile_tail([4] * 8, 33, 132, False, 8), 3)  # 264 equal tiles: two rounds, no tail
    1.0
    >>> causal = list(range(16, 0, -1))  # 16 q tiles, the longest first, 16 heads
    >>> tile_tail(causal, 16, 132, False, 4) > tile_tail(causal, 16, 132, True, 4)
    True
    """
    n_bx = len(chunks)
    tiles = n_bx * nz
    if tiles > TAIL_TILES or not tiles:
        return None
    if persistent:
        order = []
        for sec in range(0, nz, section):
            size = min(section, nz - sec)
            order += [chunks[bx] + 1 for bx in range(n_bx) for _ in range(size)]
    else:
        order = [c + 1 for _ in range(nz) for c in chunks]
    free = [0.0] * min(sms, tiles)
    heapq.heapify(free)
    for c in order:
        heapq.heappush(free, heapq.heappop(free) + c)
    busiest = max(free)
    return max(1.0, busiest / (sum(order) / sms))


def mask_legend(causal, window) -> list[str]:
    """The legend lines of the block skipping a causal mask or a sliding window gives."""
    lines = []
    if causal is not None:
        lines.append(f"  causal (offset {causal}): key blocks above the diagonal skipped")
    if window is not None:
        lines.append(f"  sliding window {window}: key blocks outside it skipped")
    return lines


def shared_context(p: AttentionProblem, chain, index_vars, float_idx: bool, masks, ns: int, no: int) -> dict:
    """The template context every Hopper attention kernel (bf16/fp16 and fp8) takes alike: the
    inline-asm operand lists of S (``ns`` accumulator registers a thread) and O (``no``), the
    masks (``(causal, window, always_mask)`` of :func:`_masks`), the score chain and its indices."""
    causal, window, always_mask = masks
    return dict(
        s_operands=Code("{" + ", ".join(f"%{i}" for i in range(ns)) + "}"),
        s_constraints=Code(", ".join(f'"+f"(s[{i}])' for i in range(ns))),
        o_operands=Code("{" + ", ".join(f"%{i}" for i in range(no)) + "}"),
        a_operands=Code("{" + ", ".join(f"%{no + i}" for i in range(4)) + "}"),
        o_constraints=Code(", ".join(f'"+f"(o[{i}])' for i in range(no))),
        REVERSE=causal is not None and window is None, CAUSAL=causal, WINDOW=window, ALWAYS_MASK=always_mask,
        IDX_ROW=index_vars[p.q], IDX_COL=index_vars[p.x], FLOAT_IDX=float_idx,
        IDX_TYPE=Code("const float" if float_idx else "const int"),
        ROW_BASE=Code("frow_lo" if float_idx else "row_lo"), COL_BASE=Code("fx0" if float_idx else "x0"),
        full_body=chain.full.body("          "), full_result=chain.full.result,
    )


def _masks(p: AttentionProblem, chain):
    """(causal offset, window, always_mask) read off the chain, as the mma.sync template does:
    masks that come last with integer offsets skip whole key blocks; any other mask is applied
    to every chunk."""
    causal = window = None
    always_mask = False
    if chain.masks:
        if not chain.masks_last:
            always_mask = True
        else:
            for fn, prm, axes in chain.masks:
                if abs(float(prm[0])) >= 2 ** 30:
                    always_mask = True
                elif fn == "causal" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                    off = int(prm[0])
                    causal = off if causal is None else min(causal, off)
                elif fn == "sliding_window" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                    w = int(prm[0])
                    window = w if window is None else min(window, w)
                else:
                    always_mask = True
    return causal, window, always_mask


def lower(fam, diagram: Diagram, sched: Schedule, arch: str) -> Program:
    """The Program of a wgmma schedule (one launch)."""
    p = fam.problem(diagram)
    why = wgmma_reason(p, diagram, arch=arch)
    if why:
        raise CodegenError(f"attention family: the schedule asks for engine=wgmma, but {why}")
    cfg = config_of(p, diagram, sched)
    check_derived(fam.name, sched.kernels[0].name, sched.kernels[0].options, cfg.options())
    launch = _launch(diagram, p, cfg, arch, _sm_count(sched.gpu))
    return Program(diagram, sched, fam.name, (launch,), _buffers(diagram, cfg), dict(diagram.sizes))


def lower_config(fam, diagram: Diagram, cfg: WgmmaAttentionConfig, arch: str = "sm_90a", gpu="h100") -> Program:
    """The Program of one configuration as given (its overlap, ping-pong and persistence too), for
    comparing the template's variants (a persistent grid has ``gpu``'s SM count of blocks at
    most); :func:`lower` takes the configuration a schedule says."""
    p = fam.problem(diagram)
    why = wgmma_reason(p, diagram, arch=arch)
    if why:
        raise CodegenError(f"attention family (wgmma): {why}")
    if cfg.variant_reason():
        raise CodegenError(f"attention family (wgmma): {cfg.variant_reason()}")
    sched = schedule(fam, diagram, cfg, gpu)
    return Program(diagram, sched, fam.name, (_launch(diagram, p, cfg, arch, _sm_count(sched.gpu)),),
                   _buffers(diagram, cfg), dict(diagram.sizes))


def _counter_name(d: Diagram) -> str:
    """A name for the persistent kernel's tile counter that no array of the diagram has."""
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    name = f"{d.name}_tile_counter"
    if name in taken or not is_name(name):
        name = f"tile_counter_{hashlib.sha1(d.name.encode()).hexdigest()[:10]}"
    return name


def _buffers(d: Diagram, cfg: WgmmaAttentionConfig) -> tuple[Buffer, ...]:
    """A persistent kernel's tile counter: one 32-bit word in a zeroed workspace (zero bits; kept
    from call to call, each launch leaving it zero)."""
    return (Buffer(_counter_name(d), ("counter",), (1,), "fp32", zeroed=True),) if cfg.persistent else ()


def _launch(d: Diagram, p: AttentionProblem, cfg: WgmmaAttentionConfig, arch: str, sms: int) -> KernelLaunch:
    """The launch of ``cfg``; a persistent one takes ``sms`` blocks at most (one an SM)."""
    T = p.dtype
    sz = d.sizes
    Nq, Nx = sz[p.q], sz[p.x]
    check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16, "attention")
    check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16, "attention")
    sQ, sK, sV, sO = (contiguous_strides(v) for v in (p.Q, p.K, p.V, p.O))
    out = d.output_names[0]
    params: list[Param] = [
        tensormap_param(p.Q, "tmQ", (64, cfg.QT)), tensormap_param(p.K, "tmK", (64, cfg.BX)),
        tensormap_param(p.V, "tmV", (64, cfg.BX)),
        tensor_param(p.O, "O", T, const=False, name=out),
        int_param("Nq", Nq), int_param("Nx", Nx),
        int_param("sO_q", sO[p.q], f"row stride of {out}[{','.join(p.O.axis_names)}]"),
    ]
    if cfg.persistent:  # the tiles handed out after each block's first (an atomic counter)
        params.append(Param(Arg("tensor", _counter_name(d), dtype="fp32", axes=()),
                            Code("unsigned int* __restrict__ tile_counter")))
        params.append(int_param("section", l2_section(Nx, cfg.DP), "woven combinations a section of the tile order"))
    if p.lse is not None:  # the rows' log-sum-exp (fp32, natural log), for the backward
        sL = contiguous_strides(p.lse)
        params += [Param(Arg("tensor", d.output_names[1], dtype="fp32", axes=p.lse.axis_names),
                         Code("float* __restrict__ Lse")), int_param("sL_q", sL[p.q])]
    fixed = {str(x.decl).split()[-1] for x in params}
    woven = []
    pack = None
    nz = 1
    packed = _packed_axes(p) if cfg.pack > 1 else ()
    if packed:
        why = pack_reason(p, d)
        if why:
            raise CodegenError(f"attention family (wgmma): packing {cfg.pack} heads: {why}")
    for ax in p.woven:

        def name(prefix: str) -> Code:
            n = ident(ax, prefix)
            return n if n not in fixed else ident(ax, prefix[:-1] + "w_")

        names = dict(idx=ident(ax, "i_"), size=name("n_"), rQ=name("rQ_"), rK=name("rK_"), rV=name("rV_"),
                     sO=name("sO_"), axis=ax)
        if ax in packed:  # the tile's heads: Q rows and the output's stride along the axis
            rq = sQ.get(ax, 0)
            if rq % sQ[p.q]:
                raise CodegenError(f"attention family (wgmma): {p.Q.label()}'s stride along {ax} is not whole rows")
            params += [int_param(names["size"], sz[ax]),
                       int_param(names["rQ"], rq // sQ[p.q], f"rows of {p.Q.label()} per index of {ax}"),
                       stride_param(names["sO"], sO[ax], f"stride of the output along {ax}")]
            pack = names
            continue
        nz *= sz[ax]
        rows = {}
        for key, v, s, row in (("rQ", p.Q, sQ, p.q), ("rK", p.K, sK, p.x), ("rV", p.V, sV, p.x)):
            stride = s.get(ax, 0)
            if stride % s[row]:
                raise CodegenError(f"attention family (wgmma): {v.label()}'s stride along {ax} is not whole rows")
            rows[key] = stride // s[row]
        params += [int_param(names["size"], sz[ax]),
                   int_param(names["rQ"], rows["rQ"], f"rows of {p.Q.label()} per index of {ax}"),
                   int_param(names["rK"], rows["rK"], f"rows of {p.K.label()} per index of {ax}"),
                   int_param(names["rV"], rows["rV"], f"rows of {p.V.label()} per index of {ax}"),
                   stride_param(names["sO"], sO[ax], f"stride of the output along {ax}")]
        if p.lse is not None:
            names["sL"] = name("sL_")
            params.append(stride_param(names["sL"], sL[ax], "stride of the log-sum-exp"))
        woven.append(names)
    if why := woven_reason(nz):
        raise CodegenError(f"attention family: {why}")
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    chain = score_chain(d, p.maps, index_vars=index_vars)
    float_idx = max(Nq, Nx) < 2 ** 24
    params.append(float_param("scale_log2", chain.factor * LOG2E))
    causal, window, always_mask = _masks(p, chain)
    smem = cfg.smem_bytes()
    limit = _smem_limit(None, arch)
    if smem > limit:
        raise CodegenError(f"attention family (wgmma): the tiles need {smem} bytes of shared memory; "
                           f"{arch} allows {limit} per block")
    pingpong = cfg.pingpong
    lse = p.lse is not None
    tag = short_hash(T, [str(x) for x in chain.full.lines], [str(x) for x in chain.nomask.lines], p.woven, causal,
                     window, always_mask, cfg, float_idx, pingpong, lse)
    more = (f"_p{cfg.pack}" if pack else "") + ("_lse" if lse else "") + ("_2st" if cfg.overlap else "")
    more += ("_1p" if cfg.one_p else "") + ("_pp" if pingpong else "")
    kname = Code(f"napkin_attn_wgmma_{T}_d{cfg.D}_q{cfg.BQ}_x{cfg.BX}_s{cfg.stages}{more}_{tag}")
    legend = [
        "(sequence lengths and woven sizes are kernel arguments; D is compiled in)",
        f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()} -> {out}[{','.join(p.O.axis_names)}], {T}",
        f"  {p.q} -> queries Nq: g_{p.q} = BQ = {cfg.BQ} (CONSUMERS = {cfg.consumers} warpgroups), w_{p.q} = 64",
        f"  {p.x} -> keys Nx:    s_{p.x} = BX = {cfg.BX}, stages = STAGES = {cfg.stages}",
        f"  {p.d} -> D = {cfg.D} (shared rows of DP = {cfg.DP}; P V at N = NV = {cfg.NV})",
        *[f"  {ax} -> woven (grid.y)" + ("" if ax in p.K.axis_names else "; K, V broadcast along it")
          for ax in p.woven if ax not in packed],
        *[f"  {ax} -> packed: PACK_G = {cfg.pack} heads x QT = {cfg.QT} queries a tile (grid.x); K, V loaded once "
          "for them" for ax in packed],
        f"  engine: wgmma + TMA; registers {PRODUCER_REGS} (producer) / {cfg.consumer_regs()} (consumers)",
        "  loop: " + ("two stages (a chunk's softmax beside the last chunk's P V), "
                      + ("one P buffer" if cfg.one_p else "two P buffers")
                      + (", ping-pong between the consumers" if pingpong else "")
                      if cfg.overlap else "one chunk at a time (S, softmax, P V)"),
        *(["  persistent: one block an SM (grid.x), walking the q tiles x woven combinations, longest first"]
          if cfg.persistent else []),
        f"  score modifiers: {', '.join(chain.boxes) or 'none'}; softmax scale folded: {chain.factor:.6g}",
    ]
    legend += mask_legend(causal, window)
    if lse:
        legend.append(f"  log-sum-exp: {d.output_names[1]}[{','.join(p.lse.axis_names)}] (fp32, natural log) per row")
    ctx = dict(
        kname=kname, T=ctype(T), AB=Code("bf16" if T == "bf16" else "f16"), D=cfg.D, DP=cfg.DP, NV=cfg.NV,
        PACK=pack is not None, PACK_G=cfg.pack, pack=pack, BX=cfg.BX, STAGES=cfg.stages,
        CONSUMERS=cfg.consumers, PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=cfg.consumer_regs(),
        params=signature(params), legend=comment_lines(legend), woven=woven,
        **shared_context(p, chain, index_vars, float_idx, (causal, window, always_mask), cfg.BX // 2, cfg.NV // 2),
        nomask_body=chain.nomask.body("          "), nomask_result=chain.nomask.result,
        NOMASK_NEEDED=bool(chain.nomask.lines), chain_desc=comment(", ".join(chain.boxes) or "none"),
        PINGPONG=pingpong, OVERLAP=cfg.overlap, ONE_P=cfg.one_p, LSE=p.lse is not None, PERSISTENT=cfg.persistent,
        FOLD=grid_folds(nz) and not cfg.persistent, NZ=nz,
    )
    source = render(TEMPLATE, **ctx)
    gy, gz = fold_grid(nz)  # past 65535 combinations grid.z counts on (FOLD)
    grid = (math.ceil(Nq / cfg.QT) * (-(-sz[packed[0]] // cfg.pack) if packed else 1), gy, gz)
    if cfg.persistent:  # one block an SM at most, each walking tiles
        grid = (min(grid[0] * nz, sms), 1, 1)
    tunables = (("BQ", cfg.BQ), ("BX", cfg.BX), ("WQ", 64), ("stages", cfg.stages), ("D", cfg.D),
                ("warpgroups", cfg.consumers), ("engine", "wgmma"), ("causal", causal), ("window", window),
                ("overlap", cfg.overlap), ("pingpong", pingpong), ("one_p", cfg.one_p), ("pack", cfg.pack), ("NV", cfg.NV),
                ("persistent", cfg.persistent))
    return KernelLaunch(
        name=str(kname), source=source, grid=grid, block=(cfg.threads, 1, 1), shared_bytes=smem,
        args=tuple(x.arg for x in params), template=TEMPLATE, tunables=tunables,
        model_smem_bytes=cfg.model_smem_bytes(), model_regs_per_thread=cfg.consumer_regs(),
    )
