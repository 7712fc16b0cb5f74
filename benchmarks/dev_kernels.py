#!/usr/bin/env python3
"""Development timings of the contraction and attention families against PyTorch.

Each case lowers a library diagram with one tile configuration (or the schedule the performance
model picks), compiles it (all kernels first, in parallel, into the disk cache), checks its
output against PyTorch on the same random inputs, and times it and the PyTorch baseline with
CUDA events (warm-up, then the median of many runs; inputs are random normal, never zeros).
Baselines: ``torch.matmul`` / ``F.linear`` (cuBLAS), ``gelu(F.linear(..))`` for the MLP, the
SDPA flash backend (FlashAttention-2) for attention. FLOPs: GEMM 2·M·N·K; attention
4·H·Nq·Nk·d, half of it when causal; the sliding window counts the keys it keeps.

    python3 benchmarks/dev_kernels.py --out $OUT/dev.json [--quick] [--only mha]

Writes every number to the JSON file and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ------------------------------------------------------------------ the cases

def mm_cfg(c, simt=False, wgmma=False):
    from napkin.codegen.families.contraction import MatmulConfig

    return MatmulConfig(simt, *c, wgmma=wgmma)


def wgmma_cases():
    """The Hopper template: every configuration at 4096^3 and 8192^3, each operand layout, the MLP."""
    from napkin.codegen.families.contraction import WGMMA_CONFIGS

    s4k, s8k = dict(a=4096, b=4096, c=4096), dict(a=8192, b=8192, c=8192)
    out = []
    for c in WGMMA_CONFIGS:
        out.append(("wgmma matmul 4096^3", "matmul", "bf16", s4k, "contraction", mm_cfg(c, wgmma=True), "matmul"))
        out.append(("wgmma matmul 8192^3", "matmul", "bf16", s8k, "contraction", mm_cfg(c, wgmma=True), "matmul"))
        out.append(("wgmma mlp 4096x4096x16384", "mlp", "bf16", dict(a=4096, b=4096, c=16384), "contraction",
                    mm_cfg(c, wgmma=True), "mlp"))
    c0 = mm_cfg(WGMMA_CONFIGS[0], wgmma=True)
    out.append(("wgmma matmul_t 4096^3", "matmul_t", "bf16", s4k, "contraction", c0, "matmul_t"))
    out.append(("wgmma matmul fp16 4096^3", "matmul", "fp16", s4k, "contraction", c0, "matmul"))
    out.append(("wgmma matmul 1000x520x776", "matmul", "bf16", dict(a=1000, b=520, c=776), "contraction", c0,
                "matmul"))
    out.append(("wgmma mlp 8192x4096x16384", "mlp", "bf16", dict(a=8192, b=4096, c=16384), "contraction", c0, "mlp"))
    return out


def att_cfg(c):
    from napkin.codegen.families.attention import AttentionConfig

    return AttentionConfig(*c)


def cases(quick: bool):
    """(label, diagram name, dtype, sizes, family, config or None, baseline kind)."""
    mm = [(128, 256, 64, 64, 64, 3, 1), (256, 128, 64, 64, 64, 3, 1), (128, 256, 32, 64, 64, 4, 1),
          (256, 128, 32, 64, 64, 4, 1), (128, 128, 32, 64, 64, 4, 2), (128, 128, 64, 64, 64, 3, 2)]
    out = wgmma_cases()
    s4k = dict(a=4096, b=4096, c=4096)
    for c in mm:
        out.append(("matmul 4096^3", "matmul", "bf16", s4k, "contraction", mm_cfg(c), "matmul"))
    out.append(("matmul 4096^3 (model's pick)", "matmul", "bf16", s4k, "contraction", None, "matmul"))
    for c in mm[:2] if quick else mm[:3]:
        out.append(("matmul 8192^3", "matmul", "bf16", dict(a=8192, b=8192, c=8192), "contraction", mm_cfg(c), "matmul"))
    out.append(("matmul 8192^3 (model's pick)", "matmul", "bf16", dict(a=8192, b=8192, c=8192), "contraction", None,
                "matmul"))
    out.append(("matmul_t 4096^3", "matmul_t", "bf16", s4k, "contraction", mm_cfg(mm[0]), "matmul_t"))
    out.append(("matmul fp16 4096^3", "matmul", "fp16", s4k, "contraction", mm_cfg(mm[0]), "matmul"))
    for c in mm[:2]:
        out.append(("mlp 4096x4096x16384", "mlp", "bf16", dict(a=4096, b=4096, c=16384), "contraction",
                    mm_cfg(c), "mlp"))
    out.append(("batched 8x2048^3", "batched_matmul", "bf16", dict(n=8, a=2048, b=2048, c=2048), "contraction",
                mm_cfg(mm[0]), "bmm"))
    for c in [(128, 128, 8, 32, 64, 2, 1), (128, 128, 16, 32, 64, 2, 1)]:
        out.append(("matmul fp32 4096^3", "matmul", "fp32", s4k, "contraction", mm_cfg(c, True), "matmul"))

    a128 = [(128, 64, 32, 2, 128, 2), (128, 32, 32, 2, 128, 2), (128, 64, 16, 2, 128, 1), (64, 64, 16, 2, 128, 2),
            (128, 64, 32, 2, 128, 1, 64)]  # the last: S 64 keys wide in registers (spills a little)
    sh = dict(h=32, q=4096, x=4096, d=128)
    for c in a128 if not quick else a128[:2] + a128[4:]:
        out.append(("mha h32 4k d128", "mha", "bf16", sh, "attention", att_cfg(c), "sdpa"))
    out.append(("mha h32 4k d128 (model's pick)", "mha", "bf16", sh, "attention", None, "sdpa"))
    for c in [(128, 64, 32, 2, 64, 2), (128, 64, 16, 2, 64, 1)]:
        out.append(("mha h32 4k d64", "mha", "bf16", dict(h=32, q=4096, x=4096, d=64), "attention", att_cfg(c), "sdpa"))
    for c in a128[:3]:
        out.append(("causal h32 4k d128", "attention_causal", "bf16", sh, "attention", att_cfg(c), "sdpa_causal"))
    out.append(("causal h32 4k d64", "attention_causal", "bf16", dict(h=32, q=4096, x=4096, d=64), "attention",
                att_cfg((128, 64, 32, 2, 64, 2)), "sdpa_causal"))
    out.append(("mha fp16 h32 4k d128", "mha", "fp16", sh, "attention", att_cfg(a128[0]), "sdpa"))
    out.append(("gqa h8 j4 4k d128", "gqa", "bf16", dict(h=8, j=4, q=4096, x=4096, d=128), "attention",
                att_cfg(a128[0]), "sdpa_gqa"))
    for n in ("attention_window", "attention_alibi", "attention_softcap"):
        out.append((f"{n} h16 4k d128", n, "bf16", dict(h=16, q=4096, x=4096, d=128), "attention",
                    att_cfg(a128[0]), "reference"))
    for c in [(64, 32, 16, 2, 256, 2), (64, 64, 16, 2, 256, 1)]:
        out.append(("mha h16 4k d256", "mha", "bf16", dict(h=16, q=4096, x=4096, d=256), "attention",
                    att_cfg(c), "sdpa"))
    if not quick:
        out.append(("mha h16 16k d128", "mha", "bf16", dict(h=16, q=16384, x=16384, d=128), "attention",
                    att_cfg(a128[0]), "sdpa"))
    return out


# ------------------------------------------------------------------ compile ahead, in parallel

def _compile_one(job):
    source, filename, arch = job
    t = time.time()
    try:
        from napkin.kernels.compile import compile_module

        compile_module(source, arch=arch, filename=filename)
        return None, time.time() - t
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:2000]}", time.time() - t


def precompile(programs, arch, workers):
    import multiprocessing as mp

    jobs, seen = [], set()
    for p in programs:
        key = p.source()
        if key in seen:
            continue
        seen.add(key)
        jobs.append((key, f"{p.diagram.name}.cu", arch))
    t = time.time()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        res = list(ex.map(_compile_one, jobs))
    errs = [r[0] for r in res if r[0]]
    print(f"precompiled {len(jobs)} sources in {time.time() - t:.1f} s ({workers} processes), "
          f"{len(errs)} failed", flush=True)
    for e in errs[:3]:
        print(e[:1500], flush=True)


# ------------------------------------------------------------------ the mma.sync ceiling

MMA_PEAK_SRC = r"""
#include "napkin.cuh"
// Tensor-core issue rate of mma.sync m16n8k16 (bf16 in, fp32 accumulate) with no memory traffic:
// every warp keeps ACC independent accumulators busy for ITERS rounds.
extern "C" __global__ void __launch_bounds__(256) napkin_mma_peak(float* out, int iters) {
  constexpr int ACC = 16;
  napkin::u32 a[4], b0, b1;
  const napkin::u32 seed = threadIdx.x * 2654435761u;
  for (int i = 0; i < 4; ++i) a[i] = (seed >> i) & 0x3c003c00u;
  b0 = (seed >> 5) & 0x3c003c00u;
  b1 = (seed >> 7) & 0x3c003c00u;
  float acc[ACC][4];
#pragma unroll
  for (int k = 0; k < ACC; ++k) acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < ACC; ++k) napkin::mma_m16n8k16<__nv_bfloat16>(acc[k], a, b0, b1);
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < ACC; ++k) s += acc[k][0] + acc[k][1] + acc[k][2] + acc[k][3];
  if (s == 12345.f) out[threadIdx.x] = s;
}
"""


def mma_ceiling():
    """TFLOP/s of mma.sync m16n8k16 bf16 on this GPU, from registers only (the template's roof)."""
    import torch

    from napkin.kernels import compile_kernel

    k = compile_kernel(MMA_PEAK_SRC, "napkin_mma_peak", filename="mma_peak.cu")
    out = torch.zeros(256, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    iters = 4096
    grid = sms * 4
    ms = time_ms(lambda: k((grid,), (256,), [out, iters]), warmup=2, reps=10)
    flops = grid * 8 * iters * 16 * (2 * 16 * 8 * 16)
    return dict(label="mma.sync m16n8k16 bf16 peak (registers only)", ms=ms, tflops=flops / ms / 1e9)


# ------------------------------------------------------------------ timing

def time_ms(fn, warmup=3, reps=20, max_seconds=4.0):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    one = time.time() - t0
    reps = max(3, min(reps, int(max_seconds / max(one, 1e-6))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return ts[len(ts) // 2]


def flops_of(name, sz):
    if name in ("matmul", "matmul_t", "mlp"):
        return 2.0 * sz["a"] * sz["b"] * sz["c"]
    if name == "batched_matmul":
        return 2.0 * sz["n"] * sz["a"] * sz["b"] * sz["c"]
    heads = sz.get("h", 1) * sz.get("j", 1)
    q, x, d = sz["q"], sz["x"], sz["d"]
    full = 4.0 * heads * q * x * d
    if name in ("attention_causal", "gqa", "attention_alibi", "attention_softcap"):
        return full / 2
    if name == "attention_window":
        kept = sum(min(i + 1, 256) for i in range(q))
        return 4.0 * heads * kept * d
    return full


def baseline_fn(kind, inputs, d):
    import torch
    import torch.nn.functional as F

    if kind == "matmul":
        A, B = inputs["A"], inputs["B"]
        return lambda: torch.matmul(A, B)
    if kind == "matmul_t":
        A, B = inputs["A"], inputs["B"]
        return lambda: F.linear(A, B)
    if kind == "bmm":
        A, B = inputs["A"], inputs["B"]
        return lambda: torch.bmm(A, B)
    if kind == "mlp":
        X, W, b = inputs["X"], inputs["W"], inputs["bias"]
        return lambda: F.gelu(F.linear(X, W, b))
    if kind.startswith("sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        Q, K, V = inputs["Q"], inputs["K"], inputs["V"]
        if kind == "sdpa_gqa":
            h, j = Q.shape[0], Q.shape[1]
            Q4 = Q.reshape(1, h * j, Q.shape[2], Q.shape[3])
            K4 = K.unsqueeze(0).repeat_interleave(j, dim=1).contiguous()
            V4 = V.unsqueeze(0).repeat_interleave(j, dim=1).contiguous()
            causal = True
        else:
            Q4, K4, V4 = (t.reshape(1, -1, t.shape[-2], t.shape[-1]) for t in (Q, K, V))
            causal = kind == "sdpa_causal"

        def run():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(Q4, K4, V4, is_causal=causal)
        return run
    return None


def rel_err(out, ref):
    import torch

    o, r = out.float(), ref.float().reshape(out.shape)
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def run_case(case, arch):
    import torch

    from napkin.codegen.api import compile as compile_diagram
    from napkin.diagrams import library

    label, name, dtype, sz, family, cfg, base = case
    fam = __import__(f"napkin.codegen.families.{family}", fromlist=["FAMILY"]).FAMILY
    d = library.get(name).with_dtype(dtype).bind(**sz)
    sched = fam.schedule(d, cfg) if cfg is not None else None
    cd = compile_diagram(d, schedule=sched, family=family)
    launch = cd.program.launches[0]
    row = dict(label=label, diagram=name, dtype=dtype, sizes=sz, family=family,
               tunables=dict(launch.tunables), kernel=launch.name, grid=launch.grid, block=launch.block,
               shared_bytes=launch.shared_bytes)
    try:
        attrs = cd._compiled()[0].attributes()
        row.update(registers=attrs.registers, local_bytes=attrs.local_bytes)
    except Exception as e:  # noqa: BLE001
        row["attributes_error"] = str(e)
    g = torch.Generator(device="cuda")
    g.manual_seed(int.from_bytes(os.urandom(4), "little"))
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    inputs = {v.name: torch.randn(tuple(a.bound_size for a in v.axes), generator=g, device="cuda",
                                  dtype=torch.float32).to(tdt) for v in d.inputs}
    out = cd.empty_outputs(fill=float("nan"))
    fn = lambda: cd(**inputs, out=out)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    y = out[cd.output_names[0]]
    bfn = baseline_fn(base, inputs, d)
    if bfn is not None:
        ref = bfn()
        row["rel_err_vs_torch"] = rel_err(y, ref)
        del ref
    else:
        ref = d.reference({k: v.float() for k, v in inputs.items()}, dtype=torch.float32)[cd.output_names[0]]
        row["rel_err_vs_reference_fp32"] = rel_err(y, ref)
        del ref
    row["nan_count"] = int((~torch.isfinite(y.float())).sum())
    torch.cuda.empty_cache()
    flops = flops_of(name, sz)
    ms = time_ms(fn)
    row.update(ms=ms, tflops=flops / ms / 1e9)
    if bfn is not None:
        bms = time_ms(bfn)
        row.update(torch_ms=bms, torch_tflops=flops / bms / 1e9, speedup_vs_torch=bms / ms)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "dev.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated substrings of case labels")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    args = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from napkin.codegen.lower import lower
    from napkin.diagrams import library
    from napkin.kernels.compile import detect_arch

    arch = detect_arch()
    all_cases = cases(args.quick)
    if args.only:
        keys = args.only.split(",")
        all_cases = [c for c in all_cases if any(k in c[0] for k in keys)]
    programs = []
    for label, name, dtype, sz, family, cfg, base in all_cases:
        try:
            fam = __import__(f"napkin.codegen.families.{family}", fromlist=["FAMILY"]).FAMILY
            d = library.get(name).with_dtype(dtype).bind(**sz)
            programs.append(lower(d, fam.schedule(d, cfg) if cfg is not None else None, family=family, arch=arch))
        except Exception as e:  # noqa: BLE001
            print(f"lowering {label} failed: {e}", flush=True)
    precompile(programs, arch, args.workers)

    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, arch=arch,
                time=time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        meta["mma_sync_peak"] = mma_ceiling()
        print(json.dumps(meta["mma_sync_peak"]), flush=True)
    except Exception as e:  # noqa: BLE001
        meta["mma_sync_peak"] = dict(error=f"{type(e).__name__}: {e}")
    for case in all_cases:
        try:
            row = run_case(case, arch)
        except Exception as e:  # noqa: BLE001
            row = dict(label=case[0], diagram=case[1], error=f"{type(e).__name__}: {e}",
                       trace=traceback.format_exc(limit=4))
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))

    print(f"\n{meta['device']}  torch {meta['torch']}  {arch}  mma.sync peak "
          f"{meta['mma_sync_peak'].get('tflops', math.nan):.0f} TFLOP/s")
    print(f"{'case':34s} {'tiles':24s} {'regs':>4s} {'ms':>8s} {'TFLOP/s':>8s} {'torch':>8s} {'x':>5s} {'err':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:34s} ERROR {r['error'][:90]}")
            continue
        t = r["tunables"]
        tiles = (f"{t.get('BM')}x{t.get('BN')}x{t.get('BK')} s{t.get('stages')} {t.get('engine', '')}" if "BM" in t else
                 f"q{t.get('BQ')} x{t.get('BX')}/{t.get('SX')} w{t.get('WQ')}")
        err = r.get("rel_err_vs_torch", r.get("rel_err_vs_reference_fp32", math.nan))
        print(f"{r['label']:34s} {tiles:24s} {r.get('registers', 0):4d} {r['ms']:8.3f} {r['tflops']:8.1f} "
              f"{r.get('torch_tflops', math.nan):8.1f} {r.get('speedup_vs_torch', math.nan):5.2f} {err:8.1e}")


if __name__ == "__main__":
    main()
