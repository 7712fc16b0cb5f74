"""Runtime prediction primitives: a roofline over every level and compute unit, with waves.

A :class:`Work` says how much a kernel computes (tensor-core FLOPs, CUDA-core FLOPs, SFU
operations) and how many bytes cross each memory level; :func:`predict` turns it into seconds
on a :class:`~napkin.perfmodel.hardware.GPU`. Every assumption is a visible, overridable
parameter:

* each term's time is its amount over the profile's rate times an :class:`Efficiency` fraction;
  tensor-core work issued through warp-level ``mma.sync`` (``tensor_path="mma.sync"``) runs at
  the profile's ``mma_sync_fraction`` of its tensor rate (on Hopper the datasheet rate needs
  wgmma);
* compute units overlap each other and transfers overlap compute (``Efficiency.overlap_*``), so
  the body time is the largest term, whose name is the ``bound``; a kernel that runs them in one
  instruction stream says so (``overlap_compute=False``: tensor, CUDA-core and SFU times add;
  ``overlap_operands=False``: the SMEM-to-register operand loads add to the compute time);
* wave quantisation: ``blocks`` spread over ``sms * blocks_per_sm`` slots take
  ``ceil(blocks / slots)`` waves where the even spread assumed by the rates would take
  ``blocks / slots``; the body time is scaled by their ratio;
* a fixed launch overhead (``launch_overhead_s``) is added.

>>> from napkin.perfmodel.hardware import get_gpu
>>> h = get_gpu("h100")
>>> n = 8192
>>> w = Work(flops={"tensor": 2 * n**3}, bytes={"HBM": 3 * n * n * 2}, dtype="fp16")
>>> p = predict(h, w, launch_overhead_s=0)
>>> p.bound, round(p.tflops)
('tensor', 989)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from ..dtypes import dtype as _dtype
from ..errors import HardwareError
from .hardware import GPU

__all__ = ["Efficiency", "TYPICAL", "Work", "Prediction", "predict", "with_efficiency", "LAUNCH_OVERHEAD_S",
           "TENSOR_PATHS"]

#: Default fixed cost of one kernel launch, seconds (back-to-back launches on one stream cost
#: a few microseconds each; pass ``launch_overhead_s`` to predict to change it).
LAUNCH_OVERHEAD_S = 3e-6

_COMPUTE_KINDS = ("tensor", "cuda", "sfu")
_FRACTIONS = ("tensor", "cuda", "sfu", "hbm", "l2", "smem", "rf")

#: How tensor-core work is issued: "peak" reaches the profile's tensor rate (the datasheet's path:
#: wgmma on Hopper, mma.sync on Ampere); "mma.sync" reaches ``gpu.mma_sync_fraction`` of it.
TENSOR_PATHS = ("peak", "mma.sync")


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the profile's peak rates (calibratable; 1.0 = the profile's number).

    tensor: fraction of ``gpu.tensor_rate(dtype)`` a kernel's tensor-core work reaches
            (instruction issue, pipeline bubbles, fragment shuffles).
    cuda:   fraction of ``gpu.cuda_core_rate(cuda_dtype)`` for CUDA-core FLOPs.
    sfu:    fraction of ``gpu.sfu_rate()`` for exp and other special functions.
    hbm:    fraction of the HBM bandwidth reached (DRAM refresh, page misses, read/write turnaround).
    l2, smem, rf: the same for those levels' bandwidths (bank conflicts, crossbar contention).
    overlap_compute: tensor, CUDA-core and SFU work run concurrently (time = max of the three);
            False adds them (no warp specialisation, no ping-pong scheduling).
    overlap_memory: transfers overlap compute (time = max of compute and every level); False adds
            the compute time and the slowest level's time (no pipelining).
    overlap_operands: the SMEM level's transfers (operands loaded from shared memory into
            registers, ``ldmatrix``) overlap the compute that consumes them; False adds the SMEM
            time to the compute time: the warps issue their operand loads and their mma from one
            instruction stream and too few warps are resident to hide either (what ncu shows for
            napkin's mma.sync kernels on an H200: 2 warps per scheduler, 0.37 issued instructions
            per cycle, stalls on fixed-latency dependencies).

    The defaults (all 1.0, full overlap) are the napkin model: it predicts what the hardware
    numbers allow. With a datasheet profile, :data:`TYPICAL` gives fractions measured on one H200;
    with a calibrated profile (whose rates are already measured ones) keep 1.0.
    """

    tensor: float = 1.0
    cuda: float = 1.0
    sfu: float = 1.0
    hbm: float = 1.0
    l2: float = 1.0
    smem: float = 1.0
    rf: float = 1.0
    overlap_compute: bool = True
    overlap_memory: bool = True
    overlap_operands: bool = True

    def __post_init__(self) -> None:
        for k in ("tensor", "cuda", "sfu", "hbm", "l2", "smem", "rf"):
            v = getattr(self, k)
            if not (0 < v <= 1.5):
                raise HardwareError(f"Efficiency.{k} must be a fraction in (0, 1.5], got {v!r}")

    def compute(self, kind: str) -> float:
        """The fraction for a compute kind: "tensor", "cuda" or "sfu"."""
        if kind not in _COMPUTE_KINDS:
            raise HardwareError(f"unknown compute kind {kind!r}; known: {', '.join(_COMPUTE_KINDS)}")
        return getattr(self, kind)

    def level(self, name: str) -> float:
        """The fraction for a memory level by name (1.0 for levels without a field, e.g. TC)."""
        attr = name.lower()
        return getattr(self, attr) if attr in ("hbm", "l2", "smem", "rf") else 1.0

    def scaled(self, factors: Mapping[str, float]) -> "Efficiency":
        """A copy with some fractions multiplied by ``factors`` ({"tensor": 0.9, "hbm": 0.8}): how
        calibrated per-family factors (``GPU.efficiency``) apply on top of these fractions."""
        changes = {}
        for k, f in factors.items():
            if k not in _FRACTIONS:
                raise HardwareError(f"unknown efficiency fraction {k!r}; known: {', '.join(_FRACTIONS)}")
            changes[k] = getattr(self, k) * float(f)
        return replace(self, **changes) if changes else self


#: Fractions measured on one H200 against its datasheet (DESIGN §4.5): cuBLAS bf16 GEMM 8192^3
#: 791 / 989.4 TFLOP/s, device-to-device copy 4.22 / 4.8 TB/s.
TYPICAL = Efficiency(tensor=791 / 989.4, hbm=4.22 / 4.8)


@dataclass(frozen=True)
class Work:
    """What a kernel does, in totals over the whole launch.

    flops: {"tensor": ..., "cuda": ..., "sfu": ...}; tensor FLOPs run at ``dtype``'s rate;
           extra keys ``"tensor:<dtype>"`` put some tensor FLOPs at another dtype (e.g. fp8 QK
           and fp16 PV in one kernel); "sfu" counts special-function operations (one exp = 1).
    bytes: bytes served by each level, e.g. {"HBM": ..., "L2": ..., "SMEM": ...}: reads from and
           writes to that level, timed against that level's bandwidth.
    dtype: the tensor-core dtype; cuda_dtype: the CUDA-core dtype.
    reported_flops: the FLOP count TFLOP/s is reported against (DESIGN §6 conventions, e.g.
           4·B·H·N_q·N_k·d for attention); default tensor + CUDA-core FLOPs.
    """

    flops: Mapping[str, float] = field(default_factory=dict)
    bytes: Mapping[str, float] = field(default_factory=dict)
    dtype: str = "fp16"
    cuda_dtype: str = "fp32"
    reported_flops: float | None = None

    def __post_init__(self) -> None:
        for k, v in self.flops.items():
            base = k.split(":", 1)[0]
            if base not in _COMPUTE_KINDS or (":" in k and base != "tensor"):
                raise HardwareError(
                    f"Work.flops key {k!r}: use 'tensor', 'tensor:<dtype>', 'cuda' or 'sfu'")
            if ":" in k:
                _dtype(k.split(":", 1)[1])
            if v < 0:
                raise HardwareError(f"Work.flops[{k!r}] is negative")
        for k, v in self.bytes.items():
            if v < 0:
                raise HardwareError(f"Work.bytes[{k!r}] is negative")
        _dtype(self.dtype)
        _dtype(self.cuda_dtype)

    @property
    def total_flops(self) -> float:
        """Tensor plus CUDA-core FLOPs (SFU operations are not counted as FLOPs)."""
        return float(sum(v for k, v in self.flops.items() if not k.startswith("sfu")))

    @property
    def flops_reported(self) -> float:
        return self.total_flops if self.reported_flops is None else float(self.reported_flops)

    def __add__(self, other: "Work") -> "Work":
        """Two pieces of work in one kernel (dtypes must agree)."""
        if not isinstance(other, Work):
            return NotImplemented
        if (self.dtype, self.cuda_dtype) != (other.dtype, other.cuda_dtype):
            raise HardwareError("cannot add Work with different dtypes; use 'tensor:<dtype>' keys")
        fl = dict(self.flops)
        for k, v in other.flops.items():
            fl[k] = fl.get(k, 0.0) + v
        by = dict(self.bytes)
        for k, v in other.bytes.items():
            by[k] = by.get(k, 0.0) + v
        rep = None
        if self.reported_flops is not None or other.reported_flops is not None:
            rep = self.flops_reported + other.flops_reported
        return Work(flops=fl, bytes=by, dtype=self.dtype, cuda_dtype=self.cuda_dtype, reported_flops=rep)


@dataclass(frozen=True)
class Prediction:
    """A predicted runtime with every term that went into it."""

    gpu: str
    compute_s: dict[str, float]        # per compute kind ("tensor", "cuda", "sfu")
    transfer_s: dict[str, float]       # per memory level
    compute_time_s: float              # max (or sum) of compute_s
    memory_time_s: float               # the slowest level
    bound: str                         # the largest single term: "tensor", "HBM", ...
    body_s: float                      # before wave quantisation and launch overhead
    blocks: int | None
    blocks_per_sm: int | None
    waves: int | None                  # ceil(blocks / (sms * blocks_per_sm))
    ideal_waves: float | None          # blocks / (sms * blocks_per_sm)
    wave_factor: float                 # waves / ideal_waves (1.0 without blocks)
    launch_overhead_s: float
    seconds: float                     # body_s * wave_factor + launch_overhead_s
    flops: float                       # the reported FLOP count
    hbm_bytes: float
    tflops: float                      # flops / seconds / 1e12
    gbps: float                        # HBM bytes / seconds / 1e9
    efficiency: Efficiency
    tensor_path: str = "peak"          # "mma.sync": the tensor term ran at gpu.mma_sync_fraction

    @property
    def terms(self) -> dict[str, float]:
        """Every compute and transfer term, seconds."""
        return {**self.compute_s, **self.transfer_s}

    @property
    def us(self) -> float:
        return self.seconds * 1e6

    def __str__(self) -> str:
        terms = ", ".join(f"{k} {v * 1e6:.2f}" for k, v in self.terms.items() if v > 0)
        waves = ""
        if self.waves is not None:
            waves = f", {self.waves} wave(s) vs {self.ideal_waves:.2f} ideal (x{self.wave_factor:.3f})"
        return (f"{self.seconds * 1e6:.2f} us on {self.gpu} ({self.bound}-bound; terms us: {terms}"
                f"{waves}; launch {self.launch_overhead_s * 1e6:.1f} us) = "
                f"{self.tflops:.1f} TFLOP/s, {self.gbps:.0f} GB/s")


def predict(
    gpu: GPU,
    work: Work,
    blocks: int | None = None,
    blocks_per_sm: int | None = None,
    efficiency: Efficiency = Efficiency(),
    launch_overhead_s: float = LAUNCH_OVERHEAD_S,
    *,
    tensor_path: str = "peak",
) -> Prediction:
    """Predicted runtime of ``work`` on ``gpu`` (see the module docstring for the assumptions).

    ``blocks`` (thread blocks launched) and ``blocks_per_sm`` (resident at once, e.g. from
    :func:`~napkin.perfmodel.occupancy.occupancy`; default 1) turn on wave quantisation.
    ``tensor_path`` (:data:`TENSOR_PATHS`) says how the tensor-core work is issued.
    """
    if launch_overhead_s < 0:
        raise HardwareError("launch_overhead_s must be non-negative")
    if tensor_path not in TENSOR_PATHS:
        raise HardwareError(f"unknown tensor path {tensor_path!r}; known: {', '.join(TENSOR_PATHS)}")
    path = float(getattr(gpu, "mma_sync_fraction", 1.0)) if tensor_path == "mma.sync" else 1.0
    eff = efficiency
    compute: dict[str, float] = {"tensor": 0.0, "cuda": 0.0, "sfu": 0.0}
    for k, v in work.flops.items():
        if v == 0:
            continue
        if k.startswith("tensor"):
            dt = k.split(":", 1)[1] if ":" in k else work.dtype
            compute["tensor"] += v / (gpu.tensor_rate(dt) * path * eff.tensor)
        elif k == "cuda":
            compute["cuda"] += v / (gpu.cuda_core_rate(work.cuda_dtype) * eff.cuda)
        elif k == "sfu":
            compute["sfu"] += v / (gpu.sfu_rate() * eff.sfu)
    transfer: dict[str, float] = {}
    for name, b in work.bytes.items():
        lv = gpu.level(name)  # HardwareError for unknown level names
        transfer[lv.name] = b / (lv.bandwidth * eff.level(lv.name))

    compute_time = max(compute.values()) if eff.overlap_compute else sum(compute.values())
    if not eff.overlap_operands and "SMEM" in transfer:
        compute_time += transfer["SMEM"]
        memory_time = max((v for k, v in transfer.items() if k != "SMEM"), default=0.0)
    else:
        memory_time = max(transfer.values(), default=0.0)
    body = max(compute_time, memory_time) if eff.overlap_memory else compute_time + memory_time
    terms = {**compute, **transfer}
    bound = max(terms, key=lambda k: terms[k]) if any(v > 0 for v in terms.values()) else "none"

    waves = ideal = None
    factor = 1.0
    if blocks is not None:
        if blocks <= 0:
            raise HardwareError(f"blocks must be positive, got {blocks}")
        bps = 1 if blocks_per_sm is None else blocks_per_sm
        if bps <= 0:
            raise HardwareError(
                f"blocks_per_sm must be positive, got {blocks_per_sm} (a block that does not fit an SM?)")
        slots = gpu.sms * bps
        waves = math.ceil(blocks / slots)
        ideal = blocks / slots
        factor = waves / ideal
    elif blocks_per_sm is not None and blocks_per_sm <= 0:
        raise HardwareError(f"blocks_per_sm must be positive, got {blocks_per_sm}")

    seconds = body * factor + launch_overhead_s
    flops = work.flops_reported
    hbm_bytes = float(sum(v for k, v in work.bytes.items() if k.upper() == "HBM"))
    return Prediction(
        gpu=gpu.key, compute_s=compute, transfer_s=transfer, compute_time_s=compute_time,
        memory_time_s=memory_time, bound=bound, body_s=body, blocks=blocks,
        blocks_per_sm=blocks_per_sm if blocks is None else (1 if blocks_per_sm is None else blocks_per_sm),
        waves=waves, ideal_waves=ideal, wave_factor=factor, launch_overhead_s=launch_overhead_s,
        seconds=seconds, flops=flops, hbm_bytes=hbm_bytes,
        tflops=(flops / seconds / 1e12) if seconds > 0 else 0.0,
        gbps=(hbm_bytes / seconds / 1e9) if seconds > 0 else 0.0,
        efficiency=eff, tensor_path=tensor_path,
    )


def with_efficiency(eff: Efficiency, **changes) -> Efficiency:
    """A copy of ``eff`` with some fractions changed (validated)."""
    return replace(eff, **changes)
