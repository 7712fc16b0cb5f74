#!/usr/bin/env python3
"""A second operator survey, written after the first was tuned: problems as users write them that
napkin's own tests and surveys did not hold (issue #12's external suite is measured on problems
napkin never sees, so this one keeps the first honest).

Losses reduced to one value (MSE, hinge, Huber, cosine, KL, cross-entropy with one-hot targets), a
Frobenius normalisation, norms over a row of several axes (``nn.LayerNorm((C, H, W))``, a batch
norm's statistics over ``(n, s)``, an instance norm), softmax over two axes, GEMMs followed by a
division, a sum, a max, a sigmoid with a residual, a group-norm-like row; products of 3-D and 4-D
arrays by a matrix, a linear layer on ``[b, s, e]`` activations with short ``s``, a diagonal
matrix product, small-K and tall-skinny products, a vector-matrix product, both operands
transposed, the kernel-benchmark matmul shapes (K = 16, a 4-D product of 2M rows, a 256 x 131072
matrix-vector product). Each is a module-level function, so it also works on the command line::

    napkin derive benchmarks/heldout_survey.py:linear3d -s b=256 -s s=50 -s e=768 -s f=3072

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey.py [--out heldout.jsonl] [--dtypes bf16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


def softsign():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("softsign", (X / (nd.absolute(X) + 1.0)).named("Y"))


def swish_scaled():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("swish_scaled", (X * nd.sigmoid(X * 1.5)).named("Y"))


def relu6():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("relu6", nd.clamp(X, 0.0, 6.0, name="Y"))


def frobenius_normalize():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    n = nd.sqrt(nd.sum_over(nd.square(X), (a, b)), name="n")
    return nd.Diagram("frobenius_normalize", (X / n).named("Y"))


def mse_loss():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    return nd.Diagram("mse_loss", nd.mean_over(nd.square(P - T), (a, b), name="L"))


def hinge_loss():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    return nd.Diagram("hinge_loss", nd.mean_over(nd.relu(1.0 - P * T), (a, b), name="L"))


def huber_loss():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    d = nd.absolute(P - T)
    m = nd.clamp(d, 0.0, 1.0)
    return nd.Diagram("huber_loss", nd.mean_over(nd.square(m) * 0.5 + (d - m), (a, b), name="L"))


def cosine_loss():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    dot = nd.sum_over(P * T, b)
    np_ = nd.sqrt(nd.sum_over(nd.square(P), b))
    nt = nd.sqrt(nd.sum_over(nd.square(T), b))
    cos = dot / (np_ * nt + 1e-8)
    return nd.Diagram("cosine_loss", nd.mean_over(1.0 - cos, a, name="L"))


def kl_div():
    nd = _d(); a, b = nd.axes("a b"); P, T = nd.array("P", a, b), nd.array("T", a, b)
    p = nd.softmax(P, b); t = nd.softmax(T, b)
    return nd.Diagram("kl_div", nd.sum_over(t * (nd.log(t) - nd.log(p)), (a, b), name="L"))


def cross_entropy_onehot():
    nd = _d(); a, b = nd.axes("a b"); X, Y = nd.array("X", a, b), nd.array("Y", a, b)
    return nd.Diagram("cross_entropy_onehot", nd.mean_over(nd.logsumexp(X, b) - nd.sum_over(X * Y, b), a, name="L"))


def l1_normalize():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("l1_normalize", (X / nd.sum_over(nd.absolute(X), b)).named("Y"))


def instance_norm():
    nd = _d(); n, c, s = nd.axes("n c s"); X = nd.array("X", n, c, s)
    return nd.Diagram("instance_norm", nd.layernorm(X, s, name="Y"))


def batch_norm_train():
    nd = _d(); n, c, s = nd.axes("n c s"); X = nd.array("X", n, c, s)
    g, bb = nd.array("g", c), nd.array("bb", c)
    return nd.Diagram("batch_norm_train", (nd.layernorm(X, (n, s)) * g + bb).named("Y"))


def layernorm_chw():
    nd = _d(); n, c, h, w = nd.axes("n c h w"); X = nd.array("X", n, c, h, w)
    return nd.Diagram("layernorm_chw", nd.layernorm(X, (c, h, w), name="Y"))


def softmax_two_axes():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("softmax_two_axes", nd.softmax(X, (b, c), name="Y"))


def max_last_3d():
    nd = _d(); a, b, c = nd.axes("a b c")
    return nd.Diagram("max_last_3d", nd.max_over(nd.array("X", a, b, c), c, name="Y"))


def mean_first_3d():
    nd = _d(); a, b, c = nd.axes("a b c")
    return nd.Diagram("mean_first_3d", nd.mean_over(nd.array("X", a, b, c), a, name="Y"))


def gemm_div_sum_scale():
    nd = _d(); a, k, n = nd.axes("a k n")
    X, W = nd.array("X", a, k), nd.array("W", n, k)
    Y = nd.contract(X, W, over=k, out=(a, n))
    return nd.Diagram("gemm_div_sum_scale", (nd.sum_over(Y * 0.5, n) * 1.5).named("S"))


def gemm_max_sub_gelu():
    nd = _d(); a, k, n = nd.axes("a k n")
    X, W = nd.array("X", a, k), nd.array("W", n, k)
    Y = nd.contract(X, W, over=k, out=(a, n), name="Yl")
    m = nd.max_over(Y, n)
    return nd.Diagram("gemm_max_sub_gelu", nd.gelu(Y - m, name="Z"))


def gemm_sigmoid_scale_residual():
    nd = _d(); a, k, n = nd.axes("a k n")
    X, W, bias = nd.array("X", a, k), nd.array("W", n, k), nd.array("bias", n)
    Y = (nd.contract(X, W, over=k, out=(a, n)) + bias).named("Yb")
    return nd.Diagram("gemm_sigmoid_scale_residual", (nd.sigmoid(Y) * 2.0 + Y).named("Z"))


def gemm_swish_bias():
    nd = _d(); a, k, n = nd.axes("a k n")
    X, W, bias = nd.array("X", a, k), nd.array("W", n, k), nd.array("bias", n)
    Y = nd.contract(X, W, over=k, out=(a, n), name="Yl")
    return nd.Diagram("gemm_swish_bias", (nd.silu(Y) + bias).named("Z"))


def gemm_groupnorm_like():
    nd = _d(); a, k, g, c = nd.axes("a k g c")
    X, W = nd.array("X", a, k), nd.array("W", g, c, k)
    Y = nd.contract(X, W, over=k, out=(a, g, c), name="Yl")
    return nd.Diagram("gemm_groupnorm_like", nd.layernorm(Y, c, name="Z"))


def tensor3_matmul():
    nd = _d(); b, i, k, j = nd.axes("b i k j")
    A, B = nd.array("A", b, i, k), nd.array("B", k, j)
    return nd.Diagram("tensor3_matmul", nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def tensor4_matmul():
    nd = _d(); b, i, j, l, k = nd.axes("b i j l k")
    A, B = nd.array("A", b, i, j, l), nd.array("B", l, k)
    return nd.Diagram("tensor4_matmul", nd.contract(A, B, over=l, out=(b, i, j, k), name="C"))


def diag_matmul():
    nd = _d(); a, b = nd.axes("a b")
    A, B = nd.array("A", a), nd.array("B", a, b)
    return nd.Diagram("diag_matmul", (A * B).named("C"))


def small_k_matmul():
    nd = _d(); a, k, n = nd.axes("a k n")
    return nd.Diagram("small_k_matmul", nd.contract(nd.array("A", a, k), nd.array("B", k, n), over=k, out=(a, n), name="C"))


def tall_skinny():
    nd = _d(); a, k, n = nd.axes("a k n")
    return nd.Diagram("tall_skinny", nd.contract(nd.array("A", a, k), nd.array("B", k, n), over=k, out=(a, n), name="C"))


def kb_tall_skinny():
    """A kernel benchmark's tall-skinny product: K = 16, a 16384² output (store-bound)."""
    return small_k_matmul().renamed("kb_tall_skinny")


def kb_4d():
    """A kernel benchmark's 4-D tensor-matrix product: 2M rows of 256 by 768."""
    return tensor4_matmul().renamed("kb_4d")


def kb_matvec():
    """A kernel benchmark's matrix-vector product: 256 rows of 131072."""
    nd = _d(); a, k = nd.axes("a k")
    return nd.Diagram("kb_matvec", nd.contract(nd.array("A", a, k), nd.array("x", k), over=k, out=(a,), name="y"))


def linear3d():
    nd = _d(); b, s, e, f = nd.axes("b s e f")
    Y = nd.contract(nd.array("X", b, s, e), nd.array("W", f, e), over=e, out=(b, s, f), name="Yl") + nd.array("bias", f)
    return nd.Diagram("linear3d", nd.gelu(Y, name="Y"))


def linear3d_clip():
    return linear3d().renamed("linear3d_clip")


def lin2():
    """``linear3d``'s product written with one row axis (what the planner's fold runs)."""
    nd = _d(); m, e, f = nd.axes("m e f")
    Y = nd.contract(nd.array("X", m, e), nd.array("W", f, e), over=e, out=(m, f), name="Yl") + nd.array("bias", f)
    return nd.Diagram("lin2", nd.gelu(Y, name="Y"))


def lin2_plain():
    nd = _d(); m, e, f = nd.axes("m e f")
    return nd.Diagram("lin2_plain", nd.contract(nd.array("X", m, e), nd.array("W", f, e), over=e, out=(m, f), name="Y"))


def vecmat():
    nd = _d(); k, n = nd.axes("k n")
    return nd.Diagram("vecmat", nd.contract(nd.array("x", k), nd.array("A", k, n), over=k, out=(n,), name="y"))


def matmul_transposed_both():
    nd = _d(); a, k, n = nd.axes("a k n")
    return nd.Diagram("matmul_transposed_both", nd.contract(nd.array("A", k, a), nd.array("B", n, k), over=k, out=(a, n), name="C"))


def scalar_mul():
    nd = _d(); a, b = nd.axes("a b")
    return nd.Diagram("scalar_mul", (nd.array("A", a, b) * 3.25).named("C"))


def softmax_middle():
    nd = _d(); a, b, c = nd.axes("a b c")
    return nd.Diagram("softmax_middle", nd.softmax(nd.array("X", a, b, c), b, name="Y"))


def log_softmax_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("log_softmax_rows", (X - nd.logsumexp(X, b)).named("Y"))


def rms_then_gelu_linear():
    nd = _d(); r, x, c = nd.axes("r x c")
    X, W = nd.array("X", r, x), nd.array("W", c, x)
    Y = nd.contract(nd.rmsnorm(X, x), W, over=x, out=(r, c), name="Yl")
    return nd.Diagram("rms_then_gelu_linear", nd.gelu(Y, name="Z"))


PROBLEMS = {
    "softsign": {"a": 8192, "b": 4096},
    "swish_scaled": {"a": 8192, "b": 4096},
    "relu6": {"a": 8192, "b": 4096},
    "frobenius_normalize": {"a": 4096, "b": 4096},
    "mse_loss": {"a": 8192, "b": 4096},
    "hinge_loss": {"a": 8192, "b": 4096},
    "huber_loss": {"a": 8192, "b": 4096},
    "cosine_loss": {"a": 8192, "b": 4096},
    "kl_div": {"a": 8192, "b": 4096},
    "cross_entropy_onehot": {"a": 8192, "b": 4096},
    "l1_normalize": {"a": 8192, "b": 4096},
    "instance_norm": {"n": 32, "c": 64, "s": 4096},
    "batch_norm_train": {"n": 32, "c": 64, "s": 4096},
    "layernorm_chw": {"n": 16, "c": 64, "h": 256, "w": 256},
    "softmax_two_axes": {"a": 128, "b": 64, "c": 1024},
    "max_last_3d": {"a": 64, "b": 512, "c": 1024},
    "mean_first_3d": {"a": 64, "b": 512, "c": 1024},
    "gemm_div_sum_scale": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_max_sub_gelu": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_sigmoid_scale_residual": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_swish_bias": {"a": 4096, "k": 4096, "n": 4096},
    "gemm_groupnorm_like": {"a": 4096, "k": 1024, "g": 32, "c": 128},
    "tensor3_matmul": {"b": 16, "i": 1024, "k": 2048, "j": 768},
    "tensor4_matmul": {"b": 8, "i": 64, "j": 64, "l": 256, "k": 768},
    "diag_matmul": {"a": 4096, "b": 4096},
    "small_k_matmul": {"a": 16384, "k": 32, "n": 16384},
    "tall_skinny": {"a": 32768, "k": 4096, "n": 64},
    "kb_tall_skinny": {"a": 16384, "k": 16, "n": 16384},
    "kb_4d": {"b": 16, "i": 256, "j": 512, "l": 256, "k": 768},
    "kb_matvec": {"a": 256, "k": 131072},
    "linear3d": {"b": 256, "s": 50, "e": 768, "f": 3072},
    "linear3d_clip": {"b": 64, "s": 77, "e": 768, "f": 3072},
    "lin2": {"m": 12800, "e": 768, "f": 3072},
    "lin2_plain": {"m": 12800, "e": 768, "f": 3072},
    "vecmat": {"k": 16384, "n": 16384},
    "matmul_transposed_both": {"a": 4096, "k": 4096, "n": 4096},
    "scalar_mul": {"a": 8192, "b": 4096},
    "softmax_middle": {"a": 64, "b": 512, "c": 1024},
    "log_softmax_rows": {"a": 8192, "b": 4096},
    "rms_then_gelu_linear": {"r": 4096, "x": 4096, "c": 4096},
}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
