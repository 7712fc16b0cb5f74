"""Property tests: random contractions under random schedules.

Legal schedules: the interpreter's transfers equal the model's H (block boundary and SMEM),
its memory peaks equal the model's M, and its outputs equal the PyTorch reference.
Illegal schedules: a ScheduleError whose message names the axis and the reason.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from napkin.diagrams import Axis, array, causal, contract, softmax
from napkin.diagrams.diagram import Diagram
from napkin.errors import ScheduleError
from napkin.perfmodel import Schedule, analyze, cost, interpret
from napkin.perfmodel.schedule import Kernel, Relabel

NAMES = "ijklm"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def contractions(draw):
    """A random einsum over 2–3 inputs with random axis sets and sizes 1–40 (total work bounded)."""
    n_axes = draw(st.integers(2, 5))
    names = list(NAMES[:n_axes])
    sizes = {a: draw(st.integers(1, 40)) for a in names}
    assume(math.prod(sizes.values()) <= 40_000)
    n_inputs = draw(st.integers(2, 3))
    ins = []
    for i in range(n_inputs):
        subset = draw(st.lists(st.sampled_from(names), min_size=1, max_size=n_axes, unique=True))
        ins.append(subset)
    carried = sorted({a for s in ins for a in s})
    if n_inputs == 2:
        candidates = [a for a in carried if a in ins[0] and a in ins[1]]
    else:
        candidates = carried
    over = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=len(candidates))) if candidates else []
    axes = {a: Axis(a, sizes[a]) for a in carried}
    arrays = [array(f"X{i}", *[axes[a] for a in s]) for i, s in enumerate(ins)]
    out = contract(*arrays, over=over, name="Y") if over else contract(*arrays, over=(), name="Y")
    return Diagram("einsum", out)


@st.composite
def legal_schedules(draw, diagram):
    y = diagram.outputs[0]
    woven = list(y.axis_names)
    over = [a for a in diagram.axes if a not in woven]
    n = {a: ax.size for a, ax in diagram.axes.items()}
    grouped = draw(st.lists(st.sampled_from(woven), unique=True)) if woven else []
    rel = [Relabel(a, draw(st.integers(1, n[a])), "SMEM", "group") for a in grouped]
    free = [a for a in (*woven, *over) if a not in grouped]
    if free and draw(st.booleans()):
        s = draw(st.sampled_from(free))
        rel.append(Relabel(s, draw(st.integers(1, n[s])), "SMEM", "stream"))
    else:
        s = None
    for a in [a for a in woven if a != s]:
        if draw(st.integers(0, 3)) == 0:
            outer = next((r.size for r in rel if r.axis == a and r.kind == "group"), n[a])
            rel.append(Relabel(a, draw(st.integers(1, outer)), "RF", "group"))
    placement = {}
    for v in diagram.inputs:
        if draw(st.integers(0, 4)) == 0:
            placement[v.name] = "RF"
    if draw(st.integers(0, 4)) == 0:
        placement["Y"] = "RF"
    return Schedule(diagram, (Kernel("k", ("Y",), tuple(rel), tuple(placement.items())),), gpu=None)


def _reference(d, arrays):
    ins = {k: torch.from_numpy(arrays[k]) for k in d.input_names}
    return {k: v.numpy() for k, v in d.reference(ins, dtype=torch.float64).items()}


def _agree(sched, seed):
    res = interpret(sched, seed=seed)
    c = cost(sched, False, l2_caching=False)
    assert res.transfers["L2"] == c.H("L2")
    assert res.transfers["HBM"] == c.H("HBM")
    assert res.transfers["SMEM"] == c.H("SMEM")
    assert res.memory_peak["SMEM"] == c.M("SMEM")
    assert res.memory_peak["RF"] == c.M("RF")
    ref = _reference(sched.diagram, res.arrays)
    for k, r in ref.items():
        got = res.outputs[k]
        scale = max(float(np.abs(r).max(initial=0.0)), 1.0)
        np.testing.assert_allclose(got, r, rtol=1e-10, atol=1e-10 * scale)
    return res, c


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_random_contractions_interpreter_equals_model_and_reference(data):
    d = data.draw(contractions())
    sched = data.draw(legal_schedules(d))
    analyze(sched)
    res, c = _agree(sched, data.draw(st.integers(0, 2**16)))
    # the transfer formula itself: each input re-read once per group along every grouped axis it lacks
    k = sched.kernels[0]
    groups = {r.axis: r.size for r in k.relabels if r.kind == "group" and r.level == "SMEM"}
    expected = 0
    for v in (*d.inputs, d.outputs[0]):
        t = math.prod(ax.size for ax in v.axes)
        for a, g in groups.items():
            if a not in v.axis_names:
                t *= -(-d.axes[a].size // g)
        expected += t
    assert res.transfers["L2"] == expected


@settings(max_examples=40, **SETTINGS)
@given(st.data())
def test_random_illegal_schedules_are_refused_with_a_reason(data):
    d = data.draw(contractions())
    y = d.outputs[0]
    woven = list(y.axis_names)
    over = [a for a in d.axes if a not in woven]
    n = {a: ax.size for a, ax in d.axes.items()}
    kinds = ["unknown", "too_big", "rf_stream", "level"]
    if over:
        kinds.append("group_contracted")
    if len(d.axes) >= 2:
        kinds.append("two_streams")
    if woven:
        kinds += ["group_and_stream", "warp_too_big"]
    kind = data.draw(st.sampled_from(kinds))
    axis = data.draw(st.sampled_from(sorted(d.axes)))
    if kind == "unknown":
        axis = "zz"
        rel, needles = [Relabel("zz", 2)], ["'zz'", "the kernel's axes are"]
    elif kind == "too_big":
        rel, needles = [Relabel(axis, n[axis] + data.draw(st.integers(1, 5)),
                                "SMEM", data.draw(st.sampled_from(["group", "stream"])))], [f"'{axis}'", "exceeds"]
        if rel[0].kind == "group" and axis in over:
            needles = [f"'{axis}'", "contracts over"]
    elif kind == "rf_stream":
        rel, needles = [Relabel(axis, 1, "RF", "stream")], [f"'{axis}'", "RF"]
    elif kind == "level":
        rel, needles = [Relabel(axis, 1, data.draw(st.sampled_from(["HBM", "L2", "TC"])), "group")], [f"'{axis}'"]
    elif kind == "group_contracted":
        axis = data.draw(st.sampled_from(over))
        rel, needles = [Relabel(axis, 1)], [f"'{axis}'", "box Y", "contracts over"]
    elif kind == "two_streams":
        a1, a2 = data.draw(st.lists(st.sampled_from(sorted(d.axes)), min_size=2, max_size=2, unique=True))
        # two streams are one loop only when one contraction sums over both (chunks of 1 outside)
        assume(not (a1 in over and a2 in over))
        axis = a1
        rel, needles = [Relabel(a1, 1, kind="stream"), Relabel(a2, 1, kind="stream")], [f"'{a1}'", "one axis"]
    elif kind == "group_and_stream":
        axis = data.draw(st.sampled_from(woven))
        rel, needles = [Relabel(axis, 1), Relabel(axis, 1, kind="stream")], [f"'{axis}'", "both grouped and streamed"]
    else:  # warp tile larger than the block tile
        axis = data.draw(st.sampled_from(woven))
        assume(n[axis] >= 2)
        g = data.draw(st.integers(1, n[axis] - 1))
        rel, needles = [Relabel(axis, g), Relabel(axis, g + 1, "RF")], [f"'{axis}'", "warp tile"]
    sched = Schedule(d, (Kernel("k", ("Y",), tuple(rel)),), gpu=None)
    with pytest.raises(ScheduleError) as info:
        analyze(sched)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


@st.composite
def attentions(draw):
    """Attention woven over random extra axes, optionally causal, with random sizes."""
    q, x, dd, e = (Axis(nm, draw(st.integers(1, 24))) for nm in "qxde")
    extra = [Axis(nm, draw(st.integers(1, 3))) for nm in draw(st.lists(st.sampled_from("hj"), unique=True))]
    kv_extra = [a for a in extra if draw(st.booleans())]
    Q = array("Q", *extra, q, dd)
    K = array("K", *kv_extra, x, dd)
    V = array("V", *kv_extra, x, e)
    S = contract(Q, K, over="d", name="S")
    if draw(st.booleans()):
        S = causal(S, "q", "x", name="Sm")
    O = contract(softmax(S, over="x", name="P"), V, over="x", name="O")
    return Diagram("attn", O)


@settings(max_examples=25, **SETTINGS)
@given(st.data())
def test_random_attention_schedules(data):
    d = data.draw(attentions())
    n = {a: ax.size for a, ax in d.axes.items()}
    woven = [a for a in d.outputs[0].axis_names]
    fuse = data.draw(st.sampled_from(["all", "none"]))
    groups = {a: data.draw(st.integers(1, n[a])) for a in data.draw(st.lists(st.sampled_from(woven), unique=True))}
    streams = {"x": data.draw(st.integers(1, n["x"]))} if data.draw(st.booleans()) else {}
    sched = Schedule.from_spec(d, groups=groups, streams=streams, fuse=fuse, gpu=None)
    _agree(sched, data.draw(st.integers(0, 2**16)))
