"""The attention family's Hopper template (``attention_wgmma.py``, ``attention_wgmma.cu.jinja``) on
the CPU: which diagrams it takes and why not, the planner's choice (wgmma on an H100 at d = 64 and
128, mma.sync on an A100), the lowering of a schedule's tiles and its refusals, and the template
built with nvcc for sm_90a (marked ``nvcc``) in every configuration (and with ping-pong): no spills
(the one configuration that spills a few bytes with ALiBi's extra registers is named), no wgmma
serialised by ptxas (warning C7513), no stack.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from napkin.codegen.families import attention_wgmma as W
from napkin.codegen.families.attention import FAMILY, analyze
from napkin.codegen.planner import derive
from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.library import attention_core
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import Schedule


def bound(name, dtype="bf16", d=128, q=1000, x=1000, **more) -> Diagram:
    dg = library.get(name).with_dtype(dtype)
    sizes = {"q": q, "x": x, "d": d, "h": 2, "j": 3, **more}
    return dg.bind(**{k: v for k, v in sizes.items() if k in dg.axes})


def test_reasons():
    d = bound("mha")
    p = analyze(d)
    assert W.wgmma_reason(p, d, "h100") is None
    assert "sm_90a" in W.wgmma_reason(p, d, "a100-80gb")
    assert "sm_90a" in W.wgmma_reason(p, d, arch="sm_80")
    d112 = bound("mha", d=112)
    assert "head dimension 112" in W.wgmma_reason(analyze(d112), d112, "h100")
    q, x, dd, h = Axis("q"), Axis("x"), Axis("d"), Axis("h")
    bshd = Diagram("bshd", attention_core(array("Q", q, h, dd), array("K", x, h, dd), array("V", x, h, dd)))
    b = bshd.bind(q=100, x=100, h=4, d=64)
    assert "second to last" in W.wgmma_reason(analyze(b), b, "h100")
    assert not W.candidates(FAMILY, b, "h100", "bf16")  # the mma.sync tiles run it


@pytest.mark.parametrize("name", ["mha", "attention_causal", "gqa"])
@pytest.mark.parametrize("D", [64, 128])
def test_derive_picks_wgmma_on_hopper_and_mma_sync_on_ampere(name, D):
    d = bound(name, d=D, q=4096, x=4096, h=4)
    plan = derive(d, "h100", "bf16", explain=False).plan
    (k,) = plan.kernels
    assert k.family == "attention" and k.kernel.options.engine == "wgmma"
    assert k.kernel.options.warpgroups in (2, 3) and k.kernel.options.stages >= 2
    prog = FAMILY.lower(d, plan.schedule, "sm_90a")
    assert [x.template for x in prog.launches] == ["attention_wgmma.cu.jinja"]
    plan = derive(d, "a100-80gb", "bf16", explain=False).plan
    assert plan.kernels[0].kernel.options.engine == "mma.sync"


def test_decode_keeps_the_mma_sync_tiles():
    d = bound("gqa", q=1, x=8192, h=8, j=4)
    assert not W.candidates(FAMILY, d, "h100", "bf16")


def test_lower_reads_the_tiles_and_options():
    d = bound("attention_causal", d=128)
    cfg = W.configs(128)[0]
    s = W.schedule(FAMILY, d, cfg)
    opts = s.kernels[0].options
    assert (opts.engine, opts.warpgroups, opts.stages) == ("wgmma", cfg.consumers, cfg.stages)
    (k,) = FAMILY.lower(d, s, "sm_90a").launches
    assert f"constexpr int BX = {cfg.BX};" in k.source and f"constexpr int CONSUMERS = {cfg.consumers};" in k.source
    tiles = -(-1000 // cfg.BQ) * 2
    assert k.block == (128 * (cfg.consumers + 1), 1, 1)
    assert k.grid == ((min(tiles, 132), 1, 1) if cfg.persistent else (-(-1000 // cfg.BQ), 2, 1))
    assert k.shared_bytes == cfg.smem_bytes() and k.model_smem_bytes == (cfg.BQ * 128 + 2 * cfg.stages * cfg.BX * 128) * 2
    assert dict(k.tunables)["causal"] == 0 and dict(k.tunables)["engine"] == "wgmma"
    assert {a.kind for a in k.args} >= {"tmap", "tensor", "int", "float"}
    est = FAMILY.launch_estimate(d, s, "h100")
    assert est["tensor_path"] == "peak" and est["threads"] == k.block[0]
    assert FAMILY.builds_for(s, "sm_90a") and not FAMILY.builds_for(s, "sm_80")


def test_refusals():
    d = bound("mha", d=128)
    with pytest.raises(CodegenError, match="sm_90a"):
        FAMILY.lower(d, W.schedule(FAMILY, d, W.configs(128)[0]), "sm_80")
    bad = Schedule.fused(d, groups={"q": 128, "h": 1}, streams={"x": 128}, rf_groups={"q": 32})
    bad = bad.replace(kernels=(bad.kernels[0].replace(family="attention", options=W.configs(128)[0].options()),))
    with pytest.raises(CodegenError, match="w_q"):
        FAMILY.lower(d, bad, "sm_90a")
    bad = Schedule.fused(d, groups={"q": 192, "h": 1}, streams={"x": 128}, rf_groups={"q": 64})
    bad = bad.replace(kernels=(bad.kernels[0].replace(family="attention", options=W.configs(128)[0].options()),))
    with pytest.raises(CodegenError, match="64 x the consumer warpgroups"):
        FAMILY.lower(d, bad, "sm_90a")
    d64 = bound("mha", d=64)
    with pytest.raises(CodegenError, match="ping-pong"):
        W.lower_config(FAMILY, d64, dataclasses.replace(W.configs(64)[2], pingpong=True))  # three consumers
    with pytest.raises(CodegenError, match="one P buffer"):
        W.lower_config(FAMILY, d64, dataclasses.replace(W.configs(64)[0], overlap=False, one_p=True))
    g = bound("gqa", d=128)
    with pytest.raises(CodegenError, match="persistent"):
        W.lower_config(FAMILY, g, dataclasses.replace(W.configs(128)[0], pack=3, persistent=True))


@pytest.mark.parametrize("gpu, sms", [("h100", 132), ("a100-80gb", 108)])
def test_persistent_blocks_take_one_sm_each_and_walk_every_tile(gpu, sms):
    """A persistent launch has min(tiles, SMs) blocks in one row and a zeroed one-word workspace
    (the tile counter); a grid of one tile a block has the tiles as its grid and no workspace;
    packed tiles stay one tile a block, and the table's configurations are persistent as
    PERSISTENT says, with a twin of one tile a block behind each persistent one."""
    d = bound("attention_causal", d=64, q=4096, x=4096, h=16)
    cfg = dataclasses.replace(W.configs(64)[0], persistent=True)
    program = W.lower_config(FAMILY, d, cfg, gpu=gpu)
    (k,) = program.launches
    assert k.grid == (sms, 1, 1) and dict(k.tunables)["persistent"] is True
    assert "atomicAdd(tile_counter" in k.source and "qempty" in k.source
    (buf,) = program.buffers
    assert buf.zeroed and buf.shape == (1,) and any(a.name == buf.name for a in k.args)
    (one,) = W.lower_config(FAMILY, bound("mha", d=64, q=300, h=1), cfg).launches
    assert one.grid == (-(-300 // cfg.BQ), 1, 1)  # fewer tiles than SMs: one block a tile
    single = W.lower_config(FAMILY, d, dataclasses.replace(cfg, persistent=False))
    (k,) = single.launches
    assert k.grid == (4096 // cfg.BQ, 16, 1) and dict(k.tunables)["persistent"] is False and not single.buffers
    g = bound("gqa", d=128, q=4096, x=4096, h=4, j=4)
    packed = [s for s in W.candidates(FAMILY, g, "h100", "bf16") if W.config_of(FAMILY.problem(g), g, s).pack > 1]
    assert packed and not W.config_of(FAMILY.problem(g), g, packed[0]).persistent
    unpacked = W.candidates(FAMILY, d, "h100", "bf16")[0]
    assert W.config_of(FAMILY.problem(d), d, unpacked).persistent is (W.configs(64)[0].BX in W.PERSISTENT[64])
    got = [W.config_of(FAMILY.problem(d), d, s) for s in W.candidates(FAMILY, d, "h100", "bf16")]
    for c in W.configs(64):
        assert got.count(c) == 1 and got.count(dataclasses.replace(c, persistent=False)) == 1
        assert c.persistent is (c.BX in W.PERSISTENT[64])


# ---------------------------------------------------------------------------- nvcc builds

NAMES = ("mha", "attention_causal", "attention_alibi", "attention_window")


def _cases():
    """(diagram, dtype, configuration, offered): the configurations the planner offers for each
    diagram (the loop :func:`W.loop_for` gives its scores, a persistent one's twin of one tile a
    block), checked for spills; and variants it does not offer there (persistent where the table
    says one tile a block, ping-pong toggled), checked for serialised wgmma only (the GPU tests
    run them)."""
    out = []
    for D in (64, 128):  # the other head dimensions: test_attention_wgmma_dims.py
        for name in NAMES:
            d = bound(name, d=D)
            for c in W.configs(D, *W.score_kinds(FAMILY.problem(d), d)):
                offered = {c, dataclasses.replace(c, persistent=False)}  # (candidates: a persistent one's twin)
                more = {dataclasses.replace(c, persistent=True)}
                if c.consumers == 2 and c.overlap:
                    more |= {dataclasses.replace(c, pingpong=not c.pingpong, persistent=pers) for pers in (False, True)}
                out += [(name, "bf16", v, True) for v in sorted(offered, key=str)]
                out += [(name, "bf16", v, False) for v in sorted(more - offered, key=str)]
        out.append(("gqa", "fp16", W.configs(D, masked=True)[0], True))
    return out


CASES = _cases()

#: Configurations allowed a few bytes of spills: ALiBi's bias per score beside 88 registers of S.
SPILL_OK = {("attention_alibi", 128, 176)}

#: Bytes of spill loads a persistent kernel may have (none where it is one tile a block): the tile
#: loop's state beside S, P and O at the 168-register cap (ptxas reports 4-16 bytes for most, 36
#: causal and 48 for a sliding window at d = 128 in the two-stage loop, whose tiles start at a key
#: chunk of their own).
PERSISTENT_SPILL_LOADS = 48


@pytest.fixture(scope="module")
def builds():
    from napkin.kernels.nvcc import nvcc_compile

    def build(case):
        name, dtype, cfg, _ = case
        d = bound(name, dtype, d=cfg.D)
        (k,) = W.lower_config(FAMILY, d, cfg).launches
        return k, nvcc_compile(k.source, "sm_90a")

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        return dict(enumerate(ex.map(build, CASES)))


@pytest.mark.nvcc
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{n}-{t}-d{c.D}-q{c.BQ}x{c.BX}s{c.stages}"
                                                       f"{'-2st' if c.overlap else ''}{'-1p' if c.one_p else ''}{'-pp' if c.pingpong else ''}"
                                                       f"{'-pers' if c.persistent else ''}"
                                                       f"{'' if o else '-notoffered'}"
                                                       for n, t, c, o in CASES])
def test_builds_without_spills_or_serialised_wgmma(builds, i):
    name, _, cfg, offered = CASES[i]
    launch, usage = builds[i]
    k = usage[launch.name]
    print(f"{launch.name}: {k.registers} registers at entry, {launch.shared_bytes} B shared")
    assert "C7513" not in usage.log, "ptxas serialised the wgmma"
    if offered and cfg.persistent:
        assert k.spill_loads <= PERSISTENT_SPILL_LOADS and k.stack_bytes <= 32, k
    elif offered and (name, cfg.D, cfg.BX) not in SPILL_OK:
        assert not k.spills and k.stack_bytes == 0
    assert k.registers <= 65536 // launch.threads
    assert launch.shared_bytes <= 227 * 1024 and k.shared_bytes == 0


def test_the_forward_with_its_log_sum_exp_plans_on_wgmma():
    from napkin.diagrams.grad import forward_with_saves

    f = forward_with_saves(library.get("attention_causal"), {"O", "P_lse"}).bind(h=2, q=4096, x=4096, d=128)
    cands = W.candidates(FAMILY, f, "h100", "bf16")
    assert cands and all(not s.kernels[0].streams for s in cands)  # x whole in the model
    (k,) = FAMILY.lower(f, derive(f, "h100", "bf16", explain=False).plan.schedule, "sm_90a").launches
    assert k.template == "attention_wgmma.cu.jinja" and "Lt[" in k.source
    lse = [a for a in k.args if a.kind == "tensor" and a.name == "P_lse"]
    assert lse and lse[0].dtype == "fp32"


def test_the_model_prices_persistence_by_its_fill_and_its_tiles_order():
    """A persistent launch is priced as its grid (a fill once a block, the steps of all its tiles)
    with the tail its longest-first order leaves; one tile a block pays a fill a round and, causal,
    the tail of the grid's order (head after head): the persistent twin is predicted faster, and
    more so causal. Fewer tiles than SMs: no tail of the model's own (the roofline's)."""
    from napkin.codegen.select import launch_shape, predict_schedule

    def both(name, **sz):
        d = bound(name, d=64, **sz)
        cfg = W.configs(64)[0]
        out = []
        for pers in (True, False):
            s = W.schedule(FAMILY, d, dataclasses.replace(cfg, persistent=pers))
            out.append((launch_shape(d, FAMILY, s, "h100"), predict_schedule(d, FAMILY, s, "h100").seconds))
        return out

    (pl, pt), (ol, ot) = both("attention_causal", q=4096, x=4096, h=64)
    assert pl.blocks == 132 and ol.blocks == 32 * 64 and pl.tail_factor < ol.tail_factor and pt < ot
    (_, fpt), (_, fot) = both("mha", q=4096, x=4096, h=64)
    assert fpt < fot and ot / pt > fot / fpt  # the causal tail is the larger gain
    (sl, _), _ = both("attention_causal", q=1000, x=1000, h=2)
    assert sl.tail_factor is None and sl.blocks == 16
    assert W.tile_tail([8] * 16, 33, 132, True, 8) == W.tile_tail([8] * 16, 33, 132, False, 8)  # equal tiles


def test_a_launch_tail_factor_replaces_the_rounded_waves():
    """``tail_factor`` stretches the per-SM terms in place of ceil(blocks / SMs) / (blocks / SMs);
    below 1 it is refused."""
    from napkin.errors import HardwareError
    from napkin.perfmodel.hardware import get_gpu
    from napkin.perfmodel.roofline import Work, predict

    h = get_gpu("h100")
    w = Work(flops={"tensor": 1e12}, bytes={"HBM": 1e6}, dtype="bf16")
    even, tailed = (predict(h, w, blocks=132, launch_overhead_s=0, tail_factor=f) for f in (None, 1.25))
    assert even.wave_factor == 1.0 and tailed.wave_factor == 1.25
    assert tailed.seconds == pytest.approx(even.seconds * 1.25)
    with pytest.raises(HardwareError, match="tail_factor"):
        predict(h, w, blocks=132, tail_factor=0.5)
