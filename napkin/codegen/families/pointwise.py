"""The pointwise family: chains of elementwise maps, and reductions over any axis or axes with
the maps before and after them, in one pass over HBM (docs/architecture.md, "The pointwise
family").

What it accepts (:func:`analyse`): every box is an elementwise ``Map`` (any whitelisted function,
index maps included; inputs broadcast by axis name) or a ``Reduce``; the reductions form one
chain of the same kind (``sum``, ``max``, ``min`` or ``mean``: a mean of means is the mean, the
counts being uniform), each reducing the one before, over the set ``R`` of their axes. The maps
before the chain are evaluated on the iteration space ``U`` (the axes of the chain's input), the
maps after it on the kept space ``K = U \\ R``. Outputs hold all of ``U`` (written in the pass
that reads the data) or all of ``K`` (written after the reduction). A contraction over no axis
(an outer or elementwise product, ``contract(P[i], Q[j], over=(), out=(j, i))``) is the map
``x * y * …``; a contraction of two factors one of which holds every axis of the other (a
matrix-vector product, a dot) starts the chain as a sum of products, and so does a *skinny*
product, whose small factor has at most ``MAX_REP`` elements along its own axes (``Σ_k W[a, k]·x[b,
k]`` with a few ``b``: each thread holds every ``b`` in registers, :func:`_skinny`). Two chains are also one
pass when they are a max and a sum of exp over the same axes (:class:`PairSum`: ``m = max_R x``,
``s = Σ_R exp(x − c)`` with ``c`` = ``m`` or ``zero_inf(m)``, what a softmax or logsumexp over an
axis that is not innermost is written out as): the kernel keeps the pair (running max, sum of
exp(x − running max)), rescaling the sum when the max grows, and merges pairs across threads,
blocks and splits with ``merge_max_sumexp`` (reduce.cuh), so x is read once for both (over the
innermost axis alone such a pair is a row, left to the row-wise family). Softmax,
norms, matrix products and renames are other families' boxes.

How it runs: the *vector axis* is the innermost axis of the largest array that holds every axis
of ``U``; a thread works on ``VEC`` consecutive positions along it (``VEC`` values fill 16
bytes, fewer where the axis' size is not a multiple, except in a map whose arrays all hold ``U``
in one order, whose vectors run over the flattened space with a partial last one, and in a row
kernel whose rows are contiguous runs of every input, each row reading its values before its
first 16-byte boundary and after its last whole vector one by one), with one vector access for
arrays that hold it innermost, strided scalar accesses for arrays that hold it elsewhere and one
broadcast scalar for arrays that lack it. A map whose inputs holding the vector axis elsewhere all
hold one other axis innermost (the *cross axis*: ``Y[b, a] = X[a, b]``) stages them through
shared memory instead, a tile of (cross axis, vector axis) a block, read along the cross axis and
used along the vector axis (:class:`CrossTile`). Maps are evaluated in fp32 registers; every input
is read once and every output written once. Three kernels, by where the vector axis is:

- ``map`` (no reduction): ``THREADS`` threads per block, each ``UNROLL`` vectors of the flattened
  space (all loads issued before the first is used);
- ``row`` (the vector axis is reduced): ``THREADS_PER_ROW`` threads stride along the flattened
  ``R`` of one kept element, coalesced, ``UNROLL`` vectors in flight each, then shuffles (a part
  of a warp) or a block reduction;
- ``col`` (the vector axis is kept): a warp's ``TX`` lanes on consecutive vectors of kept elements
  (coalesced rows of ``TX·16`` bytes), ``TY`` threads per kept vector splitting ``R``, combined in
  shared memory in a fixed order.

When the kept space does not give enough blocks, ``R`` is split over ``SPLITS`` blocks as well:
fp32 partials go to an HBM workspace, and the last of a kept tile's ``SPLITS`` blocks to arrive
(a self-resetting arrival counter per tile, in a persistent workspace zeroed once:
``Buffer.zeroed``) combines them in split order and writes the kept outputs, so a split costs
no second launch (H100: its ~3 us was a tenth of a column sum over 128 MiB). The result does
not depend on timing: the only atomic counts arrivals, the sums run in a fixed order. Sizes need not be multiples of anything;
indices are 64-bit when the iteration space (and so any array) passes 2^30 elements.

The tunables travel as the kernel's typed options (``warps``; ``stages`` = ``UNROLL``;
``threads_per_row`` = the threads sharing one reduced element, ``THREADS_PER_ROW`` or ``TY``;
``splits``; ``regs_per_thread``), so that a planned kernel lowers to the same kernel again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from ...diagrams.axes import NAME_RE
from ...diagrams.diagram import Diagram
from ...diagrams.functions import get_function
from ...diagrams.ops import Contract, InputOp, Map, Reduce, Rename, Value, apply, shifted_exp
from ...dtypes import dtype as lookup_dtype
from ...errors import CodegenError
from ...perfmodel.schedule import Kernel, KernelOptions, Relabel, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program, check_derived
from ..render import Code, c_i64, c_int, comment, cuda_type, half_math, ident, map_expr, render
from . import in_registers, per_diagram, plain_kernel_reason

NAME = "pointwise"
TEMPLATE = "pointwise.cu.jinja"
_SUPPORTED = ("bf16", "fp16", "fp32")

#: Threads per block of the map and row kernels (a row kernel with more than 32 threads per row
#: holds one row per block, its block being that many threads).
BLOCK_THREADS = (128, 256, 512)
#: Vectors per thread in flight (``UNROLL``, the options' ``stages``).
UNROLLS = (1, 2, 4)
#: Threads sharing one kept element in the row kernel.
THREADS_PER_ROW = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Lanes along the kept vectors in the column kernel (TX·16 contiguous bytes per row of R).
COL_TX = (8, 16, 32, 64, 128)
#: The most blocks one reduction is split over (grid.y).
MAX_SPLITS = 1024
#: Indices are 64-bit when any array, or the iteration space, passes this many elements.
INT32_LIMIT = 2 ** 30
#: The most registers a thread of a map kernel the family prefers: more leave under 28 warps an SM
#: with 128-thread blocks (7 blocks). H100, bf16 4096², exp(x - m) / s with m and s broadcast: eight
#: vectors in flight at 144 registers 26.4 us, four at 88 registers 22.2 us, two 22.0 us. H200, bf16
#: 8192 x 4096, gelu(x)·sigmoid(y) (kernels' time): eight vectors at 96 registers (20 warps) 56.4
#: us, four at 64 registers 49.9 us; the tanh-form GELU's eight at 72 registers (28 warps) 35.2 us,
#: four 36.9 us.
MAP_REGS = 72
#: The register budget past which a reduction's configuration gives way to one the model times
#: alike on fewer registers (more warps resident: 88 registers leave 16 warps an SM with 256-thread
#: blocks, 72 leave 24). H200, bf16 (`reduce_regs_ab.jsonl`, a call, us): four vectors in flight on
#: 88 registers against two on 64, x·A over the first axis of 4096 x 65536 141.9 -> 124.4, a column
#: sum of 16384 x 4096 42.0 -> 35.8, a max over the first axis 24.2 -> 21.2; but pairs on 72
#: registers against 56-64 ran 5-12 % slower (logsumexp over the middle axis of 64 x 512 x 256 12.0
#: against 13.5).
REDUCE_REGS = 72
#: The most elements a thread holds of the small factor's own axes in a *skinny* sum of products
#: (:func:`_skinny`, ``Y[b, a] = Σ_k W[a, k]·x[b, k]`` with ``b`` of at most this many): each vector
#: of the large factor is read from HBM once and multiplied by every one of them in registers. Past
#: it the accumulators crowd the registers and a tensor-core tile wastes less of its rows.
MAX_REP = 8
#: Registers of the footprint formula beside the values in flight: indices, offsets, loop state.
BASE_REGS = 16
MAX_REGS = 255
#: Bytes the GPU reads per transaction run: below this many contiguous bytes per row of R, the
#: column kernel's rows waste part of their sectors (the model's idle lanes).
_SECTOR = 32

_OPS = {"sum": "napkin::SumOp", "mean": "napkin::SumOp", "max": "napkin::MaxOp", "min": "napkin::MinOp"}


# ----------------------------------------------------------------------------- analysis


@dataclass(frozen=True, eq=False)
class PairSum:
    """``s = Σ_R exp(x − c)`` beside ``m = max_R x``, with ``c`` = ``m`` (a softmax written out) or
    ``zero_inf(m)`` (logsumexp): one pass keeps the pair (running max, sum of exp(x − running max))
    and rescales the sum when the max grows, as an online softmax does.

    ``maxes`` and ``sums`` are the two chains of reductions (first to last, over the same axes),
    ``absorbed`` the boxes the pair computes itself (the shift ``x − c`` and its exp, read by the
    sum alone), ``exact`` whether ``c`` is the max itself: then an infinite max makes every term
    NaN (``x − m`` is ``inf − inf`` or ``−inf + inf`` for the values equal to it), as in the
    written-out form. With ``zero_inf(m)`` a max of −inf gives a sum of 0 and one of +inf a sum of
    +inf (NaN stays NaN)."""

    maxes: tuple[Value, ...]
    sums: tuple[Value, ...]
    absorbed: tuple[Value, ...]
    exact: bool


#: ``PointwiseShape.how`` of a pair reduction (:class:`PairSum`).
PAIR = "max_sumexp"


@dataclass(frozen=True, eq=False)
class PointwiseShape:
    """What the family found in a diagram (names are the diagram's checked names)."""

    diagram: Diagram
    dtype: str
    sizes: dict
    mode: str                          # map | row | col
    how: str | None                    # the reduction's kind (None: no reduction)
    order: tuple[str, ...]             # the iteration space U, outermost first; order[-1] = vector axis
    red: tuple[str, ...]               # R, in U's order
    kept: tuple[str, ...]              # K = U \ R, in U's order
    chain: tuple[Value, ...]           # the reductions, first to last
    loop: tuple[Value, ...]            # maps evaluated per element of U (topological)
    post: tuple[Value, ...]            # maps evaluated per kept element after the reduction
    full_out: tuple[tuple[str, Value], ...]   # outputs holding U, written in the pass
    kept_out: tuple[tuple[str, Value], ...]   # outputs holding K, written after the reduction
    vec: int
    #: values of the map kernel's last, partial vector (0: every vector is whole). Only where the
    #: vectors run over the flattened space (see :func:`_flat_vectors`): the vector axis' size is
    #: not a multiple of the 16-byte vector, the space's size need not be either.
    tail: int = 0
    #: the row kernel's rows are contiguous runs of every array it reads, of a length that is not a
    #: multiple of VEC: each row reads its first values up to a 16-byte boundary and its last ones
    #: value by value, whole aligned vectors between (see :func:`_row_runs`).
    aligned_rows: bool = False
    #: the column kernel's kept vector axis is not a multiple of VEC: each line of it (one value of
    #: the outer kept axes) holds ``ceil(size / VEC)`` vectors, the last one partial, and a vector is
    #: read from the 16-byte lines it straddles (see :func:`_padded_columns`).
    padded: bool = False
    #: the sum of exp(x − max) beside the max chain (``how`` is :data:`PAIR`), else None
    pair: "PairSum | None" = None
    #: (view, array) pairs: an input of ``diagram`` that is a view (a rename) of another input of
    #: the kernel's diagram, read through the other one's tensor (see :func:`_views_as_inputs`)
    aliases: tuple[tuple[str, str], ...] = ()
    #: the map kernel's *cross axis* ``Q``: the innermost axis of every array that holds the vector
    #: axis elsewhere (a transpose's source, or a transposed output). Such arrays are staged
    #: through shared memory a tile of (Q, vector axis) at a time, moved along Q in HBM and used
    #: along the vector axis, so that every access to HBM is coalesced (see :func:`_cross_axis`);
    #: None where the map has no such array (or several that disagree on Q: strided accesses then).
    cross: str | None = None
    #: a skinny sum of products (:func:`_skinny`): the small factor's own axes, outermost first
    #: (``b`` of ``Σ_k W[a, k]·x[b, k]``), which no array of the pass over U holds. They are kept,
    #: but a thread holds every one of their ``nrep`` elements in registers rather than a thread
    #: each: it reads each vector of the large factor once and multiplies it by the small factor's
    #: values at every one of them, keeping ``nrep`` accumulators a vector. ``kept`` and ``nk``
    #: leave them out; the kept outputs hold them.
    rep: tuple[str, ...] = ()
    #: the small factor of a skinny sum of products (an input), read at each of the ``nrep``
    #: elements of :attr:`rep`
    rep_input: Value | None = None

    @property
    def nrep(self) -> int:
        """Elements of the :attr:`rep` axes (1 without them)."""
        return self.n(self.rep)

    @property
    def staged(self) -> tuple[Value, ...]:
        """The inputs the map kernel stages through shared memory (holding the vector axis but
        :attr:`cross` innermost)."""
        if self.cross is None:
            return ()
        return tuple(v for v in self.loop_inputs if self.inner in v.axis_names and v.axis_names[-1] == self.cross)

    @property
    def staged_out(self) -> tuple[tuple[str, Value], ...]:
        """The outputs the map kernel stages through shared memory (written along :attr:`cross`)."""
        if self.cross is None:
            return ()
        return tuple((n, v) for n, v in self.full_out if v.axis_names[-1] == self.cross)

    @property
    def flat(self) -> bool:
        """Whether the map kernel's vectors run over the flattened space, across the ends of the
        vector axis (whose size is not a multiple of VEC)."""
        return self.sizes[self.order[-1]] % self.vec != 0 and not self.padded

    @property
    def line_vectors(self) -> int:
        """Vectors of one line of the vector axis, a partial last one included."""
        return -(-self.sizes[self.inner] // self.vec)

    @property
    def nkv(self) -> int:
        """The column kernel's kept vectors: :attr:`line_vectors` a line of the vector axis where it
        is padded, else the kept values over VEC."""
        if self.padded:
            return (self.nk // self.sizes[self.inner]) * self.line_vectors
        return self.nk // self.vec

    @property
    def nvec(self) -> int:
        """Vectors of the map kernel's space, a partial last one included."""
        return -(-self.nu // self.vec)

    @property
    def inner(self) -> str:
        return self.order[-1]

    def n(self, axes) -> int:
        return math.prod(self.sizes[a] for a in axes)

    @property
    def nu(self) -> int:
        return self.n(self.order)

    @property
    def nr(self) -> int:
        return self.n(self.red)

    @property
    def nk(self) -> int:
        return self.n(self.kept)

    @property
    def bytes(self) -> int:
        return lookup_dtype(self.dtype).bytes

    @property
    def reduce_in(self) -> Value | None:
        return self.chain[0].args[0] if self.chain else None

    @property
    def reduce_args(self) -> tuple[Value, ...]:
        """The values the first reduction reads: its input, or both factors of a contraction (a
        matrix-vector product is a sum of products, read once from HBM)."""
        if not self.chain:
            return ()
        return tuple(self.chain[0].args) if isinstance(self.chain[0].op, Contract) else (self.chain[0].args[0],)

    @property
    def reduce_out(self) -> Value | None:
        return self.chain[-1] if self.chain else None

    def name(self, v: Value) -> str:
        return self.diagram.name_of(v)

    @property
    def loop_inputs(self) -> tuple[Value, ...]:
        """Inputs read in the pass over U (by the loop maps, the reduction or as a full output)."""
        reads = [a for b in self.loop for a in b.args if a.is_input]
        reads += [a for a in self.reduce_args if a.is_input]
        return tuple({id(v): v for v in reads}.values())

    @property
    def post_inputs(self) -> tuple[Value, ...]:
        reads = [a for b in self.post for a in b.args if a.is_input]
        return tuple({id(v): v for v in reads}.values())

    @property
    def big(self) -> bool:
        """Whether 64-bit indices are needed: the space passes 2^30 elements (every array, and the
        partials of a split, which has at most as many splits as R has vectors, are no larger)."""
        return self.nu >= INT32_LIMIT


def _ancestors(values, stop: set[int]) -> set[int]:
    """ids of the computed values the given ones depend on (themselves included), not going
    through the ids in ``stop``."""
    out: set[int] = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if v.is_input or id(v) in out or id(v) in stop:
            continue
        out.add(id(v))
        stack.extend(v.args)
    return out


def _is_product_sum(v: Value) -> bool:
    """Whether box ``v`` is a contraction of two factors one of which carries no axis the other
    lacks (a matrix-vector product, a weighted sum, a dot product): a sum of products that reads
    each factor once, which this family runs at the memory's rate."""
    if not isinstance(v.op, Contract) or len(v.args) != 2 or not v.op.over:
        return False
    # an axis of size 1 takes one value: a matmul by a one-column matrix (B[b, c] with c = 1, as
    # torch.matmul(A, x[:, None]) is written) is a matrix-vector product
    x, y = ({n for n in a.axis_names if not _unit(a, n)} for a in v.args)
    return x <= y or y <= x


def _skinny(v: Value) -> tuple[Value, tuple[str, ...]] | None:
    """``(small factor, its own axes)`` where box ``v`` is a *skinny* sum of products: a
    contraction of two factors that each carry axes the other lacks (a matrix product), the
    small one's own axes (those of size 1 aside) holding at most :data:`MAX_REP` elements, and
    every summed axis in the large one (``Y[b, a] = Σ_k W[a, k]·x[b, k]``, a batch of a few
    vectors by a large matrix: a linear layer at decode time). Such a product is bound by reading
    the large factor, as a matrix-vector product is, and this family runs it as one: each vector
    of the large factor is read once and multiplied by the small factor's values in registers.
    None otherwise; the smaller of two candidates where both factors qualify.

    >>> from napkin.diagrams import Axis, array, contract
    >>> a, b, k = Axis("a", 4096), Axis("b", 4), Axis("k", 512)
    >>> x, _ = _skinny(contract(array("W", a, k), array("x", b, k), over=("k",), out=("b", "a"), name="y"))
    >>> x.name
    'x'
    >>> _skinny(contract(array("W", a, k), array("X", Axis("b", 64), k), over=("k",), name="y")) is None
    True
    """
    if not isinstance(v.op, Contract) or len(v.args) != 2 or not v.op.over:
        return None

    def own(p: Value, q: Value) -> tuple[str, ...]:
        return tuple(n for n in p.axis_names if n not in q.axis_names and not _unit(p, n))

    best = None
    for small, large in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
        axes = own(small, large)
        if not axes or not own(large, small) or not all(small.axis(n).is_bound for n in axes):
            continue
        if any(o not in large.axis_names for o in v.op.over):
            continue  # an axis summed in the small factor alone: not a product read once
        m = math.prod(small.axis(n).size for n in axes)
        if m <= MAX_REP and (best is None or m < best[0]):
            best = (m, small, axes)
    return (best[1], best[2]) if best else None


def _unit(v: Value, axis: str) -> bool:
    """Whether ``v``'s axis ``axis`` is bound to size 1 (a symbolic size is not)."""
    ax = v.axis(axis)
    return ax.is_bound and ax.size == 1


def _is_product(v: Value) -> bool:
    """Whether box ``v`` is a contraction over no axis (an outer or elementwise product, also what
    :meth:`~napkin.diagrams.diagram.Diagram.grad` writes for a broadcast): no sum, so an
    elementwise map ``x * y * …`` over its output's axes."""
    return isinstance(v.op, Contract) and not v.op.over


def _is_map(v: Value) -> bool:
    """Whether box ``v`` is evaluated per element: a ``Map`` or a product over no axis."""
    return isinstance(v.op, Map) or _is_product(v)


def _is_reduction(v: Value) -> bool:
    """Whether box ``v`` sums or reduces over an axis: a ``Reduce`` or a sum of products."""
    return isinstance(v.op, Reduce) or (isinstance(v.op, Contract) and bool(v.op.over))


def _index_axes(v: Value) -> tuple[str, ...]:
    """The axes whose index an elementwise box reads (a product reads none)."""
    return tuple(v.op.index_axes) if isinstance(v.op, Map) else ()


def _over(v: Value) -> tuple[str, ...]:
    return tuple(v.op.over) if isinstance(v.op, Contract) else (v.op.over,)


def _how(v: Value) -> str:
    return "sum" if isinstance(v.op, Contract) else v.op.how


def _views_as_inputs(d: Diagram) -> tuple[Diagram, tuple[tuple[str, str], ...]]:
    """``d`` with each rename of one of its inputs (a kernel that reads an array both as it is and
    through a view, ``X + Xᵀ``: the kernel's sub-diagram keeps such a view as a box) made an input
    of its own, and the (view, array) pairs: the view is the same tensor under other axis names,
    so the kernel reads it through the array's pointer with the view's strides. ``d`` unchanged
    when it has a rename of anything else, or one that is an output (a copy: not a view).

    >>> from napkin.diagrams import Axis, Diagram, array, map_fn, rename
    >>> X = array("X", Axis("i", 4), Axis("j", 4))
    >>> e, pairs = _views_as_inputs(Diagram("sym", map_fn("add", X, rename(X, i="j", j="i", name="Xt"), name="Y")))
    >>> [v.label() for v in e.inputs], pairs
    (['X[i,j]', 'Xt[j,i]'], (('Xt', 'X'),))
    """
    renames = [v for v in d.nodes if isinstance(v.op, Rename)]
    outs = {id(v) for v in d.outputs}
    if not renames or any(not v.args[0].is_input or id(v) in outs for v in renames):
        return d, ()
    memo: dict[int, Value] = {id(v): v for v in d.inputs}
    views, pairs = [], []
    for v in d.nodes:
        n = d.name_of(v)
        if isinstance(v.op, Rename):
            memo[id(v)] = Value(InputOp(), (), v.axes, v.dtype, n)
            views.append(memo[id(v)])
            pairs.append((n, v.args[0].name))
        else:
            memo[id(v)] = apply(v.op, [memo[id(a)] for a in v.args], n)
    return Diagram(d.name, tuple(memo[id(v)] for v in d.outputs), [*d.inputs, *views], d.description), tuple(pairs)


def analyse(diagram: Diagram) -> PointwiseShape | str:
    """The pointwise structure of ``diagram``, or a sentence saying why it has none."""
    d, aliases = _views_as_inputs(diagram)
    nodes = d.nodes
    if not nodes:
        return "has no boxes"
    for v in nodes:
        if isinstance(v.op, Contract) and not _is_product(v) and not _is_product_sum(v) and _skinny(v) is None:
            return (f"box {d.name_of(v)} is a contraction of two factors that each carry an axis the other "
                    f"lacks, more than {MAX_REP} elements each (a matrix product: the contraction family runs it)")
        if not isinstance(v.op, (Map, Reduce, Contract)):
            return (f"box {d.name_of(v)} is a {v.op.kind}, not an elementwise map or a reduction "
                    "(other families run softmax, norms, contractions and renames)")
    why = plain_kernel_reason(d, _SUPPORTED)
    if why:
        return why
    dtype = d.nodes[0].dtype  # the one dtype of every array
    sizes = {n: a.bound_size for n, a in d.axes.items()}
    consumers = d.consumers
    out_ids = {id(v) for v in d.outputs}
    reduces = [v for v in nodes if _is_reduction(v)]

    chain: list[Value] = []
    rep: tuple[str, ...] = ()
    rep_input: Value | None = None
    pair = _pair_of(d, reduces, consumers, out_ids) if reduces else None
    if isinstance(pair, str):
        return pair
    if pair is not None:
        chain = list(pair.maxes)
        first_in = chain[0].args[0]
        order0 = first_in.axis_names
        red = {a for v in chain for a in _over(v)}
    elif reduces:
        for v in reduces:
            if isinstance(v.op, Contract) and any(_is_reduction(a) for a in v.args):
                return (f"contraction {d.name_of(v)} reads a reduction; a sum of products starts the chain "
                        "of reductions")
        firsts = [v for v in reduces if not _is_reduction(v.args[0])]
        if len(firsts) != 1:
            return (f"its {len(reduces)} reductions are not one chain (each reducing the one before); "
                    f"{len(firsts)} of them read a value that is no reduction")
        chain = [firsts[0]]
        while True:
            nxt = [c for c in consumers.get(id(chain[-1]), ()) if _is_reduction(c)]
            if not nxt:
                break
            if len(nxt) > 1 or len(consumers[id(chain[-1])]) > 1 or id(chain[-1]) in out_ids:
                return (f"reduction {d.name_of(chain[-1])} is read by more than the next reduction "
                        "of the chain (one pass computes only the last)")
            chain.append(nxt[0])
        if len(chain) != len(reduces):
            return "its reductions are not one chain (each reducing the one before)"
        hows = {_how(v) for v in chain}
        if len(hows) != 1:
            return (f"the chain mixes reductions ({', '.join(sorted(hows))}); one pass runs one kind "
                    "(sum, max, min or mean)")
        skinny = _skinny(chain[0])
        if skinny is not None:
            rep_input, rep = skinny
            if len(chain) > 1:
                return (f"the skinny product {d.name_of(chain[0])} is reduced again ({d.name_of(chain[1])}); "
                        "one pass runs it alone")
            if not rep_input.is_input:
                return (f"the small factor of the skinny product {d.name_of(chain[0])} is computed "
                        f"({d.name_of(rep_input)}); this family reads it from HBM")
            first_in = next(a for a in chain[0].args if a is not rep_input)
        else:
            # the larger factor of a product (axes of size 1 aside)
            first_in = max(chain[0].args, key=lambda a: (sum(not _unit(a, n) for n in a.axis_names),
                                                         len(a.axis_names)))
        # the other's axes of size 1 go outermost, where they change no offset
        units = tuple(dict.fromkeys(n for a in chain[0].args for n in a.axis_names
                                    if n not in first_in.axis_names and n not in rep))
        order0 = units + first_in.axis_names
        red = {a for v in chain for a in _over(v)}
    else:
        order0 = ()
        red = set()

    last = chain[-1] if chain else None
    # the pair's sum chain, and the shift and exp it absorbs, are computed by the reduction itself
    absorbed = {id(v) for v in (*pair.sums, *pair.absorbed)} if pair else set()
    ends = {id(last)} | ({id(pair.sums[-1])} if pair else set())
    after = set() if last is None else (_desc(nodes, last) | (_desc(nodes, pair.sums[-1]) if pair else set())) - absorbed
    # the iteration space U and the maps of each phase
    if chain:
        U = set(order0)
    else:
        U = set()
        for v in nodes:
            U |= set(v.axis_names)
    K = U - red
    KR = K | set(rep)   # what the kept values hold: the kept axes, and a skinny product's own
    post_ids = {id(v) for v in nodes if id(v) in after and _is_map(v)}
    for v in nodes:
        if id(v) in post_ids and not set(v.axis_names) <= KR:
            return (f"box {d.name_of(v)} carries a reduced axis ({', '.join(sorted(set(v.axis_names) & red))}) "
                    "after the reduction: that is a second pass over the data")
    full_out, kept_out = [], []
    for n, v in zip(d.output_names, d.outputs):
        if any(n == m for m, _ in full_out + kept_out):
            continue
        axes = set(v.axis_names)
        if chain and (id(v) in after or id(v) in ends):
            if axes != KR:
                return f"output {n} holds ({', '.join(v.axis_names)}), not the kept axes ({', '.join(sorted(KR))})"
            kept_out.append((n, v))
        elif axes == U:
            full_out.append((n, v))
        elif chain and axes == K and not rep:
            kept_out.append((n, v))
        else:
            space = "the kept axes" if chain else "the iteration space"
            return (f"output {n} holds ({', '.join(v.axis_names)}), not every axis of {space} "
                    f"({', '.join(sorted(K if chain else U))})")
    chain_ids = {id(v) for v in chain} | absorbed
    # values read after the reduction (post maps and outputs on K) and their map ancestors
    post_roots = [v for v in nodes if id(v) in post_ids] + [v for _, v in kept_out if id(v) not in chain_ids]
    post_need = _ancestors(post_roots, chain_ids)
    loop_roots = [v for _, v in full_out] + (list(chain[0].args) if chain else [])
    loop_need = _ancestors(loop_roots, chain_ids)
    for v in nodes:
        if id(v) in chain_ids:
            continue
        if id(v) in post_need and set(v.axis_names) <= KR:
            continue  # after the reduction, on the kept values (a skinny product's own axes among them)
        if not set(v.axis_names) <= U:
            return (f"box {d.name_of(v)} carries ({', '.join(v.axis_names)}), outside the iteration space "
                    f"({', '.join(sorted(U))})")
        if id(v) in post_need and not set(v.axis_names) <= K:
            return (f"box {d.name_of(v)} carries a reduced axis ({', '.join(sorted(set(v.axis_names) & red))}) "
                    "but is needed after the reduction: that is a second pass over the data")
    loop = tuple(v for v in nodes if id(v) in loop_need)
    post = tuple(v for v in nodes if id(v) in post_need)

    # the layout: the largest array that holds every axis of U fixes the order (outputs first on ties)
    arrays = [v for _, v in full_out] + [v for v in d.inputs if set(v.axis_names) == U]
    if arrays:
        primary = max(arrays, key=lambda v: lookup_dtype(v.dtype).bytes)
        order = primary.axis_names
    elif chain:
        order = order0
    else:
        order = tuple(a for a in d.axes if a in U)
    if not order:
        return "the iteration space has no axis (a scalar computation)"
    inner = order[-1]
    mode = "map" if not chain else ("row" if inner in red else "col")
    if pair and mode == "row" and len(red) == 1:
        # a logsumexp or softmax statistics over the innermost axis alone is a row: the row-wise
        # family runs it (its own pair, measured there); this family's pair is for the other axes
        return (f"the max and the sum of exp(x − max) over the innermost axis {inner} alone are a row "
                "(the row-wise family runs them)")
    bytes_ = lookup_dtype(dtype).bytes
    vec = 16 // bytes_
    tail = 0
    aligned_rows = False
    padded = False
    # a skinny product takes whole vectors only: the vector halves until it divides the axis
    if sizes[inner] % vec and mode == "map" and _flat_vectors(order, loop, full_out):
        tail = math.prod(sizes[a] for a in order) % vec
    elif sizes[inner] % vec and mode == "row" and not rep and _row_runs(order, red, loop, chain, full_out):
        aligned_rows = True
    elif (sizes[inner] % vec and sizes[inner] > vec and mode == "col" and bytes_ == 2 and not pair and not rep
          and _padded_columns(order, loop, chain, full_out)):
        padded = True
    else:
        while sizes[inner] % vec:
            vec //= 2
    how = PAIR if pair else (_how(chain[0]) if chain else None)
    cross = _cross_axis(order, sizes, loop, full_out) if mode == "map" and not tail else None
    return PointwiseShape(d, dtype, sizes, mode, how, tuple(order),
                          tuple(a for a in order if a in red), tuple(a for a in order if a in K), tuple(chain),
                          loop, post, tuple(full_out), tuple(kept_out), vec, tail, aligned_rows, padded, pair,
                          aliases, cross, tuple(a for a in rep_input.axis_names if a in rep) if rep else (),
                          rep_input)


def _pair_of(d: Diagram, reduces: list[Value], consumers: dict, out_ids: set[int]) -> "PairSum | str | None":
    """The max of a value and the sum of exp(value − max) over the same axes, when the diagram's
    reductions are those two chains (a softmax or logsumexp written out); None when they are not
    (the one-chain analysis decides), a sentence when they nearly are but one pass cannot run
    them."""
    maxes = [v for v in reduces if isinstance(v.op, Reduce) and v.op.how == "max"]
    sums = [v for v in reduces if isinstance(v.op, Reduce) and v.op.how == "sum"]
    if not maxes or not sums or len(maxes) + len(sums) != len(reduces):
        return None
    chains = []
    for group in (maxes, sums):
        firsts = [v for v in group if not _is_reduction(v.args[0])]
        if len(firsts) != 1:
            return None
        ch = [firsts[0]]
        while True:
            nxt = [c for c in consumers.get(id(ch[-1]), ()) if _is_reduction(c)]
            if not nxt:
                break
            if (len(nxt) > 1 or len(consumers[id(ch[-1])]) > 1 or id(ch[-1]) in out_ids
                    or not any(nxt[0] is g for g in group)):
                return None
            ch.append(nxt[0])
        if len(ch) != len(group):
            return None
        chains.append(tuple(ch))
    mx, sm = chains
    e = sm[0].args[0]
    found = shifted_exp(e)
    if found is None or found[2] is not mx[-1]:
        return None
    value, _, _, exact = found
    sub = e.args[0]
    if value is not mx[0].args[0]:
        return (f"box {d.name_of(sub)} subtracts the max of {d.name_of(mx[0].args[0])} from another value "
                f"({d.name_of(value)}): one pass rescales a sum of exp(x − max) only for the x it takes the max of")
    for v in (e, sub):
        if id(v) in out_ids or len(consumers.get(id(v), ())) != 1:
            return (f"box {d.name_of(v)} (exp(x − max) for the sum) is read by more than the sum: one pass "
                    "computes only the max and the sum")
    if {a for v in mx for a in _over(v)} != {a for v in sm for a in _over(v)}:
        return None
    return PairSum(mx, sm, (sub, e), exact)


def _flat_vectors(order: tuple[str, ...], loop, full_out) -> bool:
    """Whether a map's vectors may run over the flattened space, across the vector axis' ends:
    every array it reads or writes holds the whole space in the same order (so a flat index is
    every array's offset, and 16-byte vectors stay whole where a row's length is odd), and no map
    reads an axis index (which would change inside a vector)."""
    arrays = [a for b in loop for a in b.args if a.is_input] + [v for _, v in full_out]
    return (all(tuple(v.axis_names) == tuple(order) for v in arrays)
            and not any(_index_axes(b) for b in loop))


#: The fewest values along the cross axis for a map to stage its transposed arrays: below 16, an
#: array's run along it is under a 32-byte sector, and neighbouring lanes' strided accesses fall in
#: the same sectors anyway (L1 serves them).
MIN_CROSS = 16
#: The most arrays (inputs and outputs) a map stages, each a tile of shared memory.
MAX_STAGED = 4
#: Static shared memory a block may declare.
STATIC_SMEM = 48 * 1024
#: The most registers of the footprint formula a cross tile's configuration may need. Phase 2 keeps
#: UNROLL vectors of every array in flight: an fp32 map with a staged output at four vectors needed
#: 110 registers where the formula said 83 (ptxas spilled 20 bytes at the budget), and no such
#: configuration ran faster than its two-vector sibling (H200: the fp32 transpose of 8192 x 4096
#: 66.6 against 66.4 us, bf16 34.8 against 34.4; `candidates_transpose_*_s25.json`).
CROSS_REGS = 64


def _cross_axis(order: tuple[str, ...], sizes: dict, loop, full_out) -> str | None:
    """The cross axis of a map (:attr:`PointwiseShape.cross`): the one innermost axis ``Q`` of every
    array (input read, or output) that holds the vector axis ``order[-1]`` elsewhere, where there
    is such an array, ``Q`` has at least :data:`MIN_CROSS` values and at most :data:`MAX_STAGED`
    arrays are staged. ``Y[b, a] = X[a, b]`` has cross axis ``b``: a thread that writes 16 bytes
    of a row of Y would otherwise read one value from each of 16 rows of X, a 32-byte sector for 2
    bytes (H200, bf16 8192 x 4096: 232.8 us against 31 predicted); a gradient ``dX[b, a]`` beside
    ``dZ[a, b]`` would be written so."""
    inner = order[-1]
    arrays = {id(a): a for b in loop for a in b.args if a.is_input}
    arrays.update({id(v): v for _, v in full_out})
    strided = [v for v in arrays.values() if inner in v.axis_names and v.axis_names[-1] != inner]
    if not strided or len(strided) > MAX_STAGED:
        return None
    qs = {v.axis_names[-1] for v in strided}
    if len(qs) != 1:
        return None
    q = qs.pop()
    if q not in order or sizes[q] < MIN_CROSS:
        return None
    return q


def _row_runs(order: tuple[str, ...], red: set, loop, chain, full_out) -> bool:
    """Whether the row kernel's rows are contiguous runs of the arrays it reads: the reduced axes
    are the innermost of the space, every input read holds the whole space in its order (so a row
    starts at ``row * NR`` in each) or the reduced axes alone in that order (the same values for
    every row: a matrix-vector product's ``x[k]``), at least one holds the whole space, no map
    reads an axis index, and no output is written in the pass. Such rows keep 16-byte vectors
    where their length is odd: each starts misaligned by its own amount, read value by value up
    to the first 16-byte boundary; an input of the reduced axes alone sits at another offset in
    its 16-byte lines than the row's, and is read as the two lines each 16-bit vector spans,
    shifted into place (value by value in fp32)."""
    if tuple(order[len(order) - len(red):]) != tuple(a for a in order if a in red) or full_out:
        return False
    arrays = [a for b in loop for a in b.args if a.is_input] + [a for a in chain[0].args if a.is_input]
    row = tuple(order[len(order) - len(red):])
    return (all(tuple(v.axis_names) in (tuple(order), row) for v in arrays)
            and any(tuple(v.axis_names) == tuple(order) for v in arrays)
            and not any(_index_axes(b) for b in loop))


def _padded_columns(order: tuple[str, ...], loop, chain, full_out) -> bool:
    """Whether the column kernel keeps 16-byte vectors along a kept vector axis whose size is not a
    multiple of them (a sum over the middle axis of 16 x 1024 x 4095): every input read holds that
    axis innermost or not at all (no strided reads, which would run past a line's end), and no output
    is written in the pass. Each line of the axis then holds whole vectors and one partial one;
    a vector is read from the (one or two) aligned 16-byte lines it straddles and shifted into
    place (``load_shifted``), its values past the line's end zero and never stored; where the
    vector halved instead (to one value at an odd size) every access was a 2-byte load. 16-bit
    values only, and no pair reduction: measured on an H200 (one call, L2 flushed, the vector
    halved → padded), bf16 min over the first axis of 127 x 129 x 1001 19.4 → 16.4 us, sum over the
    middle axis of 16 x 1024 x 4095 52.7 → 49.6; but fp32 sums and maxes there 72.0 → 82.9 and
    79.1 → 83.8 (an fp32 value-by-value load fills whole sectors; the shift costs instructions) and
    the 16-bit column logsumexp of a softmax over the first axis of 4095 x 4097 49.1 → 52.6 (its pair
    issues about nine instructions a value already)."""
    if full_out:
        return False
    inner = order[-1]
    arrays = [a for b in loop for a in b.args if a.is_input] + [a for a in chain[0].args if a.is_input]
    return all(inner not in v.axis_names or v.axis_names[-1] == inner for v in arrays)


def _desc(nodes, root: Value) -> set[int]:
    """ids of the values computed from ``root`` (not itself)."""
    out: set[int] = set()
    for v in nodes:
        if any(id(a) == id(root) or id(a) in out for a in v.args):
            out.add(id(v))
    return out


#: :func:`analyse`, once per diagram object.
_analysed = per_diagram(analyse)


# ----------------------------------------------------------------------------- tunables


@dataclass(frozen=True)
class Config:
    """One configuration of the template.

    ``threads``: threads per block; ``unroll``: vectors a thread has in flight; ``tpr``: threads
    sharing one kept element (row: ``THREADS_PER_ROW``, col: ``TY``; 1 in the map kernel);
    ``splits``: blocks sharing one kept element (partials, combined by the last block to arrive,
    when > 1).
    """

    mode: str
    threads: int
    unroll: int
    tpr: int = 1
    splits: int = 1

    @property
    def rows_per_block(self) -> int:
        """Kept elements per block (row kernel)."""
        return max(1, self.threads // self.tpr)

    @property
    def tx(self) -> int:
        """Lanes along the kept vectors (column kernel)."""
        return self.threads // self.tpr

    def options(self, shape: PointwiseShape) -> KernelOptions:
        return KernelOptions(warps=self.threads // 32, stages=self.unroll,
                             threads_per_row=self.tpr if shape.mode != "map" else None,
                             splits=self.splits if self.splits > 1 else None,
                             regs_per_thread=regs_estimate(shape, self))


def _check_config(shape: PointwiseShape, cfg: Config) -> None:
    why = None
    if cfg.unroll < 1 or cfg.unroll > 8:
        why = f"UNROLL={cfg.unroll} is not in 1..8"
    elif cfg.threads % 32 or not 32 <= cfg.threads <= 1024:
        why = f"{cfg.threads} threads per block: a multiple of 32, at most 1024"
    elif cfg.splits < 1 or cfg.splits > min(MAX_SPLITS, max(1, _vectors_r(shape))):
        why = f"SPLITS={cfg.splits} is not in 1..{min(MAX_SPLITS, max(1, _vectors_r(shape)))}"
    elif shape.mode == "map" and (cfg.tpr != 1 or cfg.splits != 1):
        why = "the map kernel has no reduction to share or split"
    elif shape.mode == "map" and shape.cross and smem_estimate(shape, cfg) > STATIC_SMEM:
        why = (f"the cross tiles of {len(shape.staged) + len(shape.staged_out)} staged arrays take "
               f"{smem_estimate(shape, cfg)} bytes of shared memory, over {STATIC_SMEM}")
    elif shape.mode == "row":
        if cfg.tpr not in THREADS_PER_ROW:
            why = f"THREADS_PER_ROW={cfg.tpr} is not one of {THREADS_PER_ROW}"
        elif cfg.tpr > 32 and cfg.threads != cfg.tpr:
            why = f"with {cfg.tpr} threads per row a block holds one row ({cfg.tpr} threads)"
    elif shape.mode == "col":
        if cfg.threads % cfg.tpr or cfg.tx < 1:
            why = f"TY={cfg.tpr} does not divide the block's {cfg.threads} threads"
    if why:
        raise CodegenError(f"pointwise: {why}")


@dataclass(frozen=True)
class CrossTile:
    """The tile of a map with a cross axis (:attr:`PointwiseShape.cross`): ``TI = lanes * VEC``
    values of the vector axis by ``TQ`` of the cross axis, at one position of the other axes.
    Phase 1 reads each staged input's ``TI`` rows of ``TQ`` values along the cross axis (``SV``
    values an access) into shared memory (``TI x PITCH``, an odd pitch: the reads of phase 2
    down a column then fall in distinct banks); phase 2 runs the map as the plain kernel does,
    ``lanes`` lanes on a row of the vector axis and ``THREADS / lanes`` rows of the cross axis a
    pass, ``UNROLL`` passes, a staged input's VEC values read down a column of its tile and a
    staged output's written down a column of its own; phase 3 writes each staged output's tile
    along the cross axis."""

    lanes: int
    ti: int
    tq: int
    sv: int
    nit: int
    nqt: int
    outer: int
    #: 16-bit values whose cross axis is no multiple of 8: a phase-1 read is the one or two
    #: aligned 16-byte lines its 8 values span, shifted into place (``load_shifted``), where the
    #: vector would otherwise halve to one value a load
    shifted: bool = False

    @property
    def pitch(self) -> int:
        return self.tq + 1

    def stage_iters(self, threads: int) -> int:
        """Phase-1 (and phase-3) accesses a thread: the tile's ``TI x TQ / SV`` over the block."""
        return -(-self.ti * (self.tq // self.sv) // threads)

    @property
    def blocks(self) -> int:
        return self.outer * self.nqt * self.nit


def cross_lanes(shape: PointwiseShape) -> int:
    """Lanes along the vector axis in a cross tile: 128 bytes of a row (32 lanes at most), fewer
    where the vector axis is shorter."""
    want = min(32, max(1, 128 // (shape.vec * shape.bytes)))
    return min(want, _pow2_ceil(-(-shape.sizes[shape.inner] // shape.vec)))


def cross_tile(shape: PointwiseShape, cfg: Config) -> CrossTile:
    """The cross tile of a configuration (``TQ = THREADS / lanes * UNROLL``)."""
    lanes = cross_lanes(shape)
    ti = lanes * shape.vec
    tq = cfg.threads // lanes * cfg.unroll
    nq, ni = shape.sizes[shape.cross], shape.sizes[shape.inner]
    sv = 16 // shape.bytes
    shifted = shape.bytes == 2 and nq % sv != 0 and tq % sv == 0
    while not shifted and sv > 1 and (nq % sv or tq % sv):
        sv //= 2
    return CrossTile(lanes, ti, tq, sv, -(-ni // ti), -(-nq // tq), shape.nu // (nq * ni), shifted)


def _vectors_r(shape: PointwiseShape) -> int:
    """Vectors along the flattened R (row kernel) or rows of R (column kernel)."""
    return shape.nr // shape.vec if shape.mode == "row" else shape.nr


def base_blocks(shape: PointwiseShape, cfg: Config) -> int:
    """Blocks before any split: tiles of the space (map), rows (row), kept vectors (col)."""
    if shape.mode == "map" and shape.cross:
        return cross_tile(shape, cfg).blocks
    if shape.mode == "map":
        return max(1, -(-shape.nvec // (cfg.threads * cfg.unroll)))
    if shape.mode == "row":
        return -(-shape.nk // cfg.rows_per_block)
    return -(-shape.nkv // cfg.tx)


def grid(shape: PointwiseShape, cfg: Config) -> tuple[int, int, int]:
    return (base_blocks(shape, cfg), cfg.splits, 1)


def chunk(shape: PointwiseShape, cfg: Config) -> int:
    """The part of the reduction one block runs: vectors of R (row) or rows of R (col)."""
    return -(-_vectors_r(shape) // cfg.splits)


def _pow2_ceil(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def configs(shape: PointwiseShape, sms: int = 132) -> list[Config]:
    """Every configuration the template builds for this shape, in the family's order of
    preference (:func:`preference`: the planner keeps the first of configurations the model times
    alike). ``sms``, the GPU's SM count, sizes the split of a reduction whose kept space gives too
    few blocks: about four blocks per SM, half and twice that."""
    out: list[Config] = []
    if shape.mode == "map" and shape.cross:
        # cross tiles of 16 to 128 values of the cross axis (UNROLL passes of THREADS / lanes rows),
        # within CROSS_REGS registers
        lanes, nq = cross_lanes(shape), shape.sizes[shape.cross]
        for t in (128, 256):
            for u in (1, 2, 4):
                tq = t // lanes * u
                c = Config("map", t, u)
                if (MIN_CROSS <= tq <= 128 and (tq <= 2 * nq or u == 1) and smem_estimate(shape, c) <= STATIC_SMEM
                        and regs_need(shape, c) <= CROSS_REGS):
                    out.append(c)
        return sorted(out or [Config("map", 128, 1)], key=lambda c: preference(shape, c, sms))
    if shape.mode == "map":
        nv = shape.nvec
        for t in BLOCK_THREADS:
            for u in _unrolls(shape):
                if u > 1 and nv <= t * (u // 2):
                    continue  # the second half of every thread's vectors would be empty
                out.append(Config("map", t, u))
        return sorted(out or [Config("map", BLOCK_THREADS[0], 1)], key=lambda c: preference(shape, c, sms))
    nrv = _vectors_r(shape)
    base: list[Config] = []
    if shape.mode == "row":
        for tpr in THREADS_PER_ROW:
            if tpr > 1 and nrv * 2 < tpr:
                continue  # more than half the row's threads would have no vector
            for u in _unrolls(shape):
                if u > 1 and nrv < tpr * u:
                    continue  # a thread's unrolled vectors would be partly empty
                base.append(Config("row", tpr if tpr > 32 else 256, u, tpr))
    else:
        nkv = shape.nkv
        for tx in COL_TX:
            if tx > COL_TX[0] and nkv * 2 <= tx:
                continue  # more than half the lanes would have no kept vector
            for t in (128, 256, 512):
                ty = t // tx
                if t == 128 and nrv >= 64:
                    continue  # small blocks only where R is short
                if ty > 1 and nrv * 2 < ty and t > 128:
                    continue  # more than half the rows' threads would have no row of R
                for u in _unrolls(shape):
                    if u > 1 and nrv < ty * u:
                        continue
                    base.append(Config("col", t, u, ty))
    for c in base:
        room = max(1, nrv // (c.tpr * c.unroll))   # splits that leave every thread a vector
        want = _pow2_ceil(4 * sms / base_blocks(shape, c))
        splits = {1}
        # a row split only beside a block of 256 or more threads per row (more lanes first)
        if want > 1 and (c.mode == "col" or c.tpr >= 256):
            splits |= {min(s, room, MAX_SPLITS) for s in (want // 2, want, want * 2)} - {0}
        out += [Config(c.mode, c.threads, c.unroll, c.tpr, s) for s in sorted(splits)]
    return sorted(out, key=lambda c: preference(shape, c, sms))


def _unrolls(shape: PointwiseShape) -> tuple[int, ...]:
    """Vectors a thread keeps in flight: 1, 2, 4, and 8 in the map kernel (a long chain of maps
    computes while the next vectors arrive) or where a vector is under 8 bytes (an axis whose size
    is not a multiple of the 16-byte vector), so a thread still has 16 bytes in flight."""
    return UNROLLS + ((8,) if shape.mode == "map" or shape.vec * shape.bytes < 8 else ())


def preference(shape: PointwiseShape, cfg: Config, sms: int = 132) -> tuple:
    """The family's order among configurations (smaller first), which decides between those the
    model times alike: in the map kernel 128-thread blocks with eight vectors in flight per thread
    (measured on an H200, bf16 at 8192 x 8192, L2 flushed clean: tanh-form GELU 67 us, against 70
    with four and 76 for 256 threads with two; sigmoid as three maps 66 us for all three), unless
    that needs more than ``MAP_REGS`` registers a thread (then the fewest registers); in a
    reduction about four blocks per SM (the split that gives them), then the fewest registers
    past ``REDUCE_REGS``, 256-thread blocks, four vectors in flight (two in a 16-bit column pair), a
    row kernel whose threads get about 64 bytes of R each, column rows of 512 contiguous bytes (32
    lanes of 16-byte vectors)."""
    def dist(a: float, b: float) -> float:
        return abs(math.log2(max(a, 1e-9) / max(b, 1e-9)))

    small = shape.vec * shape.bytes < 8   # scalar accesses: more of them in flight
    if shape.mode == "map" and shape.cross:
        # a 64-row cross tile of 256 threads (8 KiB of a 16-bit input a block)
        return (dist(cross_tile(shape, cfg).tq, 64), dist(cfg.threads, 256), cfg.unroll)
    if shape.mode == "map":
        unroll = {8: 0, 4: 1, 2: 2, 1: 3}[cfg.unroll]
        return (max(0, regs_estimate(shape, cfg) - MAP_REGS), dist(cfg.threads, 128), cfg.threads > 128, unroll)
    blocks = base_blocks(shape, cfg) * cfg.splits
    fill = dist(min(blocks, 4 * sms), 4 * sms)
    unroll = {4: 0, 8: 1, 2: 2, 1: 3}[cfg.unroll] if small else {4: 0, 2: 1, 1: 2, 8: 3}[cfg.unroll]
    if shape.pair and shape.mode == "col" and shape.bytes == 2:
        # a 16-bit column pair issues about nine instructions a value: two vectors in flight and
        # more warps beat four (H200, logsumexp over the first axis of 8192 x 4096 bf16: 25.7 us
        # of kernel against 29.9)
        unroll = {2: 0, 4: 1, 1: 2, 8: 3}[cfg.unroll]
    regs = max(0, regs_estimate(shape, cfg) - REDUCE_REGS)
    if shape.mode == "row":
        # about 64 bytes of each kept element's R per thread (measured best on an H100: rows of
        # 8 KiB read by 128 threads)
        ideal = min(1024, max(1, _pow2_ceil(shape.nr * shape.bytes / 64)))
        return (round(fill), regs, dist(cfg.tpr, ideal), unroll, cfg.splits, dist(cfg.threads, 256))
    # 512 contiguous bytes a row of R: 32 lanes of 16-byte vectors, 128 lanes of fp32 scalars where
    # the kept axis is odd (H200, max over the first axis of 77 x 16 x 64 x 255 fp32: 128 lanes 22.4
    # us of kernel, 64 lanes 26.9, 32 lanes 35.6; eager 22.4)
    return (round(fill), regs, dist(cfg.tx * shape.vec * shape.bytes, 512), dist(cfg.threads, 256), unroll, cfg.splits)


def config_from_schedule(shape: PointwiseShape, schedule: Schedule) -> Config:
    """The configuration a schedule's kernel names in its options, or the first one the family
    proposes where it names none (a schedule written by hand)."""
    opts = schedule.kernels[0].options if len(schedule.kernels) == 1 else None
    if opts is not None and opts.warps is not None and opts.stages is not None:
        tpr = opts.threads_per_row if shape.mode != "map" else 1
        if shape.mode != "map" and tpr is None:
            raise CodegenError("pointwise: a reduction's kernel names its threads per row (threads_per_row)")
        cfg = Config(shape.mode, opts.warps * 32, opts.stages, tpr, opts.splits or 1)
        _check_config(shape, cfg)
        return cfg
    options = configs(shape)
    return options[len(options) // 2] if shape.mode != "map" else Config("map", 256, 2)


def regs_need(shape: PointwiseShape, cfg: Config) -> int:
    """The footprint formula: the vectors a thread holds in flight, ``UNROLL`` per loaded array
    (packed, 4 bytes a register, where the map kernel converts them one value at a time; unpacked,
    1.5 registers a value, where a reduction's accumulators take them; one register a value for
    strided arrays, whose values arrive one by one; one value for a broadcast array), one packed
    vector per output written in the pass, the fp32 accumulators, index arithmetic (2 per axis
    whose own index the pass computes and per index an index map reads; with 64-bit indices 4
    more in the map kernel, and 5 each and 16 more in a reduction, whose per-thread offsets and
    loop bounds are 64-bit too), one per map, and a fixed base for addresses and loop state (8
    more for the column kernel's shared-memory combine, 4 for aligned rows' head and vector count,
    8 where they feed a sum of products). A sum of products holds both factors unpacked."""
    b = shape.bytes
    # a reduction unrolled, or a sum of products (both factors converted before they multiply),
    # holds its vectors as fp32 values
    unpack = shape.mode != "map" and (cfg.unroll > 1 or len(shape.reduce_args) > 1)
    # ... except a 16-bit column pair, whose two passes convert each value from the packed vector
    # as they use it (sm_90a, bf16, 256 threads: 48 registers at two vectors in flight, 76 at four)
    unpack = unpack and not (shape.pair and shape.mode == "col" and shape.bytes == 2)
    g = _Gen(shape)

    def held(v: Value) -> int:
        kind, _ = g.access(v)
        if v is shape.rep_input and kind != "bcast":
            return 0  # loaded where it is used (below)
        if kind == "bcast":
            return 1
        if kind == "strided":
            return shape.vec
        return -(-shape.vec * 3 // 2) if unpack else -(-shape.vec * b // 4)

    # a cross tile's staging: each staged input's vectors of phase 1, all loaded before stored
    staging = 0
    if shape.cross:
        t = cross_tile(shape, cfg)
        staging = len(shape.staged) * t.stage_iters(cfg.threads) * -(-t.sv * b // 4) + 6 + (2 if shape.staged_out else 0)

    # a skinny product's small factor: its values at each of the rep elements, in flight beside
    # the large factor's (a broadcast scalar each), or, loaded where they are used, a packed vector
    # each (the compiler issues them together) and one unpacked (sm_90a, fp32, eight vectors of a
    # 512-long sum: 48 registers spilled 40 bytes)
    loads = sum(held(v) * (shape.nrep if v is shape.rep_input else 1) for v in shape.loop_inputs)
    use_loads = 0
    if shape.rep and g.access(shape.rep_input)[0] != "bcast":
        use_loads = shape.nrep * -(-shape.vec * b // 4) + -(-shape.vec * 3 // 2)
    stores = sum(-(-shape.vec * b // 4) for _ in shape.full_out)
    acc = 0 if shape.mode == "map" else (cfg.unroll if shape.mode == "row" else shape.vec) * shape.nrep
    if shape.pair:
        # a pair per accumulator, and what a fold holds: the vector's values (row), or the new
        # max of each kept value (col: the values are computed again for the sum, not held)
        acc = 2 * acc + shape.vec
    outer, loop = _pass_needs(shape, g)
    per, extra = (2, 0) if not shape.big else ((2, 4) if shape.mode == "map" else (5, 16))
    index = per * (len(outer) + len(loop) + sum(len(_index_axes(m)) for m in shape.loop)) + extra
    # aligned rows: the head and the vector count; a sum of products over them 4 more (sm_80, fp32
    # dot of 64 x 999 rows on 40 registers spilled 12 bytes)
    aligned = (8 if len(shape.reduce_args) > 1 else 4) if shape.aligned_rows else 0
    base = BASE_REGS + (8 if shape.mode == "col" else 0) + aligned
    # in the map kernel an input that does not hold the space in its order (a factor of an outer
    # product, a mean broadcast along the rows) has its own offset for each vector in flight
    # (sm_90a spilled 4 bytes at the budget without it: the outer product P[i]·Q[j] into O[j,i])
    offsets = 0
    if shape.mode == "map":
        staged = {id(v) for v in shape.staged}
        offsets = cfg.unroll * sum(tuple(v.axis_names) != tuple(shape.order) and id(v) not in staged
                                   for v in shape.loop_inputs)
    # a 16-bit kernel's division (hm_div) holds both operands scaled, for each value of the
    # vector it interleaves (sm_90a: an outer softmax's output map at eight vectors in flight
    # needed 154 registers, the formula without this 139)
    divs = sum(isinstance(m.op, Map) and m.op.fn == "div" for m in shape.loop) if half_math(shape.dtype) else 0
    return (base + cfg.unroll * loads + stores + acc + index + len(shape.loop) + offsets + 2 * shape.vec * divs
            + staging + use_loads)


def regs_estimate(shape: PointwiseShape, cfg: Config) -> int:
    """The register budget the model assumes and the kernel asks for (``__maxnreg__``): the
    footprint plus 4, rounded up to the allocation unit (8), within what a block may have."""
    budget = -(-(regs_need(shape, cfg) + 4) // 8) * 8
    return min(MAX_REGS, budget, (65536 // cfg.threads) // 8 * 8)


def smem_estimate(shape: PointwiseShape, cfg: Config) -> int:
    """Static shared memory: the column kernel's TY x TX*VEC fp32 partial vectors, a row
    kernel's block reduction scratch (32 floats); twice that for a pair reduction (the maxes and
    the sums); a cross tile (``TI x PITCH`` values) for each array a map stages."""
    if shape.mode == "map" and shape.cross:
        t = cross_tile(shape, cfg)
        return (len(shape.staged) + len(shape.staged_out)) * t.ti * t.pitch * shape.bytes
    pairs = 2 if shape.pair else 1
    if shape.mode == "col":
        return cfg.threads * shape.vec * 4 * pairs
    if shape.mode == "row" and cfg.tpr > 32:
        return 32 * 4 * pairs
    return 0


# ----------------------------------------------------------------------------- schedules


def _spread(axes: tuple[str, ...], sizes: dict, n: int) -> list[tuple[str, int]]:
    """Groups of ``axes`` (innermost first) that together hold about ``n`` elements."""
    out = []
    left = n
    for a in reversed(axes):
        g = max(1, min(left, sizes[a]))
        out.append((a, g))
        left = max(1, -(-left // g))
    return list(reversed(out))


def schedule_for(shape: PointwiseShape, cfg: Config, gpu: str | None) -> Schedule:
    """The schedule a configuration stands for: the block's tile of the space (map) or of the
    kept axes (reductions) grouped at SMEM, the reduction's loop a stream over one axis of R,
    every array in registers."""
    s = shape.sizes
    rel: list[Relabel] = []
    if shape.mode == "map" and shape.cross:
        t = cross_tile(shape, cfg)
        rel += [Relabel(shape.cross, min(s[shape.cross], t.tq), "SMEM", "group"),
                Relabel(shape.inner, min(s[shape.inner], t.ti), "SMEM", "group")]
    elif shape.mode == "map":
        tile = cfg.threads * cfg.unroll * shape.vec
        rel += [Relabel(a, g, "SMEM", "group") for a, g in _spread(shape.order, s, tile)]
    elif shape.mode == "row":
        rel += [Relabel(a, g, "SMEM", "group") for a, g in _spread(shape.kept, s, cfg.rows_per_block)]
        rel.append(Relabel(shape.inner, min(s[shape.inner], cfg.tpr * shape.vec * cfg.unroll), "SMEM", "stream"))
    else:
        rel += [Relabel(a, g, "SMEM", "group") for a, g in _spread(shape.kept, s, cfg.tx * shape.vec)]
        r = shape.red[-1]
        if shape.pair and shape.pair.maxes[-1].op.over in shape.red:
            r = shape.pair.maxes[-1].op.over  # the axis the pair's max ends on: its running shift
        rel.append(Relabel(r, min(s[r], cfg.tpr * cfg.unroll), "SMEM", "stream"))
    # a skinny product's own axes: whole in every block (each thread holds all of them)
    rel += [Relabel(a, s[a], "SMEM", "group") for a in shape.rep]
    d = shape.diagram
    boxes = tuple(d.name_of(v) for v in d.nodes)
    kernel = Kernel(NAME, boxes, tuple(rel), in_registers(d), family=NAME, options=cfg.options(shape))
    return Schedule(d, (kernel,), gpu, shape.dtype)


# ----------------------------------------------------------------------------- lowering


def _strides(v: Value, sizes: dict) -> dict[str, int]:
    return _strides_of(v.axis_names, sizes)


class _Gen:
    """Builds the CUDA pieces of one kernel: index decompositions, offsets, loads, stores and
    the elementwise statements, all from checked identifiers and numbers."""

    def __init__(self, shape: PointwiseShape):
        self.s = shape
        self.big = shape.big
        self.idx = Code("long long" if self.big else "int")

    def lit(self, n: int) -> Code:
        return c_i64(n) if self.big else c_int(n)

    def decompose(self, axes: tuple[str, ...], flat: Code, prefix: str, need: set) -> list[tuple[Code, Code]]:
        """``(variable, expression)`` of the indices along the axes in ``need`` from a flat index
        over ``axes`` (outermost first in ``axes``), innermost first."""
        out: list[tuple[Code, Code]] = []
        left = [a for a in axes if a in need]
        rem = flat
        for i, a in enumerate(reversed(axes)):
            if not left:
                break
            var = ident(a, prefix)
            if i == len(axes) - 1:
                out.append((var, rem))
                break
            n = self.s.sizes[a]
            if a in need:
                out.append((var, Code(f"{rem} % {self.lit(n)}")))
                left.remove(a)
            if left:
                q = ident(a, prefix + "q")
                out.append((q, Code(f"{rem} / {self.lit(n)}")))
                rem = q
        return out

    def part(self, v: Value, group: tuple[str, ...], flat: Code, prefix: str, need: set) -> list[Code]:
        """Terms of ``v``'s element offset along the axes of ``group`` (flat index ``flat``)."""
        have = [a for a in group if a in v.axis_names]
        if not have:
            return []
        st = _strides(v, self.s.sizes)
        names = v.axis_names
        if len(have) == len(group):
            pos = [names.index(a) for a in group]
            if pos == list(range(pos[0], pos[0] + len(group))):
                last = st[group[-1]]
                return [flat if last == 1 else Code(f"{flat} * {self.lit(last)}")]
        need.update(have)
        return [ident(a, prefix) if st[a] == 1 else Code(f"{ident(a, prefix)} * {self.lit(st[a])}") for a in have]

    @staticmethod
    def total(terms: list[Code]) -> Code:
        return Code(" + ".join(terms)) if terms else Code("0")

    def access(self, v: Value) -> tuple[str, int]:
        """How the pass moves ``v`` along the vector axis: ("vec", 1), ("strided", stride),
        ("staged", 0) (down a column of its cross tile in shared memory) or ("bcast", 0)."""
        inner = self.s.inner
        if inner not in v.axis_names:
            return "bcast", 0
        if v.axis_names[-1] == inner:
            return "vec", 1
        if self.s.cross is not None and v.axis_names[-1] == self.s.cross:
            return "staged", 0
        return "strided", _strides(v, self.s.sizes)[inner]

    def index_args(self, b: Value, prefix: str, in_loop: bool) -> list[Code]:
        out = []
        for a in _index_axes(b):
            var = ident(a, prefix)
            out.append(Code(f"({var} + e)") if in_loop and a == self.s.inner else var)
        return out


def _groups(shape: PointwiseShape) -> tuple[tuple[str, ...], Code, tuple[str, ...], Code]:
    """The axes the pass walks once per thread (the kept axes of a reduction) and per step (the
    space of a map, R of a reduction), with the flat index variable of each."""
    if shape.mode == "map":
        return (), Code("0"), shape.order, Code("flat")
    if shape.mode == "row":
        return shape.kept, Code("row"), shape.red, Code("rflat")
    return shape.kept, Code("kflat"), shape.red, Code("r")


def _pass_needs(shape: PointwiseShape, g: "_Gen") -> tuple[set[str], set[str]]:
    """The axes whose own index the pass computes (for index maps, and for the offsets of arrays
    that do not hold a group's axes together in its order), per group."""
    outer_group, outer_flat, loop_group, loop_flat = _groups(shape)
    outer_need: set[str] = set()
    loop_need: set[str] = set()
    for b in shape.loop:
        for a in _index_axes(b):
            (outer_need if a in outer_group else loop_need).add(a)
    # addressed by the tile's own coordinates
    staged = {id(v) for v in shape.staged} | {id(v) for _, v in shape.staged_out}
    for v in (*shape.loop_inputs, *(v for _, v in shape.full_out)):
        if id(v) in staged:
            continue
        g.part(v, outer_group, outer_flat, "i_", outer_need)
        g.part(v, loop_group, loop_flat, "i_", loop_need)
    return outer_need, loop_need


def _map_stmt(shape: PointwiseShape, b: Value, var, idx: list[Code]) -> Code:
    op = b.op
    if _is_product(b):  # x * y * …, multiplied left to right in fp32 registers, rounded once
        expr = var(b.args[0])
        for a in b.args[1:]:
            expr = map_expr("mul", [expr, var(a)])
        return Code(f"const float {ident(shape.name(b), 'a_')} = {expr};")
    get_function(op.fn)  # refuses functions outside the whitelist
    ns = [shape.sizes[a] for a in op.index_axes]
    expr = map_expr(op.fn, [var(a) for a in b.args], op.param_values(shape.sizes), idx, ns,
                    half=half_math(shape.dtype))
    return Code(f"const float {ident(shape.name(b), 'a_')} = {expr};")


def _how_text(shape: PointwiseShape) -> str:
    """The reduction, as the kernel's schedule comment names it."""
    if not shape.pair:
        return str(shape.how)
    return (f"the pair (max {shape.name(shape.pair.maxes[-1])}, sum {shape.name(shape.pair.sums[-1])} of exp(x - max)), "
            "the sum rescaled when the max grows (online softmax),")


def _part_name(shape: PointwiseShape, what: str = "partials") -> str:
    """A buffer name for the partials (or the arrival counters) that no array of the diagram has."""
    d = shape.diagram
    taken = {d.name_of(v) for v in (*d.inputs, *d.nodes)}
    want = f"{d.name}_{what}"
    if NAME_RE.match(want) and want not in taken:
        return want
    h = hashlib.sha1(d.name.encode()).hexdigest()[:10]
    return f"{what}_{h}"


def lower_shape(shape: PointwiseShape, cfg: Config, schedule: Schedule, arch: str,
                base: Code) -> tuple[list[KernelLaunch], list[Buffer]]:
    """The launch and the buffers (a split reduction's partials and its arrival counters)."""
    _check_config(shape, cfg)
    g = _Gen(shape)
    d = shape.diagram
    name = shape.name
    T = cuda_type(shape.dtype)
    mode = shape.mode
    split = cfg.splits > 1
    loop_inputs = shape.loop_inputs
    post_inputs = shape.post_inputs
    used_inputs = [v for v in d.inputs if any(v is u for u in (*loop_inputs, *post_inputs))]
    outputs = [(n, v) for n, v in (*shape.full_out, *shape.kept_out)]
    part = _part_name(shape) if split else None
    arrivals = _part_name(shape, "arrivals") if split else None

    outer_group, outer_flat, loop_group, loop_flat = _groups(shape)
    outer_need, loop_need = _pass_needs(shape, g)

    def offsets(v: Value) -> tuple[Code, Code]:
        ko = g.total(g.part(v, outer_group, outer_flat, "i_", outer_need))
        lo = g.total(g.part(v, loop_group, loop_flat, "i_", loop_need))
        return ko, lo

    hoisted: list[tuple[Code, Code]] = []      # per-thread offsets along the kept axes

    def placed(nm: str, v: Value) -> tuple[str, int, Code]:
        """How array ``v`` (called ``nm``) is accessed, its stride, and its offset: the part along
        the kept axes hoisted per thread, plus the part along the loop's axes."""
        kind, stride = g.access(v)
        ko, lo = offsets(v)
        koff = ident(nm, "koff_")
        hoisted.append((koff, ko))
        return kind, stride, Code(f"{koff} + {lo}")

    loads_decl: list[Code] = []
    loads: list[Code] = []
    use_loads: list[Code] = []     # loads issued where their values are used (a skinny product's small factor)
    vec_ptrs: list[Code] = []
    elem_loads: list[Code] = []
    one_loads: list[Code] = []     # aligned rows: one value of a row's head or tail into lane 0 of set 0
    head_ptr: Code | None = None   # aligned rows: where the first input's row starts
    staged_ids = {id(v) for v in shape.staged}
    rep_offsets = _rep_offsets(shape, g)
    for v in loop_inputs:
        nm = name(v)
        ptr, ld = ident(nm, "in_"), ident(nm, "ld_")
        if v is shape.rep_input:
            # the small factor of a skinny product: its values at each of the rep axes' elements,
            # each at a constant offset from the first. A broadcast scalar (the column kernel) is
            # loaded with the large factor's vectors; a vector (the row kernel) when it is used,
            # from L1 or L2 (it is small and every row reads it), so that only the large factor's
            # vectors take registers while in flight
            kind, stride, off = placed(nm, v)
            for m, c in enumerate(rep_offsets):
                ldm, at = ident(nm, f"ld{m}_"), Code(f"{off} + {c}")
                if kind == "bcast":
                    loads_decl.append(Code(f"T {ldm}[UNROLL];"))
                    loads.append(Code(f"{ldm}[u] = {ptr}[{at}];"))
                    elem_loads.append(Code(f"const float {ident(nm, f'a{m}_')} = napkin::to_float({ldm}[u]);"))
                    continue
                use_loads.append(Code(f"napkin_pwh::Pack<T, VEC> {ldm};"))
                if kind == "vec":
                    vec_ptrs.append(ptr)
                    use_loads.append(Code(f"napkin_pwh::load<T, VEC>({ldm}, {ptr} + ({at}), vec_ok);"))
                else:
                    use_loads.append(Code(f"napkin_pwh::load_strided<T, VEC>({ldm}, {ptr} + ({at}), {g.lit(stride)});"))
                elem_loads.append(Code(f"const float {ident(nm, f'a{m}_')} = napkin_pwh::value({ldm}, e);"))
            continue
        if id(v) in staged_ids:
            # VEC values down column ql of its cross tile, rows il .. il + VEC (phase 2)
            loads_decl.append(Code(f"napkin_pwh::Pack<T, VEC> {ld}[UNROLL];"))
            loads.append(Code(f"napkin_pwh::load_strided<T, VEC>({ld}[u], {ident(nm, 'sm_')} + il * PITCH + ql, "
                              "PITCH);"))
            elem_loads.append(Code(f"const float {ident(nm, 'a_')} = napkin_pwh::value({ld}[u], e);"))
            continue
        kind, stride, off = placed(nm, v)
        # aligned rows: an input of the reduced axes alone (the same values in every row) is not where
        # the row's vectors are in its 16-byte lines. 16-bit values: each vector is the two lines it
        # spans, shifted into place (H200, matvec 4097 x 12289 bf16: 38.8 -> 33.3 us against eight
        # 2-byte loads a vector); fp32 keeps its four scalar loads (51.7 us against 59.6 shifted)
        row_only = shape.aligned_rows and tuple(v.axis_names) != tuple(shape.order)
        if shape.aligned_rows:
            one_loads.append(Code(f"{ld}[0].x[0] = {ptr}[{off}];"))
            if not row_only:
                head_ptr = head_ptr or Code(f"{ptr} + {ident(nm, 'koff_')}")
        if kind == "bcast":
            loads_decl.append(Code(f"T {ld}[UNROLL];"))
            loads.append(Code(f"{ld}[u] = {ptr}[{off}];"))
            elem_loads.append(Code(f"const float {ident(nm, 'a_')} = napkin::to_float({ld}[u]);"))
        else:
            loads_decl.append(Code(f"napkin_pwh::Pack<T, VEC> {ld}[UNROLL];"))
            if kind == "vec" and shape.tail:   # the last vector may be partial: NU - flat values left
                vec_ptrs.append(ptr)
                loads.append(Code(f"napkin_pwh::load_n<T, VEC>({ld}[u], {ptr} + ({off}), vec_ok, NU - flat);"))
            elif kind == "vec" and row_only and shape.bytes == 2:
                loads.append(Code(f"napkin_pwh::load_shifted<T, VEC>({ld}[u], {ptr} + ({off}), VEC);"))
            elif kind == "vec" and row_only:
                loads.append(Code(f"napkin_pwh::load<T, VEC>({ld}[u], {ptr} + ({off}), false);"))
            elif kind == "vec" and shape.padded:
                loads.append(Code(f"napkin_pwh::load_shifted<T, VEC>({ld}[u], {ptr} + ({off}), kvalid);"))
            elif kind == "vec":
                vec_ptrs.append(ptr)
                loads.append(Code(f"napkin_pwh::load<T, VEC>({ld}[u], {ptr} + ({off}), vec_ok);"))
            else:
                loads.append(Code(f"napkin_pwh::load_strided<T, VEC>({ld}[u], {ptr} + ({off}), "
                                  f"{g.lit(stride)});"))
            elem_loads.append(Code(f"const float {ident(nm, 'a_')} = napkin_pwh::value({ld}[u], e);"))
    full_stores_decl: list[Code] = []
    full_stores: list[Code] = []
    elem_stores: list[Code] = []
    staged_out = {n for n, _ in shape.staged_out}
    for n, v in shape.full_out:
        ptr, st = ident(n, "out_"), ident(n, "st_")
        if n in staged_out:
            # VEC values down column ql of its cross tile (written along the cross axis in phase 3)
            full_stores_decl.append(Code(f"napkin_pwh::Pack<T, VEC> {st};"))
            elem_stores.append(Code(f"{st}.x[e] = napkin::from_float<T>({ident(name(v), 'a_')});"))
            full_stores.append(Code(f"napkin_pwh::store_strided<T, VEC>({ident(n, 'sm_')} + il * PITCH + ql, {st}, "
                                    "PITCH);"))
            continue
        kind, stride, off = placed(n, v)
        full_stores_decl.append(Code(f"napkin_pwh::Pack<T, VEC> {st};"))
        elem_stores.append(Code(f"{st}.x[e] = napkin::from_float<T>({ident(name(v), 'a_')});"))
        if kind == "vec" and shape.tail:
            vec_ptrs.append(ptr)
            full_stores.append(Code(f"napkin_pwh::store_n<T, VEC>({ptr} + ({off}), {st}, vec_ok, NU - flat);"))
        elif kind == "vec":
            vec_ptrs.append(ptr)
            full_stores.append(Code(f"napkin_pwh::store<T, VEC>({ptr} + ({off}), {st}, vec_ok);"))
        else:
            full_stores.append(Code(f"napkin_pwh::store_strided<T, VEC>({ptr} + ({off}), {st}, {g.lit(stride)});"))

    def loop_var(a: Value) -> Code:
        return ident(name(a), "a_")

    elem = list(elem_loads)
    for b in shape.loop:
        elem.append(_map_stmt(shape, b, loop_var, g.index_args(b, "i_", True)))
    red_in = Code(" * ".join(str(ident(name(a), "a_")) for a in shape.reduce_args)) if shape.chain else None
    # a skinny product: the product at each of the rep axes' elements
    rep_red_in = [Code(" * ".join(str(ident(name(a), f"a{m}_" if a is shape.rep_input else "a_"))
                                  for a in shape.reduce_args)) for m in range(shape.nrep)] if shape.rep else []

    # ---- after the reduction: per kept element kf (prefix k_)
    post_need: set[str] = set()
    for b in shape.post:
        post_need.update(_index_axes(b))
    post_loads = []

    def kept_terms(v: Value) -> list[Code]:
        """``v``'s offset at kept element kf (and rep element m of a skinny product)."""
        return g.part(v, shape.kept, Code("kf"), "k_", post_need) + g.part(v, shape.rep, Code("m"), "k_", post_need)

    for v in post_inputs:
        terms = kept_terms(v)
        post_loads.append(Code(f"const float {ident(name(v), 'a_')} = napkin::to_float("
                               f"{ident(name(v), 'in_')}[{g.total(terms)}]);"))
    post_stmts = [_map_stmt(shape, b, loop_var, g.index_args(b, "k_", False)) for b in shape.post]
    post_stores = []
    for n, v in shape.kept_out:
        terms = kept_terms(v)
        post_stores.append(Code(f"{ident(n, 'out_')}[{g.total(terms)}] = napkin::from_float<T>("
                                f"{ident(name(v), 'a_')});"))
    post_index = g.decompose(shape.kept, Code("kf"), "k_", post_need) + g.decompose(shape.rep, Code("m"), "k_", post_need)
    outer_index = g.decompose(outer_group, outer_flat, "i_", outer_need)
    loop_index = g.decompose(loop_group, loop_flat, "i_", loop_need)

    tile_ctx = _cross_context(shape, cfg, g) if shape.cross else {}
    vec_ok = _all_aligned(vec_ptrs, shape.vec, shape.bytes)
    if shape.aligned_rows:
        # every row starts at the same offset in each input: their vectors align together when the
        # inputs start at the same place in a 16-byte line (and on a value's boundary)
        p0 = vec_ptrs[0]
        same = "".join(f" | (reinterpret_cast<unsigned long long>({p0}) ^ reinterpret_cast<unsigned long long>({p}))"
                       for p in vec_ptrs[1:])
        vec_ok = Code(f"(reinterpret_cast<unsigned long long>({p0}) % {shape.bytes}ULL) == 0ULL"
                      + (f" && (({same[3:]}) % {shape.vec * shape.bytes}ULL) == 0ULL" if same else ""))

    params = [Code(f"const {T}* __restrict__ {ident(name(v), 'in_')}") for v in used_inputs]
    tensor_of = dict(shape.aliases)  # a view reads its array's tensor
    args = [Arg("tensor", tensor_of.get(name(v), name(v)), dtype=shape.dtype, axes=v.axis_names) for v in used_inputs]
    full_names = {n for n, _ in shape.full_out}
    for n, v in outputs:
        params.append(Code(f"{T}* __restrict__ {ident(n, 'out_')}"))
        args.append(Arg("tensor", n, dtype=shape.dtype, axes=v.axis_names))
    if split:
        params.append(Code(f"float* __restrict__ {ident(part, 'ws_')}"))
        args.append(Arg("tensor", part, dtype="fp32", axes=()))
        # 32-bit arrival counters, one a kept tile (grid.x), in a zeroed fp32 buffer (zero bits)
        params.append(Code(f"unsigned int* __restrict__ {ident(arrivals, 'cnt_')}"))
        args.append(Arg("tensor", arrivals, dtype="fp32", axes=()))

    red_axes_text = ", ".join(shape.red) or "(none)"
    kept_axes_text = ", ".join(shape.kept) or "(none)"
    space = ", ".join(shape.order)
    legend = [f"iteration space U = ({space}), flattened outermost first; vector axis {shape.inner} "
              f"(innermost): VEC = {shape.vec} consecutive values per thread"]
    if shape.flat:
        legend.append(f"vectors run over the flattened space (every array holds U in this order; {shape.inner} "
                      f"= {shape.sizes[shape.inner]} is no multiple of VEC)"
                      + (f": the last one holds the {shape.tail} values left (NU = {shape.nu})" if shape.tail else ""))
    sched = []
    if mode == "map" and shape.cross:
        t = cross_tile(shape, cfg)
        others = ", ".join(a for a in shape.order if a not in (shape.cross, shape.inner)) or "(none)"
        staged_names = [name(v) for v in shape.staged] + [n for n, _ in shape.staged_out]
        legend.append(f"cross axis {shape.cross} (innermost in {', '.join(staged_names)}): a block "
                      f"takes a tile of TQ = {t.tq} values of {shape.cross} by TI = LI * VEC = {t.ti} of {shape.inner} "
                      f"at one position of ({others}): blockIdx.x -> (t_o, t_q, t_i), t_i fastest (grid.x)")
        legend.append("phase 1: each staged input's tile read along the cross axis, SV values an access, into "
                      "shared memory [TI][PITCH = TQ + 1]; phase 2: flat = tbase + (t_q * TQ + ql) * SUQ + "
                      "t_i * TI + il, ql = threadIdx.x / LI + u * (THREADS / LI), il = (threadIdx.x % LI) * VEC; "
                      "phase 3: each staged output's tile written along the cross axis")
        legend.append(f"tunables: THREADS = {cfg.threads}, UNROLL = {cfg.unroll} (TQ = THREADS / LI * UNROLL), "
                      f"LI = {t.lanes}, VEC = {shape.vec}, SV = {t.sv}")
        sched.append(f"one cross tile of {t.tq} x {t.ti} values per block: staged arrays moved coalesced along "
                     f"{shape.cross}, the others along {shape.inner}")
    elif mode == "map":
        legend.append("U -> flat = ((blockIdx.x * UNROLL + u) * THREADS + threadIdx.x) * VEC, u < UNROLL (grid.x)")
        legend.append(f"tunables: THREADS = {cfg.threads}, UNROLL = {cfg.unroll}, VEC = {shape.vec}")
        sched.append(f"one tile of THREADS * UNROLL * VEC = {cfg.threads * cfg.unroll * shape.vec} values per block, "
                     "every load issued before the first use")
    elif mode == "row":
        legend.append(f"kept K = ({kept_axes_text}) -> row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / "
                      "THREADS_PER_ROW (grid.x)")
        legend.append(f"reduced R = ({red_axes_text}) -> rflat = (rv0 + u * THREADS_PER_ROW) * VEC, lanes "
                      "stride along R; split s = blockIdx.y takes CHUNK vectors of R (grid.y = SPLITS)")
        if shape.aligned_rows:
            legend.append(f"a row is a contiguous run of NR = {shape.nr} values in every input (no multiple of VEC): "
                          "its HEAD values before the first 16-byte boundary and the values after its last whole "
                          "vector are read one by one (split 0), rflat = HEAD + vector * VEC")
        legend.append(f"tunables: THREADS_PER_ROW = {cfg.tpr}, ROWS_PER_BLOCK = {cfg.rows_per_block}, "
                      f"UNROLL = {cfg.unroll}, VEC = {shape.vec}, SPLITS = {cfg.splits}")
        sched.append(f"{_how_text(shape)} over R in fp32: UNROLL accumulators per thread, then "
                     + ("a block reduction" if cfg.tpr > 32 else f"a {cfg.tpr}-lane shuffle reduction"))
    else:
        legend.append(f"kept K = ({kept_axes_text}) -> kflat = (blockIdx.x * TX + threadIdx.x % TX) * VEC (grid.x): "
                      "a warp's lanes on consecutive kept vectors (coalesced)")
        if shape.padded:
            legend.append(f"{shape.inner} = {shape.sizes[shape.inner]} is no multiple of VEC: each line of it holds NVN = "
                          f"{shape.line_vectors} vectors, the last partial (KVALID values): kv -> "
                          "kflat = (kv / NVN) * NINNER + (kv % NVN) * VEC; a vector is read from the 16-byte lines it "
                          "straddles, shifted into place")
        legend.append(f"reduced R = ({red_axes_text}) -> r = r_begin + threadIdx.x / TX + (k * UNROLL + u) * TY; "
                      "split s = blockIdx.y takes CHUNK rows of R (grid.y = SPLITS)")
        legend.append(f"tunables: TX = {cfg.tx}, TY = {cfg.tpr}, UNROLL = {cfg.unroll}, VEC = {shape.vec}, "
                      f"SPLITS = {cfg.splits}")
        sched.append(f"{_how_text(shape)} over R in fp32: VEC accumulators per thread, the TY partial vectors "
                     "combined in shared memory in a fixed order")
    if shape.rep:
        legend.append(f"skinny product: the small factor {name(shape.rep_input)}'s own axes ({', '.join(shape.rep)}) -> "
                      f"m < REP = {shape.nrep}, every one of them in each thread's registers (REP accumulators a "
                      f"value), so each vector of the large factor is read once; the kept outputs' m")
    legend.append(f"register budget: {regs_estimate(shape, cfg)} per thread (__maxnreg__), as the performance "
                  "model assumed")
    if split:
        sched.append(f"split reduction: SPLITS = {cfg.splits} fp32 partials per kept element in {part}; the "
                     f"last block of a kept tile to arrive (counters {arrivals}, self-resetting) combines "
                     "them in a fixed order (deterministic) and writes the kept outputs")
    sched.append("HBM: every input read once, every output written once")
    sched += [f"schedule: {r}" for k in schedule.kernels for r in k.relabels]

    nrv = _vectors_r(shape)
    ctx = dict(
        mode=mode, T=T, IDX=g.idx, dtype=shape.dtype, arch=comment(arch), diagram=comment(d.name),
        legend=[comment(s) for s in legend], schedule_lines=[comment(s) for s in sched],
        REGS=regs_estimate(shape, cfg), THREADS=cfg.threads, UNROLL=cfg.unroll, VEC=shape.vec,
        TPR=cfg.tpr, RPB=cfg.rows_per_block, TX=cfg.tx, TY=cfg.tpr, SPLITS=cfg.splits, split=split,
        NVEC=g.lit(shape.nvec), NU=g.lit(shape.nu), tail=shape.tail, NK=g.lit(shape.nk), NR=g.lit(shape.nr), NRV=g.lit(nrv),
        NKV=g.lit(shape.nkv), CHUNK=g.lit(chunk(shape, cfg) if mode != "map" else 1),
        op=Code(_OPS[shape.how or "sum"]) if not shape.pair else None, how=shape.how or "none",
        INV_COUNT=1.0 / shape.nr if shape.chain else 1.0, mean=shape.how == "mean",
        block_mode=mode == "row" and cfg.tpr > 32,
        vec_ok=vec_ok, params=params, hoisted=hoisted, outer_index=outer_index, loop_index=loop_index,
        loads_decl=loads_decl, loads=loads, use_loads=use_loads, elem=elem, red_in=red_in,
        full_stores_decl=full_stores_decl, full_stores=full_stores, elem_stores=elem_stores,
        post_index=post_index, post_loads=post_loads, post_stmts=post_stmts, post_stores=post_stores,
        red_out=ident(name(shape.reduce_out), "a_") if shape.chain else None,
        pair=shape.pair is not None, rep=bool(shape.rep), REP=shape.nrep, rep_red_in=rep_red_in,
        pair_out=ident(name(shape.pair.sums[-1]), "a_") if shape.pair else None,
        EXACT=Code("true" if shape.pair and shape.pair.exact else "false"),
        FAST=Code("false" if shape.dtype == "fp32" else "true"),
        FAST_PAIR=shape.pair is not None and shape.dtype != "fp32",
        ws=ident(part, "ws_") if split else None, cnt=ident(arrivals, "cnt_") if split else None,
        KPB=cfg.rows_per_block if mode == "row" else cfg.tx * shape.vec,
        aligned_rows=shape.aligned_rows, head_ptr=head_ptr, one_loads=one_loads,
        padded=shape.padded, NINNER=g.lit(shape.sizes[shape.inner]),
        NVN=g.lit(shape.line_vectors), tile=bool(shape.cross), **tile_ctx,
    )
    kernel = Code(f"{base}_{mode}")
    src = render(TEMPLATE, kernel=kernel, **ctx)
    g0 = grid(shape, cfg)
    launches = [KernelLaunch(
        name=str(kernel), source=src, grid=g0, block=(cfg.threads, 1, 1), shared_bytes=0, args=tuple(args),
        template=TEMPLATE,
        tunables=(("MODE", mode), ("THREADS", cfg.threads), ("UNROLL", cfg.unroll), ("VEC", shape.vec),
                  ("THREADS_PER_ROW", cfg.tpr), ("SPLITS", cfg.splits)),
        model_smem_bytes=smem_estimate(shape, cfg), model_regs_per_thread=regs_estimate(shape, cfg))]
    buffers = []
    if split:
        # a pair reduction's partials: the SPLITS maxes, then the SPLITS sums; a skinny product's
        # SPLITS x REP partial rows
        rows = cfg.splits * (2 if shape.pair else 1) * shape.nrep
        buffers.append(Buffer(part, ("split", "kept"), (rows, shape.nk), "fp32"))
        buffers.append(Buffer(arrivals, ("tile",), (g0[0],), "fp32", zeroed=True))
    return launches, buffers


def _rep_offsets(shape: PointwiseShape, g: "_Gen") -> list[Code]:
    """The small factor's offset at each element of a skinny product's rep axes (outermost
    first, the order the kept outputs' ``m`` counts in), from the first."""
    if not shape.rep:
        return []
    st = _strides(shape.rep_input, shape.sizes)
    out = []
    for m in range(shape.nrep):
        off, left = 0, m
        for a in reversed(shape.rep):
            off += (left % shape.sizes[a]) * st[a]
            left //= shape.sizes[a]
        out.append(g.lit(off))
    return out


def _cross_context(shape: PointwiseShape, cfg: Config, g: "_Gen") -> dict:
    """The template's values for a cross tile (:class:`CrossTile`): its sizes, the block's
    position in the other axes (``o_`` indices, ``tbase`` its flat offset in U), each staged
    input's shared tile, phase-1 loads and stores, and each staged output's tile and phase-3
    stores. A staged array's offset at tile row ``gi`` of the vector axis and value ``gq`` of the
    cross axis (its innermost, stride 1) is built from the tile's coordinates, not from a flat
    index."""
    t = cross_tile(shape, cfg)
    s = shape.sizes
    name = shape.name
    others = tuple(a for a in shape.order if a not in (shape.cross, shape.inner))
    su = _strides_of(shape.order, s)
    tile_outer = g.decompose(others, Code("t_o"), "o_", set(others)) if others else []
    tbase = g.total([Code(f"{ident(a, 'o_')} * {g.lit(su[a])}") for a in others])
    decl, loads, stores, out_stores = [], [], [], []
    ptrs = []

    def offset(v: Value) -> Code:
        st = _strides(v, s)
        terms = [Code(f"{ident(a, 'o_')} * {g.lit(st[a])}") for a in others if a in v.axis_names]
        return g.total(terms + [Code("gq"), Code(f"gi * {g.lit(st[shape.inner])}")])

    for v in shape.staged:
        nm = name(v)
        ptr, sm, sv = ident(nm, "in_"), ident(nm, "sm_"), ident(nm, "sv_")
        decl.append(Code(f"__shared__ T {sm}[TI * PITCH];"))
        decl.append(Code(f"napkin_pwh::Pack<T, SV> {sv}[STAGE_ITERS];"))
        if t.shifted:
            loads.append(Code(f"napkin_pwh::load_shifted<T, SV>({sv}[k], {ptr} + ({offset(v)}), "
                              "NQ - gq < SV ? (int)(NQ - gq) : SV);"))
        else:
            loads.append(Code(f"napkin_pwh::load_n<T, SV>({sv}[k], {ptr} + ({offset(v)}), stage_ok, NQ - gq);"))
        stores.append(Code(f"for (int e = 0; e < SV; ++e) {sm}[sil * PITCH + sq + e] = {sv}[k].x[e];"))
        ptrs.append(ptr)
    for n, v in shape.staged_out:
        ptr, sm = ident(n, "out_"), ident(n, "sm_")
        decl.append(Code(f"__shared__ T {sm}[TI * PITCH];"))
        out_stores.append(Code(f"napkin_pwh::Pack<T, SV> w; for (int e = 0; e < SV; ++e) w.x[e] = {sm}[sil * PITCH + sq + e]; "
                               f"napkin_pwh::store_n<T, SV>({ptr} + ({offset(v)}), w, stage_ok, NQ - gq);"))
        ptrs.append(ptr)
    # rows along the cross axis start off their 16-byte lines when shifted: outputs stored value by value
    stage_ok = Code("false") if t.shifted else _all_aligned(ptrs, t.sv, shape.bytes)
    return dict(LI=t.lanes, TQ=t.tq, SV=t.sv, NI=g.lit(s[shape.inner]), NQ=g.lit(s[shape.cross]),
                NIT=g.lit(t.nit), NQT=g.lit(t.nqt), SUQ=g.lit(su[shape.cross]),
                STAGE_ITERS=t.stage_iters(cfg.threads), tile_outer=tile_outer, tbase=tbase,
                stage_decl=decl, stage_loads=loads, stage_stores=stores, stage_ok=stage_ok,
                stage_out_stores=out_stores)


def _all_aligned(ptrs: list, n: int, nbytes: int) -> Code:
    """The check, run once per kernel, that every pointer in ``ptrs`` is aligned for an access of
    ``n`` values of ``nbytes`` bytes ("true" for one value, or no pointer)."""
    if n == 1 or not ptrs:
        return Code("true")
    return Code("((" + " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in ptrs)
                + f") % {n * nbytes}ULL) == 0ULL")


def _strides_of(axes: tuple[str, ...], sizes: dict) -> dict[str, int]:
    """Row-major strides of a space of ``axes`` (outermost first)."""
    out, st = {}, 1
    for a in reversed(axes):
        out[a] = st
        st *= sizes[a]
    return out


class PointwiseFamily:
    """Elementwise chains and reductions over any axes, fused, vectorised and coalesced."""

    name = NAME
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"warps", "stages", "threads_per_row", "splits", "regs_per_thread"})
    #: the planner's limit for a run of maps alone this family may take: a chain of any length up to
    #: the planner's own (``planner.MAX_ELEMENTWISE_BOXES``) is one kernel
    max_elementwise_boxes = 256

    def explain(self, diagram: Diagram) -> str | None:
        """None if the family takes ``diagram``, else why not."""
        s = _analysed(diagram)
        return s if isinstance(s, str) else None

    def matches(self, diagram: Diagram) -> bool:
        return self.explain(diagram) is None

    def _shape(self, diagram: Diagram) -> PointwiseShape:
        s = _analysed(diagram)
        if isinstance(s, str):
            raise CodegenError(f"pointwise family cannot run diagram {diagram.name!r}: {s}")
        return s

    def candidates(self, diagram: Diagram, gpu, dtype: str | None = None) -> list[Schedule]:
        shape = self._shape(diagram)
        key = getattr(gpu, "key", gpu)
        sms = int(getattr(gpu, "sms", 0) or 0) or _sms_of(key)
        return [schedule_for(shape, c, key) for c in configs(shape, sms)]

    def config(self, diagram: Diagram, schedule: Schedule) -> Config:
        return config_from_schedule(self._shape(diagram), schedule)

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu) -> dict:
        """Blocks, threads, registers and shared memory of the pass a schedule stands for, its
        bytes in flight (Little's law), the reduction's latency facts, and the partials of a split
        reduction, written and read back by the last block of each tile (``extra_hbm_bytes``; no
        second launch)."""
        shape = self._shape(diagram)
        cfg = config_from_schedule(shape, schedule)
        gx, gy, _ = grid(shape, cfg)
        # bytes in flight: the vectors of the arrays read fresh from HBM for every element (those
        # holding every axis of U); a broadcast array is read by every block from L2
        fresh = [v for v in shape.loop_inputs if set(v.axis_names) == set(shape.order)]
        per_vec = sum(shape.vec * shape.bytes if shape.inner in v.axis_names else shape.bytes for v in fresh)
        in_flight = cfg.unroll * max(per_vec, shape.vec * shape.bytes)
        idle = 0.0
        if shape.mode == "map" and shape.cross:
            t = cross_tile(shape, cfg)
            nq, ni = shape.sizes[shape.cross], shape.sizes[shape.inner]
            idle = 1.0 - (nq * ni) / (t.nqt * t.tq * t.nit * t.ti)
        elif shape.mode == "map":
            nv = shape.nvec
            idle = 1.0 - nv / (gx * cfg.threads * cfg.unroll)
        elif shape.mode == "row":
            lanes = min(cfg.tpr, chunk(shape, cfg))
            idle = 1.0 - (lanes / cfg.tpr) * (shape.nk / (gx * cfg.rows_per_block))
        else:
            rows = min(cfg.tpr, chunk(shape, cfg))
            kv = shape.nkv
            idle = 1.0 - (rows / cfg.tpr) * (kv / (gx * cfg.tx))
            # a row of fewer than 32 contiguous bytes wastes the rest of its sector
            run = cfg.tx * shape.vec * shape.bytes
            if shape.kept and shape.inner == shape.kept[-1] and run < _SECTOR:
                idle = 1.0 - (1.0 - idle) * run / _SECTOR
        est = dict(blocks=gx * gy, threads=cfg.threads, regs=regs_estimate(shape, cfg),
                   smem=smem_estimate(shape, cfg), in_flight_bytes_per_thread=in_flight,
                   idle_lanes=min(0.95, max(0.0, idle)), bytes_per_value=shape.bytes, stream_steps=0,
                   reductions=0 if shape.mode == "map" else 1,
                   threads_per_row=1 if shape.mode == "map" else cfg.tpr)
        if cfg.splits > 1:
            est["extra_hbm_bytes"] = 2 * 4 * cfg.splits * shape.nk * shape.nrep * (2 if shape.pair else 1)
        if any(isinstance(v.op, Contract) for v in shape.chain):
            est["products_on_cuda"] = True  # fp32 FMAs, whatever the dtype
        if shape.rep:
            # a skinny product computes REP products a value once a step's vectors arrive, and loads
            # the next step's after: its compute and memory times add (H200, bf16, 8192 x 4096 by b
            # vectors in the column kernel: 27.6 us at b = 4, 35.6 at b = 8, where HBM alone is 16)
            est["overlap_memory"] = False
            if shape.mode == "row":
                # and every row reads the whole small factor again, a vector of it for each vector of
                # the large factor, through L1: priced as 2 bytes a value at the L2 rate, what fits the
                # H200 (8192 x 4096 by b vectors: bf16 27.2 / 35.2 / 61.2 us at b = 2 / 4 / 8, fp32
                # 49.6 at b = 4, where HBM alone is 14 and 28)
                est["extra_l2_bytes"] = float(shape.nk * shape.nrep * shape.nr * 2)
        return est

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        shape = self._shape(diagram)
        if len(schedule.kernels) != 1:
            raise CodegenError(f"pointwise family runs one fused kernel; the schedule has {len(schedule.kernels)}")
        cfg = config_from_schedule(shape, schedule)
        check_derived(NAME, schedule.kernels[0].name, schedule.kernels[0].options, cfg.options(shape))
        base = Code(f"{ident(diagram.name)}_pointwise")
        launches, buffers = lower_shape(shape, cfg, schedule, arch, base)
        return Program(diagram=diagram, schedule=schedule, family=NAME, launches=tuple(launches),
                       buffers=tuple(buffers), sizes=dict(shape.sizes))


def _sms_of(key) -> int:
    try:
        from ..select import resolve_gpu

        return int(resolve_gpu(key).sms)
    except Exception:  # noqa: BLE001 - no profile by that name: a full-size part
        return 132


FAMILY = PointwiseFamily()
