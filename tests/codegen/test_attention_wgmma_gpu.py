"""The attention family's Hopper template (wgmma + TMA, ``attention_wgmma.cu.jinja``) on an sm_90
GPU (marked ``gpu``; skipped elsewhere), through ``napkin.codegen.verify``: every configuration at
head dimensions 64 and 128, causal and not, sequence lengths that are not tile multiples (1000,
777, q != x), GQA, sliding windows, ALiBi and soft-capping, bf16 and fp16; fresh random inputs,
NaN-poisoned outputs, relative error against the float64 reference under 1e-2. The planner picks
this template on the GPU at hand where the model predicts it faster.
"""

from __future__ import annotations

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families import attention_wgmma
from napkin.codegen.families.attention import FAMILY
from napkin.diagrams import library

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper("the wgmma attention template")


def sizes(name, **s):
    axes = library.get(name).axes
    base = {"h": 2, "j": 3}
    base.update(s)
    return {k: v for k, v in base.items() if k in axes}


def check(name, dtype, shape, cfg):
    from napkin.codegen.verify import verify

    d = library.get(name).with_dtype(dtype).bind(**shape)
    sched = attention_wgmma.schedule(FAMILY, d, cfg, dtype=dtype)
    assert sched.kernels[0].options.engine == "wgmma"
    report = verify(library.get(name), dtype=dtype, shapes=[shape], family="attention", schedule=sched)
    print(report)
    assert report.ok, str(report)


CFGS = [c for D in attention_wgmma.HEAD_DIMS for c in attention_wgmma.configs(D)]


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: f"d{c.D}-q{c.BQ}-x{c.BX}-s{c.stages}")
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
@pytest.mark.parametrize("qx", [(1000, 1000), (777, 777), (300, 1000), (1000, 129)], ids=str)
def test_every_configuration(name, cfg, qx):
    check(name, "bf16", sizes(name, q=qx[0], x=qx[1], d=cfg.D), cfg)


@pytest.mark.parametrize("name", ["gqa", "attention_window", "attention_alibi", "attention_softcap", "attention"])
@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_library(name, D):
    check(name, "bf16", sizes(name, q=1000, x=1000, d=D), attention_wgmma.configs(D)[0])


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_fp16(name, D):
    check(name, "fp16", sizes(name, q=777, x=1000, d=D), attention_wgmma.configs(D)[0])


def test_long_rows_and_many_heads():
    check("attention_causal", "bf16", sizes("attention_causal", q=4097, x=4097, d=128, h=3),
          attention_wgmma.configs(128)[0])


def test_the_planner_picks_it_where_the_model_predicts_it_faster():
    from napkin.codegen.api import compile as compile_diagram

    d = library.get("mha").bind(h=16, q=4096, x=4096, d=128)
    c = compile_diagram(d)
    engines = [k.kernel.options.engine for k in c.plan.kernels]
    print(engines, [k.template for k in c.program.launches])
    assert engines == ["wgmma"]
    assert [k.template for k in c.program.launches] == ["attention_wgmma.cu.jinja"]


#: (two stages, ping-pong, persistent, one P buffer): None keeps the configuration's own choice
VARIANTS = {"one-stage": (False, False, False, False), "one-stage-persistent": (False, False, True, False),
            "two-stage": (True, False, False, False), "two-stage-persistent": (True, False, True, False),
            "two-stage-1p": (True, False, False, True), "two-stage-1p-persistent": (True, False, True, True),
            "two-stage-pingpong": (True, True, False, None), "two-stage-pingpong-persistent": (True, True, True, None)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", ["mha", "attention_causal", "attention_window"])
@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_every_variant_of_the_loop(name, D, variant):
    """Each way the consumers walk the chunks (one at a time; two stages with two P buffers or
    one; two stages with ping-pong between two warpgroups), one tile a block or persistent, on
    every configuration it applies to and whose tiles fit the registers; chunk counts odd and even
    (the two-stage loop with two P buffers walks them in pairs)."""
    import dataclasses

    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.verify import verify_compiled

    overlap, pingpong, persistent, one_p = VARIANTS[variant]
    for cfg in attention_wgmma.configs(D):
        if pingpong and cfg.consumers != 2:
            continue
        cfg = dataclasses.replace(cfg, overlap=overlap, pingpong=pingpong, persistent=persistent,
                                  one_p=cfg.one_p if one_p is None else one_p)
        if not cfg.fits_registers():
            continue  # S, P and O do not fit: the planner never offers it
        for q, x in ((1000, 1000), (129, 777), (3 * cfg.BX - 5, 3 * cfg.BX)):  # q <= x: rows with keys
            d = library.get(name).bind(**sizes(name, q=q, x=x, d=D))
            program = attention_wgmma.lower_config(FAMILY, d, cfg)
            rows = verify_compiled(CompiledDiagram(program, arch="sm_90a"))
            assert all(r.ok for r in rows), (cfg, q, x, rows)


@pytest.mark.parametrize("name", ["mha", "attention_causal", "gqa"])
@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_the_forward_with_its_log_sum_exp(name, D):
    """The forward with saves (O and the rows' log-sum-exp P_lse, fp32, for the backward) on the
    wgmma template: both outputs NaN-poisoned, against the float64 reference."""
    import math

    import torch

    from napkin.codegen.api import compile as compile_diagram
    from napkin.diagrams.grad import forward_with_saves
    from napkin.diagrams.reference import random_inputs

    f = forward_with_saves(library.get(name), {"O", "P_lse"}).bind(**sizes(name, q=1000, x=777, d=D))
    cands = attention_wgmma.candidates(FAMILY, f, "h100", "bf16")
    assert cands
    c = compile_diagram(f, schedule=cands[0])
    assert [k.template for k in c.program.launches] == ["attention_wgmma.cu.jinja"]
    xs = random_inputs(f, device="cuda", seed=3)
    out = c.empty_outputs(fill=float("nan"))
    c(**xs, out=out)
    torch.cuda.synchronize()
    ref = f.reference({n: t.double() for n, t in xs.items()}, dtype=torch.float64)
    assert out["P_lse"].dtype == torch.float32
    rel = float((out["O"].double() - ref["O"]).norm() / ref["O"].norm())
    lse_err = float((out["P_lse"].double() - ref["P_lse"]).abs().max())
    print(f"{name} d={D}: O {rel:.2e}, lse max abs error {lse_err:.2e}")
    assert rel < 1e-2 and lse_err < 1e-3 * max(1.0, math.log(777))


#: Configurations beyond the tables (three consumers at d = 128, wider chunks at d = 64), built
#: and checked so that a measurement can promote them.
MORE = [attention_wgmma.WgmmaAttentionConfig(128, 64, 3, 3), attention_wgmma.WgmmaAttentionConfig(128, 64, 3, 4),
        attention_wgmma.WgmmaAttentionConfig(128, 96, 2, 2, overlap=True),
        attention_wgmma.WgmmaAttentionConfig(64, 64, 3, 4, overlap=False),
        attention_wgmma.WgmmaAttentionConfig(64, 192, 2, 2, overlap=False)]


@pytest.mark.parametrize("cfg", MORE, ids=str)
@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_more_configurations(name, cfg):
    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.verify import verify_compiled

    for q, x in ((1000, 1000), (129, 777)):
        d = library.get(name).bind(**sizes(name, q=q, x=x, d=cfg.D))
        rows = verify_compiled(CompiledDiagram(attention_wgmma.lower_config(FAMILY, d, cfg), arch="sm_90a"))
        assert all(r.ok for r in rows), (cfg, q, x, rows)


@pytest.mark.parametrize("overlap", [False, True], ids=["one-stage", "two-stage"])
@pytest.mark.parametrize("name", ["mha", "attention_causal", "attention_window", "attention_alibi"])
@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_persistent_blocks_walk_several_tiles(name, D, overlap):
    """Persistent blocks each walking several tiles (40 heads x 1000 queries: 160 to 320 tiles on
    132 SMs at most; and 5 blocks for 3 heads): the K/V ring's slots and phases run on from tile to
    tile, the next tile's Q waits for the last one's S, a head's index (ALiBi's slope) changes
    between tiles; causal and windowed tiles of different lengths, q != x both ways."""
    import dataclasses

    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.verify import verify_compiled

    cfg = attention_wgmma.configs(D)[0]
    cfg = dataclasses.replace(cfg, overlap=overlap, one_p=cfg.one_p and overlap, pingpong=cfg.pingpong and overlap,
                              persistent=True)
    for q, x, h, blocks in ((1000, 1000, 40, None), (1000, 777, 40, None), (777, 1000, 3, 5)):
        d = library.get(name).bind(**sizes(name, q=q, x=x, d=D, h=h))
        program = attention_wgmma.lower_config(FAMILY, d, cfg)
        (launch,) = program.launches
        if blocks:  # a few blocks, each walking many tiles of different lengths
            program = dataclasses.replace(program, launches=(dataclasses.replace(launch, grid=(blocks, 1, 1)),))
        assert program.launches[0].grid[0] < -(-q // cfg.BQ) * h  # fewer blocks than tiles
        rows = verify_compiled(CompiledDiagram(program, arch="sm_90a"))
        assert all(r.ok for r in rows), (cfg, q, x, h, blocks, rows)


@pytest.mark.parametrize("name", ["attention_causal", "mha"])
def test_persistent_tile_counter_resets_on_every_stream(name):
    """The tile counter of a persistent kernel (one word of a zeroed workspace a CUDA stream) is
    back to zero after every launch: 20 launches back to back into NaN-poisoned outputs give the
    same bits as the first (a stale count would hand out no tile past each block's first, leaving
    NaN rows), and three streams running the same compiled kernel at once (each its own counter)
    give those bits too; the counters read zero afterwards."""
    import dataclasses

    import torch

    from napkin.codegen.api import CompiledDiagram

    D = 64
    cfg = dataclasses.replace(attention_wgmma.configs(D)[0], persistent=True)
    d = library.get(name).bind(**sizes(name, h=40, q=1000, x=1000, d=D))
    program = attention_wgmma.lower_config(FAMILY, d, cfg)
    (launch,) = program.launches
    assert launch.grid[0] < 40 * -(-1000 // cfg.BQ) and [b.zeroed for b in program.buffers] == [True]
    c = CompiledDiagram(program, arch="sm_90a")
    torch.manual_seed(0)
    ins = {k: torch.randn(40, 1000, D, device="cuda", dtype=torch.bfloat16) for k in ("Q", "K", "V")}
    ref = torch.nn.functional.scaled_dot_product_attention(ins["Q"], ins["K"], ins["V"],
                                                           is_causal=name == "attention_causal").float()

    def run():
        out = c.empty_outputs(fill=float("nan"))
        c(**ins, out=out)
        return out["O"]

    first = run().clone()
    assert float((first.float() - ref).norm() / ref.norm()) < 1e-2
    for _ in range(20):
        assert torch.equal(run(), first)
    streams = [torch.cuda.Stream() for _ in range(3)]
    outs = [c.empty_outputs(fill=float("nan")) for _ in streams]
    for s, out in zip(streams, outs):
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(4):  # launches on the three streams interleaved, nothing ordering them
        for s, out in zip(streams, outs):
            with torch.cuda.stream(s):
                c(**ins, out=out)
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert all(torch.equal(out["O"], first) for out in outs)
    runner = c._runners[torch.cuda.current_device()]
    assert len(runner._zeroed) >= 4  # the default stream's and each side stream's counter
    assert all(int((t.view(torch.int32) != 0).sum()) == 0 for tensors, _ in runner._zeroed.values() for t in tensors)
