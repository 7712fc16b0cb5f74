"""Calibrating the performance model on benchmark records, and judging it honestly.

Fitting factors to measurements is the benchmark's business, so it lives here, in
:mod:`napkin.bench`; the model itself (:mod:`napkin.perfmodel`) imports neither code generation
nor the benchmarks.

The benchmark suite (:mod:`napkin.bench.suite`) records, per point, napkin's measured time
(``napkin_s``), the schedule it ran (``napkin.schedule``, ``napkin.schedule_id``) and every
configuration the autotuner measured (``napkin.tune.candidates``: ``desc``, ``id``, ``pred_s``,
``meas_s``). This module works offline on those records:

* :func:`re_predict` recomputes every prediction with the model as it is now: each schedule
  description is parsed back into a :class:`~napkin.perfmodel.schedule.Schedule` on the point's
  bound diagram (:func:`parse_description`; the family's own candidate with the recorded id
  supplies what an old description leaves out, such as pipeline stages: :func:`schedule_of`,
  which also resolves the ids and descriptions recorded before kernels had typed options through
  :func:`napkin.bench.autotune.legacy_schedule_id`), then predicted by
  :func:`napkin.codegen.select.predict_schedule` itself, the number ``napkin cost``, ``derive``
  and the autotuner give.
* :func:`fit` fits ONE efficiency factor per code-generation family (:data:`FAMILY_FACTORS`):
  the achieved fraction of the tensor path (contraction, attention: multiplies
  ``Efficiency.tensor`` and the other fractions listed, on top of the profile's
  ``mma_sync_fraction``) or of the copy rate (rowwise: multiplies ``Efficiency.hbm`` against the
  measured copy rate). For every measured configuration the factor that makes the model meet its
  measured time is found (the prediction falls as the factor grows; bisection; a time the factor
  cannot reach within :data:`FACTOR_RANGE` counts at the bound), and the family's factor is the
  MEDIAN over every configuration the autotuner measured in the family (napkin's chosen kernel
  alone where a record has no candidates): robust to a few odd configurations.
* :func:`cross_validated_errors` predicts every point with the factor fitted on the OTHER points
  of its family only (leave-one-point-out); :mod:`napkin.bench.outofsample` fits on one GPU and
  judges on another.
* :meth:`Calibration.to_profile` / :meth:`Calibration.save` write a GPU profile (the measured
  copy rate as HBM bandwidth, the factors in ``efficiency``) that
  :func:`napkin.perfmodel.hardware.get_gpu` loads; codegen's predictions of a family's kernels
  then apply its factor. :meth:`Calibration.transfer` puts the factors on another GPU's profile.

Nothing here fits anything per point: one number per family.
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
from ..perfmodel.hardware import GPU, get_gpu
from ..perfmodel.roofline import Efficiency
from ..perfmodel.schedule import Kernel, KernelOptions, Relabel, Schedule
from .autotune import describe_schedule, legacy_description, legacy_schedule_id, schedule_id

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
    "sample_factors",
    "schedule_of",
    "with_factors",
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

_KERNEL_RE = re.compile(r"^\s*([^\[\];()]+?)\s*\[([^\[\]]*)\]\s*(?:\(([^()]*)\))?\s*$")
_RELABEL_RE = re.compile(r"^\s*([A-Za-z_][\w']*)\s*(?:→|->)\s*([A-Za-z])_[\w']*\s*=\s*(\d+)\s*@\s*([A-Za-z0-9]+)\s*$")
_OPTION_RE = re.compile(r"^\s*([a-z_]+)\s*=\s*([A-Za-z0-9_.\-]+)\s*$")


def _split_kernels(desc: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in desc:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def _parse_options(text: str | None, desc: str) -> tuple[str | None, KernelOptions]:
    """``"family=attention, engine=mma.sync, stages=2"`` -> (family, KernelOptions)."""
    family, opts = None, {}
    for item in [x for x in (text or "").split(",") if x.strip()]:
        m = _OPTION_RE.match(item)
        if not m:
            raise CalibrationError(f"cannot read kernel option {item.strip()!r} of {desc!r} (want 'name=value')")
        k, v = m.group(1), m.group(2)
        if k == "family":
            family = v
        else:
            try:
                opts[k] = KernelOptions.value_of(k, v)
            except ScheduleError as e:
                raise CalibrationError(f"description {desc!r}: {e}") from None
    try:
        return family, KernelOptions.from_dict(opts)
    except ScheduleError as e:
        raise CalibrationError(f"description {desc!r}: {e}") from None


def parse_description(diagram, desc: str, dtype: str | None = None, gpu: str | None = None) -> Schedule:
    """The Schedule a one-line description (:func:`napkin.bench.autotune.describe_schedule`)
    stands for, on ``diagram``: ``"fused[q → g_q=128@SMEM, q → w_q=32@RF, x → s_x=32@SMEM]"``,
    optionally followed by the kernel's family and typed options,
    ``"(family=attention, engine=mma.sync, stages=2)"``; kernels are separated by ``"; "``. One
    kernel runs every box; several kernels are matched by name to the kernels of
    :meth:`Schedule.unfused`. The symbol's letter gives the kind (g, w: group; s, t: stream).
    Descriptions recorded before kernels had typed options carry no options (nor the notes that
    then held them).
    """
    parts = _split_kernels(str(desc))
    if not parts:
        raise CalibrationError(f"empty schedule description {desc!r}")
    parsed = []
    for part in parts:
        m = _KERNEL_RE.match(part)
        if not m:
            raise CalibrationError(f"cannot read kernel {part.strip()!r} of {desc!r} (want name[relabels](options))")
        name, body = m.group(1), m.group(2).strip()
        family, options = _parse_options(m.group(3), desc)
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
        if family is None and options.to_dict():
            family = name  # the kernel is named after its family (describe_schedule leaves it out then)
        parsed.append((name, tuple(rels), family, options))
    boxes_all = tuple(diagram.name_of(v) for v in diagram.nodes)
    dt = dtype or (sorted(diagram.dtypes)[0] if len(diagram.dtypes) == 1 else "bf16")
    try:
        if len(parsed) == 1:
            name, rels, family, options = parsed[0]
            kernels = (Kernel(name, boxes_all, rels, family=family, options=options),)
        else:
            unfused = {k.name: k for k in Schedule.unfused(diagram).kernels}
            missing = [n for n, *_ in parsed if n not in unfused]
            if missing:
                raise CalibrationError(f"description {desc!r} names kernel(s) {missing} that the unfused schedule "
                                       f"of {diagram.name!r} does not have ({', '.join(unfused)})")
            kernels = tuple(Kernel(n, unfused[n].boxes, rels, family=f, options=o) for n, rels, f, o in parsed)
        return Schedule(diagram, kernels, gpu, dt)
    except ScheduleError as e:
        raise CalibrationError(f"description {desc!r}: {e}") from None


def _family_candidates(diagram, family, gpu, dtype) -> list[Schedule]:
    try:
        return list(family.candidates(diagram, gpu, dtype))
    except Exception:  # noqa: BLE001 - a family that proposes nothing here: parse alone
        return []


def _describes(s: Schedule, want: str) -> bool:
    return want in (describe_schedule(s), legacy_description(s))


def schedule_of(diagram, family, desc: str, sid: str | None, gpu, dtype: str,
                candidates: Sequence[Schedule] | None = None) -> tuple[Schedule, str]:
    """The schedule a record names, and how it was found: ``"id"`` (the family's candidate whose
    id matches the record's, and whose description parses to the same relabellings), ``"desc"``
    (the one candidate the description stands for, else the description parsed alone).

    Records written before kernels had typed options keep resolving: a candidate matches an id
    when it is its :func:`~napkin.bench.autotune.schedule_id` or its
    :func:`~napkin.bench.autotune.legacy_schedule_id` (the options turned back into the notes the
    families wrote then), and a description when it is its
    :func:`~napkin.bench.autotune.describe_schedule` or its
    :func:`~napkin.bench.autotune.legacy_description`."""
    parsed = parse_description(diagram, desc, dtype, getattr(gpu, "key", None))
    cands = list(candidates) if candidates is not None else _family_candidates(diagram, family, gpu, dtype)
    want = describe_schedule(parsed)
    if sid:
        for s in cands:
            if sid in (schedule_id(s), legacy_schedule_id(s)):
                if not _describes(s, want):
                    raise CalibrationError(f"schedule id {sid} is {describe_schedule(s)!r}, not {desc!r}")
                return s, "id"
    same = [s for s in cands if _describes(s, want)]
    if len(same) > 1 and len({schedule_id(s) for s in same}) > 1:
        raise CalibrationError(f"{desc!r} stands for {len(same)} of the family's schedules (they differ only in "
                               "options or notes) and no id matches")
    return (same[0], "desc") if same else (parsed, "desc")


# ----------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """One measured run the model can predict again: a schedule on its bound diagram, with the
    code-generation family that builds it."""

    point_id: str
    bench_family: str
    family: str                      # code-generation family (the calibration key)
    desc: str
    meas_s: float | None
    diagram: Any = field(repr=False, compare=False)
    schedule: Any = field(repr=False, compare=False)
    how: str = "id"                  # "id" or "desc"
    codegen_family: Any = field(default=None, repr=False, compare=False)   # the family object
    rank: int | None = None          # the recorded autotuner rank (None: the chosen kernel)
    order: int | None = None         # position among the family's candidates (the ranking's tie-break)


@dataclass
class PointSamples:
    """A benchmark record with its chosen kernel and its measured candidates as Samples."""

    record: dict
    family: str | None = None
    chosen: Sample | None = None
    candidates: list = field(default_factory=list)   # (candidate dict, Sample | None, problem | None)
    problem: str | None = None
    diagram: Any = field(default=None, repr=False)    # the bound diagram
    codegen_family: Any = field(default=None, repr=False)
    family_candidates: list = field(default_factory=list, repr=False)   # every schedule the family proposes

    def measured(self) -> list[Sample]:
        """The Samples of the autotuner's measured configurations, else the chosen kernel's."""
        out = [s for _, s, _ in self.candidates if s is not None and s.meas_s]
        if not out and self.chosen is not None and self.chosen.meas_s:
            out = [self.chosen]
        return out


def _codegen_family(bound):
    from ..codegen import families
    from .autotune import _codegen_family as fam_of

    name = fam_of(bound)
    return families.get(name)


def _bound_diagram(rec: Mapping):
    from ..diagrams import library
    from .autotune import _prepare

    name, sizes, dtype = rec.get("diagram"), rec.get("sizes") or {}, rec.get("dtype") or "bf16"
    if not name or name not in library.names():
        raise CalibrationError(f"record {rec.get('id')!r}: unknown diagram {name!r}")
    return _prepare(library.get(name), dict(sizes), dtype)


def _index_of(schedule, cands) -> int | None:
    for i, c in enumerate(cands):
        if c is schedule:
            return i
    return None


def _sample(point_id, bench_family, fam, bound, schedule, how, desc, meas, gpu, *, rank=None, order=None) -> Sample:
    s = Sample(point_id, bench_family, fam.name, desc, meas, bound, schedule, how, fam, rank, order)
    seconds = predict_sample(s, gpu)  # fails here, with the model's reason, if it cannot be predicted
    if not (seconds > 0 and math.isfinite(seconds)):
        raise CalibrationError(f"the model predicts {seconds!r} s for {desc!r}")
    return s


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 else None


def prepare_records(records: Iterable[Mapping], gpu: GPU | str) -> list[PointSamples]:
    """Every record with its chosen schedule and measured candidates resolved on ``gpu`` (the
    family's candidates are proposed for it; rates may change later). A record or a candidate
    that cannot be re-predicted keeps its reason in ``problem``."""
    g = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    out = []
    for rec in records:
        if len((rec.get("napkin") or {}).get("kernels") or []) > 1:
            # the calibration fits one family's factor on one kernel's configurations: a plan of
            # several kernels is not a sample of any family (its prediction is its plan's sum, shown
            # beside its measurement in the report's All results)
            continue
        ps = PointSamples(rec)
        out.append(ps)
        pid, bfam = str(rec.get("id", "?")), str(rec.get("family", "?"))
        try:
            bound = _bound_diagram(rec)
            fam = _codegen_family(bound)
        except Exception as e:  # noqa: BLE001
            ps.problem = f"{type(e).__name__}: {e}"
            continue
        ps.family, ps.diagram, ps.codegen_family = fam.name, bound, fam
        dtype = rec.get("dtype") or "bf16"
        cands = _family_candidates(bound, fam, g, dtype)
        ps.family_candidates = cands
        nap = rec.get("napkin") or {}
        desc, sid = nap.get("schedule"), nap.get("schedule_id")
        if desc:
            try:
                s, how = schedule_of(bound, fam, desc, sid, g, dtype, cands)
                ps.chosen = _sample(pid, bfam, fam, bound, s, how, desc, _num(rec.get("napkin_s")), g,
                                    order=_index_of(s, cands))
            except Exception as e:  # noqa: BLE001
                ps.problem = f"chosen schedule: {type(e).__name__}: {e}"
        else:
            ps.problem = "the record names no schedule (napkin.schedule)"
        for i, c in enumerate((nap.get("tune") or {}).get("candidates") or []):
            if not isinstance(c, dict):
                continue
            if not c.get("desc"):
                ps.candidates.append((c, None, "no description"))
                continue
            try:
                s, how = schedule_of(bound, fam, c["desc"], c.get("id"), g, dtype, cands)
                rank = c.get("rank") if isinstance(c.get("rank"), int) else i
                ps.candidates.append((c, _sample(pid, bfam, fam, bound, s, how, c["desc"], _num(c.get("meas_s")), g,
                                                 rank=rank, order=_index_of(s, cands)), None))
            except Exception as e:  # noqa: BLE001
                ps.candidates.append((c, None, f"{type(e).__name__}: {e}"))
    return out


def with_factors(gpu: GPU, factors: Mapping[str, Mapping[str, float]]) -> GPU:
    """``gpu`` with ``factors`` (family -> {fraction: value}) as its calibrated efficiency, and
    nothing else calibrated."""
    return dataclasses.replace(gpu, efficiency={str(f): {str(k): float(v) for k, v in fr.items()}
                                                for f, fr in factors.items()})


def predict_schedule_seconds(diagram, family, schedule, gpu: GPU) -> float:
    """Seconds :func:`napkin.codegen.select.predict_schedule` predicts: the one prediction path
    (the number ``napkin cost``, ``derive`` and the autotuner give), with ``gpu``'s calibrated
    fractions for the family applied as codegen applies them."""
    from ..codegen.select import predict_schedule

    return float(predict_schedule(diagram, family, schedule, gpu).seconds)


def predict_sample(sample: Sample, gpu: GPU, factors: Mapping[str, float] | None = None) -> float:
    """Seconds the model predicts for ``sample`` on ``gpu``: with ``factors`` (fraction name ->
    value) as its family's efficiency (and no other calibrated fraction), else with the profile's
    calibrated fractions for its family (none on a datasheet profile). Always through
    :func:`napkin.codegen.select.predict_schedule`."""
    g = gpu if factors is None else with_factors(gpu, {sample.family: factors})
    fam = sample.codegen_family if sample.codegen_family is not None else sample.family
    return predict_schedule_seconds(sample.diagram, fam, sample.schedule, g)


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
        meas["gemm_bf16_cublas"] = gemm  # reference only: napkin's kernels issue mma.sync or wgmma
    if meas:
        ov["measured"] = meas
    return g.with_overrides(**ov) if ov else g


def factor_names(family: str) -> tuple[str, ...]:
    """The Efficiency fractions the factor of ``family`` multiplies (:data:`FAMILY_FACTORS`)."""
    return tuple(FAMILY_FACTORS.get(family, ("hbm",)))


def factor_dict(family: str, value: float) -> dict[str, float]:
    """``{fraction: value}`` for every fraction the family's factor multiplies."""
    return {k: float(value) for k in factor_names(family)}


#: Bisection stops when the bracket's ratio is below 1 + this.
FACTOR_TOLERANCE = 1e-7


def point_factor(sample: Sample, gpu: GPU) -> float | None:
    """The factor (multiplying the family's fractions, :func:`factor_names`) at which the model
    predicts this sample's measured time: bisection in log space over :data:`FACTOR_RANGE` (the
    prediction does not rise as the factor grows). A time the model cannot reach gives the
    range's bound; no measurement: None."""
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
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if pred(mid) > t:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + FACTOR_TOLERANCE:
            break
    return hi


@dataclass(frozen=True)
class Calibration:
    """Per-family factors fitted on benchmark records, relative to ``gpu`` (:func:`base_profile`)."""

    gpu: GPU = field(repr=False)
    factors: dict[str, dict[str, float]]            # family -> {fraction name: value}
    n_points: dict[str, int]                        # family -> configurations the median is over
    per_point: dict[str, float] = field(default_factory=dict)   # point id -> its chosen kernel's own factor
    source: str = ""

    def efficiency(self, family: str, base: Efficiency = Efficiency()) -> Efficiency:
        """``base`` times the family's factors."""
        f = self.factors.get(family)
        return base.scaled(f) if f else base

    def transfer(self, base: GPU) -> GPU:
        """Another GPU's profile (its :func:`base_profile`) with THESE factors as its efficiency:
        the factors fitted here judged there, without refitting."""
        return with_factors(base, self.factors)

    def to_profile(self, note: str | None = None) -> GPU:
        """The base profile with the factors as its ``efficiency`` and their provenance in its notes."""
        parts = [f"{fam}: {k} x {v:.3f} (median of {self.n_points.get(fam, 0)} configurations)"
                 for fam, fr in sorted(self.factors.items()) for k, v in fr.items()]
        text = ("calibrated per-family efficiency (napkin.bench.calibration.fit): "
                + ("; ".join(parts) if parts else "none")
                + ". Each factor is the median over the family's measured configurations of the factor that makes "
                  "the model meet the measured time; judge it out of sample (another GPU, or leave-one-out), not "
                  "in-sample"
                + (f". Records: {self.source}" if self.source else "") + (f". {note}" if note else "") + ".")
        g = with_factors(self.gpu, self.factors)
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


def sample_factors(points: Sequence[PointSamples], gpu: GPU) -> dict[int, float | None]:
    """``id(sample) -> its own factor`` (:func:`point_factor`) for every measured sample of
    ``points`` (candidates and chosen kernels), on ``gpu``."""
    out: dict[int, float | None] = {}
    for ps in points:
        for s in [*ps.measured(), *([ps.chosen] if ps.chosen is not None else [])]:
            if id(s) not in out and s.meas_s:
                out[id(s)] = point_factor(s, gpu)
    return out


def _fit_from_samples(points: Sequence[PointSamples], gpu: GPU, source: str = "", *,
                      own: Mapping[int, float | None] | None = None) -> Calibration:
    own = dict(own) if own is not None else sample_factors(points, gpu)
    per_point: dict[str, float] = {}
    by_family: dict[str, list[float]] = {}
    for ps in points:
        for s in ps.measured():
            f = own.get(id(s)) if id(s) in own else point_factor(s, gpu)
            if f is not None:
                by_family.setdefault(s.family, []).append(f)
        if ps.chosen is not None and ps.chosen.meas_s:
            f = own.get(id(ps.chosen)) if id(ps.chosen) in own else point_factor(ps.chosen, gpu)
            if f is not None:
                per_point[ps.chosen.point_id] = f
    factors = {fam: factor_dict(fam, statistics.median(v)) for fam, v in by_family.items()}
    return Calibration(gpu, factors, {fam: len(v) for fam, v in by_family.items()}, per_point, source)


def fit(records: Iterable[Mapping], gpu: GPU | str, *, device: Mapping | None = None,
        prepared: Sequence[PointSamples] | None = None,
        own: Mapping[int, float | None] | None = None) -> Calibration:
    """One factor per code-generation family from ``records`` (the suite's point dicts): the
    median over the family's measured configurations (every candidate the autotuner measured;
    the chosen kernel where a record has none) of each one's own factor (:func:`point_factor`),
    against :func:`base_profile` (``device``: the results' device header, for the measured copy
    rate). ``own``: the samples' factors already found (:func:`sample_factors` on that base)."""
    records = list(records)
    base = base_profile(gpu, device)
    pts = prepared if prepared is not None else prepare_records(records, base)
    src = ", ".join(f"{k} {v}" for k, v in (("device", (device or {}).get("name")), ("date", (device or {}).get("date")))
                    if v)
    return _fit_from_samples(pts, base, src, own=own)


@dataclass(frozen=True)
class CVResult:
    """One point's chosen kernel predicted with the factor fitted on the other points of its family."""

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
                           prepared: Sequence[PointSamples] | None = None,
                           own: Mapping[int, float | None] | None = None) -> list[CVResult]:
    """Leave-one-point-out: every point with a measured chosen kernel, predicted with its
    family's factor fitted on the OTHER points only (the median of their measured
    configurations' own factors). A family with one point gives None."""
    records = list(records)
    if gpu is None:
        gpu = (device or {}).get("gpu_key") or next((r.get("gpu_key") for r in records if r.get("gpu_key")), None)
        if gpu is None:
            raise CalibrationError("cross_validated_errors needs a GPU profile (or a device with gpu_key)")
    base = base_profile(gpu, device)
    pts = prepared if prepared is not None else prepare_records(records, base)
    own = dict(own) if own is not None else sample_factors(pts, base)

    def factor_of(s):
        return own[id(s)] if id(s) in own else point_factor(s, base)

    fitted = [(ps, [factor_of(s) for s in ps.measured()]) for ps in pts]
    out = []
    for ps in pts:
        s = ps.chosen
        if s is None or not s.meas_s:
            continue
        others = [f for o, fs in fitted if o is not ps and o.family == s.family for f in fs if f is not None]
        mine = factor_of(s)
        if not others:
            out.append(CVResult(s.point_id, s.bench_family, s.family, s.meas_s, None, None, mine))
            continue
        f = statistics.median(others)
        pred = predict_sample(s, base, factor_dict(s.family, f))
        out.append(CVResult(s.point_id, s.bench_family, s.family, s.meas_s, pred, f, mine))
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
    """Everything the report needs: re-predicted records, the calibration, the CV errors, and
    the resolved records (``samples``) for further evaluation (:mod:`napkin.bench.outofsample`)."""

    points: list[dict]
    calibration: Calibration | None
    cv: list[CVResult]
    profile: GPU
    n_repredicted: int
    n_points: int
    n_candidates_repredicted: int
    n_candidates: int
    problems: list[str] = field(default_factory=list)
    samples: list = field(default_factory=list, repr=False)      # the PointSamples
    datasheet: GPU | None = field(default=None, repr=False)     # the profile the points were re-predicted on


def evaluate(records: Iterable[Mapping], device: Mapping | None = None, gpu: GPU | str | None = None) -> ModelCheck:
    """Re-predict ``records`` on the device's datasheet profile, fit the factors on all points
    (for the written profile) and compute the leave-one-out errors; the records are resolved
    once and every configuration's own factor is found once."""
    records = list(records)
    gpu = gpu or (device or {}).get("gpu_key")
    if not gpu:
        raise CalibrationError("the results name no GPU profile (device.gpu_key)")
    profile = get_gpu(gpu) if not isinstance(gpu, GPU) else gpu
    pts = prepare_records(records, profile)
    points = re_predict(records, profile, prepared=pts)
    base = base_profile(profile, device)
    own = sample_factors(pts, base)
    cal = fit(records, profile, device=device, prepared=pts, own=own)
    cv = cross_validated_errors(records, profile, device=device, prepared=pts, own=own)
    n_c = sum(len(ps.candidates) for ps in pts)
    n_cr = sum(1 for ps in pts for _, s, _ in ps.candidates if s is not None)
    problems = [f"{ps.record.get('id')}: {ps.problem}" for ps in pts if ps.problem]
    problems += [f"{ps.record.get('id')} candidate {c.get('desc')}: {pr}" for ps in pts for c, s, pr in ps.candidates
                 if s is None]
    return ModelCheck(points, cal if cal.factors else None, cv, base, sum(1 for ps in pts if ps.chosen), len(pts),
                      n_cr, n_c, problems, pts, profile)


def load_profile(path: str | Path) -> GPU:
    """A profile written by :meth:`Calibration.save` (any profile JSON)."""
    return get_gpu(str(path))


def to_json(cv: Sequence[CVResult]) -> str:
    """The leave-one-out results as JSON (for inspection)."""
    return json.dumps([dataclasses.asdict(r) | {"error": r.error} for r in cv], indent=2)
