"""Runtime prediction of a whole schedule: each kernel through the roofline, then summed.

Every kernel is costed (H and M per level, FLOPs per unit), its launch is described by a
:class:`LaunchShape` (blocks, threads, registers, shared memory, bytes each thread keeps in
flight, idle lanes, and how it issues its work), the roofline
(:func:`napkin.perfmodel.roofline.predict`) gives its time with the per-SM tail and the block's
latency chain, and a latency floor bounds it from below. Kernels run one after another, so the schedule's time is the sum.
This is the one prediction path: :func:`napkin.codegen.select.predict_schedule` builds the
LaunchShape of a generated kernel from its family's ``launch_estimate`` and calls
:func:`predict_schedule` here.

The assumptions that are not datasheet facts are named, with where their numbers come from:

* without a LaunchShape, :class:`LaunchAssumptions` (threads per block, registers a thread needs
  beside the tiles) stand for the launch, and residency follows from the memory the cost model
  says a block holds (M at SMEM and RF);
* **latency floor** (Little's law): a kernel that keeps ``in_flight_bytes_per_thread`` bytes in
  flight per thread moves at most ``min(blocks, blocks_per_sm · SMs) · threads · in_flight``
  bytes per memory latency, so its HBM bytes take at least ``HBM bytes · latency / bytes in flight``;
  ``idle_lanes`` (the fraction of threads with nothing to load) divides the bytes in flight. The
  latency is ``GPU.memory_latency_s`` (800 ns on the built-in profiles: an estimate of an HBM
  load under load, not a measurement; pass ``memory_latency_s`` to change it);
* **latency chain** (:func:`block_latency`): a block pays, and cannot overlap with its own work,
  a pipeline fill (its first chunk's or row's load: ``GPU.memory_latency_s``), a fixed overhead
  per step of its streamed loop (``GPU.step_overhead_clk``: barrier, operand-load -> mma restart,
  copy issue) and the dependent cross-thread reductions of its rows (``log2`` shuffle stages of
  ``GPU.shuffle_latency_clk`` each, plus ``GPU.sync_latency_clk`` when a row spans warps). The
  busiest SM runs ``ceil(blocks / SMs)`` blocks in rounds of ``blocks_per_sm`` co-resident
  ones, which overlap each other's fills and reductions (the per-step overheads are issue time and
  add up; see :func:`napkin.perfmodel.roofline.predict` for what the chain adds)
  (:func:`napkin.perfmodel.roofline.predict`). The chain's inputs are :class:`LaunchShape`
  fields (``stream_steps``, ``reductions``, ``reductions_per_step``, ``threads_per_row``,
  ``row_iterations``), filled from the kernel's cost (:class:`~napkin.perfmodel.cost.KernelCost`:
  ``stream``, ``mean_steps``, ``reductions``, ``reductions_per_step``) where the launch leaves
  them None; a launch that states none of them and has no cost gets no chain;
* **tail**: per SM and only on the resources an SM owns (compute units, SMEM, RF); HBM and L2
  are shared by the chip and are not stretched by a partial last wave
  (:mod:`napkin.perfmodel.roofline`);
* **instruction path**: ``tensor_path="mma.sync"`` runs tensor-core work at the profile's
  ``mma_sync_fraction`` of its tensor rate (647 / 989.4 measured on an H200);
* **overlap**: ``overlap_compute=False`` adds tensor, CUDA-core and SFU (exp) times (a
  FlashAttention-2-style kernel runs its softmax between its two mma in one warp);
  ``overlap_operands=False`` adds the SMEM-to-register operand loads to the compute time;
* **epilogue after the loop** (``epilogue_hbm_bytes``): a kernel whose every block runs its
  streamed loop and then an epilogue (a tiled contraction that is not persistent: the output
  tile's store, the epilogue's operand reads and its maps) has two phases that do not overlap:
  its co-resident blocks start together and run alike, so the whole chip loads and multiplies,
  then computes the maps, then stores (a barrier between). The epilogue's HBM bytes and the
  kernel's CUDA-core and SFU work (the maps) are priced as a second roofline, its compute and
  its transfers added, after the loop's (:func:`predict_kernel`). Measured on an H100 (bf16,
  mma.sync 128 x 128 tiles, ``[256, 1024, 1024]`` outputs of a sum over 128): the plain scores
  kernel took 366 us where the overlapped roofline said 210 (write-bound); the loop alone is
  ~194 and the 512 MiB store at the HBM rate 160; with ``exp(S·c − lse)`` in the epilogue 491 us.
  An epilogue that first loads operand tiles (``epilogue_waits``) waits a memory latency every
  round of the busiest SM (the co-resident blocks wait at the same time);
* **a ring's fill** (``fill_share``): a kernel whose blocks run one tile each, started together,
  fills its ring and drains it in step with its neighbours, so that share of the loop's smaller
  time (compute or HBM) adds to the larger; an SM holding more than ``FILL_LOCKED_BLOCKS`` (2)
  blocks hides part of it, in proportion (:func:`exposed_fill_share`; the constant is fitted to
  three H200 measurements, named there);
* **wgmma chain** (``tensor_chain_s``): a wgmma kernel's consumer adds each chunk's ``BK / 16``
  products into one accumulator tile, one after another (``GPU.wgmma_step_clk`` each, measured
  on an H200 with 8-slot rings, whose round trip it mostly is; the contraction family divides it
  for deeper rings), so the tensor term is at least the busiest SM's tiles times their chunks
  times that chain: it binds tiles of few rows or columns over a long sum (a few vectors by a
  matrix), where splitting the sum shortens each block's chain;
* **calibrated factors**: ``family=`` applies the profile's ``efficiency[family]`` fractions
  (written by the calibration step; none on datasheet profiles).

:func:`explain_assumptions` lists every one of these numbers with where it comes from.

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
from .roofline import LAUNCH_OVERHEAD_S, TENSOR_PATHS, Efficiency, Prediction, Work, launch_overhead_of, predict

__all__ = ["LaunchAssumptions", "LaunchShape", "KernelPrediction", "SchedulePrediction", "PreparedKernel",
           "PreparedSchedule", "MEMORY_LATENCY_S", "LatencyChain", "kernel_work", "residency", "launch_from_cost",
           "family_efficiency", "latency_floor", "exposed_fill_share", "FILL_LOCKED_BLOCKS", "block_latency",
           "reduction_latency_clk", "predict_kernel", "prepare_schedule", "predict_prepared", "predict_schedule",
           "explain_assumptions"]

#: The default latency of an HBM access under load, seconds, for the bytes-in-flight floor when a
#: profile does not say (an estimate: loaded HBM latency on A100/H100-class parts is several
#: hundred ns; ``GPU.memory_latency_s`` overrides it, calibration may too).
MEMORY_LATENCY_S = 800e-9

#: Threads that hold one row of an mma.sync m16n8 accumulator fragment (a quad): the width of a
#: row reduction on tensor-core accumulators (the online softmax's running max), when a launch
#: does not say ``threads_per_row`` (PTX ISA fragment layout of mma.m16n8k16).
MMA_ROW_THREADS = 4


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
    epilogue_hbm_bytes: HBM bytes every block moves after its streamed loop (its output tile, the
        epilogue's operands), in a phase that does not overlap the loop (0: none, the roofline
        overlaps everything). With it the kernel's CUDA-core and SFU work counts as that phase's
        (the maps of a contraction's epilogue); see :func:`predict_kernel`.
    epilogue_waits: loads the epilogue phase waits for before its maps (operand tiles copied
        after the loop): each costs every round of the busiest SM one memory latency.
    epilogue_rate: the share of the SM's CUDA-core and SFU rates the epilogue phase's maps reach
        (1: all of it). A wgmma row reduction's maps run on its consumer warpgroups alone, two
        warps a scheduler, too few to hide the latency of their dependent instructions
        (:data:`napkin.codegen.families.contraction.WGMMA_ROWRED_EPILOGUE_RATE`).
    epilogue_maps: the kernel's CUDA-core and SFU work (a contraction epilogue's maps) is a phase
        after the loop even where its stores overlap the loop (no ``epilogue_hbm_bytes``): a
        ping-pong consumer computes its tile's maps alone, one warp a scheduler, while the other
        consumer's wgmma run, and the maps do not hide behind them. H200, bf16, 12800 x 768 x
        3072 on the ping-pong 128 x 128 tile: 90.5 us of kernel for the product, 149.9 with a
        bias and the erf GELU (the cooperative 128 x 256: 93.3 and 147.6).

    The latency chain of one block (:func:`block_latency`; None: unknown, filled from the
    kernel's cost by :func:`prepare_schedule`; a launch with all of them None and no cost has
    no chain):

    stream_steps: steps of the block's streamed loop (0: no loop); may be fractional, the mean
        over blocks when fully masked chunks are skipped. Each step costs
        ``GPU.step_overhead_clk`` plus its reductions; the loop's first chunk is the fill.
    reductions: dependent cross-thread reductions in the block's chain outside its loop
        (row-wise softmax 2: max and sum; layernorm 2; rmsnorm 1; an online softmax's final sum 1).
    reductions_per_step: dependent cross-thread reductions in every step of the loop (an online
        softmax's running max: 1).
    threads_per_row: threads that cooperate on one row's reduction: ``log2`` shuffle stages
        within a warp, one cross-warp stage beyond 32 (None: a warp, 32; 1: thread-local).
    tf32x3_flops: CUDA-core FLOPs of the cost (an fp32 contraction's sum) that the kernel runs on
        the tensor cores as 3xTF32: three tf32 products each, priced at the tf32 tensor rate on
        ``tensor_path`` (0: none; :meth:`work_on_pipes`).
    row_iterations: how many times one block runs its load -> reduce -> store chain one after
        another (a block looping over batches of rows); 1: a block handles its rows at once, so
        more rows per block (fewer blocks) or more blocks per SM hide the chain.
    row_round_trips: memory round trips one row iteration waits for one after another (1: its
        first load; a streamed row's first pass: one a step of chunks, each loaded after the last
        is used), each ``GPU.memory_latency_s``.
    row_l2_rounds: dependent round trips to L2 one row iteration waits for besides (a streamed
        row's later passes, which find the row in L2: one a step), each ``GPU.l2_round_clk``.
    exp_fma_share: the share of the kernel's SFU work (exponentials) it computes on the FMA pipe
        instead (a polynomial, as the fp8 attention template's ``ex2_fma``); each such exp costs
        ``fma_flops_per_exp`` CUDA-core FLOPs (an FMA-pipe instruction counted as 2, as the rate
        counts an FMA) and no SFU operation (:meth:`work_on_pipes`).
    tail_factor: the busiest SM's work over the even share where the kernel's own order of
        unequal tiles sets it (a persistent kernel walking tiles, a causal grid), in place of the
        roofline's ``ceil(blocks / SMs) / (blocks / SMs)`` (None: that).
    issue_overlaps_memory: the kernel's loads run ahead of its per-step gaps (a deep cp.async ring
        whose chunks are large beside a step's overhead), so the gaps count on the compute side of
        the roofline (:func:`~napkin.perfmodel.roofline.predict`); False: they add.
    tail_l2_rounds: rounds of dependent loads from L2 the kernel runs once after every block's
        loop, with nothing of its own left to overlap them: the row-wise family's in-kernel combine
        of column partials (the arrival, then each helper's rounds over the partials other blocks
        wrote), or a cluster's blocks adding their split sums' partials in each other's shared
        memory (the contraction family's cluster splits: barriers and remote loads). Each costs
        ``GPU.l2_round_clk``, added to the kernel's time (0: none).
    fill_share: the share of the loop's smaller time (compute or HBM) that its ring's fill and
        drain leave exposed, in a kernel whose blocks run one tile each and start together
        (``min(1, chunks loaded ahead / steps)``; 0: the roofline overlaps them whole); an SM
        holding more than :data:`FILL_LOCKED_BLOCKS` blocks hides part of it
        (:func:`exposed_fill_share`). See :func:`~napkin.perfmodel.roofline.predict`.
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
    #: False where the kernel's warps compute on a step's values only after all of them arrive and
    #: issue the next step's loads only after (a skinny product's many products a value): its
    #: compute and memory times add (:class:`~napkin.perfmodel.roofline.Efficiency`)
    overlap_memory: bool | None = None
    #: the kernel runs its contractions' products as fp32 FMAs on the CUDA cores (the pointwise
    #: family's sums of products), not on the tensor cores the cost model gives 16-bit products
    products_on_cuda: bool = False
    #: the bytes in flight (:attr:`in_flight_bytes_per_thread`) are all of a block's operand loads,
    #: those that hit L2 (an operand other blocks read too) among them, not only the ones that come
    #: from HBM (:func:`latency_floor`): the contraction family's tiles
    in_flight_through_l2: bool = False
    epilogue_hbm_bytes: float = 0.0
    epilogue_waits: int = 0
    epilogue_maps: bool = False
    epilogue_rate: float = 1.0
    stream_steps: float | None = None
    reductions: int | None = None
    reductions_per_step: int | None = None
    threads_per_row: int | None = None
    row_iterations: int = 1
    row_round_trips: int = 1
    row_l2_rounds: int = 0
    exp_fma_share: float = 0.0
    fma_flops_per_exp: float = 0.0
    tf32x3_flops: float = 0.0
    #: the least time of the tensor-core work, an SM's share before the tail: a wgmma kernel whose
    #: consumers add each chunk's products into one accumulator tile, one product after another
    #: (``GPU.wgmma_step_clk`` each), binds a tile of few rows or columns there, not the rate
    tensor_chain_s: float = 0.0
    tail_factor: float | None = None
    issue_overlaps_memory: bool = False
    fill_share: float = 0.0
    tail_l2_rounds: int = 0

    def __post_init__(self) -> None:
        if int(self.blocks) < 1 or int(self.threads) < 1:
            raise ScheduleError(f"a launch needs at least one block and one thread, got {self.blocks} x {self.threads}")
        if int(self.regs_per_thread) < 0 or int(self.smem_bytes) < 0:
            raise ScheduleError("registers and shared memory of a launch must be non-negative")
        if not (0.0 <= float(self.idle_lanes) < 1.0):
            raise ScheduleError(f"idle_lanes must be a fraction in [0, 1), got {self.idle_lanes!r}")
        if self.in_flight_bytes_per_thread is not None and self.in_flight_bytes_per_thread < 0:
            raise ScheduleError("in_flight_bytes_per_thread must be non-negative")
        if not float(self.epilogue_hbm_bytes) >= 0 or int(self.epilogue_waits) < 0:
            raise ScheduleError(f"epilogue_hbm_bytes and epilogue_waits must be non-negative, got "
                                f"{self.epilogue_hbm_bytes!r} and {self.epilogue_waits!r}")
        if self.tensor_path not in TENSOR_PATHS:
            raise ScheduleError(f"unknown tensor path {self.tensor_path!r}; known: {', '.join(TENSOR_PATHS)}")
        for k in ("stream_steps", "reductions", "reductions_per_step"):
            v = getattr(self, k)
            if v is not None and v < 0:
                raise ScheduleError(f"{k} must be non-negative, got {v!r}")
        if self.threads_per_row is not None and int(self.threads_per_row) < 1:
            raise ScheduleError(f"threads_per_row must be at least 1, got {self.threads_per_row!r}")
        for k in ("tensor_chain_s", "tf32x3_flops"):
            if not float(getattr(self, k)) >= 0:
                raise ScheduleError(f"{k} must be non-negative, got {getattr(self, k)!r}")
        if int(self.row_iterations) < 1 or int(self.row_round_trips) < 1:
            raise ScheduleError(f"row_iterations and row_round_trips must be at least 1, got "
                                f"{self.row_iterations!r} and {self.row_round_trips!r}")
        if int(self.row_l2_rounds) < 0:
            raise ScheduleError(f"row_l2_rounds must be non-negative, got {self.row_l2_rounds!r}")
        if int(self.tail_l2_rounds) < 0:
            raise ScheduleError(f"tail_l2_rounds must be non-negative, got {self.tail_l2_rounds!r}")
        if not 0.0 < float(self.epilogue_rate) <= 1.0:
            raise ScheduleError(f"epilogue_rate must be a fraction in (0, 1], got {self.epilogue_rate!r}")
        if not 0.0 <= float(self.fill_share) <= 1.0:
            raise ScheduleError(f"fill_share must be a fraction in [0, 1], got {self.fill_share!r}")
        if not 0.0 <= float(self.exp_fma_share) <= 1.0 or not float(self.fma_flops_per_exp) >= 0.0:
            raise ScheduleError(f"exp_fma_share must be a fraction in [0, 1] and fma_flops_per_exp non-negative, "
                                f"got {self.exp_fma_share!r} and {self.fma_flops_per_exp!r}")

    def work_on_pipes(self, work: Work) -> Work:
        """``work`` on the pipes this kernel runs it on; the FLOPs it reports stay the same:
        :attr:`exp_fma_share` of its SFU operations moved to the CUDA cores
        (``fma_flops_per_exp`` each), then :attr:`tf32x3_flops` of its CUDA-core FLOPs (at most
        all of them) run as 3xTF32, three tf32 tensor-core products each. With
        :attr:`products_on_cuda`, the tensor-core FLOPs run on the CUDA cores instead.

        >>> w = Work(flops={"tensor": 100.0, "sfu": 8.0}, dtype="fp8")
        >>> LaunchShape(1, 128, 32, 0, exp_fma_share=0.25, fma_flops_per_exp=14).work_on_pipes(w).flops
        {'tensor': 100.0, 'sfu': 6.0, 'cuda': 28.0}
        >>> LaunchShape(1, 128, 32, 0, tf32x3_flops=8.0).work_on_pipes(Work(flops={"cuda": 10.0}, dtype="fp16")).flops
        {'cuda': 2.0, 'tensor:tf32': 24.0}
        >>> LaunchShape(1, 128, 32, 0, products_on_cuda=True).work_on_pipes(Work(flops={"tensor": 10.0}, dtype="bf16")).flops
        {'cuda': 10.0}
        """
        flops = dict(work.flops)
        if self.products_on_cuda:
            for k in [k for k in flops if k.startswith("tensor")]:
                flops["cuda"] = float(flops.get("cuda", 0.0)) + float(flops.pop(k))
        sfu = float(flops.get("sfu", 0.0))
        if self.exp_fma_share and sfu:
            moved = sfu * float(self.exp_fma_share)
            flops["sfu"] = sfu - moved
            flops["cuda"] = float(flops.get("cuda", 0.0)) + moved * float(self.fma_flops_per_exp)
        moved = min(float(self.tf32x3_flops or 0.0), float(flops.get("cuda", 0.0)))
        if moved > 0:
            flops["cuda"] = flops["cuda"] - moved
            flops["tensor:tf32"] = flops.get("tensor:tf32", 0.0) + 3.0 * moved
        if flops == work.flops:
            return work
        return replace(work, flops=flops, reported_flops=work.flops_reported)

    @property
    def has_chain(self) -> bool:
        """Does the launch say anything about its latency chain (steps or reductions)?"""
        return any(getattr(self, k) is not None for k in ("stream_steps", "reductions", "reductions_per_step"))

    def with_cost_facts(self, kc: KernelCost | None) -> "LaunchShape":
        """This launch with the chain facts it leaves None taken from the kernel's cost."""
        if kc is None:
            return self
        facts = _chain_facts(kc)
        changes = {k: v for k, v in facts.items() if getattr(self, k) is None}
        return replace(self, **changes) if changes else self

    def efficiency(self, eff: Efficiency) -> Efficiency:
        """``eff`` with this launch's overlap flags where it sets them."""
        changes = {}
        if self.overlap_compute is not None:
            changes["overlap_compute"] = bool(self.overlap_compute)
        if self.overlap_operands is not None:
            changes["overlap_operands"] = bool(self.overlap_operands)
        if self.overlap_memory is not None:
            changes["overlap_memory"] = bool(self.overlap_memory)
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
    chain: "LatencyChain | None" = None  # one block's latency chain (what it adds: roofline.latency_s)
    launch_assumed: bool = False       # the launch is the one LaunchAssumptions stand for
    #: the epilogue phase after the loop (launch.epilogue_hbm_bytes): its roofline, added to
    #: ``roofline`` (which then prices the loop alone); None without one
    epilogue: Prediction | None = None
    epilogue_wait_s: float = 0.0  # the epilogue's waits for its loads (launch.epilogue_waits), every round
    tail_s: float = 0.0  # the rounds of L2 loads after every block's loop (launch.tail_l2_rounds), once

    @property
    def epilogue_s(self) -> float:
        """Seconds of the epilogue phase (0 without one)."""
        return self.epilogue.tail_body_s + self.epilogue_wait_s if self.epilogue is not None else 0.0

    @property
    def seconds(self) -> float:
        return max(self.roofline.seconds + self.epilogue_s,
                   self.latency_floor_s + self.roofline.launch_overhead_s) + self.tail_s

    @property
    def bound(self) -> str:
        """The roofline's bound (the epilogue's where that phase is the longer), or "latency" where
        the bytes-in-flight floor decides."""
        if self.latency_floor_s + self.roofline.launch_overhead_s > self.roofline.seconds + self.epilogue_s:
            return "latency"
        if self.epilogue is not None and self.epilogue_s > self.roofline.tail_body_s:
            return self.epilogue.bound
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
                "tensor_path": k.roofline.tensor_path, "wave_factor": k.roofline.wave_factor,
                "tail_resource": k.roofline.tail_resource, "latency_chain_s": k.roofline.latency_s,
                "epilogue_s": k.epilogue_s, "tail_s": k.tail_s,
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
    return LaunchShape(blocks=max(1, int(kc.groups)), threads=threads, regs_per_thread=regs, smem_bytes=smem,
                       **_chain_facts(kc))


def _chain_facts(kc: KernelCost) -> dict:
    """The latency-chain facts of a kernel's numeric cost (see :class:`LaunchShape`)."""
    stream = getattr(kc, "stream", None)
    steps = getattr(kc, "mean_steps", None)
    if steps is None:
        steps = kc.steps
    per_step = int(getattr(kc, "reductions_per_step", 0) or 0)
    facts = {"stream_steps": float(steps) if stream is not None else 0.0,
             "reductions": int(getattr(kc, "reductions", 0) or 0),
             "reductions_per_step": per_step}
    if per_step and float(kc.flops.get("tensor", 0) or 0) > 0:
        # rows reduced inside the loop of a tensor-core kernel live in mma accumulator fragments:
        # an m16n8 row is spread over the 4 threads of a quad (2 shuffle stages)
        facts["threads_per_row"] = MMA_ROW_THREADS
    return facts


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


#: The least share of L2 a kernel reads from HBM for :func:`latency_floor` to count only the HBM
#: share of its bytes in flight: below it the operands are found in L2 (H200, fp32, 77 x 1000 x 33:
#: counting the share there moved the plan from 16.0 to 19.3 us).
STREAMING_L2_SHARE = 0.25


def latency_floor(gpu: GPU, hbm_bytes: float, launch: LaunchShape | None, blocks_per_sm: int | None,
                  memory_latency_s: float | None = None, l2_bytes: float | None = None) -> float:
    """Little's law: the least time ``hbm_bytes`` take when the resident blocks, ``min(blocks,
    blocks_per_sm · SMs)`` of them, keep ``threads · in_flight_bytes_per_thread · (1 −
    idle_lanes)`` bytes each in flight per memory latency (0 when the launch does not say what
    it keeps in flight). Fewer blocks than slots bring only their own bytes in flight (a launch
    of 32 blocks on 132 SMs has 32 blocks' worth of memory-level parallelism). Idle lanes divide
    the bytes in flight, down to 5% of them. Where those bytes are all of a block's loads through L2
    (``launch.in_flight_through_l2``; ``l2_bytes`` in all), only the share that comes from HBM,
    ``hbm_bytes / l2_bytes``, waits on it (an operand every block re-reads from L2, a skinny
    product's few rows, brings no HBM bytes: H200, fp32, 8192 x 4096 by 8 rows on 32 x 32 tiles of
    64 threads, both operands' tiles in flight but half of them L2 hits: 141 us measured, the floor
    52 us without the share, 104 with it). Only a kernel that streams from HBM gets the share: one
    whose HBM bytes are under :data:`STREAMING_L2_SHARE` of L2 finds its operands there (written
    by the launch before it, re-read by its neighbours), and its floor stays as it was.

    >>> from napkin.perfmodel.hardware import get_gpu
    >>> g = get_gpu("h200")
    >>> shape = LaunchShape(256, 64, 128, 0, in_flight_bytes_per_thread=128, in_flight_through_l2=True)
    >>> round(latency_floor(g, 134e6, shape, 8, l2_bytes=268e6) / latency_floor(g, 134e6, shape, 8), 2)
    2.0
    """
    if launch is None or not launch.in_flight_bytes_per_thread or not blocks_per_sm or hbm_bytes <= 0:
        return 0.0
    latency = memory_latency_s if memory_latency_s is not None else getattr(gpu, "memory_latency_s",
                                                                            MEMORY_LATENCY_S)
    resident = min(int(launch.blocks), blocks_per_sm * gpu.sms)
    in_flight = resident * launch.threads * launch.in_flight_bytes_per_thread
    l2_capacity = gpu.level("L2").capacity_bytes if "L2" in gpu.level_names() else 0.0
    streams = hbm_bytes >= STREAMING_L2_SHARE * l2_capacity
    if launch.in_flight_through_l2 and streams and l2_bytes and l2_bytes > hbm_bytes:
        in_flight *= hbm_bytes / l2_bytes
    floor = hbm_bytes * latency / in_flight
    if launch.idle_lanes:
        floor /= max(0.05, 1.0 - launch.idle_lanes)
    return floor


@dataclass(frozen=True)
class LatencyChain:
    """One block's latency that it cannot overlap with its own work (seconds), by part.

    fill_s: the first load (a pipeline fill: ``GPU.memory_latency_s``), once per row iteration;
    steps_s: ``stream_steps × (step_overhead_clk + reductions_per_step × reduction latency)``;
    reduce_s: ``reductions × reduction latency``, once per row iteration;
    reduction_clk: the latency of one cross-thread reduction over ``threads_per_row`` threads.
    """

    fill_s: float
    steps_s: float
    reduce_s: float
    reduction_clk: float
    total_s: float

    def __str__(self) -> str:
        return (f"{self.total_s * 1e6:.3f} us (fill {self.fill_s * 1e6:.3f}, steps {self.steps_s * 1e6:.3f}, "
                f"reductions {self.reduce_s * 1e6:.3f})")


def reduction_latency_clk(gpu: GPU, threads_per_row: int | None) -> float:
    """Clocks of one dependent cross-thread reduction over ``threads_per_row`` threads (None: a
    warp): ``ceil(log2(min(T, 32)))`` shuffle stages, and beyond a warp one cross-warp stage
    (``sync_latency_clk``) and ``ceil(log2(warps))`` more shuffles. 0 for one thread."""
    t = 32 if threads_per_row is None else max(1, int(threads_per_row))
    shuffle = float(getattr(gpu, "shuffle_latency_clk", 0.0))
    clk = math.ceil(math.log2(min(t, 32))) * shuffle if t > 1 else 0.0
    if t > 32:
        warps = -(-t // 32)
        clk += float(getattr(gpu, "sync_latency_clk", 0.0)) + math.ceil(math.log2(warps)) * shuffle
    return clk


def block_latency(gpu: GPU, launch: LaunchShape | None, memory_latency_s: float | None = None) -> LatencyChain | None:
    """The latency chain of one block of ``launch`` (None when the launch says nothing of it):
    ``(fill + reductions × L_red) × row_iterations + stream_steps × (step_overhead +
    reductions_per_step × L_red)``, with the fill ``row_round_trips`` times ``gpu.memory_latency_s``
    (or ``memory_latency_s``) and ``row_l2_rounds`` times ``gpu.l2_round_clk``, and ``L_red`` from
    :func:`reduction_latency_clk`."""
    if launch is None or not launch.has_chain:
        return None
    latency = memory_latency_s if memory_latency_s is not None else getattr(gpu, "memory_latency_s",
                                                                            MEMORY_LATENCY_S)
    red = reduction_latency_clk(gpu, launch.threads_per_row)
    steps = float(launch.stream_steps or 0.0)
    per_step = float(getattr(gpu, "step_overhead_clk", 0.0)) + (launch.reductions_per_step or 0) * red
    rows = int(launch.row_iterations)
    l2_round = float(getattr(gpu, "l2_round_clk", 0.0)) * int(launch.row_l2_rounds)
    fill = (latency * int(launch.row_round_trips) + l2_round / gpu.clock_hz) * rows
    steps_s = gpu.clocks_to_s(steps * per_step) if hasattr(gpu, "clocks_to_s") else steps * per_step / gpu.clock_hz
    reduce_s = (launch.reductions or 0) * red * rows / gpu.clock_hz
    return LatencyChain(fill, steps_s, reduce_s, red, fill + steps_s + reduce_s)


def predict_kernel(gpu: GPU, work: Work, launch: LaunchShape | None = None, *, name: str = "kernel",
                   efficiency: Efficiency = Efficiency(), memory_latency_s: float | None = None,
                   launch_overhead_s: float | None = None, launch_assumed: bool = False) -> KernelPrediction:
    """One kernel: residency from its launch (CUDA occupancy rules), the roofline with the per-SM
    tail, the instruction path and overlap the launch states, the block's latency chain
    (:func:`block_latency`, when the launch states one) and the latency floor.

    Without a launch: the plain roofline (no tail, no chain, no floor). ScheduleError when one
    block of the launch does not fit an SM.
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
    chain = block_latency(gpu, launch, memory_latency_s)
    work = launch.work_on_pipes(work)  # exponentials on the FMA pipe, fp32 sums on the tensor cores
    loop, epi = _phases(work, float(launch.epilogue_hbm_bytes or 0.0), bool(launch.epilogue_maps))
    rp = predict(gpu, loop, blocks=int(launch.blocks), blocks_per_sm=bps, efficiency=eff,
                 launch_overhead_s=launch_overhead_s, tensor_path=launch.tensor_path,
                 block_latency_s=(chain.fill_s + chain.reduce_s) if chain is not None else 0.0,
                 block_issue_s=chain.steps_s if chain is not None else 0.0, tail_factor=launch.tail_factor,
                 issue_overlaps_memory=launch.issue_overlaps_memory,
                 fill_share=exposed_fill_share(float(launch.fill_share), bps),
                 tensor_floor_s=float(launch.tensor_chain_s))
    ep = None
    if epi is not None:
        # the epilogue's roofline, its compute stretched by the tail like the loop's; its maps run
        # before the block's barrier and its stores after it, so they add (as do those of its
        # co-resident blocks, in step with it)
        rate = float(launch.epilogue_rate)
        ep = predict(gpu, epi, blocks=int(launch.blocks), blocks_per_sm=bps,
                     efficiency=replace(eff, overlap_memory=False, cuda=eff.cuda * rate, sfu=eff.sfu * rate),
                     launch_overhead_s=0.0, tail_factor=launch.tail_factor)
    wait = 0.0
    if ep is not None and launch.epilogue_waits:
        latency = memory_latency_s if memory_latency_s is not None else getattr(gpu, "memory_latency_s",
                                                                                MEMORY_LATENCY_S)
        wait = int(launch.epilogue_waits) * (ep.rounds or 1) * latency
    floor = latency_floor(gpu, float(work.bytes.get("HBM", 0.0)), launch, bps, memory_latency_s,
                          float(work.bytes.get("L2", 0.0)) or None)
    tail = gpu.clocks_to_s(int(launch.tail_l2_rounds) * float(getattr(gpu, "l2_round_clk", 0.0)))
    return KernelPrediction(name, int(launch.blocks), bps or 1, regs, int(launch.smem_bytes), limit, rp,
                            floor, launch, chain, launch_assumed, ep, wait, tail)


#: Co-resident blocks an SM holds whose fills stay in step: beyond them, blocks that started together
#: drift apart and hide part of each other's fill, in proportion. Fitted to three H200 measurements
#: (bf16 mma.sync tiles, kernel time against the model with and without the fill): 512 products of
#: 128^3 at 2 blocks an SM paid all of it (18.2 us of kernel), 2048 of 64^3 at 4 about half
#: (14.7), 16384 of 16^3 at 12 about a sixth (24.1).
FILL_LOCKED_BLOCKS = 2


def exposed_fill_share(fill_share: float, blocks_per_sm: int | None) -> float:
    """The share of a loop's smaller time its ring's fill exposes (:attr:`LaunchShape.fill_share`)
    on an SM holding ``blocks_per_sm`` blocks: all of it up to :data:`FILL_LOCKED_BLOCKS` blocks,
    then divided among them.

    >>> exposed_fill_share(1.0, 2), exposed_fill_share(1.0, 4), exposed_fill_share(0.5, 8)
    (1.0, 0.5, 0.125)
    """
    bps = max(1, int(blocks_per_sm or 1))
    return fill_share * min(1.0, FILL_LOCKED_BLOCKS / bps)


def _phases(work: Work, epilogue_bytes: float, maps: bool = False) -> tuple[Work, Work | None]:
    """``work`` split into the loop's and the epilogue's (:class:`LaunchShape.epilogue_hbm_bytes`):
    the epilogue takes those HBM bytes (at most all of them), the same bytes of L2 traffic (its
    stores and reads pass through L2 on their way: left in the loop, they were counted twice, and
    a product whose loop is short, K = 64 over a 12800 x 3072 output, was priced 38.9 us where it
    ran 24.2 on an H200) and the CUDA-core and SFU work; the loop keeps the rest. ``maps``
    (:attr:`LaunchShape.epilogue_maps`) makes a phase of the CUDA-core and SFU work alone where
    no bytes move after the loop. ``(work, None)`` without an epilogue phase.

    >>> w = Work(flops={"tensor": 8.0, "cuda": 2.0}, bytes={"HBM": 10.0, "L2": 12.0}, dtype="bf16")
    >>> loop, epi = _phases(w, 6.0)
    >>> loop.flops, loop.bytes, epi.flops, epi.bytes
    ({'tensor': 8.0}, {'HBM': 4.0, 'L2': 6.0}, {'cuda': 2.0}, {'HBM': 6.0, 'L2': 6.0})
    >>> loop, epi = _phases(w, 0.0, maps=True)
    >>> loop.flops, loop.bytes, epi.flops, epi.bytes
    ({'tensor': 8.0}, {'HBM': 10.0, 'L2': 12.0}, {'cuda': 2.0}, {})
    >>> _phases(Work(flops={"tensor": 8.0}, dtype="bf16"), 0.0, maps=True)[1] is None
    True
    """
    epi_kinds = ("cuda", "sfu")
    if epilogue_bytes <= 0:
        if not maps or not any(float(work.flops.get(k, 0.0)) > 0 for k in epi_kinds):
            return work, None
        loop = replace(work, flops={k: v for k, v in work.flops.items() if k not in epi_kinds})
        return loop, replace(work, flops={k: v for k, v in work.flops.items() if k in epi_kinds}, bytes={})
    moved = min(epilogue_bytes, float(work.bytes.get("HBM", 0.0)))
    through_l2 = min(moved, float(work.bytes.get("L2", 0.0)))
    loop_bytes = {**work.bytes, "HBM": float(work.bytes.get("HBM", 0.0)) - moved}
    epi_bytes = {"HBM": moved}
    if "L2" in work.bytes:
        loop_bytes["L2"] = float(work.bytes["L2"]) - through_l2
        epi_bytes["L2"] = through_l2
    loop = replace(work, flops={k: v for k, v in work.flops.items() if k not in epi_kinds}, bytes=loop_bytes)
    epi = replace(work, flops={k: v for k, v in work.flops.items() if k in epi_kinds}, bytes=epi_bytes)
    return loop, epi


@dataclass(frozen=True)
class PreparedKernel:
    """What one kernel's prediction needs: its name, its Work and its launch."""

    name: str
    work: Work
    launch: LaunchShape | None       # None: no launch facts (plain roofline, no waves, no floor)
    assumed: bool = False            # the launch is the one LaunchAssumptions stand for


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
    for every kernel, or one per kernel; latency-chain facts it leaves None come from the
    kernel's cost, :meth:`LaunchShape.with_cost_facts`) or, without it, the launch ``assume``
    stands for (``assume=None``: no launch facts at all, the plain roofline)."""
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
    assumed = launch is None and assume is not None
    launches = [ls.with_cost_facts(kc) if ls is not None else None for kc, ls in zip(kernels, launches)]
    dtype = getattr(schedule, "dtype", "bf16")
    return PreparedSchedule(tuple(PreparedKernel(kc.name, kernel_work(kc, dtype), ls, assumed and ls is not None)
                                  for kc, ls in zip(kernels, launches)), c)


def predict_prepared(prepared: PreparedSchedule, gpu: GPU, *, efficiency: Efficiency = Efficiency(),
                     family: str | None = None, memory_latency_s: float | None = None,
                     launch_overhead_s: float | None = None) -> SchedulePrediction:
    """The prediction of a :class:`PreparedSchedule` on ``gpu`` (see :func:`predict_schedule`)."""
    eff = family_efficiency(gpu, family, efficiency)
    preds = tuple(predict_kernel(gpu, k.work, k.launch, name=k.name, efficiency=eff,
                                 memory_latency_s=memory_latency_s, launch_overhead_s=launch_overhead_s,
                                 launch_assumed=getattr(k, "assumed", False))
                  for k in prepared.kernels)
    c = prepared.cost
    return SchedulePrediction(sum(p.seconds for p in preds), float(c.total_flops),
                              float(c.levels["HBM"].H_bytes), preds, c)


def predict_schedule(schedule, gpu: GPU | str | None = None, *, sizes=None, the_cost: Cost | None = None,
                     efficiency: Efficiency = Efficiency(), assume: LaunchAssumptions | None = LaunchAssumptions(),
                     l2_caching: bool = True, launch: LaunchShape | Sequence[LaunchShape] | None = None,
                     family: str | None = None, memory_latency_s: float | None = None,
                     launch_overhead_s: float | None = None) -> SchedulePrediction:
    """Predict the runtime of ``schedule`` on ``gpu`` (numeric sizes needed).

    ``launch``: the kernels' :class:`LaunchShape` (one for all, or one per kernel); default: the
    launch :class:`LaunchAssumptions` stand for (no bytes-in-flight floor, the peak tensor path,
    the overlap of ``efficiency``; ``assume=None``: no launch facts, the plain roofline). ``family``: apply the profile's calibrated fractions for that
    code-generation family. ``memory_latency_s``: the latency of the floor (default
    ``gpu.memory_latency_s``). ``launch_overhead_s``: per kernel (None: ``gpu.launch_overhead_s``).
    """
    g = _gpu_of(schedule, gpu)
    prepared = prepare_schedule(schedule, g, sizes=sizes, the_cost=the_cost, assume=assume,
                                l2_caching=l2_caching, launch=launch)
    return predict_prepared(prepared, g, efficiency=efficiency, family=family, memory_latency_s=memory_latency_s,
                            launch_overhead_s=launch_overhead_s)


# ----------------------------------------------------------------------------- assumptions


def explain_assumptions(gpu: GPU | str, prediction: SchedulePrediction | None = None, *,
                        kernels: Sequence[KernelPrediction] = ()) -> list[tuple[str, object, str]]:
    """Every number the prediction uses that is not a datasheet fact, as ``(name, value,
    source)`` rows, for ``napkin cost --explain``.

    Always listed (named fields of the GPU profile, :class:`~napkin.perfmodel.hardware.GPU`):
    ``memory_latency_s`` (the latency floor and the pipeline fill), ``step_overhead_clk``,
    ``shuffle_latency_clk`` and ``sync_latency_clk`` (the latency chain), ``mma_sync_fraction``,
    ``launch_overhead_s``,
    the bandwidths of levels whose profile entry is an estimate or a measurement (``L2.bandwidth``,
    ``SMEM.bandwidth``, ...), the profile's calibrated ``efficiency[family].fraction`` factors and
    ``measured.*`` results, :data:`MMA_ROW_THREADS`, and the
    :class:`LaunchAssumptions` defaults. Each source comes from the profile (``GPU.source_of``,
    ``Level.assumption``) or from this module.

    With a ``prediction``: its launch overhead, the efficiency fractions and overlap flags it
    ran under where they differ from 1.0 / True, and per kernel (``kernel[<name>].<field>``)
    the :class:`LaunchShape` facts it used (threads per row, stream steps, reductions, bytes in
    flight, idle lanes, tensor path, overlap overrides), saying whether the launch was given
    by a family or assumed (:class:`LaunchAssumptions`) and whether a value was filled from the
    cost model. ``kernels``: the same per-kernel facts for kernels predicted one by one (a plan's,
    each with its family's launch), where there is no one prediction of the whole schedule.
    """
    g = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    rows: list[tuple[str, object, str]] = []
    for name in ("memory_latency_s", "step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk",
                 "mma_sync_fraction", "wgmma_step_clk", "l2_round_clk"):
        if hasattr(g, name):
            rows.append((name, getattr(g, name), g.source_of(name)))
    for lv in g.levels:
        a = lv.assumption.lower()
        if any(w in a for w in ("estimate", "measured", "calibrat")):
            rows.append((f"{lv.name}.bandwidth", lv.bandwidth, lv.assumption))
    for fam, fr in sorted(g.efficiency.items()):
        for k, v in sorted(fr.items()):
            rows.append((f"efficiency[{fam}].{k}", v, g.source_of("efficiency")))
    for k, v in sorted(g.measured.items()):
        rows.append((f"measured.{k}", v, g.sources.get(f"measured.{k}") or f"measured ({g.source})"))
    launch_s = launch_overhead_of(g)
    src = g.source_of("launch_overhead_s")
    kernels = tuple(prediction.kernels) if prediction is not None else tuple(kernels)
    if kernels:
        used = kernels[0].roofline.launch_overhead_s
        if used != launch_s:
            launch_s, src = used, "given by the caller (launch_overhead_s=)"
    rows.append(("launch_overhead_s", launch_s, src))
    rows.append(("MMA_ROW_THREADS", MMA_ROW_THREADS,
                 "PTX ISA: an mma.m16n8 accumulator row is held by the 4 threads of a quad (the width of "
                 "a row reduction on tensor-core accumulators when a launch does not say)"))
    rows.append(("FILL_LOCKED_BLOCKS", FILL_LOCKED_BLOCKS,
                 "fitted: co-resident blocks an SM holds whose ring fills stay in step (more hide part of "
                 "the fill, in proportion); three H200 bf16 mma.sync measurements at 2, 4 and 12 blocks an SM"))
    la = LaunchAssumptions()
    for f in ("threads_per_block", "max_threads_per_block", "target_regs_per_thread", "base_regs_per_thread"):
        rows.append((f"LaunchAssumptions.{f}", getattr(la, f),
                     "assumption: the launch the model stands in for a kernel no family describes"))
    if not kernels:
        return rows
    base = Efficiency()
    seen_eff = set()
    for kp in kernels:
        eff = kp.roofline.efficiency
        for f in ("tensor", "cuda", "sfu", "hbm", "l2", "smem", "rf", "overlap_compute", "overlap_memory",
                  "overlap_operands"):
            v = getattr(eff, f)
            if v != getattr(base, f) and (f, v) not in seen_eff:
                seen_eff.add((f, v))
                rows.append((f"Efficiency.{f}", v, "given: efficiency fractions and overlap the prediction ran "
                             "under (calibrated per family, a family's execution facts, or the caller's)"))
        ls = kp.launch
        if ls is None:
            continue
        who = ("assumed (LaunchAssumptions)" if kp.launch_assumed else "given by the kernel's family "
               "(launch_estimate)")
        pre = f"kernel[{kp.name}]"
        rows.append((f"{pre}.threads_per_row", ls.threads_per_row if ls.threads_per_row is not None else 32,
                     who if ls.threads_per_row is not None else "assumed: a warp (32) reduces a row when the "
                     "launch does not say"))
        for f in ("stream_steps", "reductions", "reductions_per_step", "row_iterations"):
            v = getattr(ls, f)
            if v is not None:
                rows.append((f"{pre}.{f}", v, f"{who}; None fields filled from the kernel's cost"))
        if ls.row_round_trips != 1 or ls.row_l2_rounds:
            rows.append((f"{pre}.row_round_trips", ls.row_round_trips,
                         f"{who}: memory round trips a row iteration waits for one after another"))
            rows.append((f"{pre}.row_l2_rounds", ls.row_l2_rounds,
                         f"{who}: dependent L2 round trips a row iteration waits for besides"))
        if ls.in_flight_bytes_per_thread:
            rows.append((f"{pre}.in_flight_bytes_per_thread", ls.in_flight_bytes_per_thread, who))
        if ls.tail_l2_rounds:
            rows.append((f"{pre}.tail_l2_rounds", ls.tail_l2_rounds,
                         f"{who}: dependent rounds of L2 loads after the loop (an in-kernel combine)"))
        if ls.epilogue_hbm_bytes:
            rows.append((f"{pre}.epilogue_hbm_bytes", ls.epilogue_hbm_bytes,
                         f"{who}: moved after the loop, not overlapped with it"))
        if ls.epilogue_rate != 1.0:
            rows.append((f"{pre}.epilogue_rate", ls.epilogue_rate,
                         f"{who}: the share of the CUDA-core and SFU rates the epilogue's maps reach"))
        if ls.epilogue_maps:
            rows.append((f"{pre}.epilogue_maps", ls.epilogue_maps,
                         f"{who}: the maps run after the loop, not overlapped with it"))
        if ls.epilogue_waits:
            rows.append((f"{pre}.epilogue_waits", ls.epilogue_waits,
                         f"{who}: loads the epilogue waits for, a memory latency each a round"))
        if ls.idle_lanes:
            rows.append((f"{pre}.idle_lanes", ls.idle_lanes, who))
        if ls.tensor_path != "peak":
            rows.append((f"{pre}.tensor_path", ls.tensor_path, who))
        for f in ("overlap_compute", "overlap_operands"):
            if getattr(ls, f) is not None:
                rows.append((f"{pre}.{f}", getattr(ls, f), who))
        if ls.issue_overlaps_memory:
            rows.append((f"{pre}.issue_overlaps_memory", True,
                         f"{who}: its loads run ahead of the loop's step overheads, which count on the "
                         "compute side"))
        if ls.fill_share:
            rows.append((f"{pre}.fill_share", ls.fill_share,
                         f"{who}: the share of the loop's smaller time (compute or HBM) its ring's fill "
                         "and drain leave exposed"))
        if kp.chain is not None:
            rows.append((f"{pre}.latency_chain_s", kp.chain.total_s,
                         "derived: fill + step overheads + reductions from the fields above"))
    return rows
