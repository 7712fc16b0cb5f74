"""derive: the plan narrated as the Napkin method (naive → fuse → group → stream), its printout,
its JSON form and pinned tiles."""

import json

import pytest
import sympy

from napkin.codegen.planner import derive
from napkin.diagrams import library
from napkin.diagrams.axes import size_symbol
from napkin.errors import NapkinError, ScheduleError
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.schedule import Schedule, tile_symbol

q, x, d, h = (size_symbol(n) for n in "qxdh")
g_q, s_x = tile_symbol("g_q"), tile_symbol("s_x")

MHA = {"h": 16, "q": 4096, "x": 4096, "d": 128}


@pytest.fixture(scope="module")
def mha_derivation():
    return derive(library.get("mha"), "h100", sizes=MHA)


def test_steps_follow_the_method_and_reproduce_the_closed_forms(mha_derivation):
    steps = {s.title: s for s in mha_derivation.steps}
    assert list(steps) == ["naive", "fuse", "group", "stream"]
    assert sympy.simplify(steps["naive"].H - h * (2 * q * d + 2 * x * d + 4 * q * x)) == 0
    assert sympy.simplify(steps["fuse"].H - h * (2 * q * d + 2 * x * d)) == 0
    assert sympy.simplify(steps["group"].H - h * (2 * q * d + 2 * x * d * q / g_q)) == 0
    assert sympy.simplify(steps["stream"].M - 2 * d * (g_q + s_x)) == 0


def test_fusion_removes_the_4qx_term_numerically(mha_derivation):
    naive, fused = mha_derivation.steps[0].cost, mha_derivation.steps[1].cost
    assert int(naive.H("HBM")) - int(fused.H("HBM")) == 16 * 4 * 4096 * 4096


def test_the_plan_groups_q_streams_x_and_fits(mha_derivation):
    (k,) = mha_derivation.plan.kernels
    rel = {r.axis: r for r in k.kernel.relabels if r.level == "SMEM"}
    assert rel["q"].kind == "group" and rel["x"].kind == "stream"
    assert k.family == "attention"
    assert float(mha_derivation.steps[-1].cost.M_bytes("SMEM")) <= get_gpu("h100").level("SMEM").per_block_bytes
    times = [o.seconds for o in mha_derivation.alternatives]
    assert times == sorted(times) and times[0] == pytest.approx(k.seconds)
    assert mha_derivation.steps[-1].seconds == pytest.approx(mha_derivation.plan.seconds)


def test_printout_names_each_step_the_plan_and_the_thresholds(mha_derivation):
    text = str(mha_derivation)
    for word in ("1. naive", "2. fuse", "3. group", "4. stream", "plan of mha", "fused S+", "590.7", "295"):
        assert word in text
    assert "3.73 by SMEM, 3.42 by registers" in text and "g_q = 384" in text  # Hopper analysis (§4.4)


def test_json_form_is_plain_data(mha_derivation):
    data = json.loads(json.dumps(mha_derivation.to_dict()))
    assert data["plan"]["predicted_seconds"] > 0
    (k,) = data["plan"]["kernels"]
    assert k["family"] == "attention" and {"g_q", "s_x"} <= {t["symbol"] for t in k["tiles"]}
    assert k["options"]["engine"] == "wgmma"  # an H100: the Hopper template, which the model ranks first
    assert [s["title"] for s in data["steps"]] == ["naive", "fuse", "group", "stream"]


def test_pinned_tiling_is_kept():
    der = derive(library.get("mha"), "h100", sizes=MHA, fixed={"q": (64, "SMEM", "group")})
    rel = {r.axis: r.size for r in der.best.kernels[0].relabels if r.level == "SMEM"}
    assert rel["q"] == 64


@pytest.mark.parametrize("fixed", [{"d": (64, "SMEM", "group")}, {"q": (5000, "SMEM", "group")},
                                   {"q": (100, "SMEM", "group")}])
def test_a_pinned_tiling_no_family_builds_is_refused_naming_what_they_build(fixed):
    with pytest.raises(ScheduleError, match="pinned tiles.*it builds"):
        derive(library.get("mha"), "h100", sizes=MHA, fixed=fixed)


def test_a_lone_softmax_cannot_stream():
    with pytest.raises(ScheduleError, match="no kernel that runs box 'P'"):
        derive(library.get("softmax"), "h100", sizes={"r": 1024, "x": 4096}, fixed={"x": (64, "SMEM", "stream")})


def test_matmul_groups_a_and_c_and_streams_b():
    der = derive(library.get("matmul"), "h100", sizes={"a": 4096, "b": 4096, "c": 4096})
    kinds = {r.axis: r.kind for r in der.best.kernels[0].relabels if r.level == "SMEM"}
    assert kinds == {"a": "group", "c": "group", "b": "stream"}
    assert der.plan.kernels[0].bound == "tensor"


def test_flashattention_falls_out_of_the_transformer_block():
    block = library.get("transformer_block").bind(q=512, e=256, h=2, d=64, f=512)
    der = derive(block, "h100")
    attn = [k for k in der.plan.kernels if {"S", "P", "O"} <= set(k.boxes)]
    assert len(attn) == 1, [k.boxes for k in der.plan.kernels]
    assert attn[0].family == "attention"
    rel = {r.axis: r.kind for r in attn[0].kernel.relabels if r.level == "SMEM"}
    assert rel.get("x") == "stream" and rel.get("q") == "group"
    assert len(der.plan.kernels) < len(Schedule.unfused(block).kernels)


def test_needs_sizes():
    with pytest.raises(NapkinError, match="no size"):
        derive(library.get("attention"), "h100")


@pytest.mark.parametrize("name", library.names())
def test_every_library_diagram_derives(name):
    small = {"q": 256, "x": 256, "d": 64, "h": 2, "j": 2, "a": 256, "b": 256, "c": 256, "n": 2, "r": 64,
             "e": 128, "f": 256, "g": 4, "s": 64}
    dgm = library.get(name)
    sizes = {k: v for k, v in small.items() if k in {a for i in dgm.inputs for a in i.axis_names}}
    der = derive(dgm, "h100", sizes=sizes)
    assert der.plan.seconds > 0 and len(der.steps) == 4
    assert isinstance(der.best, Schedule)
