"""Repeat the persistent wgmma kernels (every cooperative and ping-pong tile, TMA stores) on batched
products whose tiles hold 64 x 64 output blocks wholly past M or N, on fresh random inputs each
run, and count wrong results against torch (relative error over 2e-2).

Usage: ``python3 benchmarks/tma_store_edge_race.py REPS``; one JSON line per kernel and shape on
stdout (``results/nvidia-h200/tma_store_edge_race_s28.jsonl``: the ping-pong 128 x 128 kernel was
wrong in 21 of 60 runs before a block past M committed its empty bulk group, 0 of 40 after).
"""

from __future__ import annotations

import json
import sys

SHAPES = (dict(n=45, a=300, b=256, c=136), dict(n=64, a=200, b=128, c=520))


def main(reps: int) -> None:
    import torch

    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.families.contraction import (FAMILY, WGMMA_CONFIGS, WGMMA_PINGPONG_CONFIGS,
                                                     MatmulConfig)
    from napkin.diagrams import library

    bmm = library.get("batched_matmul")
    for pingpong, table in ((True, WGMMA_PINGPONG_CONFIGS), (False, WGMMA_CONFIGS)):
        for c in table:
            cfg = MatmulConfig(False, *c, wgmma=True, pingpong=pingpong)
            for shape in SHAPES:
                sched = FAMILY.schedule(bmm.with_dtype("bf16").bind(**shape), cfg)
                cd = napkin_compile(bmm, sizes=shape, dtype="bf16", family="contraction", schedule=sched)
                bad, worst = 0, 0.0
                for r in range(reps):
                    g = torch.Generator(device="cuda").manual_seed(r)
                    A = torch.randn(shape["n"], shape["a"], shape["b"], device="cuda", generator=g).bfloat16()
                    B = torch.randn(shape["n"], shape["b"], shape["c"], device="cuda", generator=g).bfloat16()
                    want = torch.bmm(A.float(), B.float())
                    err = ((cd(A, B).float() - want).norm() / want.norm()).item()
                    worst = max(worst, err)
                    bad += not err < 2e-2
                print(json.dumps(dict(BM=cfg.BM, BN=cfg.BN, pingpong=pingpong, shape=shape, reps=reps,
                                      bad=bad, worst=worst)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
