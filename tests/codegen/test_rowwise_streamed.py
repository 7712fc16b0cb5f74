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
    # fp32 rows of 50257 take 201 KB: past an A100's block, within a Hopper's 227 KiB
    s32 = _chain(_log_softmax(), "fp32", r=64, x=50257)
    assert row_cache(s32, rowwise.make_chain_config(s32, 256, 1, 4), rowwise.MAX_ROW_SMEM) == []
    d32 = prepare(_log_softmax(), sizes=dict(r=64, x=50257), dtype="fp32")
    cands = FAMILY.candidates(d32, "a100", "fp32")
    assert cands and not any(c.kernels[0].options.row_in_smem for c in cands)
    hopper = [c for c in FAMILY.candidates(d32, "h200", "fp32") if c.kernels[0].options.row_in_smem]
    assert hopper
    for sch in hopper:
        cfg = rowwise.chain_config_from_schedule(s32, sch)
        assert cfg.cached == 1
        assert 16 * 12566 <= rowwise.chain_smem_bytes(s32, cfg) <= rowwise.row_smem_budget("h200")


def test_the_row_cache_budget_is_the_gpus_block_limit():
    from napkin.perfmodel.hardware import get_gpu

    for name in ("h100", "h200", "a100"):
        assert rowwise.row_smem_budget(name) == get_gpu(name).level("SMEM").per_block_bytes
    assert rowwise.row_smem_budget(None) == rowwise.MAX_ROW_SMEM
    # softmax's VJP keeps both its inputs within a Hopper's block, one within the default bound;
    # a row of 128256 bf16 values fits neither
    s = _chain(_softmax_vjp(), "bf16", r=64, x=50257)
    both = rowwise.make_chain_config(s, 256, 1, 4, row_in_smem=True, smem_budget=rowwise.row_smem_budget("h200"))
    assert both.cached == 2 and rowwise.chain_smem_bytes(s, both) <= rowwise.row_smem_budget("h200")
    assert rowwise.make_chain_config(s, 256, 1, 4, row_in_smem=True).cached == 1
    big = _chain(_log_softmax(), "bf16", r=64, x=128256)
    with pytest.raises(CodegenError, match="fits the 232448 bytes"):
        rowwise.make_chain_config(big, 256, 1, 4, row_in_smem=True, smem_budget=rowwise.row_smem_budget("h200"))


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


# ----------------------------------------------------------------------------- clusters


def _clustered(d: Diagram, dtype: str, gpu: str = "h200", **sizes):
    p = prepare(d, sizes=sizes, dtype=dtype)
    return p, [c for c in FAMILY.candidates(p, gpu, dtype) if c.kernels[0].options.cluster]


def _held(s, cfg) -> int:
    from napkin.codegen.select import resolve_gpu

    per_sm = rowwise._per_sm(resolve_gpu("h200"))
    return per_sm(cfg.threads, rowwise.chain_regs_estimate(s, cfg), rowwise.chain_smem_bytes(s, cfg))


def test_a_row_past_one_blocks_shared_memory_is_shared_by_a_cluster():
    # 128256 bf16 values take 250 KiB, past a Hopper block's 227: a cluster's blocks keep a part
    # each, small enough for two or more blocks an SM (one a cluster of two would leave)
    p, shared = _clustered(_log_softmax(), "bf16", r=64, x=128256)
    assert len(shared) == 1
    s = _chain(_log_softmax(), "bf16", r=64, x=128256)
    cfg = rowwise.chain_config_from_schedule(s, shared[0])
    n = cfg.cluster
    assert n in rowwise.CLUSTER_SIZES and n > 1 and cfg.cached == 1
    assert cfg.threads * n == cfg.threads_per_row <= rowwise.MAX_CLUSTER_ROW_THREADS
    assert _held(s, cfg) >= rowwise.MIN_CLUSTER_BLOCKS_PER_SM
    assert _held(s, cfg) * cfg.threads >= rowwise.MIN_CLUSTER_SM_THREADS
    assert cfg.options(s) == shared[0].kernels[0].options
    assert rowwise.chain_smem_bytes(s, cfg) <= rowwise.row_smem_budget("h200")
    assert rowwise.cache_chunks(s, cfg) * n >= grid_chunks(s)
    # a cluster of two blocks would hold one block an SM: not offered
    two = [rowwise.make_chain_config(s, 2 * t, 1, u, row_in_smem=True, smem_budget=232448, cluster=2)
           for t in rowwise.STREAM_THREADS if t <= 1024 for u in rowwise.STREAM_UNROLLS]
    assert all(_held(s, c) < 2 for c in two) and n > 2
    (k,) = FAMILY.lower(p, shared[0], "sm_90a").launches
    assert k.grid == (64 * n, 1, 1) and k.block == (cfg.threads, 1, 1)
    assert k.shared_bytes == 16 * rowwise.cache_chunks(s, cfg)
    src = k.source
    assert f"__cluster_dims__({n}, 1, 1)" in src and "row = blockIdx.x / CLUSTER" in src
    # one wait for the blocks' start, before the first round's stores; one barrier a round
    assert src.count("napkin::cluster_wait()") == 1 and src.count("napkin::cluster_sync()") == 1
    assert src.count("napkin::store_in_block(") == 2 and "__syncthreads" not in src.split("#include")[1]
    assert "kc = (c0 + u) * THREADS + threadIdx.x" in src and ("CLUSTER", n) in k.tunables
    # the planner picks it: one read of the row from HBM
    from napkin.codegen import compile

    c = compile(_log_softmax(), sizes=dict(r=64, x=128256), dtype="bf16", gpu="h200")
    assert [pk.kernel.options.cluster for pk in c.plan.kernels] == [n]


def test_a_cluster_row_of_more_than_32_warps_folds_two_words_a_lane():
    s = _chain(_log_softmax(), "fp32", r=8, x=151937)
    cfg = rowwise.make_chain_config(s, 2048, 1, 4, row_in_smem=True, smem_budget=232448, cluster=4)
    assert rowwise.scratch_words(cfg) == 64 and rowwise.chain_scratch_bytes(s, cfg) == 2 * 64 * 4 * 2
    p = prepare(_log_softmax(), sizes=dict(r=8, x=151937), dtype="fp32")
    (k,) = FAMILY.lower(p, rowwise.chain_schedule_for(s, cfg, "h200"), "sm_90a").launches
    src = k.source
    assert "scratch[2][2][64]" in src and "for (int w = 32 + threadIdx.x % 32; w < NWARPS; w += 32)" in src
    assert "napkin::merge_max_sumexp<" in src


def test_clusters_only_where_one_block_keeps_nothing_and_the_gpu_has_them():
    assert not _clustered(_log_softmax(), "bf16", r=64, x=100277)[1]      # one block keeps it (196 KiB)
    assert not _clustered(_log_softmax(), "bf16", "a100", r=64, x=128256)[1]
    assert not _clustered(library.get("row_range"), "bf16", r=64, x=1 << 18)[1]  # read once
    # softmax's VJP reads P and dP twice: one block keeps P of 2 x 140 KiB (dP again from L2), and
    # no cluster is offered; of 2 x 560 KiB (fp32) none, and a cluster keeps both
    assert not _clustered(_softmax_vjp(), "bf16", r=8, x=70001)[1]
    s = _chain(_softmax_vjp(), "fp32", r=8, x=70001)
    (sch,) = _clustered(_softmax_vjp(), "fp32", r=8, x=70001)[1]
    cfg = rowwise.chain_config_from_schedule(s, sch)
    assert cfg.cached == 2 and _held(s, cfg) >= 2


def test_cluster_refusals_name_what_is_wrong():
    s = _chain(_log_softmax(), "bf16", r=64, x=128256)
    with pytest.raises(CodegenError, match="only a streamed row kept"):
        rowwise.make_chain_config(s, 1024, 1, 4, cluster=2)
    with pytest.raises(CodegenError, match="not 8 blocks and 1024 threads"):
        rowwise.make_chain_config(s, 1024, 1, 4, row_in_smem=True, smem_budget=232448, cluster=8)
    with pytest.raises(CodegenError, match="at most 2048 threads, not 4 blocks and 4096 threads"):
        rowwise.make_chain_config(s, 4096, 1, 4, row_in_smem=True, smem_budget=232448, cluster=4)
    with pytest.raises(CodegenError, match="THREADS_PER_ROW=2048 is not one of"):
        rowwise.make_chain_config(s, 2048, 1, 4, row_in_smem=True, smem_budget=232448)
    p, (sch,) = _clustered(_log_softmax(), "bf16", r=64, x=128256)
    with pytest.raises(CodegenError, match="needs sm_90"):
        FAMILY.lower(p, sch, "sm_80")
    o = KernelOptions(threads_per_row=1024, streamed=True, row_in_smem=True, cluster=2)
    assert KernelOptions.from_dict(o.to_dict()) == o and "cluster=2" in str(o)
    with pytest.raises(Exception, match="cluster must be a positive integer"):
        KernelOptions(cluster=0)


@pytest.mark.nvcc
def test_cluster_kernels_build_within_the_model():
    """Every cluster configuration of bf16 and fp32 rows (shifted or not, one or two kept inputs)
    builds for sm_90a without spills, within the model's registers."""
    from napkin.kernels import nvcc_compile

    launches = []
    for d, dtype, sizes in ((_log_softmax(), "bf16", dict(r=8, x=128256)), (_log_softmax(), "bf16", dict(r=8, x=130001)),
                            (_softmax_vjp(), "fp32", dict(r=8, x=70001)), (_log_softmax(), "fp32", dict(r=8, x=151937))):
        p, shared = _clustered(d, dtype, **sizes)
        assert shared, (d.name, dtype, sizes)
        for sch in shared:
            (k,) = FAMILY.lower(p, sch, "sm_90a").launches
            new = f"{k.name}_{len(launches)}"
            launches.append(dataclasses.replace(k, name=new, source=re.sub(rf"\b{k.name}\b", new, k.source)))
    usage = nvcc_compile("\n".join(k.source for k in launches), "sm_90a")
    for k in launches:
        r = usage[k.name]
        assert r.spill_stores == 0 and r.spill_loads == 0, (k.name, r)
        assert r.registers <= k.model_regs_per_thread, (k.name, r.registers, k.model_regs_per_thread)
