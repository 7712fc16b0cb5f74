"""A disk cache of compiled kernels, keyed by what determines the binary.

The key is the sha256 of (source, options, GPU arch, napkin version) plus any extra identity the
compiler adds (its own version). Each entry is one file ``<key>.cubin`` holding a header line and
the payload::

    NAPKIN-KERNEL-CACHE 1 <key> <sha256 of payload> <payload length>\\n<payload>

An entry is used only when the header's key, length and checksum all match, so a truncated or
corrupted file is compiled again (and rewritten), never loaded. Entries are written to a temporary
file in the same directory and moved into place with ``os.replace``: several processes that
compile the same key at once each write a whole file and the last rename wins, so no reader ever
sees half an entry.

The directory is shared and may hold anything, so reading an entry trusts nothing
(:func:`read_entry_file`): it is opened without following a symbolic link (``O_NOFOLLOW``) and
without blocking (``O_NONBLOCK``, so a FIFO cannot hang the reader), it must be a regular file
(``os.fstat``), and at most :data:`MAX_ENTRY_BYTES` + 1 bytes are read. A bad entry (a link, a
directory, a FIFO, an oversize, truncated or garbled file) is a miss for that one key and never
turns the cache off: it is noted in one line of the ``napkin.kernels.cache`` log (INFO the first
time, DEBUG after; not a warning), a link or special file is unlinked (the link itself, never its
target), an empty directory removed, and the fresh compile is written over it.

Another process may empty the directory (:meth:`KernelCache.clear`) or delete it while an entry
is written: the directory is made again and the write retried once, and if that fails too only
that entry is lost. Only a location that cannot be used at all (the directory cannot be created,
or writing in it is refused: ``EACCES``, ``EPERM``, ``EROFS``) turns the disk cache off; it then
warns once, in one line naming the directory and the OS error, and keeps compiled payloads in
memory for the rest of the process.

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

import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NAPKIN-KERNEL-CACHE"
FORMAT_VERSION = 1
SUFFIX = ".cubin"

#: The largest cache file read or written, header included: a cubin or PTX is at most some tens
#: of MB, so a bigger file is not an entry (and is never read whole).
MAX_ENTRY_BYTES = 64 * 1024 * 1024

_log = logging.getLogger(__name__)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = (os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
#: What open(O_NOFOLLOW) says about a symbolic link (ELOOP on Linux and macOS, EMLINK on FreeBSD).
_LINK_ERRNOS = {errno.ELOOP, getattr(errno, "EMLINK", errno.ELOOP)}
#: Write errors that mean the directory itself refuses writes: they turn the disk cache off.
_UNWRITABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
#: Write errors caused by what another process did to the directory or put in an entry's place:
#: they cost one entry (after one retry), quietly.
_RACE_ERRNOS = {errno.ENOENT, errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST}


class KernelCacheWarning(UserWarning):
    """The kernel cache directory cannot be used; kernels are compiled in memory instead."""


class BadEntryError(ValueError):
    """A cache file that is not an entry: a link, a directory, a FIFO or device, or too big."""


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


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_entry_file(path: str | os.PathLike, max_bytes: int = MAX_ENTRY_BYTES) -> bytes:
    """The bytes of the regular file ``path``, read without trusting what is there.

    A symbolic link is not followed, nothing but a regular file is opened for reading (a FIFO is
    opened non-blocking and refused before any read), and at most ``max_bytes`` + 1 bytes are
    read: anything else raises :class:`BadEntryError`. A missing file raises FileNotFoundError,
    other failures their OSError.
    """
    path = os.fspath(path)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):  # refused before open(): a device is never even opened
        raise BadEntryError(_kind(st.st_mode))
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as e:
        if _NOFOLLOW and e.errno in _LINK_ERRNOS:  # became a link after the lstat
            raise BadEntryError("a symbolic link") from None
        if e.errno == errno.EISDIR:
            raise BadEntryError("a directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadEntryError(_kind(st.st_mode))
        if st.st_size > max_bytes:
            raise BadEntryError(f"{st.st_size} bytes, over the limit of {max_bytes}")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise BadEntryError(f"more than {max_bytes} bytes, over the limit")
        return b"".join(chunks)
    finally:
        os.close(fd)


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


def _discard_odd(path: Path) -> None:
    """Remove what sits at ``path`` when it is not a regular file: a link (the link itself, never
    its target), a FIFO or socket, an empty directory. A regular file is left alone: it may be a
    good entry another process has just renamed into place."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(path)
        elif not stat.S_ISREG(st.st_mode):
            os.unlink(path)
    except OSError:
        pass


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror + (f": {os.fspath(error.filename)!s}" if error.filename else "")
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


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
    returns a file's bytes (default: :func:`read_entry_file` with ``max_entry_bytes``). Both exist
    so that tests can inject failures.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *,
                 version: str | None = None,
                 writer: Callable[[Path, bytes], None] | None = None,
                 reader: Callable[[Path], bytes] | None = None,
                 max_entry_bytes: int = MAX_ENTRY_BYTES) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.version = version
        self.max_entry_bytes = int(max_entry_bytes)
        self._writer = writer or atomic_write
        self._reader = reader or (lambda p: read_entry_file(p, self.max_entry_bytes))
        self._memory: dict[str, bytes] = {}
        self._disk_ok = True
        self._warned = False
        self._warned_write = False
        self._noted = False
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def key(self, source: str, options: Iterable[str] = (), arch: str = "",
            extra: Iterable[str] = ()) -> str:
        return cache_key(source, options, arch, self.version, extra)

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The cached payload for ``key``: from memory, else from an intact disk entry, else None.

        Never raises for what is on disk: a missing, unreadable or bad entry is a miss."""
        with self._lock:
            payload = self._memory.get(key)
        if payload is not None:
            return payload
        path = self.path_for(key)
        try:
            data = self._reader(path)
        except FileNotFoundError:
            return None
        except BadEntryError as e:
            self._bad_entry(path, str(e))
            _discard_odd(path)
            return None
        except OSError:  # unreadable (permission, I/O error, the directory gone): a plain miss
            return None
        if not isinstance(data, (bytes, bytearray)) or len(data) > self.max_entry_bytes:
            self._bad_entry(path, "not the bytes of an entry")
            return None
        payload = decode_entry(key, bytes(data))
        if payload is None:
            self._bad_entry(path, "not a whole entry for its key (truncated, garbled or another's)")
        return payload

    def _bad_entry(self, path: Path, reason: str) -> None:
        self.stats.corrupt += 1
        self._note(f"napkin: kernel cache entry {path} is unusable ({reason}); compiling it again")

    def _note(self, message: str) -> None:
        """One quiet line in the log: INFO the first time for this cache, DEBUG after."""
        level = logging.DEBUG if self._noted else logging.INFO
        self._noted = True
        _log.log(level, "%s", message)

    def store(self, key: str, payload: bytes) -> bool:
        """Keep ``payload`` under ``key``; False when only memory could take it."""
        with self._lock:
            self._memory[key] = payload
        if not self._disk_ok:
            return False
        data = encode_entry(key, payload)
        path = self.path_for(key)
        if len(data) > self.max_entry_bytes:
            self.stats.write_failures += 1
            self._note(f"napkin: kernel cache entry {path} would be {len(data)} bytes, more than "
                       f"the {self.max_entry_bytes} an entry may have; kept in memory")
            return False
        error, unusable = self._write(path, data)
        if error is None:
            return True
        self.stats.write_failures += 1
        if unusable:
            self._disk_ok = False
            self._warn(error)
        elif error.errno in _RACE_ERRNOS:
            self._note(f"napkin: kernel cache entry {path} not written ({_one_line(error)}); "
                       f"kept in memory")
        elif not self._warned_write:
            self._warned_write = True
            warnings.warn(f"napkin: could not write kernel cache entry {path} "
                          f"({_one_line(error)}); it is kept in memory for this process",
                          KernelCacheWarning, stacklevel=3)
        return False

    def _write(self, path: Path, data: bytes) -> tuple[OSError | None, bool]:
        """Write one entry, making the directory first; once more when what another process did
        (emptied or removed the directory, put something in the entry's place) spoiled the first
        try. ``(None, False)`` when written, else the error and whether it shows the location
        unusable (the directory cannot be made, or writing in it is refused)."""
        error: OSError | None = None
        for _ in range(2):
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as e:
                # ENOENT: a parent removed while it was made; EEXIST with no file in the way:
                # made and removed again meanwhile. Both are another process's doing: try again.
                in_the_way = os.path.lexists(self.directory) and not os.path.isdir(self.directory)
                if e.errno not in (errno.ENOENT, errno.EEXIST) or in_the_way:
                    return e, True
                error = e
                continue
            try:
                self._writer(path, data)
                return None, False
            except OSError as e:
                if e.errno not in _RACE_ERRNOS:
                    return e, e.errno in _UNWRITABLE_ERRNOS
                error = e
                _discard_odd(path)  # a directory, link or FIFO in the entry's place
        return error, False

    def _warn(self, error: OSError) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"napkin: kernel cache {self.directory} is not writable ({_one_line(error)}); "
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
        """Remove every entry (and stray temporary file) from the directory; returns the count.

        Links are removed themselves (never their targets), directories only when empty; a
        directory that is missing or vanishes meanwhile is simply empty."""
        with self._lock:
            self._memory.clear()
        removed = 0
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        for name in names:
            if not (name.endswith(SUFFIX) or (name.startswith(".") and name.endswith(".tmp"))):
                continue
            path = self.directory / name
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    os.rmdir(path)
                else:
                    os.unlink(path)
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
