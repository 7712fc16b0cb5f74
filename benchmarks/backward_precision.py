#!/usr/bin/env python3
"""Where a training step's gradients lose accuracy: napkin's plans replayed in PyTorch with each
kernel's stored arrays rounded to the dtype, against float64 autograd.

    PYTHONPATH=. python3 benchmarks/backward_precision.py [--name transformer_block] [--sizes q=1024,e=1024]
        [--device cuda] [--save Xn,N1] [--drop N1] [--fp32 S,P] [--gpu h100]

The operator's save set (:meth:`napkin.torch.NapkinOp._grad_pieces`, or ``--save`` / ``--drop``
departures from it), its with-saves forward and its backward are planned for ``--gpu`` (no GPU
needed: the plans only). Each plan is then run box by box in float64 (``run_reference``'s box
rules): an array a kernel stores (read by another kernel, or an output) is rounded to bf16, or
to fp32 where ``--fp32`` names it; inside a kernel the next box reads it unrounded, as the
generated code keeps it in registers. The forward's outputs feed the backward as the saved
arrays. Printed: each input gradient's ``‖g − g_ref‖₂ / ‖g_ref‖₂`` against float64 autograd of the
diagram's reference (the measure of ``benchmarks/backward.py``), then each stored intermediate
of the backward against the same backward run without rounding from the exact forward.

What it does not model: the accumulation order inside a kernel (fp32 sums, small next to bf16
rounding) and a kernel keeping an operand in bf16 inside itself (flash attention's P before
its second product). At ``q=2048`` (the benchmark's default block) it gave napkin's measured
H100 error to within 1 % (1.01e-2 on Wq at 4529fc2, measured 1.008e-2), and found the cause:
``N1_rstd`` saved in bf16, the backward's recomputed ``Xn`` (so K and V) differing from the
forward's beside the saved Qp and O (:func:`napkin.diagrams.grad.recomputed_from_statistics`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def stored(d, plan) -> tuple[dict, set]:
    """Each box's kernel index, and the names of the arrays a kernel stores (read by a box of
    another kernel, renames followed, or an output of ``d``)."""
    from napkin.diagrams.ops import Rename

    kernel = {b: i for i, pk in enumerate(plan.kernels) for b in pk.kernel.boxes}
    readers: dict[int, list] = {}
    for v in d.nodes:
        for a in v.args:
            readers.setdefault(id(a), []).append(v)

    def users(v):
        for c in readers.get(id(v), ()):
            if isinstance(c.op, Rename):
                yield from users(c)
            else:
                yield c

    outs = {id(o) for o in d.outputs}
    out = set()
    for v in d.nodes:
        if isinstance(v.op, Rename):
            continue
        n = d.name_of(v)
        if id(v) in outs or any(kernel.get(d.name_of(c)) != kernel.get(n) for c in users(v)):
            out.add(n)
    return kernel, out


def replay(d, plan, inputs: dict, fp32=frozenset(), exact: bool = False) -> dict:
    """Every array of ``d`` (name → float64 tensor) computed box by box, stored arrays rounded to
    bf16 (fp32 for the names in ``fp32``; none with ``exact``)."""
    import torch

    from napkin.diagrams.functions import ArrayOps
    from napkin.diagrams.ops import Rename
    from napkin.diagrams.reference import _run_box

    kernel, keep = stored(d, plan)
    ops = ArrayOps("torch")
    env = {id(v): inputs[v.name].double() for v in d.inputs}
    unrounded = {}

    def arg(a, k):
        src = a
        while isinstance(src.op, Rename):
            src = src.args[0]
        if id(src) in unrounded and kernel.get(d.name_of(src)) == k:
            return unrounded[id(src)]
        return env[id(a)]

    out = {}
    for v in d.nodes:
        n = d.name_of(v)
        if isinstance(v.op, Rename):
            env[id(v)] = env[id(v.args[0])]
            continue
        t = _run_box(v, [arg(a, kernel.get(n)) for a in v.args], ops, d.sizes)
        unrounded[id(v)] = t
        if n in keep and not exact:
            t = (t.float() if n in fp32 else t.bfloat16()).double()
        env[id(v)] = out[n] = t
    return out


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def block_inputs(o, sizes, gen, device):
    """Inputs at the benchmark's scales: weights 1/√fan-in, norm gains near 1, bias 0.1."""
    import torch

    out = {}
    for n, axes in zip(o.input_names, o._in_axes):
        t = torch.randn(*axes, generator=gen, dtype=torch.float32).to(device)
        if len(axes) > 1 and n != "X":  # a weight: its fan-in is its last axis (Wo's last two)
            t = t * (axes[1] * axes[2] if n == "Wo" else axes[-1]) ** -0.5
        elif len(axes) == 1:
            t = t * 0.1 + (1.0 if n.startswith("g") else 0.0)
        out[n] = t.bfloat16()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="transformer_block")
    ap.add_argument("--sizes", default="q=1024", help="axis=size,... over the library's defaults")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpu", default="h100", help="the GPU the plans are made for")
    ap.add_argument("--save", default="", help="arrays saved besides the operator's choice")
    ap.add_argument("--drop", default="", help="arrays of the operator's choice not saved")
    ap.add_argument("--fp32", default="", help="stored arrays kept in fp32 rather than bf16")
    a = ap.parse_args()

    import torch

    import napkin.torch as nt
    from napkin.codegen.plancache import derive_cached
    from napkin.diagrams import library
    from napkin.diagrams.grad import forward_with_saves, grad
    from napkin.diagrams.reference import run_reference

    sizes = dict(library.entry(a.name).default_sizes)
    sizes.update({k: int(v) for k, v in (kv.split("=") for kv in a.sizes.split(",") if kv)})
    o = nt.op(a.name, sizes=sizes, dtype="bf16", gpu=a.gpu)
    pieces = o._grad_pieces()
    if isinstance(pieces, str):
        print(f"{a.name}: no backward on napkin's kernels: {pieces}")
        return 1
    names = lambda s: {x for x in s.split(",") if x}  # noqa: E731
    save = (set(pieces.save) | names(a.save)) - names(a.drop)
    fp32 = frozenset(names(a.fp32))
    d = o.diagram
    fd, bd = forward_with_saves(d, save), grad(d, None, save)
    gpu = o.compiled.gpu
    fplan, bplan = derive_cached(fd, gpu, arch=gpu.arch), derive_cached(bd, gpu, arch=gpu.arch)
    gen = torch.Generator().manual_seed(0)
    xs = block_inputs(o, sizes, gen, a.device) if a.name == "transformer_block" else \
        {n: torch.randn(*ax, generator=gen).to(a.device).bfloat16() for n, ax in zip(o.input_names, o._in_axes)}
    cots = {"d" + n: torch.randn(*s, generator=gen).to(a.device).bfloat16()
            for n, s in zip(o.output_names, o._out_shapes(list(xs.values())))}
    a64 = {n: t.double().requires_grad_(True) for n, t in xs.items()}
    out = run_reference(d, a64, dtype=torch.float64)
    torch.autograd.backward([out[n] for n in o.output_names], [cots["d" + n].double() for n in o.output_names])
    print(f"{a.name} {sizes}: saved {sorted(save)}; fp32 {sorted(fp32) or 'none'}")
    print(f"forward plan: {len(fplan.kernels)} kernels, backward plan: {len(bplan.kernels)} kernels")
    fwd = replay(fd, fplan, xs, fp32)
    got = replay(bd, bplan, {**xs, **cots, **{s: fwd[s] for s in save}}, fp32)
    exact_fwd = run_reference(fd, {n: t.double() for n, t in xs.items()}, dtype=torch.float64)
    ref_b = replay(bd, bplan, {**xs, **cots, **{s: exact_fwd[s] for s in save}}, exact=True)
    errs = {n: rel(got["d" + n], a64[n].grad) for n in o.input_names}
    print("gradients vs float64 autograd: max " + f"{max(errs.values()):.3e}  "
          + "  ".join(f"{n} {e:.3e}" for n, e in errs.items()))
    _, keep = stored(bd, bplan)
    print("stored arrays of the backward vs the unrounded backward:")
    for v in bd.nodes:
        n = bd.name_of(v)
        if n in keep and n in ref_b:
            print(f"  {n:14s} {rel(got[n], ref_b[n]):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
