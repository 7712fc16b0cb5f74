"""The one prediction function: a family's configuration of a kernel, timed by the performance model.

The planner (:mod:`napkin.codegen.planner`) ranks every configuration the families declare with
:func:`predict_schedule`; the benchmark records the same prediction next to each measurement, and
``napkin cost`` and ``napkin derive`` print it. Nothing here chooses: the planner does.

Each candidate schedule is costed by the performance model (the transfers H per level and the
FLOPs from :func:`napkin.perfmodel.cost.cost`) and turned into a runtime by
:func:`napkin.perfmodel.predict.predict_schedule` with the launch the family says its kernel has
(:func:`launch_shape`), and the candidates are ranked by that predicted time.
:func:`rank_candidates` returns the whole ranking so that autotuning can measure the top few.

When the cost model is not available (not importable, or it fails on a schedule for a reason
other than the schedule being illegal), :func:`local_work` estimates the same quantities from
the diagram: every kernel reads its inputs and writes its outputs once, contractions cost 2 FLOPs
per multiply-add, elementwise maps their whitelist cost. Either way, a family may add what the
roofline cannot see (``launch_estimate``: blocks, threads, registers, shared memory, bytes in
flight per thread, idle lanes; and how the template issues its work, :data:`FAMILY_EXECUTION`),
which feeds wave quantisation, occupancy and the latency floor of the one prediction path in
:mod:`napkin.perfmodel.predict`; a kernel with a second, small pass (a split reduction's
combine) states its extra launches and HBM bytes there too (:func:`extra_pass_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..diagrams.diagram import Diagram
from ..diagrams.functions import get_function
from ..dtypes import canonical as canonical_dtype
from ..dtypes import dtype as lookup_dtype
from ..errors import CodegenError, NapkinError, ScheduleError
from ..perfmodel.schedule import Schedule

if TYPE_CHECKING:  # the model's per-kernel prediction (napkin.perfmodel.predict imports the cost model)
    from ..perfmodel.predict import KernelPrediction

__all__ = ["rank_candidates", "predict_schedule", "launch_shape", "model_work", "local_work",
           "model_footprint", "resolve_gpu", "Ranked", "MEMORY_LATENCY_S", "FAMILY_EXECUTION",
           "extra_pass_seconds"]

#: The default latency of the bytes-in-flight floor (kept here for compatibility; the floor, and
#: the profile's ``memory_latency_s`` that overrides this, live in napkin.perfmodel.predict).
MEMORY_LATENCY_S = 800e-9

#: Why the cost model was not used for the last schedule (for diagnostics), or None.
last_cost_problem: str | None = None


@dataclass(frozen=True)
class Ranked:
    """One candidate with its prediction (``source``: "cost" or "local"); ``kernel``: the model's
    :class:`~napkin.perfmodel.predict.KernelPrediction` behind it (its launch, residency, roofline
    and latency chain), for explaining it."""

    schedule: Schedule
    seconds: float
    source: str
    detail: str = ""
    bound: str = ""
    kernel: "KernelPrediction | None" = field(default=None, compare=False, repr=False)


def resolve_gpu(gpu=None):
    """A GPU profile: the one given (object, name or profile path), else the GPU at hand, else h100."""
    from ..perfmodel.hardware import get_gpu, match_device_name

    if gpu is not None:
        return get_gpu(gpu)  # a profile object comes back as it is, registered under its plans' name
    try:
        import sys

        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            if torch.cuda.is_available():
                return get_gpu(match_device_name(torch.cuda.get_device_name()))
    except NapkinError:
        pass
    except Exception:  # noqa: BLE001 - no device to ask
        pass
    return get_gpu("h100")


_gpu = resolve_gpu


def _family(family):
    from . import families

    return families.get(family) if isinstance(family, str) else family


# ----------------------------------------------------------------------------- the cost model


def _cost_fn():
    try:
        from ..perfmodel.cost import cost  # written alongside; may not exist yet
    except ImportError as e:
        return None, f"napkin.perfmodel.cost is not available ({e})"
    return cost, None


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def model_cost(schedule: Schedule, gpu):
    """The performance model's Cost of ``schedule`` (``cost(schedule, gpu, sizes=..., l2_caching=...)``),
    or None when the model is not available or cannot cost it. An illegal schedule raises
    ScheduleError."""
    global last_cost_problem
    cost, why = _cost_fn()
    if cost is None:
        last_cost_problem = why
        return None
    sizes = {n: s for n, s in schedule.diagram.sizes.items() if isinstance(s, int)}
    try:
        c = cost(schedule, gpu, sizes=sizes, l2_caching=True)
    except ScheduleError:
        raise
    except Exception as e:  # noqa: BLE001 - a model still being written must not stop lowering
        last_cost_problem = f"cost({schedule.diagram.name}) failed: {type(e).__name__}: {e}"
        return None
    last_cost_problem = None
    return c


def _levels(c) -> Mapping:
    lv = getattr(c, "levels", None)
    return lv if isinstance(lv, Mapping) else {}


def model_work(schedule: Schedule, gpu):
    """A roofline :class:`~napkin.perfmodel.roofline.Work` from the cost model, or None."""
    from ..perfmodel.roofline import Work

    c = model_cost(schedule, gpu)
    if c is None:
        return None
    by = {}
    for name, lv in _levels(c).items():
        if name not in ("HBM", "L2", "SMEM"):
            continue
        h = _num(getattr(lv, "H_bytes", None))
        if h is not None:
            by[name] = h
    if "HBM" not in by:
        global last_cost_problem
        last_cost_problem = "cost model gave no numeric HBM transfer"
        return None
    flops = getattr(c, "flops", None)
    fl: dict[str, float] = {}
    if isinstance(flops, Mapping):
        for k, v in flops.items():
            n = _num(v)
            if n is not None and (k in ("tensor", "cuda", "sfu") or str(k).startswith("tensor:")):
                fl[k] = n
    else:
        n = _num(flops)
        if n is not None:
            fl["cuda"] = n
    return Work(flops=fl, bytes=by, dtype=_work_dtype(schedule.dtype))


def model_footprint(schedule: Schedule, gpu) -> list[dict[str, float]] | None:
    """Per kernel of ``schedule``, the memory the cost model assumed per block:
    ``{"SMEM": bytes, "RF": bytes, "RF_elements": values}``; None where the model is unavailable."""
    try:
        c = model_cost(schedule, gpu)
    except NapkinError:
        return None
    if c is None:
        return None
    out = []
    for kc in getattr(c, "per_kernel", ()) or ():
        lv = getattr(kc, "levels", {}) or {}
        d = {}
        if "SMEM" in lv and _num(getattr(lv["SMEM"], "M_bytes", None)) is not None:
            d["SMEM"] = _num(lv["SMEM"].M_bytes)
        if "RF" in lv:
            b, e = _num(getattr(lv["RF"], "M_bytes", None)), _num(getattr(lv["RF"], "M_elements", None))
            if b is not None:
                d["RF"] = b
            if e is not None:
                d["RF_elements"] = e
        out.append(d)
    return out or None


# ----------------------------------------------------------------------------- local estimate


def _work_dtype(dt: str) -> str:
    return dt if dt in ("fp16", "bf16", "fp8", "tf32") else "tf32" if dt == "fp32" else "fp16"


def _size(v, sizes) -> int:
    return math.prod(sizes[a] for a in v.axis_names)


def local_work(schedule: Schedule, *, tensor_cores: bool = False):
    """A simple estimate: each kernel reads its HBM inputs and writes its outputs once."""
    from ..perfmodel.roofline import Work

    d = schedule.diagram
    sizes = {n: a.bound_size for n, a in d.axes.items()}
    hbm = 0.0
    try:
        from ..perfmodel.legality import analyze

        for plan in analyze(schedule):
            for v in (*plan.inputs, *plan.stores):
                hbm += _size(v, sizes) * lookup_dtype(v.dtype).bytes
    except ScheduleError:
        raise
    except Exception:  # noqa: BLE001 - legality being rewritten: count per box instead
        hbm = 0.0
        for v in d.nodes:
            if v.op.kind == "rename":
                continue
            for a in (*v.args, v):
                hbm += _size(a, sizes) * lookup_dtype(a.dtype).bytes
    flops = {"tensor": 0.0, "cuda": 0.0, "sfu": 0.0}
    for v in d.nodes:
        n = _size(v, sizes)
        kind = v.op.kind
        if kind == "contract":
            inner = math.prod(sizes[a] for a in v.op.over)
            flops["tensor" if tensor_cores else "cuda"] += 2.0 * n * inner * max(1, len(v.args) - 1)
        elif kind == "map":
            f = get_function(v.op.fn)
            flops["cuda"] += f.flops * n
            flops["sfu"] += f.sfu * n
        elif kind == "softmax":
            flops["cuda"] += 4.0 * n
            flops["sfu"] += n
        elif kind in ("norm", "reduce"):
            flops["cuda"] += 4.0 * _size(v.args[0], sizes)
    return Work(flops={k: v for k, v in flops.items() if v}, bytes={"HBM": hbm},
                dtype=_work_dtype(schedule.dtype))


# ----------------------------------------------------------------------------- prediction

#: How napkin's own kernel templates issue their work, per family, where the roofline cannot see
#: it (a family's ``launch_estimate`` may set any of these keys itself, which wins):
#:
#: * ``tensor_path="mma.sync"``: the contraction (except its wgmma configurations, whose
#:   ``launch_estimate`` says ``tensor_path="peak"``, ``overlap_operands=True``) and attention
#:   templates issue warp-level ``mma.sync`` (m16n8k16), also on sm_90, whose rate is ``GPU.mma_sync_fraction`` of the
#:   datasheet (647 / 989.4 TFLOP/s measured on an H200);
#: * ``overlap_operands=False``: their warps load operands from SMEM (``ldmatrix``) and issue the
#:   mma from one instruction stream, 2 warps per scheduler: ncu on an H200 shows 0.37 issued
#:   instructions per cycle per scheduler and stalls on fixed-latency dependencies, so the operand
#:   loads do not hide behind the mma;
#: * ``overlap_compute=False`` (attention): the FlashAttention-2-style template runs the online
#:   softmax (exp on the SFU, max/sum/rescale on CUDA cores) between its two mma in the same warp,
#:   so tensor, CUDA-core and SFU times add;
#: * ``in_flight_through_l2=True`` (contraction): the bytes a tile keeps in flight are both operands'
#:   loads, those that hit L2 among them (``LaunchShape.in_flight_through_l2``).
FAMILY_EXECUTION: dict[str, dict] = {
    "contraction": {"tensor_path": "mma.sync", "overlap_operands": False, "in_flight_through_l2": True},
    "attention": {"tensor_path": "mma.sync", "overlap_operands": False, "overlap_compute": False},
}

#: The dtypes whose contraction and attention kernels use mma.sync (fp32 contractions run the SIMT
#: template).
MMA_SYNC_DTYPES = ("fp16", "bf16")


def _estimate(diagram: Diagram, fam, schedule: Schedule, gpu) -> dict | None:
    """The family's ``launch_estimate`` for ``schedule``, or None where it gives none."""
    if not hasattr(fam, "launch_estimate"):
        return None
    try:
        est = fam.launch_estimate(diagram, schedule, gpu)
    except (NapkinError, KeyError, ValueError):
        return None
    if not est or not est.get("blocks") or not est.get("threads") or not est.get("regs"):
        return None
    return est


def launch_shape(diagram: Diagram, family, schedule: Schedule, gpu):
    """The :class:`~napkin.perfmodel.predict.LaunchShape` of the kernel ``family`` generates for
    ``schedule``: its ``launch_estimate`` (blocks, threads, registers, shared memory, bytes in
    flight per thread, idle lanes) plus how it issues its work (:data:`FAMILY_EXECUTION`, or the
    estimate's own ``tensor_path`` / ``overlap_compute`` / ``overlap_operands``). None when the
    family gives no estimate with blocks, threads and registers."""
    fam = _family(family)
    return _shape_of(_estimate(diagram, fam, schedule, _gpu(gpu)), fam, schedule)


def _shape_of(est: dict | None, fam, schedule: Schedule):
    from ..perfmodel.predict import LaunchShape

    if est is None:
        return None
    facts = dict(FAMILY_EXECUTION.get(getattr(fam, "name", ""), {}))
    if schedule.dtype not in MMA_SYNC_DTYPES:
        facts.pop("tensor_path", None)
        facts.pop("overlap_operands", None)
    for k in ("tensor_path", "overlap_compute", "overlap_operands", "overlap_memory"):
        if est.get(k) is not None:
            facts[k] = est[k]
    # the latency chain's facts a family may know better than the cost model (threads per row of a
    # reduction; the rest is filled in from the kernel's cost)
    for k in ("stream_steps", "reductions", "reductions_per_step", "threads_per_row", "row_iterations",
              "row_round_trips", "row_l2_rounds", "exp_fma_share", "fma_flops_per_exp"):  # and the exponentials it computes on the FMA pipe
        if est.get(k) is not None:
            facts[k] = est[k]
    if est.get("epilogue_hbm_bytes"):  # a phase after the loop that the roofline must not overlap
        facts["epilogue_hbm_bytes"] = float(est["epilogue_hbm_bytes"])
        facts["epilogue_waits"] = int(est.get("epilogue_waits") or 0)
    if est.get("epilogue_maps"):  # maps after the loop whose stores overlap it
        facts["epilogue_maps"] = True
    if est.get("epilogue_rate"):  # the share of the SM's rates an epilogue's few warps reach
        facts["epilogue_rate"] = float(est["epilogue_rate"])
    if est.get("tf32x3_flops"):  # an fp32 sum run as 3xTF32 on the tensor cores
        facts["tf32x3_flops"] = float(est["tf32x3_flops"])
    if est.get("tensor_chain_s"):  # dependent tensor-core products that bind a small tile
        facts["tensor_chain_s"] = float(est["tensor_chain_s"])
    if est.get("tail_factor"):  # the per-SM tail the kernel's own order of unequal tiles gives
        facts["tail_factor"] = float(est["tail_factor"])
    if est.get("products_on_cuda"):  # a sum of products as fp32 FMAs, not on the tensor cores
        facts["products_on_cuda"] = True
    if est.get("issue_overlaps_memory"):  # loads that run ahead of the loop's per-step gaps
        facts["issue_overlaps_memory"] = True
    if est.get("fill_share"):  # the ring's fill and drain, exposed in a loop of few steps
        facts["fill_share"] = float(est["fill_share"])
    if est.get("tail_l2_rounds"):  # an in-kernel combine's dependent rounds after the loop
        facts["tail_l2_rounds"] = int(est["tail_l2_rounds"])
    return LaunchShape(blocks=int(est["blocks"]), threads=int(est["threads"]), regs_per_thread=int(est["regs"]),
                       smem_bytes=int(est.get("smem") or 0),
                       in_flight_bytes_per_thread=est.get("in_flight_bytes_per_thread") or None,
                       idle_lanes=float(est.get("idle_lanes") or 0.0), **facts)


def extra_pass_seconds(est: dict | None, gpu) -> float:
    """What a kernel's work adds beyond what the cost model sees, as the family's
    ``launch_estimate`` states it: a second, small pass (a split reduction's combine:
    ``extra_launches`` launch overheads, and ``extra_hbm_bytes`` of fp32 partials written and
    read back at the HBM rate), ``extra_l2_bytes`` of scalar loads that the cost model counts
    as one read per array but that a kernel without tiles issues per thread and per iteration (one
    32-byte sector each where a warp's lanes touch different lines), at the L2 rate, and
    ``extra_smem_bytes`` of operand loads from shared memory that the schedule's tiles do not
    describe, at the SMEM rate, and ``extra_round_trips`` memory latencies a kernel's tail waits
    for one after another (a combine folded into the last block to arrive: its stores, fence,
    arrival and batches of partial loads)."""
    from ..perfmodel.roofline import launch_overhead_of

    if not est:
        return 0.0
    launches = float(est.get("extra_launches") or 0)
    moved = float(est.get("extra_hbm_bytes") or 0.0)
    sectors = float(est.get("extra_l2_bytes") or 0.0)
    # operand loads SMEM -> registers the schedule's tiles do not say (attention's backward: every
    # warp reads the whole Q and dO tiles), issued between the mma (not overlapped), at the SMEM rate
    operands = float(est.get("extra_smem_bytes") or 0.0)
    trips = float(est.get("extra_round_trips") or 0)
    if not launches and not moved and not sectors and not operands and not trips:
        return 0.0
    g = _gpu(gpu)
    names = [lv.name for lv in g.levels]
    l2 = g.level("L2").bandwidth if "L2" in names else g.level("HBM").bandwidth
    smem = operands / g.level("SMEM").bandwidth if operands and "SMEM" in names else 0.0
    return (launches * launch_overhead_of(g) + trips * g.memory_latency_s + moved / g.level("HBM").bandwidth
            + sectors / l2 + smem)


def predict_schedule(diagram: Diagram, family, schedule: Schedule, gpu, *, efficiency=None) -> Ranked:
    """Predicted time of one candidate: the cost model's transfers and FLOPs with the family's
    launch (:func:`launch_shape`) through :func:`napkin.perfmodel.predict.predict_schedule`, the
    one prediction path (roofline, occupancy, waves, latency floor, the profile's calibrated
    fractions for this family); the local estimate where the cost model is unavailable."""
    from ..perfmodel.predict import predict_kernel, predict_schedule as model_predict
    from ..perfmodel.predict import LaunchAssumptions, family_efficiency
    from ..perfmodel.roofline import LAUNCH_OVERHEAD_S, Efficiency

    gpu = _gpu(gpu)
    fam = _family(family)
    name = getattr(fam, "name", None)
    est = _estimate(diagram, fam, schedule, gpu)
    shape = _shape_of(est, fam, schedule)
    extra = extra_pass_seconds(est, gpu)
    eff = efficiency if efficiency is not None else Efficiency()
    detail = ""
    schedule = schedule.padded_view()  # a tile that overhangs its axis is costed whole
    c = model_cost(schedule, gpu)
    if c is not None and not getattr(c, "is_symbolic", False) and _num(getattr(_levels(c).get("HBM"), "H_bytes", None)) is not None:
        # without launch facts from the family: the plain roofline per kernel (no assumed launch
        # that could refuse a schedule the family can run)
        p = model_predict(schedule, gpu, the_cost=c, launch=shape, family=name, efficiency=eff,
                          assume=None if shape is None else LaunchAssumptions())
        k = p.kernels[0]
        if shape is not None:
            detail = f"blocks {k.blocks}, {k.blocks_per_sm} per SM, {p.bound}-bound"
        return Ranked(schedule, p.seconds + extra, "cost", detail, p.bound, k)
    work = local_work(schedule, tensor_cores=name in ("contraction", "attention")
                      and schedule.dtype in MMA_SYNC_DTYPES)
    kp = predict_kernel(gpu, work, shape, name=name or "kernel", efficiency=family_efficiency(gpu, name, eff))
    if shape is not None:
        detail = f"blocks {kp.blocks}, {kp.blocks_per_sm} per SM, {kp.bound}-bound"
    extra += max(0, len(schedule.kernels) - 1) * LAUNCH_OVERHEAD_S
    return Ranked(schedule, kp.seconds + extra, "local", detail, kp.bound, kp)


def rank(diagram: Diagram, family, gpu, dtype: str | None = None) -> list[Ranked]:
    """Every candidate of ``family`` for ``diagram`` with its prediction, fastest first."""
    gpu = _gpu(gpu)
    fam = _family(family)
    dtype = canonical_dtype(dtype) or next(iter(sorted(diagram.dtypes)), "bf16")
    cands = list(fam.candidates(diagram, gpu, dtype))
    if not cands:
        raise CodegenError(f"family {fam.name} proposes no schedule for {diagram.name!r}")
    out: list[tuple[Ranked, int]] = []
    illegal = []
    for i, s in enumerate(cands):
        try:
            out.append((predict_schedule(diagram, fam, s, gpu), i))
        except ScheduleError as e:
            illegal.append(str(e))
    if not out:
        # the model refused every candidate: rank them by the local estimate alone
        for i, s in enumerate(cands):
            r = Ranked(s, _local_seconds(s, gpu), "local", "model refused: " + (illegal[0] if illegal else ""))
            out.append((r, i))
    out.sort(key=lambda t: (t[0].seconds, t[1]))
    return [r for r, _ in out]


def local_estimate(schedule: Schedule, gpu) -> Ranked:
    """The plain estimate of a schedule the cost model refuses (every input read, every output
    written once; contractions on CUDA cores)."""
    from ..perfmodel.roofline import LAUNCH_OVERHEAD_S

    g = _gpu(gpu)
    d = schedule.diagram
    sizes = {n: a.bound_size for n, a in d.axes.items()}
    moved = sum(_size(v, sizes) * lookup_dtype(v.dtype).bytes for v in (*d.inputs, *d.outputs))
    seconds = moved / g.level("HBM").bandwidth + LAUNCH_OVERHEAD_S * len(schedule.kernels)
    return Ranked(schedule, seconds, "local", "cost model refused it", "HBM (plain estimate)")


def _local_seconds(schedule: Schedule, gpu) -> float:
    from ..perfmodel.roofline import predict

    try:
        return predict(gpu, local_work(schedule)).seconds
    except NapkinError:
        return math.inf


def rank_candidates(diagram: Diagram, family, gpu, dtype: str | None = None) -> list[tuple[Schedule, float]]:
    """``[(schedule, predicted seconds), ...]`` for every candidate of ``family``, fastest first.

    ``family`` is a family object or name, ``gpu`` a GPU profile or name (None: the GPU at hand,
    else h100). Ties keep the family's own order of preference.
    """
    return [(r.schedule, r.seconds) for r in rank(diagram, family, gpu, dtype)]
