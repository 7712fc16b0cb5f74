"""SVG rendering: golden files (compared structurally) and the properties the picture must have.

Regenerate the golden files after an intended change of the picture:

    NAPKIN_UPDATE_GOLDEN=1 python3 -m pytest -q tests/diagrams/test_render.py
"""

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from napkin.diagrams import Axis, Diagram, array, contract, library, softmax
from napkin.diagrams.layout import LEVEL_COLORS, RenderOptions, compute_layout
from napkin.diagrams.render import render_svg
from napkin.errors import DiagramError

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "napkin" / "diagrams" / "golden"
GOLDEN = ["matmul", "mlp", "softmax", "layernorm", "attention", "mha", "gqa", "attention_causal",
          "transformer_block"]
UPDATE = os.environ.get("NAPKIN_UPDATE_GOLDEN") == "1"
NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def tag(el) -> str:
    return el.tag.replace(NS, "")


def by_class(root, cls):
    return [el for el in root.iter() if el.get("class") == cls]


def texts(root) -> list[str]:
    return [el.text or "" for el in root.iter() if tag(el) == "text"]


def structure(svg: str) -> dict:
    """What a golden file pins down: tags, labels, and how many boxes, wires and separators."""
    root = parse(svg)
    return {
        "tags": Counter(tag(el) for el in root.iter()),
        "labels": set(texts(root)),
        "boxes": len(by_class(root, "box")),
        "wires": len(by_class(root, "wire")),
        "woven": len(by_class(root, "woven")),
        "separators": len([el for el in by_class(root, "sep") if el.get("stroke-dasharray")]),
        "viewBox": root.get("viewBox") is not None,
    }


def path_points(d: str) -> list[tuple[float, float]]:
    nums = [float(t) for t in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return list(zip(nums[0::2], nums[1::2]))


def bound_attention():
    return library.get("attention").bind(q=4096, x=4096, d=128)


# ------------------------------------------------------------------ golden files


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_structure(name):
    svg = render_svg(library.get(name))
    path = GOLDEN_DIR / f"{name}.svg"
    if UPDATE:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run NAPKIN_UPDATE_GOLDEN=1 pytest {__file__}"
    got, want = structure(svg), structure(path.read_text(encoding="utf-8"))
    for key in want:
        assert got[key] == want[key], f"{name}: {key} differs from the golden file {path.name}"


def test_structure_compare_detects_a_change():
    # the comparison must be able to fail: a different diagram has a different structure
    assert structure(render_svg(library.get("mha"))) != structure(render_svg(library.get("attention_causal")))
    assert structure(render_svg(library.get("attention"))) != structure(
        render_svg(library.get("attention").bind(q=64, x=64, d=16)))


# ------------------------------------------------------------------ properties


@pytest.mark.parametrize("name", library.names())
def test_well_formed_and_complete(name):
    d = library.get(name)
    svg = render_svg(d)
    root = parse(svg)
    assert tag(root) == "svg" and root.get("viewBox", "").startswith("0 0 ")
    assert root.get("font-family") == "monospace"
    boxes = by_class(root, "box")
    assert len(boxes) == len(d.nodes)
    assert sorted(b.get("data-name") for b in boxes) == sorted(d.name_of(v) for v in d.nodes)
    labels = set(texts(root))
    for v in d.nodes:
        assert v.op.label() in labels
        assert d.name_of(v) in labels
    for v in d.inputs:
        assert v.name in labels
    # every coordinate is rounded to 0.1
    for value in re.findall(r'="([^"]*)"', svg):
        assert not re.search(r"\d\.\d\d", value), value


@pytest.mark.parametrize("name,sizes", [
    ("attention", dict(q=4096, x=4096, d=128)),
    ("gqa", dict(h=4, j=4, q=4096, x=1024, d=128)),
    ("transformer_block", dict(q=2048, e=1024, h=8, d=128, f=4096)),
])
def test_every_axis_name_and_size_is_labelled(name, sizes):
    d = library.get(name).bind(**sizes)
    root = parse(render_svg(d))
    axis_labels = {el.text for el in by_class(root, "axis-label")}
    for ax in d.axes.values():
        assert f"{ax.name} {ax.size}" in axis_labels, (ax, sorted(axis_labels))


def test_symbolic_axes_show_the_name_alone():
    root = parse(render_svg(library.get("attention")))
    assert {el.text for el in by_class(root, "axis-label")} == {"q", "x", "d"}


def test_contracted_wire_ends_at_the_contraction_box():
    root = parse(render_svg(bound_attention()))
    box = next(b for b in by_class(root, "box") if b.get("data-name") == "S")
    bx = float(box.get("x"))
    by0, by1 = float(box.get("y")), float(box.get("y")) + float(box.get("height"))
    for src in ("Q", "K"):
        d_wires = [w for w in by_class(root, "wire") if w.get("data-value") == src and w.get("data-axis") == "d"]
        assert d_wires
        for w in d_wires:
            x, y = path_points(w.get("d"))[-1]
            assert x == pytest.approx(bx, abs=0.11) and by0 <= y <= by1
        ends = [c for c in by_class(root, "end") if c.get("data-value") == src and c.get("data-axis") == "d"]
        assert len(ends) == 1 and float(ends[0].get("cx")) == pytest.approx(bx, abs=0.11)
        # d does not pass through the box
        assert not [w for w in by_class(root, "woven") if w.get("data-value") == src and w.get("data-axis") == "d"]
    # and does not leave it: S carries no d wire, the woven q and x do run through
    assert not [w for w in by_class(root, "wire") if w.get("data-value") == "S" and w.get("data-axis") == "d"]
    woven = {(w.get("data-value"), w.get("data-axis")) for w in by_class(root, "woven")}
    assert ("Q", "q") in woven and ("K", "x") in woven
    joins = [c for c in by_class(root, "join") if c.get("data-box") == "S"]
    assert [c.get("data-axis") for c in joins] == ["d"]


def test_normalised_axis_ends_and_restarts_at_softmax():
    root = parse(render_svg(library.get("softmax")))
    box = by_class(root, "box")[0]
    bx, bw = float(box.get("x")), float(box.get("width"))
    end = [c for c in by_class(root, "end") if c.get("data-axis") == "x"]
    start = [c for c in by_class(root, "start") if c.get("data-axis") == "x"]
    assert len(end) == 1 and float(end[0].get("cx")) == pytest.approx(bx, abs=0.11)
    assert len(start) == 1 and float(start[0].get("cx")) == pytest.approx(bx + bw, abs=0.11)
    woven = [w.get("data-axis") for w in by_class(root, "woven")]
    assert woven == ["r"]


def test_dashed_separator_between_three_inputs():
    d = bound_attention()
    lay = compute_layout(d)
    assert lay.columns[0].items == ("input:Q", "input:K", "input:V")
    root = parse(render_svg(d))
    seps = [s for s in by_class(root, "sep") if s.get("data-column") == "0"]
    assert len(seps) == 2 and all(s.get("stroke-dasharray") for s in seps)
    # each separator lies between two input bundles
    first_y = {}
    for w in by_class(root, "wire"):
        if w.get("data-value") in ("Q", "K", "V"):
            x, y = path_points(w.get("d"))[0]
            first_y.setdefault(w.get("data-value"), []).append(y)
    ys = sorted(float(s.get("y1")) for s in seps)
    assert max(first_y["Q"]) < ys[0] < min(first_y["K"])
    assert max(first_y["K"]) < ys[1] < min(first_y["V"])


def test_several_outputs_are_separated():
    a, b = Axis("a", 8), Axis("b", 4)
    X = array("X", a, b)
    d = Diagram("two", (softmax(X, over=b, name="P"), contract(X, X, over=b, name="N")))
    root = parse(render_svg(d))
    out_col = str(compute_layout(d).n_columns - 1)
    assert len([s for s in by_class(root, "sep") if s.get("data-column") == out_col]) == 1
    assert {el.text for el in by_class(root, "output-name")} == {"P", "N"}


def test_broadcast_marker_for_an_input_lacking_a_woven_axis():
    root = parse(render_svg(library.get("mlp")))
    marks = [(c.get("data-value"), c.get("data-axis")) for c in by_class(root, "broadcast") if tag(c) == "circle"]
    assert marks == [("bias", "a")]


def test_independent_boxes_share_a_column():
    lay = compute_layout(library.get("transformer_block"))
    col = {b.name: b.column for b in lay.boxes}
    assert col["Kp"] == col["Vp"] == col["Qp"]
    assert col["K"] == col["V"]
    assert col["S"] > col["K"] > col["Kp"] > col["Xn"]
    assert len(lay.boxes) == 21
    # nothing overlaps within a column
    for c in set(col.values()):
        bs = sorted((b for b in lay.boxes if b.column == c), key=lambda b: b.y)
        for u, v in zip(bs, bs[1:]):
            assert u.y + u.h < v.y


def test_rendering_is_deterministic():
    a = render_svg(library.get("transformer_block").bind(q=2048, e=1024, h=8, d=128, f=4096))
    b = render_svg(library.get("transformer_block").bind(q=2048, e=1024, h=8, d=128, f=4096))
    assert a == b
    assert render_svg(bound_attention(), relabels={"q": "g_q"}) == render_svg(bound_attention(), relabels={"q": "g_q"})


def test_wire_colors_and_legend():
    colors = {"Q": "HBM", "K": "smem", "S": "RF", "O": "GMEM"}
    svg = render_svg(bound_attention(), wire_colors=colors)
    root = parse(svg)
    for arr, level in (("Q", "HBM"), ("K", "SMEM"), ("S", "RF"), ("O", "HBM")):
        strokes = {w.get("stroke") for w in by_class(root, "wire") if w.get("data-value") == arr}
        assert strokes == {LEVEL_COLORS[level]}
    plain = {w.get("stroke") for w in by_class(root, "wire") if w.get("data-value") == "V"}
    assert plain == {RenderOptions().wire_color}
    assert [s.get("data-level") for s in by_class(root, "legend-swatch")] == ["HBM", "SMEM", "RF"]
    assert {"HBM", "SMEM", "RF"} <= set(texts(root))
    assert not by_class(parse(render_svg(bound_attention())), "legend-swatch")
    with pytest.raises(DiagramError, match="memory level"):
        render_svg(bound_attention(), wire_colors={"Q": "DISK"})
    with pytest.raises(DiagramError, match="no array 'Z'"):
        render_svg(bound_attention(), wire_colors={"Z": "HBM"})
    assert set(LEVEL_COLORS) == {"HBM", "L2", "SMEM", "RF", "TC"}


def test_relabels_replace_the_axis_label_with_a_marker():
    root = parse(render_svg(bound_attention(), relabels={"q": "g_q", "x": "s_x"}))
    labels = [el.text for el in by_class(root, "axis-label")]
    assert "g_q" in labels and "s_x" in labels
    assert not [t for t in labels if t.split()[0] in ("q", "x")]
    assert "d 128" in labels
    marks = by_class(root, "relabel")
    assert marks and {m.get("data-axis") for m in marks} == {"q", "x"}
    assert {m.get("data-label") for m in marks} == {"g_q", "s_x"}
    with pytest.raises(DiagramError, match="no axis 'z'"):
        render_svg(bound_attention(), relabels={"z": "g_z"})


def test_title_and_style_options():
    d = library.get("matmul")
    assert "matmul — C = A·B" in texts(parse(render_svg(d)))
    assert not by_class(parse(render_svg(d, title="")), "title")
    assert [el.text for el in by_class(parse(render_svg(d, title="A & B")), "title")] == ["A & B"]
    big = parse(render_svg(d, style={"pitch": 30.0}))
    small = parse(render_svg(d))
    assert float(big.get("height")) > float(small.get("height"))
    assert render_svg(d, style=RenderOptions(pitch=30.0)) == render_svg(d, style={"pitch": 30.0})
    with pytest.raises(DiagramError, match="unknown render style"):
        render_svg(d, style={"colour": "red"})


def test_inputs_enter_late_in_large_diagrams():
    lay = compute_layout(library.get("transformer_block"))
    assert "input:W2" not in lay.columns[0].items
    assert lay.columns[0].items[0] == "input:X"
    left = compute_layout(library.get("transformer_block"), RenderOptions(inputs="left"))
    assert sum(i.startswith("input:") for i in left.columns[0].items) == 10


def test_repr_svg_and_to_svg():
    d = bound_attention()
    svg = d._repr_svg_()
    assert svg == render_svg(d) == d.to_svg()
    parse(svg)
    assert d.to_svg(relabels={"q": "g_q"}) != svg


def test_diagram_without_boxes_and_scalar_outputs():
    a = Axis("a", 8)
    X = array("X", a)
    parse(render_svg(Diagram("ident", X)))
    s = contract(X, X, over=a, name="s")  # a scalar: no axes left
    root = parse(render_svg(Diagram("dot", s)))
    assert "scalar" in texts(root)


def test_importing_render_does_not_import_torch():
    code = ("import sys, napkin, napkin.diagrams.render, napkin.diagrams.dot; "
            "from napkin.diagrams import library; library.get('mha').to_svg(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
