#!/usr/bin/env python3
"""Decode and short-query attention (issue #13 part 2), and the head dimensions SDPA-sized.

The diagram ``gqa_decode`` is grouped-query attention without a mask: ``Q[h, j, q, d]`` (``h``
key/value heads, ``j`` query heads sharing each), ``K, V[h, x, d]``, the key axis ``x`` the
whole cache. Use it with the command line::

    napkin bench benchmarks/attention_decode.py:gqa_decode -s h=8,j=4,q=1,x=32768,d=128

Run as a script on a GPU, it measures the points of the issue's decode target (32 query and 8
key/value heads, d = 128, q = 1, x = 4k to 128k), short queries (q = 7, 64) and head
dimensions 96 and 256 (16 heads x batch 4, sequence 4096): napkin's kernel as the planner picks
it (the model ranks, the top 2 are measured), SDPA with each backend, the measured copy rate,
and for decode the bytes moved (K, V, Q read once, O written once) over the time against the
copy rate, and the time of a plain device copy of the K and V bytes timed the same way (a batch
of 8 too: 64 key/value heads). One JSON line per point goes to ``--out`` (default: stdout only)::

    python3 benchmarks/attention_decode.py [--out results.jsonl] [--quick] [--only decode] [--passes 2]

An H100's results: ``benchmarks/results/nvidia-h100-80gb-hbm3/attention_decode.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HERE = f"{Path(__file__).resolve()}:gqa_decode"


def gqa_decode():
    """O[h,j,q,d] = softmax_x(Q·Kᵀ/√d)·V with K, V[h,x,d] shared by the j query heads of a head."""
    from napkin.diagrams import Axis, Diagram, array
    from napkin.diagrams.library import attention_core

    h, j, q, x, d = Axis("h"), Axis("j"), Axis("q"), Axis("x"), Axis("d")
    Q, K, V = array("Q", h, j, q, d), array("K", h, x, d), array("V", h, x, d)
    return Diagram("gqa_decode", attention_core(Q, K, V), description="GQA decode: no mask, the whole cache")


def points(quick: bool):
    """(label, diagram spec, sizes, causal) of every point."""
    xs = (4096, 32768) if quick else (4096, 32768, 131072, 16384)
    out = [(f"decode x={x}", HERE, {"h": 8, "j": 4, "q": 1, "x": x, "d": 128}, False) for x in xs]
    # a batch of 8 (the diagram has no batch axis: 64 key/value heads are the same arrays as [8, 8])
    out += [(f"decode b=8 x={x}", HERE, {"h": 64, "j": 4, "q": 1, "x": x, "d": 128}, False)
            for x in ((4096,) if quick else (4096, 32768))]
    out += [(f"d={d} seq=4096{' causal' if c else ''}", "attention_causal" if c else "mha",
             {"h": 64, "q": 4096, "x": 4096, "d": d}, c) for c in (False, True) for d in (96, 256)]
    out += [(f"short q={q} x=32768", HERE, {"h": 8, "j": 4, "q": q, "x": 32768, "d": 128}, False) for q in (7, 64)]
    return out


def attention_family_us(point) -> float | None:
    """The attention family's own pick for a point the planner puts on other families (µs)."""
    from napkin.bench.timing import diagram_inputs, l2_bytes, make_rotating_inputs, time_fn
    from napkin.codegen import compile as napkin_compile

    d = point.bound_diagram()
    try:
        k = napkin_compile(d, family="attention")
        sets = make_rotating_inputs(lambda i: diagram_inputs(d, "bf16", "cuda", seed=1 + i), min_bytes=2 * l2_bytes(),
                                    max_sets=4)
        return time_fn(k, warmup=3, reps=20, rotate=sets, max_time_s=1.0).median_s * 1e6
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        print(f"attention family on {point.id}: {type(e).__name__}: {e}")
        return None


def copy_same_bytes_us(nbytes: int, warmup: int) -> float:
    """The median time (µs) of a device copy of ``nbytes`` (two rotated source/destination pairs,
    L2 flushed before each run, as napkin's calls are timed)."""
    import torch

    from napkin.bench.timing import time_fn

    srcs = [torch.empty(nbytes, dtype=torch.int8, device="cuda").random_(0, 100) for _ in range(2)]
    dsts = [torch.empty_like(s) for s in srcs]
    t = time_fn(lambda d, s: d.copy_(s), warmup=warmup, reps=30, rotate=list(zip(dsts, srcs)), max_time_s=1.0)
    return t.median_s * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="append one JSON line per point here")
    ap.add_argument("--quick", action="store_true", help="fewer points")
    ap.add_argument("--only", default="", help="the points whose label starts with this (decode, short, d=)")
    ap.add_argument("--warmup", type=int, default=300, help="untimed calls before each timing (default 300)")
    ap.add_argument("--passes", type=int, default=1,
                    help="measure every point this many times, keeping the last (the first pass compiles and "
                         "tunes; later ones find both cached and the GPU warm)")
    a = ap.parse_args(argv)

    import torch

    from napkin.bench import suite
    from napkin.bench.timing import copy_bandwidth
    from napkin.perfmodel.hardware import match_device_name

    gpu = match_device_name(torch.cuda.get_device_name())
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: measured copy rate {copy / 1e12:.2f} TB/s (read + write)")
    # a long warm-up: a decode call is 10-200 us, and a few calls after the compiles (seconds of an
    # idle GPU) are timed before the clocks are back up (an H100 measured the same kernels 16 us
    # and 25-150 us apart, with their profiled kernel times equal)
    cfg = suite.SuiteConfig(gpu=gpu, compile_baselines=False, top_k=2, reps=30, warmup=a.warmup, max_time_s=1.0,
                            copy_bandwidth=copy)
    todo = [p for p in points(a.quick) if p[0].startswith(a.only)]
    for pas in range(a.passes):
        last = pas == a.passes - 1
        for label, spec, sizes, causal in todo:
            point = suite.Point("attention", spec, sizes, "bf16", {"causal": causal} if causal else {})
            rec = suite.run_point(point, cfg)
            t = rec.get("napkin_s")
            row = {"label": label, "sizes": sizes, "napkin_us": t * 1e6 if t else None,
                   "pred_us": rec["pred_s"] * 1e6 if rec.get("pred_s") else None,
                   "kernels": (rec.get("napkin") or {}).get("kernels"),
                   "schedule": (rec.get("napkin") or {}).get("schedule"),
                   "tune": (rec.get("napkin") or {}).get("tune"),
                   "check": rec.get("check"), "errors": rec.get("errors"), "copy_tbps": copy / 1e12}
            for name, v in rec.get("baselines", {}).items():
                row[f"{name}_us"] = v * 1e6 if isinstance(v, float) else v
                if isinstance(v, float) and t:
                    row[f"vs_{name}"] = v / t
            if rec.get("napkin", {}).get("kernels") not in (None, ["attention"]):
                row["attention_family_us"] = attention_family_us(point)
            if t and label.startswith(("decode", "short")):
                moved = point.bytes  # Q, K, V read once, O written once
                row["gbps"] = moved / t / 1e9
                row["copy_fraction"] = moved / t / copy
                # a plain device copy of the K and V bytes, timed as napkin is (L2 flushed): the floor a
                # launch and its ramp put under small x, next to the copy rate of a large copy
                kv = 2 * sizes["h"] * sizes["x"] * sizes["d"] * 2
                row["copy_same_bytes_us"] = copy_same_bytes_us(kv, a.warmup)
                row["copy_same_bytes_over_napkin"] = row["copy_same_bytes_us"] / (t * 1e6)
            print(json.dumps(row if last else {"warm_pass": pas + 1, **row}))
            if a.out and last:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
