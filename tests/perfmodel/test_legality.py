"""Legality: every refusal is a ScheduleError naming the axis, the box and the reason."""

import pytest

from napkin.diagrams import (
    Axis,
    array,
    contract,
    gelu,
    library,
    mean_over,
    rename,
    softmax,
    sum_over,
)
from napkin.diagrams.diagram import Diagram
from napkin.errors import NapkinError, ScheduleError
from napkin.perfmodel import Schedule, analyze, check_schedule, tile_constraints
from napkin.perfmodel.schedule import Kernel, Relabel


def attention(q=256, x=256, d=64, name="attention"):
    return library.get(name).bind(**{k: v for k, v in dict(q=q, x=x, d=d, h=2).items()
                                     if k in library.get(name).axes})


def refused(schedule, gpu=None, *needles):
    with pytest.raises(ScheduleError) as info:
        check_schedule(schedule, gpu)
    msg = str(info.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


# ----------------------------------------------------------------------------- streaming


def test_stream_over_a_lone_softmax_is_refused_with_the_reason():
    d = library.get("softmax").bind(r=64, x=1024)
    msg = refused(Schedule.fused(d, groups={"r": 4}, streams={"x": 256}), None, "'x'", "P")
    assert ("softmax over x needs the whole row before it can write any output; it becomes streamable only "
            "when followed by a contraction over x, which supplies the accumulator") in msg


def test_softmax_followed_by_contraction_streams_online():
    plan = analyze(Schedule.fused(attention(), groups={"q": 64}, streams={"x": 64}))[0]
    P = next(v for v in plan.boxes if plan.name_of(v) == "P")
    assert plan.phase[id(P)] == "online"
    assert [plan.name_of(c) for c in plan.online[id(P)]] == ["O"]
    assert check_schedule(Schedule.fused(attention(), groups={"q": 64}, streams={"x": 64}), "h100") == []


def test_unfused_softmax_kernel_drops_the_stream():
    s = Schedule.unfused(attention(), groups={"q": 64}, streams={"x": 64})
    assert [[r.kind for r in k.relabels] for k in s.kernels] == [["group", "stream"], ["group"], ["group", "stream"]]


def test_softmax_read_by_a_map_is_not_streamable():
    q, x, d = Axis("q", 32), Axis("x", 64), Axis("d", 16)
    Q, K = array("Q", q, d), array("K", x, d)
    P = softmax(contract(Q, K, over=d, name="S"), over=x, name="P")
    Y = sum_over(gelu(P, name="G"), x, name="Y")
    msg = refused(Schedule.fused(Diagram("sg", Y), groups={"q": 16}, streams={"x": 16}), None, "'x'", "G")
    assert "becomes streamable only when followed by a contraction over x" in msg


def test_layernorm_and_rmsnorm_streams_are_refused():
    for name in ("layernorm", "rmsnorm"):
        d = library.get(name).bind(r=64, x=1024)
        refused(Schedule.fused(d, groups={"r": 4}, streams={"x": 256}), None, "'x'", "N",
                f"{name} over x", "cannot be streamed")


def test_second_pass_is_refused():
    r, x = Axis("r", 8), Axis("x", 64)
    X = array("X", r, x)
    Y = (X - mean_over(X, x, name="mu")).named("Y")
    refused(Schedule.fused(Diagram("center", Y), streams={"x": 16}), None, "'x'", "box Y", "mu",
            "complete only after the stream over x ends")


def test_two_streams_rf_streams_and_l2_relabels_are_refused():
    mm = library.get("matmul").bind(a=64, b=64, c=64)
    refused(Schedule.fused(mm, streams={"b": 16, "c": 16}), None, "'b'", "'c'", "one axis")
    k = Kernel("k", ("C",), (Relabel("b", 16, "RF", "stream"),))
    refused(Schedule(mm, (k,)), None, "'b'", "RF")
    k = Kernel("k", ("C",), (Relabel("a", 16, "L2", "group"),))
    refused(Schedule(mm, (k,)), None, "'a'", "L2")
    refused(Schedule.fused(mm, groups={"a": 16}, streams={"a": 16}), None, "'a'", "both grouped and streamed")


def test_streams_on_reductions_and_contractions_are_legal():
    r, x = Axis("r", 8), Axis("x", 64)
    X = array("X", r, x)
    d = Diagram("red", (sum_over(X, x, name="s"), mean_over(X * 2.0, x, name="m")))
    warnings = check_schedule(Schedule.fused(d, groups={"r": 8}, streams={"x": 32}, gpu=None), "h100")
    assert all("128-byte" in w for w in warnings)
    refused(Schedule.fused(d, groups={"r": 4}, streams={"x": 32}), "h100", "g_r=4", "16-byte", "array s")
    analyze(Schedule.fused(library.get("matmul").bind(a=64, b=64, c=64), groups={"a": 16, "c": 16},
                           streams={"b": 16}))


# ----------------------------------------------------------------------------- grouping


def test_grouping_a_contracted_axis_is_refused():
    refused(Schedule.fused(attention(), groups={"d": 16}), None, "'d'", "box S", "contracts over d")
    refused(Schedule.fused(attention(), groups={"x": 16}), None, "'x'", "box P", "softmax")
    mm = library.get("matmul").bind(a=64, b=64, c=64)
    refused(Schedule.fused(mm, groups={"b": 16}), None, "'b'", "box C", "contracts over b")
    refused(Schedule.fused(library.get("layernorm").bind(r=8, x=64), groups={"x": 16}), None,
            "'x'", "box N", "layernorm")


def test_group_larger_than_its_axis_is_refused():
    refused(Schedule.fused(attention(q=100), groups={"q": 128}, streams={"x": 64}), None,
            "g_q=128", "'q'", "size 100", "cannot be larger than its axis")
    refused(Schedule.fused(attention(x=50), groups={"q": 64}, streams={"x": 64}), None, "s_x=64", "'x'")
    refused(Schedule.fused(attention(), groups={"q": [(64, "SMEM"), (128, "RF")]}, streams={"x": 64}), None,
            "w_q=128", "warp tile")


def test_unknown_axis_is_refused_listing_the_kernels_axes():
    msg = refused(Schedule.fused(attention(), groups={"z": 16}), None, "'z'", "fused")
    assert "the kernel's axes are q, x, d" in msg


def test_renamed_axes_cannot_be_relabelled_inside_the_kernel():
    q, e = Axis("q", 32), Axis("e", 16)
    X = array("X", q, e)
    Xn = (X * 2.0).named("Xn")
    G = contract(Xn, rename(Xn, q="x", name="Xk"), over="e", name="G")
    d = Diagram("gram", G)
    refused(Schedule.fused(d, groups={"q": 16}), None, "Xk", "'q'", "view")
    # a view that is only stored (not read in the kernel) keeps the tiling
    analyze(Schedule.unfused(d, groups={"q": 16}))
    assert Schedule.unfused(d, groups={"q": 16}).kernels[0].relabels


# ----------------------------------------------------------------------------- structure


def test_schedule_structure_errors():
    mm = library.get("matmul")
    with pytest.raises(ScheduleError, match="no box 'Z'"):
        Schedule(mm, (Kernel("k", ("Z",)),))
    with pytest.raises(ScheduleError, match="runs no kernel for box"):
        Schedule(library.get("attention"), (Kernel("k", ("S",)),))
    with pytest.raises(ScheduleError, match="two kernels"):
        Schedule(library.get("attention"), (Kernel("k", ("S", "S_scaled", "P")), Kernel("k2", ("P", "O"))))
    att = library.get("attention")
    bad_order = Schedule(att, (Kernel("a", ("O",)), Kernel("b", ("S", "S_scaled", "P"))))
    with pytest.raises(ScheduleError, match="computes later"):
        analyze(bad_order)
    with pytest.raises(ScheduleError, match="size must be positive"):
        Relabel("q", 0)
    with pytest.raises(ScheduleError, match="placed"):
        Kernel("k", ("C",), placement={"C": "HBM"})
    with pytest.raises(ScheduleError, match="does not touch"):
        analyze(Schedule.fused(att, placement={"nope": "SMEM"}))
    assert issubclass(ScheduleError, NapkinError)


# ----------------------------------------------------------------------------- hardware


def test_tile_over_shared_memory_capacity_is_refused_in_kb():
    d = attention(q=4096, x=4096, d=128)
    msg = refused(Schedule.fused(d, groups={"q": 128}, streams={"x": 512}), "h100",
                  "fused", "KiB", "SMEM", "227.0 KiB")
    assert "320.0 KiB" in msg


def test_tile_over_register_capacity_is_refused():
    d = attention(q=4096, x=4096, d=16)
    refused(Schedule.fused(d, groups={"q": 512}, streams={"x": 256}), "h100", "registers", "RF", "KiB")


def test_mma_divisibility():
    msg = refused(Schedule.fused(attention(), groups={"q": 24}, streams={"x": 64}), "h100",
                  "g_q=24", "'q'", "multiple of 16", "box S", "m16n8k16", "m=16")
    assert "bf16" in msg
    refused(Schedule.fused(attention(), groups={"q": 64}, streams={"x": 8}), "h100",
            "s_x=8", "multiple of 16", "k=16", "box O")


def test_whole_axis_in_mma_must_divide():
    refused(Schedule.fused(attention(d=40), groups={"q": 64}, streams={"x": 64}), "h100",
            "'d'", "size 40", "held whole", "multiple of 16", "no remainder handling")
    mm = library.get("matmul").bind(a=37, b=64, c=64)
    refused(Schedule.fused(mm, groups={"c": 16}, streams={"b": 16}), "h100", "'a'", "size 37", "m=16")


def test_vector_and_warp_constraints_combine_by_lcm():
    r, x = Axis("r", 64), Axis("x", 1024)
    X = array("X", r, x)
    red = Diagram("rowsum", sum_over(X, x, name="s"))
    msg = refused(Schedule.fused(red, groups={"r": 16}, streams={"x": 40}), "h100",
                  "s_x=40", "multiple of 32", "warp", "16-byte vector", "box s")
    assert "8 bf16 values" in msg
    assert all("128-byte" in w for w in check_schedule(Schedule.fused(red, groups={"r": 16}, streams={"x": 64}), "h100"))
    ew = Diagram("ew", gelu(X, name="Y"))
    refused(Schedule.fused(ew, groups={"x": 12}), "h100", "g_x=12", "multiple of 8", "16-byte vector", "array X")
    warnings = check_schedule(Schedule.fused(ew, groups={"x": 16}), "h100")
    assert warnings and "128-byte" in warnings[0] and "64 bf16 values" in warnings[0]
    cons = tile_constraints(Schedule.fused(attention(), groups={"q": 64}, streams={"x": 64}), "h100")["fused"]
    assert cons["x"].multiple == 16 and cons["q"].multiple == 16
    assert len(cons["x"].reasons) == 2  # n=8 in S, k=16 in O: LCM 16


def test_fp32_contractions_have_no_mma_constraint():
    d = attention().with_dtype("fp32")
    assert check_schedule(Schedule.fused(d, groups={"q": 24}, streams={"x": 36}), "h100") is not None


def test_warp_tiles_must_split_the_block_evenly():
    refused(Schedule.fused(attention(), groups={"q": [(96, "SMEM"), (64, "RF")]}, streams={"x": 64}), "h100",
            "g_q=96", "warp tiles")
    refused(Schedule.fused(attention(), groups={"q": [(64, "SMEM"), (8, "RF")]}, streams={"x": 64}), "h100",
            "w_q=8", "multiple of 16", "m=16")
    assert check_schedule(Schedule.fused(attention(), groups={"q": [(128, "SMEM"), (16, "RF")]},
                                         streams={"x": 64}), "h100") == []


def test_unfused_attention_on_h100_is_legal():
    s = Schedule.unfused(attention(q=1024, x=1024, d=64), groups={"q": 16}, streams={"x": 64})
    check_schedule(s, "h100")
    # the softmax kernel holds whole rows: 64 of them do not fit
    refused(Schedule.unfused(attention(q=1024, x=1024, d=64), groups={"q": 64}, streams={"x": 64}), "h100",
            "kernel 'P'", "256.0 KiB", "S_scaled 128.0 KiB")
