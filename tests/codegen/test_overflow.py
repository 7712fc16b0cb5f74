"""Sizes past 32-bit indexing: every family either indexes in 64 bits where the sizes need it, or
refuses with one clear CodegenError naming the array and its size (and lowering then hands the
diagram to the fallback family, whose indices are all 64-bit).

CPU tests lower and generate (nothing runs): they read the index arithmetic of the generated
source and the kinds of the launch arguments. The ``gpu`` tests at the end run kernels whose
arrays hold more than 2^31 elements (4 to 9 GB each) and check rows past the 2^31st element
against PyTorch.
"""

from __future__ import annotations

import math
import re

import pytest

from napkin.codegen.families.contraction import FAMILY

from napkin.codegen.generate import generate_source
from napkin.codegen.lower import check_program, lower
from napkin.codegen.planner import derive
from napkin.codegen.program import Arg, KernelLaunch, Program
from napkin.diagrams import Axis, Diagram, array, contract, library, reduce, softmax
from napkin.errors import CodegenError, NapkinError

INT32_MAX = 2 ** 31 - 1
BIG = 2 ** 31  # an element count past 32-bit indexing

# a declaration: [constexpr|const] TYPE NAME =
_DECL = re.compile(r"^\s*(?:constexpr\s+|const\s+)?(long long|int|unsigned|float|bool|auto)\s+(\w+)\s*=", re.M)
# names that hold element offsets, row numbers or flattened indices (never bounded by a tile)
_INDEXY = re.compile(r"^(i_\w+|q_\w+|off_\w+|idx|row|base\w*|N|NROWS|R|STRIDE|SIN|SOUT|zb)$")


def index_declarations(source: str) -> dict[str, set[str]]:
    """Name → types it is declared with, for the index-like names of a kernel source."""
    out: dict[str, set[str]] = {}
    for typ, name in _DECL.findall(source):
        if _INDEXY.match(name):
            out.setdefault(name, set()).add(typ)
    return out


def assert_64bit_indices(source: str) -> dict:
    decls = index_declarations(source)
    assert decls, "no index declarations found: the pattern no longer matches the templates"
    narrow = {n: t for n, t in decls.items() if t != {"long long"}}
    assert not narrow, f"index variables declared narrower than 64 bits: {narrow}"
    return decls


def int_args(program: Program) -> list[Arg]:
    return [a for k in program.launches for a in k.args if a.kind == "int"]


def assert_int_args_fit(program: Program) -> None:
    for a in int_args(program):
        assert -(2 ** 31) <= a.value <= INT32_MAX, a


def elements(d: Diagram) -> int:
    """Elements of the largest array of a bound diagram."""
    return max(math.prod(a.bound_size for a in v.axes) for v in (*d.inputs, *d.nodes))


# ----------------------------------------------------------------------------- rowwise


def test_rowwise_rows_past_2_31_elements_use_64_bit_offsets():
    sizes = dict(r=2 ** 21 + 3, x=1024)  # 2^31 + 3072 elements
    p = lower("softmax", sizes=sizes, gpu="h100")
    assert p.family == "rowwise"
    src = p.launches[0].source
    decls = assert_64bit_indices(src)
    assert {"row", "off_X", "off_P", "NROWS"} <= set(decls)
    assert "(long long)blockIdx.x" in src
    assert re.search(r"off_X = row \* 1024LL;", src)
    assert "constexpr long long NROWS = 2097155LL;" in src
    assert_int_args_fit(p)


def test_rowwise_broadcast_inputs_decompose_the_row_in_64_bits():
    """Rows over (h, r) with a bias b[h, x]: the row number is split into i_h, i_r with 64-bit
    arithmetic and b's offset is i_h * x."""
    h, r, x = Axis("h", 3), Axis("r", 2 ** 20 + 1), Axis("x", 1024)
    X, b = array("X", h, r, x), array("b", h, x)
    d = Diagram("biased_softmax", softmax((X + b).named("U"), over="x", name="P"))
    p = lower(d, gpu="h100")
    assert p.family == "rowwise"
    src = p.launches[0].source
    decls = assert_64bit_indices(src)
    assert {"i_h", "i_r", "q_r", "off_b"} <= set(decls), decls
    assert re.search(r"off_b = i_h \* 1024LL;", src), src
    assert re.search(r"i_r = row % 1048577LL;", src)


def test_rowwise_grid_past_cuda_limits_is_refused_clearly():
    """2^40 rows of 2 values: no launch can cover them; a clear error, never a wrapped grid."""
    with pytest.raises(CodegenError) as info:
        lower("softmax", sizes=dict(r=2 ** 40, x=2), gpu="h100")
    msg = str(info.value)
    assert "grid" in msg and "limits" in msg and "\n" not in msg
    with pytest.raises(CodegenError, match="grid"):
        lower("softmax", sizes=dict(r=2 ** 40, x=2), gpu="h100", family="rowwise")


def test_check_program_refuses_grids_beyond_the_hardware():
    d = library.get("softmax").bind(r=4, x=8)
    good = lower(d, gpu="h100")
    k = good.launches[0]
    for grid in ((2 ** 31, 1, 1), (1, 65536, 1), (1, 1, 70000)):
        bad = Program(good.diagram, good.schedule, good.family,
                      (KernelLaunch(k.name, k.source, grid, k.block, 0, k.args, k.template),))
        with pytest.raises(CodegenError, match="beyond CUDA's limits"):
            check_program(bad)


# ----------------------------------------------------------------------------- fallback


@pytest.mark.parametrize("name, sizes", [
    ("transformer_block", dict(q=2 ** 16, e=2 ** 15 + 1, h=4, d=128, f=2 ** 15)),
    ("gqa", dict(h=64, j=4, q=2 ** 13, x=2 ** 13, d=128)),
    ("layernorm", dict(r=2 ** 22 + 1, x=1024)),
])
def test_fallback_indices_are_64_bit(name, sizes):
    p = lower(name, sizes=sizes, gpu="h100", family="fallback")
    assert elements(p.diagram) > BIG
    for k in p.launches:
        assert_64bit_indices(k.source)
        assert not int_args(p)  # sizes are 64-bit literals, never int arguments
    assert re.search(r"constexpr long long (N|NROWS) = \d+LL;", p.launches[0].source)


def test_fallback_reduction_over_a_huge_axis():
    r, x = Axis("r", 3), Axis("x", 3 * 2 ** 30)
    d = Diagram("huge_sum", reduce(array("X", r, x), "x", "sum", name="S"))
    p = lower(d, gpu="h100", family="fallback")
    assert p.family == "fallback"
    src = p.launches[0].source
    assert_64bit_indices(src)
    assert "constexpr long long R = 3221225472LL;" in src
    assert "for (long long j = lane; j < R; j += 32)" in src


# ----------------------------------------------------------------------------- contraction


@pytest.mark.parametrize("a", [INT32_MAX - 10, 3 * 10 ** 9])
def test_contraction_refuses_an_axis_past_32_bits_naming_the_array(a):
    """M + BM - 1 must fit an int: a size within a tile of 2^31 is refused as clearly as one past it
    (before the fix the first lowered silently and its tile count overflowed)."""
    d = library.get("matmul").bind(a=a, b=64, c=64)
    with pytest.raises(NapkinError) as info:  # the family refuses it: no plan with only that family
        lower(d, gpu="h100", family="contraction")
    msg = str(info.value)
    assert "A[a,b]" in msg and "'a'" in msg and str(a) in msg and "32-bit" in msg, msg
    # left to the default, the planner puts the box on the fallback family (64-bit indices), and
    # says why the contraction family does not take it
    p = lower(d, gpu="h100")
    assert p.family == "fallback" and p.plan.families == ("fallback",)
    assert any("scalar fallback" in n for n in p.notes), p.notes
    why = derive(d, "h100", explain=False).plan.kernels[0].why
    assert "contraction" in why and str(a) in why and "32-bit" in why, why
    assert_64bit_indices(p.launches[0].source)


@pytest.mark.parametrize("axis", ["b", "c"])
def test_contraction_refuses_other_axes_past_32_bits(axis):
    sizes = dict(a=64, b=64, c=64)
    sizes[axis] = INT32_MAX
    d = library.get("matmul").bind(**sizes)
    with pytest.raises(NapkinError) as info:  # the family refuses it: no plan with only that family
        lower(d, gpu="h100", family="contraction")
    msg = str(info.value)
    assert f"'{axis}'" in msg and str(INT32_MAX) in msg, msg


def test_contraction_with_more_than_2_31_elements_per_operand_offsets_in_64_bits():
    d = library.get("matmul").bind(a=2 ** 21 + 5, b=1024, c=64)
    p = lower(d, gpu="a100-80gb", family="contraction")  # mma.sync (the wgmma template copies with TMA)
    src = p.launches[0].source
    assert "static_cast<long long>(m0) * lda" in src
    assert_int_args_fit(p)
    args = {a.name: a.value for a in int_args(p)}
    assert args["M"] == 2 ** 21 + 5 and args["lda"] == 1024


def test_batched_contraction_strides_past_2_31_become_long_long():
    """A batch stride a*b > 2^31 is passed as a long long (it was refused as an int before, which
    sent the diagram to the slow fallback); the kernel multiplies it in 64 bits."""
    d = library.get("batched_matmul").bind(n=2, a=2 ** 21 + 1, b=1024, c=64)
    # on Hopper the wgmma template moves each batch element's tiles down whole rows: int rows
    hp = lower(d, gpu="h100")
    hargs = {a.name: a for k in hp.launches for a in k.args}
    assert hp.launches[0].template == "matmul_wgmma.cu.jinja" and hargs["rA_n"].value == 2 ** 21 + 1
    # 2^31 rows of A flattened: past TMA's 32-bit coordinates, so A's map takes n, a and b as
    # dimensions of their own (each index fits)
    big = library.get("batched_matmul").bind(n=1024, a=2 ** 21 + 1, b=64, c=64)
    from napkin.codegen.families.contraction import analyze, operand_view
    assert FAMILY.wgmma_reason(big, "h100") is None and operand_view(big, analyze(big), analyze(big).A) == (2, 1, 0)
    huge = library.get("batched_matmul").bind(n=4, a=2 ** 31 - 100, b=64, c=64)
    assert "32-bit" in FAMILY.wgmma_reason(huge, "h100")
    p = lower(d, gpu="a100-80gb")  # mma.sync: strides in elements
    assert p.family == "contraction", p.notes
    src = p.launches[0].source
    args = {a.name: a for k in p.launches for a in k.args}
    assert args["sA_n"].kind == "i64" and args["sA_n"].value == (2 ** 21 + 1) * 1024
    assert "long long sA_n" in src and "static_cast<long long>(i_n) * sA_n" in src
    assert args["sB_n"].kind == "int"  # strides that fit stay ints
    header = generate_source(d, gpu="a100-80gb")
    assert "sA_n: i64 = 2147484672" in header


def test_epilogue_input_stride_past_2_31_becomes_long_long():
    a, b, c, n = Axis("a", 2 ** 20 + 1), Axis("b", 64), Axis("c", 2048), Axis("n", 2)
    A, B, R = array("A", n, a, b), array("B", b, c), array("R", n, a, c)
    Y = (contract(A, B, over="b", name="H") + R).named("Y")
    # Hopper's persistent wgmma kernel copies R 64 x 64 into its staging block (E0: its row
    # stride ldE0, its batch stride bE0_n); the per-element read names the strides s_R_*
    for gpu, batch_stride, row_stride in (("h100", "bE0_n", "ldE0"), ("a100-80gb", None, None)):
        p = lower(Diagram("mm_resid", Y), gpu=gpu)
        assert p.family == "contraction", p.notes
        args = {x.name: x for k in p.launches for x in k.args}
        if batch_stride is None:  # whichever way this template reads R
            batch_stride, row_stride = ("bE0_n", "ldE0") if "bE0_n" in args else ("s_R_n", "s_R_a")
        assert args[batch_stride].kind == "i64" and args[batch_stride].value == (2 ** 20 + 1) * 2048, gpu
        assert args[row_stride].kind == "int" and args[row_stride].value == 2048, gpu


# ----------------------------------------------------------------------------- attention


def test_attention_refuses_sequences_past_its_32_bit_positions():
    d = library.get("attention").bind(q=2 ** 30, x=64, d=64)
    with pytest.raises(NapkinError) as info:
        lower(d, gpu="h100", family="attention")
    msg = str(info.value)
    assert "Q[q,d]" in msg and str(2 ** 30) in msg and "32-bit" in msg, msg


def test_attention_woven_strides_past_2_31_become_long_long():
    d = library.get("mha").bind(h=2, q=2 ** 24, x=64, d=128)  # per-head stride q*d = 2^31
    p = lower(d, gpu="h100", family="attention")
    args = {a.name: a for k in p.launches for a in k.args}
    assert args["sQ_h"].kind == "i64" and args["sQ_h"].value == 2 ** 31
    assert args["sO_h"].kind == "i64"
    assert args["sK_h"].kind == "int"
    src = p.launches[0].source
    assert "long long sQ_h" in src and "static_cast<long long>(i_h) * sQ_h" in src


def test_attention_with_huge_mask_offsets_does_not_skip_blocks_in_32_bits():
    from napkin.diagrams import causal, scale

    q, x, dd = Axis("q", 100), Axis("x", 100), Axis("d", 64)
    S = scale(contract(array("Q", q, dd), array("K", x, dd), over="d", name="S"), 0.125, name="Ss")
    M = causal(S, "q", "x", offset=-(2 ** 31) - 5, name="Sm")
    O = contract(softmax(M, over="x", name="P"), array("V", x, dd), over="x", name="O")
    p = lower(Diagram("far_causal", O), gpu="h100", family="attention")
    tun = dict(p.launches[0].tunables)
    assert tun["causal"] is None  # applied per element (64-bit compare), no block skipping


# ----------------------------------------------------------------------------- CLI


def test_cli_generate_overflow_sizes():
    from typer.testing import CliRunner

    from napkin.cli import app

    r = CliRunner().invoke(app, ["generate", "matmul", "-s", "a=3000000000", "-s", "b=64", "-s", "c=64",
                                 "-o", "-"])
    assert r.exit_code == 0, r.output
    assert "family fallback" in r.output and "constexpr long long" in r.output
    r = CliRunner().invoke(app, ["generate", "softmax", "-s", f"r={2 ** 40}", "-s", "x=2", "-o", "-"])
    assert r.exit_code == 2, r.output
    assert "grid" in r.output and "Traceback" not in r.output


# ----------------------------------------------------------------------------- GPU: past 2^31 elements


def _rel(a, b) -> float:
    import torch

    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def _softmax_rows(cg, torch, family):
    rows, x = 2 ** 21 + 3, 1024  # 2^31 + 3072 elements: rows from 2^21 on start past element 2^31
    fn = cg.compile(library.get("softmax"), sizes=dict(r=rows, x=x), family=family)
    assert fn.family == family
    X = torch.randn(rows, x, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(X, float("nan"))
    fn(X, out=out)
    torch.cuda.synchronize()
    for lo in (0, 2 ** 21 - 64, rows - 64):
        assert _rel(out[lo:lo + 64], torch.softmax(X[lo:lo + 64].float(), dim=-1)) < 1e-2, (family, lo)
    assert not torch.isnan(out[-1]).any()


def _matmul_rows(cg, torch):
    a, b, c = 2 ** 21 + 5, 1024, 64  # A holds 2^31 + 5120 elements
    mm = cg.compile(library.get("matmul"), sizes=dict(a=a, b=b, c=c))
    assert mm.family == "contraction"
    A = torch.randn(a, b, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(b, c, device="cuda", dtype=torch.bfloat16)
    C = torch.full((a, c), float("nan"), device="cuda", dtype=torch.bfloat16)
    mm(A, B, out=C)
    torch.cuda.synchronize()
    for lo in (0, a - 200):
        assert _rel(C[lo:lo + 200], A[lo:lo + 200].float() @ B.float()) < 1e-2, lo


def _batched_long_long_stride(cg, torch):
    n, a, b = 2, 2 ** 21 + 1, 1024  # the batch stride a*b = 2^31 + 1024 is a long long argument
    bmm = cg.compile(library.get("batched_matmul"), sizes=dict(n=n, a=a, b=b, c=8))
    assert bmm.family == "contraction"
    # mma.sync offsets by the long long stride; wgmma moves whole rows (TMA's coordinates are 32-bit)
    assert any(x.kind == "i64" for k in bmm.launches for x in k.args) or \
        bmm.launches[-1].template == "matmul_wgmma.cu.jinja"
    A = torch.randn(n, a, b, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(n, b, 8, device="cuda", dtype=torch.bfloat16)
    C = bmm(A, B)
    torch.cuda.synchronize()
    assert _rel(C[1, -300:], A[1, -300:].float() @ B[1].float()) < 1e-2
    assert _rel(C[0, :300], A[0, :300].float() @ B[0].float()) < 1e-2


def _attention_heads(cg, torch):
    h, q, x, d = 257, 2 ** 16, 64, 128  # Q and O hold 257 * 2^23 > 2^31 elements
    att = cg.compile(library.get("mha"), sizes=dict(h=h, q=q, x=x, d=d))
    assert att.family == "attention"
    Q = torch.randn(h, q, d, device="cuda", dtype=torch.bfloat16)
    K = torch.randn(h, x, d, device="cuda", dtype=torch.bfloat16)
    V = torch.randn(h, x, d, device="cuda", dtype=torch.bfloat16)
    O = torch.full_like(Q, float("nan"))
    att(Q, K, V, out=O)
    torch.cuda.synchronize()
    for hh in (0, h - 1):
        ref = torch.softmax(Q[hh, -512:].float() @ K[hh].float().T / d ** 0.5, dim=-1) @ V[hh].float()
        assert _rel(O[hh, -512:], ref) < 1e-2, hh


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_kernels_on_arrays_past_2_31_elements():
    """One kernel per family on arrays of more than 2^31 elements (about 9 GB at a time, one case
    after the other so that parallel test workers do not add up): rows, heads and batch elements
    past element 2^31 match PyTorch."""
    import gc

    import torch

    import napkin.codegen as cg

    free, _ = torch.cuda.mem_get_info()
    if free < 16 * 2 ** 30:
        pytest.skip("needs 16 GiB of free GPU memory")
    cases = [("rowwise softmax", lambda: _softmax_rows(cg, torch, "rowwise")),
             ("fallback softmax", lambda: _softmax_rows(cg, torch, "fallback")),
             ("matmul", lambda: _matmul_rows(cg, torch)),
             ("batched matmul", lambda: _batched_long_long_stride(cg, torch)),
             ("attention", lambda: _attention_heads(cg, torch))]
    for what, run in cases:
        try:
            run()
        except torch.cuda.OutOfMemoryError:
            pytest.skip(f"{what}: GPU memory taken by tests running beside this one")
        finally:
            gc.collect()
            torch.cuda.empty_cache()
