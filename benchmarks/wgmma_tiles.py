#!/usr/bin/env python3
"""Time chosen wgmma tiles of a plain product beside cuBLAS, over several shapes: which tile is
fastest where, and how far the model's price of each is from its time.

    PYTHONPATH=. python3 benchmarks/wgmma_tiles.py --shapes 12800x768x3072,4096x4096x4096 \\
        [--tiles 128:256:64:4,128:192:128:4,128:128:128:6] [--extra 128:256:64:3] \\
        [--gpu h200] [--out $OUT/wgmma_tiles.jsonl]

A shape is ``MxKxN`` (C[M, N] = A[M, K] · B[K, N], bf16). A tile is ``g_a:g_c:w_a:stages`` as the
contraction family's candidates have them (``w_a = g_a``: the ping-pong kernel, two consumers
owning whole tiles; ``w_a = 64``: the cooperative one, two consumers sharing each tile).
``--extra`` adds configurations the family does not offer (more or fewer ring stages) for this
run only. Each tile runs as its own plan (``napkin.codegen.compile(schedule=...)``), is checked
against the fp32 product (relative error), and is timed by CUDA events with L2 flushed (median of
the call) and by the torch profiler (the kernels' own time, the median of 20 calls); cuBLAS
(``A @ B``) is timed alike. One JSON line a shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_TILES = "128:256:64:4,128:192:128:4,128:128:128:6"


def parse_tiles(text: str) -> list[tuple[int, int, int, int]]:
    """``"128:256:64:4,..."`` -> [(g_a, g_c, w_a, stages), ...]; ValueError names a bad one."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            g_a, g_c, w_a, stages = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"tile {part!r}: expected g_a:g_c:w_a:stages, four integers") from None
        out.append((g_a, g_c, w_a, stages))
    return out


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"12800x768x3072,..."`` -> [(M, K, N), ...]; ValueError names a bad one."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            m, k, n = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {part!r}: expected MxKxN, three integers") from None
        out.append((m, k, n))
    return out


def tile_of(schedule) -> tuple[int, int, int, int, str]:
    """(g_a, g_c, w_a, stages, engine) of a contraction candidate of ``matmul``."""
    k = schedule.kernels[0]
    sizes = {(r.kind, r.level, r.axis): int(r.size) for r in k.relabels}
    return (sizes.get(("group", "SMEM", "a")), sizes.get(("group", "SMEM", "c")), sizes.get(("group", "RF", "a")),
            k.options.stages, k.options.engine)


def add_extra(extra: list[tuple[int, int, int, int]]) -> None:
    """Offer configurations beyond the family's tables, for this process only."""
    import napkin.codegen.families.contraction as contraction

    for g_a, g_c, w_a, stages in extra:
        row = (g_a, g_c, 64, w_a, g_c, stages, 1)
        if w_a == g_a:
            contraction.WGMMA_PINGPONG_CONFIGS = (*contraction.WGMMA_PINGPONG_CONFIGS, row)
        else:
            contraction.WGMMA_CONFIGS = (*contraction.WGMMA_CONFIGS, row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--tiles", default=DEFAULT_TILES)
    ap.add_argument("--extra", default="", help="configurations to offer beyond the family's, as --tiles")
    ap.add_argument("--gpu", default="h200", help="the profile the candidates are ranked and priced on")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    try:
        shapes, tiles, extra = parse_shapes(a.shapes), parse_tiles(a.tiles), parse_tiles(a.extra)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    add_extra(extra)
    want = set(tiles) | set(extra)
    import torch

    from napkin.bench.timing import kernel_times, time_fn
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen import select
    from napkin.codegen.families import get as get_family
    from napkin.diagrams import library

    fam, gpu = get_family("contraction"), select.resolve_gpu(a.gpu)
    sink = open(a.out, "a") if a.out else None
    for m, k, n in shapes:
        d = library.get("matmul").with_dtype("bf16").bind(a=m, b=k, c=n)
        A = torch.randn(m, k, device="cuda").bfloat16()
        B = torch.randn(k, n, device="cuda").bfloat16()
        ref = A.float() @ B.float()
        row = dict(device=torch.cuda.get_device_name(), M=m, K=k, N=n, profile=a.gpu)
        kt = kernel_times(lambda: A @ B)
        row["cublas"] = dict(kernel_us=sum(kt.values()), kernels=list(kt),
                             call_us=time_fn(lambda: A @ B, warmup=3, reps=30, max_time_s=1.0).median_s * 1e6)
        for rank, r in enumerate(select.rank(d, fam, gpu, "bf16")):
            t = tile_of(r.schedule)
            if t[:4] not in want or t[4] != "wgmma" or r.schedule.kernels[0].options.splits:
                continue
            name = ":".join(map(str, t[:4]))
            try:
                c = compile_diagram(d, schedule=r.schedule)
                err = float((c(A, B).float() - ref).norm() / ref.norm())
                kt = kernel_times(lambda: c(A, B))
                call = time_fn(lambda: c(A, B), warmup=3, reps=30, max_time_s=1.0).median_s * 1e6
                row[name] = dict(kernel_us=sum(kt.values()), call_us=call, predicted_us=r.seconds * 1e6,
                                 rank=rank, rel_err=err)
            except Exception as e:  # noqa: BLE001 - a tile that fails is reported, not a crash
                row[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        line = f"{m}x{k}x{n}: cuBLAS {row['cublas']['kernel_us']:.1f} us"
        for name in sorted(x for x in row if ":" in x):
            v = row[name]
            line += (f" | {name} {v['kernel_us']:.1f} (model {v['predicted_us']:.1f}, #{v['rank']})"
                     if "kernel_us" in v else f" | {name} ERROR")
        print(line, flush=True)
        if sink:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
