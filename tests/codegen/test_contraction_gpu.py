"""The tiled contraction family on the GPU (marked ``gpu``), through ``napkin.codegen.verify``:
fresh random inputs, NaN-poisoned outputs, relative error against the float64 reference under
1e-2 (bf16, fp16) or 1e-5 (fp32), on shapes that are not multiples of any tile (and rows that
are not 16-byte aligned, which take the element-copy path).
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.contraction import FAMILY, MMA_CONFIGS, SIMT_CONFIGS, MatmulConfig
from napkin.diagrams import library

try:
    from .test_contraction_nvcc import mm_epilogue, mm_layout
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_nvcc import mm_epilogue, mm_layout

pytestmark = pytest.mark.gpu

SHAPES_2D = [dict(a=1000, b=520, c=776), dict(a=77, b=64, c=200), dict(a=4097, b=256, c=130),
             dict(a=128, b=100, c=136)]


def check(diagram, dtype, shapes, family="contraction", schedule=None):
    from napkin.codegen.verify import verify

    report = verify(diagram, dtype=dtype, shapes=shapes, family=family, schedule=schedule)
    print(report)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["matmul", "matmul_t", "mlp"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_library_2d(name, dtype):
    check(library.get(name), dtype, SHAPES_2D)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_batched(dtype):
    check(library.get("batched_matmul"), dtype, [dict(n=3, a=300, b=200, c=136), dict(n=2, a=64, b=72, c=64)])


@pytest.mark.parametrize("cfg", MMA_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])) + f"-s{c[5]}")
def test_every_mma_configuration(cfg):
    d = library.get("mlp").with_dtype("bf16").bind(a=1000, b=520, c=776)
    check(library.get("mlp"), "bf16", [dict(a=1000, b=520, c=776)],
          schedule=FAMILY.schedule(d, MatmulConfig(False, *cfg)))


@pytest.mark.parametrize("cfg", SIMT_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])))
def test_every_simt_configuration(cfg):
    d = library.get("matmul_t").with_dtype("fp32").bind(a=1000, b=520, c=776)
    check(library.get("matmul_t"), "fp32", [dict(a=1000, b=520, c=776)],
          schedule=FAMILY.schedule(d, MatmulConfig(True, *cfg)))


@pytest.mark.parametrize("a_first,b_first", [(False, True), (False, False), (True, True)],
                         ids=["A[b,a]B[b,c]", "A[b,a]B[c,b]", "A[a,b]B[b,c]"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_operand_layouts(a_first, b_first, dtype):
    check(mm_layout(a_first, b_first), dtype, [dict(a=333, b=264, c=200), dict(a=64, b=40, c=72)])


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_epilogue_scale_bias_silu_residual(dtype):
    check(mm_epilogue(), dtype, [dict(a=1000, b=520, c=776), dict(a=45, b=64, c=24)])
