"""A wgmma split sum over one thread-block cluster on the GPU (marked ``gpu``; sm_90a): the blocks
of a tile add their partials in each other's shared memory and block 0 runs the epilogue.

Each case runs through ``napkin.codegen.verify`` (fresh random inputs, NaN-poisoned outputs, a
float64 reference), twice on fresh seeds: sizes that fill no tile, sums that are not chunk
multiples, shares left empty (fewer chunks than blocks), 2 to 8 blocks a cluster on 64- and
128-row tiles, an epilogue with a staged residual, and the swapped tile of a few vectors by a
matrix (maps after the product, a batch, two small axes, a sum over two axes).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families.contraction import FAMILY, MatmulConfig, _swap_config, analyze

try:
    from . import skinny_diagrams as sd
    from .test_contraction_cluster_split import mm
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    import skinny_diagrams as sd
    from test_contraction_cluster_split import mm

pytestmark = pytest.mark.gpu


def _hopper():
    skip_unless_hopper("a split sum over a cluster of wgmma blocks")


def _check(build, sizes, cfg, dtype="bf16"):
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    bound = build().with_dtype(dtype).bind(**sizes)
    cd = napkin_compile(build(), sizes=sizes, dtype=dtype, family="contraction", schedule=FAMILY.schedule(bound, cfg))
    own = [k for k in cd.launches if k.template != "pad_rows.cu.jinja"]
    assert [k.template for k in own] == ["matmul_wgmma.cu.jinja"]  # no combining launch
    assert dict(own[0].tunables)["cluster"] == cfg.splits
    for seed in (0, 1):
        rows = verify_compiled(cd, seed=seed)
        assert rows and all(r.ok for r in rows), f"seed {seed}: {rows}"


def _wgmma(bm, bn, splits, stages=6):
    """A cooperative tile of 64-row consumers, its sum shared by a cluster of ``splits`` blocks."""
    return MatmulConfig(False, bm, bn, 64, 64, bn, stages, wgmma=True, splits=splits, cluster_splits=True)


PLAIN = [
    (dict(a=200, b=5000, c=136), _wgmma(128, 128, 2)),
    (dict(a=200, b=5000, c=136), _wgmma(128, 128, 4)),
    (dict(a=256, b=16384, c=256), _wgmma(128, 128, 8)),
    (dict(a=100, b=3001, c=300), _wgmma(64, 128, 4, stages=8)),
    (dict(a=130, b=70001, c=72), _wgmma(128, 64, 8, stages=8)),
    (dict(a=64, b=130, c=64), _wgmma(64, 64, 8, stages=8)),  # 3 chunks: five of the eight shares empty
    (dict(a=1, b=999, c=8), _wgmma(64, 64, 2, stages=8)),
]


@pytest.mark.parametrize("sizes,cfg", PLAIN, ids=[f"{c.BM}x{c.BN}-x{c.splits}-{'-'.join(map(str, s.values()))}"
                                                  for s, c in PLAIN])
def test_a_cluster_split_matches_the_reference(sizes, cfg):
    _hopper()
    _check(mm, sizes, cfg)


def test_a_cluster_split_with_an_epilogue_and_a_residual():
    _hopper()
    _check(lambda: mm(epilogue=True), dict(a=300, b=4000, c=200), _wgmma(128, 64, 4, stages=8))
    _check(lambda: mm(epilogue=True), dict(a=300, b=4000, c=200), _wgmma(128, 64, 4, stages=8), dtype="fp16")


SWAPPED = [
    (sd.linear_rows, dict(a=1000, b=5, k=1000), 2),
    (sd.linear_rows, dict(a=4096, b=64, k=4096), 2),
    (sd.linear_rows, dict(a=4096, b=3, k=4096), 4),
    (sd.linear_cols, dict(a=4096, b=4, k=11008), 8),
    (sd.linear_bias_gelu, dict(a=1000, b=5, k=1024), 2),
    (sd.batched_two_small, dict(n=3, a=336, b=2, c=3, k=1024), 2),
    (sd.two_sums, dict(a=776, b=4, h=5, d=96), 2),
]


@pytest.mark.parametrize("bm", [64, 128], ids=["one-consumer", "two-consumers"])
@pytest.mark.parametrize("build,sizes,splits", SWAPPED, ids=[sd.case_id(c) for c in SWAPPED])
def test_a_swapped_cluster_split_matches_the_reference(build, sizes, splits, bm):
    _hopper()
    bound = build().with_dtype("bf16").bind(**sizes)
    cfg = replace(_swap_config(bound, analyze(bound), "bf16", bm), splits=splits, cluster_splits=True)
    _check(build, sizes, cfg)


def test_the_planners_cluster_split_runs():
    """The planner's own plan for 64 vectors by a 4096 x 4096 matrix (a cluster of two a tile)."""
    _hopper()
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    cd = napkin_compile(sd.linear_rows(), sizes=dict(a=4096, b=64, k=4096), dtype="bf16", gpu="h200")
    assert cd.plan.kernels[0].kernel.options.cluster == 2
    rows = verify_compiled(cd, seed=3)
    assert rows and all(r.ok for r in rows), rows
