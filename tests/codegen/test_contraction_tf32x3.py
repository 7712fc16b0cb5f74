"""fp32 contractions on the tensor cores: the 3xTF32 engine of ``matmul_simt.cu.jinja``.

Each operand fragment is split into a tf32 hi and an fp32 lo, three mma.sync products are summed
per 16 of k on the tensor cores and added into the accumulators in fp32. The planner weighs it
against the FMA engine; the model prices its sum as three tf32 products on mma.sync. CPU checks
(candidates, sources, the model, refusals), nvcc builds without spills, and on a GPU (marked
``gpu``) every configuration against the float64 reference, its accuracy against cuBLAS fp32 on
a long sum, and special operands (inf, NaN, values whose tf32 rounding overflows, -0.0): the tiles
they reach are summed again as fp32 FMAs after one vote, the other tiles keep the 3xTF32 sum. The
8-column tiles for outputs of few columns.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.contraction import (FAMILY, TF32X3_CONFIGS, TF32X3_NARROW_CONFIGS, TF32X3_SMALL_CONFIGS,
                                                 MatmulConfig)
from napkin.diagrams import Diagram, array, axes, contract, library
from napkin.errors import CodegenError


def mm_at() -> Diagram:
    """Y[a,c] = sum_b A[b,a] B[b,c] (the rows operand stored with the summed axis first)."""
    a, b, c = axes("a b c")
    return Diagram("mm_at", contract(array("A", b, a), array("B", b, c), over=b, out=(a, c), name="Y"))


def bound(d: Diagram, **sizes) -> Diagram:
    return d.with_dtype("fp32").bind(**sizes)


def tf32x3(c=TF32X3_CONFIGS[0], **kw) -> MatmulConfig:
    return MatmulConfig(True, *c, tf32x3=True, **kw)


def test_fp32_candidates_offer_both_engines_and_the_planner_takes_tensor_cores():
    from napkin.codegen.planner import derive

    d = bound(library.get("matmul"), a=4096, b=4096, c=4096)
    engines = {s.kernels[0].options.engine for s in FAMILY.candidates(d, "h100", "fp32")}
    assert engines == {"mma.sync", "simt"}
    k = derive(d, gpu="h100", explain=False).plan.kernels[0].kernel
    assert k.family == "contraction" and k.options.engine == "mma.sync", k


def test_tf32x3_source():
    d = bound(library.get("matmul_t"), a=1000, b=520, c=776)
    k = FAMILY.lower(d, FAMILY.schedule(d, tf32x3()), "sm_90a").launches[0]
    body = k.source.split('extern "C"')[1]
    assert k.template == "matmul_simt.cu.jinja" and "tf32x3" in k.name
    assert "constexpr bool TF32X3 = true" in k.source
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in k.source and body.count("mma_tf32(") == 3
    # no check in the loop: one vote after it sends a tile whose sum is not finite down the exact path
    loop, after = body.split("bool bad = false;")
    assert "__syncthreads_or(" not in loop and "fmaf(" not in loop and "mma_tf32(" in loop
    assert after.count("__syncthreads_or(") == 1 and "fmaf(" in after and "mma_tf32(" not in after
    simt = FAMILY.lower(d, FAMILY.schedule(d, MatmulConfig(True, 128, 128, 16, 32, 64, 2, 1)), "sm_90a").launches[0]
    assert "constexpr bool TF32X3 = false" in simt.source and "fmaf(" in simt.source.split('extern "C"')[1]
    assert "mma.sync.aligned" not in simt.source.split('extern "C"')[1]


def test_config_of_reads_the_engine():
    d = bound(library.get("matmul"), a=1000, b=520, c=776)
    p = FAMILY.schedule(d, tf32x3(TF32X3_CONFIGS[1]))
    from napkin.codegen.families.contraction import analyze

    cfg = FAMILY.config_of(analyze(d), p)
    assert cfg.tf32x3 and cfg.simt and cfg.engine == "mma.sync" and (cfg.BM, cfg.BN) == TF32X3_CONFIGS[1][:2]
    s = FAMILY.schedule(d, MatmulConfig(True, 128, 128, 16, 32, 64, 2, 1))
    assert not FAMILY.config_of(analyze(d), s).tf32x3


@pytest.mark.parametrize("cfg,msg", [
    ((96, 128, 16, 24, 32, 2, 1), "m16n8 pieces"),
    ((128, 128, 16, 64, 64, 2, 1), "at most 64x32"),
    ((128, 128, 24, 64, 32, 2, 1), "chunks of 8, 16, 32, 64 or 128"),
    ((128, 128, 16, 64, 32, 3, 1), "double-buffered"),
])
def test_tf32x3_refuses_what_it_cannot_build(cfg, msg):
    d = bound(library.get("matmul"), a=1000, b=520, c=776)
    with pytest.raises(CodegenError, match=msg):
        FAMILY.lower(d, FAMILY.schedule(d, tf32x3(cfg)), "sm_90a")


def test_narrow_tiles_are_offered_for_few_columns_and_taken_for_four():
    """A few output columns (four): 8-column tiles read A once, and the planner takes one; a wide
    output is not offered them. (One column is a matrix-vector product, which the pointwise
    family's sum of products runs: tests/codegen/test_unit_axis_products.py.)"""
    from napkin.codegen.families.contraction import analyze
    from napkin.codegen.lower import lower

    narrow = {c[:5] for c in TF32X3_NARROW_CONFIGS}

    def tiles(d):
        cfgs = (FAMILY.config_of(analyze(d), s) for s in FAMILY.candidates(d, "h100", "fp32"))
        return {(c.BM, c.BN, c.BK, c.WM, c.WN) for c in cfgs}

    one = bound(library.get("matmul"), a=16384, b=16384, c=4)
    assert narrow <= tiles(one)
    assert not narrow & tiles(bound(library.get("matmul"), a=1000, b=520, c=776))
    launch = lower(one, gpu="h100", arch="sm_90a").launches[-1]
    assert "tf32x3" in launch.name and dict(launch.tunables)["BN"] == 8, launch.tunables


def test_the_model_prices_three_tf32_products_on_mma_sync():
    from napkin.codegen import select
    from napkin.perfmodel.hardware import get_gpu

    gpu = get_gpu("h100")
    d = bound(library.get("batched_matmul"), n=4, a=1024, b=2048, c=512)
    s = FAMILY.schedule(d, tf32x3())
    est = FAMILY.launch_estimate(d, s, gpu)
    assert est["tf32x3_flops"] == 2.0 * 4 * 1024 * 2048 * 512 and est["tensor_path"] == "mma.sync"
    shape = select.launch_shape(d, FAMILY, s, gpu)
    assert shape.tf32x3_flops == est["tf32x3_flops"] and shape.tensor_path == "mma.sync"
    from napkin.perfmodel.predict import predict_schedule

    p = predict_schedule(s, gpu, launch=shape, family="contraction")
    tensor_s = p.kernels[0].roofline.compute_s["tensor"]
    rate = gpu.tensor_rate("tf32") * gpu.mma_sync_fraction
    assert tensor_s == pytest.approx(3 * est["tf32x3_flops"] / rate, rel=1e-6)
    # the FMA engine's sum stays on the CUDA cores
    fma = FAMILY.schedule(d, MatmulConfig(True, 128, 128, 16, 32, 64, 2, 1))
    assert "tf32x3_flops" not in FAMILY.launch_estimate(d, fma, gpu)
    assert select.launch_shape(d, FAMILY, fma, gpu).tf32x3_flops == 0.0


def test_launch_shape_rejects_negative_tf32x3_flops():
    from napkin.errors import ScheduleError
    from napkin.perfmodel.predict import LaunchShape

    with pytest.raises(ScheduleError, match="tf32x3_flops"):
        LaunchShape(blocks=1, threads=32, regs_per_thread=32, smem_bytes=0, tf32x3_flops=-1.0)


# ---------------------------------------------------------------------------- nvcc builds

BUILDS = [(c, name, d, arch) for c in (*TF32X3_CONFIGS, *TF32X3_NARROW_CONFIGS, *TF32X3_SMALL_CONFIGS)
          for name, d in (("matmul", library.get("matmul")), ("A[b,a]B[c,b]", None))
          for arch in ("sm_80", "sm_90a")]


@pytest.fixture(scope="module")
def built():
    from napkin.kernels.nvcc import nvcc_compile

    def build(item):
        c, name, d, arch = item
        d = bound(d or _mm_at_ck(), a=1000, b=520, c=776)
        launch = FAMILY.lower(d, FAMILY.schedule(d, tf32x3(c)), arch).launches[-1]
        return launch, nvcc_compile(launch.source, arch)[launch.name]

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        return list(ex.map(build, BUILDS))


def _mm_at_ck() -> Diagram:
    """A[b,a] times B[c,b]: both operands in the layouts the FMA engine transposes."""
    a, b, c = axes("a b c")
    return Diagram("mm_at_ck", contract(array("A", b, a), array("B", c, b), over=b, out=(a, c), name="Y"))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(BUILDS)), ids=[f"{c[0]}x{c[1]}x{c[2]}-{n}-{a}" for c, n, _, a in BUILDS])
def test_tf32x3_builds_without_spills(built, i):
    launch, k = built[i]
    print(f"{launch.name}: {k.registers} registers (budget {launch.model_regs_per_thread})")
    assert not k.spills and k.stack_bytes == 0
    assert k.registers <= launch.model_regs_per_thread
    assert k.shared_bytes == 0


# ---------------------------------------------------------------------------- on the GPU

def _check(diagram, shapes, schedule=None):
    from napkin.codegen.verify import verify

    report = verify(diagram, dtype="fp32", shapes=shapes, family="contraction", schedule=schedule)
    print(report)
    assert report.ok, str(report)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", TF32X3_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])))
@pytest.mark.parametrize("layout", ["matmul_t", "A[b,a]"])
def test_every_tf32x3_configuration(cfg, layout):
    base = library.get("matmul_t") if layout == "matmul_t" else mm_at()
    d = bound(base, a=1000, b=520, c=777)
    _check(base, [dict(a=1000, b=520, c=777)], schedule=FAMILY.schedule(d, tf32x3(cfg)))


@pytest.mark.gpu
def test_tf32x3_split_sum():
    d = bound(library.get("matmul"), a=100, b=50000, c=72)
    _check(library.get("matmul"), [dict(a=100, b=50000, c=72)], schedule=FAMILY.schedule(d, tf32x3(splits=6)))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", TF32X3_CONFIGS[:2], ids=lambda c: "x".join(map(str, c[:3])))
def test_tf32x3_is_as_accurate_as_cublas_fp32(cfg):
    """A long sum (K = 16384) of positive and of mixed-sign products: the relative error against
    the float64 product stays near cuBLAS fp32's (TF32 off) on the same inputs."""
    import torch

    from napkin.codegen.api import compile as compile_diagram

    assert not torch.backends.cuda.matmul.allow_tf32
    d = bound(library.get("matmul"), a=256, b=16384, c=256)
    cd = compile_diagram(d, schedule=FAMILY.schedule(d, tf32x3(cfg)), family="contraction", gpu="h100")
    g = torch.Generator(device="cuda").manual_seed(7)
    for shift in (0.0, 1.0):  # mixed signs, then all positive (where a biased rounding adds up)
        A = torch.rand(256, 16384, device="cuda", generator=g) - 0.5 + shift
        B = torch.rand(16384, 256, device="cuda", generator=g) - 0.5 + shift
        out = cd.empty_outputs(fill=float("nan"))
        cd(A, B, out=out)
        y = out[cd.output_names[0]]
        ref = A.double() @ B.double()
        err = float((y.double() - ref).norm() / ref.norm())
        blas = float(((A @ B).double() - ref).norm() / ref.norm())
        print(f"shift {shift}: 3xTF32 {err:.2e}, cuBLAS fp32 {blas:.2e}")
        assert err < 2e-6 and err < 3 * blas + 1e-7, (err, blas)


@pytest.mark.gpu
def test_tf32x3_keeps_infinities():
    """An infinite operand gives the infinities (and NaNs) fp32 gives, not inf - inf."""
    import torch

    from napkin.codegen.api import compile as compile_diagram

    d = bound(library.get("matmul"), a=64, b=40, c=48)
    cd = compile_diagram(d, schedule=FAMILY.schedule(d, tf32x3(TF32X3_CONFIGS[2])), family="contraction",
                         gpu="h100")
    A = torch.rand(64, 40, device="cuda") + 0.5
    B = torch.rand(40, 48, device="cuda") + 0.5
    A[3, 7] = math.inf
    A[10, 2] = -math.inf
    B[5, 20] = math.inf  # row 10 meets +inf at column 20 too: -inf + inf = NaN
    out = cd.empty_outputs(fill=0.0)
    cd(A, B, out=out)
    y = out[cd.output_names[0]]
    ref = A @ B
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isposinf(y), torch.isposinf(ref))
    assert torch.equal(torch.isneginf(y), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(y[fin], ref[fin], rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_tf32x3_exact_near_the_largest_float():
    """A finite operand whose tf32 rounding would overflow (|x| >= 0x7f7ff000) takes the exact path:
    the product is finite where fp32's is, not inf or NaN."""
    import torch

    from napkin.codegen.api import compile as compile_diagram

    d = bound(library.get("matmul"), a=64, b=40, c=48)
    cd = compile_diagram(d, schedule=FAMILY.schedule(d, tf32x3(TF32X3_CONFIGS[2])), family="contraction",
                         gpu="h100")
    A = torch.rand(64, 40, device="cuda") + 0.5
    B = (torch.rand(40, 48, device="cuda") + 0.5) * 1e-3
    A[3, 7] = 3.4028e38     # rounds up to inf in tf32
    A[9, 1] = -3.4020e38    # just above the limit
    A[20, 5] = 3.4019e38    # just below it: split, hi finite
    out = cd.empty_outputs(fill=float("nan"))
    cd(A, B, out=out)
    y = out[cd.output_names[0]]
    ref = A.double() @ B.double()
    assert bool(torch.isfinite(y).all()), "a finite product came out inf or NaN"
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", TF32X3_NARROW_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])))
@pytest.mark.parametrize("layout,c", [("matmul", 1), ("matmul_t", 5), ("A[b,a]", 8)])
def test_narrow_tf32x3_configurations(cfg, layout, c):
    base = {"matmul": library.get("matmul"), "matmul_t": library.get("matmul_t"), "A[b,a]": mm_at()}[layout]
    d = bound(base, a=1000, b=777, c=c)
    _check(base, [dict(a=1000, b=777, c=c)], schedule=FAMILY.schedule(d, tf32x3(cfg)))


def _edge_run(cfg, A, B, **kw):
    from napkin.codegen.api import compile as compile_diagram

    M, K = A.shape
    d = bound(library.get("matmul"), a=M, b=K, c=B.shape[1])
    cd = compile_diagram(d, schedule=FAMILY.schedule(d, tf32x3(cfg, **kw)), family="contraction", gpu="h100")
    out = cd.empty_outputs(fill=float("nan"))
    cd(A, B, out=out)
    return out[cd.output_names[0]]


def _same_specials(y, ref):
    import torch

    assert torch.equal(torch.isnan(y), torch.isnan(ref)), "NaNs differ"
    assert torch.equal(torch.isposinf(y), torch.isposinf(ref)) and torch.equal(torch.isneginf(y), torch.isneginf(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 5])
def test_tf32x3_specials_in_one_tile_leave_the_others_on_the_fast_path(splits):
    """Infinities, a NaN and a value whose tf32 rounding overflows in some tiles (and some shares
    of a split sum): those tiles give what fp32 gives, every other element stays as accurate as a
    clean 3xTF32 sum (the vote is per tile: a clean tile is not summed again)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(3)
    A = torch.rand(300, 2000, device="cuda", generator=g) - 0.5
    B = torch.rand(2000, 200, device="cuda", generator=g) - 0.5
    A[5, 1500] = math.inf          # row 5: infinities
    A[140, 3] = math.nan           # row 140: NaN
    B[999, 150] = -math.inf        # column 150: infinities (NaN where it meets row 5)
    A[290, 7] = 3.4025e38          # rounds to inf in tf32; its row's sums stay finite in fp32
    y = _edge_run(TF32X3_CONFIGS[1], A, B, splits=splits)
    ref = A.double() @ B.double()
    _same_specials(y, ref.float())
    cols = torch.arange(200, device="cuda") != 150
    big = y[290, cols].double()
    assert bool(torch.isfinite(big).all()) and torch.allclose(big, ref[290, cols], rtol=1e-5, atol=0)
    clean = torch.ones_like(ref, dtype=torch.bool)
    clean[[5, 140, 290]] = False
    clean[:, 150] = False
    err = float((y.double()[clean] - ref[clean]).norm() / ref[clean].norm())
    assert err < 1e-6, err


@pytest.mark.gpu
def test_tf32x3_signed_zeros_and_zero_times_inf():
    """-0.0 operands give zeros like fp32 FMAs (no NaN, no stray sign from the split), and an
    infinity times a column of zeros gives NaN (inf * 0) as fp32 does."""
    import torch

    A = torch.rand(64, 40, device="cuda") + 0.5
    B = torch.rand(40, 48, device="cuda") + 0.5
    A[7] = -0.0
    B[:, 9] = 0.0
    A[2, 4] = math.inf
    y = _edge_run(TF32X3_CONFIGS[2], A, B)
    ref = torch.zeros(64, 48, dtype=torch.float64, device="cuda")
    for k in range(40):  # the sum as fp32 FMAs from +0, one k after another
        ref = (A[:, k:k + 1].double() * B[k:k + 1].double()) + ref
    _same_specials(y, ref.float())
    assert bool((y[7] == 0).all()) and torch.equal(torch.signbit(y[7]), torch.signbit(ref[7].float()))
    assert bool(torch.isnan(y[2, 9])) and bool(torch.isposinf(y[2, 0]))
