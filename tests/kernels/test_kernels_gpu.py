"""Every device-library primitive run on the GPU against torch (marked ``gpu``).

The kernels are in ``device_tests.cu``, compiled once through NVRTC by
:func:`napkin.kernels.compile_kernel`. Inputs are fresh random values each run (the seed is in
every failure message); outputs start as NaN so that an element a kernel forgets to write fails,
and where a kernel must not write past its bounds, the output is a view into a larger NaN buffer
whose tail is checked too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SOURCE = (Path(__file__).parent / "device_tests.cu").read_text()


@pytest.fixture(scope="module")
def torch():
    import torch as _torch

    return _torch


class Rng:
    """A CUDA generator with a fresh seed, kept for failure messages."""

    def __init__(self, torch):
        self.seed_value = int.from_bytes(os.urandom(4), "little")
        self.g = torch.Generator(device="cuda")
        self.g.manual_seed(self.seed_value)


@pytest.fixture
def gen(torch):
    return Rng(torch)


def kernel(name):
    from napkin.kernels import compile_kernel

    return compile_kernel(SOURCE, name, filename="device_tests.cu")


def randn(torch, gen, *shape, dtype=None):
    x = torch.randn(*shape, generator=gen.g, device="cuda", dtype=torch.float32)
    return x if dtype is None else x.to(dtype)


def nan_buffer(torch, shape, dtype, guard=64):
    """A NaN tensor of ``shape`` that is a view into a buffer with ``guard`` more NaN elements."""
    n = math.prod(shape)
    buf = torch.full((n + guard,), float("nan"), device="cuda", dtype=dtype)
    return buf[:n].view(*shape), buf[n:]


def rel_err(torch, out, ref):
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def cdiv(a, b):
    return (a + b - 1) // b


# ---- types -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tname", ["bf16", "f16"])
def test_pack2_matches_torch_rounding(torch, gen, tname):
    dt = torch.bfloat16 if tname == "bf16" else torch.float16
    pairs = 1000
    x = randn(torch, gen, 2 * pairs) * 10
    out = torch.zeros(pairs, dtype=torch.int32, device="cuda")
    back = torch.full((2 * pairs,), float("nan"), device="cuda")
    conv = torch.full((2 * pairs,), float("nan"), device="cuda", dtype=dt)
    kernel(f"pack_{tname}")(cdiv(pairs, 128), 128, [x, out, back, conv, pairs], sync=True)
    bits = x.to(dt).view(torch.int16).to(torch.int64) & 0xFFFF
    want = bits[0::2] | (bits[1::2] << 16)
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, want), f"seed {gen.seed_value}"
    assert torch.equal(back, x.to(dt).float()), f"seed {gen.seed_value}"
    assert torch.equal(conv, x.to(dt)), f"seed {gen.seed_value}"


# ---- 16-byte vectors ---------------------------------------------------------------------------

@pytest.mark.parametrize("tname,rows,cols,ld", [
    ("f16", 5, 37, 37), ("f16", 4, 64, 64), ("f16", 3, 70, 72), ("f32", 6, 13, 13),
    ("f32", 2, 3, 5), ("f32", 3, 256, 260)])
def test_vector_loads_and_stores_with_tails(torch, gen, tname, rows, cols, ld):
    dt = torch.float16 if tname == "f16" else torch.float32
    v = 16 // (2 if tname == "f16" else 4)
    x = randn(torch, gen, rows, ld, dtype=dt)
    y, guard = nan_buffer(torch, (rows, ld), dt)
    zld = cdiv(cols, v) * v
    z = torch.full((rows, zld), float("nan"), device="cuda", dtype=dt)
    fill = -3.0
    block = 32
    grid = (cdiv(cdiv(cols, v), block), rows)
    kernel(f"vec_copy_{tname}")(grid, block, [x, y, z, rows, cols, ld, zld, fill], sync=True)
    msg = f"seed {gen.seed_value}"
    assert torch.equal(y[:, :cols], x[:, :cols]), msg
    assert torch.isnan(y[:, cols:]).all(), "wrote past the row's end: " + msg
    assert torch.isnan(guard).all(), "wrote past the buffer: " + msg
    assert torch.equal(z[:, :cols], x[:, :cols]), msg
    assert (z[:, cols:] == fill).all(), "tail not filled: " + msg


# ---- 16 bytes at any address ---------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 203])
def test_sixteen_bytes_at_every_offset_are_joined_from_their_lines(torch, gen, n):
    """load16_shifted at each byte offset of a line and each length up to 16 (the last threads ask
    for fewer bytes, their reads stay in the lines that hold them: memcheck runs this file's
    kernels through benchmarks/sanitize.py's rotated and matvec cases)."""
    x = torch.randint(0, 256, (n,), generator=gen.g, device="cuda", dtype=torch.uint8)
    y = torch.full((16 * n,), 0xEE, device="cuda", dtype=torch.uint8)
    kernel("shifted_bytes")((cdiv(n, 64),), (64,), [x, y, n], sync=True)
    got = y.view(n, 16)
    for t in range(n):
        want = min(16, n - t)
        assert torch.equal(got[t, :want], x[t:t + want]), f"offset {t}, seed {gen.seed_value}"
        assert (got[t, want:] == 0xEE).all(), f"offset {t} wrote past its bytes"


# ---- cp.async ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tname,rows,cols,ld", [
    ("f16", 100, 150, 150), ("f16", 100, 150, 157), ("f16", 32, 64, 64), ("f16", 7, 5, 9),
    ("f32", 70, 130, 130), ("f32", 200, 64, 67)])
def test_cp_async_pipeline_copy_zero_fills(torch, gen, tname, rows, cols, ld):
    dt = torch.float16 if tname == "f16" else torch.float32
    x = randn(torch, gen, rows, ld, dtype=dt)
    rows_p, cols_p = cdiv(rows, 32) * 32, cdiv(cols, 64) * 64
    y, guard = nan_buffer(torch, (rows_p, cols_p), dt)
    kernel(f"pipeline_copy_{tname}")(cdiv(cols, 64), 128,
                                     [x, y, rows, cols, ld, rows_p, cols_p, cols_p], sync=True)
    msg = f"seed {gen.seed_value}"
    assert torch.equal(y[:rows, :cols], x[:, :cols]), msg
    assert (y[rows:, :] == 0).all() and (y[:, cols:] == 0).all(), "not zero-filled: " + msg
    assert torch.isnan(guard).all(), msg


@pytest.mark.parametrize("rows,cols,ld", [(70, 130, 130), (33, 64, 64), (5, 17, 21)])
def test_synchronous_tile_copy(torch, gen, rows, cols, ld):
    x = randn(torch, gen, rows, ld, dtype=torch.bfloat16)
    y, guard = nan_buffer(torch, (rows, ld), torch.bfloat16)
    kernel("tile_copy_bf16")((cdiv(cols, 64), cdiv(rows, 32)), 128, [x, y, rows, cols, ld],
                             sync=True)
    msg = f"seed {gen.seed_value}"
    assert torch.equal(y[:, :cols], x[:, :cols]), msg
    assert torch.isnan(y[:, cols:]).all() and torch.isnan(guard).all(), msg


# ---- reductions --------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols", [(9, 1), (13, 100), (4, 1000)])
def test_warp_reductions(torch, gen, rows, cols):
    x = randn(torch, gen, rows, cols)
    sums = torch.full((rows,), float("nan"), device="cuda")
    maxes = torch.full((rows,), float("nan"), device="cuda")
    kernel("warp_reduce_rows")(cdiv(rows * 32, 128), 128, [x, sums, maxes, rows, cols], sync=True)
    msg = f"seed {gen.seed_value}"
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-4, msg=msg)
    assert torch.equal(maxes, x.amax(1)), msg


@pytest.mark.parametrize("threads", [32, 96, 256, 1024])
def test_block_reductions(torch, gen, threads):
    rows, cols = 7, 3001
    x = randn(torch, gen, rows, cols)
    sums = torch.full((rows,), float("nan"), device="cuda")
    maxes = torch.full((rows,), float("nan"), device="cuda")
    kernel("block_reduce_rows")(rows, threads, [x, sums, maxes, cols], sync=True)
    msg = f"seed {gen.seed_value}"
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-3, msg=msg)
    assert torch.equal(maxes, x.amax(1)), msg


@pytest.mark.parametrize("splits,block", [(1, (32, 1)), (7, (32, 3)), (64, (64, 2))])
def test_last_to_arrive_combines_each_split_once_and_resets_its_counter(torch, gen, splits, block):
    rows, cols = 300, 4099
    x = randn(torch, gen, rows, cols)
    counters = torch.zeros(rows, device="cuda", dtype=torch.int32)
    partials = torch.full((splits, rows), float("nan"), device="cuda")
    runs = []
    for _ in range(3):  # the same counters: each launch finds them zero again
        sums = torch.full((rows,), float("nan"), device="cuda")
        kernel("split_row_sums")((rows, splits), block, [x, partials, counters, sums, cols], sync=True)
        runs.append(sums)
    msg = f"seed {gen.seed_value}"
    assert torch.count_nonzero(counters).item() == 0, msg
    torch.testing.assert_close(runs[0], x.sum(1), rtol=1e-5, atol=1e-3, msg=msg)
    # the partials are added in split order, whichever block arrives last: the same bits every run
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2]), msg
    ordered = torch.zeros(rows, device="cuda")
    for s in range(splits):
        ordered = ordered + partials[s]
    assert torch.equal(runs[0], ordered), msg


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 27), (5, 3)])
def test_fragment_layout_and_quad_row_reductions(torch, gen, rows, cols):
    x = randn(torch, gen, rows, cols)
    y, guard = nan_buffer(torch, (rows, cols), torch.float32)
    sums = torch.full((rows,), float("nan"), device="cuda")
    maxes = torch.full((rows,), float("nan"), device="cuda")
    warps = cdiv(rows, 16)
    kernel("fragment_rows")(warps, 32, [x, y, sums, maxes, rows, cols], sync=True)
    msg = f"seed {gen.seed_value}"
    r = torch.arange(rows, device="cuda", dtype=torch.float32)[:, None]
    c = torch.arange(cols, device="cuda", dtype=torch.float32)[None, :]
    assert torch.equal(y, x + (r * 1000 + c)), msg
    assert torch.isnan(guard).all(), msg
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-5, msg=msg)
    assert torch.equal(maxes, x.amax(1)), msg


# ---- tensor cores ------------------------------------------------------------------------------

GEMMS = [("bf16", "kn", "f32"), ("bf16", "nk", "bf16"), ("f16", "kn", "f16"), ("f16", "nk", "f32")]
SHAPES = [(64, 64, 32), (128, 128, 64), (77, 53, 45), (64, 200, 130), (1, 1, 1), (130, 70, 300)]


@pytest.mark.parametrize("tin,layout,tout", GEMMS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_mma_tile_product_matches_matmul(torch, gen, tin, layout, tout, m, n, k):
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    a = randn(torch, gen, m, k, dtype=dt[tin])
    b = randn(torch, gen, k, n, dtype=dt[tin])
    b_arg = b if layout == "kn" else b.t().contiguous()
    c, guard = nan_buffer(torch, (m, n), dt[tout])
    alpha = 0.5
    kernel(f"gemm_{tin}_{layout}_{tout}")((cdiv(n, 64), cdiv(m, 64)), 128,
                                          [a, b_arg, c, m, n, k, alpha], sync=True)
    ref = alpha * (a.double() @ b.double())
    msg = f"seed {gen.seed_value}"
    assert not torch.isnan(c).any(), "unwritten output: " + msg
    assert torch.isnan(guard).all(), "wrote past the output: " + msg
    tol = 1e-4 if tout == "f32" else 1e-2
    assert rel_err(torch, c, ref) < tol, msg


def test_accumulator_to_a_operand(torch, gen):
    x = randn(torch, gen, 16, 32)
    b = randn(torch, gen, 32, 16, dtype=torch.bfloat16)
    y = torch.full((16, 16), float("nan"), device="cuda")
    kernel("to_a_bf16")(1, 32, [x, b, y], sync=True)
    ref = x.to(torch.bfloat16).double() @ b.double()
    assert rel_err(torch, y, ref) < 1e-4, f"seed {gen.seed_value}"


# ---- online softmax ----------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols", [(10, 200), (3, 32), (5, 7), (2, 1000)])
def test_online_softmax_over_chunks(torch, gen, rows, cols):
    x = randn(torch, gen, rows, cols) * 4
    mask = torch.rand(rows, cols, generator=gen.g, device="cuda") < 0.2
    x = x.masked_fill(mask, float("-inf"))
    x[1, :] = float("-inf")  # a fully masked row
    scale = 0.7
    y = torch.full_like(x, float("nan"))
    lse = torch.full((rows,), float("nan"), device="cuda")
    kernel("softmax_rows")(cdiv(rows * 32, 128), 128, [x, y, lse, rows, cols, scale], sync=True)
    ref = torch.softmax(x.double() * scale, dim=-1).nan_to_num(0.0)
    msg = f"seed {gen.seed_value}"
    assert not torch.isnan(y).any(), msg
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6, msg=msg)
    assert (y[1] == 0).all(), msg
    ref_lse = torch.logsumexp(x.double() * scale, dim=-1)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5, msg=msg)


@pytest.mark.parametrize("tname", ["bf16", "f16"])
@pytest.mark.parametrize("nq,nk", [(64, 64), (100, 77), (128, 200), (17, 5)])
@pytest.mark.parametrize("mask_mode", [0, 1, 2])
def test_attention_with_online_softmax_on_tensor_cores(torch, gen, tname, nq, nk, mask_mode):
    dt = torch.bfloat16 if tname == "bf16" else torch.float16
    d = 64
    q = randn(torch, gen, nq, d, dtype=dt)
    k = randn(torch, gen, nk, d, dtype=dt)
    v = randn(torch, gen, nk, d, dtype=dt)
    o, guard = nan_buffer(torch, (nq, d), torch.float32)
    lse = torch.full((nq,), float("nan"), device="cuda")
    scale = 1.0 / math.sqrt(d)
    kernel(f"attention_{tname}")(cdiv(nq, 64), 128, [q, k, v, o, lse, nq, nk, scale, mask_mode],
                                 sync=True)
    s = (q.double() @ k.double().t()) * scale
    qi = torch.arange(nq, device="cuda")[:, None]
    kj = torch.arange(nk, device="cuda")[None, :]
    if mask_mode == 1:
        s = s.masked_fill(kj > qi, float("-inf"))
    if mask_mode == 2:
        s = s.masked_fill((qi % 3 == 0).expand(nq, nk), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    ref = p @ v.double()
    msg = f"seed {gen.seed_value}"
    assert not torch.isnan(o).any(), "NaN or unwritten output: " + msg
    assert torch.isnan(guard).all(), msg
    assert rel_err(torch, o, ref) < 1e-2, msg
    if mask_mode == 2:
        assert (o[0::3] == 0).all(), "fully masked rows must be 0: " + msg
    ref_lse = torch.logsumexp(s, dim=-1)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=1e-3, atol=1e-3,
                               msg=msg)
    assert (lse[~finite] == float("-inf")).all(), msg


# ---- Hopper ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 1024, 3000])
def test_hopper_mbarrier_bulk_copy_and_proxy_fence(torch, gen, n):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs sm_90")
    x = randn(torch, gen, n)
    y, guard = nan_buffer(torch, (n,), torch.float32)
    kernel("hopper_bulk_roundtrip")(cdiv(n, 1024), 128, [x, y, n], sync=True)
    assert torch.equal(y, 2 * x + 1), f"seed {gen.seed_value}"
    assert torch.isnan(guard).all()


# ---- runtime -----------------------------------------------------------------------------------

def test_arch_detection_and_module_reuse(torch):
    from napkin.kernels import compile_module, detect_arch

    major, minor = torch.cuda.get_device_capability()
    arch = detect_arch()
    assert arch == ("sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}")
    m1 = compile_module(SOURCE, filename="device_tests.cu")
    m2 = compile_module(SOURCE, filename="device_tests.cu")
    assert m1 is m2 and m1.arch == arch
    assert kernel("softmax_rows").module is m1
    assert (Path(os.environ["NAPKIN_CACHE_DIR"]) / f"{m1.key}.cubin").is_file()


def test_cached_cubin_loads_in_a_fresh_process_state(torch, gen, monkeypatch):
    import napkin.kernels.compile as comp

    kernel("warp_reduce_rows")  # make sure the entry exists
    monkeypatch.setattr(comp, "_modules", {})
    monkeypatch.setattr(comp, "nvrtc_compile",
                        lambda *a, **k: pytest.fail("compiled again instead of using the cache"))
    from napkin.kernels import KernelCache

    monkeypatch.setattr(comp, "default_cache", lambda: KernelCache())
    k = comp.compile_kernel(SOURCE, "warp_reduce_rows", filename="device_tests.cu")
    x = randn(torch, gen, 3, 50)
    sums = torch.empty(3, device="cuda")
    maxes = torch.empty(3, device="cuda")
    k(1, 128, [x, sums, maxes, 3, 50], sync=True)
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-4)


def test_dynamic_shared_memory_above_48k_and_attributes(torch, gen):
    from napkin.errors import LaunchError

    k = kernel("dyn_smem_reverse")
    n = 25_000  # 100 KB
    x = randn(torch, gen, n)
    y = torch.full_like(x, float("nan"))
    k(1, 256, [x, y, n], shared_mem=n * 4, sync=True)
    assert torch.equal(y, x.flip(0))
    attrs = k.attributes()
    assert attrs.registers > 0 and attrs.max_threads_per_block >= 256
    with pytest.raises(LaunchError, match="dynamic shared memory"):
        k(1, 256, [x, y, n], shared_mem=10 ** 7)


def test_launch_runs_on_torch_current_stream(torch, gen):
    k = kernel("dyn_smem_reverse")
    n = 1000
    x = randn(torch, gen, n)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = torch.full_like(x, float("nan"))
        k(1, 128, [x, y, n], shared_mem=n * 4)
        z = y * 2  # queued behind the kernel on the same stream
    stream.synchronize()
    assert torch.equal(z, 2 * x.flip(0))


def test_launch_errors(torch):
    from napkin.errors import LaunchError

    k = kernel("dyn_smem_reverse")
    x = torch.zeros(4, device="cuda")
    with pytest.raises(LaunchError, match="argument 0 is a CPU tensor"):
        k(1, 32, [torch.zeros(4), x, 4])
    with pytest.raises(LaunchError, match="32-bit int"):
        k(1, 32, [x, x, 2 ** 40])
    with pytest.raises(LaunchError, match="1024"):
        k(1, 2048, [x, x, 4])


def test_check_tensor_on_cuda(torch):
    from napkin.errors import LaunchError
    from napkin.kernels import check_tensor

    x = torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16)
    assert check_tensor(x, "x", dtype="bf16", shape=(4, 8), device="cuda:0", align=16) is x
    with pytest.raises(LaunchError, match="x: is not contiguous"):
        check_tensor(x.t(), "x")
    with pytest.raises(LaunchError, match="x: is on cuda:0, expected cuda:1"):
        check_tensor(x, "x", device="cuda:1")


def test_nvrtc_compile_error_shows_source_lines(torch):
    from napkin.errors import CodegenError
    from napkin.kernels import compile_kernel

    bad = ('#include "napkin.cuh"\n'
           'extern "C" __global__ void broken(float* y) {\n'
           '  float v = napkin::warp_summ(y[threadIdx.x]);\n'
           '  y[0] = v;\n'
           '}\n')
    with pytest.raises(CodegenError) as info:
        compile_kernel(bad, "broken")
    text = str(info.value)
    assert "warp_summ" in text
    assert ">    3 |   float v = napkin::warp_summ(y[threadIdx.x]);" in text
