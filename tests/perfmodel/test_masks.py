"""Skipping fully masked tiles: causal and sliding-window attention cost what they visit."""

from fractions import Fraction

import pytest

from napkin.diagrams import library
from napkin.perfmodel.cost import cost
from napkin.perfmodel.legality import analyze
from napkin.perfmodel.masks import skippable_mask, visit_fractions, visited
from napkin.perfmodel.schedule import Schedule


def test_visited_tiles():
    causal = ("causal", (0.0,))
    assert visited(causal, (64, 128), (0, 64))          # below the diagonal
    assert visited(causal, (0, 64), (0, 64))            # on it
    assert not visited(causal, (0, 64), (64, 128))      # wholly above it
    window = ("sliding_window", (32.0,))
    assert not visited(window, (128, 192), (0, 64))     # keys older than the window
    assert visited(window, (128, 192), (64, 128))


def _sched(name, **sizes):
    d = library.get(name).bind(**sizes)
    return Schedule.fused(d, groups={"h": 1, "q": 64}, streams={"x": 64}, gpu=None)


def test_causal_visits_the_lower_triangle_of_tiles():
    s = _sched("attention_causal", h=2, q=512, x=512, d=64)
    plan = analyze(s)[0]
    assert skippable_mask(plan)[:3] == ("q", "x", "causal")
    steps, loads, warp_loads, area = visit_fractions(plan, plan.sizes)
    assert steps == Fraction(36, 64)  # 8 query tiles × 8 key chunks: 1 + 2 + … + 8 visited
    assert loads == steps and warp_loads == steps
    assert area == Fraction(36, 64)


def test_causal_costs_about_half_of_dense():
    dense = cost(_sched("mha", h=2, q=1024, x=1024, d=64))
    causal = cost(_sched("attention_causal", h=2, q=1024, x=1024, d=64))
    ratio_tc = causal.flops["tensor"] / dense.flops["tensor"]
    assert ratio_tc == pytest.approx((16 * 17 / 2) / 256)
    qd = 2 * 1024 * 64 * 2  # Q read and O written, both heads
    kv_dense = dense.H("L2") - qd
    kv_causal = causal.H("L2") - qd
    assert kv_causal == kv_dense * (16 * 17 // 2) // 256


def test_no_skipping_without_a_mask_or_without_a_stream():
    plan = analyze(_sched("mha", h=2, q=128, x=128, d=64))[0]
    assert skippable_mask(plan) is None
    d = library.get("attention_causal").bind(h=2, q=128, x=128, d=64)
    plan = analyze(Schedule.fused(d, groups={"h": 1, "q": 64}, gpu=None))[0]
    assert skippable_mask(plan) is None and visit_fractions(plan, plan.sizes) == (1, 1, 1, 1)
