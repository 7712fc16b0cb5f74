"""relu (and maximum) in the reference follow their CUDA form, fmaxf, at the edges (issue #14).

``fmaxf(x, 0.0f)`` returns the other operand when one is NaN, and PTX's max orders -0.0 below
+0.0. So relu(-inf) = +0.0, relu(+inf) = +inf, relu(negative) = relu(-0.0) = +0.0 and
relu(NaN) = 0: the reference (torch) and the interpreter (numpy) give exactly that.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from napkin.diagrams import Axis, Diagram, array, map_fn, relu
from napkin.diagrams.functions import FUNCTIONS, ArrayOps

EDGES = [-math.inf, math.inf, math.nan, -0.0, 0.0, -1.0, 1.0, -1e38, 1e38, -3e38, 3e38, -1e-45, 1e-45,
         -1e308, 1e308, 5e-324, -5e-324]


def fmaxf(a: float, b: float) -> float:
    """C's fmax: a NaN operand gives the other one; +0.0 above -0.0."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == b == 0.0:
        return 0.0 if (math.copysign(1, a) > 0 or math.copysign(1, b) > 0) else -0.0
    return max(a, b)


def same(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


def run(module: str, fn: str, *xs: np.ndarray) -> np.ndarray:
    ops = ArrayOps(module)
    if module == "torch":
        args = [torch.from_numpy(x) for x in xs]
        return FUNCTIONS[fn].impl(ops, args, (), [], []).numpy()
    return FUNCTIONS[fn].impl(ops, list(xs), (), [], [])


@pytest.mark.parametrize("module", ["torch", "numpy"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu_matches_fmaxf_at_the_edges(module, dtype):
    with np.errstate(over="ignore"):  # ±1e308 become ±inf in float32: edges too
        x = np.array(EDGES, dtype=np.float64).astype(dtype)
    got = run(module, "relu", x)
    for xi, gi in zip(x.tolist(), got.tolist()):
        want = fmaxf(xi, 0.0)
        assert same(gi, want), (module, xi, gi, want)
    assert not np.isnan(got).any()
    assert not np.signbit(got).any()


@pytest.mark.parametrize("module", ["torch", "numpy"])
def test_maximum_matches_fmaxf_with_nan(module):
    a = np.array([math.nan, 1.0, math.nan, -math.inf, 2.0], dtype=np.float64)
    b = np.array([3.0, math.nan, math.nan, 1.0, -math.inf], dtype=np.float64)
    got = run(module, "maximum", a, b)
    for ai, bi, gi in zip(a.tolist(), b.tolist(), got.tolist()):
        assert same(gi, fmaxf(ai, bi)), (module, ai, bi, gi)


def test_relu_through_the_reference():
    r = Axis("r", len(EDGES))
    d = Diagram("relu_edges", relu(array("X", r, dtype="fp32"), name="Y"))
    x = torch.tensor(EDGES, dtype=torch.float64)
    y = d.reference({"X": x})["Y"]
    want = torch.tensor([fmaxf(v, 0.0) for v in EDGES], dtype=torch.float64)
    assert torch.equal(y, want) and not torch.signbit(y).any()
    d2 = Diagram("max_edges", map_fn("maximum", array("A", r, dtype="fp32"), array("B", r, dtype="fp32"), name="M"))
    nan = torch.full_like(x, math.nan)
    assert torch.equal(d2.reference({"A": x, "B": nan})["M"].nan_to_num(nan=7.0), x.nan_to_num(nan=7.0))
