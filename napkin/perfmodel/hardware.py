"""GPU hardware profiles: the memory hierarchy and the compute rates the performance model needs.

A :class:`GPU` is a frozen value loaded from a JSON profile shipped as package data
(``napkin/perfmodel/profiles/*.json``) or from a user's file (for example one written by
:func:`napkin.perfmodel.calibrate.calibrate`). Datasheet numbers are the defaults; measured
numbers override them through :meth:`GPU.with_overrides`.

Units: bytes, seconds, FLOP/s, Hz, SM clock cycles (``*_clk``). Memory sizes are printed in KiB
(1024 B), MiB and GiB throughout the performance model; the datasheet's "50 MB" L2 is taken as MiB.

Every number that is not a datasheet fact is a named field with a stated source
(:meth:`GPU.source_of`; the profile's ``sources`` overrides the defaults in
:data:`FIELD_SOURCES`): the mma.sync fraction, the memory latency, the per-step and reduction
latencies, calibrated efficiency factors, and each level's bandwidth estimate (``Level.assumption``).

Bandwidth convention (see :class:`Level`): ``Level.bandwidth`` is the rate at which the level
itself is read or written, aggregated over its instances, i.e. the rate of the link between that
level and the level below it. HBM's is the DRAM bandwidth (3.35 TB/s on H100), L2's the L2 read
bandwidth, SMEM's the shared-memory bandwidth. The time to move ``H`` bytes from level ``l`` down
to the next level is ``H / l.bandwidth``; in the paper's multi-level formula the rate at which
values move INTO level ``l`` is therefore the bandwidth of the level above it, which
:meth:`GPU.bandwidth_into` returns.

Validation (:meth:`GPU.__post_init__`, so every way of making a profile is checked: the JSON
loader, the constructor, :meth:`GPU.with_overrides`, ``dataclasses.replace``): each field's
``metadata["check"]`` names what it must be (:data:`CHECKS`: a positive integer, a finite positive
number, a finite non-negative number where zero means "none", a fraction, ...); the levels are
:data:`LEVEL_ORDER` in that order; a level's per-block limit is at most its capacity; ``arch`` is one
of :data:`SUPPORTED_ARCHS` (:func:`check_arch`, also what code generation calls on an ``arch=``
argument), ``has_wgmma`` needs sm_90a and ``has_tma`` sm_90. A JSON profile also names its unknown
and missing keys. Every failure is one :class:`~napkin.errors.HardwareError` sentence naming the file
(or the profile) and the field.

>>> h = get_gpu("H100")
>>> round(h.compute_bound_threshold("fp16"), 1)
590.7
>>> h.level("SMEM").per_block_bytes / 1024
227.0
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..dtypes import DTYPES
from ..dtypes import dtype as _dtype
from ..errors import DiagramError, HardwareError

__all__ = [
    "Level",
    "GPU",
    "get_gpu",
    "list_gpus",
    "gpu_aliases",
    "match_device_name",
    "check_arch",
    "has_clusters",
    "LEVEL_ORDER",
    "FIELD_SOURCES",
    "SUPPORTED_ARCHS",
    "CHECKS",
    "EFFICIENCY_FRACTIONS",
]

#: The canonical level names, top (slowest, largest) to bottom. A profile has exactly these levels,
#: in this order (the order is the hierarchy: :meth:`GPU.parent`, :meth:`GPU.bandwidth_into`).
LEVEL_ORDER = ("HBM", "L2", "SMEM", "RF", "TC")

#: The compile targets napkin generates code for. Every template needs sm_80 (cp.async, ldmatrix,
#: bf16 mma.sync); the Hopper path (TMA, mbarriers) needs sm_90 and wgmma the arch-specific sm_90a.
#: The shared-memory limits the families use know sm_80/sm_87 (163 KiB per block), sm_86/sm_89
#: (99 KiB) and sm_90 (227 KiB). sm_75 has no bf16 mma.sync nor cp.async: its build fails. Later
#: targets (sm_100, sm_120) build with nvcc 13, but napkin has neither a profile nor the
#: shared-memory limits of those GPUs, so it does not claim them.
SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a")

#: The Efficiency fractions (:class:`napkin.perfmodel.roofline.Efficiency`) a calibrated profile may
#: scale in its ``efficiency`` table.
EFFICIENCY_FRACTIONS = ("tensor", "cuda", "sfu", "hbm", "l2", "smem", "rf")

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 40, 40
_SHOW.maxlong = 40


def _show(value: object) -> str:
    """A short repr for error messages (nested or huge values are abbreviated, never recursed)."""
    return _SHOW.repr(value)


def check_arch(arch: object) -> str:
    """``arch`` if napkin generates code for it (:data:`SUPPORTED_ARCHS`), else a HardwareError.

    The one check of a target architecture: profiles call it on their ``arch``, and code generation
    on every ``arch=`` it is given (``derive``, ``plan_schedule``, ``compile``, ``generate_program``).

    >>> check_arch("sm_90a")
    'sm_90a'
    >>> check_arch("sm_75")
    Traceback (most recent call last):
    ...
    napkin.errors.HardwareError: arch 'sm_75' is not supported; napkin generates code for sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a
    """
    if isinstance(arch, str) and arch in SUPPORTED_ARCHS:
        return arch
    raise HardwareError(f"arch {_show(arch)} is not supported; napkin generates code for "
                        f"{', '.join(SUPPORTED_ARCHS)}")


def has_clusters(arch: str) -> bool:
    """Whether ``arch`` runs thread-block clusters (sm_90 and later): blocks scheduled together
    on one GPU processing cluster, each able to read and write the others' shared memory.

    >>> has_clusters("sm_90a"), has_clusters("sm_80")
    (True, False)
    """
    digits = "".join(ch for ch in str(arch).removeprefix("sm_") if ch.isdigit())
    return bool(digits) and int(digits) >= 90


# ---------------------------------------------------------------------- field checks

#: Integers of a profile stay below this (exact as floats: the model multiplies them with rates).
_MAX_INT = 2 ** 53


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v: object) -> float | None:
    """``v`` as a float if it is a real number (an int or a float, not a bool), else None; ints too
    large for a float are inf."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf


#: Every real number of a profile lies in this range (or is 0 where zero is allowed): the model
#: divides rates by rates, so a denormal rate (5e-324 FLOP/s) or 1e300 bytes would underflow or
#: overflow into a zero or infinite prediction. Seconds, bytes, clocks and rates of any GPU fit.
_MIN_REAL, _MAX_REAL = 1e-12, 1e18


def _positive(v: object) -> bool:
    x = _real(v)
    return x is not None and _MIN_REAL <= x <= _MAX_REAL


def _non_negative(v: object) -> bool:
    x = _real(v)
    return x is not None and (x == 0 or _MIN_REAL <= x <= _MAX_REAL)


#: What each ``metadata["check"]`` of a profile field accepts: (test, what the field must be).
CHECKS: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "arch": (lambda v: isinstance(v, str) and v in SUPPORTED_ARCHS, "one of " + ", ".join(SUPPORTED_ARCHS)),
    "level": (lambda v: isinstance(v, str) and v in LEVEL_ORDER, "one of " + ", ".join(LEVEL_ORDER)),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: _is_int(v) and 1 <= v < _MAX_INT, "a positive integer (below 2^53)"),
    "count0": (lambda v: _is_int(v) and 0 <= v < _MAX_INT, "a non-negative integer (below 2^53)"),
    "positive": (_positive, "a finite positive number (between 1e-12 and 1e18)"),
    "non_negative": (_non_negative, "a finite non-negative number (0, or between 1e-12 and 1e18)"),
    "fraction": (lambda v: _positive(v) and float(v) <= 1, "a number in (0, 1]"),
    "bytes": (_positive, "a finite positive number of bytes (at most 1e18)"),
    "bytes_or_null": (lambda v: v is None or _positive(v), "a finite positive number of bytes (at most 1e18) or null"),
}


def _check(kind: str) -> dict[str, str]:
    """A field's metadata: which entry of :data:`CHECKS` its value must pass."""
    return {"check": kind}


def _problem(name: str, kind: str, value: object) -> str | None:
    """Why ``value`` cannot be field ``name`` of kind ``kind`` (a phrase), or None."""
    if kind == "arch":
        try:
            check_arch(value)
        except HardwareError as e:
            return str(e)
        return None
    test, what = CHECKS[kind]
    if not test(value):
        return f"field {name!r} must be {what}, got {_show(value)}"
    return None


def _dtype_key_problem(name: str, key: object) -> str | None:
    if not isinstance(key, str) or key not in DTYPES:
        try:
            canon = _dtype(key).name if isinstance(key, str) else None
        except DiagramError:  # not a dtype by any spelling
            canon = None
        hint = f" (write {canon!r})" if canon else f"; known dtypes: {', '.join(DTYPES)}"
        return f"field {name!r} has key {_show(key)}, which is not a dtype's short name{hint}"
    return None


def _table_problem(name: str, table: object, *, key: str, value: str) -> str | None:
    """Why ``table`` (a mapping of ``key``-kind keys to ``value``-kind values) is not valid."""
    if not isinstance(table, Mapping):
        return f"field {name!r} must be an object, got {_show(table)}"
    for k, v in table.items():
        if key == "dtype":
            why = _dtype_key_problem(name, k)
            if why:
                return why
        elif not (isinstance(k, str) and k.strip()):
            return f"field {name!r} has key {_show(k)}, which is not a non-empty string"
        if value == "mma_shape":
            if not (isinstance(v, (list, tuple)) and len(v) == 3 and all(CHECKS["count"][0](x) for x in v)):
                return f"field {name!r}: the shape for {k!r} must be [m, n, k] of positive integers, got {_show(v)}"
        else:
            test, what = CHECKS[value]
            if not test(v):
                return f"field {name!r}: the value for {k!r} must be {what}, got {_show(v)}"
    return None


def _sources_problem(table: object, fields: frozenset[str]) -> str | None:
    if not isinstance(table, Mapping):
        return f"field 'sources' must be an object, got {_show(table)}"
    for k, v in table.items():
        if not (isinstance(k, str) and (k in fields or (k.startswith("measured.") and len(k) > 9))):
            return (f"field 'sources' has key {_show(k)}, which names no profile field "
                    f"(use a field name or measured.<name>)")
        if not isinstance(v, str):
            return f"field 'sources': the value for {k!r} must be a string, got {_show(v)}"
    return None


def _efficiency_problem(table: object) -> str | None:
    if not isinstance(table, Mapping):
        return f"field 'efficiency' must be an object, got {_show(table)}"
    for fam, fr in table.items():
        if not (isinstance(fam, str) and fam.strip()):
            return f"field 'efficiency' has family {_show(fam)}, which is not a non-empty string"
        if not isinstance(fr, Mapping):
            return f"field 'efficiency': the fractions of {fam!r} must be an object, got {_show(fr)}"
        for k, v in fr.items():
            if k not in EFFICIENCY_FRACTIONS:
                return (f"field 'efficiency': family {fam!r} has unknown fraction {_show(k)}; known: "
                        f"{', '.join(EFFICIENCY_FRACTIONS)}")
            x = _real(v)
            if x is None or not (0 < x <= 1.5):
                return f"field 'efficiency': {fam}.{k} must be a number in (0, 1.5], got {_show(v)}"
    return None


def _level_problem(values: Mapping[str, Any]) -> str | None:
    """Why one level's field values (a mapping with every :class:`Level` field) are not valid."""
    for f in dataclasses.fields(Level):
        why = _problem(f.name, f.metadata["check"], values[f.name])
        if why:
            return why
    cap, blk = values["capacity_bytes"], values["per_block_bytes"]
    if cap is None and values["name"] != "TC":
        return f"field 'capacity_bytes' may be null (unbounded) only on TC, not on {values['name']}"
    if cap is not None and blk is not None and float(blk) > float(cap):
        return f"field 'per_block_bytes' ({_show(blk)}) exceeds 'capacity_bytes' ({_show(cap)})"
    return None


def _profile_problem(values: Mapping[str, Any]) -> str | None:
    """Why a profile's field values are not valid (a phrase; ``values["levels"]`` already checked
    level by level), or None: each field against its check, then the fields together."""
    fields = frozenset(f.name for f in dataclasses.fields(GPU))
    for f in dataclasses.fields(GPU):
        if f.name not in values:
            continue
        v, kind = values[f.name], f.metadata.get("check")
        if kind in CHECKS:
            why = _problem(f.name, kind, v)
        elif kind == "dtype_rates":
            why = _table_problem(f.name, v, key="dtype", value="positive")
        elif kind == "mma_shapes":
            why = _table_problem(f.name, v, key="dtype", value="mma_shape")
        elif kind == "measured":
            why = _table_problem(f.name, v, key="name", value="positive")
        elif kind == "sources":
            why = _sources_problem(v, fields)
        elif kind == "efficiency":
            why = _efficiency_problem(v)
        else:  # levels: checked by the caller
            why = None
        if why:
            return why
    names = [lv["name"] for lv in values["levels"]]
    if tuple(names) != LEVEL_ORDER:
        return f"field 'levels' must be {', '.join(LEVEL_ORDER)} in this order, got {', '.join(names) or 'none'}"
    arch = values["arch"]
    if values.get("has_wgmma") and arch != "sm_90a":
        return f"field 'has_wgmma' is true but wgmma needs arch sm_90a, not {arch}"
    if values.get("has_tma") and arch not in ("sm_90", "sm_90a"):
        return f"field 'has_tma' is true but TMA needs arch sm_90 or sm_90a, not {arch}"
    return None


# ---------------------------------------------------------------------- the profile


@dataclass(frozen=True)
class Level:
    """One level of the memory hierarchy (validated when built; see each field's check).

    name:            "HBM", "L2", "SMEM", "RF" or "TC" (check ``level``).
    capacity_bytes:  HBM: device memory; L2: total; SMEM: per SM; RF: per SM; finite and positive
                     (``bytes_or_null``); None (null: unbounded) only on TC, the operand registers.
    per_block_bytes: the most one thread block may use (SMEM: 227 KiB on Hopper, 163 KiB on
                     A100; RF: 64K registers x 4 B, the CUDA per-block limit); None where no
                     per-block limit applies; at most ``capacity_bytes``.
    instances:       1 for HBM and L2, the number of SMs for SMEM, RF and TC (a positive integer).
    bandwidth:       bytes/s this level delivers to (or accepts from) the level below it,
                     aggregated over all instances (see the module docstring); finite and positive.
    assumption:      one line saying where the numbers come from (datasheet / estimate / calibrated).
    """

    name: str = field(metadata=_check("level"))
    capacity_bytes: float | None = field(metadata=_check("bytes_or_null"))
    per_block_bytes: float | None = field(metadata=_check("bytes_or_null"))
    instances: int = field(metadata=_check("count"))
    bandwidth: float = field(metadata=_check("positive"))
    assumption: str = field(metadata=_check("text"))

    def __post_init__(self) -> None:
        why = _level_problem({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if why:
            raise HardwareError(f"memory level {_show(self.name)}: {why}")

    @property
    def total_capacity_bytes(self) -> float | None:
        """Capacity summed over instances (None if unbounded)."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes * self.instances

    @property
    def bandwidth_per_instance(self) -> float:
        """Bandwidth of one instance (one SM for SMEM/RF/TC)."""
        return self.bandwidth / self.instances


_LEVEL_FIELDS = tuple(f.name for f in dataclasses.fields(Level))

#: Where the non-datasheet fields of a profile come from, unless the profile's ``sources`` says
#: otherwise (a calibrated profile records "calibrated ..." there).
FIELD_SOURCES: dict[str, str] = {
    "mma_sync_fraction": "measured: a pure mma.sync m16n8k16 bf16 loop reached 647 of 989.4 TFLOP/s on one "
                         "H200 (1.0 on Ampere, where mma.sync is the datasheet path)",
    "memory_latency_s": "estimate: an HBM load's latency under load (several hundred ns on A100/H100-class "
                        "parts in published pointer-chasing microbenchmarks; not measured here)",
    "step_overhead_clk": "estimate: one streamed-loop step's fixed cost a block cannot overlap with its own "
                         "work: a __syncthreads barrier (~20-40 clk) + the dependent ldmatrix -> mma restart "
                         "of the next chunk (~30 + ~30 clk) + loop and copy issue (~10 clk)",
    "wgmma_step_clk": "measured: H200, bf16, wgmma tiles of 64 rows (one consumer warpgroup) over 64 "
                      "chunks of 64: 1024 x 4096 x 1024 on 64 x 128 tiles 15.6 us of kernel and 4096 x "
                      "4096 x 8 on 64 x 64 tiles 17.7 us, 0.24-0.25 us a chunk of four dependent wgmma, "
                      "about 112 clk each at 1.83 GHz (benchmarks/results/nvidia-h200/wgmma_chain_s27.txt); "
                      "on those kernels' 8-slot rings it is mostly the ring's round trip, not the wgmma's own "
                      "latency: a dependent chain of m64nNk16 from shared memory runs 19 / 32 / 64 clk a step at "
                      "N = 8 / 64 / 128 (wgmma_chain_micro_s28.jsonl), and the contraction family divides the "
                      "step for deeper rings",
    "shuffle_latency_clk": "estimate: one dependent shfl.sync stage and the add/max consuming it "
                           "(~25-35 clk on Volta-to-Hopper SMs in published microbenchmarks)",
    "sync_latency_clk": "estimate: the cross-warp stage of a block-wide reduction: st.shared + "
                        "__syncthreads + ld.shared (~2 x 30 clk shared-memory latency + ~20 clk barrier)",
    "launch_overhead_s": "estimate: back-to-back kernel launches on one stream cost a few microseconds each",
    "l2_round_clk": "measured and fitted: H200, bf16 rmsnorm backward over 8192 x 1024 (64-thread blocks, 1024 column "
                    "partials): its in-kernel combine in 16 dependent rounds of L2 loads a thread ran 28.1 us, "
                    "in 8 rounds 25.6 (norm_backward_combine_slices_s30.jsonl): 0.31 us a round, about 570 clk "
                    "at 1.83 GHz (an L2 hit's own latency is a few hundred clk; the partials of many blocks "
                    "queue behind each other)",
    "efficiency": "calibrated per family (napkin.bench.calibration); empty on datasheet profiles",
}


@dataclass(frozen=True, kw_only=True)
class GPU:
    """A GPU as the performance model sees it. Build with :func:`get_gpu`.

    Fields are keyword-only. ``tensor_flops`` holds dense tensor-core FLOP/s per dtype (``fp32`` is
    not a tensor dtype: fp32 inputs go through ``tf32``); ``cuda_core_flops`` the non-tensor
    FLOP/s. ``sfu_ops_per_clk_per_sm`` may be fractional after calibration.

    Every field is checked when the profile is built (the module docstring; ``metadata["check"]``
    names the :data:`CHECKS` entry): counts are positive integers (never bools, never 2.5), rates,
    bandwidths, capacities, clocks and ``memory_latency_s`` finite and positive, the per-step and
    reduction latencies and the launch overhead finite and non-negative (zero: the model adds
    nothing for them), ``smem_reserved_per_block`` a non-negative integer (zero: the driver
    reserves nothing). A bad value raises HardwareError naming the field.
    """

    key: str = field(metadata=_check("name"))
    name: str = field(metadata=_check("name"))
    #: The compile target, one of :data:`SUPPORTED_ARCHS` (:func:`check_arch`).
    arch: str = field(metadata=_check("arch"))
    sms: int = field(metadata=_check("count"))
    clock_hz: float = field(metadata=_check("positive"))
    #: Exactly the levels of :data:`LEVEL_ORDER`, in that order.
    levels: tuple[Level, ...] = field(metadata=_check("levels"))
    #: {dtype short name: FLOP/s}, each finite and positive.
    tensor_flops: dict[str, float] = field(metadata=_check("dtype_rates"))
    cuda_core_flops: dict[str, float] = field(metadata=_check("dtype_rates"))
    sfu_ops_per_clk_per_sm: float = field(default=16, metadata=_check("positive"))
    regs_per_sm_bytes: int = field(default=65536 * 4, metadata=_check("count"))
    max_warps_per_sm: int = field(default=64, metadata=_check("count"))
    max_threads_per_block: int = field(default=1024, metadata=_check("count"))
    max_regs_per_thread: int = field(default=255, metadata=_check("count"))
    #: {dtype short name: (m, n, k)} of positive integers.
    mma_shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict, metadata=_check("mma_shapes"))
    #: wgmma needs arch sm_90a; TMA needs sm_90 or sm_90a.
    has_wgmma: bool = field(default=False, metadata=_check("flag"))
    has_tma: bool = field(default=False, metadata=_check("flag"))
    source: str = field(default="datasheet", metadata=_check("text"))
    # Extras beyond the core API (CUDA occupancy-calculator constants and bookkeeping).
    max_blocks_per_sm: int = field(default=32, metadata=_check("count"))
    #: Registers per warp are allocated in multiples of this.
    reg_alloc_unit: int = field(default=256, metadata=_check("count"))
    #: Bytes; shared memory per block is rounded up to this.
    smem_alloc_unit: int = field(default=128, metadata=_check("count"))
    #: Bytes the driver reserves per block (1 KiB on sm_80 and later; zero: none).
    smem_reserved_per_block: int = field(default=1024, metadata=_check("count0"))
    #: Raw calibration results ({name: value}), each finite and positive.
    measured: dict[str, float] = field(default_factory=dict, metadata=_check("measured"))
    notes: str = field(default="", metadata=_check("text"))
    # What napkin's kernels reach beyond the datasheet (see the performance model's predict module).
    #: Fraction of ``tensor_flops`` the warp-level ``mma.sync`` path reaches, in (0, 1]. 1.0 where
    #: mma.sync is the full tensor path (Ampere); on Hopper the datasheet rate needs wgmma, and a
    #: pure mma.sync m16n8k16 bf16 loop reached 647 of 989.4 TFLOP/s on one H200 (the profile's notes).
    mma_sync_fraction: float = field(default=1.0, metadata=_check("fraction"))
    #: Latency of an HBM load under load, seconds (finite and positive): the Little's-law floor of
    #: a kernel with few bytes in flight, and the pipeline fill every block pays before its first
    #: chunk or row arrives (estimate; calibratable).
    memory_latency_s: float = field(default=800e-9, metadata=_check("positive"))
    #: Fixed cost of one step of a streamed loop, SM clock cycles (finite, >= 0; zero: none), that
    #: the block cannot overlap with its own work (barrier, dependent operand-load -> mma restart,
    #: loop and copy issue); co-resident blocks hide it from each other (estimate, see
    #: :data:`FIELD_SOURCES`).
    step_overhead_clk: float = field(default=100.0, metadata=_check("non_negative"))
    #: Time of one wgmma k16 step that waits on the one before it, clocks (finite, >= 0; zero: no
    #: wgmma). A consumer warpgroup adds each chunk's BK / 16 products into one accumulator tile,
    #: so they run one after another, and a tile of few rows or columns is bound by that chain
    #: rather than by the tensor rate (measured; see :data:`FIELD_SOURCES`).
    wgmma_step_clk: float = field(default=0.0, metadata=_check("non_negative"))
    #: Latency of one dependent warp-shuffle stage of a cross-thread reduction, clocks (finite,
    #: >= 0; a row reduced by T <= 32 threads takes log2(T) stages; estimate).
    shuffle_latency_clk: float = field(default=30.0, metadata=_check("non_negative"))
    #: Latency of the cross-warp stage of a reduction that spans several warps (shared-memory
    #: store, barrier, load), clocks (finite, >= 0; estimate).
    sync_latency_clk: float = field(default=80.0, metadata=_check("non_negative"))
    #: One round of dependent loads from L2 after a kernel's loop, clocks (finite, >= 0): the
    #: in-kernel combine of partials other blocks wrote, whose rounds run one after another once
    #: the last block arrives, with nothing of the kernel left to overlap them (fitted; see
    #: :data:`FIELD_SOURCES`).
    l2_round_clk: float = field(default=570.0, metadata=_check("non_negative"))
    #: Fixed cost of one kernel launch, seconds (finite, >= 0), added to every kernel's time
    #: (estimate).
    launch_overhead_s: float = field(default=3e-6, metadata=_check("non_negative"))
    #: Where each non-datasheet field's number comes from ({field: one line}; a key is a field
    #: name or ``measured.<name>``); fields not listed fall back to :data:`FIELD_SOURCES` (see
    #: :meth:`source_of`).
    sources: dict[str, str] = field(default_factory=dict, metadata=_check("sources"))
    #: Calibrated efficiency fractions per code-generation family ({"attention": {"tensor": 0.9}}:
    #: names from :data:`EFFICIENCY_FRACTIONS`, values in (0, 1.5]), multiplying
    #: :class:`~napkin.perfmodel.roofline.Efficiency` for that family's kernels (written by
    #: :mod:`napkin.bench.calibration`; empty on datasheet profiles).
    efficiency: dict[str, dict[str, float]] = field(default_factory=dict, metadata=_check("efficiency"))

    def __post_init__(self) -> None:
        where = f"GPU profile {_show(self.key)}"
        levels = self.levels
        if not isinstance(levels, (tuple, list)) or not all(isinstance(lv, Level) for lv in levels):
            raise HardwareError(f"{where}: field 'levels' must be a tuple of Level, got {_show(levels)}")
        if isinstance(levels, list):
            object.__setattr__(self, "levels", tuple(levels))
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["levels"] = [{k: getattr(lv, k) for k in _LEVEL_FIELDS} for lv in self.levels]
        why = _profile_problem(values)
        if why:
            raise HardwareError(f"{where}: {why}")

    def source_of(self, name: str) -> str:
        """Where the number of field ``name`` comes from: the profile's ``sources`` entry, else
        :data:`FIELD_SOURCES`, else the profile's ``source`` ("datasheet", "calibrated ...")."""
        return self.sources.get(name) or FIELD_SOURCES.get(name) or self.source

    def clocks_to_s(self, clocks: float) -> float:
        """SM clock cycles in seconds at ``clock_hz``."""
        return float(clocks) / self.clock_hz

    # ------------------------------------------------------------------ levels
    def level_names(self) -> tuple[str, ...]:
        """Names of the levels, top (HBM) to bottom (TC)."""
        return tuple(lv.name for lv in self.levels)

    @property
    def smem_per_block(self) -> int | None:
        """The shared memory one thread block may use (the SMEM level's ``per_block_bytes``), or
        None where the profile names no such limit.

        >>> get_gpu("H100").smem_per_block // 1024, get_gpu("A100").smem_per_block // 1024
        (227, 163)
        """
        if "SMEM" not in self.level_names() or not self.level("SMEM").per_block_bytes:
            return None
        return int(self.level("SMEM").per_block_bytes)

    def level(self, name: str) -> Level:
        """The level called ``name`` (case-insensitive); HardwareError naming the known ones."""
        want = str(name).upper()
        for lv in self.levels:
            if lv.name.upper() == want:
                return lv
        raise HardwareError(
            f"GPU {self.key!r} has no memory level {name!r}; known levels: {', '.join(self.level_names())}"
        )

    def parent(self, name: str) -> Level | None:
        """The level above ``name`` (None for the top level)."""
        lv = self.level(name)
        i = self.levels.index(lv)
        return self.levels[i - 1] if i > 0 else None

    def bandwidth_into(self, name: str) -> float:
        """Bytes/s moved INTO level ``name`` from the level above (the paper's Ḣ_ℓ).

        This is the bandwidth of the parent level; the top level has no parent and returns inf
        (nothing moves into it, so it costs nothing).
        """
        p = self.parent(name)
        return math.inf if p is None else p.bandwidth

    # ------------------------------------------------------------------ rates
    @property
    def hbm_bandwidth(self) -> float:
        """HBM bytes/s (the HBM level's bandwidth)."""
        return self.level("HBM").bandwidth

    def hbm_values_per_s(self, dtype: str) -> float:
        """HBM bandwidth divided by the bytes per value of ``dtype``."""
        return self.hbm_bandwidth / _dtype(dtype).bytes

    def sfu_rate(self) -> float:
        """Special-function (exp) operations per second over the whole chip."""
        return self.sfu_ops_per_clk_per_sm * self.sms * self.clock_hz

    def _dtype_key(self, dtype: str) -> str:
        return _dtype(dtype).name

    def tensor_rate(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s for ``dtype``; HardwareError if there is no tensor path.

        ``fp32`` maps to the ``tf32`` tensor path (that is what fp32 matmuls use on tensor cores).
        """
        key = self._dtype_key(dtype)
        if key == "fp32" and "fp32" not in self.tensor_flops:
            key = "tf32"
        if key not in self.tensor_flops:
            raise HardwareError(
                f"GPU {self.key!r} has no tensor-core path for {dtype!r}; "
                f"tensor dtypes: {', '.join(sorted(self.tensor_flops))}"
            )
        return float(self.tensor_flops[key])

    def cuda_core_rate(self, dtype: str = "fp32") -> float:
        """Non-tensor (CUDA-core) FLOP/s for ``dtype``; HardwareError if not listed."""
        key = self._dtype_key(dtype)
        if key not in self.cuda_core_flops:
            raise HardwareError(
                f"GPU {self.key!r} has no CUDA-core rate for {dtype!r}; "
                f"known: {', '.join(sorted(self.cuda_core_flops))}"
            )
        return float(self.cuda_core_flops[key])

    def tensor_flops_per_clk_per_sm(self, dtype: str) -> float:
        """tensor_rate / (sms * clock): 4096 FLOP/clk for fp16 on H100 at 1.83 GHz."""
        return self.tensor_rate(dtype) / (self.sms * self.clock_hz)

    def compute_bound_threshold(self, dtype: str) -> float:
        """FLOP per value moved from HBM above which work is compute-bound.

        tensor_rate(dtype) / hbm_values_per_s(dtype): 989.4e12 / (3.35e12 / 2) = 590.7 on H100 fp16.
        """
        return self.tensor_rate(dtype) / self.hbm_values_per_s(dtype)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["levels"] = [dataclasses.asdict(lv) for lv in self.levels]
        d["mma_shapes"] = {k: list(v) for k, v in self.mma_shapes.items()}
        d["tensor_flops"] = dict(self.tensor_flops)
        d["cuda_core_flops"] = dict(self.cuda_core_flops)
        d["measured"] = dict(self.measured)
        d["efficiency"] = {k: dict(v) for k, v in self.efficiency.items()}
        d["sources"] = dict(self.sources)
        return d

    def to_json(self) -> str:
        """The profile as JSON text (round-trips through :meth:`from_json`)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "profile") -> "GPU":
        """A profile from its JSON object (:meth:`to_dict`); HardwareError, naming ``where`` and
        the field, on an unknown or missing key or a value its check refuses. Keys starting with
        ``_`` are comments and ignored."""
        if not isinstance(data, Mapping):
            raise HardwareError(f"{where}: a GPU profile must be a JSON object, got {type(data).__name__}")
        specs = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in data if not (isinstance(k, str) and (k in specs or k.startswith("_")))]
        if unknown:
            raise HardwareError(f"{where}: unknown profile field(s) {', '.join(map(_show, unknown))}; "
                                f"known fields: {', '.join(specs)}")
        required = [n for n, f in specs.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise HardwareError(f"{where}: profile lacks field(s) {', '.join(missing)}")
        kw = {k: v for k, v in data.items() if k in specs}
        levels = kw["levels"]
        if not isinstance(levels, (list, tuple)):
            raise HardwareError(f"{where}: field 'levels' must be a list of level objects, got {_show(levels)}")
        for i, lv in enumerate(levels):
            at = f"{where}: level {i}" + (f" ({lv['name']})" if isinstance(lv, Mapping)
                                          and isinstance(lv.get("name"), str) else "")
            if not isinstance(lv, Mapping):
                raise HardwareError(f"{at} must be an object, got {_show(lv)}")
            odd = [k for k in lv if k not in _LEVEL_FIELDS]
            if odd:
                raise HardwareError(f"{at} has unknown field(s) {', '.join(map(_show, odd))}; "
                                    f"known: {', '.join(_LEVEL_FIELDS)}")
            lmiss = [k for k in _LEVEL_FIELDS if k not in lv]
            if lmiss:
                raise HardwareError(f"{at} lacks field(s) {', '.join(lmiss)}")
            why = _level_problem(lv)
            if why:
                raise HardwareError(f"{at}: {why}")
        why = _profile_problem(kw)
        if why:
            raise HardwareError(f"{where}: {why}")
        # checked: now the stored types (floats for real numbers, tuples for shapes and levels)
        for name, f in specs.items():
            if name in kw and f.metadata["check"] in ("positive", "non_negative", "fraction"):
                kw[name] = float(kw[name])
        kw["levels"] = tuple(Level(**{**lv, **{k: None if lv[k] is None else float(lv[k])
                                               for k in ("capacity_bytes", "per_block_bytes", "bandwidth")}})
                             for lv in levels)
        for name in ("tensor_flops", "cuda_core_flops", "measured"):
            if name in kw:
                kw[name] = {k: float(v) for k, v in kw[name].items()}
        if "mma_shapes" in kw:
            kw["mma_shapes"] = {k: tuple(v) for k, v in kw["mma_shapes"].items()}
        if "efficiency" in kw:
            kw["efficiency"] = {f: {k: float(v) for k, v in fr.items()} for f, fr in kw["efficiency"].items()}
        if "sources" in kw:
            kw["sources"] = dict(kw["sources"])
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str, where: str = "profile") -> "GPU":
        """Parse a profile written by :meth:`to_json`; HardwareError on anything malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HardwareError(f"{where}: not valid JSON ({e})") from None
        except RecursionError:
            raise HardwareError(f"{where}: not valid JSON (nested too deeply)") from None
        except ValueError as e:  # e.g. an integer of more digits than Python converts
            raise HardwareError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(data, where)

    # ------------------------------------------------------------------ overrides
    def with_overrides(self, **measured: Any) -> "GPU":
        """A copy with measured values replacing datasheet ones.

        Accepted keys:
          * any GPU field (``clock_hz``, ``source``, ...); the dict fields ``tensor_flops``,
            ``cuda_core_flops``, ``mma_shapes`` and ``measured`` are MERGED into the existing dict;
          * ``<level>_bandwidth``, ``<level>_capacity_bytes``, ``<level>_per_block_bytes``
            (level name case-insensitive, e.g. ``hbm_bandwidth=4.22e12``): that level's field,
            with its ``assumption`` set to say it was measured (``<level>_assumption`` sets it);
          * ``tensor_<dtype>`` / ``cuda_<dtype>`` (e.g. ``tensor_bf16=791e12``): one rate;
          * ``sfu_rate``: exp/s for the whole chip, stored as sfu_ops_per_clk_per_sm;
          * ``efficiency``: calibrated per-family fractions, merged per family;
          * ``sources``: where numbers come from ({field: line}), merged.
        A new fp16/bf16 tensor rate rescales ``mma_sync_fraction`` (unless given) so that the
        mma.sync path keeps its absolute rate. Unknown keys raise HardwareError.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        kw: dict[str, Any] = {}
        level_updates: dict[str, dict[str, Any]] = {}
        tensor = dict(self.tensor_flops)
        cuda = dict(self.cuda_core_flops)
        shapes = dict(self.mma_shapes)
        meas = dict(self.measured)
        eff = {k: dict(v) for k, v in self.efficiency.items()}
        srcs = dict(self.sources)
        level_names = {n.upper(): n for n in self.level_names()}
        for key, value in measured.items():
            low = key.lower()
            if key == "tensor_flops":
                tensor.update({_dtype(k).name: _num(v, f"tensor_flops[{k!r}]") for k, v in _table(value, key).items()})
            elif key == "cuda_core_flops":
                cuda.update({_dtype(k).name: _num(v, f"cuda_core_flops[{k!r}]") for k, v in _table(value, key).items()})
            elif key == "mma_shapes":
                shapes.update({k: tuple(v) if isinstance(v, list) else v for k, v in _table(value, key).items()})
            elif key == "measured":
                meas.update({k: _num(v, f"measured[{k!r}]") for k, v in _table(value, key).items()})
            elif key == "efficiency":
                eff.update({f: dict(_table(fr, f"efficiency[{f!r}]")) for f, fr in _table(value, key).items()})
            elif key == "sources":
                srcs.update(_table(value, key))
            elif key == "levels":
                kw["levels"] = tuple(value) if isinstance(value, (list, tuple)) else value
            elif key in fields:
                kw[key] = value
            elif low == "sfu_rate":
                kw["sfu_ops_per_clk_per_sm"] = _num(value, key) / (self.sms * self.clock_hz)
            elif low.startswith("tensor_"):
                tensor[_dtype(low[len("tensor_"):]).name] = _num(value, key)
            elif low.startswith("cuda_"):
                cuda[_dtype(low[len("cuda_"):]).name] = _num(value, key)
            else:
                for attr in ("bandwidth", "capacity_bytes", "per_block_bytes", "assumption"):
                    suffix = "_" + attr
                    if low.endswith(suffix) and low[: -len(suffix)].upper() in level_names:
                        lname = level_names[low[: -len(suffix)].upper()]
                        level_updates.setdefault(lname, {})[attr] = (
                            value if attr == "assumption" or value is None else _num(value, key))
                        break
                else:
                    raise HardwareError(
                        f"with_overrides: unknown key {key!r}; use a GPU field, "
                        f"<level>_bandwidth / _capacity_bytes / _per_block_bytes / _assumption "
                        f"(levels: {', '.join(self.level_names())}), tensor_<dtype>, cuda_<dtype> or sfu_rate"
                    )
        levels = kw.pop("levels", self.levels)
        if level_updates:
            new_levels = []
            for lv in levels:
                upd = level_updates.get(lv.name)
                if upd:
                    if "assumption" not in upd:
                        changed = ", ".join(f"{k}={v:.4g}" if _real(v) is not None else f"{k}={_show(v)}"
                                            for k, v in upd.items())
                        upd = {**upd, "assumption": f"measured ({changed}); was: {lv.assumption}"}
                    lv = dataclasses.replace(lv, **upd)
                new_levels.append(lv)
            levels = tuple(new_levels)
        if "mma_sync_fraction" not in kw and self.mma_sync_fraction < 1:
            # the mma.sync ceiling is a hardware fact of its own: a measured full-path rate
            # (e.g. cuBLAS through wgmma) replacing the datasheet one must not move it
            for dt in ("bf16", "fp16"):
                if (dt in tensor and dt in self.tensor_flops and tensor[dt] != self.tensor_flops[dt]
                        and _positive(tensor[dt])):
                    kw["mma_sync_fraction"] = min(1.0, self.mma_sync_fraction * self.tensor_flops[dt] / tensor[dt])
                    break
        kw.update(levels=levels, tensor_flops=tensor, cuda_core_flops=cuda,
                  mma_shapes=shapes, measured=meas, efficiency=eff, sources=srcs)
        return dataclasses.replace(self, **kw)  # checked by __post_init__

    def __str__(self) -> str:
        return f"{self.name} ({self.key}, {self.arch}, {self.sms} SMs, {self.source})"


def _num(value: object, what: str) -> float:
    """``value`` as a float for :meth:`GPU.with_overrides`; HardwareError if it is no number."""
    x = _real(value)
    if x is None:
        raise HardwareError(f"with_overrides: {what} must be a number, got {_show(value)}")
    return x


def _table(value: object, what: str) -> Mapping:
    """``value`` if it is a mapping (for :meth:`GPU.with_overrides`), else HardwareError."""
    if not isinstance(value, Mapping):
        raise HardwareError(f"with_overrides: {what} must be a mapping, got {_show(value)}")
    return value


# ---------------------------------------------------------------------- the registry

_PROFILE_FILES = {
    "a100-40gb": "a100-40gb.json",
    "a100-80gb": "a100-80gb.json",
    "h100": "h100-sxm.json",
    "h200": "h200.json",
}

_ALIASES = {
    "a100": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "a100-sxm4": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-sxm4-40gb": "a100-40gb",
    "a100-40g": "a100-40gb",
    "h100-sxm": "h100",
    "h100-sxm5": "h100",
    "h100-sxm5-80gb": "h100",
    "h100-80gb": "h100",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
}

_CACHE: dict[str, GPU] = {}
#: Profiles that are not the built-in of their key (a profile file, a calibrated copy), by the key
#: their plans carry: a plan names its GPU by key, and the report, the explanation and the method's
#: narration look it up again (:func:`registered`).
_LOADED: dict[str, GPU] = {}


def list_gpus() -> list[str]:
    """The canonical keys of the built-in profiles (aliases: :func:`gpu_aliases`)."""
    return sorted(_PROFILE_FILES)


def gpu_aliases() -> dict[str, str]:
    """Every accepted built-in name mapped to its canonical key."""
    out = {k: k for k in _PROFILE_FILES}
    out.update(_ALIASES)
    return dict(sorted(out.items()))


def _load_builtin(key: str) -> GPU:
    if key not in _CACHE:
        fname = _PROFILE_FILES[key]
        try:
            text = resources.files("napkin.perfmodel").joinpath("profiles").joinpath(fname).read_text("utf-8")
        except (FileNotFoundError, OSError) as e:
            raise HardwareError(f"built-in profile {fname} is missing from the package: {e}") from None
        _CACHE[key] = GPU.from_json(text, where=f"profiles/{fname}")
    return _CACHE[key]


def gpu_ref(gpu: GPU) -> str:
    """The name a plan calls ``gpu`` by, which :func:`get_gpu` gives back: a built-in profile's key;
    any other profile's own key, or, where that key already names another profile (a file or a
    calibrated copy of ``h200`` keeps the key ``h200``), the key with its content's digest appended.
    A plan made on a profile file then reports that file's numbers, not the built-in's of its key.

    >>> import dataclasses
    >>> h200 = get_gpu("h200")
    >>> gpu_ref(h200)
    'h200'
    >>> slow = dataclasses.replace(h200, memory_latency_s=5e-6)
    >>> ref = gpu_ref(slow)
    >>> ref.startswith("h200-") and get_gpu(ref) is slow and gpu_ref(slow) == ref
    True
    """
    key = _ALIASES.get(gpu.key.lower(), gpu.key.lower())
    if key in _PROFILE_FILES and _load_builtin(key) == gpu:
        return key
    have = _LOADED.get(gpu.key)
    if have is None and key not in _PROFILE_FILES:
        _LOADED[gpu.key] = gpu
        return gpu.key
    if have == gpu:
        return gpu.key
    ref = f"{gpu.key}-{hashlib.sha256(repr(gpu).encode()).hexdigest()[:10]}"
    _LOADED.setdefault(ref, gpu)
    return ref


def get_gpu(name_or_path: str | Path) -> GPU:
    """A GPU by built-in name (case-insensitive: a100, a100-40gb, a100-80gb, h100, h100-sxm, h200),
    by the name a plan calls a profile by (:func:`gpu_ref`) or by the path of a profile JSON file.
    Unknown names raise HardwareError listing the keys."""
    if isinstance(name_or_path, GPU):
        gpu_ref(name_or_path)
        return name_or_path
    text = str(name_or_path).strip()
    if text in _LOADED:
        return _LOADED[text]
    key = text.lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in _PROFILE_FILES:
        return _load_builtin(key)
    try:
        p = Path(text).expanduser()
    except RuntimeError:  # ~user whose home directory is unknown
        p = Path(text)
    try:
        is_file, exists = p.is_file(), p.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        is_file = exists = False
    if p.suffix.lower() == ".json" or is_file:
        if not is_file:
            raise HardwareError(f"GPU profile file {text!r} " + ("is not a file" if exists else "does not exist"))
        try:
            content = p.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise HardwareError(f"cannot read GPU profile {text!r}: {e}") from None
        gpu = GPU.from_json(content, where=str(p))
        gpu_ref(gpu)  # a plan made on it (or read from the plan cache) names it so
        return gpu
    names = ", ".join(gpu_aliases())
    raise HardwareError(f"unknown GPU {text!r}; known GPUs: {names} (or a path to a profile .json)")


def match_device_name(device_name: str) -> str:
    """The built-in key for a CUDA device name such as ``torch.cuda.get_device_name()``.

    >>> match_device_name("NVIDIA A100-SXM4-40GB"), match_device_name("NVIDIA H100 80GB HBM3")
    ('a100-40gb', 'h100')
    """
    s = device_name.lower()
    if "h200" in s:
        return "h200"
    if "h100" in s:
        return "h100"
    if "a100" in s:
        return "a100-40gb" if "40gb" in s.replace(" ", "") else "a100-80gb"
    raise HardwareError(
        f"no built-in profile matches device {device_name!r}; known GPUs: {', '.join(list_gpus())}"
    )
