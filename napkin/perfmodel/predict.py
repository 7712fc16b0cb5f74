"""Runtime prediction of a whole schedule: each kernel through the roofline, then summed.

Every kernel is costed (H and M per level, FLOPs per unit), its launch is described by a
:class:`LaunchShape` (blocks, threads, registers, shared memory, bytes each thread keeps in
flight, idle lanes, and how it issues its work), the roofline
(:func:`napkin.perfmodel.roofline.predict`) gives its time with wave quantisation, and a latency
floor bounds it from below. Kernels run one after another, so the schedule's time is the sum.
This is the one prediction path: :func:`napkin.codegen.select.predict_schedule` builds the
LaunchShape of a generated kernel from its family's ``launch_estimate`` and calls
:func:`predict_schedule` here.

The assumptions that are not datasheet facts are named, with where their numbers come from:

* without a LaunchShape, :class:`LaunchAssumptions` (threads per block, registers a thread needs
  beside the tiles) stand for the launch, and residency follows from the memory the cost model
  says a block holds (M at SMEM and RF);
* **latency floor** (Little's law): a kernel that keeps ``in_flight_bytes_per_thread`` bytes in
  flight per thread moves at most ``blocks_per_sm · threads · in_flight · SMs`` bytes per memory
  latency, so its HBM bytes take at least ``HBM bytes · latency / bytes in flight``;
  ``idle_lanes`` (the fraction of threads with nothing to load) divides the bytes in flight. The
  latency is ``GPU.memory_latency_s`` (800 ns on the built-in profiles: an estimate of an HBM
  load under load, not a measurement; pass ``memory_latency_s`` to change it);
* **instruction path**: ``tensor_path="mma.sync"`` runs tensor-core work at the profile's
  ``mma_sync_fraction`` of its tensor rate (647 / 989.4 measured on an H200);
* **overlap**: ``overlap_compute=False`` adds tensor, CUDA-core and SFU (exp) times (a
  FlashAttention-2-style kernel runs its softmax between its two mma in one warp);
  ``overlap_operands=False`` adds the SMEM-to-register operand loads to the compute time;
* **calibrated factors**: ``family=`` applies the profile's ``efficiency[family]`` fractions
  (written by :mod:`napkin.perfmodel.calibration`; none on datasheet profiles).

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Schedule
>>> d = library.get("attention").bind(q=4096, x=4096, d=128)
>>> p = predict_schedule(Schedule.fused(d, groups={"q": 128}, streams={"x": 64}), "h100")
>>> p.seconds > 0 and p.kernels[0].blocks == 32
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from ..errors import HardwareError, ScheduleError
from .cost import Cost, KernelCost, cost
from .hardware import GPU, get_gpu
from .occupancy import occupancy
from .roofline import LAUNCH_OVERHEAD_S, TENSOR_PATHS, Efficiency, Prediction, Work, predict

__all__ = ["LaunchAssumptions", "LaunchShape", "KernelPrediction", "SchedulePrediction", "PreparedKernel",
           "PreparedSchedule", "MEMORY_LATENCY_S", "kernel_work", "residency", "launch_from_cost",
           "family_efficiency", "latency_floor", "predict_kernel", "prepare_schedule", "predict_prepared",
           "predict_schedule"]

#: The default latency of an HBM access under load, seconds, for the bytes-in-flight floor when a
#: profile does not say (an estimate: loaded HBM latency on A100/H100-class parts is several
#: hundred ns; ``GPU.memory_latency_s`` overrides it, calibration may too).
MEMORY_LATENCY_S = 800e-9


@dataclass(frozen=True)
class LaunchAssumptions:
    """What the model assumes about a launch that a schedule does not say.

    ``threads_per_block``: the fewest threads that execute one group (a block); a kernel
    whose register tiles would need more than ``target_regs_per_thread`` per thread gets
    twice as many threads, up to ``max_threads_per_block`` (as FlashAttention uses 8 warps
    where 4 would hold too much).
    ``base_regs_per_thread``: registers a thread uses beside its share of the tiles
    held in registers (addresses, loop counters, fragments in flight).
    """

    threads_per_block: int = 128
    max_threads_per_block: int = 512
    target_regs_per_thread: int = 168
    base_regs_per_thread: int = 40

    def regs_per_thread(self, rf_bytes: float, threads: int) -> int:
        """Registers per thread when ``threads`` share ``rf_bytes`` of register tiles."""
        return self.base_regs_per_thread + int(math.ceil(rf_bytes / 4 / threads))

    def threads_for(self, rf_bytes: float) -> int:
        """Threads per block for a kernel holding ``rf_bytes`` in registers."""
        threads = self.threads_per_block
        while (self.regs_per_thread(rf_bytes, threads) > self.target_regs_per_thread
               and threads * 2 <= self.max_threads_per_block):
            threads *= 2
        return threads


@dataclass(frozen=True)
class LaunchShape:
    """The launch facts of one kernel that the cost model cannot see.

    blocks, threads, regs_per_thread, smem_bytes: the launch (residency per SM follows from them
        by the CUDA occupancy rules; registers above the per-thread limit count as the limit);
    in_flight_bytes_per_thread: bytes of memory loads each thread keeps outstanding (None: no
        latency floor);
    idle_lanes: fraction of the threads that load nothing (they carry no bytes in flight);
    tensor_path: "peak" (the profile's tensor rate) or "mma.sync" (``GPU.mma_sync_fraction`` of it);
    overlap_compute / overlap_operands: override the :class:`~napkin.perfmodel.roofline.Efficiency`
        flags for this kernel (None keeps the caller's): False says the kernel does not overlap
        tensor, CUDA-core and SFU work / operand loads from SMEM with compute.
    """

    blocks: int
    threads: int
    regs_per_thread: int
    smem_bytes: int
    in_flight_bytes_per_thread: float | None = None
    idle_lanes: float = 0.0
    tensor_path: str = "peak"
    overlap_compute: bool | None = None
    overlap_operands: bool | None = None

    def __post_init__(self) -> None:
        if int(self.blocks) < 1 or int(self.threads) < 1:
            raise ScheduleError(f"a launch needs at least one block and one thread, got {self.blocks} x {self.threads}")
        if int(self.regs_per_thread) < 0 or int(self.smem_bytes) < 0:
            raise ScheduleError("registers and shared memory of a launch must be non-negative")
        if not (0.0 <= float(self.idle_lanes) < 1.0):
            raise ScheduleError(f"idle_lanes must be a fraction in [0, 1), got {self.idle_lanes!r}")
        if self.in_flight_bytes_per_thread is not None and self.in_flight_bytes_per_thread < 0:
            raise ScheduleError("in_flight_bytes_per_thread must be non-negative")
        if self.tensor_path not in TENSOR_PATHS:
            raise ScheduleError(f"unknown tensor path {self.tensor_path!r}; known: {', '.join(TENSOR_PATHS)}")

    def efficiency(self, eff: Efficiency) -> Efficiency:
        """``eff`` with this launch's overlap flags where it sets them."""
        changes = {}
        if self.overlap_compute is not None:
            changes["overlap_compute"] = bool(self.overlap_compute)
        if self.overlap_operands is not None:
            changes["overlap_operands"] = bool(self.overlap_operands)
        return replace(eff, **changes) if changes else eff


@dataclass(frozen=True)
class KernelPrediction:
    """One kernel's predicted time and the residency it was computed with."""

    name: str
    blocks: int
    blocks_per_sm: int
    regs_per_thread: int
    smem_bytes: int
    limited_by: str
    roofline: Prediction
    latency_floor_s: float = 0.0       # Little's-law floor (0: none); seconds = max(roofline, floor + launch)
    launch: LaunchShape | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float:
        return max(self.roofline.seconds, self.latency_floor_s + self.roofline.launch_overhead_s)

    @property
    def bound(self) -> str:
        """The roofline's bound, or "latency" where the bytes-in-flight floor decides."""
        if self.latency_floor_s + self.roofline.launch_overhead_s > self.roofline.seconds:
            return "latency"
        return self.roofline.bound


@dataclass(frozen=True)
class SchedulePrediction:
    """Predicted time of a whole schedule (sum over kernels) with the detail per kernel."""

    seconds: float
    flops: float
    hbm_bytes: float
    kernels: tuple[KernelPrediction, ...]
    cost: Cost = field(repr=False)

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else 0.0

    @property
    def gbps(self) -> float:
        return self.hbm_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def bound(self) -> str:
        """What limits the slowest kernel (tensor, cuda, sfu, HBM, L2, SMEM, RF, latency)."""
        slowest = max(self.kernels, key=lambda k: k.seconds)
        return slowest.bound

    def to_dict(self) -> dict:
        return {
            "predicted_seconds": self.seconds, "tflops": self.tflops, "gbps": self.gbps, "bound": self.bound,
            "kernels": [{
                "name": k.name, "seconds": k.seconds, "blocks": k.blocks, "blocks_per_sm": k.blocks_per_sm,
                "regs_per_thread": k.regs_per_thread, "smem_bytes": k.smem_bytes, "limited_by": k.limited_by,
                "bound": k.bound, "waves": k.roofline.waves, "latency_floor_s": k.latency_floor_s,
                "tensor_path": k.roofline.tensor_path,
            } for k in self.kernels],
        }


def _work_dtype(dtype: str) -> str:
    """The tensor-core dtype a schedule's dtype runs at (fp32 inputs go through tf32)."""
    return dtype if dtype in ("fp16", "bf16", "fp8", "tf32") else "tf32" if dtype == "fp32" else "fp16"


def kernel_work(kc: KernelCost, dtype: str) -> Work:
    """The roofline :class:`Work` of one kernel's numeric cost."""
    return Work(flops={k: float(v) for k, v in kc.flops.items()},
                bytes={k: float(v.H_bytes) for k, v in kc.levels.items() if k != "TC"},
                dtype=_work_dtype(dtype))


def launch_from_cost(gpu: GPU, kc: KernelCost, assume: LaunchAssumptions = LaunchAssumptions()) -> LaunchShape:
    """The launch :class:`LaunchAssumptions` stand for: one block per group, threads and registers
    from the register tiles, shared memory from M at SMEM. ScheduleError when a thread would need
    more registers than it can have."""
    smem = int(math.ceil(float(kc.levels["SMEM"].M_bytes)))
    rf_bytes = float(kc.levels["RF"].M_bytes)
    threads = assume.threads_for(rf_bytes)
    regs = assume.regs_per_thread(rf_bytes, threads)
    if regs > gpu.max_regs_per_thread:
        raise ScheduleError(
            f"kernel {kc.name}: the registers it holds need {regs} per thread with {threads} threads, "
            f"over the {gpu.max_regs_per_thread} a thread can have (spills)")
    return LaunchShape(blocks=max(1, int(kc.groups)), threads=threads, regs_per_thread=regs, smem_bytes=smem)


def residency(gpu: GPU, kc: KernelCost, assume: LaunchAssumptions) -> tuple[int, int, int, str]:
    """(blocks per SM, registers per thread, SMEM bytes, limiting resource) for one kernel.

    Raises ScheduleError when one block cannot fit an SM.
    """
    shape = launch_from_cost(gpu, kc, assume)
    occ = occupancy(gpu, shape.threads, shape.regs_per_thread, shape.smem_bytes)
    if occ.blocks_per_sm < 1:
        raise ScheduleError(f"kernel {kc.name}: one block ({shape.smem_bytes} B of SMEM, {shape.regs_per_thread} "
                            f"registers × {shape.threads} threads) does not fit an SM of {gpu.name} "
                            f"(limited by {occ.limiting})")
    return occ.blocks_per_sm, shape.regs_per_thread, shape.smem_bytes, occ.limiting


def family_efficiency(gpu: GPU, family: str | None, base: Efficiency = Efficiency()) -> Efficiency:
    """``base`` times the profile's calibrated fractions for ``family`` (unchanged without any)."""
    factors = (getattr(gpu, "efficiency", None) or {}).get(family) if family else None
    return base.scaled(factors) if factors else base


def latency_floor(gpu: GPU, hbm_bytes: float, launch: LaunchShape | None, blocks_per_sm: int | None,
                  memory_latency_s: float | None = None) -> float:
    """Little's law: the least time ``hbm_bytes`` take when each SM keeps ``blocks_per_sm ·
    threads · in_flight_bytes_per_thread · (1 − idle_lanes)`` bytes in flight per memory latency
    (0 when the launch does not say what it keeps in flight). Idle lanes divide the bytes in
    flight, down to 5% of them."""
    if launch is None or not launch.in_flight_bytes_per_thread or not blocks_per_sm or hbm_bytes <= 0:
        return 0.0
    latency = memory_latency_s if memory_latency_s is not None else getattr(gpu, "memory_latency_s",
                                                                            MEMORY_LATENCY_S)
    in_flight = blocks_per_sm * launch.threads * launch.in_flight_bytes_per_thread * gpu.sms
    floor = hbm_bytes * latency / in_flight
    if launch.idle_lanes:
        floor /= max(0.05, 1.0 - launch.idle_lanes)
    return floor


def predict_kernel(gpu: GPU, work: Work, launch: LaunchShape | None = None, *, name: str = "kernel",
                   efficiency: Efficiency = Efficiency(), memory_latency_s: float | None = None,
                   launch_overhead_s: float = LAUNCH_OVERHEAD_S) -> KernelPrediction:
    """One kernel: residency from its launch (CUDA occupancy rules), the roofline with wave
    quantisation, the instruction path and overlap the launch states, and the latency floor.

    Without a launch: the plain roofline (no waves, no floor). ScheduleError when one block of
    the launch does not fit an SM.
    """
    if launch is None:
        rp = predict(gpu, work, efficiency=efficiency, launch_overhead_s=launch_overhead_s)
        return KernelPrediction(name, 1, 1, 0, 0, "unknown", rp)
    regs = int(min(launch.regs_per_thread, gpu.max_regs_per_thread))
    try:
        occ = occupancy(gpu, int(launch.threads), regs, int(launch.smem_bytes))
        bps, limit = occ.blocks_per_sm, occ.limiting
    except HardwareError as e:  # a launch the occupancy rules cannot place: no residency facts
        bps, limit = None, f"unknown ({e})"
    if bps == 0:
        raise ScheduleError(f"kernel {name}: a block of {launch.threads} threads ({regs} registers each, "
                            f"{launch.smem_bytes} B of SMEM) does not fit an SM of {gpu.name} (limited by {limit})")
    eff = launch.efficiency(efficiency)
    rp = predict(gpu, work, blocks=int(launch.blocks), blocks_per_sm=bps, efficiency=eff,
                 launch_overhead_s=launch_overhead_s, tensor_path=launch.tensor_path)
    floor = latency_floor(gpu, float(work.bytes.get("HBM", 0.0)), launch, bps, memory_latency_s)
    return KernelPrediction(name, int(launch.blocks), bps or 1, regs, int(launch.smem_bytes), limit, rp,
                            floor, launch)


@dataclass(frozen=True)
class PreparedKernel:
    """What one kernel's prediction needs: its name, its Work and its launch."""

    name: str
    work: Work
    launch: LaunchShape | None       # None: no launch facts (plain roofline, no waves, no floor)


@dataclass(frozen=True)
class PreparedSchedule:
    """A schedule costed once, ready to be predicted under any rates and efficiencies (calibration
    evaluates the same schedule many times)."""

    kernels: tuple[PreparedKernel, ...]
    cost: Cost = field(repr=False)


def _gpu_of(schedule, gpu) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    return get_gpu(gpu or getattr(schedule, "gpu", None) or "h100")


def prepare_schedule(schedule, gpu: GPU | str | None = None, *, sizes=None, the_cost: Cost | None = None,
                     assume: LaunchAssumptions | None = LaunchAssumptions(), l2_caching: bool = True,
                     launch: LaunchShape | Sequence[LaunchShape] | None = None) -> PreparedSchedule:
    """Cost ``schedule`` and pair each kernel's Work with its launch: ``launch`` (one LaunchShape
    for every kernel, or one per kernel) or, without it, the launch ``assume`` stands for
    (``assume=None``: no launch facts at all, the plain roofline)."""
    g = _gpu_of(schedule, gpu)
    c = the_cost if the_cost is not None else cost(schedule, g, sizes=sizes, l2_caching=l2_caching)
    if c.is_symbolic:
        raise ScheduleError("runtime prediction needs numeric sizes for every axis and tile")
    kernels = list(c.per_kernel)
    if launch is None:
        launches = [launch_from_cost(g, kc, assume) if assume is not None else None for kc in kernels]
    elif isinstance(launch, LaunchShape):
        launches = [launch] * len(kernels)
    else:
        launches = list(launch)
        if len(launches) != len(kernels):
            raise ScheduleError(f"{len(launches)} launch shape(s) for a schedule of {len(kernels)} kernel(s)")
    dtype = getattr(schedule, "dtype", "bf16")
    return PreparedSchedule(tuple(PreparedKernel(kc.name, kernel_work(kc, dtype), ls)
                                  for kc, ls in zip(kernels, launches)), c)


def predict_prepared(prepared: PreparedSchedule, gpu: GPU, *, efficiency: Efficiency = Efficiency(),
                     family: str | None = None, memory_latency_s: float | None = None,
                     launch_overhead_s: float = LAUNCH_OVERHEAD_S) -> SchedulePrediction:
    """The prediction of a :class:`PreparedSchedule` on ``gpu`` (see :func:`predict_schedule`)."""
    eff = family_efficiency(gpu, family, efficiency)
    preds = tuple(predict_kernel(gpu, k.work, k.launch, name=k.name, efficiency=eff,
                                 memory_latency_s=memory_latency_s, launch_overhead_s=launch_overhead_s)
                  for k in prepared.kernels)
    c = prepared.cost
    return SchedulePrediction(sum(p.seconds for p in preds), float(c.total_flops),
                              float(c.levels["HBM"].H_bytes), preds, c)


def predict_schedule(schedule, gpu: GPU | str | None = None, *, sizes=None, the_cost: Cost | None = None,
                     efficiency: Efficiency = Efficiency(), assume: LaunchAssumptions | None = LaunchAssumptions(),
                     l2_caching: bool = True, launch: LaunchShape | Sequence[LaunchShape] | None = None,
                     family: str | None = None, memory_latency_s: float | None = None,
                     launch_overhead_s: float = LAUNCH_OVERHEAD_S) -> SchedulePrediction:
    """Predict the runtime of ``schedule`` on ``gpu`` (numeric sizes needed).

    ``launch``: the kernels' :class:`LaunchShape` (one for all, or one per kernel); default: the
    launch :class:`LaunchAssumptions` stand for (no bytes-in-flight floor, the peak tensor path,
    the overlap of ``efficiency``; ``assume=None``: no launch facts, the plain roofline). ``family``: apply the profile's calibrated fractions for that
    code-generation family. ``memory_latency_s``: the latency of the floor (default
    ``gpu.memory_latency_s``).
    """
    g = _gpu_of(schedule, gpu)
    prepared = prepare_schedule(schedule, g, sizes=sizes, the_cost=the_cost, assume=assume,
                                l2_caching=l2_caching, launch=launch)
    return predict_prepared(prepared, g, efficiency=efficiency, family=family, memory_latency_s=memory_latency_s,
                            launch_overhead_s=launch_overhead_s)
