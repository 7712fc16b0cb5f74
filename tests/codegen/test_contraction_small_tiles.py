"""Small block tiles (32 rows) for contractions whose output per batch element is small.

Thousands of 32 x 32 products (a batch of attention-sized tiles) ran on 64 x 64 tiles, a quarter
of each block's multiplies on zero rows, four blocks a SM: 0.77x eager in bf16 and 0.53x in fp32
on an H200. The family now offers 32-row tiles (``MMA_SMALL_CONFIGS``, ``TF32X3_SMALL_CONFIGS``)
where an output axis has at most ``SMALL_OUTPUT`` elements, many blocks a SM. CPU checks: where
they are offered, that the planner takes them for such a batch, that they build (the nvcc cases
sit with the other configurations' builds). On a GPU (marked ``gpu``): every small configuration
against the float64 reference on sizes that are not tile multiples, in every operand layout.
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.contraction import (FAMILY, MMA_SMALL_CONFIGS, SMALL_OUTPUT, TF32X3_SMALL_CONFIGS,
                                                 MatmulConfig, analyze)
from napkin.diagrams import Diagram, array, axes, contract, library


def bmm(a_kmajor: bool = True, b_kmajor: bool = False) -> Diagram:
    """C[n,a,c] = Σ_b A·B with A stored [n][a][b] or [n][b][a], B [n][c][b] or [n][b][c]."""
    n, a, b, c = axes("n a b c")
    A = array("A", *((n, a, b) if a_kmajor else (n, b, a)))
    B = array("B", *((n, c, b) if b_kmajor else (n, b, c)))
    return Diagram("bmm", contract(A, B, over=b, out=(n, a, c), name="C"))


def small_keys(d: Diagram, dtype: str) -> set[tuple]:
    cfgs = (FAMILY.config_of(analyze(d), s) for s in FAMILY.candidates(d, "h200", dtype))
    return {c.key() for c in cfgs if not c.wgmma}


@pytest.mark.parametrize("dtype,table", [("bf16", MMA_SMALL_CONFIGS), ("fp32", TF32X3_SMALL_CONFIGS)])
def test_small_tiles_are_offered_only_for_a_small_output_axis(dtype, table):
    keys = {c[:5] for c in table}
    small = bmm().with_dtype(dtype).bind(n=4096, a=32, b=64, c=32)
    assert keys <= small_keys(small, dtype)
    one_axis = bmm().with_dtype(dtype).bind(n=64, a=SMALL_OUTPUT, b=256, c=2048)
    assert keys <= small_keys(one_axis, dtype)
    wide = bmm().with_dtype(dtype).bind(n=64, a=SMALL_OUTPUT + 1, b=256, c=2048)
    assert not keys & small_keys(wide, dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_planner_takes_a_small_tile_for_a_batch_of_small_products(dtype):
    from napkin.codegen.lower import lower

    d = bmm().with_dtype(dtype).bind(n=4096, a=32, b=64, c=32)
    launch = lower(d, gpu="h200", arch="sm_90a").launches[-1]
    t = dict(launch.tunables)
    assert (t["BM"], t["BN"]) == (32, 32), t
    assert launch.grid[0] * launch.grid[1] * launch.grid[2] == 4096


def test_small_configurations_keep_their_blocks_resident():
    """The register budget each small configuration states keeps its blocks a SM resident and
    leaves the accumulators room (the nvcc builds check that nothing spills under it)."""
    for c in MMA_SMALL_CONFIGS:
        cfg = MatmulConfig(False, *c)
        assert cfg.threads * cfg.blocks_per_sm * cfg.model_regs() <= 65536
        assert cfg.model_regs() >= 80
    for c in TF32X3_SMALL_CONFIGS:
        cfg = MatmulConfig(True, *c, tf32x3=True)
        assert cfg.threads * cfg.blocks_per_sm * cfg.model_regs() <= 65536
        assert cfg.model_regs() >= 96


# ---------------------------------------------------------------------------- GPU

SHAPES = [dict(n=37, a=29, b=70, c=45), dict(n=3, a=32, b=8, c=32), dict(n=5, a=1, b=333, c=17)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,cfg", [("bf16", c) for c in MMA_SMALL_CONFIGS]
                         + [("fp32", c) for c in TF32X3_SMALL_CONFIGS], ids=lambda x: str(x))
@pytest.mark.parametrize("layout", [(True, False), (False, True), (True, True)], ids=["ab-bc", "ba-cb", "ab-cb"])
def test_every_small_configuration(dtype, cfg, layout):
    from napkin.codegen.verify import verify

    base = bmm(*layout)
    for shape in SHAPES:
        d = base.with_dtype(dtype).bind(**shape)
        mc = MatmulConfig(dtype == "fp32", *cfg, tf32x3=dtype == "fp32")
        report = verify(base, dtype=dtype, shapes=[shape], family="contraction", schedule=FAMILY.schedule(d, mc))
        print(report)
        assert report.ok, str(report)
