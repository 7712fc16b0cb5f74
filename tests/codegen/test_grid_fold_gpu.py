"""Launches past grid.y's 65535 on a GPU (marked ``gpu``; skipped elsewhere): attention with more
woven combinations (heads x batch: window attention over many windows, a large decode batch
without GQA) and contractions with more batch elements than that, their items going on from
grid.y into grid.z. Attention's forward (the planner's pick, the mma.sync tiles, the Hopper tiles
one a block), fp8 with its V-transpose pre-pass, and the backward; the contraction family's
mma.sync and SIMT tiles. Each is checked on fresh random inputs with NaN-poisoned outputs against
the reference, and each launch's grid is checked to fold.
"""

from __future__ import annotations

import dataclasses

import pytest
from napkin_test_support import skip_unless_hopper

from napkin.codegen.families import attention_fp8, attention_wgmma
from napkin.codegen.families import contraction as C
from napkin.codegen.families.attention import FAMILY
from napkin.diagrams import Axis, library

pytestmark = pytest.mark.gpu

#: 2049 x 32 = 65568 combinations: two slices of grid.z (32784 each), the second one's last block
#: past them returning at once.
SIZES = dict(b=2049, h=32, q=20, x=40)


@pytest.fixture(autouse=True)
def _gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _hopper():
    skip_unless_hopper("the wgmma templates")


def woven(name: str):
    return library.get(name).weave(Axis("b"), name=f"{name}_b")


def check_forward(name: str, d: int = 64, pick=None):
    """verify() of the forward (``pick(bound diagram)`` gives the schedule; the planner's where
    None), and the folded grid of its attention launch."""
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify

    diagram = woven(name)
    shape = dict(SIZES, d=d)
    bound = diagram.with_dtype("bf16").bind(**shape)
    sched = pick(bound) if pick is not None else None
    report = verify(diagram, dtype="bf16", shapes=[shape], family="attention", schedule=sched)
    print(report)
    assert report.ok, str(report)
    launch = napkin_compile(bound, family="attention", schedule=sched).launches[-1]
    if launch.grid[1:] != (1, 1):  # (a persistent walk numbers its tiles itself)
        assert launch.grid[1:] == (32784, 2), launch.grid


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_the_planners_pick(name):
    check_forward(name)


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_the_mma_sync_tiles(name):
    check_forward(name, pick=lambda b: next(s for s in FAMILY.candidates(b, None, "bf16")
                                            if s.kernels[0].options.engine != "wgmma"))


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_the_hopper_tiles_one_a_block(name, d):
    _hopper()
    cfg = dataclasses.replace(attention_wgmma.configs(d)[0], persistent=False)
    check_forward(name, d, pick=lambda b: attention_wgmma.schedule(FAMILY, b, cfg, dtype="bf16"))


def test_fp8():
    """The pre-pass (a block row a K/V head) and the kernel, against the fp32 reference on the
    dequantised inputs, under the family's stated tolerance."""
    _hopper()
    import torch

    from napkin.codegen.api import CompiledDiagram
    from napkin.diagrams.reference import run_reference

    d = woven("mha").with_dtype("fp8").bind(**SIZES, d=128)
    program = FAMILY.lower(d, attention_fp8.schedule(FAMILY, d, attention_fp8.configs(128)[0]), "sm_90a")
    assert [L.grid[1:] for L in program.launches] == [(32784, 2)] * 2
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {v.name: tuple(a.bound_size for a in v.axes) for v in d.inputs}
    raw = {n: torch.randn(shapes[n], generator=g, device="cuda") for n in "QKV"}
    descale = {n: float(t.abs().max()) / 240.0 for n, t in raw.items()}
    q8, k8, v8 = ((raw[n] / descale[n]).to(torch.float8_e4m3fn) for n in "QKV")
    real = {n: t.float() * descale[n] for n, t in zip("QKV", (q8, k8, v8))}
    ref = run_reference(d.with_dtype("fp32"), real, dtype=torch.float32)["O"]
    scale_o = 200.0 / float(ref.abs().max())
    prog = attention_fp8.with_scales(program, descale_q=descale["Q"], descale_k=descale["K"],
                                     descale_v=descale["V"], scale_o=scale_o)
    out = torch.empty(ref.shape, dtype=torch.float8_e4m3fn, device="cuda")
    out.view(torch.uint8).fill_(0x7F)  # e4m3 NaN: a row the kernel leaves unwritten stays NaN
    CompiledDiagram(prog, arch="sm_90a")(q8, k8, v8, out=out)
    got = out.float() / scale_o
    assert not torch.isnan(got).any(), "NaN in the output (a poisoned element never written?)"
    rms = float((got - ref).norm() / ref.norm())
    print(f"fp8, {SIZES}: relative RMS {rms:.4f}")
    assert rms < attention_fp8.RMS_TOLERANCE


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_the_backward(name):
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.grad import forward_with_saves

    save = {"O", "P_lse"}
    fwd = woven(name).bind(**SIZES, d=64)
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = {v.name: torch.randn([a.bound_size for a in v.axes], generator=gen, device="cuda").bfloat16()
          for v in fwd.inputs}
    leaves = {n: t.double().requires_grad_(True) for n, t in xs.items()}
    outs = fwd.reference(leaves, dtype=torch.float64)
    dO = torch.randn(outs["O"].shape, generator=gen, device="cuda").bfloat16()
    want = dict(zip(("dQ", "dK", "dV"), torch.autograd.grad((outs["O"] * dO.double()).sum(),
                                                            [leaves[n] for n in "QKV"])))
    saved = forward_with_saves(fwd, save).reference({n: t.double() for n, t in xs.items()}, dtype=torch.float64)
    cd = napkin_compile(woven(name).grad(save=save), sizes=dict(SIZES, d=64), dtype="bf16", family="attention_bwd")
    assert [L.grid[1:] for L in cd.launches if L.grid[1] > 1] == [(32784, 2)]
    feed = dict(xs, dO=dO, O=saved["O"].bfloat16(), P_lse=saved["P_lse"].float())
    res = cd(**feed, out=cd.empty_outputs(fill=float("nan")))
    got = dict(zip(cd.output_names, res))
    for k in ("dQ", "dK", "dV"):
        assert not torch.isnan(got[k]).any(), f"{k}: NaN (a poisoned element never written?)"
        err = float((got[k].double() - want[k]).norm() / want[k].norm())
        print(f"{name} backward {k}: relative error {err:.2e}")
        assert err < 1e-2, f"{k}: relative error {err:.3g}"


@pytest.mark.parametrize("dtype,engine", [("bf16", "mma.sync"), ("fp32", "mma.sync"), ("fp32", "simt")])
def test_a_contraction_batch_past_grid_y(dtype, engine):
    """70000 batched 40 x 24 x 72 products on the grid-bound templates (the tiles an A100 is
    offered; they run on any sm_80+ GPU)."""
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify

    diagram = library.get("batched_matmul")
    shape = dict(n=70000, a=40, b=72, c=24)
    bound = diagram.with_dtype(dtype).bind(**shape)
    sched = next(s for s in C.FAMILY.candidates(bound, "a100-80gb", dtype) if s.kernels[0].options.engine == engine)
    report = verify(diagram, dtype=dtype, shapes=[shape], family="contraction", schedule=sched)
    print(report)
    assert report.ok, str(report)
    (launch,) = [L for L in napkin_compile(bound, family="contraction", schedule=sched).launches if L.grid[1] > 1]
    assert launch.grid[1:] == (35000, 2)
