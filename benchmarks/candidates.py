#!/usr/bin/env python3
"""Time the model's best candidates of one family for one diagram, each as its own plan, beside the
diagram's PyTorch reference run eagerly: does the model's ranking agree with the GPU?

    PYTHONPATH=. python3 benchmarks/candidates.py matvec --sizes a=8192,b=8192 --family pointwise \\
        --gpu h200 [--dtype bf16] [--top 8] [--out $OUT/candidates.json]

The diagram is a library name or ``file.py:function``. The candidates are ranked as the planner
ranks them (:func:`napkin.codegen.select.rank` on the profile ``--gpu``); each runs as a
hand-written schedule (``napkin.codegen.compile(schedule=...)``), is checked against the float64
reference (relative error) and timed with :func:`napkin.bench.timing.time_fn` (CUDA events, L2
flushed, median) and by the torch profiler (the kernels' own time, L2 warm). Each line gives the
model's time, the measured times, the launch the family states (blocks, threads, bytes in flight
a thread) and the options.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("diagram")
    ap.add_argument("--sizes", help="name=size pairs, comma-separated (as napkin's -s)")
    ap.add_argument("--family", required=True)
    ap.add_argument("--gpu", default="h100", help="the profile the candidates are ranked on")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--only", help="comma-separated candidate ranks to time (default: all of the top)")
    ap.add_argument("--match", help="also time the candidates past the top whose options or tiles contain this "
                                    "text (e.g. swap_ab)")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    from napkin.bench.timing import kernel_times, time_fn
    from napkin.cli_common import load, parse_sizes
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen import select
    from napkin.codegen.families import get as get_family

    d = load(args.diagram).with_dtype(args.dtype).bind(**parse_sizes([args.sizes] if args.sizes else []))
    fam = get_family(args.family)
    gpu = select.resolve_gpu(args.gpu)
    every = select.rank(d, fam, gpu, args.dtype)
    ranked = [r if i < args.top or (args.match and args.match in f"{r.schedule.kernels[0].options} "
                                    f"{' '.join(str(x) for x in r.schedule.kernels[0].relabels)}") else None
              for i, r in enumerate(every)]
    only = {int(x) for x in args.only.split(",")} if args.only else None
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    inputs = {v.name: torch.randn(*(d.sizes[a] for a in v.axis_names), device="cuda", dtype=dt)
              for v in d.inputs}
    ref = {k: v.double() for k, v in d.reference({k: x.double() for k, x in inputs.items()}).items()}
    te = time_fn(lambda: d.reference(inputs), warmup=3, reps=30, max_time_s=1.0)
    eager_kernels = kernel_times(lambda: d.reference(inputs))
    rows = [dict(candidate="eager", us=te.median_s * 1e6, kernels=eager_kernels,
                 kernel_us=sum(eager_kernels.values()))]
    listed = ", ".join(f"{n[:40]} {us:.1f}" for n, us in eager_kernels.items())
    print(f"{d.name} {d.sizes} {args.dtype} on {torch.cuda.get_device_name()}: eager {te.median_s * 1e6:.1f} us, "
          f"kernels {sum(eager_kernels.values()):.1f} ({listed})", flush=True)
    for i, r in enumerate(ranked):
        if r is None or (only is not None and i not in only):
            continue
        k = r.schedule.kernels[0]
        est = fam.launch_estimate(d, r.schedule, gpu) if hasattr(fam, "launch_estimate") else {}
        launch = {key: est.get(key) for key in ("blocks", "threads", "regs", "in_flight_bytes_per_thread")}
        row = dict(candidate=i, predicted_us=r.seconds * 1e6, options=str(k.options), launch=launch,
                   tiles=[str(x) for x in k.relabels])
        try:
            c = compile_diagram(d, schedule=r.schedule)
            args_in = [inputs[v.name] for v in d.inputs]
            got = c(*args_in)
            names = [v.name for v in d.outputs]
            got = dict(zip(names, got if isinstance(got, tuple) else (got,)))
            name = d.outputs[0].name
            want = ref[name]
            row["err"] = float((got[name].double() - want).norm() / want.norm())
            t = time_fn(lambda: c(*args_in), warmup=3, reps=30, max_time_s=1.0)
            row["us"] = t.median_s * 1e6
            row["kernels"] = kernel_times(lambda: c(*args_in))
            row["kernel_us"] = sum(row["kernels"].values())
        except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, not a crash
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        timing = (f"{row['us']:8.1f} us, kernels {row['kernel_us']:6.1f} (err {row['err']:.1e})" if "us" in row
                  else f"ERROR {row['error'][:80]}")
        print(f"#{i} model {row['predicted_us']:7.1f} us | {timing} | {launch} | {' '.join(row['tiles'])} "
              f"{row['options']}", flush=True)
        if len(row.get("kernels") or ()) > 1:  # where a plan of several launches spends its time
            print("     " + ", ".join(f"{name[:40]} {us:.1f}" for name, us in row["kernels"].items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
