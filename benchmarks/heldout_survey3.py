#!/usr/bin/env python3
"""A fourth operator survey: problems as kernel engineers write them, held by no test or survey before.

Written as the third survey's gaps were closed. Its first H200 run (every output correct, none on
the fallback) found a batch of 32 x 32 products at 0.53x eager in fp32 (the third survey's; 32-row
tiles now), the product of an array with its own transpose (``X·Xᵀ``, written with a rename) at
0.66x (the view was copied transposed), and sums of everything (a 64M-element vector, the mean of
an 8192 x 4096 array) at 0.78-0.93x (the last block added 512 partials one L2 load after another).

Reductions to one value, batches of 16-128-sized products, scores over two batch axes, attention
with an additive bias and with d = 32, a per-head RMSNorm (QK-norm) and an RMSNorm over two axes,
centring, softmax / layernorm / sums over short rows (8-64 values), a logsumexp over a middle axis,
a max over two non-adjacent axes, tiny and narrow and wide products, a Gram matrix, norms and
softmax written out by hand as maps and reductions (alone and after a GEMM), and the sum of two
GEMMs. Each is a module-level function, so it also works on the command line::

    napkin derive benchmarks/heldout_survey3.py:gram -s a=4096 -s b=4096 -s d=1024

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey3.py [--out heldout3.jsonl] [--dtypes bf16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


def sum_1d():
    nd = _d(); (n,) = nd.axes("n"); X = nd.array("X", n)
    return nd.Diagram("sum_1d", nd.sum_over(X, n, name="S"))


def mean_all_2d():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("mean_all_2d", nd.mean_over(X, (a, b), name="S"))


def _bmm(name):
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B = nd.array("A", b, i, k), nd.array("B", b, k, j)
    return nd.Diagram(name, nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def bmm_64():
    return _bmm("bmm_64")


def bmm_128():
    return _bmm("bmm_128")


def tiny_bmm():
    return _bmm("tiny_bmm")


def scores_2batch():
    nd = _d(); b, h, q, k, d = nd.axes("b h q k d")
    Q, K = nd.array("Q", b, h, q, d), nd.array("K", b, h, k, d)
    return nd.Diagram("scores_2batch", nd.contract(Q, K, over=d, out=(b, h, q, k), name="S"))


def attention_bias():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V, Bi = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d), nd.array("Bias", h, q, x)
    S = nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), 0.125) + Bi
    P = nd.softmax(S, x)
    return nd.Diagram("attention_bias", nd.contract(P, V, over=x, out=(h, q, d), name="O"))


def attention_d32():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    P = nd.softmax(nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), 0.17677669529663687), x)
    return nd.Diagram("attention_d32", nd.contract(P, V, over=x, out=(h, q, d), name="O"))


def qk_rmsnorm():
    nd = _d(); s, h, d = nd.axes("s h d"); X, g = nd.array("X", s, h, d), nd.array("g", d)
    return nd.Diagram("qk_rmsnorm", (nd.rmsnorm(X, d) * g).named("Y"))


def center_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("center_rows", (X - nd.mean_over(X, b)).named("Y"))


def softmax_short_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("softmax_short_rows", nd.softmax(X, b, name="Y"))


def layernorm_short_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("layernorm_short_rows", nd.layernorm(X, b, name="Y"))


def sum_short_rows():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    return nd.Diagram("sum_short_rows", nd.sum_over(X, b, name="Y"))


def lse_middle():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("lse_middle", nd.logsumexp(X, b, name="Y"))


def max_outer_two():
    nd = _d(); a, b, c = nd.axes("a b c"); X = nd.array("X", a, b, c)
    return nd.Diagram("max_outer_two", nd.max_over(X, (a, c), name="Y"))


def _matmul(name):
    nd = _d(); a, k, n = nd.axes("a k n")
    return nd.Diagram(name, nd.contract(nd.array("A", a, k), nd.array("B", k, n), over=k, out=(a, n), name="C"))


def matmul_odd_small():
    return _matmul("matmul_odd_small")


def matmul_narrow_out():
    return _matmul("matmul_narrow_out")


def matmul_wide_n():
    return _matmul("matmul_wide_n")


def gram():
    nd = _d(); a, b, d = nd.axes("a b d"); X = nd.array("X", a, d)
    Xb = nd.rename(X, a="b")
    return nd.Diagram("gram", nd.contract(X, Xb, over=d, out=(a, b), name="G"))


def rms_two_axes():
    nd = _d(); s, h, d = nd.axes("s h d"); X = nd.array("X", s, h, d)
    return nd.Diagram("rms_two_axes", nd.rmsnorm(X, (h, d), name="Y"))


def manual_rmsnorm():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    ms = nd.mean_over(nd.square(X), b)
    return nd.Diagram("manual_rmsnorm", (X * nd.rsqrt(ms + 1e-6)).named("Y"))


def manual_softmax():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    e = nd.exp(X - nd.max_over(X, b))
    return nd.Diagram("manual_softmax", (e / nd.sum_over(e, b)).named("Y"))


def manual_layernorm():
    nd = _d(); a, b = nd.axes("a b"); X = nd.array("X", a, b)
    m = nd.mean_over(X, b); c = X - m
    v = nd.mean_over(nd.square(c), b)
    return nd.Diagram("manual_layernorm", (c * nd.rsqrt(v + 1e-5)).named("Y"))


def gemm_manual_softmax():
    nd = _d(); a, k, n = nd.axes("a k n")
    L = nd.contract(nd.array("A", a, k), nd.array("W", n, k), over=k, out=(a, n))
    e = nd.exp(L - nd.max_over(L, n))
    return nd.Diagram("gemm_manual_softmax", (e / nd.sum_over(e, n)).named("Y"))


def two_gemms_sum():
    nd = _d(); a, k, n = nd.axes("a k n")
    X1, W1, X2, W2 = nd.array("X1", a, k), nd.array("W1", n, k), nd.array("X2", a, k), nd.array("W2", n, k)
    Y = nd.contract(X1, W1, over=k, out=(a, n)) + nd.contract(X2, W2, over=k, out=(a, n))
    return nd.Diagram("two_gemms_sum", Y.named("Y"))


PROBLEMS = {
    "sum_1d": {"n": 1 << 26},
    "mean_all_2d": {"a": 8192, "b": 4096},
    "bmm_64": {"b": 2048, "i": 64, "j": 64, "k": 64},
    "bmm_128": {"b": 512, "i": 128, "j": 128, "k": 128},
    "tiny_bmm": {"b": 16384, "i": 16, "j": 16, "k": 16},
    "scores_2batch": {"b": 4, "h": 16, "q": 512, "k": 512, "d": 64},
    "attention_bias": {"h": 16, "q": 1024, "x": 1024, "d": 64},
    "attention_d32": {"h": 32, "q": 2048, "x": 2048, "d": 32},
    "qk_rmsnorm": {"s": 8192, "h": 32, "d": 128},
    "center_rows": {"a": 8192, "b": 4096},
    "softmax_short_rows": {"a": 1 << 21, "b": 16},
    "layernorm_short_rows": {"a": 1 << 19, "b": 64},
    "sum_short_rows": {"a": 1 << 22, "b": 8},
    "lse_middle": {"a": 64, "b": 512, "c": 256},
    "max_outer_two": {"a": 64, "b": 1024, "c": 256},
    "matmul_odd_small": {"a": 77, "k": 1000, "n": 33},
    "matmul_narrow_out": {"a": 16384, "k": 4096, "n": 128},
    "matmul_wide_n": {"a": 128, "k": 4096, "n": 32768},
    "gram": {"a": 4096, "b": 4096, "d": 1024},
    "rms_two_axes": {"s": 8192, "h": 32, "d": 128},
    "manual_rmsnorm": {"a": 8192, "b": 4096},
    "manual_softmax": {"a": 8192, "b": 4096},
    "manual_layernorm": {"a": 8192, "b": 4096},
    "gemm_manual_softmax": {"a": 4096, "k": 1024, "n": 4096},
    "two_gemms_sum": {"a": 4096, "k": 1024, "n": 4096},
}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
