"""``Diagram.reference`` runs what it can and refuses the rest with a message (issue #16, item 6).

- fp8 diagrams run (fp8 inputs keep their rounded values and are computed in float32);
- contractions over more axes than einsum has letters (52) run;
- bool, integer and complex tensors, tensors on two devices, unknown input names, wrong shapes,
  non-tensors and junk arguments are refused with a DiagramError naming the input;
- mixed floating dtypes are converted to one compute dtype: ``dtype`` when given, else the
  promotion of the inputs' dtypes.
"""

from __future__ import annotations

import pytest
import torch

from napkin.diagrams import Axis, Diagram, array, contract, library, softmax
from napkin.diagrams.reference import contract_merged
from napkin.errors import DiagramError

ATT = library.get("attention").bind(q=4, x=5, d=3)


def att_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in (("Q", (4, 3)), ("K", (5, 3)), ("V", (5, 3)))}


# ----------------------------------------------------------------------------- fp8

def test_an_fp8_diagram_runs_in_float32_on_its_rounded_inputs():
    d8 = ATT.with_dtype("fp8")
    out = d8.reference(seed=0)["O"]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    ins = att_inputs(torch.float8_e4m3fn)
    got = d8.reference(ins)["O"]
    want = ATT.reference({k: v.to(torch.float64) for k, v in ins.items()})["O"]
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_dtype_fp8_rounds_the_inputs_then_computes_in_float32():
    ins = att_inputs(torch.float64)
    got = ATT.reference(ins, dtype=torch.float8_e4m3fn)["O"]
    rounded = {k: v.to(torch.float8_e4m3fn).to(torch.float64) for k, v in ins.items()}
    want = ATT.reference(rounded)["O"]
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, atol=1e-5)
    assert ATT.reference(ins, dtype="fp8")["O"].dtype == torch.float32


# ----------------------------------------------------------------------------- many axes

def test_a_contraction_over_more_than_52_axes_runs():
    names = [f"a{i}" for i in range(60)]
    ax = {n: Axis(n, 2 if i % 9 == 0 else 1) for i, n in enumerate(names)}
    kept_a, over, kept_b = names[:20], names[20:35], names[35:]
    A = array("A", *[ax[n] for n in kept_a + over], dtype="fp32")
    B = array("B", *[ax[n] for n in over + kept_b], dtype="fp32")
    d = Diagram("wide", contract(A, B, over=over, name="C"))
    out = d.reference(dtype=torch.float64, seed=1, keep_intermediates=True)
    assert out["C"].dim() == 45
    # the same sum as a matrix product of the flattened operands
    P = out["A"].reshape(_n(ax, kept_a), _n(ax, over))
    R = out["B"].reshape(_n(ax, over), _n(ax, kept_b))
    want = (P @ R).reshape(*[ax[n].size for n in kept_a + kept_b])
    assert torch.allclose(out["C"], want)


def _n(ax, names):
    out = 1
    for n in names:
        out *= ax[n].size
    return out


@pytest.mark.parametrize("seed", range(6))
def test_merged_contraction_equals_einsum(seed):
    g = torch.Generator().manual_seed(seed)
    names = "ijklmn"
    sizes = {n: int(torch.randint(1, 4, (1,), generator=g)) for n in names}
    perm = torch.randperm(6, generator=g).tolist()
    a_names = tuple(names[i] for i in perm[:4])
    b_names = tuple(names[i] for i in perm[2:])
    over = set(a_names) & set(b_names)
    out = tuple(n for n in a_names + b_names if n not in over)
    out = tuple(dict.fromkeys(out))[::-1]
    a = torch.randn([sizes[n] for n in a_names], generator=g, dtype=torch.float64)
    b = torch.randn([sizes[n] for n in b_names], generator=g, dtype=torch.float64)
    spec = f"{''.join(a_names)},{''.join(b_names)}->{''.join(out)}"
    assert torch.allclose(contract_merged([a, b], [a_names, b_names], out), torch.einsum(spec, a, b))


def test_an_array_of_more_than_64_axes_is_refused():
    A = array("A", *[Axis(f"a{i}", 1) for i in range(65)], dtype="fp32")
    d = Diagram("too_wide", softmax(A, over="a0", name="P"))
    with pytest.raises(DiagramError, match="carries 65 axes; a PyTorch tensor holds at most 64"):
        d.reference(seed=0)


# ----------------------------------------------------------------------------- refused inputs

@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64, torch.uint8, torch.complex64,
                                   torch.complex128])
def test_non_real_floating_inputs_are_refused_naming_the_input(dtype):
    ins = att_inputs()
    ins["K"] = torch.ones(5, 3).to(dtype)
    with pytest.raises(DiagramError, match=r"input K\[x,d\]: dtype .* is not a real floating-point type"):
        ATT.reference(ins)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, "int8", 3])
def test_a_non_floating_compute_dtype_is_refused(dtype):
    with pytest.raises(DiagramError, match="dtype"):
        ATT.reference(att_inputs(), dtype=dtype)


def test_inputs_on_two_devices_are_refused():
    ins = att_inputs()
    ins["V"] = ins["V"].to("meta")
    with pytest.raises(DiagramError, match="input V is on meta but input Q is on cpu"):
        ATT.reference(ins)


@pytest.mark.parametrize("inputs, fragment", [
    ({"Z": torch.zeros(1)}, "has no input ['Z']"),
    ({"Q": torch.randn(4, 2)}, "axis 'd' has size 3 but the tensor has 2"),
    ({"Q": torch.randn(4)}, "expected 2 dimensions"),
    ({"Q": torch.randn(4, 3, 1)}, "expected 2 dimensions"),
    ({"Q": [[1.0] * 3] * 4}, "input Q: expected a torch tensor, got list"),
    ({"Q": None}, "input Q: expected a torch tensor, got NoneType"),
    ({3: torch.randn(4, 3)}, "input names must be strings"),
    ([("Q", torch.randn(4, 3))], "inputs must map input names to tensors"),
])
def test_wrong_inputs_are_refused_naming_them(inputs, fragment):
    with pytest.raises(DiagramError) as e:
        ATT.reference(inputs)
    assert fragment in str(e.value)


def test_a_symbolic_axis_bound_differently_by_two_inputs_is_refused():
    with pytest.raises(DiagramError, match="axis 'd' has size 3 elsewhere but 2 here"):
        library.get("attention").reference({"Q": torch.randn(4, 3), "K": torch.randn(5, 2)})


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(seed="x"), "seed must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(device="nowhere"), "is not a torch device"),
    (dict(sizes=[("q", 3)]), "sizes must map axis names"),
    (dict(sizes={"zz": 3}), "has no axis 'zz'"),
])
def test_junk_arguments_are_refused(kwargs, fragment):
    with pytest.raises(DiagramError) as e:
        library.get("softmax").bind(r=2, x=3).reference(**kwargs)
    assert fragment in str(e.value)


def test_missing_inputs_are_drawn_at_random_in_the_diagrams_dtype():
    out = ATT.with_dtype("fp32").reference({"Q": torch.randn(4, 3)}, seed=0)["O"]
    assert out.dtype == torch.float32 and out.shape == (4, 3)


# ----------------------------------------------------------------------------- mixed dtypes

def test_mixed_floating_dtypes_are_computed_in_their_promotion():
    ins = att_inputs()
    ins["K"] = ins["K"].to(torch.bfloat16)
    ins["V"] = ins["V"].to(torch.float64)
    out = ATT.reference(ins, keep_intermediates=True)
    assert out["O"].dtype == torch.float64 and out["K"].dtype == torch.float64
    want = ATT.reference({k: v.to(torch.float64) for k, v in ins.items()})["O"]
    assert torch.equal(out["O"], want)


def test_mixed_dtypes_with_fp8_compute_in_float32_at_least():
    ins = att_inputs()
    ins["K"] = ins["K"].to(torch.float8_e4m3fn)
    ins["V"] = ins["V"].to(torch.bfloat16)
    assert ATT.reference(ins)["O"].dtype == torch.float32


def test_an_explicit_dtype_converts_every_input():
    ins = att_inputs()
    ins["K"] = ins["K"].to(torch.bfloat16)
    assert ATT.reference(ins, dtype=torch.float16)["O"].dtype == torch.float16
