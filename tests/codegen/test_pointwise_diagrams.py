"""The diagrams the pointwise family's tests share (tests/codegen/test_pointwise.py on the CPU,
tests/codegen/test_pointwise_gpu.py on a GPU): elementwise chains, reductions over one or several
axes of either kind (the vector axis reduced or kept), maps before and after a reduction. No tests
of its own."""

from __future__ import annotations

import math

from napkin.diagrams import (Diagram, alibi, array, axes, causal, contract, exp, map_fn, max_over, mean_over, reduce,
                             rename, scale, sum_over, tanh)


def sigmoid_chain() -> Diagram:
    """sigmoid written as 0.5·tanh(0.5·x) + 0.5: three elementwise boxes."""
    r, x = axes("r x")
    t = tanh(scale(array("X", r, x), 0.5, name="h"), name="t")
    return Diagram("sigmoid_chain", (t * 0.5 + 0.5).named("Y"))


def broadcast_chain() -> Diagram:
    r, x = axes("r x")
    X, b, c = array("X", r, x), array("b", x), array("c", r)
    return Diagram("broadcast_chain", ((X * b).named("P") + c).named("Y"))


def transposed_add() -> Diagram:
    r, x = axes("r x")
    return Diagram("transposed_add", (array("X", r, x) + array("Z", x, r)).named("Y"))


def column_sum() -> Diagram:
    r, x = axes("r x")
    return Diagram("column_sum", sum_over(array("X", r, x), r, name="S"))


def row_sum() -> Diagram:
    r, x = axes("r x")
    return Diagram("row_sum", sum_over(array("X", r, x), x, name="S"))


def sum_bh() -> Diagram:
    """Σ over the two non-last axes b, h of X[b,h,s]."""
    b, h, s = axes("b h s")
    return Diagram("sum_bh", sum_over(sum_over(array("X", b, h, s), b, name="S1"), h, name="S"))


def sum_bs() -> Diagram:
    """Σ over b and s of X[b,h,s]: the reduced axes are not next to each other."""
    b, h, s = axes("b h s")
    return Diagram("sum_bs", sum_over(sum_over(array("X", b, h, s), b, name="S1"), s, name="S"))


def total() -> Diagram:
    r, x = axes("r x")
    return Diagram("total", sum_over(sum_over(array("X", r, x), r, name="S1"), x, name="S"))


def l2_norm() -> Diagram:
    r, x = axes("r x")
    ss = sum_over(map_fn("square", array("X", r, x)), x, name="ss")
    return Diagram("l2_norm", map_fn("sqrt", ss, name="N"))


def column_mean() -> Diagram:
    r, x = axes("r x")
    return Diagram("column_mean", mean_over(array("X", r, x), r, name="M"))


def reduce_of(how: str, over: str) -> Diagram:
    r, x = axes("r x")
    return Diagram(f"{how}_{over}", reduce(exp(scale(array("X", r, x), 0.25)), over, how, name="S"))


def middle_of(how: str) -> Diagram:
    """A reduction over the middle axis of X[b,m,n] (torch's sum(dim=1)): the kept vector axis n is
    innermost, b outer."""
    b, m, n = axes("b m n")
    return Diagram(f"{how}_middle", reduce(array("X", b, m, n), m, how, name="Y"))


def sum_middle() -> Diagram:
    return middle_of("sum")


def max_middle() -> Diagram:
    return middle_of("max")


def min_middle() -> Diagram:
    return middle_of("min")


def mean_middle() -> Diagram:
    return middle_of("mean")


def post_maps() -> Diagram:
    """sqrt(Σ_r (X·W)²)·g + 1: maps before and after a column reduction, inputs on either side."""
    r, x = axes("r x")
    X, W, g = array("X", r, x), array("W", r, x), array("g", x)
    S = sum_over(map_fn("square", X * W), r, name="S")
    return Diagram("post_maps", (map_fn("sqrt", S) * g + 1.0).named("Y"))


def full_and_reduced() -> Diagram:
    r, x = axes("r x")
    Y = (array("X", r, x) * 2.0).named("Y")
    return Diagram("full_and_reduced", (Y, max_over(Y, x, name="M")))


def masked_rowmax() -> Diagram:
    q, x = axes("q x")
    return Diagram("masked_rowmax", max_over(causal(array("S", q, x), "q", "x"), x, name="M"))


def alibi_map() -> Diagram:
    h, q, x = axes("h q x")
    return Diagram("alibi_map", alibi(array("S", h, q, x), "h", "q", "x", name="Y"))


def rotated_scale() -> Diagram:
    """Y[c, a, b] = 2·X[a, b, c]: a rotation of three axes (cross axis c, vector axis b)."""
    a, b, c = axes("a b c")
    return Diagram("rotated_scale", scale(contract(array("X", a, b, c), over=(), out=(c, a, b)), 2.0, name="Y"))


def transposed_bias_relu() -> Diagram:
    """relu(y[b] + X[a, b]) written as Y[b, a]: X staged through the cross tile, y broadcast."""
    a, b = axes("a b")
    y, X = array("y", b), array("X", a, b)
    return Diagram("transposed_bias_relu", map_fn("relu", y + X, name="Y"))


def transposed_mix() -> Diagram:
    """Y[a, b, h] = X[a, b, h]·Z[a, h, b] + W[h, b] − slope(a)·|b − h|: two inputs staged through
    the cross tile (Z and W, cross axis b), one read as vectors, an index map (ALiBi) on both tile
    axes."""
    a, b, h = axes("a b h")
    X, Z, W = array("X", a, b, h), array("Z", a, h, b), array("W", h, b)
    P = contract(X, Z, over=(), out=(a, b, h), name="P")
    return Diagram("transposed_mix", alibi((P + W).named("Q"), "a", "b", "h", name="Y"))


def two_layouts() -> Diagram:
    """Y[a, b] = 2·X[a, b] and Z[b, a] = tanh(X[a, b])·W[b, a]: outputs in both layouts (the
    gradient of a transposed read): Z and W staged through the cross tile, Z written along a."""
    a, b = axes("a b")
    X, W = array("X", a, b), array("W", b, a)
    Y = scale(X, 2.0, name="Y")
    Z = contract(tanh(X, name="t"), W, over=(), out=(b, a), name="Z")
    return Diagram("two_layouts", (Y, Z))


def symmetric_part(n: int = 100) -> Diagram:
    """Y[i, j] = (X[i, j] + X[j, i]) / 2 over n x n: X read as it is and through its transposed
    view, the view staged through the cross tile from X's own tensor."""
    from napkin.diagrams import Axis

    X = array("X", Axis("i", n), Axis("j", n))
    return Diagram("symmetric_part", scale(X + rename(X, i="j", j="i", name="Xt"), 0.5, name="Y"))


ACCEPTED = [
    (sigmoid_chain, dict(r=5, x=37), "map"),
    (broadcast_chain, dict(r=7, x=24), "map"),
    (transposed_add, dict(r=6, x=16), "map"),
    (alibi_map, dict(h=2, q=5, x=16), "map"),
    (column_sum, dict(r=37, x=24), "col"),
    (row_sum, dict(r=5, x=100), "row"),
    (sum_bh, dict(b=3, h=5, s=32), "col"),
    (sum_bs, dict(b=3, h=5, s=32), "row"),
    (total, dict(r=9, x=40), "row"),
    (l2_norm, dict(r=6, x=72), "row"),
    (column_mean, dict(r=29, x=40), "col"),
    (post_maps, dict(r=20, x=24), "col"),
    (full_and_reduced, dict(r=4, x=40), "row"),
    (masked_rowmax, dict(q=9, x=9), "row"),
]


def matvec() -> Diagram:
    """y[a] = Σ_b W[a,b]·x[b]: a sum of products over the contiguous axis."""
    a, b = axes("a b")
    return Diagram("matvec", contract(array("W", a, b), array("x", b), over=b, out=(a,), name="y"))


def vecmat() -> Diagram:
    """y[c] = Σ_b x[b]·W[b,c]: the sum runs over the non-contiguous axis."""
    b, c = axes("b c")
    return Diagram("vecmat", contract(array("x", b), array("W", b, c), over=b, out=(c,), name="y"))


def batched_matvec_gelu() -> Diagram:
    """y[n,a] = gelu(Σ_b W[n,a,b]·x[n,b] + bias[a]): a batched product with maps after it."""
    n, a, b = axes("n a b")
    y = contract(array("W", n, a, b), array("x", n, b), over=b, out=(n, a), name="p")
    return Diagram("batched_matvec_gelu", map_fn("gelu", (y + array("bias", a)).named("z"), name="y"))


def dot_all() -> Diagram:
    """s = Σ_{r,x} X[r,x]·Y[r,x], then a sum of a sum: a contraction over every axis."""
    r, x = axes("r x")
    return Diagram("dot_all", contract(array("X", r, x), array("Y", r, x), over=(r, x), out=(), name="s"))


ACCEPTED += [
    (matvec, dict(a=7, b=100), "row"),
    (vecmat, dict(b=37, c=24), "col"),
    (batched_matvec_gelu, dict(n=2, a=5, b=40), "row"),
    (dot_all, dict(r=9, x=40), "row"),
]


def column_logsumexp() -> Diagram:
    """logsumexp over the outer axis r of X[r,x]: the max and the sum of exp(x − max) in one pass."""
    from napkin.diagrams.ops import logsumexp

    r, x = axes("r x")
    return Diagram("column_logsumexp", logsumexp(array("X", r, x), r, name="L"))


def _logsumexp_two_axes(name: str, X, first, second) -> Diagram:
    """logsumexp of ``X`` over ``first`` then ``second``, written out: chains of two maxes and two
    sums, the shift ``zero_inf(max)`` and ``log(sum) + shift``."""
    m = map_fn("zero_inf", max_over(max_over(X, first, name="m1"), second, name="m"), name="c")
    t = sum_over(sum_over(exp(map_fn("sub", X, m, name="d"), name="e"), first, name="t1"), second, name="t")
    return Diagram(name, map_fn("add", map_fn("log", t, name="lt"), m, name="L"))


def row_logsumexp() -> Diagram:
    """logsumexp of a scaled X[r,h,x] over its two innermost axes (h, then x), written out: a pair
    in the row kernel (rows that are contiguous runs of X), a map before it. Over the innermost
    axis alone it would be a row the row-wise family takes."""
    r, h, x = axes("r h x")
    return _logsumexp_two_axes("row_logsumexp", scale(array("X", r, h, x), 0.5, name="v"), h, x)


def softmax_stats() -> Diagram:
    """The statistics of a softmax over r written out: m = max_r X, s = Σ_r exp(X − m), both
    outputs (the shift is the max itself)."""
    r, x = axes("r x")
    X = array("X", r, x)
    m = max_over(X, r, name="m")
    return Diagram("softmax_stats", (m, sum_over(exp(map_fn("sub", X, m, name="d"), name="e"), r, name="s")))


def logsumexp_bs() -> Diagram:
    """logsumexp over b and s of X[b,h,s], written out: the vector axis s is reduced (row kernel)."""
    b, h, s = axes("b h s")
    return _logsumexp_two_axes("logsumexp_bs", array("X", b, h, s), b, s)


def logsumexp_bh() -> Diagram:
    """logsumexp over b and h of X[b,h,s], written out: the kept axis s is the vector axis."""
    b, h, s = axes("b h s")
    return _logsumexp_two_axes("logsumexp_bh", array("X", b, h, s), b, h)


ACCEPTED += [
    (column_logsumexp, dict(r=37, x=24), "col"),
    (row_logsumexp, dict(r=5, h=3, x=100), "row"),
    (softmax_stats, dict(r=29, x=40), "col"),
    (logsumexp_bs, dict(b=3, h=5, s=32), "row"),
    (logsumexp_bh, dict(b=3, h=5, s=32), "col"),
]


def random_permuted_map(seed: int) -> tuple[Diagram, dict]:
    """A map over 2 to 4 axes whose inputs and output hold them in random orders (a random subset
    of the axes for each input, broadcast by name), with sizes from 1 to 512 that fill no tile:
    the cross tile's held-out cases. Returns the diagram and its sizes."""
    import random

    rng = random.Random(seed)
    names = ["a", "b", "c", "e"][: rng.randint(2, 4)]
    choices = (1, 2, 3, 7, 16, 17, 33, 64, 100, 129, 255, 512)
    while True:
        sizes = {n: rng.choice(choices) for n in names}
        if 2 ** 10 <= math.prod(sizes.values()) <= 2 ** 21:
            break
    ax = dict(zip(names, axes(" ".join(names))))
    arrays = []
    for i in range(rng.randint(1, 3)):
        held = [n for n in names if rng.random() < 0.8] or [rng.choice(names)]
        if i == 0:
            held = list(names)  # one input holds every axis
        rng.shuffle(held)
        arrays.append(array(f"X{i}", *(ax[n] for n in held)))
    e = tanh(arrays[0], name="t") if rng.random() < 0.5 else arrays[0]
    for j, x in enumerate(arrays[1:]):
        e = (e * x if rng.random() < 0.5 else e + x).named(f"m{j}")
    out = list(names)
    rng.shuffle(out)
    return Diagram(f"permuted_{seed}", contract(e, over=(), out=tuple(ax[n] for n in out), name="Y")), sizes
