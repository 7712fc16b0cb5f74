#!/usr/bin/env python3
"""Backward passes on napkin's kernels (issue #15 parts 3-5) against PyTorch, on the GPU at hand.

    PYTHONPATH=. python3 benchmarks/backward.py [--quick] [--only rmsnorm] [--no-7b] [--commit SHA] [--out DIR]

Points (bf16):

- ``rmsnorm`` and ``layernorm`` backward (dX, dgamma[, dbeta] from X, gamma[, beta], dY and what
  the forward saved): napkin's backward operator (:meth:`napkin.torch.NapkinOp.backward_op`)
  against PyTorch eager autograd (``F.rms_norm`` / ``F.layer_norm``, the backward only: the graph is
  built before timing and run with ``retain_graph``) and torch.compile's backward; the fraction of
  the copy rate is the minimal backward's bytes (X and dY read, dX written, the per-column vectors
  once) over napkin's time over the measured copy rate (target >= 85 %);
- ``softmax`` backward (dX from dP and the saved P): the same baselines, bytes P, dP read and dX
  written;
- ``mlp`` backward (Y = gelu(X·W + bias)): dX, dW, dbias;
- the ``transformer_block`` training step (forward with saves and backward through
  :class:`napkin.torch.Module`) against the same block written in eager PyTorch (``F.rms_norm``,
  ``einsum`` projections, SDPA causal, erf GELU), at the library's default sizes and at 7B-like
  sizes (q=4096, e=4096, h=32, d=128, f=11008; target >= 1.0x eager). Each gradient's error is
  ``‖g − g_ref‖₂ / ‖g_ref‖₂`` against float64 autograd of the diagram's reference (bound 1e-2),
  reported for napkin and for eager bf16 (where the float64 reference fits in the GPU's free
  memory: about ten float64 arrays of h·q·q scores), and napkin's against eager bf16's
  (``rel_err_vs_eager_bf16``: both errors together, not the bound's measure); the forward's and the
  backward's plans (``forward_plan``, ``backward_plan``: family and boxes of each kernel, so the
  attention forward writing ``P_lse`` and the fused attention backward show) and each kernel's
  time (``kernel_us``, torch.profiler, no L2 flush).

CUDA events, warm-up, medians, L2 flushed before every run and inputs rotated
(:mod:`napkin.bench.timing`). Writes ``backward.json`` (device, GPU name, commit, copy rate,
``rows``) to ``DIR/<gpu>/`` (default ``benchmarks/results``) after every point.
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

# rows of 4096 and of 5000 values (625 16-byte chunks: no power-of-two block holds them evenly)
NORM_SIZES = ({"r": 4096, "x": 4096}, {"r": 16384, "x": 4096}, {"r": 4096, "x": 5000}, {"r": 16384, "x": 5000})
SOFTMAX_SIZES = ({"r": 4096, "x": 4096},)
MLP_SIZES = ({"a": 4096, "b": 4096, "c": 16384},)
BLOCK_DEFAULT = {"q": 2048, "e": 1024, "h": 8, "d": 128, "f": 4096}
BLOCK_7B = {"q": 4096, "e": 4096, "h": 32, "d": 128, "f": 11008}


def rel_err(got, want) -> float:
    import torch

    g, w = got.double(), want.double()
    return float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w).clamp_min(1e-300))


def rand(shape, seed, scale=1.0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()


def torch_forward(name: str, sizes: dict):
    """The PyTorch call of the forward whose backward is timed (its inputs in the diagram's order)."""
    import torch
    import torch.nn.functional as F

    if name == "rmsnorm":
        return lambda X, g: F.rms_norm(X, (sizes["x"],), g, eps=1e-6)
    if name == "layernorm":
        return lambda X, g, b: F.layer_norm(X, (sizes["x"],), g, b, eps=1e-5)
    if name == "softmax":
        return lambda X: torch.softmax(X, dim=-1)
    if name == "mlp":
        return lambda X, W, b: F.gelu(X @ W.t() + b)
    raise KeyError(name)


def backward_timer(fwd, inputs_sets, cot_sets):
    """A function timing the backward only: the graph of ``fwd`` built once per input set, the
    backward run with ``retain_graph`` (its argument set: (output, inputs, cotangent))."""
    import torch

    sets = []
    for xs, c in zip(inputs_sets, cot_sets):
        a = [x.clone().requires_grad_(True) for x in xs]
        sets.append((fwd(*a), a, c))

    def run(y, a, c):
        return torch.autograd.grad(y, a, c, retain_graph=True)

    return run, sets


def time_backward(name: str, sizes: dict, copy_bps: float, reps: int) -> dict:
    import torch

    import napkin.torch as nt
    from napkin.bench.timing import l2_bytes, time_fn

    o = nt.op(name, sizes=sizes, dtype="bf16")
    pieces = o._grad_pieces()
    if isinstance(pieces, str):
        return {"name": name, "sizes": sizes, "error": pieces}
    b = o.backward_op()
    one = sum(2 * math.prod(a) for a in o._in_axes)
    n_sets = max(2, min(6, -(-2 * l2_bytes() // max(1, 2 * one))))
    scale = 0.5 if name == "mlp" else 1.0
    ins = [[rand(a, s * 10 + i, scale) for i, a in enumerate(o._in_axes)] for s in range(n_sets)]
    cots = [[rand(sh, s * 10 + 9) for sh in o._out_shapes(ins[0])] for s in range(n_sets)]
    fwd = pieces.forward
    args = []
    for xs, cs in zip(ins, cots):
        outs = fwd(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        env = dict(zip(o.input_names, xs))
        env.update({"d" + n: c for n, c in zip(o.output_names, cs)})
        env.update(zip(pieces.save, (outs[i] for i in pieces.saved_index)))
        args.append(tuple(env[n] for n in b.input_names))
    rec = {"name": name, "sizes": sizes, "saved": list(pieces.save),
           "kernels": [f"{pk.kernel.family}:{'+'.join(pk.kernel.boxes)}" for pk in b.compiled.plan.kernels],
           "predicted_us": b.compiled.plan.seconds * 1e6}
    # correctness of the timed kernels on the first set (float64 autograd of the reference)
    from napkin.diagrams.reference import run_reference

    a64 = [x.double().requires_grad_(True) for x in ins[0]]
    out = run_reference(o.diagram, dict(zip(o.input_names, a64)), dtype=torch.float64)
    torch.autograd.backward([out[n] for n in o.output_names], [c.double() for c in cots[0]])
    got = b(*args[0])
    got = got if isinstance(got, tuple) else (got,)
    rec["rel_err"] = {n: rel_err(g, x.grad) for n, g, x in zip(b.output_names, got, a64)}
    rec["napkin_us"] = time_fn(b, warmup=10, reps=reps, rotate=args).median_s * 1e6
    rec["kernel_us"] = kernel_times(b, args)
    tf = torch_forward(name, sizes)
    run, sets = backward_timer(tf, ins, [c[0] for c in cots])
    rec["eager_us"] = time_fn(run, warmup=5, reps=reps, rotate=sets).median_s * 1e6
    try:
        torch._dynamo.reset()
        run_c, sets_c = backward_timer(torch.compile(tf), ins, [c[0] for c in cots])
        rec["compile_us"] = time_fn(run_c, warmup=5, reps=reps, rotate=sets_c).median_s * 1e6
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        rec["compile_error"] = f"{type(e).__name__}: {e}"[:300]
    rec["vs_eager"] = rec["eager_us"] / rec["napkin_us"]
    if "compile_us" in rec:
        rec["vs_compile"] = rec["compile_us"] / rec["napkin_us"]
    if name in ("rmsnorm", "layernorm", "softmax"):
        r, x = sizes["r"], sizes["x"]
        vectors = {"rmsnorm": 2, "layernorm": 3, "softmax": 0}[name]  # gamma read, dgamma (dbeta) written
        rec["min_bytes"] = 2 * (3 * r * x + vectors * x)
        rec["copy_fraction"] = rec["min_bytes"] / (rec["napkin_us"] * 1e-6) / copy_bps
    return rec


def kernel_times(fn, args, calls: int = 6) -> dict:
    """Mean device time of each kernel ``fn`` launches (torch.profiler over ``calls`` calls on the
    rotated argument sets; no L2 flush between kernels: a diagnostic of where the time goes, not
    the benchmark's number)."""
    from napkin.bench.timing import kernel_times as profiled

    try:
        return {k[:80]: v for k, v in profiled(fn, rotate=args, calls=calls, warmup=0, reduce="mean").items()}
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def eager_block(sizes: dict):
    """transformer_block in eager PyTorch: the function of (X, g1, Wq, Wk, Wv, Wo, g2, W1, b1, W2)."""
    import torch
    import torch.nn.functional as F

    e = sizes["e"]

    def block(X, g1, Wq, Wk, Wv, Wo, g2, W1, b1, W2):
        Xn = F.rms_norm(X, (e,), g1, eps=1e-6)
        Q = torch.einsum("qe,hde->hqd", Xn, Wq)
        K = torch.einsum("qe,hde->hqd", Xn, Wk)
        V = torch.einsum("qe,hde->hqd", Xn, Wv)
        O = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        X2 = X + torch.einsum("hqd,ehd->qe", O, Wo)
        Xn2 = F.rms_norm(X2, (e,), g2, eps=1e-6)
        H = F.gelu(Xn2 @ W1.t() + b1)
        return X2 + H @ W2.t()

    return block


def block_weights(q, e, h, d, f, seed=0):
    shapes = {"g1": ((e,), None), "Wq": ((h, d, e), e), "Wk": ((h, d, e), e), "Wv": ((h, d, e), e),
              "Wo": ((e, h, d), h * d), "g2": ((e,), None), "W1": ((f, e), e), "b1": ((f,), None), "W2": ((e, f), f)}
    out = {}
    for i, (n, (shape, fan)) in enumerate(shapes.items()):
        t = rand(shape, seed * 100 + i, 1.0 / fan ** 0.5 if fan else 0.1).float()
        out[n] = (t + 1.0 if n.startswith("g") else t).bfloat16()
    return out


def time_block(sizes: dict, reps: int, label: str) -> dict:
    import torch

    import napkin.torch as nt
    from napkin.bench.timing import time_fn
    from napkin.diagrams.reference import run_reference

    t0 = time.time()
    w = block_weights(**sizes)
    m = nt.Module("transformer_block", weights=w, sizes=sizes, dtype="bf16").cuda()
    o = m.op
    pieces = o._grad_pieces()
    rec = {"name": "transformer_block", "label": label, "sizes": sizes, "setup_s": time.time() - t0}
    if isinstance(pieces, str):
        rec["error"] = pieces
        return rec
    b = o.backward_op()
    fplan, bplan = pieces.forward.compiled.plan, b.compiled.plan
    rec.update(saved=list(pieces.save), forward_kernels=len(fplan.kernels), backward_kernels=len(bplan.kernels),
               # which kernels run (the attention forward writing P_lse, the fused attention backward)
               forward_plan=[f"{pk.kernel.family}:{'+'.join(pk.kernel.boxes)}" for pk in fplan.kernels],
               backward_plan=[f"{pk.kernel.family}:{'+'.join(pk.kernel.boxes)}" for pk in bplan.kernels],
               predicted_forward_us=pieces.ranked[0][1] * 1e6, predicted_backward_us=pieces.ranked[0][2] * 1e6,
               save_sets=[{"save": sorted(c), "forward_us": f * 1e6, "backward_us": bw * 1e6}
                          for c, f, bw in pieces.ranked])
    q, e = sizes["q"], sizes["e"]
    xs = [rand((q, e), 1000 + i) for i in range(3)]
    cots = [rand((q, e), 2000 + i) for i in range(3)]
    params = [getattr(m, n) for n in m.weight_names]
    ref_w = {n: p.detach().clone().requires_grad_(True) for n, p in zip(m.weight_names, params)}
    blk = eager_block(sizes)

    def napkin_step(X, cot):
        for p in params:
            p.grad = None
        X = X.requires_grad_(True)
        m(X).backward(cot)

    def eager_step(X, cot):
        for p in ref_w.values():
            p.grad = None
        X = X.requires_grad_(True)
        blk(X, *(ref_w[n] for n in o.input_names[1:])).backward(cot)

    # gradients: napkin and eager bf16 against float64 autograd of the reference, one input set
    X0 = xs[0].clone().requires_grad_(True)
    m(X0).backward(cots[0])
    got = {"X": X0.grad, **{n: p.grad for n, p in zip(m.weight_names, params)}}
    Xe = xs[0].clone().requires_grad_(True)
    for p in ref_w.values():
        p.grad = None
    blk(Xe, *(ref_w[n] for n in o.input_names[1:])).backward(cots[0])
    eager = {"X": Xe.grad, **{n: p.grad for n, p in ref_w.items()}}
    rec["rel_err_vs_eager_bf16"] = {n: rel_err(got[n], eager[n]) for n in o.input_names}
    a64 = {n: (xs[0] if n == "X" else w[n]).double().requires_grad_(True) for n in o.input_names}
    # the reference keeps every h*q*q score array in float64 (scores, scaled, masked, P, and their
    # gradients): about ten of them must fit in what is free, else napkin is compared with eager only
    scores = 8 * q * q * sizes["h"]
    out = None
    if 10 * scores <= torch.cuda.mem_get_info()[0]:
        try:
            out = run_reference(o.diagram, a64, dtype=torch.float64)
            out[o.output_names[0]].backward(cots[0].double())
        except torch.cuda.OutOfMemoryError as e:
            out = None
            rec["no_float64_reference"] = f"out of memory: {e}"[:300]
            torch.cuda.empty_cache()
    else:
        rec["no_float64_reference"] = (f"the float64 reference needs about {10 * scores / 2 ** 30:.0f} GiB, "
                                       f"{torch.cuda.mem_get_info()[0] / 2 ** 30:.0f} GiB free")
    if out is not None:
        rec["rel_err"] = {n: rel_err(got[n], a64[n].grad) for n in o.input_names}
        rec["eager_rel_err"] = {n: rel_err(eager[n], a64[n].grad) for n in o.input_names}
        rec["max_rel_err"] = max(rec["rel_err"].values())
        with torch.no_grad():  # the eager block computes what the diagram does
            rec["eager_forward_vs_reference"] = rel_err(blk(xs[0], *(w[n] for n in o.input_names[1:])),
                                                        out[o.output_names[0]])
    del out, a64
    torch.cuda.empty_cache()
    sets = [(x, c) for x, c in zip(xs, cots)]
    rec["napkin_us"] = time_fn(napkin_step, warmup=3, reps=reps, rotate=sets, max_time_s=3.0).median_s * 1e6
    rec["eager_us"] = time_fn(eager_step, warmup=3, reps=reps, rotate=sets, max_time_s=3.0).median_s * 1e6
    rec["vs_eager"] = rec["eager_us"] / rec["napkin_us"]
    rec["kernel_us"] = kernel_times(napkin_step, sets)
    with torch.no_grad():
        rec["napkin_forward_us"] = time_fn(lambda X, c: m(X), warmup=3, reps=reps, rotate=sets,
                                           max_time_s=2.0).median_s * 1e6
        rec["eager_forward_us"] = time_fn(lambda X, c: blk(X, *(ref_w[n] for n in o.input_names[1:])), warmup=3,
                                          reps=reps, rotate=sets, max_time_s=2.0).median_s * 1e6
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--only", action="append", help="rmsnorm, layernorm, softmax, mlp, block; repeatable")
    ap.add_argument("--quick", action="store_true", help="the first size of each, fewer runs")
    ap.add_argument("--no-7b", action="store_true", help="leave the 7B-like block out")
    ap.add_argument("--commit", default=None, help="the commit to record (default: git's)")
    a = ap.parse_args()

    import torch

    from napkin.bench.suite import gpu_slug
    from napkin.bench.timing import copy_bandwidth, device_info

    dev = device_info()
    if a.commit:
        dev["napkin_commit"] = a.commit
    copy_bps = copy_bandwidth()
    name = torch.cuda.get_device_name()
    print(f"{name}: copy rate {copy_bps / 1e9:.0f} GB/s (read + write)", flush=True)
    out_dir = a.out / gpu_slug(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    reps = 30 if a.quick else 100
    only = set(a.only or ["rmsnorm", "layernorm", "softmax", "mlp", "block"])
    todo = []
    for n, sizes in (("rmsnorm", NORM_SIZES), ("layernorm", NORM_SIZES), ("softmax", SOFTMAX_SIZES),
                     ("mlp", MLP_SIZES)):
        if n in only:
            todo += [("op", n, s) for s in (sizes[:1] if a.quick else sizes)]
    if "block" in only:
        todo.append(("block", "default", BLOCK_DEFAULT))
        if not a.no_7b:
            todo.append(("block", "7B-like", BLOCK_7B))
    points = []
    for kind, n, sizes in todo:
        t = time.time()
        try:
            rec = time_block(sizes, reps, n) if kind == "block" else time_backward(n, sizes, copy_bps, reps)
        except Exception as e:  # noqa: BLE001 - reported, the other points still run
            rec = {"name": n, "sizes": sizes, "error": f"{type(e).__name__}: {e}"[:500]}
        rec["wall_s"] = time.time() - t
        points.append(rec)
        print(json.dumps(rec, default=str), flush=True)
        # "rows", not "points": the suite's loaders read every "points" list of the folder as its records
        (out_dir / "backward.json").write_text(json.dumps({"device": dev, "gpu": name, "copy_bps": copy_bps,
                                                           "rows": points}, indent=1, default=str))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
