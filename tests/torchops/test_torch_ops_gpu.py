"""napkin operators on the GPU: the kernels against the float32 reference, the prepared fast
path, ``torch.compile(fullgraph=True)`` with inductor and with CUDA graphs
(``mode="reduce-overhead"``), capture with :func:`napkin.torch.cuda_graph` and with
``torch.cuda.graph`` by hand, the current stream, dynamic sizes (one kernel for a contraction's
range, one per size for a row-wise one), two outputs, the module's forward and backward, and
synchronous launches. The host cost of a launch is measured and reported here, not asserted
(benchmarks/overhead.py measures it against its target).
"""

from __future__ import annotations

import time

import pytest
import torch

import napkin.torch as nt
from napkin.codegen.api import CompiledDiagram
from napkin.diagrams import Axis, Diagram, array, layernorm

pytestmark = pytest.mark.gpu

DEV = "cuda"


def rand(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g).to(dtype)


def assert_near(got, want, tol=2e-2):
    """max |got - want| within ``tol`` of max |want| (bf16 outputs, fp32 accumulation)."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= tol * scale, f"max error {err:.3g} against max |want| {scale:.3g}"


def matmul_ref(A, B):
    return (A.float() @ B.float()).to(A.dtype)


@pytest.fixture(scope="module")
def mm():
    return nt.op("matmul", sizes={"a": 1000, "b": 1000, "c": 1000}, dtype="bf16")


def test_the_op_runs_the_kernels_on_cuda_tensors(mm):
    A, B = rand(1000, 1000), rand(1000, 1000, seed=1)
    C = mm(A, B)
    assert C.device.type == "cuda" and C.dtype == torch.bfloat16 and C.shape == (1000, 1000)
    assert_near(C, matmul_ref(A, B))
    assert isinstance(mm.compiled, CompiledDiagram) and mm.compiled.compile_seconds is not None


def test_repeated_calls_take_the_prepared_path(mm, monkeypatch, record_property):
    cd = mm.compiled
    A, B = rand(1000, 1000, seed=2), rand(1000, 1000, seed=3)
    cd(A, B)
    assert cd._last is not None

    def checked(*a, **k):
        raise AssertionError("the checked path ran for tensors the prepared path takes")

    monkeypatch.setattr(cd, "_call_checked", checked)
    for seed in range(3):  # new tensors each time: new pointers, new tensor maps
        A, B = rand(1000, 1000, seed=10 + seed), rand(1000, 1000, seed=20 + seed)
        assert_near(cd(A, B), matmul_ref(A, B))
    n = 300
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        cd(A, B)
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    record_property("host_us_per_call", round(host * 1e6, 2))
    print(f"prepared path: {host * 1e6:.1f} µs of host time per call (1000³ matmul, outputs allocated)")
    monkeypatch.undo()
    # an input one element into its storage is not 16-byte aligned: the checked path takes it
    # (the prepared launches read it with TMA) and still gives the right result
    base = rand(1000 * 1000 + 1, seed=4)
    A_off = base[1:].view(1000, 1000)
    assert A_off.data_ptr() % 16
    assert_near(cd(A_off, B), matmul_ref(A_off, B))


def test_fullgraph_compile_with_inductor(mm):
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.relu(mm(a * 0.5, b)) + 1, fullgraph=True)
    A, B = rand(1000, 1000, seed=5), rand(1000, 1000, seed=6)
    want = (torch.relu(matmul_ref(A * 0.5, B).float()) + 1)
    assert_near(f(A, B), want)
    assert_near(f(B, A), torch.relu(matmul_ref(B * 0.5, A).float()) + 1)


def test_compile_with_cuda_graphs_reduce_overhead(mm):
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: mm(a, b) * 2, fullgraph=True, mode="reduce-overhead")
    for seed in range(4):  # warm-up runs, the recording, then replays
        A, B = rand(1000, 1000, seed=30 + seed), rand(1000, 1000, seed=40 + seed)
        assert_near(f(A, B).clone(), matmul_ref(A, B).float() * 2)


def test_cuda_graph_capture_replays_on_new_inputs(mm):
    A, B = rand(1000, 1000, seed=7), rand(1000, 1000, seed=8)
    g = nt.cuda_graph(mm, A, B)
    A2, B2 = rand(1000, 1000, seed=9), rand(1000, 1000, seed=11)
    C = g(A2, B2)
    torch.cuda.synchronize()
    assert_near(C, matmul_ref(A2, B2))
    # writing into the static inputs and replaying skips the copies
    g.inputs[0].copy_(A)
    assert_near(g.replay().clone(), matmul_ref(A, B2))
    with pytest.raises(Exception, match=r"captured for \(1000, 1000\)"):
        g(A[:500], B)


def test_capture_by_hand_records_the_launch_on_the_capturing_stream(mm):
    """torch.cuda.graph captures on a side stream: the kernel is in the graph only if napkin
    launched it on the current stream."""
    A, B = rand(1000, 1000, seed=12), rand(1000, 1000, seed=13)
    mm(A, B)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C = mm(A, B)
    A.copy_(rand(1000, 1000, seed=14))
    graph.replay()
    torch.cuda.synchronize()
    assert_near(C, matmul_ref(A, B))


def test_launches_follow_a_side_stream(mm):
    A, B = rand(1000, 1000, seed=15), rand(1000, 1000, seed=16)
    mm(A, B)  # the first call prepares the launches (host work that must not eat the sleep below)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # the side stream is busy for ~0.1 s (long enough for a loaded host to reach the query);
        # the kernel must queue behind it
        torch.cuda._sleep(200_000_000)
        C = mm(A, B)
        done = torch.cuda.Event()
        done.record(s)
    assert not done.query(), "the side stream finished at once: the sleep did not run"
    done.synchronize()
    assert_near(C, matmul_ref(A, B))


def test_a_dynamic_matmul_serves_every_size_with_one_kernel():
    op = nt.op("matmul", sizes={"b": 512, "c": 384}, dynamic={"a": (1, 4096)}, dtype="bf16")
    B = rand(512, 384, seed=17)
    for rows in (1, 37, 1000, 4096):
        A = rand(rows, 512, seed=rows)
        assert_near(op(A, B), matmul_ref(A, B))
    assert op.compiled.sources == 1 and op.compiled.specialized == ()
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: op(a, b), fullgraph=True, dynamic=True)
    for rows in (5, 700):
        A = rand(rows, 512, seed=rows)
        assert_near(f(A, B), matmul_ref(A, B))


def test_a_dynamic_softmax_compiles_once_per_size():
    op = nt.op("softmax", sizes={"x": 1000}, dynamic={"r": (1, 8192)}, dtype="fp32")
    sizes = (1, 100, 3000)
    for rows in sizes:
        X = rand(rows, 1000, dtype=torch.float32, seed=rows)
        assert_near(op(X), torch.softmax(X, -1), tol=1e-5)
    assert op.compiled.specialized and op.compiled.sources == len(sizes)


def resid_ln() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, R, g, b = array("X", r, x), array("R", r, x), array("g", x), array("b", x)
    U = (X + R).named("U")
    return Diagram("resid_ln", ((layernorm(U, over=x, name="N") * g + b).named("Z"), U))


def test_two_outputs_on_cuda():
    op = nt.op(resid_ln(), sizes={"r": 300, "x": 1024}, dtype="fp32")
    X, R = rand(300, 1024, dtype=torch.float32), rand(300, 1024, dtype=torch.float32, seed=1)
    g, b = rand(1024, dtype=torch.float32, seed=2), rand(1024, dtype=torch.float32, seed=3)
    Z, U = op(X, R, g, b)
    assert_near(U, X + R, tol=1e-6)
    assert_near(Z, torch.nn.functional.layer_norm(X + R, (1024,), g, b, eps=1e-5), tol=1e-4)


def test_the_module_on_cuda_forward_and_backward():
    B0 = rand(256, 128, seed=21)
    lin = nt.Module("matmul", weights={"B": B0}, sizes={"b": 256, "c": 128}, dynamic={"a": (1, 1024)},
                    dtype="bf16").cuda()
    A = rand(77, 256, seed=22).requires_grad_(True)
    C = lin(A)
    assert_near(C, matmul_ref(A.detach(), B0))
    C.float().sum().backward()
    ones = torch.ones(77, 128, device=DEV)
    assert_near(A.grad, (ones @ B0.float().t()).bfloat16())
    assert_near(lin.B.grad, (A.detach().float().t() @ ones).bfloat16())


def test_synchronous_launches_are_prepared_when_asked(monkeypatch):
    monkeypatch.setenv("NAPKIN_SYNC_LAUNCH", "1")
    op = nt.op("matmul", sizes={"a": 96, "b": 64, "c": 80}, dtype="bf16")
    A, B = rand(96, 64), rand(64, 80, seed=1)
    assert_near(op(A, B), matmul_ref(A, B))
    runner = op.compiled._runners[torch.cuda.current_device()]
    assert all(launch.sync for launch in runner.launches)
