#!/usr/bin/env python3
"""Every cluster configuration of a long row-wise row, and the family's own candidates, each timed.

The row-wise family shares a streamed row whose re-read inputs no block keeps over the blocks of
a thread-block cluster (``KernelOptions.cluster``, Hopper) and offers one such configuration
(``rowwise.cluster_config``). This script times every variant (clusters of ``--sizes`` blocks of
256-1024 threads, at most 2048 threads a row, four chunks a step) beside the family's candidates
for that row, each as a hand-written schedule: CUDA events, L2 flushed, the median of 30 calls over
three input sets (:func:`napkin.bench.timing.time_fn`), the share of the copy rate over the
minimal bytes, and the blocks an SM holds by the GPU profile's occupancy rules. The variants are
not filtered by the family's register check, so those it refuses may spill::

    PYTHONPATH=. python3 benchmarks/cluster_candidates.py --points log_softmax:bf16:2048x128256 \\
        [--sizes 2,4,8] [--out candidates.jsonl]

Operators: ``log_softmax``, ``softmax`` (written out: max, exp, sum, divide), ``cross_entropy``
(against soft targets) and ``softmax_vjp`` (dX = P * (dP - sum(P * dP)), given P).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _diagram(op: str):
    import napkin.diagrams as nd

    a, b = nd.axes("a b")
    X = nd.array("X", a, b)
    if op == "log_softmax":
        return nd.Diagram("log_softmax", (X - nd.logsumexp(X, b)).named("Y"))
    if op == "softmax":
        m = nd.max_over(X, b, name="m")
        s = nd.sum_over(nd.exp(X - m, name="E_sum"), b, name="s")
        return nd.Diagram("softmax", (nd.exp(X - m, name="E") / s).named("P"))
    if op == "cross_entropy":
        T = nd.array("T", a, b)
        return nd.Diagram("cross_entropy", nd.scale(nd.sum_over(T * (X - nd.logsumexp(X, b)), b), -1.0, name="L"))
    if op == "softmax_vjp":
        P, dP = nd.array("P", a, b), nd.array("dP", a, b)
        return nd.Diagram("softmax_vjp", (P * (dP - nd.sum_over(P * dP, b))).named("dX"))
    raise SystemExit(f"unknown operator {op!r}: log_softmax, softmax, cross_entropy or softmax_vjp")


def _point(text: str) -> tuple[str, str, int, int]:
    try:
        op, dtype, shape = text.split(":")
        rows, width = (int(v) for v in shape.split("x"))
    except ValueError:
        raise SystemExit(f"--points takes OP:DTYPE:ROWSxWIDTH, got {text!r}") from None
    return op, dtype, rows, width


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", required=True, help="OP:DTYPE:ROWSxWIDTH, comma-separated")
    ap.add_argument("--sizes", default="2,4,8", help="cluster sizes to time (blocks a row)")
    ap.add_argument("--gpu", default="h200", help="the profile the family plans on")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch

    from napkin.bench.timing import copy_bandwidth, time_fn
    from napkin.codegen.api import compile
    from napkin.codegen.families import rowwise
    from napkin.codegen.prepare import prepare
    from napkin.codegen.select import resolve_gpu
    from napkin.diagrams.reference import random_inputs

    gpu = resolve_gpu(a.gpu)
    per_sm = rowwise._per_sm(gpu)
    copy = copy_bandwidth()
    out = open(a.out, "w") if a.out else None
    for op, dtype, rows, width in (_point(p) for p in a.points.split(",")):
        d = prepare(_diagram(op), sizes=dict(a=rows, b=width), dtype=dtype)
        shape = rowwise.analyse(d)
        scheds = [("family", s) for s in rowwise.FAMILY.candidates(d, a.gpu, dtype)]
        for size in (int(v) for v in a.sizes.split(",")):
            for block in rowwise.STREAM_THREADS:
                try:
                    cfg = rowwise.make_chain_config(shape, block * size, 1, 4, row_in_smem=True, cluster=size,
                                                    smem_budget=rowwise.row_smem_budget(gpu))
                except Exception:  # noqa: BLE001 - a variant the family cannot build: not timed
                    continue
                scheds.append((f"c{size}x{block}", rowwise.chain_schedule_for(shape, cfg, a.gpu)))
        sets = [random_inputs(d, device="cuda", seed=i) for i in range(3)]
        for tag, sch in scheds:
            rec = dict(op=op, dtype=dtype, rows=rows, width=width, tag=tag, options=sch.kernels[0].options.to_dict())
            try:
                c = compile(_diagram(op), sizes=dict(a=rows, b=width), dtype=dtype, schedule=sch)
                args = [tuple(e[n] for n in c.input_names) for e in sets]
                got = c(*args[0])
                got = got if isinstance(got, tuple) else (got,)
                nbytes = sum(sets[0][n].numel() * sets[0][n].element_size() for n in c.input_names)
                nbytes += sum(o.numel() * o.element_size() for o in got)
                rec["us"] = time_fn(lambda *x: c(*x), warmup=5, reps=30, rotate=args).median_s * 1e6
                rec["copy"] = nbytes / (rec["us"] * 1e-6) / copy
                cfg = rowwise.chain_config_from_schedule(shape, sch)
                rec["held"] = per_sm(cfg.threads, rowwise.chain_regs_estimate(shape, cfg),
                                     rowwise.chain_smem_bytes(shape, cfg))
                rec["pred_us"] = c.plan.seconds * 1e6
            except Exception as e:  # noqa: BLE001 - reported, the other variants still run
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            o = rec["options"]
            print(f"{op:13s} {dtype} {rows}x{width} {tag:9s} threads_per_row={o.get('threads_per_row')} "
                  f"warps={o.get('warps')} cluster={o.get('cluster')} kept={o.get('row_in_smem')} "
                  f"blocks/SM={rec.get('held')} " + (f"{rec['us']:8.1f} us {rec['copy']:4.0%} model {rec['pred_us']:.1f}"
                                                     if "us" in rec else rec.get("error", "")), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
        del sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
