"""Streamed rows on a GPU: rows that are not whole 16-byte vectors on the shifted grid, and the
inputs kept in shared memory, for every configuration the family proposes, against the float64
reference into NaN-poisoned outputs; inputs that start elsewhere in their 16-byte lines than the
grid's own (a view one value in), gathered inputs on the shifted grid, fp16, and rows shared by
the blocks of a cluster."""

from __future__ import annotations

import pytest

from napkin.codegen.families.rowwise import FAMILY
from napkin.codegen.prepare import prepare
from napkin.diagrams import library
from napkin.diagrams.reference import random_inputs

from test_rowwise_chain_gpu import run_chain  # pytest puts this folder on sys.path (no __init__.py)
from test_rowwise_streamed import _log_softmax, _softmax_vjp

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("make, sizes", [(_log_softmax, dict(r=9, x=50257)), (_softmax_vjp, dict(r=7, x=50257)),
                                         (_log_softmax, dict(r=5, x=65536)), (_softmax_vjp, dict(r=3, x=70001))])
def test_every_streamed_configuration(make, sizes, dtype):
    d = prepare(make(), sizes=sizes, dtype=dtype)
    cands = FAMILY.candidates(d, "h200", dtype)
    assert all(c.kernels[0].options.streamed for c in cands)
    if dtype == "bf16" and sizes["x"] <= 65536:
        assert any(c.kernels[0].options.row_in_smem for c in cands)
    for i, s in enumerate(cands):
        run_chain(make(), sizes, dtype, schedule=s, seed=i)


def _offset_view(t, by: int = 1):
    """``t``'s values in a tensor that starts ``by`` values into its storage (off its 16-byte lines)."""
    import torch

    flat = torch.empty(t.numel() + by, dtype=t.dtype, device=t.device)
    v = flat[by:].view(t.shape)
    v.copy_(t)
    return v


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("which", ["X", "out"])
def test_arrays_off_the_grids_lines(which, dtype):
    """The shift source (or the output) one value into its storage: the grid is shifted for the
    source's own lines, the other array's chunks take the unaligned paths."""
    import torch

    from napkin.codegen.api import compile

    sizes = dict(r=6, x=50257)
    d = prepare(_log_softmax(), sizes=sizes, dtype=dtype)
    x = random_inputs(d, device="cuda", seed=11)
    ref = d.reference({k: v.double() for k, v in x.items()}, dtype=torch.float64)["Y"]
    for s in FAMILY.candidates(d, "h200", dtype):
        cd = compile(_log_softmax(), sizes=sizes, dtype=dtype, schedule=s)
        ins = {"X": _offset_view(x["X"]) if which == "X" else x["X"]}
        out = torch.full_like(x["X"], float("nan"))
        out = _offset_view(out) if which == "out" else out
        cd(**ins, out={"Y": out})
        err = float((out.double() - ref).norm() / ref.norm())
        assert not torch.isnan(out).any() and err <= (1e-2 if dtype == "bf16" else 1e-5), (s.kernels[0].options, err)


def test_two_inputs_in_different_lines():
    """The softmax backward's P aligned, dP one value in: P fixes the shift, dP's chunks move as
    unaligned vectors (16-bit) or values, kept in shared memory or not."""
    import torch

    from napkin.codegen.api import compile

    sizes = dict(r=5, x=50257)
    d = prepare(_softmax_vjp(), sizes=sizes, dtype="bf16")
    x = random_inputs(d, device="cuda", seed=12)
    ref = d.reference({k: v.double() for k, v in x.items()}, dtype=torch.float64)["dX"]
    for s in FAMILY.candidates(d, "h200", "bf16"):
        cd = compile(_softmax_vjp(), sizes=sizes, dtype="bf16", schedule=s)
        out = torch.full_like(x["P"], float("nan"))
        cd(P=x["P"], dP=_offset_view(x["dP"]), out={"dX": out})
        err = float((out.double() - ref).norm() / ref.norm())
        assert not torch.isnan(out).any() and err <= 1e-2, (s.kernels[0].options, err)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gathered_inputs_on_the_shifted_grid(dtype):
    """group norm over a row (c, s) of 15 x 4101 values: gamma and beta per channel, gathered per
    value (a chunk of the shifted grid spans two channels)."""
    run_chain(library.get("group_norm"), dict(n=2, g=2, c=15, s=4101), dtype, seed=4)


def test_fp16():
    run_chain(_log_softmax(), dict(r=4, x=50257), "fp16", seed=6)


@pytest.mark.parametrize("dtype, make, sizes", [
    ("bf16", _log_softmax, dict(r=5, x=128256)),
    ("bf16", _log_softmax, dict(r=301, x=130001)),   # the shifted grid, many clusters at once
    ("fp32", _log_softmax, dict(r=3, x=151937)),     # a cluster of four
    ("bf16", _softmax_vjp, dict(r=4, x=130001)),     # two kept inputs
    ("fp32", _softmax_vjp, dict(r=3, x=70001)),
])
def test_rows_shared_by_a_cluster(make, sizes, dtype):
    d = prepare(make(), sizes=sizes, dtype=dtype)
    shared = [c for c in FAMILY.candidates(d, "h200", dtype) if c.kernels[0].options.cluster]
    assert shared
    for i, s in enumerate(shared):
        run_chain(make(), sizes, dtype, schedule=s, seed=20 + i)


@pytest.mark.parametrize("which", ["X", "out"])
def test_a_cluster_row_off_the_grids_lines(which):
    """A cluster's row whose source (or output) starts one value into its storage."""
    import torch

    from napkin.codegen.api import compile

    sizes = dict(r=4, x=130001)
    d = prepare(_log_softmax(), sizes=sizes, dtype="bf16")
    x = random_inputs(d, device="cuda", seed=13)
    ref = d.reference({k: v.double() for k, v in x.items()}, dtype=torch.float64)["Y"]
    shared = [c for c in FAMILY.candidates(d, "h200", "bf16") if c.kernels[0].options.cluster]
    assert shared
    for s in shared:
        cd = compile(_log_softmax(), sizes=sizes, dtype="bf16", schedule=s)
        ins = {"X": _offset_view(x["X"]) if which == "X" else x["X"]}
        out = torch.full_like(x["X"], float("nan"))
        out = _offset_view(out) if which == "out" else out
        cd(**ins, out={"Y": out})
        err = float((out.double() - ref).norm() / ref.norm())
        assert not torch.isnan(out).any() and err <= 1e-2, (s.kernels[0].options, err)
