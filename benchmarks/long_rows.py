#!/usr/bin/env python3
"""Row-wise operators over rows of vocabulary size (32k-152k values) against PyTorch eager.

A language model's head ends in a softmax, log-softmax, logsumexp or cross-entropy over its
vocabulary: rows of 32000, 50257, 65536, 100277, 128256 or 151936 values, often not a whole number
of 16-byte vectors, and longer than a thread block holds in registers (the row-wise family streams
them: ``KernelOptions.streamed``, and keeps what several passes read in shared memory where it
fits: ``row_in_smem``, or over the blocks of a cluster: ``cluster``). Each point is napkin's
plan (as ``derive`` picks it) and the same operator in PyTorch, both timed with
:func:`napkin.bench.timing.time_fn` (CUDA events, L2 flushed, three input sets in turn, median), napkin's outputs checked against the float64 reference (relative error),
and the share of the copy rate over the minimal bytes (every input read once, every output
written once)::

    PYTHONPATH=. python3 benchmarks/long_rows.py [--out long_rows.jsonl] [--only softmax,lse] \\
        [--points 4096x50257,2048x128256] [--dtypes bf16,fp32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (rows, row length): vocabularies of 32000 (Llama 2), 32001, 50257 (GPT-2), 65536, 100277
#: (cl100k), 128256 (Llama 3), 151936 (Qwen).
POINTS = ((8192, 32000), (8192, 32001), (4096, 50257), (4096, 65536), (4096, 100277), (2048, 128256),
          (2048, 151936))


def _diagram(op: str):
    import napkin.diagrams as nd

    a, b = nd.axes("a b")
    X = nd.array("X", a, b)
    if op == "softmax":
        return nd.Diagram("softmax", nd.softmax(X, b, name="P"))
    if op == "log_softmax":
        return nd.Diagram("log_softmax", (X - nd.logsumexp(X, b)).named("Y"))
    if op == "logsumexp":
        return nd.Diagram("logsumexp", nd.logsumexp(X, b, name="L"))
    if op == "softmax_backward":  # given the forward's P, as torch's backward takes it
        return nd.Diagram("softmax", nd.softmax(X, b, name="P")).grad(save={"P"})
    if op == "cross_entropy":  # against soft targets T: -sum_b T * log_softmax(X)
        T = nd.array("T", a, b)
        return nd.Diagram("cross_entropy", nd.scale(nd.sum_over(T * (X - nd.logsumexp(X, b)), b), -1.0, name="L"))
    raise ValueError(f"unknown operator {op!r}")


#: The inputs each PyTorch operator takes, in order (X alone where not named).
TORCH_ARGS = {"softmax_backward": ("X", "dP", "P"), "cross_entropy": ("X", "T")}


def _torch(op: str):
    import torch

    return {"softmax": lambda X: torch.softmax(X, -1),
            "log_softmax": lambda X: torch.log_softmax(X, -1),
            "logsumexp": lambda X: torch.logsumexp(X, -1),
            "softmax_backward": lambda X, dP, P: torch._softmax_backward_data(dP, P, -1, P.dtype),
            "cross_entropy": lambda X, T: -(T * torch.log_softmax(X, -1)).sum(-1)}[op]


def point(op: str, rows: int, width: int, dtype: str, copy_bps: float) -> dict:
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen.api import compile
    from napkin.dtypes import torch_dtype

    rec = dict(op=op, rows=rows, width=width, dtype=dtype)
    d = _diagram(op)
    try:
        cd = compile(d, sizes=dict(a=rows, b=width), dtype=dtype)
        t = torch_dtype(dtype)
        g = torch.Generator(device="cuda").manual_seed(rows + width)
        sets = []
        for _ in range(3):
            env = {"X": torch.randn(rows, width, device="cuda", generator=g).mul(3).to(t)}
            if op == "softmax_backward":
                env["P"] = torch.softmax(env["X"].float(), -1).to(t)
                env["dP"] = torch.randn(rows, width, device="cuda", generator=g).to(t)
            if op == "cross_entropy":
                env["T"] = torch.softmax(torch.randn(rows, width, device="cuda", generator=g), -1).to(t)
            sets.append(env)
        args = [tuple(e[n] for n in cd.input_names) for e in sets]
        got = cd(*args[0])
        got = got if isinstance(got, tuple) else (got,)
        ref = cd.diagram.reference({n: sets[0][n].double() for n in cd.input_names}, dtype=torch.float64)
        rec["rel_err"] = max(float((o.double() - ref[n]).norm() / ref[n].norm()) for n, o in zip(cd.output_names, got))
        rec["kernels"] = [dict(family=pk.kernel.family, options=pk.kernel.options.to_dict()) for pk in cd.plan.kernels]
        rec["napkin_us"] = time_fn(lambda *a: cd(*a), warmup=5, reps=30, rotate=args).median_s * 1e6
        fn = _torch(op)
        torch_args = [tuple(e[n] for n in TORCH_ARGS.get(op, ("X",))) for e in sets]
        rec["torch_us"] = time_fn(lambda *a: fn(*a), warmup=5, reps=30, rotate=torch_args).median_s * 1e6
        used = [n for n in cd.input_names if n != "X" or op != "softmax_backward"]
        nbytes = sum(sets[0][n].numel() * sets[0][n].element_size() for n in used)
        nbytes += sum(o.numel() * o.element_size() for o in got)
        rec["copy_fraction"] = nbytes / (rec["napkin_us"] * 1e-6) / copy_bps
        rec["x_torch"] = rec["torch_us"] / rec["napkin_us"]
    except Exception as e:  # noqa: BLE001 - reported, the other points still run
        rec["error"] = f"{type(e).__name__}: {e}"[:400]
    torch.cuda.empty_cache()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON lines, one a point")
    ap.add_argument("--only", default="softmax,log_softmax,logsumexp,softmax_backward,cross_entropy")
    ap.add_argument("--points", default=None, help="ROWSxWIDTH, comma-separated (default: POINTS)")
    ap.add_argument("--dtypes", default="bf16")
    a = ap.parse_args()
    import torch

    from napkin.bench.timing import copy_bandwidth

    points = [tuple(int(v) for v in p.split("x")) for p in a.points.split(",")] if a.points else POINTS
    copy_bps = copy_bandwidth()
    head = dict(gpu=torch.cuda.get_device_name(), copy_bps=copy_bps)
    print(json.dumps(head), flush=True)
    out = open(a.out, "w") if a.out else None
    if out:
        out.write(json.dumps(head) + "\n")
    for dtype in a.dtypes.split(","):
        for op in a.only.split(","):
            for rows, width in points:
                rec = point(op, rows, width, dtype, copy_bps)
                line = (f"{op:17s} {dtype} {rows:6d} x {width:6d}  " + (
                    f"napkin {rec['napkin_us']:8.1f} us ({rec['copy_fraction']:4.0%})  torch {rec['torch_us']:8.1f} us  "
                    f"x{rec['x_torch']:.2f}  err {rec['rel_err']:.1e}  "
                    + " + ".join(k['family'] + ('/smem' if k['options'].get('row_in_smem') else '')
                                 + ('/streamed' if k['options'].get('streamed') else '')
                                 + (f"/cluster{k['options']['cluster']}" if k['options'].get('cluster') else '')
                                 for k in rec["kernels"])
                    if "error" not in rec else "ERROR " + rec["error"]))
                print(line, flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
