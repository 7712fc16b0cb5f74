"""The row-wise family's rotated grid, without a GPU: rows whose length is not a whole number of
16-byte vectors (4095, 1001, a group of 5 x 999) start each row's chunks at its first 16-byte
boundary, so that every whole chunk is one aligned access; which kernels rotate and which keep their
grid, and which chunks skip the wrap and bounds checks (those inside the row whatever the rotation).
The GPU side (results, misaligned tensors) is tests/codegen/test_rowwise_rotation_gpu.py."""

from __future__ import annotations

import re

import pytest

from napkin.codegen.families import rowwise
from napkin.codegen.families.rowwise import FAMILY, analyse, body_chunks, rotation_period, rotation_source
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
])
def test_other_rows_keep_their_grid(name, sizes, dtype):
    d = bound(name, sizes, dtype)
    for _, cfg, k in _launches(d, dtype):
        assert "load_vec_rot" not in k.source and "values_to_boundary" not in k.source


def test_streamed_rows_are_shifted_not_rotated():
    # the chunk loop of a streamed row is not unrolled, so a rotated chunk's wrap checks would stay
    # in every chunk: its grid is shifted to the row's 16-byte lines instead (test_rowwise_streamed.py)
    d = bound("log_softmax", dict(r=4, x=70001), "bf16")
    for _, cfg, k in _launches(d, "bf16"):
        assert cfg.stream and "load_vec_rot" not in k.source
        # its input X copied into shared memory (the chunks off the lines by load_vec_sh), or read by it
        assert "load_vec_sh" in k.source or "cache_chunk_async(" in k.source


def test_column_reductions_keep_their_grid_with_the_switch_off(monkeypatch):
    # the layernorm backward's dgamma and dbeta sum columns over the rows: a thread owns fixed
    # columns; with ROTATE_COLUMN_KERNELS off (the switch kept to compare the two) nothing rotates
    monkeypatch.setattr(rowwise, "ROTATE_COLUMN_KERNELS", False)
    d = prepare(library.get("layernorm").grad(), sizes=dict(r=4000, x=999), dtype="bf16")
    shape = analyse(d)
    assert shape.cols and rotation_source(shape) is None
    for _, cfg, k in _launches(d, "bf16"):
        assert "load_vec_rot" not in k.source and rotation_source(shape, cfg) is None


def test_the_planner_rotates_a_16_bit_norm_backward_over_odd_rows():
    # on by default: the pick for the layernorm backward over 4096 x 4095 bf16 runs the rotated grid
    from napkin.codegen.api import compile

    grad = library.get("layernorm").grad(save={"N_rstd", "N_mean"})
    cd = compile(grad, sizes=dict(r=4096, x=4095), dtype="bf16", gpu="h200")
    (launch,) = cd.program.launches
    assert "same_lines" in launch.source and "load_vec_rot" in launch.source


@pytest.fixture
def rotate_columns(monkeypatch):
    monkeypatch.setattr(rowwise, "ROTATE_COLUMN_KERNELS", True)


@pytest.mark.parametrize("dtype, period", [("bf16", 8), ("fp16", 8)])
@pytest.mark.parametrize("sizes", [dict(r=4000, x=999), dict(r=4096, x=4095), dict(r=300, x=77)])
def test_column_reductions_rotate_where_a_block_steps_whole_periods_of_rows(rotate_columns, sizes, dtype, period):
    """With ROTATE_COLUMN_KERNELS: the layernorm backward's blocks step over rows SPLITS *
    ROWS_PER_BLOCK apart; the family rounds SPLITS so that this is a multiple of the rows after
    which a row starts at the same place in its line again, and every row of a slot then has its
    first row's rotation. The kernel takes the rotated grid where the arrays it reads and writes
    unchecked start at the same place in their lines as the rotation's own (checked once a block),
    else the unrotated one, and writes its partials back to their columns."""
    d = prepare(library.get("layernorm").grad(), sizes=sizes, dtype=dtype)
    shape = analyse(d)
    assert shape.cols and rotation_period(shape) == period
    assert rotation_source(shape) is None            # no configuration: no block step to rely on
    seen = 0
    for _, cfg, k in _launches(d, dtype):
        stepped = cfg.splits * cfg.rows_per_block % period == 0
        assert stepped or cfg.splits < period, cfg   # rounded wherever there are blocks to round
        # a budget cut for two blocks an SM, and threads with no chunk surely inside the row, keep their grid
        stepped = stepped and cfg.blocks_per_sm is None and body_chunks(shape, cfg) >= 1
        assert (rotation_source(shape, cfg) is not None) == stepped
        src = k.source
        if not stepped:
            assert "load_vec_rot" not in src and "same_lines" not in src
            continue
        seen += 1
        assert src.count("constexpr bool RT = ") == 2 and "if (same_lines) {" in src
        (check,) = [line for line in src.splitlines() if "const bool same_lines =" in line]
        name = rotation_source(shape, cfg).name
        assert f"napkin::values_to_boundary(in_{name} + ((long long)blockIdx.x" in src
        # every array a rotated path reads or writes unchecked shares the rotation's place in its lines
        unchecked = set(re.findall(r"napkin::load_vec_rot_own\((?:pf_\w+\[d\]\[u\]|\w+\[u\]), (\w+)", src))
        unchecked |= set(re.findall(r"napkin::store_vec_rot_own\((\w+)", src))
        assert unchecked and f"in_{name}" in unchecked, src
        for a in unchecked - {f"in_{name}"}:
            assert f"reinterpret_cast<unsigned long long>({a})) & 15ULL) == 0ULL" in check, a
        assert "slot_rot[slot] = rot;" in src and "word_at(i, slot_rot[s])" in src
    assert seen


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_rotated_column_kernels_build_under_nvrtc_and_nvcc_within_the_model(rotate_columns, name):
    """The planner's picks of the norm backwards over odd rows, rotated: NVRTC's JIT mode takes them
    (it refuses what nvcc takes: a generic lambda, a function with no execution space) and nvcc
    builds them within the model's registers, without spills, for sm_80 and sm_90a."""
    from napkin_test_support import nvrtc_errors, nvrtc_library

    from napkin.codegen import compile
    from napkin.kernels import nvcc_compile
    from napkin.kernels.compile import BASE_OPTIONS, cuda_include_dirs
    from napkin.kernels.library import inline_library

    lib = nvrtc_library()
    saves = {"rmsnorm": {"N_rstd"}, "layernorm": {"N_rstd", "N_mean"}}[name]
    grad = library.get(name).grad(save=saves)
    built = 0
    for sizes in (dict(r=4096, x=4095), dict(r=16384, x=4095), dict(r=4000, x=999), dict(r=8192, x=1001),
                  dict(r=4096, x=2999), dict(r=300, x=77)):
        for gpu, arch in (("h200", "sm_90a"), ("a100", "sm_80")):
            (k,) = compile(grad, sizes=sizes, dtype="bf16", gpu=gpu).launches
            if "same_lines" not in k.source:
                continue
            built += 1
            if lib is not None and cuda_include_dirs():
                opts = [f"--gpu-architecture={arch}", *BASE_OPTIONS, *(f"-I{d}" for d in cuda_include_dirs())]
                log = nvrtc_errors(lib, inline_library(k.source, filename="k.cu"), "k.cu", opts)
                assert log is None, log[:3000]
            r = nvcc_compile(k.source, arch)[k.name]
            assert r.spill_stores == 0 and r.spill_loads == 0, (sizes, arch, r)
            assert r.registers <= k.model_regs_per_thread, (sizes, arch, r.registers, k.model_regs_per_thread)
    assert built >= 8


def test_the_plan_says_the_grid_is_rotated():
    d = bound("softmax", dict(r=64, x=4095), "bf16")
    s = FAMILY.candidates(d, "h100", "bf16")[0]
    (k,) = FAMILY.lower(d, s, "sm_90a").launches
    assert "grid is rotated to start where X's row meets a 16-byte boundary" in k.source
    assert rowwise.TEMPLATE == k.template


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name, sizes", [("softmax", dict(r=65536, x=77)), ("layernorm", dict(r=8191, x=1001)),
                                         ("log_softmax", dict(r=64, x=4095))])
def test_a_rotated_row_stores_whole_vectors(tmp_path, name, sizes, dtype):
    """Each output chunk inside the row leaves as one 16-byte store: nvcc 13 wrote the C++ store of
    a uint4 whose address it could not prove aligned (a rotated row's, checked at run time) as
    scalar stores, so the softmax over 65536 fp32 rows of 77 took 38.0 us of kernel on an H200
    where its vector stores take 13.8 (``memory.cuh``: ``store16_global``). Read from the PTX: the
    kernel has at least as many vector stores as a thread has chunks inside the row."""
    import shutil
    import subprocess

    from napkin.kernels.library import inline_library

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    d = bound(name, sizes, dtype)
    s, cfg, k = next((s, cfg, k) for s, cfg, k in _launches(d, dtype) if not getattr(cfg, "stream", False))
    assert "grid is rotated" in k.source
    src = tmp_path / "k.cu"
    src.write_text(inline_library(k.source, filename="k.cu"))
    subprocess.run([nvcc, "-ptx", "-arch=sm_90a", str(src), "-o", str(tmp_path / "k.ptx")], check=True,
                   capture_output=True, timeout=300)
    ptx = (tmp_path / "k.ptx").read_text()
    vector = len(re.findall(r"\bst\.global(?:\.[a-z0-9]+)*\.v4\.", ptx))
    body = body_chunks(analyse(d), cfg)
    assert body >= 1 and vector >= body, (vector, body, cfg)
