"""The wgmma template with operands copied through tensor maps of their own axes (test_wgmma_views.py),
on a GPU: fresh random inputs, NaN-poisoned outputs, sizes that are not tile multiples (a sum over
d = 40 per head, K = 100 stored by rows), inputs one element into their storage (the plan without
TMA), bf16 and fp16."""

from __future__ import annotations

import pytest

from napkin.codegen import compile as napkin_compile

from test_pointwise_gpu import check
from test_wgmma_views import CASES, RANDOM_SEEDS, batch_behind_rows, merge_heads, mn_major_middle_batch, random_layout

pytestmark = pytest.mark.gpu

# (a sum over d = 56 a head: a chunk of 64 partly past each head's end; at d = 24 the planner takes
# the mma.sync tiles, whose chunks of 32 waste less of each wgmma chain)
MORE = [(merge_heads, dict(s=256, h=8, d=64, e=384)), (merge_heads, dict(s=129, h=5, d=56, e=72)),
        (batch_behind_rows, dict(b=5, i=64, j=300, k=64)), (mn_major_middle_batch, dict(b=3, i=64, j=200, k=64))]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("build, sizes", CASES + MORE,
                         ids=lambda x: getattr(x, "__name__", None) or "x".join(map(str, x.values())))
def test_views_verify(build, sizes, dtype):
    cd = napkin_compile(build(), sizes=sizes, dtype=dtype)
    assert any(a.view for k in cd.launches for a in k.args if a.kind == "tmap"), cd.plan.summary()
    check(cd, seed=10)
    check(cd, seed=11, offset=1)


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_layouts_verify(seed):
    d, sizes = random_layout(seed)
    cd = napkin_compile(d, sizes=sizes, dtype="bf16")
    check(cd, seed=seed)
