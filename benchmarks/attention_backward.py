#!/usr/bin/env python3
"""Attention's backward (issue #15 part 2): napkin's derived backward against SDPA's.

napkin's side is the backward diagram ``Diagram.grad`` gives for ``mha`` (or ``attention_causal``)
with the saves the model chooses (``O`` and ``P_lse``), planned by the one planner and built by
its families: the whole plan is timed, every launch of it (the attention_bwd kernel with its
D pre-pass and dQ conversion where the planner picks it). Its inputs are the forward's Q, K, V,
a random cotangent dO, and O and P_lse from napkin's own forward with saves (one kernel).

SDPA's side is ``torch.autograd.grad`` of ``scaled_dot_product_attention`` with the flash and the
cuDNN backend, timed from saved forward activations: the forward runs once outside the events
(``retain_graph``), so only the backward is timed. Both sides: CUDA events, median of the runs,
L2 flushed before each (napkin.bench.timing.time_fn), random data.

Points: bf16, 16 heads, d = 64 and 128, causal and not, sequences 1k to 16k with 16k tokens a
batch (batch = 16384 / seq, woven with the heads). TFLOP/s count the backward as 2.5x the
forward's FLOPs (4 · b · h · s² · d for the forward, halved when causal), the convention of the
FlashAttention papers. Each row prints the model's prediction next to the measurement and goes
to ``--out`` as JSON with the GPU's name and the commit::

    python3 benchmarks/attention_backward.py [--out benchmarks/results/<gpu>/attention_backward.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAVE = {"O", "P_lse"}
TOKENS = 16384
HEADS = 16


def points(quick: bool):
    seqs = (1024, 4096) if quick else (1024, 2048, 4096, 8192, 16384)
    ds = (128,) if quick else (128, 64)
    return [(s, d, c) for d in ds for c in (False, True) for s in seqs]


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - no git on the machine: say so
        return "unknown"


def batched(name: str):
    """The library diagram with a batch axis ``b`` woven in front (16k tokens: b = 16384 / seq)."""
    from napkin.diagrams import Axis, library

    return library.get(name).weave(Axis("b"), name=f"{name}_b")


def flops_fwd(b, h, s, d, causal) -> float:
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def run_point(s, d, causal, gpu, reps):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from napkin.bench.timing import time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams.grad import forward_with_saves

    b = TOKENS // s
    sizes = {"b": b, "h": HEADS, "q": s, "x": s, "d": d}
    fwd_d = batched("attention_causal" if causal else "mha")
    row = {"seq": s, "batch": b, "heads": HEADS, "d": d, "causal": causal, "dtype": "bf16"}
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    shape = (b, HEADS, s, d)
    Q, K, V, dO = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    fl = 2.5 * flops_fwd(b, HEADS, s, d, causal)
    row["flops_backward"] = fl
    # napkin: forward with saves (one kernel), then the backward: the planner's plan, and the
    # attention_bwd family's kernel where the planner picked another plan
    got = {}
    try:
        fwd = napkin_compile(forward_with_saves(fwd_d, SAVE), sizes=sizes, dtype="bf16", gpu=gpu)
        res = fwd(Q=Q, K=K, V=V)
        saved = dict(zip(fwd.output_names, res if isinstance(res, tuple) else (res,)))
        row["forward_launches"] = len(fwd.launches)
    except Exception as e:  # noqa: BLE001 - reported in the row, never fatal
        row["napkin_error"] = f"forward: {type(e).__name__}: {e}"[:400]
        return row
    grad = fwd_d.grad(save=SAVE)
    for key, family in (("napkin", None), ("attention_bwd", "attention_bwd")):
        try:
            bwd = napkin_compile(grad, sizes=sizes, dtype="bf16", gpu=gpu, family=family)
            fams = [k.kernel.family for k in bwd.plan.kernels] if bwd.plan else []
            if key == "attention_bwd" and row.get("napkin_families") == fams:
                continue  # the planner's plan is this kernel already
            row[f"{key}_families"] = fams
            row[f"{key}_launches"] = len(bwd.launches)
            row[f"{key}_pred_us"] = bwd.plan.seconds * 1e6 if bwd.plan is not None else None
            # the plan reads P_lse in the dtype its kernels declare (fp32 for attention_bwd; an
            # unfused plan reads the diagram's bf16)
            feed = {n: t.to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[bwd._dtypes[n]]))
                    for n, t in dict(Q=Q, K=K, V=V, dO=dO, O=saved["O"], P_lse=saved["P_lse"]).items()}
            t = time_fn(lambda: bwd(**feed), warmup=3, reps=reps, max_time_s=2.0).median_s
            row[f"{key}_us"] = t * 1e6
            row[f"{key}_tflops"] = fl / t / 1e12
            got[key] = dict(zip(bwd.output_names, bwd(**feed)))
        except Exception as e:  # noqa: BLE001 - reported in the row, never fatal
            row[f"{key}_error"] = f"{type(e).__name__}: {e}"[:400]
    row["pred_us"] = row.get("napkin_pred_us")
    # SDPA backends: the forward once (outside the timing), the backward timed
    scale = 1.0 / math.sqrt(d)
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            q, k, v = (x.detach().requires_grad_(True) for x in (Q, K, V))
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

            def backward():
                return torch.autograd.grad(o, (q, k, v), dO, retain_graph=True)

            with sdpa_kernel(backend):
                ref = backward()
                t = time_fn(backward, warmup=3, reps=reps, max_time_s=2.0).median_s
            row[f"{label}_us"] = t * 1e6
            row[f"{label}_tflops"] = fl / t / 1e12
            for key in ("napkin", "attention_bwd"):
                if row.get(f"{key}_us"):
                    row[f"{key}_vs_{label}"] = t * 1e6 / row[f"{key}_us"]
            if label == "sdpa_flash":  # napkin's gradients against the flash backend's
                for key, g in got.items():
                    row[f"{key}_rel_err"] = {n: float((g[n].float() - r.float()).norm() / r.float().norm())
                                             for n, r in zip(("dQ", "dK", "dV"), ref)}
        except Exception as e:  # noqa: BLE001
            row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def sweep_configs(s, d, causal, gpu, reps):
    """Every tile configuration of the attention_bwd family at one point: (BX, BQ, predicted µs,
    measured µs)."""
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families import attention_bwd_wgmma
    from napkin.codegen.families.attention_bwd import FAMILY, analyze
    from napkin.codegen.select import predict_schedule

    b = TOKENS // s
    sizes = {"b": b, "h": HEADS, "q": s, "x": s, "d": d}
    grad = batched("attention_causal" if causal else "mha").grad(save=SAVE)
    bound = grad.with_dtype("bf16").bind(**sizes)
    gen = torch.Generator(device="cuda").manual_seed(1)
    feed = {v.name: torch.randn([a.bound_size for a in v.axes], generator=gen, device="cuda").to(
        torch.float32 if v.name == "P_lse" else torch.bfloat16) for v in bound.inputs}
    feed["P_lse"] = feed["P_lse"].abs() + 3.0  # a plausible log-sum-exp: P = exp(S - lse) stays small
    out = []
    for sched in FAMILY.candidates(bound, gpu, "bf16"):
        engine = sched.kernels[0].options.engine  # mma.sync tiles, and the Hopper kernel's (wgmma)
        cfg = (attention_bwd_wgmma.config_of if engine == "wgmma" else FAMILY.config_of)(analyze(bound), bound, sched)
        pred = predict_schedule(bound, FAMILY, sched, gpu).seconds * 1e6
        try:
            k = napkin_compile(grad, sizes=sizes, dtype="bf16", gpu=gpu, family="attention_bwd", schedule=sched)
            t = time_fn(lambda: k(**feed), warmup=3, reps=reps, max_time_s=1.0).median_s * 1e6
        except Exception as e:  # noqa: BLE001
            t = f"{type(e).__name__}: {e}"[:200]
        out.append({"engine": engine, "BX": cfg.BX, "BQ": cfg.BQ, "pred_us": pred, "us": t})
        print(f"  config seq={s} d={d} causal={causal} {engine} BX={cfg.BX} BQ={cfg.BQ}: predicted {pred:.1f} µs, "
              f"measured {t if isinstance(t, str) else f'{t:.1f} µs'}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    ap.add_argument("--quick", action="store_true", help="fewer points")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", action="store_true", help="also time every attention_bwd tile configuration "
                    "at seq 4096 (d = 64 and 128, not causal)")
    a = ap.parse_args(argv)

    import torch

    from napkin.perfmodel.hardware import match_device_name

    name = torch.cuda.get_device_name()
    gpu = match_device_name(name)
    doc = {"gpu": name, "commit": commit(), "torch": torch.__version__, "dtype": "bf16", "heads": HEADS,
           "tokens_per_batch": TOKENS,
           "tflops_convention": "backward FLOPs = 2.5 x forward FLOPs (forward 4*b*h*s^2*d, halved when causal)",
           "timing": "CUDA events, median, L2 flushed before every run; SDPA: autograd.grad of a saved forward",
           "rows": []}
    print(f"{name} at {doc['commit']}")
    print(f"{'seq':>6} {'d':>4} {'causal':>6} {'pred µs':>9} {'napkin µs':>10} {'TFLOP/s':>8} {'x flash':>8} "
          f"{'x cudnn':>8} | {'bwd pred':>9} {'bwd µs':>9} {'TFLOP/s':>8} {'x flash':>8} {'x cudnn':>8} | "
          f"{'flash µs':>9} {'cudnn µs':>9}  (napkin: the planner's plan; bwd: the attention_bwd kernel)")
    for s, d, c in points(a.quick):
        row = run_point(s, d, c, gpu, a.reps)
        doc["rows"].append(row)

        def f(k, w, p=1):
            v = row.get(k)
            return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

        bwd = "attention_bwd" if "attention_bwd_us" in row or "attention_bwd_error" in row else "napkin"
        errs = "; ".join(f"{k}: {v}" for k, v in row.items() if k.endswith("_error"))
        print(f"{s:>6} {d:>4} {str(c):>6} {f('napkin_pred_us', 9)} {f('napkin_us', 10)} {f('napkin_tflops', 8)} "
              f"{f('napkin_vs_sdpa_flash', 8, 2)} {f('napkin_vs_sdpa_cudnn', 8, 2)} | {f(bwd + '_pred_us', 9)} "
              f"{f(bwd + '_us', 9)} {f(bwd + '_tflops', 8)} {f(bwd + '_vs_sdpa_flash', 8, 2)} "
              f"{f(bwd + '_vs_sdpa_cudnn', 8, 2)} | {f('sdpa_flash_us', 9)} {f('sdpa_cudnn_us', 9)}"
              + (f"  {errs}" if errs else ""), flush=True)
        if a.out:  # after every row: a run cut short keeps what it measured
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
    if a.configs:
        doc["configs"] = [dict(seq=4096, d=d, causal=False, rows=sweep_configs(4096, d, False, gpu, a.reps))
                          for d in (128, 64)]
        if a.out:
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
    if a.out:
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
