"""Launch limits at planning: a family whose kernel cannot take a problem's batch (more batch
elements than a launch's grid.y, more woven heads x batch than an attention launch walks) builds
no candidate for it, so derive presents only plans that generate can build, and the plan says why
the kernel went elsewhere."""

from __future__ import annotations

from napkin.codegen.families.attention_problem import MAX_WOVEN
from napkin.codegen.families.contraction import FAMILY, MAX_BATCH
from napkin.codegen.lower import build
from napkin.codegen.planner import derive
from napkin.diagrams import Axis, library
from napkin.perfmodel.hardware import get_gpu


def _plan(d, gpu="h200", arch="sm_90a"):
    r = derive(d, get_gpu(gpu), "bf16", arch=arch)
    build(r.plan, arch=arch)  # (raised CodegenError before: the batch was past the launch's limit)
    return r.plan


def test_a_batch_past_the_launch_limit_leaves_the_grid_bound_templates():
    """The mma.sync and SIMT templates put the batch on grid.y; the wgmma template numbers it in its
    persistent work items, so Hopper keeps the contraction family and Ampere does not."""
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=MAX_BATCH + 1, a=16, b=16, c=16)
    mma = next(s for s in FAMILY.candidates(d, "a100-80gb", "bf16") if s.kernels[0].options.engine == "mma.sync")
    assert FAMILY.build_reason(mma, "sm_80") == (f"{MAX_BATCH + 1} batch elements; a launch of the mma.sync "
                                                f"template takes at most {MAX_BATCH}")
    wg = next(s for s in FAMILY.candidates(d, "h200", "bf16") if s.kernels[0].options.engine == "wgmma")
    assert FAMILY.build_reason(wg, "sm_90a") is None
    plan = _plan(d, "a100-80gb", "sm_80")
    assert all(k.family != "contraction" for k in plan.kernels)
    assert any("a launch of the mma.sync template takes at most" in k.why for k in plan.kernels)
    assert {(k.family, k.kernel.options.engine) for k in _plan(d).kernels} == {("contraction", "wgmma")}
    # at the limit the mma.sync template still builds it
    ok = library.get("batched_matmul").with_dtype("bf16").bind(n=MAX_BATCH, a=16, b=16, c=16)
    assert FAMILY.build_reason(next(s for s in FAMILY.candidates(ok, "a100-80gb", "bf16")), "sm_80") is None


def test_attention_past_the_woven_limit_plans_what_builds():
    mha_b = library.get("mha").weave(Axis("b"), name="mha_b")
    d = mha_b.with_dtype("bf16").bind(b=MAX_WOVEN // 32 + 1, h=32, q=16, x=128, d=64)
    from napkin.codegen.families import get

    att = get("attention")
    s = att.candidates(d, "h200", "bf16")[0]
    assert att.build_reason(s, "sm_90a") == (f"{MAX_WOVEN // 32 * 32 + 32} woven combinations (heads x batch); "
                                             f"a launch takes at most {MAX_WOVEN}")
    plan = _plan(d)
    assert all(k.family != "attention" for k in plan.kernels)
    small = mha_b.with_dtype("bf16").bind(b=4, h=32, q=16, x=128, d=64)
    assert [k.family for k in _plan(small).kernels] == ["attention"]


def test_a_wgmma_configuration_says_it_needs_sm_90a():
    from napkin.codegen.families import get

    att = get("attention")
    d = library.get("attention").with_dtype("bf16").bind(q=1024, x=1024, d=128)
    s = next(s for s in att.candidates(d, "h200", "bf16") if s.kernels[0].options.engine == "wgmma")
    assert att.build_reason(s, "sm_80") == "its wgmma kernels need sm_90a, not sm_80"
    assert att.build_reason(s, "sm_90a") is None
