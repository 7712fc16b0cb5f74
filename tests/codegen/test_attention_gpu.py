"""The streamed attention family on the GPU (marked ``gpu``), through ``napkin.codegen.verify``:
every library attention diagram at bf16 (fp16 for some), head dimensions 64, 128 and 256, query
and key lengths that are not multiples of any tile (1000, 4097, 77, q != x), every tile
configuration; fresh random inputs, NaN-poisoned outputs, relative error against the float64
reference under 1e-2.
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.attention import CONFIGS, FAMILY, AttentionConfig
from napkin.diagrams import library

pytestmark = pytest.mark.gpu

LIBRARY = ("attention", "mha", "attention_causal", "gqa", "attention_window", "attention_alibi",
           "attention_softcap")


def sizes(name, **s):
    axes = library.get(name).axes
    base = {"h": 2, "j": 3}
    base.update(s)
    return {k: v for k, v in base.items() if k in axes}


def check(name, dtype, shapes, schedule=None):
    from napkin.codegen.verify import verify

    report = verify(library.get(name), dtype=dtype, shapes=shapes, family="attention", schedule=schedule)
    print(report)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", LIBRARY)
def test_library_bf16(name):
    check(name, "bf16", [sizes(name, q=1000, x=1000, d=128), sizes(name, q=77, x=77, d=64),
                         sizes(name, q=300, x=1000, d=64)])


@pytest.mark.parametrize("name", ["mha", "attention_causal", "gqa"])
def test_long_ragged(name):
    check(name, "bf16", [sizes(name, q=4097, x=4097, d=64, h=1, j=2)])


@pytest.mark.parametrize("name", ["mha", "attention_causal", "attention_window"])
def test_head_dim_256(name):
    check(name, "bf16", [sizes(name, q=1000, x=1000, d=256), sizes(name, q=77, x=200, d=256)])


@pytest.mark.parametrize("name", ["mha", "attention_causal", "attention_alibi"])
def test_fp16(name):
    check(name, "fp16", [sizes(name, q=1000, x=1000, d=128), sizes(name, q=1000, x=77, d=64)])


@pytest.mark.parametrize("cfg", [(bq, bx, wq, st, D, nb) for D, cs in CONFIGS.items() for bq, bx, wq, st, nb in cs],
                         ids=lambda c: f"d{c[4]}-q{c[0]}-x{c[1]}-w{c[2]}")
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_every_configuration(name, cfg):
    run_config(name, cfg)


@pytest.mark.parametrize("name", ["attention", "attention_window", "attention_alibi", "gqa"])
def test_register_substream(name):
    run_config(name, (128, 64, 32, 2, 128, 2, 32))  # chunks of 64 keys walked 32 at a time


def run_config(name, cfg):
    shape = sizes(name, q=1000, x=1000, d=cfg[4])
    d = library.get(name).with_dtype("bf16").bind(**shape)
    check(name, "bf16", [shape], schedule=FAMILY.schedule(d, AttentionConfig(*cfg)))
