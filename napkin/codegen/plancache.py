"""Derived plans kept on disk, so compiling a diagram again costs no planner search.

:func:`derive_cached` is :func:`napkin.codegen.planner.derive` (``explain=False``) behind two
caches: one in memory for the process, and the kernel cache on disk
(:func:`napkin.kernels.cache.default_cache`: ``$NAPKIN_CACHE_DIR``, default
``~/.cache/napkin/kernels``), where a plan is one more entry (JSON, keyed apart from every
kernel), read and written as safely as a cubin, warned about once if the directory is unusable,
and cleared with the kernels.

The key is what decides the plan: the diagram's structure (its summary: names, axes and sizes,
dtypes, boxes), the dtype, the families allowed, the GPU profile (every field of it), the target
architecture, and a digest of napkin's own planning code (the diagrams, the performance model
and code generation: :func:`code_digest`), so a changed planner or family never reads an older plan. A plan only
chooses tiles and options; the kernels are always built from the diagram at hand, so even a
wrong entry could only cost speed. An entry that no longer reads back (another diagram under the
same summary, a garbled file) is derived again and rewritten.

>>> import tempfile
>>> from napkin.kernels.cache import KernelCache
>>> from napkin.codegen.prepare import prepare
>>> disk = KernelCache(tempfile.mkdtemp())
>>> d = prepare("softmax", sizes={"r": 8, "x": 1000})
>>> p1 = derive_cached(d, "h100", arch="sm_90a", cache=disk)
>>> _memory.clear()
>>> p2 = derive_cached(d, "h100", arch="sm_90a", cache=disk)   # read back from disk
>>> p1 == p2, disk.stats.misses, disk.stats.hits
(True, 1, 1)
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import NapkinError

__all__ = ["derive_cached", "plan_cache", "plan_key", "entry_key", "code_digest"]

_log = logging.getLogger(__name__)
_memory: dict[str, object] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of what identifies the sources that decide a plan (napkin's diagrams, perfmodel and
    codegen packages, templates and profiles included): each file's path, size and modification
    time, as Python's own bytecode cache does (reading every file would cost more than the cached
    plan saves), computed once per process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("diagrams", "perfmodel", "codegen"):
        for path in sorted((root / sub).rglob("*")):
            if path.suffix in (".py", ".jinja", ".json"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def plan_cache():
    """The disk cache plans are kept in: the kernel cache of the current ``NAPKIN_CACHE_DIR``."""
    from ..kernels.cache import default_cache

    return default_cache()


def entry_key(cache, text: str, arch: str) -> str:
    """The cache key of a plan whose identity is ``text`` (never a kernel's: kernels are keyed by
    their source, plans carry the marker ``plan``)."""
    return cache.key(text, (), arch, ("plan",))


def plan_key(diagram, gpu, dtype: str | None, arch: str, families: Sequence[str] | None, extra: str = "") -> str:
    """The text every part of a plan's identity is written into (hashed by the cache)."""
    return json.dumps({
        "diagram": diagram.summary(description=False),
        "dtype": dtype, "arch": arch, "families": list(families) if families else None,
        "gpu": hashlib.sha256(repr(gpu).encode()).hexdigest(), "code": code_digest(), "extra": extra,
    }, sort_keys=True)


def derive_cached(diagram, gpu=None, dtype: str | None = None, *, arch: str | None = None,
                  family: str | None = None, families: Sequence[str] | None = None, cache=None,
                  fold_axes: bool = True):
    """The plan :func:`~napkin.codegen.planner.derive` gives the bound ``diagram`` (a Diagram
    prepared by :func:`~napkin.codegen.prepare.prepare`), from the caches when it was derived
    before. ``cache``: the disk cache (default :func:`plan_cache`); ``fold_axes`` as
    :func:`~napkin.codegen.planner.derive`'s."""
    from ..dtypes import canonical
    from ..perfmodel.hardware import check_arch
    from .planner import derive
    from .select import resolve_gpu

    dtype = canonical(dtype)
    g = resolve_gpu(gpu)
    arch = check_arch(arch or g.arch)
    fams = [family] if family is not None else (list(families) if families else None)
    text = plan_key(diagram, g, dtype, arch, fams, extra="" if fold_axes else "unfolded")
    cache = cache if cache is not None else plan_cache()
    key = entry_key(cache, text, arch)
    with _lock:
        plan = _memory.get(key)
    if plan is not None:
        return plan
    plan = _read(cache, key, diagram)
    if plan is None:
        cache.stats.misses += 1
        start = time.perf_counter()
        plan = derive(diagram, g, dtype, arch=arch, explain=False, families=fams, fold_axes=fold_axes).plan
        _log.info("%s: planned in %.3f s", diagram.name, time.perf_counter() - start)
        payload = json.dumps({"plan": plan.to_dict(), "notes": list(plan.notes)}).encode()
        cache.store(key, payload)
    else:
        cache.stats.hits += 1
        _log.debug("%s: plan read from the plan cache", diagram.name)
    with _lock:
        _memory[key] = plan
    return plan


def _read(cache, key: str, diagram):
    import dataclasses

    from ..diagrams.expand import expand
    from ..perfmodel.plan import Plan

    payload = cache.load(key)
    if payload is None:
        return None
    try:
        data = json.loads(payload.decode("utf-8"))
        plan = Plan.from_dict(diagram, data["plan"])
        # the plan's own diagram is the caller's, written out where boxes were expanded
        want = expand(diagram, plan.expanded) if plan.expanded else diagram
        if plan.interface != want:
            raise ValueError("another diagram")
        return dataclasses.replace(plan, notes=tuple(str(n) for n in data.get("notes", ())))
    except (NapkinError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        _log.info("%s: cached plan %s does not read back (%s); planning again", diagram.name, key[:12], e)
        return None
