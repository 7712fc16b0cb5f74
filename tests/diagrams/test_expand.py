"""Writing softmax and the norms out as primitive boxes: same meaning, stable names, clear errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from napkin.diagrams import Diagram, array, axes, layernorm, rmsnorm, softmax
from napkin.diagrams.expand import expand, expandable
from napkin.errors import DiagramError

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
