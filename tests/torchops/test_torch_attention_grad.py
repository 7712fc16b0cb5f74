"""Attention's gradients through napkin.torch, without a GPU: the with-saves forward is the attention
kernel that stores the log-sum-exp in fp32, so the operator's checks and fake outputs follow the
compiled diagram's dtypes, and a saved array reaches the backward operator in the dtype its plan
reads (cast where an unfused backward reads the diagram's bf16). As in test_torch_grad.py,
``KERNEL_GRAD_DEVICES`` adds "cpu" so the plumbing runs on the operators' CPU kernels.
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


def test_the_saved_log_sum_exp_is_fp32_and_the_gradients_match():
    sizes = {"h": 2, "q": 128, "x": 128, "d": 64}
    o = nt.op("mha", sizes=sizes, dtype="bf16", gpu="h100")
    pieces = o._grad_pieces()
    assert "P_lse" in pieces.save
    fwd = pieces.forward
    stored = dict(zip(fwd.output_names, fwd._out_dtypes))
    if "attention" in fwd.compiled.plan.families:  # one kernel: the log-sum-exp in fp32
        assert stored["P_lse"] == torch.float32
    full = tuple(True for _ in o.input_names)
    bwd = pieces.backward[full]
    assert dict(zip(bwd.input_names, bwd._in_dtypes))["P_lse"] == \
        {"fp32": torch.float32, "bf16": torch.bfloat16}[bwd.compiled._dtypes["P_lse"]]

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
