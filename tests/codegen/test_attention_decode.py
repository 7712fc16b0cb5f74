"""Decode and short queries on the attention family (issue #13 part 2), and every head dimension,
on the CPU: the planner's choice (a split-KV schedule for q = 1 to 64 against long x, the query
heads of a GQA key/value head packed into one tile, never the scalar fallback for any of the head
dimensions 64, 80, 96, 128, 192 and 256), what the family states for the model (the blocks of
the splits and their workspace), the one launch and the buffers a split lowers to,
configurations that come back from their schedules, and ``napkin derive`` at q = 1.
"""

from __future__ import annotations

import math
import re

import pytest

from napkin.codegen.families.attention import (COMBINE_BATCH, FAMILY, MAX_SPLITS, AttentionConfig, analyze,
                                               combine_batch, combine_tail_round_trips)
from napkin.codegen.lower import build
from napkin.codegen.planner import derive
from napkin.codegen.select import rank
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import Schedule

from napkin_test_support import cli_invoke


def gqa_decode() -> Diagram:
    """GQA without a mask (the decode step sees the whole cache): Q[h,j,q,d], K, V[h,x,d]."""
    h, j, q, x, d = Axis("h"), Axis("j"), Axis("q"), Axis("x"), Axis("d")
    return Diagram("gqa_decode", attention_core(array("Q", h, j, q, d), array("K", h, x, d), array("V", h, x, d)))


def plan_of(d: Diagram, gpu="h100"):
    plan = derive(d, gpu, "bf16", explain=False).plan
    assert [k.kernel.family for k in plan.kernels] == ["attention"], plan
    return plan


def config(d: Diagram, schedule: Schedule) -> AttentionConfig:
    """The configuration of a schedule (the Hopper template's own, which packs and splits nothing,
    for a wgmma schedule)."""
    if schedule.kernels[0].options.engine == "wgmma":
        from napkin.codegen.families import attention_wgmma

        return attention_wgmma.config_of(analyze(d), d, schedule)
    return FAMILY.config_of(analyze(d), d, schedule)


# ---------------------------------------------------------------------------- the planner's choice

@pytest.mark.parametrize("q", [1, 7, 16, 64])
@pytest.mark.parametrize("x", [4096, 32768, 131072])
def test_short_queries_against_long_keys_plan_a_split_kv_schedule(q, x):
    d = gqa_decode().bind(h=8, j=4, q=q, x=x, d=128)
    plan = plan_of(d)
    k = plan.kernels[0].kernel
    cfg = config(d, plan.schedule)
    assert k.options.splits and k.options.splits > 1, k
    assert cfg.splits == k.options.splits
    # the splits fill the GPU (to within one split's blocks: 8 tiles x 16 splits leave 4 of 132 SMs
    # idle, 17 splits put 4 blocks in a second round where one block an SM is resident), each
    # split at least two chunks of keys, every block four warps (a 16-row tile's keys shared by
    # four warps along x)
    est = FAMILY.launch_estimate(d, plan.schedule)
    assert est["blocks"] + est["blocks"] // cfg.splits > 132 and est["threads"] >= 128
    if cfg.BQ < 64:
        assert cfg.wx > 1 and k.options.threads_per_row == 4 * cfg.wx
    assert math.ceil(x / cfg.BX) // cfg.splits >= 2
    # the 4 query heads of a key/value head share one tile where they fit one (4 q rows each)
    if 2 * q <= cfg.BQ:
        assert cfg.packed, cfg
        groups = {r.axis: r.size for r in k.relabels if r.kind == "group" and r.level == "SMEM"}
        assert groups["j"] >= 2 and groups["q"] == q


@pytest.mark.parametrize("gpu", ["h100", "a100-80gb"])
def test_decode_of_multi_head_attention_is_split_and_the_model_says_why(gpu):
    d = library.get("mha").bind(h=32, q=1, x=8192, d=128)
    ranked = rank(d, FAMILY, gpu, "bf16")
    best = config(d, ranked[0].schedule)
    assert best.splits > 1 and not best.packed and best.BQ == 16
    assert "HBM-bound" in ranked[0].detail
    # the same tile unsplit would leave SMs idle: not offered
    assert all(config(d, r.schedule).splits > 1 for r in ranked if config(d, r.schedule).BQ < 64)


def test_long_queries_are_not_split():
    for name, sizes in (("mha", dict(h=64, q=4096, x=4096, d=128)), ("gqa", dict(h=8, j=4, q=4096, x=4096, d=64))):
        d = library.get(name).bind(**sizes)
        assert all(s.kernels[0].options.splits is None for s in FAMILY.candidates(d, "h100", "bf16")), name
        assert not getattr(config(d, plan_of(d).schedule), "packed", False)


@pytest.mark.parametrize("D", [64, 80, 96, 128, 192, 256])
def test_every_head_dimension_plans_on_the_attention_family(D):
    for name, sizes in (("attention_causal", dict(h=4, q=4097, x=4097)), ("gqa", dict(h=2, j=4, q=77, x=3000)),
                        ("mha", dict(h=32, q=1, x=16384)), ("mha", dict(h=16, q=1000, x=1000))):
        d = library.get(name).bind(**sizes, d=D)
        if name == "mha" and sizes["q"] > 1 and D > 128:
            # non-causal d = 192, 256 at a thousand queries: the model prices the 64-row tiles'
            # shared-memory reads above the unfused plan's HBM round trip; never the fallback
            plan = derive(d, "h100", "bf16", explain=False).plan
            assert "fallback" not in plan.families
            assert rank(d, FAMILY, "h100", "bf16")
            continue
        if name == "mha" and sizes["q"] == 1:
            # decode: Q K^T and P V are then matrix-vector products, which the pointwise family also
            # runs at the memory's rate; the model may price that plan a hair under the split-KV
            # kernel (d = 256: 171.8 against 172.9 us), never far under it
            plan = derive(d, "h100", "bf16", explain=False).plan
            att = derive(d, "h100", "bf16", explain=False, families=["attention"]).plan
            assert "fallback" not in plan.families and att.seconds <= 1.02 * plan.seconds, (plan, att)
            assert config(d, att.schedule).D == D
            continue
        plan = plan_of(d)
        assert config(d, plan.schedule).D == D
    for gpu in ("h100", "a100-80gb"):
        limit = 227 * 1024 if gpu == "h100" else 163 * 1024
        d = library.get("mha").bind(h=2, q=100, x=100, d=D)
        assert all(config(d, s).smem_bytes() <= limit for s in FAMILY.candidates(d, gpu, "bf16"))


def test_other_head_dimensions_are_refused_with_the_reason():
    for D, why in ((72, "not a multiple of 16"), (8, "not a multiple of 16"), (320, "over 256")):
        d = library.get("mha").bind(h=2, q=64, x=64, d=D)
        reason = FAMILY.explain(d)
        assert why in reason and str(D) in reason, reason
        with pytest.raises(CodegenError, match=why):
            FAMILY.lower(d, Schedule.fused(d, groups={"q": 64}, streams={"x": 64}, rf_groups={"q": 16}), "sm_90a")


# ---------------------------------------------------------------------------- what the model is told

def test_the_estimate_states_the_splits_the_combine_and_its_workspace():
    d = gqa_decode().bind(h=8, j=4, q=1, x=32768, d=128)
    base = AttentionConfig(16, 64, 16, 3, 128, 2, packed=True)
    est1 = FAMILY.launch_estimate(d, FAMILY.schedule(d, base))
    assert est1["blocks"] == 8 and "extra_launches" not in est1
    for splits in (2, 33, 128):
        est = FAMILY.launch_estimate(d, FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=splits,
                                                                           packed=True)))
        assert est["blocks"] == 8 * splits
        assert est["stream_steps"] == math.ceil(32768 / 64 / splits)
        # one launch: the last split of a tile combines; its tail is the round trips it waits for
        # (stores, fence, arrival, then one a batch of COMBINE_BATCH partials), not a launch
        assert "extra_launches" not in est
        assert est["extra_round_trips"] == combine_tail_round_trips(splits) == 3 + math.ceil(
            splits / min(splits, COMBINE_BATCH))
        # each split writes its rows' O (fp32, d values) and log-sum-exp, the combine reads them back
        assert est["extra_hbm_bytes"] == 2 * 4 * splits * (8 * 4 * 1) * (128 + 1)
    unpacked = FAMILY.launch_estimate(d, FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=2)))
    assert unpacked["blocks"] == 8 * 4 * 2  # a block per query head


def test_packing_reads_each_key_value_head_once_in_the_model():
    from napkin.codegen.select import model_work

    d = gqa_decode().bind(h=8, j=4, q=1, x=32768, d=128)
    packed = model_work(FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=8, packed=True)), "h100")
    kv = 2 * 8 * 32768 * 128 * 2
    assert kv <= packed.bytes["HBM"] < 1.05 * kv


def test_the_combine_tail_grows_with_the_splits_and_is_priced_as_memory_latencies():
    from napkin.codegen.select import extra_pass_seconds, resolve_gpu

    g = resolve_gpu("h200")
    trips = [combine_tail_round_trips(k) for k in (2, 16, 17, 32, 33, 49, MAX_SPLITS)]
    assert trips == sorted(trips) and trips[0] == trips[1] == 4 and trips[2] == 5 and trips[-1] == 3 + 8
    d = gqa_decode().bind(h=8, j=4, q=1, x=16384, d=128)
    cfgs = [AttentionConfig(16, 64, 16, 3, 128, 2, splits=k, packed=True, wx=4) for k in (16, 49)]
    est = [FAMILY.launch_estimate(d, FAMILY.schedule(d, c)) for c in cfgs]
    tails = [extra_pass_seconds({"extra_round_trips": e["extra_round_trips"]}, g) for e in est]
    assert tails == [pytest.approx(4 * g.memory_latency_s), pytest.approx(7 * g.memory_latency_s)]
    assert extra_pass_seconds(est[1], g) > extra_pass_seconds(est[0], g) + 2 * g.memory_latency_s


def test_unpacked_decode_tiles_state_the_key_value_loads_the_cost_model_does_not_count():
    d = gqa_decode().bind(h=8, j=4, q=1, x=8192, d=128)
    kv = 2 * 8 * 8192 * 128 * 2
    plain = FAMILY.launch_estimate(d, FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=8, wx=4)))
    packed = FAMILY.launch_estimate(d, FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=8,
                                                                          packed=True, wx=4)))
    assert plain["extra_l2_bytes"] == 3 * kv and "extra_l2_bytes" not in packed
    prefill = library.get("gqa").bind(h=8, j=4, q=4096, x=4096, d=128)
    est = FAMILY.launch_estimate(prefill, FAMILY.schedule(prefill, AttentionConfig(64, 64, 16, 2, 128, 2)))
    assert "extra_l2_bytes" not in est  # q tiles re-read K and V anyway: the cost model counts those


def test_packed_tiles_too_small_for_their_heads_rows_state_the_reloads():
    """Seven query rows of four query heads are 28 rows: two 16-row packed tiles stream each key/
    value head's chunks twice, where one 32-row tile streams them once (H200, x = 131072, d = 128:
    201.6 us against 160.9; the model, which counts the second pass from L2 under the HBM time,
    had tied them). The planner packs a head's rows into one tile there."""
    d = gqa_decode().bind(h=8, j=4, q=7, x=131072, d=128)
    kv = 2 * 8 * 131072 * 128 * 2
    p = analyze(d)
    two = AttentionConfig(16, 64, 16, 3, 128, 2, splits=16, packed=True, wx=4)
    one = AttentionConfig(32, 64, 16, 3, 128, 2, splits=16, packed=True, wx=2)
    assert FAMILY.kv_reloads(p, d.sizes, two) == 1 and FAMILY.kv_reloads(p, d.sizes, one) == 0
    assert FAMILY.launch_estimate(d, FAMILY.schedule(d, two))["extra_l2_bytes"] == kv
    assert "extra_l2_bytes" not in FAMILY.launch_estimate(d, FAMILY.schedule(d, one))
    # an unpacked 16-row tile that could hold two heads' 7 rows: each query head apart, 3 more
    # passes; 64 query rows fill 64-row tiles whatever the packing
    assert FAMILY.kv_reloads(p, d.sizes, AttentionConfig(16, 64, 16, 3, 128, 2, splits=16, wx=4)) == 3
    one_row = gqa_decode().bind(h=8, j=4, q=1, x=8192, d=128)
    assert FAMILY.kv_reloads(analyze(one_row), one_row.sizes, AttentionConfig(16, 64, 16, 3, 128, 2, wx=4)) == 3
    long_q = gqa_decode().bind(h=8, j=4, q=64, x=8192, d=128)
    assert FAMILY.kv_reloads(analyze(long_q), long_q.sizes, AttentionConfig(64, 64, 16, 2, 128, 2)) == 0
    for gpu in ("h100", "h200"):
        k = plan_of(d, gpu).kernels[0].kernel
        assert {r.axis: r.size for r in k.relabels if r.kind == "group" and r.level == "SMEM"}["j"] == 4, k


def test_long_decode_splits_fit_one_round_of_the_sms():
    """GQA decode at d = 128, x = 32k-128k on the H200 profile: 16 splits of 8 packed tiles (a block
    an SM), not 33 (two an SM). The loop's per-step gaps pass under its memory time, which made the
    33 splits' shorter loops look faster (measured 38.8 against 41.2 us of kernels at 32k)."""
    for x in (32768, 131072):
        d = gqa_decode().bind(h=8, j=4, q=1, x=x, d=128)
        assert plan_of(d, "h200").kernels[0].kernel.options.splits == 16


def test_split_choices_fill_the_sms_and_keep_chunks():
    d = library.get("mha").bind(h=32, q=1, x=8192, d=128)
    p = analyze(d)
    cfg = AttentionConfig(16, 64, 16, 2, 128, 4)
    got = FAMILY.split_choices(p, d.sizes, cfg, 132)
    # decode: k rounds of the SMs (k = 1, 2, 4) by the most splits that fit in them (32 tiles: 4,
    # 8, 16 splits leave 4 of 132 SMs idle, so no more), and the most that run as one wave (4 an SM)
    assert got == [1, 4, 8, 16], got
    # 48 tiles: 2 splits leave 36 SMs idle (over a tenth), so 3 splits cover them; 5 and 11
    # splits fill 2 and 4 rounds to within a tenth
    wide = library.get("mha").bind(h=48, q=1, x=8192, d=128)
    assert FAMILY.split_choices(analyze(wide), wide.sizes, cfg, 132) == [1, 3, 5, 11]
    # longer queries keep the counts that cover the rounds (32 tiles of 128 queries: 5, 9, 17)
    long = library.get("attention").bind(q=4096, x=4096, d=128)
    got = FAMILY.split_choices(analyze(long), long.sizes, AttentionConfig(128, 32, 32, 2, 128, 2), 132)
    assert got == [1, 5, 8, 9, 17], got
    assert all(s <= min(MAX_SPLITS, 8192 // 64 // 2) for s in got)
    short = library.get("mha").bind(h=32, q=1, x=100, d=128)
    assert FAMILY.split_choices(p, short.sizes, cfg, 132) == [1]  # two chunks: nothing to split


# ---------------------------------------------------------------------------- what a split lowers to

def test_a_split_lowers_to_one_launch_two_fp32_workspaces_and_arrival_counters():
    d = gqa_decode().bind(h=8, j=4, q=3, x=5000, d=96)
    cfg = AttentionConfig(16, 64, 16, 3, 96, 2, splits=9, packed=True)
    prog = FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a")
    (main,) = prog.launches
    assert main.template == "attention_fwd.cu.jinja"
    assert main.grid == (1, 8, 9) and main.block == (32, 1, 1)  # 12 packed rows of a head in one tile
    rows = 8 * 4 * 3
    shapes = {b.name: (b.shape, b.dtype, b.zeroed) for b in prog.buffers}
    # the partials per call; one arrival counter a tile (grid.x * grid.y), zeroed once and kept
    assert shapes == {"gqa_decode_opart": ((9, rows, 96), "fp32", False), "gqa_decode_lse": ((9, rows), "fp32", False),
                      "gqa_decode_arrivals": ((8,), "fp32", True)}
    ints = {a.name: a.value for a in main.args if a.kind == "int"}
    assert ints["Np"] == 12 and ints["Nq"] == 3
    assert [a.name for a in main.args if a.kind == "tensor"][-3:] == ["gqa_decode_opart", "gqa_decode_lse",
                                                                       "gqa_decode_arrivals"]
    src = main.source
    assert "constexpr int SPLITS = 9;" in src and "constexpr int NB = 9;" in src  # every split's loads at once
    assert re.search(r"ws_lse\[row0 \+ pr\]", src)
    # the last to arrive resets its counter and combines; the others leave
    # the last split to arrive at the tile's counter (which it zeroes for the next launch) combines
    assert re.search(r"napkin::last_to_arrive\(arrivals \+ \(.*blockIdx\.y\) \* gridDim\.x \+ blockIdx\.x\), SPLITS\)", src)


def test_warps_along_x_are_merged_in_shared_memory():
    d = gqa_decode().bind(h=8, j=4, q=1, x=4096, d=256)
    for splits in (1, 6):
        cfg = AttentionConfig(16, 64, 16, 2, 256, 1, splits=splits, packed=True, wx=4)
        assert cfg.threads == 128 and cfg.SX == 16
        s = FAMILY.schedule(d, cfg)
        assert s.kernels[0].options.threads_per_row == 16
        assert config(d, s) == cfg
        main = FAMILY.lower(d, s, "sm_90a").launches[0]
        assert "for (int sub = warp_x; sub < BX / SX; sub += WX)" in main.source
        assert "constexpr int WX = 4;" in main.source
        # the merge buffer (a max, a sum and D + 4 fp32 per row and warp) fits the tiles' memory
        assert main.shared_bytes == cfg.smem_bytes() >= 4 * 4 * 16 * (2 + 256 + 4)
    with pytest.raises(CodegenError, match="threads a row"):
        bad = FAMILY.schedule(d, AttentionConfig(16, 64, 16, 2, 256, 1, splits=2, packed=True, wx=4))
        bad = bad.replace(kernels=(bad.kernels[0].replace(options=bad.kernels[0].options.__class__(
            **{**bad.kernels[0].options.to_dict(), "threads_per_row": 6})),))
        FAMILY.lower(d, bad, "sm_90a")


def test_the_planners_split_plan_builds():
    d = gqa_decode().bind(h=8, j=4, q=1, x=32768, d=128)
    prog = build(plan_of(d))
    assert [k.template for k in prog.launches] == ["attention_fwd.cu.jinja"]
    assert {b.dtype for b in prog.buffers} == {"fp32"} and [b.zeroed for b in prog.buffers] == [False, False, True]


def test_workspace_names_never_meet_the_diagrams_names():
    q, x, d = Axis("q"), Axis("x"), Axis("d")
    Q, K, V = array("Q", q, d), array("attn_opart", x, d), array("V", x, d)
    dg = Diagram("attn", attention_core(Q, K, V)).bind(q=1, x=9000, d=64)
    prog = FAMILY.lower(dg, FAMILY.schedule(dg, AttentionConfig(16, 64, 16, 3, 64, 4, splits=4)), "sm_80")
    names = {b.name for b in prog.buffers}
    assert len(names) == 3 and not names & set(dg.input_names)


def test_configurations_come_back_from_their_schedules():
    n = 0
    for dg in (gqa_decode().bind(h=8, j=4, q=1, x=32768, d=128), library.get("gqa").bind(h=2, j=8, q=5, x=999, d=80),
               library.get("mha").bind(h=32, q=64, x=20000, d=256), library.get("attention_window").bind(h=2, q=33,
                                                                                                         x=7000, d=192)):
        for gpu in ("h100", "a100-80gb"):
            for s in FAMILY.candidates(dg, gpu, "bf16"):
                cfg = config(dg, s)
                assert FAMILY.schedule(dg, cfg, gpu=gpu).kernels[0] == s.kernels[0]
                n += 1
    assert n > 40


def test_refusals_of_packing_and_splits():
    d = gqa_decode().bind(h=8, j=4, q=1, x=4096, d=128)
    with pytest.raises(CodegenError, match="only the axes they lack"):
        FAMILY.lower(d, Schedule.fused(d, groups={"h": 2, "q": 16}, streams={"x": 64}, rf_groups={"q": 16}), "sm_90a")
    s = FAMILY.schedule(d, AttentionConfig(16, 64, 16, 3, 128, 2, splits=4, packed=True))
    bad = s.replace(kernels=(s.kernels[0].replace(options=s.kernels[0].options.__class__(
        **{**s.kernels[0].options.to_dict(), "splits": MAX_SPLITS + 1})),))
    with pytest.raises(CodegenError, match="splits"):
        FAMILY.lower(d, bad, "sm_90a")
    g = gqa_decode().bind(h=2, j=4, q=7, x=4096, d=128)
    with pytest.raises(CodegenError, match="whole"):  # a packed tile holds every q
        FAMILY.config_of(analyze(g), g, Schedule.fused(g, groups={"j": 4, "q": 4}, streams={"x": 64},
                                                       rf_groups={"q": 4}))


def test_derive_takes_one_query_row(tmp_path):
    code, out, err = cli_invoke("derive", "mha", "-s", "h=32,q=1,x=8192,d=128", "--gpu", "h100")
    assert code == 0, err
    plan = out[out.index("plan of mha"):]
    assert "attention:" in plan.splitlines()[1] and "splits=" in plan.splitlines()[1]
    target = tmp_path / "mha.cu"
    code, out, err = cli_invoke("generate", "mha", "-s", "h=32,q=1,x=8192,d=128", "--gpu", "h100", "-o", str(target))
    assert code == 0, err
    src = target.read_text()
    assert "constexpr int BQ = 16;" in src and "napkin::last_to_arrive(arrivals" in src


def test_derive_packs_the_query_heads_of_the_gqa_library_diagram_at_one_query_row():
    code, out, err = cli_invoke("derive", "gqa", "-s", "h=8,j=4,q=1,x=8192,d=128", "--gpu", "h100")
    assert code == 0, err
    line = out[out.index("plan of gqa"):].splitlines()[1]
    # the 4 query heads of a key/value head share one tile (K and V read once), split over x
    assert "attention:" in line and "j→g_j=4" in line and "q→g_q=1" in line, line
    splits = int(re.search(r"splits=(\d+)", line).group(1))
    assert 8 * splits >= 0.9 * 132  # the 8 key/value heads' tiles fill the SMs (to within a tenth)


# ---------------------------------------------------------------------------- the combine

@pytest.mark.parametrize("splits", [2, 9, 16, 17, 33, MAX_SPLITS])
def test_the_combine_issues_a_batch_of_loads_at_once(splits):
    """A combining thread loads NB splits before it uses any: all of them up to COMBINE_BATCH."""
    nb = combine_batch(splits)
    assert 1 <= nb <= COMBINE_BATCH and (nb == splits or nb == COMBINE_BATCH)
    d = gqa_decode().bind(h=8, j=4, q=1, x=32768, d=256)
    cfg = AttentionConfig(16, 64, 16, 2, 256, 1, splits=splits, packed=True, wx=4)
    src = FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a").launches[0].source
    assert f"constexpr int NB = {nb};" in src and f"constexpr int SPLITS = {splits};" in src
