"""benchmarks/operator_survey.py: every problem builds, plans without the scalar fallback and has
a reference; the summary's arithmetic."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from napkin.codegen.planner import derive
from napkin.perfmodel.plan import FALLBACK

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("operator_survey", ROOT / "benchmarks" / "operator_survey.py")
survey = importlib.util.module_from_spec(spec)
spec.loader.exec_module(survey)


@pytest.mark.parametrize("name", sorted(survey.PROBLEMS))
def test_every_problem_plans_on_fast_families(name):
    d = getattr(survey, name)()
    assert d.name == name
    for dtype in ("bf16", "fp32"):
        plan = derive(d.with_dtype(dtype), "h100", dtype, sizes=survey.PROBLEMS[name], explain=False).plan
        assert FALLBACK not in plan.families, plan


def test_points_cover_the_survey_and_the_library():
    from napkin.diagrams import library

    pts = survey.points(sorted(survey.PROBLEMS), ["bf16", "fp32"], with_library=True)
    assert len(pts) == 2 * len(survey.PROBLEMS) + len(library.names()) + len(survey.EXAMPLES)
    assert all(p.bound_diagram().is_bound for p in pts[-len(survey.EXAMPLES) - 3:])
    assert not any("matmul_chain" in p.diagram for p in pts)


def _rec(problem, dtype, ratio, families=("pointwise",), ok=True):
    return {"labels": {"problem": problem}, "dtype": dtype, "ratio": {"eager": ratio}, "families": list(families),
            "check": {"ok": ok}}


def test_the_summary_counts_what_it_says():
    recs = [_rec("a", "bf16", 2.0), _rec("b", "bf16", 0.4, ("fallback",)), _rec("a", "fp32", 1.0, ok=False),
            _rec("library:x", "bf16", 0.8)]
    s = survey.summarize(recs)
    assert s["bf16"]["geomean_vs_eager"] == pytest.approx(math.sqrt(0.8))
    assert s["bf16"]["under_half"] == ["b"] and s["bf16"]["on_fallback"] == ["b"]
    assert s["all"]["points"] == 3 and s["all"]["faster_than_eager"] == 2
    assert s["fp32"]["check_failed"] == ["a"]
    assert s["library"]["under_one"] == ["library:x"] and s["library"]["points"] == 1
