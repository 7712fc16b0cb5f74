"""Fusion into the contraction family without a GPU: RMSNorm -> linear as one wgmma kernel (the
norm's row scale factored out of the sum, G folded into the A tiles as they are loaded).

Recognition and refusals, the model's view (the norm streams with the sum), the planner picking
the fused kernel where it is predicted faster and keeping the norm apart where it cannot run, and
the generated sources built with nvcc (marked ``nvcc``).
"""

from __future__ import annotations

import pytest

from napkin.codegen.families.contraction import FAMILY, WGMMA_CONFIGS, MatmulConfig, analyze
from napkin.diagrams import Axis, Diagram, array, contract, library
from napkin.diagrams.ops import map_fn, rmsnorm
from napkin.errors import CodegenError, ScheduleError
from napkin.perfmodel.schedule import Schedule


def norm_linear(gamma: bool = True, w_kmajor: bool = True, epilogue: bool = False, how: str = "rmsnorm",
                dtype: str = "bf16") -> Diagram:
    """Y[r,c] = [silu(. + bias)] Σ_x (norm_x(X)·[G])·W, W stored [c][x] (nn.Linear) or [x][c]."""
    from napkin.diagrams.ops import layernorm

    r, x, c = Axis("r"), Axis("x"), Axis("c")
    X = array("X", r, x, dtype=dtype)
    W = array("W", *((c, x) if w_kmajor else (x, c)), dtype=dtype)
    N = rmsnorm(X, over=x, eps=1e-5, name="N") if how == "rmsnorm" else layernorm(X, over=x, name="N")
    if gamma:
        N = (N * array("G", x, dtype=dtype)).named("Xn")
    Y = contract(N, W, over=x, out=(r, c), name="Y" if not epilogue else "H")
    if epilogue:
        Y = map_fn("silu", map_fn("add", Y, array("bias", c, dtype=dtype)), name="Y")
    return Diagram("norm_linear", Y)


def bound(d: Diagram, **sizes) -> Diagram:
    return d.bind(**{k: v for k, v in sizes.items() if k in d.axes})


SIZES = dict(r=1000, x=520, c=776)


def test_rmsnorm_linear_is_a_contraction_with_a_prologue():
    p = analyze(library.get("rmsnorm_linear"))
    assert (p.A.name, p.B.name, p.a, p.b, p.c, p.G.name) == ("X", "W", "r", "x", "c", "gamma")
    assert p.norm is not None and p.a_kmajor and p.b_kmajor
    no_g = analyze(norm_linear(gamma=False))
    assert no_g.G is None and no_g.norm is not None
    assert analyze(norm_linear(w_kmajor=False)).b_kmajor is False


@pytest.mark.parametrize("d,why", [
    (norm_linear(how="layernorm"), "only rmsnorm"),
], ids=["layernorm"])
def test_prologue_refusals(d, why):
    assert why in FAMILY.explain(d)


def test_prologue_refusals_by_structure():
    r, x, c = Axis("r"), Axis("x"), Axis("c")
    X, W = array("X", r, x), array("W", c, x)
    # the norm is read by the output as well: its values are needed unscaled elsewhere
    N = rmsnorm(X, over=x, name="N")
    assert FAMILY.explain(Diagram("twice", (contract(N, W, over=x, out=(r, c), name="Y"),
                                             N.named("N")))) is not None
    # an addition between the norm and the sum: the row scale does not factor out
    A = (rmsnorm(X, over=x, name="N") + array("B", x)).named("Xb")
    assert "one multiplication" in FAMILY.explain(Diagram("add", contract(A, W, over=x, out=(r, c), name="Y")))
    # the normalised operand stored x first: its rows are not streamed as K-major tiles
    Xt = array("X", x, r)
    why = FAMILY.explain(Diagram("t", contract(rmsnorm(Xt, over=x), W, over=x, out=(r, c), name="Y")))
    assert why is not None and "stored with 'x' last" in why


def test_the_model_streams_a_norm_whose_scale_factors_out():
    """The model costs the fused schedule (the norm streams with the sum) and refuses a norm whose
    scale would not factor out (a layernorm, or an rmsnorm read by something besides the sum)."""
    from napkin.perfmodel.cost import cost

    d = bound(library.get("rmsnorm_linear"), **SIZES)
    s = Schedule.fused(d, groups={"r": 128, "c": 256}, streams={"x": 64}, rf_groups={"r": 64, "c": 256})
    # HBM: X, W and G read once, Y written (the tiles' re-reads come from L2); the norm's output
    # never leaves the kernel
    r, x, c = SIZES["r"], SIZES["x"], SIZES["c"]
    assert cost(s, "h100").levels["HBM"].H_bytes == (r * x + c * x + r * c + x) * 2
    ln = bound(norm_linear(how="layernorm"), **SIZES)
    with pytest.raises(ScheduleError, match="cannot be streamed"):
        cost(Schedule.fused(ln, groups={"r": 128, "c": 256}, streams={"x": 64}), "h100")
    # the norm read by the output as well as by the sum: its values are needed unscaled
    r_, x_, c_ = Axis("r"), Axis("x"), Axis("c")
    N = rmsnorm(array("X", r_, x_), over=x_, name="N")
    both = bound(Diagram("both", (contract(N, array("W", c_, x_), over=x_, out=(r_, c_), name="Y"), N)), **SIZES)
    with pytest.raises(ScheduleError, match="cannot be streamed"):
        cost(Schedule.fused(both, groups={"r": 128, "c": 256}, streams={"x": 64}), "h100")


def _fused_and_apart(d, gpu, monkeypatch):
    """(the best fused kernel's predicted seconds, the plan without the prologue fusion)."""
    from napkin.codegen.families.contraction import ContractionFamily
    from napkin.codegen.planner import derive
    from napkin.codegen.select import predict_schedule

    fused = min(predict_schedule(d, FAMILY, s, gpu).seconds for s in FAMILY.candidates(d, gpu, "bf16"))
    with monkeypatch.context() as m:
        m.setattr(ContractionFamily, "prologue_reason", lambda *a, **k: "left out for the comparison")
        apart = derive(d, gpu=gpu, explain=False).plan
    return fused, apart


@pytest.mark.parametrize("r", [64, 4096])
def test_planner_takes_the_fused_kernel_exactly_when_the_model_says_it_is_faster(r, monkeypatch):
    """The fused kernel is one option among the plans the planner compares: the plan is the fused
    kernel when its prediction beats the norm and the matmul apart, else the two kernels. With the
    prologue's rewrite of the A slots hidden (overlap_operands, as if it cost nothing) the fused
    kernel wins, and the planner takes it."""
    from napkin.codegen.families.contraction import ContractionFamily
    from napkin.codegen.planner import derive

    d = bound(library.get("rmsnorm_linear"), r=r, x=4096, c=4096)
    fused, apart = _fused_and_apart(d, "h100", monkeypatch)
    plan = derive(d, gpu="h100", explain=False).plan
    if fused < apart.seconds:
        assert [set(k.boxes) for k in plan.kernels] == [{"N", "Xn", "Y"}], plan
    else:
        assert len(plan.kernels) == 2 and plan.seconds == pytest.approx(apart.seconds), plan
    der = derive(d, gpu="h100")
    assert any("N+Xn+Y" in line or "N+Xn | Y" in line for line in der.decisions), der.decisions
    estimate = ContractionFamily.launch_estimate
    monkeypatch.setattr(ContractionFamily, "launch_estimate",
                        lambda self, *a, **k: {**estimate(self, *a, **k), "overlap_operands": True})
    fused_hidden, _ = _fused_and_apart(d, "h100", monkeypatch)
    assert fused_hidden < fused  # the rewrite is priced: hiding it makes the kernel faster
    if fused_hidden < apart.seconds:
        plan = derive(d, gpu="h100", explain=False).plan
        assert [set(k.boxes) for k in plan.kernels] == [{"N", "Xn", "Y"}], plan
        assert plan.kernels[0].kernel.options.engine == "wgmma"


def test_no_fused_prologue_without_wgmma():
    from napkin.codegen.planner import derive

    d = bound(library.get("rmsnorm_linear"), r=4096, x=4096, c=4096)
    a100 = derive(d, gpu="a100-80gb", explain=False).plan
    assert len(a100.kernels) == 2
    fp32 = derive(d.with_dtype("fp32"), gpu="h100", explain=False).plan
    assert len(fp32.kernels) == 2
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.candidates(d, "a100-80gb", "bf16")


def test_unaligned_rows_keep_the_norm_apart():
    d = bound(library.get("rmsnorm_linear"), r=77, x=100, c=136)
    with pytest.raises(CodegenError, match="16-byte"):
        FAMILY.candidates(d, "h100", "bf16")


def test_lowered_source_and_arguments():
    d = bound(library.get("rmsnorm_linear"), **SIZES)
    s = FAMILY.candidates(d, "h100", "bf16")[0]
    prog = FAMILY.lower(d, s, "sm_90a")
    (launch,) = prog.launches
    assert "napkin_mm_wgmma_rmsnorm" in launch.name
    assert [a.name for a in launch.args if a.kind == "tmap"] == ["X", "W"]
    assert "gamma" in [a.name for a in launch.args]
    assert "PROLOGUE = true" in launch.source and "row_scale" in launch.source
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.lower(d, FAMILY.schedule(d, FAMILY.configs("bf16")[0]), "sm_90a")
    plain = FAMILY.lower(bound(norm_linear(gamma=False), **SIZES),
                         FAMILY.candidates(bound(norm_linear(gamma=False), **SIZES), "h100", "bf16")[0], "sm_90a")
    assert "gamma" not in [a.name for a in plain.launches[0].args] and "fence_proxy_async" not in \
        plain.launches[0].source.split("PROLOGUE = ")[1]


NVCC_CASES = ([(f"rmsnorm_linear-{c[0]}x{c[1]}", library.get("rmsnorm_linear"), c) for c in WGMMA_CONFIGS]
              + [("no-gamma", norm_linear(gamma=False), WGMMA_CONFIGS[0]),
                 ("W[x,c]-bias-silu", norm_linear(w_kmajor=False, epilogue=True), WGMMA_CONFIGS[1])])


@pytest.mark.nvcc
@pytest.mark.parametrize("name,d,cfg", NVCC_CASES, ids=[c[0] for c in NVCC_CASES])
def test_prologue_builds_without_spills(name, d, cfg):
    from napkin.kernels.nvcc import nvcc_compile

    d = bound(d, **SIZES)
    launch = FAMILY.lower(d, FAMILY.schedule(d, MatmulConfig(False, *cfg, wgmma=True)), "sm_90a").launches[0]
    k = nvcc_compile(launch.source, "sm_90a")[launch.name]
    assert not k.spills and k.stack_bytes == 0 and k.registers <= launch.model_regs_per_thread
    assert k.shared_bytes == 0 and launch.shared_bytes == launch.model_smem_bytes + 1024 + 128


@pytest.mark.nvcc
def test_sm_80_build_keeps_the_norm_apart():
    """For sm_80 the plan is the row-wise norm then mma.sync; both build."""
    from napkin.codegen.lower import lower, prepare
    from napkin.kernels.nvcc import nvcc_compile

    d = prepare(library.get("rmsnorm_linear"), sizes=SIZES, dtype="bf16")
    prog = lower(d, gpu="a100-80gb")
    assert len(prog.launches) == 2 and not any("rmsnorm" in k.name and "mm_" in k.name for k in prog.launches)
    usage = nvcc_compile(prog.source(), "sm_80")
    for launch in prog.launches:
        assert not usage[launch.name].spills


# ---------------------------------------------------------------------------- GEMM -> row reduction

def gemm_rowred(kind: str, dtype: str = "bf16") -> Diagram:
    """GEMM then a reduction along its rows: P = softmax_c(A·Bᵀ), or Y[a] = kind_c(0.5·A·Bᵀ) + bias[a]."""
    from napkin.diagrams.ops import reduce, softmax

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b, dtype=dtype), array("B", c, b, dtype=dtype), over=b, out=(a, c), name="L")
    if kind == "softmax":
        return Diagram("gemm_softmax_rows", softmax(map_fn("scale", L, params=(0.125,), name="S"), over=c, name="P"))
    R = reduce(map_fn("scale", L, params=(0.5,), name="S"), c, kind, name="R")
    return Diagram(f"gemm_{kind}_rows", map_fn("add", R, array("bias", a, dtype=dtype), name="Y"))


ROW_KINDS = ["softmax", "sum", "max", "min", "mean"]


def test_every_row_reduction_the_template_builds_is_taken():
    for kind in ROW_KINDS:
        assert FAMILY.explain(bound(gemm_rowred(kind), a=1000, b=520, c=200)) is None, kind


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_gemm_then_row_reduction_is_one_kernel_when_the_tile_spans_the_row(kind, monkeypatch):
    d = bound(gemm_rowred(kind), a=1000, b=520, c=200)
    p = analyze(d)
    assert p.rowred is not None and (p.a, p.b, p.c) == ("a", "b", "c")
    cands = FAMILY.candidates(d, "h100", "bf16")
    assert cands and {s.kernels[0].options.engine for s in cands} == {"wgmma"}
    # c stays whole in the model's schedule: one block's tile spans the row
    assert all(r.axis != "c" for s in cands for r in s.kernels[0].relabels)
    launch = FAMILY.lower(d, cands[0], "sm_90a").launches[0]
    assert f"napkin_mm_wgmma_{kind}" in launch.name and dict(launch.tunables)["BN"] == 256
    assert launch.grid == (8, 1, 1)  # ceil(1000 / 128) row tiles, one column tile
    # the planner takes it where the model predicts it faster than the GEMM and the reduction apart
    from napkin.codegen.planner import derive
    from napkin.codegen.select import predict_schedule

    fused = min(predict_schedule(d, FAMILY, s, "h100").seconds for s in cands)
    with monkeypatch.context() as m:
        from napkin.codegen.families.contraction import ContractionFamily
        m.setattr(ContractionFamily, "rowred_reason", lambda *a, **k: "left out for the comparison")
        apart = derive(d, gpu="h100", explain=False).plan
    plan = derive(d, gpu="h100", explain=False).plan
    if fused < apart.seconds:
        assert len(plan.kernels) == 1 and set(plan.kernels[0].boxes) == {d.name_of(v) for v in d.nodes}, plan
    else:
        assert len(plan.kernels) > 1, plan


def test_row_reduction_refusals():
    from napkin.codegen.planner import derive

    # no wgmma: the epilogue's quad layout is the wgmma template's
    small = bound(library.get("gemm_softmax"), a=1000, b=520, c=200)
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.candidates(small, "a100-80gb", "bf16")
    assert len(derive(small, gpu="a100-80gb", explain=False).plan.kernels) == 2
    # a reduction over the rows axis a (not along the output tile's rows)
    from napkin.diagrams.ops import reduce

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    assert "last (column) axis" in FAMILY.explain(Diagram("col", reduce(L, a, "sum", name="R")))


@pytest.mark.nvcc
@pytest.mark.parametrize("kind", ROW_KINDS)
def test_row_reduction_builds_without_spills(kind):
    from napkin.kernels.nvcc import nvcc_compile

    for c in (200, 64):
        d = bound(gemm_rowred(kind), a=1000, b=520, c=c)
        for s in FAMILY.candidates(d, "h100", "bf16"):
            launch = FAMILY.lower(d, s, "sm_90a").launches[0]
            k = nvcc_compile(launch.source, "sm_90a")[launch.name]
            assert not k.spills and k.stack_bytes == 0 and k.registers <= launch.model_regs_per_thread
            assert k.shared_bytes == 0 and launch.shared_bytes == launch.model_smem_bytes + 1024 + 128


def test_the_model_refuses_a_norm_multiplied_by_itself():
    """N·(0.5·N) scales by r², not r: the row scale does not factor out of the sum."""
    from napkin.perfmodel.cost import cost

    r, x, c = Axis("r"), Axis("x"), Axis("c")
    N = rmsnorm(array("X", r, x), over=x, name="N")
    sq = (N * map_fn("scale", N, params=(0.5,), name="H")).named("Q")
    d = bound(Diagram("sq", contract(sq, array("W", c, x), over=x, out=(r, c), name="Y")), **SIZES)
    with pytest.raises(ScheduleError, match="cannot be streamed"):
        cost(Schedule.fused(d, groups={"r": 128, "c": 256}, streams={"x": 64}), "h100")
    assert FAMILY.explain(d) is not None


def test_a_map_after_the_row_reduction_reading_the_logits_is_refused():
    from napkin.diagrams.ops import softmax

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    d = Diagram("p_times_l", (softmax(L, over=c, name="P") * L).named("Y"))
    assert "reads a value from before it" in FAMILY.explain(d)


def test_a_contraction_of_a_reduction_is_refused_not_recursed():
    """Σ_b mean_c(X)·W[b,c]: a reduction over c then a contraction whose last axis is c (two
    non-elementwise boxes, one a reduction over the output's last axis) is no GEMM -> row
    reduction: its core is not a plain contraction (the check recursed until Python's limit:
    layernorm's backward hit it)."""
    from napkin.diagrams import Diagram, array, axes, contract, mean_over

    a, b, c = axes("a b c")
    m = mean_over(array("X", a, b, c), c, name="m")
    L = contract(m, array("W", b, c), over=b, name="L")
    why = FAMILY.explain(Diagram("t", L).bind(a=8, b=64, c=64))
    assert why is not None and "computed by another reduction" in why
    from napkin.codegen.planner import derive
    from napkin.diagrams import library

    assert derive(library.get("layernorm").grad(), "h100", "bf16", sizes={"r": 64, "x": 256}).plan.kernels
