"""The tiled contraction family on the GPU (marked ``gpu``), through ``napkin.codegen.verify``:
fresh random inputs, NaN-poisoned outputs, relative error against the float64 reference under
1e-2 (bf16, fp16) or 1e-5 (fp32), on shapes that are not multiples of any tile (and rows that
are not 16-byte aligned, which take the element-copy path).
"""

from __future__ import annotations

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families.contraction import (FAMILY, MMA_CONFIGS, SIMT_CONFIGS, WGMMA_CONFIGS, WGMMA_SPLIT_CONFIGS,
                                                 MatmulConfig)
from napkin.diagrams import library

try:
    from .test_contraction_nvcc import mm_epilogue, mm_layout, mm_multi_sum
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_nvcc import mm_epilogue, mm_layout, mm_multi_sum

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


@pytest.mark.parametrize("a_kmajor,b_kmajor", [(True, True), (False, False), (False, True)],
                         ids=["A[h,a,b]B[c,h,b]", "A[b,h,a]B[h,b,c]", "A[b,h,a]B[c,h,b]"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_sum_over_two_axes(a_kmajor, b_kmajor, dtype):
    """Attention's output projection: a sum over (h, b), with a residual; odd sizes and rows that
    are not 16-byte aligned (b=100 in bf16) take the element-copy path."""
    check(mm_multi_sum(a_kmajor, b_kmajor, residual=True), dtype,
          [dict(h=4, a=300, b=128, c=136), dict(h=3, a=77, b=100, c=72), dict(h=1, a=64, b=64, c=64)])


@pytest.mark.parametrize("name,shapes", [
    ("mlp", [dict(a=256, b=262144, c=256), dict(a=100, b=20000, c=72)]),
    ("matmul", [dict(a=33, b=100003, c=40), dict(a=64, b=65536, c=64)]),
    ("batched_matmul", [dict(n=3, a=64, b=10000, c=40)]),
])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_split_sums_planned_for_small_outputs(name, shapes, dtype):
    """Small outputs over long sums: the planner splits the sum (fp32 partials, a combining launch
    in a fixed order); the result matches float64 and is the same bits on a second run."""
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.reference import random_inputs

    check(library.get(name), dtype, shapes)
    cd = napkin_compile(library.get(name), sizes=shapes[0], dtype=dtype)
    assert (cd.plan.kernels[0].kernel.options.splits or 1) > 1, cd.plan
    ins = random_inputs(cd.diagram, device="cuda", seed=5)
    first, second = cd(**ins).clone(), cd(**ins)
    torch.cuda.synchronize()
    assert torch.equal(first, second)


def test_split_sum_over_two_axes_with_a_residual():
    d = mm_multi_sum(residual=True).with_dtype("bf16").bind(h=8, a=64, b=4096, c=64)
    check(mm_multi_sum(residual=True), "bf16", [dict(h=8, a=64, b=4096, c=64)],
          schedule=FAMILY.schedule(d, MatmulConfig(False, *MMA_CONFIGS[6], splits=8)))


def test_transformer_block_output_projection_on_tensor_cores():
    """The block's A = Σ_{h,d} O·Wo plans on the contraction family (it ran on the fallback)."""
    from napkin.codegen.planner import derive

    d = library.get("transformer_block").bind(q=256, e=256, h=4, d=64, f=512)
    plan = derive(d, gpu="h100").plan
    fams = {k.name: k.family for k in plan.kernels}
    assert fams["A"] == "contraction", fams
    check(library.get("transformer_block"), "bf16", [dict(q=256, e=256, h=4, d=64, f=512, x=256)], family=None)


# ---------------------------------------------------------------------------- the wgmma template

def _hopper():
    skip_unless_hopper("the wgmma contraction template")


def wgmma_schedule(diagram, dtype, sizes, cfg=WGMMA_CONFIGS[0]):
    d = diagram.with_dtype(dtype).bind(**sizes)
    return FAMILY.schedule(d, MatmulConfig(False, *cfg, wgmma=True))


#: Shapes for the TMA path: every axis a multiple of 8 elements (16-byte rows whichever way the
#: operands are stored), none a tile multiple; b = 8 is a single, mostly out-of-bounds chunk.
WGMMA_SHAPES = [dict(a=1000, b=520, c=776), dict(a=88, b=72, c=200), dict(a=296, b=8, c=64)]


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}-w{c[3]}-s{c[5]}")
def test_every_wgmma_configuration(cfg):
    _hopper()
    for shape in WGMMA_SHAPES[:2]:
        check(library.get("mlp"), "bf16", [shape], schedule=wgmma_schedule(library.get("mlp"), "bf16", shape, cfg))


@pytest.mark.parametrize("a_first,b_first", [(True, True), (True, False), (False, True), (False, False)],
                         ids=["A[a,b]B[b,c]", "A[a,b]B[c,b]", "A[b,a]B[b,c]", "A[b,a]B[c,b]"])
@pytest.mark.parametrize("cfg", [WGMMA_CONFIGS[0], WGMMA_CONFIGS[1]], ids=["128x256", "256x128"])
def test_wgmma_operand_layouts(a_first, b_first, cfg):
    _hopper()
    d = mm_layout(a_first, b_first)
    for shape in WGMMA_SHAPES:
        check(d, "bf16", [shape], schedule=wgmma_schedule(d, "bf16", shape, cfg))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_wgmma_epilogue_and_fp16(dtype):
    _hopper()
    d = mm_epilogue()
    for shape in (dict(a=1000, b=520, c=776), dict(a=45, b=64, c=24)):
        check(d, dtype, [shape], schedule=wgmma_schedule(d, dtype, shape, WGMMA_CONFIGS[2]))


def test_model_picks_wgmma_on_hopper():
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram("matmul", sizes=dict(a=1024, b=1024, c=1024))
    assert cd.program.launches[0].template == "matmul_wgmma.cu.jinja"
    # rows of 1030 elements are not 16-byte multiples: B is copied into rows of 1032 first
    cd = compile_diagram("matmul", sizes=dict(a=1024, b=1024, c=1030))
    assert [k.template for k in cd.program.launches] == ["pad_rows.cu.jinja", "matmul_wgmma.cu.jinja"]
    check(library.get("matmul"), "bf16", [dict(a=1024, b=1024, c=1030)])


@pytest.mark.parametrize("name,shape", [
    ("matmul", dict(a=8205, b=2949, c=5921)), ("matmul", dict(a=77, b=3, c=13)), ("matmul_t", dict(a=1000, b=999, c=333)),
    ("mlp", dict(a=300, b=1001, c=257)), ("batched_matmul", dict(n=3, a=100, b=128, c=99)),
])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rows_that_are_not_16_byte_multiples_are_padded(name, shape, dtype):
    """Operands whose rows are not 16-byte multiples are copied into padded rows (zeros after the
    end) and the contraction runs on whole 16-byte pieces (wgmma where the GPU has it). Both sides of
    each product hold more than pointwise.MAX_REP elements (fewer make a skinny product)."""
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram(name, sizes=shape, dtype=dtype)
    assert cd.program.launches[0].template == "pad_rows.cu.jinja", [k.template for k in cd.program.launches]
    check(library.get(name), dtype, [shape])


def test_wgmma_misaligned_views_run_without_tma():
    """TMA copies need 16-byte aligned operands: a contiguous view one element into its storage
    runs on the best schedule without TMA instead, and is right."""
    _hopper()
    import torch

    from napkin.codegen.api import compile as compile_diagram

    sizes = dict(a=256, b=64, c=128)
    # so small a matmul the planner runs on mma.sync: the wgmma configuration as a schedule
    cd = compile_diagram("matmul", sizes=sizes, schedule=wgmma_schedule(library.get("matmul"), "bf16", sizes))
    assert cd.program.launches[0].template == "matmul_wgmma.cu.jinja"
    assert cd.plan.kernels[0].kernel.options.engine == "wgmma"
    base = torch.randn(256 * 64 + 1, device="cuda").to(torch.bfloat16)
    A = base[1:].view(256, 64)  # 2 bytes past an aligned address
    B = torch.randn(64, 128, device="cuda").to(torch.bfloat16)
    Y = cd(A, B)
    assert cd.without_tma().program.launches[0].template == "matmul_mma.cu.jinja"
    torch.testing.assert_close(Y.float(), A.float() @ B.float(), rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(cd(A.clone(), B).float(), Y.float(), rtol=2e-2, atol=2e-1)


def _projection(bias: bool = False):
    """Q[h,q,d] = Σ_e X[q,e]·W[h,d,e] (+ b[h,d]): a batch axis h that only the weight carries (the
    block's query, key and value projections)."""
    from napkin.diagrams import Axis, Diagram, array, contract
    from napkin.diagrams.ops import map_fn

    h, q, d, e = Axis("h"), Axis("q"), Axis("d"), Axis("e")
    Q = contract(array("X", q, e), array("W", h, d, e), over=e, out=(h, q, d), name="Q")
    if bias:
        Q = map_fn("add", Q, array("b", h, d), name="Qb")
    return Diagram("projection", Q)


@pytest.mark.parametrize("cfg", [WGMMA_CONFIGS[0], WGMMA_CONFIGS[3]], ids=["128x256", "128x128"])
def test_wgmma_batched(cfg):
    """Batch axes on the TMA path: a batch index moves each operand's tiles down its flattened rows
    (rows past M or N belong to the next batch element and are never stored); B stored [b][c] per
    batch element needs the sum's length to be a multiple of 64."""
    _hopper()
    for shape in (dict(n=3, a=300, b=256, c=136), dict(n=2, a=64, b=64, c=72)):
        check(library.get("batched_matmul"), "bf16", [shape],
              schedule=wgmma_schedule(library.get("batched_matmul"), "bf16", shape, cfg))
    for bias in (False, True):
        d = _projection(bias)
        for shape in (dict(h=3, q=300, d=128, e=200), dict(h=4, q=64, d=64, e=64)):
            check(d, "bf16", [shape], schedule=wgmma_schedule(d, "bf16", shape, cfg))


def test_wgmma_batched_planning():
    # B[n, b, c] stored K by rows with a sum of 200 (no whole 64-deep chunks): a 2-D map's last
    # chunk would read the next element's rows, so B's map takes n, b and c as dimensions of their
    # own (zeros past b = 200)
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=3, a=300, b=200, c=136)
    assert FAMILY.wgmma_reason(d, "h100") is None
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram("batched_matmul", sizes=dict(n=8, a=1024, b=1024, c=1024))
    assert cd.program.launches[0].template == "matmul_wgmma.cu.jinja"
    check(library.get("batched_matmul"), "bf16", [dict(n=3, a=300, b=200, c=136)])


def test_wgmma_batched_both_operands_k_major():
    _hopper()
    from test_contraction_nvcc import bmm_t

    for shape in (dict(n=3, a=300, b=200, c=136), dict(n=2, a=64, b=8, c=72)):
        check(bmm_t(), "bf16", [shape], schedule=wgmma_schedule(bmm_t(), "bf16", shape, WGMMA_CONFIGS[1]))


@pytest.mark.parametrize("b_kmajor", [True, False], ids=["W[f,b]", "W[b,f]"])
def test_dual_contraction(b_kmajor):
    """SwiGLU's gate and up in one wgmma kernel: every dual configuration, sizes that are not tile
    multiples, and rows that need padding (b = 100)."""
    _hopper()
    from napkin.codegen.families.contraction import DUAL_CONFIGS

    from test_contraction_nvcc import gate_up

    d0 = gate_up(b_kmajor)
    for c in DUAL_CONFIGS:
        for shape in (dict(a=1000, b=512, f=776), dict(a=64, b=64, f=64)):
            d = d0.with_dtype("bf16").bind(**shape)
            check(d0, "bf16", [shape], schedule=FAMILY.schedule(d, MatmulConfig(False, *c, wgmma=True, dual=True)))
    check(d0, "bf16", [dict(a=300, b=100, f=200)])


def test_swiglu_plans_the_dual_kernel_and_is_right():
    _hopper()
    from napkin.codegen.api import compile as compile_diagram

    cd = compile_diagram("swiglu", sizes=dict(a=512, b=256, f=704))
    assert "napkin_mm_wgmma_dual" in cd.program.launches[0].name
    check(library.get("swiglu"), "bf16", [dict(a=512, b=256, f=704), dict(a=77, b=64, f=136)])


@pytest.mark.parametrize("cfg", [WGMMA_CONFIGS[3], WGMMA_CONFIGS[1], *WGMMA_SPLIT_CONFIGS],
                         ids=["128x128", "256x128", *(f"{c[0]}x{c[1]}-split-only" for c in WGMMA_SPLIT_CONFIGS)])
@pytest.mark.parametrize("splits", [2, 7])
def test_wgmma_split_sums(cfg, splits):
    """The wgmma template's split sum: fp32 partials from the registers, the combining launch adds
    them and applies the epilogue (mlp's bias and GELU); 7 splits of a few chunks leave the last
    shares empty (they write zeros); rows and columns past the tile edges, a batch, an outer sum."""
    from napkin.codegen.planner import derive

    _hopper()
    for build, shapes in [(lambda: library.get("mlp"), [dict(a=300, b=1024, c=136), dict(a=64, b=200, c=72)]),
                          (lambda: library.get("batched_matmul"), [dict(n=3, a=77, b=640, c=40)]),
                          (lambda: mm_multi_sum(b_kmajor=False, residual=True), [dict(h=3, a=100, b=128, c=72)])]:
        for shape in shapes:
            d = build().with_dtype("bf16").bind(**shape)
            s = FAMILY.schedule(d, MatmulConfig(False, *cfg, wgmma=True, splits=splits))
            check(build(), "bf16", [shape], schedule=s)
    plan = derive(library.get("matmul"), "h100", "bf16", sizes=dict(a=256, b=262144, c=256), explain=False).plan
    assert plan.kernels[0].kernel.options.engine == "wgmma" and (plan.kernels[0].kernel.options.splits or 1) > 1
