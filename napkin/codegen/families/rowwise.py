"""The row-wise fused family: one softmax / layernorm / rmsnorm over an axis ``x``, with
elementwise prologue maps before it and an epilogue after it, in one pass over HBM.

What it accepts: every box is an elementwise map except exactly one softmax or norm over ``x``;
every array lives on the norm's axes (the *row* axes, woven, and ``x``, normalised); arrays in
HBM that carry ``x`` hold it innermost (contiguous). Inputs without ``x`` (per-row scalars) and
inputs without some row axes (``gamma[x]``, a bias ``b[h,x]``) are broadcast by axis name;
index maps (causal, ALiBi, ...) read the row indices and the column.

How it runs (the schedule): rows are grouped at the block level (``ROWS_PER_BLOCK`` rows per
block, ``g_r``), ``x`` is held whole. ``THREADS_PER_ROW`` threads share a row: 4..32 (a part of
a warp, reductions by shuffles only, several rows per block) or 64..1024 (one row per block,
block reductions). Each thread loads ``CHUNKS_PER_THREAD`` 16-byte vectors of the row
(``VEC`` values each, coalesced across the row's threads), evaluates the prologue on the fly
and keeps the normaliser's input in registers (fp32); the statistics are reduced in fp32; the
epilogue reads the registers, not HBM. Every input is read once and every output written once.

The tunables travel as the kernel's typed options (``threads_per_row``, ``warps``) and its row
groups (``ROWS_PER_BLOCK`` is the product of the SMEM groups of the row axes), so that a planned
kernel lowers to the same kernel again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...diagrams.diagram import Diagram
from ...diagrams.functions import get_function
from ...diagrams.ops import Map, Norm, Softmax, Value
from ...dtypes import dtype as lookup_dtype
from ...errors import CodegenError
from ...perfmodel.schedule import Kernel, KernelOptions, Relabel, Schedule
from ..program import Arg, KernelLaunch, Program
from ..render import Code, c_i64, comment, cuda_type, ident, map_expr, render

NAME = "rowwise"
TEMPLATE = "rowwise.cu.jinja"

#: Thread counts per row the template supports (<= 32: part of a warp; > 32: one row per block).
THREADS_PER_ROW = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Block sizes used when several rows share a block.
BLOCK_THREADS = (128, 256)
#: The most fp32 values one thread keeps of a row (32 keeps a 1024-thread block within 64
#: registers per thread, and still leaves 2 to 4 16-byte loads in flight per thread).
MAX_VALUES_PER_THREAD = 32
#: Registers the footprint formula adds for addresses, indices, statistics and loop state.
BASE_REGS = 24
#: Registers the template may use per thread in any launch (the hardware limit).
MAX_REGS = 255
_SUPPORTED = ("bf16", "fp16", "fp32")


# ----------------------------------------------------------------------------- analysis


@dataclass(frozen=True, eq=False)
class RowwiseShape:
    """What the family found in a diagram (all names are the diagram's checked names)."""

    diagram: Diagram
    norm: Value
    kind: str                      # softmax | layernorm | rmsnorm
    eps: float
    x: str                         # the normalised axis
    row_axes: tuple[str, ...]      # woven axes, in the norm's order (flattened row index)
    sizes: dict
    pre: tuple[Value, ...]         # maps the norm depends on
    post: tuple[Value, ...]        # every other map
    dtype: str
    kept: tuple[Value, ...] = field(default=())  # values of the prologue the epilogue still needs

    @property
    def xsize(self) -> int:
        return self.sizes[self.x]

    @property
    def nrows(self) -> int:
        return math.prod(self.sizes[a] for a in self.row_axes)

    @property
    def vec(self) -> int:
        return 16 // lookup_dtype(self.dtype).bytes

    def name(self, v: Value) -> str:
        return self.diagram.name_of(v)


def analyse(diagram: Diagram) -> RowwiseShape | str:
    """The row-wise structure of ``diagram``, or a sentence saying why it has none."""
    nodes = diagram.nodes
    norms = [v for v in nodes if isinstance(v.op, (Softmax, Norm))]
    others = [v for v in nodes if not isinstance(v.op, (Softmax, Norm))]
    if len(norms) != 1:
        return f"needs exactly one softmax or norm box, found {len(norms)}"
    bad = [v for v in others if not isinstance(v.op, Map)]
    if bad:
        return f"box {diagram.name_of(bad[0])} is a {bad[0].op.kind}, not an elementwise map"
    (norm,) = norms
    x = norm.op.over
    axes = set(norm.axis_names)
    dts = {v.dtype for v in (*diagram.inputs, *nodes)}
    if len(dts) != 1 or next(iter(dts)) not in _SUPPORTED:
        return f"dtype {sorted(dts)} is not one of {', '.join(_SUPPORTED)}"
    if not diagram.is_bound:
        return "axis sizes are not bound"
    for v in (*diagram.inputs, *nodes):
        if not set(v.axis_names) <= axes:
            return f"{diagram.name_of(v)} carries axes outside the rows of {diagram.name_of(norm)}"
    for v in diagram.inputs:
        if x in v.axis_names and v.axis_names[-1] != x:
            return f"input {v.name} does not hold {x} innermost (contiguous)"
    for v in diagram.outputs:
        if v.is_input:
            return f"output {diagram.name_of(v)} is an input"
        if set(v.axis_names) != axes or v.axis_names[-1] != x:
            return f"output {diagram.name_of(v)} is not a whole row array with {x} innermost"
    ancestors: set[int] = set()
    stack = list(norm.args)
    while stack:
        v = stack.pop()
        if id(v) in ancestors or v.is_input:
            continue
        ancestors.add(id(v))
        stack.extend(v.args)
    pre = tuple(v for v in others if id(v) in ancestors)
    post = tuple(v for v in others if id(v) not in ancestors)
    sizes = {n: a.bound_size for n, a in diagram.axes.items()}
    op = norm.op
    kind = "softmax" if isinstance(op, Softmax) else op.how
    eps = float(getattr(op, "eps", 0.0))
    shape = RowwiseShape(diagram, norm, kind, eps, x, tuple(a for a in norm.axis_names if a != x), sizes,
                         pre, post, next(iter(dts)))
    # prologue values (and inputs with x read in the prologue) that the epilogue or an output needs
    pre_ids = {id(v) for v in pre}
    pre_inputs = {id(a) for b in (*pre, norm) for a in b.args if a.is_input and x in a.axis_names}
    post_reads = {id(a) for b in post for a in b.args}
    out_ids = {id(v) for v in diagram.outputs}
    kept = []
    for v in (*diagram.inputs, *pre):
        vid = id(v)
        if vid not in pre_ids and vid not in pre_inputs:
            continue
        if vid in post_reads or vid in out_ids:
            kept.append(v)
    return RowwiseShape(**{**shape.__dict__, "kept": tuple(kept)})


# ----------------------------------------------------------------------------- tunables


@dataclass(frozen=True)
class Config:
    """One tile configuration of the template."""

    threads_per_row: int
    rows_per_block: int
    vec: int
    chunks_per_thread: int

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    @property
    def values_per_thread(self) -> int:
        return self.vec * self.chunks_per_thread

    @property
    def block_mode(self) -> bool:
        return self.threads_per_row > 32

    def options(self, shape: "RowwiseShape") -> KernelOptions:
        """The typed options a schedule of this configuration carries."""
        return KernelOptions(threads_per_row=self.threads_per_row, warps=self.threads // 32,
                             regs_per_thread=regs_estimate(shape, self))


def make_config(shape: RowwiseShape, threads_per_row: int, rows_per_block: int) -> Config:
    if threads_per_row not in THREADS_PER_ROW:
        raise CodegenError(f"rowwise: THREADS_PER_ROW={threads_per_row} is not one of {THREADS_PER_ROW}")
    if threads_per_row > 32 and rows_per_block != 1:
        raise CodegenError("rowwise: with more than 32 threads per row a block holds one row "
                           f"(ROWS_PER_BLOCK=1), got {rows_per_block}")
    threads = threads_per_row * rows_per_block
    if threads % 32 or threads > 1024 or rows_per_block < 1:
        raise CodegenError(f"rowwise: {rows_per_block} rows x {threads_per_row} threads = {threads} threads "
                           "per block; it must be a multiple of 32, at most 1024")
    vec = shape.vec
    chunks = -(-shape.xsize // vec)
    return Config(threads_per_row, rows_per_block, vec, -(-chunks // threads_per_row))


def regs_need(shape: RowwiseShape, cfg: Config) -> int:
    """The footprint formula: registers a thread needs for the row's fp32 values (and kept
    prologue values), the packed 16-byte vectors of 16-bit inputs before conversion, and a fixed
    base for addresses, indices and statistics."""
    values = cfg.values_per_thread * (1 + len(shape.kept))
    raw = cfg.chunks_per_thread if lookup_dtype(shape.dtype).bytes == 2 else 0
    extra = 4 if shape.kind == "layernorm" else 0          # mean and the centred square
    # fp32 epilogue inputs (gamma, beta): ptxas hoists their 16-byte loads, 4 registers each
    post = {id(a) for b in shape.post for a in b.args if a.is_input and shape.x in a.axis_names}
    if lookup_dtype(shape.dtype).bytes == 4:
        extra += 4 * len(post)
    chunks = -(-shape.xsize // cfg.vec)
    if chunks * cfg.vec != shape.xsize or chunks != cfg.chunks_per_thread * cfg.threads_per_row:
        extra += 4                                         # column masks of a ragged row
    return BASE_REGS + values + raw + extra


def regs_estimate(shape: RowwiseShape, cfg: Config) -> int:
    """The register budget per thread the model assumes: the footprint rounded up to the
    allocation unit (8) plus 8 of slack, within what a block of this size may have. The kernel
    asks for exactly this (``__maxnreg__``), so the model's occupancy is the kernel's."""
    budget = -(-regs_need(shape, cfg) // 8) * 8 + 8
    return min(MAX_REGS, budget, (65536 // cfg.threads) // 8 * 8)


def smem_estimate(shape: RowwiseShape, cfg: Config) -> int:
    """Shared memory per block: the block reduction's 32 floats (one row per block), else none."""
    return 32 * 4 if cfg.block_mode else 0


def configs(shape: RowwiseShape) -> list[Config]:
    """Every configuration the template supports for this row length and dtype."""
    out = []
    chunks = -(-shape.xsize // shape.vec)
    for tpr in THREADS_PER_ROW:
        blocks = (1,) if tpr > 32 else tuple(sorted({t // tpr for t in BLOCK_THREADS}))
        for rpb in blocks:
            cfg = make_config(shape, tpr, rpb)
            if cfg.values_per_thread * (1 + len(shape.kept)) > MAX_VALUES_PER_THREAD:
                continue
            # at least half of the row's threads must have a chunk (the smallest width always fits)
            if tpr > THREADS_PER_ROW[0] and chunks * 2 < tpr:
                continue
            if regs_need(shape, cfg) > min(MAX_REGS, 65536 // cfg.threads):
                continue
            out.append(cfg)
    return out


def config_from_schedule(shape: RowwiseShape, schedule: Schedule) -> Config:
    """The configuration a schedule's kernel names (threads per row and warps per block in its
    options: a block of ``warps`` warps holds ``32·warps / threads_per_row`` rows), or one that
    fits its row groups."""
    want = 1
    for k in schedule.kernels:
        for r in k.relabels_at("SMEM", "group"):
            if r.axis in shape.row_axes and isinstance(r.size, int):
                want *= r.size
    opts = schedule.kernels[0].options if len(schedule.kernels) == 1 else None
    if opts is not None and opts.threads_per_row is not None:
        tpr = opts.threads_per_row
        rows = max(1, (opts.warps or 1) * 32 // tpr) if opts.warps and tpr <= 32 else (1 if tpr > 32 else want)
        return make_config(shape, tpr, rows)
    options = configs(shape)
    if not options:
        raise CodegenError(f"rowwise: no configuration keeps a row of {shape.xsize} {shape.dtype} values "
                           "in registers")
    same = [c for c in options if c.rows_per_block == want]
    return _preferred(same or options)


def _preferred(options: list[Config]) -> Config:
    """Without a cost model: 8..32 values per thread, then more lanes busy, then fewer threads."""
    def key(c: Config):
        return (not 8 <= c.values_per_thread <= 32, -c.values_per_thread, c.threads)
    return sorted(options, key=key)[0]


# ----------------------------------------------------------------------------- schedules


def _spread(shape: RowwiseShape, rows: int) -> list[tuple[str, int]]:
    """Groups of the row axes (innermost first) that together hold ``rows`` rows."""
    out = []
    left = rows
    for a in reversed(shape.row_axes):
        g = max(1, min(left, shape.sizes[a]))
        out.append((a, g))
        left = max(1, -(-left // g))
    return list(reversed(out))


def schedule_for(shape: RowwiseShape, cfg: Config, gpu: str | None) -> Schedule:
    """The schedule a configuration stands for: rows grouped per block (and per warp in warp
    mode), x whole, every array of the row in registers."""
    rel = [Relabel(a, g, "SMEM", "group") for a, g in _spread(shape, cfg.rows_per_block)]
    if not cfg.block_mode and shape.row_axes:
        rel += [Relabel(a, g, "RF", "group") for a, g in _spread(shape, 32 // cfg.threads_per_row)]
    d = shape.diagram
    boxes = tuple(d.name_of(v) for v in d.nodes)
    touched = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    placement = tuple((n, "RF") for n in sorted(touched))
    kernel = Kernel(NAME, boxes, tuple(rel), placement, family=NAME, options=cfg.options(shape))
    return Schedule(d, (kernel,), gpu, shape.dtype)


# ----------------------------------------------------------------------------- lowering


def _stride_offsets(shape: RowwiseShape, v: Value) -> list[tuple[str, int]]:
    """(row axis, stride in elements) for a contiguous array ``v``; x contributes the column."""
    strides = {}
    s = 1
    for a in reversed(v.axis_names):
        strides[a] = s
        s *= shape.sizes[a]
    return [(a, strides[a]) for a in v.axis_names if a != shape.x]


def _is_plain_row(shape: RowwiseShape, v: Value) -> bool:
    """True when v's row offset is simply ``row * x`` (it carries every row axis in order)."""
    return tuple(a for a in v.axis_names if a != shape.x) == shape.row_axes and shape.x in v.axis_names


def lower_shape(shape: RowwiseShape, cfg: Config, schedule: Schedule, arch: str,
                kernel_name: Code) -> KernelLaunch:
    d = shape.diagram
    name = shape.name
    x = shape.x
    T = cuda_type(shape.dtype)
    xs = ident(x)
    col_var = ident(x, "i_")
    used_inputs = [v for v in d.inputs if any(any(a is v for a in b.args) for b in d.nodes)]
    outputs = list(dict.fromkeys(d.outputs))
    out_names = [d.name_of(v) for v in outputs]

    # per-row offsets of every HBM array
    need_idx: set[str] = set()
    offsets = []
    for v, role in [(v, "in") for v in used_inputs] + [(v, "out") for v in outputs]:
        nm = name(v)
        var = ident(nm, "off_")
        if _is_plain_row(shape, v):
            expr = Code(f"row * {c_i64(shape.xsize)}") if shape.row_axes else Code("0LL")
        else:
            parts = []
            for a, st in _stride_offsets(shape, v):
                need_idx.add(a)
                parts.append(Code(f"{ident(a, 'i_')} * {c_i64(st)}"))
            expr = Code(" + ".join(parts) if parts else "0LL")
        offsets.append((var, expr))
    for b in (*shape.pre, *shape.post):
        for a in b.op.index_axes:
            if a != x:
                need_idx.add(a)
    # the row's multi-index: innermost axis first
    row_index = []
    if need_idx:
        rem = Code("row")
        for i, a in enumerate(reversed(shape.row_axes)):
            n = shape.sizes[a]
            if i == len(shape.row_axes) - 1:
                row_index.append((ident(a, "i_"), Code(f"{rem}")))
            else:
                row_index.append((ident(a, "i_"), Code(f"{rem} % {c_i64(n)}")))
                nxt = ident(a, "q_")
                row_index.append((nxt, Code(f"{rem} / {c_i64(n)}")))
                rem = nxt

    # variables: how each value is read inside the element loops
    kept_ids = {id(v) for v in shape.kept}
    u = shape.norm.args[0]

    def var(v: Value, phase: str) -> Code:
        if v.is_input and x not in v.axis_names:
            return ident(name(v), "r_")           # per-row scalar
        if phase == "post" and id(v) in kept_ids:
            return Code(f"{ident(name(v), 'k_')}[c][e]")
        return ident(name(v), "a_")

    row_scalars = [(ident(name(v), "r_"), ident(name(v), "in_"), ident(name(v), "off_"))
                   for v in used_inputs if x not in v.axis_names]

    def map_stmt(b: Value, phase: str) -> Code:
        op = b.op
        get_function(op.fn)  # refuses functions outside the whitelist
        idx = [col_var if a == x else ident(a, "i_") for a in op.index_axes]
        ns = [shape.sizes[a] for a in op.index_axes]
        expr = map_expr(op.fn, [var(a, phase) for a in b.args], op.param_values(shape.sizes), idx, ns)
        return Code(f"const float {ident(name(b), 'a_')} = {expr};")

    def loads(phase_boxes, extra=()):
        needed = []
        for b in phase_boxes:
            for a in b.args:
                if a.is_input and x in a.axis_names and a not in needed:
                    needed.append(a)
        for a in extra:
            if a.is_input and x in a.axis_names and a not in needed:
                needed.append(a)
        return needed

    pre_loads = loads(shape.pre, [u])
    post_inputs = [a for a in loads(shape.post) if id(a) not in kept_ids]
    pre_elem = [Code(f"const float {ident(name(a), 'a_')} = napkin::to_float({ident(name(a), 'ld_')}.x[e]);")
                for a in pre_loads]
    pre_elem += [map_stmt(b, "pre") for b in shape.pre]
    kept = [(ident(name(v), "k_"), ident(name(v), "a_")) for v in shape.kept]
    post_elem = [Code(f"const float {ident(name(a), 'a_')} = napkin::to_float({ident(name(a), 'ld_')}.x[e]);")
                 for a in post_inputs]
    post_elem += [map_stmt(b, "post") for b in shape.post]
    uses_col = any(x in b.op.index_axes for b in (*shape.pre, *shape.post))

    params = [Code(f"const {T}* __restrict__ {ident(name(v), 'in_')}") for v in used_inputs]
    params += [Code(f"{T}* __restrict__ {ident(n, 'out_')}") for n in out_names]
    stores = [(ident(n, "st_"), ident(n, "out_"), ident(n, "off_"), var(v, "post")) for n, v in zip(out_names, outputs)]
    # the output that is the norm's own value is named a_<norm> in the epilogue
    legend_rows = ", ".join(shape.row_axes) or "(none)"
    threads = cfg.threads
    chunks = -(-shape.xsize // cfg.vec)
    even = chunks * cfg.vec == shape.xsize and chunks == cfg.chunks_per_thread * cfg.threads_per_row
    nrows = shape.nrows
    grid = (-(-nrows // cfg.rows_per_block), 1, 1)
    sched_lines = [f"rows ({legend_rows}) grouped per block: g = ROWS_PER_BLOCK = {cfg.rows_per_block} rows "
                   f"(grid.x = {grid[0]} blocks)",
                   (f"each row split over THREADS_PER_ROW = {cfg.threads_per_row} lanes of one warp; "
                    f"{32 // cfg.threads_per_row} rows per warp (RF group)") if not cfg.block_mode else
                   f"each row split over the block's {cfg.threads_per_row} threads (block reduction)",
                   f"{x} (normalised) held whole in registers: {cfg.chunks_per_thread} x {cfg.vec} values "
                   "per thread, fp32",
                   "HBM: every input read once, every output written once (no SMEM round trip)"]
    sched_lines += [f"schedule: {r}" for k in schedule.kernels for r in k.relabels]
    ctx = dict(
        kernel=kernel_name, T=T, dtype=shape.dtype, kind=shape.kind, eps=float(shape.eps),
        x=xs, col=col_var, uses_col=uses_col, row_axes=[ident(a) for a in shape.row_axes],
        legend_rows=comment(legend_rows), legend_x=comment(x),
        reduce_max=Code("napkin::block_reduce<napkin::MaxOp>" if cfg.block_mode
                        else "napkin::xor_reduce<napkin::MaxOp, THREADS_PER_ROW>"),
        reduce_sum=Code("napkin::block_reduce<napkin::SumOp>" if cfg.block_mode
                        else "napkin::xor_reduce<napkin::SumOp, THREADS_PER_ROW>"),
        scratch_arg=Code(", scratch" if cfg.block_mode else ""),
        TPR=cfg.threads_per_row, RPB=cfg.rows_per_block, VEC=cfg.vec, CPT=cfg.chunks_per_thread,
        REGS=regs_estimate(shape, cfg), THREADS=threads, XSIZE=shape.xsize, NROWS=c_i64(nrows), EVEN=even, block_mode=cfg.block_mode,
        params=params, row_index=row_index, offsets=offsets, row_scalars=row_scalars,
        pre_loads=[(ident(name(a), "ld_"), ident(name(a), "in_"), ident(name(a), "off_")) for a in pre_loads],
        post_loads=[(ident(name(a), "ld_"), ident(name(a), "in_"), ident(name(a), "off_")) for a in post_inputs],
        pre_elem=pre_elem, post_elem=post_elem, norm_in=ident(name(u), "a_"), kept=kept,
        norm_out=ident(name(shape.norm), "a_"), stores=stores,
        schedule_lines=[comment(s) for s in sched_lines], arch=comment(arch),
        diagram=comment(d.name),
    )
    src = render(TEMPLATE, **ctx)
    args = tuple(Arg("tensor", name(v), dtype=shape.dtype, axes=v.axis_names) for v in used_inputs)
    args += tuple(Arg("tensor", n, dtype=shape.dtype, axes=v.axis_names) for n, v in zip(out_names, outputs))
    return KernelLaunch(
        name=str(kernel_name), source=src, grid=grid, block=(threads, 1, 1), shared_bytes=0, args=args,
        template=TEMPLATE,
        tunables=(("THREADS_PER_ROW", cfg.threads_per_row), ("ROWS_PER_BLOCK", cfg.rows_per_block),
                  ("VEC", cfg.vec), ("CHUNKS_PER_THREAD", cfg.chunks_per_thread), ("THREADS", threads)),
        model_smem_bytes=smem_estimate(shape, cfg),
        model_regs_per_thread=regs_estimate(shape, cfg),
    )


class RowwiseFamily:
    """Softmax / layernorm / rmsnorm with elementwise prologue and epilogue, fused."""

    name = NAME
    smem_from_cost = True  # model_smem_bytes from the cost model's M_SMEM where it agrees

    def explain(self, diagram: Diagram) -> str | None:
        """None if the family takes ``diagram``, else why not."""
        s = analyse(diagram)
        if isinstance(s, str):
            return s
        if not configs(s):
            return (f"no configuration keeps a row of {s.xsize} {s.dtype} values in registers "
                    f"(at most {MAX_VALUES_PER_THREAD} per thread, 1024 threads)")
        return None

    def matches(self, diagram: Diagram) -> bool:
        return self.explain(diagram) is None

    def _shape(self, diagram: Diagram) -> RowwiseShape:
        s = analyse(diagram)
        if isinstance(s, str):
            raise CodegenError(f"rowwise family cannot run diagram {diagram.name!r}: {s}")
        return s

    def candidates(self, diagram: Diagram, gpu, dtype: str | None = None) -> list[Schedule]:
        shape = self._shape(diagram)
        key = getattr(gpu, "key", gpu)
        return [schedule_for(shape, c, key) for c in configs(shape)]

    def config(self, diagram: Diagram, schedule: Schedule) -> Config:
        return config_from_schedule(self._shape(diagram), schedule)

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu) -> dict:
        """Blocks, threads, registers and shared memory of the launch a schedule stands for,
        and a latency floor: bytes in flight per SM (Little's law) bound the achievable rate."""
        shape = self._shape(diagram)
        cfg = config_from_schedule(shape, schedule)
        blocks = -(-shape.nrows // cfg.rows_per_block)
        bytes_per_value = lookup_dtype(shape.dtype).bytes
        # only inputs that are read fresh from HBM for every row (they carry x and every row
        # axis) count as bytes in flight: a broadcast input (gamma[x], beta[x], a bias b[h,x]) is
        # read by every block and stays in L2, so its loads neither wait on HBM nor add HBM bytes
        row_inputs = sum(1 for v in diagram.inputs
                         if shape.x in v.axis_names and set(shape.row_axes) <= set(v.axis_names))
        in_flight_thread = cfg.chunks_per_thread * 16 * max(1, row_inputs)
        idle = 1.0 - (-(-shape.xsize // cfg.vec)) / (cfg.chunks_per_thread * cfg.threads_per_row)
        return dict(blocks=blocks, threads=cfg.threads, regs=regs_estimate(shape, cfg),
                    smem=smem_estimate(shape, cfg), in_flight_bytes_per_thread=in_flight_thread,
                    idle_lanes=idle, bytes_per_value=bytes_per_value, threads_per_row=cfg.threads_per_row)

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        shape = self._shape(diagram)
        if len(schedule.kernels) != 1:
            raise CodegenError(f"rowwise family runs one fused kernel; the schedule has {len(schedule.kernels)}")
        cfg = config_from_schedule(shape, schedule)
        kname = Code(f"{ident(diagram.name)}_rowwise_{shape.kind}")
        launch = lower_shape(shape, cfg, schedule, arch, kname)
        return Program(diagram=diagram, schedule=schedule, family=NAME, launches=(launch,), buffers=(),
                       sizes=dict(shape.sizes))


FAMILY = RowwiseFamily()
