#!/usr/bin/env python3
"""Problems with more items than a launch's grid.y holds (65535): attention over many heads x batch
(window attention, a large decode batch without GQA) and batched products with a large batch.
Each point: the planner's plan on the GPU at hand (its kernels' families and grids), its output
checked against the diagram's float64 reference, and its time beside the PyTorch reference run
eagerly (CUDA events, L2 flushed, median: :mod:`napkin.bench.timing`).

    PYTHONPATH=<tree> python3 benchmarks/grid_fold.py [--out FILE]

Run from an older tree it shows what those problems planned before (the scalar fallback).
"""

from __future__ import annotations

import argparse
import json
import sys

POINTS = [
    # (label, library diagram, woven batch axis or None, sizes, dtype)
    ("window attention 2049 x 32 heads, 64 x 64, d=64", "mha", "b", dict(b=2049, h=32, q=64, x=64, d=64), "bf16"),
    ("causal 2049 x 32 heads, q=x=128, d=64", "attention_causal", "b", dict(b=2049, h=32, q=128, x=128, d=64), "bf16"),
    ("decode q=1, 2100 x 32 heads, x=128, d=128", "mha", "b", dict(b=2100, h=32, q=1, x=128, d=128), "bf16"),
    ("batched 70000 x (40 x 72 . 72 x 24) bf16", "batched_matmul", None, dict(n=70000, a=40, b=72, c=24), "bf16"),
    ("batched 70000 x (40 x 72 . 72 x 24) fp32", "batched_matmul", None, dict(n=70000, a=40, b=72, c=24), "fp32"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams import Axis, library
    from napkin.dtypes import torch_dtype

    rows = []
    for label, name, weave, sizes, dtype in POINTS:
        rec = dict(point=label, sizes=sizes, dtype=dtype, gpu=torch.cuda.get_device_name())
        try:
            d = library.get(name)
            if weave:
                d = d.weave(Axis(weave), name=f"{name}_{weave}")
            bound = d.with_dtype(dtype).bind(**sizes)
            cd = napkin_compile(bound)
            rec["kernels"] = [dict(family=k.family, engine=k.kernel.options.engine) for k in cd.plan.kernels]
            rec["grids"] = [list(L.grid) for L in cd.launches]
            gen = torch.Generator(device="cuda").manual_seed(0)
            xs = [torch.randn([ax.bound_size for ax in v.axes], generator=gen, device="cuda").to(torch_dtype(dtype))
                  for v in bound.inputs]
            got = cd(*xs)
            got = got[0] if isinstance(got, tuple) else got
            ref = bound.reference({v.name: x.double() for v, x in zip(bound.inputs, xs)}, dtype=torch.float64)
            want = ref[bound.output_names[0]]
            rec["rel_err"] = float((got.double() - want).norm() / want.norm())
            rec["napkin_us"] = time_fn(lambda: cd(*xs), reps=20, warmup=3, max_time_s=20).median_s * 1e6
            feed = {v.name: x for v, x in zip(bound.inputs, xs)}
            rec["eager_us"] = time_fn(lambda: bound.reference(feed), reps=20, warmup=3, max_time_s=20).median_s * 1e6
            rec["x_eager"] = rec["eager_us"] / rec["napkin_us"]
        except Exception as e:  # noqa: BLE001 - reported, the other points still run
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
