"""The contraction's epilogue with operands tiled like the output, and what the model charges for
an epilogue after the loop.

An epilogue input indexed like the output's rows and columns (``E[.., a, c]``: attention's
``dS = P ⊙ (dO·Vᵀ − D)`` reads P so) is copied into shared memory a whole tile at a time with
16-byte copies before the epilogue; a row operand (``D[.., a]``) is read per element at indices
clamped into the output, so each row's value is loaded once. The persistent wgmma kernel copies
the first such operand 64 x 64 at a time into each consumer's staging block (its 16-byte copies
issued together), reads it there and writes the results over it. The model prices the epilogue of
the mma.sync and SIMT templates (one tile per block: the loop, then the epilogue) as a phase after
the loop rather than overlapped with it.

CPU tests: which inputs are staged, the source, the model's phases and the plan they lead to for
attention's backward; ``nvcc``: the kernels build without spills; ``gpu``: the results against
float64 on shapes that are not tile multiples, NaN-poisoned outputs (``napkin.codegen.verify``).
"""

from __future__ import annotations

import pytest
from napkin_test_support import contraction_prediction

from napkin.codegen.families.contraction import (FAMILY, MMA_CONFIGS, WGMMA_CONFIGS, WGMMA_PINGPONG_CONFIGS,
                                                 MatmulConfig, _wide_pingpong, analyze, epilogue_tiles)
from napkin.diagrams import Axis, Diagram, array, contract, library
from napkin.diagrams.ops import map_fn


def ds_like(dtype="bf16", extra_tiles: int = 0, batch_tile: bool = True) -> Diagram:
    """Y[n,a,c] = P[n,a,c] · (Σ_b A[n,a,b]·B[n,c,b] − D[n,a]) · 0.5 (+ R_i[a,c] for each extra
    tile): the shape of attention's dS kernel, with a row operand and tile operands (P batched or
    broadcast over n)."""
    n, a, b, c = Axis("n"), Axis("a"), Axis("b"), Axis("c")
    A, B = array("A", n, a, b, dtype=dtype), array("B", n, c, b, dtype=dtype)
    P = array("P", *((n, a, c) if batch_tile else (a, c)), dtype=dtype)
    D = array("D", n, a, dtype=dtype)
    S = contract(A, B, over=b, out=(n, a, c), name="S")
    Y = map_fn("scale", map_fn("mul", map_fn("sub", S, D), P), params=(0.5,))
    for i in range(extra_tiles):
        Y = map_fn("add", Y, array(f"R{i}", a, c, dtype=dtype))
    return Diagram("ds_like", Y)


SIZES = dict(n=3, a=300, b=72, c=200)


def lower(d: Diagram, cfg: tuple, arch="sm_90a", dtype="bf16", sizes=SIZES):
    bd = d.with_dtype(dtype).bind(**{k: v for k, v in sizes.items() if k in d.axes})
    c = MatmulConfig(dtype == "fp32", *cfg)
    return bd, c, FAMILY.lower(bd, FAMILY.schedule(bd, c), arch).launches[-1]


# ---------------------------------------------------------------------------- CPU: lowering

def test_the_tile_operand_is_staged_and_the_row_operand_read_per_row():
    bd, cfg, k = lower(ds_like(), MMA_CONFIGS[4])
    assert [v.name for v in epilogue_tiles(bd, analyze(bd), cfg, 2)] == ["P"]
    names = [a.name for a in k.args if a.kind == "tensor"]
    assert "P" in names and "D" in names
    assert "load_tile_async<T, BM, BN, THREADS>" in k.source and "tE0[tile_r * C_LD + tile_c]" in k.source
    assert "x_D[" in k.source and "x_P[" not in k.source  # D per element, P from its shared tile
    # every element runs the epilogue at an index inside the output: no branch around the reads
    assert "gcol < N ? gcol : N - 1" in k.source and "in_row &&" not in k.source


def test_as_many_tiles_as_the_pipeline_memory_holds():
    """Tile operands are staged while the pipeline's shared memory holds them beside the staging
    tile (the kernel asks for no more); the rest are read per element, behind the bounds checks
    (hoisted out of them, a whole tile's 2-byte loads spilled on the 128 x 256 tiles)."""
    d = ds_like(extra_tiles=3)
    for cfg in MMA_CONFIGS:
        bd, c, k = lower(d, cfg)
        p = analyze(bd)
        staged = epilogue_tiles(bd, p, c, 2)
        room = c.smem_bytes(p, 2) // (c.BM * (c.BN + 8) * 2) - 1
        assert len(staged) == min(room, 4), (cfg, staged)
        assert k.shared_bytes == c.smem_bytes(p, 2)
        for i in range(len(staged)):
            assert f"tE{i}[" in k.source
        for v in {"P", "R0", "R1", "R2"} - {v.name for v in staged}:
            assert f"x_{v}[" in k.source
        assert ("in_row &&" in k.source) == (len(staged) < 4)


def test_a_tile_broadcast_over_the_batch_has_no_batch_stride():
    bd, cfg, k = lower(ds_like(batch_tile=False), MMA_CONFIGS[4])
    assert "bE0_n" not in k.source and "tE0" in k.source
    bd, cfg, k = lower(ds_like(), MMA_CONFIGS[4])
    assert "static_cast<long long>(i_n) * bE0_n" in k.source


def test_no_staging_on_the_simt_template_or_a_split_sum():
    _, _, k = lower(ds_like(), (128, 128, 8, 32, 64, 2, 1), dtype="fp32")
    assert "tE0" not in k.source and "x_P[" in k.source
    bd = ds_like().with_dtype("bf16").bind(n=1, a=64, b=65536, c=64)
    prog = FAMILY.lower(bd, FAMILY.schedule(bd, MatmulConfig(False, *MMA_CONFIGS[6], splits=8)), "sm_90a")
    assert all("tE0" not in launch.source for launch in prog.launches)


# ---------------------------------------------------------------------------- CPU: the model

def _kernel_prediction(bd, cfg):
    return contraction_prediction(bd, cfg, "h100")


def _wgmma(cfg: tuple, pingpong: bool = False, splits: int = 1) -> MatmulConfig:
    return MatmulConfig(False, *cfg, wgmma=True, pingpong=pingpong, splits=splits)


def _wgmma_source(d: Diagram, cfg: MatmulConfig, sizes=SIZES) -> str:
    bd = d.with_dtype("bf16").bind(**{k: v for k, v in sizes.items() if k in d.axes})
    return FAMILY.lower(bd, FAMILY.schedule(bd, cfg), "sm_90a").launches[0].source


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "ping-pong"])
def test_the_persistent_wgmma_kernel_stages_the_first_tile_operand(pingpong):
    src = _wgmma_source(ds_like(extra_tiles=1), _wgmma(WGMMA_PINGPONG_CONFIGS[0] if pingpong else WGMMA_CONFIGS[3],
                                                        pingpong))
    assert src.count("napkin::load_tile_async<T, 64, 64, 128, true>(") == 1
    assert "napkin::to_float(sE[tile_r * E_LD + tile_c])" in src  # P, read in the staging block
    assert "napkin::to_float(x_R0[" in src and "napkin::to_float(x_D[" in src  # the others per element
    assert "const __nv_bfloat16* __restrict__ E0" in src and "int bE0_n" in src  # P is batched over n


def test_a_wgmma_split_sum_stages_nothing():
    src = _wgmma_source(ds_like(), _wgmma(WGMMA_CONFIGS[3], splits=4), dict(n=3, a=300, b=4096, c=200))
    assert "load_tile_async" not in src and "tile_r" not in src


def test_the_epilogue_after_the_loop_is_a_phase_of_its_own():
    """A big output over a short sum (attention's scores: 256 x 1024 x 1024 over 128): the store
    comes after the loop on every SM at once, so the model adds it to the loop's time. Measured on
    an H100: 367 us for the plain scores on the mma.sync template, where the overlapped roofline
    said 210 us."""
    from napkin.perfmodel.hardware import get_gpu

    h = get_gpu("h100")
    bd = library.get("batched_matmul").with_dtype("bf16").bind(n=256, a=1024, b=128, c=1024)
    shape, kp = _kernel_prediction(bd, MatmulConfig(False, *MMA_CONFIGS[4]))
    out_bytes = 256 * 1024 * 1024 * 2
    assert shape.epilogue_hbm_bytes == pytest.approx(out_bytes) and shape.epilogue_waits == 0
    assert kp.epilogue_s == pytest.approx(out_bytes / h.level("HBM").bandwidth, rel=1e-6)
    assert kp.seconds == pytest.approx(kp.roofline.seconds + kp.epilogue_s)
    assert kp.roofline.hbm_bytes < 0.3 * out_bytes  # the loop's own bytes: the operands only
    assert 300e-6 < kp.seconds < 450e-6
    # a long sum into a small output: the store is a small part of the time
    bd = library.get("batched_matmul").with_dtype("bf16").bind(n=256, a=128, b=1024, c=1024)
    _, kp = _kernel_prediction(bd, MatmulConfig(False, *MMA_CONFIGS[4]))
    assert kp.epilogue_s < 0.15 * kp.seconds


def test_the_epilogue_reads_and_maps_join_the_phase():
    bd = ds_like().with_dtype("bf16").bind(n=256, a=1024, b=128, c=1024)
    shape, kp = _kernel_prediction(bd, MatmulConfig(False, *MMA_CONFIGS[4]))
    out = 256 * 1024 * 1024 * 2
    assert shape.epilogue_hbm_bytes == pytest.approx(2 * out + 256 * 1024 * 2)  # P read, Y written, D read
    assert kp.epilogue.compute_s["cuda"] > 0 and kp.roofline.compute_s["cuda"] == 0
    # the maps, then the stores: added within the phase; and P's tile is waited for every round
    e = kp.epilogue
    assert e.tail_body_s == pytest.approx(e.compute_time_s + e.memory_time_s)
    assert shape.epilogue_waits == 1 and kp.epilogue_wait_s == pytest.approx(e.rounds * 800e-9)
    assert kp.epilogue_s == pytest.approx(e.tail_body_s + kp.epilogue_wait_s)


def test_the_cooperative_wgmma_kernel_stores_after_its_loop_and_split_kernels_do_not():
    """Both consumers of a cooperative wgmma kernel store each tile before the next tile's first
    wgmma: its output is a phase after the loop (H200, bf16, 12800 x K x 3072 on 128 x 256 tiles:
    24.2 us at K = 64, 6.3 us more a chunk of 64 after it). A split sum's partials are priced as
    its extra pass instead."""
    bd = library.get("batched_matmul").with_dtype("bf16").bind(n=256, a=1024, b=128, c=1024)
    coop = next(c for c in FAMILY.configs("bf16", "wgmma") if not c.pingpong)
    shape, kp = _kernel_prediction(bd, coop)
    out_bytes = 256 * 1024 * 1024 * 2
    assert shape.epilogue_hbm_bytes == pytest.approx(out_bytes) and not shape.epilogue_maps
    assert kp.epilogue is not None and kp.epilogue.hbm_bytes == pytest.approx(out_bytes)
    assert kp.roofline.hbm_bytes < 0.3 * out_bytes  # the loop's own bytes: the operands only
    bd = library.get("matmul").with_dtype("bf16").bind(a=64, b=65536, c=64)
    shape, kp = _kernel_prediction(bd, MatmulConfig(False, *MMA_CONFIGS[6], splits=8))
    assert not shape.epilogue_hbm_bytes and kp.epilogue is None


def test_a_persistent_wgmma_kernel_of_one_tile_a_block_prices_its_maps_as_a_phase():
    """With no more tiles than SMs each block's epilogue has no next tile loading or multiplying
    behind it: its maps (bias + GELU) are a phase after the loop, as on the mma.sync template. With
    more tiles, or no maps (a plain product's stores), the epilogue stays overlapped. (H100, 128 x
    128 x 256 bf16 + bias + GELU: 15.8 us of kernel on the two-block ping-pong tile the model had
    picked, 3.7 on the mma.sync 64 x 64 tile it picks with the phase.)"""
    cfg = MatmulConfig(False, *WGMMA_PINGPONG_CONFIGS[0], wgmma=True, pingpong=True)
    small = library.get("mlp").with_dtype("bf16").bind(a=128, b=128, c=256)
    shape, kp = _kernel_prediction(small, cfg)
    assert shape.epilogue_hbm_bytes > 0 and kp.epilogue is not None
    big = library.get("mlp").with_dtype("bf16").bind(a=4096, b=4096, c=4096)  # 1024 tiles on 132 SMs
    shape, kp = _kernel_prediction(big, cfg)
    # the stores run beside the other consumer's loop, the maps do not (epilogue_maps)
    assert not shape.epilogue_hbm_bytes and shape.epilogue_maps
    # (GELU's cost is its form's measured issue slots, on the CUDA cores: MEASURED_SLOTS)
    assert kp.epilogue is not None and kp.epilogue.hbm_bytes == 0 and kp.epilogue.compute_s["cuda"] > 0
    assert kp.roofline.compute_s["sfu"] == 0 and kp.roofline.compute_s["cuda"] == 0
    plain = library.get("matmul").with_dtype("bf16").bind(a=4096, b=4096, c=4096)
    shape, kp = _kernel_prediction(plain, cfg)
    assert not shape.epilogue_hbm_bytes and kp.epilogue is None  # no maps: nothing after the loop


@pytest.mark.parametrize("seq", [1024, 4096, 16384])
def test_causal_attention_backward_on_mma_sync_takes_the_fused_kernel(seq):
    """Attention's backward at d=128 on the mma.sync kernels (no wgmma): the six-kernel plan
    (scores and dS written to HBM and read back) was priced 2.4x too fast and kept; with its
    epilogues priced after their loops the fused attention_bwd kernel, which skips the masked key
    blocks, is the cheaper one for causal attention (measured on an H100 at 1k: 1252 us against
    2981 us for the six kernels)."""
    from napkin.codegen.planner import derive

    grad = library.get("attention_causal").weave(Axis("b"), name="attention_causal_b").grad(save={"O", "P_lse"})
    sizes = {"b": 16384 // seq, "h": 16, "q": seq, "x": seq, "d": 128}
    plan = derive(grad, gpu="h100", dtype="bf16", sizes=sizes, explain=False, exclude_engines=("wgmma",),
                  families=["contraction", "pointwise", "rowwise", "attention_bwd"]).plan
    assert [k.family for k in plan.kernels] == ["attention_bwd"], plan


# ---------------------------------------------------------------------------- nvcc builds

@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("cfg", [MMA_CONFIGS[0], MMA_CONFIGS[4], MMA_CONFIGS[7]], ids=lambda c: f"{c[0]}x{c[1]}")
def test_staged_epilogues_build_without_spills(cfg, arch):
    from napkin.kernels.nvcc import nvcc_compile

    bd, c, k = lower(ds_like(extra_tiles=1), cfg, arch)
    # both tiles staged, or (128 x 256: the pipeline holds one) the second read per element
    assert "tE1" in k.source or (c.BN == 256 and "x_R0[" in k.source and "in_row &&" in k.source)
    usage = nvcc_compile(k.source, arch)[k.name]
    assert not usage.spills and usage.stack_bytes == 0, usage
    assert usage.registers <= k.model_regs_per_thread


# ---------------------------------------------------------------------------- GPU

def check(diagram, dtype, shapes, schedule_cfg=None):
    from napkin.codegen.verify import verify

    sched = None
    if schedule_cfg is not None:
        bd = diagram.with_dtype(dtype).bind(**shapes[0])
        sched = FAMILY.schedule(bd, MatmulConfig(False, *schedule_cfg))
    report = verify(diagram, dtype=dtype, shapes=shapes, family="contraction", schedule=sched)
    print(report)
    assert report.ok, str(report)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", MMA_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])) + f"-s{c[5]}")
def test_staged_epilogue_every_mma_configuration(cfg):
    check(ds_like(extra_tiles=2), "bf16", [dict(n=3, a=300, b=72, c=200)], cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [dict(n=2, a=77, b=40, c=130), dict(n=1, a=129, b=24, c=8),
                                   dict(n=3, a=256, b=128, c=256)], ids=["odd-unaligned-rows", "narrow", "whole"])
@pytest.mark.parametrize("batch_tile", [True, False], ids=["batched-P", "broadcast-P"])
def test_staged_epilogue_odd_sizes(shape, batch_tile):
    check(ds_like(batch_tile=batch_tile), "bf16", [shape], MMA_CONFIGS[4])
    check(ds_like(batch_tile=batch_tile, dtype="fp16"), "fp16", [shape], MMA_CONFIGS[6])


#: (the ping-pong tile of 192 accumulators a thread runs plain products only: its refusal is tested
#: in test_wgmma_persistent.py)
WGMMA_STAGED = ([_wgmma(c) for c in WGMMA_CONFIGS]
                + [c for c in (_wgmma(c, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS) if not _wide_pingpong(c)])


@pytest.mark.nvcc
@pytest.mark.parametrize("cfg", WGMMA_STAGED, ids=lambda c: f"{c.BM}x{c.BN}{'-pp' if c.pingpong else ''}")
def test_wgmma_staged_epilogues_build_without_spills(cfg):
    from napkin.kernels.nvcc import nvcc_compile

    bd = ds_like(extra_tiles=1).with_dtype("bf16").bind(**SIZES, **{})
    launch = FAMILY.lower(bd, FAMILY.schedule(bd, cfg), "sm_90a").launches[0]
    usage = nvcc_compile(launch.source, "sm_90a")[launch.name]
    assert not usage.spills and usage.stack_bytes == 0, usage


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", WGMMA_STAGED, ids=lambda c: f"{c.BM}x{c.BN}{'-pp' if c.pingpong else ''}")
@pytest.mark.parametrize("batch_tile", [True, False], ids=["batched-P", "broadcast-P"])
def test_wgmma_staged_epilogue_odd_sizes(cfg, batch_tile):
    """Every persistent wgmma configuration on rows of 130 and 200 elements (P's rows are not all
    16-byte aligned at 130: the copy's scalar path) and a tile larger than the problem."""
    from napkin.codegen.verify import verify

    for shape in (dict(n=2, a=77, b=40, c=130), dict(n=3, a=300, b=72, c=200), dict(n=1, a=45, b=64, c=24)):
        d = ds_like(batch_tile=batch_tile, extra_tiles=1)
        bd = d.with_dtype("bf16").bind(**shape)
        report = verify(d, dtype="bf16", shapes=[shape], family="contraction", schedule=FAMILY.schedule(bd, cfg))
        print(report)
        assert report.ok, str(report)
