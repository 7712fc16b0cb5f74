#!/usr/bin/env python3
"""A/B of how a softmax or layernorm over a strided axis is written out (``napkin.diagrams.expand``):
the output recomputing ``exp(x − m)`` / ``x − μ`` from ``x`` (the package's expansion) against the
expansion before cd5e5ca, which read them back from the array its reduction kernel wrote to HBM.
Both are planned, checked against the float64 reference and timed in the same process (CUDA
events, L2 flushed, median of 50), one JSON line per case::

    PYTHONPATH=. python3 benchmarks/expand_recompute_ab.py > ab.jsonl

Results: ``benchmarks/results/nvidia-h100-80gb-hbm3/expand_recompute_ab.jsonl`` (the same cases and
steps, run from a scratch copy of this script on the tree of cd5e5ca).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def passed_through(op, x, name, used):
    """The expansion before cd5e5ca: the output reads ``exp(x − m)`` / ``x − μ`` as computed for
    the statistic (a U-sized array between the reduction kernel and the output's)."""
    import napkin.diagrams.expand as ex
    from napkin.diagrams.ops import Softmax, exp, map_fn, max_over, mean_over, rsqrt, square, sum_over

    def n(part):
        return ex._fresh(f"{name}_{part}", used)

    a = op.over
    if isinstance(op, Softmax):
        m = max_over(x, a, name=n("max"))
        e = exp(map_fn("sub", x, m, name=n("shifted")), name=n("exp"))
        return map_fn("div", e, sum_over(e, a, name=n("sum")), name=name)
    c = map_fn("sub", x, mean_over(x, a, name=n("mean")), name=n("centred"))
    var = mean_over(square(c, name=n("square")), a, name=n("var"))
    r = rsqrt(map_fn("shift", var, params=(op.eps,), name=n("eps")), name=n("rstd"))
    return map_fn("mul", c, r, name=name)


def middle_layernorm():
    import napkin.diagrams as nd

    a, b, c = nd.axes("a b c")
    return nd.Diagram("middle_layernorm", nd.layernorm(nd.array("X", a, b, c), b, name="Y"))


def main() -> None:
    os.environ.setdefault("NAPKIN_CACHE_DIR", tempfile.mkdtemp())  # no plan of the other expansion read back
    import torch

    import napkin.codegen.plancache as plancache
    import napkin.diagrams.expand as ex
    import operator_survey as survey
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.reference import random_inputs

    recompute = ex._written_out
    cases = [(survey.softmax_first_axis, dict(a=4096, b=4096), "bf16"),
             (survey.softmax_first_axis, dict(a=4096, b=4096), "fp32"),
             (survey.softmax_first_axis, dict(a=16384, b=4096), "bf16"),
             (middle_layernorm, dict(a=16, b=300, c=1000), "bf16"),
             (middle_layernorm, dict(a=16, b=64, c=65536), "fp32")]
    for build, sizes, dtype in cases:
        row = {"case": build.__name__, "sizes": sizes, "dtype": dtype}
        for tag, how in (("old", passed_through), ("new", recompute)):
            ex._written_out = how
            plancache._memory.clear()  # each expansion planned afresh
            try:
                cd = napkin_compile(build(), sizes=sizes, dtype=dtype)
            finally:
                ex._written_out = recompute
            ins = random_inputs(cd.diagram, device="cuda", seed=1)
            row[tag] = checked_timing(cd, ins)
        print(json.dumps(row), flush=True)


def checked_timing(cd, ins: dict) -> dict:
    """Run compiled diagram ``cd`` on ``ins`` into NaN-poisoned outputs, check its first output
    against the float64 reference (relative error) and time it (CUDA events, L2 flushed, median of
    50) called with positional tensors (keyword arguments take the checked path, whose host time
    can exceed the flush's and show as GPU idle time): its time, error, kernels and predicted time."""
    import torch

    from napkin.bench.timing import time_fn

    d = cd.diagram
    out = cd(**ins, out=cd.empty_outputs("cuda", float("nan")))
    out = out[0] if isinstance(out, tuple) else out
    ref = d.reference({k: v.double() for k, v in ins.items()}, dtype=torch.float64)[cd.output_names[0]]
    err = float((out.double() - ref).norm() / ref.norm())
    args = [ins[n] for n in cd.input_names]  # positional: the call's fast path, as a user's loop runs it
    t = time_fn(lambda: cd(*args), reps=50)
    return dict(us=round(t.median_s * 1e6, 1), err=err, kernels=len(cd.plan.kernels),
                predicted_us=round(cd.plan.seconds * 1e6, 1), plan=[list(k.kernel.boxes) for k in cd.plan.kernels])


if __name__ == "__main__":
    main()
