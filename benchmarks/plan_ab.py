#!/usr/bin/env python3
"""Run a list of points as the operator surveys do, each record tagged: the A/B of two trees'
plans, run in turn (``PYTHONPATH`` naming the tree, a plan cache each).

    git archive HEAD napkin | tar -x -C /tmp/old
    for pass in 1 2; do
      PYTHONPATH=/tmp/old NAPKIN_CACHE_DIR=/tmp/cache_old python3 benchmarks/plan_ab.py points.json old$pass --out ab.jsonl
      PYTHONPATH=.        NAPKIN_CACHE_DIR=/tmp/cache_new python3 benchmarks/plan_ab.py points.json new$pass --out ab.jsonl
    done

``points.json`` is a list of ``[diagram, sizes, dtype]``: a library name or ``file.py:function``,
the axis sizes, the dtype. Each point runs through :func:`napkin.bench.suite.run_point` (the
plan of the GPU profile ``--gpu``, fresh random inputs, CUDA events with L2 flushed, the median
call, checked against eager PyTorch); a line a point: the tag, the point, napkin's time, the
ratio to eager and whether the output checked. ``--kernels`` adds the plan's kernels' own device
time (the torch profiler, L2 flushed before each call: no host launch time), where a call's time
is mostly the host's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _kernel_us(spec: str, sizes: dict, dtype: str, gpu: str) -> float | None:
    """The device µs of the plan's kernels a call, L2 flushed before each (None where it fails)."""
    import torch

    from napkin.bench.timing import CudaEventBackend, kernel_times
    from napkin.cli_common import load
    from napkin.codegen import compile as napkin_compile

    try:
        d = load(spec)
        c = napkin_compile(d, gpu=gpu, sizes=sizes, dtype=dtype)
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        bound = d.bind(**sizes)
        args = [torch.randn(*(bound.sizes[n] for n in v.axis_names), device="cuda", dtype=dt) for v in bound.inputs]
        return sum(kernel_times(lambda: c(*args), flush=CudaEventBackend().flush).values())
    except Exception as e:  # noqa: BLE001 - a point whose kernels cannot be timed says so, the run goes on
        print(f"  (kernel time of {spec} failed: {type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", type=Path)
    ap.add_argument("tag")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu", default="h200", help="the profile the plans are made for")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--kernels", action="store_true", help="also the kernels' device time (torch profiler)")
    a = ap.parse_args(argv)
    try:
        points = json.loads(a.points.read_text())
        points = [(str(spec), {str(k): int(v) for k, v in sizes.items()}, str(dtype)) for spec, sizes, dtype in points]
    except (OSError, ValueError, TypeError, AttributeError) as e:
        print(f"error: {a.points}: expected a JSON list of [diagram, sizes, dtype] ({e})", file=sys.stderr)
        return 2
    from napkin.bench.suite import Point, SuiteConfig, run_point

    cfg = SuiteConfig(gpu=a.gpu, autotune=False, compile_baselines=False, reps=a.reps, warmup=3, max_time_s=1.0)
    with a.out.open("a") as sink:
        for spec, sizes, dtype in points:
            p = Point("composed", spec, sizes, dtype, {"problem": spec.rsplit("/", 1)[-1]})
            t0 = time.time()
            rec = run_point(p, cfg)
            row = dict(tag=a.tag, spec=spec, sizes=sizes, dtype=dtype, napkin_us=(rec.get("napkin_s") or 0.0) * 1e6,
                       eager=rec["ratio"].get("eager"), ok=(rec.get("check") or {}).get("ok"), errors=rec.get("errors"))
            if a.kernels:
                row["kernel_us"] = _kernel_us(spec, sizes, dtype, a.gpu)
            sink.write(json.dumps(row, default=str) + "\n")
            sink.flush()
            kern = f" kernels {row['kernel_us']:7.1f}" if row.get("kernel_us") else ""
            print(f"{a.tag} {p.labels['problem'][:40]:40s} {sizes} {row['napkin_us']:9.1f} us{kern} "
                  f"x{row['eager'] or 0.0:.2f} ok={row['ok']} ({time.time() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
