"""Gradients on napkin's kernels, on the GPU: the backward operators of matmul, mlp, rmsnorm,
layernorm and softmax against torch.autograd of the float64 reference (fresh random inputs,
sizes that are no multiple of any tile, NaN-poisoned outputs), the autograd kernel running them
(the reference VJP refused), torch.compile with inductor, dynamic rows, and a transformer_block
training step through :class:`napkin.torch.Module`.

The error of a gradient is ``‖g − g_ref‖₂ / ‖g_ref‖₂`` over all its elements, with ``g_ref`` the
float64 autograd of the diagram's reference on the same (bf16) inputs and cotangent; the bound is
1e-2 (bf16 outputs and intermediates, fp32 accumulation).
"""

from __future__ import annotations

import pytest
import torch

import napkin.torch as nt
from napkin.diagrams.reference import run_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = 1e-2

CASES = {
    "matmul": {"a": 300, "b": 200, "c": 136},
    "mlp": {"a": 333, "b": 200, "c": 520},
    "rmsnorm": {"r": 777, "x": 1000},
    "layernorm": {"r": 501, "x": 1000},
    "softmax": {"r": 333, "x": 1000},
}


def rel_err(got, want) -> float:
    g, w = got.double(), want.double()
    return float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w).clamp_min(1e-300))


def fresh(shape, seed, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)


def reference_grads(o, xs, cots, need=None):
    """float64 autograd of the diagram's reference: the gradients of Σ outputs·cotangents."""
    need = need or [True] * len(xs)
    a = [x.detach().double().requires_grad_(r) for x, r in zip(xs, need)]
    out = run_reference(o.diagram, dict(zip(o.input_names, a)), dtype=torch.float64)
    loss = sum((out[n] * c.double()).sum() for n, c in zip(o.output_names, cots))
    loss.backward()
    return [x.grad for x in a]


@pytest.fixture
def no_reference_vjp(monkeypatch):
    """The reference VJP refused: any gradient must come from the backward operator."""
    def refuse(self, *a, **k):
        raise AssertionError("the reference VJP ran")

    monkeypatch.setattr(nt.NapkinOp, "_vjp", refuse)


@pytest.mark.parametrize("name", sorted(CASES))
def test_autograd_runs_the_backward_kernels(name, no_reference_vjp):
    o = nt.op(name, sizes=CASES[name], dtype="bf16")
    assert not isinstance(o._grad_pieces(), str), o._grad_pieces()
    for seed in (1, 2):  # fresh inputs each time: nothing left from a run before passes for a result
        xs = [fresh(axes, seed * 10 + i, 0.5 if name in ("mlp", "matmul") else 1.0)
              for i, axes in enumerate(o._in_axes)]
        cots = [fresh(s, seed * 10 + 9) for s in o._out_shapes(xs)]
        a = [x.clone().requires_grad_(True) for x in xs]
        outs = o(*a)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs, cots)
        want = reference_grads(o, xs, cots)
        for n, x, w in zip(o.input_names, a, want):
            assert x.grad is not None and x.grad.dtype == torch.bfloat16
            assert torch.isfinite(x.grad).all(), (name, n)
            err = rel_err(x.grad, w)
            assert err <= TOL, f"{name} d{n}: relative error {err:.2e}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_backward_operator_writes_every_element_of_nan_poisoned_outputs(name):
    o = nt.op(name, sizes=CASES[name], dtype="bf16")
    b = o.backward_op()
    xs = [fresh(axes, 40 + i, 0.5) for i, axes in enumerate(o._in_axes)]
    cots = [fresh(s, 49) for s in o._out_shapes(xs)]
    fwd = o._grad_pieces().forward
    outs = fwd(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    env = dict(zip(o.input_names, xs))
    env.update({"d" + n: c for n, c in zip(o.output_names, cots)})
    env.update(zip(o.saved_names, (outs[i] for i in o._grad_pieces().saved_index)))
    poisoned = {n: torch.full(tuple(xs[o.input_names.index(n[1:])].shape), float("nan"), device=DEV,
                              dtype=torch.bfloat16) for n in b.output_names}
    b.compiled(*(env[n] for n in b.input_names), out=poisoned)
    want = reference_grads(o, xs, cots)
    for n, w in zip(o.input_names, want):
        g = poisoned["d" + n]
        assert torch.isfinite(g).all(), f"{name} d{n}: elements left unwritten (NaN)"
        assert rel_err(g, w) <= TOL, f"{name} d{n}: relative error {rel_err(g, w):.2e}"


def test_only_the_inputs_needing_a_gradient_are_computed(no_reference_vjp):
    o = nt.op("rmsnorm", sizes=CASES["rmsnorm"], dtype="bf16")
    X, g = fresh((777, 1000), 61), fresh((1000,), 62)
    gw = g.clone().requires_grad_(True)
    cot = fresh((777, 1000), 63)
    o(X, gw).backward(cot)
    want = reference_grads(o, [X, g], [cot], need=[False, True])
    assert rel_err(gw.grad, want[1]) <= TOL
    assert (False, True) in o._grad_pieces().backward


def test_inductor_compiles_the_training_step(no_reference_vjp):
    o = nt.op("layernorm", sizes={"r": 256, "x": 768}, dtype="bf16")
    torch._dynamo.reset()
    step = torch.compile(lambda x, g, b: (o(x * 2, g, b).float() ** 2).sum(), fullgraph=True)
    xs = [fresh((256, 768), 71), fresh((768,), 72), fresh((768,), 73)]
    a = [x.clone().requires_grad_(True) for x in xs]
    step(*a).backward()
    r = [x.detach().double().requires_grad_(True) for x in xs]
    (torch.nn.functional.layer_norm(r[0] * 2, (768,), r[1], r[2], eps=1e-5) ** 2).sum().backward()
    for x, w in zip(a, r):
        assert rel_err(x.grad, w.grad) <= 2 * TOL


def test_dynamic_rows_share_one_backward(no_reference_vjp):
    o = nt.op("rmsnorm", sizes={"x": 512}, dynamic={"r": (1, 4096)}, dtype="bf16")
    for rows in (5, 1000, 4096):
        X, g, cot = fresh((rows, 512), rows), fresh((512,), 7), fresh((rows, 512), rows + 1)
        a = [X.clone().requires_grad_(True), g.clone().requires_grad_(True)]
        o(*a).backward(cot)
        for x, w in zip(a, reference_grads(o, [X, g], [cot])):
            assert rel_err(x.grad, w) <= TOL, rows


def block_weights(q, e, h, d, f, seed=0):
    """transformer_block's weights at a fan-in scale (1/√fan-in), the norms' gains near 1."""
    s = {"g1": ((e,), None), "Wq": ((h, d, e), e), "Wk": ((h, d, e), e), "Wv": ((h, d, e), e),
         "Wo": ((e, h, d), h * d), "g2": ((e,), None), "W1": ((f, e), e), "b1": ((f,), None), "W2": ((e, f), f)}
    out = {}
    for i, (n, (shape, fan)) in enumerate(s.items()):
        t = fresh(shape, seed * 100 + i, 1.0 / fan ** 0.5 if fan else 0.1, dtype=torch.float32)
        out[n] = (t + 1.0 if n.startswith("g") else t).bfloat16()
    return out


@pytest.mark.parametrize("sizes", [dict(q=320, e=256, h=4, d=64, f=704), dict(q=512, e=512, h=4, d=128, f=1376)])
def test_a_transformer_block_training_step_matches_autograd(sizes, no_reference_vjp):
    w = block_weights(**sizes)
    m = nt.Module("transformer_block", weights=w, sizes=sizes, dtype="bf16").to(DEV)
    X = fresh((sizes["q"], sizes["e"]), 5).requires_grad_(True)
    cot = fresh((sizes["q"], sizes["e"]), 6)
    Y = m(X)
    Y.backward(cot)
    o = m.op
    ins = [X.detach() if n == "X" else getattr(m, n).detach() for n in o.input_names]
    want = reference_grads(o, ins, [cot])
    errs = {}
    for n, ref in zip(o.input_names, want):
        got = X.grad if n == "X" else getattr(m, n).grad
        assert got is not None and torch.isfinite(got).all(), n
        errs[n] = rel_err(got, ref)
    assert max(errs.values()) <= TOL, errs
