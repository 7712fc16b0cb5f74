"""Diagrams: a named, immutable graph of boxes from input arrays to output arrays.

A :class:`Diagram` is built from the output values of builder calls; its inputs
are the arrays those outputs depend on. It is a plain value: hashable, printable,
renderable, and it can be re-sized (``bind``), re-typed (``with_dtype``), woven over
a new axis (``weave``), composed (``d1 >> d2``) and applied inside another diagram
like a function (``attention(Q, K, V)``).

>>> from napkin.diagrams import axes, array, contract, Diagram
>>> a, b, c = axes("a b c")
>>> C = contract(array("A", a, b), array("B", b, c), over=b, name="C")
>>> mm = Diagram("matmul", C)
>>> [v.name for v in mm.inputs], mm.output_names
(['A', 'B'], ('C',))
>>> mm.bind(a=64, b=32, c=16).sizes
{'a': 64, 'b': 32, 'c': 16}
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterable, Mapping

import sympy

from ..errors import DiagramError
from .axes import Axis, as_axis_name, check_name, check_size, shown
from .ops import InputOp, Value, apply, dtype_name


def _as_tuple(values, what: str) -> tuple[Value, ...]:
    if isinstance(values, Value):
        return (values,)
    if not isinstance(values, (tuple, list)):
        raise DiagramError(f"diagram {what} must be a napkin array or a tuple of them, got "
                           f"{type(values).__name__}")
    out = tuple(values)
    for v in out:
        if not isinstance(v, Value):
            raise DiagramError(f"diagram {what} must be napkin arrays, got {type(v).__name__}")
    return out


class Diagram:
    """A neural circuit diagram: inputs → boxes → outputs.

    ``outputs`` is a value or a tuple of values (a tuple is several wires side by
    side). ``inputs`` fixes the order of the inputs; by default it is the order in
    which they are first reached from the outputs.
    """

    __slots__ = ("name", "outputs", "inputs", "description", "_hash", "__dict__")

    def __init__(self, name: str, outputs, inputs: Iterable[Value] | None = None, description: str = ""):
        check_name(name, "diagram")
        if not isinstance(description, str):
            raise DiagramError(f"diagram {name!r}: description must be a string, got {type(description).__name__}")
        outs = _as_tuple(outputs, "outputs")
        if not outs:
            raise DiagramError(f"diagram {name!r} has no outputs")
        found = _collect_inputs(outs)
        if inputs is None:
            ins = tuple(found)
        else:
            ins = _as_tuple(inputs, "inputs")
            missing = [v.label() for v in found if v not in ins]
            if missing:
                raise DiagramError(f"diagram {name!r}: outputs depend on inputs not listed: {missing}")
            # A listed input equal to one the outputs read (array("X", a) written twice) stands for
            # that very value: the boxes are walked by identity (names, _replay).
            ids = {id(f) for f in found}
            ins = tuple(v if id(v) in ids else next((f for f in found if f == v), v) for v in ins)
        for v in ins:
            if not v.is_input:
                raise DiagramError(f"diagram {name!r}: {v.label()} is computed, not an input array")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "outputs", outs)
        object.__setattr__(self, "inputs", ins)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "_hash", hash((name, outs, ins)))
        self._check_names()
        self._check_axes()

    def __setattr__(self, key, value):
        # cached_property stores into __dict__ directly, so refusing every assignment is safe.
        raise AttributeError("diagrams are immutable")

    # ------------------------------------------------------------------ identity
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (
            isinstance(other, Diagram) and self._hash == other._hash and self.name == other.name
            and self.outputs == other.outputs and self.inputs == other.inputs
        )

    def __repr__(self) -> str:
        ins = ", ".join(v.label() for v in self.inputs)
        outs = ", ".join(f"{n}[{','.join(v.axis_names)}]" for n, v in zip(self.output_names, self.outputs))
        return f"Diagram({self.name!r}: {ins} → {outs}; {len(self.nodes)} box{'es' if len(self.nodes) != 1 else ''})"

    # ------------------------------------------------------------------ structure
    @cached_property
    def nodes(self) -> tuple[Value, ...]:
        """Every computed value (box output) in a topological order, inputs excluded."""
        order: list[Value] = []
        seen: set[int] = set()
        stack = [(v, False) for v in reversed(self.outputs)]
        while stack:
            v, expanded = stack.pop()
            if id(v) in seen:
                continue
            if expanded or v.is_input:
                seen.add(id(v))
                if not v.is_input:
                    order.append(v)
                continue
            stack.append((v, True))
            for a in reversed(v.args):
                if id(a) not in seen:
                    stack.append((a, False))
        return tuple(order)

    @cached_property
    def names(self) -> dict[int, str]:
        """A unique display name for every value (``id(value)`` → name)."""
        out: dict[int, str] = {}
        used: set[str] = set()
        for v in self.inputs:
            out[id(v)] = v.name
            used.add(v.name)
        for i, v in enumerate(self.outputs):
            if id(v) not in out and v.name and v.name not in used:
                out[id(v)] = v.name
                used.add(v.name)
        counters: dict[str, int] = {}
        for v in self.nodes:
            if id(v) in out:
                continue
            base = v.name if v.name and v.name not in used else _default_name(v)
            name = base
            while name in used:
                counters[base] = counters.get(base, 1) + 1
                name = f"{base}{counters[base]}"
            out[id(v)] = name
            used.add(name)
        return out

    def name_of(self, v: Value) -> str:
        """The display name of a value of this diagram."""
        try:
            return self.names[id(v)]
        except KeyError:
            raise DiagramError(f"{v.label()} is not part of diagram {self.name!r}") from None

    @property
    def output_names(self) -> tuple[str, ...]:
        """Names of the outputs, in order."""
        return tuple(self.name_of(v) for v in self.outputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Names of the inputs, in order."""
        return tuple(v.name for v in self.inputs)

    def value(self, name: str) -> Value:
        """The input, output or intermediate called ``name``."""
        for v in (*self.inputs, *self.nodes):
            if self.names[id(v)] == name:
                return v
        raise DiagramError(
            f"diagram {self.name!r} has no array {shown(name)}; it has {sorted(self.names.values())}"
        )

    @cached_property
    def consumers(self) -> dict[int, tuple[Value, ...]]:
        """For each value id, the boxes that read it."""
        out: dict[int, list[Value]] = {}
        for v in self.nodes:
            for a in v.args:
                lst = out.setdefault(id(a), [])
                if v not in lst:
                    lst.append(v)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def axes(self) -> dict[str, Axis]:
        """Every axis of the diagram by name, in order of first appearance."""
        out: dict[str, Axis] = {}
        for v in (*self.inputs, *self.nodes):
            for a in v.axes:
                out.setdefault(a.name, a)
        return out

    @property
    def sizes(self) -> dict[str, int | sympy.Symbol]:
        """Axis name → size (an int, or a sympy symbol while unbound)."""
        return {n: a.size for n, a in self.axes.items()}

    @property
    def is_bound(self) -> bool:
        """True when every axis has an integer size."""
        return all(a.is_bound for a in self.axes.values())

    @property
    def dtypes(self) -> set[str]:
        """The dtypes of the inputs."""
        return {v.dtype for v in self.inputs}

    def _check_names(self) -> None:
        seen: dict[str, Value] = {}
        for v in self.inputs:
            if v.name in seen:
                if seen[v.name] == v:  # array("S", i, j) written twice: two values the boxes tell apart
                    raise DiagramError(f"diagram {self.name!r}: input {v.label()} is built twice (two array("
                                       f"{v.name!r}, ...) calls); build it once and pass that value to every box")
                raise DiagramError(f"diagram {self.name!r}: two different inputs are both called {v.name!r}")
            seen[v.name] = v
        # an output's name is what a caller reads it by: never changed without a word
        named: dict[str, Value] = {}
        for v in self.outputs:
            if not v.name or any(v is x for x in self.inputs):
                continue
            if v.name in seen:
                raise DiagramError(f"diagram {self.name!r}: output {v.label()} is named {v.name!r}, the name of an "
                                   "input; give the output a name of its own")
            if v.name in named and named[v.name] is not v:
                raise DiagramError(f"diagram {self.name!r}: two different outputs are both named {v.name!r}")
            named[v.name] = v

    def _check_axes(self) -> None:
        sizes: dict[str, tuple[object, str]] = {}
        for v in (*self.inputs, *self.nodes):
            for a in v.axes:
                if a.name in sizes and sizes[a.name][0] != a.size:
                    raise DiagramError(
                        f"diagram {self.name!r}: axis {a.name!r} has size {sizes[a.name][0]} in "
                        f"{sizes[a.name][1]} but {a.size} in {v.label()}"
                    )
                sizes.setdefault(a.name, (a.size, v.label()))

    # ------------------------------------------------------------------ rebuilding
    def _replay(self, new_inputs: Mapping[int, Value]) -> tuple[Value, ...]:
        """Rebuild every box on new input values (ops refer to axes by name, so they carry over)."""
        memo: dict[int, Value] = dict(new_inputs)
        for v in self.nodes:
            memo[id(v)] = apply(v.op, [memo[id(a)] for a in v.args], v.name)
        return tuple(memo[id(v)] for v in self.outputs)

    def _rebuilt(self, new_inputs: dict[int, Value], name: str | None = None) -> "Diagram":
        outs = self._replay(new_inputs)
        outs = tuple(o if o.name or o.is_input else o.named(n) for o, n in zip(outs, self.output_names))
        ins = [new_inputs[id(v)] for v in self.inputs]
        return Diagram(name or self.name, outs, ins, self.description)

    def bind(self, sizes: Mapping[str, int] | None = None, /, **more: int) -> "Diagram":
        """Give axes integer sizes; unknown axis names raise a DiagramError listing the known ones.

        >>> from napkin.diagrams import library
        >>> library.get("softmax").bind(r=8, x=1000).sizes
        {'r': 8, 'x': 1000}
        """
        if sizes is not None and not isinstance(sizes, Mapping):
            raise DiagramError(f"bind: sizes must be a mapping of axis names to sizes, got "
                               f"{type(sizes).__name__}")
        all_sizes = {**(sizes or {}), **more}
        bad_names = [n for n in all_sizes if not isinstance(n, str)]
        if bad_names:
            raise DiagramError(f"bind: axis names must be strings, got {shown(bad_names[0])}")
        unknown = [n for n in all_sizes if n not in self.axes]
        if unknown:
            raise DiagramError(
                f"diagram {self.name!r} has no axis {', '.join(map(repr, unknown))}; "
                f"its axes are {list(self.axes)}"
            )
        for n, size in all_sizes.items():
            if size is None:
                raise DiagramError(f"bind: axis {n!r}: size None is not an integer")
        all_sizes = {n: check_size(n, size) for n, size in all_sizes.items()}
        input_axes = {a.name for v in self.inputs for a in v.axes}
        derived = {n: all_sizes.pop(n) for n in list(all_sizes) if n not in input_axes}
        new_axes = {n: Axis(n, all_sizes[n]) for n in all_sizes}
        out = self._rebuilt({
            id(v): Value(InputOp(), (), tuple(new_axes.get(a.name, a) for a in v.axes), v.dtype, v.name)
            for v in self.inputs
        })
        for n, size in derived.items():
            # A renamed axis takes its size from the input axis it relabels; a different size is an error.
            if out.axes[n].size != size:
                raise DiagramError(
                    f"diagram {self.name!r}: axis {n!r} is a relabelling (rename) of an input axis and has "
                    f"size {out.axes[n].size}, not {size}; bind the input axis instead "
                    f"(input axes: {sorted(input_axes)})"
                )
        return out

    def with_dtype(self, dtype: str) -> "Diagram":
        """The same diagram with every input (and so every array) in ``dtype``."""
        dt = dtype_name(dtype, f"diagram {self.name!r}: with_dtype")
        return self._rebuilt({id(v): Value(InputOp(), (), v.axes, dt, v.name) for v in self.inputs})

    def weave(self, axis: Axis, inputs: Iterable[str] | None = None, name: str | None = None) -> "Diagram":
        """Map the whole diagram over a new ``axis`` carried by ``inputs`` (default: all).

        Inputs left out are broadcast along the axis. Multi-head attention is
        attention woven over heads; GQA weaves the query over one more axis.

        >>> from napkin.diagrams import library, Axis
        >>> library.get("attention").weave(Axis("h")).inputs[0].label()
        'Q[h,q,d]'
        """
        if not isinstance(axis, Axis):
            raise DiagramError(f"weave: expected an Axis, got {shown(axis)}")
        if axis.name in self.axes:
            raise DiagramError(f"weave: diagram {self.name!r} already has an axis {axis.name!r}")
        if inputs is not None and (isinstance(inputs, str) or not isinstance(inputs, (tuple, list, set, frozenset))
                                   or not all(isinstance(n, str) for n in inputs)):
            raise DiagramError(f"weave: inputs must be a list of input names, got {shown(inputs)}")
        chosen = set(self.input_names if inputs is None else inputs)
        unknown = chosen - set(self.input_names)
        if unknown:
            raise DiagramError(f"weave: diagram {self.name!r} has no input {sorted(unknown)}; "
                               f"inputs are {list(self.input_names)}")
        return self._rebuilt({
            id(v): Value(InputOp(), (), ((axis,) + v.axes) if v.name in chosen else v.axes, v.dtype, v.name)
            for v in self.inputs
        }, name=name or f"{self.name}_{axis.name}")

    def renamed(self, name: str) -> "Diagram":
        """The same diagram under another name."""
        return Diagram(name, self.outputs, self.inputs, self.description)

    def __call__(self, *args: Value) -> Value | tuple[Value, ...]:
        """Use this diagram as one step of another: inputs by position, outputs returned.

        Arguments may carry more axes than the inputs; the diagram is then woven over them.
        """
        if len(args) != len(self.inputs):
            raise DiagramError(f"diagram {self.name!r} takes {len(self.inputs)} inputs "
                               f"({', '.join(self.input_names)}), got {len(args)}")
        for formal, actual in zip(self.inputs, args):
            if not isinstance(actual, Value):
                raise DiagramError(f"diagram {self.name!r}: input {formal.name} must be a napkin array")
            missing = [n for n in formal.axis_names if n not in actual.axis_names]
            if missing:
                raise DiagramError(f"diagram {self.name!r}: argument {actual.label()} for input "
                                   f"{formal.label()} lacks axes {missing}")
            for n in formal.axis_names:
                want, got = formal.axis(n), actual.axis(n)
                if want.is_bound and got.is_bound and want.size != got.size:
                    raise DiagramError(f"diagram {self.name!r}: argument {actual.label()} for input "
                                       f"{formal.label()} has axis {n!r} of size {got.size}, where the "
                                       f"diagram's is bound to {want.size}")
        outs = self._replay({id(f): a for f, a in zip(self.inputs, args)})
        return outs[0] if len(outs) == 1 else outs

    def __rshift__(self, other: "Diagram") -> "Diagram":
        """Compose left to right: this diagram's outputs feed ``other``'s inputs by position."""
        if not isinstance(other, Diagram):
            return NotImplemented
        if len(self.outputs) != len(other.inputs):
            raise DiagramError(
                f"compose {self.name} >> {other.name}: {len(self.outputs)} outputs cannot feed "
                f"{len(other.inputs)} inputs"
            )
        outs = other(*self.outputs)
        return Diagram(f"{self.name}_{other.name}", outs, self.inputs)

    # ------------------------------------------------------------------ views
    def summary(self, description: bool = True) -> str:
        """A text summary: inputs, each box with its output, outputs, axes.

        ``description=False`` leaves out the free-text description, so every word comes from
        checked names and box labels (generated CUDA quotes the summary in a comment).
        """
        lines = [f"diagram {self.name}" + (f" — {self.description}" if description and self.description else "")]
        lines.append("  axes:    " + ", ".join(f"{n}={s}" for n, s in self.sizes.items()))
        for v in self.inputs:
            lines.append(f"  input    {v.name}[{','.join(v.axis_names)}] {v.dtype}")
        for v in self.nodes:
            args = ", ".join(self.names[id(a)] for a in v.args)
            woven = [n for n in v.axis_names if n not in v.op.own_axes()]
            lines.append(
                f"  box      {self.names[id(v)]}[{','.join(v.axis_names)}] = {v.op.label()}({args})"
                + (f"  woven over {','.join(woven)}" if woven and v.op.kind != "map" else "")
            )
        for n, v in zip(self.output_names, self.outputs):
            lines.append(f"  output   {n}[{','.join(v.axis_names)}] {v.dtype}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_svg_(self) -> str:
        from .render import render_svg

        return render_svg(self)

    def to_svg(self, **options) -> str:
        """The diagram drawn as SVG in the neural-circuit-diagram style."""
        from .render import render_svg

        return render_svg(self, **options)

    def to_dot(self):
        """The diagram as a graphviz.Digraph (a second view; needs the graphviz package)."""
        from .dot import to_dot

        return to_dot(self)

    def reference(self, inputs=None, **kwargs):
        """Run the diagram in PyTorch; see :func:`napkin.diagrams.reference.run_reference`."""
        from .reference import run_reference

        return run_reference(self, inputs, **kwargs)

    def grad(self, wrt=None, save=(), name: str | None = None) -> "Diagram":
        """The backward diagram: inputs, then ``d``+output cotangents, then ``save``d forward arrays →
        ``d``+input gradients for the inputs in ``wrt`` (default: all); see
        :func:`napkin.diagrams.grad.grad` (what ``save`` may name: :func:`~napkin.diagrams.grad.saveable`).

        >>> from napkin.diagrams import library
        >>> library.get("mlp").grad(wrt=["W", "bias"]).output_names
        ('dW', 'dbias')
        """
        from .grad import grad

        return grad(self, wrt, save, name)


def _default_name(v: Value) -> str:
    op = v.op
    if op.kind == "map":
        return op.fn  # type: ignore[attr-defined]
    if op.kind in ("reduce", "norm"):
        return op.how  # type: ignore[attr-defined]
    return op.kind


def _collect_inputs(outputs: tuple[Value, ...]) -> list[Value]:
    found: list[Value] = []
    seen: set[int] = set()
    stack = list(reversed(outputs))
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.is_input:
            found.append(v)
        else:
            stack.extend(reversed(v.args))
    return found


def axis_name(a) -> str:
    """Accept an Axis or a name (re-exported for callers that take either)."""
    return as_axis_name(a)
