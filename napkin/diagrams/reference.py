"""PyTorch reference execution: the oracle every generated kernel is checked against.

Each box becomes the obvious PyTorch call (``einsum``, ``softmax``, the
elementwise function's torch form). Tensors carry their axes in the order of the
value's ``axes``; broadcasting by axis name is done with views, never copies.

>>> import torch
>>> from napkin.diagrams import library
>>> d = library.get("softmax").bind(r=3, x=5)
>>> out = d.reference(dtype=torch.float64, seed=0)["P"]
>>> torch.allclose(out.sum(-1), torch.ones(3, dtype=torch.float64))
True
"""

from __future__ import annotations

import string
from typing import Mapping

from ..errors import DiagramError
from .functions import ArrayOps, get_function
from .ops import Contract, Map, Norm, Reduce, Rename, Softmax, Value


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
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed if seed is not None else torch.seed() % (2**63))
    out = {}
    for v in d.inputs:
        shape = tuple(a.bound_size for a in v.axes)
        dt = _resolve_dtype(dtype, v.dtype)
        out[v.name] = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dt)
    return out


def _resolve_dtype(dtype, default_name):
    torch = _torch()
    from ..dtypes import torch_dtype

    if dtype is None:
        return torch_dtype(default_name)
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch_dtype(dtype)


def run_reference(diagram, inputs: Mapping | None = None, *, sizes: Mapping[str, int] | None = None,
                  device=None, dtype=None, seed: int | None = None, keep_intermediates: bool = False) -> dict:
    """Run ``diagram`` in PyTorch and return its outputs (name → tensor).

    ``inputs`` maps input names to tensors (missing ones are drawn at random);
    their shapes bind symbolic axis sizes. ``dtype`` casts every input first (use
    ``torch.float64`` for a verification oracle). ``keep_intermediates`` returns
    every array of the diagram, not only the outputs.
    """
    torch = _torch()
    inputs = dict(inputs or {})
    unknown = set(inputs) - set(diagram.input_names)
    if unknown:
        raise DiagramError(f"diagram {diagram.name!r} has no input {sorted(unknown)}; "
                           f"inputs are {list(diagram.input_names)}")
    bound = dict(sizes or {})
    for v in diagram.inputs:
        if v.name in inputs:
            t = inputs[v.name]
            if not isinstance(t, torch.Tensor):
                raise DiagramError(f"input {v.name}: expected a torch tensor, got {type(t).__name__}")
            if t.dim() != len(v.axes):
                raise DiagramError(f"input {v.label()}: expected {len(v.axes)} dimensions, got shape "
                                   f"{tuple(t.shape)}")
            for a, n in zip(v.axes, t.shape):
                if a.is_bound and a.size != n:
                    raise DiagramError(f"input {v.label()}: axis {a.name!r} has size {a.size} but the "
                                       f"tensor has {n} (shape {tuple(t.shape)})")
                if bound.setdefault(a.name, n) != n:
                    raise DiagramError(f"input {v.label()}: axis {a.name!r} has size {bound[a.name]} "
                                       f"elsewhere but {n} here")
    bound = {k: v for k, v in bound.items() if not diagram.axes[k].is_bound} if bound else {}
    d = diagram.bind(bound) if bound else diagram
    if device is None:
        device = next((t.device for t in inputs.values()), "cpu")
    missing = [v.name for v in d.inputs if v.name not in inputs]
    if missing:
        drawn = random_inputs(d, dtype=dtype, device=device, seed=seed)
        for n in missing:
            inputs[n] = drawn[n]
    env: dict[int, object] = {}
    for v in d.inputs:
        t = inputs[v.name].to(device)
        if dtype is not None:
            t = t.to(_resolve_dtype(dtype, v.dtype))
        env[id(v)] = t
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
        letters = {}
        pool = iter(string.ascii_letters)
        for a in (*[ax for x in v.args for ax in x.axes],):
            if a.name not in letters:
                letters[a.name] = next(pool)
        spec = ",".join("".join(letters[n] for n in x.axis_names) for x in v.args)
        spec += "->" + "".join(letters[n] for n in v.axis_names)
        return torch.einsum(spec, *args)
    if isinstance(op, Map):
        f = get_function(op.fn)
        xs = [align(t, x.axis_names, v.axis_names) for t, x in zip(args, v.args)]
        idx = index_grids(v, op.index_axes, xs[0])
        n = [v.axis(a).bound_size for a in op.index_axes]
        out = f.impl(ops, xs, op.param_values(sizes), idx, n)
        return out.expand(*[a.bound_size for a in v.axes]).to(args[0].dtype)
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
