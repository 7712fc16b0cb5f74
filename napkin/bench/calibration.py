"""Calibrating the performance model on benchmark records, and judging it honestly.

The benchmark suite (:mod:`napkin.bench.suite`) records, per point, napkin's measured time
(``napkin_s``), the schedule it ran (``napkin.schedule``, ``napkin.schedule_id``) and every
configuration the autotuner measured (``napkin.tune.candidates``: ``desc``, ``id``, ``meas_s``).
This module works offline on those records:

* :func:`re_predict` recomputes every prediction with the model as it is now: each schedule
  description is parsed back into a :class:`~napkin.perfmodel.schedule.Schedule` on the point's
  bound diagram (:func:`parse_description`; the family's own candidate with the recorded id
  supplies what a description leaves out, such as pipeline stages), then predicted exactly as
  :func:`napkin.codegen.select.predict_schedule` does (the family's launch facts through
  :func:`napkin.perfmodel.predict.predict_schedule`).
* :func:`fit` fits ONE efficiency factor per code-generation family (:data:`FAMILY_FACTORS`):
  the achieved fraction of the tensor path (contraction, attention: multiplies
  ``Efficiency.tensor``, on top of the profile's ``mma_sync_fraction``) or of the copy rate
  (rowwise: multiplies ``Efficiency.hbm`` against the measured copy rate). For each point the
  factor that makes the model meet napkin's measured time is found (the prediction falls as the
  factor grows; bisection; a point the factor cannot reach within (0, 1.5] counts at the bound),
  and the family's factor is the MEDIAN over its points: for a kernel bound by the calibrated
  term this is the median of predicted/measured, robust to a few odd points.
* :func:`cross_validated_errors` predicts every point with the factor fitted on the OTHER points
  of its family only (leave-one-out); that error is the calibrated model's error to report,
  never the in-sample one.
* :meth:`Calibration.to_profile` / :meth:`Calibration.save` write a GPU profile (the measured
  copy rate as HBM bandwidth, the factors in ``efficiency``) that
  :func:`napkin.perfmodel.hardware.get_gpu` loads; codegen's predictions of a family's kernels
  then apply its factor.

Nothing here fits anything per point: one number per family, from the other points.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import NapkinError, ScheduleError
from .hardware import GPU, get_gpu
from .predict import PreparedSchedule, predict_prepared, prepare_schedule
from .roofline import Efficiency
from .schedule import Kernel, Relabel, Schedule

__all__ = [
    "FACTOR_RANGE",
    "FAMILY_FACTORS",
    "CVResult",
    "Calibration",
    "CalibrationError",
    "ModelCheck",
    "PointSamples",
    "Sample",
    "base_profile",
    "cross_validated_errors",
    "evaluate",
    "factor_dict",
    "factor_names",
    "fit",
    "parse_description",
    "point_factor",
    "predict_sample",
    "prepare_records",
    "re_predict",
    "schedule_of",
]

#: The one factor fitted per code-generation family: an :class:`Efficiency` fraction name.
#: contraction, attention: achieved fraction of the (mma.sync) tensor path; rowwise: achieved
#: fraction of the measured copy rate. Families not listed get "hbm".
FAMILY_FACTORS = {"contraction": ("tensor", "smem"), "attention": ("tensor", "cuda", "sfu", "smem"),
                  "rowwise": ("hbm",), "fallback": ("hbm",)}

#: The range a factor may take (that of an Efficiency fraction).
FACTOR_RANGE = (1e-3, 1.5)


class CalibrationError(NapkinError):
    """A record cannot be re-predicted (no schedule, unknown diagram, ambiguous description)."""


# ----------------------------------------------------------------------------- schedules from records

_KERNEL_RE = re.compile(r"^\s*([^\[\];]+?)\s*\[(.*)\]\s*$")
_RELABEL_RE = re.compile(r"^\s*([A-Za-z_][\w']*)\s*(?:→|->)\s*([A-Za-z])_[\w']*\s*=\s*(\d+)\s*@\s*([A-Za-z0-9]+)\s*$")


def _split_kernels(desc: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in desc:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def parse_description(diagram, desc: str, dtype: str | None = None, gpu: str | None = None) -> Schedule:
    """The Schedule a one-line description (``napkin.bench.autotune.describe_schedule``) stands for,
    on ``diagram``: ``"fused[q → g_q=128@SMEM, q → w_q=32@RF, x → s_x=32@SMEM]"``; kernels are
    separated by ``"; "``. One kernel runs every box; several kernels are matched by name to the
    kernels of :meth:`Schedule.unfused`. The symbol's letter gives the kind (g, w: group; s, t:
    stream). Notes (pipeline stages, warps) are not in a description.
    """
    parts = _split_kernels(str(desc))
    if not parts:
        raise CalibrationError(f"empty schedule description {desc!r}")
    parsed = []
    for part in parts:
        m = _KERNEL_RE.match(part)
        if not m:
            raise CalibrationError(f"cannot read kernel {part.strip()!r} of {desc!r} (want name[relabels])")
        name, body = m.group(1), m.group(2).strip()
        rels = []
        for item in ([x for x in body.split(",") if x.strip()] if body and body != "no relabels" else []):
            r = _RELABEL_RE.match(item)
            if not r:
                raise CalibrationError(f"cannot read relabelling {item.strip()!r} of {desc!r} "
                                       "(want 'axis → g_axis=SIZE@LEVEL')")
            axis, letter, size, level = r.group(1), r.group(2), int(r.group(3)), r.group(4).upper()
            if letter not in "gwst":
                raise CalibrationError(f"relabelling {item.strip()!r}: symbol letter {letter!r} is none of g, w, s, t")
            rels.append(Relabel(axis, size, level, "group" if letter in "gw" else "stream"))
        parsed.append((name, tuple(rels)))
    boxes_all = tuple(diagram.name_of(v) for v in diagram.nodes)
    dt = dtype or (sorted(diagram.dtypes)[0] if len(diagram.dtypes) == 1 else "bf16")
    if len(parsed) == 1:
        name, rels = parsed[0]
        kernels = (Kernel(name, boxes_all, rels),)
    else:
        unfused = {k.name: k for k in Schedule.unfused(diagram).kernels}
        missing = [n for n, _ in parsed if n not in unfused]
        if missing:
            raise CalibrationError(f"description {desc!r} names kernel(s) {missing} that the unfused schedule of "
                                   f"{diagram.name!r} does not have ({', '.join(unfused)})")
        kernels = tuple(Kernel(n, unfused[n].boxes, rels) for n, rels in parsed)
    try:
        return Schedule(diagram, kernels, gpu, dt)
    except ScheduleError as e:
        raise CalibrationError(f"description {desc!r}: {e}") from None


def _family_candidates(diagram, family, gpu, dtype) -> list[Schedule]:
    try:
        return list(family.candidates(diagram, gpu, dtype))
    except Exception:  # noqa: BLE001 - a family that proposes nothing here: parse alone
        return []


def schedule_of(diagram, family, desc: str, sid: str | None, gpu, dtype: str,
                candidates: Sequence[Schedule] | None = None) -> tuple[Schedule, str]:
    """The schedule a record names, and how it was found: ``"id"`` (the family's candidate whose
    id matches the record's and whose description parses to the same relabellings), ``"desc"``
    (parsed from the description alone; the family supplies defaults for what it omits)."""
    from ..bench.autotune import describe_schedule, schedule_id

    parsed = parse_description(diagram, desc, dtype, getattr(gpu, "key", None))
    cands = list(candidates) if candidates is not None else _family_candidates(diagram, family, gpu, dtype)
    want = describe_schedule(parsed)
    if sid:
        for s in cands:
            if schedule_id(s) == sid:
                if describe_schedule(s) != want:
                    raise CalibrationError(f"schedule id {sid} is {describe_schedule(s)!r}, not {desc!r}")
                return s, "id"
    same = [s for s in cands if describe_schedule(s) == want]
    if len(same) > 1 and len({tuple(s.notes) for s in same}) > 1:
        raise CalibrationError(f"{desc!r} stands for {len(same)} of the family's schedules (they differ only in "
                               "notes) and no id matches")
    return (same[0], "desc") if same else (parsed, "desc")


# ----------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """One measured run the model can predict again: a schedule costed once with its launch."""

    point_id: str
    bench_family: str
    family: str                      # code-generation family (the calibration key)
    desc: str
    meas_s: float | None
    prepared: PreparedSchedule = field(repr=False)
    how: str = "id"                  # "id" or "desc"


@dataclass
class PointSamples:
    """A benchmark record with its chosen kernel and its measured candidates as Samples."""

    record: dict
    family: str | None = None
    chosen: Sample | None = None
    candidates: list = field(default_factory=list)   # (candidate dict, Sample | None, problem | None)
    problem: str | None = None


def _codegen_family(bound):
    from ..bench.autotune import _codegen_family as fam_of
    from ..codegen import families

    name = fam_of(bound)
    return families.get(name)


def _bound_diagram(rec: Mapping):
    from ..bench.autotune import _prepare
    from ..diagrams import library

    name, sizes, dtype = rec.get("diagram"), rec.get("sizes") or {}, rec.get("dtype") or "bf16"
    if not name or name not in library.names():
        raise CalibrationError(f"record {rec.get('id')!r}: unknown diagram {name!r}")
    return _prepare(library.get(name), dict(sizes), dtype)


def _sample(point_id, bench_family, fam, bound, schedule, how, desc, meas, gpu) -> Sample:
    from ..codegen.select import launch_shape, model_cost

    c = model_cost(schedule, gpu)
    if c is None:
        from ..codegen import select

        raise CalibrationError(f"the cost model cannot cost {desc!r}: {select.last_cost_problem}")
    prepared = prepare_schedule(schedule, gpu, the_cost=c, launch=launch_shape(bound, fam, schedule, gpu))
    return Sample(point_id, bench_family, fam.name, desc, meas, prepared, how)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 else None


def prepare_records(records: Iterable[Mapping], gpu: GPU | str) -> list[PointSamples]:
    """Every record with its chosen schedule and measured candidates resolved and costed on
    ``gpu`` (capacities and launch limits come from it; rates may change later). A record or a
    candidate that cannot be re-predicted keeps its reason in ``problem``."""
    g = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    out = []
    for rec in records:
        ps = PointSamples(rec)
        out.append(ps)
        pid, bfam = str(rec.get("id", "?")), str(rec.get("family", "?"))
        try:
            bound = _bound_diagram(rec)
            fam = _codegen_family(bound)
        except Exception as e:  # noqa: BLE001
            ps.problem = f"{type(e).__name__}: {e}"
            continue
        ps.family = fam.name
        dtype = rec.get("dtype") or "bf16"
        cands = _family_candidates(bound, fam, g, dtype)
        nap = rec.get("napkin") or {}
        desc, sid = nap.get("schedule"), nap.get("schedule_id")
        if desc:
            try:
                s, how = schedule_of(bound, fam, desc, sid, g, dtype, cands)
                ps.chosen = _sample(pid, bfam, fam, bound, s, how, desc, _num(rec.get("napkin_s")), g)
            except Exception as e:  # noqa: BLE001
                ps.problem = f"chosen schedule: {type(e).__name__}: {e}"
        else:
            ps.problem = "the record names no schedule (napkin.schedule)"
        for c in ((nap.get("tune") or {}).get("candidates") or []):
            if not isinstance(c, dict):
                continue
            if not c.get("desc"):
                ps.candidates.append((c, None, "no description"))
                continue
            try:
                s, how = schedule_of(bound, fam, c["desc"], c.get("id"), g, dtype, cands)
                ps.candidates.append((c, _sample(pid, bfam, fam, bound, s, how, c["desc"], _num(c.get("meas_s")), g),
                                      None))
            except Exception as e:  # noqa: BLE001
                ps.candidates.append((c, None, f"{type(e).__name__}: {e}"))
    return out


def predict_sample(sample: Sample, gpu: GPU, factors: Mapping[str, float] | None = None) -> float:
    """Seconds the model predicts for ``sample`` on ``gpu``: with ``factors`` (fraction name →
    value) as its efficiency, else with the profile's calibrated fractions for its family."""
    if factors is None:
        return predict_prepared(sample.prepared, gpu, family=sample.family).seconds
    plain = dataclasses.replace(gpu, efficiency={}) if gpu.efficiency else gpu
    return predict_prepared(sample.prepared, plain, efficiency=Efficiency().scaled(factors)).seconds


# ----------------------------------------------------------------------------- fitting


def base_profile(gpu: GPU | str, device: Mapping | None = None) -> GPU:
    """The profile factors are fitted against: ``gpu`` without calibrated fractions, with the
    device's measured copy rate (``device["copy_bandwidth"]``, read + write bytes per second) as
    its HBM bandwidth where the records have one; measured rates kept in ``measured``."""
    g = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    g = dataclasses.replace(g, efficiency={})
    dev = device or {}
    meas = {}
    ov: dict[str, Any] = {}
    copy_bw = _num(dev.get("copy_bandwidth"))
    if copy_bw:
        meas["copy_bandwidth"] = copy_bw
        ov["hbm_bandwidth"] = copy_bw
        when = f" {dev['date']}" if dev.get("date") else ""
        ov["hbm_assumption"] = (f"measured{when}: device-to-device copy, read + write bytes "
                                f"(datasheet {g.hbm_bandwidth / 1e12:.3g} TB/s)")
    gemm = _num(dev.get("gemm_bf16_flops"))
    if gemm:
        meas["gemm_bf16_cublas"] = gemm  # reference only: napkin's kernels issue mma.sync
    if meas:
        ov["measured"] = meas
    return g.with_overrides(**ov) if ov else g


def factor_names(family: str) -> tuple[str, ...]:
    """The Efficiency fractions the factor of ``family`` multiplies (:data:`FAMILY_FACTORS`)."""
    return tuple(FAMILY_FACTORS.get(family, ("hbm",)))


def factor_dict(family: str, value: float) -> dict[str, float]:
    """``{fraction: value}`` for every fraction the family's factor multiplies."""
    return {k: float(value) for k in factor_names(family)}


def point_factor(sample: Sample, gpu: GPU) -> float | None:
    """The factor (multiplying the family's fractions, :func:`factor_names`) at which the model predicts this sample's
    measured time: bisection in log space over :data:`FACTOR_RANGE` (the prediction does not rise
    as the factor grows). A time the model cannot reach gives the range's bound; no measurement:
    None."""
    if not sample.meas_s:
        return None
    lo, hi = FACTOR_RANGE
    t = sample.meas_s

    def pred(f):
        return predict_sample(sample, gpu, factor_dict(sample.family, f))

    if pred(hi) > t:
        return hi
    if pred(lo) <= t:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if pred(mid) > t:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi


@dataclass(frozen=True)
class Calibration:
    """Per-family factors fitted on benchmark records, relative to ``gpu`` (:func:`base_profile`)."""

    gpu: GPU = field(repr=False)
    factors: dict[str, dict[str, float]]            # family -> {fraction name: value}
    n_points: dict[str, int]                        # family -> points the median is over
    per_point: dict[str, float] = field(default_factory=dict)   # point id -> its own factor
    source: str = ""

    def efficiency(self, family: str, base: Efficiency = Efficiency()) -> Efficiency:
        """``base`` times the family's factors."""
        f = self.factors.get(family)
        return base.scaled(f) if f else base

    def to_profile(self, note: str | None = None) -> GPU:
        """The base profile with the factors as its ``efficiency`` and their provenance in its notes."""
        parts = [f"{fam}: {k} x {v:.3f} (median of {self.n_points.get(fam, 0)} points)"
                 for fam, fr in sorted(self.factors.items()) for k, v in fr.items()]
        text = ("calibrated per-family efficiency (napkin.perfmodel.calibration.fit): "
                + ("; ".join(parts) if parts else "none")
                + ". Each factor is the median over the family's benchmark points of the factor that makes "
                  "the model meet napkin's measured time; judge it by the leave-one-out error, not in-sample"
                + (f". Records: {self.source}" if self.source else "") + (f". {note}" if note else "") + ".")
        g = dataclasses.replace(self.gpu, efficiency={k: dict(v) for k, v in self.factors.items()})
        date = (self.gpu.source.split(":", 1)[1].strip() if self.gpu.source.startswith("calibrated") else "")
        return g.with_overrides(notes=(g.notes + " | " if g.notes else "") + text,
                                source="calibrated" + (f": {date}" if date else "") + " (per-family efficiency)",
                                name=g.name if g.name.endswith("(calibrated)") else f"{g.name} (calibrated)")

    def save(self, path: str | Path, note: str | None = None) -> Path:
        """Write :meth:`to_profile` as JSON (``napkin cost NAME --gpu PATH`` loads it)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_profile(note).to_json(), encoding="utf-8")
        return path


def _fit_from_samples(points: Sequence[PointSamples], gpu: GPU, source: str = "") -> Calibration:
    per_point: dict[str, float] = {}
    by_family: dict[str, list[float]] = {}
    for ps in points:
        s = ps.chosen
        if s is None or not s.meas_s:
            continue
        f = point_factor(s, gpu)
        if f is None:
            continue
        per_point[s.point_id] = f
        by_family.setdefault(s.family, []).append(f)
    factors = {fam: factor_dict(fam, statistics.median(v)) for fam, v in by_family.items()}
    return Calibration(gpu, factors, {fam: len(v) for fam, v in by_family.items()}, per_point, source)


def fit(records: Iterable[Mapping], gpu: GPU | str, *, device: Mapping | None = None,
        prepared: Sequence[PointSamples] | None = None) -> Calibration:
    """One factor per code-generation family from ``records`` (the suite's point dicts): the
    median over the family's points of each point's own factor (:func:`point_factor`) for
    napkin's measured time of its chosen kernel, against :func:`base_profile` (``device``: the
    results' device header, for the measured copy rate)."""
    records = list(records)
    base = base_profile(gpu, device)
    pts = prepared if prepared is not None else prepare_records(records, base)
    src = ", ".join(f"{k} {v}" for k, v in (("device", (device or {}).get("name")), ("date", (device or {}).get("date")))
                    if v)
    return _fit_from_samples(pts, base, src)


@dataclass(frozen=True)
class CVResult:
    """One point predicted with the factor fitted on the other points of its family."""

    point_id: str
    bench_family: str
    family: str
    meas_s: float
    pred_s: float | None            # None: no other point to fit on
    factor: float | None            # the factor used (fitted without this point)
    own_factor: float | None        # this point's own factor (for diagnosis; never used for it)

    @property
    def error(self) -> float | None:
        return None if self.pred_s is None else abs(self.pred_s - self.meas_s) / self.meas_s


def cross_validated_errors(records: Iterable[Mapping], gpu: GPU | str | None = None, *,
                           device: Mapping | None = None,
                           prepared: Sequence[PointSamples] | None = None) -> list[CVResult]:
    """Leave-one-out: every point with a measured chosen kernel, predicted with its family's
    factor fitted on the OTHER points only (the median of their own factors). A family with one
    point gives None."""
    records = list(records)
    if gpu is None:
        gpu = (device or {}).get("gpu_key") or next((r.get("gpu_key") for r in records if r.get("gpu_key")), None)
        if gpu is None:
            raise CalibrationError("cross_validated_errors needs a GPU profile (or a device with gpu_key)")
    base = base_profile(gpu, device)
    pts = prepared if prepared is not None else prepare_records(records, base)
    samples = [ps.chosen for ps in pts if ps.chosen is not None and ps.chosen.meas_s]
    own = {id(s): point_factor(s, base) for s in samples}
    out = []
    for s in samples:
        others = [own[id(o)] for o in samples if o is not s and o.family == s.family and own[id(o)] is not None]
        if not others:
            out.append(CVResult(s.point_id, s.bench_family, s.family, s.meas_s, None, None, own[id(s)]))
            continue
        f = statistics.median(others)
        pred = predict_sample(s, base, factor_dict(s.family, f))
        out.append(CVResult(s.point_id, s.bench_family, s.family, s.meas_s, pred, f, own[id(s)]))
    return out


# ----------------------------------------------------------------------------- re-prediction


def re_predict(records: Iterable[Mapping], profile: GPU | str, *,
               prepared: Sequence[PointSamples] | None = None) -> list[dict]:
    """Copies of ``records`` with every prediction recomputed by the model as it is now, on
    ``profile`` (its calibrated fractions apply per family, as in codegen): ``pred_s`` and
    ``pred_err`` of the chosen kernel, ``pred_s`` of each recorded candidate. The recorded values
    are kept as ``pred_recorded_s``; ``pred_source`` says "model" or why the recorded value stayed
    ("recorded: <reason>")."""
    g = get_gpu(profile) if not isinstance(profile, GPU) else profile
    records = list(records)
    pts = prepared if prepared is not None else prepare_records(records, g)
    out = []
    for ps in pts:
        rec = copy.deepcopy(ps.record)
        if ps.chosen is not None:
            pred = predict_sample(ps.chosen, g)
            rec["pred_recorded_s"] = ps.record.get("pred_s")
            rec["pred_s"] = pred
            meas = _num(rec.get("napkin_s"))
            rec["pred_err"] = abs(pred - meas) / meas if meas else None
            rec["pred_source"] = "model"
            rec["pred_schedule_from"] = ps.chosen.how
        else:
            rec["pred_source"] = f"recorded: {ps.problem or 'not re-predicted'}"
        tune = ((rec.get("napkin") or {}).get("tune") or {})
        cands = tune.get("candidates") or []
        for (orig, sample, problem), c in zip(ps.candidates, [c for c in cands if isinstance(c, dict)]):
            if sample is not None:
                c["pred_recorded_s"] = orig.get("pred_s")
                c["pred_s"] = predict_sample(sample, g)
                c["pred_source"] = "model"
            else:
                c["pred_source"] = f"recorded: {problem}"
        out.append(rec)
    return out


@dataclass
class ModelCheck:
    """Everything the report needs: re-predicted records, the calibration, the CV errors."""

    points: list[dict]
    calibration: Calibration | None
    cv: list[CVResult]
    profile: GPU
    n_repredicted: int
    n_points: int
    n_candidates_repredicted: int
    n_candidates: int
    problems: list[str] = field(default_factory=list)


def evaluate(records: Iterable[Mapping], device: Mapping | None = None, gpu: GPU | str | None = None) -> ModelCheck:
    """Re-predict ``records`` on the device's datasheet profile, fit the factors on all points
    (for the written profile) and compute the leave-one-out errors; the records are costed once."""
    records = list(records)
    gpu = gpu or (device or {}).get("gpu_key")
    if not gpu:
        raise CalibrationError("the results name no GPU profile (device.gpu_key)")
    profile = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    pts = prepare_records(records, profile)
    points = re_predict(records, profile, prepared=pts)
    base = base_profile(profile, device)
    cal = fit(records, profile, device=device, prepared=pts)
    cv = cross_validated_errors(records, profile, device=device, prepared=pts)
    n_c = sum(len(ps.candidates) for ps in pts)
    n_cr = sum(1 for ps in pts for _, s, _ in ps.candidates if s is not None)
    problems = [f"{ps.record.get('id')}: {ps.problem}" for ps in pts if ps.problem]
    problems += [f"{ps.record.get('id')} candidate {c.get('desc')}: {pr}" for ps in pts for c, s, pr in ps.candidates
                 if s is None]
    return ModelCheck(points, cal if cal.factors else None, cv, base, sum(1 for ps in pts if ps.chosen), len(pts),
                      n_cr, n_c, problems)


def load_profile(path: str | Path) -> GPU:
    """A profile written by :meth:`Calibration.save` (any profile JSON)."""
    return get_gpu(str(path))


def to_json(cv: Sequence[CVResult]) -> str:
    """The leave-one-out results as JSON (for inspection)."""
    return json.dumps([dataclasses.asdict(r) | {"error": r.error} for r in cv], indent=2)
