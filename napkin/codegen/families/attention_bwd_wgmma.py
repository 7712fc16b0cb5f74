"""The attention backward's Hopper path: dQ, dK, dV on wgmma and TMA, warp-specialised (sm_90a).

The same diagrams as :mod:`napkin.codegen.families.attention_bwd` (the backward ``grad`` gives
for attention with ``save={"O", "P_lse"}``), the same three launches (a pre-pass, the main
kernel, the dQ conversion), another engine for the main kernel (``attention_bwd_wgmma.cu.jinja``):
one block per ``BX = 64 · consumers`` keys with K and V resident in shared memory, a producer
warpgroup streaming the Q and dO tiles (and the tiles' log-sum-exp and ``D`` rows) by TMA through
a ring of ``stages`` slots, and ``consumers`` warpgroups of 64 keys each computing ``Sᵀ = K·Qᵀ``
and ``dPᵀ = V·dOᵀ`` with wgmma from shared memory, ``Pᵀ`` and ``dSᵀ`` in registers, ``dV += Pᵀ·dO``
and ``dK += dSᵀ·Q`` with wgmma taking ``Pᵀ`` and ``dSᵀ`` from registers (RS), and
``dQ = dS·K`` with wgmma from a shared ``dSᵀ`` tile, added to an fp32 workspace with vector
reductions. The pre-pass writes ``L = lse · log₂e`` and ``D = Σ dO·O`` into rows padded to whole
query tiles (so that the producer copies them with aligned bulk copies) and zeroes the workspace;
the conversion is the mma.sync template's.

The schedule is the mma.sync path's (``q`` streamed at SMEM in tiles of ``BQ``, one woven
combination a block) with ``KernelOptions(engine="wgmma", warpgroups=.., stages=..)``: the
attention_bwd family offers it beside its mma.sync tiles where the GPU has wgmma
(:func:`candidates`) and lowers it here when the schedule says wgmma (:func:`lower`).

Registers per consumer thread (:data:`CONFIGS`): dK and dV (64 x d fp32 a warpgroup: d / 2 each),
Sᵀ and dPᵀ (64 x BQ: BQ / 2 each), their T fragments (BQ / 4 each), and one dQ piece (64 x N:
N / 2): at d = 128, BQ = 64 that is 128 + 64 + 32 + 32 = 256 at the peak if all were live at
once; the kernel retires Sᵀ and dPᵀ into the fragments before the dQ product, within the 240
two consumers get. The dQ tile (64 x d) splits into two column halves, one a warpgroup (at d = 64
32-column halves, starting mid-row in the swizzled K tile). A query tile of 128 at d = 64 (two
64-row dQ blocks, one a warpgroup) builds too, with a few bytes of spills: not in the table.

Measured (H100, bf16, 16 heads, 16k tokens a batch; ``benchmarks/attention_backward.py``, the
planner's plan): 423 TFLOP/s at seq 16k, d = 128 (1.36x SDPA-flash, 0.79x cuDNN), 414 causal
(1.32x, 0.73x); 364 at d = 64 (1.26x, 0.79x), 355 causal (1.29x, 0.77x); at seq 4k 287-396
(1.25-1.37x flash, 0.71-0.79x cuDNN). A third ring stage measured no faster; ``dq_local`` (each
warpgroup's dQ over its own keys: no barrier between the warpgroups, twice the reductions) 25-35 %
slower (:func:`lower_config` builds it).

>>> from napkin.diagrams import library
>>> from napkin.codegen.families.attention_bwd import FAMILY, analyze
>>> b = library.get("mha").grad(save={"O", "P_lse"}).bind(h=2, q=1000, x=1000, d=128)
>>> wgmma_reason(analyze(b), b, "h100"), wgmma_reason(analyze(b), b, "a100-80gb")
(None, 'a100-80gb (sm_80) has no wgmma (it needs sm_90a)')
>>> [(c.BX, c.BQ, c.stages) for c in configs(128)], [(c.BX, c.BQ, c.stages) for c in configs(64)]
([(128, 64, 2), (128, 64, 3)], [(128, 64, 2), (128, 64, 3)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...diagrams.diagram import Diagram
from ...errors import CodegenError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment, comment_lines, ident
from .attention_problem import woven_reason
from .contraction import _gpu_key, _smem_limit, wgmma_target_reason
from .epilogue import (Param, check_index_size, contiguous_strides, ctype, float_param, int_param, render,
                       short_hash, signature, stride_param, tensor_param, tensormap_param)

__all__ = ["WgmmaBackwardConfig", "CONFIGS", "OFFERED", "configs", "wgmma_reason", "candidates", "schedule",
           "config_of", "launch_estimate", "lower", "lower_config", "TEMPLATE"]

TEMPLATE = "attention_bwd_wgmma.cu.jinja"

#: (query tile BQ, ring stages) per head dimension, best first; two consumer warpgroups (BX = 128).
CONFIGS = {
    64: ((64, 2), (64, 3)),
    128: ((64, 2), (64, 3)),
}

#: Whether the attention_bwd family offers these schedules to the planner (it always lowers one
#: it is given).
OFFERED = True

#: Registers per producer thread after setmaxnreg (it issues TMA copies only).
PRODUCER_REGS = 24

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class WgmmaBackwardConfig:
    """``consumers`` warpgroups of 64 keys (``BX = 64 · consumers``), query tiles of ``BQ`` in a
    ring of ``stages`` slots, head dimension ``D``."""

    D: int
    BQ: int
    stages: int
    consumers: int = 2
    dq_local: bool = False  # each warpgroup's dQ over its own keys (no barrier between them)

    @property
    def BX(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def dq_n(self) -> int:
        """Columns of one warpgroup's dQ piece: whole rows of d where the tile has a 64-row block
        a warpgroup, else d split over the warpgroups."""
        if self.dq_local:
            return 64
        return self.D if self.BQ // 64 >= self.consumers else self.D // self.consumers

    def consumer_regs(self) -> int:
        return min(240, (65536 - 128 * PRODUCER_REGS) // (128 * self.consumers) // 8 * 8)

    def entry_regs(self) -> int:
        return min(255, 65536 // self.threads // 8 * 8)

    def model_smem_bytes(self) -> int:
        """K and V of the block, the ring's Q and dO tiles, two dSᵀ tiles (bf16/fp16)."""
        return (2 * self.BX * self.D + 2 * self.stages * self.BQ * self.D + 2 * self.BX * self.BQ) * 2

    def smem_bytes(self) -> int:
        """Dynamic shared memory: the tiles, 1 KiB to align them on a swizzle atom, the ring's L
        and D rows (fp32) and 256 B of barriers."""
        return self.model_smem_bytes() + 1024 + 2 * self.stages * self.BQ * 4 + 256

    def problem(self) -> str | None:
        qb = self.BQ // 64
        if self.D % 64 or self.BQ % 64 or not 64 <= self.BQ <= 256:
            return "d and the query tile must be multiples of 64 (the query tile at most 256)"
        if not self.dq_local and not (qb % self.consumers == 0 if qb >= self.consumers
                                      else (qb == 1 and self.dq_n % 32 == 0)):
            return (f"the dQ tile ({self.BQ} x {self.D}) does not split into 64-row or 32-column pieces over "
                    f"{self.consumers} warpgroups")
        if not 2 <= self.stages <= 4:
            return "stages must be 2 to 4"
        # dK, dV, one query tile's Sᵀ and dPᵀ, and ~40 for addresses and indices
        need = self.D + self.BQ + 40
        if need > self.consumer_regs():
            return f"dK, dV, Sᵀ and dPᵀ need {need} registers a thread; {self.consumers} consumers get {self.consumer_regs()}"
        return None

    def options(self) -> KernelOptions:
        return KernelOptions(engine="wgmma", stages=self.stages, warpgroups=self.consumers, blocks_per_sm=1,
                             regs_per_thread=self.consumer_regs())


def configs(D: int) -> list[WgmmaBackwardConfig]:
    """The configurations for head dimension ``D``, best first (none where it has no table)."""
    return [WgmmaBackwardConfig(D, bq, st) for bq, st in CONFIGS.get(D, ())]


def wgmma_reason(p, diagram: Diagram, gpu=None, arch: str | None = None, dtype: str | None = None) -> str | None:
    """Why the wgmma backward cannot run this problem (a
    :class:`~napkin.codegen.families.attention_bwd.BackwardProblem`), or None if it can."""
    why = wgmma_target_reason(dtype or p.dtype, gpu, arch)
    if why:
        return why
    D = diagram.axes[p.d].size
    if isinstance(D, int) and D not in CONFIGS:
        return f"head dimension {D}: the wgmma backward takes {', '.join(map(str, sorted(CONFIGS)))}"
    sz = diagram.sizes
    for v in (p.Q, p.K, p.V, p.dO):
        if all(isinstance(sz.get(a), int) for a in v.axis_names):
            rows = math.prod(sz[a] for a in v.axis_names[:-1])
            if rows >= 2 ** 31 - 2 ** 16:
                return f"{v.label()} has {rows} rows; TMA coordinates are 32-bit"
    return None


def schedule(fam, diagram: Diagram, cfg: WgmmaBackwardConfig, gpu="h100", dtype: str | None = None) -> Schedule:
    """``q`` streamed at SMEM (s_q = BQ), one woven combination a block, engine wgmma (the model
    sees, as for the mma.sync tiles, one kernel over the whole of ``x``: :func:`launch_estimate`
    states the key blocks)."""
    p = fam.problem(diagram)
    s = Schedule.fused(diagram, groups={a: 1 for a in p.woven}, streams={p.q: cfg.BQ}, gpu=_gpu_key(gpu),
                       dtype=dtype or p.dtype)
    return s.replace(kernels=(s.kernels[0].replace(family=fam.name, options=cfg.options()),))


def candidates(fam, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
    """The wgmma schedules for ``diagram`` on ``gpu`` (none where the GPU has no wgmma, the
    template cannot run the problem, or :data:`OFFERED` is off)."""
    if not OFFERED:
        return []
    p = fam.problem(diagram)
    if wgmma_reason(p, diagram, gpu, dtype=dtype) is not None:
        return []
    limit = _smem_limit(gpu)
    return [schedule(fam, diagram, c, gpu, dtype) for c in configs(diagram.axes[p.d].bound_size)
            if c.smem_bytes() <= limit and c.problem() is None]


def config_of(p, diagram: Diagram, sched: Schedule) -> WgmmaBackwardConfig:
    """The configuration a wgmma schedule asks for, checked against what the template builds."""
    if len(sched.kernels) != 1:
        raise CodegenError("attention_bwd family (wgmma): the schedule must fuse every box into one kernel")
    D = diagram.axes[p.d].bound_size
    BQ = None
    for r in sched.kernels[0].relabels:
        if r.is_symbolic:
            raise CodegenError(f"attention_bwd family (wgmma): {r} has no size; bind {r.symbol} first")
        if r.kind == "stream" and r.axis == p.q and r.level == "SMEM":
            BQ = int(r.size)
        elif not (r.kind == "group" and r.axis in p.woven and int(r.size) == 1):
            raise CodegenError(f"attention_bwd family (wgmma): the template cannot realise {r} (it streams "
                               f"{p.q} at SMEM, one woven combination a block)")
    table = configs(D)
    if not table:
        raise CodegenError(f"attention_bwd family (wgmma): head dimension {D}; the template takes "
                           f"{', '.join(map(str, sorted(CONFIGS)))}")
    opts = sched.kernels[0].options
    cfg = WgmmaBackwardConfig(D, BQ or table[0].BQ, opts.stages or table[0].stages, opts.warpgroups or 2)
    why = cfg.problem()
    if why:
        raise CodegenError(f"attention_bwd family (wgmma): s_{p.q}={cfg.BQ}, d={D}, {cfg.consumers} warpgroups, "
                           f"{cfg.stages} stages: {why}")
    return cfg


def launch_estimate(fam, diagram: Diagram, sched: Schedule, gpu=None) -> dict:
    """The main launch (blocks, threads, registers, shared memory, the Q and dO tiles in flight)
    and what the model does not see: the pre-pass and the dQ conversion (two launches; L and D,
    the zeroed and re-read fp32 workspace, dQ written again), the dQ reductions (one fp32 add
    per query row, column and key block, at the L2; a quad's two-word reductions share a
    32-byte sector), and Q, dO, L and D re-read by every key block. wgmma reads its operands
    from shared memory itself (the tensor path at its datasheet rate, operand traffic
    overlapped); the exponentials and the products of one warpgroup run one after the other,
    the other warpgroup's overlapping them only as the scheduling happens to."""
    p = fam.problem(diagram)
    cfg = config_of(p, diagram, sched)
    sz = diagram.sizes
    nz = math.prod(sz[a] for a in p.woven)
    Nq, Nx = sz[p.q], sz[p.x]
    kb = math.ceil(Nx / cfg.BX)
    rows = nz * Nq
    elem = 2
    ws = rows * cfg.D * 4
    visited = fam.visited_tiles(Nq, Nx, cfg.BX, cfg.BQ, fam.masking(diagram, p)[2])
    share = visited / (kb * math.ceil(Nq / cfg.BQ))
    reductions = kb * rows * cfg.D * share
    return dict(blocks=kb * nz, threads=cfg.threads, regs=cfg.entry_regs(), smem=cfg.smem_bytes(),
                in_flight_bytes_per_thread=2 * cfg.stages * cfg.BQ * cfg.D * elem / cfg.threads,
                stream_steps=math.ceil(Nq / cfg.BQ), threads_per_row=4,
                tensor_path="peak", overlap_operands=True, overlap_compute=False,
                extra_launches=2,
                extra_hbm_bytes=rows * 8 + ws + ws + rows * cfg.D * elem,
                extra_l2_bytes=reductions * 8 + max(0.0, kb * share - 1) * rows * (2 * cfg.D * elem + 8))


def _woven_rows(v, row_axis: str, ax: str, strides: dict[str, int]) -> int:
    stride = strides.get(ax, 0)
    if stride % strides[row_axis]:
        raise CodegenError(f"attention_bwd family (wgmma): {v.label()}'s stride along {ax} is not whole rows")
    return stride // strides[row_axis]


def lower(fam, diagram: Diagram, sched: Schedule, arch: str) -> Program:
    """The Program of a wgmma schedule: the pre-pass, the main kernel, the dQ conversion."""
    p = fam.problem(diagram)
    why = wgmma_reason(p, diagram, arch=arch)
    if why:
        raise CodegenError(f"attention_bwd family: the schedule asks for engine=wgmma, but {why}")
    cfg = config_of(p, diagram, sched)
    check_derived(fam.name, sched.kernels[0].name, sched.kernels[0].options, cfg.options())
    return _program(fam, diagram, sched, p, cfg, arch)


def lower_config(fam, diagram: Diagram, cfg: WgmmaBackwardConfig, arch: str = "sm_90a") -> Program:
    """The Program of one configuration as given (its ``dq_local`` too, which no schedule says),
    for comparing the template's variants; :func:`lower` takes the configuration a schedule says."""
    p = fam.problem(diagram)
    why = wgmma_reason(p, diagram, arch=arch) or cfg.problem()
    if why:
        raise CodegenError(f"attention_bwd family (wgmma): {why}")
    return _program(fam, diagram, schedule(fam, diagram, cfg), p, cfg, arch)


def _program(fam, diagram: Diagram, sched: Schedule, p, cfg: WgmmaBackwardConfig, arch: str) -> Program:
    smem = cfg.smem_bytes()
    limit = _smem_limit(None, arch)
    if smem > limit:
        raise CodegenError(f"attention_bwd family (wgmma): the tiles need {smem} bytes of shared memory; "
                           f"{arch} allows {limit} per block")
    T = p.dtype
    d = diagram
    sz = d.sizes
    Nq, Nx = sz[p.q], sz[p.x]
    check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30, "attention_bwd")
    check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30, "attention_bwd")
    nz = math.prod(sz[a] for a in p.woven)
    if why := woven_reason(nz):
        raise CodegenError(f"attention_bwd family: {why}")
    NqP = math.ceil(Nq / cfg.BQ) * cfg.BQ
    ws_dq, ws_D = fam.workspace_names(d)
    ws_L = ws_D + "_lse"
    names = {id(v): d.name_of(v) for v in (p.dQ, p.dK, p.dV)}
    st = {k: contiguous_strides(v) for k, v in dict(Q=p.Q, K=p.K, V=p.V, dO=p.dO, O=p.O, lse=p.lse,
                                                      dQ=p.dQ, dK=p.dK, dV=p.dV).items()}
    index_vars, chain, causal, always_mask = fam.masking(d, p)
    ws_params = dict(dq=Param(Arg("tensor", ws_dq, dtype="fp32", axes=()), Code("float* __restrict__ ws_dq")),
                     L_in=Param(Arg("tensor", ws_L, dtype="fp32", axes=()), Code("const float* __restrict__ ws_L")),
                     D_in=Param(Arg("tensor", ws_D, dtype="fp32", axes=()), Code("const float* __restrict__ ws_D")),
                     L_out=Param(Arg("tensor", ws_L, dtype="fp32", axes=()), Code("float* __restrict__ ws_L")),
                     D_out=Param(Arg("tensor", ws_D, dtype="fp32", axes=()), Code("float* __restrict__ ws_D")))
    main: list[Param] = [
        tensormap_param(p.Q, "tmQ", (64, cfg.BQ)), tensormap_param(p.K, "tmK", (64, cfg.BX)),
        tensormap_param(p.V, "tmV", (64, cfg.BX)), tensormap_param(p.dO, "tmdO", (64, cfg.BQ)),
        tensor_param(p.dK, "dK", T, const=False, name=names[id(p.dK)]),
        tensor_param(p.dV, "dV", T, const=False, name=names[id(p.dV)]),
        ws_params["dq"], ws_params["L_in"], ws_params["D_in"],
        int_param("Nq", Nq), int_param("Nx", Nx), int_param("NqP", NqP),
        int_param("sdK_x", st["dK"][p.x]), int_param("sdV_x", st["dV"][p.x]),
        float_param("scale_log2", chain.factor * LOG2E), float_param("ds_scale", p.ds_scale),
    ]
    prep: list[Param] = [
        tensor_param(p.dO, "dO", T), tensor_param(p.O, "O", T),
        Param(Arg("tensor", p.lse.name, dtype="fp32", axes=p.lse.axis_names), Code("const float* __restrict__ lse")),
        ws_params["dq"], ws_params["L_out"], ws_params["D_out"],
        int_param("n_woven", nz), int_param("Nq", Nq), int_param("NqP", NqP),
        int_param("sdO_q", st["dO"][p.q]), int_param("sO_q", st["O"][p.q]), int_param("sl_q", st["lse"][p.q]),
    ]
    dq: list[Param] = [
        Param(Arg("tensor", ws_dq, dtype="fp32", axes=()), Code("const float* __restrict__ ws_dq")),
        tensor_param(p.dQ, "dQ", T, const=False, name=names[id(p.dQ)]),
        int_param("n_woven", nz), int_param("Nq", Nq), int_param("sdQ_q", st["dQ"][p.q]),
        float_param("ds_scale", p.ds_scale),
    ]
    woven = []
    for ax in p.woven:
        e = dict(axis=ax, idx=ident(ax, "i_"), size=ident(ax, "n_"))
        for k in st:
            e[f"s_{k}"] = ident(ax, f"s{k}_w_")
        for k, v, row in (("Q", p.Q, p.q), ("K", p.K, p.x), ("V", p.V, p.x), ("dO", p.dO, p.q)):
            e[f"r{k}"] = ident(ax, f"r{k}_w_")
            e[f"r{k}_value"] = _woven_rows(v, row, ax, st[k])
        woven.append(e)
        size = int_param(e["size"], sz[ax])
        main += [size] + [int_param(e[f"r{k}"], e[f"r{k}_value"]) for k in ("Q", "K", "V", "dO")] + [
            stride_param(e["s_dK"], st["dK"][ax]), stride_param(e["s_dV"], st["dV"][ax])]
        prep += [size, stride_param(e["s_dO"], st["dO"][ax]), stride_param(e["s_O"], st["O"][ax]),
                 stride_param(e["s_lse"], st["lse"][ax])]
        dq += [size, stride_param(e["s_dQ"], st["dQ"][ax])]
    tag = short_hash(T, [str(x) for x in chain.full.lines], p.woven, causal, always_mask, cfg)
    kname = Code(f"napkin_attn_bwd_wgmma_{T}_d{cfg.D}_x{cfg.BX}_q{cfg.BQ}_s{cfg.stages}_{tag}")
    legend = [
        "(sequence lengths and woven sizes are kernel arguments; D is compiled in)",
        f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()}, {p.dO.label()}, "
        f"{p.lse.label()} (fp32), {p.O.label()} -> {names[id(p.dQ)]}, {names[id(p.dK)]}, {names[id(p.dV)]}, {T}",
        f"  {p.x} -> keys Nx:    g_{p.x} = BX = {cfg.BX} (grid.x; CONSUMERS = {cfg.consumers} warpgroups of 64)",
        f"  {p.q} -> queries Nq: s_{p.q} = BQ = {cfg.BQ} (streamed, STAGES = {cfg.stages}); NqP = {NqP} (padded)",
        f"  {p.d} -> D = {cfg.D}",
    ] + [f"  {ax} -> woven (grid.y)" for ax in p.woven] + [
        f"  engine: wgmma + TMA; registers {PRODUCER_REGS} (producer) / {cfg.consumer_regs()} (consumers)",
        f"  score maps: {', '.join(chain.boxes) or 'none'}; scale folded: {chain.factor:.6g}; "
        f"dS scale: {p.ds_scale:.6g}",
        f"  workspaces: {ws_dq} [woven][Nq][D], {ws_L} and {ws_D} [woven][NqP] (fp32)",
    ]
    if causal is not None:
        legend.append(f"  causal (offset {causal}): query tiles above a key block's diagonal skipped")

    def regs(name: str, n: int, first: int = 0) -> tuple[Code, Code]:
        return (Code("{" + ", ".join(f"%{first + i}" for i in range(n)) + "}"),
                Code(", ".join(f'"+f"({name}[{i}])' for i in range(n))))

    s_ops, s_cons = regs("c", cfg.BQ // 2)
    o_ops, o_cons = regs("c", cfg.D // 2)
    q_ops, q_cons = regs("c", cfg.dq_n // 2)
    ctx = dict(kname=kname, T=ctype(T), AB=Code("bf16" if T == "bf16" else "f16"), D=cfg.D, BQ=cfg.BQ,
               FOLD=grid_folds(nz), NZ=nz,
               STAGES=cfg.stages, CONSUMERS=cfg.consumers, PRODUCER_REGS=PRODUCER_REGS,
               CONSUMER_REGS=cfg.consumer_regs(), DQ_N=cfg.dq_n, DQ_LOCAL=cfg.dq_local,
               s_operands=s_ops, s_constraints=s_cons, o_operands=o_ops, o_constraints=o_cons,
               a_operands=Code("{" + ", ".join(f"%{cfg.D // 2 + i}" for i in range(4)) + "}"),
               q_operands=q_ops, q_constraints=q_cons,
               params=signature(main), prep_params=signature(prep), woven=woven, legend=comment_lines(legend),
               CAUSAL=causal, ALWAYS_MASK=always_mask, IDX_ROW=index_vars[p.q], IDX_COL=index_vars[p.x],
               full_body=chain.full.body("          "), full_result=chain.full.result,
               chain_desc=comment(", ".join(chain.boxes) or "none"))
    # one rendering per launch, each its own namespace (a program's source is its launches' sources)
    src = {part: render(TEMPLATE, PART=part, ns=Code(f"{kname}_{part}"), **ctx) for part in ("prep", "main")}
    # the dQ conversion: the mma.sync template's third launch (its tile constants are not used there)
    src["dq"] = render("attention_bwd.cu.jinja", PART="dq", ns=Code(f"{kname}_cv"), kname=kname, T=ctype(T),
                       D=cfg.D, BX=128, BQ=64, dq_params=signature(dq), woven=woven, legend=comment_lines(legend))
    rows = nz * Nq
    tunables = (("BX", cfg.BX), ("BQ", cfg.BQ), ("D", cfg.D), ("stages", cfg.stages),
                ("warpgroups", cfg.consumers), ("engine", "wgmma"), ("causal", causal))
    launches = (
        KernelLaunch(name=f"{kname}_prep", source=src["prep"], grid=(math.ceil(nz * NqP / 8), 1, 1),
                     block=(256, 1, 1), shared_bytes=0, args=tuple(x.arg for x in prep), template=TEMPLATE,
                     tunables=(("D", cfg.D), ("BQ", cfg.BQ)), model_smem_bytes=0, model_regs_per_thread=32),
        KernelLaunch(name=str(kname), source=src["main"], grid=(math.ceil(Nx / cfg.BX), *fold_grid(nz)),
                     block=(cfg.threads, 1, 1), shared_bytes=smem, args=tuple(x.arg for x in main),
                     template=TEMPLATE, tunables=tunables, model_smem_bytes=cfg.model_smem_bytes(),
                     model_regs_per_thread=cfg.consumer_regs()),
        KernelLaunch(name=f"{kname}_dq", source=src["dq"], grid=(math.ceil(rows * (cfg.D // 4) / 256), 1, 1),
                     block=(256, 1, 1), shared_bytes=0, args=tuple(x.arg for x in dq),
                     template="attention_bwd.cu.jinja", tunables=(("D", cfg.D),), model_smem_bytes=0,
                     model_regs_per_thread=32),
    )
    buffers = (Buffer(ws_dq, ("row", p.d), (rows, cfg.D), "fp32"), Buffer(ws_L, ("row",), (nz * NqP,), "fp32"),
               Buffer(ws_D, ("row",), (nz * NqP,), "fp32"))
    return Program(diagram, sched, fam.name, launches, buffers, dict(sz))
