"""Load diagrams by name: a built-in (``attention``) or one in a user file (``path/file.py:name``).

A user file is plain Python that builds diagrams with napkin's builder API. The
name after the colon is a module-level :class:`Diagram`, or a function taking no
arguments that returns one. Without a name, the file must hold exactly one diagram.

The spec is split at its **last** colon, and the part before it must end in ``.py``, so
folders such as ``my.python/`` or ``a.py.d/`` are fine; the part after it must be a
Python identifier.

Whatever the file does while it is imported and while its diagram function runs is the
file's own business, but it cannot take napkin down with it: an exception of any kind,
``sys.exit(...)`` (``SystemExit``) included, becomes a :class:`~napkin.errors.UserFileError`
naming the file, the line and the exception. Only ``KeyboardInterrupt`` (Ctrl-C) goes
through untouched. What the file prints goes to stderr, so a command's stdout (its
``--json`` above all) holds only napkin's output.

>>> from napkin.diagrams.userfile import load_diagram, split_spec
>>> load_diagram("matmul").name
'matmul'
>>> split_spec("my.python/f.py:mm"), split_spec("a.py.d/f.py"), split_spec("attention")
(('my.python/f.py', 'mm'), ('a.py.d/f.py', None), (None, 'attention'))
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import os
import sys
import traceback
from pathlib import Path

from ..errors import UserFileError
from . import library
from .diagram import Diagram

#: The longest exception text quoted in an error (a user file may raise anything).
_MAX_QUOTED = 500


def split_spec(spec: str) -> tuple[str | None, str | None]:
    """Split ``path/file.py:name`` into (path, name); ``path/file.py`` gives (path, None) and a
    bare name (a built-in) gives (None, name).

    The split is at the last ``:``; the path part must end in ``.py`` and the name part must be
    an identifier, else a UserFileError names what is wrong.
    """
    spec = str(spec)
    if spec.endswith(".py"):
        return spec, None
    if ":" not in spec:
        return None, spec
    path, _, name = spec.rpartition(":")
    if not path.endswith(".py"):
        raise UserFileError(f"{spec!r}: a diagram in a file is named path/file.py:name, and {path!r} does not "
                            "end in .py")
    if not name.isidentifier():
        shown = repr(name) if name else "nothing"
        raise UserFileError(f"{spec!r}: the diagram's name after the last ':' must be a Python identifier, "
                            f"got {shown}")
    return path, name


def _text(e: BaseException) -> str:
    """``Type: message`` of an exception a user file raised, even when its ``str`` fails."""
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not hide the failure
        msg = "<unprintable message>"
    if len(msg) > _MAX_QUOTED:
        msg = msg[:_MAX_QUOTED] + "…"
    name = type(e).__name__
    return f"{name}: {msg}" if msg else name


def _line_in(e: BaseException, path: Path) -> str:
    """`` at line N`` of the innermost frame of ``path`` in ``e``'s traceback ('' if none)."""
    want = os.path.abspath(path)

    def same(filename) -> bool:
        return isinstance(filename, str) and os.path.abspath(filename) == want

    if isinstance(e, SyntaxError) and e.lineno and same(e.filename):
        return f" at line {e.lineno}"
    try:
        tb = traceback.extract_tb(e.__traceback__)
    except Exception:  # noqa: BLE001
        return ""
    return next((f" at line {fr.lineno}" for fr in reversed(tb) if same(fr.filename)), "")


@contextlib.contextmanager
def _user_code():
    """Run user code with its prints going to stderr (stdout is napkin's: ``--json``)."""
    target = sys.stderr if sys.stderr is not None else io.StringIO()
    with contextlib.redirect_stdout(target):
        yield


def _caught(e: BaseException) -> bool:
    """Whether a failure of user code becomes a UserFileError: everything but Ctrl-C."""
    return not isinstance(e, KeyboardInterrupt)


def load_user_file(path: str) -> dict[str, object]:
    """Execute a user file in a fresh module and return its globals."""
    p = Path(path)
    try:
        if p.is_dir():
            raise UserFileError(f"diagram file {path!r} is a directory")
        if not p.is_file():
            raise UserFileError(f"diagram file {path!r} does not exist")
    except (OSError, ValueError) as e:  # a name too long, a NUL byte
        raise UserFileError(f"diagram file {path!r} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    mod_name = f"napkin_user_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise UserFileError(f"diagram file {path!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # what dataclasses and pickling in the file look up
    try:
        with _user_code():
            spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - sys.exit and any exception class of the file's own
        if not _caught(e):
            raise
        raise UserFileError(f"diagram file {path!r} failed to import{_line_in(e, p)}: {_text(e)}") from None
    finally:
        sys.modules.pop(mod_name, None)
    return vars(module)


def _takes_no_arguments(fn) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: try it
        return True
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values())


def _as_diagram(obj, label: str, path: Path) -> Diagram:
    """``obj`` itself when it is a Diagram, else what calling it with no arguments returns."""
    if isinstance(obj, Diagram):
        return obj
    if not callable(obj) or isinstance(obj, type):
        raise UserFileError(f"{label} is not a napkin Diagram (nor a function returning one): it is a "
                            f"{type(obj).__name__}")
    if not _takes_no_arguments(obj):
        raise UserFileError(f"{label} is not a napkin Diagram (nor a function of no arguments returning one): "
                            "it takes arguments")
    try:
        with _user_code():
            out = obj()
    except BaseException as e:  # noqa: BLE001 - as at import: sys.exit and the file's own classes too
        if not _caught(e):
            raise
        where = _line_in(e, path)
        raise UserFileError(f"{label}() failed: {_text(e)}{f' ({where.strip()})' if where else ''}") from None
    if not isinstance(out, Diagram):
        raise UserFileError(f"{label} is not a napkin Diagram (nor a function returning one): {label}() "
                            f"returned a {type(out).__name__}")
    return out


def load_diagram(spec: str) -> Diagram:
    """Resolve a diagram spec: a built-in name or ``path/file.py[:name]``."""
    path, name = split_spec(spec)
    if path is None:
        return library.get(name)
    namespace = load_user_file(path)
    if name is not None:
        if name not in namespace:
            found = sorted(k for k, v in namespace.items() if isinstance(v, Diagram))
            raise UserFileError(f"diagram file {path!r} has no {name!r}; diagrams there: {found or 'none'}")
        return _as_diagram(namespace[name], f"{path}:{name}", Path(path))
    found = {k: v for k, v in namespace.items() if isinstance(v, Diagram) and not k.startswith("_")}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise UserFileError(f"diagram file {path!r} holds no napkin Diagram at module level")
    raise UserFileError(f"diagram file {path!r} holds several diagrams ({', '.join(sorted(found))}); "
                        f"name one as {path}:NAME")
