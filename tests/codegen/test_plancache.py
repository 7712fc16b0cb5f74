"""The plan cache reads every kind of plan back from disk: a plan that writes boxes out
(``Plan.expanded``) and one that runs axes as one (``Plan.folds``) as well as a plain one. An
expanded plan used to be planned again in every process (its diagram, written out, never equalled
the caller's)."""

from __future__ import annotations

import tempfile

import pytest

from napkin.codegen.plancache import _memory, derive_cached
from napkin.codegen.prepare import prepare
from napkin.diagrams import Diagram, array, axes, contract, softmax
from napkin.kernels.cache import KernelCache


def _outer_softmax():
    a, b = axes("a b")
    return Diagram("outer_softmax", softmax(array("X", a, b), a, name="Y")), dict(a=64, b=32)


def _linear3d():
    b, s, e, f = axes("b s e f")
    return (Diagram("linear3d", contract(array("X", b, s, e), array("W", f, e), over=e, out=(b, s, f), name="Y")),
            dict(b=256, s=50, e=768, f=3072))


@pytest.mark.parametrize("build, kind", [(_outer_softmax, "expanded"), (_linear3d, "folds")])
def test_every_kind_of_plan_reads_back_from_disk(build, kind):
    diagram, sizes = build()
    d = prepare(diagram, sizes=sizes)
    disk = KernelCache(tempfile.mkdtemp())
    first = derive_cached(d, "h100", arch="sm_90a", cache=disk)
    assert getattr(first, kind), first.summary()
    _memory.clear()
    again = derive_cached(d, "h100", arch="sm_90a", cache=disk)
    assert again == first and again.interface == first.interface
    assert (disk.stats.misses, disk.stats.hits) == (1, 1)
