"""The cost and derive commands: tables, the stable --json interface, and exit status 2 on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from napkin.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
ATT = ["attention", "-s", "q=4096", "-s", "x=4096", "-s", "d=128"]


def run(*args):
    return runner.invoke(app, list(args))


def test_cost_table_and_symbolic():
    r = run("cost", *ATT, "--gpu", "h100", "--dtype", "bf16", "--group", "q=128", "--stream", "x=64", "--symbolic")
    assert r.exit_code == 0, r.output
    for word in ("HBM", "L2", "SMEM", "RF", "predicted", "2*d*q + 2*d*q*x/g_q", "2*d*g_q + 2*d*s_x"):
        assert word in r.output


def test_cost_json_is_stable():
    r = run("cost", *ATT, "--group", "q=128", "--stream", "x=64", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data["levels"]) == {"HBM", "L2", "SMEM", "RF", "TC"}
    assert all({"H_elements", "H_bytes", "M_bytes"} <= set(v) for v in data["levels"].values())
    assert data["flops"] > 0 and data["predicted_seconds"] > 0


def test_cost_group_at_rf_level():
    r = run("cost", *ATT, "--group", "q=128", "--group", "h=1", "--stream", "x=64", "--json")
    assert r.exit_code == 2  # attention has no axis h
    assert "no axis 'h'" in r.output


def test_derive_prints_the_method_and_draws():
    out = ROOT / "tests" / "_derive_out.svg"
    try:
        r = run("derive", *ATT, "--pseudocode", "--svg", str(out))
        assert r.exit_code == 0, r.output
        for word in ("1. naive", "2. fuse", "3. group", "4. stream", "plan of attention on h100",
                     "fusion:", "alternatives for the costliest kernel", "for each chunk of x"):
            assert word in r.output, word
        assert "<svg" in out.read_text()
    finally:
        out.unlink(missing_ok=True)


def test_derive_json():
    r = run("derive", "matmul", "-s", "a=1024", "-s", "b=1024", "-s", "c=1024", "--json", "--top", "3")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data) == {"plan", "steps", "decisions", "alternatives", "thresholds", "hardware_notes"}
    assert "ranked" not in data and "best" not in data and "why" not in data
    plan = data["plan"]
    assert plan["diagram"] == "matmul" and plan["sizes"] == {"a": 1024, "b": 1024, "c": 1024}
    assert plan["predicted_seconds"] > 0
    (k,) = plan["kernels"]
    assert k["family"] == "contraction" and k["boxes"] == ["C"] and k["predicted_seconds"] > 0
    assert {t["axis"] for t in k["tiles"]} == {"a", "b", "c"} and k["options"]["engine"] in ("wgmma", "mma.sync")
    assert 1 <= len(data["alternatives"]) <= 3
    assert all(a["predicted_seconds"] >= k["predicted_seconds"] for a in data["alternatives"])
    assert [s["title"] for s in data["steps"]] == ["naive", "fuse", "group", "stream"]


def test_derive_json_plan_reads_back_and_matches_generate(tmp_path):
    from napkin.diagrams import library
    from napkin.perfmodel.plan import Plan

    sizes = ["-s", "a=512", "-s", "b=256", "-s", "c=384"]
    r = run("derive", "mlp", *sizes, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["plan"]
    d = library.get("mlp").bind(a=512, b=256, c=384)
    back = Plan.from_dict(d, plan)
    assert back.to_dict()["kernels"] == plan["kernels"]
    g = run("generate", "mlp", *sizes, "-o", str(tmp_path / "mlp.cu"), "--json")
    assert g.exit_code == 0, g.output
    gen = json.loads(g.stdout)
    assert set(gen) == {"plan", "output", "launches", "buffers"}
    assert gen["plan"]["kernels"] == plan["kernels"]  # derive and generate share the plan


NO_KERNEL = "derive found no kernel that runs box {!r} of {!r} with the pinned tiling"


@pytest.mark.parametrize("args, fragments", [
    (["cost", *ATT, "--group", "d=64"],
     [NO_KERNEL.format("S", "attention"),
      "contraction: none of its configurations has the pinned tiles (group d=64@SMEM); it builds g_q="]),
    (["cost", *ATT, "--group", "q=99999"],
     [NO_KERNEL.format("S", "attention"), "none of its configurations has the pinned tiles (group q=99999@SMEM)"]),
    (["cost", *ATT, "--group", "q=4096", "--stream", "x=4096"],
     [NO_KERNEL.format("S", "attention"),
      "none of its configurations has the pinned tiles (group q=4096@SMEM, stream x=4096@SMEM)"]),
    (["cost", "softmax", "--stream", "x=64"],
     [NO_KERNEL.format("P", "softmax"),
      "rowwise: none of its configurations has the pinned tiles (stream x=64@SMEM); it builds g_r="]),
    (["derive", *ATT, "--group", "q=99999"],
     [NO_KERNEL.format("S", "attention"), "(group q=99999@SMEM)"]),
])
def test_pinned_tiles_no_family_builds_exit_2_with_one_line(args, fragments):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    for f in fragments:
        assert f in line, (f, line)


def test_pinned_tiles_a_family_builds_are_the_plan():
    r = run("cost", *ATT, "--group", "q=128", "--stream", "x=64", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    # every kernel that carries q and x must group q by 128 and stream x by 64: the one kernel that
    # can is the fused attention (the score contraction would group x, not stream it)
    (k,) = data["plan"]["kernels"]
    assert k["family"] == "attention" and k["boxes"][-1] == "O"
    tiles = {(t["axis"], t["kind"], t["level"], t["size"]) for t in k["tiles"]}
    assert {("q", "group", "SMEM", 128), ("x", "stream", "SMEM", 64)} <= tiles, tiles
    assert "O" in data["schedule_text"]


@pytest.mark.parametrize("args, words", [
    (["cost", *ATT, "--gpu", "h900"], "unknown GPU"),
    (["cost", *ATT, "--dtype", "fp5"], "unknown dtype"),
    (["cost", *ATT, "--group", "q=12x"], "not an integer"),
    (["derive", *ATT, "--stream", "x=64@XYZ"], "unknown level"),
])
def test_bad_input_exits_2_with_one_line(args, words):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_subprocess_exit_code():
    p = subprocess.run([sys.executable, "-m", "napkin", "cost", "attention", "--group", "d=64"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr
