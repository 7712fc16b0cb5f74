"""Attention's gradients through napkin.torch, without a GPU: the with-saves forward is the attention
kernel that stores the log-sum-exp in fp32 and the fused backward reads it in fp32; where the
backward's plan would read it in the diagram's bf16, it is not saved and the next ranked save set
runs. As in test_torch_grad.py, ``KERNEL_GRAD_DEVICES`` adds "cpu" so the plumbing runs on the
operators' CPU kernels.
"""

from __future__ import annotations

import pytest
import torch

import napkin.torch as nt
import napkin.torch.ops as ops
from napkin.diagrams import library


@pytest.fixture(autouse=True)
def kernel_grads_on_cpu(monkeypatch):
    monkeypatch.setattr(ops, "KERNEL_GRAD_DEVICES", frozenset({"cuda", "cpu"}))


def test_a_saved_log_sum_exp_is_written_and_read_in_fp32():
    # at a size where the fused attention backward runs, the forward saves the log-sum-exp
    o = nt.op("mha", sizes={"h": 16, "q": 2048, "x": 2048, "d": 128}, dtype="bf16", gpu="h100")
    pieces = o._grad_pieces()
    assert "P_lse" in pieces.save
    stored = dict(zip(pieces.forward.output_names, pieces.forward._out_dtypes))
    assert stored["P_lse"] == torch.float32
    bwd = pieces.backward[tuple(True for _ in o.input_names)]
    assert bwd.compiled.plan.families == ("attention_bwd",)
    assert dict(zip(bwd.input_names, bwd._in_dtypes))["P_lse"] == torch.float32


def test_a_log_sum_exp_kernels_would_round_is_not_saved_and_the_gradients_match(caplog):
    # at a small size the backward's plan is kernels of maps, which store and read the diagram's
    # bf16: P = exp(S - lse) would be off by up to 3 %, so the next ranked save set runs
    sizes = {"h": 2, "q": 128, "x": 128, "d": 64}
    o = nt.op("mha", sizes=sizes, dtype="bf16", gpu="h100")
    with caplog.at_level("INFO", logger="napkin.torch.ops"):
        pieces = o._grad_pieces()
    assert "P_lse" in {n for entry in pieces.ranked for n in entry[0]}  # the model did rank it
    assert "P_lse" not in pieces.save
    assert "not saving P_lse" in caplog.text

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*axes, generator=g).bfloat16().requires_grad_(True) for axes in o._in_axes]
    out = o(*xs)
    cot = torch.randn(out.shape, generator=g).bfloat16()
    (out.float() * cot.float()).sum().backward()
    ref = [x.detach().float().requires_grad_(True) for x in xs]
    want = library.get("mha").bind(**sizes).reference(dict(zip(o.input_names, ref)), dtype=torch.float32)
    (want["O"] * cot.float()).sum().backward()
    for n, x, r in zip(o.input_names, xs, ref):
        err = float((x.grad.float() - r.grad).norm() / r.grad.norm())
        assert err < 2e-2, (n, err)
