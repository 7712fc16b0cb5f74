"""SVG rendering of a diagram in the neural-circuit-diagram style (pure Python, no graphviz).

Wires run left to right, one per axis, labelled with the axis name and size; boxes are
operations; an operation's own axes (contracted, normalised) end at its box while woven
axes run through it, lighter; tuple segments are separated by dashed lines. After
scheduling, ``wire_colors`` colours arrays by memory level (:data:`LEVEL_COLORS`, with a
legend) and ``relabels`` shows relabelled axes (``q → g_q``) with a diamond marker; for a plan of
several kernels ``array_relabels`` gives each array the tiles of its own kernel and ``kernels`` tags
each box with the kernel that runs it (``k2 · Σ e``, ``data-kernel="2"``).

The output is deterministic: the same diagram and options give byte-identical SVG.

>>> from napkin.diagrams import library
>>> svg = render_svg(library.get("matmul").bind(a=64, b=32, c=16))
>>> svg.startswith("<svg") and "b 32" in svg
True
"""

from __future__ import annotations

from typing import Mapping
from xml.sax.saxutils import escape, quoteattr

from .layout import LEVEL_COLORS, Layout, RenderOptions, compute_layout, level_name

__all__ = ["render_svg", "layout_svg", "RenderOptions", "LEVEL_COLORS", "level_name", "compute_layout"]


def _n(x: float) -> str:
    """A number rounded to 0.1 with no trailing ``.0`` (and never ``-0``)."""
    r = round(float(x), 1)
    if r == 0:
        return "0"
    s = f"{r:.1f}"
    return s[:-2] if s.endswith(".0") else s


def _attrs(**kw) -> str:
    out = []
    for k, v in kw.items():
        if v is None:
            continue
        key = k.rstrip("_").replace("_", "-")
        if isinstance(v, float):
            v = _n(v)
        out.append(f"{key}={quoteattr(str(v))}")
    return " ".join(out)


def _path_d(points) -> str:
    parts = []
    px = py = 0.0
    for kind, x, y in points:
        if kind == "M":
            parts.append(f"M{_n(x)} {_n(y)}")
        elif kind == "L":
            parts.append(f"L{_n(x)} {_n(y)}")
        else:  # horizontal-tangent cubic
            xm = (px + x) / 2
            parts.append(f"C{_n(xm)} {_n(py)} {_n(xm)} {_n(y)} {_n(x)} {_n(y)}")
        px, py = x, y
    return " ".join(parts)


def render_svg(diagram, *, style=None, wire_colors: Mapping[str, str] | None = None,
               relabels: Mapping[str, str] | None = None,
               array_relabels: Mapping[str, Mapping[str, str]] | None = None,
               kernels: Mapping[str, int] | None = None, title: str | None = None) -> str:
    """Draw ``diagram`` as an SVG document (a string).

    style:       None, a :class:`RenderOptions`, or a dict of RenderOptions fields to override.
    wire_colors: array name → memory level (HBM, L2, SMEM, RF, TC); those wires take the level's
                 colour from :data:`LEVEL_COLORS` and a legend is drawn.
    relabels:    axis name → label drawn instead of the axis name (``{"q": "g_q"}``), with a marker.
    array_relabels: array name → {axis name → label}: that array's wires only; an array listed
                 here takes nothing from ``relabels`` (``{}``: its plain axis labels).
    kernels:     array name → kernel number (1-based): a box is tagged ``k<n> · `` and carries
                 ``data-kernel``; so do the relabelled axis labels of an array listed.
    title:       text at the top; ``None`` uses the diagram's name (and description), ``""`` none.
    """
    opts = RenderOptions.from_style(style)
    if title is None:
        title = diagram.name + (f" — {diagram.description}" if getattr(diagram, "description", "") else "")
    lay = compute_layout(diagram, opts, wire_colors=wire_colors, relabels=relabels,
                         array_relabels=array_relabels, kernels=kernels, title=title)
    return layout_svg(lay)


def layout_svg(lay: Layout) -> str:
    """The SVG text of a computed :class:`~napkin.diagrams.layout.Layout`."""
    o = lay.options

    def color(level):
        return LEVEL_COLORS[level] if level else o.wire_color

    out: list[str] = []
    w, h = lay.width, lay.height
    out.append(f"<svg {_attrs(xmlns='http://www.w3.org/2000/svg', viewBox=f'0 0 {_n(w)} {_n(h)}', width=w, height=h, font_family=o.font_family, class_='napkin-diagram', data_diagram=lay.name)}>")
    out.append(f"<title>{escape(lay.title or lay.name)}</title>")
    out.append(f"<rect {_attrs(class_='background', x=0.0, y=0.0, width=w, height=h, fill=o.background)}/>")

    # dashed separators between tuple segments
    out.append('<g class="separators">')
    for s in lay.separators:
        out.append(f"<line {_attrs(class_='sep', data_column=s.column, x1=s.x0, y1=s.y, x2=s.x1, y2=s.y, stroke=o.sep_color, stroke_width=1.0, stroke_dasharray='4 3')}/>")
    out.append("</g>")

    # wires between columns
    out.append('<g class="wires" fill="none" stroke-linecap="round">')
    for wi in lay.wires:
        if wi.role != "wire":
            continue
        out.append(f"<path {_attrs(class_='wire', data_value=wi.value, data_axis=wi.axis, d=_path_d(wi.points), stroke=color(wi.level), stroke_width=o.wire_width if wi.axis else o.wire_width * 0.8, stroke_dasharray=None if wi.axis else '2 2')}/>")
    out.append("</g>")

    # boxes, with the woven wires running through them
    out.append('<g class="boxes">')
    for b in lay.boxes:
        out.append(f"<g {_attrs(class_='op', data_name=b.name, data_kind=b.kind, data_kernel=b.kernel)}>")
        out.append(f"<rect {_attrs(class_='box', data_name=b.name, data_kernel=b.kernel, x=b.x, y=b.y, width=b.w, height=b.h, rx=6.0, ry=6.0, fill=o.box_fill, stroke=o.box_stroke, stroke_width=1.2)}/>")
        out.append(f"<line {_attrs(class_='box-rule', x1=b.x + 4, y1=b.y + o.box_header, x2=b.x + b.w - 4, y2=b.y + o.box_header, stroke=o.box_stroke, stroke_opacity=0.25, stroke_width=1.0)}/>")
        for wi in lay.wires:
            if wi.box != b.name:
                continue
            dash = "3 2" if wi.role == "broadcast" else None
            opacity = 0.85 if wi.role == "contract" else o.woven_opacity
            out.append(f"<path {_attrs(class_=wi.role, data_value=wi.value, data_axis=wi.axis, d=_path_d(wi.points), fill='none', stroke=color(wi.level), stroke_width=o.wire_width, stroke_opacity=opacity, stroke_dasharray=dash)}/>")
        out.append(f"<text {_attrs(class_='box-label', x=b.x + b.w / 2, y=b.y + o.box_header - 6, text_anchor='middle', font_size=o.box_font_size, fill=o.name_color)}>{escape(b.label)}</text>")
        out.append("</g>")
    out.append("</g>")

    # dots: own axes ending/starting at boxes, forks, broadcasts, diagram boundary
    out.append('<g class="dots">')
    for d in lay.dots:
        c = color(d.level)
        if d.role == "join":
            a = _attrs(class_="join", data_box=d.value, data_axis=d.axis, cx=d.x, cy=d.y, r=3.2, fill=o.box_stroke)
        elif d.role == "broadcast":
            a = _attrs(class_="broadcast", data_value=d.value, data_axis=d.axis, cx=d.x, cy=d.y, r=3.0,
                       fill="#ffffff", stroke=c, stroke_width=1.2)
        elif d.role in ("input", "output"):
            a = _attrs(class_=d.role, data_value=d.value, data_axis=d.axis, cx=d.x, cy=d.y, r=1.6, fill=c)
        else:
            a = _attrs(class_=d.role, data_value=d.value, data_axis=d.axis, cx=d.x, cy=d.y,
                       r=3.0 if d.role == "fork" else 2.6, fill=c)
        out.append(f"<circle {a}/>")
    out.append("</g>")

    # relabel markers
    if lay.markers:
        out.append('<g class="relabels">')
        for m in lay.markers:
            pts = f"{_n(m.x)},{_n(m.y - 4)} {_n(m.x + 4)},{_n(m.y)} {_n(m.x)},{_n(m.y + 4)} {_n(m.x - 4)},{_n(m.y)}"
            out.append(f"<polygon {_attrs(class_='relabel', data_value=m.value, data_axis=m.axis, data_label=m.label, points=pts, fill='#ffffff', stroke=o.name_color, stroke_width=1.1)}/>")
        out.append("</g>")

    # legend
    if lay.legend is not None:
        out.append('<g class="legend">')
        lx = lay.legend.x + o.text_width("memory level:", o.font_size) + 10
        for name in lay.legend.levels:
            out.append(f"<line {_attrs(class_='legend-swatch', data_level=name, x1=lx, y1=lay.legend.y, x2=lx + 18, y2=lay.legend.y, stroke=LEVEL_COLORS[name], stroke_width=3.0)}/>")
            lx += 22 + o.text_width(name, o.font_size) + 14
        out.append("</g>")

    # text labels
    out.append('<g class="labels">')
    for t in lay.texts:
        if t.role == "title":
            a = _attrs(class_="title", x=t.x, y=t.y, font_size=o.title_font_size, font_weight="bold", fill=o.name_color)
        elif t.role == "array":
            a = _attrs(class_="array-name", data_value=t.value, x=t.x, y=t.y, font_size=o.name_font_size,
                       font_weight="bold", fill=o.name_color)
        elif t.role == "output":
            a = _attrs(class_="output-name", data_value=t.value, x=t.x, y=t.y, font_size=o.name_font_size + 1,
                       font_weight="bold", fill=o.name_color)
        elif t.role == "axis":
            a = _attrs(class_="axis-label", data_value=t.value, data_axis=t.axis, data_kernel=t.kernel, x=t.x,
                       y=t.y, font_size=o.font_size, fill=o.label_color)
        else:
            a = _attrs(class_=t.role, x=t.x, y=t.y, font_size=o.font_size, fill=o.label_color,
                       text_anchor=None if t.anchor == "start" else t.anchor)
        out.append(f"<text {a}>{escape(t.text)}</text>")
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
