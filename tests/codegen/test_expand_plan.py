"""Softmax and norms over an axis no family reads as a row: the planner writes them out as
reductions and maps on the fast families (napkin.diagrams.expand), says so, and the plan reads back."""

from __future__ import annotations

import json

import pytest

from napkin.codegen.families.fallback import scalar_loop_bytes
from napkin.codegen.lower import build
from napkin.codegen.planner import derive
from napkin.codegen.prepare import prepare
from napkin.diagrams import Diagram, array, axes, layernorm, rmsnorm, softmax
from napkin.perfmodel.plan import FALLBACK, Plan

a, b, c = axes("a b c")


def outer_softmax():
    return Diagram("outer_softmax", softmax(array("X", a, b), a, name="Y"))


def middle_rmsnorm():
    return Diagram("middle_rmsnorm", (rmsnorm(array("X", a, b, c), b, name="N") * 2.0).named("Y"))


def middle_layernorm():
    return Diagram("middle_layernorm", layernorm(array("X", a, b, c), b, name="Y"))


CASES = [(outer_softmax, {"a": 4096, "b": 4096}), (middle_rmsnorm, {"a": 64, "b": 512, "c": 256}),
         (middle_layernorm, {"a": 16, "b": 300, "c": 1000})]


@pytest.mark.parametrize("build_diagram, sizes", CASES, ids=[f.__name__ for f, _ in CASES])
def test_a_strided_row_runs_on_fast_families_and_the_decision_says_so(build_diagram, sizes):
    der = derive(build_diagram(), "h100", "bf16", sizes=sizes)
    assert FALLBACK not in der.plan.families, der.plan
    assert der.plan.expanded
    assert der.decisions[0].startswith("wrote out ")
    assert "against" in der.decisions[0]


def test_the_fallback_is_priced_with_its_strided_passes():
    """The fallback's row kernel reads a strided row once per pass, a 32-byte sector per lane: on
    an H200 a softmax over the outer axis of 4096² took 392 µs, where one pass is about 20 µs."""
    d = prepare(outer_softmax(), sizes={"a": 4096, "b": 4096}, dtype="bf16")
    assert scalar_loop_bytes(d) > 40 * 4096 * 4096
    inner = prepare(Diagram("inner", softmax(array("X", a, b), b, name="Y")), sizes={"a": 4096, "b": 4096})
    assert scalar_loop_bytes(inner) == 4096 * 4096 * 2 * 2  # two more passes, each element once


def test_a_row_the_rowwise_family_reads_is_not_written_out():
    der = derive(Diagram("s", softmax(array("X", a, b), b, name="Y")), "h100", "bf16", sizes={"a": 64, "b": 4096})
    assert der.plan.families == ("rowwise",) and not der.plan.expanded


@pytest.mark.parametrize("build_diagram, sizes", CASES, ids=[f.__name__ for f, _ in CASES])
def test_the_expanded_plan_round_trips_and_builds_the_same_source(build_diagram, sizes):
    plan = derive(build_diagram(), "h100", "bf16", sizes=sizes).plan
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["expanded"] == list(plan.expanded)
    again = Plan.from_dict(build_diagram(), data)
    assert again == plan and again.expanded == plan.expanded
    assert build(again).source() == build(plan).source()


def test_a_plan_whose_expansion_does_not_fit_the_diagram_is_refused():
    from napkin.errors import ScheduleError

    data = derive(outer_softmax(), "h100", "bf16", sizes={"a": 64, "b": 64}).plan.to_dict()
    data["expanded"] = ["X"]
    with pytest.raises(ScheduleError, match="not a softmax or norm box"):
        Plan.from_dict(outer_softmax(), data)


def _inner(kind: str):
    X = array("X", a, b)
    box = softmax(X, b, name="Y") if kind == "softmax" else (layernorm if kind == "layernorm" else rmsnorm)(
        X, b, name="Y")
    return Diagram(f"inner_{kind}", box)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_a_long_16_bit_row_is_also_planned_written_out(kind):
    """Over rows of more than LONG_ROW 16-bit values the planner also plans the box written out
    (the chain kernel streams the row or keeps it in shared memory, where the box's own kernel holds
    it in registers at one block an SM), keeps the faster, and says why; shorter rows and fp32 rows
    keep the box's own kernel."""
    from napkin.codegen.planner import LONG_ROW

    der = derive(_inner(kind), "h200", "bf16", sizes={"a": 4096, "b": 16384})
    assert der.plan.expanded == ("Y",) and der.plan.families == ("rowwise",)
    assert any(f"rows of more than {LONG_ROW} values" in d for d in der.decisions)
    data = json.loads(json.dumps(der.plan.to_dict()))
    assert Plan.from_dict(_inner(kind), data) == der.plan
    for dtype, sizes in (("bf16", {"a": 8192, "b": LONG_ROW}), ("fp32", {"a": 4096, "b": 16384})):
        assert not derive(_inner(kind), "h200", dtype, sizes=sizes, explain=False).plan.expanded
