"""The per-SM tail, the latency chain of a block, and the assumptions behind them.

Each test fails on the model before these rules: waves counted per resident slot stretched
every term (a 1 GB copy of 264 blocks took 4x its bandwidth time), stream chunk sizes and
row-wise configurations tied, and no function listed the model's assumptions.
"""

import dataclasses

import pytest

from napkin.diagrams import library
from napkin.errors import HardwareError, ScheduleError
from napkin.perfmodel.hardware import FIELD_SOURCES, get_gpu
from napkin.perfmodel.predict import (
    LaunchShape,
    block_latency,
    explain_assumptions,
    latency_floor,
    predict_kernel,
    predict_schedule,
    reduction_latency_clk,
)
from napkin.perfmodel.roofline import Work, per_sm_term, predict
from napkin.perfmodel.schedule import Schedule


# ----------------------------------------------------------------------------- the tail


def test_memory_bound_kernel_is_not_stretched_by_a_partial_wave(h100):
    """1 GB through HBM in 264 blocks of 256 threads (8 resident per SM: 1056 slots): the old
    per-slot count gave 1 wave for 0.25 ideal and predicted 4x the bandwidth time (1197 us).
    HBM is shared by the chip; 264 blocks on 132 SMs keep it busy."""
    w = Work(flops={"cuda": 1e8}, bytes={"HBM": 1e9}, dtype="bf16")
    shape = LaunchShape(blocks=264, threads=256, regs_per_thread=32, smem_bytes=0, in_flight_bytes_per_thread=64)
    k = predict_kernel(h100, w, shape)
    assert k.blocks_per_sm == 8 and k.roofline.waves == 1 and k.roofline.ideal_waves == pytest.approx(0.25)
    ideal = 1e9 / 3.35e12
    assert k.seconds == pytest.approx(ideal, rel=0.15)
    assert k.bound == "HBM" and k.roofline.tail_resource == "none"
    assert k.roofline.wave_factor == pytest.approx(1.0)      # 2 blocks on every SM: no tail at all
    assert "HBM" not in k.roofline.tail_terms and "L2" not in k.roofline.tail_terms


def test_tail_counts_blocks_per_sm_and_stretches_only_per_sm_terms(h100):
    w = Work(flops={"tensor": 1e12}, bytes={"HBM": 1e9, "SMEM": 1e10}, dtype="bf16")
    base = predict(h100, w, launch_overhead_s=0)
    # 264 blocks, 4 resident per SM: 2 per SM, no tail (the per-slot count said 2x)
    even = predict(h100, w, blocks=264, blocks_per_sm=4, launch_overhead_s=0)
    assert even.waves == 1 and even.ideal_waves == pytest.approx(0.5)
    assert even.wave_factor == pytest.approx(1.0) and even.seconds == pytest.approx(base.seconds)
    # 133 blocks: the busiest SM runs 2 where 133/132 is the even share
    one_more = predict(h100, w, blocks=133, blocks_per_sm=4, launch_overhead_s=0)
    assert one_more.busiest_sm_blocks == 2
    assert one_more.wave_factor == pytest.approx(2 / (133 / 132))
    assert one_more.compute_time_s == pytest.approx(base.compute_time_s * one_more.wave_factor)
    assert one_more.effective_terms["SMEM"] == pytest.approx(base.transfer_s["SMEM"] * one_more.wave_factor)
    assert one_more.effective_terms["HBM"] == pytest.approx(base.transfer_s["HBM"])   # shared: no tail
    assert one_more.tail_resource == "tensor" and set(one_more.tail_terms) >= {"tensor", "SMEM"}
    # fewer blocks than SMs: only that many SMs compute (132/32), not 132*bps/32
    few = predict(h100, w, blocks=32, blocks_per_sm=2, launch_overhead_s=0)
    assert few.wave_factor == pytest.approx(132 / 32)
    assert few.seconds == pytest.approx(base.compute_time_s * 132 / 32)
    assert "busiest SM" in str(few) and "tensor binds" in str(few)
    assert per_sm_term(h100, "RF") and per_sm_term(h100, "sfu") and not per_sm_term(h100, "L2")


def test_one_head_attention_is_limited_by_its_32_blocks(h100):
    """g_q=128 gives one head 32 blocks: 32 of 132 SMs compute (x4.125 on the tensor term only)."""
    d = library.get("attention").with_dtype("bf16").bind(q=4096, x=4096, d=128)
    big = predict_schedule(Schedule.fused(d, groups={"q": 128}, streams={"x": 64}), h100)
    small = predict_schedule(Schedule.fused(d, groups={"q": 32}, streams={"x": 64}), h100)
    kb = big.kernels[0].roofline
    assert big.kernels[0].blocks == 32 and kb.wave_factor == pytest.approx(132 / 32)
    assert kb.tail_resource == "tensor"
    assert small.seconds < big.seconds


def test_latency_floor_counts_only_resident_blocks(h100):
    lean = LaunchShape(blocks=100, threads=128, regs_per_thread=32, smem_bytes=0, in_flight_bytes_per_thread=16)
    # 16 blocks fit an SM (2112 slots) but only 100 blocks exist: 100 blocks' bytes in flight
    floor = latency_floor(h100, 1e9, lean, 16)
    assert floor == pytest.approx(1e9 * h100.memory_latency_s / (100 * 128 * 16))


# ----------------------------------------------------------------------------- the latency chain


def test_smaller_stream_chunks_cost_more(h100):
    """matmul 4096^3 bf16, g_a = g_c = 128: s_b = 16, 32, 64 no longer tie (146.3 us each before)."""
    d = library.get("matmul").with_dtype("bf16").bind(a=4096, b=4096, c=4096)
    t = {}
    for sb in (16, 32, 64):
        p = predict_schedule(Schedule.fused(d, groups={"a": 128, "c": 128}, streams={"b": sb}), h100)
        k = p.kernels[0]
        assert k.launch.stream_steps == 4096 // sb and k.chain is not None
        # the per-step overheads add up over the generations; the fill is hidden by co-resident blocks
        assert k.roofline.latency_s >= k.roofline.rounds * k.chain.steps_s * (1 - 1e-9)
        assert k.roofline.latency_s <= k.roofline.rounds * k.chain.total_s * (1 + 1e-9)
        t[sb] = p.seconds
    assert t[16] > t[32] > t[64]
    # the same launch with more steps: only the per-step term changes
    w = Work(flops={"tensor": 2 * 4096 ** 3}, bytes={"HBM": 3 * 4096 * 4096 * 2}, dtype="bf16")

    def at(steps):
        shape = LaunchShape(blocks=1024, threads=256, regs_per_thread=128, smem_bytes=64 * 1024, stream_steps=steps)
        return predict_kernel(h100, w, shape)

    a, b = at(64), at(256)
    per_step = h100.step_overhead_clk / h100.clock_hz
    assert b.chain.total_s - a.chain.total_s == pytest.approx(192 * per_step)
    assert b.seconds - a.seconds == pytest.approx(b.roofline.rounds * 192 * per_step)
    assert a.chain.fill_s == pytest.approx(h100.memory_latency_s)


def _rowwise(gpu, rows_per_block, threads_per_row, regs=32, r=32768, x=4096):
    d = library.get("softmax").with_dtype("bf16").bind(r=r, x=x)
    chunks = max(1, x // (8 * threads_per_row))
    shape = LaunchShape(blocks=r // rows_per_block, threads=rows_per_block * threads_per_row, regs_per_thread=regs,
                        smem_bytes=64, in_flight_bytes_per_thread=16 * chunks, threads_per_row=threads_per_row)
    return predict_schedule(Schedule.fused(d, groups={"r": rows_per_block}, gpu=gpu.key), gpu, launch=shape)


def test_rowwise_configurations_are_told_apart(h200):
    """load -> reduce -> store is a chain a block cannot overlap with itself: more blocks per SM or
    more rows per block hide it, rows spread over more threads lengthen it."""
    p = _rowwise(h200, 1, 128)
    k = p.kernels[0]
    assert (k.launch.reductions, k.launch.stream_steps) == (2, 0.0)   # softmax: max and sum, filled from the cost
    assert k.chain.reduce_s == pytest.approx(2 * reduction_latency_clk(h200, 128) / h200.clock_hz)
    # 16 blocks per SM hide one another's chains: nothing is added
    assert k.roofline.latency_s == 0.0 and k.chain.total_s > 0
    # few blocks resident (many registers per thread): the chain is exposed, slower (the old
    # per-slot waves made a 4-per-SM launch look faster)
    hungry = _rowwise(h200, 1, 128, regs=255)
    assert hungry.kernels[0].blocks_per_sm == 2 and hungry.kernels[0].roofline.latency_s > 0
    assert hungry.seconds > p.seconds
    # more rows per block with the block limit binding (32 one-warp blocks per SM): fewer rounds,
    # never slower
    one = _rowwise(h200, 1, 32)
    four = _rowwise(h200, 4, 32)
    assert one.kernels[0].blocks_per_sm == 32 and four.kernels[0].roofline.rounds < one.kernels[0].roofline.rounds
    assert four.seconds <= one.seconds
    # a row over more threads: a longer reduction (shuffles, then a cross-warp stage)
    assert reduction_latency_clk(h200, 1) == 0
    assert reduction_latency_clk(h200, 32) == 5 * h200.shuffle_latency_clk
    assert reduction_latency_clk(h200, 512) == 9 * h200.shuffle_latency_clk + h200.sync_latency_clk
    # the chain is hidden only while enough blocks share an SM: the fewer resident, the more it adds
    added = [_rowwise(h200, 1, 128, regs=r).kernels[0].roofline.latency_s for r in (32, 128, 255)]
    assert added == sorted(added) and added[-1] > added[0]


def test_online_softmax_reduces_on_a_quad_every_step(h100):
    d = library.get("attention").with_dtype("bf16").bind(q=4096, x=4096, d=128)
    k = predict_schedule(Schedule.fused(d, groups={"q": 64}, streams={"x": 64}), h100).kernels[0]
    kc = k.roofline  # noqa: F841 - the roofline exists; the facts are on the launch
    assert (k.launch.reductions_per_step, k.launch.reductions, k.launch.threads_per_row) == (1, 1, 4)
    red = reduction_latency_clk(h100, 4)
    assert k.chain.steps_s == pytest.approx(64 * (h100.step_overhead_clk + red) / h100.clock_hz)


def test_no_chain_without_facts_and_launch_validation(h100):
    w = Work(flops={"tensor": 1e12}, dtype="bf16")
    shape = LaunchShape(blocks=1000, threads=256, regs_per_thread=128, smem_bytes=0)
    assert block_latency(h100, shape) is None and predict_kernel(h100, w, shape).roofline.latency_s == 0
    assert block_latency(h100, LaunchShape(blocks=1, threads=32, regs_per_thread=32, smem_bytes=0,
                                           reductions=0)).total_s == pytest.approx(h100.memory_latency_s)
    for bad in ({"stream_steps": -1}, {"threads_per_row": 0}, {"row_iterations": 0}, {"reductions": -2}):
        with pytest.raises(ScheduleError):
            LaunchShape(blocks=1, threads=32, regs_per_thread=32, smem_bytes=0, **bad)
    with pytest.raises(HardwareError):
        predict(h100, w, block_latency_s=-1.0)


# ----------------------------------------------------------------------------- named assumptions


def test_latency_constants_are_named_profile_fields_with_sources(h100):
    for key in ("a100-40gb", "a100-80gb", "h100", "h200"):
        g = get_gpu(key)
        assert g.step_overhead_clk > 0 and g.shuffle_latency_clk > 0 and g.sync_latency_clk > 0
        for f in ("memory_latency_s", "step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk",
                  "mma_sync_fraction", "launch_overhead_s", "l2_round_clk"):
            assert f in g.sources and ("estimate" in g.source_of(f) or "measured" in g.source_of(f)
                                       or "datasheet" in g.source_of(f))
    tweaked = h100.with_overrides(step_overhead_clk=50.0, sources={"step_overhead_clk": "measured here"})
    assert tweaked.step_overhead_clk == 50.0 and tweaked.source_of("step_overhead_clk") == "measured here"
    assert type(h100).from_json(tweaked.to_json()) == tweaked
    with pytest.raises(HardwareError):
        h100.with_overrides(shuffle_latency_clk=-1.0)
    assert set(FIELD_SOURCES) >= {"memory_latency_s", "step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk"}


def test_explain_assumptions_lists_every_named_constant(h100):
    rows = explain_assumptions(h100)
    names = {n for n, _, _ in rows}
    for n in ("memory_latency_s", "step_overhead_clk", "shuffle_latency_clk", "sync_latency_clk",
              "mma_sync_fraction", "launch_overhead_s", "l2_round_clk", "L2.bandwidth", "SMEM.bandwidth",
              "LaunchAssumptions.threads_per_block", "FILL_LOCKED_BLOCKS"):
        assert n in names, n
    assert all(isinstance(src, str) and src for _, _, src in rows)
    assert dict((n, v) for n, v, _ in rows)["step_overhead_clk"] == h100.step_overhead_clk
    # the launch overhead is a profile field too: predict uses it unless told otherwise
    slow = h100.with_overrides(launch_overhead_s=10e-6)
    assert predict(slow, Work(bytes={"HBM": 1.0})).launch_overhead_s == 10e-6
    assert dict((n, v) for n, v, _ in explain_assumptions(slow))["launch_overhead_s"] == 10e-6
    # calibrated factors and a prediction's launch facts
    cal = h100.with_overrides(efficiency={"attention": {"tensor": 0.8}})
    d = library.get("attention").with_dtype("bf16").bind(q=1024, x=1024, d=64)
    p = predict_schedule(Schedule.fused(d, groups={"q": 64}, streams={"x": 64}), cal, family="attention")
    rows = explain_assumptions(cal, p)
    got = {n: v for n, v, _ in rows}
    assert got["efficiency[attention].tensor"] == 0.8 and got["Efficiency.tensor"] == 0.8
    assert got["kernel[fused].stream_steps"] == 16 and got["kernel[fused].threads_per_row"] == 4
    assert "kernel[fused].latency_chain_s" in got
    assert "kernel[fused].issue_overlaps_memory" not in got
    ahead = LaunchShape(blocks=256, threads=128, regs_per_thread=128, smem_bytes=32 * 1024, issue_overlaps_memory=True)
    q = predict_schedule(Schedule.fused(d, groups={"q": 64}, streams={"x": 64}), h100, launch=ahead)
    assert dict((n, v) for n, v, _ in explain_assumptions(h100, q))["kernel[fused].issue_overlaps_memory"] is True


def test_step_overheads_pass_under_a_memory_bound_loop_whose_loads_run_ahead(h100):
    """A block's per-step gaps (barriers, pipeline restarts) are time its warps issue nothing. A
    kernel whose loads run ahead of them (``issue_overlaps_memory``: the split-KV decode kernel's
    K/V ring) keeps them in flight meanwhile, so a loop with memory slack absorbs the gaps and a
    compute-bound one pays them in full (H200 GQA decode at x = 32k: 16 splits of 32 steps 38.8 us
    of kernels, 33 splits of 16 steps 41.2, where adding every gap ranked 33 first). Without the
    fact they add (the mma.sync contraction's small tiles over a tall, narrow product ran
    1.5-2.1x slower than the wgmma tiles when they were taken as hidden)."""
    def at(work, steps, ahead=True):
        shape = LaunchShape(blocks=132, threads=128, regs_per_thread=128, smem_bytes=64 * 1024, stream_steps=steps,
                            issue_overlaps_memory=ahead)
        return predict_kernel(h100, work, shape, launch_overhead_s=0.0)

    memory = Work(flops={"tensor": 2e9}, bytes={"HBM": 2e8}, dtype="bf16")     # ~60 us of HBM, ~2 us of compute
    a, b = at(memory, 16), at(memory, 32)
    assert b.chain.steps_s > a.chain.steps_s > 0
    slack = a.roofline.tail_body_s - a.roofline.compute_time_s
    assert b.roofline.rounds * b.chain.steps_s < slack  # the gaps fit in the slack
    assert b.seconds == pytest.approx(a.seconds)
    plain_a, plain_b = at(memory, 16, ahead=False), at(memory, 32, ahead=False)
    assert plain_b.seconds - plain_a.seconds == pytest.approx(
        plain_b.roofline.rounds * (plain_b.chain.steps_s - plain_a.chain.steps_s))
    compute = Work(flops={"tensor": 2e11}, bytes={"HBM": 2e6}, dtype="bf16")   # compute-bound
    c, e = at(compute, 16), at(compute, 32)
    assert e.seconds - c.seconds == pytest.approx(e.roofline.rounds * (e.chain.steps_s - c.chain.steps_s))
    # in between, only what the gaps push past the memory time
    tight = Work(flops={"tensor": 2e9 * (a.roofline.memory_time_s / a.roofline.compute_time_s) * 0.999},
                 bytes={"HBM": 2e8}, dtype="bf16")
    t = at(tight, 32)
    over = t.roofline.compute_time_s + t.roofline.rounds * t.chain.steps_s - t.roofline.tail_body_s
    resident = min(t.roofline.blocks_per_sm, t.roofline.busiest_sm_blocks)
    fill = max(0.0, t.chain.fill_s * t.roofline.rounds + t.roofline.tail_body_s / resident - t.roofline.tail_body_s)
    assert over > 0 and t.roofline.latency_s == pytest.approx(over + fill, rel=1e-6)


# ----------------------------------------------------------------------------- the epilogue phase


def test_an_epilogue_phase_takes_its_bytes_out_of_the_loop_at_every_level(h200):
    """The output a block stores after its loop passes through L2 as well as HBM: the phase takes
    those L2 bytes too, so a short loop is not priced as if its stores ran in it (K = 64 over a
    12800 x 3072 output, 128 x 256 tiles: 38.9 us with them counted twice, 24.2 measured)."""
    out = 12800 * 3072 * 2
    w = Work(flops={"tensor": 2.0 * 12800 * 3072 * 64}, bytes={"HBM": out + 4e6, "L2": out + 6e7}, dtype="bf16")
    shape = LaunchShape(blocks=1200, threads=384, regs_per_thread=168, smem_bytes=200_000, stream_steps=0,
                        epilogue_hbm_bytes=out)
    k = predict_kernel(h200, w, shape)
    assert k.roofline.hbm_bytes == pytest.approx(4e6)
    assert k.roofline.transfer_s["L2"] == pytest.approx(6e7 / h200.level("L2").bandwidth, rel=1e-6)
    assert k.epilogue.transfer_s["L2"] == pytest.approx(out / h200.level("L2").bandwidth, rel=1e-6)
    assert k.epilogue.seconds == pytest.approx(out / h200.level("HBM").bandwidth, rel=1e-6)  # HBM binds it
    assert k.seconds == pytest.approx(k.roofline.seconds + k.epilogue.seconds)


def test_maps_after_the_loop_without_bytes(h200):
    """``epilogue_maps``: the CUDA-core and SFU work is a phase after the loop (a ping-pong
    consumer's maps), the stores stay overlapped; a launch with no maps has no phase."""
    w = Work(flops={"tensor": 1e12, "sfu": 5e8}, bytes={"HBM": 1e8, "L2": 2e8}, dtype="bf16")
    base = LaunchShape(blocks=1024, threads=384, regs_per_thread=168, smem_bytes=200_000, stream_steps=0)
    over = predict_kernel(h200, w, base)
    after = predict_kernel(h200, w, LaunchShape(**{**base.__dict__, "epilogue_maps": True}))
    assert over.epilogue is None and after.epilogue is not None
    assert after.epilogue.hbm_bytes == 0 and after.roofline.hbm_bytes == pytest.approx(1e8)
    assert after.roofline.compute_s["sfu"] == 0 and after.epilogue.compute_s["sfu"] > 0
    assert after.seconds == pytest.approx(over.seconds + after.epilogue.seconds, rel=0.02)
    plain = Work(flops={"tensor": 1e12}, bytes={"HBM": 1e8}, dtype="bf16")
    assert predict_kernel(h200, plain, LaunchShape(**{**base.__dict__, "epilogue_maps": True})).epilogue is None


def test_rounds_of_l2_loads_after_the_loop_add_once(h200):
    """``tail_l2_rounds`` (an in-kernel combine after every block's loop) adds its rounds of
    ``l2_round_clk`` to the kernel once, whatever bounds the loop; a negative count is refused."""
    w = Work(bytes={"HBM": 64e6}, dtype="bf16")
    plain = LaunchShape(blocks=264, threads=128, regs_per_thread=64, smem_bytes=0, in_flight_bytes_per_thread=64)
    tail = dataclasses.replace(plain, tail_l2_rounds=4)
    a, b = predict_kernel(h200, w, plain), predict_kernel(h200, w, tail)
    assert a.tail_s == 0.0 and b.tail_s == pytest.approx(4 * h200.l2_round_clk / h200.clock_hz)
    assert b.seconds == pytest.approx(a.seconds + b.tail_s)
    few = dataclasses.replace(tail, blocks=4)  # latency-bound: the rounds still add
    c = predict_kernel(h200, w, few)
    assert c.bound == "latency" and c.seconds == pytest.approx(
        predict_kernel(h200, w, dataclasses.replace(few, tail_l2_rounds=0)).seconds + c.tail_s)
    with pytest.raises(ScheduleError, match="tail_l2_rounds"):
        dataclasses.replace(plain, tail_l2_rounds=-1)
    rows = {n: (v, src) for n, v, src in explain_assumptions(h200, kernels=[b])}
    assert rows["kernel[kernel].tail_l2_rounds"][0] == 4 and "after the loop" in rows["kernel[kernel].tail_l2_rounds"][1]
    assert rows["l2_round_clk"][0] == h200.l2_round_clk
    assert "kernel[kernel].tail_l2_rounds" not in {n for n, _, _ in explain_assumptions(h200, kernels=[a])}
