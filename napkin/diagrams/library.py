"""The built-in diagrams, with the paper's axis names so derivations read like the paper.

- matmul ``A[a,b]·B[b,c] → C[a,c]`` (batched: woven over ``n``; transposed: ``B[c,b]``);
- the MLP block ``gelu(X[a,b]·W[c,b] + bias[c])``;
- row-wise ops over rows ``r`` and the normalised axis ``x``: softmax, layernorm, rmsnorm; and
  chains of maps and reductions over a row: log-softmax, L2 normalisation, group norm (a row of
  several axes), logsumexp and the range (max − min) of rows;
- attention ``Q[q,d]``, ``K,V[x,d]``; multi-head woven over ``h``; GQA with ``h`` key/value
  heads and ``j`` query heads sharing each; causal, sliding-window, ALiBi and soft-capped;
- a pre-norm transformer block composed from these;
- composed shapes users write and benchmarks time: SwiGLU, RMSNorm → linear, GEMM → softmax, an
  elementwise chain (tanh-form GELU) and a column reduction.

>>> from napkin.diagrams import library
>>> "attention" in library.names()
True
>>> library.get("mha").inputs[0].label()
'Q[h,q,d]'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import sympy

from ..errors import DiagramError
from .axes import Axis, size_symbol
from .diagram import Diagram
from .ops import (Value, alibi, array, causal, contract, exp, gelu, layernorm, log, logsumexp, max_over, mean_over,
                  reduce, rename, rmsnorm, rsqrt, scale, silu, softcap, sliding_window, softmax, square, sum_over, tanh)


@dataclass(frozen=True)
class Entry:
    """A library diagram: how to build it, what it is, and sizes for examples and benchmarks."""

    name: str
    build: Callable[[], Diagram] = field(repr=False)
    description: str
    default_sizes: dict = field(default_factory=dict)
    family: str = "other"


_ENTRIES: dict[str, Entry] = {}


def _entry(name: str, description: str, family: str, **default_sizes):
    def register(build: Callable[[], Diagram]):
        _ENTRIES[name] = Entry(name, build, description, default_sizes, family)
        return build

    return register


def names() -> list[str]:
    """Names of the built-in diagrams."""
    return list(_ENTRIES)


def entries() -> list[Entry]:
    """Every built-in entry (name, description, default sizes, family)."""
    return list(_ENTRIES.values())


def entry(name: str) -> Entry:
    """The library entry ``name``; unknown names raise a DiagramError listing the known ones."""
    if name not in _ENTRIES:
        raise DiagramError(f"unknown diagram {name!r}; built-in diagrams: {', '.join(_ENTRIES)} "
                           "(or name a file: path/to/file.py:diagram)")
    return _ENTRIES[name]


def get(name: str) -> Diagram:
    """Build the built-in diagram ``name`` (symbolic sizes; bind them with ``.bind``)."""
    d = entry(name).build()
    return d if d.name == name else d.renamed(name)


# ------------------------------------------------------------------ contractions

@_entry("matmul", "C[a,c] = Σ_b A[a,b]·B[b,c]", "contraction", a=4096, b=4096, c=4096)
def matmul() -> Diagram:
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    A, B = array("A", a, b), array("B", b, c)
    return Diagram("matmul", contract(A, B, over=b, name="C"), description="C = A·B")


@_entry("batched_matmul", "matmul woven over a batch axis n", "contraction", n=8, a=2048, b=2048, c=2048)
def batched_matmul() -> Diagram:
    return matmul().weave(Axis("n"), name="batched_matmul")


@_entry("matmul_t", "C[a,c] = Σ_b A[a,b]·B[c,b] (transposed operand, as nn.Linear)", "contraction",
        a=4096, b=4096, c=4096)
def matmul_t() -> Diagram:
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    A, B = array("A", a, b), array("B", c, b)
    return Diagram("matmul_t", contract(A, B, over=b, out=(a, c), name="C"), description="C = A·Bᵀ")


@_entry("matvec", "y[a] = Σ_b W[a,b]·x[b] (a matrix-vector product: a linear layer at decode)", "composed",
        a=8192, b=8192)
def matvec() -> Diagram:
    a, b = Axis("a"), Axis("b")
    return Diagram("matvec", contract(array("W", a, b), array("x", b), over=b, out=(a,), name="y"),
                   description="a matrix-vector product, bound by reading W once")


@_entry("mlp", "Y[a,c] = gelu(Σ_b X[a,b]·W[c,b] + bias[c]) (linear + bias + GELU)", "contraction",
        a=4096, b=4096, c=16384)
def mlp() -> Diagram:
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    X, W, bias = array("X", a, b), array("W", c, b), array("bias", c)
    H = contract(X, W, over=b, out=(a, c), name="H")
    Y = gelu(H + bias, name="Y")
    return Diagram("mlp", Y, description="linear + bias + GELU")


# ------------------------------------------------------------------ row-wise

@_entry("softmax", "P[r,x] = softmax over x of X[r,x]", "rowwise", r=4096, x=4096)
def softmax_rows() -> Diagram:
    r, x = Axis("r"), Axis("x")
    return Diagram("softmax", softmax(array("X", r, x), over=x, name="P"))


@_entry("layernorm", "Y[r,x] = layernorm over x of X[r,x] · gamma[x] + beta[x]", "rowwise", r=4096, x=4096)
def layernorm_rows() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, gamma, beta = array("X", r, x), array("gamma", x), array("beta", x)
    Y = (layernorm(X, over=x, name="N") * gamma + beta).named("Y")
    return Diagram("layernorm", Y)


@_entry("rmsnorm", "Y[r,x] = rmsnorm over x of X[r,x] · gamma[x]", "rowwise", r=4096, x=4096)
def rmsnorm_rows() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, gamma = array("X", r, x), array("gamma", x)
    Y = (rmsnorm(X, over=x, name="N") * gamma).named("Y")
    return Diagram("rmsnorm", Y)


# ------------------------------------------------------------------ row-wise chains of maps and reductions


@_entry("log_softmax", "L[r,x] = X − m − log Σ_x exp(X − m), m = max_x X (log-softmax written as maps and "
        "reductions)", "rowwise", r=4096, x=4096)
def log_softmax_rows() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    Z = (X - max_over(X, x, name="m")).named("Z")
    L = (Z - log(sum_over(exp(Z, name="E"), x, name="s"), name="ls")).named("L")
    return Diagram("log_softmax", L, description="log-softmax over x, as torch.log_softmax")


@_entry("l2_normalize", "Y[r,x] = X·rsqrt(Σ_x X² + 1e-24) (rows scaled to unit L2 norm; F.normalize where "
        "the norm is above 1e-12, and 0 for a row of zeros)", "rowwise", r=4096, x=4096)
def l2_normalize() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    inv = rsqrt(sum_over(square(X, name="X2"), x, name="ss") + 1e-24, name="inv")
    return Diagram("l2_normalize", (X * inv).named("Y"), description="rows scaled to unit L2 norm")


@_entry("group_norm", "Y[n,g,c,s] = (X − mean)/√(var + 1e-5)·gamma[g,c] + beta[g,c], mean and var over (c,s) "
        "(F.group_norm: C = g·c channels, s spatial positions)", "rowwise", n=16, g=32, c=16, s=1024)
def group_norm() -> Diagram:
    n, g, c, s = Axis("n"), Axis("g"), Axis("c"), Axis("s")
    X, gamma, beta = array("X", n, g, c, s), array("gamma", g, c), array("beta", g, c)
    mu = mean_over(mean_over(X, s, name="mu_c"), c, name="mu")
    D = (X - mu).named("D")
    var = mean_over(mean_over(square(D, name="D2"), s, name="var_c"), c, name="var")
    rstd = rsqrt(var + 1e-5, name="rstd")
    Y = ((D * rstd).named("N") * gamma + beta).named("Y")
    return Diagram("group_norm", Y, description="group norm: a row of several axes")


@_entry("logsumexp_rows", "Y[r] = log Σ_x exp X[r,x] (torch.logsumexp over the last axis)", "rowwise",
        r=16384, x=4096)
def logsumexp_rows() -> Diagram:
    r, x = Axis("r"), Axis("x")
    return Diagram("logsumexp_rows", logsumexp(array("X", r, x), x, name="Y"), description="logsumexp of rows")


@_entry("row_range", "Y[r] = max_x X[r,x] − min_x X[r,x] (two reductions of different kinds in one pass)",
        "rowwise", r=16384, x=4096)
def row_range() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    Y = (max_over(X, x, name="hi") - reduce(X, x, "min", name="lo")).named("Y")
    return Diagram("row_range", Y, description="the spread of each row")


# ------------------------------------------------------------------ attention

def attention_scores(Q: Value, K: Value, d: str = "d") -> Value:
    """S = Q·Kᵀ/√d over the head dimension ``d`` (the scale stays symbolic until d is bound)."""
    dsize = Q.axis(d).size
    factor = sympy.Integer(1) / sympy.sqrt(dsize if isinstance(dsize, sympy.Basic) else sympy.Integer(dsize))
    return scale(contract(Q, K, over=d, name="S"), factor, name="S_scaled")


def attention_core(Q: Value, K: Value, V: Value, *, is_causal: bool = False, window: int | None = None,
                   cap: float | None = None, alibi_heads: str | None = None) -> Value:
    """O = softmax_x(mask(S))·V with the score modifiers in the order models apply them."""
    S = attention_scores(Q, K)
    if cap is not None:
        S = softcap(S, cap, name="S_capped")
    if alibi_heads is not None:
        S = alibi(S, alibi_heads, "q", "x", name="S_alibi")
    if window is not None:
        S = sliding_window(S, "q", "x", window, name="S_masked")
    elif is_causal:
        S = causal(S, "q", "x", name="S_masked")
    P = softmax(S, over="x", name="P")
    return contract(P, V, over="x", name="O")


def _qkv(heads: tuple[Axis, ...] = (), query_extra: tuple[Axis, ...] = ()):
    q, x, d = Axis("q"), Axis("x"), Axis("d")
    Q = array("Q", *heads, *query_extra, q, d)
    K = array("K", *heads, x, d)
    V = array("V", *heads, x, d)
    return Q, K, V


@_entry("attention", "O[q,d] = softmax_x(Q·Kᵀ/√d)·V, one head", "attention", q=4096, x=4096, d=128)
def attention() -> Diagram:
    Q, K, V = _qkv()
    return Diagram("attention", attention_core(Q, K, V), description="single-head attention")


@_entry("mha", "attention woven over heads h", "attention", h=16, q=4096, x=4096, d=128)
def mha() -> Diagram:
    Q, K, V = _qkv((Axis("h"),))
    return Diagram("mha", attention_core(Q, K, V), description="multi-head attention")


@_entry("attention_causal", "multi-head causal attention (key x ≤ query q)", "attention",
        h=16, q=4096, x=4096, d=128)
def attention_causal() -> Diagram:
    Q, K, V = _qkv((Axis("h"),))
    return Diagram("attention_causal", attention_core(Q, K, V, is_causal=True))


@_entry("gqa", "grouped-query attention: h K/V heads, j query heads sharing each", "attention",
        h=4, j=4, q=4096, x=4096, d=128)
def gqa() -> Diagram:
    Q, K, V = _qkv((Axis("h"),), (Axis("j"),))
    return Diagram("gqa", attention_core(Q, K, V, is_causal=True), description="causal GQA")


@_entry("attention_window", "multi-head causal sliding-window attention (window 256)", "attention",
        h=16, q=4096, x=4096, d=128)
def attention_window() -> Diagram:
    Q, K, V = _qkv((Axis("h"),))
    return Diagram("attention_window", attention_core(Q, K, V, window=256))


@_entry("attention_alibi", "multi-head causal attention with ALiBi biases", "attention",
        h=16, q=4096, x=4096, d=128)
def attention_alibi() -> Diagram:
    Q, K, V = _qkv((Axis("h"),))
    return Diagram("attention_alibi", attention_core(Q, K, V, is_causal=True, alibi_heads="h"))


@_entry("attention_softcap", "multi-head causal attention with logit soft-capping at 50", "attention",
        h=16, q=4096, x=4096, d=128)
def attention_softcap() -> Diagram:
    Q, K, V = _qkv((Axis("h"),))
    return Diagram("attention_softcap", attention_core(Q, K, V, is_causal=True, cap=50.0))


# ------------------------------------------------------------------ transformer block

@_entry("transformer_block", "pre-RMSNorm causal multi-head attention + GELU MLP, with residuals",
        "block", q=2048, e=1024, h=8, d=128, f=4096)
def transformer_block() -> Diagram:
    q, e, h, d, f = Axis("q"), Axis("e"), Axis("h"), Axis("d"), Axis("f")
    X = array("X", q, e)
    g1, g2 = array("g1", e), array("g2", e)
    Wq, Wk, Wv = array("Wq", h, d, e), array("Wk", h, d, e), array("Wv", h, d, e)
    Wo = array("Wo", e, h, d)
    W1, b1, W2 = array("W1", f, e), array("b1", f), array("W2", e, f)

    Xn = (rmsnorm(X, over=e, name="N1") * g1).named("Xn")
    Q = contract(Xn, Wq, over=e, out=(h, q, d), name="Qp")
    # Keys and values are the same tokens read along a second axis x: a free relabelling.
    K = rename(contract(Xn, Wk, over=e, out=(h, q, d), name="Kp"), q="x", name="K")
    V = rename(contract(Xn, Wv, over=e, out=(h, q, d), name="Vp"), q="x", name="V")
    O = attention_core(Q, K, V, is_causal=True)
    A = contract(O, Wo, over=(h, d), out=(q, e), name="A")
    X2 = (X + A).named("X2")
    Xn2 = (rmsnorm(X2, over=e, name="N2") * g2).named("Xn2")
    H = gelu(contract(Xn2, W1, over=e, out=(q, f), name="H1") + b1, name="H")
    Y = (X2 + contract(H, W2, over=f, out=(q, e), name="M")).named("Y")
    return Diagram("transformer_block", Y, description="pre-norm transformer block")


# ------------------------------------------------------------------ composed

@_entry("swiglu", "Y[a,b] = Σ_f (silu(X·Wgᵀ) ⊙ X·Wuᵀ)[a,f]·Wd[b,f] (LLaMA feed-forward)", "composed",
        a=4096, b=4096, f=11008)
def swiglu() -> Diagram:
    a, b, f = Axis("a"), Axis("b"), Axis("f")
    X, Wg, Wu, Wd = array("X", a, b), array("Wg", f, b), array("Wu", f, b), array("Wd", b, f)
    G = silu(contract(X, Wg, over=b, out=(a, f), name="G_lin"), name="G")
    U = contract(X, Wu, over=b, out=(a, f), name="U")
    Y = contract((G * U).named("H"), Wd, over=f, out=(a, b), name="Y")
    return Diagram("swiglu", Y, description="SwiGLU feed-forward: (silu(X·Wg) ⊙ X·Wu)·Wd")


@_entry("rmsnorm_linear", "Y[r,c] = Σ_x (rmsnorm_x(X)·gamma)[r,x]·W[c,x] (pre-norm projection)", "composed",
        r=4096, x=4096, c=4096)
def rmsnorm_linear() -> Diagram:
    r, x, c = Axis("r"), Axis("x"), Axis("c")
    X, gamma, W = array("X", r, x), array("gamma", x), array("W", c, x)
    Xn = (rmsnorm(X, over=x, name="N") * gamma).named("Xn")
    return Diagram("rmsnorm_linear", contract(Xn, W, over=x, out=(r, c), name="Y"),
                   description="RMSNorm then a linear layer")


@_entry("gemm_softmax", "P[a,c] = softmax_c(Σ_b A[a,b]·B[c,b]) (logits then probabilities)", "composed",
        a=4096, b=1024, c=4096)
def gemm_softmax() -> Diagram:
    a, b, c = Axis("a"), Axis("b"), Axis("c")
    A, B = array("A", a, b), array("B", c, b)
    return Diagram("gemm_softmax", softmax(contract(A, B, over=b, out=(a, c), name="L"), over=c, name="P"),
                   description="a GEMM whose rows are softmaxed")


@_entry("gelu_tanh", "Y[r,x] = 0.5·X·(1 + tanh(√(2/π)·(X + 0.044715·X³))) (an elementwise chain)",
        "composed", r=8192, x=8192)
def gelu_tanh() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    inner = scale(X + scale(X * X * X, 0.044715), math.sqrt(2.0 / math.pi))
    Y = (scale(X, 0.5) * (tanh(inner) + 1.0)).named("Y")
    return Diagram("gelu_tanh", Y, description="tanh-form GELU written as a chain of maps")


@_entry("column_sum", "Y[x] = Σ_r X[r,x] (a reduction over the non-contiguous axis)", "composed",
        r=16384, x=4096)
def column_sum() -> Diagram:
    r, x = Axis("r"), Axis("x")
    return Diagram("column_sum", sum_over(array("X", r, x), r, name="Y"), description="column sums")


def symbol(name: str) -> sympy.Symbol:
    """The size symbol of axis ``name`` (as used in symbolic costs)."""
    return size_symbol(name)
