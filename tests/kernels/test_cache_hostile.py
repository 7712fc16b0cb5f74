"""The kernel disk cache in a hostile directory: links, FIFOs, directories, oversize and garbled
entries, another process clearing or deleting the directory, and several processes storing,
reading, clearing and corrupting at once.

Every read of a hostile entry runs in a child process with a time limit and a memory limit, so
that a cache that follows a link to /dev/zero or opens a FIFO fails the test instead of hanging
(or exhausting) the machine running it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
from napkin_test_support import run_child, run_roles

from napkin.kernels import cache as cache_mod
from napkin.kernels.cache import KernelCache, KernelCacheWarning, decode_entry, encode_entry

POSIX = os.name == "posix"
needs_posix = pytest.mark.skipif(not POSIX, reason="symlinks, FIFOs and /dev/zero are POSIX")


def _child(script: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_child(script, *args, timeout=timeout, what="the cache, on a hostile entry,")


# ----------------------------------------------------------------------------- hostile entries

HOSTILE = ["link_to_dev_zero", "link_to_fifo", "link_to_outside_file", "fifo", "directory",
           "nonempty_directory", "oversize", "truncated", "garbage"]

#: Checks one hostile entry from inside a child: the entry is a miss, noted once in the log and
#: never warned about, compiled again, and the cache keeps storing and loading other entries.
_CHECK = """
import json, logging, sys, warnings
from napkin.kernels.cache import KernelCache, decode_entry

directory, max_bytes = sys.argv[1], int(sys.argv[2])
limit = {"max_entry_bytes": max_bytes} if max_bytes else {}   # 0: the default limit
notes = []
class Keep(logging.Handler):
    def emit(self, record):
        notes.append((record.levelno, record.getMessage()))
log = logging.getLogger("napkin.kernels.cache")
log.addHandler(Keep())
log.setLevel(logging.DEBUG)
warnings.simplefilter("error")   # a warning (say, "not writable") fails the check

cache = KernelCache(directory, **limit)
key = cache.key("src", (), "sm_80")
miss = cache.load(key)
calls = []
def compile_fn():
    calls.append(1)
    return b"GOOD" * 1000
got = cache.get_or_compile("src", (), "sm_80", compile_fn)
notes_of_this_cache = list(notes)
other = KernelCache(directory, **limit)   # a fresh process, nothing in memory
other.store(other.key("b", (), "sm_80"), b"other payload")
print(json.dumps({
    "miss": miss is None, "compiled": len(calls), "got": got == b"GOOD" * 1000,
    "corrupt": cache.stats.corrupt, "notes": notes_of_this_cache,
    "reload": KernelCache(directory, **limit).load(key) == b"GOOD" * 1000,
    "other": KernelCache(directory).load(other.key("b", (), "sm_80")) == b"other payload",
    "other_entry_written": decode_entry(other.key("b", (), "sm_80"),
                                        open(other.path_for(other.key("b", (), "sm_80")), "rb").read())
                           == b"other payload",
}))
"""


def _make_hostile(kind: str, directory: Path, outside: Path, max_bytes: int) -> Path:
    """Put a ``kind`` of hostile thing where the entry of ("src", (), "sm_80") belongs."""
    cache = KernelCache(directory)
    key = cache.key("src", (), "sm_80")
    path = cache.path_for(key)
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "link_to_dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "link_to_fifo":
        os.mkfifo(outside / "fifo")
        os.symlink(outside / "fifo", path)
    elif kind == "link_to_outside_file":
        # A whole, valid entry for this very key, but outside the cache: still not to be used.
        (outside / "planted.cubin").write_bytes(encode_entry(key, b"PLANTED"))
        os.symlink(outside / "planted.cubin", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "nonempty_directory":
        path.mkdir()
        (path / "inside").write_text("someone's file")
    elif kind == "oversize":
        # A valid entry, but bigger than an entry may be.
        path.write_bytes(encode_entry(key, b"B" * (2 * max_bytes)))
    elif kind == "truncated":
        path.write_bytes(encode_entry(key, b"GOOD" * 1000)[:-100])
    elif kind == "garbage":
        path.write_bytes(os.urandom(3000))
    return path


@needs_posix
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_entry_is_a_miss_and_the_cache_keeps_working(tmp_path, kind):
    directory, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    max_bytes = 64 * 1024 if kind == "oversize" else 0  # else the default limit
    path = _make_hostile(kind, directory, outside, max_bytes)
    p = _child(_CHECK, str(directory), str(max_bytes))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["miss"], "a hostile entry was loaded"
    assert r["compiled"] == 1 and r["got"]
    assert r["corrupt"] >= 1
    info = [m for level, m in r["notes"] if level >= logging.INFO]
    assert len(info) == 1 and "\n" not in info[0] and str(path) in info[0], r["notes"]
    assert r["other"] and r["other_entry_written"], "the cache stopped working for other entries"
    if kind == "nonempty_directory":  # someone's directory is neither removed nor replaced
        assert (path / "inside").read_text() == "someone's file"
    else:  # the fresh compile took the entry's place, and the next process loads it
        assert r["reload"]
        assert path.is_file() and not path.is_symlink()
    # Nothing outside the cache was followed, changed or removed.
    if kind == "link_to_outside_file":
        key = KernelCache(directory).key("src", (), "sm_80")
        assert (outside / "planted.cubin").read_bytes() == encode_entry(key, b"PLANTED")
    if kind == "link_to_fifo":
        assert (outside / "fifo").exists()
    assert os.path.exists("/dev/zero")


@needs_posix
def test_a_read_never_takes_more_than_max_bytes_plus_one(tmp_path, monkeypatch):
    """An entry that grows while it is read is still cut off at max + 1 bytes."""
    cache = KernelCache(tmp_path, max_entry_bytes=1000)
    key = cache.key("src", (), "sm_80")
    cache.path_for(key).write_bytes(b"x" * 10)
    real_read, asked = os.read, []

    def read(fd, n):
        asked.append(n)
        return b"y" * n  # a file that never ends

    monkeypatch.setattr(cache_mod.os, "read", read)
    assert cache.load(key) is None
    monkeypatch.setattr(cache_mod.os, "read", real_read)
    assert sum(asked) == 1001
    assert cache.stats.corrupt == 1


def test_an_oversize_payload_stays_in_memory_and_the_cache_stays_on(tmp_path):
    cache = KernelCache(tmp_path, max_entry_bytes=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.store(cache.key("big", (), "sm_80"), b"B" * 10_000) is False
        assert cache.load(cache.key("big", (), "sm_80")) == b"B" * 10_000  # from memory
        assert cache.store(cache.key("small", (), "sm_80"), b"S" * 100) is True
    assert KernelCache(tmp_path).load(cache.key("small", (), "sm_80")) == b"S" * 100
    assert not cache.path_for(cache.key("big", (), "sm_80")).exists()


# ----------------------------------------------------------------------------- another process's clear()


def test_directory_deleted_while_an_entry_is_written(tmp_path):
    """Another process removes the whole directory between our mkdir and our write: the write
    makes it again and succeeds, with no warning; later stores still reach the disk."""
    directory = tmp_path / "kernels"
    deleted = []

    def writer(path, data):
        if not deleted:
            deleted.append(1)
            shutil.rmtree(directory)
        cache_mod.atomic_write(path, data)

    cache = KernelCache(directory, writer=writer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.store(cache.key("a", (), "sm_80"), b"first") is True
        assert KernelCache(directory).load(cache.key("a", (), "sm_80")) == b"first"
        shutil.rmtree(directory)  # ... and once more between two stores
        assert cache.store(cache.key("b", (), "sm_80"), b"second") is True
    assert KernelCache(directory).load(cache.key("b", (), "sm_80")) == b"second"
    assert cache.stats.write_failures == 0


def test_another_process_clearing_the_directory_mid_write(tmp_path, monkeypatch):
    """clear() in another process removes our temporary file before the rename: the entry is
    written again, the cache stays on, and nothing warns that the directory is not writable."""
    real_replace, cleared = os.replace, []

    def replace(src, dst):
        if not cleared:
            cleared.append(KernelCache(tmp_path).clear())  # takes our .tmp file with it
        return real_replace(src, dst)

    monkeypatch.setattr(cache_mod.os, "replace", replace)
    cache = KernelCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get_or_compile("a", (), "sm_80", lambda: b"AAAA") == b"AAAA"
        assert cache.get_or_compile("b", (), "sm_80", lambda: b"BBBB") == b"BBBB"
    monkeypatch.undo()
    assert cleared == [1]
    fresh = KernelCache(tmp_path)
    assert fresh.load(cache.key("a", (), "sm_80")) == b"AAAA"
    assert fresh.load(cache.key("b", (), "sm_80")) == b"BBBB"


def test_a_clear_every_time_costs_that_entry_only(tmp_path, monkeypatch):
    """Even when the retry is spoiled too, only that entry is lost: no warning, and the next
    store reaches the disk."""
    real_replace, spoil = os.replace, [2]

    def replace(src, dst):
        if spoil[0]:
            spoil[0] -= 1
            os.unlink(src)
        return real_replace(src, dst)

    monkeypatch.setattr(cache_mod.os, "replace", replace)
    cache = KernelCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.store(cache.key("a", (), "sm_80"), b"AAAA") is False
        assert cache.store(cache.key("b", (), "sm_80"), b"BBBB") is True
    monkeypatch.undo()
    assert cache.load(cache.key("a", (), "sm_80")) == b"AAAA"  # kept in memory
    assert KernelCache(tmp_path).load(cache.key("b", (), "sm_80")) == b"BBBB"
    assert cache.stats.write_failures == 1


@pytest.mark.skipif(not POSIX or os.geteuid() == 0, reason="needs POSIX permissions, not root")
def test_a_truly_unwritable_directory_warns_once_naming_path_and_error(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        cache = KernelCache(directory)
        with pytest.warns(KernelCacheWarning) as record:
            cache.get_or_compile("a", (), "sm_80", lambda: b"A")
            cache.get_or_compile("b", (), "sm_80", lambda: b"B")
        assert len(record) == 1
        message = str(record[0].message)
        assert str(directory) in message and "Permission denied" in message and "\n" not in message
    finally:
        directory.chmod(0o700)


@needs_posix
def test_clear_removes_links_not_their_targets(tmp_path):
    directory, outside = tmp_path / "cache", tmp_path / "outside"
    directory.mkdir()
    outside.mkdir()
    (outside / "precious.cubin").write_bytes(b"precious")
    os.symlink(outside / "precious.cubin", directory / ("a" * 64 + ".cubin"))
    os.symlink(outside, directory / ("b" * 64 + ".cubin"))
    (directory / ("c" * 64 + ".cubin")).mkdir()
    assert KernelCache(directory).clear() == 3
    assert list(directory.iterdir()) == []
    assert (outside / "precious.cubin").read_bytes() == b"precious"
    shutil.rmtree(directory)
    assert KernelCache(directory).clear() == 0  # a missing directory is empty


# ----------------------------------------------------------------------------- many processes at once

_WORKER = r"""
import hashlib, json, os, random, shutil, sys, time, warnings
from pathlib import Path
from napkin.kernels.cache import KernelCache, encode_entry

warnings.simplefilter("error")          # "not writable" (or any warning) fails the worker
role, directory, outside, seed, seconds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = random.Random(seed)
srcs = [f"source {i}" for i in range(8)]
def payload(i):
    return hashlib.sha256(f"payload {i}".encode()).digest() * (200 + 97 * i)
keys = [KernelCache(directory).key(s, (), "sm_80") for s in srcs]
deadline = time.monotonic() + seconds
counts = {"hits": 0, "misses": 0, "stores": 0, "clears": 0, "damages": 0, "wrong": 0}

def damage(path, i):
    tmp = directory / f"evil-{os.getpid()}-{rng.random()}"
    what = rng.choice(["zero", "fifo", "outside", "garbage", "truncated", "other_key", "dir",
                       "own_fifo"])
    try:
        if what == "zero":
            os.symlink("/dev/zero", tmp)
        elif what == "fifo":
            os.symlink(outside / "fifo", tmp)
        elif what == "outside":
            os.symlink(outside / f"planted-{i}.cubin", tmp)
        elif what == "garbage":
            tmp.write_bytes(os.urandom(rng.randint(0, 5000)))
        elif what == "truncated":
            tmp.write_bytes(encode_entry(keys[i], payload(i))[:rng.randint(0, 4000)])
        elif what == "other_key":
            tmp.write_bytes(encode_entry(keys[(i + 1) % 8], payload((i + 1) % 8)))
        elif what == "own_fifo":
            os.mkfifo(tmp)
        elif what == "dir":
            try:
                os.unlink(path)
            except OSError:
                pass
            os.mkdir(path)
            return
        os.replace(tmp, path)
    except OSError:        # the directory was cleared under us: the corrupter's own trouble
        try:
            os.unlink(tmp)
        except OSError:
            pass

while time.monotonic() < deadline:
    i = rng.randrange(8)
    if role == "clearer":
        if rng.random() < 0.2:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            KernelCache(directory).clear()
        counts["clears"] += 1
        time.sleep(0.01)
    elif role == "corrupter":
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:    # made and removed by the clearer meanwhile
            pass
        damage(KernelCache(directory).path_for(keys[i]), i)
        counts["damages"] += 1
        time.sleep(0.002)
    else:
        cache = KernelCache(directory)   # nothing in memory: disk only
        if rng.random() < 0.5:
            got = cache.get_or_compile(srcs[i], (), "sm_80", lambda: payload(i))
            counts["stores"] += cache.stats.misses
        else:
            got = cache.load(keys[i])
        if got is None:
            counts["misses"] += 1
        elif got == payload(i):
            counts["hits"] += 1
        else:
            counts["wrong"] += 1
print(json.dumps(counts))
"""


def _payload(i: int) -> bytes:
    """What the workers store under key i (the same in every process)."""
    return hashlib.sha256(f"payload {i}".encode()).digest() * (200 + 97 * i)


@needs_posix
def test_many_processes_storing_reading_clearing_and_corrupting(tmp_path):
    """Four processes store and read, one clears (and sometimes deletes the directory), one puts
    links, FIFOs, directories and garbage in entries' places, all at once for a few seconds. No
    process raises or warns, every read gives the payload stored for its key or nothing, and
    afterwards the cache works."""
    directory, outside = tmp_path / "cache", tmp_path / "outside"
    directory.mkdir()
    outside.mkdir()
    os.mkfifo(outside / "fifo")
    probe = KernelCache(directory)
    for i in range(8):  # valid entries for each key, but with the wrong payload, outside
        key = probe.key(f"source {i}", (), "sm_80")
        (outside / f"planted-{i}.cubin").write_bytes(encode_entry(key, b"PLANTED"))

    roles = ["clearer", "corrupter", "user", "user", "user", "user"]
    counts = run_roles(_WORKER, roles, str(directory), str(outside), seconds=4, timeout=40, what="the cache")
    users = [c for role, c in zip(roles, counts) if role == "user"]
    assert sum(c["wrong"] for c in users) == 0, "a read returned another key's or a corrupt payload"
    assert sum(c["hits"] for c in users) > 0, "no read ever found an entry: the test tested nothing"
    assert counts[0]["clears"] > 0 and counts[1]["damages"] > 0

    # Afterwards the cache works, and nothing outside it was touched.
    cache = KernelCache(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(8):
            want = _payload(i)
            assert cache.get_or_compile(f"source {i}", (), "sm_80", lambda: want) == want
            assert KernelCache(directory).load(cache.key(f"source {i}", (), "sm_80")) == want
    assert (outside / "fifo").exists()
    for i in range(8):
        key = probe.key(f"source {i}", (), "sm_80")
        assert decode_entry(key, (outside / f"planted-{i}.cubin").read_bytes()) == b"PLANTED"
