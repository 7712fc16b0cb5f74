#!/usr/bin/env python3
"""A fifth operator survey: the usual problems at sizes that are not powers of two.

The earlier surveys hold mostly power-of-two sizes. Operator suites written by others use sizes such
as 4095, 1001 or 8205, where a row is not a multiple of the 16-byte vector, a tile is part empty and
an axis's length is odd. This survey runs the usual shapes there: softmax, log-softmax, layernorm
and RMSNorm over rows of odd length; sums, maxes and means over the middle, first and last axes of
arrays whose innermost axis is odd; elementwise chains over odd-sized arrays; products whose K, N
or M is odd; a batched product with odd sides; a matrix-vector product with odd sides; a group norm
with an odd channel group; attention with an odd sequence length. Each is a module-level function,
so it also works on the command line::

    napkin derive benchmarks/heldout_survey4.py:softmax_odd -s a=4096 -s b=4095

Run as a script on a GPU, as ``benchmarks/operator_survey.py`` (whose runner it uses)::

    python3 benchmarks/heldout_survey4.py [--out heldout4.jsonl] [--dtypes bf16,fp16,fp32] [--only NAME,...]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd
    return nd


def _rows(name):
    nd = _d(); a, b = nd.axes("a b")
    return nd, nd.array("X", a, b), a, b, name


def softmax_odd():
    nd, X, a, b, name = _rows("softmax_odd")
    return nd.Diagram(name, nd.softmax(X, b, name="Y"))


def log_softmax_odd():
    nd, X, a, b, name = _rows("log_softmax_odd")
    return nd.Diagram(name, (X - nd.logsumexp(X, b)).named("Y"))


def layernorm_odd():
    nd, X, a, b, name = _rows("layernorm_odd")
    return nd.Diagram(name, nd.layernorm(X, b, name="Y"))


def rmsnorm_weight_odd():
    nd = _d(); a, b = nd.axes("a b"); X, g = nd.array("X", a, b), nd.array("g", b)
    return nd.Diagram("rmsnorm_weight_odd", (nd.rmsnorm(X, b) * g).named("Y"))


def l2_rows_odd():
    nd, X, a, b, name = _rows("l2_rows_odd")
    return nd.Diagram(name, (X * nd.rsqrt(nd.sum_over(nd.square(X), b) + 1e-12)).named("Y"))


def gelu_odd():
    nd, X, a, b, name = _rows("gelu_odd")
    return nd.Diagram(name, nd.gelu(X).named("Y"))


def chain_odd():
    nd = _d(); a, b = nd.axes("a b")
    X, G, R = nd.array("X", a, b), nd.array("G", a, b), nd.array("R", a, b)
    return nd.Diagram("chain_odd", (nd.sigmoid(X) * G + R).named("Y"))


def _three(name):
    nd = _d(); b, m, n = nd.axes("b m n")
    return nd, nd.array("X", b, m, n), b, m, n, name


def sum_middle_odd():
    nd, X, b, m, n, name = _three("sum_middle_odd")
    return nd.Diagram(name, nd.sum_over(X, m, name="Y"))


def max_middle_odd():
    nd, X, b, m, n, name = _three("max_middle_odd")
    return nd.Diagram(name, nd.max_over(X, m, name="Y"))


def mean_last_odd():
    nd, X, b, m, n, name = _three("mean_last_odd")
    return nd.Diagram(name, nd.mean_over(X, n, name="Y"))


def min_first_odd():
    nd, X, b, m, n, name = _three("min_first_odd")
    return nd.Diagram(name, nd.min_over(X, b, name="Y"))


def column_sum_odd():
    nd, X, a, b, name = _rows("column_sum_odd")
    return nd.Diagram(name, nd.sum_over(X, a, name="Y"))


def softmax_first_odd():
    nd, X, a, b, name = _rows("softmax_first_odd")
    return nd.Diagram(name, nd.softmax(X, a, name="Y"))


def _mm(name):
    nd = _d(); a, k, n = nd.axes("a k n")
    return nd.Diagram(name, nd.contract(nd.array("A", a, k), nd.array("B", k, n), over=k, out=(a, n), name="C"))


def matmul_odd_k():
    return _mm("matmul_odd_k")


def matmul_odd_n():
    return _mm("matmul_odd_n")


def matmul_odd_all():
    return _mm("matmul_odd_all")


def linear_odd_bias_gelu():
    nd = _d(); a, k, n = nd.axes("a k n")
    A, W, bias = nd.array("A", a, k), nd.array("W", n, k), nd.array("bias", n)
    return nd.Diagram("linear_odd_bias_gelu", nd.gelu(nd.contract(A, W, over=k, out=(a, n)) + bias).named("Y"))


def bmm_odd():
    nd = _d(); b, i, j, k = nd.axes("b i j k")
    A, B = nd.array("A", b, i, k), nd.array("B", b, k, j)
    return nd.Diagram("bmm_odd", nd.contract(A, B, over=k, out=(b, i, j), name="C"))


def matvec_odd():
    nd = _d(); a, k = nd.axes("a k")
    return nd.Diagram("matvec_odd", nd.contract(nd.array("W", a, k), nd.array("x", k), over=k, out=(a,), name="y"))


def group_norm_odd():
    nd = _d(); n, g, c, s = nd.axes("n g c s")
    X = nd.array("X", n, g, c, s)
    return nd.Diagram("group_norm_odd", nd.layernorm(X, (c, s), name="Y"))


def attention_odd_seq():
    nd = _d(); h, q, x, d = nd.axes("h q x d")
    Q, K, V = nd.array("Q", h, q, d), nd.array("K", h, x, d), nd.array("V", h, x, d)
    P = nd.softmax(nd.scale(nd.contract(Q, K, over=d, out=(h, q, x)), 0.125), x)
    return nd.Diagram("attention_odd_seq", nd.contract(P, V, over=x, out=(h, q, d), name="O"))


PROBLEMS = {
    "softmax_odd": {"a": 4096, "b": 4095},
    "log_softmax_odd": {"a": 8191, "b": 3001},
    "layernorm_odd": {"a": 8191, "b": 1001},
    "rmsnorm_weight_odd": {"a": 5000, "b": 2999},
    "l2_rows_odd": {"a": 1000, "b": 12347},
    "gelu_odd": {"a": 4097, "b": 3001},
    "chain_odd": {"a": 1000, "b": 12345},
    "sum_middle_odd": {"b": 16, "m": 1024, "n": 4095},
    "max_middle_odd": {"b": 16, "m": 1024, "n": 4095},
    "mean_last_odd": {"b": 16, "m": 1024, "n": 4095},
    "min_first_odd": {"b": 127, "m": 129, "n": 1001},
    "column_sum_odd": {"a": 8191, "b": 4095},
    "softmax_first_odd": {"a": 4095, "b": 4097},
    "matmul_odd_k": {"a": 4096, "k": 4097, "n": 4096},
    "matmul_odd_n": {"a": 4096, "k": 4096, "n": 4095},
    "matmul_odd_all": {"a": 3001, "k": 2047, "n": 4093},
    "linear_odd_bias_gelu": {"a": 3000, "k": 1001, "n": 3003},
    "bmm_odd": {"b": 10, "i": 1000, "j": 999, "k": 1001},
    "matvec_odd": {"a": 4097, "k": 12289},
    "group_norm_odd": {"n": 16, "g": 8, "c": 30, "s": 3000},
    "attention_odd_seq": {"h": 16, "q": 1000, "x": 1000, "d": 64},
}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    from operator_survey import main  # the runner all the surveys share

    sys.exit(main(problems=PROBLEMS, here=HERE, description=__doc__.splitlines()[0]))
