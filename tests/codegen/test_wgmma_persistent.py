"""The wgmma template's persistent grid: at most one block per SM walks the output tiles (of every
batch element and every share of a split sum), the next tile's chunks loading while this one's
results leave through each consumer's own staging block.

CPU tests: which kernels are persistent, their grid and shared memory. GPU tests (marked ``gpu``):
shapes with more work items than SMs, so that every block walks several tiles (with edges that
are not tile multiples, a batch, a split sum, the dual kernel and an epilogue), through
``napkin.codegen.verify`` (fresh random inputs, NaN-poisoned outputs, float64 reference).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from napkin.codegen.families.contraction import (DUAL_CONFIGS, DUAL_PINGPONG_CONFIGS, FAMILY, WGMMA_CONFIGS,
                                                 WGMMA_PINGPONG_CONFIGS, WIDE_PINGPONG_MIN_CHUNKS, MatmulConfig,
                                                 _wide_pingpong, analyze, wgmma_persistent)
from napkin.diagrams import library
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import KernelOptions

try:
    from .test_contraction_nvcc import gate_up
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_nvcc import gate_up


def _launch(d, cfg, gpu="h100"):
    s = FAMILY.schedule(d, cfg, gpu=gpu)
    return next(k for k in FAMILY.lower(d, s, "sm_90a").launches if k.template == "matmul_wgmma.cu.jinja")


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_grid_is_one_block_per_sm_at_most(cfg):
    cfg = MatmulConfig(False, *cfg, wgmma=True)
    big = library.get("matmul").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    k = _launch(big, cfg)
    tiles = math.ceil(4096 / cfg.BM) * math.ceil(4096 / cfg.BN)
    assert tiles > 132 and k.grid == (132, 1, 1)
    assert dict(k.tunables)["persistent"] is True and "PERSISTENT = true" in k.source
    small = library.get("matmul").with_dtype("bf16").bind(a=296, b=512, c=296)
    assert _launch(small, cfg).grid == (math.ceil(296 / cfg.BM) * math.ceil(296 / cfg.BN), 1, 1)
    # the SM count comes from the GPU the schedule is made for
    assert _launch(big, cfg, gpu="a100-80gb").grid == (108, 1, 1)


def test_batch_and_splits_are_work_items_not_grid_rows():
    cfg = MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True)
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=3, a=300, b=256, c=136)
    k = _launch(d, cfg)
    assert k.grid == (3 * 3 * 2, 1, 1)  # 3 x 2 tiles of 128 x 128, 3 batch elements
    d = library.get("matmul").with_dtype("bf16").bind(a=256, b=65536, c=256)
    k = _launch(d, MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True, splits=40))
    assert k.grid == (132, 1, 1)  # 4 tiles x 40 shares = 160 items


def test_shared_memory_counts_the_staging_blocks():
    """A persistent kernel's consumers stage their rows beside the ring (64 x 72 elements each, or
    one or two swizzled 64 x 64 blocks each behind a kilobyte for the barriers, whichever is
    larger); the prologue and row-reduction kernels stage the tile in the ring and ask for nothing
    more."""
    d = library.get("matmul").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    p = analyze(d)
    assert wgmma_persistent(p)
    for c in WGMMA_CONFIGS:
        cfg = MatmulConfig(False, *c, wgmma=True)
        ring = cfg.stages * (cfg.BM + cfg.BN) * 64 * 2 + 1024
        consumers = cfg.BM // cfg.WM
        staging = max(128 + consumers * 64 * 72 * 2, 1024 + consumers * cfg.staging_blocks(2) * 64 * 64 * 2)
        assert cfg.smem_bytes(p, 2) == ring + staging
        assert cfg.smem_bytes(p, 2) <= 227 * 1024
    for c in DUAL_CONFIGS:
        dd = gate_up(True).with_dtype("bf16").bind(a=1000, b=512, f=776)
        assert MatmulConfig(False, *c, wgmma=True, dual=True).smem_bytes(analyze(dd), 2) <= 227 * 1024
    sm = library.get("gemm_softmax").with_dtype("bf16").bind(a=1000, b=256, c=200)
    ps = analyze(sm)
    assert not wgmma_persistent(ps)
    k = FAMILY.lower(sm, FAMILY.candidates(sm, "h100", "bf16")[0], "sm_90a").launches[0]
    assert "PERSISTENT = false" in k.source and "persistent" not in dict(k.tunables)
    assert k.grid[0] == math.ceil(1000 / dict(k.tunables)["BM"])


# ---------------------------------------------------------------------------------------- GPU


def _hopper():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma needs sm_90a")


def check(diagram, shapes, schedule):
    from napkin.codegen.verify import verify

    report = verify(diagram, dtype="bf16", shapes=shapes, family="contraction", schedule=schedule)
    print(report)
    assert report.ok, str(report)


def _sched(diagram, shape, cfg):
    return FAMILY.schedule(diagram.with_dtype("bf16").bind(**shape), cfg)


PINGPONG = [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS]
DUAL_PINGPONG = [MatmulConfig(False, *c, wgmma=True, dual=True, pingpong=True) for c in DUAL_PINGPONG_CONFIGS]


@pytest.mark.parametrize("cfg", PINGPONG + DUAL_PINGPONG, ids=lambda c: f"{'dual-' if c.dual else ''}{c.BM}x{c.BN}")
def test_pingpong_schedule_source_and_launch(cfg):
    """A ping-pong configuration: 2 consumer warpgroups over tiles of one consumer's rows (w_a = g_a),
    in the schedule's options, read back by config_of, built with PINGPONG and 384 threads, one
    block per SM at most, two staging blocks beside the ring and no cluster."""
    d = (gate_up(True).with_dtype("bf16").bind(a=4096, b=512, f=4096) if cfg.dual
         else library.get("matmul_t").with_dtype("bf16").bind(a=4096, b=512, c=4096))
    p = analyze(d)
    s = FAMILY.schedule(d, cfg)
    assert s.kernels[0].options.warpgroups == 2 and cfg.WM == cfg.BM
    assert FAMILY.config_of(p, s) == cfg
    k = _launch(d, cfg)
    assert "PINGPONG = true;" in k.source and "_pp_" in k.name and dict(k.tunables)["pingpong"] is True
    assert k.block == (384, 1, 1) and k.grid == (132, 1, 1) and "__cluster_dims__" not in k.source
    ring = cfg.stages * (cfg.BM + cfg.BN * (2 if cfg.dual else 1)) * 64 * 2
    staging = max(128 + 2 * 64 * 72 * 2, 1024 + 2 * cfg.staging_blocks(2) * 64 * 64 * 2)
    assert k.shared_bytes == cfg.smem_bytes(p, 2) == ring + 1024 + staging <= 227 * 1024
    # the launch estimate counts the tiles of one consumer (what the grid walks)
    est = FAMILY.launch_estimate(d, s, "h100")
    assert est["blocks"] == math.ceil(4096 / cfg.BM) * math.ceil(4096 / cfg.BN) and est["threads"] == 384


def test_pingpong_is_a_candidate_of_plain_and_dual_sums_only():
    """Ping-pong candidates: those with a cooperative twin (same tile), ahead of it; none for a row
    reduction or a prologue (not persistent)."""
    for d in (library.get("matmul").with_dtype("bf16").bind(a=4096, b=4096, c=4096),
              gate_up(True).with_dtype("bf16").bind(a=4096, b=4096, f=11008)):
        cfgs = [FAMILY.config_of(analyze(d), s) for s in FAMILY.candidates(d, "h100", "bf16")]
        pp = [i for i, c in enumerate(cfgs) if c.pingpong]
        assert pp, d.name
        for i in pp:  # the next candidate is the cooperative kernel of the same tile
            assert (cfgs[i + 1].BM, cfgs[i + 1].BN, cfgs[i + 1].pingpong) == (cfgs[i].BM, cfgs[i].BN, False)
    for name, sizes in (("rmsnorm_linear", dict(r=4096, x=1024, c=4096)), ("gemm_softmax", dict(a=4096, b=1024, c=200))):
        d = library.get(name).with_dtype("bf16").bind(**sizes)
        assert not any(FAMILY.config_of(analyze(d), s).pingpong for s in FAMILY.candidates(d, "h100", "bf16")), name


def test_the_wide_pingpong_tile_is_offered_for_plain_products_only():
    """The ping-pong 128 x 192 tile (192 accumulators a consumer thread) is a candidate of a plain
    product, unsplit; an epilogue, a split sum or a row reduction is refused with one message (its
    maps would spill: nvcc, sm_90a, 8 to 192 bytes)."""
    wide = next(c for c in PINGPONG if _wide_pingpong(c))
    assert (wide.BM, wide.BN, wide.WM) == (128, 192, 128)
    mm = library.get("matmul").with_dtype("bf16").bind(a=12800, b=768, c=3072)
    cfgs = [FAMILY.config_of(analyze(mm), s) for s in FAMILY.candidates(mm, "h200", "bf16")]
    assert [c for c in cfgs if _wide_pingpong(c)] == [wide]
    for k, offered in ((64 * WIDE_PINGPONG_MIN_CHUNKS, True), (64 * (WIDE_PINGPONG_MIN_CHUNKS - 1), False)):
        short = library.get("matmul").with_dtype("bf16").bind(a=12800, b=k, c=3072)
        got = [_wide_pingpong(FAMILY.config_of(analyze(short), s)) for s in FAMILY.candidates(short, "h200", "bf16")]
        assert any(got) is offered, k
    mlp = library.get("mlp").with_dtype("bf16").bind(a=12800, b=768, c=3072)
    assert not any(_wide_pingpong(FAMILY.config_of(analyze(mlp), s)) for s in FAMILY.candidates(mlp, "h200", "bf16"))
    with pytest.raises(CodegenError, match="192 fp32 accumulators per thread leave no registers for an epilogue"):
        FAMILY.lower(mlp, FAMILY.schedule(mlp, wide), "sm_90a")
    with pytest.raises(CodegenError, match="192 fp32 accumulators per thread leave no registers .* split sum"):
        FAMILY.lower(mm, FAMILY.schedule(mm, replace(wide, splits=2)), "sm_90a")
    odd = library.get("matmul").with_dtype("bf16").bind(a=8205, b=2949, c=5921)  # rows of 5921: no TMA stores
    assert not any(_wide_pingpong(FAMILY.config_of(analyze(odd), s)) for s in FAMILY.candidates(odd, "h200", "bf16"))
    with pytest.raises(CodegenError, match="need the output to leave by TMA"):
        FAMILY.lower(odd, FAMILY.schedule(odd, wide), "sm_90a")
    wider = MatmulConfig(False, 128, 256, 64, 128, 256, 4, wgmma=True, pingpong=True)
    with pytest.raises(CodegenError, match="256 fp32 accumulators per thread; at most 128 fit, or 192"):
        FAMILY.lower(mm, FAMILY.schedule(mm, wider), "sm_90a")


def test_pingpong_refusals():
    """Ping-pong needs the persistent kernel (not a row reduction's), and the consumer count must
    be the tile's: one clear error each."""
    g = library.get("gemm_softmax").with_dtype("bf16").bind(a=1000, b=256, c=200)
    s = FAMILY.schedule(g, MatmulConfig(False, 128, 256, 64, 128, 256, 4, wgmma=True, pingpong=True))
    with pytest.raises(CodegenError, match="ping-pong consumers .* need the persistent kernel"):
        FAMILY.lower(g, s, "sm_90a")
    d = library.get("matmul").with_dtype("bf16").bind(a=1000, b=256, c=700)
    s = FAMILY.schedule(d, MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True))
    s = s.replace(kernels=(s.kernels[0].replace(options=KernelOptions(engine="wgmma", stages=4, warpgroups=3)),))
    with pytest.raises(CodegenError, match="3 consumer warpgroups; the tile takes 2"):
        FAMILY.lower(d, s, "sm_90a")


@pytest.fixture(params=[1, 2], ids=lambda v: f"cluster{v}")
def variant(request, monkeypatch):
    """Blocks per cluster (2: the cluster's blocks share their B tiles through TMA multicast)."""
    import napkin.codegen.families.contraction as contraction

    monkeypatch.setattr(contraction, "WGMMA_CLUSTER", request.param)
    return request.param


def test_variants_source_and_launch(variant):
    cluster = variant
    d = library.get("matmul_t").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    cfg = MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True)
    k = _launch(d, cfg)
    assert k.grid[0] % cluster == 0 and k.grid[0] == 132 // cluster * cluster
    assert ("__cluster_dims__(2, 1, 1)" in k.source) == (cluster == 2)
    assert dict(k.tunables).get("cluster", 1) == cluster
    assert k.shared_bytes == 4 * (128 + 256) * 64 * 2 + 1024 + 1024 + 2 * 2 * 64 * 64 * 2
    maps = {a.name: a.value for a in k.args if a.kind == "tmap"}
    # the cluster's blocks copy B in parts; each stores its own output blocks
    assert maps == {"A": (64, 128), "B": (64, 256 // cluster), "C": (64, 64)}
    g = library.get("gemm_softmax").with_dtype("bf16").bind(a=1000, b=256, c=200)
    s = FAMILY.lower(g, FAMILY.candidates(g, "h100", "bf16")[0], "sm_90a").launches[0].source
    assert "__cluster_dims__" not in s and "PERSISTENT = false" in s


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_every_block_walks_several_tiles(cfg, variant):
    """More tiles than SMs, edges that are not tile multiples, an epilogue (bias, GELU) that reads
    each tile's row and column indices: a tile walked second or third must land where it belongs
    (an odd number of block rows leaves a cluster's second block a tile past the last row)."""
    _hopper()
    cfg = MatmulConfig(False, *cfg, wgmma=True)
    shape = dict(a=2900, b=200, c=2 * 132 * 8)  # 23 (12) x 9 (17) tiles: several items a block
    check(library.get("mlp"), [shape], _sched(library.get("mlp"), shape, cfg))


@pytest.mark.gpu
def test_batched_split_and_dual_items(variant):
    _hopper()
    bmm = library.get("batched_matmul")
    shape = dict(n=45, a=300, b=256, c=136)  # 3 x 2 tiles x 45 = 270 items
    check(bmm, [shape], _sched(bmm, shape, MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True)))
    mlp = library.get("mlp")
    shape = dict(a=700, b=2048, c=300)  # 6 x 3 tiles x 9 shares = 162 items (7 chunks a share)
    check(mlp, [shape], _sched(mlp, shape, MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True, splits=9)))
    d = gate_up(True)
    shape = dict(a=1500, b=128, f=1480)  # 12 x 12 tiles of 128 x 128
    check(d, [shape], _sched(d, shape, MatmulConfig(False, *DUAL_CONFIGS[0], wgmma=True, dual=True)))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", PINGPONG, ids=lambda c: f"{c.BM}x{c.BN}")
def test_pingpong_consumers_alternate_items(cfg):
    """The ping-pong kernel: each block's items alternate between its two consumers (an odd count
    of them in some blocks, edges that are not tile multiples, an epilogue reading each tile's row
    and column indices; operands stored either way round; a batch; a split sum with empty shares).
    The wide tile (192 accumulators a thread) runs plain products whose output leaves by TMA: the
    same walks without the epilogue and the split, and output rows (3000, 296) that end inside its
    192-column tiles."""
    _hopper()
    wide = _wide_pingpong(cfg)
    mlp = library.get("mlp")
    mm = library.get("matmul")
    shape = dict(a=2900, b=200, c=2 * 132 * 8 + 40)
    check(mm if wide else mlp, [shape], _sched(mm if wide else mlp, shape, cfg))
    try:
        from .test_contraction_nvcc import mm_layout
    except ImportError:
        from test_contraction_nvcc import mm_layout
    kn = mm_layout(False, False)
    shape = dict(a=1000, b=520, c=3000)
    check(kn, [shape], _sched(kn, shape, cfg))
    bmm = library.get("batched_matmul")
    shape = dict(n=45, a=300, b=256, c=136)
    check(bmm, [shape], _sched(bmm, shape, cfg))
    shape = dict(a=700, b=2048, c=300)
    if wide:  # (its output leaves by TMA: rows of 296 elements, 592 bytes)
        shape = dict(a=700, b=2048, c=296)
        check(library.get("matmul_t"), [shape], _sched(library.get("matmul_t"), shape, cfg))
    else:
        check(mlp, [shape], _sched(mlp, shape, replace(cfg, splits=9)))


@pytest.mark.gpu
@pytest.mark.parametrize("pingpong", [True, False], ids=["pingpong", "cooperative"])
def test_tma_store_blocks_past_the_edges_repeated(pingpong):
    """TMA stores with 64 x 64 blocks wholly past M (rows 320.. of a 300-row batch element) and
    past N (columns 192.. of 136): such a block commits an empty bulk group. When it committed
    none, the next staged block could overwrite a staging block its copy was still reading (H200:
    the ping-pong kernel wrong in 21 of 60 runs, error up to 5.5e-2); sixteen runs on fresh inputs
    catch that with near certainty."""
    _hopper()
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    bmm = library.get("batched_matmul")
    shape = dict(n=45, a=300, b=256, c=136)
    cfg = MatmulConfig(False, 128, 128, 64, 128 if pingpong else 64, 128, 6, wgmma=True, pingpong=pingpong)
    cd = napkin_compile(bmm, sizes=shape, dtype="bf16", family="contraction", schedule=_sched(bmm, shape, cfg))
    k = next(k for k in cd.launches if k.template == "matmul_wgmma.cu.jinja")
    assert "TMA_STORE = true" in k.source
    for seed in range(16):
        rows = verify_compiled(cd, seed=seed)
        assert all(r.ok for r in rows), f"seed {seed}: {rows}"


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", DUAL_PINGPONG, ids=lambda c: f"{c.BM}x{c.BN}")
def test_pingpong_dual(cfg):
    _hopper()
    for b_kmajor in (True, False):
        d = gate_up(b_kmajor)
        shape = dict(a=1500, b=200, f=1480)
        check(d, [shape], _sched(d, shape, cfg))


def test_the_stagger_setting_reaches_the_source(monkeypatch):
    """WGMMA_STAGGER (off by default) starts consumer 1 of a cooperative persistent kernel STAGES - 2
    chunks behind consumer 0; never in a ping-pong kernel, whose consumers own whole tiles."""
    import napkin.codegen.families.contraction as contraction

    d = library.get("matmul_t").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    coop = MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True)
    assert "LEAD = (false &&" in _launch(d, coop).source
    monkeypatch.setattr(contraction, "WGMMA_STAGGER", True)
    on = _launch(d, coop)
    assert "LEAD = (true && PERSISTENT && !PINGPONG && CONSUMERS == 2)" in on.source
    monkeypatch.setattr(contraction, "WGMMA_STAGGER", False)
    assert _launch(d, coop).name != on.name  # the setting is part of the kernel's name (its cache key)


@pytest.mark.parametrize("sizes, wide", [
    (dict(a=12800, b=768, c=3072), True),   # measured 82.7 against 93.3 us (cooperative 128 x 256)
    (dict(a=8192, b=1024, c=8192), True),   # 177.2 against 189.9
    (dict(a=12800, b=3072, c=3072), True),  # 309.1 against 323.7
    (dict(a=4096, b=4096, c=4096), False),  # 186.9 against 172.8: 5.3 rounds of 128 x 192 tiles
    (dict(a=16384, b=32, c=16384), False),  # 156.3 against 150.8: one chunk, nothing to overlap
])
def test_the_planner_takes_the_tile_measured_fastest(sizes, wide):
    """H200, bf16, kernels: the wide ping-pong tile against the cooperative 128 x 256
    (``benchmarks/results/nvidia-h200/wgmma_pingpong_wide.jsonl``). The model sees the cooperative
    kernel's stores after each tile's loop and the rounds each tile size makes."""
    from napkin.codegen import select

    d = library.get("matmul").with_dtype("bf16").bind(**sizes)
    best = select.rank(d, FAMILY, "h200", "bf16")[0].schedule
    cfg = FAMILY.config_of(analyze(d), best)
    assert _wide_pingpong(cfg) is wide, cfg
    if not wide:
        assert (cfg.BM * cfg.BN, cfg.pingpong) == (128 * 256, False)


@pytest.mark.gpu
def test_a_batch_past_a_grid_dimension():
    """More batch elements than a grid dimension holds (65535): the persistent kernel numbers them
    in its work items (the mma.sync and SIMT templates fold them into grid.z instead, and the
    planner now takes them there: tests/codegen/test_grid_fold_gpu.py)."""
    _hopper()
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled

    shape = dict(n=70000, a=20, b=40, c=72)
    d = library.get("batched_matmul").with_dtype("bf16").bind(**shape)
    sched = next(s for s in FAMILY.candidates(d, "h200", "bf16") if s.kernels[0].options.engine == "wgmma")
    cd = napkin_compile(d, schedule=sched, family="contraction")
    (k,) = [k for k in cd.launches if k.template == "matmul_wgmma.cu.jinja"]
    assert dict(k.tunables)["persistent"] is True
    rows = verify_compiled(cd, seed=3)
    assert rows and all(r.ok for r in rows), rows
