#!/usr/bin/env python3
"""A third operator survey: problems as kernel engineers write them, held by no test or survey before.

Written as the previous surveys were being met. It found a product summed over
two axes (``Σ_{h,d} A[a,h,d]·B[n,h,d]``) at 0.44x eager, attention's output projection
(``O[h,s,d]·W[e,h,d]``) at 0.57x, ``|x|^1.5`` at 29 % of the copy rate, and no way to write a
triangular product (``tril``/``triu`` now).

Elementwise maps and chains (squared ReLU, ELU with leaky ReLU, |x|^p, a sigmoid gate, A·B + C, a
bias along the rows or channels of NCHW), norms (layernorm with its affine, add then RMSNorm,
group norm with per-channel affine), reductions over odd axes (global average pooling, a max over
the first axis, a logsumexp over the first axis, a softmax over the first of three axes, sums over
middle axes, column variance), GEMMs with epilogues (a residual and RMSNorm, a row max, log-softmax,
L2 normalisation, a column mean, a triangle), dual products (GEGLU, an RMSNorm feeding two), chains
of products (a three-layer MLP, SwiGLU with its down projection, a residual MLP), batched and
transposed products (4096 batches of 32 x 32 tiles, a transposed result, heads first), sums over
two axes, matrix-vector products both ways, cross-attention, d = 80 GQA and d = 192 attention.
Each is a module-level function, so it also works on the command line::

    napkin derive benchmarks/heldout_survey2.py:merge_heads -s s=4096 -s h=32 -s d=128 -s e=4096

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey2.py [--out heldout2.jsonl] [--dtypes bf16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


def geglu():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, Wg, Wu = nd.array("X", a, e), nd.array("Wg", f, e), nd.array("Wu", f, e)
    g = nd.gelu(nd.contract(X, Wg, over=e, out=(a, f)))
    u = nd.contract(X, Wu, over=e, out=(a, f))
    return nd.Diagram("geglu", (g * u).named("Y"))


def squared_relu():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("squared_relu", nd.square(nd.relu(X), name="Y"))


def layernorm_affine():
    nd = _d(); a, b = nd.axes("a b")
    X, g, be = nd.array("X", a, b), nd.array("g", b), nd.array("beta", b)
    return nd.Diagram("layernorm_affine", (nd.layernorm(X, b) * g + be).named("Y"))


def add_rmsnorm():
    nd = _d(); a, b = nd.axes("a b")
    X, R, g = nd.array("X", a, b), nd.array("R", a, b), nd.array("g", b)
    return nd.Diagram("add_rmsnorm", (nd.rmsnorm(X + R, b) * g).named("Y"))


def linear_residual_norm():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W, R = nd.array("X", a, e), nd.array("W", f, e), nd.array("R", a, f)
    Y = nd.contract(X, W, over=e, out=(a, f)) + R
    return nd.Diagram("linear_residual_norm", nd.rmsnorm(Y, f, name="Z"))


def scores_softmax():
    nd = _d(); h, q, k, d = nd.axes("h q k d")
    Q, K = nd.array("Q", h, q, d), nd.array("K", h, k, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, q, k)), 0.125)
    return nd.Diagram("scores_softmax", nd.softmax(S, k, name="P"))


def global_avg_pool():
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    return nd.Diagram("global_avg_pool", nd.mean_over(X, (h, w), name="Y"))


def max_pool_w():
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    return nd.Diagram("max_pool_w", nd.max_over(X, w, name="Y"))


def batched_matvec():
    nd = _d(); b, m, k = nd.axes("b m k")
    A, x = nd.array("A", b, m, k), nd.array("x", b, k)
    return nd.Diagram("batched_matvec", nd.contract(A, x, over=k, name="y"))


def outer_product():
    nd = _d(); a, b = nd.axes("a b")
    x, y = nd.array("x", a), nd.array("y", b)
    return nd.Diagram("outer_product", (x * y).named("Y"))


def contract_two_axes():
    nd = _d(); a, h, d, n = nd.axes("a h d n")
    A, B = nd.array("A", a, h, d), nd.array("B", n, h, d)
    return nd.Diagram("contract_two_axes", nd.contract(A, B, over=(h, d), out=(a, n), name="C"))


def row_variance():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("row_variance", nd.mean_over(nd.square(X - nd.mean_over(X, b)), b, name="V"))


def column_standardize():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    D = X - nd.mean_over(X, a)
    return nd.Diagram("column_standardize", (D * nd.rsqrt(nd.mean_over(nd.square(D), a) + 1e-5)).named("Y"))


def mlp3():
    nd = _d(); a, e, f, g, o = nd.axes("a e f g o")
    X, W1, W2, W3 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", g, f), nd.array("W3", o, g)
    h1 = nd.relu(nd.contract(X, W1, over=e, out=(a, f)))
    h2 = nd.relu(nd.contract(h1, W2, over=f, out=(a, g)))
    return nd.Diagram("mlp3", nd.contract(h2, W3, over=g, out=(a, o), name="Y"))


def fma3():
    nd = _d(); a, b = nd.axes("a b")
    A, B, C = nd.array("A", a, b), nd.array("B", a, b), nd.array("C", a, b)
    return nd.Diagram("fma3", (A * B + C).named("Y"))


def logsumexp_first():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("logsumexp_first", nd.logsumexp(X, a, name="L"))


def elu_leaky_mix():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("elu_leaky_mix", (nd.elu(X) * 2.0 + nd.leaky_relu(X, 0.2)).named("Y"))


def row_sum_normalize():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("row_sum_normalize", (X / nd.sum_over(X, b)).named("Y"))


def softmax_temperature():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("softmax_temperature", nd.softmax(nd.scale(X, 0.5), b, name="Y"))


def min_max_scale():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    lo, hi = nd.min_over(X, b), nd.max_over(X, b)
    return nd.Diagram("min_max_scale", ((X - lo) / (hi - lo + 1e-6)).named("Y"))


def row_bias():
    nd = _d(); a, b = nd.axes("a b"); X, r = nd.array("X", a, b), nd.array("r", a)
    return nd.Diagram("row_bias", nd.relu(X + r, name="Y"))


def gemm_transposed_out():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, B = nd.array("A", a, k), nd.array("B", k, n)
    return nd.Diagram("gemm_transposed_out", nd.contract(A, B, over=k, out=(n, a), name="C"))


def gemm_rowmax():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W = nd.array("A", a, k), nd.array("W", n, k)
    return nd.Diagram("gemm_rowmax", nd.max_over(nd.contract(A, W, over=k, out=(a, n)), n, name="M"))


def dot_rows():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    return nd.Diagram("dot_rows", nd.sum_over(P * T, b, name="D"))


def abs_power():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("abs_power", nd.power(nd.absolute(X), 1.5, name="Y"))


def cross_attention():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), 0.125)
    P = nd.softmax(S, x)
    return nd.Diagram("cross_attention", nd.contract(P, V, over=x, out=(h, q, d), name="O"))


def rmsnorm_linear_silu():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W = nd.array("X", a, e), nd.array("W", f, e)
    return nd.Diagram("rmsnorm_linear_silu", nd.silu(nd.contract(nd.rmsnorm(X, e), W, over=e, out=(a, f)), name="Y"))


def residual_mlp():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", e, f)
    h = nd.gelu(nd.contract(X, W1, over=e, out=(a, f)))
    return nd.Diagram("residual_mlp", (X + nd.contract(h, W2, over=f, out=(a, e))).named("Y"))


def mean_sq_cols():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("mean_sq_cols", nd.mean_over(nd.square(X), (a, c), name="Y"))


def tril_matmul():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, B = nd.array("A", a, k), nd.array("B", k, n)
    return nd.Diagram("tril_matmul", nd.tril(nd.contract(A, B, over=k), a, n, name="C"))


def small_bmm():
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B = nd.array("A", b, i, k), nd.array("B", b, k, j)
    return nd.Diagram("small_bmm", nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def bmm_transposed_out():
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B = nd.array("A", b, i, k), nd.array("B", b, k, j)
    return nd.Diagram("bmm_transposed_out", nd.contract(A, B, over=k, out=(b, j, i), name="C"))


def heads_first_out():
    nd = _d(); s, h, d, e = nd.axes("s h d e")
    X, W = nd.array("X", s, e), nd.array("W", h, d, e)
    return nd.Diagram("heads_first_out", nd.contract(X, W, over=e, out=(h, s, d), name="Q"))


def merge_heads():
    nd = _d(); s, h, d, e = nd.axes("s h d e")
    O, W = nd.array("O", h, s, d), nd.array("W", e, h, d)
    return nd.Diagram("merge_heads", nd.contract(O, W, over=(h, d), out=(s, e), name="Y"))


def gqa_d80():
    nd = _d(); h, j, q, x, d = nd.axes("h j q x d")
    Q, K, V = nd.array("Q", h, j, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, j, q, x)), 80 ** -0.5)
    P = nd.softmax(nd.causal(S, q, x), x)
    return nd.Diagram("gqa_d80", nd.contract(P, V, over=x, out=(h, j, q, d), name="O"))


def attention_d192():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), 192 ** -0.5)
    return nd.Diagram("attention_d192", nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


def sum_middle_4d():
    nd = _d(); a, b, c, e = nd.axes("a b c e"); X = nd.array("X", a, b, c, e)
    return nd.Diagram("sum_middle_4d", nd.sum_over(X, (b, c), name="Y"))


def max_first_axis():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("max_first_axis", nd.max_over(X, a, name="Y"))


def softmax_first_axis_3d():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("softmax_first_axis_3d", nd.softmax(X, a, name="Y"))


def group_norm_affine():
    nd = _d(); n, g, c, s = nd.axes("n g c s")
    X, w, bb = nd.array("X", n, g, c, s), nd.array("w", g, c), nd.array("b", g, c)
    return nd.Diagram("group_norm_affine", (nd.layernorm(X, (c, s)) * w + bb).named("Y"))


def gemm_logsoftmax():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W = nd.array("A", a, k), nd.array("W", n, k)
    L = nd.contract(A, W, over=k, out=(a, n))
    return nd.Diagram("gemm_logsoftmax", (L - nd.logsumexp(L, n)).named("Y"))


def gemm_l2norm():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W = nd.array("A", a, k), nd.array("W", n, k)
    Y = nd.contract(A, W, over=k, out=(a, n))
    return nd.Diagram("gemm_l2norm", (Y * nd.rsqrt(nd.sum_over(nd.square(Y), n) + 1e-12)).named("Z"))


def gemm_colmean():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W = nd.array("A", a, k), nd.array("W", n, k)
    return nd.Diagram("gemm_colmean", nd.mean_over(nd.relu(nd.contract(A, W, over=k, out=(a, n))), a, name="M"))


def norm_then_two_linears():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2, g = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", f, e), nd.array("g", e)
    H = nd.rmsnorm(X, e) * g
    return nd.Diagram("norm_then_two_linears", (nd.silu(nd.contract(H, W1, over=e, out=(a, f)))
                                               * nd.contract(H, W2, over=e, out=(a, f))).named("Y"))


def bias_gelu_3d():
    nd = _d(); b, s, e = nd.axes("b s e"); X, bb = nd.array("X", b, s, e), nd.array("bias", e)
    return nd.Diagram("bias_gelu_3d", nd.gelu(X + bb, name="Y"))


def channel_affine_nchw():
    nd = _d(); n, c, h, w = nd.axes("n c h w")
    X, g, bb = nd.array("X", n, c, h, w), nd.array("g", c), nd.array("b", c)
    return nd.Diagram("channel_affine_nchw", nd.relu(X * g + bb, name="Y"))


def cosine_sim_matrix():
    nd = _d(); a, b, d = nd.axes("a b d")
    X, Y = nd.array("X", a, d), nd.array("Y", b, d)
    xn = X * nd.rsqrt(nd.sum_over(nd.square(X), d) + 1e-8)
    yn = Y * nd.rsqrt(nd.sum_over(nd.square(Y), d) + 1e-8)
    return nd.Diagram("cosine_sim_matrix", nd.contract(xn, yn, over=d, out=(a, b), name="S"))


def logits_lse():
    nd = _d(); t, e, v = nd.axes("t e v")
    H, W = nd.array("H", t, e), nd.array("W", v, e)
    return nd.Diagram("logits_lse", nd.logsumexp(nd.contract(H, W, over=e, out=(t, v)), v, name="L"))


def swiglu_down():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, Wg, Wu, Wd = nd.array("X", a, e), nd.array("Wg", f, e), nd.array("Wu", f, e), nd.array("Wd", e, f)
    h = nd.silu(nd.contract(X, Wg, over=e, out=(a, f))) * nd.contract(X, Wu, over=e, out=(a, f))
    return nd.Diagram("swiglu_down", nd.contract(h, Wd, over=f, out=(a, e), name="Y"))


def matvec_tall():
    nd = _d(); m, k = nd.axes("m k"); A, x = nd.array("A", m, k), nd.array("x", k)
    return nd.Diagram("matvec_tall", nd.contract(A, x, over=k, name="y"))


def vecmat_wide():
    nd = _d(); m, k = nd.axes("m k"); A, x = nd.array("A", k, m), nd.array("x", k)
    return nd.Diagram("vecmat_wide", nd.contract(x, A, over=k, name="y"))


def odd_gemm_bias_relu():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W, bb = nd.array("A", a, k), nd.array("W", n, k), nd.array("bias", n)
    return nd.Diagram("odd_gemm_bias_relu", nd.relu(nd.contract(A, W, over=k, out=(a, n)) + bb, name="Y"))


def sigmoid_gate_mul():
    nd = _d(); a, b = nd.axes("a b"); X, G = nd.array("X", a, b), nd.array("G", a, b)
    return nd.Diagram("sigmoid_gate_mul", (X * nd.sigmoid(G)).named("Y"))


def var_mean_cols_3d():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    m = nd.mean_over(X, a)
    return nd.Diagram("var_mean_cols_3d", nd.mean_over(nd.square(X - m), a, name="V"))


PROBLEMS = {
    "tril_matmul": {"a": 4096, "k": 4096, "n": 4096},
    "geglu": {"a": 4096, "e": 2048, "f": 5632},
    "squared_relu": {"a": 8192, "b": 4096},
    "layernorm_affine": {"a": 8192, "b": 4096},
    "add_rmsnorm": {"a": 8192, "b": 4096},
    "linear_residual_norm": {"a": 4096, "e": 1024, "f": 4096},
    "scores_softmax": {"h": 16, "q": 1024, "k": 1024, "d": 64},
    "global_avg_pool": {"n": 32, "c": 256, "h": 32, "w": 32},
    "max_pool_w": {"n": 32, "c": 256, "h": 32, "w": 32},
    "batched_matvec": {"b": 64, "m": 4096, "k": 1024},
    "outer_product": {"a": 8192, "b": 8192},
    "contract_two_axes": {"a": 4096, "h": 32, "d": 128, "n": 4096},
    "row_variance": {"a": 8192, "b": 4096},
    "column_standardize": {"a": 8192, "b": 4096},
    "mlp3": {"a": 4096, "e": 1024, "f": 4096, "g": 1024, "o": 512},
    "fma3": {"a": 8192, "b": 4096},
    "logsumexp_first": {"a": 8192, "b": 4096},
    "elu_leaky_mix": {"a": 8192, "b": 4096},
    "row_sum_normalize": {"a": 8192, "b": 4096},
    "softmax_temperature": {"a": 8192, "b": 4096},
    "min_max_scale": {"a": 8192, "b": 4096},
    "row_bias": {"a": 8192, "b": 4096},
    "gemm_transposed_out": {"a": 4096, "k": 4096, "n": 4096},
    "gemm_rowmax": {"a": 8192, "k": 1024, "n": 1024},
    "dot_rows": {"a": 8192, "b": 4096},
    "abs_power": {"a": 8192, "b": 4096},
    "cross_attention": {"h": 16, "q": 1024, "x": 4096, "d": 64},
    "rmsnorm_linear_silu": {"a": 4096, "e": 4096, "f": 4096},
    "residual_mlp": {"a": 4096, "e": 1024, "f": 4096},
    "mean_sq_cols": {"a": 64, "b": 512, "c": 1024},
    "small_bmm": {"b": 4096, "i": 32, "j": 32, "k": 64},
    "bmm_transposed_out": {"b": 32, "i": 1024, "j": 1024, "k": 512},
    "heads_first_out": {"s": 4096, "h": 32, "d": 128, "e": 4096},
    "merge_heads": {"s": 4096, "h": 32, "d": 128, "e": 4096},
    "gqa_d80": {"h": 8, "j": 4, "q": 2048, "x": 2048, "d": 80},
    "attention_d192": {"h": 16, "q": 2048, "x": 2048, "d": 192},
    "sum_middle_4d": {"a": 32, "b": 64, "c": 64, "e": 256},
    "max_first_axis": {"a": 8192, "b": 4096},
    "softmax_first_axis_3d": {"a": 512, "b": 64, "c": 512},
    "group_norm_affine": {"n": 32, "g": 32, "c": 16, "s": 4096},
    "gemm_logsoftmax": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_l2norm": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_colmean": {"a": 8192, "k": 1024, "n": 2048},
    "norm_then_two_linears": {"a": 4096, "e": 2048, "f": 5632},
    "bias_gelu_3d": {"b": 64, "s": 512, "e": 1024},
    "channel_affine_nchw": {"n": 64, "c": 128, "h": 56, "w": 56},
    "cosine_sim_matrix": {"a": 4096, "b": 4096, "d": 512},
    "logits_lse": {"t": 2048, "e": 2048, "v": 32000},
    "swiglu_down": {"a": 2048, "e": 2048, "f": 5632},
    "matvec_tall": {"m": 65536, "k": 4096},
    "vecmat_wide": {"k": 4096, "m": 65536},
    "odd_gemm_bias_relu": {"a": 8205, "k": 2949, "n": 5921},
    "sigmoid_gate_mul": {"a": 8192, "b": 4096},
    "var_mean_cols_3d": {"a": 256, "b": 64, "c": 1024},
}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
