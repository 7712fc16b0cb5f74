"""The interpreter runs schedules and agrees with the PyTorch reference and with the model's H and M."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from napkin.diagrams import (
    Axis,
    array,
    contract,
    library,
    max_over,
    mean_over,
    reduce,
    softmax,
    sum_over,
)
from napkin.diagrams.diagram import Diagram
from napkin.errors import ScheduleError
from napkin.diagrams.ops import exp, logsumexp, map_fn
from napkin.perfmodel import Schedule, cost, interpret
from napkin.perfmodel.legality import analyze

SIZES = dict(q=37, x=45, d=16, h=3, j=2, a=37, b=45, c=23, n=3, r=37, e=24, f=40, g=2, s=11)


@pytest.fixture(autouse=True)
def _float64_reference():
    # index-based maps (ALiBi slopes) divide integer index tensors: keep them in float64 too
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def bound(name):
    d = library.get(name)
    return d.bind({k: v for k, v in SIZES.items() if k in d.axes and d.axes[k].size == Axis(k).size})


def sensible_schedules(d):
    fam = library.entry(d.name).family
    out = [("unfused", Schedule.unfused(d, gpu=None))]
    if fam == "contraction":
        g = {"a": 16, "c": 8, **({"n": 2} if "n" in d.axes else {})}
        out.append(("fused", Schedule.fused(d, groups=g, streams={"b": 16}, gpu=None)))
        out.append(("fused-rf", Schedule.fused(d, groups={"a": [(16, "SMEM"), (5, "RF")], "c": 8},
                                               streams={"b": 10}, gpu=None)))
    elif fam == "rowwise":
        rows = {"r": 16} if "r" in d.axes else {"g": 2}  # group norm's rows are (n, g)
        out.append(("fused", Schedule.fused(d, groups=rows, gpu=None)))
    elif fam == "attention":
        g = {"q": 16, **({"h": 2} if "h" in d.axes else {}), **({"j": 1} if "j" in d.axes else {})}
        out.append(("fused", Schedule.fused(d, groups=g, streams={"x": 16}, gpu=None)))
        out.append(("unfused-tiled", Schedule.unfused(d, groups=g, streams={"x": 16}, gpu=None)))
        out.append(("fused-warps", Schedule.fused(d, groups={**g, "q": [(16, "SMEM"), (5, "RF")]},
                                                  streams={"x": 7}, gpu=None)))
    else:
        out.append(("fused", Schedule.fused(d, gpu=None)))
        out.append(("unfused-tiled", Schedule.unfused(d, groups={"q": 16, "h": 2}, streams={"e": 16, "x": 16},
                                                      gpu=None)))
    return out


def reference(d, arrays):
    ins = {k: torch.from_numpy(arrays[k]) for k in d.input_names}
    return {k: v.numpy() for k, v in d.reference(ins, dtype=torch.float64).items()}


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


CASES = [(name, label) for name in library.names() for label, _ in sensible_schedules(bound(name))]


@pytest.mark.parametrize("name,label", CASES)
def test_library_diagram_matches_reference_and_model(name, label):
    d = bound(name)
    sched = dict(sensible_schedules(d))[label]
    res = interpret(sched, seed=1)
    ref = reference(d, res.arrays)
    for k in d.output_names:
        assert np.isfinite(res.outputs[k]).all()
        assert rel_err(res.outputs[k], ref[k]) < 1e-10, k
    c = cost(sched, False, l2_caching=False)
    assert res.transfers["L2"] == c.H("L2")
    assert res.transfers["HBM"] == c.H("HBM")
    assert res.transfers["SMEM"] == c.H("SMEM")
    assert res.memory_peak["SMEM"] == c.M("SMEM")
    assert res.memory_peak["RF"] == c.M("RF")
    for run, kc in zip(res.per_kernel, c.per_kernel):
        assert run.transfers["L2"] == kc.H("L2")
        assert run.groups == kc.groups and run.steps == kc.steps


def test_attention_closed_form_with_partial_groups():
    d = library.get("attention").bind(q=37, x=45, d=16)
    for g in (1, 5, 16, 36, 37):
        res = interpret(Schedule.fused(d, groups={"q": g}, streams={"x": 7}, gpu=None), seed=0)
        ng = -(-37 // g)
        assert res.transfers["L2"] == 2 * 37 * 16 + 2 * 45 * 16 * ng
        assert res.memory_peak["SMEM"] == 2 * 16 * (g + 7)
        assert res.per_kernel[0].groups == ng and res.per_kernel[0].steps == -(-45 // 7)


def test_unfused_attention_moves_4qx_more():
    d = library.get("attention").bind(q=37, x=45, d=16)
    f = interpret(Schedule.fused(d, groups={"q": 16}, streams={"x": 16}, gpu=None), seed=0)
    u = interpret(Schedule.unfused(d, groups={"q": 16}, streams={"x": 16}, gpu=None), seed=0)
    assert u.transfers["L2"] - f.transfers["L2"] == 4 * 37 * 45
    np.testing.assert_allclose(u.outputs["O"], f.outputs["O"], rtol=1e-12)


def test_matmul_closed_form():
    d = library.get("matmul").bind(a=37, b=45, c=23)
    res = interpret(Schedule.fused(d, groups={"a": 8, "c": 5}, streams={"b": 4}, gpu=None), seed=0)
    assert res.transfers["L2"] == 37 * 45 * 5 + 45 * 23 * 5 + 37 * 23  # ceil(23/5)=5, ceil(37/8)=5
    assert res.memory_peak["SMEM"] == 8 * 5 + 4 * (8 + 5)


def test_streamed_reductions_and_online_softmax_with_two_consumers():
    r, x = Axis("r", 7), Axis("x", 45)
    X = array("X", r, x)
    d = Diagram("reds", (mean_over(X, x, name="m"), max_over(X * 2.0, x, name="mx"),
                         reduce(X, x, "min", name="mn"), sum_over(X, x, name="s")))
    sched = Schedule.fused(d, groups={"r": 3}, streams={"x": 8}, gpu=None)
    res = interpret(sched, seed=3)
    ref = reference(d, res.arrays)
    for k in ref:
        assert rel_err(res.outputs[k], ref[k]) < 1e-12
    assert res.transfers["L2"] == cost(sched, False).H("L2")
    q, xx, dd, e = Axis("q", 9), Axis("x", 31), Axis("d", 16), Axis("e", 5)
    Q, K, V, U = array("Q", q, dd), array("K", xx, dd), array("V", xx, dd), array("U", xx, e)
    P = softmax(contract(Q, K, over="d", name="S"), over="x", name="P")
    two = Diagram("two", (contract(P, V, over="x", name="O1"), contract(P, U, over="x", name="O2")))
    sched = Schedule.fused(two, groups={"q": 4}, streams={"x": 7}, gpu=None)
    res = interpret(sched, seed=4)
    ref = reference(two, res.arrays)
    for k in ref:
        assert rel_err(res.outputs[k], ref[k]) < 1e-12
    c = cost(sched, False)
    assert (res.transfers["L2"], res.transfers["SMEM"]) == (c.H("L2"), c.H("SMEM"))


def _pair_diagrams():
    """The max of X over r and Σ_r exp(X − c): c the max itself (a softmax's statistics) and
    c = zero_inf(max) (logsumexp, the sum's log added back), also with a map before them."""
    r, x = Axis("r", 37), Axis("x", 6)
    X = array("X", r, x)
    m = max_over(X, "r", name="m")
    stats = Diagram("stats", (m, sum_over(exp(map_fn("sub", X, m, name="d"), name="e"), "r", name="s")))
    lse = Diagram("lse", logsumexp(X, "r", name="L"))
    scaled = Diagram("lse2", logsumexp(X * 0.5, "r", name="L"))
    return stats, lse, scaled


def _special(seed: int) -> np.ndarray:
    """37 × 6 values: normal ones, a column of -inf, a column -inf in its first two thirds (the
    running max is -inf for the first steps), one with a +inf, one with a NaN, one very negative
    (a shift of -1e4: exp overflows if what was summed at -inf is rescaled without care)."""
    X = np.random.default_rng(seed).standard_normal((37, 6)) * 3
    X[:, 1] = -np.inf
    X[:25, 2] = -np.inf
    X[11, 3] = np.inf
    X[5, 4] = np.nan
    X[:, 5] -= 1e4
    X[:30, 5] = -np.inf
    return X


@pytest.mark.parametrize("chunk", [1, 4, 37])
def test_a_sum_of_exp_beside_its_max_streams_in_one_pass(chunk):
    """Σ_r exp(X − max_r X) streams over r with the max (legality.RescaledSum): the sum is rescaled
    as the running max grows, and equals the reference at ±inf, NaN and -1e4 too (NaN where the
    reference is NaN); H and M are the model's."""
    for d in _pair_diagrams():
        sched = Schedule.fused(d, groups={"x": 3}, streams={"r": chunk}, gpu=None)
        (kp,) = analyze(sched)
        assert len(kp.rescaled) == 1
        for X in (np.random.default_rng(1).standard_normal((37, 6)), _special(2)):
            res = interpret(sched, {"X": X})
            ref = reference(d, {"X": X})
            for k in d.output_names:
                np.testing.assert_allclose(res.outputs[k], ref[k], rtol=1e-12, atol=0, equal_nan=True)
        c = cost(sched, False)
        res = interpret(sched, seed=0)
        assert (res.transfers["L2"], res.transfers["SMEM"]) == (c.H("L2"), c.H("SMEM"))
        assert res.memory_peak["SMEM"] == c.M("SMEM") and res.memory_peak["RF"] == c.M("RF")


def test_a_sum_of_exp_of_another_value_needs_a_second_pass():
    """Σ_r exp(Z − max_r X) with Z not X: no rescaling gives it in one pass; streaming r is refused."""
    r, x = Axis("r", 37), Axis("x", 6)
    X, Z = array("X", r, x), array("Z", r, x)
    m = max_over(X, "r", name="m")
    d = Diagram("other", (m, sum_over(exp(map_fn("sub", Z, m, name="d"), name="e"), "r", name="s")))
    with pytest.raises(ScheduleError, match="second pass"):
        analyze(Schedule.fused(d, groups={"x": 3}, streams={"r": 4}, gpu=None))


def test_placement_overrides_move_traffic_between_levels():
    d = library.get("attention").bind(q=37, x=45, d=16)
    base = Schedule.fused(d, groups={"q": 16}, streams={"x": 16}, gpu=None)
    moved = Schedule.fused(d, groups={"q": 16}, streams={"x": 16}, gpu=None, placement={"P": "SMEM", "K": "RF"})
    rb, rm = interpret(base, seed=0), interpret(moved, seed=0)
    assert rb.transfers["L2"] == rm.transfers["L2"]
    # P written to and read from SMEM (q·x each); K no longer read from SMEM (x·d per q-group)
    assert rm.transfers["SMEM"] - rb.transfers["SMEM"] == 2 * 37 * 45 - 45 * 16 * 3
    c = cost(moved, False)
    assert rm.transfers["SMEM"] == c.H("SMEM") and rm.memory_peak["SMEM"] == c.M("SMEM")
    np.testing.assert_allclose(rm.outputs["O"], rb.outputs["O"], rtol=1e-12)


def test_inputs_bind_sizes_and_errors():
    d = library.get("matmul")
    A, B = np.random.default_rng(0).standard_normal((5, 6)), np.random.default_rng(1).standard_normal((6, 7))
    res = interpret(Schedule.fused(d, groups={"a": 2, "c": 3}, streams={"b": 4}, gpu=None), {"A": A, "B": B})
    np.testing.assert_allclose(res.outputs["C"], A @ B, rtol=1e-12)
    with pytest.raises(ScheduleError, match="g_a"):
        interpret(Schedule.fused(d, groups={"a": None}, gpu=None), {"A": A, "B": B})
    with pytest.raises(ScheduleError, match="needs sizes"):
        interpret(Schedule.fused(d, gpu=None))
    with pytest.raises(ScheduleError, match="no input"):
        interpret(Schedule.fused(d, gpu=None), {"Z": A})
    res = interpret(Schedule.fused(d, groups={"a": None}, gpu=None), {"A": A, "B": B}, sizes={"g_a": 2})
    np.testing.assert_allclose(res.outputs["C"], A @ B, rtol=1e-12)


def test_interpreter_does_not_import_torch():
    code = "import sys, napkin.perfmodel.interpreter, napkin.perfmodel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "False", out.stderr


def test_a_contraction_over_more_axes_than_einsum_has_letters_is_refused_with_a_message():
    from napkin.diagrams import Axis, Diagram, array, contract
    from napkin.errors import ScheduleError
    from napkin.perfmodel import Schedule, interpret

    ax = [Axis(f"a{i}", 1) for i in range(30)]
    bx = [Axis(f"b{i}", 1) for i in range(30)]
    k = Axis("k", 2)
    d = Diagram("wide", contract(array("A", *ax, k, dtype="fp32"), array("B", k, *bx, dtype="fp32"),
                                 over=k, name="C"))
    with pytest.raises(ScheduleError, match="at most 52 axes"):
        interpret(Schedule.unfused(d), seed=0)


@pytest.mark.parametrize("sizes", [dict(c=256, r=128, x=512), dict(c=300, r=200, x=200)], ids=["tiles", "ragged"])
def test_the_rmsnorm_prologue_plan_factors_the_row_scale_out_of_the_sum(sizes):
    """The contraction family's RMSNorm -> linear plan streams x through the norm: each chunk passes
    unscaled (times gamma), its squares add to the row's sum, and rsqrt(sum / x + eps) multiplies
    the contraction once every chunk is in; the interpreter runs it so and matches the reference
    (it refused the plan before)."""
    from napkin.codegen import compile as napkin_compile

    d = library.get("rmsnorm_linear")
    sched = napkin_compile(d, sizes=sizes, dtype="bf16", gpu="h200").program.schedule
    assert [k.family for k in sched.kernels] == ["contraction"]  # the prologue plan: one kernel
    res = interpret(sched, seed=2)
    ref = reference(sched.diagram, res.arrays)
    assert rel_err(res.outputs["Y"], ref["Y"]) < 1e-10
    c = cost(sched, False, l2_caching=False)
    assert res.transfers["HBM"] == c.H("HBM")


SMALL = [("attention", dict(q=5, x=100, d=64)), ("mha", dict(h=4, q=1, x=300, d=128)),
         ("gqa", dict(h=2, j=4, q=1, x=300, d=128)), ("matmul", dict(a=5, b=64, c=7)),
         ("transformer_block", dict(q=7, e=64, h=2, d=32, f=96, x=7)), ("softmax", dict(r=3, x=5))]


@pytest.mark.parametrize("name,sizes", SMALL, ids=[n for n, _ in SMALL])
def test_a_derived_plan_runs_at_sizes_smaller_than_its_tiles(name, sizes):
    """derive's tiles are the GPU's (a 16-row query tile for one decode row, 128-key chunks of 100
    keys); the interpreter runs them over the real elements, as a partial last tile."""
    from napkin.codegen.planner import derive
    from napkin.perfmodel.hardware import get_gpu

    d = library.get(name).with_dtype("bf16").bind(**sizes)
    sched = derive(d, get_gpu("h200"), "bf16", explain=False).plan.schedule
    over = [(r.symbol, r.size) for k in sched.kernels for r in k.relabels
            if isinstance(r.size, int) and r.size > d.sizes[r.axis]]
    res = interpret(sched, seed=2)
    ref = reference(d, res.arrays)
    for k in d.output_names:
        assert rel_err(res.outputs[k], ref[k]) < 1e-10, k
    if name in ("attention", "mha"):  # the point: their tiles overhang their axes
        assert over, sched
    assert sched.clipped_view().clipped_view() == sched.clipped_view()
