"""benchmarks/decode_sweep.py and benchmarks/decode_timeline.py without a GPU: every point of the
sweep lowers to the configuration it names and fits shared memory, and the timeline's stamps land
at the five places of a split decode kernel (a template change that moves an anchor line fails
here, not on the GPU), the stamped source still building with nvcc."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from napkin.codegen.families.attention import FAMILY, analyze
from napkin.codegen.select import resolve_gpu

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # decode_timeline imports decode_sweep
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sweep = _load("decode_sweep")
timeline = _load("decode_timeline")


def test_every_sweep_point_lowers_to_its_configuration_within_shared_memory():
    gpu = resolve_gpu("h200")
    d = sweep.diagram(16384)
    points = sweep.grid(gpu.sms, 8, 227 * 1024)
    assert (64, 3, 2, 16) in points and (128, 2, 1, 16) in points and len(points) == len(set(points))
    for chunk, stages, blocks, splits in points:
        s = sweep.schedule_for(d, gpu, chunk, stages, blocks, splits)
        cfg = FAMILY.config_of(analyze(d), d, s)
        assert (cfg.BX, cfg.stages, cfg.blocks_per_sm, cfg.splits, cfg.packed) == (chunk, stages, blocks, splits, True)
        assert cfg.smem_bytes() * blocks <= 227 * 1024
        FAMILY.lower(d, s, "sm_90a")


def _split_source(splits=16):
    d = sweep.diagram(4096)
    s = sweep.schedule_for(d, resolve_gpu("h200"), 64, 3, 2, splits)
    return FAMILY.lower(d, s, "sm_90a").launches[0].source


def test_the_timeline_stamps_five_places_of_a_split_decode_kernel():
    src = _split_source()
    stamped = timeline.stamp(src)
    body = stamped[stamped.index('extern "C" __global__'):]
    calls = [line.strip() for line in body.splitlines() if "napkin_stamp(" in line]
    assert calls == ["napkin_stamp(0);", "if (it == 0) napkin_stamp(1);", "napkin_stamp(2);", "napkin_stamp(3);",
                     "napkin_stamp(4);"], calls
    assert body.rstrip().endswith("napkin_stamp(4);\n}".rstrip())
    # a source that is not a split attention kernel is left alone
    assert timeline.stamp("extern \"C\" __global__ void k() {}") == "extern \"C\" __global__ void k() {}"


def test_a_moved_anchor_stops_the_timeline_with_the_line_it_looked_for():
    src = _split_source().replace("napkin::cp_async_wait_all();", "napkin::cp_async_wait_all( );")
    with pytest.raises(SystemExit, match="cp_async_wait_all"):
        timeline.stamp(src)


@pytest.mark.nvcc
def test_the_stamped_kernel_builds_with_nvcc():
    from napkin.kernels.nvcc import nvcc_compile

    usage = nvcc_compile(timeline.stamp(_split_source(33)), "sm_90a")
    (kernel,) = usage.kernels.values()
    assert kernel.spill_stores == 0 and kernel.spill_loads == 0, kernel
