"""Launching compiled kernels on torch tensors, and checking those tensors first.

A :class:`CompiledKernel` is called like CuPy's raw kernels, ``kernel(grid, block, args,
shared_mem=0)``, with torch CUDA tensors and Python or NumPy scalars as ``args``:

- a tensor passes its data pointer in place (no copy; its strides are the kernel's business,
  :func:`check_tensor` is the place to insist on contiguity);
- ``int`` becomes a 32-bit ``int`` (an error if it does not fit: pass ``numpy.int64`` for a
  ``long long`` parameter), ``float`` a 32-bit ``float``, ``bool`` a ``bool``; NumPy scalars pass
  as they are; ``None`` is a null pointer;
- a :class:`~napkin.kernels.tma.TensorMap` passes its 128 bytes by value (such a launch goes
  through the driver's ``cuLaunchKernel``, which CuPy's launcher cannot do).

The launch runs on torch's current stream of the tensors' device, raises the kernel's dynamic
shared-memory limit when ``shared_mem`` is above the 48 KB default, and turns launch failures into
:class:`~napkin.errors.LaunchError`. With ``sync=True`` (or ``NAPKIN_SYNC_LAUNCH=1``) it also waits
for the kernel, so a fault inside it is reported at the launch that caused it.

The hot path is a :class:`PreparedLaunch` (:meth:`CompiledKernel.prepare`): everything but the
tensors' addresses and the stream is decided once — the function loaded on its device, the
shared-memory limit raised, the scalar arguments packed into a parameter array, the tensor-map
arguments given a :class:`~napkin.kernels.tma.TensorMapSlot` (encodings cached per pointer) —
and a launch writes the data pointers into that array and calls ``cuLaunchKernel`` once
through CuPy's binding (about 1 µs of Python besides the driver's own time). It does no tensor
check: its caller checked the tensors.

Importing this module needs neither torch nor CuPy.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from napkin.errors import LaunchError

from .tma import TensorMap, TensorMapSlot, error_name, launch_raw

#: Dynamic shared memory a kernel may use without raising its limit.
DEFAULT_DYNAMIC_SMEM = 48 * 1024

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


# ---- tensor checks -------------------------------------------------------------------------

def _torch_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    from napkin.dtypes import torch_dtype

    return torch_dtype(dtype)


def _format_shape(shape: Sequence[Any]) -> str:
    items = ["*" if s is None or s == -1 else str(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def same_device(actual, expected) -> bool:
    """Whether torch device ``actual`` is ``expected`` (a torch.device, ``'cuda:1'``, an index,
    or ``'cuda'`` meaning the current CUDA device)."""
    import torch

    if isinstance(expected, int):
        expected = torch.device("cuda", expected)
    expected = torch.device(expected)
    if actual.type != expected.type:
        return False
    if expected.index is None:
        if expected.type != "cuda":
            return True
        try:
            current = torch.cuda.current_device()
        except Exception:  # noqa: BLE001 - no CUDA here: treat index 0 as current
            current = 0
        return (actual.index if actual.index is not None else current) == current
    return (actual.index if actual.index is not None else 0) == expected.index


def check_tensor(t, name: str, *, dtype=None, shape: Sequence[Any] | None = None, device=None,
                 contiguous: bool = True, align: int | None = None):
    """Check that ``t`` is what a kernel argument called ``name`` must be, and return it.

    ``dtype``: a torch dtype or a napkin dtype name (``"bf16"``); ``shape``: a sequence whose
    entries are sizes, or None / -1 for any size; ``device``: a CUDA device the tensor must be on
    (default: any CUDA device); ``contiguous``: refuse strided views; ``align``: bytes the data
    pointer must be a multiple of. Each failure raises :class:`LaunchError` naming ``name``.
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise LaunchError(f"{name}: expected a torch tensor, got {type(t).__name__}")
    if dtype is not None:
        want = _torch_dtype(dtype)
        if t.dtype != want:
            raise LaunchError(f"{name}: dtype is {t.dtype}, expected {want}")
    if shape is not None:
        shape = tuple(shape)
        ok = len(shape) == t.dim() and all(
            s is None or s == -1 or int(s) == n for s, n in zip(shape, t.shape))
        if not ok:
            raise LaunchError(f"{name}: shape is {_format_shape(tuple(t.shape))}, "
                              f"expected {_format_shape(shape)}")
    if contiguous and not t.is_contiguous():
        raise LaunchError(f"{name}: is not contiguous (shape {_format_shape(tuple(t.shape))}, "
                          f"strides {tuple(t.stride())}); pass {name}.contiguous()")
    if align and t.device.type != "meta" and t.data_ptr() % align:
        raise LaunchError(f"{name}: data pointer is not {align}-byte aligned")
    if t.device.type != "cuda":
        raise LaunchError(f"{name}: is a {t.device.type.upper()} tensor; kernels need CUDA tensors "
                          f"(move it with {name}.cuda())")
    if device is not None and not same_device(t.device, device):
        raise LaunchError(f"{name}: is on {t.device}, expected {device}")
    return t


# ---- launching -----------------------------------------------------------------------------

def _dims(value, what: str) -> tuple[int, int, int]:
    if isinstance(value, int):
        value = (value,)
    try:
        dims = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise LaunchError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise LaunchError(f"{what} must be 1 to 3 positive sizes, got {value!r}")
    return (dims + (1, 1))[:3]


def _check_dims(grid, block) -> None:
    threads = block[0] * block[1] * block[2]
    if threads > 1024 or block[2] > 64:
        raise LaunchError(f"block {block} has {threads} threads; at most 1024 (and z <= 64)")
    if grid[0] > 2 ** 31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise LaunchError(f"grid {grid} is too large (x < 2^31, y and z <= 65535)")


def _sync_default() -> bool:
    from napkin.settings import sync_launches

    return sync_launches()


@dataclass(frozen=True)
class KernelAttributes:
    """What the driver reports for a loaded kernel."""

    registers: int
    static_shared_bytes: int
    local_bytes: int
    const_bytes: int
    max_threads_per_block: int


class CompiledModule:
    """A compiled cubin, loaded lazily into each device's context it is used on."""

    def __init__(self, cubin: bytes, *, arch: str, key: str = "", filename: str = "kernel.cu"):
        self.cubin = cubin
        self.arch = arch
        self.key = key
        self.filename = filename
        self._loaded: dict[int, Any] = {}
        self._functions: dict[tuple[str, int], Any] = {}
        self._kernels: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CompiledModule({self.filename!r}, arch={self.arch!r}, {len(self.cubin)} bytes)"

    def kernel(self, name: str) -> CompiledKernel:
        with self._lock:
            k = self._kernels.get(name)
            if k is None:
                k = self._kernels[name] = CompiledKernel(self, name)
            return k

    __getitem__ = kernel

    def function(self, name: str, device: int):
        """CuPy's Function for kernel ``name`` on CUDA device ``device`` (loading the module)."""
        import cupy

        with self._lock:
            fn = self._functions.get((name, device))
            if fn is not None:
                return fn
            with cupy.cuda.Device(device):
                module = self._loaded.get(device)
                if module is None:
                    module = cupy.cuda.function.Module()
                    try:
                        module.load(self.cubin)
                    except Exception as e:
                        raise LaunchError(
                            f"cannot load the cubin built for {self.arch} on CUDA device "
                            f"{device}: {e}") from e
                    self._loaded[device] = module
                try:
                    fn = module.get_function(name)
                except Exception as e:
                    raise LaunchError(
                        f"no kernel {name!r} in {self.filename} (is it declared extern \"C\"?): "
                        f"{e}") from e
            self._functions[(name, device)] = fn
            return fn


_device_props: dict[int, dict] = {}


def _smem_optin(device: int) -> int:
    props = _device_props.get(device)
    if props is None:
        import cupy

        props = _device_props[device] = cupy.cuda.runtime.getDeviceProperties(device)
    return int(props.get("sharedMemPerBlockOptin", DEFAULT_DYNAMIC_SMEM))


class CompiledKernel:
    """One kernel of a :class:`CompiledModule`, callable as ``k(grid, block, args, shared_mem)``."""

    def __init__(self, module: CompiledModule, name: str):
        self.module = module
        self.name = name
        self._smem_limit: dict[int, int] = {}
        self._static_smem: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"CompiledKernel({self.name!r}, arch={self.module.arch!r})"

    @property
    def arch(self) -> str:
        return self.module.arch

    def attributes(self, device: int | None = None) -> KernelAttributes:
        """Registers, static shared memory and limits of this kernel as loaded on ``device``."""
        import cupy
        from cupy.cuda import driver

        device = _current_device() if device is None else int(device)
        fn = self.module.function(self.name, device)
        with cupy.cuda.Device(device):
            get = lambda attr: int(driver.funcGetAttribute(attr, fn.ptr))
            return KernelAttributes(
                registers=get(driver.CU_FUNC_ATTRIBUTE_NUM_REGS),
                static_shared_bytes=get(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                local_bytes=get(driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                const_bytes=get(driver.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES),
                max_threads_per_block=get(driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            )

    def _raise_smem_limit(self, fn, device: int, shared_mem: int) -> None:
        # a block may hold 48 KiB of static and dynamic shared memory together without opting in:
        # 48 KiB of dynamic beside a few static words needs the raised limit too
        # (_smem_limit: the most dynamic shared memory known to launch on the device)
        if shared_mem == 0 or shared_mem <= self._smem_limit.get(device, 0):
            return
        import cupy
        from cupy.cuda import driver

        with cupy.cuda.Device(device):
            self._opt_in(fn, device, shared_mem, driver)
        self._smem_limit[device] = shared_mem

    def _opt_in(self, fn, device: int, shared_mem: int, driver) -> None:
        static = self._static_smem.get(device)
        if static is None:
            static = self._static_smem[device] = int(
                driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn.ptr))
        if static + shared_mem <= DEFAULT_DYNAMIC_SMEM:
            return
        optin = _smem_optin(device)
        if static + shared_mem > optin:
            raise LaunchError(f"{self.name}: {shared_mem} bytes of dynamic shared memory asked for beside "
                              f"{static} static; device {device} allows at most {optin} per block")
        try:
            driver.funcSetAttribute(
                fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_mem))
        except Exception as e:
            raise LaunchError(f"{self.name}: cannot raise the dynamic shared-memory limit to "
                              f"{shared_mem} bytes (static shared memory counts too): {e}") from e

    def __call__(self, grid, block, args: Sequence[Any], shared_mem: int = 0, *, stream=None,
                 sync: bool | None = None) -> None:
        import cupy

        grid3, block3 = _dims(grid, "grid"), _dims(block, "block")
        _check_dims(grid3, block3)
        if shared_mem < 0:
            raise LaunchError(f"{self.name}: shared_mem must be >= 0, got {shared_mem}")
        device = _launch_device(args)
        kargs = [_kernel_arg(a, i, device, self.name) for i, a in enumerate(args)]
        fn = self.module.function(self.name, device)
        with cupy.cuda.Device(device):
            self._raise_smem_limit(fn, device, int(shared_mem))
            cstream = _cupy_stream(stream, device)
            try:
                if any(isinstance(a, TensorMap) for a in kargs):
                    launch_raw(int(fn.ptr), grid3, block3, int(shared_mem), int(cstream.ptr), kargs, self.name)
                else:
                    fn(grid3, block3, kargs, shared_mem=int(shared_mem), stream=cstream)
            except LaunchError:
                raise
            except Exception as e:
                raise LaunchError(f"launch of {self.name} failed (grid {grid3}, block {block3}, "
                                  f"{shared_mem} bytes dynamic shared memory): {e}") from e
            if _sync_default() if sync is None else sync:
                try:
                    cstream.synchronize()
                except Exception as e:
                    raise LaunchError(f"{self.name} failed while running (grid {grid3}, block "
                                      f"{block3}): {e}") from e

    launch = __call__

    def prepare(self, grid, block, args: Sequence[Any], shared_mem: int = 0, *, device: int | None = None,
                sync: bool | None = None, sources: Sequence[int] | None = None) -> "PreparedLaunch":
        """This kernel's launch with everything fixed but the tensors' addresses (see
        :class:`PreparedLaunch`). ``args`` holds, per kernel parameter, :data:`POINTER` (a data
        pointer given at each launch), a :class:`~napkin.kernels.tma.TensorMapSlot` (a tensor map,
        from the pointer given at each launch), or a scalar as :meth:`__call__` takes it.
        ``sync`` (default: ``NAPKIN_SYNC_LAUNCH``, read now) waits for each launch; ``sources``
        places the per-launch pointers in what a call passes (see :class:`PreparedLaunch`)."""
        return PreparedLaunch(self, grid, block, args, shared_mem,
                              device=_current_device() if device is None else int(device),
                              sync=_sync_default() if sync is None else bool(sync), sources=sources)


class _Pointer:
    """The marker of a kernel parameter that is a data pointer given at each launch."""

    def __repr__(self) -> str:
        return "POINTER"


#: In :meth:`CompiledKernel.prepare`'s ``args``: a data pointer given at each launch.
POINTER = _Pointer()

_CUDA_ERROR_INVALID_CONTEXT = 201


def cu_launch_kernel():
    """The driver's ``cuLaunchKernel`` for the prepared launches, and the error it raises:
    ``(launch, error)``. ``launch(function, grid x, y, z, block x, y, z, shared bytes, stream,
    parameter array, extra)`` takes plain ints (addresses as ints, 0 for null) and raises
    ``error``, whose ``status`` is the driver's code, when the launch fails.

    It is CuPy's compiled binding of the driver call: its wrapper converts the ints in C, where
    ctypes builds a foreign call of eleven arguments per launch (H100 host, per launch: 4.1 µs
    through CuPy against 5.0 µs through ctypes with values made once)."""
    from cupy.cuda import driver

    return driver.launchKernel, driver.CUDADriverError


class PreparedLaunch:
    """One kernel launch prepared once: call it with the data pointers of its per-launch
    arguments and a raw stream handle.

    The parameter array is built here: scalars packed to their C types, one 8-byte cell per
    pointer parameter, a tensor-map parameter pointing at its map's bytes (looked up per pointer
    in its slot at each call). The other arguments of ``cuLaunchKernel`` (function, grid, block,
    shared memory, the array's address) are ints kept in one tuple and passed through CuPy's
    compiled binding of the driver call (:func:`cu_launch_kernel`).
    ``cuLaunchKernel`` copies the parameters when it is called, so the array is rewritten for the
    next launch at once; a lock keeps two threads from interleaving (the call releases the GIL).
    A launch on a stream being captured into a CUDA graph records the kernel with these values.

    ``sources`` says where each per-launch argument's pointer is in the sequence a call passes:
    by default the i-th such argument reads ``pointers[i]``; a compiled diagram passes the
    pointers of all its tensors and names each argument's index.
    """

    __slots__ = ("kernel", "name", "device", "grid", "block", "shared_mem", "sync", "_pointer_params",
                 "_map_params", "_fn", "_params", "_cells", "_keep", "_lock", "_launch", "_launch_error", "_head",
                 "_array")

    def __init__(self, kernel: "CompiledKernel", grid, block, args: Sequence[Any], shared_mem: int, *,
                 device: int, sync: bool = False, sources: Sequence[int] | None = None):
        self.kernel, self.name, self.device = kernel, kernel.name, int(device)
        self.grid, self.block = _dims(grid, "grid"), _dims(block, "block")
        _check_dims(self.grid, self.block)
        if shared_mem < 0:
            raise LaunchError(f"{self.name}: shared_mem must be >= 0, got {shared_mem}")
        self.shared_mem, self.sync = int(shared_mem), bool(sync)
        fn = kernel.module.function(kernel.name, self.device)
        if self.shared_mem:  # beside the kernel's static shared memory it may need the raised limit
            kernel._raise_smem_limit(fn, self.device, self.shared_mem)
        self._fn = int(fn.ptr)
        n = len(args)
        self._params = (ctypes.c_void_p * max(1, n))()
        self._cells = (ctypes.c_uint64 * max(1, n))()
        cells = ctypes.addressof(self._cells)
        self._keep: list = []
        pointer_params, map_params = [], []
        dynamic = [i for i, a in enumerate(args) if a is POINTER or isinstance(a, TensorMapSlot)]
        sources = list(range(len(dynamic))) if sources is None else [int(k) for k in sources]
        if len(sources) != len(dynamic):
            raise LaunchError(f"{self.name}: {len(sources)} pointer source(s) for {len(dynamic)} per-launch "
                              "argument(s)")
        where = dict(zip(dynamic, sources))
        for i, a in enumerate(args):
            if a is POINTER:
                self._params[i] = cells + 8 * i
                pointer_params.append((i, where[i]))
            elif isinstance(a, TensorMapSlot):
                map_params.append((i, where[i], a))
            else:
                value = _kernel_arg(a, i, self.device, self.name)
                if isinstance(value, TensorMap):
                    self._keep.append(value)
                    self._params[i] = value.address
                    continue
                buf = ctypes.create_string_buffer(value.tobytes(), value.itemsize)
                self._keep.append(buf)
                self._params[i] = ctypes.addressof(buf)
        self._pointer_params, self._map_params = tuple(pointer_params), tuple(map_params)
        self._lock = threading.Lock()
        self._launch, self._launch_error = cu_launch_kernel()
        self._head = (self._fn, *self.grid, *self.block, self.shared_mem)
        self._array = ctypes.addressof(self._params)

    def __repr__(self) -> str:
        return (f"PreparedLaunch({self.name!r}, grid {self.grid}, block {self.block}, "
                f"{self.shared_mem} B shared, cuda:{self.device})")

    def __call__(self, pointers: Sequence[int], stream: int) -> None:
        """Launch with the data pointers in ``pointers`` (see ``sources``) on the raw CUDA stream
        handle ``stream``."""
        with self._lock:
            cells, params = self._cells, self._params
            for i, k in self._pointer_params:
                cells[i] = pointers[k]
            for i, k, slot in self._map_params:
                params[i] = slot.get(pointers[k]).address
            rc = self._try_launch(stream)
            if rc == _CUDA_ERROR_INVALID_CONTEXT:  # a thread where CUDA was never used: make the
                _make_current(self.device)         # device's primary context current, then retry
                rc = self._try_launch(stream)
        if rc != 0:
            raise LaunchError(f"launch of {self.name} failed (grid {self.grid}, block {self.block}, "
                              f"{self.shared_mem} bytes dynamic shared memory): {error_name(rc)}")
        if self.sync:
            _synchronize(stream, self.name, self.grid, self.block)

    def _try_launch(self, stream: int) -> int:
        """One ``cuLaunchKernel`` of the parameter array as it stands; the driver's status."""
        try:
            self._launch(*self._head, stream, self._array, 0)
        except self._launch_error as e:
            return e.status
        return 0


def _make_current(device: int) -> None:
    import cupy

    cupy.cuda.runtime.setDevice(device)


def _synchronize(stream: int, name: str, grid, block) -> None:
    from .tma import _driver

    rc = _driver().cuStreamSynchronize(ctypes.c_void_p(stream))
    if rc != 0:
        raise LaunchError(f"{name} failed while running (grid {grid}, block {block}): {error_name(rc)}")


def launch(kernel: CompiledKernel, grid, block, args: Sequence[Any], shared_mem: int = 0, *,
           stream=None, sync: bool | None = None) -> None:
    """Launch ``kernel``; the same as ``kernel(grid, block, args, shared_mem, ...)``."""
    kernel(grid, block, args, shared_mem, stream=stream, sync=sync)


def _current_device() -> int:
    import torch

    return torch.cuda.current_device()


def _launch_device(args: Sequence[Any]) -> int:
    import torch

    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device.index if a.device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_device()


class _StreamHandle:
    """A raw CUDA stream handle offered through the CUDA stream protocol."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


_streams: dict[int, Any] = {}


def _external_stream(handle: int):
    """CuPy's view of the CUDA stream ``handle`` (kept per handle; the handle is all it holds)."""
    s = _streams.get(handle)
    if s is None:
        import cupy

        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        if from_external is not None:
            s = from_external(_StreamHandle(handle))
        else:  # CuPy before 14
            s = cupy.cuda.ExternalStream(handle)
        _streams[handle] = s
    return s


def _cupy_stream(stream, device: int):
    import torch

    if stream is None:
        return _external_stream(torch.cuda.current_stream(device).cuda_stream)
    if isinstance(stream, torch.cuda.Stream):
        return _external_stream(stream.cuda_stream)
    if isinstance(stream, int):
        return _external_stream(stream)
    return stream


def _kernel_arg(a: Any, i: int, device: int, kernel: str):
    import numpy
    import torch

    if isinstance(a, torch.Tensor):
        if not a.is_cuda:
            raise LaunchError(f"{kernel}: argument {i} is a {a.device.type.upper()} tensor; "
                              f"kernels need CUDA tensors")
        if a.device.index != device:
            raise LaunchError(f"{kernel}: argument {i} is on {a.device}, the launch is on "
                              f"cuda:{device}")
        return numpy.uint64(a.data_ptr())
    if a is None:
        return numpy.uint64(0)
    if isinstance(a, TensorMap):
        return a
    if isinstance(a, (bool, numpy.bool_)):
        return numpy.bool_(a)
    if isinstance(a, numpy.generic):
        return a
    if isinstance(a, int):
        if not _INT32_MIN <= a <= _INT32_MAX:
            raise LaunchError(f"{kernel}: argument {i} = {a} does not fit a 32-bit int; pass "
                              f"numpy.int64({a}) for a long long parameter")
        return numpy.int32(a)
    if isinstance(a, float):
        return numpy.float32(a)
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is not None:
        return numpy.uint64(iface["data"][0])
    raise LaunchError(f"{kernel}: argument {i} has unsupported type {type(a).__name__}; pass "
                      f"CUDA tensors, ints, floats, bools or NumPy scalars")
