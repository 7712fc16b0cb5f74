"""A disk cache of compiled kernels, keyed by what determines the binary.

The key is the sha256 of (source, options, GPU arch, napkin version) plus any extra identity the
compiler adds (its own version). Each entry is one file ``<key>.cubin`` holding a header line and
the payload::

    NAPKIN-KERNEL-CACHE 1 <key> <sha256 of payload> <payload length>\\n<payload>

An entry is used only when the header's key, length and checksum all match, so a truncated or
corrupted file is compiled again (and rewritten), never loaded. Entries are written to a temporary
file in the same directory and moved into place with ``os.replace``: several processes that
compile the same key at once each write a whole file and the last rename wins, so no reader ever
sees half an entry. Where the directory cannot be created or written (read-only file system,
missing permission) the cache warns once, in one line, and keeps compiled payloads in memory for
the rest of the process.

The directory is ``$NAPKIN_CACHE_DIR`` when set, else ``~/.cache/napkin/kernels``.

Pure Python: the compile step is a function passed in, so the behaviour is testable without a GPU.

>>> import tempfile
>>> cache = KernelCache(tempfile.mkdtemp())
>>> cache.get_or_compile("src", ("-O3",), "sm_80", lambda: b"binary")
b'binary'
>>> cache.get_or_compile("src", ("-O3",), "sm_80", lambda: b"never called")
b'binary'
>>> (cache.stats.misses, cache.stats.hits)
(1, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NAPKIN-KERNEL-CACHE"
FORMAT_VERSION = 1
SUFFIX = ".cubin"


class KernelCacheWarning(UserWarning):
    """The kernel cache directory cannot be used; kernels are compiled in memory instead."""


def default_cache_dir() -> Path:
    """``$NAPKIN_CACHE_DIR`` if set (read at each call), else ``~/.cache/napkin/kernels``."""
    env = os.environ.get("NAPKIN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "napkin" / "kernels"


def napkin_version() -> str:
    from napkin import __version__

    return __version__


def cache_key(source: str, options: Iterable[str] = (), arch: str = "",
              version: str | None = None, extra: Iterable[str] = ()) -> str:
    """The hex sha256 identifying one compiled binary.

    >>> cache_key("a", ("-O3",), "sm_80", "0.1") == cache_key("a", ["-O3"], "sm_80", "0.1")
    True
    >>> cache_key("a", (), "sm_80", "0.1") == cache_key("a", (), "sm_90a", "0.1")
    False
    """
    record = {
        "source": source,
        "options": [str(o) for o in options],
        "arch": arch,
        "napkin": napkin_version() if version is None else version,
        "extra": [str(e) for e in extra],
    }
    blob = json.dumps(record, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def encode_entry(key: str, payload: bytes) -> bytes:
    """The bytes of a cache file for ``payload`` under ``key``."""
    digest = hashlib.sha256(payload).hexdigest()
    header = f"{MAGIC.decode()} {FORMAT_VERSION} {key} {digest} {len(payload)}\n"
    return header.encode("ascii") + payload


def decode_entry(key: str, data: bytes) -> bytes | None:
    """The payload of a cache file, or None when the file is not a whole, intact entry for key."""
    end = data.find(b"\n", 0, 512)
    if end < 0:
        return None
    try:
        magic, version, entry_key, digest, length = data[:end].decode("ascii").split(" ")
        length_n = int(length)
    except (UnicodeDecodeError, ValueError):
        return None
    if magic != MAGIC.decode() or version != str(FORMAT_VERSION) or entry_key != key:
        return None
    payload = data[end + 1:]
    if len(payload) != length_n or hashlib.sha256(payload).hexdigest() != digest:
        return None
    return payload


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass
class CacheStats:
    """What a cache has done since it was made (for tests and diagnostics)."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    write_failures: int = 0


class KernelCache:
    """Compiled kernels on disk under ``directory`` (default: :func:`default_cache_dir`).

    ``writer(path, data)`` stores one entry (default: :func:`atomic_write`); ``reader(path)``
    returns a file's bytes. Both exist so that tests can inject failures.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *,
                 version: str | None = None,
                 writer: Callable[[Path, bytes], None] | None = None,
                 reader: Callable[[Path], bytes] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.version = version
        self._writer = writer or atomic_write
        self._reader = reader or (lambda p: p.read_bytes())
        self._memory: dict[str, bytes] = {}
        self._disk_ok = True
        self._warned = False
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def key(self, source: str, options: Iterable[str] = (), arch: str = "",
            extra: Iterable[str] = ()) -> str:
        return cache_key(source, options, arch, self.version, extra)

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The cached payload for ``key``: from memory, else from an intact disk entry, else None."""
        if key in self._memory:
            return self._memory[key]
        path = self.path_for(key)
        try:
            data = self._reader(path)
        except FileNotFoundError:
            return None
        except OSError:
            return None
        payload = decode_entry(key, data)
        if payload is None:
            self.stats.corrupt += 1
        return payload

    def store(self, key: str, payload: bytes) -> bool:
        """Keep ``payload`` under ``key``; False when only memory could take it."""
        with self._lock:
            self._memory[key] = payload
        if not self._disk_ok:
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer(self.path_for(key), encode_entry(key, payload))
        except OSError as e:
            self.stats.write_failures += 1
            self._disk_ok = False
            self._warn(e)
            return False
        return True

    def _warn(self, error: OSError) -> None:
        if self._warned:
            return
        self._warned = True
        reason = error.strerror or type(error).__name__
        warnings.warn(
            f"napkin: kernel cache {self.directory} is not writable ({reason}); "
            f"compiling kernels in memory for this process",
            KernelCacheWarning, stacklevel=4)

    def get_or_compile(self, source: str, options: Iterable[str], arch: str,
                       compile_fn: Callable[[], bytes], extra: Iterable[str] = ()) -> bytes:
        """The payload for (source, options, arch, extra): cached, or ``compile_fn()`` stored."""
        options = tuple(options)
        key = self.key(source, options, arch, extra)
        payload = self.load(key)
        if payload is not None:
            self.stats.hits += 1
            with self._lock:
                self._memory[key] = payload
            return payload
        self.stats.misses += 1
        payload = compile_fn()
        if not isinstance(payload, (bytes, bytearray)):
            raise TypeError(f"compile function returned {type(payload).__name__}, not bytes")
        payload = bytes(payload)
        self.store(key, payload)
        return payload

    def clear(self) -> int:
        """Remove every entry (and stray temporary file) from the directory; returns the count."""
        self._memory.clear()
        removed = 0
        if not self.directory.is_dir():
            return 0
        for p in self.directory.iterdir():
            if p.suffix == SUFFIX or (p.name.startswith(".") and p.name.endswith(".tmp")):
                try:
                    p.unlink()
                    removed += 1
                except OSError:
                    pass
        return removed


_default_caches: dict[Path, KernelCache] = {}
_default_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache for the current :func:`default_cache_dir` (one per directory)."""
    directory = default_cache_dir()
    with _default_lock:
        cache = _default_caches.get(directory)
        if cache is None:
            cache = _default_caches[directory] = KernelCache(directory)
        return cache
