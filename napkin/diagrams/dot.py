"""DOT export: the diagram as a graph (inputs, boxes, outputs; edges labelled with arrays).

A second view next to the SVG: graphviz lays it out, which helps with very large
diagrams. :func:`to_dot_source` needs nothing installed; :func:`to_dot` returns a
``graphviz.Digraph`` and needs the ``graphviz`` Python package (``pip install graphviz``,
plus the Graphviz binaries to render it).

>>> from napkin.diagrams import library
>>> src = to_dot_source(library.get("matmul"))
>>> print(src.splitlines()[0])
digraph "matmul" {
>>> '"in_A" -> "op_C"' in src
True
"""

from __future__ import annotations

from ..errors import NapkinError

_GRAPH_ATTR = {"rankdir": "LR", "fontname": "monospace"}
_NODE_ATTR = {"fontname": "monospace", "fontsize": "11"}
_EDGE_ATTR = {"fontname": "monospace", "fontsize": "9"}


def _axes_text(v) -> str:
    parts = []
    for a in v.axes:
        parts.append(f"{a.name}={a.size}" if a.is_bound else a.name)
    return "[" + ", ".join(parts) + "]"


def dot_graph(diagram) -> tuple[list[tuple[str, dict]], list[tuple[str, str, dict]]]:
    """Nodes ``(id, attrs)`` and edges ``(tail, head, attrs)`` of the DOT view, in a stable order."""
    nodes: list[tuple[str, dict]] = []
    edges: list[tuple[str, str, dict]] = []
    name_of = diagram.name_of

    def node_id(v) -> str:
        return ("in_" if v.is_input else "op_") + name_of(v)

    for v in diagram.inputs:
        nodes.append((node_id(v), {"label": f"{v.name}{_axes_text(v)}", "shape": "plaintext"}))
    for v in diagram.nodes:
        own = v.op.own_axes()
        woven = [a for a in v.axis_names if a not in own]
        tip = f"{name_of(v)} = {v.op.label()}" + (f", woven over {','.join(woven)}" if woven else "")
        nodes.append((node_id(v), {"label": v.op.label(), "shape": "box", "style": "rounded",
                                   "tooltip": tip}))
    for k, (n, v) in enumerate(zip(diagram.output_names, diagram.outputs)):
        nodes.append((f"out{k}_{n}", {"label": n, "shape": "plaintext"}))
    for v in diagram.nodes:
        for a in v.args:
            edges.append((node_id(a), node_id(v), {"label": f"{name_of(a)} {_axes_text(a)}"}))
    for k, (n, v) in enumerate(zip(diagram.output_names, diagram.outputs)):
        edges.append((node_id(v), f"out{k}_{n}", {"label": f"{n} {_axes_text(v)}"}))
    return nodes, edges


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attr_list(attrs: dict) -> str:
    return ", ".join(f"{k}={_q(v)}" for k, v in attrs.items())


def to_dot_source(diagram) -> str:
    """The DOT text of the diagram (no graphviz package needed)."""
    nodes, edges = dot_graph(diagram)
    lines = [f"digraph {_q(diagram.name)} {{"]
    lines.append(f"  graph [{_attr_list(_GRAPH_ATTR)}];")
    lines.append(f"  node [{_attr_list(_NODE_ATTR)}];")
    lines.append(f"  edge [{_attr_list(_EDGE_ATTR)}];")
    for nid, attrs in nodes:
        lines.append(f"  {_q(nid)} [{_attr_list(attrs)}];")
    for tail, head, attrs in edges:
        lines.append(f"  {_q(tail)} -> {_q(head)} [{_attr_list(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_dot(diagram):
    """The diagram as a ``graphviz.Digraph`` (needs the graphviz Python package)."""
    try:
        import graphviz
    except ImportError:
        raise NapkinError(
            "to_dot needs the graphviz Python package: pip install graphviz (or pip install "
            "'napkin[dot]'); to_dot_source(diagram) gives the DOT text without it"
        ) from None
    g = graphviz.Digraph(name=diagram.name, graph_attr=dict(_GRAPH_ATTR), node_attr=dict(_NODE_ATTR),
                         edge_attr=dict(_EDGE_ATTR))
    nodes, edges = dot_graph(diagram)
    for nid, attrs in nodes:
        g.node(nid, **attrs)
    for tail, head, attrs in edges:
        g.edge(tail, head, **attrs)
    return g
