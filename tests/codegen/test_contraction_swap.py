"""The swapped wgmma tile (``swap_ab``): a few vectors by a matrix run with the matrix on the tile's
64 rows and the vectors on its 8 to 64 columns, the output tile leaving transposed.

CPU tests: which products may swap and why not, the candidates the planner sees, the schedule's
option and its round trip through a plan, the lowered kernels (the transposed TMA store, the
split's transposed partials and the unswapped combine), the errors for schedules the template
cannot build, and (marked ``nvcc``) builds for sm_90a without spills. The GPU checks are in
``test_contraction_swap_gpu.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from napkin.cli_common import load
from napkin.codegen.families.contraction import (FAMILY, SWAP_MAX_STAGES, SWAP_WIDTHS, MatmulConfig, _swap_config,
                                                 analyze, problem_of, swap_problem, swap_reason)
from napkin.diagrams import Axis, Diagram, array, contract, library
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import KernelOptions

try:
    from . import skinny_diagrams as sd
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    import skinny_diagrams as sd


def _bound(build, **sizes):
    return build().with_dtype("bf16").bind(**sizes)


def _swapped(d, splits=1):
    return FAMILY.schedule(d, replace(_swap_config(d, analyze(d), "bf16"), splits=splits))


def test_the_swapped_problem_trades_the_operands_and_their_axes():
    d = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    p = analyze(d)
    q = swap_problem(p)
    assert (q.A, q.B, q.a, q.c, q.b) == (p.B, p.A, p.c, p.a, p.b)
    assert (q.a_kmajor, q.b_kmajor, q.y_t, p.y_t) == (p.b_kmajor, p.a_kmajor, True, False)


@pytest.mark.parametrize("build,sizes,why", [
    (sd.linear_rows, dict(a=4096, b=65, k=4096), "more than 64 rows"),
    (sd.linear_rows, dict(a=4095, b=4, k=4096), "not a multiple of 16 bytes"),
    (sd.linear_rows, dict(a=64, b=4, k=4096), "fills no 64-row tile"),
    (lambda: Diagram("vectors_k_outer", contract(array("W", Axis("a"), Axis("k")), array("x", Axis("k"), Axis("b")),
                                                 over=Axis("k"), out=(Axis("b"), Axis("a")), name="y")),
     dict(a=2048, b=6, k=1000), "sum's axis 'k' last"),
], ids=["rows", "unaligned-output", "small-matrix", "vectors-k-outer"])
def test_what_may_not_swap_says_why(build, sizes, why):
    d = _bound(build, **sizes)
    assert why in swap_reason(d, analyze(d))


def test_a_dual_sum_or_a_row_reduction_keeps_its_orientation():
    for name, sizes in (("gemm_softmax", dict(a=8, b=256, c=1024)),):
        d = library.get(name).with_dtype("bf16").bind(**sizes)
        assert "row reduction" in swap_reason(d, analyze(d))


def test_thin_products_on_hopper_are_offered_the_swapped_tile():
    d = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    swapped = [s for s in FAMILY.candidates(d, "h200", "bf16") if s.kernels[0].options.swap_ab]
    assert swapped
    got = {(c.BM, c.stages) for c in (FAMILY.config_of(problem_of(d, s), s) for s in swapped)
           if (c.swap, c.WM, c.BN) == (True, 64, 8)}
    assert got == {(64, SWAP_MAX_STAGES), (128, 12)}  # one consumer, or two sharing the vectors' chunk
    # rows past the bound, or a GPU without wgmma, keep the usual orientation
    wide = _bound(sd.linear_rows, a=4096, b=128, k=4096)
    assert not any(s.kernels[0].options.swap_ab for s in FAMILY.candidates(wide, "h200", "bf16"))
    assert not any(s.kernels[0].options.swap_ab for s in FAMILY.candidates(d, "a100-80gb", "bf16"))


@pytest.mark.parametrize("rows,width", [(1, 8), (8, 8), (9, 16), (24, 32), (33, 64), (64, 64)])
def test_the_tile_is_as_wide_as_the_rows_need(rows, width):
    d = _bound(sd.linear_rows, a=1024, b=rows, k=512)
    cfg = _swap_config(d, analyze(d), "bf16")
    assert cfg.BN == width and width in SWAP_WIDTHS
    assert cfg.smem_bytes(swap_problem(analyze(d)), 2) <= 227 * 1024


def test_the_option_travels_with_the_schedule_and_the_plan():
    from napkin.codegen import compile as napkin_compile
    from napkin.perfmodel.plan import Plan

    assert KernelOptions.value_of("swap_ab", "True") is True
    assert KernelOptions.from_dict(KernelOptions(engine="wgmma", swap_ab=True).to_dict()).swap_ab is True
    d = _bound(sd.linear_cols, a=8192, b=4, k=4096)
    cd = napkin_compile(sd.linear_cols(), sizes=dict(a=8192, b=4, k=4096), dtype="bf16", gpu="h200",
                        schedule=_swapped(d))
    plan = cd.plan
    again = Plan.from_dict(plan.diagram, plan.to_dict())
    assert again.kernels[0].kernel.options.swap_ab is True
    assert any(r.axis == "a" and r.size == 64 and r.level == "SMEM" for r in again.kernels[0].kernel.relabels)


def test_the_kernel_leaves_transposed_by_tma():
    d = _bound(sd.linear_rows, a=8192, b=4, k=4096)
    (k,) = FAMILY.lower(d, _swapped(d), "sm_90a").launches
    t = dict(k.tunables)
    assert (t["BM"], t["BN"], t["swap_ab"], t["tma_store"]) == (64, 8, True, 1)
    assert "Y_T = true" in k.source and "_swap_" in k.name
    maps = {a.name: a.value for a in k.args if a.kind == "tmap"}
    assert maps == {"W": (64, 64), "x": (64, 8), "y": (64, 8)}  # W's rows, the vectors, [vectors][a] blocks
    assert k.grid == (128, 1, 1)  # 8192 / 64 tiles, one a block


def test_a_batch_leaves_through_a_3d_map():
    d = _bound(sd.batched_two_small, n=3, a=336, b=2, c=3, k=256)
    (k,) = FAMILY.lower(d, _swapped(d), "sm_90a").launches
    assert {a.name: a.value for a in k.args if a.kind == "tmap"}["y"] == (64, 8, 1)
    assert "tma_store_3d(&tmY, sEb, r0, c0, c.zb)" in k.source


def test_a_split_writes_transposed_partials_for_the_unswapped_combine():
    d = _bound(sd.linear_cols, a=4096, b=4, k=11008)
    prog = FAMILY.lower(d, _swapped(d, splits=4), "sm_90a")
    main, combine = prog.launches
    assert combine.template == "matmul_combine.cu.jinja"
    (ws,) = prog.buffers
    assert ws.shape == (4, 1, 4, 4096)  # [split][batch][b][a]: as the output is stored
    assert "W[static_cast<long long>(gcol) * M + grow]" in main.source
    assert "b -> M (rows)" in combine.source  # the combine is the unswapped product's


@pytest.mark.parametrize("change,why", [
    (dict(BN=128, WN=128), "swapped operands take"),
    (dict(BM=256), "one or two consumer warpgroups of 64 rows"),
    (dict(stages=SWAP_MAX_STAGES + 1), "stages must be 2 to"),
], ids=["wide", "four-consumers", "stages"])
def test_schedules_the_template_cannot_build_are_refused(change, why):
    d = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    cfg = replace(_swap_config(d, analyze(d), "bf16"), **change)
    with pytest.raises(CodegenError, match=why):
        FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a")


def test_a_swap_the_diagram_does_not_allow_is_refused():
    thin = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    wide = _bound(sd.linear_rows, a=4096, b=128, k=4096)
    s = _swapped(thin)
    s = s.replace(diagram=wide)
    with pytest.raises(CodegenError, match="swaps the operands .* more than 64 rows"):
        FAMILY.lower(wide, s, "sm_90a")


def test_the_planner_swaps_a_few_vectors_by_a_long_matrix():
    """H200, bf16, 4 vectors by W[k, a] at k = 4096, a = 8192 (the held-out
    ``batched_matvec_transposed``): the 64 x 128 tile with the vectors on its rows ran 29.4 us a
    call, the swapped 64 x 8 tile 22.2 (``benchmarks/results/nvidia-h200/swap_ab_s28.txt``)."""
    from napkin.codegen import compile as napkin_compile

    a, b, k = Axis("a"), Axis("b"), Axis("k")
    y = contract(array("W", k, a), array("x", b, k), over=k, out=(b, a), name="y")
    cd = napkin_compile(Diagram("matvec_t", y), sizes=dict(a=8192, b=4, k=4096), dtype="bf16", gpu="h200")
    (pk,) = cd.plan.kernels
    assert pk.kernel.options.swap_ab is True


@pytest.mark.nvcc
@pytest.mark.parametrize("build,sizes,splits", sd.SWAP_CASES, ids=[sd.case_id(c) for c in sd.SWAP_CASES])
@pytest.mark.parametrize("bm", [64, 128])
def test_swapped_kernels_build_without_spills(build, sizes, splits, bm):
    from napkin.kernels.nvcc import nvcc_compile

    d = _bound(build, **sizes)
    cfg = replace(_swap_config(d, analyze(d), "bf16", bm), splits=splits)
    for launch in FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a").launches:
        k = nvcc_compile(launch.source, "sm_90a")[launch.name]
        assert k.spill_stores == 0 and k.spill_loads == 0, (launch.name, k)
        if launch.model_regs_per_thread:
            assert k.registers <= 240


def test_mma_sync_schedules_cannot_swap():
    d = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    s = _swapped(d)
    k = s.kernels[0]
    s = s.replace(kernels=(k.replace(options=replace(k.options, engine="mma.sync")),))
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.config_of(problem_of(d, s), s)


def test_a_configuration_says_it_is_swapped():
    cfg = MatmulConfig(False, 64, 8, 64, 64, 8, 16, wgmma=True, swap=True)
    assert cfg.options().swap_ab is True and MatmulConfig(False, 64, 64, 64, 64, 64, 8, wgmma=True).options().swap_ab is None
    assert "swap" not in repr(cfg)  # (the repr names kernels; a swapped kernel's own name says it)


def test_a_hand_written_swapped_schedule_without_stages_takes_the_deepest_ring():
    d = _bound(sd.linear_rows, a=4096, b=4, k=4096)
    s = _swapped(d)
    k = s.kernels[0]
    s = s.replace(kernels=(k.replace(options=replace(k.options, stages=None)),))
    assert FAMILY.config_of(problem_of(d, s), s).stages == SWAP_MAX_STAGES
