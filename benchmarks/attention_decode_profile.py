#!/usr/bin/env python3
"""Where decode attention's time goes (issue #13 part 2): per-kernel GPU times and whole calls.

For GQA decode (``gqa_decode`` of ``attention_decode.py``: 8 key/value heads a batch, 4 query heads
each, q = 1, d = 128) at each x and batch it measures, on the GPU at hand:

- the planner's pick: the call timed with CUDA events (L2 flushed, inputs rotated, as the suite
  times it) and each of its kernels' own time from ``torch.profiler`` (one kernel: the last
  split of each tile combines the partials);
- with ``--variants``: forced decode tiles (stages, chunk, splits) timed the same way, so the
  split count and pipeline depth the model derives can be checked against the measured best;
- the floor of a timed call: an empty kernel's time, a device copy of the K and V bytes and a
  read-only pass over them (``torch.sum``), timed the same way.

One JSON line per measurement goes to stdout and to ``--out``::

    python3 benchmarks/attention_decode_profile.py [--out prof.jsonl] [--variants] [--xs 4096,16384]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def emit(row: dict, out: Path | None) -> None:
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def kernel_times_us(fn, sets, flush, reps: int = 10) -> dict[str, float]:
    """Mean GPU time of each kernel ``fn`` launches (µs), from torch.profiler, L2 flushed before each call."""
    from napkin.bench.timing import kernel_times

    return {k: v for k, v in kernel_times(fn, rotate=sets, flush=flush, calls=reps, reduce="mean").items()
            if k.startswith("napkin_attn")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--variants", action="store_true", help="forced tiles, stages and splits too (batch 1)")
    ap.add_argument("--xs", default="4096,16384,32768,131072")
    ap.add_argument("--batches", default="1,8")
    a = ap.parse_args(argv)

    import torch

    from attention_decode import gqa_decode
    from napkin.bench.timing import CudaEventBackend, copy_bandwidth, diagram_inputs, l2_bytes, \
        make_rotating_inputs, time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families.attention import FAMILY, AttentionConfig, analyze

    backend = CudaEventBackend()
    copy = copy_bandwidth()
    emit({"what": "copy_rate", "tbps": copy / 1e12, "gpu": torch.cuda.get_device_name()}, a.out)

    import cupy

    empty = cupy.RawKernel('extern "C" __global__ void napkin_empty() {}', "napkin_empty")
    t = time_fn(lambda: empty((132,), (128,), ()), warmup=10, reps=50, backend=backend)
    emit({"what": "empty_kernel", "us": t.median_s * 1e6}, a.out)

    def timed(fn, sets):
        # a long warm-up: after seconds of compiling, the first calls run at idle clocks
        return time_fn(fn, warmup=300, reps=30, rotate=sets, max_time_s=1.0, backend=backend).median_s * 1e6

    for b in (int(v) for v in a.batches.split(",")):
        for x in (int(v) for v in a.xs.split(",")):
            d = gqa_decode().with_dtype("bf16").bind(h=8 * b, j=4, q=1, x=x, d=128)
            kv = 2 * 8 * b * x * 128 * 2
            sets = make_rotating_inputs(lambda i: diagram_inputs(d, "bf16", "cuda", seed=1 + i),
                                        min_bytes=2 * l2_bytes(), max_sets=4)
            # a device copy of the same bytes, timed the same way (L2 flushed)
            srcs = [torch.empty(kv, dtype=torch.int8, device="cuda").random_(0, 100) for _ in range(2)]
            dsts = [torch.empty_like(s) for s in srcs]
            tc = time_fn(lambda dd, ss: dd.copy_(ss), warmup=300, reps=30, rotate=list(zip(dsts, srcs)),
                         backend=backend).median_s * 1e6
            del srcs, dsts
            emit({"what": "copy_same_bytes", "b": b, "x": x, "kv_bytes": kv, "us": tc,
                  "read_tbps": kv / tc / 1e6}, a.out)
            # a read-only pass over the same bytes (torch.sum of bf16): the floor of one kernel that
            # reads K and V once, with its own kernel time
            bufs = [(torch.randn(kv // 2, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
            ts = timed(lambda t: t.sum(), bufs)
            del bufs
            emit({"what": "sum_same_bytes", "b": b, "x": x, "us": ts, "read_tbps": kv / ts / 1e6}, a.out)

            runs = [("planner", None)]
            if a.variants and b == 1:
                for bx, st, nb in ((64, 2, 3), (64, 3, 2), (64, 4, 1), (128, 2, 1)):
                    for k in (16, 32, 49, 64):
                        if k * 2 > x // bx:
                            continue
                        runs.append((f"bx{bx}_s{st}_k{k}", AttentionConfig(16, bx, 16, st, 128, nb, splits=k,
                                                                             packed=True, wx=4)))
            for label, cfg in runs:
                try:
                    if cfg is None:
                        k = napkin_compile(d, family="attention")
                        s = k.program.schedule
                        o = s.kernels[0].options
                        cfg = FAMILY.config_of(analyze(d), d, s) if o.engine != "wgmma" else None
                    else:
                        k = napkin_compile(d, schedule=FAMILY.schedule(d, cfg), family="attention")
                    us = timed(k, sets)
                    per = kernel_times_us(k, sets, backend.flush)
                    emit({"what": label, "b": b, "x": x, "us": us, "kernels_us": per,
                          "copy_fraction": kv / (us * 1e-6) / copy, "cfg": repr(cfg),
                          "pred_us": getattr(k.program.plan, "seconds", None) and k.program.plan.seconds * 1e6},
                         a.out)
                except Exception as e:  # noqa: BLE001 - reported, the other points go on
                    emit({"what": label, "b": b, "x": x, "error": f"{type(e).__name__}: {e}"[:400]}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
