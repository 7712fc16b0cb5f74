"""benchmarks/heldout_survey.py and heldout_survey2.py to heldout_survey6.py: every problem builds under its name, plans without the scalar fallback, and the operator survey's runner
(which every held-out survey runs with) takes its problems."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from napkin.codegen.planner import derive
from napkin.perfmodel.plan import FALLBACK

ROOT = Path(__file__).resolve().parents[2]


def _load(stem: str):
    spec = importlib.util.spec_from_file_location(stem, ROOT / "benchmarks" / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


heldout, heldout2, heldout3 = _load("heldout_survey"), _load("heldout_survey2"), _load("heldout_survey3")
heldout4, heldout5, heldout6 = _load("heldout_survey4"), _load("heldout_survey5"), _load("heldout_survey6")
runner = _load("operator_survey")
ALL = [(m, n) for m in (heldout, heldout2, heldout3, heldout4, heldout5, heldout6) for n in sorted(m.PROBLEMS)]


@pytest.mark.parametrize("module, name", ALL, ids=[f"{m.__name__}:{n}" for m, n in ALL])
def test_every_problem_plans_on_fast_families(module, name):
    d = getattr(module, name)()
    assert d.name == name
    plan = derive(d, "h100", "bf16", sizes=module.PROBLEMS[name], explain=False).plan
    assert FALLBACK not in plan.families, plan


def test_the_survey_runner_takes_these_problems():
    pts = runner.points(["mse_loss", "linear3d"], ["bf16"], problems=heldout.PROBLEMS, here=heldout.HERE)
    assert [p.labels["problem"] for p in pts] == ["mse_loss", "linear3d"]
    assert all(p.diagram.startswith(str(heldout.HERE)) and p.bound_diagram().is_bound for p in pts)
    pts = runner.points(["merge_heads"], ["fp32"], problems=heldout2.PROBLEMS, here=heldout2.HERE)
    assert pts[0].labels["problem"] == "merge_heads" and pts[0].bound_diagram().is_bound
    pts = runner.points(["softmax_odd"], ["fp16"], problems=heldout4.PROBLEMS, here=heldout4.HERE)
    assert pts[0].labels["problem"] == "softmax_odd" and pts[0].bound_diagram().sizes["b"] == 4095


def test_the_problems_that_were_slow_take_their_fast_plans():
    """What this survey found (on an H200, bf16): the sum over two axes side by side folded onto
    wgmma, attention's output projection on wgmma through W's own-axes tensor map."""
    plan = derive(heldout2.contract_two_axes(), "h200", "bf16", sizes=heldout2.PROBLEMS["contract_two_axes"]).plan
    assert plan.folds and plan.kernels[0].kernel.options.engine == "wgmma"
    plan = derive(heldout2.merge_heads(), "h200", "bf16", sizes=heldout2.PROBLEMS["merge_heads"]).plan
    assert plan.kernels[0].kernel.options.engine == "wgmma"


def test_what_the_fourth_survey_found_takes_its_fast_plans():
    """What heldout_survey3 found (on an H200): a batch of 32 x 32 products on 32-row tiles (bf16
    and fp32), X·Xᵀ with the view copied row by row (no transpose), and a sum of everything split
    over hundreds of blocks (their partials combined a warp at a time in the template)."""
    for dtype in ("bf16", "fp32"):
        plan = derive(heldout2.small_bmm(), "h200", dtype, sizes=heldout2.PROBLEMS["small_bmm"], explain=False).plan
        groups = {(r.axis, r.level): r.size for r in plan.kernels[0].kernel.relabels if r.kind == "group"}
        assert (groups[("i", "SMEM")], groups[("j", "SMEM")]) == (32, 32), plan.summary()
    plan = derive(heldout3.gram(), "h200", "bf16", sizes=heldout3.PROBLEMS["gram"], explain=False).plan
    copy = next(k for k in plan.kernels if k.kernel.family == "pointwise")
    assert [k.kernel.family for k in plan.kernels] == ["pointwise", "contraction"]
    assert any(r.axis == "d" and r.size > 1 for r in copy.kernel.relabels), plan.summary()  # rows of d copied whole
    plan = derive(heldout3.sum_1d(), "h200", "bf16", sizes=heldout3.PROBLEMS["sum_1d"], explain=False).plan
    assert plan.families == ("pointwise",) and (plan.kernels[0].kernel.options.splits or 1) > 32


def test_what_the_sixth_survey_found_takes_its_fast_plans():
    """What heldout_survey5 found (on an H200): a max over the first axis of 77 x 16 x 64 x 255 fp32
    ran at 0.68x eager on 32 lanes of fp32 scalars a row (128 contiguous bytes); the column kernel
    now reads 512 contiguous bytes a row (1.0x)."""
    plan = derive(heldout5.max_first_4d(), "h200", "fp32", sizes=heldout5.PROBLEMS["max_first_4d"], explain=False).plan
    groups = {r.axis: r.size for r in plan.kernels[0].kernel.relabels if r.kind == "group" and r.level == "SMEM"}
    assert plan.families == ("pointwise",) and groups["e"] == 128, plan.summary()
