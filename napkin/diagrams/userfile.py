"""Load diagrams by name: a built-in (``attention``) or one in a user file (``path/file.py:name``).

A user file is plain Python that builds diagrams with napkin's builder API. The
name after the colon is a module-level :class:`Diagram`, or a function taking no
arguments that returns one. Without a name, the file must hold exactly one diagram.

>>> from napkin.diagrams.userfile import load_diagram
>>> load_diagram("matmul").name
'matmul'
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

from ..errors import UserFileError
from . import library
from .diagram import Diagram


def split_spec(spec: str) -> tuple[str | None, str | None]:
    """Split ``path/file.py:name`` into (path, name); a bare name gives (None, name)."""
    if ".py" in spec:
        path, _, name = spec.partition(".py")
        path = path + ".py"
        name = name[1:] if name.startswith(":") else (name or None)
        if name == "":
            name = None
        return path, name
    return None, spec


def load_user_file(path: str) -> dict[str, object]:
    """Execute a user file in a fresh module and return its globals."""
    p = Path(path)
    if not p.is_file():
        raise UserFileError(f"diagram file {path!r} does not exist")
    mod_name = f"napkin_user_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise UserFileError(f"diagram file {path!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a user file that calls sys.exit is a failing file too
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"line {fr.lineno}" for fr in reversed(tb) if fr.filename == str(p)), "")
        raise UserFileError(
            f"diagram file {path!r} failed to import{(' at ' + where) if where else ''}: "
            f"{type(e).__name__}: {e}"
        ) from None
    finally:
        sys.modules.pop(mod_name, None)
    return vars(module)


def _as_diagram(obj, label: str) -> Diagram | None:
    if isinstance(obj, Diagram):
        return obj
    if callable(obj) and not isinstance(obj, type):
        try:
            out = obj()
        except TypeError:
            return None
        except Exception as e:
            raise UserFileError(f"{label}() failed: {type(e).__name__}: {e}") from None
        return out if isinstance(out, Diagram) else None
    return None


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
        d = _as_diagram(namespace[name], f"{path}:{name}")
        if d is None:
            raise UserFileError(f"{path}:{name} is not a napkin Diagram (nor a function returning one)")
        return d
    found = {k: v for k, v in namespace.items() if isinstance(v, Diagram) and not k.startswith("_")}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise UserFileError(f"diagram file {path!r} holds no napkin Diagram at module level")
    raise UserFileError(f"diagram file {path!r} holds several diagrams ({', '.join(sorted(found))}); "
                        f"name one as {path}:NAME")
