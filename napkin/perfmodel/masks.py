"""Skipping fully masked tiles: why causal attention costs half.

When a kernel streams the key axis ``x`` into an online softmax and the scores pass
a causal or sliding-window mask on the way, a (query tile, key chunk) pair whose
every score is masked contributes exp(−∞) = 0 to the softmax and nothing to the
output. The kernel skips such pairs: it neither loads their K and V chunks nor
computes on them. The cost model and the CPU interpreter both count only the
visited pairs, so a causal kernel moves and computes about half of a dense one.

>>> visited(("causal", (0,)), (0, 64), (64, 128))
False
>>> visited(("causal", (0,)), (64, 128), (0, 64))
True
"""

from __future__ import annotations

import math
from fractions import Fraction

from .legality import KernelPlan

SKIPPABLE = ("causal", "sliding_window")


def skippable_mask(plan: KernelPlan, sizes: dict | None = None):
    """``(query axis, key axis, fn, params)`` of a mask whose masked tiles the kernel skips, or None.

    The mask must read (query, key) indices with the key axis streamed, and its output must
    reach an online softmax over that axis through elementwise maps only (so a skipped tile
    would have contributed exactly zero).
    """
    if not plan.stream or not plan.online:
        return None
    key = plan.stream[0]
    online_ids = set(plan.online)
    for b in plan.boxes:
        op = b.op
        if op.kind != "map" or op.fn not in SKIPPABLE:
            continue
        q_axis, x_axis = op.index_axes
        if x_axis != key or q_axis == key:
            continue
        if _reaches_only_online(plan, b, online_ids):
            return q_axis, x_axis, op.fn, op.param_values(sizes or plan.sizes)
    return None


def _reaches_only_online(plan: KernelPlan, box, online_ids: set) -> bool:
    readers = {}
    for b in plan.boxes:
        for a in b.args:
            readers.setdefault(id(a), []).append(b)
    frontier = [box]
    while frontier:
        v = frontier.pop()
        for r in readers.get(id(v), []):
            if id(r) in online_ids:
                continue
            if r.op.kind != "map":
                return False
            frontier.append(r)
    stored = {id(v) for v in plan.stores}
    return id(box) not in stored


def visited(mask: tuple, q_range: tuple[int, int], x_range: tuple[int, int]) -> bool:
    """Does the tile of queries ``[q_lo, q_hi)`` × keys ``[x_lo, x_hi)`` hold any unmasked score?"""
    fn, params = mask
    q_lo, q_hi = q_range
    x_lo, x_hi = x_range
    if fn == "causal":
        return x_lo <= (q_hi - 1) + params[0]
    if fn == "sliding_window":
        window = params[0]
        return x_lo <= q_hi - 1 and (x_hi - 1) > q_lo - window
    return True


def _ranges(n: int, g: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + g, n)) for lo in range(0, n, g)]


def _visited_range(mask: tuple, q_range: tuple[int, int], nx: int, sx: int) -> tuple[int, int]:
    """(first, last) key chunk visited by the query tile ``q_range`` (last < first: none). The
    visited chunks of a causal or sliding-window mask are contiguous; the closed form is checked
    against :func:`visited` at its ends (and replaced by a scan where it disagrees)."""
    nch = -(-nx // sx)

    def vis(k: int) -> bool:
        return 0 <= k < nch and visited(mask, q_range, (k * sx, min((k + 1) * sx, nx)))

    fn, params = mask
    q_lo, q_hi = q_range
    # mask parameters are integers (napkin.diagrams.functions.IntParam): floor division stays exact
    if fn == "causal":
        lo, hi = 0, math.floor((q_hi - 1 + params[0]) // sx)
    elif fn == "sliding_window":
        lo, hi = math.floor((q_lo - params[0] + 1) // sx), (q_hi - 1) // sx
    else:
        lo, hi = 0, nch - 1
    lo, hi = max(lo, 0), min(hi, nch - 1)
    while hi >= lo and not vis(hi):   # the partial last chunk may fall outside a window
        hi -= 1
    if hi < lo:
        return 0, -1
    if vis(lo) and not vis(lo - 1) and not vis(hi + 1):
        return lo, hi
    ks = [k for k in range(nch) if vis(k)]  # pragma: no cover - a mask the closed form misreads
    return (ks[0], ks[-1]) if ks else (0, -1)


def visit_fractions(plan: KernelPlan, sizes: dict) -> tuple[float, float, float, float]:
    """Fractions of the dense kernel that a skipping kernel does: (steps, loads, warp loads, compute).

    ``steps``: visited (query tile, key chunk) pairs over all pairs; ``loads``: key elements
    loaded into SMEM, summed over query tiles, over the dense count (each chunk weighted by its
    length); ``warp loads``: the same with each query tile weighted by its number of per-warp
    (RF) tiles, for SMEM → register reads; ``compute``: the visited area (query rows × keys)
    over the dense area. All 1.0 without a skippable mask. One pass over the query tiles: the
    visited key chunks of a tile are a contiguous range.
    """
    m = skippable_mask(plan, sizes)
    if m is None:
        return 1.0, 1.0, 1.0, 1.0
    q_axis, x_axis, fn, params = m
    nq, nx = int(sizes[q_axis]), int(sizes[x_axis])
    gq = int(plan.groups.get(q_axis, nq))
    wq = int(plan.rf_groups.get(q_axis, gq))
    sx = int(plan.stream[1])
    nch = -(-nx // sx)
    last_len = nx - (nch - 1) * sx
    q_tiles = _ranges(nq, gq)
    pairs = loads = warp_loads = area = warps_total = 0
    for qt in q_tiles:
        rows = qt[1] - qt[0]
        warps = -(-rows // wq)
        warps_total += warps
        k0, k1 = _visited_range((fn, params), qt, nx, sx)
        if k1 < k0:
            continue
        count = k1 - k0 + 1
        keys = count * sx - ((sx - last_len) if k1 == nch - 1 else 0)
        pairs += count
        loads += keys
        warp_loads += warps * keys
        area += rows * keys
    # Exact fractions: the counts they scale must stay integers (the interpreter counts elements).
    return (Fraction(pairs, len(q_tiles) * nch), Fraction(loads, len(q_tiles) * nx),
            Fraction(warp_loads, warps_total * nx), Fraction(area, nq * nx))
