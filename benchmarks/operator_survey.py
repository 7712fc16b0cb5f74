#!/usr/bin/env python3
"""A survey of operator problems as users write them, each against PyTorch eager (issue #12).

The issue's last target is measured outside the project, on a suite napkin never sees: operator
problems of the kind kernel benchmarks collect (matmul shapes, activations, reductions, norms,
GEMMs followed by an epilogue or a reduction, attention). This file is napkin's own stand-in, so
that the gaps show up here first: about forty such problems, each written with the builder API
the way a user would, in bf16 and fp32. For each it records napkin's time (the plan as derive
picks it, no autotuning), the time of the diagram's PyTorch reference run eagerly, the ratio, the
families of the plan's kernels (a kernel on the scalar fallback is named) and the check against
the float64 reference; the summary gives the geometric mean and the worst ratio.

Every diagram is a module-level function, so any of them also works on the command line::

    napkin derive benchmarks/operator_survey.py:gemm_logsumexp
    napkin bench benchmarks/operator_survey.py:softmax_first_axis --dtype fp32

Run as a script on a GPU (one JSON line per point, then the summary)::

    python3 benchmarks/operator_survey.py [--out survey.jsonl] [--dtypes bf16,fp32] [--only NAME,...] [--library]

``--library`` adds every library diagram at its default sizes and the examples' diagrams (bf16),
the issue's "every library and example diagram ≥ 1.0× eager" (their summary is its own line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve()


def _d():
    import napkin.diagrams as nd

    return nd


# ----------------------------------------------------------------------------- elementwise

def sigmoid_by_tanh():
    """σ(x) written as 0.5·tanh(x/2) + 0.5: three boxes, one kernel."""
    nd = _d()
    a, b = nd.axes("a b")
    X = nd.array("X", a, b)
    return nd.Diagram("sigmoid_by_tanh", (nd.tanh(X * 0.5) * 0.5 + 0.5).named("Y"))


def softplus_log():
    nd = _d()
    a, b = nd.axes("a b")
    X = nd.array("X", a, b)
    return nd.Diagram("softplus_log", nd.log(nd.softplus(X) + 1.0).named("Y"))


def hardswish_residual():
    nd = _d()
    a, b = nd.axes("a b")
    X, R = nd.array("X", a, b), nd.array("R", a, b)
    return nd.Diagram("hardswish_residual", (nd.hardswish(X) * 2.0 + R).named("Y"))


def leaky_relu_bias():
    """A bias broadcast along the rows, then leaky ReLU."""
    nd = _d()
    a, b = nd.axes("a b")
    X, bias = nd.array("X", a, b), nd.array("bias", b)
    return nd.Diagram("leaky_relu_bias", nd.leaky_relu(X + bias, 0.01).named("Y"))


def gelu_times_sigmoid():
    nd = _d()
    a, b = nd.axes("a b")
    X, G = nd.array("X", a, b), nd.array("G", a, b)
    return nd.Diagram("gelu_times_sigmoid", (nd.gelu(X) * nd.sigmoid(G)).named("Y"))


def mish_act():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("mish_act", nd.mish(nd.array("X", a, b), name="Y"))


def selu_hardtanh():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("selu_hardtanh", nd.hardtanh(nd.selu(nd.array("X", a, b)), -0.5, 0.5, name="Y"))


def channel_scale():
    """x[n, c, s]·g[c] + β[c]: per-channel affine over a middle axis."""
    nd = _d()
    n, c, s = nd.axes("n c s")
    X, g, beta = nd.array("X", n, c, s), nd.array("g", c), nd.array("beta", c)
    return nd.Diagram("channel_scale", (X * g + beta).named("Y"))


# ----------------------------------------------------------------------------- reductions

def sum_last():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("sum_last", nd.sum_over(nd.array("X", a, b), b, name="Y"))


def mean_middle():
    nd = _d()
    a, b, c = nd.axes("a b c")
    return nd.Diagram("mean_middle", nd.mean_over(nd.array("X", a, b, c), b, name="Y"))


def max_first():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("max_first", nd.max_over(nd.array("X", a, b), a, name="Y"))


def sum_two_axes():
    nd = _d()
    a, b, c = nd.axes("a b c")
    return nd.Diagram("sum_two_axes", nd.sum_over(nd.array("X", a, b, c), (a, c), name="Y"))


def min_middle():
    nd = _d()
    a, b, c = nd.axes("a b c")
    return nd.Diagram("min_middle", nd.min_over(nd.array("X", a, b, c), b, name="Y"))


def logsumexp_last():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("logsumexp_last", nd.logsumexp(nd.array("X", a, b), b, name="Y"))


# ----------------------------------------------------------------------------- norms

def softmax_last():
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("softmax_last", nd.softmax(nd.array("X", a, b), b, name="Y"))


def softmax_first_axis():
    """softmax over the outer axis: rows are strided (torch's softmax(dim=0))."""
    nd = _d()
    a, b = nd.axes("a b")
    return nd.Diagram("softmax_first_axis", nd.softmax(nd.array("X", a, b), a, name="Y"))


def layernorm_affine():
    nd = _d()
    a, b = nd.axes("a b")
    X, g, beta = nd.array("X", a, b), nd.array("gamma", b), nd.array("beta", b)
    return nd.Diagram("layernorm_affine", (nd.layernorm(X, b) * g + beta).named("Y"))


def rmsnorm_weight():
    nd = _d()
    a, b = nd.axes("a b")
    X, g = nd.array("X", a, b), nd.array("g", b)
    return nd.Diagram("rmsnorm_weight", (nd.rmsnorm(X, b) * g).named("Y"))


def rmsnorm_middle_axis():
    """RMS norm over channels of x[n, c, s] (a non-innermost axis)."""
    nd = _d()
    n, c, s = nd.axes("n c s")
    return nd.Diagram("rmsnorm_middle_axis", nd.rmsnorm(nd.array("X", n, c, s), c, name="Y"))


def l2_normalize_rows():
    nd = _d()
    a, b = nd.axes("a b")
    X = nd.array("X", a, b)
    return nd.Diagram("l2_normalize_rows", (X * nd.rsqrt(nd.sum_over(nd.square(X), b) + 1e-12)).named("Y"))


# ----------------------------------------------------------------------------- contractions

def _mm(nd, name, A_axes, B_axes, over, out=None):
    a, k, n = nd.axes("a k n")
    ax = {"a": a, "k": k, "n": n}
    A = nd.array("A", *(ax[x] for x in A_axes))
    B = nd.array("B", *(ax[x] for x in B_axes))
    return A, B, nd.contract(A, B, over=ax[over], out=out, name=name)


def matmul_square():
    nd = _d()
    return nd.Diagram("matmul_square", _mm(nd, "C", "ak", "kn", "k")[2])


def matmul_at():
    """Aᵀ·B with A stored [k, a] (an MN-major operand)."""
    nd = _d()
    return nd.Diagram("matmul_at", _mm(nd, "C", "ka", "kn", "k")[2])


def matmul_bt():
    """A·Bᵀ with B stored [n, k] (nn.Linear's weight)."""
    nd = _d()
    return nd.Diagram("matmul_bt", _mm(nd, "C", "ak", "nk", "k")[2])


def batched_matmul():
    nd = _d()
    z, a, k, n = nd.axes("z a k n")
    A, B = nd.array("A", z, a, k), nd.array("B", z, k, n)
    return nd.Diagram("batched_matmul", nd.contract(A, B, over=k, name="C"))


def matvec():
    nd = _d()
    a, k = nd.axes("a k")
    return nd.Diagram("matvec", nd.contract(nd.array("A", a, k), nd.array("x", k), over=k, name="y"))


def huge_k():
    nd = _d()
    return nd.Diagram("huge_k", _mm(nd, "C", "ak", "kn", "k")[2])


def gemm_bias_gelu():
    nd = _d()
    a, k, n = nd.axes("a k n")
    A, W, bias = nd.array("A", a, k), nd.array("W", n, k), nd.array("bias", n)
    return nd.Diagram("gemm_bias_gelu", nd.gelu(nd.contract(A, W, over=k, name="C") + bias, name="Y"))


def gemm_scale_residual():
    nd = _d()
    a, k, n = nd.axes("a k n")
    A, W, R = nd.array("A", a, k), nd.array("W", n, k), nd.array("R", a, n)
    return nd.Diagram("gemm_scale_residual", (nd.contract(A, W, over=k, name="C") * 0.5 + R).named("Y"))


def gemm_layernorm():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_layernorm", nd.layernorm(C, "n", name="Y"))


def gemm_logsumexp():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_logsumexp", nd.logsumexp(C, "n", name="Y"))


def gemm_softmax():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_softmax", nd.softmax(C, "n", name="Y"))


def gemm_column_sum():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_column_sum", nd.sum_over(C, "a", name="Y"))


def gemm_sigmoid_sum():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_sigmoid_sum", nd.sum_over(nd.sigmoid(C), "n", name="Y"))


def gemm_relu_max():
    nd = _d()
    _, _, C = _mm(nd, "C", "ak", "kn", "k")
    return nd.Diagram("gemm_relu_max", nd.max_over(nd.relu(C), "n", name="Y"))


def two_layer_mlp():
    nd = _d()
    a, b, f, e = nd.axes("a b f e")
    X, W1, W2 = nd.array("X", a, b), nd.array("W1", f, b), nd.array("W2", e, f)
    H = nd.relu(nd.contract(X, W1, over=b, name="H_lin"), name="H")
    return nd.Diagram("two_layer_mlp", nd.contract(H, W2, over=f, name="Y"))


def attention_wide_head():
    """softmax(Q·Kᵀ)·V with a 1024-wide head: beyond the attention template's head dims."""
    nd = _d()
    z, q, x, d = nd.axes("z q x d")
    Q, K, V = nd.array("Q", z, q, d), nd.array("K", z, x, d), nd.array("V", z, x, d)
    P = nd.softmax(nd.contract(Q, K, over=d, name="S"), x, name="P")
    return nd.Diagram("attention_wide_head", nd.contract(P, V, over=x, name="O"))


#: name → sizes (all problems are about 50–300 MiB of traffic, or seconds of FLOPs in fp32)
PROBLEMS: dict[str, dict[str, int]] = {
    "sigmoid_by_tanh": {"a": 8192, "b": 4096},
    "softplus_log": {"a": 8192, "b": 4096},
    "hardswish_residual": {"a": 8192, "b": 4096},
    "leaky_relu_bias": {"a": 8192, "b": 4096},
    "gelu_times_sigmoid": {"a": 8192, "b": 4096},
    "mish_act": {"a": 8192, "b": 4096},
    "selu_hardtanh": {"a": 8192, "b": 4096},
    "channel_scale": {"n": 32, "c": 256, "s": 4096},
    "sum_last": {"a": 16384, "b": 4096},
    "mean_middle": {"a": 64, "b": 512, "c": 1024},
    "max_first": {"a": 4096, "b": 8192},
    "sum_two_axes": {"a": 64, "b": 512, "c": 1024},
    "min_middle": {"a": 128, "b": 256, "c": 1024},
    "logsumexp_last": {"a": 8192, "b": 4096},
    "softmax_last": {"a": 8192, "b": 4096},
    "softmax_first_axis": {"a": 4096, "b": 4096},
    "layernorm_affine": {"a": 8192, "b": 4096},
    "rmsnorm_weight": {"a": 8192, "b": 4096},
    "rmsnorm_middle_axis": {"n": 64, "c": 512, "s": 256},
    "l2_normalize_rows": {"a": 8192, "b": 4096},
    "matmul_square": {"a": 4096, "k": 4096, "n": 4096},
    "matmul_at": {"a": 4096, "k": 4096, "n": 4096},
    "matmul_bt": {"a": 4096, "k": 4096, "n": 4096},
    "batched_matmul": {"z": 32, "a": 512, "k": 512, "n": 512},
    "matvec": {"a": 16384, "k": 16384},
    "huge_k": {"a": 256, "k": 131072, "n": 256},
    "gemm_bias_gelu": {"a": 4096, "k": 4096, "n": 4096},
    "gemm_scale_residual": {"a": 4096, "k": 4096, "n": 4096},
    "gemm_layernorm": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_logsumexp": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_softmax": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_column_sum": {"a": 4096, "k": 1024, "n": 4096},
    "gemm_sigmoid_sum": {"a": 8192, "k": 1024, "n": 1024},
    "gemm_relu_max": {"a": 8192, "k": 1024, "n": 1024},
    "two_layer_mlp": {"a": 4096, "b": 1024, "f": 4096, "e": 1024},
    "attention_wide_head": {"z": 4, "q": 1024, "x": 1024, "d": 1024},
}


#: the examples' diagrams, at the sizes their docstrings use (``matmul_chain.py``'s chains are
#: left out: forty products of unit-variance matrices overflow bf16, in eager PyTorch as in napkin)
EXAMPLES: dict[str, dict[str, int]] = {
    "examples/my_diagram.py:swiglu": {"a": 4096, "b": 4096, "f": 11008},
    "examples/my_diagram.py:linear_attention": {"q": 4096, "x": 4096, "d": 128, "e": 128},
}


def library_problems() -> dict[str, tuple[str, dict[str, int]]]:
    """Every library diagram at its default sizes, and the examples (the issue's "every library and
    example diagram ≥ 1.0× eager at its default sizes"): label → (diagram spec, sizes)."""
    from napkin.diagrams import library

    out = {f"library:{n}": (n, dict(library.entry(n).default_sizes)) for n in library.names()}
    out.update({f"example:{spec.rsplit(':', 1)[1]}": (str(ROOT / spec), dict(sizes))
                for spec, sizes in EXAMPLES.items()})
    return out


def points(names, dtypes, library_dtypes=("bf16",), with_library: bool = False, problems=None, here=None):
    """The survey's points (every dtype), then the library's and the examples' (bf16).
    ``problems`` and ``here`` (the file defining them) default to this survey's."""
    from napkin.bench.suite import Point

    problems, here = problems or PROBLEMS, here or HERE
    out = [Point("composed", f"{here}:{n}", dict(problems[n]), dt, {"problem": n}) for dt in dtypes for n in names]
    if with_library:
        out += [Point("composed", spec, sizes, dt, {"problem": label})
                for dt in library_dtypes for label, (spec, sizes) in library_problems().items()]
    return out


def summarize(records) -> dict:
    """Geometric mean and worst of napkin's speed-up over eager, per dtype and overall."""
    out = {}
    groups = {dt: [r for r in records if r["dtype"] == dt and not _is_library(r)]
              for dt in sorted({r["dtype"] for r in records})}
    groups["all"] = [r for r in records if not _is_library(r)]
    groups["library"] = [r for r in records if _is_library(r)]
    for dt, rs in groups.items():
        if not rs:
            continue
        ratios = [r["ratio"].get("eager") for r in rs]
        ok = [x for x in ratios if isinstance(x, float) and x > 0]
        worst = min(rs, key=lambda r: r["ratio"].get("eager") or 0.0) if rs else None
        out[dt] = {
            "points": len(rs), "measured": len(ok),
            "geomean_vs_eager": math.exp(sum(math.log(x) for x in ok) / len(ok)) if ok else None,
            "faster_than_eager": sum(x >= 1.0 for x in ok),
            "under_one": sorted(r["labels"]["problem"] for r in rs if (r["ratio"].get("eager") or 0.0) < 1.0),
            "under_half": sorted(r["labels"]["problem"] for r in rs if (r["ratio"].get("eager") or 0.0) < 0.5),
            "worst": None if worst is None else (worst["labels"]["problem"], worst["ratio"].get("eager")),
            "on_fallback": sorted({r["labels"]["problem"] for r in rs if "fallback" in (r.get("families") or ())}),
            "check_failed": sorted(r["labels"]["problem"] for r in rs if not (r.get("check") or {}).get("ok", False)),
        }
    return out


def _is_library(rec) -> bool:
    return rec["labels"]["problem"].split(":", 1)[0] in ("library", "example")


def main(argv=None, problems=None, here=None, description=None) -> int:
    """Run the survey (``problems`` defined in the file ``here``: default this one's)."""
    problems, here = problems or PROBLEMS, here or HERE
    ap = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON lines, one per point, then the summary")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--only", default=None, help="comma-separated problem names")
    ap.add_argument("--library", action="store_true",
                    help="also every library diagram at its default sizes and the examples (bf16)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting new points after this")
    a = ap.parse_args(argv)
    names = list(problems) if not a.only else [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in problems]
    if unknown:
        print(f"error: unknown problem(s) {', '.join(unknown)}; known: {', '.join(problems)}", file=sys.stderr)
        return 2
    from napkin.bench.suite import SuiteConfig, device_header, run_point

    header = device_header(measure_gemm=False)
    # plan with the profile of the GPU at hand (the config's default is the h100 profile)
    cfg = SuiteConfig(gpu=header.get("gpu_key") or "h100", autotune=False, compile_baselines=False, reps=a.reps,
                      warmup=a.warmup, max_time_s=1.0, copy_bandwidth=header.get("copy_bandwidth"))
    start = time.time()
    records = []
    sink = a.out.open("w") if a.out else None
    if sink:
        sink.write(json.dumps({"header": header}, default=str) + "\n")
    for p in points(names, [d.strip() for d in a.dtypes.split(",") if d.strip()], with_library=a.library,
                    problems=problems, here=here):
        if a.budget_s is not None and time.time() - start > a.budget_s:
            print(f"budget of {a.budget_s:.0f} s spent: {p.labels['problem']} ({p.dtype}) and later not run",
                  file=sys.stderr)
            break
        rec = run_point(p, cfg)
        rec["families"] = list((rec.get("napkin") or {}).get("kernels") or ())
        records.append(rec)
        eager = rec["ratio"].get("eager")
        print(f"{p.labels['problem']:22s} {p.dtype:5s} napkin {1e6 * (rec['napkin_s'] or float('nan')):9.1f} us"
              f"  eager x{eager if eager is not None else float('nan'):6.2f}  {','.join(rec['families'])}"
              f"  check={'ok' if (rec.get('check') or {}).get('ok') else rec.get('check') or rec['errors']}",
              flush=True)
        if sink:
            sink.write(json.dumps(rec, default=str) + "\n")
            sink.flush()
    summary = summarize(records)
    print(json.dumps(summary, indent=1))
    if sink:
        sink.write(json.dumps({"summary": summary}) + "\n")
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
