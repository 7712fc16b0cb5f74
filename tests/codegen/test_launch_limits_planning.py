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
    """The mma.sync and SIMT templates put the batch on grid.y and grid.z: past 65535^2 elements
    they say why they cannot be built."""
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=MAX_BATCH + 1, a=16, b=16, c=16)
    mma = next(s for s in FAMILY.candidates(d, "a100-80gb", "bf16") if s.kernels[0].options.engine == "mma.sync")
    assert FAMILY.build_reason(mma, "sm_80") == (f"{MAX_BATCH + 1} batch elements; a launch of the mma.sync "
                                                f"template takes at most {MAX_BATCH}")
    ok = library.get("batched_matmul").with_dtype("bf16").bind(n=MAX_BATCH, a=16, b=16, c=16)
    assert FAMILY.build_reason(next(s for s in FAMILY.candidates(ok, "a100-80gb", "bf16")), "sm_80") is None


def test_a_batch_past_grid_y_folds_into_grid_z():
    """70000 batched products on Ampere stay on the contraction family's grid-bound templates (they
    went to the scalar fallback before): the batch goes on along grid.z, only past 65535."""
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=70000, a=40, b=72, c=24)
    plan = _plan(d, "a100-80gb", "sm_80")
    assert [k.family for k in plan.kernels] == ["contraction"]
    launches = build(plan, arch="sm_80").launches
    main = next(L for L in launches if L.grid[1] > 1)
    assert main.grid[1:] == (35000, 2) and "if (zb >= 70000LL) return;" in main.source
    # both grid-bound templates (fp32 offers SIMT tiles beside mma.sync), split and not
    d32 = library.get("batched_matmul").with_dtype("fp32").bind(n=70000, a=40, b=72, c=24)
    seen = set()
    for s in FAMILY.candidates(d32, "a100-80gb", "fp32"):
        o = s.kernels[0].options
        (L,) = [x for x in FAMILY.lower(d32, s, "sm_80").launches if x.grid[1] > 1]
        assert L.grid[1:] == (35000, 2) and "if (zb >= 70000LL) return;" in L.source, o
        seen.add(o.engine)
    assert seen == {"mma.sync", "simt"}
    small = build(_plan(library.get("batched_matmul").with_dtype("bf16").bind(n=700, a=40, b=72, c=24),
                        "a100-80gb", "sm_80"), arch="sm_80")
    assert all("zb >= " not in L.source for L in small.launches)


def test_attention_past_the_woven_limit_says_why():
    """Past 2^31 - 1 combinations (the kernels number them and their tiles in ints) a schedule says
    why it cannot be built; up to it every count builds (the next test)."""
    from napkin.codegen.families import get

    mha_b = library.get("mha").weave(Axis("b"), name="mha_b")
    d = mha_b.with_dtype("bf16").bind(b=MAX_WOVEN // 32 + 1, h=32, q=16, x=128, d=64)
    att = get("attention")
    s = att.candidates(d, "h200", "bf16")[0]
    assert att.build_reason(s, "sm_90a") == (f"{MAX_WOVEN // 32 * 32 + 32} woven combinations (heads x batch); "
                                             f"a launch takes at most {MAX_WOVEN}")
    small = mha_b.with_dtype("bf16").bind(b=4, h=32, q=16, x=128, d=64)
    assert [k.family for k in _plan(small).kernels] == ["attention"]


FOLD = "blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z"


def test_attention_past_grid_y_folds_the_woven_combinations_into_grid_z():
    """More heads x batch than grid.y holds (65535: window attention over many windows, a large
    decode batch without GQA) stays on the attention kernels, forward and backward, bf16 and fp8:
    the combinations go on along grid.z, and only a launch past 65535 has the fold in its source."""
    from napkin.codegen.families import attention_fp8, get
    from napkin.codegen.program import fold_grid

    mha_b = library.get("mha").weave(Axis("b"), name="mha_b")
    nz = 2049 * 32
    assert fold_grid(nz) == (32784, 2)
    for arch, gpu in (("sm_90a", "h200"), ("sm_80", "a100-80gb")):
        plan = _plan(mha_b.with_dtype("bf16").bind(b=2049, h=32, q=100, x=128, d=64), gpu, arch)
        assert [k.family for k in plan.kernels] == ["attention"], arch
        (main,) = build(plan, arch=arch).launches
        if main.grid[1:] == (1, 1):  # a persistent walk numbers its tiles itself
            assert FOLD not in main.source
        else:
            assert main.grid[1:] == (32784, 2) and FOLD in main.source and f">= {nz}LL) return;" in main.source
        small = build(_plan(mha_b.with_dtype("bf16").bind(b=4, h=32, q=100, x=128, d=64), gpu, arch), arch=arch)
        assert FOLD not in small.launches[0].source
    # the mma.sync forward unsplit, on Hopper too (what the planner takes where wgmma does not fit)
    att = get("attention")
    d = mha_b.with_dtype("bf16").bind(b=2049, h=32, q=100, x=128, d=64)
    mma = next(s for s in att.candidates(d, "h200", "bf16") if s.kernels[0].options.engine != "wgmma")
    (launch,) = att.lower(d, mma, "sm_90a").launches
    assert launch.grid[1:] == (32784, 2) and FOLD in launch.source
    # fp8: the V-transpose pre-pass (one block row a head) and the kernel
    d8 = mha_b.with_dtype("fp8").bind(b=2049, h=32, q=100, x=128, d=128)
    prog = att.lower(d8, attention_fp8.schedule(att, d8, attention_fp8.configs(128)[0]), "sm_90a")
    assert [(L.grid[1:], FOLD in L.source) for L in prog.launches] == [((32784, 2), True)] * 2
    # the backward, on both engines
    from napkin.codegen.families.attention_bwd import FAMILY as BWD

    g = library.get("mha").weave(Axis("b"), name="mha_b").with_dtype("bf16").grad(save={"O", "P_lse"})
    g = g.bind(b=2049, h=32, q=100, x=128, d=64)
    for arch, gpu in (("sm_90a", "h200"), ("sm_80", "a100-80gb")):
        for s in BWD.candidates(g, gpu, "bf16")[:2]:
            main = [L for L in BWD.lower(g, s, arch).launches if L.grid[1] > 1]
            assert [(L.grid[1:], FOLD in L.source) for L in main] == [((32784, 2), True)], (arch, s)


def test_a_wgmma_configuration_says_it_needs_sm_90a():
    from napkin.codegen.families import get

    att = get("attention")
    d = library.get("attention").with_dtype("bf16").bind(q=1024, x=1024, d=128)
    s = next(s for s in att.candidates(d, "h200", "bf16") if s.kernels[0].options.engine == "wgmma")
    assert att.build_reason(s, "sm_80") == "its wgmma kernels need sm_90a, not sm_80"
    assert att.build_reason(s, "sm_90a") is None
