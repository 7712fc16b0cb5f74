"""The scheduled SVG of a plan (issue #14): each wire shows its own kernel's tiles.

A plan of several kernels used to label every wire of an axis with the first kernel's tile size
(``g_q=4`` from the RMSNorm kernel on the attention and MLP wires of a transformer block). Now an
array's wires carry the tiles of the one kernel that computes (or, for an input, reads) it, an
array passed between kernels (an HBM buffer) carries none, and every box is tagged with its
kernel. A plan of one kernel is drawn as before.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from napkin.codegen.planner import derive
from napkin.diagrams import library
from napkin.diagrams.render import render_svg
from napkin.errors import DiagramError
from napkin.perfmodel.view import level_colors, relabel_labels, scheduled_svg

REPO = Path(__file__).resolve().parents[2]
NS = "{http://www.w3.org/2000/svg}"


def texts_of(root, cls):
    return [el for el in root.iter() if el.get("class") == cls]


def smem_tiles(kernel) -> dict[str, str]:
    """Axis → the first SMEM relabelling of ``kernel`` as drawn (``g_q=128``)."""
    out: dict[str, str] = {}
    for r in kernel.relabels:
        if r.level == "SMEM":
            out.setdefault(r.axis, f"{r.symbol}={r.size}")
    return out


@pytest.fixture(scope="module")
def block_plan():
    plan = derive("transformer_block", "h100", "bf16", library.entry("transformer_block").default_sizes,
                  explain=False).plan
    assert len(plan.kernels) > 3
    return plan


def owners(plan):
    """Array → the kernels (1-based) that compute it or read it."""
    d = plan.diagram
    used: dict[str, set[int]] = {}
    for i, pk in enumerate(plan.kernels, 1):
        for b in pk.kernel.boxes:
            used.setdefault(b, set()).add(i)
            for a in d.value(b).args:
                used.setdefault(d.name_of(a), set()).add(i)
    return used


def test_each_wire_shows_its_own_kernels_tiles(block_plan):
    plan = block_plan
    root = ET.fromstring(scheduled_svg(plan))
    used = owners(plan)
    tiles = [smem_tiles(pk.kernel) for pk in plan.kernels]
    labels = texts_of(root, "axis-label")
    assert labels
    seen_q: dict[int, str] = {}
    for el in labels:
        arr, axis, text = el.get("data-value"), el.get("data-axis"), el.text
        k = el.get("data-kernel")
        if k is not None:  # a tiled wire: the tiles of the one kernel that uses the array
            k = int(k)
            assert used[arr] == {k}, (arr, used[arr], k)
            assert text == tiles[k - 1][axis], (arr, axis, text, k)
            if axis == "q":
                seen_q[k] = text
        elif len(used.get(arr, ())) > 1:  # an HBM buffer between kernels: no tile
            size = plan.diagram.sizes[axis]
            assert text == f"{axis} {size}", (arr, axis, text)
        else:  # one kernel, which does not tile this axis
            assert "=" not in text, (arr, axis, text)
    # the defect: kernels tile q differently, and each shows its own (not the first kernel's)
    assert len(set(seen_q.values())) >= 2, seen_q
    first_q = tiles[0]["q"]
    for k, text in seen_q.items():
        if tiles[k - 1]["q"] != first_q:
            assert text != first_q


def test_each_box_is_tagged_with_its_kernel(block_plan):
    plan = block_plan
    root = ET.fromstring(scheduled_svg(plan))
    kernel_of = {b: i for i, pk in enumerate(plan.kernels, 1) for b in pk.kernel.boxes}
    boxes = texts_of(root, "op")
    assert len(boxes) == len(plan.diagram.nodes)
    for g in boxes:
        name = g.get("data-name")
        k = kernel_of[name]
        assert g.get("data-kernel") == str(k)
        label = [el for el in g.iter() if el.get("class") == "box-label"][0].text
        assert label.startswith(f"k{k} · "), label
    assert {g.get("data-kernel") for g in boxes} == {str(i) for i in range(1, len(plan.kernels) + 1)}


def test_arrays_between_kernels_are_hbm(block_plan):
    plan = block_plan
    colors = level_colors(plan.schedule)
    d = plan.diagram
    for arr, ks in owners(plan).items():
        if len(ks) > 1 and arr not in d.output_names:
            assert colors[arr] == "HBM", arr


def test_the_schedule_and_the_plan_draw_the_same(block_plan):
    assert scheduled_svg(block_plan) == scheduled_svg(block_plan.schedule)


@pytest.mark.parametrize("name,sizes", [("attention_causal", None), ("matmul", {"a": 512, "b": 256, "c": 384}),
                                        ("layernorm", None)])
def test_a_single_kernel_plan_is_drawn_as_before(name, sizes):
    plan = derive(name, "h100", "bf16", sizes or library.entry(name).default_sizes, explain=False).plan
    assert len(plan.kernels) == 1
    s = plan.schedule
    svg = scheduled_svg(plan)
    assert svg == render_svg(s.diagram, wire_colors=level_colors(s), relabels=relabel_labels(s))
    assert "data-kernel" not in svg and " · " not in svg
    root = ET.fromstring(svg)
    tiles = smem_tiles(plan.kernels[0].kernel)
    for el in texts_of(root, "axis-label"):
        if el.get("data-axis") in tiles:
            assert el.text == tiles[el.get("data-axis")]


def test_plain_render_has_no_kernel_marks():
    svg = render_svg(library.get("transformer_block"))
    assert "data-kernel" not in svg and " · " not in svg


def test_render_checks_its_kernel_and_array_labels():
    d = library.get("attention").bind(q=64, x=64, d=16)
    for kw, pattern in ((dict(array_relabels={"Z": {"q": "g"}}), "has no array 'Z'"),
                        (dict(array_relabels={"S": {"zz": "g"}}), "has no axis 'zz'"),
                        (dict(array_relabels={"S": {"q": ""}}), "non-empty string"),
                        (dict(array_relabels={"S": "g_q"}), "must be a mapping"),
                        (dict(kernels={"Z": 1}), "has no array 'Z'"),
                        (dict(kernels={"S": 0}), "positive integer"),
                        (dict(kernels={"S": True}), "positive integer")):
        with pytest.raises(DiagramError, match=pattern):
            render_svg(d, **kw)
    svg = render_svg(d, relabels={"q": "g_q=8"}, array_relabels={"O": {}}, kernels={"S": 2, "O": 3})
    root = ET.fromstring(svg)
    by = {(el.get("data-value"), el.get("data-axis")): el for el in texts_of(root, "axis-label")}
    assert by[("S", "q")].text == "g_q=8" and by[("O", "q")].text == "q 64"
    assert by[("Q", "q")].text == "g_q=8" and by[("Q", "q")].get("data-kernel") is None
    assert by[("S", "q")].get("data-kernel") == "2"


def test_cli_derive_svg_of_a_block(tmp_path):
    out = tmp_path / "block.svg"
    r = subprocess.run([sys.executable, "-m", "napkin", "derive", "transformer_block", "--svg", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    root = ET.fromstring(out.read_text())
    qs = {el.text for el in texts_of(root, "axis-label") if el.get("data-axis") == "q" and el.get("data-kernel")}
    assert len(qs) >= 2, qs  # (the block's kernels tile q in more than one way: each wire shows its own)
