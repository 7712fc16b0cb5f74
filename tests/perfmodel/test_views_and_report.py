"""Scheduled views (colours, pseudocode), runtime prediction of a schedule, and the cost report."""

import json

import pytest

from napkin.diagrams import library
from napkin.errors import ScheduleError
from napkin.perfmodel.predict import LaunchAssumptions, predict_schedule
from napkin.perfmodel.report import cost_report, format_cost_report, parse_relabel, parse_relabels
from napkin.perfmodel.schedule import Schedule
from napkin.perfmodel.view import level_colors, pseudocode, relabel_labels, scheduled_svg

ATT = library.get("attention").bind(q=1024, x=1024, d=64)


def test_level_colours_follow_the_schedule():
    fused = Schedule.fused(ATT, groups={"q": 128}, streams={"x": 64})
    colors = level_colors(fused)
    assert colors["Q"] == "SMEM" and colors["S"] == "RF" and colors["P"] == "RF"
    unfused = level_colors(Schedule.unfused(ATT))
    assert unfused["S_scaled"] == "HBM" and unfused["P"] == "HBM"


def test_scheduled_svg_shows_relabels_and_legend():
    s = Schedule.fused(ATT, groups={"q": 128}, streams={"x": 64})
    assert relabel_labels(s) == {"q": "g_q=128", "x": "s_x=64"}
    svg = scheduled_svg(s)
    assert "g_q=128" in svg and "s_x=64" in svg and "SMEM" in svg and "RF" in svg


def test_pseudocode_has_init_loop_finalize_and_memory():
    text = pseudocode(Schedule.fused(ATT, groups={"q": 128}, streams={"x": 64}))
    assert "load Q[g_q,d] HBM → SMEM" in text
    assert "for each chunk of x (s_x = 64):" in text
    assert "online" in text and "finalize" in text and "store O[g_q,d] → HBM" in text
    # Q (128×64) + K, V chunks (64×64 each) in bf16 = 32 KiB at the first box, plus O's accumulator.
    assert "SMEM 48.0 KiB" in text


def test_prediction_sums_kernels_and_respects_registers():
    fused = predict_schedule(Schedule.fused(ATT, groups={"q": 64}, streams={"x": 64}), "h100")
    unfused = predict_schedule(Schedule.fused(ATT, groups={"q": 64}, streams={"x": 64}), "h100",
                               assume=LaunchAssumptions(threads_per_block=256))
    assert fused.seconds > 0 and unfused.seconds > 0
    assert fused.kernels[0].blocks == 1024 // 64
    with pytest.raises(ScheduleError, match="registers"):
        big = library.get("attention").bind(q=4096, x=4096, d=256)
        predict_schedule(Schedule.fused(big, groups={"q": 256}, streams={"x": 256}), "h100",
                         assume=LaunchAssumptions(max_threads_per_block=128))


def test_parse_relabel():
    assert parse_relabel("q=64@rf", "group") == ("q", (64, "RF", "group"))
    assert parse_relabels(["q=128"], ["x=64"]) == {"q": (128, "SMEM", "group"), "x": (64, "SMEM", "stream")}
    for bad in ("q", "q=abc", "q=0", "q=4@XYZ"):
        with pytest.raises(ScheduleError):
            parse_relabel(bad, "group")
    with pytest.raises(ScheduleError, match="twice"):
        parse_relabels(["q=64"], ["q=32"])


def test_cost_report_json_interface():
    from napkin.codegen.planner import derive

    plan = derive(library.get("mha").bind(h=2, q=4096, x=4096, d=128), "h100", "bf16",
                  fixed={"q": (128, "SMEM", "group"), "x": (64, "SMEM", "stream")}, explain=False).plan
    rep = cost_report(plan, symbolic=True)
    data = json.loads(json.dumps(rep))
    assert set(data["levels"]) == {"HBM", "L2", "SMEM", "RF", "TC"}
    for lv in data["levels"].values():
        assert {"H_elements", "H_bytes", "M_bytes"} <= set(lv)
    # The closed form at the block boundary: H = h(2qd + 2xdq/g_q).
    assert data["levels"]["L2"]["H_elements"] == 2 * (2 * 4096 * 128 + 2 * 4096 * 128 * 4096 // 128)
    assert data["levels"]["SMEM"]["M_bytes"] >= 2 * 128 * (128 + 64) * 2
    assert data["flops"] > 2 * 4 * 4096 * 4096 * 128
    # the predicted time is the plan's: the one prediction function's, which derive prints
    assert data["predicted_seconds"] == plan.seconds and data["plan"] == plan.to_dict()
    assert "g_q" in data["symbolic"]["H_L2"]
    assert "predicted" in format_cost_report(rep)


def test_cost_report_rejects_unknown_axis():
    from napkin.codegen.planner import derive

    with pytest.raises(ScheduleError, match="no axis 'z'"):
        derive(ATT, "h100", "bf16", fixed={"z": (64, "SMEM", "group")})




def test_cost_report_of_a_long_plan_says_why_it_has_no_symbols():
    from napkin.codegen.planner import derive

    plan = derive(library.get("transformer_block").bind(q=512, e=256, h=2, d=64, f=512), "h100", "bf16",
                  explain=False).plan
    rep = cost_report(plan, symbolic=True)
    assert len(plan.kernels) > 4 and "note" in rep["symbolic"] and "H_L2" not in rep["symbolic"]
    assert "None" not in format_cost_report(rep)
