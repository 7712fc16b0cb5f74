"""Rows of one or two 16-byte chunks: fewer than four threads a row only where each reads its
whole row in one access, on 256-thread blocks (the row-wise family's ``few_threads_fit``)."""

import pytest

from napkin.codegen.families import rowwise as rw
from napkin.codegen.prepare import prepare
from napkin.diagrams import library


def _options(name, x, dtype):
    d = prepare(library.get(name), sizes=dict(r=4096, x=x), dtype=dtype)
    return [(s.kernels[0].options.threads_per_row, s.kernels[0].options.warps * 32)
            for s in rw.FAMILY.candidates(d, "h200", dtype)]


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "log_softmax"])
def test_a_row_of_one_chunk_runs_a_thread_or_two_a_row_on_256_threads(name):
    opts = _options(name, 2, "bf16")
    assert opts and {t for t, _ in opts} == {1, 2}
    assert {b for _, b in opts} == {256}


@pytest.mark.parametrize("name, x, dtype, fewest", [("softmax", 16, "bf16", 2), ("softmax", 16, "fp32", 4),
                                                     ("layernorm", 64, "bf16", 4), ("rmsnorm", 8, "fp32", 2)])
def test_fewer_threads_than_chunks_are_not_offered(name, x, dtype, fewest):
    # a thread a row over a row of several chunks reads a thin slice of every row an access
    assert min(t for t, _ in _options(name, x, dtype)) == fewest


def test_the_rule():
    assert rw.few_threads_fit(1, 1) and rw.few_threads_fit(2, 2) and rw.few_threads_fit(4, 64)
    assert not rw.few_threads_fit(1, 2) and not rw.few_threads_fit(2, 3)
    assert rw.row_blocks(1) == (256,) and rw.row_blocks(2) == (128,) and rw.row_blocks(4) == (32, 64)
    assert rw.row_blocks(64) == (1,)
