#!/usr/bin/env python3
"""The operator survey at small sizes, timed as a caller sees one call (issue #12).

The survey (``operator_survey.py``) times problems of 50–300 MiB with the L2 flushed before
each call, so the host's time to issue a call overlaps the flush and only the GPU's time shows.
Suites that time small problems call them one at a time: synchronise, record an event, call,
record an event, synchronise. There the host's time to issue the call (napkin's check, its
output allocation, one launch a kernel) is the GPU's idle time, and a plan of several kernels
pays each launch. This script shrinks every survey problem (halving its largest axis until the
inputs and outputs fit ``--target-kib``) and times napkin's compiled diagram and the diagram's
PyTorch reference run eagerly both ways:

- ``synced``: one call between two events after a synchronise, L2 warm (the caller's view);
- ``gpu``: :func:`napkin.bench.timing.time_fn`, L2 flushed before each call (the survey's view);
- ``kernels``: the sum of the kernels' own GPU time (torch profiler, median a kernel, L2 warm),
  which no host time enters.

Each point prints the plan's kernels and the three ratios (× eager, > 1: napkin is faster)::

    PYTHONPATH=. python3 benchmarks/small_shapes.py [--target-kib 256,4096] [--dtypes bf16,fp32]
        [--only softmax_last,...] [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def shrink(diagram, sizes: dict[str, int], target_bytes: float) -> dict[str, int]:
    """``sizes`` with the largest axis halved (rounded up) until the bound diagram's inputs and
    outputs take at most ``target_bytes``; axes never fall below 1.

    >>> from napkin.diagrams import library
    >>> shrink(library.get("softmax").with_dtype("bf16"), {"r": 4096, "x": 4096}, 1 << 20)  # in and out
    {'r': 512, 'x': 512}
    """
    from napkin.bench.suite import io_bytes

    out = dict(sizes)
    while io_bytes(diagram.bind(**out)) > target_bytes:
        name = max(out, key=lambda n: out[n])
        if out[name] <= 1:
            break
        out[name] = -(-out[name] // 2)
    return out


def synced_us(fn, args, reps: int) -> float:
    """Median µs of one call between two CUDA events, each after a synchronise (L2 warm)."""
    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def run(name: str, spec: str, sizes: dict, dtype: str, target: float, reps: int) -> dict:
    from napkin.bench.baselines import baselines_for
    from napkin.bench.timing import diagram_inputs, kernel_times, time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams import load_diagram

    base = load_diagram(spec).with_dtype(dtype)
    small = shrink(base, sizes, target)
    bound = base.bind(**small)
    rec = {"problem": name, "dtype": dtype, "sizes": small, "target_kib": target / 1024}
    try:
        k = napkin_compile(base, sizes=small, dtype=dtype)
        plan = getattr(k, "plan", None)
        rec["kernels"] = [pk.kernel.family for pk in plan.kernels] if plan is not None else [k.family]
        rec["launches"] = len(k.program.launches)
        eager = next(b for b in baselines_for(bound, family="composed", compile=False) if b.name == "eager")
        args = diagram_inputs(bound, dtype, "cuda", seed=1)
        for _ in range(3):
            k(*args)
            eager(*args)
        n_sync, e_sync = synced_us(k, args, reps), synced_us(eager, args, reps)
        n_gpu = time_fn(k, warmup=3, reps=reps, rotate=[args]).median_s * 1e6
        e_gpu = time_fn(eager, warmup=3, reps=reps, rotate=[args]).median_s * 1e6
        n_kern, e_kern = kernel_times(k, rotate=[args]), kernel_times(eager, rotate=[args])
        rec.update(napkin_synced_us=n_sync, eager_synced_us=e_sync, napkin_gpu_us=n_gpu, eager_gpu_us=e_gpu,
                   napkin_kernels=n_kern, eager_kernels=e_kern,
                   napkin_kernels_us=sum(n_kern.values()), eager_kernels_us=sum(e_kern.values()),
                   x_eager_synced=e_sync / n_sync, x_eager_gpu=e_gpu / n_gpu)
        rec["x_eager_kernels"] = rec["eager_kernels_us"] / rec["napkin_kernels_us"]
    except Exception as e:  # noqa: BLE001 - one line a failure, the sweep goes on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return rec


def main(argv=None) -> int:
    import operator_survey as survey

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-kib", default="256,4096", help="comma-separated sizes of inputs + outputs (KiB)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--only", default=None, help="comma-separated problem names")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help="JSON lines, one per point")
    a = ap.parse_args(argv)
    names = list(survey.PROBLEMS) if not a.only else [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in survey.PROBLEMS]
    if unknown:
        print(f"error: unknown problem(s) {', '.join(unknown)}; known: {', '.join(survey.PROBLEMS)}", file=sys.stderr)
        return 2
    targets = [float(t) * 1024 for t in a.target_kib.split(",")]
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    spec = str(ROOT / "benchmarks" / "operator_survey.py")
    recs = []
    t0 = time.time()
    for target in targets:
        for dtype in dtypes:
            for n in names:
                r = run(n, f"{spec}:{n}", survey.PROBLEMS[n], dtype, target, a.reps)
                recs.append(r)
                if "error" in r:
                    print(f"{n:24s} {dtype:5s} {r['target_kib']:6.0f} KiB  ERROR {r['error']}", flush=True)
                else:
                    print(f"{n:24s} {dtype:5s} {r['target_kib']:6.0f} KiB  {r['launches']} launch(es) "
                          f"{'+'.join(r['kernels']):28s} synced {r['napkin_synced_us']:7.1f} vs "
                          f"{r['eager_synced_us']:7.1f} us x{r['x_eager_synced']:5.2f}   gpu {r['napkin_gpu_us']:7.1f} vs "
                          f"{r['eager_gpu_us']:7.1f} us x{r['x_eager_gpu']:5.2f}   kernels {r['napkin_kernels_us']:7.1f} vs "
                          f"{r['eager_kernels_us']:7.1f} us x{r['x_eager_kernels']:5.2f}", flush=True)
                if a.out:
                    with a.out.open("a") as f:
                        f.write(json.dumps(r) + "\n")
    ok = [r for r in recs if "error" not in r]
    for key in ("x_eager_synced", "x_eager_gpu", "x_eager_kernels"):
        if ok:
            gm = math.exp(sum(math.log(r[key]) for r in ok) / len(ok))
            worst = sorted(ok, key=lambda r: r[key])[:5]
            print(f"{key}: geometric mean {gm:.2f} over {len(ok)} points; worst: "
                  + ", ".join(f"{r['problem']}/{r['dtype']}/{r['target_kib']:.0f}K {r[key]:.2f}" for r in worst))
    print(f"{len(recs) - len(ok)} error(s), {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
