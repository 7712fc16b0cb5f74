"""Tensors passed to a compiled diagram are checked before any kernel runs: non-contiguous views
(a transpose, a slice, a step, an expanded broadcast), the wrong dtype, shape or rank, a CPU
tensor, something that is not a tensor, missing or unknown inputs, bad ``out`` tensors — each is
one LaunchError whose message starts with the argument's name. Never a wrong result, never a
fault inside CUDA.

One compiled diagram per code-generation family, each planned as a single kernel of that family
(``compiled`` checks the plan). The checks on inputs run on any machine (a
CompiledDiagram made without a GPU is not compiled yet, and the tensor checks come before the
device check, so CPU tensors exercise them); the ``gpu`` tests repeat them with CUDA tensors, check
``out`` tensors and mixed devices, and show that valid calls — including contiguous views that
start at an unaligned address — give the reference's result afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import napkin.codegen as cg
from napkin.diagrams import Axis, Diagram, array, library, map_fn, softmax
from napkin.dtypes import torch_dtype
from napkin.errors import LaunchError

def bias_add() -> Diagram:
    """Y[h,q,x] = X + B[q,x] (B broadcast over h): one elementwise box, one pointwise kernel."""
    h, q, x = Axis("h"), Axis("q"), Axis("x")
    return Diagram("bias_add", map_fn("add", array("X", h, q, x), array("B", q, x), name="Y"))


def softmax_over_rows() -> Diagram:
    """softmax over q of X[h,q,x], q not innermost: no fast family builds it whole (the row-wise one
    needs the normalised axis contiguous), so planned on the fallback family alone it is one kernel
    there."""
    h, q, x = Axis("h"), Axis("q"), Axis("x")
    return Diagram("softmax_over_rows", softmax(array("X", h, q, x), over=q, name="Y"))


#: family → (library diagram name or diagram, sizes, dtype): each plans as one kernel of that
#: family (the tiled families need their tiled axes at least one tile long); no size is 1 (a
#: size-1 axis makes odd strides legal), and the sizes are ragged (not multiples of the tiles)
CASES = {
    "rowwise": ("layernorm", dict(r=37, x=1001), "bf16"),
    "contraction": ("matmul_t", dict(a=70, b=72, c=80), "bf16"),
    "attention": ("mha", dict(h=2, q=65, x=77, d=64), "fp16"),
    "pointwise": (bias_add(), dict(h=2, q=5, x=7), "fp32"),
    "fallback": (softmax_over_rows(), dict(h=2, q=5, x=7), "fp32"),
}


def case_diagram(family: str) -> Diagram:
    d = CASES[family][0]
    return library.get(d) if isinstance(d, str) else d

_compiled: dict = {}


def compiled(family: str):
    """The compiled diagram of a family (compiled once per session; lazily where no GPU is)."""
    if family not in _compiled:
        _, sizes, dtype = CASES[family]
        # the fallback case restricted to its family: unrestricted, derive writes the softmax out
        # as reductions and maps for the pointwise family (tests/test_no_fallback.py)
        cd = cg.compile(case_diagram(family), sizes=sizes, dtype=dtype,
                        family=family if family == "fallback" else None)
        assert cd.family == family and cd.plan.families == (family,), (cd.plan.families, cd.program.notes)
        _compiled[family] = cd
    return _compiled[family]


def good_inputs(cd, device="cpu", seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for v in cd.diagram.inputs:
        shape = tuple(a.bound_size for a in v.axes)
        out[v.name] = torch.randn(shape, generator=g).to(device=device, dtype=torch_dtype(v.dtype))
    return out


def _other_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt != torch.float32 else torch.float16


def bad_variants(t: torch.Tensor) -> dict:
    """Tensors of t's shape (or deliberately not) that a kernel must refuse, and why."""
    shape = tuple(t.shape)
    dev, dt = t.device, t.dtype
    out = {}
    if t.dim() >= 2:
        swapped = shape[:-2] + (shape[-1], shape[-2])
        out["transposed"] = (torch.randn(swapped).to(dev, dt).transpose(-1, -2), "not contiguous")
        out["column slice"] = (torch.randn(shape[:-1] + (shape[-1] + 3,)).to(dev, dt)[..., :shape[-1]],
                               "not contiguous")
    out["step slice"] = (torch.randn((shape[0] * 2,) + shape[1:]).to(dev, dt)[::2], "not contiguous")
    out["expanded"] = (torch.randn((1,) * t.dim()).to(dev, dt).expand(shape), "not contiguous")
    out["dtype"] = (t.to(_other_dtype(dt)), "dtype")
    out["shape"] = (torch.randn((shape[0] + 1,) + shape[1:]).to(dev, dt), "shape")
    out["rank"] = (t.unsqueeze(0), "shape")
    out["numpy"] = (t.float().cpu().numpy(), "expected a torch tensor")
    out["list"] = (t.float().cpu().tolist(), "expected a torch tensor")
    return out


def assert_launch_error(call, name: str, fragment: str) -> str:
    with pytest.raises(LaunchError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{name}:"), msg
    assert fragment in msg, (fragment, msg)
    assert "\n" not in msg
    return msg


def _param_ids():
    out = []
    for fam in CASES:
        d = case_diagram(fam)
        for v in d.inputs:
            for kind in ("transposed", "column slice", "step slice", "expanded", "dtype", "shape", "rank",
                         "numpy", "list"):
                if kind in ("transposed", "column slice") and len(v.axes) < 2:
                    continue
                out.append((fam, v.name, kind))
    return out


PARAMS = _param_ids()


def _check_bad_input(family, arg, kind, device):
    cd = compiled(family)
    ins = good_inputs(cd, device)
    bad, fragment = bad_variants(ins[arg])[kind]
    others = {k: v for k, v in ins.items() if k != arg}
    # by name, the bad one first: it is the first checked, so on a CPU-only machine the other
    # (CPU) tensors do not answer first
    assert_launch_error(lambda: cd(**{arg: bad}, **others), arg, fragment)
    if device != "cpu":  # by position too
        args = [bad if k == arg else ins[k] for k in cd.input_names]
        assert_launch_error(lambda: cd(*args), arg, fragment)


# ----------------------------------------------------------------------------- any machine


@pytest.mark.parametrize("family, arg, kind", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_bad_input_tensor_is_refused_naming_it(family, arg, kind):
    _check_bad_input(family, arg, kind, "cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("family", sorted(CASES))
def test_cpu_tensors_are_refused_naming_the_first(family):
    cd = compiled(family)
    ins = good_inputs(cd, "cpu")
    first = cd.input_names[0]
    assert_launch_error(lambda: cd(**ins), first, "CPU tensor")


@pytest.mark.parametrize("family", sorted(CASES))
def test_out_that_is_not_a_tensor_or_a_sequence_of_them(family):
    """Before the fix a NumPy array was iterated into rows ("expected 1 tensor(s), got 37") and a
    number raised a TypeError."""
    cd = compiled(family)
    ins = good_inputs(cd, "cuda" if torch.cuda.is_available() else "cpu")
    for bad in (np.zeros(3), 3.0, 7, "Y"):
        with pytest.raises(LaunchError) as info:
            cd(**ins, out=bad) if torch.cuda.is_available() else cd._outputs(bad, "cpu")
        assert str(info.value).startswith("out: expected a torch tensor"), str(info.value)


@pytest.mark.parametrize("family", sorted(CASES))
def test_missing_unknown_and_doubled_inputs(family):
    cd = compiled(family)
    ins = good_inputs(cd, "cpu")
    names = list(cd.input_names)
    with pytest.raises(LaunchError, match="missing input"):
        cd(**{k: v for k, v in ins.items() if k != names[-1]})
    with pytest.raises(LaunchError, match="has no input 'bogus'"):
        cd(**ins, bogus=ins[names[0]])
    with pytest.raises(LaunchError, match="given twice"):
        cd(ins[names[0]], **{names[0]: ins[names[0]]})
    with pytest.raises(LaunchError, match="by position"):
        cd(*ins.values(), ins[names[0]])


# ----------------------------------------------------------------------------- CUDA


def _reference(cd, ins) -> dict:
    return cd.diagram.reference({k: v.double() for k, v in ins.items()}, dtype=torch.float64)


def _rel(out, ref) -> float:
    o, r = out.double(), ref.to(out.device).double()
    assert torch.isfinite(o).all()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def _assert_correct(cd, ins, outs):
    from napkin.codegen.verify import TOLERANCE as TOL

    ref = _reference(cd, ins)
    dt = CASES[cd.family][2]
    if not isinstance(outs, tuple):
        outs = (outs,)
    for n, o in zip(cd.output_names, outs):
        assert _rel(o, ref[n]) < TOL[dt], (cd.family, n)


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(CASES))
def test_gpu_good_call_then_every_bad_one_then_good_again(family):
    """A valid call is right; then every refused call; then the context still works and a valid
    call is still right (nothing faulted inside CUDA)."""
    cd = compiled(family)
    ins = good_inputs(cd, "cuda", seed=1)
    _assert_correct(cd, ins, cd(**ins))
    for fam, arg, kind in PARAMS:
        if fam == family:
            _check_bad_input(fam, arg, kind, "cuda")
    torch.cuda.synchronize()
    _assert_correct(cd, ins, cd(*[ins[k] for k in cd.input_names]))


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(CASES))
def test_gpu_one_cpu_tensor_among_cuda_tensors(family):
    cd = compiled(family)
    ins = good_inputs(cd, "cuda")
    for arg in cd.input_names:
        mixed = dict(ins)
        mixed[arg] = ins[arg].cpu()
        assert_launch_error(lambda: cd(**mixed), arg, "CPU tensor")


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(CASES))
def test_gpu_bad_out_tensors(family):
    cd = compiled(family)
    ins = good_inputs(cd, "cuda")
    (name,) = cd.output_names
    good = cd.empty_outputs("cuda")[name]
    label = f"out[{name}]"
    for kind, (bad, fragment) in bad_variants(good).items():
        if kind in ("numpy", "list"):
            continue
        assert_launch_error(lambda: cd(**ins, out=bad), label, fragment)
    for bad in (good.cpu().float().numpy(), 3.0, "Y"):
        assert_launch_error(lambda: cd(**ins, out=bad), "out", "expected a torch tensor")
    assert_launch_error(lambda: cd(**ins, out=good.cpu()), label, "CPU tensor")
    with pytest.raises(LaunchError, match="has no output"):
        cd(**ins, out={"nope": good})
    with pytest.raises(LaunchError, match="expected 1 tensor"):
        cd(**ins, out=(good, good))
    # a good out tensor is written in place
    good.fill_(float("nan"))
    res = cd(**ins, out=good)
    assert res.data_ptr() == good.data_ptr()
    _assert_correct(cd, ins, good)


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(CASES))
def test_gpu_contiguous_views_at_unaligned_addresses_are_right(family):
    """A contiguous view that starts one element into its storage (not 16-byte aligned) is a
    valid argument: the kernels take their scalar paths and the result is still the reference's,
    for inputs and for the output."""
    cd = compiled(family)
    base = good_inputs(cd, "cuda", seed=3)
    ins = {}
    for k, t in base.items():
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        view = flat[1:].view(t.shape)
        view.copy_(t)
        assert view.is_contiguous() and view.data_ptr() % 16
        ins[k] = view
    (name,) = cd.output_names
    like = cd.empty_outputs("cuda")[name]
    flat = torch.full((like.numel() + 1,), float("nan"), dtype=like.dtype, device="cuda")
    out = flat[1:].view(like.shape)
    cd(**ins, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(flat[0])  # nothing written before the view
    _assert_correct(cd, ins, out)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_tensor_on_another_device():
    cd = compiled("rowwise")
    ins = good_inputs(cd, "cuda:0")
    ins["gamma"] = ins["gamma"].to("cuda:1")
    assert_launch_error(lambda: cd(**ins), "gamma", "cuda:1")


# ----------------------------------------------------------------------------- the compile cache, end to end

_CACHE_SCRIPT = r"""
import warnings
warnings.simplefilter("always")
import napkin.codegen as cg
from napkin.codegen.verify import verify_compiled
cd = cg.compile("layernorm", sizes={"r": 37, "x": 1001})
rows = verify_compiled(cd, seed=5)
assert rows and all(r.ok for r in rows), rows
print("OK", cd.family)
"""


def _run_cached(cache_dir, n: int = 1):
    """``n`` fresh processes at once, each compiling (through the disk cache at ``cache_dir``),
    running and checking the same kernel."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, NAPKIN_CACHE_DIR=str(cache_dir),
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", _CACHE_SCRIPT], env=env, cwd=root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "OK rowwise" in out, (out, err)
    return outs


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_compile_cache_under_faults_gives_correct_results(tmp_path):
    """Four processes compile the same kernel at once; then its cache entry is truncated, then
    replaced by garbage; then the cache directory cannot be created: every run is correct."""
    import os

    from napkin.kernels.cache import decode_entry

    cache = tmp_path / "cache"
    _run_cached(cache, n=4)
    entries = sorted(cache.iterdir())
    assert entries and all(p.suffix == ".cubin" for p in entries), entries  # no temporary files
    good = {p: p.read_bytes() for p in entries}
    for p, data in good.items():
        assert decode_entry(p.stem, data)
    for damage in ("truncate", "garbage"):
        for p, data in good.items():
            p.write_bytes(data[: len(data) // 2] if damage == "truncate" else os.urandom(len(data)))
        _run_cached(cache)
        for p in good:  # recompiled and written whole again
            assert decode_entry(p.stem, p.read_bytes()), damage
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    (out, err), = _run_cached(blocker / "cache")
    assert "not writable" in err and err.count("KernelCacheWarning") <= 1, err

