"""The wgmma contraction's epilogue reads and its ping-pong offer.

- CLAMPED: the maps run at indices clamped into the output, without a branch around the reads,
  where no operand shaped like the output is read per element and a consumer holding two 64-row
  pieces does not read both a row and a column operand (those spill). CPU (which kernels clamp),
  nvcc (every wgmma configuration builds these epilogues without spills), GPU (odd sizes against
  float64, outputs NaN-poisoned by ``verify``).
- A ping-pong configuration is not offered where its work items fit one a block (a consumer would
  idle); the cooperative configuration of the same tile is (CPU).
- The split sum's partials leave as 8-byte stores where the rows allow (GPU: odd and even widths).
- A row reduction's maps read the rows of its last tile past M at the last row (CPU, GPU).
- The small tiles (64 x 128, 128 x 64, 64 x 64) are offered unsplit where 128 x 128 tiles leave
  most SMs idle (CPU, GPU odd sizes).
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.contraction import (FAMILY, WGMMA_CONFIGS, WGMMA_PINGPONG_CONFIGS,
                                                 WGMMA_SPLIT_CONFIGS, MatmulConfig, _pingpong_idles, _wide_pingpong,
                                                 analyze)
from napkin.diagrams import Axis, Diagram, array, contract, gelu, library


def epi(kind: str, batch: bool = False) -> Diagram:
    """Y = maps(Σ_b A[a,b]·B[b,c]) with the operands ``kind`` names (over an optional batch n)."""
    n, a, b, c = Axis("n"), Axis("a"), Axis("b"), Axis("c")
    lead = (n,) if batch else ()
    A, B = array("A", *lead, a, b), array("B", *lead, b, c)
    r, bias = array("r", *lead, a), array("bias", c)
    S = contract(A, B, over=b, out=(*lead, a, c), name="S")
    if kind == "row":
        return Diagram("row", (S / r).named("Y"))
    if kind == "row_col_gelu":
        return Diagram("row_col_gelu", gelu(S / r + bias, name="Y"))
    if kind == "row_col_residual":
        return Diagram("row_col_residual", (S * r + bias + array("R", *lead, a, c)).named("Y"))
    if kind == "two_residuals":
        return Diagram("two_residuals", (S * r + array("R", *lead, a, c) + array("Q", *lead, a, c)).named("Y"))
    raise ValueError(kind)


SIZES = dict(n=2, a=300, b=136, c=200)
#: every configuration an epilogue may run on (the wide ping-pong tile runs plain products only:
#: its refusal of an epilogue is tested in test_wgmma_persistent.py)
CONFIGS = ([MatmulConfig(False, *c, wgmma=True) for c in WGMMA_CONFIGS]
           + [cfg for cfg in (MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS)
              if not _wide_pingpong(cfg)])


def _id(c: MatmulConfig) -> str:
    return f"{c.BM}x{c.BN}-w{c.WM}{'-pp' if c.pingpong else ''}"


def source(d: Diagram, cfg: MatmulConfig, sizes=SIZES) -> str:
    bd = d.with_dtype("bf16").bind(**{k: v for k, v in sizes.items() if k in d.axes})
    return FAMILY.lower(bd, FAMILY.schedule(bd, cfg), "sm_90a").launches[0].source


def clamped(src: str) -> bool:
    return "const int erow = min(" in src


# ---------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_a_row_operand_is_read_at_clamped_indices_on_every_configuration(cfg):
    src = source(epi("row"), cfg)
    assert clamped(src) and "in_row &&" not in src
    assert "x_r[" in src


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_row_and_column_operands_clamp_only_on_one_64_row_piece_a_consumer(cfg):
    src = source(epi("row_col_gelu"), cfg)
    assert clamped(src) == (cfg.WM == 64)
    if cfg.WM != 64:
        assert "in_row &&" in src  # the branches keep the column values from staying live


def test_an_operand_shaped_like_the_output_read_per_element_keeps_the_branches():
    # the persistent kernel stages the first (R); the second (Q) is read per element
    src = source(epi("two_residuals"), CONFIGS[3])
    assert "load_tile_async<T, 64, 64, 128, true>" in src
    assert not clamped(src) and "in_row &&" in src
    # with only the staged one, the indices are clamped
    assert clamped(source(epi("row_col_residual"), CONFIGS[3]))


def test_a_batched_row_operand_clamps_its_row_not_its_batch():
    src = source(epi("row", batch=True), CONFIGS[3], sizes=dict(SIZES, b=128))
    assert clamped(src)


def row_reduced(kind: str) -> Diagram:
    """A row reduction of the product after maps that read a row operand or a tile operand."""
    from napkin.diagrams import softmax, sum_over

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    S = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="S")
    if kind == "softmax_row":
        return Diagram("softmax_row", softmax((S * array("r", a)).named("L"), c, name="P"))
    return Diagram("sum_residual", sum_over((S + array("R", a, c)).named("L"), c, name="Y"))


@pytest.mark.parametrize("kind", ["softmax_row", "sum_residual"])
def test_a_row_reduction_reads_rows_past_the_output_at_the_last_row(kind):
    """The row-reduction kernel's maps run on the rows of the last tile past M too (their values
    are reduced, never stored): their operands are read at the last row, not past the array."""
    bd = row_reduced(kind).with_dtype("bf16").bind(a=333, b=520, c=200)
    (launch,) = FAMILY.lower(bd, FAMILY.candidates(bd, "h100", "bf16")[0], "sm_90a").launches
    assert launch.template == "matmul_wgmma.cu.jinja" and "RED" in launch.source
    assert "epilogue(v, min(grow, M - 1), gcol)" in launch.source
    assert "epilogue(v, grow, gcol)" not in launch.source


def _offered(d: Diagram, sizes: dict, gpu: str = "h100") -> list[MatmulConfig]:
    bd = d.with_dtype("bf16").bind(**sizes)
    p = analyze(bd)
    return [FAMILY.config_of(p, s) for s in FAMILY.candidates(bd, gpu=gpu, dtype="bf16")]


def test_ping_pong_is_not_offered_where_a_block_gets_one_tile():
    small = _offered(library.get("matmul"), dict(a=4096, b=128, c=128))  # 32 tiles of 128 x 128
    assert any(c.wgmma and not c.pingpong and (c.BM, c.BN) == (128, 128) for c in small)
    assert not any(c.pingpong for c in small)
    large = _offered(library.get("matmul"), dict(a=4096, b=4096, c=4096))  # 1024 tiles
    assert any(c.pingpong for c in large)


def test_small_tiles_are_offered_unsplit_only_where_128_tiles_leave_most_sms_idle():
    small = {(c.BM, c.BN) for c in (MatmulConfig(False, *x, wgmma=True) for x in WGMMA_SPLIT_CONFIGS)}
    few = _offered(library.get("matmul"), dict(a=512, b=1024, c=1024))  # 32 tiles of 128 x 128
    assert small <= {(c.BM, c.BN) for c in few if c.wgmma and c.splits == 1}
    many = _offered(library.get("matmul"), dict(a=2048, b=1024, c=2048))  # 256 tiles
    assert not small & {(c.BM, c.BN) for c in many if c.wgmma and c.splits == 1}


def test_the_idle_rule_counts_tiles_batch_and_splits():
    pp = MatmulConfig(False, *WGMMA_PINGPONG_CONFIGS[0], wgmma=True, pingpong=True)
    assert (pp.BM, pp.BN) == (128, 128)
    d = epi("row", batch=True).with_dtype("bf16")
    # 2 x 8 x 8 = 128 tiles fit 132 SMs one a block; 3 x 8 x 8 = 192 do not
    assert _pingpong_idles(d.bind(n=2, a=1024, b=64, c=1024), analyze(d.bind(n=2, a=1024, b=64, c=1024)), pp, "h100")
    d3 = d.bind(n=3, a=1024, b=64, c=1024)
    assert not _pingpong_idles(d3, analyze(d3), pp, "h100")
    d1 = d.bind(n=1, a=1024, b=64, c=1024)
    assert _pingpong_idles(d1, analyze(d1), pp, "h100")
    from dataclasses import replace
    assert not _pingpong_idles(d1, analyze(d1), replace(pp, splits=3), "h100")  # 192 items
    coop = MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True)
    assert not _pingpong_idles(d1, analyze(d1), coop, "h100")


# ---------------------------------------------------------------------------- nvcc

@pytest.mark.nvcc
@pytest.mark.parametrize("kind", ["row_col_gelu", "row_col_residual"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_clamped_epilogues_build_without_spills(cfg, kind):
    from napkin.kernels.nvcc import nvcc_compile

    d = epi(kind)
    bd = d.with_dtype("bf16").bind(**{k: v for k, v in SIZES.items() if k in d.axes})
    launch = FAMILY.lower(bd, FAMILY.schedule(bd, cfg), "sm_90a").launches[0]
    usage = nvcc_compile(launch.source, "sm_90a")[launch.name]
    assert not usage.spills and usage.stack_bytes == 0, usage


# ---------------------------------------------------------------------------- GPU

def _hopper():
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma template needs an sm_90 GPU")


def _check(d: Diagram, shape: dict, cfg: MatmulConfig | None = None, dtype: str = "bf16"):
    from napkin.codegen.verify import verify

    bd = d.with_dtype(dtype).bind(**shape)
    sched = FAMILY.schedule(bd, cfg) if cfg is not None else None
    report = verify(d, dtype=dtype, shapes=[shape], family="contraction", schedule=sched)
    print(report)
    assert report.ok, str(report)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
@pytest.mark.parametrize("kind", ["row", "row_col_gelu", "row_col_residual"])
def test_gpu_clamped_epilogues_at_odd_sizes(cfg, kind):
    """Rows and columns past the tile edges (the clamped elements are computed, never stored), a
    tile larger than the problem, a batch whose row operand moves with it."""
    _hopper()
    for shape in (dict(a=77, b=40, c=130), dict(a=300, b=136, c=200), dict(a=45, b=64, c=24)):
        _check(epi(kind), shape, cfg)
    _check(epi("row", batch=True), dict(n=3, a=130, b=64, c=72), cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["softmax_row", "sum_residual"])
def test_gpu_row_reductions_with_row_and_tile_operands_at_odd_rows(kind):
    _hopper()
    for shape in (dict(a=333, b=520, c=200), dict(a=77, b=64, c=130)):
        _check(row_reduced(kind), shape)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", WGMMA_SPLIT_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_gpu_small_tiles_unsplit(cfg):
    """The small wgmma tiles as one-share kernels: odd sizes, an epilogue with row, column and
    tile operands, a batch."""
    _hopper()
    c = MatmulConfig(False, *cfg, wgmma=True)
    for d, shape in ((library.get("mlp"), dict(a=300, b=1024, c=136)), (epi("row_col_residual"), dict(a=77, b=40, c=130)),
                     (library.get("batched_matmul"), dict(n=3, a=77, b=128, c=40)), (library.get("matmul"), dict(a=45, b=64, c=24))):
        _check(d, shape, c)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [136, 137, 45])
def test_gpu_split_partials_at_even_and_odd_widths(c):
    """The split sum's partial tile: 8-byte stores at an even row width, 4-byte ones at an odd."""
    _hopper()
    d = library.get("mlp")
    shape = dict(a=200, b=2048, c=c)
    for splits in (2, 5):
        _check(d, shape, MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True, splits=splits))


# ---------------------------------------------------------------------------- the model's steps

def test_a_wgmma_kernel_reports_no_step_latency_split_or_not():
    """The producer warp runs STAGES chunks ahead: no wgmma kernel's loop step waits on its own
    load (the split sums said so before; the unsplit kernels now too); mma.sync keeps its steps."""
    from napkin.codegen import select
    from napkin.perfmodel.predict import prepare_schedule

    d = library.get("matmul").with_dtype("bf16").bind(a=1024, b=4096, c=1024)
    p = analyze(d)
    seen = set()
    for s in FAMILY.candidates(d, "h100", "bf16"):
        cfg = FAMILY.config_of(p, s)
        shape = select.launch_shape(d, FAMILY, s, "h100")
        steps = prepare_schedule(s.padded_view(), "h100", launch=shape).kernels[0].launch.stream_steps
        if cfg.wgmma:
            assert steps == 0, cfg
        elif cfg.splits == 1:
            assert steps == 4096 // cfg.BK, (cfg, steps)  # (filled from the cost: one a chunk)
        seen.add(cfg.wgmma)
    assert seen == {True, False}


def test_a_small_output_over_a_moderate_sum_takes_a_small_tile_unsplit():
    """1024 x 4096 x 1024: 64 x 128-class tiles unsplit (measured 15.2-15.9 us of kernel on an
    H100 and an H200) rather than 128 x 128 in 2 splits and a combining launch (21.2-21.5)."""
    from napkin.codegen.planner import derive

    for gpu in ("h100", "h200"):
        k = derive(library.get("matmul"), gpu, "bf16", sizes=dict(a=1024, b=4096, c=1024), explain=False).plan.kernels[0]
        o = k.kernel.options
        assert o.engine == "wgmma" and not o.splits, o
        rel = {(r.axis, r.level): r.size for r in k.kernel.relabels}
        assert rel[("a", "SMEM")] * rel[("c", "SMEM")] < 128 * 128, rel
