"""Held-out diagrams on a GPU: random composed diagrams (the strategy of test_heldout_diagrams.py,
at sizes up to 100k elements an array) derived for the GPU at hand, compiled,
and run on fresh random inputs with NaN-poisoned outputs against their float64 reference.

The CPU test runs each plan on the interpreter; this one runs the generated kernels, so a family
that plans a diagram it then computes wrongly (an index, a bound, a partial tile, a layout) fails
here. The reference is the plan's boundary reference (each kernel's sub-diagram in float64, the
arrays between kernels rounded to their dtype, :func:`napkin.codegen.verify.boundary_reference`);
a NaN or infinity it has (a causal mask's -inf through a later box) must be the kernel's too; the
finite values agree within the relative error bound (fp32: 1e-4; bf16: 3e-2). fp32 and bf16 only
(fp16's range is passed between kernels by chains of products of random arrays). Several fixed seeds of a few diagrams each, so
that pytest-xdist spreads them over workers (about a minute a seed: each diagram's kernels compile).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from napkin.codegen import compile as napkin_compile
from napkin.codegen.verify import boundary_reference
from napkin.diagrams.reference import random_inputs
from napkin.errors import NapkinError

from test_heldout_diagrams import heldout

pytestmark = pytest.mark.gpu

BOUND = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-2}
SIZES = (1, 3, 7, 16, 33, 64, 100, 130)


def run_and_compare(d, dtype: str, k: int) -> None:
    import torch

    try:
        cd = napkin_compile(d)
    except NapkinError as e:  # a held-out diagram may be refused, in one clear line
        msg = str(e).strip()
        assert msg and "\n" not in msg, repr(msg)
        return
    ins = random_inputs(cd.diagram, device="cuda", seed=k)
    outs = cd(**ins, out=cd.empty_outputs("cuda", float("nan")))
    torch.cuda.synchronize()
    outs = outs if isinstance(outs, tuple) else (outs,)
    # each kernel's sub-diagram in float64, the arrays between kernels rounded to their dtype, as
    # the plan's HBM buffers hold them
    ref = boundary_reference(cd.plan, ins)
    for n, o in zip(cd.output_names, outs):
        # the reference rounded to the output's dtype says where a NaN or an infinity belongs (a
        # finite float64 value past the dtype's range is an infinity in it)
        r = ref[n].to(o.device)
        rq, o = r.to(o.dtype).double(), o.double()
        where = f"{d.summary(description=False)} ({dtype}) output {n} on {cd.plan.families}"
        assert torch.equal(torch.isnan(o), torch.isnan(rq)), f"{where}: NaN where the reference has none, or not written"
        inf = torch.isinf(rq)
        assert torch.equal(torch.isinf(o), inf) and torch.equal(o[inf], rq[inf]), f"{where}: infinities differ"
        fin = torch.isfinite(rq)
        err = float((o[fin] - r[fin]).norm() / max(float(r[fin].norm()), 1e-30))
        assert err <= BOUND[dtype], f"{where}: relative error {err:.2e} over {BOUND[dtype]:.0e}"


@pytest.mark.parametrize("k", range(4))
def test_heldout_diagrams_run_as_their_reference(k):
    @seed(1000 + k)
    @settings(max_examples=3, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(case=heldout(sizes_from=SIZES, max_elements=100_000), fp32=st.booleans())
    def one(case, fp32):
        d, dtype, _ = case
        # fp32 or bf16: a chain of products of random arrays passes fp16's range (65504) between
        # kernels, where the float64 reference does not
        dtype = "fp32" if fp32 or dtype == "fp32" else "bf16"
        run_and_compare(d.with_dtype(dtype), dtype, k)

    one()
