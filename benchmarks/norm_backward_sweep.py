#!/usr/bin/env python3
"""Configurations of the fused norm backward (rowwise chain with column reductions) timed one by one.

    PYTHONPATH=<tree> python3 benchmarks/norm_backward_sweep.py SPEC... [--out FILE] [--budget-s S]

A SPEC is ``name[@dtype]:r:x[:tpr:splits:prefetch[:blocks_per_sm[:combine_depth[:nohoist]]]]]``: ``name`` is
``rmsnorm0`` (nothing saved: rstd recomputed, what benchmarks/backward.py times), ``rmsnorm``
(rstd saved) or ``layernorm`` (mean and rstd saved), ``dtype`` bf16 (the default), fp16 or fp32
(inputs and outputs); without ``tpr`` the planner's pick on the GPU
at hand; ``combine_depth`` overrides the module's COMBINE_DEPTH (the combine's loads in flight),
``nohoist`` turns the rowwise family's HOIST_ROW_FACTORS off (where the tree has it); ``tpr``
may be written ``TxR``: T threads a row, R rows a block (warp mode, T <= 32; default 1 row);
``prefetch`` written ``sU`` streams the row instead, U chunks a thread in flight (a row too long
for registers).
Each point: the launch's tunables, the relative error of every output against the diagram's
float64 reference (bound 1e-2), and the median time (CUDA events, L2 flushed, inputs rotated:
:mod:`napkin.bench.timing`) as microseconds and as a fraction of the copy rate over the minimal
bytes (X and dY read, dX written, the column vectors once). Written after every point; points past
the budget are skipped (said in the file).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

SAVES = {"rmsnorm0": set(), "rmsnorm": {"N_rstd"}, "layernorm": {"N_rstd", "N_mean"}}
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def inputs(name: str, r: int, x: int, seed: int, dtype: str = "bf16"):
    import torch

    from napkin.dtypes import torch_dtype

    t = torch_dtype(dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = (torch.randn(r, x, device="cuda", generator=g) * 2 + 0.5).to(t)
    env = {"X": X, "gamma": (torch.randn(x, device="cuda", generator=g) + 1).to(t),
           "beta": torch.randn(x, device="cuda", generator=g).to(t),
           "dY": torch.randn(r, x, device="cuda", generator=g).to(t)}
    X64 = X.double()
    lib = name.rstrip("0")
    if lib == "rmsnorm":
        env["N_rstd"] = torch.rsqrt((X64 * X64).mean(-1) + EPS[lib]).to(t)
    else:
        mu = X64.mean(-1)
        env["N_mean"] = mu.to(t)
        env["N_rstd"] = torch.rsqrt(((X64 - mu[:, None]) ** 2).mean(-1) + EPS[lib]).to(t)
    return env


def point(spec: str, copy_bps: float) -> dict:
    import torch

    import napkin.codegen.families.rowwise as rw
    from napkin.bench.timing import time_fn
    from napkin.codegen.api import compile
    from napkin.codegen.prepare import prepare
    from napkin.diagrams import library
    from napkin.dtypes import dtype as lookup_dtype

    f = spec.split(":")
    name, _, dtype = f[0].partition("@")
    dtype = dtype or "bf16"
    r, x = int(f[1]), int(f[2])
    lib = name.rstrip("0")
    rec = {"spec": spec}
    depth0 = rw.COMBINE_DEPTH
    squeeze0 = rw.MAX_SQUEEZE
    hoist0 = getattr(rw, "HOIST_ROW_FACTORS", None)
    try:
        if len(f) > 8 and f[8] == "nohoist":
            rw.HOIST_ROW_FACTORS = False
        if len(f) > 6 and f[6]:
            bps = int(f[6])
        else:
            bps = None
        if len(f) > 7 and f[7]:
            rw.COMBINE_DEPTH = int(f[7])
        grad = library.get(lib).grad(save=SAVES[name])
        schedule = None
        if len(f) > 3:
            rw.MAX_SQUEEZE = 1000  # explicit points may cut the budget further than the family allows
            d = prepare(grad, sizes=dict(r=r, x=x), dtype=dtype)
            s = rw.analyse(d)
            tpr, _, rpb = f[3].partition("x")
            if f[5].startswith("s"):
                cfg = rw.make_chain_config(s, int(tpr), int(rpb or 1), int(f[5][1:]), splits=int(f[4]),
                                           blocks_per_sm=bps)
            else:
                cfg = rw.make_chain_config(s, int(tpr), int(rpb or 1), splits=int(f[4]), prefetch=int(f[5]),
                                           blocks_per_sm=bps)
            schedule = rw.chain_schedule_for(s, cfg, "h100")
        cd = compile(grad, sizes=dict(r=r, x=x), dtype=dtype, schedule=schedule,
                     family="rowwise" if schedule is not None else None)
        rec["kernels"] = [k.family for k in cd.plan.kernels]
        rec["passes"] = [len(set(re.findall(r"// ---- pass \d+", k.source))) for k in cd.launches]
        rec["tunables"] = [dict(k.tunables) for k in cd.launches]
        rec["regs"] = [k.model_regs_per_thread for k in cd.launches]
        sets = [inputs(name, r, x, seed, dtype) for seed in range(3)]
        args = [tuple(e[n] for n in cd.input_names) for e in sets]
        got = cd(*args[0])
        got = got if isinstance(got, tuple) else (got,)
        ref = cd.diagram.reference({n: sets[0][n].double() for n in cd.input_names}, dtype=torch.float64)
        rec["rel_err"] = {n: float(torch.linalg.vector_norm(g.double() - ref[n]) / torch.linalg.vector_norm(ref[n]))
                          for n, g in zip(cd.output_names, got)}
        again = cd(*args[0])
        again = again if isinstance(again, tuple) else (again,)
        rec["same_bits"] = all(torch.equal(a, b) for a, b in zip(got, again))
        rec["bits"] = [float(g.double().sum()) for g in got]  # a fingerprint to compare trees
        t = time_fn(lambda *a: cd(*a), warmup=10, reps=60, rotate=args)
        rec["us"] = t.median_s * 1e6
        vectors = 2 if lib == "rmsnorm" else 3
        size = lookup_dtype(dtype).bytes
        rec["copy_fraction"] = size * (3 * r * x + vectors * x) / t.median_s / copy_bps
        del ref, got, again, sets, args
    except Exception as e:  # noqa: BLE001 - reported, the other points still run
        rec["error"] = f"{type(e).__name__}: {e}"[:400]
    finally:
        rw.COMBINE_DEPTH = depth0
        rw.MAX_SQUEEZE = squeeze0  # a later point's planner pick is the family's own again
        if hoist0 is not None:
            rw.HOIST_ROW_FACTORS = hoist0
    torch.cuda.empty_cache()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--out", default="norm_backward_sweep.json")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no point after this many seconds")
    ap.add_argument("--copy-bps", type=float, default=None, help="the copy rate (default: measured)")
    a = ap.parse_args()
    from napkin.bench.timing import copy_bandwidth

    t0 = time.time()
    copy_bps = a.copy_bps or copy_bandwidth()
    out = {"copy_bps": copy_bps, "points": [], "skipped": []}
    for spec in a.specs:
        if time.time() - t0 > a.budget_s:
            out["skipped"].append(spec)
            continue
        rec = point(spec, copy_bps)
        out["points"].append(rec)
        print(json.dumps(rec), flush=True)
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=1)
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
