"""Pieces every ``napkin`` command shares: options, size parsing, diagram loading, errors, output.

A command in :mod:`napkin.cli` is written as::

    @app.command()
    @handle_errors
    def cost(name: NameArg, size: SizesOpt = None, gpu: GpuOpt = DEFAULT_GPU,
             dtype: DtypeOpt = DEFAULT_DTYPE, json_out: JsonOpt = False):
        diagram = load_bound(name, size, use_defaults=True)
        ...

``handle_errors`` turns every :class:`~napkin.errors.NapkinError` into one red line
``error: ...`` on stderr and exit status 2, so users never see a traceback for a
mistake they made. Nothing here imports torch (``napkin --help`` and ``napkin list``
must stay light); the GPU profile and the dtype are looked up only when a command
asks for them.

>>> parse_sizes(["q=4096", "d=128"])
{'q': 4096, 'd': 128}
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Mapping, Optional, TypeVar

import typer

from .errors import DiagramError, NapkinError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import Console

    from .diagrams.diagram import Diagram
    from .diagrams.library import Entry

#: Exit status for every error a user can cause (also click's status for usage errors).
EXIT_USER_ERROR = 2

DEFAULT_GPU = "h100"
DEFAULT_DTYPE = "bf16"


class UsageError(NapkinError):
    """A command-line value napkin cannot use (a malformed ``-s``, an unknown format)."""


# ----------------------------------------------------------------------------- options
# Reusable option types: a command declares ``size: SizesOpt = None`` and gets ``-s/--size``.

NameArg = Annotated[
    str,
    typer.Argument(
        help="A built-in diagram (see `napkin list`) or a user file as path/file.py:name.",
        show_default=False,
    ),
]

SizesOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--size", "-s",
        metavar="NAME=VALUE",
        help="Bind an axis size, e.g. -s q=4096 (repeatable).",
        show_default=False,
    ),
]

GpuOpt = Annotated[
    str,
    typer.Option("--gpu", metavar="GPU", help="GPU profile: a100, a100-80gb, h100, h200, or a profile .json."),
]

DtypeOpt = Annotated[
    str,
    typer.Option("--dtype", metavar="DTYPE", help="Value type of the inputs: bf16, fp16, fp32, fp8, fp64."),
]

JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print machine-readable JSON instead of tables."),
]

_SIZE_RE = re.compile(r"^\s*([^=\s]+)\s*=\s*(\S+)\s*$")


# ----------------------------------------------------------------------------- sizes

def parse_size(text: str) -> tuple[str, int]:
    """One ``name=value`` binding; the value is a positive integer (``4096`` or ``4_096``).

    >>> parse_size("x=4096"), parse_size("d = 128")
    (('x', 4096), ('d', 128))
    """
    m = _SIZE_RE.match(text or "")
    if not m:
        raise UsageError(f"-s {text!r}: expected NAME=VALUE, for example -s q=4096")
    name, raw = m.group(1), m.group(2)
    from .diagrams.axes import NAME_RE

    if not NAME_RE.match(name):
        raise UsageError(f"-s {text!r}: {name!r} is not an axis name (a letter followed by letters, "
                         "digits or '_')")
    if not re.fullmatch(r"[+-]?\d+(_\d+)*", raw):
        raise UsageError(f"-s {text!r}: size {raw!r} of axis {name!r} is not an integer")
    value = int(raw)
    if value <= 0:
        raise UsageError(f"-s {text!r}: axis {name!r} needs a positive size, got {value}")
    return name, value


def parse_sizes(items: Iterable[str] | None) -> dict[str, int]:
    """``-s`` values as a dict (``-s q=1,x=2`` also works); an axis given twice differently is an error.

    >>> parse_sizes(["q=1,x=2", "d=3"])
    {'q': 1, 'x': 2, 'd': 3}
    """
    out: dict[str, int] = {}
    for item in items or ():
        for part in str(item).split(","):
            name, value = parse_size(part)
            if name in out and out[name] != value:
                raise UsageError(f"-s: axis {name!r} is given twice, as {out[name]} and {value}")
            out[name] = value
    return out


def _defaults_and_axes(entry_or_diagram) -> tuple[dict[str, int], "Diagram"]:
    from .diagrams import library
    from .diagrams.diagram import Diagram
    from .diagrams.library import Entry

    if isinstance(entry_or_diagram, str):
        from .diagrams import load_diagram

        spec = entry_or_diagram
        entry_or_diagram = library.entry(spec) if spec in library.names() else load_diagram(spec)
    if isinstance(entry_or_diagram, Entry):
        return dict(entry_or_diagram.default_sizes), library.get(entry_or_diagram.name)
    if isinstance(entry_or_diagram, Diagram):
        bound = {n: s for n, s in entry_or_diagram.sizes.items() if isinstance(s, int)}
        return bound, entry_or_diagram
    raise TypeError(f"resolve_sizes: expected a library entry, a diagram or a name, got {entry_or_diagram!r}")


def resolve_sizes(entry_or_diagram: "Entry | Diagram | str", given: Mapping[str, int] | Iterable[str] | None,
                  use_defaults: bool) -> dict[str, int]:
    """The sizes a command binds: ``given`` (``-s`` values) over the library's defaults.

    ``entry_or_diagram`` is a library :class:`~napkin.diagrams.library.Entry`, a
    :class:`~napkin.diagrams.Diagram` (its already-bound sizes act as defaults) or a
    diagram name. ``given`` is a dict or the raw ``-s`` strings. An axis the diagram
    does not have is an error naming it and listing the diagram's axes. With
    ``use_defaults`` (commands that need numbers: cost, derive, generate, ...) every
    axis must end up with a size, else the error says which ``-s`` to add; without it,
    only ``given`` is returned and unnamed axes stay symbolic.

    >>> from napkin.diagrams import library
    >>> resolve_sizes(library.entry("attention"), {"q": 1024}, use_defaults=True)
    {'q': 1024, 'd': 128, 'x': 4096}
    >>> resolve_sizes(library.entry("attention"), ["d=64"], use_defaults=False)
    {'d': 64}
    """
    defaults, diagram = _defaults_and_axes(entry_or_diagram)
    given = dict(given) if isinstance(given, Mapping) else parse_sizes(given)
    unknown = [n for n in given if n not in diagram.axes]
    if unknown:
        raise DiagramError(
            f"diagram {diagram.name!r} has no axis {', '.join(map(repr, unknown))}; "
            f"its axes are {', '.join(diagram.axes)}"
        )
    if not use_defaults:
        return dict(given)
    merged = {n: s for n, s in defaults.items() if n in diagram.axes}
    merged.update(given)
    bound = diagram.bind(merged)
    missing = [n for n, a in bound.axes.items() if not a.is_bound]
    if missing:
        hint = " ".join(f"-s {n}=VALUE" for n in missing)
        raise DiagramError(f"diagram {diagram.name!r}: axis {', '.join(map(repr, missing))} has no size; "
                           f"give it with {hint}")
    # Report every axis's size in the diagram's own order (derived axes included).
    return {n: int(a.size) for n, a in bound.axes.items()}


# ----------------------------------------------------------------------------- diagrams

def load(spec: str) -> "Diagram":
    """A built-in diagram or ``path/file.py:name`` (every failure is a NapkinError)."""
    from .diagrams import load_diagram

    return load_diagram(spec)


def load_bound(spec: str, size_args: Iterable[str] | Mapping[str, int] | None,
               use_defaults: bool = False) -> "Diagram":
    """Load ``spec`` and bind its sizes (see :func:`resolve_sizes`)."""
    from .diagrams import library

    diagram = load(spec)
    source = library.entry(spec) if spec in library.names() else diagram
    sizes = resolve_sizes(source, size_args, use_defaults)
    return diagram.bind(sizes) if sizes else diagram


def get_gpu(name: str):
    """The hardware profile named by ``--gpu`` (imported lazily)."""
    from .perfmodel.hardware import get_gpu as _get_gpu

    return _get_gpu(name)


def get_dtype(name: str):
    """The :class:`~napkin.dtypes.DType` named by ``--dtype``."""
    from .dtypes import dtype

    return dtype(name)


def format_sizes(sizes: Mapping[str, Any]) -> str:
    """``q=4096 x=4096 d=128`` (symbolic sizes print as their name)."""
    return " ".join(f"{n}={s}" for n, s in sizes.items())


# ----------------------------------------------------------------------------- output

_out_console: "Console | None" = None
_err_console: "Console | None" = None


def console() -> "Console":
    """The rich console for normal output (stdout)."""
    global _out_console
    if _out_console is None:
        from rich.console import Console

        _out_console = Console()
    return _out_console


def err_console() -> "Console":
    """The rich console for errors and warnings (stderr)."""
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True)
    return _err_console


def print_error(message: str) -> None:
    """One red line ``error: message`` on stderr (never wrapped, never read as markup)."""
    from rich.text import Text

    line = " ".join(str(message).split("\n"))
    err_console().print(Text("error: ", style="bold red") + Text(line, style="red"),
                        soft_wrap=True, highlight=False)


def print_warning(message: str) -> None:
    """One yellow line ``warning: message`` on stderr."""
    from rich.text import Text

    err_console().print(Text("warning: ", style="bold yellow") + Text(str(message), style="yellow"),
                        soft_wrap=True, highlight=False)


def print_json(data: Any) -> None:
    """JSON on stdout, plain (no colour codes, so it can be piped)."""
    typer.echo(json.dumps(data, indent=2, default=str))


F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Run a command; a NapkinError becomes ``error: ...`` on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NapkinError as e:
            print_error(str(e))
            raise typer.Exit(EXIT_USER_ERROR) from None

    return wrapper  # type: ignore[return-value]
