"""Skinny products for the tests: a few vectors (at most ``pointwise.MAX_REP``) by a large matrix,
in either layout of the matrix, with maps after the product, batched, with two small axes, and the
small factor stored with its own axis innermost."""

from __future__ import annotations

from napkin.diagrams import Diagram, array, axes, contract, map_fn


def linear_rows() -> Diagram:
    """y[b,a] = Σ_k W[a,k]·x[b,k]: a linear layer's weight (k innermost) by b vectors (row kernel)."""
    a, b, k = axes("a b k")
    return Diagram("linear_rows", contract(array("W", a, k), array("x", b, k), over=k, out=(b, a), name="y"))


def linear_cols() -> Diagram:
    """y[b,a] = Σ_k W[k,a]·x[b,k]: the weight stored the other way (a innermost: column kernel)."""
    a, b, k = axes("a b k")
    return Diagram("linear_cols", contract(array("W", k, a), array("x", b, k), over=k, out=(b, a), name="y"))


def linear_bias_gelu() -> Diagram:
    """y[b,a] = gelu(Σ_k W[a,k]·x[b,k] + bias[a]) + res[b,a]: maps after the product."""
    a, b, k = axes("a b k")
    p = contract(array("W", a, k), array("x", b, k), over=k, out=(b, a), name="p")
    z = map_fn("gelu", (p + array("bias", a)).named("z"), name="g")
    return Diagram("linear_bias_gelu", (z + array("res", b, a)).named("y"))


def out_transposed() -> Diagram:
    """y[a,b] = Σ_k W[k,a]·x[k,b]: the small factor with its own axis innermost, the output too."""
    a, b, k = axes("a b k")
    return Diagram("out_transposed", contract(array("W", k, a), array("x", k, b), over=k, out=(a, b), name="y"))


def batched_two_small() -> Diagram:
    """y[n,c,b,a] = Σ_k W[n,a,k]·x[n,b,c,k]: a batch axis in both, two small axes (b, c)."""
    n, a, b, c, k = axes("n a b c k")
    return Diagram("batched_two_small", contract(array("W", n, a, k), array("x", n, b, c, k), over=k,
                                                 out=(n, c, b, a), name="y"))


def two_sums() -> Diagram:
    """y[b,a] = Σ_{h,d} W[h,a,d]·x[b,h,d]: a sum over two axes, one of them outermost in W."""
    a, b, h, d = axes("a b h d")
    return Diagram("two_sums", contract(array("W", h, a, d), array("x", b, h, d), over=(h, d), out=(b, a), name="y"))


#: (builder, sizes): shapes that fill no tile (odd sizes), long sums that split, one to eight vectors
CASES = [
    (linear_rows, dict(a=1000, b=4, k=4096)), (linear_rows, dict(a=37, b=3, k=999)),
    (linear_rows, dict(a=4096, b=8, k=512)), (linear_rows, dict(a=5, b=2, k=65536)),
    (linear_cols, dict(a=4096, b=4, k=4096)), (linear_cols, dict(a=1001, b=7, k=333)),
    (linear_cols, dict(a=64, b=8, k=65536)), (linear_cols, dict(a=4095, b=2, k=7)),
    (linear_bias_gelu, dict(a=1000, b=5, k=1024)), (out_transposed, dict(a=2048, b=6, k=1000)),
    (batched_two_small, dict(n=3, a=333, b=2, c=3, k=256)), (two_sums, dict(a=777, b=4, h=5, d=96)),
]


#: (builder, sizes, splits): the swapped wgmma tile's cases (its nvcc builds and GPU checks): rows
#: and vectors that fill no tile, sums that are no whole number of chunks, both layouts of the
#: matrix, maps after the product, a batch with two small axes, a sum over two axes, splits
SWAP_CASES = [
    (linear_rows, dict(a=1000, b=5, k=1000), 1),
    (linear_rows, dict(a=4096, b=1, k=4096), 1),
    (linear_rows, dict(a=4096, b=3, k=4096), 2),
    (linear_rows, dict(a=2040, b=16, k=777), 1),
    (linear_rows, dict(a=520, b=24, k=130), 1),
    (linear_rows, dict(a=512, b=33, k=200), 1),
    (linear_rows, dict(a=1032, b=64, k=1100), 3),
    (linear_cols, dict(a=1000, b=7, k=333), 1),
    (linear_cols, dict(a=4096, b=4, k=11008), 4),
    (linear_bias_gelu, dict(a=1000, b=5, k=1024), 1),
    (linear_bias_gelu, dict(a=1000, b=5, k=1024), 2),
    (batched_two_small, dict(n=3, a=336, b=2, c=3, k=256), 1),
    (batched_two_small, dict(n=3, a=336, b=2, c=3, k=1024), 2),
    (two_sums, dict(a=776, b=4, h=5, d=96), 1),
]


def case_id(case) -> str:
    """A test id for a (builder, sizes, splits) case."""
    build, sizes, splits = case
    return f"{build.__name__}-{'-'.join(map(str, sizes.values()))}-x{splits}"
