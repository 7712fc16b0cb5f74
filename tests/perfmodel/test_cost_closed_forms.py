"""The cost model reproduces the paper's closed forms exactly, symbolically and numerically."""

import json
import math

import pytest
import sympy

from napkin.diagrams import Axis, array, contract, library, map_fn, rename
from napkin.diagrams.diagram import Diagram
from napkin.diagrams.functions import get_function
from napkin.errors import ScheduleError
from napkin.perfmodel import Schedule, cost
from napkin.perfmodel.schedule import Kernel, Relabel

S = lambda name: sympy.Symbol(name, integer=True, positive=True)
a, b, c, q, x, d, h = (S(n) for n in "abcqxdh")
g_a, g_c, s_b, g_q, s_x, w_q = (S(n) for n in ("g_a", "g_c", "s_b", "g_q", "s_x", "w_q"))


def same(e1, e2) -> bool:
    return sympy.simplify(sympy.sympify(e1) - sympy.sympify(e2)) == 0


def matmul_sched(**kw):
    return Schedule.fused(library.get("matmul"), groups={"a": None, "c": None}, streams={"b": None}, gpu=None, **kw)


def attention_sched(name="attention", **groups):
    return Schedule.fused(library.get(name), groups={"q": None, **groups}, streams={"x": None}, gpu=None)


# ----------------------------------------------------------------------------- symbolic


def test_matmul_symbolic_H_and_M():
    cst = cost(matmul_sched())
    assert cst.is_symbolic
    H = a * b * c * (1 / g_a + 1 / g_c) + a * c
    for level in ("HBM", "L2", "SMEM"):
        assert same(cst.H(level), H), level
    assert same(cst.M("SMEM"), g_a * g_c + s_b * (g_a + g_c))
    assert same(cst.groups, a * c / (g_a * g_c))
    assert same(cst.steps, b / s_b)
    assert same(cst.levels["L2"].H_per_group_elements, b * g_a + b * g_c + g_a * g_c)
    # bf16: two bytes per value
    assert same(cst.H_bytes("L2"), 2 * H)
    assert same(cst.flops["tensor"], 2 * a * b * c) and cst.flops["cuda"] == 0


def test_matmul_untiled():
    cst = cost(Schedule.fused(library.get("matmul"), gpu=None))
    assert same(cst.H("L2"), a * b + b * c + a * c)
    assert same(cst.M("SMEM"), a * b + b * c + a * c)
    assert cst.groups == 1 and cst.steps == 1


def test_matmul_rf_is_mma_operand_traffic():
    # m16n8k16: A is re-read once per 8 columns of C, B once per 16 rows
    cst = cost(matmul_sched())
    assert same(cst.H("RF"), a * b * c / 8 + a * b * c / 16)
    assert cst.H("TC") == 0


def test_matmul_fp32_accumulator_bytes():
    cst = cost(matmul_sched(), accumulator_dtype="fp32")
    assert same(cst.M_bytes("SMEM"), 2 * s_b * (g_a + g_c) + 4 * g_a * g_c)
    assert same(cost(matmul_sched()).M_bytes("SMEM"), 2 * (s_b * (g_a + g_c) + g_a * g_c))


def test_attention_symbolic():
    cst = cost(attention_sched())
    H = 2 * q * d + 2 * x * d * q / g_q
    for level in ("HBM", "L2", "SMEM"):
        assert same(cst.H(level), H), level
    assert same(cst.M("SMEM"), 2 * d * (g_q + s_x))
    assert same(cst.flops["tensor"], 4 * q * x * d)
    # softmax: one exp per score, plus the online rescale exp per row per step
    assert same(cst.flops["sfu"], q * x + q * x / s_x)
    # registers: S, S_scaled/P tiles and the running max and sum
    assert same(cst.M("RF"), 2 * g_q * s_x + 2 * g_q)


def test_attention_per_warp_groups_apply_inside_the_block():
    s = Schedule.fused(library.get("attention"), groups={"q": [(None, "SMEM"), (None, "RF")]},
                       streams={"x": None}, gpu=None)
    cst = cost(s)
    assert same(cst.H("L2"), 2 * q * d + 2 * x * d * q / g_q)
    assert same(cst.H("SMEM"), 2 * q * d + 2 * x * d * q / w_q)
    # the block's memory does not change: warps hold the block tile between them
    assert same(cst.M("SMEM"), 2 * d * (g_q + s_x))


@pytest.mark.parametrize("group_h", [True, False])
def test_multi_head_multiplies_by_h(group_h):
    cst = cost(attention_sched("mha", **({"h": 1} if group_h else {})))
    assert same(cst.H("L2"), h * (2 * q * d + 2 * x * d * q / g_q))
    expected_M = 2 * d * (g_q + s_x) * (1 if group_h else h)
    assert same(cst.M("SMEM"), expected_M)


def test_unfused_attention_adds_4qx():
    cst = cost(Schedule.unfused(library.get("attention"), groups={"q": None}, streams={"x": None}, gpu=None))
    assert [k.boxes for k in cst.per_kernel] == [("S", "S_scaled"), ("P",), ("O",)]
    assert same(cst.H("L2"), 2 * q * d + 2 * x * d * q / g_q + 4 * q * x)
    fused = cost(attention_sched())
    assert same(cst.H("L2") - fused.H("L2"), 4 * q * x)
    mh = cost(Schedule.unfused(library.get("mha"), groups={"q": None}, streams={"x": None}, gpu=None))
    assert same(mh.H("L2"), h * (2 * q * d + 2 * x * d * q / g_q + 4 * q * x))


def test_unfused_plain_attention_kernels():
    cst = cost(Schedule.unfused(library.get("attention"), gpu=None))
    # untiled: every kernel reads its inputs once and writes its output once
    assert same(cst.H("L2"), (q * d + x * d + q * x) + 2 * q * x + (q * x + x * d + q * d))


def test_causal_softcap_variants_keep_the_transfer_formula():
    for name in ("attention_causal", "attention_window", "attention_alibi", "attention_softcap"):
        cst = cost(attention_sched(name))
        assert same(cst.H("L2"), h * (2 * q * d + 2 * x * d * q / g_q)), name


# ----------------------------------------------------------------------------- numeric


def test_attention_numeric_matches_formula_with_ceilings():
    d_ = library.get("attention").bind(q=1000, x=777, d=64)
    cst = cost(Schedule.fused(d_, groups={"q": 128}, streams={"x": 64}, gpu=None))
    assert not cst.is_symbolic
    ng = math.ceil(1000 / 128)
    assert cst.H("L2") == 2 * 1000 * 64 + 2 * 777 * 64 * ng
    assert cst.H_bytes("L2") == 2 * cst.H("L2")
    assert cst.M("SMEM") == 2 * 64 * (128 + 64)
    assert cst.groups == ng and cst.steps == math.ceil(777 / 64)
    assert isinstance(cst.H("L2"), int)


def test_matmul_numeric_and_numeric_from_symbolic():
    sym = cost(matmul_sched())
    sizes = {"a": 300, "b": 200, "c": 100, "g_a": 64, "g_c": 32, "s_b": 16}
    num = sym.numeric(sizes)
    na, nc = math.ceil(300 / 64), math.ceil(100 / 32)
    assert num.H("L2") == 300 * 200 * nc + 200 * 100 * na + 300 * 100
    assert num.M("SMEM") == 64 * 32 + 16 * (64 + 32)
    assert num.flops["tensor"] == 2 * 300 * 200 * 100
    # exact substitution agrees when the groups divide
    div = {"a": 256, "b": 64, "c": 128, "g_a": 64, "g_c": 32, "s_b": 16}
    assert sym.subs(div).H("L2") == sym.numeric(div).H("L2")


def test_multi_head_numeric():
    sizes = dict(h=3, q=100, x=50, d=32)
    m = cost(Schedule.fused(library.get("mha").bind(**sizes), groups={"q": 32, "h": 1}, streams={"x": 16}, gpu=None))
    one = cost(Schedule.fused(library.get("attention").bind(q=100, x=50, d=32), groups={"q": 32}, streams={"x": 16},
                              gpu=None))
    assert m.H("L2") == 3 * one.H("L2")
    u = cost(Schedule.unfused(library.get("attention").bind(q=100, x=50, d=32), groups={"q": 32},
                              streams={"x": 16}, gpu=None))
    assert u.H("L2") - one.H("L2") == 4 * 100 * 50


def test_fp32_bytes_and_cuda_cores():
    d_ = library.get("matmul").with_dtype("fp32").bind(a=64, b=64, c=64)
    cst = cost(Schedule.fused(d_, groups={"a": 32, "c": 32}, streams={"b": 8}, gpu=None))
    assert cst.H_bytes("L2") == 4 * cst.H("L2")
    assert cst.flops["tensor"] == 0 and cst.flops["cuda"] == 2 * 64 ** 3
    assert cst.H("RF") == 0


# ----------------------------------------------------------------------------- L2 caching


def test_l2_caching_off_means_hbm_equals_l2():
    d_ = library.get("matmul").bind(a=4096, b=4096, c=4096)
    s = Schedule.fused(d_, groups={"a": 128, "c": 128}, streams={"b": 32})
    off = cost(s, "h100", l2_caching=False)
    assert off.H("HBM") == off.H("L2")
    on = cost(s, "h100")
    assert on.H("HBM") < on.H("L2")
    assert on.H("HBM") >= 2 * 4096 * 4096 + 4096 * 4096  # never below compulsory traffic
    kc = on.per_kernel[0]
    P = kc.concurrent_blocks
    assert P >= 2 and math.prod(kc.l2_split.values()) <= P


def test_l2_caching_square_split_for_a_2d_grid():
    d_ = library.get("matmul").bind(a=2048, b=2048, c=2048)
    s = Schedule.fused(d_, groups={"a": 128, "c": 128}, streams={"b": 32})
    cst = cost(s, "h100", concurrent_blocks=4)
    assert cst.per_kernel[0].l2_split == {"a": 2, "c": 2}
    n = 2048
    assert cst.H("HBM") == n ** 3 // 256 + n ** 3 // 256 + n * n
    # symbolic: split evenly, √P per axis
    P = sympy.Symbol("P", positive=True)
    sym = cost(matmul_sched(), concurrent_blocks=P)
    assert same(sym.H("HBM"), a * b * c * (1 / (g_a * sympy.sqrt(P)) + 1 / (g_c * sympy.sqrt(P))) + a * c)
    assert same(sym.H("L2"), a * b * c * (1 / g_a + 1 / g_c) + a * c)


def test_l2_caching_attention_all_blocks_resident():
    # 32 query blocks all fit on the chip at once: K and V come from DRAM once
    d_ = library.get("attention").bind(q=4096, x=4096, d=128)
    cst = cost(Schedule.fused(d_, groups={"q": 128}, streams={"x": 64}), "h100")
    assert cst.H("HBM") == 4 * 4096 * 128
    assert cst.H("L2") == 2 * 4096 * 128 + 2 * 4096 * 128 * 32


def test_l2_caching_not_applied_when_nothing_to_gain():
    d_ = library.get("softmax").bind(r=4096, x=4096)
    cst = cost(Schedule.fused(d_, groups={"r": 4}), "h100")
    assert cst.H("HBM") == cst.H("L2") == 2 * 4096 * 4096


# ----------------------------------------------------------------------------- API


def test_cost_serialises_and_prints():
    sym = cost(attention_sched())
    blob = json.dumps(sym.to_dict())
    assert "g_q" in blob
    num = sym.numeric({"q": 256, "x": 256, "d": 64, "g_q": 64, "s_x": 32})
    data = json.loads(json.dumps(num.to_dict()))
    assert data["levels"]["L2"]["H_elements"] == num.H("L2")
    assert isinstance(data["total_flops"], int)
    text = str(num)
    for level in ("HBM", "L2", "SMEM", "RF", "TC"):
        assert level in text
    assert "flops" in text


def test_symbolic_true_on_bound_diagram_uses_axis_symbols():
    d_ = library.get("attention").bind(q=64, x=64, d=16)
    cst = cost(Schedule.fused(d_, groups={"q": None}, streams={"x": None}, gpu=None), symbolic=True)
    assert same(cst.H("L2"), 2 * q * d + 2 * x * d * q / g_q)
    with pytest.raises(ScheduleError, match="needs sizes"):
        cost(attention_sched(), symbolic=False)


def test_per_kernel_details_and_roofline_work():
    d_ = library.get("attention").bind(q=256, x=256, d=64)
    cst = cost(Schedule.unfused(d_, groups={"q": 64}, streams={"x": 64}), "h100")
    assert len(cst.per_kernel) == 3
    assert sum(k.H("L2") for k in cst.per_kernel) == cst.H("L2")
    assert cst.M("SMEM") == max(k.M("SMEM") for k in cst.per_kernel)
    assert cst.per_kernel[1].inputs == ("S_scaled",) and cst.per_kernel[1].outputs == ("P",)
    w = cst.to_work()
    assert w.bytes["HBM"] == cst.H_bytes("HBM")


def gram():
    q_, e_ = Axis("q", 32), Axis("e", 16)
    X = array("X", q_, e_)
    Xn = (X * 2.0).named("Xn")
    Xk = rename(Xn, q="x", name="Xk")
    return Diagram("gram", contract(Xn, Xk, over="e", name="G"))


def test_rename_is_a_free_view():
    cst = cost(Schedule.unfused(gram(), groups={"q": 8}, gpu=None))
    k0, k1 = cst.per_kernel
    assert k0.boxes == ("Xn", "Xk") and k0.outputs == ("Xn",)  # Xk is a view of Xn: not written again
    assert k1.inputs == ("Xn", "Xk")
    assert cst.H("L2") == (32 * 16 + 32 * 16) + (32 * 16 + 32 * 16 * 4 + 32 * 32)
    scale = get_function("scale").cost(half=True)[0]  # the diagram's values are bf16
    assert cst.flops["cuda"] == scale * 32 * 16  # the scale; the rename is free


def test_group_over_an_axis_a_box_lacks_recomputes_it():
    n_, k_ = Axis("n", 12), Axis("k", 8)
    A, B = array("A", n_, k_), array("B", k_)
    v = contract(A, B, over="k", name="v")
    sb = contract(B, B, over="k", name="sb")
    dd = Diagram("two", (v, sb))
    cst = cost(Schedule(dd, (Kernel("k", ("v", "sb"), (Relabel("n", 4),)),), gpu=None))
    # B is read by every one of the 3 groups; sb (no n) is computed and written by each group
    assert cst.H("L2") == 12 * 8 + 8 * 3 + 12 + 1 * 3


# ----------------------------------------------------------------------------- GQA: K/V shared in L2


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_gqa_reads_each_kv_head_once_from_hbm(gpu):
    """8 K/V heads, 8 query heads each: the blocks of the query heads (and query tiles) sharing a
    K/V head run one after another, so its K and V slab (16384 x 128 bf16, 4 MiB each) stays in
    L2 and crosses HBM once per K/V head, not once per query head (the concurrent-split rule
    alone read it 4x on the H100, 10x on the A100)."""
    hk, j, n, dh = 8, 8, 16384, 128
    dg = library.get("gqa").with_dtype("bf16").bind(h=hk, j=j, q=n, x=n, d=dh)
    cst = cost(Schedule.fused(dg, groups={"h": 1, "j": 1, "q": 128}, streams={"x": 64}, gpu=gpu), gpu)
    kc = cst.per_kernel[0]
    q_and_o = 2 * hk * j * n * dh * 2
    kv = cst.H_bytes("HBM") - q_and_o
    assert kv == 2 * hk * n * dh * 2            # hkv · x · d · 2 arrays · 2 bytes
    assert set(kc.l2_read_once) == {"K", "V"} and set(kc.l2_order) == {"j", "q"}  # h (all carry it) outermost
    assert cst.H("L2") > cst.H("HBM")          # every block still loads its chunks through L2
    # without L2 reuse K/V are read once per query tile and query head
    off = cost(Schedule.fused(dg, groups={"h": 1, "j": 1, "q": 128}, streams={"x": 64}, gpu=gpu), gpu,
               l2_caching=False)
    assert off.H_bytes("HBM") - q_and_o > j * kv


def test_raster_rule_leaves_the_square_split_of_a_matmul():
    """A matmul's A and B want opposite launch orders; the concurrent square split stays best."""
    d_ = library.get("matmul").bind(a=2048, b=2048, c=2048)
    cst = cost(Schedule.fused(d_, groups={"a": 128, "c": 128}, streams={"b": 32}), "h100", concurrent_blocks=4)
    kc = cst.per_kernel[0]
    assert kc.l2_split == {"a": 2, "c": 2} and kc.l2_order == () and kc.l2_read_once == ()


@pytest.mark.parametrize("dtype, half", [("fp32", False), ("bf16", True)])
def test_a_map_costs_the_form_its_kernel_computes(dtype, half):
    """A map is priced by the measured cost of the form its kernel runs: libm's logf in an fp32
    kernel (24.7 FMA slots an evaluation on an H200), the 16-bit kernels' approximation (7.6) in a
    bf16 one; the special-function unit's share is inside the measured slots."""
    a, b = Axis("a", 64), Axis("b", 32)
    d = Diagram("logs", map_fn("log", array("X", a, b), name="Y")).with_dtype(dtype)
    cst = cost(Schedule.unfused(d, gpu=None))
    log = get_function("log")
    assert cst.flops["cuda"] == log.cost(half=half)[0] * 64 * 32 and cst.flops["sfu"] == 0
    assert log.cost(half=False)[0] > 3 * log.cost(half=True)[0]
    assert get_function("causal").cost() == (get_function("causal").flops, get_function("causal").sfu)
