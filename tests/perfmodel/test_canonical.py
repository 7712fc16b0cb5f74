"""Canonical optimal forms H*(M) = Σ α M^(−β), multi-level time, quantisation, L2 and clusters."""

import math

import pytest
import sympy

from napkin.diagrams import library
from napkin.perfmodel import (
    Schedule,
    canonical_form,
    canonical_form_of,
    cluster_level_weight,
    cost,
    l2_effective_memory,
    levels_from_gpu,
    multilevel_time,
    quantization_speedup,
)
from napkin.perfmodel.canonical import MEMORY as M
from napkin.perfmodel.canonical import CanonicalError

P = lambda n: sympy.Symbol(n, positive=True)
# the cost model's size symbols are positive integers (napkin.diagrams.axes.size_symbol)
a, b, c, q, x, d, h = (sympy.Symbol(n, integer=True, positive=True) for n in "abcqxdh")


def same(e1, e2) -> bool:
    return sympy.simplify(sympy.sympify(e1) - sympy.sympify(e2)) == 0


def fused_cost(name, groups, streams):
    return cost(Schedule.fused(library.get(name), groups=groups, streams=streams, gpu=None))


def test_matmul_canonical_form_from_the_cost_model():
    f = canonical_form_of(fused_cost("matmul", {"a": None, "c": None}, {"b": None}))
    assert same(f.expr, 2 * a * b * c * M ** sympy.Rational(-1, 2) + a * c)
    assert f.betas == (0, sympy.Rational(1, 2))
    assert same(f.alpha(sympy.Rational(1, 2)), 2 * a * b * c)
    assert same(f.alpha(0), a * c)
    assert all(same(v, sympy.sqrt(M)) for v in f.tiles.values())  # square tiles, g² = M
    assert f.beta == sympy.Rational(1, 2)


def test_attention_canonical_form_from_the_cost_model():
    f = canonical_form_of(fused_cost("attention", {"q": None}, {"x": None}))
    assert same(f.expr, 2 * q * d + 4 * x * q * d ** 2 / M)
    assert f.betas == (0, 1)
    assert same(list(f.tiles.values())[0], M / (2 * d))
    # the optimum evaluated at a budget equals the schedule's H at the optimal tile
    assert same(f(8 * d), 2 * q * d + q * x * d / 2)


def test_multi_head_canonical_form_is_h_times():
    f = canonical_form_of(fused_cost("mha", {"q": None, "h": None}, {"x": None}))
    assert same(f.expr, h * (2 * q * d + 4 * x * q * d ** 2 / M))
    assert f.betas == (0, 1)


def test_general_lagrange_path():
    ga, gc = P("g_a"), P("g_c")
    f = canonical_form(a * b * c / ga + 2 * a * b * c / gc + a * c, ga * gc)
    assert same(f.expr, 2 * sympy.sqrt(2) * a * b * c / sympy.sqrt(M) + a * c)
    assert same(f.tiles[gc] / f.tiles[ga], 2)


def test_compulsory_traffic_is_beta_zero():
    f = canonical_form(3 * a * b, P("g_a"))
    assert f.betas == (0,) and same(f.alpha(0), 3 * a * b)


def test_canonical_form_of_refuses_a_max_over_kernels():
    u = cost(Schedule.unfused(library.get("attention"), groups={"q": None}, streams={"x": None}, gpu=None))
    with pytest.raises(CanonicalError, match="maximum over kernels"):
        canonical_form_of(u)


def test_multilevel_time():
    terms = [(10.0, 1), (4.0, 0)]
    levels = [(math.inf, 1.0), (100.0, 2.0), (10.0, 5.0)]
    expected = 10 * (1 / 100 / 2 + 1 / 10 / 5) + 4 * (1 / 2 + 1 / 5)
    assert multilevel_time(terms, levels) == pytest.approx(expected)
    M1, M2, H1, H2 = P("M1"), P("M2"), P("H1"), P("H2")
    f = canonical_form_of(fused_cost("attention", {"q": None}, {"x": None}))
    T = multilevel_time(f, {"SMEM": (M1, H1), "RF": (M2, H2)})
    assert same(T, (2 * q * d) * (1 / H1 + 1 / H2) + 4 * x * q * d ** 2 * (1 / (M1 * H1) + 1 / (M2 * H2)))


def test_quantisation_speedups():
    assert quantization_speedup(1, "fp32", "fp16") == pytest.approx(4.0)
    assert quantization_speedup(0.5, "fp32", "fp16") == pytest.approx(2.83, abs=0.005)
    assert quantization_speedup(0.5, 4, 2) == pytest.approx(2 ** 1.5)
    assert quantization_speedup(0, "fp32", "bf16") == pytest.approx(2.0)
    # consistent with multilevel_time: capacity M_bytes/q values, rate H_bytes/q values/s
    f = canonical_form_of(fused_cost("attention", {"q": None}, {"x": None}))
    sub = {q: 4096, x: 4096, d: 128}
    beta_term = [(f.alpha(1).subs(sub), 1)]
    Mb, Hb = 228 * 1024, 3.35e12
    t32 = multilevel_time(beta_term, [(Mb / 4, Hb / 4)])
    t16 = multilevel_time(beta_term, [(Mb / 2, Hb / 2)])
    assert t32 / t16 == pytest.approx(quantization_speedup(1, "fp32", "fp16"))


def test_l2_effective_memory():
    assert l2_effective_memory(100, 8, 10_000) == 800         # all children fit: combined memory
    assert l2_effective_memory(100, 8, 350) == 300            # only three working sets fit
    assert l2_effective_memory(100, 8, 50) == 100             # at least one child
    m, n, C = P("m"), P("n"), P("C")
    assert l2_effective_memory(m, n, C) == sympy.Min(n * m, C)


def test_cluster_level_weight():
    assert cluster_level_weight(1 / 3, 1 / 10) == pytest.approx(1 / 3 - 1 / 10)
    assert cluster_level_weight(1 / 10, 1 / 3) == 0.0  # peers slower than the level above: no help
    ca, cc = P("c_a"), P("c_c")
    assert same(cluster_level_weight(ca, cc), ca - cc)
    # as an extra level: H(M_sm)·c_c + H(M_cl)·(c_a − c_c) equals reading everything at c_a when M_cl = M_sm
    f = canonical_form_of(fused_cost("attention", {"q": None}, {"x": None}))
    Ms = P("Ms")
    T = multilevel_time(f, [(Ms, 1 / cc), (Ms, 1 / cluster_level_weight(ca, cc))])
    assert same(T, f(Ms) * ca)


def test_levels_from_gpu():
    lv = levels_from_gpu("h100", "bf16")
    assert lv["SMEM"][0] == pytest.approx(227 * 1024 / 2)
    assert set(lv) == {"SMEM", "RF"}
