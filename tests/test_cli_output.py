"""Where napkin's output goes, and what happens when it cannot go there (issue #16).

* ``calibrate`` checks its ``-o`` before measuring and writes strict JSON (no ``Infinity``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


# ----------------------------------------------------------------------------- calibrate

def test_calibrate_api_checks_its_output_before_measuring(tmp_path, monkeypatch):
    from napkin.errors import HardwareError
    from napkin.perfmodel import calibrate as C

    def no_gpu():
        raise AssertionError("measured before the output was checked")

    monkeypatch.setattr(C, "_require_cuda", no_gpu)
    with pytest.raises(HardwareError, match="is a folder"):
        C.calibrate(None, tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(HardwareError, match="is a file, not a folder"):
        C.calibrate(None, tmp_path / "f" / "x.json")


def test_check_output_of_calibrate(tmp_path):
    from napkin.perfmodel.calibrate import check_output

    assert check_output("-") is None
    assert check_output(tmp_path / "new" / "p.json") == tmp_path / "new" / "p.json"  # parents are created


def test_profile_json_is_strict_and_refuses_non_finite_numbers():
    from napkin.errors import HardwareError
    from napkin.perfmodel.calibrate import calibrated_profile, profile_json

    g = calibrated_profile("h100", {"copy_bandwidth": 3.0e12, "gemm_bf16": 7.0e14}, date="2025-01-01")
    text = profile_json(g)
    assert json.loads(text)["measured"]["copy_bandwidth"] == 3.0e12
    assert "Infinity" not in text and "NaN" not in text

    class Stub:  # a profile object whose numbers went wrong
        def to_dict(self):
            return {"levels": [{"name": "HBM", "bandwidth": float("inf")}], "measured": {"sfu_rate": float("nan")}}

    with pytest.raises(HardwareError, match=r"non-finite numbers \(levels\[0\]\.bandwidth = inf, "
                                            r"measured\.sfu_rate = nan\)"):
        profile_json(Stub())  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0])
def test_calibrated_profile_refuses_non_finite_measurements(value):
    from napkin.errors import HardwareError
    from napkin.perfmodel.calibrate import calibrated_profile

    with pytest.raises(HardwareError, match="finite positive number"):
        calibrated_profile("h100", {"gemm_bf16": value})


def test_write_profile_to_a_file_and_to_stdout(tmp_path, capsys):
    from napkin.perfmodel.calibrate import calibrated_profile, write_profile
    from napkin.perfmodel.hardware import GPU

    g = calibrated_profile("h200", {"copy_bandwidth": 4.2e12}, date="2025-01-01")
    out = write_profile(g, tmp_path / "sub" / "h200.json")
    assert out == tmp_path / "sub" / "h200.json"
    assert GPU.from_json(out.read_text()).hbm_bandwidth == 4.2e12
    assert write_profile(g, "-") is None
    assert json.loads(capsys.readouterr().out)["source"] == "calibrated: 2025-01-01"
    assert not Path("-").exists()
