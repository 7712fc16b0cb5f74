"""Attention's backward on wgmma (sm_90a): the attention_bwd family offers its Hopper kernel where
the GPU has wgmma and the planner takes it when the model predicts it faster; no wgmma schedule
on an sm_80 GPU or for an sm_80 build; the lowering's three launches and workspaces; nvcc builds
for sm_90a without spills (marked ``nvcc``); and on the GPU (marked ``gpu``) dQ, dK and dV against
torch.autograd of the float64 forward, on fresh random inputs with NaN-poisoned outputs, causal
and not, d = 64 and 128, sequence lengths that are not tile multiples, woven batch and heads.
"""

from __future__ import annotations

import pytest

from napkin.codegen.families import attention_bwd_wgmma as W
from napkin.codegen.families.attention_bwd import FAMILY, analyze
from napkin.diagrams import Axis, library
from napkin.errors import CodegenError

SAVE = {"O", "P_lse"}


def backward(name="mha", dtype="bf16", **sizes):
    b = library.get(name).with_dtype(dtype).grad(save=SAVE)
    base = {"h": 2, "q": 1000, "x": 1000, "d": 128, **sizes}
    return b.bind(**{k: v for k, v in base.items() if k in b.axes})


def _engines(scheds):
    return [s.kernels[0].options.engine for s in scheds]


@pytest.mark.parametrize("d", [64, 128])
def test_offered_on_hopper_only(d):
    b = backward(d=d)
    assert "wgmma" in _engines(FAMILY.candidates(b, "h100", "bf16"))
    assert "wgmma" not in _engines(FAMILY.candidates(b, "a100-80gb", "bf16"))
    w = next(s for s in FAMILY.candidates(b, "h100", "bf16") if s.kernels[0].options.engine == "wgmma")
    assert FAMILY.builds_for(w, "sm_90a") and not FAMILY.builds_for(w, "sm_80")
    with pytest.raises(CodegenError, match="sm_80 has no wgmma"):
        FAMILY.lower(b, w, "sm_80")


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_the_planner_picks_it_on_sm90a_and_not_on_sm80(name):
    from napkin.codegen.planner import derive

    sizes = {"h": 16, "q": 4096, "x": 4096, "d": 128}
    grad = library.get(name).grad(save=SAVE)
    hopper = derive(grad, "h100", "bf16", sizes=sizes, arch="sm_90a", families=[FAMILY])
    (k,) = hopper.plan.kernels
    assert k.kernel.options.engine == "wgmma"
    ampere = derive(grad, "a100-80gb", "bf16", sizes=sizes, arch="sm_80", families=[FAMILY])
    (k,) = ampere.plan.kernels
    assert k.kernel.options.engine == "mma.sync"


def test_the_model_prices_it_faster_than_mma_sync_and_under_the_datasheet():
    from napkin.codegen.select import predict_schedule

    b = library.get("mha").weave(Axis("b"), name="mha_b").grad(save=SAVE).bind(b=4, h=16, q=4096, x=4096, d=128)
    times = {s.kernels[0].options.engine: predict_schedule(b, FAMILY, s, "h100").seconds
             for s in FAMILY.candidates(b, "h100", "bf16")}
    flops = 5 * 2 * 4 * 16 * 4096 * 4096 * 128
    assert times["wgmma"] < times["mma.sync"]
    assert 200e12 < flops / times["wgmma"] < 989e12
    est = FAMILY.launch_estimate(b, next(s for s in FAMILY.candidates(b, "h100", "bf16")
                                         if s.kernels[0].options.engine == "wgmma"))
    assert est["blocks"] == 32 * 64 and est["threads"] == 384 and est["extra_launches"] == 2
    assert est["extra_l2_bytes"] >= 32 * 64 * 4096 * 128 * 8  # the dQ reductions


def test_lower_gives_three_launches_and_padded_rows():
    b = backward("attention_causal", h=3, q=333, x=1027, d=64)
    cfg = W.configs(64)[0]
    prog = FAMILY.lower(b, W.schedule(FAMILY, b, cfg), "sm_90a")
    prep, main, dq = prog.launches
    assert main.template == W.TEMPLATE and dq.template == "attention_bwd.cu.jinja"
    assert main.grid == (9, 3, 1) and main.block == (384, 1, 1)
    assert dict(main.tunables)["engine"] == "wgmma" and dict(main.tunables)["causal"] == 0
    nqp = -(-333 // cfg.BQ) * cfg.BQ
    assert {(x.name, x.shape) for x in prog.buffers} == {("dq_accum", (3 * 333, 64)), ("dO_dot_O", (3 * nqp,)),
                                                         ("dO_dot_O_lse", (3 * nqp,))}
    assert [a.name for a in main.args if a.kind == "tmap"] == ["Q", "K", "V", "dO"]
    assert "q_lo = x0 - (0)" in main.source and "wgmma.mma_async" in main.source


def test_config_round_trip_and_refusals():
    b = backward(d=128)
    p = analyze(b)
    for cfg in W.configs(128):
        assert W.config_of(p, b, W.schedule(FAMILY, b, cfg)) == cfg
    assert "dQ tile" in W.WgmmaBackwardConfig(128, 64, 2, consumers=3).problem()
    assert "head dimension 96" in W.wgmma_reason(analyze(backward(d=96)), backward(d=96))
    assert "fp32" in W.wgmma_reason(p, b, "h100", dtype="fp32")


BUILDS = [(name, d) for name in ("mha", "attention_causal") for d in (64, 128)]


@pytest.mark.nvcc
@pytest.mark.parametrize("name,d", BUILDS)
def test_builds_for_sm90a_without_spills(name, d):
    from napkin.kernels.nvcc import nvcc_compile

    b = library.get(name).weave(Axis("b"), name=f"{name}_b").grad(save=SAVE).bind(b=2, h=3, q=1000, x=777, d=d)
    prog = FAMILY.lower(b, W.schedule(FAMILY, b, W.configs(d)[0]), "sm_90a")
    built = nvcc_compile(prog.source(), "sm_90a")  # the launches' sources together, as NVRTC takes them
    for launch in prog.launches:
        k = built[launch.name]
        print(f"{name} d={d} {launch.name}: {k.registers} registers, {launch.shared_bytes} B shared")
        assert not k.spills, f"{launch.name}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
        assert launch.shared_bytes <= 227 * 1024


# ---------------------------------------------------------------------------- GPU


def check(name, dtype, sizes, seed, cfg=None):
    """The wgmma kernel's dQ, dK, dV against autograd (the helpers of the mma.sync GPU test)."""
    import torch
    from test_attention_bwd_gpu import _forward, _reference, _rel, _run

    from napkin.codegen import compile as napkin_compile

    from napkin.codegen.api import CompiledDiagram

    xs, dO, saved, want = _reference(name, sizes, dtype, seed)
    b = _forward(name).grad(save=SAVE).with_dtype(dtype).bind(**sizes)
    if cfg is None:
        cd = napkin_compile(_forward(name).grad(save=SAVE), sizes=sizes, dtype=dtype, family="attention_bwd",
                            schedule=W.schedule(FAMILY, b, W.configs(sizes["d"])[0], dtype=dtype))
    else:  # the configuration as given (dq_local, which no schedule says, too)
        cd = CompiledDiagram(W.lower_config(FAMILY, b, cfg), arch="sm_90a")
    assert [k.template for k in cd.launches].count(W.TEMPLATE) == 2
    feed = dict(xs, dO=dO, O=saved["O"].to(xs["Q"].dtype), P_lse=saved["P_lse"].float())
    for _ in range(2):  # twice: the workspace is zeroed by every call, not once
        got = _run(cd, feed, poison=True)
    torch.cuda.synchronize()
    for k in ("dQ", "dK", "dV"):
        err = _rel(got[k], want[k])
        print(f"wgmma {name} {dtype} {sizes} {k}: relative error {err:.2e}")
        assert err < 1e-2, f"{k}: relative error {err:.3g}"


def _hopper():
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wgmma kernel needs an sm_90 GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_autograd(name, d):
    _hopper()
    check(name, "bf16", {"h": 2, "q": 1000, "x": 1000, "d": d}, seed=11)
    check(name, "bf16", {"h": 2, "q": 77, "x": 200, "d": d}, seed=12)
    check(name, "bf16", {"h": 2, "q": 333, "x": 1027, "d": d}, seed=13)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_fp16_and_long_queries(name):
    _hopper()
    check(name, "fp16", {"h": 2, "q": 1027, "x": 333, "d": 128}, seed=14)
    check(name, "bf16", {"h": 1, "q": 2049, "x": 129, "d": 64}, seed=15)


@pytest.mark.gpu
def test_batched_and_window():
    _hopper()
    mha_b = library.get("mha").weave(Axis("b"), name="mha_b")
    check(mha_b, "bf16", {"b": 2, "h": 3, "q": 300, "x": 257, "d": 64}, seed=16)
    check(mha_b, "bf16", {"b": 2, "h": 3, "q": 300, "x": 257, "d": 128}, seed=17)
    check("attention_window", "bf16", {"h": 2, "q": 700, "x": 700, "d": 64}, seed=18)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [(d, bq, st) for d, cs in W.CONFIGS.items() for bq, st in cs],
                         ids=lambda c: f"d{c[0]}-q{c[1]}-s{c[2]}")
def test_every_configuration(cfg):
    _hopper()
    for name in ("mha", "attention_causal"):
        check(name, "bf16", {"h": 2, "q": 515, "x": 515, "d": cfg[0]}, seed=19, cfg=W.WgmmaBackwardConfig(*cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_dq_local_variant(d):
    """Each warpgroup's dQ over its own keys (no barrier between the warpgroups)."""
    _hopper()
    for name in ("mha", "attention_causal"):
        check(name, "bf16", {"h": 2, "q": 333, "x": 1027, "d": d}, seed=20,
              cfg=W.WgmmaBackwardConfig(d, 64, 2, dq_local=True))
