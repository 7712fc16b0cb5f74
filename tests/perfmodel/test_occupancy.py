"""Occupancy and the docs/architecture.md §4.4 figures, all reproduced from the configuration."""

import math

import pytest

from napkin.errors import HardwareError
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.occupancy import (
    ampere_attention_analysis,
    compute_bound_thresholds,
    hopper_attention_analysis,
    occupancy,
    units_per_sm,
)

KiB = 1024


@pytest.fixture(scope="module")
def hop(h100):
    return hopper_attention_analysis(h100)


def test_units_per_sm_rule():
    r = units_per_sm({"SMEM": (227, 48, 48), "RF": (256, 0, 74.75)})
    assert r.limiting == "RF" and r.floor == 3
    assert r.per_resource["SMEM"] == pytest.approx(179 / 48)
    assert r.per_resource["RF"] == pytest.approx(256 / 74.75)
    assert r.units == pytest.approx(256 / 74.75)
    r2 = units_per_sm({"a": (10, 0, 2), "b": (10, 0, 0)}, max_units=4)
    assert r2.per_resource["b"] == math.inf and r2.limiting == "max" and r2.floor == 4
    r3 = units_per_sm({"a": (10, 12, 1)})
    assert r3.floor == 0 and r3.units == 0
    assert units_per_sm({"a": (12, 0, 4)}).floor == 3  # exact division is not floored down
    with pytest.raises(HardwareError):
        units_per_sm({})
    with pytest.raises(HardwareError):
        units_per_sm({"a": (1, 0, 0)})


def test_hopper_smem_and_registers(hop):
    # 48 KB SMEM per block: (K 64x128 fp8 + V 64x128 fp16) x 2 stages
    assert hop.smem_per_block_bytes == 48 * KiB
    assert hop.smem_k_chunk_bytes == 8 * KiB and hop.smem_v_chunk_bytes == 16 * KiB
    # 48 KB per warpgroup: Q 128x128 fp8 + O staging 128x128 fp16
    assert hop.smem_per_unit_bytes == 48 * KiB
    assert (hop.regs_o_acc, hop.regs_p, hop.regs_stats, hop.regs_per_thread) == (128, 16, 2, 146)
    assert hop.registers_per_unit_bytes == 74752
    assert round(hop.registers_per_unit_bytes / 1000, 2) == 74.75
    assert hop.smem_capacity_bytes == 227 * KiB


def test_hopper_warpgroups_and_gq(hop):
    assert round(hop.warpgroups_by_smem, 1) == 3.7
    assert round(hop.warpgroups_by_registers, 1) == 3.4
    assert hop.occupancy.limiting == "RF"
    assert hop.warpgroups == 3 and hop.units == 3
    assert hop.g_q == 384
    # the consistent-bytes figure differs, but floors to the same 3
    assert round(hop.units_by_registers_bytes, 2) == 3.51
    b = hopper_attention_analysis(get_gpu("h100"), register_convention="bytes")
    assert round(b.warpgroups_by_registers, 2) == 3.51 and b.g_q == 384


def test_hopper_step_time_and_throughput(hop):
    assert round(hop.qk_flops_per_clk) == 8192 and round(hop.pv_flops_per_clk) == 4096
    assert hop.flops_qk_per_step == 2 * 384 * 64 * 128
    assert round(hop.compute_clocks) == 2304
    assert round(hop.compute_s, 8) == 1.26e-6
    assert round(hop.hbm_s, 8) == 0.97e-6
    assert hop.hbm_bytes_per_step == 132 * 64 * 128 * 3
    assert hop.bound == "compute" and hop.step_s == hop.compute_s
    assert round(hop.throughput_flops / 1e15, 3) == 1.319
    assert round(hop.peak_flops / 1e15, 2) == 1.98
    assert round(hop.fraction_of_peak, 3) == round(2 / 3, 3)
    assert round(hop.sfu_clocks) == 1536
    assert "2304" in hop.summary()


def test_hopper_numbers_follow_the_configuration(h100):
    # change the configuration and the figures move: nothing is typed in
    one = hopper_attention_analysis(h100, stages=1)
    assert one.smem_per_block_bytes == 24 * KiB
    assert one.warpgroups_by_smem == pytest.approx((227 - 24) / 48)
    big = hopper_attention_analysis(h100, qk_dtype="fp16")
    assert big.smem_per_block_bytes == 64 * KiB and big.smem_per_unit_bytes == 64 * KiB
    assert big.regs_p == 32
    assert big.peak_flops == 989.4e12
    h200 = hopper_attention_analysis(get_gpu("h200"))
    assert h200.hbm_s < hopper_attention_analysis(h100).hbm_s and h200.compute_clocks == pytest.approx(
        hopper_attention_analysis(h100).compute_clocks)
    assert round(h200.hbm_s * 1e6, 2) == round(132 * 64 * 128 * 3 / 4.8e12 * 1e6, 2)
    with pytest.raises(HardwareError, match="wgmma"):
        hopper_attention_analysis(get_gpu("a100"))
    with pytest.raises(HardwareError):
        hopper_attention_analysis(h100, w_q=0)


def test_ampere_fa2_configuration():
    a = ampere_attention_analysis(get_gpu("a100"))
    assert a.unit == "warp" and a.w_q == 32 and a.threads_per_unit == 32
    assert a.smem_per_block_bytes == 32 * KiB and a.smem_per_unit_bytes == 8 * KiB
    assert a.regs_per_thread == 128 + 64 + 2
    assert a.warps_by_smem == pytest.approx((163 - 32) / 8)
    assert a.warps_by_registers == pytest.approx(256 * KiB / (194 * 4 * 32))
    assert a.warps == 8 and a.blocks_per_sm == 2 and a.g_q == 256  # FA2: 2 blocks of 4 warps
    assert round(a.qk_flops_per_clk) == 2049
    assert a.flops_per_step == 4 * 256 * 64 * 128
    assert a.hbm_bytes_per_step == 108 * 2 * 64 * 128 * 4
    assert a.bound == "memory"
    p = ampere_attention_analysis(get_gpu("a100"), p_dtype="fp16")
    assert p.regs_per_thread == 162 and p.warps == 8  # now SMEM: 164 KiB / (32 + 32 KiB) -> 2 blocks
    s32 = ampere_attention_analysis(get_gpu("a100"), s_x=32, p_dtype="fp16")
    assert s32.blocks_per_sm == 3 and s32.warps == 12 and s32.g_q == 384


def test_thresholds_h100_fp16(h100):
    t = compute_bound_thresholds(h100, "fp16")
    assert round(t.flops_per_value, 1) == 590.7
    assert round(t.matmul_min_contraction) == 295
    assert round(t.attention_min_g_q) == 295
    assert round(t.matmul_min_tile, 1) == 590.7
    assert round(t.matmul_min_memory_kib) == 681
    assert t.matmul_min_memory_bytes == pytest.approx(t.flops_per_value**2 * 2)
    t8 = compute_bound_thresholds(h100, "fp8")
    assert t8.flops_per_value == pytest.approx(1978.9e12 / 3.35e12)
    ta = compute_bound_thresholds(get_gpu("a100-40gb"), "fp16")
    assert ta.flops_per_value == pytest.approx(312e12 / (1.555e12 / 2))


def test_launch_occupancy_calculator():
    a = get_gpu("a100")
    fa2 = occupancy(a, threads_per_block=128, regs_per_thread=255, smem_per_block=64 * KiB)
    assert fa2.blocks_per_sm == 2 and fa2.warps_per_sm == 8 and fa2.limiting in ("registers", "smem")
    assert fa2.regs_per_warp == 8192 and fa2.per_limit["registers"] == 2
    # register allocation granularity: 33 regs -> 1056 per warp -> rounded to 1280
    o = occupancy(a, 1024, 33, 0)
    assert o.regs_per_warp == 1280 and o.per_limit["registers"] == 1 and o.warps_per_sm == 32
    # shared memory with the 1 KiB per-block reservation: 5 x (32 KiB + 1 KiB) > 164 KiB
    s = occupancy(a, 64, 32, 32 * KiB)
    assert s.per_limit["smem"] == 4 and s.limiting == "smem" and s.smem_per_block == 33 * KiB
    assert occupancy(a, 32, 16, 0).limiting == "blocks" and occupancy(a, 32, 16, 0).blocks_per_sm == 32
    assert occupancy(a, 1024, 32, 0).limiting == "warps"
    assert occupancy(a, 128, 32, 200 * KiB).blocks_per_sm == 0
    assert occupancy(get_gpu("h100"), 384, 168, 96 * KiB).blocks_per_sm == 1
    with pytest.raises(HardwareError):
        occupancy(a, 2048, 32, 0)
    with pytest.raises(HardwareError):
        occupancy(a, 128, 300, 0)


def test_memory_sizes_print_in_kib(hop):
    """One unit convention: KiB (1024 B) in every printed size; the paper's decimal "74.75 KB"
    appears only as the quoted figure its 3.4 warpgroups come from."""
    import re

    text = hop.summary()
    assert "48.00 KiB" in text and "73.00 KiB" in text and "227.00 KiB" in text and "256 KiB" in text
    assert "74,752 B" in text and "3.42 by registers" in text and "3.51 with KiB on both sides" in text
    assert re.findall(r"\d KB", text) == ["5 KB"]      # "74.75 KB": the paper's own figure, quoted
    assert hop.smem_per_block_kib == 48 and hop.registers_per_unit_kib == pytest.approx(73.0)
    assert "KiB" in ampere_attention_analysis(get_gpu("a100")).summary()
    import napkin.perfmodel.occupancy as occ

    assert "KiB (1024 B)" in occ.__doc__
