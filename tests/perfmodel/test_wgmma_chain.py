"""The chain of dependent wgmma a consumer runs per chunk (``GPU.wgmma_step_clk``): a floor under the
tensor term that binds tiles of few rows or columns, and the split sums it makes the planner take
for a few vectors by a matrix over a long sum."""

from __future__ import annotations

import math

import pytest

from napkin.cli_common import load
from napkin.codegen import select
from napkin.codegen.families import get
from napkin.codegen.families.contraction import CHAIN_STAGES, ContractionFamily, problem_of
from napkin.errors import HardwareError
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.roofline import Work, predict

SKINNY = "tests/codegen/skinny_diagrams.py:linear_rows"


def test_floor_raises_only_a_smaller_tensor_term():
    g = get_gpu("h200")
    w = Work(flops={"tensor": 1e9}, bytes={"HBM": 1e6}, dtype="bf16")
    plain = predict(g, w)
    t = plain.compute_s["tensor"]
    assert predict(g, w, tensor_floor_s=t / 2).compute_s["tensor"] == pytest.approx(t)
    assert predict(g, w, tensor_floor_s=3 * t).compute_s["tensor"] == pytest.approx(3 * t)
    assert predict(g, w, tensor_floor_s=3 * t).seconds > plain.seconds
    # the floor, when it binds, is named as the bound
    assert predict(g, w, tensor_floor_s=1.0).bound == "tensor chain"
    assert predict(g, w, tensor_floor_s=t / 2).bound != "tensor chain"
    # no tensor work: nothing to floor
    assert predict(g, Work(flops={"cuda": 1e9}, dtype="fp32"), tensor_floor_s=1.0).compute_s["tensor"] == 0.0
    with pytest.raises(HardwareError):
        predict(g, w, tensor_floor_s=-1.0)


def test_profiles_state_the_chain_on_hopper_only():
    assert get_gpu("h200").wgmma_step_clk > 0 and get_gpu("h100").wgmma_step_clk > 0
    assert get_gpu("a100").wgmma_step_clk == 0


def _wgmma_estimates(d):
    fam = ContractionFamily()
    out = []
    for s in fam.candidates(d, "h200", "bf16"):
        cfg = fam.config_of(problem_of(d, s), s)
        if cfg.wgmma:
            out.append((cfg, fam.launch_estimate(d, s, "h200")))
    return out


def test_chain_is_steps_times_dependent_wgmma_over_the_sms():
    d = load(SKINNY).with_dtype("bf16").bind(a=4096, k=4096, b=8)
    g = get_gpu("h200")
    ests = _wgmma_estimates(d)
    assert ests
    for cfg, est in ests:
        steps = math.ceil(math.ceil(4096 / cfg.BK) / cfg.splits)
        want = steps * (cfg.BK // 16) * g.wgmma_step_clk / g.clock_hz * est["blocks"] / g.sms
        want /= 2 if cfg.pingpong else 1
        want *= min(1.0, (CHAIN_STAGES - 2) / (cfg.stages - 2))  # a deeper ring's round trip is shared
        assert est["tensor_chain_s"] == pytest.approx(want)
    # splitting the sum shortens each block's chain
    by_split = {cfg.splits: est["tensor_chain_s"] * g.sms / est["blocks"] for cfg, est in ests if (cfg.BM, cfg.BN) == (64, 128)}
    assert len(by_split) > 1 and by_split[max(by_split)] < by_split[1]


def test_a_few_vectors_by_a_matrix_over_a_long_sum_split_on_hopper():
    """H200, bf16, y[b, a] = sum_k W[a, k] x[b, k] at a = k = 4096, b = 8: 64 x 64 tiles unsplit ran
    17.7 us of kernel (64 chunks a block, one chain each), 64 x 128 tiles in 4 splits 9.7 us and a
    1.3 us combine; the planner took the first before the chain was priced."""
    d = load(SKINNY).with_dtype("bf16").bind(a=4096, k=4096, b=8)
    best = select.rank(d, get("contraction"), "h200", "bf16")[0]
    opts = best.schedule.kernels[0].options
    # (or the swapped tile, whose 16-slot ring shares the round trip among more chunks in flight)
    assert opts.engine == "wgmma" and ((opts.splits or 1) > 1 or opts.swap_ab), opts


def test_a_deeper_ring_shortens_the_chain_a_chunk():
    """The step was measured on 8-slot rings; the swapped tile's 16 slots keep 14 chunks in flight
    against 6, and its chain a chunk is 6 / 14 of theirs (H200: 0.20 against 0.45 us a chunk)."""
    d = load(SKINNY).with_dtype("bf16").bind(a=4096, k=4096, b=4)
    per_chunk = {}
    for cfg, est in _wgmma_estimates(d):
        chunks = math.ceil(math.ceil(4096 / cfg.BK) / cfg.splits) * est["blocks"] / get_gpu("h200").sms
        per_chunk[(cfg.stages, cfg.swap)] = est["tensor_chain_s"] / chunks
    assert per_chunk[(16, True)] == pytest.approx(per_chunk[(8, False)] * 6 / 14)
