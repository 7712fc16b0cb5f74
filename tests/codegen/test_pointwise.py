"""The pointwise family without a GPU: what it accepts and refuses (with reasons), what the planner
picks it for (an elementwise chain as one kernel, column sums, reductions over several axes, the
L2 norm, a mean over a non-last axis), its schedules and launch estimates, lowering (one pass, and
a combining launch with fp32 partials for a split reduction), 64-bit indices, random shapes
(sizes of 1, primes, non-multiples of the vector width) and nvcc builds for sm_80 and sm_90a within
the registers and shared memory the model assumed.

Register tolerance (stated, as tests/codegen/test_templates_nvcc.py): ptxas may use at most the
budget the kernel asks for (``__maxnreg__``) without spills, and the budget may exceed what it
uses by at most max(32, 60 %); shared memory within ``SMEM_TOLERANCE`` of the model's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napkin.codegen.families import pointwise as pw
from napkin.codegen.lower import SMEM_TOLERANCE, build, lower
from napkin.codegen.planner import derive
from napkin.codegen.prepare import prepare
from napkin.diagrams import (Diagram, array, axes, contract, exp, layernorm, map_fn, max_over, mean_over, relu, rename,
                             scale, softmax, sum_over, tanh)
from napkin.perfmodel.plan import Plan
from test_pointwise_diagrams import (ACCEPTED, alibi_map, batched_matvec_gelu, broadcast_chain, column_logsumexp,
                                     column_mean, column_sum, dot_all, full_and_reduced, l2_norm, logsumexp_bh,
                                     logsumexp_bs, masked_rowmax, matvec, max_middle, post_maps, row_logsumexp,
                                     row_sum, sigmoid_chain, softmax_stats, sum_bh, sum_bs, sum_middle, total,
                                     transposed_add, vecmat, rotated_scale, transposed_mix, two_layouts,
                                     random_permuted_map)

FAMILY = pw.FAMILY


def bound(build, sizes, dtype="bf16") -> Diagram:
    return prepare(build(), sizes=sizes, dtype=dtype)


# ----------------------------------------------------------------------------- explain


@pytest.mark.parametrize("build, sizes, mode", ACCEPTED, ids=[c[0].__name__ for c in ACCEPTED])
def test_explain_accepts_maps_and_reductions_over_any_axes(build, sizes, mode):
    d = bound(build, sizes)
    assert FAMILY.explain(d) is None
    shape = pw.analyse(d)
    assert shape.mode == mode
    assert FAMILY.candidates(d, "h100", "bf16")


def _softmax_then_map():
    r, x = axes("r x")
    return Diagram("sm", (softmax(array("X", r, x), x, name="P") * 2.0).named("Y"))


def _matmul_then_map():
    a, b, c = axes("a b c")
    return Diagram("mm", relu(contract(array("A", a, b), array("B", b, c), over=b, name="C"), name="Y"))


def _rename_then_map():
    r, x = axes("r x")
    return Diagram("rn", relu(rename(array("X", r, x), r="q"), name="Y"))


def _rename_of_a_computed_value():
    r, x = axes("r x")
    return Diagram("rnc", relu(rename(relu(array("X", r, x), name="R"), r="q"), name="Y"))


def _mixed_kinds():
    r, x = axes("r x")
    return Diagram("mixed", max_over(sum_over(array("X", r, x), r, name="S"), x, name="M"))


def _two_reductions():
    r, x = axes("r x")
    X = array("X", r, x)
    return Diagram("two", (sum_over(X, r, name="A"), sum_over(X, x, name="B")))


def _centred():
    r, x = axes("r x")
    X = array("X", r, x)
    return Diagram("centred", (X - mean_over(X, x, name="m")).named("Y"))


def _intermediate_output():
    r, x = axes("r x")
    S1 = sum_over(array("X", r, x), r, name="S1")
    return Diagram("inter", (S1, sum_over(S1, x, name="S")))


def _layernorm():
    r, x = axes("r x")
    return Diagram("ln", layernorm(array("X", r, x), x, name="N"))


def _pair_exp_read_twice():
    """The exp(x − max) of the sum is also an output: one pass has no such array to write."""
    r, x = axes("r x")
    X = array("X", r, x)
    m = max_over(X, r, name="m")
    e = exp(map_fn("sub", X, m, name="d"), name="e")
    return Diagram("pair_twice", (sum_over(e, r, name="s"), e))


def _pair_of_another_value():
    """Σ exp(Z − max X): the max is not of the value the sum exponentiates (no online rescale)."""
    r, x = axes("r x")
    X, Z = array("X", r, x), array("Z", r, x)
    m = max_over(X, r, name="m")
    return Diagram("pair_other", (m, sum_over(exp(map_fn("sub", Z, m, name="d"), name="e"), r, name="s")))


def _innermost_logsumexp():
    """logsumexp over the innermost axis alone: a row, the row-wise family's."""
    from napkin.diagrams.ops import logsumexp

    r, x = axes("r x")
    return Diagram("lse_rows", logsumexp(array("X", r, x), x, name="L"))


REFUSED = [
    (_pair_exp_read_twice, "read by more than the sum"),
    (_innermost_logsumexp, "the row-wise family runs them"),
    (_pair_of_another_value, "only for the x it takes the max of"),
    (_softmax_then_map, "softmax"),
    (_matmul_then_map, "contract"),
    (_rename_of_a_computed_value, "rename"),
    (_layernorm, "norm"),
    (_mixed_kinds, "mixes reductions"),
    (_two_reductions, "not one chain"),
    (_centred, "second pass"),
    (_intermediate_output, "more than the next reduction"),
]


@pytest.mark.parametrize("build, why", REFUSED, ids=[w for _, w in REFUSED])
def test_explain_refuses_with_a_reason(build, why):
    # 16: more than a skinny product's own axes may hold (pw.MAX_REP)
    d = prepare(build(), sizes={a: 16 for a in build().axes}, dtype="bf16")
    reason = FAMILY.explain(d)
    assert reason is not None and why in reason, reason
    assert not FAMILY.matches(d)


def test_a_view_of_an_input_is_read_through_its_array():
    """A rename of an input (the kernel's sub-diagram keeps one where the array is also read as it
    is) is an input of its own in the analysis, whose tensor is the array's."""
    d = prepare(_rename_then_map(), sizes={"r": 8, "x": 8}, dtype="bf16")
    assert FAMILY.matches(d)
    launch = FAMILY.lower(d, FAMILY.candidates(d, "h100")[0], "sm_90a").launches[0]
    assert [a.name for a in launch.args if a.kind == "tensor"] == ["X", "Y"]


def test_explain_refuses_unbound_sizes():
    assert "not bound" in FAMILY.explain(sigmoid_chain())


# ----------------------------------------------------------------------------- the planner


def _plan(build, sizes, dtype="bf16", gpu="h100"):
    return derive(bound(build, sizes, dtype), gpu, dtype, explain=False).plan


def test_an_elementwise_chain_is_one_pointwise_kernel():
    plan = _plan(sigmoid_chain, dict(r=4096, x=4096))
    assert plan.families == ("pointwise",)
    (k,) = plan.kernels
    assert set(k.boxes) == {"h", "t", "scale", "Y"}
    p = build(plan)
    assert len(p.launches) == 1 and not p.buffers
    # the fallback ran it as one kernel per box, four launches
    fb = derive(bound(sigmoid_chain, dict(r=4096, x=4096)), "h100", "bf16", families=["fallback"],
                explain=False).plan
    assert len(fb.kernels) == 4 and plan.seconds < fb.seconds / 3


@pytest.mark.parametrize("build, sizes", [
    (column_sum, dict(r=8192, x=4096)),
    (row_sum, dict(r=8192, x=4096)),
    (sum_bh, dict(b=16, h=64, s=4096)),
    (sum_bs, dict(b=16, h=64, s=4096)),
    (total, dict(r=4096, x=4096)),
    (l2_norm, dict(r=4096, x=4096)),
    (column_mean, dict(r=8192, x=4096)),
    (post_maps, dict(r=4096, x=1024)),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_reductions_plan_as_one_pointwise_kernel(build, sizes):
    plan = _plan(build, sizes)
    assert plan.families == ("pointwise",), plan
    assert set(plan.kernels[0].boxes) == {plan.diagram.name_of(v) for v in plan.diagram.nodes}


@pytest.mark.parametrize("build, sizes", [
    (matvec, dict(a=8192, b=8192)), (vecmat, dict(b=8192, c=8192)), (batched_matvec_gelu, dict(n=8, a=1024, b=4096)),
    (dot_all, dict(r=4096, x=4096)),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_a_matrix_vector_product_is_one_bandwidth_bound_pointwise_kernel(build, sizes):
    """A contraction one of whose factors carries no axis of its own is a sum of products: one
    pass reads the matrix once (it fell to the scalar fallback), predicted at about the HBM rate."""
    plan = _plan(build, sizes)
    assert plan.families == ("pointwise",), plan
    d = plan.diagram
    big = max(d.inputs, key=lambda v: math.prod(a.bound_size for a in v.axes))
    hbm_s = math.prod(a.bound_size for a in big.axes) * 2 / 3.35e12
    assert hbm_s <= plan.seconds < 2.5 * hbm_s + 10e-6, (plan.seconds, hbm_s)
    fb = derive(bound(build, sizes), "h100", "bf16", families=["fallback"], explain=False).plan
    assert set(fb.families) == {"fallback"} and fb.seconds > plan.seconds


def test_a_matrix_product_is_left_to_the_contraction_family():
    a, b, c = axes("a b c")
    mm = Diagram("mm", contract(array("A", a, b), array("B", c, b), over=b, out=(a, c)))
    d = prepare(mm, sizes=dict(a=pw.MAX_REP + 1, b=8, c=pw.MAX_REP + 1), dtype="bf16")
    assert "each carry an axis the other lacks" in FAMILY.explain(d)
    # one side of at most MAX_REP elements: a skinny product, this family's
    assert FAMILY.explain(prepare(mm, sizes=dict(a=pw.MAX_REP, b=8, c=4096), dtype="bf16")) is None


def test_the_split_of_a_small_kept_space_is_planned_and_costed():
    # a column sum over 4096 kept columns gives 64 column blocks: R is split over blocks too
    plan = _plan(column_sum, dict(r=8192, x=4096))
    o = plan.kernels[0].kernel.options
    assert o.splits and o.splits > 1
    p = build(plan)
    # one launch: the last block of each column tile to arrive combines the partials
    (launch,) = p.launches
    assert launch.name.endswith("_col") and launch.grid[1] == o.splits
    buf, cnt = p.buffers
    assert buf.dtype == "fp32" and buf.shape == (o.splits, 4096) and not buf.zeroed
    # the arrival counters: one a column tile, zeroed once and kept (each last block resets its own)
    assert cnt.zeroed and cnt.shape == (launch.grid[0],)
    src = launch.source
    assert f"napkin::last_to_arrive(&{'cnt_' + cnt.name}[blockIdx.x], SPLITS)" in src
    est = FAMILY.launch_estimate(plan.diagram, plan.schedule, "h100")
    assert not est.get("extra_launches") and est["extra_hbm_bytes"] == 2 * 4 * o.splits * 4096
    # many kept columns: no split
    wide = _plan(column_sum, dict(r=64, x=1 << 20))
    assert not wide.kernels[0].kernel.options.splits


def test_the_max_and_sum_of_exp_are_one_pass():
    """logsumexp over the outer axis (the max, then Σ exp(x − zero_inf(max))) is one pointwise
    kernel holding the pair (running max, sum rescaled as it grows); a softmax over the outer axis
    is that pass and the output's map: two kernels, x read twice instead of three times."""
    plan = _plan(column_logsumexp, dict(r=4096, x=4096))
    (k,) = plan.kernels
    assert k.kernel.family == "pointwise" and set(k.kernel.boxes) >= {"max", "sum", "L"}
    shape = pw.analyse(plan.diagram)
    assert shape.how == pw.PAIR and not shape.pair.exact and shape.mode == "col"
    r, x = axes("r x")
    written = Diagram("col_softmax", softmax(array("X", r, x), r, name="Y"))
    sm = derive(written, "h100", "bf16", sizes=dict(r=4096, x=4096), explain=False).plan
    assert [kk.kernel.boxes for kk in sm.kernels] == [("Y_max", "Y_shifted", "Y_exp", "Y_sum"),
                                                      ("Y_shifted_again", "Y_exp_again", "Y")]
    assert [kk.kernel.family for kk in sm.kernels] == ["pointwise", "pointwise"]
    # the plan reads back (the expansion and the pair kernel again)
    assert Plan.from_dict(written, sm.to_dict()).to_dict() == sm.to_dict()


@pytest.mark.parametrize("build_, sizes", [(column_logsumexp, dict(r=4096, x=4096)), (softmax_stats, dict(r=300, x=24)),
                                           (logsumexp_bs, dict(b=16, h=4, s=4096))])
def test_a_pair_reduction_lowers_with_a_pair_of_partials(build_, sizes):
    """Every configuration lowers; a split's workspace holds the SPLITS maxes and then the SPLITS
    sums, combined by merge_max_sumexp in split order; the model's extra bytes count both."""
    d = bound(build_, sizes)
    shape = pw.analyse(d)
    seen_split = False
    for sched in FAMILY.candidates(d, "h100", "bf16"):
        p = FAMILY.lower(d, sched, "sm_90a")
        (launch,) = p.launches
        src = launch.source
        assert "fold_max_sumexp" in src or "merge_max_sumexp" in src
        assert f"pair_sum<{'true' if shape.pair.exact else 'false'}>" in src
        splits = sched.kernels[0].options.splits or 1
        if splits > 1:
            seen_split = True
            assert p.buffers[0].shape == (2 * splits, shape.nk)
            assert "((idx_t)SPLITS + blockIdx.y) * NK + kf] = b;" in src
            est = FAMILY.launch_estimate(d, sched, "h100")
            assert est["extra_hbm_bytes"] == 2 * 2 * 4 * splits * shape.nk
    assert seen_split


def test_cli_derive_of_a_user_file(tmp_path):
    from typer.testing import CliRunner

    from napkin.cli import app

    f = tmp_path / "chain.py"
    f.write_text("from napkin.diagrams import Diagram, array, axes, tanh, scale\n"
                 "r, x = axes('r x')\n"
                 "t = tanh(scale(array('X', r, x), 0.5, name='h'), name='t')\n"
                 "sig = Diagram('sig', (t * 0.5 + 0.5).named('Y'))\n")
    res = CliRunner().invoke(app, ["derive", f"{f}:sig", "-s", "r=4096", "-s", "x=4096"], catch_exceptions=False)
    assert res.exit_code == 0, res.stdout
    assert "1 kernel" in res.stdout and "pointwise:" in res.stdout and "fallback" not in res.stdout


def test_maps_between_contractions_run_on_no_fallback():
    """Elementwise boxes between two contractions (reading a further full-size input) are fused
    where the model finds it cheaper; none of them is left to the scalar fallback."""
    a, b, c, e = axes("a b c e")
    Y1 = contract(array("X", a, b), array("W1", b, c), over=b, name="Y1")
    t = tanh(scale(Y1, 0.5, name="h"), name="t")
    G = ((t * 0.5 + 0.5).named("g") * array("R", a, c)).named("G")
    Y2 = contract(G, array("W2", c, e), over=c, name="Y2")
    d = prepare(Diagram("between", Y2), sizes=dict(a=2048, b=1024, c=1024, e=1024), dtype="bf16")
    plan = derive(d, "h100", "bf16", explain=False).plan
    assert "fallback" not in plan.families
    maps = {d.name_of(v) for v in d.nodes if v.op.kind == "map"}
    homes = [k for k in plan.kernels if maps & set(k.boxes)]
    assert all(k.family in ("contraction", "pointwise") for k in homes)
    assert sum(k.family == "pointwise" for k in homes) <= 1


# ----------------------------------------------------------------------------- schedules and lowering


def test_a_planned_kernel_lowers_to_the_same_kernel_again():
    """plan → build decides nothing: the plan's JSON read back builds the same launches."""
    for build_, sizes in [(sigmoid_chain, dict(r=300, x=1000)), (column_sum, dict(r=8192, x=4096)),
                          (l2_norm, dict(r=7, x=65536))]:
        plan = _plan(build_, sizes)
        again = Plan.from_dict(plan.diagram, plan.to_dict())
        a, b = build(plan), build(again)
        assert [(l.name, l.source, l.grid, l.block) for l in a.launches] == \
               [(l.name, l.source, l.grid, l.block) for l in b.launches]


def test_options_carry_every_tunable():
    d = bound(column_sum, dict(r=999, x=72))
    shape = pw.analyse(d)
    for s in FAMILY.candidates(d, "h100", "bf16"):
        cfg = FAMILY.config(d, s)
        o = s.kernels[0].options
        assert (o.warps * 32, o.stages, o.threads_per_row, o.splits or 1) == \
               (cfg.threads, cfg.unroll, cfg.tpr, cfg.splits)
        assert o.regs_per_thread == pw.regs_estimate(shape, cfg)


def test_the_template_opens_with_a_legend():
    p = lower(bound(post_maps, dict(r=20, x=24)), family="pointwise", gpu="h100")
    src = p.launches[0].source
    assert "// Legend: diagram axes -> template symbols -> tunables" in src
    assert re.search(r"tunables: TX = \d+, TY = \d+, UNROLL = \d+, VEC = 8, SPLITS = \d+", src)
    assert "extern \"C\" __global__" in src


def test_vector_access_kinds():
    """A thread moves VEC values along the vector axis: one access for arrays holding it
    innermost, strided loads for arrays holding it elsewhere, one broadcast scalar otherwise."""
    src = lower(bound(broadcast_chain, dict(r=7, x=24)), family="pointwise", gpu="h100").launches[0].source
    assert "napkin_pwh::load<T, VEC>(ld_X[u]" in src and "napkin_pwh::load<T, VEC>(ld_b[u]" in src
    assert "ld_c[u] = in_c[" in src                    # c[r] lacks x: one scalar per vector
    assert "napkin_pwh::store<T, VEC>(out_Y" in src
    src = lower(bound(transposed_add, dict(r=6, x=16)), family="pointwise", gpu="h100").launches[0].source
    assert "napkin_pwh::load_strided<T, VEC>(ld_Z[u]" in src


def test_a_transposed_input_is_staged_through_a_cross_tile():
    """An input holding the vector axis but not innermost is read along its own innermost axis
    (the cross axis) into a shared tile and used down its columns; the outputs keep their vector
    stores. Below MIN_CROSS values of the cross axis the strided loads stay."""
    shape = pw.analyse(bound(transposed_add, dict(r=1000, x=40)))
    assert (shape.mode, shape.inner, shape.cross, [v.name for v in shape.staged]) == ("map", "x", "r", ["Z"])
    cfgs = pw.configs(shape)
    assert cfgs and all(pw.smem_estimate(shape, c) <= pw.STATIC_SMEM for c in cfgs)
    t = pw.cross_tile(shape, cfgs[0])
    assert t.pitch % 2 == 1 and t.tq == cfgs[0].threads // t.lanes * cfgs[0].unroll
    assert t.blocks == pw.base_blocks(shape, cfgs[0]) == -(-40 // t.ti) * -(-1000 // t.tq)
    src = lower(bound(transposed_add, dict(r=1000, x=40)), family="pointwise", gpu="h100").launches[0].source
    assert "__shared__ T sm_Z[TI * PITCH];" in src and "__syncthreads();" in src
    assert "napkin_pwh::load_strided<T, VEC>(ld_Z[u], sm_Z + il * PITCH + ql, PITCH);" in src
    assert "napkin_pwh::load<T, VEC>(ld_X[u]" in src and "napkin_pwh::store<T, VEC>(out_Y" in src
    assert "load_strided<T, VEC>(ld_Z[u], in_Z" not in src
    # 15 rows: under MIN_CROSS, the strided loads of the plain map kernel
    small = pw.analyse(bound(transposed_add, dict(r=pw.MIN_CROSS - 1, x=40)))
    assert small.cross is None and small.staged == ()


def test_random_permuted_maps_plan_one_pointwise_kernel_and_many_a_cross_tile():
    crossed = 0
    for seed in range(24):
        d, sizes = random_permuted_map(seed)
        p = lower(prepare(d, sizes=sizes, dtype="bf16"), family="pointwise", gpu="h200")
        src = p.launches[0].source
        shape = pw.analyse(prepare(d, sizes=sizes, dtype="bf16"))
        assert (shape.cross is not None) == ("__shared__ T sm_" in src)
        crossed += shape.cross is not None
    assert 6 <= crossed <= 18


def test_a_rotation_of_three_axes_stages_along_the_source_innermost_axis():
    shape = pw.analyse(bound(rotated_scale, dict(a=3, b=100, c=37)))
    assert (shape.order, shape.inner, shape.cross, shape.vec) == (("c", "a", "b"), "b", "c", 4)
    t = pw.cross_tile(shape, pw.configs(shape)[0])
    # 37 values of c: 16-bit rows read as the 16-byte lines they span, shifted; fp32 value by value
    assert (t.sv, t.shifted, t.outer) == (8, True, 3)
    src = lower(bound(rotated_scale, dict(a=3, b=100, c=37)), family="pointwise", gpu="h100").launches[0].source
    assert "napkin_pwh::load_shifted<T, SV>(sv_X[k]" in src
    f32 = pw.analyse(bound(rotated_scale, dict(a=3, b=100, c=37), "fp32"))
    assert (pw.cross_tile(f32, pw.configs(f32)[0]).sv, pw.cross_tile(f32, pw.configs(f32)[0]).shifted) == (1, False)
    # two inputs with the vector axis elsewhere and the same innermost axis: both staged
    mix = pw.analyse(bound(transposed_mix, dict(a=2, b=77, h=40)))
    assert mix.cross == "b" and sorted(v.name for v in mix.staged) == ["W", "Z"]


def test_an_output_in_the_other_layout_is_written_through_the_cross_tile():
    shape = pw.analyse(bound(two_layouts, dict(a=100, b=40)))
    assert shape.cross is not None and [n for n, _ in shape.staged_out] in (["Z"], ["Y"])
    src = lower(bound(two_layouts, dict(a=100, b=40)), family="pointwise", gpu="h100").launches[0].source
    n = shape.staged_out[0][0]
    assert f"napkin_pwh::store_strided<T, VEC>(sm_{n} + il * PITCH + ql, st_{n}, PITCH);" in src
    assert "// phase 3: each staged output's tile, written along the cross axis" in src
    assert f"napkin_pwh::store_strided<T, VEC>(out_{n}" not in src
    cfgs = pw.configs(shape)
    assert pw.smem_estimate(shape, cfgs[0]) == 2 * pw.cross_tile(shape, cfgs[0]).ti * pw.cross_tile(shape, cfgs[0]).pitch * 2


@pytest.mark.parametrize("x, vec, col_bf16, col_fp32", [
    (4096, 8, (8, False), (4, False)), (4092, 4, (8, True), (4, False)), (4094, 2, (8, True), (2, False)),
    (4095, 1, (8, True), (1, False)), (1, 1, (1, False), (1, False))])
def test_the_vector_width_divides_the_vector_axis(x, vec, col_bf16, col_fp32):
    """Where an array is read per row (a broadcast input), a vector stays inside the vector axis: its
    width divides the axis' size. A 16-bit column reduction keeps whole 16-byte vectors instead, the
    last of each line partial (``padded``), where the axis holds more than one vector."""
    for dtype, want in (("bf16", col_bf16), ("fp32", col_fp32)):
        shape = pw.analyse(bound(column_sum, dict(r=3, x=x), dtype))
        assert (shape.vec, shape.padded) == want
        assert shape.nkv == -(-x // shape.vec)
    assert pw.analyse(bound(broadcast_chain, dict(r=3, x=x))).vec == vec


@pytest.mark.parametrize("r, x, dtype, tail", [(3, 4095, "bf16", 3 * 4095 % 8), (7, 4094, "bf16", 7 * 4094 % 8),
                                               (1, 1, "bf16", 1), (8, 4095, "bf16", 0), (5, 1001, "fp32", 5005 % 4),
                                               (3, 4096, "bf16", 0)])
def test_a_map_over_one_layout_keeps_whole_vectors_across_rows(r, x, dtype, tail):
    """A map whose arrays all hold the space in one order runs its 16-byte vectors over the
    flattened space: an odd row length no longer makes every access a scalar; the last vector
    holds what is left (loaded and stored value by value)."""
    d = bound(sigmoid_chain, dict(r=r, x=x), dtype)
    shape = pw.analyse(d)
    want_vec = 16 // (2 if dtype == "bf16" else 4)
    assert (shape.vec, shape.tail, shape.nvec) == (want_vec, tail, -(-r * x // want_vec))
    assert shape.flat == (x % want_vec != 0)
    src = lower(d, family="pointwise", gpu="h100").launches[0].source
    if tail:
        assert f"constexpr idx_t NU = {r * x};" in src
        assert "napkin_pwh::load_n<T, VEC>(ld_X[u], in_X + (koff_X + flat), vec_ok, NU - flat);" in src
        assert "napkin_pwh::store_n<T, VEC>(out_Y + (koff_Y + flat), st_Y, vec_ok, NU - flat);" in src
        assert "if (flat < NU) {" in src
    else:
        assert "load_n<" not in src.split("extern")[-1] and "if (flat < NVEC * VEC) {" in src
    for s in FAMILY.candidates(d, "h100", dtype):
        cfg = FAMILY.config(d, s)
        gx, _, _ = pw.grid(shape, cfg)
        assert gx * cfg.threads * cfg.unroll * shape.vec >= r * x   # every value, the tail's included


@pytest.mark.parametrize("build_, sizes, aligned", [
    (row_sum, dict(r=7, x=4095), True), (row_sum, dict(r=3, x=1), True), (total, dict(r=9, x=41), True),
    (l2_norm, dict(r=6, x=71), True), (dot_all, dict(r=9, x=41), True), (row_sum, dict(r=7, x=4096), False),
    (sum_bs, dict(b=3, h=5, s=33), False),            # R = (b, s) is no run of the row's memory
    (matvec, dict(a=7, b=101), True),                 # x[b], the same in every row, shifted into place
    (full_and_reduced, dict(r=4, x=41), False),       # an output written in the pass
    (masked_rowmax, dict(q=9, x=9), False)])          # an index map
def test_rows_of_odd_length_keep_whole_vectors(build_, sizes, aligned):
    """A row kernel whose rows are contiguous runs of every input keeps 16-byte vectors where the
    row's length is odd: each row reads the values before its first 16-byte boundary and after its
    last whole vector one by one, aligned vectors between; other shapes narrow the vector."""
    d = bound(build_, sizes)
    shape = pw.analyse(d)
    assert shape.mode == "row" and shape.aligned_rows == aligned
    assert shape.vec == (8 if aligned or sizes[shape.inner] % 8 == 0 else math.gcd(8, sizes[shape.inner]))
    src = lower(d, family="pointwise", gpu="h100").launches[0].source
    if aligned:
        assert "napkin_pwh::head_of(in_" in src and "const idx_t rflat = head + (rv0 + u * THREADS_PER_ROW) * VEC;" in src
        assert "for (idx_t j = lane; j < NR - nrv * VEC; j += THREADS_PER_ROW) {" in src
        assert f"constexpr idx_t NR = {shape.nr};" in src
    else:
        assert "head_of(" not in src.split("extern")[-1]
    two = lower(bound(dot_all, dict(r=9, x=41)), family="pointwise", gpu="h100").launches[0].source
    # two inputs: their vectors align together only when they start at the same place in a line
    assert ("(reinterpret_cast<unsigned long long>(in_X) ^ reinterpret_cast<unsigned long long>(in_Y))) % 16ULL"
            in two)


@pytest.mark.parametrize("build_, sizes, dtype", [
    (sum_middle, dict(b=16, m=1024, n=4095), "bf16"), (sum_middle, dict(b=3, m=77, n=1001), "fp16"),
    (column_sum, dict(r=4096, x=1001), "bf16"), (post_maps, dict(r=300, x=1001), "fp16")])
def test_a_column_reduction_along_an_odd_axis_keeps_whole_vectors(build_, sizes, dtype):
    """A column kernel whose kept vector axis is no multiple of VEC keeps 16-byte vectors: each line of
    the axis holds ceil(n / VEC) of them, the last partial; every vector is read from the lines it
    straddles and shifted into place, and a tile position past a line's end maps to no kept index."""
    d = bound(build_, sizes, dtype)
    shape = pw.analyse(d)
    n = shape.sizes[shape.inner]
    assert shape.mode == "col" and shape.padded and shape.vec == 16 // shape.bytes
    assert shape.nkv == (shape.nk // n) * -(-n // shape.vec)
    for s in FAMILY.candidates(d, "h100", dtype):
        (k,) = FAMILY.lower(d, s, "sm_90a").launches
        assert "napkin_pwh::load_shifted<T, VEC>(ld_" in k.source and "napkin_pwh::load<T, VEC>(ld_X" not in k.source
        assert f"constexpr idx_t NVN = {-(-n // shape.vec)};" in k.source and "kept_at(blockIdx.x, c)" in k.source
        cfg = FAMILY.config(d, s)
        assert k.grid[0] * cfg.tx >= shape.nkv


def test_other_column_reductions_keep_the_vector_dividing_the_axis():
    # fp32 values, a pair (logsumexp), a pass that also writes the whole space, a whole number of vectors
    assert not pw.analyse(bound(sum_middle, dict(b=3, m=77, n=1001), "fp32")).padded
    assert not pw.analyse(bound(column_logsumexp, dict(r=4096, x=1001))).padded
    assert not pw.analyse(bound(full_and_reduced, dict(r=4, x=1001))).padded
    assert not pw.analyse(bound(column_sum, dict(r=4, x=4096))).padded


@pytest.mark.parametrize("n, dtype, lanes", [(1001, "fp32", 128), (1024, "fp32", 32), (1024, "bf16", 32),
                                             (4096, "fp32", 32)])
def test_a_column_kernel_prefers_512_contiguous_bytes_a_row(n, dtype, lanes):
    """The column kernel's first choice among configurations the model times alike reads 512
    contiguous bytes of each row of R: 32 lanes of 16-byte vectors, 128 lanes of fp32 scalars where
    the kept axis is odd (H200, max over the first axis of 77 x 16 x 64 x 255 fp32: 128 lanes 22.4
    us of kernel, 32 lanes 35.6)."""
    d = bound(sum_middle, dict(b=16, m=1024, n=n), dtype)
    shape = pw.analyse(d)
    assert shape.mode == "col" and not shape.padded
    first = FAMILY.config(d, FAMILY.candidates(d, "h200", dtype)[0])
    assert first.tx == lanes and first.tx * shape.vec * shape.bytes == 512


@pytest.mark.parametrize("dtype, vec", [("bf16", 8), ("fp16", 8), ("fp32", 4)])
def test_a_vector_every_row_reads_beside_aligned_rows_is_read_where_it_sits(dtype, vec):
    """A matrix-vector product over rows of odd length: W's rows keep whole aligned vectors, and
    x[b], whose values sit elsewhere in their 16-byte lines than each row's (an aligned vector load
    of it would fault), is read from the two aligned lines each 16-bit vector spans and shifted into
    place, and value by value in fp32 (four loads a vector; measured faster there); the rows'
    alignment check looks at W alone."""
    d = bound(matvec, dict(a=4097, b=12289), dtype)
    shape = pw.analyse(d)
    assert shape.aligned_rows and shape.vec == vec
    src = lower(d, family="pointwise", gpu="h100").launches[0].source
    shifted = "napkin_pwh::load_shifted<T, VEC>(ld_x[u], in_x + (koff_x + rflat), VEC);" in src
    scalar = "napkin_pwh::load<T, VEC>(ld_x[u], in_x + (koff_x + rflat), false);" in src
    assert (shifted, scalar) == ((True, False) if vec == 8 else (False, True))
    assert "napkin_pwh::load<T, VEC>(ld_W[u], in_W + (koff_W + rflat), vec_ok);" in src
    assert "head_of(in_W + koff_W, NR)" in src and "in_x) %" not in src


def test_maps_prefer_eight_vectors_in_flight_in_128_thread_blocks():
    """The model times a long map's unrolls alike; the family's order then picks 128 threads with
    eight vectors each (measured best on an H200: tanh-form GELU 67 us against 70 with four and
    76 for 256 threads with two), where the space has the vectors for it."""
    for gpu in ("h100", "h200"):
        d = bound(sigmoid_chain, dict(r=8192, x=8192))
        cfg = FAMILY.config(d, FAMILY.candidates(d, gpu, "bf16")[0])
        assert (cfg.threads, cfg.unroll) == (128, 8)
        o = _plan(sigmoid_chain, dict(r=8192, x=8192), gpu=gpu).kernels[0].kernel.options
        assert (o.warps * 32, o.stages) == (128, 8)
    # 96 vectors: a thread's second half of eight would be empty
    small = bound(sigmoid_chain, dict(r=3, x=256))
    assert all(FAMILY.config(small, s).unroll == 1 for s in FAMILY.candidates(small, "h100", "bf16"))


def test_a_map_of_many_arrays_prefers_fewer_vectors_in_flight_over_a_register_heavy_block():
    """exp(X − m) / s with m and s broadcast (an outer softmax's output): eight vectors of three
    arrays need 144 registers (measured 26.4 µs at 4096² bf16 on an H100, four vectors 22.2, two
    22.0): the family prefers the most vectors within MAP_REGS, and every heavier block after."""
    a, b = axes("a b")
    X, m, s = array("X", a, b), array("m", b), array("s", b)
    d = prepare(Diagram("smap", map_fn("div", exp(map_fn("sub", X, m, name="d"), name="e"), s, name="Y")),
                sizes=dict(a=4096, b=4096), dtype="bf16")
    shape = pw.analyse(d)
    cfgs = [FAMILY.config(d, c) for c in FAMILY.candidates(d, "h100", "bf16")]
    regs = [pw.regs_estimate(shape, c) for c in cfgs]
    light = [c for c, r in zip(cfgs, regs) if r <= pw.MAP_REGS]
    deepest = max(c.unroll for c in light if c.threads == 128)
    assert regs[0] <= pw.MAP_REGS and (cfgs[0].threads, cfgs[0].unroll) == (128, deepest)
    first_heavy = next(i for i, r in enumerate(regs) if r > pw.MAP_REGS)
    assert all(r > pw.MAP_REGS for r in regs[first_heavy:])
    assert any(c.unroll == 8 for c in cfgs[first_heavy:])


def test_a_map_block_keeps_28_warps_an_sm():
    """gelu(X)·sigmoid(Y) over 8192 x 4096 bf16: eight vectors of two arrays take 96 registers, 20
    warps an SM in 128-thread blocks (H200, kernels' time 56.4 µs), four take 64 (49.9 µs). The
    tanh-form GELU of one array keeps its eight vectors at 72 registers (35.2 µs, four 36.9)."""
    a, b = axes("a b")
    X, Y = array("X", a, b), array("Y", a, b)
    d = prepare(Diagram("gs", map_fn("mul", map_fn("gelu", X), map_fn("sigmoid", Y), name="Z")), sizes=dict(a=8192, b=4096),
                dtype="bf16")
    cfg = FAMILY.config(d, FAMILY.candidates(d, "h200", "bf16")[0])
    assert (cfg.threads, cfg.unroll) == (128, 4) and pw.regs_estimate(pw.analyse(d), cfg) <= pw.MAP_REGS
    assert pw.regs_estimate(pw.analyse(d), pw.Config("map", 128, 8)) > pw.MAP_REGS


def test_a_map_whose_every_block_is_heavy_takes_the_fewest_registers():
    """Where no block fits MAP_REGS (the sum of ten arrays), the lightest goes first, not the
    deepest (eight vectors of ten arrays would take 255 registers): the preference orders by the
    registers over the limit."""
    a, b = axes("a b")
    arrays = [array(f"X{i}", a, b) for i in range(10)]
    y = arrays[0]
    for i, x in enumerate(arrays[1:]):
        y = map_fn("add", y, x, name=f"s{i}")
    d = prepare(Diagram("many", y), sizes=dict(a=4096, b=4096), dtype="bf16")
    shape = pw.analyse(d)
    cfgs = [FAMILY.config(d, c) for c in FAMILY.candidates(d, "h200", "bf16")]
    regs = [pw.regs_estimate(shape, c) for c in cfgs]
    assert min(regs) > pw.MAP_REGS and regs[0] == min(regs) and cfgs[0].threads == 128


def test_indices_are_64_bit_past_2_to_the_30():
    big = lower(bound(row_sum, dict(r=3, x=3 * 2 ** 30)), family="pointwise", gpu="h100")
    for launch in big.launches:
        assert "typedef long long idx_t;" in launch.source
    assert "3221225472LL" in big.launches[0].source
    small = lower(bound(row_sum, dict(r=3, x=1000)), family="pointwise", gpu="h100")
    assert "typedef int idx_t;" in small.launches[0].source


def test_launch_estimate_counts_full_size_inputs_in_flight():
    d = bound(broadcast_chain, dict(r=4096, x=4096))
    s = FAMILY.candidates(d, "h100", "bf16")[0]
    est = FAMILY.launch_estimate(d, s, "h100")
    cfg = FAMILY.config(d, s)
    # X[r,x] is read fresh; b[x] and c[r] are broadcast (L2)
    assert est["in_flight_bytes_per_thread"] == cfg.unroll * 16
    assert est["blocks"] == math.ceil(4096 * 4096 / 8 / (cfg.threads * cfg.unroll))
    assert "extra_launches" not in est


# ----------------------------------------------------------------------------- random shapes

SIZES = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 31, 64, 97, 100, 127, 1000, 4093])
BUILDS = [sigmoid_chain, broadcast_chain, transposed_add, column_sum, row_sum, sum_bh, sum_bs, total,
          l2_norm, column_mean, post_maps, full_and_reduced, masked_rowmax]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(BUILDS) - 1), dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
       data=st.data())
def test_random_shapes_lower_and_cover_the_space(which, dtype, data):
    build_ = BUILDS[which]
    names = list(build_().axes)
    sizes = {a: data.draw(SIZES, label=a) for a in names}
    d = bound(build_, sizes, dtype)
    assert FAMILY.explain(d) is None
    shape = pw.analyse(d)
    assert shape.sizes[shape.inner] % shape.vec == 0 or (shape.mode == "map" and shape.flat) or shape.aligned_rows \
        or (shape.mode == "col" and shape.padded)
    cands = FAMILY.candidates(d, "h100", dtype)
    assert cands
    for s in (cands[0], cands[-1]):
        cfg = FAMILY.config(d, s)
        p = FAMILY.lower(d, s, "sm_90a")
        gx, gy, _ = p.launches[0].grid
        assert gy == cfg.splits and p.launches[0].block[0] == cfg.threads
        # the grid covers the space: every vector (map), row (row) or kept vector (col)
        if shape.mode == "map":
            assert gx * cfg.threads * cfg.unroll * shape.vec >= shape.nu
        elif shape.mode == "row":
            assert gx * cfg.rows_per_block >= shape.nk
        else:
            assert gx * cfg.tx >= shape.nkv and shape.nkv * shape.vec >= shape.nk
        if shape.mode != "map":
            assert pw.chunk(shape, cfg) * cfg.splits >= pw._vectors_r(shape)
        assert len(p.launches) == 1 and len(p.buffers) == (2 if cfg.splits > 1 else 0)
        est = FAMILY.launch_estimate(d, s, "h100")
        assert 0.0 <= est["idle_lanes"] < 1.0 and est["blocks"] == gx * gy


# ----------------------------------------------------------------------------- nvcc

NVCC_CASES = [
    (sigmoid_chain, dict(r=64, x=4096)), (broadcast_chain, dict(r=64, x=4093)), (transposed_add, dict(r=64, x=64)),
    (alibi_map, dict(h=4, q=64, x=64)), (sigmoid_chain, dict(r=7, x=4095)), (row_sum, dict(r=64, x=4095)),
    (dot_all, dict(r=64, x=999)), (column_sum, dict(r=4096, x=512)), (row_sum, dict(r=4, x=1 << 16)),
    (row_sum, dict(r=4096, x=4097)), (sum_bh, dict(b=16, h=64, s=512)), (sum_bs, dict(b=16, h=8, s=512)),
    (total, dict(r=512, x=512)), (post_maps, dict(r=1024, x=1024)), (full_and_reduced, dict(r=256, x=1024)),
    (masked_rowmax, dict(q=256, x=256)), (row_sum, dict(r=3, x=3 * 2 ** 30)), (matvec, dict(a=1000, b=4099)),
    (vecmat, dict(b=4096, c=1000)), (batched_matvec_gelu, dict(n=3, a=64, b=1000)), (dot_all, dict(r=64, x=1000)),
    (column_logsumexp, dict(r=4096, x=4096)), (column_logsumexp, dict(r=1000, x=7)), (row_logsumexp, dict(r=64, h=3, x=1365)),
    (softmax_stats, dict(r=4096, x=4096)), (logsumexp_bs, dict(b=16, h=64, s=4096)), (logsumexp_bh, dict(b=3, h=5, s=97)),
    (sum_middle, dict(b=16, m=1024, n=4095)), (column_logsumexp, dict(r=4096, x=1001)), (post_maps, dict(r=300, x=1001)),
    (vecmat, dict(b=4099, c=1001)), (max_middle, dict(b=3, m=7, n=1001)),
    # cross tiles: a transposed input, a rotation with an odd cross axis (16-bit rows read shifted),
    # two staged inputs beside an index map, a staged output
    (transposed_add, dict(r=1000, x=40)), (rotated_scale, dict(a=3, b=100, c=37)),
    (transposed_mix, dict(a=2, b=77, h=40)), (two_layouts, dict(a=1001, b=64)),
]


def _rename(launch, new: str):
    return dataclasses.replace(launch, name=new, source=re.sub(rf"\b{re.escape(launch.name)}\b", new, launch.source))


def _nvcc_launches() -> list:
    out = []
    for ci, (build_, sizes) in enumerate(NVCC_CASES):
        for dt in ("bf16", "fp16", "fp32"):
            d = bound(build_, sizes, dt)
            cands = FAMILY.candidates(d, "h100", dt)
            picks = {"bf16": {0, len(cands) - 1}, "fp16": {len(cands) // 3}, "fp32": {len(cands) // 2}}[dt]
            for i in picks:
                p = FAMILY.lower(d, cands[i], "sm_90a")
                out += [_rename(l, f"{l.name}_{ci}_{dt}_{i}") for l in p.launches]
    return out


@pytest.mark.nvcc
def test_kernels_compile_for_sm80_and_sm90a_within_the_model():
    from napkin.kernels import nvcc_compile

    launches = _nvcc_launches()
    src = "\n".join(l.source for l in launches)
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = list(pool.map(lambda arch: (arch, nvcc_compile(src, arch)), ("sm_80", "sm_90a")))
    problems = []
    modes = set()
    for arch, usage in builds:
        for k in launches:
            modes.add(dict(k.tunables)["MODE"])
            r = usage.kernels[k.name]
            where = f"{k.name} ({arch}, {dict(k.tunables)})"
            model = k.model_regs_per_thread
            if r.spills:
                problems.append(f"{where}: spills {r.spill_stores} B stores / {r.spill_loads} B loads")
            if r.registers > model:
                problems.append(f"{where}: {r.registers} registers, the model assumed {model}")
            if model - r.registers > max(32, 0.6 * model):
                problems.append(f"{where}: {r.registers} registers, far under the model's {model}")
            if abs(r.shared_bytes + k.shared_bytes - (k.model_smem_bytes or 0)) > SMEM_TOLERANCE:
                problems.append(f"{where}: {r.shared_bytes} B shared memory, the model assumed {k.model_smem_bytes}")
    assert modes == {"map", "row", "col"}
    assert not problems, "\n".join(problems)


@pytest.mark.nvcc
def test_generated_file_of_a_planned_chain_compiles_as_it_stands(tmp_path):
    import shutil
    import subprocess

    from napkin.codegen.generate import generate_source

    src = generate_source(column_sum(), sizes=dict(r=8192, x=4096), gpu="h100", dtype="bf16")
    f = tmp_path / "colsum.cu"
    f.write_text(src)
    cmd = [shutil.which("nvcc"), "-cubin", "-gencode=arch=compute_90a,code=sm_90a", str(f), "-o",
           str(tmp_path / "k.cubin")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
