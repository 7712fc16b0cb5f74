"""CUDA-graph capture of napkin operators (or any function of CUDA tensors) for a fixed-shape
call site.

A small kernel costs less on the GPU than launching it costs on the host; a CUDA graph records
the launches once and replays them with one call. :class:`CUDAGraphCall` captures ``fn`` on
static copies of example inputs: calling it copies the new inputs into those static tensors
(skipped for an input that already is the static tensor) and replays the graph. The outputs are
the graph's own tensors, rewritten by every replay: ``.clone()`` what must outlive the next call.

>>> import torch                                                      # doctest: +SKIP
>>> from napkin.torch import op, cuda_graph                           # doctest: +SKIP
>>> mm = op("matmul", sizes={"a": 64, "b": 64, "c": 64})              # doctest: +SKIP
>>> A, B = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in "AB")  # doctest: +SKIP
>>> g = cuda_graph(mm, A, B)                                          # doctest: +SKIP
>>> C = g(A, B)                    # one replay: no host work per kernel  # doctest: +SKIP

The capture follows PyTorch's rules (``torch.cuda.graph``): ``fn`` runs ``warmup`` times on a
side stream first (kernels compiled, launches prepared, tensor maps encoded, the allocator
warmed), then once under capture; kernels go to the capturing stream, which is PyTorch's current
stream there, as napkin launches on the current stream. Inside ``torch.compile``,
``mode="reduce-overhead"`` captures napkin operators the same way on its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import LaunchError

__all__ = ["CUDAGraphCall", "cuda_graph"]


class CUDAGraphCall:
    """``fn`` captured in a CUDA graph for inputs of the examples' shapes, dtypes and device.

    Attributes: ``graph`` (the ``torch.cuda.CUDAGraph``), ``inputs`` (the static input tensors:
    writing into them and calling :meth:`replay` skips the copies), ``outputs`` (what ``fn``
    returned during capture).
    """

    def __init__(self, fn: Callable, *example, warmup: int = 2, pool=None):
        if not example:
            raise LaunchError("cuda_graph: give example inputs (their shapes and dtypes are captured)")
        for i, t in enumerate(example):
            if not isinstance(t, torch.Tensor) or not t.is_cuda:
                raise LaunchError(f"cuda_graph: example input {i} is not a CUDA tensor "
                                  f"({type(t).__name__ if not isinstance(t, torch.Tensor) else t.device})")
        self.fn = fn
        self.inputs = tuple(t.detach().clone() for t in example)
        side = torch.cuda.Stream(device=self.inputs[0].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(max(1, int(warmup))):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn(*self.inputs)
        self._specs = tuple((t.shape, t.dtype, t.device) for t in self.inputs)

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(t.shape)) for t in self.inputs)
        return f"CUDAGraphCall({getattr(self.fn, '__name__', self.fn)!r}, inputs {shapes})"

    def __call__(self, *tensors):
        """Copy ``tensors`` into the static inputs (each must match its example's shape, dtype and
        device), replay, and return the static outputs."""
        if len(tensors) != len(self.inputs):
            raise LaunchError(f"this CUDA graph takes {len(self.inputs)} input(s), got {len(tensors)}")
        for i, (t, s, (shape, dtype, device)) in enumerate(zip(tensors, self.inputs, self._specs)):
            if t is s:
                continue
            if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != dtype or t.device != device:
                got = (f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                raise LaunchError(f"input {i}: the CUDA graph was captured for {tuple(shape)} {dtype} on {device}, "
                                  f"got {got}; capture another graph for other shapes")
            s.copy_(t)
        self.graph.replay()
        return self.outputs

    def replay(self):
        """Replay on whatever the static inputs hold now; returns the static outputs."""
        self.graph.replay()
        return self.outputs


def cuda_graph(fn: Callable, *example, warmup: int = 2, pool=None) -> CUDAGraphCall:
    """``fn`` (a napkin operator, module or any function of CUDA tensors) captured in a CUDA graph
    for inputs like ``example``: see :class:`CUDAGraphCall`."""
    return CUDAGraphCall(fn, *example, warmup=warmup, pool=pool)
