"""The fast configuration is found, not hand-picked.

:func:`tune` ranks the schedules a code-generation family proposes with the performance model
(:func:`model_ranking`: each predicted by :func:`napkin.codegen.select.predict_schedule`, the
number ``napkin cost`` and ``derive`` print), compiles and measures the top ``k`` (default 4)
on the GPU, and keeps the fastest. The choice is cached on disk, keyed by GPU name, a hash of the
diagram's structure, the sizes and the dtype, in ``$NAPKIN_CACHE_DIR/autotune.json`` (default
``~/.cache/napkin/autotune.json``); writes are atomic (a temporary file renamed over the cache)
and a corrupt cache is moved aside and rebuilt, never fatal: reading follows no link, opens
nothing but a regular file of at most :data:`MAX_CACHE_BYTES`, and a file that is not UTF-8 JSON
of the cache's shape (too deeply nested JSON included) is an empty cache, an entry of the wrong
schema (:func:`entry_problem`) a missing one, each with one warning line.

Every measured candidate keeps the model's prediction next to the measurement, so the model's
miss ``(pred − meas)/meas`` is on record for calibration (:func:`calibration_records`), and the
Spearman rank correlation between predicted and measured order (:func:`spearman`, numpy only)
says whether the model ranks configurations the way the GPU does.

>>> round(spearman([1, 2, 3, 4], [10, 20, 40, 30]), 3)
0.8
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import stat
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = [
    "DEFAULT_TOP_K",
    "AutotuneError",
    "AutotuneCacheWarning",
    "AutotuneCache",
    "MAX_CACHE_BYTES",
    "entry_problem",
    "Candidate",
    "TuneResult",
    "cache_path",
    "cache_key",
    "diagram_hash",
    "schedule_signature",
    "schedule_id",
    "describe_schedule",
    "is_typed",
    "legacy_notes",
    "legacy_signature",
    "legacy_schedule_id",
    "legacy_description",
    "legacy_schedule",
    "rankdata",
    "spearman",
    "tune",
    "model_ranking",
    "calibration_records",
]

DEFAULT_TOP_K = 4
CACHE_VERSION = 1


class AutotuneError(RuntimeError):
    """No candidate could be compiled and measured."""


class AutotuneCacheWarning(UserWarning):
    """The autotune cache was unreadable and has been moved aside."""


# ----------------------------------------------------------------------------- statistics


def rankdata(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the average of the ranks they span.

    >>> rankdata([10, 30, 20, 20]).tolist()
    [1.0, 4.0, 2.5, 2.5]
    """
    a = np.asarray(values, dtype=float)
    if a.ndim != 1:
        raise ValueError("rankdata needs a 1-d sequence")
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=float)
    sorted_a = a[order]
    i = 0
    n = len(a)
    while i < n:
        j = i
        while j + 1 < n and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: the Pearson correlation of the ranks (ties averaged).
    NaN when fewer than two pairs or when either side is constant."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError(f"spearman needs two 1-d sequences of one length, got {xa.shape} and {ya.shape}")
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    if len(xa) < 2:
        return math.nan
    rx, ry = rankdata(xa), rankdata(ya)
    rx -= rx.mean()
    ry -= ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    if den == 0:
        return math.nan
    return float((rx * ry).sum() / den)


# ----------------------------------------------------------------------------- keys


def cache_path() -> Path:
    """``$NAPKIN_CACHE_DIR/autotune.json``, else ``~/.cache/napkin/autotune.json``."""
    base = os.environ.get("NAPKIN_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "napkin"
    return root / "autotune.json"


def diagram_hash(diagram) -> str:
    """A stable hash (16 hex digits) of the diagram's structure — inputs with their axes and dtypes,
    every box with its operation and parameters, the outputs — without the axis sizes (those are a
    separate part of the cache key) and the same in every process."""
    parts = []
    for v in diagram.inputs:
        parts.append(f"in {v.name}[{','.join(v.axis_names)}] {v.dtype}")
    for v in diagram.nodes:
        args = ",".join(diagram.name_of(a) for a in v.args)
        parts.append(f"box {diagram.name_of(v)}[{','.join(v.axis_names)}] {v.op!r} ({args}) {v.dtype}")
    for n, v in zip(diagram.output_names, diagram.outputs):
        parts.append(f"out {n}[{','.join(v.axis_names)}]")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _sizes_str(sizes: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={int(v)}" for k, v in sorted((sizes or {}).items()))


def cache_key(gpu_name: str, diagram, sizes: Mapping[str, int] | None, dtype: str) -> str:
    """``<gpu name>|<diagram hash>|<sizes a=..,b=..>|<dtype>``."""
    return f"{gpu_name}|{diagram_hash(diagram)}|{_sizes_str(sizes)}|{dtype}"


#: The note the fallback family carried before kernels had typed options (legacy ids only).
LEGACY_FALLBACK_NOTE = "fallback: one kernel per box, intermediates in HBM (fp32)"


def _options_dict(kernel) -> dict:
    opts = getattr(kernel, "options", None)
    return dict(opts.to_dict()) if opts is not None and hasattr(opts, "to_dict") else {}


def is_typed(schedule) -> bool:
    """Whether any kernel of ``schedule`` names its family or carries typed options
    (:class:`~napkin.perfmodel.schedule.KernelOptions`); else it is a legacy schedule whose
    tunables, if any, travel in ``schedule.notes``."""
    return any(getattr(k, "family", None) or _options_dict(k) for k in schedule.kernels)


def _kernel_signature(k) -> dict:
    return {
        "name": k.name,
        "boxes": list(k.boxes),
        "relabels": [[r.axis, str(r.size), r.level, r.kind] for r in k.relabels],
        "placement": [list(p) for p in k.placement],
    }


def _legacy_form(kernels, dtype, notes) -> dict:
    sig = {"kernels": kernels, "dtype": str(dtype)}
    if notes:  # legacy families told apart candidates with equal relabels here (warps, stages)
        sig["notes"] = list(notes)
    return sig


def schedule_signature(schedule) -> dict:
    """A JSON-able description of a schedule: its kernels (name, boxes, relabels, placement) and
    dtype, and for each kernel its code-generation family and typed options (``KernelOptions``:
    engine, stages, warps, ...), so candidates that differ only in options differ here.

    A legacy schedule (no kernel names a family or carries options: :func:`is_typed` is False)
    gets the signature it always had: kernels and dtype, plus the schedule's ``notes`` when it
    has any. A typed schedule's notes are free text and are left out."""
    if not is_typed(schedule):
        notes = tuple(str(n) for n in (getattr(schedule, "notes", ()) or ()))
        return _legacy_form([_kernel_signature(k) for k in schedule.kernels], getattr(schedule, "dtype", ""), notes)
    kernels = []
    for k in schedule.kernels:
        d = _kernel_signature(k)
        d["family"] = getattr(k, "family", None)
        d["options"] = _options_dict(k)
        kernels.append(d)
    return {"kernels": kernels, "dtype": str(getattr(schedule, "dtype", ""))}


def _hash(sig: dict) -> str:
    return hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:12]


def schedule_id(schedule) -> str:
    """12 hex digits identifying a schedule (its signature's hash)."""
    return _hash(schedule_signature(schedule))


def _rows_per_block(kernel) -> int:
    """Rows a row-wise block holds: the product of its SMEM groups (the row axes; x is whole)."""
    n = 1
    for r in kernel.relabels:
        if r.level == "SMEM" and r.kind == "group" and isinstance(r.size, int):
            n *= r.size
    return n


def legacy_notes(schedule) -> tuple[str, ...]:
    """The notes the code-generation families wrote before kernels had typed options, recovered
    from the options (for results recorded then): contraction ``stages=S``, ``blocks_per_sm=B``
    and ``engine=wgmma`` for a wgmma kernel; attention ``stages=S``, ``blocks_per_sm=B``;
    rowwise ``rowwise THREADS_PER_ROW=T ROWS_PER_BLOCK=R`` (R: the product of the kernel's SMEM
    groups, the row axes); fallback its one descriptive note. A legacy schedule: its own notes."""
    if not is_typed(schedule):
        return tuple(str(n) for n in (getattr(schedule, "notes", ()) or ()))
    out: list[str] = []
    for k in schedule.kernels:
        fam, o = getattr(k, "family", None), getattr(k, "options", None)
        if fam in ("contraction", "attention") and o is not None:
            if o.stages is not None:
                out.append(f"stages={o.stages}")
            if o.blocks_per_sm is not None:
                out.append(f"blocks_per_sm={o.blocks_per_sm}")
            if fam == "contraction" and o.engine == "wgmma":
                out.append("engine=wgmma")
        elif fam == "rowwise" and o is not None and o.threads_per_row is not None:
            out.append(f"rowwise THREADS_PER_ROW={o.threads_per_row} ROWS_PER_BLOCK={_rows_per_block(k)}")
        elif fam == "fallback" and LEGACY_FALLBACK_NOTE not in out:
            out.append(LEGACY_FALLBACK_NOTE)
    return tuple(dict.fromkeys(out))


def legacy_signature(schedule) -> dict:
    """The signature :func:`schedule_signature` gave this schedule before kernels had typed
    options: kernels without family and options, the options turned back into the families' old
    notes (:func:`legacy_notes`). Equal to :func:`schedule_signature` for a legacy schedule."""
    if not is_typed(schedule):
        return schedule_signature(schedule)
    return _legacy_form([_kernel_signature(_legacy_kernel(k)) for k in schedule.kernels],
                        getattr(schedule, "dtype", ""), legacy_notes(schedule))


def _legacy_kernel(k):
    """A kernel as the families built it before typed options: the contraction and attention
    families did not yet name their one head (or batch element) per block as a group of 1."""
    if getattr(k, "family", None) not in ("contraction", "attention"):
        return k
    return k.replace(relabels=tuple(r for r in k.relabels
                                    if not (r.kind == "group" and r.level == "SMEM" and r.size == 1)))


def legacy_schedule_id(schedule) -> str:
    """The id a recorded result gave this schedule before kernels had typed options (the
    committed benchmark JSON uses these): the hash of :func:`legacy_signature`."""
    return _hash(legacy_signature(schedule))


def legacy_schedule(schedule):
    """The schedule as the families built it before kernels had typed options: the same kernels
    without family and options, and :func:`legacy_notes` as its notes (its
    :func:`schedule_id` is this schedule's :func:`legacy_schedule_id`)."""
    if not is_typed(schedule):
        return schedule
    from ..perfmodel.schedule import KernelOptions

    kernels = tuple(_legacy_kernel(k).replace(family=None, options=KernelOptions()) for k in schedule.kernels)
    return schedule.replace(kernels=kernels, notes=legacy_notes(schedule))


def _kernel_suffix(k) -> str:
    items = []
    fam = getattr(k, "family", None)
    if fam and fam != k.name:
        items.append(f"family={fam}")
    items += [f"{a}={b}" for a, b in _options_dict(k).items()]
    return f"({', '.join(items)})" if items else ""


def describe_schedule(schedule) -> str:
    """One line: each kernel with its relabellings and, when it has them, its family (unless the
    kernel is named after it) and typed options:
    ``fused[q → g_q=128@SMEM, x → s_x=64@SMEM](family=attention, engine=mma.sync, stages=2)``;
    kernels are separated by ``"; "``. A legacy schedule: ``fused[q → g_q=128@SMEM, ...]``."""
    return "; ".join(f"{k.name}[{', '.join(str(r) for r in k.relabels)}]{_kernel_suffix(k)}"
                     for k in schedule.kernels)


def legacy_description(schedule) -> str:
    """The description recorded before kernels had typed options: relabellings only."""
    kernels = [_legacy_kernel(k) for k in schedule.kernels]
    return "; ".join(f"{k.name}[{', '.join(str(r) for r in k.relabels)}]" for k in kernels)


# ----------------------------------------------------------------------------- the cache


#: The largest autotune cache file that is read: an entry is a few kB, so tens of thousands fit.
MAX_CACHE_BYTES = 64 * 1024 * 1024
#: Nesting deeper than this is no entry (a kernel's relabels, the deepest field, are 7 deep).
MAX_ENTRY_DEPTH = 32

_warned: set[str] = set()


def _warn_once(message: str, stacklevel: int = 3) -> None:
    """One warning line per message and process; ``stacklevel`` 1 is the caller's line."""
    message = " ".join(message.split())
    if message in _warned:
        return
    _warned.add(message)
    warnings.warn(message, AutotuneCacheWarning, stacklevel=stacklevel + 1)


def _brief(text: object, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt(check):
    return lambda x: x is None or check(x)


def _is_str(x) -> bool:
    return isinstance(x, str)


def _is_sizes(x) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) and _is_int(v) for k, v in x.items())


#: field -> (check, what it must be); a field that is absent is not checked.
_ENTRY_FIELDS = {
    "gpu": (_is_str, "a string"), "diagram": (_is_str, "a string"),
    "diagram_hash": (_is_str, "a string"), "dtype": (_is_str, "a string"),
    "date": (_is_str, "a string"), "family": (_opt(_is_str), "a string or null"),
    "sizes": (_is_sizes, "an object of integers"), "spearman": (_opt(_is_num), "a number or null"),
    "n_ranked": (_is_int, "an integer"), "k": (_is_int, "an integer"),
    "candidates": (lambda x: isinstance(x, list), "a list"),
}
_BEST_FIELDS = {
    "desc": (_is_str, "a string"), "signature": (lambda x: isinstance(x, dict), "an object"),
    "pred_s": (_opt(_is_num), "a number or null"), "meas_s": (_opt(_is_num), "a number or null"),
    "model_rank": (_is_int, "an integer"),
}
_CANDIDATE_FIELDS = {
    "rank": (_is_int, "an integer"), "id": (_is_str, "a string"), "desc": (_is_str, "a string"),
    "pred_s": (_opt(_is_num), "a number or null"), "meas_s": (_opt(_is_num), "a number or null"),
    "miss": (_opt(_is_num), "a number or null"), "error": (_opt(_is_str), "a string or null"),
}


def _json_kind(x) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, (int, float)):
        return "a number"
    return {str: "a string", list: "a list"}.get(type(x), type(x).__name__)


def _too_deep(value, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def _fields_problem(obj: dict, fields: dict, where: str) -> str | None:
    for name, (check, what) in fields.items():
        if name in obj and not check(obj[name]):
            return f"{where}{name} is not {what}"
    return None


def entry_problem(entry) -> str | None:
    """Why ``entry`` (one value of the cache's ``entries``) cannot be used, or None when it can:
    an object whose ``best`` is an object with a string ``id``, and every field that :func:`tune`
    writes and reads, where present, of its type (numbers finite); nesting at most
    :data:`MAX_ENTRY_DEPTH` deep.

    >>> entry_problem({"best": {"id": "abc", "meas_s": 1e-3}}) is None
    True
    >>> entry_problem({"best": {"id": "abc", "meas_s": "fast"}})
    'best.meas_s is not a number or null'
    """
    if not isinstance(entry, dict):
        return f"{_json_kind(entry)}, not an object"
    if _too_deep(entry, MAX_ENTRY_DEPTH):
        return f"nested more than {MAX_ENTRY_DEPTH} deep"
    best = entry.get("best")
    if not isinstance(best, dict):
        return "best is not an object"
    if not isinstance(best.get("id"), str):
        return "best.id is not a string"
    problem = _fields_problem(best, _BEST_FIELDS, "best.") or _fields_problem(entry, _ENTRY_FIELDS, "")
    if problem:
        return problem
    for i, c in enumerate(entry.get("candidates", [])):
        if not isinstance(c, dict):
            return f"candidates[{i}] is not an object"
        problem = _fields_problem(c, _CANDIDATE_FIELDS, f"candidates[{i}].")
        if problem:
            return problem
    return None


def _make_dir(path: Path) -> None:
    """``mkdir -p path``, proof against another process removing it (or a parent) meanwhile;
    OSError when a file is in the way or the location refuses."""
    for attempt in range(3):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except (FileNotFoundError, FileExistsError):
            if attempt == 2 or (os.path.lexists(path) and not os.path.isdir(path)):
                raise


class _Unusable(Exception):
    """The cache file is there but is no cache (the message says why)."""


class AutotuneCache:
    """The persistent JSON cache: ``{"version": 1, "entries": {key: entry}}``.

    Reading trusts nothing that is on disk. The file is read without following a symbolic link
    or blocking on a FIFO, only when it is a regular file of at most :data:`MAX_CACHE_BYTES`
    (:func:`napkin.kernels.cache.read_entry_file`); a file that is not UTF-8 JSON of the right
    shape (or is nested past Python's recursion limit), or is a link, a directory or a FIFO, is
    moved aside (renamed: a link is moved itself, its target untouched) and the cache starts
    afresh; an entry of the wrong schema (:func:`entry_problem`) is left out. Each of these warns
    once, in one line (:class:`AutotuneCacheWarning`); none raises.
    """

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else cache_path()

    # -- reading
    def _read(self) -> bytes:
        """The file's bytes: FileNotFoundError, _Unusable (not a regular file of at most
        MAX_CACHE_BYTES) or another OSError."""
        from ..kernels.cache import BadEntryError, read_entry_file

        try:
            return read_entry_file(self.path, MAX_CACHE_BYTES)
        except BadEntryError as e:
            raise _Unusable(str(e)) from None

    def load(self) -> dict[str, dict]:
        """Every usable entry. A missing file is empty; an unreadable one is ignored (a warning);
        a corrupt one is moved aside (a warning) and empty; entries of the wrong schema are left
        out (a warning)."""
        st = None
        try:
            st = os.lstat(self.path)  # what a move aside may rename: this, and nothing newer
            raw = self._read()
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise _Unusable("not an autotune cache (no 'entries' object)")
            if data.get("version") != CACHE_VERSION:
                raise _Unusable(f"version {_brief(repr(data.get('version')), 40)}, expected {CACHE_VERSION}")
        except FileNotFoundError:
            return {}
        except (_Unusable, ValueError, RecursionError) as e:  # ValueError: UTF-8 and JSON errors
            reason = "nested too deeply" if isinstance(e, RecursionError) else _brief(e)
            aside = self._move_aside(st)
            _warn_once(f"autotune cache {self.path} is corrupt ({reason}); "
                       + (f"moved to {aside} and starting afresh" if aside else "ignoring it"))
            return {}
        except OSError as e:
            _warn_once(f"autotune cache {self.path} unreadable ({_brief(e)}); ignoring it")
            return {}
        entries, bad = {}, []
        for key, entry in data["entries"].items():
            problem = entry_problem(entry)
            if problem is None:
                entries[key] = entry
            else:
                bad.append(f"{_brief(repr(key), 80)}: {problem}")
        if bad:
            _warn_once(f"autotune cache {self.path}: {len(bad)} unusable "
                       f"entr{'y' if len(bad) == 1 else 'ies'} ignored ({_brief('; '.join(bad), 300)})")
        return entries

    def get(self, key: str) -> dict | None:
        entry = self.load().get(key)
        if entry is not None and not isinstance(entry.get("best"), dict):
            return None
        return entry

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.load())

    # -- writing
    def put(self, key: str, entry: dict) -> None:
        """Add or replace one entry (read-modify-write under a file lock, atomic rename)."""
        json.dumps(entry)  # fail before touching the file if the entry is not JSON-able
        with self._lock():
            entries = self.load()
            entries[key] = entry
            self._write({"version": CACHE_VERSION, "entries": entries})

    def remove(self, key: str) -> None:
        with self._lock():
            entries = self.load()
            if entries.pop(key, None) is not None:
                self._write({"version": CACHE_VERSION, "entries": entries})

    def clear(self) -> None:
        with self._lock():
            self._write({"version": CACHE_VERSION, "entries": {}})

    def _write(self, data: dict) -> None:
        """Write the whole cache to a temporary file beside it and rename it into place.

        Another process removing the directory or the temporary file meanwhile, or putting a
        directory where the file belongs, is met by trying again (three tries in all); when it
        spoils every try, this write is dropped with a warning (the cache loses this update, as
        it would to a concurrent clear). Any other failure raises."""
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        error: OSError | None = None
        for _ in range(3):
            _make_dir(self.path.parent)
            tmp = None
            try:
                fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                return
            except (FileNotFoundError, IsADirectoryError) as e:
                self._cleanup(tmp)
                error = e
                if isinstance(e, IsADirectoryError):
                    self._move_aside(None)
            except BaseException:
                self._cleanup(tmp)
                raise
        _warn_once(f"autotune cache {self.path} not written: other processes kept changing it "
                   f"({_brief(error)})", 4)

    @staticmethod
    def _cleanup(tmp: str | None) -> None:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _move_aside(self, seen: os.stat_result | None) -> Path | None:
        """Rename what is at the cache's path (a link itself, not its target) aside; None when
        it is gone, or is no longer what was read (``seen``: another process replaced it)."""
        try:
            now = os.lstat(self.path)
        except OSError:
            return None
        if seen is not None and (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
            return None
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside

    def _open_lock(self) -> int | None:
        """A descriptor of the lock file beside the cache, a regular file opened without
        following a link or blocking; a link, FIFO or empty directory there is removed first.
        None when there is no such file to be had (then writes go unlocked: each is still whole)."""
        lock = self.path.with_name(self.path.name + ".lock")
        flags = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_CLOEXEC", 0))
        for _ in range(3):
            try:
                fd = os.open(lock, flags, 0o644)
            except FileNotFoundError:  # the directory removed meanwhile
                with contextlib.suppress(OSError):
                    _make_dir(self.path.parent)
                continue
            except OSError:
                fd = None
            if fd is not None:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
            try:
                mode = os.lstat(lock).st_mode
            except FileNotFoundError:
                continue
            except OSError:
                break
            if stat.S_ISREG(mode):  # a file this process may not open: leave it be
                break
            try:  # not a regular file: remove it (a link itself, a FIFO, an empty directory)
                if stat.S_ISDIR(mode):
                    os.rmdir(lock)
                else:
                    os.unlink(lock)
            except FileNotFoundError:
                continue
            except OSError:
                break
        _warn_once(f"autotune cache lock {lock} cannot be opened as a file; writing without it", 4)
        return None

    @contextlib.contextmanager
    def _lock(self):
        _make_dir(self.path.parent)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        fd = self._open_lock()
        if fd is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


# ----------------------------------------------------------------------------- tuning


@dataclass
class Candidate:
    """One ranked schedule: the model's prediction and, if measured, the measurement."""

    rank: int                      # 0 = the model's favourite
    schedule: Any = field(repr=False)
    id: str
    desc: str
    pred_s: float
    meas_s: float | None = None
    error: str | None = None

    @property
    def miss(self) -> float | None:
        """(pred − meas) / meas: the model's signed relative miss (negative: too optimistic)."""
        if self.meas_s is None or not self.meas_s > 0 or not math.isfinite(self.pred_s):
            return None
        return (self.pred_s - self.meas_s) / self.meas_s

    def to_dict(self) -> dict:
        return {"rank": self.rank, "id": self.id, "desc": self.desc, "pred_s": _num(self.pred_s),
                "meas_s": _num(self.meas_s), "miss": _num(self.miss), "error": self.error}


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass
class TuneResult:
    """The chosen schedule, its time and prediction, and every candidate looked at."""

    key: str
    schedule: Any
    seconds: float | None            # measured time of the chosen schedule (from the cache on a hit)
    pred_s: float | None
    candidates: list[Candidate]
    from_cache: bool = False
    compiled: Any = field(default=None, repr=False)   # the chosen kernel when it was built here
    spearman: float | None = None    # over the measured candidates
    n_ranked: int = 0

    def to_dict(self) -> dict:
        return {"key": self.key, "best": describe_schedule(self.schedule) if self.schedule is not None else None,
                "best_id": schedule_id(self.schedule) if self.schedule is not None else None,
                "seconds": _num(self.seconds), "pred_s": _num(self.pred_s), "from_cache": self.from_cache,
                "spearman": _num(self.spearman), "n_ranked": self.n_ranked,
                "candidates": [c.to_dict() for c in self.candidates]}


def _codegen_family(diagram) -> str | None:
    """The code-generation family that builds the diagram as one kernel: the first family (in
    lowering's order) whose ``matches`` accepts it, else the library entry's family, else the
    benchmark family's."""
    try:
        from ..codegen import families

        for f in families.available():
            if f.name != "fallback" and f.matches(diagram):
                return f.name
    except Exception:  # noqa: BLE001 - codegen unavailable: the library knows the family
        pass
    try:
        from ..diagrams import library

        if diagram.name in library.names():
            return library.entry(diagram.name).family
    except Exception:  # noqa: BLE001
        pass
    from .baselines import family_of

    fam = family_of(diagram)
    return {"matmul": "contraction", "mlp": "contraction"}.get(fam, fam)


def _prepare(diagram, sizes: dict, dtype: str):
    """The bound diagram in ``dtype``, as codegen prepares it (axes that follow another stay so)."""
    import importlib

    prepare = None
    for mod in ("napkin.codegen.prepare", "napkin.codegen.lower"):
        try:
            prepare = importlib.import_module(mod).prepare
            break
        except (ImportError, AttributeError):
            continue
    if prepare is None:
        d = diagram.bind(sizes) if sizes else diagram
        return d.with_dtype(dtype) if dtype and d.dtypes != {dtype} else d
    return prepare(diagram, sizes=sizes or None, dtype=dtype)


def model_ranking(diagram, family, gpu, dtype: str | None = None) -> list[tuple[Any, float]]:
    """``[(schedule, predicted seconds)]`` best first, for every candidate of ``family``: the
    candidates as ``napkin.codegen.select.rank_candidates`` gives them, each predicted by
    ``napkin.codegen.select.predict_schedule(diagram, family, schedule, gpu)`` (the prediction
    ``napkin cost`` and ``derive`` print, and the one the report re-computes offline), sorted by
    it (ties keep the ranking's order). A candidate the model refuses keeps the ranking's number
    (its local estimate)."""
    from ..codegen.select import predict_schedule, rank_candidates

    out = []
    for i, (s, p) in enumerate(rank_candidates(diagram, family, gpu, dtype)):
        try:
            p = float(predict_schedule(diagram, family, s, gpu).seconds)
        except Exception:  # noqa: BLE001 - refused by the cost model: keep the ranking's estimate
            p = float(p)
        out.append((p, i, s))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(s, p) for p, _, s in out]


def _default_gpu_name(gpu) -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except ImportError:  # pragma: no cover
        pass
    return str(getattr(gpu, "name", gpu))


def _default_measure(diagram, dtype, warmup: int, reps: int) -> Callable[[Any], float]:
    from .timing import diagram_inputs, make_rotating_inputs, time_fn

    sets: list = []

    def measure(kernel) -> float:
        if not sets:
            sets.extend(make_rotating_inputs(lambda i: diagram_inputs(diagram, dtype, seed=i), max_sets=8))
        return time_fn(kernel, warmup=warmup, reps=reps, rotate=sets, max_time_s=2.0).median_s

    return measure


def tune(
    diagram,
    *,
    gpu: Any,
    sizes: Mapping[str, int] | None = None,
    dtype: str = "bf16",
    k: int = DEFAULT_TOP_K,
    family: str | None = None,
    cache: AutotuneCache | None = None,
    use_cache: bool = True,
    force: bool = False,
    gpu_name: str | None = None,
    rank: Callable[[], Sequence[tuple[Any, float]]] | None = None,
    build: Callable[[Any], Any] | None = None,
    measure: Callable[[Any], float] | None = None,
    warmup: int = 5,
    reps: int = 30,
    keep_compiled: bool = True,
) -> TuneResult:
    """Rank with the model, measure the top ``k``, keep the fastest, cache the choice.

    gpu:      what codegen and the model are told (a profile name such as ``"h100"`` or a GPU);
    gpu_name: the cache's GPU key (default: the CUDA device's name);
    rank:     ``() -> [(schedule, predicted_seconds)]`` best first (default: :func:`model_ranking`,
              every candidate of the family predicted by ``napkin.codegen.select.predict_schedule``,
              the number ``napkin cost`` and ``derive`` print);
    build:    ``schedule -> callable kernel`` (default: ``napkin.codegen.compile``);
    measure:  ``kernel -> seconds`` (default: CUDA-event median on rotated random inputs).
    A candidate whose build or measurement fails is recorded with its error and skipped; if none
    succeeds, AutotuneError. On a cache hit nothing is measured: the cached schedule is looked up
    among the ranked candidates by its id (re-tuned if the model no longer proposes it).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    sizes = dict(sizes or {})
    bound = _prepare(diagram, sizes, dtype)
    fam = family if family is not None else _codegen_family(bound)
    cache = cache if cache is not None else AutotuneCache()
    key = cache_key(gpu_name or _default_gpu_name(gpu), bound, bound.sizes, dtype)

    if rank is None:
        def rank():
            return model_ranking(bound, fam, gpu, dtype)
    if build is None:
        from ..codegen import compile as _compile

        def build(schedule):
            if isinstance(fam, str):
                return _compile(diagram, gpu=gpu, sizes=sizes, dtype=dtype, schedule=schedule, family=fam)
            return _compile(diagram, gpu=gpu, sizes=sizes, dtype=dtype, schedule=schedule)
    if measure is None:
        measure = _default_measure(bound, dtype, warmup, reps)

    ranked = [(s, float(p)) for s, p in rank()]
    if not ranked:
        raise AutotuneError(f"the model proposed no schedule for {bound.name} {_sizes_str(bound.sizes)} {dtype}")
    cands = [Candidate(i, s, schedule_id(s), describe_schedule(s), p) for i, (s, p) in enumerate(ranked)]

    if use_cache and not force:
        entry = cache.get(key)
        if entry is not None:
            want = entry["best"].get("id")
            for c in cands:
                if c.id == want:
                    stored = [Candidate(int(d.get("rank", -1)), None, str(d.get("id")), str(d.get("desc", "")),
                                        float(d["pred_s"]) if d.get("pred_s") is not None else math.nan,
                                        d.get("meas_s"), d.get("error"))
                              for d in entry.get("candidates", []) if isinstance(d, dict)]
                    return TuneResult(key, c.schedule, entry["best"].get("meas_s"), c.pred_s, stored,
                                      from_cache=True, spearman=entry.get("spearman"),
                                      n_ranked=int(entry.get("n_ranked", len(cands))))

    best_kernel = None
    best: Candidate | None = None
    for c in cands[:k]:
        try:
            kernel = build(c.schedule)
            c.meas_s = float(measure(kernel))
            if not (c.meas_s > 0 and math.isfinite(c.meas_s)):
                raise ValueError(f"measured {c.meas_s!r} s")
        except Exception as e:  # a candidate that fails must not stop the search
            c.meas_s = None
            c.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            continue
        if best is None or c.meas_s < best.meas_s:
            best, best_kernel = c, (kernel if keep_compiled else None)
        elif not keep_compiled:
            del kernel
    measured = [c for c in cands[:k] if c.meas_s is not None]
    if best is None:
        errs = "; ".join(f"#{c.rank} {c.desc}: {c.error}" for c in cands[:k])
        raise AutotuneError(f"no candidate of {bound.name} could be built and measured: {errs}")
    rho = spearman([c.pred_s for c in measured], [c.meas_s for c in measured]) if len(measured) >= 2 else math.nan

    entry = {
        "gpu": key.split("|", 1)[0], "diagram": bound.name, "diagram_hash": diagram_hash(bound),
        "sizes": {n: int(v) for n, v in bound.sizes.items()}, "dtype": dtype, "family": fam,
        "best": {"id": best.id, "desc": best.desc, "signature": schedule_signature(best.schedule),
                 "pred_s": _num(best.pred_s), "meas_s": best.meas_s, "model_rank": best.rank},
        "candidates": [c.to_dict() for c in cands[:k]],
        "spearman": _num(rho), "n_ranked": len(cands), "k": k,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if use_cache:
        try:
            cache.put(key, entry)
        except OSError as e:  # the measurement stands; only remembering it failed
            _warn_once(f"autotune cache {cache.path} not written ({_brief(e)}); this choice is not kept", 2)
    return TuneResult(key, best.schedule, best.meas_s, best.pred_s, cands[:k], from_cache=False,
                      compiled=best_kernel, spearman=_num(rho), n_ranked=len(cands))


def calibration_records(cache: AutotuneCache | None = None) -> list[dict]:
    """Every measured candidate in the cache as a flat record (gpu, diagram, sizes, dtype, schedule,
    pred_s, meas_s, miss) — the model's misses, for calibration."""
    cache = cache if cache is not None else AutotuneCache()
    out = []
    for key, e in cache.load().items():
        for c in e.get("candidates", []):
            if not isinstance(c, dict) or c.get("meas_s") is None or c.get("pred_s") is None:
                continue
            out.append({"key": key, "gpu": e.get("gpu"), "diagram": e.get("diagram"), "sizes": e.get("sizes"),
                        "dtype": e.get("dtype"), "family": e.get("family"), "schedule": c.get("desc"),
                        "rank": c.get("rank"), "pred_s": c["pred_s"], "meas_s": c["meas_s"],
                        "miss": (c["pred_s"] - c["meas_s"]) / c["meas_s"] if c["meas_s"] else None})
    return out
