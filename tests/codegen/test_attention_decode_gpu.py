"""Every head dimension, decode and short queries on the GPU (marked ``gpu``), through
``napkin.codegen.verify``: fresh random inputs, NaN-poisoned outputs, relative error against the
float64 reference under 1e-2.

- head dimensions 64, 80, 96, 128, 192 and 256, causal and not, sequence lengths that are no tile
  multiple, the planner's pick among the attention family's candidates and every tile of the
  head dimension's table;
- q = 1, 7 and 64 against x up to 32k: multi-head, GQA without a mask (the query heads of a
  key/value head packed into one tile) and the library's causal GQA (most splits of a top-left
  causal decode see no key), split over x with the combining launch;
- every decode tile, packed and split, for every head dimension, their warps along x merged
  through shared memory (one launch, or into the split's partials); masks and ALiBi in split tiles;
- the split sums are deterministic: the same inputs give the same bits.
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.attention import CONFIGS, DECODE_CONFIGS, FAMILY, AttentionConfig, _dbound
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core

pytestmark = pytest.mark.gpu

HEAD_DIMS = (64, 80, 96, 128, 192, 256)


def gqa_decode() -> Diagram:
    """GQA without a mask (the decode step sees the whole cache): Q[h,j,q,d], K, V[h,x,d]."""
    h, j, q, x, d = Axis("h"), Axis("j"), Axis("q"), Axis("x"), Axis("d")
    return Diagram("gqa_decode", attention_core(array("Q", h, j, q, d), array("K", h, x, d), array("V", h, x, d)))


def diagram(name) -> Diagram:
    return gqa_decode() if name == "gqa_decode" else library.get(name)


def sizes(name, **s):
    axes = diagram(name).axes
    base = {"h": 2, "j": 4}
    base.update(s)
    return {k: v for k, v in base.items() if k in axes}


def check(name, shapes, schedule=None, dtype="bf16"):
    from napkin.codegen.verify import verify

    report = verify(diagram(name), dtype=dtype, shapes=shapes, family="attention", schedule=schedule)
    print(report)
    assert report.ok, str(report)
    return report


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_head_dimensions(name, D):
    check(name, [sizes(name, q=1000, x=1000, d=D), sizes(name, q=77, x=301, d=D)])


@pytest.mark.parametrize("D", (80, 96, 192))
def test_every_tile_of_the_new_head_dimensions(D):
    for cfg in CONFIGS[D]:
        shape = sizes("attention_causal", q=333, x=333, d=D)
        d = library.get("attention_causal").with_dtype("bf16").bind(**shape)
        check("attention_causal", [shape], FAMILY.schedule(d, AttentionConfig(*cfg[:4], D, cfg[4])))


@pytest.mark.parametrize("name", ["gqa_decode", "gqa", "mha"])
@pytest.mark.parametrize("q", [1, 7, 64])
def test_decode_and_short_queries(name, q):
    check(name, [sizes(name, q=q, x=x, d=128) for x in (1000, 4097, 32768)])


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_every_decode_tile_packed_and_split(D):
    shape = sizes("gqa_decode", q=3, x=3001, d=D)
    d = gqa_decode().with_dtype("bf16").bind(**shape)
    tiles = DECODE_CONFIGS[_dbound(D, DECODE_CONFIGS)]
    cfgs = [AttentionConfig(*t[:4], D, t[4], splits=5, packed=True, wx=t[5]) for t in tiles]
    cfgs += [AttentionConfig(*tiles[0][:4], D, tiles[0][4], splits=5, wx=tiles[0][5]),       # split, unpacked
             AttentionConfig(*tiles[0][:4], D, tiles[0][4], packed=True, wx=tiles[0][5]),    # merged, one launch
             AttentionConfig(*tiles[0][:4], D, tiles[0][4], wx=tiles[0][5]),                 # merged, unpacked
             AttentionConfig(*tiles[-1][:4], D, tiles[-1][4], packed=True, wx=tiles[-1][5])]  # packed, one launch
    for cfg in cfgs:
        check("gqa_decode", [shape], FAMILY.schedule(d, cfg))


@pytest.mark.parametrize("name,q", [("attention_window", 33), ("attention_alibi", 1), ("attention_softcap", 7),
                                    ("gqa", 5)])
def test_masks_and_modifiers_in_split_tiles(name, q):
    shape = sizes(name, q=q, x=5000, d=64)
    d = library.get(name).with_dtype("bf16").bind(**shape)
    packed = name == "gqa"
    for wx in (1, 4):
        check(name, [shape], FAMILY.schedule(d, AttentionConfig(16 if q <= 16 else 64, 64, 16, 3, 64, 2, splits=7,
                                                                packed=packed, wx=wx if q <= 16 else 1)))


def test_split_sums_are_deterministic():
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.reference import random_inputs

    d = gqa_decode().with_dtype("bf16").bind(h=8, j=4, q=1, x=32768, d=128)
    k = napkin_compile(d, family="attention")
    assert len(k.program.launches) == 1 and k.program.buffers, "the planner's decode plan is split"
    ins = random_inputs(d, device="cuda", seed=3)
    args = [ins[n] for n in d.input_names]
    a = k(*args).clone()
    b = k(*args)
    torch.cuda.synchronize()
    assert torch.equal(a, b)
