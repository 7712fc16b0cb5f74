"""GEMM -> a row reduction wider than a tile on the GPU (marked ``gpu``): the split form (fp32
partials per column tile, a second launch combining them) through ``napkin.codegen.verify`` (fresh
random inputs, NaN-poisoned outputs, relative error against the float64 reference), at widths that
are no tile multiples, every wgmma configuration, fp16, masked (-inf) and large logits, rows of
-inf only against torch, and bit-identical repeats."""

from __future__ import annotations

import math

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families.contraction import FAMILY, WGMMA_CONFIGS, MatmulConfig

try:
    from .test_contraction_fusion import gemm_rowred
    from .test_contraction_gpu import check
    from .test_contraction_rowsplit import KINDS, diagram_of, gemm_lse
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_fusion import gemm_rowred
    from test_contraction_gpu import check
    from test_contraction_rowsplit import KINDS, diagram_of, gemm_lse

pytestmark = pytest.mark.gpu

#: rows wider than a tile: 1000 (4 tiles of 256, the last one 232 wide), 4100 (17, the last 4
#: columns), 11008 (43); rows that are no tile multiples and short sums (8: one mostly masked chunk)
SPLIT_SHAPES = [dict(a=1000, b=520, c=1000), dict(a=77, b=64, c=4100), dict(a=130, b=8, c=11008),
                dict(a=45, b=136, c=1001)]


def _hopper():
    skip_unless_hopper("the split row reduction (wgmma template)")


@pytest.mark.parametrize("kind", KINDS)
def test_split_row_reduction(kind):
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram(diagram_of(kind), sizes=SPLIT_SHAPES[0], dtype="bf16", family="contraction")
    assert len(cd.program.launches) == 2 and "rowcombine" in cd.program.launches[1].name
    check(diagram_of(kind), "bf16", SPLIT_SHAPES)
    if kind in ("softmax", "logsumexp"):
        check(diagram_of(kind), "fp16", SPLIT_SHAPES[:2])


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}-w{c[3]}-s{c[5]}")
@pytest.mark.parametrize("kind", ["softmax", "logsumexp", "mean"])
def test_split_every_wgmma_configuration(cfg, kind):
    _hopper()
    shape = dict(a=300, b=136, c=1000)
    d = diagram_of(kind).with_dtype("bf16").bind(**shape)
    splits = math.ceil(shape["c"] / cfg[1])
    check(diagram_of(kind), "bf16", [shape], schedule=FAMILY.schedule(d, MatmulConfig(False, *cfg, wgmma=True,
                                                                                          splits=splits)))


def test_masked_and_large_logits():
    """Causal masks (-inf past the diagonal: whole tiles of -inf for the first rows) and logits
    near a thousand (exp overflows without the shift) for softmax, logsumexp and max."""
    _hopper()
    from napkin.diagrams import Axis, Diagram, array, contract
    from napkin.diagrams.ops import causal, map_fn, reduce, softmax

    def masked(kind: str, scale: float) -> Diagram:
        a, b, c = Axis("a"), Axis("b"), Axis("c")
        L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
        S = causal(map_fn("scale", L, params=(scale,), name="S"), a, c, name="Mk")
        if kind == "softmax":
            return Diagram("masked_softmax", softmax(S, c, name="P"))
        return Diagram(f"masked_{kind}", reduce(S, c, kind, name="Y"))

    shapes = [dict(a=600, b=520, c=1000), dict(a=77, b=64, c=4100)]
    for scale in (0.125, 50.0):  # (bf16 inputs of N(0, 1): 50 x sqrt(520) ~ 1100)
        check(gemm_lse(mask=True, scale=scale), "bf16", shapes)
        check(masked("softmax", scale), "bf16", shapes)
        check(masked("max", scale), "bf16", shapes)


def test_rows_of_minus_infinity_as_torch():
    """A row masked whole: logsumexp gives -inf and softmax NaN there (as torch), the other rows
    their values; and the result is bit-identical over repeated calls."""
    _hopper()
    import torch

    from napkin.codegen.api import compile as compile_diagram
    from napkin.diagrams import Axis, Diagram, array, contract, logsumexp
    from napkin.diagrams.ops import causal, softmax

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    S = causal(L, a, c, offset=-1, name="Mk")  # row 0 keeps no column
    M, K, N = 300, 136, 1000
    torch.manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    Sref = (A.double() @ B.double().T).masked_fill(
        torch.ones(M, N, dtype=torch.bool, device="cuda").triu(0), -math.inf)
    for d, ref in ((Diagram("lse_masked", logsumexp(S, c, name="Y")), torch.logsumexp(Sref, 1)),
                   (Diagram("softmax_masked", softmax(S, c, name="Y")), torch.softmax(Sref, 1))):
        k = compile_diagram(d, sizes=dict(a=M, b=K, c=N), dtype="bf16", family="contraction")
        assert len(k.program.launches) == 2, [x.name for x in k.program.launches]
        out = k(A, B)
        again = k(A, B)
        assert torch.equal(out.view(torch.int16), again.view(torch.int16))
        got = out.double()
        assert torch.equal(torch.isnan(got), torch.isnan(ref)), d.name
        assert torch.equal(torch.isinf(got), torch.isinf(ref)), d.name
        fin = torch.isfinite(ref)
        err = ((got[fin] - ref[fin]).norm() / ref[fin].norm()).item()
        assert err < 1e-2, (d.name, err)


def test_the_planner_picks_a_kernel_that_is_right():
    """Whatever the planner picks (the split, or the GEMM and the row-wise kernel apart) is right."""
    _hopper()
    for kind in ("sum", "logsumexp", "softmax"):
        check(diagram_of(kind), "bf16", [dict(a=1000, b=520, c=4100)], family=None)
    check(gemm_rowred("min"), "bf16", [dict(a=77, b=520, c=1000)], family=None)
