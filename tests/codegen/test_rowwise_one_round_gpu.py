"""The row-wise softmax's statistics in one round (``reduce.cuh``'s max/sum-of-exp merge).

Each thread's (max, sum of exp(x - its max)) merges into the row's in one block barrier or one
shuffle butterfly. The edges the merge must keep: rows of only -inf (NaN, as torch.softmax), rows
partly -inf (threads that saw only -inf), a +inf (NaN), rows shorter than a warp's threads, and
bits equal from run to run. The layernorm beside it (two rounds, an exact second pass over the
registers) on rows far from zero, where a one-pass variance cancels.
"""

from __future__ import annotations

import math

import pytest

from napkin.codegen.api import compile
from napkin.diagrams import library

pytestmark = pytest.mark.gpu

#: Rows of 5 to 5000 values: shuffle mode (a few lanes a row) and block mode (a block a row), with
#: rows that are not multiples of a vector or of the threads.
SIZES = [dict(r=37, x=5), dict(r=37, x=33), dict(r=19, x=1000), dict(r=11, x=4095), dict(r=9, x=5000)]
DTYPES = {"fp32": (1e-5, "float32"), "bf16": (1e-2, "bfloat16")}


def _modes_seen(name: str, dtype: str) -> set[bool]:
    seen = set()
    for s in SIZES:
        k = compile(library.get(name), sizes=s, dtype=dtype).schedule.kernels[0]
        seen.add(k.options.threads_per_row > 32)
    return seen


def _case(sizes: dict, dtype: str, seed: int):
    """The tolerance, torch dtype, row count, row length and a seeded CUDA generator of a case."""
    import torch

    tol, tname = DTYPES[dtype]
    return tol, getattr(torch, tname), sizes["r"], sizes["x"], torch.Generator(device="cuda").manual_seed(seed + sizes["x"])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_sizes_cover_both_modes(dtype):
    assert _modes_seen("softmax", dtype) == {True, False}
    assert _modes_seen("layernorm", dtype) == {True, False}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"x{s['x']}")
def test_softmax_rows_with_infinities(sizes, dtype):
    import torch

    tol, tdt, r, x, g = _case(sizes, dtype, seed=7)
    X = (torch.randn(r, x, device="cuda", generator=g) * 8).to(tdt)
    X[0] = -math.inf                       # a row of only -inf: NaN everywhere, as torch gives
    X[1, : x // 2 + 1] = -math.inf         # threads that see only -inf beside ones that do not
    X[2, x // 3] = math.inf                # a +inf: NaN
    X[3, -1:] = -math.inf
    cd = compile(library.get("softmax"), sizes=sizes, dtype=dtype)
    out = torch.full((r, x), float("nan"), device="cuda", dtype=tdt)
    y = cd(X, out=out).double()
    ref = torch.softmax(X.double(), dim=1)
    assert torch.isnan(y[0]).all() and torch.isnan(ref[0]).all()
    assert (torch.isnan(y[2]) == torch.isnan(ref[2])).all(), (y[2], ref[2])
    ok = ~torch.isnan(ref)
    ok[0] = ok[2] = False
    assert not torch.isnan(y[ok]).any()
    err = ((y[ok] - ref[ok]).norm() / ref[ok].norm()).item()
    assert err <= tol, err
    assert (y[1, : x // 2 + 1] == 0).all()
    again = cd(X, out=torch.empty_like(out))
    assert torch.equal(again.view(torch.int16 if dtype == "bf16" else torch.int32),
                       out.view(torch.int16 if dtype == "bf16" else torch.int32))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"x{s['x']}")
def test_layernorm_rows_far_from_zero(sizes, dtype):
    import torch

    tol, tdt, r, x, g = _case(sizes, dtype, seed=11)
    X = torch.randn(r, x, device="cuda", generator=g)
    # mean 100, deviations of 1: a one-pass E[x²] - E[x]² would lose 1e-3 of the variance in fp32; at
    # 300 the fp32 mean's own rounding (half an ULP, 1.5e-5) already costs 1.2e-5 in the output
    X[: r // 2] += 100.0
    X = X.to(tdt)
    gamma = torch.randn(x, device="cuda", generator=g).to(tdt)
    beta = torch.randn(x, device="cuda", generator=g).to(tdt)
    cd = compile(library.get("layernorm"), sizes=sizes, dtype=dtype)
    out = torch.full((r, x), float("nan"), device="cuda", dtype=tdt)
    y = cd(X, gamma, beta, out=out).double()
    ref = torch.nn.functional.layer_norm(X.double(), (x,), gamma.double(), beta.double(), eps=1e-5)
    err = ((y - ref).norm() / ref.norm()).item()
    assert err <= tol, err
    again = cd(X, gamma, beta, out=torch.empty_like(out))
    assert torch.equal(again, out)
