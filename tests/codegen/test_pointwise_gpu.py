"""The pointwise family on a GPU: elementwise chains and reductions over any axes, planned by
derive and forced configuration by configuration (split reductions, block reductions, unrolls),
against the float64 reference on fresh random inputs with NaN-poisoned outputs (an element a
kernel does not write stays NaN and fails the check), bf16/fp16/fp32, sizes that are not
multiples of the vector width (1, primes, odd), inputs that start at an unaligned address, and
split sums that give the same bits on every run.

Tolerance (stated): the norm-wise relative error ``‖out − ref‖ / ‖ref‖`` of each output against
the float64 reference is below ``napkin.codegen.verify.TOLERANCE`` (1e-2 for bf16 and fp16: the
outputs are rounded to the dtype; 1e-5 for fp32), and below 1e-4 for fp32 sums of more than 10^6
values (fp32 accumulation, as PyTorch's own).
"""

from __future__ import annotations

import math

import pytest

from napkin.codegen import compile as napkin_compile
from napkin.codegen.families import pointwise as pw
from napkin.codegen.prepare import prepare
from napkin.codegen.verify import TOLERANCE
from napkin.diagrams.reference import random_inputs
from napkin_test_support import spread_and_split_picks

from test_pointwise_diagrams import (alibi_map, batched_matvec_gelu, broadcast_chain, column_logsumexp, column_mean,
                                     column_sum, dot_all, full_and_reduced, l2_norm, logsumexp_bh, logsumexp_bs,
                                     masked_rowmax, matvec, max_middle, mean_middle, min_middle, post_maps, reduce_of,
                                     row_logsumexp, row_sum, sigmoid_chain, sum_middle,
                                     softmax_stats, sum_bh, sum_bs, total, transposed_add, vecmat,
                                     rotated_scale, transposed_bias_relu, transposed_mix, two_layouts,
                                     random_permuted_map, symmetric_part)

pytestmark = pytest.mark.gpu


def _tolerance(d, dtype: str) -> float:
    summed = max((math.prod(a.bound_size for a in v.args[0].axes) // max(1, math.prod(a.bound_size for a in v.axes))
                  for v in d.nodes if v.op.kind in ("reduce", "contract")), default=0)
    if dtype == "fp32" and summed > 10 ** 6:
        return 1e-4
    return TOLERANCE[dtype]


def check(cd, seed: int = 0, offset: int = 0) -> list[tuple[str, float]]:
    """Run ``cd`` on fresh random inputs (each a contiguous view ``offset`` elements into its
    storage) with NaN-poisoned outputs; the relative error of each output, asserted."""
    import torch

    d = cd.diagram
    ins = random_inputs(d, device="cuda", seed=seed)
    if offset:
        ins = {n: torch.cat([t.new_zeros(offset), t.reshape(-1)])[offset:].view(t.shape) for n, t in ins.items()}
    outs = cd(**ins, out=cd.empty_outputs("cuda", float("nan")))
    torch.cuda.synchronize()
    outs = outs if isinstance(outs, tuple) else (outs,)
    ref = d.reference({n: t.double() for n, t in ins.items()}, dtype=torch.float64)
    tol = _tolerance(d, d.inputs[0].dtype)
    rows = []
    for n, o in zip(cd.output_names, outs):
        r = ref[n].to(o.device)
        assert not torch.isnan(o).any(), f"{d.name} {n}: {int(torch.isnan(o).sum())} elements not written"
        err = float((o.double() - r).norm() / max(float(r.norm()), 1e-30))
        assert err < tol, f"{d.name} {dict(d.sizes)} {n}: relative error {err:.2e} over {tol:.0e}"
        rows.append((n, err))
    return rows


PLANNED = [
    # rows of 4095, 4094, 1001 values: 16-byte vectors over the flattened space, a partial last one
    (sigmoid_chain, [dict(r=33, x=1000), dict(r=7, x=4095), dict(r=1, x=1), dict(r=3, x=4094), dict(r=4096, x=4096),
                     dict(r=5, x=1001), dict(r=1, x=7), dict(r=2, x=(1 << 21) + 5)]),
    (broadcast_chain, [dict(r=5, x=1001), dict(r=64, x=4096)]),
    (transposed_add, [dict(r=37, x=41), dict(r=256, x=512), dict(r=1000, x=17), dict(r=15, x=64)]),
    # transposed inputs staged through a cross tile: sizes that fill no whole tile, a vector axis
    # whose vector is under 16 bytes, an odd cross axis (one value a phase-1 access), two staged
    # inputs and an index map on both tile axes
    (rotated_scale, [dict(a=3, b=100, c=37), dict(a=64, b=512, c=511), dict(a=1, b=7, c=16)]),
    (transposed_bias_relu, [dict(a=1000, b=17), dict(a=4096, b=2048), dict(a=33, b=4095)]),
    (transposed_mix, [dict(a=2, b=77, h=40), dict(a=3, b=64, h=64), dict(a=1, b=1001, h=24)]),
    (two_layouts, [dict(a=100, b=40), dict(a=1000, b=17), dict(a=64, b=4096), dict(a=1001, b=64)]),
    (alibi_map, [dict(h=2, q=37, x=37)]),
    (column_sum, [dict(r=8192, x=4096), dict(r=37, x=1000), dict(r=1000, x=7), dict(r=3, x=1)]),
    # rows of 100003, 4095, 7 values: aligned vectors between a head and a tail read value by value
    (row_sum, [dict(r=8192, x=4096), dict(r=33, x=1000), dict(r=2, x=100003), dict(r=1, x=1), dict(r=4096, x=4095),
               dict(r=5, x=7)]),
    (sum_bh, [dict(b=16, h=64, s=4096), dict(b=3, h=5, s=97)]),
    (sum_bs, [dict(b=16, h=64, s=4096), dict(b=3, h=5, s=97)]),
    (total, [dict(r=1024, x=1024), dict(r=13, x=31), dict(r=3, x=(1 << 20) + 3)]),
    (l2_norm, [dict(r=4096, x=4096), dict(r=7, x=1001)]),
    (column_mean, [dict(r=8192, x=4096), dict(r=29, x=40)]),
    (post_maps, [dict(r=4096, x=1024), dict(r=20, x=24)]),
    (full_and_reduced, [dict(r=64, x=1000), dict(r=4, x=40)]),
    (masked_rowmax, [dict(q=100, x=100)]),
    (matvec, [dict(a=8192, b=8192), dict(a=1000, b=4099), dict(a=1, b=7), dict(a=33, b=100003)]),
    (vecmat, [dict(b=8192, c=8192), dict(b=4099, c=1000), dict(b=7, c=1)]),
    (batched_matvec_gelu, [dict(n=8, a=1024, b=4096), dict(n=3, a=77, b=999)]),
    (dot_all, [dict(r=4096, x=4096), dict(r=13, x=31), dict(r=77, x=999)]),
    # the max and the sum of exp(x − max) in one pass (a pair reduction)
    (column_logsumexp, [dict(r=4096, x=4096), dict(r=37, x=1000), dict(r=1000, x=7), dict(r=3, x=1)]),
    (softmax_stats, [dict(r=8192, x=4096), dict(r=29, x=40)]),
    (logsumexp_bs, [dict(b=16, h=64, s=4096), dict(b=3, h=5, s=97)]),
    (logsumexp_bh, [dict(b=16, h=64, s=4096), dict(b=3, h=5, s=97)]),
    # column reductions along a kept axis of 4095, 1001, 9 values: 16-byte vectors, the last of each
    # line partial, read from the lines they straddle (padded)
    (sum_middle, [dict(b=16, m=1024, n=4095), dict(b=3, m=77, n=9), dict(b=5, m=300, n=1001)]),
    (max_middle, [dict(b=4, m=333, n=4095), dict(b=3, m=7, n=1001)]),
    (min_middle, [dict(b=2, m=100, n=1001)]),
    (mean_middle, [dict(b=5, m=300, n=1001)]),
    (column_sum, [dict(r=8191, x=4095), dict(r=37, x=1001), dict(r=4, x=9)]),
    (column_logsumexp, [dict(r=37, x=1001), dict(r=4096, x=4095)]),
    (post_maps, [dict(r=20, x=1001)]),
    (vecmat, [dict(b=4099, c=1001)]),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("build, shapes", PLANNED, ids=[b.__name__ for b, _ in PLANNED])
def test_planned_kernels_verify(build, shapes, dtype):
    if dtype == "fp16" and build not in (sigmoid_chain, column_sum, row_sum, l2_norm):
        pytest.skip("fp16 on a representative subset")
    for i, sizes in enumerate(shapes):
        cd = napkin_compile(build(), sizes=sizes, dtype=dtype)
        assert cd.plan.families == ("pointwise",), (sizes, cd.plan)
        check(cd, seed=i)


FORCED = [
    (sigmoid_chain, dict(r=7, x=4095)),
    (broadcast_chain, dict(r=33, x=1000)),
    (column_sum, dict(r=1000, x=72)),
    (row_sum, dict(r=9, x=3001)),
    (lambda: reduce_of("max", "x"), dict(r=5, x=1000)),
    (lambda: reduce_of("min", "r"), dict(r=500, x=24)),
    (total, dict(r=37, x=1000)),
    (sum_bh, dict(b=7, h=9, s=40)),
    (sum_bs, dict(b=7, h=9, s=40)),
    (post_maps, dict(r=300, x=24)),
    (full_and_reduced, dict(r=5, x=1000)),
    (matvec, dict(a=300, b=1001)),
    (vecmat, dict(b=1001, c=300)),
    (column_logsumexp, dict(r=1000, x=72)),
    (row_logsumexp, dict(r=9, h=3, x=1001)),
    (softmax_stats, dict(r=500, x=24)),
    (logsumexp_bs, dict(b=7, h=9, s=40)),
    (sum_middle, dict(b=3, m=100, n=1001)),
    (column_logsumexp, dict(r=1000, x=1001)),
    (post_maps, dict(r=300, x=1001)),
    (transposed_add, dict(r=100, x=40)),
    (rotated_scale, dict(a=3, b=100, c=37)),
    (transposed_mix, dict(a=2, b=77, h=40)),
    (two_layouts, dict(a=100, b=40)),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", range(len(FORCED)))
def test_every_kind_of_configuration_verifies(case, dtype):
    """A spread of each diagram's configurations (threads, unrolls, threads per row, splits),
    each as its own compiled kernel."""
    build, sizes = FORCED[case]
    d = prepare(build(), sizes=sizes, dtype=dtype)
    cands = pw.FAMILY.candidates(d, "h100", dtype)
    split = [i for i, s in enumerate(cands) if (s.kernels[0].options.splits or 1) > 1]
    wide = [i for i, s in enumerate(cands) if (s.kernels[0].options.threads_per_row or 0) > 32]
    picks = sorted({0, len(cands) // 2, len(cands) - 1, *split[:1], *split[-1:], *wide[:1]})
    for i in picks:
        cd = napkin_compile(d, schedule=cands[i], family="pointwise")
        check(cd, seed=i)


@pytest.mark.parametrize("build, sizes", [(sigmoid_chain, dict(r=33, x=1000)), (sigmoid_chain, dict(r=33, x=999)),
                                          (column_sum, dict(r=1000, x=72)), (row_sum, dict(r=9, x=3000)),
                                          (row_sum, dict(r=9, x=3001)), (dot_all, dict(r=7, x=999)),
                                          (sum_bh, dict(b=7, h=9, s=40)), (matvec, dict(a=33, b=1001)),
                                          (sum_middle, dict(b=3, m=50, n=1001)),
                                          (column_logsumexp, dict(r=100, x=1001))],
                         ids=["chain", "chain_flat", "column_sum", "row_sum", "row_sum_odd", "dot_odd", "sum_bh",
                              "matvec_odd", "sum_middle_odd", "column_lse_odd"])
def test_inputs_that_start_unaligned(build, sizes):
    """A contiguous view one element into its storage: the vector accesses fall back to scalars, or
    (rows of odd length) each row finds its own first 16-byte boundary."""
    cd = napkin_compile(build(), sizes=sizes, dtype="bf16")
    check(cd, seed=3, offset=1)


@pytest.mark.parametrize("build, sizes", [(column_sum, dict(r=4096, x=4096)), (row_sum, dict(r=4, x=1 << 22))],
                         ids=["column_sum", "row_sum"])
def test_a_split_sum_is_deterministic(build, sizes):
    """Partials combined in a fixed order by the last block of a tile to arrive (the only atomic
    counts arrivals): the same bits every run, with the counters reset by every launch (a stale
    count would make a block that is not the last combine partials not yet written)."""
    import torch

    d = prepare(build(), sizes=sizes, dtype="fp32")
    split = [s for s in pw.FAMILY.candidates(d, "h100", "fp32") if (s.kernels[0].options.splits or 1) > 1]
    assert split
    cd = napkin_compile(d, schedule=split[len(split) // 2], family="pointwise")
    assert len(cd.launches) == 1 and [b.zeroed for b in cd.program.buffers] == [False, True]
    X = torch.randn(sizes["r"], sizes["x"], device="cuda")
    first = cd(X)
    ref = X.double().sum(dim=0 if build is column_sum else 1)
    assert float((first.double() - ref).norm() / ref.norm()) < 1e-5
    for _ in range(20):
        assert torch.equal(cd(X), first)
    # out= (the checked path) and another stream (its own counters) give the same bits
    assert torch.equal(cd(X, out=torch.full_like(first, float("nan"))), first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = [cd(X) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(g, first) for g in got)
    # after every launch each counter is zero again
    runner = cd._runners[torch.cuda.current_device()]
    torch.cuda.synchronize()
    for tensors, _ in runner._zeroed.values():
        assert all(int((t.view(torch.int32) != 0).sum()) == 0 for t in tensors)


PAIRS = [(column_logsumexp, dict(r=300, x=6)), (softmax_stats, dict(r=300, x=6)), (row_logsumexp, dict(r=6, h=3, x=100))]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", range(len(PAIRS)), ids=[b.__name__ for b, _ in PAIRS])
def test_a_pair_reduction_at_infinities_and_nan(case, dtype):
    """The running (max, Σ exp(x − max)) against the written-out reference where the values are
    not ordinary: a reduced line of -inf (softmax statistics: the sum is NaN, as x − m is; logsumexp:
    -inf), one -inf for its first 200 values (the running max is -inf while the sum starts), one
    holding +inf, one holding a NaN (the max is NaN, as torch.amax gives), one shifted by -1e4 (what was summed at -inf must not be rescaled
    into inf · 0). Every configuration kind: splits, threads per row, unrolls. NaN where the
    reference is NaN, else the stated tolerance."""
    import torch

    build, sizes = PAIRS[case]
    d = prepare(build(), sizes=sizes, dtype=dtype)
    row = build is row_logsumexp   # the reduced axes are the innermost (rows of h·x), else r (columns)
    n = sizes["h"] * sizes["x"] if row else sizes["r"]
    shape = [sizes[a] for a in d.inputs[0].axis_names]
    X = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 3
    line = (lambda j: X[j].view(-1)) if row else (lambda j: X[:, j])
    line(1).fill_(-math.inf)
    line(2)[:200] = -math.inf
    line(3)[n // 3] = math.inf
    line(5).sub_(1e4)
    line(4)[17] = math.nan
    T = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    X = X.to(T)
    ref = d.reference({"X": X.double()}, dtype=torch.float64)
    for name, i, o, r in _each_pick(d, X, ref, "h100", dtype, poison=12345.0):
        assert torch.equal(torch.isnan(o), torch.isnan(r)), (name, i, o, r)
        ok = ~torch.isnan(r)
        assert torch.equal(torch.isinf(o[ok]), torch.isinf(r[ok])) and torch.equal(o[ok].sign(), r[ok].sign())
        fin = ok & torch.isfinite(r)
        err = float((o[fin] - r[fin]).norm() / r[fin].norm())
        assert err < TOLERANCE[dtype], (name, i, err)


def _each_pick(d, X, ref, profile, dtype, *, poison):
    """Every configuration kind of the pointwise family for ``d`` (:func:`spread_and_split_picks`
    of the candidates ranked on ``profile``), run on ``X`` into outputs filled with ``poison``:
    yields (output name, candidate index, the output as float64 on the CPU, its reference)."""
    cands = pw.FAMILY.candidates(d, profile, dtype)
    for i in spread_and_split_picks(cands):
        cd = napkin_compile(d, schedule=cands[i], family="pointwise")
        outs = cd(X=X.cuda(), out=cd.empty_outputs("cuda", poison))
        outs = outs if isinstance(outs, tuple) else (outs,)
        for name, o in zip(cd.output_names, outs):
            yield name, i, o.double().cpu(), ref[name]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("build, sizes", [(column_logsumexp, dict(r=1000, x=64)), (softmax_stats, dict(r=777, x=64)),
                                          (row_logsumexp, dict(r=12, h=3, x=600))],
                         ids=["column_logsumexp", "softmax_stats", "row_logsumexp"])
def test_a_16bit_pair_far_from_zero_with_infinities_in_some_rows(build, sizes, dtype):
    """A 16-bit pair reduction takes its fast form (one FMA and one flushed exp2 a value, no select
    for infinities) wherever its new max is finite, and the exact form elsewhere, so one kernel
    mixes both on a line. Lines offset by -3e4, -1e3, +1e3 and +3e4 (fp16: ±6e4 is its edge; the
    shift's rounding grows with the magnitude), lines whose later rows alone hold a +inf or a NaN
    (the fast form on the rows before), lines of -inf with a finite tail (the sum starts at a max of
    -inf), and every configuration kind, against float64 on the same rounded inputs; NaN-poisoned
    outputs."""
    import torch

    d = prepare(build(), sizes=sizes, dtype=dtype)
    row = build is row_logsumexp
    n = sizes["h"] * sizes["x"] if row else sizes["r"]
    shape = [sizes[a] for a in d.inputs[0].axis_names]
    X = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(11)) * 4
    line = (lambda j: X[j].view(-1)) if row else (lambda j: X[:, j])
    for j, off in enumerate((-3e4, -1e3, 1e3, 3e4)):
        line(j).add_(off)
    line(4)[n - 5] = math.inf
    line(5)[n - 3] = math.nan
    line(6)[: n - 7] = -math.inf
    line(7)[n // 2:] = -math.inf
    T = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    X = X.to(T)
    ref = d.reference({"X": X.double()}, dtype=torch.float64)
    for name, i, o, r in _each_pick(d, X, ref, "h200", dtype, poison=math.nan):
        assert torch.equal(torch.isnan(o), torch.isnan(r)), (name, i, o, r)
        ok = ~torch.isnan(r)
        assert torch.equal(torch.isinf(o[ok]), torch.isinf(r[ok])), (name, i)
        fin = ok & torch.isfinite(r)
        err = float(((o[fin] - r[fin]).abs() / r[fin].abs().clamp_min(1.0)).max())
        assert err < TOLERANCE[dtype], (name, i, err)


def max_all():
    from napkin.diagrams import Diagram, array, axes, max_over

    r, x = axes("r x")
    return Diagram("max_all", max_over(array("X", r, x), (r, x), name="M"))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("build, sizes", [(total, dict(r=64, x=(1 << 16) + 3)), (max_all, dict(r=64, x=(1 << 16) + 3)),
                                          (row_logsumexp, dict(r=2, h=8, x=(1 << 16) + 1))],
                         ids=["sum", "max", "logsumexp"])
def test_few_kept_elements_combine_their_splits_a_warp_each(build, sizes, dtype):
    """A reduction to one value or a few, split over hundreds of blocks: the last block combines
    each kept element's partials a warp at a time (lane j takes splits j, j + 32, ..., then a
    butterfly). Every split count offered, each against the float64 reference with NaN-poisoned
    outputs, and the same bits on a second run."""
    import torch

    d = prepare(build(), sizes=sizes, dtype=dtype)
    cands = [s for s in pw.FAMILY.candidates(d, "h100", dtype) if (s.kernels[0].options.splits or 1) > 32]
    assert cands, "no split of more than 32 blocks offered"
    for n in sorted({s.kernels[0].options.splits for s in cands}):
        cd = napkin_compile(d, schedule=next(s for s in cands if s.kernels[0].options.splits == n), family="pointwise")
        check(cd, seed=n)
        ins = random_inputs(d, device="cuda", seed=1)
        first = cd(**ins)
        assert torch.equal(cd(**ins), first)


@pytest.mark.parametrize("seed", range(48))
def test_random_permuted_maps_verify(seed):
    """Maps whose inputs and output hold their axes in random orders (held-out layouts: about half
    run through the cross tile), bf16 for even seeds and fp32 for odd ones, sizes of 1 to 512 that
    fill no tile, against float64 with NaN-poisoned outputs."""
    d, sizes = random_permuted_map(seed)
    cd = napkin_compile(d, sizes=sizes, dtype="bf16" if seed % 2 == 0 else "fp32")
    assert cd.plan.families == ("pointwise",), cd.plan
    check(cd, seed=seed)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("n", [8, 77, 100, 1000])
def test_an_array_read_through_its_own_transposed_view_verifies(n, dtype):
    """(X + Xᵀ) / 2: the view is staged through the cross tile from X's tensor (n >= 16; at 8 the
    strided loads)."""
    cd = napkin_compile(symmetric_part(n), dtype=dtype)
    assert cd.plan.families == ("pointwise",), cd.plan
    assert (n >= 16) == ("PITCH" in cd.launches[0].source)
    check(cd, seed=n)
