"""Measure the GPU at hand and write a profile whose measured numbers override the datasheet.

What is measured (CUDA events, warm-up first, the median of many runs, random data, buffers
larger than L2 and rotated so no run finds its inputs in cache):

* ``copy_bandwidth``: device-to-device copy, bytes read + bytes written per second -> the HBM
  level's bandwidth;
* ``gemm_bf16`` (and ``gemm_fp16``): ``torch.mm`` at 8192^3, 2·n^3 FLOPs per run -> the tensor
  rates of those dtypes;
* ``sfu_rate``: exp2 per second over the whole chip, with a tiny CuPy kernel that loops exp2f on
  values held in registers (an elementwise exp over a tensor is memory-bound and would measure
  HBM, not the SFU); skipped, keeping the datasheet figure, when CuPy is not installed;
* from the device properties: SM count, L2 size, memory size.

torch and cupy are imported only inside the functions that use them.

>>> g = calibrated_profile("h200", {"copy_bandwidth": 4.22e12, "gemm_bf16": 791e12}, date="2025-01-01")
>>> g.source, g.hbm_bandwidth, g.tensor_rate("bf16")
('calibrated: 2025-01-01', 4220000000000.0, 791000000000000.0)
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import HardwareError
from .hardware import GPU, get_gpu, match_device_name

__all__ = [
    "calibrate",
    "check_output",
    "profile_json",
    "write_profile",
    "calibrated_profile",
    "measure_copy_bandwidth",
    "measure_gemm_rate",
    "measure_sfu_rate",
    "MEASUREMENT_KEYS",
]

#: The measurement names calibrated_profile understands, and what each overrides.
MEASUREMENT_KEYS = {
    "copy_bandwidth": "HBM level bandwidth (bytes read + written per second, device-to-device copy)",
    "gemm_bf16": "tensor_flops['bf16'] (torch.mm 8192^3)",
    "gemm_fp16": "tensor_flops['fp16'] (torch.mm 8192^3)",
    "sfu_rate": "exp2 per second, whole chip (stored as sfu_ops_per_clk_per_sm)",
    "sms": "SM count reported by the device",
    "l2_bytes": "L2 capacity reported by the device",
    "hbm_bytes": "device memory reported by the device",
}


def calibrated_profile(
    base: GPU | str,
    measurements: Mapping[str, float],
    date: str | None = None,
    device_name: str | None = None,
) -> GPU:
    """``base`` with ``measurements`` (keys of :data:`MEASUREMENT_KEYS`) overriding its numbers.

    Every measurement is also kept verbatim in ``GPU.measured``; ``source`` becomes
    ``"calibrated: <date>"``. Non-positive and non-finite values raise HardwareError; unknown keys are only kept
    in ``measured``.
    """
    gpu = get_gpu(base) if isinstance(base, str) else base
    meas = {str(k): float(v) for k, v in measurements.items()}
    for k, v in meas.items():
        if not (v > 0) or not math.isfinite(v):  # an infinite rate is a run timed at zero seconds
            raise HardwareError(f"measurement {k!r} must be a finite positive number, got {v!r}")
    date = date or _dt.date.today().isoformat()
    ov: dict[str, Any] = {}
    if "sms" in meas and int(meas["sms"]) != gpu.sms:
        # Applied first so that sfu_rate below converts with the right SM count.
        gpu = gpu.with_overrides(sms=int(meas["sms"]))
    if "copy_bandwidth" in meas:
        ov["hbm_bandwidth"] = meas["copy_bandwidth"]
        ov["hbm_assumption"] = (f"calibrated {date}: device-to-device copy, read+write bytes "
                                f"(datasheet {gpu.hbm_bandwidth / 1e12:.3g} TB/s)")
    if "hbm_bytes" in meas:
        ov["hbm_capacity_bytes"] = meas["hbm_bytes"]
    if "l2_bytes" in meas and "L2" in gpu.level_names():
        ov["l2_capacity_bytes"] = meas["l2_bytes"]
    tensor = {}
    if "gemm_bf16" in meas:
        tensor["bf16"] = meas["gemm_bf16"]
    if "gemm_fp16" in meas:
        tensor["fp16"] = meas["gemm_fp16"]
    if tensor:
        ov["tensor_flops"] = tensor
    if "sfu_rate" in meas:
        ov["sfu_rate"] = meas["sfu_rate"]
    note = f"calibrated {date}" + (f" on {device_name}" if device_name else "")
    done = ", ".join(sorted(k for k in meas if k in MEASUREMENT_KEYS)) or "nothing"
    ov["notes"] = (gpu.notes + " | " if gpu.notes else "") + f"{note}: measured {done}; the rest is datasheet."
    ov["measured"] = meas
    ov["source"] = f"calibrated: {date}"
    return gpu.with_overrides(**ov)


# ---------------------------------------------------------------------- measurements (GPU)


def _require_cuda():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise HardwareError("calibration needs PyTorch") from None
    if not torch.cuda.is_available():
        raise HardwareError("calibration needs a CUDA GPU; torch.cuda.is_available() is False")
    return torch


def _median_time(torch, fn: Callable[[int], None], iters: int, warmup: int) -> float:
    """Median seconds of ``fn(i)`` over ``iters`` runs, each timed with its own CUDA events."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _l2_bytes(torch) -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 64 * 1024 * 1024)


def measure_copy_bandwidth(nbytes: int | None = None, buffers: int = 2, iters: int = 30, warmup: int = 5) -> float:
    """Device-to-device copy rate, (bytes read + bytes written) per second.

    Each buffer is at least 8x the L2 size (default max(8·L2, 512 MiB)); ``buffers`` source /
    destination pairs are rotated between runs.
    """
    torch = _require_cuda()
    l2 = _l2_bytes(torch)
    nbytes = int(nbytes or max(8 * l2, 512 * 1024 * 1024))
    n = nbytes // 4
    srcs = [torch.rand(n, device="cuda", dtype=torch.float32) for _ in range(buffers)]
    dsts = [torch.empty_like(s) for s in srcs]

    def run(i: int) -> None:
        dsts[i % buffers].copy_(srcs[i % buffers])

    t = _median_time(torch, run, iters, warmup)
    moved = 2 * n * 4
    del srcs, dsts
    torch.cuda.empty_cache()
    return moved / t


def measure_gemm_rate(dtype: str = "bf16", n: int = 8192, sets: int = 3, iters: int = 20, warmup: int = 5) -> float:
    """Dense GEMM FLOP/s (2·n^3 per run) of ``torch.mm`` at ``dtype``, rotating ``sets`` inputs."""
    torch = _require_cuda()
    from ..dtypes import torch_dtype

    tdt = torch_dtype(dtype)
    a = [torch.randn(n, n, device="cuda", dtype=torch.float32).to(tdt) for _ in range(sets)]
    b = [torch.randn(n, n, device="cuda", dtype=torch.float32).to(tdt) for _ in range(sets)]
    c = torch.empty(n, n, device="cuda", dtype=tdt)

    def run(i: int) -> None:
        torch.mm(a[i % sets], b[i % sets], out=c)

    t = _median_time(torch, run, iters, warmup)
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * n**3 / t


_SFU_KERNEL = r"""
extern "C" __global__ void napkin_exp2_loop(float* out, int iters, float seed) {
    float x0 = seed + 1e-7f * threadIdx.x, x1 = x0 + 0.11f, x2 = x0 + 0.23f, x3 = x0 + 0.37f;
    float x4 = x0 + 0.41f, x5 = x0 + 0.53f, x6 = x0 + 0.67f, x7 = x0 + 0.79f;
    #pragma unroll 4
    for (int i = 0; i < iters; ++i) {
        // x -> 2^-x stays in (0, 1]: no overflow, no denormals; 8 independent chains per thread.
        x0 = exp2f(-x0); x1 = exp2f(-x1); x2 = exp2f(-x2); x3 = exp2f(-x3);
        x4 = exp2f(-x4); x5 = exp2f(-x5); x6 = exp2f(-x6); x7 = exp2f(-x7);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""
_SFU_CHAINS = 8


def measure_sfu_rate(iters: int = 4096, blocks_per_sm: int = 8, threads: int = 256,
                     runs: int = 20, warmup: int = 3) -> float | None:
    """exp2 operations per second over the whole chip, or None when CuPy is not installed.

    A CuPy RawKernel (``--use_fast_math``, so each exp2f is one MUFU.EX2) loops exp2f on eight
    independent register-resident chains per thread; no memory traffic except one store per thread.
    """
    torch = _require_cuda()
    try:
        import cupy as cp
    except ImportError:
        return None
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    kernel = cp.RawKernel(_SFU_KERNEL, "napkin_exp2_loop", options=("--use_fast_math",))
    grid = sms * blocks_per_sm
    out = cp.empty(grid * threads, dtype=cp.float32)
    seed = cp.float32(0.5)
    for _ in range(warmup):
        kernel((grid,), (threads,), (out, cp.int32(iters), seed))
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kernel((grid,), (threads,), (out, cp.int32(iters), seed))
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    if not bool(cp.isfinite(out).all()):
        raise HardwareError("SFU calibration kernel produced non-finite values")
    ops = grid * threads * iters * _SFU_CHAINS
    return ops / statistics.median(times)


# ---------------------------------------------------------------------- the profile file


def check_output(out_path: str | Path) -> Path | None:
    """Where :func:`write_profile` will write (None: ``-``, stdout), checked before anything is
    measured: a folder, a parent that is a file, or a place that cannot be written is a
    HardwareError. A missing parent folder is created when the profile is written."""
    text = str(out_path)
    if text == "-":
        return None
    if not text or "\0" in text:
        raise HardwareError(f"calibrate: {text!r} is not a file name for the profile")
    out = Path(text)
    try:
        if out.is_dir() or text.endswith(("/", os.sep)):
            raise HardwareError(f"calibrate: {text!r} is a folder; give the profile a file name, such as "
                                f"{out / 'calibrated.json'}")
        probe = out.parent
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise HardwareError(f"calibrate: cannot write {text!r}: {str(probe)!r} is a file, not a folder")
        if out.exists() and not os.access(out, os.W_OK):
            raise HardwareError(f"calibrate: cannot write {text!r} (permission denied)")
        if not out.exists() and not os.access(probe, os.W_OK | os.X_OK):
            raise HardwareError(f"calibrate: cannot write {text!r}: folder {str(probe)!r} is not writable")
    except OSError as e:
        raise HardwareError(f"calibrate: cannot write {text!r}: {e.strerror or e}") from None
    return out


def _non_finite(data, where: str = "") -> list[str]:
    """The places (``levels[0].bandwidth``) in ``data`` that hold an infinite or NaN number."""
    if isinstance(data, float):
        return [] if math.isfinite(data) else [f"{where or 'value'} = {data}"]
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, (list, tuple)):
        return [p for i, v in enumerate(data) for p in _non_finite(v, f"{where}[{i}]")]
    return []


def profile_json(gpu: GPU) -> str:
    """The profile as strict JSON (no ``Infinity``/``NaN``, which JSON does not have); a profile
    holding a non-finite number is a HardwareError naming where: a measurement went wrong (a run
    timed at zero seconds gives an infinite rate), and such a profile would mislead every
    prediction made with it."""
    data = gpu.to_dict()
    bad = _non_finite(data)
    if bad:
        raise HardwareError(f"the calibrated profile has non-finite numbers ({', '.join(bad[:4])}"
                            f"{', ...' if len(bad) > 4 else ''}): a measurement failed; nothing was written, "
                            "run calibrate again")
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_profile(gpu: GPU, out_path: str | Path) -> Path | None:
    """Write ``gpu`` as strict JSON to ``out_path`` (``-``: stdout), creating missing parent
    folders; the path written (None for stdout). Every failure is a HardwareError."""
    out = check_output(out_path)
    text = profile_json(gpu)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise HardwareError(f"calibrate: cannot write {str(out)!r}: {e.strerror or e}") from None
    return out


def calibrate(gpu_key: str | None, out_path: str | Path, *, gemm_n: int = 8192,
              fp16_gemm: bool = True) -> GPU:
    """Measure this machine's GPU and write a profile JSON to ``out_path`` (``-``: stdout); returns
    the profile.

    ``gpu_key`` names the datasheet profile to start from (None: matched from the device name).
    ``out_path`` is checked before anything is measured (:func:`check_output`); a non-finite
    measurement is refused rather than written (:func:`profile_json`).
    """
    check_output(out_path)
    torch = _require_cuda()
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    name = torch.cuda.get_device_name(dev)
    base = get_gpu(gpu_key or match_device_name(name))
    meas: dict[str, float] = {
        "sms": float(props.multi_processor_count),
        "hbm_bytes": float(props.total_memory),
    }
    l2 = getattr(props, "L2_cache_size", 0)
    if l2:
        meas["l2_bytes"] = float(l2)
    meas["copy_bandwidth"] = measure_copy_bandwidth()
    meas["gemm_bf16"] = measure_gemm_rate("bf16", gemm_n)
    if fp16_gemm:
        meas["gemm_fp16"] = measure_gemm_rate("fp16", gemm_n)
    sfu = measure_sfu_rate()
    if sfu is not None:
        meas["sfu_rate"] = sfu
    gpu = calibrated_profile(base, meas, device_name=name)
    write_profile(gpu, out_path)
    return gpu


if __name__ == "__main__":  # pragma: no cover - needs a GPU
    import argparse

    ap = argparse.ArgumentParser(description="Measure this GPU and write a napkin profile JSON.")
    ap.add_argument("out", help="path of the profile JSON to write")
    ap.add_argument("--gpu", default=None, help="datasheet profile to start from (default: from the device name)")
    args = ap.parse_args()
    g = calibrate(args.gpu, args.out)
    print(g)
    for k, v in g.measured.items():
        print(f"  {k}: {v:.4g}")
