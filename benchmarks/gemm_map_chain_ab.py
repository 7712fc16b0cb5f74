#!/usr/bin/env python3
"""A GEMM, a chain of maps, then a sum along each row: the row reduction in the GEMM's epilogue
(the split kernel and its combine) against the GEMM and a row kernel apart, both plans timed.

    PYTHONPATH=. python3 benchmarks/gemm_map_chain_ab.py [--maps sigmoid,tanh,exp] \\
        [--sizes 8192x1024x1024,8192x256x1024] [--profiles h100,h200] [--out $OUT/chain.jsonl]

Y[a] = Σ_c maps(Σ_b A[a, b] · B[c, b]) in bf16, a size being ``AxBxC``. Each profile's planner
gives its plan with the reduction in the GEMM where it ranks so, and the plan with it kept out
(the contraction family told to refuse row reductions); each runs on random inputs, timed by the
torch profiler (its kernels, the median of 20 calls) and by CUDA events with L2 flushed (the
call), beside the model's price. One JSON line a size and profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def gemm_map_sum(maps: list[str]):
    """Y[a] = Σ_c maps(A·Bᵀ)[a, c]."""
    from napkin.diagrams import Axis, Diagram, array, contract
    from napkin.diagrams.ops import map_fn, sum_over

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    x = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    for i, fn in enumerate(maps):
        x = map_fn(fn, x, name=f"m{i}")
    return Diagram("gemm_map_sum", sum_over(x, c, name="Y"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", default="sigmoid,tanh,exp")
    ap.add_argument("--sizes", default="8192x1024x1024,8192x256x1024")
    ap.add_argument("--profiles", default="h100,h200")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    try:
        sizes = [tuple(int(v) for v in s.lower().split("x")) for s in a.sizes.split(",") if s.strip()]
        if any(len(s) != 3 for s in sizes):
            raise ValueError
    except ValueError:
        print(f"error: --sizes {a.sizes!r}: expected AxBxC[,AxBxC...], integers", file=sys.stderr)
        return 2
    import torch

    from napkin.bench.timing import kernel_times, time_fn
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen.families.contraction import ContractionFamily
    from napkin.codegen.planner import derive

    maps = [m.strip() for m in a.maps.split(",") if m.strip()]
    rows = []
    for m, k, n in sizes:
        d = gemm_map_sum(maps).with_dtype("bf16").bind(a=m, b=k, c=n)
        A = torch.randn(m, k, device="cuda").bfloat16()
        B = torch.randn(n, k, device="cuda").bfloat16()
        for prof in (p.strip() for p in a.profiles.split(",") if p.strip()):
            planned = derive(d, gpu=prof, explain=False).plan
            keep = ContractionFamily.rowred_reason
            ContractionFamily.rowred_reason = lambda *args, **kw: "kept apart for the comparison"
            try:
                apart = derive(d, gpu=prof, explain=False).plan
            finally:
                ContractionFamily.rowred_reason = keep
            row = dict(device=torch.cuda.get_device_name(), sizes=dict(a=m, b=k, c=n), maps=maps, profile=prof)
            for tag, plan in (("planned", planned), ("apart", apart)):
                c = compile_diagram(d, plan=plan)
                kt = kernel_times(lambda: c(A, B))
                call = time_fn(lambda: c(A, B), warmup=3, reps=30, max_time_s=1.0).median_s * 1e6
                row[tag] = dict(kernels=kt, kernel_us=sum(kt.values()), call_us=call, predicted_us=plan.seconds * 1e6)
            print(f"{m}x{k}x{n} {prof}: planned {row['planned']['kernel_us']:.1f} us "
                  f"({', '.join(row['planned']['kernels'])}), apart {row['apart']['kernel_us']:.1f}", flush=True)
            rows.append(row)
    if a.out:  # one JSON line a size and profile, appended
        with open(a.out, "a") as sink:
            sink.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
