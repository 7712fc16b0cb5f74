#!/usr/bin/env python3
"""Where a huge-K product's time goes: C[a, n] = Σ_k A[a, k] B[k, n] with a = n = 256 and K up to
262144 (the survey's ``huge_k``), bf16, on the wgmma template's split sum (fp32 partials, a
combining launch), against cuBLAS (``torch.matmul``).

Three sweeps, each point checked against the float64 reference and timed with CUDA events, L2
flushed, median of 50, in one process:

- ``scaling``: the planner's pick and cuBLAS at K = 16384 … 262144 (B stored (k, n) and (n, k)), with
  each one's kernels timed by the torch profiler (``kernels_us``: GPU time of each kernel, median
  of 20 calls; the events' time less their sum is time the GPU waited for the host).
- ``tiles``: every wgmma tile (cooperative and ping-pong) and the small tiles the planner does not
  offer (64 × 64, 64 × 128, 128 × 64: more blocks a tile's worth of output, as cuBLAS's split-K
  kernels use) × 8, 16, 33 and 66 splits at K = 131072.
- ``cluster``: the same with ``WGMMA_CLUSTER`` = 2 (a setting, off on main): two blocks of a
  cluster take tiles of consecutive block rows and share one copy of B through TMA multicast.

One JSON line per point (``--scaling``: the first sweep only)::

    PYTHONPATH=. python3 benchmarks/huge_k_sweep.py > huge_k_sweep.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SCALING_K = (16384, 32768, 65536, 131072, 262144)
SWEEP_K = 131072
SPLITS = (8, 16, 33, 66)
#: tiles the planner does not offer (BM, BN, BK, WM, WN, stages, blocks a SM)
SMALL_TILES = ((64, 64, 64, 64, 64, 8, 1), (64, 128, 64, 64, 128, 8, 1), (128, 64, 64, 64, 64, 8, 1))


def product(kmajor_b: bool):
    """C = A·B with B stored (k, n) (``kmajor_b`` False, as ``torch.matmul(A, B)``) or (n, k)."""
    import napkin.diagrams as nd

    a, k, n = nd.axes("a k n")
    B = nd.array("B", n, k) if kmajor_b else nd.array("B", k, n)
    return nd.Diagram("huge_k_t" if kmajor_b else "huge_k",
                      nd.contract(nd.array("A", a, k), B, over=k, out=(a, n), name="C"))


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def kernel_times(fn, calls: int = 20) -> dict[str, float]:
    """GPU µs of each kernel ``fn`` launches (median over ``calls`` calls), from the torch profiler."""
    from napkin.bench.timing import kernel_times as profiled

    return {k[:60]: round(v, 1) for k, v in profiled(fn, calls=calls).items()}


def main() -> None:
    import torch

    from expand_recompute_ab import checked_timing
    from napkin.bench.timing import time_fn
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families import contraction as C
    from napkin.codegen.prepare import prepare
    from napkin.diagrams.reference import random_inputs

    gpu = torch.cuda.get_device_name()
    for kmajor_b in (False, True):
        for K in SCALING_K:
            d = prepare(product(kmajor_b), sizes=dict(a=256, k=K, n=256), dtype="bf16")
            ins = random_inputs(d, device="cuda", seed=1)
            A, B = ins["A"], ins["B"]
            def mm():
                return torch.matmul(A, B.t() if kmajor_b else B)

            cublas = time_fn(mm, reps=50).median_s * 1e6
            cd = napkin_compile(d)
            r = checked_timing(cd, ins)
            emit(sweep="scaling", gpu=gpu, case=d.name, K=K, cublas_us=round(cublas, 1), x_cublas=round(cublas / r["us"], 3),
                 options=str(cd.plan.kernels[0].kernel.options), kernels_us=kernel_times(lambda: cd(*[ins[n] for n in cd.input_names])),
                 cublas_kernels_us=kernel_times(mm), **r)
            if K != SWEEP_K or "--scaling" in sys.argv:
                continue
            for cluster in (1, 2):
                C.WGMMA_CLUSTER = cluster
                cfgs = [(c, False) for c in C.WGMMA_CONFIGS]
                cfgs += [(c, True) for c in C.WGMMA_PINGPONG_CONFIGS] if cluster == 1 else []  # ping-pong: no cluster
                cfgs += [(c, False) for c in SMALL_TILES] if cluster == 1 else []
                for (cfg, pingpong) in cfgs:
                    for splits in SPLITS:
                        mc = C.MatmulConfig(False, *cfg, wgmma=True, splits=splits, pingpong=pingpong)
                        sc = C.FAMILY.schedule(d, mc)
                        cd = napkin_compile(d, schedule=sc, family="contraction")
                        r = checked_timing(cd, ins)
                        emit(sweep="tiles" if cluster == 1 else "cluster", gpu=gpu, case=d.name, K=K, cluster=cluster,
                             tile=list(cfg[:2]), pingpong=pingpong, splits=splits, cublas_us=round(cublas, 1),
                             x_cublas=round(cublas / r["us"], 3), grids=[list(l.grid) for l in cd.program.launches], **r)
            C.WGMMA_CLUSTER = 1


if __name__ == "__main__":
    main()
