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

>>> h = get_gpu("H100")
>>> round(h.compute_bound_threshold("fp16"), 1)
590.7
>>> h.level("SMEM").per_block_bytes / 1024
227.0
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..dtypes import dtype as _dtype
from ..errors import HardwareError

__all__ = [
    "Level",
    "GPU",
    "get_gpu",
    "list_gpus",
    "gpu_aliases",
    "match_device_name",
    "LEVEL_ORDER",
    "FIELD_SOURCES",
]

#: The canonical level names, top (slowest, largest) to bottom.
LEVEL_ORDER = ("HBM", "L2", "SMEM", "RF", "TC")


@dataclass(frozen=True)
class Level:
    """One level of the memory hierarchy.

    name:            "HBM", "L2", "SMEM", "RF" or "TC".
    capacity_bytes:  HBM: device memory; L2: total; SMEM: per SM; RF: per SM;
                     TC: operand registers (None = unbounded).
    per_block_bytes: the most one thread block may use (SMEM: 227 KiB on Hopper, 163 KiB on
                     A100; RF: 64K registers x 4 B, the CUDA per-block limit); None where no
                     per-block limit applies.
    instances:       1 for HBM and L2, the number of SMs for SMEM, RF and TC.
    bandwidth:       bytes/s this level delivers to (or accepts from) the level below it,
                     aggregated over all instances (see the module docstring).
    assumption:      one line saying where the numbers come from (datasheet / estimate / calibrated).
    """

    name: str
    capacity_bytes: float | None
    per_block_bytes: float | None
    instances: int
    bandwidth: float
    assumption: str

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
    "shuffle_latency_clk": "estimate: one dependent shfl.sync stage and the add/max consuming it "
                           "(~25-35 clk on Volta-to-Hopper SMs in published microbenchmarks)",
    "sync_latency_clk": "estimate: the cross-warp stage of a block-wide reduction: st.shared + "
                        "__syncthreads + ld.shared (~2 x 30 clk shared-memory latency + ~20 clk barrier)",
    "launch_overhead_s": "estimate: back-to-back kernel launches on one stream cost a few microseconds each",
    "efficiency": "calibrated per family (napkin.bench.calibration); empty on datasheet profiles",
}


@dataclass(frozen=True, kw_only=True)
class GPU:
    """A GPU as the performance model sees it. Build with :func:`get_gpu`.

    Fields are keyword-only. ``tensor_flops`` holds dense tensor-core FLOP/s per dtype (``fp32`` is
    not a tensor dtype: fp32 inputs go through ``tf32``); ``cuda_core_flops`` the non-tensor
    FLOP/s. ``sfu_ops_per_clk_per_sm`` may be fractional after calibration.
    """

    key: str
    name: str
    arch: str
    sms: int
    clock_hz: float
    levels: tuple[Level, ...]
    tensor_flops: dict[str, float]
    cuda_core_flops: dict[str, float]
    sfu_ops_per_clk_per_sm: float = 16
    regs_per_sm_bytes: int = 65536 * 4
    max_warps_per_sm: int = 64
    max_threads_per_block: int = 1024
    max_regs_per_thread: int = 255
    mma_shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    has_wgmma: bool = False
    has_tma: bool = False
    source: str = "datasheet"
    # Extras beyond the core API (CUDA occupancy-calculator constants and bookkeeping).
    max_blocks_per_sm: int = 32
    reg_alloc_unit: int = 256          # registers per warp are allocated in multiples of this
    smem_alloc_unit: int = 128         # bytes; shared memory per block is rounded up to this
    smem_reserved_per_block: int = 1024  # bytes the driver reserves per block (sm_80 and later)
    measured: dict[str, float] = field(default_factory=dict)  # raw calibration results
    notes: str = ""
    # What napkin's kernels reach beyond the datasheet (see the performance model's predict module).
    #: Fraction of ``tensor_flops`` the warp-level ``mma.sync`` path reaches. 1.0 where mma.sync is
    #: the full tensor path (Ampere); on Hopper the datasheet rate needs wgmma, and a pure
    #: mma.sync m16n8k16 bf16 loop reached 647 of 989.4 TFLOP/s on one H200 (the profile's notes).
    mma_sync_fraction: float = 1.0
    #: Latency of an HBM load under load, seconds: the Little's-law floor of a kernel with few
    #: bytes in flight, and the pipeline fill every block pays before its first chunk or row
    #: arrives (estimate; calibratable).
    memory_latency_s: float = 800e-9
    #: Fixed cost of one step of a streamed loop, SM clock cycles, that the block cannot overlap
    #: with its own work (barrier, dependent operand-load -> mma restart, loop and copy issue);
    #: co-resident blocks hide it from each other (estimate, see :data:`FIELD_SOURCES`).
    step_overhead_clk: float = 100.0
    #: Latency of one dependent warp-shuffle stage of a cross-thread reduction, clocks (a row
    #: reduced by T <= 32 threads takes log2(T) stages; estimate).
    shuffle_latency_clk: float = 30.0
    #: Latency of the cross-warp stage of a reduction that spans several warps (shared-memory
    #: store, barrier, load), clocks (estimate).
    sync_latency_clk: float = 80.0
    #: Fixed cost of one kernel launch, seconds, added to every kernel's time (estimate).
    launch_overhead_s: float = 3e-6
    #: Where each non-datasheet field's number comes from ({field: one line}); fields not listed
    #: fall back to :data:`FIELD_SOURCES` (see :meth:`source_of`).
    sources: dict[str, str] = field(default_factory=dict)
    #: Calibrated efficiency fractions per code-generation family ({"attention": {"tensor": 0.9}}),
    #: multiplying :class:`~napkin.perfmodel.roofline.Efficiency` for that family's kernels
    #: (written by :mod:`napkin.bench.calibration`; empty on datasheet profiles).
    efficiency: dict[str, dict[str, float]] = field(default_factory=dict)

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
        if not isinstance(data, dict):
            raise HardwareError(f"{where}: a GPU profile must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in data if k not in known and not k.startswith("_"))
        if unknown:
            raise HardwareError(f"{where}: unknown profile field(s) {', '.join(unknown)}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise HardwareError(f"{where}: profile lacks field(s) {', '.join(missing)}")
        kw = {k: v for k, v in data.items() if k in known}
        try:
            levels = []
            for i, lv in enumerate(kw["levels"]):
                if not isinstance(lv, dict):
                    raise HardwareError(f"{where}: level #{i} is not an object")
                lmiss = [k for k in _LEVEL_FIELDS if k not in lv]
                if lmiss:
                    raise HardwareError(f"{where}: level #{i} lacks field(s) {', '.join(lmiss)}")
                levels.append(Level(
                    name=str(lv["name"]),
                    capacity_bytes=None if lv["capacity_bytes"] is None else float(lv["capacity_bytes"]),
                    per_block_bytes=None if lv["per_block_bytes"] is None else float(lv["per_block_bytes"]),
                    instances=int(lv["instances"]),
                    bandwidth=float(lv["bandwidth"]),
                    assumption=str(lv["assumption"]),
                ))
            kw["levels"] = tuple(levels)
            kw["tensor_flops"] = {str(k): float(v) for k, v in dict(kw["tensor_flops"]).items()}
            kw["cuda_core_flops"] = {str(k): float(v) for k, v in dict(kw["cuda_core_flops"]).items()}
            if "mma_shapes" in kw:
                shapes = {}
                for k, v in dict(kw["mma_shapes"]).items():
                    t = tuple(int(x) for x in v)
                    if len(t) != 3:
                        raise HardwareError(f"{where}: mma shape for {k!r} must be [m, n, k], got {v!r}")
                    shapes[str(k)] = t
                kw["mma_shapes"] = shapes
            if "measured" in kw:
                kw["measured"] = {str(k): float(v) for k, v in dict(kw["measured"]).items()}
            if "efficiency" in kw:
                kw["efficiency"] = {str(f): {str(k): float(v) for k, v in dict(fr).items()}
                                    for f, fr in dict(kw["efficiency"]).items()}
            for k in ("sms", "regs_per_sm_bytes", "max_warps_per_sm", "max_threads_per_block",
                      "max_regs_per_thread", "max_blocks_per_sm", "reg_alloc_unit",
                      "smem_alloc_unit", "smem_reserved_per_block"):
                if k in kw:
                    kw[k] = int(kw[k])
            if "sources" in kw:
                kw["sources"] = {str(k): str(v) for k, v in dict(kw["sources"]).items()}
            for k in ("clock_hz", "sfu_ops_per_clk_per_sm", "mma_sync_fraction", "memory_latency_s",
                      "step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk", "launch_overhead_s"):
                if k in kw:
                    kw[k] = float(kw[k])
            for k in ("has_wgmma", "has_tma"):
                if k in kw and not isinstance(kw[k], bool):
                    raise HardwareError(f"{where}: field {k!r} must be true or false")
            gpu = cls(**kw)
        except HardwareError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise HardwareError(f"{where}: malformed GPU profile: {e}") from None
        gpu._validate(where)
        return gpu

    @classmethod
    def from_json(cls, text: str, where: str = "profile") -> "GPU":
        """Parse a profile written by :meth:`to_json`; HardwareError on anything malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HardwareError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(data, where)

    def _validate(self, where: str) -> None:
        names = [lv.name for lv in self.levels]
        if not names:
            raise HardwareError(f"{where}: profile has no memory levels")
        if len(set(n.upper() for n in names)) != len(names):
            raise HardwareError(f"{where}: duplicate level names {names}")
        if self.sms <= 0 or self.clock_hz <= 0:
            raise HardwareError(f"{where}: sms and clock_hz must be positive")
        for lv in self.levels:
            if not (lv.bandwidth > 0):
                raise HardwareError(f"{where}: level {lv.name} must have a positive bandwidth")
            if lv.instances <= 0:
                raise HardwareError(f"{where}: level {lv.name} must have at least one instance")
            for v in (lv.capacity_bytes, lv.per_block_bytes):
                if v is not None and not (v > 0):
                    raise HardwareError(f"{where}: level {lv.name} has a non-positive capacity")
        for table in (self.tensor_flops, self.cuda_core_flops):
            for k, v in table.items():
                _dtype(k)  # unknown dtype names raise HardwareError
                if not (v > 0):
                    raise HardwareError(f"{where}: rate for {k!r} must be positive")
        if "HBM" not in [n.upper() for n in names]:
            raise HardwareError(f"{where}: profile needs an HBM level")
        if not (0 < self.mma_sync_fraction <= 1):
            raise HardwareError(f"{where}: mma_sync_fraction must be in (0, 1], got {self.mma_sync_fraction!r}")
        if not (self.memory_latency_s > 0):
            raise HardwareError(f"{where}: memory_latency_s must be positive")
        for k in ("step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk", "launch_overhead_s"):
            if not (getattr(self, k) >= 0):
                raise HardwareError(f"{where}: {k} must be non-negative, got {getattr(self, k)!r}")
        for fam, fr in self.efficiency.items():
            for k, v in fr.items():
                if not (0 < v <= 1.5):
                    raise HardwareError(f"{where}: efficiency[{fam!r}][{k!r}] must be in (0, 1.5], got {v!r}")

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
                tensor.update({_dtype(k).name: float(v) for k, v in dict(value).items()})
            elif key == "cuda_core_flops":
                cuda.update({_dtype(k).name: float(v) for k, v in dict(value).items()})
            elif key == "mma_shapes":
                shapes.update({k: tuple(int(x) for x in v) for k, v in dict(value).items()})
            elif key == "measured":
                meas.update({k: float(v) for k, v in dict(value).items()})
            elif key == "efficiency":
                eff.update({str(f): {str(k): float(v) for k, v in dict(fr).items()} for f, fr in dict(value).items()})
            elif key == "sources":
                srcs.update({str(k): str(v) for k, v in dict(value).items()})
            elif key == "levels":
                kw["levels"] = tuple(value)
            elif key in fields:
                kw[key] = value
            elif low == "sfu_rate":
                kw["sfu_ops_per_clk_per_sm"] = float(value) / (self.sms * self.clock_hz)
            elif low.startswith("tensor_"):
                tensor[_dtype(low[len("tensor_"):]).name] = float(value)
            elif low.startswith("cuda_"):
                cuda[_dtype(low[len("cuda_"):]).name] = float(value)
            else:
                for attr in ("bandwidth", "capacity_bytes", "per_block_bytes", "assumption"):
                    suffix = "_" + attr
                    if low.endswith(suffix) and low[: -len(suffix)].upper() in level_names:
                        lname = level_names[low[: -len(suffix)].upper()]
                        level_updates.setdefault(lname, {})[attr] = (
                            value if attr == "assumption" or value is None else float(value))
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
                        changed = ", ".join(f"{k}={v:.4g}" for k, v in upd.items())
                        upd = {**upd, "assumption": f"measured ({changed}); was: {lv.assumption}"}
                    lv = dataclasses.replace(lv, **upd)
                new_levels.append(lv)
            levels = tuple(new_levels)
        if "mma_sync_fraction" not in kw and self.mma_sync_fraction < 1:
            # the mma.sync ceiling is a hardware fact of its own: a measured full-path rate
            # (e.g. cuBLAS through wgmma) replacing the datasheet one must not move it
            for dt in ("bf16", "fp16"):
                if dt in tensor and dt in self.tensor_flops and tensor[dt] != self.tensor_flops[dt]:
                    kw["mma_sync_fraction"] = min(1.0, self.mma_sync_fraction * self.tensor_flops[dt] / tensor[dt])
                    break
        kw.update(levels=levels, tensor_flops=tensor, cuda_core_flops=cuda,
                  mma_shapes=shapes, measured=meas, efficiency=eff, sources=srcs)
        try:
            gpu = dataclasses.replace(self, **kw)
        except (TypeError, ValueError) as e:
            raise HardwareError(f"with_overrides: {e}") from None
        gpu._validate("with_overrides")
        return gpu

    def __str__(self) -> str:
        return f"{self.name} ({self.key}, {self.arch}, {self.sms} SMs, {self.source})"


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


def get_gpu(name_or_path: str | Path) -> GPU:
    """A GPU by built-in name (case-insensitive: a100, a100-40gb, a100-80gb, h100, h100-sxm, h200)
    or by the path of a profile JSON file. Unknown names raise HardwareError listing the keys."""
    if isinstance(name_or_path, GPU):
        return name_or_path
    text = str(name_or_path).strip()
    key = text.lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in _PROFILE_FILES:
        return _load_builtin(key)
    p = Path(text).expanduser()
    if p.suffix.lower() == ".json" or p.is_file():
        if not p.is_file():
            raise HardwareError(f"GPU profile file {text!r} does not exist")
        try:
            content = p.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise HardwareError(f"cannot read GPU profile {text!r}: {e}") from None
        return GPU.from_json(content, where=str(p))
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
