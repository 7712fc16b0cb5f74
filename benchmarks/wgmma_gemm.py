#!/usr/bin/env python3
"""The Hopper GEMM (``matmul_wgmma.cu.jinja``) against cuBLAS and eager PyTorch, one device call.

Cases: 4096³ and 8192³ matmul, the ``matmul``, ``matmul_t`` and ``batched_matmul`` library
diagrams at their default sizes, and ``examples/my_diagram.py:swiglu`` at a=4096, b=4096,
f=11008 (the dual gate·up kernel and the down projection) and a 1024 x 4096 x 1024 matmul, each
with the planner's plan and with every wgmma configuration forced (cooperative and ping-pong;
``--forced`` picks the shapes: 4096^3 matmul, matmul_t, batched, swiglu's down projection, its
dual gate·up kernel, the small matmul). Each output is checked against the baseline
(relative error, no NaN left in a NaN-poisoned output) before it is timed with
:func:`napkin.bench.timing.time_fn` (CUDA events, L2 flushed before every run, median).

    PYTHONPATH=. python3 benchmarks/wgmma_gemm.py --out $OUT/wgmma_gemm.json [--quick]

Prints one line per case and writes every number to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SWIGLU = (str(ROOT / "examples" / "my_diagram.py") + ":swiglu", dict(a=4096, b=4096, f=11008))


def cases(quick: bool, forced: str = "matmul"):
    """(label, diagram spec, sizes, forced wgmma configuration (a MatmulConfig) or None, FLOPs)."""
    from napkin.codegen.families.contraction import (DUAL_CONFIGS, DUAL_PINGPONG_CONFIGS, WGMMA_CONFIGS,
                                                     WGMMA_PINGPONG_CONFIGS, MatmulConfig)

    def mm(n, a, b, c):
        return 2.0 * n * a * b * c

    out = [("matmul 4096^3", "matmul", dict(a=4096, b=4096, c=4096), None, mm(1, 4096, 4096, 4096)),
           ("matmul 8192^3", "matmul", dict(a=8192, b=8192, c=8192), None, mm(1, 8192, 8192, 8192)),
           ("matmul_t 4096^3", "matmul_t", dict(a=4096, b=4096, c=4096), None, mm(1, 4096, 4096, 4096)),
           ("batched 8x2048^3", "batched_matmul", dict(n=8, a=2048, b=2048, c=2048), None, mm(8, 2048, 2048, 2048)),
           ("swiglu 4096x4096x11008", SWIGLU[0], SWIGLU[1], None, 3 * mm(1, 4096, 4096, 11008)),
           ("swiglu gate.up (dual)", "gate_up", SWIGLU[1], None, 2 * mm(1, 4096, 4096, 11008)),
           ("swiglu down (matmul_t)", "matmul_t", dict(a=4096, b=11008, c=4096), None, mm(1, 4096, 11008, 4096)),
           ("matmul 1024x4096x1024", "matmul", dict(a=1024, b=4096, c=1024), None, mm(1, 1024, 4096, 1024))]
    plain = [MatmulConfig(False, *c, wgmma=True) for c in WGMMA_CONFIGS] + \
        [MatmulConfig(False, *c, wgmma=True, pingpong=True) for c in WGMMA_PINGPONG_CONFIGS]
    dual = [MatmulConfig(False, *c, wgmma=True, dual=True) for c in DUAL_CONFIGS] + \
        [MatmulConfig(False, *c, wgmma=True, dual=True, pingpong=True) for c in DUAL_PINGPONG_CONFIGS]
    shapes = {"matmul": [("matmul 4096^3", "matmul", dict(a=4096, b=4096, c=4096), mm(1, 4096, 4096, 4096))],
              "matmul_t": [("matmul_t 4096^3", "matmul_t", dict(a=4096, b=4096, c=4096), mm(1, 4096, 4096, 4096))],
              "batched": [("batched 8x2048^3", "batched_matmul", dict(n=8, a=2048, b=2048, c=2048),
                           mm(8, 2048, 2048, 2048))],
              "down": [("swiglu down", "matmul_t", dict(a=4096, b=11008, c=4096), mm(1, 4096, 11008, 4096))],
              "gate_up": [("swiglu gate.up", "gate_up", SWIGLU[1], 2 * mm(1, 4096, 4096, 11008))],
              "small": [("matmul 1024x4096x1024", "matmul", dict(a=1024, b=4096, c=1024), mm(1, 1024, 4096, 1024))]}
    for key in filter(None, forced.split(",")):
        for label, spec, sizes, flops in shapes[key]:
            for c in (dual if key == "gate_up" else plain)[:1 if quick else None]:
                kind = "pp" if c.pingpong else "coop"
                out.append((f"{label} {kind} {c.BM}x{c.BN} s{c.stages}", spec, sizes, c, flops))
    return out


def load(spec: str):
    if spec == "gate_up":
        return gate_up()
    from napkin.cli_common import load

    return load(spec)


def gate_up():
    """swiglu's first kernel alone: silu(X·Wgᵀ) ⊙ X·Wuᵀ (the dual wgmma kernel)."""
    from napkin.diagrams import Diagram, array, axes, contract, silu

    a, b, f = axes("a b f")
    X, Wg, Wu = array("X", a, b), array("Wg", f, b), array("Wu", f, b)
    G = silu(contract(X, Wg, over=b, out=(a, f), name="G_lin"), name="G")
    U = contract(X, Wu, over=b, out=(a, f), name="U")
    return Diagram("gate_up", (G * U).named("H"))


def eager_fn(d, name: str):
    """cuBLAS (torch.matmul) for the matmuls, the diagram's PyTorch reference for the rest."""
    import torch

    from napkin.bench.baselines import traceable_reference

    if name in ("matmul", "batched_matmul"):
        return lambda A, B: torch.matmul(A, B)
    if name == "matmul_t":
        return lambda A, B: torch.matmul(A, B.mT)
    ref = traceable_reference(d)
    return ref


def run(case, reps: int):
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen.api import compile as compile_diagram
    from napkin.codegen.families.contraction import FAMILY

    label, spec, sizes, cfg, flops = case
    base = load(spec)
    d = base.with_dtype("bf16").bind(**sizes)
    sched = FAMILY.schedule(d, cfg) if cfg is not None else None
    cd = compile_diagram(d, schedule=sched, family="contraction" if cfg is not None else None, gpu="h100")
    row = dict(label=label, sizes=sizes,
               kernels=[dict(name=k.name, grid=k.grid, tunables=dict(k.tunables)) for k in cd.program.launches])
    g = torch.Generator(device="cuda").manual_seed(1234)
    inputs = {v.name: torch.randn(tuple(a.bound_size for a in v.axes), generator=g, device="cuda").to(torch.bfloat16)
              for v in d.inputs}
    names = [v.name for v in d.inputs]
    out = cd.empty_outputs(fill=float("nan"))
    fn = lambda: cd(**inputs, out=out)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    y = out[cd.output_names[0]]
    ref_fn = eager_fn(d, base.name)
    args = [inputs[n] for n in names]
    ref = ref_fn(*args)
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    ref = ref[cd.output_names[0]] if isinstance(ref, dict) else ref
    row["nan"] = int((~torch.isfinite(y.float())).sum())
    row["rel_err"] = float(torch.linalg.vector_norm(y.float() - ref.float().reshape(y.shape))
                           / torch.linalg.vector_norm(ref.float()))
    del ref
    t = time_fn(fn, warmup=10, reps=reps, max_time_s=3.0)
    e = time_fn(lambda: ref_fn(*args), warmup=10, reps=reps, max_time_s=3.0)
    row.update(napkin_us=t.median_s * 1e6, eager_us=e.median_s * 1e6, napkin_tflops=flops / t.median_s / 1e12,
               eager_tflops=flops / e.median_s / 1e12, ratio=e.median_s / t.median_s)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("wgmma_gemm.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--forced", default="matmul", help="shapes to run with every wgmma configuration forced: "
                    "comma-separated of matmul, matmul_t, batched, down, gate_up, small (empty: none)")
    ap.add_argument("--variant", default="", help="module settings of the contraction family to try, "
                    "e.g. WGMMA_CLUSTER=2,GROUP_M=16")
    args = ap.parse_args(argv)
    import torch

    import napkin.codegen.families.contraction as contraction

    for item in filter(None, args.variant.split(",")):
        key, value = item.split("=")
        if not hasattr(contraction, key):
            print(f"variant {key} is not a setting of this checkout; skipped", flush=True)
            continue
        setattr(contraction, key, int(value) if value.isdigit() else value)

    from dev_kernels import precompile

    from napkin.codegen.families.contraction import FAMILY
    from napkin.codegen.lower import lower
    from napkin.kernels.compile import detect_arch

    chosen = [c for c in cases(args.quick, args.forced) if not args.only or any(k in c[0] for k in args.only.split(","))]
    arch = detect_arch()
    programs = []
    for label, spec, sizes, cfg, _ in chosen:  # every kernel compiled first, in parallel
        try:
            d = load(spec).with_dtype("bf16").bind(**sizes)
            if cfg is None:
                programs.append(lower(d, gpu="h100", arch=arch))
            else:
                programs.append(lower(d, FAMILY.schedule(d, cfg), gpu="h100",
                                      family="contraction", arch=arch))
        except Exception as e:  # noqa: BLE001
            print(f"lowering {label} failed: {e}", flush=True)
    precompile(programs, arch, 16)
    # the clocks up before anything is timed (an idle GPU starts slow)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 1.5:
        for _ in range(10):
            x @ x
        torch.cuda.synchronize()
    del x
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"),
                variant=args.variant)
    for case in chosen:
        t0 = time.time()
        try:
            row = run(case, args.reps)
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            row = dict(label=case[0], error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=6))
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        if "error" in row:
            print(f"{row['label']:36s} ERROR {row['error'][:300]}", flush=True)
        else:
            print(f"{row['label']:36s} {row['napkin_us']:9.1f} us {row['napkin_tflops']:6.1f} TF/s  eager "
                  f"{row['eager_us']:9.1f} us {row['eager_tflops']:6.1f} TF/s  x{row['ratio']:.3f}  err "
                  f"{row['rel_err']:.1e} nan {row['nan']}  {[k['name'][:40] for k in row['kernels']]}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    bad = [r for r in rows if "error" in r or r.get("nan") or not math.isfinite(r.get("rel_err", math.nan))
           or r.get("rel_err", 1.0) > 2e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
