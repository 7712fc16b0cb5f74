"""Axes: the wires of a neural circuit diagram.

An axis has a name and a size. The size is a positive integer, or a positive
integer sympy symbol that is bound later (``Diagram.bind``). Two arrays that carry
an axis of the same name carry the same wire, so their sizes must agree.

>>> q, d = axes("q d=128")
>>> q
Axis('q')
>>> d.size
128
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from ..errors import DiagramError

# Names reach CUDA source, SVG and file names: only plain identifiers are allowed.
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is a plain identifier, else raise a DiagramError naming ``what``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise DiagramError(
            f"{what} name {name!r} is not allowed: use a letter followed by letters, digits "
            "or '_' (at most 32 characters)"
        )
    return name


def size_symbol(name: str) -> sympy.Symbol:
    """The positive-integer sympy symbol that stands for an unbound axis size."""
    return sympy.Symbol(name, integer=True, positive=True)


@dataclass(frozen=True)
class Axis:
    """A named wire with a size (an int, or a sympy symbol bound later).

    >>> Axis("x", 4096).bound_size
    4096
    """

    name: str
    size: int | sympy.Symbol = None  # type: ignore[assignment]

    def __post_init__(self):
        check_name(self.name, "axis")
        size = self.size
        if size is None:
            size = size_symbol(self.name)
        elif isinstance(size, bool) or not isinstance(size, (int, sympy.Basic)):
            if hasattr(size, "__index__"):
                size = int(size)
            else:
                raise DiagramError(f"axis {self.name!r}: size {size!r} is not an integer or a symbol")
        if isinstance(size, sympy.Integer):
            size = int(size)
        if isinstance(size, int) and size <= 0:
            raise DiagramError(f"axis {self.name!r} has size {size}; sizes must be positive integers")
        object.__setattr__(self, "size", size)

    @property
    def is_bound(self) -> bool:
        """True when the size is a concrete integer."""
        return isinstance(self.size, int)

    @property
    def bound_size(self) -> int:
        """The integer size; raises a DiagramError naming the axis if it is still symbolic."""
        if not self.is_bound:
            raise DiagramError(
                f"axis {self.name!r} has no size yet; bind it (for example -s {self.name}=128 "
                f"or diagram.bind({self.name}=128))"
            )
        return self.size  # type: ignore[return-value]

    def sized(self, size: int | sympy.Symbol) -> "Axis":
        """The same wire with another size."""
        return Axis(self.name, size)

    def __repr__(self) -> str:
        return f"Axis({self.name!r})" if not self.is_bound else f"Axis({self.name!r}, {self.size})"

    def __str__(self) -> str:
        return f"{self.name}[{self.size}]"


def axes(spec: str) -> tuple[Axis, ...]:
    """Make several axes from a spec like ``"q x d=128"`` (``name`` or ``name=size``).

    >>> [str(a) for a in axes("a b=64")]
    ['a[a]', 'b[64]']
    """
    out = []
    for token in spec.split():
        name, _, size = token.partition("=")
        if size:
            try:
                value = int(size)
            except ValueError:
                raise DiagramError(f"axis spec {token!r}: size {size!r} is not an integer") from None
            out.append(Axis(name, value))
        else:
            out.append(Axis(name))
    return tuple(out)


def as_axis_name(a: "Axis | str") -> str:
    """Accept an Axis or its name; return the name."""
    if isinstance(a, Axis):
        return a.name
    if isinstance(a, str):
        return check_name(a, "axis")
    raise DiagramError(f"expected an axis or an axis name, got {a!r}")


def as_axis_names(spec) -> tuple[str, ...]:
    """Accept one axis, a name, or a sequence of them; return a tuple of names."""
    if isinstance(spec, (Axis, str)):
        return (as_axis_name(spec),)
    return tuple(as_axis_name(a) for a in spec)
