"""Reductions over several axes: the builder's chain, its reference, and its plan (one kernel)."""

import pytest
import torch

from napkin.codegen.planner import derive
from napkin.diagrams import Diagram, array, axes, max_over, mean_over, min_over, reduce, sum_over
from napkin.errors import DiagramError

a, b, c = axes("a b c")
SIZES = {"a": 6, "b": 5, "c": 7}


@pytest.mark.parametrize("build, how, dims", [
    (sum_over, "sum", (0, 2)),
    (mean_over, "mean", (0, 1)),
    (max_over, "max", (1, 2)),
    (min_over, "min", (0, 1, 2)),
])
def test_reduction_over_several_axes_matches_torch(build, how, dims):
    names = [("a", "b", "c")[i] for i in dims]
    d = Diagram("r", build(array("X", a, b, c), names, name="Y")).bind(**SIZES)
    x = torch.randn(6, 5, 7, dtype=torch.float64)
    got = d.reference({"X": x})["Y"]
    want = {"sum": lambda: x.sum(dims), "mean": lambda: x.mean(dims), "max": lambda: x.amax(dims), "min": lambda: x.amin(dims)}[how]()
    torch.testing.assert_close(got, want)


def test_the_chain_is_named_by_its_last_box_and_plans_as_one_kernel():
    y = reduce(array("X", a, b, c), [c, a], "sum", name="Y")
    assert y.axis_names == ("b",)
    assert y.name == "Y"
    der = derive(Diagram("r", y), "h100", "bf16", sizes={"a": 64, "b": 512, "c": 1024})
    assert len(der.plan.kernels) == 1
    assert der.plan.families == ("pointwise",)


@pytest.mark.parametrize("over, message", [
    ((), "over no axes"),
    ((a, a), "appears twice"),
    ((a, "z"), "has no axis 'z'"),
    ([a, 3], "expected an axis"),
])
def test_bad_axis_lists_are_one_clear_error(over, message):
    with pytest.raises(DiagramError, match=message):
        sum_over(array("X", a, b, c), over)
