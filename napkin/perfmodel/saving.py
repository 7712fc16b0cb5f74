"""Save or recompute: which forward arrays the backward diagram takes as inputs.

The backward diagram (:func:`napkin.diagrams.grad.grad`) reads forward arrays: P for dV, a
contraction's operands, a map's input, the statistics of a softmax or a norm. Each one is either
**saved** (written to HBM by the forward pass, read back by the backward) or **recomputed** in the
backward from what it has. :func:`choose_saved` decides, array by array in forward order, by
comparing two times on one GPU profile:

- **save**: the array's bytes over the HBM bandwidth, twice (written, then read back), or once for
  an array the forward writes anyway (one of its outputs);
- **recompute**: the compute time of the boxes that rebuild it (at the tensor-core rate for a
  contraction that maps to an mma, else the CUDA-core and special-function rates, counted as
  :mod:`napkin.perfmodel.cost` counts them), plus the bytes of the forward inputs it reads that the
  backward does not read anyway (:func:`napkin.diagrams.grad.inputs_read`). Arrays already saved
  or recomputed for an earlier decision are free. A softmax recomputed without its saved
  log-sum-exp needs its whole row first, so its scores are computed twice (the FlashAttention
  argument for saving the log-sum-exp); with it, P = exp(S − lse) is one elementwise pass. A norm's
  statistics (1/√(var + eps), the mean) are the reductions over the row they summarise.

One more rule is about accuracy, not time (:func:`save_set`, which napkin.torch applies to every
save set it tries): where a norm statistic is saved and a saved array was computed from the
norm's output, the arrays the backward would recompute from the statistic are saved too
(:func:`napkin.diagrams.grad.recomputed_from_statistics`), so the backward reads the forward's
operands, not a second version of them.

The assumption behind "recomputing reads nothing the backward does not read anyway": the kernels of
the backward fuse a recomputation into the kernel that consumes it (FlashAttention's backward
recomputes S and P inside the kernel that reads Q and K for dQ and dK). Where the planner does not
fuse it, the recomputed array costs a write and a read more than this model says.

>>> from napkin.diagrams import library
>>> plan = choose_saved(library.get("attention").bind(q=4096, x=4096, d=128), "h100")
>>> sorted(plan.save)
['O', 'P_lse']
>>> print(plan)  # doctest: +ELLIPSIS
save or recompute for the backward of attention on NVIDIA H100 SXM5 80GB (bf16)
  array  kind   MiB   save µs  recompute µs  choice
  P      value  32.0     20.03          9.44  recompute: recomputed as exp(S − lse): one pass over the scores
  P_lse  lse     0.0      0.00          5.09  save: saves the second pass over the scores
  O      value   1.0      0.31          4.34  save: a forward output: one read
  saved for the backward: 1.0 MiB
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..diagrams.diagram import Diagram
from ..diagrams.functions import get_function, half_form
from ..diagrams.grad import Saved, grad, inputs_read, recomputed_from_statistics, saveable
from ..diagrams.ops import Softmax, Value
from ..dtypes import dtype as lookup_dtype
from ..errors import DiagramError
from .hardware import GPU, get_gpu
from .legality import tensor_core_box

__all__ = ["SaveChoice", "SavePlan", "backward", "box_seconds", "choose_saved", "save_set"]


@dataclass(frozen=True)
class SaveChoice:
    """One forward array the backward reads: its size, the two times, and what was chosen.

    ``saved`` is True when the backward takes it as an input. ``recompute_s`` is the time to rebuild
    it given the choices made before it; ``reason`` says which term decided.
    """

    name: str
    kind: str
    of: str
    bytes: int
    save_s: float
    recompute_s: float
    saved: bool
    reason: str

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "of": self.of, "bytes": self.bytes, "save_s": self.save_s,
                "recompute_s": self.recompute_s, "saved": self.saved, "reason": self.reason}


@dataclass(frozen=True)
class SavePlan:
    """The save-or-recompute choice for one diagram, GPU and dtype; ``save`` goes to ``Diagram.grad``."""

    diagram: str
    gpu: str
    dtype: str
    choices: tuple[SaveChoice, ...]

    @property
    def save(self) -> frozenset[str]:
        """The names the backward diagram takes as inputs."""
        return frozenset(c.name for c in self.choices if c.saved)

    @property
    def saved_bytes(self) -> int:
        """Bytes the forward keeps for the backward (the activation memory of this choice)."""
        return sum(c.bytes for c in self.choices if c.saved)

    def to_dict(self) -> dict:
        return {"diagram": self.diagram, "gpu": self.gpu, "dtype": self.dtype,
                "save": sorted(self.save), "saved_bytes": self.saved_bytes,
                "choices": [c.to_dict() for c in self.choices]}

    def __str__(self) -> str:
        lines = [f"save or recompute for the backward of {self.diagram} on {self.gpu} ({self.dtype})"]
        if not self.choices:
            lines.append("  the backward reads nothing from the forward but its inputs")
            return "\n".join(lines)
        w = max(5, *(len(c.name) for c in self.choices))
        lines.append(f"  {'array':<{w}}  kind   MiB   save µs  recompute µs  choice")
        for c in self.choices:
            lines.append(f"  {c.name:<{w}}  {c.kind:<5} {c.bytes / 2**20:5.1f} {c.save_s * 1e6:9.2f} "
                         f"{c.recompute_s * 1e6:13.2f}  {'save' if c.saved else 'recompute'}: {c.reason}")
        kib = self.saved_bytes / 1024
        lines.append(f"  saved for the backward: " + (f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib:.1f} KiB"))
        return "\n".join(lines)


# ----------------------------------------------------------------------------- times


def _elements(v: Value) -> int:
    return math.prod(a.bound_size for a in v.axes)


def box_seconds(v: Value, gpu: GPU) -> float:
    """The compute time of box ``v`` at peak rates, its FLOPs counted as :func:`napkin.perfmodel.cost`
    counts them (a contraction 2·Π(axes) on tensor cores when it maps to an mma, a map its function's
    FLOPs and special-function operations per element, softmax 4 FLOPs and an exp per element,
    layernorm 5 and rmsnorm 3 FLOPs per element and an rsqrt per row, a reduction one per input).

    >>> from napkin.diagrams import library
    >>> mm = library.get("matmul").bind(a=1024, b=1024, c=1024)
    >>> round(box_seconds(mm.outputs[0], get_gpu("h100")) * 1e6, 2)  # 2·1024³ FLOPs at 989 TFLOP/s
    2.17
    """
    op = v.op
    n = _elements(v)
    tensor = cuda = sfu = 0.0
    if op.kind == "contract":
        every = {a.name: a.bound_size for x in v.args for a in x.axes}
        if op.over:
            flops = 2 * math.prod(every.values())
            if tensor_core_box(v, gpu) is not None:
                tensor = flops
            else:
                cuda = flops
        else:
            cuda = (len(v.args) - 1) * n
    elif op.kind == "map":
        cuda, sfu = (c * n for c in get_function(op.fn).cost(half=half_form(v.dtype)))
    elif op.kind == "reduce":
        cuda = _elements(v.args[0]) + (n if op.how == "mean" else 0)
    elif op.kind == "softmax":
        cuda, sfu = 4 * n, n
    elif op.kind == "norm":
        cuda = (5 if op.how == "layernorm" else 3) * n
        sfu = n // v.axis(op.over).bound_size
    seconds = cuda / gpu.cuda_core_rate("fp32") + sfu / gpu.sfu_rate()
    if tensor:
        seconds += tensor / gpu.tensor_rate(v.dtype)
    return seconds


class _Chooser:
    def __init__(self, diagram: Diagram, gpu: GPU, wrt):
        self.d = diagram
        self.gpu = gpu
        self.bw = gpu.hbm_bandwidth
        self.bytes_per = lookup_dtype(next(iter(diagram.dtypes))).bytes
        self.present: set[int] = set()          # forward values the backward has (saved or recomputed)
        read = set(inputs_read(diagram, wrt))
        self.inputs_charged: set[str] = set(read)  # inputs read anyway, or charged to an earlier choice
        self.outputs = {id(v) for v in diagram.outputs}

    def nbytes(self, elements: int) -> int:
        return elements * self.bytes_per

    def save_seconds(self, v: Value | None, elements: int) -> float:
        once = v is not None and id(v) in self.outputs  # the forward writes its outputs anyway
        return (1 if once else 2) * self.nbytes(elements) / self.bw

    def recompute(self, v: Value, mark: bool = False, seen: set[int] | None = None,
                  inputs: set[str] | None = None) -> float:
        """Time to rebuild ``v`` from what is present (its chain down to inputs); ``mark`` records the
        chain as present and its inputs as read."""
        seen = set() if seen is None else seen
        inputs = set(self.inputs_charged) if inputs is None else inputs
        if v.is_input:
            if v.name in inputs:
                return 0.0
            inputs.add(v.name)
            if mark:
                self.inputs_charged.add(v.name)
            return self.nbytes(_elements(v)) / self.bw
        if id(v) in self.present or id(v) in seen:
            return 0.0
        seen.add(id(v))
        t = box_seconds(v, self.gpu) + sum(self.recompute(a, mark, seen, inputs) for a in v.args)
        if mark:
            self.present.add(id(v))
        return t


def _stat_seconds(v: Value, kind: str, gpu: GPU) -> float:
    """The compute time of a row statistic of norm or softmax ``v`` (a reduction over its row, and for
    the rstd a square, a shift and an rsqrt per row)."""
    n = _elements(v)
    rows = n // v.axis(v.op.over).bound_size
    cuda = {"mean": n + rows, "rstd": 2 * n + 2 * rows, "lse": 4 * n}[kind]
    sfu = {"mean": 0, "rstd": rows, "lse": n}[kind]
    return cuda / gpu.cuda_core_rate("fp32") + sfu / gpu.sfu_rate()


def choose_saved(diagram: Diagram, gpu: GPU | str = "h100", dtype: str | None = None, wrt=None) -> SavePlan:
    """For each forward array the backward of ``diagram`` reads (:func:`~napkin.diagrams.grad.saveable`),
    whether to save it or recompute it on ``gpu`` (see the module docstring); ``dtype`` re-types the
    diagram first (as ``napkin derive --dtype`` does). The diagram must be bound.

    >>> from napkin.diagrams import library
    >>> sorted(choose_saved(library.get("mlp").bind(a=4096, b=4096, c=16384)).save)  # the pre-activation
    ['add']
    """
    if not isinstance(diagram, Diagram):
        raise DiagramError(f"choose_saved: expected a Diagram, got {type(diagram).__name__}")
    g = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    d = diagram.with_dtype(dtype) if dtype is not None else diagram
    if not d.is_bound:
        unbound = [n for n, a in d.axes.items() if not a.is_bound]
        raise DiagramError(f"choose_saved: diagram {d.name!r} has unbound axes {unbound}; bind them "
                           "(for example diagram.bind(q=4096)) to compare times")
    ch = _Chooser(d, g, wrt)
    cands = saveable(d, wrt)
    by_of: dict[str, dict[str, Saved]] = {}
    for s in cands:
        by_of.setdefault(s.of, {})[s.kind] = s
    choices: list[SaveChoice] = []
    for s in cands:
        v = d.value(s.of)
        if s.kind == "value":
            if isinstance(v.op, Softmax):
                choices.extend(_choose_softmax(ch, v, s, by_of[s.of].get("lse")))
            else:
                choices.append(_choose_value(ch, v, s))
        elif s.kind in ("rstd", "mean"):
            choices.append(_choose_stat(ch, v, s))
    order = {s.name: i for i, s in enumerate(cands)}
    choices.sort(key=lambda c: order[c.name])
    picked = frozenset(c.name for c in choices if c.saved)
    beside = save_set(d, picked, wrt) - picked
    choices = [dataclasses.replace(c, saved=True, reason="computed from a saved norm statistic and read beside "
                                   "arrays saved from it: recomputing it would give the backward a second "
                                   "version") if c.name in beside else c for c in choices]
    return SavePlan(d.name, g.name, next(iter(d.dtypes)), tuple(choices))


def save_set(diagram: Diagram, save, wrt=None) -> frozenset[str]:
    """``save`` with what saving it also takes: the arrays the backward would otherwise recompute
    from a saved norm statistic while an array saved beside them was computed from the forward's
    (:func:`napkin.diagrams.grad.recomputed_from_statistics`). :func:`choose_saved` applies it to
    its picks, and napkin.torch to every save set it ranks, so the set priced is the set run.

    >>> from napkin.diagrams import library
    >>> sorted(save_set(library.get("transformer_block"), {"N1_rstd", "Qp", "O"}))
    ['N1', 'N1_rstd', 'O', 'Qp', 'Xn']
    """
    save = frozenset(save)
    return save | frozenset(recomputed_from_statistics(diagram, save, wrt))


def _choose_value(ch: _Chooser, v: Value, s: Saved) -> SaveChoice:
    n = _elements(v)
    save = ch.save_seconds(v, n)
    redo = ch.recompute(v)
    saved = save < redo
    if saved:
        ch.present.add(id(v))
    else:
        ch.recompute(v, mark=True)
    why = ("a forward output: one read" if id(v) in ch.outputs else "a write and a read") if saved else \
        "cheaper to recompute than to write and read"
    return SaveChoice(s.name, s.kind, s.of, ch.nbytes(n), save, redo, saved, why)


def _choose_softmax(ch: _Chooser, v: Value, s: Saved, lse: Saved | None) -> list[SaveChoice]:
    """P saved, or recomputed as exp(S − lse) with lse saved, or recomputed from S in two passes."""
    n = _elements(v)
    rows = n // v.axis(v.op.over).bound_size
    save_p = ch.save_seconds(v, n)
    scores = ch.recompute(v.args[0])
    exp_pass = 2 * n / ch.gpu.cuda_core_rate("fp32") + n / ch.gpu.sfu_rate()
    save_lse = ch.save_seconds(None, rows)
    with_lse = save_lse + scores + exp_pass
    without = 2 * scores + box_seconds(v, ch.gpu)
    best = min(save_p, with_lse, without)
    out = []
    if best == save_p:
        ch.present.add(id(v))
        out.append(SaveChoice(s.name, s.kind, s.of, ch.nbytes(n), save_p, min(with_lse, without), True,
                              "reading P beats recomputing its scores"))
        if lse is not None:
            out.append(SaveChoice(lse.name, "lse", s.of, ch.nbytes(rows), save_lse, _stat_seconds(v, "lse", ch.gpu),
                                  False, "P is saved"))
        return out
    ch.recompute(v.args[0], mark=True)
    ch.present.add(id(v))
    use_lse = best == with_lse and lse is not None
    out.append(SaveChoice(s.name, s.kind, s.of, ch.nbytes(n), save_p, best, False,
                          "recomputed as exp(S − lse): one pass over the scores" if use_lse
                          else "recomputed from its scores, twice (row statistics, then values)"))
    if lse is not None:
        out.append(SaveChoice(lse.name, "lse", s.of, ch.nbytes(rows), save_lse, without - with_lse + save_lse,
                              use_lse, "saves the second pass over the scores" if use_lse
                              else "a second pass over the scores is cheaper"))
    return out


def _choose_stat(ch: _Chooser, v: Value, s: Saved) -> SaveChoice:
    rows = _elements(v) // v.axis(v.op.over).bound_size
    save = ch.save_seconds(None, rows)
    redo = _stat_seconds(v, s.kind, ch.gpu)
    saved = save < redo
    return SaveChoice(s.name, s.kind, s.of, ch.nbytes(rows), save, redo, saved,
                      "one value per row: cheaper to keep than to reduce the row again" if saved
                      else "reducing the row again is cheaper than a write and a read")


def backward(diagram: Diagram, gpu: GPU | str = "h100", dtype: str | None = None, wrt=None
             ) -> tuple[Diagram, SavePlan]:
    """The backward diagram of ``diagram`` with the saves :func:`choose_saved` picks on ``gpu``, and
    that choice.

    >>> from napkin.diagrams import library
    >>> b, plan = backward(library.get("softmax").bind(r=4096, x=4096))
    >>> b.input_names
    ('X', 'dP', 'P')
    """
    plan = choose_saved(diagram, gpu, dtype, wrt)
    d = diagram.with_dtype(dtype) if dtype is not None else diagram
    return grad(d, wrt, plan.save), plan
