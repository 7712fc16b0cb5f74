"""Column reductions in the row-wise chain kernel, without a GPU: a chain kernel whose diagram also
sums (or takes the max or min of) a value it computes over every row (``dgamma = Σ_r dY·N``,
``dbeta = Σ_r dY`` of a norm's backward) keeps per-thread fp32 partials of its columns while its
blocks loop over the rows, writes one partial row per block, and the blocks still there when the
last one arrives add them up in the same kernel (arrival counters in a zeroed workspace; no second
launch). What the analysis takes and refuses, what the planner chooses for the norm backwards
(one kernel, one launch; the partials' size), what the model prices (HBM bytes of X, dY, dX and
the vectors; the partials, no second launch), and that the generated source builds with nvcc for
sm_80 and sm_90a within the model's registers and shared memory."""

from __future__ import annotations

import dataclasses
import re

import pytest

from napkin.codegen import families
from napkin.codegen.families.rowwise import COMBINE_SLICES, COUNTERS, FAMILY, ChainShape, analyse
from napkin.codegen.lower import SMEM_TOLERANCE, lower
from napkin.codegen.partition import kernel_problem, plan_units
from napkin.codegen.planner import _Planner, derive
from napkin.codegen.prepare import prepare
from napkin.codegen.select import model_cost, predict_schedule, resolve_gpu
from napkin.diagrams import Axis, Diagram, array, library, map_fn, mean_over, reduce, rsqrt, square, \
    sum_over

SAVES = {"rmsnorm": {"N_rstd"}, "layernorm": {"N_rstd", "N_mean"}}
COLS = {"rmsnorm": ["dgamma"], "layernorm": ["dgamma", "dbeta"]}


def norm_grad(name: str, dtype: str = "bf16", **sizes) -> Diagram:
    """The backward of a library norm with its per-row statistics saved (what napkin.torch saves)."""
    return prepare(library.get(name).grad(save=SAVES[name]), sizes=sizes, dtype=dtype)


def whole(d: Diagram) -> Diagram:
    """The sub-diagram of one kernel holding every box of ``d``."""
    return kernel_problem(d, plan_units(d), "k")[0]


def batch_rows() -> Diagram:
    """A user-written chain over rows of two axes (b, s): an RMS-scaled row written as maps and
    reductions, and over every row a sum of X·Y (a dgamma-like column sum over two axes) and a max
    of |Y| (a column max)."""
    b, s, x = Axis("b"), Axis("s"), Axis("x")
    X, g = array("X", b, s, x), array("g", x)
    Y = (X * rsqrt(mean_over(square(X), x, name="ms") + 1e-6) * g).named("Y")
    cs = sum_over(sum_over((X * Y).named("XY"), "b"), "s", name="colsum")
    cm = reduce(reduce(map_fn("abs", Y, name="aY"), "s", "max"), "b", "max", name="colmax")
    return Diagram("batch_rows", (Y, cs, cm))


# ----------------------------------------------------------------------------- analysis

@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_norm_backwards_are_one_chain_with_column_reductions(name):
    s = analyse(whole(norm_grad(name, r=300, x=1000)))
    assert isinstance(s, ChainShape), s
    assert s.red == ("x",) and s.row_axes == ("r",)
    assert [s.name(c.result) for c in s.cols] == COLS[name] == [n for n, _ in s.col_out]
    assert all(c.how == "sum" for c in s.cols)
    assert [n for n, _ in s.full_out] == ["dX"] and not s.row_out


def test_a_user_written_chain_over_two_row_axes():
    s = analyse(prepare(batch_rows(), sizes=dict(b=3, s=5, x=100), dtype="bf16"))
    assert isinstance(s, ChainShape), s
    assert s.red == ("x",) and s.row_axes == ("b", "s")
    assert [(s.name(c.result), c.how, len(c.links)) for c in s.cols] == [("colsum", "sum", 2), ("colmax", "max", 2)]


@pytest.mark.parametrize("sizes", [dict(b=3, s=77, x=999), dict(b=64, s=512, x=2048)])
def test_a_user_written_chain_plans_as_one_kernel(sizes):
    d = prepare(batch_rows(), sizes=sizes, dtype="bf16")
    (pk,) = derive(d, "h100", "bf16").plan.kernels
    assert pk.kernel.family == "rowwise" and {"Y", "colsum", "colmax"} <= set(pk.kernel.boxes)
    p = lower(d, gpu="h100")
    assert p.buffers[0].shape == (2, pk.kernel.options.splits, sizes["x"])
    # the column max starts at -inf and merges by fmaxf: per element, over the block's rows, in the combine
    (launch,) = p.launches
    src = launch.source
    assert re.search(r"colpart\[1\]\[slot\]\[\(c \* VEC \+ e\) \* THREADS_PER_ROW \+ lane\] = \(-INFINITY\)", src)
    assert re.search(r"colpart\[1\]\[slot\]\[\(\(c0 \+ u\) \* VEC \+ e\) \* THREADS_PER_ROW \+ lane\] = fmaxf\(", src)
    assert "a = fmaxf(a, colpart[1][s][w])" in src
    assert "a = fmaxf(a, v[j]);" in src and "t = fmaxf(t, cmb[s][cx]);" in src
    assert "v[j] = b < SPLITS ? __ldcg(p + (long long)b * XSIZE) : (-INFINITY);" in src


def _read_column_sum() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    c = sum_over(X, "r", name="c")
    return Diagram("read_col", ((X - mean_over(X, "x", name="m")).named("D"), (X * c).named("Z")))


def _partial_column_sum() -> Diagram:
    b, s, x = Axis("b"), Axis("s"), Axis("x")
    X = array("X", b, s, x)
    return Diagram("partial_col", ((X - mean_over(X, "x", name="m")).named("D"), sum_over(X, "s", name="c")))


@pytest.mark.parametrize("build, sizes, words", [
    (_read_column_sum, dict(r=8, x=64), "no column reduction"),          # a box reads the column sum
    (_partial_column_sum, dict(b=2, s=4, x=64), "no column reduction"),  # it sums only some rows
])
def test_what_is_no_column_reduction_is_refused_with_the_reason(build, sizes, words):
    why = FAMILY.explain(prepare(build(), sizes=sizes, dtype="bf16"))
    assert why is not None and words in why, why


# ----------------------------------------------------------------------------- the plan

@pytest.mark.parametrize("gpu", ["h100", "a100"])
@pytest.mark.parametrize("name, sizes", [("rmsnorm", dict(r=16384, x=4096)), ("rmsnorm", dict(r=4096, x=4096)),
                                         ("layernorm", dict(r=16384, x=4096)), ("layernorm", dict(r=4096, x=4096)),
                                         ("rmsnorm", dict(r=777, x=1000)), ("layernorm", dict(r=37, x=4095))])
def test_the_planner_fuses_the_column_reductions_into_the_row_kernel(name, sizes, gpu):
    d = norm_grad(name, **sizes)
    der = derive(d, gpu, "bf16")
    (pk,) = der.plan.kernels
    assert pk.kernel.family == "rowwise" and {"dX", *COLS[name]} <= set(pk.kernel.boxes), str(der.plan)
    splits = pk.kernel.options.splits
    sms = resolve_gpu(gpu).sms
    assert 1 <= splits <= min(sizes["r"], 8 * sms), splits
    prog = lower(d, gpu=gpu)
    (main,) = prog.launches  # the partials are added up in the same kernel: no second launch
    assert main.grid[0] == splits and "rowwise_chain" in main.name
    ws, cnt = prog.buffers
    assert ws.dtype == "fp32" and ws.shape == (len(COLS[name]), splits, sizes["x"]) and not ws.zeroed
    # the counters: a persistent workspace zeroed once, which every launch leaves zero
    assert cnt.zeroed and cnt.shape == (len(COUNTERS),) and cnt.name != ws.name
    # the fused kernel beats the row kernel and the column reductions apart, in the model
    pl = _Planner(d, resolve_gpu(gpu), "sm_90a" if gpu == "h100" else "sm_80", "bf16", families.available(), None,
                  None)
    order = plan_units(d)
    rows = pl.evaluate(tuple(b for b in order if b not in COLS[name]))
    apart = rows.seconds + sum(pl.evaluate((c,)).seconds for c in COLS[name])
    assert rows.best is not None and pk.seconds < apart, (pk.seconds, apart)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_the_model_prices_the_minimal_bytes_and_the_partials(name):
    r, x = 16384, 4096
    d = norm_grad(name, r=r, x=x)
    der = derive(d, "h100", "bf16")
    (pk,) = der.plan.kernels
    sub = whole(d)
    sched = FAMILY.candidates(sub, "h100", "bf16")
    pick = next(s for s in sched if s.kernels[0].options == pk.kernel.options)
    c = model_cost(pick, resolve_gpu("h100"))
    vectors = len(COLS[name]) + 1                       # gamma read, dgamma (dbeta) written
    stats = len(SAVES[name])                            # the saved per-row statistics
    want = 2 * (3 * r * x + vectors * x + stats * r)
    assert c.levels["HBM"].H_bytes == pytest.approx(want, rel=1e-6)
    est = FAMILY.launch_estimate(sub, pick, "h100")
    splits = pk.kernel.options.splits
    assert est["blocks"] == splits and est["row_iterations"] == -(-r // splits) and est["stream_steps"] == 0
    assert not est.get("extra_launches") and est["extra_hbm_bytes"] == 2 * 4 * len(COLS[name]) * splits * x
    # the prediction: the minimal bytes at the HBM rate, plus the partials, within the family's overheads
    t = predict_schedule(sub, FAMILY, pick, "h100").seconds
    hbm = resolve_gpu("h100").level("HBM").bandwidth
    assert (want + est["extra_hbm_bytes"]) / hbm < t < 1.5 * (want + est["extra_hbm_bytes"]) / hbm


def test_the_blocks_are_one_full_wave_and_price_their_partials():
    from napkin.perfmodel.occupancy import occupancy

    gpu = resolve_gpu("h100")
    sub = whole(norm_grad("layernorm", r=16384, x=4096))
    cands = FAMILY.candidates(sub, gpu, "bf16")
    assert len(cands) >= 2
    for s in cands:
        est = FAMILY.launch_estimate(sub, s, gpu)
        per_sm = occupancy(gpu, est["threads"], est["regs"], est["smem"]).blocks_per_sm
        assert s.kernels[0].options.splits == est["blocks"] == gpu.sms * per_sm
        # twice the blocks: twice the partials, and a slower prediction
        k = s.kernels[0]
        more = s.replace(kernels=(k.replace(options=dataclasses.replace(k.options, splits=2 * est["blocks"])),))
        est2 = FAMILY.launch_estimate(sub, more, gpu)
        assert est2["extra_hbm_bytes"] == 2 * est["extra_hbm_bytes"] == 2 * 2 * 4 * 2 * est["blocks"] * 4096
        assert predict_schedule(sub, FAMILY, more, gpu).seconds > predict_schedule(sub, FAMILY, s, gpu).seconds


def test_every_configuration_lowers_back_to_itself():
    sub = whole(norm_grad("layernorm", r=300, x=1000))
    cands = FAMILY.candidates(sub, "h100", "bf16")
    assert {s.kernels[0].options.threads_per_row <= 32 for s in cands} == {True, False}  # warp and block mode
    for s in cands:
        o = s.kernels[0].options
        p = FAMILY.lower(sub, s, "sm_90a")
        t = dict(p.launches[0].tunables)
        assert (t["THREADS_PER_ROW"], t["SPLITS"]) == (o.threads_per_row, o.splits)
        assert p.launches[0].grid[0] == o.splits and p.buffers[0].shape == (2, o.splits, 1000)
        assert len(p.launches) == 1 and [b.zeroed for b in p.buffers] == [False, True]
        # a tile of the in-kernel sum is the block's threads over COMBINE_SLICES slices
        assert f"constexpr int CSLICES = {COMBINE_SLICES};" in p.launches[0].source
        assert p.launches[0].block[0] % COMBINE_SLICES == 0
        assert p.launches[0].block[0] == 32 * o.warps


def test_column_reductions_need_the_row_in_registers():
    # a row of 70001 values only runs streamed: no place for the partials, so the family refuses it
    why = FAMILY.explain(whole(norm_grad("rmsnorm", r=4, x=70001)))
    assert why is not None and "column reduction" in why, why


def test_the_generated_source_says_how_it_runs():
    p = lower(norm_grad("layernorm", r=4096, x=4096), gpu="h100")
    (main,) = p.launches
    comb = main
    splits = dict(main.tunables)["SPLITS"]
    iters = -(-4096 // (splits * dict(main.tunables)["ROWS_PER_BLOCK"]))
    assert f"constexpr int SPLITS = {splits};" in main.source and f"constexpr int ITERS = {iters};" in main.source
    acc = "colpart[{}][slot][((c0 + u) * VEC + e) * THREADS_PER_ROW + lane]"
    assert f"{acc.format(0)} = ({acc.format(0)} + a_" in main.source        # dgamma += dY·N
    assert f"{acc.format(1)} = ({acc.format(1)} + a_dY)" in main.source     # dbeta += dY
    # the row group PREFETCH groups ahead (X, dY and the saved statistics) is loaded while this one
    # is worked on, into slot d of the registers in flight
    depth = dict(main.tunables)["PREFETCH"]
    assert f"constexpr int PREFETCH = {depth};" in main.source
    assert "napkin::load_vec(pf_X[d][u], in_X + next_row * 4096LL, col0, next_limit" in main.source
    assert "kv_X[u] = pf_X[d][u];" in main.source and "pf_N_rstd[d] = next_limit ?" in main.source
    assert "next_row = row + (long long)PREFETCH * SPLITS * ROWS_PER_BLOCK" in main.source
    # gamma holds the row's axis only: each thread loads its columns once, before the row loop
    loop = main.source.index("for (int it0 = 0; it0 < ITERS; it0 += PREFETCH)")
    assert 0 < main.source.index("napkin::load_vec(hv_gamma[u], in_gamma,") < loop
    assert "a_gamma = napkin::to_float(hv_gamma[u].x[e]);" in main.source and "ld_gamma" not in main.source
    assert "out_dgamma[col]" in comb.source and "out_dbeta[col]" in comb.source
    # the sum of the partial rows keeps CDEPTH partials in flight per thread, added in the order of b,
    # read from L2 (other blocks of this launch wrote them)
    assert "v[j] = b < SPLITS ? __ldcg(p + (long long)b * XSIZE) : 0.f;" in comb.source
    assert "a = (a + v[j]);" in comb.source and "t = (t + cmb[s][cx]);" in comb.source
    # the arrival protocol: a block only waits when every block has started; the last to arrive
    # zeroes the counters once the other helpers are done
    src = main.source
    wait = src.index("while (*(volatile unsigned int*)arrived < SPLITS)")
    assert src.index("atomicAdd(started, 1u);") < src.index("for (int it0 = 0;") < wait
    assert src.index("int r = *(volatile unsigned int*)started == SPLITS;") < src.index("if (r) atomicAdd(helpers, 1u);") \
        < src.index("if (atomicAdd(arrived, 1u) == SPLITS - 1)") < wait
    reset = src.index("*started = 0u;")
    assert src.index("while (*(volatile unsigned int*)done < others)") < reset
    assert all(f"*{c} = 0u;" in src[reset:] for c in COUNTERS)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_prefetch_depth_is_a_typed_option_that_lowers_back(depth):
    from napkin.codegen.families.rowwise import chain_config_from_schedule, chain_schedule_for, make_chain_config

    sub = whole(norm_grad("rmsnorm", r=777, x=1000))
    s = analyse(sub)
    cfg = make_chain_config(s, 128, 1, splits=100, prefetch=depth)
    sched = chain_schedule_for(s, cfg, "h100")
    assert sched.kernels[0].options.stages == depth and sched.kernels[0].options.splits == 100
    assert chain_config_from_schedule(s, sched) == cfg
    main = FAMILY.lower(sub, sched, "sm_90a").launches[0]
    assert dict(main.tunables)["PREFETCH"] == depth and f"constexpr int PREFETCH = {depth};" in main.source
    # 8 row groups of 100 blocks: a depth that does not divide them stops the unrolled loop early
    assert "constexpr int ITERS = 8;" in main.source
    assert "if (ITERS % PREFETCH != 0 && it >= ITERS) break;" in main.source
    # the registers and the bytes in flight grow with the depth
    est = FAMILY.launch_estimate(sub, sched, "h100")
    base = FAMILY.launch_estimate(sub, chain_schedule_for(s, make_chain_config(s, 128, 1, splits=100, prefetch=1),
                                                          "h100"), "h100")
    assert est["in_flight_bytes_per_thread"] == depth * base["in_flight_bytes_per_thread"]
    assert (est["regs"] > base["regs"]) == (depth > 1)


@pytest.mark.parametrize("kwargs, words", [
    (dict(splits=10, prefetch=0), "1..3 row groups ahead"),
    (dict(splits=10, prefetch=4), "1..3 row groups ahead"),
])
def test_a_prefetch_depth_out_of_range_is_refused(kwargs, words):
    from napkin.codegen.families.rowwise import make_chain_config
    from napkin.errors import CodegenError

    s = analyse(whole(norm_grad("rmsnorm", r=300, x=1000)))
    with pytest.raises(CodegenError, match=words):
        make_chain_config(s, 128, 1, **kwargs)


def test_prefetch_needs_column_reductions():
    from napkin.codegen.families.rowwise import make_chain_config
    from napkin.errors import CodegenError

    s = analyse(prepare(library.get("log_softmax"), sizes=dict(r=8, x=1000), dtype="bf16"))
    assert isinstance(s, ChainShape) and not s.cols
    with pytest.raises(CodegenError, match="only with column reductions"):
        make_chain_config(s, 128, 1, prefetch=2)


def test_the_candidates_offer_one_and_two_row_groups_in_flight():
    sub = whole(norm_grad("layernorm", r=16384, x=4096))
    depths = {s.kernels[0].options.stages for s in FAMILY.candidates(sub, "h100", "bf16")}
    assert depths == {1, 2}


# ----------------------------------------------------------------------------- nvcc

def _launches() -> list:
    out = []
    cases = [(whole(norm_grad("rmsnorm", dt, **sz)), f"rms_{dt}_{sz['x']}") for dt in ("bf16", "fp32")
             for sz in (dict(r=16384, x=4096), dict(r=300, x=1000), dict(r=37, x=4095))]
    cases += [(whole(norm_grad("layernorm", dt, **sz)), f"ln_{dt}_{sz['x']}") for dt in ("bf16", "fp16")
              for sz in (dict(r=4096, x=4096), dict(r=100, x=1000))]
    cases += [(prepare(batch_rows(), sizes=dict(b=3, s=5, x=999), dtype="bf16"), "batch")]
    for sub, tag in cases:
        cands = FAMILY.candidates(sub, "h100", sub.nodes[0].dtype)
        for i in sorted({0, len(cands) // 2, len(cands) - 1}):
            p = FAMILY.lower(sub, cands[i], "sm_90a")
            for k in p.launches:
                new = f"{k.name}_{tag}_{i}"
                out.append(dataclasses.replace(k, name=new, source=re.sub(rf"\b{k.name}\b", new, k.source)))
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_build_within_the_model(arch):
    from napkin.kernels import nvcc_compile

    launches = _launches()
    modes = {("warp" if dict(k.tunables).get("THREADS_PER_ROW", 64) <= 32 else "block")
             for k in launches if "chain" in k.name}
    assert modes == {"warp", "block"}
    usage = nvcc_compile("\n".join(k.source for k in launches), arch)
    problems = []
    for k in launches:
        r = usage[k.name]
        where = f"{k.name} ({arch}, {dict(k.tunables)})"
        if r.spills:
            problems.append(f"{where}: spills")
        if r.registers > k.model_regs_per_thread or k.model_regs_per_thread - r.registers > max(32, 0.6 * k.model_regs_per_thread):
            problems.append(f"{where}: {r.registers} registers, the model assumed {k.model_regs_per_thread}")
        if abs(r.shared_bytes + k.shared_bytes - (k.model_smem_bytes or 0)) > SMEM_TOLERANCE:
            problems.append(f"{where}: {r.shared_bytes} B shared memory, the model assumed {k.model_smem_bytes}")
    assert not problems, "\n".join(problems)


def test_a_box_of_inputs_only_joins_the_boxes_reading_its_inputs():
    from napkin.codegen.partition import is_connected

    d = norm_grad("layernorm", r=8, x=64)
    rows = [b for b in plan_units(d) if b not in ("dgamma", "dbeta")]
    # dbeta = Σ_r dY reads only an input; the row kernel reads dY too, so fused they read it once
    assert is_connected(d, (*rows, "dbeta"))
    r, x = Axis("r"), Axis("x")
    A, B = array("A", r, x), array("B", r, x)
    apart = Diagram("apart", (sum_over(A, "r", name="sa"), (B * B).named("bb")))
    assert not is_connected(apart, ("sa", "bb"))  # no array in common: still two pieces
