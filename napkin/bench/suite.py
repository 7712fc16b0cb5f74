"""The benchmark suite: what is measured, how it is counted, and the sweep that writes JSON.

Points (docs/architecture.md §8):

* **attention** forward, bf16, head dim d ∈ {64, 128}, sequence 1k–16k with batch·seq = 16k tokens
  and 16 heads, causal (``attention_causal``) and not (``mha``); the built-in diagrams have no batch
  axis, so the batch is folded into the heads: h = 16·batch. FLOPs 4·h·N_q·N_k·d, half when causal;
* **matmul** 4096³ and 8192³ bf16 (``matmul``), 2·M·N·K FLOPs;
* **mlp** GEMM + bias + GELU (``mlp``), 2·M·N·K FLOPs;
* **rowwise** softmax, layernorm, rmsnorm over bf16 and fp16 rows of 1k–32k, rows chosen so the
  input is 256 MiB; reported as GB/s of bytes read once plus written once, against the measured
  device-to-device copy rate.

For every point: napkin's kernel (its schedule found by :func:`napkin.bench.autotune.tune` when
the model can rank candidates), each baseline of :mod:`napkin.bench.baselines`, TFLOP/s or GB/s,
the ratio napkin/baseline (> 1: napkin is faster), the model's predicted time for napkin's schedule
(cost model + roofline) and its miss |pred − meas|/meas, and a check of napkin's output against the
first baseline that ran.

Robustness: each point runs inside try/except (a failing kernel or baseline is recorded and the
sweep goes on). :func:`orchestrate` runs the sweep in a child process and restarts it after a
crash, a sticky CUDA error or a hang, marking the point that caused it, so one bad kernel cannot
end the sweep; a time budget stops it in time to write the results and the report.

JSON (one file per family, ``<out>/<gpu>/<family>.json``)::

    {"device": {...device_info(), "copy_bandwidth": B/s},
     "points": [{"id", "family", "diagram", "sizes", "dtype", "labels", "metric": "tflops"|"gbps",
                 "flops", "bytes", "napkin_s", "pred_s", "pred_err", "baselines": {name: s | {"skipped": why}
                 | {"error": what}}, "tflops"|"gbps": napkin's rate, "rates": {name: rate},
                 "ratio": {baseline: napkin rate / baseline rate}, "napkin": {...}, "check": {...}}, ...]}
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = [
    "Point",
    "FAMILIES",
    "attention_points",
    "matmul_points",
    "mlp_points",
    "rowwise_points",
    "all_points",
    "attention_flops",
    "gemm_flops",
    "io_bytes",
    "SuiteConfig",
    "run_point",
    "run_points",
    "orchestrate",
    "model_prediction",
    "gpu_slug",
    "summary_rows",
]

FAMILIES = ("attention", "matmul", "mlp", "rowwise", "composed")

ATTENTION_TOKENS = 16384
ATTENTION_HEADS = 16
ROWWISE_BYTES = 256 * 1024 * 1024

#: Rough CUDA-core FLOPs per element of the row-wise ops (only to place them on the roofline).
_ROWWISE_FLOPS_PER_ELEMENT = {"softmax": 5, "layernorm": 8, "rmsnorm": 5}


# ----------------------------------------------------------------------------- conventions


def attention_flops(heads: int, nq: int, nk: int, d: int, causal: bool = False) -> float:
    """4·H·N_q·N_k·d (QKᵀ and PV, 2 FLOPs per multiply-add), half when causal (docs/architecture.md §8).

    >>> attention_flops(16, 16384, 16384, 128) / 1e12
    2.199023255552
    """
    f = 4.0 * heads * nq * nk * d
    return f / 2 if causal else f


def gemm_flops(m: int, n: int, k: int) -> float:
    """2·M·N·K.

    >>> gemm_flops(8192, 8192, 8192) / 1e12
    1.099511627776
    """
    return 2.0 * m * n * k


def io_bytes(diagram) -> float:
    """Bytes of every input read once plus every output written once, each in its own dtype."""
    from ..dtypes import dtype as _dtype

    def size(v):
        n = 1
        for a in v.axes:
            n *= int(a.bound_size)
        return n * _dtype(v.dtype).bytes

    return float(sum(size(v) for v in diagram.inputs) + sum(size(v) for v in diagram.outputs))


# ----------------------------------------------------------------------------- points


@dataclass(frozen=True)
class Point:
    """One benchmark point."""

    family: str
    diagram: str
    sizes: dict
    dtype: str
    labels: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        lab = ",".join(f"{k}={_fmt_label(v)}" for k, v in self.labels.items())
        return f"{self.family}/{self.diagram}/{self.dtype}/{lab}"

    @property
    def metric(self) -> str:
        if self.family == "composed":
            # a composed diagram with a contraction is placed by its FLOPs, one without by its bytes
            return "tflops" if any(v.op.kind == "contract" for v in self.bound_diagram().nodes) else "gbps"
        return "gbps" if self.family == "rowwise" else "tflops"

    def bound_diagram(self):
        """The diagram (a library name, or a user file as ``path/file.py:name``), cast and bound."""
        from ..diagrams import library, load_diagram

        d = library.get(self.diagram) if self.diagram in library.names() else load_diagram(self.diagram)
        return d.with_dtype(self.dtype).bind(self.sizes)

    @property
    def flops(self) -> float:
        s = self.sizes
        if self.family == "attention":
            # every axis beside q, x and d counts heads (h, GQA's j, a batch): none for one head
            heads = math.prod(v for k, v in s.items() if k not in ("q", "x", "d"))
            return attention_flops(heads, s["q"], s["x"], s["d"], bool(self.labels.get("causal")))
        if self.family in ("matmul", "mlp"):
            return gemm_flops(s["a"], s["c"], s["b"]) * math.prod(v for k, v in s.items() if k not in "abc")
        if self.family == "rowwise":
            return float(_ROWWISE_FLOPS_PER_ELEMENT.get(self.diagram, 5) * s["r"] * s["x"])
        if self.family == "composed":
            return composed_flops(self.bound_diagram())
        return 0.0

    @property
    def bytes(self) -> float:
        return io_bytes(self.bound_diagram())

    def to_dict(self) -> dict:
        return {"id": self.id, "family": self.family, "diagram": self.diagram,
                "sizes": {k: int(v) for k, v in self.sizes.items()}, "dtype": self.dtype,
                "labels": dict(self.labels), "metric": self.metric, "flops": self.flops, "bytes": self.bytes}


def _fmt_label(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def attention_points(quick: bool = False, dtype: str = "bf16", heads: int = ATTENTION_HEADS,
                     tokens: int = ATTENTION_TOKENS) -> list[Point]:
    """d ∈ {64, 128} × {non-causal, causal} × seq ∈ {1k, 2k, 4k, 8k, 16k}, batch = tokens/seq folded
    into h = heads·batch (quick: d = 128, seq ∈ {4k, 16k})."""
    seqs = [4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384]
    ds = [128] if quick else [64, 128]
    out = []
    for d in ds:
        for causal in (False, True):
            for seq in seqs:
                batch = max(tokens // seq, 1)
                out.append(Point("attention", "attention_causal" if causal else "mha",
                                 {"h": heads * batch, "q": seq, "x": seq, "d": d}, dtype,
                                 {"d": d, "causal": causal, "seq": seq, "batch": batch, "heads": heads}))
    return out


def composed_flops(diagram) -> float:
    """FLOPs of a bound diagram, box by box (tensor-core and CUDA-core work of the unfused
    schedule: what every implementation must do at least once)."""
    from ..perfmodel import Schedule, cost

    c = cost(Schedule.unfused(diagram))
    return float(sum(float(v) for k, v in c.flops.items() if k != "sfu"))


#: The composed sweep: diagrams no single template is, at their library default sizes (quick:
#: these smaller ones), and the transformer block also at a LLaMA-7B-like width.
_COMPOSED_QUICK = {"transformer_block": {"q": 1024, "e": 1024, "h": 8, "d": 128, "f": 4096},
                   "swiglu": {"a": 2048, "b": 2048, "f": 5504},
                   "rmsnorm_linear": {"r": 2048, "x": 2048, "c": 2048},
                   "gemm_softmax": {"a": 2048, "b": 1024, "c": 2048},
                   "gelu_tanh": {"r": 4096, "x": 4096},
                   "column_sum": {"r": 8192, "x": 4096},
                   "matvec": {"a": 4096, "b": 4096}}
COMPOSED = tuple(_COMPOSED_QUICK)


def composed_points(quick: bool = False, dtype: str = "bf16") -> list[Point]:
    """transformer_block, SwiGLU, RMSNorm → linear, GEMM → softmax, an elementwise chain, a
    column reduction and a matrix-vector product at their default sizes, and the block at q=4096, e=4096, h=32, d=128, f=11008."""
    from ..diagrams import library

    out = []
    for name in COMPOSED:
        sizes = dict(_COMPOSED_QUICK[name]) if quick else dict(library.entry(name).default_sizes)
        out.append(Point("composed", name, sizes, dtype, {"size": "default" if not quick else "quick"}))
    if not quick:
        out.append(Point("composed", "transformer_block", {"q": 4096, "e": 4096, "h": 32, "d": 128, "f": 11008},
                         dtype, {"size": "7b"}))
    return out


def matmul_points(quick: bool = False, dtype: str = "bf16") -> list[Point]:
    """Square bf16 GEMMs 4096³ and 8192³, and (not quick) the shapes cuBLAS is compared on besides:
    odd sizes (8205 × 2949 × 5921), a transposed operand (nn.Linear's layout), a batch of 8, a sum
    over K = 262144 into a 256 × 256 output, and fp32 4096³."""
    out = [Point("matmul", "matmul", {"a": n, "b": n, "c": n}, dtype, {"n": n}) for n in (4096, 8192)]
    if quick:
        return out
    out += [Point("matmul", "matmul", {"a": 8205, "b": 2949, "c": 5921}, dtype, {"shape": "odd"}),
            Point("matmul", "matmul_t", {"a": 4096, "b": 4096, "c": 4096}, dtype, {"shape": "transposed"}),
            Point("matmul", "batched_matmul", {"n": 8, "a": 2048, "b": 2048, "c": 2048}, dtype, {"shape": "batched"}),
            Point("matmul", "matmul", {"a": 256, "b": 262144, "c": 256}, dtype, {"shape": "K=256k"}),
            Point("matmul", "matmul", {"a": 4096, "b": 4096, "c": 4096}, "fp32", {"n": 4096, "shape": "fp32"})]
    return out


def mlp_points(quick: bool = False, dtype: str = "bf16") -> list[Point]:
    """gelu(X·Wᵀ + bias): tokens ∈ {4096, 8192} (quick: 4096), 4096 → 16384."""
    toks = [4096] if quick else [4096, 8192]
    return [Point("mlp", "mlp", {"a": t, "b": 4096, "c": 16384}, dtype, {"tokens": t, "in": 4096, "out": 16384})
            for t in toks]


def rowwise_points(quick: bool = False, dtypes: Sequence[str] | None = None,
                   target_bytes: int = ROWWISE_BYTES) -> list[Point]:
    """softmax, layernorm, rmsnorm × bf16, fp16 × width 1k–32k, rows = target_bytes / (2·width)
    (quick: bf16, widths 4k and 32k)."""
    dts = list(dtypes) if dtypes else (["bf16"] if quick else ["bf16", "fp16"])
    widths = [4096, 32768] if quick else [1024, 2048, 4096, 8192, 16384, 32768]
    out = []
    for op in ("softmax", "layernorm", "rmsnorm"):
        for dt in dts:
            for w in widths:
                rows = max(target_bytes // (2 * w), 1)
                out.append(Point("rowwise", op, {"r": rows, "x": w}, dt, {"width": w, "rows": rows}))
    return out


def all_points(quick: bool = False, families: Sequence[str] = FAMILIES) -> list[Point]:
    """Every point of the chosen families, ordered so that a time budget cut keeps the most
    informative ones: each family's headline point first (8192³, 16k non-causal d128, ...), then the rest."""
    by_family = {
        "attention": attention_points(quick),
        "matmul": matmul_points(quick),
        "mlp": mlp_points(quick),
        "rowwise": rowwise_points(quick),
        "composed": composed_points(quick),
    }
    unknown = [f for f in families if f not in by_family]
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    headline = {
        "attention": lambda p: p.labels["seq"] == 16384 and p.labels["d"] == 128,
        "matmul": lambda p: p.labels.get("n") == 8192,
        "mlp": lambda p: True,
        "rowwise": lambda p: p.labels["width"] in (4096, 32768) and p.dtype == "bf16",
        "composed": lambda p: p.diagram in ("transformer_block", "swiglu"),
    }
    first: list[Point] = []
    rest: list[Point] = []
    for f in families:
        pts = by_family[f]
        head = [p for p in pts if headline[f](p)]
        first.extend(head[:2] if f not in ("rowwise", "composed") else head)
        rest.extend(p for p in pts if p not in first)
    return first + rest


# ----------------------------------------------------------------------------- the model


def model_prediction(schedule, gpu, sizes=None, *, family=None, diagram=None) -> dict:
    """The model's predicted time for ``schedule`` on ``gpu``: ``{"pred_s", "bound", "how"}``.

    With ``family`` and ``diagram`` (a compiled kernel's), the prediction code generation ranked
    the schedule by (:func:`napkin.codegen.select.predict_schedule`, which knows the template's
    launch: threads, registers, shared memory, bytes in flight) — the number the autotuner records
    for each candidate. ``bound`` and ``cost_roofline_s`` come from
    :func:`napkin.perfmodel.predict.predict_schedule` on the same schedule with the model's own
    launch assumptions (the only prediction when no family is given).
    """
    from ..errors import NapkinError
    from ..perfmodel.predict import predict_schedule as model_predict

    try:
        plain = model_predict(schedule, gpu, sizes=sizes)
    except NapkinError:
        # the model's own launch assumptions may not hold the family's kernel (a split row
        # reduction's accumulators: more registers than a generic block of its threads has); the
        # family's launch, which the planner ranked, still prices it
        if family is None or diagram is None:
            raise
        plain = None
    out = ({"pred_s": plain.seconds, "bound": plain.bound, "how": "perfmodel.predict.predict_schedule"}
           if plain is not None else {"bound": None})
    if family is not None and diagram is not None:
        from ..codegen.select import predict_schedule as codegen_predict

        r = codegen_predict(diagram, family, schedule, gpu)
        out.update(pred_s=float(r.seconds), cost_roofline_s=plain.seconds if plain is not None else None,
                   how=f"codegen.select.predict_schedule ({r.source})")
    return out


# ----------------------------------------------------------------------------- running one point


@dataclass
class SuiteConfig:
    """How the sweep runs."""

    gpu: str = "h100"                 # profile given to codegen and the model (name or path)
    profile: str | None = None        # profile for the model's prediction (default: gpu)
    compile_baselines: bool = True    # torch.compile / FlexAttention baselines
    autotune: bool = True             # rank with the model and measure the top k (needs rank_candidates)
    top_k: int = 4
    spearman_k: int = 8               # candidates measured at each family's first point
    retune: bool = False              # ignore the autotune cache
    warmup: int = 10
    reps: int = 50
    max_time_s: float = 2.0           # per measurement
    check_tol: float = 2e-2           # napkin vs the first baseline, relative L2 error
    copy_bandwidth: float | None = None
    calibrated_profile: str | None = None  # a profile JSON with this GPU's measured copy and GEMM rates
    device: str = "cuda"              # "cpu" runs the same logic on a CPU (tests, tiny sizes)
    compile_backend: str | None = None  # torch.compile backend for the baselines (None: inductor)


def _first_output(out):
    if isinstance(out, dict):
        return next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _check_against_float64(diagram, inputs, outputs: dict, tol: float) -> dict:
    """napkin's first output and the eager baseline's against the float64 reference of the same
    inputs: ok when napkin's error is within ``tol`` or within twice the eager baseline's."""
    import torch

    ref = diagram.reference({n: t.double() for n, t in zip(diagram.input_names, inputs)},
                            dtype=torch.float64)[diagram.output_names[0]]
    err = _rel_err(outputs["napkin"], ref, double=True)
    eager = outputs.get("baseline:eager")
    eager_err = _rel_err(eager, ref, double=True) if eager is not None else None
    bound = max(tol, 2.0 * eager_err) if eager_err is not None and math.isfinite(eager_err) else tol
    return {"against": "float64 reference", "rel_err": err, "eager_rel_err": eager_err, "ok": err <= bound}


def _rel_err(a, b, *, double: bool = False) -> float:
    """Relative L2 error of ``a`` against ``b`` (inf when ``a`` is not finite or the sizes differ),
    computed in float32, or in float64 with ``double`` (against a float64 reference)."""
    import torch

    cast = (lambda t: t.double()) if double else (lambda t: t.float())
    a = cast(a).reshape(-1)
    b = cast(b).reshape(-1)
    if a.numel() != b.numel():
        return math.inf
    if not bool(torch.isfinite(a).all()):
        return math.inf
    den = float(torch.linalg.vector_norm(b))
    return float(torch.linalg.vector_norm(a - b)) / (den if den > 0 else 1.0)


def _err_text(e: BaseException, limit: int = 600) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FatalCudaError(RuntimeError):
    """The CUDA context is broken (a sticky error): the process must be restarted."""


def _sync(device: str = "cuda") -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _cuda_healthy(device: str = "cuda") -> bool:
    if not str(device).startswith("cuda"):
        return True
    try:
        import torch

        torch.cuda.synchronize()
        return float(torch.ones(4, device="cuda").sum().item()) == 4.0
    except Exception:
        return False


def _rate(point: dict, seconds: float | None) -> float | None:
    if seconds is None or not seconds > 0:
        return None
    if point["metric"] == "gbps":
        return point["bytes"] / seconds / 1e9
    return point["flops"] / seconds / 1e12


def _napkin_kernel(point: Point, cfg: SuiteConfig, sets: list, k: int, rec: dict):
    """napkin's compiled kernel for the point: tuned when the model can rank candidates."""
    from ..codegen import compile as napkin_compile
    from .timing import time_fn

    from ..diagrams import library, load_diagram

    base = (library.get(point.diagram) if point.diagram in library.names()
            else load_diagram(point.diagram)).with_dtype(point.dtype)
    sizes = dict(point.sizes)
    info: dict[str, Any] = {}
    rec["napkin"] = info
    tuned = None
    # the autotuner ranks one kernel's configurations; a composed diagram runs the planner's plan
    if cfg.autotune and point.family != "composed":
        try:
            from ..codegen.select import rank_candidates  # noqa: F401

            have_rank = True
        except ImportError as e:
            have_rank = False
            info["autotune"] = f"skipped: {_err_text(e)}"
        if have_rank:
            from .autotune import AutotuneCache, tune

            def measure(kernel):
                return time_fn(kernel, warmup=3, reps=20, rotate=sets, max_time_s=0.5).median_s

            t0 = time.time()
            try:
                tuned = tune(base, gpu=cfg.gpu, sizes=sizes, dtype=point.dtype, k=k, cache=AutotuneCache(),
                             force=cfg.retune, measure=measure)
                info["tune"] = tuned.to_dict()
            except Exception as e:  # fall back to codegen's own choice, and say so
                info["autotune"] = f"failed: {_err_text(e)}"
                if not _cuda_healthy(cfg.device):
                    raise
            info["tune_wall_s"] = round(time.time() - t0, 2)
    if tuned is not None:
        kernel = tuned.compiled or napkin_compile(base, gpu=cfg.gpu, sizes=sizes, dtype=point.dtype,
                                                  schedule=tuned.schedule)
    else:
        kernel = napkin_compile(base, gpu=cfg.gpu, sizes=sizes, dtype=point.dtype)
    plan = getattr(kernel, "plan", None)
    if plan is not None:
        info["kernels"] = [pk.kernel.family for pk in plan.kernels]
    sched = getattr(kernel, "schedule", None)
    if sched is not None:
        from .autotune import describe_schedule, schedule_id

        info["schedule"] = describe_schedule(sched)
        info["schedule_id"] = schedule_id(sched)
    return kernel


def run_point(point: Point, cfg: SuiteConfig, *, calibration: bool = False) -> dict:
    """Measure one point; every failure is recorded in the result, never raised (except a broken
    CUDA context, :class:`FatalCudaError`)."""
    from .baselines import baselines_for
    from .timing import diagram_inputs, l2_bytes, make_rotating_inputs, time_fn

    t_start = time.time()
    rec = point.to_dict()
    rec.update(napkin_s=None, pred_s=None, pred_err=None, baselines={}, rates={}, ratio={}, timings={},
               baseline_notes={}, errors={})
    rec[point.metric] = None
    bound = point.bound_diagram()

    try:
        sets = make_rotating_inputs(lambda i: diagram_inputs(bound, point.dtype, cfg.device, seed=1 + i),
                                    min_bytes=2 * l2_bytes() if cfg.device.startswith("cuda") else 0, max_sets=16)
    except Exception as e:
        rec["errors"]["inputs"] = _err_text(e)
        if not _cuda_healthy(cfg.device):
            raise FatalCudaError(rec["errors"]["inputs"]) from e
        return rec
    rec["input_sets"] = len(sets)

    def timed(fn) -> Any:
        return time_fn(fn, warmup=cfg.warmup, reps=cfg.reps, rotate=sets, max_time_s=cfg.max_time_s)

    outputs: dict[str, Any] = {}

    # -- napkin
    k = max(cfg.top_k, cfg.spearman_k) if calibration else cfg.top_k
    kernel = None
    try:
        kernel = _napkin_kernel(point, cfg, sets, k, rec)
        out = _first_output(kernel(*sets[0]))
        _sync(cfg.device)
        outputs["napkin"] = out
        t = timed(kernel)
        rec["napkin_s"] = t.median_s
        rec["timings"]["napkin"] = t.to_dict()
    except Exception as e:
        rec["errors"]["napkin"] = _err_text(e)
        rec["napkin"] = rec.get("napkin") or {}
        rec["napkin"]["traceback"] = traceback.format_exc(limit=6)[-2000:]
        if not _cuda_healthy(cfg.device):
            raise FatalCudaError(rec["errors"]["napkin"]) from e

    # -- the model's prediction for napkin's schedule
    sched = getattr(kernel, "schedule", None) if kernel is not None else None  # predicted even if it failed to run
    plan = getattr(kernel, "plan", None) if kernel is not None else None
    if plan is not None and len(plan.kernels) > 1:
        # a plan of several kernels: the planner's own prediction, each kernel by its family's
        # configuration (the sum the planner minimised), on the profile it was planned for
        rec["pred_s"] = plan.seconds
        rec["pred_how"] = "plan.seconds (planner.derive: codegen.select.predict_schedule per kernel)"
        if rec["napkin_s"]:
            rec["pred_err"] = abs(plan.seconds - rec["napkin_s"]) / rec["napkin_s"]
        sched = None
    if sched is not None:
        try:
            p = model_prediction(sched, cfg.profile or cfg.gpu, dict(point.sizes),
                                 family=getattr(kernel, "family", None), diagram=getattr(kernel, "diagram", None))
            rec["pred_s"] = p["pred_s"]
            rec["pred_bound"] = p.get("bound")
            rec["pred_how"] = p["how"]
            if p.get("cost_roofline_s"):
                rec["pred_cost_roofline_s"] = p["cost_roofline_s"]
            if rec["napkin_s"]:
                rec["pred_err"] = abs(p["pred_s"] - rec["napkin_s"]) / rec["napkin_s"]
        except Exception as e:
            rec["errors"]["prediction"] = _err_text(e)
        if cfg.calibrated_profile:
            try:
                p = model_prediction(sched, cfg.calibrated_profile, dict(point.sizes),
                                     family=getattr(kernel, "family", None), diagram=getattr(kernel, "diagram", None))
                rec["pred_calibrated_s"] = p["pred_s"]
                if rec["napkin_s"]:
                    rec["pred_calibrated_err"] = abs(p["pred_s"] - rec["napkin_s"]) / rec["napkin_s"]
            except Exception as e:
                rec["errors"]["prediction_calibrated"] = _err_text(e)
    rec["pred_profile"] = cfg.profile or cfg.gpu

    # -- baselines
    try:
        bls = baselines_for(bound, family=point.family, compile=cfg.compile_baselines,
                            compile_backend=cfg.compile_backend, device=cfg.device)
    except Exception as e:
        rec["errors"]["baselines"] = _err_text(e)
        bls = []
    for b in bls:
        rec["baseline_notes"][b.name] = b.note
        if not b.available:
            rec["baselines"][b.name] = {"skipped": b.skipped}
            continue
        try:
            reason, out = b.probe(*sets[0])
            if reason is not None:
                rec["baselines"][b.name] = {"skipped": reason}
                continue
            _sync(cfg.device)
            outputs.setdefault("baseline:" + b.name, _first_output(out))
            t = timed(b.fn)
            rec["baselines"][b.name] = t.median_s
            rec["timings"][b.name] = t.to_dict()
        except Exception as e:
            rec["baselines"][b.name] = {"error": _err_text(e)}
            if not _cuda_healthy(cfg.device):
                raise FatalCudaError(f"baseline {b.name}: {_err_text(e)}") from e
    del bls

    # -- rates, ratios, check
    rec[point.metric] = _rate(rec, rec["napkin_s"])
    if rec["napkin_s"] is not None:
        rec["rates"]["napkin"] = rec[point.metric]
    for name, v in rec["baselines"].items():
        if isinstance(v, float):
            rec["rates"][name] = _rate(rec, v)
            if rec["napkin_s"]:
                rec["ratio"][name] = v / rec["napkin_s"]
    if point.metric == "gbps" and cfg.copy_bandwidth:
        rec["copy_gbps"] = cfg.copy_bandwidth / 1e9
        if rec["gbps"]:
            rec["copy_fraction"] = rec["gbps"] / rec["copy_gbps"]
    if "napkin" in outputs and point.family == "composed":
        # two roundings of an ill-conditioned diagram (attention over unscaled random inputs)
        # differ by more than either differs from the exact result: judge napkin and the eager
        # reference against the float64 reference of the same inputs, napkin within twice eager's error
        try:
            rec["check"] = _check_against_float64(bound, sets[0], outputs, cfg.check_tol)
        except Exception as e:
            rec["check"] = {"error": _err_text(e)}
    elif "napkin" in outputs:
        ref_name = next((n for n in outputs if n.startswith("baseline:")), None)
        if ref_name is not None:
            try:
                err = _rel_err(outputs["napkin"], outputs[ref_name])
                rec["check"] = {"against": ref_name.split(":", 1)[1], "rel_err": err, "ok": err <= cfg.check_tol}
            except Exception as e:
                rec["check"] = {"error": _err_text(e)}
    outputs.clear()
    rec["wall_s"] = round(time.time() - t_start, 2)
    return rec


def _cleanup() -> None:
    gc.collect()
    try:
        import torch

        torch.cuda.empty_cache()
        import torch._dynamo

        torch._dynamo.reset()  # fresh compile caches: no recompile limit across shapes
    except Exception:
        pass


def device_header(measure_copy: bool = True, measure_gemm: bool = True) -> dict:
    """device_info() plus the measured copy rate and the cuBLAS bf16 GEMM rate (8192³)."""
    from .timing import copy_bandwidth, device_info

    info = device_info()
    if measure_copy and info.get("cuda"):
        try:
            info["copy_bandwidth"] = copy_bandwidth()
        except Exception as e:
            info["copy_bandwidth_error"] = _err_text(e)
    if measure_gemm and info.get("cuda"):
        try:
            from ..perfmodel.calibrate import measure_gemm_rate

            info["gemm_bf16_flops"] = measure_gemm_rate("bf16")
        except Exception as e:
            info["gemm_error"] = _err_text(e)
    return info


def write_calibrated_profile(header: dict, base: str, path: Path) -> str | None:
    """A profile JSON for ``base`` with the measured copy and GEMM rates (docs/architecture.md §4.6: measured
    values override the datasheet), for a second prediction next to the datasheet one."""
    meas = {}
    if header.get("copy_bandwidth"):
        meas["copy_bandwidth"] = float(header["copy_bandwidth"])
    if header.get("gemm_bf16_flops"):
        meas["gemm_bf16"] = float(header["gemm_bf16_flops"])
        meas["gemm_fp16"] = float(header["gemm_bf16_flops"])  # same tensor path; not measured separately
    if not meas:
        return None
    from ..perfmodel.calibrate import calibrated_profile

    g = calibrated_profile(base, meas, device_name=header.get("name"))
    path.write_text(g.to_json(), encoding="utf-8")
    return str(path)


def _clean(obj):
    """JSON-safe: non-finite floats become None (strict JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _append_jsonl(path: Path, obj: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(_clean(obj), default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    try:
        return float(o)
    except Exception:
        return str(o)


def run_points(points: Sequence[Point], cfg: SuiteConfig, jsonl: Path, *, start: int = 0,
               deadline: float | None = None, log: Callable[[str], None] = print) -> int:
    """Run ``points[start:]`` in this process, appending one JSON line per point to ``jsonl``
    (a ``{"device": ...}`` line first). Returns 0 when done (or out of time), 3 after a broken
    CUDA context (the caller restarts past the point that broke it)."""
    header = device_header()
    cfg.copy_bandwidth = header.get("copy_bandwidth")
    if cfg.calibrated_profile is None and header.get("cuda"):
        try:
            cfg.calibrated_profile = write_calibrated_profile(
                header, cfg.profile or cfg.gpu, Path(jsonl).with_name(Path(jsonl).stem + "-profile.json"))
            header["calibrated_profile"] = cfg.calibrated_profile
        except Exception as e:
            header["calibrated_profile_error"] = _err_text(e)
    _append_jsonl(jsonl, {"device": header, "start": start})
    calibrated: set[str] = set()
    for i in range(start):
        calibrated.add(points[i].family)
    for i in range(start, len(points)):
        p = points[i]
        if deadline is not None and time.time() > deadline:
            log(f"time budget reached before {p.id}")
            return 0
        calib = p.family not in calibrated
        calibrated.add(p.family)
        try:
            rec = run_point(p, cfg, calibration=calib)
        except FatalCudaError as e:
            rec = p.to_dict()
            rec.update(napkin_s=None, baselines={}, errors={"fatal": _err_text(e)})
            rec["index"] = i
            _append_jsonl(jsonl, rec)
            log(f"[{i}] {p.id}: CUDA context broken ({e}); restarting")
            return 3
        except Exception as e:  # run_point records its own failures; this is a bug in the suite
            rec = p.to_dict()
            rec.update(napkin_s=None, baselines={}, errors={"suite": _err_text(e)},
                       traceback=traceback.format_exc(limit=8)[-3000:])
        rec["index"] = i
        _append_jsonl(jsonl, rec)
        log(f"[{i}] {p.id}: napkin {_fmt_s(rec.get('napkin_s'))}" +
            "".join(f", {n} {_fmt_s(v) if isinstance(v, float) else 'skip'}" for n, v in rec.get("baselines", {}).items()))
        _cleanup()
    return 0


def _fmt_s(s) -> str:
    if not isinstance(s, (int, float)) or s is None:
        return "—"
    return f"{s * 1e3:.3f} ms"


# ----------------------------------------------------------------------------- orchestration


def gpu_slug(name: str | None) -> str:
    """A folder name for a GPU: ``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3``."""
    s = re.sub(r"[^a-z0-9]+", "-", (name or "unknown-gpu").lower()).strip("-")
    return s or "unknown-gpu"


def _read_jsonl(path: Path) -> tuple[list[dict], list[dict]]:
    headers, recs = [], []
    if not path.exists():
        return headers, recs
    for line in path.read_text("utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        (headers if "device" in obj and "id" not in obj else recs).append(obj)
    return headers, recs


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _child_cmd(args: dict, start: int, jsonl: Path, deadline: float | None) -> list[str]:
    cmd = [sys.executable, "-m", "napkin.bench.suite", "--child", "--jsonl", str(jsonl), "--start", str(start)]
    if deadline is not None:
        cmd += ["--deadline", repr(deadline)]
    for k, v in args.items():
        if isinstance(v, bool):
            if v:
                cmd.append("--" + k.replace("_", "-"))
        elif v is not None:
            cmd += ["--" + k.replace("_", "-"), str(v)]
    return cmd


def orchestrate(points: Sequence[Point], out_dir: Path, *, child_args: dict, budget_s: float | None = None,
                point_timeout_s: float = 480.0, in_process: bool = False, cfg: SuiteConfig | None = None,
                progress: bool = True, max_restarts: int = 50,
                child_cmd: Callable[[int, Path, float | None], list[str]] | None = None,
                poll_s: float = 2.0) -> tuple[dict, list[dict], Path]:
    """Run every point (in a child process that is restarted past a crash, a broken CUDA context
    or a hang), then write ``<out_dir>/<gpu>/<family>.json``. Returns (device, records, gpu_dir).

    The child appends JSON lines (a ``{"device"}`` header, then one record with its ``index`` per
    point) and exits 0 when done or out of time, 3 after recording a point that broke the CUDA
    context. Any other exit, or no new record for ``point_timeout_s``, marks the first point not
    recorded as crashed and restarts the child after it. ``child_cmd(start, jsonl, deadline)``
    replaces the default child (``python -m napkin.bench.suite --child ...``), e.g. in tests."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / ".work"
    work.mkdir(exist_ok=True)
    jsonl = work / f"run-{os.getpid()}-{int(time.time())}.jsonl"
    deadline = time.time() + budget_s if budget_s else None
    n = len(points)

    bar = _Progress(n, enabled=progress)
    if in_process:
        run_points(points, cfg or SuiteConfig(), jsonl, deadline=deadline, log=bar.log)
        _, recs = _read_jsonl(jsonl)
        for r in recs:
            bar.advance(r)
    else:
        start = 0
        restarts = 0
        seen = 0
        logs = work / "logs"
        logs.mkdir(exist_ok=True)
        repo = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
        while start < n and restarts <= max_restarts:
            if deadline is not None and time.time() > deadline:
                break
            log_path = logs / f"child-{restarts}.log"
            with open(log_path, "w") as logf:
                cmd = child_cmd(start, jsonl, deadline) if child_cmd else _child_cmd(child_args, start, jsonl, deadline)
                proc = subprocess.Popen(cmd, stdout=logf,
                                        stderr=subprocess.STDOUT, cwd=repo, env=env, start_new_session=True)
                last_change = time.time()
                reason = None
                while True:
                    try:
                        code = proc.wait(timeout=poll_s)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    _, recs = _read_jsonl(jsonl)
                    if len(recs) > seen:
                        for r in recs[seen:]:
                            bar.advance(r)
                        seen = len(recs)
                        last_change = time.time()
                    if time.time() - last_change > point_timeout_s:
                        reason = f"timed out after {point_timeout_s:.0f} s"
                        _kill(proc)
                        code = proc.returncode
                        break
                    if deadline is not None and time.time() > deadline + 30:
                        reason = "time budget"
                        _kill(proc)
                        code = proc.returncode
                        break
            _, recs = _read_jsonl(jsonl)
            for r in recs[seen:]:
                bar.advance(r)
            seen = len(recs)
            done = {r.get("index") for r in recs}
            nxt = next((i for i in range(start, n) if i not in done), n)
            if nxt >= n:
                break
            if code == 0 and reason is None:
                break  # the child stopped for the budget
            if reason == "time budget":
                break
            if code == 3 and reason is None:
                start = nxt  # the broken point is recorded; resume after it
            else:
                tail = _tail(log_path)
                rec = points[nxt].to_dict()
                rec.update(index=nxt, napkin_s=None, baselines={},
                           errors={"crash": reason or f"child exited with code {code}", "log_tail": tail})
                _append_jsonl(jsonl, rec)
                bar.advance(rec)
                seen += 1
                start = nxt + 1
            restarts += 1
    bar.close()

    headers, recs = _read_jsonl(jsonl)
    device = dict(headers[0]["device"]) if headers else {}
    by_index: dict[int, dict] = {}
    for r in recs:
        by_index[int(r.get("index", -1))] = r
    for i, p in enumerate(points):
        if i not in by_index:
            rec = p.to_dict()
            rec.update(index=i, napkin_s=None, baselines={}, skipped="time budget" if deadline else "not run")
            by_index[i] = rec
    records = [by_index[i] for i in range(n)]
    gpu_dir = out_dir / gpu_slug(device.get("name"))
    gpu_dir.mkdir(parents=True, exist_ok=True)
    for fam in dict.fromkeys(p.family for p in points):
        data = {"device": device, "points": [r for r in records if r.get("family") == fam]}
        _atomic_write_json(gpu_dir / f"{fam}.json", data)
    return device, records, gpu_dir


def _tail(path: Path, n: int = 1500) -> str:
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return ""
    return text[-n:]


def _atomic_write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=1, default=_json_default) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _Progress:
    """A rich progress bar over the sweep (plain lines when not on a terminal)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total = total
        self.done = 0
        self._p = None
        self._task = None
        self._console = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._console = Console(stderr=True)
            if self._console.is_terminal:
                self._p = Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(),
                                   TimeElapsedColumn(), TextColumn("{task.description}"), console=self._console)
                self._p.start()
                self._task = self._p.add_task("", total=total)
        except ImportError:  # pragma: no cover - rich is a dependency
            self._console = None

    def log(self, text: str) -> None:
        if self._p is not None:
            self._p.console.log(text)
        elif self._console is not None:
            self._console.print(text, highlight=False, markup=False)

    def advance(self, rec: dict) -> None:
        self.done += 1
        status = "ok" if rec.get("napkin_s") else ("skipped" if rec.get("skipped") else "error")
        line = f"{rec.get('id', '?')}: {status}"
        if self._p is not None:
            self._p.update(self._task, advance=1, description=line)
        elif self._console is not None:
            self._console.print(f"[{self.done}/{self.total}] {line}", highlight=False, markup=False)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


# ----------------------------------------------------------------------------- summaries


def summary_rows(records: Iterable[dict]) -> list[dict]:
    """One short row per point: napkin's time and rate, the best baseline, the ratio, the model's miss."""
    rows = []
    for r in records:
        metric = r.get("metric", "tflops")
        base = {n: v for n, v in (r.get("baselines") or {}).items() if isinstance(v, (int, float))}
        best = min(base, key=base.get) if base else None
        rate = r.get(metric)
        status = "ok"
        if not r.get("napkin_s"):
            errs = {k: v for k, v in (r.get("errors") or {}).items() if k != "log_tail"}
            if r.get("skipped"):
                status = str(r["skipped"])
            elif errs:
                k, v = next(iter(errs.items()))
                status = f"{k}: {v}"
            else:
                status = "error"
        elif (r.get("check") or {}).get("ok") is False:
            status = "WRONG OUTPUT"
        from .report import point_label

        rows.append({
            "id": r.get("id"),
            "label": f"{r.get('family', '?')}: {point_label(r)}",
            "napkin_ms": r["napkin_s"] * 1e3 if r.get("napkin_s") else None,
            "rate": rate, "unit": "TFLOP/s" if metric == "tflops" else "GB/s",
            "best": best, "best_rate": (r.get("rates") or {}).get(best) if best else None,
            "ratio": (r.get("ratio") or {}).get(best) if best else None,
            "pred_err": r.get("pred_err"),
            "status": status,
        })
    return rows


# ----------------------------------------------------------------------------- the child


def _child_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m napkin.bench.suite", description="(internal) run benchmark points")
    ap.add_argument("--child", action="store_true")
    _add_sweep_args(ap)
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=None)
    a = ap.parse_args(argv)
    from ..settings import use_cuda_device

    use_cuda_device()  # NAPKIN_DEVICE, inherited from the parent (napkin --device N bench)
    points = all_points(a.quick, _families(a.families))
    cfg = config_from_args(a)
    return run_points(points, cfg, Path(a.jsonl), start=a.start, deadline=a.deadline,
                      log=lambda s: print(s, flush=True))


def _families(text: str | None) -> tuple[str, ...]:
    if not text:
        return FAMILIES
    return tuple(f.strip() for f in text.split(",") if f.strip())


def _add_sweep_args(ap: argparse.ArgumentParser) -> None:
    """The options the parent passes on to the child (run_all.py uses the same)."""
    ap.add_argument("--quick", action="store_true", help="a short sweep (a few points per family)")
    ap.add_argument("--families", default=None, help=f"comma-separated subset of {','.join(FAMILIES)}")
    ap.add_argument("--gpu", default=None, help="GPU profile for codegen and the model (default: from the device name)")
    ap.add_argument("--profile", default=None, help="profile for the predictions only (e.g. a calibrated JSON)")
    ap.add_argument("--top-k", type=int, default=4, help="candidates measured by the autotuner (default 4)")
    ap.add_argument("--spearman-k", type=int, default=8,
                    help="candidates measured at each family's first point, for the rank correlation (default 8)")
    ap.add_argument("--no-autotune", action="store_true", help="use codegen's own schedule, measure nothing else")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile / FlexAttention baselines")
    ap.add_argument("--retune", action="store_true", help="ignore the autotune cache")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)


def config_from_args(a) -> SuiteConfig:
    gpu = a.gpu
    if gpu is None:
        try:
            import torch

            from ..perfmodel.hardware import match_device_name

            gpu = match_device_name(torch.cuda.get_device_name(torch.cuda.current_device()))
        except Exception:
            gpu = "h100"
    return SuiteConfig(gpu=gpu, profile=a.profile, compile_baselines=not a.no_compile, autotune=not a.no_autotune,
                       top_k=a.top_k, spearman_k=a.spearman_k, retune=a.retune, reps=a.reps, warmup=a.warmup)


def child_args_from(a) -> dict:
    """The parsed sweep options as keyword arguments for :func:`_child_cmd`."""
    return {"quick": a.quick, "families": a.families, "gpu": a.gpu, "profile": a.profile, "top_k": a.top_k,
            "spearman_k": a.spearman_k, "no_autotune": a.no_autotune, "no_compile": a.no_compile,
            "retune": a.retune, "reps": a.reps, "warmup": a.warmup}


if __name__ == "__main__":  # pragma: no cover - run by orchestrate() on the GPU machine
    sys.exit(_child_main())
