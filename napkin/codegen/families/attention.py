"""The streamed attention family: FlashAttention-2 style forward on mma.sync.

A diagram belongs here when it is ``O = softmax_x(mods(Q·K over d))·V``: one contraction of two
inputs ``Q[.., q, d]`` and ``K[.., x, d]``, a chain of unary whitelisted maps on the scores
(scale, soft-capping, ALiBi, causal and sliding-window masks — read off the diagram's Map boxes),
a softmax over the key axis ``x`` and a contraction with ``V[.., x, d]`` over ``x``; woven over any
further axes of Q (heads ``h``, GQA query groups ``j``), K and V broadcast along those they lack.
The library's ``attention``, ``mha``, ``attention_causal``, ``gqa``, ``attention_window``,
``attention_alibi`` and ``attention_softcap`` are all of this shape. bf16 and fp16 only: fp32
attention is left to the fallback family.

Schedule: group ``q`` at SMEM (``g_q`` rows per thread block) and at RF (``w_q`` rows per warp,
16 or 32), stream ``x`` at SMEM in chunks of ``s_x`` (K/V pipeline of ``stages=N``, default 2).
Positive scales fold into the softmax's exp2; masks that come last let whole key blocks be
skipped (causal, sliding window) and leave the per-element mask to the blocks on the boundary.

>>> from napkin.diagrams import library
>>> fam = AttentionFamily()
>>> fam.matches(library.get("gqa")), fam.matches(library.get("mlp"))
(True, False)
>>> d = library.get("attention_causal").bind(h=2, q=1000, x=1000, d=128)
>>> prog = fam.lower(d, fam.candidates(d, "h100", "bf16")[0], "sm_90a")
>>> prog.launches[0].grid, prog.launches[0].block
((8, 2, 1), (128, 1, 1))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...diagrams.diagram import Diagram
from ...diagrams.ops import Contract, Map, Softmax, Value
from ...errors import CodegenError
from ...perfmodel.schedule import KernelOptions, Schedule
from ..program import KernelLaunch, Program
from ..render import Code, comment, comment_lines, ident
from .contraction import _gpu_key, _smem_limit
from .epilogue import (Param, check_index_size, contiguous_strides, ctype, float_param, index_size_problem,
                       int_param, render, score_chain, short_hash, signature, stride_param, tensor_param)

__all__ = ["AttentionFamily", "AttentionProblem", "AttentionConfig", "analyze", "FAMILY", "CONFIGS",
           "PLAIN_CONFIGS"]

LOG2E = 1.4426950408889634
PAD = 8

#: (g_q, s_x, w_q, stages, thread blocks per SM assumed) per head-dimension bound, best first.
#: The blocks per SM set the register budget (``__launch_bounds__``): 65536 / (threads x blocks).
#: Configurations whose S and O tiles overflow 255 registers (w_q = 32 with s_x = 64 at d = 128,
#: s_x = 128 at d = 64) are left out: they spill.
#: With w_q = 32 and d > 64 the S tile of a 64-key chunk does not fit beside O: such chunks are
#: walked in register sub-chunks of t_x = 32 keys (a stream of x at RF; see AttentionConfig.SX).
CONFIGS = {
    64: ((128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    128: ((128, 32, 32, 2, 2), (128, 64, 32, 2, 2), (128, 64, 16, 2, 1), (64, 64, 16, 2, 2)),
    256: ((64, 32, 16, 2, 2), (64, 64, 16, 2, 1)),
}

#: Kept for callers that asked for configurations of plain attention (no score modifiers).
PLAIN_CONFIGS = {64: (), 128: (), 256: ()}


@dataclass(frozen=True)
class AttentionProblem:
    """What the family read off a diagram."""

    Q: Value
    K: Value
    V: Value
    S: Value
    maps: tuple[Value, ...]
    P: Value
    O: Value
    q: str
    x: str
    d: str
    dv: str
    woven: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class AttentionConfig:
    BQ: int
    BX: int
    WQ: int
    stages: int
    D: int
    blocks_per_sm: int = 1
    sx: int = 0  # t_x: keys per register sub-chunk (0: the default rule)

    @property
    def SX(self) -> int:
        """Keys of S held in registers at once: BX, or 32 when a w_q = 32 warp's WQ x BX scores
        would not fit beside its WQ x D output (d > 64)."""
        if self.sx:
            return self.sx
        return 32 if (self.WQ == 32 and self.D > 64 and self.BX > 32) else self.BX

    @property
    def threads(self) -> int:
        return self.BQ // self.WQ * 32

    @property
    def q_in_regs(self) -> bool:
        """Q fragments stay in registers when they take at most 32 registers a thread."""
        return (self.WQ // 16) * (self.D // 16) * 4 <= 32

    def smem_bytes(self, elem: int = 2) -> int:
        return (self.BQ + 2 * self.stages * self.BX) * (self.D + PAD) * elem

    def model_smem_bytes(self, elem: int = 2) -> int:
        """The model's accounting: K and V chunks times the stages, plus the Q tile."""
        return (2 * self.BX * self.D * self.stages + self.BQ * self.D) * elem

    def model_regs(self) -> int:
        """The register budget per thread: what keeps ``blocks_per_sm`` blocks resident."""
        return min(255, 65536 // (self.threads * self.blocks_per_sm) // 8 * 8)


def _chain(S: Value, P: Value) -> list[Value] | None:
    """The unary maps from S to the softmax's input, in order (None if not such a chain)."""
    chain = []
    v = P.args[0]
    while v is not S:
        if not isinstance(v.op, Map) or len(v.args) != 1:
            return None
        chain.append(v)
        v = v.args[0]
    return list(reversed(chain))


def _reason_or_problem(diagram: Diagram) -> AttentionProblem | str:
    if len(diagram.outputs) != 1:
        return "attention writes one output"
    O = diagram.outputs[0]
    if not isinstance(O.op, Contract) or len(O.args) != 2 or len(O.op.over) != 1:
        return "the output is not a contraction of the probabilities with V over one axis"
    x = O.op.over[0]
    softmaxes = [a for a in O.args if isinstance(a.op, Softmax)]
    if len(softmaxes) != 1:
        return "the output contraction does not read a softmax"
    P = softmaxes[0]
    V = O.args[1] if O.args[0] is P else O.args[0]
    if P.op.over != x or not V.is_input:
        return f"the softmax must run over the contracted axis {x!r} and V must be an input"
    S = P.args[0]
    while isinstance(S.op, Map) and len(S.args) == 1:
        S = S.args[0]
    if not isinstance(S.op, Contract) or len(S.args) != 2 or len(S.op.over) != 1:
        return "the softmax does not read scores Q·K (through unary maps)"
    d = S.op.over[0]
    chain = _chain(S, P)
    if chain is None:
        return "the score modifiers are not a chain of unary maps"
    Qs = [a for a in S.args if x not in a.axis_names]
    Ks = [a for a in S.args if x in a.axis_names]
    if len(Qs) != 1 or len(Ks) != 1 or not Qs[0].is_input or not Ks[0].is_input:
        return "the scores must contract a query input (without x) with a key input (with x)"
    Q, K = Qs[0], Ks[0]
    known = {id(v) for v in (S, P, O, *chain)}
    extra = [diagram.name_of(v) for v in diagram.nodes if id(v) not in known]
    if extra:
        return f"boxes {extra} are not part of the attention pattern"
    for v in (S, P, *chain):
        users = diagram.consumers.get(id(v), ())
        if len(users) != 1:
            return f"{diagram.name_of(v)} is read by {len(users)} boxes"
    dv_axes = [n for n in V.axis_names if n != x and n not in Q.axis_names]
    dv = d if d in V.axis_names else (dv_axes[0] if len(dv_axes) == 1 else None)
    if dv is None:
        return f"V {V.label()} needs one value axis (the head dimension)"
    q_cands = [n for n in Q.axis_names if n != d and n not in K.axis_names and n not in V.axis_names]
    if not q_cands:
        return f"Q {Q.label()} has no query axis"
    q = None
    for m in chain:
        ia = m.op.index_axes
        if x in ia:
            for n in ia:
                if n in q_cands:
                    q = n
    if q is None:
        q = "q" if "q" in q_cands else q_cands[-1]
    woven = tuple(n for n in Q.axis_names if n not in (q, d))
    for n in K.axis_names:
        if n not in (x, d) and n not in woven:
            return f"K's axis {n!r} is neither the key, the head dimension nor woven"
    for n in V.axis_names:
        if n not in (x, dv) and n not in woven:
            return f"V's axis {n!r} is neither the key, the value dimension nor woven"
    if set(O.axis_names) != set(woven) | {q, dv}:
        return f"the output carries {list(O.axis_names)}"
    for arr, last in ((Q, d), (K, d), (V, dv), (O, dv)):
        if arr.axis_names[-1] != last:
            return f"{diagram.name_of(arr)}[{','.join(arr.axis_names)}] must be stored with {last!r} last"
    if len({v.dtype for v in (Q, K, V)}) != 1:
        return "Q, K, V have different dtypes"
    return AttentionProblem(Q, K, V, S, tuple(chain), P, O, q, x, d, dv, woven, Q.dtype)


def analyze(diagram: Diagram) -> AttentionProblem:
    p = _reason_or_problem(diagram)
    if isinstance(p, str):
        raise CodegenError(f"attention family: diagram {diagram.name!r}: {p}")
    return p


def loader_problem(cfg: "AttentionConfig") -> str | None:
    """Why the template's K/V loader cannot split a chunk of this configuration, or None. Each
    thread keeps one column of 16-byte pieces (d/8 of them a row) and walks the chunk's rows:
    d/8 must divide the threads and the rows must split evenly (d = 48, 80, 96... cannot; nor
    d = 16 with 256 threads and 64-key chunks)."""
    per_row = cfg.D // 8
    if cfg.D % 8 or cfg.threads % per_row:
        return (f"head dimension {cfg.D}: {per_row} 16-byte pieces a row do not divide the "
                f"{cfg.threads} threads (the template takes d = 16, 32, 64, 128 or 256)")
    step = cfg.threads // per_row
    if cfg.BX % step:
        return f"a chunk of {cfg.BX} keys does not split over {step}-row steps of {cfg.threads} threads"
    return None


def _dbound(D: int) -> int:
    for bound in sorted(CONFIGS):
        if D <= bound:
            return bound
    raise CodegenError(f"attention family: head dimension {D} is over 256")


class AttentionFamily:
    """Streamed attention forward, bf16/fp16, mma.sync with the online softmax in registers."""

    name = "attention"

    def why_not(self, diagram: Diagram) -> str | None:
        p = _reason_or_problem(diagram)
        if isinstance(p, str):
            return p
        if p.dtype not in ("bf16", "fp16"):
            return f"dtype {p.dtype}: the tensor-core template runs bf16 and fp16 (fp32 goes to the fallback)"
        sz = diagram.sizes
        why = index_size_problem(sz, [(sz.get(p.q), f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16),
                                      (sz.get(p.x), f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16)],
                                 "attention")
        if why:
            return why
        for ax in (p.d, p.dv):
            size = diagram.axes[ax].size
            if isinstance(size, int) and (size % 16 or size > 256):
                return f"head dimension {ax}={size} must be a multiple of 16, at most 256"
        sd, sv = diagram.axes[p.d].size, diagram.axes[p.dv].size
        if isinstance(sd, int) and isinstance(sv, int) and sd != sv:
            return f"head dimensions differ ({p.d}={sd}, {p.dv}={sv})"
        if isinstance(sd, int):
            problems = [loader_problem(c) for c in self.configs(sd)]
            if all(problems):
                return problems[0]
        return None

    def matches(self, diagram: Diagram) -> bool:
        return self.why_not(diagram) is None

    explain = why_not  # the family protocol's name: None if it takes the diagram, else why not

    def configs(self, D: int, plain: bool = False) -> list[AttentionConfig]:
        """The tile configurations for head dimension D, best first (``plain``: the diagram has
        no score modifier but the scale, which frees the registers of the mask code)."""
        table = (PLAIN_CONFIGS[_dbound(D)] if plain else ()) + CONFIGS[_dbound(D)]
        return [AttentionConfig(bq, bx, wq, st, D, nb) for bq, bx, wq, st, nb in table]

    @staticmethod
    def is_plain(diagram: Diagram) -> bool:
        """Whether the only score modifiers are positive scales."""
        p = analyze(diagram)
        for m in p.maps:
            if m.op.fn != "scale":
                return False
            try:
                if m.op.param_values(diagram.sizes)[0] <= 0:
                    return False
            except Exception:  # noqa: BLE001 - symbolic: decide once bound
                return False
        return True

    def candidates(self, diagram: Diagram, gpu, dtype: str) -> list[Schedule]:
        p = analyze(diagram)
        D = diagram.axes[p.d].size
        if not isinstance(D, int):
            raise CodegenError("attention family: bind the head dimension before asking for candidates")
        limit = _smem_limit(gpu)
        return [self.schedule(diagram, c, gpu=gpu, dtype=dtype) for c in self.configs(D, self.is_plain(diagram))
                if c.smem_bytes() <= limit and loader_problem(c) is None]

    def schedule(self, diagram: Diagram, cfg: AttentionConfig, gpu="h100", dtype: str | None = None) -> Schedule:
        p = analyze(diagram)
        streams = {p.x: cfg.BX} if cfg.SX == cfg.BX else {p.x: [(cfg.BX, "SMEM"), (cfg.SX, "RF")]}
        # one combination of the woven axes (heads, batch) per block: a group of 1 on each
        s = Schedule.fused(diagram, groups={**{a: 1 for a in p.woven}, p.q: cfg.BQ}, streams=streams,
                           rf_groups={p.q: cfg.WQ}, gpu=_gpu_key(gpu), dtype=dtype or p.dtype)
        opts = KernelOptions(engine="mma.sync", stages=cfg.stages, warps=cfg.threads // 32,
                             blocks_per_sm=cfg.blocks_per_sm, regs_per_thread=cfg.model_regs())
        return s.replace(kernels=(s.kernels[0].replace(family=self.name, options=opts),))

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu=None) -> dict:
        """Blocks, threads, register budget, shared memory and bytes in flight per thread (the
        K and V chunks loaded STAGES - 1 ahead)."""
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        sz = diagram.sizes
        nz = math.prod(sz[a] for a in p.woven) if p.woven else 1
        return dict(blocks=math.ceil(sz[p.q] / cfg.BQ) * nz, threads=cfg.threads, regs=cfg.model_regs(),
                    smem=cfg.smem_bytes(2),
                    in_flight_bytes_per_thread=2 * cfg.BX * cfg.D * 2 * max(1, cfg.stages - 1) / cfg.threads,
                    # a row of S lives in the 4 lanes of an mma.m16n8k16 fragment row: its max and sum
                    # are 2 shuffle stages
                    threads_per_row=4)

    def config_of(self, p: AttentionProblem, diagram: Diagram, schedule: Schedule) -> AttentionConfig:
        if len(schedule.kernels) != 1:
            raise CodegenError("attention family: the schedule must fuse every box into one kernel "
                               f"(it has {len(schedule.kernels)}); unfused attention is the fallback's")
        D = diagram.axes[p.d].bound_size
        plain = self.is_plain(diagram)
        default = self.configs(D, plain)[0]
        BQ = BX = WQ = SX = None
        for r in schedule.kernels[0].relabels:
            if r.is_symbolic:
                raise CodegenError(f"attention family: {r} has no size; bind {r.symbol} first")
            if r.kind == "group" and r.axis == p.q and r.level == "SMEM":
                BQ = int(r.size)
            elif r.kind == "group" and r.axis == p.q and r.level == "RF":
                WQ = int(r.size)
            elif r.kind == "stream" and r.axis == p.x and r.level == "SMEM":
                BX = int(r.size)
            elif r.kind == "stream" and r.axis == p.x and r.level == "RF":
                SX = int(r.size)
            elif r.kind == "group" and r.axis in p.woven and r.size == 1:
                continue
            else:
                raise CodegenError(f"attention family: the template cannot realise {r} (it groups "
                                   f"{p.q} at SMEM and RF and streams {p.x} at SMEM)")
        BQ = BQ or default.BQ
        BX = BX or default.BX
        WQ = WQ or (default.WQ if BQ % default.WQ == 0 else 16)
        opts = schedule.kernels[0].options
        if opts.engine not in (None, "mma.sync"):
            raise CodegenError(f"attention family: engine {opts.engine} is not built here (mma.sync)")
        stages, blocks = opts.stages or 2, opts.blocks_per_sm
        if blocks is None:
            known = [c for c in self.configs(D, plain) if (c.BQ, c.BX, c.WQ) == (BQ, BX, WQ)]
            blocks = known[0].blocks_per_sm if known else 1
        cfg = AttentionConfig(BQ, BX, WQ, stages, D, blocks, SX or 0)
        what = f"attention family: g_{p.q}={BQ}, w_{p.q}={WQ}, s_{p.x}={BX}, stages={stages}, d={D}"
        if WQ not in (16, 32) or BQ % WQ:
            raise CodegenError(f"{what}: w_{p.q} must be 16 or 32 and divide g_{p.q}")
        if BX % 16 or BX > 128 or BX < 16:
            raise CodegenError(f"{what}: s_{p.x} must be a multiple of 16, at most 128")
        if cfg.SX % 16 or BX % cfg.SX:
            raise CodegenError(f"{what}: the register stream t_{p.x}={cfg.SX} must be a multiple of 16 "
                               f"dividing s_{p.x}")
        if not 32 <= cfg.threads <= 512:
            raise CodegenError(f"{what}: {cfg.threads} threads per block")
        if not 2 <= stages <= 4:
            raise CodegenError(f"{what}: stages must be 2 to 4")
        if WQ * (D + cfg.SX) > 32 * (128 + 64):
            raise CodegenError(f"{what}: the warp's S and O tiles do not fit in registers")
        problem = loader_problem(cfg)
        if problem:
            raise CodegenError(f"{what}: {problem}")
        return cfg

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        reason = self.why_not(diagram)
        if reason:
            raise CodegenError(f"attention family: diagram {diagram.name!r}: {reason}")
        if not diagram.is_bound:
            raise CodegenError(f"attention family: bind the sizes of {diagram.name!r} first")
        p = analyze(diagram)
        cfg = self.config_of(p, diagram, schedule)
        launch = self._launch(diagram, p, cfg, arch)
        return Program(diagram, schedule, self.name, (launch,), (), dict(diagram.sizes))

    def _launch(self, d: Diagram, p: AttentionProblem, cfg: AttentionConfig, arch: str) -> KernelLaunch:
        T = p.dtype
        sz = d.sizes
        Nq, Nx = sz[p.q], sz[p.x]
        sQ, sK, sV, sO = (contiguous_strides(v) for v in (p.Q, p.K, p.V, p.O))
        # query and key positions are 32-bit ints, summed with tiles and mask offsets (< 2^30)
        check_index_size(Nq, f"axis {p.q!r} of {p.Q.label()}", 2 ** 30 + 2 ** 16, "attention")
        check_index_size(Nx, f"axis {p.x!r} of {p.K.label()}", 2 ** 30 + 2 ** 16, "attention")
        params: list[Param] = [
            tensor_param(p.Q, "Q", T), tensor_param(p.K, "K", T), tensor_param(p.V, "V", T),
            tensor_param(p.O, "O", T, const=False, name=d.output_names[0]),
            int_param("Nq", Nq), int_param("Nx", Nx),
            int_param("sQ_q", sQ[p.q], f"row stride of {p.Q.label()}"),
            int_param("sK_x", sK[p.x], f"row stride of {p.K.label()}"),
            int_param("sV_x", sV[p.x], f"row stride of {p.V.label()}"),
            int_param("sO_q", sO[p.q], f"row stride of {d.output_names[0]}[{','.join(p.O.axis_names)}]"),
        ]
        woven = []
        nz = 1
        # the fixed stride names above are prefix + axis name too: a woven axis called q or x
        # (the query axis being named otherwise) takes another prefix, never a duplicate parameter
        fixed = {str(x.decl).split()[-1] for x in params}

        def woven_name(ax: str, prefix: str) -> Code:
            name = ident(ax, prefix)
            return name if name not in fixed else ident(ax, prefix[:-1] + "w_")

        for ax in p.woven:
            n = sz[ax]
            nz *= n
            names = dict(idx=ident(ax, "i_"), size=ident(ax, "n_"), sQ=woven_name(ax, "sQ_"),
                         sK=woven_name(ax, "sK_"), sV=woven_name(ax, "sV_"), sO=woven_name(ax, "sO_"))
            params += [int_param(names["size"], n),
                       stride_param(names["sQ"], sQ[ax], f"stride of {p.Q.label()} along {ax}"),
                       stride_param(names["sK"], sK.get(ax, 0), f"stride of {p.K.label()} along {ax}"),
                       stride_param(names["sV"], sV.get(ax, 0), f"stride of {p.V.label()} along {ax}"),
                       stride_param(names["sO"], sO[ax], f"stride of the output along {ax}")]
            woven.append(names)
        if nz > 65535:
            raise CodegenError(f"attention family: {nz} woven combinations (heads x batch); at most 65535")
        index_vars = {ax: ident(ax, "i_") for ax in (p.q, p.x, *p.woven)}
        chain = score_chain(d, p.maps, index_vars=index_vars)
        # query and key indices reach the score modifiers as floats (exact below 2^24): one add
        # per score instead of an int -> float conversion on the slow conversion unit
        float_idx = max(Nq, Nx) < 2 ** 24
        params.append(float_param("scale_log2", chain.factor * LOG2E))

        causal = window = None
        always_mask = False
        if chain.masks:
            if not chain.masks_last:
                always_mask = True
            else:
                for fn, prm, axes in chain.masks:
                    if abs(float(prm[0])) >= 2 ** 30:  # block skipping adds offsets in 32-bit ints
                        always_mask = True
                    elif fn == "causal" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                        off = int(prm[0])
                        causal = off if causal is None else min(causal, off)
                    elif fn == "sliding_window" and axes == (p.q, p.x) and float(prm[0]).is_integer():
                        w = int(prm[0])
                        window = w if window is None else min(window, w)
                    else:
                        always_mask = True
        reverse = causal is not None and window is None

        smem = cfg.smem_bytes(2)
        limit = _smem_limit(None, arch)
        if smem > limit:
            raise CodegenError(f"attention family: the tiles need {smem} bytes of shared memory; "
                               f"{arch} allows {limit} per block")
        tag = short_hash(T, [str(x) for x in chain.full.lines], [str(x) for x in chain.nomask.lines],
                         p.woven, causal, window, always_mask, cfg, float_idx)
        sub = f"t{cfg.SX}" if cfg.SX != cfg.BX else ""
        kname = Code(f"napkin_attn_{T}_d{cfg.D}_q{cfg.BQ}_x{cfg.BX}{sub}_w{cfg.WQ}_s{cfg.stages}_{tag}")
        chain_desc = ", ".join(chain.boxes) or "none"
        ctx = dict(
            kname=kname, T=ctype(T), D=cfg.D, BQ=cfg.BQ, BX=cfg.BX, SX=cfg.SX, WQ=cfg.WQ, STAGES=cfg.stages,
            Q_IN_REGS=cfg.q_in_regs, MIN_BLOCKS=cfg.blocks_per_sm, params=signature(params), woven=woven,
            legend=comment_lines(self._legend(d, p, cfg, chain, causal, window)),
            REVERSE=reverse, CAUSAL=causal, WINDOW=window, ALWAYS_MASK=always_mask,
            IDX_ROW=index_vars[p.q], IDX_COL=index_vars[p.x],
            FLOAT_IDX=float_idx, IDX_TYPE=Code("const float" if float_idx else "const int"),
            ROW_BASE=Code("frow_lo" if float_idx else "row_lo"), COL_BASE=Code("fx0" if float_idx else "x0"),
            full_body=chain.full.body("        "), full_result=chain.full.result,
            nomask_body=chain.nomask.body("        "), nomask_result=chain.nomask.result,
            NOMASK_NEEDED=bool(chain.nomask.lines), chain_desc=comment(chain_desc),
        )
        source = render("attention_fwd.cu.jinja", **ctx)
        grid = (math.ceil(Nq / cfg.BQ), nz, 1)
        tunables = (("BQ", cfg.BQ), ("BX", cfg.BX), ("SX", cfg.SX), ("WQ", cfg.WQ), ("stages", cfg.stages), ("D", cfg.D),
                    ("blocks_per_sm", cfg.blocks_per_sm),
                    ("q_in_regs", cfg.q_in_regs), ("causal", causal), ("window", window))
        return KernelLaunch(
            name=str(kname), source=source, grid=grid, block=(cfg.threads, 1, 1), shared_bytes=smem,
            args=tuple(x.arg for x in params), template="attention_fwd.cu.jinja", tunables=tunables,
            model_smem_bytes=cfg.model_smem_bytes(2), model_regs_per_thread=cfg.model_regs(),
        )

    @staticmethod
    def _legend(d: Diagram, p: AttentionProblem, cfg: AttentionConfig, chain, causal, window) -> list[str]:
        lines = [
            "(sequence lengths and woven sizes are kernel arguments; D is compiled in)",
            f"diagram {d.name}: {p.Q.label()}, {p.K.label()}, {p.V.label()} -> "
            f"{d.output_names[0]}[{','.join(p.O.axis_names)}], {p.dtype}",
            f"  {p.q} -> queries Nq: g_{p.q} = BQ = {cfg.BQ}, w_{p.q} = WQ = {cfg.WQ}",
            f"  {p.x} -> keys Nx:    s_{p.x} = BX = {cfg.BX}, stages = {cfg.stages}, t_{p.x} = SX = {cfg.SX}",
            f"  {p.d} -> D = {cfg.D}" + (f" (values: {p.dv})" if p.dv != p.d else ""),
        ]
        for ax in p.woven:
            lines.append(f"  {ax} -> woven (grid.y)"
                         + ("" if ax in p.K.axis_names else "; K, V broadcast along it"))
        lines.append(f"  score modifiers: {', '.join(chain.boxes) or 'none'}; softmax scale folded: "
                     f"{chain.factor:.6g}")
        if causal is not None:
            lines.append(f"  causal (offset {causal}): key blocks above the diagonal skipped")
        if window is not None:
            lines.append(f"  sliding window {window}: key blocks outside it skipped")
        return lines


FAMILY = AttentionFamily()
