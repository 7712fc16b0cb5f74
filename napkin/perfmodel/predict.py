"""Runtime prediction of a whole schedule: each kernel through the roofline, then summed.

Every kernel is costed (H and M per level, FLOPs per unit), its residency per SM
follows from the memory the model says a block holds (M at SMEM and RF), and the
roofline (:func:`napkin.perfmodel.roofline.predict`) gives its time with wave
quantisation. Kernels run one after another, so the schedule's time is the sum.

The assumptions that are not datasheet facts are explicit fields of
:class:`LaunchAssumptions` (threads per block, registers a thread needs beside the
tiles) so benchmarks can calibrate them.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel.schedule import Schedule
>>> d = library.get("attention").bind(q=4096, x=4096, d=128)
>>> p = predict_schedule(Schedule.fused(d, groups={"q": 128}, streams={"x": 64}), "h100")
>>> p.seconds > 0 and p.kernels[0].blocks == 32
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ScheduleError
from .cost import Cost, KernelCost, cost
from .hardware import GPU, get_gpu
from .occupancy import occupancy
from .roofline import Efficiency, Prediction, Work, predict


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
class KernelPrediction:
    """One kernel's predicted time and the residency it was computed with."""

    name: str
    blocks: int
    blocks_per_sm: int
    regs_per_thread: int
    smem_bytes: int
    limited_by: str
    roofline: Prediction

    @property
    def seconds(self) -> float:
        return self.roofline.seconds


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
        """What limits the slowest kernel (tensor, cuda, sfu, HBM, L2, SMEM, RF)."""
        slowest = max(self.kernels, key=lambda k: k.seconds)
        return slowest.roofline.bound

    def to_dict(self) -> dict:
        return {
            "predicted_seconds": self.seconds, "tflops": self.tflops, "gbps": self.gbps, "bound": self.bound,
            "kernels": [{
                "name": k.name, "seconds": k.seconds, "blocks": k.blocks, "blocks_per_sm": k.blocks_per_sm,
                "regs_per_thread": k.regs_per_thread, "smem_bytes": k.smem_bytes, "limited_by": k.limited_by,
                "bound": k.roofline.bound, "waves": k.roofline.waves,
            } for k in self.kernels],
        }


def kernel_work(kc: KernelCost, dtype: str) -> Work:
    """The roofline :class:`Work` of one kernel's numeric cost."""
    return Work(flops={k: float(v) for k, v in kc.flops.items()},
                bytes={k: float(v.H_bytes) for k, v in kc.levels.items() if k != "TC"},
                dtype=dtype if dtype in ("fp16", "bf16", "fp8", "tf32") else "fp16")


def residency(gpu: GPU, kc: KernelCost, assume: LaunchAssumptions) -> tuple[int, int, int, str]:
    """(blocks per SM, registers per thread, SMEM bytes, limiting resource) for one kernel.

    Raises ScheduleError when one block cannot fit an SM.
    """
    smem = int(math.ceil(float(kc.levels["SMEM"].M_bytes)))
    rf_bytes = float(kc.levels["RF"].M_bytes)
    threads = assume.threads_for(rf_bytes)
    regs = assume.regs_per_thread(rf_bytes, threads)
    if regs > gpu.max_regs_per_thread:
        raise ScheduleError(
            f"kernel {kc.name}: the registers it holds need {regs} per thread with {threads} threads, "
            f"over the {gpu.max_regs_per_thread} a thread can have (spills)")
    occ = occupancy(gpu, threads, regs, smem)
    if occ.blocks_per_sm < 1:
        raise ScheduleError(f"kernel {kc.name}: one block ({smem} B of SMEM, {regs} registers × {threads} "
                            f"threads) does not fit an SM of {gpu.name} (limited by {occ.limiting})")
    return occ.blocks_per_sm, regs, smem, occ.limiting


def predict_schedule(schedule, gpu: GPU | str | None = None, *, sizes=None, the_cost: Cost | None = None,
                     efficiency: Efficiency = Efficiency(), assume: LaunchAssumptions = LaunchAssumptions(),
                     l2_caching: bool = True) -> SchedulePrediction:
    """Predict the runtime of ``schedule`` on ``gpu`` (numeric sizes needed)."""
    g = get_gpu(gpu or schedule.gpu or "h100") if not isinstance(gpu, GPU) else gpu
    c = the_cost if the_cost is not None else cost(schedule, g, sizes=sizes, l2_caching=l2_caching)
    if c.is_symbolic:
        raise ScheduleError("runtime prediction needs numeric sizes for every axis and tile")
    preds = []
    for kc in c.per_kernel:
        bps, regs, smem, limit = residency(g, kc, assume)
        rp = predict(g, kernel_work(kc, schedule.dtype), blocks=max(1, int(kc.groups)), blocks_per_sm=bps,
                     efficiency=efficiency)
        preds.append(KernelPrediction(kc.name, int(kc.groups), bps, regs, smem, limit, rp))
    seconds = sum(p.seconds for p in preds)
    flops = float(c.total_flops)
    hbm = float(c.levels["HBM"].H_bytes)
    return SchedulePrediction(seconds, flops, hbm, tuple(preds), c)
