"""The attention family in fp8 (e4m3) on Hopper: both products on the 8-bit wgmma (sm_90a).

The design of the paper's Hopper configuration (docs/architecture.md §4.4) with ``Q·Kᵀ`` and
``P·V`` both in fp8: the warp-specialised forward of :mod:`~napkin.codegen.families.attention_wgmma`
(a producer warpgroup with a TMA ring of K and V chunks, two consumer warpgroups of 64 query
rows) on ``wgmma …k32.f32.e4m3.e4m3``, which takes its shared-memory operands K-major only.
Q ``[q, d]`` and K ``[x, d]`` are (the k of ``S = Q·Kᵀ`` is d); V ``[x, d]`` is not (the k of
``P·V`` is x), so a small pre-pass (``attention_fp8_vt.cu.jinja``) writes ``Vt [d, x]`` into a
buffer, x padded with zeros to whole chunks of 128 keys and permuted inside each run of 32 keys
into the order in which the accumulator of S hands P to the register A fragments (so P needs
no shuffle). The model prices the pre-pass (``extra_launches``, ``extra_hbm_bytes``: V read,
Vt written) beside the kernel at the fp8 tensor peak and one byte a value.

**Per-tensor scales.** The kernel computes attention on the dequantised inputs
``Q·descale_q``, ``K·descale_k``, ``V·descale_v`` and stores ``O·scale_o`` in e4m3 (the
diagram's dtype; rounded to nearest, saturating at ±448). The four are ``float`` kernel
arguments, 1 unless set with :func:`with_scales` (a Program with other values; the generated
source does not change, so no recompilation). The scales of Q and K fold into the softmax's
exponent, those of V and O into ``1 / l``.

**Tolerance** (against the diagram's reference on the dequantised inputs in fp32, stated and
tested in ``tests/codegen/test_attention_fp8.py``): the relative RMS error of O over a whole
output is at most :data:`RMS_TOLERANCE` (5 %), its largest element error at most twice that
(relative to the output's largest value). Its sources: O rounded to e4m3 (relative error up to
2⁻⁴, about 2⁻⁴/√3 RMS), P rounded to e4m3 before ``P·V`` (the row sums l are kept in fp32 from
the unrounded P), and the 8-bit wgmma's accumulation.

The consumers' loop takes a chunk at a time (S, softmax, P·V) or, at d = 128, two stages inside
a warpgroup (chunk j's S issued with chunk j - 1's P·V, its softmax while that runs), whichever
measured faster (:data:`CONFIGS`). Two more tunables of a configuration: ``poly``, how many of
every 16 probabilities take their exp2 on the FMA pipe (``ex2_fma``: Cody-Waite range reduction
and a degree-3 minimax polynomial, relative error 7.5e-5) instead of the SFU's MUFU.EX2, which
the model prices there (``launch_estimate``'s ``exp_fma_share``: that share of the SFU work moves
to the CUDA cores at :data:`FMA_FLOPS_PER_EXP` each); and ``pingpong``, the two consumers taking
turns issuing their products (named barriers), with the two-stage loop. Both are built and
tested (GPU tests, memcheck and racecheck). The polynomial is off in the table (it measured no
faster, below); ping-pong is on at d = 128 with five stages for scores without masks
(:func:`candidates`, :func:`turns_for`), since K and V are released apart (on an H200, the planner's picks, seq 4k /
8k / 16k: 821-827 / 899-901 / 896-943 TFLOP/s against 776 / 851 / 872 for four stages without
it; ``attention_fp8_s30.jsonl``); masked scores keep four stages without it.

Measured (H100, 16 heads, 16k tokens a batch, seq 4k / 8k / 16k, the planner's tiles, the
pre-pass included, ``benchmarks/attention_fp8.py``): d = 256 999 / 1108 / 1091 TFLOP/s
non-causal and 816 / 957 / 1090 causal; d = 128 784 / 858 / 892 non-causal and 628 / 742 / 846
causal. SDPA in bf16 on the same shapes: cuDNN 582-742, flash 306-366. The pre-pass takes 29 µs
(d = 128) to 54 µs (d = 256) for 16 x 16k keys. At d = 128 (issue #13's 1 PFLOP/s missed) the
exponentials do not bound it: ncu at seq 8k (non-causal, 1.44 GHz under ncu) shows the SFU (XU
pipe) 48 % busy, the tensor pipe 47 %, issue 44 %, the FMA pipe 19 %, and the warps' stalls
per issued instruction led by waiting on fixed latencies (1.25), barrier (0.68), long
scoreboard (0.61) and MIO throttle (0.44). Moving 2, 4, 6 or 8 of 16 exps to
the FMA pipe (the SFU falls to 36 % at 4, issue rises to 54 %) gave 839-879, 840-853, 793-806 and
771-776 TFLOP/s against 838-862 with none, ping-pong 862-888 against 838-862 without (seq 8k,
non-causal, two runs: before and after the row max and sum were split into four chains each);
causal 723-763 with 0 to 4 of 16, 656-703 with 6 or 8. The per-chunk chain of a warpgroup (its
S wgmma, the row max and its shuffles, the exps, the wait for P·V) sets the pace, not a pipe.

Offered where the diagram is fp8, the GPU has wgmma, the head dimension is 128 or 256, each of
Q, K, V is stored as rows of d (the tensor maps' rows), no log-sum-exp output is asked for, and
the score modifiers are positive scales and masks (causal and sliding-window masks skip whole
key blocks; other masks are applied to every chunk); elsewhere one clear reason.

>>> from napkin.diagrams import library
>>> from napkin.codegen.families.attention import analyze
>>> d = library.get("mha").bind(h=16, q=4096, x=4096, d=128).with_dtype("fp8")
>>> reason(analyze(d), d, "h100") is None, reason(analyze(d), d, "a100-80gb")
(True, 'dtype fp8: the fp8 attention template multiplies on the 8-bit wgmma; a100-80gb (sm_80) has no wgmma (it needs sm_90a)')
>>> [(c.D, c.BQ, c.BX, c.stages, c.overlap, c.pingpong) for c in configs(128)][0]
(128, 128, 128, 5, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...diagrams.diagram import Diagram
from ...errors import CodegenError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived, fold_grid, grid_folds
from ..render import Code, comment, comment_lines, ident
from .attention_problem import AttentionProblem, woven_reason
from .attention_wgmma import (PRODUCER_REGS, _masks, _rows_layout_problem, mask_legend, read_tiles, score_kinds,
                              shared_context, tma_rows_reason)
from .contraction import _gpu_key, _smem_limit, wgmma_target_reason
from .epilogue import (Param, check_index_size, contiguous_strides, float_param, int_param, render, score_chain,
                       short_hash, signature, stride_param)

__all__ = ["Fp8AttentionConfig", "CONFIGS", "HEAD_DIMS", "BX", "RMS_TOLERANCE", "configs", "reason",
           "structure_reason", "candidates", "schedule", "config_of", "turns_for", "lower_config",
           "launch_estimate", "lower", "with_scales", "TEMPLATE", "VT_TEMPLATE", "SCALES", "FMA_FLOPS_PER_EXP"]

TEMPLATE = "attention_wgmma_fp8.cu.jinja"
VT_TEMPLATE = "attention_fp8_vt.cu.jinja"

#: Keys per chunk: one 128-byte swizzled row of Vt (the k of P·V), the N of S = Q·Kᵀ.
BX = 128

#: (consumer warpgroups, stages, two stages inside a warpgroup[, exps of 16 on the FMA pipe,
#: ping-pong]) per head dimension, best first
#: (the model ranks them alike: a tie keeps the first). A consumer thread holds S (BX / 2 = 64
#: fp32), P (BX / 8 = 16 registers of four e4m3; twice with two stages) and O (D / 2): 144 (160)
#: registers at d = 128, 208 at d = 256, of the 240 two consumers get. Shared memory: Q (128 x d
#: bytes) and stages x (K + Vt chunks, 2 x 128 x d bytes): 144 KiB at d = 128 with four stages,
#: 224 KiB at d = 256 with three. Measured (H100, 16 heads x seq 8192 x 2, non-causal, TFLOP/s):
#: d = 128: 857 with four stages and the two-stage loop, 853 three and two-stage, 827 three
#: one chunk at a time, 805 four, 784 two, 687 two stages with the two-stage loop (too shallow a
#: ring to feed it); d = 256: 1137 with two stages, 1129 with three (one chunk at a time: two P
#: buffers do not fit beside S and O there).
#: Since K and V are released apart (the producer refills a K slot once S is done), a deeper ring
#: feeds the two-stage loop with ping-pong better: on an H200 (seq 8192, 2 x 16 heads, the pre-pass
#: included, one call, ``fp8_sweep_s30.jsonl``) five stages with ping-pong 898 TFLOP/s non-causal
#: and 742 causal, four without it 853 and 740, five without it 869 and 775, six with it 899 and
#: 743; a polynomial share of 2 of 16 exps lost 1-5 % everywhere.
CONFIGS = {
    128: ((2, 5, True, 0, True), (2, 4, True), (2, 3, True), (2, 2, False)),
    256: ((2, 2, False), (2, 3, False)),
}

#: The head dimensions the template is offered for.
HEAD_DIMS = tuple(sorted(CONFIGS))

#: The stated tolerance: relative RMS error of the output against the fp32 reference on the
#: dequantised inputs (see the module docstring for its sources); the largest element error is
#: held under twice it, relative to the largest reference value. Measured on an H100 over the 49
#: cases of the GPU tests: at most 0.036 RMS (the e4m3 rounding of O alone gives 2⁻⁴/√3 = 0.036)
#: and 0.046 for the largest element.
RMS_TOLERANCE = 0.05

#: The per-tensor scale arguments, in the order :func:`with_scales` takes them.
SCALES = ("descale_q", "descale_k", "descale_v", "scale_o")

LOG2E = 1.4426950408889634

#: Threads of the pre-pass's blocks (128 keys of one head each).
VT_THREADS = 256

#: CUDA-core FLOPs one exp2 on the FMA pipe costs (``ex2_fma`` in the template): FADD x 3, FFMA x 3
#: and FMUL, seven FMA-pipe instructions counted at 2 FLOPs each as the CUDA-core rate counts an
#: FMA (the clamp and the shift-add run on the ALU pipe, which the model does not price).
FMA_FLOPS_PER_EXP = 14


@dataclass(frozen=True)
class Fp8AttentionConfig:
    """``consumers`` warpgroups of 64 query rows (``BQ = 64 · consumers``), chunks of
    :data:`BX` keys, a ring of ``stages`` K/Vt slots, head dimension ``D``."""

    D: int
    consumers: int
    stages: int
    overlap: bool = False  # two stages inside a warpgroup: S of chunk j beside P V of chunk j - 1
    poly: int = 0  # of every 16 probabilities, those whose exp2 runs on the FMA pipe (a polynomial)
    pingpong: bool = False  # the two consumers take turns issuing their products (needs overlap)

    BX = BX

    @property
    def fma_exp_share(self) -> float:
        """The share of the softmax's exponentials computed on the FMA pipe."""
        return self.poly / 16

    @property
    def BQ(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    def consumer_regs(self) -> int:
        """Registers a consumer thread gets from setmaxnreg (what the producer's 24 leave, at most 240)."""
        return min(240, (65536 - 128 * PRODUCER_REGS) // (128 * self.consumers) // 8 * 8)

    def model_smem_bytes(self) -> int:
        """The model's accounting: the Q tile and the stages' K and Vt chunks, one byte a value."""
        return self.BQ * self.D + 2 * self.stages * BX * self.D

    def smem_bytes(self) -> int:
        """Dynamic shared memory: the tiles, 1 KiB to align them on a swizzle atom, 256 B of barriers."""
        return self.model_smem_bytes() + 1024 + 256

    def options(self) -> KernelOptions:
        return KernelOptions(engine="wgmma", stages=self.stages, warpgroups=self.consumers, blocks_per_sm=1,
                             regs_per_thread=self.consumer_regs())


def configs(D: int) -> list[Fp8AttentionConfig]:
    """The configurations for head dimension ``D``, best first (none where it has no table)."""
    return [Fp8AttentionConfig(D, *row) for row in CONFIGS.get(D, ())]


def _chain(p: AttentionProblem, diagram: Diagram):
    index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
    return score_chain(diagram, p.maps, index_vars=index_vars), index_vars


def structure_reason(p: AttentionProblem, diagram: Diagram) -> str | None:
    """Why the fp8 template cannot run this attention whatever the GPU, or None."""
    D = diagram.axes[p.d].size
    if isinstance(D, int) and D not in CONFIGS:
        return f"head dimension {D}: the fp8 template takes {' and '.join(map(str, HEAD_DIMS))}"
    if p.dv != p.d:
        return "the fp8 template needs V's value axis to be the head dimension"
    if p.lse is not None:
        return "the fp8 template writes no log-sum-exp output"
    for v, row in ((p.Q, p.q), (p.K, p.x), (p.V, p.x)):
        why = _rows_layout_problem(v, row, p.d, diagram.sizes)
        if why:
            return why
    try:
        chain, _ = _chain(p, diagram)
    except CodegenError as e:
        return str(e)
    if chain.nomask.lines:
        return ("the fp8 template takes positive scales and masks as score modifiers (the per-tensor scales "
                f"fold into the exponent); this diagram has {', '.join(chain.boxes)}")
    return tma_rows_reason(p, diagram.sizes)


def reason(p: AttentionProblem, diagram: Diagram, gpu=None, arch: str | None = None) -> str | None:
    """Why the fp8 template cannot run this attention on ``gpu`` / ``arch``, or None."""
    # the wgmma templates' target check alone (its dtype check is the 16-bit templates')
    why = wgmma_target_reason("bf16", gpu, arch)
    if why:
        return f"dtype fp8: the fp8 attention template multiplies on the 8-bit wgmma; {why}"
    return structure_reason(p, diagram)


def candidates(fam, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
    """One schedule per configuration that fits the shared memory (for masked scores, those
    without ping-pong: :func:`turns_for`); a CodegenError with the reason where the template
    cannot run the diagram on ``gpu`` (the planner reports it)."""
    p = fam.problem(diagram)
    why = reason(p, diagram, gpu)
    if why is not None:
        raise CodegenError(f"attention family: {why}")
    limit = _smem_limit(gpu)
    masked = score_kinds(p, diagram)[0]
    return [schedule(fam, diagram, c, gpu) for c in configs(diagram.axes[p.d].bound_size)
            if c.smem_bytes() <= limit and turns_for(c, masked) == c]


def schedule(fam, diagram: Diagram, cfg: Fp8AttentionConfig, gpu="h100") -> Schedule:
    """The schedule of a configuration: one woven combination per block, ``g_q = BQ`` at SMEM,
    ``w_q = 64`` at RF (a consumer warpgroup's rows), ``s_x = 128`` at SMEM, in fp8."""
    p = fam.problem(diagram)
    groups = {a: 1 for a in p.woven}
    groups[p.q] = cfg.BQ
    s = Schedule.fused(diagram, groups=groups, streams={p.x: BX}, rf_groups={p.q: 64}, gpu=_gpu_key(gpu),
                       dtype="fp8")
    return s.replace(kernels=(s.kernels[0].replace(family=fam.name, options=cfg.options()),))


def config_of(p: AttentionProblem, diagram: Diagram, sched: Schedule) -> Fp8AttentionConfig:
    """The configuration an fp8 schedule asks for, checked against what the template builds."""
    D = diagram.axes[p.d].bound_size
    table = configs(D)
    if not table:
        raise CodegenError(f"attention family (fp8): head dimension {D}; the template takes "
                           f"{' and '.join(map(str, HEAD_DIMS))}")
    BQ, WQ, BXs, _, _ = read_tiles(
        p, sched, "attention family (fp8)",
        f"it groups {p.q} at SMEM and in 64-row warpgroups at RF, streams {p.x} at SMEM in chunks of {BX}")
    opts = sched.kernels[0].options
    consumers = opts.warpgroups or (BQ // 64 if BQ else table[0].consumers)
    stages = opts.stages or table[0].stages
    known = [c for c in table if (c.consumers, c.stages) == (consumers, stages)]
    cfg = known[0] if known else Fp8AttentionConfig(D, consumers, stages)
    what = f"attention family (fp8): g_{p.q}={BQ}, w_{p.q}={WQ}, s_{p.x}={BXs}, warpgroups={consumers}"
    if BQ is not None and BQ != cfg.BQ:
        raise CodegenError(f"{what}: g_{p.q} must be 64 x the consumer warpgroups ({cfg.BQ})")
    if WQ not in (None, 64):
        raise CodegenError(f"{what}: w_{p.q} is one wgmma's 64 rows")
    if BXs not in (None, BX):
        raise CodegenError(f"{what}: s_{p.x} must be {BX} (one 128-byte row of Vt)")
    if not known:
        raise CodegenError(f"{what}, stages={cfg.stages}: the template builds (warpgroups, stages) in "
                           f"{[(c.consumers, c.stages) for c in table]} at d = {D}")
    return turns_for(cfg, score_kinds(p, diagram)[0])


def turns_for(cfg: Fp8AttentionConfig, masked: bool) -> Fp8AttentionConfig:
    """``cfg`` for scores with or without masks: masked scores (causal, sliding window) run without
    ping-pong, which measured slower there (H200, seq 8192, five stages: causal 742 TFLOP/s with it,
    775 without; non-causal 898 with it, 869 without; ``fp8_sweep_s30.jsonl``). The planner does
    not offer the table's ping-pong rows for masked scores (:func:`candidates`), so they keep four
    stages: five without ping-pong ran causal seq 8k and 16k 4-5 % faster but 4k 5 % slower
    (``attention_fp8_s30.jsonl``); this is for a schedule that names five stages all the same.

    >>> turns_for(Fp8AttentionConfig(128, 2, 5, True, 0, True), masked=True).pingpong
    False
    """
    return replace(cfg, pingpong=False) if masked and cfg.pingpong else cfg


def _vt_shape(p: AttentionProblem, sz) -> tuple[int, int, int]:
    """(key/value heads, D, XP): Vt's shape, x padded to whole chunks."""
    heads = math.prod(sz[a] for a in p.V.axis_names[:-2])
    return heads, sz[p.d], math.ceil(sz[p.x] / BX) * BX


def launch_estimate(fam, diagram: Diagram, sched: Schedule, gpu=None) -> dict:
    """Blocks, threads, registers, shared memory, bytes in flight (the ring's K and Vt chunks over
    the block's threads), the share of the exponentials computed on the FMA pipe and their cost
    there, and the pre-pass: one more launch reading V and writing Vt."""
    p = fam.problem(diagram)
    cfg = config_of(p, diagram, sched)
    sz = diagram.sizes
    blocks = math.ceil(sz[p.q] / cfg.BQ) * math.prod(sz[a] for a in p.woven)
    heads, D, XP = _vt_shape(p, sz)
    return dict(blocks=blocks, threads=cfg.threads, regs=min(255, 65536 // cfg.threads // 8 * 8),
                smem=cfg.smem_bytes(), in_flight_bytes_per_thread=2 * BX * cfg.D * cfg.stages / cfg.threads,
                threads_per_row=4, tensor_path="peak", overlap_operands=True, overlap_compute=False,
                exp_fma_share=cfg.fma_exp_share, fma_flops_per_exp=FMA_FLOPS_PER_EXP,
                extra_launches=1, extra_hbm_bytes=heads * sz[p.x] * D + heads * D * XP)


def _names(d: Diagram, p: AttentionProblem) -> str:
    """A buffer name for Vt that no array of the diagram has."""
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)} | set(d.output_names)
    name = f"{p.V.name}_t"
    while name in taken:
        name += "_"
    return name


def lower(fam, diagram: Diagram, sched: Schedule, arch: str) -> Program:
    """The Program of an fp8 schedule: the Vt pre-pass, then the attention kernel."""
    p = fam.problem(diagram)
    why = reason(p, diagram, arch=arch)
    if why:
        raise CodegenError(f"attention family: {why}")
    cfg = config_of(p, diagram, sched)
    check_derived(fam.name, sched.kernels[0].name, sched.kernels[0].options, cfg.options())
    sz = diagram.sizes
    vt = _names(diagram, p)
    heads, D, XP = _vt_shape(p, sz)
    buf = Buffer(vt, ("kv_head", p.d, "x_padded"), (heads, D, XP), "fp8")
    return Program(diagram, sched, fam.name, (_vt_launch(diagram, p, vt, XP, heads), _launch(diagram, p, cfg, vt, arch)),
                   (buf,), dict(sz))


def lower_config(fam, diagram: Diagram, cfg: Fp8AttentionConfig, arch: str = "sm_90a") -> Program:
    """The Program of one configuration as given (its two-stage loop too), for comparing the
    template's variants; :func:`lower` takes the configuration a schedule says."""
    p = fam.problem(diagram)
    why = reason(p, diagram, arch=arch)
    if why:
        raise CodegenError(f"attention family: {why}")
    if (cfg.D not in CONFIGS or cfg.consumers != 2 or not 2 <= cfg.stages <= 7 or not 0 <= cfg.poly <= 16
            or (cfg.pingpong and not cfg.overlap)):
        raise CodegenError(f"attention family (fp8): {cfg} is not a configuration the template builds "
                           "(two consumers, 2 to 7 stages, 0 to 16 exps of 16 on the FMA pipe, ping-pong "
                           "only with the two-stage loop)")
    sz = diagram.sizes
    vt = _names(diagram, p)
    heads, D, XP = _vt_shape(p, sz)
    buf = Buffer(vt, ("kv_head", p.d, "x_padded"), (heads, D, XP), "fp8")
    return Program(diagram, schedule(fam, diagram, cfg), fam.name,
                   (_vt_launch(diagram, p, vt, XP, heads), _launch(diagram, p, cfg, vt, arch)), (buf,), dict(sz))


def with_scales(program: Program, *, descale_q: float = 1.0, descale_k: float = 1.0, descale_v: float = 1.0,
                scale_o: float = 1.0) -> Program:
    """The same program with other per-tensor scales: attention of ``Q·descale_q``,
    ``K·descale_k``, ``V·descale_v``, stored as ``O·scale_o`` (each positive and finite).

    >>> from napkin.codegen.families.attention import FAMILY
    >>> from napkin.diagrams import library
    >>> d = library.get("mha").bind(h=2, q=256, x=256, d=128).with_dtype("fp8")
    >>> prog = FAMILY.lower(d, schedule(FAMILY, d, configs(128)[0]), "sm_90a")
    >>> [a.value for a in with_scales(prog, descale_v=0.5).launches[-1].args if a.name in SCALES]
    [1.0, 1.0, 0.5, 1.0]
    """
    given = dict(descale_q=descale_q, descale_k=descale_k, descale_v=descale_v, scale_o=scale_o)
    for n, v in given.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise CodegenError(f"with_scales: {n} must be a positive finite number, got {v!r}")
    launches = []
    found = False
    for k in program.launches:
        if k.template == TEMPLATE:
            found = True
            k = replace(k, args=tuple(replace(a, value=float(given[a.name])) if a.kind == "float" and a.name in given
                                      else a for a in k.args))
        launches.append(k)
    if not found:
        raise CodegenError(f"with_scales: program of {program.diagram.name!r} has no fp8 attention launch "
                           f"(families: {program.family})")
    return replace(program, launches=tuple(launches))


def _vt_launch(d: Diagram, p: AttentionProblem, vt: str, XP: int, heads: int) -> KernelLaunch:
    sz = d.sizes
    D, Nx = sz[p.d], sz[p.x]
    params = [
        Param(Arg("tensor", p.V.name, dtype="fp8", axes=p.V.axis_names), Code("const unsigned char* __restrict__ V")),
        Param(Arg("tensor", vt, dtype="fp8", axes=("kv_head", p.d, "x_padded")), Code("unsigned char* __restrict__ Vt")),
        int_param("Nx", Nx), int_param("XP", XP, "keys of a Vt row (padded to whole chunks)"),
    ]
    tag = short_hash("vt", D)
    kname = Code(f"napkin_attn_fp8_vt_d{D}_{tag}")
    legend = [f"diagram {d.name}: {p.V.label()} (fp8) -> {vt}[kv_head,{p.d},x_padded]",
              f"  {p.x} -> Nx keys, XP = {XP} (whole chunks of {BX}); {p.d} -> D = {D}; heads = {heads} (grid.y)"]
    source = render(VT_TEMPLATE, kname=kname, D=D, THREADS=VT_THREADS, params=signature(params),
                    legend=comment_lines(legend), FOLD=grid_folds(heads), NZ=heads)
    return KernelLaunch(name=str(kname), source=source, grid=(XP // BX, *fold_grid(heads)), block=(VT_THREADS, 1, 1),
                        shared_bytes=0, args=tuple(x.arg for x in params), template=VT_TEMPLATE,
                        tunables=(("D", D),), model_smem_bytes=BX * (D + 4), model_regs_per_thread=32)


def _launch(d: Diagram, p: AttentionProblem, cfg: Fp8AttentionConfig, vt: str, arch: str) -> KernelLaunch:
    sz = d.sizes
    Nq, Nx = sz[p.q], sz[p.x]
    check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16, "attention")
    check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16, "attention")
    sQ, sK, sV, sO = (contiguous_strides(v) for v in (p.Q, p.K, p.V, p.O))
    out = d.output_names[0]

    def tmap(name: str, cname: str, box, axes) -> Param:
        return Param(Arg("tmap", name, value=tuple(box), dtype="fp8", axes=axes),
                     Code(f"const __grid_constant__ napkin::TensorMap {cname}"))

    params: list[Param] = [
        tmap(p.Q.name, "tmQ", (128, cfg.BQ), p.Q.axis_names), tmap(p.K.name, "tmK", (128, BX), p.K.axis_names),
        tmap(vt, "tmVt", (BX, cfg.D), ("kv_head", p.d, "x_padded")),
        Param(Arg("tensor", out, dtype="fp8", axes=p.O.axis_names), Code("unsigned char* __restrict__ O")),
        int_param("Nq", Nq), int_param("Nx", Nx),
        int_param("sO_q", sO[p.q], f"row stride of {out}[{','.join(p.O.axis_names)}]"),
    ]
    fixed = {str(x.decl).split()[-1] for x in params} | set(SCALES) | {"scale_log2"}
    woven = []
    nz = 1
    for ax in p.woven:
        nz *= sz[ax]

        def name(prefix: str) -> Code:
            n = ident(ax, prefix)
            return n if n not in fixed else ident(ax, prefix[:-1] + "w_")

        names = dict(idx=ident(ax, "i_"), size=name("n_"), rQ=name("rQ_"), rK=name("rK_"), rV=name("rV_"),
                     sO=name("sO_"), axis=ax)
        rows = {}
        for key, v, s, row in (("rQ", p.Q, sQ, p.q), ("rK", p.K, sK, p.x)):
            stride = s.get(ax, 0)
            if stride % s[row]:
                raise CodegenError(f"attention family (fp8): {v.label()}'s stride along {ax} is not whole rows")
            rows[key] = stride // s[row]
        # Vt: D rows a key/value head (V's stride along ax is a whole number of heads of Nx rows)
        if sV.get(ax, 0) % (Nx * cfg.D):
            raise CodegenError(f"attention family (fp8): {p.V.label()}'s stride along {ax} is not whole heads")
        rows["rV"] = sV.get(ax, 0) // (Nx * cfg.D) * cfg.D
        params += [int_param(names["size"], sz[ax]),
                   int_param(names["rQ"], rows["rQ"], f"rows of {p.Q.label()} per index of {ax}"),
                   int_param(names["rK"], rows["rK"], f"rows of {p.K.label()} per index of {ax}"),
                   int_param(names["rV"], rows["rV"], f"rows of {vt} per index of {ax}"),
                   stride_param(names["sO"], sO[ax], f"stride of the output along {ax}")]
        woven.append(names)
    if why := woven_reason(nz):
        raise CodegenError(f"attention family: {why}")
    chain, index_vars = _chain(p, d)
    float_idx = max(Nq, Nx) < 2 ** 24
    params.append(float_param("scale_log2", chain.factor * LOG2E))
    params += [float_param(s, 1.0) for s in SCALES]
    causal, window, always_mask = _masks(p, chain)
    if cfg.pingpong and (cfg.consumers != 2 or not cfg.overlap):
        # the turns are taken in the two-stage loop only: elsewhere the barriers would never meet
        raise CodegenError(f"attention family (fp8): {cfg}: ping-pong needs two consumers and the two-stage loop")
    smem = cfg.smem_bytes()
    limit = _smem_limit(None, arch)
    if smem > limit:
        raise CodegenError(f"attention family (fp8): the tiles need {smem} bytes of shared memory; "
                           f"{arch} allows {limit} per block")
    tag = short_hash("fp8", [str(x) for x in chain.full.lines], p.woven, causal, window, always_mask, cfg, float_idx)
    kname = Code(f"napkin_attn_wgmma_fp8_d{cfg.D}_q{cfg.BQ}_s{cfg.stages}{'_2st' if cfg.overlap else ''}"
                 f"{f'_e{cfg.poly}' if cfg.poly else ''}{'_pp' if cfg.pingpong else ''}_{tag}")
    legend = [
        "(sequence lengths, woven sizes and the per-tensor scales are kernel arguments; D is compiled in)",
        f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()} -> {out}[{','.join(p.O.axis_names)}], fp8 e4m3",
        f"  {p.q} -> queries Nq: g_{p.q} = BQ = {cfg.BQ} (CONSUMERS = {cfg.consumers} warpgroups), w_{p.q} = 64",
        f"  {p.x} -> keys Nx:    s_{p.x} = BX = {BX}, stages = STAGES = {cfg.stages}; V read as {vt} (the pre-pass)",
        f"  {p.d} -> D = {cfg.D}",
        *[f"  {ax} -> woven (grid.y)" + ("" if ax in p.K.axis_names else "; K, V broadcast along it")
          for ax in p.woven],
        f"  engine: wgmma e4m3 + TMA; registers {PRODUCER_REGS} (producer) / {cfg.consumer_regs()} (consumers)",
        f"  exp2: POLY = {cfg.poly} of every 16 on the FMA pipe, the rest on the SFU; "
        f"ping-pong between the consumers: {'yes' if cfg.pingpong else 'no'}",
        f"  score modifiers: {', '.join(chain.boxes) or 'none'}; softmax scale folded: {chain.factor:.6g}",
        "  per-tensor scales: " + ", ".join(SCALES) + " (float arguments, 1 unless set)",
    ]
    legend += mask_legend(causal, window)
    ctx = dict(
        kname=kname, D=cfg.D, STAGES=cfg.stages, CONSUMERS=cfg.consumers, PRODUCER_REGS=PRODUCER_REGS,
        CONSUMER_REGS=cfg.consumer_regs(),
        params=signature(params), legend=comment_lines(legend), woven=woven,
        **shared_context(p, chain, index_vars, float_idx, (causal, window, always_mask), BX // 2, cfg.D // 2),
        chain_desc=comment(", ".join(chain.boxes) or "none"), OVERLAP=cfg.overlap, POLY=cfg.poly,
        PINGPONG=cfg.pingpong, FOLD=grid_folds(nz), NZ=nz,
    )
    source = render(TEMPLATE, **ctx)
    tunables = (("BQ", cfg.BQ), ("BX", BX), ("WQ", 64), ("stages", cfg.stages), ("D", cfg.D),
                ("warpgroups", cfg.consumers), ("engine", "wgmma"), ("dtype", "fp8"), ("causal", causal),
                ("window", window), ("overlap", cfg.overlap), ("poly", cfg.poly), ("pingpong", cfg.pingpong))
    return KernelLaunch(
        name=str(kname), source=source, grid=(math.ceil(Nq / cfg.BQ), *fold_grid(nz)), block=(cfg.threads, 1, 1),
        shared_bytes=smem, args=tuple(x.arg for x in params), template=TEMPLATE, tunables=tunables,
        model_smem_bytes=cfg.model_smem_bytes(), model_regs_per_thread=cfg.consumer_regs(),
    )
