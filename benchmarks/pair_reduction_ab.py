#!/usr/bin/env python3
"""A/B of the pointwise family's pair reduction: the max of x and the sum of exp(x − max) over the
same axes in one pass (``PairSum``: the sum rescaled as the running max grows), against the plans
without it (the max in one kernel, the sum of exp in the next, each reading x). Softmax and
logsumexp over a non-innermost axis, as users write them (``torch.softmax(x, dim=0)``,
``torch.logsumexp(x, dim=1)`` of a 3-d tensor): both plans are made, checked against the float64
reference and timed in the same process (CUDA events, L2 flushed, median of 50), beside eager
PyTorch and the measured copy rate. One JSON line per case::

    PYTHONPATH=. python3 benchmarks/pair_reduction_ab.py > pair_ab.jsonl

``copy_pct`` is the fraction of the copy rate the minimal bytes reach (x read once, each output
written once) in the new plan's time.
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


def softmax_outer():
    import napkin.diagrams as nd

    a, b = nd.axes("a b")
    return nd.Diagram("softmax_outer", nd.softmax(nd.array("X", a, b), a, name="Y"))


def softmax_middle():
    import napkin.diagrams as nd

    a, b, c = nd.axes("a b c")
    return nd.Diagram("softmax_middle", nd.softmax(nd.array("X", a, b, c), b, name="Y"))


def logsumexp_outer():
    import napkin.diagrams as nd

    a, b = nd.axes("a b")
    return nd.Diagram("logsumexp_outer", nd.logsumexp(nd.array("X", a, b), a, name="Y"))


def logsumexp_middle():
    import napkin.diagrams as nd

    a, b, c = nd.axes("a b c")
    return nd.Diagram("logsumexp_middle", nd.logsumexp(nd.array("X", a, b, c), b, name="Y"))


def eager(build):
    import torch

    dims = {"softmax_outer": 0, "softmax_middle": 1, "logsumexp_outer": 0, "logsumexp_middle": 1}
    dim = dims[build.__name__]
    if build.__name__.startswith("softmax"):
        return lambda X: torch.softmax(X, dim=dim)
    return lambda X: torch.logsumexp(X, dim=dim)


CASES = [
    (softmax_outer, dict(a=4096, b=4096), "bf16"),
    (softmax_outer, dict(a=4096, b=4096), "fp32"),
    (softmax_outer, dict(a=16384, b=4096), "bf16"),
    (softmax_middle, dict(a=16, b=300, c=1000), "bf16"),
    (logsumexp_outer, dict(a=4096, b=4096), "bf16"),
    (logsumexp_outer, dict(a=4096, b=4096), "fp32"),
    (logsumexp_middle, dict(a=16, b=64, c=65536), "bf16"),
]


def main() -> None:
    caches = {tag: tempfile.mkdtemp(prefix=f"napkin-{tag}-") for tag in ("old", "new")}
    import torch

    import napkin.codegen.families.pointwise as pw
    import napkin.codegen.plancache as plancache
    from expand_recompute_ab import checked_timing
    from napkin.bench.timing import copy_bandwidth, time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.reference import random_inputs

    copy = copy_bandwidth()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_gbps": round(copy / 1e9, 1)}), flush=True)
    pair_of = pw._pair_of
    for build, sizes, dtype in CASES:
        row = {"case": build.__name__, "sizes": sizes, "dtype": dtype}
        ins = None
        for tag in ("old", "new"):
            if tag == "old":  # the family without the pair: the max and the sum of exp apart
                pw._pair_of = lambda *a, **k: None
            os.environ["NAPKIN_CACHE_DIR"] = caches[tag]  # no plan of the other variant read back
            plancache._memory.clear()
            try:
                cd = napkin_compile(build(), sizes=sizes, dtype=dtype)
            finally:
                pw._pair_of = pair_of
            ins = ins or random_inputs(cd.diagram, device="cuda", seed=1)
            row[tag] = checked_timing(cd, ins)
        X = ins["X"]
        out = cd.empty_outputs("cuda")[cd.output_names[0]]
        f = eager(build)
        row["eager_us"] = round(time_fn(lambda: f(X), reps=50).median_s * 1e6, 1)
        nbytes = X.numel() * X.element_size() + out.numel() * out.element_size()
        row["copy_pct"] = round(100 * nbytes / (row["new"]["us"] * 1e-6) / copy, 1)
        row["new_x_eager"] = round(row["eager_us"] / row["new"]["us"], 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
