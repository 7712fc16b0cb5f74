"""The model judged out of sample: fitted on one GPU's benchmark results, judged on another's.

Every configuration the autotuner timed is on record with its measurement
(``napkin.tune.candidates``); :mod:`napkin.bench.calibration` resolves each back to its schedule
and predicts it with :func:`napkin.codegen.select.predict_schedule`, the model's one prediction
path. Here, per benchmark family (attention, matmul, mlp, rowwise) and per GPU judged:

* **datasheet**: the GPU's built-in profile, nothing fitted and nothing measured;
* **fitted on A, judged on B** (for every other GPU A): the per-code-generation-family factors
  (:func:`napkin.bench.calibration.fit`) fitted on A's records only, applied without refitting to
  B's own base profile (:func:`napkin.bench.calibration.base_profile`: B's datasheet with B's
  measured copy rate as its HBM bandwidth, a measurement of the device rather than a fit to the
  benchmark results); both ways;
* **in-sample** (fitted and judged on B): for reference only, never a check.

Each is scored against :data:`TARGETS`:

* median and 90th percentile (linear interpolation) of |pred − meas| / meas over every measured
  configuration (all candidates the autotuner timed, not only the winner);
* Spearman rank correlation of predicted against measured time over the configurations of ONE
  point, the median over points (points with fewer than two measured configurations, or whose
  predictions or measurements are all equal, are left out and counted); the pooled correlation
  (each point's times divided by their median, as in the per-GPU report) is shown beside it;
* the model's first choice among the measured configurations (lowest prediction; ties go to the
  family's order of preference) within 5 % of the measured best, as a fraction of points. Only
  the configurations the autotuner timed can be judged; ``favourite measured`` counts the points
  where the model's favourite among ALL the family's candidates is one of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..perfmodel.hardware import GPU
from .autotune import schedule_id, spearman
from .calibration import Calibration, ModelCheck, PointSamples, predict_sample, predict_schedule_seconds

__all__ = [
    "BENCH_FAMILIES",
    "FIRST_CHOICE_TOLERANCE",
    "TARGETS",
    "FamilyScore",
    "OutOfSample",
    "gpu_label",
    "out_of_sample",
    "score_family",
    "markdown_section",
]

#: The benchmark families scored, in report order.
BENCH_FAMILIES = ("attention", "matmul", "mlp", "rowwise")

#: The targets of the model-accuracy issue: metric -> (comparison, threshold).
TARGETS = {
    "median": ("<=", 0.15),
    "p90": ("<=", 0.30),
    "spearman": (">=", 0.8),
    "first_choice": (">=", 0.90),
}

#: The model's first choice counts when its measured time is within this fraction of the best.
FIRST_CHOICE_TOLERANCE = 0.05


def gpu_label(device: Mapping | None, fallback: str = "GPU") -> str:
    """A short name for a results folder's GPU: its profile key in capitals (``H100``)."""
    key = (device or {}).get("gpu_key")
    return str(key).upper() if key else str((device or {}).get("name") or fallback)


@dataclass(frozen=True)
class FamilyScore:
    """One benchmark family on one judged GPU under one setting."""

    family: str                    # benchmark family (attention, matmul, mlp, rowwise)
    target: str                    # the GPU judged
    setting: str                   # "datasheet", "out-of-sample" or "in-sample"
    source: str | None             # the GPU the factors were fitted on (None: datasheet)
    n_configs: int = 0
    n_points: int = 0
    median: float | None = None
    p90: float | None = None
    spearman_median: float | None = None
    spearman_pooled: float | None = None
    n_rank_points: int = 0         # points the per-point Spearman is over
    n_rank_skipped: int = 0        # points left out (under two configurations, or ties everywhere)
    first_choice: float | None = None
    n_choice_points: int = 0
    n_favourite_measured: int = 0  # points whose favourite among all candidates was measured
    n_favourite_known: int = 0

    @property
    def label(self) -> str:
        if self.setting == "datasheet":
            return f"{self.target} datasheet"
        if self.setting == "in-sample":
            return f"{self.target} in-sample (reference)"
        return f"{self.source} → {self.target}"

    def value(self, metric: str) -> float | None:
        return {"median": self.median, "p90": self.p90, "spearman": self.spearman_median,
                "first_choice": self.first_choice}[metric]

    def passes(self, metric: str) -> bool | None:
        v = self.value(metric)
        if v is None:
            return None
        op, t = TARGETS[metric]
        return v <= t if op == "<=" else v >= t

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["label"] = self.label
        d["pass"] = {m: self.passes(m) for m in TARGETS}
        return d


def _pick_first(samples, preds):
    """The model's first choice: lowest prediction; ties go to the family's order, then the recorded rank."""
    big = 1 << 30
    return min(range(len(samples)), key=lambda i: (preds[i], samples[i].order if samples[i].order is not None
                                                     else big, samples[i].rank if samples[i].rank is not None else big))


def _favourite_measured(ps: PointSamples, profile: GPU, measured_ids: set[str]) -> bool | None:
    """Whether the model's favourite among every candidate the family proposes was measured."""
    if not ps.family_candidates or ps.diagram is None:
        return None
    best, best_t = None, math.inf
    for s in ps.family_candidates:  # in the family's order: strict < keeps the first of equals
        try:
            t = predict_schedule_seconds(ps.diagram, ps.codegen_family, s, profile)
        except Exception:  # noqa: BLE001 - a candidate the model refuses is not the favourite
            continue
        if t < best_t:
            best, best_t = s, t
    if best is None:
        return None
    return schedule_id(best) in measured_ids


def score_family(points: Sequence[PointSamples], profile: GPU, family: str, *, target: str, setting: str,
                 source: str | None = None, favourites: bool = True) -> FamilyScore:
    """Score the benchmark ``family``'s measured configurations among ``points`` predicted on
    ``profile`` (its calibrated fractions, if any, apply per code-generation family)."""
    errs: list[float] = []
    rhos: list[float] = []
    pooled_p: list[float] = []
    pooled_m: list[float] = []
    skipped = 0
    hits: list[bool] = []
    fav_known = fav_measured = 0
    n_points = 0
    for ps in points:
        if str(ps.record.get("family")) != family:
            continue
        samples = ps.measured()
        if not samples:
            continue
        n_points += 1
        preds = [predict_sample(s, profile) for s in samples]
        meas = [s.meas_s for s in samples]
        errs += [abs(p - m) / m for p, m in zip(preds, meas)]
        if len(samples) < 2:
            skipped += 1
            continue
        rho = spearman(preds, meas)
        if math.isfinite(rho):
            rhos.append(rho)
        else:
            skipped += 1
        pm, mm = statistics.median(preds), statistics.median(meas)
        pooled_p += [p / pm for p in preds]
        pooled_m += [m / mm for m in meas]
        first = _pick_first(samples, preds)
        hits.append(meas[first] <= (1 + FIRST_CHOICE_TOLERANCE) * min(meas))
        if favourites:
            fm = _favourite_measured(ps, profile, {schedule_id(s.schedule) for s in samples})
            if fm is not None:
                fav_known += 1
                fav_measured += int(fm)
    pooled = spearman(pooled_p, pooled_m) if len(pooled_p) >= 2 else math.nan
    return FamilyScore(
        family, target, setting, source, n_configs=len(errs), n_points=n_points,
        median=float(np.median(errs)) if errs else None,
        p90=float(np.percentile(errs, 90)) if errs else None,
        spearman_median=float(statistics.median(rhos)) if rhos else None,
        spearman_pooled=pooled if math.isfinite(pooled) else None,
        n_rank_points=len(rhos), n_rank_skipped=skipped,
        first_choice=(sum(hits) / len(hits)) if hits else None, n_choice_points=len(hits),
        n_favourite_measured=fav_measured, n_favourite_known=fav_known)


@dataclass
class OutOfSample:
    """Every score, the factors each GPU's records gave, and what could not be evaluated."""

    gpus: list[str]
    scores: list[FamilyScore]
    factors: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)   # source -> family -> fractions
    n_fit: dict[str, dict[str, int]] = field(default_factory=dict)                 # source -> family -> configs
    base_notes: dict[str, str] = field(default_factory=dict)                       # GPU -> its base profile's HBM
    assumptions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def rows(self, target: str | None = None) -> list[FamilyScore]:
        order = {"datasheet": 0, "out-of-sample": 1, "in-sample": 2}
        rows = [s for s in self.scores if target is None or s.target == target]
        fams = {f: i for i, f in enumerate(BENCH_FAMILIES)}
        return sorted(rows, key=lambda s: (fams.get(s.family, 99), s.target, order.get(s.setting, 9), s.source or ""))

    def checks(self) -> list[FamilyScore]:
        """The rows that are checks (datasheet and out-of-sample; not in-sample)."""
        return [s for s in self.rows() if s.setting != "in-sample"]

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "targets": {k: list(v) for k, v in TARGETS.items()},
                "scores": [s.to_dict() for s in self.rows()], "factors": self.factors, "n_fit": self.n_fit,
                "problems": self.problems}


def _assumptions(profiles: Mapping[str, GPU]) -> list[str]:
    """The model's fixed (hand-chosen, not fitted) switches, read from the code that applies them."""
    out = []
    fracs = {label: getattr(g, "mma_sync_fraction", None) for label, g in profiles.items()}
    fracs = {k: v for k, v in fracs.items() if v is not None}
    if fracs:
        same = len({round(v, 6) for v in fracs.values()}) == 1
        where = ("every GPU: " + f"{next(iter(fracs.values())):.3f}" if same
                 else ", ".join(f"{k} {v:.3f}" for k, v in fracs.items()))
        out.append(f"`mma_sync_fraction` of the tensor rate for kernels issuing mma.sync ({where}; a profile field)")
    try:
        from ..codegen.select import FAMILY_EXECUTION
    except ImportError:  # the code that applies them moved: say nothing rather than guess
        FAMILY_EXECUTION = {}
    for fam, facts in dict(FAMILY_EXECUTION).items():
        said = [f"{k}={v}" for k, v in dict(facts).items()]
        if said:
            out.append(f"{fam} kernels: " + ", ".join(said) + " (the family's execution facts)")
    return out


def out_of_sample(checks: Mapping[str, ModelCheck], *, in_sample: bool = True, favourites: bool = True) -> OutOfSample:
    """Score every GPU's records (``checks``: GPU label -> :class:`~napkin.bench.calibration.ModelCheck`
    from :func:`napkin.bench.calibration.evaluate`, which resolved the records and fitted the
    factors on that GPU alone) on its datasheet profile, with each other GPU's factors on its own
    base profile, and (``in_sample``) with its own factors."""
    labels = list(checks)
    scores: list[FamilyScore] = []
    factors: dict[str, dict[str, dict[str, float]]] = {}
    n_fit: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for label, chk in checks.items():
        cal: Calibration | None = chk.calibration
        factors[label] = {f: dict(v) for f, v in (cal.factors if cal is not None else {}).items()}
        n_fit[label] = dict(cal.n_points) if cal is not None else {}
        problems += [f"{label}: {p}" for p in chk.problems]
    for b in labels:
        chk_b = checks[b]
        pts = chk_b.samples
        fams = [f for f in BENCH_FAMILIES if any(str(ps.record.get("family")) == f for ps in pts)]
        settings: list[tuple[str, str | None, GPU]] = []
        if chk_b.datasheet is not None:
            settings.append(("datasheet", None, chk_b.datasheet))
        for a in labels:
            if a == b:
                continue
            cal_a = checks[a].calibration
            if cal_a is None:
                problems.append(f"{a} → {b}: no factor could be fitted on {a}")
                continue
            settings.append(("out-of-sample", a, cal_a.transfer(chk_b.profile)))
        if in_sample and chk_b.calibration is not None:
            settings.append(("in-sample", b, chk_b.calibration.transfer(chk_b.profile)))
        for setting, source, profile in settings:
            for fam in fams:
                scores.append(score_family(pts, profile, fam, target=b, setting=setting, source=source,
                                           favourites=favourites))
    base_notes = {lab: f"{chk.profile.hbm_bandwidth / 1e12:.2f} TB/s" for lab, chk in checks.items()}
    assumptions = _assumptions({lab: chk.profile for lab, chk in checks.items()})
    return OutOfSample(labels, scores, factors, n_fit, base_notes, assumptions, problems)


# ----------------------------------------------------------------------------- markdown


def _pct(x) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def _cell(s: FamilyScore, metric: str, text: str) -> str:
    ok = s.passes(metric)
    if ok is None:
        return f"{text} n/a"
    if s.setting == "in-sample":
        return text  # a reference, not a check
    return f"{text} **PASS**" if ok else f"{text} MISS"


def _table(rows: Sequence[FamilyScore]) -> list[str]:
    L = ["| family | fitted on → judged on | configs (points) | median \\|pred − meas\\|/meas (≤ 15%) | "
         "90th percentile (≤ 30%) | Spearman per point, median (≥ 0.8) | pooled Spearman | "
         "first choice within 5% of best (≥ 90%) | favourite measured |",
         "|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        rho = "—" if s.spearman_median is None else f"{s.spearman_median:.2f}"
        rho += f" ({s.n_rank_points} pts)" if s.n_rank_points else ""
        pooled = "—" if s.spearman_pooled is None else f"{s.spearman_pooled:.2f}"
        fc = "—" if s.first_choice is None else f"{s.first_choice * 100:.0f}% ({s.n_choice_points} pts)"
        fav = f"{s.n_favourite_measured} of {s.n_favourite_known}" if s.n_favourite_known else "—"
        L.append(f"| {s.family} | {s.label} | {s.n_configs} ({s.n_points}) | {_cell(s, 'median', _pct(s.median))} | "
                 f"{_cell(s, 'p90', _pct(s.p90))} | {_cell(s, 'spearman', rho)} | {pooled} | "
                 f"{_cell(s, 'first_choice', fc)} | {fav} |")
    return L


def _tally(rows: Sequence[FamilyScore]) -> str:
    n = ok = 0
    for s in rows:
        if s.setting == "in-sample":
            continue
        for m in TARGETS:
            p = s.passes(m)
            if p is not None:
                n += 1
                ok += int(p)
    return f"{ok} of {n} target checks pass"


def markdown_section(oos: OutOfSample, target: str | None = None, *, heading: str = "##") -> list[str]:
    """The "Model error out of sample" section: every GPU (``target`` None) or the rows judged on
    ``target``, the fitted factors, the fixed assumptions, and how each number is computed."""
    rows = oos.rows(target)
    L = [f"{heading} Model error out of sample", ""]
    L.append("Every configuration the autotuner timed (all candidates, not only the winner), predicted by the model as "
             "it is now through `napkin.codegen.select.predict_schedule` (the number `napkin cost`, `derive` and the "
             "autotuner give). *datasheet*: the GPU's built-in profile, nothing fitted or measured. *A → B*: one "
             "efficiency factor per code-generation family fitted on GPU A's records only "
             "(`napkin.bench.calibration.fit`: the median over A's measured configurations of the factor that meets "
             "each one's time), applied without refitting to B's own base profile (B's datasheet with B's measured "
             "copy rate as HBM bandwidth: " + ", ".join(f"{k} {v}" for k, v in oos.base_notes.items()) + "). "
             "*in-sample*: fitted and judged on the same GPU, for reference only (no PASS/MISS). "
             "Spearman per point: the rank correlation over one point's measured configurations, the median over "
             "points; pooled: all configurations of the family, each point's times divided by their median. First "
             "choice: the configuration the model predicts fastest among those measured (ties: the family's order), "
             "within 5% of the measured best; *favourite measured*: points where the model's favourite among all "
             "the family's candidates was among those the autotuner timed. Generated by "
             "`python3 benchmarks/run_all.py --report-only --out benchmarks/results` "
             "(`napkin.bench.outofsample`).")
    L.append("")
    L += _table(rows)
    L.append("")
    L.append(f"{_tally(rows)} (datasheet and out-of-sample rows; 4 targets per row).")
    L.append("")
    fitted = [(src, fam, fr, oos.n_fit.get(src, {}).get(fam, 0)) for src, by in oos.factors.items()
              for fam, fr in sorted(by.items())]
    if fitted:
        L.append("Fitted (one factor per code-generation family and GPU; it multiplies the listed efficiency fractions "
                 "of the profile; > 1: the model was pessimistic). Nothing else is fitted to the benchmark results:")
        L.append("")
        L.append("| fitted on | code-generation family | multiplies | factor | configurations |")
        L.append("|---|---|---|---|---|")
        for src, fam, fr, n in fitted:
            vals = sorted(set(round(v, 6) for v in fr.values()))
            val = ", ".join(f"{v:.3f}" for v in vals)
            L.append(f"| {src} | {fam} | {', '.join(fr)} | {val} | {n} |")
        L.append("")
    if oos.assumptions:
        L.append("Fixed, not fitted (chosen by hand while looking at H200 measurements, so the H200 rows are not a clean "
                 "out-of-sample check of them; the H100 rows are):")
        L.append("")
        L += [f"- {a}" for a in oos.assumptions]
        L.append("")
    if oos.problems:
        L.append(f"Not evaluated ({len(oos.problems)}): " + "; ".join(oos.problems[:10])
                 + (" …" if len(oos.problems) > 10 else ""))
        L.append("")
    return L


MARK_START = "<!-- napkin:outofsample:start (generated by benchmarks/run_all.py --report-only; do not edit) -->"
MARK_END = "<!-- napkin:outofsample:end -->"


def write_section(path: str | Path, lines: Sequence[str]) -> Path:
    """Put ``lines`` between :data:`MARK_START` and :data:`MARK_END` in the Markdown file ``path``
    (replacing what was there; appended with the markers when absent; the rest of the file is
    kept)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = MARK_START + "\n\n" + "\n".join(lines).rstrip() + "\n\n" + MARK_END
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        _, tail = rest.split(MARK_END, 1)
        text = head + block + tail
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block + "\n"
    path.write_text(text, encoding="utf-8")
    return path
