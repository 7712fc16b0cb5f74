"""Runtime prediction: terms, bound, waves, launch overhead, efficiencies."""

import math

import pytest

from napkin.errors import HardwareError
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.occupancy import hopper_attention_analysis
from napkin.perfmodel.roofline import LAUNCH_OVERHEAD_S, TYPICAL, Efficiency, Work, predict


def test_compute_bound_gemm(h100):
    n = 8192
    w = Work(flops={"tensor": 2 * n**3}, bytes={"HBM": 3 * n * n * 2}, dtype="fp16")
    p = predict(h100, w, launch_overhead_s=0)
    assert p.bound == "tensor"
    assert p.seconds == pytest.approx(2 * n**3 / 989.4e12)
    assert p.tflops == pytest.approx(989.4)
    assert p.transfer_s["HBM"] == pytest.approx(3 * n * n * 2 / 3.35e12)
    assert p.gbps == pytest.approx(3 * n * n * 2 / p.seconds / 1e9)
    assert p.waves is None and p.wave_factor == 1.0


def test_memory_bound_copy_and_launch_overhead(h100):
    nbytes = 2 * 2**30
    w = Work(bytes={"HBM": nbytes})
    p = predict(h100, w)
    assert p.bound == "HBM"
    assert p.launch_overhead_s == LAUNCH_OVERHEAD_S > 0
    assert p.seconds == pytest.approx(nbytes / 3.35e12 + LAUNCH_OVERHEAD_S)
    assert p.gbps == pytest.approx(nbytes / p.seconds / 1e9)
    tiny = predict(h100, Work(bytes={"HBM": 1024}), launch_overhead_s=5e-6)
    assert tiny.seconds == pytest.approx(5e-6, rel=1e-3)


def test_efficiency_scales_terms(h100):
    w = Work(flops={"tensor": 1e12}, bytes={"HBM": 1e9}, dtype="bf16")
    base = predict(h100, w, launch_overhead_s=0)
    half = predict(h100, w, efficiency=Efficiency(tensor=0.5), launch_overhead_s=0)
    assert half.compute_s["tensor"] == pytest.approx(2 * base.compute_s["tensor"])
    typ = predict(h100, w, efficiency=TYPICAL, launch_overhead_s=0)
    assert typ.compute_s["tensor"] == pytest.approx(1e12 / (989.4e12 * 791 / 989.4))
    assert typ.transfer_s["HBM"] == pytest.approx(1e9 / (3.35e12 * 4.22 / 4.8))
    with pytest.raises(HardwareError):
        Efficiency(hbm=0)


def test_overlap_switches(h100):
    w = Work(flops={"tensor": 1e12, "sfu": 1e12, "cuda": 1e11}, bytes={"HBM": 1e9, "SMEM": 1e10})
    p = predict(h100, w, launch_overhead_s=0)
    c = p.compute_s
    assert p.compute_time_s == pytest.approx(max(c.values()))
    assert p.bound == "sfu"  # 1e12 exp at 3.86e12/s beats 1e12 fp16 FLOP at 989e12/s
    assert p.body_s == pytest.approx(max(p.terms.values()))
    serial = predict(h100, w, efficiency=Efficiency(overlap_compute=False, overlap_memory=False),
                     launch_overhead_s=0)
    assert serial.compute_time_s == pytest.approx(sum(c.values()))
    assert serial.body_s == pytest.approx(sum(c.values()) + max(p.transfer_s.values()))
    assert p.transfer_s["SMEM"] == pytest.approx(1e10 / h100.level("SMEM").bandwidth)


def test_mixed_tensor_dtypes_reproduce_hopper_step(h100):
    a = hopper_attention_analysis(h100)
    w = Work(flops={"tensor:fp8": h100.sms * a.flops_qk_per_step, "tensor:fp16": h100.sms * a.flops_pv_per_step},
             bytes={"HBM": a.hbm_bytes_per_step})
    p = predict(h100, w, launch_overhead_s=0)
    assert p.seconds == pytest.approx(a.step_s)
    assert p.tflops * 1e12 == pytest.approx(a.throughput_flops)
    assert round(p.tflops / 1e3, 3) == 1.319


def test_wave_quantisation(h100):
    w = Work(flops={"tensor": 1e12})
    base = predict(h100, w, launch_overhead_s=0)
    full = predict(h100, w, blocks=264, blocks_per_sm=2, launch_overhead_s=0)
    assert full.waves == 1 and full.ideal_waves == pytest.approx(1.0) and full.wave_factor == pytest.approx(1.0)
    one_more = predict(h100, w, blocks=133, launch_overhead_s=0)
    assert one_more.waves == 2 and one_more.ideal_waves == pytest.approx(133 / 132)
    assert one_more.seconds == pytest.approx(base.seconds * 2 / (133 / 132))
    few = predict(h100, w, blocks=66, blocks_per_sm=1, launch_overhead_s=0)
    assert few.wave_factor == pytest.approx(2.0)
    with pytest.raises(HardwareError):
        predict(h100, w, blocks=10, blocks_per_sm=0)
    with pytest.raises(HardwareError):
        predict(h100, w, blocks=0)


def test_a_ring_fill_exposes_its_share_of_the_smaller_time(h100):
    """``fill_share``: a loop of few steps behind a ring that loads its chunks together waits on
    them before its first product and multiplies its last ones after its last load; that share of
    the smaller of the compute and memory times adds to the larger."""
    mem = Work(flops={"tensor": 1e11}, bytes={"HBM": 1e9}, dtype="bf16")   # memory-bound
    comp = Work(flops={"tensor": 1e12}, bytes={"HBM": 1e8}, dtype="bf16")  # compute-bound
    for w in (mem, comp):
        base = predict(h100, w, launch_overhead_s=0)
        small, large = sorted((base.compute_time_s, base.memory_time_s))
        assert base.body_s == pytest.approx(large) and base.fill_share == 0.0
        for share in (0.25, 1.0):
            p = predict(h100, w, launch_overhead_s=0, fill_share=share)
            assert p.body_s == pytest.approx(large + share * small) and p.fill_share == share
            assert p.seconds == pytest.approx(base.seconds + share * small)
        # a whole fill exposed is the same as no overlap of memory with compute
        serial = predict(h100, w, efficiency=Efficiency(overlap_memory=False), launch_overhead_s=0)
        assert predict(h100, w, launch_overhead_s=0, fill_share=1.0).body_s == pytest.approx(serial.body_s)
        # and with the per-SM tail: the tail body carries it too
        t = predict(h100, w, blocks=200, blocks_per_sm=1, launch_overhead_s=0, fill_share=0.5)
        tb = predict(h100, w, blocks=200, blocks_per_sm=1, launch_overhead_s=0)
        assert t.tail_body_s > tb.tail_body_s
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(HardwareError, match="fill_share"):
            predict(h100, mem, fill_share=bad)


def test_reported_flops_and_errors(h100):
    w = Work(flops={"tensor": 2e12}, reported_flops=1e12)
    p = predict(h100, w, launch_overhead_s=0)
    assert p.tflops == pytest.approx(1e12 / p.seconds / 1e12)
    s = Work(flops={"tensor": 1e12}, bytes={"HBM": 5.0}) + Work(flops={"tensor": 1e12, "cuda": 3.0})
    assert s.flops["tensor"] == 2e12 and s.total_flops == 2e12 + 3 and s.bytes["HBM"] == 5.0
    with pytest.raises(HardwareError):
        Work(flops={"gpu": 1.0})
    with pytest.raises(HardwareError):
        Work(flops={"tensor": -1.0})
    with pytest.raises(HardwareError):
        predict(h100, Work(bytes={"L3": 1.0}))
    with pytest.raises(HardwareError, match="fp8"):
        predict(get_gpu("a100"), Work(flops={"tensor": 1.0}, dtype="fp8"))
    assert "us on h100" in str(p)
    assert not math.isnan(p.gbps)
