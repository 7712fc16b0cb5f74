"""Column reductions in the row-wise chain kernel on a GPU: the rmsnorm and layernorm backwards as ONE
row-wise kernel and ONE launch (dX, and dgamma/dbeta from per-block fp32 partials that the blocks
still there when the last one arrives add up, in a fixed order, in the same launch) against
torch.autograd of F.rms_norm / F.layer_norm in float64, on fresh random inputs, rows and row
lengths that are no multiple of the block or the 16-byte vector, NaN-poisoned outputs and
partials; every configuration the family proposes for two cases (warp and block mode, each at
its full-wave block count); a user-written chain over two row axes with a column sum and a column max; the same
inputs giving the same bits on every call, through both call paths and on a second stream (the
partials are added in a fixed order, whoever adds them), with the arrival counters back at zero
after every call; block counts that do not divide the row groups, and a grid larger than the GPU
holds at once (its late blocks start after the early ones have left: those must not wait)."""

from __future__ import annotations

import re

import pytest

from napkin.codegen.api import compile
from napkin.codegen.families.rowwise import FAMILY
from napkin.codegen.prepare import prepare
from napkin.diagrams import library
from napkin.diagrams.reference import random_inputs

from test_rowwise_columns import SAVES, batch_rows  # pytest puts this folder on sys.path

pytestmark = pytest.mark.gpu

TOL = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def rel_err(got, want) -> float:
    import torch

    g, w = got.double(), want.double()
    return float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w).clamp_min(1e-300))


def torch_grads(name: str, X, g, b, dY):
    """dX, dgamma (and dbeta) by torch.autograd of F.rms_norm / F.layer_norm in float64."""
    import torch
    import torch.nn.functional as F

    x = X.double().requires_grad_(True)
    gg = g.double().requires_grad_(True)
    if name == "rmsnorm":
        y = F.rms_norm(x, (X.shape[-1],), gg, eps=EPS[name])
        ins = (x, gg)
    else:
        bb = b.double().requires_grad_(True)
        y = F.layer_norm(x, (X.shape[-1],), gg, bb, eps=EPS[name])
        ins = (x, gg, bb)
    return torch.autograd.grad(y, ins, dY.double())


def norm_inputs(name: str, r: int, x: int, dtype: str, seed: int) -> dict:
    """Fresh random X, gamma, beta, dY of an r x x norm and the statistics napkin.torch saves for
    its backward (rstd; and the mean, layernorm), rounded to ``dtype``."""
    import torch

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    X = (torch.randn(r, x, device="cuda", generator=gen) * 2 + 0.5).to(tdt)
    env = {"X": X, "gamma": (torch.randn(x, device="cuda", generator=gen) + 1).to(tdt),
           "beta": torch.randn(x, device="cuda", generator=gen).to(tdt),
           "dY": torch.randn(r, x, device="cuda", generator=gen).to(tdt)}
    X64 = X.double()
    if name == "rmsnorm":
        env["N_rstd"] = torch.rsqrt((X64 * X64).mean(-1) + EPS[name]).to(tdt)
    else:
        mu = X64.mean(-1)
        env["N_mean"] = mu.to(tdt)
        env["N_rstd"] = torch.rsqrt(((X64 - mu[:, None]) ** 2).mean(-1) + EPS[name]).to(tdt)
    return env


def assert_matches_reference(cd, args: dict, outs: dict, tol: float, what: str) -> None:
    """Every output written (no NaN left of the fill) and within ``tol`` of the diagram's float64
    reference on the same inputs (the saved statistics as given)."""
    import torch

    ref = cd.diagram.reference({k: v.double() for k, v in args.items()}, dtype=torch.float64)
    for n in cd.output_names:
        assert not torch.isnan(outs[n]).any(), f"{what} {n}: NaN (unwritten)"
        err = rel_err(outs[n], ref[n])
        assert err <= tol, f"{what} {n}: relative error {err:.2e} (reference)"


def run_norm_grad(name: str, sizes: dict, dtype: str, *, schedule=None, seed: int = 0):
    """The fused backward of ``name`` (its statistics saved as napkin.torch saves them) on fresh
    inputs into NaN-filled outputs, against torch.autograd; returns the compiled diagram and outputs."""
    import torch

    d = library.get(name).grad(save=SAVES[name])
    cd = compile(d, sizes=sizes, dtype=dtype, schedule=schedule, family="rowwise" if schedule is not None else None)
    fams = [k.family for k in cd.plan.kernels]
    assert fams == ["rowwise"], str(cd.plan)
    r, x = sizes["r"], sizes["x"]
    env = norm_inputs(name, r, x, dtype, seed)
    X, g, b, dY = env["X"], env["gamma"], env["beta"], env["dY"]
    args = {n: env[n] for n in cd.input_names}
    outs = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**args, out=outs)
    torch.cuda.synchronize()
    opts = cd.plan.kernels[0].kernel.options
    assert_matches_reference(cd, args, outs, TOL[dtype], f"{name} {dtype} {sizes} ({opts})")
    if x >= 64:
        # torch.autograd of the forward; the statistics napkin saves are rounded to the dtype, which
        # rows of a few values amplify (x = 3: dX is a small difference), so only longer rows
        for n, w in zip(("dX", "dgamma", "dbeta"), torch_grads(name, X, g, b, dY)):
            err = rel_err(outs[n], w)
            assert err <= TOL[dtype], f"{name} {dtype} {sizes} {n} ({opts}): relative error {err:.2e} (autograd)"
    return cd, args, outs


SHAPES = [dict(r=777, x=1000), dict(r=37, x=4095), dict(r=4096, x=4096), dict(r=1, x=64), dict(r=3000, x=3)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_norm_backwards_fused(name, dtype):
    for i, sizes in enumerate(SHAPES):
        run_norm_grad(name, sizes, dtype, seed=i)


def test_fp16_layernorm():
    run_norm_grad("layernorm", dict(r=129, x=2050), "fp16", seed=9)


@pytest.mark.parametrize("name, sizes, dtype", [("layernorm", dict(r=300, x=1000), "bf16"),
                                                ("rmsnorm", dict(r=517, x=4096), "fp32"),
                                                # 256 and 512 threads, 1 and 2 row groups ahead
                                                ("layernorm", dict(r=700, x=4096), "bf16"),
                                                # blocks fitted to 625 chunks (320, 640 threads)
                                                ("layernorm", dict(r=999, x=5000), "bf16"),
                                                # 640 chunks, whole warps (fitted 320 threads)
                                                ("rmsnorm", dict(r=333, x=5120), "bf16")])
def test_every_configuration(name, sizes, dtype):
    d = prepare(library.get(name).grad(save=SAVES[name]), sizes=sizes, dtype=dtype)
    cands = FAMILY.candidates(d, "h100", dtype)
    assert len({s.kernels[0].options.threads_per_row for s in cands}) >= 2
    for s in cands:
        run_norm_grad(name, sizes, dtype, schedule=s, seed=len(cands))


@pytest.mark.parametrize("sizes, dtype", [(dict(r=301, x=8192), "bf16"), (dict(r=257, x=7000), "fp32"),
                                          # 48 KiB of dynamic beside the static words: the launch opts in
                                          (dict(r=129, x=6144), "bf16"),
                                          # dynamic and rotated: 8191 values are no whole 16-byte vectors
                                          (dict(r=203, x=8191), "bf16")])
def test_partials_past_48_kib_in_dynamic_shared_memory(sizes, dtype):
    # the layernorm backward's two column reductions over rows of 7000-8192 values need 56-64 KiB
    # of fp32 partials: every configuration keeps them in the launch's dynamic shared memory
    d = prepare(library.get("layernorm").grad(save=SAVES["layernorm"]), sizes=sizes, dtype=dtype)
    cands = FAMILY.candidates(d, "h100", dtype)
    assert cands
    for s in cands:
        cd, _, _ = run_norm_grad("layernorm", sizes, dtype, schedule=s, seed=len(cands))
        assert cd.launches[0].shared_bytes >= 48 * 1024


def test_the_same_inputs_give_the_same_bits():
    import torch

    cd, args, outs = run_norm_grad("layernorm", dict(r=2048, x=1024), "bf16", seed=4)
    again = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**args, out=again)
    torch.cuda.synchronize()
    for n in outs:
        assert torch.equal(outs[n], again[n]), n


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_user_written_chain_with_a_column_sum_and_max(dtype):
    import torch

    sizes = dict(b=3, s=77, x=999)
    cd = compile(batch_rows(), sizes=sizes, dtype=dtype)
    assert [k.family for k in cd.plan.kernels] == ["rowwise"], str(cd.plan)
    x = random_inputs(cd.diagram, device="cuda", seed=3)
    outs = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**x, out=outs)
    torch.cuda.synchronize()
    assert_matches_reference(cd, x, outs, 1e-2 if dtype == "bf16" else 1e-5, dtype)


@pytest.mark.parametrize("name, sizes, splits", [("rmsnorm", dict(r=777, x=1000), 100),   # 8 groups a block
                                                 ("layernorm", dict(r=517, x=4095), 132)])  # 4 groups, ragged rows
def test_every_prefetch_depth_gives_the_same_bits(name, sizes, splits):
    """Loading 1, 2 or 3 row groups ahead changes when the loads go out, not what is added in which
    order: the outputs are bit for bit the same, and right (depths that do not divide the groups a
    block runs end the unrolled loop early)."""
    import torch

    from napkin.codegen.families.rowwise import analyse, chain_schedule_for, make_chain_config

    d = prepare(library.get(name).grad(save=SAVES[name]), sizes=sizes, dtype="bf16")
    s = analyse(d)
    outs = []
    for depth in (1, 2, 3):
        sched = chain_schedule_for(s, make_chain_config(s, 128, 1, splits=splits, prefetch=depth), "h100")
        outs.append(run_norm_grad(name, sizes, "bf16", schedule=sched, seed=11)[2])
    for o in outs[1:]:
        for n in o:
            assert torch.equal(o[n], outs[0][n]), n


def _counters_zero(cd) -> bool:
    """Whether every persistent zeroed workspace of ``cd`` (the arrival counters, on every stream
    that ran it) is zero again."""
    import torch

    torch.cuda.synchronize()
    runner = cd._runners[torch.cuda.current_device()]
    assert runner._zeroed, "no zeroed workspace was made"
    return all(int((t.view(torch.int32) != 0).sum()) == 0 for tensors, _ in runner._zeroed.values() for t in tensors)


def _schedule(name, sizes, tpr, rows, splits, depth=1, blocks_per_sm=None):
    from napkin.codegen.families.rowwise import analyse, chain_schedule_for, make_chain_config

    d = prepare(library.get(name).grad(save=SAVES[name]), sizes=sizes, dtype="bf16")
    s = analyse(d)
    return chain_schedule_for(s, make_chain_config(s, tpr, rows, splits=splits, prefetch=depth,
                                                   blocks_per_sm=blocks_per_sm), "h100")


@pytest.mark.parametrize("name, sizes, schedule", [
    ("layernorm", dict(r=4096, x=4096), None),                       # the planner's pick (one wave)
    ("rmsnorm", dict(r=3001, x=1000), (128, 1, 100, 2)),             # 3001 groups over 100 blocks: ragged
    ("layernorm", dict(r=1037, x=1000), (32, 4, 77, 1)),             # warp mode, 260 groups over 77 blocks
    ("rmsnorm", dict(r=3001, x=5000), (640, 1, 132, 1)),             # 20 warps fitted to 625 chunks
    ("layernorm", dict(r=4096, x=4096), (512, 1, 264, 1, 2)),        # a cut budget: 2 blocks of 512 an SM
    ("layernorm", dict(r=3000, x=5000), None),                       # the planner's pick (fused: was 2 kernels)
    ("rmsnorm", dict(r=3001, x=5000), None),                         # the planner's pick: 320 threads, 2 an SM
], ids=["layernorm_4096_planned", "rmsnorm_3001x1000_splits100", "layernorm_1037x1000_splits77",
        "rmsnorm_3001x5000_fitted640", "layernorm_4096_512_squeezed", "layernorm_3000x5000_planned",
        "rmsnorm_3001x5000_planned_cut"])
def test_one_launch_same_bits_every_call_and_the_counters_back_at_zero(name, sizes, schedule):
    """The partials are added in the kernel (one launch; the counters a zeroed workspace) by whoever
    is there, in a fixed order: 20 calls, the checked path (out=) and a second stream give the same
    bits, right against autograd, and every call leaves the counters zero (a stale count would let a
    block that is not the last add partials not yet written, or none add them)."""
    import torch

    sched = _schedule(name, sizes, *schedule) if schedule else None
    cd, args, outs = run_norm_grad(name, sizes, "bf16", schedule=sched, seed=5)
    assert len(cd.launches) == 1 and [b.zeroed for b in cd.program.buffers] == [False, True]
    if schedule:
        assert cd.plan.kernels[0].kernel.options.splits == schedule[2]
    assert _counters_zero(cd)
    inputs = [args[n] for n in cd.input_names]
    for _ in range(20):
        got = cd(*inputs)  # the fast path
        got = got if isinstance(got, tuple) else (got,)
        for n, g in zip(cd.output_names, got):
            assert torch.equal(g, outs[n]), n
    assert _counters_zero(cd)
    again = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**args, out=again)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = [cd(*inputs) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    for got in [tuple(again[n] for n in cd.output_names), *other]:
        got = got if isinstance(got, tuple) else (got,)
        for n, g in zip(cd.output_names, got):
            assert torch.equal(g, outs[n]), n
    assert _counters_zero(cd)


def test_a_grid_larger_than_the_gpu_holds():
    """5000 blocks of 1024 threads (row groups of one row, 3 a block, the last ragged): far more than
    the GPU holds at once, so the first blocks finish before the last start; they must not wait for
    those (a deadlock) but leave the sum to the blocks there at the end: right, the same bits every
    call, the counters zero."""
    import torch

    sizes = dict(r=14999, x=4096)
    cd, args, outs = run_norm_grad("rmsnorm", sizes, "bf16", schedule=_schedule("rmsnorm", sizes, 1024, 1, 5000),
                                   seed=6)
    assert cd.launches[0].grid[0] == 5000 and cd.launches[0].block[0] == 1024
    inputs = [args[n] for n in cd.input_names]
    for _ in range(5):
        got = cd(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        for n, g in zip(cd.output_names, got):
            assert torch.equal(g, outs[n]), n
    assert _counters_zero(cd)


@pytest.mark.parametrize("sizes", [dict(r=4096, x=4096), dict(r=777, x=5000), dict(r=300, x=1000)])
def test_the_rmsnorm_backward_that_recomputes_rstd(sizes):
    """Nothing saved: the kernel recomputes rstd and takes it out of Σ dN·N (rstd·Σ dN·X, summed in
    the first pass beside Σ X²: two passes). Right against torch.autograd of F.rms_norm in float64,
    into NaN-filled outputs, and the same bits on every call."""
    import torch

    cd = compile(library.get("rmsnorm").grad(), sizes=sizes, dtype="bf16")
    assert [k.family for k in cd.plan.kernels] == ["rowwise"] and len(cd.launches) == 1
    assert len(set(re.findall(r"// ---- pass \d+", cd.launches[0].source))) == 2
    gen = torch.Generator(device="cuda").manual_seed(9)
    r, x = sizes["r"], sizes["x"]
    env = {"X": (torch.randn(r, x, device="cuda", generator=gen) * 2 + 0.5).bfloat16(),
           "gamma": (torch.randn(x, device="cuda", generator=gen) + 1).bfloat16(),
           "dY": torch.randn(r, x, device="cuda", generator=gen).bfloat16()}
    assert set(cd.input_names) == set(env), cd.input_names
    args = {n: env[n] for n in cd.input_names}
    outs = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**args, out=outs)
    want = dict(zip(("dX", "dgamma"), torch_grads("rmsnorm", env["X"], env["gamma"], None, env["dY"])))
    for n in cd.output_names:
        assert not torch.isnan(outs[n]).any(), n
        err = rel_err(outs[n], want[n])
        assert err <= 1e-2, f"{n}: relative error {err:.2e} (autograd)"
    for _ in range(3):
        got = cd(*(args[n] for n in cd.input_names))
        got = got if isinstance(got, tuple) else (got,)
        for n, g in zip(cd.output_names, got):
            assert torch.equal(g, outs[n]), n


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("sizes", [dict(r=8191, x=768), dict(r=4001, x=1024), dict(r=3001, x=2048),
                                   dict(r=2999, x=4096)])
def test_warp_rows_and_partials_in_registers(name, sizes):
    """The planner's picks at the widths where it now takes a warp a row (768-1024: 24-32 values a
    thread over a wave of blocks) or adds the column partials in registers (COLPART_REGS, 2048 and
    4096): fresh inputs, NaN-filled outputs,
    row counts that leave a ragged last row group, against the float64 reference and autograd."""
    cd, _, _ = run_norm_grad(name, sizes, "bf16", seed=sizes["r"])
    (launch,) = cd.program.launches
    t = dict(launch.tunables)
    if sizes["x"] <= 1024:
        assert (t["THREADS_PER_ROW"], t["ROWS_PER_BLOCK"]) == (32, 4), t
    else:
        assert t["COLPART_REGS"] == 1 and "rc_0[c0 + u][e]" in launch.source, t


@pytest.mark.parametrize("name, sizes, dtype", [("rmsnorm", dict(r=1000, x=16384), "bf16"),
                                                ("layernorm", dict(r=777, x=16384), "bf16"),
                                                ("rmsnorm", dict(r=613, x=10240), "bf16"),
                                                ("layernorm", dict(r=301, x=10000), "bf16"),
                                                ("rmsnorm", dict(r=257, x=12000), "fp32"),
                                                ("layernorm", dict(r=129, x=9996), "fp32"),
                                                ("rmsnorm", dict(r=513, x=24576), "bf16")])
def test_rows_too_long_for_registers_stream_with_their_column_reductions(name, sizes, dtype):
    """Rows no register configuration holds (past 8192 16-bit values): the planner's pick streams
    the row in every pass, the column partials in shared memory, in one launch (before: two
    kernels). Rows whose last chunks only some threads hold (10000 on 512 threads: 2.4 chunks a
    thread; 9996 fp32) and two steps of chunks (24576); fresh inputs, NaN-filled outputs, against
    the float64 reference and autograd, and the same bits on a second call."""
    import torch

    cd, args, outs = run_norm_grad(name, sizes, dtype, seed=sizes["x"])
    (launch,) = cd.program.launches
    assert dict(launch.tunables)["STREAM"] == 1, dict(launch.tunables)
    again = cd(*(args[n] for n in cd.input_names))
    again = again if isinstance(again, tuple) else (again,)
    for n, g in zip(cd.output_names, again):
        assert torch.equal(g, outs[n]), n


def test_every_streamed_configuration_of_a_long_row():
    d = prepare(library.get("layernorm").grad(save=SAVES["layernorm"]), sizes=dict(r=555, x=10240), dtype="bf16")
    cands = FAMILY.candidates(d, "h200", "bf16")
    assert len(cands) >= 3 and all(s.kernels[0].options.streamed for s in cands)
    for s in cands:
        run_norm_grad("layernorm", dict(r=555, x=10240), "bf16", schedule=s, seed=len(cands))


@pytest.mark.parametrize("name, sizes", [("rmsnorm", dict(r=1000, x=1024)), ("layernorm", dict(r=333, x=4096)),
                                         ("rmsnorm", dict(r=300, x=12288))])
@pytest.mark.parametrize("shifted", ["X", "dY", "dX", None])
def test_both_paths_of_a_row_of_whole_vectors(name, sizes, shifted):
    """A 16-bit row of whole vectors runs one of two paths, chosen once by the kernel: every array it
    reads or writes by vectors starts on a 16-byte boundary (no check per chunk), or one does not
    (a contiguous view one value into its storage: the checked loads). Both against the float64
    reference, outputs NaN-filled, the same bits either way."""
    import torch

    d = library.get(name).grad(save=SAVES[name])
    cd = compile(d, sizes=sizes, dtype="bf16")
    (launch,) = cd.program.launches
    assert "constexpr bool AL = true;" in launch.source and "constexpr bool AL = false;" in launch.source

    def shifted_copy(t, shift):
        flat = torch.empty(t.numel() + shift, dtype=t.dtype, device="cuda")
        view = flat[shift:].view(t.shape)
        view.copy_(t)
        return view

    env = norm_inputs(name, sizes["r"], sizes["x"], "bf16", sizes["x"])
    args = {n: env[n] for n in cd.input_names}
    plain = cd.empty_outputs(device="cuda", fill=float("nan"))
    cd(**args, out=plain)
    if shifted in args:
        args = dict(args, **{shifted: shifted_copy(args[shifted], 1)})
    outs = cd.empty_outputs(device="cuda", fill=float("nan"))
    if shifted == "dX":
        outs["dX"] = shifted_copy(outs["dX"], 1)
    cd(**args, out=outs)
    torch.cuda.synchronize()
    assert_matches_reference(cd, args, outs, TOL["bf16"], f"{name} {sizes} {shifted}")
    for n in cd.output_names:
        assert torch.equal(outs[n], plain[n]), f"{n}: the two paths differ in bits"
