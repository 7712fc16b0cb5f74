"""An ``nn.Module`` around a napkin operator that holds the diagram's weights as parameters.

>>> import torch
>>> from napkin.torch import Module
>>> ln = Module("layernorm", weights=("gamma", "beta"), sizes={"x": 64}, dynamic={"r": (1, 512)},
...             dtype="fp32", gpu="h100")
>>> [n for n, _ in ln.named_parameters()]
['gamma', 'beta']
>>> ln(torch.randn(10, 64)).shape            # on CPU: the diagram's PyTorch reference
torch.Size([10, 64])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from ..errors import CodegenError, LaunchError
from .ops import NapkinOp, op

__all__ = ["Module"]


class Module(torch.nn.Module):
    """A napkin operator with some of its inputs held as ``nn.Parameter`` s.

    ``weights``: input names (one name as a string), or a mapping of input names to initial
    tensors (None for an input initialised here). An input named here but given no tensor is
    drawn from a normal distribution with standard deviation 1/sqrt(its first axis' size) (a
    fan-in scale for a ``[in, out]`` weight; load a state dict for trained values). Weights must not carry a dynamic
    axis. ``forward`` takes the other inputs, in the diagram's order, and returns the outputs.
    The remaining keyword arguments are :func:`napkin.torch.op`'s; ``requires_grad`` is the
    parameters' (gradients come from the reference: see :mod:`napkin.torch.ops`).

    Moving the module (``.cuda()``, ``.to(device)``) moves the weights; their dtype is the
    diagram's, and the operator refuses another.
    """

    def __init__(self, diagram, weights: Sequence[str] | Mapping[str, torch.Tensor | None] = (), *,
                 requires_grad: bool = True, **options):
        super().__init__()
        self.op: NapkinOp = diagram if isinstance(diagram, NapkinOp) else op(diagram, **options)
        names = self.op.input_names
        if isinstance(weights, str):  # one name, not its letters
            weights = (weights,)
        given = dict(weights) if isinstance(weights, Mapping) else {w: None for w in weights}
        unknown = [w for w in given if w not in names]
        if unknown:
            raise CodegenError(f"Module: {self.op.diagram.name} has no input {unknown[0]!r}; its inputs are "
                               f"{', '.join(names)}")
        self.weight_names = tuple(n for n in names if n in given)
        self.activation_names = tuple(n for n in names if n not in given)
        for i, n in enumerate(names):
            if n not in given:
                continue
            axes = self.op._in_axes[i]
            dyn = [a for a in axes if isinstance(a, str)]
            if dyn:
                raise CodegenError(f"Module: weight {n} carries the dynamic axis {dyn[0]}; a parameter has fixed sizes")
            t = given[n]
            dt = self.op._in_dtypes[i]
            if t is None:
                t = torch.empty(axes, dtype=torch.float32).normal_(0.0, 1.0 / math.sqrt(axes[0] if axes else 1))
                t = t.to(dt)
            elif not isinstance(t, torch.Tensor):
                raise CodegenError(f"Module: weight {n} must be a tensor, got {type(t).__name__}")
            elif tuple(t.shape) != tuple(axes):
                raise CodegenError(f"Module: weight {n} has shape {tuple(t.shape)}, expected {tuple(axes)}")
            self.register_parameter(n, torch.nn.Parameter(t.detach().to(dt).clone(), requires_grad=requires_grad))

    def extra_repr(self) -> str:
        dyn = f", dynamic={self.op.dynamic}" if self.op.dynamic else ""
        return (f"{self.op.diagram.name}: inputs ({', '.join(self.activation_names)}), weights "
                f"({', '.join(self.weight_names)}){dyn}")

    def forward(self, *activations):
        if len(activations) != len(self.activation_names):
            raise LaunchError(f"{self.op.diagram.name}: forward takes {len(self.activation_names)} input(s) "
                              f"({', '.join(self.activation_names)}), got {len(activations)}")
        given = dict(zip(self.activation_names, activations))
        return self.op(*[given[n] if n in given else getattr(self, n) for n in self.op.input_names])
