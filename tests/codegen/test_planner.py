"""The one planner: what derive derives is what generate builds and compile runs.

- derive = generate for every library diagram (through the CLI's JSON), every example diagram and
  random diagrams (through the API);
- the plan is built as it is: every launch comes from the family its kernel names, with the
  kernel's tiles and options;
- partitions: a fusion is taken only where the model predicts it faster; refusals say why;
- the scalar fallback is the last resort, one box per kernel, and said aloud;
- the plan is a value: printed, serialised and read back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from napkin.cli import app
from napkin.codegen import families
from napkin.codegen.generate import generate_program
from napkin.codegen.lower import build, lower
from napkin.codegen.planner import MAX_FUSED_BOXES, _Planner, derive, plan_schedule
from napkin.codegen.prepare import prepare
from napkin.codegen.select import predict_schedule, resolve_gpu
from napkin.diagrams import Diagram, array, axes, contract, library, softmax
from napkin.diagrams.userfile import load_diagram
from napkin.errors import ScheduleError
from napkin.perfmodel.plan import FALLBACK, Plan
from napkin.perfmodel.schedule import Schedule

from test_random_kernels import dtype_of, examples  # noqa: E402  (tests/codegen is not a package)

ROOT = Path(__file__).resolve().parents[2]
GPUS = ("h100", "h200", "a100-80gb")


def _cli_json(*args) -> dict:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# ----------------------------------------------------------------------------- derive = generate


@pytest.mark.parametrize("name", library.names())
def test_cli_derive_and_generate_print_the_same_plan(name, tmp_path):
    d = _cli_json("derive", name, "--gpu", "h100", "--json")
    g = _cli_json("generate", name, "--gpu", "h100", "--json", "-o", str(tmp_path / "k.cu"))
    assert d["plan"] == g["plan"]
    assert [k["family"] for k in d["plan"]["kernels"]]
    assert all(k["family"] in families.names() for k in d["plan"]["kernels"])
    header = (tmp_path / "k.cu").read_text().split("\n\n", 1)[0]
    for k in d["plan"]["kernels"]:
        assert f"kernel {k['name']} [{k['family']}]" in header


def _example_diagrams():
    out = []
    for spec in ("swiglu", "linear_attention"):
        d = load_diagram(f"{ROOT / 'examples' / 'my_diagram.py'}:{spec}")
        out.append(d.bind({n: 96 + 16 * i for i, n in enumerate(d.axes) if not d.axes[n].is_bound}))
    return out


def _same_plan_everywhere(d, gpu="h100", dtype=None):
    dtype = dtype or dtype_of(d)
    plan = derive(d, gpu, dtype).plan
    assert lower(d, gpu=gpu, dtype=dtype).plan == plan
    _, program = generate_program(d, gpu=gpu, dtype=dtype)
    assert program.plan == plan
    assert program.plan.to_dict() == plan.to_dict()
    return plan, program


@pytest.mark.parametrize("i", range(2))
def test_examples_plan_once(i):
    plan, program = _same_plan_everywhere(_example_diagrams()[i])
    assert len(program.launches) >= len(plan.kernels)


def test_random_diagrams_plan_once():
    for d, _ in examples()[:24]:
        _same_plan_everywhere(d)


@pytest.mark.parametrize("gpu", GPUS)
def test_every_library_diagram_plans_on_every_gpu(gpu):
    for name in library.names():
        d = prepare(name, sizes=library.entry(name).default_sizes)
        der = derive(d, gpu, "bf16")
        assert der.plan.gpu == resolve_gpu(gpu).key and der.plan.arch == resolve_gpu(gpu).arch
        assert math.isfinite(der.plan.seconds) and der.plan.seconds > 0
        if gpu == "a100-80gb":
            assert all(k.kernel.options.engine != "wgmma" for k in der.plan.kernels)


# ----------------------------------------------------------------------------- the plan is built as it is


def test_every_launch_comes_from_its_kernels_family_and_configuration():
    d = prepare("transformer_block", sizes=library.entry("transformer_block").default_sizes)
    plan = derive(d, "h100", "bf16").plan
    program = build(plan)
    assert len(plan.kernels) > 1 and program.buffers
    for pk in plan.kernels:
        from napkin.codegen.partition import kernel_problem

        sub, kept = kernel_problem(d, pk.boxes, pk.name)
        one = Schedule(sub, (pk.kernel.replace(boxes=kept),), plan.gpu, plan.dtype)
        # the plan's prediction is the one prediction function's, for that exact configuration
        again = predict_schedule(sub, families.get(pk.family), one, "h100")
        assert again.seconds == pytest.approx(pk.seconds, rel=1e-12)
    # every box of the diagram but the views runs in exactly one kernel
    ran = [b for k in plan.kernels for b in k.boxes]
    assert sorted(ran) == sorted(d.name_of(v) for v in d.nodes)


def test_the_plan_chooses_the_families_own_configuration():
    d = prepare("matmul", sizes={"a": 4096, "b": 4096, "c": 4096})
    plan = derive(d, "h100", "bf16").plan
    (k,) = plan.kernels
    fam = families.get(k.family)
    declared = [s.kernels[0] for s in fam.candidates(d, resolve_gpu("h100"), "bf16")]
    assert any(c.relabels == k.kernel.relabels and c.options == k.kernel.options for c in declared)
    fastest = min(predict_schedule(d, fam, s, "h100").seconds for s in fam.candidates(d, resolve_gpu("h100"), "bf16"))
    assert k.seconds == pytest.approx(fastest)


def test_sm80_build_of_a_hopper_plan_is_refused_by_the_template_not_silently_changed():
    d = prepare("matmul", sizes={"a": 1024, "b": 1024, "c": 1024})
    plan = derive(d, "h100", "bf16", arch="sm_80").plan
    assert plan.arch == "sm_80"
    assert plan.kernels[0].kernel.options.engine == "mma.sync"
    assert all(k.template != "matmul_wgmma.cu.jinja" for k in build(plan).launches)


# ----------------------------------------------------------------------------- partitions


def test_softmax_then_contraction_over_another_axis_is_not_fused_when_slower():
    """The audit's case: a softmax over x followed by a contraction over d (not x) cannot stream;
    the planner keeps them apart when the model says so, and says why."""
    q, x, d_ = axes("q x d")
    S, V = array("S", q, x), array("V", x, d_)
    P = softmax(S, over=x, name="P")
    O = contract(P, V, over=x, out=(q, d_), name="O")
    dg = Diagram("sm_then_mm", O).bind(q=4096, x=4096, d=128)
    der = derive(dg, "h100", "bf16")
    planner = _Planner(prepare(dg), resolve_gpu("h100"), "sm_90a", "bf16", families.available(), None, None)
    one = planner.evaluate(("P",)).seconds + planner.evaluate(("O",)).seconds
    both = planner.evaluate(("P", "O")).seconds
    assert der.plan.seconds == pytest.approx(min(one, both))
    assert der.decisions


def test_attention_fuses_and_the_decision_names_the_gain():
    d = prepare("mha", sizes=library.entry("mha").default_sizes)
    der = derive(d, "h100", "bf16")
    assert der.plan.families == ("attention",)
    assert any(s.startswith("fused S+") and "one box per kernel" in s for s in der.decisions)


def test_a_refused_fusion_says_why():
    d = prepare("transformer_block", sizes=library.entry("transformer_block").default_sizes)
    der = derive(d, "h100", "bf16")
    kept = [s for s in der.decisions if s.startswith("kept ")]
    assert kept and all(("no family fuses them" in s) or ("fused would take" in s) or ("more than" in s)
                        for s in kept)


def test_each_run_is_analysed_once():
    from napkin.diagrams.axes import Axis
    from napkin.diagrams.ops import array as arr

    n = 30
    ax = [Axis(f"a{i}", 64) for i in range(n + 1)]
    cur = arr("X", Axis("b", 64), ax[0])
    ins = [cur]
    for i in range(n):
        w = arr(f"W{i}", ax[i], ax[i + 1])
        ins.append(w)
        cur = contract(cur, w, over=ax[i].name, name=f"C{i}")
    d = Diagram("chain", cur, ins)
    planner = _Planner(d, resolve_gpu("h100"), "sm_90a", "bf16", families.available(), None, None)
    calls = []
    orig = planner._evaluate
    planner._evaluate = lambda boxes: calls.append(boxes) or orig(boxes)
    plan, _ = planner.plan()
    assert len(plan.kernels) == n
    assert len(calls) == len(set(map(frozenset, calls)))
    assert len(calls) <= n * MAX_FUSED_BOXES


def _map_chain(n: int) -> Diagram:
    from napkin.diagrams import tanh

    a, b = axes("a b")
    t = array("X", a, b)
    for i in range(n):
        t = tanh(t) if i % 2 else t * 1.5
    return Diagram(f"chain{n}", t.named("Y")).bind(a=1024, b=4096)


@pytest.mark.parametrize("n", [MAX_FUSED_BOXES + 1, 40])
def test_a_chain_of_maps_longer_than_the_window_is_one_kernel(n):
    """A run of elementwise boxes past MAX_FUSED_BOXES is tried whole: a chain of 40 maps is one
    pointwise kernel (it was four, each writing its values to HBM for the next)."""
    plan = derive(_map_chain(n), "h200", "bf16", explain=False).plan
    assert plan.families == ("pointwise",) and len(plan.kernels[0].kernel.boxes) == n


def test_a_chain_past_the_elementwise_limit_keeps_its_first_runs_whole():
    planner = _Planner(_map_chain(300), resolve_gpu("h200"), "sm_90a", "bf16", families.available(), None, None)
    plan, _ = planner.plan()
    assert max(len(k.kernel.boxes) for k in plan.kernels) == planner.max_elementwise == 256
    assert len(plan.kernels) <= 1 + math.ceil((300 - 256) / planner.max_fused)


def test_a_family_with_larger_limits_is_asked_about_runs_of_fewer_heavy_boxes():
    """The row-wise family declares runs of up to 16 boxes and 4 reductions; a group norm of NCHW
    arrays written out (means over w, h and c for the mean and again for the variance: two heavy
    boxes, chained means counting once; 13 boxes) is one row kernel, not two."""
    from napkin.diagrams import mean_over, rsqrt, square

    n, g, c, h, w = axes("n g c h w")
    X = array("X", n, g, c, h, w)

    def mean(v):
        return mean_over(mean_over(mean_over(v, w), h), c)

    d = X - mean(X)
    Y = (d * rsqrt(mean(square(d)) + 1e-5) * array("gamma", g, c) + array("beta", g, c)).named("Y")
    dg = Diagram("gn", Y).bind(n=8, g=32, c=8, h=32, w=32)
    assert len([v for v in dg.nodes if v.op.kind != "input"]) > MAX_FUSED_BOXES
    plan = derive(dg, "h200", "bf16", explain=False).plan
    assert plan.families == ("rowwise",), plan.summary()


@pytest.mark.parametrize("name", ["three", "one", "one_perm", "quad", "chain"])
def test_an_einsum_of_one_or_three_operands_plans_on_fast_families(name):
    """contract(A, g, B, over=k) ran on the scalar fallback (49 ms predicted at 4096 x 1024 x 4096,
    where A·g then ·B takes 55 µs), as did contract(X, over=b) and u·M·v: each is written out as
    maps, reductions and contractions of two operands the fast families take."""
    from napkin_test_support import einsum_cases

    d = Diagram("t", einsum_cases()[name].named("Y"))
    d = d.bind(**{ax: s for ax, s in dict(i=512, j=384, k=256, n=320, z=4).items() if ax in d.axes})
    plan = derive(d, "h200", "bf16", explain=False).plan
    assert FALLBACK not in plan.families and plan.expanded == ("Y",), plan.summary()


def test_a_scalar_read_by_two_kernels_runs_inside_them():
    """A map over no axis read by two kernels (a loss's scale in a backward) was a kernel of one
    value on the scalar fallback; made again in each reader, it runs in their kernels."""
    from napkin.diagrams import scale

    a, b, k, n = axes("a b k n")
    ts = scale(array("t"), 0.5, name="ts")
    d = Diagram("scalar_shared", ((contract(array("A", a, k), array("B", k, n), over=k, out=(a, n)) * ts)
                                  .named("Y1"), softmax(array("X", a, b) * ts, b, name="Y2")))
    plan = derive(d.bind(a=512, b=512, k=256, n=384), "h200", "bf16", explain=False).plan
    assert plan.expanded == ("ts",) and FALLBACK not in plan.families and len(plan.kernels) == 2, plan.summary()


# ----------------------------------------------------------------------------- the last resort


def test_fallback_takes_one_box_and_is_said_aloud():
    d = prepare("transformer_block", sizes=library.entry("transformer_block").default_sizes)
    plan = derive(d, "h100", "bf16").plan
    slow = [k for k in plan.kernels if k.family == FALLBACK]
    for k in slow:
        assert len([b for b in k.boxes if d.value(b).op.kind != "rename"]) == 1
    if slow:
        assert any("scalar fallback" in n for n in plan.notes)
    res = CliRunner().invoke(app, ["derive", "transformer_block", "--gpu", "h100"], catch_exceptions=False)
    assert res.exit_code == 0
    assert ("scalar fallback" in res.output) == bool(slow)


def test_no_family_no_plan_names_the_box():
    with pytest.raises(ScheduleError, match="no kernel that runs box 'P'"):
        derive("softmax", "h100", "bf16", sizes={"r": 4, "x": 64}, fixed={"x": (64, "SMEM", "stream")})


# ----------------------------------------------------------------------------- the plan is a value


@pytest.mark.parametrize("name", ["attention_causal", "transformer_block", "layernorm", "mlp"])
def test_plan_round_trips_through_json(name):
    d = prepare(name, sizes=library.entry(name).default_sizes)
    plan = derive(d, "h100", "bf16").plan
    data = json.loads(json.dumps(plan.to_dict()))
    again = Plan.from_dict(library.get(name), data)
    assert again == plan and again.to_dict() == data
    assert build(again).source() == build(plan).source()
    assert str(plan).startswith(f"plan of {d.name}")


def test_a_hand_written_schedule_is_planned_as_given():
    d = prepare("attention", sizes={"q": 512, "x": 512, "d": 64})
    s = Schedule.fused(d, groups={"q": 64}, streams={"x": 64}, rf_groups={"q": 16})
    plan = plan_schedule(d, s, "h100", family="attention")
    assert plan.families == ("attention",)
    assert {(r.axis, r.size) for r in plan.kernels[0].kernel.relabels} >= {("q", 64), ("x", 64)}
    assert dict(lower(d, s, gpu="h100", family="attention").launches[0].tunables)["BQ"] == 64


def test_runs_with_the_same_structure_are_analysed_once():
    """The K and V projections of a block are the Q projection with other array names: the
    planner costs one of them and renames its options for the others."""
    d = prepare("transformer_block", sizes=library.entry("transformer_block").default_sizes)
    planner = _Planner(d, resolve_gpu("h100"), "sm_90a", "bf16", families.available(), None, None)
    q, k, v = (planner.evaluate((b,)) for b in ("Qp", "Kp", "Vp"))
    assert planner.evaluated == 1
    assert q.seconds == k.seconds == v.seconds
    assert k.best.schedule.kernels[0].boxes == ("Kp",) and v.best.schedule.kernels[0].boxes == ("Vp",)
    assert k.best.schedule.diagram.output_names == ("Kp",)
