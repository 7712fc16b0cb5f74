"""The fp8 (e4m3) attention forward (``attention_fp8.py``, ``attention_wgmma_fp8.cu.jinja`` and
the Vt pre-pass ``attention_fp8_vt.cu.jinja``) on the CPU: which diagrams it takes and why not,
the planner's choice (the fp8 template on an H100, one clear error naming sm_90a elsewhere), the
model's pricing (fp8 peak, one byte a value, the pre-pass's bytes), the per-tensor scales, the
CLI, and every configuration built with nvcc for sm_90a (marked ``nvcc``) without spills.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families import attention_fp8 as F8
from napkin.codegen.families.attention import FAMILY, analyze
from napkin.codegen.planner import derive
from napkin.diagrams import library
from napkin.errors import CodegenError, NapkinError
from tests.napkin_test_support import cli_invoke


def bound(name, d=128, q=1000, x=1000, dtype="fp8", **more):
    dg = library.get(name).with_dtype(dtype)
    sizes = {"q": q, "x": x, "d": d, "h": 2, "j": 3, **more}
    return dg.bind(**{k: v for k, v in sizes.items() if k in dg.axes})


def test_reasons():
    d = bound("mha")
    p = analyze(d)
    assert F8.reason(p, d, "h100") is None and FAMILY.why_not(d) is None
    assert "sm_90a" in F8.reason(p, d, "a100-80gb") and "sm_90a" in F8.reason(p, d, arch="sm_80")
    d64 = bound("mha", d=64)
    assert "head dimension 64" in FAMILY.why_not(d64)
    alibi = bound("attention_alibi")
    assert "positive scales and masks" in FAMILY.why_not(alibi)
    from napkin.diagrams.grad import forward_with_saves

    f = forward_with_saves(library.get("attention_causal"), {"O", "P_lse"}).with_dtype("fp8").bind(
        h=2, q=1000, x=1000, d=128)
    assert "log-sum-exp" in FAMILY.why_not(f)


@pytest.mark.parametrize("name", ["mha", "attention_causal", "gqa", "attention_window"])
@pytest.mark.parametrize("D", F8.HEAD_DIMS)
def test_derive_picks_the_fp8_template_on_hopper(name, D):
    d = bound(name, d=D, q=4096, x=4096, h=4)
    plan = derive(d, "h100", "fp8", explain=False).plan
    (k,) = plan.kernels
    assert k.family == "attention" and k.kernel.options.engine == "wgmma" and plan.schedule.dtype == "fp8"
    prog = FAMILY.lower(d, plan.schedule, "sm_90a")
    assert [x.template for x in prog.launches] == [F8.VT_TEMPLATE, F8.TEMPLATE]
    (buf,) = prog.buffers
    heads = 4  # K and V carry h only (gqa's query groups j share them)
    assert buf.dtype == "fp8" and buf.shape == (heads, D, 4096)
    vt, main = prog.launches
    assert vt.grid == (4096 // 128, heads, 1)
    assert {a.name for a in main.args if a.kind == "tmap"} == {"Q", "K", buf.name}
    assert [a.name for a in main.args if a.kind == "float"] == ["scale_log2", *F8.SCALES]
    assert "m64n128k32.f32.e4m3.e4m3" in main.source and f"m64n{D}k32.f32.e4m3.e4m3" in main.source


def test_other_gpus_get_one_clear_error():
    d = bound("mha", q=4096, x=4096)
    with pytest.raises(NapkinError, match="sm_90a"):
        derive(d, "a100-80gb", "fp8", explain=False)
    with pytest.raises(CodegenError, match="sm_90a"):
        FAMILY.lower(d, F8.schedule(FAMILY, d, F8.configs(128)[0]), "sm_80")


def test_the_model_prices_fp8():
    """fp8 is predicted faster than bf16 at the same sizes (fp8 tensor peak, half the bytes), and
    the estimate carries the pre-pass (one launch; V read and Vt written)."""
    d8, d16 = bound("mha", q=8192, x=8192, h=16), bound("mha", q=8192, x=8192, h=16, dtype="bf16")
    t8 = derive(d8, "h100", "fp8", explain=False).plan.seconds
    t16 = derive(d16, "h100", "bf16", explain=False).plan.seconds
    assert t8 < 0.8 * t16
    s = F8.schedule(FAMILY, d8, F8.configs(128)[0])
    est = FAMILY.launch_estimate(d8, s, "h100")
    assert est["extra_launches"] == 1 and est["extra_hbm_bytes"] == 2 * 16 * 8192 * 128
    assert est["smem"] == F8.configs(128)[0].smem_bytes()


def test_lower_reads_the_tiles_and_refuses_others():
    d = bound("attention_causal")
    for cfg in F8.configs(128):
        s = F8.schedule(FAMILY, d, cfg)
        # masked scores take the configuration without ping-pong (it measured slower there)
        assert F8.config_of(analyze(d), d, s) == F8.turns_for(cfg, masked=True)
        main = FAMILY.lower(d, s, "sm_90a").launches[1]
        assert "ping-pong (this kernel)" not in main.source
        assert main.block == (cfg.threads, 1, 1) and main.grid == (-(-1000 // cfg.BQ), 2, 1)
        assert main.shared_bytes == cfg.smem_bytes() and main.model_smem_bytes == cfg.model_smem_bytes()
        assert f"constexpr int STAGES = {cfg.stages};" in main.source
    bad = F8.schedule(FAMILY, d, F8.Fp8AttentionConfig(128, 2, 7))
    with pytest.raises(CodegenError, match="stages"):
        FAMILY.lower(d, bad, "sm_90a")
    with pytest.raises(CodegenError, match="ping-pong only with the two-stage loop"):
        F8.lower_config(FAMILY, d, F8.Fp8AttentionConfig(128, 2, 3, False, 0, True))


def test_scores_without_masks_take_turns():
    # the table's first d = 128 configuration runs ping-pong where no mask is applied, and its
    # explicit lowering keeps what it is given whatever the scores
    first = F8.configs(128)[0]
    assert first.pingpong and first.overlap
    d = bound("mha")
    s = F8.schedule(FAMILY, d, first)
    assert F8.config_of(analyze(d), d, s) == first
    assert "ping-pong (this kernel)" in FAMILY.lower(d, s, "sm_90a").launches[1].source
    causal = bound("attention_causal")
    assert "ping-pong (this kernel)" in F8.lower_config(FAMILY, causal, first).launches[1].source
    assert F8.turns_for(first, masked=False) == first
    # the planner offers masked scores the table without its ping-pong rows: four stages, as before
    offered = [s.kernels[0].options.stages for s in F8.candidates(FAMILY, causal, "h200", "fp8")]
    assert offered == [c.stages for c in F8.configs(128) if not c.pingpong]
    assert [s.kernels[0].options.stages for s in F8.candidates(FAMILY, d, "h200", "fp8")][0] == first.stages


def test_a_table_row_with_ping_pong_needs_the_two_stage_loop(monkeypatch):
    """A table row asking for ping-pong without the two-stage loop (whose turns the barriers
    count) is refused when lowered, not built into a kernel that would hang."""
    d = bound("mha")
    monkeypatch.setitem(F8.CONFIGS, 128, ((2, 3, False, 0, True),))
    s = F8.schedule(FAMILY, d, F8.configs(128)[0])
    with pytest.raises(CodegenError, match="ping-pong needs two consumers and the two-stage loop"):
        FAMILY.lower(d, s, "sm_90a")


def test_with_scales():
    d = bound("mha")
    prog = FAMILY.lower(d, F8.schedule(FAMILY, d, F8.configs(128)[0]), "sm_90a")
    scaled = F8.with_scales(prog, descale_q=0.5, descale_k=2.0, descale_v=0.25, scale_o=8.0)
    vals = {a.name: a.value for a in scaled.launches[1].args if a.kind == "float"}
    assert [vals[n] for n in F8.SCALES] == [0.5, 2.0, 0.25, 8.0]
    assert scaled.launches[1].source == prog.launches[1].source  # arguments only: no new build
    assert {a.name: a.value for a in prog.launches[1].args if a.name in F8.SCALES} == dict.fromkeys(F8.SCALES, 1.0)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(CodegenError, match="descale_v"):
            F8.with_scales(prog, descale_v=bad)
    bf16 = bound("mha", dtype="bf16")
    plain = FAMILY.lower(bf16, derive(bf16, "h100", "bf16", explain=False).plan.schedule, "sm_90a")
    with pytest.raises(CodegenError, match="no fp8 attention launch"):
        F8.with_scales(plain, descale_q=2.0)


def test_cli_generate(tmp_path):
    out = tmp_path / "a.cu"
    code, stdout, stderr = cli_invoke("generate", "attention", "--dtype", "fp8", "-o", str(out))
    assert code == 0, stderr
    src = out.read_text()
    assert "e4m3" in src and "napkin_attn_fp8_vt" in src
    code, stdout, stderr = cli_invoke("generate", "mha", "--dtype", "fp8", "--gpu", "a100", "-o",
                                      str(tmp_path / "b.cu"))
    assert code == 2 and "sm_90a" in stderr + stdout and "Traceback" not in stderr + stdout


# ---------------------------------------------------------------------------- nvcc builds

#: Every configuration of the tables, and the other loop (one chunk at a time, or two stages in a
#: warpgroup) of each at d = 128 (at d = 256 two P buffers do not fit beside S and O).
#: Besides: the two-stage loop with every exp2 on the FMA pipe, and with none there, each with and
#: without ping-pong (the GPU tests run the same).
VARIANTS = sorted({c for D in F8.HEAD_DIMS for c in F8.configs(D)}
                  | {dataclasses.replace(c, overlap=not c.overlap, pingpong=False) for c in F8.configs(128)}
                  | {F8.Fp8AttentionConfig(128, 2, 4, True, poly, pp) for poly in (0, 16) for pp in (False, True)}
                  | {F8.Fp8AttentionConfig(128, 2, 3, False, 16)}, key=str)
CASES = [(name, c) for c in VARIANTS for name in ("mha", "attention_causal", "attention_window", "gqa")]


#: Allowed a few bytes of spills: d = 256 with the causal mask (O's 128 and S's 64 registers a
#: thread beside the mask's indices and, for GQA, the woven axes: ptxas spills 4 to 16 words).
SPILL_OK = {("attention_causal", 256), ("gqa", 256)}


@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(case):
        name, cfg = case
        d = bound(name, d=cfg.D)
        prog = F8.lower_config(FAMILY, d, cfg)
        return prog, nvcc_compile(prog.source(), "sm_90a")

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        return dict(enumerate(ex.map(build, CASES)))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{n}-d{c.D}-s{c.stages}{'-2st' if c.overlap else ''}"
                                                       f"-e{c.poly}{'-pp' if c.pingpong else ''}" for n, c in CASES])
def test_builds_without_spills(builds, i):
    name, cfg = CASES[i]
    prog, usage = builds[i]
    assert "C7513" not in usage.log, "ptxas serialised the wgmma"
    for launch in prog.launches:
        k = usage[launch.name]
        if (name, cfg.D) in SPILL_OK and launch.template == F8.TEMPLATE:
            assert k.spill_stores <= 16 and k.stack_bytes <= 64
        else:
            assert not k.spills and k.stack_bytes == 0
        assert k.registers <= 65536 // launch.threads
        assert launch.shared_bytes <= 227 * 1024


def test_tensor_maps_take_fp8():
    """TMA copies fp8 as bytes: rows must still be multiples of 16 bytes (16 values)."""
    from napkin.errors import LaunchError
    from napkin.kernels.tma import TensorMapSlot

    assert TensorMapSlot("fp8", (4, 1000, 128), (128, 128)).description == "fp8 [4000][128], box (128, 128)"
    with pytest.raises(LaunchError, match="8 elements of 1 bytes"):
        TensorMapSlot("fp8", (100, 8), (8, 64))


def test_verify_judges_fp8_by_the_stated_tolerance():
    """``napkin verify --dtype fp8`` holds fp8 outputs to the family's stated tolerance, not bf16's."""
    from napkin.codegen.verify import TOLERANCE

    assert TOLERANCE["fp8"] == F8.RMS_TOLERANCE
    assert TOLERANCE["fp8"] > TOLERANCE["bf16"]


def _ex2_fma_of(source: str):
    """The template's ``ex2_fma`` emulated in float32 with numpy, its constants read from the
    generated source (so the test follows what the kernel computes)."""
    import re

    import numpy as np

    body = source[source.index("float ex2_fma(float x)"):]
    body = body[:body.index("\n}\n")]
    clamp = float(np.frombuffer(bytes.fromhex(re.search(r"0f([0-9A-F]{8})", body).group(1))[::-1], "<f4")[0])
    magic = float(re.search(r"__fadd_rn\(x, ([0-9.]+)f\)", body).group(1))
    c3, c2 = (float(v) for v in re.search(r"fmaf\(([-0-9.e]+)f, f, ([-0-9.e]+)f\)", body).groups())
    c1, c0 = (float(v) for v in re.findall(r"fmaf\(p, f, ([-0-9.e]+)f\)", body))
    shift, bias, bias_shift = (int(v) for v in re.search(r"<< (\d+)\) \+ \((\d+) << (\d+)\)", body).groups())
    f32 = np.float32

    def ex2(x):
        x = np.where(np.isnan(x), x, np.maximum(x, clamp)).astype(f32)
        t = (x + f32(magic)).astype(f32)
        f = (x - (t - f32(magic)).astype(f32)).astype(f32)
        p = f32(c3)
        for c in (c2, c1, c0):  # an FMA rounds once: the product and sum in float64, then to float32
            p = (p.astype(np.float64) * f + c).astype(f32)
        bits = (t.view(np.uint32).astype(np.uint64) << np.uint64(shift)) + np.uint64(bias << bias_shift)
        scale = (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(f32)
        return (p * scale).astype(f32)

    return ex2


def test_the_polynomial_exp2_is_accurate_for_p():
    """``ex2_fma`` (2^x on the FMA pipe) within 1e-4 relative of 2^x where P is not 0 in e4m3,
    at most 2^-126 below and exactly 0 for -inf (a masked score: a row with no key keeps l = 0,
    as ex2 gives) and far below; NaN kept as ex2 keeps it."""
    import numpy as np

    d = bound("mha")
    src = F8.lower_config(FAMILY, d, F8.Fp8AttentionConfig(128, 2, 4, True, 4, True)).launches[1].source
    assert "constexpr int POLY = 4;" in src and "named_barrier_arrive(2 + (1 - cw), 256)" in src
    ex2 = _ex2_fma_of(src)
    x = np.concatenate([np.linspace(-100, 0, 200001), -np.logspace(-8, 0, 1000), [0.0, -0.5, -1.5, -99.5]])
    x = x.astype(np.float32)
    rel = np.abs(ex2(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < 1e-4, float(rel.max())
    low = ex2(np.array([-125.0, -126.0, -126.4, -126.6, -127.0, -200.0, -np.inf], np.float32))
    assert np.all(low >= 0) and np.all(low <= 2.0 ** -124)
    assert np.all(low[3:] == 0) and low[0] > 0
    assert np.isnan(ex2(np.array([np.nan], np.float32)))[0]
    off = F8.lower_config(FAMILY, d, F8.Fp8AttentionConfig(128, 2, 4, True)).launches[1].source
    assert "constexpr int POLY = 0;" in off and "named_barrier_arrive" not in off


def test_the_model_prices_exp_on_the_fma_pipe():
    """The launch estimate states the configuration's share of exp2 on the FMA pipe, and the model
    moves that share of the SFU time to the CUDA cores at FMA_FLOPS_PER_EXP each."""
    from dataclasses import replace

    from napkin.codegen.select import launch_shape
    from napkin.perfmodel.predict import predict_schedule

    d = bound("mha", q=8192, x=8192, h=16)
    s = F8.schedule(FAMILY, d, F8.configs(128)[0])
    est = FAMILY.launch_estimate(d, s, "h100")
    assert est["exp_fma_share"] == F8.configs(128)[0].poly / 16 and est["fma_flops_per_exp"] == F8.FMA_FLOPS_PER_EXP
    shape = launch_shape(d, FAMILY, s, "h100")
    assert shape.exp_fma_share == est["exp_fma_share"]
    k = {share: predict_schedule(s, "h100", launch=replace(shape, exp_fma_share=share)).kernels[0].roofline
         for share in (0.0, 0.25)}
    assert k[0.25].compute_s["sfu"] == pytest.approx(0.75 * k[0.0].compute_s["sfu"])
    from napkin.perfmodel.cost import cost

    fl = cost(s, "h100").per_kernel[0].flops  # the rates the model used, as FLOPs over seconds
    cuda_rate = float(fl["cuda"]) / k[0.0].compute_s["cuda"]
    moved = 0.25 * float(fl["sfu"]) * F8.FMA_FLOPS_PER_EXP
    assert k[0.25].compute_s["cuda"] - k[0.0].compute_s["cuda"] == pytest.approx(moved / cuda_rate)
    assert k[0.25].flops == k[0.0].flops  # the FLOPs reported stay the attention's

