"""The swapped wgmma tile on the GPU (marked ``gpu``; sm_90a): a few vectors by a matrix with the
matrix on the tile's 64 or 128 rows (one or two consumers), the vectors its 8 to 64 columns, the
tile leaving transposed.

Each case runs through ``napkin.codegen.verify`` (fresh random inputs, NaN-poisoned outputs, a
float64 reference): rows and vectors that fill no tile, sums that are not chunk multiples, both
layouts of the matrix, maps after the product (a bias, GELU and a residual read per element), a
batch and two small axes, a sum over two axes, and split sums whose partials leave transposed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families.contraction import FAMILY, _swap_config, analyze

try:
    from . import skinny_diagrams as sd
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    import skinny_diagrams as sd

pytestmark = pytest.mark.gpu


def _hopper():
    skip_unless_hopper("the swapped tile (wgmma template)")


@pytest.mark.parametrize("bm", [64, 128], ids=["one-consumer", "two-consumers"])
@pytest.mark.parametrize("build,sizes,splits", sd.SWAP_CASES, ids=[sd.case_id(c) for c in sd.SWAP_CASES])
def test_swapped_tile_matches_the_reference(build, sizes, splits, bm):
    _hopper()
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    d = build().with_dtype("bf16")
    bound = d.bind(**sizes)
    cfg = replace(_swap_config(bound, analyze(bound), "bf16", bm), splits=splits)
    cd = napkin_compile(d, sizes=sizes, dtype="bf16", family="contraction", schedule=FAMILY.schedule(bound, cfg))
    main = next(k for k in cd.launches if k.template == "matmul_wgmma.cu.jinja")
    assert dict(main.tunables).get("swap_ab") is True
    # (a padded copy of an operand whose rows are not 16-byte multiples may come first)
    own = [k.template for k in cd.launches if k.template != "pad_rows.cu.jinja"]
    assert own == ["matmul_wgmma.cu.jinja"] + (["matmul_combine.cu.jinja"] if splits > 1 else [])
    for seed in (0, 1):
        rows = verify_compiled(cd, seed=seed)
        assert rows and all(r.ok for r in rows), f"seed {seed}: {rows}"


def test_a_dynamic_count_of_vectors_keeps_the_swapped_plan():
    """One plan for 1 to 64 vectors (dynamic b): its swapped kernel, built for each count, covers
    counts under and over one of its tiles, in fp16 as well."""
    _hopper()
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    for dtype in ("bf16", "fp16"):
        dd = napkin_compile(sd.linear_rows(), sizes=dict(a=1000, b=64, k=500), dtype=dtype, dynamic={"b": (1, 64)})
        assert dd.plan.kernels[0].kernel.options.swap_ab is True
        for b in (1, 7, 33, 64):
            cd = dd.at({"b": b})
            rows = verify_compiled(cd, seed=b)
            assert rows and all(r.ok for r in rows), f"{dtype} b={b}: {rows}"
