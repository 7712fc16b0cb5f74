"""GEMM -> a row reduction wider than a tile (issue #12, part 2), without a GPU: logsumexp read as a
row reduction, the split form (each block's rows reduced to fp32 partials, a second launch combining
them), the model's price of it against the GEMM and the row-wise kernel apart, the generated
sources built with nvcc for sm_90a, and the interpreter running the planned schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from napkin.codegen.families.contraction import FAMILY, ContractionFamily, MatmulConfig, analyze
from napkin.diagrams import Axis, Diagram, array, contract, logsumexp
from napkin.diagrams.ops import causal, map_fn, max_over, sum_over
from napkin.errors import CodegenError

try:
    from .test_contraction_fusion import ROW_KINDS, bound, gemm_rowred
except ImportError:  # tests/codegen is not a package: pytest puts its folder on sys.path
    from test_contraction_fusion import ROW_KINDS, bound, gemm_rowred

KINDS = [*ROW_KINDS, "logsumexp"]


def gemm_lse(dtype: str = "bf16", mask: bool = False, scale: float = 0.5) -> Diagram:
    """Y[a] = logsumexp_c(scale·A·Bᵀ) (optionally causal-masked: -inf past the diagonal) + bias[a]."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b, dtype=dtype), array("B", c, b, dtype=dtype), over=b, out=(a, c), name="L")
    S = map_fn("scale", L, params=(scale,), name="S")
    if mask:
        S = causal(S, a, c, name="M")
    return Diagram("gemm_lse_rows", map_fn("add", logsumexp(S, c, name="R"), array("bias", a, dtype=dtype), name="Y"))


def diagram_of(kind: str) -> Diagram:
    return gemm_lse() if kind == "logsumexp" else gemm_rowred(kind)


def test_logsumexp_is_a_row_reduction():
    for c in (200, 4100):
        d = bound(gemm_lse(), a=1000, b=520, c=c)
        p = analyze(d)
        assert p.rowred_kind == "logsumexp" and d.name_of(p.rowred_x) == "S" and d.name_of(p.rowred) == "R"
        launches = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches
        assert "napkin_mm_wgmma_logsumexp" in launches[0].name
        assert len(launches) == (1 if c <= 256 else 2)


def test_a_max_and_a_sum_that_are_not_a_logsumexp_are_refused():
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    # log(sum(exp(L))) + max(L): no zero_inf shift inside the exponent
    d = Diagram("not_lse", map_fn("add", map_fn("log", sum_over(map_fn("exp", L), c)), max_over(L, c), name="Y"))
    assert "not a logsumexp" in FAMILY.explain(d)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_wider_than_a_tile_is_split(kind):
    M, N = 1000, 4100
    d = bound(diagram_of(kind), a=M, b=520, c=N)
    cands = FAMILY.candidates(d, "h100", "bf16")
    assert cands and all(r.axis != "c" for s in cands for r in s.kernels[0].relabels)  # c stays whole
    seen = set()
    for s in cands:
        prog = FAMILY.lower(d, s, "sm_90a")
        gemm, second = prog.launches
        t = dict(gemm.tunables)
        tiles = t["splits"]
        assert tiles == math.ceil(N / t["BN"]) and t["BN"] <= 256 and t["row_reduction"] == kind
        assert gemm.grid == (math.ceil(M / t["BM"]) * tiles, 1, 1)
        assert second.template == "matmul_wgmma_rowcombine.cu.jinja" and dict(second.tunables)["TILES"] == tiles
        stats = 2 if kind in ("softmax", "logsumexp") else 1
        (buf,) = prog.buffers
        assert buf.shape == (M, tiles, stats) and buf.dtype == "fp32"
        assert "ROWSPLIT = " not in gemm.source  # a template branch, not a runtime flag
        # the model prices the partials written and read back, and a softmax's logits stored and
        # read and written again by the second launch, as one extra launch
        est = FAMILY.launch_estimate(d, s)
        moved = 2 * 4 * M * tiles * stats + (2 * M * N * 2 if kind == "softmax" else 0)
        assert est["extra_launches"] == 1 and est["extra_hbm_bytes"] == moved
        assert est["blocks"] == gemm.grid[0]
        seen.add(t["BN"])
    assert len(seen) > 1  # several tile widths proposed


def test_split_schedules_are_checked():
    d = bound(gemm_rowred("sum"), a=1000, b=520, c=4100)
    s = FAMILY.schedule(d, MatmulConfig(False, 128, 256, 64, 64, 256, 4, wgmma=True, splits=17))
    assert dict(FAMILY.lower(d, s, "sm_90a").launches[0].tunables)["BN"] == 256
    # 4100 columns in 8 tiles would need 576 columns a tile
    with pytest.raises(CodegenError, match="at most 256 .splits >= 17"):
        FAMILY.lower(d, FAMILY.schedule(d, MatmulConfig(False, 128, 256, 64, 64, 256, 4, wgmma=True, splits=8)),
                     "sm_90a")
    # the split form is the wgmma template's: a schedule asking mma.sync for it is refused
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.lower(bound(gemm_rowred("sum"), a=1000, b=520, c=200),
                     FAMILY.schedule(bound(gemm_rowred("sum"), a=1000, b=520, c=200),
                                     MatmulConfig(False, 128, 256, 64, 64, 256, 4, splits=2)), "sm_90a")


def test_ampere_keeps_the_gemm_and_the_row_kernel_apart():
    from napkin.codegen.planner import derive

    d = bound(gemm_lse(), a=1000, b=520, c=4100)
    with pytest.raises(CodegenError, match="wgmma template only .elsewhere the GEMM and a row-wise kernel"):
        FAMILY.candidates(d, "a100-80gb", "bf16")
    assert len(derive(d, gpu="a100-80gb", explain=False).plan.kernels) == 2


@pytest.mark.parametrize("kind,sizes", [("sum", dict(a=4096, b=4096, c=11008)),
                                        ("logsumexp", dict(a=4096, b=4096, c=11008)),
                                        ("softmax", dict(a=4096, b=1024, c=4096))])
def test_the_planner_takes_the_split_where_the_model_predicts_it_faster(kind, sizes, monkeypatch):
    from napkin.codegen.planner import derive
    from napkin.codegen.select import predict_schedule

    d = bound(diagram_of(kind), **sizes)
    fused = min(predict_schedule(d, FAMILY, s, "h100").seconds for s in FAMILY.candidates(d, "h100", "bf16"))
    with monkeypatch.context() as m:
        m.setattr(ContractionFamily, "rowred_reason", lambda *a, **k: "left out for the comparison")
        apart = derive(d, gpu="h100", explain=False).plan
    plan = derive(d, gpu="h100", explain=False).plan
    assert len(apart.kernels) == 2
    if fused < apart.seconds:
        assert len(plan.kernels) == 1 and plan.schedule.kernels[0].options.splits > 1, plan
    else:
        assert len(plan.kernels) == 2, plan
    if kind != "softmax":
        # the logits never reach HBM: 2 x 4096 x 11008 bytes less than the plan apart moves
        assert fused < apart.seconds


@pytest.mark.nvcc
@pytest.mark.parametrize("kind", KINDS)
def test_split_sources_build_without_spills(kind):
    from napkin.kernels.nvcc import nvcc_compile

    for c in (1000, 11008):
        d = bound(diagram_of(kind), a=1000, b=520, c=c)
        cands = FAMILY.candidates(d, "h100", "bf16")
        for s in cands if c == 1000 else cands[:1]:
            prog = FAMILY.lower(d, s, "sm_90a")
            usage = nvcc_compile(prog.source(), "sm_90a")
            gemm, second = prog.launches
            k = usage[gemm.name]
            assert not k.spills and k.stack_bytes == 0 and k.registers <= gemm.model_regs_per_thread
            assert not usage[second.name].spills and usage[second.name].stack_bytes == 0


@pytest.mark.nvcc
def test_one_tile_logsumexp_builds_without_spills():
    from napkin.kernels.nvcc import nvcc_compile

    d = bound(gemm_lse(mask=True), a=1000, b=520, c=200)
    launch = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches[0]
    k = nvcc_compile(launch.source, "sm_90a")[launch.name]
    assert not k.spills and k.stack_bytes == 0


@pytest.mark.parametrize("mask", [False, True])
def test_the_interpreter_runs_the_split_schedule(mask):
    """The contraction family's schedule for GEMM -> logsumexp over a row wider than a tile (c whole
    in the model, split by the family) gives torch's logsumexp when the interpreter runs it."""
    import torch

    from napkin.perfmodel import interpret

    M, K, N = 300, 130, 700  # (the interpreter takes no group larger than its axis)
    d = bound(gemm_lse(mask=mask), a=M, b=K, c=N)
    schedule = FAMILY.candidates(d, "h100", "bf16")[0]
    assert len(schedule.kernels) == 1 and schedule.kernels[0].family == "contraction", schedule
    assert FAMILY.config_of(analyze(d), schedule).splits == 3  # 700 columns in tiles of 256
    rng = np.random.default_rng(0)
    inputs = {"A": rng.standard_normal((M, K)), "B": rng.standard_normal((N, K)), "bias": rng.standard_normal(M)}
    got = interpret(schedule, inputs).outputs["Y"]
    S = 0.5 * torch.tensor(inputs["A"]) @ torch.tensor(inputs["B"]).T
    if mask:
        S = S.masked_fill(torch.ones(M, N, dtype=torch.bool).triu(1), -math.inf)
    want = torch.logsumexp(S, dim=1) + torch.tensor(inputs["bias"])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)
