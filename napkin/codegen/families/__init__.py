"""The code-generation families, in the order lowering tries them.

``rowwise`` (fused softmax/norms), ``contraction`` (tiled matmul with epilogue), ``attention``
(streamed attention), ``attention_bwd`` (attention's backward), ``pointwise`` (fused elementwise chains and reductions over any axes), then
``fallback`` (any valid diagram, one simple kernel per box).

Each family lives in its own module here and is imported lazily and tolerantly: a module that
fails to import (not written yet, a syntax error, a missing dependency) is skipped and its error
kept in :func:`import_errors`; the others still work. A family module exposes its family object
as ``FAMILY`` (an object with ``name``, ``matches``, ``candidates`` and ``lower``, see
:class:`napkin.codegen.program.Family`); a module-level ``family`` object, or a class implementing
those methods that can be built without arguments, is accepted too.

>>> [f for f in ORDER]
['rowwise', 'contraction', 'attention', 'attention_bwd', 'pointwise', 'fallback']
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import traceback

from ...errors import CodegenError

def per_diagram(analyse):
    """``analyse(diagram)`` computed once per diagram object (the planner asks a family about the
    same sub-diagram several times in a run; what it finds holds that object's values, so the memo
    is keyed by the object itself, and forgets everything past 512 diagrams).

    >>> calls = []
    >>> f = per_diagram(lambda d: calls.append(d) or len(calls))
    >>> d = object()
    >>> f(d), f(d), len(calls)
    (1, 1, 1)
    """
    memo: dict[int, tuple[object, object]] = {}

    @functools.wraps(analyse)
    def analysed(diagram):
        hit = memo.get(id(diagram))
        if hit is not None and hit[0] is diagram:
            return hit[1]
        if len(memo) > 512:
            memo.clear()
        out = analyse(diagram)
        memo[id(diagram)] = (diagram, out)
        return out

    return analysed


def in_registers(diagram, boxes=None) -> tuple[tuple[str, str], ...]:
    """A kernel's placement with every array it touches in registers: the arrays ``boxes`` (by
    default all of the diagram's boxes) compute or read, sorted by name. An input no box reads is
    left out: a grad diagram keeps the forward's inputs (a layernorm's beta) whether or not its
    boxes read them, and the cost model refuses a placement that names an array the kernel does
    not touch.

    >>> from napkin.diagrams import library
    >>> grad = library.get("layernorm").grad(save={"N_mean", "N_rstd"})
    >>> "beta" in grad.input_names, "beta" in dict(in_registers(grad))
    (True, False)
    """
    nodes = diagram.nodes if boxes is None else boxes
    touched = {diagram.name_of(v) for b in nodes for v in (b, *b.args)}
    return tuple((n, "RF") for n in sorted(touched))


def plain_kernel_reason(diagram, dtypes) -> str | None:
    """The checks a kernel of maps and reductions (the row-wise and pointwise families) makes of its
    sub-diagram before anything else: one dtype among ``dtypes``, every size bound, and no output
    that is an input (that is a copy, not a computation). None when they pass.

    >>> from napkin.diagrams import library
    >>> plain_kernel_reason(library.get("softmax"), ("bf16",))
    'axis sizes are not bound'
    """
    dts = {v.dtype for v in (*diagram.inputs, *diagram.nodes)}
    if len(dts) != 1 or next(iter(dts)) not in dtypes:
        return f"dtype {sorted(dts)} is not one of {', '.join(dtypes)}"
    if not diagram.is_bound:
        return "axis sizes are not bound"
    for v in diagram.outputs:
        if v.is_input:
            return f"output {diagram.name_of(v)} is an input (a copy, not a computation)"
    return None


#: The order in which lowering tries the families.
ORDER = ("rowwise", "contraction", "attention", "attention_bwd", "pointwise", "fallback")

_lock = threading.Lock()
_loaded: dict[str, object] = {}
_errors: dict[str, str] = {}
_extra: dict[str, object] = {}
_extra_order: list[tuple[str, str | None]] = []

_METHODS = ("matches", "candidates", "lower")


def _is_family(obj) -> bool:
    return (not inspect.isclass(obj) and isinstance(getattr(obj, "name", None), str)
            and all(callable(getattr(obj, m, None)) for m in _METHODS))


def _family_of(module, name: str):
    for attr in ("FAMILY", "family"):
        obj = getattr(module, attr, None)
        if _is_family(obj):
            return obj
    for obj in vars(module).values():
        if _is_family(obj) and obj.name == name:
            return obj
    for obj in vars(module).values():
        if (inspect.isclass(obj) and obj.__module__ == module.__name__
                and all(callable(getattr(obj, m, None)) for m in _METHODS)):
            try:
                inst = obj()
            except TypeError:
                continue
            if _is_family(inst):
                return inst
    return None


def _load(name: str):
    with _lock:
        if name in _extra:
            return _extra[name]
        if name in _loaded:
            return _loaded[name]
        if name in _errors:
            return None
    try:
        module = importlib.import_module(f"{__name__}.{name}")
        fam = _family_of(module, name)
        if fam is None:
            raise CodegenError(f"module napkin.codegen.families.{name} defines no family object "
                               "(expose it as FAMILY)")
    except Exception as e:  # noqa: BLE001 - any failure of one family must not break the others
        with _lock:
            _errors[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        return None
    with _lock:
        _loaded[name] = fam
    return fam


def names() -> list[str]:
    """Every family name lowering knows, in order (registered extras included)."""
    out = list(ORDER)
    for name, before in _extra_order:
        if name in out:
            continue
        if before in out:
            out.insert(out.index(before), name)
        else:
            out.append(name)
    return out


def get(name: str):
    """The family called ``name``; CodegenError if it is unknown or failed to import."""
    if not isinstance(name, str):
        if _is_family(name):
            return name
        raise CodegenError(f"expected a family name, got {name!r}")
    if name not in names():
        raise CodegenError(f"unknown code-generation family {name!r}; families: {', '.join(names())}")
    fam = _load(name)
    if fam is None:
        err = _errors.get(name, "").splitlines()
        raise CodegenError(f"family {name!r} is not available: {err[0] if err else 'failed to import'}")
    return fam


def available() -> list:
    """The families that imported, in lowering order."""
    return [f for f in (_load(n) for n in names()) if f is not None]


def import_errors() -> dict[str, str]:
    """Family name → why it could not be imported (after an attempt to load it)."""
    for n in names():
        _load(n)
    return dict(_errors)


def register(family, *, before: str | None = "fallback") -> None:
    """Add a family object (tests, plug-ins); it is tried before ``before`` (default: fallback)."""
    if not _is_family(family):
        raise CodegenError(f"{family!r} is not a family (needs name, matches, candidates, lower)")
    with _lock:
        _extra[family.name] = family
        _extra_order[:] = [(n, b) for n, b in _extra_order if n != family.name] + [(family.name, before)]


def unregister(name: str) -> None:
    """Remove a family added with :func:`register`."""
    with _lock:
        _extra.pop(name, None)
        _extra_order[:] = [(n, b) for n, b in _extra_order if n != name]


def reset() -> None:
    """Forget loaded families and import errors (they are imported again on next use)."""
    with _lock:
        _loaded.clear()
        _errors.clear()
