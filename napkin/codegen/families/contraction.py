"""The tiled contraction family: matmul (batched, transposed operands) with a fused epilogue.

A diagram belongs here when its only box that is not elementwise is a two-input contraction
over one axis, ``C[batch.., a, c] = Σ_b A[.., a, b]·B[.., b, c]``, and every other box is a
whitelisted map after it (bias, GELU, SiLU, scale, a residual add): the library's ``matmul``,
``batched_matmul``, ``matmul_t`` and ``mlp``. On the wgmma template also: two sums of one operand
combined by maps (SwiGLU's gate and up), an rmsnorm of A over the summed axis times G[b] before
the sum (``rmsnorm_linear``: a prologue on the A tiles, the row scale applied in the epilogue), and
a softmax, logsumexp, sum, max, min or mean along the output's rows: finished in the epilogue when
one tile spans the row (``gemm_softmax`` with ``c <= 256``), else a split reduction (each block's
tile rows reduced to fp32 partials, a small second launch combining them).

Roles are read off the diagram: ``c`` is the output's last (contiguous) axis, the operand that
carries it is ``B`` and the other ``A``; ``a`` is A's own axis (the last of them in the output
if several); every other output axis is a batch axis (grid.y, and past its 65535 on along grid.z:
:data:`MAX_BATCH`), broadcast where an operand lacks it. Each operand may be stored either way round — ``A[a,b]`` or ``A[b,a]``, ``B[b,c]`` or
``B[c,b]`` (nn.Linear) — as its last axis says.

Templates: ``matmul_wgmma.cu.jinja`` (Hopper, sm_90a: TMA copies into swizzled shared tiles,
warpgroup mma from shared memory, a producer warpgroup and consumer warpgroups; bf16/fp16 without
batch axes and with 16-byte aligned rows), ``matmul_mma.cu.jinja`` (bf16/fp16 on mma.sync
m16n8k16, fp32 accumulation, ldmatrix, cp.async multi-stage pipeline, padded shared tiles; any
GPU from sm_80) and ``matmul_simt.cu.jinja`` (fp32: FMA on the CUDA cores, engine ``simt``, or
3xTF32 on mma.sync m16n8k8, engine ``mma.sync``: each operand split into two tf32 values, three
products summed in fp32, fp32-class accuracy at tensor-core speed).
Tile sizes come from the schedule: groups of ``a`` and ``c`` at SMEM (the block tile), the
stream of ``b`` at SMEM (the chunk), groups of ``a`` and ``c`` at RF (the warp or warpgroup
tile); the pipeline depth, the engine (``wgmma``, ``mma.sync`` or ``simt``) and the residency
from the kernel's typed :class:`~napkin.perfmodel.schedule.KernelOptions`.

>>> from napkin.diagrams import library
>>> fam = ContractionFamily()
>>> fam.matches(library.get("mlp")), fam.matches(library.get("softmax"))
(True, False)
>>> d = library.get("matmul_t").bind(a=1000, b=512, c=384)
>>> s = fam.candidates(d, "h100", "bf16")[0]
>>> prog = fam.lower(d, s, "sm_90a")
>>> prog.launches[0].template, prog.launches[0].grid, prog.launches[0].block
('matmul_wgmma.cu.jinja', (16, 1, 1), (384, 1, 1))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from ...diagrams.axes import is_name
from ...diagrams.diagram import Diagram
from ...diagrams.ops import Contract, Map, Value
from ...errors import CodegenError
from ...perfmodel.hardware import has_clusters
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import MAX_GRID_Y, Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment_lines, ident
from .epilogue import (FUNCTIONS, Param, check_epilogue, check_index_size, contiguous_strides, ctype, cuda_float, epilogue_code,
                       index_size_problem, int_param, render, short_hash, signature, stride_param, tensor_param, tensormap_param)

__all__ = ["ContractionFamily", "MatmulProblem", "MatmulConfig", "analyze", "FAMILY"]

#: Block tiles (g_a, g_c), stream (s_b), warp tiles (w_a, w_c), pipeline stages and the thread
#: blocks per SM each configuration is meant to keep resident (its register budget:
#: 65536 / (threads x blocks), enforced by __launch_bounds__) for the mma template.
MMA_CONFIGS = (
    # BM, BN, BK, WM, WN, STAGES, blocks/SM   (first = fastest measured on H200 at 4096^3/8192^3)
    (128, 256, 64, 64, 64, 3, 1),
    (128, 256, 32, 64, 64, 4, 1),
    (256, 128, 64, 64, 64, 3, 1),
    (256, 128, 32, 64, 64, 4, 1),
    (128, 128, 64, 64, 64, 3, 2),
    (128, 128, 32, 64, 64, 4, 2),
    (64, 128, 32, 32, 64, 4, 2),
    (64, 64, 32, 32, 32, 4, 4),
)

#: The wgmma template's configurations (sm_90a): BM, BN, BK (always 64: one 128-byte swizzled
#: row), WM (rows per consumer warpgroup), WN (= BN: one wgmma spans the block's columns), ring
#: stages, blocks per SM. 128 x 256 is the largest tile whose accumulators (128 fp32 per consumer
#: thread) leave the consumers room after setmaxnreg.
WGMMA_CONFIGS = (
    (128, 256, 64, 64, 256, 4, 1),
    (256, 128, 64, 128, 128, 4, 1),
    (128, 192, 64, 64, 192, 5, 1),
    (128, 128, 64, 64, 128, 6, 1),
)

#: The wgmma template's ping-pong configurations (same columns as above, WM = BM): two consumer
#: warpgroups each own whole BM x BN tiles and take a block's work items in turn, one running its
#: main loop while the other stores (the cooperative kernels above stop their tensor cores for
#: each tile's epilogue). BM x BN / 128 accumulators a thread: at most 128, or 192 for a plain
#: product (:func:`_wide_pingpong`). 128 x 192 against the cooperative 128 x 256, H200, bf16,
#: kernels (cuBLAS): 12800 x 768 x 3072 82.7 / 93.3 us (77.5), 8192 x 1024 x 8192 177.2 / 189.9
#: (186.5), 12800 x 3072 x 3072 309.1 / 323.7 (315.5), 12800 x 256 x 3072 39.2 / 43.2 (33.1);
#: 4096^3 186.9 / 172.8 (168.6: 704 tiles of 128 x 192 make 5.3 rounds on 132 SMs, 512 of 128 x
#: 256 3.9). Three stages of it (four staging blocks a consumer fit beside them) ran 7-16 % slower
#: than four (``benchmarks/results/nvidia-h200/wgmma_pingpong_wide.jsonl``).
WGMMA_PINGPONG_CONFIGS = (
    (128, 128, 64, 128, 128, 6, 1),
    (64, 256, 64, 64, 256, 5, 1),
    (128, 192, 64, 128, 192, 4, 1),
)

#: Smaller wgmma tiles offered where 128 x 128 tiles leave most SMs idle (a small output), split
#: over a long sum and unsplit: one consumer warpgroup (or two of 64 rows), eight ring stages.
#: Unsplit, H100 kernels (bf16): 512 x 1024 x 1024 (a x k x n) 64 x 128 5.5 us, 64 x 64 4.8,
#: against 8.0 for 128 x 128 (cuBLAS 4.4); 128 x 256 x 256 64 x 64 2.8 against 4.2. Each block's
#: share of the sum is longer than a 128 x 128 tile's at the same block count, so fewer partials
#: are written and added. H100, bf16, 256 x K x 256, kernels' GPU time against cuBLAS's
#: (`benchmarks/huge_k_sweep.py`): K = 16384 64 x 64 x 8 splits 10.6 us (cuBLAS 9.9; the 128 x 256
#: x 32 the planner took 21.5), K = 32768 64 x 128 x 16 15.7 (12.7; 24.9), K = 65536 32.1 (28.6;
#: 38.7), K = 131072 53.7 (52.4; 60.6 for 128 x 128 x 33).
WGMMA_SPLIT_CONFIGS = (
    (64, 128, 64, 64, 128, 8, 1),
    (128, 64, 64, 64, 64, 8, 1),
    (64, 64, 64, 64, 64, 8, 1),
)

#: The dual (gate and up) configurations of the wgmma template: BN output columns of each sum, so
#: one wgmma spans 2 BN columns and each consumer thread keeps WM x 2 BN / 128 accumulators.
DUAL_CONFIGS = (
    (128, 128, 64, 64, 128, 4, 1),
    (128, 64, 64, 64, 64, 6, 1),
)
#: The dual kernel's ping-pong configurations (WM = BM: a consumer owns whole tiles, see above).
DUAL_PINGPONG_CONFIGS = (
    (64, 128, 64, 64, 128, 5, 1),
    (128, 64, 64, 128, 64, 6, 1),
)

#: The fp32 SIMT template's configurations (8 x 8 micro-tile per thread).
SIMT_CONFIGS = (
    (128, 128, 8, 32, 64, 2, 1),
    (128, 128, 16, 32, 64, 2, 1),
    (64, 64, 8, 32, 64, 2, 2),
)

#: The fp32 template's 3xTF32 configurations (engine mma.sync): warp tiles of m16n8 pieces, three
#: tf32 mma per piece and 8 of k; double-buffered through registers like the FMA ones.
TF32X3_CONFIGS = (
    (128, 128, 16, 64, 32, 2, 1),
    (128, 64, 16, 64, 32, 2, 2),
    (64, 64, 16, 32, 32, 2, 3),
    (128, 128, 8, 64, 32, 2, 1),
)
#: 3xTF32 configurations for an output of few columns (offered where N < 64, the narrowest tile
#: above: one output column is a matrix-vector product written as a matmul). Tiles of 8 columns
#: (one m16n8 piece wide), so A is read once, not once per 64 columns of waste; the sum is then
#: bandwidth-bound, and deep chunks keep each thread's share of A in flight (32 or 16 floats).
TF32X3_NARROW_CONFIGS = (
    (64, 8, 64, 16, 8, 2, 3),
    (32, 8, 32, 16, 8, 2, 8),
)
#: The k's whose products the 3xTF32 engine sums on the tensor cores before one fp32 addition
#: (rounded to nearest) into its accumulators: the tensor cores' additions truncate, and summing
#: all of K there measured 2.9e-5 relative error at 4096^3 (cuBLAS fp32: 1.1e-6; 16: 3.2e-7, and
#: 0.96x cuBLAS against 0.88x with 8 on an H100).
TF32X3_KSUM = 16

#: Small block tiles for products whose output per batch element is small (an output axis of at
#: most :data:`SMALL_OUTPUT` elements: attention-like batches of 32 x 32 tiles, a few columns):
#: the 64-row tiles above would leave most of each block's multiplies on zero rows, and one tile a
#: block with only a few blocks resident leaves each SM waiting on one block's loads at a time.
#: Many small blocks a SM keep the loads of several batch elements in flight.
SMALL_OUTPUT = 32
MMA_SMALL_CONFIGS = (
    (32, 64, 32, 16, 32, 2, 6),
    (32, 32, 32, 16, 32, 2, 12),
)
TF32X3_SMALL_CONFIGS = (
    (32, 32, 16, 16, 32, 2, 10),
    (32, 32, 32, 16, 32, 2, 8),
)

GROUP_M = 8
#: Split sums: at most this many blocks share one output tile, each walking at least this many
#: chunks (fewer would spend more on the partials than the split gains).
MAX_SPLITS = 64
MIN_SPLIT_CHUNKS = 8
#: The most blocks of one thread-block cluster that share a tile's sum (the portable cluster size),
#: and the cluster the planner offers: two blocks, the SMs of one TPC, which every GPC schedules
#: side by side. Larger clusters measured slower on an H200 at every point timed (bf16, kernels,
#: ``cluster_split_candidates_s36.txt``): 4 vectors by 4096 x 4096 on 128 blocks 7.6 us in
#: clusters of 2 against 11.9 in clusters of 4; 256 x 16384 x 256 in clusters of 8 10.9-11.7 us on
#: 64 blocks and 18.3 on 128 (whole clusters of 8 leave SMs of a GPC idle), against 8.2 for 16
#: shares with their partials in HBM. It is offered on the swapped tile (a few vectors by a matrix,
#: :func:`cluster_split_counts`), whose partials are small.
MAX_CLUSTER_SPLITS = 8
OFFERED_CLUSTER_SPLITS = 2
#: Threads per block of the combining launch of a split sum, and the partials each thread loads
#: before it adds them (one thread an output element: 65536 outputs leave ~500 threads a SM, so
#: the bytes in flight come from the depth).
COMBINE_THREADS = 256
COMBINE_DEPTH = 16
SMEM_PAD = 8  # elements of padding per shared row (mma template)
SIMT_PAD = 4


@dataclass(frozen=True)
class MatmulProblem:
    """What the family read off a diagram."""

    contraction: Value
    A: Value
    B: Value
    out: Value
    a: str
    b: str
    c: str
    batch: tuple[str, ...]
    a_kmajor: bool  # A's last axis is b ([a][b]); else a ([b][a])
    b_kmajor: bool  # B's last axis is b ([c][b]); else c ([b][c])
    dtype: str
    #: the other contracted axes (a sum over (h, d) streams d in chunks and walks h one index at
    #: a time, each operand offset by its stride along h), in A's axis order
    k_outer: tuple[str, ...] = ()
    #: a dual contraction (SwiGLU's gate and up): a second contraction of A with B2 (stored as B),
    #: whose result the epilogue combines with the first's (``acc2``)
    contraction2: Value | None = None
    B2: Value | None = None
    #: a prologue (RMSNorm -> linear): the rmsnorm box over b of operand A whose row scale the
    #: epilogue applies, the boxes between A and the contraction, and the input G[b] multiplying
    #: A's tiles as they are loaded (None: the norm alone)
    norm: Value | None = None
    prologue: tuple[Value, ...] = ()
    G: Value | None = None
    #: a reduction along the output's rows (softmax, or a sum, max, min or mean over ``c``) of
    #: the contraction after elementwise maps; the output follows it through further maps
    #: (a logsumexp, several boxes: its last one, the addition of the shift)
    rowred: Value | None = None
    #: which reduction ``rowred`` is (one of :data:`ROW_REDUCTIONS`) and the value it reduces
    rowred_kind: str | None = None
    rowred_x: Value | None = None
    #: the operands swapped (:func:`swap_problem`): ``a`` is the output's last axis (contiguous)
    #: and ``c`` its rows, so the output is stored ``[batch][c][a]`` and its tiles leave transposed
    y_t: bool = False

    @property
    def dual(self) -> bool:
        return self.B2 is not None


@dataclass(frozen=True)
class MatmulConfig:
    """One tile configuration of a template."""

    simt: bool
    BM: int
    BN: int
    BK: int
    WM: int
    WN: int
    stages: int
    blocks_per_sm: int = 1
    wgmma: bool = False  # the Hopper template: WM rows per consumer warpgroup, WN = BN
    splits: int = 1  # blocks sharing one output tile's sum (fp32 partials and a combining launch)
    #: (wgmma, Hopper) the ``splits`` blocks of a tile are one thread-block cluster: their partials
    #: meet in shared memory and block 0 of the cluster runs the epilogue (no workspace, one launch)
    cluster_splits: bool = False
    dual: bool = False  # two sums sharing the A tiles (wgmma): each ring slot holds BN rows of B and of B2
    #: (fp32 template, simt=True) the tensor-core engine: 3xTF32 on mma.sync instead of fp32 FMA
    tf32x3: bool = False
    #: (wgmma, WM = BM) two consumer warpgroups owning whole tiles, alternating work items
    pingpong: bool = False
    #: (wgmma) the operands swapped (:func:`swap_problem`): a 64- or 128-row tile of the matrix, BN
    #: of 8 to 64 columns of the few output rows, the tile leaving transposed (left out of the repr,
    #: which names the kernels: a swapped kernel's name and tag say so themselves)
    swap: bool = field(default=False, repr=False)

    @property
    def consumers(self) -> int:
        """Consumer warpgroups of a wgmma configuration: BM / WM sharing each tile, or the two of
        a ping-pong kernel, each owning whole tiles.

        >>> MatmulConfig(False, 128, 128, 64, 128, 128, 6, wgmma=True, pingpong=True).consumers
        2
        """
        return 2 if self.pingpong else self.BM // self.WM

    @property
    def threads(self) -> int:
        if self.wgmma:
            return 128 * (self.consumers + 1)  # a producer warpgroup and the consumers
        return (self.BM // self.WM) * (self.BN // self.WN) * 32

    def key(self) -> tuple[int, int, int, int, int]:
        """The tile shape (BM, BN, BK, WM, WN), as the configuration tables list it."""
        return self.BM, self.BN, self.BK, self.WM, self.WN

    @property
    def partials_in_hbm(self) -> bool:
        """Whether the tile's sum is split over blocks that leave fp32 partials in an HBM workspace
        for a second, combining launch (not where the blocks are one cluster: :attr:`cluster_splits`)."""
        return self.splits > 1 and not self.cluster_splits

    @property
    def engine(self) -> str:
        if self.simt:
            return "mma.sync" if self.tf32x3 else "simt"
        return "wgmma" if self.wgmma else "mma.sync"

    def options(self) -> KernelOptions:
        """The typed options a schedule of this configuration carries."""
        if self.wgmma:
            return KernelOptions(engine="wgmma", stages=self.stages, warpgroups=self.consumers,
                                 blocks_per_sm=self.blocks_per_sm, regs_per_thread=self.consumer_regs(),
                                 splits=self.splits if self.splits > 1 else None,
                                 swap_ab=True if self.swap else None,
                                 cluster=self.splits if self.cluster_splits else None)
        return KernelOptions(engine=self.engine, stages=self.stages, warps=self.threads // 32,
                             blocks_per_sm=self.blocks_per_sm, regs_per_thread=self.model_regs(),
                             splits=self.splits if self.splits > 1 else None)

    def wgmma_ring_bytes(self, elem: int) -> int:
        """The wgmma template's ring of A and B chunks."""
        return self.stages * (self.BM + self.BN * (2 if self.dual else 1)) * self.BK * elem

    def staging_blocks(self, elem: int) -> int:
        """Swizzled 64 x 64 staging blocks each consumer of a persistent wgmma kernel keeps for its
        TMA stores: as many as fit in the 227 KB beside the ring, up to the blocks of one
        consumer's share of a tile (at most 4), and at least one. With every block of a tile
        staged, a consumer hands its results to the TMA engine and goes straight on to its next
        tile; with fewer, it waits until the copy of an earlier block has read its staging block.

        >>> MatmulConfig(False, 128, 256, 64, 64, 256, 4, wgmma=True).staging_blocks(2)
        2
        >>> MatmulConfig(False, 128, 256, 64, 64, 256, 3, wgmma=True).staging_blocks(2)
        4
        >>> MatmulConfig(False, 128, 192, 64, 64, 192, 5, wgmma=True).staging_blocks(2)
        1
        """
        per_tile = (self.WM // 64) * (self.BN // (2 if self.dual else 1) // 64)
        for n in range(min(4, max(1, per_tile)), 1, -1):
            staged = self.wgmma_ring_bytes(elem) + 2048 + self.consumers * n * 64 * 64 * elem
            if staged <= _smem_limit(None, "sm_90a"):  # (wgmma runs on sm_90a only)
                return n
        return 1

    def smem_bytes(self, p: MatmulProblem, elem: int) -> int:
        """Dynamic shared memory the kernel asks for (padded tiles)."""
        if self.wgmma:  # the ring, 1 KB to align it on a swizzle atom, then 128 B of mbarriers and
            # the consumers' 64 x (64 + 8) staging blocks of a persistent kernel, or (TMA stores)
            # 1 KB holding the mbarriers and their swizzled 64 x 64 blocks
            ring = self.wgmma_ring_bytes(elem) + 1024
            if not wgmma_persistent(p):
                return ring + 128
            padded = 128 + self.consumers * 64 * 72 * elem
            swizzled = 1024 + self.consumers * self.staging_blocks(elem) * 64 * 64 * elem
            return ring + max(padded, swizzled)
        if self.simt and self.tf32x3:  # tiles as stored: [rows][BK + 4] K-major, [BK][cols + 8] else
            a = self.BM * (self.BK + 4) if p.a_kmajor else self.BK * (self.BM + 8)
            b = self.BN * (self.BK + 4) if p.b_kmajor else self.BK * (self.BN + 8)
            return 2 * (a + b) * 4
        if self.simt:
            return 2 * self.BK * ((self.BM + SIMT_PAD) + (self.BN + SIMT_PAD)) * 4
        a_rows, a_cols = (self.BM, self.BK) if p.a_kmajor else (self.BK, self.BM)
        b_rows, b_cols = (self.BN, self.BK) if p.b_kmajor else (self.BK, self.BN)
        pipe = self.stages * (a_rows * (a_cols + SMEM_PAD) + b_rows * (b_cols + SMEM_PAD))
        staging = self.BM * (self.BN + SMEM_PAD)
        return max(pipe, staging) * elem

    def model_smem_bytes(self, elem: int) -> int:
        """Shared memory by the model's accounting: A and B chunks times the stages."""
        return self.stages * (self.BM * self.BK + self.BK * self.BN * (2 if self.dual else 1)) * elem

    def model_regs(self) -> int:
        """The register budget per thread: what keeps ``blocks_per_sm`` blocks resident (the wgmma
        template's consumers get more of it from the producer with setmaxnreg)."""
        return min(255, 65536 // (self.threads * self.blocks_per_sm) // 8 * 8)

    def consumer_regs(self) -> int:
        """Registers per consumer thread after setmaxnreg (the producer keeps 40)."""
        return min(240, (65536 - 128 * 40) // (128 * self.consumers) // 8 * 8)


def _inner_contracted_axis(A: Value, B: Value, over: tuple[str, ...]) -> str | None:
    """The contracted axis streamed in chunks (the others are walked one index at a time).

    A K-major operand (its last axis contracted) fixes it: the chunk is a contiguous run of that
    axis. Two K-major operands must agree. Otherwise it is the contracted axis with the smallest
    stride in A (its rows are then the chunk's rows)."""
    a_last, b_last = A.axis_names[-1], B.axis_names[-1]
    if a_last in over and b_last in over and a_last != b_last:
        return None
    if a_last in over:
        return a_last
    if b_last in over:
        return b_last
    return [n for n in A.axis_names if n in over][-1]


def _dual_problem(diagram: Diagram, contracts: list[Value]) -> MatmulProblem | str:
    """Two contractions of one operand with two others of the same layout over one axis, into the
    same output axes, combined by elementwise maps (SwiGLU's ``silu(X·Wgᵀ) ⊙ X·Wuᵀ``): one kernel
    reads the shared operand once and keeps both sums in registers (the wgmma template only)."""
    c1, c2 = contracts
    if not all(isinstance(c.op, Contract) and len(c.args) == 2 for c in contracts):
        return "two non-elementwise boxes that are not two contractions of two operands"
    shared = [a for a in c1.args if any(a is b for b in c2.args)]
    if len(shared) != 1 or not shared[0].is_input:
        return "two contractions that do not share exactly one input operand (a dual contraction)"
    A = shared[0]
    B = next(a for a in c1.args if a is not A)
    B2 = next(a for a in c2.args if a is not A)
    if not (B.is_input and B2.is_input) or B is B2 or B.axis_names != B2.axis_names:
        return "a dual contraction's other operands must be two inputs stored alike"
    if tuple(c1.op.over) != tuple(c2.op.over) or len(c1.op.over) != 1 or c1.axis_names != c2.axis_names:
        return "a dual contraction's two sums must run over the same one axis into the same axes"
    outs = diagram.outputs
    if len(outs) != 1 or set(outs[0].axis_names) != set(c1.axis_names):
        return "a dual contraction writes one output on the contractions' axes"
    for v in diagram.nodes:
        if v is c1 or v is c2:
            continue
        if not isinstance(v.op, Map) or v.op.fn not in FUNCTIONS or not set(v.axis_names) <= set(c1.axis_names):
            return f"box {diagram.name_of(v)} of a dual contraction is not an elementwise map on its axes"
    if not (outs[0].depends_on(c1) and outs[0].depends_on(c2)):
        return "the output of a dual contraction must combine both sums"
    one = Diagram("dual_first", c1)
    p = _reason_or_problem(one)
    if isinstance(p, str):
        return p
    if p.A is not A or p.batch or p.k_outer:
        return "a dual contraction runs two plain matmuls that share their rows operand"
    return replace(p, out=outs[0], contraction2=c2, B2=B2)


def _prologue_problem(diagram: Diagram, norm: Value, contracts: list[Value]) -> MatmulProblem | str:
    """RMSNorm -> linear: ``Y = epilogue(Σ_b (rmsnorm_b(X)·G[b])·W)`` with the norm over the summed
    axis ``b`` of the input X: the row scale 1/√(mean_b X² + eps) factors out of the sum, so the
    kernel multiplies X's tiles by G as they are loaded, accumulates Σ_b X² from the same tiles
    (every b of a row passes through the block) and scales the sum in the epilogue."""
    C = next(v for v in contracts if v is not norm)
    X = norm.args[0]
    if norm.op.how != "rmsnorm":
        return f"a {norm.op.how} before the contraction (only rmsnorm's row scale factors out of the sum)"
    if not isinstance(C.op, Contract) or len(C.args) != 2 or tuple(C.op.over) != (norm.op.over,):
        return "the rmsnorm feeds a box that is not a two-operand contraction over the norm's axis alone"
    if not X.is_input:
        return "the rmsnorm's operand is not a diagram input"
    b = norm.op.over
    # the chain from the norm to the contraction: nothing, or one multiplication by an input on b
    chain, G = [norm], None
    operand = next((a for a in C.args if not a.is_input), None)
    if operand is not norm:
        if not (isinstance(operand.op, Map) and operand.op.fn == "mul" and len(operand.args) == 2
                and any(a is norm for a in operand.args)):
            return "between the rmsnorm and the contraction is something other than one multiplication by G[b]"
        G = next(a for a in operand.args if a is not norm)
        if not G.is_input or G.axis_names != (b,) or G.dtype != X.dtype:
            return f"the rmsnorm is multiplied by {G.label()}, not by an input on its axis {b!r} alone"
        chain.append(operand)
    lhs = chain[-1]
    other = [a for a in C.args if a is not lhs]
    if len(other) != 1 or not other[0].is_input or other[0] is X:
        return "the contraction must multiply the normalised operand by another diagram input"
    for v in chain:
        if len(diagram.consumers.get(id(v), ())) != 1:
            return f"box {diagram.name_of(v)} of the prologue is read by more than the contraction"
    from ...diagrams.ops import contract

    core = _reason_or_problem(Diagram("prologue_core", contract(X, other[0], over=b, out=C.axis_names)))
    if isinstance(core, str):
        return core
    reason = check_epilogue(diagram, C, before=tuple(chain))
    if reason:
        return reason
    if core.A is not X or not core.a_kmajor or core.batch or core.k_outer:
        return (f"the rmsnorm's operand {X.label()} must be the rows operand of a plain matmul, stored with "
                f"{b!r} last (its rows are normalised as their tiles stream by)")
    if any(v.dtype != X.dtype for v in diagram.inputs):
        return "inputs have different dtypes"
    return replace(core, contraction=C, out=diagram.outputs[0], norm=norm, prologue=tuple(chain), G=G)


#: The reductions along a row the wgmma epilogue runs: in registers when the tile spans the row,
#: else as fp32 partials per column tile that a second launch combines.
ROW_REDUCTIONS = ("softmax", "logsumexp", "sum", "max", "min", "mean")

#: Threads per block of a split row reduction's second launch.
ROWCOMBINE_THREADS = 256
#: Column tiles of a split softmax row at most (the second launch keeps a float per tile in
#: shared memory: 32 KiB).
MAX_ROW_TILES = 8192


def _logsumexp_boxes(diagram: Diagram, reds: list[Value]) -> tuple[Value, Value, list[Value]] | str:
    """A logsumexp as :func:`napkin.diagrams.ops.logsumexp` writes it, ``m = zero_inf(max_c x)``,
    ``add(log(sum_c(exp(x - m))), m)``: (x, the final addition, every box of it), or why not.

    >>> from napkin.diagrams import Axis, array, logsumexp
    >>> d = Diagram("l", logsumexp(array("X", Axis("r"), Axis("c")), "c", name="Y"))
    >>> x, out, boxes = _logsumexp_boxes(d, [v for v in d.nodes if v.op.kind == "reduce"])
    >>> x.name, d.name_of(out), len(boxes)
    ('X', 'Y', 7)
    """
    hows = sorted(getattr(r.op, "how", r.op.kind) for r in reds)
    if hows != ["max", "sum"] or reds[0].op.over != reds[1].op.over:
        return f"reductions {hows} after the contraction (one row reduction, or a logsumexp's max and sum)"
    mx, sm = sorted(reds, key=lambda r: r.op.how)
    x = mx.args[0]

    def only(v: Value, fn: str, n: int = 1) -> list[Value] | None:
        users = list(diagram.consumers.get(id(v), ()))
        ok = len(users) == n and all(isinstance(u.op, Map) and u.op.fn in fn.split("|") for u in users)
        return users if ok else None

    z = only(mx, "zero_inf")
    users = only(z[0], "sub|add", 2) if z else None
    sub = next((u for u in users or () if u.op.fn == "sub" and u.args[0] is x and u.args[1] is z[0]), None)
    add = next((u for u in users or () if u.op.fn == "add"), None)
    e = only(sub, "exp") if sub is not None else None
    if not e or sm.args[0] is not e[0] or add is None:
        return "a max and a sum over the row that are not a logsumexp (zero_inf(max), exp(x - m), log(sum) + m)"
    lg = only(sm, "log")
    if not lg or add.args[0] is not lg[0] or add.args[1] is not z[0]:
        return "a max and a sum over the row that are not a logsumexp (zero_inf(max), exp(x - m), log(sum) + m)"
    return x, add, [mx, z[0], sub, e[0], sm, lg[0], add]


def _rowred_problem(diagram: Diagram, R: Value, contracts: list[Value]) -> MatmulProblem | str:
    """GEMM -> row reduction: ``out = post(R_c(pre(Σ_b A·B)))`` with R a softmax, logsumexp, or a
    sum, max, min or mean, over the output's last axis ``c``, ``pre`` and ``post`` elementwise maps.
    Each row of the accumulators lives in one quad of lanes: the epilogue reduces a tile's row with
    two shuffles. When one block tile spans the row (N <= g_c) that is the result and the logits
    never reach HBM; otherwise each block writes its rows' partials and a second launch combines
    them (a softmax's logits are stored and normalised there)."""
    reds = [v for v in contracts if v.op.kind in ("softmax", "reduce")]
    lse = _logsumexp_boxes(diagram, reds) if len(reds) == 2 else None
    if isinstance(lse, str):
        return lse
    C = next(v for v in contracts if not any(v is r for r in reds))
    if not isinstance(C.op, Contract) or len(C.args) != 2:
        return "the reduction does not follow a two-operand contraction"
    if lse:
        X, R, inner = lse
        kind, over = "logsumexp", reds[0].op.over
    else:
        X, inner = R.args[0], [R]
        kind = R.op.kind if R.op.kind == "softmax" else R.op.how
        over = R.op.over
    if kind not in ROW_REDUCTIONS:
        return (f"a {kind} reduction after the contraction (softmax, logsumexp, sum, max, min or mean run in "
                "its epilogue)")
    if not C.axis_names or C.axis_names[-1] != over:
        return (f"the reduction runs over {over!r}, not the contraction's last (column) axis: a row "
                "reduction of the output tile reduces along its columns")
    core_diagram = Diagram("rowred_core", C)
    if any(not isinstance(v.op, Map) for v in core_diagram.nodes if v is not C):
        return "the contraction before the row reduction reads a value computed by another reduction or contraction"
    core = _reason_or_problem(core_diagram)
    if isinstance(core, str):
        return core
    if core.batch or core.k_outer:
        return "a row reduction after the contraction runs on a plain matmul (no batch or outer-sum axes)"
    pre_axes, post_axes = set(C.axis_names), set(R.axis_names)
    outs = diagram.outputs
    if len(outs) != 1 or not outs[0].depends_on(R) or set(outs[0].axis_names) != post_axes:
        return "the diagram's one output must follow the row reduction through elementwise maps on its axes"
    for v in diagram.nodes:
        if v is C or any(v is u for u in inner):
            continue
        after = v.depends_on(R)
        axes = post_axes if after else pre_axes
        if not isinstance(v.op, Map) or v.op.fn not in FUNCTIONS or not set(v.axis_names) <= axes:
            return (f"box {diagram.name_of(v)} around the row reduction is not a whitelisted map on "
                    f"{'its' if after else 'the contraction'}'s axes")
        if not after and not v.depends_on(C):
            return f"box {diagram.name_of(v)} does not follow the contraction"
        if after and any(not a.is_input and a is not R and not a.depends_on(R) for a in v.args):
            return (f"box {diagram.name_of(v)} after the row reduction reads a value from before it "
                    "(the epilogue keeps only the reduction's result)")
        for a in v.args:
            if a.is_input and not set(a.axis_names) <= axes:
                return f"input {a.label()} of box {diagram.name_of(v)} carries axes beyond {sorted(axes)}"
    if not X.depends_on(C) and X is not C:
        return "the row reduction does not read the contraction"
    return replace(core, out=outs[0], rowred=R, rowred_kind=kind, rowred_x=X)


def wgmma_target_reason(dtype: str, gpu=None, arch: str | None = None) -> str | None:
    """Why a wgmma template cannot run ``dtype`` on ``gpu`` (a profile or name) or ``arch``, or None
    (the check every wgmma template makes before its own).

    >>> wgmma_target_reason("bf16", "h100"), wgmma_target_reason("fp32", "h100")
    (None, 'dtype fp32: the wgmma template multiplies bf16 or fp16')
    """
    if dtype not in ("bf16", "fp16"):
        return f"dtype {dtype}: the wgmma template multiplies bf16 or fp16"
    if gpu is not None:
        from ...perfmodel.hardware import get_gpu

        g = get_gpu(gpu)
        if not g.has_wgmma:
            return f"{g.key} ({g.arch}) has no wgmma (it needs sm_90a)"
    if arch is not None and arch != "sm_90a":
        return f"{arch} has no wgmma (it needs sm_90a)"
    return None


def _reason_or_problem(diagram: Diagram) -> MatmulProblem | str:
    contracts = [v for v in diagram.nodes if not isinstance(v.op, Map)]
    norms = [v for v in contracts if v.op.kind == "norm"]
    if len(contracts) == 2 and len(norms) == 1:
        return _prologue_problem(diagram, norms[0], contracts)
    reds = [v for v in contracts if v.op.kind in ("softmax", "reduce")]
    if len(contracts) == 2 and len(reds) == 1:
        return _rowred_problem(diagram, reds[0], contracts)
    if len(contracts) == 3 and len(reds) == 2:  # a logsumexp (its max and its sum) after the contraction
        return _rowred_problem(diagram, reds[0], contracts)
    if len(contracts) == 2:
        return _dual_problem(diagram, contracts)
    if len(contracts) != 1 or not isinstance(contracts[0].op, Contract):
        kinds = sorted({v.op.kind for v in contracts})
        return f"needs exactly one non-elementwise box, a contraction (has {kinds or 'none'})"
    C = contracts[0]
    op: Contract = C.op
    if len(C.args) != 2 or not all(a.is_input for a in C.args) or C.args[0] is C.args[1]:
        return "the contraction must multiply two distinct diagram inputs"
    reason = check_epilogue(diagram, C)
    if reason:
        return reason
    out = diagram.outputs[0]
    if not out.axis_names:
        return "the output is a scalar (a sum over every axis: no rows or columns to tile)"
    c = out.axis_names[-1]
    x, y = C.args
    if not op.over:
        return "a product over no axis (an outer or elementwise product) has no sum to tile"
    for n in op.over:
        if not (n in x.axis_names and n in y.axis_names):
            return f"the contracted axis {n!r} must belong to both operands"
    carriers = [v for v in (x, y) if c in v.axis_names]
    if len(carriers) != 1:
        return f"the output's last axis {c!r} must belong to exactly one operand"
    B = carriers[0]
    A = y if B is x else x
    if any(v.dtype != A.dtype for v in diagram.inputs):
        return "inputs have different dtypes"
    b = _inner_contracted_axis(A, B, tuple(op.over))
    if b is None:
        return (f"operands {A.label()} and {B.label()} are stored with different contracted axes last; "
                "the chunk of the sum must be contiguous in both")
    k_outer = tuple(n for n in A.axis_names if n in op.over and n != b)
    own_a = [n for n in A.axis_names if n not in op.over and n not in B.axis_names]
    if not own_a:
        return f"operand {A.label()} has no axis of its own (rows)"
    a = [n for n in out.axis_names if n in own_a][-1]
    batch = tuple(n for n in out.axis_names if n not in (a, c))
    if A.axis_names[-1] not in (a, b):
        return f"operand {A.label()} must be stored with {a!r} or {b!r} last (contiguous)"
    if B.axis_names[-1] not in (b, c):
        return f"operand {B.label()} must be stored with {b!r} or {c!r} last (contiguous)"
    for n in B.axis_names:
        if n not in (b, c) and n not in batch and n not in k_outer:
            return f"operand {B.label()}: axis {n!r} is neither contracted nor in the output"
    return MatmulProblem(C, A, B, out, a, b, c, batch, A.axis_names[-1] == b,
                         B.axis_names[-1] == b, A.dtype, k_outer)


#: Blocks per cluster of a persistent wgmma kernel of one sum: the blocks of a cluster take tiles of
#: consecutive block rows and share one copy of their B tile (each block copies its part to all of
#: them through TMA multicast). Off: on an H100, 66 clusters of 2 ran 4096^3 at 325 TFLOP/s
#: against 760 for 132 single blocks (every configuration; the kernel is right, its GPU tests pass).
#: That run released each slot with cluster-scope arrivals (mbarrier.arrive.release.cluster). With
#: the plain remote arrival it makes now (and TMA stores), H200, bf16, kernels, 1 / 2 blocks a
#: cluster: 128 x 256 at 12800 x 768 x 3072 94.1 / 92.9 us, 4096^3 173.5 / 172.8, 8192 x 1024 x
#: 8192 191.6 / 188.9, 16384 x 32 x 16384 154.5 / 161.6, 4096 x 512 x 4096 28.8 / 29.2; 256 x 128
#: slower with clusters at four of the five, 0.2 % faster at the fifth (``cluster_ab.json``): still off.
WGMMA_CLUSTER = 1


#: Whether a persistent wgmma kernel whose two consumer warpgroups share each tile starts consumer 1
#: STAGES - 2 chunks behind consumer 0, so that their epilogues do not stop the tensor cores at
#: the same time (each overlaps the other's wgmma). Off: on an H100 (bf16, the planner's 128 x 256
#: kernels, two runs each) it gained nothing measurable at 4096^3 (183 / 182 us against 182 off)
#: and ran matmul_t 4096^3 slower (218 / 214 us against 195), while 8192^3 (1438 / 1449 against
#: 1504) and swiglu's down projection (482 / 474 against 489) ran faster by less than the spread
#: between runs; the GPU tests and racecheck passed with it on.
WGMMA_STAGGER = False


#: The share of the SM's CUDA-core and SFU rates the maps of a wgmma row reduction's epilogue reach:
#: its two consumer warpgroups compute them alone after the loop, one tile a block (two warps a
#: scheduler), too few to hide their dependent instructions' latency. H200, bf16, kernels:
#: sigmoid, tanh and exp before a row sum over 8192 x 1024 x 1024 took 29 us after the split's
#: loop, where the full rates price them 6.7, and the GEMM and a row kernel apart ran 38.9 us
#: against the split's 54.8 (``benchmarks/results/nvidia-h200/gemm_map_chain_ab.jsonl``).
#: The persistent kernels keep the full rates: the same factor on their epilogues moved maps out
#: of them where the fused kernel measured faster (a sigmoid, a scale and a residual after a
#: 4096 x 1024 x 4096 product: 61.0 us fused, 69.0 with the maps apart), while a bias and the erf
#: GELU measured 4 % slower to 7 % faster apart: the per-function costs the model gives its maps
#: (one SFU operation for tanhf or the erf GELU, tens of instructions each) are the larger error,
#: and this factor is too low for a cheap map: a sigmoid before a row sum over 8192 x 1024 x 1024
#: moved apart with it and ran 37.8 us there against 36.7 split (``wgmma_plan_ab.jsonl``).
WGMMA_ROWRED_EPILOGUE_RATE = 0.25


#: Whether a persistent wgmma kernel's consumers send their 64 x 64 output blocks to HBM with TMA
#: copies (:func:`wgmma_tma_store`) rather than 16-byte stores from registers read back from the
#: staging block (the consumer then waits until its stores have left, and the tensor cores with
#: it: a cooperative kernel's two consumers store at once). H200, bf16, kernels (profiler), the
#: planner's 128 x 256 tile off / on, cuBLAS: 12800 x 768 x 3072 98.7 / 94.0 (77.5), with bias +
#: GELU 146.4 / 139.1; 16384 x 32 x 16384 182.8 / 156.2 (166.7); K = 16 186.2 / 154.7 (156.0);
#: 4096 x 512 x 4096 30.7 / 28.9 (28.8); 8192 x 1024 x 8192 196.9 / 191.6 (187.0); 4096^3
#: 175.3 / 173.7 (170.0); 6144^3 590.6 / 583.4; 8192^3 1384.8 / 1390.8 (clocks drifting 10 % over
#: the run). The ping-pong 128 x 128 at 12800 x 768 x 3072: 91.5 / 90.1
#: (``benchmarks/results/nvidia-h200/tma_store_ab*.json``).
WGMMA_TMA_STORE = True


def wgmma_tma_store(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, staged: Sequence[Value]) -> bool:
    """Whether the wgmma kernel of ``p`` stores its output with TMA copies: a persistent kernel of
    one share of the sum, with no operand staged like the output (a residual is read in the
    staging block), whose output rows are a multiple of 16 bytes, and whose batch axes (if any)
    lie in front of its row axis, so that the output is ``[batch][M][N]`` with the batch axes
    flattened (the tensor map is 3-D with a batch, else 2-D; the engine clips each copy to M x N).
    Nothing here depends on M: a dynamic row count keeps one kernel.

    >>> from napkin.diagrams import Axis, Diagram, array, contract
    >>> a, b, c = Axis("a"), Axis("b"), Axis("c")
    >>> Y = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="Y")
    >>> d = Diagram("mm", Y).with_dtype("bf16").bind(a=1000, b=64, c=200)
    >>> cfg = MatmulConfig(False, 128, 256, 64, 64, 256, 4, wgmma=True)
    >>> wgmma_tma_store(d, analyze(d), cfg, []), wgmma_tma_store(d.bind(c=201), analyze(d), cfg, [])
    (True, False)
    """
    if not (WGMMA_TMA_STORE and wgmma_persistent(p) and not cfg.partials_in_hbm and not staged):
        return False
    if p.y_t:  # the output [batch][c][a]: rows along a, the tile's rows
        m = diagram.sizes.get(p.a)
        return (isinstance(m, int) and (m * _elem(p.dtype)) % 16 == 0
                and tuple(p.out.axis_names) == (*p.batch, p.c, p.a))
    n = diagram.sizes.get(p.c)
    return (isinstance(n, int) and (n * _elem(p.dtype)) % 16 == 0
            and tuple(p.out.axis_names) == (*p.batch, p.a, p.c))


def wgmma_cluster(p: MatmulProblem) -> int:
    """The cluster size the wgmma template runs ``p`` with (1: no cluster)."""
    return WGMMA_CLUSTER if wgmma_persistent(p) and not p.dual else 1


def wgmma_persistent(p: MatmulProblem) -> bool:
    """Whether the wgmma template runs ``p`` persistently (a block per SM walking output tiles, the
    next tile's chunks loading while this one's results leave): not with an rmsnorm prologue or a
    row reduction, whose epilogues stage the whole tile in the ring's memory."""
    return p.norm is None and p.rowred is None


def _pingpong_first(coop: list[MatmulConfig], pingpong: list[MatmulConfig]) -> list[MatmulConfig]:
    """The cooperative configurations in order, each preceded by the ping-pong one of its block tile
    (the model prices the two alike, and the planner keeps the first of equal candidates). On an
    H100 (bf16) the ping-pong kernel was the faster at the same tile every time: 128 x 128 at
    4096^3 191 / 195 us against 196 / 215 (cooperative), matmul_t 192 / 195 against 223 / 204,
    swiglu's down projection 529 / 534 against 677 / 645; dual 128 x 64 at swiglu's gate and up
    1304 / 1317 against 1496 / 1500. Larger tiles (128 x 256) stay first. A ping-pong tile with no
    cooperative twin (64 x 256, dual 64 x 128) is left to schedules that ask for it: it never beat
    the planner's cooperative kernel (4096^3 196 / 200 us against 182 - 184 for 128 x 256).

    >>> c = FAMILY.configs("bf16", "wgmma")
    >>> [(x.BM, x.BN, x.pingpong) for x in c]
    [(128, 256, False), (256, 128, False), (128, 192, True), (128, 192, False), (128, 128, True), (128, 128, False)]
    """
    out = []
    for c in coop:
        out += [q for q in pingpong if (q.BM, q.BN) == (c.BM, c.BN) and q not in out]
        out.append(c)
    return out


def _output_tiles(diagram: Diagram, p: MatmulProblem, bm: int, bn: int) -> int | None:
    """The output's bm x bn tiles, times the batch; None where a size is symbolic."""
    sz = diagram.sizes
    if not all(isinstance(sz.get(n), int) for n in (p.a, p.c, *p.batch)):
        return None
    return math.ceil(sz[p.a] / bm) * math.ceil(sz[p.c] / bn) * math.prod(sz[n] for n in p.batch)


def _few_tiles(diagram: Diagram, p: MatmulProblem, gpu) -> bool:
    """Whether 128 x 128 output tiles (times the batch) leave over half the GPU's SMs idle: then
    the small wgmma tiles (:data:`WGMMA_SPLIT_CONFIGS`) are offered unsplit too, and the large
    ones are not split."""
    tiles = _output_tiles(diagram, p, 128, 128)
    return tiles is not None and tiles * 2 <= _sm_count(gpu)


#: The most output rows (of the operand on the wgmma tile's row side, a batch element's) for which
#: only tiles of 64 rows run on wgmma: past them a consumer warpgroup's rows of a 128-row tile all
#: lie beyond the edge, and it runs its chain of wgmma over zeros beside the other. H200, bf16, a
#: few vectors by an 11008 x 4096 matrix (4 rows): 128 x 128 tiles on two consumers 48.8 us of
#: kernel, 0.76 us a chunk, where 64 x 128 tiles over 8192 rows ran 0.40 us a chunk.
THIN_ROWS = 64


def _thin(diagram: Diagram, p: MatmulProblem) -> bool:
    """Whether the wgmma tile's rows (``p.a``) hold at most :data:`THIN_ROWS` elements: then only
    64-row wgmma tiles are offered, unsplit as well as split."""
    n = diagram.sizes.get(p.a)
    return isinstance(n, int) and n <= THIN_ROWS


#: The ring slots of the kernels ``GPU.wgmma_step_clk`` was measured on: a deeper ring shares the
#: step's round trip among more chunks in flight (:func:`ring_share`).
CHAIN_STAGES = 8


def ring_share(stages: int) -> float:
    """The share of ``GPU.wgmma_step_clk`` a chunk's dependent wgmma pay a step on a ring of
    ``stages`` slots: the slots in flight (STAGES - 2) of the kernels the step was measured on
    (:data:`CHAIN_STAGES`) over this ring's, and no more than the whole step. H200, bf16, 4 vectors
    by a 4096 x 4096 matrix in 2 splits (128 blocks of 32 chunks): 0.20 us a chunk on the swapped
    tile's 16 slots, 0.45 on the 64 x 64 tile's 8 (``swap_ab_s28.txt``).

    This prices the swapped tile's chunk at 0.105 us where its kernels measured 0.18-0.20 with
    L2 warm (``cluster_split_candidates_s36.txt``: 64 chunks a block on 64 blocks, 11.3 us). The
    square root of the ratio (0.65) matched them, but moved plans that measured slower with L2
    flushed (4 vectors by W[k, a] of 4096 x 4096 went to the pointwise family, 11.6 -> 14.3 us of
    kernels, ``cluster_split_ab_s36.jsonl``), so the ratio stays.

    >>> ring_share(8), round(ring_share(16), 3), ring_share(4)
    (1.0, 0.429, 1.0)
    """
    return min(1.0, (CHAIN_STAGES - 2) / max(1, stages - 2))

#: The wgmma N of a swapped tile (:func:`swap_problem`): the output's few rows, rounded up to one
#: of these.
SWAP_WIDTHS = (8, 16, 32, 64)

#: The most ring slots a swapped tile keeps. Its chunks are small (64 rows of the matrix and BN of
#: the vectors, 9-16 KB), and each SM must keep enough of the matrix in flight to stream it at the
#: HBM rate: by Little's law about 2 us of loaded latency times the SM's share of the bandwidth.
SWAP_MAX_STAGES = 16


def swap_problem(p: MatmulProblem) -> MatmulProblem:
    """``p`` with its operands swapped on the tensor cores: the operand that carries the output's
    last axis (``p.B``, the matrix of a linear layer) becomes the tile's rows, the output's few
    rows (``p.a``, the vectors) its columns, and the output tile leaves transposed (``y_t``). A
    product of a few vectors by a matrix then fills the wgmma's 64 rows with the matrix instead of
    padding the vectors to 64 rows, and a tile's chunk is 64 rows of the matrix and 8 to 64 of the
    vectors, so that many chunks fit in flight on every SM.

    >>> from napkin.diagrams import Axis, Diagram, array, contract
    >>> a, b, k = Axis("a"), Axis("b"), Axis("k")
    >>> Y = contract(array("x", b, k), array("W", a, k), over=k, out=(b, a), name="Y")
    >>> p = analyze(Diagram("linear", Y))
    >>> q = swap_problem(p)
    >>> (p.A.name, p.a, p.c), (q.A.name, q.a, q.c, q.y_t)
    (('x', 'b', 'a'), ('W', 'a', 'b', True))
    """
    return replace(p, A=p.B, B=p.A, a=p.c, c=p.a, a_kmajor=p.b_kmajor, b_kmajor=p.a_kmajor, y_t=True)


def swap_reason(diagram: Diagram, p: MatmulProblem) -> str | None:
    """Why the swapped tile (:func:`swap_problem`) cannot run ``p``, or None if it can (the wgmma
    template's own conditions are checked apart): a product with elementwise maps after it only
    (no dual sum, prologue or row reduction), at most :data:`THIN_ROWS` output rows and more than
    that along the matrix's own axis (else swapped it pads as much), the vectors
    stored with the sum's axis last (an 8-row box of them is one 128-byte swizzle atom), the
    output's last axis a multiple of 16 bytes behind its batch axes (the transposed tile leaves
    by TMA), and tensor maps for both operands the other way round.

    >>> from napkin.diagrams import Axis, Diagram, array, contract
    >>> a, b, k = Axis("a"), Axis("b"), Axis("k")
    >>> Y = contract(array("x", b, k), array("W", a, k), over=k, out=(b, a), name="Y")
    >>> d = Diagram("linear", Y).with_dtype("bf16")
    >>> swap_reason(d.bind(a=4096, b=4, k=4096), analyze(d)) is None
    True
    >>> swap_reason(d.bind(a=4096, b=128, k=4096), analyze(d))
    "the output has more than 64 rows along 'b' (128)"
    """
    if p.y_t:
        return "the operands are swapped already"
    if p.dual or p.norm is not None or p.rowred is not None:
        return "a dual sum, an rmsnorm prologue or a row reduction keeps the output's rows on the tile's rows"
    rows = diagram.sizes.get(p.a)
    if not _thin(diagram, p):
        return f"the output has more than {THIN_ROWS} rows along {p.a!r} ({rows})"
    cols = diagram.sizes.get(p.c)
    if not (isinstance(cols, int) and cols > THIN_ROWS):
        return f"the matrix side {p.c!r} ({cols}) fills no 64-row tile: swapped, it would pad as much"
    if not p.a_kmajor:
        return f"operand {p.A.label()} is not stored with the sum's axis {p.b!r} last"
    if cols * _elem(p.dtype) % 16:
        return f"the output's last axis {p.c!r} ({cols}) is not a multiple of 16 bytes (the tile leaves by TMA)"
    if tuple(p.out.axis_names) != (*p.batch, p.a, p.c):
        return "the output's batch axes are not in front of its rows"
    return _operand_views_reason(diagram, swap_problem(p))


def _swap_config(diagram: Diagram, p: MatmulProblem, dtype: str, bm: int = 64) -> MatmulConfig:
    """The swapped tile for ``p`` (unswapped): ``bm`` rows of the matrix (64, one consumer, or 128,
    two consumers sharing each chunk of the vectors), the fewest of :data:`SWAP_WIDTHS` columns
    that hold the output's rows, and as many ring slots as fit, up to :data:`SWAP_MAX_STAGES`."""
    rows = diagram.sizes[p.a]
    bn = next(w for w in SWAP_WIDTHS if w >= rows)
    cfg = MatmulConfig(False, bm, bn, 64, 64, bn, 2, wgmma=True, swap=True)
    return replace(cfg, stages=_swap_stages(cfg, swap_problem(p), _elem(dtype)))


def _swap_stages(cfg: MatmulConfig, ps: MatmulProblem, elem: int = 2) -> int:
    """The most ring slots, up to :data:`SWAP_MAX_STAGES`, with which the swapped tile ``cfg`` of
    the swapped problem ``ps`` fits the shared memory of sm_90a (2 at least)."""
    limit = _smem_limit(None, "sm_90a")
    return next((n for n in range(SWAP_MAX_STAGES, 2, -1) if replace(cfg, stages=n).smem_bytes(ps, elem) <= limit), 2)


#: The most batch elements an mma.sync or SIMT contraction kernel takes: they go along grid.y and,
#: past its 65535, on along grid.z (``fold_grid``: element ``blockIdx.y + gridDim.y * blockIdx.z``,
#: the last slice's blocks past them returning at once), so 65535^2 (the wgmma template numbers the
#: batch in its work items). Past it those configurations build nothing, and the planner takes
#: another rather than present a plan that cannot be generated.
MAX_BATCH = MAX_GRID_Y * MAX_GRID_Y


def _batch_count(diagram: Diagram) -> int:
    """The batch elements of ``diagram``'s product (0 where it has none or a size is unbound)."""
    p = _reason_or_problem(diagram)
    if isinstance(p, str) or not all(isinstance(diagram.sizes.get(a), int) for a in p.batch):
        return 0
    return math.prod(diagram.sizes[a] for a in p.batch) if p.batch else 0


def problem_of(diagram: Diagram, schedule: Schedule) -> MatmulProblem:
    """The problem a schedule's kernel runs: :func:`analyze`'s, swapped where its options say
    ``swap_ab`` (a CodegenError says why the diagram cannot be swapped)."""
    p = analyze(diagram)
    if len(schedule.kernels) == 1 and schedule.kernels[0].options.swap_ab:
        why = swap_reason(diagram, p)
        if why:
            raise CodegenError(f"contraction family: the schedule swaps the operands (swap_ab), but {why}")
        return swap_problem(p)
    return p


def _small_output(diagram: Diagram, p: MatmulProblem) -> bool:
    """Whether an output axis (rows or columns, per batch element) has at most
    :data:`SMALL_OUTPUT` elements: then the small block tiles are offered (a 64-row tile would
    multiply mostly zero rows)."""
    sz = diagram.sizes
    return any(isinstance(sz.get(n), int) and sz[n] <= SMALL_OUTPUT for n in (p.a, p.c))


def cluster_split_counts(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, counts: Sequence[int],
                         gpu) -> list[int]:
    """The cluster sizes a wgmma split of ``cfg`` is offered with, from its split ``counts``:
    :data:`OFFERED_CLUSTER_SPLITS` where a count reaches it, the GPU runs clusters (Hopper), the tile is
    the swapped one (a few vectors by a matrix), its partial parts into that many equal float4
    slices and fits the ring, and its output can leave by TMA
    (:meth:`ContractionFamily._cluster_split_config`). H200, bf16, kernels with L2 flushed, the
    plan before and after (``cluster_split_ab_s36.jsonl``): 64 vectors by 4096 x 4096 14.0 -> 12.7
    us (and 8 vectors by 4096 x 14336 35.7 -> 31.1, a split the model does not take: it prices
    the unsplit tile's chain below what it measures, :func:`ring_share`); the larger tiles' partials cost
    more to exchange than the combining launch saves (a 2048 x 2048 x 512 product on 128 x 128 tiles
    in clusters of 2 18.7 us against 15.3 for 64 x 128 tiles unsplit), so they keep the workspace
    (a schedule may still ask for a cluster on any cooperative tile). The template's row
    reductions, dual sums and prologues are never split over a cluster."""
    g = _profile(gpu)
    if (g is None or not has_clusters(g.arch) or not cfg.wgmma or not cfg.swap or cfg.pingpong
            or p.rowred is not None or p.dual or p.norm is not None):
        return []
    out = []
    for n in counts:
        n = min(n, OFFERED_CLUSTER_SPLITS)
        if n < 2 or n in out or (cfg.BM * cfg.BN // 4) % n or 4 * cfg.BM * cfg.BN > cfg.wgmma_ring_bytes(2):
            continue
        if p.y_t and not wgmma_tma_store(diagram, p, replace(cfg, splits=n, cluster_splits=True), []):
            continue
        out.append(n)
    return out


def cluster_split_rounds(cfg: MatmulConfig) -> int:
    """Dependent rounds a block of a cluster-split wgmma kernel (:attr:`MatmulConfig.cluster_splits`)
    waits for after its loop, as the template runs them: the cluster barrier after every block
    has written its partial, then its slice's loads from every block (``8 / splits`` float4s of a
    thread's share of the slice a round, all blocks' values in flight together) and their stores
    into block 0, then the barrier before block 0 reads the sum. Each is priced as an L2 round
    (``GPU.l2_round_clk``).

    >>> cluster_split_rounds(MatmulConfig(False, 64, 8, 64, 64, 8, 16, wgmma=True, splits=2, cluster_splits=True))
    3
    >>> cluster_split_rounds(MatmulConfig(False, 64, 128, 64, 64, 128, 6, wgmma=True, splits=2, cluster_splits=True))
    4
    """
    threads = 128 * cfg.consumers
    slice4 = cfg.BM * cfg.BN // 4 // cfg.splits
    iters = -(-slice4 // threads)
    group = max(1, min(8 // cfg.splits, iters))
    return 2 + -(-iters // group)


def _pingpong_idles(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, gpu) -> bool:
    """Whether a ping-pong configuration would leave a consumer warpgroup without a tile: its
    work items (tiles, times the batch and the splits) fit one a block on the persistent grid, so
    each block's second consumer has nothing to compute, and the cooperative twin at the same tile
    shares every tile between both. The model prices the two alike; measured (kernels, bf16),
    ping-pong against cooperative at 128 x 128: H100, 4096 x 128 x 128 divided by a row vector,
    9.9 / 6.5 us, the plain product 4.3 / 3.7; H200, 2048 x 4096 x 1024 + a residual, 32.0 / 27.9,
    512 x 1024 x 512 8.3 / 7.8."""
    tiles = _output_tiles(diagram, p, cfg.BM, cfg.BN) if cfg.pingpong else None
    return tiles is not None and tiles * max(1, cfg.splits) <= _sm_count(gpu)


#: The fewest chunks of the sum a tile's loop must walk for the wide ping-pong tile to be offered:
#: with fewer, one consumer's loop is too short to cover the other's stores and the ping-pong
#: gains nothing, while its narrower tiles add rounds. H200, bf16, kernels, 128 x 192 ping-pong
#: against the cooperative 128 x 256: 12800 x K x 3072 at K = 64 26.1 / 24.5 us, K = 256 39.7 /
#: 44.0; 16384 x 32 x 16384 156.3 / 150.8 (``benchmarks/results/nvidia-h200/wgmma_pingpong_wide.jsonl``).
WIDE_PINGPONG_MIN_CHUNKS = 4


def _wide_pingpong(cfg: MatmulConfig) -> bool:
    """Whether ``cfg`` is a ping-pong tile of more than 128 accumulators a consumer thread (128 x
    192: 192 of its 232 registers). A plain product only, whose output leaves by TMA: an
    epilogue's maps, a staged operand or the 16-byte stores beside those accumulators spill (nvcc,
    sm_90a: 8 to 192 bytes for a bias, a GELU, a residual; 24 for the stores of rows of 5921
    elements), and a split sum's partials are left to the smaller tiles. Offered where the sum
    has at least :data:`WIDE_PINGPONG_MIN_CHUNKS` chunks.

    >>> _wide_pingpong(MatmulConfig(False, 128, 192, 64, 128, 192, 4, wgmma=True, pingpong=True))
    True
    >>> _wide_pingpong(MatmulConfig(False, 128, 128, 64, 128, 128, 6, wgmma=True, pingpong=True))
    False
    """
    return cfg.pingpong and not cfg.dual and cfg.WM * cfg.BN // 128 > 128


def _plain_product(p: MatmulProblem) -> bool:
    """Whether ``p``'s output is its contraction itself: no maps, no prologue, no row reduction."""
    return p.out is p.contraction and p.norm is None and p.rowred is None and not p.dual


def _rowsplit_bn(n: int, splits: int) -> int:
    """The block tile's columns of a row reduction over ``n`` columns in ``splits`` column tiles:
    the fewest 64-column blocks covering a share (one tile spanning the row when ``splits`` is 1).

    >>> _rowsplit_bn(200, 1), _rowsplit_bn(11008, 43), _rowsplit_bn(1000, 6)
    (256, 256, 192)
    """
    return max(64, -(-(-(-n // splits)) // 64) * 64)


def _row_stats(p: MatmulProblem) -> int:
    """fp32 values a split row reduction keeps per row and column tile: the (max, sum of
    exponentials) pair of a softmax or logsumexp, else the reduction's partial."""
    return 2 if p.rowred_kind in ("softmax", "logsumexp") else 1


def epilogue_bytes(diagram: Diagram, p: MatmulProblem) -> int:
    """HBM bytes of the epilogue as the cost model counts them: the output (the tile; for a row
    reduction a softmax's logits, else a value a row) and the inputs its maps read (all but A and B).

    The mma.sync and SIMT templates run it as a phase after the loop, one output tile a block.

    A persistent wgmma kernel with no more tiles than SMs, whose epilogue has maps, is priced the
    same way (each block's one tile has no next tile loading or multiplying behind its maps).

    The wgmma template runs a row reduction one tile a block, not persistently: the block's
    consumer warpgroups finish the loop, then compute the maps on their 128 accumulators a thread
    one after another, reduce and store, while the tensor cores and the copies wait (no next tile
    is loading, and a 128 x 256 tile's ring leaves no room for a second block on the SM).
    ``launch_estimate`` states these bytes as ``epilogue_hbm_bytes``, so the model prices the maps
    (the kernel's CUDA-core and SFU work) and these stores as a phase after the loop
    (:func:`napkin.perfmodel.predict.predict_kernel`), as it does for the mma.sync template. The
    split's fp32 partials are not among them: ``extra_hbm_bytes`` prices those. Measured on an
    H100 (bf16, ``benchmarks/gemm_rowred.py``, 8192 x 32000 x 1024): the split logsumexp ran 72 us
    longer than the split sum, where 8192 x 32000 exponentials take 68 us at the SFU rate.

    >>> from napkin.diagrams import Axis, Diagram, array, contract, logsumexp
    >>> a, b, c = Axis("a"), Axis("b"), Axis("c")
    >>> L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    >>> d = Diagram("lse", logsumexp(L, c, name="Y")).with_dtype("bf16").bind(a=8192, b=1024, c=32000)
    >>> epilogue_bytes(d, analyze(d))  # Y[a] in bf16
    16384
    """
    sz = diagram.sizes
    elem = _elem(p.dtype)
    extras = sum(math.prod(sz[n] for n in v.axis_names) for v in diagram.inputs if v is not p.A and v is not p.B)
    return (math.prod(sz[n] for n in p.out.axis_names) + extras) * elem


def _narrowed(cfg: MatmulConfig, n) -> MatmulConfig:
    """A wgmma configuration whose columns overhang a narrow output (``n`` < ``BN``) narrowed to
    the fewest 64-column blocks that cover it (one wgmma spans the block's columns, any multiple
    of 64): a 64-wide head dimension gets 64-column tiles, not 128 half-idle ones."""
    if not cfg.wgmma or not isinstance(n, int) or n >= cfg.BN:
        return cfg
    bn = max(64, -(-n // 64) * 64)
    return replace(cfg, BN=bn, WN=bn) if bn < cfg.BN else cfg


def _tile_rows_axis(p: MatmulProblem, v: Value) -> str:
    """The axis that indexes the rows of operand ``v``'s tiles: its M or N axis when it is stored
    K-major, else the contracted one."""
    if v is p.A:
        return p.a if p.a_kmajor else p.b
    return p.c if p.b_kmajor else p.b


#: The most dimensions a TMA tensor map has.
TMA_MAX_RANK = 5


def _flat_rows_reason_of(diagram: Diagram, p: MatmulProblem, v: Value) -> str | None:
    """Why operand ``v``'s tiles cannot be copied through a two-dimensional tensor map, or None.

    The operand is seen as ``[rows][last axis]`` (every axis but the last flattened into rows); a
    batch or outer-sum index moves a tile down by its stride in rows. That needs the tile's row
    axis to be the operand's second-to-last axis (one row apart). A tile past the end of the M or N
    rows reads the next batch element's rows, whose results are never stored; but the rows of a
    sum are summed, so an operand that is stored K by rows (MN-major) and has batch or outer-sum
    axes needs K to be a multiple of the 64-deep chunk (its rows past K are not zeros)."""
    sz = diagram.sizes
    rows = math.prod(sz[n] for n in v.axis_names[:-1]) if all(isinstance(sz.get(n), int)
                                                              for n in v.axis_names) else 0
    if rows + 256 > 2 ** 31 - 1:
        return (f"operand {v.label()} has {rows} rows: TMA coordinates are 32-bit (the mma.sync template "
                "offsets in 64 bits)")
    extra = [n for n in v.axis_names[:-1] if n != _tile_rows_axis(p, v)]
    if not extra:
        return None
    if len(v.axis_names) < 2 or v.axis_names[-2] != _tile_rows_axis(p, v):
        return (f"operand {v.label()}: its tiles' rows ({_tile_rows_axis(p, v)!r}) are not its second-to-last "
                "axis, so a tile is not a box of its flattened rows")
    kmajor = p.a_kmajor if v is p.A else p.b_kmajor
    k = sz.get(p.b)
    if not kmajor and isinstance(k, int) and k % 64:
        return (f"operand {v.label()} is stored with {p.b!r} in rows and has batch or outer-sum axes "
                f"{extra}: the sum's length {k} must be a multiple of 64 (a chunk past it would read "
                "the next rows, not zeros)")
    return None


def operand_view(diagram: Diagram, p: MatmulProblem, v: Value) -> tuple[int, ...] | str:
    """How the wgmma template's tensor map sees operand ``v``: ``()`` for the two-dimensional
    ``[rows][last axis]`` view (:func:`_flat_rows_reason_of`), else its axes as dimensions of their
    own, innermost first (positions in ``v.axis_names``: the last axis, the tiles' rows, then every
    other axis from the inside out; a batch or outer-sum index is a coordinate, and a chunk past an
    axis's end reads zeros), or why neither serves (a string).

    >>> from napkin.diagrams import Diagram, array, axes, contract
    >>> s, h, d, e = axes("s h d e")
    >>> dg = Diagram("merge", contract(array("O", h, s, d), array("W", e, h, d), over=(h, d), out=(s, e),
    ...                                name="Y")).bind(s=256, h=4, d=64, e=128)
    >>> p = analyze(dg)
    >>> operand_view(dg, p, p.A), operand_view(dg, p, p.B)  # O's rows (h, s) flatten; W's do not
    ((), (2, 0, 1))
    """
    flat = _flat_rows_reason_of(diagram, p, v)
    if flat is None:
        return ()
    names, sz = v.axis_names, diagram.sizes
    if not all(isinstance(sz.get(n), int) and sz[n] + 256 <= 2 ** 31 - 1 for n in names):
        return f"operand {v.label()}: an axis past 2^31 - 256 (TMA coordinates are 32-bit)"
    rows = names.index(_tile_rows_axis(p, v))
    view = (len(names) - 1, rows, *(i for i in reversed(range(len(names) - 1)) if i != rows))
    if len(view) > TMA_MAX_RANK:
        return (f"{flat}; as a tensor map of its own axes it needs {len(view)} dimensions (TMA takes at most "
                f"{TMA_MAX_RANK})")
    return view


def _operand_views_reason(diagram: Diagram, p: MatmulProblem) -> str | None:
    """Why the wgmma template cannot copy this problem's tiles with TMA (:func:`operand_view`)."""
    for v in (p.A, p.B, *([p.B2] if p.dual else [])):
        view = operand_view(diagram, p, v)
        if isinstance(view, str):
            return view
    return None


#: Threads per block of the copy that pads an operand's rows.
PAD_THREADS = 256


def padded_rows(diagram: Diagram, p: MatmulProblem) -> dict[str, int]:
    """The operands whose rows (last axis) are not a multiple of 16 bytes, by name, with their row
    length rounded up: lowering copies each into a buffer with zeros after the row's end (one more
    read and write of the operand) so that the contraction copies 16-byte pieces and TMA boxes,
    which an unaligned row cannot give (element by element, it ran 9x slower than cuBLAS)."""
    out = {}
    vec = 16 // _elem(p.dtype)
    for v in (p.A, p.B, *([p.B2] if p.dual else [])):
        last = diagram.sizes.get(v.axis_names[-1])
        if isinstance(last, int) and last % vec:
            out[v.name] = -(-last // vec) * vec
    return out


def _padded_strides(v: Value, sizes, row: int | None) -> dict[str, int]:
    """Element strides of ``v`` stored contiguously, with rows of ``row`` elements if given."""
    if row is None:
        return contiguous_strides(v)
    out, step = {}, 1
    for i, n in enumerate(reversed(v.axis_names)):
        out[n] = step
        step *= row if i == 0 else sizes[n]
    return out


def _operand_layout(v: Value, sizes, padded: dict) -> tuple[tuple[str, int] | None, dict[str, int]]:
    """(the padded copy ``(buffer, row)`` the kernel reads instead of operand ``v``, or None; the
    element strides it reads with)."""
    pad = padded.get(v.name)
    return pad, _padded_strides(v, sizes, pad[1] if pad else None)


def _buffer_name(d: Diagram, want: str, taken: set[str] = frozenset()) -> str:
    """``want`` as a buffer name if it is a valid name no array of the diagram (and nothing in
    ``taken``) has, else ``mm_buffer_<n>``."""
    taken = set(taken) | {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    if is_name(want) and want not in taken:
        return want
    n = 0
    while f"mm_buffer_{n}" in taken:
        n += 1
    return f"mm_buffer_{n}"


def _chunk_count(sizes, p: MatmulProblem, chunk: int) -> int | None:
    """How many chunks the kernel's loop over the sum walks (outer indices x chunks of b)."""
    if not all(isinstance(sizes.get(n), int) for n in (*p.k_outer, p.b)):
        return None
    return math.prod(sizes[n] for n in p.k_outer) * math.ceil(sizes[p.b] / chunk)


def analyze(diagram: Diagram) -> MatmulProblem:
    """The matmul structure of ``diagram``; a CodegenError says why it has none."""
    p = _reason_or_problem(diagram)
    if isinstance(p, str):
        raise CodegenError(f"contraction family: diagram {diagram.name!r}: {p}")
    return p


def _gpu_key(gpu) -> str | None:
    if gpu is None:
        return None
    return getattr(gpu, "key", None) or str(gpu)


def _profile(gpu):
    """The GPU profile ``gpu`` names (a profile, a key or a file), or None: no GPU, or one the
    profiles do not know (each caller then falls back on its own default)."""
    if gpu is None:
        return None
    from ...perfmodel.hardware import get_gpu

    try:
        return get_gpu(gpu)
    except Exception:  # noqa: BLE001 - an unknown GPU: the caller's default
        return None


def _smem_limit(gpu=None, arch: str | None = None) -> int:
    g = _profile(gpu)
    if g is not None and g.smem_per_block:
        return g.smem_per_block
    if arch and arch.startswith("sm_8") and arch not in ("sm_80", "sm_87"):
        return 99 * 1024
    if arch and arch.startswith("sm_8"):
        return 163 * 1024
    return 227 * 1024


def _elem(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def _wgmma_step_s(gpu) -> float:
    """Seconds of one dependent wgmma k16 step on ``gpu`` (0 where the profile states none)."""
    g = _profile(gpu)
    return g.wgmma_step_clk / g.clock_hz if g is not None else 0.0


def _sm_count(gpu) -> int:
    """The GPU's SM count (an H100's, 132, where the GPU is unknown)."""
    g = _profile(gpu)
    return int(g.sms) if g is not None else 132


def epilogue_tiles(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, elem: int) -> list[Value]:
    """The epilogue's inputs that the mma.sync template copies into shared memory tile by tile
    after its loop: those indexed like the output's rows and columns (``E[.., a, c]``, ``c``
    contiguous, the output's dtype), ``BM x (BN + 8)`` elements each behind the staging tile in the
    pipeline's memory, as many as it holds (none on the SIMT template or a split sum, whose
    epilogue runs in the combining launch). The others (a bias, a row statistic) are read per
    element."""
    if cfg.simt or cfg.splits > 1:
        return []
    room = cfg.smem_bytes(p, elem) // (cfg.BM * (cfg.BN + SMEM_PAD) * elem) - 1
    return _tiled_like_output(diagram, p)[:max(0, room)]


def _epilogue_operands(diagram: Diagram, p: MatmulProblem) -> list[Value]:
    """The inputs the epilogue reads: every input the output depends on besides the sum's operands."""
    return [v for v in diagram.inputs if v is not p.A and v is not p.B and v is not p.B2 and p.out.depends_on(v)]


def _output_like_operands(diagram: Diagram, p: MatmulProblem) -> list[Value]:
    """The epilogue's inputs with both the output's row and column axes (a residual, a transposed
    one, another dtype's): read per element unless staged, a tile's worth of loads a thread that
    the compiler hoists, all at once, into registers where nothing keeps them apart."""
    return [v for v in _epilogue_operands(diagram, p) if p.a in v.axis_names and p.c in v.axis_names]


def _clamped_epilogue(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, staged: Sequence[Value]) -> bool:
    """Whether the wgmma epilogue runs its maps at indices clamped into the output, without a
    branch around its reads: not while an operand with the output's rows and columns is read per
    element, and not where a consumer holds two 64-row pieces (WM = 128) and reads both a row and
    a column operand: the column values, loaded once for both pieces, stay live across them and
    spill (nvcc, sm_90a: 8 to 32 bytes for a GELU of S / r[a] + bias[c])."""
    names = {v.name for v in staged}
    if any(v.name not in names for v in _output_like_operands(diagram, p)):
        return False
    if cfg.WM <= 64:
        return True
    ops = [v for v in _epilogue_operands(diagram, p) if v.name not in names]
    return not (any(p.a in v.axis_names for v in ops) and any(p.c in v.axis_names for v in ops))


def _staged_tiles(staged: Sequence[Value], p: MatmulProblem, index_vars: dict, T: str, params: list) -> list[dict]:
    """The kernel parameters of operands copied into shared memory tile by tile (``E<k>``, its row
    stride ``ldE<k>`` and a stride ``bE<k>_<axis>`` per batch axis it has), appended to
    ``params``, and what the templates' copy loops need of each (pointer, row stride, batch
    offsets)."""
    tiles = []
    for k, v in enumerate(staged):
        sv = contiguous_strides(v)
        params += [tensor_param(v, f"E{k}", T), stride_param(f"ldE{k}", sv[p.a], f"row stride of {v.label()}")]
        batch = []
        for ax in (ax for ax in p.batch if ax in sv):
            params.append(stride_param(f"bE{k}_{ax}", sv[ax], f"stride of {v.label()} along {ax}"))
            batch.append(dict(idx=index_vars[ax], stride=ident(f"bE{k}_{ax}")))
        tiles.append(dict(ptr=ident(f"E{k}"), ld=ident(f"ldE{k}"), batch=batch, name=ident(v.name)))
    return tiles


def _tiled_like_output(diagram: Diagram, p: MatmulProblem) -> list[Value]:
    """The epilogue's inputs indexed like the output's rows and columns (see :func:`epilogue_tiles`)."""
    return [v for v in _epilogue_operands(diagram, p)
            if v.axis_names and v.axis_names[-1] == p.c and p.a in v.axis_names and v.dtype == p.dtype]


class ContractionFamily:
    """Matmul with a fused elementwise epilogue: mma.sync for bf16/fp16, SIMT FMA for fp32."""

    name = "contraction"
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"engine", "stages", "warps", "warpgroups", "blocks_per_sm",
                              "regs_per_thread", "splits", "swap_ab", "cluster"})

    # ------------------------------------------------------------------ recognise
    def why_not(self, diagram: Diagram) -> str | None:
        """Why this family cannot run ``diagram``, or None if it can."""
        p = _reason_or_problem(diagram)
        if isinstance(p, str):
            return p
        if p.dtype not in ("bf16", "fp16", "fp32"):
            return f"dtype {p.dtype} is not supported (bf16, fp16, fp32)"
        # every configuration's tile past the last element must index in 32 bits (the largest tile)
        big = max(max(c[0], c[1], c[2]) for c in (*MMA_CONFIGS, *WGMMA_CONFIGS, *SIMT_CONFIGS, *TF32X3_CONFIGS))
        sz = diagram.sizes
        return index_size_problem(sz, [(sz.get(p.a), f"axis {p.a!r} of {p.A.label()}", big),
                                       (sz.get(p.c), f"axis {p.c!r} of {p.B.label()}", big),
                                       (sz.get(p.b), f"axis {p.b!r} of {p.A.label()}", big),
                                       (_chunk_count(sz, p, min(c[2] for c in (*MMA_CONFIGS, *WGMMA_CONFIGS, *SIMT_CONFIGS))),
                                        f"the chunks of the sum over "
                                        f"{[*p.k_outer, p.b]}", 1)], "contraction")

    def matches(self, diagram: Diagram) -> bool:
        return self.why_not(diagram) is None

    explain = why_not  # the family protocol's name: None if it takes the diagram, else why not

    # ------------------------------------------------------------------ propose
    def configs(self, dtype: str, engine: str | None = None) -> list[MatmulConfig]:
        """The tile configurations of one engine (default: the dtype's mma.sync or SIMT template)."""
        if engine == "wgmma":
            return _pingpong_first([MatmulConfig(False, *c, wgmma=True) for c in WGMMA_CONFIGS],
                                   [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS])
        if dtype == "fp32" and engine == "mma.sync":  # fp32 on mma.sync: the 3xTF32 configurations
            return [MatmulConfig(True, *c, tf32x3=True)
                    for c in (*TF32X3_CONFIGS, *TF32X3_NARROW_CONFIGS, *TF32X3_SMALL_CONFIGS)]
        table = SIMT_CONFIGS if dtype == "fp32" else (*MMA_CONFIGS, *MMA_SMALL_CONFIGS)
        return [MatmulConfig(dtype == "fp32", *c) for c in table]

    def wgmma_reason(self, diagram: Diagram, gpu=None, arch: str | None = None,
                     dtype: str | None = None) -> str | None:
        """Why the Hopper (wgmma + TMA) template cannot run ``diagram``, or None if it can.

        >>> from napkin.diagrams import library
        >>> d = library.get("matmul").bind(a=1000, b=512, c=384)
        >>> FAMILY.wgmma_reason(d, "h100"), FAMILY.wgmma_reason(d, "a100-80gb")
        (None, 'a100-80gb (sm_80) has no wgmma (it needs sm_90a)')
        """
        p = _reason_or_problem(diagram)
        if isinstance(p, str):
            return p
        why = wgmma_target_reason(dtype or p.dtype, gpu, arch) or _operand_views_reason(diagram, p)
        if why:
            return why
        return None

    def prologue_reason(self, diagram: Diagram, p: MatmulProblem, gpu=None, arch: str | None = None,
                        dtype: str | None = None) -> str | None:
        """Why an RMSNorm -> linear prologue cannot run fused, or None if it can: it rewrites the
        swizzled A slots between TMA and wgmma (the wgmma template only), whole 16-byte pieces of
        rows (no padded copy of the operand)."""
        why = self.wgmma_reason(diagram, gpu, arch=arch, dtype=dtype)
        if why:
            return f"an rmsnorm prologue runs on the wgmma template only: {why}"
        pads = padded_rows(diagram, p)
        if pads:
            return (f"an rmsnorm prologue reads whole 16-byte pieces of rows; {sorted(pads)} have rows that "
                    "are not 16-byte multiples")
        return None

    def rowred_reason(self, diagram: Diagram, p: MatmulProblem, gpu=None, arch: str | None = None,
                      dtype: str | None = None) -> str | None:
        """Why a row reduction after the contraction cannot run in its epilogue, or None if it can:
        the wgmma template's accumulator layout keeps a row in one quad of lanes (a row wider than
        a tile is split: partials per column tile and a second launch). The mma.sync template
        (Ampere) keeps the GEMM and the row-wise kernel apart: its warp tiles spread a row over
        warps, and no epilogue reduction is built for it."""
        why = self.wgmma_reason(diagram, gpu, arch=arch, dtype=dtype)
        if why:
            return (f"a row reduction after the contraction runs on the wgmma template only (elsewhere the "
                    f"GEMM and a row-wise kernel run apart): {why}")
        return None

    def builds_for(self, schedule: Schedule, arch: str) -> bool:
        """Whether ``schedule`` can be built for ``arch`` (its wgmma configurations need sm_90a:
        a schedule ranked for an H100 but compiled for sm_80 takes the best mma.sync one)."""
        return self.build_reason(schedule, arch) is None

    def build_reason(self, schedule: Schedule, arch: str) -> str | None:
        """Why ``schedule`` cannot be built for ``arch``, or None: a wgmma configuration where wgmma
        does not run, or more batch elements than an mma.sync or SIMT launch takes
        (:data:`MAX_BATCH`)."""
        engine = schedule.kernels[0].options.engine if len(schedule.kernels) == 1 else None
        if engine == "wgmma":  # (its work items number the batch: no grid dimension limits it)
            return self.wgmma_reason(schedule.diagram, arch=arch)
        n = _batch_count(schedule.diagram)
        if n > MAX_BATCH:
            return f"{n} batch elements; a launch of the {engine} template takes at most {MAX_BATCH}"
        return None

    def candidates(self, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
        """One fused schedule per tile configuration that fits the GPU's shared memory (the wgmma
        template's first where the GPU and the problem allow it)."""
        p = analyze(diagram)
        dtype = dtype or p.dtype
        limit = _smem_limit(gpu)
        out = []
        if p.rowred is not None:
            why = self.rowred_reason(diagram, p, gpu, dtype=dtype)
            if why:
                raise CodegenError(f"contraction family: {why}")
            # the tile spans the row: the fewest 64-column blocks covering it, rows as each
            # configuration has them where the accumulators fit (WM x BN / 128 <= 128 a thread);
            # a wider row is split over the configuration's column tiles (``splits`` of them, each
            # block reducing its part of the rows, a second launch combining the partials)
            n = diagram.sizes.get(p.c)
            def row_tiles(c: MatmulConfig) -> MatmulConfig:
                splits = 1 if n <= 256 else -(-n // c.BN)
                bn = _rowsplit_bn(n, splits)
                return replace(c, BN=bn, WN=bn, splits=splits)

            cfgs = (row_tiles(c) for c in self.configs(dtype, "wgmma") if not c.pingpong)
            # (whole tiles staged in the ring: not persistent, so never ping-pong)
            for cfg in dict.fromkeys(cfgs):
                if p.rowred_kind == "softmax" and cfg.splits > MAX_ROW_TILES:
                    continue  # (the second launch keeps a shift per tile in shared memory)
                if cfg.WM * cfg.BN // 128 <= 128 and cfg.smem_bytes(p, _elem(dtype)) <= limit:
                    out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
            return out
        if p.norm is not None:
            why = self.prologue_reason(diagram, p, gpu, dtype=dtype)
            if why:
                raise CodegenError(f"contraction family: {why}")
            for cfg in dict.fromkeys(_narrowed(c, diagram.sizes.get(p.c)) for c in self.configs(dtype, "wgmma")
                                     if not c.pingpong):  # not persistent (the tile staged in the ring)
                if cfg.smem_bytes(p, _elem(dtype)) <= limit:
                    out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
            return out
        if p.dual:
            why = self.wgmma_reason(diagram, gpu, dtype=dtype)
            if why:
                raise CodegenError(f"contraction family: a dual contraction runs on the wgmma template only: {why}")
            dual = _pingpong_first([MatmulConfig(False, *c, wgmma=True, dual=True) for c in DUAL_CONFIGS],
                                   [MatmulConfig(False, *c, wgmma=True, dual=True, pingpong=True)
                                    for c in DUAL_PINGPONG_CONFIGS])
            for c in dict.fromkeys(_narrowed(c, diagram.sizes.get(p.c)) for c in dual):
                cfg = c
                if cfg.smem_bytes(p, _elem(dtype)) <= limit and not _pingpong_idles(diagram, p, cfg, gpu):
                    out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
            return out
        small = _small_output(diagram, p)
        withheld = set() if small else {x[:5] for x in MMA_SMALL_CONFIGS}
        cfgs = [c for c in self.configs(dtype) if c.key() not in withheld]
        if dtype == "fp32":  # both fp32 engines: 3xTF32 on the tensor cores and FMA on the CUDA cores
            n = diagram.sizes.get(p.c)
            narrow = isinstance(n, int) and n < min(c[1] for c in TF32X3_CONFIGS)
            offered = {x[:5] for x in (*TF32X3_CONFIGS, *(TF32X3_NARROW_CONFIGS if narrow else ()),
                                       *(TF32X3_SMALL_CONFIGS if small else ()))}
            cfgs = [c for c in self.configs(dtype, "mma.sync") if c.key() in offered] + cfgs
        wgmma = self.wgmma_reason(diagram, gpu, dtype=dtype) is None
        thin = _thin(diagram, p)
        if wgmma:
            cfgs = [_narrowed(c, diagram.sizes.get(p.c)) for c in self.configs(dtype, "wgmma")
                    if not (thin and c.BM > 64)] + cfgs
            cfgs = list(dict.fromkeys(cfgs))
        for cfg in cfgs:
            if cfg.smem_bytes(p, _elem(dtype)) > limit:
                continue
            if _wide_pingpong(cfg):  # a plain product, unsplit, over a sum of a few chunks at least
                chunks = _chunk_count(diagram.sizes, p, cfg.BK)
                if (_plain_product(p) and wgmma_tma_store(diagram, p, cfg, [])
                        and not _pingpong_idles(diagram, p, cfg, gpu)
                        and (chunks is None or chunks >= WIDE_PINGPONG_MIN_CHUNKS)):
                    out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
                continue
            if not _pingpong_idles(diagram, p, cfg, gpu):
                out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
            out += [self.schedule(diagram, c, gpu=gpu, dtype=dtype) for c in self.split_configs(diagram, p, cfg, gpu)
                    if not _pingpong_idles(diagram, p, c, gpu)]
        if wgmma:
            # the small tiles only split, after the others (the planner keeps the first of equals),
            # and unsplit where 128 x 128 tiles leave over half the SMs idle or the rows are thin
            # (then only the 64-row ones)
            few = _few_tiles(diagram, p, gpu) or thin
            for c in WGMMA_SPLIT_CONFIGS:
                cfg = MatmulConfig(False, *c, wgmma=True)
                if thin and cfg.BM > 64:
                    continue
                if cfg.smem_bytes(p, _elem(dtype)) <= limit:
                    if few:
                        out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
                    out += [self.schedule(diagram, c, gpu=gpu, dtype=dtype)
                            for c in self.split_configs(diagram, p, cfg, gpu)]
        if wgmma and swap_reason(diagram, p) is None:
            # a few vectors by a matrix: the matrix on the tile's 64 or 128 rows, the vectors its
            # columns
            for bm in (64, 128):
                cfg = _swap_config(diagram, p, dtype, bm)
                if cfg.smem_bytes(swap_problem(p), _elem(dtype)) <= limit:
                    out.append(self.schedule(diagram, cfg, gpu=gpu, dtype=dtype))
                    out += [self.schedule(diagram, c, gpu=gpu, dtype=dtype)
                            for c in self.split_configs(diagram, swap_problem(p), cfg, gpu)]
        return out

    def split_configs(self, diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, gpu) -> list[MatmulConfig]:
        """``cfg`` split over the block counts of :meth:`split_counts` with its partials in HBM
        and a combining launch, after a split over a cluster of :data:`OFFERED_CLUSTER_SPLITS`
        blocks a tile where the GPU has clusters (:func:`cluster_split_counts`)."""
        counts = self.split_counts(diagram, p, cfg, gpu)
        out = []
        for n in cluster_split_counts(diagram, p, cfg, counts, gpu):
            out.append(replace(cfg, splits=n, cluster_splits=True))
        return out + [replace(cfg, splits=n) for n in counts]

    @staticmethod
    def split_counts(diagram: Diagram, p: MatmulProblem, cfg: MatmulConfig, gpu) -> list[int]:
        """How many blocks may share one output tile's sum: where the tiles (times the batch) leave
        most SMs idle and the sum is long, splits that bring the blocks to one or two waves, each
        split keeping at least ``MIN_SPLIT_CHUNKS`` chunks (every template splits a plain sum; the
        wgmma template's dual, prologue and row-reduction kernels do not)."""
        if cfg.wgmma and (p.dual or p.norm is not None or p.rowred is not None):
            return []
        sz = diagram.sizes
        if not all(isinstance(sz.get(n), int) for n in (p.a, p.c, p.b, *p.batch, *p.k_outer)):
            return []
        tiles = _output_tiles(diagram, p, cfg.BM, cfg.BN)
        chunks = _chunk_count(sz, p, cfg.BK)
        sms = _sm_count(gpu)
        if tiles * 2 > sms or chunks < 2 * MIN_SPLIT_CHUNKS:
            return []
        if cfg.wgmma and cfg.BM * cfg.BN > 128 * 128 and not _few_tiles(diagram, p, gpu):
            # a large tile is not split where 128 x 128 tiles fill half the SMs unsplit: the sum is
            # not too long for the output, the tile is too large. The model priced them alike; H200
            # (kernels, bf16, 2048 x 4096 x 1024 + a residual): 128 x 256 in 2 splits 52.0 us,
            # 128 x 128 unsplit 27.9 (H100: 53.6, 28.4)
            return []
        out = []
        for waves in (1, 2):
            n = min(MAX_SPLITS, chunks // MIN_SPLIT_CHUNKS, max(2, waves * sms * cfg.blocks_per_sm // tiles))
            if n >= 2 and n not in out:
                out.append(n)
        return out

    def schedule(self, diagram: Diagram, cfg: MatmulConfig, gpu="h100", dtype: str | None = None) -> Schedule:
        """The fused schedule of one configuration: groups of a, c at SMEM and RF, stream of b
        (a swapped configuration groups the swapped problem's: :func:`swap_problem`)."""
        p = swap_problem(analyze(diagram)) if cfg.swap else analyze(diagram)
        # one batch element per block: a group of 1 on each batch axis
        # the outer contracted axes are walked one index at a time: streams of 1
        # a row reduction's tile spans the row: c stays whole in every block (its width, the
        # fewest 64-column blocks covering it, follows from the size)
        cols = {} if p.rowred is not None else {p.c: cfg.BN}
        rf_cols = {} if p.rowred is not None else {p.c: cfg.WN}
        s = Schedule.fused(diagram, groups={**{a: 1 for a in p.batch}, p.a: cfg.BM, **cols},
                           streams={**{k: 1 for k in p.k_outer}, p.b: cfg.BK},
                           rf_groups={p.a: cfg.WM, **rf_cols}, gpu=_gpu_key(gpu),
                           dtype=dtype or p.dtype)
        return s.replace(kernels=(s.kernels[0].replace(family=self.name, options=cfg.options()),))

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu=None) -> dict:
        """What the roofline cannot see: blocks, threads, register budget, shared memory and the
        bytes each thread keeps in flight (STAGES - 1 chunks ahead)."""
        p = problem_of(diagram, schedule)
        cfg = self.config_of(p, schedule)
        sz = diagram.sizes
        nbatch = math.prod(sz[a] for a in p.batch) if p.batch else 1
        # (a row reduction's splits are its column tiles, counted once)
        ksplits = 1 if p.rowred is not None else cfg.splits
        blocks = math.ceil(sz[p.a] / cfg.BM) * math.ceil(sz[p.c] / cfg.BN) * nbatch * ksplits
        elem = _elem(p.dtype)
        chunk = (cfg.BM + cfg.BN * (2 if cfg.dual else 1)) * cfg.BK * elem
        est = dict(blocks=blocks, threads=cfg.threads, regs=cfg.model_regs(),
                   smem=cfg.smem_bytes(p, elem),
                   in_flight_bytes_per_thread=chunk * max(1, cfg.stages - 1) / cfg.threads)
        launches, moved = 0, 0
        if cfg.splits > 1 and p.rowred is not None:
            # a split row reduction: each block's rows leave as fp32 partials (a (max, sum of exp)
            # pair for softmax and logsumexp), written and read back by the second launch; a
            # softmax's logits are stored too (the output the model sees the kernel write), then
            # read and written again normalised there
            launches = 1
            moved = 2 * 4 * sz[p.a] * cfg.splits * _row_stats(p)
            if p.rowred_kind == "softmax":
                moved += 2 * sz[p.a] * sz[p.c] * elem
        elif cfg.cluster_splits:
            # the shares meet in the cluster's shared memory after the loop, in rounds each block's
            # threads wait for (no workspace, no second launch; :func:`cluster_split_rounds`)
            est.update(tail_l2_rounds=cluster_split_rounds(cfg))
        elif cfg.splits > 1:
            # each block walks its share of the chunks; the partials go to HBM and come back once.
            # A step's fixed cost adds to the block's time where the warps that load a chunk also
            # use it (mma.sync, SIMT; the wgmma kernels have none: below)
            if not cfg.wgmma:
                est.update(stream_steps=math.ceil(_chunk_count(sz, p, cfg.BK) / cfg.splits))
            launches, moved = 1, 2 * 4 * cfg.splits * sz[p.a] * sz[p.c] * nbatch
        for name, row in padded_rows(diagram, p).items():
            # the padding copy: the operand read, its padded copy written (and read again by the tiles)
            v = next(x for x in (p.A, p.B, p.B2) if x is not None and x.name == name)
            rows = math.prod(sz[n] for n in v.axis_names[:-1])
            launches += 1
            moved += rows * (sz[v.axis_names[-1]] + row) * elem
        if launches:
            est.update(extra_launches=launches, extra_hbm_bytes=moved)
        if not cfg.wgmma and cfg.splits == 1:
            # the mma.sync and SIMT templates run one output tile per block: the loop, then the
            # epilogue (its operands read, the tile stored), which the block's neighbours on the
            # SM, started with it, do not hide (the model prices it as a phase of its own)
            # (operand tiles copied after the loop are waited for before the maps)
            est.update(epilogue_hbm_bytes=epilogue_bytes(diagram, p),
                       epilogue_waits=1 if epilogue_tiles(diagram, p, cfg, elem) else 0)
        if not cfg.wgmma and not cfg.simt:
            # the cp.async ring's fill: every block issues its first STAGES - 1 chunks at once and
            # they land together (the chip's HBM serves all of them side by side), so its first
            # product waits for all of them, and its last ones multiply after the last load; the
            # blocks beside it started with it and wait alike. A loop of few steps therefore
            # loads, then multiplies: 512 products of 128^3 bf16 (two steps of 64, three stages)
            # took 18.3 us of kernel on an H200, the loads, products and stores of its two waves
            # end to end, where the overlapped roofline said 10.7. The fp32 template stages one
            # chunk through registers instead, and is not given the share: with it, its four-step
            # tile over a sum of 64 ranked ahead of its two-step tile, which ran faster (H200,
            # 4096 products of 32 x 32 x 64: 30.4 against 28.5 us of kernel)
            steps = _chunk_count(sz, p, cfg.BK)
            if steps:
                steps = math.ceil(steps / cfg.splits)
                est.update(fill_share=min(1.0, max(1, cfg.stages - 1) / steps))
        if cfg.tf32x3:
            # 3xTF32: the sum's 2 M N K FLOPs (the cost model's CUDA-core work for fp32) run as three
            # tf32 mma.sync products each; the fragments are loaded and split between the mma (a
            # tile whose sum comes out inf or NaN sums again as FMAs: data the model does not see)
            est.update(tensor_path="mma.sync", overlap_operands=False,
                       tf32x3_flops=2.0 * sz[p.a] * sz[p.c] * sz[p.b] * nbatch
                       * math.prod(sz[n] for n in p.k_outer))
        if cfg.wgmma:
            # the tensor cores read both operands from SMEM themselves while the next wgmma is
            # issued: the datasheet tensor path, operand traffic overlapped. An rmsnorm prologue
            # rewrites each A slot in shared memory (consumer threads, a proxy fence and a
            # warpgroup barrier) before its wgmma: that traffic does not hide behind the tensor
            # cores (measured on an H200 at 4096^3: 386 us fused, 214 us for the matmul alone,
            # 244 us for the row-wise norm and the matmul apart). ``blocks`` stays the tile count:
            # the persistent grid (a block an SM) walks those tiles in the same waves
            est.update(tensor_path="peak", overlap_operands=p.norm is None)
            # the producer warp runs STAGES chunks ahead of the consumers, split or not: no step
            # of the loop waits on its own load, only the ring's fill remains. Split (H100, 256 x
            # 131072 x 256 bf16): 64 x 64 tiles x 8 splits, 256 steps a block, 59.0 us, and 128 x
            # 64 x 16, 128 steps, 56.8, where step costs had priced 14.8 and 7.8 us of latency.
            # Unsplit (bf16, 1024 x 4096 x 1024): 64 x 128, 64 steps a block, ranked behind 128 x
            # 128 in 2 splits and a combine, its steps priced 3.5 us on top of the L2-bound body;
            # kernels 21.2 -> 15.6 us on an H200 (cuBLAS 13.0), 21.3 -> 15.2 H100
            est.update(stream_steps=0)
            # but each consumer adds a chunk's BK / 16 products into one accumulator tile, each
            # wgmma waiting on the one before: a chunk takes at least that chain, whatever the
            # tensor rate. It binds tiles of few rows or columns (a padded skinny product, 64-row
            # tiles over a long sum), where splitting the sum shortens each block's chain: H200,
            # bf16, 4096 x 4096 x 8 on 64 x 64 tiles 17.7 us of kernel unsplit, 9.7 on 64 x 128
            # tiles in 4 splits (``GPU.wgmma_step_clk``). Ping-pong consumers run two tiles' chains
            # side by side. An SM's share on average: the roofline's tail takes the busiest SM's
            # tiles, as for the tensor term
            # The step was measured on rings of CHAIN_STAGES slots, and it is a round trip of the
            # ring more than the wgmma's own: a dependent chain of m64nNk16 from shared memory
            # runs 19 clk a step at N = 8 and 32 at N = 64 (``wgmma_chain_micro_s28.jsonl``), while
            # a deeper ring's chunks cost less as more of them are in flight (:func:`ring_share`).
            # Shallower rings are not charged more (the large tiles' chunks come mostly from L2,
            # sooner).
            steps = _chunk_count(sz, p, cfg.BK)
            step_s = _wgmma_step_s(gpu) * ring_share(cfg.stages)
            if steps and step_s:
                chain = math.ceil(steps / cfg.splits) * (cfg.BK // 16) * step_s
                est.update(tensor_chain_s=chain * blocks / _sm_count(gpu) / (2 if cfg.pingpong else 1))
            if p.rowred is not None:
                est.update(epilogue_hbm_bytes=epilogue_bytes(diagram, p),
                           epilogue_rate=WGMMA_ROWRED_EPILOGUE_RATE)
            elif not cfg.partials_in_hbm and (not cfg.pingpong or blocks <= _sm_count(gpu)):
                # both consumers of a cooperative kernel leave the loop together and run the maps
                # and the stores before the next tile's first wgmma: a phase after each tile's
                # loop, as on the mma.sync template (and a ping-pong kernel of one tile a block,
                # whose blocks have no next tile behind their maps). H200, bf16, 12800 x K x 3072
                # on 128 x 256 tiles (ten rounds), kernels: 24.2 us at K = 64, then 6.3 us a chunk
                # of 64 — about 17.6 us a call beyond the loop, the 78.6 MB output at the HBM rate;
                # at K = 768 93.3 us where the overlapped roofline said 78.1
                # (``benchmarks/results/nvidia-h200/wgmma_pingpong_wide.jsonl``)
                est.update(epilogue_hbm_bytes=epilogue_bytes(diagram, p))
            elif cfg.splits == 1:
                # a ping-pong consumer's stores run beside the other's loop, its maps do not
                # (:attr:`~napkin.perfmodel.predict.LaunchShape.epilogue_maps`)
                est.update(epilogue_maps=True)
        return est

    # ------------------------------------------------------------------ lower
    def config_of(self, p: MatmulProblem, schedule: Schedule, arch: str | None = None) -> MatmulConfig:
        """The tile configuration a schedule asks for, checked against what the template supports."""
        if len(schedule.kernels) != 1:
            raise CodegenError("contraction family: the schedule must fuse every box into one kernel "
                               f"(it has {len(schedule.kernels)})")
        k = schedule.kernels[0]
        if bool(k.options.swap_ab) != p.y_t:  # the problem as the schedule runs it (problem_of)
            if p.y_t:
                raise CodegenError("contraction family: the problem given is swapped and the schedule does not "
                                   "swap the operands (swap_ab)")
            p = problem_of(schedule.diagram, schedule)
        simt = p.dtype == "fp32"
        default = self.configs(p.dtype)[0]
        sizes = {"BM": None, "BN": None, "BK": None, "WM": None, "WN": None}
        for r in k.relabels:
            if r.is_symbolic:
                raise CodegenError(f"contraction family: {r} has no size; bind {r.symbol} first")
            key = None
            if r.kind == "group" and r.level == "SMEM":
                key = {p.a: "BM", p.c: "BN"}.get(r.axis)
            elif r.kind == "group" and r.level == "RF":
                key = {p.a: "WM", p.c: "WN"}.get(r.axis)
            elif r.kind == "stream" and r.level == "SMEM" and r.axis == p.b:
                key = "BK"
            if key is None:
                if r.kind == "group" and r.axis in p.batch and r.size == 1:
                    continue  # one batch element per block: what the grid does anyway
                if r.kind == "stream" and r.axis in p.k_outer and r.size == 1:
                    continue  # an outer contracted axis, walked one index at a time anyway
                outer = f", walks {', '.join(p.k_outer)} one index at a time" if p.k_outer else ""
                raise CodegenError(f"contraction family: the template cannot realise {r} "
                                   f"(it groups {p.a}, {p.c} at SMEM and RF and streams {p.b} at SMEM{outer})")
            sizes[key] = int(r.size)
        BM = sizes["BM"] or default.BM
        BN = sizes["BN"] or default.BN
        BK = sizes["BK"] or default.BK
        WM = sizes["WM"] or min(default.WM, BM)
        WN = sizes["WN"] or min(default.WN, BN)
        opts = k.options
        stages, blocks = opts.stages, opts.blocks_per_sm
        splits = opts.splits or 1
        engine = opts.engine or ("simt" if simt else "mma.sync")
        if p.rowred is not None and engine != "wgmma":
            raise CodegenError(f"contraction family: a row reduction after the contraction runs on the wgmma "
                               f"template only (the schedule asks for {engine})")
        if p.norm is not None and engine != "wgmma":
            raise CodegenError(f"contraction family: an rmsnorm prologue runs on the wgmma template only "
                               f"(the schedule asks for {engine})")
        if p.dual and engine != "wgmma":
            raise CodegenError(f"contraction family: a dual contraction runs on the wgmma template only "
                               f"(the schedule asks for {engine})")
        if p.y_t and engine != "wgmma":
            raise CodegenError(f"contraction family: swapped operands (swap_ab) run on the wgmma template only "
                               f"(the schedule asks for {engine})")
        if engine == "wgmma":
            if splits > 1 and (p.dual or p.norm is not None):
                raise CodegenError("contraction family: the wgmma template splits only a plain sum or a row "
                                   f"reduction's row (not a dual contraction or a prologue; splits={splits})")
            cfg = replace(self._wgmma_config(p, schedule, arch, sizes, stages, opts.warpgroups, splits), splits=splits)
            if opts.cluster is not None:
                cfg = self._cluster_split_config(schedule.diagram, p, cfg, int(opts.cluster))
            return cfg
        if opts.cluster is not None:
            raise CodegenError(f"contraction family: a cluster (cluster={opts.cluster}) shares a split sum on the "
                               f"wgmma template only (the schedule asks for {engine})")
        if engine not in ("mma.sync", "simt"):
            raise CodegenError(f"contraction family: engine {engine!r} is not built here (wgmma, mma.sync "
                               "or simt)")
        if (engine == "simt") != simt and not (simt and engine == "mma.sync"):
            raise CodegenError(f"contraction family: engine {engine} does not run {p.dtype} (fp32 runs simt or "
                               "mma.sync as 3xTF32, bf16/fp16 mma.sync or wgmma)")
        tf32x3 = simt and engine == "mma.sync"  # fp32 on mma.sync: the 3xTF32 configurations
        if tf32x3:
            default = self.configs(p.dtype, engine)[0]
            BM, BN, BK = sizes["BM"] or default.BM, sizes["BN"] or default.BN, sizes["BK"] or default.BK
            WM, WN = sizes["WM"] or min(default.WM, BM), sizes["WN"] or min(default.WN, BN)
        known = [c for c in self.configs(p.dtype, engine if tf32x3 else None)
                 if c.key() == (BM, BN, BK, WM, WN)]
        if blocks is None:
            blocks = known[0].blocks_per_sm if known else 1
        if stages is None:
            if known:
                stages = known[0].stages
            elif simt:
                stages = 2
            else:
                limit = _smem_limit(None, arch)
                stages = 2
                for st in (4, 3):
                    if MatmulConfig(simt, BM, BN, BK, WM, WN, st).smem_bytes(p, 2) <= min(limit, 128 * 1024):
                        stages = st
                        break
        cfg = MatmulConfig(simt, BM, BN, BK, WM, WN, stages, blocks, splits=splits, tf32x3=tf32x3)
        self._check_config(cfg, p)
        return cfg

    def _wgmma_config(self, p: MatmulProblem, schedule: Schedule, arch: str | None, sizes: dict,
                      stages: int | None, warpgroups: int | None = None, splits: int = 1) -> MatmulConfig:
        why = self.wgmma_reason(schedule.diagram, arch=arch)
        if why:
            raise CodegenError(f"contraction family: the schedule asks for engine=wgmma, but {why}; "
                               "use engine mma.sync")
        why = self.prologue_reason(schedule.diagram, p, arch=arch) if p.norm is not None else None
        if p.rowred is not None:
            why = self.rowred_reason(schedule.diagram, p, arch=arch)
        if why:
            raise CodegenError(f"contraction family: {why}")
        d = MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True)
        BM, BN = sizes["BM"] or d.BM, sizes["BN"] or d.BN
        n = schedule.diagram.sizes.get(p.c)
        if p.rowred is not None and sizes["BN"] is None and isinstance(n, int):
            # the whole row, in 64-column blocks, or its share of a split row
            BN = _rowsplit_bn(n, splits)
            if BN > 256:
                raise CodegenError(f"contraction family (wgmma): the row reduction's {n} columns ({p.c!r}) in "
                                   f"{splits} tile(s) need {BN} columns a tile; at most 256 (splits >= "
                                   f"{-(-n // 256)})")
        BK, WM, WN = sizes["BK"] or 64, sizes["WM"] or min(d.WM, BM), sizes["WN"] or BN
        # two consumer warpgroups over a tile of one consumer's rows: the ping-pong kernel
        pingpong = warpgroups == 2 and WM == BM
        what = f"contraction family (wgmma): tiles g_{p.a}={BM}, g_{p.c}={BN}, s_{p.b}={BK}, " \
               f"w_{p.a}={WM}, w_{p.c}={WN}"
        if warpgroups is not None and not pingpong and WM and BM % WM == 0 and warpgroups != BM // WM:
            raise CodegenError(f"{what}: {warpgroups} consumer warpgroups; the tile takes {BM // WM} "
                               f"(g_{p.a} / w_{p.a}), or 2 with w_{p.a} = g_{p.a} (ping-pong)")
        if pingpong and not wgmma_persistent(p):
            raise CodegenError(f"{what}: ping-pong consumers (2 warpgroups, w_{p.a} = g_{p.a}) need the "
                               "persistent kernel; an rmsnorm prologue or a row reduction stages its tile "
                               "in the ring")
        table = [*WGMMA_CONFIGS, *WGMMA_PINGPONG_CONFIGS] if not p.dual else [*DUAL_CONFIGS, *DUAL_PINGPONG_CONFIGS]
        known = [c for c in table if (c[0], c[1], c[3]) == (BM, BN, WM)
                 and (c in (WGMMA_PINGPONG_CONFIGS + DUAL_PINGPONG_CONFIGS)) == pingpong]
        if stages is None and p.y_t:  # as many slots as fit (a schedule written by hand may not say)
            stages = _swap_stages(MatmulConfig(False, BM, BN, BK, WM, WN, 2, wgmma=True, swap=True), p)
        if stages is None:
            stages = known[0][5] if known else 4
        cfg = MatmulConfig(False, BM, BN, BK, WM, WN, stages, 1, wgmma=True, dual=p.dual, pingpong=pingpong,
                           swap=p.y_t)
        if BK != 64:
            raise CodegenError(f"{what}: s_{p.b} must be 64 (one 128-byte swizzled row)")
        if p.y_t:
            return self._check_swap_config(schedule.diagram, p, cfg, splits, arch, what)
        if WN != BN or BN % 64 or not 64 <= BN <= 256:
            raise CodegenError(f"{what}: w_{p.c} must equal g_{p.c}, a multiple of 64 up to 256 (one wgmma "
                               "spans the block's columns)")
        if WM not in (64, 128) or BM % WM or BM // WM not in (1, 2):
            raise CodegenError(f"{what}: w_{p.a} is 64 or 128 rows per consumer warpgroup, 1 or 2 of them")
        n_acc = WM * BN * (2 if p.dual else 1) // 128
        if n_acc > 128 and not (_wide_pingpong(cfg) and n_acc <= 192):
            raise CodegenError(f"{what}: {n_acc} fp32 accumulators per thread; at most 128 fit, or 192 "
                               "for a ping-pong consumer's plain product (a dual contraction's wgmma "
                               "spans 2 x g_c <= 256 columns)")
        if n_acc > 128 and (not _plain_product(p) or splits > 1):
            raise CodegenError(f"{what}: {n_acc} fp32 accumulators per thread leave no registers for an "
                               "epilogue, prologue, row reduction or split sum (they would spill); 128 at "
                               "most here")
        if n_acc > 128 and not wgmma_tma_store(schedule.diagram, p, cfg, []):
            raise CodegenError(f"{what}: {n_acc} fp32 accumulators per thread need the output to leave by "
                               "TMA (rows a multiple of 16 bytes, batch axes in front of the rows); the "
                               "16-byte stores beside them spill. 128 at most here")
        if not 2 <= stages <= 8:
            raise CodegenError(f"{what}: stages must be 2 to 8, got {stages}")
        n = schedule.diagram.sizes.get(p.c)
        if p.rowred is not None and isinstance(n, int) and -(-n // BN) != splits:
            raise CodegenError(f"{what}: the row reduction over {p.c!r} splits its {n} columns into {splits} "
                               f"tile(s) (splits); g_{p.c} = {BN} makes {-(-n // BN)}")
        smem, limit = cfg.smem_bytes(p, 2), _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"{what}: {stages} stages need {smem} bytes of shared memory; {limit} fit")
        return cfg

    @staticmethod
    def _cluster_split_config(d: Diagram, p: MatmulProblem, cfg: MatmulConfig, cluster: int) -> MatmulConfig:
        """``cfg`` with its ``splits`` blocks a tile run as one thread-block cluster
        (:attr:`MatmulConfig.cluster_splits`), checked against what the template builds (the wgmma
        template runs on sm_90a, which has clusters: an Ampere target is refused before)."""
        what = f"contraction family (wgmma): cluster={cluster}"
        if p.rowred is not None:
            raise CodegenError(f"{what}: a row reduction's column tiles are combined by a second launch, not in a "
                               "cluster")
        if cluster != cfg.splits:
            raise CodegenError(f"{what}: the cluster's blocks are the shares of one tile's sum, so cluster must "
                               f"equal splits ({cfg.splits})")
        if not 2 <= cluster <= MAX_CLUSTER_SPLITS:
            raise CodegenError(f"{what}: a tile's sum is shared by 2 to {MAX_CLUSTER_SPLITS} blocks of a cluster")
        if cfg.pingpong:
            raise CodegenError(f"{what}: ping-pong consumers own whole tiles; a cluster shares one tile's sum "
                               "between cooperative blocks")
        if (cfg.BM * cfg.BN // 4) % cluster:
            raise CodegenError(f"{what}: the tile's {cfg.BM} x {cfg.BN} partial sums do not part into {cluster} "
                               "equal slices of 4 floats")
        ring, partial = cfg.wgmma_ring_bytes(2), 4 * cfg.BM * cfg.BN
        if partial > ring:
            raise CodegenError(f"{what}: the tile's fp32 partial ({partial} bytes) is kept in the ring, which "
                               f"holds {ring} with {cfg.stages} stages; give it more stages")
        out = replace(cfg, cluster_splits=True)
        if p.y_t and not wgmma_tma_store(d, p, out, []):
            raise CodegenError(f"{what}: the swapped tile leaves by TMA: the output's last axis {p.a!r} must be a "
                               "multiple of 16 bytes behind its batch axes")
        return out

    @staticmethod
    def _check_swap_config(d: Diagram, p: MatmulProblem, cfg: MatmulConfig, splits: int, arch: str | None,
                           what: str) -> MatmulConfig:
        """A swapped tile (``p.y_t``) as the template builds it: one or two consumers of 64 rows, 8
        to 64 columns, 2 to :data:`SWAP_MAX_STAGES` slots, the output leaving by TMA unless split."""
        if cfg.pingpong or cfg.BM not in (64, 128) or cfg.WM != 64:
            raise CodegenError(f"{what}: swapped operands run one or two consumer warpgroups of 64 rows "
                               f"(g_{p.a} = 64 or 128, w_{p.a} = 64)")
        if cfg.WN != cfg.BN or cfg.BN not in SWAP_WIDTHS:
            raise CodegenError(f"{what}: swapped operands take g_{p.c} = w_{p.c} of {', '.join(map(str, SWAP_WIDTHS))}")
        if not 2 <= cfg.stages <= SWAP_MAX_STAGES:
            raise CodegenError(f"{what}: stages must be 2 to {SWAP_MAX_STAGES}, got {cfg.stages}")
        if splits == 1 and not wgmma_tma_store(d, p, cfg, []):
            raise CodegenError(f"{what}: the swapped tile leaves by TMA: the output's last axis {p.a!r} must be a "
                               "multiple of 16 bytes behind its batch axes")
        smem, limit = cfg.smem_bytes(p, 2), _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"{what}: {cfg.stages} stages need {smem} bytes of shared memory; {limit} fit")
        return cfg

    def _check_config(self, cfg: MatmulConfig, p: MatmulProblem) -> None:
        what = f"contraction family: tiles g_{p.a}={cfg.BM}, g_{p.c}={cfg.BN}, s_{p.b}={cfg.BK}, " \
               f"w_{p.a}={cfg.WM}, w_{p.c}={cfg.WN}"
        if not 1 <= cfg.splits <= MAX_SPLITS:
            raise CodegenError(f"{what}: splits={cfg.splits}; a sum is shared by 1 to {MAX_SPLITS} blocks")
        if cfg.BM % cfg.WM or cfg.BN % cfg.WN:
            raise CodegenError(f"{what}: warp tiles must divide the block tile")
        if not 32 <= cfg.threads <= 1024:
            raise CodegenError(f"{what}: gives {cfg.threads} threads per block (32 to 1024)")
        if cfg.simt and cfg.tf32x3:
            if cfg.WM % 16 or cfg.WN % 8 or cfg.WM * cfg.WN > 64 * 32:
                raise CodegenError(f"{what}: the 3xTF32 warp tiles are m16n8 pieces (w_{p.a} a multiple of 16, "
                                   f"w_{p.c} of 8), at most 64x32 (64 accumulators a thread)")
            if cfg.BK not in (8, 16, 32, 64, 128):
                raise CodegenError(f"{what}: the 3xTF32 template streams b in chunks of 8, 16, 32, 64 or 128")
        elif cfg.simt:
            if (cfg.WM, cfg.WN) not in ((32, 64), (64, 32)):
                raise CodegenError(f"{what}: the fp32 template's warp tiles are 32x64 or 64x32")
            if cfg.BK not in (4, 8, 16, 32):
                raise CodegenError(f"{what}: the fp32 template streams b in chunks of 4, 8, 16 or 32")
        if cfg.simt:  # both fp32 engines: float4 chunk loads shared by every thread, two buffers
            for rows, cols in ((cfg.BM, cfg.BK), (cfg.BN, cfg.BK)):
                if (rows * cols // 4) % cfg.threads:
                    raise CodegenError(f"{what}: a {rows}x{cols} chunk does not split evenly over "
                                       f"{cfg.threads} threads")
            if cfg.stages != 2:
                raise CodegenError(f"{what}: the fp32 template is double-buffered (stages=2)")
        else:
            if cfg.WM % 16 or cfg.WN % 16 or cfg.BK % 32:
                raise CodegenError(f"{what}: mma pieces are 16x16 and the operand fragments are "
                                   f"double-buffered per 16-deep slice: warp tiles must be multiples "
                                   f"of 16 and s_{p.b} of 32")
            if cfg.WM * cfg.WN > 64 * 64:
                raise CodegenError(f"{what}: a warp tile over 64x64 does not fit in registers")
            if cfg.BK > 128 or cfg.BM > 256 or cfg.BN > 256:
                raise CodegenError(f"{what}: tiles too large (g <= 256, s <= 128)")
            if not 2 <= cfg.stages <= 6:
                raise CodegenError(f"{what}: stages must be 2 to 6, got {cfg.stages}")

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        p0 = analyze(diagram)
        p = problem_of(diagram, schedule)
        if not diagram.is_bound:
            raise CodegenError(f"contraction family: bind the sizes of {diagram.name!r} first")
        cfg = self.config_of(p, schedule, arch)
        check_derived(self.name, schedule.kernels[0].name, schedule.kernels[0].options, cfg.options())
        sz = diagram.sizes
        pads, buffers = [], []
        padded: dict[str, tuple[str, int]] = {}
        taken: set[str] = set()
        for v in (p.A, p.B, *([p.B2] if p.dual else [])):
            row = padded_rows(diagram, p).get(v.name)
            if row is None:
                continue
            name = _buffer_name(diagram, f"{v.name}_padded", taken)
            taken.add(name)
            padded[v.name] = (name, row)
            shape = tuple(sz[n] for n in v.axis_names[:-1]) + (row,)
            buffers.append(Buffer(name, v.axis_names, shape, v.dtype))
            pads.append(self._pad_launch(diagram, v, name, row))
        if cfg.wgmma:  # persistent blocks: one per SM of the GPU the schedule was made for
            sms = _sm_count(schedule.gpu)
            launch = functools.partial(self._launch_wgmma, sms=sms)
        else:
            launch = self._launch
        if cfg.splits > 1 and p.rowred is not None:
            # a split row reduction: [rows][column tiles] of fp32 partials (pairs for a softmax or
            # logsumexp), every entry written by the first launch and read by the second
            ws = _buffer_name(diagram, f"{diagram.name}_row_partials", taken)
            buffers.append(Buffer(ws, (p.a, "tile", "stat"), (sz[p.a], cfg.splits, _row_stats(p)), "fp32"))
            main = (launch(diagram, p, cfg, arch, ws=ws, padded=padded), self._rowcombine_launch(diagram, p, cfg, ws))
        elif not cfg.partials_in_hbm:  # one share, or shares meeting in a cluster
            main = (launch(diagram, p, cfg, arch, padded=padded),)
        else:
            # (swapped operands write their partials transposed, [split][batch][rows][a] as the output
            # is stored: the second launch is the unswapped problem's)
            ws = _buffer_name(diagram, f"{diagram.name}_partials", taken)
            nbatch = math.prod(sz[a] for a in p.batch)
            buffers.append(Buffer(ws, ("split", "batch", p0.a, p0.c), (cfg.splits, nbatch, sz[p0.a], sz[p0.c]),
                                  "fp32"))
            main = (launch(diagram, p, cfg, arch, ws=ws, padded=padded), self._combine_launch(diagram, p0, cfg, ws))
        return Program(diagram, schedule, self.name, (*pads, *main), tuple(buffers), dict(sz))

    def _pad_launch(self, d: Diagram, v: Value, buffer: str, row: int) -> KernelLaunch:
        """The copy of operand ``v`` into ``buffer`` with rows of ``row`` elements, zeros after the end."""
        sz = d.sizes
        L = sz[v.axis_names[-1]]
        rows = math.prod(sz[n] for n in v.axis_names[:-1])
        T = v.dtype
        kname = Code(f"napkin_pad_rows_{T}_{short_hash(T, 'pad', v.name)}")
        legend = comment_lines([f"diagram {d.name}: operand {v.label()} -> buffer {buffer} "
                                f"(rows of {L} -> {row} elements)",
                                f"  rows = {' x '.join(v.axis_names[:-1]) or '1'}, L = {v.axis_names[-1]}",
                                f"  tunables: THREADS = {PAD_THREADS}"])
        source = render("pad_rows.cu.jinja", kname=kname, T=ctype(T), THREADS=PAD_THREADS, legend=legend)
        vec = 16 // _elem(T)
        pieces = rows * (row // vec)
        blocks = max(1, min(-(-pieces // PAD_THREADS), 65535 * 8))
        args = (Arg("tensor", v.name, dtype=T, axes=v.axis_names), Arg("tensor", buffer, dtype=T, axes=v.axis_names),
                Arg("i64", "rows", value=rows), Arg("int", "L", value=L), Arg("int", "LP", value=row))
        return KernelLaunch(name=str(kname), source=source, grid=(blocks, 1, 1), block=(PAD_THREADS, 1, 1),
                            shared_bytes=0, args=args, template="pad_rows.cu.jinja",
                            tunables=(("THREADS", PAD_THREADS),), model_smem_bytes=0, model_regs_per_thread=None)

    @staticmethod
    def _second_launch_params(d: Diagram, p: MatmulProblem, ws: str) -> list[Param]:
        """The parameters both second launches (a split sum's, a split row reduction's) open with:
        the fp32 partials, the output, its two sizes and its row stride."""
        out_name = d.output_names[0]
        sY = contiguous_strides(p.out)
        return [
            Param(Arg("tensor", ws, dtype="fp32", axes=()), Code("const float* __restrict__ WS")),
            tensor_param(p.out, "Y", p.dtype, const=False, name=out_name),
            int_param("M", d.sizes[p.a]), int_param("N", d.sizes[p.c]),
            int_param("ldy", sY[p.a], f"row stride of {out_name}[{','.join(p.out.axis_names)}]"),
        ]

    def _combine_launch(self, d: Diagram, p: MatmulProblem, cfg: MatmulConfig, ws: str) -> KernelLaunch:
        """The second launch of a split sum: the partials added in a fixed order, then the epilogue."""
        T = p.dtype
        sz = d.sizes
        M, N = sz[p.a], sz[p.c]
        sY = contiguous_strides(p.out)
        out_name = d.output_names[0]
        params = self._second_launch_params(d, p, ws)
        batch = []
        for ax in p.batch:
            names = dict(idx=ident(ax, "i_"), size=ident(ax, "n_"), sY=ident(ax, "sY_"))
            params += [int_param(names["size"], sz[ax]),
                       stride_param(names["sY"], sY[ax], f"stride of the output along {ax}")]
            batch.append(names)
        index_vars = {ax: ident(ax, "i_") for ax in (p.a, p.c, *p.batch)}
        epi = epilogue_code(d, p.contraction, p.out, index_vars=index_vars, ctype_name=T)
        params += epi.params
        tag = short_hash(T, [str(x) for x in epi.lines], p.batch, cfg.splits, "combine")
        kname = Code(f"napkin_mm_combine_{T}_x{cfg.splits}_{tag}")
        legend = comment_lines([f"diagram {d.name}: the {cfg.splits} partial sums of "
                                f"{out_name}[{','.join(p.out.axis_names)}] from the contraction's first launch",
                                f"  {p.a} -> M (rows), {p.c} -> N (columns)"
                                + "".join(f", {ax} -> batch" for ax in p.batch),
                                "  epilogue: " + (", ".join(epi.boxes) if epi.boxes else "none"),
                                f"  tunables: SPLITS = {cfg.splits}, THREADS = {COMBINE_THREADS}, "
                                f"DEPTH = {min(COMBINE_DEPTH, cfg.splits)}"])
        source = render("matmul_combine.cu.jinja", kname=kname, T=ctype(T), SPLITS=cfg.splits,
                        THREADS=COMBINE_THREADS, DEPTH=min(COMBINE_DEPTH, cfg.splits),
                        params=signature(params), batch=batch, legend=legend,
                        idx_a=index_vars[p.a], idx_c=index_vars[p.c], epi_body=epi.body("    "),
                        epi_result=epi.result, epi_identity=epi.is_identity)
        total = M * N * math.prod(sz[a] for a in p.batch)
        blocks = max(1, min(-(-total // COMBINE_THREADS), 65535))
        return KernelLaunch(name=str(kname), source=source, grid=(blocks, 1, 1), block=(COMBINE_THREADS, 1, 1),
                            shared_bytes=0, args=tuple(x.arg for x in params), template="matmul_combine.cu.jinja",
                            tunables=(("SPLITS", cfg.splits), ("THREADS", COMBINE_THREADS),
                                      ("DEPTH", min(COMBINE_DEPTH, cfg.splits))),
                            model_smem_bytes=0, model_regs_per_thread=None)

    def _rowcombine_launch(self, d: Diagram, p: MatmulProblem, cfg: MatmulConfig, ws: str) -> KernelLaunch:
        """The second launch of a split row reduction: each row's partials combined in a fixed
        order (max and sum rescaled for a softmax or logsumexp), then the maps after the reduction;
        a softmax normalises its stored logits (less each tile's max) in place."""
        T = p.dtype
        M, N = d.sizes[p.a], d.sizes[p.c]
        red = p.rowred_kind
        sY = contiguous_strides(p.out)
        params = self._second_launch_params(d, p, ws)
        index_vars = {ax: ident(ax, "i_") for ax in (p.a, p.c)}
        R = p.rowred
        post = epilogue_code(d, R, p.out, index_vars={ax: index_vars[ax] for ax in R.axis_names}, ctype_name=T,
                             prefix="q")
        params += post.params
        softmax = red == "softmax"
        # 16-byte pieces of a softmax row when every row starts on one (8 elements of 16 bits)
        vec = 8 if softmax and N % 8 == 0 and sY[p.a] % 8 == 0 else 1
        if softmax and cfg.splits > MAX_ROW_TILES:
            raise CodegenError(f"contraction family: a softmax row split into {cfg.splits} tiles; the second launch "
                               f"keeps each tile's shift in shared memory, at most {MAX_ROW_TILES} tiles")
        tag = short_hash(T, red, [str(x) for x in post.lines], cfg.splits, cfg.BN, vec, "rowcombine")
        kname = Code(f"napkin_mm_rowcombine_{red}_{T}_x{cfg.splits}_{tag}")
        legend = comment_lines([f"diagram {d.name}: {d.name_of(R)} = {red} along {p.c!r} of the contraction's "
                                f"rows, from the {cfg.splits} column tiles' fp32 partials of the first launch",
                                f"  {p.a} -> M (rows), {p.c} -> N (columns), tiles of the row -> TILES",
                                "  after the reduction: " + (", ".join(post.boxes) if post.boxes else "none"),
                                f"  tunables: TILES = {cfg.splits}, BNT = {cfg.BN}, THREADS = {ROWCOMBINE_THREADS}, "
                                f"VEC = {vec}"])
        source = render("matmul_wgmma_rowcombine.cu.jinja", kname=kname, T=ctype(T), RED=red, TILES=cfg.splits,
                        THREADS=ROWCOMBINE_THREADS, VEC=vec, BNT=cfg.BN, params=signature(params), legend=legend,
                        idx_a=index_vars[p.a], idx_c=index_vars[p.c], post_body=post.body("    "),
                        post_result=post.result)
        rows_per_block = 1 if softmax else ROWCOMBINE_THREADS // 32  # a block a softmax row, else a warp a row
        blocks = max(1, min(-(-M // rows_per_block), 2 ** 31 - 1))
        return KernelLaunch(name=str(kname), source=source, grid=(blocks, 1, 1), block=(ROWCOMBINE_THREADS, 1, 1),
                            shared_bytes=0, args=tuple(x.arg for x in params), template="matmul_wgmma_rowcombine.cu.jinja",
                            tunables=(("TILES", cfg.splits), ("THREADS", ROWCOMBINE_THREADS), ("VEC", vec)),
                            model_smem_bytes=0, model_regs_per_thread=None)

    def _launch(self, d: Diagram, p: MatmulProblem, cfg: MatmulConfig, arch: str,
                ws: str | None = None, padded: dict | None = None) -> KernelLaunch:
        T = p.dtype
        sz = d.sizes
        M, N, K = sz[p.a], sz[p.c], sz[p.b]
        padded = padded or {}
        (pa, sA), (pb, sB) = (_operand_layout(v, sz, padded) for v in (p.A, p.B))
        sY = contiguous_strides(p.out)
        lda = sA[p.a] if p.a_kmajor else sA[p.b]
        ldb = sB[p.c] if p.b_kmajor else sB[p.b]
        ldy = sY[p.a]
        out_name = d.output_names[0]
        # sizes index in 32-bit ints, and a tile past the last element must still fit (M + BM - 1)
        check_index_size(M, f"axis {p.a!r} of {p.A.label()}", cfg.BM, "contraction")
        check_index_size(N, f"axis {p.c!r} of {p.B.label()}", cfg.BN, "contraction")
        check_index_size(K, f"axis {p.b!r} of {p.A.label()}", cfg.BK, "contraction")
        params: list[Param] = [
            tensor_param(p.A, "A", T, name=pa[0] if pa else None),
            tensor_param(p.B, "B", T, name=pb[0] if pb else None),
            tensor_param(p.out, "Y", T, const=False, name=out_name),
            int_param("M", M), int_param("N", N), int_param("K", K),
            int_param("lda", lda, f"row stride of {p.A.label()}"),
            int_param("ldb", ldb, f"row stride of {p.B.label()}"),
            int_param("ldy", ldy, f"row stride of {out_name}[{','.join(p.out.axis_names)}]"),
        ]
        batch = []
        nbatch = 1
        for ax in p.batch:
            n = sz[ax]
            nbatch *= n
            names = dict(idx=ident(ax, "i_"), size=ident(ax, "n_"), sA=ident(ax, "sA_"),
                         sB=ident(ax, "sB_"), sY=ident(ax, "sY_"))
            params += [int_param(names["size"], n),
                       stride_param(names["sA"], sA.get(ax, 0), f"stride of {p.A.label()} along {ax}"),
                       stride_param(names["sB"], sB.get(ax, 0), f"stride of {p.B.label()} along {ax}"),
                       stride_param(names["sY"], sY[ax], f"stride of the output along {ax}")]
            batch.append(names)
        if nbatch > MAX_BATCH:
            raise CodegenError(f"contraction family: {nbatch} batch elements; at most {MAX_BATCH}")
        if grid_folds(nbatch) and cfg.splits > 1:  # (never offered: the batch fills the SMs)
            raise CodegenError(f"contraction family: {nbatch} batch elements run past grid.y into grid.z, whose "
                               f"split partials' layout counts grid.y alone; run it unsplit")
        kouter = []
        for ax in p.k_outer:
            names = dict(size=ident(ax, "n_"), sA=ident(ax, "sA_"), sB=ident(ax, "sB_"))
            params += [int_param(names["size"], sz[ax]),
                       stride_param(names["sA"], sA[ax], f"stride of {p.A.label()} along {ax}"),
                       stride_param(names["sB"], sB[ax], f"stride of {p.B.label()} along {ax}")]
            kouter.append(names)
        check_index_size(_chunk_count(sz, p, cfg.BK), f"the chunks of the sum over {[*p.k_outer, p.b]}", 1,
                         "contraction")
        if ws is not None:
            params.append(Param(Arg("tensor", ws, dtype="fp32", axes=()), Code("float* __restrict__ WS")))
        index_vars = {ax: ident(ax, "i_") for ax in (p.a, p.c, *p.batch)}
        elem = _elem(T)
        staged = epilogue_tiles(d, p, cfg, elem)
        epi = epilogue_code(d, p.contraction, p.out, index_vars=index_vars, ctype_name=T,
                            tile_reads={v.name: f"napkin::to_float(tE{k}[tile_r * C_LD + tile_c])"
                                        for k, v in enumerate(staged)})
        params += epi.params
        tiles = _staged_tiles(staged, p, index_vars, T, params)  # the operands copied tile by tile

        smem = cfg.smem_bytes(p, elem)
        limit = _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"contraction family: the tiles need {smem} bytes of shared memory; "
                               f"{arch} allows {limit} per block")
        layout = ("k" if p.a_kmajor else "m") + ("k" if p.b_kmajor else "n")
        tag = short_hash(T, layout, [str(x) for x in epi.lines], p.batch, p.k_outer, cfg,
                         *((TF32X3_KSUM,) if cfg.tf32x3 else ()))
        kind = ("tf32x3" if cfg.tf32x3 else "simt") if cfg.simt else "mma"
        split = f"_x{cfg.splits}" if cfg.splits > 1 else ""
        kname = Code(f"napkin_mm_{kind}_{T}_{cfg.BM}x{cfg.BN}x{cfg.BK}_w{cfg.WM}x{cfg.WN}"
                     f"_s{cfg.stages}{split}_{layout}_{tag}")
        legend = comment_lines(self._legend(d, p, cfg, epi.boxes))
        ctx = dict(
            kname=kname, T=ctype(T), BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, WM=cfg.WM, WN=cfg.WN,
            STAGES=cfg.stages, SPLITS=cfg.splits, GROUP_M=GROUP_M, MIN_BLOCKS=cfg.blocks_per_sm,
            A_KMAJOR=p.a_kmajor, B_KMAJOR=p.b_kmajor, TF32X3=cfg.tf32x3, KSUM=TF32X3_KSUM,
            FOLD=grid_folds(nbatch), NBATCH=nbatch,
            params=signature(params), batch=batch, kouter=kouter, legend=legend,
            idx_a=index_vars[p.a], idx_c=index_vars[p.c],
            epi_body=epi.body("    "), epi_result=epi.result, epi_identity=epi.is_identity, tiles=tiles,
            CLAMPED=len(staged) == len(_tiled_like_output(d, p)),
        )
        template = "matmul_simt.cu.jinja" if cfg.simt else "matmul_mma.cu.jinja"
        source = render(template, **ctx)
        tiles = math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN)
        tunables = (("BM", cfg.BM), ("BN", cfg.BN), ("BK", cfg.BK), ("WM", cfg.WM), ("WN", cfg.WN),
                    ("stages", cfg.stages), ("blocks_per_sm", cfg.blocks_per_sm), ("a_kmajor", p.a_kmajor),
                    ("b_kmajor", p.b_kmajor))
        if cfg.splits > 1:
            tunables += (("splits", cfg.splits),)
        return KernelLaunch(
            name=str(kname), source=source, grid=(tiles * cfg.splits, *fold_grid(nbatch)), block=(cfg.threads, 1, 1),
            shared_bytes=smem, args=tuple(x.arg for x in params), template=template,
            tunables=tunables, model_smem_bytes=cfg.model_smem_bytes(elem),
            model_regs_per_thread=cfg.model_regs(),
        )

    def _launch_wgmma(self, d: Diagram, p: MatmulProblem, cfg: MatmulConfig, arch: str,
                      ws: str | None = None, padded: dict | None = None, sms: int = 132) -> KernelLaunch:
        T = p.dtype
        sz = d.sizes
        M, N, K = sz[p.a], sz[p.c], sz[p.b]
        out_name = d.output_names[0]
        check_index_size(M, f"axis {p.a!r} of {p.A.label()}", cfg.BM, "contraction")
        check_index_size(N, f"axis {p.c!r} of {p.B.label()}", cfg.BN, "contraction")
        check_index_size(K, f"axis {p.b!r} of {p.A.label()}", cfg.BK, "contraction")
        check_index_size(_chunk_count(sz, p, cfg.BK), f"the chunks of the sum over {[*p.k_outer, p.b]}", 1,
                         "contraction")
        # TMA boxes (innermost first): a K-major operand moves as one [rows][64] box per chunk, an
        # MN-major one as [64 k][64 mn] boxes side by side
        # each operand's tensor map: 2-D over its flattened rows, or its axes as dimensions of their
        # own (operand_view; batch and outer-sum indices are then coordinates, not row offsets)
        operands = (("A", p.A), ("B", p.B), *((("B2", p.B2),) if p.dual else ()))
        views = {k: operand_view(d, p, v) for k, v in operands}
        for v in views.values():
            if isinstance(v, str):
                raise CodegenError(f"contraction family: {v}")
        # a ping-pong block's consumers own whole tiles; a cluster multicasts 2-D boxes only
        cluster = 1 if cfg.pingpong or any(views.values()) else wgmma_cluster(p)
        box_a = (64, cfg.BM) if p.a_kmajor else (64, 64)
        box_b = (64, cfg.BN // cluster) if p.b_kmajor else (64, 64)  # a cluster's blocks copy B in parts

        def boxed(box, view):
            return (*box, *([1] * (len(view) - 2))) if view else box

        padded = padded or {}
        (pa, sA), (pb, sB) = (_operand_layout(v, sz, padded) for v in (p.A, p.B))
        sY = contiguous_strides(p.out)
        params: list[Param] = [
            tensormap_param(p.A, "tmA", boxed(box_a, views["A"]), name=pa[0] if pa else None, view=views["A"]),
            tensormap_param(p.B, "tmB", boxed(box_b, views["B"]), name=pb[0] if pb else None, view=views["B"]),
        ]
        if p.dual:
            pb2 = padded.get(p.B2.name)
            params.append(tensormap_param(p.B2, "tmB2", boxed(box_b, views["B2"]), name=pb2[0] if pb2 else None,
                                          view=views["B2"]))
        # an output stored by TMA copies (decided below, once the staged operands are known) takes
        # its tensor map after the operands'
        tmy_at = len(params)
        if p.G is not None:
            params.append(tensor_param(p.G, "G", T))
        params += [
            tensor_param(p.out, "Y", T, const=False, name=out_name),
            int_param("M", M), int_param("N", N), int_param("K", K),
            int_param("ldy", sY[p.a], f"row stride of {out_name}[{','.join(p.out.axis_names)}]"),
        ]
        if ws is not None:
            params.append(Param(Arg("tensor", ws, dtype="fp32", axes=()), Code("float* __restrict__ WS")))
        # batch and outer-sum indices move each operand's tiles down its flattened rows (0 rows for
        # an operand whose map has the axis as a dimension: the index is a coordinate there)
        row_a, row_b = sA[_tile_rows_axis(p, p.A)], sB[_tile_rows_axis(p, p.B)]
        flat_a, flat_b = not views["A"], not views["B"]
        batch, kouter, nbatch = [], [], 1
        for ax in p.batch:
            nbatch *= sz[ax]
            names = dict(idx=ident(ax, "i_"), size=ident(ax, "n_"), rA=ident(ax, "rA_"), rB=ident(ax, "rB_"),
                         sY=ident(ax, "sY_"))
            params += [int_param(names["size"], sz[ax]),
                       int_param(names["rA"], sA.get(ax, 0) // row_a if flat_a else 0,
                                 f"rows of {p.A.label()} per index of {ax}"),
                       int_param(names["rB"], sB.get(ax, 0) // row_b if flat_b else 0,
                                 f"rows of {p.B.label()} per index of {ax}"),
                       stride_param(names["sY"], sY[ax], f"stride of the output along {ax}")]
            batch.append(names)
        for ax in p.k_outer:
            names = dict(size=ident(ax, "n_"), rA=ident(ax, "rA_"), rB=ident(ax, "rB_"), oidx=ident(ax, "o_"))
            params += [int_param(names["size"], sz[ax]),
                       int_param(names["rA"], sA[ax] // row_a if flat_a else 0,
                                 f"rows of {p.A.label()} per index of {ax}"),
                       int_param(names["rB"], sB[ax] // row_b if flat_b else 0,
                                 f"rows of {p.B.label()} per index of {ax}")]
            kouter.append(names)
        # each operand's copy coordinates past (inner, rows): a row offset, or one index a dimension
        coord = {**{ax: ident(ax, "i_") for ax in p.batch}, **{ax: ident(ax, "o_") for ax in p.k_outer}}
        load_views = {}
        for key, v in operands:
            view = views[key]
            load_views[key] = dict(
                rank=len(view) if view else 2, row=Code("" if view else ("ra + " if key == "A" else "rb + ")),
                more=Code("".join(f", {coord[v.axis_names[i]]}" for i in view[2:])))
        index_vars = {ax: ident(ax, "i_") for ax in (p.a, p.c, *p.batch)}
        red, post = None, None
        staged_tiles: list[dict] = []
        staged: list = []
        rowsplit = p.rowred is not None and cfg.splits > 1
        if p.rowred is not None:
            # maps before the reduction (on the accumulators), the reduction, maps after it (in the
            # second launch of a split row)
            R = p.rowred
            red = p.rowred_kind
            epi = epilogue_code(d, p.contraction, p.rowred_x, index_vars=index_vars, ctype_name=T)
            post = epilogue_code(d, R, p.out, index_vars={ax: index_vars[ax] for ax in R.axis_names},
                                 ctype_name=T, prefix="q")
            params += epi.params
            seen = {str(x.decl) for x in params}
            if not rowsplit:
                params += [x for x in post.params if str(x.decl) not in seen]
        else:
            # an operand tiled like the output (a residual) is copied 64 x 64 at a time into the
            # consumer's staging block, where the epilogue reads it and writes its results over
            # it: read per element behind the bounds check, each of a thread's 128 reads waited
            # for the one before (H100, 128 x 256 bf16 output + a residual, one tile a block:
            # 12.9 us of kernel against 4.1 for the plain product)
            staged = (_tiled_like_output(d, p)[:1] if wgmma_persistent(p) and not cfg.partials_in_hbm and not p.y_t
                      else [])
            epi = epilogue_code(d, p.contraction, p.out, index_vars=index_vars, ctype_name=T, start2=p.contraction2,
                                tile_reads={v.name: "napkin::to_float(sE[tile_r * E_LD + tile_c])" for v in staged})
            params += epi.params
            staged_tiles = _staged_tiles(staged, p, index_vars, T, params)
        tma_store = wgmma_tma_store(d, p, cfg, staged)
        if p.y_t and not cfg.partials_in_hbm and not tma_store:
            raise CodegenError("contraction family: swapped operands leave by TMA: the output's last axis "
                               f"{p.a!r} must be a multiple of 16 bytes behind its batch axes")
        ebuf = cfg.staging_blocks(2) if tma_store else 1
        if tma_store:  # 64 x 64 blocks; a swapped tile's, 64 along its rows (the output's last axis) x BN
            box = (64, cfg.BN) if p.y_t else (64, 64)
            params.insert(tmy_at, tensormap_param(p.out, "tmY", (*box, 1) if p.batch else box, name=out_name))
        layout = ("k" if p.a_kmajor else "m") + ("k" if p.b_kmajor else "n")
        eps = p.norm.op.eps if p.norm is not None else None
        tag = short_hash(T, layout, [str(x) for x in epi.lines], p.batch, p.k_outer, cfg,
                         *(() if not any(views.values()) else ("views", sorted(views.items()))),
                         *(() if not wgmma_persistent(p) else ("persistent", cluster, WGMMA_STAGGER)),
                         *(() if not tma_store else ("tma_store", ebuf)),
                         *(() if not p.y_t else ("swap_ab",)),
                         *(() if eps is None else ("rmsnorm", eps, p.G is not None)),
                         *(() if red is None else (red, [str(x) for x in post.lines])))
        dual = "_dual" if p.dual else "_rmsnorm" if p.norm is not None else f"_{red}" if red else ""
        split = f"_x{cfg.splits}" if cfg.splits > 1 else ""
        split += f"_c{cluster}" if cluster > 1 else ""
        split += "_cs" if cfg.cluster_splits else ""
        split += "_pp" if cfg.pingpong else ""
        split += "_swap" if p.y_t else ""
        kname = Code(f"napkin_mm_wgmma{dual}{split}_{T}_{cfg.BM}x{cfg.BN}x{cfg.BK}_w{cfg.WM}_s{cfg.stages}_{layout}_{tag}")
        wn = cfg.BN * (2 if p.dual else 1)  # the wgmma's N
        nacc = wn // 2
        ctx = dict(
            kname=kname, T=ctype(T), AB=Code("bf16" if T == "bf16" else "f16"), BM=cfg.BM, BN=wn, DUAL=p.dual,
            SPLITS=1 if p.rowred is not None else cfg.splits, ROWSPLIT=rowsplit, CSPLIT=cfg.cluster_splits,
            PERSISTENT=wgmma_persistent(p), CLUSTER=cluster, PINGPONG=cfg.pingpong,
            STAGGER=bool(WGMMA_STAGGER), TMA_STORE=tma_store, EBUF=ebuf, Y_T=p.y_t,
            WM=cfg.WM, STAGES=cfg.stages, GROUP_M=GROUP_M, A_KMAJOR=p.a_kmajor, B_KMAJOR=p.b_kmajor,
            CONSUMER_REGS=cfg.consumer_regs(), NACC=nacc,
            PROLOGUE=p.norm is not None, PROLOGUE_GAMMA=p.G is not None,
            T2=Code("__nv_bfloat162" if T == "bf16" else "__half2"),
            RED=red, post_body=post.body("      ") if post else None, post_result=post.result if post else None,
            EPS=cuda_float(eps) if eps is not None else None,
            acc_operands=Code("{" + ", ".join(f"%{i}" for i in range(nacc)) + "}"),
            acc_constraints=Code(", ".join(f'"+f"(d[{i}])' for i in range(nacc))),
            params=signature(params),
            legend=comment_lines(self._legend(d, p, cfg, epi.boxes, staged, ebuf if tma_store else 0,
                                              [(v, views[k]) for k, v in operands])),
            batch=batch, kouter=kouter, views=load_views,
            idx_a=index_vars[p.a], idx_c=index_vars[p.c],
            epi_body=epi.body("      "), epi_result=epi.result, epi_identity=epi.is_identity, tiles=staged_tiles,
            CLAMPED=_clamped_epilogue(d, p, cfg, staged),
        )
        source = render("matmul_wgmma.cu.jinja", **ctx)
        tiles = math.ceil(M / cfg.BM) * math.ceil(N / cfg.BN)
        # the work items (a split row's column tiles are among the tiles); a persistent grid walks them
        # (numbered in 32-bit ints: the batch is part of the number, not a grid dimension)
        work = tiles * (1 if p.rowred is not None else cfg.splits) * nbatch
        if work > 2 ** 31 - 1:
            raise CodegenError(f"contraction family: {work} work items (tiles x splits x batch); at most 2^31 - 1")
        if cfg.cluster_splits:  # a cluster a tile: one work item a block (its share of the tile's sum)
            blocks = work
        elif wgmma_persistent(p):  # whole clusters, each walking items of `cluster` tiles
            items = math.ceil(math.ceil(M / cfg.BM) / cluster) * math.ceil(N / cfg.BN) * cfg.splits * nbatch
            blocks = min(items, sms // cluster) * cluster
        else:
            blocks = work
        tunables = (("BM", cfg.BM), ("BN", cfg.BN), ("BK", cfg.BK), ("WM", cfg.WM), ("WN", cfg.WN),
                    ("stages", cfg.stages), ("engine", "wgmma"), ("a_kmajor", p.a_kmajor),
                    ("b_kmajor", p.b_kmajor))
        extra = (("dual", True),) if p.dual else (("row_reduction", red),) if red else ()
        if cfg.splits > 1:
            extra += (("splits", cfg.splits),)
        if cfg.cluster_splits:
            extra += (("cluster", cfg.splits),)
        if wgmma_persistent(p):
            extra += (("persistent", True),)
        if cluster > 1:
            extra += (("cluster", cluster),)
        if cfg.pingpong:
            extra += (("pingpong", True),)
        if tma_store:
            extra += (("tma_store", ebuf),)
        if p.y_t:
            extra += (("swap_ab", True),)
        return KernelLaunch(
            name=str(kname), source=source, grid=(blocks, 1, 1), block=(cfg.threads, 1, 1),
            shared_bytes=cfg.smem_bytes(p, 2), args=tuple(x.arg for x in params),
            template="matmul_wgmma.cu.jinja", tunables=tunables + extra,
            model_smem_bytes=cfg.model_smem_bytes(2),
            model_regs_per_thread=cfg.consumer_regs(),
        )

    @staticmethod
    def _legend(d: Diagram, p: MatmulProblem, cfg: MatmulConfig, boxes, staged=(), tma_blocks: int = 0,
                views=()) -> list[str]:
        lines = [
            "(sizes are kernel arguments: one kernel serves every shape)",
            f"diagram {d.name}: {p.A.label()} x {p.B.label()}"
            + (f" and {p.A.label()} x {p.B2.label()} (dual: acc, acc2)" if p.dual else "")
            + (f", prologue: {p.A.label()} -> rmsnorm over {p.b} (eps {p.norm.op.eps})"
               + (f" x {p.G.label()}" if p.G is not None else "") if p.norm is not None else "")
            + (f", then {d.name_of(p.rowred)} = {p.rowred_kind} along each row "
               + (f"(split over {cfg.splits} column tiles: fp32 partials, combined by a second launch)"
                  if cfg.splits > 1 else "(the tile spans it)") if p.rowred is not None else "")
            + f" -> {d.output_names[0]}[{','.join(p.out.axis_names)}], {p.dtype}",
            f"  {p.a} -> M (rows, any size):    g_{p.a} = BM = {cfg.BM}, w_{p.a} = WM = {cfg.WM}",
            f"  {p.c} -> N (columns, any size): g_{p.c} = BN = {cfg.BN}, w_{p.c} = WN = {cfg.WN}",
            f"  {p.b} -> K (summed, any size):  s_{p.b} = BK = {cfg.BK}, stages = {cfg.stages}",
            *([f"  engine: wgmma + TMA, {cfg.BM // cfg.WM} consumer warpgroup(s) of {cfg.WM} rows, "
               f"one producer warpgroup"] if cfg.wgmma and not cfg.pingpong else []),
            *([f"  engine: wgmma + TMA, ping-pong: 2 consumer warpgroups owning whole tiles in turn, "
               f"one producer warpgroup"] if cfg.pingpong else []),
            f"  A stored {'[a][b]' if p.a_kmajor else '[b][a]'}, B stored "
            f"{'[c][b]' if p.b_kmajor else '[b][c]'}",
            *([f"  operands swapped (swap_ab): {p.A.label()} on the tile's rows, the output stored "
               f"[{p.c}][{p.a}] and each tile written transposed (Y_T)"] if p.y_t else []),
            *([f"  {p.b} split over SPLITS = {cfg.splits} blocks a tile, one thread-block cluster (CSPLIT): "
               "fp32 partials added in shared memory, block 0 runs the epilogue"] if cfg.cluster_splits else []),
            *([f"  {p.b} split over SPLITS = {cfg.splits} blocks a tile: fp32 partials in the workspace WS, "
               "added by a second launch"] if cfg.partials_in_hbm and p.rowred is None else []),
        ]
        for ax in p.k_outer:
            lines.append(f"  {ax} -> outer sum (one index at a time: s_{ax} = 1, every chunk of {p.b} per index)")
        for ax in p.batch:
            lines.append(f"  {ax} -> batch (grid.y)")
        for v, view in views:  # (operand, its tensor map's view) pairs
            if view:
                seen = "][".join(v.axis_names[i] for i in reversed(view))
                lines.append(f"  {v.label()} copied through a {len(view)}-D tensor map of its own axes, [{seen}]")
        lines.append("  epilogue: " + (", ".join(boxes) if boxes else "none")
                     + "".join(f"; {v.label()} copied 64 x 64 into each consumer's staging block (E{k})"
                               for k, v in enumerate(staged)))
        if tma_blocks:
            block = f"{cfg.BN} x 64 (transposed)" if p.y_t else "64 x 64"
            lines.append(f"  output: {block} blocks through {tma_blocks} swizzled staging block(s) a consumer, "
                         "each sent to HBM by a TMA copy (tmY)")
        return lines


FAMILY = ContractionFamily()
