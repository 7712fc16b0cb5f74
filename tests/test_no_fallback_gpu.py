"""On a GPU: the cases tests/test_no_fallback.py moves off the scalar fallback run right.

- products over no axis (outer, transposed, batched, Hadamard with a transposed factor, a
  broadcast factor, three factors, an outer product summed over an axis), run by the pointwise
  family as the map ``x * y * …``;
- softmax, rmsnorm and layernorm over an axis that is not innermost at small and odd sizes, written
  out as reductions and maps (sizes where the model used to keep them on the fallback);
- contractions in layouts the contraction family does not read (the batch axis innermost,
  contracted axes in different orders), run on copies in a layout it does;
- renames written as outputs (views copied to HBM), alone or beside the box that makes them;
- an array read both as it is and through a view in one kernel (``(X + Xᵀ)/2``), the view read
  through the array's tensor.

Each is planned by derive (the test asserts no kernel on the fallback), compiled, run on fresh
random inputs with NaN-poisoned outputs (an element a kernel does not write stays NaN and fails)
and compared with the float64 reference: the norm-wise relative error below
``napkin.codegen.verify.TOLERANCE`` (1e-2 bf16, 1e-5 fp32), by test_pointwise_gpu's ``check``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from napkin.codegen import compile as napkin_compile
from napkin.diagrams import Diagram, array, axes, contract, sum_over
from napkin.perfmodel.plan import FALLBACK

sys.path.insert(0, str(Path(__file__).resolve().parent / "codegen"))
from test_pointwise_gpu import check  # noqa: E402  (tests/codegen is not a package)
from test_no_fallback import BESIDE_SIZES, _beside_its_view, _contractions, _views_as_outputs, reduction  # noqa: E402

pytestmark = pytest.mark.gpu

i, j, n = axes("i j n")

PRODUCTS = [
    ("outer", [dict(i=37, j=129), dict(i=1, j=7), dict(i=1024, j=4093)]),
    ("outer_transposed", [dict(i=37, j=129), dict(i=4096, j=4096)]),
    ("outer_batched", [dict(n=3, i=37, j=129), dict(n=8, i=256, j=512)]),
    ("hadamard", [dict(i=37, j=129)]),
    ("hadamard_transposed", [dict(i=37, j=129), dict(i=512, j=1000)]),
    ("broadcast_product", [dict(i=37, j=129), dict(i=1024, j=1000)]),
]


def _compiled(d: Diagram, sizes: dict, dtype: str):
    cd = napkin_compile(d, sizes=sizes, dtype=dtype)
    assert FALLBACK not in cd.plan.families, str(cd.plan)
    return cd


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case, shapes", PRODUCTS, ids=[c for c, _ in PRODUCTS])
def test_products_over_no_axis_verify(case, shapes, dtype):
    v, names = _contractions(dtype)[case]
    for seed, sizes in enumerate(shapes):
        cd = _compiled(Diagram(case, v.named("C")), {a: sizes[a] for a in names}, dtype)
        assert cd.plan.families == ("pointwise",)
        check(cd, seed=seed)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_three_factors_and_a_summed_outer_product_verify(dtype):
    p, q, r = array("P", i, dtype=dtype), array("Q", j, dtype=dtype), array("R", j, i, dtype=dtype)
    three = Diagram("three", contract(p, q, r, over=(), out=(i, j), name="O"))
    summed = Diagram("outer_then_sum", sum_over(contract(p, q, over=(), out=(i, j)), i, name="S"))
    for d in (three, summed):
        for seed, sizes in enumerate((dict(i=37, j=129), dict(i=1000, j=3))):
            check(_compiled(d, sizes, dtype), seed=seed)


COMPOSITES = [
    ("softmax", "abc", (1,), [(4, 64, 32), (3, 37, 5), (1, 7, 1)]),
    ("rmsnorm", "abc", (1,), [(4, 64, 32), (5, 129, 3)]),
    ("rmsnorm", "abc", (0,), [(37, 5, 129)]),
    ("layernorm", "ab", (0,), [(300, 300), (37, 5)]),
    ("softmax", "abce", (0,), [(37, 5, 129, 3)]),
    ("layernorm", "abce", (1,), [(8, 8, 8, 8)]),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("kind, names, at, shapes", COMPOSITES,
                         ids=[f"{k}_{n}_{a[0]}" for k, n, a, _ in COMPOSITES])
def test_composites_over_an_outer_axis_at_small_sizes_verify(kind, names, at, shapes, dtype):
    d = reduction(kind, names, at, dtype)
    for seed, shape in enumerate(shapes):
        cd = _compiled(d, dict(zip(names, shape)), dtype)
        assert cd.plan.expanded, str(cd.plan)
        check(cd, seed=seed)


RELAID = [
    ("bmm_batch_last", [dict(n=3, i=37, j=129, k=77), dict(n=8, i=256, j=256, k=512)]),
    ("bmm_batch_last_k_first", [dict(n=3, i=37, j=129, k=77), dict(n=4, i=128, j=64, k=256)]),
    ("two_contracted_apart", [dict(i=37, j=129, k=77, l=5), dict(i=256, j=256, k=64, l=8)]),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case, shapes", RELAID, ids=[c for c, _ in RELAID])
def test_relaid_contractions_verify(case, shapes, dtype):
    v, names = _contractions(dtype)[case]
    for seed, sizes in enumerate(shapes):
        cd = _compiled(Diagram(case, v.named("C")), {a: sizes[a] for a in names}, dtype)
        assert cd.plan.expanded == ("C",) and "contraction" in cd.plan.families, str(cd.plan)
        check(cd, seed=seed)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", sorted(_views_as_outputs("bf16")))
def test_views_written_as_outputs_verify(case, dtype):
    d = _views_as_outputs(dtype)[case]
    for seed, sizes in enumerate((dict(i=2, j=2, k=3, l=5), dict(i=7, j=33, k=16, l=13))):
        cd = _compiled(d, {a: v for a, v in sizes.items() if a in d.axes}, dtype)
        assert cd.plan.expanded, str(cd.plan)
        check(cd, seed=seed)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", sorted(_beside_its_view("bf16")))
def test_an_array_read_beside_its_view_verifies(case, dtype):
    for seed, (side, depth) in enumerate(BESIDE_SIZES + ((1000, 1),)):
        cd = _compiled(_beside_its_view(dtype, side, depth)[case], {}, dtype)
        assert cd.plan.families == ("pointwise",), str(cd.plan)
        check(cd, seed=seed)


def _gram(dtype: str) -> Diagram:
    from napkin.diagrams import rename

    a, d = axes("a d")
    X = array("X", a, d, dtype=dtype)
    return Diagram("gram", contract(X, rename(X, a="n"), over=d, out=(a, n), name="G"))


def _view_of_another(dtype: str) -> Diagram:
    """Σ_{h,d} A[a,d,h]·view(B)[n,h,d]: the contracted axes in different orders, so A is copied
    into the order of the sum (relaid), while the B operand, a view of another array already in a
    layout the contraction family reads, is read where it is."""
    from napkin.diagrams import rename

    a, h, d, m = axes("a h d m")
    A, B = array("A", a, d, h, dtype=dtype), array("B", m, h, d, dtype=dtype)
    return Diagram("view_of_another", contract(A, rename(B, m="n"), over=(h, d), out=(a, n), name="C"))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_product_with_a_view_verifies(dtype):
    """X·Xᵀ (the view copied row by row, one kernel cannot read X under both sets of axes) and a
    relaid product whose operand is a view of another array, at sizes that are no tile multiples."""
    for seed, sizes in enumerate((dict(a=37, d=72), dict(a=300, d=1000))):
        cd = _compiled(_gram(dtype), sizes, dtype)
        assert cd.plan.families == ("pointwise", "contraction"), str(cd.plan)
        check(cd, seed=seed)
    for seed, sizes in enumerate((dict(a=37, h=3, d=40, m=45), dict(a=256, h=4, d=64, m=200))):
        cd = _compiled(_view_of_another(dtype), sizes, dtype)
        assert [k.kernel.name for k in cd.plan.kernels] == ["C_a", "C"], str(cd.plan)  # B not copied
        check(cd, seed=seed)
