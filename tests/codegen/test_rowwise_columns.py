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
from napkin.codegen.families.rowwise import COMBINE_COLS, COMBINE_DEPTH, COUNTERS, FAMILY, MAX_COMBINE_ROUNDS, \
    MIN_COMBINE_COLS, SPILL_FREE_SQUEEZE, THREADS_PER_ROW, ChainShape, analyse, chain_configs, chain_regs_need, \
    chain_schedule_for, column_chunks, combine_rounds, combine_slices, make_chain_config, partial_bytes, wave_splits
from napkin.codegen.lower import SMEM_TOLERANCE, lower
from napkin.codegen.partition import kernel_problem, plan_units
from napkin.codegen.planner import _Planner, derive
from napkin.codegen.prepare import prepare
from napkin.codegen.select import model_cost, predict_schedule, resolve_gpu
from napkin.errors import CodegenError
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
    # the column max starts at -inf and merges by max_nan (a NaN stays): per element, over the block's rows, in the combine
    (launch,) = p.launches
    src = launch.source
    # (in registers over the block's rows where the budget holds them: colpart_in_registers)
    regs = dict(launch.tunables)["COLPART_REGS"]
    init, acc = (("rc_1[c][e]", "rc_1[c0 + u][e]") if regs else
                 ("colpart[1][slot][col_word(c, e)]", "colpart[1][slot][col_word(c0 + u, e)]"))
    assert f"{init} = (-INFINITY)" in src and f"{acc} = napkin::max_nan(" in src
    assert ("colpart[1][slot][col_word(c, e)] = rc_1[c][e];" in src) == bool(regs)
    assert "a = napkin::max_nan(a, colpart[1][s][w])" in src
    assert "a = napkin::max_nan(a, v[j]);" in src and "t = napkin::max_nan(t, cmb[s][cx]);" in src
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
                                         ("rmsnorm", dict(r=777, x=1000)), ("layernorm", dict(r=37, x=4095)),
                                         ("rmsnorm", dict(r=3000, x=5000)), ("layernorm", dict(r=4096, x=5000))])
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


@pytest.mark.parametrize("name, sizes, gpu", [("rmsnorm", dict(r=8192, x=16384), "h100"),
                                              ("rmsnorm", dict(r=8192, x=16384), "a100"),
                                              ("layernorm", dict(r=4096, x=12288), "h100")])
def test_rows_too_long_for_registers_fuse_their_column_reductions_streamed(name, sizes, gpu):
    # (the A100's model keeps the layernorm backward's two reductions over such rows apart: its
    # 164 KiB of shared memory hold one block of their partials an SM)
    test_the_planner_fuses_the_column_reductions_into_the_row_kernel(name, sizes, gpu)
    assert derive(norm_grad(name, **sizes), gpu, "bf16").plan.kernels[0].kernel.options.streamed


def test_a_grad_whose_boxes_leave_an_input_unread_is_still_priced():
    """The layernorm backward keeps the forward's beta as an input that no box reads. Ranked whole
    (``compile(family="rowwise")``, ``benchmarks/candidates.py``), every candidate must be priced:
    a placement naming beta was refused by the model, every candidate priced infinite, and the
    family's first candidate taken whatever its cost."""
    from napkin.codegen.select import rank

    d = norm_grad("layernorm", r=4096, x=4096)
    assert "beta" in d.input_names
    ranked = rank(d, FAMILY, "h200", "bf16")
    times = [r.seconds for r in ranked]
    assert len(times) > 1 and all(0 < t < 1 for t in times), times
    assert times == sorted(times) and times[0] < times[-1], times


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
        slots = gpu.sms * per_sm
        assert s.kernels[0].options.splits == est["blocks"] == wave_splits(16384, slots)
        # no more blocks than the GPU holds at once, each running as few row groups as `slots`
        # blocks would (the fewest such blocks: one fewer would need another round)
        assert est["blocks"] <= slots and -(-16384 // est["blocks"]) == -(-16384 // slots)
        assert -(-16384 // (est["blocks"] - 1)) > -(-16384 // slots)
        # twice the blocks: twice the partials, and a slower prediction
        k = s.kernels[0]
        more = s.replace(kernels=(k.replace(options=dataclasses.replace(k.options, splits=2 * est["blocks"])),))
        est2 = FAMILY.launch_estimate(sub, more, gpu)
        assert est2["extra_hbm_bytes"] == 2 * est["extra_hbm_bytes"] == 2 * 2 * 4 * 2 * est["blocks"] * 4096
        assert predict_schedule(sub, FAMILY, more, gpu).seconds > predict_schedule(sub, FAMILY, s, gpu).seconds


def test_every_configuration_lowers_back_to_itself():
    sub = whole(norm_grad("layernorm", r=300, x=256))
    cands = FAMILY.candidates(sub, "h100", "bf16")
    assert {s.kernels[0].options.threads_per_row <= 32 for s in cands} == {True, False}  # warp and block mode
    for s in cands:
        o = s.kernels[0].options
        p = FAMILY.lower(sub, s, "sm_90a")
        t = dict(p.launches[0].tunables)
        assert (t["THREADS_PER_ROW"], t["SPLITS"]) == (o.threads_per_row, o.splits)
        assert p.launches[0].grid[0] == o.splits and p.buffers[0].shape == (2, o.splits, 256)
        assert len(p.launches) == 1 and [b.zeroed for b in p.buffers] == [False, True]
        # a tile of the in-kernel sum is MIN_COMBINE_COLS..COMBINE_COLS columns, the block's threads
        # in slices of them: the fewest slices that add the partials in MAX_COMBINE_ROUNDS rounds
        # of loads in flight, else the narrowest tile
        threads = p.launches[0].block[0]
        slices = dict(p.launches[0].tunables)["COMBINE_SLICES"]
        depth = dict(p.launches[0].tunables)["COMBINE_DEPTH"]
        assert f"constexpr int CSLICES = {slices};" in p.launches[0].source
        assert threads % slices == 0 and MIN_COMBINE_COLS <= threads // slices <= COMBINE_COLS
        assert depth == min(COMBINE_DEPTH, -(-o.splits // slices))
        rounds = -(-o.splits // (slices * depth))
        fewer = [f for f in range(1, slices) if threads % f == 0 and threads // f <= COMBINE_COLS]
        if rounds <= MAX_COMBINE_ROUNDS:  # and no fewer slices would do
            assert all(-(-o.splits // (f * COMBINE_DEPTH)) > MAX_COMBINE_ROUNDS for f in fewer)
        else:
            assert threads // slices == MIN_COMBINE_COLS
        assert p.launches[0].block[0] == 32 * o.warps


def test_the_combine_takes_narrower_tiles_only_for_many_rounds():
    # 64-thread blocks over 1024 splits: 16-column tiles (4 slices) would add 256 partials a thread
    # in 16 rounds of 16; 8-column tiles (8 slices) take 8. 128 threads over 512 splits keep 16
    # columns (4 rounds), 256 threads over 264 keep them (2 rounds).
    sub = whole(norm_grad("rmsnorm", r=8192, x=1024))
    shape = analyse(sub)
    for tpr, splits, slices, rounds in ((64, 1024, 8, 8), (64, 48, 4, 1), (128, 512, 8, 4), (256, 264, 16, 2)):
        cfg = make_chain_config(shape, tpr, 1, splits=splits)
        assert (combine_slices(cfg), combine_rounds(cfg)) == (slices, rounds), (tpr, splits)
        sched = chain_schedule_for(shape, cfg, "h200")
        src = FAMILY.lower(sub, sched, "sm_90a").launches[0].source
        assert f"constexpr int CSLICES = {slices};" in src
        assert f"__shared__ float cmb[CSLICES][CCOLS + 1];" in src and f"tile of {tpr // slices} columns" in src


def test_column_reductions_need_their_partials_on_chip():
    # a row of 70001 values only runs streamed, and its partials (273 KiB) pass what a block may hold
    why = FAMILY.explain(whole(norm_grad("rmsnorm", r=4, x=70001)))
    assert why is not None and "column reduction" in why and "273 KiB" in why, why
    assert FAMILY.explain(whole(norm_grad("rmsnorm", r=4, x=32768))) is None  # 128 KiB: streamed


@pytest.mark.parametrize("name, x", [("rmsnorm", 16384), ("layernorm", 10240), ("rmsnorm", 10000), ("rmsnorm", 24576)])
def test_rows_too_long_for_registers_stream_and_lower_back_to_themselves(name, x):
    sub = whole(norm_grad(name, r=8192, x=x))
    s = analyse(sub)
    assert not [c for c in chain_configs(s, 132) if not c.stream]  # no register configuration holds it
    cands = FAMILY.candidates(sub, "h200", "bf16")
    assert cands and all(c.kernels[0].options.streamed for c in cands)
    for c in cands:
        cfg = FAMILY.config(sub, c)
        assert cfg.stream and cfg.rows_per_block == 1 and cfg.chunks_per_thread % cfg.unroll == 0
        assert FAMILY.config(sub, chain_schedule_for(s, cfg, "h200")) == cfg
        launch = FAMILY.lower(sub, c, "sm_90a").launches[0]
        t = dict(launch.tunables)
        assert (t["STREAM"], t["UNROLL"], t["SPLITS"]) == (1, cfg.unroll, cfg.splits)
        assert "#pragma unroll 1" in launch.source and f"constexpr int COL_CHUNKS = {column_chunks(s, cfg)};" in launch.source
        # the later pass re-reads the row from L2: priced at the L2 rate, not as HBM bytes
        est = FAMILY.launch_estimate(sub, c, "h200")
        assert est["extra_l2_bytes"] == 8192 * x * 2 * sum(len(s.uses(v)) - 1 for v in s.fresh) > 0
        assert est["extra_hbm_bytes"] == 2 * partial_bytes(s, cfg)
        # a round trip a step of chunks: to HBM in the first pass, to L2 in the second
        steps = -(-column_chunks(s, cfg) // cfg.unroll)
        assert (est["row_round_trips"], est["row_l2_rounds"]) == (steps, steps)


def test_the_model_weighs_a_streamed_row_by_its_steps():
    # one block an SM meets every step's round trip: four chunks a step beat two (fewer steps),
    # and a second block an SM (the budget cut) hides them
    sub = whole(norm_grad("rmsnorm", r=4096, x=16384))
    s = analyse(sub)
    by = {}
    for c in FAMILY.candidates(sub, "h200", "bf16"):
        cfg = FAMILY.config(sub, c)
        by[(cfg.threads_per_row, cfg.unroll, cfg.blocks_per_sm)] = predict_schedule(sub, FAMILY, c, "h200").seconds
    assert by[(512, 4, None)] < by[(512, 2, None)] and by[(512, 2, 2)] < by[(512, 2, None)], by


def test_rows_of_no_whole_vectors_keep_their_column_reductions_apart():
    # a streamed grid is not rotated: 7 rows in 8 would load value by value (slower than apart)
    d = norm_grad("rmsnorm", r=8192, x=10001)
    assert not FAMILY.candidates(whole(d), "h200", "bf16")
    why = FAMILY.explain(whole(d))
    assert "16-byte vectors" in why and "run apart" in why, why
    assert len(derive(d, "h200", "bf16").plan.kernels) == 2


def test_a_streamed_row_with_column_reductions_is_checked():
    s = analyse(whole(norm_grad("rmsnorm", r=64, x=16384)))
    for kwargs, words in [(dict(threads_per_row=128, rows_per_block=1, stream_unroll=2), "256"),
                          (dict(threads_per_row=256, rows_per_block=2, stream_unroll=2), "one row"),
                          (dict(threads_per_row=256, rows_per_block=1, stream_unroll=2, prefetch=2), "ahead")]:
        with pytest.raises(CodegenError, match=words):
            make_chain_config(s, splits=64, **kwargs)


def test_the_generated_source_says_how_it_runs():
    p = lower(norm_grad("layernorm", r=4096, x=4096), gpu="h100")
    (main,) = p.launches
    comb = main
    splits = dict(main.tunables)["SPLITS"]
    iters = -(-4096 // (splits * dict(main.tunables)["ROWS_PER_BLOCK"]))
    assert f"constexpr int SPLITS = {splits};" in main.source and f"constexpr int ITERS = {iters};" in main.source
    # the partials of the thread's columns: in registers over the block's rows (the budget holds
    # them: colpart_in_registers), to the slot's shared-memory words once after the loop
    assert dict(main.tunables)["COLPART_REGS"] == 1
    acc = "rc_{}[c0 + u][e]"
    assert f"{acc.format(0)} = ({acc.format(0)} + a_" in main.source        # dgamma += dY·N
    assert f"{acc.format(1)} = ({acc.format(1)} + a_dY)" in main.source     # dbeta += dY
    assert "colpart[0][slot][col_word(c0 + u, e)]" not in main.source
    flush = main.source.index("colpart[1][slot][col_word(c, e)] = rc_1[c][e];")
    assert main.source.index("for (int it0 = 0; it0 < ITERS; it0 += PREFETCH)") < flush \
        < main.source.index("// ---- column partials: row blockIdx.x")
    # the row group PREFETCH groups ahead (X, dY and the saved statistics) is loaded while this one
    # is worked on, into slot d of the registers in flight
    depth = dict(main.tunables)["PREFETCH"]
    assert f"constexpr int PREFETCH = {depth};" in main.source
    assert re.search(r"napkin::load_vec(_al<AL, EVEN>)?\(pf_X\[d\]\[u\], in_X \+ next_row \* 4096LL, col0, "
                     r"next_limit", main.source)
    assert "kv_X[u] = pf_X[d][u];" in main.source and "pf_N_rstd[d] = next_limit ?" in main.source
    assert "next_row = row + (long long)PREFETCH * SPLITS * ROWS_PER_BLOCK" in main.source
    # gamma holds the row's axis only: each thread loads its columns once, before the row loop
    loop = main.source.index("for (int it0 = 0; it0 < ITERS; it0 += PREFETCH)")
    assert 0 < re.search(r"napkin::load_vec(_al<AL, EVEN>)?\(hv_gamma\[u\], in_gamma,", main.source).start() < loop
    assert "a_gamma = napkin::to_float(hv_gamma[u].x[e]);" in main.source and "ld_gamma" not in main.source
    assert "out_dgamma[col]" in comb.source and "out_dbeta[col]" in comb.source
    # the sum of the partial rows keeps CDEPTH partials in flight per thread, added in the order of b,
    # read from L2 (other blocks of this launch wrote them)
    assert "v[j] = b < SPLITS ? __ldcg(p + (long long)b * XSIZE) : 0.f;" in comb.source
    assert "a = (a + v[j]);" in comb.source and "t = (t + cmb[s][cx]);" in comb.source
    # the arrival protocol: a block only waits when every block has started, arriving and
    # registering as a helper in one atomic; it waits for the last block's seal, reads the helpers,
    # counts itself done with the counters, then adds every H-th tile; the last to arrive zeroes the
    # counters once the other helpers are done with them
    src = main.source
    wait = src.index("while ((unsigned int)(v = *(volatile unsigned long long*)arrival) < SPLITS + 1)")
    assert src.index("atomicAdd(started, 1u);") < src.index("for (int it0 = 0;") < wait
    assert src.index("int r = *(volatile unsigned int*)started == SPLITS;") \
        < src.index("atomicAdd(arrival, 1ull + (r ? HELPER : 0ull));") \
        < src.index("if ((unsigned int)seen == SPLITS - 1)") \
        < src.index("atomicAdd(arrival, 1ull + (r ? 0ull : HELPER));") < wait \
        < src.index("n = (unsigned int)(v >> 32);") < src.index("atomicAdd(done, 1u);") \
        < src.index("for (unsigned int tk = share[0]; tk < NTICKETS; tk += share[1])")
    assert "ticket" not in src.split("// ---- the SPLITS partial rows")[1].split("for (unsigned int tk")[0].replace("NTICKETS", "")
    reset = src.index("*arrival = 0ull;")
    assert src.index("while (*(volatile unsigned int*)done < others)") < reset
    assert COUNTERS == ("arrived", "helpers", "started", "done")
    assert "*started = 0u;" in src[reset:] and "*done = 0u;" in src[reset:]


def test_a_pass_reduces_its_row_sums_in_one_round_over_the_block():
    """One row a block: the reductions of one pass (the layernorm backward's Σ dN·N and Σ dN) are
    each warp's sums, ONE barrier, the warps' sums (napkin::block_reduce's operations, so its bits),
    the rounds alternating between two halves of the scratch so that none needs a barrier after
    its reads; the model's shared memory counts both halves."""
    from napkin.codegen.families.rowwise import block_reductions, chain_smem_bytes

    sub = whole(norm_grad("layernorm", r=4096, x=4096))
    s = analyse(sub)
    assert block_reductions(s) == 2
    cand = FAMILY.candidates(sub, "h100", "bf16")[0]
    cfg = FAMILY.config(sub, cand)
    assert cfg.block_mode
    k = FAMILY.lower(sub, cand, "sm_90a").launches[0]
    src = k.source
    assert "__shared__ float scratch[2][2][32];" in src and "block_reduce<" not in src
    first = src[src.index("// ---- pass 0"):src.index("// ---- pass 1")]
    assert first.count("__syncthreads()") == 1 and first.count("napkin::warp_reduce<napkin::SumOp>") == 4
    assert "scratch[sbuf][1][threadIdx.x / 32] = acc_" in first and first.count("sbuf ^= 1;") == 1
    assert k.model_smem_bytes == chain_smem_bytes(s, cfg)


def test_a_per_row_factor_after_a_reduction_leaves_the_sum(monkeypatch):
    """The rmsnorm backward that recomputes rstd sums dN·N = dN·X·rstd over the row after rstd's
    own sum: taken out (rstd·Σ dN·X) the sum runs in the first pass beside Σ X², in the same round
    (2 passes, not 3); the rewritten diagram computes the same gradients (float64 reference); a
    backward whose per-row factors are inputs (the saved statistics) is left as it is."""
    import torch

    import napkin.codegen.families.rowwise as rw
    from napkin.codegen.families.rowwise import _dots_as_reductions, _hoist_row_factors, block_reductions
    from napkin.diagrams.reference import random_inputs, run_reference

    d = prepare(library.get("rmsnorm").grad(save=set()), sizes=dict(r=8, x=96), dtype="bf16")
    s = analyse(whole(d))
    assert s.passes == 2 and block_reductions(s) == 2
    assert len([c for c in s.chains if s.stage[id(c.source)] == 0]) == 2  # Σ X² and Σ dN·X
    flat = _dots_as_reductions(d)
    hoisted = _hoist_row_factors(flat)
    assert hoisted is not flat and hoisted.output_names == flat.output_names
    xs = random_inputs(flat, seed=3, dtype=torch.float64)
    want, got = run_reference(flat, xs, dtype=torch.float64), run_reference(hoisted, xs, dtype=torch.float64)
    for n in flat.output_names:
        assert torch.allclose(got[n], want[n], rtol=1e-12, atol=1e-12), n
    saved = _dots_as_reductions(norm_grad("rmsnorm", r=8, x=96))
    assert _hoist_row_factors(saved) is saved
    ln = _dots_as_reductions(norm_grad("layernorm", r=8, x=96))
    assert _hoist_row_factors(ln) is ln
    monkeypatch.setattr(rw, "HOIST_ROW_FACTORS", False)
    assert _hoist_row_factors(flat) is flat


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


def test_a_cut_register_budget_only_where_no_configuration_runs_two_blocks_an_sm():
    """A schedule may cut the register budget so that one more block shares an SM (blocks_per_sm):
    a 512-thread row of 4096 bf16 values (footprint 79/86 registers, 1 block of 16 warps an SM) on
    64 registers, 2 blocks an SM. It lowers back, the kernel asks ptxas for 64 and the model prices
    two blocks an SM. The family proposes a cut only where every configuration holds one block an
    SM on its own budget (rows of 5000: the 320-thread rmsnorm and layernorm backwards on 96
    registers, 2 blocks an SM, the planner's picks; the layernorm's is 30 under its footprint and
    spills 24 bytes on sm_90a, and measured 63.9 us on an H100 against 73.1 on its own budget), not
    at rows of 4096 (256 threads run 2 blocks an SM; the cut measured the same on an H100); a cut
    further under the footprint than MAX_SQUEEZE (it would spill more) is refused, naming it."""
    from napkin.codegen.families.rowwise import (MAX_SQUEEZE, chain_config_from_schedule, chain_regs_need,
                                                 chain_schedule_for, make_chain_config)
    from napkin.errors import CodegenError

    for name in ("rmsnorm", "layernorm"):
        sub = whole(norm_grad(name, r=16384, x=4096))
        s = analyse(sub)
        assert not any(c.kernels[0].options.blocks_per_sm for c in FAMILY.candidates(sub, "h100", "bf16"))
        cfg = make_chain_config(s, 512, 1, splits=264, prefetch=1, blocks_per_sm=2)
        sched = chain_schedule_for(s, cfg, "h100")
        o = sched.kernels[0].options
        assert (o.blocks_per_sm, o.regs_per_thread) == (2, 64)
        assert chain_config_from_schedule(s, sched) == cfg and chain_regs_need(s, cfg) - 64 <= MAX_SQUEEZE
        k = FAMILY.lower(sub, sched, "sm_90a").launches[0]
        assert "NAPKIN_MAXNREG(64)" in k.source and k.model_regs_per_thread == 64
        assert "2 per SM" in predict_schedule(sub, FAMILY, sched, "h100").detail
    for save in ({"N_rstd"}, set()):
        d = prepare(library.get("rmsnorm").grad(save=save), sizes=dict(r=4096, x=5000), dtype="bf16")
        cut = [FAMILY.config(whole(d), c) for c in FAMILY.candidates(whole(d), "h100", "bf16")
               if c.kernels[0].options.blocks_per_sm]
        assert [(c.threads_per_row, c.blocks_per_sm, c.splits) for c in cut] == [(320, 2, 256)]
        (pk,) = derive(d, "h100", "bf16").plan.kernels
        o = pk.kernel.options
        assert (o.threads_per_row, o.blocks_per_sm, o.regs_per_thread, o.splits) == (320, 2, 96, 256)
    for r, splits in ((4096, 256), (16384, 261)):
        d = norm_grad("layernorm", r=r, x=5000)
        cut = [FAMILY.config(whole(d), c) for c in FAMILY.candidates(whole(d), "h100", "bf16")
               if c.kernels[0].options.blocks_per_sm]
        assert [(c.threads_per_row, c.blocks_per_sm, c.splits) for c in cut] == [(320, 2, splits)]
        assert chain_regs_need(analyse(whole(d)), cut[0]) - 96 == MAX_SQUEEZE  # the deepest cut proposed
        (pk,) = derive(d, "h100", "bf16").plan.kernels
        o = pk.kernel.options
        assert (o.threads_per_row, o.blocks_per_sm, o.regs_per_thread, o.splits) == (320, 2, 96, splits)
    s = analyse(whole(norm_grad("rmsnorm", r=16384, x=4096)))
    with pytest.raises(CodegenError, match="would spill"):
        make_chain_config(s, 128, 1, splits=100, blocks_per_sm=4)
    with pytest.raises(CodegenError, match="only with column reductions"):
        make_chain_config(analyse(prepare(library.get("log_softmax"), sizes=dict(r=8, x=1000), dtype="bf16")),
                          128, 1, blocks_per_sm=2)


def test_more_than_16_values_a_thread_only_where_fewer_run_fewer_blocks(monkeypatch):
    """With column reductions a configuration of more than COL_VALUES values a thread is proposed
    only where none of at most COL_VALUES runs as many blocks: the backwards with their statistics
    saved take 256 threads at rows of 4096 (128 threads, 32 values, measured slower at the same
    264 blocks); so does the rmsnorm backward that recomputes its statistic (two passes, rstd taken
    out of Σ dN·N). Written in three passes (HOIST_ROW_FACTORS off) its 256-thread row needs fewer
    registers but 128 threads run 3 blocks an SM, which no 16-value configuration reaches: kept."""
    import napkin.codegen.families.rowwise as rw
    from napkin.codegen.families.rowwise import COL_VALUES

    for name in ("rmsnorm", "layernorm"):
        sub = whole(norm_grad(name, r=4096, x=4096))
        cands = FAMILY.candidates(sub, "h100", "bf16")
        assert {c.kernels[0].options.threads_per_row for c in cands} == {256, 512}, name
        assert all(FAMILY.config(sub, c).values_per_thread <= COL_VALUES for c in cands)
        (pk,) = derive(norm_grad(name, r=4096, x=4096), "h100", "bf16").plan.kernels
        assert (pk.kernel.options.threads_per_row, pk.kernel.options.splits) == (256, 256)
    d = prepare(library.get("rmsnorm").grad(save=set()), sizes=dict(r=4096, x=4096), dtype="bf16")
    (pk,) = derive(d, "h100", "bf16").plan.kernels
    assert (pk.kernel.options.threads_per_row, pk.kernel.options.splits) == (256, 256)
    monkeypatch.setattr(rw, "HOIST_ROW_FACTORS", False)
    d = prepare(library.get("rmsnorm").grad(save=set()), sizes=dict(r=4096, x=4096), dtype="bf16")
    sub = whole(d)
    assert analyse(sub).passes == 3
    many = [FAMILY.config(sub, c) for c in FAMILY.candidates(sub, "h100", "bf16")
            if FAMILY.config(sub, c).values_per_thread > COL_VALUES]
    assert [(c.threads_per_row, c.splits) for c in many] == [(128, 373)]


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("x", [768, 1024])
def test_narrow_16_bit_rows_take_a_warp_a_row_over_a_wave(name, x):
    """Rows of 768-1024 16-bit values: a warp holds each row (24-32 values a thread, no barrier in
    a row's reductions), 4 rows a block over a wave of blocks, where 64 threads a row over 1024
    blocks combined 4x the partials in 8 rounds (H200, bf16, 8192 rows: rmsnorm 26.5 -> 19.4 us at
    768, 25.7 -> 22.7 at 1024). fp32 rows keep their block rows (no faster there), and so does a
    warp configuration of fewer blocks than the GPU has SMs."""
    from napkin.codegen.families.rowwise import COL_VALUES

    gpu = resolve_gpu("h200")
    sub = whole(norm_grad(name, r=8192, x=x))
    cands = [FAMILY.config(sub, c) for c in FAMILY.candidates(sub, gpu, "bf16")]
    warp = [c for c in cands if c.values_per_thread > COL_VALUES]
    assert warp and all(not c.block_mode and c.splits >= gpu.sms for c in warp)
    (pk,) = derive(norm_grad(name, r=8192, x=x), gpu, "bf16").plan.kernels
    o = pk.kernel.options
    assert (o.threads_per_row, o.warps, o.splits) == (32, 4, {768: 342, 1024: 256}[x])
    sub32 = whole(norm_grad(name, "fp32", r=8192, x=x))
    assert all(FAMILY.config(sub32, c).values_per_thread <= COL_VALUES or FAMILY.config(sub32, c).splits < gpu.sms
               or FAMILY.config(sub32, c).block_mode for c in FAMILY.candidates(sub32, gpu, "fp32"))
    few = whole(norm_grad(name, r=1024, x=256))  # 8 threads a row over 32 blocks: not proposed
    assert all(FAMILY.config(few, c).values_per_thread <= COL_VALUES or FAMILY.config(few, c).splits >= gpu.sms
               for c in FAMILY.candidates(few, gpu, "bf16"))


def test_the_combine_rounds_are_priced_after_the_loop():
    """The in-kernel combine's rounds of L2 loads come once after every block's loop
    (``tail_l2_rounds``: the arrival and :func:`combine_rounds`), each ``GPU.l2_round_clk``."""
    gpu = resolve_gpu("h200")
    sub = whole(norm_grad("rmsnorm", r=8192, x=1024))
    shape = analyse(sub)
    for tpr, rpb, splits in ((64, 1, 1024), (32, 4, 256)):
        cfg = make_chain_config(shape, tpr, rpb, splits=splits)
        sched = chain_schedule_for(shape, cfg, "h200")
        assert FAMILY.launch_estimate(sub, sched, gpu)["tail_l2_rounds"] == 1 + combine_rounds(cfg)
        k = predict_schedule(sub, FAMILY, sched, gpu).kernel
        assert k.tail_s == pytest.approx((1 + combine_rounds(cfg)) * gpu.l2_round_clk / gpu.clock_hz)
        base = max(k.roofline.seconds + k.epilogue_s, k.latency_floor_s + k.roofline.launch_overhead_s)
        assert k.seconds == pytest.approx(base + k.tail_s)


def test_blocks_fitted_to_a_row_of_no_power_of_two_chunks():
    """A row of 5000 bf16 values is 625 chunks: blocks of 320 and 640 threads hold it with 2 and 1
    chunks a thread (one row a block); not for fp32 rows (nvcc spilled them). The
    column partials take the row's own length in shared memory (the threads' last chunk packed), so
    the layernorm backward's two partial rows fit the block and it runs fused."""
    from napkin.codegen.families.rowwise import col_smem_bytes, fitted_threads

    s = analyse(whole(norm_grad("layernorm", r=4096, x=5000)))
    assert fitted_threads(s) == (320, 640)
    assert fitted_threads(analyse(whole(norm_grad("layernorm", "fp32", r=4096, x=5000)))) == ()
    assert fitted_threads(analyse(whole(norm_grad("layernorm", r=4096, x=4096)))) == ()
    cands = FAMILY.candidates(whole(norm_grad("layernorm", r=4096, x=5000)), "h100", "bf16")
    tprs = {c.kernels[0].options.threads_per_row for c in cands}
    assert {320, 640} <= tprs
    for c in cands:
        cfg = FAMILY.config(whole(norm_grad("layernorm", r=4096, x=5000)), c)
        assert col_smem_bytes(s, cfg) == 4 * 2 * 5000  # 625 chunks of 8, whatever the threads
        if cfg.threads_per_row in fitted_threads(s):  # one group ahead; a budget cut only for two blocks an SM
            assert cfg.prefetch == 1 and cfg.blocks_per_sm in (None, 2)
            assert cfg.chunks_per_thread == -(-625 // cfg.threads_per_row)
    src = FAMILY.lower(whole(norm_grad("layernorm", r=4096, x=5000)), cands[0], "sm_90a").launches[0].source
    assert "constexpr int LAST_LANES = CHUNKS - (COL_CHUNKS - 1) * THREADS_PER_ROW;" in src
    assert "if (c < COL_CHUNKS - 1 || lane < LAST_LANES)" in src


@pytest.mark.parametrize("x, fitted", [(5120, (320, 640)), (2560, (160, 320)), (7168, (448, 896)),
                                       (1536, (96, 192)), (4096, ()), (2048, ()), (1024, ())])
def test_blocks_fitted_to_a_row_of_whole_warps_that_no_power_of_two_block_holds_evenly(x, fitted):
    # 5120 bf16 values are 640 chunks: whole warps, but 2.5 chunks a thread on 256 threads and 1.25
    # on 512; 320 threads hold 2 each (H200: the rmsnorm backward over 8192 rows 113.5 -> 71.6 us)
    from napkin.codegen.families.rowwise import fitted_threads

    s = analyse(whole(norm_grad("rmsnorm", r=8192, x=x)))
    assert fitted_threads(s) == fitted
    tprs = {c.kernels[0].options.threads_per_row for c in FAMILY.candidates(whole(norm_grad("rmsnorm", r=8192, x=x)),
                                                                           "h200", "bf16")}
    # two chunks a thread at least (one a thread on 896 threads leaves too few registers)
    assert not fitted or fitted[0] in tprs


@pytest.mark.parametrize("name, dtype, x", [("layernorm", "bf16", 4096), ("rmsnorm", "bf16", 1024),
                                            ("rmsnorm", "fp32", 2048)])
def test_the_candidates_load_one_row_group_ahead(name, dtype, x):
    # depth 2 measured slower on an H200 at every point timed (rowwise.PREFETCHES); explicit
    # schedules still take 1..3
    sub = whole(norm_grad(name, dtype, r=16384, x=x))
    for gpu in ("h100", "h200"):
        depths = {s.kernels[0].options.stages for s in FAMILY.candidates(sub, gpu, dtype)}
        assert depths == {1}


# ----------------------------------------------------------------------------- nvcc

def _launches() -> list:
    out = []
    cases = [(whole(norm_grad("rmsnorm", dt, **sz)), f"rms_{dt}_{sz['x']}") for dt in ("bf16", "fp32")
             for sz in (dict(r=16384, x=4096), dict(r=300, x=1000), dict(r=37, x=4095))]
    cases += [(whole(norm_grad("layernorm", dt, **sz)), f"ln_{dt}_{sz['x']}") for dt in ("bf16", "fp16")
              for sz in (dict(r=4096, x=4096), dict(r=100, x=1000))]
    cases += [(prepare(batch_rows(), sizes=dict(b=3, s=5, x=999), dtype="bf16"), "batch")]
    # rows of 5000: the planner's pick and the blocks fitted to the row; a row of 256 (warp mode)
    cases += [(whole(norm_grad(n, "bf16", r=4096, x=5000)), f"{n}_bf16_5000") for n in ("rmsnorm", "layernorm")]
    cases += [(whole(norm_grad("rmsnorm", "bf16", r=300, x=256)), "rms_bf16_256")]
    # rows too long for registers, streamed (a row of no 16-byte multiple, fp32, two column reductions)
    cases += [(whole(norm_grad(n, dt, r=4096, x=x)), f"{n}_{dt}_{x}_streamed")
              for n, dt, x in (("rmsnorm", "bf16", 16384), ("layernorm", "bf16", 10000), ("layernorm", "fp32", 12000))]
    # narrow 16-bit rows over many: a warp a row, 24 and 32 values a thread (the planner's picks)
    cases += [(whole(norm_grad(n, "bf16", r=8192, x=x)), f"{n}_bf16_{x}_warp") for n in ("rmsnorm", "layernorm")
              for x in (768, 1024)]
    for sub, tag in cases:
        cands = FAMILY.candidates(sub, "h100", sub.nodes[0].dtype)
        # the first, middle and last, and every block fitted to the row
        special = {i for i, c in enumerate(cands) if c.kernels[0].options.threads_per_row not in THREADS_PER_ROW}
        some = {0} if tag.endswith("_5000") else {0, len(cands) // 2, len(cands) - 1}
        for i in sorted(some | special):
            p = FAMILY.lower(sub, cands[i], "sm_90a")
            for k in p.launches:
                # a budget cut deeper than SPILL_FREE_SQUEEZE under the footprint may spill a few bytes
                cfg = FAMILY.config(sub, cands[i])
                cut = chain_regs_need(analyse(sub), cfg) - k.model_regs_per_thread \
                    if getattr(cfg, "blocks_per_sm", None) else 0
                deep = "_deep" if cut > SPILL_FREE_SQUEEZE else ""
                if getattr(cfg, "stream", False) and (cfg.blocks_per_sm or cfg.unroll == cfg.chunks_per_thread):
                    deep = "_kept"  # see STREAM_KEPT_SPILL_BYTES
                new = f"{k.name}_{tag}_{i}{deep}"
                out.append(dataclasses.replace(k, name=new, source=re.sub(rf"\b{k.name}\b", new, k.source)))
    return out


#: The spill a budget cut deeper than SPILL_FREE_SQUEEZE may cost (the layernorm backward of a row of
#: 5000 on 96 registers: 24 bytes on sm_90a, none on sm_80; measured faster than its own budget).
DEEP_CUT_SPILL_BYTES = 32
#: A streamed row whose thread loads all its chunks in one step, or on a budget cut for two blocks
#: an SM: ptxas keeps the first pass's values for the later passes (the same loads, nothing stored
#: between) rather than reading them again, past the footprint the formula gives a stream, and
#: spills. Measured fastest anyway on an H200 (rmsnorm backward over 8192 x 10240 bf16: 201.0 us
#: on 512 threads, three chunks, the budget cut to 64, 196 / 464 bytes spilled on sm_90a, against
#: 260.1-285.0 for the configurations that do not spill).
STREAM_KEPT_SPILL_BYTES = 512
#: A kernel with two paths (the aligned one, ``constexpr bool AL = true``): its second copy of the row
#: loop costs ptxas a few registers where the budget is tight (the layernorm backward in fp16 over
#: rows of 4096 on 256 threads: 12 / 16 bytes on sm_90a; over 8192 x 4096 it ran 64.8 -> 59.5 us
#: with the two paths on an H200).
TWO_PATH_SPILL_BYTES = 16


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_build_within_the_model(arch):
    from napkin.kernels import nvcc_compile

    launches = _launches()
    assert any(k.name.endswith("_deep") for k in launches)  # the layernorm backward of a row of 5000
    modes = {("warp" if dict(k.tunables).get("THREADS_PER_ROW", 64) <= 32 else "block")
             for k in launches if "chain" in k.name}
    assert modes == {"warp", "block"}
    usage = nvcc_compile("\n".join(k.source for k in launches), arch)
    problems = []
    for k in launches:
        r = usage[k.name]
        where = f"{k.name} ({arch}, {dict(k.tunables)})"
        allowed = DEEP_CUT_SPILL_BYTES if k.name.endswith("_deep") else \
            STREAM_KEPT_SPILL_BYTES if k.name.endswith("_kept") else \
            TWO_PATH_SPILL_BYTES if "constexpr bool AL = true;" in k.source else 0
        if max(r.spill_stores, r.spill_loads) > allowed:
            problems.append(f"{where}: spills {r.spill_stores} / {r.spill_loads} bytes (stores / loads)")
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
