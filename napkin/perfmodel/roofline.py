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
* waves are counted per SM and only against the resources an SM owns: the busiest SM runs
  ``ceil(blocks / sms)`` blocks where the even spread assumed by the rates gives it
  ``blocks / sms``, and its co-resident blocks (``blocks_per_sm`` of them) share that SM's
  compute units, shared memory and register file, so every per-SM term (tensor, CUDA-core and
  SFU work; the SMEM, RF and TC levels, whose ``Level.instances`` is the SM count) is stretched
  by ``wave_factor = ceil(blocks / sms) / (blocks / sms)`` (``sms / blocks`` when fewer blocks
  than SMs: only that many SMs' worth of compute is available; the SM's rates are assumed
  reachable by however many blocks it holds, what one block falls short of is the
  :class:`Efficiency`'s business). HBM and L2 are shared by the
  whole chip: a partially full last wave still saturates them if enough bytes are in flight,
  so their terms are not stretched (too few bytes in flight is the Little's-law floor of
  :func:`napkin.perfmodel.predict.latency_floor`). ``tail_resource`` says which per-SM term
  the tail stretched into the bound ("none" when a shared level binds or nothing stretched);
  ``waves``/``ideal_waves`` still count launches of ``sms * blocks_per_sm`` slots;
* a block's latency chain (``block_latency_s``: a pipeline fill, per-step overheads, the
  load → reduce → store chain of a row block; built by
  :func:`napkin.perfmodel.predict.block_latency`) is not overlapped within the block; the
  busiest SM runs its blocks in ``rounds = ceil(ceil(blocks / sms) / blocks_per_sm)``
  generations; in one generation, while a block waits on its chain, the co-resident blocks keep
  the SM busy, so a generation takes ``max(body / rounds, block_latency_s + body / (rounds ·
  blocks_per_sm))`` and what the chain adds (``latency_s``) is ``max(0, rounds ×
  block_latency_s + body / blocks_per_sm − body)``: all of it with one block per SM, nothing
  when enough blocks share the SM; the per-step overheads of a streamed loop
  (``block_issue_s``: barriers, pipeline restarts, time the block's warps issue none of the
  body) are added for every generation, ``rounds × block_issue_s``; for a kernel whose loads run
  ahead of those gaps (``issue_overlaps_memory``) they count on the compute side instead: they cost
  what they push ``compute + rounds × block_issue_s`` past the memory time;
* a fixed launch overhead is added: ``launch_overhead_s``, by default the profile's
  ``GPU.launch_overhead_s`` (an estimate; :data:`LAUNCH_OVERHEAD_S` for a profile without one).

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
           "TENSOR_PATHS", "per_sm_term", "launch_overhead_of"]

#: Fixed cost of one kernel launch, seconds, for a profile without ``launch_overhead_s``
#: (back-to-back launches on one stream cost a few microseconds each; the built-in profiles name
#: it ``GPU.launch_overhead_s``; pass ``launch_overhead_s`` to predict to change it).
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


#: Fractions measured on one H200 against its datasheet (docs/architecture.md §4.6): cuBLAS bf16 GEMM 8192^3
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
    reported_flops: the FLOP count TFLOP/s is reported against (docs/architecture.md §8 conventions, e.g.
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
    compute_s: dict[str, float]        # per compute kind ("tensor", "cuda", "sfu"), amount / rate, no tail
    transfer_s: dict[str, float]       # per memory level, bytes / bandwidth, no tail
    compute_time_s: float              # max (or sum) of compute_s, each times wave_factor
    memory_time_s: float               # the slowest level (per-SM levels times wave_factor)
    bound: str                         # the largest single term after the tail: "tensor", "HBM", ...
                                       # ("tensor chain": the tensor term is its floor, a chain of
                                       # dependent products, not the rate)
    body_s: float                      # before the tail, the latency chain and launch overhead
    blocks: int | None
    blocks_per_sm: int | None
    waves: int | None                  # ceil(blocks / (sms * blocks_per_sm)): launches of every slot
    ideal_waves: float | None          # blocks / (sms * blocks_per_sm)
    wave_factor: float                 # the per-SM tail: ceil(blocks/sms) / (blocks/sms) (1.0 without blocks)
    launch_overhead_s: float
    seconds: float                     # tail_body_s + latency_s + launch_overhead_s
    flops: float                       # the reported FLOP count
    hbm_bytes: float
    tflops: float                      # flops / seconds / 1e12
    gbps: float                        # HBM bytes / seconds / 1e9
    efficiency: Efficiency
    tensor_path: str = "peak"          # "mma.sync": the tensor term ran at gpu.mma_sync_fraction
    tail_resource: str = "none"        # the per-SM term the tail stretched into the bound, or "none"
    tail_terms: tuple[str, ...] = ()   # every term stretched by wave_factor (compute units, per-SM levels)
    busiest_sm_blocks: int | None = None  # ceil(blocks / sms): blocks the busiest SM runs
    rounds: int | None = None          # ceil(busiest_sm_blocks / blocks_per_sm): its block generations
    block_latency_s: float = 0.0       # one block's latency chain (pipeline fill, step overheads, reductions)
    latency_s: float = 0.0             # what the chain adds: rounds*issue + max(0, rounds*latency + body/resident - body)
    tail_body_s: float | None = None   # the body with the tail applied (body_s without blocks)
    fill_share: float = 0.0            # share of min(compute, HBM) the ring's fill and drain expose

    @property
    def terms(self) -> dict[str, float]:
        """Every compute and transfer term, seconds (before the tail)."""
        return {**self.compute_s, **self.transfer_s}

    @property
    def effective_terms(self) -> dict[str, float]:
        """Every term as it enters the time: per-SM terms times ``wave_factor``."""
        return {k: v * (self.wave_factor if k in self.tail_terms else 1.0) for k, v in self.terms.items()}

    @property
    def us(self) -> float:
        return self.seconds * 1e6

    def __str__(self) -> str:
        terms = ", ".join(f"{k} {v * 1e6:.2f}" for k, v in self.terms.items() if v > 0)
        waves = ""
        if self.waves is not None:
            waves = (f", {self.waves} wave(s) vs {self.ideal_waves:.2f} ideal; busiest SM {self.busiest_sm_blocks} "
                     f"block(s): per-SM terms x{self.wave_factor:.3f}"
                     + (f" ({self.tail_resource} binds)" if self.tail_resource != "none" else ""))
        lat = f"; latency chain {self.latency_s * 1e6:.2f} us" if self.latency_s > 0 else ""
        return (f"{self.seconds * 1e6:.2f} us on {self.gpu} ({self.bound}-bound; terms us: {terms}"
                f"{waves}{lat}; launch {self.launch_overhead_s * 1e6:.1f} us) = "
                f"{self.tflops:.1f} TFLOP/s, {self.gbps:.0f} GB/s")


def launch_overhead_of(gpu: GPU) -> float:
    """The profile's fixed cost of one kernel launch (:data:`LAUNCH_OVERHEAD_S` if it has none)."""
    return float(getattr(gpu, "launch_overhead_s", LAUNCH_OVERHEAD_S))


def per_sm_term(gpu: GPU, name: str) -> bool:
    """Is term ``name`` (a compute kind or a level) a resource each SM owns (True) or one the
    whole chip shares (False: HBM and L2, one instance)?"""
    if name in _COMPUTE_KINDS:
        return True
    try:
        return gpu.level(name).instances > 1
    except HardwareError:
        return False


def _body(compute: Mapping[str, float], transfer: Mapping[str, float], eff: Efficiency,
          fill_share: float = 0.0) -> tuple[float, float, float]:
    """(compute time, memory time, body) of the terms under the overlap flags; ``fill_share`` of
    the smaller of the compute and HBM times does not overlap the larger (see :func:`predict`)."""
    compute_time = max(compute.values(), default=0.0) if eff.overlap_compute else sum(compute.values())
    if not eff.overlap_operands and "SMEM" in transfer:
        compute_time += transfer["SMEM"]
        memory_time = max((v for k, v in transfer.items() if k != "SMEM"), default=0.0)
    else:
        memory_time = max(transfer.values(), default=0.0)
    if eff.overlap_memory:
        # the fill waits on HBM (an operand re-read from L2 by the blocks beside it arrives fast)
        hbm = transfer.get("HBM", 0.0)
        body = max(compute_time, memory_time) + fill_share * min(compute_time, hbm)
    else:
        body = compute_time + memory_time
    return compute_time, memory_time, body


def predict(
    gpu: GPU,
    work: Work,
    blocks: int | None = None,
    blocks_per_sm: int | None = None,
    efficiency: Efficiency = Efficiency(),
    launch_overhead_s: float | None = None,
    *,
    tensor_path: str = "peak",
    block_latency_s: float = 0.0,
    block_issue_s: float = 0.0,
    tail_factor: float | None = None,
    issue_overlaps_memory: bool = False,
    fill_share: float = 0.0,
    tensor_floor_s: float = 0.0,
) -> Prediction:
    """Predicted runtime of ``work`` on ``gpu`` (see the module docstring for the assumptions).

    ``blocks`` (thread blocks launched) and ``blocks_per_sm`` (resident at once, e.g. from
    :func:`~napkin.perfmodel.occupancy.occupancy`; default 1) turn on the per-SM tail and the
    rounds of the latency chain. ``tensor_path`` (:data:`TENSOR_PATHS`) says how the tensor-core
    work is issued. ``block_latency_s``: the latency one block cannot overlap with its own work
    (added once per round of the busiest SM; once without ``blocks``). ``launch_overhead_s``:
    None takes the profile's ``launch_overhead_s``. ``tail_factor`` (with ``blocks``): the
    busiest SM's work over the even share where the launch's own order of unequal tiles sets it
    (a persistent kernel's, or a causal grid's), instead of ``ceil(blocks / sms) / (blocks / sms)``.
    ``issue_overlaps_memory``: the kernel's loads run ahead of its per-step gaps, so the gaps
    (``block_issue_s``) count on the compute side (see the module docstring).
    ``fill_share`` (0 to 1): the share of the smaller of the compute and HBM times that does not
    overlap the larger, because the loop waits on its ring's fill before its first step and drains
    it after its last load. Blocks that run one tile each, started together, fill and drain
    together, so nothing else on the chip hides it: a loop of ``n`` steps behind a ring that
    loads ``r`` chunks ahead exposes ``min(1, r / n)`` (a loop no longer than its ring loads,
    then multiplies, as if not overlapped at all).
    ``tensor_floor_s``: the least time of the tensor term, an SM's share before the tail (a chain
    of dependent tensor-core products that the tensor rate alone does not bound).
    """
    if not 0.0 <= fill_share <= 1.0:
        raise HardwareError(f"fill_share must be a fraction in [0, 1], got {fill_share!r}")
    if launch_overhead_s is None:
        launch_overhead_s = launch_overhead_of(gpu)
    if launch_overhead_s < 0:
        raise HardwareError("launch_overhead_s must be non-negative")
    if block_latency_s < 0 or block_issue_s < 0:
        raise HardwareError("block_latency_s and block_issue_s must be non-negative")
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
    if tensor_floor_s < 0:
        raise HardwareError(f"tensor_floor_s must be non-negative, got {tensor_floor_s!r}")
    chained = compute["tensor"] > 0 and tensor_floor_s > compute["tensor"]
    if chained:
        compute["tensor"] = tensor_floor_s
    transfer: dict[str, float] = {}
    for name, b in work.bytes.items():
        lv = gpu.level(name)  # HardwareError for unknown level names
        transfer[lv.name] = b / (lv.bandwidth * eff.level(lv.name))
    _, _, body = _body(compute, transfer, eff, fill_share)

    waves = ideal = busiest = rounds = None
    factor = 1.0
    bps = None
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
        busiest = math.ceil(blocks / gpu.sms)
        factor = busiest / (blocks / gpu.sms)
        if tail_factor is not None:
            if tail_factor < 1.0:
                raise HardwareError(f"tail_factor must be at least 1, got {tail_factor}")
            factor = float(tail_factor)
        rounds = math.ceil(busiest / bps)
    elif blocks_per_sm is not None and blocks_per_sm <= 0:
        raise HardwareError(f"blocks_per_sm must be positive, got {blocks_per_sm}")

    stretched = tuple(k for k in (*compute, *transfer) if per_sm_term(gpu, k)) if blocks is not None else ()
    s_compute = {k: v * (factor if k in stretched else 1.0) for k, v in compute.items()}
    s_transfer = {k: v * (factor if k in stretched else 1.0) for k, v in transfer.items()}
    compute_time, memory_time, tail_body = _body(s_compute, s_transfer, eff, fill_share)
    terms = {**s_compute, **s_transfer}
    bound = max(terms, key=lambda k: terms[k]) if any(v > 0 for v in terms.values()) else "none"
    tail_resource = bound if (factor > 1.0 + 1e-12 and bound in stretched) else "none"
    if chained and bound == "tensor":
        bound = "tensor chain"  # the floor, not the tensor rate, binds: say so
    # One generation of co-resident blocks on the busiest SM takes max(its share of the body, one
    # block's chain + that block's own share of the body): while one block waits on its chain the
    # others keep the SM's pipes busy. Over the rounds, what the chain adds beyond the body is
    # max(0, rounds·chain + body/blocks_per_sm − body); with one block per SM it simply adds.
    # A block's per-step overheads (barrier, pipeline restart) are time its warps issue nothing of
    # the body, ``block_issue_s`` every generation, added. A kernel whose loads run ahead of those
    # gaps (``issue_overlaps_memory``: its loads in flight keep moving through them) pays only what
    # they push the SM's issue time (compute plus gaps) past the memory time: all of it in a
    # compute-bound loop, nothing in a memory-bound one with that much slack. Measured on an H200:
    # the split-KV decode kernel at x = 32k, 16 splits of 32 steps 38.8 us of kernels against 41.2
    # for 33 splits of 16 steps (adding the gaps ranked 33 first); but the mma.sync contraction's
    # 64 x 64 tiles over a tall, narrow product ran 1.5-2.1x slower than the wgmma tiles when its
    # gaps were taken as hidden (8192 x 2097153 x 64 in 2 batches: 3556.6 against 2102.6 us).
    n_rounds = rounds if rounds is not None else 1
    resident = max(1, min(bps or 1, busiest or 1))
    issue = block_issue_s * n_rounds
    if issue_overlaps_memory and eff.overlap_memory:
        issue = max(0.0, compute_time + issue - tail_body)
    latency = issue + max(0.0, block_latency_s * n_rounds + tail_body / resident - tail_body)

    seconds = tail_body + latency + launch_overhead_s
    flops = work.flops_reported
    hbm_bytes = float(sum(v for k, v in work.bytes.items() if k.upper() == "HBM"))
    return Prediction(
        gpu=gpu.key, compute_s=compute, transfer_s=transfer, compute_time_s=compute_time,
        memory_time_s=memory_time, bound=bound, body_s=body, blocks=blocks,
        blocks_per_sm=blocks_per_sm if blocks is None else bps,
        waves=waves, ideal_waves=ideal, wave_factor=factor, launch_overhead_s=launch_overhead_s,
        seconds=seconds, flops=flops, hbm_bytes=hbm_bytes,
        tflops=(flops / seconds / 1e12) if seconds > 0 else 0.0,
        gbps=(hbm_bytes / seconds / 1e9) if seconds > 0 else 0.0,
        efficiency=eff, tensor_path=tensor_path, tail_resource=tail_resource, tail_terms=stretched,
        busiest_sm_blocks=busiest, rounds=rounds, block_latency_s=float(block_latency_s), latency_s=latency,
        tail_body_s=tail_body, fill_share=float(fill_share),
    )


def with_efficiency(eff: Efficiency, **changes) -> Efficiency:
    """A copy of ``eff`` with some fractions changed (validated)."""
    return replace(eff, **changes)
