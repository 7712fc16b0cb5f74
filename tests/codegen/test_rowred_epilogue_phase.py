"""The wgmma row reduction's epilogue priced as a phase after its loop (issue #12), without a GPU.

The wgmma template runs a GEMM -> row reduction one tile a block (not persistently): the consumer
warpgroups compute the maps and the reduction after the main loop while the tensor cores wait.
The model prices those maps (the kernel's CUDA-core and SFU work) and the epilogue's stores as a
phase of their own (``epilogue_hbm_bytes``); the persistent plain GEMM keeps its epilogue
overlapped. The planner's picks on "h100" are checked against the measured best plans
(BENCHMARKS.md, "GEMM -> a row reduction wider than a tile").
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.contraction import FAMILY, ContractionFamily, analyze, epilogue_bytes
from napkin.codegen.select import launch_shape, predict_schedule
from napkin.diagrams import Axis, Diagram, array, contract, logsumexp
from napkin.diagrams.ops import map_fn, max_over, reduce, softmax, sum_over
from napkin.perfmodel.hardware import get_gpu


def gemm_rows(kind: str, maps: tuple[str, ...] = ()) -> Diagram:
    """Y[a] = R over c of maps(A·Bᵀ): R a sum, max, logsumexp or softmax."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    x = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    for i, fn in enumerate(maps):
        x = map_fn(fn, x, name=f"m{i}")
    if kind == "softmax":
        return Diagram("rows", softmax(x, c, name="Y"))
    if kind == "logsumexp":
        return Diagram("rows", logsumexp(x, c, name="Y"))
    if kind == "max":
        return Diagram("rows", max_over(x, c, name="Y"))
    if kind == "sum":
        return Diagram("rows", sum_over(x, c, name="Y"))
    return Diagram("rows", reduce(x, c, kind, name="Y"))


def bound(d: Diagram, **sizes) -> Diagram:
    return d.with_dtype("bf16").bind(**sizes)


def split_seconds(d: Diagram) -> float:
    """The model's best split row reduction of ``d`` on an H100."""
    return min(predict_schedule(d, FAMILY, s, "h100").seconds for s in FAMILY.candidates(d, "h100", "bf16"))


def plans(d: Diagram, monkeypatch):
    """(the planner's plan, the plan with the row reduction kept out of the GEMM's epilogue)."""
    from napkin.codegen.planner import derive

    with monkeypatch.context() as m:
        m.setattr(ContractionFamily, "rowred_reason", lambda *a, **k: "left out for the comparison")
        apart = derive(d, gpu="h100", explain=False).plan
    return derive(d, gpu="h100", explain=False).plan, apart


def is_split(plan) -> bool:
    return len(plan.kernels) == 1 and (plan.schedule.kernels[0].options.splits or 1) > 1


def test_the_row_reduction_states_its_epilogue_and_the_persistent_gemm_its_own():
    d = bound(gemm_rows("sum", ("sigmoid",)), a=8192, b=1024, c=1024)
    s = FAMILY.candidates(d, "h100", "bf16")[0]
    shape = launch_shape(d, FAMILY, s, "h100")
    assert shape.epilogue_hbm_bytes == epilogue_bytes(d, analyze(d)) == 8192 * 2
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    gemm = Diagram("g", map_fn("gelu", contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L"),
                               name="Y"))
    g = bound(gemm, a=4096, b=4096, c=4096)
    seen = set()
    for s in FAMILY.candidates(g, "h100", "bf16"):
        if s.kernels[0].options.engine == "wgmma" and not s.kernels[0].options.splits:
            cfg = FAMILY.config_of(analyze(g), s)
            shape = launch_shape(g, FAMILY, s, "h100")
            seen.add(cfg.pingpong)
            if cfg.pingpong:  # its stores run beside the other consumer's loop; its maps do not
                assert shape.epilogue_hbm_bytes == 0 and shape.epilogue_maps
            else:  # both consumers store (and map) before the next tile's loop
                assert shape.epilogue_hbm_bytes == epilogue_bytes(g, analyze(g)) and not shape.epilogue_maps
    assert seen == {True, False}


def test_a_map_before_the_reduction_adds_its_sfu_time_after_the_loop():
    """The split kernel is tensor-bound: a map overlapped with the loop would cost nothing; after
    the loop each SFU operation adds its share of the chip's SFU rate (with the tail)."""
    sizes = dict(a=8192, b=1024, c=1024)
    plain = split_seconds(bound(gemm_rows("sum"), **sizes))
    one = split_seconds(bound(gemm_rows("sum", ("sigmoid",)), **sizes))
    three = split_seconds(bound(gemm_rows("sum", ("sigmoid", "tanh", "exp")), **sizes))
    sfu = 8192 * 1024 / get_gpu("h100").sfu_rate()
    assert one - plain >= 0.9 * sfu
    assert three - one >= 2 * 0.9 * sfu


@pytest.mark.parametrize("kind,sizes", [("sum", dict(a=4096, b=4096, c=11008)),
                                        ("logsumexp", dict(a=4096, b=4096, c=11008)),
                                        ("sum", dict(a=8192, b=1024, c=32000)),
                                        ("max", dict(a=8192, b=1024, c=1024))])
def test_the_split_stays_the_pick_where_it_measured_fastest(kind, sizes, monkeypatch):
    """H100 (bf16): the split ran 5-16 % faster than the GEMM and a row kernel for sum and
    logsumexp (a logsumexp row kernel of two passes then), and gemm_relu_max's split 32.0 us
    against 35.2 apart."""
    maps = ("relu",) if kind == "max" else ()
    plan, apart = plans(bound(gemm_rows(kind, maps), **sizes), monkeypatch)
    assert is_split(plan), plan
    assert plan.seconds < apart.seconds


@pytest.mark.parametrize("sizes", [dict(a=4096, b=4096, c=11008), dict(a=8192, b=1024, c=32000)])
def test_a_logsumexp_of_one_pass_keeps_the_gemm_and_the_row_kernel_apart_on_the_h200(sizes):
    """The logsumexp row kernel reads the logits once now (the max and the sum of exp in one pass):
    on an H200 (bf16, `gemm_logsumexp_ab_s34.txt`) the GEMM and the row kernel apart ran 865.7 us
    against the split's 884.1 at 8192 x 32000 x 1024, 526.0 against 575.3 at 4096 x 11008 x 4096."""
    from napkin.codegen.planner import derive

    plan = derive(bound(gemm_rows("logsumexp"), **sizes), gpu="h200", explain=False).plan
    assert [k.family for k in plan.kernels] == ["contraction", "rowwise"] and not is_split(plan)


@pytest.mark.parametrize("sizes", [dict(a=4096, b=4096, c=11008), dict(a=8192, b=1024, c=32000)])
def test_a_wide_softmax_keeps_the_gemm_and_the_row_kernel_apart(sizes, monkeypatch):
    """Measured on an H100: 584.7 us apart against 595.9 split at 4096 x 11008 x 4096, 1323.4
    against 1357.8 at 8192 x 32000 x 1024 (the split stores the logits after its loop, then
    normalises them in a second launch)."""
    plan, apart = plans(bound(gemm_rows("softmax"), **sizes), monkeypatch)
    assert len(plan.kernels) == 2 and plan.seconds == pytest.approx(apart.seconds)


def test_a_costly_map_chain_moves_the_reduction_out_of_the_gemm(monkeypatch):
    """Maps whose work does not hide behind the loop: three SFU functions before a sum make the
    split dearer than the GEMM and a row kernel, which computes them while it streams. H200
    (bf16, kernels): the split 54.8 us, apart 38.9 (``gemm_map_chain_ab.jsonl``); the split's two
    consumer warpgroups reach a quarter of the SM's rates on its maps
    (``WGMMA_ROWRED_EPILOGUE_RATE``)."""
    d = bound(gemm_rows("sum", ("sigmoid", "tanh", "exp")), a=8192, b=1024, c=1024)
    plan, apart = plans(d, monkeypatch)
    assert split_seconds(d) > apart.seconds
    assert not is_split(plan) and plan.seconds == pytest.approx(apart.seconds)


@pytest.mark.nvcc
@pytest.mark.parametrize("maps", [(), ("sigmoid",)])
def test_the_split_keeps_its_wgmma_pipelined(maps):
    """ptxas serializes every wgmma of a kernel (warning C7514) when the epilogue's reads of the
    accumulators may come before the last wgmma_wait: the split row sum and a sum after a
    sigmoid did so before the accumulators were fenced after the wait."""
    from napkin.kernels.nvcc import nvcc_compile

    d = bound(gemm_rows("sum", maps), a=8192, b=1024, c=1024)
    prog = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a")
    gemm = prog.launches[0]
    usage = nvcc_compile(gemm.source, "sm_90a")
    assert "C7514" not in usage.log and not usage[gemm.name].spills
