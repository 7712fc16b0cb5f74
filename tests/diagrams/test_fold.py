"""Folding axes that always travel together (napkin.diagrams.fold): what is foldable, what is not,
and that a folded diagram computes the same arrays (reshaped) as the diagram it came from."""

from __future__ import annotations

import pytest

from napkin.diagrams import Diagram, array, axes, causal, contract, gelu, rename, softmax, sum_over
from napkin.diagrams.fold import AxisFold, fold, foldable, summed_folds, unfolded_shape
from napkin.errors import DiagramError

B, S, E, F = axes("b s e f")


def linear(residual_axes=(B, S, F), bias=True) -> Diagram:
    X, W = array("X", B, S, E), array("W", F, E)
    Y = contract(X, W, over=E, out=(B, S, F), name="Yl")
    if bias:
        Y = Y + array("bias", F)
    if residual_axes:
        Y = Y + array("R", *residual_axes)
    return Diagram("linear", gelu(Y, name="Y"))


SIZES = dict(b=6, s=5, e=16, f=24)


def test_a_linear_layer_on_b_s_rows_folds_b_and_s():
    folds = foldable(linear().bind(**SIZES))
    assert folds == (AxisFold("b_s", ("b", "s"), (6, 5)),)
    d = fold(linear().bind(**SIZES), folds)
    assert [v.label() for v in d.inputs] == ["X[b_s,e]", "W[f,e]", "bias[f]", "R[b_s,f]"]
    assert d.outputs[0].label() == "Y[b_s,f]" and d.sizes["b_s"] == 30


@pytest.mark.parametrize("why, diagram", [
    # R stores s before b: the two are not one run in every array
    ("an array with the axes in another order", lambda: linear(residual_axes=(S, B, F))),
    # a box sums over s alone
    ("a reduction over one of them", lambda: Diagram("r", sum_over(linear().outputs[0], S, name="Z"))),
    # a softmax over s
    ("a softmax over one of them", lambda: Diagram("sm", softmax(linear().outputs[0], S, name="Z"))),
    # a mask indexes s
    ("a mask by the index of one", lambda: Diagram("m", causal(linear().outputs[0], "s", "f", name="Z"))),
    # a rename of s
    ("a rename of one", lambda: Diagram("rn", rename(linear().outputs[0], s="t", name="Z"))),
    # an array carries s without b
    ("an array with one but not the other", lambda: Diagram(
        "one", (linear(residual_axes=()).outputs[0] + array("P", S, F)).named("Z"))),
])
def test_nothing_folds_where_a_box_or_an_array_treats_the_axes_apart(why, diagram):
    d = diagram()
    sizes = {n: SIZES.get(n, 5) for n in d.axes}
    assert foldable(d.bind(**sizes)) == (), why


def test_no_fold_without_a_contraction_or_over_an_innermost_axis():
    x = array("X", B, S, E)
    assert foldable(Diagram("map", gelu(x, name="Y")).bind(b=2, s=3, e=4)) == ()
    # s is innermost in X: a fold would change the rows TMA and vector loads read
    d = Diagram("c", contract(array("X", B, S), array("W", F, S), over=(), out=(B, S, F), name="Y"))
    assert all("s" not in f.parts for f in foldable(d.bind(b=2, s=3, f=4)))


def test_three_axes_in_a_run_fold_into_one():
    a, b, c, k, n = axes("a b c k n")
    d = Diagram("t4", contract(array("A", a, b, c, k), array("B", k, n), over=k, name="C")).bind(a=2, b=3, c=5, k=8, n=4)
    (f,) = foldable(d)
    assert f.parts == ("a", "b", "c") and f.size == 30
    assert unfolded_shape(fold(d, (f,)).outputs[0], (f,)) == (2, 3, 5, 4)


def test_a_folded_diagram_computes_the_same_arrays():
    torch = pytest.importorskip("torch")
    d = linear().bind(**SIZES)
    fd = fold(d, foldable(d))
    g = torch.Generator().manual_seed(0)
    ins = {v.name: torch.randn(*[a.bound_size for a in v.axes], generator=g, dtype=torch.float64) for v in d.inputs}
    want = d.reference(ins, dtype=torch.float64)["Y"]
    flat = {v.name: ins[v.name].reshape([a.bound_size for a in v.axes]) for v in fd.inputs}
    got = fd.reference(flat, dtype=torch.float64)["Y"]
    assert torch.equal(got.reshape(want.shape), want)


def test_a_fold_that_does_not_fit_is_refused_and_folds_read_back():
    d = linear().bind(**SIZES)
    with pytest.raises(DiagramError, match="not of sizes"):
        fold(d, (AxisFold("b_s", ("b", "s"), (5, 6)),))
    f = AxisFold("b_s", ("b", "s"), (6, 5))
    assert AxisFold.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError):
        AxisFold.from_dict({"axis": "x", "parts": ["b"], "sizes": [6]})


def test_runs_past_32_bit_indices_stay_apart_and_names_never_clash():
    b_s = axes("b_s")[0]
    X, W = array("X", B, S, E), array("W", F, E)
    big = Diagram("big", contract(X, W, over=E, out=(B, S, F), name="Y")).bind(b=1 << 16, s=1 << 16, e=8, f=8)
    assert foldable(big) == ()
    d = Diagram("clash", (contract(X, W, over=E, out=(B, S, F), name="Y") + array("Z", b_s)).named("V"))
    (f,) = foldable(d.bind(b=2, s=3, e=8, f=8, b_s=8))
    assert f.axis == "b_s_" and f.parts == ("b", "s")


def heads_contraction(b_axes=None, over=None) -> Diagram:
    """C[a, n] = Σ_{h, d} A[a, h, d]·B[n, h, d]: a sum over two axes that lie side by side."""
    a, h, d, n = axes("a h d n")
    B = array("B", *(b_axes or (n, h, d)))
    return Diagram("heads", contract(array("A", a, h, d), B, over=over or (h, d), name="C"))


def test_a_sum_over_a_run_folds_into_one_summed_axis():
    d = heads_contraction().bind(a=6, h=4, d=8, n=5)
    folds = foldable(d)
    assert folds == (AxisFold("h_d", ("h", "d"), (4, 8)),) and summed_folds(d, folds) == folds
    fd = fold(d, folds)
    assert [v.label() for v in fd.inputs] == ["A[a,h_d]", "B[n,h_d]"]
    assert fd.outputs[0].op.over == ("h_d",) and fd.outputs[0].label() == "C[a,n]"
    # the sum written in the other order is the same sum
    d2 = heads_contraction(over=("d", "h")).bind(a=6, h=4, d=8, n=5)
    assert fold(d2, foldable(d2)).outputs[0].op.over == ("h_d",)
    # the linear layer's b, s fold is not a summed one
    lin = linear().bind(**SIZES)
    assert summed_folds(lin, foldable(lin)) == ()


def test_a_run_summed_in_part_or_stored_apart_stays_apart():
    a, h, d, n = axes("a h d n")
    # B stores d before h: no run
    assert foldable(heads_contraction(b_axes=(n, d, h)).bind(a=6, h=4, d=8, n=5)) == ()
    # the sum is over d alone: h is an output axis of C, d is summed; no run
    part = Diagram("part", contract(array("A", a, h, d), array("B", n, h, d), over=d, out=(a, h, n), name="C"))
    assert foldable(part.bind(a=6, h=4, d=8, n=5)) == ()
    with pytest.raises(DiagramError, match="sums over"):
        fold(part.bind(a=6, h=4, d=8, n=5), (AxisFold("h_d", ("h", "d"), (4, 8)),))


def test_a_folded_sum_computes_the_same_array():
    torch = pytest.importorskip("torch")
    d = heads_contraction().bind(a=6, h=4, d=8, n=5)
    fd = fold(d, foldable(d))
    g = torch.Generator().manual_seed(1)
    ins = {v.name: torch.randn(*[a.bound_size for a in v.axes], generator=g, dtype=torch.float64) for v in d.inputs}
    want = d.reference(ins, dtype=torch.float64)["C"]
    flat = {v.name: ins[v.name].reshape([a.bound_size for a in v.axes]) for v in fd.inputs}
    torch.testing.assert_close(fd.reference(flat, dtype=torch.float64)["C"], want, rtol=1e-12, atol=1e-12)
