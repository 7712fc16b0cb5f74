"""The row-wise chain kernel on a GPU: log-softmax, L1/L2 norms, group norm (a row of two axes),
logsumexp, row max/min/range and chains users write, each ONE row-wise kernel, against the float64
reference of the same inputs, outputs poisoned with NaN (an unwritten element fails), rows that are
not multiples of the 16-byte vector, rows kept in registers and rows streamed, every configuration
the family proposes for two cases, and ±inf in the rows of max, min and logsumexp."""

from __future__ import annotations

import math

import pytest

from napkin.codegen.api import compile
from napkin.codegen.families.rowwise import FAMILY
from napkin.codegen.prepare import prepare
from napkin.diagrams import library
from napkin.diagrams.reference import random_inputs

from test_rowwise_chain import USER  # pytest puts this folder on sys.path (no __init__.py)

pytestmark = pytest.mark.gpu

TOL = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-5}


def _compare(out, ref, tol: float, what: str) -> None:
    """``out`` matches ``ref``: the same infinities in the same places, no NaN (none is expected),
    and the finite part within ``tol`` relative error."""
    import torch

    o, r = out.double(), ref.double().to(out.device)
    assert not torch.isnan(r).any(), f"{what}: the reference has NaN (the case is ill-posed)"
    assert not torch.isnan(o).any(), f"{what}: {int(torch.isnan(o).sum())} NaN (unwritten or wrong)"
    inf = torch.isinf(r)
    assert torch.equal(torch.isinf(o), inf) and torch.equal(o[inf], r[inf]), f"{what}: infinities differ"
    fin = ~inf
    if not fin.any():
        return
    norm = torch.linalg.vector_norm(r[fin])
    err = torch.linalg.vector_norm(o[fin] - r[fin]) / (norm if norm > 0 else 1.0)
    assert err <= tol, f"{what}: relative error {float(err):.3g} > {tol}"


def run_chain(diagram, sizes: dict, dtype: str, *, schedule=None, inputs=None, seed: int = 0):
    """Compile ``diagram`` (planned on the row-wise family, or as ``schedule``) into one kernel, run it on
    random (or the given) inputs into NaN-filled outputs and compare with the float64 reference."""
    import torch

    # the row-wise family only: with very few long rows the planner may rather split them over
    # blocks on the pointwise family (tests/codegen/test_rowwise_chain.py checks what it plans)
    cd = compile(diagram, sizes=sizes, dtype=dtype, schedule=schedule, family="rowwise")
    assert [k.family for k in cd.plan.kernels] == ["rowwise"], str(cd.plan)
    assert len(cd.program.launches) == 1 and "rowwise_chain" in cd.program.launches[0].name
    d = cd.diagram
    x = inputs if inputs is not None else random_inputs(d, device="cuda", seed=seed)
    outs = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**x, out=outs)
    torch.cuda.synchronize()
    ref = d.reference({k: v.double() for k, v in x.items()}, dtype=torch.float64)
    tun = dict(cd.program.launches[0].tunables)
    for n in cd.output_names:
        _compare(outs[n], ref[n], TOL[dtype], f"{d.name} {dtype} {sizes} {n} ({tun})")
    return cd


# ----------------------------------------------------------------------------- library chains

SHAPES = {
    "log_softmax": [dict(r=33, x=1000), dict(r=7, x=4095), dict(r=300, x=1024), dict(r=5, x=1),
                    dict(r=3, x=70001)],                                    # 70001: streamed
    "l2_normalize": [dict(r=33, x=1000), dict(r=64, x=4096), dict(r=2, x=37)],
    "group_norm": [dict(n=2, g=4, c=5, s=999),                             # gamma/beta per element
                   dict(n=3, g=8, c=4, s=256),                             # gamma/beta per chunk
                   dict(n=1, g=2, c=16, s=4100)],                          # 65600 values: streamed
    "logsumexp_rows": [dict(r=33, x=1000), dict(r=300, x=4096), dict(r=4, x=1), dict(r=2, x=300001)],
    "row_range": [dict(r=33, x=1000), dict(r=129, x=4095), dict(r=3, x=300001)],
}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_library_chains(name, dtype):
    for i, sizes in enumerate(SHAPES[name]):
        run_chain(library.get(name), sizes, dtype, seed=i)


@pytest.mark.parametrize("name", ["log_softmax", "group_norm"])
def test_fp16(name):
    run_chain(library.get(name), SHAPES[name][0], "fp16", seed=5)


@pytest.mark.parametrize("name, sizes, dtype", [("log_softmax", dict(r=37, x=1000), "bf16"),
                                                ("group_norm", dict(n=2, g=3, c=5, s=99), "fp32")])
def test_every_configuration(name, sizes, dtype):
    d = prepare(library.get(name), sizes=sizes, dtype=dtype)
    cands = FAMILY.candidates(d, "h100", dtype)
    assert len(cands) >= 3
    for s in cands:
        run_chain(library.get(name), sizes, dtype, schedule=s, seed=len(cands))


def test_streamed_rows_with_every_unroll():
    d = prepare(library.get("log_softmax"), sizes=dict(r=3, x=70001), dtype="fp32")
    cands = FAMILY.candidates(d, "h100", "fp32")
    assert {c.kernels[0].options.stages for c in cands} == {2, 4}
    for s in cands:
        run_chain(library.get("log_softmax"), dict(r=3, x=70001), "fp32", schedule=s, seed=1)


def test_l2_normalize_of_a_zero_row_is_zero():
    import torch

    x = random_inputs(prepare(library.get("l2_normalize"), sizes=dict(r=4, x=1000), dtype="bf16"), device="cuda",
                      seed=3)
    x["X"][1] = 0
    cd = run_chain(library.get("l2_normalize"), dict(r=4, x=1000), "bf16", inputs=x)
    assert torch.equal(cd(x["X"])[1].float().cpu(), torch.zeros(1000))


# ----------------------------------------------------------------------------- user-written chains

USER_SHAPES = {"l1": dict(r=33, x=1001), "minmax": dict(r=300, x=4095), "centred": dict(r=65, x=1000),
               "hand_ln": dict(r=17, x=4096), "masked_lse": dict(h=3, q=37, x=53)}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", sorted(USER_SHAPES))
def test_user_chains(name, dtype):
    run_chain(USER[name](), USER_SHAPES[name], dtype, seed=2)


# ----------------------------------------------------------------------------- infinities

def _with_infinities(d, dtype):
    """Random rows with: all -inf, one +inf, some -inf among finite values, +inf and -inf, finite."""
    import torch

    x = random_inputs(d, device="cuda", seed=7)
    X = x["X"]
    X[0] = -math.inf
    X[1, 5] = math.inf
    X[2, ::3] = -math.inf
    X[3, 0], X[3, -1] = math.inf, -math.inf
    assert X.shape[0] >= 5 and torch.isfinite(X[4:]).all()
    return x


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("how", ["maxmin", "lse", "range"])
@pytest.mark.parametrize("x", [1000, 70001])
def test_infinities(how, x, dtype):
    from napkin.diagrams import Axis, Diagram, array, logsumexp, max_over, maximum, reduce

    r_, x_ = Axis("r"), Axis("x")
    X = array("X", r_, x_)
    if how == "maxmin":  # the row's max and min, and fmax of the two (so the boxes form one kernel)
        hi, lo = max_over(X, x_, name="hi"), reduce(X, x_, "min", name="lo")
        d = Diagram("rmaxmin", (hi, lo, maximum(hi, lo, name="top")))
    elif how == "lse":
        d = Diagram("rlse", logsumexp(X, x_, name="Y"))
    else:
        d = Diagram("rrange", (max_over(X, x_) - reduce(X, x_, "min")).named("Y"))
    import torch

    sizes = dict(r=9, x=x)
    b = prepare(d, sizes=sizes, dtype=dtype)
    x_in = _with_infinities(b, dtype)
    if how == "range":  # max − min of a row of only -inf is NaN in every implementation: not that row
        x_in["X"][0] = -1.0
    cd = run_chain(d, sizes, dtype, inputs=x_in)
    got = cd(**x_in)
    hi = (got[0] if how == "maxmin" else got).double().cpu()
    assert math.isinf(hi[1]) and hi[1] > 0 and math.isinf(hi[3]) and hi[3] > 0
    if how != "range":
        assert hi[0] == -math.inf and math.isfinite(hi[2])
    if how == "maxmin":
        lo = got[1].double().cpu()
        assert lo[0] == -math.inf and lo[2] == -math.inf and lo[3] == -math.inf and math.isfinite(lo[1])
        assert torch.equal(got[2], got[0])


def _written_out_softmax():
    """softmax as the planner writes it out for rows too long for registers: the sum's exp(x − max)
    apart from the output's, so the sum runs beside the max (an online pair)."""
    from napkin.diagrams import Axis, Diagram, array, exp, max_over, sum_over

    r_, x_ = Axis("r"), Axis("x")
    X = array("X", r_, x_)
    m = max_over(X, x_, name="m")
    s = sum_over(exp(X - m, name="E_sum"), x_, name="s")
    return Diagram("wsoftmax", (exp(X - m, name="E") / s).named("P"))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("which", ["log_softmax", "softmax"])
@pytest.mark.parametrize("x", [1000, 50257, 70001, 130001])
def test_paired_sums_are_nan_where_the_written_out_form_is(which, x, dtype):
    """A sum of exp(x − max) run beside its max (one pass, rescaled as the max grows) gives what
    the written-out diagram gives: NaN for a row of only −inf or with a +inf (x − max is NaN
    there), −inf log-probabilities and zero probabilities for −inf among finite values, and the
    rest within the tolerance, in registers (1000), kept in shared memory (bf16 rows of 50257 and
    70001, fp32 rows of 50257 on Hopper), and shared by a cluster of blocks (fp32 rows of 70001,
    rows of 130001)."""
    import torch

    d = library.get("log_softmax") if which == "log_softmax" else _written_out_softmax()
    sizes = dict(r=9, x=x)
    b = prepare(d, sizes=sizes, dtype=dtype)
    x_in = _with_infinities(b, dtype)
    cd = compile(d, sizes=sizes, dtype=dtype, family="rowwise")
    assert [k.family for k in cd.plan.kernels] == ["rowwise"], str(cd.plan)
    assert "fold_max_sumexp" in cd.program.launches[0].source  # the pair, not two passes
    outs = cd.empty_outputs(device="cuda", fill=1.0)  # not NaN: the NaN rows must be written NaN
    cd(**x_in, out=outs)
    torch.cuda.synchronize()
    ref = cd.diagram.reference({k: v.double() for k, v in x_in.items()}, dtype=torch.float64)
    (name,) = cd.output_names
    o, r = outs[name].double(), ref[name].double().to(outs[name].device)
    assert torch.isnan(r[0]).all() and torch.isnan(r[1]).all() and not torch.isnan(r[4:]).any()
    assert torch.equal(torch.isnan(o), torch.isnan(r)), f"{which} {dtype} {x}: NaN in other places"
    keep = ~torch.isnan(r)
    _compare(o[keep], r[keep], TOL[dtype], f"{which} {dtype} {x}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("which", ["log_softmax", "softmax", "logsumexp_rows"])
@pytest.mark.parametrize("x", [1000, 70001, 130001])
def test_paired_sums_of_huge_values(which, x, dtype):
    """Rows of values near ±1e30 and ±1.5e38: the pair's shift m·log2(e) rounded once would be off
    by 2^72 there (every exp overflowing or vanishing); past reduce.cuh's FMA_SHIFT_MAX the pair
    takes its exact path, and the outputs match the float64 reference (finite where it is)."""
    import torch

    d = _written_out_softmax() if which == "softmax" else library.get(which)
    sizes = dict(r=6, x=x)
    x_in = random_inputs(prepare(d, sizes=sizes, dtype=dtype), device="cuda", seed=11)
    X = x_in["X"]
    # (1.5e38: x − max stays within fp32, where the outputs are computed)
    scale = torch.tensor([1e30, -1e30, 1.5e38, 1e4, 9e3, 1.0], device=X.device).view(-1, 1)
    x_in["X"] = (X.float().clamp(-1, 1) * scale).to(X.dtype)
    run_chain(d, sizes, dtype, inputs=x_in)
