"""The diagram model as a value: immutability, identity, views, weaving, binding, composition, renaming."""

from __future__ import annotations

import pytest

from napkin.diagrams import (Axis, Diagram, array, axes, contract, layernorm, library, rename, softmax, sum_over)
from napkin.errors import DiagramError, NapkinError


def attention_by_hand(name="attn"):
    q, x, d = axes("q x d")
    Q, K, V = array("Q", q, d), array("K", x, d), array("V", x, d)
    P = softmax(contract(Q, K, over=d, name="S"), over=x, name="P")
    return Diagram(name, contract(P, V, over=x, name="O"))


# ----------------------------------------------------------------------------- immutability

@pytest.mark.parametrize("field", ["name", "outputs", "inputs", "description"])
def test_diagram_fields_cannot_be_set(field):
    d = library.get("attention")
    with pytest.raises(AttributeError):
        setattr(d, field, "x")
    assert d == library.get("attention")


@pytest.mark.parametrize("field", ["nodes", "axes", "brand_new_attribute"])
def test_diagram_derived_attributes_cannot_be_set(field):
    d = library.get("attention")
    with pytest.raises(AttributeError):
        setattr(d, field, ())


def test_values_are_immutable():
    a, b = axes("a b")
    A = array("A", a, b)
    for field in ("name", "axes", "dtype", "op", "anything"):
        with pytest.raises(AttributeError):
            setattr(A, field, None)
    with pytest.raises(Exception):
        Axis("a", 3).size = 4  # frozen dataclass


def test_bind_returns_a_new_diagram():
    d = library.get("matmul")
    b = d.bind(a=2, b=3, c=4)
    assert not d.is_bound and b.is_bound
    assert all(not a.is_bound for a in d.axes.values())


# ----------------------------------------------------------------------------- identity

@pytest.mark.parametrize("name", library.names())
def test_two_builds_are_equal_and_hash_equal(name):
    d1, d2 = library.get(name), library.get(name)
    assert d1 is not d2
    assert d1 == d2 and hash(d1) == hash(d2)
    assert len({d1, d2}) == 1
    input_axes = {a for v in d1.inputs for a in v.axis_names}
    sizes = {n: 3 + i for i, n in enumerate(d1.axes) if n in input_axes}
    assert d1.bind(sizes) == d2.bind(sizes) and hash(d1.bind(sizes)) == hash(d2.bind(sizes))


def test_different_sizes_are_not_equal():
    d = library.get("attention")
    assert d.bind(q=8, x=8, d=4) != d.bind(q=8, x=8, d=8)
    assert d.bind(q=8, x=8, d=4) != d
    assert library.get("attention") != library.get("mha")


def test_different_dtype_or_name_is_not_equal():
    d = library.get("softmax")
    assert d.with_dtype("fp32") != d
    assert d.with_dtype("fp32").dtypes == {"fp32"}
    assert d.with_dtype("bfloat16") == d  # bf16 is the default and its aliases are the same type
    assert d.renamed("other") != d


def test_hand_built_equals_itself_built_twice():
    assert attention_by_hand() == attention_by_hand()
    assert attention_by_hand() != attention_by_hand("other")


# ----------------------------------------------------------------------------- views

def test_repr_and_summary():
    d = library.get("attention")
    assert repr(d) == "Diagram('attention': Q[q,d], K[x,d], V[x,d] → O[q,d]; 4 boxes)"
    s = d.summary()
    assert s.splitlines()[0].startswith("diagram attention")
    for text in ("input    Q[q,d] bf16", "input    K[x,d] bf16", "input    V[x,d] bf16",
                 "softmax x", "woven over q", "output   O[q,d] bf16"):
        assert text in s, text
    assert str(d) == s
    b = d.bind(q=4096, x=1024, d=128).summary()
    assert "q=4096" in b and "x=1024" in b and "d=128" in b


def test_structure_views():
    d = library.get("mlp")
    assert d.input_names == ("X", "W", "bias")
    assert d.output_names == ("Y",)
    assert list(d.axes) == ["a", "b", "c"]
    assert d.value("H").axis_names == ("a", "c")
    assert [d.name_of(v) for v in d.nodes][-1] == "Y"
    with pytest.raises(DiagramError, match="no array 'nope'"):
        d.value("nope")


def test_sizes_and_is_bound():
    d = library.get("attention")
    assert not d.is_bound
    b = d.bind(q=3, x=5, d=2)
    assert b.is_bound and b.sizes == {"q": 3, "d": 2, "x": 5}
    assert b.value("S").axes == (Axis("q", 3), Axis("x", 5))


# ----------------------------------------------------------------------------- weave

def test_mha_is_attention_woven_over_heads():
    woven = library.get("attention").weave(Axis("h"), name="mha")
    assert woven == library.get("mha")
    assert hash(woven) == hash(library.get("mha"))
    assert [v.label() for v in woven.inputs] == ["Q[h,q,d]", "K[h,x,d]", "V[h,x,d]"]


def test_batched_matmul_is_matmul_woven():
    assert library.get("matmul").weave(Axis("n"), name="batched_matmul") == library.get("batched_matmul")


def test_weave_default_name_and_broadcast_inputs():
    d = library.get("attention").weave(Axis("h"), inputs=["Q"])
    assert d.name == "attention_h"
    assert [v.label() for v in d.inputs] == ["Q[h,q,d]", "K[x,d]", "V[x,d]"]
    assert d.outputs[0].axis_names == ("h", "q", "d")


def test_weave_errors():
    d = library.get("attention")
    with pytest.raises(DiagramError, match="already has an axis 'q'"):
        d.weave(Axis("q"))
    with pytest.raises(DiagramError, match="no input"):
        d.weave(Axis("h"), inputs=["Z"])
    with pytest.raises(DiagramError, match="expected an Axis"):
        d.weave("h")


def test_woven_reference_matches_per_head():
    torch = pytest.importorskip("torch")
    mha = library.get("mha").bind(h=3, q=5, x=7, d=4)
    one = library.get("attention").bind(q=5, x=7, d=4)
    from napkin.diagrams.reference import random_inputs

    x = random_inputs(mha, dtype=torch.float64, seed=2)
    out = mha.reference(x)["O"]
    for h in range(3):
        per = one.reference({k: v[h] for k, v in x.items()})["O"]
        assert torch.allclose(out[h], per, atol=1e-12)


# ----------------------------------------------------------------------------- bind

def test_bind_errors():
    d = library.get("attention")
    with pytest.raises(DiagramError, match="no axis 'z'") as e:
        d.bind(z=3)
    assert "'q'" in str(e.value)  # lists the known axes
    for bad in (0, -4):
        with pytest.raises(DiagramError, match="axis 'q'"):
            d.bind(q=bad)
    for bad in ("12", 2.5, True):
        with pytest.raises(DiagramError, match="axis 'q'"):
            d.bind(q=bad)


def test_bind_partially_and_twice():
    d = library.get("attention").bind(d=64)
    assert d.sizes["d"] == 64 and not d.is_bound
    assert d.bind(q=10, x=20).sizes == {"q": 10, "d": 64, "x": 20}


def test_bind_derived_axis_is_not_silently_ignored():
    d = library.get("transformer_block")
    try:
        b = d.bind(q=5, x=7, e=4, h=2, d=3, f=6)
    except DiagramError:
        return  # refusing the conflicting size is fine
    assert b.sizes["x"] == 7


def test_bind_accepts_integer_like_sizes():
    np = pytest.importorskip("numpy")
    assert library.get("softmax").bind(r=np.int64(3), x=4).sizes == {"r": 3, "x": 4}


# ----------------------------------------------------------------------------- composition

def test_compose_with_rshift():
    ln, sm = library.get("layernorm"), library.get("softmax")
    both = ln >> sm
    assert both.name == "layernorm_softmax"
    assert both.input_names == ("X", "gamma", "beta")
    assert both.outputs[0].axis_names == ("r", "x")
    assert "softmax x" in both.summary() and "layernorm x" in both.summary()
    with pytest.raises(DiagramError, match="compose"):
        library.get("attention") >> library.get("matmul")  # 1 output, 2 inputs


def test_compose_reference_is_the_composition():
    torch = pytest.importorskip("torch")
    ln, sm = library.get("layernorm").bind(r=4, x=9), library.get("softmax").bind(r=4, x=9)
    from napkin.diagrams.reference import random_inputs

    x = random_inputs(ln, dtype=torch.float64, seed=0)
    got = (ln >> sm).reference(x)["P"]
    want = sm.reference({"X": ln.reference(x)["Y"]})["P"]
    assert torch.allclose(got, want, atol=1e-12)


def test_calling_a_diagram_on_values():
    att = library.get("attention")
    h, q, x, d = axes("h q x d")
    Q, K, V = array("Q", h, q, d), array("K", h, x, d), array("V", h, x, d)
    O = att(Q, K, V)
    assert O.axis_names == ("h", "q", "d")
    assert Diagram("mha", O) == library.get("mha")  # calling with an extra axis weaves
    with pytest.raises(DiagramError, match="takes 3 inputs"):
        att(Q, K)
    with pytest.raises(DiagramError, match="lacks axes"):
        att(array("Q2", q), K, V)


def test_diagram_call_inside_bigger_diagram():
    sm = library.get("softmax")
    r, x = axes("r x")
    X = array("X", r, x)
    total = sum_over(sm(X), over=x, name="total")
    d = Diagram("softmax_sum", total)
    assert d.outputs[0].axis_names == ("r",)
    torch = pytest.importorskip("torch")
    out = d.bind(r=3, x=11).reference(dtype=torch.float64, seed=0)["total"]
    assert torch.allclose(out, torch.ones(3, dtype=torch.float64))


# ----------------------------------------------------------------------------- rename

def test_rename_value_and_diagram():
    q, e = axes("q e")
    X = array("X", q, e)
    Xk = rename(X, q="x", name="Xk")
    assert Xk.axis_names == ("x", "e")
    assert rename(X, q=Axis("x")).axis_names == ("x", "e")
    with pytest.raises(DiagramError, match="rename z→x"):
        rename(X, z="x")
    with pytest.raises(DiagramError, match="'e' would appear twice"):
        rename(X, q="e")
    d = library.get("attention")
    r = d.renamed("my_attention")
    assert r.name == "my_attention" and r.inputs == d.inputs and r.outputs == d.outputs
    with pytest.raises(DiagramError, match="not allowed"):
        d.renamed("bad name")


def test_named_value():
    a, = axes("a")
    X = array("X", a)
    assert (X * 2.0).named("Y").name == "Y"
    with pytest.raises(DiagramError):
        (X * 2.0).named("no good")


def test_self_attention_shares_the_token_axis():
    q, d = axes("q d")
    X = array("X", q, d)
    K = rename(X, q="x", name="K")
    S = contract(X, K, over=d, name="S")
    P = softmax(S, over="x", name="P")
    d1 = Diagram("self_attn", contract(P, K, over="x", name="O"))
    b = d1.bind(q=6, d=4)
    assert b.is_bound and b.sizes["x"] == 6


def test_errors_are_napkin_errors():
    assert issubclass(DiagramError, NapkinError)
    with pytest.raises(NapkinError):
        layernorm(array("X", *axes("r x")), over="z")
