"""Layout of a neural circuit diagram: columns, wire tracks and box positions as plain data.

The layout is computed once, in pure Python, and is then turned into SVG by
:mod:`napkin.diagrams.render`. It is deterministic (no hashing of ids reaches the
output, every tie is broken by position in the diagram) and every coordinate is a
float in SVG user units.

The picture reads left to right:

- **columns**: column 0 holds inputs; column ``k`` holds the boxes at longest-path
  depth ``k`` (independent boxes share a column); the last column holds the outputs.
  With many inputs (``RenderOptions.inputs``), an input enters in the column just
  before its first use instead of on the far left.
- **slices**: between column ``k`` and ``k + 1`` every live array is a bundle of
  parallel wires, one per axis. The slice starts with a straight *label region* where
  new arrays are named and their wires labelled (``q 4096``) and where tuple segments
  are separated by dashed lines, and ends with a *curve region* where bundles bend
  towards the ports of the next column (forking where an array is copied).
- **boxes**: a box's own axes (contracted or normalised) end at its left edge; woven
  axes run through the box as lighter lines; an elementwise input that lacks an axis
  the box weaves over is broadcast (a small copy marker).

>>> from napkin.diagrams import library
>>> lay = compute_layout(library.get("attention"))
>>> [b.label for b in lay.boxes]
['Σ d', 'scale(1/√(d))', 'softmax x', 'Σ x']
>>> lay.n_columns
6
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Mapping

import sympy

from ..errors import DiagramError
from .ops import Contract, Map, Rename, Value

#: Memory levels in hierarchy order (the names ``napkin.perfmodel.hardware`` uses) and their colours.
LEVEL_COLORS: dict[str, str] = {
    "HBM": "#c62828",   # red
    "L2": "#ef6c00",    # orange
    "SMEM": "#1565c0",  # blue
    "RF": "#2e7d32",    # green
    "TC": "#6a1b9a",    # purple
}

_LEVEL_ALIASES = {"GMEM": "HBM", "DRAM": "HBM", "SHARED": "SMEM", "REG": "RF", "REGS": "RF",
                  "REGISTERS": "RF", "TENSOR": "TC"}


def level_name(level: str) -> str:
    """The canonical level name for ``level`` (case-insensitive; GMEM → HBM, REG → RF)."""
    if not isinstance(level, str):
        raise DiagramError(f"memory level {level!r} is not a string; use one of {', '.join(LEVEL_COLORS)}")
    key = level.strip().upper()
    key = _LEVEL_ALIASES.get(key, key)
    if key not in LEVEL_COLORS:
        raise DiagramError(f"unknown memory level {level!r}; use one of {', '.join(LEVEL_COLORS)}")
    return key


@dataclass(frozen=True)
class RenderOptions:
    """Sizes, fonts and colours of a rendered diagram (all lengths in SVG user units).

    ``inputs``: ``"left"`` puts every input in column 0 (the paper's look), ``"late"`` lets
    an input enter just before its first use, ``"auto"`` is ``left`` up to ``late_after``
    inputs and ``late`` beyond.
    """

    pitch: float = 16.0            # vertical distance between the wires of one bundle
    name_height: float = 14.0      # room above a new bundle for its array name
    item_gap: float = 14.0         # vertical gap between the items of one column
    port_gap: float = 8.0          # gap between two input bundles on a box's left edge
    box_header: float = 20.0       # height of the strip holding the box label
    box_pad: float = 5.0           # padding above and below the ports inside a box
    box_pad_x: float = 12.0        # horizontal padding around the box label
    box_min_width: float = 60.0
    join_depth: float = 12.0       # how far inside a contraction box the contracted wires meet
    stub: float = 10.0             # length of input/output wire ends in their column
    curve_min: float = 28.0        # shortest curve region of a slice
    curve_max: float = 140.0       # longest curve region of a slice
    curve_slope: float = 0.5       # curve region length per unit of vertical displacement
    margin: float = 16.0
    font_family: str = "monospace"
    font_size: float = 10.0        # axis labels on wires
    name_font_size: float = 11.0   # array names
    box_font_size: float = 12.0    # box labels
    title_font_size: float = 14.0
    char_width: float = 0.6        # width of one character in font sizes (monospace)
    wire_color: str = "#333333"
    wire_width: float = 1.4
    woven_opacity: float = 0.4
    box_fill: str = "#f4f1e8"
    box_stroke: str = "#333333"
    sep_color: str = "#999999"
    label_color: str = "#555555"
    name_color: str = "#111111"
    background: str = "#ffffff"
    show_sizes: bool = True
    inputs: str = "auto"
    late_after: int = 4

    @classmethod
    def from_style(cls, style) -> "RenderOptions":
        """``None``, a RenderOptions, or a dict of field overrides."""
        if style is None:
            return cls()
        if isinstance(style, RenderOptions):
            return style
        if isinstance(style, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(style) - known)
            if unknown:
                raise DiagramError(f"unknown render style option(s) {unknown}; known: {sorted(known)}")
            return replace(cls(), **dict(style))
        raise DiagramError(f"style must be None, a RenderOptions or a dict, got {type(style).__name__}")

    def text_width(self, text: str, size: float) -> float:
        """Estimated width of ``text`` at font size ``size`` (monospace: fixed advance)."""
        return len(text) * size * self.char_width


# ------------------------------------------------------------------ the layout data


@dataclass(frozen=True)
class Wire:
    """One drawn wire piece of axis ``axis`` of array ``value``.

    ``points`` is a path: the first point is a move, then ``("L", x, y)`` straight
    lines and ``("C", x, y)`` curves with horizontal tangents at both ends.
    role: ``wire`` (between columns), ``woven`` (through a box, drawn lighter),
    ``broadcast`` (a copied axis inside a box, dashed).
    """

    value: str
    axis: str
    role: str
    points: tuple[tuple[str, float, float], ...]
    level: str | None = None
    box: str = ""  # for woven/broadcast pieces: the box (output array name) they run through

    @property
    def start(self) -> tuple[float, float]:
        return self.points[0][1], self.points[0][2]

    @property
    def end(self) -> tuple[float, float]:
        return self.points[-1][1], self.points[-1][2]


@dataclass(frozen=True)
class Dot:
    """A point marker. role: ``end`` (an own axis ends at a box), ``start`` (an own axis
    leaves a box), ``fork`` (a wire is copied), ``broadcast`` (an input is copied along an
    axis it lacks), ``input``/``output`` (diagram boundary)."""

    x: float
    y: float
    role: str
    value: str
    axis: str
    level: str | None = None


@dataclass(frozen=True)
class Text:
    """A text label. role: ``axis``, ``array``, ``output``, ``box``, ``title``, ``legend``.
    ``kernel``: for an axis label, the kernel (1-based) whose tiles it shows, if kernels are drawn."""

    x: float
    y: float
    text: str
    role: str
    anchor: str = "start"
    value: str = ""
    axis: str = ""
    kernel: int | None = None


@dataclass(frozen=True)
class Marker:
    """A relabelled axis (``q → g_q``): drawn as a small diamond on the wire."""

    x: float
    y: float
    value: str
    axis: str
    label: str


@dataclass(frozen=True)
class Separator:
    """A dashed line between two tuple segments of one column's slice."""

    column: int
    x0: float
    x1: float
    y: float


@dataclass(frozen=True)
class Box:
    """An operation. ``name`` is its output array; ``inputs`` its input arrays in port order;
    ``kernel`` the kernel (1-based, launch order) that runs it, where kernels are drawn."""

    name: str
    label: str
    kind: str
    column: int
    x: float
    y: float
    w: float
    h: float
    own_axes: tuple[str, ...]
    woven_axes: tuple[str, ...]
    inputs: tuple[str, ...]
    kernel: int | None = None


@dataclass(frozen=True)
class Column:
    """A column: its index, horizontal extent, the label and curve regions of the slice after it,
    and what it holds (``input:X``, ``box:S``, ``pass:V``, ``output:O``) from top to bottom."""

    index: int
    x: float
    width: float
    label_end: float
    slice_end: float
    items: tuple[str, ...]


@dataclass(frozen=True)
class Legend:
    """The colour legend (memory levels used), drawn from ``x, y``."""

    x: float
    y: float
    levels: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """Everything the renderer draws, in drawing order within each list."""

    name: str
    title: str
    width: float
    height: float
    columns: tuple[Column, ...]
    boxes: tuple[Box, ...]
    wires: tuple[Wire, ...]
    dots: tuple[Dot, ...]
    texts: tuple[Text, ...]
    markers: tuple[Marker, ...]
    separators: tuple[Separator, ...]
    legend: Legend | None
    options: RenderOptions = field(repr=False, default_factory=RenderOptions)

    @property
    def n_columns(self) -> int:
        return len(self.columns)

    def box(self, name: str) -> Box:
        """The box whose output array is ``name``."""
        for b in self.boxes:
            if b.name == name:
                return b
        raise KeyError(name)


# ------------------------------------------------------------------ internal items


@dataclass
class _Port:
    vid: int
    slot: tuple
    axes: tuple[str, ...]
    rel: list[float]


@dataclass
class _Item:
    kind: str                     # input | box | pass | output
    vid: int                      # the value exiting (input/box/pass) or arriving (output)
    order: int                    # stable tie-break
    height: float
    entries: list[_Port] = field(default_factory=list)
    exit_rel: list[float] = field(default_factory=list)
    node: Value | None = None
    key: float = 0.0
    desired: float | None = None
    top: float = 0.0
    anchor: "_Item | None" = None
    anchor_above: bool = False
    box_w: float = 0.0
    box_x: float = 0.0
    label: str = ""
    out_index: int = -1
    kernel: int | None = None     # boxes: the kernel that runs it (drawn as a tag), if kernels are drawn

    @property
    def bottom(self) -> float:
        return self.top + self.height


def _wire_axes(v: Value) -> tuple[str, ...]:
    """One wire per axis; a scalar array gets one pseudo-wire named ''."""
    return v.axis_names or ("",)


def _size_text(axis, opts: RenderOptions) -> str:
    size = axis.size
    if not opts.show_sizes:
        return ""
    if isinstance(size, int):
        return str(size)
    if isinstance(size, sympy.Symbol) and size.name == axis.name:
        return ""
    return str(size)


def _f(x: float) -> float:
    return round(x + 0.0, 1)


def compute_layout(diagram, options: RenderOptions | None = None, *,
                   wire_colors: Mapping[str, str] | None = None,
                   relabels: Mapping[str, str] | None = None,
                   array_relabels: Mapping[str, Mapping[str, str]] | None = None,
                   kernels: Mapping[str, int] | None = None,
                   title: str | None = None) -> Layout:
    """Lay ``diagram`` out; see the module docstring for the picture it describes.

    ``relabels`` (axis → label) labels every wire of an axis; ``array_relabels`` (array → axis →
    label) labels one array's wires instead, and an array listed there takes no label from
    ``relabels`` (``{}``: plain axis labels). ``kernels`` (array → kernel number) tags each box
    with the kernel that runs it (``k2 · Σ e``) and the relabelled axis labels of an array with
    the kernel whose tiles they are (``Text.kernel``).
    """
    opts = options or RenderOptions()
    P = opts.pitch
    G = opts.item_gap
    names = diagram.names
    all_names = sorted(names.values())

    # ---------------------------------------------------------------- options checks
    levels: dict[str, str] = {}
    for arr, lvl in (wire_colors or {}).items():
        if arr not in all_names:
            raise DiagramError(f"wire_colors: diagram {diagram.name!r} has no array {arr!r}; "
                               f"arrays are {all_names}")
        levels[arr] = level_name(lvl)
    relabel = dict(relabels or {})
    for ax, lab in relabel.items():
        if ax not in diagram.axes:
            raise DiagramError(f"relabels: diagram {diagram.name!r} has no axis {ax!r}; "
                               f"axes are {list(diagram.axes)}")
        if not isinstance(lab, str) or not lab:
            raise DiagramError(f"relabels: label for axis {ax!r} must be a non-empty string, got {lab!r}")
    per_array: dict[str, dict[str, str]] = {}
    for arr, labs in (array_relabels or {}).items():
        if arr not in all_names:
            raise DiagramError(f"array_relabels: diagram {diagram.name!r} has no array {arr!r}; "
                               f"arrays are {all_names}")
        if not isinstance(labs, Mapping):
            raise DiagramError(f"array_relabels: the labels of array {arr!r} must be a mapping, got {labs!r}")
        for ax, lab in labs.items():
            if ax not in diagram.axes:
                raise DiagramError(f"array_relabels: diagram {diagram.name!r} has no axis {ax!r}; "
                                   f"axes are {list(diagram.axes)}")
            if not isinstance(lab, str) or not lab:
                raise DiagramError(f"array_relabels: label for axis {ax!r} of {arr!r} must be a non-empty "
                                   f"string, got {lab!r}")
        per_array[arr] = dict(labs)
    kernel_of: dict[str, int] = {}
    for box, k in (kernels or {}).items():
        if box not in all_names:
            raise DiagramError(f"kernels: diagram {diagram.name!r} has no array {box!r}; arrays are {all_names}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DiagramError(f"kernels: the kernel of {box!r} must be a positive integer, got {k!r}")
        kernel_of[box] = k
    if opts.inputs not in ("auto", "left", "late"):
        raise DiagramError(f"render option inputs={opts.inputs!r}: use 'auto', 'left' or 'late'")

    nodes = diagram.nodes
    inputs = diagram.inputs
    values: dict[int, Value] = {id(v): v for v in (*inputs, *nodes)}
    vname = {vid: names[vid] for vid in values}
    node_index = {id(v): i for i, v in enumerate(nodes)}
    input_index = {id(v): i for i, v in enumerate(inputs)}

    # ---------------------------------------------------------------- columns
    depth: dict[int, int] = {id(v): 0 for v in inputs}
    for v in nodes:
        depth[id(v)] = 1 + max((depth[id(a)] for a in v.args), default=0)
    D = max((depth[id(v)] for v in nodes), default=0)
    out_col = D + 1
    consumers: dict[int, list[tuple[Value, int]]] = {}
    for v in nodes:
        for j, a in enumerate(v.args):
            consumers.setdefault(id(a), []).append((v, j))
    output_ids = {id(v) for v in diagram.outputs}
    late = opts.inputs == "late" or (opts.inputs == "auto" and len(inputs) > opts.late_after)
    start_col: dict[int, int] = {}
    for v in inputs:
        uses = [depth[id(c)] for c, _ in consumers.get(id(v), [])]
        start_col[id(v)] = (min(uses) - 1) if (late and uses) else 0
    for v in nodes:
        start_col[id(v)] = depth[id(v)]
    last_col: dict[int, int] = {}
    for vid in values:
        uses = [depth[id(c)] for c, _ in consumers.get(vid, [])]
        if vid in output_ids:
            uses.append(out_col)
        last_col[vid] = max(uses) if uses else start_col[vid] + 1

    # ---------------------------------------------------------------- items per column
    def bundle_rel(n: int, top_pad: float) -> list[float]:
        return [top_pad + P * (i + 0.75) for i in range(n)]

    columns: list[list[_Item]] = [[] for _ in range(out_col + 1)]
    order = 0
    for v in inputs:
        n = len(_wire_axes(v))
        it = _Item("input", id(v), order, opts.name_height + n * P,
                   exit_rel=bundle_rel(n, opts.name_height))
        columns[start_col[id(v)]].append(it)
        order += 1
    for v in nodes:
        columns[depth[id(v)]].append(_Item("box", id(v), order, 0.0, node=v, kernel=kernel_of.get(names[id(v)])))
        order += 1
    for vid in sorted(values, key=lambda k: (start_col[k], input_index.get(k, -1), node_index.get(k, -1))):
        for c in range(start_col[vid] + 1, last_col[vid]):
            n = len(_wire_axes(values[vid]))
            rel = bundle_rel(n, 0.0)
            it = _Item("pass", vid, order, n * P, exit_rel=rel)
            it.entries = [_Port(vid, ("pass", c), _wire_axes(values[vid]), rel)]
            columns[c].append(it)
            order += 1
    for k, v in enumerate(diagram.outputs):
        n = len(_wire_axes(v))
        rel = [P * (i + 0.5) for i in range(n)]
        it = _Item("output", id(v), order, n * P, out_index=k)
        it.entries = [_Port(id(v), ("out", k), _wire_axes(v), rel)]
        columns[out_col].append(it)
        order += 1

    # ---------------------------------------------------------------- vertical placement
    exit_ys: dict[int, list[float]] = {}        # value id -> wire ys in the slice being built
    for c, items in enumerate(columns):
        for it in items:
            if it.kind == "box":
                _box_item(it, opts, exit_ys, vname)
            if it.entries:
                # inputs that entered late were placed next to their partners: follow the partners
                ports = [p for p in it.entries if not (p.vid in input_index and start_col[p.vid] == c - 1 > 0)]
                ports = ports or it.entries
                diffs = [exit_ys[p.vid][i] - r for p in ports for i, r in enumerate(p.rel)]
                it.desired = sum(diffs) / len(diffs)
                srcs = [y for p in ports for y in exit_ys[p.vid]]
                it.key = sum(srcs) / len(srcs)
        placed = [it for it in items if it.kind != "input"]
        pending = [it for it in items if it.kind == "input"]
        by_vid = {it.vid: it for it in placed}
        # inputs entering late sit next to the array they meet at their first box
        base = max((it.key for it in placed), default=0.0)
        for it in pending:
            v = values[it.vid]
            anchor = None
            if c > 0:
                for box, j in consumers.get(it.vid, []):
                    if depth[id(box)] != c + 1:
                        continue
                    sibs = [(abs(k - j), k, a) for k, a in enumerate(box.args) if id(a) in by_vid and k != j]
                    if sibs:
                        _, k, a = min(sibs)
                        anchor = by_vid[id(a)]
                        it.anchor_above = j < k
                        break
            if anchor is not None:
                it.anchor = anchor
                it.key = anchor.key + (-1e-3 if it.anchor_above else 1e-3) * (1 + input_index[id(v)] * 1e-3)
            else:
                it.key = base + 1.0 + input_index[id(v)] if c > 0 else float(input_index[id(v)])
        rank = {"pass": 0, "box": 1, "output": 1, "input": 2}
        items.sort(key=lambda it: (it.key, rank[it.kind], it.order))
        prev_bottom = None
        for it in items:
            want = it.desired
            if it.kind == "input" and it.anchor is not None and it.anchor_above and it.anchor.desired is not None:
                want = it.anchor.desired - it.height - G
            lo = -1e18 if prev_bottom is None else prev_bottom + G
            if want is None:
                want = lo if prev_bottom is not None else 0.0
            it.top = max(want, lo)
            prev_bottom = it.bottom
        for it in items:
            if it.exit_rel:
                exit_ys[it.vid] = [it.top + r for r in it.exit_rel]

    # ---------------------------------------------------------------- horizontal placement
    head = opts.margin
    if title:
        head += opts.title_font_size + 8
    if levels:
        head += opts.font_size + 12
    top_all = min((it.top for items in columns for it in items), default=0.0)
    shift = head + 4 - top_all
    for items in columns:
        for it in items:
            it.top += shift

    def relabel_of(name: str, axis: str) -> str | None:
        """The relabelled axis's label on ``name``'s wire, or None."""
        return per_array[name].get(axis) if name in per_array else relabel.get(axis)

    def label_text(v: Value, name: str, axis: str) -> str:
        if axis == "":
            return "scalar"
        lab = relabel_of(name, axis)
        if lab is not None:
            return lab
        ax = v.axis(axis)
        s = _size_text(ax, opts)
        return f"{axis} {s}" if s else axis

    def new_here(it: _Item) -> bool:
        return it.kind in ("input", "box")

    col_x: list[float] = []
    col_w: list[float] = []
    label_end: list[float] = []
    slice_end: list[float] = []
    x = opts.margin
    for c, items in enumerate(columns):
        w = opts.stub if c == 0 else 0.0
        for it in items:
            if it.kind == "box":
                w = max(w, it.box_w)
            elif it.kind == "input":
                w = max(w, opts.stub)
            elif it.kind == "output":
                w = max(w, opts.stub + 6 + opts.text_width(vname[it.vid], opts.name_font_size + 1))
        w = max(w, opts.stub)
        col_x.append(x)
        col_w.append(w)
        x += w
        if c == out_col:
            label_end.append(x)
            slice_end.append(x)
            break
        lw = 0.0
        for it in items:
            if not new_here(it):
                continue
            v = values[it.vid]
            lw = max(lw, opts.text_width(vname[it.vid], opts.name_font_size))
            for a in _wire_axes(v):
                extra = 12.0 if relabel_of(vname[it.vid], a) is not None else 0.0
                lw = max(lw, opts.text_width(label_text(v, vname[it.vid], a), opts.font_size) + extra)
        lw = lw + 14.0 if lw else 8.0
        label_end.append(x + lw)
        # curve region: as long as the largest vertical move into the next column needs
        max_dy = 0.0
        nxt = columns[c + 1]
        ys_here = {it.vid: [it.top + r for r in it.exit_rel] for it in items if it.exit_rel}
        for it in nxt:
            for p in it.entries:
                src = ys_here.get(p.vid)
                if src is None:
                    continue
                for i, r in enumerate(p.rel):
                    max_dy = max(max_dy, abs(it.top + r - src[i]))
        cw = min(opts.curve_max, max(opts.curve_min, opts.curve_slope * max_dy))
        x = x + lw + cw
        slice_end.append(x)

    # ---------------------------------------------------------------- drawing primitives
    wires: list[Wire] = []
    dots: list[Dot] = []
    texts: list[Text] = []
    markers: list[Marker] = []
    seps: list[Separator] = []
    boxes: list[Box] = []
    lvl = {vid: levels.get(vname[vid]) for vid in values}

    def exit_x(it: _Item, c: int) -> float:
        if it.kind == "box":
            return it.box_x + it.box_w
        if it.kind == "input":
            return col_x[c] + col_w[c] - opts.stub
        return col_x[c]  # pass: the straight run starts at the column's left edge

    for c, items in enumerate(columns):
        for it in items:
            if it.kind == "box":
                it.box_x = col_x[c] + (col_w[c] - it.box_w) / 2

    for c, items in enumerate(columns):
        cx, cr = col_x[c], col_x[c] + col_w[c]
        if c == out_col:
            for it in items:
                v = values[it.vid]
                p = it.entries[0]
                ys = [it.top + r for r in p.rel]
                for a, y in zip(p.axes, ys):
                    dots.append(Dot(_f(cx + opts.stub), _f(y), "output", vname[it.vid], a, lvl[it.vid]))
                texts.append(Text(_f(cx + opts.stub + 6), _f(sum(ys) / len(ys) + opts.name_font_size * 0.35),
                                  vname[it.vid], "output", value=vname[it.vid]))
            for a, b in zip(items, items[1:]):
                seps.append(Separator(c, _f(cx), _f(cr), _f((a.bottom + b.top) / 2)))
            continue
        nxt = columns[c + 1]
        fork_x = label_end[c]
        # boxes of this column
        for it in items:
            if it.kind == "box":
                boxes.append(_draw_box(it, c, opts, values, vname, lvl, wires, dots))
        # dashed separators between the tuple segments of this slice
        with_exit = [it for it in items if it.exit_rel]
        for a, b in zip(with_exit, with_exit[1:]):
            x0 = cx if c == 0 else cr
            y = a.bottom + min((b.top - a.bottom) / 2, G)
            seps.append(Separator(c, _f(x0), _f(fork_x), _f(y)))
        # wires of the slice: straight through the label region, then curves to every destination
        for it in with_exit:
            v = values[it.vid]
            name = vname[it.vid]
            ys = [it.top + r for r in it.exit_rel]
            axs = _wire_axes(v)
            x0 = exit_x(it, c)
            dests = []
            for nit in nxt:
                for p in nit.entries:
                    if p.vid == it.vid:
                        dx = nit.box_x if nit.kind == "box" else col_x[c + 1]
                        if nit.kind == "output":
                            dx = col_x[c + 1] + opts.stub
                        dests.append((dx, [nit.top + r for r in p.rel]))
            for k, (dx, dys) in enumerate(dests):
                for i, a in enumerate(axs):
                    pts: list[tuple[str, float, float]] = []
                    if k == 0:
                        pts.append(("M", _f(x0), _f(ys[i])))
                        pts.append(("L", _f(fork_x), _f(ys[i])))
                    else:
                        pts.append(("M", _f(fork_x), _f(ys[i])))
                    pts.append(("C" if abs(dys[i] - ys[i]) > 0.05 else "L", _f(dx), _f(dys[i])))
                    wires.append(Wire(name, a, "wire", tuple(pts), lvl[it.vid]))
            if len(dests) > 1:
                for i, a in enumerate(axs):
                    dots.append(Dot(_f(fork_x), _f(ys[i]), "fork", name, a, lvl[it.vid]))
            if it.kind == "input":
                for i, a in enumerate(axs):
                    dots.append(Dot(_f(x0), _f(ys[i]), "input", name, a, lvl[it.vid]))
            if new_here(it):
                tx = cr + 4
                if it.vid not in output_ids:  # outputs are named at the right edge
                    texts.append(Text(_f(tx), _f(ys[0] - opts.font_size - 7.5), name, "array", value=name))
                for i, a in enumerate(axs):
                    t = label_text(v, name, a)
                    lab = relabel_of(name, a)
                    texts.append(Text(_f(tx), _f(ys[i] - 4.5), t, "axis", value=name, axis=a,
                                      kernel=kernel_of.get(name) if lab is not None else None))
                    if lab is not None:
                        mx = tx + opts.text_width(t, opts.font_size) + 6
                        markers.append(Marker(_f(mx), _f(ys[i]), name, a, lab))

    wires = _merge_chains(wires)

    # ---------------------------------------------------------------- title, legend, size
    if title:
        texts.insert(0, Text(_f(opts.margin), _f(opts.margin + opts.title_font_size - 2), title, "title"))
    legend = None
    if levels:
        used = tuple(l for l in LEVEL_COLORS if l in set(levels.values()))
        ly = opts.margin + (opts.title_font_size + 8 if title else 0) + opts.font_size
        legend = Legend(_f(opts.margin), _f(ly), used)
        texts.append(Text(_f(opts.margin), _f(ly + 3), "memory level:", "legend"))
        lx = opts.margin + opts.text_width("memory level:", opts.font_size) + 10
        for name in used:
            texts.append(Text(_f(lx + 22), _f(ly + 3), name, "legend", value=name))
            lx += 22 + opts.text_width(name, opts.font_size) + 14
    width = slice_end[-1] + opts.margin
    if title:
        width = max(width, opts.margin * 2 + opts.text_width(title, opts.title_font_size))
    bottom = max((it.bottom for items in columns for it in items), default=0.0)
    height = bottom + opts.margin + 4
    col_items = []
    for c, items in enumerate(columns):
        col_items.append(Column(c, _f(col_x[c]), _f(col_w[c]), _f(label_end[c]), _f(slice_end[c]),
                                tuple(f"{it.kind}:{vname[it.vid]}" for it in items)))
    return Layout(diagram.name, title or "", _f(width), _f(height), tuple(col_items), tuple(boxes),
                  tuple(wires), tuple(dots), tuple(texts), tuple(markers), tuple(seps), legend, opts)


def _merge_chains(wires: list[Wire]) -> list[Wire]:
    """Join a wire piece that ends where the next piece of the same wire starts (an array passing
    through a column) into one path, so long wires are drawn without seams."""
    starts: dict[tuple, int] = {}
    for i, w in enumerate(wires):
        if w.role == "wire":
            starts.setdefault((w.value, w.axis, w.start), i)
    merged_into: set[int] = set()
    out: list[Wire] = []
    for i, w in enumerate(wires):
        if i in merged_into:
            continue
        if w.role == "wire":
            pts = list(w.points)
            nxt = starts.get((w.value, w.axis, (pts[-1][1], pts[-1][2])))
            while nxt is not None and nxt != i and nxt not in merged_into:
                merged_into.add(nxt)
                more = wires[nxt].points[1:]
                pts.extend(more)
                nxt = starts.get((w.value, w.axis, (pts[-1][1], pts[-1][2])))
            w = replace(w, points=tuple(pts))
        out.append(w)
    return out


# ------------------------------------------------------------------ boxes


def _axis_map(v: Value) -> dict[str, str]:
    """Input axis name → output axis name for the wires a box passes through (renames map)."""
    if isinstance(v.op, Rename):
        return dict(v.op.mapping)
    return {}


def _box_item(it: _Item, opts: RenderOptions, exit_ys: dict[int, list[float]], vname) -> None:
    """Ports and size of a box; input bundles are stacked in the order of their sources."""
    v = it.node
    assert v is not None
    P = opts.pitch
    args = list(enumerate(v.args))
    args.sort(key=lambda ja: (sum(exit_ys[id(ja[1])]) / len(exit_ys[id(ja[1])]), ja[0]))
    in_total = sum(len(_wire_axes(a)) * P for _, a in args) + opts.port_gap * (len(args) - 1)
    n_out = len(_wire_axes(v))
    out_total = n_out * P
    inner = max(in_total, out_total)
    body_top = opts.box_header + opts.box_pad
    y = body_top + (inner - in_total) / 2
    ports = []
    for j, a in args:
        n = len(_wire_axes(a))
        rel = [y + P * (i + 0.5) for i in range(n)]
        ports.append(_Port(id(a), ("box", it.order, j), _wire_axes(a), rel))
        y += n * P + opts.port_gap
    oy = body_top + (inner - out_total) / 2
    it.entries = ports
    it.exit_rel = [oy + P * (i + 0.5) for i in range(n_out)]
    it.height = opts.box_header + inner + 2 * opts.box_pad
    label = v.op.label() if it.kernel is None else f"k{it.kernel} · {v.op.label()}"
    it.box_w = max(opts.box_min_width, opts.text_width(label, opts.box_font_size) + 2 * opts.box_pad_x)
    it.label = label


def _draw_box(it: _Item, c: int, opts: RenderOptions, values, vname, lvl, wires, dots) -> Box:
    v = it.node
    assert v is not None
    bx, bw = it.box_x, it.box_w
    name = vname[it.vid]
    own = tuple(v.op.own_axes())
    out_axes = _wire_axes(v)
    out_ys = {a: it.top + r for a, r in zip(out_axes, it.exit_rel)}
    amap = _axis_map(v)
    woven = tuple(a for a in v.axis_names if a not in own)
    for p in it.entries:
        sname = vname[p.vid]
        ys = [it.top + r for r in p.rel]
        for a, y in zip(p.axes, ys):
            target = amap.get(a, a)
            if a in own or target not in out_ys or a == "":
                dots.append(Dot(_f(bx), _f(y), "end", sname, a, lvl[p.vid]))
                continue
            ty = out_ys[target]
            kind = "L" if abs(ty - y) < 0.05 else "C"
            wires.append(Wire(sname, a, "woven", (("M", _f(bx), _f(y)), (kind, _f(bx + bw), _f(ty))),
                              lvl[p.vid], name))
        # broadcasting: an elementwise input lacking a woven axis is copied along it
        if isinstance(v.op, Map):
            carried = {amap.get(a, a) for a in p.axes}
            missing = [a for a in woven if a not in carried]
            if missing:
                my = sum(ys) / len(ys)
                cxm = bx + 9
                for a in missing:
                    dots.append(Dot(_f(cxm), _f(my), "broadcast", sname, a, lvl[p.vid]))
                    ty = out_ys[a]
                    wires.append(Wire(sname, a, "broadcast",
                                      (("M", _f(cxm + 3), _f(my)), ("C", _f(bx + bw), _f(ty))), lvl[p.vid], name))
    # a contraction joins the ends of each contracted axis at one point inside the box
    if isinstance(v.op, Contract):
        for a in own:
            ends = [(vname[p.vid], it.top + r, lvl[p.vid]) for p in it.entries
                    for ax, r in zip(p.axes, p.rel) if ax == a]
            if len(ends) < 2:
                continue
            my = sum(y for _, y, _ in ends) / len(ends)
            mx = bx + opts.join_depth
            for sname, y, level in ends:
                wires.append(Wire(sname, a, "contract", (("M", _f(bx), _f(y)), ("C", _f(mx), _f(my))), level, name))
            dots.append(Dot(_f(mx), _f(my), "join", name, a, None))
    for a in out_axes:
        if a in own:
            dots.append(Dot(_f(bx + bw), _f(out_ys[a]), "start", name, a, lvl[it.vid]))
    return Box(name, it.label, v.op.kind, c, _f(bx), _f(it.top), _f(bw), _f(it.height),
               own, woven, tuple(vname[p.vid] for p in it.entries), it.kernel)
