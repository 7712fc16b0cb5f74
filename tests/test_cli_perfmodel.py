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
        for word in ("1. naive", "4. stream", "why:", "for each chunk of x"):
            assert word in r.output
        assert "<svg" in out.read_text()
    finally:
        out.unlink(missing_ok=True)


def test_derive_json():
    r = run("derive", "matmul", "-s", "a=1024", "-s", "b=1024", "-s", "c=1024", "--json", "--top", "3")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["ranked"]) <= 3 and data["best"]["predicted_seconds"] > 0


@pytest.mark.parametrize("args, words", [
    (["cost", *ATT, "--group", "d=64"], "contracts over d"),
    (["cost", *ATT, "--group", "q=99999"], "exceeds axis"),
    (["cost", *ATT, "--group", "q=4096", "--stream", "x=4096"], "shared memory"),
    (["cost", "softmax", "--stream", "x=64"], "whole row"),
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
