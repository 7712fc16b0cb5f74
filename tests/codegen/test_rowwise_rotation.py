"""The row-wise family's rotated grid, without a GPU: rows whose length is not a whole number of
16-byte vectors (4095, 1001, a group of 5 x 999) start each row's chunks at its first 16-byte
boundary, so that every whole chunk is one aligned access; which kernels rotate and which keep their
grid, and which chunks skip the wrap and bounds checks (those inside the row whatever the rotation).
The GPU side (results, misaligned tensors) is tests/codegen/test_rowwise_rotation_gpu.py."""

from __future__ import annotations

import pytest

from napkin.codegen.families import rowwise
from napkin.codegen.families.rowwise import FAMILY, analyse, body_chunks, rotation_source
from napkin.codegen.prepare import prepare
from napkin.diagrams import library

ROTATED = [
    ("softmax", dict(r=64, x=4095)),
    ("layernorm", dict(r=64, x=1001)),
    ("rmsnorm", dict(r=5, x=2999)),
    ("softmax", dict(r=300, x=37)),            # several rows a warp, each with its own rotation
    ("log_softmax", dict(r=64, x=4095)),       # a chain in registers, three passes
    ("group_norm", dict(n=2, g=4, c=5, s=999)),  # a row of two axes (4995 values)
]


def bound(name: str, sizes: dict, dtype: str):
    return prepare(library.get(name), sizes=sizes, dtype=dtype)


def _launches(d, dtype):
    for s in FAMILY.candidates(d, "h100", dtype):
        cfg = FAMILY.config(d, s)
        (k,) = FAMILY.lower(d, s, "sm_90a").launches
        yield s, cfg, k


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name, sizes", ROTATED)
def test_rows_of_no_whole_vectors_rotate_their_grid(name, sizes, dtype):
    d = bound(name, sizes, dtype)
    shape = analyse(d)
    src_input = rotation_source(shape)
    assert src_input is not None and src_input.name == "X"
    seen = 0
    for s, cfg, k in _launches(d, dtype):
        if getattr(cfg, "stream", False):
            assert "load_vec_rot" not in k.source
            continue
        seen += 1
        # the row's rotation comes from X's own row start, and X's chunks load as aligned vectors
        assert "napkin::values_to_boundary(in_X + off_X)" in k.source
        assert "napkin::load_vec_rot_own(" in k.source and "napkin::load_vec(" not in k.source
        assert "store_vec_rot(" in k.source and "napkin::store_vec(" not in k.source
        body = body_chunks(shape, cfg)
        # every chunk a thread skips the checks for lies inside the row whatever the rotation ...
        for rot in range(shape.vec):
            last = (body * cfg.threads_per_row - 1) * shape.vec + rot + shape.vec
            assert last <= shape.xsize, (cfg, rot)
        # ... and all but the last one or two chunks of a thread do
        assert body >= cfg.chunks_per_thread - 2, cfg
        assert f"BODY_CHUNKS = {body};" in k.source
    assert seen


@pytest.mark.parametrize("name, sizes, dtype", [
    ("softmax", dict(r=64, x=4096), "bf16"),            # whole vectors: nothing to rotate
    ("softmax", dict(r=64, x=4092), "fp32"),            # whole fp32 vectors (4 values)
    ("layernorm", dict(r=64, x=5), "bf16"),             # shorter than a vector
    ("log_softmax", dict(r=4, x=70001), "bf16"),        # streamed: the chunk loop is not unrolled
])
def test_other_rows_keep_their_grid(name, sizes, dtype):
    d = bound(name, sizes, dtype)
    for _, cfg, k in _launches(d, dtype):
        assert "load_vec_rot" not in k.source and "values_to_boundary" not in k.source


def test_column_reductions_keep_their_grid():
    # the layernorm backward's dgamma and dbeta sum columns over the rows: a thread owns fixed columns
    d = prepare(library.get("layernorm").grad(), sizes=dict(r=4000, x=999), dtype="bf16")
    shape = analyse(d)
    assert shape.cols and rotation_source(shape) is None
    for _, cfg, k in _launches(d, "bf16"):
        assert "load_vec_rot" not in k.source


def test_the_plan_says_the_grid_is_rotated():
    d = bound("softmax", dict(r=64, x=4095), "bf16")
    s = FAMILY.candidates(d, "h100", "bf16")[0]
    (k,) = FAMILY.lower(d, s, "sm_90a").launches
    assert "grid is rotated to start where X's row meets a 16-byte boundary" in k.source
    assert rowwise.TEMPLATE == k.template
