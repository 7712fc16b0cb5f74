"""The model judged out of sample (napkin.bench.outofsample): the scores by hand on made-up
predictions, factors fitted on one GPU applied to the other without refitting, the Markdown
section and its markers, and the committed results of both GPUs end to end."""

import importlib.util
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from napkin.bench import calibration as C
from napkin.bench import outofsample as O
from napkin.bench import report
from napkin.perfmodel.hardware import get_gpu

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _point(pid, family, meas, orders=None, cfam="contraction"):
    """A PointSamples whose candidates are bare Samples (no schedule): predictions are faked."""
    ps = C.PointSamples({"id": pid, "family": family}, cfam)
    for i, m in enumerate(meas):
        s = C.Sample(pid, family, cfam, f"{pid}#{i}", m, None, None, "id", None, rank=i,
                     order=None if orders is None else orders[i])
        ps.candidates.append(({"desc": s.desc, "meas_s": m}, s, None))
    return ps


@pytest.fixture
def fake_predictions(monkeypatch):
    """predict_sample returns a table's number divided by the profile's contraction factor."""
    table: dict[str, float] = {}

    def predict(sample, profile, factors=None):
        f = (profile.efficiency.get(sample.family) or {}).get("tensor", 1.0)
        return table[sample.desc] / f

    monkeypatch.setattr(O, "predict_sample", predict)
    return table


def test_scores_by_hand(fake_predictions):
    pts = [_point("p1", "matmul", [1.1, 2.2, 2.0]), _point("p2", "matmul", [1.0, 2.0]),
           _point("p3", "matmul", [1.0, 1.5], orders=[1, 0]), _point("p4", "matmul", [3.0]),
           _point("r1", "rowwise", [1.0, 1.0], cfam="rowwise")]
    fake_predictions.update({"p1#0": 1, "p1#1": 2, "p1#2": 3, "p2#0": 2, "p2#1": 1, "p3#0": 1, "p3#1": 1,
                             "p4#0": 3.0, "r1#0": 1, "r1#1": 2})
    s = O.score_family(pts, get_gpu("h100"), "matmul", target="X", setting="datasheet", favourites=False)
    errs = [0.1 / 1.1, 0.2 / 2.2, 0.5, 1.0, 0.5, 0.0, 0.5 / 1.5, 0.0]
    assert s.n_configs == 8 and s.n_points == 4
    assert s.median == pytest.approx(float(np.median(errs))) and s.p90 == pytest.approx(np.percentile(errs, 90))
    # p1: ranks (1,2,3) against (1,3,2): 0.5; p2: reversed: -1; p3: the predictions tie (skipped); p4: one config
    assert s.spearman_median == pytest.approx(-0.25) and s.n_rank_points == 2 and s.n_rank_skipped == 2
    # first choice: p1 the best (hit); p2 the slower one (miss); p3 a tie the family's order breaks:
    # candidate 1 (order 0), 1.5 against 1.0 (miss)
    assert s.n_choice_points == 3 and s.first_choice == pytest.approx(1 / 3)
    assert s.passes("median") is False and s.passes("spearman") is False and s.passes("first_choice") is False
    assert s.label == "X datasheet"
    rw = O.score_family(pts, get_gpu("h100"), "rowwise", target="X", setting="out-of-sample", source="Y",
                        favourites=False)
    assert rw.n_points == 1 and rw.median == pytest.approx(0.5) and rw.label == "Y → X"
    # measurements tie: Spearman is undefined, first choice is within 5% (any of them)
    assert rw.spearman_median is None and rw.first_choice == 1.0 and rw.passes("spearman") is None


def test_favourite_among_all_candidates(monkeypatch):
    """The model's favourite over every candidate the family proposes, and whether it was measured."""
    from napkin.bench.autotune import schedule_id
    from napkin.diagrams import library
    from napkin.perfmodel.schedule import Schedule

    d = library.get("matmul").with_dtype("bf16").bind({"a": 256, "b": 256, "c": 256})
    cands = [Schedule.fused(d, groups={"a": g}, streams={"b": 64}) for g in (32, 64, 128)]
    times = {schedule_id(s): t for s, t in zip(cands, (3.0, 1.0, 2.0))}
    monkeypatch.setattr(O, "predict_schedule_seconds", lambda dg, fam, s, prof: times[schedule_id(s)])
    ps = C.PointSamples({"id": "p", "family": "matmul"}, "contraction", diagram=d, family_candidates=cands)
    assert O._favourite_measured(ps, get_gpu("h100"), {schedule_id(cands[1])}) is True
    assert O._favourite_measured(ps, get_gpu("h100"), {schedule_id(cands[0]), schedule_id(cands[2])}) is False
    assert O._favourite_measured(C.PointSamples({"id": "q"}), get_gpu("h100"), set()) is None


def _check(label, pts, factor, base):
    cal = C.Calibration(base, {"contraction": {"tensor": factor, "smem": factor}}, {"contraction": 3})
    return C.ModelCheck([], cal, [], base, 0, 0, 0, 0, [], pts, get_gpu(label.lower()))


def test_factors_fitted_on_one_gpu_are_judged_on_the_other_without_refitting(fake_predictions):
    """GPU A's factor (0.5) on B's base profile, and B's (0.8) on A's; datasheet rows carry no factor."""
    a_pts = [_point("a1", "matmul", [2.0, 4.0])]
    b_pts = [_point("b1", "matmul", [1.25, 2.5])]
    fake_predictions.update({"a1#0": 1.0, "a1#1": 2.0, "b1#0": 1.0, "b1#1": 2.0})
    base_a = C.base_profile("h100", {"copy_bandwidth": 3e12})
    base_b = C.base_profile("h200", {"copy_bandwidth": 4.2e12})
    oos = O.out_of_sample({"H100": _check("H100", a_pts, 0.5, base_a), "H200": _check("H200", b_pts, 0.8, base_b)},
                          favourites=False)
    by = {(s.target, s.setting, s.source): s for s in oos.scores}
    assert set(by) == {("H100", "datasheet", None), ("H100", "out-of-sample", "H200"), ("H100", "in-sample", "H100"),
                       ("H200", "datasheet", None), ("H200", "out-of-sample", "H100"), ("H200", "in-sample", "H200")}
    # on A (measured 2x the table): A's own 0.5 is exact; B's 0.8 predicts 1.25x the table
    assert by[("H100", "in-sample", "H100")].median == pytest.approx(0)
    assert by[("H100", "out-of-sample", "H200")].median == pytest.approx(abs(1.25 - 2) / 2)
    assert by[("H100", "datasheet", None)].median == pytest.approx(0.5)
    # on B (measured 1.25x): A's 0.5 predicts 2x
    assert by[("H200", "out-of-sample", "H100")].median == pytest.approx(abs(2 - 1.25) / 1.25)
    assert oos.factors["H100"]["contraction"]["tensor"] == 0.5 and oos.n_fit["H200"] == {"contraction": 3}
    md = "\n".join(O.markdown_section(oos))
    assert md.startswith("## Model error out of sample") and "H100 → H200" in md and "H200 → H100" in md
    assert "(≤ 15%)" in md and "(≤ 30%)" in md and "(≥ 0.8)" in md and "(≥ 90%)" in md
    assert "| H100 | contraction | tensor, smem | 0.500 | 3 |" in md
    insample = next(line for line in md.splitlines() if "in-sample (reference)" in line)
    assert "PASS" not in insample and "MISS" not in insample
    one = "\n".join(O.markdown_section(oos, "H200"))
    assert "H100 → H200" in one and "H200 → H100" not in one
    d = oos.to_dict()
    assert len(d["scores"]) == 6 and d["targets"]["median"] == ["<=", 0.15]


def test_write_section_keeps_the_rest_of_the_file(tmp_path):
    f = tmp_path / "BENCHMARKS.md"
    f.write_text("# Benchmarks\n\nhand-written intro\n")
    O.write_section(f, ["## Model error out of sample", "", "first"])
    O.write_section(f, ["## Model error out of sample", "", "second"])
    text = f.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written intro\n")
    assert text.count(O.MARK_START) == 1 and text.count(O.MARK_END) == 1
    assert "second" in text and "first" not in text
    f.write_text(text + "\nafter the section\n")
    O.write_section(f, ["third"])
    assert f.read_text().endswith("after the section\n") and "third" in f.read_text()
    assert O.write_section(tmp_path / "new.md", ["x"]).read_text().startswith(O.MARK_START)


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_all_summary_path(tmp_path):
    ra = _run_all()
    assert ra.summary_path(ROOT / "benchmarks" / "results", None) == ROOT / "BENCHMARKS.md"
    (tmp_path / "gpu").mkdir()
    assert ra.summary_path(tmp_path, None) == tmp_path / "BENCHMARKS.md"
    (tmp_path / "gpu" / "x.json").write_text("{}")
    assert ra.summary_path(tmp_path / "gpu", None) is None
    assert ra.summary_path(tmp_path, "none") is None and ra.summary_path(tmp_path, "s.md") == Path("s.md")


@pytest.mark.skipif(not all((RESULTS / g / "attention.json").exists() for g in ("nvidia-h200", "nvidia-h100-80gb-hbm3")),
                    reason="no committed results of both GPUs")
def test_committed_results_of_both_gpus_out_of_sample(tmp_path):
    """The report command on copies of both GPUs' JSON: every family scored on the datasheet and
    both ways, in each GPU's report and in the summary, offline."""
    for g in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        (tmp_path / g).mkdir()
        for f in (RESULTS / g).glob("*.json"):
            if f.name != report.CALIBRATED_PROFILE:
                shutil.copy(f, tmp_path / g / f.name)
    summary = tmp_path / "SUMMARY.md"
    summary.write_text("# head\n")
    reps = report.generate_all(tmp_path, summary_md=summary)
    oos = reps[0].out_of_sample
    assert oos is not None and sorted(oos.gpus) == ["H100", "H200"] and not oos.problems
    for fam in O.BENCH_FAMILIES:
        for target, source in (("H100", "H200"), ("H200", "H100")):
            s = next(x for x in oos.scores if x.family == fam and x.target == target and x.source == source)
            assert s.setting == "out-of-sample" and s.n_configs >= 2 * s.n_points > 0
            assert math.isfinite(s.median) and math.isfinite(s.p90) and s.first_choice is not None
            assert s.n_favourite_known == s.n_choice_points
        for target in ("H100", "H200"):
            assert any(x.family == fam and x.target == target and x.setting == "datasheet" for x in oos.scores)
    assert set(oos.factors["H100"]) == set(oos.factors["H200"]) == {"attention", "contraction", "rowwise", "pointwise"}
    text = summary.read_text()
    assert text.startswith("# head\n") and "## Model error out of sample" in text and "H100 → H200" in text
    for r in reps:
        md = r.markdown.read_text()
        assert "## Model error out of sample" in md
        other = "H100" if "h200" in r.markdown.parent.name else "H200"
        assert f"{other} → " in md
