"""tril and triu on a GPU: a triangular matrix product (the mask in the contraction's epilogue, on
wgmma and mma.sync), a batched one, and a triangle of an array on the pointwise family; fresh random
inputs, NaN-poisoned outputs, sizes that are not tile multiples, inputs one element into storage."""

from __future__ import annotations

import pytest

import napkin.diagrams as nd
from napkin.codegen import compile as napkin_compile

from test_pointwise_gpu import check

pytestmark = pytest.mark.gpu

H, A, K, N = nd.axes("h a k n")


def tri_product(fn, diagonal: int, batched: bool = False) -> nd.Diagram:
    lead = (H,) if batched else ()
    C = nd.contract(nd.array("A", *lead, A, K), nd.array("B", *lead, K, N), over=K)
    return nd.Diagram("tri_product", fn(C, A, N, diagonal=diagonal, name="Y"))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fn, diagonal", [(nd.tril, 0), (nd.triu, 1), (nd.tril, -37)])
@pytest.mark.parametrize("sizes", [dict(a=1000, k=520, n=776), dict(a=256, k=64, n=384), dict(a=77, k=33, n=130)],
                         ids=lambda s: "x".join(map(str, s.values())))
def test_a_triangular_product_verifies(sizes, fn, diagonal, dtype):
    cd = napkin_compile(tri_product(fn, diagonal), sizes=sizes, dtype=dtype)
    assert [k.family for k in cd.plan.kernels] == ["contraction"], cd.plan.summary()
    check(cd, seed=6)
    check(cd, seed=7, offset=1)


def test_a_batched_triangular_product_verifies():
    cd = napkin_compile(tri_product(nd.triu, 0, batched=True), sizes=dict(h=3, a=200, k=96, n=136), dtype="bf16")
    check(cd, seed=8)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_triangle_of_an_array_verifies(dtype):
    d = nd.Diagram("tri_map", nd.gelu(nd.tril(nd.array("X", H, A, N), A, N, diagonal=2), name="Y"))
    cd = napkin_compile(d, sizes=dict(h=5, a=131, n=259), dtype=dtype)
    check(cd, seed=9)
