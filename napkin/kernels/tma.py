"""Tensor maps for Hopper's TMA engine, and launching kernels that take them by value.

A kernel that copies tiles with ``cp.async.bulk.tensor`` takes a *tensor map* (CUDA's
``CUtensorMap``: 128 opaque bytes describing a global array, the box one copy moves and the
shared-memory swizzle) as a ``const __grid_constant__`` parameter. The driver encodes it from the
tensor's pointer, sizes and strides (``cuTensorMapEncodeTiled``), so it is made per launch, from
the actual tensor; :func:`tensor_map` caches the encoding per (pointer, shape, box). A
:class:`TensorMapSlot` is the prepared form for one kernel argument whose shape, dtype and box
are fixed: it keeps the encodings per data pointer, so a launch that sees the same tensor again
(a training loop, a CUDA graph's static inputs) only looks the pointer up. A slot's map is the
packed view of the array (its last axis, then the others flattened: :func:`map_dims`) or, given
a ``view``, its axes as dimensions of their own in another order (:func:`view_dims`).

CuPy passes only scalars and pointers to kernels, so a launch with a tensor map in its arguments
goes through the driver's ``cuLaunchKernel`` directly (:func:`launch_raw`; the prepared launches of
:mod:`napkin.kernels.launch` call CuPy's binding of it).

>>> TensorMap.SIZE, TensorMap.ALIGN
(128, 64)

Importing this module needs neither torch nor CuPy, and no GPU; the driver library is opened at
the first encoding or launch.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence
from typing import Any

from napkin.errors import LaunchError

__all__ = ["TensorMap", "TensorMapSlot", "tensor_map", "map_dims", "launch_raw", "SWIZZLE_128B"]

#: cuda.h enumerations used here.
_DATA_TYPES = {"bf16": 9, "fp16": 6, "fp32": 7, "fp8": 0}  # fp8 (e4m3): copied as UINT8 bytes
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


def map_dims(shape: Sequence[int], rank: int) -> tuple[int, ...]:
    """The sizes, innermost first, of the ``rank``-dimensional view a tensor map takes of a
    contiguous array of ``shape``: its last ``rank - 1`` axes as they are, every axis before them
    flattened into the outermost (a box of ``rank`` sizes picks the rank).

    >>> map_dims((4, 1000, 128), 2), map_dims((4, 3, 1000, 128), 3), map_dims((128,), 3)
    ((128, 4000), (128, 1000, 12), (128, 1, 1))
    """
    if rank not in (2, 3):
        raise LaunchError(f"tensor maps here are 2-D or 3-D, not {rank}-D")
    shape = (1,) * max(0, rank - 1 - len(shape)) + tuple(int(s) for s in shape)  # at least rank - 1 axes
    outer = 1
    for n in shape[: len(shape) - (rank - 1)]:
        outer *= n
    return (*reversed(shape[len(shape) - (rank - 1):]), outer)


def _describe(dtype: str, dims: Sequence[int], box: Sequence[int]) -> str:
    return f"{dtype} " + "".join(f"[{n}]" for n in reversed(dims)) + f", box {tuple(box)}"


def tensor_map(t, box: Sequence[int], *, swizzle: int = SWIZZLE_128B) -> TensorMap:
    """The tensor map of a contiguous 2-D view of torch tensor ``t`` (its last axis innermost,
    every other axis flattened into rows) for copies of ``box = (inner, outer)`` elements; a box of
    three sizes ``(inner, middle, 1)`` takes the 3-D view ``[outer][middle][inner]`` instead
    (:func:`map_dims`: the copies then stop at the end of each outer index).

    Raises :class:`LaunchError` when the tensor breaks a TMA rule (16-byte aligned data pointer,
    row stride a multiple of 16 bytes) or the driver refuses the map.
    """
    import torch

    if t.dim() < 1:
        raise LaunchError("a TMA tensor map needs a tensor with at least one axis")
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            getattr(torch, "float8_e4m3fn", None): "fp8"}.get(t.dtype)
    if name is None:
        raise LaunchError(f"TMA tensor maps here take bf16, fp16, fp32 or fp8 tensors, not {t.dtype}")
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
    dims = map_dims(t.shape, len(box))
    key = (t.data_ptr(), dims, name, tuple(int(b) for b in box), swizzle, t.device.index)
    with _lock:
        m = _cache.get(key)
        if m is not None:
            return m
    m = _encode(t.data_ptr(), name, dims, elem, box, swizzle)
    with _lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = m
    return m


def view_dims(shape: Sequence[int], view: Sequence[int], elem: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes (innermost first) and byte strides (of every dimension past the innermost) of the
    tensor map whose dimensions are the axes ``view`` (positions in ``shape``, innermost first) of
    a contiguous array: a map may take an array's axes in another order than memory's, so a tile's
    rows need not be the axis next to the innermost (``W[e, h, d]`` read as ``[h][e][d]``).

    >>> view_dims((512, 32, 128), (2, 0, 1), 2)
    ((128, 512, 32), (8192, 256))
    """
    shape = tuple(int(s) for s in shape)
    view = tuple(int(i) for i in view)
    if not 2 <= len(view) <= 5 or sorted(view) != list(range(len(shape))) or view[0] != len(shape) - 1:
        raise LaunchError(f"a tensor map view {view} of a {len(shape)}-axis array: every axis once (2 to 5 of "
                          "them), the innermost first")
    dims = tuple(shape[i] for i in view)
    strides = tuple(elem * math.prod(shape[i + 1:]) for i in view[1:])
    for s in strides:
        if s % 16:
            raise LaunchError(f"the TMA copy needs strides of a multiple of 16 bytes; {shape} read as {dims} "
                              f"has a stride of {s} bytes")
    return dims, strides


def _encode(pointer: int, dtype: str, dims: Sequence[int], elem: int, box: Sequence[int],
            swizzle: int, byte_strides: Sequence[int] | None = None) -> TensorMap:
    """``cuTensorMapEncodeTiled`` of a contiguous array of ``dtype`` at ``pointer`` with sizes
    ``dims``, innermost first (as many as ``box`` has), packed unless ``byte_strides`` gives the
    stride of each dimension past the innermost."""
    m = TensorMap(_describe(dtype, dims, box))
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rank = len(dims)
    if len(box) != rank:
        raise LaunchError(f"a {len(box)}-D box {tuple(box)} for the {rank}-D tensor map of {m.description}")
    gdims = (u64 * rank)(*[int(n) for n in dims])
    if byte_strides is None:
        pitch, steps = elem, []
        for n in dims[:-1]:  # the byte stride of each axis past the innermost
            pitch *= int(n)
            steps.append(pitch)
    else:
        steps = [int(s) for s in byte_strides]
    strides = (u64 * (rank - 1))(*steps)
    boxd = (u32 * rank)(*[int(b) for b in box])
    estr = (u32 * rank)(*([1] * rank))
    rc = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(m.address), ctypes.c_int(_DATA_TYPES[dtype]), u32(rank), ctypes.c_void_p(pointer),
        gdims, strides, boxd, estr, ctypes.c_int(_INTERLEAVE_NONE), ctypes.c_int(swizzle),
        ctypes.c_int(_L2_PROMOTION_256B), ctypes.c_int(_OOB_FILL_ZERO))
    if rc != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled refused {m.description}: {_error_name(rc)}")
    return m


_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


class TensorMapSlot:
    """The tensor maps of one kernel argument whose dtype, shape and box never change: one
    encoding per data pointer, kept (at most ``limit``; past it the older half is dropped).

    What the shape alone decides is checked once, when the slot is made (a non-empty array, rows
    a multiple of 16 bytes); :meth:`get` checks the pointer's 16-byte alignment, the one thing a
    new tensor of the same shape can break. Maps never go stale: a pointer freed and handed to
    another tensor of this slot's shape describes that tensor exactly as well.

    >>> TensorMapSlot("bf16", (1000, 1000), (64, 128)).description
    'bf16 [1000][1000], box (64, 128)'
    >>> TensorMapSlot("bf16", (3, 5, 200, 64), (64, 64, 1)).description  # 3-D: rows end with each outer index
    'bf16 [15][200][64], box (64, 64, 1)'
    >>> TensorMapSlot("bf16", (4, 7), (8, 4))
    Traceback (most recent call last):
    ...
    napkin.errors.LaunchError: the TMA copy needs rows of a multiple of 16 bytes; the last axis has 7 elements of 2 bytes
    """

    __slots__ = ("dtype", "inner", "outer", "box", "dims", "strides", "swizzle", "limit", "_maps", "description")

    def __init__(self, dtype: str, shape: Sequence[int], box: Sequence[int], *, swizzle: int = SWIZZLE_128B,
                 limit: int = 64, view: Sequence[int] = ()):
        if dtype not in _DATA_TYPES:
            raise LaunchError(f"TMA tensor maps here take bf16, fp16, fp32 or fp8 tensors, not {dtype}")
        shape = tuple(int(s) for s in shape)
        if not shape:
            raise LaunchError("a TMA tensor map needs a tensor with at least one axis")
        inner, outer = shape[-1], 1
        for s in shape[:-1]:
            outer *= s
        if inner == 0 or outer == 0:
            raise LaunchError("a TMA tensor map needs a non-empty tensor")
        elem = _ELEMENT_BYTES[dtype]
        if (inner * elem) % 16:
            raise LaunchError(f"the TMA copy needs rows of a multiple of 16 bytes; the last axis has {inner} "
                              f"elements of {elem} bytes")
        self.dtype, self.inner, self.outer = dtype, inner, outer
        self.box = tuple(int(b) for b in box)
        if view:
            # the array's axes in the view's order (view_dims); the box has one size a dimension
            self.dims, self.strides = view_dims(shape, view, elem)
            if len(self.box) != len(self.dims):
                raise LaunchError(f"a {len(self.box)}-D box {self.box} for a {len(self.dims)}-D view {tuple(view)}")
        else:
            self.dims, self.strides = map_dims(shape, len(self.box)), None
        self.swizzle, self.limit = int(swizzle), max(2, int(limit))
        self._maps: dict[int, TensorMap] = {}
        self.description = _describe(dtype, self.dims, self.box) + (f", axes {tuple(view)}" if view else "")

    def get(self, pointer: int) -> TensorMap:
        """The tensor map of this slot's array at ``pointer`` (encoded the first time it is seen)."""
        m = self._maps.get(pointer)
        if m is not None:
            return m
        if pointer % 16:
            raise LaunchError(f"the TMA copy needs a 16-byte aligned data pointer; this {self.dtype} "
                              f"[{self.outer}][{self.inner}] tensor starts at an offset (pass a .clone())")
        m = _encode(pointer, self.dtype, self.dims, _ELEMENT_BYTES[self.dtype], self.box, self.swizzle, self.strides)
        with _lock:
            if len(self._maps) >= self.limit:
                for old in list(self._maps)[: self.limit // 2]:
                    del self._maps[old]
            self._maps[pointer] = m
        return m

    def __len__(self) -> int:
        return len(self._maps)


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


def error_name(code: int) -> str:
    """The driver's name for CUDA error ``code`` (``CUDA_ERROR_INVALID_VALUE``)."""
    return _error_name(code)
