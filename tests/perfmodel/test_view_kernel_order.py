"""Kernel order through views: a rename is a free view of the array it shows, so a box reading
the view depends on the kernel that computes the viewed array, not on the kernel the rename box
sits in (the planner gives a view to one of its readers' kernels, possibly a later one)."""

import numpy as np
import pytest

from napkin.diagrams import Axis, array, contract, library, rename
from napkin.diagrams.diagram import Diagram
from napkin.errors import ScheduleError
from napkin.perfmodel import Schedule, analyze, cost, interpret
from napkin.perfmodel.schedule import Kernel, Relabel


def view_diagram() -> Diagram:
    """A[q, d] = Σ_e X·W; Av = A with q renamed x; R1[d, f] = Σ_x Av·Y; R2[x, g] = Σ_d Av·Z."""
    q, x, e, d, f, g = (Axis(n, s) for n, s in (("q", 16), ("x", 16), ("e", 8), ("d", 8), ("f", 4), ("g", 4)))
    A = contract(array("X", q, e), array("W", e, d), over="e", name="A")
    Av = rename(A, q="x", name="Av")
    R1 = contract(Av, array("Y", x, f), over="x", name="R1")
    R2 = contract(Av, array("Z", d, g), over="d", name="R2")
    return Diagram("views", (R1, R2))


def test_a_reader_of_a_view_runs_before_the_kernel_holding_the_rename():
    d = view_diagram()
    s = Schedule(d, (Kernel("a", ("A",)), Kernel("r1", ("R1",)), Kernel("r2", ("Av", "R2"))))
    plans = analyze(s)
    r1 = plans[1]
    assert [r1.name_of(v) for v in r1.inputs] == ["Av", "Y"]  # the view, loaded from A's storage
    assert [plans[0].name_of(v) for v in plans[0].stores] == ["A"]
    ref = interpret(Schedule(d, (Kernel("all", tuple(d.name_of(v) for v in d.nodes)),)), seed=3)
    got = interpret(s, seed=3)
    for name in ("R1", "R2"):
        np.testing.assert_allclose(got.outputs[name], ref.outputs[name], rtol=1e-12, atol=1e-12)
    assert float(cost(s, gpu=False).H("L2")) > 0


def test_reading_a_view_of_an_array_computed_later_is_refused():
    d = view_diagram()
    # R1 reads Av (a view of A) before the kernel computing A runs
    bad = Schedule(d, (Kernel("r1", ("R1",)), Kernel("a", ("A", "Av", "R2"))))
    with pytest.raises(ScheduleError, match=r"box R1 reads Av \(a view of A\), which kernel 'a' computes later"):
        analyze(bad)
    # the rename box itself placed before the array it views
    bad2 = Schedule(d, (Kernel("v", ("Av", "R1")), Kernel("a", ("A", "R2"))))
    with pytest.raises(ScheduleError, match="box Av reads A, which kernel 'a' computes later"):
        analyze(bad2)
    # a plain read-before-compute, no views involved
    att = library.get("attention")
    with pytest.raises(ScheduleError, match="box O reads P, which kernel 'b' computes later; kernels run in order"):
        analyze(Schedule(att, (Kernel("a", ("O",)), Kernel("b", ("S", "S_scaled", "P")))))


def test_a_view_of_an_array_of_the_same_kernel_must_be_renamed_there():
    d = view_diagram()
    # R1 sits with A, but the view it reads is made in a later kernel: it would load Av from HBM
    # before A is written
    bad = Schedule(d, (Kernel("a", ("A", "R1")), Kernel("r2", ("Av", "R2"))))
    with pytest.raises(ScheduleError, match="which this kernel computes, but the rename Av sits in kernel 'r2'"):
        analyze(bad)
    ok = Schedule(d, (Kernel("a", ("A", "Av", "R1")), Kernel("r2", ("R2",))))
    analyze(ok)


def test_a_view_beside_a_two_axis_stream_does_not_block_it():
    """A kernel streaming (h, d) of one contraction (h in chunks of 1) may also hold the rename its
    contraction reads: the view is free, only the boxes reading it are checked."""
    q, x, h, dd, e = Axis("q", 16), Axis("x", 16), Axis("h", 2), Axis("d", 8), Axis("e", 8)
    K = contract(array("A", h, x, e), array("B", e, dd), over="e", name="K")
    Kv = rename(K, x="q", name="Kv")
    C = contract(Kv, array("Wk", h, dd, e), over=("h", "d"), name="C")
    d = Diagram("stream_view", C)
    s = Schedule(d, (Kernel("k", ("K",)),
                     Kernel("c", ("Kv", "C"), relabels=(Relabel("h", 1, kind="stream"),
                                                        Relabel("d", 4, kind="stream")))))
    plans = analyze(s)
    assert plans[1].stream == ("d", 4) and plans[1].outer_streams == ("h",)
    ref = interpret(Schedule(d, (Kernel("all", ("K", "Kv", "C")),)), seed=1)
    np.testing.assert_allclose(interpret(s, seed=1).outputs["C"], ref.outputs["C"], rtol=1e-12, atol=1e-12)


def test_transformer_block_backward_plan_is_costed():
    from napkin.codegen import derive
    from napkin.perfmodel.report import cost_report

    d = library.get("transformer_block").grad().bind(q=64, e=64, h=2, d=32, f=64)
    plan = derive(d, "h100").plan
    rep = cost_report(plan)
    assert rep["predicted_seconds"] > 0 and rep["flops"] > 0
    assert len(rep["kernels"]) == len(plan.kernels)
