"""Fusion into the contraction template on the GPU (marked ``gpu``), through ``napkin.codegen.verify``:
fresh random inputs, NaN-poisoned outputs, relative error against the float64 reference, sizes
that are not tile multiples.

- RMSNorm -> linear as one wgmma kernel (the norm's row scale from the A tiles, G folded into them);
- GEMM -> softmax, sum, max, min or mean along the output's rows in the wgmma epilogue (the tile
  spans the row);
- where the fused kernel cannot run (fp32, rows that are not 16-byte multiples, rows wider than
  a tile) the plan's kernels are still right.
"""

from __future__ import annotations

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families.contraction import FAMILY, WGMMA_CONFIGS, MatmulConfig
from napkin.diagrams import library

try:
    from .test_contraction_fusion import ROW_KINDS, gemm_rowred, norm_linear
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_fusion import ROW_KINDS, gemm_rowred, norm_linear

pytestmark = pytest.mark.gpu


def check(diagram, dtype, shapes, family=None, schedule=None):
    from napkin.codegen.verify import verify

    report = verify(diagram, dtype=dtype, shapes=shapes, family=family, schedule=schedule)
    print(report)
    assert report.ok, str(report)


def _hopper():
    skip_unless_hopper("the fused prologue (wgmma template)")


#: sizes that are no tile multiples; x = 8 is one mostly out-of-bounds chunk, x = 1032 walks 17
RMS_SHAPES = [dict(r=1000, x=520, c=776), dict(r=77, x=64, c=200), dict(r=296, x=8, c=64),
              dict(r=130, x=1032, c=136)]


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}-w{c[3]}-s{c[5]}")
def test_rmsnorm_linear_every_wgmma_configuration(cfg):
    _hopper()
    d0 = library.get("rmsnorm_linear")
    for shape in RMS_SHAPES[:2]:
        d = d0.with_dtype("bf16").bind(**shape)
        check(d0, "bf16", [shape], family="contraction",
              schedule=FAMILY.schedule(d, MatmulConfig(False, *cfg, wgmma=True)))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rmsnorm_linear_as_one_kernel(dtype):
    """The contraction family alone builds the whole diagram as one kernel (the planner's own plan
    is whichever the model predicts faster, checked below)."""
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram("rmsnorm_linear", sizes=RMS_SHAPES[0], dtype=dtype, family="contraction")
    assert len(cd.program.launches) == 1 and "napkin_mm_wgmma_rmsnorm" in cd.program.launches[0].name
    check(library.get("rmsnorm_linear"), dtype, RMS_SHAPES, family="contraction")
    check(library.get("rmsnorm_linear"), dtype, RMS_SHAPES[:2])


@pytest.mark.parametrize("gamma,w_kmajor,epilogue", [(False, True, False), (True, False, False), (True, True, True)],
                         ids=["no-gamma", "W[x,c]", "bias-silu"])
def test_rmsnorm_prologue_variants(gamma, w_kmajor, epilogue):
    _hopper()
    d = norm_linear(gamma=gamma, w_kmajor=w_kmajor, epilogue=epilogue)
    check(d, "bf16", RMS_SHAPES[:3], family="contraction")


def test_rmsnorm_linear_where_the_prologue_cannot_fuse():
    """fp32 (no wgmma) and rows of 100 elements (padded copies): the plan keeps the norm apart,
    and its kernels are right."""
    check(library.get("rmsnorm_linear"), "fp32", [dict(r=300, x=136, c=200)])
    check(library.get("rmsnorm_linear"), "bf16", [dict(r=77, x=100, c=136)])


#: c = 200 (one 256-wide tile), 64, 136 with a single partial chunk of b, 256 (a whole tile), and
#: 100 (output rows that are not 16-byte multiples)
ROW_SHAPES = [dict(a=1000, b=520, c=200), dict(a=77, b=64, c=64), dict(a=296, b=8, c=136),
              dict(a=130, b=1032, c=256), dict(a=45, b=64, c=100)]


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_gemm_then_row_reduction(kind):
    """Every kind the template builds (all passed on an H100 before the family took them)."""
    _hopper()
    check(gemm_rowred(kind), "bf16", ROW_SHAPES, family="contraction")
    if kind == "softmax":
        check(gemm_rowred(kind), "fp16", ROW_SHAPES[:2], family="contraction")


def test_gemm_row_sum_planned_fused_and_apart_where_it_cannot():
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    sizes = dict(a=1000, b=520, c=200)
    cd = compile_diagram(gemm_rowred("sum"), sizes=sizes)
    assert "napkin_mm_wgmma_sum" in cd.program.launches[0].name, [k.name for k in cd.program.launches]
    check(gemm_rowred("sum"), "bf16", [sizes, dict(a=77, b=64, c=64)])
    # fp32 (no wgmma) and a row wider than a tile: the GEMM and the reduction apart
    check(gemm_rowred("sum"), "fp32", [dict(a=300, b=136, c=200)])
    check(library.get("gemm_softmax"), "bf16", [dict(a=300, b=136, c=1000)])
