"""One launch of napkin's Hopper attention forward and one of SDPA-cuDNN at each point, inside a
profiler range, for Nsight Compute: the evidence behind ``docs/attention_hopper_gap.md``.

Every kernel is compiled and warmed up before the range opens (``cudaProfilerStart``), so
``ncu --profile-from-start off`` sees exactly the launches that are compared, in order: for each
point the napkin kernel, then cuDNN's. 16 heads, ``--tokens`` tokens a batch, bf16.

    ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/attention_wgmma_profile.py --dims 64 128 --seqs 2048 8192

Without ncu the script prints each kernel's registers, shared memory and grid (what the launch
asks for) and its time (CUDA events, median of ``--reps``).
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from napkin.codegen.api import compile as compile_diagram
    from napkin.diagrams import library

    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    gpu = "h100" if "H100" in torch.cuda.get_device_name() else "h200"
    points = []
    for causal in (False, True):
        for D in a.dims:
            for n in a.seqs:
                b = max(1, a.tokens // n)
                q, k, v = (torch.randn(b, 16, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                d = library.get("attention_causal" if causal else "mha").bind(h=16 * b, q=n, x=n, d=D)
                c = compile_diagram(d, gpu=gpu)
                ins = {"Q": q.view(16 * b, n, D), "K": k.view(16 * b, n, D), "V": v.view(16 * b, n, D)}
                out = c.empty_outputs()

                def mine(c=c, ins=ins, out=out):
                    c(**ins, out=out)

                def cudnn(q=q, k=k, v=v, causal=causal):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

                (launch,) = c.program.launches
                flops = 4 * b * 16 * n * n * D / (2 if causal else 1)
                ms = []
                for fn in (mine, cudnn):
                    ts = []
                    for _ in range(a.reps + 1):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        fn()
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1))
                    ms.append(statistics.median(ts[1:]))
                print(f"{'causal' if causal else 'full  '} d={D} seq={n} b={b}: napkin {launch.name} grid "
                      f"{launch.grid} block {launch.block} smem {launch.shared_bytes} B; "
                      f"{ms[0]:.3f} ms ({flops / ms[0] / 1e9:.0f} TFLOP/s), cuDNN {ms[1]:.3f} ms "
                      f"({flops / ms[1] / 1e9:.0f}), ratio {ms[1] / ms[0]:.2f}", flush=True)
                points.append((mine, cudnn))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for mine, cudnn in points:
        mine()
        cudnn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
