"""The row-wise fused family: one softmax / layernorm / rmsnorm over an axis ``x``, with
elementwise prologue maps before it and an epilogue after it, in one pass over HBM; and any chain
of maps and reductions over one row of one or several innermost axes (log-softmax, L1/L2 norms,
group norm, logsumexp, row max and min), in one kernel, with reductions over every row beside them
(a norm backward's dgamma and dbeta, summed per block while it streams its rows): see "chains of
reductions" below and docs/architecture.md, "The row-wise family".

>>> from napkin.diagrams import library
>>> s = analyse(library.get("group_norm").bind(n=2, g=4, c=8, s=64))
>>> s.kind, s.red, s.row_axes, s.passes
('chain', ('c', 's'), ('n', 'g'), 3)

The norm kernel:

What it accepts: every box is an elementwise map except exactly one softmax or norm over ``x``;
every array lives on the norm's axes (the *row* axes, woven, and ``x``, normalised); arrays in
HBM that carry ``x`` hold it innermost (contiguous). Inputs without ``x`` (per-row scalars) and
inputs without some row axes (``gamma[x]``, a bias ``b[h,x]``) are broadcast by axis name;
index maps (causal, ALiBi, ...) read the row indices and the column.

How it runs (the schedule): rows are grouped at the block level (``ROWS_PER_BLOCK`` rows per
block, ``g_r``), ``x`` is held whole. ``THREADS_PER_ROW`` threads share a row: 1..32 (a part of
a warp, reductions by shuffles only, several rows per block; under 4 only for rows of one or two
16-byte chunks, :func:`few_threads_fit`) or 64..1024 (one row per block, block reductions). Each thread loads ``CHUNKS_PER_THREAD`` 16-byte vectors of the row
(``VEC`` values each, coalesced across the row's threads), evaluates the prologue on the fly
and keeps the normaliser's input in registers (fp32); the statistics are reduced in fp32; the
epilogue reads the registers, not HBM. Every input is read once and every output written once.

The tunables travel as the kernel's typed options (``threads_per_row``, ``warps``) and its row
groups (``ROWS_PER_BLOCK`` is the product of the SMEM groups of the row axes), so that a planned
kernel lowers to the same kernel again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field

from ...diagrams.axes import is_name
from ...diagrams.diagram import Diagram
from ...diagrams.functions import get_function
from ...diagrams.ops import Contract, Map, Norm, Reduce, Softmax, Value, apply, map_fn, shifted_exp, sum_over
from ...dtypes import dtype as lookup_dtype
from ...errors import CodegenError
from ...perfmodel.hardware import has_clusters
from ...perfmodel.schedule import Kernel, KernelOptions, Relabel, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived
from ..render import Code, c_i64, c_int, comment, cuda_type, half_math, ident, map_expr, render
from . import in_registers, per_diagram, plain_kernel_reason

NAME = "rowwise"
TEMPLATE = "rowwise.cu.jinja"

#: Thread counts per row the template supports (<= 32: part of a warp; > 32: one row per block).
THREADS_PER_ROW = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Thread counts under this are offered only for rows of at most that many 16-byte chunks (see
#: :func:`few_threads_fit`).
FEW_THREADS = 4


def few_threads_fit(tpr: int, chunks: int) -> bool:
    """Whether ``tpr`` threads a row may read rows of ``chunks`` 16-byte chunks: any count from
    :data:`FEW_THREADS` up, and fewer only where the row's threads read all of it in one access
    each (``chunks <= tpr``), so that a warp's access covers its rows whole, one contiguous run.
    Where a row is one chunk (softmax over 2 values, 4M rows), four threads a row left three of
    four lanes idle (H200, bf16: 110.2 us, one thread a row 23.9); with fewer threads than chunks
    each access reads a thin slice of every row (H200, fp32 softmax over rows of 16, one thread
    a row: 99.9 us against 67.1 for four; layernorm over rows of 64 bf16, two threads: 55.0
    against 37.3 for four)."""
    return tpr >= FEW_THREADS or chunks <= tpr


#: Block sizes used when several rows share a block.
BLOCK_THREADS = (128, 256)
#: ... and where fewer than :data:`FEW_THREADS` threads share a row (hundreds of rows a block,
#: tens of thousands of blocks): H200, bf16 softmax over 4M rows of 2 values, one thread a row,
#: 16384 blocks of 256 threads 15.7 us of kernel, 32768 of 128 21.0 (the model ranked them the
#: other way).
FEW_BLOCK_THREADS = (256,)


def row_blocks(tpr: int) -> tuple[int, ...]:
    """Rows a block for ``tpr`` threads a row: one where a block holds one row, else the block
    sizes above over ``tpr``."""
    if tpr > 32:
        return (1,)
    return tuple(sorted({t // tpr for t in (FEW_BLOCK_THREADS if tpr < FEW_THREADS else BLOCK_THREADS)}))
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


def analyse(diagram: Diagram) -> "RowwiseShape | ChainShape | str":
    """The row-wise structure of ``diagram``, or a sentence saying why it has none: one softmax
    or norm box with maps around it (a :class:`RowwiseShape`), or maps and reductions over one
    row (a :class:`ChainShape`, :func:`analyse_chain`)."""
    contracts = [v for v in diagram.nodes if isinstance(v.op, Contract)]
    if contracts and all(_is_dot(v) for v in contracts):
        rewritten = _dots_as_reductions(diagram)
        if isinstance(rewritten, str):
            return rewritten
        s = analyse_chain(_hoist_row_factors(rewritten))
        # the schedule names the boxes of the diagram the planner gave, not the rewritten ones
        return dataclasses.replace(s, source=diagram) if isinstance(s, ChainShape) else s
    nodes = diagram.nodes
    norms = [v for v in nodes if isinstance(v.op, (Softmax, Norm))]
    others = [v for v in nodes if not isinstance(v.op, (Softmax, Norm))]
    if not norms and any(isinstance(v.op, Reduce) for v in nodes):
        hoisted = _hoist_row_factors(diagram)
        s = analyse_chain(hoisted)
        return dataclasses.replace(s, source=diagram) if hoisted is not diagram and isinstance(s, ChainShape) else s
    if any(isinstance(v.op, Reduce) for v in nodes):
        return "a softmax or norm box together with reduction boxes (write the norm as maps and reductions)"
    if len(norms) != 1:
        return (f"needs exactly one softmax or norm box, or reductions over a row, found {len(norms)} "
                "softmax/norm boxes and no reduction")
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


def _is_dot(v: Value) -> bool:
    """Whether contraction ``v`` sums an elementwise product: every operand carries every axis of
    the product (``Σ_x dY·Y``), so no operand is broadcast and no matmul hides in it."""
    axes = {a for x in v.args for a in x.axis_names}
    return bool(v.op.over) and all(set(x.axis_names) == axes for x in v.args)


def _dots_as_reductions(diagram: Diagram) -> "Diagram | str":
    """``diagram`` with each contraction written as what it is over a row: the elementwise product
    of its operands (a ``mul`` map, broadcast by axis name) summed over its ``over`` axes (sum
    reductions), every other box and name kept. A backward diagram's ``rowsum(dY ⊙ Y)`` (the
    softmax and norm gradients) is such a contraction: with it a reduction, the chain kernel takes
    the whole row-wise gradient. A true matmul becomes a product no input holds every axis of,
    which the chain analysis refuses. A contraction of one operand over nothing (a transpose), or
    whose ``out`` reorders its axes, is left (and refused as a contraction).

    >>> from napkin.diagrams import library
    >>> d = _dots_as_reductions(library.get("softmax").grad(save={"P"}).bind(r=4, x=64))
    >>> [v.op.kind for v in d.nodes]
    ['map', 'reduce', 'map', 'map']
    """
    memo: dict[int, Value] = {id(v): v for v in diagram.inputs}
    for v in diagram.nodes:
        args = [memo[id(a)] for a in v.args]
        name = diagram.name_of(v)
        op = v.op
        if isinstance(op, Contract):
            if not op.over or len(args) < 1:
                return f"box {name} is a contract over no axis (a transpose), not a reduction over a row"
            prod = args[0]
            for a in args[1:]:
                prod = map_fn("mul", prod, a)
            out = prod
            for i, a in enumerate(op.over):
                out = sum_over(out, a, name=name if i == len(op.over) - 1 else None)
            if out.axis_names != v.axis_names:
                return (f"box {name} (a contract) orders its axes ({', '.join(v.axis_names)}) unlike its "
                        "operands' product")
            memo[id(v)] = out
        else:
            memo[id(v)] = apply(op, args, name)
    return Diagram(diagram.name, tuple(memo[id(v)] for v in diagram.outputs), diagram.inputs,
                   diagram.description)


#: Whether the chain analysis takes a per-row factor that follows a reduction out of a sum over the
#: row (:func:`_hoist_row_factors`).
HOIST_ROW_FACTORS = True

#: Whether a kernel with column reductions over 16-bit rows that are not whole 16-byte vectors may
#: run on a rotated grid (:func:`rotation_source`, :func:`_rotatable_splits`). Measured on an H200
#: (bf16, a call, L2 flushed): a norm backward over 4096 x 4095 rows 105.7 -> 50.1 us (rmsnorm) and
#: 109.7 -> 54.9 us (layernorm), where 4096 x 4096 takes 34.2. Off, every such kernel keeps its grid
#: and reads its rows value by value (kept as a switch to compare the two).
ROTATE_COLUMN_KERNELS = True


def _hoist_row_factors(diagram: Diagram) -> Diagram:
    """``diagram`` with each sum (or mean) over the row of a product written as the product's
    per-row factors times the sum of the others, where a per-row factor is computed from a
    reduction: ``Σ_x dN·(X·rstd)`` becomes ``rstd·Σ_x dN·X``. The sum then needs only what the
    pass before ``rstd`` loads, so the chain runs it in that pass, beside ``Σ_x X²`` and in the same
    round of block reductions, one pass fewer (the rmsnorm backward that recomputes its statistic:
    3 passes -> 2). Products are ``mul`` maps, looked through as a tree; factors that hold no reduced
    axis and have a reduction among their ancestors are taken out. Every other box, and the diagram
    itself where nothing changes, is kept (the same rounding elsewhere; the sum's rounding differs
    by the factor's, within fp32).

    >>> from napkin.diagrams import library
    >>> d = _dots_as_reductions(library.get("rmsnorm").grad().bind(r=4, x=64))
    >>> analyse_chain(d).passes, analyse_chain(_hoist_row_factors(d)).passes
    (3, 2)
    """
    if not HOIST_ROW_FACTORS:
        return diagram
    d = diagram
    after: dict[int, bool] = {id(v): False for v in d.inputs}
    for v in d.nodes:
        after[id(v)] = isinstance(v.op, Reduce) or any(after[id(a)] for a in v.args)

    def is_mul(v: Value) -> bool:
        return (not v.is_input and isinstance(v.op, Map) and v.op.fn == "mul" and not v.op.params
                and not v.op.index_axes)

    consumers = d.consumers
    memo: dict[int, Value] = {id(v): v for v in d.inputs}
    changed = False
    for v in d.nodes:
        args = [memo[id(a)] for a in v.args]
        name = d.name_of(v)
        op = v.op
        src = v.args[0] if v.args else None
        if (isinstance(op, Reduce) and op.how in ("sum", "mean") and src is not None and is_mul(src)
                and not any(isinstance(c.op, Reduce) for c in consumers.get(id(v), ()))):
            leaves, stack = [], [src]
            while stack:  # the product's factors, left to right
                f = stack.pop()
                if is_mul(f):
                    stack.extend(reversed(f.args))
                else:
                    leaves.append(f)
            row = [f for f in leaves if op.over not in f.axis_names and after[id(f)]]
            full = [f for f in leaves if not any(f is r for r in row)]
            if row and full:
                prod = memo[id(full[0])]
                for f in full[1:]:
                    prod = map_fn("mul", prod, memo[id(f)])
                out = apply(op, [prod])
                for i, f in enumerate(row):
                    out = map_fn("mul", out, memo[id(f)], name=name if i == len(row) - 1 else None)
                if out.axis_names == v.axis_names:
                    memo[id(v)] = out
                    changed = True
                    continue
        memo[id(v)] = apply(op, args, name)
    if not changed:
        return diagram
    return Diagram(d.name, tuple(memo[id(v)] for v in d.outputs), d.inputs, d.description)


#: :func:`analyse`, once per diagram object.
_analysed = per_diagram(analyse)


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


#: A row kernel's chunks a thread at most where :func:`row_fitted_threads` fits a block to the row.
ROW_FIT_CHUNKS = 4


def row_fitted_threads(shape: "RowwiseShape") -> tuple[int, ...]:
    """A row kernel (one norm or softmax of 16-bit rows): block sizes beside :data:`THREADS_PER_ROW`
    fitted to a row that no power-of-two block holds in whole chunks a thread, for 1..
    :data:`ROW_FIT_CHUNKS` chunks a thread the fewest whole warps that hold it. A row of 5120 bf16
    values is 640 chunks: 2.5 a thread on 256 threads, 1.25 on 512, where 160 threads hold 4 each
    and 320 hold 2 (the same holds for the column kernels' :func:`fitted_threads`). On an H200
    (8192 rows, bf16, a call; `row_fitted_ab.jsonl`) the picks ran faster at every width timed for
    rmsnorm (5000: 59.9 -> 47.5 us, 10240: 123.9 -> 108.1) and softmax (5000: 63.4 -> 49.4, 5120:
    62.1 -> 55.2), and slower for layernorm at 3 of 5 (5000: 66.8 -> 78.7; at most 3 chunks a
    thread no faster anywhere): layernorm keeps power-of-two blocks.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> def fitted(name, x): return row_fitted_threads(analyse(prepare(library.get(name), sizes=dict(r=8, x=x), dtype="bf16")))
    >>> fitted("rmsnorm", 5120), fitted("rmsnorm", 4096), fitted("softmax", 2560), fitted("layernorm", 5120)
    ((160, 224, 320, 640), (), (96, 160, 320), ())
    """
    if lookup_dtype(shape.dtype).bytes != 2 or getattr(shape, "kind", None) == "layernorm":
        return ()
    return warp_blocks(-(-shape.xsize // shape.vec), ROW_FIT_CHUNKS)


def warp_blocks(chunks: int, most: int) -> tuple[int, ...]:
    """Block sizes fitted to a row of ``chunks`` 16-byte chunks: for 1..``most`` chunks a thread the
    fewest whole warps that hold it, beside :data:`THREADS_PER_ROW`; none where a power-of-two
    block holds the row in at most ``most`` chunks a thread.

    >>> warp_blocks(640, 2), warp_blocks(625, 2), warp_blocks(512, 2)
    ((320, 640), (320, 640), ())
    """
    if any(chunks % t == 0 and chunks // t <= most for t in THREADS_PER_ROW):
        return ()  # a power-of-two block holds the row evenly (512 chunks: 256 threads, 2 each)
    fits = {-(-chunks // (cpt * 32)) * 32 for cpt in range(1, most + 1)}
    return tuple(sorted(t for t in fits if 32 < t <= 1024 and t not in THREADS_PER_ROW))


def make_config(shape: RowwiseShape, threads_per_row: int, rows_per_block: int) -> Config:
    if threads_per_row not in THREADS_PER_ROW and threads_per_row not in row_fitted_threads(shape):
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


#: The floats of the block reductions' scratch (a slot a warp for each value merged): softmax merges
#: (max, sum of exp) in one round, the norms reduce sums one at a time.
SCRATCH_FLOATS = {"softmax": 64, "layernorm": 32, "rmsnorm": 32}


def smem_estimate(shape: RowwiseShape, cfg: Config) -> int:
    """Shared memory per block: the block reduction's scratch (one row per block), else none."""
    return SCRATCH_FLOATS[shape.kind] * 4 if cfg.block_mode else 0


def configs(shape: RowwiseShape) -> list[Config]:
    """Every configuration the template supports for this row length and dtype."""
    out = []
    chunks = -(-shape.xsize // shape.vec)
    for tpr in sorted((*THREADS_PER_ROW, *row_fitted_threads(shape))):
        for rpb in row_blocks(tpr):
            cfg = make_config(shape, tpr, rpb)
            if cfg.values_per_thread * (1 + len(shape.kept)) > MAX_VALUES_PER_THREAD:
                continue
            # at least half of the row's threads must have a chunk (the smallest width always fits)
            if (tpr > THREADS_PER_ROW[0] and chunks * 2 < tpr) or not few_threads_fit(tpr, chunks):
                continue
            if regs_need(shape, cfg) > min(MAX_REGS, 65536 // cfg.threads):
                continue
            out.append(cfg)
    return out


#: KernelOptions a chain kernel reads and a softmax or norm box's kernel (its row in registers) does
#: not: a schedule of the box that sets one is refused rather than built without it
CHAIN_ONLY_OPTIONS = ("stages", "splits", "blocks_per_sm", "streamed", "row_in_smem", "cluster")


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
    if opts is not None:
        # the box's kernel holds its row in registers: a chain kernel's options do not apply to it
        chain_only = {k: v for k, v in opts.to_dict().items() if k in CHAIN_ONLY_OPTIONS}
        if chain_only:
            given = ", ".join(f"{k}={v}" for k, v in chain_only.items())
            raise CodegenError(f"rowwise: the {shape.kind} kernel holds its row in registers and takes "
                               f"threads_per_row and warps, not {given} (a chain kernel's options: "
                               "write the box out as maps and reductions for those)")
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
    kernel = Kernel(NAME, boxes, tuple(rel), in_registers(d), family=NAME, options=cfg.options(shape))
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


def rotation_period(shape: "RowwiseShape | ChainShape") -> int:
    """Rows after which a row starts at the same place in its 16-byte line again (rows laid out one
    after another): 8 for rows of 4095 bf16 values, 1 where a row is whole 16-byte vectors.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> def rows(x, dt): return analyse(prepare(library.get("softmax"), sizes=dict(r=4, x=x), dtype=dt))
    >>> rotation_period(rows(4095, "bf16")), rotation_period(rows(4094, "bf16")), rotation_period(rows(999, "fp32"))
    (8, 4, 4)
    """
    return 16 // math.gcd(16, shape.xsize * lookup_dtype(shape.dtype).bytes)


def rotation_source(shape: "RowwiseShape | ChainShape", cfg: "Config | ChainConfig | None" = None) -> Value | None:
    """The input whose rows the chunk grid is rotated for, where a row is not a whole number of
    16-byte vectors, else None. Row r of 4095 bf16 values starts ``r·8190`` bytes in, on a 16-byte
    boundary only every eighth row, and on a grid starting at the row's first value all but those
    rows load value by value (H200, softmax over 4096 x 4095 bf16: 62 us a call, four times the
    copy time). On a rotated grid, position ``q`` holds column ``(q + rot) mod XSIZE`` with ``rot``
    the row's values before its first 16-byte boundary: every whole chunk of this input (and of
    each array laid out as it is) is one aligned access, and the row's tail and head share its last
    chunk, read value by value; the grid keeps its number of chunks. The input is the first read
    row after row (the norm's input where it is one). Reductions over the row and row-shaped
    outputs do not mind where a column sits on the grid. A kernel with column reductions (its
    threads own fixed grid positions across rows) keeps its grid unless
    :data:`ROTATE_COLUMN_KERNELS`: then it is rotated where ``cfg``'s blocks step over rows a
    multiple of :func:`rotation_period` apart (``splits · rows_per_block``) and its values are
    16-bit, so that every row a thread runs has its first row's rotation, and the block writes its
    column partials back to their columns. Kept on their grid, where ptxas spilled them rotated:
    fp32 rows (40 bytes on sm_80), a register budget cut for two blocks an SM (42-114 bytes on
    sm_90a), and threads with no chunk inside the row whatever the rotation (168-274 bytes). A row
    shorter than a vector (no whole chunk to align) and a streamed chain (``cfg``; its lowering
    says why) keep their grid too.

    After (H200, a call, L2 flushed): that softmax 23.8 us in bf16 (was 62.6), layernorm over 8191
    x 1001 14.9 (33.2), an L2 normalisation over 1000 x 12347 17.2 (65.4); in fp32, whose
    value-by-value loads fill whole sectors, less: the softmax 36.3 (39.6), the L2 normalisation
    25.1 (31.7), layernorm 21.5 (20.6).

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> def rows(x): return analyse(prepare(library.get("softmax"), sizes=dict(r=4, x=x), dtype="bf16"))
    >>> rotation_source(rows(4095)).name, rotation_source(rows(4096))
    ('X', None)
    """
    if shape.xsize % shape.vec == 0 or shape.xsize < shape.vec:
        return None
    if cfg is not None and getattr(cfg, "stream", False):
        return None
    d = shape.diagram
    if isinstance(shape, ChainShape):
        if shape.cols and (not ROTATE_COLUMN_KERNELS or cfg is None or not cfg.splits
                           or lookup_dtype(shape.dtype).bytes != 2
                           or cfg.blocks_per_sm is not None or body_chunks(shape, cfg) < 1
                           or cfg.splits * cfg.rows_per_block % rotation_period(shape)
                           or not all(v.axis_names == (*shape.row_axes, *shape.red)
                                      for v in (*column_kernel_rows(shape, cfg), *(v for _, v in shape.full_out)))):
            return None  # (the last: an array whose rows do not start row · XSIZE values in)
        rows = [v for v in d.inputs
                if shape.access.get(id(v)) == "row" and v.axis_names == (*shape.row_axes, *shape.red)]
    else:
        used = {id(a) for b in d.nodes for a in b.args}
        rows = [v for v in d.inputs if id(v) in used and _is_plain_row(shape, v)]
        first = shape.norm.args[0]
        rows.sort(key=lambda v: v is not first)
    return rows[0] if rows else None


def shift_source(shape: "ChainShape") -> Value | None:
    """The input whose rows a streamed row's grid is shifted for, where a row is not a whole
    number of 16-byte vectors (and has no column reductions), else None. A streamed row keeps its
    grid unrotated (:func:`rotation_source`: its loop over chunks is not unrolled, so a rotated
    chunk's wrap checks stay in every chunk); on a grid starting at the row's first value, seven
    rows in eight of 16-bit values then load and store value by value (H200, softmax over 4096 x
    50257 bf16: 717 us, 28 % of the copy rate, torch 361). Shifted, the grid starts at the 16-byte
    boundary at or before the row's first value: chunk ``k`` holds columns ``VEC·k − shift`` on,
    ``shift`` the row's values past that boundary, so every chunk of this input (and of each array
    laid out as it is) inside the row is one aligned access, and the row's first and last chunks
    are masked (:func:`grid_chunks`: one chunk more a row). The input is the first read row after
    row.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> def rows(x): return analyse(prepare(library.get("log_softmax"), sizes=dict(r=4, x=x), dtype="bf16"))
    >>> shift_source(rows(50257)).name, shift_source(rows(50256))
    ('X', None)
    """
    if not isinstance(shape, ChainShape) or shape.cols or shape.xsize % shape.vec == 0:
        return None
    rows = [v for v in shape.diagram.inputs
            if shape.access.get(id(v)) == "row" and v.axis_names == (*shape.row_axes, *shape.red)]
    return rows[0] if rows else None


def grid_chunks(shape: "ChainShape") -> int:
    """16-byte chunks of a streamed row's grid: the row's, and one more where the grid is shifted
    (:func:`shift_source`: the chunk that holds the row's first value starts before it)."""
    return -(-shape.xsize // shape.vec) + (1 if shift_source(shape) is not None else 0)


#: Shared memory a streamed row may keep of its inputs (:func:`row_cache`) where no GPU is named:
#: what an A100 gives a block, less the block reductions' scratch. A named GPU gives its profile's
#: per-block limit (:func:`row_smem_budget`).
MAX_ROW_SMEM = 160 * 1024


def row_smem_budget(gpu=None) -> int:
    """The shared memory a streamed row may keep of its inputs and its scratch on ``gpu`` (a
    profile or its name): the profile's per-block limit, 227 KiB on Hopper and 163 KiB on an A100;
    :data:`MAX_ROW_SMEM` where no profile is known. On an H200 rows of 100277 bf16 values (196 KiB)
    or 50257 fp32 values were read from HBM in every pass under the A100's bound.

    >>> row_smem_budget("h200") // 1024, row_smem_budget("a100") // 1024, row_smem_budget(None) // 1024
    (227, 163, 160)
    """
    g = _gpu_of(gpu) if gpu is not None else None
    return (g.smem_per_block if g is not None else None) or MAX_ROW_SMEM


def row_cache(shape: "ChainShape", cfg: "ChainConfig", budget: int) -> list[Value]:
    """The inputs a streamed row keeps in shared memory, most passes first, as many as ``budget``
    bytes hold: those that a later pass reads again (without it, from L2 where the row is still
    there, else from HBM: a softmax over rows of 50257 reads them three times). Before the first
    pass every thread copies its chunks of the row into the block's shared memory with cp.async, all
    of them in flight at once (the whole row, not ``unroll`` chunks a thread), and every pass reads
    them back from there: a thread reads back only the chunks it copied (chunk ``k =
    c·THREADS_PER_ROW + lane`` at word ``k``, consecutive lanes on consecutive 16-byte words), so
    no barrier is needed. Each input takes :func:`grid_chunks` · 16 bytes."""
    if not cfg.stream or shape.cols:
        return []
    each = 16 * cache_chunks(shape, cfg)
    return reread_inputs(shape)[:max(0, budget - chain_scratch_bytes(shape, cfg)) // each]


def reread_inputs(shape: "ChainShape") -> list[Value]:
    """The row inputs that more than one pass reads, most passes first (what a streamed row keeps
    in shared memory, as many as fit: :func:`row_cache`)."""
    again = [v for v in shape.fresh if shape.access.get(id(v)) == "row" and len(shape.uses(v)) > 1]
    return sorted(again, key=lambda v: -len(shape.uses(v)))


def cache_chunks(shape: "ChainShape", cfg: "ChainConfig") -> int:
    """16-byte chunks of a kept input one block holds: the row's grid (:func:`grid_chunks`), or in a
    cluster (``cfg.cluster``) the block's share, the chunks of its threads (chunk ``k = c·TPR +
    lane`` of the row at the block's word ``c·THREADS + threadIdx.x``)."""
    return grid_chunks(shape) if cfg.cluster == 1 else cfg.chunks_per_thread * cfg.threads


def kept_inputs(shape: "ChainShape", cfg: "ChainConfig") -> list[Value]:
    """The inputs ``cfg`` keeps in shared memory (its ``cached`` first of :func:`reread_inputs`), in
    the order of their words."""
    return reread_inputs(shape)[:cfg.cached]


def column_kernel_rows(shape: "ChainShape", cfg: "ChainConfig") -> list[Value]:
    """The inputs a kernel with column reductions reads row after row in its loop (the vectors held
    for every row, :func:`resident`, are loaded once): on its rotated grid each must start at the
    same place in its 16-byte lines as the rotation's own, checked once a block."""
    held = {id(v) for v in resident(shape, cfg)}
    d = shape.diagram
    return [v for v in d.inputs if shape.access.get(id(v)) == "row" and id(v) not in held
            and any(any(a is v for a in b.args) for b in d.nodes)]


def body_chunks(shape: "RowwiseShape | ChainShape", cfg: "Config | ChainConfig") -> int:
    """On a rotated grid, the chunks ``c`` of every thread that lie inside the row whatever the
    rotation (chunk ``c·TPR + lane`` ends at most ``VEC − 1`` values past its unrotated end): their
    loads and stores need no wrap or bounds check, which keeps the kernel's registers (the check
    on every chunk of a 64-value thread spilled 48 bytes)."""
    inside = (shape.xsize - shape.vec + 1) // shape.vec
    return inside // cfg.threads_per_row


def rotated_load(v: Value, rot: Value | None) -> str:
    """The rotated grid's load of input ``v``: the rotation's own input is aligned by construction."""
    return "load_vec_rot_own" if v is rot else "load_vec_rot"


def rotation_context(shape: "RowwiseShape | ChainShape", cfg: "Config | ChainConfig", rot: Value | None,
                     sched_lines: list[str]) -> dict:
    """The template values of the rotated grid (``ROT``, ``BODY``, ``rot_src``), the schedule's line
    saying so appended to ``sched_lines``."""
    if rot is None:
        return dict(ROT=False, BODY=body_chunks(shape, cfg), rot_src=None, rot_base=None)
    nm = shape.name(rot)
    sched_lines.append(f"rows of {shape.xsize} values are not whole 16-byte vectors: each row's grid is "
                       f"rotated to start where {nm}'s row meets a 16-byte boundary")
    return dict(ROT=True, BODY=body_chunks(shape, cfg), rot_src=Code(f"{ident(nm, 'in_')} + {ident(nm, 'off_')}"),
                rot_base=ident(nm, "in_"))


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
        expr = map_expr(op.fn, [var(a, phase) for a in b.args], op.param_values(shape.sizes), idx, ns,
                        half=half_math(shape.dtype))
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
    rot = rotation_source(shape)
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
    rotation = rotation_context(shape, cfg, rot, sched_lines)
    sched_lines += [f"schedule: {r}" for k in schedule.kernels for r in k.relabels]
    ctx = dict(
        kernel=kernel_name, T=T, dtype=shape.dtype, kind=shape.kind, eps=float(shape.eps),
        x=xs, col=col_var, uses_col=uses_col, row_axes=[ident(a) for a in shape.row_axes],
        legend_rows=comment(legend_rows), legend_x=comment(x),
        reduce_sum=Code("napkin::block_reduce<napkin::SumOp>" if cfg.block_mode
                        else "napkin::xor_reduce<napkin::SumOp, THREADS_PER_ROW>"),
        scratch_arg=Code(", scratch" if cfg.block_mode else ""),
        FAST=half_math(shape.dtype),  # softmax's exp: __expf for 16-bit rows
        SCRATCH=SCRATCH_FLOATS[shape.kind],
        TPR=cfg.threads_per_row, RPB=cfg.rows_per_block, VEC=cfg.vec, CPT=cfg.chunks_per_thread,
        REGS=regs_estimate(shape, cfg), THREADS=threads, XSIZE=shape.xsize, NROWS=c_i64(nrows), EVEN=even, block_mode=cfg.block_mode,
        params=params, row_index=row_index, offsets=offsets, row_scalars=row_scalars,
        pre_loads=[(ident(name(a), "ld_"), ident(name(a), "in_"), ident(name(a), "off_"), Code(rotated_load(a, rot)))
                   for a in pre_loads],
        post_loads=[(ident(name(a), "ld_"), ident(name(a), "in_"), ident(name(a), "off_"),
                     Code(rotated_load(a, rot))) for a in post_inputs],
        pre_elem=pre_elem, post_elem=post_elem, norm_in=ident(name(u), "a_"), kept=kept, **rotation,
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


# ----------------------------------------------------------------------------- chains of reductions
#
# A *chain* kernel runs any maps and reductions over one row: log-softmax written as
# ``X - m - log(Σ exp(X - m))``, an L2 normalisation ``X·rsqrt(Σ X² + eps)``, group norm (mean
# and variance over (channels of a group, spatial): a row of several axes), logsumexp, row max and
# min. The row ``R`` is the set of axes the reductions reduce; it must be the innermost axes of
# the largest array (contiguous), and every other axis ``K`` indexes rows.
#
# It runs in *passes*: a reduction splits the work into the pass that accumulates its input and
# the passes after it, which may read its result. Pass ``p`` evaluates, per element of the row,
# the maps its targets need (the inputs of the reductions it accumulates, the row-shaped outputs
# it writes), recomputing them from the inputs (maps are cheap; registers are not). Each
# reduction is accumulated in fp32 per thread, then combined by shuffles (a part of a warp) or a
# block reduction; the maps of per-row values (``log(s) + m``) run once per thread between passes.
# A sum of ``exp(x − m)`` whose shift is the max ``m`` of the same ``x`` (a softmax's or
# logsumexp's sum written out) does not wait a pass for it: the max's pass keeps the pair (running
# max, sum of exp(x − running max)), folding each chunk's values in with one rescale, and merges
# the pairs across threads (:func:`_paired_sums`): a log-softmax takes two passes, a logsumexp one.
#
# Where the row fits, a thread keeps the raw 16-byte vectors of every input that several passes
# read in registers (*register mode*: HBM reads each input once). A row too long for registers is
# *streamed*: one row per block, every pass reads its inputs again (from L2 where they are still
# there, else HBM), ``UNROLL`` chunks in flight per thread.
#
# *Column reductions* (:func:`_rows_and_columns`): a reduction over every row axis K of a value the
# chain computes per element, whose result only leaves the kernel (a norm backward's
# ``dgamma = Σ_r dY·N`` and ``dbeta = Σ_r dY`` beside its row sums). The kernel then runs one full
# wave of ``splits`` blocks, each looping over row groups ``b, b + splits, ...`` (the first pass's
# row vectors and per-row scalars of the group ``prefetch`` groups ahead are loaded while this one
# is worked on, ``prefetch`` of them in flight in registers; the loop is unrolled ``prefetch`` times
# so that each slot is a register; vectors of the row's axes only, ``gamma``, are loaded once before
# the loop: a thread's columns are the same in every row). Each
# thread adds its columns' values into fp32 partials in shared memory (its own words only, laid out
# so a warp's lanes touch consecutive words); at the end the block adds its row slots in order and
# writes one partial row per column reduction. The ``splits`` rows per column are then added in the
# same kernel (no second launch: its launch and the gap before it were ~5.5 us of 47 at 4096x4096
# on an H100), by the blocks still there when the last one arrives (arrival counters in a
# persistent workspace zeroed once, ``Buffer.zeroed``, and left zero by every launch):
#
# - a block that finds every block of the launch started (a counter each block bumps first) may
#   wait for the others without keeping any from an SM: it arrives and registers as a *helper* in
#   one 64-bit atomic (blocks arrived, helpers: its index), and waits until the last block has
#   sealed the word; any other block arrives and exits. The last to arrive always helps (as the
#   next index if it had not registered) and seals the word, so every helper reads the final count
#   H from it;
# - helper h then adds tiles h, h + H, ... of ``THREADS / slices`` columns of one column reduction
#   (no ticket counter: a shorter chain of atomics after the last row); a tile's ``splits`` partials
#   are added in one fixed order (``slices`` interleaved slices of the blocks, :func:`combine_slices`;
#   all of a thread's loads in flight at once up to ``COMBINE_DEPTH``, then the slices in order),
#   whoever adds it: the same inputs give the same bits, whatever the timing, the helpers or the
#   prefetch depth;
# - a helper counts itself done with the counters once it has read H (before its tiles); the last
#   block, after its own tiles, waits for the others' count and zeroes every counter.
#
# So the tail after the last row is the partials read back from L2 by the whole wave (what the
# combining launch did) without the launch. A block only waits when every block has started, so
# a grid larger than the GPU holds (or one sharing it) cannot deadlock; it then has fewer helpers.
# HBM moves X, dY and dX once, the vectors once, and ``2 × 4 × splits × row`` bytes of partials per
# column reduction (written, read back), which the launch estimate states. Register mode only
# (the partials' words follow the register chunks).

#: Registers a thread may give to the values of the row it keeps across passes (64 fp32 values:
#: 8 chunks of bf16, 16 of fp32), and the most chunks one thread holds in register mode.
MAX_KEPT_REGS = 64
MAX_CHUNKS = 16
#: Registers of the chain kernel's footprint formula beside the row's values: addresses, row
#: index, loop state (fewer than the norm kernel's: no statistics of its own).
CHAIN_BASE_REGS = 16
#: Threads per row (one row per block) and chunks in flight per thread of a streamed row.
STREAM_THREADS = (256, 512, 1024)
STREAM_UNROLLS = (2, 4)
#: Blocks of a thread-block cluster that may share a streamed row (Hopper; :func:`cluster_config`),
#: and the most threads such a row has (64 warps: a lane folds two of the warps' values before
#: the warp's shuffles).
CLUSTER_SIZES = (2, 4, 8)
MAX_CLUSTER_ROW_THREADS = 2048
#: A streamed row with column reductions (:func:`streamed_column_configs`): the threads a row the
#: family proposes and the chunks a thread may have in flight (any of STREAM_THREADS in a schedule).
#: On an H200 (bf16 backwards, 8192 rows, a call, L2 flushed; ``norm_backward_streamed_s32.jsonl``)
#: two blocks an SM beat one at every width timed but the widest: the rmsnorm backward over 16384
#: values 242.5 us on 512 threads at two an SM (the budget cut to 64) against 287.2-298.9 at one and
#: 257.9 on 256 threads (two an SM, 1024 threads at one: 279.2); over 12288 188.5 against 248.5, over
#: 10240 201.0 against 260.1-261.2; the layernorm backward over 12288 269.2 against 260.5-265.2; the
#: rmsnorm backward over 24576 446.3 against 405.2 (three chunks at one an SM). A block meets its
#: row's barriers alone; one block an SM leaves the SM idle at each. The cut spills on sm_90a (up to
#: 196 bytes at 10240) and still measured faster there.
COLUMN_STREAM_THREADS = (512, 256)
COLUMN_STREAM_UNROLLS = (4, 3, 2)
#: Column reductions: the blocks are one wave (:func:`wave_splits` of SMs × the blocks one SM holds
#: at once: no second wave, every block the same number of row groups give or take one, the fewest
#: partials that do it); the SMs and blocks per SM assumed where no GPU is named; the most
#: shared memory a block may keep its column partials, their combine's tile and the block
#: reductions' scratch in (static and dynamic together).
DEFAULT_SMS = 132
DEFAULT_BLOCKS_PER_SM = 2
MAX_COL_SMEM = 160 * 1024
#: Column reductions: a block whose shared memory would pass the 48 KiB a kernel may declare
#: statically keeps its column partials in dynamic shared memory instead (:func:`colpart_dynamic`;
#: the launch raises the kernel's limit), up to :data:`MAX_COL_SMEM` (an A100 gives a block 163
#: KiB, Hopper 227) and what the GPU's profile lets a block have. Before, such rows left the
#: one-launch kernel: the layernorm backward over 8192 x 8192 bf16 (68 KiB, two column reductions)
#: ran a row kernel and a column kernel that read X and dY again, 176.2 us on an H200 (55 % of the
#: copy rate) where the rmsnorm backward's one launch (35 KiB) ran 116.7 (82 %).
MAX_STATIC_SMEM = 48 * 1024
#: Column reductions: the row groups a block loads ahead of the one it works on (each is the first
#: pass's row vectors of ``rows_per_block`` rows, in registers), by default and at most.
DEFAULT_PREFETCH = 1
MAX_PREFETCH = 3
#: The depths the family proposes: one. Two row groups ahead was proposed beside it (the model
#: weighing the bytes in flight against the registers) and picked for rows of 768-2048 values. On an
#: H200 (the same splits, a call, L2 flushed) depth 1 measured faster at 8 of 13 such picks, by up to
#: 31 % (rmsnorm backward 4096 x 1024 bf16 30.7 -> 21.3 us, 16384 x 2048 fp32 125.5 -> 101.5), and
#: slower at the other 5 by at most 4 % (`norm_backward_prefetch_ab.jsonl`); depth 2 lost at every pick
#: of depth 1 it was timed beside (34.3 -> 52.9 us at 4096 x 4096 bf16). Explicit schedules keep 1..3.
PREFETCHES = (1,)
#: Column reductions: a schedule may cut a configuration's register budget so that
#: ``blocks_per_sm`` blocks share an SM, at most MAX_SQUEEZE registers under the footprint formula
#: (which counts the row group worked on and the one loaded ahead as whole vectors; ptxas overlaps
#: them: a 512-thread row of 4096 bf16 values, footprint 79 (rmsnorm) / 86 (layernorm), builds in 64
#: without spills; the 320-thread rmsnorm backward of a row of 5000, footprint 122, builds in 96
#: without spills). The family proposes it for 16-bit rows where a configuration's own budget holds
#: one block an SM (:func:`_squeezable`): too few loads in flight. On an H100 (bf16, 4096 / 16384
#: rows of 5000) the rmsnorm backward ran 54.4 / 186.4 us on 320 threads at 2 blocks an SM against
#: 65.8 / 229.3 at one; at rows of 4096, where 256 threads already run 2 blocks an SM, the 512-thread
#: row on 64 registers measured the same (38.8 against 38.9 us, rstd recomputed). Beyond
#: :data:`SPILL_FREE_SQUEEZE` under the footprint ptxas may spill a few bytes, which cost less than
#: the second block an SM gains: the layernorm backward of a row of 5000 (mean and rstd saved,
#: footprint 126) on 96 registers spills 24 bytes on sm_90a (none on sm_80) and ran 63.9 / 213.5 us
#: on an H100 against 73.1 / 238.7 on its own budget (128 registers, one block an SM).
MAX_SQUEEZE = 30
#: The cut under the footprint that nvcc built without spills (sm_80, sm_90a) on every kernel measured
#: (tests/codegen/test_rowwise_columns.py holds the kernels the family proposes to it).
SPILL_FREE_SQUEEZE = 26
#: Column reductions: a configuration holding more values a thread than this is proposed only where
#: none holding at most this many runs as many blocks. Measured on an H100 (bf16 backwards with
#: their statistics saved, the same splits): 16 values a thread (256 threads) against 32 (128
#: threads) at rows of 4096: rmsnorm 41.2 vs 44.1 us (4096 rows), 140.1 vs 144.8 (16384), layernorm
#: 46.3 vs 49.2, 148.9 vs 154.3; rows of 5000 (132 blocks): 16 (320 threads) 67.3 / 70.9 us against
#: 24 (256 threads) 73.7 / 82.6. The rmsnorm backward that recomputes its statistic (3 passes) keeps
#: 128 threads at 3 blocks an SM (396 blocks; 47.7 / 148.0 us), where 256 threads, 264 blocks, took
#: 48.7 / 160.8. 16-bit rows a warp holds (24-32 values a thread, rows of 768-1024) are proposed
#: beside them wherever they fill a wave of blocks: there 64 threads a row over 1024 blocks combined
#: four times the partials (H200, rmsnorm backward 8192 x 768 26.3 -> 19.3 us on 32 threads a row).
COL_VALUES = 16
#: Column reductions: the most chunks a thread of a block fitted to the row holds (fitted_threads;
#: two 16-byte chunks of 16-bit values are COL_VALUES).
FIT_CHUNKS = 2
#: Combining column partials in the chain kernel: a tile is ``THREADS / slices`` columns, each
#: added by ``slices`` threads (:func:`combine_slices`) over interleaved blocks (then the slices in
#: order), with up to ``COMBINE_DEPTH`` partials a thread loads before it adds them (bytes in
#: flight; :func:`combine_depth`). The slices fix the order of the sum (and so its bits); the depth
#: does not change it. A thread's share of ``splits`` partials takes ``ceil(splits / (slices x
#: depth))`` dependent rounds of L2 loads (:func:`combine_rounds`). Tiles are ``COMBINE_COLS``
#: columns (a 512-thread block's 32 slices load 8-9 of 264 partials each, a 128-thread block's 8
#: slices 33 in 3 rounds), narrower (down to ``MIN_COMBINE_COLS``, a 32-byte sector of each
#: partial row) only where that leaves more than ``MAX_COMBINE_ROUNDS`` rounds. Measured on an
#: H200 (bf16, `norm_backward_combine_slices_s30.jsonl`): the 64-thread blocks of the rmsnorm
#: backward over 8192 x 1024 (1024 splits, 16 rounds of 4 slices) ran 28.1 us, 25.6 with 8-column
#: tiles (8 rounds); where 16-column tiles take 2-4 rounds, 8-column tiles (1-2 rounds) ran 0.5-3 %
#: slower (layernorm 8192 x 2048 37.8 -> 38.8 us, 16384 x 4096 122.0 -> 122.9). Loading the next
#: round while adding one (double-buffered loads) measured the same as this.
COMBINE_COLS = 16
MIN_COMBINE_COLS = 8
MAX_COMBINE_ROUNDS = 4
COMBINE_DEPTH = 16
#: Column reductions' arrival counters (32-bit words of a zeroed workspace): blocks arrived and
#: helpers registered (the low and high half of one 64-bit word), blocks started, helpers done.
COUNTERS = ("arrived", "helpers", "started", "done")
#: C operator of each reduction kind, its identity, and the block/warp reduction operator.
_CHAIN_OPS = {"sum": ("({a} + {b})", "0.f", "napkin::SumOp"),
              "max": ("napkin::max_nan({a}, {b})", "(-INFINITY)", "napkin::MaxOp"),
              "min": ("napkin::min_nan({a}, {b})", "INFINITY", "napkin::MinOp")}


@dataclass(frozen=True, eq=False)
class Chain:
    """One reduction of the row: boxes each reducing the one before (``links``) that together
    reduce every axis of the row, their kind (``sum``, ``max``, ``min``; a mean is a sum times
    ``scale``, the product of 1/n over the axes a mean reduces).

    ``pair``: a sum of ``exp(x − c)`` whose shift ``c`` is the max chain ``pair`` of the same ``x``
    (a softmax's or logsumexp's sum written out, :func:`napkin.diagrams.ops.shifted_exp`), run
    beside that max in one pass as an online softmax does (:func:`_paired_sums`); ``exact``: ``c``
    is the max itself (not ``zero_inf`` of it)."""

    links: tuple[Value, ...]
    how: str
    scale: float
    pair: "Chain | None" = None
    exact: bool = True

    @property
    def source(self) -> Value:
        return self.links[0].args[0]

    @property
    def operand(self) -> Value:
        """The value the kernel reduces per element: the source, or a paired sum's max's source
        (``x`` of ``Σ exp(x − max x)``: the shift and its exp are computed by the pair itself)."""
        return self.pair.source if self.pair is not None else self.source

    @property
    def result(self) -> Value:
        return self.links[-1]


@dataclass(frozen=True, eq=False)
class ChainShape:
    """What the family found in a chain of maps and reductions over a row (names are checked)."""

    diagram: Diagram
    dtype: str
    sizes: dict
    red: tuple[str, ...]            # R: the row, innermost axes of the largest array, in its order
    row_axes: tuple[str, ...]       # K: the axes that index rows, in that array's order
    chains: tuple[Chain, ...]
    stage: dict                     # id(value) -> the first pass that can evaluate it
    passes: int
    full_out: tuple[tuple[str, Value], ...]   # outputs holding the whole row (K and R)
    row_out: tuple[tuple[str, Value], ...]    # outputs holding one value per row (K)
    access: dict                    # id(input) -> "row" (vectors), "scalar" (one per row), "gather"
    needs: tuple[tuple[Value, ...], ...] = ()   # per pass: the row-varying values it evaluates
    source: Diagram | None = None   # the diagram given, where ``diagram`` rewrote its contractions
    cols: tuple[Chain, ...] = ()    # column reductions: over every row axis K, summed per block
    col_out: tuple[tuple[str, Value], ...] = ()   # their outputs (holding R, in red's order)
    kind = "chain"

    @property
    def xsize(self) -> int:
        """Values in one row (the product of R's sizes)."""
        return math.prod(self.sizes[a] for a in self.red)

    @property
    def nrows(self) -> int:
        return math.prod(self.sizes[a] for a in self.row_axes)

    @property
    def vec(self) -> int:
        return 16 // lookup_dtype(self.dtype).bytes

    @property
    def x(self) -> str:
        """The row's innermost axis."""
        return self.red[-1]

    def name(self, v: Value) -> str:
        return self.diagram.name_of(v)

    def is_full(self, v: Value) -> bool:
        """Whether ``v`` varies along the row (carries an axis of R): evaluated per element."""
        return bool(set(v.axis_names) & set(self.red))

    def pass_of(self, c: Chain) -> int:
        """The pass that accumulates reduction ``c`` (a paired sum: its max's)."""
        return self.stage[id(c.operand)]

    def need(self, p: int) -> tuple[Value, ...]:
        """The row-varying values pass ``p`` evaluates per element (inputs and maps), in
        topological order: those its reductions and row-shaped outputs need."""
        if self.needs:
            return self.needs[p]
        targets = [c.operand for c in (*self.chains, *self.cols) if self.pass_of(c) == p]
        targets += [v for _, v in self.full_out if self.stage[id(v)] == p]
        got: set[int] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            if id(v) in got or not self.is_full(v):
                continue
            got.add(id(v))
            if not v.is_input:
                stack.extend(v.args)
        d = self.diagram
        return tuple(v for v in (*d.inputs, *d.nodes) if id(v) in got)

    @property
    def fresh(self) -> tuple[Value, ...]:
        """Inputs read whole from HBM for every row (row vectors holding every axis)."""
        axes = set(self.red) | set(self.row_axes)
        return tuple(v for v in self.diagram.inputs
                     if self.access.get(id(v)) == "row" and set(v.axis_names) == axes)

    def chunk_constant(self, v: Value) -> bool:
        """Whether input ``v`` holds one value over every aligned chunk of ``VEC`` columns: each
        axis of the row it carries changes only every multiple of ``VEC`` columns (group norm's
        ``gamma[g,c]`` over a row (c, s))."""
        inner = 1
        for a in reversed(self.red):
            if a in v.axis_names and inner % self.vec:
                return False
            inner *= self.sizes[a]
        return True

    def uses(self, v: Value) -> tuple[int, ...]:
        """The passes that read input ``v`` per element."""
        return tuple(p for p in range(self.passes) if any(u is v for u in self.need(p)))

    @property
    def kept(self) -> tuple[Value, ...]:
        """Fresh inputs that several passes read: kept in registers in register mode."""
        return tuple(v for v in self.fresh if len(self.uses(v)) > 1)


def analyse_chain(diagram: Diagram) -> ChainShape | str:
    """The chain structure of ``diagram`` (maps and reductions over one row), or why it has none."""
    d = diagram
    nodes = d.nodes
    for v in nodes:
        if not isinstance(v.op, (Map, Reduce)):
            return f"box {d.name_of(v)} is a {v.op.kind}, not an elementwise map or a reduction"
    why = plain_kernel_reason(d, _SUPPORTED)
    if why:
        return why
    dtype = d.nodes[0].dtype  # the one dtype of every array
    consumers = d.consumers
    out_ids = {id(v) for v in d.outputs}
    chains: list[Chain] = []
    for first in nodes:
        if not isinstance(first.op, Reduce) or isinstance(first.args[0].op, Reduce):
            continue
        links = [first]
        while True:
            nxt = [c for c in consumers.get(id(links[-1]), ()) if isinstance(c.op, Reduce)]
            if not nxt:
                break
            if len(consumers[id(links[-1])]) > 1 or id(links[-1]) in out_ids:
                return (f"reduction {d.name_of(links[-1])} is read by more than the next reduction over the "
                        "row (a partial reduction of the row)")
            links.append(nxt[0])
        hows = [v.op.how for v in links]
        kinds = {"sum" if h == "mean" else h for h in hows}
        if len(kinds) != 1:
            return (f"the reductions {', '.join(d.name_of(v) for v in links)} mix {', '.join(sorted(set(hows)))} "
                    "over one row")
        scale = 1.0
        for v in links:
            if v.op.how == "mean":
                scale /= v.args[0].axis(v.op.over).bound_size
        chains.append(Chain(tuple(links), kinds.pop(), scale))
    if not chains:
        return "has no reduction"
    values = (*d.inputs, *nodes)
    U: list[str] = []
    for v in values:
        U += [a for a in v.axis_names if a not in U]
    whole = [v for v in d.inputs if set(v.axis_names) == set(U)] + [v for v in d.outputs if set(v.axis_names) == set(U)]
    picked = _rows_and_columns(d, chains, U, whole[0] if whole else None)
    if isinstance(picked, str):
        return picked
    R, chains, cols = picked
    kept_axes = [a for a in U if a not in R]
    if not whole:
        return f"no input or output holds every axis ({', '.join(U)}) to lay the rows out"
    primary = whole[0]
    nr = len(R)
    if set(primary.axis_names[len(primary.axis_names) - nr:]) != R:
        return (f"{d.name_of(primary)} does not hold the reduced axes ({', '.join(sorted(R))}) innermost "
                "(contiguous rows)")
    red = primary.axis_names[len(primary.axis_names) - nr:]
    row_axes = primary.axis_names[:len(primary.axis_names) - nr]
    access: dict[int, str] = {}
    for v in d.inputs:
        have = set(v.axis_names) & R
        if not have:
            access[id(v)] = "scalar"
        elif v.axis_names[len(v.axis_names) - nr:] == red:
            access[id(v)] = "row"
        else:
            access[id(v)] = "gather"
    for c in cols:
        if c.result.axis_names != red:
            return (f"column reduction {d.name_of(c.result)} holds ({', '.join(c.result.axis_names)}), not the row's "
                    f"axes in the order of the rows ({', '.join(red)})")
    chains = _paired_sums(d, chains)
    stage: dict[int, int] = {id(v): 0 for v in d.inputs}
    result_of = {id(c.result): c for c in (*chains, *cols)}
    link_ids = {id(v) for c in (*chains, *cols) for v in c.links}
    for v in nodes:
        if id(v) in result_of:
            stage[id(v)] = stage[id(result_of[id(v)].operand)] + 1
        elif id(v) in link_ids:
            continue
        else:
            stage[id(v)] = max(stage[id(a)] for a in v.args)
    full_out, row_out, col_out = [], [], []
    col_ids = {id(c.result) for c in cols}
    for n, v in zip(d.output_names, d.outputs):
        if any(n == m for m, _ in (*full_out, *row_out, *col_out)):
            continue
        if id(v) in col_ids:
            col_out.append((n, v))
            continue
        if set(v.axis_names) & R:
            if set(v.axis_names) != set(U) or v.axis_names[len(v.axis_names) - nr:] != red:
                return (f"output {n} holds ({', '.join(v.axis_names)}), not every axis with the row "
                        f"({', '.join(red)}) innermost")
            full_out.append((n, v))
        else:
            if set(v.axis_names) != set(kept_axes):
                return (f"output {n} holds ({', '.join(v.axis_names)}), not one value per row "
                        f"({', '.join(kept_axes)})")
            row_out.append((n, v))
    passes = 1 + max([stage[id(c.operand)] for c in (*chains, *cols)] + [stage[id(v)] for _, v in full_out])
    if passes == 1 and len(chains) == 1 and not cols and len({v.op.how for v in chains[0].links}) == 1:
        # the pointwise family's row kernel runs this too, and splits a long row over blocks
        return ("one reduction in one pass with maps around it: the pointwise family runs it "
                "(the row-wise chain needs several reductions or passes)")
    sizes = {n: a.bound_size for n, a in d.axes.items()}
    shape = ChainShape(d, dtype, sizes, tuple(red), tuple(row_axes), tuple(chains), stage, passes,
                       tuple(full_out), tuple(row_out), access, cols=tuple(cols), col_out=tuple(col_out))
    if shape.xsize >= 2 ** 30:
        return f"a row of {shape.xsize} values is longer than the 2^30 its 32-bit column index reaches"
    return dataclasses.replace(shape, needs=tuple(shape.need(p) for p in range(passes)))


def _paired_sums(d: Diagram, chains: list[Chain]) -> list[Chain]:
    """``chains`` with each sum of ``exp(x − c)`` paired with the max chain ``c`` is of (``c`` the
    max of ``x`` or ``zero_inf`` of it: a softmax's or logsumexp's sum written out) where nothing
    else reads the exp: the kernel then keeps the pair (running max, sum of exp(x − running max)) in
    the max's pass, rescaling the sum when the max grows, and merges pairs across threads
    (reduce.cuh: ``fold_max_sumexp``, ``xor_reduce_max_sumexp``). The sum no longer waits a pass
    for the max: a log-softmax runs two passes instead of three and a logsumexp one instead of two,
    so a streamed row is read once less.

    >>> from napkin.diagrams import library
    >>> s = analyse(library.get("log_softmax").bind(r=4, x=100))
    >>> [(c.how, c.pair is not None) for c in s.chains], s.passes
    ([('max', False), ('sum', True)], 2)
    """
    consumers = d.consumers
    out_ids = {id(v) for v in d.outputs}
    maxes = {id(c.result): c for c in chains if c.how == "max"}
    taken: set[int] = set()
    out = []
    for c in chains:
        found = shifted_exp(c.source) if c.how == "sum" else None
        m = maxes.get(id(found[2])) if found is not None else None
        e = c.source
        if (m is None or found[0] is not m.source or id(m) in taken or id(e) in out_ids
                or len(consumers.get(id(e), ())) != 1):
            out.append(c)
            continue
        taken.add(id(m))
        out.append(dataclasses.replace(c, pair=m, exact=found[3]))
    return out


def _rows_and_columns(d: Diagram, chains: list[Chain], U: list[str], primary: Value | None
                      ) -> "tuple[set[str], list[Chain], list[Chain]] | str":
    """(the row R, the reductions over it, the column reductions) of a chain diagram, or why
    there is none. Without column reductions every chain reduces the same axes, R. A *column
    reduction* reduces every other axis instead (the rows, K: ``dgamma = Σ_r dY·N`` beside the
    row sums of a norm's backward): its source holds every axis, nothing in the kernel reads its
    result (an output, complete only when every row is done), and the rows are laid out with R
    innermost (``primary``, the first array holding every axis). The kernel sums it per block
    while it streams its rows (see "column reductions" below)."""
    reduced = [frozenset(v.op.over for v in c.links) for c in chains]
    distinct = list(dict.fromkeys(reduced))
    if len(distinct) == 1:
        return set(distinct[0]), list(chains), []
    consumers = d.consumers
    out_ids = {id(v) for v in d.outputs}

    def column(c: Chain, rows: frozenset) -> bool:
        return (frozenset(v.op.over for v in c.links) == frozenset(U) - rows and id(c.result) in out_ids
                and not consumers.get(id(c.result)) and set(c.source.axis_names) == set(U))

    for R in distinct:
        rest = [c for c, s in zip(chains, reduced) if s != R]
        inner = primary is not None and set(primary.axis_names[len(primary.axis_names) - len(R):]) == R
        if inner and all(column(c, R) for c in rest):
            return set(R), [c for c, s in zip(chains, reduced) if s == R], rest
    first = distinct[0]
    c = next(c for c, s in zip(chains, reduced) if s != first)
    return (f"reduction {d.name_of(c.result)} reduces ({', '.join(sorted(reduced[chains.index(c)]))}), not the whole "
            f"row ({', '.join(sorted(first))}), and is no column reduction (one that reduces every other axis of "
            "an array holding every axis, read by no box)")


@dataclass(frozen=True)
class ChainConfig:
    """One configuration of the chain kernel: ``unroll`` chunks in flight per loop step; in
    register mode (``stream`` False) one step holds the thread's whole part of the row. A streamed
    row whose kept inputs pass one block's shared memory is shared by the ``cluster`` blocks of a
    thread-block cluster (Hopper): ``threads_per_row`` counts the row's threads over all of them,
    each block keeps its chunks, and the reductions meet in the blocks' shared memory
    (:func:`cluster_config`)."""

    threads_per_row: int
    rows_per_block: int
    vec: int
    chunks_per_thread: int
    unroll: int
    stream: bool
    splits: int | None = None   # with column reductions: the blocks, each looping over row groups
    prefetch: int = 1           # with column reductions: row groups loaded ahead of the one worked on
    blocks_per_sm: int | None = None   # with column reductions: the register budget cut to keep this many
    cached: int = 0             # a streamed row: inputs kept in shared memory for the later passes (row_cache)
    cluster: int = 1            # a streamed, kept row: the blocks of a cluster that share it

    @property
    def threads(self) -> int:
        """Threads of one block (a cluster's blocks share a row's ``threads_per_row``)."""
        return self.threads_per_row * self.rows_per_block // self.cluster

    @property
    def block_mode(self) -> bool:
        return self.threads_per_row > 32

    @property
    def values_per_thread(self) -> int:
        return self.vec * self.chunks_per_thread

    def options(self, shape: ChainShape) -> KernelOptions:
        """Typed options: a streamed row says how many chunks it keeps in flight (``stages``), a
        kernel with column reductions how many row groups it loads ahead (``stages``)."""
        stages = self.unroll if self.stream else (self.prefetch if self.splits else None)
        return KernelOptions(threads_per_row=self.threads_per_row, warps=self.threads // 32, stages=stages,
                             regs_per_thread=chain_regs_estimate(shape, self), splits=self.splits,
                             blocks_per_sm=self.blocks_per_sm, streamed=True if self.stream else None,
                             row_in_smem=True if self.cached else None,
                             cluster=self.cluster if self.cluster > 1 else None)

    def groups(self, shape: ChainShape) -> int:
        """Groups of ``rows_per_block`` rows (the blocks of a kernel without column reductions)."""
        return max(1, -(-shape.nrows // self.rows_per_block))

    def blocks(self, shape: ChainShape) -> int:
        """Blocks launched: one per row group (``cluster`` per row), or ``splits`` looping over the
        row groups."""
        return self.splits if self.splits else self.groups(shape) * self.cluster

    def iterations(self, shape: ChainShape) -> int:
        """Row groups one block runs one after another (1 without column reductions)."""
        return -(-self.groups(shape) // self.splits) if self.splits else 1


def make_chain_config(shape: ChainShape, threads_per_row: int, rows_per_block: int,
                      stream_unroll: int | None = None, splits: int | None = None,
                      prefetch: int | None = None, blocks_per_sm: int | None = None,
                      row_in_smem: bool = False, smem_budget: int = MAX_ROW_SMEM,
                      cluster: int = 1) -> ChainConfig:
    """A chain configuration, checked: ``stream_unroll`` chunks in flight of a streamed row; with
    column reductions ``splits`` blocks looping over the row groups, each loading ``prefetch`` of
    them ahead (1..:data:`MAX_PREFETCH`; default :data:`DEFAULT_PREFETCH`), and optionally a
    register budget cut so that ``blocks_per_sm`` blocks share an SM (at most
    :data:`MAX_SQUEEZE` registers under the footprint, else ptxas would spill); a streamed row
    without column reductions may keep its re-read inputs in shared memory (``row_in_smem``:
    :func:`row_cache`), as many as ``smem_budget`` bytes of each block hold (:func:`row_smem_budget`),
    and share the row over the ``cluster`` blocks of a thread-block cluster (``threads_per_row``
    then counts the threads of all of them: :data:`CLUSTER_SIZES`, each block
    :data:`STREAM_THREADS`, at most :data:`MAX_CLUSTER_ROW_THREADS` a row)."""
    if shape.cols and threads_per_row in fitted_threads(shape):
        # a block of whole warps sized to the row (one row per block; see fitted_threads)
        if rows_per_block != 1:
            raise CodegenError(f"rowwise: with {threads_per_row} threads per row a block holds one row "
                               f"(ROWS_PER_BLOCK=1), got {rows_per_block}")
        base = Config(threads_per_row, 1, shape.vec, -(-(-(-shape.xsize // shape.vec)) // threads_per_row))
    elif cluster != 1:
        if (cluster not in CLUSTER_SIZES or threads_per_row % cluster or rows_per_block != 1
                or threads_per_row // cluster not in STREAM_THREADS or threads_per_row > MAX_CLUSTER_ROW_THREADS):
            raise CodegenError(f"rowwise: a cluster of {CLUSTER_SIZES} blocks of {STREAM_THREADS} threads shares one "
                               f"row of at most {MAX_CLUSTER_ROW_THREADS} threads, not {cluster} blocks and "
                               f"{threads_per_row} threads")
        base = make_config(shape, threads_per_row // cluster, 1)   # one block's threads
    else:
        base = make_config(shape, threads_per_row, rows_per_block)   # checks the thread counts
    if shape.cols:
        # column reductions: per-thread partials of fixed columns, in registers (register mode)
        groups = max(1, -(-shape.nrows // rows_per_block))
        if splits is None or not 1 <= splits <= groups:
            raise CodegenError(f"rowwise: column reductions need a block count (splits) in 1..{groups} (the "
                               f"groups of {rows_per_block} rows), got {splits}")
        if stream_unroll is not None:
            return _streamed_columns_config(shape, base, threads_per_row, rows_per_block, stream_unroll,
                                            splits, prefetch, blocks_per_sm)
        depth = DEFAULT_PREFETCH if prefetch is None else prefetch
        if not 1 <= depth <= MAX_PREFETCH:
            raise CodegenError(f"rowwise: column reductions load 1..{MAX_PREFETCH} row groups ahead (stages), "
                               f"got {prefetch}")
        cfg = ChainConfig(threads_per_row, rows_per_block, base.vec, base.chunks_per_thread,
                          base.chunks_per_thread, False, splits, depth)
        return _with_budget_cut(shape, cfg, blocks_per_sm)
    if blocks_per_sm is not None:
        raise CodegenError("rowwise: blocks_per_sm (a register budget cut) only with column reductions")
    if prefetch is not None:
        raise CodegenError("rowwise: prefetch (row groups loaded ahead) only with column reductions")
    if splits is not None:
        raise CodegenError("rowwise: splits (blocks looping over rows) only with column reductions")
    if cluster != 1 and (stream_unroll is None or not row_in_smem):
        raise CodegenError("rowwise: a cluster of blocks shares only a streamed row kept in shared memory "
                           f"(stages and row_in_smem), got cluster={cluster}")
    if stream_unroll is None:
        if row_in_smem:
            raise CodegenError("rowwise: row_in_smem (the row kept in shared memory) only for a streamed row")
        return ChainConfig(threads_per_row, rows_per_block, base.vec, base.chunks_per_thread,
                           base.chunks_per_thread, False)
    # (a cluster's block threads were checked above)
    if threads_per_row // cluster not in STREAM_THREADS or stream_unroll not in STREAM_UNROLLS:
        raise CodegenError(f"rowwise: a streamed row runs {STREAM_THREADS} threads with {STREAM_UNROLLS} chunks "
                           f"in flight, not {threads_per_row} and {stream_unroll}")
    # a row that is not whole vectors runs on the shifted grid (grid_chunks): one chunk more
    cpt = -(-(-(-grid_chunks(shape) // threads_per_row)) // stream_unroll) * stream_unroll
    cfg = ChainConfig(threads_per_row, 1, base.vec, cpt, stream_unroll, True, cluster=cluster)
    if not row_in_smem:
        return cfg
    cached = len(row_cache(shape, cfg, smem_budget))
    if not cached:
        raise CodegenError(f"rowwise: no input of this row is read by two passes and fits the {smem_budget} "
                           "bytes of shared memory a block may keep (row_in_smem)")
    return dataclasses.replace(cfg, cached=cached)


def _streamed_columns_config(shape: ChainShape, base: Config, threads_per_row: int, rows_per_block: int,
                             unroll: int, splits: int, prefetch: int | None,
                             blocks_per_sm: int | None) -> ChainConfig:
    """Column reductions over a row too long for registers (:func:`streamed_column_configs`): one
    row a block of :data:`STREAM_THREADS` threads, every pass loading ``unroll`` chunks a thread at
    a time, the partials in shared memory. A thread's chunks are rounded up to whole steps of
    ``unroll`` (those past the row load nothing and hold no column: :func:`column_chunks`)."""
    if threads_per_row not in STREAM_THREADS or unroll not in COLUMN_STREAM_UNROLLS or rows_per_block != 1:
        raise CodegenError(f"rowwise: a streamed row with column reductions runs one row a block on "
                           f"{STREAM_THREADS} threads with {COLUMN_STREAM_UNROLLS} chunks in flight, not "
                           f"{rows_per_block} row(s) of {threads_per_row} threads and {unroll}")
    if prefetch not in (None, 1):
        raise CodegenError("rowwise: a streamed row loads no row group ahead (stages)")
    cpt = -(-base.chunks_per_thread // unroll) * unroll
    return _with_budget_cut(shape, ChainConfig(threads_per_row, 1, base.vec, cpt, unroll, True, splits, 1),
                            blocks_per_sm)


def _with_budget_cut(shape: ChainShape, cfg: ChainConfig, blocks_per_sm: int | None) -> ChainConfig:
    """``cfg`` with its register budget cut so that ``blocks_per_sm`` blocks share an SM (None: its
    own budget), checked: at most :data:`MAX_SQUEEZE` registers under the footprint."""
    if blocks_per_sm is None:
        return cfg
    cap, need = _squeezed(cfg, blocks_per_sm), chain_regs_need(shape, cfg)
    if blocks_per_sm < 1 or cap < need - MAX_SQUEEZE:
        raise CodegenError(f"rowwise: {blocks_per_sm} blocks of {cfg.threads} threads an SM leave "
                           f"{max(cap, 0)} registers a thread, more than {MAX_SQUEEZE} under the "
                           f"footprint of {need} (it would spill)")
    return dataclasses.replace(cfg, blocks_per_sm=blocks_per_sm)


def _holds_a_step(shape: ChainShape, cfg: ChainConfig, blocks_per_sm: int) -> bool:
    """Whether a streamed row's register budget cut for ``blocks_per_sm`` blocks an SM still holds
    one step's loads in flight (``unroll`` 16-byte chunks of each vector the first pass loads, 4
    registers each), the chunk it unpacks and the base registers. ptxas may spill the rest (the
    values it keeps for the later passes, where a thread's chunks are one step) and the kernel
    still ran fastest; a load in flight that it spills waits there. H200, bf16, 8192 rows, the cut
    to 64: the rmsnorm backward over 10240 (three chunks a step, 36 registers of loads; 196 bytes
    spilled) 201.0 us against 260.1 on its own budget, over 12288 188.5 against 248.5, the layernorm
    backward over 10240 268.8 against 327.9 (256 threads); over 16384 four chunks a step (48
    registers of loads; 72 bytes spilled) 360.1 us against 242.5 two a step."""
    loads = sum(1 for v in _loaded(shape, 0, cfg)[0] if shape.access[id(v)] == "row")
    return _squeezed(cfg, blocks_per_sm) >= 4 * cfg.unroll * loads + cfg.vec + CHAIN_BASE_REGS


def column_chunks(shape: ChainShape, cfg: ChainConfig) -> int:
    """The chunks of a thread that hold columns of the row (the column partials' words follow
    them): ``chunks_per_thread``, but where a streamed row's last step of ``unroll`` chunks runs
    past the row's end for every lane.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> s = analyse(prepare(library.get("rmsnorm").grad(save={"N_rstd"}), sizes=dict(r=64, x=10240), dtype="bf16"))
    >>> c = make_chain_config(s, 256, 1, 4, splits=64)
    >>> c.chunks_per_thread, column_chunks(s, c)
    (8, 5)
    """
    return min(cfg.chunks_per_thread, -(-(-(-shape.xsize // cfg.vec)) // cfg.threads_per_row))


def _loaded(shape: ChainShape, p: int, cfg: ChainConfig) -> tuple[list[Value], list[Value]]:
    """(row inputs pass ``p`` loads as vectors, gathered inputs it reads per element); the
    vectors a kernel with column reductions holds for every row (:func:`resident`) are loaded
    once, before its loop over the rows, not here."""
    kept = {id(v) for v in shape.kept} if not cfg.stream else set()
    held = {id(v) for v in resident(shape, cfg)}
    vecs, gathers = [], []
    for v in shape.need(p):
        if not v.is_input or id(v) in held:
            continue
        if shape.access[id(v)] == "gather":
            gathers.append(v)
        elif id(v) not in kept or shape.uses(v)[0] == p:
            vecs.append(v)
    return vecs, gathers


def resident(shape: ChainShape, cfg: ChainConfig) -> tuple[Value, ...]:
    """The inputs a chain kernel with column reductions loads once, before its loop over the row
    groups, and keeps in registers: vectors holding the row's axes only, in its order
    (``gamma[x]``): a thread's columns are the same in every row it works on, so each row would
    read the same 16 bytes again (from L2, a wait in every pass of every row)."""
    if not shape.cols or cfg.stream:
        return ()
    used = {id(v) for p in range(shape.passes) for v in shape.need(p)}
    return tuple(v for v in shape.diagram.inputs
                 if id(v) in used and shape.access.get(id(v)) == "row" and v.axis_names == shape.red)


def chain_regs_need(shape: ChainShape, cfg: ChainConfig) -> int:
    """The footprint formula: the kept inputs' values (one fp32 register a value: ptxas unpacks a
    16-bit vector once and keeps the floats, or the maps of them, for every pass that reads them),
    the busiest pass's loads in flight (``unroll`` raw 16-byte chunks, 4 registers each), the
    chunk it unpacks (``VEC`` floats) and the packed stores of its row-shaped outputs, its gathered
    inputs (one value per chunk in flight where it is constant over the chunk, else half a
    register per value in flight: ptxas hoists the scalar loads), one register per per-row value
    and accumulator, two per row axis whose index is computed, and a fixed base for addresses,
    indices and loop state. With column reductions: the row loop's state, the ``prefetch`` row
    groups' raw vectors and scalars loaded ahead, and the raw vectors held for every row."""
    kept = 0 if cfg.stream else cfg.vec * cfg.unroll * len(shape.kept)
    busiest = 0
    for p in range(shape.passes):
        vecs, gathers = _loaded(shape, p, cfg)
        fresh_kept = {id(v) for v in shape.kept} if not cfg.stream else set()
        loads = sum(1 for v in vecs if id(v) not in fresh_kept)
        stores = sum(1 for _, v in shape.full_out if shape.stage[id(v)] == p)
        each = sum(cfg.unroll if shape.chunk_constant(v) else cfg.unroll * cfg.vec // 2 for v in gathers)
        busiest = max(busiest, 4 * cfg.unroll * loads + cfg.vec + 4 * stores + each)
    scalars = sum(1 for v in (*shape.diagram.inputs, *shape.diagram.nodes) if not shape.is_full(v))
    index = 2 * len(shape.row_axes) + 2 * (len(shape.red) - 1)
    ragged = 4 if not _even(shape, cfg) else 0
    # column reductions: their partials live in shared memory (colpart_in_registers: registers only
    # where they fit this footprint's budget); the row loop's state and addresses,
    # and the next row group's raw vectors (4 registers a chunk) and scalars, loaded ahead
    cols = 6 + 2 * len(shape.cols) if shape.cols else 0
    # the groups in flight, and of a 16-bit row the raw vectors of the group worked on while the
    # next load goes out (fp32 ones are the row's values, counted above)
    worked = 1 if lookup_dtype(shape.dtype).bytes == 2 else 0
    for v in prefetched(shape, cfg):
        if shape.access[id(v)] == "row":
            cols += (cfg.prefetch + worked) * 4 * cfg.unroll
        else:
            cols += cfg.prefetch
    cols += 4 * cfg.unroll * len(resident(shape, cfg))     # the vectors held for every row
    return CHAIN_BASE_REGS + kept + busiest + scalars + len(shape.chains) + index + ragged + cols


def _even(shape, cfg) -> bool:
    chunks = -(-shape.xsize // cfg.vec)
    return chunks * cfg.vec == shape.xsize and chunks == cfg.chunks_per_thread * cfg.threads_per_row


def _slack(cfg: ChainConfig) -> int:
    """Registers the budget keeps over the footprint: 8, or none with column reductions and one
    row group in flight in register mode (the footprint counts the group worked on and the one
    loaded as whole vectors, which ptxas overlaps; 8 more would cost a resident block of a
    256-thread row). A streamed row with column reductions keeps 16: on 8 nvcc spilled the
    rmsnorm backward's row of 16384 on 512 threads, four chunks in flight (28 bytes on sm_80), on
    none the fp32 layernorm backward's row of 12000 on 256 threads."""
    if cfg.stream and cfg.splits:
        return 16
    return 0 if cfg.splits and cfg.prefetch == 1 else 8


def _squeezed(cfg: ChainConfig, blocks_per_sm: int) -> int:
    """The most registers a thread may have for ``blocks_per_sm`` blocks of ``cfg`` to share an
    SM's 64 Ki registers (in allocation units of 8)."""
    return (65536 // (cfg.threads * max(1, blocks_per_sm))) // 8 * 8


def chain_regs_estimate(shape: ChainShape, cfg: ChainConfig) -> int:
    """The register budget the model assumes and the kernel asks for (``__maxnreg__``): the
    footprint rounded up to the allocation unit (8), plus the slack (:func:`_slack`); cut to
    what keeps ``blocks_per_sm`` blocks on an SM where the configuration names it."""
    budget = -(-chain_regs_need(shape, cfg) // 8) * 8 + _slack(cfg)
    if cfg.blocks_per_sm:
        budget = min(budget, _squeezed(cfg, cfg.blocks_per_sm))
    return min(MAX_REGS, budget, (65536 // cfg.threads) // 8 * 8)


def fitted_threads(shape: ChainShape) -> tuple[int, ...]:
    """Column reductions: block sizes beside :data:`THREADS_PER_ROW` fitted to a row whose chunks
    no power of two divides: for 1..:data:`FIT_CHUNKS` chunks a thread, the fewest whole warps that
    hold the row (a row of 5000 bf16 values, 625 chunks: 2 a thread on 320 threads or 1 on 640, 98 %
    of the lanes busy, where 256 threads need 3 a thread, 81 % busy, and 512 threads 2, 61 %; H100,
    rmsnorm backward of 4096 rows: 67.3 us on 320, 62.2 on 640, 73.7 on 256), and a row of whole
    warps' chunks that no power-of-two block holds evenly (5120: 640 chunks, 2.5 a thread on 256
    threads). Not where a power-of-two block holds the row in at most :data:`FIT_CHUNKS` chunks a
    thread (4096: 2 a thread on 256 threads). 16-bit rows only, and
    the family proposes them with one row group loaded ahead: nvcc (sm_80, sm_90a) spilled fp32
    rows, two groups ahead or a cut register budget on them.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> d = prepare(library.get("rmsnorm").grad(save={"N_rstd"}), sizes=dict(r=64, x=5000), dtype="bf16")
    >>> fitted_threads(analyse(d))
    (320, 640)
    >>> def fitted(x): return fitted_threads(analyse(prepare(d, sizes=dict(r=64, x=x), dtype="bf16")))
    >>> fitted(5120), fitted(3072), fitted(4096), fitted(1024)
    ((320, 640), (192, 384), (), ())
    """
    if not shape.cols or lookup_dtype(shape.dtype).bytes != 2:
        return ()
    return warp_blocks(-(-shape.xsize // shape.vec), FIT_CHUNKS)


def wave_splits(groups: int, slots: int) -> int:
    """Column reductions: the blocks of one wave over ``groups`` row groups where ``slots`` blocks
    fit the GPU at once: the fewest that run as few groups each as ``slots`` blocks would, so that
    every block runs the same number of groups (give or take one in the last few) and the wave ends
    together, where ``slots`` blocks would leave the last groups' round to part of them (4096 rows
    over 396 slots: 373 blocks of 11 groups, not 136 of 11 and 260 of 10), with fewer partials.

    >>> wave_splits(4096, 396), wave_splits(4096, 264), wave_splits(100, 264)
    (373, 256, 100)
    """
    if groups <= slots:
        return groups
    rounds = -(-groups // slots)
    return -(-groups // rounds)


def _rotatable_splits(shape: ChainShape, splits: int | None, rows_per_block: int) -> int | None:
    """Column reductions over 16-bit rows that are not whole 16-byte vectors, with
    :data:`ROTATE_COLUMN_KERNELS`: ``splits`` rounded down to where a block's row groups are a
    multiple of :func:`rotation_period` rows apart, so that the block can run all its rows on one
    rotated grid (:func:`rotation_source`); unchanged elsewhere, and where fewer blocks than that
    would be left.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> grad = library.get("rmsnorm").grad(save={"N_rstd"})
    >>> def shape(x): return analyse(prepare(grad, sizes=dict(r=16384, x=x), dtype="bf16"))
    >>> _rotatable_splits(shape(4095), 261, 1)
    256
    >>> _rotatable_splits(shape(4096), 261, 1), _rotatable_splits(shape(4095), 5, 1)
    (261, 5)
    """
    if (not ROTATE_COLUMN_KERNELS or not splits or not shape.cols or shape.xsize % shape.vec == 0
            or shape.xsize < shape.vec or lookup_dtype(shape.dtype).bytes != 2):
        return splits
    step = rotation_period(shape) // math.gcd(rotation_period(shape), rows_per_block)
    return splits - splits % step if splits >= step else splits


def _squeezable(shape: ChainShape, probe: ChainConfig, per_sm) -> bool:
    """Column reductions: whether the family proposes ``probe`` (one block an SM on its own budget)
    on a budget cut for two blocks an SM: a 16-bit row (fp32 ones spilled), the cut within
    :data:`MAX_SQUEEZE` of the footprint, and two blocks fitting (``per_sm``, where given)."""
    if lookup_dtype(shape.dtype).bytes != 2:
        return False
    cap = _squeezed(probe, 2)
    if cap < chain_regs_need(shape, probe) - MAX_SQUEEZE:
        return False
    return per_sm is None or per_sm(probe.threads, cap, chain_smem_bytes(shape, probe)) >= 2


def chain_configs(shape: ChainShape, sms: int = DEFAULT_SMS, per_sm=None,
                  row_smem: int = MAX_ROW_SMEM, clusters: bool = False) -> list[ChainConfig]:
    """Every configuration for this row: register mode where the row fits (the kept vectors
    within :data:`MAX_KEPT_REGS`, at most :data:`MAX_CHUNKS` chunks a thread), else streamed.
    With column reductions only register mode, each with one full wave of blocks (``splits``: ``sms``
    times the blocks an SM holds, ``per_sm(threads, registers, shared bytes)``, or
    :data:`DEFAULT_BLOCKS_PER_SM` without a GPU; at most one block per row group), and only where the
    block's shared memory fits :data:`MAX_COL_SMEM` and the GPU (``per_sm`` holds one). A streamed
    row may keep its re-read inputs in ``row_smem`` bytes of shared memory (:func:`row_smem_budget`),
    and where no block keeps any of them, ``clusters`` (a GPU that has them) adds one cluster
    configuration (:func:`cluster_config`)."""
    out, squeezed = [], []
    most = 0  # the most blocks an SM of a proposed configuration on its own budget
    chunks = -(-shape.xsize // shape.vec)
    fitted = fitted_threads(shape)
    for tpr in sorted((*THREADS_PER_ROW, *fitted)):
        if tpr > THREADS_PER_ROW[0] and chunks * 2 < tpr:
            continue  # at least half of the row's threads must have a chunk
        if not few_threads_fit(tpr, chunks):
            continue
        for rpb in row_blocks(tpr):
            groups = max(1, -(-shape.nrows // rpb))
            splits: list = [(None, None, None, 0)]
            if shape.cols:
                splits = []
                for depth in PREFETCHES:
                    if tpr in fitted and depth > 1:
                        break
                    probe = make_chain_config(shape, tpr, rpb, splits=1, prefetch=depth)
                    if chain_smem_bytes(shape, probe) > MAX_COL_SMEM:
                        break
                    resident = DEFAULT_BLOCKS_PER_SM if per_sm is None else \
                        per_sm(probe.threads, chain_regs_estimate(shape, probe), chain_smem_bytes(shape, probe))
                    if resident >= 1:
                        splits.append((wave_splits(groups, sms * resident), depth, None, resident))
                    if resident == 1 and depth == 1 and _squeezable(shape, probe, per_sm):
                        splits.append((wave_splits(groups, sms * 2), depth, 2, 2))
            for sp, depth, bps, resident in splits:
                sp = _rotatable_splits(shape, sp, rpb)
                cfg = make_chain_config(shape, tpr, rpb, splits=sp, prefetch=depth, blocks_per_sm=bps)
                if cfg.chunks_per_thread > MAX_CHUNKS or cfg.values_per_thread * len(shape.kept) > MAX_KEPT_REGS:
                    continue
                if chain_regs_need(shape, cfg) + _slack(cfg) > min(MAX_REGS, 65536 // cfg.threads):
                    continue
                if bps:
                    squeezed.append(cfg)
                else:
                    out.append(cfg)
                    most = max(most, resident)
    if most < 2:
        # every configuration on its own budget holds one block an SM, too few loads in flight: the
        # row's budget cut for two (where a configuration runs two on its own, the cut measured the same)
        out += squeezed
    if shape.cols and not out:
        return streamed_column_configs(shape, sms, per_sm)  # in their order of preference
    if shape.cols:
        # more than COL_VALUES values a thread only where no configuration of fewer runs as many
        # blocks, or in 16-bit rows a warp holds over at least a wave of blocks (see COL_VALUES)
        few = [c.splits or 0 for c in out if c.values_per_thread <= COL_VALUES]
        warp_rows = lookup_dtype(shape.dtype).bytes == 2
        out = [c for c in out if c.values_per_thread <= COL_VALUES or not any(f >= (c.splits or 0) for f in few)
               or (warp_rows and not c.block_mode and (c.splits or 0) >= sms)]
    # among configurations the model prices alike: the most values a thread up to 32 (each a
    # register a later pass reads), up to 8 chunks (128 bytes in flight) where the passes keep
    # nothing (a chain of one pass reads each value once). H200, logsumexp, L2 flushed
    # (`long_rows_candidates_s34.txt`), 8 chunks a thread against 4: bf16 8192 x 4096 21.2 us
    # against 24.7, 4096 x 8192 21.2 against 25.2, 4096 x 16384 36.6 against 49.6 (16 chunks 42.5),
    # 8192 x 1000 11.2 against 10.2; fp32 4096 x 4096 27.1 against 29.2 at 16 chunks
    most_values = 32 if shape.kept else max(32, 8 * shape.vec)
    out = sorted(out, key=lambda c: (not 8 <= c.values_per_thread <= most_values, -c.values_per_thread, c.threads,
                                     c.splits or 0, c.prefetch))
    if shape.cols or (out and (per_sm is None or max(
            per_sm(c.threads, chain_regs_estimate(shape, c), chain_smem_bytes(shape, c)) for c in out) >= 2)):
        return out
    # a row that no register-mode configuration holds, or holds at one block an SM: that block
    # loads its row, then works on it, then reduces, and nothing overlaps its waits; streamed rows
    # are offered beside it (several blocks an SM, each loading its next chunks while the others
    # work), and the model ranks them. H200, bf16, L2 flushed (`long_rows_candidates_s34.txt`):
    # logsumexp over 4096 x 50257 148.5 us in registers (512 threads, one block an SM), 115.1
    # streamed (256 threads, two chunks a step); log-softmax over 8192 x 32001 352.0 in registers,
    # 284.1 streamed with the row kept in shared memory
    kept = []
    for tpr in STREAM_THREADS:
        for u in STREAM_UNROLLS:
            cfg = make_chain_config(shape, tpr, 1, u)
            if chain_regs_need(shape, cfg) + 8 <= min(MAX_REGS, 65536 // cfg.threads):
                out.append(cfg)
                # the same with the inputs read again kept in shared memory, where one block fits
                if row_cache(shape, cfg, row_smem):
                    k = make_chain_config(shape, tpr, 1, u, row_in_smem=True, smem_budget=row_smem)
                    held = DEFAULT_BLOCKS_PER_SM if per_sm is None else \
                        per_sm(k.threads, chain_regs_estimate(shape, k), chain_smem_bytes(shape, k))
                    if held >= 1:
                        kept.append((held * k.threads * k.unroll, held, k))
    if kept:
        # one kept configuration: the one with the most chunks in flight an SM (blocks x threads x
        # unroll; then the most blocks). The model prices the kept variants alike (their HBM
        # bytes), but after the copy a block's passes wait on shared memory, which more loads in
        # flight hide. H200, 4096 rows, us, 2 / 4 chunks a thread: fp32 cross-entropy over 32001
        # (128 KiB kept, one block an SM) 256 threads 517.7 / 388.5, 512 369.4 / 298.8; bf16 over
        # 32001 (64 KiB) 256 threads 186.6 (three blocks an SM) / 162.3 (two), 512 (one, by
        # registers) 184.7 / 215.3; log-softmax over 65536 bf16 (one block an SM) 256 threads
        # 334.9 / 304.8, 512 290.4 / 286.4, 1024 289.2 / 290.6
        # (benchmarks/results/nvidia-h200/long_rows_candidates_s33.txt)
        out.append(max(kept, key=lambda t: t[:2])[2])
    if clusters and not shape.cols and not any(c.cached for c in out):
        # H200 (`cluster_candidates_s35.jsonl`): where one block keeps one of two re-read inputs,
        # the other read again from L2, a cluster that keeps both is no surer win (the fp32 softmax
        # backward over 8192 x 32001: 825.9 us on one block, 882.6 on the cluster this rule would
        # pick, 775-1083 on the others)
        shared = cluster_config(shape, per_sm, row_smem)
        if shared is not None:
            out.append(shared)
    return out


#: A cluster's configuration keeps at least this many of its blocks and threads on each SM. H200,
#: every cluster configuration timed at ten long rows (`cluster_candidates_s35.jsonl`): those of
#: two or three blocks an SM ran at 69-103 % of the copy rate (log-softmax over 2048 x 128256 bf16
#: 91 %, 4096 x 65536 fp32 94 %), those of one block an SM at 44-102 % (a cluster starts only
#: once all its blocks have SMs, and one block an SM leaves an SM idle until its partners' SMs
#: free up): the softmax over 2048 x 128256 fp32 on clusters of four blocks of 256 threads, one an
#: SM (8 warps), 1128.4 us against 777.0 streamed.
MIN_CLUSTER_BLOCKS_PER_SM = 2
MIN_CLUSTER_SM_THREADS = 512


def cluster_config(shape: ChainShape, per_sm=None, row_smem: int = MAX_ROW_SMEM) -> "ChainConfig | None":
    """One configuration that shares a streamed row over the blocks of a thread-block cluster, so
    that the inputs its later passes read again stay in shared memory where one block cannot keep
    them (a bf16 row of 128256 values is 250 KiB, past a Hopper block's 227; four blocks keep 63
    KiB each, three an SM). Of the configurations that keep every such input (clusters of :data:`CLUSTER_SIZES`
    blocks of :data:`STREAM_THREADS`, at most :data:`MAX_CLUSTER_ROW_THREADS` threads a row, steps
    of :data:`STREAM_UNROLLS` chunks) and keep :data:`MIN_CLUSTER_BLOCKS_PER_SM` blocks and
    :data:`MIN_CLUSTER_SM_THREADS` threads on an SM, one of the smallest cluster: the one with the
    most blocks an SM, then the most chunks in flight an SM (H200: clusters of four blocks of 256
    threads, three an SM, ran 3-7 % faster than of 512 threads, two an SM). Each block
    copies its chunks into its shared memory before the first pass; a pass's reductions meet in
    one round over the cluster (each warp's values stored into every block's scratch, one cluster
    barrier). None where no cluster keeps them all or the row is read once."""
    again = reread_inputs(shape)
    if not again:
        return None
    found = []
    for size in CLUSTER_SIZES:
        for block in STREAM_THREADS:
            if block * size > MAX_CLUSTER_ROW_THREADS:
                continue
            for u in STREAM_UNROLLS:
                try:
                    k = make_chain_config(shape, block * size, 1, u, row_in_smem=True, smem_budget=row_smem,
                                          cluster=size)
                except CodegenError:
                    continue
                if k.cached < len(again) or chain_regs_need(shape, k) + 8 > min(MAX_REGS, 65536 // k.threads):
                    continue
                held = DEFAULT_BLOCKS_PER_SM if per_sm is None else \
                    per_sm(k.threads, chain_regs_estimate(shape, k), chain_smem_bytes(shape, k))
                if held >= MIN_CLUSTER_BLOCKS_PER_SM and held * k.threads >= MIN_CLUSTER_SM_THREADS:
                    found.append((-size, held, held * k.threads * k.unroll, k))
    return max(found, key=lambda t: t[:3])[3] if found else None


def streamed_column_configs(shape: ChainShape, sms: int = DEFAULT_SMS, per_sm=None) -> list[ChainConfig]:
    """Column reductions over a row that no register-mode configuration holds (rows of more than
    8192 16-bit values: the norm backwards at a model width of 12288 or 16384): one row a block,
    each pass streaming the row through ``unroll`` chunks a thread at a time, the column partials
    in shared memory (the row's length in fp32 words a column reduction), one wave of blocks.
    The first pass reads the row from HBM; the later ones find it in L2 (a wave's rows are a few
    MiB), so HBM still moves every input once. Before, such a row ran two kernels, the column
    reductions reading the row's inputs from HBM again.

    Proposed, in this order (the planner keeps it where the model ties them):
    :data:`COLUMN_STREAM_THREADS` a row, steps of :data:`COLUMN_STREAM_UNROLLS` chunks (those that
    hold a thread's chunks exactly where one does), each on its own register budget and, for
    16-bit rows held one block an SM by it, on one cut for two where the cut
    still holds a step's loads in flight (:func:`_holds_a_step`).
    The model weighs them by their latency chain: a row iteration waits for a round trip a step,
    to HBM in the first pass and to L2 in the others (``row_round_trips``, ``row_l2_rounds``),
    which a second block an SM hides. Rows that are not whole 16-byte vectors are not proposed
    (the streamed grid is not rotated).

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> grad = library.get("rmsnorm").grad(save={"N_rstd"})
    >>> s = analyse(prepare(grad, sizes=dict(r=8192, x=16384), dtype="bf16"))
    >>> h200 = _per_sm(_gpu_of("h200"))  # 512 threads hold one block an SM on their own budget
    >>> [(c.threads_per_row, c.unroll, c.blocks_per_sm) for c in streamed_column_configs(s, 132, h200)]
    [(512, 4, None), (512, 2, 2), (512, 2, None), (256, 4, None), (256, 2, None)]
    """
    if shape.xsize % shape.vec:
        # not whole 16-byte vectors: a streamed grid is not rotated (rotation_source), and 7 rows in 8
        # load value by value: the rmsnorm backward over 8192 x 10001 bf16 ran 471.4 us against 400.0
        # for the row kernel and the column kernel apart (H200), which the planner keeps
        return []
    out = []  # (configuration, blocks an SM), in order of preference: ties of the model go first
    for tpr in COLUMN_STREAM_THREADS:
        for unroll in COLUMN_STREAM_UNROLLS:
            try:
                probe = make_chain_config(shape, tpr, 1, unroll, splits=1)
            except CodegenError:
                continue
            if probe.chunks_per_thread > column_chunks(shape, probe) and any(
                    -(-column_chunks(shape, probe) // u) * u == column_chunks(shape, probe)
                    for u in COLUMN_STREAM_UNROLLS):
                continue  # chunks past the row where steps of another size hold it exactly
            smem = chain_smem_bytes(shape, probe)
            budget = min(MAX_REGS, 65536 // probe.threads)
            if smem > MAX_COL_SMEM or chain_regs_need(shape, probe) + _slack(probe) > budget:
                continue
            resident = DEFAULT_BLOCKS_PER_SM if per_sm is None else \
                per_sm(probe.threads, chain_regs_estimate(shape, probe), smem)
            if resident < 1:
                continue
            if resident == 1 and _squeezable(shape, probe, per_sm) and _holds_a_step(shape, probe, 2):
                splits = _rotatable_splits(shape, wave_splits(shape.nrows, sms * 2), 1)
                out.append((make_chain_config(shape, tpr, 1, unroll, splits=splits, blocks_per_sm=2), 2))
            splits = _rotatable_splits(shape, wave_splits(shape.nrows, sms * resident), 1)
            out.append((make_chain_config(shape, tpr, 1, unroll, splits=splits), resident))
    return [c for c, _ in out]


def chain_config_from_schedule(shape: ChainShape, schedule: Schedule) -> ChainConfig:
    """The configuration a schedule's kernel names (threads per row, warps, ``stages`` for a
    streamed row, ``splits`` with column reductions), or the family's preferred one where it names
    none."""
    opts = schedule.kernels[0].options if len(schedule.kernels) == 1 else None
    if opts is not None and opts.threads_per_row is not None:
        tpr = opts.threads_per_row
        rows = max(1, (opts.warps or 1) * 32 // tpr) if tpr <= 32 else 1
        splits = opts.splits
        if shape.cols:  # stages: the row groups loaded ahead
            if opts.row_in_smem or opts.cluster:
                raise CodegenError("rowwise: row_in_smem and cluster keep a streamed row without column "
                                   "reductions; this chain has column reductions")
            if splits is None:  # a schedule that names no block count: one wave's worth
                splits = min(max(1, -(-shape.nrows // rows)), DEFAULT_SMS * DEFAULT_BLOCKS_PER_SM)
            if opts.streamed:  # stages: the chunks a thread has in flight
                return make_chain_config(shape, tpr, rows, opts.stages or STREAM_UNROLLS[0], splits,
                                         None, opts.blocks_per_sm)
            return make_chain_config(shape, tpr, rows, None, splits, opts.stages, opts.blocks_per_sm)
        # stages: the chunks a streamed row has in flight (streamed alone: the first of them)
        stages = opts.stages or (STREAM_UNROLLS[0] if opts.streamed else None)
        return make_chain_config(shape, tpr, rows, stages, splits, blocks_per_sm=opts.blocks_per_sm,
                                 row_in_smem=bool(opts.row_in_smem), smem_budget=row_smem_budget(schedule.gpu),
                                 cluster=opts.cluster or 1)
    options = chain_configs(shape)
    if not options:
        raise CodegenError(f"rowwise: no configuration runs a row of {shape.xsize} {shape.dtype} values")
    return options[0]


def chain_schedule_for(shape: ChainShape, cfg: ChainConfig, gpu: str | None) -> Schedule:
    """Rows grouped per block (and per warp in warp mode), the row whole; every array in registers.
    With column reductions the rows are streamed instead (a block steps through groups of
    ``rows_per_block`` rows, its column partials in registers; the model's one streamed axis is the
    innermost row axis): the model then counts the column outputs once, and the launch estimate
    says the blocks, their row iterations and the partials."""
    if shape.cols:
        # the model streams one axis per kernel: the innermost row axis stands for the loop over rows
        a = shape.row_axes[-1]
        rel = [Relabel(a, min(cfg.rows_per_block, shape.sizes[a]), "SMEM", "stream")]
    else:
        rel = [Relabel(a, g, "SMEM", "group") for a, g in _spread(shape, cfg.rows_per_block)]
    if not cfg.block_mode and shape.row_axes and not shape.cols:
        rel += [Relabel(a, g, "RF", "group") for a, g in _spread(shape, 32 // cfg.threads_per_row)]
    d = shape.source or shape.diagram
    boxes = tuple(d.name_of(v) for v in d.nodes)
    kernel = Kernel(NAME, boxes, tuple(rel), in_registers(d), family=NAME, options=cfg.options(shape))
    return Schedule(d, (kernel,), gpu, shape.dtype)


def chain_launch_estimate(shape: ChainShape, cfg: ChainConfig) -> dict:
    """Blocks, threads, registers, shared memory and bytes in flight of a chain kernel, the
    dependent cross-thread reductions of its passes, and a streamed row's re-reads (each pass
    after an input's first reads it again; counted at the HBM rate, ``extra_hbm_bytes``; none for
    the inputs it keeps in shared memory, :func:`row_cache`, whose bytes limit its blocks an SM). With
    column reductions: ``splits`` blocks, each running its row groups one after another
    (``row_iterations``; no streamed loop of the model's) with ``prefetch`` groups' loads in flight,
    the fp32 partials written and read back by the blocks still there when the last arrives
    (``extra_hbm_bytes``; no second launch), in :func:`combine_rounds` dependent rounds of L2
    loads after the arrival's (``tail_l2_rounds``: once, after every block's loop)."""
    blocks = cfg.blocks(shape)
    b = lookup_dtype(shape.dtype).bytes
    first = [sum(1 for v in shape.fresh if shape.uses(v)[:1] == (p,)) for p in range(shape.passes)]
    # with column reductions the loads of ``prefetch`` row groups are in flight at once
    in_flight = cfg.unroll * 16 * max(1, max(first)) * (cfg.prefetch if cfg.splits else 1)
    if cfg.cached:  # the kept inputs' whole row is copied at once
        in_flight = max(in_flight, 16 * cfg.chunks_per_thread * cfg.cached)
    busy = (-(-shape.xsize // cfg.vec)) / (cfg.chunks_per_thread * cfg.threads_per_row)
    if cfg.splits:  # the last row iteration of some blocks has no rows
        busy *= shape.nrows / (cfg.splits * cfg.iterations(shape) * cfg.rows_per_block)
    # a cluster's round waits for the blocks' stores into each other's shared memory and the
    # cluster's barrier: priced as two rounds
    red_passes = len({shape.pass_of(c) for c in shape.chains}) * (2 if cfg.cluster > 1 else 1)
    est = dict(blocks=blocks, threads=cfg.threads, regs=chain_regs_estimate(shape, cfg),
               smem=chain_smem_bytes(shape, cfg), in_flight_bytes_per_thread=in_flight,
               idle_lanes=min(0.95, max(0.0, 1.0 - busy)), bytes_per_value=b, threads_per_row=cfg.threads_per_row,
               reductions=red_passes)
    if cfg.splits:
        est.update(row_iterations=cfg.iterations(shape), stream_steps=0,
                   extra_hbm_bytes=2 * partial_bytes(shape, cfg), tail_l2_rounds=1 + combine_rounds(cfg))
    if cfg.stream:
        # the inputs kept in shared memory (row_cache) come from HBM once
        kept = {id(v) for v in kept_inputs(shape, cfg)}
        again = sum(len(shape.uses(v)) - 1 for v in shape.fresh if id(v) not in kept)
        if again and cfg.splits:
            # a wave of blocks, one row each (a few MiB): the later passes find the row in L2; a row
            # iteration waits for a round trip a step (the next step's loads go out after this
            # one's values are used): to HBM in the first pass, to L2 in the others
            est["extra_l2_bytes"] = again * shape.nrows * shape.xsize * b
            steps = -(-column_chunks(shape, cfg) // cfg.unroll)
            est.update(row_round_trips=steps, row_l2_rounds=steps * (shape.passes - 1))
        elif again:
            est["extra_hbm_bytes"] = again * shape.nrows * shape.xsize * b
    return est


def prefetched(shape: ChainShape, cfg: ChainConfig) -> tuple[Value, ...]:
    """The inputs a chain kernel with column reductions loads one row group ahead: those laid out
    row after row (every row axis then the row, or one value per row), read in the first pass (in
    register mode every pass reads the vectors the first one loaded)."""
    if not shape.cols or cfg.stream or not shape.row_axes:
        return ()
    K, red = shape.row_axes, shape.red
    first = {id(v) for v in _loaded(shape, 0, cfg)[0]}
    out = []
    for v in shape.diagram.inputs:
        if shape.access.get(id(v)) == "row" and v.axis_names == (*K, *red) and id(v) in first:
            out.append(v)
        elif shape.access.get(id(v)) == "scalar" and v.axis_names == K:
            out.append(v)
    return tuple(out)


def partial_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """Bytes of the fp32 column partials: one row of the row's length per block and column reduction."""
    return 4 * len(shape.cols) * (cfg.splits or 0) * shape.xsize


def col_smem_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """Shared memory of the column partials: one fp32 row (the row's chunks, the last chunk of
    each thread packed: only the lanes that have one get words; a streamed row's lanes each have
    words for all their :func:`column_chunks`) per column reduction and row of the block; each
    thread adds into its own words only."""
    if cfg.stream:
        return 4 * len(shape.cols) * column_chunks(shape, cfg) * cfg.vec * cfg.threads_per_row
    return 4 * len(shape.cols) * cfg.rows_per_block * (-(-shape.xsize // cfg.vec)) * cfg.vec


def combine_slices(cfg: ChainConfig) -> int:
    """Threads adding one column of a tile of the in-kernel combine (they fix its order): a tile
    of :data:`COMBINE_COLS` columns, or where that takes more than :data:`MAX_COMBINE_ROUNDS`
    rounds of :data:`COMBINE_DEPTH` loads a thread, the fewest slices dividing the block's
    threads that take at most that many, else those of a :data:`MIN_COMBINE_COLS`-column tile.

    >>> import dataclasses
    >>> c = ChainConfig(64, 1, 8, 2, 2, False, 1024, 1)
    >>> combine_slices(c), combine_rounds(c), combine_slices(dataclasses.replace(c, splits=48))
    (8, 8, 4)
    >>> w = dataclasses.replace(c, threads_per_row=256, splits=264)
    >>> combine_slices(w), combine_rounds(w)
    (16, 2)
    """
    t = cfg.threads
    fits = [s for s in range(1, t + 1) if t % s == 0 and MIN_COMBINE_COLS <= t // s <= COMBINE_COLS]
    if not fits:  # a block of fewer than MIN_COMBINE_COLS threads: one slice
        return max(1, t // COMBINE_COLS)
    need = -(-(cfg.splits or 1) // (COMBINE_DEPTH * MAX_COMBINE_ROUNDS))
    return next((s for s in fits if s >= need), fits[-1])


def combine_depth(cfg: ChainConfig) -> int:
    """Partials one thread of the combine loads before adding them: all of its share of the
    ``splits`` blocks at once, up to :data:`COMBINE_DEPTH`."""
    return max(1, min(COMBINE_DEPTH, -(-(cfg.splits or 1) // combine_slices(cfg))))


def combine_rounds(cfg: ChainConfig) -> int:
    """Rounds of :func:`combine_depth` loads one thread of the combine adds a tile in."""
    return max(1, -(-(cfg.splits or 1) // (combine_slices(cfg) * combine_depth(cfg))))


def combine_smem_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """Shared memory of the in-kernel combine of column partials: the slices' sums of a tile
    (slices x (columns + 1) floats) and four words (the block's role, its share of the tiles,
    the helpers)."""
    if not shape.cols:
        return 0
    slices = combine_slices(cfg)
    return 4 * slices * (cfg.threads // slices + 1) + 16


def block_reductions(shape: ChainShape) -> int:
    """The most row reductions one pass of the chain reduces (in one round over a block: each
    warp's sums, one barrier, the warps' sums; the rmsnorm backward with its statistic saved has
    one, the layernorm backward's first pass two: Σ dN·N and Σ dN)."""
    per = [sum(1 for c in shape.chains if shape.pass_of(c) == p) for p in range(shape.passes)]
    return max([1, *per])


def colpart_dynamic(shape: ChainShape, cfg: ChainConfig) -> bool:
    """Whether the column partials live in dynamic shared memory: the block's shared memory would
    pass :data:`MAX_STATIC_SMEM` declared statically.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> grad = library.get("layernorm").grad(save={"N_rstd", "N_mean"})
    >>> def wide(x): return analyse(prepare(grad, sizes=dict(r=64, x=x), dtype="bf16"))
    >>> [colpart_dynamic(wide(x), make_chain_config(wide(x), 512, 1, splits=64)) for x in (4096, 8192)]
    [False, True]
    """
    return bool(shape.cols) and chain_smem_bytes(shape, cfg) > MAX_STATIC_SMEM


def colpart_in_registers(shape: ChainShape, cfg: ChainConfig) -> bool:
    """Whether each thread adds its column partials in registers over the block's rows (one fp32
    register a value of its columns and column reduction) and writes them to shared memory once,
    after the loop, instead of a read, add and write of shared memory for every row: for 16-bit
    rows whose column reductions are sums, at most :data:`COL_VALUES` values a thread, where the
    footprint with those registers stays within :data:`SPILL_FREE_SQUEEZE` of the kernel's
    register budget (the budget, and so the blocks an SM, is the same either way). The norm
    backwards issue ~24 instructions a value with too few warps to hide their latency (ncu, H200,
    rmsnorm 8192 x 1024 and 8192 x 2048: 0.35-0.52 instructions a clock a scheduler, the kernel's
    elapsed clocks); three of them were the shared-memory update. Same budget, same bits, H200,
    bf16 (``norm_backward_colpart_regs_s31.jsonl``, us): layernorm 4096 x 4096 40.3 -> 38.0,
    16384 x 4096 121.7 -> 114.6, 8192 x 2048 37.6 -> 36.6; rmsnorm 8192 x 8192 116.7 -> 112.1,
    8192 x 4096 59.5 -> 58.5. Beyond the bound ptxas spilled: the layernorm backward's warp rows
    over 1024 values (64 partials a thread over a budget of 200) ran 26.1 -> 33.0; within it the
    warp rows' 24-32 values a thread gained next to nothing (rmsnorm 8192 x 1024 22.7 -> 22.6 us,
    8192 x 768 19.4 -> 19.3) and left ptxas no room for more (the rmsnorm backward's over 768
    spilled 88 bytes on sm_90a with γ's 24 values a thread also held as floats), so rows of more
    than COL_VALUES values a thread keep shared memory. Within the bound ptxas (sm_90a) still
    spilled an fp32 row of 4096 on 256 threads (84 bytes, 15 registers over the budget by the
    formula) and a user's chain with a column max beside its sum (124 bytes, 26 over): neither is
    proposed registers.

    >>> from napkin.diagrams import library
    >>> from napkin.codegen.prepare import prepare
    >>> def cfg(name, x, tpr, rpb, splits):
    ...     save = {"rmsnorm": {"N_rstd"}, "layernorm": {"N_rstd", "N_mean"}}[name]
    ...     s = analyse(prepare(library.get(name).grad(save=save), sizes=dict(r=8192, x=x), dtype="bf16"))
    ...     return colpart_in_registers(s, make_chain_config(s, tpr, rpb, splits=splits))
    >>> cfg("layernorm", 2048, 128, 1, 512), cfg("layernorm", 1024, 32, 4, 256)
    (True, False)
    """
    if not shape.cols or cfg.stream or lookup_dtype(shape.dtype).bytes != 2:
        return False
    if any(c.how != "sum" for c in shape.cols):
        return False
    if cfg.values_per_thread > COL_VALUES:
        return False
    need = chain_regs_need(shape, cfg) + len(shape.cols) * cfg.values_per_thread
    return need - chain_regs_estimate(shape, cfg) <= SPILL_FREE_SQUEEZE


def chain_scratch_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """The block reductions' scratch (one row per block: two halves, rounds alternate, of 32 floats
    a reduction of the busiest pass, or one a warp of a cluster's row of more than 32 warps)."""
    return 2 * scratch_words(cfg) * 4 * block_reductions(shape) if cfg.block_mode else 0


def scratch_words(cfg: ChainConfig) -> int:
    """Words of one reduction's half of the block reductions' scratch: 32, or the warps of a row
    that has more (a cluster's)."""
    return max(32, cfg.threads_per_row // 32)


def row_cache_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """Dynamic shared memory of a streamed row's kept inputs (:func:`row_cache`), a block."""
    return 16 * cache_chunks(shape, cfg) * cfg.cached


def chain_smem_bytes(shape: ChainShape, cfg: ChainConfig) -> int:
    """Shared memory of the chain kernel: the block reductions' scratch, the column partials'
    row (several rows per block) and their combine's tile, or a streamed row's kept inputs."""
    return (chain_scratch_bytes(shape, cfg) + col_smem_bytes(shape, cfg) + combine_smem_bytes(shape, cfg)
            + row_cache_bytes(shape, cfg))


def _strides_of(v: Value, sizes: dict) -> dict[str, int]:
    out, s = {}, 1
    for a in reversed(v.axis_names):
        out[a] = s
        s *= sizes[a]
    return out


def lower_chain(shape: ChainShape, cfg: ChainConfig, schedule: Schedule, arch: str, kernel_name: Code) -> KernelLaunch:
    """The chain kernel's launch (see the section's comment for how it runs)."""
    if cfg.cluster > 1 and not has_clusters(arch):
        raise CodegenError(f"rowwise: a row shared by a cluster of {cfg.cluster} blocks needs sm_90 or later, "
                           f"not {arch}: plan for this GPU")
    d = shape.diagram
    name = shape.name
    sizes = shape.sizes
    T = cuda_type(shape.dtype)
    red, K = shape.red, shape.row_axes
    used_inputs = [v for v in d.inputs if any(any(a is v for a in b.args) for b in d.nodes)]
    outputs = [*shape.full_out, *shape.row_out]
    inner = {}
    acc = 1
    for a in reversed(red):
        inner[a] = acc
        acc *= sizes[a]

    def col_index(a: str, col: str = "col") -> Code:
        """The index along row axis ``a`` of the element at column ``col`` (red's order)."""
        if len(red) == 1:
            return Code(col)
        q = Code(f"{col} / {c_int(inner[a])}") if inner[a] > 1 else Code(col)
        return q if a == red[0] else Code(f"({q}) % {c_int(sizes[a])}")

    # per-row offsets of every array (64-bit), from the row's index along the axes of K it holds
    need_idx: set[str] = set()
    offsets = []
    for v in [*used_inputs, *(v for _, v in outputs)]:
        st = _strides_of(v, sizes)
        if v.axis_names == (*K, *red) or (v.axis_names == K and not shape.is_full(v)):
            n = shape.xsize if shape.is_full(v) else 1
            expr = Code(f"row * {c_i64(n)}") if K else Code("0LL")
        else:
            parts = []
            for a in v.axis_names:
                if a in K:
                    need_idx.add(a)
                    parts.append(Code(f"{ident(a, 'i_')} * {c_i64(st[a])}"))
            expr = Code(" + ".join(parts) if parts else "0LL")
        offsets.append((ident(name(v), "off_"), expr))
    for b in d.nodes:
        if isinstance(b.op, Map):
            need_idx.update(a for a in b.op.index_axes if a in K)
    row_index = []
    if need_idx:
        rem = Code("row")
        for i, a in enumerate(reversed(K)):
            if i == len(K) - 1:
                row_index.append((ident(a, "i_"), rem))
            else:
                row_index.append((ident(a, "i_"), Code(f"{rem} % {c_i64(sizes[a])}")))
                nxt = ident(a, "q_")
                row_index.append((nxt, Code(f"{rem} / {c_i64(sizes[a])}")))
                rem = nxt

    def var(v: Value) -> Code:
        if v.is_input and not shape.is_full(v):
            return ident(name(v), "r_")
        return ident(name(v), "a_")

    # 16-bit values divided by a per-row value (a softmax's sum, a norm): the divisor's reciprocal
    # once a pass (hm_recip), one product a value (hm_div_by: hm_div's bits, one special-function op
    # a row instead of one a value); divisors[p]: pass p's, declared before its loop over chunks
    divisors: dict[int, dict[int, Value]] = {}

    def map_stmt(b: Value, p: int | None = None) -> Code:
        op = b.op
        get_function(op.fn)  # refuses functions outside the whitelist
        if (p is not None and op.fn == "div" and half_math(shape.dtype) and shape.is_full(b)
                and not shape.is_full(b.args[1])):
            divisors.setdefault(p, {})[id(b.args[1])] = b.args[1]
            return Code(f"const float {ident(name(b), 'a_')} = napkin::hm_div_by({var(b.args[0])}, "
                        f"{ident(name(b.args[1]), f'rcp{p}_')});")
        idx = [ident(a, "i_") for a in op.index_axes]
        ns = [sizes[a] for a in op.index_axes]
        expr = map_expr(op.fn, [var(a) for a in b.args], op.param_values(sizes), idx, ns,
                        half=half_math(shape.dtype))
        return Code(f"const float {ident(name(b), 'a_')} = {expr};")

    # a streamed row keeps its grid: its loop over chunks is not unrolled, so no chunk's checks fold
    # away (nvcc spilled 100-400 bytes on the rotated grid of a streamed log-softmax over 70001)
    rot = rotation_source(shape, cfg)
    # with column reductions the rotated grid is one of two paths (RT): taken where every array laid
    # out row after row starts at the same place in its 16-byte lines as the rotation's own, so that
    # each loads and stores its whole chunks unchecked; elsewhere the unrotated grid. Checked loads
    # of the other arrays on the rotated grid spilled 40-270 bytes (ptxas, sm_80 and sm_90a)
    two_paths = rot is not None and bool(shape.cols)
    # 16-bit rows of whole 16-byte vectors whose every array read or written by vectors starts on a
    # 16-byte boundary (checked once, at run time): the row loop's vector accesses take no alignment
    # check (and, every chunk inside the row, no bound check but the row's): two paths, AL true and
    # false. H200, 8192 rows unless said (norm_backward_aligned_s32.jsonl): the bf16 norm backwards
    # 2-18 % faster (rmsnorm over 1024 22.9 -> 20.2 us, 8192 112.9 -> 107.1; layernorm over 1024
    # 26.6 -> 21.9, 5120 90.4 -> 74.2), logsumexp over 4096 26.7 -> 22.6, log-softmax 36.5 -> 35.1,
    # l2 normalisation 33.3 -> 33.4. fp32 rows gained 0.3-1.1 % and ptxas spilled 16 bytes on 4096
    # (sm_90a), and a streamed row whose last chunks only some threads hold lost (rmsnorm backward
    # over 10240, 201.5 -> 228.7; spills grew): they keep one path
    vector_arrays = [v for v in used_inputs if shape.access[id(v)] == "row"] + [v for _, v in shape.full_out]
    aligned_path = rot is None and shape.xsize % shape.vec == 0 and bool(vector_arrays) and \
        lookup_dtype(shape.dtype).bytes == 2 and (not cfg.stream or _even(shape, cfg)) and all(
        st % shape.vec == 0 for v in vector_arrays for a, st in _strides_of(v, sizes).items() if a in K)
    # a streamed row that is not whole vectors: the grid shifted to the 16-byte lines (shift_source)
    shift = shift_source(shape) if cfg.stream else None
    LV = Code("load_vec_al<AL, EVEN>" if aligned_path else "load_vec_sh" if shift is not None else "load_vec")
    SV = Code("store_vec_al<AL, EVEN>" if aligned_path else "store_vec_sh" if shift is not None else "store_vec")
    # a streamed row's inputs kept in shared memory: copied there before the first pass, every pass
    # reads them back (row_cache)
    in_smem = kept_inputs(shape, cfg)
    cache_ids = {id(v): i for i, v in enumerate(in_smem)}
    al_check = Code(" && ".join(f"napkin::is_aligned({ident(name(v), 'in_' if v.is_input else 'out_')}, 16)"
                                for v in vector_arrays)) if aligned_path else None
    # with column reductions a block loops over row groups: the first pass's loads of the arrays laid
    # out row after row (and the per-row scalars) for the group ``prefetch`` groups ahead are issued
    # while this group is worked on (into registers), so a block keeps that many groups' loads in
    # flight; the vectors of the row's axes only (gamma) are loaded once, before the loop
    pf = prefetched(shape, cfg)
    pf_ids = {id(v) for v in pf}
    row_scalars = [(ident(name(v), "r_"), ident(name(v), "in_"), ident(name(v), "off_"))
                   for v in used_inputs if shape.access[id(v)] == "scalar" and id(v) not in pf_ids]
    pf_scalars = [(ident(name(v), "r_"), ident(name(v), "pf_"), ident(name(v), "in_"))
                  for v in used_inputs if shape.access[id(v)] == "scalar" and id(v) in pf_ids]
    pf_vectors = [(ident(name(v), "pf_"), ident(name(v), "in_")) for v in pf if shape.access[id(v)] == "row"]
    held = resident(shape, cfg)
    held_ids = {id(v) for v in held}
    held_vectors = [(ident(name(v), "hv_"), ident(name(v), "in_")) for v in held]
    link_ids = {id(v) for c in (*shape.chains, *shape.cols) for v in c.links}
    # column reductions: per-thread partials of the thread's columns (chunk c0 + u, element e)
    ws = ident(_ws_name(shape), "ws_")
    cnt = ident(_ws_name(shape, "colcount"), "cnt_")
    cols = []
    in_regs = colpart_in_registers(shape, cfg)
    for k, c in enumerate(shape.cols):
        fmt, ident0, _ = _CHAIN_OPS[c.how]
        acc = Code(f"rc_{k}[c0 + u][e]" if in_regs else f"colpart[{k}][slot][col_word(c0 + u, e)]")
        cols.append(dict(
            index=k, acc=acc, identity=Code(ident0), what=comment(f"{c.how} of {name(c.source)} over the rows: "
                                                                  f"{name(c.result)}"),
            step=Code(fmt.format(a=acc, b=ident(name(c.source), "a_"))),
            init=Code(f"colpart[{k}][slot][col_word(c, e)]"), reg=Code(f"rc_{k}"),
            merge=Code(fmt.format(a="a", b=f"colpart[{k}][s][w]")),
            offset=c_i64(k * (cfg.splits or 0) * shape.xsize),
            out=ident(shape.col_out[k][0], "out_"), scale=float(c.scale),
            merge_v=Code(fmt.format(a="a", b="v[j]")), merge_t=Code(fmt.format(a="t", b="cmb[s][cx]"))))
    scalar_maps: dict[int, list[Code]] = {}
    for b in d.nodes:
        if id(b) in link_ids or shape.is_full(b):
            continue
        scalar_maps.setdefault(shape.stage[id(b)], []).append(map_stmt(b))

    paired = {id(c.pair): c for c in shape.chains if c.pair is not None}  # max chain -> its paired sum
    kept_ids = {id(v) for v in shape.kept} if not cfg.stream else set()
    kept_decl = [Code(f"napkin::Vec16<T> {ident(name(v), 'kv_')}[UNROLL];") for v in shape.kept if id(v) in kept_ids]
    passes = []
    for p in range(shape.passes):
        need = shape.need(p)
        vecs, gathers = _loaded(shape, p, cfg)
        decl, loads, chunk, elem = [], [], [], []
        cached_loads = 0  # loads of this pass from the kept inputs in shared memory (the others from global)
        index_axes = sorted({a for b in need if not b.is_input for a in b.op.index_axes if a in red},
                            key=red.index)
        # on a shifted grid a chunk's columns do not start at a multiple of VEC
        per_chunk = [v for v in gathers if shape.chunk_constant(v)] if shift is None else []
        gather_axes = sorted({a for v in gathers for a in v.axis_names if a in red and v not in per_chunk},
                             key=red.index)
        for a in sorted({a for v in per_chunk for a in v.axis_names if a in red}, key=red.index):
            chunk.append(Code(f"const long long {ident(a, 'j_')} = {col_index(a, 'col0')};"))
        for a in dict.fromkeys([*index_axes, *gather_axes]):
            elem.append(Code(f"const long long {ident(a, 'i_')} = {col_index(a)};"))
        for v in need:
            nm = name(v)
            if not v.is_input:
                elem.append(map_stmt(v, p))
                continue
            if shape.access[id(v)] == "gather":
                # scalar loads (L1/L2: a broadcast input); once per chunk where the value is the
                # same over its VEC columns
                st = _strides_of(v, sizes)
                pre, where, into = ("j_", "col0", chunk) if v in per_chunk else ("i_", "col", elem)
                terms = " + ".join(f"{ident(a, pre)} * {c_i64(st[a])}" for a in v.axis_names if a in red)
                into.append(Code(f"const float {ident(nm, 'a_')} = ((unsigned){where} < (unsigned)limit) ? "
                                 f"napkin::to_float({ident(nm, 'in_')}[{ident(nm, 'off_')} + {terms}]) : 0.f;"))
                continue
            if id(v) in held_ids:  # loaded once, before the loop over the row groups
                elem.append(Code(f"const float {ident(nm, 'a_')} = napkin::to_float({ident(nm, 'hv_')}[u].x[e]);"))
                continue
            buf = ident(nm, "kv_") if id(v) in kept_ids else ident(nm, "ld_")
            if id(v) not in kept_ids:
                decl.append(Code(f"napkin::Vec16<T> {buf}[UNROLL];"))
            if id(v) in cache_ids:
                # read back the chunk this thread copied before the first pass
                loads.append(Code(f"napkin::load_cached({buf}[u], row_cache + {cache_ids[id(v)]} * RCH, kc, RCH);"))
                cached_loads += 1
                elem.append(Code(f"const float {ident(nm, 'a_')} = napkin::to_float({buf}[u].x[e]);"))
                continue
            if any(v is w for w in vecs) and id(v) in pf_ids and two_paths:
                # this group's vectors came in with the last one; the next group's go out now (on
                # the rotated path with the same rotation: SPLITS · ROWS_PER_BLOCK rows on)
                loads.append(Code(f"{buf}[u] = {ident(nm, 'pf_')}[d][u];"))
                loads.append(Code(
                    f"if constexpr (RT) napkin::load_vec_rot_own({ident(nm, 'pf_')}[d][u], {ident(nm, 'in_')} + "
                    f"next_row * {c_i64(shape.xsize)}, col0, rot, next_limit, napkin::zero<T>(), c0 + u < BODY_CHUNKS); "
                    f"else napkin::load_vec({ident(nm, 'pf_')}[d][u], {ident(nm, 'in_')} + next_row * "
                    f"{c_i64(shape.xsize)}, col0, next_limit, napkin::zero<T>());"))
            elif any(v is w for w in vecs) and id(v) in pf_ids:
                # this group's vectors came in with the last one; the next group's go out now
                loads.append(Code(f"{buf}[u] = {ident(nm, 'pf_')}[d][u];"))
                loads.append(Code(f"napkin::{LV}({ident(nm, 'pf_')}[d][u], {ident(nm, 'in_')} + next_row * "
                                  f"{c_i64(shape.xsize)}, col0, next_limit, napkin::zero<T>());"))
            elif any(v is w for w in vecs) and two_paths:
                loads.append(Code(
                    f"if constexpr (RT) napkin::load_vec_rot_own({buf}[u], {ident(nm, 'in_')} + {ident(nm, 'off_')}, "
                    "col0, rot, limit, napkin::zero<T>(), c0 + u < BODY_CHUNKS); "
                    f"else napkin::load_vec({buf}[u], {ident(nm, 'in_')} + {ident(nm, 'off_')}, col0, limit, "
                    "napkin::zero<T>());"))
            elif any(v is w for w in vecs) and rot is not None:
                loads.append(Code(f"napkin::{rotated_load(v, rot)}({buf}[u], {ident(nm, 'in_')} + {ident(nm, 'off_')}, "
                                  "col0, rot, limit, napkin::zero<T>(), c0 + u < BODY_CHUNKS);"))
            elif any(v is w for w in vecs):
                loads.append(Code(f"napkin::{LV}({buf}[u], {ident(nm, 'in_')} + {ident(nm, 'off_')}, col0, "
                                  "limit, napkin::zero<T>());"))
            elem.append(Code(f"const float {ident(nm, 'a_')} = napkin::to_float({buf}[u].x[e]);"))
        accs = []
        slot = 0  # the block reduction's scratch words of each reduction (a pair takes two)
        for c in shape.chains:
            if shape.pass_of(c) != p or c.pair is not None:  # a paired sum: with its max
                continue
            fmt, ident0, op = _CHAIN_OPS[c.how]
            rn = name(c.result)
            acc = dict(
                acc=ident(rn, "acc_"), part=ident(rn, "p_"), identity=Code(ident0),
                step=Code(fmt.format(a=ident(rn, "p_"), b=ident(name(c.source), "a_"))),
                value=ident(name(c.source), "a_"),
                merge=Code(fmt.format(a=ident(rn, "acc_"), b=ident(rn, "p_"))),
                # a part of a warp: shuffles; a block: the template reduces the pass's sums in one round
                reduce=Code(f"napkin::xor_reduce<{op}, THREADS_PER_ROW>({ident(rn, 'acc_')})"), op=Code(op),
                result=ident(rn, "a_"), scale=float(c.scale), slot=slot, pair=None)
            slot += 1
            ps = paired.get(id(c))
            if ps is not None:
                # the max and the sum of exp(x − max) in one: each chunk's VEC values folded into the
                # running pair (one rescale a chunk), the pairs merged across threads
                sn = name(ps.result)
                acc["pair"] = dict(acc=ident(sn, "acc_"), vals=ident(rn, "pv_"), result=ident(sn, "a_"),
                                   scale=float(ps.scale), slot=slot, exact=Code("true" if ps.exact else "false"),
                                   fast=Code("true" if half_math(shape.dtype) else "false"))
                slot += 1
            accs.append(acc)
        stores = [(ident(n, "st_"), ident(n, "out_"), ident(n, "off_"), ident(name(v), "a_"))
                  for n, v in shape.full_out if shape.stage[id(v)] == p]
        pcols = [dict(acc=c["acc"], step=c["step"]) for c, ch in zip(cols, shape.cols)
                 if shape.pass_of(ch) == p]
        pre = [Code(f"const napkin::HmRecip {ident(name(v), f'rcp{p}_')} = napkin::hm_recip({var(v)});")
               for v in divisors.get(p, {}).values()]
        passes.append(dict(index=p, decl=decl, loads=loads, chunk=chunk, elem=elem, accs=accs, stores=stores,
                           pre=pre, cached_loads=cached_loads > 0,
                           global_loads=not cached_loads or len(loads) > cached_loads,
                           cols=pcols, after=scalar_maps.get(p + 1, []),
                           what=comment(_pass_text(shape, p))))
    row_stores = [(ident(n, "out_"), ident(n, "off_"), var(v)) for n, v in shape.row_out]
    params = [Code(f"const {T}* __restrict__ {ident(name(v), 'in_')}") for v in used_inputs]
    params += [Code(f"{T}* __restrict__ {ident(n, 'out_')}") for n, _ in outputs]
    if shape.cols:
        params += [Code(f"{T}* __restrict__ {ident(n, 'out_')}") for n, _ in shape.col_out]
        params.append(Code(f"float* __restrict__ {ws}"))
        params.append(Code(f"unsigned int* __restrict__ {cnt}"))
    nrows = shape.nrows
    grid = (cfg.blocks(shape), 1, 1)
    legend_rows = ", ".join(K) or "(none)"
    mode = (f"streamed: every pass reads its inputs again, UNROLL = {cfg.unroll} chunks in flight per thread"
            if cfg.stream else
            f"in registers: the raw vectors of {', '.join(name(v) for v in shape.kept) or 'no input'} kept "
            "across passes, every input read from HBM once")
    sched_lines = [f"rows ({legend_rows}) grouped per block: ROWS_PER_BLOCK = {cfg.rows_per_block} (grid.x = "
                   f"{grid[0]} blocks)",
                   (f"each row split over THREADS_PER_ROW = {cfg.threads_per_row} lanes of one warp"
                    if not cfg.block_mode else f"each row split over the block's {cfg.threads_per_row} threads"),
                   f"the row ({', '.join(red)}), {shape.xsize} values, {shape.passes} pass(es) over it, {mode}",
                   "reductions in fp32: per-thread partials, then "
                   + ("block reductions" if cfg.block_mode else f"{cfg.threads_per_row}-lane shuffles")]
    rotation = rotation_context(shape, cfg, rot, sched_lines)
    same_lines = None
    if two_paths:
        # the arrays read and written unchecked on the rotated path, at the rotation's own place in their lines
        row_arrays = [ident(name(v), "in_") for v in column_kernel_rows(shape, cfg)]
        row_arrays += [ident(n, "out_") for n, _ in shape.full_out]
        base = row_arrays[0]
        same_lines = Code(" && ".join(
            f"((reinterpret_cast<unsigned long long>({base}) ^ reinterpret_cast<unsigned long long>({a})) & 15ULL) == 0ULL"
            for a in row_arrays[1:]) or "true")
        sched_lines.append("the rotated grid where every array laid out row after row starts at the same place in "
                           "its 16-byte lines (checked at run time), else the unrotated one")
    dynamic_partials = colpart_dynamic(shape, cfg)  # the column partials past static shared memory
    if shape.cols:
        sched_lines.append(f"column reductions ({', '.join(name(c.result) for c in shape.cols)}): SPLITS = "
                           f"{cfg.splits} blocks, {cfg.iterations(shape)} row group(s) each, "
                           + ("no group loaded ahead (each pass streams the row: the first from HBM, the "
                              "others from L2)" if cfg.stream else f"PREFETCH = {cfg.prefetch} group(s) loaded ahead")
                           + ", fp32 partials of "
                           "each thread's columns in " + ("registers over the rows, then shared memory"
                                                          if in_regs else "shared memory")
                           + ", one partial row per block")
        if dynamic_partials:
            sched_lines.append(f"the column partials take {col_smem_bytes(shape, cfg)} bytes of dynamic shared memory "
                               f"(the block's {chain_smem_bytes(shape, cfg)} pass the {MAX_STATIC_SMEM} it may declare)")
        sched_lines.append(f"the partial rows added in this kernel: the blocks still there when the last one "
                           f"arrives take every H-th tile of {cfg.threads // combine_slices(cfg)} columns (H helpers; "
                           f"counters {_ws_name(shape, 'colcount')}, zeroed once, left zero), each added in a fixed order "
                           "(deterministic); no second launch")
    if shift is not None:
        sched_lines.append(f"rows of {shape.xsize} values are not whole 16-byte vectors: each row's grid starts at "
                           f"the 16-byte boundary at or before {name(shift)}'s first value ({grid_chunks(shape)} "
                           "chunks, the first and last masked)")
    cache_bytes = row_cache_bytes(shape, cfg)
    cache_copies = [Code(f"napkin::cache_chunk_async(row_cache + {i} * RCH, kc, RCH, {ident(name(v), 'in_')} + "
                         f"{ident(name(v), 'off_')}, col0, limit);") for i, v in enumerate(in_smem)]
    if cache_ids and cfg.cluster > 1:
        sched_lines.append(f"each row shared by a cluster of {cfg.cluster} blocks of {cfg.threads} threads: "
                           f"{', '.join(name(v) for v in in_smem)} kept in their shared memory ({cache_bytes} bytes a "
                           "block, its threads' chunks), copied there at once (cp.async) before the first pass; a "
                           "pass's reductions meet in one round over the cluster (each warp's values stored into "
                           "every block's scratch, one cluster barrier)")
    elif cache_ids:
        sched_lines.append(f"{', '.join(name(v) for v in in_smem)} kept in shared memory ({cache_bytes} bytes): "
                           "the row's chunks all copied there at once (cp.async) before the first pass, every pass "
                           "reads them back (HBM reads the row once)")
    sched_lines += [f"schedule: {r}" for k in schedule.kernels for r in k.relabels]
    ctx = dict(
        SHIFT=shift is not None, shift_src=Code(f"{ident(name(shift), 'in_')} + {ident(name(shift), 'off_')}")
        if shift is not None else None, RCH=cache_chunks(shape, cfg), CACHE=bool(cache_ids), cache_copies=cache_copies,
        CLUSTER=cfg.cluster, SCRATCH_WORDS=scratch_words(cfg), WIDE=cfg.threads_per_row > 1024,
        kernel=kernel_name, T=T, dtype=shape.dtype, kind="chain", arch=comment(arch), diagram=comment(d.name),
        cols=cols, ws=ws, cnt=cnt, CSLICES=combine_slices(cfg), CDEPTH=combine_depth(cfg), SPLITS=cfg.splits or 0,
        ITERS=cfg.iterations(shape), NCOLS=len(cols), NRED=block_reductions(shape),
        COLPART_DYNAMIC=dynamic_partials, COLPART_REGS=in_regs,
        pf_scalars=pf_scalars, pf_vectors=pf_vectors, held_vectors=held_vectors, PREFETCH=cfg.prefetch,
        XSTRIDE=c_i64(shape.xsize),
        legend_rows=comment(legend_rows), legend_x=comment(", ".join(red)),
        TPR=cfg.threads_per_row, RPB=cfg.rows_per_block, VEC=cfg.vec, CPT=cfg.chunks_per_thread,
        COL_CPT=column_chunks(shape, cfg),
        UNROLL=cfg.unroll, stream=cfg.stream, REGS=chain_regs_estimate(shape, cfg), THREADS=cfg.threads,
        XSIZE=shape.xsize, NROWS=c_i64(nrows), EVEN=_even(shape, cfg), block_mode=cfg.block_mode, **rotation,
        same_lines=same_lines,
        params=params, row_index=row_index, offsets=offsets, row_scalars=row_scalars, LV=LV,
        SV=SV, al_check=al_check,
        first_scalars=scalar_maps.get(0, []), kept_decl=kept_decl, passes=passes, row_stores=row_stores,
        schedule_lines=[comment(s) for s in sched_lines],
    )
    src = render(TEMPLATE, **ctx)
    args = tuple(Arg("tensor", name(v), dtype=shape.dtype, axes=v.axis_names) for v in used_inputs)
    args += tuple(Arg("tensor", n, dtype=shape.dtype, axes=v.axis_names) for n, v in outputs)
    tunables = (("THREADS_PER_ROW", cfg.threads_per_row), ("ROWS_PER_BLOCK", cfg.rows_per_block),
                ("VEC", cfg.vec), ("CHUNKS_PER_THREAD", cfg.chunks_per_thread), ("UNROLL", cfg.unroll),
                ("STREAM", int(cfg.stream)), ("THREADS", cfg.threads))
    if cfg.cluster > 1:
        tunables += (("CLUSTER", cfg.cluster),)
    if shape.cols:
        args += tuple(Arg("tensor", n, dtype=shape.dtype, axes=v.axis_names) for n, v in shape.col_out)
        args += (Arg("tensor", _ws_name(shape), dtype="fp32", axes=()),)
        # 32-bit counters (COUNTERS) in a zeroed fp32 buffer (zero bits): the runner zero-fills it once
        args += (Arg("tensor", _ws_name(shape, "colcount"), dtype="fp32", axes=()),)
        tunables += (("SPLITS", cfg.splits), ("PREFETCH", cfg.prefetch), ("COMBINE_SLICES", combine_slices(cfg)),
                     ("COMBINE_DEPTH", combine_depth(cfg)), ("COLPART_REGS", int(in_regs)))
    return KernelLaunch(
        name=str(kernel_name), source=src, grid=grid, block=(cfg.threads, 1, 1),
        shared_bytes=col_smem_bytes(shape, cfg) if dynamic_partials else cache_bytes, args=args,
        template=TEMPLATE, tunables=tunables,
        model_smem_bytes=chain_smem_bytes(shape, cfg),
        model_regs_per_thread=chain_regs_estimate(shape, cfg),
    )


def _ws_name(shape: ChainShape, what: str = "colparts") -> str:
    """A buffer name for the column partials (or their counters) that no array of the diagram has."""
    d = shape.diagram
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    want = f"{d.name}_{what}"
    if is_name(want) and want not in taken:
        return want
    return f"{what}_{hashlib.sha1(d.name.encode()).hexdigest()[:10]}"


def column_buffers(shape: ChainShape, cfg: ChainConfig) -> tuple[Buffer, Buffer]:
    """The buffers of a chain kernel with column reductions: the fp32 partials (column reduction,
    block, column), written and read back in every launch, and the arrival counters
    (:data:`COUNTERS`), a persistent workspace zeroed once that every launch leaves zero."""
    part = Buffer(_ws_name(shape), ("reduction", "split", "column"), (len(shape.cols), cfg.splits, shape.xsize),
                  "fp32")
    counters = Buffer(_ws_name(shape, "colcount"), ("counter",), (len(COUNTERS),), "fp32", zeroed=True)
    return part, counters


def _pass_text(shape: ChainShape, p: int) -> str:
    what = [f"{c.how} {shape.name(c.result)}" + (f" (beside {shape.name(c.pair.result)}, online)" if c.pair else "")
            for c in shape.chains if shape.pass_of(c) == p]
    what += [f"writes {n}" for n, v in shape.full_out if shape.stage[id(v)] == p]
    return f"pass {p}: " + ", ".join(what)


class RowwiseFamily:
    """Softmax / layernorm / rmsnorm with elementwise prologue and epilogue, and any chain of maps
    and reductions over a row, fused."""

    name = NAME
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"threads_per_row", "warps", "stages", "regs_per_thread", "splits",
                              "blocks_per_sm", "streamed", "row_in_smem", "cluster"})
    smem_from_cost = True  # model_smem_bytes from the cost model's M_SMEM where it agrees
    # a norm's backward with its column reductions (layernorm: two row sums, dgamma and dbeta; 13
    # boxes) is one chain kernel: the planner asks this family about runs of exactly 4 boxes that
    # are not elementwise, up to 16 boxes
    max_heavy_boxes = 4
    max_fused_boxes = 16

    def explain(self, diagram: Diagram) -> str | None:
        """None if the family takes ``diagram``, else why not."""
        s = _analysed(diagram)
        if isinstance(s, str):
            return s
        if isinstance(s, ChainShape):
            if not chain_configs(s):
                words = 4 * len(s.cols) * -(-s.xsize // s.vec) * s.vec
                if s.cols and s.xsize % s.vec and words <= MAX_COL_SMEM:
                    return (f"no configuration keeps a row of {s.xsize} {s.dtype} values in registers, and a "
                            f"streamed one that is no whole number of 16-byte vectors is not rotated (7 rows in 8 "
                            f"would load value by value): its {len(s.cols)} column reduction(s) run apart")
                if s.cols:
                    return (f"no configuration keeps a row of {s.xsize} {s.dtype} values and the partials of its "
                            f"{len(s.cols)} column reduction(s) on chip: a streamed row's partials take "
                            f"{words // 1024} KiB of shared memory, past the {MAX_COL_SMEM // 1024} KiB a block may "
                            "hold them in")
                return f"no configuration runs a row of {s.xsize} {s.dtype} values"
            return None
        if not configs(s):
            return (f"no configuration keeps a row of {s.xsize} {s.dtype} values in registers "
                    f"(at most {MAX_VALUES_PER_THREAD} per thread, 1024 threads)")
        return None

    def matches(self, diagram: Diagram) -> bool:
        return self.explain(diagram) is None

    def _shape(self, diagram: Diagram) -> "RowwiseShape | ChainShape":
        s = _analysed(diagram)
        if isinstance(s, str):
            raise CodegenError(f"rowwise family cannot run diagram {diagram.name!r}: {s}")
        return s

    def candidates(self, diagram: Diagram, gpu, dtype: str | None = None) -> list[Schedule]:
        shape = self._shape(diagram)
        key = getattr(gpu, "key", gpu)
        if isinstance(shape, ChainShape):
            g = _gpu_of(gpu)
            sms = int(getattr(g, "sms", 0) or 0) or DEFAULT_SMS
            clusters = g is not None and has_clusters(g.arch)
            return [chain_schedule_for(shape, c, key)
                    for c in chain_configs(shape, sms, _per_sm(g), row_smem_budget(g), clusters)]
        return [schedule_for(shape, c, key) for c in configs(shape)]

    def config(self, diagram: Diagram, schedule: Schedule) -> "Config | ChainConfig":
        shape = self._shape(diagram)
        if isinstance(shape, ChainShape):
            return chain_config_from_schedule(shape, schedule)
        return config_from_schedule(shape, schedule)

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu) -> dict:
        """Blocks, threads, registers and shared memory of the launch a schedule stands for,
        and a latency floor: bytes in flight per SM (Little's law) bound the achievable rate."""
        shape = self._shape(diagram)
        if isinstance(shape, ChainShape):
            return chain_launch_estimate(shape, chain_config_from_schedule(shape, schedule))
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
        given = schedule.kernels[0].options
        if isinstance(shape, ChainShape):
            cfg = chain_config_from_schedule(shape, schedule)
            check_derived(NAME, schedule.kernels[0].name, given, cfg.options(shape))
            launch = lower_chain(shape, cfg, schedule, arch, Code(f"{ident(diagram.name)}_rowwise_chain"))
            if not shape.cols:
                return Program(diagram=diagram, schedule=schedule, family=NAME, launches=(launch,), buffers=(),
                               sizes=dict(shape.sizes))
            return Program(diagram=diagram, schedule=schedule, family=NAME, launches=(launch,),
                           buffers=column_buffers(shape, cfg), sizes=dict(shape.sizes))
        cfg = config_from_schedule(shape, schedule)
        check_derived(NAME, schedule.kernels[0].name, given, cfg.options(shape))
        kname = Code(f"{ident(diagram.name)}_rowwise_{shape.kind}")
        launch = lower_shape(shape, cfg, schedule, arch, kname)
        return Program(diagram=diagram, schedule=schedule, family=NAME, launches=(launch,), buffers=(),
                       sizes=dict(shape.sizes))


def _gpu_of(gpu):
    """The GPU profile ``gpu`` names (None where there is no such profile)."""
    try:
        from ..select import resolve_gpu

        return resolve_gpu(gpu)
    except Exception:  # noqa: BLE001 - no profile by that name: the defaults
        return None


def _per_sm(gpu):
    """``(threads, registers, shared bytes) -> blocks one SM holds`` on ``gpu`` (None without one)."""
    if gpu is None:
        return None
    from ...perfmodel.occupancy import occupancy

    def per_sm(threads: int, regs: int, smem: int) -> int:
        try:
            return occupancy(gpu, threads, regs, smem).blocks_per_sm
        except Exception:  # noqa: BLE001 - a launch the rules cannot place: one block
            return 1

    return per_sm


FAMILY = RowwiseFamily()
