"""derive: the Napkin method as a search (naive → fuse → group → stream), its printout and refusals."""

import pytest
import sympy

from napkin.diagrams import library
from napkin.diagrams.axes import size_symbol
from napkin.errors import ScheduleError
from napkin.perfmodel.derive import derive, kernel_subdiagram, start_partition
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.schedule import Schedule, tile_symbol

q, x, d, h = (size_symbol(n) for n in "qxdh")
g_q, s_x = tile_symbol("g_q"), tile_symbol("s_x")

ATTN = {"q": 4096, "x": 4096, "d": 128}


@pytest.fixture(scope="module")
def attention_derivation():
    return derive(library.get("attention"), "h100", sizes=ATTN)


def test_steps_follow_the_method_and_reproduce_the_closed_forms(attention_derivation):
    steps = {s.title: s for s in attention_derivation.steps}
    assert list(steps) == ["naive", "fuse", "group", "stream"]
    assert sympy.simplify(steps["naive"].H - (2 * q * d + 2 * x * d + 4 * q * x)) == 0
    assert sympy.simplify(steps["fuse"].H - (2 * q * d + 2 * x * d)) == 0
    assert sympy.simplify(steps["group"].H - (2 * q * d + 2 * x * d * q / g_q)) == 0
    assert sympy.simplify(steps["stream"].M - 2 * d * (g_q + s_x)) == 0


def test_fusion_removes_the_4qx_term_numerically(attention_derivation):
    naive, fused = attention_derivation.steps[0].candidate.cost, attention_derivation.steps[1].candidate.cost
    assert int(naive.H("HBM")) - int(fused.H("HBM")) == 4 * 4096 * 4096


def test_winner_groups_q_streams_x_and_fits(attention_derivation):
    best = attention_derivation.best_candidate
    rel = {r.axis: r for r in best.schedule.kernels[0].relabels}
    assert rel["q"].kind == "group" and rel["x"].kind == "stream"
    assert float(best.cost.M_bytes("SMEM")) <= get_gpu("h100").level("SMEM").per_block_bytes
    times = [c.seconds for c in attention_derivation.ranked]
    assert times == sorted(times)


def test_printout_names_each_step_and_the_thresholds(attention_derivation):
    text = str(attention_derivation)
    for word in ("1. naive", "2. fuse", "3. group", "4. stream", "why:", "590.7", "295", "681"):
        assert word in text
    assert "3.73 by SMEM, 3.42 by registers" in text and "g_q = 384" in text  # Hopper analysis (§4.4)


def test_json_form_is_plain_data(attention_derivation):
    import json

    data = json.loads(json.dumps(attention_derivation.to_dict()))
    assert data["best"]["predicted_seconds"] > 0
    assert {r["symbol"] for r in data["best"]["schedule"]["kernels"][0]["relabels"]} == {"g_q", "s_x"}


def test_pinned_relabelling_is_kept():
    der = derive(library.get("attention"), "h100", sizes=ATTN, fixed={"q": (64, "SMEM", "group")})
    rel = {r.axis: r.size for r in der.best.kernels[0].relabels}
    assert rel["q"] == 64


@pytest.mark.parametrize("fixed, words", [
    ({"d": (64, "SMEM", "group")}, "contracts over d"),
    ({"q": (5000, "SMEM", "group")}, "exceeds axis"),
    ({"q": (4096, "SMEM", "group"), "x": (4096, "SMEM", "stream")}, "shared memory"),
    ({"q": (100, "SMEM", "group")}, "multiple of 16"),
])
def test_illegal_pinned_relabellings_are_refused_with_the_reason(fixed, words):
    with pytest.raises(ScheduleError, match=words):
        derive(library.get("attention"), "h100", sizes=ATTN, fixed=fixed)


def test_lone_softmax_stream_is_refused():
    with pytest.raises(ScheduleError, match="softmax over x needs the whole row"):
        derive(library.get("softmax"), "h100", sizes={"r": 1024, "x": 4096}, fixed={"x": (64, "SMEM", "stream")})


def test_matmul_groups_a_and_c_and_streams_b():
    der = derive(library.get("matmul"), "h100", sizes={"a": 4096, "b": 4096, "c": 4096})
    kinds = {r.axis: r.kind for r in der.best.kernels[0].relabels}
    assert kinds == {"a": "group", "c": "group", "b": "stream"}
    assert der.best_candidate.prediction.bound == "tensor"


def test_flashattention_falls_out_of_the_transformer_block():
    block = library.get("transformer_block").bind(q=512, e=256, h=2, d=64, f=512)
    der = derive(block, "h100")
    kernels = der.best.kernels
    attn = [k for k in kernels if {"S", "P", "O"} <= set(k.boxes)]
    assert len(attn) == 1, [k.boxes for k in kernels]
    rel = {r.axis: r.kind for r in attn[0].relabels}
    assert rel.get("x") == "stream" and rel.get("q") == "group"
    assert len(kernels) < len(start_partition(block, "h100", "bf16").kernels)


def test_kernel_subdiagram_keeps_the_kernel_interface():
    dgm = library.get("transformer_block").bind(q=64, e=32, h=2, d=16, f=64)
    sub = kernel_subdiagram(dgm, ("K", "S", "S_scaled", "S_masked", "P", "V", "O"))
    assert set(sub.input_names) == {"Qp", "Kp", "Vp"}
    assert sub.output_names == ("O",)


def test_needs_sizes():
    from napkin.errors import NapkinError

    with pytest.raises(NapkinError, match="needs a size"):
        derive(library.get("attention"), "h100")


@pytest.mark.parametrize("name", library.names())
def test_every_library_diagram_derives(name):
    small = {"q": 256, "x": 256, "d": 64, "h": 2, "j": 2, "a": 256, "b": 256, "c": 256, "n": 2, "r": 64,
             "e": 128, "f": 256}
    dgm = library.get(name)
    sizes = {k: v for k, v in small.items() if k in {a for i in dgm.inputs for a in i.axis_names}}
    der = derive(dgm, "h100", sizes=sizes)
    assert der.best_candidate.prediction.seconds > 0
    assert isinstance(der.best, Schedule)
