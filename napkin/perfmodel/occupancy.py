"""Occupancy and per-step pipeline analysis (docs/architecture.md §4.4).

Three tools:

* :func:`units_per_sm` — the paper's rule: units (warps or warpgroups) per SM =
  min over resources of (capacity − per-block use) / per-unit use.
* :func:`occupancy` — the CUDA occupancy calculator's rule for an ordinary kernel launch
  (blocks per SM from warps, registers with allocation granularity, shared memory, block limit).
* :func:`hopper_attention_analysis` / :func:`ampere_attention_analysis` — the paper's worked
  FlashAttention configurations, every figure derived from the configuration and the profile;
  :func:`compute_bound_thresholds` — the §4.4 thresholds.

Units: every memory size is in bytes in the fields and in KiB (1024 B) in printed text
("48.00 KiB"). docs/architecture.md §4.4 and the paper write "48 KB" for 49,152 B (that is, KiB) but "74.75
KB" for the 74,752 B of registers a warpgroup holds (decimal kB): to reproduce the paper's
"3.4 warpgroups by registers", ``register_convention="paper"`` divides the 256 KiB register file
by 74.75 (see :func:`hopper_attention_analysis`), and the text says so next to the KiB figure
(73.00 KiB). Everything else (SMEM on both sides, the consistent-bytes register figure 3.51) is
in bytes.

>>> from napkin.perfmodel.hardware import get_gpu
>>> a = hopper_attention_analysis(get_gpu("h100"))
>>> round(a.warpgroups_by_smem, 1), round(a.warpgroups_by_registers, 1), a.warpgroups, a.g_q
(3.7, 3.4, 3, 384)
>>> round(a.compute_clocks), a.bound
(2304, 'compute')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from ..dtypes import dtype as _dtype
from ..errors import HardwareError
from .hardware import GPU

__all__ = [
    "OccupancyResult",
    "units_per_sm",
    "LaunchOccupancy",
    "occupancy",
    "AttentionAnalysis",
    "hopper_attention_analysis",
    "ampere_attention_analysis",
    "Thresholds",
    "compute_bound_thresholds",
    "KB_DECIMAL",
    "KIB",
]

KIB = 1024
KB_DECIMAL = 1000

WARP = 32
WARPGROUP = 128


# ---------------------------------------------------------------------- §4.4 rule


@dataclass(frozen=True)
class OccupancyResult:
    """Units (warps or warpgroups) per SM, resource by resource.

    per_resource: each resource's fractional units, (capacity − per_block) / per_unit
                  (inf when the unit uses none of it; 0 when the block alone does not fit).
    limiting:     the resource with the smallest value.
    units:        that smallest fractional value (e.g. 3.4).
    floor:        whole units that fit (e.g. 3), capped by ``max_units`` when given.
    """

    per_resource: dict[str, float]
    limiting: str
    units: float
    floor: int
    resources: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def __str__(self) -> str:
        parts = ", ".join(f"{k}: {v:.2f}" for k, v in self.per_resource.items())
        return f"{self.floor} units per SM (limited by {self.limiting}; {parts})"


def units_per_sm(
    resources: Mapping[str, tuple[float, float, float]], max_units: int | None = None
) -> OccupancyResult:
    """docs/architecture.md §4.4: units per SM = min over resources of (capacity − per-block use) / per-unit use.

    ``resources`` maps a name to ``(capacity, per_block, per_unit)`` in any consistent unit per
    resource. The fractional value of every resource is kept, with the limiting one and the floor.
    ``max_units`` (e.g. the hardware warp limit) caps the floor and counts as a resource "max".
    """
    if not resources:
        raise HardwareError("units_per_sm needs at least one resource")
    per: dict[str, float] = {}
    for name, triple in resources.items():
        try:
            capacity, per_block, per_unit = (float(x) for x in triple)
        except (TypeError, ValueError):
            raise HardwareError(
                f"resource {name!r}: expected (capacity, per_block, per_unit), got {triple!r}"
            ) from None
        if capacity < 0 or per_block < 0 or per_unit < 0:
            raise HardwareError(f"resource {name!r}: negative amounts {triple!r}")
        free = capacity - per_block
        if free < 0:
            per[name] = 0.0
        elif per_unit == 0:
            per[name] = math.inf
        else:
            per[name] = free / per_unit
    if max_units is not None:
        per["max"] = float(max_units)
    limiting = min(per, key=lambda k: per[k])
    units = per[limiting]
    if not math.isfinite(units):
        raise HardwareError("units_per_sm: no resource limits the units (every per-unit use is 0)")
    floor = 0 if units <= 0 else int(math.floor(units + 1e-9))
    return OccupancyResult(per_resource=per, limiting=limiting, units=units, floor=floor,
                           resources={k: tuple(map(float, v)) for k, v in resources.items()})


# ---------------------------------------------------------------------- CUDA occupancy calculator


@dataclass(frozen=True)
class LaunchOccupancy:
    """Blocks and warps per SM of a launch, as the CUDA occupancy calculator computes them."""

    blocks_per_sm: int
    warps_per_sm: int
    limiting: str                    # "warps", "registers", "smem" or "blocks"
    per_limit: dict[str, int]        # blocks per SM allowed by each limit
    warps_per_block: int
    regs_per_warp: int               # after rounding to the allocation unit
    smem_per_block: int              # after rounding, including the driver's reserved bytes
    occupancy: float                 # warps_per_sm / max_warps_per_sm


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit if unit > 1 else x


def occupancy(gpu: GPU, threads_per_block: int, regs_per_thread: int, smem_per_block: int = 0) -> LaunchOccupancy:
    """Blocks per SM for a launch (Ampere/Hopper rules of the CUDA occupancy calculator).

    Registers: per warp ``regs_per_thread * 32`` rounded up to ``gpu.reg_alloc_unit`` (256);
    warps that fit = floor(register file / per-warp allocation); blocks = floor(warps / warps per
    block). Shared memory: per block rounded up to ``gpu.smem_alloc_unit`` plus
    ``gpu.smem_reserved_per_block`` (1 KiB on sm_80+), against the SM's capacity; a block over
    the per-block maximum fits 0 times. Warps: floor(max warps / warps per block). Blocks: the
    per-SM block limit.
    """
    if threads_per_block <= 0 or threads_per_block > gpu.max_threads_per_block:
        raise HardwareError(
            f"threads_per_block={threads_per_block} outside 1..{gpu.max_threads_per_block} on {gpu.key}")
    if regs_per_thread <= 0 or regs_per_thread > gpu.max_regs_per_thread:
        raise HardwareError(
            f"regs_per_thread={regs_per_thread} outside 1..{gpu.max_regs_per_thread} on {gpu.key}")
    if smem_per_block < 0:
        raise HardwareError("smem_per_block must be non-negative")
    warps_per_block = -(-threads_per_block // WARP)

    per_limit: dict[str, int] = {}
    per_limit["warps"] = gpu.max_warps_per_sm // warps_per_block

    regs_file = gpu.regs_per_sm_bytes // 4
    regs_per_warp = _round_up(regs_per_thread * WARP, gpu.reg_alloc_unit)
    per_limit["registers"] = (regs_file // regs_per_warp) // warps_per_block

    smem = gpu.level("SMEM")
    if smem_per_block > 0:
        smem_alloc = _round_up(int(smem_per_block), gpu.smem_alloc_unit) + gpu.smem_reserved_per_block
    else:
        smem_alloc = gpu.smem_reserved_per_block
    if smem.per_block_bytes is not None and smem_per_block > smem.per_block_bytes:
        per_limit["smem"] = 0
    else:
        per_limit["smem"] = int(smem.capacity_bytes // smem_alloc) if smem_alloc else gpu.max_blocks_per_sm

    per_limit["blocks"] = gpu.max_blocks_per_sm
    limiting = min(per_limit, key=lambda k: per_limit[k])
    blocks = per_limit[limiting]
    warps = blocks * warps_per_block
    return LaunchOccupancy(
        blocks_per_sm=blocks, warps_per_sm=warps, limiting=limiting, per_limit=per_limit,
        warps_per_block=warps_per_block, regs_per_warp=regs_per_warp, smem_per_block=smem_alloc,
        occupancy=warps / gpu.max_warps_per_sm,
    )


# ---------------------------------------------------------------------- attention analyses


@dataclass(frozen=True)
class AttentionAnalysis:
    """Every intermediate figure of the paper's per-SM attention accounting (docs/architecture.md §4.4).

    One *unit* is a warpgroup (Hopper, wgmma, 128 threads) or a warp (Ampere, mma.sync, 32
    threads); a unit owns ``w_q`` query rows. Per SM, ``units`` of them hold ``g_q = units * w_q``
    query rows; every step streams ``s_x`` keys/values through SMEM.
    """

    gpu: str
    design: str                      # "hopper-wgmma" or "ampere-mma.sync"
    unit: str                        # "warpgroup" or "warp"
    threads_per_unit: int
    w_q: int
    s_x: int
    d: int
    qk_dtype: str
    pv_dtype: str
    p_dtype: str
    stages: int
    # SMEM
    smem_k_chunk_bytes: int          # s_x * d * qk bytes
    smem_v_chunk_bytes: int          # s_x * d * pv bytes
    smem_per_block_bytes: int        # (K + V chunks) * stages [+ shared Q tile on Ampere]
    smem_q_tile_bytes: int           # w_q * d * qk bytes, per unit
    smem_o_staging_bytes: int        # w_q * d * pv bytes, per unit (0 if not staged)
    smem_per_unit_bytes: int
    smem_capacity_bytes: float       # the per-block maximum (227 KiB on Hopper)
    # registers, per thread of a unit
    regs_o_acc: int                  # w_q * d / threads fp32 accumulators
    regs_p: int                      # w_q * s_x / threads values of P at p_dtype, in 32-bit regs
    regs_stats: int                  # running max and sum
    regs_extra: int                  # extra_regs_per_thread (addresses, indices, ...), 0 by default
    regs_per_thread: int
    registers_per_unit_bytes: int    # regs_per_thread * 4 * threads
    register_capacity_bytes: int
    register_convention: str
    # units per SM
    occupancy: OccupancyResult
    units_by_smem: float
    units_by_registers: float
    units_by_registers_bytes: float  # the same with consistent bytes on both sides
    units: int
    blocks_per_sm: int               # 1 on Hopper (one block, several warpgroups); whole blocks on Ampere
    g_q: int
    # one s_x step, per SM
    flops_qk_per_step: float         # 2 * g_q * s_x * d
    flops_pv_per_step: float         # 2 * g_q * s_x * d
    qk_flops_per_clk: float          # tensor_rate(qk) / (sms * clock)
    pv_flops_per_clk: float
    compute_clocks: float
    compute_s: float
    hbm_bytes_per_step: float        # sms * [blocks per SM] * s_x * d * (qk + pv bytes)
    hbm_s: float
    bound: str                       # "compute" or "memory"
    step_s: float                    # max(compute_s, hbm_s): loads overlap compute
    exps_per_step: float             # g_q * s_x, on the SFU (reported, not in the bound)
    sfu_clocks: float
    throughput_flops: float          # sms * (flops_qk + flops_pv) / step_s
    peak_flops: float                # tensor_rate(qk_dtype)
    fraction_of_peak: float

    # Hopper-flavoured names for the same figures
    @property
    def warpgroups_by_smem(self) -> float:
        return self.units_by_smem

    @property
    def warpgroups_by_registers(self) -> float:
        return self.units_by_registers

    @property
    def warpgroups(self) -> int:
        return self.units

    @property
    def warps_by_smem(self) -> float:
        return self.units_by_smem

    @property
    def warps_by_registers(self) -> float:
        return self.units_by_registers

    @property
    def warps(self) -> int:
        return self.units

    @property
    def flops_per_step(self) -> float:
        return self.flops_qk_per_step + self.flops_pv_per_step

    @property
    def smem_per_block_kib(self) -> float:
        return self.smem_per_block_bytes / KIB

    @property
    def smem_per_unit_kib(self) -> float:
        return self.smem_per_unit_bytes / KIB

    @property
    def registers_per_unit_kib(self) -> float:
        return self.registers_per_unit_bytes / KIB

    def summary(self) -> str:
        """The analysis as text; memory sizes in KiB (the module docstring states the convention)."""
        kb = KIB
        if self.register_convention == "paper":
            regs_note = (f"the paper's {self.registers_per_unit_bytes / KB_DECIMAL:.2f} KB, decimal kB, against the "
                         f"{self.register_capacity_bytes / kb:.0f} KiB register file; "
                         f"{self.units_by_registers_bytes:.2f} with KiB on both sides")
        else:
            regs_note = f"KiB on both sides, {self.register_capacity_bytes / kb:.0f} KiB register file"
        lines = [
            f"{self.design} attention on {self.gpu}: w_q={self.w_q}, s_x={self.s_x}, d={self.d}, "
            f"QK {self.qk_dtype}, PV {self.pv_dtype}, {self.stages} stage(s) (sizes in KiB = 1024 B)",
            f"  SMEM per block {self.smem_per_block_bytes / kb:.2f} KiB, per {self.unit} "
            f"{self.smem_per_unit_bytes / kb:.2f} KiB (of {self.smem_capacity_bytes / kb:.2f} KiB per block); "
            f"registers per {self.unit} {self.registers_per_unit_bytes / kb:.2f} KiB "
            f"({self.registers_per_unit_bytes:,} B, {self.regs_per_thread} regs/thread)",
            f"  {self.unit}s per SM: {self.units_by_smem:.2f} by SMEM, {self.units_by_registers:.2f} by "
            f"registers ({regs_note}) -> {self.units}, g_q = {self.g_q}",
            f"  per step: compute {self.compute_clocks:.0f} clk = {self.compute_s * 1e6:.3f} us, "
            f"HBM {self.hbm_s * 1e6:.3f} us -> {self.bound}-bound; SFU {self.sfu_clocks:.0f} clk",
            f"  throughput {self.throughput_flops / 1e12:.1f} TFLOP/s = "
            f"{self.fraction_of_peak:.3f} of the {self.peak_flops / 1e12:.1f} TFLOP/s {self.qk_dtype} peak",
        ]
        return "\n".join(lines)

    __str__ = summary


def _regs(values: float, bytes_per_value: int) -> int:
    """32-bit registers needed for ``values`` values of ``bytes_per_value`` bytes each."""
    return math.ceil(values * bytes_per_value / 4)


def _analysis(
    gpu: GPU, *, design: str, unit: str, threads: int, w_q: int, s_x: int, d: int,
    qk_dtype: str, pv_dtype: str, p_dtype: str | None, stages: int,
    smem_per_block_extra: int, o_staging: bool, q_in_unit: bool,
    register_convention: str, units_per_block: int | None, extra_regs_per_thread: int = 0,
) -> AttentionAnalysis:
    for name, v in (("w_q", w_q), ("s_x", s_x), ("d", d), ("stages", stages)):
        if int(v) != v or v <= 0:
            raise HardwareError(f"{name} must be a positive integer, got {v!r}")
    qk, pv = _dtype(qk_dtype), _dtype(pv_dtype)
    p = _dtype(p_dtype) if p_dtype is not None else qk
    if register_convention not in ("paper", "bytes"):
        raise HardwareError("register_convention must be 'paper' or 'bytes'")

    # ---- SMEM
    k_chunk = s_x * d * qk.bytes
    v_chunk = s_x * d * pv.bytes
    smem_block = (k_chunk + v_chunk) * stages + smem_per_block_extra
    q_tile = w_q * d * qk.bytes if q_in_unit else 0
    o_stage = w_q * d * pv.bytes if o_staging else 0
    smem_unit = q_tile + o_stage
    smem_level = gpu.level("SMEM")
    smem_cap = smem_level.per_block_bytes or smem_level.capacity_bytes

    # ---- registers, per thread of one unit
    regs_o = _regs(w_q * d / threads, 4)           # fp32 accumulators
    regs_p = _regs(w_q * s_x / threads, p.bytes)   # P tile at p_dtype
    regs_stats = 2 * math.ceil(w_q / threads)      # running max and running sum per owned row
    if extra_regs_per_thread < 0:
        raise HardwareError("extra_regs_per_thread must be non-negative")
    regs_thread = regs_o + regs_p + regs_stats + int(extra_regs_per_thread)
    reg_bytes = regs_thread * 4 * threads
    reg_cap = gpu.regs_per_sm_bytes

    # Unit convention (documented in hopper_attention_analysis): "paper" counts the register demand
    # in decimal kB (74,752 B -> 74.75 KB) against the register file in KiB (256 KiB), as the
    # paper's 256 / 74.75 = 3.4 does; "bytes" uses bytes on both sides (262,144 / 74,752 = 3.51).
    if register_convention == "paper":
        reg_resource = (reg_cap / KIB, 0.0, reg_bytes / KB_DECIMAL)
    else:
        reg_resource = (float(reg_cap), 0.0, float(reg_bytes))
    occ = units_per_sm({
        "SMEM": (smem_cap, smem_block, smem_unit),
        "RF": reg_resource,
    }, max_units=gpu.max_warps_per_sm * WARP // threads)
    by_regs_bytes = reg_cap / reg_bytes
    units = occ.floor
    blocks_per_sm = 1
    if units_per_block:
        # Several blocks per SM: each block brings its own K/V buffers, so SMEM is counted per
        # block against the SM's capacity (the §4.4 formula assumes one block per SM).
        block_bytes = smem_block + units_per_block * smem_unit
        if smem_level.per_block_bytes is not None and block_bytes > smem_level.per_block_bytes:
            blocks_by_smem = 0
        else:
            blocks_by_smem = int(smem_level.capacity_bytes // block_bytes)
        blocks_per_sm = min(units // units_per_block, blocks_by_smem, gpu.max_blocks_per_sm)
        units = blocks_per_sm * units_per_block
    if units <= 0:
        raise HardwareError(
            f"{design} attention (w_q={w_q}, s_x={s_x}, d={d}) does not fit one {unit} on {gpu.key}: {occ}")
    g_q = units * w_q

    # ---- one s_x step, per SM
    f_qk = 2.0 * g_q * s_x * d
    f_pv = 2.0 * g_q * s_x * d
    r_qk = gpu.tensor_flops_per_clk_per_sm(qk.name)
    r_pv = gpu.tensor_flops_per_clk_per_sm(pv.name)
    clocks = f_qk / r_qk + f_pv / r_pv
    compute_s = clocks / gpu.clock_hz
    hbm_bytes = gpu.sms * blocks_per_sm * s_x * d * (qk.bytes + pv.bytes)
    hbm_s = hbm_bytes / gpu.hbm_bandwidth
    bound = "compute" if compute_s >= hbm_s else "memory"
    step_s = max(compute_s, hbm_s)
    exps = float(g_q * s_x)
    sfu_clocks = exps / gpu.sfu_ops_per_clk_per_sm
    thr = gpu.sms * (f_qk + f_pv) / step_s
    peak = gpu.tensor_rate(qk.name)
    return AttentionAnalysis(
        gpu=gpu.key, design=design, unit=unit, threads_per_unit=threads, w_q=w_q, s_x=s_x, d=d,
        qk_dtype=qk.name, pv_dtype=pv.name, p_dtype=p.name, stages=stages,
        smem_k_chunk_bytes=k_chunk, smem_v_chunk_bytes=v_chunk, smem_per_block_bytes=smem_block,
        smem_q_tile_bytes=q_tile, smem_o_staging_bytes=o_stage, smem_per_unit_bytes=smem_unit,
        smem_capacity_bytes=smem_cap,
        regs_o_acc=regs_o, regs_p=regs_p, regs_stats=regs_stats, regs_extra=int(extra_regs_per_thread), regs_per_thread=regs_thread,
        registers_per_unit_bytes=reg_bytes, register_capacity_bytes=reg_cap,
        register_convention=register_convention,
        occupancy=occ, units_by_smem=occ.per_resource["SMEM"], units_by_registers=occ.per_resource["RF"],
        units_by_registers_bytes=by_regs_bytes, units=units, blocks_per_sm=blocks_per_sm, g_q=g_q,
        flops_qk_per_step=f_qk, flops_pv_per_step=f_pv, qk_flops_per_clk=r_qk, pv_flops_per_clk=r_pv,
        compute_clocks=clocks, compute_s=compute_s, hbm_bytes_per_step=hbm_bytes, hbm_s=hbm_s,
        bound=bound, step_s=step_s, exps_per_step=exps, sfu_clocks=sfu_clocks,
        throughput_flops=thr, peak_flops=peak, fraction_of_peak=thr / peak,
    )


def hopper_attention_analysis(
    gpu: GPU, w_q: int = 128, s_x: int = 64, d: int = 128, qk_dtype: str = "fp8",
    pv_dtype: str = "fp16", stages: int = 2, *, p_dtype: str | None = None,
    register_convention: str = "paper", extra_regs_per_thread: int = 0,
) -> AttentionAnalysis:
    """The paper's Hopper (wgmma) FlashAttention accounting, docs/architecture.md §4.4, from the configuration.

    Per block (shared by the block's warpgroups): K and V chunks, ``s_x*d`` values each at the QK
    and PV dtypes, times ``stages`` (double buffering) -> 48 KiB for the defaults (docs/architecture.md §4.4's
    "48 KB").
    Per warpgroup: SMEM for its Q tile (``w_q*d`` at the QK dtype) and its O staging tile
    (``w_q*d`` at the PV dtype) -> 48 KiB; registers per thread: the O accumulator
    ``w_q*d/128`` fp32 (128), P ``w_q*s_x/128`` values at ``p_dtype`` (default: the QK dtype, as
    the paper counts it: 64 fp8 values = 16 registers) and the running max and sum (2): 146
    registers x 4 B x 128 threads = 74,752 B = 73.0 KiB (the paper's "74.75 KB", decimal).

    Warpgroups per SM: SMEM (227 KiB per-block max − 48 KiB) / 48 KiB = 3.73 -> 3.7;
    registers 256 / 74.75 = 3.42 -> 3.4; hence 3 warpgroups, ``g_q = 384``.

    Unit convention (``register_convention="paper"``): the paper writes the register demand
    74,752 B (73.0 KiB) as "74.75 KB" (decimal kilobytes) and divides the "256 KB" (262,144 B =
    256 KiB) register file by it. Reproducing its 3.4 therefore needs the demand in kB and the capacity in
    KiB; with bytes on both sides (``"bytes"``, also reported as ``units_by_registers_bytes``) the
    figure is 3.51. Both floor to 3, so g_q and everything after it are the same. SMEM is counted
    in bytes (KiB) on both sides: (232,448 − 49,152) / 49,152 = 3.73.

    Per s_x step, per SM: QK and PV each cost ``2*g_q*s_x*d`` FLOPs at their dtype's per-SM rate
    ``tensor_rate/(sms*clock)`` (8192 and 4096 FLOP/clk) -> 768 + 1536 = 2304 clocks = 1.26 µs at
    1.83 GHz. HBM: every SM loads its K and V chunks, ``sms*s_x*d*(qk+pv bytes)`` = 3,244,032 B
    (3.09 MiB) in 0.97 µs at 3.35 TB/s -> compute-bound; throughput ``sms*flops/step`` = 1.319 PFLOP/s, two
    thirds of the fp8 peak. The exp work (``g_q*s_x`` per step on the SFU, 1536 clocks) is reported
    in ``sfu_clocks`` but, as in the paper, assumed to overlap the tensor-core work.
    """
    if not gpu.has_wgmma:
        raise HardwareError(
            f"the Hopper attention design needs wgmma (sm_90a); {gpu.key} ({gpu.arch}) has none: "
            f"use ampere_attention_analysis")
    return _analysis(
        gpu, design="hopper-wgmma", unit="warpgroup", threads=WARPGROUP, w_q=w_q, s_x=s_x, d=d,
        qk_dtype=qk_dtype, pv_dtype=pv_dtype, p_dtype=p_dtype, stages=stages,
        smem_per_block_extra=0, o_staging=True, q_in_unit=True,
        register_convention=register_convention, units_per_block=None,
        extra_regs_per_thread=extra_regs_per_thread,
    )


def ampere_attention_analysis(
    gpu: GPU, block_q: int = 128, s_x: int = 64, d: int = 128, dtype: str = "fp16",
    warps_per_block: int = 4, stages: int = 1, *, p_dtype: str | None = None,
    o_staging: bool = False, register_convention: str = "bytes", extra_regs_per_thread: int = 0,
) -> AttentionAnalysis:
    """The same accounting for an Ampere mma.sync design, in warps instead of warpgroups.

    Defaults are FlashAttention-2's forward configuration for d = 128: 4 warps per block, a
    128 x 64 tile (``block_q`` query rows, ``s_x`` keys per step), fp16 throughout. Each warp owns
    ``w_q = block_q / warps_per_block`` rows (32); its Q slice (``w_q*d`` values) is counted per
    warp, the K and V chunks (times ``stages``) per block; O is written back through the Q buffer
    (``o_staging=False``). Registers per thread: O ``w_q*d/32`` fp32 (128), S/P ``w_q*s_x/32``
    values at ``p_dtype`` (default fp32: mma.sync leaves S in fp32 registers and P is converted
    from it there, 64 registers; pass the PV dtype to count P alone), max and sum (2): 194
    registers, 24,832 B per warp -> 10.6 warps by registers, 16.4 by SMEM (163 KiB − 32 KiB K/V
    per block, 8 KiB Q per warp), rounded down to whole blocks of 4 -> 8 warps (2 blocks), which is
    what FlashAttention-2 gets on A100 at 255 registers per thread. Register and SMEM figures are
    in bytes on both sides (no decimal-kB convention needed here).
    """
    if block_q % warps_per_block:
        raise HardwareError(f"block_q={block_q} is not a multiple of warps_per_block={warps_per_block}")
    w_q = block_q // warps_per_block
    return _analysis(
        gpu, design="ampere-mma.sync", unit="warp", threads=WARP, w_q=w_q, s_x=s_x, d=d,
        qk_dtype=dtype, pv_dtype=dtype, p_dtype=p_dtype if p_dtype is not None else "fp32",
        stages=stages, smem_per_block_extra=0, o_staging=o_staging, q_in_unit=True,
        register_convention=register_convention, units_per_block=warps_per_block,
        extra_regs_per_thread=extra_regs_per_thread,
    )


# ---------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Thresholds:
    """Compute-bound thresholds of one GPU and dtype (docs/architecture.md §4.4), all derived from the profile.

    flops_per_value:        tensor_rate / HBM values per second (590.7 on H100 fp16).
    matmul_min_contraction: a matmul's contraction axis b must reach flops_per_value / 2
                            (2b FLOPs per output value) -> 295.
    attention_min_g_q:      attention's query group g_q: 4 g_q s_x d FLOPs per 2 s_x d values of
                            K and V -> 2 g_q >= flops_per_value -> 295.
    matmul_min_tile:        square tiles g x g with a stream s_b: 2 g^2 s_b FLOPs per 2 g s_b
                            values -> g >= flops_per_value.
    matmul_min_memory_values / _bytes: M ~ g^2 >= flops_per_value^2 values (681 KiB at fp16;
                            ``matmul_min_memory_kib``).
    """

    gpu: str
    dtype: str
    tensor_rate: float
    hbm_values_per_s: float
    flops_per_value: float
    matmul_min_contraction: float
    attention_min_g_q: float
    matmul_min_tile: float
    matmul_min_memory_values: float
    matmul_min_memory_bytes: float

    @property
    def matmul_min_memory_kib(self) -> float:
        return self.matmul_min_memory_bytes / KIB


def compute_bound_thresholds(gpu: GPU, dtype: str = "fp16") -> Thresholds:
    """The §4.4 thresholds for ``dtype`` on ``gpu`` (590.7, 295, 295, 681 KiB on H100 fp16)."""
    dt = _dtype(dtype)
    t = gpu.compute_bound_threshold(dt.name)
    return Thresholds(
        gpu=gpu.key, dtype=dt.name, tensor_rate=gpu.tensor_rate(dt.name),
        hbm_values_per_s=gpu.hbm_values_per_s(dt.name), flops_per_value=t,
        matmul_min_contraction=t / 2, attention_min_g_q=t / 2, matmul_min_tile=t,
        matmul_min_memory_values=t * t, matmul_min_memory_bytes=t * t * dt.bytes,
    )
