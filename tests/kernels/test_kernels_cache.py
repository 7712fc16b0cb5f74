"""The kernel disk cache, with a fake compile function (no GPU, no compiler)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from napkin.kernels.cache import (
    KernelCache,
    KernelCacheWarning,
    atomic_write,
    cache_key,
    decode_entry,
    default_cache,
    default_cache_dir,
    encode_entry,
)

REPO = Path(__file__).resolve().parents[2]


class FakeCompiler:
    """Counts its calls and returns a payload determined by what it is asked to compile."""

    def __init__(self, payload: bytes = b"\x7fELF cubin bytes " * 100):
        self.payload = payload
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return self.payload


def test_miss_then_hit_in_memory_and_on_disk(tmp_path):
    fake = FakeCompiler()
    cache = KernelCache(tmp_path)
    assert cache.get_or_compile("src", ("-O3",), "sm_80", fake) == fake.payload
    assert cache.get_or_compile("src", ("-O3",), "sm_80", fake) == fake.payload
    assert fake.calls == 1
    assert (cache.stats.misses, cache.stats.hits) == (1, 1)
    entries = list(tmp_path.glob("*.cubin"))
    assert [p.name for p in entries] == [f"{cache.key('src', ('-O3',), 'sm_80')}.cubin"]

    fresh = KernelCache(tmp_path)  # a new process: nothing in memory, the disk entry is used
    assert fresh.get_or_compile("src", ("-O3",), "sm_80", fake) == fake.payload
    assert fake.calls == 1 and fresh.stats.hits == 1


def test_every_part_of_the_key_matters(tmp_path):
    base = cache_key("src", ("-O3",), "sm_80", "0.1.0")
    assert cache_key("src", ["-O3"], "sm_80", "0.1.0") == base
    assert cache_key("src2", ("-O3",), "sm_80", "0.1.0") != base
    assert cache_key("src", ("-O2",), "sm_80", "0.1.0") != base
    assert cache_key("src", ("-O3",), "sm_90a", "0.1.0") != base
    assert cache_key("src", ("-O3",), "sm_80", "0.2.0") != base
    assert cache_key("src", ("-O3",), "sm_80", "0.1.0", extra=("nvrtc", "13")) != base
    # Option boundaries are part of the key: ("-a", "b") is not ("-a b",).
    assert cache_key("s", ("-a", "b"), "sm_80", "v") != cache_key("s", ("-a b",), "sm_80", "v")

    fake = FakeCompiler()
    cache = KernelCache(tmp_path)
    cache.get_or_compile("src", (), "sm_80", fake)
    cache.get_or_compile("src", (), "sm_90a", fake)
    assert fake.calls == 2


def test_napkin_version_is_in_the_key(tmp_path):
    from napkin import __version__

    assert KernelCache(tmp_path).key("s", (), "sm_80") == cache_key("s", (), "sm_80", __version__)
    assert KernelCache(tmp_path, version="9.9").key("s", (), "sm_80") != \
        KernelCache(tmp_path).key("s", (), "sm_80")


def _entry_path(cache: KernelCache, src="src") -> Path:
    return cache.path_for(cache.key(src, (), "sm_80"))


@pytest.mark.parametrize("damage", ["flip_payload_byte", "truncate", "truncate_header", "empty",
                                    "garbage", "wrong_length", "other_key"])
def test_damaged_entry_is_recompiled_never_loaded(tmp_path, damage):
    good = FakeCompiler(b"GOOD" * 1000)
    KernelCache(tmp_path).get_or_compile("src", (), "sm_80", good)
    cache = KernelCache(tmp_path)
    path = _entry_path(cache)
    data = path.read_bytes()
    if damage == "flip_payload_byte":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "truncate_header":
        data = data[:20]
    elif damage == "empty":
        data = b""
    elif damage == "garbage":
        data = os.urandom(5000)
    elif damage == "wrong_length":
        data = data + b"extra"
    elif damage == "other_key":
        data = encode_entry(cache.key("another source", (), "sm_80"), b"GOOD" * 1000)
    path.write_bytes(data)

    again = FakeCompiler(b"GOOD" * 1000)
    assert cache.get_or_compile("src", (), "sm_80", again) == b"GOOD" * 1000
    assert again.calls == 1, "a damaged entry must be compiled again"
    assert cache.stats.corrupt == 1
    # ... and rewritten whole, so the next process loads it.
    assert decode_entry(cache.key("src", (), "sm_80"), path.read_bytes()) == b"GOOD" * 1000


def test_entry_format_round_trip():
    key = "ab" * 32
    for payload in (b"", b"x", os.urandom(10000), b"\n\n"):
        assert decode_entry(key, encode_entry(key, payload)) == payload
    assert decode_entry("cd" * 32, encode_entry(key, b"x")) is None


def test_concurrent_processes_compiling_the_same_key(tmp_path):
    """Eight processes start together, each compiles (slowly) and writes the same key."""
    script = r"""
import sys, time
from napkin.kernels.cache import KernelCache
calls = []
def compile_fn():
    calls.append(1)
    time.sleep(0.05)
    return bytes(range(256)) * 4096   # 1 MiB, so that writes overlap
out = KernelCache(sys.argv[1]).get_or_compile("same source", ("-O3",), "sm_90a", compile_fn)
assert out == bytes(range(256)) * 4096, "wrong payload"
print(len(calls))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    cache = KernelCache(tmp_path)
    key = cache.key("same source", ("-O3",), "sm_90a")
    assert decode_entry(key, cache.path_for(key).read_bytes()) == bytes(range(256)) * 4096
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.cubin"], "temporary files left behind"


def test_readers_never_see_a_partial_entry_while_writers_replace_it(tmp_path):
    payloads = [bytes([i]) * 300_000 for i in range(4)]
    key = KernelCache(tmp_path).key("src", (), "sm_80")
    path = KernelCache(tmp_path).path_for(key)
    stop = threading.Event()
    seen: list[list[bytes | None]] = [[] for _ in range(3)]
    errors: list[BaseException] = []

    def writer(i):
        try:
            for _ in range(15):
                atomic_write(path, encode_entry(key, payloads[i]))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader(mine):
        while not stop.is_set():
            mine.append(KernelCache(tmp_path).load(key))

    readers = [threading.Thread(target=reader, args=(seen[i],)) for i in range(3)]
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    loaded = [s for mine in seen for s in mine if s is not None]
    assert loaded, "readers never saw an entry"
    assert all(s in payloads for s in loaded), "a reader saw a partial or mixed entry"
    for mine in seen:
        first = next((i for i, s in enumerate(mine) if s is not None), len(mine))
        assert all(s is not None for s in mine[first:]), "the entry vanished while replaced"


def test_concurrent_threads_share_one_cache(tmp_path):
    fake = FakeCompiler()
    cache = KernelCache(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        cache.get_or_compile("src", (), "sm_80", fake))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [fake.payload] * 8
    assert decode_entry(cache.key("src", (), "sm_80"), _entry_path(cache).read_bytes())


def _failing_writer(path, data):
    raise PermissionError(13, "Permission denied", str(path))


def test_unwritable_directory_falls_back_to_memory_with_one_warning(tmp_path):
    fake = FakeCompiler()
    cache = KernelCache(tmp_path, writer=_failing_writer)
    with pytest.warns(KernelCacheWarning) as record:
        assert cache.get_or_compile("src", (), "sm_80", fake) == fake.payload
    assert len(record) == 1
    message = str(record[0].message)
    assert "\n" not in message and str(tmp_path) in message and "Permission denied" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert cache.get_or_compile("src", (), "sm_80", fake) == fake.payload
        assert cache.get_or_compile("other", (), "sm_80", fake) == fake.payload
    assert fake.calls == 2, "the in-memory entry must be reused"
    assert not list(tmp_path.iterdir())
    assert cache.stats.write_failures == 1


def test_cache_directory_that_cannot_be_created_falls_back(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = KernelCache(blocker / "kernels")
    fake = FakeCompiler()
    with pytest.warns(KernelCacheWarning, match="not writable"):
        assert cache.get_or_compile("src", (), "sm_80", fake) == fake.payload


def test_unreadable_entry_is_a_miss(tmp_path):
    def reader(path):
        raise PermissionError(13, "Permission denied", str(path))

    fake = FakeCompiler()
    KernelCache(tmp_path).get_or_compile("src", (), "sm_80", fake)
    cache = KernelCache(tmp_path, reader=reader)
    assert cache.get_or_compile("src", (), "sm_80", fake) == fake.payload
    assert fake.calls == 2


def test_failed_compile_writes_nothing(tmp_path):
    cache = KernelCache(tmp_path)

    def broken():
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        cache.get_or_compile("src", (), "sm_80", broken)
    assert not list(tmp_path.iterdir())
    with pytest.raises(TypeError):
        cache.get_or_compile("src", (), "sm_80", lambda: "not bytes")


def test_atomic_write_cleans_up_after_a_failed_rename(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "x.cubin", b"data")
    assert not list(tmp_path.iterdir())


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert default_cache().directory == tmp_path / "c"
    assert default_cache() is default_cache()
    monkeypatch.delenv("NAPKIN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "napkin" / "kernels"


def test_clear(tmp_path):
    cache = KernelCache(tmp_path)
    cache.get_or_compile("a", (), "sm_80", FakeCompiler())
    cache.get_or_compile("b", (), "sm_80", FakeCompiler())
    (tmp_path / ".x.cubin.123.tmp").write_bytes(b"stray")
    (tmp_path / "keep.txt").write_text("not ours")
    assert cache.clear() == 3
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
