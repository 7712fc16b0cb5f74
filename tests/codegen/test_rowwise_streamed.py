"""Streamed rows of the row-wise chain kernel, without a GPU: a row that is not whole 16-byte
vectors runs on a grid shifted to its 16-byte lines (aligned vector loads and stores, the row's
first and last chunks masked), and the inputs a later pass reads again are kept in shared memory
(``row_in_smem``), within the bound a block may keep, and priced as one HBM read."""

from __future__ import annotations

import dataclasses
import re

import pytest

from napkin.codegen.families import rowwise
from napkin.codegen.families.rowwise import FAMILY, analyse, grid_chunks, row_cache, shift_source
from napkin.codegen.prepare import prepare
from napkin.diagrams import Axis, Diagram, array, library, logsumexp, softmax, sum_over
from napkin.errors import CodegenError
from napkin.perfmodel.schedule import KernelOptions


def _softmax(backward: bool = False) -> Diagram:
    r, x = Axis("r"), Axis("x")
    d = Diagram("sm", softmax(array("X", r, x), x, name="P"))
    return d.grad() if backward else d


def _softmax_vjp() -> Diagram:
    """softmax's backward given P: dX = P * (dP - sum(P * dP)), two inputs read in two passes."""
    r, x = Axis("r"), Axis("x")
    P, dP = array("P", r, x), array("dP", r, x)
    return Diagram("vjp", (P * (dP - sum_over(P * dP, x))).named("dX"))


def _log_softmax() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X = array("X", r, x)
    return Diagram("ls", (X - logsumexp(X, x)).named("Y"))


def _plan(d: Diagram, dtype: str, gpu: str = "h200", **sizes):
    from napkin.codegen import compile

    return compile(d, sizes=sizes, dtype=dtype, gpu=gpu)


def _chain(d: Diagram, dtype: str, **sizes):
    return analyse(prepare(d, sizes=sizes, dtype=dtype))


def test_an_odd_vocabulary_row_is_shifted_and_kept_in_shared_memory():
    c = _plan(_log_softmax(), "bf16", r=64, x=50257)
    (k,) = c.launches
    (kern,) = (pk.kernel for pk in c.plan.kernels)
    assert kern.options.streamed and kern.options.row_in_smem
    src = k.source
    assert "store_vec_sh" in src and "values_to_boundary" in src
    # the whole row copied into shared memory before the first pass, every pass reading it back
    assert src.count("napkin::cache_chunk_async(row_cache") == 1 and "cp_async_wait_all" in src
    assert src.count("napkin::load_cached(") == 2 and "load_vec_sh(" not in src.split("cp_async_wait_all")[1]
    assert "(unsigned)col < (unsigned)XSIZE" in src
    # 50257 values: 6283 chunks of 8, one more on the shifted grid; one input kept (X)
    assert grid_chunks(_chain(_log_softmax(), "bf16", r=64, x=50257)) == 6284
    assert k.shared_bytes == 16 * 6284
    assert "X kept in shared memory (100544 bytes)" in src


def test_a_row_of_whole_vectors_keeps_its_grid():
    s = _chain(_log_softmax(), "bf16", r=64, x=50256)
    assert shift_source(s) is None and grid_chunks(s) == 50256 // 8
    (k,) = _plan(_log_softmax(), "bf16", r=64, x=50256).launches
    assert "load_vec_sh" not in k.source and "shift" not in k.source.split("#include")[1]


def test_register_mode_rows_are_not_shifted():
    s = _chain(_log_softmax(), "bf16", r=64, x=4095)
    assert shift_source(s) is not None  # the shape allows it; the lowering shifts streamed rows only
    (k,) = _plan(_log_softmax(), "bf16", r=64, x=4095).launches
    assert "load_vec_sh" not in k.source and "row_cache" not in k.source


def test_the_kept_inputs_fit_the_bound_most_passes_first():
    # the softmax backward reads P and dP in two passes: 2 x 100544 bytes pass the bound, one fits
    s = _chain(_softmax_vjp(), "bf16", r=64, x=50257)
    cfg = rowwise.make_chain_config(s, 256, 1, 4)
    assert len(row_cache(s, cfg, rowwise.MAX_ROW_SMEM)) == 1
    assert len(row_cache(s, cfg, 10 ** 7)) == 2
    kept = rowwise.make_chain_config(s, 256, 1, 4, row_in_smem=True)
    assert kept.cached == 1 and rowwise.chain_smem_bytes(s, kept) <= rowwise.MAX_ROW_SMEM
    # fp32 rows of 50257 take 201 KB: nothing fits, and the family offers no kept variant
    s32 = _chain(_log_softmax(), "fp32", r=64, x=50257)
    assert row_cache(s32, rowwise.make_chain_config(s32, 256, 1, 4), rowwise.MAX_ROW_SMEM) == []
    d32 = prepare(_log_softmax(), sizes=dict(r=64, x=50257), dtype="fp32")
    cands = FAMILY.candidates(d32, "h200", "fp32")
    assert cands and not any(c.kernels[0].options.row_in_smem for c in cands)


def test_kept_inputs_are_read_from_hbm_once_in_the_model():
    d = prepare(_log_softmax(), sizes=dict(r=64, x=50257), dtype="bf16")
    cands = FAMILY.candidates(d, "h200", "bf16")
    kept = [c for c in cands if c.kernels[0].options.row_in_smem]
    plain = [c for c in cands if not c.kernels[0].options.row_in_smem]
    assert kept and plain
    assert "extra_hbm_bytes" not in FAMILY.launch_estimate(d, kept[0], "h200")
    # without it the later pass (the output; the sum runs beside the max) reads X again
    assert FAMILY.launch_estimate(d, plain[0], "h200")["extra_hbm_bytes"] == 64 * 50257 * 2
    est = FAMILY.launch_estimate(d, kept[0], "h200")
    assert est["smem"] >= 16 * 6284


def test_every_kept_configuration_lowers_back_to_itself():
    d = prepare(_softmax(backward=True), sizes=dict(r=16, x=50257), dtype="bf16")
    from napkin.codegen import compile

    c = compile(d, gpu="h200")
    assert any(pk.kernel.options.row_in_smem for pk in c.plan.kernels)
    assert all(pk.kernel.options.streamed for pk in c.plan.kernels if pk.kernel.options.row_in_smem)
    s = _chain(_log_softmax(), "bf16", r=16, x=50257)
    cands = FAMILY.candidates(prepare(_log_softmax(), sizes=dict(r=16, x=50257), dtype="bf16"), "h200", "bf16")
    for sch in cands:
        cfg = rowwise.chain_config_from_schedule(s, sch)
        assert bool(cfg.cached) == bool(sch.kernels[0].options.row_in_smem)
        assert cfg.options(s) == sch.kernels[0].options


def test_row_in_smem_refusals_name_what_is_wrong():
    s = _chain(_log_softmax(), "bf16", r=64, x=1000)
    with pytest.raises(CodegenError, match="only for a streamed row"):
        rowwise.make_chain_config(s, 32, 4, row_in_smem=True)
    one_pass = _chain(library.get("row_range"), "bf16", r=16, x=1 << 20)
    with pytest.raises(CodegenError, match="read by two passes"):
        rowwise.make_chain_config(one_pass, 256, 1, 2, row_in_smem=True)


def test_the_option_is_a_typed_flag():
    o = KernelOptions(threads_per_row=256, streamed=True, row_in_smem=True)
    assert KernelOptions.from_dict(o.to_dict()) == o and "row_in_smem=True" in str(o)
    assert KernelOptions.value_of("row_in_smem", "True") is True
    with pytest.raises(Exception, match="row_in_smem must be True or False"):
        KernelOptions(row_in_smem=1)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch, gpu", [("sm_90a", "h200"), ("sm_80", "a100")])
def test_streamed_kernels_build_within_the_model(arch, gpu):
    """Every streamed candidate of odd and whole rows (kept or not, bf16 and fp32) builds without
    spills, within the model's registers, for sm_80 and sm_90a."""
    from napkin.kernels import nvcc_compile

    launches = []
    for d, dtype, sizes in ((_log_softmax(), "bf16", dict(r=8, x=50257)), (_log_softmax(), "fp32", dict(r=8, x=50257)),
                            (_softmax(), "bf16", dict(r=8, x=70001)), (_log_softmax(), "bf16", dict(r=8, x=65536)),
                            (library.get("group_norm"), "bf16", dict(n=1, g=2, c=15, s=4101))):
        p = prepare(d, sizes=sizes, dtype=dtype)
        for sch in FAMILY.candidates(p, gpu, dtype):
            (k,) = FAMILY.lower(p, sch, arch).launches
            new = f"{k.name}_{len(launches)}"  # one module: every entry point its own name
            launches.append(dataclasses.replace(k, name=new, source=re.sub(rf"\b{k.name}\b", new, k.source)))
    assert any("row_cache" in k.source for k in launches) and any("load_vec_sh" in k.source for k in launches)
    usage = nvcc_compile("\n".join(k.source for k in launches), arch)
    for k in launches:
        r = usage[k.name]
        assert r.spill_stores == 0 and r.spill_loads == 0, (k.name, r)
        assert r.registers <= k.model_regs_per_thread, (k.name, r.registers, k.model_regs_per_thread)
