"""Kernel options a family does not read are refused, not dropped (CPU only).

Every family names the :class:`~napkin.perfmodel.schedule.KernelOptions` fields its schedules carry
and its templates read (``options_read``). A hand-written schedule, or a plan read back from a
file, that sets another field on a kernel (``row_in_smem`` on a contraction, ``swap_ab`` on a
row-wise kernel) would otherwise lower as if the option were not there: planning and lowering
refuse it with one line naming the kernel, the family and the option.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from napkin.codegen import families
from napkin.codegen.lower import build, lower, prepare
from napkin.codegen.partition import kernel_problem
from napkin.codegen.planner import derive
from napkin.codegen.program import check_options
from napkin.diagrams import library
from napkin.errors import CodegenError, NapkinError
from napkin.perfmodel.schedule import KernelOptions

FIELDS = {f.name for f in dataclasses.fields(KernelOptions)}


def _registered():
    return [families.get(n) for n in families.ORDER]


def test_every_family_names_the_options_it_reads():
    for fam in _registered():
        read = fam.options_read
        assert isinstance(read, frozenset) and read and read <= FIELDS, fam.name


# the library at its default sizes, and shapes that reach the options only some configurations set:
# skinny products split over a cluster, batched products, long rows streamed or kept over a cluster,
# attention at d = 128 and in decode
EXTRA = [
    ("matvec", dict(a=4096, b=4096), "bf16", "h200"),
    ("matmul", dict(a=4, b=4096, c=4096), "bf16", "h200"),
    ("matmul", dict(a=64, b=11008, c=4096), "bf16", "h200"),
    ("matmul", dict(a=256, b=131072, c=256), "bf16", "h200"),
    ("batched_matmul", dict(n=8, a=1000, b=72, c=24), "fp32", "a100"),
    ("log_softmax", dict(r=2048, x=151936), "bf16", "h200"),
    ("softmax", dict(r=4096, x=65536), "fp32", "h200"),
    ("attention", dict(q=4096, x=4096, d=128), "bf16", "h200"),
    ("mha", dict(h=32, q=1, x=8192, d=128), "bf16", "h200"),
]


def _points():
    out = []
    for name in library.names():
        sizes = dict(library.entry(name).default_sizes)
        for dt, gpu in (("bf16", "h200"), ("fp32", "a100")):
            out.append((name, sizes, dt, gpu))
    return out + EXTRA


def _takes(fam, d) -> bool:
    return fam.name != "fallback" and (fam.explain(d) is None if hasattr(fam, "explain") else fam.matches(d))


def _candidates(d, gpu, dtype):
    """(family, sub-diagram, schedule) of every candidate of every family that takes ``d`` whole,
    and of every family that takes a kernel of its plan (the sub-diagram that kernel computes; the
    plan's diagram may be the written-out one)."""
    plan = derive(d, gpu, explain=False).plan
    for sub in [d] + [kernel_problem(plan.diagram, pk.kernel.boxes, pk.name)[0] for pk in plan.kernels]:
        for fam in _registered():
            if not _takes(fam, sub):
                continue
            try:
                cands = fam.candidates(sub, gpu, dtype)
            except NapkinError:
                continue  # a family may refuse at this step too (the planner takes that as its no)
            yield from ((fam, sub, s) for s in cands)


def _candidate_options(d, gpu, dtype):
    """(family, kernel, options) of each kernel of ``d``'s plan and of every candidate."""
    plan = derive(d, gpu, explain=False).plan
    out = [(families.get(pk.family), pk.name, pk.kernel.options) for pk in plan.kernels]
    return out + [(fam, k.name, k.options) for fam, _, s in _candidates(d, gpu, dtype) for k in s.kernels]


@pytest.mark.parametrize("name,sizes,dtype,gpu", _points(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_candidate_sets_only_options_its_family_reads(name, sizes, dtype, gpu):
    d = library.get(name)
    d = prepare(d, sizes={k: v for k, v in sizes.items() if k in d.axes}, dtype=dtype)
    found = _candidate_options(d, gpu, dtype)
    assert found
    for fam, kernel, options in found:
        set_ = set(options.to_dict())
        assert set_ <= fam.options_read, (fam.name, kernel, sorted(set_ - fam.options_read))
        check_options(fam, kernel, options)


def test_the_shapes_reach_the_rarer_options():
    """The extra points are there for the options few configurations set: each is set by some
    candidate (otherwise the test above would not look at it)."""
    wanted = {"cluster", "swap_ab", "streamed", "row_in_smem", "splits", "warpgroups", "threads_per_row"}
    got = set()
    for name, sizes, dtype, gpu in EXTRA:
        d = prepare(library.get(name), sizes=sizes, dtype=dtype)
        for _, _, options in _candidate_options(d, gpu, dtype):
            got |= set(options.to_dict())
    assert wanted <= got, sorted(wanted - got)


def _one_kernel(name, sizes, dtype="bf16", gpu="h100"):
    d = prepare(library.get(name), sizes=sizes, dtype=dtype)
    return d, derive(d, gpu, explain=False).plan


@pytest.mark.parametrize("name,sizes,family,stray", [
    ("matmul", dict(a=256, b=256, c=256), "contraction", dict(row_in_smem=True)),
    ("softmax", dict(r=64, x=1024), "rowwise", dict(swap_ab=True)),
    ("matvec", dict(a=512, b=512), "pointwise", dict(persistent=True, cluster=2)),
    ("attention", dict(q=256, x=256, d=64), "attention", dict(streamed=True)),
])
def test_a_hand_written_schedule_with_an_option_its_family_ignores_is_refused(name, sizes, family, stray):
    d, plan = _one_kernel(name, sizes)
    assert plan.kernels[0].family == family
    k = plan.kernels[0].kernel
    bad = k.replace(options=dataclasses.replace(k.options, **stray))
    sched = plan.schedule.replace(kernels=(bad,))
    given = ", ".join(f"{o}={v}" for o, v in stray.items())
    with pytest.raises(CodegenError, match=rf"kernel {k.name}: family {family} does not read options? {given} "
                                           r"\(it reads [a-z_, ]+\)$"):
        lower(d, sched)
    # a plan that carries it (read back from a file, built by hand) is refused when it is built
    pk = dataclasses.replace(plan.kernels[0], kernel=bad)
    with pytest.raises(CodegenError, match=rf"family {family} does not read"):
        build(dataclasses.replace(plan, kernels=(pk,)))
    # the options the family does read still lower
    assert lower(d, plan.schedule).launches


def test_a_family_registered_from_outside_is_taken_at_its_word():
    class Outside:
        name = "outside"

    check_options(Outside(), "k0", KernelOptions(swap_ab=True, cluster=4))
    with pytest.raises(CodegenError, match="family fallback does not read options stages=3, splits=2"):
        check_options(families.get("fallback"), "k0", KernelOptions(engine="scalar", stages=3, splits=2))


def _with_options(name, sizes, gpu, **extra):
    """The plan of a library diagram, its first kernel's options updated with ``extra``."""
    d = prepare(library.get(name), sizes=sizes, dtype="bf16")
    plan = derive(d, gpu, explain=False).plan
    k = plan.kernels[0].kernel
    pk = dataclasses.replace(plan.kernels[0], kernel=k.replace(options=dataclasses.replace(k.options, **extra)))
    return dataclasses.replace(plan, kernels=(pk, *plan.kernels[1:]))


@pytest.mark.parametrize("extra", [dict(stages=2), dict(streamed=True), dict(row_in_smem=True), dict(cluster=2),
                                   dict(splits=4), dict(blocks_per_sm=2)], ids=lambda e: next(iter(e)))
def test_a_row_in_registers_refuses_the_chain_kernels_options(extra):
    """The row-wise family reads these fields, but only on its chain kernels: the softmax box's
    kernel (its row in registers) is refused them rather than built without them."""
    plan = _with_options("softmax", dict(r=64, x=1024), "h100", **extra)
    assert plan.kernels[0].family == "rowwise"
    with pytest.raises(CodegenError, match=r"rowwise: the softmax kernel holds its row in registers and takes "
                                           r"threads_per_row and warps, not "):
        build(plan)


def test_a_streamed_row_takes_streamed_alone_and_refuses_a_budget_cut():
    plan = _with_options("softmax", dict(r=64, x=200000), "h200")
    opts = plan.kernels[0].kernel.options
    assert opts.streamed and opts.stages and opts.cluster and opts.row_in_smem
    # streamed without stages streams (the first of the chunk counts), as with column reductions
    from napkin.codegen.families.rowwise import STREAM_UNROLLS

    # (the register budget follows from the chunks in flight: left out, it is the family's)
    (k,) = build(_with_options("softmax", dict(r=64, x=200000), "h200", stages=None, regs_per_thread=None)).launches
    (want,) = build(_with_options("softmax", dict(r=64, x=200000), "h200", stages=STREAM_UNROLLS[0],
                                  regs_per_thread=None)).launches
    assert k.source == want.source and k.grid == want.grid and k.block == want.block
    with pytest.raises(CodegenError, match=r"blocks_per_sm \(a register budget cut\) only with column reductions"):
        build(_with_options("softmax", dict(r=64, x=200000), "h200", blocks_per_sm=2))


def test_column_reductions_refuse_a_kept_row():
    d = prepare(library.get("rmsnorm").grad(save={"N_rstd"}), sizes=dict(r=4096, x=4096), dtype="bf16")
    plan = derive(d, "h200", explain=False).plan
    (pk,) = [p for p in plan.kernels if p.family == "rowwise"]
    k = pk.kernel
    assert k.options.splits  # the norm backward's column reductions (dgamma)
    bad = dataclasses.replace(plan, kernels=tuple(
        dataclasses.replace(p, kernel=k.replace(options=dataclasses.replace(k.options, row_in_smem=True)))
        if p is pk else p for p in plan.kernels))
    with pytest.raises(CodegenError, match="row_in_smem and cluster keep a streamed row without column reductions"):
        build(bad)


@pytest.mark.parametrize("name,sizes,dtype,gpu", _points(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_candidate_lowers_with_the_options_it_carries(name, sizes, dtype, gpu):
    """A family's own candidates carry the options of the configuration they were made from, so
    lowering one (what the planner, ``benchmarks/candidates.py`` and the GPU tests do) never meets
    :func:`~napkin.codegen.program.check_derived`'s refusal."""
    from napkin.perfmodel.hardware import get_gpu

    d = library.get(name)
    d = prepare(d, sizes={k: v for k, v in sizes.items() if k in d.axes}, dtype=dtype)
    arch = get_gpu(gpu).arch
    lowered = 0
    for fam, sub, s in _candidates(d, gpu, dtype):
        try:
            fam.lower(sub, s, arch)
            lowered += 1
        except CodegenError as e:  # (a candidate that does not build for this arch says why)
            assert "from this schedule, not" not in str(e), (fam.name, s.kernels[0].options, str(e))
    assert lowered


@pytest.mark.parametrize("name,sizes,gpu,extra,built", [
    ("matmul", dict(a=1024, b=1024, c=1024), "a100", dict(warpgroups=2), "no warpgroups"),  # mma.sync
    ("matmul", dict(a=1024, b=1024, c=1024), "a100", dict(warps=2), "warps=4"),          # the tiles' warps
    ("matmul", dict(a=1024, b=1024, c=1024), "h200", dict(warps=2), "no warps"),         # wgmma
    ("matmul", dict(a=1024, b=1024, c=1024), "h200", dict(regs_per_thread=100), "regs_per_thread=240"),
    ("attention", dict(q=1024, x=1024, d=64), "a100", dict(persistent=True), "no persistent"),
    ("softmax", dict(r=64, x=1024), "h100", dict(warps=16, regs_per_thread=20), "regs_per_thread="),
    ("matvec", dict(a=4096, b=4096), "h200", dict(stages=2), "regs_per_thread="),
])
def test_an_option_the_configuration_does_not_follow_is_refused(name, sizes, gpu, extra, built):
    """Options the family's configuration decides (the warps of mma.sync tiles, a register budget)
    or does not have (warpgroups on mma.sync, a persistent mma.sync attention) are compared with
    what it builds from the schedule: a value it would not follow is an error that says what it
    builds, and taking the derived field out builds the kernel."""
    plan = _with_options(name, sizes, gpu, **extra)
    with pytest.raises(CodegenError, match=rf"kernel \w+: the {plan.kernels[0].family} family builds "
                                           rf"{re.escape(built)}.* from this schedule, not .*leave an option out"):
        build(plan)


def test_a_derived_field_left_out_takes_the_family_s():
    """Changing what the configuration is made from (the pointwise kernel's vectors in flight)
    changes its register budget: the plan that keeps the old budget is refused, the one that
    leaves it out builds, with the new one."""
    plan = _with_options("matvec", dict(a=4096, b=4096), "h200", stages=2, regs_per_thread=None)
    (k,) = build(plan).launches
    assert k.model_regs_per_thread and k.model_regs_per_thread != _with_options(
        "matvec", dict(a=4096, b=4096), "h200").kernels[0].kernel.options.regs_per_thread
