"""Tensor maps for Hopper's TMA engine, and launching kernels that take them by value.

A kernel that copies tiles with ``cp.async.bulk.tensor`` takes a *tensor map* (CUDA's
``CUtensorMap``: 128 opaque bytes describing a global array, the box one copy moves and the
shared-memory swizzle) as a ``const __grid_constant__`` parameter. The driver encodes it from the
tensor's pointer, sizes and strides (``cuTensorMapEncodeTiled``), so it is made per launch, from
the actual tensor; :func:`tensor_map` caches the encoding per (pointer, shape, box).

CuPy passes only scalars and pointers to kernels, so a launch with a tensor map in its arguments
goes through the driver's ``cuLaunchKernel`` directly (:func:`launch_raw`).

>>> TensorMap.SIZE, TensorMap.ALIGN
(128, 64)

Importing this module needs neither torch nor CuPy, and no GPU; the driver library is opened at
the first encoding or launch.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from napkin.errors import LaunchError

__all__ = ["TensorMap", "tensor_map", "launch_raw", "SWIZZLE_128B"]

#: cuda.h enumerations used here.
_DATA_TYPES = {"bf16": 9, "fp16": 6, "fp32": 7}
SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_INTERLEAVE_NONE = 0
_OOB_FILL_ZERO = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: elements outside the tensor read as zero

_lock = threading.Lock()
_libcuda = None
_cache: dict[tuple, "TensorMap"] = {}
_CACHE_LIMIT = 256


def _driver():
    global _libcuda
    if _libcuda is None:
        try:
            _libcuda = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise LaunchError(f"cannot open the CUDA driver library libcuda.so.1 for TMA tensor maps: {e}") from e
    return _libcuda


def _error_name(code: int) -> str:
    name = ctypes.c_char_p()
    try:
        _driver().cuGetErrorName(ctypes.c_int(code), ctypes.byref(name))
    except Exception:  # noqa: BLE001 - only for the message
        return f"CUDA error {code}"
    return name.value.decode() if name.value else f"CUDA error {code}"


class TensorMap:
    """An encoded ``CUtensorMap``: 128 bytes in a 64-byte aligned host buffer."""

    SIZE = 128
    ALIGN = 64

    def __init__(self, description: str):
        self._raw = (ctypes.c_ubyte * (self.SIZE + self.ALIGN))()
        base = ctypes.addressof(self._raw)
        self.address = base + (-base) % self.ALIGN
        self.description = description

    def __repr__(self) -> str:
        return f"TensorMap({self.description})"


def tensor_map(t, box: Sequence[int], *, swizzle: int = SWIZZLE_128B) -> TensorMap:
    """The tensor map of a contiguous 2-D view of torch tensor ``t`` (its last axis innermost,
    every other axis flattened into rows) for copies of ``box = (inner, outer)`` elements.

    Raises :class:`LaunchError` when the tensor breaks a TMA rule (16-byte aligned data pointer,
    row stride a multiple of 16 bytes) or the driver refuses the map.
    """
    import torch

    if t.dim() < 1:
        raise LaunchError("a TMA tensor map needs a tensor with at least one axis")
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(t.dtype)
    if name is None:
        raise LaunchError(f"TMA tensor maps here take bf16, fp16 or fp32 tensors, not {t.dtype}")
    elem = t.element_size()
    inner = int(t.shape[-1])
    outer = int(t.numel() // inner) if inner else 0
    if inner == 0 or outer == 0:
        raise LaunchError("a TMA tensor map needs a non-empty tensor")
    if t.data_ptr() % 16:
        raise LaunchError(f"the TMA copy needs a 16-byte aligned data pointer; this {tuple(t.shape)} tensor "
                          f"starts at an offset (pass a .clone())")
    if (inner * elem) % 16:
        raise LaunchError(f"the TMA copy needs rows of a multiple of 16 bytes; the last axis has {inner} "
                          f"elements of {elem} bytes")
    key = (t.data_ptr(), inner, outer, name, tuple(int(b) for b in box), swizzle, t.device.index)
    with _lock:
        m = _cache.get(key)
        if m is not None:
            return m
    m = TensorMap(f"{name} [{outer}][{inner}], box {tuple(box)}")
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims = (u64 * 2)(inner, outer)
    strides = (u64 * 1)(inner * elem)
    boxd = (u32 * 2)(*[int(b) for b in box])
    estr = (u32 * 2)(1, 1)
    rc = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(m.address), ctypes.c_int(_DATA_TYPES[name]), u32(2), ctypes.c_void_p(t.data_ptr()),
        dims, strides, boxd, estr, ctypes.c_int(_INTERLEAVE_NONE), ctypes.c_int(swizzle),
        ctypes.c_int(_L2_PROMOTION_256B), ctypes.c_int(_OOB_FILL_ZERO))
    if rc != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled refused {m.description}: {_error_name(rc)}")
    with _lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = m
    return m


def _c_arg(a: Any):
    import numpy

    if isinstance(a, TensorMap):
        return ctypes.c_void_p(a.address), a
    if isinstance(a, numpy.generic):
        buf = ctypes.create_string_buffer(a.tobytes(), a.itemsize)
        return ctypes.cast(buf, ctypes.c_void_p), buf
    raise LaunchError(f"cannot pass a {type(a).__name__} through cuLaunchKernel")


def launch_raw(function_ptr: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
               stream_handle: int, args: Sequence[Any], kernel: str) -> None:
    """``cuLaunchKernel`` with NumPy scalars (pointers as ``uint64``) and :class:`TensorMap` values."""
    keep = []
    ptrs = (ctypes.c_void_p * max(1, len(args)))()
    for i, a in enumerate(args):
        p, owner = _c_arg(a)
        keep.append(owner)
        ptrs[i] = p.value
    rc = _driver().cuLaunchKernel(
        ctypes.c_void_p(function_ptr), ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(grid[2]),
        ctypes.c_uint(block[0]), ctypes.c_uint(block[1]), ctypes.c_uint(block[2]), ctypes.c_uint(shared_mem),
        ctypes.c_void_p(stream_handle), ptrs, ctypes.c_void_p(0))
    del keep
    if rc != 0:
        raise LaunchError(f"cuLaunchKernel of {kernel} failed: {_error_name(rc)}")
