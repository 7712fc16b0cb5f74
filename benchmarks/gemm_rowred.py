#!/usr/bin/env python3
"""GEMM -> a row reduction wider than a tile (sum, logsumexp, softmax over c of A·Bᵀ): napkin's
split form (each wgmma block's rows reduced to fp32 partials, a second launch combining them),
the planner's pick, napkin's previous plan (the GEMM writing the logits, then a row-wise kernel)
and eager PyTorch, in one device call.

    PYTHONPATH=. python3 benchmarks/gemm_rowred.py --out $OUT/gemm_rowred.json [--quick] [--survey]
        [--kinds sum,logsumexp] [--plans planned,split]

``--survey`` adds the operator survey's GEMM -> map -> row reduction problems
(``gemm_sigmoid_sum``, ``gemm_relu_max``: 8192 x 1024 x 1024, a map before the reduction) with the
same three plans; ``--kinds`` and ``--plans`` time only those reductions and plans.

Each napkin output is checked against eager PyTorch in float32 on the same bf16 inputs (relative
error, no NaN left in the NaN-poisoned output) before it is timed with
:func:`napkin.bench.timing.time_fn` (CUDA events, L2 flushed before every run, median). The
model's prediction of each plan is printed beside its time.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [dict(a=4096, b=4096, c=11008), dict(a=8192, b=1024, c=32000)]


def diagram(kind: str):
    from napkin.diagrams import Axis, Diagram, array, contract, logsumexp
    from napkin.diagrams.ops import reduce, softmax

    a, b, c = Axis("a"), Axis("b"), Axis("c")
    L = contract(array("A", a, b), array("B", c, b), over=b, out=(a, c), name="L")
    if kind == "softmax":
        return Diagram("gemm_softmax_rows", softmax(L, c, name="Y"))
    if kind == "logsumexp":
        return Diagram("gemm_logsumexp_rows", logsumexp(L, c, name="Y"))
    return Diagram(f"gemm_{kind}_rows", reduce(L, c, kind, name="Y"))


def eager(kind: str):
    import torch

    def f(A, B):
        L = A @ B.T
        if kind == "softmax":
            return torch.softmax(L, dim=-1)
        if kind == "logsumexp":
            return torch.logsumexp(L, dim=-1)
        return L.sum(dim=-1)
    return f


def plans(d):
    """(label, plan): the planner's, the split forced (the contraction family alone) and the
    previous one (the row reduction refused in the epilogue: the GEMM and a row-wise kernel)."""
    from napkin.codegen.families.contraction import ContractionFamily
    from napkin.codegen.planner import derive

    out = [("planned", derive(d, gpu="h100", explain=False).plan),
           ("split", derive(d, gpu="h100", explain=False, families=["contraction"]).plan)]
    keep = ContractionFamily.rowred_reason
    ContractionFamily.rowred_reason = lambda *a, **k: "refused for the comparison"
    try:
        out.append(("previous", derive(d, gpu="h100", explain=False).plan))
    finally:
        ContractionFamily.rowred_reason = keep
    return out


SURVEY = ("gemm_sigmoid_sum", "gemm_relu_max")


def survey_cases():
    """(label, diagram bound in bf16, eager function of (A, B)) of the survey's problems: Y[a] =
    R over n of f(A[a, k]·B[k, n]) (B stored k-major, as the survey writes it)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import operator_survey as S

    fns = {"gemm_sigmoid_sum": lambda A, B: torch.sigmoid(A @ B).sum(dim=-1),
           "gemm_relu_max": lambda A, B: torch.relu(A @ B).amax(dim=-1)}
    for name in SURVEY:
        sizes = S.PROBLEMS[name]
        yield name, getattr(S, name)().with_dtype("bf16").bind(**sizes), fns[name], sizes


def _pick(text: str | None, known, what: str) -> tuple[str, ...]:
    if not text:
        return tuple(known)
    got = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in got if x not in known]
    if bad:
        raise SystemExit(f"gemm_rowred.py: unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--survey", action="store_true", help="also the survey's gemm_sigmoid_sum and gemm_relu_max")
    ap.add_argument("--kinds", help="comma-separated reductions to time (sum, logsumexp, softmax; none: all)")
    ap.add_argument("--plans", help="comma-separated plans to time (planned, split, previous; none: all)")
    args = ap.parse_args()
    kinds = _pick(args.kinds, ("sum", "logsumexp", "softmax"), "reduction")
    labels = _pick(args.plans, ("planned", "split", "previous"), "plan")
    import torch

    from napkin.bench.timing import time_fn
    from napkin.codegen.api import compile as compile_diagram

    cases = []
    for shape in SHAPES[:1] if args.quick else SHAPES:
        M, K, N = shape["a"], shape["b"], shape["c"]
        for kind in kinds:
            cases.append((kind, diagram(kind).with_dtype("bf16").bind(**shape), eager(kind), shape,
                          (M, K), (N, K)))
    if args.survey:
        for name, d, f, sizes in survey_cases():
            cases.append((name, d, f, sizes, (sizes["a"], sizes["k"]), (sizes["k"], sizes["n"])))
    rows = []
    for kind, d, f, shape, a_shape, b_shape in cases:
        (M, K), N = a_shape, shape.get("c", shape.get("n"))
        torch.manual_seed(0)
        A = torch.randn(*a_shape, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(*b_shape, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        ref = f(A.float(), B.float())
        te = time_fn(lambda: f(A, B), warmup=3, reps=20, max_time_s=1.0)
        line = dict(shape=shape, kind=kind, eager_us=te.median_s * 1e6)
        for label, plan in plans(d):
            if label not in labels:
                continue
            try:
                k = compile_diagram(d, plan=plan)
                outs = k.empty_outputs(device="cuda", fill=float("nan"))
                out = outs["Y"]
                k(A, B, out=outs)
                torch.cuda.synchronize()
                nans = int(torch.isnan(out).sum().item())
                err = float((out.float() - ref).norm() / ref.norm())
                t = time_fn(lambda: k(A, B), warmup=3, reps=20, max_time_s=1.0)
                line[label] = dict(us=t.median_s * 1e6, predicted_us=plan.seconds * 1e6, err=err, nans=nans,
                                   kernels=[x.name for x in k.program.launches])
            except Exception as e:  # noqa: BLE001 - a plan that fails is reported, not a crash
                traceback.print_exc()
                line[label] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(line)
        parts = [f"{M}x{K}x{N} {kind:9s} eager {line['eager_us']:8.1f} us"]
        for label in labels:
            r = line[label]
            parts.append(f"{label} {r['us']:8.1f} us (model {r['predicted_us']:7.1f}, err {r['err']:.1e}, "
                         f"{len(r['kernels'])} k{', NaN ' + str(r['nans']) if r['nans'] else ''})"
                         if "us" in r else f"{label} ERROR {r['error'][:80]}")
        print(" | ".join(parts), flush=True)
    Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
