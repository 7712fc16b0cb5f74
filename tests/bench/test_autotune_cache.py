"""The autotune cache (napkin.bench.autotune.AutotuneCache) against a hostile or corrupt file:
invalid UTF-8 and JSON, JSON nested past the recursion limit, a directory, FIFO or link in the
file's place, a huge file, entries of the wrong schema, a hostile lock file, a directory removed
under a write, and several processes putting, reading, clearing and corrupting at once.

Each read of a hostile file runs in a child process with a time and a memory limit, so that a
cache that follows a link to /dev/zero or opens a FIFO fails the test rather than hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
from napkin_test_support import run_child, run_roles

from napkin.bench import autotune
from napkin.bench.autotune import AutotuneCache, AutotuneCacheWarning, calibration_records, schedule_id, tune
from napkin.diagrams import library
from napkin.perfmodel.schedule import Schedule

POSIX = os.name == "posix"
needs_posix = pytest.mark.skipif(not POSIX, reason="symlinks, FIFOs and /dev/zero are POSIX")


def _child(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_child(script, *args, timeout=timeout, what="the autotune cache, on a hostile file,")


def _entry(n=1):
    return {"best": {"id": f"id{n}", "desc": "fused[...]", "meas_s": 1e-3 * n, "pred_s": 2e-3},
            "candidates": [{"rank": 0, "id": f"id{n}", "pred_s": 2e-3, "meas_s": 1e-3 * n}]}


def _cache_text(entries: dict) -> str:
    return json.dumps({"version": autotune.CACHE_VERSION, "entries": entries})


# ----------------------------------------------------------------------------- a hostile file

HOSTILE = ["invalid_utf8", "invalid_json", "deeply_nested", "directory", "nonempty_directory",
           "fifo", "link_to_dev_zero", "link_to_fifo", "link_to_outside_cache", "huge"]

#: In a child: the hostile file reads as an empty cache with one warning line and no exception,
#: and the cache then stores and loads again.
_CHECK = """
import json, sys, warnings
from napkin.bench.autotune import AutotuneCache, AutotuneCacheWarning

path = sys.argv[1]
entry = {"best": {"id": "fresh", "desc": "d", "meas_s": 0.5, "pred_s": 0.25}, "candidates": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    c = AutotuneCache(path)
    got, size = c.get("k"), len(c)
    c.put("k2", entry)
    again = AutotuneCache(path).get("k2") == entry
print(json.dumps({"got": got, "size": size, "again": again,
                  "warnings": [[w.category.__name__, str(w.message)] for w in caught]}))
"""


def _make_hostile(kind: str, path: Path, outside: Path) -> None:
    if kind == "invalid_utf8":
        path.write_bytes(b'{"version": 1, "entries": {"k": "\xff\xfe\xfd"}}')
    elif kind == "invalid_json":
        path.write_text('{"version": 1, "entries": {"k": ')
    elif kind == "deeply_nested":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "directory":
        path.mkdir()
    elif kind == "nonempty_directory":
        path.mkdir()
        (path / "inside").write_text("someone's file")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "link_to_fifo":
        os.mkfifo(outside / "fifo")
        os.symlink(outside / "fifo", path)
    elif kind == "link_to_outside_cache":
        # A well-formed cache with an entry for "k", but outside: it must not be used.
        (outside / "planted.json").write_text(_cache_text({"k": _entry(7)}))
        os.symlink(outside / "planted.json", path)
    elif kind == "huge":
        # Well-formed, with an entry for "k", but bigger than a cache file may be.
        text = _cache_text({"k": _entry(7)})
        with open(path, "w") as f:
            f.write(text[:-1] + " " * getattr(autotune, "MAX_CACHE_BYTES", 64 << 20) + "}")


@needs_posix
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_cache_file_is_an_empty_cache_with_one_warning(tmp_path, kind):
    path, outside = tmp_path / "autotune.json", tmp_path / "outside"
    outside.mkdir()
    _make_hostile(kind, path, outside)
    p = _child(_CHECK, str(path))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["got"] is None and r["size"] == 0, "a hostile cache file was used"
    assert r["again"], "the cache did not work afterwards"
    assert len(r["warnings"]) == 1, r["warnings"]
    category, message = r["warnings"][0]
    assert category == "AutotuneCacheWarning" and "\n" not in message and str(path) in message
    # The hostile thing was moved aside whole (a link as a link), nothing outside was touched,
    # and the cache file is now a regular file.
    aside = list(tmp_path.glob("autotune.json.corrupt-*"))
    assert len(aside) == 1
    if kind.startswith("link_"):
        assert aside[0].is_symlink()
    if kind == "nonempty_directory":
        assert (aside[0] / "inside").read_text() == "someone's file"
    if kind == "link_to_outside_cache":
        assert json.loads((outside / "planted.json").read_text())["entries"] == {"k": _entry(7)}
    if kind == "link_to_fifo":
        assert (outside / "fifo").exists()
    assert path.is_file() and not path.is_symlink()
    assert os.path.exists("/dev/zero")


# ----------------------------------------------------------------------------- the schema


BAD_ENTRIES = {
    "meas_is_text": {"best": {"id": "x", "meas_s": "fast"}},
    "pred_is_nan": {"best": {"id": "x", "pred_s": float("nan")}},
    "best_id_is_number": {"best": {"id": 5}},
    "candidates_not_a_list": {"best": {"id": "x"}, "candidates": 5},
    "candidate_not_an_object": {"best": {"id": "x"}, "candidates": ["c"]},
    "candidate_pred_is_text": {"best": {"id": "x"}, "candidates": [{"pred_s": "x", "meas_s": 1.0}]},
    "n_ranked_is_a_list": {"best": {"id": "x"}, "n_ranked": [1]},
    "rank_is_bool": {"best": {"id": "x"}, "candidates": [{"rank": True}]},
    "sizes_of_text": {"best": {"id": "x"}, "sizes": {"q": "big"}},
    "deep_signature": {"best": {"id": "x", "signature": json.loads('{"a":' * 60 + "1" + "}" * 60)}},
}


def test_entries_of_the_wrong_schema_are_missing_with_one_warning(tmp_path):
    path = tmp_path / "autotune.json"
    path.write_text(_cache_text({"good": _entry(1), **BAD_ENTRIES}))
    c = AutotuneCache(path)
    with pytest.warns(AutotuneCacheWarning) as record:
        entries = c.load()
        for name in BAD_ENTRIES:
            assert c.get(name) is None, name
        assert c.get("good") == _entry(1)
    assert set(entries) == {"good"}
    assert len(record) == 1 and "\n" not in str(record[0].message)
    assert f"{len(BAD_ENTRIES)} unusable entries" in str(record[0].message)
    assert calibration_records(c) == [
        {"key": "good", "gpu": None, "diagram": None, "sizes": None, "dtype": None, "family": None,
         "schedule": None, "rank": 0, "pred_s": 2e-3, "meas_s": 1e-3, "miss": 1.0}]
    # A put keeps the good entries and drops the unusable ones.
    c.put("new", _entry(2))
    assert set(json.loads(path.read_text())["entries"]) == {"good", "new"}


def _fakes(preds, meas):
    d = library.get("mha").bind(h=4, q=256, x=256, d=64)
    scheds = [Schedule.fused(d, groups={"q": 16 * (i + 1)}, streams={"x": 64}) for i in range(len(preds))]
    ids = {schedule_id(s): i for i, s in enumerate(scheds)}
    calls = {"build": []}

    def build(s):
        calls["build"].append(ids[schedule_id(s)])
        return ids[schedule_id(s)]

    return d, scheds, calls, dict(rank=lambda: list(zip(scheds, preds)), build=build,
                                   measure=lambda kernel: meas[kernel])


@pytest.mark.parametrize("bad", ["candidate_pred_is_text", "n_ranked_is_a_list", "candidates_not_a_list"])
def test_tune_over_an_entry_of_the_wrong_schema_tunes_again(tmp_path, bad):
    cache = AutotuneCache(tmp_path / "a.json")
    d, scheds, calls, fakes = _fakes([1, 2, 3], [3.0, 2.0, 1.0])
    r = tune(d, gpu="h100", k=3, cache=cache, gpu_name="G", **fakes)
    entry = json.loads((tmp_path / "a.json").read_text())["entries"][r.key]
    broken = {**entry, **{k: v for k, v in BAD_ENTRIES[bad].items() if k != "best"}}
    (tmp_path / "a.json").write_text(_cache_text({r.key: broken}))
    d2, scheds2, calls2, fakes2 = _fakes([1, 2, 3], [3.0, 2.0, 1.0])
    with pytest.warns(AutotuneCacheWarning, match="unusable entr"):
        r2 = tune(d2, gpu="h100", k=3, cache=cache, gpu_name="G", **fakes2)
    assert not r2.from_cache and calls2["build"] == [0, 1, 2]
    assert schedule_id(r2.schedule) == schedule_id(scheds[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tuning again wrote a good entry
        assert cache.get(r.key)["best"]["id"] == schedule_id(scheds[2])


# ----------------------------------------------------------------------------- writes


def test_a_directory_in_place_of_the_file_does_not_stop_a_put(tmp_path):
    path = tmp_path / "autotune.json"
    path.mkdir()
    (path / "inside").write_text("x")
    c = AutotuneCache(path)
    with pytest.warns(AutotuneCacheWarning, match="moved to"):
        c.put("k", _entry(1))
    assert AutotuneCache(path).get("k") == _entry(1)


@pytest.mark.parametrize("what", ["nonempty_directory", "empty_directory", "fifo"])
def test_a_lock_file_that_is_not_a_file_does_not_stop_a_put(tmp_path, what):
    path = tmp_path / "autotune.json"
    lock = tmp_path / "autotune.json.lock"
    if what == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
        if what == "nonempty_directory":
            (lock / "inside").write_text("x")
    c = AutotuneCache(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.put("k", _entry(1))
        c.put("k2", _entry(2))
    assert AutotuneCache(path).get("k") == _entry(1) and AutotuneCache(path).get("k2") == _entry(2)
    if what == "nonempty_directory":  # left alone, and said once
        assert (lock / "inside").read_text() == "x"
        assert len(caught) == 1 and "lock" in str(caught[0].message)
    else:  # replaced by a lock file, silently
        assert lock.is_file() and not caught


def test_the_directory_removed_under_a_write(tmp_path, monkeypatch):
    """Another process removes the cache directory (or our temporary file) just before the
    rename: the write is made again and the entry kept."""
    directory = tmp_path / "cache"
    c = AutotuneCache(directory / "autotune.json")
    c.put("k1", _entry(1))
    real_replace, removed = os.replace, []

    def replace(src, dst):
        if not removed:
            removed.append(1)
            shutil.rmtree(directory)
        return real_replace(src, dst)

    monkeypatch.setattr(autotune.os, "replace", replace)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.put("k2", _entry(2))
    monkeypatch.undo()
    assert removed and AutotuneCache(directory / "autotune.json").get("k2") == _entry(2)


def test_tune_keeps_its_result_when_the_cache_cannot_be_written(tmp_path):
    (tmp_path / "a-file").write_text("in the way")
    cache = AutotuneCache(tmp_path / "a-file" / "autotune.json")
    d, scheds, calls, fakes = _fakes([1, 2], [2.0, 1.0])
    with pytest.warns(AutotuneCacheWarning, match="not written"):
        r = tune(d, gpu="h100", k=2, cache=cache, gpu_name="G", **fakes)
    assert schedule_id(r.schedule) == schedule_id(scheds[1]) and not r.from_cache


# ----------------------------------------------------------------------------- many processes at once

_WORKER = r"""
import json, os, random, shutil, sys, time, warnings
from pathlib import Path
from napkin.bench.autotune import AutotuneCache, AutotuneCacheWarning

warnings.simplefilter("error")
warnings.simplefilter("ignore", AutotuneCacheWarning)   # expected here: the file is attacked
role, path, outside, seed, seconds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = random.Random(seed)
keys = [f"GPU|hash{i}|q={128 * i}|bf16" for i in range(8)]
def entry(i):
    return {"best": {"id": f"id{i}", "desc": f"schedule {i}", "meas_s": 1e-3 * (i + 1), "pred_s": 2e-3},
            "candidates": [{"rank": 0, "id": f"id{i}", "pred_s": 2e-3, "meas_s": 1e-3 * (i + 1)}],
            "n_ranked": i, "spearman": None}
counts = {"hits": 0, "misses": 0, "puts": 0, "clears": 0, "damages": 0, "wrong": 0}
deadline = time.monotonic() + seconds

def damage():
    tmp = path.with_name(f"evil-{os.getpid()}-{rng.random()}")
    target = path if rng.random() < 0.8 else path.with_name(path.name + ".lock")
    what = rng.choice(["utf8", "json", "deep", "zero", "fifo", "outside", "own_fifo", "schema", "dir"])
    try:
        if what == "utf8":
            tmp.write_bytes(b'{"version": 1, "entries": {"\xff": 1}}')
        elif what == "json":
            tmp.write_text('{"version": 1, "entries": {')
        elif what == "deep":
            tmp.write_text("[" * 100000 + "]" * 100000)
        elif what == "zero":
            os.symlink("/dev/zero", tmp)
        elif what == "fifo":
            os.symlink(outside / "fifo", tmp)
        elif what == "outside":
            os.symlink(outside / "planted.json", tmp)
        elif what == "own_fifo":
            os.mkfifo(tmp)
        elif what == "schema":   # every key's entry, each of the wrong types
            tmp.write_text(json.dumps({"version": 1, "entries": {
                k: {"best": {"id": 5, "meas_s": "fast"}, "candidates": 3} for k in keys}}))
        elif what == "dir":
            os.mkdir(tmp)
        os.replace(tmp, target)
    except OSError:            # our own trouble (the directory cleared, a directory in the way)
        try:
            shutil.rmtree(tmp) if os.path.isdir(tmp) and not os.path.islink(tmp) else os.unlink(tmp)
        except OSError:
            pass

while time.monotonic() < deadline:
    i = rng.randrange(8)
    if role == "clearer":
        if rng.random() < 0.1:
            shutil.rmtree(path.parent, ignore_errors=True)
        else:
            AutotuneCache(path).clear()
        counts["clears"] += 1
        time.sleep(0.01)
    elif role == "corrupter":
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        damage()
        counts["damages"] += 1
        time.sleep(0.005)
    else:
        c = AutotuneCache(path)
        if rng.random() < 0.4:
            c.put(keys[i], entry(i))
            counts["puts"] += 1
        got = c.get(keys[i])
        if got is None:
            counts["misses"] += 1
        elif got == entry(i):
            counts["hits"] += 1
        else:
            counts["wrong"] += 1
        for e in AutotuneCache(path).load().values():   # whatever is loaded is well typed
            float(e["best"].get("meas_s") or 0) + sum(float(c["pred_s"] or 0) for c in e.get("candidates", []))
print(json.dumps(counts))
"""


@needs_posix
def test_many_processes_putting_reading_clearing_and_corrupting(tmp_path):
    """Four processes put and read, one clears (sometimes removing the directory), one puts
    garbage, deep JSON, links, FIFOs, directories and badly typed entries in the file's (and the
    lock's) place, all at once for a few seconds. No process raises, every read gives the entry
    put for its key or nothing, and afterwards the cache works."""
    path, outside = tmp_path / "cache" / "autotune.json", tmp_path / "outside"
    path.parent.mkdir()
    outside.mkdir()
    os.mkfifo(outside / "fifo")
    planted = {f"GPU|hash{i}|q={128 * i}|bf16": _entry(99) for i in range(8)}  # valid, but wrong
    (outside / "planted.json").write_text(_cache_text(planted))

    roles = ["clearer", "corrupter", "user", "user", "user", "user"]
    counts = run_roles(_WORKER, roles, str(path), str(outside), seconds=4, timeout=40, what="the autotune cache")
    users = [c for role, c in zip(roles, counts) if role == "user"]
    assert sum(c["wrong"] for c in users) == 0, "a read returned another key's or a corrupt entry"
    assert sum(c["hits"] for c in users) > 0, "no read ever found an entry: the test tested nothing"
    assert counts[0]["clears"] > 0 and counts[1]["damages"] > 0

    # Afterwards the cache works, and nothing outside it was touched.
    c = AutotuneCache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutotuneCacheWarning)  # what the corrupter left is reported
        c.put("after", _entry(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AutotuneCache(path).get("after") == _entry(3)
    assert json.loads((outside / "planted.json").read_text())["entries"] == planted
    assert (outside / "fifo").exists()
