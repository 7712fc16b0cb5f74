"""The planner's third search order: regions a family finds in a whole diagram made consecutive.

Attention's backward inside a transformer block's backward is interleaved, in the diagram's two
other orders, with the producers of the cotangent dO (the whole MLP backward), so no run of
consecutive boxes held it and S, P and dS went through HBM. The families' region finders
(``regions``: the attention forward with its log-sum-exp, the attention backward) give the
planner the box sets to keep together; each is still analysed like any run.
"""

from __future__ import annotations

import pytest

from napkin.codegen import families
from napkin.codegen.planner import _consecutive, _convex, _grouped, _orders, _Planner, _regions, _unit_args, derive
from napkin.codegen.prepare import prepare
from napkin.codegen.select import resolve_gpu
from napkin.diagrams import library
from napkin.diagrams.grad import forward_with_saves, grad

SIZES = {"q": 512, "e": 256, "h": 2, "d": 64, "f": 512}
SAVE = {"N1", "N1_rstd", "Xn", "Qp", "O", "P_lse", "N2", "N2_rstd", "Xn2", "add"}


class _NoRegions:
    """A family without its region finder (what the planner had before)."""

    def __init__(self, fam):
        self._fam, self.name = fam, fam.name

    def __getattr__(self, item):
        if item == "regions":
            raise AttributeError(item)
        return getattr(self._fam, item)


def _block_backward():
    d = library.get("transformer_block").bind(**SIZES)
    return prepare(grad(d, None, SAVE), dtype="bf16")


def _plan(d, fams):
    p = _Planner(d, resolve_gpu("h100"), "sm_90a", "bf16", fams, None, None)
    return p.plan()[0]


def test_the_block_backward_runs_the_fused_attention_backward():
    b = _block_backward()
    fams = families.available()
    (region,) = _regions(b, fams)
    assert {"S", "P", "dP", "D", "dS", "dV", "dK", "dQp"} <= set(region)
    orders = _orders(b, fams)
    assert len(orders) == 3
    assert not any(_consecutive(o, region) for o in orders[:2])  # why the third order is needed
    assert _consecutive(orders[2], region)
    plan = _plan(b, fams)
    att = [k for k in plan.kernels if k.family == "attention_bwd"]
    assert len(att) == 1 and set(region) <= set(att[0].kernel.boxes)
    # without the region finders the same search keeps S, P and dS apart, and is predicted slower
    before = _plan(b, [_NoRegions(f) for f in fams])
    assert not any(k.family == "attention_bwd" for k in before.kernels)
    assert plan.seconds < before.seconds


def test_the_forward_fuses_attention_with_its_log_sum_exp():
    d = library.get("transformer_block").bind(**SIZES)
    f = prepare(forward_with_saves(d, SAVE), dtype="bf16")
    plan = derive(f, "h100", "bf16", explain=False).plan
    att = [k for k in plan.kernels if k.family == "attention"]
    assert len(att) == 1
    assert {"S", "P", "O", "P_lse"} <= set(att[0].kernel.boxes)


def test_orders_are_topological_and_regions_consecutive():
    b = _block_backward()
    fams = families.available()
    args = _unit_args(b, set(_orders(b)[0]))
    for order in _orders(b, fams):
        at = {n: i for i, n in enumerate(order)}
        assert sorted(order) == sorted(args)
        assert all(at[a] < at[n] for n, got in args.items() for a in got)


def test_a_region_already_consecutive_adds_no_order():
    d = prepare(library.get("transformer_block").bind(**SIZES), dtype="bf16")
    fams = families.available()
    assert _regions(d, fams) == [("S", "S_scaled", "S_masked", "P", "O")]
    assert len(_orders(d, fams)) == len(_orders(d))


def test_a_region_with_a_path_through_the_outside_is_not_convex():
    d = prepare(library.get("attention").bind(q=256, x=256, d=64), dtype="bf16")
    args = _unit_args(d, set(_orders(d)[0]))
    users: dict[str, set[str]] = {}
    for n, got in args.items():
        for a in got:
            users.setdefault(a, set()).add(n)
    assert _convex(set(args), users) and _convex({"P", "O"}, users)
    assert not _convex({"S", "O"}, users)  # S -> S_scaled -> P -> O leaves and comes back
    assert _grouped(d, _orders(d)[0], []) is None


@pytest.mark.parametrize("wrong", [{"dQp": "no"}, None])
def test_a_family_region_finder_that_fails_is_ignored(wrong):
    """A region finder raising a NapkinError (or finding nothing usable) leaves the orders as they were."""
    from napkin.errors import CodegenError

    class Broken:
        name = "broken"

        def regions(self, diagram):
            if wrong is None:
                raise CodegenError("no")
            return [tuple(wrong)]

    b = _block_backward()
    assert _regions(b, [Broken()]) == []
