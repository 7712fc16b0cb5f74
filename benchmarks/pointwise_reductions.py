#!/usr/bin/env python3
"""Time the pointwise family's memory-bound kernels against torch eager and the copy rate.

    PYTHONPATH=. python3 benchmarks/pointwise_reductions.py [--sweep] [--budget-s 100] [--out DIR]

Cases (bf16, 128 MiB read each unless said): a column sum over r of X[r,x] (the non-contiguous
axis), a mean over the middle axis h of X[b,h,s], a sum over the two outer axes (b,h) of
X[b,h,s] (the kept axis contiguous), a sum over the two non-adjacent axes (b,s) of X[b,h,s], a
row sum, tanh-form GELU (an elementwise chain of 8 maps), sigmoid written as three maps
(0.5·tanh(0.5·x) + 0.5), and rows of odd length (4095, 8191: not multiples of the 16-byte vector).

For each: napkin's planned kernel (its configuration and the model's predicted time), napkin's
time, the diagram's PyTorch reference run eagerly, and the bytes read once plus written once over
napkin's time against the device's copy rate (a 512 MiB device-to-device copy,
napkin.bench.timing.copy_bandwidth, timed without an L2 flush). CUDA events, medians, inputs
rotated. Two L2 flushes before every timed run:

- ``dirty``: napkin.bench.timing's own (a buffer of twice L2 zeroed): the zeroed lines are left
  dirty in L2, and the timed kernel writes them back to HBM as it evicts them (about an L2 of
  writes, ~15 us on an H100, charged to a kernel that only reads);
- ``clean``: the same zeroing, then the buffer read once, so the timed run starts on an L2 of
  clean lines (none of its inputs among them).

A kernel that writes as much as it reads leaves about as many of its own lines dirty at its end as
it found, so the two flushes time it alike; a reduction reads only, and pays the dirty flush in
full. Every output is checked against the float64 reference. ``--sweep`` also times every
candidate configuration the family proposes (the model's prediction beside the measured time),
within a time budget; ``--maps`` times a few forced configurations of the two maps. Writes
``pointwise_reductions.json`` to DIR.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cases():
    """(label, diagram builder, sizes) of every case."""
    from napkin.diagrams import Diagram, array, axes, mean_over, scale, sum_over, tanh
    from napkin.diagrams import library

    def column_sum():
        return library.get("column_sum")

    def middle_mean():
        b, h, s = axes("b h s")
        return Diagram("middle_mean", mean_over(array("X", b, h, s), h, name="M"))

    def sum_bh():
        b, h, s = axes("b h s")
        return Diagram("sum_bh", sum_over(sum_over(array("X", b, h, s), b, name="S1"), h, name="S"))

    def sum_bs():
        b, h, s = axes("b h s")
        return Diagram("sum_bs", sum_over(sum_over(array("X", b, h, s), b, name="S1"), s, name="S"))

    def row_sum():
        r, x = axes("r x")
        return Diagram("row_sum", sum_over(array("X", r, x), x, name="S"))

    def gelu_tanh():
        return library.get("gelu_tanh")

    def sigmoid_chain():
        r, x = axes("r x")
        t = tanh(scale(array("X", r, x), 0.5, name="h"), name="t")
        return Diagram("sigmoid_chain", (t * 0.5 + 0.5).named("Y"))

    def bias_add():
        r, x = axes("r x")
        return Diagram("bias_add", (array("X", r, x) + array("b", x)).named("Y"))

    return [("column_sum", column_sum, dict(r=16384, x=4096)),
            ("middle_mean", middle_mean, dict(b=32, h=1024, s=2048)),
            ("sum_bh", sum_bh, dict(b=64, h=512, s=2048)),
            ("sum_bs", sum_bs, dict(b=64, h=512, s=2048)),
            ("row_sum", row_sum, dict(r=16384, x=4096)),
            ("gelu_tanh", gelu_tanh, dict(r=8192, x=8192)),
            ("sigmoid_chain", sigmoid_chain, dict(r=8192, x=8192)),
            ("column_sum_odd", column_sum, dict(r=16384, x=4095)),
            ("row_sum_odd", row_sum, dict(r=16384, x=4095)),
            ("sigmoid_chain_odd", sigmoid_chain, dict(r=8192, x=8191)),
            ("bias_add_odd", bias_add, dict(r=8192, x=8191))]


#: Forced (threads, unroll) of the map kernel timed with ``--maps``.
MAP_CONFIGS = ((256, 2), (128, 4), (256, 4), (128, 8), (64, 8), (512, 4))


def backends():
    """The two flushes: napkin's own (dirty lines left in L2) and a clean one."""
    import torch

    from napkin.bench.timing import CudaEventBackend

    class CleanFlush(CudaEventBackend):
        def flush(self) -> None:
            super().flush()
            # read the zeroed buffer once: its dirty lines go back to HBM here, outside the events
            self._buf.view(torch.float32).amax()

    return {"dirty": CudaEventBackend(), "clean": CleanFlush()}


def rel_err(out, ref) -> float:
    import torch

    o, r = out.double(), ref.double().to(out.device)
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def timed(fn, sets, flushes) -> dict:
    from napkin.bench.timing import time_fn

    return {k: time_fn(fn, warmup=3, reps=15, rotate=sets, backend=b).median_s for k, b in flushes.items()}


def measure(label, build, sizes, dtype, copy_bps, gpu_key, flushes, sweep: bool, maps: bool,
            deadline: float) -> dict:
    import torch

    from napkin.bench.baselines import composed_baselines
    from napkin.bench.suite import io_bytes
    from napkin.bench.timing import diagram_inputs, make_rotating_inputs
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families import pointwise as pw
    from napkin.codegen.select import predict_schedule

    d = build().with_dtype(dtype).bind(sizes)
    cd = napkin_compile(d)
    sets = make_rotating_inputs(lambda i: diagram_inputs(d, seed=i))
    eager = composed_baselines(d, compile=False)[0]
    ref = d.reference({v.name: t.double() for v, t in zip(d.inputs, sets[0])}, dtype=torch.float64)
    want = list(ref.values())[0]
    nbytes = io_bytes(d)
    shape = pw.analyse(d)
    rec = {"case": label, "dtype": dtype, "sizes": sizes, "bytes": nbytes,
           "kernels": [f"{pk.kernel.family}" for pk in cd.plan.kernels],
           "predicted_s": cd.plan.seconds, "vec": getattr(shape, "vec", None),
           "tail": getattr(shape, "tail", None),
           "tunables": [dict(k.tunables) for k in cd.program.launches]}
    for name, fn in (("napkin", cd), ("eager", eager.fn)):
        out = fn(*sets[0])
        out = out[0] if isinstance(out, tuple) else out
        torch.cuda.synchronize()
        rec[f"{name}_rel_err"] = rel_err(out, want)
        rec[f"{name}_s"] = timed(fn, sets, flushes)
    rate = {k: nbytes / t for k, t in rec["napkin_s"].items()}
    rec["copy_fraction"] = {k: r / copy_bps for k, r in rate.items()}
    rec["vs_eager"] = {k: rec["eager_s"][k] / rec["napkin_s"][k] for k in flushes}
    print(f"{label:18s} {dtype} napkin " + " ".join(
        f"{k} {rec['napkin_s'][k] * 1e6:6.1f} us ({100 * rec['copy_fraction'][k]:.0f}% copy, "
        f"{rec['vs_eager'][k]:.2f}x eager)" for k in flushes)
        + f" pred {rec['predicted_s'] * 1e6:6.1f} err {rec['napkin_rel_err']:.1e} {rec['tunables'][0]}", flush=True)
    if maps and shape.mode == "map":
        rows = []
        for t, u in MAP_CONFIGS:
            cfg = pw.Config("map", t, u)
            s = pw.schedule_for(shape, cfg, gpu_key)
            c = napkin_compile(d, schedule=s, family="pointwise")
            o = c(*sets[0])
            torch.cuda.synchronize()
            row = {"config": repr(cfg), "rel_err": rel_err(o, want), "measured_s": timed(c, sets, flushes),
                   "predicted_s": predict_schedule(d, pw.FAMILY, s, gpu_key).seconds}
            rows.append(row)
            print(f"   {cfg} " + " ".join(f"{k} {v * 1e6:6.1f} us" for k, v in row["measured_s"].items())
                  + f" err {row['rel_err']:.1e}", flush=True)
        rec["map_configs"] = rows
    if sweep:
        rows = []
        cands = pw.FAMILY.candidates(d, gpu_key, dtype)
        ranked = sorted(cands, key=lambda s: predict_schedule(d, pw.FAMILY, s, gpu_key).seconds)
        rest = ranked[5:]
        random.Random(0).shuffle(rest)   # the model's five favourites, then a sample of the others
        for s in ranked[:5] + rest:
            if time.time() > deadline:
                rec["sweep_truncated"] = True
                break
            cfg = pw.config_from_schedule(shape, s)
            try:
                c = napkin_compile(d, schedule=s, family="pointwise")
                t = timed(c, sets, {"dirty": flushes["dirty"]})["dirty"]
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                rows.append({"config": repr(cfg), "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            p = predict_schedule(d, pw.FAMILY, s, gpu_key).seconds
            rows.append({"config": repr(cfg), "predicted_s": p, "measured_s": t})
            print(f"   {cfg} pred {p * 1e6:7.1f} meas {t * 1e6:7.1f}", flush=True)
        rec["sweep"] = rows
    return rec


def reads(copy_bps, flushes) -> dict:
    """PyTorch's own read-only reductions of 128 MiB of bf16 (a contiguous sum of everything, a
    column sum): the rate a reduction reaches under each flush."""
    import torch

    from napkin.bench.timing import make_rotating_inputs

    sets = make_rotating_inputs(lambda i: (torch.randn(16384, 4096, device="cuda", generator=None).to(
        torch.bfloat16) + 0.01 * (i + 1),))
    out = {}
    for name, fn in (("torch_sum_all", lambda X: X.sum()), ("torch_sum_dim0", lambda X: X.sum(0)),
                     ("torch_sum_dim1", lambda X: X.sum(1))):
        t = timed(fn, sets, flushes)
        out[name] = {k: {"s": v, "copy_fraction": 16384 * 4096 * 2 / v / copy_bps} for k, v in t.items()}
        print(f"{name:18s} " + " ".join(f"{k} {v['s'] * 1e6:6.1f} us ({100 * v['copy_fraction']:.0f}% copy)"
                                        for k, v in out[name].items()), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="pointwise-bench")
    ap.add_argument("--dtype", action="append")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--maps", action="store_true")
    ap.add_argument("--budget-s", type=float, default=100.0)
    ap.add_argument("--only", action="append", help="case labels to run (default: all)")
    args = ap.parse_args()
    import torch

    from napkin.bench.timing import copy_bandwidth, device_info

    start = time.time()
    name = torch.cuda.get_device_name()
    gpu_key = "h200" if "H200" in name else "h100"
    copy_bps = copy_bandwidth()
    print(f"{name}: copy rate {copy_bps / 1e9:.0f} GB/s", flush=True)
    flushes = backends()
    out = {"device": {**device_info(), "copy_bandwidth": copy_bps}, "cases": []}
    try:
        out["torch_reads"] = reads(copy_bps, flushes)
    except Exception as e:  # noqa: BLE001 - the cases still run
        print(f"torch reads: {type(e).__name__}: {e}", flush=True)
    todo = [c for c in cases() if not args.only or c[0] in args.only]
    for i, (label, build, sizes) in enumerate(todo):
        for dtype in args.dtype or ["bf16"]:
            left = args.budget_s - (time.time() - start)
            deadline = time.time() + max(0.0, left / max(1, len(todo) - i))
            try:
                out["cases"].append(measure(label, build, sizes, dtype, copy_bps, gpu_key, flushes, args.sweep,
                                            args.maps, deadline))
            except Exception as e:  # noqa: BLE001 - one case failing does not lose the others
                print(f"{label} {dtype}: {type(e).__name__}: {e}", flush=True)
                out["cases"].append({"case": label, "dtype": dtype, "error": f"{type(e).__name__}: {e}"[:500]})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "pointwise_reductions.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
