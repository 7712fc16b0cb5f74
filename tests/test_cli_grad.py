"""`napkin show/derive/generate --grad`: the backward diagram on the command line (no GPU)."""

from __future__ import annotations

import json

from napkin_test_support import cli_invoke


def test_show_grad_prints_the_backward_diagram():
    code, out, err = cli_invoke("show", "attention", "--grad")
    assert code == 0, err
    assert "attention_grad" in out and "dO[q,d]" in out and "dQ[q,d]" in out and "dV[x,d]" in out
    assert "sizes are symbolic" in out  # nothing saved without sizes
    code, out, err = cli_invoke("show", "attention", "-s", "q=4096", "-s", "x=4096", "-s", "d=128", "--grad")
    assert code == 0, err
    assert "P_lse" in out and "save or recompute" in out and "recompute: recomputed as exp(S − lse)" in out


def test_show_grad_json_carries_the_saves():
    code, out, err = cli_invoke("show", "softmax", "-s", "r=4096", "-s", "x=4096", "--grad", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["name"] == "softmax_grad" and [i["name"] for i in data["inputs"]] == ["X", "dP", "P"]
    assert data["saves"]["save"] == ["P"] and [o["name"] for o in data["outputs"]] == ["dX"]
    code, out, _ = cli_invoke("show", "softmax", "--json")
    assert "saves" not in json.loads(out)  # without --grad the JSON is as it was


def test_derive_grad_plans_the_backward():
    code, out, err = cli_invoke("derive", "rmsnorm", "-s", "r=1024", "-s", "x=1024", "--grad", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["plan"]["diagram"] == "rmsnorm_grad"
    assert "N_rstd" in data["saves"]["save"]
    boxes = [b for k in data["plan"]["kernels"] for b in k["boxes"]]
    assert "dX" in boxes and "dgamma" in boxes
    code, out, err = cli_invoke("derive", "matmul", "-s", "a=256", "-s", "b=256", "-s", "c=256", "--grad")
    assert code == 0, err
    assert "reads nothing from the forward" in out and "dA" in out and "dB" in out


def test_generate_grad_writes_the_backward_kernels(tmp_path):
    target = tmp_path / "b.cu"
    code, out, err = cli_invoke("generate", "softmax", "-s", "r=512", "-s", "x=512", "--grad", "-o", str(target))
    assert code == 0, err
    text = target.read_text()
    assert "softmax_grad" in text and "__global__" in text
    assert "save or recompute" in out


def test_grad_of_a_bad_name_is_one_error_line():
    code, out, err = cli_invoke("show", "no_such_diagram", "--grad")
    assert code == 2 and "unknown diagram" in err and "Traceback" not in err
