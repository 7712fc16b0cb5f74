"""Dynamic axes (``compile(..., dynamic=...)``) and the plan cache, without a GPU.

Which families write a size into their source was checked by lowering one schedule at two sizes
and comparing the sources: the contraction and attention families pass sizes as kernel
arguments (one source for every size), the row-wise and pointwise families write the row or
element count as a constant. The tests below hold both: a dynamic matmul and attention build the
same source at every size and report nothing specialised; a dynamic softmax reports its row-wise
kernel as specialised, says so in a warning, and builds a source per size.
"""

from __future__ import annotations

import json
import logging

import pytest

import napkin.codegen as cg
from napkin.codegen import dynamic as dyn
from napkin.codegen import plancache
from napkin.codegen.prepare import prepare
from napkin.diagrams import library
from napkin.errors import CodegenError, LaunchError

GPU = "h100"


def sources(dd, sizes) -> list[str]:
    return [k.source for k in dd.at(sizes).program.launches]


# ----------------------------------------------------------------------------- ranges


def test_ranges_from_names_or_mappings_and_their_errors():
    sm = library.get("softmax")
    assert dyn.parse_dynamic(sm, ["r"], {"r": 512}) == {"r": (1, 512)}
    assert dyn.parse_dynamic(sm, "r", {"r": 512}) == {"r": (1, 512)}
    assert dyn.parse_dynamic(sm, {"r": [4, 64]}, {}) == {"r": (4, 64)}
    with pytest.raises(CodegenError, match="dynamic axis 'r' needs a range"):
        dyn.parse_dynamic(sm, ["r"], {})
    with pytest.raises(CodegenError, match="has no such axis"):
        dyn.parse_dynamic(sm, {"q": (1, 2)}, {})
    with pytest.raises(CodegenError, match=r"range \(0, 8\) is not"):
        dyn.parse_dynamic(sm, {"r": (0, 8)}, {})
    with pytest.raises(CodegenError, match=r"range \(9, 8\) is not"):
        dyn.parse_dynamic(sm, {"r": (9, 8)}, {})
    with pytest.raises(CodegenError, match="size 100 in sizes is outside its range 1..64"):
        dyn.parse_dynamic(sm, {"r": (1, 64)}, {"r": 100})
    with pytest.raises(CodegenError, match="expected axis names"):
        dyn.parse_dynamic(sm, 3, {})


def test_sample_points_cover_both_ends_the_middle_and_the_typical_size():
    assert dyn.sample_points({"q": (16, 16)}) == [{"q": 16}]
    pts = dyn.sample_points({"q": (1, 4096), "h": (1, 16)}, {"q": 1000})
    assert pts[0] == {"q": 1, "h": 1} and pts[-1] == {"q": 4096, "h": 16}
    assert {"q": 64, "h": 4} in pts and {"q": 1000, "h": 16} in pts


def test_other_axes_must_be_bound():
    with pytest.raises(CodegenError, match="axes c have no size and are not dynamic"):
        cg.compile("matmul", sizes={"b": 64}, dynamic={"a": (1, 128)}, gpu=GPU)


# ----------------------------------------------------------------------------- one kernel per range


def test_a_dynamic_matmul_builds_one_source_for_every_size():
    mm = cg.compile("matmul", sizes={"b": 512, "c": 384}, dynamic={"a": (1, 4096)}, gpu=GPU)
    assert isinstance(mm, dyn.DynamicDiagram) and mm.specialized == ()
    a = sources(mm, {"a": 1})
    assert sources(mm, {"a": 777}) == a == sources(mm, {"a": 4096})
    # the launches differ where they must: the grid and the size arguments
    l1, l2 = mm.at({"a": 1}).program.launches[0], mm.at({"a": 4096}).program.launches[0]
    assert l1.grid != l2.grid and l1.args != l2.args
    assert mm.at({"a": 777}) is mm.at({"a": 777})   # one compiled diagram per size, kept
    assert mm.at({"a": 777}).diagram.sizes == {"a": 777, "b": 512, "c": 384}


def test_dynamic_attention_sequence_lengths_share_the_kernel():
    att = cg.compile("mha", sizes={"h": 4, "d": 64, "x": 512}, dynamic={"q": (1, 2048)}, gpu=GPU)
    assert att.specialized == ()
    assert sources(att, {"q": 5}) == sources(att, {"q": 2048})


def test_a_family_that_writes_sizes_into_its_source_is_named_aloud(caplog):
    with caplog.at_level(logging.WARNING, logger="napkin.codegen.dynamic"):
        sm = cg.compile("softmax", sizes={"x": 1000}, dynamic={"r": (1, 8192)}, gpu=GPU)
    assert sm.specialized and all(f == "rowwise" for _, f in sm.specialized)
    assert any("writes the size of r into the source" in r.getMessage() for r in caplog.records)
    assert sources(sm, {"r": 3}) != sources(sm, {"r": 300})


def test_a_source_that_changes_inside_the_range_is_named_aloud():
    """Both ends of 8..4096 columns are 16-byte rows; 65 is not (its operand is padded first and
    its output leaves without TMA): the contraction builds other code there, which the ends alone
    did not show."""
    assert dyn.probe_points({"c": (8, 4096)}) == [{"c": 8}, {"c": 4096}, {"c": 181}, {"c": 4095}]
    mm = cg.compile("matmul", sizes={"a": 4096, "b": 512}, dynamic={"c": (8, 4096)}, gpu="h200")
    assert [f for _, f in mm.specialized] == ["contraction"]
    assert sources(mm, {"c": 8}) == sources(mm, {"c": 4096}) != sources(mm, {"c": 65})


def test_sizes_outside_the_range_are_refused():
    mm = cg.compile("matmul", sizes={"b": 64, "c": 64}, dynamic={"a": (8, 128)}, gpu=GPU)
    with pytest.raises(LaunchError, match="axis a has size 129, outside the dynamic range 8..128"):
        mm.at({"a": 129})
    with pytest.raises(LaunchError, match="axis a has size 7"):
        mm.at({"a": 7})


@pytest.mark.parametrize("sizes, why", [({"a": 7.9}, "axis a needs a whole number as its size, got 7.9"),
                                        ({"a": 64.0}, "axis a needs a whole number"),
                                        ({"a": True}, "axis a needs a whole number as its size, got True"),
                                        ({"a": "64"}, "axis a needs a whole number"),
                                        ({}, "no size for a; its dynamic axes are a"),
                                        ({"A": 64}, "unknown axis 'A'; no size for a"),
                                        ({"a": 64, "b": 64}, "unknown axis 'b'; its dynamic axes are a"),
                                        (None, "at\\(\\) takes a mapping of the dynamic axes \\(a\\)")])
def test_sizes_that_are_not_one_whole_number_an_axis_are_refused(sizes, why):
    """A size is never truncated (7.9 built as 7) nor read from a bool; every dynamic axis needs one."""
    mm = cg.compile("matmul", sizes={"b": 64, "c": 64}, dynamic={"a": (8, 128)}, gpu=GPU)
    with pytest.raises(LaunchError, match=why):
        mm.at(sizes)


def test_the_range_plan_is_chosen_by_the_worst_loss_and_read_back_from_the_cache(monkeypatch):
    sizes, ranges = {"b": 1024, "c": 1024, "a": 1000}, {"a": (1, 4096)}
    first = cg.compile("matmul", sizes=sizes, dynamic=ranges, gpu=GPU)
    rows = first.candidates
    assert rows and all(len(r["predicted_s"]) == len(r["points"]) for r in rows)
    kept = min(r["worst_loss_s"] for r in rows)
    assert any(r["worst_loss_s"] == kept for r in rows)

    def no_planning(*a, **k):
        raise AssertionError("planned again instead of reading the cache")

    monkeypatch.setattr(dyn, "plan_for_range", no_planning)
    again = cg.compile("matmul", sizes=sizes, dynamic=ranges, gpu=GPU)
    assert again.plan.kernels == first.plan.kernels


def test_a_schedule_given_is_kept_for_the_whole_range():
    d = prepare("matmul", sizes={"a": 256, "b": 256, "c": 256})
    plan = cg.derive(d, GPU, explain=False).plan
    mm = cg.compile("matmul", sizes={"b": 256, "c": 256}, dynamic={"a": (1, 512)}, gpu=GPU, schedule=plan.schedule)
    assert [pk.kernel.relabels for pk in mm.plan.kernels] == [pk.kernel.relabels for pk in plan.kernels]


# ----------------------------------------------------------------------------- the plan cache


def test_the_plan_cache_reads_back_and_replans_a_garbled_entry(tmp_path):
    from napkin.kernels.cache import KernelCache

    disk = KernelCache(tmp_path)
    d = prepare("layernorm", sizes={"r": 64, "x": 512})
    p1 = plancache.derive_cached(d, GPU, arch="sm_90a", cache=disk)
    plancache._memory.clear()
    p2 = plancache.derive_cached(d, GPU, arch="sm_90a", cache=disk)
    assert p1 == p2 and disk.stats.hits == 1 and disk.stats.misses == 1
    key = next(iter(disk._memory))
    disk.store(key, json.dumps({"plan": {"kernels": "nonsense"}}).encode())
    plancache._memory.clear()
    disk._memory.clear()
    p3 = plancache.derive_cached(d, GPU, arch="sm_90a", cache=disk)
    assert p3 == p1 and disk.stats.misses == 2


def test_the_plan_key_holds_the_code_the_gpu_and_the_sizes():
    from napkin.codegen.select import resolve_gpu

    d = prepare("softmax", sizes={"r": 8, "x": 1000})
    k = plancache.plan_key(d, resolve_gpu("h100"), None, "sm_90a", None)
    assert plancache.code_digest() in k
    assert k != plancache.plan_key(d, resolve_gpu("a100"), None, "sm_90a", None)
    assert k != plancache.plan_key(prepare("softmax", sizes={"r": 9, "x": 1000}), resolve_gpu("h100"), None,
                                   "sm_90a", None)
