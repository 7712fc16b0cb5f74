"""Every builder mistake raises a DiagramError naming what is wrong (issue #16, item 5).

A table of wrong arguments, one row per builder and argument, each with a fragment the message
must hold; then random junk (ints, floats, strings, None, lists, dicts, objects, huge and
non-finite numbers) fed into every argument of every public builder: the builder either succeeds
or raises a DiagramError, never a TypeError, ValueError, ZeroDivisionError, OverflowError,
AttributeError or anything else.
"""

from __future__ import annotations

import math

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napkin.diagrams import (Axis, Diagram, alibi, array, axes, causal, contract, exp, layernorm, library, map_fn,
                             max_over, mean_over, reduce, relu, rename, rmsnorm, scale, sliding_window, softcap,
                             softmax, sum_over)
from napkin.errors import DiagramError


def _arrays():
    h, q, x, d = Axis("h", 2), Axis("q", 3), Axis("x", 4), Axis("d", 5)
    Q, K = array("Q", h, q, d, dtype="fp32"), array("K", h, x, d, dtype="fp32")
    S = contract(Q, K, over="d", name="S")
    return dict(h=h, q=q, x=x, d=d, Q=Q, K=K, S=S)


A = _arrays()
S, Q, K = A["S"], A["Q"], A["K"]
D = Diagram("attn_scores", softmax(S, over="x", name="P"))
DS = library.get("attention")  # symbolic sizes


class Junk:
    def __repr__(self):
        return "<Junk>"


CASES = [
    # (what, build, fragment of the message)
    ("Diagram name int", lambda: Diagram(3, S), "diagram name 3"),
    ("Diagram outputs int", lambda: Diagram("d", 3), "outputs must be a napkin array"),
    ("Diagram outputs None", lambda: Diagram("d", None), "outputs must be a napkin array"),
    ("Diagram outputs empty", lambda: Diagram("d", ()), "has no outputs"),
    ("Diagram outputs list of junk", lambda: Diagram("d", [S, 3]), "outputs must be napkin arrays"),
    ("Diagram inputs int", lambda: Diagram("d", S, 3), "inputs must be a napkin array"),
    ("Diagram inputs junk", lambda: Diagram("d", S, [Q, "K"]), "inputs must be napkin arrays"),
    ("Diagram inputs computed", lambda: Diagram("d", softmax(S, over="x"), [Q, K, S]), "computed, not an input"),
    ("Diagram inputs missing", lambda: Diagram("d", S, [Q]), "not listed"),
    ("Diagram description", lambda: Diagram("d", S, description=3), "description must be a string"),
    ("array name", lambda: array(3, A["q"]), "array name 3"),
    ("array axis junk", lambda: array("X", "q"), "expected Axis objects"),
    ("array axis twice", lambda: array("X", A["q"], A["q"]), "appears twice"),
    ("array dtype int", lambda: array("X", A["q"], dtype=3), "unknown dtype 3"),
    ("array dtype None", lambda: array("X", A["q"], dtype=None), "unknown dtype None"),
    ("Axis size float", lambda: Axis("q", 2.5), "is not an integer"),
    ("Axis size 2.0", lambda: Axis("q", 2.0), "is not an integer"),
    ("Axis size bool", lambda: Axis("q", True), "is not an integer"),
    ("Axis size str", lambda: Axis("q", "4"), "is not an integer"),
    ("Axis size 0", lambda: Axis("q", 0), "sizes must be positive"),
    ("Axis size huge", lambda: Axis("q", 10 ** 320), "largest axis size"),
    ("Axis size expr", lambda: Axis("q", sympy.Symbol("a") + 1), "not an integer or a size symbol"),
    ("axes spec int", lambda: axes(3), "expected a spec string"),
    ("axes spec size", lambda: axes("q=x"), "is not an integer"),
    ("contract no inputs", lambda: contract(over="d"), "needs at least one input"),
    ("contract junk input", lambda: contract(Q, 3, over="d"), "expected napkin arrays"),
    ("contract over int", lambda: contract(Q, K, over=3), "expected an axis"),
    ("contract over missing", lambda: contract(Q, K, over="z"), "not carried by any input"),
    ("contract over twice", lambda: contract(Q, K, over=("d", "d")), "listed twice"),
    ("contract out wrong", lambda: contract(Q, K, over="d", out=("q",)), "must list exactly"),
    ("contract name", lambda: contract(Q, K, over="d", name="a b"), "array name 'a b'"),
    ("map_fn unknown", lambda: map_fn("system", S), "unknown elementwise function 'system'"),
    ("map_fn fn list", lambda: map_fn(["exp"], S), "must be a name from the whitelist"),
    ("map_fn fn None", lambda: map_fn(None, S), "must be a name from the whitelist"),
    ("map_fn arity", lambda: map_fn("add", S), "takes 2 array input(s)"),
    ("map_fn params int", lambda: map_fn("scale", S, params=3), "params must be a tuple"),
    ("map_fn params str", lambda: map_fn("scale", S, params="3"), "params must be a tuple"),
    ("map_fn params count", lambda: map_fn("scale", S, params=(1, 2)), "takes 1 scalar parameter"),
    ("map_fn index axes int", lambda: map_fn("causal", S, params=(0,), index_axes=3), "expected an axis"),
    ("map_fn index axes count", lambda: map_fn("causal", S, params=(0,), index_axes=("q",)), "reads 2 index axes"),
    ("map_fn index axis missing", lambda: map_fn("causal", S, params=(0,), index_axes=("q", "d")),
     "index axis 'd' is not carried"),
    ("map_fn causal fraction", lambda: map_fn("causal", S, params=(0.5,), index_axes=("q", "x")),
     "causal: offset must be a finite integer"),
    ("reduce how", lambda: reduce(S, "x", how="prod"), "unknown reduction 'prod'"),
    ("reduce how junk", lambda: reduce(S, "x", how=None), "unknown reduction None"),
    ("reduce over missing", lambda: reduce(S, "d"), "has no axis 'd'"),
    ("reduce over junk", lambda: sum_over(S, 3), "expected an axis"),
    ("reduce input junk", lambda: max_over(3, "x"), "expected napkin arrays"),
    ("softmax over junk", lambda: softmax(S, over=None), "expected an axis"),
    ("softmax over missing", lambda: softmax(S, over="d"), "has no axis 'd'"),
    ("layernorm eps str", lambda: layernorm(S, "x", eps="x"), "layernorm: eps: 'x' is not a number"),
    ("layernorm eps 0", lambda: layernorm(S, "x", eps=0), "layernorm: eps: 0 is not > 0"),
    ("layernorm eps negative", lambda: layernorm(S, "x", eps=-1e-5), "is not > 0"),
    ("layernorm eps below float32", lambda: layernorm(S, "x", eps=1e-300), "below the smallest normal float32"),
    ("rmsnorm eps float32 subnormal", lambda: rmsnorm(S, "x", eps=1e-45), "it would be 0 there"),
    ("layernorm eps nan", lambda: layernorm(S, "x", eps=math.nan), "not a finite real number"),
    ("rmsnorm eps inf", lambda: rmsnorm(S, "x", eps=math.inf), "rmsnorm: eps: inf is not a finite"),
    ("rmsnorm eps None", lambda: rmsnorm(S, "x", eps=None), "rmsnorm: eps: None is not a number"),
    ("rmsnorm eps bool", lambda: rmsnorm(S, "x", eps=True), "rmsnorm: eps: True is not a number"),
    ("rename to junk", lambda: rename(S, q=3), "expected an axis"),
    ("rename missing", lambda: rename(S, z="w"), "has no axis 'z'"),
    ("rename clash", lambda: rename(S, q="x"), "would appear twice"),
    ("rename bad name", lambda: rename(S, q="x\n"), "axis name 'x\\n'"),
    ("rename mapping junk", lambda: rename(S, 3), "the mapping must map old axis names"),
    ("rename bad old name", lambda: rename(S, {"q\n": "k"}), "axis name 'q\\n'"),
    ("scale str", lambda: scale(S, "2"), "map scale: parameter c: '2' is not a number"),
    ("scale nan", lambda: scale(S, math.nan), "map scale: parameter c: nan is not a finite"),
    ("scale huge int", lambda: scale(S, 10 ** 400), "not a finite real number"),
    ("softcap 0", lambda: softcap(S, 0.0), "cap: must not be 0"),
    ("softcap subnormal", lambda: softcap(S, 1e-300), "below the smallest normal float32"),
    ("scale past float32", lambda: scale(S, 1e39), "beyond the float32 range"),
    ("S / tiny", lambda: S / 1e-39, "beyond the float32 range"),
    ("layernorm eps past float32", lambda: layernorm(S, "x", eps=1e300), "beyond the float32 range"),
    ("softcap inf", lambda: softcap(S, math.inf), "cap: inf is not a finite"),
    ("causal offset", lambda: causal(S, "q", "x", offset=-0.5), "causal: offset must be a finite integer"),
    ("causal offset nan", lambda: causal(S, "q", "x", offset=math.nan), "causal: offset"),
    ("causal offset 1e300", lambda: causal(S, "q", "x", offset=1e300), "must lie in [-2^62, 2^62]"),
    ("causal axes junk", lambda: causal(S, 3, "x"), "expected an axis"),
    ("window 2.7", lambda: sliding_window(S, "q", "x", 2.7), "sliding_window: window must be a finite integer"),
    ("window 0", lambda: sliding_window(S, "q", "x", 0), "must lie in [1, 2^62]"),
    ("window str", lambda: sliding_window(S, "q", "x", "abc"), "sliding_window: window"),
    ("alibi missing axis", lambda: alibi(S, "z", "q", "x"), "index axis 'z'"),
    ("exp junk", lambda: exp(3), "expected napkin arrays"),
    ("relu name", lambda: relu(S, name=3), "array name 3"),
    ("S + str", lambda: S + "x", "'x' is neither a napkin array nor a number"),
    ("str + S", lambda: "x" + S, "is neither a napkin array nor a number"),
    ("S - None", lambda: S - None, "None is neither"),
    ("None - S", lambda: None - S, "None is neither"),
    ("S * list", lambda: S * [1], "[1] is neither"),
    ("S / 0", lambda: S / 0, "division by zero"),
    ("S / 0.0", lambda: S / 0.0, "division by zero"),
    ("S / -0.0", lambda: S / -0.0, "division by zero"),
    ("S / 1e-320", lambda: S / 1e-320, "reciprocal of the scalar is not a finite"),
    ("S / sympy 0", lambda: S / sympy.Integer(0), "division by zero"),
    ("S / nan", lambda: S / math.nan, "nan is not a finite"),
    ("S * inf", lambda: S * math.inf, "inf is not a finite"),
    ("S + -inf", lambda: S + -math.inf, "-inf is not a finite"),
    ("S * bool", lambda: S * True, "True is neither"),
    ("2 / S", lambda: 2 / S, "dividing a scalar by an array"),
    ("S ** 2", lambda: S ** 2, "powers are not a whitelisted map"),
    ("S @ S", lambda: S @ S, "contract(a, b, over=axis)"),
    ("S + mismatched", lambda: S + array("T", Axis("q", 9), dtype="fp32"), "axis 'q' has size 3"),
    ("bind sizes list", lambda: D.bind([("q", 3)]), "sizes must be a mapping"),
    ("bind unknown axis", lambda: D.bind(z=3), "has no axis 'z'"),
    ("bind non-str key", lambda: D.bind({3: 4}), "axis names must be strings"),
    ("bind float", lambda: DS.bind(q=2.5, x=3, d=4), "size 2.5 is not an integer"),
    ("bind 2.0", lambda: DS.bind(q=2.0, x=3, d=4), "size 2.0 is not an integer"),
    ("bind bool", lambda: DS.bind(q=True, x=3, d=4), "size True is not an integer"),
    ("bind negative", lambda: DS.bind(q=-3), "sizes must be positive"),
    ("bind zero", lambda: DS.bind(q=0), "sizes must be positive"),
    ("bind 10**320", lambda: DS.bind(q=10 ** 320), "a 321-digit number, more than the largest axis size"),
    ("bind 2**48+1", lambda: DS.bind(q=2 ** 48 + 1), "more than the largest axis size"),
    ("bind None", lambda: DS.bind(q=None), "size None is not an integer"),
    ("bind str", lambda: DS.bind(q="4"), "size '4' is not an integer"),
    ("with_dtype unknown", lambda: D.with_dtype("int8"), "unknown dtype 'int8'"),
    ("with_dtype junk", lambda: D.with_dtype(None), "unknown dtype None"),
    ("weave junk axis", lambda: D.weave("b"), "expected an Axis"),
    ("weave existing axis", lambda: D.weave(Axis("q")), "already has an axis 'q'"),
    ("weave inputs str", lambda: D.weave(Axis("b"), inputs="Q"), "inputs must be a list of input names"),
    ("weave inputs junk", lambda: D.weave(Axis("b"), inputs=[3]), "inputs must be a list of input names"),
    ("weave unknown input", lambda: D.weave(Axis("b"), inputs=["Z"]), "has no input ['Z']"),
    ("weave long name", lambda: D.weave(Axis("b" * 30)), "diagram name"),
    ("renamed junk", lambda: D.renamed(None), "diagram name None"),
    ("call arity", lambda: D(Q), "takes 2 inputs"),
    ("call junk", lambda: D(Q, 3), "must be a napkin array"),
    ("value unknown", lambda: D.value("zz"), "has no array 'zz'"),
]


@pytest.mark.parametrize("what, build, fragment", CASES, ids=[c[0] for c in CASES])
def test_builder_mistakes_raise_a_diagram_error_naming_them(what, build, fragment):
    with pytest.raises(DiagramError) as e:
        build()
    msg = str(e.value)
    assert fragment in msg, (what, msg)
    assert "\n" not in msg, msg


# ----------------------------------------------------------------------------- random junk

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10 ** 400, max_value=10 ** 400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.sampled_from(["q", "x", "d", "h"]),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none()), max_size=3),
    st.tuples(st.sampled_from(["q", "x", "d"]), st.sampled_from(["q", "x", "d", "z"])),
    st.dictionaries(st.text(max_size=3), st.integers(-2, 2), max_size=2),
    st.just(Junk()), st.just(object()), st.just(1j), st.just(b"q"), st.just(sympy.Symbol("d")),
    st.just(sympy.Symbol("x\n")), st.just(sympy.nan), st.just(sympy.zoo), st.just(Axis("q", 3)),
    st.just(Axis("q", 7)), st.just(S), st.just(Q), st.just(D),
)

BUILDERS = {
    "array": (lambda a, b, c: array(a, b, dtype=c)),
    "Axis": (lambda a, b, c: Axis(a, b)),
    "axes": (lambda a, b, c: axes(a)),
    "contract": (lambda a, b, c: contract(Q, a, over=b, out=c)),
    "contract1": (lambda a, b, c: contract(a, over=b, name=c)),
    "map_fn": (lambda a, b, c: map_fn(a, S, params=b, index_axes=c)),
    "map_fn_causal": (lambda a, b, c: map_fn("causal", S, params=(a,), index_axes=b, name=c)),
    "map_fn_add": (lambda a, b, c: map_fn("add", a, b, name=c)),
    "reduce": (lambda a, b, c: reduce(a, b, how=c)),
    "sum_over": (lambda a, b, c: sum_over(S, a, name=b)),
    "mean_over": (lambda a, b, c: mean_over(a, b)),
    "softmax": (lambda a, b, c: softmax(a, over=b, name=c)),
    "layernorm": (lambda a, b, c: layernorm(S, a, eps=b, name=c)),
    "rmsnorm": (lambda a, b, c: rmsnorm(a, "x", eps=b)),
    "rename": (lambda a, b, c: rename(S, **{a if isinstance(a, str) else "q": b})),
    "rename_mapping": (lambda a, b, c: rename(S, a, name=b)),
    "scale": (lambda a, b, c: scale(S, a, name=c)),
    "softcap": (lambda a, b, c: softcap(S, a)),
    "causal": (lambda a, b, c: causal(S, a, b, offset=c)),
    "causal_offset": (lambda a, b, c: causal(S, "q", "x", offset=a)),
    "sliding_window": (lambda a, b, c: sliding_window(S, "q", "x", a)),
    "alibi": (lambda a, b, c: alibi(S, a, b, c)),
    "add": (lambda a, b, c: S + a),
    "radd": (lambda a, b, c: a + S),
    "sub": (lambda a, b, c: S - a),
    "rsub": (lambda a, b, c: a - S),
    "mul": (lambda a, b, c: S * a),
    "div": (lambda a, b, c: S / a),
    "rdiv": (lambda a, b, c: a / S),
    "Diagram": (lambda a, b, c: Diagram(a, b, c)),
    "Diagram_outputs": (lambda a, b, c: Diagram("d", a, description=b)),
    "bind": (lambda a, b, c: DS.bind({a: b} if isinstance(a, str) else a)),
    "bind_kw": (lambda a, b, c: DS.bind(q=a, x=b, d=c)),
    "with_dtype": (lambda a, b, c: D.with_dtype(a)),
    "weave": (lambda a, b, c: D.weave(a, inputs=b, name=c)),
    "call": (lambda a, b, c: D(a, b)),
    "renamed": (lambda a, b, c: D.renamed(a)),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("builder", sorted(BUILDERS))
@given(a=JUNK, b=JUNK, c=JUNK)
def test_random_junk_into_a_builder_raises_only_diagram_errors(builder, a, b, c):
    try:
        BUILDERS[builder](a, b, c)
    except DiagramError as e:
        assert str(e) and "\n" not in str(e)
