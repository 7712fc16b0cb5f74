#!/usr/bin/env python3
"""Time the row-wise chain diagrams of the library on the GPU at hand, at their default sizes.

    PYTHONPATH=. python3 benchmarks/rowwise_chains.py [--dtype bf16 --dtype fp32] [--large] [--out DIR]

For each of log_softmax, l2_normalize, group_norm, logsumexp_rows and row_range: napkin's plan
(its kernels and families), napkin's time, the diagram's PyTorch reference run eagerly box by box
(``eager``: the composed baseline ``napkin bench`` uses), the one PyTorch call a user would make
(``torch``: torch.log_softmax, F.normalize, F.group_norm, torch.logsumexp, torch.aminmax), and the
bytes read once plus written once over napkin's time against the measured copy rate. CUDA events,
warm-up, medians of 100 runs, L2 flushed and inputs rotated (napkin.bench.timing). Each output is
checked against the float64 reference of the same inputs. Writes ``rowwise_chains.json`` to DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHAINS = ("log_softmax", "l2_normalize", "group_norm", "logsumexp_rows", "row_range")
#: Larger sizes (``--large``): eight times the default rows (four for logsumexp_rows and
#: row_range), so that launch and tail costs no longer hide the streaming rate.
LARGE = {"log_softmax": {"r": 32768}, "l2_normalize": {"r": 32768}, "group_norm": {"n": 128},
         "logsumexp_rows": {"r": 65536}, "row_range": {"r": 65536}}


def torch_op(name: str, sizes: dict):
    """The PyTorch call a user would write for the library diagram ``name`` (its inputs in order)."""
    import torch
    import torch.nn.functional as F

    if name == "log_softmax":
        return lambda X: torch.log_softmax(X, dim=-1)
    if name == "l2_normalize":
        return lambda X: F.normalize(X, dim=-1)
    if name == "group_norm":
        n, g, c, s = (sizes[a] for a in "ngcs")
        return lambda X, gamma, beta: F.group_norm(X.view(n, g * c, s), g, gamma.view(-1), beta.view(-1),
                                                   eps=1e-5).view(n, g, c, s)
    if name == "logsumexp_rows":
        return lambda X: torch.logsumexp(X, dim=-1)
    if name == "row_range":
        def rng(X):
            lo, hi = torch.aminmax(X, dim=-1)
            return hi - lo
        return rng
    raise KeyError(name)


def rel_err(out, ref) -> float:
    import torch

    o, r = out.double(), ref.double()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def measure(name: str, dtype: str, copy_bps: float, large: bool = False) -> dict:
    from napkin.bench.baselines import composed_baselines
    from napkin.bench.suite import io_bytes
    from napkin.bench.timing import diagram_inputs, make_rotating_inputs, time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams import library

    import torch

    sizes = dict(library.entry(name).default_sizes)
    if large:
        sizes.update(LARGE[name])
    d = library.get(name).with_dtype(dtype).bind(sizes)
    cd = napkin_compile(d)
    sets = make_rotating_inputs(lambda i: diagram_inputs(d, seed=i))
    eager = composed_baselines(d, compile=False)[0]
    native = torch_op(name, sizes)
    ref = d.reference({v.name: t.double() for v, t in zip(d.inputs, sets[0])}, dtype=torch.float64)
    (want,) = ref.values()
    rec = {"diagram": name, "dtype": dtype, "sizes": sizes, "size": "large" if large else "default",
           "bytes": io_bytes(d),
           "kernels": [f"{pk.kernel.family}:{'+'.join(pk.kernel.boxes)}" for pk in cd.plan.kernels],
           "predicted_s": cd.plan.seconds,
           "tunables": [dict(k.tunables) for k in cd.program.launches]}
    for label, fn in (("napkin", cd), ("eager", eager.fn), ("torch", native)):
        out = fn(*sets[0])
        torch.cuda.synchronize()
        rec[f"{label}_rel_err"] = rel_err(out, want)
        t = time_fn(fn, warmup=10, reps=100, rotate=sets)
        rec[f"{label}_s"] = t.median_s
    rec["gbps"] = rec["bytes"] / rec["napkin_s"] / 1e9
    rec["copy_fraction"] = rec["bytes"] / rec["napkin_s"] / copy_bps
    rec["vs_eager"] = rec["eager_s"] / rec["napkin_s"]
    rec["vs_torch"] = rec["torch_s"] / rec["napkin_s"]
    return rec


def sweep_configs(name: str, dtype: str) -> list[dict]:
    """Every configuration the row-wise family proposes for ``name`` at its default sizes: the
    model's prediction and the measured time of each (how well the model ranks them)."""
    from napkin.bench.timing import diagram_inputs, make_rotating_inputs, time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families.rowwise import FAMILY
    from napkin.codegen.select import predict_schedule
    from napkin.diagrams import library

    d = library.get(name).with_dtype(dtype).bind(library.entry(name).default_sizes)
    sets = make_rotating_inputs(lambda i: diagram_inputs(d, seed=i))
    out = []
    for s in FAMILY.candidates(d, "h100", dtype):
        cd = napkin_compile(d, schedule=s, family="rowwise")
        t = time_fn(cd, warmup=5, reps=50, rotate=sets)
        opts = s.kernels[0].options
        out.append({"diagram": name, "dtype": dtype, "threads_per_row": opts.threads_per_row, "warps": opts.warps,
                    "stages": opts.stages, "regs": opts.regs_per_thread,
                    "predicted_s": predict_schedule(d, FAMILY, s, "h100").seconds, "measured_s": t.median_s})
        r = out[-1]
        print(f"  {name} {dtype} tpr={r['threads_per_row']:4d} warps={r['warps']:2d} regs={r['regs']:3d} "
              f"predicted {r['predicted_s'] * 1e6:7.1f} us measured {r['measured_s'] * 1e6:7.1f} us", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", action="append", help="bf16 (default), fp16, fp32; repeatable")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--only", action="append", help="a diagram of the list; repeatable")
    p.add_argument("--large", action="store_true", help="also the larger sizes (LARGE), in the first dtype")
    p.add_argument("--configs", action="append", default=[],
                   help="also time every row-wise configuration of this diagram (first dtype); repeatable")
    a = p.parse_args()
    import torch

    from napkin.bench.timing import copy_bandwidth, device_info

    copy_bps = copy_bandwidth()
    dev = device_info()
    print(f"{dev.get('name', torch.cuda.get_device_name())}: copy rate {copy_bps / 1e9:.0f} GB/s (read + write)")
    rows = []
    dtypes = a.dtype or ["bf16"]
    todo = [(name, dt, False) for dt in dtypes for name in a.only or CHAINS]
    todo += [(name, dtypes[0], True) for name in a.only or CHAINS] if a.large else []
    for name, dt, large in todo:
        r = measure(name, dt, copy_bps, large)
        rows.append(r)
        sz = ",".join(f"{k}={v}" for k, v in r["sizes"].items())
        print(f"{name:15s} {dt:5s} {sz:22s} napkin {r['napkin_s'] * 1e6:8.1f} us ({len(r['kernels'])} kernel, "
              f"{r['copy_fraction'] * 100:5.1f}% of copy) | eager {r['eager_s'] * 1e6:8.1f} us "
              f"({r['vs_eager']:.2f}x) | torch {r['torch_s'] * 1e6:8.1f} us ({r['vs_torch']:.2f}x) | "
              f"err {r['napkin_rel_err']:.1e} (eager {r['eager_rel_err']:.1e}) | model "
              f"{r['predicted_s'] * 1e6:.1f} us", flush=True)
    configs = [c for name in a.configs for c in sweep_configs(name, dtypes[0])]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "rowwise_chains.json").write_text(json.dumps({"device": dev, "copy_bps": copy_bps, "points": rows,
                                                           "configurations": configs}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
