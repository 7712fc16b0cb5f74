"""Compiled diagrams registered as PyTorch operators (``torch.ops.napkin.*``).

:func:`op` compiles a diagram (:func:`napkin.codegen.compile`) and registers it with
``torch.library`` under ``napkin::<diagram>_<digest>``:

- a schema with one ``Tensor`` argument per diagram input (by its name, in ``diagram.inputs``
  order) and one ``Tensor`` per output;
- a CUDA kernel: the compiled diagram's launches, on the current CUDA stream (a CUDA graph being
  captured records them);
- a CPU kernel: the diagram's PyTorch reference (:func:`napkin.diagrams.reference.run_reference`)
  computed in float32 and rounded to the outputs' dtypes, so the same code runs, and traces,
  without a GPU;
- a fake (meta) implementation that gives the outputs' shapes, dtypes and devices from the
  inputs' (symbolic sizes included), so ``torch.compile(fullgraph=True)`` traces the op as one
  node, with no graph break;
- an autograd kernel that differentiates the reference: the forward runs napkin's kernels, the
  backward recomputes the diagram in PyTorch (float32) and takes its vector-Jacobian product.
  Where no gradient is needed it goes straight to the CUDA kernel for plain CUDA tensors (no
  second pass through the dispatcher; tensor subclasses, fake tensors and active dispatch modes
  are redispatched as usual), so ``torch.compile``'d code calling the operator pays little for it.

Calling the :class:`NapkinOp` itself on plain CUDA tensors outside ``torch.compile``, with no
gradient needed and no torch-function or dispatch mode active, skips the dispatcher as well and
runs the compiled diagram directly; anything else goes through ``torch.ops.napkin``.

Inputs are checked cheaply (dtype, rank, the sizes of fixed axes, one device); a non-contiguous
input is made contiguous first, as PyTorch's own operators accept any strides. Dynamic axes
(``dynamic={"q": (1, 8192)}``) take their size from the inputs at each call and one plan
serves the whole range (:mod:`napkin.codegen.dynamic`).

Registering the same diagram, sizes and options again returns the operator made before (a
``torch.library`` name is defined once per process).

>>> import torch
>>> from napkin.torch import op
>>> mm = op("matmul", sizes={"a": 4, "b": 8, "c": 16}, dtype="fp32", gpu="h100")
>>> mm.qualname.startswith("napkin::matmul_")
True
>>> A, B = torch.randn(4, 8), torch.randn(8, 16)
>>> torch.allclose(mm(A, B), A @ B, atol=1e-5)       # the CPU kernel: the reference
True
>>> f = torch.compile(lambda a, b: mm(a, b).relu(), fullgraph=True, backend="eager")
>>> torch.allclose(f(A, B), (A @ B).relu(), atol=1e-5)
True
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence

import torch

from ..diagrams.diagram import Diagram
from ..errors import CodegenError, LaunchError

__all__ = ["op", "NapkinOp", "registered"]

_log = logging.getLogger(__name__)

#: The library every napkin operator is defined in (kept alive: its registrations live with it).
_LIB = torch.library.Library("napkin", "FRAGMENT")
_ops: dict[str, "NapkinOp"] = {}
_lock = threading.Lock()

#: Names the schema parser reads as something else than an argument name.
_RESERVED = frozenset({"self", "out", "Tensor", "int", "float", "bool", "str", "None", "True", "False", "Scalar",
                       "Device", "Layout", "ScalarType", "Generator", "Storage", "Stream", "SymInt", "MemoryFormat",
                       "Dimname", "QScheme", "complex", "Any", "t"})


_below_autograd = torch._C._AutoDispatchBelowAutograd
_grad_enabled = torch._C.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_compiling = torch.compiler.is_compiling
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_cuda(tensors) -> bool:
    """Plain CUDA tensors (not a subclass: no fake or functional tensor) and no dispatch mode
    active: what may skip the dispatcher's remaining keys and launch at once."""
    if not tensors or _dispatch_modes():
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TYPES:
            return False
    return tensors[0].is_cuda


class _ReferenceGrad(torch.autograd.Function):
    """The operator with gradients: forward below autograd (the kernels), backward the
    reference's vector-Jacobian product (:meth:`NapkinOp._vjp`)."""

    @staticmethod
    def forward(ctx, op, *tensors):
        ctx.op = op
        ctx.save_for_backward(*tensors)
        with _below_autograd():
            return op.overload(*tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.op._vjp(ctx.saved_tensors, ctx.needs_input_grad[1:], grads))


def registered() -> dict[str, "NapkinOp"]:
    """Every napkin operator registered in this process, by qualified name."""
    with _lock:
        return {o.qualname: o for o in _ops.values()}


def op(diagram, *, sizes: Mapping[str, int] | None = None, dtype: str | None = None, dynamic=None, gpu=None,
       family: str | None = None, schedule=None, plan=None, name: str | None = None) -> "NapkinOp":
    """Compile ``diagram`` (a Diagram or library name) and register it as a PyTorch operator.

    ``sizes``, ``dtype``, ``gpu``, ``family``, ``schedule``, ``plan`` and ``dynamic`` are
    :func:`napkin.codegen.compile`'s. ``name`` replaces the diagram's name in the operator's
    (letters, digits and ``_``; a digest of the options always follows it).
    """
    from ..codegen.api import compile as compile_diagram

    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    if not isinstance(diagram, Diagram):
        raise CodegenError(f"op: expected a Diagram or a library name, got {type(diagram).__name__}")
    ident = {
        "diagram": diagram.summary(description=False), "sizes": {k: int(v) for k, v in (sizes or {}).items()},
        "dtype": dtype, "dynamic": _jsonable(dynamic), "gpu": repr(gpu) if gpu is not None else None,
        "family": family, "schedule": str(schedule) if schedule is not None else None,
        "plan": plan.to_dict() if plan is not None else None,
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
    base = name if name is not None else diagram.name
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", base):
        raise CodegenError(f"op: name {base!r} must be a letter followed by letters, digits or '_' (at most 64)")
    opname = f"{base}_{digest}"
    with _lock:
        made = _ops.get(opname)
    if made is not None:
        return made
    compiled = compile_diagram(diagram, gpu=gpu, sizes=sizes, dtype=dtype, schedule=schedule, family=family,
                               plan=plan, dynamic=dynamic)
    with _lock:
        made = _ops.get(opname)
        if made is None:
            made = _ops[opname] = NapkinOp(compiled, opname)
    return made


def _jsonable(dynamic):
    if dynamic is None or isinstance(dynamic, str):
        return dynamic
    if isinstance(dynamic, Mapping):
        return {str(k): list(v) if isinstance(v, (tuple, list)) else v for k, v in dynamic.items()}
    return list(dynamic)


class NapkinOp:
    """A compiled diagram registered as ``torch.ops.napkin.<opname>``; call it with tensors.

    Attributes: ``compiled`` (the :class:`~napkin.codegen.api.CompiledDiagram`, or
    :class:`~napkin.codegen.dynamic.DynamicDiagram` for dynamic axes), ``diagram`` (the fixed axes
    bound), ``qualname`` (``napkin::...``), ``overload`` (the ``OpOverload`` torch.compile sees),
    ``input_names``, ``output_names``, ``dynamic`` (axis -> (low, high)).
    """

    def __init__(self, compiled, opname: str):
        from ..dtypes import torch_dtype

        self.compiled = compiled
        self.diagram: Diagram = compiled.diagram
        self.opname = opname
        self.qualname = f"napkin::{opname}"
        self.dynamic: dict[str, tuple[int, int]] = dict(getattr(compiled, "ranges", {}))
        d = self.diagram
        self.input_names = d.input_names
        self.output_names = d.output_names
        self._in_dtypes = tuple(torch_dtype(v.dtype) for v in d.inputs)
        self._out_dtypes = tuple(torch_dtype(v.dtype) for v in d.outputs)
        # each input's axes: a fixed size, or the name of a dynamic axis
        self._in_axes = tuple(tuple(a.bound_size if a.name not in self.dynamic else a.name for a in v.axes)
                              for v in d.inputs)
        self._out_axes = tuple(tuple(a.bound_size if a.name not in self.dynamic else a.name for a in v.axes)
                               for v in d.outputs)
        self._where = {n: next((i, j) for i, axes in enumerate(self._in_axes) for j, a in enumerate(axes) if a == n)
                       for n in self.dynamic}
        self._reference_diagram = d
        self._define()
        self.overload = getattr(getattr(torch.ops.napkin, opname), "default")

    def __repr__(self) -> str:
        dyn = f", dynamic {self.dynamic}" if self.dynamic else ""
        return f"NapkinOp({self.qualname}{dyn})"

    def __call__(self, *tensors):
        """The outputs (a tensor, or a tuple in ``output_names`` order) of the diagram on the
        input tensors (in ``input_names`` order)."""
        if (not _compiling() and not _function_modes() and _plain_cuda(tensors)
                and not (_grad_enabled() and _any_requires_grad(*tensors))):
            return self._cuda(*tensors)
        return self.overload(*tensors)

    # ------------------------------------------------------------------ registration
    def _schema(self) -> str:
        args = ", ".join(f"Tensor {_arg_name(n)}" for n in self.input_names)
        outs = "Tensor" if len(self.output_names) == 1 else "(" + ", ".join("Tensor" for _ in self.output_names) + ")"
        return f"{self.opname}({args}) -> {outs}"

    def _define(self) -> None:
        _LIB.define(self._schema())
        _LIB.impl(self.opname, self._cuda, "CUDA")
        _LIB.impl(self.opname, self._cpu, "CPU")
        torch.library.register_fake(self.qualname, self._fake, lib=_LIB)
        _LIB.impl(self.opname, self._autograd, "Autograd")
        _log.info("registered %s%s", self.qualname, f" (dynamic {self.dynamic})" if self.dynamic else "")

    # ------------------------------------------------------------------ checks and shapes
    def _check(self, tensors) -> None:
        """dtype, rank and fixed sizes of each input, one device, one size per dynamic axis; a
        LaunchError naming the input (symbolic sizes are left to torch._check)."""
        device = None
        for n, t, dt, axes in zip(self.input_names, tensors, self._in_dtypes, self._in_axes):
            if t.dtype != dt:
                raise LaunchError(f"{n}: dtype is {t.dtype}, expected {dt}")
            if t.dim() != len(axes):
                raise LaunchError(f"{n}: has {t.dim()} axes (shape {tuple(t.shape)}), expected {len(axes)}")
            for j, a in enumerate(axes):
                if isinstance(a, int):
                    _same(t.shape[j], a, lambda n=n, t=t, axes=axes: f"{n}: shape is {tuple(t.shape)}, expected "
                                                                   f"{_shape_text(axes)}")
            if device is None:
                device = t.device
            elif t.device != device:
                raise LaunchError(f"{n}: is on {t.device}, the other inputs on {device}")
        for a, (i, j) in self._where.items():
            size = tensors[i].shape[j]
            lo, hi = self.dynamic[a]
            _within(size, lo, hi, lambda a=a, size=size, lo=lo, hi=hi: f"{self.input_names[i]}: axis {a} has size "
                                                                       f"{size}, outside the dynamic range {lo}..{hi} "
                                                                       f"this op was compiled for")
            for n, t, axes in zip(self.input_names, tensors, self._in_axes):
                for k, b in enumerate(axes):
                    if b == a:
                        _same(t.shape[k], size, lambda n=n, a=a: f"{n}: axis {a} has another size than in "
                                                                 f"{self.input_names[i]}")

    def _out_shapes(self, tensors) -> list[tuple]:
        sizes = {a: tensors[i].shape[j] for a, (i, j) in self._where.items()}
        return [tuple(sizes[a] if isinstance(a, str) else a for a in axes) for axes in self._out_axes]

    def _fake(self, *tensors):
        self._check(tensors)
        device = tensors[0].device if tensors else torch.device("meta")
        outs = tuple(torch.empty(shape, dtype=dt, device=device)
                     for shape, dt in zip(self._out_shapes(tensors), self._out_dtypes))
        return outs[0] if len(outs) == 1 else outs

    # ------------------------------------------------------------------ kernels
    def _cuda(self, *tensors):
        for t in tensors:
            if not t.is_contiguous():
                tensors = tuple(x.contiguous() for x in tensors)
                break
        return self.compiled(*tensors)

    def _cpu(self, *tensors):
        self._check(tensors)
        outs = self.reference(*tensors)
        return outs[0] if len(outs) == 1 else outs

    def reference(self, *tensors, dtype=torch.float32) -> tuple:
        """The diagram's PyTorch reference on ``tensors`` (any device), computed in ``dtype`` and
        rounded to the outputs' dtypes: a tuple in ``output_names`` order."""
        from ..diagrams.reference import run_reference

        out = run_reference(self._reference_diagram, dict(zip(self.input_names, tensors)), dtype=dtype)
        return tuple(out[n].to(dt).contiguous() for n, dt in zip(self.output_names, self._out_dtypes))

    # ------------------------------------------------------------------ autograd
    def _autograd(self, *tensors):
        """The Autograd kernel: gradients through :class:`_ReferenceGrad` where an input needs
        one; else the CUDA kernel at once for plain CUDA tensors; else the dispatcher below
        autograd (fake and functional tensors while tracing, CPU tensors, dispatch modes)."""
        if _grad_enabled() and _any_requires_grad(*tensors):
            return _ReferenceGrad.apply(self, *tensors)
        if _plain_cuda(tensors):
            return self._cuda(*tensors)
        with _below_autograd():
            return self.overload(*tensors)

    def _vjp(self, inputs, need, grads) -> tuple:
        """The reference's vector-Jacobian product (float32) for the inputs in ``need``, cast to
        each input's dtype (None for the others)."""
        from ..diagrams.reference import run_reference

        with torch.enable_grad():
            xs = [t.detach().float().requires_grad_(bool(r)) for t, r in zip(inputs, need)]
            out = run_reference(self._reference_diagram, dict(zip(self.input_names, xs)), dtype=torch.float32)
            pairs = [(out[n], g) for n, g in zip(self.output_names, grads) if g is not None]
            wrt = [x for x, r in zip(xs, need) if r]
            got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g.float() for _, g in pairs],
                                           allow_unused=True) if wrt and pairs else ())
        res = []
        for t, r in zip(inputs, need):
            g = next(got, None) if r else None
            res.append(None if g is None else g.to(t.dtype))
        return tuple(res)

    # ------------------------------------------------------------------ CUDA graphs
    def cuda_graph(self, *example, warmup: int = 2):
        """This operator captured in a CUDA graph for inputs shaped like ``example`` (see
        :class:`napkin.torch.graphs.CUDAGraphCall`)."""
        from .graphs import CUDAGraphCall

        return CUDAGraphCall(self, *example, warmup=warmup)


def _same(actual, expected, message) -> None:
    if isinstance(actual, int):
        if actual != expected:
            raise LaunchError(message())
    else:  # a symbolic size while tracing: a guard, not a Python comparison
        torch._check(actual == expected, message)


def _within(size, lo: int, hi: int, message) -> None:
    if isinstance(size, int):
        if not lo <= size <= hi:
            raise LaunchError(message())
    else:
        torch._check(size >= lo, message)
        torch._check(size <= hi, message)


def _shape_text(axes) -> str:
    return "(" + ", ".join(str(a) for a in axes) + ("," if len(axes) == 1 else "") + ")"


def _arg_name(name: str) -> str:
    return name + "_" if name in _RESERVED else name
