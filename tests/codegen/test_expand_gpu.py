"""Softmax and norms over a strided axis, written out on the fast families, on a GPU: against the
float64 reference on fresh random inputs, NaN-poisoned outputs, sizes that are not multiples of
any tile (the tolerance is verify's: 1e-2 relative for bf16 and fp16, 1e-5 for fp32)."""

from __future__ import annotations

import pytest

from napkin.codegen import compile as napkin_compile
from napkin.perfmodel.plan import FALLBACK

from test_expand_plan import middle_layernorm, middle_rmsnorm, outer_softmax
from test_pointwise_gpu import check

pytestmark = pytest.mark.gpu

SHAPES = [
    (outer_softmax, [{"a": 4096, "b": 4096}, {"a": 1000, "b": 77}, {"a": 3, "b": 1}]),
    (middle_rmsnorm, [{"a": 64, "b": 512, "c": 256}, {"a": 5, "b": 99, "c": 33}]),
    (middle_layernorm, [{"a": 16, "b": 300, "c": 1000}, {"a": 2, "b": 7, "c": 3}]),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("build_diagram, shapes", SHAPES, ids=[f.__name__ for f, _ in SHAPES])
def test_written_out_rows_verify(build_diagram, shapes, dtype):
    for i, sizes in enumerate(shapes):
        cd = napkin_compile(build_diagram(), sizes=sizes, dtype=dtype)
        if cd.plan.expanded:
            assert FALLBACK not in cd.plan.families
        check(cd, seed=i)


def _einsum(name):
    from napkin.diagrams import Diagram
    from napkin_test_support import einsum_cases

    return lambda: Diagram(name, einsum_cases()[name].named("Y"))


def _scalar_shared():
    from napkin.diagrams import Diagram, array, axes, contract, scale, softmax

    a, b, k, n = axes("a b k n")
    ts = scale(array("t"), 0.5, name="ts")
    return Diagram("scalar_shared", ((contract(array("A", a, k), array("B", k, n), over=k, out=(a, n)) * ts)
                                     .named("Y1"), softmax(array("X", a, b) * ts, b, name="Y2")))


EINSUMS = [
    (_einsum("three"), [{"i": 1000, "k": 520, "n": 776}, {"i": 7, "k": 16, "n": 9}]),
    (_einsum("one_perm"), [{"z": 6, "i": 1000, "k": 77}]),
    (_einsum("quad"), [{"i": 4097, "j": 1001}]),
    (_einsum("chain"), [{"z": 3, "i": 200, "k": 64, "n": 96, "j": 72}]),
    (_scalar_shared, [{"a": 512, "b": 333, "k": 256, "n": 384}]),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("build_diagram, shapes", EINSUMS, ids=["three", "one_perm", "quad", "chain", "scalar_shared"])
def test_written_out_contractions_and_scalars_verify(build_diagram, shapes, dtype):
    """An einsum of one or three operands and a scalar read by two kernels: written out, on the fast
    families, checked like the rows above."""
    for i, sizes in enumerate(shapes):
        cd = napkin_compile(build_diagram(), sizes=sizes, dtype=dtype)
        assert cd.plan.expanded and FALLBACK not in cd.plan.families, cd.plan.summary()
        check(cd, seed=i)
