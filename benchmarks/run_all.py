#!/usr/bin/env python3
"""Run napkin's benchmark suite on this machine's GPU, write the JSON results, the plots and
BENCHMARKS.md, and print a short table last.

    python3 benchmarks/run_all.py --quick --out $OUT/bench      # a short sweep (about 7 minutes at most)
    python3 benchmarks/run_all.py                               # the full sweep into benchmarks/results/
    python3 benchmarks/run_all.py --report-only --out DIR       # redo plots, BENCHMARKS.md and the calibrated
                                                                # profile from DIR's JSON (re-predicting every
                                                                # point with the current model, offline), and
                                                                # the out-of-sample section of the summary
                                                                # (--summary-md; default: the top-level
                                                                # BENCHMARKS.md for benchmarks/results)
    python3 benchmarks/run_all.py --list [--quick]              # the points, their FLOPs and bytes (no GPU)

Results land in ``<out>/<gpu>/<family>.json`` with ``plots/*.png`` and ``BENCHMARKS.md`` beside
them. A failing kernel or baseline is recorded and the sweep goes on; points run in a child
process that is restarted past a crash or a hang; a time budget (``--budget-s``, 420 s with
``--quick``) stops the sweep in time to write everything.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from napkin.bench import report as report_mod  # noqa: E402
from napkin.bench import suite  # noqa: E402

QUICK_BUDGET_S = 420.0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/run_all.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    suite._add_sweep_args(ap)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                    help="results folder (default benchmarks/results); files go to <out>/<gpu>/")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"stop starting points after this many seconds (default {QUICK_BUDGET_S:.0f} with --quick, "
                         "none otherwise)")
    ap.add_argument("--point-timeout-s", type=float, default=480.0,
                    help="kill and skip a point that runs longer than this (default 480)")
    ap.add_argument("--in-process", action="store_true", help="run the points in this process (no restarts)")
    ap.add_argument("--report-only", action="store_true", help="only regenerate plots and BENCHMARKS.md")
    ap.add_argument("--summary-md", default=None, metavar="FILE",
                    help="with --report-only: the Markdown file whose 'Model error out of sample' section is "
                         "rewritten (default: BENCHMARKS.md at the repository root when --out is benchmarks/results, "
                         "else <out>/BENCHMARKS.md when <out> holds one folder per GPU; 'none': no summary)")
    ap.add_argument("--list", action="store_true", help="list the points and exit")
    return ap


def _console():
    from rich.console import Console

    return Console(width=170, highlight=False)


def _list(points) -> None:
    from rich.table import Table

    t = Table(title=f"{len(points)} benchmark points")
    for c in ("#", "point", "sizes", "GFLOP", "MB moved"):
        t.add_column(c, justify="right" if c in ("#", "GFLOP", "MB moved") else "left")
    for i, p in enumerate(points):
        t.add_row(str(i), p.id, " ".join(f"{k}={v}" for k, v in p.sizes.items()), f"{p.flops / 1e9:,.1f}",
                  f"{p.bytes / 1e6:,.1f}")
    _console().print(t)


def _fmt(x, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def print_tables(records, rep) -> None:
    """The per-point table, then the targets and model accuracy (last: the device reply keeps the end)."""
    from rich.table import Table

    con = _console()
    t = Table(title="points (ratio = napkin / best baseline; > 1: napkin faster)", show_lines=False)
    t.add_column("point", no_wrap=True)
    for c in ("napkin ms", "napkin", "best baseline", "ratio", "|pred-meas|/meas", "status"):
        t.add_column(c, overflow="fold")
    for r in suite.summary_rows(records):
        t.add_row(r["label"], _fmt(r["napkin_ms"], ".3f"), f"{_fmt(r['rate'])} {r['unit']}" if r["rate"] else "—",
                  f"{r['best']} {_fmt(r['best_rate'])}" if r["best"] else "—", _fmt(r["ratio"], ".2f"),
                  f"{r['pred_err'] * 100:.0f}%" if r["pred_err"] is not None else "—", str(r["status"])[:48])
    con.print(t)
    con.print(f"report: {rep.markdown}")
    s = Table(title="targets and model accuracy")
    for c in ("target", "PASS", "measured", "worst ratio"):
        s.add_column(c)
    for tr in rep.targets:
        s.add_row(tr.target.id, str(tr.n_pass), f"{tr.n_measured}/{len(tr.rows)}", _fmt(tr.worst, ".2f"))
    for fam, a in sorted(rep.accuracy.items()):
        med = a["median_err"]
        cv = a.get("median_err_cv")
        rho = a["spearman"]
        s.add_row(f"model {fam}", report_mod.model_error_verdict(med).split(" ")[0],
                  f"{a['n_points']} pts", f"median err {_fmt(med * 100 if med is not None else None, '.0f')}% datasheet, "
                  f"{_fmt(cv * 100 if cv is not None else None, '.0f')}% calibrated (leave-one-out), "
                  f"spearman {_fmt(rho, '.2f')} (n={a['spearman_n']})")
    con.print(s)


def print_accuracy(rep) -> None:
    """The model's accuracy per family (re-predicted by the current model where possible)."""
    for fam, a in sorted(rep.accuracy.items()):
        med, cv, rho = a["median_err"], a.get("median_err_cv"), a["spearman"]
        print(f"  model {fam}: median |pred-meas|/meas {_fmt(med * 100 if med is not None else None, '.1f')}% "
              f"(datasheet), {_fmt(cv * 100 if cv is not None else None, '.1f')}% (calibrated, leave-one-out); "
              f"Spearman {_fmt(rho, '.2f')} over {a['spearman_n']} configs")


def summary_path(out: Path, summary_md: str | None) -> Path | None:
    """Where the out-of-sample summary goes (see --summary-md)."""
    if summary_md is not None:
        return None if summary_md.lower() == "none" else Path(summary_md)
    if out.resolve() == (ROOT / "benchmarks" / "results").resolve():
        return ROOT / "BENCHMARKS.md"
    if out.is_dir() and not any(out.glob("*.json")):
        return out / "BENCHMARKS.md"
    return None


def print_out_of_sample(oos) -> None:
    """One line per family and setting judged: the four numbers against their targets."""
    if oos is None:
        return
    print("model error out of sample (every measured configuration; targets: median <= 15%, p90 <= 30%, "
          "Spearman per point >= 0.8, first choice within 5% at >= 90% of points):")
    for s in oos.rows():
        if s.setting == "in-sample":
            continue
        mark = {m: ("ok" if s.passes(m) else "MISS") if s.passes(m) is not None else "n/a" for m in
                ("median", "p90", "spearman", "first_choice")}
        print(f"  {s.family:9s} {s.label:22s} median {_fmt(s.median * 100 if s.median is not None else None)}% "
              f"[{mark['median']}]  p90 {_fmt(s.p90 * 100 if s.p90 is not None else None)}% [{mark['p90']}]  "
              f"spearman {_fmt(s.spearman_median, '.2f')} [{mark['spearman']}]  first choice "
              f"{_fmt(s.first_choice * 100 if s.first_choice is not None else None, '.0f')}% [{mark['first_choice']}]")


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    families = suite._families(a.families)
    points = suite.all_points(a.quick, families)
    out = Path(a.out)
    if a.list:
        _list(points)
        return 0
    if a.report_only:
        summary = summary_path(out, a.summary_md)
        reps = report_mod.generate_all(out, summary_md=summary)
        for r in reps:
            extra = f", {report_mod.CALIBRATED_PROFILE}" if (r.markdown.parent / report_mod.CALIBRATED_PROFILE).exists() else ""
            print(f"wrote {r.markdown}, {len(r.plots)} plot(s){extra}")
            print_accuracy(r)
        if reps:
            print_out_of_sample(reps[0].out_of_sample)
            if summary is not None and reps[0].out_of_sample is not None:
                print(f"wrote the out-of-sample section of {summary}")
        return 0 if reps else 1
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (torch.cuda.is_available() is False); use --list or --report-only",
              file=sys.stderr)
        return 2
    budget = a.budget_s if a.budget_s is not None else (QUICK_BUDGET_S if a.quick else None)
    t0 = time.time()
    cfg = suite.config_from_args(a) if a.in_process else None
    device, records, gpu_dir = suite.orchestrate(
        points, out, child_args=suite.child_args_from(a), budget_s=budget, point_timeout_s=a.point_timeout_s,
        in_process=a.in_process, cfg=cfg)
    try:
        rep = report_mod.generate(gpu_dir)
    except Exception as e:  # the JSON is written; a report failure must not hide it
        print(f"report failed: {type(e).__name__}: {e}; the JSON is in {gpu_dir}", file=sys.stderr)
        return 1
    print(f"\n{len(records)} points in {time.time() - t0:.0f} s on {device.get('name', '?')}; "
          f"JSON, plots and BENCHMARKS.md in {gpu_dir}")
    print_tables(records, rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
