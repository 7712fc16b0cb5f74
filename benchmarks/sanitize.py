#!/usr/bin/env python3
"""Run one generated kernel of every family at edge shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 9 python3 benchmarks/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 benchmarks/sanitize.py

Each case compiles the kernel napkin generates for a library diagram at sizes that are not tile
multiples, runs it on random inputs with NaN-poisoned outputs and checks it against the float64
reference, so the sanitizer sees real launches and a wrong result still fails the run.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [
    ("rowwise", "softmax", {"r": 5, "x": 1000}, "bf16"),
    ("rowwise", "layernorm", {"r": 3, "x": 4100}, "bf16"),
    ("contraction", "matmul", {"a": 77, "b": 72, "c": 40}, "bf16"),  # wgmma + TMA on sm_90
    ("contraction", "matmul", {"a": 77, "b": 72, "c": 42}, "bf16"),  # 84-byte rows: mma.sync
    ("contraction", "mlp", {"a": 65, "b": 64, "c": 136}, "bf16"),
    ("attention", "attention_causal", {"h": 2, "q": 77, "x": 77, "d": 64}, "bf16"),
    ("attention", "gqa", {"h": 1, "j": 2, "q": 45, "x": 45, "d": 128}, "bf16"),
    ("fallback", "transformer_block", {"q": 9, "e": 16, "h": 2, "d": 8, "f": 24}, "fp32"),
    # the planner's own choice: several kernels of several families, HBM buffers between them
    (None, "transformer_block", {"q": 77, "e": 72, "h": 2, "d": 64, "f": 136}, "bf16"),
]


def main() -> int:
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams import library
    from napkin.diagrams.reference import random_inputs

    failures = 0
    for family, name, sizes, dtype in CASES:
        d = library.get(name).with_dtype(dtype).bind(sizes)
        try:
            k = napkin_compile(d, family=family)
            ins = random_inputs(d, device="cuda", seed=1)
            args = [ins[n] for n in d.input_names]
            outs = k.empty_outputs("cuda", float("nan")) if hasattr(k, "empty_outputs") else None
            got = k(*args, out=outs) if outs is not None else k(*args)
            torch.cuda.synchronize()
            got = got if isinstance(got, tuple) else (got,)
            ref = d.reference({n: a.double() for n, a in zip(d.input_names, args)}, dtype=torch.float64)
            if k.plan is not None and len(k.plan.kernels) > 1:
                # several kernels pass bf16 intermediates through HBM: judge against the reference
                # rounded at the same boundaries (napkin.codegen.verify.boundary_reference)
                from napkin.codegen.verify import boundary_reference

                ref = boundary_reference(k.plan, dict(zip(d.input_names, args)))
            for n, g in zip(d.output_names, got):
                r = ref[n]
                err = float((g.double() - r).norm() / r.norm())
                ok = err < (1e-5 if dtype == "fp32" else 2e-2) and bool(torch.isfinite(g).all())
                print(f"{family or 'planned':12s} {name:18s} {n}: rel err {err:.2e} {'ok' if ok else 'FAIL'} ({k.family})")
                failures += not ok
        except Exception as e:  # a case that cannot run is a failure, reported, not a crash
            print(f"{family or 'planned':12s} {name:18s} ERROR {type(e).__name__}: {str(e)[:300]}")
            failures += 1
    print(f"{len(CASES)} cases, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
