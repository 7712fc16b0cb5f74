"""napkin.bench.timing: the timing loop with a fake clock, percentiles, rotating inputs, device info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from napkin.bench import timing
from napkin.bench.timing import (HostClockBackend, Timing, make_rotating_inputs, nbytes_of, parse_nvidia_smi,
                                 percentile, summarize, time_fn)

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    """A clock that only moves when the timed function says so (and a little for each flush)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


def scripted(clock: FakeClock, durations):
    """A function that takes the next duration from ``durations`` each call and records its args."""
    it = iter(durations)
    seen = []

    def fn(*args, **kwargs):
        seen.append(args if not kwargs else kwargs)
        clock.advance(next(it))

    return fn, seen


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("q", [0, 10, 25, 50, 90, 100])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(q)
    for n in (1, 2, 7, 100):
        xs = rng.random(n).tolist()
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-15)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_known_values():
    t = summarize([5, 1, 4, 2, 3, 6, 7, 8, 9, 10])
    assert isinstance(t, Timing)
    assert t.median_s == 5.5 and t.reps == 10
    assert t.p10_s == pytest.approx(1.9) and t.p90_s == pytest.approx(9.1)
    assert t.spread == pytest.approx((9.1 - 1.9) / 5.5)
    assert json.loads(json.dumps(t.to_dict())) == {"median_s": 5.5, "p10_s": t.p10_s, "p90_s": t.p90_s, "reps": 10}
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


# ----------------------------------------------------------------------------- the loop


def test_warmup_is_not_timed_and_median_is_of_timed_runs():
    clock = FakeClock()
    # 3 warm-up calls that are slow (compilation), then 5 timed calls
    fn, seen = scripted(clock, [100.0, 100.0, 100.0, 1.0, 3.0, 2.0, 5.0, 4.0])
    be = HostClockBackend(clock)
    t = time_fn(fn, warmup=3, reps=5, backend=be, flush_l2=False)
    assert len(seen) == 8
    assert t.reps == 5
    assert t.median_s == 3.0
    assert t.p10_s == pytest.approx(1.4) and t.p90_s == pytest.approx(4.6)
    assert be.flushes == 0


def test_flush_before_every_timed_run_and_outside_the_events():
    clock = FakeClock()
    fn, _ = scripted(clock, [1.0] * 12)
    # a flush that takes 50 s of "device time" must not show up in the measurement
    be = HostClockBackend(clock, flush=lambda: clock.advance(50.0))
    t = time_fn(fn, warmup=2, reps=10, backend=be, flush_l2=True)
    assert be.flushes == 10
    assert t.median_s == 1.0 and t.p90_s == 1.0


def test_rotation_cycles_through_argument_sets_continuing_after_warmup():
    clock = FakeClock()
    fn, seen = scripted(clock, [1.0] * 9)
    sets = [("a",), ("b",), ("c",)]
    time_fn(fn, warmup=2, reps=7, rotate=sets, backend=HostClockBackend(clock), flush_l2=False)
    assert [s[0] for s in seen] == ["a", "b", "c", "a", "b", "c", "a", "b", "c"]


def test_rotation_accepts_kwargs_and_single_objects():
    clock = FakeClock()
    fn, seen = scripted(clock, [1.0] * 4)
    time_fn(fn, warmup=1, reps=3, rotate=[{"x": 1}, {"x": 2}], backend=HostClockBackend(clock), flush_l2=False)
    assert seen == [{"x": 1}, {"x": 2}, {"x": 1}, {"x": 2}]
    fn2, seen2 = scripted(clock, [1.0] * 2)
    time_fn(fn2, warmup=0, reps=2, rotate=["only"], backend=HostClockBackend(clock), flush_l2=False)
    assert seen2 == [("only",), ("only",)]


def test_max_time_caps_reps_from_the_warmup_estimate_but_keeps_min_reps():
    clock = FakeClock()
    fn, seen = scripted(clock, [0.5] * 1000)
    t = time_fn(fn, warmup=4, reps=100, backend=HostClockBackend(clock), flush_l2=False, max_time_s=5.0)
    assert t.reps == 10  # 5 s / 0.5 s
    clock2 = FakeClock()
    fn2, _ = scripted(clock2, [10.0] * 1000)
    t2 = time_fn(fn2, warmup=2, reps=100, backend=HostClockBackend(clock2), flush_l2=False, max_time_s=5.0,
                 min_reps=7)
    assert t2.reps == 7


def test_time_fn_rejects_bad_arguments():
    with pytest.raises(ValueError):
        time_fn(lambda: None, reps=0, backend=HostClockBackend(FakeClock()))
    with pytest.raises(ValueError):
        time_fn(lambda: None, rotate=[], backend=HostClockBackend(FakeClock()))


def test_host_clock_backend_times_real_cpu_work():
    t = time_fn(lambda: sum(range(20000)), warmup=2, reps=20, flush_l2=False, backend=HostClockBackend())
    assert 0 < t.p10_s <= t.median_s <= t.p90_s


# ----------------------------------------------------------------------------- inputs


def test_make_rotating_inputs_until_min_bytes():
    made = []

    def factory(i):
        made.append(i)
        return (np.random.default_rng(i).standard_normal(1000).astype(np.float32),)  # 4000 bytes

    sets = make_rotating_inputs(factory, min_bytes=10_000)
    assert len(sets) == 3 and made == [0, 1, 2]
    assert sum(nbytes_of(s) for s in sets) >= 10_000
    assert len(make_rotating_inputs(factory, min_bytes=10**9, max_sets=5)) == 5
    assert len(make_rotating_inputs(factory, min_bytes=0, min_sets=2)) == 2


def test_make_rotating_inputs_refuses_zeros():
    with pytest.raises(ValueError, match="zeros"):
        make_rotating_inputs(lambda i: (np.ones(10), np.zeros(10)), min_bytes=1)


def test_make_rotating_inputs_without_tensors_makes_one_set():
    assert make_rotating_inputs(lambda i: (i, "x"), min_bytes=10**6) == [(0, "x")]


def test_nbytes_of_nested_torch_and_numpy():
    torch = pytest.importorskip("torch")
    obj = {"a": (torch.empty(10, dtype=torch.bfloat16), [np.empty(3, dtype=np.float64)]), "b": 5}
    assert nbytes_of(obj) == 20 + 24


def test_random_tensor_is_random_seeded_and_typed():
    torch = pytest.importorskip("torch")
    a = timing.random_tensor((64, 32), "bf16", "cpu", seed=3)
    b = timing.random_tensor((64, 32), "bf16", "cpu", seed=3)
    c = timing.random_tensor((64, 32), "bf16", "cpu", seed=4)
    assert a.dtype == torch.bfloat16 and a.shape == (64, 32)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool((a != 0).any()) and 0.5 < float(a.float().std()) < 1.5


def test_diagram_inputs_follow_the_diagram():
    pytest.importorskip("torch")
    from napkin.diagrams import library

    d = library.get("gqa").with_dtype("fp16").bind(h=2, j=3, q=8, x=5, d=4)
    ins = timing.diagram_inputs(d, device="cpu", seed=1)
    assert [tuple(t.shape) for t in ins] == [(2, 3, 8, 4), (2, 5, 4), (2, 5, 4)]
    assert all(str(t.dtype) == "torch.float16" for t in ins)


# ----------------------------------------------------------------------------- the device


def test_parse_nvidia_smi():
    text = ("NVIDIA H100 80GB HBM3, 580.159.04, 00000000:18:00.0, 1980, 1980, 2619, 2619, 700.00, 34, P0, 81559\n"
            "NVIDIA H100 80GB HBM3, 580.159.04, 00000000:2A:00.0, [N/A], 1980, 2619, 2619, [Not Supported], 30, P8, 81559\n"
            "garbage line\n")
    rows = parse_nvidia_smi(text)
    assert len(rows) == 2
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3" and rows[0]["driver"] == "580.159.04"
    assert rows[0]["sm_clock_mhz"] == 1980.0 and rows[0]["power_limit_w"] == 700.0 and rows[0]["pstate"] == "P0"
    assert rows[1]["sm_clock_mhz"] is None and rows[1]["power_limit_w"] is None
    assert rows[1]["pci_bus_id"] == "00000000:2A:00.0"


def test_device_info_always_answers():
    info = timing.device_info()
    assert "python" in info and "date" in info and "cuda" in info
    if info["cuda"]:
        assert info["name"] and info["sm_count"] > 0
    else:
        assert "torch" in info


def test_importing_napkin_bench_does_not_import_torch():
    code = textwrap.dedent("""
        import json, sys
        import napkin.bench, napkin.bench.timing, napkin.bench.baselines, napkin.bench.suite
        import napkin.bench.report, napkin.bench.autotune
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy", "matplotlib"))))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


# ----------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_cuda_events_time_device_work():
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    small = time_fn(lambda: a[:1024, :1024] @ a[:1024, :1024], warmup=5, reps=20)
    big = time_fn(lambda: a @ a, warmup=5, reps=20)
    assert 0 < small.median_s < big.median_s
    assert big.median_s > 1e-5


@pytest.mark.gpu
def test_copy_bandwidth_and_device_info_on_gpu():
    bw = timing.copy_bandwidth(nbytes=256 * 2**20, reps=10)
    assert 1e11 < bw < 2e13
    info = timing.device_info()
    assert info["cuda"] and info["sm_count"] > 0 and info["l2_bytes"] > 0


@pytest.mark.gpu
def test_rotating_inputs_exceed_l2_on_gpu():
    sets = make_rotating_inputs(lambda i: (timing.random_tensor((1024, 1024), "bf16", seed=i),))
    assert sum(nbytes_of(s) for s in sets) >= 2 * timing.l2_bytes()
