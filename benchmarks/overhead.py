"""Host-path overhead, small matmuls against cuBLAS with and without CUDA graphs, and compile
times of generated kernels (issue #14). Run on the GPU from the repository root:

    PYTHONPATH=. python3 benchmarks/overhead.py [--out benchmarks/results] [--quick]

It writes ``<out>/<gpu>/overhead.json`` (the raw numbers) and prints the markdown tables that
BENCHMARKS.md quotes. What it measures:

1. **Launch overhead**, on a 64×64×64 bf16 matmul (the GPU finishes each kernel sooner than the
   host launches the next): host microseconds per call of the prepared launch alone, of a
   compiled diagram's call (cheap check, output allocated, launch), of its checked path, of the
   generic ``CompiledKernel`` launcher every call used before (tensor checks, CuPy and ctypes
   per argument), of the PyTorch operator (dispatcher and autograd layer; also under
   ``torch.inference_mode``), of a ``torch.compile(fullgraph=True)`` function around it, of a CUDA
   graph replay, and of ``A @ B`` itself. Each is the median over batches of 400 calls timed on
   the host without waiting for the GPU (fewer calls than the launch queue holds).
2. **Small shapes**: ``a×c×b`` = 1000×1000×1000 and 2048×2048×512 (M×N×K) bf16 matmuls, napkin
   (compiled diagram call, PyTorch operator, CUDA graph) against cuBLAS (``A @ B``, and in a CUDA
   graph), each as wall time per call over a loop of back-to-back calls and as CUDA-event time
   over the same loop; ratios are cuBLAS time / napkin time (≥ 0.8 is the target). The planner's
   plan, and the fastest of the model's six best configurations measured here (``tuned``).
3. **Compile times**, each in a fresh process: ``napkin.codegen.compile`` of one kernel cold (an
   empty cache: planning and NVRTC) and cached (the same cache in a second process: the plan and
   the cubin read from disk), then its first call; and a dynamic diagram's plan for its range,
   and the cost of a new size (re-lowered; the kernel reused, or compiled for a row-wise one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- helpers


def host_us(fn, *, batch: int = 400, batches: int = 15) -> float:
    """Median host microseconds per call over ``batches`` batches of ``batch`` calls, the GPU
    idle at the start of each batch (no wait inside one)."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per.append((time.perf_counter() - t0) / batch)
    torch.cuda.synchronize()
    return statistics.median(per) * 1e6


def loop_us(fn, *, n: int = 200, repeats: int = 7) -> dict:
    """Wall time (host clock, waiting for the GPU at the end) and CUDA-event time per call over a
    loop of ``n`` back-to-back calls; medians over ``repeats`` loops."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    wall, events = [], []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) / n * 1e6)
        events.append(e0.elapsed_time(e1) / n * 1e3)
    return {"wall_us": statistics.median(wall), "events_us": statistics.median(events)}


def graphed(fn, *args):
    """``fn(*args)`` captured in a CUDA graph; returns a replay function."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    return g.replay


def rand(*shape, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).bfloat16()


# ----------------------------------------------------------------------------- 1. launch overhead


def launch_overhead() -> dict:
    import torch

    import napkin.torch as nt

    op = nt.op("matmul", sizes={"a": 64, "b": 64, "c": 64}, dtype="bf16")
    cd = op.compiled
    A, B = rand(64, 64), rand(64, 64, seed=1)
    C = cd(A, B)
    runner = cd._runners[torch.cuda.current_device()]
    launch = runner.launches[0]
    ptrs = [A.data_ptr(), B.data_ptr(), C.data_ptr()]  # the environment: inputs, then outputs
    stream = torch.cuda.current_stream().cuda_stream
    kernel = cd._compiled()[0]
    prog = cd.program.launches[0]

    def generic():
        args = []
        for a in prog.args:
            t = {"A": A, "B": B, "C": C}.get(a.name)
            if a.kind == "tensor":
                args.append(t)
            elif a.kind == "tmap":
                from napkin.kernels.tma import tensor_map

                args.append(tensor_map(t, a.value))
            else:
                args.append(a.scalar())
        kernel(prog.grid, prog.block, args, prog.shared_bytes)

    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True)
    compiled_mm = torch.compile(lambda a, b: a @ b, fullgraph=True)
    graphed_op = torch.compile(lambda a, b: op(a, b), fullgraph=True, mode="reduce-overhead")
    graphed_mm = torch.compile(lambda a, b: a @ b, fullgraph=True, mode="reduce-overhead")
    replay = nt.cuda_graph(op, A, B).replay
    overload = op.overload
    W = torch.nn.Parameter(B.clone())  # a weight that needs a gradient: the autograd path
    out = {
        "problem": "matmul 64x64x64 bf16",
        "prepared_launch_us": host_us(lambda: launch(ptrs, stream)),
        "diagram_call_us": host_us(lambda: cd(A, B)),
        "diagram_checked_call_us": host_us(lambda: cd(A, B, out=C)),
        "generic_launcher_us": host_us(generic),
        "op_call_us": host_us(lambda: op(A, B)),
        "op_dispatcher_us": host_us(lambda: overload(A, B)),
        "op_autograd_us": host_us(lambda: op(A, W), batch=100, batches=7),
        "compiled_fn_us": host_us(lambda: compiled(A, B)),
        "compiled_matmul_us": host_us(lambda: compiled_mm(A, B)),
        "reduce_overhead_op_us": host_us(lambda: graphed_op(A, B)),
        "reduce_overhead_matmul_us": host_us(lambda: graphed_mm(A, B)),
        "cuda_graph_replay_us": host_us(replay),
        "torch_matmul_us": host_us(lambda: A @ B),
    }
    with torch.inference_mode():
        out["op_call_inference_mode_us"] = host_us(lambda: op(A, B))
        out["op_dispatcher_inference_mode_us"] = host_us(lambda: overload(A, B))
    return out


# ----------------------------------------------------------------------------- 2. small shapes


def tuned_diagram(sizes: dict, top: int):
    """The fastest of the model's ``top`` best contraction configurations, each timed in a CUDA
    graph (GPU time: an eager loop here would time the host)."""
    import napkin.codegen as cg
    from napkin.bench.autotune import model_ranking
    from napkin.codegen.prepare import prepare
    from napkin.codegen.select import resolve_gpu

    d = prepare("matmul", sizes=sizes)
    A, B = rand(sizes["a"], sizes["b"]), rand(sizes["b"], sizes["c"], seed=1)
    best = None
    tried = []
    for sched, pred in model_ranking(d, "contraction", resolve_gpu(None), "bf16")[:top]:
        try:
            cd = cg.compile(d, schedule=sched, family="contraction")
            t = loop_us(graphed(cd, A, B), n=100, repeats=3)["events_us"]
        except Exception as e:  # noqa: BLE001 - a configuration that fails is reported, not fatal
            tried.append({"schedule": str(sched.kernels[0]), "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        tried.append({"schedule": str(sched.kernels[0]), "pred_us": pred * 1e6, "events_us": t})
        if best is None or t < best[0]:
            best = (t, cd)
    return (best[1] if best else None), tried


def small_shapes(top: int) -> list[dict]:
    import torch

    import napkin.torch as nt

    rows = []
    for a, c, b in ((1000, 1000, 1000), (2048, 2048, 512)):
        sizes = {"a": a, "b": b, "c": c}
        op = nt.op("matmul", sizes=sizes, dtype="bf16")
        cd = op.compiled
        A, B = rand(a, b), rand(b, c, seed=1)
        ref = (A.float() @ B.float())
        err = ((cd(A, B).float() - ref).abs().max() / ref.abs().max()).item()
        tuned, tried = tuned_diagram(sizes, top)
        row = {
            "shape": f"{a}x{c}x{b}", "sizes": sizes, "max_rel_error": err,
            "plan": cd.plan.summary(),
            "cublas": loop_us(lambda: A @ B),
            "cublas_graph": loop_us(graphed(lambda x, y: x @ y, A, B)),
            "napkin": loop_us(lambda: cd(A, B)),
            "napkin_op": loop_us(lambda: op(A, B)),
            "napkin_graph": loop_us(nt.cuda_graph(op, A, B).replay),
            "tuned_candidates": tried,
        }
        if tuned is not None:
            row["napkin_tuned"] = loop_us(lambda: tuned(A, B))
            row["napkin_tuned_graph"] = loop_us(graphed(lambda x, y: tuned(x, y), A, B))
            row["tuned_plan"] = tuned.plan.summary()
        base = row["cublas"]
        row["ratio"] = {k: {m: base[m] / row[k][m] for m in ("wall_us", "events_us")}
                        for k in ("napkin", "napkin_op", "napkin_graph", "napkin_tuned", "napkin_tuned_graph")
                        if k in row}
        row["ratio_vs_cublas_graph"] = {
            k: {m: row["cublas_graph"][m] / row[k][m] for m in ("wall_us", "events_us")}
            for k in ("napkin_graph", "napkin_tuned_graph") if k in row}
        rows.append(row)
        torch.cuda.synchronize()
    return rows


# ----------------------------------------------------------------------------- 3. compile times

CHILD = r"""
import json, sys, time
import torch
torch.ones(1, device="cuda"); torch.cuda.synchronize()       # CUDA up before the clock starts
import cupy; cupy.cuda.runtime.getDevice()
out = {}
t0 = time.perf_counter()     # napkin's modules: imported once per process, not per kernel
import napkin.codegen as cg
import napkin.codegen.api, napkin.codegen.dynamic, napkin.codegen.lower, napkin.codegen.planner
import napkin.codegen.plancache, napkin.codegen.families, napkin.codegen.select
from napkin.kernels.compile import nvrtc_version
nvrtc_version()
out["imports_s"] = time.perf_counter() - t0
name, sizes, dyn = json.loads(sys.argv[1])
t0 = time.perf_counter()
cd = cg.compile(name, sizes=sizes, dynamic=dyn) if dyn else cg.compile(name, sizes=sizes)
out["compile_s"] = time.perf_counter() - t0
if dyn:
    axis, (lo, hi) = next(iter(dyn.items()))
    first = {axis: hi}
    t0 = time.perf_counter(); at = cd.at(first); out["first_size_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); cd.at({axis: max(lo, hi // 3)}); out["new_size_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); cd.at({axis: max(lo, hi // 7)}); out["another_size_s"] = time.perf_counter() - t0
    out["sources"] = cd.sources; out["specialized"] = [list(s) for s in cd.specialized]
    cd = at
out["kernels"] = len(cd.program.launches)
out["kernel_load_s"] = cd.compile_seconds
ins = [torch.randn(tuple(a.bound_size for a in v.axes), device="cuda").to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[v.dtype])) for v in cd.diagram.inputs]
t0 = time.perf_counter(); cd(*ins); torch.cuda.synchronize(); out["first_call_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def compile_times() -> list[dict]:
    cases = [
        ("matmul", {"a": 1000, "b": 1000, "c": 1000}, None),
        ("layernorm", {"r": 4096, "x": 4096}, None),
        ("mha", {"h": 16, "q": 2048, "x": 2048, "d": 128}, None),
        ("matmul", {"b": 1024, "c": 1024}, {"a": [1, 8192]}),
        ("mha", {"h": 16, "x": 2048, "d": 128}, {"q": [1, 4096]}),
        ("softmax", {"x": 4096}, {"r": [1, 8192]}),
    ]
    rows = []
    for name, sizes, dyn in cases:
        cache = tempfile.mkdtemp(prefix="napkin-cache-")
        env = dict(os.environ, NAPKIN_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        row = {"diagram": name, "sizes": sizes, "dynamic": dyn}
        for phase in ("cold", "cached"):
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, sizes, dyn])], env=env,
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                row[phase] = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"}
            else:
                row[phase] = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"  compile {name} {sizes} {dyn or ''}: {row}", flush=True)
    return rows


# ----------------------------------------------------------------------------- report


def markdown(result: dict) -> str:
    lo = result["launch_overhead"]
    lines = [f"Launch overhead on {result['device']['name']} ({lo['problem']}; host µs per call, median):", "",
             "| path | µs per call |", "|---|---|"]
    names = {
        "prepared_launch_us": "prepared launch alone (`PreparedLaunch`)",
        "diagram_call_us": "compiled diagram call (cheap check, output allocated, launch)",
        "diagram_checked_call_us": "compiled diagram, checked path (`out=` given)",
        "generic_launcher_us": "generic `CompiledKernel` launcher (every call before)",
        "op_call_us": "`torch.ops.napkin` operator (dispatcher + autograd layer)",
        "op_call_inference_mode_us": "operator under `torch.inference_mode()`",
        "compiled_fn_us": "`torch.compile(fullgraph=True)` function calling the operator",
        "cuda_graph_replay_us": "CUDA graph replay (`napkin.torch.cuda_graph`)",
        "torch_matmul_us": "`A @ B` (cuBLAS), for comparison",
    }
    names.update({
        "op_dispatcher_us": "`torch.ops.napkin...default` (dispatcher, autograd kernel, then the kernels)",
        "op_dispatcher_inference_mode_us": "`torch.ops.napkin...default` under `torch.inference_mode()`",
        "op_autograd_us": "operator with a weight that needs a gradient (autograd.Function)",
        "compiled_matmul_us": "`torch.compile(fullgraph=True)` of `A @ B`, for comparison",
        "reduce_overhead_op_us": "`torch.compile(mode=\"reduce-overhead\")` calling the operator",
        "reduce_overhead_matmul_us": "`torch.compile(mode=\"reduce-overhead\")` of `A @ B`",
    })
    for k, label in names.items():
        if lo.get(k) is not None:
            lines.append(f"| {label} | {lo[k]:.1f} |")
    lines += ["", "Small shapes (bf16, µs per call over a loop of back-to-back calls; ratio = cuBLAS `A @ B` / "
              "napkin, ≥ 0.8 is the target):", "",
              "| M×N×K | what | wall µs | events µs | × cuBLAS (wall) | × cuBLAS (events) |", "|---|---|---|---|---|---|"]
    for r in result["small_shapes"]:
        for k, label in (("cublas", "cuBLAS `A @ B`"), ("cublas_graph", "cuBLAS in a CUDA graph"),
                         ("napkin", "napkin compiled diagram"), ("napkin_op", "napkin operator"),
                         ("napkin_graph", "napkin in a CUDA graph"), ("napkin_tuned", "napkin, tuned configuration"),
                         ("napkin_tuned_graph", "napkin tuned, in a CUDA graph")):
            if k not in r:
                continue
            ratio = r["ratio"].get(k)
            rw = f"{ratio['wall_us']:.2f}" if ratio else "—"
            re_ = f"{ratio['events_us']:.2f}" if ratio else "—"
            lines.append(f"| {r['shape']} | {label} | {r[k]['wall_us']:.1f} | {r[k]['events_us']:.1f} | {rw} | {re_} |")
    lines += ["", "Compile times (a fresh process each; cold: empty cache, cached: the same cache again):", "",
              "| diagram | kernels | imports s | cold compile s | cached compile s | cached: first call s | new size |",
              "|---|---|---|---|---|---|---|"]
    for r in result["compile_times"]:
        c, h = r.get("cold", {}), r.get("cached", {})
        what = r["diagram"] + (" dynamic " + ",".join(f"{a}={lo}..{hi}" for a, (lo, hi) in r["dynamic"].items())
                               if r["dynamic"] else "")
        if "error" in c or "error" in h:
            lines.append(f"| {what} | — | | {c.get('error', '')} | {h.get('error', '')} | | |")
            continue
        new = (f"cold {c['new_size_s'] * 1e3:.0f} ms, cached {h['new_size_s'] * 1e3:.1f} ms "
               f"({h['sources']} source{'s' if h['sources'] != 1 else ''} for 3 sizes)" if "new_size_s" in h else "—")
        lines.append(f"| {what} | {c.get('kernels')} | {h['imports_s']:.2f} | "
                     f"{c['compile_s'] + c.get('first_size_s', 0):.2f} | "
                     f"{h['compile_s'] + h.get('first_size_s', 0):.3f} | {h['first_call_s']:.3f} | {new} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--top", type=int, default=6, help="configurations the tuned variant measures")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: overhead,shapes,compile")
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    import torch

    from napkin.bench.suite import gpu_slug
    from napkin.bench.timing import device_info

    dev = device_info()
    result = {"device": dev, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if "overhead" not in skip:
        result["launch_overhead"] = launch_overhead()
        print(json.dumps(result["launch_overhead"], indent=1), flush=True)
    if "shapes" not in skip:
        result["small_shapes"] = small_shapes(a.top)
        for r in result["small_shapes"]:
            print(r["shape"], json.dumps(r["ratio"]), flush=True)
    if "compile" not in skip:
        result["compile_times"] = compile_times()
    out_dir = Path(a.out) / gpu_slug(dev.get("name"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "overhead.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    if not skip:
        md = markdown(result)
        print(md)
        (out_dir / "overhead.md").write_text(md + "\n")
    print(f"wrote {out_dir / 'overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
