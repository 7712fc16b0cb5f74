"""No diagram of the usual kinds plans a kernel on the scalar fallback (issue #12: the fallback
"stays only as a checked last resort"; an external suite counts a problem under 0.5x eager as a
failure, and the fallback runs 100-1000x slower than eager).

The cases: every reduction kind (sum, mean, max, min, logsumexp) and every composite (softmax,
rmsnorm, layernorm) over each axis position (first, middle, last; two axes for the reductions) of
2-D, 3-D and 4-D arrays at small, odd and larger sizes; elementwise chains with broadcasts;
contractions in the layouts the contraction and pointwise families take (transposed operands,
batch axis first or middle, two contracted axes, matrix-vector, vector-matrix, dot, huge K);
products over no axis (outer products, batched outer products, Hadamard products, a permuted
result: what ``Diagram.grad`` writes for a broadcast). bf16 and fp32 on the H100 profile.

Two mechanisms keep these off the fallback, both tested here:

- boxes a plan puts on the fallback are written out (``napkin.diagrams.expand``) whenever that
  puts fewer boxes on it, whatever the model's guess of the fallback's time at small sizes: a
  softmax or norm over an axis that is not innermost as reductions and maps; a rename written as
  an output (a view copied to HBM) as a copy; a contraction in a layout the contraction family
  does not read (a batch axis innermost, contracted axes in different orders) on operands copied
  into one it does;
- the pointwise family runs a contraction over no axis (and so those copies) as the elementwise
  map ``x * y * ...``.

The pointwise kernels of the new cases (maps, copies, reductions of written-out composites)
compile with nvcc for sm_80 and sm_90a without spills.
No GPU (tests/test_no_fallback_gpu.py runs them against PyTorch).
"""

from __future__ import annotations

import json

import pytest

from napkin.codegen.families import pointwise
from napkin.codegen.lower import build
from napkin.codegen.planner import derive
from napkin.diagrams import (Axis, Diagram, array, axes, contract, exp, gelu, layernorm, logsumexp, max_over, mean_over,
                             min_over, relu, rename, rmsnorm, sigmoid, softmax, sum_over, tanh)
from napkin.perfmodel.plan import FALLBACK, Plan

DTYPES = ("bf16", "fp32")

_REDUCTIONS = {"sum": sum_over, "mean": mean_over, "max": max_over, "min": min_over}
_ONE_AXIS = {"logsumexp": logsumexp, "softmax": softmax, "rmsnorm": rmsnorm, "layernorm": layernorm}
#: sizes per rank: small, odd (primes and ones, the vector width never divides), larger
_SIZES = {2: ((8, 8), (37, 5), (300, 300), (2048, 2048)),
          3: ((8, 8, 8), (37, 5, 129), (4, 64, 32), (16, 256, 512)),
          4: ((8, 8, 8, 8), (37, 5, 129, 3), (16, 32, 16, 64))}


def _reduction_cases():
    out = []
    for nd, shapes in _SIZES.items():
        names = "abce"[:nd]
        positions = {"first": (0,), "last": (nd - 1,)}
        if nd >= 3:
            positions.update(middle=(1,), two_first=(0, 1), two_last=(nd - 2, nd - 1))
        if nd == 4:
            positions["two_outer"] = (0, 3)
        for kind in (*_REDUCTIONS, *_ONE_AXIS):
            for pos, at in positions.items():
                if len(at) > 1 and kind in _ONE_AXIS:
                    continue  # softmax, logsumexp and the norms take one axis
                for shape in shapes:
                    out.append((f"{kind}_{nd}d_{pos}_{'x'.join(map(str, shape))}", kind, names, at, shape))
    return out


def reduction(kind: str, names: str, at: tuple[int, ...], dtype: str) -> Diagram:
    axs = axes(" ".join(names))
    x = array("X", *axs, dtype=dtype)
    over = tuple(axs[i] for i in at)
    if kind in _REDUCTIONS:
        y = _REDUCTIONS[kind](x, over if len(over) > 1 else over[0], name="Y")
    else:
        y = _ONE_AXIS[kind](x, over[0], name="Y")
    return Diagram(f"{kind}_{''.join(names[i] for i in at)}", y)


REDUCTIONS = _reduction_cases()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, kind, names, at, shape", REDUCTIONS, ids=[c[0] for c in REDUCTIONS])
def test_reductions_and_norms_over_any_axis_run_on_fast_families(name, kind, names, at, shape, dtype):
    d = reduction(kind, names, at, dtype)
    plan = derive(d, "h100", dtype, sizes=dict(zip(names, shape)), explain=False).plan
    assert FALLBACK not in plan.families, (name, dtype, str(plan))
    assert not plan.notes, plan.notes


i, j, k, l, n = axes("i j k l n")


def _contractions(dtype: str) -> dict:
    def A(*ax, name="A"):
        return array(name, *ax, dtype=dtype)

    return {
        "mm": (contract(A(i, k), A(k, j, name="B"), over=k, out=(i, j)), "ijk"),
        "mm_a_transposed": (contract(A(k, i), A(k, j, name="B"), over=k, out=(i, j)), "ijk"),
        "mm_b_transposed": (contract(A(i, k), A(j, k, name="B"), over=k, out=(i, j)), "ijk"),
        "mm_both_transposed": (contract(A(k, i), A(j, k, name="B"), over=k, out=(i, j)), "ijk"),
        "mm_result_transposed": (contract(A(i, k), A(k, j, name="B"), over=k, out=(j, i)), "ijk"),
        "bmm_batch_first": (contract(A(n, i, k), A(n, k, j, name="B"), over=k, out=(n, i, j)), "nijk"),
        "bmm_batch_middle": (contract(A(i, n, k), A(n, k, j, name="B"), over=k, out=(i, n, j)), "nijk"),
        # the batch axis innermost everywhere: written out on copies in a layout the family reads
        "bmm_batch_last": (contract(A(i, k, n), A(k, j, n, name="B"), over=k, out=(i, j, n)), "nijk"),
        "bmm_batch_last_k_first": (contract(A(k, i, n), A(j, k, n, name="B"), over=k, out=(n, j, i)), "nijk"),
        "two_contracted_apart": (contract(A(l, i, k), A(j, k, l, name="B"), over=(k, l), out=(i, j)), "ijkl"),
        "two_contracted": (contract(A(i, k, l), A(k, l, j, name="B"), over=(k, l), out=(i, j)), "ijkl"),
        "two_contracted_swapped": (contract(A(i, l, k), A(k, l, j, name="B"), over=(k, l), out=(i, j)), "ijkl"),
        "matvec": (contract(A(i, k), A(k, name="v"), over=k, out=(i,)), "ik"),
        "vecmat": (contract(A(k, name="v"), A(k, j, name="B"), over=k, out=(j,)), "kj"),
        "dot": (contract(A(k, name="u"), A(k, name="v"), over=k, out=()), "k"),
        "batched_matvec": (contract(A(n, i, k), A(n, k, name="v"), over=k, out=(n, i)), "nik"),
        "outer": (contract(A(i, name="P"), A(j, name="Q"), over=(), out=(i, j)), "ij"),
        "outer_transposed": (contract(A(i, name="P"), A(j, name="Q"), over=(), out=(j, i)), "ij"),
        "outer_batched": (contract(A(n, i, name="P"), A(n, j, name="Q"), over=(), out=(n, i, j)), "nij"),
        "hadamard": (contract(A(i, j, name="P"), A(i, j, name="Q"), over=(), out=(i, j)), "ij"),
        "hadamard_transposed": (contract(A(i, j, name="P"), A(j, i, name="Q"), over=(), out=(i, j)), "ij"),
        "broadcast_product": (contract(A(i, j, name="P"), A(j, name="Q"), over=(), out=(j, i)), "ij"),
        "chain_gelu": (gelu(A(i, j, name="X") * 2.0 + A(i, j, name="Z")), "ij"),
        "chain_broadcast": (sigmoid(A(i, j, name="X") + A(j, name="Yb")), "ij"),
        "chain_long": (tanh(exp(relu(A(i, j, name="X")) * A(i, j, name="Z")) - 1.0), "ij"),
    }


_CONTRACTION_SIZES = (dict(i=8, j=8, k=8, l=4, n=2), dict(i=37, j=129, k=77, l=5, n=3),
                      dict(i=1024, j=1024, k=1024, l=16, n=8))
_HUGE_K = (dict(i=64, j=64, k=1 << 18), dict(i=33, j=65, k=100003))
CONTRACTIONS = [(c, s) for c in _contractions("bf16") for s in range(len(_CONTRACTION_SIZES))]


def _planned(case: str, dtype: str, sizes: dict):
    v, names = _contractions(dtype)[case]
    d = Diagram(case, v.named("C"))
    return d, derive(d, "h100", dtype, sizes={a: sizes[a] for a in names}, explain=False).plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, which", CONTRACTIONS, ids=[f"{c}-{s}" for c, s in CONTRACTIONS])
def test_contractions_products_and_chains_run_on_fast_families(case, which, dtype):
    d, plan = _planned(case, dtype, _CONTRACTION_SIZES[which])
    assert FALLBACK not in plan.families, (case, dtype, str(plan))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["mm", "matvec", "dot"])
@pytest.mark.parametrize("which", range(len(_HUGE_K)))
def test_huge_k_runs_on_fast_families(case, which, dtype):
    d, plan = _planned(case, dtype, _HUGE_K[which])
    assert FALLBACK not in plan.families, (case, dtype, str(plan))


@pytest.mark.parametrize("case", ["outer", "outer_transposed", "outer_batched", "hadamard", "hadamard_transposed",
                                  "broadcast_product"])
def test_a_product_over_no_axis_is_one_pointwise_map(case):
    d, plan = _planned(case, "bf16", _CONTRACTION_SIZES[1])
    assert plan.families == ("pointwise",), str(plan)
    shape = pointwise.analyse(plan.diagram)
    assert shape.mode == "map" and not shape.chain
    # the output's own axis order is the iteration space: its writes are the coalesced ones
    assert shape.order == plan.diagram.outputs[0].axis_names


def test_a_product_of_three_factors_and_a_summed_product_are_each_one_kernel():
    """A product over no axis of three factors is one map; an outer product summed over an axis is
    that map in the loop of a row reduction, one kernel."""
    v = contract(array("P", i), array("Q", j), array("R", i, j), over=(), out=(i, j), name="O")
    d = Diagram("three", v).bind(i=5, j=7)
    assert pointwise.FAMILY.explain(d) is None
    shape = pointwise.analyse(d)
    assert shape.mode == "map" and [shape.name(b) for b in shape.loop] == ["O"]
    summed = Diagram("outer_then_sum", sum_over(contract(array("P", i), array("Q", j), over=(), out=(i, j)), j,
                                                name="S"))
    shape = pointwise.analyse(summed.bind(i=5, j=7))
    assert shape.mode == "row" and len(shape.chain) == 1 and len(shape.loop) == 1


def test_a_composite_on_the_fallback_is_written_out_even_where_the_model_prices_the_fallback_lower():
    """At 4x64x32 the model prices the fallback's one kernel below the three kernels of the written
    out softmax; the fallback is still the last resort (fewer boxes on it wins first), and the
    decision says what it compared."""
    b, s, h = axes("b s h")
    d = Diagram("sm_mid", softmax(array("X", b, s, h), over=s, name="Y"))
    der = derive(d, "h100", "bf16", sizes=dict(b=4, s=64, h=32))
    assert FALLBACK not in der.plan.families and der.plan.expanded == ("Y",)
    assert der.decisions[0].startswith("wrote out Y") and "scalar fallback" in der.decisions[0]


# ----------------------------------------------------------------------------- nvcc

NVCC_CASES = [("outer", dict(i=37, j=129)), ("outer_transposed", dict(i=4096, j=4096)),
              ("outer_batched", dict(n=3, i=37, j=129)), ("hadamard_transposed", dict(i=37, j=129)),
              ("broadcast_product", dict(i=1024, j=1000)), ("bmm_batch_last", dict(n=3, i=37, j=129, k=77)),
              ("two_contracted_apart", dict(i=37, j=129, k=77, l=5))]
NVCC_REDUCTIONS = [("softmax", "abc", (1,), (4, 64, 32)), ("rmsnorm", "abc", (0,), (37, 5, 129)),
                   ("layernorm", "ab", (0,), (300, 300))]


def _launches():
    import dataclasses
    import re

    out = []
    for dtype in DTYPES:
        plans = [_planned(c, dtype, sz)[1] for c, sz in NVCC_CASES]
        plans += [derive(reduction(kind, names, at, dtype), "h100", dtype, sizes=dict(zip(names, shape)),
                         explain=False).plan for kind, names, at, shape in NVCC_REDUCTIONS]
        views = _views_as_outputs(dtype)
        plans += [derive(views[c], "h100", dtype, sizes={a: v for a, v in VIEW_SIZES[1].items() if a in views[c].axes},
                         explain=False).plan for c in ("input_renamed", "sum_view_output")]
        plans += [derive(v, "h100", dtype, explain=False).plan for v in _beside_its_view(dtype, 33, 5).values()]
        for pi, plan in enumerate(plans):
            assert FALLBACK not in plan.families, str(plan)
            for launch in build(plan, arch="sm_90a").launches:
                if launch.template != pointwise.TEMPLATE:
                    continue  # a relaid contraction's own kernel: the contraction family's tests build it
                new = f"{launch.name}_{dtype}_{pi}"
                out.append(dataclasses.replace(launch, name=new, source=re.sub(
                    rf"\b{re.escape(launch.name)}\b", new, launch.source)))
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_new_kernels_compile_without_spills_within_the_model(arch):
    from napkin.kernels import nvcc_compile

    launches = _launches()
    usage = nvcc_compile("\n".join(dict.fromkeys(k.source for k in launches)), arch)
    problems = []
    for k in launches:
        r = usage.kernels[k.name]
        if r.spills:
            problems.append(f"{k.name} ({arch}): spills {r.spill_stores} B stores / {r.spill_loads} B loads")
        if k.model_regs_per_thread and r.registers > k.model_regs_per_thread:
            problems.append(f"{k.name} ({arch}): {r.registers} registers, the model assumed "
                            f"{k.model_regs_per_thread}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- written out


def _views_as_outputs(dtype: str) -> dict:
    x = array("X", i, k, l, dtype=dtype)
    b0 = contract(array("P", k, dtype=dtype), array("Q", k, j, dtype=dtype), over=k, name="B0")
    b1 = rename(b0, j="n", name="B1")
    return {
        "input_renamed": Diagram("input_renamed", rename(x, k="n", name="Y")),
        "map_renamed": Diagram("map_renamed", rename(sigmoid(x, name="S"), k="n", name="Y")),
        "softmax_renamed": Diagram("softmax_renamed", rename(softmax(x, over=i, name="S"), l="n", name="Y")),
        # the view of a sum of products read again: the kernel that makes B0 wrote B1 as well
        "sum_view_output": Diagram("sum_view_output", (sum_over(b1, n, name="B2"), b1)),
        "contraction_and_view": Diagram("contraction_and_view", (
            b2 := contract(array("A", i, k, dtype=dtype), array("B", j, i, k, dtype=dtype), over=k, out=(i, j),
                           name="C"), rename(b2, i="n", name="V"))),
    }


VIEW_SIZES = (dict(i=2, j=2, k=3, l=5), dict(i=7, j=33, k=16, l=13))


def _beside_its_view(dtype: str, side: int = 7, depth: int = 3) -> dict:
    """A kernel that reads an array both as it is and through a view (``(X + Xᵀ)/2``): the
    kernel's sub-diagram keeps the view as a rename box, which the pointwise family reads as the
    array's tensor under the view's axes (it ran on the scalar fallback before). ``side`` is the
    size of the two swapped axes, ``depth`` of the third."""
    a, b, c = Axis("i", side), Axis("n", side), Axis("l", depth)
    sq = array("S", a, b, dtype=dtype)
    cube = array("C", a, b, c, dtype=dtype)
    cq = array("Q", a, c, Axis("m", depth), dtype=dtype)  # the two inner axes swapped
    return {
        "symmetrize": Diagram("symmetrize", ((sq + rename(sq, i="n", n="i")) * 0.5).named("Y")),
        "outer_axes_swapped": Diagram("outer_axes_swapped", (cube - rename(cube, i="n", n="i")).named("Y")),
        "summed_with_view": Diagram("summed_with_view", sum_over(sq * rename(sq, i="n", n="i"), b, name="Y")),
        "inner_axes_swapped": Diagram("inner_axes_swapped", (cq * rename(cq, l="m", m="l")).named("Y")),
    }


BESIDE_SIZES = ((7, 3), (64, 64), (33, 5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(_beside_its_view("bf16")))
def test_an_array_read_beside_its_view_runs_on_the_pointwise_family(case, dtype):
    for side, depth in BESIDE_SIZES:
        der = derive(_beside_its_view(dtype, side, depth)[case], "h100", dtype)
        assert der.plan.families == ("pointwise",), str(der.plan)
        build(der.plan)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(_views_as_outputs("bf16")))
@pytest.mark.parametrize("which", range(len(VIEW_SIZES)))
def test_a_view_written_as_an_output_is_copied_on_the_pointwise_family(case, which, dtype):
    d = _views_as_outputs(dtype)[case]
    sizes = {a: v for a, v in VIEW_SIZES[which].items() if a in d.axes and a != "n"}  # n: its source's size
    der = derive(d, "h100", dtype, sizes=sizes)
    assert FALLBACK not in der.plan.families, str(der.plan)
    assert der.plan.expanded and der.decisions[0].startswith("wrote out "), der.decisions[:1]


@pytest.mark.parametrize("case", ["bmm_batch_last", "bmm_batch_last_k_first", "two_contracted_apart"])
def test_a_relaid_contraction_copies_only_what_differs_and_round_trips(case):
    d, plan = _planned(case, "bf16", _CONTRACTION_SIZES[1])
    assert plan.expanded == ("C",) and "contraction" in plan.families, str(plan)
    made = {plan.diagram.name_of(v): v for v in plan.diagram.nodes}
    copies = [n for n, v in made.items() if v.op.kind == "contract" and not v.op.over]
    sums = [v for v in made.values() if v.op.kind == "contract" and v.op.over]
    assert len(sums) == 1
    s = sums[0]
    a, b = s.args
    batch = tuple(x for x in s.axis_names if x in a.axis_names and x in b.axis_names)
    # the batch axes outermost in both operands and the result, the sum's axes innermost in A
    assert a.axis_names[:len(batch)] == batch == b.axis_names[:len(batch)] == s.axis_names[:len(batch)]
    assert set(a.axis_names[-len(s.op.over):]) == set(s.op.over)
    original = {v.name: v.axis_names for v in d.inputs}
    # an operand already in that layout is read as it is, never copied
    for operand in (a, b):
        if operand.is_input:
            assert operand.axis_names == original[operand.name]
    assert len(copies) == sum(not o.is_input for o in (a, b)) + (plan.diagram.outputs[0] is not s)
    data = json.loads(json.dumps(plan.to_dict()))
    again = Plan.from_dict(d, data)
    assert again == plan and again.expanded == plan.expanded
    assert build(again).source() == build(plan).source()


def test_a_contraction_past_32_bit_rows_stays_on_the_fallback_and_says_why():
    """What only the fallback runs stays there, said aloud: relaying a contraction whose rows
    pass 32-bit indices out does not make it fit the contraction family."""
    from napkin.diagrams import library

    der = derive(library.get("matmul"), "h100", "bf16", sizes=dict(a=2 ** 31 - 10, b=64, c=64))
    assert der.plan.families == ("fallback",) and not der.plan.expanded
    assert any("scalar fallback" in n for n in der.plan.notes)
    assert "32-bit" in der.plan.kernels[0].why
