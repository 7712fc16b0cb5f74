"""napkin operators in PyTorch without a GPU: registration, the fake implementation's shapes,
``torch.compile(fullgraph=True)`` with the operator as one graph node, the CPU kernel (the
reference), gradients from the reference, dynamic axes, the nn.Module wrapper, and the errors.

Every compiled diagram here is lowered for an H100 profile and never compiled (no GPU): the CPU
kernel of each operator is the diagram's PyTorch reference, so these tests hold the
registration, the shapes and the tracing, and the GPU tests (test_torch_ops_gpu.py) the kernels.
"""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func

import napkin.torch as nt
from napkin.diagrams import Axis, Diagram, array, layernorm
from napkin.errors import CodegenError, LaunchError

GPU = "h100"


def residual_layernorm() -> Diagram:
    """Two outputs: Z = layernorm(X + R)·g + b and U = X + R."""
    r, x = Axis("r"), Axis("x")
    X, R, g, b = array("X", r, x), array("R", r, x), array("g", x), array("b", x)
    U = (X + R).named("U")
    Z = (layernorm(U, over=x, name="N") * g + b).named("Z")
    return Diagram("resid_ln", (Z, U))


def graph_of(fn, *args, dynamic=None):
    """Compile ``fn`` with fullgraph=True through a backend that records the graphs it gets
    (aot_eager underneath: fake tensors, functionalisation); returns (result, graphs)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=record)
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)(*args)
    return out, graphs


def targets(gm) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


# ----------------------------------------------------------------------------- registration


def test_an_op_is_registered_with_the_diagram_inputs_as_its_schema():
    mm = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU)
    assert mm.qualname.startswith("napkin::matmul_")
    schema = str(mm.overload._schema)
    assert "(Tensor A, Tensor B) -> Tensor" in schema, schema
    assert nt.registered()[mm.qualname] is mm
    # the same diagram and options give the same operator; other sizes another one
    assert nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU) is mm
    other = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 32}, dtype="fp32", gpu=GPU)
    assert other.qualname != mm.qualname


def test_several_outputs_are_a_tuple_in_the_schema_and_the_result():
    op = nt.op(residual_layernorm(), sizes={"r": 5, "x": 64}, dtype="fp32", gpu=GPU)
    assert str(op.overload._schema).endswith("-> (Tensor, Tensor)")
    X, R, g, b = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64), torch.randn(64)
    Z, U = op(X, R, g, b)
    assert torch.allclose(U, X + R)
    want = torch.nn.functional.layer_norm(X + R, (64,), g, b, eps=1e-5)
    assert torch.allclose(Z, want, atol=1e-4), (Z - want).abs().max()


def test_an_op_name_must_be_an_identifier():
    with pytest.raises(CodegenError, match="name 'my op'"):
        nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU, name="my op")


# ----------------------------------------------------------------------------- fake implementation


def test_the_fake_implementation_gives_shapes_dtypes_and_device_without_running():
    mm = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="bf16", gpu=GPU)
    A = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    B = torch.empty(8, 16, dtype=torch.bfloat16, device="meta")
    C = mm(A, B)
    assert C.device.type == "meta" and C.shape == (4, 16) and C.dtype == torch.bfloat16


def test_the_fake_implementation_follows_dynamic_axes_and_checks_the_fixed_ones():
    sm = nt.op("softmax", sizes={"x": 96}, dynamic={"r": (1, 4096)}, dtype="fp16", gpu=GPU)
    for rows in (1, 7, 4096):
        P = sm(torch.empty(rows, 96, dtype=torch.float16, device="meta"))
        assert P.shape == (rows, 96) and P.dtype == torch.float16
    with pytest.raises(LaunchError, match=r"X: shape is \(7, 95\), expected \(r, 96\)"):
        sm(torch.empty(7, 95, dtype=torch.float16, device="meta"))
    with pytest.raises(LaunchError, match="outside the dynamic range 1..4096"):
        sm(torch.empty(5000, 96, dtype=torch.float16, device="meta"))


def test_wrong_inputs_are_one_launch_error_naming_the_input():
    mm = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU)
    A, B = torch.randn(4, 8), torch.randn(8, 16)
    with pytest.raises(LaunchError, match=r"^A: dtype is torch.float64, expected torch.float32$"):
        mm(A.double(), B)
    with pytest.raises(LaunchError, match=r"^B: shape is \(8, 17\), expected \(8, 16\)$"):
        mm(A, torch.randn(8, 17))
    with pytest.raises(LaunchError, match=r"^B: has 3 axes"):
        mm(A, B[None])
    with pytest.raises(LaunchError, match="B: is on meta, the other inputs on cpu"):
        mm(A, B.to("meta"))


def test_an_op_takes_its_inputs_by_name_too():
    mm = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU)
    A, B = torch.randn(4, 8), torch.randn(8, 16)
    assert torch.equal(mm(B=B, A=A), mm(A, B)) and torch.equal(mm(A, B=B), mm(A, B))
    with pytest.raises(LaunchError, match="has no input 'X'; its inputs are A, B"):
        mm(A, X=B)
    with pytest.raises(LaunchError, match="input A given twice"):
        mm(A, A=A)
    with pytest.raises(LaunchError, match=r"missing input\(s\) B"):
        mm(A=A)


# ----------------------------------------------------------------------------- the CPU kernel


def test_the_cpu_kernel_is_the_reference_rounded_to_the_output_dtype():
    mm = nt.op("matmul", sizes={"a": 33, "b": 40, "c": 24}, dtype="bf16", gpu=GPU)
    A = torch.randn(33, 40).bfloat16()
    B = torch.randn(40, 24).bfloat16()
    C = mm(A, B)
    assert C.dtype == torch.bfloat16
    assert torch.equal(C, (A.float() @ B.float()).bfloat16())


def test_a_non_contiguous_input_is_accepted_like_torch_operators_do():
    mm = nt.op("matmul", sizes={"a": 8, "b": 8, "c": 8}, dtype="fp32", gpu=GPU)
    A, B = torch.randn(8, 8), torch.randn(8, 8)
    assert torch.allclose(mm(A.t(), B), A.t() @ B, atol=1e-5)


# ----------------------------------------------------------------------------- torch.compile


def test_fullgraph_compile_keeps_the_op_as_one_node():
    mm = nt.op("matmul", sizes={"a": 16, "b": 32, "c": 8}, dtype="fp32", gpu=GPU)
    A, B = torch.randn(16, 32), torch.randn(32, 8)
    out, graphs = graph_of(lambda a, b: torch.relu(mm(a, b)) + 1, A, B)
    assert torch.allclose(out, torch.relu(A @ B) + 1, atol=1e-5)
    assert len(graphs) == 1
    assert mm.overload in targets(graphs[0])


def test_compile_with_dynamic_shapes_traces_once_for_every_size_in_the_range():
    sm = nt.op("softmax", sizes={"x": 64}, dynamic={"r": (1, 1024)}, dtype="fp32", gpu=GPU)
    from torch._dynamo.backends.common import aot_autograd

    graphs = []
    backend = aot_autograd(fw_compiler=lambda gm, ex: graphs.append(gm) or make_boxed_func(gm.forward))
    torch._dynamo.reset()
    f = torch.compile(lambda x: sm(x) * 2, fullgraph=True, backend=backend, dynamic=True)
    for rows in (3, 17, 600):
        X = torch.randn(rows, 64)
        assert torch.allclose(f(X), torch.softmax(X, -1) * 2, atol=1e-5)
    assert len(graphs) == 1, f"{len(graphs)} graphs: the fake implementation must follow the symbolic size"


def test_fullgraph_compile_of_a_module_with_weights():
    ln = nt.Module("layernorm", weights=("gamma", "beta"), sizes={"x": 32}, dynamic={"r": (1, 256)},
                   dtype="fp32", gpu=GPU, requires_grad=False)
    X = torch.randn(9, 32)
    out, graphs = graph_of(ln, X)
    want = torch.nn.functional.layer_norm(X, (32,), ln.gamma, ln.beta, eps=1e-5)
    assert torch.allclose(out, want, atol=1e-4)
    assert len(graphs) == 1 and ln.op.overload in targets(graphs[0])


# ----------------------------------------------------------------------------- gradients


def test_gradients_come_from_the_reference():
    mm = nt.op("matmul", sizes={"a": 6, "b": 5, "c": 4}, dtype="fp32", gpu=GPU)
    A = torch.randn(6, 5, requires_grad=True)
    B = torch.randn(5, 4, requires_grad=True)
    G = torch.randn(6, 4)
    (mm(A, B) * G).sum().backward()
    assert torch.allclose(A.grad, G @ B.detach().t(), atol=1e-5)
    assert torch.allclose(B.grad, A.detach().t() @ G, atol=1e-5)


def test_only_the_inputs_that_need_a_gradient_get_one():
    mm = nt.op("matmul", sizes={"a": 6, "b": 5, "c": 4}, dtype="fp32", gpu=GPU)
    A = torch.randn(6, 5)
    B = torch.randn(5, 4, requires_grad=True)
    mm(A, B).sum().backward()
    assert A.grad is None and torch.allclose(B.grad, A.t() @ torch.ones(6, 4), atol=1e-5)


def test_gradients_of_two_outputs_match_autograd_of_the_same_expression():
    op = nt.op(residual_layernorm(), sizes={"r": 4, "x": 16}, dtype="fp32", gpu=GPU)
    args = [torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.randn(16)]
    mine = [a.clone().requires_grad_(True) for a in args]
    ref = [a.clone().requires_grad_(True) for a in args]
    gz, gu = torch.randn(4, 16), torch.randn(4, 16)
    Z, U = op(*mine)
    ((Z * gz).sum() + (U * gu).sum()).backward()
    X, R, g, b = ref
    U2 = X + R
    Z2 = torch.nn.functional.layer_norm(U2, (16,), g, b, eps=1e-5)
    ((Z2 * gz).sum() + (U2 * gu).sum()).backward()
    for a, r in zip(mine, ref):
        assert torch.allclose(a.grad, r.grad, atol=1e-4), (a.grad - r.grad).abs().max()


def test_compiled_training_graphs_hold_the_op_forward_and_the_reference_backward():
    from torch._dynamo.backends.common import aot_autograd

    mm = nt.op("matmul", sizes={"a": 6, "b": 5, "c": 4}, dtype="fp32", gpu=GPU)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    f = torch.compile(lambda a, b: (mm(a, b) * 3).sum(), fullgraph=True,
                      backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    A = torch.randn(6, 5, requires_grad=True)
    B = torch.randn(5, 4)
    f(A, B).backward()
    assert torch.allclose(A.grad, 3 * torch.ones(6, 4) @ B.t(), atol=1e-5)
    forward, backward = graphs
    assert mm.overload in targets(forward) and mm.overload not in targets(backward)


# ----------------------------------------------------------------------------- the module


def test_the_module_holds_the_weights_and_takes_the_other_inputs():
    B0 = torch.randn(8, 16)
    lin = nt.Module("matmul", weights={"B": B0}, sizes={"b": 8, "c": 16}, dynamic={"a": (1, 64)}, dtype="fp32",
                    gpu=GPU)
    assert [n for n, _ in lin.named_parameters()] == ["B"]
    assert lin.activation_names == ("A",) and torch.equal(lin.B.detach(), B0)
    assert "matmul" in repr(lin) and "weights (B)" in repr(lin)
    A = torch.randn(5, 8)
    assert torch.allclose(lin(A), A @ B0, atol=1e-5)
    lin(A).sum().backward()
    assert torch.allclose(lin.B.grad, A.t() @ torch.ones(5, 16), atol=1e-5)
    state = lin.state_dict()
    assert set(state) == {"B"}


def test_the_module_initialises_a_weight_given_by_name():
    m = nt.Module("rmsnorm", weights=["gamma"], sizes={"x": 256}, dynamic={"r": (1, 64)}, dtype="fp32", gpu=GPU)
    assert m.gamma.shape == (256,) and 0 < float(m.gamma.detach().std()) < 1
    one = nt.Module("rmsnorm", weights="gamma", sizes={"x": 256}, dynamic={"r": (1, 64)}, dtype="fp32", gpu=GPU)
    assert [n for n, _ in one.named_parameters()] == ["gamma"]  # a string is one name, not its letters


def test_the_module_refuses_unknown_dynamic_or_misshapen_weights():
    with pytest.raises(CodegenError, match="has no input 'W'"):
        nt.Module("matmul", weights=("W",), sizes={"a": 4, "b": 8, "c": 16}, gpu=GPU)
    with pytest.raises(CodegenError, match="weight A carries the dynamic axis a"):
        nt.Module("matmul", weights=("A",), sizes={"b": 8, "c": 16}, dynamic={"a": (1, 8)}, gpu=GPU)
    with pytest.raises(CodegenError, match=r"weight B has shape \(8, 15\), expected \(8, 16\)"):
        nt.Module("matmul", weights={"B": torch.zeros(8, 15)}, sizes={"a": 4, "b": 8, "c": 16}, gpu=GPU)


def test_cuda_graph_needs_cuda_example_inputs():
    mm = nt.op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu=GPU)
    with pytest.raises(LaunchError, match="example input 0 is not a CUDA tensor"):
        nt.cuda_graph(mm, torch.randn(4, 8), torch.randn(8, 16))
