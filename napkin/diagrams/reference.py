"""PyTorch reference execution: the oracle every generated kernel is checked against.

Each box becomes the obvious PyTorch call (``einsum``, ``softmax``, the
elementwise function's torch form). Tensors carry their axes in the order of the
value's ``axes``; broadcasting by axis name is done with views, never copies.

What it runs on, and what it refuses (a :class:`~napkin.errors.DiagramError` naming the input):

- inputs are floating-point torch tensors on one device, keyed by input name; a bool, integer
  or complex tensor, a tensor on another device than the others, a name the diagram does not
  have and a shape that does not fit the input's axes are refused. Inputs left out are drawn at
  random in the diagram's dtype;
- the **compute dtype** is ``dtype`` when given, else the promotion of the inputs' dtypes (so
  float32 and bfloat16 inputs are both computed in float32): every input is converted to it;
- fp8 (``torch.float8_e4m3fn``, a ``with_dtype("fp8")`` diagram) has no arithmetic in PyTorch: fp8
  inputs keep their fp8-rounded values and are computed in float32 (outputs are float32);
- a contraction over any number of axes runs (axes that play the same part are merged before
  ``einsum``, whose subscripts run out at 52); an array of more than 64 axes, more than a
  PyTorch tensor holds, is refused.

>>> import torch
>>> from napkin.diagrams import library
>>> d = library.get("softmax").bind(r=3, x=5)
>>> out = d.reference(dtype=torch.float64, seed=0)["P"]
>>> torch.allclose(out.sum(-1), torch.ones(3, dtype=torch.float64))
True
"""

from __future__ import annotations

import math
import string
from typing import Mapping

from ..errors import DiagramError, NapkinError
from .functions import ArrayOps, get_function
from .ops import Contract, Map, Norm, Reduce, Rename, Softmax, Value

#: The most axes a PyTorch tensor holds.
MAX_TENSOR_DIMS = 64


def _torch():
    import torch

    return torch


def random_inputs(diagram, *, sizes: Mapping[str, int] | None = None, dtype=None, device="cpu",
                  seed: int | None = None, generator=None) -> dict:
    """Fresh random normal inputs for every input array, keyed by input name.

    ``dtype`` overrides the diagram's dtypes (a torch dtype or a napkin name).
    Never zeros: zeros hide unwritten outputs and wrong indexing.
    """
    torch = _torch()
    d = diagram.bind(sizes) if sizes else diagram
    gen = generator
    if gen is None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise DiagramError(f"reference: seed must be an integer, got {seed!r}")
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed % (2**63) if seed is not None else torch.seed() % (2**63))
    out = {}
    for v in d.inputs:
        shape = tuple(a.bound_size for a in v.axes)
        dt = _resolve_dtype(dtype, v.dtype)
        try:
            out[v.name] = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dt)
        except RuntimeError as e:  # the host or device cannot hold it, or torch cannot size it
            raise DiagramError(f"reference: cannot make input {v.name}{list(shape)} "
                               f"({math.prod(shape)} values): {str(e).splitlines()[0][:200]}") from None
    return out


def _resolve_dtype(dtype, default_name):
    """A torch floating dtype from a torch dtype or a napkin name (``default_name`` when None)."""
    torch = _torch()
    from ..dtypes import torch_dtype

    if dtype is None:
        dtype = default_name
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        try:
            out = torch_dtype(dtype)
        except NapkinError as e:
            raise DiagramError(f"reference: {e}") from None
    if not out.is_floating_point:
        raise DiagramError(f"reference: dtype {out} is not a floating-point type; use float64, float32, "
                           "bfloat16, float16 or fp8")
    return out


def _is_fp8(torch, dt) -> bool:
    return dt.is_floating_point and dt.itemsize == 1


def _compute_dtype(torch, dtypes):
    """The dtype the reference computes in: the promotion of ``dtypes``, fp8 counted as float32."""
    out = None
    for dt in dtypes:
        dt = torch.float32 if _is_fp8(torch, dt) else dt
        out = dt if out is None else torch.promote_types(out, dt)
    return out


def _check_input(torch, v, t):
    """Refuse a tensor the reference cannot run for input ``v`` (naming it)."""
    if not isinstance(t, torch.Tensor):
        raise DiagramError(f"input {v.name}: expected a torch tensor, got {type(t).__name__}")
    if t.dtype == torch.bool or t.is_complex() or not t.is_floating_point():
        raise DiagramError(f"input {v.label()}: dtype {t.dtype} is not a real floating-point type; pass "
                           "float64, float32, bfloat16, float16 or fp8 tensors")
    if t.dim() != len(v.axes):
        raise DiagramError(f"input {v.label()}: expected {len(v.axes)} dimensions, got shape "
                           f"{tuple(t.shape)}")


def run_reference(diagram, inputs: Mapping | None = None, *, sizes: Mapping[str, int] | None = None,
                  device=None, dtype=None, seed: int | None = None, keep_intermediates: bool = False) -> dict:
    """Run ``diagram`` in PyTorch and return its outputs (name → tensor).

    ``inputs`` maps input names to floating-point tensors on one device (missing ones are drawn
    at random); their shapes bind symbolic axis sizes. Every input is converted to the compute
    dtype: ``dtype`` when given (use ``torch.float64`` for a verification oracle), else the
    promotion of the inputs' dtypes; fp8 is computed in float32. ``keep_intermediates``
    returns every array of the diagram, not only the outputs. What cannot run (see the module
    docstring) raises a DiagramError naming the input.

    >>> import torch
    >>> from napkin.diagrams import library
    >>> d = library.get("matmul").bind(a=2, b=3, c=4)
    >>> out = d.reference({"A": torch.ones(2, 3), "B": torch.ones(3, 4, dtype=torch.float64)})
    >>> out["C"].dtype, float(out["C"][0, 0])
    (torch.float64, 3.0)
    """
    torch = _torch()
    if inputs is not None and not isinstance(inputs, Mapping):
        raise DiagramError(f"reference of {diagram.name!r}: inputs must map input names to tensors, got "
                           f"{type(inputs).__name__}")
    inputs = dict(inputs or {})
    bad = [k for k in inputs if not isinstance(k, str)]
    if bad:
        raise DiagramError(f"reference of {diagram.name!r}: input names must be strings, got {bad[0]!r}")
    unknown = set(inputs) - set(diagram.input_names)
    if unknown:
        raise DiagramError(f"diagram {diagram.name!r} has no input {sorted(unknown)}; "
                           f"inputs are {list(diagram.input_names)}")
    if sizes is not None and not isinstance(sizes, Mapping):
        raise DiagramError(f"reference of {diagram.name!r}: sizes must map axis names to sizes, got "
                           f"{type(sizes).__name__}")
    bound = dict(sizes or {})
    first = None
    for v in diagram.inputs:
        if v.name in inputs:
            t = inputs[v.name]
            _check_input(torch, v, t)
            if first is None:
                first = (v, t)
            elif t.device != first[1].device:
                raise DiagramError(f"input {v.name} is on {t.device} but input {first[0].name} is on "
                                   f"{first[1].device}; put every input on one device")
            for a, n in zip(v.axes, t.shape):
                if a.is_bound and a.size != n:
                    raise DiagramError(f"input {v.label()}: axis {a.name!r} has size {a.size} but the "
                                       f"tensor has {n} (shape {tuple(t.shape)})")
                if bound.setdefault(a.name, n) != n:
                    raise DiagramError(f"input {v.label()}: axis {a.name!r} has size {bound[a.name]} "
                                       f"elsewhere but {n} here")
    bound = {k: v for k, v in bound.items() if k not in diagram.axes or not diagram.axes[k].is_bound}
    d = diagram.bind(bound) if bound else diagram
    for v in (*d.inputs, *d.nodes):
        if len(v.axes) > MAX_TENSOR_DIMS:
            raise DiagramError(f"reference: array {d.name_of(v)} carries {len(v.axes)} axes; a PyTorch "
                               f"tensor holds at most {MAX_TENSOR_DIMS}")
    if device is None:
        device = first[1].device if first is not None else "cpu"
    else:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise DiagramError(f"reference: device {device!r} is not a torch device") from None
    want = _resolve_dtype(dtype, "fp64") if dtype is not None else None
    missing = [v.name for v in d.inputs if v.name not in inputs]
    if missing:
        drawn = random_inputs(d, dtype=want, device=device, seed=seed)
        for n in missing:
            inputs[n] = drawn[n]
    if want is not None:
        # cast first (an fp8 dtype rounds the inputs to fp8), then compute in a dtype with arithmetic
        inputs = {n: t.to(device=device, dtype=want) for n, t in inputs.items()}
    compute = _compute_dtype(torch, [inputs[v.name].dtype for v in d.inputs])
    env: dict[int, object] = {}
    for v in d.inputs:
        env[id(v)] = inputs[v.name].to(device=device, dtype=compute)
    ops = ArrayOps("torch")
    sizes_now = d.sizes
    for v in d.nodes:
        env[id(v)] = _run_box(v, [env[id(a)] for a in v.args], ops, sizes_now)
    if keep_intermediates:
        return {d.name_of(v): env[id(v)] for v in (*d.inputs, *d.nodes)}
    return {n: env[id(v)] for n, v in zip(d.output_names, d.outputs)}


def align(t, have: tuple[str, ...], want: tuple[str, ...]):
    """View tensor ``t`` with axes ``have`` as a tensor broadcastable to axes ``want``."""
    order = [have.index(n) for n in want if n in have]
    t = t.permute(*order) if order != list(range(len(order))) else t
    shape = []
    it = iter(t.shape)
    for n in want:
        shape.append(next(it) if n in have else 1)
    return t.reshape(shape)


def index_grids(v: Value, names: tuple[str, ...], like):
    """Integer position tensors along ``names``, broadcastable over ``v``'s axes."""
    torch = _torch()
    grids = []
    for n in names:
        size = v.axis(n).bound_size
        idx = torch.arange(size, device=like.device)
        grids.append(align(idx, (n,), v.axis_names))
    return grids


def _run_box(v: Value, args, ops: ArrayOps, sizes):
    torch = _torch()
    op = v.op
    if isinstance(op, Contract):
        ins = [x.axis_names for x in v.args]
        if len({n for names in ins for n in names}) <= len(string.ascii_letters):
            return _einsum(args, ins, v.axis_names)
        return contract_merged(args, ins, v.axis_names)
    if isinstance(op, Map):
        f = get_function(op.fn)
        xs = [align(t, x.axis_names, v.axis_names) for t, x in zip(args, v.args)]
        idx = index_grids(v, op.index_axes, xs[0])
        n = [v.axis(a).bound_size for a in op.index_axes]
        out = f.impl(ops, xs, op.param_values(sizes), idx, n)
        return out.expand([a.bound_size for a in v.axes]).to(args[0].dtype)  # a list: also 0 axes
    if isinstance(op, Reduce):
        (x,) = v.args
        dim = x.axis_names.index(op.over)
        t = args[0]
        if op.how == "sum":
            return t.sum(dim)
        if op.how == "mean":
            return t.mean(dim)
        if op.how == "max":
            return t.amax(dim)
        return t.amin(dim)
    if isinstance(op, Softmax):
        dim = v.args[0].axis_names.index(op.over)
        return torch.softmax(args[0], dim=dim)
    if isinstance(op, Norm):
        dim = v.args[0].axis_names.index(op.over)
        t = args[0]
        if op.how == "layernorm":
            mean = t.mean(dim, keepdim=True)
            var = ((t - mean) ** 2).mean(dim, keepdim=True)
            return (t - mean) * torch.rsqrt(var + op.eps)
        return t * torch.rsqrt((t * t).mean(dim, keepdim=True) + op.eps)
    if isinstance(op, Rename):
        return args[0]
    raise DiagramError(f"reference: no PyTorch rule for box {op.kind!r}")


def _einsum(args, ins: list[tuple[str, ...]], out: tuple[str, ...]):
    """``torch.einsum`` with one letter per axis (at most 52 distinct axes)."""
    torch = _torch()
    letters: dict[str, str] = {}
    pool = iter(string.ascii_letters)
    for names in ins:
        for n in names:
            if n not in letters:
                letters[n] = next(pool)
    spec = ",".join("".join(letters[n] for n in names) for names in ins)
    spec += "->" + "".join(letters[n] for n in out)
    return torch.einsum(spec, *args)


def contract_merged(args, ins: list[tuple[str, ...]], out: tuple[str, ...]):
    """The contraction ``einsum(ins -> out)`` over any number of axes.

    Axes that play the same part (carried by the same operands, kept or summed alike) are merged
    into one dimension of each operand, so ``einsum`` sees one subscript per part (at most
    2·2^operands of them) however many axes there are; the result is split and permuted back.

    >>> import torch
    >>> a, b = torch.randn(2, 3, 4), torch.randn(4, 3, 5)
    >>> got = contract_merged([a, b], [("i", "j", "k"), ("k", "j", "l")], ("l", "i"))
    >>> torch.allclose(got, torch.einsum("ijk,kjl->li", a, b), atol=1e-6)
    True
    """
    sizes: dict[str, int] = {}
    order: list[str] = []
    for t, names in zip(args, ins):
        for n, size in zip(names, t.shape):
            if n not in sizes:
                order.append(n)
            sizes[n] = max(sizes.get(n, 1), size)  # a broadcast dimension of 1 takes the other's size
    part = {n: (tuple(n in names for names in ins), n in out) for n in order}
    parts: list[tuple] = []
    for n in order:
        if part[n] not in parts:
            parts.append(part[n])
    if len(parts) > len(string.ascii_letters):
        raise DiagramError(f"reference: a contraction of {len(args)} arrays has {len(parts)} kinds of axes; "
                           f"einsum takes at most {len(string.ascii_letters)}")
    grouped = {p: [n for n in order if part[n] == p] for p in parts}
    letter = {p: string.ascii_letters[i] for i, p in enumerate(parts)}
    merged, specs = [], []
    for t, names in zip(args, ins):
        mine = [p for p in parts if any(n in names for n in grouped[p])]
        axis_order = [n for p in mine for n in grouped[p]]
        t = t.permute(*[names.index(n) for n in axis_order]) if axis_order != list(names) else t
        shape = [_prod(sizes[n] for n in grouped[p]) for p in mine]
        merged.append(t.expand([sizes[n] for n in axis_order]).reshape(shape))  # a list: also 0 axes
        specs.append("".join(letter[p] for p in mine))
    out_parts = [p for p in parts if p[1]]
    res = _torch().einsum(",".join(specs) + "->" + "".join(letter[p] for p in out_parts), *merged)
    out_order = [n for p in out_parts for n in grouped[p]]
    res = res.reshape([sizes[n] for n in out_order])
    return res.permute(*[out_order.index(n) for n in out]) if out_order != list(out) else res


def _prod(dims) -> int:
    n = 1
    for x in dims:
        n *= int(x)
    return n
