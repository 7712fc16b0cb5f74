"""Canonical forms of the optimal transfer cost, and what follows from them (docs/architecture.md §4.3).

Given the transfer cost ``H(sizes, tiles)`` and the memory ``M(tiles)`` of a schedule (as the
cost model gives them symbolically), :func:`canonical_form` chooses the tiles that minimise
H under a memory budget M and writes the optimum as

    H*(sizes, M) = Σ_t α_t · M^(−β_t).

Stream chunks only cost memory, so they shrink to nothing (``s → 0`` in M); a tile that does
not appear in H is set to 1 (it only costs memory); the others come from the Lagrange
conditions (equal tiles when H and M are symmetric in them, e.g. √M × √M for a matmul).
β is read off each term: ½ for matmul (``2abc·M^(−1/2) + ac``), 1 for attention
(``2qd + 4xqd²/M``), 0 for compulsory input/output traffic. The optimum does not clamp
tiles at their axes (``g ≤ n``): below that the formula is a bound, not a schedule.

Then:

- :func:`multilevel_time` — several levels: ``T = Σ_t α_t Σ_ℓ M_ℓ^(−β_t) / Ḣ_ℓ`` (the top level
  has unbounded memory and costs nothing);
- :func:`quantization_speedup` — at q bytes per value the capacity in values is ``M_bytes/q``
  and the rate ``Ḣ_bytes/q``, so a β-term's time scales as ``q^(1+β)``: fp32→fp16 is ×4 for
  attention, ×2.83 for matmul;
- :func:`l2_effective_memory` — a level shared by concurrently active children acts, for
  traffic from above, as their combined memory while it fits;
- :func:`cluster_level_weight` — a level whose children exchange data directly (thread-block
  clusters, NVLink) is an extra level weighted by the difference of per-value costs.

>>> import sympy
>>> a, b, c, g_a, g_c, s_b = sympy.symbols("a b c g_a g_c s_b", positive=True)
>>> f = canonical_form(a*b*c*(1/g_a + 1/g_c) + a*c, g_a*g_c + s_b*(g_a + g_c))
>>> f.expr
a*c + 2*a*b*c/sqrt(M)
>>> f.betas
(0, 1/2)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import sympy

from ..dtypes import dtype as lookup_dtype
from ..errors import NapkinError

__all__ = [
    "MEMORY",
    "CanonicalForm",
    "canonical_form",
    "canonical_form_of",
    "cluster_level_weight",
    "l2_effective_memory",
    "levels_from_gpu",
    "multilevel_time",
    "quantization_speedup",
]

#: The memory budget symbol.
MEMORY = sympy.Symbol("M", positive=True)


class CanonicalError(NapkinError):
    """A cost that napkin cannot bring to canonical form."""


@dataclass(frozen=True)
class CanonicalForm:
    """``H*(M) = Σ α_t M^(−β_t)`` with the optimal tiles as functions of M."""

    terms: tuple[tuple[sympy.Expr, sympy.Expr], ...]   # (α, β), β ascending
    expr: sympy.Expr
    tiles: dict                                         # tile symbol -> optimal value in terms of M
    memory: sympy.Symbol = MEMORY

    @property
    def betas(self) -> tuple:
        return tuple(b for _, b in self.terms)

    def alpha(self, beta) -> sympy.Expr:
        """The coefficient of the ``M^(−beta)`` term (0 if absent)."""
        beta = sympy.nsimplify(beta)
        for a, b in self.terms:
            if sympy.simplify(b - beta) == 0:
                return a
        return sympy.Integer(0)

    @property
    def beta(self):
        """The largest β (the term that memory helps most)."""
        return max(self.betas)

    def __call__(self, M):
        return self.expr.subs(self.memory, M)

    def __str__(self) -> str:
        parts = ", ".join(f"β={b}: α={a}" for a, b in self.terms)
        return f"H*(M) = {self.expr}  [{parts}]"


def _is_tile(sym: sympy.Symbol, prefixes) -> bool:
    return any(sym.name.startswith(p + "_") for p in prefixes)


def canonical_form(H_expr, M_expr, *, tiles: Sequence | None = None, streams: Sequence | None = None,
                   memory: sympy.Symbol = MEMORY) -> CanonicalForm:
    """The optimum of ``H_expr`` over tiles under ``M_expr = memory``, as Σ α_t·M^(−β_t).

    ``tiles`` / ``streams`` are the tile symbols (default: names starting ``g_``/``w_`` and ``s_``).
    """
    H = sympy.sympify(H_expr)
    Mx = sympy.sympify(M_expr)
    free = H.free_symbols | Mx.free_symbols
    if streams is None:
        streams = [s for s in free if _is_tile(s, ("s",))]
    if tiles is None:
        tiles = [s for s in free if _is_tile(s, ("g", "w"))]
    tiles = sorted(set(tiles), key=lambda s: s.name)
    # positive versions of every symbol, so roots and powers simplify
    pos = {s: sympy.Symbol(s.name, positive=True) for s in free if not s.is_positive}
    H, Mx = H.subs(pos), Mx.subs(pos)
    tiles = [pos.get(t, t) for t in tiles]
    streams = [pos.get(s, s) for s in streams]
    # stream chunks cost memory only: negligible at the optimum
    Mx = sympy.expand(Mx.subs({s: 0 for s in streams}))
    # tiles absent from H only cost memory: take them as small as possible
    fixed = {t: sympy.Integer(1) for t in tiles if t not in H.free_symbols}
    Mx = Mx.subs(fixed)
    live = [t for t in tiles if t not in fixed]
    for t in live:
        if t not in Mx.free_symbols:
            raise CanonicalError(f"tile {t} lowers the transfer cost without using memory; the optimum is "
                                 "unbounded (give it its axis size)")
    sol = _optimise(H, Mx, live, memory)
    sol.update(fixed)
    Hs = sympy.expand(sympy.powsimp(sympy.expand(H.subs(sol)), force=True))
    terms: dict = {}
    for term in sympy.Add.make_args(Hs):
        coeff, exp = term.as_coeff_exponent(memory)
        if memory in coeff.free_symbols:
            raise CanonicalError(f"term {term} is not of the form α·M^(−β)")
        beta = sympy.nsimplify(-exp)
        terms[beta] = sympy.simplify(terms.get(beta, 0) + coeff)
    pairs = tuple(sorted(((a, b) for b, a in terms.items() if a != 0), key=lambda p: float(p[1])))
    expr = sum((a * memory ** (-b) for a, b in pairs), sympy.Integer(0))
    back = {v: k for k, v in pos.items()}
    return CanonicalForm(terms=tuple((a.subs(back), b) for a, b in pairs), expr=expr.subs(back),
                         tiles={back.get(t, t): v.subs(back) for t, v in sol.items()}, memory=memory)


def _symmetric(H, M, tiles) -> bool:
    for i in range(len(tiles)):
        for j in range(i + 1, len(tiles)):
            swap = {tiles[i]: tiles[j], tiles[j]: tiles[i]}
            if sympy.simplify(H.subs(swap, simultaneous=True) - H) != 0:
                return False
            if sympy.simplify(M.subs(swap, simultaneous=True) - M) != 0:
                return False
    return True


def _positive_root(eq, var):
    sols = [s for s in sympy.solve(eq, var) if s.is_positive is not False and not s.has(sympy.I)]
    if not sols:
        raise CanonicalError(f"no positive solution of {eq} = 0 for {var}")
    return sols[0]


def _optimise(H, M, tiles, memory) -> dict:
    if not tiles:
        return {}
    if len(tiles) == 1:
        return {tiles[0]: _positive_root(M - memory, tiles[0])}
    if _symmetric(H, M, tiles):
        t = sympy.Symbol("_t", positive=True)
        tv = _positive_root(M.subs({x: t for x in tiles}) - memory, t)
        return {x: tv for x in tiles}
    # general: eliminate one tile with the budget, then stationary points in the rest
    last, rest = tiles[-1], tiles[:-1]
    tl = _positive_root(M - memory, last)
    Hr = H.subs(last, tl)
    eqs = [sympy.together(sympy.diff(Hr, x)) for x in rest]
    sols = sympy.solve([sympy.numer(e) for e in eqs], rest, dict=True)
    for s in sols:
        if all(v.is_positive is not False and not v.has(sympy.I) for v in s.values()):
            out = dict(s)
            out[last] = sympy.simplify(tl.subs(s))
            return out
    raise CanonicalError(f"could not optimise {H} under {M} = {memory} over {', '.join(map(str, tiles))}")


def canonical_form_of(cost, *, transfer_level: str = "L2", memory_level: str = "SMEM") -> CanonicalForm:
    """:func:`canonical_form` of a symbolic :class:`~napkin.perfmodel.cost.Cost` (block-level H and M)."""
    if not cost.is_symbolic:
        raise CanonicalError("canonical_form_of needs a symbolic cost")
    M = cost.M(memory_level)
    if isinstance(M, sympy.Max):
        raise CanonicalError(f"memory at {memory_level} is a maximum over kernels ({M}); cost one kernel's "
                             "schedule or pass H and M to canonical_form")
    return canonical_form(cost.H(transfer_level), M)


# ----------------------------------------------------------------------------- consequences


def _terms(terms) -> list[tuple]:
    if isinstance(terms, CanonicalForm):
        return list(terms.terms)
    return [(a, b) for a, b in terms]


def multilevel_time(terms, levels):
    """``T = Σ_t α_t Σ_ℓ M_ℓ^(−β_t) / Ḣ_ℓ`` over the levels below the top.

    ``terms``: a :class:`CanonicalForm` or ``(α, β)`` pairs. ``levels``: ``(M_ℓ, Ḣ_ℓ)`` pairs (or a
    mapping name → pair): memory in values and the rate values move into the level, values/s.
    A level with unbounded memory (``math.inf``, the top) costs nothing and may be listed.
    """
    items = list(levels.values()) if isinstance(levels, Mapping) else list(levels)
    total = 0
    for alpha, beta in _terms(terms):
        for M, rate in items:
            if M is None or (isinstance(M, (int, float)) and math.isinf(M)) or M == sympy.oo:
                continue
            if isinstance(rate, (int, float)) and math.isinf(rate):
                continue
            if all(isinstance(x, (int, float)) or (isinstance(x, sympy.Basic) and x.is_number)
                   for x in (alpha, beta, M, rate)):
                total += float(alpha) * float(M) ** (-float(beta)) / float(rate)
            else:
                total += sympy.sympify(alpha) * sympy.sympify(M) ** (-sympy.sympify(beta)) / sympy.sympify(rate)
    return total


def _bytes(q) -> float:
    if isinstance(q, str):
        return lookup_dtype(q).bytes
    return q


def quantization_speedup(beta, q_from, q_to):
    """Speed-up of a β-term when values shrink from ``q_from`` to ``q_to`` bytes (or dtype names).

    Capacity in values is M_bytes/q and rate Ḣ_bytes/q, so time ∝ q^(1+β):
    ``quantization_speedup(1, "fp32", "fp16") == 4``, ``(0.5, 4, 2) ≈ 2.83``.
    """
    qf, qt = _bytes(q_from), _bytes(q_to)
    if isinstance(beta, sympy.Basic) and not beta.is_number:
        return (sympy.sympify(qf) / qt) ** (1 + beta)
    return (float(qf) / float(qt)) ** (1 + float(beta))


def l2_effective_memory(child_memory, children, capacity):
    """Memory a shared level offers its children's traffic from above: their combined memory while it fits.

    Numeric: the working sets of as many children as fit (at most ``children``) —
    ``min(children, floor(capacity / child_memory)) · child_memory``, at least one child's.
    Symbolic: ``Min(children · child_memory, capacity)``.
    """
    vals = (child_memory, children, capacity)
    if all(isinstance(v, (int, float)) for v in vals):
        if child_memory <= 0:
            raise ValueError("child_memory must be positive")
        k = min(int(children), int(capacity // child_memory))
        return max(1, k) * child_memory
    return sympy.Min(sympy.sympify(children) * child_memory, capacity)


def cluster_level_weight(cost_above, cost_cluster):
    """Weight of the extra level a cluster adds: per-value cost from above minus within the cluster.

    With per-value costs c_above (e.g. 1/Ḣ_HBM) and c_cluster (1/Ḣ between cluster peers), traffic
    into each child is H(M_child)·c_cluster + H(M_cluster)·(c_above − c_cluster): the cluster
    acts as a level of memory M_cluster weighted by the difference (0 if peers are no cheaper).
    """
    if all(isinstance(v, (int, float)) for v in (cost_above, cost_cluster)):
        return max(0.0, float(cost_above) - float(cost_cluster))
    return sympy.sympify(cost_above) - sympy.sympify(cost_cluster)


def levels_from_gpu(gpu, dtype: str = "bf16", names: Iterable[str] = ("SMEM", "RF")) -> dict:
    """``{level: (M_ℓ values per block, Ḣ_ℓ values/s into it)}`` from a GPU profile, for multilevel_time."""
    from .hardware import get_gpu

    g = get_gpu(gpu)
    q = lookup_dtype(dtype).bytes
    out = {}
    for n in names:
        lv = g.level(n)
        cap = lv.per_block_bytes or lv.capacity_bytes
        out[n] = (cap / q if cap else math.inf, g.bandwidth_into(n) / q)
    return out
