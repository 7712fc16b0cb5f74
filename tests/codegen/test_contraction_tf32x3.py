"""fp32 contractions on the tensor cores: the 3xTF32 engine of ``matmul_simt.cu.jinja``.

Each operand fragment is split into a tf32 hi and an fp32 lo, three mma.sync products are summed
per 16 of k on the tensor cores and added into the accumulators in fp32. The planner weighs it
against the FMA engine; the model prices its sum as three tf32 products on mma.sync. CPU checks
(candidates, sources, the model, refusals), nvcc builds without spills, and on a GPU (marked
``gpu``) every configuration against the float64 reference, its accuracy against cuBLAS fp32 on
a long sum, and infinite operands.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.contraction import FAMILY, TF32X3_CONFIGS, MatmulConfig
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
    assert "__syncthreads_or(" in body  # chunks with an infinite operand take the exact path
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
    ((128, 128, 64, 64, 32, 2, 1), "chunks of 8, 16 or 32"),
    ((128, 128, 16, 64, 32, 3, 1), "double-buffered"),
])
def test_tf32x3_refuses_what_it_cannot_build(cfg, msg):
    d = bound(library.get("matmul"), a=1000, b=520, c=776)
    with pytest.raises(CodegenError, match=msg):
        FAMILY.lower(d, FAMILY.schedule(d, tf32x3(cfg)), "sm_90a")


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

BUILDS = [(c, name, d, arch) for c in TF32X3_CONFIGS
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
