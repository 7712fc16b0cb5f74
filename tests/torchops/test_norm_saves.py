"""A norm's saved statistics come out of the forward's one row kernel (issue #15, rows of 5000).

The backward of a layernorm reads its mean and rstd (8 bytes a row) or reduces the row again. The
forward that writes them (:func:`napkin.diagrams.grad.forward_with_saves`) writes the norm out as
its statistics' boxes, so the row-wise chain runs the norm and its statistics in one kernel; with
the norm box kept, the statistics took a second kernel (27.5 + 15.2 µs predicted at 4096 × 5000
on the H100), and napkin.torch's ranking of save sets then preferred saving nothing: a backward of
three kernels, measured 108.3 µs against 72.9 with the statistics saved. CPU only (plans and the
references); the kernels run in test_torch_grad_gpu.py and benchmarks/backward.py.
"""

from __future__ import annotations

import pytest
import torch

import napkin.torch as nt
import napkin.torch.ops as ops
from napkin.codegen.plancache import derive_cached
from napkin.diagrams import library
from napkin.diagrams.grad import forward_with_saves, grad
from napkin.diagrams.ops import Norm

GPU = "h100"
STATS = {"layernorm": ("N_mean", "N_rstd"), "rmsnorm": ("N_rstd",)}


@pytest.mark.parametrize("name", sorted(STATS))
@pytest.mark.parametrize("x", [4096, 5000])
def test_the_forward_with_saved_statistics_is_one_kernel(name, x):
    d = library.get(name).bind(r=4096, x=x).with_dtype("bf16")
    f = forward_with_saves(d, set(STATS[name]))
    assert not any(isinstance(v.op, Norm) for v in f.nodes)  # written out as its statistics' boxes
    plan = derive_cached(f, GPU, arch="sm_90a")
    assert len(plan.kernels) == 1, str(plan)
    assert set(STATS[name]) | {"Y"} <= set(plan.kernels[0].kernel.boxes)
    # as fast as the forward that writes no statistic (the model's 2 % noise): saving them is free
    plain = derive_cached(d, GPU, arch="sm_90a")
    assert plan.seconds <= plain.seconds * 1.02, (plan.seconds, plain.seconds)


def test_saving_only_the_norms_output_keeps_the_norm_box():
    d = library.get("layernorm").bind(r=64, x=256)
    f = forward_with_saves(d, {"N"})
    assert any(isinstance(v.op, Norm) for v in f.nodes) and f.output_names == ("Y", "N")


@pytest.mark.parametrize("name", sorted(STATS))
def test_the_written_out_norm_computes_the_norm(name):
    d = library.get(name).bind(r=5, x=40)
    save = set(STATS[name]) | {"N"}
    got = forward_with_saves(d, save).reference(dtype=torch.float64, seed=3)
    want = d.reference(dtype=torch.float64, seed=3, keep_intermediates=True)
    torch.testing.assert_close(got["Y"], want["Y"])
    torch.testing.assert_close(got["N"], want["N"])
    X = want["X"]
    if name == "layernorm":
        torch.testing.assert_close(got["N_mean"], X.mean(-1))
        torch.testing.assert_close(got["N_rstd"], torch.rsqrt(X.var(-1, unbiased=False) + 1e-5))
    else:
        torch.testing.assert_close(got["N_rstd"], torch.rsqrt(X.square().mean(-1) + 1e-6))


def test_layernorm_of_rows_of_5000_keeps_its_statistics():
    """The ranking of save sets by predicted forward + backward keeps mean and rstd at 4096 × 5000,
    and the backward it compiles is the one-launch row kernel."""
    o = nt.op("layernorm", sizes={"r": 4096, "x": 5000}, dtype="bf16", gpu=GPU)
    pieces = o._grad_pieces()
    assert not isinstance(pieces, str), pieces
    assert pieces.save == ("N_mean", "N_rstd"), pieces.ranked
    saved, fwd, bwd = pieces.ranked[0]
    nothing = next(t for t in pieces.ranked if not t[0])
    assert fwd + bwd < nothing[1] + nothing[2]
    assert len(pieces.forward.compiled.plan.kernels) == 1
    assert len(o.backward_op().compiled.plan.kernels) == 1


def test_the_backward_with_written_out_statistics_gives_autograds_gradients(monkeypatch):
    monkeypatch.setattr(ops, "KERNEL_GRAD_DEVICES", frozenset({"cuda", "cpu"}))
    o = nt.op("layernorm", sizes={"r": 6, "x": 5000}, dtype="fp32", gpu=GPU)
    pieces = o._grad_pieces()
    assert pieces.save == ("N_mean", "N_rstd"), pieces.ranked
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*a, generator=g) * 2 + 0.5 for a in o._in_axes]
    cot = torch.randn(6, 5000, generator=g)
    mine = [x.clone().requires_grad_(True) for x in xs]
    want = [x.clone().requires_grad_(True) for x in xs]
    (o(*mine) * cot).sum().backward()
    (o.reference(*want)[0] * cot).sum().backward()
    for n, a, b in zip(o.input_names, mine, want):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=n)
    assert set(pieces.save) <= set(grad(o.diagram, None, set(pieces.save)).input_names)
