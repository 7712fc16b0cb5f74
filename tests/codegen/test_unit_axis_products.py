"""A matmul by a one-column (or one-row) matrix is a matrix-vector product: the pointwise family's
sum of products takes it, where an axis of size 1 is the only axis one factor has that the other
lacks (``torch.matmul(A, x[:, None])``, how a matrix-vector product is often written; issue #12's
"matrix-vector as a bandwidth-bound template"). The model then compares it with the contraction
family's tiles, which read the matrix as well but run mostly idle tensor cores on one column.

Without a GPU: the plans of such products, in bf16 and fp32, are one pointwise kernel; a real
matrix product (both sides above ``pointwise.MAX_REP`` elements: fewer make a skinny product,
test_skinny_products) stays the contraction family's; the kernels compile with nvcc
for sm_80 and sm_90a without spills. On a GPU (``gpu``): each is run on fresh random inputs into
NaN-poisoned outputs and compared with the float64 reference (test_pointwise_gpu's ``check``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from napkin.codegen import compile as napkin_compile
from napkin.codegen.families import pointwise
from napkin.codegen.lower import build
from napkin.codegen.planner import derive
from napkin.diagrams import library

#: (library diagram, sizes): a matrix times one column, transposed, batched, a row times a
#: matrix, a dot written as a 1x1 matmul, odd lengths (no 16-byte multiple), K of 131072
CASES = [
    ("matmul", dict(a=4096, b=4096, c=1)),
    ("matmul", dict(a=77, b=1001, c=1)),
    ("matmul", dict(a=256, b=131072, c=1)),
    ("matmul", dict(a=1, b=4096, c=4096)),
    ("matmul", dict(a=1, b=333, c=1)),
    ("matmul_t", dict(a=4096, b=4096, c=1)),
    ("matmul_t", dict(a=1, b=1000, c=777)),
    ("batched_matmul", dict(n=4, a=1000, b=1000, c=1)),
]
DTYPES = ("bf16", "fp32")


def _plan(name, sizes, dtype):
    return derive(library.get(name), "h100", dtype, sizes=sizes, explain=False).plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, sizes", CASES, ids=[f"{n}-{'x'.join(map(str, s.values()))}" for n, s in CASES])
def test_a_product_with_a_unit_axis_is_one_pointwise_sum_of_products(name, sizes, dtype):
    plan = _plan(name, sizes, dtype)
    assert plan.families == ("pointwise",), str(plan)
    shape = pointwise.analyse(plan.diagram)
    assert shape.chain and shape.how == "sum"
    # the vector axis is never the axis of size 1 (one value: no 16-byte vectors along it)
    assert sizes[shape.order[-1]] != 1 or all(v == 1 for v in sizes.values())


def test_a_real_matrix_product_stays_with_the_contraction_family():
    for sizes in (dict(a=4096, b=4096, c=16), dict(a=16, b=4096, c=4096)):
        assert pointwise.FAMILY.explain(library.get("matmul").bind(**sizes)) is not None
        assert _plan("matmul", sizes, "bf16").families == ("contraction",)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_compile_without_spills(arch):
    from napkin.kernels import nvcc_compile

    launches = []
    for dtype in DTYPES:
        for ci, (name, sizes) in enumerate(CASES):
            for launch in build(_plan(name, sizes, dtype), arch="sm_90a").launches:
                new = f"{launch.name}_{dtype}_{ci}"
                launches.append(dataclasses.replace(launch, name=new, source=re.sub(
                    rf"\b{re.escape(launch.name)}\b", new, launch.source)))
    usage = nvcc_compile("\n".join(dict.fromkeys(k.source for k in launches)), arch)
    spills = [k.name for k in launches if usage.kernels[k.name].spills]
    assert not spills, spills


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_unit_axis_products_verify(dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_pointwise_gpu import check

    for seed, (name, sizes) in enumerate(CASES):
        cd = napkin_compile(library.get(name), sizes=sizes, dtype=dtype)
        assert cd.plan.families == ("pointwise",), str(cd.plan)
        check(cd, seed=seed)
