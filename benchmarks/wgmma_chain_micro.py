#!/usr/bin/env python3
"""How long one wgmma k16 step takes when it waits on the one before: a warpgroup issues R chunks
of four m64nNk16 products (bf16, fp32 accumulators, operands read from shared memory through
128-byte swizzled descriptors) into one accumulator tile, committing each chunk and keeping one in
flight, as the contraction template's consumers do, and times them with clock64.

    python3 benchmarks/wgmma_chain_micro.py [--out FILE.jsonl]

One JSON line per N (8 to 256) and grid (1 block, one a SM, two a SM): clocks a step (the median
block), and the launch's microseconds by CUDA events. Needs an sm_90 GPU and CuPy (NVRTC builds
the kernels for sm_90a). ``results/nvidia-h200/wgmma_chain_micro_s28.jsonl`` holds an H200's run:
19 / 21 / 24 / 32 / 64 / 128 clk a step at N = 8 / 16 / 32 / 64 / 128 / 256, doubled with two
blocks an SM (the steps share the SM's tensor cores): past N = 32 a step runs at the tensor rate.
"""

from __future__ import annotations

import argparse
import json

WIDTHS = (8, 16, 32, 64, 128, 256)
CHUNKS = 256
SMEM = 50176  # 48 KB of zeros for both operands, and 1 KB to align them on a swizzle atom


def source() -> str:
    """The CUDA source: one kernel ``chainN`` per wgmma N."""
    out = ["typedef unsigned long long u64; typedef unsigned u32;",
           "__device__ __forceinline__ u64 desc(u32 addr) {",
           "  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)64 << 32) | ((u64)1 << 62);",
           "}"]
    for n in WIDTHS:
        acc = n // 2
        operands = ", ".join(f"%{i}" for i in range(acc))
        constraints = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
        out.append(f"""
extern "C" __global__ void __launch_bounds__(128, 1) chain{n}(long long* clk, int chunks, float* sink) {{
  extern __shared__ __align__(1024) unsigned char sm[];
  for (int i = threadIdx.x; i < 49152 / 4; i += 128) reinterpret_cast<float*>(sm)[i] = 0.f;
  __syncthreads();
  u32 base = ((u32)__cvta_generic_to_shared(sm) + 1023) & ~1023u;
  float d[{acc}];
  for (int i = 0; i < {acc}; ++i) d[i] = 0.f;
  long long t0 = clock64();
  for (int r = 0; r < chunks; ++r) {{
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {{
      u64 da = desc(base + kk * 32), db = desc(base + 16384 + kk * 32);
      asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 2}, 0;\\n"
                   "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{operands}}}, %{acc}, %{acc + 1}, p, 1, 1, 0, 0;\\n}}\\n"
                   : {constraints} : "l"(da), "l"(db), "r"(1));
    }}
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
  long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < {acc}; ++i) s += d[i];
  if (s == 12345.f) sink[threadIdx.x] = s;  // (keeps the products)
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}}""")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    import cupy as cp
    import numpy as np

    mod = cp.RawModule(code=source(), options=("-arch=sm_90a", "-std=c++17"))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    clk = cp.zeros(4 * sms, dtype=cp.int64)
    sink = cp.zeros(128, dtype=cp.float32)
    rows = []
    for n in WIDTHS:
        f = mod.get_function(f"chain{n}")
        f.max_dynamic_shared_size_bytes = SMEM
        for blocks in (1, sms, 2 * sms):
            launch = lambda: f((blocks,), (128,), (clk, np.int32(CHUNKS), sink), shared_mem=SMEM)  # noqa: E731
            launch()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            launch()
            end.record()
            end.synchronize()
            row = dict(N=n, blocks=blocks, clk_per_step=float(np.median(clk[:blocks].get())) / (4 * CHUNKS),
                       us=cp.cuda.get_elapsed_time(start, end) * 1e3, chunks=CHUNKS)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
