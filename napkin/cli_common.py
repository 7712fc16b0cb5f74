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
mistake they made. :func:`run_guarded`, which the command group runs every command line
through, does the same for what happens around a command: usage errors (an unknown
option or command, a missing argument, a bad choice) become one ``error:`` line too, and
so does output that cannot be written (stdout closed, on a full disk): the command never
exits 0 having written nothing. A broken pipe (``napkin list | head -1``) ends quietly
with status 141, as a process killed by SIGPIPE would.

Output files go through :func:`output_path` (checked before any work: a folder, a missing
parent, an unwritable place, ``-`` for stdout) and :func:`write_output`. Axis sizes are
at most :data:`MAX_AXIS_SIZE` (2^48). Nothing here imports torch (``napkin --help`` and
``napkin list`` must stay light); the GPU profile and the dtype are looked up only when
a command asks for them.

>>> parse_sizes(["q=4096", "d=128"])
{'q': 4096, 'd': 128}
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Mapping, Optional, TypeVar

import typer
from typer.core import TyperGroup

from .errors import DiagramError, NapkinError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import Console

    from .diagrams.diagram import Diagram
    from .diagrams.library import Entry

#: Exit status for every error a user can cause (also click's status for usage errors).
EXIT_USER_ERROR = 2
#: Exit status when stdout is a pipe its reader closed (128 + SIGPIPE, as the shell reports).
EXIT_BROKEN_PIPE = 141
#: Exit status after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130

#: The largest axis size napkin accepts (the diagrams' own limit): 2^48 = 281474976710656.
#: Sizes past it are refused when ``-s`` is parsed, before anything is costed.
MAX_AXIS_SIZE = 2 ** 48

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


def _dtype_option(value: str) -> str:
    """``--dtype``: any spelling of a dtype becomes its short name (``bfloat16`` plans as ``bf16``);
    an unknown one, and fp64 and tf32, which no kernel is built in, are refused here."""
    from .dtypes import dtype

    if value is None:
        return value
    name = dtype(value).name
    if name in ("fp64", "tf32"):
        raise UsageError(f"--dtype {value}: napkin builds no kernel in {name}; use bf16, fp16, fp32 or fp8")
    return name


DtypeOpt = Annotated[
    str,
    typer.Option("--dtype", metavar="DTYPE", callback=_dtype_option,
                 help="Value type of the inputs: bf16, fp16, fp32 or fp8 (also spelt bfloat16, float32, ...)."),
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
    from .diagrams.axes import is_name

    if not is_name(name):
        raise UsageError(f"-s {text!r}: {name!r} is not an axis name (a letter followed by letters, "
                         "digits or '_')")
    if not re.fullmatch(r"[+-]?[0-9]+(_[0-9]+)*", raw):  # ASCII digits: int() would take any script's
        raise UsageError(f"-s {text!r}: size {_shown(raw)!r} of axis {name!r} is not an integer")
    digits = raw.lstrip("+-").replace("_", "").lstrip("0")
    # Checked on the digits, before int(): a 5000-digit number would not even convert.
    value = int(raw) if len(digits) <= len(str(MAX_AXIS_SIZE)) else None
    if raw.startswith("-") or value == 0:
        raise UsageError(f"-s {_shown(text)!r}: axis {name!r} needs a positive size, got {_shown(raw)}")
    if value is None or value > MAX_AXIS_SIZE:
        shown = f"a {len(digits)}-digit size" if value is None else f"size {value}"
        raise UsageError(f"-s {_shown(text)!r}: axis {name!r} has {shown}, more than the largest axis size "
                         f"2^48 ({MAX_AXIS_SIZE})")
    return name, value


def _shown(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


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
        # an axis that follows another's size (a rename: x follows q) is sized through that one
        roots = list(dict.fromkeys(getattr(bound.axes[n].size, "name", n) for n in missing))
        roots = [n for n in roots if n in bound.axes] or missing
        hint = " ".join(f"-s {n}=VALUE" for n in roots)
        raise DiagramError(f"diagram {diagram.name!r}: axis {', '.join(map(repr, missing))} has no size; "
                           f"give {'it' if len(roots) == 1 else 'them'} with {hint}")
    # Report every axis's size in the diagram's own order (derived axes included).
    return {n: int(a.size) for n, a in bound.axes.items()}


# ----------------------------------------------------------------------------- diagrams

def load(spec: str) -> "Diagram":
    """A built-in diagram or ``path/file.py:name`` (every failure is a NapkinError)."""
    from .diagrams import load_diagram

    return load_diagram(spec)


def load_bound(spec: str, size_args: Iterable[str] | Mapping[str, int] | None,
               use_defaults: bool = False, plan: bool = False) -> "Diagram":
    """Load ``spec`` and bind its sizes (see :func:`resolve_sizes`). ``plan``: the command plans
    it, so a diagram past the planner's limit (:data:`napkin.codegen.planner.MAX_PLANNED_BOXES`
    boxes) is refused before its sizes are bound."""
    from .diagrams import library

    diagram = load(spec)
    if plan:
        from .codegen.planner import check_search_size

        check_search_size(diagram)
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


def _console_class():
    from rich.console import Console

    class _Console(Console):
        """rich's console, but a broken pipe is an error :func:`run_guarded` handles (rich's own
        handling exits with status 1)."""

        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


def console() -> "Console":
    """The rich console for normal output (stdout)."""
    global _out_console
    if _out_console is None:
        _out_console = _console_class()()
    return _out_console


def err_console() -> "Console":
    """The rich console for errors and warnings (stderr)."""
    global _err_console
    if _err_console is None:
        _err_console = _console_class()(stderr=True)
    return _err_console


def _print_line(console_: "Console", text) -> None:
    """Print one line on a console; an unusable stream (stderr closed or full) is ignored: the exit
    status still says what happened."""
    try:
        console_.print(text, soft_wrap=True, highlight=False)
    except (OSError, ValueError):  # ValueError: I/O operation on a closed file
        pass


def print_error(message: str) -> None:
    """One red line ``error: message`` on stderr (never wrapped, never read as markup)."""
    from rich.text import Text

    line = " ".join(str(message).split("\n"))
    _print_line(err_console(), Text("error: ", style="bold red") + Text(line, style="red"))


def print_warning(message: str) -> None:
    """One yellow line ``warning: message`` on stderr."""
    from rich.text import Text

    line = " ".join(str(message).split("\n"))
    _print_line(err_console(), Text("warning: ", style="bold yellow") + Text(line, style="yellow"))


def _finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None (JSON has no Infinity or NaN)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def print_json(data: Any) -> None:
    """Strict JSON on stdout, plain (no colour codes, so it can be piped); a non-finite number
    prints as ``null``."""
    typer.echo(json.dumps(_finite(data), indent=2, default=str, allow_nan=False))


# ----------------------------------------------------------------------------- output files

def output_path(command: str, option: str, value: "Path | str | None", default: "Path | None" = None, *,
                suffixes: tuple[str, ...] = (), stdout: bool = True) -> "Path | None":
    """The file an output option (``-o FILE``, ``--svg FILE``) names, checked before any work.

    ``None`` gives ``default``; ``-`` gives None, meaning stdout (a UsageError where ``stdout``
    is False). A folder, a missing or unwritable parent folder, an unwritable file, a name the
    system refuses and, where ``suffixes`` are given, a suffix outside them (a name without
    one is fine) are UsageErrors naming the option.

    >>> output_path("render", "-o", "-") is None, output_path("render", "-o", None, Path("a.svg"))
    (True, PosixPath('a.svg'))
    """
    where = f"{command} {option}"
    if value is None:
        if default is None:
            raise UsageError(f"{where}: give a file name")
        value = default
    text = str(value)
    if text == "-":
        if not stdout:
            raise UsageError(f"{where} -: this command cannot write that to stdout; give a file name")
        return None
    if text == "" or "\0" in text:
        raise UsageError(f"{where} {text!r}: not a file name")
    path = Path(text)
    try:
        if path.is_dir() or text.endswith(("/", os.sep)):
            example = path / (default.name if default is not None else f"out{suffixes[0] if suffixes else ''}")
            raise UsageError(f"{where} {text!r}: cannot write a folder; give a file name (for example {example})")
        if suffixes and path.suffix and path.suffix.lower() not in suffixes:
            raise UsageError(f"{where} {text!r}: {command} writes {' or '.join(suffixes)} files, not "
                             f"{path.suffix}")
        parent = path.parent
        if path.is_symlink() and not path.exists():  # a link to a file not there yet: its folder is the one
            target = Path(os.readlink(path))
            parent = (target if target.is_absolute() else path.parent / target).parent
            if not parent.exists():
                raise UsageError(f"{where} {text!r}: cannot write: it links to {str(target)!r}, in a folder "
                                 "that does not exist")
        if not parent.exists():
            raise UsageError(f"{where} {text!r}: cannot write: folder {str(parent)!r} does not exist")
        if not parent.is_dir():
            raise UsageError(f"{where} {text!r}: cannot write: {str(parent)!r} is not a folder")
        if path.exists():
            if not os.access(path, os.W_OK):
                raise UsageError(f"{where} {text!r}: cannot write: permission denied")
        elif not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{where} {text!r}: cannot write: folder {str(parent)!r} is not writable")
    except OSError as e:  # a name too long, a loop of links
        raise UsageError(f"{where} {_shown(text)!r}: cannot write: {e.strerror or e}") from None
    return path


def write_output(command: str, text: str, target: "Path | None") -> "Path | None":
    """Write ``text`` to ``target`` (from :func:`output_path`; None: stdout); the path written."""
    if target is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return None
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{command}: cannot write {str(target)!r}: {e.strerror or e}") from None
    return target


def output_dir(command: str, option: str, value: "Path | str") -> Path:
    """A folder an option names for results (``bench --sweep --out DIR``): it may not exist yet,
    but it may not be a file, and the nearest existing folder above it must be writable."""
    text = str(value)
    if text in ("", "-") or "\0" in text:
        raise UsageError(f"{command} {option} {text!r}: not a folder name")
    path = Path(text)
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{command} {option} {text!r} is a file, not a folder")
        probe = path
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise UsageError(f"{command} {option} {text!r}: {str(probe)!r} is a file, not a folder")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UsageError(f"{command} {option} {text!r}: cannot write in {str(probe)!r} (permission denied)")
    except OSError as e:
        raise UsageError(f"{command} {option} {_shown(text)!r}: {e.strerror or e}") from None
    return path


# ----------------------------------------------------------------------------- memory

def array_bytes(diagram: "Diagram", dtype: str) -> int:
    """Bytes of the diagram's inputs and outputs at ``dtype`` (each distinct array once): what
    must sit in HBM whatever the plan."""
    seen: set[int] = set()
    total = 0
    per = get_dtype(dtype).bytes
    for v in (*diagram.inputs, *diagram.outputs):
        if id(v) in seen:
            continue
        seen.add(id(v))
        n = 1
        for a in v.axis_names:
            n *= int(diagram.axes[a].size)
        total += n * per
    return total


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:,.0f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:,.1f} MiB"


def check_memory(diagram: "Diagram", dtype: str, *, consequence: str, gpu: str | None = None,
                 capacity: float | None = None, device: str | None = None, refuse: bool = False) -> None:
    """Say so when the diagram's inputs and outputs do not fit in HBM: one ``warning:`` line
    ending in ``consequence`` (``refuse``: a UsageError instead). The capacity is the HBM of the
    profile ``gpu``, or ``capacity`` bytes of the GPU called ``device``."""
    if capacity is None:
        prof = get_gpu(gpu if gpu is not None else DEFAULT_GPU)
        capacity, device = prof.level("HBM").capacity_bytes, prof.name
    if not capacity:
        return
    need = array_bytes(diagram, dtype)
    if need <= capacity:
        return
    text = (f"the inputs and outputs of {diagram.name!r} need {_gib(need)} at {dtype}, more than the "
            f"{_gib(capacity)} of HBM of the {device or 'GPU'}; {consequence}")
    if refuse:
        raise UsageError(text)
    print_warning(text)


# ----------------------------------------------------------------------------- running a command line

def stdout_problem() -> str | None:
    """Why stdout cannot take napkin's output (closed), or None."""
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        return "standard output is closed"
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):  # an in-memory stream (tests): usable
        return None
    try:
        os.fstat(fd)
    except OSError:
        return "standard output is closed"
    return None


def _silence_stdout() -> None:
    """Point a failed stdout at /dev/null, so the interpreter's last flush of what is still
    buffered does not fail again (and print a traceback of its own)."""
    out = sys.stdout
    if out is None or out is not sys.__stdout__:
        return
    try:
        fd = out.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError):
        pass


def _exception_types(name: str) -> tuple[type, ...]:
    """The click exception class ``name`` from click and from typer's own copy of it (newer
    typer versions vendor click), whichever are present."""
    import importlib

    found = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def _usage_line(e: Exception) -> str:
    """A click usage error as one line, with where to find the command's help."""
    try:
        message = e.format_message()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        message = str(e)
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", None) or "napkin"
    return f"{message} (see {path} --help)"


class _OutputFailed(Exception):
    """An OSError raised while a command ran, carried past click's own handling of it (which
    turns a broken pipe into exit status 1 and lets every other one through as a traceback)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def run_guarded(invoke: Callable[[], Any]) -> int:
    """Run one command line (``invoke`` runs click in non-standalone mode); its exit status.

    Usage errors, NapkinErrors raised outside a command and output failures each end in one
    ``error:`` line on stderr and status 2; a broken pipe ends quietly with 141; Ctrl-C with 130.
    stdout is flushed here, so a write that fails at the end is caught too.
    """
    usage_errors = _exception_types("UsageError")
    no_args = _exception_types("NoArgsIsHelpError")
    click_errors = _exception_types("ClickException")
    aborts = (typer.Abort, *_exception_types("Abort"))
    problem = stdout_problem()
    if problem is not None:
        print_error(f"{problem}; napkin writes its results there (redirect it to a file or /dev/null)")
        return EXIT_USER_ERROR
    try:
        try:
            rv = invoke()
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except no_args as e:  # plain `napkin`: the help, as --help prints it
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                typer.echo(ctx.get_help())
            code = 0
        except usage_errors as e:
            print_error(_usage_line(e))
            code = EXIT_USER_ERROR
        except click_errors as e:
            print_error(e.format_message())  # type: ignore[attr-defined]
            code = getattr(e, "exit_code", 1) or 1
        except aborts:
            print_error("aborted")
            code = EXIT_INTERRUPTED
        except NapkinError as e:  # raised outside a command (callbacks); commands handle their own
            print_error(str(e))
            code = EXIT_USER_ERROR
        except _OutputFailed as e:
            raise e.error from None
        if sys.stdout is not None:
            sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as e:
        if e.errno == errno.EPIPE:
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        if e.filename is None:  # a stream: stdout (stderr's failures are ignored where they happen)
            _silence_stdout()
            print_error(f"cannot write the output: {e.strerror or e}")
        else:
            print_error(f"cannot use {str(e.filename)!r}: {e.strerror or e}")
        return EXIT_USER_ERROR


class NapkinGroup(TyperGroup):
    """napkin's command group: every command line runs through :func:`run_guarded`, whichever way
    it is started (the ``napkin`` script, ``python -m napkin``, typer's ``CliRunner``)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        code = run_guarded(lambda: super(NapkinGroup, self).main(
            args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra))
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as e:
            raise _OutputFailed(e) from None


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
