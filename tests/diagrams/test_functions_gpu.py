"""The elementwise functions on the GPU (issue #12 part 4): a diagram applying each function to a
tensor of the edge values (±inf, NaN, ±0.0, ±FLT_MAX, subnormals, each function's kinks) and random
values is compiled, run into NaN-poisoned outputs, and compared with the float64 reference under
the rules of ``test_functions_edges.py`` (NaN-ness and infinities equal, exact zeros with their sign,
subnormal references within FLT_MIN, other values within a few fp32 ULP; for bf16 the reference is
compared after the kernel's rounding: one bf16 ULP more). minimum and maximum are checked with the
sign of zero the GPU gives (-0.0 below +0.0), and logsumexp against torch.logsumexp, rows of -inf
included."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import napkin.diagrams as nd
from napkin.diagrams import Axis, Diagram, array, map_fn

from test_functions_edges import (BINARY, DEFAULT_ULPS, EDGES, FLT_MIN, UNARY_CASES, allowance, assert_lse_agrees,
                                  fp32_disagreement, inputs, lse_rows, reference, ulps_at)

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def run_compiled(d: Diagram, **tensors) -> dict:
    from napkin.codegen import compile as compile_diagram

    k = compile_diagram(d)
    outs = k.empty_outputs("cuda", float("nan"))
    k(**{n: t.cuda() for n, t in tensors.items()}, out=outs)
    torch.cuda.synchronize()
    return {n: t.cpu() for n, t in outs.items()}


def disagreement(got: float, want64: float, dtype: str, ulps: float, atol: float, zero_sign: bool = True):
    """Why the kernel's ``got`` (fp32 or bf16) disagrees with the float64 reference."""
    if dtype == "fp32":
        return fp32_disagreement(got, want64, ulps, zero_sign, atol)
    want = float(torch.tensor(want64, dtype=torch.float64).to(torch.bfloat16))
    if math.isnan(want64):
        return None if math.isnan(got) else "not NaN"
    if math.isnan(got):
        return "NaN"
    if math.isinf(want) or math.isinf(got):
        # an fp32 result within its ULPs of the reference may round to the other side of bf16's largest
        return None if got == want or (math.isinf(got) and abs(want64) > 3.38e38) else "not the infinity"
    if want64 == 0:
        if got != 0:
            return "not zero"
        return None if not zero_sign or math.copysign(1, got) == math.copysign(1, want64) else "zero of the other sign"
    if abs(want64) < FLT_MIN:
        return None if abs(got - want64) <= max(FLT_MIN, atol) else "off by more than FLT_MIN (subnormal reference)"
    with np.errstate(over="ignore"):
        ulp32 = float(np.spacing(np.float32(abs(want64))))
    ok = abs(got - want64) <= ulp32 * 2.0 ** 16 + ulps * ulp32 + atol
    return None if ok else f"{abs(got - want64) / (ulp32 * 2.0 ** 16):.1f} bf16 ULP off"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("fn,params", UNARY_CASES, ids=[f"{f}{p}" for f, p in UNARY_CASES])
def test_function_on_the_gpu_agrees_with_the_reference(fn, params, dtype):
    x = torch.from_numpy(inputs(seed=1, n=300)).to(DTYPES[dtype])
    r = Axis("r", x.numel())
    d = Diagram(f"f_{fn}", map_fn(fn, array("X", r, dtype=dtype), params=params, name="Y"))
    got = run_compiled(d, X=x)["Y"]
    x64 = x.double().numpy()
    want = reference("torch", fn, params, x64)
    bad = []
    for xi, g, w in zip(x64.tolist(), got.double().tolist(), want.tolist()):
        why = disagreement(g, w, dtype, ulps_at(fn, xi), allowance(fn, xi))
        if why:
            bad.append(f"{fn}{params}({xi!r}) = {g!r}, reference {w!r}: {why}")
    assert not bad, f"{len(bad)} disagreements:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("fn", BINARY)
def test_binary_function_on_the_gpu_agrees_with_the_reference(fn, dtype):
    e = torch.tensor(EDGES, dtype=torch.float64).to(DTYPES[dtype])
    a, b = e.repeat_interleave(len(EDGES)), e.repeat(len(EDGES))
    r = Axis("r", a.numel())
    d = Diagram(f"f_{fn}", map_fn(fn, array("A", r, dtype=dtype), array("B", r, dtype=dtype), name="Y"))
    got = run_compiled(d, A=a, B=b)["Y"]
    a64, b64 = a.double().numpy(), b.double().numpy()
    want = reference("torch", fn, (), a64, b64)
    bad = []
    for ai, bi, g, w in zip(a64.tolist(), b64.tolist(), got.double().tolist(), want.tolist()):
        why = disagreement(g, w, dtype, DEFAULT_ULPS, 0.0)  # the sign of zero included: PTX min/max
        if why:
            bad.append(f"{fn}({ai!r}, {bi!r}) = {g!r}, reference {w!r}: {why}")
    assert not bad, f"{len(bad)} disagreements:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_logsumexp_on_the_gpu_is_torchs(dtype):
    rows = lse_rows()
    g = torch.Generator().manual_seed(3)
    big = torch.randn(64, 1000, generator=g, dtype=torch.float64) * 20
    big[5] = -math.inf
    big[9, ::3] = -math.inf
    big[17, 500] = math.inf
    big[33, 7] = math.nan
    for x in (rows, big):
        x = x.to(DTYPES[dtype])
        r, c = Axis("r", x.shape[0]), Axis("c", x.shape[1])
        d = Diagram("lse", nd.logsumexp(array("X", r, c, dtype=dtype), over=c, name="L"))
        got = run_compiled(d, X=x)["L"]
        want = torch.logsumexp(x.double(), dim=1)
        # bf16: exp(x - max) and the log are rounded to bf16 where the kernels store them
        tol = (1e-5, 1e-5) if dtype == "fp32" else (2e-2, 2e-2)
        assert_lse_agrees(got, want, *tol, f"logsumexp {dtype} {tuple(x.shape)}")


def test_half_forms_keep_their_bound_on_the_gpu():
    """The 16-bit forms (``halfmath.cuh``) computed in fp32 on the device, against the float64
    reference: within 2^-15 relative, the edges as in fp32 (``test_functions_half.py``'s rule)."""
    from napkin.codegen.render import Code, map_expr
    from napkin.kernels import compile_kernel

    from test_functions_half import HALF_CASES, half_bound_failures, half_inputs

    lines = [f"  y[{k} * n + i] = {map_expr(fn, [Code('v')], params, half=True)};"
             for k, (fn, params) in enumerate(HALF_CASES)]
    src = ('#include "napkin.cuh"\nextern "C" __global__ void half_forms(const float* x, float* y, int n) {\n'
           "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= n) return;\n"
           "  const float v = x[i];\n" + "\n".join(lines) + "\n}\n")
    x = torch.from_numpy(half_inputs()).cuda()
    n = x.numel()
    y = torch.full((len(HALF_CASES) * n,), float("nan"), device="cuda")
    compile_kernel(src, "half_forms", filename="half_forms.cu")((n + 127) // 128, 128, [x, y, n], sync=True)
    got = y.view(len(HALF_CASES), n).cpu().double().tolist()
    bad = half_bound_failures(got, x.cpu().double().numpy())
    assert not bad, f"{len(bad)} disagreements:\n" + "\n".join(bad[:30])
