#!/usr/bin/env python3
"""Run one generated kernel of every family and every template at edge shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 9 python3 benchmarks/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 benchmarks/sanitize.py
    compute-sanitizer --tool synccheck --error-exitcode 9 python3 benchmarks/sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize.py --skip attention_bwd_wgmma --skip persistent_walk \
        --skip grid_fold

``--only TEXT`` runs the cases whose template or diagram name contains one of the texts, ``--skip
TEXT`` leaves such cases out (both repeatable): racecheck's report on one kernel can outlast a
device call.

racecheck reports hazards on two cases whose shared memory is handed between warps by mbarriers
alone, which it does not follow (``benchmarks/racecheck_ring.cu`` reproduces both in 40 lines):
``attention_bwd_wgmma`` (bulk copies into a ring slot that consumers read with plain loads) and
``persistent_walk`` (the tile number the producer stores for the consumers, rewritten two tiles
later once the consumers' arrival on ``qempty`` says they are past it). The two ``grid_fold`` cases
(launches past grid.y's 65535 blocks) run past 90 s under racecheck; their fold is an early return
before any shared-memory access. memcheck and synccheck run every case.

Each case compiles the kernel napkin plans for a diagram at sizes that are not tile multiples,
runs it on random inputs with NaN-poisoned outputs and checks it against the float64 reference,
so the sanitizer sees real launches and a wrong result still fails the run. The reference and the
comparison run on the CPU, so that the sanitizer sees napkin's kernels and not PyTorch's own (its
float64 reductions over rows of 130001 values drew 6144 racecheck reports in `reduce_kernel`).

Every case names the template it is there for (``Case.template``); a case whose plan does not use
that template fails, so a planner change cannot silently drop a template from the sanitizers.
``tests/codegen/test_sanitize_cases.py`` checks, without a GPU, that the cases cover every
template in ``napkin/codegen/templates`` on both Hopper and Ampere: a new template without a case
fails CI.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _column_sum():
    from napkin.diagrams import Diagram, array, axes, sum_over

    r, x = axes("r x")
    return Diagram("column_sum", sum_over(array("X", r, x), r, name="Y"))


def _logsumexp_all():
    from napkin.diagrams import Diagram, array, axes
    from napkin.diagrams.ops import logsumexp

    r, x = axes("r x")
    return Diagram("logsumexp_all", logsumexp(array("X", r, x), (r, x), name="L"))


def _sum_over_h_d():
    from napkin.diagrams import Diagram, array, axes, contract

    h, a, d, c = axes("h a d c")
    return Diagram("sum_over_h_d", contract(array("O", h, a, d), array("W", c, h, d), over=(h, d), out=(a, c),
                                            name="Y"))


def _staged_epilogue():
    from napkin.diagrams import Diagram, array, axes, contract

    n, a, b, c = axes("n a b c")
    S = contract(array("A", n, a, b), array("B", n, b, c), over=b, out=(n, a, c), name="S")
    return Diagram("staged_epilogue", ((S - array("D", n, a)) * array("P", n, a, c)).named("Y"))


def _gemm_residual():
    from napkin.diagrams import Diagram, array, axes, contract

    a, b, c = axes("a b c")
    H = contract(array("A", a, b), array("B", b, c), over=b, out=(a, c), name="H")
    return Diagram("gemm_residual", (H + array("R", a, c)).named("Y"))


def _merge_heads():
    from napkin.diagrams import Diagram, array, axes, contract

    s, h, d, e = axes("s h d e")
    return Diagram("merge_heads", contract(array("O", h, s, d), array("W", e, h, d), over=(h, d), out=(s, e),
                                           name="Y"))


def _gemm_row_col():
    from napkin.diagrams import Diagram, array, axes, contract

    a, b, c = axes("a b c")
    H = contract(array("A", a, b), array("B", b, c), over=b, out=(a, c), name="H")
    return Diagram("gemm_row_col", (H / array("r", a) + array("bias", c)).named("Y"))


def _gemm_row_scale_softmax():
    from napkin.diagrams import Diagram, array, axes, contract, softmax

    a, b, c = axes("a b c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    return Diagram("gemm_row_scale_softmax", softmax((L * array("r", a)).named("Ls"), c, name="P"))


def _sigmoid_chain():
    from napkin.diagrams import Diagram, array, axes, scale, tanh

    r, x = axes("r x")
    t = tanh(scale(array("X", r, x), 0.5, name="h"), name="t")
    return Diagram("sigmoid_chain", (t * 0.5 + 0.5).named("Y"))


def _broadcast_chain():
    from napkin.diagrams import Diagram, array, axes

    r, x = axes("r x")
    X, b, c = array("X", r, x), array("b", x), array("c", r)
    return Diagram("broadcast_chain", ((X * b).named("P") + c).named("Y"))


def _row_l2():
    from napkin.diagrams import Diagram, array, axes, map_fn, sum_over

    r, x = axes("r x")
    return Diagram("row_l2", map_fn("sqrt", sum_over(map_fn("square", array("X", r, x)), x, name="ss"), name="N"))


def _transposed_mix():
    """Y[a, b, h] = X[a, b, h]·Z[a, h, b] + W[h, b] − slope(a)·|b − h|: two inputs staged
    through the pointwise map's cross tile."""
    from napkin.diagrams import Diagram, alibi, array, axes, contract

    a, b, h = axes("a b h")
    X, Z, W = array("X", a, b, h), array("Z", a, h, b), array("W", h, b)
    P = contract(X, Z, over=(), out=(a, b, h), name="P")
    return Diagram("transposed_mix", alibi((P + W).named("Q"), "a", "b", "h", name="Y"))


def _skinny_rows():
    """y[b, a] = gelu(Σ_k W[a, k]·x[b, k] + bias[a]): a few vectors by a matrix (a skinny
    product, every b in a thread's registers), maps after it."""
    from napkin.diagrams import Diagram, array, axes, contract, map_fn

    a, b, k = axes("a b k")
    p = contract(array("W", a, k), array("x", b, k), over=k, out=(b, a), name="p")
    return Diagram("skinny_rows", map_fn("gelu", (p + array("bias", a)).named("z"), name="y"))


def _skinny_cols():
    """y[b, a] = Σ_k W[k, a]·x[b, k]: the column kernel's skinny product."""
    from napkin.diagrams import Diagram, array, axes, contract

    a, b, k = axes("a b k")
    return Diagram("skinny_cols", contract(array("W", k, a), array("x", b, k), over=k, out=(b, a), name="y"))


def _two_layouts():
    """Y[a, b] = 2·X[a, b] and Z[b, a] = tanh(X[a, b])·W[b, a]: W read and Z written through the
    cross tile."""
    from napkin.diagrams import Diagram, array, axes, contract, scale, tanh

    a, b = axes("a b")
    X, W = array("X", a, b), array("W", b, a)
    Z = contract(tanh(X, name="t"), W, over=(), out=(b, a), name="Z")
    return Diagram("two_layouts", (scale(X, 2.0, name="Y"), Z))


def _gqa_decode():
    from napkin.diagrams import Diagram, array, axes
    from napkin.diagrams.library import attention_core

    h, j, q, x, d = axes("h j q x d")
    return Diagram("gqa_decode", attention_core(array("Q", h, j, q, d), array("K", h, x, d), array("V", h, x, d)))


def _sum_bh():
    from napkin.diagrams import Diagram, array, axes, sum_over

    b, h, s = axes("b h s")
    return Diagram("sum_bh", sum_over(sum_over(array("X", b, h, s), b, name="S1"), h, name="S"))


def _column_logsumexp():
    from napkin.diagrams import Diagram, array, axes
    from napkin.diagrams.ops import logsumexp

    r, x = axes("r x")
    return Diagram("column_logsumexp", logsumexp(array("X", r, x), r, name="L"))


def _outer_softmax():
    from napkin.diagrams import Diagram, array, axes, softmax

    r, x = axes("r x")
    return Diagram("outer_softmax", softmax(array("X", r, x), r, name="Y"))


def _logsumexp_bs():
    from napkin.diagrams import Diagram, array, axes, exp, map_fn, max_over, sum_over

    b, h, s = axes("b h s")
    X = array("X", b, h, s)
    m = map_fn("zero_inf", max_over(max_over(X, b, name="m1"), s, name="m"), name="c")
    t = sum_over(sum_over(exp(map_fn("sub", X, m, name="d"), name="e"), b, name="t1"), s, name="t")
    return Diagram("logsumexp_bs", map_fn("add", map_fn("log", t, name="lt"), m, name="L"))


def _attention_causal_grad():
    from napkin.diagrams import library

    return library.get("attention_causal").grad(save={"O", "P_lse"})


def _mha_many_heads():
    """Attention woven over a batch axis as well: b x h past grid.y's 65535 folds into grid.z."""
    from napkin.diagrams import Axis, library

    return library.get("mha").weave(Axis("b"), name="mha_b")


def _layernorm_grad():
    from napkin.diagrams import library

    # the backward with its statistics saved (what napkin.torch saves): one row-wise chain kernel
    # whose column reductions (dgamma, dbeta) are added up by the blocks of the same launch
    return library.get("layernorm").grad(save={"N_rstd", "N_mean"})


def _softmax_vjp():
    from napkin.diagrams import Axis, Diagram, array, sum_over

    # softmax's backward given P: two inputs read in two passes, one kept in shared memory
    r, x = Axis("r"), Axis("x")
    P, dP = array("P", r, x), array("dP", r, x)
    return Diagram("softmax_vjp", (P * (dP - sum_over(P * dP, x))).named("dX"))


def _rmsnorm_grad():
    from napkin.diagrams import library

    return library.get("rmsnorm").grad()


def _gemm_row_sum():
    from napkin.diagrams import Diagram, array, axes, contract, sum_over

    a, b, c = axes("a b c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    return Diagram("gemm_row_sum", sum_over(L, c, name="Y"))


def _gemm_row_logsumexp():
    from napkin.diagrams import Diagram, array, axes, contract, logsumexp

    a, b, c = axes("a b c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    return Diagram("gemm_row_logsumexp", logsumexp(L, c, name="Y"))


def _gemm_row_softmax():
    from napkin.diagrams import Diagram, array, axes, contract, softmax

    a, b, c = axes("a b c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    return Diagram("gemm_row_softmax", softmax(L, c, name="P"))


def _rotated_columns(d):
    """The norm backward's column-reduction kernel over rows of odd length on its rotated grid
    (``rowwise.ROTATE_COLUMN_KERNELS``): the inputs here start at the same place in their 16-byte
    lines, so the rotated path runs."""
    from napkin.codegen.lower import lower

    program = lower(d, family="rowwise")
    assert "same_lines" in program.launches[0].source, "the rotated column kernel was not planned"
    return program


def _persistent_walk(d):
    """The Hopper attention kernel's persistent blocks, 5 of them walking 21 causal tiles of
    different lengths: the ring's slots and phases run on from tile to tile, and each tile's
    number goes from the producer to the consumers through shared memory."""
    import dataclasses

    from napkin.codegen.families import attention_wgmma
    from napkin.codegen.families.attention import FAMILY

    cfg = dataclasses.replace(attention_wgmma.configs(64)[0], persistent=True)
    program = attention_wgmma.lower_config(FAMILY, d, cfg)
    (launch,) = program.launches
    return dataclasses.replace(program, launches=(dataclasses.replace(launch, grid=(5, 1, 1)),))


def _persistent_walk_two_stage(d):
    """The d = 128 two-stage loop with one P buffer (K and V released apart), persistent, 5 blocks
    walking causal tiles of different lengths."""
    import dataclasses

    from napkin.codegen.families import attention_wgmma
    from napkin.codegen.families.attention import FAMILY

    cfg = dataclasses.replace(attention_wgmma.configs(128, masked=True)[0], persistent=True)
    assert cfg.overlap and cfg.one_p, cfg
    program = attention_wgmma.lower_config(FAMILY, d, cfg)
    (launch,) = program.launches
    return dataclasses.replace(program, launches=(dataclasses.replace(launch, grid=(5, 1, 1)),))


def _pingpong_176(d):
    """The d = 128 two-stage loop over 176-key chunks with ping-pong between the consumers, one
    tile a block (keys past the last chunk's end zeroed in V before P V)."""
    from napkin.codegen.families import attention_wgmma
    from napkin.codegen.families.attention import FAMILY

    (cfg,) = [c for c in attention_wgmma.configs(128) if c.pingpong]
    return attention_wgmma.lower_config(FAMILY, d, cfg)


def _lowered(d, cfg):
    """The program of contraction configuration ``cfg`` for ``d`` (a tile the planner would not
    take at sizes small enough for the sanitizers)."""
    from napkin.codegen.api import local_arch
    from napkin.codegen.families.contraction import FAMILY

    return FAMILY.lower(d, FAMILY.schedule(d, cfg), local_arch() or "sm_90a")


def _mma_sync_64x64(d):
    """The mma.sync template's 64 x 64 tile at sizes where Hopper's planner takes a small wgmma
    tile: the epilogue of one tile a block, clamped reads at the edges."""
    from napkin.codegen.families.contraction import MMA_CONFIGS, MatmulConfig

    return _lowered(d, MatmulConfig(False, *MMA_CONFIGS[-1]))


def _wgmma_64x64(d):
    """The wgmma template's 64 x 64 tile (one consumer, unsplit) at sizes where Hopper's planner
    takes the mma.sync tiles (a sum of 72: two chunks of 64, the second mostly past the end, and a
    chain of dependent wgmma each, where the mma.sync tile's chunks of 32 waste less): its operand
    views and clipped chunks under the sanitizers."""
    from napkin.codegen.families.contraction import WGMMA_SPLIT_CONFIGS, MatmulConfig

    return _lowered(d, MatmulConfig(False, *WGMMA_SPLIT_CONFIGS[2], wgmma=True))


def _pingpong_wide(d):
    """The ping-pong 128 x 192 tile (192 accumulators a consumer, four staging blocks that go out by
    TMA) on a plain product with more tiles than SMs and edges that are not tile multiples."""
    from napkin.codegen.families.contraction import WGMMA_PINGPONG_CONFIGS, MatmulConfig

    return _lowered(d, MatmulConfig(False, *WGMMA_PINGPONG_CONFIGS[-1], wgmma=True, pingpong=True))


def _swapped(splits, bm=64):
    """The swapped wgmma tile (the matrix on the tile's ``bm`` rows, one consumer a 64 of them, the
    vectors its 8 columns, the tile leaving transposed by TMA, or its split partials transposed
    for the combine)."""
    from dataclasses import replace

    from napkin.codegen.families.contraction import _swap_config, analyze

    return lambda d: _lowered(d, replace(_swap_config(d, analyze(d), "bf16", bm), splits=splits))


def _cluster_split(splits, bm=128, bn=128, swapped=False):
    """A wgmma split sum whose ``splits`` blocks a tile are one thread-block cluster, adding their
    partials in each other's shared memory (block 0 runs the epilogue); ``swapped``: the swapped
    tile of a few vectors by a matrix."""
    from dataclasses import replace

    from napkin.codegen.families.contraction import MatmulConfig, _swap_config, analyze

    def build(d):
        cfg = (_swap_config(d, analyze(d), "bf16") if swapped
               else MatmulConfig(False, bm, bn, 64, 64, bn, 6, wgmma=True))
        return _lowered(d, replace(cfg, splits=splits, cluster_splits=True))

    return build


def _tf32x3_small(d):
    """The fp32 template's 32 x 32 tile (3xTF32): the small tiles a batch of small products takes."""
    from napkin.codegen.families.contraction import TF32X3_SMALL_CONFIGS, MatmulConfig

    return _lowered(d, MatmulConfig(True, *TF32X3_SMALL_CONFIGS[0], tf32x3=True))


@dataclass(frozen=True)
class Case:
    """One sanitizer run: a diagram (a library name or a builder), sizes, dtype and the planner's
    family restriction, there to exercise ``template`` (on the GPUs listed in ``archs``)."""

    template: str
    diagram: str | Callable
    sizes: dict = field(hash=False)
    dtype: str = "bf16"
    family: str | None = None
    archs: tuple[str, ...] = ("sm_80", "sm_90a")
    #: builds the program from the bound diagram itself, for a configuration the planner would not
    #: take at sizes small enough for the sanitizers (persistent blocks made to walk many tiles)
    program: Callable | None = None
    label: str | None = None  # the case's name where the diagram's would not tell it apart

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return self.diagram if isinstance(self.diagram, str) else self.diagram.__name__.strip("_")

    def compile(self, gpu=None):
        """The compiled diagram: the planner's plan (restricted to ``family``), or ``program``'s."""
        from napkin.codegen import compile as napkin_compile
        from napkin.codegen.api import CompiledDiagram, local_arch

        if self.program is None:
            return napkin_compile(self.build(), family=self.family, gpu=gpu)
        return CompiledDiagram(self.program(self.build()), arch=local_arch(), gpu=gpu)

    def build(self):
        from napkin.diagrams import library

        d = library.get(self.diagram) if isinstance(self.diagram, str) else self.diagram()
        return d.with_dtype(self.dtype).bind(self.sizes)


CASES = [
    Case("rowwise.cu.jinja", "softmax", {"r": 5, "x": 1000}, family="rowwise"),
    Case("rowwise.cu.jinja", "layernorm", {"r": 3, "x": 4100}, family="rowwise"),
    # rows of no 16-byte multiple, several a warp: each row's grid rotated to its first 16-byte boundary
    Case("rowwise.cu.jinja", "softmax", {"r": 40, "x": 37}, family="rowwise", label="softmax_rotated_rows"),
    # rows of two values: a row a thread
    Case("rowwise.cu.jinja", "softmax", {"r": 1001, "x": 2}, family="rowwise", label="softmax_tiny_rows"),
    # ... gamma and beta beside them start elsewhere in their 16-byte lines: two lines a chunk, shifted
    Case("rowwise.cu.jinja", "layernorm", {"r": 40, "x": 1001}, family="rowwise", label="layernorm_rotated_rows"),
    Case("rowwise.cu.jinja", "layernorm", {"r": 9, "x": 1001}, dtype="fp32", family="rowwise",
         label="layernorm_rotated_rows_fp32"),
    # the chain kernel: a row of two axes in registers (gamma/beta gathered per element), a row too
    # long for registers, streamed in two passes (the max and the sum of exp(x - max) as one pair,
    # merged over the block), and rows a part of a warp holds (the pair merged by shuffles)
    Case("rowwise.cu.jinja", "group_norm", {"n": 2, "g": 3, "c": 5, "s": 99}, family="rowwise"),
    Case("rowwise.cu.jinja", "log_softmax", {"r": 3, "x": 70001}, family="rowwise"),
    Case("rowwise.cu.jinja", "logsumexp_rows", {"r": 33, "x": 500}, family="rowwise", label="logsumexp_warp_pairs"),
    # ... of no 16-byte multiple: on the grid shifted to the row's 16-byte lines, X copied into shared
    # memory by cp.async before the first pass (bf16; fp32 within a Hopper block's 227 KiB), or read
    # again by every pass (fp32 on an A100: too long)
    Case("rowwise.cu.jinja", _softmax_vjp, {"r": 3, "x": 70001}, family="rowwise", label="softmax_vjp_row_in_smem"),
    Case("rowwise.cu.jinja", "log_softmax", {"r": 3, "x": 50257}, dtype="fp32", family="rowwise",
         label="log_softmax_shifted_fp32"),
    # rows past a Hopper block's shared memory shared by the blocks of a cluster (each keeps its
    # threads' chunks; the pair's round stores into every block's scratch, one cluster barrier):
    # four blocks of 256 threads, and eight (2048 threads a row: a lane folds two warps' pairs)
    Case("rowwise.cu.jinja", "log_softmax", {"r": 3, "x": 130001}, family="rowwise", archs=("sm_90a",),
         label="log_softmax_cluster"),
    Case("rowwise.cu.jinja", "log_softmax", {"r": 3, "x": 151937}, dtype="fp32", family="rowwise",
         archs=("sm_90a",), label="log_softmax_cluster_wide"),
    # column reductions: more row groups than blocks (several a block, the last ragged), a row of no
    # 16-byte multiple; the partials' sum in the kernel (arrival counters, tickets, the reset)
    Case("rowwise.cu.jinja", _layernorm_grad, {"r": 4000, "x": 999}, family="rowwise"),
    # the same on the rotated grid: a slot's rows share one rotation; partials written back to their columns
    Case("rowwise.cu.jinja", _layernorm_grad, {"r": 2000, "x": 999}, family="rowwise", program=_rotated_columns,
         label="layernorm_grad_rotated"),
    # the rmsnorm backward that recomputes rstd (two passes, two sums in one block round) on a row of
    # 5000 (320 threads fitted to it, the register budget cut for two blocks an SM)
    Case("rowwise.cu.jinja", _rmsnorm_grad, {"r": 600, "x": 5000}, family="rowwise"),
    # the layernorm backward on a row of 5000: the budget cut 30 registers under its footprint
    # (ptxas spills 24 bytes on sm_90a)
    Case("rowwise.cu.jinja", _layernorm_grad, {"r": 600, "x": 5000}, family="rowwise", label="layernorm_grad_5000"),
    # two column reductions' partials past 48 KiB: in the launch's dynamic shared memory
    Case("rowwise.cu.jinja", _layernorm_grad, {"r": 300, "x": 8192}, family="rowwise",
         label="layernorm_grad_dynamic_smem"),
    # rows too long for registers: each pass streams the row (the later ones from L2), the column
    # partials in shared memory; a row of 10000 (its last chunks held by some threads only) and of
    # 12000 (three chunks a thread)
    Case("rowwise.cu.jinja", _rmsnorm_grad, {"r": 300, "x": 10000}, family="rowwise",
         label="rmsnorm_grad_streamed"),
    Case("rowwise.cu.jinja", _layernorm_grad, {"r": 200, "x": 12000}, family="rowwise",
         label="layernorm_grad_streamed"),
    # large enough that Hopper's planner takes wgmma + TMA; 333 and 264 are not tile multiples
    Case("matmul_wgmma.cu.jinja", "matmul", {"a": 333, "b": 520, "c": 264}, family="contraction",
         archs=("sm_90a",)),
    # (an epilogue with maps: at 333 x 264 the planner takes mma.sync, whose blocks of one tile are
    # priced alike; 1333 x 2600 is more tiles than SMs and not tile multiples either)
    Case("matmul_wgmma.cu.jinja", "mlp", {"a": 1333, "b": 520, "c": 2600}, family="contraction",
         archs=("sm_90a",)),
    # the wide ping-pong tile: 11 x 14 tiles of 128 x 192 walked by both consumers of each block
    Case("matmul_wgmma.cu.jinja", "matmul", {"a": 1333, "b": 300, "c": 2600}, family="contraction",
         archs=("sm_90a",), program=_pingpong_wide, label="matmul_pingpong_wide"),
    # the swapped tile: 5 vectors by a 1000 x 1000 matrix with a bias and GELU after the product
    # (rows of 1000: a partial tile, a sum that is no whole number of chunks), and split in 2
    Case("matmul_wgmma.cu.jinja", _skinny_rows, {"a": 1000, "b": 5, "k": 1000}, family="contraction",
         archs=("sm_90a",), label="swapped_tile", program=_swapped(1)),
    Case("matmul_wgmma.cu.jinja", _skinny_cols, {"a": 1000, "b": 5, "k": 2000}, family="contraction",
         archs=("sm_90a",), label="swapped_tile_split", program=_swapped(2)),
    Case("matmul_wgmma.cu.jinja", _skinny_rows, {"a": 1000, "b": 5, "k": 1000}, family="contraction",
         archs=("sm_90a",), label="swapped_tile_two_consumers", program=_swapped(1, 128)),
    # split sums over thread-block clusters: the partials added through distributed shared memory
    # (rows and columns that fill no tile, a sum of 41 chunks over 8 blocks: the last share short),
    # an epilogue with a staged residual, and the swapped tile in clusters of 2
    Case("matmul_wgmma.cu.jinja", "matmul", {"a": 200, "b": 2600, "c": 136}, family="contraction",
         archs=("sm_90a",), label="matmul_cluster_split", program=_cluster_split(8)),
    Case("matmul_wgmma.cu.jinja", _gemm_residual, {"a": 333, "b": 2000, "c": 264}, family="contraction",
         archs=("sm_90a",), label="gemm_residual_cluster_split", program=_cluster_split(4, 128, 64)),
    Case("matmul_wgmma.cu.jinja", _skinny_cols, {"a": 1000, "b": 5, "k": 2000}, family="contraction",
         archs=("sm_90a",), label="swapped_tile_cluster_split", program=_cluster_split(2, swapped=True)),
    # a residual copied 64 x 64 at a time into each consumer's staging block (cp.async), read there
    # and overwritten by the results (rows of 264 and 333: partial blocks, zero-filled copies)
    Case("matmul_wgmma.cu.jinja", _gemm_residual, {"a": 333, "b": 520, "c": 264}, family="contraction",
         archs=("sm_90a",)),
    # a sum over (h, d) with W[e, h, d] read through a 3-D tensor map of its own axes ([h][e][d]):
    # the head index is a copy coordinate, and chunks past d = 40 read zeros
    Case("matmul_wgmma.cu.jinja", _merge_heads, {"s": 300, "h": 3, "d": 40, "e": 200}, family="contraction",
         archs=("sm_90a",)),
    # row and column operands read at indices clamped into the output (rows of 1333 and columns
    # of 2600 end inside a tile: the elements past them compute at the last row's and column's)
    Case("matmul_wgmma.cu.jinja", _gemm_row_col, {"a": 1333, "b": 520, "c": 2600}, family="contraction",
         archs=("sm_90a",)),
    # RMSNorm -> linear in one kernel: the A slots rewritten in place (x * gamma) between TMA and
    # wgmma, the rows' mean squares from the same tiles
    Case("matmul_wgmma.cu.jinja", "rmsnorm_linear", {"r": 333, "x": 520, "c": 264}, family="contraction",
         archs=("sm_90a",)),
    # GEMM -> a sum along rows one tile spans (c = 200 of a 256-wide tile: masked columns), one
    # value a row written from the epilogue
    # a row operand in the maps before a row softmax: the last tile's rows past 333 read it at row 332
    Case("matmul_wgmma.cu.jinja", _gemm_row_scale_softmax, {"a": 333, "b": 520, "c": 200}, family="contraction",
         archs=("sm_90a",)),
    Case("matmul_wgmma.cu.jinja", _gemm_row_sum, {"a": 333, "b": 520, "c": 200}, family="contraction",
         archs=("sm_90a",)),
    # GEMM -> a row wider than a tile (1000 columns: 4 tiles, the last partly masked): each block's
    # (max, sum of exp) pairs to the partials, the second launch combines them (a softmax also
    # stores its logits less the tile's max, normalised there in place; 1000 = whole 16-byte pieces, 1001 not)
    Case("matmul_wgmma_rowcombine.cu.jinja", _gemm_row_logsumexp, {"a": 333, "b": 520, "c": 1000},
         family="contraction", archs=("sm_90a",)),
    Case("matmul_wgmma_rowcombine.cu.jinja", _gemm_row_softmax, {"a": 333, "b": 520, "c": 1000},
         family="contraction", archs=("sm_90a",)),
    Case("matmul_wgmma_rowcombine.cu.jinja", _gemm_row_softmax, {"a": 77, "b": 72, "c": 1001},
         family="contraction", archs=("sm_90a",)),
    # batched with a sum of 72 (not whole 64-deep chunks of B[n,b,c]): the mma.sync template (built
    # as such: Hopper's planner takes wgmma, B read through a 3-D map of its own axes), and wgmma
    Case("matmul_mma.cu.jinja", "batched_matmul", {"n": 2, "a": 77, "b": 72, "c": 40}, family="contraction",
         program=_mma_sync_64x64),
    Case("matmul_mma.cu.jinja", "batched_matmul", {"n": 2, "a": 77, "b": 72, "c": 42},
         family="contraction", program=_mma_sync_64x64),  # 84-byte rows, padded first
    Case("matmul_wgmma.cu.jinja", "batched_matmul", {"n": 2, "a": 77, "b": 72, "c": 40}, family="contraction",
         archs=("sm_90a",), label="batched_k72_views", program=_wgmma_64x64),
    # a batch past grid.y's 65535 (it goes on along grid.z; the last slice's blocks past it return)
    Case("matmul_mma.cu.jinja", "batched_matmul", {"n": 70000, "a": 40, "b": 72, "c": 24}, family="contraction",
         program=_mma_sync_64x64, label="batched_grid_fold"),
    Case("attention_fwd.cu.jinja", _mha_many_heads, {"b": 2049, "h": 32, "q": 20, "x": 40, "d": 64},
         family="attention", label="attention_grid_fold"),
    Case("pad_rows.cu.jinja", "matmul", {"a": 77, "b": 71, "c": 42}, family="contraction"),  # copied padded
    Case("matmul_mma.cu.jinja", "mlp", {"a": 65, "b": 72, "c": 136}, family="contraction", program=_mma_sync_64x64),
    # the same on a small wgmma tile (64 x 64, one consumer, unsplit)
    Case("matmul_wgmma.cu.jinja", "mlp", {"a": 65, "b": 72, "c": 136}, family="contraction", archs=("sm_90a",),
         label="mlp_small_tile", program=_wgmma_64x64),
    # an epilogue operand tiled like the output (attention's dS = (dP - D) * P), copied into shared
    # memory a tile at a time after the loop; rows of 200 and 77 that are not tile multiples
    Case("matmul_mma.cu.jinja", _staged_epilogue, {"n": 2, "a": 77, "b": 72, "c": 200}, family="contraction",
         program=_mma_sync_64x64),
    Case("matmul_mma.cu.jinja", _sum_over_h_d, {"h": 3, "a": 77, "d": 72, "c": 40}, family="contraction",
         program=_mma_sync_64x64),
    Case("matmul_simt.cu.jinja", _sum_over_h_d, {"h": 2, "a": 33, "d": 20, "c": 40}, dtype="fp32",
         family="contraction"),
    Case("matmul_combine.cu.jinja", "mlp", {"a": 33, "b": 8192, "c": 40}, family="contraction"),
    # split sums on the wgmma and fp32 templates: partials from the registers, empty last shares
    Case("matmul_wgmma.cu.jinja", "mlp", {"a": 130, "b": 16384, "c": 136}, family="contraction",
         archs=("sm_90a",)),  # (a 64 x 128 tile of one consumer, 14 splits)
    Case("matmul_wgmma.cu.jinja", "matmul", {"a": 200, "b": 20000, "c": 136}, family="contraction",
         archs=("sm_90a",), label="matmul_split_128x64"),  # (two consumers of 64 rows, 22 splits)
    # small tiles (32 rows) for a batch of small products, as the planner takes them: 29 x 40 outputs
    # end inside the tiles, a sum of 72 inside the last chunk
    Case("matmul_mma.cu.jinja", "batched_matmul", {"n": 300, "a": 29, "b": 72, "c": 40}, family="contraction",
         label="batched_small_tiles"),
    Case("matmul_simt.cu.jinja", "batched_matmul", {"n": 300, "a": 29, "b": 72, "c": 40}, dtype="fp32",
         family="contraction", program=_tf32x3_small, label="batched_small_tiles_fp32"),
    Case("matmul_simt.cu.jinja", "mlp", {"a": 65, "b": 20000, "c": 72}, dtype="fp32", family="contraction"),
    Case("matmul_simt.cu.jinja", "matmul", {"a": 77, "b": 72, "c": 40}, dtype="fp32", family="contraction"),
    Case("attention_fwd.cu.jinja", "attention_causal", {"h": 2, "q": 77, "x": 77, "d": 64}, family="attention"),
    Case("attention_fwd.cu.jinja", "gqa", {"h": 1, "j": 2, "q": 45, "x": 45, "d": 128}, family="attention"),
    # head dims whose rows are no whole number of 16-byte pieces a thread (flat K/V loads)
    Case("attention_fwd.cu.jinja", "attention_causal", {"h": 2, "q": 77, "x": 99, "d": 96}, family="attention"),
    # decode: GQA's query heads packed into one tile, x split over blocks, their partials combined
    # by the last split to arrive (d = 80: flat loads; three query rows wrap the tile's packed rows)
    # the Hopper template: TMA ring, wgmma, causal block skipping, lengths that are not tile multiples
    Case("attention_wgmma.cu.jinja", "attention_causal", {"h": 4, "q": 1000, "x": 777, "d": 64},
         family="attention", archs=("sm_90a",)),  # (two heads: the h200 profile takes mma.sync tiles)
    Case("attention_wgmma.cu.jinja", "gqa", {"h": 1, "j": 2, "q": 300, "x": 129, "d": 128},
         family="attention", archs=("sm_90a",)),
    Case("attention_wgmma.cu.jinja", "attention_causal", {"h": 3, "q": 777, "x": 1000, "d": 64},
         family="attention", archs=("sm_90a",), program=_persistent_walk, label="persistent_walk"),
    Case("attention_wgmma.cu.jinja", "attention_causal", {"h": 3, "q": 777, "x": 1000, "d": 128},
         family="attention", archs=("sm_90a",), program=_persistent_walk_two_stage,
         label="persistent_walk_two_stage"),
    Case("attention_wgmma.cu.jinja", "mha", {"h": 2, "q": 300, "x": 1000, "d": 128},
         family="attention", archs=("sm_90a",), program=_pingpong_176, label="attention_pingpong_176"),
    # fp8 (e4m3) attention on Hopper: the V-transpose pre-pass and the 8-bit wgmma kernel, causal,
    # lengths that are not multiples of the 128-key chunk (the pre-pass writes zeros past x)
    Case("attention_wgmma_fp8.cu.jinja", "attention_causal", {"h": 2, "q": 1000, "x": 777, "d": 128},
         dtype="fp8", family="attention", archs=("sm_90a",)),
    Case("attention_fp8_vt.cu.jinja", "mha", {"h": 2, "q": 300, "x": 1000, "d": 256},
         dtype="fp8", family="attention", archs=("sm_90a",)),
    # unmasked scores at d = 128: the two-stage loop with ping-pong over a ring of five stages
    Case("attention_wgmma_fp8.cu.jinja", "mha", {"h": 2, "q": 1000, "x": 777, "d": 128},
         dtype="fp8", family="attention", archs=("sm_90a",), label="attention_fp8_pingpong"),
    # GQA packing on the Hopper kernel: g query heads a tile, d=96 padded to 128 by TMA's zero fill
    Case("attention_wgmma.cu.jinja", "gqa", {"h": 2, "j": 4, "q": 1500, "x": 1500, "d": 96},
         family="attention", archs=("sm_90a",)),
    # decode (split x, the last split of a tile to arrive combining the partials) as planned
    Case("attention_fwd.cu.jinja", _gqa_decode, {"h": 2, "j": 4, "q": 3, "x": 9000, "d": 80},
         family="attention"),
    Case("attention_fwd.cu.jinja", "mha", {"h": 2, "q": 1, "x": 5000, "d": 128}, family="attention"),
    # attention's backward: the D pre-pass, the kernel (dQ atomics, causal tiles skipped) and the dQ
    # conversion, with lengths that are not tile multiples
    Case("attention_bwd.cu.jinja", _attention_causal_grad, {"h": 2, "q": 77, "x": 99, "d": 64},
         family="attention_bwd"),
    # its Hopper kernel (TMA ring, wgmma, the dS^T tile in shared memory, dQ reductions)
    Case("attention_bwd_wgmma.cu.jinja", _attention_causal_grad, {"h": 4, "q": 1000, "x": 777, "d": 128},
         family="attention_bwd", archs=("sm_90a",)),
    Case("fallback_contract.cu.jinja", "transformer_block", {"q": 9, "e": 16, "h": 2, "d": 8, "f": 24},
         dtype="fp32", family="fallback"),
    Case("fallback_row.cu.jinja", "layernorm", {"r": 3, "x": 100}, dtype="fp32", family="fallback"),
    Case("fallback_map.cu.jinja", "layernorm", {"r": 3, "x": 100}, dtype="fp32", family="fallback"),
    Case("fallback_reduce.cu.jinja", _column_sum, {"r": 37, "x": 1000}, family="fallback"),
    # pointwise: a chain with rows of an odd length (scalar accesses), a vectorised chain with
    # broadcast inputs, a column sum and a row norm split over blocks (partials and the combining
    # launch), a sum over two non-last axes
    Case("pointwise.cu.jinja", _sigmoid_chain, {"r": 7, "x": 4095}, family="pointwise"),
    Case("pointwise.cu.jinja", _broadcast_chain, {"r": 33, "x": 1024}, dtype="fp32", family="pointwise"),
    Case("pointwise.cu.jinja", _column_sum, {"r": 4096, "x": 1000}, family="pointwise"),
    Case("pointwise.cu.jinja", _row_l2, {"r": 3, "x": 100003}, family="pointwise"),
    # a matrix-vector product over rows of odd length: W's rows aligned, x read value by value
    Case("pointwise.cu.jinja", "matvec", {"a": 37, "b": 1001}, family="pointwise", label="matvec_odd_rows"),
    Case("pointwise.cu.jinja", _sum_bh, {"b": 9, "h": 37, "s": 96}, family="pointwise"),
    # the pair (max, sum of exp(x − max)) in one pass: over columns split over blocks (a pair of
    # partials), a softmax over the outer axis (the pair, then the output's map), over two axes
    # of which the vector axis is one (row kernel)
    Case("pointwise.cu.jinja", _column_logsumexp, {"r": 4096, "x": 1000}, family="pointwise"),
    # column reductions along a kept axis of no multiple of VEC (padded lines; the last vector of each
    # partial, its 16-byte lines read whole): one block a kept tile, and a split one
    Case("pointwise.cu.jinja", _column_sum, {"r": 300, "x": 1001}, family="pointwise", label="padded_columns"),
    Case("pointwise.cu.jinja", _column_sum, {"r": 8192, "x": 1001}, family="pointwise",
         label="padded_columns_split"),
    Case("pointwise.cu.jinja", _outer_softmax, {"r": 300, "x": 72}),
    # a map with transposed inputs: staged through shared memory a cross tile at a time (phase 1,
    # a barrier, phase 2), sizes that fill no whole tile, an odd cross axis
    Case("pointwise.cu.jinja", _transposed_mix, {"a": 2, "b": 77, "h": 40}, family="pointwise",
         label="cross_tile"),
    Case("pointwise.cu.jinja", _transposed_mix, {"a": 3, "b": 1001, "h": 24}, dtype="fp32", family="pointwise",
         label="cross_tile_fp32"),
    # ... an output written through it (phase 3), rows of an odd cross axis read shifted
    Case("pointwise.cu.jinja", _two_layouts, {"a": 1001, "b": 64}, family="pointwise", label="cross_tile_out"),
    Case("pointwise.cu.jinja", _logsumexp_bs, {"b": 9, "h": 5, "s": 1000}, family="pointwise"),
    # skinny products: a few vectors by a matrix, every b in each thread's registers; rows with
    # maps after them, and columns of a long sum split over blocks (REP partials a split)
    Case("pointwise.cu.jinja", _skinny_rows, {"a": 1000, "b": 5, "k": 1024}, dtype="fp32", family="pointwise",
         label="skinny_rows"),
    Case("pointwise.cu.jinja", _skinny_cols, {"a": 64, "b": 7, "k": 65536}, family="pointwise",
         label="skinny_cols_split"),
    # a reduction to one value split over many blocks: the last combines the partials a warp at a time
    Case("pointwise.cu.jinja", _logsumexp_all, {"r": 64, "x": 100003}, family="pointwise"),
    # the planner's own choice: several kernels of several families, HBM buffers between them
    Case("rowwise.cu.jinja", "transformer_block", {"q": 77, "e": 72, "h": 2, "d": 64, "f": 136}),
]


#: Relative error (norm of the difference over the reference's) a case's outputs must stay under:
#: fp8 is the attention_fp8 family's stated 5 % (the e4m3 rounding of O alone is about 3.6 %).
TOLERANCE = {"fp32": 1e-5, "fp8": 5e-2}


def target(arch: str) -> str:
    """The code target a device's arch gets: Hopper's sm_90a templates, or Ampere's sm_80 ones."""
    return "sm_90a" if arch.startswith("sm_9") else "sm_80"


def templates_of(compiled) -> list[str]:
    """The templates of a compiled diagram's launches, in launch order."""
    return [launch.template for launch in compiled.launches]


def run_case(case: Case) -> list[tuple[str, float, bool]]:
    """Compile, run and check one case; (output, relative error, ok) per output."""
    import torch

    from napkin.codegen.verify import boundary_reference
    from napkin.diagrams.reference import random_inputs
    from napkin.dtypes import torch_dtype

    d = case.build()
    k = case.compile()
    used = templates_of(k)
    if case.template not in used:
        raise AssertionError(f"the case is there for {case.template}, but the plan uses {sorted(set(used))}")
    ins = random_inputs(d, device="cuda", seed=1)
    # the kernels may store an input in another dtype than the diagram's (a saved log-sum-exp in fp32)
    args = [ins[n].to(torch_dtype(k._dtypes[n])) for n in d.input_names]
    got = k(*args, out=k.empty_outputs("cuda", float("nan")))
    torch.cuda.synchronize()
    got = got if isinstance(got, tuple) else (got,)
    if k.plan is not None and len(k.plan.kernels) > 1:  # a case's own program has no plan
        # several kernels pass rounded intermediates through HBM: judge against the reference
        # rounded at the same boundaries
        ref = boundary_reference(k.plan, dict(zip(d.input_names, args)))
    else:
        ref = d.reference({n: a.double().cpu() for n, a in zip(d.input_names, args)}, dtype=torch.float64)
    rows = []
    for n, g in zip(d.output_names, got):
        r = ref[n].cpu()
        err = float((g.double().cpu() - r).norm() / r.norm())
        ok = err < TOLERANCE.get(case.dtype, 2e-2) and bool(torch.isfinite(g.float().cpu()).all())  # fp8 has no isfinite
        rows.append((n, err, ok))
    return rows


def _picked(case: Case, only: list[str], skip: list[str]) -> bool:
    """Whether ``case`` runs: its template or name holds one of ``only`` (when given) and none of ``skip``."""
    text = f"{case.template} {case.name}"
    return (not only or any(t in text for t in only)) and not any(t in text for t in skip)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from napkin.kernels.compile import detect_arch

    ap = argparse.ArgumentParser(description="one generated kernel of every template at edge shapes")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="run the cases whose template or diagram name contains TEXT (repeatable)")
    ap.add_argument("--skip", action="append", default=[], metavar="TEXT",
                    help="leave out the cases whose template or diagram name contains TEXT (repeatable)")
    a = ap.parse_args(argv)
    arch = detect_arch()
    failures = runs = 0
    for case in CASES:
        if target(arch) not in case.archs or not _picked(case, a.only, a.skip):
            continue
        runs += 1
        label = f"{case.template:26s} {case.name:18s} {case.dtype:5s}"
        try:
            for n, err, ok in run_case(case):
                print(f"{label} {n}: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
                failures += not ok
        except Exception as e:  # a case that cannot run is a failure, reported, not a crash
            print(f"{label} ERROR {type(e).__name__}: {str(e)[:300]}")
            failures += 1
    print(f"{runs} cases on {arch}, {failures} failed")
    if not runs:
        print("no case matched --only/--skip")
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
