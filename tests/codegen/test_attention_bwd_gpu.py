"""Attention's backward on the GPU (marked ``gpu``): the forward with its saved log-sum-exp (the
attention family, O and P_lse in one kernel) and the backward kernel (attention_bwd: dQ, dK, dV
with its pre-pass and dQ conversion), against torch.autograd of the forward diagram's float64
reference, on fresh random inputs, outputs poisoned with NaN, shapes that are not tile multiples,
causal and not, d = 64 and 128, bf16 and fp16, every tile configuration; and the two chained
(the backward fed with what napkin's own forward saved).
"""

from __future__ import annotations

import math

import pytest

from napkin.codegen.families.attention_bwd import CONFIGS, FAMILY, BackwardConfig
from napkin.diagrams import library
from napkin.diagrams.grad import forward_with_saves

pytestmark = pytest.mark.gpu

SAVE = {"O", "P_lse"}
TOL = 1e-2


def _forward(name):
    """A library diagram by name, or the diagram itself."""
    return library.get(name) if isinstance(name, str) else name


def _sizes(name, **s):
    axes = library.get(name).axes
    return {k: v for k, v in {"h": 2, **s}.items() if k in axes}


def _rel(got, want) -> float:
    import torch

    got, want = got.double(), want.double()
    assert not torch.isnan(got).any(), "NaN in the output (a poisoned element never written?)"
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def _reference(name, sizes, dtype, seed):
    """Inputs (rounded to ``dtype``), a cotangent, O and P_lse of the float64 reference and the
    gradients of torch.autograd, all on the GPU."""
    import torch

    from napkin.dtypes import torch_dtype

    fwd = _forward(name).bind(**sizes)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    td = torch_dtype(dtype)
    xs = {v.name: torch.randn([a.bound_size for a in v.axes], generator=gen, device="cuda").to(td)
          for v in fwd.inputs}
    leaves = {n: t.double().requires_grad_(True) for n, t in xs.items()}
    outs = fwd.reference(leaves, dtype=torch.float64)
    dO = torch.randn(outs["O"].shape, generator=gen, device="cuda").to(td)
    want = dict(zip(("dQ", "dK", "dV"), torch.autograd.grad((outs["O"] * dO.double()).sum(),
                                                            [leaves[n] for n in ("Q", "K", "V")])))
    saved = forward_with_saves(fwd, SAVE).reference({n: t.double() for n, t in xs.items()}, dtype=torch.float64)
    return xs, dO, saved, want


def _backward(name, sizes, dtype, schedule=None):
    from napkin.codegen import compile as napkin_compile

    b = _forward(name).grad(save=SAVE)
    return napkin_compile(b, sizes=sizes, dtype=dtype, family="attention_bwd", schedule=schedule)


def _run(cd, feed, poison=False) -> dict:
    """The outputs by name (poisoned with NaN before the launches when ``poison``)."""
    out = cd.empty_outputs(fill=float("nan")) if poison else None
    res = cd(**feed, out=out) if poison else cd(**feed)
    return dict(zip(cd.output_names, res if isinstance(res, tuple) else (res,)))


def check_backward(name, dtype, sizes, seed=0, cfg=None):
    import torch

    xs, dO, saved, want = _reference(name, sizes, dtype, seed)
    sched = None
    if cfg is not None:
        b = _forward(name).grad(save=SAVE).with_dtype(dtype).bind(**sizes)
        sched = FAMILY.schedule(b, cfg, dtype=dtype)
    cd = _backward(name, sizes, dtype, sched)
    # three launches; the main one on mma.sync, or on wgmma where the planner takes it (sm_90a)
    assert len(cd.launches) == 3 and cd.launches[2].template == "attention_bwd.cu.jinja"
    feed = dict(xs, dO=dO, O=saved["O"].to(xs["Q"].dtype), P_lse=saved["P_lse"].float())
    got = _run(cd, feed, poison=True)
    torch.cuda.synchronize()
    for k in ("dQ", "dK", "dV"):
        err = _rel(got[k], want[k])
        print(f"{name} {dtype} {sizes} {k}: relative error {err:.2e}")
        assert err < TOL, f"{k}: relative error {err:.3g}"


@pytest.mark.parametrize("name", ["mha", "attention_causal", "attention"])
@pytest.mark.parametrize("d", [64, 128])
def test_backward_bf16(name, d):
    check_backward(name, "bf16", _sizes(name, q=1000, x=1000, d=d))
    check_backward(name, "bf16", _sizes(name, q=77, x=200, d=d), seed=1)


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_backward_fp16_ragged(name):
    check_backward(name, "fp16", _sizes(name, q=333, x=1027, d=128), seed=2)
    check_backward(name, "fp16", _sizes(name, q=1027, x=333, d=64), seed=3)


def test_backward_batched():
    """Batch and heads both woven (grid.y walks their combinations)."""
    from napkin.diagrams import Axis

    mha_b = library.get("mha").weave(Axis("b"), name="mha_b")
    check_backward(mha_b, "bf16", {"b": 2, "h": 3, "q": 300, "x": 257, "d": 64}, seed=9)


def test_backward_window():
    check_backward("attention_window", "bf16", _sizes("attention_window", q=700, x=700, d=64), seed=4)


@pytest.mark.parametrize("cfg", [(bx, bq, D) for D, cs in CONFIGS.items() for bx, bq in cs],
                         ids=lambda c: f"d{c[2]}-x{c[0]}-q{c[1]}")
def test_every_configuration(cfg):
    for name in ("mha", "attention_causal"):
        check_backward(name, "bf16", _sizes(name, q=515, x=515, d=cfg[2]), seed=5, cfg=BackwardConfig(*cfg))


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_forward_lse(name):
    """The attention kernel writes O and the rows' log-sum-exp (fp32, natural log) in one launch."""
    import torch

    from napkin.codegen import compile as napkin_compile

    sizes = _sizes(name, q=1000, x=777, d=128)
    f = forward_with_saves(library.get(name), SAVE)
    cd = napkin_compile(f, sizes=sizes, dtype="bf16", family="attention")
    assert len(cd.launches) == 1
    xs, _, saved, _ = _reference(name, sizes, "bf16", 6)
    got = _run(cd, xs, poison=True)
    torch.cuda.synchronize()
    assert got["P_lse"].dtype == torch.float32
    lse_err = float((got["P_lse"].double() - saved["P_lse"]).abs().max())
    print(f"{name}: O {_rel(got['O'], saved['O']):.2e}, lse max abs error {lse_err:.2e}")
    assert _rel(got["O"], saved["O"]) < TOL
    assert lse_err < 1e-3 * max(1.0, math.log(777))


@pytest.mark.parametrize("name", ["mha", "attention_causal"])
def test_forward_then_backward(name):
    """The backward fed with napkin's own forward (O in bf16, P_lse in fp32)."""
    import torch

    from napkin.codegen import compile as napkin_compile

    sizes = _sizes(name, q=2048, x=2048, d=128, h=4)
    xs, dO, _, want = _reference(name, sizes, "bf16", 7)
    fwd = napkin_compile(forward_with_saves(library.get(name), SAVE), sizes=sizes, dtype="bf16", family="attention")
    saved = _run(fwd, xs)
    got = _run(_backward(name, sizes, "bf16"), dict(xs, dO=dO, O=saved["O"], P_lse=saved["P_lse"]), poison=True)
    torch.cuda.synchronize()
    for k in ("dQ", "dK", "dV"):
        assert _rel(got[k], want[k]) < TOL, k


def test_deterministic_dk_dv():
    """dK and dV sum in registers in a fixed order: two runs give the same bits (dQ's atomics may not)."""
    import torch

    sizes = _sizes("mha", q=600, x=600, d=64)
    xs, dO, saved, _ = _reference("mha", sizes, "bf16", 8)
    cd = _backward("mha", sizes, "bf16")
    feed = dict(xs, dO=dO, O=saved["O"].to(xs["Q"].dtype), P_lse=saved["P_lse"].float())
    a, b = _run(cd, feed), _run(cd, feed)
    torch.cuda.synchronize()
    assert torch.equal(a["dK"], b["dK"]) and torch.equal(a["dV"], b["dV"])
