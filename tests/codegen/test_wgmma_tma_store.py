"""The persistent wgmma kernel's output stores by TMA (``WGMMA_TMA_STORE``): each consumer rounds a
64 x 64 block into a swizzled staging block and one thread sends it to HBM with a TMA copy that
runs on while the consumer goes to its next block or item.

CPU tests: which outputs leave that way (and which keep the 16-byte stores), what the launch
carries (the output's tensor map, the staging blocks in its shared memory). GPU tests (marked
``gpu``): outputs whose rows or columns end inside a block, batches whose rows end inside a block
or whose last tile reaches past them, the ping-pong and dual kernels, an epilogue, and a given output one element into its
storage (TMA cannot write it: the program runs without TMA), through ``napkin.codegen.verify``
(fresh random inputs, NaN-poisoned outputs, float64 reference).
"""

from __future__ import annotations

import pytest

import napkin.codegen.families.contraction as contraction
from napkin.codegen.families.contraction import (FAMILY, WGMMA_CONFIGS, WGMMA_PINGPONG_CONFIGS, MatmulConfig, analyze,
                                                 wgmma_tma_store)
from napkin.diagrams import Axis, Diagram, array, contract, library

try:
    from .test_contraction_nvcc import gate_up, mm_epilogue
    from .test_wgmma_persistent import _hopper, _sched, check
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_nvcc import gate_up, mm_epilogue
    from test_wgmma_persistent import _hopper, _sched, check

COOP = MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True)  # 128 x 256, two consumers of 64 rows


def _launch(d, cfg=COOP):
    s = FAMILY.schedule(d, cfg, gpu="h200")
    return next(k for k in FAMILY.lower(d, s, "sm_90a").launches if k.template == "matmul_wgmma.cu.jinja")


def _batch_after_rows() -> Diagram:
    """Y[a, n, c] = Σ_b A[n, a, b] · B[n, c, b]: the batch axis n lies between the rows and columns
    of the output, so its rows do not flatten into one row axis."""
    n, a, b, c = Axis("n"), Axis("a"), Axis("b"), Axis("c")
    return Diagram("bmm_anc", contract(array("A", n, a, b), array("B", n, c, b), over=b, out=(a, n, c), name="Y"))


@pytest.mark.parametrize("name, diagram, sizes, cfg, want", [
    ("plain", library.get("matmul"), dict(a=1000, b=64, c=200), COOP, True),
    ("rows of 201 elements", library.get("matmul"), dict(a=1000, b=64, c=201), COOP, False),
    ("batch, 192 rows", library.get("batched_matmul"), dict(n=3, a=192, b=64, c=136), COOP, True),
    ("batch, 300 rows", library.get("batched_matmul"), dict(n=3, a=300, b=64, c=136), COOP, True),
    ("batch between rows and columns", _batch_after_rows(), dict(n=3, a=192, b=64, c=136), COOP, False),
    ("residual staged", mm_epilogue(), dict(a=1000, b=64, c=200), COOP, False),
    ("split sum", library.get("matmul"), dict(a=256, b=65536, c=256),
     MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True, splits=8), False),
    ("dual", gate_up(True), dict(a=1000, b=64, f=200), MatmulConfig(False, 128, 128, 64, 64, 128, 4, wgmma=True,
                                                                   dual=True), True),
])
def test_which_outputs_leave_by_tma(name, diagram, sizes, cfg, want):
    d = diagram.with_dtype("bf16").bind(**sizes)
    k = _launch(d, cfg)
    staged = contraction._tiled_like_output(d, analyze(d))[:1]
    assert wgmma_tma_store(d, analyze(d), cfg, staged) is want, name
    assert (dict(k.tunables).get("tma_store") is not None) is want, name
    assert ("TMA_STORE = true;" in k.source) is want, name
    maps = [a for a in k.args if a.kind == "tmap"]
    box = (64, 64, 1) if analyze(d).batch else (64, 64)  # [batch][M][N]: each copy stops at M
    assert any(a.name == d.output_names[0] and a.value == box for a in maps) is want, name


def test_row_reductions_keep_their_staged_tile():
    """A GEMM -> softmax (not persistent: the tile is staged in the ring) never stores by TMA."""
    d = library.get("gemm_softmax").with_dtype("bf16").bind(a=1000, b=256, c=200)
    k = FAMILY.lower(d, FAMILY.candidates(d, "h200", "bf16")[0], "sm_90a").launches[0]
    assert "TMA_STORE = false;" in k.source and "tma_store" not in dict(k.tunables)


def test_the_setting_turns_it_off_and_names_the_kernel(monkeypatch):
    d = library.get("matmul").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    on = _launch(d)
    monkeypatch.setattr(contraction, "WGMMA_TMA_STORE", False)
    off = _launch(d)
    assert "TMA_STORE = false;" in off.source and "tma_store" not in dict(off.tunables)
    assert off.name != on.name  # the setting is part of the kernel's name (its cache key)
    assert [a.kind for a in off.args].count("tmap") == 2 and [a.kind for a in on.args].count("tmap") == 3


@pytest.mark.parametrize("cfg", [MatmulConfig(False, *c, wgmma=True) for c in WGMMA_CONFIGS]
                         + [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS],
                         ids=lambda c: f"{c.BM}x{c.BN}{'-pp' if c.pingpong else ''}")
def test_staging_blocks_fit_beside_the_ring(cfg):
    """As many staging blocks a consumer as fit in 227 KB, up to the 64 x 64 blocks of its share of
    a tile (at most 4), at least one; the launch asks for the ring, its alignment, the barriers'
    kilobyte and the blocks (never less than the padded staging blocks the 16-byte stores use)."""
    d = library.get("matmul").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    k = _launch(d, cfg)
    ebuf = dict(k.tunables)["tma_store"]
    ring = cfg.stages * (cfg.BM + cfg.BN) * 64 * 2
    per_tile = cfg.WM // 64 * cfg.BN // 64
    fits = [n for n in range(1, min(4, per_tile) + 1) if ring + 2048 + cfg.consumers * n * 8192 <= 227 * 1024]
    assert ebuf == max(fits, default=1)
    want = ring + 1024 + max(128 + cfg.consumers * 64 * 72 * 2, 1024 + cfg.consumers * ebuf * 8192)
    assert k.shared_bytes == cfg.smem_bytes(analyze(d), 2) == want <= 227 * 1024
    assert f"EBUF = {ebuf};" in k.source


def test_a_shallower_ring_stages_every_block_of_a_tile():
    """The cooperative 128 x 256 tile pinned to 3 stages keeps all 4 of a consumer's blocks (4
    stages leave room for 2); the wide ping-pong tile (128 x 192, 6 blocks a consumer) keeps 4."""
    d = library.get("matmul").with_dtype("bf16").bind(a=4096, b=512, c=4096)
    three = MatmulConfig(False, 128, 256, 64, 64, 256, 3, wgmma=True)
    assert three.staging_blocks(2) == 4 and COOP.staging_blocks(2) == 2
    k = _launch(d, three)
    assert "EBUF = 4;" in k.source and dict(k.tunables)["tma_store"] == 4
    wide = MatmulConfig(False, *WGMMA_PINGPONG_CONFIGS[-1], wgmma=True, pingpong=True)
    assert (wide.BN, wide.WM, wide.staging_blocks(2)) == (192, 128, 4)


# ---------------------------------------------------------------------------------------- GPU


def test_a_dynamic_row_count_keeps_one_kernel():
    """Whether the output leaves by TMA does not depend on M: a batched product planned at 64 and
    at 300 rows has one source (the 3-D tensor map clips each element's rows)."""
    bmm = library.get("batched_matmul").with_dtype("bf16")
    a, b = (_launch(bmm.bind(n=3, a=m, b=64, c=136)) for m in (64, 300))
    assert a.source == b.source and "tma_store_3d(" in a.source
    import napkin.codegen as cg

    dyn = cg.compile("batched_matmul", sizes={"n": 4, "b": 128, "c": 136}, dynamic={"a": (1, 4096)}, gpu="h200")
    assert dyn.specialized == ()  # compiled once for the range
    sources = {dyn.at({"a": m}).program.launches[0].source for m in (1, 100, 4096)}
    assert len(sources) == 1 and "tma_store_3d(" in sources.pop()


@pytest.mark.gpu
def test_tma_stores_clip_to_the_output():
    """Rows and columns that end inside a 64 x 64 block (the copy is clipped to the output), a
    batch whose elements' rows end inside a block (the 3-D map stops each copy at M: it must not
    land on the next element's rows), or whose last tile reaches past its 192 rows, an epilogue
    reading each element's indices."""
    _hopper()
    mm = library.get("matmul")
    for shape in (dict(a=1000, b=200, c=200), dict(a=2900, b=64, c=72), dict(a=37, b=96, c=8)):
        check(mm, [shape], _sched(mm, shape, COOP))
    bmm = library.get("batched_matmul")
    for shape in (dict(n=5, a=192, b=128, c=136), dict(n=7, a=100, b=128, c=136), dict(n=3, a=1, b=64, c=64)):
        assert "tma_store" in dict(_launch(bmm.with_dtype("bf16").bind(**shape)).tunables)
        check(bmm, [shape], _sched(bmm, shape, COOP))
    mlp = library.get("mlp")
    shape = dict(a=1000, b=200, c=2 * 132 * 8 + 40)
    check(mlp, [shape], _sched(mlp, shape, MatmulConfig(False, *WGMMA_CONFIGS[1], wgmma=True)))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS]
                         + [MatmulConfig(False, 128, 128, 64, 64, 128, 4, wgmma=True, dual=True)],
                         ids=lambda c: f"{'dual-' if c.dual else 'pp-'}{c.BM}x{c.BN}")
def test_tma_stores_of_pingpong_and_dual_kernels(cfg):
    _hopper()
    if cfg.dual:
        d, shape = gate_up(True), dict(a=1500, b=200, f=1480)
    else:
        d, shape = library.get("batched_matmul"), dict(n=9, a=150, b=128, c=200)
    check(d, [shape], _sched(d, shape, cfg))


@pytest.mark.gpu
def test_an_output_tma_cannot_write_runs_without_tma():
    """A given output one element into its storage: TMA cannot write it, so the call runs the
    plan without TMA copies, into that tensor."""
    _hopper()
    import torch

    from napkin.codegen.api import compile as compile_diagram

    sizes = dict(a=512, b=128, c=256)
    cd = compile_diagram("matmul", sizes=sizes, schedule=_sched(library.get("matmul"), sizes, COOP))
    assert any(a.kind == "tmap" and a.name == "C" for a in cd.program.launches[0].args)
    A = torch.randn(512, 128, device="cuda").to(torch.bfloat16)
    B = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    storage = torch.full((512 * 256 + 1,), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = storage[1:].view(512, 256)
    got = cd(A, B, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.float(), A.float() @ B.float(), rtol=2e-2, atol=2e-1)
    aligned = torch.empty(512, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(cd(A, B, out=aligned).float(), out.float(), rtol=2e-2, atol=2e-1)
