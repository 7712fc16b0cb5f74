"""Fused elementwise epilogues and score modifiers: whitelisted maps as per-element CUDA code.

A chain (in general a small DAG) of elementwise :class:`~napkin.diagrams.ops.Map` boxes that
follows a box a kernel computes in registers (the contraction of a matmul, the scores of
attention) runs on each element while it is still in registers. This module turns such maps into
C++ statements built only from the whitelisted expressions ``FUNCTIONS[fn].cuda`` (through
:func:`napkin.codegen.render.map_expr`), so a diagram can never put its own code into a kernel:

- the value the chain starts from is the variable ``acc`` (fp32);
- an extra diagram input read by a map (a bias ``bias[c]``, a residual ``R[a,c]``) becomes a
  kernel pointer argument ``x_<name>``, read at the element's position through its strides, in
  fp32;
- the index of an axis (for masks and ALiBi) is the C++ variable the caller names for it
  (``index_vars``), its size an integer literal (sizes are bound at lowering);
- scalar parameters become float literals (they are constants of the diagram).

>>> from napkin.diagrams import library
>>> d = library.get("mlp").bind(a=64, b=32, c=48)
>>> H = d.value("H")
>>> code = epilogue_code(d, H, d.outputs[0], index_vars={"a": "i_a", "c": "i_c"}, ctype_name="bf16")
>>> code.lines[0]
'const float e1 = napkin::to_float(x_bias[(long long)(i_c)]);'
>>> [p.arg.name for p in code.params]
['bias']
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ...diagrams.diagram import Diagram
from ...diagrams.functions import FUNCTIONS
from ...diagrams.ops import Map, Value
from ...errors import CodegenError
from ..program import Arg
from ..render import Code, c_float, cuda_type, half_math, ident, map_expr
from ..render import render as framework_render

__all__ = [
    "Param", "MapCode", "ScoreChain", "cuda_float", "short_hash", "ctype", "contiguous_strides",
    "check_int32", "check_index_size", "stride_param", "render", "tensor_param", "int_param",
    "float_param", "signature",
    "epilogue_code", "epilogue_nodes", "check_epilogue", "score_chain",
]


# ------------------------------------------------------------------ small helpers

def cuda_float(x: float) -> Code:
    """A C++ float literal for ``x`` (``0.125f``, ``(-2.0f)``, ``INFINITY``); NaN is refused."""
    if math.isnan(float(x)):
        raise CodegenError("a NaN parameter cannot be written into a kernel")
    return c_float(x)


def short_hash(*parts: object) -> str:
    """Eight hex digits that tell kernel variants apart in their names."""
    h = hashlib.sha1("\x1f".join(map(str, parts)).encode("utf-8")).hexdigest()
    return h[:8]


def ctype(dtype: str) -> Code:
    """The CUDA element type of a dtype the fused families run (bf16, fp16, fp32)."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise CodegenError(f"dtype {dtype!r} is not supported by the fused families (bf16, fp16, fp32)")
    return cuda_type(dtype)


def contiguous_strides(v: Value) -> dict[str, int]:
    """Element strides of a contiguous (row-major in axis order) array, by axis name."""
    strides: dict[str, int] = {}
    s = 1
    for a in reversed(v.axes):
        strides[a.name] = s
        s *= a.bound_size
    return strides


def check_int32(value: int, what: str) -> int:
    """``value`` if it fits a 32-bit int kernel argument, else a CodegenError."""
    if not -(2 ** 31) <= int(value) < 2 ** 31:
        raise CodegenError(f"{what} = {value} does not fit a 32-bit kernel argument")
    return int(value)


def render(template: str, **context) -> str:
    """Render a family template through the framework's whitelisted Jinja environment."""
    return framework_render(template, **context)


# ------------------------------------------------------------------ kernel parameters

@dataclass(frozen=True)
class Param:
    """One kernel parameter: its launch :class:`Arg` and its C++ declaration."""

    arg: Arg
    decl: Code


def tensor_param(v: Value, cname: str, ctype_name: str, *, const: bool = True,
                 name: str | None = None) -> Param:
    """A pointer parameter ``cname`` for the diagram array ``v``; the launch binds the tensor
    called ``name`` (default ``v.name``: an input's name; pass an output's diagram name)."""
    q = "const " if const else ""
    return Param(Arg("tensor", name or v.name, dtype=v.dtype, axes=v.axis_names),
                 Code(f"{q}{ctype(ctype_name)}* __restrict__ {ident(cname)}"))


def tensormap_param(v: Value, cname: str, box: tuple[int, ...], *, name: str | None = None,
                    view: tuple[int, ...] = ()) -> Param:
    """A TMA tensor map of the diagram input ``v`` passed by value (``const __grid_constant__``);
    the launch encodes it from the tensor called ``name`` (default ``v.name``; a buffer holding a
    copy of it) with copies of ``box = (inner, outer)`` elements, or ``(inner, middle, 1)`` for
    the 3-D view that keeps the array's last two axes, and a 128-byte swizzle
    (:func:`napkin.kernels.tma.tensor_map`). ``view``: the map's dimensions as positions of ``v``'s
    axes, innermost first, one box size each (:func:`napkin.kernels.tma.view_dims`)."""
    return Param(Arg("tmap", name or v.name, value=tuple(int(b) for b in box), dtype=v.dtype, axes=v.axis_names,
                     view=tuple(int(i) for i in view)),
                 Code(f"const __grid_constant__ napkin::TensorMap {ident(cname)}"))


def int_param(cname: str, value: int, what: str | None = None) -> Param:
    """An ``int`` parameter with its launch value."""
    return Param(Arg("int", cname, value=check_int32(value, what or cname)), Code(f"int {ident(cname)}"))


def stride_param(cname: str, value: int, what: str | None = None) -> Param:
    """An element stride the kernel only multiplies in 64 bits (``(long long)i * s``): an ``int``
    where it fits, else a ``long long`` (arrays past 2^31 elements along one woven axis)."""
    value = int(value)
    if -(2 ** 31) <= value < 2 ** 31:
        return int_param(cname, value, what)
    return Param(Arg("i64", cname, value=value), Code(f"long long {ident(cname)}"))


#: The largest axis size a kernel indexing in 32-bit ints can take.
INT32_MAX = 2 ** 31 - 1


def check_index_size(size: int, what: str, headroom: int = 0, family: str = "") -> int:
    """``size`` if ``size + headroom`` fits the 32-bit ints a kernel indexes an axis with (a tile
    of ``headroom`` past the last element is computed), else a CodegenError naming ``what`` (the
    array and its axis) and the size. Lowering then hands the diagram to the fallback family,
    whose indices are 64-bit."""
    limit = INT32_MAX - int(headroom)
    if int(size) > limit:
        who = f"the {family} kernel" if family else "this kernel"
        raise CodegenError(f"{what} has size {size}: {who} indexes it with 32-bit ints and takes at "
                           f"most {limit} (the fallback family indexes in 64 bits)")
    return int(size)


def index_size_problem(sizes, checks, family: str) -> str | None:
    """The first of ``checks`` (``(size, what, headroom)``) that :func:`check_index_size` refuses, as
    a sentence for a family's ``explain`` (so the planner never picks a kernel its template cannot
    index), or None."""
    for size, what, headroom in checks:
        if isinstance(size, int):
            try:
                check_index_size(size, what, headroom, family)
            except CodegenError as e:
                return str(e)
    return None


def float_param(cname: str, value: float) -> Param:
    """A ``float`` parameter with its launch value."""
    return Param(Arg("float", cname, value=float(value)), Code(f"float {ident(cname)}"))


def signature(params: Sequence[Param]) -> Code:
    """The parameter list of a kernel, one parameter a line; two parameters of one name (names
    built from diagram names that happen to meet) are refused before any CUDA exists."""
    seen: set[str] = set()
    for p in params:
        name = str(p.decl).split()[-1]
        if name in seen:
            raise CodegenError(f"kernel parameter {name!r} would be declared twice (diagram names "
                               "collide with generated names); rename an axis or an array")
        seen.add(name)
    return Code(",\n    ".join(p.decl for p in params))


# ------------------------------------------------------------------ elementwise code

@dataclass
class MapCode:
    """Statements that compute maps per element.

    ``lines`` are C++ statements (``const float e3 = ...;``) in the scope of ``acc`` (the start
    value), the index variables given and the parameters ``params``; ``result`` names the
    variable holding the final value.
    """

    lines: list[Code] = field(default_factory=list)
    result: Code = Code("acc")
    params: list[Param] = field(default_factory=list)
    boxes: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    tiles: list[str] = field(default_factory=list)  # extra inputs read through ``tile_reads``

    def body(self, indent: str = "") -> Code:
        """The statements, one a line (each but the first indented by ``indent``)."""
        return Code(("\n" + indent).join(self.lines))

    @property
    def is_identity(self) -> bool:
        return not self.lines and self.result == "acc"


def _index_sizes(diagram: Diagram, op: Map, index_vars: Mapping[str, str], what: str):
    idx, sizes = [], []
    for a in op.index_axes:
        if a not in index_vars:
            raise CodegenError(f"map {op.fn} reads the index of axis {a!r}, which the {what} does not "
                               "know per element")
        idx.append(Code(index_vars[a]))
        size = diagram.axes[a].size
        if not isinstance(size, int):
            raise CodegenError(f"map {op.fn} needs the size of axis {a!r}; bind it first")
        sizes.append(size)
    return idx, sizes


def _params(diagram: Diagram, op: Map) -> tuple[float, ...]:
    try:
        params = op.param_values(diagram.sizes)
    except Exception as e:  # noqa: BLE001 - a DiagramError for an unbound parameter
        raise CodegenError(f"map {op.fn}: {e}") from None
    for p in params:
        if math.isnan(p):
            raise CodegenError(f"map {op.fn}: parameter is NaN")
    return params


class _EpilogueBuilder:
    def __init__(self, diagram: Diagram, start: Value, index_vars: Mapping[str, str], ctype_name: str,
                 prefix: str, start2: Value | None = None, tile_reads: Mapping[str, str] | None = None):
        self.d = diagram
        self.tile_reads = dict(tile_reads or {})
        self.index_vars = dict(index_vars)
        self.ctype = ctype_name
        self.prefix = prefix
        self.code = MapCode()
        self._memo: dict[int, Code] = {id(start): Code("acc")}
        if start2 is not None:
            self._memo[id(start2)] = Code("acc2")
        self._n = 0

    def _var(self) -> Code:
        self._n += 1
        return Code(f"{self.prefix}{self._n}")

    def _extra(self, v: Value) -> Code:
        if v.name in self.tile_reads:  # the kernel stages this input's tile and reads it there
            var = self._var()
            self.code.lines.append(Code(f"const float {var} = {self.tile_reads[v.name]};"))
            self.code.extras.append(v.name)
            self.code.tiles.append(v.name)
            return var
        missing = [n for n in v.axis_names if n not in self.index_vars]
        if missing:
            raise CodegenError(f"epilogue input {v.label()} carries axes {missing} that the kernel's "
                               "output does not; it cannot be read per output element")
        strides = contiguous_strides(v)
        cname = ident(v.name, "x_")
        self.code.params.append(tensor_param(v, cname, self.ctype))
        terms = []
        for a in v.axis_names:
            iv = self.index_vars[a]
            if strides[a] == 1:
                terms.append(f"(long long)({iv})")
            else:
                sname = ident(f"{v.name}_{a}", "s_") if len(f"{v.name}_{a}") <= 32 else None
                used = {str(p.decl).split()[-1] for p in self.code.params}
                if sname is None or sname in used:  # too long, or R[a_c] meeting R_a[c]: s_R_a_c
                    sname = ident(f"e{len(self.code.params)}_{a}", "s_")
                self.code.params.append(stride_param(sname, strides[a], f"stride of {v.label()} along {a}"))
                terms.append(f"(long long)({iv}) * {sname}")
        off = " + ".join(terms) if terms else "0"
        var = self._var()
        self.code.lines.append(Code(f"const float {var} = napkin::to_float({cname}[{off}]);"))
        self.code.extras.append(v.name)
        return var

    def emit(self, v: Value) -> Code:
        if id(v) in self._memo:
            return self._memo[id(v)]
        if v.is_input:
            var = self._extra(v)
        elif isinstance(v.op, Map):
            op: Map = v.op
            xs = [self.emit(a) for a in v.args]
            idx, sizes = _index_sizes(self.d, op, self.index_vars, "kernel")
            expr = map_expr(op.fn, xs, _params(self.d, op), idx, sizes, half=half_math(v.dtype))
            var = self._var()
            self.code.lines.append(Code(f"const float {var} = {expr};"))
            self.code.boxes.append(self.d.name_of(v))
        else:
            raise CodegenError(f"box {self.d.name_of(v)} ({v.op.kind}) is not elementwise; it "
                               "cannot be fused as an epilogue")
        self._memo[id(v)] = var
        return var


def epilogue_code(diagram: Diagram, start: Value, end: Value, *, index_vars: Mapping[str, str],
                  ctype_name: str, prefix: str = "e", start2: Value | None = None,
                  tile_reads: Mapping[str, str] | None = None) -> MapCode:
    """Per-element statements computing ``end`` from ``start`` (held in ``acc``) through maps.

    ``index_vars`` names the C++ variable of each output axis's index; ``ctype_name`` is the
    dtype extra inputs are stored in; ``start2`` is a second start value (a dual contraction's
    other sum), held in ``acc2``. ``tile_reads`` maps an extra input's name to the C++ expression
    (a float) that reads the element from a copy the kernel made itself (a tile in shared
    memory): that input gets no parameter here, the kernel passes it, and ``MapCode.tiles`` lists
    it.

    >>> from napkin.diagrams import library
    >>> d = library.get("mlp").bind(a=64, b=32, c=48)
    >>> code = epilogue_code(d, d.value("H"), d.outputs[0], index_vars={"a": "i_a", "c": "i_c"},
    ...                      ctype_name="bf16", tile_reads={"bias": "napkin::to_float(tB[tile_c])"})
    >>> code.lines[0], code.tiles, code.params
    ('const float e1 = napkin::to_float(tB[tile_c]);', ['bias'], [])
    """
    b = _EpilogueBuilder(diagram, start, index_vars, ctype_name, prefix, start2, tile_reads)
    b.code.result = b.emit(end)
    return b.code


def epilogue_nodes(diagram: Diagram, start: Value) -> list[Value]:
    """The boxes that come after ``start`` in the diagram's order."""
    nodes = list(diagram.nodes)
    return nodes[nodes.index(start) + 1:] if start in nodes else []


def check_epilogue(diagram: Diagram, start: Value, before: Sequence[Value] = ()) -> str | None:
    """Why the boxes other than ``start`` cannot be a fused epilogue of it, or None if they can.

    They must all be whitelisted maps over (a subset of) ``start``'s axes whose inputs are
    ``start``, other such maps, or diagram inputs carrying only ``start``'s axes; the diagram has
    one output, computed from ``start`` and carrying exactly its axes. The boxes ``before`` (a
    prologue the kernel runs on an operand) are not part of the epilogue.
    """
    outs = diagram.outputs
    if len(outs) != 1:
        return f"the diagram has {len(outs)} outputs; this family writes one"
    start_axes = set(start.axis_names)
    skip = {id(start), *(id(v) for v in before)}
    for v in diagram.nodes:
        if id(v) in skip:
            continue
        if not isinstance(v.op, Map):
            return f"box {diagram.name_of(v)} ({v.op.kind}) is not elementwise"
        if v.op.fn not in FUNCTIONS:
            return f"map {v.op.fn} is not whitelisted"
        if not set(v.axis_names) <= start_axes:
            return (f"map {diagram.name_of(v)} carries axes {list(v.axis_names)} beyond those of "
                    f"{diagram.name_of(start)} {list(start.axis_names)}")
    out = outs[0]
    if out is not start and not out.depends_on(start):
        return "the output does not depend on the contraction"
    if set(out.axis_names) != start_axes:
        return f"the output carries axes {list(out.axis_names)}, not {list(start.axis_names)}"
    return None


# ------------------------------------------------------------------ score chains (attention)

@dataclass
class ScoreChain:
    """The maps between the scores S = Q·Kᵀ and the softmax, arranged for a streamed kernel.

    ``factor``: positive scales folded into the softmax's exp2 (``scale_log2 = factor·log2 e``);
    ``full``: statements for every other map, masks included; ``nomask``: the same without the
    masks (right wherever no mask fires); ``masks``: ``(fn, params, index_axes)`` of each mask;
    ``masks_last``: no map other than a positive scale follows a mask, so masked scores reach the
    softmax as -inf and key blocks wholly masked may be skipped.
    """

    factor: float
    full: MapCode
    nomask: MapCode
    masks: list[tuple[str, tuple[float, ...], tuple[str, ...]]]
    masks_last: bool
    boxes: list[str]


def score_chain(diagram: Diagram, maps: Sequence[Value], *, index_vars: Mapping[str, str]) -> ScoreChain:
    """Fold positive scales into one factor; write the other maps as statements on ``acc``.

    The chain is unary (each map reads the previous value only). A mask sets scores to -inf and
    so commutes with a positive scale: ``mask(f·e) = f·mask(e)`` lets the factor travel to the
    softmax; any other map sees the true value (the pending factor is applied first).
    """
    factor = 1.0
    masks: list[tuple[str, tuple[float, ...], tuple[str, ...]]] = []
    full, nomask = MapCode(), MapCode()
    boxes: list[str] = []
    other_after_mask = False
    cur_full, cur_nomask = Code("acc"), Code("acc")
    n = 0
    for v in maps:
        op = v.op
        if not isinstance(op, Map) or len(v.args) != 1:
            raise CodegenError(f"score modifier {diagram.name_of(v)} is not a unary map")
        f = FUNCTIONS.get(op.fn)
        if f is None:
            raise CodegenError(f"map {op.fn} is not whitelisted")
        params = _params(diagram, op)
        boxes.append(diagram.name_of(v))
        if op.fn == "scale" and params[0] > 0:
            factor *= params[0]
            continue
        idx, sizes = _index_sizes(diagram, op, index_vars, "attention kernel")
        half = half_math(v.dtype)
        n += 1
        var = Code(f"s{n}")
        if f.is_mask:
            masks.append((op.fn, tuple(params), tuple(op.index_axes)))
            full.lines.append(Code(f"const float {var} = {map_expr(op.fn, [cur_full], params, idx, sizes, half)};"))
            cur_full = var
            continue
        if masks:
            other_after_mask = True
        if factor != 1.0:
            lit = cuda_float(factor)
            fv = Code(f"{var}f")
            full.lines.append(Code(f"const float {fv} = {cur_full} * {lit};"))
            nomask.lines.append(Code(f"const float {fv} = {cur_nomask} * {lit};"))
            cur_full = cur_nomask = fv
            factor = 1.0
        full.lines.append(Code(f"const float {var} = {map_expr(op.fn, [cur_full], params, idx, sizes, half)};"))
        nomask.lines.append(Code(f"const float {var} = {map_expr(op.fn, [cur_nomask], params, idx, sizes, half)};"))
        cur_full = cur_nomask = var
    full.result, nomask.result = cur_full, cur_nomask
    full.boxes = nomask.boxes = boxes
    if factor <= 0:
        raise CodegenError("the softmax scale must be positive")
    return ScoreChain(factor, full, nomask, masks, not other_after_mask, boxes)
