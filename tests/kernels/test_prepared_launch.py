"""PreparedLaunch without a GPU: the parameter array it hands to cuLaunchKernel (scalars packed to
their C types once, data pointers written at each launch from the positions ``sources`` names,
tensor maps looked up per pointer), the launch configuration, and a failed launch named.

The driver is replaced by a recorder that reads the parameter array back through ctypes, as
cuLaunchKernel would."""

from __future__ import annotations

import ctypes
import importlib

import numpy as np
import pytest

from napkin.errors import LaunchError
from napkin.kernels.tma import TensorMap, TensorMapSlot

L = importlib.import_module("napkin.kernels.launch")  # the module (the package exports a function launch)


class _Fn:
    ptr = 0xF00D


class _Module:
    arch = "sm_90a"

    def function(self, name, device):
        return _Fn()


class _Kernel:
    name = "k"
    module = _Module()

    def __init__(self):
        self.raised = []

    def _raise_smem_limit(self, fn, device, shared_mem):
        self.raised.append((device, shared_mem))


class _DriverError(Exception):
    """CuPy's CUDADriverError stand-in: the driver's status in ``status``."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _recorder(calls, sizes, rc=0):
    """A stand-in for ``cu_launch_kernel()``: a launch of plain ints that records the
    configuration and reads each parameter (``sizes``: bytes of each) from the array, raising
    the driver error with ``rc`` when it is not 0; and that error's type."""

    def launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        assert all(type(v) is int for v in (fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra))
        arr = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.string_at(arr[i], n) for i, n in enumerate(sizes)]
        calls.append({"fn": fn, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem, "stream": stream,
                      "params": values, "extra": extra})
        if rc:
            raise _DriverError(rc)

    return launch, _DriverError


def _u64(b: bytes) -> int:
    return int.from_bytes(b, "little")


def test_parameters_are_packed_once_and_pointers_written_per_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(L, "cu_launch_kernel", lambda: _recorder(calls, [8, 4, 8, 8, 4]))
    args = [L.POINTER, 7, np.int64(2 ** 40), L.POINTER, 0.5]
    kernel = _Kernel()
    pl = L.PreparedLaunch(kernel, (3, 2), 128, args, 1024, device=0, sources=[2, 0])
    # any dynamic shared memory is checked against the limit: beside the kernel's static words a
    # block under 48 KiB of it may still need the raised limit
    assert kernel.raised == [(0, 1024)]
    pl([0xA0, 0xB0, 0xC0], 0x5)
    pl([0xA1, 0xB1, 0xC1], 0x6)
    first, second = calls
    assert first["fn"] == 0xF00D and first["grid"] == (3, 2, 1) and first["block"] == (128, 1, 1)
    assert first["smem"] == 1024 and first["stream"] == 0x5 and first["extra"] == 0
    p = first["params"]
    assert _u64(p[0]) == 0xC0 and _u64(p[3]) == 0xA0           # sources: param 0 <- [2], param 3 <- [0]
    assert int.from_bytes(p[1], "little", signed=True) == 7 and _u64(p[2]) == 2 ** 40
    assert np.frombuffer(p[4], np.float32)[0] == 0.5
    assert _u64(second["params"][0]) == 0xC1 and _u64(second["params"][3]) == 0xA1 and second["stream"] == 0x6


def test_default_sources_take_the_pointers_in_order(monkeypatch):
    calls = []
    monkeypatch.setattr(L, "cu_launch_kernel", lambda: _recorder(calls, [8, 8]))
    pl = L.PreparedLaunch(_Kernel(), 1, 32, [L.POINTER, L.POINTER], 0, device=0)
    pl([11, 22], 0)
    assert [_u64(v) for v in calls[0]["params"]] == [11, 22]


def test_tensor_map_parameters_are_looked_up_per_pointer(monkeypatch):
    calls = []
    monkeypatch.setattr(L, "cu_launch_kernel", lambda: _recorder(calls, [128, 8]))
    slot = TensorMapSlot("bf16", (64, 64), (64, 64))
    maps = {}
    for ptr, fill in ((0x1000, 1), (0x2000, 2)):  # encoded maps, put in the slot as the driver would
        m = TensorMap(f"fake {fill}")
        ctypes.memset(m.address, fill, TensorMap.SIZE)
        maps[ptr] = m
    slot._maps.update(maps)
    pl = L.PreparedLaunch(_Kernel(), 1, 128, [slot, L.POINTER], 0, device=0, sources=[0, 1])
    pl([0x1000, 0xBEEF], 0)
    pl([0x2000, 0xBEEF], 0)
    assert calls[0]["params"][0] == bytes([1]) * 128 and calls[1]["params"][0] == bytes([2]) * 128
    with pytest.raises(LaunchError, match="16-byte aligned"):
        pl([0x2008, 0xBEEF], 0)


def test_a_failed_launch_is_a_launch_error_naming_the_kernel(monkeypatch):
    monkeypatch.setattr(L, "cu_launch_kernel", lambda: _recorder([], [8], rc=1))
    monkeypatch.setattr(L, "error_name", lambda rc: "CUDA_ERROR_INVALID_VALUE")
    pl = L.PreparedLaunch(_Kernel(), 1, 32, [L.POINTER], 0, device=0)
    with pytest.raises(LaunchError, match=r"launch of k failed \(grid \(1, 1, 1\).*CUDA_ERROR_INVALID_VALUE"):
        pl([1], 0)


def test_a_thread_without_a_context_makes_the_device_current_and_launches_again(monkeypatch):
    calls, made = [], []
    record, err = _recorder(calls, [8])

    def launch(*a):  # the first launch finds no current context (CUDA_ERROR_INVALID_CONTEXT)
        record(*a)
        if len(calls) == 1:
            raise err(201)

    monkeypatch.setattr(L, "cu_launch_kernel", lambda: (launch, err))
    monkeypatch.setattr(L, "_make_current", made.append)
    pl = L.PreparedLaunch(_Kernel(), 1, 32, [L.POINTER], 0, device=3)
    pl([7], 0)
    assert made == [3] and len(calls) == 2 and _u64(calls[1]["params"][0]) == 7


def test_bad_configurations_are_refused_when_prepared(monkeypatch):
    monkeypatch.setattr(L, "cu_launch_kernel", lambda: (None, _DriverError))
    with pytest.raises(LaunchError, match="block"):
        L.PreparedLaunch(_Kernel(), 1, 2048, [], 0, device=0)
    with pytest.raises(LaunchError, match="shared_mem must be >= 0"):
        L.PreparedLaunch(_Kernel(), 1, 32, [], -1, device=0)
    with pytest.raises(LaunchError, match="1 pointer source"):
        L.PreparedLaunch(_Kernel(), 1, 32, [L.POINTER, L.POINTER], 0, device=0, sources=[0])
    with pytest.raises(LaunchError, match="does not fit a 32-bit int"):
        L.PreparedLaunch(_Kernel(), 1, 32, [2 ** 40], 0, device=0)
