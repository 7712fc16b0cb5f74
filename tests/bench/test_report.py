"""napkin.bench.report from synthetic JSON (plots, BENCHMARKS.md, PASS/MISS), and the suite that
writes that JSON: its points and conventions, one point on the CPU, the baselines against the
reference, the model adapter, and the crash-proof orchestration with a fake child process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from napkin.bench import report, suite
from napkin.bench.report import evaluate_targets, generate, model_accuracy, verdict
from napkin.bench.suite import Point, all_points, attention_flops, gemm_flops

ROOT = Path(__file__).resolve().parents[2]

DEVICE = {
    "name": "NVIDIA H100 80GB HBM3", "gpu_key": "h100", "sm_count": 132, "capability": "9.0",
    "l2_bytes": 50 * 2**20, "memory_bytes": 80 * 2**30, "driver": "580.159.04", "torch": "2.11.0+cu130",
    "cuda_version": "13.0", "cudnn": 91000, "triton": "3.6.0", "copy_bandwidth": 3.0e12,
    "clocks": {"sm_clock_mhz": 1980.0, "max_sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "max_mem_clock_mhz": 2619.0},
    "date": "2026-11-21T12:00:00+00:00", "napkin_commit": "abc1234", "cuda": True,
}


def _point(p: Point, napkin_rate, baselines: dict, pred_err=None, candidates=None, error=None) -> dict:
    """A record as the suite writes it, from rates (TFLOP/s or GB/s) instead of seconds."""
    rec = p.to_dict()
    work = rec["bytes"] / 1e9 if rec["metric"] == "gbps" else rec["flops"] / 1e12

    def secs(rate):
        return work / rate

    rec["napkin_s"] = secs(napkin_rate) if napkin_rate else None
    rec[rec["metric"]] = napkin_rate
    rec["baselines"], rec["rates"], rec["ratio"] = {}, {}, {}
    if napkin_rate:
        rec["rates"]["napkin"] = napkin_rate
    for name, v in baselines.items():
        if isinstance(v, dict):
            rec["baselines"][name] = v
        else:
            rec["baselines"][name] = secs(v)
            rec["rates"][name] = v
            if napkin_rate:
                rec["ratio"][name] = napkin_rate / v
    rec["pred_s"] = rec["napkin_s"] * (1 + pred_err) if (pred_err is not None and rec["napkin_s"]) else None
    rec["pred_err"] = pred_err
    if candidates:
        rec["napkin"] = {"tune": {"candidates": [{"rank": i, "pred_s": pr, "meas_s": me}
                                                for i, (pr, me) in enumerate(candidates)]}}
    if error:
        rec["errors"] = {"napkin": error}
    rec["check"] = {"against": next(iter(baselines), None), "rel_err": 3e-3, "ok": True}
    return rec


def _att(seq, causal, d=128):
    batch = 16384 // seq
    return Point("attention", "attention_causal" if causal else "mha", {"h": 16 * batch, "q": seq, "x": seq, "d": d},
                 "bf16", {"d": d, "causal": causal, "seq": seq, "batch": batch, "heads": 16})


SWAP8 = [(1, 1.1), (2, 2.3), (3, 2.9), (4, 4.4), (5, 4.1), (6, 6.6), (7, 7.0), (8, 9.0)]


def synthetic_points() -> list[dict]:
    skip = {"skipped": "RuntimeError: No available kernel. Aborting execution."}
    return [
        _point(_att(16384, False), 400, {"sdpa_flash": 350, "sdpa_cudnn": 650, "sdpa_efficient": skip, "flex": 368,
                                          "reference_compiled": {"error": "OutOfMemoryError: CUDA out of memory"}},
               pred_err=0.10, candidates=SWAP8),
        _point(_att(4096, False), 300, {"sdpa_flash": 330, "sdpa_cudnn": 600, "flex": 290}, pred_err=-0.20),
        _point(_att(16384, True), None, {"sdpa_flash": 300, "sdpa_cudnn": 500, "flex": 280},
               error="CodegenError: no template"),
        _point(Point("matmul", "matmul", {"a": 8192, "b": 8192, "c": 8192}, "bf16", {"n": 8192}), 700,
               {"cublas": 780}, pred_err=0.40),
        _point(Point("matmul", "matmul", {"a": 4096, "b": 4096, "c": 4096}, "bf16", {"n": 4096}), 650,
               {"cublas": 700}, pred_err=-0.30, candidates=[(1, 1), (2, 3), (3, 2), (4, 4)]),
        _point(Point("mlp", "mlp", {"a": 4096, "b": 4096, "c": 16384}, "bf16", {"tokens": 4096, "in": 4096, "out": 16384}),
               600, {"eager": 500, "compile": 550}, pred_err=0.05),
        _point(Point("rowwise", "softmax", {"r": 32768, "x": 4096}, "bf16", {"width": 4096, "rows": 32768}), 2600,
               {"eager": 2000, "compile": 2400}, pred_err=0.02,
               candidates=[(i, 9 - i) for i in range(1, 9)]),
        _point(Point("rowwise", "layernorm", {"r": 4096, "x": 32768}, "fp16", {"width": 32768, "rows": 4096}), 2000,
               {"eager": 2100, "compile": 1900}, pred_err=0.5),
        dict(_point(Point("rowwise", "rmsnorm", {"r": 8192, "x": 16384}, "bf16", {"width": 16384, "rows": 8192}),
                    3000, {"eager": 2000}), check={"against": "eager", "rel_err": 0.5, "ok": False}),
    ]


def write_results(folder: Path, points: list[dict], device=DEVICE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    by = {}
    for p in points:
        by.setdefault(p["family"], []).append(p)
    for fam, pts in by.items():
        (folder / f"{fam}.json").write_text(json.dumps({"device": device, "points": pts}))
    (folder / "notes.json").write_text('{"not": "results"}')
    (folder / "broken.json").write_text("{oops")
    return folder


# ----------------------------------------------------------------------------- verdicts


def test_verdict_and_gap():
    assert verdict(1.0) == "PASS (+0.0%)"
    assert verdict(400 / 350) == "PASS (+14.3%)"
    assert verdict(400 / 520) == "MISS (−23.1%)"
    assert verdict(None) == "n/a" and verdict(float("nan")) == "n/a"
    assert report.model_error_verdict(0.15) == "PASS (15.0% ≤ 15%)"
    assert report.model_error_verdict(0.35) == "MISS (35.0% > 15%, +20.0 points)"


def test_targets_computed_per_point():
    pts = synthetic_points()
    res = {r.target.id: r for r in evaluate_targets(DEVICE, pts)}
    fa2 = res["attention_vs_fa2"]
    by = {row.label: row for row in fa2.rows}
    assert by["d128 non-causal seq 16384 (batch 1)"].ratio == pytest.approx(400 / 350)
    assert by["d128 non-causal seq 16384 (batch 1)"].verdict == "PASS (+14.3%)"
    assert by["d128 non-causal seq 4096 (batch 4)"].verdict == "MISS (−9.1%)"
    assert by["d128 causal seq 16384 (batch 1)"].verdict == "n/a (napkin failed)"
    assert (fa2.n_pass, fa2.n_measured, len(fa2.rows)) == (1, 2, 3)
    cud = {row.label: row for row in res["attention_vs_cudnn"].rows}
    assert cud["d128 non-causal seq 16384 (batch 1)"].reference == pytest.approx(0.8 * 650)
    assert cud["d128 non-causal seq 16384 (batch 1)"].verdict == "MISS (−23.1%)"
    mm = {row.label: row.verdict for row in res["matmul_vs_cublas"].rows}
    # 0.75 × cuBLAS: 8192³ 700 vs 585, 4096³ 650 vs 525
    assert mm == {"8192³": "PASS (+19.7%)", "4096³": "PASS (+23.8%)"}
    # 1.2 × unfused eager: 600 vs 600
    assert res["mlp_vs_eager"].rows[0].verdict == "PASS (+0.0%)"
    copy = {row.label: row for row in res["rowwise_vs_copy"].rows}
    assert copy["softmax bf16 width 4096 × 32768 rows"].reference == pytest.approx(0.85 * 3000)
    assert copy["softmax bf16 width 4096 × 32768 rows"].verdict == "PASS (+2.0%)"
    assert copy["layernorm fp16 width 32768 × 4096 rows"].verdict == "MISS (−21.6%)"
    eager = {row.label: row.verdict for row in res["rowwise_vs_eager"].rows}
    assert eager["softmax bf16 width 4096 × 32768 rows"] == "MISS (−13.3%)"
    assert eager["layernorm fp16 width 32768 × 4096 rows"] == "MISS (−36.5%)"
    # fast but wrong is a MISS
    assert eager["rmsnorm bf16 width 16384 × 8192 rows"] == "MISS (wrong output, rel err 5.0e-01)"
    assert (res["rowwise_vs_eager"].n_pass, res["rowwise_vs_eager"].n_measured) == (0, 3)


def test_model_accuracy_per_family():
    acc = model_accuracy(synthetic_points())
    assert acc["attention"]["n_points"] == 2 and acc["attention"]["median_err"] == pytest.approx(0.15)
    assert acc["attention"]["spearman"] == pytest.approx(1 - 6 * 2 / (8 * 63)) and acc["attention"]["spearman_n"] == 8
    assert acc["matmul"]["median_err"] == pytest.approx(0.35) and acc["matmul"]["spearman_n"] == 4
    assert acc["rowwise"]["spearman"] == pytest.approx(-1.0)
    assert acc["mlp"]["spearman"] is None and acc["mlp"]["spearman_n"] == 0


def test_spearman_pools_points_after_dividing_by_their_medians():
    """Two points whose configurations the model orders right: the pooled, normalised correlation
    is 1 even though the second point is 100x slower and the model is 2x off on it."""
    a = _point(_att(4096, False), 300, {}, candidates=[(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0)])
    b = _point(_att(16384, False), 300, {}, candidates=[(50.0, 100.0), (100.0, 200.0), (150.0, 300.0), (200.0, 400.0)])
    one = _point(_att(1024, False), 300, {}, candidates=[(1.0, 9.0)])  # a single configuration adds nothing
    acc = model_accuracy([a, b, one])["attention"]
    assert acc["spearman"] == pytest.approx(1.0) and acc["spearman_n"] == 8 and acc["spearman_points"] == 2
    # the same numbers pooled raw would mix problem sizes; the normalised ranks here are
    # (0.4, 0.8, 1.2, 1.6) for both points, ties averaged: still 1.0
    c = _point(_att(8192, False), 300, {}, candidates=[(4.0, 1.0), (3.0, 2.0), (2.0, 3.0), (1.0, 4.0)])
    acc2 = model_accuracy([a, c])["attention"]
    assert acc2["spearman"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------- the report


def test_generate_writes_plots_and_benchmarks_md(tmp_path):
    folder = write_results(tmp_path / "nvidia-h100-80gb-hbm3", synthetic_points())
    rep = generate(folder)
    names = sorted(p.name for p in rep.plots)
    assert names == ["attention_tflops.png", "gemm_tflops.png", "pred_vs_meas.png", "roofline.png", "rowwise_gbps.png"]
    for p in rep.plots:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    md = (folder / "BENCHMARKS.md").read_text()
    assert md == rep.markdown.read_text()
    # the device
    for s in ("NVIDIA H100 80GB HBM3", "580.159.04", "2.11.0+cu130", "13.0", "1980", "3.00 TB/s", "abc1234"):
        assert s in md, s
    # one table per target, each row with its verdict
    for t in report.TARGETS:
        assert f"### {t.title}" in md
    lines = md.splitlines()

    def row(section: str, label: str) -> str:
        i = lines.index(f"### {section}")
        for line in lines[i + 1:]:
            if line.startswith("### ") or line.startswith("## "):
                break
            if line.startswith(f"| {label} |"):
                return line
        raise AssertionError(f"no row {label!r} under {section!r}")

    fa2 = "Attention forward ≥ 1.0 × PyTorch SDPA flash backend (FlashAttention-2)"
    assert row(fa2, "d128 non-causal seq 16384 (batch 1)") == \
        "| d128 non-causal seq 16384 (batch 1) | 350 | 400 | 1.14 | PASS (+14.3%) |"
    assert row(fa2, "d128 non-causal seq 4096 (batch 4)").endswith("| 0.91 | MISS (−9.1%) |")
    assert row(fa2, "d128 causal seq 16384 (batch 1)").endswith("| n/a (napkin failed) |")
    assert row("GEMM 4096³ and 8192³ ≥ 0.75 × cuBLAS", "8192³") == "| 8192³ | 585 | 700 | 1.20 | PASS (+19.7%) |"
    assert row("GEMM 4096³ and 8192³ ≥ 0.75 × cuBLAS", "4096³").endswith("PASS (+23.8%) |")
    assert row("Softmax/layernorm/rmsnorm ≥ 0.85 × the measured copy rate (GB/s)",
               "layernorm fp16 width 32768 × 4096 rows").endswith("| 0.78 | MISS (−21.6%) |")
    # the summary of targets
    assert "| Attention forward ≥ 1.0 × PyTorch SDPA flash backend (FlashAttention-2) | 1 | 2 of 3 | 0.91 |" in md
    # model accuracy
    acc_row = next(line for line in lines if line.startswith("| attention | 2 |"))
    # the synthetic records name no schedule: the recorded predictions stay, nothing is calibrated
    assert "15.0%" in acc_row and "PASS (15.0% ≤ 15%)" in acc_row
    assert acc_row.endswith("| — | — | n/a | 0.98 (8 configs, 1 point) | PASS |")
    assert "0 of 9 points" in md and "Not re-predicted" in md
    assert not (folder / report.CALIBRATED_PROFILE).exists()
    mm_row = next(line for line in lines if line.startswith("| matmul | 2 |"))
    assert "MISS (35.0% > 15%, +20.0 points)" in mm_row and "n/a (only 4 configs)" in mm_row
    assert "| rmsnorm bf16 width 16384 × 8192 rows | 0.179 | 3,000 | 2,000 (×1.50) | — | — | — | **WRONG** 5.0e-01 |" in md
    rw_row = next(line for line in lines if line.startswith("| rowwise | 2 |"))
    assert "MISS (−1.80)" in rw_row
    # plots linked, skipped and failed baselines listed with their reasons
    assert "![roofline](plots/roofline.png)" in md
    assert "sdpa_efficient skipped at 1 point(s): RuntimeError: No available kernel" in md
    assert "reference_compiled failed at 1 point(s): OutOfMemoryError" in md
    assert "napkin failed at 1 point(s): CodegenError: no template" in md


def test_generate_all_finds_gpu_folders_and_survives_empty_results(tmp_path):
    write_results(tmp_path / "results" / "gpu-a", synthetic_points()[:3])
    write_results(tmp_path / "results" / "gpu-b", synthetic_points()[3:])
    (tmp_path / "results" / "empty").mkdir()
    reps = report.generate_all(tmp_path / "results")
    assert sorted(r.markdown.parent.name for r in reps) == ["gpu-a", "gpu-b"]
    only_fail = [dict(synthetic_points()[2], pred_s=None)]
    rep = generate(write_results(tmp_path / "f", only_fail, device={}))
    md = rep.markdown.read_text()
    assert "n/a (napkin failed)" in md and "| GPU | unknown |" in md


def test_report_command_line(tmp_path):
    write_results(tmp_path / "res" / "gpu", synthetic_points())
    assert report.main([str(tmp_path / "res")]) == 0
    assert (tmp_path / "res" / "gpu" / "BENCHMARKS.md").exists()


# ----------------------------------------------------------------------------- suite: points and conventions


def test_flop_conventions():
    assert gemm_flops(8192, 8192, 8192) == 2 * 8192**3
    assert attention_flops(16, 4096, 4096, 128) == 4 * 16 * 4096 * 4096 * 128
    assert attention_flops(16, 4096, 4096, 128, causal=True) == 2 * 16 * 4096 * 4096 * 128
    p = Point("mlp", "mlp", {"a": 4096, "b": 1024, "c": 16384}, "bf16")
    assert p.flops == 2 * 4096 * 16384 * 1024
    assert p.bytes == 2 * (4096 * 1024 + 16384 * 1024 + 16384 + 4096 * 16384)


def test_the_full_sweep():
    pts = all_points(quick=False)
    fam = {f: [p for p in pts if p.family == f] for f in suite.FAMILIES}
    assert len(fam["attention"]) == 20 and len(fam["matmul"]) == 7 and len(fam["mlp"]) == 2
    assert len(fam["rowwise"]) == 36
    assert len({p.id for p in pts}) == len(pts)
    for p in fam["attention"]:
        s, lab = p.sizes, p.labels
        assert lab["batch"] * lab["seq"] == 16384 and s["h"] == 16 * lab["batch"] and s["q"] == s["x"] == lab["seq"]
        assert p.diagram == ("attention_causal" if lab["causal"] else "mha") and p.dtype == "bf16"
        assert p.flops == attention_flops(s["h"], s["q"], s["x"], s["d"], lab["causal"])
    assert {(p.labels["d"], p.labels["seq"]) for p in fam["attention"]} == \
        {(d, s) for d in (64, 128) for s in (1024, 2048, 4096, 8192, 16384)}
    square = [p for p in fam["matmul"] if "n" in p.labels and p.dtype == "bf16"]
    assert {p.sizes["a"] for p in square} == {4096, 8192}
    assert {p.labels.get("shape") for p in fam["matmul"]} == {None, "odd", "transposed", "batched", "K=256k", "fp32"}
    assert {p.diagram for p in fam["matmul"]} == {"matmul", "matmul_t", "batched_matmul"}
    for p in fam["rowwise"]:
        assert p.sizes["r"] * p.sizes["x"] * 2 == 256 * 2**20 and p.metric == "gbps"
    assert {p.dtype for p in fam["rowwise"]} == {"bf16", "fp16"}
    assert pts[0].labels == {"d": 128, "causal": False, "seq": 16384, "batch": 1, "heads": 16}
    assert len(all_points(quick=True)) <= 20
    composed = {(p.diagram, p.labels["size"]): p for p in fam["composed"]}
    assert {d for d, _ in composed} == {"transformer_block", "swiglu", "rmsnorm_linear", "gemm_softmax",
                                        "gelu_tanh", "column_sum", "matvec"}
    assert composed[("transformer_block", "7b")].sizes == {"q": 4096, "e": 4096, "h": 32, "d": 128, "f": 11008}
    assert composed[("swiglu", "default")].metric == "tflops"
    assert composed[("column_sum", "default")].metric == "gbps"
    # a composed point's FLOPs are the boxes' work: SwiGLU is three GEMMs plus its maps
    sw = composed[("swiglu", "default")]
    gemms = 3 * gemm_flops(sw.sizes["a"], sw.sizes["f"], sw.sizes["b"])
    assert gemms <= sw.flops < gemms * 1.01
    assert [p.family for p in all_points(quick=True, families=("matmul",))] == ["matmul", "matmul"]
    with pytest.raises(ValueError):
        all_points(families=("nope",))


def test_run_all_lists_points_without_a_gpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--list", "--quick"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "attention/mha/bf16/d=128,causal=false,seq=16384" in p.stdout and "matmul/matmul/bf16/n=8192" in p.stdout


# ----------------------------------------------------------------------------- suite: the model adapter


def _schedule():
    from napkin.diagrams import library
    from napkin.perfmodel.schedule import Schedule

    d = library.get("matmul").bind(a=4096, b=4096, c=4096)
    return Schedule.fused(d, groups={"a": 128, "c": 128}, streams={"b": 64})


def test_point_flops_count_every_head_axis():
    one = suite.Point("attention", "attention", {"q": 64, "x": 80, "d": 16}, "bf16")
    assert one.flops == 4 * 64 * 80 * 16
    gqa = suite.Point("attention", "gqa", {"h": 2, "j": 3, "q": 64, "x": 64, "d": 16}, "bf16", {"causal": True})
    assert gqa.flops == 2 * 2 * 3 * 64 * 64 * 16
    batched = suite.Point("matmul", "batched_matmul", {"n": 4, "a": 8, "b": 16, "c": 32}, "bf16")
    assert batched.flops == 2 * 4 * 8 * 16 * 32


def test_model_prediction_is_the_models_own():
    from napkin.codegen.select import predict_schedule as codegen_predict
    from napkin.perfmodel.predict import predict_schedule as model_predict

    sched = _schedule()
    p = suite.model_prediction(sched, "h100")
    plain = model_predict(sched, "h100")
    assert p["pred_s"] == pytest.approx(plain.seconds) and p["bound"] == plain.bound
    from napkin.codegen import families

    fam = families.get("contraction")
    ranked = fam.candidates(sched.diagram, "h100", "bf16")[0]
    q = suite.model_prediction(ranked, "h100", family=fam, diagram=sched.diagram)
    assert q["pred_s"] == pytest.approx(codegen_predict(sched.diagram, fam, ranked, "h100").seconds)
    assert q["cost_roofline_s"] == pytest.approx(model_predict(ranked, "h100").seconds)
    assert q["how"].startswith("codegen.select.predict_schedule")


def test_model_prediction_of_a_kernel_the_generic_launch_cannot_hold():
    """A GEMM whose blocks reduce their rows to split partials holds more registers than the
    model's generic launch of its threads allows: the family's own prediction (what the planner
    ranked) is still given, with no generic bound; without a family the error stands."""
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.select import predict_schedule as codegen_predict
    from napkin.diagrams import Diagram, array, axes, contract, relu, sum_over
    from napkin.errors import NapkinError

    a, k, n = axes("a k n")
    c = contract(array("A", a, k), array("B", k, n), over=k, out=(a, n), name="C")
    d = Diagram("gemm_relu_sum", sum_over(relu(c), n, name="Y"))
    cd = napkin_compile(d, gpu="h100", sizes=dict(a=8192, k=1024, n=1024), dtype="bf16")
    assert len(cd.plan.kernels) == 1 and cd.plan.kernels[0].kernel.options.splits  # the split row reduction
    with pytest.raises(NapkinError):
        suite.model_prediction(cd.schedule, "h100")
    q = suite.model_prediction(cd.schedule, "h100", family=cd.family, diagram=cd.diagram)
    assert q["pred_s"] == pytest.approx(codegen_predict(cd.diagram, cd.family, cd.schedule, "h100").seconds)
    assert q["bound"] is None and q["cost_roofline_s"] is None


# ----------------------------------------------------------------------------- suite: baselines on the CPU


CASES = [("mha", dict(h=2, q=64, x=64, d=16)), ("attention_causal", dict(h=2, q=48, x=80, d=16)),
         ("attention_window", dict(h=2, q=300, x=300, d=16)), ("attention_alibi", dict(h=4, q=64, x=64, d=16)),
         ("attention_softcap", dict(h=2, q=64, x=64, d=16)), ("gqa", dict(h=2, j=3, q=64, x=64, d=16)),
         ("softmax", dict(r=4, x=32)), ("layernorm", dict(r=4, x=32)), ("rmsnorm", dict(r=4, x=32)),
         ("mlp", dict(a=8, b=16, c=24)), ("matmul", dict(a=8, b=16, c=24)), ("matmul_t", dict(a=8, b=16, c=24)),
         ("batched_matmul", dict(n=2, a=8, b=16, c=24)),
         ("transformer_block", dict(q=16, e=32, h=2, d=8, f=48)), ("swiglu", dict(a=8, b=16, f=24)),
         ("rmsnorm_linear", dict(r=4, x=32, c=8)), ("gemm_softmax", dict(a=4, b=16, c=8)),
         ("gelu_tanh", dict(r=4, x=32)), ("column_sum", dict(r=9, x=32))]


@pytest.mark.parametrize("name,sizes", CASES, ids=[c[0] for c in CASES])
def test_baselines_compute_the_diagram(name, sizes):
    """Every baseline that runs here (compiled with the eager backend) matches napkin's reference."""
    pytest.importorskip("torch")
    from napkin.bench.baselines import baselines_for
    from napkin.bench.timing import diagram_inputs
    from napkin.diagrams import library

    d = library.get(name).with_dtype("fp32").bind(**sizes)
    args = diagram_inputs(d, "fp32", "cpu", seed=0)
    ref = d.reference(dict(zip(d.input_names, args)))[d.output_names[0]]
    ran = 0
    for b in baselines_for(d, compile_backend="eager", device="cpu"):
        if not b.available:
            assert b.skipped
            continue
        reason, out = b.probe(*args)
        if reason is not None:  # SDPA backends that do not exist on a CPU refuse
            assert b.name.startswith("sdpa_") and b.skipped == reason
            continue
        assert out.shape == ref.shape, b.name
        assert float((out - ref).abs().max()) < 1e-4, b.name
        ran += 1
    assert ran >= 1
    if name == "attention_softcap":
        skipped = {b.name: b.skipped for b in baselines_for(d, compile=False, device="cpu")}
        assert all("soft-cap" in v for v in skipped.values())


def test_composed_diagrams_and_user_files_are_timed_against_their_reference(tmp_path):
    """Any diagram that is not one template shape (a user's file included) is benchmarked against
    its own PyTorch reference, eager and compiled; a point can name a user file."""
    pytest.importorskip("torch")
    from napkin.bench.baselines import baselines_for, family_of
    from napkin.bench.suite import Point
    from napkin.diagrams import library

    f = tmp_path / "mine.py"
    f.write_text("from napkin.diagrams import *\n"
                 "r, x = axes('r x')\n"
                 "chain = Diagram('chain', (tanh(array('X', r, x)) * 0.5 + 0.5).named('Y'))\n")
    p = Point("composed", f"{f}:chain", {"r": 4, "x": 8}, "fp32")
    d = p.bound_diagram()
    assert d.name == "chain" and family_of(d) == "composed" and p.metric == "gbps"
    assert [b.name for b in baselines_for(d, compile_backend="eager", device="cpu")] == ["eager", "compile"]
    assert family_of(library.get("transformer_block")) == "composed"
    assert family_of(library.get("matmul").renamed("mine")) == "matmul"
    assert family_of(library.get("swiglu").renamed("mine")) == "composed"


def test_traceable_reference_is_one_graph():
    torch = pytest.importorskip("torch")
    from napkin.bench.baselines import traceable_reference
    from napkin.bench.timing import diagram_inputs
    from napkin.diagrams import library

    d = library.get("attention_alibi").with_dtype("fp32").bind(h=2, q=32, x=32, d=8)
    args = diagram_inputs(d, "fp32", "cpu", seed=0)
    torch._dynamo.reset()
    ex = torch._dynamo.explain(traceable_reference(d))(*args)
    assert ex.graph_break_count == 0 and ex.graph_count == 1


def test_traceable_reference_broadcasts_a_0d_value():
    """A full reduction broadcast back over the array (x / ‖x‖_F, a loss's mean): the eager
    baseline raised a TypeError on the 0-d map (``expand(*())``)."""
    torch = pytest.importorskip("torch")
    from napkin.bench.baselines import traceable_reference
    from napkin.bench.timing import diagram_inputs
    from napkin.diagrams import Diagram, array, axes, contract, sqrt, square, sum_over

    a, b = axes("a b")
    X = array("X", a, b, dtype="fp32")
    n = sqrt(sum_over(square(X), (a, b)), name="n")
    scaled = contract((n * 2.0).named("n2"), X, over=(), name="Y")  # a 0-d operand of a contraction
    for y in ((X / n).named("Y"), scaled):
        d = Diagram("frobenius", y).bind(a=5, b=7)
        args = diagram_inputs(d, "fp32", "cpu", seed=0)
        got = traceable_reference(d)(*args)
        want = d.reference(dict(zip([v.name for v in d.inputs], args)))["Y"]
        assert got.shape == (5, 7) and torch.allclose(got, want.to(got.dtype))


def test_run_point_on_the_cpu_records_everything_and_never_raises():
    pytest.importorskip("torch")
    cfg = suite.SuiteConfig(device="cpu", compile_backend="eager", autotune=False, reps=3, warmup=1, max_time_s=0.1)
    for p in (Point("attention", "mha", {"h": 2, "q": 64, "x": 64, "d": 16}, "bf16",
                    {"d": 16, "causal": False, "seq": 64, "batch": 1, "heads": 2}),
              Point("rowwise", "layernorm", {"r": 16, "x": 128}, "fp16", {"width": 128, "rows": 16})):
        rec = suite.run_point(p, cfg)
        json.dumps(suite._clean(rec))
        assert rec["id"] == p.id and rec["metric"] == p.metric and rec["wall_s"] >= 0
        timed = {n: v for n, v in rec["baselines"].items() if isinstance(v, float)}
        assert timed, rec["baselines"]
        for n, v in timed.items():
            assert rec["rates"][n] > 0 and rec["timings"][n]["reps"] >= 1
        if rec["napkin_s"] is None:
            assert rec["errors"].get("napkin")  # codegen missing or failing here: recorded, not raised
        else:
            assert set(rec["ratio"]) == set(timed)


# ----------------------------------------------------------------------------- suite: orchestration


FAKE_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from napkin.bench.suite import all_points
    start, jsonl, deadline = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    deadline = None if deadline == "none" else float(deadline)
    plan = json.loads(os.environ["FAKE_PLAN"])
    pts = all_points(True)
    def put(obj):
        with open(jsonl, "a") as f:
            f.write(json.dumps(obj) + "\\n")
    put({"device": {"name": "Fake GPU 9000", "copy_bandwidth": 1e12}, "start": start})
    for i in range(start, len(pts)):
        if deadline is not None and time.time() > deadline:
            sys.exit(0)
        what = plan.get(str(i), "ok")
        rec = pts[i].to_dict()
        rec["index"] = i
        if what == "crash":
            print("Segmentation fault (core dumped)", flush=True)
            os._exit(139)
        if what == "hang":
            time.sleep(600)
        if what == "fatal":
            rec.update(napkin_s=None, baselines={}, errors={"fatal": "CUDA error: an illegal memory access"})
            put(rec)
            sys.exit(3)
        if what.startswith("slow"):
            time.sleep(float(what[4:]))
        work = rec["bytes"] / 1e9 if rec["metric"] == "gbps" else rec["flops"] / 1e12
        rec.update(napkin_s=work / 100, baselines={"base": work / 50}, rates={"napkin": 100, "base": 50},
                   ratio={"base": 2.0}, pred_s=work / 90, pred_err=0.1)
        rec[rec["metric"]] = 100
        put(rec)
""")


def _run_orchestrate(tmp_path, plan, **kw):
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    os.environ["FAKE_PLAN"] = json.dumps(plan)
    try:
        pts = all_points(quick=True)
        cmd = lambda start, jsonl, deadline: [sys.executable, str(script), str(start), str(jsonl),  # noqa: E731
                                             "none" if deadline is None else repr(deadline)]
        return pts, suite.orchestrate(pts, tmp_path / "out", child_args={}, child_cmd=cmd, progress=False,
                                      poll_s=0.05, **kw)
    finally:
        del os.environ["FAKE_PLAN"]


def test_orchestrate_survives_crash_hang_and_broken_context(tmp_path):
    pts, (device, recs, gpu_dir) = _run_orchestrate(tmp_path, {"2": "crash", "4": "hang", "6": "fatal"},
                                                    point_timeout_s=3.0)
    assert device["name"] == "Fake GPU 9000" and gpu_dir.name == "fake-gpu-9000"
    assert [r["index"] for r in recs] == list(range(len(pts)))
    assert "exited with code 139" in recs[2]["errors"]["crash"] and "Segmentation" in recs[2]["errors"]["log_tail"]
    assert "timed out" in recs[4]["errors"]["crash"]
    assert "illegal memory access" in recs[6]["errors"]["fatal"]
    ok = [r for i, r in enumerate(recs) if i not in (2, 4, 6)]
    assert all(r["napkin_s"] for r in ok)
    files = sorted(p.name for p in gpu_dir.glob("*.json"))
    assert files == sorted(f"{f}.json" for f in {p.family for p in pts})
    data = json.loads((gpu_dir / "attention.json").read_text())
    assert data["device"]["name"] == "Fake GPU 9000" and all(p["family"] == "attention" for p in data["points"])
    rep = generate(gpu_dir)
    md = rep.markdown.read_text()
    assert "Fake GPU 9000" in md and "PASS" in md and "napkin crash failed at" in md


def test_orchestrate_stops_at_the_time_budget(tmp_path):
    pts, (device, recs, gpu_dir) = _run_orchestrate(tmp_path, {str(i): "slow0.4" for i in range(20)},
                                                    budget_s=1.0)
    done = [r for r in recs if r.get("napkin_s")]
    assert 1 <= len(done) < len(pts)
    assert all(r.get("skipped") == "time budget" for r in recs if not r.get("napkin_s"))
    rows = suite.summary_rows(recs)
    assert rows[0]["status"] == "ok" and rows[-1]["status"] == "time budget"


@pytest.mark.skipif(not (ROOT / "benchmarks" / "results" / "nvidia-h200" / "attention.json").exists(),
                    reason="no committed H200 results")
def test_report_re_predicts_committed_results_and_writes_the_calibrated_profile(tmp_path):
    import shutil

    from napkin.perfmodel.hardware import get_gpu

    src = ROOT / "benchmarks" / "results" / "nvidia-h200"
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    for f in src.glob("*.json"):
        if f.name != report.CALIBRATED_PROFILE:
            shutil.copy(f, folder / f.name)
    rep = generate(folder)
    md = rep.markdown.read_text()
    # every point whose plan is one kernel is re-predicted (a plan of several is not a family's sample)
    m = re.search(r"\((\d+) of (\d+) points", md)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 60
    assert "leave-one-out" in md and "mma_sync_fraction" in md
    for fam in ("attention", "matmul", "mlp", "rowwise"):
        a = rep.accuracy[fam]
        assert a["n_repredicted"] == a["n_points"] and a["median_err_cv"] is not None
        row = next(line for line in md.splitlines() if line.startswith(f"| {fam} | {a['n_points']} |"))
        assert row.count("PASS") + row.count("MISS") == 3
    prof = get_gpu(str(folder / report.CALIBRATED_PROFILE))
    assert set(prof.efficiency) == {"attention", "contraction", "rowwise", "pointwise"} and "calibrated" in prof.source
    # the recorded JSON is untouched: re-prediction works on copies
    assert json.loads((folder / "matmul.json").read_text()) == json.loads((src / "matmul.json").read_text())


def test_composed_points_are_checked_against_float64_within_twice_eager_error():
    torch = pytest.importorskip("torch")
    from napkin.bench.suite import _check_against_float64
    from napkin.bench.timing import diagram_inputs
    from napkin.diagrams import library

    d = library.get("gelu_tanh").with_dtype("bf16").bind(r=8, x=64)
    args = diagram_inputs(d, "bf16", "cpu", seed=0)
    exact = d.reference({n: t.double() for n, t in zip(d.input_names, args)}, dtype=torch.float64)["Y"]
    eager = exact.to(torch.bfloat16)
    close = _check_against_float64(d, args, {"napkin": eager.clone(), "baseline:eager": eager}, 1e-6)
    assert close["ok"] and close["rel_err"] == close["eager_rel_err"] > 0
    wrong = _check_against_float64(d, args, {"napkin": exact.flip(0), "baseline:eager": eager}, 2e-2)
    assert not wrong["ok"]
    nan = _check_against_float64(d, args, {"napkin": exact * float("nan"), "baseline:eager": eager}, 2e-2)
    assert not nan["ok"]
