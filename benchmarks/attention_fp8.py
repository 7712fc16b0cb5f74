"""The fp8 (e4m3) attention forward (``napkin.codegen.families.attention_fp8``) on the sweep of
issue #13: batch x 16 heads x seq with 16k tokens a batch, head dims 128 and 256, causal and not,
against PyTorch's SDPA in bf16 (flash and cuDNN backends) for reference. Prints one line a point:
TFLOP/s (4·B·H·N²·d, half of it causal) of the whole fp8 program (the Vt pre-pass and the
kernel), of the kernel alone (the pre-pass timed by itself and subtracted), the model's
prediction, and SDPA's (``--both-loops``: at d = 128 the tiles' other loop too). L2 flushed before every timed run (``napkin.bench.timing.time_fn``).

    PYTHONPATH=. python3 benchmarks/attention_fp8.py --seqs 4096 8192 16384 --json out.json

``--sweep-at 8192`` times instead, at d = 128, the two-stage loop with each share of exp2 on the
FMA pipe (``--polys``, of 16) and each ring depth (``--sweep-stages``), with and without
ping-pong, causal and not, and prints each output's relative RMS error against the fp32
reference on the dequantised inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json


def main() -> None:
    import torch
    import torch.nn.functional as Fn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from napkin.bench.timing import time_fn
    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.families import attention_fp8
    from napkin.codegen.families.attention import FAMILY
    from napkin.codegen.lower import build
    from napkin.codegen.planner import derive
    from napkin.diagrams import library

    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--all-configs-at", type=int, default=None, help="time every configuration at this seq")
    ap.add_argument("--both-loops", action="store_true", help="at d = 128 also time the other loop of the tiles")
    ap.add_argument("--sweep-at", type=int, default=None,
                    help="at this seq and d = 128, causal and not: time the two-stage loop with every share of "
                         "exp2 on the FMA pipe in --polys, with and without ping-pong, and check each output")
    ap.add_argument("--polys", type=int, nargs="+", default=[0, 2, 4, 6, 8])
    ap.add_argument("--sweep-stages", type=int, nargs="+", default=[4])
    args = ap.parse_args()
    gpu = "h200" if "H200" in torch.cuda.get_device_name() else "h100"
    rows = []
    for D in () if args.sweep_at else args.dims:  # --sweep-at: the sweep alone
        for causal in (False, True):
            for N in args.seqs:
                B = max(1, args.tokens // N)
                H = args.heads * B  # batch and heads flatten alike (K and V carry both)
                name = "attention_causal" if causal else "mha"
                d = library.get(name).with_dtype("fp8").bind(h=H, q=N, x=N, d=D)
                plan = derive(d, gpu, "fp8", explain=False).plan
                program = build(plan, arch="sm_90a")
                assert program.launches[-1].template == attention_fp8.TEMPLATE
                scale = 1.0 / 240
                program = attention_fp8.with_scales(program, descale_q=scale, descale_k=scale, descale_v=scale,
                                                    scale_o=64.0)
                cd = CompiledDiagram(program, arch="sm_90a")
                vt_only = CompiledDiagram(dataclasses.replace(program, launches=program.launches[:1]), arch="sm_90a")
                q, k, v = (torch.randn(H, N, D, device="cuda").mul_(60).to(torch.float8_e4m3fn) for _ in range(3))
                flops = 4 * B * args.heads * N * N * D * (0.5 if causal else 1.0)
                t_all = time_fn(lambda: cd(q, k, v), reps=args.reps, warmup=3).median_s
                t_vt = time_fn(lambda: vt_only(q, k, v), reps=args.reps, warmup=3).median_s
                qb, kb, vb = (torch.randn(B, args.heads, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                sdpa = {}
                for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            sdpa[label] = time_fn(lambda: Fn.scaled_dot_product_attention(qb, kb, vb, is_causal=causal),
                                                  reps=args.reps, warmup=3).median_s
                    except RuntimeError:
                        sdpa[label] = None
                row = dict(gpu=torch.cuda.get_device_name(), d=D, causal=causal, seq=N, batch=B, heads=args.heads,
                           stages=program.schedule.kernels[0].options.stages, fp8_s=t_all, vt_s=t_vt,
                           fp8_tflops=flops / t_all / 1e12, kernel_tflops=flops / (t_all - t_vt) / 1e12,
                           predicted_s=plan.seconds, predicted_tflops=flops / plan.seconds / 1e12,
                           **{f"sdpa_{k}_bf16_tflops": (flops / t / 1e12 if t else None) for k, t in sdpa.items()})
                rows.append(row)
                cfg = attention_fp8.config_of(FAMILY.problem(d), d, plan.schedule)
                row["overlap"] = cfg.overlap
                if args.both_loops and D in attention_fp8.CONFIGS and D == 128:  # the other loop, same tiles
                    other = dataclasses.replace(cfg, overlap=not cfg.overlap, pingpong=False)
                    alt = CompiledDiagram(attention_fp8.with_scales(
                        attention_fp8.lower_config(FAMILY, d, other), descale_q=scale, descale_k=scale,
                        descale_v=scale, scale_o=64.0), arch="sm_90a")
                    t_alt = time_fn(lambda: alt(q, k, v), reps=args.reps, warmup=3).median_s
                    row["other_loop_tflops"] = flops / t_alt / 1e12
                    print(f"d={D:3d} causal={int(causal)} seq={N:5d}: the other loop (two stages {other.overlap}) "
                          f"{row['other_loop_tflops']:7.1f} TFLOP/s", flush=True)
                    del alt
                fmt = lambda x: f"{x:7.1f}" if x else "    n/a"  # noqa: E731
                print(f"d={D:3d} causal={int(causal)} seq={N:5d} B={B:2d}: fp8 {row['fp8_tflops']:7.1f} TFLOP/s "
                      f"(kernel {row['kernel_tflops']:7.1f}, pre-pass {t_vt * 1e6:6.1f} us), model "
                      f"{row['predicted_tflops']:7.1f}; SDPA bf16 flash {fmt(row['sdpa_flash_bf16_tflops'])}, "
                      f"cudnn {fmt(row['sdpa_cudnn_bf16_tflops'])}", flush=True)
                del cd, vt_only, q, k, v, qb, kb, vb
                torch.cuda.empty_cache()
    if args.all_configs_at:  # every configuration and loop, non-causal, at one sequence length
        N = args.all_configs_at
        B = max(1, args.tokens // N)
        H = args.heads * B
        for D in args.dims:
            d = library.get("mha").with_dtype("fp8").bind(h=H, q=N, x=N, d=D)
            q, k, v = (torch.randn(H, N, D, device="cuda").mul_(60).to(torch.float8_e4m3fn) for _ in range(3))
            flops = 4 * B * args.heads * N * N * D
            cfgs = sorted({c for c in attention_fp8.configs(D)}
                          | ({dataclasses.replace(c, overlap=not c.overlap, pingpong=False)
                              for c in attention_fp8.configs(D)}
                             if D == 128 else set()), key=str)
            for cfg in cfgs:
                cd = CompiledDiagram(attention_fp8.lower_config(FAMILY, d, cfg), arch="sm_90a")
                t = time_fn(lambda: cd(q, k, v), reps=args.reps, warmup=3).median_s
                rows.append(dict(gpu=torch.cuda.get_device_name(), d=D, causal=False, seq=N, batch=B,
                                 heads=args.heads, config=str(cfg), fp8_s=t, fp8_tflops=flops / t / 1e12))
                print(f"d={D:3d} seq={N:5d} {cfg}: {flops / t / 1e12:7.1f} TFLOP/s", flush=True)
    if args.sweep_at:
        rows += sweep(args, torch, FAMILY, attention_fp8, library, time_fn, CompiledDiagram)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def sweep(args, torch, FAMILY, attention_fp8, library, time_fn, CompiledDiagram) -> list[dict]:
    """The two-stage loop at d = 128 and seq ``--sweep-at`` with each share of exp2 on the FMA pipe
    (``--polys``, of 16) and each stage count, with and without ping-pong, causal and not: TFLOP/s
    and the relative RMS error of O against the fp32 reference on the dequantised inputs."""
    import torch.nn.functional as Fn

    N, D = args.sweep_at, 128
    B = max(1, args.tokens // N)
    H = args.heads * B
    q, k, v = (torch.randn(H, N, D, device="cuda").mul_(60).to(torch.float8_e4m3fn) for _ in range(3))
    scale = 1.0 / 240
    rows = []
    for causal in (False, True):
        d = library.get("attention_causal" if causal else "mha").with_dtype("fp8").bind(h=H, q=N, x=N, d=D)
        ref = Fn.scaled_dot_product_attention(*(t.float().mul(scale)[None] for t in (q, k, v)), is_causal=causal)[0]
        scale_o = 200.0 / float(ref.abs().max())
        flops = 4 * B * args.heads * N * N * D * (0.5 if causal else 1.0)
        for st in args.sweep_stages:
            for pp in (False, True):
                for poly in args.polys:
                    cfg = attention_fp8.Fp8AttentionConfig(D, 2, st, True, poly, pp)
                    prog = attention_fp8.with_scales(attention_fp8.lower_config(FAMILY, d, cfg), descale_q=scale,
                                                     descale_k=scale, descale_v=scale, scale_o=scale_o)
                    cd = CompiledDiagram(prog, arch="sm_90a")
                    out = cd(q, k, v)
                    rms = float((out.float() / scale_o - ref).norm() / ref.norm())
                    t = time_fn(lambda: cd(q, k, v), reps=args.reps, warmup=3).median_s
                    rows.append(dict(gpu=torch.cuda.get_device_name(), d=D, causal=causal, seq=N, batch=B,
                                     heads=args.heads, config=str(cfg), fp8_s=t, fp8_tflops=flops / t / 1e12,
                                     rel_rms=rms))
                    print(f"sweep d={D} causal={int(causal)} seq={N} stages={st} poly={poly:2d}/16 pingpong={int(pp)}: "
                          f"{flops / t / 1e12:7.1f} TFLOP/s (pre-pass included), relative RMS {rms:.4f}", flush=True)
                    del cd, out
    return rows


if __name__ == "__main__":
    main()
