"""The streamed attention family: recognition and lowering on the CPU, and the template built with
nvcc (marked ``nvcc``) for every configuration and head dimension (64, 80, 96, 128, 192, 256), the
masks and score modifiers, bf16 and fp16, sm_90a and sm_80, the decode tiles packed and split with
their combining launch: no spills, registers within the configuration's budget, shared memory
within the schedule's footprint (plus row padding) and the arch's limit.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families.attention import CONFIGS, DECODE_CONFIGS, FAMILY, AttentionConfig, analyze
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import Schedule

SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}
LIBRARY = ("attention", "mha", "attention_causal", "gqa", "attention_window", "attention_alibi",
           "attention_softcap")


def bound(name, dtype="bf16", d=128, q=1000, x=1000, **more) -> Diagram:
    dg = library.get(name).with_dtype(dtype) if isinstance(name, str) else name.with_dtype(dtype)
    sizes = {"q": q, "x": x, "d": d, "h": 2, "j": 3, **more}
    return dg.bind(**{k: v for k, v in sizes.items() if k in dg.axes})


def case(name, cfg, arch="sm_90a", dtype="bf16", splits=1, packed=False, q=1000):
    """(id, diagram, configuration, arch); ``cfg`` is (g_q, s_x, w_q, stages, d, blocks per SM[, warps
    along x])."""
    D = cfg[4]
    wx = cfg[6] if len(cfg) > 6 else 1
    more = (f"-k{splits}" if splits > 1 else "") + ("-packed" if packed else "") + (f"-wx{wx}" if wx > 1 else "")
    return (f"{name}-{dtype}-d{D}-q{cfg[0]}x{cfg[1]}w{cfg[2]}s{cfg[3]}{more}", bound(name, dtype, d=D, q=q),
            AttentionConfig(*cfg[:6], splits=splits, packed=packed, wx=wx), arch)


def cfgs(D, table=CONFIGS):
    return [(bq, bx, wq, st, D, nb, *wx) for bq, bx, wq, st, nb, *wx in table[D]]


def decode_cases():
    """The decode tiles: every one at d = 128 and 256 (a warp holds the most there), packed (GQA,
    one query row of three query heads) and split; the first of each other head dimension's table;
    the query heads in grid.y and the 16-row tiles on sm_80 too."""
    out = []
    for D, key in ((64, 64), (80, 128), (96, 128), (128, 128), (192, 192), (256, 256)):
        table = cfgs(key, DECODE_CONFIGS)
        for c in table if D in (128, 256) else table[:1]:
            c = (*c[:4], D, *c[5:])
            out.append(case("gqa", c, "sm_90a", splits=7, packed=True, q=1))
            if c[0] == 16 and D in (96, 128, 256):
                out.append(case("gqa", c, "sm_90a", splits=7, q=1))
            if c[0] == 16 and case("mha", c)[2].smem_bytes() <= SMEM_LIMIT["sm_80"]:
                out.append(case("mha", c, "sm_80", splits=3, q=7))
    return out


CASES = (
    [case("mha", c) for D in (64, 80, 96, 128, 192, 256) for c in cfgs(D)]
    + [case("attention_causal", c, "sm_80") for D in (80, 96, 192) for c in cfgs(D)]
    + [case(n, cfgs(128)[0]) for n in ("attention_causal", "gqa", "attention_window", "attention_alibi",
                                       "attention_softcap")]
    + [case("mha", cfgs(128)[0], dtype="fp16"), case("attention_causal", cfgs(64)[0], dtype="fp16")]
    + [case("mha", cfgs(128)[0], "sm_80"), case("attention_causal", cfgs(64)[0], "sm_80"),
       case("attention_window", cfgs(256)[0], "sm_80")]
    + decode_cases()
    + [case("attention_window", cfgs(128, DECODE_CONFIGS)[0], splits=5, packed=False, q=33),
       case("attention_alibi", cfgs(128, DECODE_CONFIGS)[0], splits=4, q=1)]
)


# ---------------------------------------------------------------------------- CPU tests

def test_library_diagrams_match():
    for name in LIBRARY:
        assert FAMILY.matches(library.get(name)), (name, FAMILY.why_not(library.get(name)))
    for name in ("matmul", "mlp", "softmax", "transformer_block"):
        assert not FAMILY.matches(library.get(name)), name
    assert not FAMILY.matches(library.get("mha").with_dtype("fp32"))  # fp32: the fallback's


def test_gqa_roles():
    p = analyze(library.get("gqa"))
    assert (p.q, p.x, p.d, p.woven) == ("q", "x", "d", ("h", "j"))
    assert "j" not in p.K.axis_names  # K, V broadcast along the query groups


def test_bshd_layout_is_read_from_axis_order():
    q, x, d, h = Axis("q"), Axis("x"), Axis("d"), Axis("h")
    Q, K, V = array("Q", q, h, d), array("K", x, h, d), array("V", x, h, d)
    dg = Diagram("bshd", attention_core(Q, K, V, is_causal=True))
    p = analyze(dg)
    assert p.q == "q" and p.woven == ("h",)
    b = dg.bind(q=100, x=100, h=4, d=64)
    k = FAMILY.lower(b, FAMILY.candidates(b, "h100", "bf16")[0], "sm_90a").launches[0]
    args = {a.name: a.value for a in k.args if a.kind == "int"}
    assert args["sQ_q"] == 4 * 64 and args["sQ_h"] == 64


def test_lower_reads_tiles_from_the_schedule():
    d = bound("attention_causal", d=128)
    s = Schedule.fused(d, groups={"q": 64}, streams={"x": 64}, rf_groups={"q": 16})
    k = FAMILY.lower(d, s, "sm_90a").launches[0]
    assert "constexpr int BQ = 64;" in k.source and "constexpr int BX = 64;" in k.source
    assert "constexpr int WQ = 16;" in k.source and "constexpr int SX = 64;" in k.source
    assert k.block == (128, 1, 1) and k.grid == ((1000 + 63) // 64, 2, 1)
    assert k.model_smem_bytes == (2 * 64 * 128 * 2 + 64 * 128) * 2
    assert dict(k.tunables)["causal"] == 0


def test_register_stream_of_x():
    d = bound("mha", d=128)
    s = Schedule.fused(d, groups={"q": 128}, streams={"x": [(64, "SMEM"), (32, "RF")]}, rf_groups={"q": 32})
    k = FAMILY.lower(d, s, "sm_90a").launches[0]
    assert "constexpr int BX = 64;" in k.source and "constexpr int SX = 32;" in k.source
    bad = Schedule.fused(d, groups={"q": 128}, streams={"x": [(64, "SMEM"), (48, "RF")]}, rf_groups={"q": 32})
    with pytest.raises(CodegenError, match="t_x"):
        FAMILY.lower(d, bad, "sm_90a")


def test_scale_folds_into_exp2_and_masks_come_from_the_diagram():
    d = bound("attention_window", d=64)
    k = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches[0]
    scale = {a.name: a.value for a in k.args if a.kind == "float"}["scale_log2"]
    assert abs(scale - 1.4426950408889634 / 8.0) < 1e-7
    assert dict(k.tunables)["window"] == 256
    assert "i_x > i_q - 256LL" in k.source  # the window as an integer literal (issue #16)
    d = bound("attention_softcap", d=64)
    k = FAMILY.lower(d, FAMILY.candidates(d, "h100", "bf16")[0], "sm_90a").launches[0]
    assert "tanhf" in k.source and "50.0f" in k.source


def test_candidates_fit_and_carry_the_tiles():
    for D in (64, 80, 96, 128, 192, 256):
        d = bound("mha", d=D)
        # the unsplit candidates are the head dimension's table, in order (2 heads x 8 tiles of
        # 128 rows leave SMs idle: each also comes split)
        cands = [s for s in FAMILY.candidates(d, "h100", "bf16")
                 if s.kernels[0].options.splits is None and s.kernels[0].options.engine != "wgmma"]
        assert len(cands) == len(CONFIGS[D])
        for s, c in zip(cands, CONFIGS[D]):
            rel = {(r.axis, r.level, r.kind): r.size for r in s.kernels[0].relabels}
            cfg = AttentionConfig(*c[:4], D, c[4])
            assert rel.get(("x", "RF", "stream"), c[1]) == cfg.SX
            assert rel[("q", "SMEM", "group")] == c[0] and rel[("x", "SMEM", "stream")] == c[1]
            assert rel[("q", "RF", "group")] == c[2]


def test_refusals():
    d = bound("mha", d=128)
    with pytest.raises(CodegenError, match="w_q"):
        FAMILY.lower(d, Schedule.fused(d, groups={"q": 128}, streams={"x": 64}, rf_groups={"q": 64}), "sm_90a")
    with pytest.raises(CodegenError, match="fuse"):
        FAMILY.lower(d, Schedule.unfused(d), "sm_90a")
    with pytest.raises(CodegenError, match="bind"):
        FAMILY.lower(d, Schedule.fused(d, groups={"q": None}, streams={"x": 64}), "sm_90a")
    assert "multiple of 16" in FAMILY.why_not(bound("mha", d=72))


def test_every_head_dimension_is_taken_and_others_refused_with_the_reason():
    for D in (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256):
        assert FAMILY.why_not(bound("mha", d=D)) is None, D
        assert FAMILY.candidates(bound("mha", d=D), "h100", "bf16"), D
    why = FAMILY.why_not(bound("mha", d=72))
    assert "72" in why and "multiple of 16" in why and "80, 96, 128, 192 and 256" in why
    assert "over 256" in FAMILY.why_not(bound("mha", d=272))


def test_head_dims_whose_pieces_do_not_divide_the_threads_load_a_flat_run():
    for D, flat in ((64, False), (80, True), (96, True), (128, False), (192, True), (256, False)):
        c = AttentionConfig(64, 64, 16, 2, D, 2)
        src = FAMILY.lower(bound("mha", d=D), FAMILY.schedule(bound("mha", d=D), c), "sm_90a").launches[0].source
        assert c.kv_columns is not flat
        assert ("a flat run of pieces: every thread starts" in src) is flat, D


# ---------------------------------------------------------------------------- nvcc builds

@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(c):
        name, d, cfg, arch = c
        launches = FAMILY.lower(d, FAMILY.schedule(d, cfg), arch).launches
        return [(launch, nvcc_compile(launch.source, arch)) for launch in launches]

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        results = list(ex.map(build, CASES))
    return dict(enumerate(results))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_builds_without_spills(builds, i):
    name, d, cfg, arch = CASES[i]
    assert len(builds[i]) == 1  # a split's combine runs in the last split block of a tile to arrive
    for launch, usage in builds[i]:
        k = usage[launch.name]
        print(f"{name} {arch} {launch.template}: {k.registers} registers (budget {launch.model_regs_per_thread}), "
              f"{launch.shared_bytes} B shared (model {launch.model_smem_bytes})")
        assert not k.spills, f"{name} {arch}: {k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
        assert k.stack_bytes == 0
        assert k.registers <= launch.model_regs_per_thread
        assert k.shared_bytes == 0
        assert launch.shared_bytes <= SMEM_LIMIT[arch]
        assert launch.shared_bytes <= launch.model_smem_bytes * (cfg.D + 8) / cfg.D  # padding only
