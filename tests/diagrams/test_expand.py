"""Writing softmax and the norms out as primitive boxes: same meaning, stable names, clear errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from napkin.diagrams import Diagram, array, axes, layernorm, rmsnorm, softmax
from napkin.diagrams.expand import expand, expandable
from napkin.errors import DiagramError
from napkin_test_support import einsum_cases

a, b, c = axes("a b c")
BUILDERS = {"softmax": lambda x, ax: softmax(x, ax), "layernorm": lambda x, ax: layernorm(x, ax, eps=1e-3),
            "rmsnorm": lambda x, ax: rmsnorm(x, ax, eps=1e-4)}


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(sorted(BUILDERS)), axis=st.sampled_from("abc"), scale=st.floats(0.1, 30.0),
       seed=st.integers(0, 2 ** 16))
def test_the_written_out_diagram_computes_the_same(kind, axis, scale, seed):
    X = array("X", a, b, c)
    y = (BUILDERS[kind](X, axis) * 2.0).named("Y")
    d = Diagram("t", y).bind(a=3, b=5, c=7)
    e = expand(d, expandable(d))
    assert not expandable(e)
    x = torch.randn(3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * scale
    torch.testing.assert_close(e.reference({"X": x})["Y"], d.reference({"X": x})["Y"], rtol=1e-12, atol=1e-12)


def test_outputs_and_readers_keep_their_names_and_the_parts_are_named_after_the_box():
    X = array("X", a, b)
    P = softmax(X, a, name="P")
    d = Diagram("t", ((P * 3.0).named("Z"), P))
    e = expand(d, ["P"])
    assert e.output_names == ("Z", "P")
    assert [e.name_of(v) for v in e.nodes][:7] == ["P_max", "P_shifted_again", "P_exp_again", "P_shifted", "P_exp",
                                                  "P_sum", "P"]
    assert e.input_names == d.input_names


def test_a_taken_name_gets_a_number():
    X = array("X", a, b)
    taken = (X * 1.0).named("N_square")
    d = Diagram("t", (rmsnorm(taken, b, name="N") + taken).named("Y"))
    e = expand(d, ["N"])
    names = [e.name_of(v) for v in e.nodes]
    assert "N_square2" in names and names.count("N_square") == 1


def test_the_same_names_give_the_same_diagram():
    d = Diagram("t", layernorm(array("X", a, b), a, name="L"))
    e1, e2 = expand(d, ["L"]), expand(d, ["L"])
    assert [e1.name_of(v) for v in e1.nodes] == [e2.name_of(v) for v in e2.nodes]
    assert [v.op for v in e1.nodes] == [v.op for v in e2.nodes]


def test_only_softmax_and_norm_boxes_can_be_written_out():
    X = array("X", a, b)
    d = Diagram("t", softmax((X * 2.0).named("T"), b, name="P"))
    with pytest.raises(DiagramError, match="'T' is not a softmax or norm box it can expand"):
        expand(d, ["T"])
    with pytest.raises(DiagramError, match="those are: P"):
        expand(d, ["nope"])
    assert expand(d, []) is d


def test_a_product_of_an_array_with_a_view_of_itself_copies_the_view_row_by_row():
    """G = X·Xᵀ (X[a,d] and its rename X[b,d]): one kernel cannot read X under both sets of axes,
    so the view is copied, into the layout the contraction family reads that keeps d innermost
    (G_b[b,d], a copy row by row, where [d,b] would be a transpose); the plan runs it off the
    fallback, and the written-out diagram computes the same."""
    from napkin.codegen.planner import derive
    from napkin.diagrams import contract, rename

    _, n, d = axes("a n d")
    X = array("X", a, d)
    g = Diagram("gram", contract(X, rename(X, a="n"), over=d, out=(a, n), name="G")).bind(a=300, n=300, d=72)
    e = expand(g, ["G"])
    copies = {e.name_of(v): v.axis_names for v in e.nodes if v.op.kind == "contract" and not v.op.over}
    assert copies == {"G_b": ("n", "d")}
    x = torch.randn(300, 72, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(e.reference({"X": x})["G"], x @ x.T, rtol=1e-12, atol=1e-12)
    plan = derive(g, "h200", "bf16", explain=False).plan
    assert [k.kernel.family for k in plan.kernels] == ["pointwise", "contraction"], plan.summary()
    # a view of another array in a layout the family reads is read where it is, not copied
    m = axes("m")[0]
    other = Diagram("t", contract(X, rename(array("B", m, d), m="n"), over=d, out=(a, n), name="G"))
    e = expand(other, ["G"])
    assert [v.op.kind for v in e.nodes] == ["rename", "contract"]


@pytest.mark.parametrize("name", sorted(einsum_cases()))
def test_a_contraction_of_one_or_many_operands_is_written_as_pairs_and_sums(name):
    """Each is rewritten as maps, reductions and contractions of two operands, the same sum."""
    d = Diagram("t", einsum_cases()[name].named("Y"))
    d = d.bind(**{ax: size for ax, size in dict(i=3, j=4, k=5, n=6, z=2).items() if ax in d.axes})
    assert expandable(d) == ("Y",)
    e = expand(d, ["Y"])
    assert all(len(v.args) == 2 for v in e.nodes if v.op.kind == "contract" and v.op.over)
    assert e.output_names == ("Y",) and e.outputs[0].axis_names == d.outputs[0].axis_names
    gen = torch.Generator().manual_seed(0)
    x = {v.name: torch.randn(*(ax.bound_size for ax in v.axes), dtype=torch.float64, generator=gen) for v in d.inputs}
    torch.testing.assert_close(e.reference(x)["Y"], d.reference(x)["Y"], rtol=1e-12, atol=1e-12)


def test_a_map_over_no_axis_is_made_again_for_each_reader():
    """A scalar read by two boxes (a loss's scale in a backward) is computed in each reader: no
    kernel of one value of its own; where it is an output it stays, under its name."""
    from napkin.diagrams import scale

    t = array("t")
    ts = scale(t, 0.5, name="ts")
    X = array("X", a, b)
    d = Diagram("s", ((X * ts).named("Y1"), softmax(X + ts, b, name="Y2"), ts)).bind(a=3, b=4)
    assert "ts" in expandable(d)
    e = expand(d, ["ts"])
    scalars = sorted(e.name_of(v) for v in e.nodes if not v.axis_names)
    assert scalars == ["ts", "ts_Y1", "ts_add"] and e.output_names == d.output_names
    x = {"t": torch.tensor(1.7, dtype=torch.float64), "X": torch.randn(3, 4, dtype=torch.float64)}
    for k, want in d.reference(x).items():
        torch.testing.assert_close(e.reference(x)[k], want, rtol=1e-12, atol=1e-12)
