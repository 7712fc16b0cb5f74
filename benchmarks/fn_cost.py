#!/usr/bin/env python3
"""What one evaluation of each whitelisted elementwise function costs on the GPU, in FMA issue
slots, for its fp32 form and for the form kernels of 16-bit values compute
(:meth:`napkin.diagrams.functions.ElementwiseFn.form`): the numbers behind
``napkin.diagrams.functions.MEASURED_SLOTS``, which the cost model prices maps with.

Each form runs in a loop over 8 independent values a thread, 64 times each (x = |F(x)| · 0.25 +
0.3 keeps x in [0.3, ~1]: a form with a branch is timed on its common side), 1056 blocks of 256
threads, CUDA events, the median of 7 launches; the same loop with F = x and with F = one FMA
gives the cost of the loop and of one slot. One JSON line per function and form::

    PYTHONPATH=. python3 benchmarks/fn_cost.py > fn_cost.jsonl
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from napkin.codegen.render import Code, map_expr  # noqa: E402
from napkin.diagrams.functions import FUNCTIONS  # noqa: E402

INC = os.path.join(ROOT, "napkin", "kernels", "cuda")
#: parameters of the functions that take them (in their usual range)
PARAMS = {"scale": [1.1], "shift": [0.1], "pow": [1.5], "hardtanh": [-0.8, 0.9], "softplus": [1.0, 20.0],
          "elu": [0.5], "leaky_relu": [0.2], "softcap": [30.0]}
#: index functions (masks, score modifiers) and selects, which read more than one value
SKIP = {"causal", "sliding_window", "tril", "triu", "alibi", "gate", "zero_inf"}
SRC = r'''
#include "napkin.cuh"
extern "C" __global__ void k(float* out, int iters) {
  float x[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = 0.3f + 0.01f * ((threadIdx.x + j) & 31);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) { float x0 = x[j]; float x1 = x[(j + 1) & 7]; x[j] = fmaf(fabsf(BODY), 0.25f, 0.3f); }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += x[j];
  if (s == 12345.f) out[threadIdx.x] = s;
}
'''


def timeit(body: str) -> float:
    """Milliseconds per evaluation of the loop with ``body`` as F."""
    import cupy as cp

    src = SRC.replace("BODY", body)
    if "napkin::" not in body:
        src = src.replace('#include "napkin.cuh"', "")
    mod = cp.RawModule(code=src, options=("-std=c++17", f"-I{INC}"))
    k = mod.get_function("k")
    out = cp.zeros(1024, cp.float32)
    blocks, threads, iters = 132 * 8, 256, 64
    k((blocks,), (threads,), (out, cp.int32(iters)))
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(7):
        s.record()
        k((blocks,), (threads,), (out, cp.int32(iters)))
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    ts.sort()
    return ts[3] / (blocks * threads * 8 * iters)  # ms per evaluation


def main() -> int:
    base = timeit("x0")
    fma = timeit("fmaf(x0, 1.0001f, 0.0001f)")
    slot = fma - base
    print(json.dumps({"base_ms_per_eval": base, "fma_slot_ms": slot}), flush=True)
    for name, f in FUNCTIONS.items():
        if name in SKIP:
            continue
        xs = [Code("x0"), Code("x1")][: f.arity]
        for half in (False, True):
            if half and not f.cuda_half:
                continue
            try:
                body = str(map_expr(name, xs, PARAMS.get(name, [0.5] * f.n_params), half=half))
                t = timeit(body)
                print(json.dumps({"fn": name, "half": half, "slots": (t - base) / slot, "model_flops": f.flops,
                                  "model_sfu": f.sfu, "body": body[:80]}), flush=True)
            except Exception as e:  # noqa: BLE001 - a form that does not build is reported
                print(json.dumps({"fn": name, "half": half, "error": str(e)[:200]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
