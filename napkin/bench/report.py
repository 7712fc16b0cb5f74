"""Plots and ``BENCHMARKS.md`` from the suite's JSON results.

:func:`generate` reads every ``*.json`` of one GPU's results folder
(``benchmarks/results/<gpu>/``, written by :mod:`napkin.bench.suite`) and writes, next to them:

* ``plots/attention_tflops.png``: TFLOP/s against sequence length, one panel per head dim and
  mask, napkin (and the model's prediction for it) against every baseline;
* ``plots/roofline.png``: the roofline of the measured copy rate and the tensor-core peak, with
  napkin's measured and predicted points;
* ``plots/pred_vs_meas.png``: predicted against measured time, with the y = x line (napkin's
  chosen kernels and every candidate the autotuner measured);
* ``plots/rowwise_gbps.png`` and ``plots/gemm_tflops.png``: the memory-bound and GEMM families;
* ``BENCHMARKS.md``: the device (GPU, clocks, driver, torch/CUDA versions), one table per target
  (:data:`TARGETS`: the target, napkin's value, the ratio, PASS/MISS with the gap), the model's
  accuracy (median |pred − meas|/meas on the datasheet profile, the calibrated model's
  leave-one-out error, and Spearman per family) and the full results;
* ``calibrated-profile.json``: the GPU profile with one efficiency factor per code-generation
  family fitted on these results (:mod:`napkin.bench.calibration`).

Every prediction shown (tables and plots) is the model's current one: the recorded schedules are
re-predicted offline (:func:`napkin.bench.calibration.re_predict`); a point that cannot be
keeps the prediction recorded when it ran, and the report says how many did.

matplotlib is imported inside the plotting functions, with the Agg backend.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

__all__ = [
    "Target",
    "TARGETS",
    "MODEL_ERROR_TARGET",
    "SPEARMAN_TARGET",
    "SPEARMAN_MIN_CONFIGS",
    "load_results",
    "evaluate_targets",
    "model_accuracy",
    "model_check",
    "CALIBRATED_PROFILE",
    "point_label",
    "render_markdown",
    "make_plots",
    "generate",
    "generate_all",
    "verdict",
    "model_error_verdict",
]


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """napkin's rate at each selected point must reach ``factor`` × a reference rate: a baseline's
    rate at the same point (``against`` = its name) or the measured copy rate (``against="copy"``)."""

    id: str
    title: str
    family: str
    against: str
    factor: float = 1.0
    select: Callable[[dict], bool] = field(default=lambda p: True, compare=False)


#: The performance targets of the benchmarks issue (bf16; each becomes one table of BENCHMARKS.md).
TARGETS: tuple[Target, ...] = (
    Target("attention_vs_fa2", "Attention forward ≥ 1.0 × PyTorch SDPA flash backend (FlashAttention-2)",
           "attention", "sdpa_flash", 1.0),
    Target("attention_vs_cudnn", "Stretch: attention forward ≥ 0.8 × SDPA cuDNN backend", "attention",
           "sdpa_cudnn", 0.8),
    Target("attention_vs_flex", "Attention forward vs FlexAttention (compiled), for reference", "attention",
           "flex", 1.0),
    Target("matmul_vs_cublas", "GEMM 4096³ and 8192³ ≥ 0.75 × cuBLAS", "matmul", "cublas", 0.75,
           select=lambda p: p.get("diagram") == "matmul" and (p.get("labels") or {}).get("n") in (4096, 8192)
           and p.get("dtype") == "bf16"),
    Target("matmul_any_vs_cublas", "Matmuls of any shape (odd, transposed, batched, K = 256k, fp32) ≥ 0.9 × cuBLAS",
           "matmul", "cublas", 0.9),
    Target("mlp_vs_eager", "MLP (GEMM + bias + GELU fused) ≥ 1.2 × torch unfused linear + gelu", "mlp",
           "eager", 1.2),
    Target("rowwise_vs_copy", "Softmax/layernorm/rmsnorm ≥ 0.85 × the measured copy rate (GB/s)", "rowwise",
           "copy", 0.85),
    Target("rowwise_vs_eager", "Softmax/layernorm/rmsnorm ≥ 1.5 × PyTorch eager", "rowwise", "eager", 1.5),
    Target("composed_vs_eager", "Composed diagrams ≥ 1.0 × their PyTorch reference run eagerly", "composed",
           "eager", 1.0),
    Target("block_vs_eager", "transformer_block (defaults and 7B-like) ≥ 1.2 × eager", "composed", "eager", 1.2,
           select=lambda p: p.get("diagram") == "transformer_block"),
    Target("block_vs_compile", "transformer_block (defaults and 7B-like) ≥ 1.0 × torch.compile", "composed",
           "compile", 1.0, select=lambda p: p.get("diagram") == "transformer_block"),
    Target("swiglu_vs_eager", "SwiGLU ≥ 1.15 × eager", "composed", "eager", 1.15,
           select=lambda p: p.get("diagram") == "swiglu"),
    Target("composed_memory_vs_copy", "Elementwise chain and column reduction ≥ 0.9 × the measured copy rate "
           "(GB/s)", "composed", "copy", 0.9, select=lambda p: p.get("metric") == "gbps"),
)

#: The model must predict napkin's time within this median relative error, per family.
MODEL_ERROR_TARGET = 0.15
#: ... and rank configurations with at least this Spearman correlation, per family,
SPEARMAN_TARGET = 0.8
#: ... over at least this many measured configurations.
SPEARMAN_MIN_CONFIGS = 8


def verdict(ratio: float | None) -> str:
    """``PASS (+4.0%)`` when ratio ≥ 1, ``MISS (−12.5%)`` below, ``n/a`` without a ratio.

    >>> verdict(1.04), verdict(0.875), verdict(None)
    ('PASS (+4.0%)', 'MISS (−12.5%)', 'n/a')
    """
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    gap = (ratio - 1.0) * 100.0
    sign = "+" if gap >= 0 else "−"
    return f"{'PASS' if ratio >= 1.0 else 'MISS'} ({sign}{abs(gap):.1f}%)"


@dataclass
class TargetRow:
    label: str
    reference: float | None   # the target value: factor × the reference rate
    value: float | None       # napkin's rate
    ratio: float | None       # value / reference
    note: str = ""
    wrong: bool = False       # napkin's output failed the check: a MISS whatever its speed

    @property
    def verdict(self) -> str:
        if self.wrong:
            return f"MISS ({self.note})"
        v = verdict(self.ratio)
        return v if v != "n/a" else f"n/a ({self.note})" if self.note else "n/a"

    @property
    def passed(self) -> bool | None:
        if self.wrong:
            return False
        return None if self.ratio is None else self.ratio >= 1.0


@dataclass
class TargetResult:
    target: Target
    unit: str
    rows: list[TargetRow]

    @property
    def n_pass(self) -> int:
        return sum(1 for r in self.rows if r.passed)

    @property
    def n_measured(self) -> int:
        return sum(1 for r in self.rows if r.passed is not None)

    @property
    def worst(self) -> float | None:
        rs = [r.ratio for r in self.rows if r.ratio is not None]
        return min(rs) if rs else None


# ----------------------------------------------------------------------------- loading


def load_results(folder: str | Path) -> tuple[dict, list[dict]]:
    """(device, points) from every ``*.json`` in ``folder`` that has a ``points`` list."""
    folder = Path(folder)
    device: dict = {}
    points: list[dict] = []
    for f in sorted(folder.glob("*.json")):
        try:
            data = json.loads(f.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            continue
        if not device and isinstance(data.get("device"), dict):
            device = data["device"]
        points.extend(p for p in data["points"] if isinstance(p, dict))
    return device, points


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _unit(metric: str) -> str:
    return "GB/s" if metric == "gbps" else "TFLOP/s"


def point_label(p: dict) -> str:
    """A short human label: ``d128 causal seq 4096 (batch 4)``, ``8192³``, ``softmax bf16 32768 × 8192``."""
    lab = p.get("labels") or {}
    fam = p.get("family")
    s = p.get("sizes") or {}
    if fam == "attention" and lab:
        return (f"d{lab.get('d')} {'causal' if lab.get('causal') else 'non-causal'} seq {lab.get('seq')} "
                f"(batch {lab.get('batch')})")
    if fam == "matmul" and s:
        a, b, c = s.get("a"), s.get("b"), s.get("c")
        return f"{a}³" if a == b == c else f"{a}×{b}×{c}"
    if fam == "mlp" and s:
        return f"{s.get('a')} tokens, {s.get('b')}→{s.get('c')}"
    if fam == "rowwise" and s:
        return f"{p.get('diagram')} {p.get('dtype')} width {s.get('x')} × {s.get('r')} rows"
    if fam == "composed" and s:
        return f"{p.get('diagram')} {p.get('dtype')} " + " ".join(f"{k}={v}" for k, v in s.items())
    return str(p.get("id", "?"))


def _copy_gbps(device: dict, p: dict | None = None) -> float | None:
    if p is not None and _num(p.get("copy_gbps")):
        return float(p["copy_gbps"])
    cb = _num(device.get("copy_bandwidth"))
    return cb / 1e9 if cb else None


def _napkin_rate(p: dict) -> float | None:
    return _num(p.get(p.get("metric", "tflops")))


def _baseline_rate(p: dict, name: str) -> tuple[float | None, str]:
    v = (p.get("baselines") or {}).get(name)
    if v is None:
        return None, f"no {name}"
    if isinstance(v, dict):
        if "skipped" in v:
            return None, f"{name} skipped"
        return None, f"{name} failed"
    r = _num((p.get("rates") or {}).get(name))
    if r is None and _num(v):
        metric = p.get("metric", "tflops")
        if metric == "gbps" and _num(p.get("bytes")):
            r = p["bytes"] / v / 1e9
        elif _num(p.get("flops")):
            r = p["flops"] / v / 1e12
    return r, ""


def _sort_key(p: dict):
    lab = p.get("labels") or {}
    return (p.get("diagram", ""), p.get("dtype", ""), lab.get("d", 0), bool(lab.get("causal")),
            lab.get("seq", 0), lab.get("n", 0), lab.get("tokens", 0), lab.get("width", 0))


def evaluate_targets(device: dict, points: Sequence[dict], targets: Sequence[Target] = TARGETS) -> list[TargetResult]:
    """Every target over the points of its family."""
    out = []
    for t in targets:
        rows = []
        unit = "TFLOP/s"
        for p in sorted((p for p in points if p.get("family") == t.family and t.select(p)), key=_sort_key):
            unit = _unit(p.get("metric", "tflops"))
            value = _napkin_rate(p)
            if t.against == "copy":
                ref, note = _copy_gbps(device, p), "no copy rate"
            else:
                ref, note = _baseline_rate(p, t.against)
            reference = ref * t.factor if ref is not None else None
            if value is None:
                note = "napkin " + ("not run" if p.get("skipped") else "failed")
            ratio = value / reference if (value is not None and reference) else None
            chk = p.get("check") or {}
            if value is not None and chk.get("ok") is False:
                err = _num(chk.get("rel_err"))
                rows.append(TargetRow(point_label(p), reference, value, ratio,
                                      "wrong output" + (f", rel err {err:.1e}" if err is not None else ""), wrong=True))
                continue
            rows.append(TargetRow(point_label(p), reference, value, ratio, "" if ratio is not None else note))
        out.append(TargetResult(t, unit, rows))
    return out


# ----------------------------------------------------------------------------- model accuracy


def _candidates(p: dict) -> list[dict]:
    tune = ((p.get("napkin") or {}).get("tune") or {})
    return [c for c in tune.get("candidates", []) or []
            if isinstance(c, dict) and _num(c.get("pred_s")) and _num(c.get("meas_s"))]


def model_accuracy(points: Sequence[dict], cv: Sequence | None = None) -> dict[str, dict]:
    """Per family: the median and worst |pred − meas|/meas over napkin's measured points, and the
    Spearman rank correlation between predicted and measured time over every configuration the
    autotuner measured in the family. The points' ``pred_s`` are whatever they hold: the
    recorded predictions, or the model's current ones after
    :func:`napkin.bench.calibration.re_predict` (``pred_source`` says which; counted in
    ``n_repredicted``). ``cv``: :class:`~napkin.bench.calibration.CVResult` values, whose
    median error per family is ``median_err_cv`` (the calibrated model, leave-one-out).

    Configurations of different points are pooled after dividing each point's predicted and
    measured times by that point's medians, so the correlation asks whether the model orders
    configurations the way the GPU does, not whether bigger problems take longer (which any
    model gets right). Points with fewer than two measured configurations add nothing.
    """
    from .autotune import spearman

    fams: dict[str, dict] = {}
    for p in points:
        fam = p.get("family", "?")
        f = fams.setdefault(fam, {"errors": [], "cal_errors": [], "pred": [], "meas": [], "points": 0,
                                  "repredicted": 0, "cands_repredicted": 0})
        if p.get("pred_source") == "model":
            f["repredicted"] += 1
        pred, meas = _num(p.get("pred_s")), _num(p.get("napkin_s"))
        if pred is not None and meas:
            f["errors"].append(abs(pred - meas) / meas)
        cal = _num(p.get("pred_calibrated_s"))
        if cal is not None and meas:
            f["cal_errors"].append(abs(cal - meas) / meas)
        cands = _candidates(p)
        f["cands_repredicted"] += sum(1 for c in cands if c.get("pred_source") == "model")
        if len(cands) >= 2:
            pm = statistics.median(c["pred_s"] for c in cands)
            mm = statistics.median(c["meas_s"] for c in cands)
            f["pred"].extend(c["pred_s"] / pm for c in cands)
            f["meas"].extend(c["meas_s"] / mm for c in cands)
            f["points"] += 1
    cv_errs: dict[str, list[float]] = {}
    for r in cv or ():
        if r.error is not None:
            cv_errs.setdefault(r.bench_family, []).append(r.error)
    out = {}
    for fam, f in fams.items():
        errs = f["errors"]
        rho = spearman(f["pred"], f["meas"]) if len(f["pred"]) >= 2 else math.nan
        ce = cv_errs.get(fam, [])
        out[fam] = {
            "n_points": len(errs),
            "median_err": statistics.median(errs) if errs else None,
            "max_err": max(errs) if errs else None,
            "median_err_calibrated": statistics.median(f["cal_errors"]) if f["cal_errors"] else None,
            "spearman": rho if math.isfinite(rho) else None,
            "spearman_n": len(f["pred"]),
            "spearman_points": f["points"],
            "n_repredicted": f["repredicted"],
            "spearman_repredicted": f["cands_repredicted"],
            "median_err_cv": statistics.median(ce) if ce else None,
            "max_err_cv": max(ce) if ce else None,
            "n_cv": len(ce),
        }
    return out


# ----------------------------------------------------------------------------- markdown


def _f(x, digits: int = 1, unit: str = "") -> str:
    x = _num(x)
    if x is None:
        return "—"
    if abs(x) >= 100:
        s = f"{x:,.0f}"
    else:
        s = f"{x:.{digits}f}"
    return s + (f" {unit}" if unit else "")


def _ms(s) -> str:
    s = _num(s)
    return "—" if s is None else f"{s * 1e3:.3f}"


def _pct(x) -> str:
    x = _num(x)
    return "—" if x is None else f"{x * 100:.1f}%"


def _mhz(x) -> str:
    x = _num(x)
    return "—" if x is None else f"{x:.0f}"


def _device_lines(device: dict) -> list[str]:
    clocks = device.get("clocks") or {}
    mem = device.get("memory_bytes")
    l2 = device.get("l2_bytes")
    copy = _num(device.get("copy_bandwidth"))
    rows = [
        ("GPU", device.get("name", "unknown")),
        ("profile", device.get("gpu_key") or "—"),
        ("SMs / compute capability", f"{device.get('sm_count', '—')} / {device.get('capability', '—')}"),
        ("memory / L2", f"{mem / 2**30:.0f} GiB / {l2 / 2**20:.0f} MiB" if mem and l2 else "—"),
        ("SM clock (now / max)", f"{_mhz(clocks.get('sm_clock_mhz'))} / {_mhz(clocks.get('max_sm_clock_mhz'))} MHz"
         if clocks else "—"),
        ("memory clock (now / max)", f"{_mhz(clocks.get('mem_clock_mhz'))} / {_mhz(clocks.get('max_mem_clock_mhz'))} MHz"
         if clocks else "—"),
        ("driver", device.get("driver") or "—"),
        ("torch / CUDA / cuDNN / Triton", f"{device.get('torch', '—')} / {device.get('cuda_version', '—')} / "
                                          f"{device.get('cudnn', '—')} / {device.get('triton', '—')}"),
        ("measured copy rate (read + write)", f"{copy / 1e12:.2f} TB/s" if copy else "—"),
        ("date / napkin commit", f"{device.get('date', '—')} / {device.get('napkin_commit') or '—'}"),
    ]
    out = ["| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    return out


def render_markdown(device: dict, points: Sequence[dict], plots: Iterable[str] = (),
                    targets: Sequence[Target] = TARGETS, *, accuracy: dict | None = None, check=None,
                    profile_file: str | None = None, out_of_sample: Sequence[str] = ()) -> str:
    """The text of BENCHMARKS.md (``out_of_sample``: the lines of the out-of-sample section,
    :func:`napkin.bench.outofsample.markdown_section`; ``accuracy``: :func:`model_accuracy`'s result, default computed
    from the points; ``check``: the :class:`~napkin.bench.calibration.ModelCheck` the points
    were re-predicted by, for its assumptions and factors)."""
    results = evaluate_targets(device, points, targets)
    acc = accuracy if accuracy is not None else model_accuracy(points)
    L: list[str] = []
    L.append("# napkin benchmarks")
    L.append("")
    L.append("Generated by `benchmarks/run_all.py` (napkin.bench.report) from the JSON results; do not edit by hand.")
    L.append("Timing: CUDA events around each run after warm-up, the median of many runs, random inputs rotated "
             "so they exceed L2, L2 flushed between runs. FLOPs: GEMM 2·M·N·K, attention 4·B·H·N_q·N_k·d (half "
             "when causal); memory-bound ops: bytes read once + written once, against the measured copy rate. "
             "Ratio = napkin's value / the target value; PASS when ≥ 1, the gap in parentheses.")
    L.append("")
    L.append("## Device")
    L.append("")
    L += _device_lines(device)
    L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| target | PASS | measured | worst ratio |")
    L.append("|---|---|---|---|")
    for r in results:
        L.append(f"| {r.target.title} | {r.n_pass} | {r.n_measured} of {len(r.rows)} | "
                 f"{_f(r.worst, 2) if r.worst is not None else '—'} |")
    for r in results:
        L.append("")
        L.append(f"### {r.target.title}")
        L.append("")
        ref_name = "copy rate" if r.target.against == "copy" else r.target.against
        L.append(f"| point | target ({r.target.factor:g} × {ref_name}, {r.unit}) | napkin ({r.unit}) | ratio | result |")
        L.append("|---|---|---|---|---|")
        if not r.rows:
            L.append("| (no points) | — | — | — | n/a |")
        for row in r.rows:
            L.append(f"| {row.label} | {_f(row.reference)} | {_f(row.value)} | "
                     f"{_f(row.ratio, 2) if row.ratio is not None else '—'} | {row.verdict} |")
    L.append("")
    L += _accuracy_lines(acc, check, profile_file)
    if out_of_sample:
        L.append("")
        L += list(out_of_sample)
    plots = list(plots)
    if plots:
        L.append("")
        L.append("## Plots")
        L.append("")
        for p in plots:
            L.append(f"![{Path(p).stem}]({p})")
    L.append("")
    L.append("## All results")
    L.append("")
    L.append("pred ms: the model's prediction for napkin's kernel on the datasheet profile (re-predicted now where "
             "the record names its schedule).")
    tables = [(fam, None) for fam in ("attention", "matmul", "mlp", "rowwise")]
    tables += [("composed", "tflops"), ("composed", "gbps")]  # composed points are rated by FLOPs or bytes
    for fam, metric in tables:
        pts = sorted((p for p in points if p.get("family") == fam
                      and (metric is None or p.get("metric", "tflops") == metric)), key=_sort_key)
        if not pts:
            continue
        names = list(dict.fromkeys(n for p in pts for n in (p.get("baselines") or {})))
        unit = _unit(pts[0].get("metric", "tflops"))
        L.append("")
        L.append(f"### {fam} ({unit})")
        L.append("")
        L.append("| point | napkin ms | napkin | " + " | ".join(names) + " | pred ms | \\|pred − meas\\|/meas | check |")
        L.append("|---|---|---|" + "---|" * len(names) + "---|---|---|")
        for p in pts:
            cells = []
            for n in names:
                r, note = _baseline_rate(p, n)
                ratio = _num((p.get("ratio") or {}).get(n))
                if r is not None:
                    cells.append(f"{_f(r)} (×{ratio:.2f})" if ratio else _f(r))
                else:
                    cells.append("—" if note.startswith("no ") else note)
            chk_s = _check_text(p.get("check"))
            status = _f(_napkin_rate(p))
            if _napkin_rate(p) is None:
                status = "not run" if p.get("skipped") else "failed"
            L.append(f"| {point_label(p)} | {_ms(p.get('napkin_s'))} | {status} | " + " | ".join(cells) +
                     f" | {_ms(p.get('pred_s'))} | {_pct(p.get('pred_err'))} | {chk_s} |")
        L.append("")
        L.append("(baselines: rate (× = napkin / baseline, > 1 means napkin is faster))")
    skipped = _skip_reasons(points)
    errors = _error_reasons(points)
    if skipped or errors:
        L.append("")
        L.append("## Skipped and failed")
        L.append("")
        for (name, why), n in skipped.items():
            L.append(f"- {name} skipped at {n} point(s): {why}")
        for (name, why), n in errors.items():
            L.append(f"- {name} failed at {n} point(s): {why}")
    L.append("")
    return "\n".join(L)


def _spearman_verdict(a: dict) -> tuple[str, str]:
    rho = a["spearman"]
    if rho is None:
        rho_v = "n/a"
    elif a["spearman_n"] < SPEARMAN_MIN_CONFIGS:
        rho_v = f"n/a (only {a['spearman_n']} configs)"
    else:
        rho_v = "PASS" if rho >= SPEARMAN_TARGET else f"MISS (−{SPEARMAN_TARGET - rho:.2f})"
    rho_s = (f"{rho:.2f} ({a['spearman_n']} configs, {a['spearman_points']} point"
             f"{'s' if a['spearman_points'] != 1 else ''})" if rho is not None else "—")
    return rho_s, rho_v


def _accuracy_lines(acc: dict, check=None, profile_file: str | None = None) -> list[str]:
    """The model-accuracy section: per family the datasheet-profile error, the calibrated error
    (leave-one-out) and the Spearman correlation, each against its target; then how."""
    L = ["## Model accuracy", ""]
    if check is not None:
        L.append(f"Every prediction below is the model's current one, recomputed offline from the recorded schedules "
                 f"({check.n_repredicted} of {check.n_points} points and {check.n_candidates_repredicted} of "
                 f"{check.n_candidates} autotuner configurations re-predicted; the rest keep the prediction recorded "
                 f"when they ran), exactly as code generation ranks schedules: the cost model's transfers and FLOPs "
                 f"with the family's launch (blocks, threads, registers, shared memory, bytes in flight, idle lanes) "
                 f"through `napkin.perfmodel.predict`.")
    else:
        L.append("Predicted time of napkin's kernel as recorded when the benchmarks ran (the model could not "
                 "re-predict them here).")
    L.append("")
    L.append(f"Targets: median |pred − meas|/meas ≤ {MODEL_ERROR_TARGET:.0%}; Spearman rank correlation ≥ "
             f"{SPEARMAN_TARGET} over ≥ {SPEARMAN_MIN_CONFIGS} configurations measured by the autotuner (pooled over "
             f"the family's points, each point's times divided by their median; datasheet profile). *Datasheet*: the "
             f"GPU's built-in profile, nothing fitted. *Calibrated, leave-one-out*: one efficiency factor per "
             f"code-generation family, each point predicted with the factor fitted on the OTHER points only "
             f"(`napkin.bench.calibration.cross_validated_errors`).")
    L.append("")
    L.append("| family | points | datasheet: median \\|pred − meas\\|/meas | worst | result | calibrated, leave-one-out: "
             "median | worst | result | Spearman (configs, points) | result |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for fam in sorted(acc):
        a = acc[fam]
        med = a["median_err"]
        rho_s, rho_v = _spearman_verdict(a)
        cv = a.get("median_err_cv")
        cv_v = model_error_verdict(cv) if cv is not None else "n/a"
        L.append(f"| {fam} | {a['n_points']} | {_pct(med)} | {_pct(a['max_err'])} | {model_error_verdict(med)} | "
                 f"{_pct(cv)} | {_pct(a.get('max_err_cv'))} | {cv_v} | {rho_s} | {rho_v} |")
    if check is not None:
        L += [""] + _assumption_lines(check, profile_file)
    return L


def _assumption_lines(check, profile_file: str | None) -> list[str]:
    """What the model assumed beyond the datasheet, and the fitted factors."""
    try:
        from ..codegen.select import FAMILY_EXECUTION
    except ImportError:  # the execution facts moved: say nothing rather than guess
        FAMILY_EXECUTION = {}

    g = check.profile
    L = ["Assumptions beyond the datasheet (each with where its number comes from):", ""]
    L.append(f"- mma.sync path: `mma_sync_fraction` = {g.mma_sync_fraction:.3f} of the {g.name} tensor rate "
             f"(profile notes: a pure mma.sync m16n8k16 bf16 loop, 647 of 989.4 TFLOP/s on an H200); applied to "
             f"the contraction and attention kernels (bf16/fp16), which issue mma.sync.")
    for fam, facts in FAMILY_EXECUTION.items():
        said = []
        if facts.get("overlap_compute") is False:
            said.append("tensor, CUDA-core and SFU (exp) times add (FlashAttention-2 style: the softmax runs "
                        "between the two mma in one warp)")
        if facts.get("overlap_operands") is False:
            said.append("the SMEM→register operand loads add to the compute time (one instruction stream, 2 warps per "
                        "scheduler: ncu on the H200 shows 0.37 issued instructions per cycle and fixed-latency stalls)")
        if said:
            L.append(f"- {fam}: " + "; ".join(said) + ".")
    L.append(f"- Latency floor (Little's law, bytes in flight per thread from the family's launch estimate): memory "
             f"latency {g.memory_latency_s * 1e9:.0f} ns (an estimate, not measured).")
    L.append(f"- Calibrated profile: HBM bandwidth = the measured copy rate ({g.hbm_bandwidth / 1e12:.2f} TB/s) where "
             f"the results have one.")
    cal = check.calibration
    if cal is not None:
        L.append("")
        L.append("Fitted factors (the median over the family's measured configurations of the factor that makes the "
                 "model meet the measured time; > 1: the model is pessimistic for that family):")
        L.append("")
        L.append("| code-generation family | multiplies | factor | configurations |")
        L.append("|---|---|---|---|")
        for fam, fr in sorted(cal.factors.items()):
            v = next(iter(fr.values()))
            L.append(f"| {fam} | {', '.join(fr)} | {v:.3f} | {cal.n_points.get(fam, 0)} |")
        if profile_file:
            L.append("")
            L.append(f"The profile with these factors is `{profile_file}` (`--gpu {profile_file}`): code generation "
                     f"applies each family's factor to that family's kernels; `napkin cost` and `derive`, which cost "
                     f"schedules without a code-generation family, take its measured rates only.")
    if check.problems:
        L.append("")
        L.append(f"Not re-predicted ({len(check.problems)}): " + "; ".join(check.problems[:5])
                 + (" …" if len(check.problems) > 5 else ""))
    return L


def model_error_verdict(median_err: float | None, target: float = MODEL_ERROR_TARGET) -> str:
    """PASS/MISS of a median relative error against its ceiling, with the gap in points.

    >>> model_error_verdict(0.1), model_error_verdict(0.3), model_error_verdict(None)
    ('PASS (10.0% ≤ 15%)', 'MISS (30.0% > 15%, +15.0 points)', 'n/a')
    """
    e = _num(median_err)
    if e is None:
        return "n/a"
    if e <= target:
        return f"PASS ({e * 100:.1f}% ≤ {target * 100:.0f}%)"
    return f"MISS ({e * 100:.1f}% > {target * 100:.0f}%, +{(e - target) * 100:.1f} points)"


def _check_text(chk) -> str:
    if not chk:
        return "—"
    err = _num(chk.get("rel_err"))
    if err is None:
        return "error" if chk.get("error") or chk.get("rel_err") is not None else "—"
    return f"{'ok' if chk.get('ok') else '**WRONG**'} {err:.1e}"


def _skip_reasons(points) -> dict:
    out: dict = {}
    for p in points:
        for n, v in (p.get("baselines") or {}).items():
            if isinstance(v, dict) and "skipped" in v:
                key = (n, str(v["skipped"])[:300])
                out[key] = out.get(key, 0) + 1
    return out


def _error_reasons(points) -> dict:
    out: dict = {}
    for p in points:
        for n, v in (p.get("baselines") or {}).items():
            if isinstance(v, dict) and "error" in v:
                key = (n, str(v["error"])[:300])
                out[key] = out.get(key, 0) + 1
        for n, v in (p.get("errors") or {}).items():
            if n == "log_tail":
                continue
            key = (f"napkin {n}" if n != "napkin" else "napkin", str(v)[:300])
            out[key] = out.get(key, 0) + 1
    return out


# ----------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_STYLE = {"napkin": dict(color="black", lw=2.2, marker="o", zorder=5)}


def _baseline_names(points) -> list[str]:
    return list(dict.fromkeys(n for p in points for n in (p.get("baselines") or {})))


def plot_attention(points: Sequence[dict], path: Path) -> Path | None:
    pts = [p for p in points if p.get("family") == "attention" and (p.get("labels") or {}).get("seq")]
    if not pts:
        return None
    plt = _plt()
    ds = sorted({p["labels"].get("d") for p in pts})
    masks = sorted({bool(p["labels"].get("causal")) for p in pts})
    fig, axes = plt.subplots(len(ds), len(masks), figsize=(6 * len(masks), 4 * len(ds)), squeeze=False)
    names = _baseline_names(pts)
    for i, d in enumerate(ds):
        for j, causal in enumerate(masks):
            ax = axes[i][j]
            sel = sorted((p for p in pts if p["labels"].get("d") == d and bool(p["labels"].get("causal")) == causal),
                         key=lambda p: p["labels"]["seq"])
            xs = [p["labels"]["seq"] for p in sel]
            ys = [_napkin_rate(p) for p in sel]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], label="napkin", **_STYLE["napkin"])
            pred = [p["flops"] / p["pred_s"] / 1e12 if _num(p.get("pred_s")) and _num(p.get("flops")) else float("nan")
                    for p in sel]
            if any(math.isfinite(v) for v in pred):
                ax.plot(xs, pred, color="black", ls=":", lw=1.2, label="napkin (model)")
            for n in names:
                vals = [_baseline_rate(p, n)[0] for p in sel]
                if any(v is not None for v in vals):
                    ax.plot(xs, [v if v is not None else float("nan") for v in vals], marker=".", lw=1.2, label=n)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs or [1])
            ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in xs] or [""])
            ax.set_xlabel("sequence length (batch · seq = 16k tokens)")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"attention forward, d = {d}, {'causal' if causal else 'non-causal'}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _peak_rates(device: dict) -> tuple[float | None, float | None]:
    """(tensor bf16 FLOP/s, CUDA-core fp32 FLOP/s) of the device's profile."""
    try:
        from ..perfmodel.hardware import get_gpu

        g = get_gpu(device.get("gpu_key") or "h100")
        return g.tensor_rate("bf16"), g.cuda_core_rate("fp32")
    except Exception:
        return None, None


def plot_roofline(device: dict, points: Sequence[dict], path: Path) -> Path | None:
    pts = [p for p in points if _num(p.get("flops")) and _num(p.get("bytes"))
           and (_num(p.get("napkin_s")) or _num(p.get("pred_s")))]
    if not pts:
        return None
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5.5))
    copy = _num(device.get("copy_bandwidth"))
    tensor, cuda = _peak_rates(device)
    ais = [p["flops"] / p["bytes"] for p in pts]
    lo, hi = min(ais) / 4, max(ais) * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    if copy:
        if tensor:
            ax.plot(x, np.minimum(tensor, x * copy) / 1e12, color="grey", lw=1.5,
                    label=f"roofline: {copy / 1e12:.2f} TB/s copy, {tensor / 1e12:.0f} TFLOP/s tensor")
        if cuda:
            ax.plot(x, np.minimum(cuda, x * copy) / 1e12, color="grey", lw=1, ls="--",
                    label=f"CUDA-core fp32 {cuda / 1e12:.0f} TFLOP/s")
    colors = {"attention": "tab:blue", "matmul": "tab:red", "mlp": "tab:orange", "rowwise": "tab:green"}
    seen = set()
    for p, ai in zip(pts, ais):
        c = colors.get(p.get("family"), "tab:purple")
        meas = p["flops"] / p["napkin_s"] / 1e12 if _num(p.get("napkin_s")) else None
        pred = p["flops"] / p["pred_s"] / 1e12 if _num(p.get("pred_s")) else None
        fam = p.get("family")
        if meas is not None:
            ax.scatter([ai], [meas], color=c, s=28, zorder=4, label=f"{fam} measured" if (fam, "m") not in seen else None)
            seen.add((fam, "m"))
        if pred is not None:
            ax.scatter([ai], [pred], facecolors="none", edgecolors=c, s=40, zorder=4,
                       label=f"{fam} predicted" if (fam, "p") not in seen else None)
            seen.add((fam, "p"))
        if meas is not None and pred is not None:
            ax.plot([ai, ai], [meas, pred], color=c, lw=0.6, alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory HBM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"roofline — {device.get('name', 'GPU')}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_pred_vs_meas(points: Sequence[dict], path: Path) -> Path | None:
    chosen = [(p["pred_s"], p["napkin_s"], p.get("family")) for p in points
              if _num(p.get("pred_s")) and _num(p.get("napkin_s"))]
    cands = [(c["pred_s"], c["meas_s"], p.get("family")) for p in points for c in _candidates(p)]
    if not chosen and not cands:
        return None
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 6))
    colors = {"attention": "tab:blue", "matmul": "tab:red", "mlp": "tab:orange", "rowwise": "tab:green"}
    allv = [v for t in chosen + cands for v in t[:2]]
    lo, hi = min(allv) / 1.5, max(allv) * 1.5
    line = np.array([lo, hi])
    ax.plot(line * 1e3, line * 1e3, color="black", lw=1, label="y = x")
    ax.fill_between(line * 1e3, line * 1e3 * (1 - MODEL_ERROR_TARGET), line * 1e3 * (1 + MODEL_ERROR_TARGET),
                    color="grey", alpha=0.15, label=f"±{MODEL_ERROR_TARGET:.0%}")
    for fam in dict.fromkeys(t[2] for t in chosen + cands):
        c = colors.get(fam, "tab:purple")
        cs = [t for t in cands if t[2] == fam]
        if cs:
            ax.scatter([t[1] * 1e3 for t in cs], [t[0] * 1e3 for t in cs], s=12, color=c, alpha=0.4,
                       label=f"{fam} candidates")
        ch = [t for t in chosen if t[2] == fam]
        if ch:
            ax.scatter([t[1] * 1e3 for t in ch], [t[0] * 1e3 for t in ch], s=36, color=c, edgecolors="black",
                       label=f"{fam} chosen kernel")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title("model: predicted vs measured")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_rowwise(device: dict, points: Sequence[dict], path: Path) -> Path | None:
    pts = [p for p in points if p.get("family") == "rowwise" and (p.get("sizes") or {}).get("x")]
    if not pts:
        return None
    plt = _plt()
    ops = list(dict.fromkeys(p.get("diagram") for p in pts))
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4), squeeze=False)
    names = _baseline_names(pts)
    copy = _copy_gbps(device)
    for ax, op in zip(axes[0], ops):
        for dt, ls in zip(sorted({p.get("dtype") for p in pts}), ("-", "--", ":")):
            sel = sorted((p for p in pts if p.get("diagram") == op and p.get("dtype") == dt), key=lambda p: p["sizes"]["x"])
            if not sel:
                continue
            xs = [p["sizes"]["x"] for p in sel]
            ys = [_napkin_rate(p) for p in sel]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], ls=ls, color="black", marker="o",
                    label=f"napkin {dt}")
            for n in names:
                vals = [_baseline_rate(p, n)[0] for p in sel]
                if any(v is not None for v in vals):
                    ax.plot(xs, [v if v is not None else float("nan") for v in vals], ls=ls, marker=".", label=f"{n} {dt}")
        if copy:
            ax.axhline(copy, color="grey", lw=1, label=f"copy {copy:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row width")
        ax.set_ylabel("GB/s (read + write)")
        ax.set_ylim(bottom=0)
        ax.set_title(op)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_gemm(points: Sequence[dict], path: Path) -> Path | None:
    pts = sorted((p for p in points if p.get("family") in ("matmul", "mlp")), key=lambda p: (p["family"], _sort_key(p)))
    if not pts:
        return None
    plt = _plt()
    names = ["napkin"] + _baseline_names(pts)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(pts) * len(names) / 2), 4.5))
    width = 0.8 / len(names)
    for j, n in enumerate(names):
        vals = [(_napkin_rate(p) if n == "napkin" else _baseline_rate(p, n)[0]) for p in pts]
        ax.bar([i + j * width for i in range(len(pts))], [v or 0 for v in vals], width,
               label=n, color="black" if n == "napkin" else None)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(pts))])
    ax.set_xticklabels([f"{p['family']}\n{point_label(p)}" for p in pts], fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("GEMM and MLP")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def make_plots(device: dict, points: Sequence[dict], plot_dir: str | Path) -> list[Path]:
    """Every plot that has data; returns the files written."""
    plot_dir = Path(plot_dir)
    plot_dir.mkdir(parents=True, exist_ok=True)
    made = [
        plot_attention(points, plot_dir / "attention_tflops.png"),
        plot_roofline(device, points, plot_dir / "roofline.png"),
        plot_pred_vs_meas(points, plot_dir / "pred_vs_meas.png"),
        plot_rowwise(device, points, plot_dir / "rowwise_gbps.png"),
        plot_gemm(points, plot_dir / "gemm_tflops.png"),
    ]
    return [p for p in made if p is not None]


# ----------------------------------------------------------------------------- entry points


@dataclass
class Report:
    markdown: Path
    plots: list[Path]
    targets: list[TargetResult]
    accuracy: dict
    check: object = None      # the napkin.bench.calibration.ModelCheck, when the model re-predicted
    out_of_sample: object = None   # the napkin.bench.outofsample.OutOfSample of every GPU reported together


#: The profile written next to the results, with the per-family factors fitted on them.
CALIBRATED_PROFILE = "calibrated-profile.json"


def model_check(device: dict, points: Sequence[dict]):
    """The results re-predicted by the current model, the per-family factors fitted on them and
    the leave-one-out errors (:func:`napkin.bench.calibration.evaluate`), or None when the
    model cannot run here (no GPU profile named, the package incomplete)."""
    if not device.get("gpu_key") or not points:
        return None
    try:
        from .calibration import evaluate

        return evaluate(points, device)
    except Exception as e:  # noqa: BLE001 - the report must still be written from the recorded numbers
        import warnings

        warnings.warn(f"model re-prediction failed ({type(e).__name__}: {e}); reporting recorded predictions",
                      RuntimeWarning, 2)
        return None


def generate(results_dir: str | Path, out_dir: str | Path | None = None, md_name: str = "BENCHMARKS.md", *,
             loaded: tuple[dict, list] | None = None, check=None, out_of_sample: Sequence[str] = ()) -> Report:
    """Plots and BENCHMARKS.md for one GPU's results folder (written into ``out_dir``, default the
    same folder: ``plots/*.png`` and ``BENCHMARKS.md``). ``loaded``: ``(device, points)`` already
    read from the folder; ``check``: its :func:`model_check` already computed;
    ``out_of_sample``: the lines of the out-of-sample section for this GPU."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir
    out.mkdir(parents=True, exist_ok=True)
    device, points = loaded if loaded is not None else load_results(results_dir)
    if check is None:
        check = model_check(device, points)
    profile_file = None
    if check is not None:
        # the re-predicted records replace theirs; a plan of several kernels (no family's sample,
        # left out of the calibration) keeps its recorded prediction and still meets its targets
        again = {p.get("id"): p for p in check.points}
        points = [again.get(p.get("id"), p) for p in points]
        if check.calibration is not None:
            check.calibration.save(out / CALIBRATED_PROFILE, note="fitted on the results in this folder")
            profile_file = CALIBRATED_PROFILE
    acc = model_accuracy(points, check.cv if check is not None else None)
    plots = make_plots(device, points, out / "plots")
    rel = [str(p.relative_to(out)) for p in plots]
    md = out / md_name
    md.write_text(render_markdown(device, points, rel, accuracy=acc, check=check, profile_file=profile_file,
                                  out_of_sample=out_of_sample), encoding="utf-8")
    return Report(md, plots, evaluate_targets(device, points), acc, check)


def _result_dirs(root: Path) -> list[Path]:
    return [root] if any(root.glob("*.json")) else sorted(d for d in root.iterdir()
                                                         if d.is_dir() and any(d.glob("*.json")))


def generate_all(root: str | Path, *, summary_md: str | Path | None = None) -> list[Report]:
    """:func:`generate` for every ``<root>/<gpu>/`` folder that holds JSON results (or ``root``
    itself). Every folder's records are resolved and fitted once; with two GPUs or more, each
    report gets the out-of-sample section (:mod:`napkin.bench.outofsample`: factors fitted on one
    GPU judged on the other), and ``summary_md`` (a Markdown file, e.g. the top-level
    BENCHMARKS.md) gets the whole of it between its markers; the rest of that file is kept."""
    root = Path(root)
    dirs = _result_dirs(root)
    loaded = {d: load_results(d) for d in dirs}
    checks = {d: model_check(*loaded[d]) for d in dirs}
    oos = None
    labels: dict[Path, str] = {}
    usable = {d: c for d, c in checks.items() if c is not None}
    if usable:
        from .outofsample import gpu_label, markdown_section, out_of_sample, write_section

        for d in usable:
            lab = gpu_label(loaded[d][0], d.name)
            labels[d] = lab if lab not in labels.values() else d.name
        try:
            oos = out_of_sample({labels[d]: c for d, c in usable.items()})
        except Exception as e:  # noqa: BLE001 - the per-GPU reports must still be written
            import warnings

            warnings.warn(f"out-of-sample evaluation failed ({type(e).__name__}: {e})", RuntimeWarning, 2)
            oos = None
        if oos is not None and summary_md is not None:
            write_section(summary_md, markdown_section(oos))
    reps = []
    for d in dirs:
        section = markdown_section(oos, labels[d]) if oos is not None and d in labels else ()
        reps.append(generate(d, loaded=loaded[d], check=checks[d], out_of_sample=section))
        reps[-1].out_of_sample = oos
    return reps


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m napkin.bench.report",
                                 description="Plots and BENCHMARKS.md from benchmark JSON results.")
    ap.add_argument("results", nargs="?", default="benchmarks/results",
                    help="a results folder (<gpu>/ with *.json) or a folder of such folders")
    a = ap.parse_args(argv)
    for r in generate_all(a.results):
        print(f"wrote {r.markdown} and {len(r.plots)} plot(s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
