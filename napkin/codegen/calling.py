"""How a compiled diagram, a dynamic one and a torch operator take their inputs: by position, in
the diagram's input order, or by name, or both (positions first). One function, so the three say
the same thing about the same mistake.

>>> bind_inputs("matmul", ("A", "B"), (1,), {"B": 2})
{'A': 1, 'B': 2}
>>> bind_inputs("matmul", ("A", "B"), (1,), {})
Traceback (most recent call last):
...
napkin.errors.LaunchError: matmul: missing input(s) B (inputs in order: A, B)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import LaunchError

__all__ = ["bind_inputs"]


def bind_inputs(owner: str, names: Sequence[str], tensors: Sequence, by_name: Mapping[str, object]) -> dict:
    """``{input name: value}`` from positional ``tensors`` (in ``names`` order) and ``by_name``; a
    LaunchError naming ``owner`` for too many positions, an unknown name, an input given twice or
    one missing."""
    if len(tensors) > len(names):
        raise LaunchError(f"{owner} takes {len(names)} input(s) ({', '.join(names)}), got {len(tensors)} by position")
    got = dict(zip(names, tensors))
    for n, t in by_name.items():
        if n not in names:
            raise LaunchError(f"{owner} has no input {n!r}; its inputs are {', '.join(names)}")
        if n in got:
            raise LaunchError(f"input {n} given twice (by position and by name)")
        got[n] = t
    missing = [n for n in names if n not in got]
    if missing:
        raise LaunchError(f"{owner}: missing input(s) {', '.join(missing)} (inputs in order: {', '.join(names)})")
    return got
