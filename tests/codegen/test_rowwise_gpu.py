"""The row-wise family on a GPU: softmax, layernorm and rmsnorm (and fused prologue/epilogue
variants) against the float64 reference, rows of 1000 to 32768 values, bf16/fp16/fp32; the
calling conventions of CompiledDiagram; NaN poisoning catches an unwritten output."""

from __future__ import annotations

import dataclasses
import math

import pytest

from napkin.codegen.api import CompiledDiagram, compile
from napkin.codegen.verify import verify, verify_compiled
from napkin.diagrams import Axis, Diagram, array, layernorm, library
from napkin_test_support import masked_softmax
from napkin.errors import LaunchError

pytestmark = pytest.mark.gpu

ROW_SHAPES = [dict(r=33, x=1000), dict(r=7, x=4095), dict(r=3, x=32768), dict(r=300, x=1024)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
def test_rowwise_library_ops_verify(name, dtype):
    rep = verify(library.get(name), dtype=dtype, shapes=ROW_SHAPES, seed=1)
    assert rep.ok, str(rep)
    for row in rep.rows:
        # fp32 layernorm rows of 32768: rowwise runs the norm (and gamma), the pointwise family the
        # last elementwise box (the registers of a 1024-thread block do not hold beta too)
        expected = "rowwise+pointwise" if (name, dtype, row.shape["x"]) == ("layernorm", "fp32", 32768) else "rowwise"
        assert row.family == expected, str(rep)


@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
@pytest.mark.parametrize("x", [5120, 5000, 2560])
def test_every_block_size_fitted_to_the_row(name, x):
    # 640 / 625 / 320 chunks: no power-of-two block holds them in whole chunks a thread; every
    # configuration the family proposes (the fitted 96-640 threads among them) against float64,
    # outputs poisoned with NaN
    from napkin.codegen.families.rowwise import FAMILY, analyse, row_fitted_threads
    from napkin.codegen.prepare import prepare

    d = prepare(library.get(name), sizes=dict(r=37, x=x), dtype="bf16")
    fitted = row_fitted_threads(analyse(d))
    cands = FAMILY.candidates(d, "h200", "bf16")
    assert fitted and {c.kernels[0].options.threads_per_row for c in cands} & set(fitted)
    for s in cands:
        cd = compile(d, schedule=s, family="rowwise")
        rows = verify_compiled(cd, seed=x)
        assert rows and all(r.ok and r.nan_count == 0 for r in rows), (s.kernels[0].options, rows)


def _residual_layernorm() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, R, g, b, s = array("X", r, x), array("R", r, x), array("g", x), array("b", x), array("s", r)
    U = (X + R).named("U")
    return Diagram("resid_ln", (((layernorm(U, over=x, name="N") * g + b) * s).named("Z"), U))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_rowwise_prologue_epilogue_variants_verify(dtype):
    rep = verify(masked_softmax(), dtype=dtype, shapes=[dict(h=3, q=37, x=37), dict(h=2, q=130, x=1000)], seed=2)
    assert rep.ok, str(rep)
    assert {r.family for r in rep.rows} == {"rowwise"}
    rep = verify(_residual_layernorm(), dtype=dtype, shapes=[dict(r=5, x=300), dict(r=64, x=4096)], seed=3)
    assert rep.ok, str(rep)
    assert {r.family for r in rep.rows} == {"rowwise"} and {r.output for r in rep.rows} == {"Z", "U"}


def test_default_sweep_verifies():
    rep = verify(library.get("rmsnorm"), sizes={"r": 16, "x": 2048}, dtype="bf16")
    assert rep.ok, str(rep)
    assert len({tuple(r.shape.items()) for r in rep.rows}) == 3


def test_an_unwritten_output_element_is_caught():
    cd = compile(library.get("softmax"), sizes={"r": 64, "x": 256}, dtype="bf16")
    assert cd.family == "rowwise"
    assert verify_compiled(cd, seed=0)[0].ok
    k = cd.program.launches[0]
    assert k.grid[0] > 1
    short = dataclasses.replace(k, grid=(k.grid[0] - 1, 1, 1))  # the last rows are never written
    broken = CompiledDiagram(dataclasses.replace(cd.program, launches=(short,)), arch=cd.arch)
    (row,) = verify_compiled(broken, seed=0)
    assert not row.ok and math.isnan(row.rel_error) and row.nan_count > 0


def test_compiled_diagram_calling_conventions():
    import torch

    cd = compile("layernorm", sizes={"r": 8, "x": 512}, dtype="fp32")
    X = torch.randn(8, 512, device="cuda")
    g = torch.randn(512, device="cuda")
    b = torch.randn(512, device="cuda")
    y1 = cd(X, g, b)
    y2 = cd(X, beta=b, gamma=g)
    out = torch.full((8, 512), float("nan"), device="cuda")
    y3 = cd(X, g, b, out=out)
    assert y3 is out
    ref = torch.nn.functional.layer_norm(X, (512,), g, b, eps=1e-5)
    for y in (y1, y2, y3):
        assert torch.allclose(y, ref, atol=1e-4, rtol=1e-4)
    assert "namespace napkin" in cd.source and '#include "napkin.cuh"' not in cd.source
    assert cd.schedule is cd.program.schedule and cd.family == "rowwise"

    with pytest.raises(LaunchError, match="X"):
        cd(X.to(torch.bfloat16), g, b)
    with pytest.raises(LaunchError, match="gamma"):
        cd(X, torch.randn(511, device="cuda"), b)
    with pytest.raises(LaunchError, match="beta"):
        cd(X, g, b.cpu())
    with pytest.raises(LaunchError, match="X"):
        cd(torch.randn(512, 8, device="cuda").t(), g, b)
    with pytest.raises(LaunchError, match="beta"):
        cd(X, g)
    with pytest.raises(LaunchError, match="nope"):
        cd(X, g, b, nope=X)
    with pytest.raises(LaunchError, match="out"):
        cd(X, g, b, out=torch.empty(8, 512, device="cuda", dtype=torch.float16))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "log_softmax"])
@pytest.mark.parametrize("x", [1, 2, 3, 7, 12])
def test_rows_shorter_than_a_vector_every_configuration(name, x, dtype):
    # rows of 1 to 12 values: a row a thread (or two threads), many rows a warp; every
    # configuration the family proposes against float64, outputs poisoned with NaN, a row count
    # that fills no whole block
    from napkin.codegen.families.rowwise import FAMILY
    from napkin.codegen.prepare import prepare

    d = prepare(library.get(name), sizes=dict(r=1001, x=x), dtype=dtype)
    cands = FAMILY.candidates(d, "h200", dtype)
    assert cands
    if x <= 16 // (2 if dtype == "bf16" else 4):
        assert min(c.kernels[0].options.threads_per_row for c in cands) == 1
    for s in cands:
        cd = compile(d, schedule=s, family="rowwise")
        rows = verify_compiled(cd, seed=x)
        assert rows and all(r.ok and r.nan_count == 0 for r in rows), (s.kernels[0].options, rows)
