"""The Hopper attention template at head dimensions 80, 96, 192 and 256 and with GQA packing, on an
sm_90 GPU (marked ``gpu``; skipped elsewhere), through ``napkin.codegen.verify``: fresh random
inputs, NaN-poisoned outputs, relative error against the float64 reference under 1e-2. Every
configuration of the new tables, causal and not, sequence lengths that are not tile multiples and
q != x; P V at N = D and at the padded N = DP; packed tiles of 2, 4 and 8 heads, groups that do not
divide the heads (the last tile's rows past the axis are not stored), causal and not.
"""

from __future__ import annotations

import dataclasses

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families import attention_wgmma as W
from napkin.codegen.families.attention import FAMILY
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core

pytestmark = pytest.mark.gpu

NEW_DIMS = (80, 96, 192, 256)


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper("the wgmma attention template")


def gqa_full() -> Diagram:
    Q = array("Q", Axis("h"), Axis("j"), Axis("q"), Axis("d"))
    K, V = array("K", Axis("h"), Axis("x"), Axis("d")), array("V", Axis("h"), Axis("x"), Axis("d"))
    return Diagram("gqa_full", attention_core(Q, K, V))


def diagram(name):
    return gqa_full() if name == "gqa_full" else library.get(name)


def run(name, cfg, **sizes):
    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.verify import verify_compiled

    dg = diagram(name)
    sizes = {"h": 2, "j": 3, **sizes}
    d = dg.bind(**{k: v for k, v in sizes.items() if k in dg.axes})
    rows = verify_compiled(CompiledDiagram(W.lower_config(FAMILY, d, cfg), arch="sm_90a"))
    print(name, cfg, sizes, [(r.rel_error, r.nan_count) for r in rows])
    assert rows and all(r.ok for r in rows), (name, cfg, sizes, rows)


@pytest.mark.parametrize("cfg", [c for D in NEW_DIMS for c in W.configs(D)],
                         ids=lambda c: f"d{c.D}-q{c.BQ}-x{c.BX}-s{c.stages}")
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_new_head_dims(name, cfg):
    for q, x in ((1000, 1000), (300, 1000), (1000, 129), (3 * cfg.BX - 5, 3 * cfg.BX)):
        run(name, cfg, q=q, x=x, d=cfg.D)


@pytest.mark.parametrize("D", NEW_DIMS)
@pytest.mark.parametrize("name", ["attention_window", "attention_alibi", "attention_softcap", "gqa"])
def test_new_head_dims_library(name, D):
    run(name, W.configs(D)[0], q=777, x=777, d=D)


@pytest.mark.parametrize("D", [80, 96])
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_padded_pv(name, D):
    for c in W.configs(D):
        run(name, dataclasses.replace(c, pad_pv=not c.pad_pv), q=777, x=1000, d=D)


@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("name", ["gqa", "gqa_full"])
def test_packed(name, D):
    base = W.configs(D)[0]
    for g in W.PACKS:
        if (base.BQ // g) % 16:
            continue
        cfg = dataclasses.replace(base, pack=g, persistent=False)
        for q, x, j in ((1000, 1000, 4), (129, 777, 3), (300, 300, 8), (65, 1000, 5)):
            run(name, cfg, q=q, x=x, j=j, d=D)


def test_packed_fp16_and_every_table_entry():
    for c in W.configs(128) + W.configs(64):
        run("gqa", dataclasses.replace(c, pack=2, persistent=False), q=777, x=777, j=4, d=c.D)
    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.verify import verify_compiled

    d = library.get("gqa").with_dtype("fp16").bind(h=2, j=4, q=500, x=500, d=128)
    rows = verify_compiled(CompiledDiagram(W.lower_config(FAMILY, d, dataclasses.replace(W.configs(128)[0], pack=4, persistent=False)),
                                           arch="sm_90a"))
    assert all(r.ok for r in rows), rows


def test_the_planner_runs_the_new_dims_on_wgmma():
    from napkin.codegen.api import compile as compile_diagram
    from napkin.codegen.verify import verify_compiled

    for D in (96, 256):
        d = library.get("mha").bind(h=16, q=2048, x=2048, d=D)
        c = compile_diagram(d)
        assert [k.template for k in c.program.launches] == ["attention_wgmma.cu.jinja"]
        assert all(r.ok for r in verify_compiled(c))


#: Configurations beyond the tables (other chunks and loops at d = 80 and 96), built and checked so
#: that a measurement can promote them.
MORE = [W.WgmmaAttentionConfig(96, 80, 3, 3, overlap=True), W.WgmmaAttentionConfig(96, 64, 3, 3),
        W.WgmmaAttentionConfig(80, 80, 3, 3, overlap=True), W.WgmmaAttentionConfig(96, 128, 2, 3),
        W.WgmmaAttentionConfig(96, 64, 3, 4, overlap=True), W.WgmmaAttentionConfig(256, 64, 1, 3),
        W.WgmmaAttentionConfig(256, 80, 2, 2, overlap=True), W.WgmmaAttentionConfig(256, 64, 2, 2, overlap=True),
        W.WgmmaAttentionConfig(192, 112, 2, 2, overlap=True)]


@pytest.mark.parametrize("cfg", MORE, ids=str)
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_more_configurations(name, cfg):
    for q, x in ((1000, 1000), (129, 777)):
        run(name, cfg, q=q, x=x, d=cfg.D)
