#!/usr/bin/env python3
"""fp32 contractions against cuBLAS fp32 (TF32 off), speed and accuracy, in one device call.

Issue #12's target: matmuls of any shape >= 0.9x cuBLAS in fp32 too. fp32 runs on
``matmul_simt.cu.jinja``: 3xTF32 on mma.sync (engine ``mma.sync``) or fp32 FMA (engine
``simt``). Each case is a square, odd, transposed, batched, huge-K or matrix-vector shape with
the planner's plan, and at 4096^3 every configuration of both engines forced. Every output (and
cuBLAS's) is compared with the float64 product of the same inputs: the relative error
``||y - y64|| / ||y64||`` and the largest element error over the largest element of y64, so a
kernel is as accurate as cuBLAS fp32 when its errors are of the same size. A NaN-poisoned output
must come back finite. Times are medians of CUDA-event runs with L2 flushed before each
(:func:`napkin.bench.timing.time_fn`). The baseline is ``torch.matmul`` in fp32 with
``torch.backends.cuda.matmul.allow_tf32`` False (checked): cuBLAS's own fp32 kernels.

    PYTHONPATH=. python3 benchmarks/fp32_matmul.py --out $OUT/fp32_matmul.json [--quick] [--only 4096] [--probe]
        [--settings TF32X3_KSUM=8]   (the contraction module's settings, for every case)

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


def a_transposed():
    """Y[a,c] = sum_b A[b,a] B[b,c]: the rows operand stored with the sum's axis first."""
    from napkin.diagrams import Diagram, array, axes, contract

    a, b, c = axes("a b c")
    return Diagram("matmul_at", contract(array("A", b, a), array("B", b, c), over=b, out=(a, c), name="Y"))


def matvec():
    """y[a] = sum_k A[a,k] x[k] (operator_survey's matvec)."""
    from napkin.diagrams import Diagram, array, axes, contract

    a, k = axes("a k")
    return Diagram("matvec", contract(array("A", a, k), array("x", k), over=k, name="y"))


def gemm_bias_gelu():
    from napkin.diagrams import Diagram, array, axes, contract, gelu

    a, b, c = axes("a b c")
    Y = contract(array("X", a, b), array("W", c, b), over=b, out=(a, c), name="L")
    return Diagram("gemm_bias_gelu", gelu(Y + array("bias", c), name="Y"))


#: baselines on the inputs in the diagram's order (cuBLAS for the contraction)
def _baseline(name):
    import torch

    return {
        "matmul": lambda A, B: torch.matmul(A, B),
        "matmul_t": lambda A, B: torch.matmul(A, B.mT),
        "batched_matmul": lambda A, B: torch.matmul(A, B),
        "matmul_at": lambda A, B: torch.matmul(A.mT, B),
        "matvec": lambda A, x: torch.mv(A, x),
        "gemm_bias_gelu": lambda X, W, bias: torch.nn.functional.gelu(torch.nn.functional.linear(X, W, bias)),
    }[name]


def cases(quick: bool):
    """(label, diagram builder, sizes, forced (engine, config) or None)."""
    from napkin.codegen.families.contraction import SIMT_CONFIGS, TF32X3_CONFIGS
    from napkin.diagrams import library

    lib = library.get
    s4k = dict(a=4096, b=4096, c=4096)
    out = [
        ("matmul 4096^3", lambda: lib("matmul"), s4k, None),
        ("matmul 8192^3", lambda: lib("matmul"), dict(a=8192, b=8192, c=8192), None),
        ("matmul_t 4096^3 (B[c,b])", lambda: lib("matmul_t"), s4k, None),
        ("A[b,a] 4096^3", a_transposed, s4k, None),
        ("matmul odd 4095x1023x4097", lambda: lib("matmul"), dict(a=4095, b=1023, c=4097), None),
        ("matmul_t odd 4095x1023x4097", lambda: lib("matmul_t"), dict(a=4095, b=1023, c=4097), None),
        ("A[b,a] odd 4095x1023x4097", a_transposed, dict(a=4095, b=1023, c=4097), None),
        ("batched 32x512^3", lambda: lib("batched_matmul"), dict(n=32, a=512, b=512, c=512), None),
        ("batched 8x2048^3", lambda: lib("batched_matmul"), dict(n=8, a=2048, b=2048, c=2048), None),
        ("huge K 256x262144x256", lambda: lib("matmul"), dict(a=256, b=262144, c=256), None),
        ("matmul c=1 16384x16384x1", lambda: lib("matmul"), dict(a=16384, b=16384, c=1), None),
        ("matvec 16384x16384", matvec, dict(a=16384, k=16384), None),
        ("matmul 1000x520x776", lambda: lib("matmul"), dict(a=1000, b=520, c=776), None),
        ("gemm+bias+gelu 4096^3", gemm_bias_gelu, s4k, None),
    ]
    forced = [("mma.sync", c) for c in TF32X3_CONFIGS] + [("simt", c) for c in SIMT_CONFIGS]
    for eng, c in forced if not quick else forced[:1] + forced[-2:-1]:
        out.append((f"matmul 4096^3 {eng} {c[0]}x{c[1]}x{c[2]}", lambda: lib("matmul"), s4k, (eng, c)))
    if not quick:
        for eng, c in forced[:3]:
            out.append((f"matmul_t odd {eng} {c[0]}x{c[1]}x{c[2]}", lambda: lib("matmul_t"),
                        dict(a=4095, b=1023, c=4097), (eng, c)))
    return out


def probe_cases():
    """The shapes once far below target with other candidates forced (3xTF32 unless named):
    narrow tiles for one output column, split counts for the long sum, smaller tiles and splits
    for the small product."""
    from napkin.codegen.families.contraction import TF32X3_CONFIGS, TF32X3_NARROW_CONFIGS
    from napkin.diagrams import library

    mm = lambda: library.get("matmul")  # noqa: E731
    t0, t1, t2 = TF32X3_CONFIGS[:3]
    small = (64, 32, 16, 32, 16, 2, 4)  # 4 warps of 32 x 16 (more blocks for a small product)
    out = []
    for c in TF32X3_NARROW_CONFIGS:
        out.append((f"c=1 {c[0]}x{c[1]}x{c[2]}", mm, dict(a=16384, b=16384, c=1), ("mma.sync", c)))
    for c, n in ((t0, 33), (t0, 64), (t1, 33), (t1, 64), (t1, 16), (t2, 49), (t2, 24)):
        out.append((f"huge K {c[0]}x{c[1]}x{c[2]} x{n}", mm, dict(a=256, b=262144, c=256), ("mma.sync", c, n)))
    for c, n in ((t1, 1), (t2, 1), (small, 1), (t1, 2), (t2, 2), (small, 2), (t0, 2), (t1, 4)):
        out.append((f"1000x520x776 {c[0]}x{c[1]}x{c[2]} x{n}", mm, dict(a=1000, b=520, c=776), ("mma.sync", c, n)))
    return out


class settings:
    """The contraction module's settings ``KEY=VALUE;...`` while the block runs."""

    def __init__(self, text: str):
        import napkin.codegen.families.contraction as con

        self.con = con
        self.items = [kv.split("=") for kv in filter(None, text.split(";"))]

    def __enter__(self):
        self.old = {k: getattr(self.con, k) for k, _ in self.items}
        for k, v in self.items:
            setattr(self.con, k, int(v) if v.isdigit() else v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(self.con, k, v)


def _config(forced):
    from napkin.codegen.families.contraction import MatmulConfig

    eng, c, *splits = forced
    return MatmulConfig(True, *c, tf32x3=eng == "mma.sync", splits=splits[0] if splits else 1)


def run(case, reps: int, programs: dict):
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen.api import compile as compile_diagram
    from napkin.codegen.families.contraction import FAMILY

    (label, build, sizes, forced), setting = case
    base = build()
    d = base.with_dtype("fp32").bind(**sizes)
    sched = FAMILY.schedule(d, _config(forced)) if forced else None
    with settings(setting):
        cd = compile_diagram(d, schedule=sched, family="contraction" if forced else None, gpu="h100")
    row = dict(label=label, sizes=sizes,
               kernels=[dict(name=k.name, grid=k.grid, tunables=dict(k.tunables)) for k in cd.program.launches])
    g = torch.Generator(device="cuda").manual_seed(1234)
    inputs = {v.name: torch.randn(tuple(a.bound_size for a in v.axes), generator=g, device="cuda")
              for v in d.inputs}
    args = [inputs[v.name] for v in d.inputs]
    out = cd.empty_outputs(fill=float("nan"))
    fn = lambda: cd(**inputs, out=out)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    y = out[cd.output_names[0]]
    ref_fn = _baseline(base.name)
    blas = ref_fn(*args)
    ref = ref_fn(*[a.double() for a in args]).reshape(y.shape)
    scale = float(ref.abs().max())
    norm = float(torch.linalg.vector_norm(ref))
    for who, val in (("napkin", y), ("cublas", blas.reshape(y.shape))):
        diff = val.double() - ref
        row[f"{who}_rel_err"] = float(torch.linalg.vector_norm(diff)) / norm
        row[f"{who}_max_err"] = float(diff.abs().max()) / scale
    row["nan"] = int((~torch.isfinite(y)).sum())
    del ref, blas
    t = time_fn(fn, warmup=10, reps=reps, max_time_s=3.0)
    e = time_fn(lambda: ref_fn(*args), warmup=10, reps=reps, max_time_s=3.0)
    flops = 2.0 * math.prod(sizes.values())
    row.update(napkin_us=t.median_s * 1e6, cublas_us=e.median_s * 1e6, napkin_tflops=flops / t.median_s / 1e12,
               cublas_tflops=flops / e.median_s / 1e12, ratio=e.median_s / t.median_s)
    pred = programs.get(label)
    if pred is not None:
        row["pred_us"] = pred * 1e6
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fp32_matmul.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--probe", action="store_true", help="also the far-below shapes with other candidates forced")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--settings", default="", help="contraction module settings KEY=VALUE;... for every case")
    args = ap.parse_args(argv)
    import torch

    if torch.backends.cuda.matmul.allow_tf32:
        print("torch.backends.cuda.matmul.allow_tf32 is True: the baseline would not be fp32", flush=True)
        return 2
    from dev_kernels import precompile

    from napkin.codegen.families.contraction import FAMILY
    from napkin.codegen.lower import lower
    from napkin.codegen.select import predict_schedule
    from napkin.kernels.compile import detect_arch

    chosen = [c for c in cases(args.quick) + (probe_cases() if args.probe else [])
              if not args.only or any(k in c[0] for k in args.only.split(","))]
    arch = detect_arch()
    programs, preds = [], {}
    setting = args.settings
    for label, build, sizes, forced in chosen:  # every kernel compiled first, in parallel
        try:
            d = build().with_dtype("fp32").bind(**sizes)
            with settings(setting):
                prog = (lower(d, gpu="h100", arch=arch) if forced is None else
                        lower(d, FAMILY.schedule(d, _config(forced)), gpu="h100", family="contraction", arch=arch))
                programs.append(prog)
                if len(prog.schedule.kernels) == 1 and prog.family == "contraction":
                    preds[label] = predict_schedule(d, FAMILY, prog.schedule, "h100").seconds
        except Exception as e:  # noqa: BLE001
            print(f"lowering {label} failed: {e}", flush=True)
    precompile(programs, arch, 16)
    x = torch.randn(8192, 8192, device="cuda")  # the clocks up before anything is timed
    t0 = time.time()
    while time.time() - t0 < 1.5:
        for _ in range(4):
            x @ x
        torch.cuda.synchronize()
    del x
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"),
                allow_tf32=torch.backends.cuda.matmul.allow_tf32, settings=setting)
    for case in chosen:
        t0 = time.time()
        try:
            row = run((case, setting), args.reps, preds)
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            row = dict(label=case[0], error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=6))
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        if "error" in row:
            print(f"{row['label']:40s} ERROR {row['error'][:300]}", flush=True)
        else:
            pred = f" pred {row['pred_us']:8.1f}" if "pred_us" in row else ""
            print(f"{row['label']:40s} {row['napkin_us']:9.1f} us {row['napkin_tflops']:5.1f} TF/s  cuBLAS "
                  f"{row['cublas_us']:9.1f} us {row['cublas_tflops']:5.1f}  x{row['ratio']:.3f}{pred}  err "
                  f"{row['napkin_rel_err']:.1e}/{row['napkin_max_err']:.1e} (cuBLAS {row['cublas_rel_err']:.1e}/"
                  f"{row['cublas_max_err']:.1e}) nan {row['nan']}  {[k['name'][:44] for k in row['kernels']]}",
                  flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    bad = [r for r in rows if "error" in r or r.get("nan") or not r.get("napkin_rel_err", 1.0) <= 1e-5]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
