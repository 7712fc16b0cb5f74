"""napkin.bench.autotune: Spearman by hand, the persistent cache (round trip, corruption), the search."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from napkin.bench import autotune
from napkin.bench.autotune import (AutotuneCache, AutotuneCacheWarning, AutotuneError, cache_key, calibration_records,
                                   diagram_hash, rankdata, schedule_id, spearman, tune)
from napkin.diagrams import library
from napkin.perfmodel.schedule import Schedule

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- Spearman


def test_rankdata_averages_ties():
    assert rankdata([3, 1, 2]).tolist() == [3.0, 1.0, 2.0]
    assert rankdata([10, 30, 20, 20]).tolist() == [1.0, 4.0, 2.5, 2.5]
    assert rankdata([5, 5, 5]).tolist() == [2.0, 2.0, 2.0]


def test_spearman_without_ties_matches_the_textbook_formula():
    # 1 − 6Σd²/(n(n²−1)): d = (−1, 1, −1, 1, 0), Σd² = 4, n = 5 → 1 − 24/120 = 0.8
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ranks of y: (1, 2, 4, 3), d = (0, 0, −1, 1), Σd² = 2, n = 4 → 1 − 12/60 = 0.8
    assert spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(1 - 6 * 2 / 60)
    assert spearman([0.1, 0.2, 0.3], [7, 8, 9]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_with_ties_by_hand():
    # ranks x: 1..5 (centred −2..2); y = (5, 6, 7, 8, 7) ranks (1, 2, 3.5, 5, 3.5), centred
    # (−2, −1, 0.5, 2, 0.5): Σ = 4 + 1 + 0 + 2 + 1 = 8; Σx² = 10; Σy² = 9.5 → 8/√95
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))


def test_spearman_is_invariant_to_monotone_maps():
    x = [0.3, 1.2, 0.7, 2.5, 1.9, 0.1, 3.3, 2.2]
    y = [1.0, 2.0, 1.5, 4.0, 2.1, 0.9, 3.0, 5.0]
    assert spearman(x, y) == pytest.approx(spearman([v ** 3 for v in x], [math.log(v) for v in y]))


def test_spearman_degenerate_cases():
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4]))
    assert spearman([1, 2, float("nan"), 4], [1, 2, 3, 4]) == pytest.approx(1.0)  # NaN pairs dropped
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------- keys


def test_diagram_hash_is_structural_and_stable_across_processes():
    mha = library.get("mha")
    h = diagram_hash(mha)
    assert h == diagram_hash(mha.bind(h=16, q=4096, x=4096, d=128))  # sizes are not part of it
    assert h != diagram_hash(library.get("attention_causal"))
    assert h != diagram_hash(mha.with_dtype("fp16"))
    assert diagram_hash(library.get("layernorm")) != diagram_hash(library.get("rmsnorm"))
    code = "from napkin.diagrams import library; from napkin.bench.autotune import diagram_hash; " \
           "print(diagram_hash(library.get('mha')))"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED="123")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == h


def test_cache_key_parts():
    d = library.get("softmax")
    k = cache_key("NVIDIA H100 80GB HBM3", d, {"x": 4096, "r": 8}, "bf16")
    assert k == f"NVIDIA H100 80GB HBM3|{diagram_hash(d)}|r=8,x=4096|bf16"
    assert k != cache_key("NVIDIA H100 80GB HBM3", d, {"x": 4096, "r": 8}, "fp16")
    assert k != cache_key("NVIDIA H200", d, {"x": 4096, "r": 8}, "bf16")


def test_default_cache_path_follows_napkin_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path / "c"))
    assert autotune.cache_path() == tmp_path / "c" / "autotune.json"
    assert AutotuneCache().path == tmp_path / "c" / "autotune.json"
    monkeypatch.delenv("NAPKIN_CACHE_DIR")
    assert autotune.cache_path() == Path.home() / ".cache" / "napkin" / "autotune.json"


# ----------------------------------------------------------------------------- the cache


def _entry(n=1):
    return {"best": {"id": f"id{n}", "desc": "fused[...]", "meas_s": 1e-3 * n, "pred_s": 2e-3},
            "candidates": [{"rank": 0, "id": f"id{n}", "pred_s": 2e-3, "meas_s": 1e-3 * n}]}


def test_cache_round_trip(tmp_path):
    c = AutotuneCache(tmp_path / "sub" / "autotune.json")
    assert c.get("k1") is None and len(c) == 0
    c.put("k1", _entry(1))
    c.put("k2", _entry(2))
    c2 = AutotuneCache(tmp_path / "sub" / "autotune.json")  # a fresh reader sees both
    assert c2.get("k1") == _entry(1) and c2.get("k2") == _entry(2) and "k2" in c2
    data = json.loads((tmp_path / "sub" / "autotune.json").read_text())
    assert data["version"] == autotune.CACHE_VERSION and set(data["entries"]) == {"k1", "k2"}
    c2.put("k1", _entry(3))
    assert c.get("k1")["best"]["id"] == "id3"
    c.remove("k2")
    assert c.get("k2") is None and c.get("k1") is not None
    leftovers = [p.name for p in (tmp_path / "sub").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    with pytest.raises(TypeError):
        c.put("bad", {"x": object()})
    assert c.get("k1") is not None  # a failed put leaves the file alone


@pytest.mark.parametrize("garbage", ["{not json", "", "[1, 2, 3]", '{"version": 1}',
                                     '{"version": 999, "entries": {}}', "\x00\x01\x02"])
def test_corrupt_cache_is_moved_aside_and_rebuilt(tmp_path, garbage):
    path = tmp_path / "autotune.json"
    path.write_text(garbage)
    c = AutotuneCache(path)
    with pytest.warns(AutotuneCacheWarning, match="moved to"):
        assert c.get("k") is None
    aside = list(tmp_path.glob("autotune.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == garbage
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt cache reads cleanly
        c.put("k", _entry(1))
        assert c.get("k") == _entry(1)


def test_entries_that_are_not_objects_are_ignored(tmp_path):
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps({"version": 1, "entries": {"a": 5, "b": {"no": "best"}, "c": _entry(1)}}))
    c = AutotuneCache(path)
    assert c.get("a") is None and c.get("b") is None and c.get("c") == _entry(1)


def test_truncated_write_is_never_seen(tmp_path, monkeypatch):
    """A write that dies half-way leaves the previous file intact (temporary file + rename)."""
    c = AutotuneCache(tmp_path / "autotune.json")
    c.put("k1", _entry(1))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(autotune.os, "replace", boom)
    with pytest.raises(OSError):
        c.put("k2", _entry(2))
    monkeypatch.undo()
    assert c.get("k1") == _entry(1) and c.get("k2") is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- tuning


def _schedules(n=6):
    d = library.get("mha").bind(h=4, q=256, x=256, d=64)
    return d, [Schedule.fused(d, groups={"q": 16 * (i + 1)}, streams={"x": 64}) for i in range(n)]


def _fakes(preds, meas, fail=()):
    d, scheds = _schedules(len(preds))
    ids = {schedule_id(s): i for i, s in enumerate(scheds)}
    calls = {"rank": 0, "build": [], "measure": []}

    def rank():
        calls["rank"] += 1
        return sorted(zip(scheds, preds), key=lambda t: t[1])

    def build(s):
        i = ids[schedule_id(s)]
        calls["build"].append(i)
        if i in fail:
            raise RuntimeError(f"nvrtc: candidate {i} does not compile")
        return i

    def measure(kernel):
        calls["measure"].append(kernel)
        return meas[kernel]

    return d, scheds, calls, dict(rank=rank, build=build, measure=measure)


def test_tune_measures_the_top_k_and_keeps_the_fastest(tmp_path):
    preds = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]   # the model likes 0 best
    meas = [2.5, 2.0, 1.5, 3.0, 0.1, 9.0]    # 4 is fastest but the model ranks it 5th
    d, scheds, calls, fakes = _fakes(preds, meas)
    cache = AutotuneCache(tmp_path / "a.json")
    r = tune(d, gpu="h100", dtype="bf16", k=4, cache=cache, gpu_name="GPU X", **fakes)
    assert calls["build"] == [0, 1, 2, 3]            # only the model's top 4
    assert r.schedule is scheds[2] and r.seconds == 1.5 and r.pred_s == 3.0
    assert r.compiled == 2 and not r.from_cache and r.n_ranked == 6
    assert [c.rank for c in r.candidates] == [0, 1, 2, 3]
    assert r.candidates[0].miss == pytest.approx((1.0 - 2.5) / 2.5)
    assert r.spearman == pytest.approx(spearman([1, 2, 3, 4], [2.5, 2.0, 1.5, 3.0]))
    entry = cache.get(r.key)
    assert entry["best"]["id"] == schedule_id(scheds[2]) and entry["best"]["model_rank"] == 2
    assert len(entry["candidates"]) == 4 and entry["gpu"] == "GPU X" and entry["sizes"]["q"] == 256

    # the second time nothing is built or measured
    d2, scheds2, calls2, fakes2 = _fakes(preds, meas)
    r2 = tune(d2, gpu="h100", dtype="bf16", k=4, cache=cache, gpu_name="GPU X", **fakes2)
    assert r2.from_cache and calls2["build"] == [] and calls2["measure"] == []
    assert schedule_id(r2.schedule) == schedule_id(scheds[2]) and r2.seconds == 1.5
    assert len(r2.candidates) == 4 and r2.spearman == pytest.approx(r.spearman)

    # force re-measures; a larger k reaches the fastest one
    d3, scheds3, calls3, fakes3 = _fakes(preds, meas)
    r3 = tune(d3, gpu="h100", dtype="bf16", k=6, cache=cache, gpu_name="GPU X", force=True, **fakes3)
    assert calls3["build"] == [0, 1, 2, 3, 4, 5] and schedule_id(r3.schedule) == schedule_id(scheds[4])
    assert cache.get(r3.key)["best"]["meas_s"] == 0.1


def test_tune_skips_failing_candidates_and_records_why(tmp_path):
    d, scheds, calls, fakes = _fakes([1, 2, 3, 4], [1.0, 0.5, 2.0, 3.0], fail={1})
    r = tune(d, gpu="h100", k=3, cache=AutotuneCache(tmp_path / "a.json"), gpu_name="G", **fakes)
    assert r.schedule is scheds[0]
    bad = [c for c in r.candidates if c.error]
    assert len(bad) == 1 and "does not compile" in bad[0].error and bad[0].meas_s is None and bad[0].miss is None


def test_tune_fails_when_nothing_runs(tmp_path):
    d, scheds, calls, fakes = _fakes([1, 2], [1.0, 1.0], fail={0, 1})
    with pytest.raises(AutotuneError, match="does not compile"):
        tune(d, gpu="h100", k=4, cache=AutotuneCache(tmp_path / "a.json"), gpu_name="G", **fakes)
    assert not (tmp_path / "a.json").exists() or AutotuneCache(tmp_path / "a.json").load() == {}


def test_tune_retunes_when_the_cached_schedule_is_no_longer_proposed(tmp_path):
    cache = AutotuneCache(tmp_path / "a.json")
    d, scheds, calls, fakes = _fakes([1, 2, 3], [3.0, 2.0, 1.0])
    r = tune(d, gpu="h100", k=3, cache=cache, gpu_name="G", **fakes)
    entry = cache.get(r.key)
    entry["best"]["id"] = "gone"
    cache.put(r.key, entry)
    d2, scheds2, calls2, fakes2 = _fakes([1, 2, 3], [3.0, 2.0, 1.0])
    r2 = tune(d2, gpu="h100", k=3, cache=cache, gpu_name="G", **fakes2)
    assert not r2.from_cache and calls2["build"] == [0, 1, 2]


def test_tune_without_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path))
    d, scheds, calls, fakes = _fakes([1, 2], [1.0, 2.0])
    tune(d, gpu="h100", k=2, use_cache=False, gpu_name="G", **fakes)
    assert not (tmp_path / "autotune.json").exists()
    with pytest.raises(ValueError):
        tune(d, gpu="h100", k=0, gpu_name="G", **fakes)


def test_calibration_records_list_every_measured_miss(tmp_path):
    cache = AutotuneCache(tmp_path / "a.json")
    d, scheds, calls, fakes = _fakes([1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 1.5, 8.0], fail={3})
    tune(d, gpu="h100", k=4, cache=cache, gpu_name="G", **fakes)
    recs = calibration_records(cache)
    assert len(recs) == 3  # the failed candidate has no measurement
    assert sorted(r["miss"] for r in recs) == pytest.approx(sorted([(1 - 2) / 2, 0.0, (3 - 1.5) / 1.5]))
    assert all(r["diagram"] == "mha" and r["gpu"] == "G" for r in recs)


def test_spearman_over_eight_configurations_from_tuning(tmp_path):
    preds = [1, 2, 3, 4, 5, 6, 7, 8]
    meas = [1.1, 2.3, 2.9, 4.4, 4.1, 6.6, 7.0, 9.0]  # one swapped pair (4, 5)
    d, scheds, calls, fakes = _fakes(preds, meas)
    r = tune(d, gpu="h100", k=8, cache=AutotuneCache(tmp_path / "a.json"), gpu_name="G", **fakes)
    # one adjacent swap among 8: Σd² = 2 → 1 − 12/504
    assert r.spearman == pytest.approx(1 - 6 * 2 / (8 * 63))


def test_tune_with_the_real_ranking_and_lowering(tmp_path):
    """rank_candidates and codegen.compile as they are (no GPU needed to lower); only the
    measurement is faked: each candidate "runs" in its predicted time × a made-up factor."""
    pytest.importorskip("napkin.codegen.select")
    pytest.importorskip("jinja2")
    from napkin.codegen.select import rank_candidates

    d = library.get("matmul").with_dtype("bf16")
    sizes = {"a": 2048, "b": 2048, "c": 2048}
    bound = d.bind(sizes)
    ranked = rank_candidates(bound, "contraction", "h100", "bf16")
    preds = {schedule_id(s): p for s, p in ranked}
    seen = []

    def measure(kernel):
        sid = schedule_id(kernel.schedule)
        seen.append(sid)
        return preds[sid] * (1.5 if len(seen) == 1 else 1.0)  # the model's favourite disappoints

    r = tune(d, gpu="h100", sizes=sizes, dtype="bf16", k=3, cache=AutotuneCache(tmp_path / "a.json"),
             gpu_name="G", measure=measure)
    assert len(seen) == min(3, len(ranked)) and seen[0] == schedule_id(ranked[0][0])
    assert r.compiled is not None and schedule_id(r.compiled.schedule) == schedule_id(r.schedule)
    if len(ranked) > 1:
        assert schedule_id(r.schedule) != schedule_id(ranked[0][0])
    assert r.candidates[0].pred_s == pytest.approx(ranked[0][1])


@pytest.mark.gpu
def test_tune_on_gpu_with_the_real_codegen(tmp_path):
    pytest.importorskip("napkin.codegen.select")
    d = library.get("softmax").with_dtype("bf16")
    r = tune(d, gpu="h100", sizes={"r": 4096, "x": 4096}, dtype="bf16", k=2,
             cache=AutotuneCache(tmp_path / "a.json"))
    assert r.seconds and r.seconds > 0 and r.candidates


# ----------------------------------------------------------------------------- ids: legacy notes and typed options


def _old_id(schedule, notes=()):
    """schedule_id as it was computed before kernels had typed options (kept verbatim)."""
    import hashlib
    import json

    kernels = [{"name": k.name, "boxes": list(k.boxes), "relabels": [[r.axis, str(r.size), r.level, r.kind]
                                                                     for r in k.relabels],
                "placement": [list(p) for p in k.placement]} for k in schedule.kernels]
    sig = {"kernels": kernels, "dtype": str(schedule.dtype)}
    if notes:
        sig["notes"] = list(notes)
    return hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:12]


def _mm():
    return library.get("matmul").with_dtype("bf16").bind({"a": 1024, "b": 1024, "c": 1024})


def test_legacy_schedules_keep_their_ids_and_descriptions():
    """A schedule without family and options (the families before the change): the signature
    it always had, notes included."""
    from napkin.bench.autotune import (describe_schedule, is_typed, legacy_description, legacy_schedule,
                                       legacy_schedule_id, schedule_signature)

    d = _mm()
    plain = Schedule.fused(d, groups={"a": 128, "c": 128}, streams={"b": 64})
    noted = plain.replace(notes=("stages=4", "blocks_per_sm=1", "engine=wgmma"))
    assert not is_typed(plain) and not is_typed(noted)
    assert schedule_id(plain) == _old_id(plain) and schedule_id(noted) == _old_id(noted, noted.notes)
    assert schedule_id(plain) != schedule_id(noted) and "notes" in schedule_signature(noted)
    assert legacy_schedule_id(noted) == schedule_id(noted) and legacy_schedule(noted) is noted
    desc = "fused[a → g_a=128@SMEM, c → g_c=128@SMEM, b → s_b=64@SMEM]"
    assert describe_schedule(noted) == legacy_description(noted) == desc


def test_typed_options_are_in_the_id_and_the_description_and_map_back_to_the_old_notes():
    from napkin.bench.autotune import (describe_schedule, is_typed, legacy_description, legacy_notes,
                                       legacy_schedule, legacy_schedule_id, schedule_signature)
    from napkin.perfmodel.schedule import KernelOptions

    d = _mm()
    plain = Schedule.fused(d, groups={"a": 128, "c": 128}, streams={"b": 64})

    def typed(name="fused", **opts):
        k = plain.kernels[0].replace(name=name, family="contraction", options=KernelOptions(**opts))
        return plain.replace(kernels=(k,))

    wg = typed(engine="wgmma", stages=4, blocks_per_sm=1, warpgroups=2)
    wg3 = typed(engine="wgmma", stages=3, blocks_per_sm=1, warpgroups=2)
    mma = typed(engine="mma.sync", stages=4, blocks_per_sm=1, warps=8)
    assert is_typed(wg) and len({schedule_id(s) for s in (plain, wg, wg3, mma)}) == 4
    sig = schedule_signature(wg)["kernels"][0]
    assert sig["family"] == "contraction" and sig["options"] == {"engine": "wgmma", "stages": 4, "warpgroups": 2,
                                                                 "blocks_per_sm": 1}
    assert describe_schedule(wg) == ("fused[a → g_a=128@SMEM, c → g_c=128@SMEM, b → s_b=64@SMEM]"
                                     "(family=contraction, engine=wgmma, stages=4, warpgroups=2, blocks_per_sm=1)")
    named = typed(name="contraction", engine="wgmma", stages=4)
    assert describe_schedule(named) == ("contraction[a → g_a=128@SMEM, c → g_c=128@SMEM, b → s_b=64@SMEM]"
                                        "(engine=wgmma, stages=4)")
    assert len({describe_schedule(s) for s in (wg, wg3, mma)}) == 3
    assert legacy_description(wg) == legacy_description(mma) == describe_schedule(plain)
    # back to the notes the contraction family wrote: stages, residency, and the engine iff wgmma
    assert legacy_notes(wg) == ("stages=4", "blocks_per_sm=1", "engine=wgmma")
    assert legacy_notes(mma) == ("stages=4", "blocks_per_sm=1")
    assert legacy_schedule_id(wg) == _old_id(plain, ("stages=4", "blocks_per_sm=1", "engine=wgmma"))
    assert legacy_schedule_id(mma) == _old_id(plain, ("stages=4", "blocks_per_sm=1"))
    assert schedule_id(legacy_schedule(wg)) == legacy_schedule_id(wg)
    # typed notes are free text: not part of the id
    assert schedule_id(wg.replace(notes=("anything",))) == schedule_id(wg)


def test_legacy_notes_of_attention_rowwise_and_fallback():
    from napkin.bench.autotune import LEGACY_FALLBACK_NOTE, legacy_notes, legacy_schedule_id
    from napkin.perfmodel.schedule import KernelOptions

    att = library.get("mha").with_dtype("bf16").bind({"h": 4, "q": 1024, "x": 1024, "d": 64})
    s = Schedule.fused(att, groups={"q": 128}, streams={"x": 64})
    k = s.kernels[0].replace(family="attention", options=KernelOptions(engine="mma.sync", stages=2, blocks_per_sm=2,
                                                                       warps=4))
    ts = s.replace(kernels=(k,))
    assert legacy_notes(ts) == ("stages=2", "blocks_per_sm=2")  # no engine note for attention
    assert legacy_schedule_id(ts) == _old_id(s, ("stages=2", "blocks_per_sm=2"))
    sm = library.get("softmax").with_dtype("bf16").bind({"r": 4096, "x": 1024})
    rs = Schedule.fused(sm, groups={"r": 8})
    rk = rs.kernels[0].replace(family="rowwise", options=KernelOptions(threads_per_row=32, warps=8))
    assert legacy_notes(rs.replace(kernels=(rk,))) == ("rowwise THREADS_PER_ROW=32 ROWS_PER_BLOCK=8",)
    fb = Schedule.unfused(att)
    fbk = tuple(k.replace(family="fallback", options=KernelOptions(engine="scalar")) for k in fb.kernels)
    assert legacy_notes(fb.replace(kernels=fbk)) == (LEGACY_FALLBACK_NOTE,)


def test_the_recorded_prediction_is_codegens_predict_schedule(tmp_path):
    """tune's default ranking records, for every candidate, napkin.codegen.select.predict_schedule
    (the number napkin cost and derive print), and measures in that order."""
    pytest.importorskip("jinja2")
    from napkin.bench.autotune import model_ranking
    from napkin.codegen import select

    d = library.get("softmax").with_dtype("bf16")
    bound = d.bind({"r": 4096, "x": 2048})
    ranked = model_ranking(bound, "rowwise", "h100", "bf16")
    assert ranked and [p for _, p in ranked] == sorted(p for _, p in ranked)
    for s, p in ranked:
        assert p == select.predict_schedule(bound, "rowwise", s, "h100").seconds
    r = tune(d, gpu="h100", sizes={"r": 4096, "x": 2048}, dtype="bf16", k=2, cache=AutotuneCache(tmp_path / "a.json"),
             gpu_name="G", build=lambda s: s, measure=lambda s: 1e-3)
    for c in r.candidates:
        assert c.pred_s == select.predict_schedule(bound, "rowwise", c.schedule, "h100").seconds
        assert c.id == schedule_id(c.schedule)
