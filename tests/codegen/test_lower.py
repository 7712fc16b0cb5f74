"""Lowering, family dispatch, schedule selection and source generation (CPU only)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from napkin.codegen import families
from napkin.codegen import select as sel
from napkin.codegen.families import fallback, rowwise
from napkin.codegen.generate import generate_source
from napkin.codegen.lower import check_program, lower, prepare
from napkin.codegen.planner import derive
from napkin.codegen.program import Program
from napkin.codegen.verify import VerifyReport, VerifyRow, default_shapes
from napkin.diagrams import Axis, Diagram, array, causal, contract, layernorm, library, scale, softmax
from napkin.errors import CodegenError, DiagramError, NapkinError, ScheduleError
from napkin.perfmodel.schedule import KernelOptions, Schedule

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(a=5, b=7, c=3, n=2, r=3, x=9, q=6, d=4, h=2, j=3, e=12, f=7, g=2, s=5)


def small_sizes(d):
    return {k: v for k, v in SMALL.items() if k in d.axes}


def masked_softmax() -> Diagram:
    h, q, x = Axis("h"), Axis("q"), Axis("x")
    S = array("S", h, q, x)
    return Diagram("masked_softmax", softmax(causal(scale(S, 0.125), "q", "x"), over="x", name="P"))


def residual_layernorm() -> Diagram:
    """Y = layernorm(X + R)·g + b scaled per row by s; U = X + R is a second output."""
    r, x = Axis("r"), Axis("x")
    X, R, g, b, s = array("X", r, x), array("R", r, x), array("g", x), array("b", x), array("s", r)
    U = (X + R).named("U")
    Z = ((layernorm(U, over=x, name="N") * g + b) * s).named("Z")
    return Diagram("resid_ln", (Z, U))


# ----------------------------------------------------------------------------- fallback


@pytest.mark.parametrize("name", library.names())
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_fallback_lowers_every_library_diagram(name, dtype):
    d = library.get(name)
    p = lower(d, sizes=small_sizes(d), dtype=dtype, family="fallback", gpu="h100")
    assert p.family == "fallback"
    check_program(p)
    boxes = [v for v in p.diagram.nodes if v.op.kind != "rename"]
    assert len(p.launches) >= len(boxes)
    for k in p.launches:
        assert 'extern "C" __global__' in k.source and '#include "napkin.cuh"' in k.source
        assert "Legend" in k.source and "tunables" in k.source
        assert k.model_regs_per_thread and k.model_smem_bytes == 0
    # every kernel is one box on the fallback; every box (renames are views) has its kernel
    assert set(p.plan.families) == {"fallback"}
    assert all(len([b for b in k.boxes if p.diagram.value(b).op.kind != "rename"]) == 1 for k in p.plan.kernels)
    assert {b for k in p.plan.kernels for b in k.boxes} == {p.diagram.name_of(v) for v in p.diagram.nodes}
    # intermediates are HBM buffers in their own dtype (the diagram's); inputs and outputs keep it too
    outs = set(p.diagram.output_names)
    assert {b.name for b in p.buffers} == {p.diagram.name_of(v) for v in boxes} - outs
    for b in p.buffers:
        assert b.dtype == p.diagram.value(b.name).dtype == dtype
    for k in p.launches:
        for a in k.args:
            if a.name in outs or a.name in p.diagram.input_names:
                assert a.dtype == dtype


def test_fallback_rename_is_a_view():
    d = prepare(library.get("transformer_block"), sizes=dict(q=5, e=12, h=2, d=4, f=7))
    p = lower(d, family="fallback")
    renames = [d.name_of(v) for v in d.nodes if v.op.kind == "rename"]
    assert renames
    for r in renames:
        assert r not in {b.name for b in p.buffers}
        assert not any(k.name.endswith("_" + r) for k in p.launches)
    assert p.launches[-1].name.endswith("_Y")


def test_fallback_copies_an_output_that_is_a_view():
    q, e = Axis("q"), Axis("e")
    X = array("X", q, e)
    from napkin.diagrams import rename

    d = Diagram("view_out", rename(X, q="t", name="T"))
    p = lower(d, sizes={"q": 3, "e": 4}, family="fallback")
    assert len(p.launches) == 1 and p.launches[0].args[-1].name == "T"


def test_fallback_schedule_has_one_kernel_per_box():
    d = prepare(library.get("attention_causal"), sizes=dict(h=2, q=5, x=5, d=4))
    s = fallback.fallback_schedule(d, "h100")
    real = [v for v in d.nodes if v.op.kind != "rename"]
    assert len(s.kernels) == len(real)


# ----------------------------------------------------------------------------- rowwise


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("x", [1000, 4095, 32768])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_rowwise_takes_library_rowwise_ops(name, x, dtype):
    p = lower(library.get(name), sizes={"r": 7, "x": x}, dtype=dtype, gpu="h100")
    if (name, x, dtype) == ("layernorm", 32768, "fp32"):
        # 32 fp32 values, gamma and beta vectors need more than the 64 registers of a
        # 1024-thread block (a known limit of the family): rowwise runs the norm with what fits,
        # and the last elementwise box runs as a pointwise kernel
        assert p.family == "rowwise+pointwise"
        rw, pw = p.plan.kernels
        assert rw.family == "rowwise" and "N" in rw.boxes
        assert pw.family == "pointwise" and pw.boxes == ("Y",)
        assert len(p.launches) == 2 and [b.name for b in p.buffers] == [rw.boxes[-1]]
        assert not any("scalar fallback" in n for n in p.notes)
        return
    assert p.family == "rowwise" and len(p.launches) == 1
    k = p.launches[0]
    tun = dict(k.tunables)
    assert tun["VEC"] == (4 if dtype == "fp32" else 8)
    assert tun["CHUNKS_PER_THREAD"] * tun["VEC"] <= rowwise.MAX_VALUES_PER_THREAD
    assert tun["CHUNKS_PER_THREAD"] * tun["VEC"] * tun["THREADS_PER_ROW"] >= x
    assert k.threads % 32 == 0 and k.threads <= 1024
    assert k.grid[0] == math.ceil(7 / tun["ROWS_PER_BLOCK"])
    assert "NAPKIN_MAXNREG(" in k.source and "load_vec" in k.source and "store_vec" in k.source
    assert not p.buffers


def test_rowwise_custom_prologue_and_epilogue():
    p = lower(masked_softmax(), sizes=dict(h=3, q=37, x=37))
    assert p.family == "rowwise"
    src = p.launches[0].source
    assert "(a_S * 0.125f)" in src and "i_q" in src and "-INFINITY" in src
    p = lower(residual_layernorm(), sizes=dict(r=5, x=300))
    assert p.family == "rowwise"
    src = p.launches[0].source
    assert "k_U[c][e]" in src and "r_s" in src
    assert len(p.launches) == 1 and not p.buffers
    args = [a.name for a in p.launches[0].args]
    assert args[:5] == ["X", "R", "g", "b", "s"] and sorted(args[5:]) == ["U", "Z"]  # outputs are bound by name


@pytest.mark.parametrize("name", ["matmul", "attention", "mha", "transformer_block", "mlp"])
def test_rowwise_declines_other_diagrams(name):
    d = prepare(library.get(name), sizes=small_sizes(library.get(name)))
    assert not rowwise.FAMILY.matches(d)


def test_rowwise_declines_non_contiguous_rows_and_too_long_rows():
    r, x = Axis("r", 8), Axis("x", 64)
    d = Diagram("colmajor", softmax(array("X", x, r), over="x", name="P"))
    assert "innermost" in rowwise.FAMILY.explain(d)
    p = lower(d)  # written out as reductions and maps the pointwise family runs
    assert "fallback" not in p.plan.families and p.plan.expanded == ("P",), p.plan
    long = prepare(library.get("softmax"), sizes={"r": 2, "x": 1 << 20})
    assert not rowwise.FAMILY.matches(long)
    assert "fallback" not in lower(long).plan.families


def test_rowwise_schedule_round_trip():
    d = prepare(library.get("layernorm"), sizes={"r": 300, "x": 2048})
    ranked = sel.rank_candidates(d, "rowwise", "h100", "bf16")
    assert len(ranked) >= 2
    secs = [t for _, t in ranked]
    assert secs == sorted(secs) and all(t > 0 for t in secs)
    best = ranked[0][0]
    auto = lower(d, gpu="h100")
    # the planner's one kernel is the family's best configuration (the kernel is named by its box)
    (k,) = auto.schedule.kernels
    b = best.kernels[0]
    assert (k.family, k.boxes, k.relabels, k.options) == ("rowwise", b.boxes, b.relabels, b.options)
    again = lower(d, best.replace(kernels=(b.replace(name=k.name),)), gpu="h100")  # as given
    assert again.plan.kernels[0].kernel == k
    assert again.launches[0].source == auto.launches[0].source
    # every candidate lowers to the configuration its typed options name
    for s, _ in ranked:
        o = s.kernels[0].options
        assert s.kernels[0].family == "rowwise" and not s.notes
        k = rowwise.FAMILY.lower(d, s, "sm_90a").launches[0]
        assert dict(k.tunables)["THREADS_PER_ROW"] == o.threads_per_row
        assert k.threads == 32 * o.warps


def test_rowwise_schedules_pass_legality():
    from napkin.perfmodel.legality import analyze

    d = prepare(masked_softmax(), sizes=dict(h=3, q=40, x=40))
    for s in rowwise.FAMILY.candidates(d, "h100", "bf16"):
        analyze(s)


def test_user_schedule_without_notes_lowers():
    d = prepare(library.get("rmsnorm"), sizes={"r": 64, "x": 512})
    s = Schedule.fused(d, groups={"r": 4})
    p = lower(d, s, family="rowwise")
    assert dict(p.launches[0].tunables)["ROWS_PER_BLOCK"] == 4


def test_a_multi_kernel_schedule_lowers_each_kernel_by_its_family():
    d = prepare(library.get("layernorm"), sizes={"r": 8, "x": 64})
    s = fallback.fallback_schedule(d, "h100")
    assert len(s.kernels) == 3 and {k.family for k in s.kernels} == {"fallback"}
    p = lower(d, s)  # as given: every kernel on the family it names
    assert p.family == "fallback" and p.plan.families == ("fallback",) * 3 and len(p.launches) == 3
    assert {b.name for b in p.buffers} == {"N", "mul"}
    # without families (nor the fallback's options, which only the fallback reads), each kernel
    # goes to the first family that takes its sub-diagram
    with pytest.raises(CodegenError, match=r"kernel k0_N: family rowwise does not read option engine=scalar"):
        lower(d, s.replace(kernels=tuple(k.replace(family=None) for k in s.kernels)))
    bare = s.replace(kernels=tuple(k.replace(family=None, options=KernelOptions()) for k in s.kernels))
    p = lower(d, bare)
    assert p.plan.families == ("rowwise", "pointwise", "pointwise") and p.family == "rowwise+pointwise"
    assert len(p.launches) == 3 and {b.name for b in p.buffers} == {"N", "mul"}
    # a named family that cannot build one of the kernels is refused, naming the kernel
    with pytest.raises(CodegenError, match=r"family rowwise cannot generate kernel k1_mul of 'layernorm'"):
        lower(d, bare, family="rowwise")


# ----------------------------------------------------------------------------- selection


def test_rank_without_cost_model_uses_local_estimate(monkeypatch):
    monkeypatch.setattr(sel, "_cost_fn", lambda: (None, "not written yet"))
    d = prepare(library.get("softmax"), sizes={"r": 4096, "x": 4096})
    ranked = sel.rank(d, "rowwise", "h100", "bf16")
    assert all(r.source == "local" for r in ranked)
    bytes_moved = 2 * 4096 * 4096 * 2
    assert ranked[0].seconds >= bytes_moved / 3.35e12
    assert lower(d, gpu="h100").family == "rowwise"


def test_rank_with_cost_model_when_available():
    d = prepare(library.get("softmax"), sizes={"r": 4096, "x": 4096})
    ranked = sel.rank(d, "rowwise", "h100", "bf16")
    try:
        import napkin.perfmodel.cost  # noqa: F401
    except ImportError:
        pytest.skip("cost model not in this checkout")
    assert ranked[0].source == "cost"
    # one pass over HBM: at least the bytes of X and P at the datasheet rate
    assert ranked[0].seconds >= 2 * 4096 * 4096 * 2 / 3.35e12


def test_rank_fallback_has_one_candidate():
    d = prepare(library.get("gqa"), sizes=small_sizes(library.get("gqa")))
    ranked = sel.rank_candidates(d, "fallback", "h100", "bf16")
    assert len(ranked) == 1 and ranked[0][1] > 0


# ----------------------------------------------------------------------------- families


def test_family_order_and_lookup():
    assert families.ORDER == ("rowwise", "contraction", "attention", "attention_bwd", "pointwise", "fallback")
    assert families.get("rowwise") is rowwise.FAMILY
    assert families.get("fallback") is fallback.FAMILY
    with pytest.raises(CodegenError, match="unknown"):
        families.get("nope")


def test_a_family_that_fails_to_import_does_not_break_the_others(monkeypatch):
    monkeypatch.setattr(families, "ORDER", ("rowwise", "does_not_exist", "fallback"))
    families.reset()
    try:
        avail = [f.name for f in families.available()]
        assert avail == ["rowwise", "fallback"]
        assert "does_not_exist" in families.import_errors()
        with pytest.raises(CodegenError, match="not available"):
            families.get("does_not_exist")
        d = prepare(library.get("matmul"), sizes={"a": 4, "b": 4, "c": 4})
        assert lower(d).family == "fallback"
    finally:
        monkeypatch.undo()
        families.reset()


class _Broken:
    name = "broken"

    def matches(self, diagram):
        return True

    def candidates(self, diagram, gpu, dtype):
        return [fallback.fallback_schedule(diagram, gpu, dtype)]

    def lower(self, diagram, schedule, arch):
        raise RuntimeError("template missing")


def test_a_family_that_fails_raises_naming_the_family_and_kernel():
    families.register(_Broken(), before="rowwise")
    try:
        d = prepare(library.get("softmax"), sizes={"r": 4, "x": 64})
        plan = derive(d, "h100", explain=False).plan
        assert plan.families == ("broken",)  # the planner ranks it like any family ...
        # ... and its failure is an error naming it and the kernel, never a silent hand-over
        with pytest.raises(CodegenError, match=r"family broken failed on kernel P of 'softmax': "
                                               r"RuntimeError: template missing"):
            lower(d)
        with pytest.raises(CodegenError, match="family broken failed on kernel P.*template missing"):
            lower(d, family="broken")
        assert lower(d, family="rowwise").family == "rowwise"
    finally:
        families.unregister("broken")


def test_named_family_that_does_not_match_says_why():
    d = prepare(library.get("matmul"), sizes={"a": 4, "b": 4, "c": 4})
    with pytest.raises(ScheduleError, match=r"derive found no kernel that runs box 'C' of 'matmul'.*"
                                            r"rowwise: needs exactly one softmax or norm box"):
        lower(d, family="rowwise")


# ----------------------------------------------------------------------------- plans of several kernels


def test_a_composed_diagram_plans_each_kernel_on_a_family():
    """A transformer block: several kernels, each built by its family from its own sub-diagram,
    every box in one kernel, launches for every kernel, the intermediates between kernels in HBM
    buffers of their own dtype."""
    d = prepare(library.get("transformer_block"), sizes=dict(q=64, e=128, h=2, d=64, f=256), dtype="bf16")
    p = lower(d, gpu="h100")
    plan = p.plan
    assert len(plan.kernels) > 1 and p.family == "+".join(dict.fromkeys(plan.families))
    assert sorted(b for k in plan.kernels for b in k.boxes) == sorted(d.name_of(v) for v in d.nodes)
    assert len(p.launches) >= len(plan.kernels)
    renames = {d.name_of(v) for v in d.nodes if v.op.kind == "rename"}
    computed = {d.name_of(v) for v in d.nodes} - renames
    for b in p.buffers:
        assert b.name in computed and b.name not in d.output_names and b.dtype == d.value(b.name).dtype
    assert {"rowwise", "contraction", "attention"} <= set(plan.families), plan
    # every kernel on a fast family: the output projection A = Σ_{h,d} O·Wo, a sum over two axes,
    # is a contraction that walks h around its stream of d
    assert not [k for k in plan.kernels if k.family == "fallback"], plan
    a = next(k for k in plan.kernels if "A" in k.boxes)
    assert a.family == "contraction" and not any("scalar fallback" in n for n in p.notes)


def test_a_kernel_no_fast_family_builds_is_said_aloud():
    """Only boxes that no fast family builds run on the fallback, and the program says so: a sum
    over (h, d) whose operands keep different contracted axes contiguous runs on a copy of B the
    contraction family reads; a matmul whose rows pass 32-bit indices stays on the fallback."""
    a, c, h, dd = Axis("a"), Axis("c"), Axis("h"), Axis("d")
    odd = Diagram("odd", contract(array("A", a, h, dd), array("B", c, dd, h), over=(h, dd), out=(a, c), name="Y"))
    d = prepare(odd, sizes=dict(a=64, c=64, h=4, d=32), dtype="bf16")
    p = lower(d, gpu="h100")
    assert "fallback" not in p.plan.families and "contraction" in p.plan.families, p.plan
    assert not any("fallback" in n for n in p.notes)
    assert p.plan.expanded == ("Y",)
    big = prepare(library.get("matmul"), sizes=dict(a=2 ** 31 - 10, b=64, c=64), dtype="bf16")
    p = lower(big, gpu="h100")
    slow = [k for k in p.plan.kernels if k.family == "fallback"]
    assert [k.boxes for k in slow] == [("C",)], p.plan
    assert "32-bit" in slow[0].why
    assert any("scalar fallback" in n and "C" in n for n in p.notes)


def test_a_plan_lowers_as_given():
    d = prepare(library.get("attention"), sizes=dict(q=256, x=256, d=64), dtype="bf16")
    plan = derive(d, "h100", explain=False).plan
    p = lower(plan)
    assert p.plan == plan and p.schedule == plan.schedule
    again = lower(d, gpu="h100")
    assert [l.source for l in again.launches] == [l.source for l in p.launches]


def test_a_long_diagram_name_still_plans():
    """A diagram name of 32 characters is valid: the kernels' sub-diagrams must still be nameable
    (napkin bug: kernel_problem names them <diagram>_<kernel>, past the 32-character limit, and
    the planner then finds no kernel at all)."""
    d0 = library.get("softmax")
    for n in (30, 31, 32):
        d = Diagram("a" * n, d0.outputs, d0.inputs)
        p = lower(d, sizes={"r": 8, "x": 1000}, gpu="h100")
        assert p.family == "rowwise", n


def test_an_output_read_by_a_later_kernel_is_not_an_output_of_that_kernel():
    """H = A·B is an output and the softmax's input: the softmax kernel reads H, it does not write
    it (napkin bug: kernel_problem lists H among the softmax kernel's outputs, and rowwise refuses
    "output H is an input", so the softmax goes to the scalar fallback)."""
    from napkin.codegen.partition import kernel_problem
    from napkin.diagrams import contract

    a, b, c = Axis("a", 256), Axis("b", 128), Axis("c", 256)
    H = contract(array("A", a, b), array("B", b, c), over="b", out=("a", "c"), name="H")
    d = Diagram("mm_softmax", (softmax(H, over="c", name="P"), H))
    sub, _ = kernel_problem(d, ("P",), "P")
    assert sub.input_names == ("H",) and sub.output_names == ("P",)
    assert derive(d, "h100", "bf16", explain=False).plan.families == ("contraction", "rowwise")


def test_small_axes_are_no_reason_for_the_fallback():
    """The contraction and attention templates handle partial tiles; an axis shorter than their
    tiles (c=48 against tiles of 64 and more, q=x=40) must not send the boxes to the scalar
    fallback (napkin bug: the model refuses every configuration, "a group cannot be larger than
    its axis", and the planner drops the family instead of ranking it by the plain estimate as
    select.rank does)."""
    mlp = library.get("mlp").bind(a=64, b=32, c=48)
    assert "fallback" not in derive(mlp, "h100", "bf16", explain=False).plan.families
    assert lower(mlp, gpu="h100", dtype="bf16", family="contraction").family == "contraction"
    att = library.get("attention_causal").bind(h=2, q=40, x=40, d=64)
    assert "fallback" not in derive(att, "h100", "bf16", explain=False).plan.families


# ----------------------------------------------------------------------------- preparing


def test_prepare_errors():
    with pytest.raises(CodegenError, match="no size"):
        lower(library.get("softmax"), sizes={"r": 4})
    with pytest.raises(DiagramError):
        lower(library.get("softmax"), sizes={"r": 4, "x": 8, "zz": 3})
    with pytest.raises(ScheduleError, match="fallback: dtype fp8 is not supported"):
        lower(library.get("softmax").with_dtype("fp8"), sizes={"r": 4, "x": 8})


def test_prepare_leaves_following_axes_alone():
    d = prepare("transformer_block", sizes=dict(q=5, e=12, h=2, d=4, f=7, x=5))
    assert d.sizes["x"] == 5


def test_check_program_refuses_unknown_tensors():
    p = lower(library.get("softmax"), sizes={"r": 4, "x": 64})
    k = p.launches[0]
    import dataclasses

    from napkin.codegen.program import Arg

    bad = dataclasses.replace(k, args=k.args + (Arg("tensor", "ghost"),))
    with pytest.raises(CodegenError, match="ghost"):
        check_program(dataclasses.replace(p, launches=(bad,)))


# ----------------------------------------------------------------------------- generate / verify helpers


def test_generate_source_is_self_contained_with_header():
    src = generate_source("transformer_block", sizes=dict(q=5, e=12, h=2, d=4, f=7), gpu="h100")
    head = src.split("\n\n", 1)[0]
    assert head.startswith("// napkin generated CUDA: diagram transformer_block")
    assert "grid (" in src and "block (" in src and "launches, in order" in src
    assert "nvcc -cubin -gencode=arch=compute_90a,code=sm_90a" in src
    assert '#include "napkin.cuh"' not in src and "namespace napkin" in src
    assert "pre-norm transformer block" not in src  # the free-text description never reaches CUDA
    header = src.split("// napkin.cuh", 1)[0]  # the device library's own comments are not ours
    assert header.isascii()


def test_generate_source_uses_the_profile_arch():
    src = generate_source("softmax", sizes={"r": 4, "x": 100}, gpu="a100")
    assert "sm_80" in src.split("\n\n", 1)[0]


def test_default_shapes_sweep():
    d = library.get("softmax")
    shapes = default_shapes(d, {"r": 64, "x": 4096})
    assert shapes[0] == {"r": 64, "x": 4096}
    assert shapes[1] == {"r": 63, "x": 4095}
    assert all(v % 2 == 1 or v <= 2 for v in shapes[2].values())
    tb = default_shapes(library.get("transformer_block"))
    assert all("x" not in s for s in tb)
    assert len(tb) == 2


def test_verify_report_table():
    rep = VerifyReport("softmax", "bf16")
    rep.rows.append(VerifyRow({"r": 4, "x": 8}, "P", 1e-3, 1e-2, True, "rowwise", "1 kernel"))
    assert rep.ok and "OK" in str(rep)
    rep.rows.append(VerifyRow({"r": 3, "x": 7}, "P", math.nan, 1e-2, False, "rowwise", "", nan_count=3))
    assert not rep.ok and "FAILED" in str(rep) and "3 NaN" in str(rep)


def test_import_napkin_codegen_is_light():
    code = ("import sys, json, napkin.codegen\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy', 'jinja2'))\n"
            "print(json.dumps(heavy))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_lowering_without_torch():
    code = ("import sys, json\nfrom napkin.codegen.lower import lower\n"
            "p = lower('layernorm', sizes={'r': 8, 'x': 256})\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy'))\n"
            "print(json.dumps([p.family, heavy]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["rowwise", []]


def test_program_is_a_plain_value():
    p = lower(library.get("rmsnorm"), sizes={"r": 4, "x": 64})
    assert isinstance(p, Program) and p.sizes == {"r": 4, "x": 64}
    assert "extern" in p.source()
    assert isinstance(p.notes, tuple)
    with pytest.raises(NapkinError):
        lower(library.get("rmsnorm"), sizes={"r": 4, "x": 64}, family="nope")


def test_an_output_that_is_an_input_is_refused():
    r, x = Axis("r", 4), Axis("x", 8)
    X = array("X", r, x)
    d = Diagram("passthrough", (softmax(X, over="x", name="P"), X))
    with pytest.raises(CodegenError, match="passed"):
        lower(d)


def test_rowwise_shared_memory_budget_comes_from_the_cost_model_when_it_agrees():
    try:
        import napkin.perfmodel.cost  # noqa: F401
    except ImportError:
        pytest.skip("cost model not in this checkout")
    p = lower(library.get("softmax"), sizes={"r": 64, "x": 4096}, gpu="h100")
    assert any("model footprint from the cost model" in n for n in p.notes)
    assert any("M_RF" in n for n in p.notes)
    assert p.launches[0].model_smem_bytes <= 256
