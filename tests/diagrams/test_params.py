"""Scalar parameters of maps (issue #16, items 2 and 3).

- A sympy parameter may only be plain arithmetic (numbers, axis-size symbols, + - * / ** and sqrt):
  free text in a symbol's or a function's name never reaches a label, a comment or the .cu.
- Mask parameters (the causal offset, the window) are finite integers in a safe range, checked
  when the map is built (by ``causal``, ``sliding_window`` and ``map_fn`` alike); ``3.0`` is taken
  as ``3``; the CUDA form writes them as ``long long`` literals and the reference compares integers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy
import torch

from napkin.codegen.generate import generate_source
from napkin.codegen.render import Code, map_expr
from napkin.diagrams import (Axis, Diagram, array, axes, causal, contract, map_fn, scale, sliding_window,
                             softcap, softmax)
from napkin.diagrams.functions import FUNCTIONS, MAX_INT_PARAM
from napkin.diagrams.ops import Map, Value
from napkin.errors import CodegenError, DiagramError, NapkinError

d_sym = sympy.Symbol("d", integer=True, positive=True)


def scores():
    q, x = Axis("q", 5), Axis("x", 7)
    return array("S", q, x, dtype="fp32")


# ----------------------------------------------------------------------------- sympy parameters

EVIL_EXPRS = [
    sympy.Symbol("x\n*/ evil"),
    sympy.Symbol("d\n#error boom"),
    1 / sympy.sqrt(sympy.Symbol("d */ asm(\"trap;\") /*")),
    sympy.Function("foo\nbar")(d_sym),
    sympy.Function("f")(d_sym),
    sympy.sin(d_sym),
    sympy.exp(d_sym),
    sympy.log(d_sym),
    sympy.Abs(sympy.Symbol("y")),
    sympy.floor(d_sym / 2),
    sympy.Max(d_sym, 2),
    sympy.Piecewise((1, d_sym > 2), (2, True)),
    sympy.Dummy("d"),
    sympy.Wild("d"),
    sympy.I * d_sym,
    sympy.zoo * d_sym,
    sympy.oo,
    sympy.nan,
    sympy.Symbol("é"),
    sympy.Symbol("d" * 40),
]


@pytest.mark.parametrize("expr", EVIL_EXPRS, ids=range(len(EVIL_EXPRS)))
def test_a_parameter_that_is_not_plain_arithmetic_is_refused_when_built(expr):
    S = scores()
    for build in (lambda: scale(S, expr), lambda: S * expr, lambda: S + expr, lambda: softcap(S, expr),
                  lambda: map_fn("shift", S, params=(expr,))):
        with pytest.raises(DiagramError, match=r"map (scale|shift|softcap): parameter|\*|\+") as e:
            build()
        assert "\n" not in str(e.value)


def test_the_error_names_the_function_and_the_parameter():
    with pytest.raises(DiagramError, match=r"map softcap: parameter cap: symbol 'x\\n\*/ evil' is not an axis name"):
        softcap(scores(), sympy.Symbol("x\n*/ evil"))
    with pytest.raises(DiagramError, match="map scale: parameter c: .*not plain arithmetic"):
        scale(scores(), sympy.Function("foo\nbar")(d_sym))


@pytest.mark.parametrize("expr", [1 / sympy.sqrt(d_sym), d_sym ** -sympy.Rational(1, 2), 2 * d_sym + 1,
                                  sympy.Float(0.5) * d_sym, sympy.sqrt(2) / d_sym, sympy.pi / d_sym,
                                  sympy.Symbol("d") / 3])
def test_plain_arithmetic_in_axis_sizes_is_accepted(expr):
    q, x, d = axes("q x d")
    S = contract(array("Q", q, d), array("K", x, d), over=d)
    P = scale(S, expr, name="Ss")
    dg = Diagram("scaled", softmax(P, over="x", name="P")).bind(q=3, x=4, d=16)
    (v,) = [n for n in dg.nodes if n.op.kind == "map"]
    (value,) = v.op.param_values(dg.sizes)
    assert value == pytest.approx(float(expr.subs({s: 16 for s in expr.free_symbols})))


def test_a_tampered_map_with_an_evil_symbol_never_reaches_cuda():
    """A Map built around the checks (Value() directly) is refused where codegen reads it."""
    S = scores()
    evil = Value(Map("scale", (sympy.Symbol("x\n*/ evil"),)), (S,), S.axes, S.dtype, "E")
    d = Diagram("tampered", softmax(evil, over="x", name="P"))
    with pytest.raises(NapkinError):
        generate_source(d)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10 ** 400, "1", None, True, [1.0], 1j])
def test_float_parameters_are_finite_numbers(bad):
    with pytest.raises(DiagramError, match="map scale: parameter c"):
        scale(scores(), bad)
    with pytest.raises(DiagramError, match="map shift: parameter c"):
        map_fn("shift", scores(), params=(bad,))


def test_softcap_of_zero_is_refused():
    with pytest.raises(DiagramError, match="map softcap: parameter cap: must not be 0"):
        softcap(scores(), 0)


def test_a_symbolic_parameter_that_evaluates_to_a_non_finite_value_is_refused_when_read():
    q, x, d = axes("q x d")
    S = contract(array("Q", q, d), array("K", x, d), over=d)
    dg = Diagram("div0", scale(S, 1 / (d_sym - 16), name="Ss")).bind(q=2, x=2, d=16)
    (v,) = [n for n in dg.nodes if n.op.kind == "map"]
    with pytest.raises(DiagramError, match="map scale: parameter c: .*not a finite real number"):
        v.op.param_values(dg.sizes)


# ----------------------------------------------------------------------------- integer mask parameters

BAD_OFFSETS = [0.5, -0.5, 2.7, math.nan, math.inf, -math.inf, 1e300, -1e300, True, False, "3", None,
               sympy.Symbol("d"), sympy.Rational(1, 2), MAX_INT_PARAM + 1, -MAX_INT_PARAM - 1, 10 ** 400, 1j]


@pytest.mark.parametrize("bad", BAD_OFFSETS, ids=[repr(b)[:20] for b in BAD_OFFSETS])
def test_causal_offsets_are_finite_integers_in_range(bad):
    S = scores()
    with pytest.raises(DiagramError, match="causal: offset"):
        causal(S, "q", "x", offset=bad)
    with pytest.raises(DiagramError, match="causal: offset"):
        map_fn("causal", S, params=(bad,), index_axes=("q", "x"))


@pytest.mark.parametrize("bad", [0, -1, 0.5, 2.7, math.nan, math.inf, 1e300, True, "3", None, sympy.Symbol("w"),
                                 MAX_INT_PARAM + 1])
def test_windows_are_integers_from_one(bad):
    S = scores()
    with pytest.raises(DiagramError, match="sliding_window: window"):
        sliding_window(S, "q", "x", bad)
    with pytest.raises(DiagramError, match="sliding_window: window"):
        map_fn("sliding_window", S, params=(bad,), index_axes=("q", "x"))


@pytest.mark.parametrize("given, stored", [(3, 3), (3.0, 3), (-2.0, -2), (np.int64(4), 4), (np.float32(5.0), 5),
                                           (sympy.Integer(6), 6), (MAX_INT_PARAM, MAX_INT_PARAM),
                                           (-float(2 ** 62), -MAX_INT_PARAM)])
def test_integral_values_are_normalised_to_int(given, stored):
    m = causal(scores(), "q", "x", offset=given)
    assert m.op.params == (stored,) and type(m.op.params[0]) is int
    assert m.op == Map("causal", (stored,), ("q", "x"))


def test_the_map_op_itself_checks_its_parameters():
    S = scores()
    from napkin.diagrams.ops import apply

    with pytest.raises(DiagramError, match="causal: offset must be a finite integer, got 0.5"):
        apply(Map("causal", (0.5,), ("q", "x")), (S,))
    # a tampered Value that skipped apply() is refused where its parameters are read
    tampered = Value(Map("causal", (0.5,), ("q", "x")), (S,), S.axes, S.dtype, "M")
    with pytest.raises(DiagramError, match="causal: offset"):
        tampered.op.param_values({})
    with pytest.raises(NapkinError):
        generate_source(Diagram("tampered_mask", softmax(tampered, over="x", name="P")))


def test_mask_parameters_reach_cuda_as_long_long_literals():
    assert FUNCTIONS["causal"].int_param(0) and FUNCTIONS["sliding_window"].int_param(0)
    s, iq, ix = Code("s"), Code("i_q"), Code("i_x")
    assert map_expr("causal", [s], [3], [iq, ix]) == "((i_x <= i_q + 3LL) ? s : -INFINITY)"
    assert map_expr("causal", [s], [-(2 ** 40)], [iq, ix]) == f"((i_x <= i_q + (-{2 ** 40}LL)) ? s : -INFINITY)"
    assert "3LL" in map_expr("sliding_window", [s], [3.0], [iq, ix])
    for bad in (0.5, math.nan, math.inf, 1e300):
        with pytest.raises(CodegenError, match="causal: offset"):
            map_expr("causal", [s], [bad], [iq, ix])
    with pytest.raises(CodegenError, match="sliding_window: window"):
        map_expr("sliding_window", [s], [0], [iq, ix])
    # no float round trip: an offset past 2^53 is written exactly
    big = 2 ** 53 + 1
    assert f"{big}LL" in map_expr("causal", [s], [big], [iq, ix])


def test_generated_code_and_reference_use_the_integer_offset():
    q, x = Axis("q", 6), Axis("x", 9)
    S = array("S", q, x, dtype="fp32")
    d = Diagram("masked", softmax(causal(S, q, x, offset=-2.0, name="M"), over="x", name="P"))
    src = generate_source(d)
    (line,) = [ln for ln in src.splitlines() if "a_M = " in ln]
    assert line.strip() == "const float a_M = ((i_x <= i_q + (-2LL)) ? a_S : -INFINITY);"
    out = d.reference({"S": torch.zeros(6, 9, dtype=torch.float64)}, keep_intermediates=True)["M"]
    qi, xi = torch.meshgrid(torch.arange(6), torch.arange(9), indexing="ij")
    assert torch.equal(torch.isinf(out), xi > qi - 2)


def test_labels_print_integer_parameters_exactly():
    m = causal(scores(), "q", "x", offset=2 ** 53 + 1)
    assert m.op.label() == f"causal({2 ** 53 + 1})"
