"""A max or min reduction over values holding a NaN is NaN, as the reference's ``torch.amax`` /
``amin`` say, in every family that takes the reduction (row-wise, pointwise, the wgmma row
reduction and its split form, the fallback) and every kind of configuration each one offers
(block or warp rows, splits, unrolls): ``fmaxf`` would drop the NaN and give the max of the rest.

Each case plants NaNs in some lines (one value, a whole line), -inf in others (a line of -inf only
is -inf, not NaN) and leaves the rest random; the NaN positions of each output must be the
reference's, and the other values within the stated tolerance (``napkin.codegen.verify.TOLERANCE``)
with the same infinities.
"""

from __future__ import annotations

import math

import pytest

from napkin.codegen import compile as napkin_compile
from napkin.codegen.families import contraction, fallback, pointwise, rowwise
from napkin.codegen.prepare import prepare
from napkin.codegen.verify import TOLERANCE
from napkin.diagrams import Axis, Diagram, array, contract, map_fn, reduce
from napkin.errors import CodegenError
from napkin_test_support import skip_unless_hopper, spread_and_split_picks

pytestmark = pytest.mark.gpu

FAMILIES = {"rowwise": rowwise.FAMILY, "pointwise": pointwise.FAMILY, "fallback": fallback.FAMILY,
            "contraction": contraction.FAMILY}


def reduced(how: str, over: tuple[str, ...]) -> Diagram:
    """Y = how over ``over`` of X[b, r, x]."""
    b, r, x = Axis("b"), Axis("r"), Axis("x")
    X = array("X", b, r, x)
    names = {"b": b, "r": r, "x": x}
    v = X
    for i, a in enumerate(over):
        v = reduce(v, names[a], how, name="Y" if i == len(over) - 1 else f"Y{i}")
    return Diagram(f"{how}_{'_'.join(over)}", v)


def shifted(how: str) -> Diagram:
    """Y = X − how over x of X: two passes over each row (the row-wise family's chain)."""
    b, r, x = Axis("b"), Axis("r"), Axis("x")
    X = array("X", b, r, x)
    return Diagram(f"shifted_{how}", map_fn("sub", X, reduce(X, x, how, name="M"), name="Y"))


def gemm_reduced(how: str) -> Diagram:
    """Y[a] = how over c of A·Bᵀ."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    return Diagram(f"gemm_{how}", reduce(L, c, how, name="Y"))


def shifted_colmax() -> Diagram:
    """Y = X − max over x of X, and the max of |Y| over (b, r) per x: the row-wise chain with a
    column reduction (per-block partials merged by a combine)."""
    b, r, x = Axis("b"), Axis("r"), Axis("x")
    X = array("X", b, r, x)
    Y = map_fn("sub", X, reduce(X, x, "max", name="M"), name="Y")
    return Diagram("shifted_colmax", (Y, reduce(reduce(map_fn("abs", Y, name="aY"), r, "max"), b, "max", name="C")))


#: (diagram, sizes, the axes a line runs over): rows (the innermost axis), columns (a middle and an
#: outer axis), two axes, a row's max or min taken from each of its values (a second pass), and a
#: column max after it
CASES = [(reduced("max", ("x",)), dict(b=2, r=37, x=1000), ("x",)),
         (reduced("min", ("x",)), dict(b=3, r=5, x=4100), ("x",)),
         (reduced("max", ("r",)), dict(b=2, r=700, x=33), ("r",)),
         (reduced("min", ("b",)), dict(b=301, r=3, x=40), ("b",)),
         (reduced("max", ("b", "x")), dict(b=9, r=6, x=500), ("b", "x")),
         (shifted("max"), dict(b=2, r=9, x=3000), ("x",)),
         (shifted("min"), dict(b=1, r=40, x=77), ("x",)),
         (shifted_colmax(), dict(b=3, r=77, x=999), ("x",))]


def _compare(cd, inputs: dict, ref: dict, dtype: str, what: str) -> None:
    import torch

    outs = cd(**{n: t.cuda() for n, t in inputs.items()}, out=cd.empty_outputs("cuda", 12345.0))
    outs = outs if isinstance(outs, tuple) else (outs,)
    for name, o in zip(cd.output_names, outs):
        o, r = o.double().cpu(), ref[name]
        assert torch.equal(o.isnan(), r.isnan()), f"{what} {name}: NaN at {o.isnan().nonzero().tolist()[:8]}, " \
                                      f"the reference's at {r.isnan().nonzero().tolist()[:8]}"
        ok = ~r.isnan()
        assert bool((o[ok].isinf() == r[ok].isinf()).all()) and bool((o[ok].sign() == r[ok].sign()).all()), what
        fin = ok & r.isfinite()
        if bool(fin.any()):  # (a NaN in B makes every row of a GEMM's reduction NaN)
            err = float((o[fin] - r[fin]).norm() / r[fin].norm())
            assert err < TOLERANCE[dtype], (what, name, err)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0].name for c in CASES])
def test_a_nan_in_a_reduced_line_gives_nan(case, dtype):
    import torch

    build, sizes, over = CASES[case]
    d = prepare(build, sizes=sizes, dtype=dtype)
    X = torch.randn(*[sizes[a] for a in d.inputs[0].axis_names], dtype=torch.float64,
                    generator=torch.Generator().manual_seed(case)) * 3
    # a line = the values one output element reduces: one NaN in line 1, NaN only in line 2, -inf
    # only in line 3 (-inf, not NaN), +inf and a NaN in line 4; the other lines stay finite
    out_axes = [a for a in d.inputs[0].axis_names if a not in over]
    n = math.prod(sizes[a] for a in over)

    def plant(j: int, values: dict[int, float]) -> None:
        pos = {}
        for a in reversed(out_axes):
            j, pos[a] = divmod(j, sizes[a])
        idx = tuple(pos.get(a, slice(None)) for a in d.inputs[0].axis_names)
        flat = X[idx].reshape(-1).clone()
        for k, v in values.items():
            flat[k] = v
        X[idx] = flat.view(X[idx].shape)

    plant(1, {n // 3: math.nan})
    plant(2, dict.fromkeys(range(n), math.nan))
    plant(3, dict.fromkeys(range(n), -math.inf))
    plant(4, {0: math.inf, n - 1: math.nan})
    T = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    X = X.to(T)
    ref = d.reference({"X": X.double()}, dtype=torch.float64)
    assert bool(ref["Y"].isnan().any()) and bool((~ref["Y"].isnan()).any())
    ran = 0
    for fname, fam in FAMILIES.items():
        try:
            cands = fam.candidates(d, "h100", dtype)
        except CodegenError:  # the family does not take this reduction (it says which one does)
            continue
        for i in spread_and_split_picks(cands) if cands else []:
            cd = napkin_compile(d, schedule=cands[i], family=fname)
            _compare(cd, {"X": X}, ref, dtype, f"{fname} candidate {i}: {cands[i].kernels[0].options}")
            ran += 1
    assert ran >= 2, f"{d.name}: only {ran} kernels ran (a family must take it besides the fallback)"


@pytest.mark.parametrize("how", ["max", "min"])
@pytest.mark.parametrize("c", [200, 1000])
def test_a_nan_in_a_gemm_row_gives_nan(how, c):
    """The contraction's row reduction (one tile a row at c = 200, the split form with its second
    launch at c = 1000): a NaN in row 3 of A makes row 3 of A·Bᵀ NaN, and a NaN in row 5 of B makes
    column 5 NaN; every row's max is then NaN, where fmaxf would give the max of the other columns."""
    import torch

    skip_unless_hopper("the contraction's row reduction (wgmma template)")
    d = prepare(gemm_reduced(how), sizes=dict(a=130, b=64, c=c), dtype="bf16")
    g = torch.Generator().manual_seed(c)
    A = torch.randn(130, 64, dtype=torch.float64, generator=g).to(torch.bfloat16)
    B = torch.randn(c, 64, dtype=torch.float64, generator=g).to(torch.bfloat16)
    A[3, 7] = math.nan
    cands = contraction.FAMILY.candidates(d, "h100", "bf16")
    assert cands
    for nan_in_b in (False, True):
        if nan_in_b:
            B[5, 11] = math.nan
        ref = d.reference({"A": A.double(), "B": B.double()}, dtype=torch.float64)
        assert int(ref["Y"].isnan().sum()) == (130 if nan_in_b else 1)
        for i in spread_and_split_picks(cands):
            cd = napkin_compile(d, schedule=cands[i], family="contraction")
            _compare(cd, {"A": A, "B": B}, ref, "bf16", f"candidate {i} {cands[i].kernels[0].options}")
