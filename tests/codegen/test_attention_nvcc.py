"""The streamed attention family: recognition and lowering on the CPU, and the template built with
nvcc (marked ``nvcc``) for every configuration and head dimension, the masks and score modifiers,
bf16 and fp16, sm_90a and sm_80: no spills, registers within the configuration's budget, shared
memory within the schedule's footprint (plus row padding) and the arch's limit.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.attention import CONFIGS, FAMILY, AttentionConfig, analyze
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import Schedule

SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}
LIBRARY = ("attention", "mha", "attention_causal", "gqa", "attention_window", "attention_alibi",
           "attention_softcap")


def bound(name, dtype="bf16", d=128, q=1000, x=1000, **more) -> Diagram:
    dg = library.get(name).with_dtype(dtype) if isinstance(name, str) else name.with_dtype(dtype)
    sizes = {"q": q, "x": x, "d": d, "h": 2, "j": 3, **more}
    return dg.bind(**{k: v for k, v in sizes.items() if k in dg.axes})


def case(name, cfg, arch="sm_90a", dtype="bf16"):
    D = cfg[4]
    return (f"{name}-{dtype}-d{D}-q{cfg[0]}x{cfg[1]}w{cfg[2]}", bound(name, dtype, d=D),
            AttentionConfig(*cfg), arch)


def cfgs(D):
    return [(bq, bx, wq, st, D, nb) for bq, bx, wq, st, nb in CONFIGS[D]]


CASES = (
    [case("mha", c) for D in (64, 128, 256) for c in cfgs(D)]
    + [case(n, cfgs(128)[0]) for n in ("attention_causal", "gqa", "attention_window", "attention_alibi",
                                       "attention_softcap")]
    + [case("mha", cfgs(128)[0], dtype="fp16"), case("attention_causal", cfgs(64)[0], dtype="fp16")]
    + [case("mha", cfgs(128)[0], "sm_80"), case("attention_causal", cfgs(64)[0], "sm_80"),
       case("attention_window", cfgs(256)[0], "sm_80")]
)


# ---------------------------------------------------------------------------- CPU tests

def test_library_diagrams_match():
    for name in LIBRARY:
        assert FAMILY.matches(library.get(name)), (name, FAMILY.why_not(library.get(name)))
    for name in ("matmul", "mlp", "softmax", "transformer_block"):
        assert not FAMILY.matches(library.get(name)), name
    assert not FAMILY.matches(library.get("mha").with_dtype("fp32"))  # fp32: the fallback's


def test_gqa_roles():
    p = analyze(library.get("gqa"))
    assert (p.q, p.x, p.d, p.woven) == ("q", "x", "d", ("h", "j"))
    assert "j" not in p.K.axis_names  # K, V broadcast along the query groups


def test_bshd_layout_is_read_from_axis_order():
    q, x, d, h = Axis("q"), Axis("x"), Axis("d"), Axis("h")
    Q, K, V = array("Q", q, h, d), array("K", x, h, d), array("V", x, h, d)
    dg = Diagram("bshd", attention_core(Q, K, V, is_causal=True))
    p = analyze(dg)
    assert p.q == "q" and p.woven == ("h",)
    b = dg.bind(q=100, x=100, h=4, d=64)
    k = FAMILY.lower(b, FAMILY.candidates(b, "h100", "bf16")[0], "sm_90a").launches[0]
    args = {a.name: a.value for a in k.args if a.kind == "int"}
    assert args["sQ_q"] == 4 * 64 and args["sQ_h"] == 64


def test_lower_reads_tiles_from_the_schedule():
    d = bound("attention_causal", d=128)
    s = Schedule.fused(d, groups={"q": 64}, streams={"x": 64}, rf_groups={"q": 16})
    k = FAMILY.lower(d, s, "sm_90a").launches[0]
    assert "constexpr int BQ = 64;" in k.source and "constexpr int BX = 64;" in k.source
    assert "constexpr int WQ = 16;" in k.source and "constexpr int SX = 64;" in k.source
    assert k.block == (128, 1, 1) and k.grid == ((1000 + 63) // 64, 2, 1)
    assert k.model_smem_bytes == (2 * 64 * 128 * 2 + 64 * 128) * 2
    assert dict(k.tunables)["causal"] == 0


def test_register_stream_of_x():
    d = bound("mha", d=128)
    s = Schedule.fused(d, groups={"q": 128}, streams={"x": [(64, "SMEM"), (32, "RF")]}, rf_groups={"q": 32})
    k = FAMILY.lower(d, s, "sm_90a").launches[0]
    assert "constexpr int BX = 64;" in k.source and "constexpr int SX = 32;" in k.source
    bad = Schedule.fused(d, groups={"q": 128}, streams={"x": [(64, "SMEM"), (48, "RF")]}, rf_groups={"q": 32})
    with pytest.raises(CodegenError, match="t_x"):
        FAMILY.lower(d, bad, "sm_90a")


def test_scale_folds_into_exp2_and_masks_come_from_the_diagram():
    d = bound("attention_window", d=64)
    k = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches[0]
    scale = {a.name: a.value for a in k.args if a.kind == "float"}["scale_log2"]
    assert abs(scale - 1.4426950408889634 / 8.0) < 1e-7
    assert dict(k.tunables)["window"] == 256
    assert "i_x > i_q - 256LL" in k.source  # the window as an integer literal (issue #16)
    d = bound("attention_softcap", d=64)
    k = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches[0]
    assert "tanhf" in k.source and "50.0f" in k.source


def test_candidates_fit_and_carry_the_tiles():
    for D in (64, 128, 256):
        d = bound("mha", d=D)
        cands = FAMILY.candidates(d, "h100", "bf16")
        assert len(cands) == len(CONFIGS[D])
        for s, c in zip(cands, CONFIGS[D]):
            rel = {(r.axis, r.level, r.kind): r.size for r in s.kernels[0].relabels}
            cfg = AttentionConfig(*c[:4], D, c[4])
            assert rel.get(("x", "RF", "stream"), c[1]) == cfg.SX
            assert rel[("q", "SMEM", "group")] == c[0] and rel[("x", "SMEM", "stream")] == c[1]
            assert rel[("q", "RF", "group")] == c[2]


def test_refusals():
    d = bound("mha", d=128)
    with pytest.raises(CodegenError, match="w_q"):
        FAMILY.lower(d, Schedule.fused(d, groups={"q": 128}, streams={"x": 64}, rf_groups={"q": 64}), "sm_90a")
    with pytest.raises(CodegenError, match="fuse"):
        FAMILY.lower(d, Schedule.unfused(d), "sm_90a")
    with pytest.raises(CodegenError, match="bind"):
        FAMILY.lower(d, Schedule.fused(d, groups={"q": None}, streams={"x": 64}), "sm_90a")
    assert "multiple of 16" in FAMILY.why_not(bound("mha", d=72))


# ---------------------------------------------------------------------------- nvcc builds

@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(c):
        name, d, cfg, arch = c
        launch = FAMILY.lower(d, FAMILY.schedule(d, cfg), arch).launches[0]
        return launch, nvcc_compile(launch.source, arch)

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        results = list(ex.map(build, CASES))
    return dict(enumerate(results))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_builds_without_spills(builds, i):
    name, d, cfg, arch = CASES[i]
    launch, usage = builds[i]
    k = usage[launch.name]
    print(f"{name} {arch}: {k.registers} registers (budget {launch.model_regs_per_thread}), "
          f"{launch.shared_bytes} B shared (model {launch.model_smem_bytes})")
    assert not k.spills, f"{name} {arch}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
    assert k.stack_bytes == 0
    assert k.registers <= launch.model_regs_per_thread
    assert k.shared_bytes == 0
    assert launch.shared_bytes <= SMEM_LIMIT[arch]
    assert launch.shared_bytes <= launch.model_smem_bytes * (cfg.D + 8) / cfg.D  # padding only
