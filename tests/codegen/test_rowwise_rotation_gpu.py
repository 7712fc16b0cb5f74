"""The row-wise family's rotated grid on a GPU (rows that are not whole 16-byte vectors):
softmax, the norms and chains of maps and reductions against the float64 reference with outputs
poisoned with NaN, rows of 9 to 12347 values, one row to many a warp, a mask that reads the column
index; and tensors whose rows start anywhere (a view one or three values into its storage), where
the rotation comes from the tensor itself and the other arrays fall back to value-by-value access."""

from __future__ import annotations

import pytest

from napkin.codegen.api import compile
from napkin.codegen.verify import verify
from napkin.diagrams import Axis, Diagram, array, layernorm, library
from napkin_test_support import masked_softmax

pytestmark = pytest.mark.gpu

ODD_ROWS = [dict(r=33, x=4095), dict(r=9, x=1001), dict(r=300, x=9), dict(r=77, x=37), dict(r=3, x=12347)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "log_softmax", "l2_normalize",
                                  "logsumexp_rows", "row_range"])
def test_odd_rows_verify(name, dtype):
    rep = verify(library.get(name), dtype=dtype, shapes=ODD_ROWS, seed=11)
    assert rep.ok, str(rep)
    assert {r.family for r in rep.rows} == {"rowwise"}, str(rep)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_group_norm_with_an_odd_group_verifies(dtype):
    shapes = [dict(n=4, g=8, c=30, s=301), dict(n=2, g=3, c=5, s=999), dict(n=3, g=2, c=1, s=13)]
    rep = verify(library.get("group_norm"), dtype=dtype, shapes=shapes, seed=12)
    assert rep.ok, str(rep)


def _affine_layernorm() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, g, b = array("X", r, x), array("g", x), array("b", x)
    return Diagram("affine_ln", (layernorm(X, over=x, name="N") * g + b).named("Y"))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_mask_on_the_column_index_and_broadcast_vectors_verify(dtype):
    # the causal mask reads the rotated column; gamma and beta start at column 0, not where X's rows do
    rep = verify(masked_softmax(), dtype=dtype, shapes=[dict(h=3, q=37, x=37), dict(h=2, q=130, x=1001)], seed=13)
    assert rep.ok, str(rep)
    rep = verify(_affine_layernorm(), dtype=dtype, shapes=[dict(r=65, x=1001), dict(r=8, x=4093)], seed=14)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("offset", [1, 3])
def test_rows_of_a_misaligned_view(offset):
    import torch

    torch.manual_seed(offset)
    r, x = 40, 1001
    cd = compile(_affine_layernorm(), sizes={"r": r, "x": x}, dtype="bf16")
    assert cd.family == "rowwise" and "load_vec_rot" in cd.program.launches[0].source
    store = torch.randn(r * x + offset, device="cuda", dtype=torch.bfloat16)
    X = store[offset:].view(r, x)                       # rows start `offset` values off the usual boundary
    g = torch.randn(x + offset, device="cuda", dtype=torch.bfloat16)[offset:]
    b = torch.randn(x, device="cuda", dtype=torch.bfloat16)
    out = torch.full((r * x + 2,), float("nan"), device="cuda", dtype=torch.bfloat16)[2:].view(r, x)
    got = cd(X, g, b, out=out)
    want = torch.nn.functional.layer_norm(X.double(), (x,), eps=1e-5) * g.double() + b.double()
    assert got.data_ptr() == out.data_ptr()
    assert torch.isfinite(got).all()
    err = ((got.double() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, err


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("sizes", [dict(r=1000, x=999), dict(r=300, x=4095), dict(r=64, x=77)])
@pytest.mark.parametrize("shift", [0, 1])
def test_column_reductions_on_either_grid(name, sizes, shift):
    """A norm backward over rows that are not whole vectors (``ROTATE_COLUMN_KERNELS``), every configuration the family proposes: with X, dY and dX
    starting at the same place in their 16-byte lines (shift 0) the kernel runs the rotated grid,
    with X a view one value into its storage (shift 1) the unrotated one; dX, dgamma (and dbeta)
    against the float64 reference, outputs poisoned with NaN."""
    import torch

    from napkin.codegen.families import rowwise
    from napkin.codegen.prepare import prepare

    saves = {"rmsnorm": {"N_rstd"}, "layernorm": {"N_rstd", "N_mean"}}[name]
    grad = library.get(name).grad(save=saves)
    r, x = sizes["r"], sizes["x"]
    gen = torch.Generator(device="cuda").manual_seed(r + x + shift)
    store = torch.randn(r * x + shift, device="cuda", generator=gen).bfloat16()
    X = store[shift:].view(r, x)
    env = {"X": X, "gamma": (torch.randn(x, device="cuda", generator=gen) + 1).bfloat16(),
           "beta": torch.randn(x, device="cuda", generator=gen).bfloat16(),
           "dY": torch.randn(r, x, device="cuda", generator=gen).bfloat16()}
    X64 = X.double()
    mu = X64.mean(-1) if name == "layernorm" else torch.zeros_like(X64[:, 0])
    env["N_mean"] = mu.bfloat16()
    env["N_rstd"] = torch.rsqrt(((X64 - mu[:, None]) ** 2).mean(-1) + 1e-5).bfloat16()
    d = prepare(grad, sizes=sizes, dtype="bf16")
    rotated = 0
    for s in rowwise.FAMILY.candidates(d, "h100", "bf16"):
        cd = compile(grad, sizes=sizes, dtype="bf16", schedule=s, family="rowwise")
        rotated += "same_lines" in cd.launches[0].source
        args = {n: env[n] for n in cd.input_names}
        outs = cd.empty_outputs(device="cuda", fill=float("nan"))
        cd(**args, out=outs)
        torch.cuda.synchronize()
        ref = cd.diagram.reference({k: v.double() for k, v in args.items()}, dtype=torch.float64)
        for n in cd.output_names:
            got = outs[n].double()
            assert not torch.isnan(got).any(), f"{n} ({s.kernels[0].options}): NaN (unwritten)"
            err = float(torch.linalg.vector_norm(got - ref[n]) / torch.linalg.vector_norm(ref[n]))
            assert err <= 1e-2, f"{n} ({s.kernels[0].options}, shift {shift}): relative error {err:.2e}"
    assert rotated, "no configuration took the two-grid kernel"
