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

# Names reach CUDA source, SVG and file names: only plain ASCII identifiers are allowed. The
# pattern is anchored with \A and \Z (``$`` would also match before a trailing newline) and is
# only ever used through :func:`is_name`, which matches it against the whole string.
NAME_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]{0,31}\Z")

#: The largest axis size: index arithmetic (an index plus a mask offset of at most 2^62, index
#: differences, element offsets) stays inside signed 64-bit integers, and sizes are exact as floats.
MAX_AXIS_SIZE = 2 ** 48


def is_name(name) -> bool:
    """Whether ``name`` is a plain identifier: an ASCII letter, then at most 31 ASCII letters,
    digits or ``_``, and nothing else (no trailing newline, no unicode letters).

    >>> is_name("q"), is_name("q" + chr(10)), is_name("é"), is_name("a" * 33)
    (True, False, False, False)
    """
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def shown(value, limit: int = 60) -> str:
    """``value`` for an error message: its repr on one line (control characters escaped) and at
    most ``limit`` characters; a huge integer by its number of digits.

    >>> shown("q" + chr(10)), shown(10 ** 400)
    ("'q\\\\n'", 'a 401-digit number')
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        return f"a {len(str(abs(value)))}-digit number"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ still gets a message
        text = f"<{type(value).__name__}>"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is a plain identifier (:func:`is_name`), else raise a DiagramError
    naming ``what``. This is the one name check of the package.

    >>> check_name("S_masked", "array")
    'S_masked'
    """
    if not is_name(name):
        raise DiagramError(
            f"{what} name {shown(name)} is not allowed: use an ASCII letter followed by at most 31 ASCII "
            "letters, digits or '_'"
        )
    return name


def check_size(name: str, size):
    """The size of axis ``name`` as an ``int`` in [1, MAX_AXIS_SIZE] or a sympy symbol (``None``:
    the axis's own size symbol); anything else (a bool, a float, a string, a sympy expression that
    is not a symbol, zero, a negative or a huge number) raises a DiagramError naming the axis.

    >>> check_size("q", 128), check_size("q", None)
    (128, q)
    """
    if size is None:
        return size_symbol(name)
    if isinstance(size, sympy.Basic):
        if isinstance(size, sympy.Integer):
            size = int(size)
        elif not isinstance(size, sympy.Symbol):
            raise DiagramError(f"axis {name!r}: size {shown(size)} is not an integer or a size symbol")
        else:
            check_name(size.name, f"axis {name!r}: size symbol")
            return size
    elif isinstance(size, bool) or not isinstance(size, int):
        if isinstance(size, bool) or not hasattr(size, "__index__"):
            raise DiagramError(f"axis {name!r}: size {shown(size)} is not an integer or a symbol")
        try:
            size = int(size.__index__())
        except Exception:  # noqa: BLE001 - a broken __index__ is the caller's mistake
            raise DiagramError(f"axis {name!r}: size {shown(size)} is not an integer or a symbol") from None
    if size <= 0:
        raise DiagramError(f"axis {name!r} has size {size}; sizes must be positive integers")
    if size > MAX_AXIS_SIZE:
        raise DiagramError(f"axis {name!r} has size {shown(size)}, more than the largest axis size 2^48 "
                           f"({MAX_AXIS_SIZE})")
    return size


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
        object.__setattr__(self, "size", check_size(self.name, self.size))

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
    if not isinstance(spec, str):
        raise DiagramError(f"axes: expected a spec string like \"q x d=128\", got {shown(spec)}")
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
    raise DiagramError(f"expected an axis or an axis name, got {shown(a)}")


def as_axis_names(spec) -> tuple[str, ...]:
    """Accept one axis, a name, or a sequence of them; return a tuple of names."""
    if isinstance(spec, (Axis, str)):
        return (as_axis_name(spec),)
    try:
        items = tuple(spec)
    except TypeError:
        raise DiagramError(f"expected an axis, an axis name or a list of them, got {shown(spec)}") from None
    return tuple(as_axis_name(a) for a in items)
