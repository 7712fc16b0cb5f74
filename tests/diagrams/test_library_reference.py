"""Every library diagram's PyTorch reference against hand-written PyTorch, on random inputs.

Each case is checked twice: the diagram's output must match the hand-written PyTorch, and a
plausible wrong variant (a missing mask, a missing bias, the wrong head mapping, perturbed
inputs) must NOT match, so a test could not pass with a broken diagram or a vacuous comparison.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from napkin.diagrams import library, load_diagram  # noqa: E402
from napkin.diagrams.reference import random_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

F64, F32 = torch.float64, torch.float32
TOL = {F64: 1e-9, F32: 2e-4}


def run(name: str, sizes: dict, dtype=F64, seed: int = 0, scale_inputs: dict | None = None,
        device: str = "cpu"):
    """The library diagram bound to ``sizes``: (random inputs, its reference output)."""
    d = library.get(name).bind(sizes)
    inputs = random_inputs(d, dtype=dtype, seed=seed, device=device)
    for k, c in (scale_inputs or {}).items():
        inputs[k] = inputs[k] * c
    outs = d.reference(inputs)
    assert list(outs) == list(d.output_names)
    (out,) = outs.values()
    return inputs, out


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check(got, want, wrong=(), dtype=F64, tol=None):
    """``got`` matches ``want``; each tensor in ``wrong`` is far from ``got``."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    assert got.dtype == want.dtype
    assert torch.isfinite(got).all(), "reference produced NaN/inf"
    assert want.abs().max() > 0, "vacuous comparison: expected output is all zeros"
    tol = TOL[dtype] if tol is None else tol
    assert rel_err(got, want) < tol, f"relative error {rel_err(got, want):.3g} ≥ {tol}"
    for w in wrong:
        assert w.shape == got.shape
        assert rel_err(got, w) > 100 * tol, "a wrong reference also matches: the test cannot fail"


def perturbed(inputs: dict, name: str) -> dict:
    """A copy of ``inputs`` with one element of ``name`` changed a lot."""
    out = dict(inputs)
    t = inputs[name].clone()
    t.view(-1)[0] += 10.0
    out[name] = t
    return out


# Shapes: odd sizes, sizes of 1, and one case where query and key lengths differ the other way.
ATT_SHAPES = [dict(q=37, x=53, d=16), dict(q=64, x=64, d=32), dict(q=53, x=37, d=7), dict(q=1, x=5, d=3)]
ROW_SHAPES = [dict(r=7, x=53), dict(r=1, x=128), dict(r=33, x=1)]
MM_SHAPES = [dict(a=37, b=53, c=16), dict(a=64, b=64, c=64), dict(a=1, b=7, c=3)]


def test_every_library_diagram_is_covered():
    covered = {"matmul", "batched_matmul", "matmul_t", "matvec", "mlp", "softmax", "layernorm", "rmsnorm", "attention",
               "mha", "attention_causal", "gqa", "attention_window", "attention_alibi", "attention_softcap",
               "transformer_block", "swiglu", "rmsnorm_linear", "gemm_softmax", "gelu_tanh", "column_sum",
               "log_softmax", "l2_normalize", "group_norm", "logsumexp_rows", "row_range"}
    assert set(library.names()) == covered, "a library diagram was added or removed: test it here"


# ----------------------------------------------------------------------------- contractions

@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", MM_SHAPES)
def test_matmul(sizes, dtype):
    x, out = run("matmul", sizes, dtype)
    check(out, torch.matmul(x["A"], x["B"]),
          wrong=[torch.matmul(perturbed(x, "A")["A"], x["B"])] if sizes["b"] > 1 else [], dtype=dtype)


@pytest.mark.parametrize("sizes", [dict(n=3, **s) for s in MM_SHAPES])
def test_batched_matmul(sizes):
    x, out = run("batched_matmul", sizes)
    want = torch.matmul(x["A"], x["B"])
    # wrong: every batch multiplied by batch 0's B
    check(out, want, wrong=[torch.matmul(x["A"], x["B"][:1].expand_as(x["B"]))])


@pytest.mark.parametrize("sizes", MM_SHAPES)
def test_matvec(sizes):
    x, out = run("matvec", {"a": sizes["a"], "b": sizes["b"]})
    check(out, torch.mv(x["W"], x["x"]), wrong=[torch.mv(x["W"], perturbed(x, "x")["x"])])


@pytest.mark.parametrize("sizes", MM_SHAPES)
def test_matmul_t(sizes):
    x, out = run("matmul_t", sizes)
    assert tuple(x["B"].shape) == (sizes["c"], sizes["b"])
    check(out, torch.matmul(x["A"], x["B"].T), wrong=[torch.matmul(x["A"], perturbed(x, "B")["B"].T)])


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", MM_SHAPES)
def test_mlp(sizes, dtype):
    x, out = run("mlp", sizes, dtype)
    want = F.gelu(F.linear(x["X"], x["W"], x["bias"]))
    check(out, want, wrong=[F.gelu(F.linear(x["X"], x["W"])),                     # bias forgotten
                            F.gelu(F.linear(x["X"], x["W"], -x["bias"])),           # bias subtracted
                            F.gelu(F.linear(x["X"], perturbed(x, "W")["W"], x["bias"]))], dtype=dtype)


# ----------------------------------------------------------------------------- row-wise

@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_softmax(sizes, dtype):
    x, out = run("softmax", sizes, dtype)
    want = torch.softmax(x["X"], dim=-1)
    wrong = [torch.softmax(x["X"], dim=0)] if sizes["x"] > 1 and sizes["r"] > 1 else []
    check(out, want, wrong=wrong, dtype=dtype)


def test_softmax_bf16_runs_in_bf16():
    d = library.get("softmax").bind(r=9, x=77)
    x = random_inputs(d, seed=3)  # the diagram's own dtype: bf16
    assert x["X"].dtype == torch.bfloat16
    out = d.reference(x)["P"]
    assert out.dtype == torch.bfloat16
    assert rel_err(out, torch.softmax(x["X"].double(), -1)) < 1e-2


@pytest.mark.parametrize("sizes", [dict(r=7, x=53), dict(r=1, x=128), dict(r=33, x=2)])
def test_layernorm(sizes):
    x, out = run("layernorm", sizes)
    n = sizes["x"]
    want = F.layer_norm(x["X"], (n,), weight=x["gamma"], bias=x["beta"], eps=1e-5)
    check(out, want, wrong=[F.layer_norm(x["X"], (n,), eps=1e-5),                    # affine forgotten
                            F.layer_norm(x["X"], (n,), weight=x["gamma"], eps=1e-5)])  # bias forgotten


@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_rmsnorm(sizes):
    x, out = run("rmsnorm", sizes)
    n = sizes["x"]
    want = F.rms_norm(x["X"], (n,), weight=x["gamma"], eps=1e-6)
    manual = x["X"] * torch.rsqrt(x["X"].pow(2).mean(-1, keepdim=True) + 1e-6) * x["gamma"]
    check(out, manual)
    wrong = [F.layer_norm(x["X"], (n,), weight=x["gamma"], eps=1e-6)] if n > 1 else []
    check(out, want, wrong=[*wrong, F.rms_norm(x["X"], (n,), eps=1e-6) * 1.5])


# ----------------------------------------------------------------------------- row-wise chains


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_log_softmax(sizes, dtype):
    x, out = run("log_softmax", sizes, dtype)
    want = torch.log_softmax(x["X"], dim=-1)
    if sizes["x"] == 1:  # one value per row: log 1
        assert torch.equal(out, torch.zeros_like(want))
        return
    wrong = [torch.log_softmax(x["X"], dim=0)] if sizes["r"] > 1 else []
    check(out, want, wrong=[*wrong, x["X"] - x["X"].amax(-1, keepdim=True)], dtype=dtype)


@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_l2_normalize(sizes):
    x, out = run("l2_normalize", sizes)
    check(out, F.normalize(x["X"], dim=-1), wrong=[F.normalize(x["X"], p=1.0, dim=-1)] if sizes["x"] > 1 else [])


def test_l2_normalize_keeps_a_zero_row_at_zero():
    d = library.get("l2_normalize").bind(r=2, x=5)
    X = torch.zeros(2, 5, dtype=F64)
    X[1] = 1.0
    out = d.reference({"X": X})["Y"]
    assert torch.equal(out, F.normalize(X, dim=-1)) and torch.equal(out[0], torch.zeros(5, dtype=F64))


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(n=2, g=4, c=3, s=10), dict(n=1, g=1, c=5, s=7), dict(n=3, g=2, c=2, s=1)])
def test_group_norm(sizes, dtype):
    x, out = run("group_norm", sizes, dtype)
    n, g, c, s = sizes["n"], sizes["g"], sizes["c"], sizes["s"]

    def gn(X, groups):
        w, b = x["gamma"].reshape(g * c), x["beta"].reshape(g * c)
        return F.group_norm(X.reshape(n, g * c, s), groups, w, b, eps=1e-5).reshape(n, g, c, s)

    wrong = [gn(x["X"], g * c), F.layer_norm(x["X"], (s,), eps=1e-5)]   # per channel; over s only
    check(out, gn(x["X"], g), wrong=wrong, dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_logsumexp_rows(sizes, dtype):
    x, out = run("logsumexp_rows", sizes, dtype)
    want = torch.logsumexp(x["X"], dim=-1)
    check(out, want, wrong=[x["X"].amax(-1)] if sizes["x"] > 1 else [want + 1.0], dtype=dtype)


def test_logsumexp_rows_at_infinities():
    d = library.get("logsumexp_rows").bind(r=3, x=4)
    inf = math.inf
    X = torch.tensor([[-inf] * 4, [0.0, inf, 1.0, -inf], [-inf, 2.0, -inf, 2.0]], dtype=F64)
    out = d.reference({"X": X})["Y"]
    assert torch.equal(out, torch.logsumexp(X, dim=-1))


@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_row_range(sizes):
    x, out = run("row_range", sizes)
    want = x["X"].amax(-1) - x["X"].amin(-1)
    if sizes["x"] == 1:
        assert torch.equal(out, torch.zeros_like(want))
        return
    check(out, want, wrong=[x["X"].amax(-1)])


# ----------------------------------------------------------------------------- attention

def sdpa(Q, K, V, **kw):
    return F.scaled_dot_product_attention(Q, K, V, **kw)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", ATT_SHAPES)
def test_attention(sizes, dtype):
    x, out = run("attention", sizes, dtype)
    want = sdpa(x["Q"], x["K"], x["V"])
    d = sizes["d"]
    wrong = [sdpa(x["Q"], x["K"], x["V"], scale=1.0)] if d > 1 else []           # 1/√d forgotten
    if sizes["x"] > 1:
        wrong.append(sdpa(*perturbed(x, "K").values()))
    check(out, want, wrong=wrong, dtype=dtype)


@pytest.mark.parametrize("sizes", [dict(h=3, **s) for s in ATT_SHAPES])
def test_mha(sizes):
    x, out = run("mha", sizes)
    want = sdpa(x["Q"], x["K"], x["V"])
    # wrong: heads mixed up (every query head reads key/value head 0)
    wrong = sdpa(x["Q"], x["K"][:1].expand_as(x["K"]), x["V"][:1].expand_as(x["V"]))
    check(out, want, wrong=[wrong] if sizes["x"] > 1 else [])


def causal_shapes():
    return [dict(h=2, q=37, x=53, d=16), dict(h=3, q=53, x=37, d=8), dict(h=1, q=64, x=64, d=32)]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", causal_shapes())
def test_attention_causal(sizes, dtype):
    x, out = run("attention_causal", sizes, dtype)
    want = sdpa(x["Q"], x["K"], x["V"], is_causal=True)
    check(out, want, wrong=[sdpa(x["Q"], x["K"], x["V"])], dtype=dtype)          # mask forgotten


@pytest.mark.parametrize("sizes", [dict(h=2, j=3, q=37, x=53, d=16), dict(h=3, j=2, q=29, x=29, d=8),
                                   dict(h=1, j=4, q=17, x=11, d=5)])
def test_gqa(sizes):
    x, out = run("gqa", sizes)
    h, j, q, d = sizes["h"], sizes["j"], sizes["q"], sizes["d"]
    assert tuple(x["Q"].shape) == (h, j, q, d)
    Qf = x["Q"].reshape(h * j, q, d)  # query head h_idx*j + j_idx shares key/value head h_idx
    want = sdpa(Qf, x["K"], x["V"], is_causal=True, enable_gqa=True).reshape(h, j, q, d)
    # the same by hand: repeat each K/V head j times
    rep = sdpa(Qf, x["K"].repeat_interleave(j, 0), x["V"].repeat_interleave(j, 0), is_causal=True)
    check(out, rep.reshape(h, j, q, d))
    wrong = []
    if h > 1:  # wrong: the other head order (j-major, as repeat instead of repeat_interleave)
        wrong.append(sdpa(Qf, x["K"].repeat(j, 1, 1), x["V"].repeat(j, 1, 1), is_causal=True).reshape(h, j, q, d))
    wrong.append(sdpa(Qf, x["K"], x["V"], enable_gqa=True).reshape(h, j, q, d))  # mask forgotten
    check(out, want, wrong=wrong)


def window_mask(q: int, x: int, window: int = 256):
    iq = torch.arange(q)[:, None]
    ix = torch.arange(x)[None, :]
    return (ix <= iq) & (ix > iq - window)


@pytest.mark.parametrize("sizes", [dict(h=2, q=300, x=300, d=8), dict(h=1, q=37, x=53, d=16),
                                   dict(h=2, q=333, x=301, d=4)])
def test_attention_window(sizes):
    x, out = run("attention_window", sizes)
    mask = window_mask(sizes["q"], sizes["x"])
    want = sdpa(x["Q"], x["K"], x["V"], attn_mask=mask)
    wrong = [sdpa(x["Q"], x["K"], x["V"])]
    if sizes["q"] > 256:  # the window matters: plain causal attention differs
        wrong.append(sdpa(x["Q"], x["K"], x["V"], is_causal=True))
    check(out, want, wrong=wrong)


def alibi_bias(h: int, q: int, x: int, dtype):
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=dtype)
    dist = (torch.arange(q)[:, None] - torch.arange(x)[None, :]).abs().to(dtype)
    bias = -slopes[:, None, None] * dist
    causal = torch.ones(q, x, dtype=torch.bool).tril()
    return bias.masked_fill(~causal, -math.inf)


@pytest.mark.parametrize("sizes", [dict(h=4, q=37, x=53, d=16), dict(h=3, q=61, x=61, d=8),
                                   dict(h=1, q=20, x=9, d=3)])
def test_attention_alibi(sizes):
    x, out = run("attention_alibi", sizes)
    bias = alibi_bias(sizes["h"], sizes["q"], sizes["x"], F64)
    want = sdpa(x["Q"], x["K"], x["V"], attn_mask=bias)
    wrong = [sdpa(x["Q"], x["K"], x["V"], is_causal=True)]                          # bias forgotten
    if sizes["h"] > 1:  # slopes in the other head order
        wrong.append(sdpa(x["Q"], x["K"], x["V"], attn_mask=bias.flip(0)))
    # 1e-6, not 1e-9: the reference computes the ALiBi slopes in float32 (see the xfail below).
    check(out, want, wrong=wrong, tol=1e-6)


def test_attention_alibi_is_float64_accurate():
    sizes = dict(h=3, q=61, x=61, d=8)
    x, out = run("attention_alibi", sizes)
    want = sdpa(x["Q"], x["K"], x["V"], attn_mask=alibi_bias(3, 61, 61, F64))
    assert rel_err(out, want) < 1e-12


@pytest.mark.parametrize("sizes", [dict(h=2, q=37, x=53, d=16), dict(h=3, q=29, x=29, d=8),
                                   dict(h=1, q=7, x=50, d=5)])
def test_attention_softcap(sizes):
    # Large queries so that scores reach the cap (at 50) and capping changes the result.
    x, out = run("attention_softcap", sizes, scale_inputs={"Q": 40.0})
    Q, K, V = x["Q"], x["K"], x["V"]
    S = Q @ K.transpose(-1, -2) / math.sqrt(sizes["d"])
    assert S.abs().max() > 50

    def attend(S):
        causal = torch.ones(S.shape[-2:], dtype=torch.bool).tril()
        return torch.softmax(S.masked_fill(~causal, -math.inf), dim=-1) @ V

    want = attend(50.0 * torch.tanh(S / 50.0))
    check(out, want, wrong=[attend(S), sdpa(Q, K, V, is_causal=True)])             # cap forgotten


# ----------------------------------------------------------------------------- transformer block

def transformer_block_torch(x):
    """Pre-RMSNorm causal multi-head attention + GELU MLP with residuals, by hand."""
    X = x["X"]
    e = X.shape[-1]
    Xn = F.rms_norm(X, (e,), weight=x["g1"], eps=1e-6)
    Q = torch.einsum("qe,hde->hqd", Xn, x["Wq"])
    K = torch.einsum("qe,hde->hqd", Xn, x["Wk"])
    V = torch.einsum("qe,hde->hqd", Xn, x["Wv"])
    O = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    A = torch.einsum("hqd,ehd->qe", O, x["Wo"])
    X2 = X + A
    Xn2 = F.rms_norm(X2, (e,), weight=x["g2"], eps=1e-6)
    return X2 + F.linear(F.gelu(F.linear(Xn2, x["W1"], x["b1"])), x["W2"])


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(q=13, e=24, h=3, d=8, f=40), dict(q=32, e=16, h=2, d=8, f=64),
                                   dict(q=1, e=7, h=1, d=5, f=3)])
def test_transformer_block(sizes, dtype):
    x, out = run("transformer_block", sizes, dtype)
    want = transformer_block_torch(x)
    check(out, want, wrong=[transformer_block_torch(perturbed(x, "Wo")),
                            transformer_block_torch(perturbed(x, "W1"))], dtype=dtype)


# ----------------------------------------------------------------------------- shapes bind from tensors

def test_reference_binds_sizes_from_tensor_shapes():
    d = library.get("attention")  # symbolic sizes
    g = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(s, generator=g, dtype=F64) for s in [(11, 6), (19, 6), (19, 6)])
    out = d.reference({"Q": Q, "K": K, "V": V})["O"]
    check(out, sdpa(Q, K, V))


# ----------------------------------------------------------------------------- the example user file

def test_example_user_file_swiglu():
    d = load_diagram(str(ROOT / "examples" / "my_diagram.py") + ":swiglu").bind(a=9, b=16, f=23)
    x = random_inputs(d, dtype=F64, seed=0)
    out = d.reference(x)["Y"]
    want = F.linear(F.silu(F.linear(x["X"], x["Wg"])) * F.linear(x["X"], x["Wu"]), x["Wd"])
    check(out, want, wrong=[F.linear(F.gelu(F.linear(x["X"], x["Wg"])) * F.linear(x["X"], x["Wu"]), x["Wd"])])


def test_example_user_file_linear_attention():
    d = load_diagram(str(ROOT / "examples" / "my_diagram.py") + ":linear_attention").bind(q=13, x=21, d=8, e=5)
    x = random_inputs(d, dtype=F64, seed=0)
    out = d.reference(x)["O"]
    phi = lambda t: 1.0 + torch.relu(t)  # noqa: E731
    A = phi(x["Q"]) @ phi(x["K"]).T
    want = (A / A.sum(-1, keepdim=True)) @ x["V"]
    check(out, want, wrong=[torch.softmax(x["Q"] @ x["K"].T, -1) @ x["V"]])


# ----------------------------------------------------------------------------- CUDA

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", ["attention_causal", "gqa", "layernorm", "transformer_block"])
def test_reference_runs_on_cuda(name):
    sizes = {"attention_causal": dict(h=2, q=37, x=53, d=16), "gqa": dict(h=2, j=2, q=37, x=53, d=16),
             "layernorm": dict(r=7, x=53), "transformer_block": dict(q=13, e=24, h=3, d=8, f=40)}[name]
    d = library.get(name).bind(sizes)
    x_cpu = random_inputs(d, dtype=F32, seed=0)
    x_gpu = {k: v.cuda() for k, v in x_cpu.items()}
    (out_gpu,) = d.reference(x_gpu).values()
    (out_cpu,) = d.reference(x_cpu).values()
    assert out_gpu.device.type == "cuda"
    assert rel_err(out_gpu.cpu(), out_cpu) < 1e-3
    # bf16 on the device, against the fp64 oracle
    (out_bf16,) = d.reference(x_gpu, dtype=torch.bfloat16).values()
    assert out_bf16.dtype == torch.bfloat16 and out_bf16.device.type == "cuda"
    (out_64,) = d.reference(x_cpu, dtype=F64).values()
    assert rel_err(out_bf16.cpu(), out_64) < 5e-2


# ----------------------------------------------------------------------------- composed

@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(a=37, b=53, f=16), dict(a=1, b=7, f=3)])
def test_swiglu(sizes, dtype):
    x, out = run("swiglu", sizes, dtype)
    want = F.linear(F.silu(F.linear(x["X"], x["Wg"])) * F.linear(x["X"], x["Wu"]), x["Wd"])
    check(out, want, wrong=[F.linear(F.silu(F.linear(x["X"], x["Wu"])) * F.linear(x["X"], x["Wg"]), x["Wd"]),
                            F.linear(F.linear(x["X"], x["Wg"]) * F.linear(x["X"], x["Wu"]), x["Wd"])], dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(r=7, x=53, c=16), dict(r=1, x=8, c=3)])
def test_rmsnorm_linear(sizes, dtype):
    x, out = run("rmsnorm_linear", sizes, dtype)
    want = F.linear(F.rms_norm(x["X"], (sizes["x"],), x["gamma"], eps=1e-6), x["W"])
    check(out, want, wrong=[F.linear(x["X"] * x["gamma"], x["W"]),
                            F.linear(F.layer_norm(x["X"], (sizes["x"],), x["gamma"], eps=1e-6), x["W"])],
          dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(a=7, b=53, c=16), dict(a=3, b=1, c=5)])
def test_gemm_softmax(sizes, dtype):
    x, out = run("gemm_softmax", sizes, dtype)
    logits = F.linear(x["A"], x["B"])
    check(out, torch.softmax(logits, dim=-1), wrong=[torch.softmax(logits, dim=0)], dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", ROW_SHAPES)
def test_gelu_tanh(sizes, dtype):
    x, out = run("gelu_tanh", sizes, dtype, scale_inputs={"X": 3.0})
    check(out, F.gelu(x["X"], approximate="tanh"), wrong=[F.gelu(x["X"] + 0.5, approximate="tanh")],
          dtype=dtype)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("sizes", [dict(r=7, x=53), dict(r=33, x=1), dict(r=1, x=5)])
def test_column_sum(sizes, dtype):
    x, out = run("column_sum", sizes, dtype)
    wrong = [x["X"].sum(dim=0) + 1.0]
    check(out, x["X"].sum(dim=0), wrong=wrong, dtype=dtype)
