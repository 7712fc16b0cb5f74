"""Attention's backward without a GPU: the attention_bwd family recognises the backward diagram
``grad`` gives (P recomputed from the saved log-sum-exp, D = rowsum(dO ⊙ O) inside), refuses what
its template does not build with the reason, plans as one kernel through the planner's
per-family limits, prices what the model cannot see, lowers to its three launches, and builds
with nvcc (marked ``nvcc``) for sm_80 and sm_90a without spills; the attention family takes the
forward with its saved log-sum-exp as one kernel.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.attention import FAMILY as FORWARD
from napkin.codegen.families.attention_bwd import CONFIGS, FAMILY, BackwardConfig, analyze
from napkin.diagrams import Axis, library
from napkin.diagrams.grad import forward_with_saves
from napkin.errors import CodegenError, DiagramError

SAVE = {"O", "P_lse"}
SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}


def backward(name="mha", dtype="bf16", **sizes):
    b = library.get(name).with_dtype(dtype).grad(save=SAVE)
    base = {"h": 2, "q": 1000, "x": 1000, "d": 128, **sizes}
    return b.bind(**{k: v for k, v in base.items() if k in b.axes})


@pytest.mark.parametrize("name", ["attention", "mha", "attention_causal", "attention_window"])
def test_recognises_the_backward_of_attention(name):
    b = library.get(name).grad(save=SAVE)
    assert FAMILY.why_not(b) is None
    p = analyze(b.bind(**{k: v for k, v in {"h": 2, "q": 10, "x": 12, "d": 64}.items() if k in b.axes}))
    assert (p.q, p.x, p.d) == ("q", "x", "d")
    assert abs(p.ds_scale - 1 / 8) < 1e-12  # 1/√d of d = 64, read off the diagram's dS scale


@pytest.mark.parametrize("name,why", [
    ("attention_softcap", "only positive scales and masks"),
    ("attention_alibi", "only positive scales and masks"),
    ("gqa", "three contractions"),  # dK and dV sum over the query heads j as well: not the pattern
])
def test_refuses_with_the_reason(name, why):
    assert why in FAMILY.why_not(library.get(name).grad(save=SAVE))


def test_recognition_never_raises_on_the_library_and_its_backwards():
    from napkin.diagrams.grad import saveable

    for name in library.names():
        d = library.get(name)
        variants = [d]
        try:
            variants += [d.grad(), d.grad(save={s.name for s in saveable(d)})]
        except DiagramError:  # a diagram grad does not take is not this test's business
            pass
        for v in variants:
            why = FAMILY.why_not(v)
            assert why is None or isinstance(why, str)


def test_refuses_other_saves_and_other_diagrams():
    assert FAMILY.why_not(library.get("mha")) is not None
    # P recomputed from S without a saved log-sum-exp: not P = exp(S - lse)
    assert FAMILY.why_not(library.get("mha").grad(save={"O"})) is not None
    assert "head dimension 96" in FAMILY.why_not(backward(d=96))


def test_the_forward_with_lse_is_one_attention_kernel():
    f = forward_with_saves(library.get("attention_causal"), SAVE).bind(h=2, q=1000, x=777, d=128)
    assert FORWARD.why_not(f) is None
    prog = FORWARD.lower(f, FORWARD.candidates(f, "h100", "bf16")[0], "sm_90a")
    (launch,) = prog.launches
    lse = [a for a in launch.args if a.kind == "tensor" and a.name == "P_lse"]
    assert lse and lse[0].dtype == "fp32"  # stored in fp32 whatever the diagram's dtype
    assert "Lse[" in launch.source and "0.6931471805599453f" in launch.source  # natural log
    # no decode tiles, splits or packing with the log-sum-exp output
    short = forward_with_saves(library.get("mha"), SAVE).bind(h=2, q=16, x=8192, d=128)
    for s in FORWARD.candidates(short, "h100", "bf16"):
        assert s.kernels[0].options.splits is None
    # a plain forward is unchanged: no log-sum-exp in its source
    plain = library.get("mha").bind(h=2, q=1000, x=777, d=128)
    assert "Lse" not in FORWARD.lower(plain, FORWARD.candidates(plain, "h100", "bf16")[0], "sm_90a").source()


def test_derive_with_the_family_plans_one_backward_kernel_and_one_forward():
    """The planner can put the whole backward into the one kernel (its run of 12 boxes and six
    contractions passes the per-family limits); whether it does is the model's choice against the
    unfused plan."""
    from napkin.codegen import families
    from napkin.codegen.planner import derive

    sizes = {"h": 16, "q": 4096, "x": 4096, "d": 128}
    der = derive(library.get("mha").grad(save=SAVE), "h100", "bf16", sizes=sizes,
                 families=[families.get("attention_bwd"), families.get("fallback")])
    assert der.plan.families == ("attention_bwd",)
    fwd = derive(forward_with_saves(library.get("mha"), SAVE), "h100", "bf16", sizes=sizes)
    assert fwd.plan.families == ("attention",)


def test_planner_asks_only_the_families_declaring_long_runs():
    from napkin.codegen.planner import MAX_HEAVY_BOXES, _Planner

    assert FAMILY.max_heavy_boxes > MAX_HEAVY_BOXES
    d = library.get("mha").grad(save=SAVE).bind(h=2, q=256, x=256, d=64)
    from napkin.codegen import families
    from napkin.codegen.select import resolve_gpu

    pl = _Planner(d, resolve_gpu("h100"), "sm_90a", "bf16", families.available(), None, None)
    whole = pl.evaluate(tuple(d.name_of(v) for v in d.nodes))
    assert {o.family for o in whole.ranked} == {"attention_bwd"}
    refused = dict(whole.refusals)
    assert "contraction" not in refused and "rowwise" not in refused  # never asked about 6 heavy boxes
    # past the default limits a family is asked only about runs with at most its number of heavy
    # boxes: five asks attention (5, with its log-sum-exp) and its backward (6), four the row-wise
    # family too (4: a norm's backward with its column reductions); each refuses these
    five = pl.evaluate(tuple(d.name_of(v) for v in d.nodes if d.name_of(v) != "dV"))
    assert not five.ranked and [f for f, _ in five.refusals] == ["attention", "attention_bwd"]
    four = pl.evaluate(tuple(d.name_of(v) for v in d.nodes if d.name_of(v) not in ("dV", "dK")))
    assert not four.ranked and [f for f, _ in four.refusals] == ["rowwise", "attention", "attention_bwd"]


def test_the_prediction_counts_what_the_model_cannot_see():
    from napkin.codegen.select import predict_schedule

    b = backward(h=16, q=4096, x=4096, d=128)
    s = FAMILY.schedule(b, BackwardConfig(128, 64, 128))
    est = FAMILY.launch_estimate(b, s)
    assert est["blocks"] == 32 * 16 and est["threads"] == 256
    assert est["extra_launches"] == 2
    # the dQ atomics: one fp32 add per query row, column and key block (8 bytes of sector each)
    assert est["extra_l2_bytes"] >= 32 * 16 * 4096 * 128 * 8
    # every warp's ldmatrix loads a query tile (512 bytes an x4): K, V pieces and the Q, dO tiles for
    # S^T and dP^T, dO and Q again for dV and dK, its dS^T piece and K columns for dQ
    per_warp = 8 * (2 + 2 * 4) + 4 * 8 * 2 + 8 * (1 + 64 // 16)
    assert est["extra_smem_bytes"] == 512 * per_warp * 8 * (4096 // 64) * 32 * 16
    from napkin.codegen.select import extra_pass_seconds, resolve_gpu

    g = resolve_gpu("h100")
    without = {k: v for k, v in est.items() if k != "extra_smem_bytes"}
    assert extra_pass_seconds(est, g) - extra_pass_seconds(without, g) == pytest.approx(
        est["extra_smem_bytes"] / g.level("SMEM").bandwidth)
    t = predict_schedule(b, FAMILY, s, "h100").seconds
    flops = 5 * 2 * 16 * 4096 * 4096 * 128  # the five products (S recomputed, dP, dQ, dK, dV)
    assert flops / t < 989e12  # never above the tensor cores' datasheet rate
    assert flops / t > 100e12


def test_lower_gives_three_launches_with_the_tiles():
    b = backward("attention_causal", h=3, q=333, x=1027, d=64)
    prog = FAMILY.lower(b, FAMILY.schedule(b, BackwardConfig(64, 64, 64)), "sm_80")
    prep, main, dq = prog.launches
    assert main.grid == (17, 3, 1) and main.block == (128, 1, 1)
    assert prep.name.endswith("_prep") and dq.name.endswith("_dq")
    assert {x.name for x in prog.buffers} == {"dq_accum", "dO_dot_O"}
    assert dict(main.tunables)["causal"] == 0
    assert len({k.source for k in prog.launches}) == 3  # one rendering each (their sources concatenate)
    assert "q_lo = x0 - (0)" in main.source


def test_schedule_round_trip_and_bad_tiles():
    b = backward(d=128)
    for cfg in FAMILY.configs(128):
        assert FAMILY.config_of(analyze(b), b, FAMILY.schedule(b, cfg)) == cfg
    bad = FAMILY.schedule(b, BackwardConfig(32, 64, 128))
    with pytest.raises(CodegenError, match="dQ tile"):
        FAMILY.config_of(analyze(b), b, bad)


def batched(b=2, h=3, q=100, x=100, d=64):
    return library.get("mha").weave(Axis("b"), name="mha_b").grad(save=SAVE).bind(b=b, h=h, q=q, x=x, d=d)


def test_batched_layout():
    b = batched()
    assert FAMILY.why_not(b) is None
    prog = FAMILY.lower(b, FAMILY.candidates(b, "h100", "bf16")[0], "sm_90a")
    assert prog.launches[1].grid[1] == 6


# ---------------------------------------------------------------------------- nvcc builds

CASES = [(name, dtype, D, bx, bq, arch)
         for D, cs in CONFIGS.items() for bx, bq in cs
         for name, dtype, arch in (("attention_causal", "bf16", "sm_90a"), ("mha", "fp16", "sm_80"))
         if BackwardConfig(bx, bq, D).smem_bytes() <= SMEM_LIMIT[arch]] + [
    ("attention_window", "bf16", 64, 128, 64, "sm_80")]


@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(c):
        name, dtype, D, bx, bq, arch = c
        b = backward(name, dtype, d=D)
        launches = FAMILY.lower(b, FAMILY.schedule(b, BackwardConfig(bx, bq, D)), arch).launches
        return [(launch, nvcc_compile(launch.source, arch)) for launch in launches]

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        return dict(enumerate(ex.map(build, CASES)))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_builds_without_spills(builds, i):
    for launch, usage in builds[i]:
        k = usage[launch.name]
        print(f"{CASES[i]} {launch.name}: {k.registers} registers, {launch.shared_bytes} B shared")
        assert not k.spills, f"{launch.name}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
        assert k.registers <= launch.model_regs_per_thread
        assert launch.shared_bytes <= SMEM_LIMIT[CASES[i][5]]


@pytest.mark.nvcc
def test_two_woven_axes_build():
    """Batch and heads woven together (each woven index in its own scope)."""
    from napkin.kernels.nvcc import nvcc_compile

    b = batched()
    for launch in FAMILY.lower(b, FAMILY.candidates(b, "h100", "bf16")[0], "sm_90a").launches:
        assert not nvcc_compile(launch.source, "sm_90a")[launch.name].spills


@pytest.mark.nvcc
def test_forward_with_lse_builds_without_spills():
    from napkin.kernels.nvcc import nvcc_compile

    for name, arch in (("attention_causal", "sm_80"), ("mha", "sm_90a")):
        f = forward_with_saves(library.get(name), SAVE).bind(h=2, q=1000, x=1000, d=128)
        (launch,) = FORWARD.lower(f, FORWARD.candidates(f, "h100", "bf16")[0], arch).launches
        k = nvcc_compile(launch.source, arch)[launch.name]
        assert not k.spills and k.registers <= launch.model_regs_per_thread
