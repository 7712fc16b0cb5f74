"""tril and triu: the triangle of an array over two of its axes, +0.0 elsewhere, as torch.tril and
torch.triu (their reference, CUDA form, parameter checks and derivative), and a triangular matrix
product planned as one contraction with the mask in its epilogue."""

from __future__ import annotations

import math

import pytest
import torch

import napkin.diagrams as nd
from napkin.codegen.render import Code, map_expr
from napkin.errors import DiagramError

A_, K_, N_, H_ = nd.axes("a k n h")


@pytest.mark.parametrize("fn, torch_fn", [(nd.tril, torch.tril), (nd.triu, torch.triu)])
@pytest.mark.parametrize("diagonal", [0, 1, -2, 7, -9])
@pytest.mark.parametrize("shape", [(5, 6), (6, 5), (1, 1)])
def test_the_reference_is_torchs(fn, torch_fn, diagonal, shape):
    d = nd.Diagram("t", fn(nd.array("X", A_, N_), A_, N_, diagonal=diagonal, name="Y")).bind(a=shape[0], n=shape[1])
    x = torch.randn(*shape, dtype=torch.float64)
    x[0, -1], x[-1, 0] = math.nan, -0.0  # a NaN in a corner each side of the diagonal, a -0.0 kept or zeroed
    got = d.reference({"X": x}, dtype=torch.float64)["Y"]
    want = torch_fn(x, diagonal)
    assert torch.equal(got.nan_to_num(123.0), want.nan_to_num(123.0))
    assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_the_triangle_is_taken_over_the_named_axes_of_a_batch():
    """X[h, a, n]: the triangle of each head's a × n matrix; the axes may be named in any order of
    the array's (tril over (n, a) is triu over (a, n) transposed)."""
    d = nd.Diagram("t", nd.tril(nd.array("X", H_, A_, N_), A_, N_, name="Y")).bind(h=3, a=4, n=5)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    assert torch.equal(d.reference({"X": x}, dtype=torch.float64)["Y"], torch.tril(x))
    d2 = nd.Diagram("t", nd.tril(nd.array("X", A_, N_), N_, A_, name="Y")).bind(a=4, n=5)
    x2 = torch.randn(4, 5, dtype=torch.float64)
    assert torch.equal(d2.reference({"X": x2}, dtype=torch.float64)["Y"], torch.triu(x2))


def test_the_cuda_forms_compare_integers():
    s, i, j = Code("s"), Code("i_a"), Code("i_n")
    assert map_expr("tril", [s], [0], [i, j]) == "((i_n <= i_a + 0LL) ? s : 0.0f)"
    assert map_expr("triu", [s], [-3], [i, j]) == "((i_n >= i_a + (-3LL)) ? s : 0.0f)"


@pytest.mark.parametrize("bad", [0.5, math.nan, math.inf, 2 ** 63])
def test_the_diagonal_is_a_finite_integer(bad):
    with pytest.raises(DiagramError, match="tril: diagonal"):
        nd.tril(nd.array("X", A_, N_), A_, N_, diagonal=bad)
    with pytest.raises(DiagramError, match="triu: diagonal"):
        nd.triu(nd.array("X", A_, N_), A_, N_, diagonal=bad)


def test_the_axes_must_be_the_arrays():
    with pytest.raises(DiagramError):
        nd.tril(nd.array("X", A_, N_), A_, K_)


@pytest.mark.parametrize("fn, torch_fn", [(nd.tril, torch.tril), (nd.triu, torch.triu)])
def test_the_derivative_keeps_the_triangle_of_the_cotangent(fn, torch_fn):
    C = nd.contract(nd.array("A", A_, K_), nd.array("B", K_, N_), over=K_)
    d = nd.Diagram("tri", nd.gelu(fn(C, A_, N_, diagonal=1), name="Y")).bind(a=5, k=3, n=6)
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, 6, dtype=torch.float64)
    torch.nn.functional.gelu(torch_fn(a @ b, 1)).backward(dy)
    got = d.grad().reference({"A": a.detach(), "B": b.detach(), "dY": dy}, dtype=torch.float64)
    torch.testing.assert_close(got["dA"], a.grad)
    torch.testing.assert_close(got["dB"], b.grad)


def test_a_triangular_product_is_one_contraction_kernel():
    from napkin.codegen.planner import derive

    C = nd.contract(nd.array("A", A_, K_), nd.array("B", K_, N_), over=K_)
    d = nd.Diagram("tri", nd.tril(C, A_, N_, name="Y"))
    for gpu, dtype in (("h200", "bf16"), ("h100", "fp32"), ("a100", "bf16")):
        plan = derive(d, gpu, dtype, sizes=dict(a=1000, k=520, n=776)).plan
        assert [k.family for k in plan.kernels] == ["contraction"], plan.summary()


def test_the_planned_triangle_runs_as_the_reference_on_the_interpreter():
    import numpy as np

    from napkin.codegen.planner import derive
    from napkin.perfmodel import interpret

    C = nd.contract(nd.array("A", A_, K_), nd.array("B", K_, N_), over=K_)
    d = nd.Diagram("tri", nd.gelu(nd.triu(C, A_, N_, diagonal=-3), name="Y"))
    plan = derive(d, "h100", sizes=dict(a=200, k=64, n=256)).plan
    rng = np.random.default_rng(0)
    ins = {v.name: rng.standard_normal([a.bound_size for a in v.axes]) for v in plan.diagram.inputs}
    got = np.asarray(interpret(plan.schedule, ins).outputs["Y"])
    want = plan.diagram.reference({k: torch.from_numpy(v) for k, v in ins.items()}, dtype=torch.float64)["Y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert (got[np.triu_indices(200, -3, 256)] != 0).all() and (np.tril(got, -4) == 0).all()
