"""Hardware profiles: datasheet values, lookup, JSON round trip, overrides, calibration logic."""

import json
import subprocess
import sys

import pytest

from napkin.errors import DiagramError, HardwareError
from napkin.perfmodel.calibrate import calibrated_profile
from napkin.perfmodel.hardware import GPU, LEVEL_ORDER, get_gpu, list_gpus, match_device_name

KiB, MiB = 1024, 1024**2


def test_list_and_aliases():
    assert list_gpus() == ["a100-40gb", "a100-80gb", "h100", "h200"]
    assert get_gpu("A100").key == "a100-80gb"
    assert get_gpu("a100-40GB").key == "a100-40gb"
    assert get_gpu("a100-80gb").key == "a100-80gb"
    assert get_gpu("H100").key == get_gpu("h100-sxm").key == "h100"
    assert get_gpu("h200").key == "h200"


def test_unknown_gpu_lists_known_keys():
    with pytest.raises(HardwareError) as e:
        get_gpu("v100")
    msg = str(e.value)
    for k in ("a100-40gb", "a100-80gb", "h100", "h200"):
        assert k in msg


@pytest.mark.parametrize("key,sms,fp16,hbm,l2,smem,blk", [
    ("a100-40gb", 108, 312e12, 1.555e12, 40 * MiB, 164 * KiB, 163 * KiB),
    ("a100-80gb", 108, 312e12, 2.039e12, 40 * MiB, 164 * KiB, 163 * KiB),
    ("h100", 132, 989.4e12, 3.35e12, 50 * MiB, 228 * KiB, 227 * KiB),
    ("h200", 132, 989.4e12, 4.8e12, 60 * MiB, 228 * KiB, 227 * KiB),
])
def test_datasheet_values(key, sms, fp16, hbm, l2, smem, blk):
    g = get_gpu(key)
    assert g.sms == sms
    assert g.tensor_rate("fp16") == fp16 == g.tensor_rate("bf16")
    assert g.hbm_bandwidth == hbm
    assert g.level_names() == LEVEL_ORDER
    assert g.level("L2").capacity_bytes == l2
    assert g.level("SMEM").capacity_bytes == smem
    assert g.level("SMEM").per_block_bytes == blk
    assert g.level("SMEM").instances == sms
    assert g.level("HBM").instances == g.level("L2").instances == 1
    assert g.regs_per_sm_bytes == 256 * KiB and g.max_warps_per_sm == 64
    assert g.sfu_ops_per_clk_per_sm == 16
    assert g.mma_shapes["fp16"] == (16, 8, 16) and g.mma_shapes["tf32"] == (16, 8, 8)
    assert g.source == "datasheet"
    for lv in g.levels:
        assert lv.assumption


def test_architecture_specifics():
    a, h = get_gpu("a100"), get_gpu("h100")
    assert a.arch == "sm_80" and not a.has_wgmma and not a.has_tma and a.clock_hz == 1.41e9
    assert h.arch == "sm_90a" and h.has_wgmma and h.has_tma and h.clock_hz == 1.83e9
    assert h.tensor_rate("fp8") == 1978.9e12 and h.mma_shapes["fp8"] == (16, 8, 32)
    with pytest.raises(HardwareError, match="fp8"):
        a.tensor_rate("fp8")
    assert a.cuda_core_rate("fp32") == 19.5e12 and h.cuda_core_rate() == 66.9e12
    assert h.tensor_rate("fp32") == h.tensor_rate("tf32") == 494.7e12  # fp32 matmul -> tf32 path


def test_rates_and_threshold():
    h = get_gpu("h100")
    assert h.hbm_values_per_s("fp16") == pytest.approx(1.675e12)
    assert h.hbm_values_per_s("fp32") == pytest.approx(3.35e12 / 4)
    assert round(h.compute_bound_threshold("fp16"), 1) == 590.7
    assert h.sfu_rate() == pytest.approx(16 * 132 * 1.83e9)
    assert round(h.tensor_flops_per_clk_per_sm("fp16")) == 4096
    assert round(h.tensor_flops_per_clk_per_sm("fp8")) == 8192
    assert round(get_gpu("a100").tensor_flops_per_clk_per_sm("fp16")) == 2049
    with pytest.raises(DiagramError, match="unknown dtype 'int3'"):  # the one class every entry point raises
        h.hbm_values_per_s("int3")


def test_level_lookup():
    h = get_gpu("h100")
    assert h.level("smem") is h.level("SMEM")
    with pytest.raises(HardwareError) as e:
        h.level("L3")
    assert "HBM" in str(e.value) and "SMEM" in str(e.value)
    assert h.bandwidth_into("HBM") == float("inf")
    assert h.bandwidth_into("L2") == h.hbm_bandwidth
    assert h.bandwidth_into("SMEM") == h.level("L2").bandwidth
    assert h.level("TC").capacity_bytes is None


@pytest.mark.parametrize("key", ["a100-40gb", "a100-80gb", "h100", "h200"])
def test_json_round_trip(key, tmp_path):
    g = get_gpu(key)
    text = g.to_json()
    json.loads(text)
    g2 = GPU.from_json(text)
    assert g2 == g
    assert g2.mma_shapes["fp16"] == (16, 8, 16) and isinstance(g2.levels, tuple)
    p = tmp_path / "mine.json"
    p.write_text(text)
    assert get_gpu(str(p)) == g


def test_bad_profiles(tmp_path):
    with pytest.raises(HardwareError, match="JSON"):
        GPU.from_json("{not json")
    d = json.loads(get_gpu("h100").to_json())
    for bad in ({k: v for k, v in d.items() if k != "sms"},
                {**d, "bogus_field": 1},
                {**d, "levels": []},
                {**d, "tensor_flops": {"fp17": 1e12}},
                {**d, "levels": [{**d["levels"][0], "bandwidth": -1}] + d["levels"][1:]},
                {**d, "levels": [{"name": "HBM"}]},
                {**d, "mma_shapes": {"fp16": [16, 8]}},
                [1, 2]):
        with pytest.raises(HardwareError):
            GPU.from_json(json.dumps(bad))
    with pytest.raises(HardwareError, match="does not exist"):
        get_gpu(str(tmp_path / "nope.json"))


def test_with_overrides():
    h = get_gpu("h100")
    m = h.with_overrides(hbm_bandwidth=3.0e12, tensor_bf16=800e12, L2_bandwidth=10e12,
                         sfu_rate=2 * h.sfu_rate(), source="calibrated: test")
    assert m.hbm_bandwidth == 3.0e12 and "measured" in m.level("HBM").assumption
    assert m.tensor_rate("bf16") == 800e12 and m.tensor_rate("fp16") == 989.4e12
    assert m.level("L2").bandwidth == 10e12
    assert m.sfu_ops_per_clk_per_sm == pytest.approx(32)
    assert m.source == "calibrated: test"
    assert h.hbm_bandwidth == 3.35e12  # the original is untouched
    m2 = h.with_overrides(tensor_flops={"fp8": 1.5e15}, clock_hz=1.755e9)
    assert m2.tensor_rate("fp8") == 1.5e15 and m2.tensor_rate("fp16") == 989.4e12  # merged, not replaced
    assert m2.clock_hz == 1.755e9
    assert GPU.from_json(m.to_json()) == m
    with pytest.raises(HardwareError, match="unknown key"):
        h.with_overrides(warp_speed=9)
    with pytest.raises(HardwareError):
        h.with_overrides(hbm_bandwidth=-1.0)


def test_calibrated_profile_overrides_datasheet(tmp_path):
    meas = {"copy_bandwidth": 4.22e12, "gemm_bf16": 791e12, "sfu_rate": 3.0e12,
            "sms": 132, "l2_bytes": 60 * MiB, "other": 7.0}
    g = calibrated_profile("h200", meas, date="2025-06-01", device_name="NVIDIA H200")
    assert g.source == "calibrated: 2025-06-01"
    assert g.hbm_bandwidth == 4.22e12 and "copy" in g.level("HBM").assumption
    assert g.tensor_rate("bf16") == 791e12 and g.tensor_rate("fp16") == 989.4e12
    assert g.sfu_rate() == pytest.approx(3.0e12)
    assert g.measured["other"] == 7.0 and g.measured["copy_bandwidth"] == 4.22e12
    assert "NVIDIA H200" in g.notes
    p = tmp_path / "h200-cal.json"
    p.write_text(g.to_json())
    back = get_gpu(str(p))
    assert back == g and back.source.startswith("calibrated")
    # SM count from the device changes the per-SM conversion of the SFU rate
    g2 = calibrated_profile("h100", {"sms": 114, "sfu_rate": 3.0e12})
    assert g2.sms == 114 and g2.sfu_rate() == pytest.approx(3.0e12)
    with pytest.raises(HardwareError):
        calibrated_profile("h100", {"copy_bandwidth": 0.0})


def test_match_device_name():
    assert match_device_name("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert match_device_name("NVIDIA A100-SXM4-80GB") == "a100-80gb"
    assert match_device_name("NVIDIA H100 80GB HBM3") == "h100"
    assert match_device_name("NVIDIA H200") == "h200"
    with pytest.raises(HardwareError):
        match_device_name("Tesla V100")


def test_hardware_import_does_not_pull_torch_or_cupy():
    code = ("import sys; import napkin.perfmodel.hardware, napkin.perfmodel.occupancy, "
            "napkin.perfmodel.roofline, napkin.perfmodel.calibrate; "
            "print('torch' in sys.modules, 'cupy' in sys.modules)")
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.gpu
def test_calibrate_on_gpu(tmp_path):
    from napkin.perfmodel.calibrate import calibrate

    g = calibrate(None, tmp_path / "cal.json", gemm_n=4096, fp16_gemm=False)
    assert g.source.startswith("calibrated")
    assert 0.2e12 < g.hbm_bandwidth < 10e12
    assert 50e12 < g.tensor_rate("bf16") < 3e15
    assert get_gpu(str(tmp_path / "cal.json")) == g
