"""Skipping fully masked tiles: why causal attention costs half.

When a kernel streams the key axis ``x`` into an online softmax and the scores pass
a causal or sliding-window mask on the way, a (query tile, key chunk) pair whose
every score is masked contributes exp(−∞) = 0 to the softmax and nothing to the
output. The kernel skips such pairs: it neither loads their K and V chunks nor
computes on them. The cost model and the CPU interpreter both count only the
visited pairs, so a causal kernel moves and computes about half of a dense one.

>>> visited(("causal", (0.0,)), (0, 64), (64, 128))
False
>>> visited(("causal", (0.0,)), (64, 128), (0, 64))
True
"""

from __future__ import annotations

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


def visit_fractions(plan: KernelPlan, sizes: dict) -> tuple[float, float, float, float]:
    """Fractions of the dense kernel that a skipping kernel does: (steps, loads, warp loads, compute).

    ``steps``: visited (query tile, key chunk) pairs over all pairs; ``loads``: key elements
    loaded into SMEM, summed over query tiles, over the dense count (each chunk weighted by its
    length); ``warp loads``: the same with each query tile weighted by its number of per-warp
    (RF) tiles, for SMEM → register reads; ``compute``: the visited area (query rows × keys)
    over the dense area. All 1.0 without a skippable mask.
    """
    m = skippable_mask(plan, sizes)
    if m is None:
        return 1.0, 1.0, 1.0, 1.0
    q_axis, x_axis, fn, params = m
    nq, nx = int(sizes[q_axis]), int(sizes[x_axis])
    gq = int(plan.groups.get(q_axis, nq))
    wq = int(plan.rf_groups.get(q_axis, gq))
    sx = int(plan.stream[1])
    q_tiles, x_chunks = _ranges(nq, gq), _ranges(nx, sx)
    pairs = loads = warp_loads = area = warps_total = 0
    for qt in q_tiles:
        warps = -(-(qt[1] - qt[0]) // wq)
        warps_total += warps
        for xc in x_chunks:
            if visited((fn, params), qt, xc):
                pairs += 1
                loads += xc[1] - xc[0]
                warp_loads += warps * (xc[1] - xc[0])
                area += (qt[1] - qt[0]) * (xc[1] - xc[0])
    # Exact fractions: the counts they scale must stay integers (the interpreter counts elements).
    return (Fraction(pairs, len(q_tiles) * len(x_chunks)), Fraction(loads, len(q_tiles) * nx),
            Fraction(warp_loads, warps_total * nx), Fraction(area, nq * nx))
