#!/usr/bin/env python3
"""A seventh operator survey: structural variety rather than new operators.

Diagrams whose shape, not their operators, is what an outside test would vary: several outputs
and intermediates that are also outputs, values read by several boxes (diamonds), outputs whose
axes are in another order than their inputs', broadcasts of arrays with different axis sets,
reductions to a scalar and reductions of reductions over other axes, chains that mix
contractions, maps and reductions in many orders, contractions of one or three operands (einsum
forms), attention with masks, an extra head axis, q = 1, d = 16 / 32 / 80, heads stored between
the sequence and the head dimension, and the backward (``Diagram.grad``) of twenty-one of them.
Written for the twenty-fourth session's structural audit, which planned each on the h200 and
a100 profiles in bf16 and fp32 and interpreted every plan against the float64 reference on the
CPU. Each is a module-level function, so it also works on the command line::

    napkin derive benchmarks/heldout_survey6.py:three_operand_contract -s a=4096 -s k=1024 -s n=4096

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey6.py [--out heldout6.jsonl] [--dtypes bf16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


# ------------------------------------------------------------------ several outputs, diamonds

def value_and_rowsum():
    """Y = gelu(X) and its row sum S (an intermediate that is also an output)."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    Y = nd.gelu(X, name="Y")
    return nd.Diagram("value_and_rowsum", (Y, nd.sum_over(Y, b, name="S")))


def softmax_and_log():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    P = nd.softmax(X, b, name="P")
    return nd.Diagram("softmax_and_log", (P, nd.log(P, name="L")))


def two_branches():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("two_branches", (nd.scale(nd.relu(X), 2.0, name="Y1"), (nd.sigmoid(X) + 1.0).named("Y2")))


def diamond_map():
    """t = tanh(X) read by two boxes, joined again."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    t = nd.tanh(X)
    return nd.Diagram("diamond_map", (t * t + nd.sigmoid(t)).named("Y"))


def manual_softmax_with_max():
    """softmax written out, the row max also an output."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    m = nd.max_over(X, b, name="M")
    e = nd.exp(X - m)
    return nd.Diagram("manual_softmax_with_max", (m, (e / nd.sum_over(e, b)).named("P")))


def map_reduce_center_outputs():
    """H = X*W, S = Σ_b H, Z = H − S: three outputs, H read by two boxes."""
    nd = _d(); a, b = nd.axes("a b"); X, W = nd.array("X", a, b), nd.array("W", a, b)
    H = (X * W).named("H")
    S = nd.sum_over(H, b, name="S")
    return nd.Diagram("map_reduce_center_outputs", (H, S, (H - S).named("Z")))


def row_and_col_sums():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("row_and_col_sums", (nd.sum_over(X, b, name="R"), nd.sum_over(X, a, name="C")))


def max_and_min_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("max_and_min_rows", (nd.max_over(X, b, name="MX"), nd.min_over(X, b, name="MN")))


def layernorm_with_stats():
    """A layernorm written out that also outputs its mean and rstd."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    mu = nd.mean_over(X, b, name="MU")
    c = X - mu
    r = nd.rsqrt(nd.mean_over(c * c, b) + 1e-5).named("R")
    return nd.Diagram("layernorm_with_stats", ((c * r).named("Y"), mu, r))


def logsoftmax_and_lse():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    lse = nd.logsumexp(X, b, name="LSE")
    return nd.Diagram("logsoftmax_and_lse", ((X - lse).named("Y"), lse))


def gemm_and_rowsum_colsum():
    """C = A·B and its row and column sums, all outputs."""
    nd = _d(); a, k, n = nd.axes("a k n"); A, B = nd.array("A", a, k), nd.array("B", k, n)
    C = nd.contract(A, B, over=k, out=(a, n), name="C")
    return nd.Diagram("gemm_and_rowsum_colsum", (C, nd.sum_over(C, n, name="RS"), nd.sum_over(C, a, name="CS")))


def gemm_colsum_only():
    nd = _d(); a, k, n = nd.axes("a k n"); A, B = nd.array("A", a, k), nd.array("B", n, k)
    return nd.Diagram("gemm_colsum_only", nd.sum_over(nd.contract(A, B, over=k, out=(a, n)), a, name="CS"))


# ------------------------------------------------------------------ unusual axis orders

def gemm_transposed_out():
    """C[n, a] = Σ_k A[a, k]·B[k, n]."""
    nd = _d(); a, k, n = nd.axes("a k n"); A, B = nd.array("A", a, k), nd.array("B", k, n)
    return nd.Diagram("gemm_transposed_out", nd.contract(A, B, over=k, out=(n, a), name="C"))


def reduce_permuted_keep():
    """Y[c, a] = Σ_b X[a, b, c] (kept axes permuted)."""
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("reduce_permuted_keep", nd.contract(X, over=b, out=(c, a), name="Y"))


def transpose_map_add():
    """Y[a, b] = Z[a, b] + gelu(X[b, a]): an input read transposed against the output."""
    nd = _d(); a, b = nd.axes("a b"); X, Z = nd.array("X", b, a), nd.array("Z", a, b)
    return nd.Diagram("transpose_map_add", (Z + nd.gelu(X)).named("Y"))


def pure_transpose():
    """Y[a, b] = X[b, a]: a one-operand contraction over nothing."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", b, a)
    return nd.Diagram("pure_transpose", nd.contract(X, over=(), out=(a, b), name="Y"))


def transpose_scale_3d():
    """Y[c, a, b] = 2·X[a, b, c] (a rotation of three axes)."""
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("transpose_scale_3d", nd.scale(nd.contract(X, over=(), out=(c, a, b)), 2.0, name="Y"))


def bias_first_map_order():
    """y[b] + X[a, b]: the map's output order is (b, a), X stored (a, b)."""
    nd = _d(); a, b = nd.axes("a b"); X, y = nd.array("X", a, b), nd.array("y", b)
    return nd.Diagram("bias_first_map_order", nd.relu(y + X, name="Y"))


def softmax_transposed_scores():
    """P[n, a] = softmax over n of Σ_k A[a,k]·B[n,k] written into [n, a] (softmax over the outer axis)."""
    nd = _d(); a, k, n = nd.axes("a k n"); A, B = nd.array("A", a, k), nd.array("B", n, k)
    S = nd.contract(A, B, over=k, out=(n, a))
    return nd.Diagram("softmax_transposed_scores", nd.softmax(S, n, name="P"))


# ------------------------------------------------------------------ broadcasting

def outer_sum():
    nd = _d(); a, b = nd.axes("a b"); r, c = nd.array("r", a), nd.array("c", b)
    return nd.Diagram("outer_sum", (r + c).named("M"))


def outer_product_contract():
    nd = _d(); a, b = nd.axes("a b"); u, v = nd.array("u", a), nd.array("v", b)
    return nd.Diagram("outer_product_contract", nd.contract(u, v, over=(), out=(a, b), name="M"))


def broadcast3_mixed():
    """X[a,b,c] + y[b]·z[a,c]."""
    nd = _d(); a, b, c = nd.axes("a b c")
    X, y, z = nd.array("X", a, b, c), nd.array("y", b), nd.array("z", a, c)
    return nd.Diagram("broadcast3_mixed", (X + y * z).named("Y"))


def broadcast_vec_first():
    """y[b]·z[a,c] + X[a,b,c]: the small operands first, output axes (b, a, c)."""
    nd = _d(); a, b, c = nd.axes("a b c")
    X, y, z = nd.array("X", a, b, c), nd.array("y", b), nd.array("z", a, c)
    return nd.Diagram("broadcast_vec_first", nd.tanh(y * z + X, name="Y"))


def affine_rows_cols():
    """tanh(X[a,b]·g[b] + h[a])."""
    nd = _d(); a, b = nd.axes("a b"); X, g, h = nd.array("X", a, b), nd.array("g", b), nd.array("h", a)
    return nd.Diagram("affine_rows_cols", nd.tanh(X * g + h, name="Y"))


def column_center():
    """X − mean over a (centering columns)."""
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("column_center", (X - nd.mean_over(X, a)).named("Y"))


# ------------------------------------------------------------------ reductions

def reduce_to_scalar():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("reduce_to_scalar", nd.sum_over(X, (a, b), name="S"))


def mse_loss_scalar():
    nd = _d(); a, b = nd.axes("a b"); X, Y = nd.array("X", a, b), nd.array("Y", a, b)
    return nd.Diagram("mse_loss_scalar", nd.mean_over(nd.square(X - Y), (a, b), name="L"))


def reduce_all_but_middle():
    """Y[b] = Σ_{a,c} X[a,b,c]."""
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("reduce_all_but_middle", nd.sum_over(X, (a, c), name="Y"))


def reduce_of_reduce():
    """Y[b] = max_a Σ_c X[a,b,c]."""
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("reduce_of_reduce", nd.max_over(nd.sum_over(X, c), a, name="Y"))


def rms_scalar():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("rms_scalar", nd.sqrt(nd.mean_over(nd.square(X), (a, b)), name="R"))


def rms_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("rms_rows", nd.sqrt(nd.mean_over(nd.square(X), b), name="R"))


def normalize_by_global_max():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("normalize_by_global_max", (X / (nd.max_over(nd.absolute(X), (a, b)) + 1e-6)).named("Y"))


def softmax_first_axis():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("softmax_first_axis", nd.softmax(X, a, name="P"))


def softmax_pairs():
    """softmax over x of size 2 (SIZES has x=2)."""
    nd = _d(); r, x = nd.axes("r x"); X = nd.array("X", r, x)
    return nd.Diagram("softmax_pairs", nd.softmax(X, x, name="P"))


def softmax_size1():
    """softmax over an axis of size 1 (all ones)."""
    nd = _d(); r, x = nd.axes("r x"); X = nd.array("X", r, x)
    return nd.Diagram("softmax_size1", nd.softmax(X, x, name="P"))


def layernorm_size1_rows():
    """layernorm with one row, a wide one."""
    nd = _d(); a, b = nd.axes("a b"); X, g = nd.array("X", a, b), nd.array("g", b)
    return nd.Diagram("layernorm_size1_rows", (nd.layernorm(X, b) * g).named("Y"))


def cross_entropy_mean_scalar():
    """mean over rows of lse(X) − Σ X·T: the loss as one number."""
    nd = _d(); a, b = nd.axes("a b"); X, T = nd.array("X", a, b), nd.array("T", a, b)
    return nd.Diagram("cross_entropy_mean_scalar",
                      nd.mean_over(nd.logsumexp(X, b) - nd.sum_over(X * T, b), a, name="L"))


def cosine_rows_with_norms():
    nd = _d(); a, b = nd.axes("a b"); X, Y = nd.array("X", a, b), nd.array("Y", a, b)
    nx = nd.sqrt(nd.sum_over(nd.square(X), b), name="NX")
    ny = nd.sqrt(nd.sum_over(nd.square(Y), b), name="NY")
    return nd.Diagram("cosine_rows_with_norms", ((nd.sum_over(X * Y, b) / (nx * ny + 1e-8)).named("C"), nx, ny))


def variance_columns():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    m = nd.mean_over(X, a)
    return nd.Diagram("variance_columns", nd.mean_over(nd.square(X - m), a, name="V"))


# ------------------------------------------------------------------ chains of contractions and maps

def map_gemm_rownorm_gemm():
    """H = gelu(X)·W1ᵀ; s = Σ_f H²; G = H·rsqrt(s/f); Y = G·W2ᵀ."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", e, f)
    H = nd.contract(nd.gelu(X), W1, over=e, out=(a, f))
    s = nd.mean_over(nd.square(H), f)
    G = H * nd.rsqrt(s + 1e-6)
    return nd.Diagram("map_gemm_rownorm_gemm", nd.contract(G, W2, over=f, out=(a, e), name="Y"))


def two_gemms_shared_input():
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", f, e)
    return nd.Diagram("two_gemms_shared_input", (nd.contract(X, W1, over=e, out=(a, f), name="Y1"),
                                                 nd.contract(X, W2, over=e, out=(a, f), name="Y2")))


def two_gemms_shared_weight():
    nd = _d(); a, b, e, f = nd.axes("a b e f")
    X1, X2, W = nd.array("X1", a, e), nd.array("X2", b, e), nd.array("W", f, e)
    return nd.Diagram("two_gemms_shared_weight", (nd.contract(X1, W, over=e, out=(a, f), name="Y1"),
                                                  nd.contract(X2, W, over=e, out=(b, f), name="Y2")))


def abc_chain():
    nd = _d(); a, b, c, e = nd.axes("a b c e")
    A, B, C = nd.array("A", a, b), nd.array("B", b, c), nd.array("C", c, e)
    return nd.Diagram("abc_chain", nd.contract(nd.contract(A, B, over=b, out=(a, c)), C, over=c, out=(a, e), name="D"))


def three_operand_contract():
    """Σ_k A[a,k]·g[k]·B[n,k] (a diagonal scaling inside the product)."""
    nd = _d(); a, k, n = nd.axes("a k n"); A, g, B = nd.array("A", a, k), nd.array("g", k), nd.array("B", n, k)
    return nd.Diagram("three_operand_contract", nd.contract(A, g, B, over=k, out=(a, n), name="C"))


def contract_two_axes():
    """C[a,n] = Σ_{k,l} A[a,k,l]·B[k,l,n]."""
    nd = _d(); a, k, l, n = nd.axes("a k l n")
    A, B = nd.array("A", a, k, l), nd.array("B", k, l, n)
    return nd.Diagram("contract_two_axes", nd.contract(A, B, over=(k, l), out=(a, n), name="C"))


def batched_middle_axis():
    """C[i,b,j] = Σ_k A[i,b,k]·B[k,b,j]: batch axis in the middle."""
    nd = _d(); i, b, j, k = nd.axes("i b j k")
    A, B = nd.array("A", i, b, k), nd.array("B", k, b, j)
    return nd.Diagram("batched_middle_axis", nd.contract(A, B, over=k, out=(i, b, j), name="C"))


def batched_last_axis():
    """C[b,i,j] = Σ_k A[i,k,b]·B[k,j,b]: batch axis last in the inputs."""
    nd = _d(); i, b, j, k = nd.axes("i b j k")
    A, B = nd.array("A", i, k, b), nd.array("B", k, j, b)
    return nd.Diagram("batched_last_axis", nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def sum_of_products():
    """A·B + C·D."""
    nd = _d(); a, k, l, n = nd.axes("a k l n")
    A, B, C, D = nd.array("A", a, k), nd.array("B", n, k), nd.array("C", a, l), nd.array("D", n, l)
    return nd.Diagram("sum_of_products", (nd.contract(A, B, over=k, out=(a, n)) + nd.contract(C, D, over=l, out=(a, n))).named("Y"))


def gram_matrix():
    """G[a,c] = Σ_k X[a,k]·X[c,k] (one input read as both operands)."""
    nd = _d(); a, c, k = nd.axes("a c k"); X = nd.array("X", a, k)
    return nd.Diagram("gram_matrix", nd.contract(X, nd.rename(X, a="c"), over=k, out=(a, c), name="G"))


def contract_relu_weight():
    """X·relu(W)ᵀ: a map on the weight before the product."""
    nd = _d(); a, k, n = nd.axes("a k n"); X, W = nd.array("X", a, k), nd.array("W", n, k)
    return nd.Diagram("contract_relu_weight", nd.contract(X, nd.relu(W), over=k, out=(a, n), name="Y"))


def contract_scaled_input():
    """(X·s[k])·Wᵀ, then a bias and silu."""
    nd = _d(); a, k, n = nd.axes("a k n"); X, s, W, bb = nd.array("X", a, k), nd.array("s", k), nd.array("W", n, k), nd.array("bias", n)
    return nd.Diagram("contract_scaled_input", nd.silu(nd.contract(X * s, W, over=k, out=(a, n)) + bb, name="Y"))


def quadratic_form_scalar():
    """uᵀ·A·v as one number."""
    nd = _d(); a, b = nd.axes("a b"); u, A, v = nd.array("u", a), nd.array("A", a, b), nd.array("v", b)
    return nd.Diagram("quadratic_form_scalar", nd.contract(u, A, v, over=(a, b), out=(), name="S"))


def batched_matvec_transposed():
    """y[b,a] = Σ_k W[k,a]·x[b,k]."""
    nd = _d(); a, b, k = nd.axes("a b k"); W, x = nd.array("W", k, a), nd.array("x", b, k)
    return nd.Diagram("batched_matvec_transposed", nd.contract(W, x, over=k, out=(b, a), name="y"))


def softmax_then_contract_other_axis():
    """P = softmax_b(S[a,b]); Y[b,c] = Σ_a P[a,b]·V[a,c] (the contraction sums over the kept axis)."""
    nd = _d(); a, b, c = nd.axes("a b c"); S, V = nd.array("S", a, b), nd.array("V", a, c)
    return nd.Diagram("softmax_then_contract_other_axis", nd.contract(nd.softmax(S, b), V, over=a, out=(b, c), name="Y"))


def residual_mlp_ln_two_outputs():
    """H = LN(X)·W1ᵀ (output), Y = X + gelu(H)·W2ᵀ (output)."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W1, W2 = nd.array("X", a, e), nd.array("W1", f, e), nd.array("W2", e, f)
    H = nd.contract(nd.layernorm(X, e), W1, over=e, out=(a, f), name="H")
    Y = (X + nd.contract(nd.gelu(H), W2, over=f, out=(a, e))).named("Y")
    return nd.Diagram("residual_mlp_ln_two_outputs", (H, Y))


def rmsnorm_proj_scalar_loss():
    """mean over everything of (RMSNorm(X)·Wᵀ − T)²."""
    nd = _d(); a, e, f = nd.axes("a e f")
    X, W, T = nd.array("X", a, e), nd.array("W", f, e), nd.array("T", a, f)
    Y = nd.contract(nd.rmsnorm(X, e), W, over=e, out=(a, f))
    return nd.Diagram("rmsnorm_proj_scalar_loss", nd.mean_over(nd.square(Y - T), (a, f), name="L"))


def gemm_softmax_transposed_in():
    """softmax over n of Aᵀ·B with A stored [k, a]."""
    nd = _d(); a, k, n = nd.axes("a k n"); A, B = nd.array("A", k, a), nd.array("B", k, n)
    return nd.Diagram("gemm_softmax_transposed_in", nd.softmax(nd.contract(A, B, over=k, out=(a, n)), n, name="P"))


def matvec_chain():
    """y = W2·relu(W1·x) (two matrix-vector products)."""
    nd = _d(); a, b, c = nd.axes("a b c"); W1, W2, x = nd.array("W1", b, a), nd.array("W2", c, b), nd.array("x", a)
    return nd.Diagram("matvec_chain", nd.contract(W2, nd.relu(nd.contract(W1, x, over=a, out=(b,))), over=b, out=(c,), name="y"))


# ------------------------------------------------------------------ attention

def _sc(nd, Q, K, over, out, scale):
    return nd.scale(nd.contract(Q, K, over=over, out=out), scale)


def attention_causal_scale():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = nd.causal(_sc(nd, Q, K, d, (h, q, x), 0.088), q, x)
    return nd.Diagram("attention_causal_scale", nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


def attention_mask_input():
    """Additive mask M[h,q,x] given as an input, with a scale."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V, M = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d), nd.array("M", h, q, x)
    S = _sc(nd, Q, K, d, (h, q, x), 0.125) + M
    return nd.Diagram("attention_mask_input", nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


def attention_gqa_extra_axis():
    """GQA: h kv heads, j query heads each; Q[h,j,q,d], K,V[h,x,d]."""
    nd = _d(); h, j, q, x, d = nd.axes("h j q x d")
    Q, K, V = nd.array("Q", h, j, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = _sc(nd, Q, K, d, (h, j, q, x), 0.125)
    return nd.Diagram("attention_gqa_extra_axis", nd.contract(nd.softmax(S, x), V, over=x, out=(h, j, q, d), name="O"))


def attention_q1_decode():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = _sc(nd, Q, K, d, (h, q, x), 0.088)
    return nd.Diagram("attention_q1_decode", nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


def _plain_attn(name):
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = _sc(nd, Q, K, d, (h, q, x), 0.1)
    return nd.Diagram(name, nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


def attention_d16():
    return _plain_attn("attention_d16")


def attention_d32():
    return _plain_attn("attention_d32")


def attention_d80():
    return _plain_attn("attention_d80")


def attention_softmax_over_q():
    """softmax over the queries instead of the keys (wrong orientation), then ·V over x."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    S = _sc(nd, Q, K, d, (h, q, x), 0.125)
    return nd.Diagram("attention_softmax_over_q", nd.contract(nd.softmax(S, q), V, over=x, out=(h, q, d), name="O"))


def attention_proj_residual():
    """O = attention; Y[s,e] = X[s,e] + Σ_{h,d} O[h,s,d]·Wo[e,h,d]."""
    nd = _d(); h, s, x, d, e = nd.axes("h s x d e")
    Q, K, V = nd.array("Q", h, s, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    Wo, X = nd.array("Wo", e, h, d), nd.array("X", s, e)
    S = _sc(nd, Q, K, d, (h, s, x), 0.125)
    O = nd.contract(nd.softmax(S, x), V, over=x, out=(h, s, d))
    return nd.Diagram("attention_proj_residual", (X + nd.contract(O, Wo, over=(h, d), out=(s, e))).named("Y"))


def attention_heads_middle():
    """Q[q,h,d], K,V[x,h,d] → O[q,h,d] (BSHD layout, heads not first)."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", q, h, d), nd.array("K", x, h, d), nd.array("V", x, h, d)
    S = _sc(nd, Q, K, d, (h, q, x), 0.125)
    return nd.Diagram("attention_heads_middle", nd.contract(nd.softmax(S, x), V, over=x, out=(q, h, d), name="O"))


def attention_with_probs_output():
    """Attention that also returns P (the probabilities as an output)."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    P = nd.softmax(_sc(nd, Q, K, d, (h, q, x), 0.125), x, name="P")
    return nd.Diagram("attention_with_probs_output", (nd.contract(P, V, over=x, out=(h, q, d), name="O"), P))


def attention_output_gelu_rowsum():
    """attention, then gelu, then Σ_d: maps and a reduction after the attention."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    O = nd.contract(nd.softmax(_sc(nd, Q, K, d, (h, q, x), 0.125), x), V, over=x, out=(h, q, d))
    return nd.Diagram("attention_output_gelu_rowsum", nd.sum_over(nd.gelu(O), d, name="Y"))


def attention_bias_per_head_causal():
    """A learned bias B[h,q,x] plus a causal mask."""
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V, B = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d), nd.array("B", h, q, x)
    S = nd.causal(_sc(nd, Q, K, d, (h, q, x), 0.125) + B, q, x)
    return nd.Diagram("attention_bias_per_head_causal", nd.contract(nd.softmax(S, x), V, over=x, out=(h, q, d), name="O"))


# ------------------------------------------------------------------ backward diagrams

def _g(fn, wrt=None):
    def f():
        d = fn()
        return d.grad(wrt=wrt, name=f"{fn.__name__}_grad")
    f.__name__ = f"{fn.__name__}_grad"
    return f


value_and_rowsum_grad = _g(value_and_rowsum)
softmax_and_log_grad = _g(softmax_and_log)
diamond_map_grad = _g(diamond_map)
layernorm_with_stats_grad = _g(layernorm_with_stats)
gemm_transposed_out_grad = _g(gemm_transposed_out)
broadcast3_mixed_grad = _g(broadcast3_mixed)
outer_sum_grad = _g(outer_sum)
rms_scalar_grad = _g(rms_scalar)
reduce_of_reduce_grad = _g(reduce_of_reduce)
mse_loss_scalar_grad = _g(mse_loss_scalar)
abc_chain_grad = _g(abc_chain)
batched_middle_axis_grad = _g(batched_middle_axis)
map_gemm_rownorm_gemm_grad = _g(map_gemm_rownorm_gemm)
attention_causal_scale_grad = _g(attention_causal_scale)
attention_gqa_extra_axis_grad = _g(attention_gqa_extra_axis)
attention_proj_residual_grad = _g(attention_proj_residual)
transpose_map_add_grad = _g(transpose_map_add)
column_center_grad = _g(column_center)
cross_entropy_mean_scalar_grad = _g(cross_entropy_mean_scalar)
contract_two_axes_grad = _g(contract_two_axes)
softmax_first_axis_grad = _g(softmax_first_axis)


# ------------------------------------------------------------------ sizes

_ATT = {"h": 16, "q": 2048, "x": 2048, "d": 128}
PROBLEMS = {
    "value_and_rowsum": {"a": 8192, "b": 4095},
    "softmax_and_log": {"a": 4096, "b": 8192},
    "two_branches": {"a": 8192, "b": 4096},
    "diamond_map": {"a": 8191, "b": 4096},
    "manual_softmax_with_max": {"a": 4096, "b": 5003},
    "map_reduce_center_outputs": {"a": 4096, "b": 4096},
    "row_and_col_sums": {"a": 8192, "b": 4097},
    "max_and_min_rows": {"a": 16384, "b": 1024},
    "layernorm_with_stats": {"a": 8192, "b": 1023},
    "logsoftmax_and_lse": {"a": 4096, "b": 32000},
    "gemm_and_rowsum_colsum": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_colsum_only": {"a": 4096, "k": 2048, "n": 1000},
    "gemm_transposed_out": {"a": 4096, "k": 4096, "n": 2048},
    "reduce_permuted_keep": {"a": 512, "b": 128, "c": 1000},
    "transpose_map_add": {"a": 4096, "b": 4095},
    "pure_transpose": {"a": 8192, "b": 4096},
    "transpose_scale_3d": {"a": 64, "b": 512, "c": 511},
    "bias_first_map_order": {"a": 8192, "b": 4096},
    "softmax_transposed_scores": {"a": 2048, "k": 512, "n": 4096},
    "outer_sum": {"a": 8192, "b": 8191},
    "outer_product_contract": {"a": 8192, "b": 4096},
    "broadcast3_mixed": {"a": 64, "b": 257, "c": 1024},
    "broadcast_vec_first": {"a": 64, "b": 256, "c": 1023},
    "affine_rows_cols": {"a": 8192, "b": 4096},
    "column_center": {"a": 8192, "b": 2049},
    "reduce_to_scalar": {"a": 8192, "b": 8191},
    "mse_loss_scalar": {"a": 4096, "b": 4096},
    "reduce_all_but_middle": {"a": 64, "b": 511, "c": 1024},
    "reduce_of_reduce": {"a": 128, "b": 256, "c": 1023},
    "rms_scalar": {"a": 8192, "b": 4096},
    "rms_rows": {"a": 16384, "b": 2047},
    "normalize_by_global_max": {"a": 4096, "b": 4096},
    "softmax_first_axis": {"a": 2049, "b": 4096},
    "softmax_pairs": {"r": 4194304, "x": 2},
    "softmax_size1": {"r": 4194304, "x": 1},
    "layernorm_size1_rows": {"a": 1, "b": 1048576},
    "cross_entropy_mean_scalar": {"a": 4096, "b": 32001},
    "cosine_rows_with_norms": {"a": 16384, "b": 1024},
    "variance_columns": {"a": 8192, "b": 2048},
    "map_gemm_rownorm_gemm": {"a": 4096, "e": 1024, "f": 4096},
    "two_gemms_shared_input": {"a": 4096, "e": 2048, "f": 2048},
    "two_gemms_shared_weight": {"a": 4096, "b": 1000, "e": 1024, "f": 4096},
    "abc_chain": {"a": 2048, "b": 1024, "c": 2048, "e": 1024},
    "three_operand_contract": {"a": 4096, "k": 1024, "n": 4096},
    "contract_two_axes": {"a": 2048, "k": 32, "l": 64, "n": 2048},
    "batched_middle_axis": {"i": 512, "b": 32, "j": 512, "k": 256},
    "batched_last_axis": {"i": 256, "b": 16, "j": 256, "k": 128},
    "sum_of_products": {"a": 4096, "k": 1024, "l": 512, "n": 4096},
    "gram_matrix": {"a": 4096, "c": 4096, "k": 1024},
    "contract_relu_weight": {"a": 4096, "k": 2048, "n": 4096},
    "contract_scaled_input": {"a": 4096, "k": 1023, "n": 4096},
    "quadratic_form_scalar": {"a": 8192, "b": 8192},
    "batched_matvec_transposed": {"a": 8192, "b": 4, "k": 4096},
    "softmax_then_contract_other_axis": {"a": 2048, "b": 2048, "c": 512},
    "residual_mlp_ln_two_outputs": {"a": 4096, "e": 1024, "f": 4096},
    "rmsnorm_proj_scalar_loss": {"a": 4096, "e": 1024, "f": 1024},
    "gemm_softmax_transposed_in": {"a": 2048, "k": 1024, "n": 2048},
    "matvec_chain": {"a": 8192, "b": 8192, "c": 4096},
    "attention_causal_scale": dict(_ATT),
    "attention_mask_input": {"h": 16, "q": 1024, "x": 1024, "d": 64},
    "attention_gqa_extra_axis": {"h": 8, "j": 4, "q": 2048, "x": 2048, "d": 128},
    "attention_q1_decode": {"h": 32, "q": 1, "x": 8191, "d": 128},
    "attention_d16": {"h": 32, "q": 2048, "x": 2048, "d": 16},
    "attention_d32": {"h": 32, "q": 2048, "x": 2048, "d": 32},
    "attention_d80": {"h": 16, "q": 2047, "x": 2047, "d": 80},
    "attention_softmax_over_q": {"h": 16, "q": 1024, "x": 1024, "d": 64},
    "attention_proj_residual": {"h": 16, "s": 2048, "x": 2048, "d": 64, "e": 1024},
    "attention_heads_middle": {"h": 16, "q": 2048, "x": 2048, "d": 128},
    "attention_with_probs_output": {"h": 8, "q": 1024, "x": 1024, "d": 64},
    "attention_output_gelu_rowsum": {"h": 16, "q": 2048, "x": 2048, "d": 64},
    "attention_bias_per_head_causal": {"h": 16, "q": 1024, "x": 1024, "d": 64},
}
for _n in list(globals()):
    if _n.endswith("_grad") and callable(globals()[_n]) and _n[:-5] in PROBLEMS:
        PROBLEMS[_n] = dict(PROBLEMS[_n[:-5]])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
