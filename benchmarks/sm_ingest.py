#!/usr/bin/env python3
"""How fast a few SMs can pull bytes from HBM: a streaming read on N blocks, one block an SM.

    PYTHONPATH=. python3 benchmarks/sm_ingest.py [--out FILE.jsonl] [--mb-per-block 8]

The performance model lets HBM and L2 run at the chip's rate whatever the grid. A kernel of fewer
blocks than SMs cannot: each SM's path from L2 moves a limited number of bytes per cycle, and the
bytes one SM keeps in flight bound it by Little's law. This measures the rate for grids of 1 to
every SM: each block reads its own ``--mb-per-block`` MB slice once with 16-byte loads
(``ld.global.nc.v4``), ``U`` loads a thread in flight, and writes one word (so nothing is
optimised away). Two shapes: 1024 threads x 8 loads (128 KiB in flight an SM) and 256 x 4 (16 KiB).
Times are CUDA events around one launch, the L2 flushed before each (a 256 MiB write), medians
of 15. Each line: blocks, threads, loads in flight, GB/s for the grid and for one SM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

KERNEL = r"""
extern "C" __global__ void stream_read(const uint4* __restrict__ src, unsigned long long per_block,
                                       unsigned int* __restrict__ sink) {
  const uint4* p = src + blockIdx.x * per_block;
  unsigned int acc = 0;
  for (unsigned long long i = threadIdx.x; i < per_block; i += (unsigned long long)blockDim.x * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned long long j = i + (unsigned long long)u * blockDim.x;
      v[u] = j < per_block ? __ldg(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;  // never, in practice
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--mb-per-block", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    import cupy as cp
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    name = torch.cuda.get_device_name()
    per_block = int(args.mb_per_block * 2 ** 20) // 16
    grids = sorted({1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, sms, 2 * sms})
    src = torch.empty(max(grids) * per_block * 16, dtype=torch.uint8, device="cuda").random_(0, 255)
    sink = torch.zeros(max(grids) * 1024, dtype=torch.int32, device="cuda")
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    out = open(args.out, "w") if args.out else None
    for threads, unroll in ((1024, 8), (256, 4)):
        fn = cp.RawKernel(f"#define U {unroll}\n" + KERNEL, "stream_read", options=("-std=c++17",))
        for n in grids:
            times = []
            for _ in range(args.reps):
                flush.fill_(1)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn((n,), (threads,), (cp.uint64(src.data_ptr()), cp.uint64(per_block), cp.uint64(sink.data_ptr())))
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
            t = statistics.median(times)
            gbps = n * per_block * 16 / t / 1e9
            rec = dict(device=name, sms=sms, blocks=n, threads=threads, loads_in_flight=unroll,
                       bytes=n * per_block * 16, seconds=t, gbps=gbps, gbps_per_sm=gbps / min(n, sms))
            print(f"{n:4d} blocks x {threads:4d} threads x {unroll} loads: {gbps:7.1f} GB/s, "
                  f"{gbps / min(n, sms):6.1f} GB/s an SM ({t * 1e6:8.1f} us)", flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
