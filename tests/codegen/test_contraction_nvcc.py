"""The tiled contraction family: lowering on the CPU, and every template configuration built with
nvcc for sm_80 and sm_90a (marked ``nvcc``): no spills, registers within the configuration's
budget, shared memory within the schedule's footprint (plus row padding) and the arch's limit.

The builds run in parallel in one module-scoped fixture (one nvcc per configuration and arch).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.contraction import (FAMILY, MMA_CONFIGS, MMA_SMALL_CONFIGS, SIMT_CONFIGS, WGMMA_CONFIGS,
                                                 WGMMA_PINGPONG_CONFIGS, WGMMA_SPLIT_CONFIGS, MatmulConfig,
                                                 _wide_pingpong, analyze, padded_rows)
from napkin.diagrams import Axis, Diagram, array, contract, library
from napkin.diagrams.ops import map_fn
from napkin.errors import CodegenError
from napkin.perfmodel.plan import FALLBACK
from napkin.perfmodel.schedule import KernelOptions, Schedule

SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}


def mm_layout(a_first: bool, b_first: bool, dtype="bf16", name="mm_layout") -> Diagram:
    """C[a,c] = Σ_b A·B with A stored [a][b] or [b][a] and B [b][c] or [c][b]."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    A = array("A", *((a, b) if a_first else (b, a)), dtype=dtype)
    B = array("B", *((b, c) if b_first else (c, b)), dtype=dtype)
    return Diagram(name, contract(A, B, over=b, out=(a, c), name="C"))


def mm_epilogue(dtype="bf16") -> Diagram:
    """Y = silu(A·Bᵀ · 0.5 + bias) + R: scale, broadcast bias, SiLU and a residual."""
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    A, B, bias, R = array("A", a, b, dtype=dtype), array("B", c, b, dtype=dtype), array("bias", c, dtype=dtype), \
        array("R", a, c, dtype=dtype)
    H = contract(A, B, over=b, out=(a, c), name="H")
    Y = map_fn("add", map_fn("silu", map_fn("add", map_fn("scale", H, params=(0.5,)), bias)), R, name="Y")
    return Diagram("mm_epilogue", Y)


def mm_multi_sum(a_kmajor: bool = True, b_kmajor: bool = True, residual: bool = False, dtype="bf16",
                 name="mm_multi_sum") -> Diagram:
    """C[a,c] = Σ_{h,b} A·B, a sum over two axes (attention's output projection, O[h,a,b]·Wo[c,h,b]):
    A stored [h][a][b] or [b][h][a], B [c][h][b] or [h][b][c]; ``residual`` adds R[a,c]."""
    a, b, c, h = Axis("a"), Axis("b"), Axis("c"), Axis("h")
    A = array("A", *((h, a, b) if a_kmajor else (b, h, a)), dtype=dtype)
    B = array("B", *((c, h, b) if b_kmajor else (h, b, c)), dtype=dtype)
    C = contract(A, B, over=(h, b), out=(a, c), name="C")
    if residual:
        C = map_fn("add", C, array("R", a, c, dtype=dtype), name="Y")
    return Diagram(name, C)


def bmm_t(dtype="bf16") -> Diagram:
    """C[n,a,c] = Σ_b A[n,a,b]·B[n,c,b]: batched, both operands stored K-major."""
    n, a, b, c = Axis("n"), Axis("a"), Axis("b"), Axis("c")
    return Diagram("bmm_t", contract(array("A", n, a, b, dtype=dtype), array("B", n, c, b, dtype=dtype), over=b,
                                     out=(n, a, c), name="C"))


SIZES = dict(a=1000, b=520, c=776, n=3, h=3)


def bound(d: Diagram, dtype: str) -> Diagram:
    d = d.with_dtype(dtype)
    return d.bind(**{k: v for k, v in SIZES.items() if k in d.axes})


def case(name: str, d: Diagram, dtype: str, cfg: tuple, arch: str, wgmma: bool = False):
    simt = dtype == "fp32"
    return (name, bound(d, dtype), MatmulConfig(simt, *cfg, wgmma=wgmma), arch)


CASES = (
    [case(f"mlp-bf16-{c[0]}x{c[1]}x{c[2]}", library.get("mlp"), "bf16", c, "sm_90a")
     for c in (*MMA_CONFIGS, *MMA_SMALL_CONFIGS)]
    + [case(f"batched-small-{c[0]}x{c[1]}-{arch}", bmm_t(), "bf16", c, arch)
       for c in MMA_SMALL_CONFIGS for arch in ("sm_80", "sm_90a")]
    + [case(f"mlp-bf16-{c[0]}x{c[1]}x{c[2]}", library.get("mlp"), "bf16", c, "sm_80")
       for c in (MMA_CONFIGS[0], MMA_CONFIGS[4], MMA_CONFIGS[6])]
    + [
        case("matmul-fp16-kn", library.get("matmul"), "fp16", MMA_CONFIGS[2], "sm_90a"),
        case("A[b,a]B[b,c]-bf16", mm_layout(False, True), "bf16", MMA_CONFIGS[0], "sm_90a"),
        case("A[b,a]B[b,c]-bf16", mm_layout(False, True), "bf16", MMA_CONFIGS[2], "sm_80"),
        case("A[b,a]B[c,b]-bf16", mm_layout(False, False), "bf16", MMA_CONFIGS[1], "sm_90a"),
        case("batched-fp16", library.get("batched_matmul"), "fp16", MMA_CONFIGS[4], "sm_90a"),
        case("epilogue-bf16", mm_epilogue(), "bf16", MMA_CONFIGS[0], "sm_90a"),
    ]
    + [case(f"wgmma-mlp-bf16-{c[0]}x{c[1]}", library.get("mlp"), "bf16", c, "sm_90a", True) for c in WGMMA_CONFIGS]
    + [case(f"wgmma-{n}-{dt}", d, dt, WGMMA_CONFIGS[i % len(WGMMA_CONFIGS)], "sm_90a", True)
       for i, (n, d, dt) in enumerate([("A[a,b]B[b,c]", mm_layout(True, True), "bf16"),
                                       ("A[b,a]B[b,c]", mm_layout(False, True), "fp16"),
                                       ("A[b,a]B[c,b]", mm_layout(False, False), "bf16"),
                                       ("epilogue", mm_epilogue(), "fp16")])]
    # the ping-pong kernels: every layout, an epilogue (not on the wide tile: plain products only), a batch
    + [(f"wgmma-pp-{n}-{c[0]}x{c[1]}", bound(d, dt), MatmulConfig(False, *c, wgmma=True, pingpong=True), "sm_90a")
       for c in WGMMA_PINGPONG_CONFIGS
       for n, d, dt in [("A[a,b]B[b,c]", mm_layout(True, True), "bf16"), ("A[b,a]B[c,b]", mm_layout(False, False), "fp16"),
                        ("epilogue", mm_epilogue(), "bf16"), ("batched", bmm_t(), "bf16")]
       if n != "epilogue" or not _wide_pingpong(MatmulConfig(False, *c, wgmma=True, pingpong=True))]
    + [case("wgmma-batched-bf16", bmm_t(), "bf16", WGMMA_CONFIGS[0], "sm_90a", True),
       case("wgmma-batched-kmajor-fp16", bmm_t(), "fp16", WGMMA_CONFIGS[3], "sm_90a", True)]
    + [case("sum-over-2-axes-bf16", mm_multi_sum(residual=True), "bf16", MMA_CONFIGS[0], "sm_90a"),
       case("sum-over-2-axes-bf16", mm_multi_sum(), "bf16", MMA_CONFIGS[4], "sm_80"),
       case("sum-over-2-axes-mn-major-fp16", mm_multi_sum(False, False), "fp16", MMA_CONFIGS[6], "sm_90a"),
       case("sum-over-2-axes-fp32", mm_multi_sum(False, True, residual=True), "fp32", SIMT_CONFIGS[0], "sm_90a")]
    + [case(f"mlp-fp32-{c[0]}x{c[1]}x{c[2]}", library.get("mlp"), "fp32", c, "sm_90a") for c in SIMT_CONFIGS]
    + [case("A[b,a]-batched-fp32", library.get("batched_matmul"), "fp32", SIMT_CONFIGS[0], "sm_80"),
       case("A[b,a]B[c,b]-fp32", mm_layout(False, False), "fp32", SIMT_CONFIGS[2], "sm_80")]
)


# ---------------------------------------------------------------------------- CPU tests

def test_library_diagrams_match():
    for name in ("matmul", "batched_matmul", "matmul_t", "mlp"):
        assert FAMILY.matches(library.get(name)), (name, FAMILY.why_not(library.get(name)))
    for name in ("softmax", "layernorm", "attention", "mha", "transformer_block"):
        assert not FAMILY.matches(library.get(name)), name


def test_roles_and_layouts():
    from napkin.codegen.families.contraction import analyze

    p = analyze(library.get("matmul_t"))
    assert (p.a, p.b, p.c, p.a_kmajor, p.b_kmajor) == ("a", "b", "c", True, True)
    p = analyze(library.get("batched_matmul"))
    assert p.batch == ("n",) and not p.b_kmajor
    p = analyze(mm_layout(False, True))
    assert not p.a_kmajor and not p.b_kmajor


def test_lower_reads_tiles_from_the_schedule():
    d = bound(library.get("mlp"), "bf16")
    s = Schedule.fused(d, groups={"a": 64, "c": 128}, streams={"b": 32}, rf_groups={"a": 32, "c": 64})
    k = FAMILY.lower(d, s, "sm_90a").launches[0]
    assert "constexpr int BM = 64;" in k.source and "constexpr int BN = 128;" in k.source
    assert "constexpr int BK = 32;" in k.source and "constexpr int WM = 32;" in k.source
    assert k.block == (128, 1, 1)
    assert k.grid == ((1000 + 63) // 64 * ((776 + 127) // 128), 1, 1)
    assert [a.name for a in k.args if a.kind == "tensor"] == ["X", "W", "Y", "bias"]
    assert k.model_smem_bytes == 4 * (64 * 32 + 32 * 128) * 2


def test_candidates_are_schedules_with_the_tiles():
    # (more 128 x 128 tiles than SMs: ping-pong is offered only where each consumer gets tiles)
    rows, cols = 2000, 1552
    d = library.get("matmul").with_dtype("bf16").bind(a=rows, b=SIZES["b"], c=cols)
    cands = [s for s in FAMILY.candidates(d, "h100", "bf16") if not s.kernels[0].options.splits]
    wgmma = FAMILY.configs("bf16", "wgmma")
    # every cooperative configuration, each ping-pong one with a cooperative twin (its tile) just before it
    assert [c for c in wgmma if not c.pingpong] == [MatmulConfig(False, *c, wgmma=True) for c in WGMMA_CONFIGS]
    pp = [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS]
    assert [c for c in wgmma if c.pingpong] == [c for x in WGMMA_CONFIGS for c in pp if (c.BM, c.BN) == (x[0], x[1])]
    assert all(wgmma[i + 1].BM == c.BM and wgmma[i + 1].BN == c.BN and not wgmma[i + 1].pingpong
               for i, c in enumerate(wgmma) if c.pingpong)
    assert len(cands) == len(wgmma) + len(MMA_CONFIGS)
    for s, cfg in zip(cands, wgmma):
        o = s.kernels[0].options
        assert s.kernels[0].family == "contraction" and not s.notes
        consumers = 2 if cfg.pingpong else cfg.BM // cfg.WM
        assert (o.engine, o.stages, o.warpgroups) == ("wgmma", cfg.stages, consumers)
        assert FAMILY.config_of(analyze(d), s) == cfg  # the plan's value is what is built
        k = FAMILY.lower(d, s, "sm_90a").launches[0]
        assert k.template == "matmul_wgmma.cu.jinja" and (k.grid, k.block) == (
            (min(132, (rows + cfg.BM - 1) // cfg.BM * ((cols + cfg.BN - 1) // cfg.BN)), 1, 1),
            (128 * (consumers + 1), 1, 1))  # (the persistent grid: a block an SM of the H100's 132 at most)
        # the operands' tensor maps, then the output's (its rows are 16-byte multiples: TMA stores)
        assert [a.kind for a in k.args[:4]] == ["tmap", "tmap", "tmap", "tensor"]
        assert "wgmma.mma_async.sync.aligned.m64n%dk16" % cfg.BN in k.source
        assert (f"PINGPONG = {'true' if cfg.pingpong else 'false'};" in k.source)
        assert dict(k.tunables).get("pingpong", False) == cfg.pingpong
    cands = cands[len(wgmma):]
    for s, cfg in zip(cands, MMA_CONFIGS):
        o = s.kernels[0].options
        assert (o.engine, o.stages, o.warps) == ("mma.sync", cfg[5], (cfg[0] // cfg[3]) * (cfg[1] // cfg[4]))
        rel = {(r.axis, r.level, r.kind): r.size for r in s.kernels[0].relabels}
        assert rel[("a", "SMEM", "group")] == cfg[0] and rel[("c", "SMEM", "group")] == cfg[1]
        assert rel[("b", "SMEM", "stream")] == cfg[2]
        assert rel[("a", "RF", "group")] == cfg[3] and rel[("c", "RF", "group")] == cfg[4]
        k = FAMILY.lower(d, s, "sm_90a").launches[0]
        assert k.model_smem_bytes is not None and k.shared_bytes <= 227 * 1024
    # every configuration fits the A100's 163 KiB per block too
    for s in FAMILY.candidates(d, "a100-80gb", "bf16"):
        assert FAMILY.lower(d, s, "sm_80").launches[0].shared_bytes <= 163 * 1024


def test_refusals():
    d = bound(library.get("matmul"), "bf16")
    bad = Schedule.fused(d, groups={"a": 96, "c": 128}, streams={"b": 32}, rf_groups={"a": 64, "c": 64})
    with pytest.raises(CodegenError, match="divide"):
        FAMILY.lower(d, bad, "sm_90a")
    sym = Schedule.fused(d, groups={"a": None, "c": 128}, streams={"b": 32})
    with pytest.raises(CodegenError, match="bind"):
        FAMILY.lower(d, sym, "sm_90a")
    big = Schedule.fused(d, groups={"a": 128, "c": 256}, streams={"b": 64}, rf_groups={"a": 64, "c": 64})
    with pytest.raises(CodegenError, match="shared memory"):
        FAMILY.lower(d, big.replace(kernels=(big.kernels[0].replace(options=KernelOptions(stages=4)),)), "sm_80")
    # the same tiles with two stages fit the A100 (it is the stages option that is read)
    FAMILY.lower(d, big.replace(kernels=(big.kernels[0].replace(options=KernelOptions(stages=2)),)), "sm_80")


def test_sum_over_several_axes():
    """A sum over (h, b) streams b in chunks and walks h one index at a time: the schedule streams
    h in chunks of 1, the model counts every chunk, and the kernel walks both."""
    d = bound(mm_multi_sum(residual=True), "bf16")
    p = analyze(d)
    assert (p.b, p.k_outer, p.a, p.c, p.batch) == ("b", ("h",), "a", "c", ())
    cands = FAMILY.candidates(d, "h100", "bf16")
    # both templates: B[c][h][b]'s tiles' rows (c) are not next to b, so its tensor map takes c, h
    # and b as dimensions of their own (test_wgmma_views.py)
    assert {c.kernels[0].options.engine for c in cands} == {"wgmma", "mma.sync"}
    assert FAMILY.wgmma_reason(d, "h100") is None
    s = next(c for c in cands if c.kernels[0].options.engine == "mma.sync")
    assert {(r.axis, r.size) for r in s.kernels[0].streams} == {("h", 1), ("b", 64)}
    launch = FAMILY.lower(d, s, "sm_90a").launches[0]
    args = {a.name: a.value for a in launch.args if a.kind in ("int", "i64")}
    # strides along h: A[h][a][b] moves a*b per index, B[c][h][b] moves b
    assert (args["n_h"], args["sA_h"], args["sB_h"], args["K"]) == (3, 1000 * 520, 520, 520)
    assert "h -> outer sum" in launch.source
    # the model: the same traffic as one sum over h*b, three times the loop's chunks
    from napkin.perfmodel.legality import analyze as analyze_plan

    plan = analyze_plan(s)[0]
    assert plan.stream == ("b", 64) and plan.outer_streams == ("h",)
    # A is the contracted axes' layout: B stored with h last cannot stream b in contiguous chunks
    a, b, c, h = Axis("a"), Axis("b"), Axis("c"), Axis("h")
    bad = Diagram("bad", contract(array("A", a, h, b), array("B", c, b, h), over=(h, b), out=(a, c)))
    assert "different contracted axes last" in FAMILY.explain(bad)


def test_a_small_output_over_a_long_sum_splits_it():
    """256 x 256 outputs over K = 262144 are 4 tiles for 132 SMs: the sum is shared by blocks that
    write fp32 partials, and a second launch adds them and applies the epilogue."""
    d = prepare_bound(library.get("mlp"), dict(a=256, b=262144, c=256))
    splits = [s.kernels[0].options.splits or 1 for s in FAMILY.candidates(d, "h100", "bf16")]
    assert max(splits) > 1 and 1 in splits
    from napkin.codegen.planner import derive

    plan = derive(d, gpu="h100", explain=False).plan
    k = plan.kernels[0].kernel
    assert k.options.splits and k.options.splits > 1 and k.options.engine in ("mma.sync", "wgmma"), plan
    prog = FAMILY.lower(d, plan.schedule, "sm_90a")
    main, combine = prog.launches
    (buf,) = prog.buffers
    assert buf.dtype == "fp32" and buf.shape == (k.options.splits, 1, 256, 256)
    t = dict(main.tunables)
    assert main.grid[0] == -(-256 // t["BM"]) * -(-256 // t["BN"]) * k.options.splits
    assert combine.template == "matmul_combine.cu.jinja"
    assert {a.name for a in main.args if a.kind == "tensor"} >= {buf.name}
    # the GELU of the bf16 output, in its 16-bit form
    assert "napkin::hm_gelu(" in combine.source and "x_bias" in combine.source and "SPLITS = " in combine.source
    assert "hm_gelu(" not in main.source.split("extern \"C\"")[1].split("return;")[0]  # partials leave raw
    # a big output is never split; every template splits a small one
    big = prepare_bound(library.get("matmul"), dict(a=4096, b=4096, c=4096))
    assert {s.kernels[0].options.splits for s in FAMILY.candidates(big, "h100", "bf16")} == {None}
    assert {s.kernels[0].options.engine for s in FAMILY.candidates(d, "h100", "bf16")
            if s.kernels[0].options.splits} == {"mma.sync", "wgmma"}


def test_the_small_wgmma_tiles_come_after_the_others_and_only_for_small_outputs():
    """64 x 128, 128 x 64 and 64 x 64 wgmma tiles come only where 128 x 128 tiles leave most SMs
    idle (split over a long sum, and unsplit), after the other configurations; at 256 x 16384 x
    256 the planner takes a split one (the 128 x 256 x 32 split it took before ran 21.5 us of
    kernels on an H100, 64 x 128 x 16 11.5)."""
    from napkin.codegen.planner import derive

    small = {c[:2] for c in WGMMA_SPLIT_CONFIGS}

    def tiles(d):
        return [(FAMILY.config_of(analyze(d), s).BM, FAMILY.config_of(analyze(d), s).BN, s.kernels[0].options.splits)
                for s in FAMILY.candidates(d, "h100", "bf16") if s.kernels[0].options.engine == "wgmma"]

    d = prepare_bound(library.get("matmul"), dict(a=256, b=16384, c=256))
    got = tiles(d)
    assert {(bm, bn) for bm, bn, n in got if n} >= small
    assert {(bm, bn) for bm, bn, n in got if not n} >= small  # (4 tiles of 128 x 128: unsplit too)
    first_small = min(i for i, (bm, bn, n) in enumerate(got) if (bm, bn) in small)
    assert all((bm, bn) in small for bm, bn, n in got[first_small:])
    k = derive(d, gpu="h100", explain=False).plan.kernels[0].kernel
    assert k.options.engine == "wgmma" and k.options.splits > 1 and k.options.warpgroups == 1, k.options
    big = prepare_bound(library.get("matmul"), dict(a=2048, b=4096, c=2048))
    assert not {(bm, bn) for bm, bn, n in tiles(big)} & small


def test_fp32_splits_a_long_sum_too():
    """The fp32 (SIMT) template shares a long sum out as the mma.sync one does: a 256 x 256 output
    over K = 131072 in fp32 was 4 blocks on 132 SMs (0.03x eager on an H200)."""
    from napkin.codegen.planner import derive

    f32 = prepare_bound(library.get("mlp"), dict(a=256, b=131072, c=256), "fp32")
    plan = derive(f32, gpu="h100", explain=False).plan
    k = plan.kernels[0].kernel
    assert k.options.engine in ("simt", "mma.sync") and (k.options.splits or 1) > 1, plan  # FMA or 3xTF32
    main, combine = FAMILY.lower(f32, plan.schedule, "sm_90a").launches
    t = dict(main.tunables)
    assert main.grid[0] == -(-256 // t["BM"]) * -(-256 // t["BN"]) * k.options.splits and combine.template == "matmul_combine.cu.jinja"
    assert "erff(" in combine.source and "erff(" not in main.source.split("extern \"C\"")[1].split("return;")[0]


def prepare_bound(d, sizes, dtype="bf16"):
    return d.with_dtype(dtype).bind(**sizes)


@pytest.mark.nvcc
@pytest.mark.parametrize("build,sizes", [
    (lambda: library.get("mlp"), dict(a=100, b=20000, c=72)),
    (lambda: library.get("batched_matmul"), dict(n=3, a=64, b=10048, c=40)),
    (lambda: mm_multi_sum(b_kmajor=False, residual=True), dict(h=8, a=64, b=4096, c=64)),
], ids=["mlp", "batched", "sum-over-2-axes"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("engine", ["mma.sync", "simt", "wgmma", *(f"wgmma{c[0]}x{c[1]}" for c in WGMMA_SPLIT_CONFIGS)])
def test_split_sums_build_without_spills(build, sizes, arch, engine):
    from napkin.kernels.nvcc import nvcc_compile

    if engine.startswith("wgmma") and arch != "sm_90a":
        pytest.skip("wgmma is sm_90a's")
    d = prepare_bound(build(), sizes, "fp32" if engine == "simt" else "bf16")
    small = {f"wgmma{c[0]}x{c[1]}": MatmulConfig(False, *c, wgmma=True, splits=8) for c in WGMMA_SPLIT_CONFIGS}
    cfg = {"simt": MatmulConfig(True, *SIMT_CONFIGS[0], splits=8),
           "mma.sync": MatmulConfig(False, *MMA_CONFIGS[6], splits=8),
           "wgmma": MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True, splits=8), **small}[engine]
    prog = FAMILY.lower(d, FAMILY.schedule(d, cfg), arch)
    assert len(prog.launches) == 2
    for launch in prog.launches:
        k = nvcc_compile(launch.source, arch)[launch.name]
        assert not k.spills and k.stack_bytes == 0, (launch.name, k)


def test_several_streams_need_one_sum():
    from napkin.errors import ScheduleError
    from napkin.perfmodel.legality import analyze as analyze_plan

    d = bound(library.get("matmul"), "bf16")
    with pytest.raises(ScheduleError, match="streams one axis"):
        analyze_plan(Schedule.fused(d, groups={"a": 128}, streams={"b": 64, "c": 1}))


def test_wgmma_only_where_it_can_run():
    d = bound(library.get("matmul"), "bf16")
    assert FAMILY.wgmma_reason(d, "h200") is None
    assert "sm_80" in FAMILY.wgmma_reason(d, "a100-80gb")
    assert {s.kernels[0].options.engine for s in FAMILY.candidates(d, "a100-80gb", "bf16")} == {"mma.sync"}
    assert "wgmma" in {s.kernels[0].options.engine for s in FAMILY.candidates(d, "h200", "bf16")}
    assert "fp32" in FAMILY.wgmma_reason(bound(library.get("matmul"), "fp32"), "h100")
    # B[n,b,c] per batch element is stored K by rows: b = 520 is not a whole number of chunks, so its
    # tensor map takes n, b and c as dimensions of their own (zeros past b; test_wgmma_views.py)
    bmm = bound(library.get("batched_matmul"), "bf16")
    assert FAMILY.wgmma_reason(bmm, "h100") is None
    from napkin.codegen.families.contraction import operand_view
    assert operand_view(bmm, analyze(bmm), analyze(bmm).B) == (2, 1, 0)
    odd = library.get("matmul").bind(a=1000, b=520, c=770)  # B rows of 770 bf16: 1540 bytes
    assert FAMILY.wgmma_reason(odd, "h100") is None  # lowering copies B into rows of 776 first
    assert padded_rows(odd, analyze(odd)) == {"B": 776}
    prog = FAMILY.lower(odd, FAMILY.candidates(odd, "h100", "bf16")[0], "sm_90a")
    assert [k.template for k in prog.launches] == ["pad_rows.cu.jinja", "matmul_wgmma.cu.jinja"]
    assert [(b.name, b.shape) for b in prog.buffers] == [("B_padded", (520, 776))]
    assert [a.name for a in prog.launches[1].args if a.kind == "tmap"] == ["A", "B_padded"]
    s = FAMILY.schedule(d, MatmulConfig(False, *WGMMA_CONFIGS[0], wgmma=True))
    with pytest.raises(CodegenError, match="wgmma"):
        FAMILY.lower(d, s, "sm_80")
    bad = MatmulConfig(False, 128, 256, 32, 64, 256, 4, 1, wgmma=True)
    with pytest.raises(CodegenError, match="must be 64"):
        FAMILY.lower(d, FAMILY.schedule(d, bad), "sm_90a")
    bad = MatmulConfig(False, 256, 256, 64, 128, 256, 3, 1, wgmma=True)
    with pytest.raises(CodegenError, match="accumulators"):
        FAMILY.lower(d, FAMILY.schedule(d, bad), "sm_90a")


def test_lowering_for_sm_80_with_a_hopper_profile_takes_mma_sync():
    from napkin.codegen.lower import lower

    d = library.get("matmul").bind(a=4096, b=4096, c=4096)  # large enough that wgmma clearly wins on an H100
    p = lower(d, gpu="h100", arch="sm_90a")
    assert p.plan.kernels[0].kernel.options.engine == "wgmma"
    assert p.launches[0].template == "matmul_wgmma.cu.jinja"
    p = lower(d, gpu="h100", arch="sm_80")
    assert p.family == "contraction" and p.plan.arch == "sm_80"
    assert p.plan.kernels[0].kernel.options.engine == "mma.sync"
    assert p.launches[0].template == "matmul_mma.cu.jinja"


def test_wgmma_ranked_first_on_hopper():
    from napkin.codegen.select import rank_candidates

    d = library.get("matmul").bind(a=4096, b=4096, c=4096)
    ranked = rank_candidates(d, FAMILY, "h100")
    assert ranked[0][0].kernels[0].options.engine == "wgmma"
    best_mma = min(t for s, t in ranked if s.kernels[0].options.engine != "wgmma")
    assert ranked[0][1] < best_mma  # the model sees the mma.sync path's lower tensor rate


def test_fp32_simt_source():
    d = bound(library.get("matmul_t"), "fp32")
    fma = [s for s in FAMILY.candidates(d, "h100", "fp32") if s.kernels[0].options.engine == "simt"]
    k = FAMILY.lower(d, fma[0], "sm_90a").launches[0]
    assert k.template == "matmul_simt.cu.jinja" and "fmaf" in k.source and "mma" not in k.name


# ---------------------------------------------------------------------------- nvcc builds

@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(c):
        name, d, cfg, arch = c
        launch = FAMILY.lower(d, FAMILY.schedule(d, cfg), arch).launches[0]
        return launch, nvcc_compile(launch.source, arch)

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        results = list(ex.map(build, CASES))
    return {i: r for i, r in enumerate(results)}


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_builds_without_spills(builds, i):
    name, d, cfg, arch = CASES[i]
    launch, usage = builds[i]
    k = usage[launch.name]
    print(f"{name} {arch}: {k.registers} registers (budget {launch.model_regs_per_thread}), "
          f"{launch.shared_bytes} B shared (model {launch.model_smem_bytes})")
    assert not k.spills, f"{name} {arch}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
    assert k.stack_bytes == 0
    assert k.registers <= launch.model_regs_per_thread
    assert k.shared_bytes == 0  # all shared memory is the dynamic amount the launch asks for
    assert launch.shared_bytes <= SMEM_LIMIT[arch]
    if cfg.wgmma:  # the ring plus 1 KB of alignment slack, 128 B of barriers and (persistent) the
        # padded staging blocks, or 1 KB for the barriers and the swizzled blocks of TMA stores
        staging = 128
        if dict(launch.tunables).get("persistent"):
            swizzled = 1024 + cfg.consumers * cfg.staging_blocks(2) * 64 * 64 * 2
            staging = max(128 + cfg.consumers * 64 * 72 * 2, swizzled)
        assert launch.shared_bytes == launch.model_smem_bytes + 1024 + staging
        return
    assert launch.shared_bytes <= launch.model_smem_bytes * 1.25 or launch.shared_bytes <= \
        cfg.BM * (cfg.BN + 8) * (4 if cfg.simt else 2)  # padding of 8 per row, or the staging tile


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_padded_operands_build(arch, dtype):
    """Rows of 2949 and 5921 elements: both operands are copied into padded rows first; every launch
    of the program builds without spills."""
    from napkin.codegen.lower import lower, prepare
    from napkin.kernels.nvcc import nvcc_compile

    d = prepare(library.get("matmul"), sizes=dict(a=8205, b=2949, c=5921), dtype=dtype)
    prog = lower(d, gpu="h100" if arch == "sm_90a" else "a100-80gb")
    assert [k.template for k in prog.launches][:2] == ["pad_rows.cu.jinja"] * 2
    usage = nvcc_compile(prog.source(), arch)
    for launch in prog.launches:
        k = usage[launch.name]
        assert not k.spills and k.stack_bytes == 0, (launch.name, k)


def gate_up(b_kmajor: bool = True, dtype="bf16") -> Diagram:
    """H[a,f] = silu(Σ_b X·Wg) ⊙ Σ_b X·Wu: SwiGLU's gate and up, the weights stored [f][b] or [b][f]."""
    from napkin.diagrams import silu

    a, b, f = Axis("a"), Axis("b"), Axis("f")
    X = array("X", a, b, dtype=dtype)
    Wg, Wu = (array(n, *((f, b) if b_kmajor else (b, f)), dtype=dtype) for n in ("Wg", "Wu"))
    G = silu(contract(X, Wg, over=b, out=(a, f), name="G_lin"), name="G")
    return Diagram("gate_up", (G * contract(X, Wu, over=b, out=(a, f), name="U")).named("H"))


def test_a_dual_contraction_shares_its_rows_operand():
    """SwiGLU's gate and up read X once: one wgmma kernel keeps both sums (one wgmma of twice the
    columns) and its epilogue combines them; where the GPU has no wgmma the family says why."""
    d = prepare_bound(gate_up(), dict(a=1000, b=512, f=776))
    p = analyze(d)
    assert p.dual and (p.A.name, p.B.name, p.B2.name) == ("X", "Wg", "Wu")
    cands = FAMILY.candidates(d, "h100", "bf16")
    assert cands and {s.kernels[0].options.engine for s in cands} == {"wgmma"}
    launch = FAMILY.lower(d, cands[0], "sm_90a").launches[0]
    assert [a.name for a in launch.args if a.kind == "tmap"] == ["X", "Wg", "Wu", "H"]  # H leaves by TMA
    assert "acc2" in launch.source and "m64n256k16" in launch.source and "napkin_mm_wgmma_dual" in launch.name
    with pytest.raises(CodegenError, match="wgmma template only"):
        FAMILY.candidates(d, "a100-80gb", "bf16")
    from napkin.codegen.planner import derive

    plan = derive(prepare_bound(library.get("swiglu"), dict(a=4096, b=4096, f=11008)), gpu="h100", explain=False).plan
    assert [set(k.boxes) for k in plan.kernels] == [{"G_lin", "G", "U", "H"}, {"Y"}], plan
    a100 = derive(prepare_bound(library.get("swiglu"), dict(a=4096, b=4096, f=11008)), gpu="a100-80gb",
                  explain=False).plan
    # no kernel holds both sums there (the gate's map runs in an epilogue or in a kernel of its own)
    assert sum(k.family == "contraction" for k in a100.kernels) == 3 and FALLBACK not in a100.families
    assert not any({"G_lin", "U"} <= set(k.boxes) for k in a100.kernels), a100
    # not a dual: two contractions that share no operand, or whose other operands differ in layout
    a, b, f = Axis("a"), Axis("b"), Axis("f")
    X, Z = array("X", a, b), array("Z", a, b)
    apart = Diagram("apart", (contract(X, array("W", f, b), over=b, out=(a, f))
                              * contract(Z, array("V", f, b), over=b, out=(a, f))).named("H"))
    assert "share exactly one" in FAMILY.explain(prepare_bound(apart, dict(a=8, b=8, f=8)))
    mixed = Diagram("mixed", (contract(X, array("W", f, b), over=b, out=(a, f))
                              * contract(X, array("V", b, f), over=b, out=(a, f))).named("H"))
    assert "stored alike" in FAMILY.explain(prepare_bound(mixed, dict(a=8, b=8, f=8)))


@pytest.mark.nvcc
@pytest.mark.parametrize("b_kmajor", [True, False], ids=["W[f,b]", "W[b,f]"])
def test_dual_contraction_builds_without_spills(b_kmajor):
    from napkin.codegen.families.contraction import DUAL_CONFIGS, DUAL_PINGPONG_CONFIGS
    from napkin.kernels.nvcc import nvcc_compile

    d = prepare_bound(gate_up(b_kmajor), dict(a=1000, b=512, f=776))
    cfgs = [MatmulConfig(False, *c, wgmma=True, dual=True) for c in DUAL_CONFIGS]
    cfgs += [MatmulConfig(False, *c, wgmma=True, dual=True, pingpong=True) for c in DUAL_PINGPONG_CONFIGS]
    for cfg in cfgs:
        launch = FAMILY.lower(d, FAMILY.schedule(d, cfg), "sm_90a").launches[0]
        k = nvcc_compile(launch.source, "sm_90a")[launch.name]
        assert not k.spills and k.stack_bytes == 0 and k.registers <= launch.model_regs_per_thread
        # the two consumers' staging blocks beside the ring (persistent): padded, or swizzled for TMA stores
        staging = max(128 + 2 * 64 * 72 * 2, 1024 + 2 * cfg.staging_blocks(2) * 64 * 64 * 2)
        assert launch.shared_bytes == launch.model_smem_bytes + 1024 + staging <= SMEM_LIMIT["sm_90a"]
