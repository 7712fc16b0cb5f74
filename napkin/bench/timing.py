"""Timing on a GPU: CUDA events per run, warm-up first, the median of many runs, rotated inputs.

The rules (docs/architecture.md §8 and the device method): device work is asynchronous, so every run is
bracketed by its own pair of CUDA events and the host waits once at the end; the first calls
(module load, run-time compilation, cuBLAS handles, autotuning inside a library) are warm-up and
are not timed; the result is the median of many runs with the 10th and 90th percentiles as the
spread; inputs are random (never zeros: they hide unwritten outputs and can run faster than real
data) and several input sets are rotated so that together they exceed the L2 cache, and L2 is
flushed between runs by writing a buffer twice its size.

The timing loop is written against a small *backend* (make events, record, elapsed time,
synchronize, flush) so the same logic runs with CUDA events on a GPU and with a host clock —
real or fake — on a CPU, which is how it is tested.

>>> clock = iter(range(0, 1000)).__next__          # a fake clock: 0, 1, 2, ...
>>> t = time_fn(lambda: None, warmup=2, reps=5, backend=HostClockBackend(clock), flush_l2=False)
>>> t.median_s, t.reps
(1.0, 5)

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "Timing",
    "time_fn",
    "kernel_times",
    "summarize",
    "percentile",
    "HostClockBackend",
    "CudaEventBackend",
    "make_rotating_inputs",
    "nbytes_of",
    "random_tensor",
    "diagram_inputs",
    "l2_bytes",
    "copy_bandwidth",
    "device_info",
    "parse_nvidia_smi",
    "NVIDIA_SMI_FIELDS",
]


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median of ``reps`` timed runs and its 10th/90th percentiles."""

    median_s: float
    p10_s: float
    p90_s: float
    reps: int

    @property
    def spread(self) -> float:
        """(p90 − p10) / median: the run-to-run noise as a fraction of the median."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else math.inf

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.median_s * 1e6:.2f} us (p10 {self.p10_s * 1e6:.2f}, p90 {self.p90_s * 1e6:.2f}, "
                f"{self.reps} reps)")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default), for a non-empty sequence.

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 4], 10)
    (2.5, 1.3)
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return round(xs[lo] + (xs[hi] - xs[lo]) * frac, 15)


def summarize(samples: Sequence[float]) -> Timing:
    """A :class:`Timing` from per-run seconds."""
    if not samples:
        raise ValueError("no timed runs")
    bad = [s for s in samples if not (s >= 0 and math.isfinite(s))]
    if bad:
        raise ValueError(f"timed runs must be finite and non-negative, got {bad[:3]}")
    return Timing(percentile(samples, 50), percentile(samples, 10), percentile(samples, 90), len(samples))


# ----------------------------------------------------------------------------- backends


class HostClockBackend:
    """Times with a host clock (``time.perf_counter`` by default, or any callable returning
    seconds, e.g. a fake clock in tests). For CPU code, or for a GPU with ``synchronize`` given
    (then each event waits for the device first).

    ``flush`` (optional) is called before every timed run when L2 flushing is asked for.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Callable[[], None] | None = None, flush: Callable[[], None] | None = None):
        self.clock = clock
        self._sync = synchronize
        self._flush = flush
        self.flushes = 0
        self.syncs = 0

    def event(self) -> list:
        return [None]

    def record(self, ev: list) -> None:
        if self._sync is not None:
            self._sync()
        ev[0] = float(self.clock())

    def elapsed_s(self, start: list, end: list) -> float:
        return end[0] - start[0]

    def synchronize(self) -> None:
        self.syncs += 1
        if self._sync is not None:
            self._sync()

    def flush(self) -> None:
        self.flushes += 1
        if self._flush is not None:
            self._flush()


class CudaEventBackend:
    """CUDA events on torch's current stream; L2 flushed by zeroing a buffer of twice its size and
    reading it back.

    The read matters for memory-bound kernels: zeroing alone leaves the L2 full of dirty lines, and
    the timed kernel then pays for writing them back (a 128 MiB column sum on an H200: 45.6 µs
    after a zeroing, 37.7 µs after zeroing and reading). The copy rate that memory-bound kernels
    are compared with is measured without such dirty lines, so the flush leaves the L2 clean.
    """

    def __init__(self, device: Any = None, flush_bytes: int | None = None):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.flush_bytes = int(flush_bytes if flush_bytes is not None else 2 * l2_bytes(self.device))
        self._buf = None

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, ev) -> None:
        ev.record()

    def elapsed_s(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def flush(self) -> None:
        if self._buf is None:
            self._buf = self.torch.empty(max(self.flush_bytes, 1), dtype=self.torch.int8, device=self.device)
        self._buf.zero_()
        self.torch.amax(self._buf)  # evicts the dirty lines (written back now, outside the timed run)


def _default_backend() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return HostClockBackend()
    if torch.cuda.is_available():
        return CudaEventBackend()
    return HostClockBackend()


# ----------------------------------------------------------------------------- the loop


def _call(fn: Callable, args: Any) -> Any:
    if args is None:
        return fn()
    if isinstance(args, Mapping):
        return fn(**args)
    if isinstance(args, (tuple, list)):
        return fn(*args)
    return fn(args)


def time_fn(
    fn: Callable,
    *,
    warmup: int = 10,
    reps: int = 100,
    rotate: Sequence[Any] | None = None,
    flush_l2: bool = True,
    backend: Any = None,
    max_time_s: float | None = None,
    min_reps: int = 10,
) -> Timing:
    """Time ``fn``: ``warmup`` untimed calls, then ``reps`` calls each between two events.

    rotate:     argument sets, used in turn (a tuple/list is passed as positional arguments, a
                dict as keyword arguments, anything else as the one argument); None calls ``fn()``.
                Build them with :func:`make_rotating_inputs` so that together they exceed L2.
    flush_l2:   flush the L2 cache before every timed run (outside the events).
    backend:    how to time (default: CUDA events when a GPU is there, else the host clock).
    max_time_s: cap the timed runs so that ``reps`` × (time per call estimated from the warm-up)
                stays under this, but never below ``min_reps`` runs.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup must be >= 0 and reps >= 1, got warmup={warmup}, reps={reps}")
    b = backend if backend is not None else _default_backend()
    sets = list(rotate) if rotate is not None else [None]
    if not sets:
        raise ValueError("rotate must hold at least one argument set")
    n = len(sets)

    if warmup:
        w0, w1 = b.event(), b.event()
        b.record(w0)
        for i in range(warmup):
            _call(fn, sets[i % n])
        b.record(w1)
        b.synchronize()
        if max_time_s is not None:
            per_call = b.elapsed_s(w0, w1) / warmup
            if per_call > 0:
                reps = max(min(reps, int(max_time_s / per_call)), min(min_reps, reps), 1)
    else:
        b.synchronize()

    starts = [b.event() for _ in range(reps)]
    ends = [b.event() for _ in range(reps)]
    for i in range(reps):
        args = sets[(warmup + i) % n]
        if flush_l2:
            b.flush()
        b.record(starts[i])
        _call(fn, args)
        b.record(ends[i])
    b.synchronize()
    return summarize([b.elapsed_s(s, e) for s, e in zip(starts, ends)])


def kernel_times(fn: Callable, *, rotate: Sequence[Any] | None = None, calls: int = 20,
                 flush: Callable[[], Any] | None = None, warmup: int = 3, reduce: str = "median") -> dict[str, float]:
    """Device µs of each kernel ``fn`` launches, by kernel name, from the torch profiler: a
    diagnostic of where a call's time goes, without the host's launch time that event timing
    shows when the GPU finishes first.

    rotate: argument sets used in turn, as :func:`time_fn`'s; None calls ``fn()``.
    flush:  called before each profiled call (``CudaEventBackend().flush``, say), outside ``fn``.
    reduce: ``"median"`` or ``"mean"`` of a name's launches (a name launched twice a call is
            reported per launch).
    """
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    if reduce not in ("median", "mean"):
        raise ValueError(f"reduce must be 'median' or 'mean', got {reduce!r}")
    sets = list(rotate) if rotate is not None else [None]
    for i in range(warmup):
        _call(fn, sets[i % len(sets)])
    torch.cuda.synchronize()

    def names(prof) -> list:  # the device-side events (kernels, copies, memsets)
        return [e for e in prof.events() if e.device_type.name == "CUDA"]

    flush_names: set = set()
    if flush is not None:  # the flush's own kernels, left out of the result
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            flush()
            torch.cuda.synchronize()
        flush_names = {e.name for e in names(prof)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            if flush is not None:
                flush()
            _call(fn, sets[i % len(sets)])
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in names(prof):
        if e.name not in flush_names:
            times.setdefault(e.name, []).append(e.device_time)
    pick = statistics.median if reduce == "median" else statistics.fmean
    return {k: pick(v) for k, v in times.items()}


# ----------------------------------------------------------------------------- inputs


def nbytes_of(obj: Any) -> int:
    """Bytes held by the tensors/arrays in ``obj`` (nested tuples, lists, dicts); others count 0."""
    if isinstance(obj, Mapping):
        return sum(nbytes_of(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(nbytes_of(v) for v in obj)
    nb = getattr(obj, "nbytes", None)
    if isinstance(nb, int):
        return nb
    numel, esize = getattr(obj, "numel", None), getattr(obj, "element_size", None)
    if callable(numel) and callable(esize):
        return int(numel()) * int(esize())
    return 0


def _tensors(obj: Any) -> Iterable[Any]:
    if isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)
    elif nbytes_of(obj) > 0:
        yield obj


def _is_all_zero(t: Any) -> bool:
    try:
        return not bool(t.any())
    except Exception:  # not a tensor we can ask
        return False


def make_rotating_inputs(
    factory: Callable[[int], Any],
    min_bytes: int | None = None,
    *,
    max_sets: int = 64,
    min_sets: int = 1,
    check_nonzero: bool = True,
) -> list:
    """Argument sets ``factory(0), factory(1), ...`` until together they hold ``min_bytes``
    (default twice the L2 size of the current GPU), at least ``min_sets`` and at most ``max_sets``.

    ``factory(i)`` must return fresh random data (see :func:`random_tensor`); with
    ``check_nonzero`` a tensor that is all zeros is refused (ValueError).
    """
    if min_bytes is None:
        min_bytes = 2 * l2_bytes()
    if max_sets < 1 or min_sets < 1 or min_sets > max_sets:
        raise ValueError(f"need 1 <= min_sets <= max_sets, got {min_sets}, {max_sets}")
    sets: list = []
    total = 0
    while len(sets) < max_sets and (len(sets) < min_sets or total < min_bytes):
        s = factory(len(sets))
        if check_nonzero:
            for k, t in enumerate(_tensors(s)):
                if _is_all_zero(t):
                    raise ValueError(f"argument set {len(sets)}: tensor #{k} is all zeros; "
                                     "time on random data (zeros hide bugs and can run faster)")
        nb = nbytes_of(s)
        sets.append(s)
        total += nb
        if nb == 0 and len(sets) >= min_sets:
            break  # nothing to rotate: more copies would not help
    return sets


def random_tensor(shape: Sequence[int], dtype: Any = "bf16", device: Any = "cuda", *, seed: int | None = None,
                  std: float = 1.0):
    """Normal random data (never zeros) made on ``device``; ``dtype`` a napkin name or torch dtype."""
    import torch

    if not isinstance(dtype, torch.dtype):
        from ..dtypes import torch_dtype

        dtype = torch_dtype(dtype)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
    t = torch.randn(tuple(int(s) for s in shape), device=device, dtype=torch.float32, generator=gen)
    if std != 1.0:
        t.mul_(std)
    return t.to(dtype)


def diagram_inputs(diagram, dtype: Any = None, device: Any = "cuda", *, seed: int | None = None) -> tuple:
    """Random tensors for every input of a bound diagram, in ``diagram.inputs`` order and layout
    (each in its own dtype, or ``dtype`` for all)."""
    out = []
    for k, v in enumerate(diagram.inputs):
        shape = tuple(int(a.bound_size) for a in v.axes)
        out.append(random_tensor(shape, dtype or v.dtype, device, seed=None if seed is None else seed * 1000 + k))
    return tuple(out)


def l2_bytes(device: Any = None) -> int:
    """L2 size of a CUDA device (64 MiB when it cannot be read, 0 without a GPU)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return 0
    if not torch.cuda.is_available():
        return 0
    dev = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "L2_cache_size", 0) or 64 * 1024 * 1024)


# ----------------------------------------------------------------------------- ceilings


def copy_bandwidth(nbytes: int | None = None, *, pairs: int = 2, warmup: int = 5, reps: int = 50,
                   backend: Any = None) -> float:
    """Measured device-to-device copy rate in bytes/s, counting bytes read plus bytes written:
    the ceiling for memory-bound kernels.

    Each source buffer is ``nbytes`` (default max(8·L2, 512 MiB)); ``pairs`` source/destination
    pairs are rotated, so no run finds its data in L2.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("copy_bandwidth needs a CUDA GPU")
    nbytes = int(nbytes or max(8 * l2_bytes(), 512 * 1024 * 1024))
    n = nbytes // 4
    srcs = [torch.rand(n, device="cuda", dtype=torch.float32) + 0.5 for _ in range(pairs)]
    dsts = [torch.empty_like(s) for s in srcs]
    t = time_fn(lambda d, s: d.copy_(s), warmup=warmup, reps=reps, rotate=list(zip(dsts, srcs)),
                flush_l2=False, backend=backend)
    del srcs, dsts
    torch.cuda.empty_cache()
    return 2.0 * n * 4 / t.median_s


# ----------------------------------------------------------------------------- the device

#: What :func:`device_info` asks nvidia-smi, in order (``--query-gpu``).
NVIDIA_SMI_FIELDS = (
    "name", "driver_version", "pci.bus_id", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
    "power.limit", "temperature.gpu", "pstate", "memory.total",
)

_SMI_KEYS = {
    "name": "name", "driver_version": "driver", "pci.bus_id": "pci_bus_id",
    "clocks.sm": "sm_clock_mhz", "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz", "clocks.max.mem": "max_mem_clock_mhz",
    "power.limit": "power_limit_w", "temperature.gpu": "temperature_c", "pstate": "pstate",
    "memory.total": "memory_total_mib",
}


def parse_nvidia_smi(text: str, fields: Sequence[str] = NVIDIA_SMI_FIELDS) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` output: one dict per GPU,
    numbers as floats, ``[N/A]``/``[Not Supported]`` as None.

    >>> parse_nvidia_smi("NVIDIA H200, 580.1, 00000000:18:00.0, 1980, 1980, 3201, 3201, 700.00, 31, P0, 143771")[0]["max_sm_clock_mhz"]
    1980.0
    """
    out = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        row: dict[str, Any] = {}
        for f, p in zip(fields, parts):
            key = _SMI_KEYS.get(f, f.replace(".", "_"))
            if p.startswith("[") or p == "" or p.lower() in ("n/a", "not supported"):
                row[key] = None
                continue
            if f in ("name", "driver_version", "pci.bus_id", "pstate"):
                row[key] = p
            else:
                try:
                    row[key] = float(p)
                except ValueError:
                    row[key] = p
        out.append(row)
    return out


def _nvidia_smi(bus_id: str | None) -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS), "--format=csv,noheader,nounits"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    rows = parse_nvidia_smi(p.stdout)
    if not rows:
        return None
    if bus_id:
        want = bus_id.lower().lstrip("0")
        for r in rows:
            if str(r.get("pci_bus_id") or "").lower().lstrip("0").endswith(want.split(":", 1)[-1]):
                return r
    return rows[0]


def _git_commit() -> str | None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isdir(os.path.join(root, ".git")) or shutil.which("git") is None:
        return None
    try:
        p = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    return p.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_info(device: Any = None) -> dict[str, Any]:
    """What the numbers were measured on: GPU name, SMs, L2, memory, compute capability, clocks
    (through nvidia-smi where it exists), driver, torch, CUDA, cuDNN and Triton versions.

    Works without a GPU (``"cuda": False``) so that reports can say so.
    """
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "napkin_commit": _git_commit(),
    }
    try:
        import torch
    except ImportError:  # pragma: no cover
        info["cuda"] = False
        return info
    info["torch"] = torch.__version__
    info["cuda_version"] = torch.version.cuda
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        info["cudnn"] = None
    try:
        import triton  # noqa: F401

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    info["cuda"] = bool(torch.cuda.is_available())
    if not info["cuda"]:
        return info
    dev = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    props = torch.cuda.get_device_properties(dev)
    info.update(
        name=torch.cuda.get_device_name(dev),
        sm_count=int(props.multi_processor_count),
        capability=f"{props.major}.{props.minor}",
        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        memory_bytes=int(props.total_memory),
    )
    try:
        from ..perfmodel.hardware import match_device_name

        info["gpu_key"] = match_device_name(info["name"])
    except Exception:
        info["gpu_key"] = None
    bus = None
    try:
        dom, b, d = (getattr(props, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        bus = f"{dom:08X}:{b:02X}:{d:02X}.0"
    except Exception:
        pass
    smi = _nvidia_smi(bus)
    if smi:
        info["driver"] = smi.get("driver")
        info["clocks"] = {k: smi.get(k) for k in ("sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz",
                                                   "max_mem_clock_mhz")}
        info["power_limit_w"] = smi.get("power_limit_w")
        info["temperature_c"] = smi.get("temperature_c")
        info["pstate"] = smi.get("pstate")
    else:
        info["driver"] = None
        info["clocks"] = None
    return info
