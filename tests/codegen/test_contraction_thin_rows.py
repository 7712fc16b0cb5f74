"""A product whose wgmma tile rows hold at most THIN_ROWS elements (a few vectors by a matrix) gets
only 64-row wgmma tiles, unsplit as well as split: a 128-row tile's second consumer would run its
chain of wgmma over rows that all lie past the edge."""

from __future__ import annotations

import pytest

from napkin.cli_common import load
from napkin.codegen.families.contraction import THIN_ROWS, ContractionFamily, problem_of

SKINNY = "tests/codegen/skinny_diagrams.py:linear_rows"


def _wgmma_tiles(d):
    fam = ContractionFamily()
    # (the swapped tiles put the matrix on their rows: tests/codegen/test_contraction_swap.py)
    return [c for c in (fam.config_of(problem_of(d, s), s) for s in fam.candidates(d, "h200", "bf16"))
            if c.wgmma and not c.swap]


@pytest.mark.parametrize("b", [1, 4, THIN_ROWS])
def test_thin_rows_take_64_row_tiles_only(b):
    d = load(SKINNY).with_dtype("bf16").bind(a=11008, k=4096, b=b)
    tiles = _wgmma_tiles(d)
    assert tiles and all(c.BM == 64 for c in tiles)
    assert any(c.splits == 1 and not c.pingpong for c in tiles)  # offered unsplit too


def test_rows_past_the_bound_keep_the_large_tiles():
    d = load(SKINNY).with_dtype("bf16").bind(a=11008, k=4096, b=THIN_ROWS + 1)
    assert any(c.BM > 64 for c in _wgmma_tiles(d))


def test_the_planner_takes_a_64_row_tile_for_a_few_vectors():
    """H200, bf16, 4 vectors by an 11008 x 4096 matrix: 128 x 128 tiles on two consumers ran 49.3 us
    a call, 64 x 128 tiles 33.6 (``benchmarks/results/nvidia-h200/thin_rows_ab_s27.jsonl``)."""
    from napkin.codegen import compile as napkin_compile

    cd = napkin_compile(load(SKINNY), sizes=dict(a=11008, k=4096, b=4), dtype="bf16", gpu="h200")
    (k,) = cd.plan.kernels
    assert k.kernel.family == "contraction"
    # the vectors on a 64-row tile, or on the swapped tile's columns: never a 128-row tile of them
    rows = [r.size for r in k.kernel.relabels if r.axis == "b" and r.level == "SMEM"]
    assert rows in ([64], [8]), k.kernel.relabels
