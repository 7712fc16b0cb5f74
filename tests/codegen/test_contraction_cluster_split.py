"""A wgmma split sum whose blocks are one thread-block cluster (``cluster_splits``, Hopper): the
``splits`` blocks of a tile add their fp32 partials in each other's shared memory and block 0 of
the cluster runs the epilogue, so the product is one launch with no workspace.

CPU tests: the option and its round trip through a plan, the lowered kernel (cluster dims, grid,
no combine, no buffer, TMA stores kept), the configurations the template cannot build and the
architectures without clusters, what the planner offers and the model's price of the exchange;
and (marked ``nvcc``) builds for sm_90a without spills. The GPU checks are in
``test_contraction_cluster_split_gpu.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from napkin.codegen.families.contraction import (FAMILY, OFFERED_CLUSTER_SPLITS, MatmulConfig, _swap_config, analyze,
                                                 cluster_split_counts, cluster_split_rounds, swap_problem)
from napkin.diagrams import Axis, Diagram, array, contract, map_fn
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import KernelOptions

try:
    from . import skinny_diagrams as sd
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    import skinny_diagrams as sd


def mm(epilogue: bool = False) -> Diagram:
    """Y[a,c] = Σ_b A[a,b]·B[b,c], with ``epilogue`` a bias, SiLU and a residual after it."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    Y = contract(array("A", a, b), array("B", b, c), over=b, out=(a, c), name="H" if epilogue else "Y")
    if epilogue:
        Y = map_fn("add", map_fn("silu", map_fn("add", Y, array("bias", c))), array("R", a, c), name="Y")
    return Diagram("mm_epilogue" if epilogue else "mm", Y)


def _bound(build, **sizes):
    return build().with_dtype("bf16").bind(**sizes)


def _wgmma(bm=128, bn=128, stages=6, splits=4, cluster=True) -> MatmulConfig:
    return MatmulConfig(False, bm, bn, 64, 64, bn, stages, wgmma=True, splits=splits, cluster_splits=cluster)


def test_the_option_travels_with_the_schedule_and_the_plan():
    from napkin.codegen import compile as napkin_compile
    from napkin.perfmodel.plan import Plan

    cfg = _wgmma(splits=4)
    assert cfg.options().cluster == 4 and cfg.options().splits == 4
    assert not cfg.partials_in_hbm and replace(cfg, cluster_splits=False).partials_in_hbm
    d = _bound(mm, a=256, b=8192, c=256)
    s = FAMILY.schedule(d, cfg)
    assert FAMILY.config_of(analyze(d), s, "sm_90a") == cfg
    cd = napkin_compile(mm(), sizes=dict(a=256, b=8192, c=256), dtype="bf16", gpu="h200", schedule=s)
    again = Plan.from_dict(cd.plan.diagram, cd.plan.to_dict())
    assert again.kernels[0].kernel.options.cluster == 4
    assert KernelOptions.from_dict(cfg.options().to_dict()) == cfg.options()


def test_the_kernel_is_one_launch_of_whole_clusters():
    d = _bound(mm, a=200, b=5000, c=136)
    prog = FAMILY.lower(d, FAMILY.schedule(d, _wgmma(splits=4)), "sm_90a")
    (k,) = prog.launches
    assert prog.buffers == ()  # no workspace
    assert "__cluster_dims__(4, 1, 1)" in k.source and "CSPLIT = true" in k.source
    assert "_x4_cs_" in k.name
    assert k.grid == (2 * 2 * 4, 1, 1)  # 2 x 2 tiles of 128 x 128, a cluster of 4 each, one tile a block
    t = dict(k.tunables)
    assert (t["splits"], t["cluster"]) == (4, 4)
    assert "one thread-block cluster (CSPLIT)" in k.source  # the legend says it


def test_the_partials_in_hbm_keep_their_combine():
    d = _bound(mm, a=200, b=5000, c=136)
    prog = FAMILY.lower(d, FAMILY.schedule(d, _wgmma(splits=4, cluster=False)), "sm_90a")
    assert [k.template for k in prog.launches] == ["matmul_wgmma.cu.jinja", "matmul_combine.cu.jinja"]
    assert "CSPLIT = false" in prog.launches[0].source and "__cluster_dims__" not in prog.launches[0].source


def test_block_zero_stores_as_an_unsplit_tile_does():
    """The plain product leaves by TMA; a residual is copied into the staging block (its epilogue
    runs once, on the whole sum)."""
    d = _bound(mm, a=256, b=8192, c=256)
    (k,) = FAMILY.lower(d, FAMILY.schedule(d, _wgmma(bn=64, splits=8)), "sm_90a").launches
    assert "tma_store" in dict(k.tunables) and "tma_store_2d(&tmY" in k.source
    d = mm(epilogue=True).with_dtype("bf16").bind(a=256, b=8192, c=256)
    (k,) = FAMILY.lower(d, FAMILY.schedule(d, _wgmma(bn=64, splits=8)), "sm_90a").launches
    assert "tma_store" not in dict(k.tunables) and "load_tile_async" in k.source


def test_a_swapped_tile_splits_over_a_cluster():
    d = _bound(sd.linear_rows, a=4096, b=8, k=4096)
    cfg = replace(_swap_config(d, analyze(d), "bf16"), splits=2, cluster_splits=True)
    prog = FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a")
    (k,) = prog.launches
    assert prog.buffers == () and "Y_T = true" in k.source and "__cluster_dims__(2, 1, 1)" in k.source
    assert k.grid == (4096 // 64 * 2, 1, 1)
    assert {a.name for a in k.args if a.kind == "tmap"} == {"W", "x", "y"}  # the output leaves by TMA


@pytest.mark.parametrize("options,why", [
    (dict(splits=4, cluster=2), "cluster must equal splits"),
    (dict(splits=16, cluster=16), "2 to 8 blocks of a cluster"),
    (dict(cluster=1), "2 to 8 blocks of a cluster"),
    (dict(splits=4, cluster=4, engine="mma.sync", warps=4, warpgroups=None), "wgmma template only"),
], ids=["mismatch", "too-many", "unsplit", "mma-sync"])
def test_schedules_the_template_cannot_build_are_refused(options, why):
    d = _bound(mm, a=256, b=8192, c=256)
    s = FAMILY.schedule(d, _wgmma(splits=options.get("splits", 1), cluster=False))
    k = s.kernels[0]
    opts = replace(k.options, **{n: v for n, v in options.items()})
    bad = s.replace(kernels=(k.replace(options=opts),))
    with pytest.raises(CodegenError, match=why):
        FAMILY.lower(d, bad, "sm_90a")


def test_a_tile_whose_partial_outgrows_the_ring_is_refused():
    d = _bound(mm, a=256, b=8192, c=256)
    s = FAMILY.schedule(d, _wgmma(bn=128, stages=2, splits=4))  # 64 KB of partials, a 64 KB ring
    FAMILY.lower(d, s, "sm_90a")
    s = FAMILY.schedule(d, MatmulConfig(False, 128, 256, 64, 64, 256, 2, wgmma=True, splits=2,
                                        cluster_splits=True))  # 128 KB of partials, a 96 KB ring
    with pytest.raises(CodegenError, match="kept in the ring"):
        FAMILY.lower(d, s, "sm_90a")


def test_ampere_has_no_clusters():
    d = _bound(mm, a=256, b=8192, c=256)
    with pytest.raises(CodegenError, match="sm_80 has no wgmma"):
        FAMILY.lower(d, FAMILY.schedule(d, _wgmma(splits=4)), "sm_80")


def test_the_planner_offers_a_cluster_before_the_workspace():
    d = _bound(sd.linear_rows, a=4096, b=8, k=14336)
    p = swap_problem(analyze(d))
    cfg = _swap_config(d, analyze(d), "bf16")
    assert cluster_split_counts(d, p, cfg, [2, 4, 16], "h200") == [OFFERED_CLUSTER_SPLITS] == [2]
    configs = FAMILY.split_configs(d, p, cfg, "h200")
    assert configs[0] == replace(cfg, splits=2, cluster_splits=True)
    assert [c.splits for c in configs[1:]] == FAMILY.split_counts(d, p, cfg, "h200")
    assert not any(c.cluster_splits for c in configs[1:])
    # not on Ampere, not below two shares, not the cooperative tiles
    assert cluster_split_counts(d, p, cfg, [2], "a100-80gb") == []
    assert cluster_split_counts(d, p, cfg, [1], "h200") == []
    m = _bound(mm, a=256, b=16384, c=256)
    assert cluster_split_counts(m, analyze(m), _wgmma(splits=1, cluster=False), [4, 16], "h200") == []


def test_the_planner_clusters_a_few_vectors_by_a_matrix():
    from napkin.codegen.planner import derive

    d = _bound(sd.linear_rows, a=4096, b=64, k=4096)
    k = derive(d, gpu="h200", explain=False).plan.kernels[0].kernel
    assert k.family == "contraction" and k.options.swap_ab and k.options.cluster == k.options.splits == 2


def test_the_model_prices_an_exchange_not_a_launch():
    from napkin.codegen.select import predict_schedule

    d = _bound(mm, a=256, b=16384, c=256)
    hbm = FAMILY.launch_estimate(d, FAMILY.schedule(d, _wgmma(splits=8, cluster=False)), gpu="h200")
    cl = FAMILY.launch_estimate(d, FAMILY.schedule(d, _wgmma(splits=8)), gpu="h200")
    assert hbm["extra_launches"] == 1 and hbm["extra_hbm_bytes"] == 2 * 4 * 8 * 256 * 256
    assert "extra_launches" not in cl and cl["tail_l2_rounds"] == cluster_split_rounds(_wgmma(splits=8)) == 4
    assert cl["epilogue_hbm_bytes"] > 0  # block 0 stores the tile after the exchange
    t_hbm = predict_schedule(d, FAMILY, FAMILY.schedule(d, _wgmma(splits=8, cluster=False)), "h200").seconds
    t_cl = predict_schedule(d, FAMILY, FAMILY.schedule(d, _wgmma(splits=8)), "h200").seconds
    assert t_cl < t_hbm


def test_the_swapped_problem_parts_its_slices_by_the_vectors():
    d = _bound(sd.linear_rows, a=4096, b=8, k=4096)
    q = swap_problem(analyze(d))
    cfg = _swap_config(d, analyze(d), "bf16")
    assert cluster_split_counts(d, q, cfg, [2, 4], "h200") == [2]
    assert cluster_split_rounds(replace(cfg, splits=2, cluster_splits=True)) == 3


# ---------------------------------------------------------------------------- nvcc builds

NVCC_CASES = [
    (mm, dict(a=200, b=5000, c=136), _wgmma(splits=2)),
    (mm, dict(a=200, b=5000, c=136), _wgmma(splits=8)),
    (mm, dict(a=256, b=8192, c=256), _wgmma(bm=64, bn=128, stages=8, splits=4)),
    (mm, dict(a=256, b=8192, c=256), _wgmma(bm=128, bn=64, stages=8, splits=8)),
    (lambda: mm(epilogue=True), dict(a=256, b=8192, c=256), _wgmma(bn=64, stages=8, splits=4)),
]


@pytest.mark.nvcc
@pytest.mark.parametrize("build,sizes,cfg", NVCC_CASES, ids=[f"{c.BM}x{c.BN}-x{c.splits}-{i}" for i, (_, _, c)
                                                             in enumerate(NVCC_CASES)])
def test_cluster_split_kernels_build_without_spills(build, sizes, cfg):
    from napkin.kernels.nvcc import nvcc_available, nvcc_compile

    if not nvcc_available():
        pytest.skip("nvcc is not on this machine")
    d = _bound(build, **sizes)
    (k,) = [x for x in FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a").launches
            if x.template == "matmul_wgmma.cu.jinja"]
    r = nvcc_compile(k.source, "sm_90a")[k.name]
    assert not r.spills, r
    assert r.registers <= 255


@pytest.mark.nvcc
@pytest.mark.parametrize("splits", [2, 4])
def test_swapped_cluster_split_kernels_build_without_spills(splits):
    from napkin.kernels.nvcc import nvcc_available, nvcc_compile

    if not nvcc_available():
        pytest.skip("nvcc is not on this machine")
    for build, sizes in ((sd.linear_rows, dict(a=4096, b=64, k=4096)), (sd.linear_bias_gelu, dict(a=1000, b=5, k=1024)),
                         (sd.batched_two_small, dict(n=3, a=336, b=2, c=3, k=1024))):
        d = _bound(build, **sizes)
        cfg = replace(_swap_config(d, analyze(d), "bf16"), splits=splits, cluster_splits=True)
        (k,) = [x for x in FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a").launches
                if x.template == "matmul_wgmma.cu.jinja"]
        r = nvcc_compile(k.source, "sm_90a")[k.name]
        assert not r.spills, (build.__name__, r)
