#!/usr/bin/env python3
"""Split sums across K: which (tile, splits) of the wgmma template's split sum runs fastest where the
output is small and the sum long, and how each one's time grows with K.

C[a, n] = Σ_k A[a, k] B[k, n] (the survey's ``huge_k``, bf16, B stored (k, n)) at a = n = 256 and
512, K = 32768 … 262144. For each point, each fixed (block rows, block columns, splits) of
:data:`TILES` the planner offers is built as its own schedule (``napkin.codegen.compile(schedule=)``),
checked against the float64 product (relative error), and its kernels timed by the torch profiler
with L2 flushed before each call (:func:`napkin.bench.timing.kernel_times`: the split kernel's and
the combining launch's device time, median of 20 calls), beside cuBLAS (``A @ B``) and a plain
``sum`` of A and of B (torch's reduction: what one streaming read of the operands costs).

Reading it: the slope of a configuration's main kernel over K is its streaming rate; what is left
at K = 0 is its fixed cost (the ring's fill, the partial tiles written after the loop). One JSON
line per point::

    PYTHONPATH=. python3 benchmarks/split_sum_scan.py split_sum_scan.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (block rows, block columns, splits) timed where the planner offers them
TILES = ((128, 128, 33), (64, 128, 16), (128, 64, 16), (128, 128, 16), (64, 128, 33), (64, 64, 16), (64, 64, 33))
SIDES = (256, 512)
KS = (32768, 65536, 131072, 262144)


def _tile(kernel) -> tuple:
    """(block rows, block columns, splits) of a contraction kernel of ``huge_k``."""
    groups = {r.axis: int(r.size) for r in kernel.relabels if r.kind == "group" and r.level == "SMEM"}
    return groups.get("a"), groups.get("n"), kernel.options.splits or 1


def main() -> int:
    import torch

    from napkin.bench.timing import CudaEventBackend, kernel_times
    from napkin.cli_common import load
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen import select
    from napkin.codegen.families import get as get_family

    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    fam, gpu = get_family("contraction"), select.resolve_gpu("h200")
    flush = CudaEventBackend().flush
    for mn in SIDES:
        for K in KS:
            d = load(str(ROOT / "benchmarks/operator_survey.py") + ":huge_k").with_dtype("bf16").bind(a=mn, k=K, n=mn)
            A = torch.randn(mn, K, device="cuda", dtype=torch.bfloat16)
            B = torch.randn(K, mn, device="cuda", dtype=torch.bfloat16)
            row = {"device": torch.cuda.get_device_name(), "mn": mn, "K": K,
                   "cublas": kernel_times(lambda: A @ B, flush=flush),
                   "read_sum": kernel_times(lambda: (A.sum(), B.sum()), flush=flush)}
            ref = A.double() @ B.double()
            seen = set()
            for r in select.rank(d, fam, gpu, "bf16"):
                k = r.schedule.kernels[0]
                key = _tile(k)
                if key not in TILES or key in seen or k.options.engine != "wgmma":
                    continue
                seen.add(key)
                try:
                    c = compile_diagram(d, schedule=r.schedule)
                    got = c(A, B)
                    row[str(key)] = dict(pred_us=r.seconds * 1e6, stages=k.options.stages,
                                         err=float((got.double() - ref).norm() / ref.norm()),
                                         kernels=kernel_times(lambda: c(A, B), flush=flush))
                except Exception as e:  # noqa: BLE001 - a configuration that fails is reported
                    row[str(key)] = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
