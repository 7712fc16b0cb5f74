"""A linear layer on [b, s, e] activations whose b and s the plan runs as one axis, on a GPU: the
caller's tensors in the diagram's shapes, fresh random inputs, NaN-poisoned outputs, sizes that are
not tile multiples, an input one element into its storage (the plan without TMA copies); and a
sum over two axes side by side (h, d) run as one depth."""

from __future__ import annotations

import pytest

from napkin.codegen import compile as napkin_compile

from test_fold_plan import SHORT, heads, linear
from test_pointwise_gpu import check

pytestmark = pytest.mark.gpu

SHAPES = [SHORT, dict(b=33, s=77, e=96, f=200), dict(b=512, s=3, e=64, f=256), dict(b=300, s=7, e=40, f=72)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("sizes", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
def test_folded_linear_verifies(sizes, dtype):
    cd = napkin_compile(linear(), sizes=sizes, dtype=dtype)
    check(cd, seed=1)
    if sizes is SHORT:
        assert cd.plan.folds, cd.plan.summary()
        check(cd, seed=2, offset=1)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("sizes", [dict(a=256, h=8, d=64, n=384), dict(a=100, h=3, d=40, n=72),
                                   dict(a=129, h=5, d=24, n=200)], ids=lambda s: "x".join(map(str, s.values())))
def test_a_folded_sum_verifies(sizes, dtype):
    cd = napkin_compile(heads(), sizes=sizes, dtype=dtype)
    assert cd.plan.folds, cd.plan.summary()
    check(cd, seed=4)
    check(cd, seed=5, offset=1)
