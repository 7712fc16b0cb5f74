"""Gradients of napkin operators on napkin's kernels, without a GPU.

The operators' autograd runs the with-saves forward and the compiled backward diagram on CUDA
tensors. Here ``KERNEL_GRAD_DEVICES`` adds "cpu", so the same plumbing runs on CPU tensors with
the backward operators' CPU kernels (each backward diagram's PyTorch reference): the saves, the
forward that outputs them, the backward per set of inputs needing a gradient, cotangents, the
mapping of names, torch.compile's training graphs and dynamic axes are held here; the GPU tests
(test_torch_grad_gpu.py) hold the kernels themselves.
"""

from __future__ import annotations

import logging

import pytest
import torch
from functorch.compile import make_boxed_func

import napkin.torch as nt
import napkin.torch.ops as ops
from napkin.diagrams import Axis, Diagram, array, contract, gelu, rmsnorm
from napkin.errors import CodegenError, DiagramError

GPU = "h100"


@pytest.fixture(autouse=True)
def kernel_grads_on_cpu(monkeypatch):
    monkeypatch.setattr(ops, "KERNEL_GRAD_DEVICES", frozenset({"cuda", "cpu"}))


CASES = {
    "matmul": {"a": 6, "b": 5, "c": 4},
    "mlp": {"a": 8, "b": 16, "c": 32},
    "rmsnorm": {"r": 6, "x": 64},
    "layernorm": {"r": 7, "x": 48},
    "softmax": {"r": 5, "x": 32},
}


def inputs_of(o, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*axes, generator=g) for axes in o._in_axes]


def grads_of(fn, xs, cot, need=None):
    """Gradients of Σ outputs·cot with respect to copies of ``xs`` (those in ``need``)."""
    need = need or [True] * len(xs)
    a = [x.clone().requires_grad_(r) for x, r in zip(xs, need)]
    outs = fn(*a)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum((o * c).sum() for o, c in zip(outs, cot)).backward()
    return [x.grad for x in a]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_backward_operator_gives_autograds_gradients(name):
    o = nt.op(name, sizes=CASES[name], dtype="fp32", gpu=GPU)
    xs = inputs_of(o)
    cot = [torch.randn(*s) for s in o._out_shapes(xs)]
    mine = grads_of(o, xs, cot)
    want = grads_of(lambda *t: o.reference(*t), xs, cot)
    for n, a, b in zip(o.input_names, mine, want):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (name, n, (a - b).abs().max())
    pieces = o._grad_pieces()
    assert not isinstance(pieces, str), pieces
    full = tuple(True for _ in o.input_names)
    assert isinstance(pieces.backward[full], nt.NapkinOp)


def test_the_backward_runs_the_backward_operator_not_the_reference(monkeypatch):
    o = nt.op("rmsnorm", sizes={"r": 4, "x": 32}, dtype="fp32", gpu=GPU)
    xs = inputs_of(o)

    def refuse(*a, **k):
        raise AssertionError("the reference VJP ran")

    monkeypatch.setattr(o, "_vjp", refuse)
    calls = []
    b = o.backward_op()
    real = b.reference
    monkeypatch.setattr(b, "reference", lambda *t, **k: calls.append(1) or real(*t, **k))
    grads_of(o, xs, [torch.randn(4, 32)])
    assert calls, "the backward operator did not run"


def test_softmax_saves_its_output_and_the_backward_reads_it():
    o = nt.op("softmax", sizes={"r": 64, "x": 256}, dtype="bf16", gpu=GPU)
    assert o.saved_names == ("P",)
    b = o.backward_op()
    assert b.input_names == ("X", "dP", "P") and b.output_names == ("dX",)


def test_saved_arrays_come_from_the_with_saves_forward():
    o = nt.op("mlp", sizes={"a": 512, "b": 1024, "c": 4096}, dtype="bf16", gpu=GPU)
    pieces = o._grad_pieces()
    assert pieces.save == ("add",), pieces.choice
    assert pieces.forward is not o and pieces.forward.output_names == ("Y", "add")
    assert "add" in o.backward_op().input_names
    xs = [t.bfloat16() for t in inputs_of(o)]
    cot = [torch.randn(512, 4096).bfloat16()]
    mine = grads_of(o, xs, cot)
    want = grads_of(lambda *t: o.reference(*t), xs, cot)
    for a, b in zip(mine, want):
        assert (a.float() - b.float()).norm() <= 2e-2 * b.float().norm()


def test_a_save_set_keeping_a_norm_statistic_keeps_what_the_backward_would_recompute_from_it():
    # H (saved) was computed from the forward's Xn; recomputing Xn from the bf16 rstd would give
    # the backward another Xn, so every ranked set saving both also saves N and Xn
    r, x, c = Axis("r"), Axis("x"), Axis("c")
    X, g, W = array("X", r, x), array("g", x), array("W", c, x)
    Xn = (rmsnorm(X, over=x, name="N") * g).named("Xn")
    d = Diagram("norm_gelu", gelu(contract(Xn, W, over=x, out=(r, c), name="H"), name="Y"))
    o = nt.op(d, sizes={"r": 256, "x": 256, "c": 512}, dtype="bf16", gpu=GPU, grad=False)
    ranked = [c for c, _, _ in o._rank_saves(o.diagram, {"N_rstd", "H"})]
    assert frozenset({"N_rstd", "H", "N", "Xn"}) in ranked, ranked
    assert all({"N", "Xn"} <= c for c in ranked if {"N_rstd", "H"} <= c), ranked
    assert frozenset({"N_rstd"}) in ranked  # nothing saved was computed from N: recomputing is consistent


def test_a_log_sum_exp_is_saved_only_where_its_kernels_keep_it_in_fp32(caplog):
    """At these sizes the model ranks first the set with attention's P_lse (the forward's fused
    attention writes it in fp32), but the backward's plan reads it in kernels of maps, in bf16
    (P = exp(S - lse) off by up to 3 %): that set is dropped, and the next one runs."""
    from napkin.perfmodel.saving import save_set

    sizes = dict(q=320, e=256, h=4, d=64, f=704)
    o = nt.op("transformer_block", sizes=sizes, dtype="bf16", gpu=GPU, grad=False)
    with caplog.at_level(logging.INFO, logger="napkin.torch.ops"):
        pieces = o._grad_pieces()
    assert not isinstance(pieces, str), pieces
    ranked = o._rank_saves(o.diagram, pieces.choice.save)
    assert "P_lse" in ranked[0][0]  # what the times alone pick
    assert "P_lse" not in pieces.save and frozenset(pieces.save) == pieces.ranked[0][0]
    assert save_set(o.diagram, pieces.save) == frozenset(pieces.save)
    assert ops._rounded_lse(pieces, o.backward_op(), {"P_lse"}) == {}
    assert any("not saving P_lse" in r.getMessage() for r in caplog.records)


def test_each_set_of_inputs_needing_a_gradient_gets_its_own_backward():
    o = nt.op("matmul", sizes={"a": 6, "b": 5, "c": 3}, dtype="fp32", gpu=GPU)
    xs = inputs_of(o)
    cot = [torch.randn(6, 3)]
    gA, gB = grads_of(o, xs, cot, need=[False, True])
    assert gA is None and torch.allclose(gB, xs[0].t() @ cot[0], atol=1e-5)
    keys = set(o._grad_pieces().backward)
    assert (False, True) in keys and (True, True) in keys
    assert o.backward_op("B").output_names == ("dB",)
    assert o.backward_op("B") is o._grad_pieces().backward[(False, True)]
    with pytest.raises(CodegenError, match="'Z' is not an input"):
        o.backward_op("Z")


def test_an_unused_output_gets_a_zero_cotangent():
    r, x = Axis("r"), Axis("x")
    X, R = array("X", r, x), array("R", r, x)
    d = Diagram("two_out", ((X * R).named("P"), (X + R).named("S")))
    o = nt.op(d, sizes={"r": 3, "x": 8}, dtype="fp32", gpu=GPU)
    Xt, Rt = (torch.randn(3, 8, requires_grad=True) for _ in "XR")
    P, S = o(Xt, Rt)
    P.sum().backward()  # S takes no part: its cotangent is None
    assert torch.allclose(Xt.grad, Rt.detach()) and torch.allclose(Rt.grad, Xt.detach())


def test_a_non_contiguous_cotangent_of_another_dtype_is_made_contiguous_and_cast():
    o = nt.op("rmsnorm", sizes={"r": 8, "x": 16}, dtype="fp32", gpu=GPU)
    xs = inputs_of(o)
    cot64 = torch.randn(16, 8, dtype=torch.float64).t()
    a = [x.clone().requires_grad_(True) for x in xs]
    o(*a).backward(cot64.float())
    b = [x.clone().requires_grad_(True) for x in xs]
    y = o(*b)
    torch.autograd.backward(y, cot64.float().contiguous())
    assert torch.allclose(a[0].grad, b[0].grad)


def test_where_napkin_cannot_build_the_backward_the_reference_serves_and_says_why_once(monkeypatch, caplog):
    import napkin.diagrams.grad as grad_mod

    def no_rule(*a, **k):
        raise DiagramError("no derivative rule for this test")

    monkeypatch.setattr(grad_mod, "grad", no_rule)
    o = nt.op("matmul", sizes={"a": 7, "b": 5, "c": 2}, dtype="fp32", gpu=GPU)
    xs = inputs_of(o)
    cot = [torch.randn(7, 2)]
    with caplog.at_level(logging.WARNING, logger="napkin.torch.ops"):
        for _ in range(2):
            gA, gB = grads_of(o, xs, cot)
    assert torch.allclose(gA, cot[0] @ xs[1].t(), atol=1e-5)
    said = [r for r in caplog.records if "no derivative rule for this test" in r.getMessage()]
    assert len(said) == 1 and "gradients from the PyTorch reference" in said[0].getMessage()
    with pytest.raises(CodegenError, match="no backward on napkin's kernels"):
        o.backward_op()


def test_grad_false_keeps_the_reference():
    o = nt.op("matmul", sizes={"a": 6, "b": 5, "c": 2}, dtype="fp32", gpu=GPU, grad=False)
    xs = inputs_of(o)
    grads_of(o, xs, [torch.randn(6, 2)])
    assert o._grad is None


def test_dynamic_axes_compile_a_dynamic_backward():
    o = nt.op("rmsnorm", sizes={"x": 64}, dynamic={"r": (1, 128)}, dtype="fp32", gpu=GPU)
    assert o.backward_op().dynamic == {"r": (1, 128)}
    for rows in (3, 77):
        xs = [torch.randn(rows, 64), torch.randn(64)]
        cot = [torch.randn(rows, 64)]
        mine = grads_of(o, xs, cot)
        want = grads_of(lambda *t: o.reference(*t), xs, cot)
        for a, b in zip(mine, want):
            assert torch.allclose(a, b, atol=1e-4)


def test_compiled_training_graphs_hold_the_with_saves_forward_and_the_backward_operator():
    from torch._dynamo.backends.common import aot_autograd

    o = nt.op("softmax", sizes={"r": 16, "x": 64}, dtype="fp32", gpu=GPU)
    pieces = o._grad_pieces()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    f = torch.compile(lambda x: (o(x * 2) ** 2).sum(), fullgraph=True,
                      backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    X = torch.randn(16, 64, requires_grad=True)
    f(X).backward()
    ref = X.detach().clone().requires_grad_(True)
    (torch.softmax(ref * 2, -1) ** 2).sum().backward()
    assert torch.allclose(X.grad, ref.grad, atol=1e-5)
    forward, backward = graphs

    def targets(gm):
        return {n.target for n in gm.graph.nodes if n.op == "call_function"}

    assert pieces.forward.overload in targets(forward)
    assert o.backward_op().overload in targets(backward)


def test_the_module_trains_on_the_backward_operator():
    m = nt.Module("rmsnorm", weights=["gamma"], sizes={"x": 32}, dynamic={"r": (1, 64)}, dtype="fp32", gpu=GPU)
    X = torch.randn(9, 32, requires_grad=True)
    m(X).pow(2).sum().backward()
    g = m.gamma.detach().clone().requires_grad_(True)
    X2 = X.detach().clone().requires_grad_(True)
    y = X2 * torch.rsqrt(X2.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    y.pow(2).sum().backward()
    assert torch.allclose(m.gamma.grad, g.grad, atol=1e-4) and torch.allclose(X.grad, X2.grad, atol=1e-4)
    assert not isinstance(m.op._grad_pieces(), str)


@pytest.mark.parametrize("name,sizes", [("rmsnorm", {"r": 777, "x": 1000}), ("layernorm", {"r": 4096, "x": 4096}),
                                        ("softmax", {"r": 333, "x": 1000}), ("rmsnorm", {"r": 4096, "x": 4096})])
def test_norm_and_softmax_backwards_are_one_rowwise_kernel_and_column_reductions(name, sizes):
    b = nt.op(name, sizes=sizes, dtype="bf16", gpu=GPU).backward_op()
    plan = b.compiled.plan
    fams = [pk.kernel.family for pk in plan.kernels]
    dx = [pk.kernel for pk in plan.kernels if "dX" in pk.kernel.boxes]
    assert len(dx) == 1 and dx[0].family == "rowwise", str(plan)
    # dX, dgamma and dbeta are ONE row-wise kernel and one launch: it adds dgamma and dbeta up per
    # block while it streams its rows (fp32 partials, added up by the blocks of the same launch:
    # arrival counters in a zeroed workspace), so dY and X cross HBM once
    assert fams == ["rowwise"], str(plan)
    assert set(dx[0].boxes) >= set(b.output_names), str(plan)
    prog = b.compiled.program
    launches = [k.name for k in prog.launches]
    assert len(launches) == 1, launches
    if len(b.output_names) > 1:
        ws, counters = prog.buffers
        assert counters.zeroed and not ws.zeroed
        splits = dx[0].options.splits
        assert ws.dtype == "fp32" and ws.shape == (len(b.output_names) - 1, splits, sizes["x"]), ws
        assert 1 <= splits <= sizes["r"]


def test_compiled_training_with_dynamic_shapes_runs_the_dynamic_backward():
    from torch._dynamo.backends.common import aot_autograd

    o = nt.op("rmsnorm", sizes={"x": 32}, dynamic={"r": (1, 256)}, dtype="fp32", gpu=GPU)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    f = torch.compile(lambda x, g: (o(x, g) ** 2).sum(), fullgraph=True, dynamic=True,
                      backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    gamma = torch.randn(32)
    for rows in (5, 77):
        X = torch.randn(rows, 32)
        a = [X.clone().requires_grad_(True), gamma.clone().requires_grad_(True)]
        f(*a).backward()
        r = [X.clone().requires_grad_(True), gamma.clone().requires_grad_(True)]
        (o.reference(*r)[0] ** 2).sum().backward()
        for x, y in zip(a, r):
            assert torch.allclose(x.grad, y.grad, atol=1e-4)
    backward_targets = {n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert o.backward_op().overload in backward_targets
    assert len(graphs) == 2, "one forward and one backward graph for every size"
