#!/usr/bin/env python3
"""GQA decode on the mma.sync attention family, configurations by hand: which chunk, pipeline
depth, residency and split count stream K and V fastest, next to what the model predicts.

    PYTHONPATH=. python3 benchmarks/decode_sweep.py [--x 4096,16384,32768,131072] [--out FILE.json]

The diagram is ``benchmarks/attention_decode.py:gqa_decode`` at q = 1 (8 key/value heads, 4
query heads each, d = 128, bf16), its query heads packed into one 16-row tile whose keys four
warps share. Every combination of a 64- or 128-key chunk, 2 to 4 stages (those that fit shared
memory), 1 to 3 blocks an SM and a split count (8, 16 and the counts that fill one or two rounds
of the SMs) runs as a hand-written schedule; each is checked against the first one's output and
timed with CUDA events (L2 flushed, median of 40) and by the profiler (the kernels' own time, L2
warm: at x up to 32k part of K and V is still in L2 then). The model's prediction for the same
schedule is beside it. The H200's run is ``benchmarks/results/nvidia-h200/decode_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DIAGRAM = f"{ROOT / 'benchmarks' / 'attention_decode.py'}:gqa_decode"


def config(chunk: int, stages: int, blocks: int, splits: int):
    """The packed 16-row decode tile (four warps sharing a chunk's keys) with these keys a chunk,
    stages, blocks an SM (its register budget) and splits."""
    from napkin.codegen.families.attention import AttentionConfig

    return AttentionConfig(16, chunk, 16, stages, 128, blocks, splits=splits, packed=True, wx=4)


def grid(sms: int, tiles: int, smem_limit: int):
    """(chunk, stages, blocks an SM, splits) of every point whose blocks' shared memory fits an SM."""
    out = []
    for bx in (64, 128):
        for stages in (2, 3, 4):
            for blocks in (1, 2, 3):
                if config(bx, stages, blocks, 1).smem_bytes() * blocks > smem_limit:
                    continue
                for splits in sorted({8, 16, sms * blocks // tiles // 2, sms * blocks // tiles}):
                    out.append((bx, stages, blocks, splits))
    return out


def diagram(x: int):
    """The sweep's diagram at ``x`` keys (q = 1, 8 key/value heads of 4 query heads, d = 128, bf16)."""
    from napkin.cli_common import load

    return load(DIAGRAM).with_dtype("bf16").bind(h=8, j=4, q=1, x=x, d=128)


def schedule_for(d, gpu, chunk: int, stages: int, blocks: int, splits: int):
    """The attention family's schedule of :func:`config` for ``d``."""
    from napkin.codegen.families.attention import FAMILY

    return FAMILY.schedule(d, config(chunk, stages, blocks, splits), gpu=gpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--x", default="4096,16384,32768,131072", help="key counts, comma-separated")
    ap.add_argument("--gpu", default=None, help="the profile the predictions use (default: the GPU at hand)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import torch

    from napkin.bench.timing import device_info, diagram_inputs, kernel_times, time_fn
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen import select
    from napkin.codegen.families import get
    from napkin.perfmodel.hardware import match_device_name

    gpu = select.resolve_gpu(a.gpu or match_device_name(torch.cuda.get_device_name()))
    fam = get("attention")
    rows = []
    for x in (int(v) for v in a.x.split(",")):
        d = diagram(x)
        ins = diagram_inputs(d, "bf16", "cuda", seed=1)
        first = None
        for bx, stages, blocks, splits in grid(gpu.sms, 8, 227 * 1024):
            s = schedule_for(d, gpu, bx, stages, blocks, splits)
            row = dict(x=x, chunk=bx, stages=stages, blocks_per_sm=blocks, splits=splits)
            try:
                c = compile_diagram(d, schedule=s)
                args = list(ins)
                o = c(*args)
                o = (o["O"] if isinstance(o, dict) else o[0] if isinstance(o, (tuple, list)) else o).float()
                first = o if first is None else first
                row["max_abs_diff_to_first"] = float((o - first).abs().max())
                t = time_fn(lambda: c(*args), warmup=20, reps=40, max_time_s=0.5).median_s
                row["us"] = t * 1e6
                row["kernel_us"] = sum(kernel_times(lambda: c(*args)).values())
                row["pred_us"] = select.predict_schedule(d, fam, s, gpu).seconds * 1e6
                row["kv_tbps"] = 2 * 8 * x * 128 * 2 / t / 1e12
            except Exception as e:  # noqa: BLE001 - a configuration that fails is a row, not the end
                row["error"] = f"{type(e).__name__}: {e}"
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            rows.append(row)
    if a.out:
        a.out.write_text(json.dumps({"device": device_info(), "profile": gpu.name, "diagram": "gqa_decode",
                                     "sizes": {"h": 8, "j": 4, "q": 1, "d": 128}, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
