"""DOT export: the graph view of a diagram, with and without the graphviz package."""

import re
import sys

import pytest

from napkin.diagrams import library
from napkin.diagrams.dot import dot_graph, to_dot, to_dot_source
from napkin.errors import NapkinError


def attention():
    return library.get("attention").bind(q=4096, x=4096, d=128)


def edges_of(src: str) -> list[tuple[str, str, str]]:
    return re.findall(r'^\s*"([^"]+)" -> "([^"]+)" \[label="([^"]*)"\];$', src, flags=re.M)


def test_source_has_inputs_boxes_outputs_and_labelled_edges():
    src = to_dot_source(attention())
    assert src.startswith('digraph "attention" {') and src.rstrip().endswith("}")
    assert 'rankdir="LR"' in src
    for node in ("in_Q", "in_K", "in_V", "op_S", "op_S_scaled", "op_P", "op_O", "out0_O"):
        assert re.search(rf'^\s*"{node}" \[', src, flags=re.M), node
    assert '"op_S" [label="Σ d", shape="box"' in src
    edges = edges_of(src)
    assert ("in_Q", "op_S", "Q [q=4096, d=128]") in edges
    assert ("op_P", "op_O", "P [q=4096, x=4096]") in edges
    assert ("in_V", "op_O", "V [x=4096, d=128]") in edges
    assert ("op_O", "out0_O", "O [q=4096, d=128]") in edges
    assert len(edges) == 7


@pytest.mark.parametrize("name", library.names())
def test_every_library_diagram_exports(name):
    d = library.get(name)
    nodes, edges = dot_graph(d)
    assert len(nodes) == len(d.inputs) + len(d.nodes) + len(d.outputs)
    assert len(edges) == sum(len(v.args) for v in d.nodes) + len(d.outputs)
    ids = {n for n, _ in nodes}
    assert len(ids) == len(nodes)
    assert all(t in ids and h in ids for t, h, _ in edges)
    src = to_dot_source(d)
    assert src == to_dot_source(library.get(name))  # deterministic
    assert src.count("->") == len(edges)


def test_symbolic_axes_have_no_sizes():
    src = to_dot_source(library.get("matmul"))
    assert '"in_A" -> "op_C" [label="A [a, b]"];' in src


def test_to_dot_returns_a_digraph():
    graphviz = pytest.importorskip("graphviz")
    g = to_dot(attention())
    assert isinstance(g, graphviz.Digraph)
    src = g.source
    assert "in_Q -> op_S" in src and "op_O -> out0_O" in src
    assert 'label="Q [q=4096, d=128]"' in src
    assert attention().to_dot().source == src


def test_to_dot_without_graphviz_raises_with_a_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(NapkinError, match="pip install graphviz"):
        to_dot(attention())
    assert to_dot_source(attention())  # the text form still works
