"""The planner runs axes that always travel together as one (napkin.diagrams.fold) where the model
predicts it faster: a linear layer on [b, s, e] activations with short rows of s. The plan records
the folds, reads back from JSON, runs on the CPU interpreter as the reference does, and a compiled
diagram takes the caller's arrays in the diagram's own shapes."""

from __future__ import annotations

import numpy as np
import pytest

from napkin.codegen import compile as napkin_compile
from napkin.codegen.planner import derive
from napkin.diagrams import Diagram, array, axes, contract, gelu
from napkin.perfmodel import interpret
from napkin.perfmodel.plan import Plan


def linear() -> Diagram:
    b, s, e, f = axes("b s e f")
    Y = contract(array("X", b, s, e), array("W", f, e), over=e, out=(b, s, f), name="Yl") + array("bias", f)
    return Diagram("linear3d", gelu(Y + array("R", b, s, f), name="Y"))


SHORT = dict(b=256, s=50, e=768, f=3072)  # 50-row runs of s: a 128-row tile would hold 50
LONG = dict(b=4, s=4096, e=1024, f=1024)  # tiles of s are full: nothing to gain


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100"])
def test_short_rows_fold_and_the_model_says_why(gpu):
    r = derive(linear(), gpu, sizes=SHORT)
    assert [f.parts for f in r.plan.folds] == [("b", "s")]
    assert r.plan.diagram.inputs[0].label() == "X[b_s,e]" and r.plan.interface.inputs[0].label() == "X[b,s,e]"
    unfolded = derive(linear(), gpu, sizes=SHORT, fold_axes=False).plan
    assert not unfolded.folds and r.plan.seconds < unfolded.seconds
    assert any("side by side" in line for line in r.decisions)
    assert "axes b, s run as one axis b_s" in r.plan.summary()


def test_full_tiles_keep_the_diagrams_axes():
    assert derive(linear(), "h100", sizes=LONG).plan.folds == ()


def test_a_folded_plan_reads_back_and_runs_as_the_reference():
    plan = derive(linear(), "h100", sizes=dict(b=512, s=3, e=64, f=256)).plan
    assert plan.folds, "small s: the fold is the faster plan"
    back = Plan.from_dict(linear(), plan.to_dict())
    assert back == plan and back.interface == plan.interface and back.diagram == plan.diagram
    assert_interpreted_as_the_reference(plan, "Y", seed=0)


def assert_interpreted_as_the_reference(plan: Plan, out: str, seed: int) -> None:
    """The folded plan run by the CPU interpreter on arrays of the folded shapes (the same values)
    gives the diagram's float64 reference, reshaped."""
    rng = np.random.default_rng(seed)
    src = plan.interface
    ins = {v.name: rng.standard_normal([a.bound_size for a in v.axes]) for v in src.inputs}
    flat = {v.name: ins[v.name].reshape([a.bound_size for a in v.axes]) for v in plan.diagram.inputs}
    got = interpret(plan.schedule, flat).outputs[out]
    torch = pytest.importorskip("torch")
    want = src.reference({n: torch.from_numpy(x) for n, x in ins.items()}, dtype=torch.float64)[out].numpy()
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-9, atol=1e-9)


def test_a_compiled_folded_plan_takes_the_diagrams_shapes():
    cd = napkin_compile(linear(), sizes=SHORT, gpu="h100")
    assert cd.plan.folds and cd.program.diagram.inputs[0].label() == "X[b_s,e]"
    assert cd.diagram.inputs[0].label() == "X[b,s,e]"
    assert cd._shapes["X"] == (256, 50, 768) and cd._out_shapes["Y"] == (256, 50, 3072)


def test_dynamic_sizes_keep_every_axis():
    cd = napkin_compile(linear(), sizes=SHORT, gpu="h100", dynamic={"b": (1, 256)})
    assert not cd.plan.folds


def test_attention_keeps_its_axes():
    """The query heads sharing a K/V head and the query rows (Q[h, j, q, d]) lie side by side and
    no box treats them apart, but the attention family packs them itself (its decode tiles were
    measured that way): the plan keeps them apart."""
    from napkin.diagrams.fold import foldable
    from test_attention_decode import gqa_decode

    d = gqa_decode().bind(h=8, j=4, q=7, x=4096, d=128)
    assert [f.parts for f in foldable(d)] == [("j", "q")]
    plan = derive(d, "h100").plan
    assert plan.folds == () and "attention" in plan.families


def test_derive_prints_the_callers_sizes_and_the_run():
    from napkin.perfmodel.method import format_steps

    r = derive(linear(), "h200", sizes=SHORT)
    head = format_steps(r.plan, r.steps).splitlines()[0]
    assert head.endswith("sizes b=256, s=50, e=768, f=3072; b x s run as b_s=12800"), head


def heads(out_name="C") -> Diagram:
    """C[a, n] = Σ_{h, d} A[a, h, d]·B[n, h, d]: the sum over (h, d) is one matrix product of depth h·d."""
    a, h, d, n = axes("a h d n")
    return Diagram("heads", contract(array("A", a, h, d), array("B", n, h, d), over=(h, d), name=out_name))


HEADS = dict(a=4096, h=32, d=128, n=4096)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_sum_over_a_run_of_axes_runs_as_one_depth(dtype):
    """Unfolded, the kernel streams d and walks h one index at a time; folded it is one 4096-deep
    product. The model prices both alike (a tie), which a summed run takes: one loop, no partial
    chunk at each h (unfolded, wgmma took it only once the outer-sum walk had tensor maps of the
    operands' own axes; before, it ran on mma.sync at 0.44x eager)."""
    plan = derive(heads(), "h200", dtype, sizes=HEADS).plan
    assert [f.parts for f in plan.folds] == [("h", "d")], plan.summary()
    assert plan.diagram.inputs[0].label() == "A[a,h_d]" and plan.interface.inputs[0].label() == "A[a,h,d]"
    unfolded = derive(heads(), "h200", dtype, sizes=HEADS, fold_axes=False).plan
    assert plan.seconds <= unfolded.seconds
    assert [s.axis for s in plan.kernels[0].kernel.streams] == ["h_d"]
    assert {s.axis for s in unfolded.kernels[0].kernel.streams} == {"h", "d"}
    if dtype == "bf16":
        assert plan.kernels[0].kernel.options.engine == "wgmma", plan.summary()


def test_a_folded_sum_runs_as_the_reference_on_the_interpreter():
    plan = derive(heads(), "h100", sizes=dict(a=300, h=3, d=40, n=300)).plan
    assert plan.folds
    assert_interpreted_as_the_reference(plan, "C", seed=3)


def test_a_compiled_folded_sum_makes_its_tensor_maps_in_the_folded_shapes():
    """The caller passes A[a, h, d]; the wgmma kernel's tensor map must describe A[a, h·d] (made in
    the caller's shapes it described rows of d: every sum came out wrong on the GPU)."""
    cd = napkin_compile(heads(), sizes=dict(a=256, h=8, d=64, n=384), gpu="h200", dtype="bf16")
    assert cd.plan.folds and cd._shapes["A"] == (256, 8, 64)
    assert cd._kernel_shapes["A"] == (256, 512) and cd._kernel_shapes["B"] == (384, 512)
    assert cd._kernel_shapes["C"] == cd._out_shapes["C"] == (256, 384)
    assert any(a.kind == "tmap" and a.name == "A" for k in cd.launches for a in k.args)
