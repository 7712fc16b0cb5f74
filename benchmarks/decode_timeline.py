#!/usr/bin/env python3
"""Where a split decode kernel's time goes: a per-block timeline from %globaltimer stamps.

    PYTHONPATH=. python3 benchmarks/decode_timeline.py [--x 4096,16384,131072]
        [--config 64,2,3,49 --config 128,2,1,16] [--out FILE.json]

A diagnostic, not a benchmark: the attention family's rendered source is stamped, before NVRTC
compiles it, at five places of every block (thread 0): the kernel's entry, the first K/V chunk
landed, the loop's end, the partials stored (before the arrival on the tile's counter) and, in the
last split block to arrive, O written by the combine; the block's SM is kept too. The stamps go to
a ``__device__`` array read back through CuPy after one call (L2 flushed before it, as the
benchmarks time). The kernel cache is a fresh temporary directory, so a stamped cubin is never
reused elsewhere. Each ``--config`` is ``chunk,stages,blocks_per_sm,splits`` of the packed 16-row
decode tile (``benchmarks/decode_sweep.py``'s schedules). Anchor lines that move in the template
stop the script with the line it looked for.

The H200's run (``benchmarks/results/nvidia-h200/decode_timeline.json``) is the evidence behind
``napkin.codegen.families.attention.SPLIT_TAIL_ROUND_TRIPS``: from the loop's end to O written
3.2 us at 16 splits, 4.3-5.4 at 32, 6.0-8.9 at 49.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SLOTS = 6  # entry, first chunk, loop end, partials stored, O written (last block), SM id
MAX_BLOCKS = 16384
PRELUDE = f"""
__device__ unsigned long long napkin_timeline[{MAX_BLOCKS} * {SLOTS}];
__device__ __forceinline__ void napkin_stamp(int k) {{
  if (threadIdx.x == 0) {{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const long long b = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    napkin_timeline[b * {SLOTS} + k] = t;
    if (k == 0) {{ unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); napkin_timeline[b * {SLOTS} + 5] = s; }}
  }}
}}
"""


def stamp(src: str) -> str:
    """``src`` with the five stamps (unchanged for a source that is not a split attention kernel)."""
    if "last_to_arrive" not in src or "napkin_attn" not in src:
        return src
    i = src.index('extern "C" __global__')
    head, body = src[:i] + PRELUDE, src[i:]
    edits = [
        (r"(\n  using namespace napkin_attn\w+_cfg;\n)", r"\1  napkin_stamp(0);\n"),
        (r"(\n    napkin::pipeline_wait<STAGES>\(\);[^\n]*\n)", r"\1    if (it == 0) napkin_stamp(1);\n"),
        (r"(\n  napkin::cp_async_wait_all\(\);\n)", r"\1  napkin_stamp(2);\n"),
        (r"(\n)(  if \(!napkin::last_to_arrive\()", r"\1  napkin_stamp(3);\n\2"),
    ]
    for pattern, repl in edits:
        body, n = re.subn(pattern, repl, body, count=1)
        if n != 1:
            raise SystemExit(f"decode_timeline: the template no longer has the line {pattern!r}")
    end = body.rstrip().rindex("}")
    return head + body[:end] + "  napkin_stamp(4);\n}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--x", default="4096,16384,131072")
    ap.add_argument("--config", action="append", default=None, help="chunk,stages,blocks_per_sm,splits")
    ap.add_argument("--calls", type=int, default=3, help="stamped calls a point (each after an L2 flush)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    os.environ["NAPKIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="napkin-timeline-")

    import cupy
    import numpy as np
    import torch

    import napkin.kernels.compile as kc
    from decode_sweep import diagram, schedule_for
    from napkin.bench.timing import device_info, diagram_inputs
    from napkin.codegen import compile as compile_diagram
    from napkin.codegen import select
    from napkin.perfmodel.hardware import match_device_name

    nvrtc = kc.nvrtc_compile
    kc.nvrtc_compile = lambda source, **kw: nvrtc(stamp(source), **kw)  # compile_module looks it up per call
    gpu = select.resolve_gpu(match_device_name(torch.cuda.get_device_name()))
    configs = [tuple(int(v) for v in c.split(",")) for c in (a.config or ["64,2,3,49", "128,2,1,16"])]
    flush = torch.empty(2 * 256 << 20, dtype=torch.uint8, device="cuda")

    def timelines():
        """The stamped arrays of every loaded module that has one."""
        out = []
        for m in list(kc._modules.values()):
            mod = getattr(m, "_loaded", {}).get(torch.cuda.current_device())
            if mod is None:
                continue
            try:
                ptr = mod.get_global_var("napkin_timeline")
            except Exception:  # noqa: BLE001 - a module that was not stamped
                continue
            mem = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, MAX_BLOCKS * SLOTS * 8, m), 0)
            out.append(cupy.ndarray((MAX_BLOCKS, SLOTS), dtype=cupy.uint64, memptr=mem))
        return out

    rows = []
    for x in (int(v) for v in a.x.split(",")):
        d = diagram(x)
        for chunk, stages, blocks, splits in configs:
            c = compile_diagram(d, schedule=schedule_for(d, gpu, chunk, stages, blocks, splits))
            ins = diagram_inputs(d, "bf16", "cuda", seed=1)
            args = list(ins)
            for _ in range(5):
                c(*args)
            torch.cuda.synchronize()
            for call in range(a.calls):
                stamped = timelines()
                for tl in stamped:
                    tl.fill(0)
                flush.zero_()
                torch.cuda.synchronize()
                c(*args)
                torch.cuda.synchronize()
                t = next(a for a in (tl.get().astype(np.int64) for tl in stamped) if a[:, 0].any())  # this call's
                t = t[t[:, 0] > 0]
                us = (t[:, :5] - t[:, 0].min()) / 1e3
                us[t[:, :5] == 0] = np.nan  # the combine's stamp: the last block of a tile only
                last = ~np.isnan(us[:, 4])
                med, mx = (lambda v: float(np.nanmedian(v))), (lambda v: float(np.nanmax(v)))
                row = dict(x=x, chunk=chunk, stages=stages, blocks_per_sm=blocks, splits=splits, call=call,
                           blocks=len(t), sms=len(set(t[:, 5].tolist())), start_spread_us=mx(us[:, 0]),
                           first_chunk_us_median=med(us[:, 1] - us[:, 0]), first_chunk_us_max=mx(us[:, 1] - us[:, 0]),
                           loop_us_median=med(us[:, 2] - us[:, 1]), loop_end_us_max=mx(us[:, 2]),
                           partials_us_median=med(us[:, 3] - us[:, 2]), arrived_us_max=mx(us[:, 3]),
                           combine_us=[round(float(v), 2) for v in us[last, 4] - us[last, 3]], end_us=mx(us[:, 4]))
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
                rows.append(row)
    if a.out:
        a.out.write_text(json.dumps({"device": device_info(), "diagram": "gqa_decode",
                                     "sizes": {"h": 8, "j": 4, "q": 1, "d": 128}, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
