"""The row-wise family's chain kernel, without a GPU: what it takes (any maps and reductions over one
row of one or several innermost axes) and refuses, that the planner runs such a chain as ONE
row-wise kernel, the passes and the register/streamed modes of the generated source, and the
model's view of it (launch estimate, a streamed row's re-reads)."""

from __future__ import annotations

import re

import pytest

from napkin.codegen.families import rowwise
from napkin.codegen.families.rowwise import FAMILY, ChainShape, analyse
from napkin.codegen.lower import build, lower
from napkin.codegen.planner import derive
from napkin.codegen.prepare import prepare
from napkin.codegen.select import predict_schedule
from napkin.diagrams import Axis, Diagram, absolute, array, causal, exp, library, logsumexp, map_fn, max_over, \
    mean_over, reduce, rsqrt, scale, softmax, square, sum_over

CHAINS = ("log_softmax", "l2_normalize", "group_norm", "logsumexp_rows", "row_range")


def bound(d: Diagram, dtype: str = "bf16", **sizes) -> Diagram:
    return prepare(d, sizes=sizes, dtype=dtype)


# ----------------------------------------------------------------------------- user-written chains

def rows(*names):
    return [Axis(n) for n in names]


def l1_normalize() -> Diagram:
    """Rows over their L1 norm (F.normalize with p = 1): a sum, then a second pass."""
    r, x = rows("r", "x")
    X = array("X", r, x)
    return Diagram("l1", (X / sum_over(absolute(X), x, name="n1")).named("Y"))


def min_max_scale() -> Diagram:
    """(X − min)/(max − min) per row: a max and a min in one pass, then a second pass."""
    r, x = rows("r", "x")
    X = array("X", r, x)
    lo = reduce(X, x, "min", name="lo")
    return Diagram("minmax", ((X - lo).named("D") / (max_over(X, x, name="hi") - lo).named("span")).named("Y"))


def centred() -> Diagram:
    """Two outputs: the row minus its mean (row-shaped) and the mean (one per row)."""
    r, x = rows("r", "x")
    X = array("X", r, x)
    mu = mean_over(X, x, name="mu")
    return Diagram("centred", ((X - mu).named("C"), mu))


def hand_layernorm() -> Diagram:
    """layernorm written by hand, with a per-row scale s[r] and a broadcast bias b[x]."""
    r, x = rows("r", "x")
    X, s, b = array("X", r, x), array("s", r), array("b", x)
    D = (X - mean_over(X, x, name="mu")).named("D")
    Y = (D * rsqrt(mean_over(square(D), x, name="var") + 1e-5) * s + b).named("Y")
    return Diagram("hand_ln", Y)


def masked_lse() -> Diagram:
    """logsumexp over keys of causally masked scores: index maps on a kept axis (q) and the row (x)."""
    h, q, x = rows("h", "q", "x")
    return Diagram("masked_lse", logsumexp(causal(scale(array("S", h, q, x), 0.125), "q", "x"), "x", name="L"))


USER = {"l1": l1_normalize, "minmax": min_max_scale, "centred": centred, "hand_ln": hand_layernorm,
        "masked_lse": masked_lse}
USER_SIZES = {"l1": dict(r=512, x=4096), "minmax": dict(r=512, x=4095), "centred": dict(r=300, x=1000),
              "hand_ln": dict(r=1024, x=4096), "masked_lse": dict(h=4, q=256, x=256)}


# ----------------------------------------------------------------------------- planning

@pytest.mark.parametrize("gpu", ["h100", "a100"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", CHAINS)
def test_library_chains_plan_as_one_rowwise_kernel(name, dtype, gpu):
    e = library.entry(name)
    der = derive(library.get(name), gpu, dtype, sizes=e.default_sizes)
    assert der.plan.families == ("rowwise",), str(der.plan)
    d = der.plan.diagram
    assert set(der.plan.kernels[0].kernel.boxes) == {d.name_of(v) for v in d.nodes}


@pytest.mark.parametrize("name", sorted(USER))
def test_user_written_chains_plan_as_one_rowwise_kernel(name):
    der = derive(USER[name](), "h100", "bf16", sizes=USER_SIZES[name])
    assert der.plan.families == ("rowwise",), str(der.plan)
    program = build(der.plan)
    assert len(program.launches) == 1 and program.launches[0].template == "rowwise.cu.jinja"
    assert "rowwise_chain" in program.launches[0].name


@pytest.mark.parametrize("how", ["sum", "max", "min"])
def test_one_reduction_in_one_pass_is_the_pointwise_familys(how):
    # a row sum, max or min with maps around it: pointwise's row kernel (which also splits a long
    # row over blocks); row-wise takes two reductions (row_range) or a second pass (l1 above)
    r, x = rows("r", "x")
    d = bound(Diagram("one", map_fn("sqrt", reduce(square(array("X", r, x)), x, how, name="S"), name="Y")),
              r=512, x=4096)
    assert "pointwise family runs it" in _refusal(d)
    assert derive(d, "h100", "bf16", explain=False).plan.families == ("pointwise",)


def test_the_chain_beats_the_kernels_apart_in_the_model():
    # log-softmax apart is a max, an exp-sum and a map pass: three reads of X; fused, one
    der = derive(library.get("log_softmax"), "h100", "bf16", sizes={"r": 4096, "x": 4096})
    fused = [line for line in der.decisions if line.startswith("fused")]
    assert fused, der.decisions
    t_fused, t_apart = map(float, re.findall(r"([0-9.]+) µs", fused[0])[:2])
    assert t_fused < t_apart


def test_norms_keep_their_own_kernel():
    for name in ("softmax", "layernorm", "rmsnorm"):
        d = bound(library.get(name), r=64, x=4096)
        s = analyse(d)
        assert not isinstance(s, (str, ChainShape)) and s.kind == name
        (k,) = lower(d, family="rowwise", arch="sm_90a").launches
        assert k.name.endswith(f"_rowwise_{name}")


# ----------------------------------------------------------------------------- analysis

def test_group_norm_is_a_row_of_two_axes():
    s = analyse(bound(library.get("group_norm"), n=2, g=4, c=8, s=64))
    assert isinstance(s, ChainShape)
    assert s.red == ("c", "s") and s.row_axes == ("n", "g") and s.xsize == 512 and s.nrows == 8
    assert s.passes == 3 and [c.how for c in s.chains] == ["sum", "sum"]
    assert all(abs(c.scale - 1 / 512) < 1e-15 for c in s.chains)           # mean of means
    gamma = s.diagram.value("gamma")
    assert s.access[id(gamma)] == "gather" and s.chunk_constant(gamma)      # c changes every 64 columns
    ragged = analyse(bound(library.get("group_norm"), n=2, g=4, c=8, s=63))
    assert not ragged.chunk_constant(ragged.diagram.value("gamma"))


# log-softmax and logsumexp: the sum of exp(x − max) runs beside the max (an online pair)
@pytest.mark.parametrize("name, passes", [("log_softmax", 2), ("l2_normalize", 2), ("logsumexp_rows", 1),
                                          ("row_range", 1)])
def test_passes(name, passes):
    s = analyse(bound(library.get(name), r=8, x=1000))
    assert isinstance(s, ChainShape) and s.passes == passes


def _pairs(d: Diagram, **sizes) -> list:
    s = analyse(bound(d, **sizes))
    return [(c.how, None if c.pair is None else s.name(c.pair.result), c.exact) for c in s.chains], s.passes


def test_a_sum_of_exp_shifted_by_the_max_runs_beside_it():
    r, x = rows("r", "x")
    X, Y = array("X", r, x), array("Y", r, x)
    # log-softmax shifts by the max itself (exact: an infinite max makes the sum NaN), logsumexp by
    # zero_inf of it
    assert _pairs(library.get("log_softmax"), r=8, x=100) == ([("max", None, True), ("sum", "m", True)], 2)
    assert _pairs(library.get("logsumexp_rows"), r=8, x=100)[0][1][1:] == ("max", False)
    # the exp also an output: it is evaluated per element, so the sum waits for the max's pass
    m = max_over(X, x, name="m")
    e = exp(X - m, name="E")
    assert _pairs(Diagram("e_out", (sum_over(e, x, name="s"), e)), r=8, x=100) == (
        [("max", None, True), ("sum", None, True)], 2)
    # the shift of another value than the one the max is of: no pair
    other = Diagram("other", sum_over(exp(Y - max_over(X, x, name="m2"), name="E2"), x, name="s2"))
    assert _pairs(other, r=8, x=100) == ([("max", None, True), ("sum", None, True)], 2)


def test_streamed_rows_are_offered_where_registers_hold_one_block_an_sm():
    # logsumexp over 50257 bf16 in registers: 512 threads of 104 registers, one block an SM
    d = bound(library.get("logsumexp_rows"), r=4096, x=50257)
    cands = FAMILY.candidates(d, "h200", "bf16")
    modes = {bool(c.kernels[0].options.streamed) for c in cands}
    assert modes == {True, False}
    assert derive(d, "h200", "bf16", explain=False).plan.kernels[0].kernel.options.streamed
    # over 4096 values registers hold several blocks an SM: register mode only
    short = bound(library.get("logsumexp_rows"), r=8192, x=4096)
    assert not any(c.kernels[0].options.streamed for c in FAMILY.candidates(short, "h200", "bf16"))


def test_one_pass_chains_prefer_more_values_a_thread():
    # among configurations the model prices alike: up to 8 chunks a thread where the passes keep
    # nothing (64 bf16 values, 32 fp32), up to 32 values where a later pass reads them again
    def first(name, dtype):
        return rowwise.chain_configs(analyse(bound(library.get(name), dtype, r=8192, x=4096)))[0]

    assert first("logsumexp_rows", "bf16").values_per_thread == 64
    assert first("logsumexp_rows", "fp32").values_per_thread == 32
    assert first("log_softmax", "bf16").values_per_thread == 32


def _refusal(d: Diagram) -> str:
    why = FAMILY.explain(d)
    assert why is not None
    return why


def test_refusals_name_what_is_wrong():
    r, x = rows("r", "x")
    X = array("X", r, x)
    # a column reduction: the reduced axis is not innermost
    assert "innermost" in _refusal(bound(Diagram("col", sum_over(X, r, name="Y")), r=8, x=64))
    # max and min mixed in one chain over a row of two axes
    a, b = rows("a", "b")
    Z = array("Z", r, a, b)
    mixed = Diagram("mixed", reduce(max_over(Z, b), a, "min", name="Y"))
    assert "mix" in _refusal(bound(mixed, r=4, a=8, b=8))
    # a partial reduction read by a map: not one value per row
    part = max_over(Z, b, name="P")
    assert "partial" in _refusal(bound(Diagram("part", (sum_over(part, a, name="Y"), part * 2.0)), r=4, a=8, b=8))
    # reductions over different rows: (a, b) for Y1, b alone for Y2
    assert "not the whole row" in _refusal(bound(Diagram("two", (sum_over(sum_over(Z, b), a, name="Y1"),
                                                                  sum_over(Z, b, name="Y2"))), r=4, a=8, b=8))
    # a softmax box with reductions
    assert "softmax or norm box together" in _refusal(
        bound(Diagram("sm_red", (softmax(X, x, name="P"), sum_over(X, x, name="S"))), r=8, x=64))
    # no reduction at all: the pointwise family's
    assert "no reduction" in _refusal(bound(Diagram("maps", exp(X, name="Y")), r=8, x=64))


# ----------------------------------------------------------------------------- the kernel

def _source(name_or_diagram, dtype="bf16", gpu="h100", **sizes) -> str:
    d = library.get(name_or_diagram) if isinstance(name_or_diagram, str) else name_or_diagram
    arch = "sm_80" if gpu == "a100" else "sm_90a"
    (k,) = lower(d, sizes=sizes, dtype=dtype, family="rowwise", gpu=gpu, arch=arch).launches
    return k.source


def one_path(src: str) -> str:
    """The general path of a kernel with two (the aligned one first), else the whole source."""
    return src.split("constexpr bool AL = false;")[-1]


#: a checked 16-byte load: load_vec, or on a kernel's aligned path load_vec_al
LOAD_VEC = re.compile(r"napkin::load_vec(_al<AL, EVEN>)?\(")


def test_register_mode_reads_every_input_once():
    src = one_path(_source("log_softmax", r=64, x=4096))
    assert len(LOAD_VEC.findall(src)) == 1 and src.count("// ---- pass") == 2
    assert "kv_X[UNROLL]" in src and "#pragma unroll 1" not in src
    # the max and the sum of exp(x − max) as one pair: folded a chunk at a time, then merged by
    # shuffles (a part of a warp) or a round over the block
    assert "fold_max_sumexp<VEC, true>(acc_m, acc_s, pv_m)" in src and "xor_reduce_max_sumexp<" in src
    gl = one_path(_source("l2_normalize", r=64, x=4096))
    assert "xor_reduce<napkin::SumOp" in gl or "warp_reduce<napkin::SumOp>" in gl
    gn = _source("group_norm", n=2, g=4, c=4, s=256)
    assert len(LOAD_VEC.findall(one_path(gn))) == 1 and "j_c = col0 / 256" in gn     # gamma/beta once per chunk


def test_a_row_too_long_for_registers_is_streamed():
    d = bound(library.get("log_softmax"), r=16, x=1 << 18)
    cands = FAMILY.candidates(d, "h100", "bf16")
    assert cands and all(c.kernels[0].options.stages in rowwise.STREAM_UNROLLS for c in cands)
    src = one_path(_source("log_softmax", gpu="a100", r=16, x=1 << 18))
    assert len(LOAD_VEC.findall(src)) == 2 and "#pragma unroll 1" in src   # each pass reads X again
    # on Hopper the blocks of a cluster keep the row (512 KiB) in their shared memory: X read once
    whole = _source("log_softmax", r=16, x=1 << 18)
    src = one_path(whole)
    assert "__cluster_dims__" in whole and src.count("napkin::cache_chunk_async(") == 1
    assert not LOAD_VEC.findall(src)
    # the model charges the re-read of X (the max and the sum in one pass, the output in the next)
    est = FAMILY.launch_estimate(d, cands[0], "h100")
    assert est["extra_hbm_bytes"] == 16 * (1 << 18) * 2
    # a one-pass chain streams without re-reading
    one = bound(library.get("row_range"), r=16, x=1 << 20)
    est = FAMILY.launch_estimate(one, FAMILY.candidates(one, "h100", "bf16")[0], "h100")
    assert "extra_hbm_bytes" not in est


def test_launch_estimate_and_prediction():
    d = bound(library.get("logsumexp_rows"), r=16384, x=4096)
    for s in FAMILY.candidates(d, "h100", "bf16"):
        est = FAMILY.launch_estimate(d, s, "h100")
        opts = s.kernels[0].options
        assert est["threads_per_row"] == opts.threads_per_row and est["threads"] == opts.warps * 32
        assert est["regs"] == opts.regs_per_thread and est["reductions"] == 1   # max and sum as one pair
        r = predict_schedule(d, FAMILY, s, "h100")
        # at least the HBM time of reading X once and writing Y once
        assert r.seconds >= (16384 * 4096 * 2 + 16384 * 2) / 3.35e12


def test_every_configuration_lowers_back_to_itself():
    d = bound(library.get("group_norm"), n=2, g=4, c=5, s=999)
    for s in FAMILY.candidates(d, "h100", "fp32"):
        cfg = FAMILY.config(d, s)
        (k,) = FAMILY.lower(d, s, "sm_90a").launches
        t = dict(k.tunables)
        assert (t["THREADS_PER_ROW"], t["ROWS_PER_BLOCK"], t["CHUNKS_PER_THREAD"], bool(t["STREAM"])) == \
            (cfg.threads_per_row, cfg.rows_per_block, cfg.chunks_per_thread, cfg.stream)
        assert k.model_regs_per_thread == s.kernels[0].options.regs_per_thread


def test_a_per_row_output_is_written_once_per_row():
    src = _source(centred(), r=300, x=1000)
    assert "if (row_ok && lane == 0)" in src and "out_mu[off_mu]" in src
    assert re.search(r"napkin::store_vec(_al<AL, EVEN>)?\(out_C", src)
