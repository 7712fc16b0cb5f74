"""benchmarks/heldout_survey.py: every problem builds under its name, plans without the scalar
fallback, and the survey's runner takes its problems."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from napkin.codegen.planner import derive
from napkin.perfmodel.plan import FALLBACK

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("heldout_survey", ROOT / "benchmarks" / "heldout_survey.py")
heldout = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heldout)


@pytest.mark.parametrize("name", sorted(heldout.PROBLEMS))
def test_every_problem_plans_on_fast_families(name):
    d = getattr(heldout, name)()
    assert d.name == name
    plan = derive(d, "h100", "bf16", sizes=heldout.PROBLEMS[name], explain=False).plan
    assert FALLBACK not in plan.families, plan


def test_the_survey_runner_takes_these_problems():
    pts = heldout._runner().points(["mse_loss", "linear3d"], ["bf16"], problems=heldout.PROBLEMS, here=heldout.HERE)
    assert [p.labels["problem"] for p in pts] == ["mse_loss", "linear3d"]
    assert all(p.diagram.startswith(str(heldout.HERE)) and p.bound_diagram().is_bound for p in pts)
