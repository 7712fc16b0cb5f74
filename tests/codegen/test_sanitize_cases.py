"""The sanitizer cases (benchmarks/sanitize.py) cover every kernel template, on Hopper and Ampere.

compute-sanitizer runs only on the GPU machine, so what it covers is decided here, without a GPU:
each case is planned for an H100 and an H200 (sm_90a) and an A100 (sm_80) and must use the template it names,
and the cases together must name every template in ``napkin/codegen/templates``. A new template
without a sanitizer case fails this test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from napkin_test_support import sanitize_module

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(p.name for p in (ROOT / "napkin" / "codegen" / "templates").glob("*.cu.jinja"))
# every profile a target's machines plan with: the GPU machine plans for the GPU it finds
GPUS_OF_TARGET = {"sm_90a": ("h100", "h200"), "sm_80": ("a100",)}


def hopper_only(template: str) -> bool:
    """Templates only sm_90a plans: the wgmma kernels and the fp8 attention's pre-pass."""
    return "wgmma" in template or "fp8" in template


SANITIZE = sanitize_module()


@pytest.mark.parametrize("target", sorted(GPUS_OF_TARGET))
def test_every_template_has_a_sanitizer_case(target):
    named = {c.template for c in SANITIZE.CASES if target in c.archs}
    # wgmma and fp8 tensor cores exist only on Hopper: Ampere needs every other template
    expected = {t for t in TEMPLATES if target == "sm_90a" or not hopper_only(t)}
    assert expected <= named, f"templates without a sanitizer case on {target}: {sorted(expected - named)}"


@pytest.mark.parametrize("case", SANITIZE.CASES, ids=lambda c: f"{c.template}-{c.name}-{c.dtype}")
def test_each_case_plans_the_template_it_is_there_for(case):
    for target in case.archs:
        for gpu in GPUS_OF_TARGET[target]:
            k = case.compile(gpu=gpu)
            assert case.template in SANITIZE.templates_of(k), (target, gpu, SANITIZE.templates_of(k))


def test_the_target_of_a_device_arch():
    assert SANITIZE.target("sm_90a") == "sm_90a"
    assert SANITIZE.target("sm_80") == "sm_80"
    assert SANITIZE.target("sm_86") == "sm_80"


def test_only_and_skip_pick_cases_by_template_or_name():
    cases = SANITIZE.CASES
    bwd = [c for c in cases if SANITIZE._picked(c, ["attention_bwd_wgmma"], [])]
    assert bwd and all("attention_bwd_wgmma" in c.template for c in bwd)
    rest = [c for c in cases if SANITIZE._picked(c, [], ["attention_bwd_wgmma"])]
    assert len(rest) + len(bwd) == len(cases) and not set(map(id, rest)) & set(map(id, bwd))
    by_name = [c for c in cases if SANITIZE._picked(c, ["column_sum"], [])]
    assert by_name and all(c.name == "column_sum" for c in by_name)
