"""Skinny products: a matrix product one of whose factors has at most ``pointwise.MAX_REP``
elements along its own axes (``Y[b, a] = Σ_k W[a, k]·x[b, k]`` with a few ``b``: a linear layer at
decode time, a batch of matrix-vector products sharing the matrix). It is bound by reading the
large factor, and the pointwise family runs it as it runs a matrix-vector product: each thread
holds every ``b`` in registers, so each vector of ``W`` is read from HBM once (issue #12: "matrix-
vector as a bandwidth-bound template"; tensor-core tiles run such a product with most of their
rows empty, and measured 0.60-0.74x eager on an H200).

Without a GPU: the analysis (what is the small factor, what is refused), the plans, the register
formula against nvcc for every configuration. On a GPU (``gpu``): every shape of
:mod:`skinny_diagrams` (odd sizes, long split sums, maps after the product, batch and two small
axes, the small factor transposed) through a spread of its configurations, on fresh random inputs
into NaN-poisoned outputs, against the float64 reference.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from skinny_diagrams import CASES, linear_bias_gelu, linear_cols, linear_rows, out_transposed  # noqa: E402

from napkin.codegen import compile as napkin_compile  # noqa: E402
from napkin.codegen.families import pointwise as pw  # noqa: E402
from napkin.codegen.planner import derive  # noqa: E402
from napkin.codegen.prepare import prepare  # noqa: E402
from napkin.diagrams import Diagram, array, axes, contract, map_fn, sum_over  # noqa: E402

IDS = [f"{b.__name__}-{'x'.join(map(str, s.values()))}" for b, s in CASES]


def _shape(build, sizes, dtype="bf16"):
    s = pw.analyse(prepare(build(), sizes=sizes, dtype=dtype))
    assert not isinstance(s, str), s
    return s


@pytest.mark.parametrize("build, sizes", CASES, ids=IDS)
def test_the_small_factor_is_held_in_registers(build, sizes):
    s = _shape(build, sizes)
    assert s.rep_input is not None and s.rep_input.name == "x"
    assert set(s.rep) <= {"b", "c"} and s.nrep == sizes["b"] * sizes.get("c", 1) <= pw.MAX_REP
    # the iteration space is the large factor's: the small factor's own axes are none of it
    assert set(s.order) == set(s.chain[0].args[0].axis_names) and not set(s.rep) & set(s.order)
    assert s.mode == ("row" if s.order[-1] in s.red else "col")


def test_the_layouts_pick_the_row_and_the_column_kernels():
    assert _shape(linear_rows, dict(a=64, b=4, k=64)).mode == "row"
    assert _shape(linear_cols, dict(a=64, b=4, k=64)).mode == "col"
    # the maps after the product run per kept element, at every b
    g = _shape(linear_bias_gelu, dict(a=64, b=3, k=64))
    assert [v.op.fn if hasattr(v.op, "fn") else v.op.kind for v in g.post][-1] == "add" and len(g.kept_out) == 1


def test_refused_with_a_reason():
    a, b, k = axes("a b k")
    W, x = array("W", a, k), array("x", b, k)
    # more than MAX_REP vectors: a matrix product, the contraction family's
    mm = Diagram("mm", contract(W, x, over=k, out=(b, a), name="y"))
    why = pw.FAMILY.explain(prepare(mm, sizes=dict(a=64, b=pw.MAX_REP + 1, k=64), dtype="bf16"))
    assert why and "matrix product" in why
    # a small factor that is computed is not read from HBM as it stands
    mapped = Diagram("mapped", contract(W, map_fn("relu", x, name="rx"), over=k, out=(b, a), name="y"))
    why = pw.FAMILY.explain(prepare(mapped, sizes=dict(a=64, b=4, k=64), dtype="bf16"))
    assert why and "small factor" in why
    # reduced again after the product (the sum over a): a second pass
    twice = Diagram("twice", sum_over(contract(W, x, over=k, out=(b, a), name="y"), a, name="s"))
    why = pw.FAMILY.explain(prepare(twice, sizes=dict(a=64, b=4, k=64), dtype="bf16"))
    assert why and "reduced again" in why


def test_large_fp32_skinny_products_plan_one_pointwise_kernel():
    # fp32: the contraction family's 3xTF32 tiles run most of their rows empty, and wait on their
    # loads (the latency floor counts only their HBM share in flight: H200, W[a, k] by 6 or 8
    # vectors, 141-147 us on the tile against 64-88 here)
    for build in (linear_rows, linear_cols, out_transposed):
        for b in (2, 4, 6, 8):
            sizes = dict(a=8192, b=b, k=4096)
            plan = derive(build(), "h200", "fp32", sizes=sizes, explain=False).plan
            assert plan.families == ("pointwise",), f"{build.__name__} {sizes}: {plan}"
    # sixteen vectors: a matrix product
    plan = derive(linear_rows(), "h200", "fp32", sizes=dict(a=8192, b=16, k=4096), explain=False).plan
    assert plan.families == ("contraction",)


def test_the_model_prices_the_products_on_the_cuda_cores_after_the_loads():
    """In 16 bits the cost model would give a contraction's products to the tensor cores, and
    overlap them with the loads: a skinny product's prediction grows with its vectors instead."""
    from napkin.codegen import select

    for build in (linear_rows, linear_cols):
        times = []
        for b in (1, 2, 4, 8):
            d = prepare(build(), sizes=dict(a=8192, b=b, k=4096), dtype="bf16")
            best = select.rank(d, pw.FAMILY, "h200", "bf16")[0]
            times.append(best.seconds)
            if b > 1:
                launch = best.kernel.launch
                assert launch.products_on_cuda and launch.overlap_memory is False
        assert times == sorted(times) and times[-1] > 1.3 * times[0], times


def test_the_legend_names_the_small_factor_and_the_partials_hold_every_b():
    d = prepare(linear_cols(), sizes=dict(a=64, b=5, k=65536), dtype="bf16")
    split = [c for c in pw.FAMILY.candidates(d, "h200", "bf16") if (c.kernels[0].options.splits or 1) > 1]
    assert split
    p = pw.FAMILY.lower(d, split[0], "sm_90a")
    src = p.launches[0].source
    assert "skinny product: the small factor x's own axes (b) -> m < REP = 5" in src
    assert "float acc[REP][VEC];" in src
    n = split[0].kernels[0].options.splits
    assert p.buffers[0].shape == (n * 5, 64)


def _launches(arch_tag: str) -> list:
    out = []
    for ci, (build, sizes) in enumerate(CASES):
        for dt in ("bf16", "fp32"):
            d = prepare(build(), sizes=sizes, dtype=dt)
            cands = pw.FAMILY.candidates(d, "h200", dt)
            for i in sorted({0, len(cands) // 3, len(cands) // 2, len(cands) - 1}):
                for l in pw.FAMILY.lower(d, cands[i], "sm_90a").launches:
                    new = f"{l.name}_{ci}_{dt}_{i}_{arch_tag}"
                    out.append(dataclasses.replace(l, name=new, source=re.sub(rf"\b{re.escape(l.name)}\b", new, l.source)))
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_compile_within_the_model(arch):
    from napkin.kernels import nvcc_compile

    launches = _launches(arch)
    usage = nvcc_compile("\n".join(l.source for l in launches), arch)
    problems = []
    for k in launches:
        r = usage.kernels[k.name]
        if r.spills:
            problems.append(f"{k.name} {dict(k.tunables)}: spills {r.spill_stores} B")
        if r.registers > k.model_regs_per_thread:
            problems.append(f"{k.name} {dict(k.tunables)}: {r.registers} registers, the model {k.model_regs_per_thread}")
    assert {dict(k.tunables)["MODE"] for k in launches} == {"row", "col"}
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_gpu_skinny_products_verify(case, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from test_pointwise_gpu import check

    build, sizes = CASES[case]
    d = prepare(build(), sizes=sizes, dtype=dtype)
    cands = pw.FAMILY.candidates(d, "h200", dtype)
    split = [i for i, s in enumerate(cands) if (s.kernels[0].options.splits or 1) > 1]
    wide = [i for i, s in enumerate(cands) if (s.kernels[0].options.threads_per_row or 0) > 32]
    for i in sorted({0, len(cands) // 2, len(cands) - 1, *split[:1], *split[-1:], *wide[:1]}):
        check(napkin_compile(d, schedule=cands[i], family="pointwise"), seed=case * 31 + i)
    # the planner's own plan, with unaligned inputs (one element into their storage)
    cd = napkin_compile(build(), sizes=sizes, dtype=dtype)
    check(cd, seed=case)
    check(cd, seed=case + 1, offset=1)
