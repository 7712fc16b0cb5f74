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
- an autograd kernel whose gradients run on napkin's kernels (CUDA tensors): the backward
  diagram (:meth:`Diagram.grad <napkin.diagrams.diagram.Diagram.grad>`) with the saves
  :func:`napkin.perfmodel.saving.choose_saved` picks, and the forward that also outputs them
  (:func:`napkin.diagrams.grad.forward_with_saves`), compiled and registered as two more
  operators. Under autograd the forward runs the with-saves operator and keeps the saved arrays;
  the backward runs the backward operator for the inputs that need a gradient (one backward is
  compiled per distinct set, at its first use), on cotangents made contiguous and cast to the
  operator's dtype (a missing one is zeros). Where napkin cannot build the backward, and for CPU
  tensors, the backward recomputes the diagram in PyTorch (float32) and takes its
  vector-Jacobian product; the reason is logged once (a warning). Both are ordinary
  ``torch.ops.napkin`` operators with fake implementations, so ``torch.compile`` traces the
  training graphs (forward and backward) without a graph break.
  Where no gradient is needed it goes straight to the CUDA kernel for plain CUDA tensors (no
  second pass through the dispatcher; tensor subclasses, fake tensors and active dispatch modes
  are redispatched as usual), so ``torch.compile``'d code calling the operator pays little for it.

Calling the :class:`NapkinOp` itself on plain CUDA tensors outside ``torch.compile``, with no
gradient needed and no torch-function or dispatch mode active, skips the dispatcher as well and
runs the compiled diagram directly; anything else goes through ``torch.ops.napkin``.

Inputs are checked cheaply (dtype, rank, the sizes of fixed axes, one device); a non-contiguous
input is made contiguous first, as PyTorch's own operators accept any strides. Dynamic axes
(``dynamic={"q": (1, 8192)}``) take their size from the inputs at each call and one plan
serves the whole range (:mod:`napkin.codegen.dynamic`). Under ``torch.compile`` the checks run in
the fake implementation while dynamo traces, and dynamo reports what they raise wrapped in its own
``TorchRuntimeError``; napkin's :class:`~napkin.errors.LaunchError` message is inside it.

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


#: Devices whose gradients run napkin's backward kernels; elsewhere (CPU tensors) the
#: reference's vector-Jacobian product. Tests add "cpu" to run the backward operators' CPU kernels
#: (their references) through the same plumbing.
KERNEL_GRAD_DEVICES = frozenset({"cuda"})


class _KernelGrad(torch.autograd.Function):
    """The operator with gradients on napkin's kernels: forward the with-saves operator (the
    outputs, then the saved arrays), backward the backward operator for ``needs_input_grad``."""

    @staticmethod
    def forward(ctx, op, pieces, *tensors):
        outs = pieces.forward(*tensors)
        outs = outs if isinstance(outs, tuple) else (outs,)
        ctx.op, ctx.pieces, ctx.n_in = op, pieces, len(tensors)
        ctx.save_for_backward(*tensors, *(outs[i] for i in pieces.saved_index))
        res = outs[:len(op.output_names)]
        return res[0] if len(res) == 1 else res

    @staticmethod
    def backward(ctx, *grads):
        op, pieces = ctx.op, ctx.pieces
        stored = ctx.saved_tensors
        inputs, saved = stored[:ctx.n_in], stored[ctx.n_in:]
        need = tuple(bool(r) for r in ctx.needs_input_grad[2:])
        return (None, None, *op._kernel_vjp(pieces, inputs, saved, need, grads))


class _GradPieces:
    """The compiled parts of one operator's backward: ``forward`` (the with-saves operator: the
    outputs, then the saved arrays), ``save`` (the saved names, in the backward diagram's order),
    ``saved_index`` (each saved name's position in ``forward``'s outputs), ``choice`` (the
    :class:`~napkin.perfmodel.saving.SavePlan`), ``ranked`` (the save sets tried, with the
    predicted seconds of their forward and backward, best first) and the backward operators made so far, by the
    tuple of which inputs need a gradient (an operator, or the reason none could be built)."""

    def __init__(self, forward: "NapkinOp", save: tuple[str, ...], choice):
        self.forward = forward
        self.save = save
        self.saved_index = tuple(forward.output_names.index(n) for n in save)
        self.choice = choice
        self.ranked: list[tuple[frozenset, float, float]] = []
        self.backward: dict[tuple[bool, ...], "NapkinOp | str"] = {}


def registered() -> dict[str, "NapkinOp"]:
    """Every napkin operator registered in this process, by qualified name."""
    with _lock:
        return {o.qualname: o for o in _ops.values()}


def op(diagram, *, sizes: Mapping[str, int] | None = None, dtype: str | None = None, dynamic=None, gpu=None,
       family: str | None = None, schedule=None, plan=None, name: str | None = None,
       grad: bool = True) -> "NapkinOp":
    """Compile ``diagram`` (a Diagram or library name) and register it as a PyTorch operator.

    ``sizes``, ``dtype``, ``gpu``, ``family``, ``schedule``, ``plan`` and ``dynamic`` are
    :func:`napkin.codegen.compile`'s. ``name`` replaces the diagram's name in the operator's
    (letters, digits and ``_``; a digest of the options always follows it). ``grad``: gradients
    on napkin's kernels (the with-saves forward and the backward for every input are compiled
    here when a GPU exists, else at the first forward that needs them); False keeps the
    reference's vector-Jacobian product.
    """
    from ..codegen.api import compile as compile_diagram

    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    if not isinstance(diagram, Diagram):
        raise CodegenError(f"op: expected a Diagram or a library name, got {type(diagram).__name__}")
    sizes = _checked_sizes(sizes)
    ident = {
        "diagram": diagram.summary(description=False), "sizes": {k: int(v) for k, v in (sizes or {}).items()},
        "dtype": dtype, "dynamic": _jsonable(dynamic), "gpu": repr(gpu) if gpu is not None else None,
        "family": family, "schedule": str(schedule) if schedule is not None else None,
        "plan": plan.to_dict() if plan is not None else None, "grad": bool(grad),
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
            made.options = {"sizes": dict(sizes or {}), "dtype": dtype, "dynamic": dynamic, "gpu": gpu,
                            "grad": bool(grad)}
        else:
            return made
    if grad and torch.cuda.is_available():
        made._grad_pieces()
    return made


def _checked_sizes(sizes):
    """``sizes`` as axis name → int, checked before the operator's digest is taken: a size that
    is not an integer (2.7, "4") is refused here, where ``int()`` would make it another operator's
    (2.7 the one built for 2)."""
    if sizes is None:
        return None
    if not isinstance(sizes, Mapping):
        raise CodegenError(f"op: sizes must be a mapping of axis names to sizes, got {type(sizes).__name__}")
    from ..diagrams.axes import check_size

    out = {}
    for k, v in sizes.items():
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise CodegenError(f"op: the size of axis {k!r} must be an integer, got {v!r}")
        out[k] = check_size(str(k), int(v.__index__()))
    return out


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
        # the kernels may store an array in another dtype than the diagram's (attention's saved
        # log-sum-exp in fp32): the checks and the fake outputs follow the compiled diagram
        ins, outs = getattr(compiled, "_dtypes", None) or {}, getattr(compiled, "_out_dtypes", None) or {}
        self._in_dtypes = tuple(torch_dtype(ins.get(v.name, v.dtype)) for v in d.inputs)
        self._out_dtypes = tuple(torch_dtype(outs.get(n, v.dtype)) for n, v in zip(d.output_names, d.outputs))
        # each input's axes: a fixed size, or the name of a dynamic axis
        self._in_axes = tuple(tuple(a.bound_size if a.name not in self.dynamic else a.name for a in v.axes)
                              for v in d.inputs)
        self._out_axes = tuple(tuple(a.bound_size if a.name not in self.dynamic else a.name for a in v.axes)
                               for v in d.outputs)
        self._where = {n: next((i, j) for i, axes in enumerate(self._in_axes) for j, a in enumerate(axes) if a == n)
                       for n in self.dynamic}
        self._reference_diagram = d
        self.options: dict = {"grad": False}
        self._grad: "_GradPieces | str | None" = None
        self._grad_lock = threading.Lock()
        self._warned: set[str] = set()
        self._define()
        self.overload = getattr(getattr(torch.ops.napkin, opname), "default")

    def __repr__(self) -> str:
        dyn = f", dynamic {self.dynamic}" if self.dynamic else ""
        return f"NapkinOp({self.qualname}{dyn})"

    def __call__(self, *tensors, **by_name):
        """The outputs (a tensor, or a tuple in ``output_names`` order) of the diagram on the
        input tensors: in ``input_names`` order, or by name (``op(X=x)``), as a compiled diagram
        takes them."""
        if by_name:
            tensors = self._in_order(tensors, by_name)
        if len(tensors) != len(self.input_names):  # else torch's schema error, a RuntimeError
            raise LaunchError(f"{self.qualname} takes {len(self.input_names)} tensor(s) "
                              f"({', '.join(self.input_names)}), got {len(tensors)}")
        for n, t in zip(self.input_names, tensors):
            if not isinstance(t, torch.Tensor):
                raise LaunchError(f"{n}: expected a torch tensor, got {type(t).__name__}")
        if (not _compiling() and not _function_modes() and _plain_cuda(tensors)
                and not (_grad_enabled() and _any_requires_grad(*tensors))):
            return self._cuda(*tensors)
        return self.overload(*tensors)

    def _in_order(self, tensors: tuple, by_name: dict) -> tuple:
        """Positional ``tensors`` then ``by_name`` as one tuple in input order."""
        from ..codegen.calling import bind_inputs

        got = bind_inputs(self.qualname, self.input_names, tensors, by_name)
        return tuple(got[n] for n in self.input_names)

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
        """The Autograd kernel: where an input needs a gradient, :class:`_KernelGrad` (napkin's
        backward kernels) on CUDA tensors, :class:`_ReferenceGrad` on others or where napkin
        cannot build the backward; else the CUDA kernel at once for plain CUDA tensors; else the
        dispatcher below autograd (fake and functional tensors while tracing, CPU tensors,
        dispatch modes)."""
        if _grad_enabled() and _any_requires_grad(*tensors):
            if tensors and tensors[0].device.type in KERNEL_GRAD_DEVICES and self.options.get("grad"):
                pieces = self._grad_pieces()
                if not isinstance(pieces, str):
                    return _KernelGrad.apply(self, pieces, *tensors)
            return _ReferenceGrad.apply(self, *tensors)
        if _plain_cuda(tensors):
            return self._cuda(*tensors)
        with _below_autograd():
            return self.overload(*tensors)

    def _say_once(self, why: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            _log.warning("%s: gradients from the PyTorch reference, not napkin's kernels: %s", self.qualname, why)

    def _sub_op(self, diagram: Diagram, name: str) -> "NapkinOp":
        """``diagram`` (the forward with saves, a backward) compiled with this operator's sizes,
        dtype, dynamic ranges and GPU, registered as an operator of its own (no gradients)."""
        o = self.options
        sizes = {k: v for k, v in o.get("sizes", {}).items() if k in diagram.axes and not diagram.axes[k].is_bound}
        return op(diagram, sizes=sizes or None, dtype=o.get("dtype"), dynamic=self.dynamic or None,
                  gpu=o.get("gpu"), name=name, grad=False)

    def _grad_pieces(self) -> "_GradPieces | str":
        """The saves, the with-saves forward and the backward for every input, compiled once (or
        the reason napkin cannot build them, logged once)."""
        with self._grad_lock:
            if self._grad is None:
                try:
                    self._grad = self._build_grad()
                except Exception as e:  # noqa: BLE001 - any failure to build: the reference serves, said once
                    self._grad = f"{type(e).__name__}: {e}"
                if isinstance(self._grad, str):
                    self._say_once(self._grad)
        return self._grad

    def _build_grad(self) -> "_GradPieces":
        from ..diagrams.grad import forward_with_saves
        from ..perfmodel.saving import choose_saved

        d = self.diagram
        bound = d.bind(**{a: hi for a, (_, hi) in self.dynamic.items()}) if self.dynamic else d
        choice = choose_saved(bound, self.compiled.gpu)
        ranked = self._rank_saves(bound, choice.save)
        lse = {c.name for c in choice.choices if c.kind == "lse"}
        full = tuple(True for _ in self.input_names)
        for entry in ranked:
            save = tuple(sorted(entry[0], key=lambda n: _position(d, n)))
            forward = self._sub_op(forward_with_saves(d, set(save)), f"{_short(d.name)}_saves") if save else self
            pieces = _GradPieces(forward, save, choice)
            pieces.ranked = [entry] + [r for r in ranked if r is not entry]
            pieces.backward[full] = self._build_backward(pieces, full)
            if isinstance(pieces.backward[full], str):
                raise CodegenError(pieces.backward[full])
            low = _rounded_lse(pieces, pieces.backward[full], lse)
            if not low:
                break
            # a log-sum-exp near ln(x) keeps 8 bits in bf16: P = exp(S - lse) would be off by up to
            # 3 % (the fused attention kernels store it in fp32; kernels of maps store the dtype's)
            _log.info("%s: not saving %s: its kernels store it as %s", self.qualname, ", ".join(sorted(low)),
                      ", ".join(sorted({str(t) for t in low.values()})))
        else:
            raise CodegenError("every save set napkin can plan keeps a log-sum-exp below fp32")
        _log.info("%s: gradients on napkin's kernels (saved: %s)", self.qualname, ", ".join(save) or "nothing")
        return pieces

    def _rank_saves(self, bound: Diagram, picks) -> list[tuple[frozenset, float, float]]:
        """Save sets ranked by the predicted time of the forward that outputs them plus the
        backward that reads them: ``choose_saved``'s picks, those without views (a renamed array
        is a copy of its own), without a softmax's log-sum-exp too, the row statistics only, and
        nothing (the earlier of two within 2 % of each other). ``choose_saved`` weighs each
        array's bytes against its recomputation, but an extra output can also break a fused
        forward (the attention kernel writes one output; the planner then runs scores and
        probabilities apart), which only the plans show. Each entry is (save, forward seconds,
        backward seconds), best first.

        Every set that saves a norm's statistic also saves what the backward would recompute
        from it (:func:`napkin.perfmodel.saving.save_set`, the rule ``choose_saved`` applies to
        its own picks: the statistic is rounded to the diagram's dtype, so the recomputed array
        is not the one the forward's saved arrays were computed from). That is a matter of
        accuracy, not of time, so no set without them is ranked."""
        from ..codegen.api import local_arch
        from ..codegen.plancache import derive_cached
        from ..diagrams.grad import forward_with_saves, grad
        from ..diagrams.ops import Rename
        from ..perfmodel.saving import save_set

        gpu = self.compiled.gpu
        arch = local_arch() or gpu.arch
        picks = frozenset(picks)
        names = set(bound.names.values())
        views = {n for n in picks if n in names and isinstance(bound.value(n).op, Rename)}
        no_views = picks - views
        cands = [picks, no_views, frozenset(n for n in no_views if not n.endswith("_lse")),
                 frozenset(n for n in picks if n.endswith(("_rstd", "_mean"))), frozenset()]
        out, seen, last = [], set(), None
        for c in cands:
            c = save_set(bound, c)
            if c in seen:
                continue
            seen.add(c)
            try:
                fwd = derive_cached(forward_with_saves(bound, set(c)) if c else bound, gpu, arch=arch).seconds
                bwd = derive_cached(grad(bound, None, set(c)), gpu, arch=arch).seconds
            except Exception as e:  # noqa: BLE001 - a set the planner cannot take is not a candidate
                _log.info("%s: saving %s: %s", self.qualname, sorted(c), e)
                last = e
                continue
            out.append((c, fwd, bwd))
        if not out:
            raise CodegenError(f"no save set gives a forward and a backward napkin can plan: {last}")
        # within 2 % of the best (the model's noise) the earlier candidate wins: choose_saved's
        # picks first, then fewer departures from them
        best = min(t[1] + t[2] for t in out)
        first = next(t for t in out if t[1] + t[2] <= best * 1.02)
        return [first] + sorted((t for t in out if t is not first), key=lambda t: t[1] + t[2])

    def _build_backward(self, pieces: _GradPieces, need: tuple[bool, ...]) -> "NapkinOp | str":
        from ..diagrams.grad import grad, saveable

        wrt = [n for n, r in zip(self.input_names, need) if r]
        try:
            usable = {s.name for s in saveable(self.diagram, wrt)}
            save = {n for n in pieces.save if n in usable}
            b = grad(self.diagram, wrt, save)
            return self._sub_op(b, f"{_short(self.diagram.name)}_grad")
        except Exception as e:  # noqa: BLE001 - the reference serves this set of inputs, said once
            return f"the backward for {', '.join(wrt)}: {type(e).__name__}: {e}"

    def backward_op(self, *wrt: str) -> "NapkinOp":
        """The compiled backward operator for the inputs ``wrt`` (default: every input), as the
        autograd kernel runs it: its inputs are the forward's, the cotangents ``d<output>`` and
        the saved arrays (:attr:`saved_names`), its outputs ``d<input>``. Raises a CodegenError
        naming why where napkin cannot build it."""
        pieces = self._grad_pieces()
        if isinstance(pieces, str):
            raise CodegenError(f"{self.qualname}: no backward on napkin's kernels: {pieces}")
        unknown = [w for w in wrt if w not in self.input_names]
        if unknown:
            raise CodegenError(f"{self.qualname}: {unknown[0]!r} is not an input; inputs are "
                               f"{', '.join(self.input_names)}")
        need = tuple(not wrt or n in wrt for n in self.input_names)
        b = self._backward_for(pieces, need)
        if isinstance(b, str):
            raise CodegenError(f"{self.qualname}: {b}")
        return b

    @property
    def saved_names(self) -> tuple[str, ...]:
        """The arrays the with-saves forward keeps for the backward (empty without one)."""
        pieces = self._grad_pieces()
        return () if isinstance(pieces, str) else pieces.save

    def _backward_for(self, pieces: _GradPieces, need: tuple[bool, ...]) -> "NapkinOp | str":
        with self._grad_lock:
            b = pieces.backward.get(need)
        if b is None:
            b = self._build_backward(pieces, need)
            with self._grad_lock:
                b = pieces.backward.setdefault(need, b)
        return b

    def _kernel_vjp(self, pieces: _GradPieces, inputs, saved, need, grads) -> tuple:
        """The gradients of the inputs in ``need`` from the backward operator (None for the
        others); the reference's VJP where that operator cannot be built."""
        if not any(need):
            return tuple(None for _ in need)
        b = self._backward_for(pieces, need)
        if isinstance(b, str):
            self._say_once(b)
            return self._vjp(inputs, need, grads)
        shapes = self._out_shapes(inputs)
        env = dict(zip(self.input_names, inputs))
        for n, g, dt, shape in zip(self.output_names, grads, self._out_dtypes, shapes):
            if g is None:
                g = torch.zeros(shape, dtype=dt, device=inputs[0].device)
            else:
                g = g.to(dt).contiguous()
            env["d" + n] = g
        # a saved array in the dtype the backward's kernels read (the forward's attention kernel
        # stores the log-sum-exp in fp32; an unfused backward plan reads the diagram's dtype)
        want = dict(zip(b.input_names, b._in_dtypes))
        env.update((n, t if t.dtype == want[n] else t.to(want[n])) for n, t in zip(pieces.save, saved))
        outs = b(*(env[n] for n in b.input_names))
        outs = outs if isinstance(outs, tuple) else (outs,)
        got = dict(zip(b.output_names, outs))
        return tuple(got["d" + n] if r else None for n, r in zip(self.input_names, need))

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


def _rounded_lse(pieces: _GradPieces, backward, lse: set[str]) -> dict:
    """The saved log-sum-exps (names in ``lse``) that the forward writes or the backward reads in a
    dtype below fp32, with that dtype."""
    out_dt = dict(zip(pieces.forward.output_names, pieces.forward._out_dtypes))
    in_dt = dict(zip(backward.input_names, backward._in_dtypes))
    low = {}
    for n in pieces.save:
        if n in lse:
            for dt in (out_dt.get(n), in_dt.get(n)):
                if dt is not None and dt != torch.float32 and dt != torch.float64:
                    low[n] = dt
    return low


def _position(diagram: Diagram, saved: str):
    """Where a saved name's array lies in ``diagram`` (a statistic ``N_rstd`` at its norm ``N``)."""
    order = {diagram.name_of(v): i for i, v in enumerate(diagram.nodes)}
    return (order.get(saved, order.get(saved.rsplit("_", 1)[0], len(order))), saved)


def _short(name: str) -> str:
    """A diagram name cut so that a suffix and the digest keep an operator name within 64."""
    return name[:40]


def _shape_text(axes) -> str:
    return "(" + ", ".join(str(a) for a in axes) + ("," if len(axes) == 1 else "") + ")"


def _arg_name(name: str) -> str:
    return name + "_" if name in _RESERVED else name
