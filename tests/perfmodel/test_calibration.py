"""The one prediction path (LaunchShape), the instruction-path and overlap assumptions, and the
calibration (:mod:`napkin.bench.calibration`): fitting, leave-one-out, the written profile,
re-predicting recorded schedules, old and new schedule ids."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from napkin.codegen import select
from napkin.diagrams import library
from napkin.errors import HardwareError, ScheduleError
from napkin.bench import calibration as C
from napkin.perfmodel.hardware import GPU, get_gpu
from napkin.perfmodel.predict import (
    LaunchShape,
    latency_floor,
    predict_kernel,
    predict_schedule,
)
from napkin.perfmodel.roofline import LAUNCH_OVERHEAD_S, Efficiency, Work, predict
from napkin.perfmodel.schedule import Schedule

ROOT = Path(__file__).resolve().parents[2]
H200_RESULTS = ROOT / "benchmarks" / "results" / "nvidia-h200"
H100_RESULTS = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3"


def _engine(s):
    """A contraction schedule's engine, typed (KernelOptions) or from a legacy note."""
    e = s.kernels[0].options.engine
    if e is None:
        e = "wgmma" if "engine=wgmma" in s.notes else "mma.sync"
    return e


def _threads_per_row(s):
    """A row-wise schedule's threads per row, typed or from a legacy note."""
    t = s.kernels[0].options.threads_per_row
    if t is None:
        import re

        t = int(re.search(r"THREADS_PER_ROW=(\d+)", " ".join(s.notes)).group(1))
    return t


# ----------------------------------------------------------------------------- the LaunchShape path


def test_launch_shape_path_matches_a_hand_computation(h100):
    """256 threads x 128 registers = 32768 registers: 2 blocks per SM; 1000 blocks over 264 slots
    take 4 waves for 3.79 ideal; the body is the tensor term; the floor is below it."""
    w = Work(flops={"tensor": 2e12}, bytes={"HBM": 1e9}, dtype="bf16")
    shape = LaunchShape(blocks=1000, threads=256, regs_per_thread=128, smem_bytes=0, in_flight_bytes_per_thread=64)
    k = predict_kernel(h100, w, shape)
    assert k.blocks_per_sm == 2
    body = 2e12 / 989.4e12
    assert k.roofline.seconds == pytest.approx(body * 4 / (1000 / 264) + LAUNCH_OVERHEAD_S)
    floor = 1e9 * 800e-9 / (2 * 256 * 64 * 132)
    assert k.latency_floor_s == pytest.approx(floor) and k.seconds == k.roofline.seconds and k.bound == "tensor"
    # few bytes in flight and half the lanes idle: Little's law decides
    mem = Work(bytes={"HBM": 1e9})
    lean = LaunchShape(blocks=1000, threads=128, regs_per_thread=32, smem_bytes=0, in_flight_bytes_per_thread=4,
                       idle_lanes=0.5)
    k2 = predict_kernel(h100, mem, lean)
    assert k2.blocks_per_sm == 16  # 4 warps a block, 64 warps an SM
    # the floor counts the blocks actually resident: 1000 blocks fit in 16 x 132 slots at once
    floor2 = 1e9 * 800e-9 / (min(1000, 16 * 132) * 128 * 4) / 0.5
    assert k2.latency_floor_s == pytest.approx(floor2)
    assert k2.seconds == pytest.approx(floor2 + LAUNCH_OVERHEAD_S) and k2.bound == "latency"
    assert k2.seconds > 2 * (1e9 / 3.35e12)
    # the latency is an explicit assumption: halving it halves the floor
    assert latency_floor(h100, 1e9, lean, 16, memory_latency_s=400e-9) == pytest.approx(floor2 / 2)
    with pytest.raises(ScheduleError, match="does not fit"):
        predict_kernel(h100, mem, LaunchShape(blocks=1, threads=128, regs_per_thread=32, smem_bytes=10**6))


def test_codegen_prediction_goes_through_the_one_path(h200):
    """select builds the LaunchShape from the family's launch_estimate and predict_schedule does the
    rest: the same number as before this change for a row-wise kernel (no mma, no overlap
    question), and the same as calling the model with that shape by hand."""
    d = library.get("softmax").with_dtype("bf16").bind({"r": 32768, "x": 4096})
    fam = select._family("rowwise")
    sched = next(s for s in fam.candidates(d, h200, "bf16") if _threads_per_row(s) == 512)
    r = select.predict_schedule(d, fam, sched, h200)
    assert r.source == "cost" and r.seconds > 0
    est = fam.launch_estimate(d, sched, h200)
    shape = select.launch_shape(d, fam, sched, h200)
    assert (shape.blocks, shape.threads, shape.regs_per_thread, shape.smem_bytes) == \
        (est["blocks"], est["threads"], est["regs"], est["smem"])
    assert shape.tensor_path == "peak" and shape.overlap_compute is None
    by_hand = predict_schedule(sched, h200, the_cost=select.model_cost(sched, h200), launch=shape)
    assert by_hand.seconds == r.seconds


# ----------------------------------------------------------------------------- instruction path and overlap


def test_mma_sync_fraction_scales_the_tensor_term(h100, h200):
    w = Work(flops={"tensor": 1e12}, dtype="bf16")
    peak = predict(h200, w, launch_overhead_s=0)
    mma = predict(h200, w, launch_overhead_s=0, tensor_path="mma.sync")
    assert h200.mma_sync_fraction == pytest.approx(647 / 989.4, rel=1e-4)
    assert mma.seconds == pytest.approx(peak.seconds / h200.mma_sync_fraction)
    assert mma.tensor_path == "mma.sync" and "647" in h200.notes
    a100 = get_gpu("a100")  # mma.sync is Ampere's full tensor path
    assert predict(a100, w, tensor_path="mma.sync").seconds == predict(a100, w).seconds
    with pytest.raises(HardwareError):
        predict(h200, w, tensor_path="wgmma-ish")
    # a measured full-path rate (cuBLAS) replacing the datasheet one keeps the mma.sync ceiling
    cal = h200.with_overrides(tensor_bf16=791e12)
    assert cal.tensor_rate("bf16") * cal.mma_sync_fraction == pytest.approx(647e12, rel=1e-4)


def test_no_overlap_adds_the_terms_as_documented(h100):
    w = Work(flops={"tensor": 1e12, "sfu": 1e11, "cuda": 1e11}, bytes={"HBM": 1e8, "SMEM": 5e9}, dtype="bf16")
    base = predict(h100, w, launch_overhead_s=0)
    c, t = base.compute_s, base.transfer_s
    assert base.seconds == pytest.approx(max(max(c.values()), max(t.values())))
    serial = predict(h100, w, launch_overhead_s=0, efficiency=Efficiency(overlap_compute=False))
    assert serial.seconds == pytest.approx(max(sum(c.values()), max(t.values())))
    ops = predict(h100, w, launch_overhead_s=0, efficiency=Efficiency(overlap_compute=False, overlap_operands=False))
    assert ops.seconds == pytest.approx(sum(c.values()) + t["SMEM"])
    assert ops.memory_time_s == pytest.approx(t["HBM"])


def test_attention_and_contraction_kernels_say_how_they_issue_work(h200, monkeypatch):
    att = library.get("mha").with_dtype("bf16").bind({"h": 16, "q": 4096, "x": 4096, "d": 128})
    fam = select._family("attention")
    s = fam.candidates(att, h200, "bf16")[0]
    shape = select.launch_shape(att, fam, s, h200)
    assert (shape.tensor_path, shape.overlap_compute, shape.overlap_operands) == ("mma.sync", False, False)
    with_facts = select.predict_schedule(att, fam, s, h200).seconds
    c = select.model_cost(s, h200)
    p = predict_schedule(s, h200, the_cost=c, launch=shape)
    terms = p.kernels[0].roofline
    # FlashAttention-2 style: tensor (at the mma.sync rate) + CUDA cores + SFU + operand loads, then
    # the block's latency chain where the model has one
    expect = ((sum(terms.compute_s.values()) + terms.transfer_s["SMEM"]) * terms.wave_factor + LAUNCH_OVERHEAD_S
              + (getattr(terms, "latency_s", 0.0) or 0.0))
    assert with_facts == pytest.approx(expect)
    assert terms.compute_s["tensor"] == pytest.approx(float(c.flops["tensor"]) / (989.4e12 * h200.mma_sync_fraction))
    monkeypatch.setattr(select, "FAMILY_EXECUTION", {})
    without = select.predict_schedule(att, fam, s, h200).seconds
    assert with_facts > 1.5 * without  # overlapped, datasheet path: far more optimistic
    # an fp32 contraction on the FMA engine issues no mma.sync; on 3xTF32 it does
    mm = library.get("matmul").with_dtype("fp32").bind({"a": 512, "b": 512, "c": 512})
    cf = select._family("contraction")
    monkeypatch.undo()
    for s32 in cf.candidates(mm, h200, "fp32"):
        sh = select.launch_shape(mm, cf, s32, h200)
        assert sh.tensor_path == ("mma.sync" if s32.kernels[0].options.engine == "mma.sync" else "peak")


# ----------------------------------------------------------------------------- calibration: synthetic


def _samples(h200, meas_factors, family="contraction"):
    """Samples of one real small matmul schedule whose measured times are the model's time at
    the given factors: each point's own factor is then known exactly."""
    d = library.get("matmul").with_dtype("bf16").bind({"a": 1024, "b": 1024, "c": 1024})
    fam = select._family("contraction")
    # an mma.sync schedule: its tensor path runs at a fraction of the datasheet, so factors above 1
    # are reachable (a wgmma schedule is predicted at the datasheet rate already)
    sched = next(s for s in fam.candidates(d, h200, "bf16") if _engine(s) != "wgmma")
    out = []
    for i, f in enumerate(meas_factors):
        probe = C.Sample(f"p{i}", "matmul", family, "x", None, d, sched, "id", fam)
        meas = C.predict_sample(probe, h200, C.factor_dict(family, f))
        out.append(C.PointSamples({"id": f"p{i}"}, family, dataclasses.replace(probe, meas_s=meas)))
    return out


def test_point_factor_inverts_the_prediction(h200):
    pts = _samples(h200, [0.5, 0.8, 1.2])
    for ps, f in zip(pts, [0.5, 0.8, 1.2]):
        assert C.point_factor(ps.chosen, h200) == pytest.approx(f, rel=1e-6)
    cal = C._fit_from_samples(pts, h200)
    assert cal.factors == {"contraction": {"tensor": pytest.approx(0.8), "smem": pytest.approx(0.8)}}
    assert cal.n_points == {"contraction": 3}


def test_leave_one_out_uses_only_the_other_points(h200):
    """Four points at factor 0.5 and one outlier at 1.4. Fitted in-sample the outlier would pull
    the median; left out, each point is predicted with the median of the others, and the
    outlier's own measurement never reaches its prediction."""
    pts = _samples(h200, [0.5, 0.5, 0.5, 0.5, 1.4])
    cv = C.cross_validated_errors([], h200, prepared=pts)
    out = cv[-1]
    assert out.factor == pytest.approx(0.5) and out.own_factor == pytest.approx(1.4, rel=1e-6)
    assert out.pred_s == pytest.approx(C.predict_sample(pts[-1].chosen, h200, C.factor_dict("contraction", 0.5)))
    assert out.error > 0.5
    # the outlier's measurement changes: its prediction does not
    moved = [*pts[:-1], dataclasses.replace(pts[-1], chosen=dataclasses.replace(pts[-1].chosen,
                                                                                 meas_s=pts[-1].chosen.meas_s * 0.3))]
    assert C.cross_validated_errors([], h200, prepared=moved)[-1].pred_s == out.pred_s
    # the others are predicted from three 0.5s and the outlier: median 0.5 still, exactly
    assert all(r.factor == pytest.approx(0.5) and r.error == pytest.approx(0, abs=1e-6) for r in cv[:-1])
    # two points: each gets the other's factor, never the in-sample median
    two = _samples(h200, [0.5, 1.0])
    a, b = C.cross_validated_errors([], h200, prepared=two)
    assert a.factor == pytest.approx(1.0) and b.factor == pytest.approx(0.5)
    assert C._fit_from_samples(two, h200).factors["contraction"]["tensor"] == pytest.approx(0.75)
    # one point alone: nothing to fit on
    assert C.cross_validated_errors([], h200, prepared=_samples(h200, [0.7]))[0].pred_s is None


def test_fitted_profile_round_trips_and_applies_per_family(h200, tmp_path):
    base = C.base_profile(h200, {"copy_bandwidth": 4.2e12, "gemm_bf16_flops": 7.7e14, "date": "2026-01-01"})
    assert base.hbm_bandwidth == 4.2e12 and base.measured["copy_bandwidth"] == 4.2e12
    # measured as the model says on the profile fitted (the epilogue's store is priced at its HBM rate)
    pts = _samples(base, [0.6, 0.7, 0.8])
    cal = C._fit_from_samples(pts, base, "test")
    path = cal.save(tmp_path / "cal.json")
    g = get_gpu(str(path))
    assert g == cal.to_profile() and isinstance(g, GPU)
    assert g.efficiency == {"contraction": {"tensor": pytest.approx(0.7), "smem": pytest.approx(0.7)}}
    assert g.hbm_bandwidth == 4.2e12 and "median of 3 configurations" in g.notes and g.mma_sync_fraction == h200.mma_sync_fraction
    assert json.loads(path.read_text())["efficiency"]["contraction"]["tensor"] == pytest.approx(0.7)
    # codegen applies the factor to that family's kernels, and only to them
    s = pts[0].chosen
    assert C.predict_sample(s, g) == pytest.approx(C.predict_sample(s, base, C.factor_dict("contraction", 0.7)))
    other = dataclasses.replace(s, family="attention", codegen_family=None)
    assert C.predict_sample(other, g) != C.predict_sample(s, g)
    assert C.predict_sample(s, g) == pytest.approx(select.predict_schedule(s.diagram, "contraction", s.schedule,
                                                                             g).seconds)
    plain = select.predict_schedule(s.diagram, "contraction", s.schedule, base).seconds
    assert C.predict_sample(s, base) == plain and C.predict_sample(s, g) != plain
    # the factors fitted here put on another GPU's profile: only the efficiency changes
    moved = cal.transfer(get_gpu("h100"))
    assert moved.efficiency == g.efficiency and moved.hbm_bandwidth == get_gpu("h100").hbm_bandwidth
    # out-of-range factors are refused when loading
    bad = json.loads(path.read_text())
    bad["efficiency"]["contraction"]["tensor"] = 3.0
    with pytest.raises(HardwareError, match="efficiency"):
        GPU.from_json(json.dumps(bad))


def test_napkin_cost_loads_the_calibrated_profile(h200, tmp_path):
    from typer.testing import CliRunner

    from napkin.cli import app

    cal = C._fit_from_samples(_samples(h200, [0.6]), C.base_profile(h200, {"copy_bandwidth": 4.2e12}))
    path = cal.save(tmp_path / "cal.json")
    r = CliRunner().invoke(app, ["cost", "softmax", "-s", "r=4096", "-s", "x=4096", "--gpu", str(path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["predicted_seconds"] > 0


# ----------------------------------------------------------------------------- re-prediction


def test_parse_description():
    d = library.get("mha").with_dtype("bf16").bind({"h": 16, "q": 1024, "x": 1024, "d": 64})
    s = C.parse_description(d, "fused[q → g_q=128@SMEM, q → w_q=32@RF, x → s_x=32@SMEM]", "bf16")
    assert len(s.kernels) == 1 and s.kernels[0].name == "fused"
    assert [(r.axis, r.size, r.level, r.kind) for r in s.kernels[0].relabels] == \
        [("q", 128, "SMEM", "group"), ("q", 32, "RF", "group"), ("x", 32, "SMEM", "stream")]
    assert set(s.kernels[0].boxes) == {d.name_of(v) for v in d.nodes}
    from napkin.bench.autotune import describe_schedule

    assert describe_schedule(s) == "fused[q → g_q=128@SMEM, q → w_q=32@RF, x → s_x=32@SMEM]"
    rw = library.get("softmax").bind({"r": 64, "x": 64})
    assert C.parse_description(rw, "rowwise[r → g_r=8@SMEM, r → w_r=1@RF]").kernels[0].relabels[1].kind == "group"
    att = library.get("attention").bind({"q": 256, "x": 256, "d": 64})
    unf = Schedule.unfused(att)
    desc = "; ".join(f"{k.name}[]" for k in unf.kernels)
    assert [k.boxes for k in C.parse_description(att, desc).kernels] == [k.boxes for k in unf.kernels]
    for bad in ("fused", "fused[q = 128]", "fused[q → g_q=128@SMEM", "nope[]; fused[]", "fused[q → z_q=4@SMEM]"):
        with pytest.raises(C.CalibrationError):
            C.parse_description(d, bad)


def _record(point, chosen_desc, cands):
    rec = point.to_dict()
    rec["napkin_s"] = cands[0][1]
    rec["pred_s"] = 1.0
    rec["napkin"] = {"schedule": chosen_desc,
                     "tune": {"candidates": [{"rank": i, "desc": d, "pred_s": 1.0, "meas_s": m}
                                             for i, (d, m) in enumerate(cands)]}}
    return rec


def test_re_predict_parses_candidate_descriptions(h200):
    from napkin.bench.suite import Point

    pt = Point("matmul", "matmul", {"a": 1024, "b": 1024, "c": 1024}, "bf16", {"n": 1024})
    d = pt.bound_diagram()
    fam = select._family("contraction")
    cands = fam.candidates(d, h200, "bf16")[:3]
    from napkin.bench.autotune import describe_schedule

    descs = [describe_schedule(s) for s in cands]
    rec = _record(pt, descs[0], [(x, 1e-4 * (i + 1)) for i, x in enumerate(descs)])
    out = C.re_predict([rec], h200)[0]
    assert out["pred_source"] == "model" and out["pred_recorded_s"] == 1.0
    assert out["pred_s"] == pytest.approx(select.predict_schedule(d, fam, cands[0], h200).seconds)
    assert out["pred_err"] == pytest.approx(abs(out["pred_s"] - 1e-4) / 1e-4)
    for c, s in zip(out["napkin"]["tune"]["candidates"], cands):
        assert c["pred_source"] == "model" and c["pred_recorded_s"] == 1.0
        assert c["pred_s"] == pytest.approx(select.predict_schedule(d, fam, s, h200).seconds)
    assert rec["pred_s"] == 1.0  # the input is not modified
    # a description nothing can run, and a record without a schedule, keep their recorded values
    rec2 = _record(pt, descs[0], [(descs[0], 1e-4), ("fused[a → g_a=zz@SMEM]", 2e-4)])
    del rec2["napkin"]["schedule"]
    out2 = C.re_predict([rec2], h200)[0]
    assert out2["pred_s"] == 1.0 and out2["pred_source"].startswith("recorded")
    assert out2["napkin"]["tune"]["candidates"][1]["pred_source"].startswith("recorded: CalibrationError")


def test_rowwise_descriptions_old_and_new(h200):
    """Row-wise candidates differ only in threads per row. Recorded before kernels had typed
    options, their descriptions are equal and only the (legacy) id tells them apart; described
    now, the options are in the description. Both resolve, whether the family's candidates are
    typed (now) or carry notes (before)."""
    from napkin.bench.autotune import (describe_schedule, is_typed, legacy_description, legacy_schedule,
                                       legacy_schedule_id, schedule_id)

    d = library.get("softmax").with_dtype("bf16").bind({"r": 32768, "x": 4096})
    fam = select._family("rowwise")
    cands = fam.candidates(d, h200, "bf16")
    old = [legacy_schedule(s) for s in cands]          # the family as it was: notes, no options
    assert not any(is_typed(s) for s in old) and all(s.notes for s in old)
    desc = legacy_description(cands[1])
    assert desc == describe_schedule(old[1]) and "(" not in desc
    assert sum(legacy_description(s) == desc for s in cands) > 1  # only the notes told them apart
    for pool in (cands, old):
        with pytest.raises(C.CalibrationError, match="no id matches"):
            C.schedule_of(d, fam, desc, None, h200, "bf16", pool)
    # an old record (old description, old id) against the old family and against today's
    assert schedule_id(old[1]) == legacy_schedule_id(cands[1])
    s, how = C.schedule_of(d, fam, desc, schedule_id(old[1]), h200, "bf16", old)
    assert how == "id" and s is old[1]
    s, how = C.schedule_of(d, fam, desc, legacy_schedule_id(cands[1]), h200, "bf16", cands)
    assert how == "id" and s is cands[1]
    typed = [s for s in cands if is_typed(s)]
    if typed:  # today's family: every description differs, and parses back to its options
        assert len({describe_schedule(s) for s in typed}) == len(typed)
        new_desc = describe_schedule(cands[1])
        assert "threads_per_row=" in new_desc
        s, how = C.schedule_of(d, fam, new_desc, None, h200, "bf16", cands)
        assert how == "desc" and s is cands[1]
        s, how = C.schedule_of(d, fam, new_desc, schedule_id(cands[1]), h200, "bf16", cands)
        assert how == "id" and s is cands[1]
        parsed = C.parse_description(d, new_desc, "bf16")
        assert parsed.kernels[0].options == cands[1].kernels[0].options
        assert parsed.kernels[0].family == cands[1].kernels[0].family == "rowwise"
        assert describe_schedule(parsed) == new_desc
        # a recorded id that names another candidate than the description is refused
        with pytest.raises(C.CalibrationError, match="not"):
            C.schedule_of(d, fam, new_desc, schedule_id(cands[2]), h200, "bf16", cands)


def test_parse_description_with_options():
    d = library.get("matmul").with_dtype("bf16").bind({"a": 1024, "b": 1024, "c": 1024})
    desc = "fused[a → g_a=128@SMEM, c → g_c=128@SMEM, b → s_b=64@SMEM](family=contraction, engine=wgmma, stages=4)"
    s = C.parse_description(d, desc)
    k = s.kernels[0]
    assert k.family == "contraction" and k.options.to_dict() == {"engine": "wgmma", "stages": 4}
    from napkin.bench.autotune import describe_schedule

    assert describe_schedule(s) == desc
    named = C.parse_description(d, "contraction[a → g_a=128@SMEM](engine=mma.sync, warps=8)")
    assert named.kernels[0].family == "contraction" and named.kernels[0].options.warps == 8
    # a flag of KernelOptions (persistent blocks) reads back as a bool
    att = library.get("mha").with_dtype("bf16").bind(h=16, q=1024, x=1024, d=64)
    flagged = C.parse_description(att, "fused[q → g_q=128@SMEM, x → s_x=128@SMEM](family=attention, engine=wgmma, "
                                       "stages=3, persistent=True)")
    assert flagged.kernels[0].options.persistent is True
    for bad in ("fused[a → g_a=128@SMEM](engine=tpu)", "fused[a → g_a=128@SMEM](stages=four)",
                "fused[a → g_a=128@SMEM](colour=red)", "fused[a → g_a=128@SMEM](stages)",
                "fused[a → g_a=128@SMEM](persistent=yes)"):
        with pytest.raises(C.CalibrationError):
            C.parse_description(d, bad)


@pytest.mark.parametrize("folder", [H200_RESULTS, H100_RESULTS], ids=["h200", "h100"])
def test_committed_results_are_re_predicted_and_cross_validated(folder):
    if not (folder / "attention.json").exists():
        pytest.skip(f"no committed results in {folder}")
    from napkin.bench.report import load_results, model_accuracy

    device, points = load_results(folder)
    check = C.evaluate(points, device)
    # a plan of several kernels is no family's sample: every other point is re-predicted
    single = [p for p in points if len((p.get("napkin") or {}).get("kernels") or []) <= 1]
    assert len(single) < len(points)
    assert check.n_repredicted == check.n_points == len(single) and not check.problems
    assert check.n_candidates_repredicted == check.n_candidates > 100
    # every recorded schedule found by its recorded id (ids written before kernels had typed options)
    # (a composed point runs the planner's kernel, which the planner names after its output, so its
    # id differs from the family candidate's and it is found by its description)
    assert all(ps.chosen.how == "id" for ps in check.samples if not ps.chosen.point_id.startswith("composed/"))
    assert all(ps.chosen.how == "desc" for ps in check.samples if ps.chosen.point_id.startswith("composed/"))
    assert all(s.how == "id" for ps in check.samples for _, s, _ in ps.candidates)
    acc = model_accuracy(check.points, check.cv)
    for fam in ("attention", "matmul", "mlp", "rowwise"):
        a = acc[fam]
        assert a["n_repredicted"] == a["n_points"] and a["median_err_cv"] is not None
        assert math.isfinite(a["median_err"]) and a["spearman"] is not None
    assert set(check.calibration.factors) == {"attention", "contraction", "rowwise", "pointwise"}
    assert check.profile.hbm_bandwidth == pytest.approx(device["copy_bandwidth"])
    # the re-prediction is codegen's own number for the resolved schedule
    ps = check.samples[0]
    rec = next(p for p in check.points if p["id"] == ps.record["id"])
    assert rec["pred_s"] == select.predict_schedule(ps.diagram, ps.codegen_family, ps.chosen.schedule,
                                                    check.datasheet).seconds
