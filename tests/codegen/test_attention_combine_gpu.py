"""Split-KV decode and its combine (in the last split block of a tile to arrive) on the GPU (marked ``gpu``), through
``napkin.codegen.verify``: fresh random inputs, NaN-poisoned outputs, relative error against the
float64 reference.

- q in {1, 3, 16, 64} against x that is no multiple of the chunk, GQA (query heads packed with q
  where two or more fit a tile, a block a query head otherwise) and multi-head;
- split counts whose partials a combining thread loads in one batch and in several (the running
  max of a thread's splits rescaled between batches), splits that see no key (more splits than
  chunks), and the planner's own pick;
- the split kernel leaves no output unwritten (NaN-poisoned outputs), agrees with the unsplit
  kernel of the same tile, and leaves its arrival counters zero after every launch.
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.attention import DECODE_CONFIGS, FAMILY, AttentionConfig, _dbound, combine_batch
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core

pytestmark = pytest.mark.gpu


def gqa_decode() -> Diagram:
    h, j, q, x, d = Axis("h"), Axis("j"), Axis("q"), Axis("x"), Axis("d")
    return Diagram("gqa_decode", attention_core(array("Q", h, j, q, d), array("K", h, x, d), array("V", h, x, d)))


def check(d: Diagram, shape: dict, schedule=None):
    from napkin.codegen.verify import verify

    report = verify(d, dtype="bf16", shapes=[shape], family="attention", schedule=schedule)
    print(report)
    assert report.ok, str(report)


def tile(D: int, rows: int, splits: int, packed: bool) -> AttentionConfig:
    """The first decode tile of the head dimension's table that holds ``rows`` rows."""
    for bq, bx, wq, st, nb, wx in DECODE_CONFIGS[_dbound(D, DECODE_CONFIGS)]:
        if bq >= rows:
            return AttentionConfig(bq, bx, wq, st, D, nb, splits=splits, packed=packed, wx=wx)
    raise AssertionError(f"no decode tile of {rows} rows at d={D}")


@pytest.mark.parametrize("q", [1, 3, 16, 64])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_split_decode_against_torch(q, D):
    shape = {"h": 2, "j": 4, "q": q, "x": 3001, "d": D}  # 47 chunks of 64: the last one partial
    d = gqa_decode().with_dtype("bf16").bind(**shape)
    packed = 4 * q <= 64
    rows = 4 * q if packed else q
    # one batch of loads a combining thread, and several (100 splits: more than SG x NB at d >= 128,
    # a thread's running max rescaled between batches); 60 and 100 splits of 47 chunks: splits that
    # see no key (they write 0 and -inf)
    assert combine_batch(5) == 5 and combine_batch(100) < 100
    for splits in (5, 60, 100):
        check(d, shape, FAMILY.schedule(d, tile(D, rows, splits, packed)))


@pytest.mark.parametrize("name,q", [("mha", 1), ("gqa", 3), ("mha", 16)])
def test_the_planners_decode_pick(name, q):
    shape = {"h": 4, "j": 4, "q": q, "x": 20000 + 17, "d": 128}
    d = library.get(name)
    check(d, {k: v for k, v in shape.items() if k in d.axes})


def test_split_and_one_launch_agree():
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.reference import random_inputs

    d = gqa_decode().with_dtype("bf16").bind(h=8, j=4, q=1, x=8191, d=128)
    ins = random_inputs(d, device="cuda", seed=5)
    args = [ins[n] for n in d.input_names]
    outs = []
    for splits in (1, 33):
        k = napkin_compile(d, schedule=FAMILY.schedule(d, tile(128, 4, splits, True)), family="attention")
        assert len(k.program.launches) == 1
        outs.append(k(*args).float())
        if splits > 1:  # the counters were left zero: a second call (and a tenth) gives the same bits
            again = [k(*args) for _ in range(9)]
            assert all(torch.equal(a.float(), outs[-1]) for a in again)
            torch.cuda.synchronize()
            (counters,) = [t for ts, _ in k._runners[torch.cuda.current_device()]._zeroed.values() for t in ts]
            assert int((counters.view(torch.int32) != 0).sum()) == 0
    torch.cuda.synchronize()
    assert torch.isfinite(outs[1]).all()
    err = (outs[0] - outs[1]).abs().max().item() / outs[0].abs().max().item()
    assert err < 1e-2, err
