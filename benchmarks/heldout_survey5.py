#!/usr/bin/env python3
"""A sixth operator survey: reductions over several axes, long map chains, GEMM epilogues and blocks.

Problems an operator suite's users write (KernelBench levels 1 and 2, LLM and vision blocks) that
the earlier surveys do not hold: variances over (h, w) and over (c, h, w) of NCHW arrays, a
batch norm's per-channel sums over (n, h, w), means and maxes over the first axis of 4-D arrays;
RMSNorm with its weight, LayerNorm with its affine, log-softmax, L1 normalisation and cosine
similarity over a middle (channel) axis; softmax with a temperature and an additive mask-like bias
broadcast over heads; a label-smoothed cross-entropy per row; chains of five to eight elementwise
maps (gelu, sigmoid, tanh, clamp, abs, pow, rsqrt, erf, softplus, mish, hardswish, leaky_relu,
selu, elu); binary min/max broadcast along different axes; GEMMs followed by bias + residual +
layernorm, by a row mean, by a scale and a row min, by swish then a row sum; GeGLU with biases;
a batched GEMM with a per-batch scale, a batched GEMM with A transposed, a batched product over two
axes, batched outer products; attention with an explicit scale, with a bias shared by the heads,
d = 64 with q ≠ x (odd), cross-attention over 77 text tokens; a two-layer MLP with biases and GELU;
RMSNorm → SwiGLU → down projection; matrix-vector with a bias, vector-matrix with a bias; per-sample
Frobenius normalisation; group norm of NCHW with its affine; instance norm with its affine. Some sizes
are odd (4095, 1001, 77). Each is a module-level function, so it also works on the command line::

    napkin derive benchmarks/heldout_survey5.py:var_chw -s n=64 -s c=64 -s h=56 -s w=56

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey5.py [--out heldout5.jsonl] [--dtypes bf16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


# ----------------------------------------------------------------------------- reductions over several axes

def var_hw():
    """torch.var(x, dim=(2, 3), unbiased=False) of NCHW: a two-pass variance over two axes."""
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    m = nd.mean_over(X, (h, w))
    return nd.Diagram("var_hw", nd.mean_over(nd.square(X - m), (h, w), name="V"))


def var_chw():
    """Per-sample variance over (C, H, W) of NCHW: three reduced axes, the rows of a sample."""
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    m = nd.mean_over(X, (c, h, w))
    return nd.Diagram("var_chw", nd.mean_over(nd.square(X - m), (c, h, w), name="V"))


def channel_sum_nhw():
    """A batch norm's per-channel sum and sum of squares over (N, H, W) of NCHW (outer and inner axes)."""
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    return nd.Diagram("channel_sum_nhw", (nd.sum_over(X, (n, h, w), name="S"), nd.sum_over(nd.square(X), (n, h, w), name="Q")))


def mean_first_4d():
    nd = _d(); a, b, c, e = nd.axes("a b c e"); X = nd.array("X", a, b, c, e)
    return nd.Diagram("mean_first_4d", nd.mean_over(X, a, name="Y"))


def max_first_4d():
    nd = _d(); a, b, c, e = nd.axes("a b c e"); X = nd.array("X", a, b, c, e)
    return nd.Diagram("max_first_4d", nd.max_over(X, a, name="Y"))


# ----------------------------------------------------------------------------- norms over a middle axis

def rmsnorm_middle_weight():
    """RMSNorm over the channels of x[b, c, s] times g[c] (odd channel count)."""
    nd = _d(); b, c, s = nd.axes("b c s"); X, g = nd.array("X", b, c, s), nd.array("g", c)
    return nd.Diagram("rmsnorm_middle_weight", (nd.rmsnorm(X, c) * g).named("Y"))


def layernorm_channels_first():
    """ConvNeXt's channels-first LayerNorm: over c of x[n, c, s], times gamma[c], plus beta[c]."""
    nd = _d(); n, c, s = nd.axes("n c s")
    X, g, bb = nd.array("X", n, c, s), nd.array("gamma", c), nd.array("beta", c)
    return nd.Diagram("layernorm_channels_first", (nd.layernorm(X, c) * g + bb).named("Y"))


def log_softmax_middle():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("log_softmax_middle", (X - nd.logsumexp(X, b)).named("Y"))


def l1_normalize_middle():
    """F.normalize(x, p=1, dim=1) of x[n, c, s]."""
    nd = _d(); n, c, s = nd.axes("n c s"); X = nd.array("X", n, c, s)
    return nd.Diagram("l1_normalize_middle", (X / (nd.sum_over(nd.absolute(X), c) + 1e-12)).named("Y"))


def cosine_sim_channels():
    """F.cosine_similarity(x, y, dim=1) of x, y[n, c, s] → [n, s]."""
    nd = _d(); n, c, s = nd.axes("n c s"); X, Y = nd.array("X", n, c, s), nd.array("Y", n, c, s)
    dot = nd.sum_over(X * Y, c)
    nx, ny = nd.sum_over(nd.square(X), c), nd.sum_over(nd.square(Y), c)
    return nd.Diagram("cosine_sim_channels", (dot * nd.rsqrt(nx * ny + 1e-16)).named("C"))


def frobenius_per_sample():
    """Each sample x[n] of x[n, a, b] divided by its Frobenius norm."""
    nd = _d(); n, a, b = nd.axes("n a b"); X = nd.array("X", n, a, b)
    return nd.Diagram("frobenius_per_sample", (X * nd.rsqrt(nd.sum_over(nd.square(X), (a, b)) + 1e-12)).named("Y"))


def group_norm_nchw_affine():
    """nn.GroupNorm on NCHW with C = g·c, as x[n, g, c, h, w]: statistics over (c, h, w), affine per channel."""
    nd = _d(); n, g, c, h, w = nd.axes("n g c h w")
    X, wt, bb = nd.array("X", n, g, c, h, w), nd.array("w", g, c), nd.array("b", g, c)
    return nd.Diagram("group_norm_nchw_affine", (nd.layernorm(X, (c, h, w)) * wt + bb).named("Y"))


def instance_norm_affine():
    """nn.InstanceNorm2d(affine=True) on NCHW: statistics over (h, w), affine per channel."""
    nd = _d(); n, c, h, w = nd.axes("n c h w")
    X, g, bb = nd.array("X", n, c, h, w), nd.array("g", c), nd.array("b", c)
    return nd.Diagram("instance_norm_affine", (nd.layernorm(X, (h, w)) * g + bb).named("Y"))


# ----------------------------------------------------------------------------- softmax and losses

def softmax_temp_bias():
    """softmax(x / T + mask) over the keys, the bias [q, x] shared by every head of x[h, q, x]."""
    nd = _d(); h, q, x = nd.axes("h q x"); X, B = nd.array("X", h, q, x), nd.array("M", q, x)
    return nd.Diagram("softmax_temp_bias", nd.softmax(nd.scale(X, 1.0 / 0.7) + B, x, name="Y"))


def cross_entropy_smoothed():
    """Per-row label-smoothed cross-entropy: lse(x) − (0.9·Σ x·y + 0.1·mean x)."""
    nd = _d(); a, b = nd.axes("a b"); X, Y = nd.array("X", a, b), nd.array("Y", a, b)
    lse = nd.logsumexp(X, b)
    return nd.Diagram("cross_entropy_smoothed",
                      (lse - (nd.sum_over(X * Y, b) * 0.9 + nd.mean_over(X, b) * 0.1)).named("L"))


# ----------------------------------------------------------------------------- elementwise chains

def chain8():
    """Eight maps: gelu, sigmoid gate, tanh, clamp, abs, pow, rsqrt, erf (odd width)."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    t = nd.tanh(nd.gelu(X) * nd.sigmoid(X))
    t = nd.power(nd.absolute(nd.clamp(t, -0.8, 0.9)), 1.5)
    return nd.Diagram("chain8", (nd.rsqrt(t + 1.0) * nd.erf(X)).named("Y"))


def chain_activations():
    """softplus → mish → hardswish → leaky_relu → selu → elu, each fed to the next."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    t = nd.hardswish(nd.mish(nd.softplus(X) - 1.0))
    return nd.Diagram("chain_activations", nd.elu(nd.selu(nd.leaky_relu(t, 0.2)), 0.5, name="Y"))


def chain_long():
    """Sixteen maps in a row (scales, shifts, sigmoid, tanh, GELU, clamps), longer than the planner's
    12-box window: one kernel however long the chain."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    t = X
    for i in range(4):
        t = nd.clamp(nd.gelu(nd.tanh(t * 1.5 + 0.25) * nd.sigmoid(X)), -2.0, 2.0)
    return nd.Diagram("chain_long", t.named("Y"))


def chain_bias_act_nchw():
    """x[n, c, h, w] + bias[c], then leaky_relu, ×2, clamp, gelu (KernelBench's conv epilogues)."""
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X, bb = nd.array("X", n, c, h, w), nd.array("bias", c)
    t = nd.clamp(nd.leaky_relu(X + bb, 0.01) * 2.0, -1.0, 1.0)
    return nd.Diagram("chain_bias_act_nchw", nd.gelu(t, name="Y"))


def minmax_broadcast():
    """min(max(x[a, b], lo[a]), hi[b]): binary max and min broadcast along different axes."""
    nd = _d(); a, b = nd.axes("a b"); X, lo, hi = nd.array("X", a, b), nd.array("lo", a), nd.array("hi", b)
    return nd.Diagram("minmax_broadcast", nd.minimum(nd.maximum(X, lo), hi, name="Y"))


def outer_batched():
    """Batched outer products u[b, i]·v[b, j] plus a scaled residual."""
    nd = _d(); b, i, j = nd.axes("b i j"); u, v, R = nd.array("u", b, i), nd.array("v", b, j), nd.array("R", b, i, j)
    return nd.Diagram("outer_batched", (u * v + R * 0.5).named("Y"))


# ----------------------------------------------------------------------------- GEMM epilogues

def gemm_bias_residual_layernorm():
    """LayerNorm(X·Wᵀ + bias + R)·gamma + beta (a transformer's post-norm output projection)."""
    nd = _d(); a, k, n = nd.axes("a k n")
    X, W, bb, R = nd.array("X", a, k), nd.array("W", n, k), nd.array("bias", n), nd.array("R", a, n)
    g, be = nd.array("gamma", n), nd.array("beta", n)
    Y = nd.contract(X, W, over=k, out=(a, n)) + bb + R
    return nd.Diagram("gemm_bias_residual_layernorm", (nd.layernorm(Y, n) * g + be).named("Z"))


def gemm_rowmean():
    nd = _d(); a, k, n = nd.axes("a k n"); X, W = nd.array("X", a, k), nd.array("W", n, k)
    return nd.Diagram("gemm_rowmean", nd.mean_over(nd.contract(X, W, over=k, out=(a, n)), n, name="M"))


def gemm_scale_rowmin():
    """KernelBench's Matmul_Scale_Min: min over n of (X·Wᵀ + bias)·s."""
    nd = _d(); a, k, n = nd.axes("a k n"); X, W, bb = nd.array("X", a, k), nd.array("W", n, k), nd.array("bias", n)
    Y = nd.scale(nd.contract(X, W, over=k, out=(a, n)) + bb, 2.0)
    return nd.Diagram("gemm_scale_rowmin", nd.min_over(Y, n, name="M"))


def gemm_swish_rowsum():
    """Σ_n swish(X·Wᵀ) written as y·σ(y) (odd K)."""
    nd = _d(); a, k, n = nd.axes("a k n"); X, W = nd.array("X", a, k), nd.array("W", n, k)
    Y = nd.contract(X, W, over=k, out=(a, n))
    return nd.Diagram("gemm_swish_rowsum", nd.sum_over(Y * nd.sigmoid(Y), n, name="S"))


def geglu_bias():
    """GeGLU with biases: gelu(X·W1ᵀ + b1) ⊙ (X·W2ᵀ + b2)."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2, b1, b2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", f, e), nd.array("b1", f), nd.array("b2", f)
    G = nd.gelu(nd.contract(X, W1, over=e, out=(a, f)) + b1)
    return nd.Diagram("geglu_bias", (G * (nd.contract(X, W2, over=e, out=(a, f)) + b2)).named("Y"))


# ----------------------------------------------------------------------------- products

def bmm_batch_scale():
    """C[b] = s[b]·A[b]·B[b]: a batched GEMM with a per-batch scale."""
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B, s = nd.array("A", b, i, k), nd.array("B", b, k, j), nd.array("s", b)
    return nd.Diagram("bmm_batch_scale", (nd.contract(A, B, over=k, out=(b, i, j)) * s).named("C"))


def bmm_at():
    """C[b] = A[b]ᵀ·B[b] with A stored [b, k, i] (torch.bmm(a.transpose(1, 2), b))."""
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B = nd.array("A", b, k, i), nd.array("B", b, k, j)
    return nd.Diagram("bmm_at", nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def bmm_two_axes():
    """C[b, i, j] = Σ_{h, d} A[b, i, h, d]·B[b, j, h, d]: heads merged in a batched product."""
    nd = _d(); b, i, j, h, d = nd.axes("b i j h d")
    A, B = nd.array("A", b, i, h, d), nd.array("B", b, j, h, d)
    return nd.Diagram("bmm_two_axes", nd.contract(A, B, over=(h, d), out=(b, i, j), name="C"))


def matvec_bias():
    """y = W·x + bias with odd sides."""
    nd = _d(); a, k = nd.axes("a k"); W, x, bb = nd.array("W", a, k), nd.array("x", k), nd.array("bias", a)
    return nd.Diagram("matvec_bias", (nd.contract(W, x, over=k, out=(a,)) + bb).named("y"))


def vecmat_bias_tanh():
    """y = tanh(x·A + bias) with A stored [k, n] (odd k)."""
    nd = _d(); k, n = nd.axes("k n"); x, A, bb = nd.array("x", k), nd.array("A", k, n), nd.array("bias", n)
    return nd.Diagram("vecmat_bias_tanh", nd.tanh(nd.contract(x, A, over=k, out=(n,)) + bb, name="y"))


# ----------------------------------------------------------------------------- attention

def _attn(nd, h, q, x, d, scale, bias=None):
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), scale)
    if bias is not None:
        S = S + bias
    return nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O")


def attention_explicit_scale():
    """scaled_dot_product_attention(..., scale=0.05), d = 128."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    return nd.Diagram("attention_explicit_scale", _attn(nd, h, q, x, d, 0.05))


def attention_shared_bias():
    """Attention with an additive bias [q, x] shared by every head (a relative-position or padding mask)."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    return nd.Diagram("attention_shared_bias", _attn(nd, h, q, x, d, 0.125, nd.array("Bias", q, x)))


def attention_d64_odd():
    """d = 64, q ≠ x, both odd (a prompt of 1001 queries against a 4095-token cache)."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    return nd.Diagram("attention_d64_odd", _attn(nd, h, q, x, d, 0.125))


def cross_attention_77():
    """Stable Diffusion's cross-attention: 4096 image queries against 77 text tokens, batched, d = 64."""
    nd = _d(); b, h, q, x, d = nd.axes("b h q x d")
    Q, K, V = nd.array("Q", b, h, q, d), nd.array("K", b, h, x, d), nd.array("V", b, h, x, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(b, h, q, x)), 0.125)
    return nd.Diagram("cross_attention_77", nd.contract(nd.softmax(S, x), V, over=x, out=(b, h, q, d), name="O"))


# ----------------------------------------------------------------------------- blocks

def mlp_gelu_bias():
    """Linear(e→f) + bias, GELU, Linear(f→e) + bias."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, b1, W2, b2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("b1", f), nd.array("W2", e, f), nd.array("b2", e)
    H = nd.gelu(nd.contract(X, W1, over=e, out=(a, f)) + b1)
    return nd.Diagram("mlp_gelu_bias", (nd.contract(H, W2, over=f, out=(a, e)) + b2).named("Y"))


def rmsnorm_swiglu_down():
    """RMSNorm·g → silu(H·Wgᵀ) ⊙ H·Wuᵀ → ·Wdᵀ, plus the residual: a LLaMA MLP sub-block."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, g = nd.array("X", a, e), nd.array("g", e)
    Wg, Wu, Wd = nd.array("Wg", f, e), nd.array("Wu", f, e), nd.array("Wd", e, f)
    H = nd.rmsnorm(X, e) * g
    G = nd.silu(nd.contract(H, Wg, over=e, out=(a, f))) * nd.contract(H, Wu, over=e, out=(a, f))
    return nd.Diagram("rmsnorm_swiglu_down", (nd.contract(G, Wd, over=f, out=(a, e)) + X).named("Y"))


# ----------------------------------------------------------------------------- einsum forms, scalars

def einsum_three():
    """``einsum("ak,k,nk->an")``: a row scale between two operands, one contraction of three."""
    nd = _d(); a, k, n = nd.axes("a k n")
    A, g, B = nd.array("A", a, k), nd.array("g", k), nd.array("B", n, k)
    return nd.Diagram("einsum_three", nd.contract(A, g, B, over=k, out=(a, n), name="C"))


def einsum_rowsum():
    """``einsum("ab->a")``: a contraction of one operand (a row sum)."""
    nd = _d(); a, b = nd.axes("a b")
    return nd.Diagram("einsum_rowsum", nd.contract(nd.array("X", a, b), over=b, out=(a,), name="Y"))


def quad_form():
    """``uᵀ·M·v`` as one contraction of three operands to a scalar."""
    nd = _d(); a, b = nd.axes("a b")
    u, M, v = nd.array("u", a), nd.array("M", a, b), nd.array("v", b)
    return nd.Diagram("quad_form", nd.contract(u, M, v, over=(a, b), out=(), name="q"))


def scalar_shared():
    """A scalar's scale read by a GEMM's epilogue and by a softmax's input."""
    nd = _d(); a, b, k, n = nd.axes("a b k n")
    ts = nd.scale(nd.array("t"), 0.5, name="ts")
    Y1 = (nd.contract(nd.array("A", a, k), nd.array("B", k, n), over=k, out=(a, n)) * ts).named("Y1")
    return nd.Diagram("scalar_shared", (Y1, nd.softmax(nd.array("X", a, b) * ts, b, name="Y2")))


PROBLEMS = {
    "var_hw": {"n": 64, "c": 256, "h": 28, "w": 28},
    "var_chw": {"n": 64, "c": 64, "h": 56, "w": 56},
    "channel_sum_nhw": {"n": 64, "c": 128, "h": 28, "w": 28},
    "mean_first_4d": {"a": 64, "b": 32, "c": 64, "e": 256},
    "max_first_4d": {"a": 77, "b": 16, "c": 64, "e": 255},
    "rmsnorm_middle_weight": {"b": 32, "c": 1001, "s": 1024},
    "layernorm_channels_first": {"n": 32, "c": 96, "s": 3136},
    "log_softmax_middle": {"a": 64, "b": 1000, "c": 256},
    "l1_normalize_middle": {"n": 32, "c": 512, "s": 1024},
    "cosine_sim_channels": {"n": 64, "c": 256, "s": 1024},
    "frobenius_per_sample": {"n": 64, "a": 512, "b": 512},
    "group_norm_nchw_affine": {"n": 32, "g": 32, "c": 8, "h": 32, "w": 32},
    "instance_norm_affine": {"n": 32, "c": 128, "h": 63, "w": 63},
    "softmax_temp_bias": {"h": 32, "q": 1024, "x": 1024},
    "cross_entropy_smoothed": {"a": 4096, "b": 32001},
    "chain8": {"a": 8192, "b": 4095},
    "chain_activations": {"a": 8192, "b": 4096},
    "chain_long": {"a": 8192, "b": 4096},
    "chain_bias_act_nchw": {"n": 64, "c": 128, "h": 56, "w": 56},
    "minmax_broadcast": {"a": 8191, "b": 4096},
    "outer_batched": {"b": 64, "i": 1024, "j": 1001},
    "gemm_bias_residual_layernorm": {"a": 4096, "k": 1024, "n": 1024},
    "gemm_rowmean": {"a": 8192, "k": 1024, "n": 4096},
    "gemm_scale_rowmin": {"a": 4096, "k": 4096, "n": 1024},
    "gemm_swish_rowsum": {"a": 4096, "k": 1001, "n": 4096},
    "geglu_bias": {"a": 4096, "e": 1024, "f": 4096},
    "bmm_batch_scale": {"b": 64, "i": 512, "j": 512, "k": 256},
    "bmm_at": {"b": 32, "i": 1024, "j": 768, "k": 512},
    "bmm_two_axes": {"b": 8, "i": 1024, "j": 1024, "h": 16, "d": 64},
    "matvec_bias": {"a": 4095, "k": 16383},
    "vecmat_bias_tanh": {"k": 1001, "n": 65536},
    "attention_explicit_scale": {"h": 16, "q": 2048, "x": 2048, "d": 128},
    "attention_shared_bias": {"h": 16, "q": 1024, "x": 1024, "d": 64},
    "attention_d64_odd": {"h": 16, "q": 1001, "x": 4095, "d": 64},
    "cross_attention_77": {"b": 2, "h": 8, "q": 4096, "x": 77, "d": 64},
    "mlp_gelu_bias": {"a": 4096, "e": 1024, "f": 4096},
    "rmsnorm_swiglu_down": {"a": 2048, "e": 2048, "f": 5632},
    "einsum_three": {"a": 4096, "k": 1024, "n": 4096},
    "einsum_rowsum": {"a": 8192, "b": 4096},
    "quad_form": {"a": 8192, "b": 8192},
    "scalar_shared": {"a": 4096, "b": 4096, "k": 1024, "n": 4096},
}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
