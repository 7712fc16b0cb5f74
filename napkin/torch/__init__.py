"""napkin's kernels as PyTorch operators: ``torch.library`` ops, an ``nn.Module``, CUDA graphs.

- :func:`op` (:mod:`napkin.torch.ops`): a diagram compiled and registered as
  ``torch.ops.napkin.<name>``, with a fake implementation (``torch.compile(fullgraph=True)``
  traces it without a graph break), a CPU kernel (the PyTorch reference) and gradients from the
  reference; dynamic axes serve a whole size range with one plan;
- :class:`Module` (:mod:`napkin.torch.module`): an ``nn.Module`` holding a diagram's weights as
  parameters;
- :func:`cuda_graph` (:mod:`napkin.torch.graphs`): a fixed-shape call site captured in a CUDA
  graph.

This package imports torch (``import napkin`` does not import it).

>>> import torch
>>> import napkin.torch as nt
>>> sm = nt.op("softmax", sizes={"x": 128}, dynamic={"r": (1, 4096)}, dtype="fp32", gpu="h100")
>>> f = torch.compile(lambda x: sm(x * 2), fullgraph=True, backend="eager")
>>> torch.allclose(f(torch.ones(3, 128)).sum(-1), torch.ones(3))
True
"""

from __future__ import annotations

from .graphs import CUDAGraphCall, cuda_graph
from .module import Module
from .ops import NapkinOp, op, registered

__all__ = ["op", "NapkinOp", "Module", "cuda_graph", "CUDAGraphCall", "registered"]
