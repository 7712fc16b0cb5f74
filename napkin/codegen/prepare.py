"""A diagram ready to plan: looked up by name, sizes bound, dtype applied, checked.

>>> prepare("softmax", sizes={"r": 8, "x": 1000}, dtype="fp16").sizes
{'r': 8, 'x': 1000}
"""

from __future__ import annotations

from typing import Mapping

from ..diagrams.diagram import Diagram
from ..errors import CodegenError, DiagramError

__all__ = ["prepare", "unbound_axes"]


def unbound_axes(diagram: Diagram) -> list[str]:
    return [n for n, a in diagram.axes.items() if not a.is_bound]


def prepare(diagram, *, sizes: Mapping[str, int] | None = None, dtype: str | None = None) -> Diagram:
    """A bound diagram in ``dtype``: a library name is looked up, ``sizes`` bound (axes whose size
    follows another axis, like ``x = q`` after a rename, are left to follow it)."""
    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    if not isinstance(diagram, Diagram):
        raise CodegenError(f"expected a Diagram or a library name, got {type(diagram).__name__}")
    if sizes is not None and not isinstance(sizes, Mapping):
        raise DiagramError(f"sizes must be a mapping of axis names to sizes, got {type(sizes).__name__}")
    if sizes:
        free = {}
        for n, s in dict(sizes).items():
            a = diagram.axes.get(n)
            if a is None:
                raise DiagramError(f"diagram {diagram.name!r} has no axis {n!r}; its axes are "
                                   f"{list(diagram.axes)}")
            follows = not a.is_bound and getattr(a.size, "name", n) != n
            if not follows:
                free[n] = s
        diagram = diagram.bind(free)
    if dtype is not None:
        diagram = diagram.with_dtype(dtype)
    passthrough = [n for n, v in zip(diagram.output_names, diagram.outputs) if v.is_input]
    if passthrough:
        raise CodegenError(f"diagram {diagram.name!r}: output(s) {', '.join(passthrough)} are inputs passed "
                           "through; generated code computes every output (drop them or apply a box)")
    missing = unbound_axes(diagram)
    if missing:
        raise CodegenError(f"diagram {diagram.name!r}: axes {', '.join(missing)} have no size; give them "
                           f"(sizes={{{', '.join(repr(m) + ': ...' for m in missing)}}})")
    return diagram
