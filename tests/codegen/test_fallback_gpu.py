"""The fallback family on a GPU: every library diagram at small odd sizes, bf16 and fp32,
against the float64 reference; reductions; NaN poisoning catches an unwritten element."""

from __future__ import annotations

import dataclasses
import math

import pytest

from napkin.codegen.api import CompiledDiagram, compile
from napkin.codegen.verify import verify, verify_compiled
from napkin.diagrams import Axis, Diagram, array, library, reduce

pytestmark = pytest.mark.gpu

# small odd sizes (no tile multiples), one shape per dtype to keep compilations few
ODD = {"bf16": dict(a=37, b=29, c=19, n=3, r=5, x=23, q=21, d=9, h=3, j=3, e=27, f=35, g=2, s=11),
       "fp32": dict(a=5, b=7, c=3, n=2, r=3, x=9, q=7, d=5, h=2, j=3, e=11, f=13, g=2, s=5)}


def _shape(name: str, dtype: str) -> dict:
    d = library.get(name)
    s = {k: v for k, v in ODD[dtype].items() if k in d.axes}
    if name == "transformer_block":
        s.pop("x", None)  # x follows q there
    return s


#: Tolerances stated where the default (1e-2 for bf16) is not enough: on the fallback every box is
#: a kernel and every intermediate an HBM buffer in its own dtype, so the transformer block's 18
#: intermediates are each rounded to bf16 (2^-8 relative) on the way to Y.
CHAIN_TOLERANCE = {("transformer_block", "bf16"): 3e-2}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", library.names())
def test_every_library_diagram_verifies_through_the_fallback(name, dtype):
    tol = CHAIN_TOLERANCE.get((name, dtype))
    if tol is None:
        rep = verify(library.get(name), dtype=dtype, shapes=[_shape(name, dtype)], family="fallback", seed=4)
        assert rep.ok, str(rep)
        assert {r.family for r in rep.rows} == {"fallback"}
        return
    cd = compile(library.get(name), sizes=_shape(name, dtype), dtype=dtype, family="fallback")
    assert cd.family == "fallback" and all(b.dtype == dtype for b in cd.program.buffers)
    rows = verify_compiled(cd, seed=4, tolerance=tol)
    assert rows and all(r.ok for r in rows), rows


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_reductions_verify(dtype):
    X = array("X", Axis("r"), Axis("x"))
    d = Diagram("reductions", tuple(reduce(X, "x", how, name=f"R{how}") for how in ("sum", "max", "min", "mean")))
    rep = verify(d, dtype=dtype, shapes=[dict(r=7, x=45), dict(r=3, x=1)], family="fallback", seed=5)
    assert rep.ok, str(rep)
    assert len(rep.rows) == 8


def test_fallback_fp16_transformer_block():
    rep = verify(library.get("transformer_block"), dtype="fp16", shapes=[dict(q=9, e=16, h=2, d=8, f=24)],
                 family="fallback", seed=6)
    assert rep.ok, str(rep)


def test_an_unwritten_element_is_caught_in_the_fallback():
    cd = compile(library.get("mlp"), sizes=dict(a=33, b=17, c=65), dtype="fp32", family="fallback")
    assert verify_compiled(cd, seed=0)[0].ok
    last = cd.program.launches[-1]
    assert last.grid[0] > 1
    short = dataclasses.replace(last, grid=(last.grid[0] - 1, 1, 1))
    broken = CompiledDiagram(dataclasses.replace(cd.program, launches=cd.program.launches[:-1] + (short,)),
                             arch=cd.arch)
    (row,) = verify_compiled(broken, seed=0)
    assert not row.ok and math.isnan(row.rel_error) and row.nan_count > 0
