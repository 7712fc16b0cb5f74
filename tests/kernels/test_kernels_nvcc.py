"""nvcc builds: parsing ptxas's report (CPU) and building the device tests (marked ``nvcc``)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from napkin.errors import CodegenError
from napkin.kernels.nvcc import gencode, nvcc_compile, parse_resource_usage

DEVICE_TESTS = (Path(__file__).parent / "device_tests.cu").read_text()

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4gemmILi3EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z4gemmILi3EEvPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 29184 bytes smem, 392 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 13.983 ms
ptxas info    : Compiling entry function 'spiller' for 'sm_80'
ptxas info    : Function properties for spiller
    96 bytes stack frame, 44 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 96 bytes cumulative stack size, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'plain' for 'sm_90a'
ptxas info    : Function properties for plain
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""


def test_parse_resource_usage():
    k = parse_resource_usage(PTXAS_LOG, "sm_80")
    assert list(k) == ["_Z4gemmILi3EEvPf", "spiller", "plain"]
    g = k["_Z4gemmILi3EEvPf"]
    assert (g.registers, g.shared_bytes, g.constant_bytes, g.barriers, g.stack_bytes) == \
        (128, 29184, 400, 1, 0)
    assert not g.spills and g.arch == "sm_80"
    s = k["spiller"]
    assert (s.stack_bytes, s.spill_stores, s.spill_loads, s.registers, s.shared_bytes) == \
        (96, 44, 52, 16, 0)
    assert s.spills
    p = k["plain"]
    assert (p.registers, p.constant_bytes, p.arch) == (8, 0, "sm_90a")


def test_gencode():
    assert gencode("sm_80") == "-gencode=arch=compute_80,code=sm_80"
    assert gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    with pytest.raises(CodegenError):
        gencode("compute_90")


@pytest.fixture(scope="module")
def builds():
    """The device tests built for sm_80 and sm_90a (the two nvcc runs side by side)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {arch: pool.submit(nvcc_compile, DEVICE_TESTS, arch, filename="device_tests.cu")
                   for arch in ("sm_80", "sm_90a")}
        return {arch: f.result() for arch, f in futures.items()}


@pytest.fixture(params=["sm_80", "sm_90a"])
def build(request, builds):
    return builds[request.param]


@pytest.mark.nvcc
def test_device_tests_build_without_spills(build):
    declared = set(re.findall(r'extern "C" __global__ void(?: __launch_bounds__\(\d+\))?\s+(\w+)',
                              DEVICE_TESTS))
    built = set(build.kernels)
    expected = declared if build.arch == "sm_90a" else declared - {"hopper_wgmma_fences"}
    assert built == expected
    assert build.spilling == [], [(k.name, k.spill_stores, k.spill_loads) for k in build.spilling]
    for k in build:
        assert k.registers > 0, k.name
        assert k.stack_bytes == 0, f"{k.name} uses {k.stack_bytes} bytes of stack"
        assert k.arch == build.arch
    assert build["gemm_bf16_kn_f32"].shared_bytes == 3 * (64 * 40 + 32 * 72) * 2
    assert build["attention_bf16"].shared_bytes == (64 + 32 + 32) * 72 * 2
    assert build.cubin[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_hopper_path_exists_only_for_sm_90(build):
    roundtrip = build["hopper_bulk_roundtrip"]
    if build.arch == "sm_90a":
        assert roundtrip.shared_bytes >= 4096 + 8
        assert "hopper_wgmma_fences" in build
    else:
        assert roundtrip.shared_bytes == 0  # the sm_80 body is only a trap
        assert "hopper_wgmma_fences" not in build


@pytest.mark.nvcc
def test_spills_are_reported():
    src = """
extern "C" __global__ void heavy(float* x, int n) {
  float a[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) a[i] = x[i * n + threadIdx.x];
  float s = 0.f;
#pragma unroll
  for (int j = 1; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 48; ++i) s += a[i] * a[(i + j) % 48];
  x[threadIdx.x] = s;
}
"""
    k = nvcc_compile(src, "sm_80", options=("-maxrregcount=24",))["heavy"]
    assert k.spills and k.spill_stores > 0 and k.spill_loads > 0


@pytest.mark.nvcc
def test_compile_error_has_log_and_source_lines():
    bad = ('#include "napkin.cuh"\n'
           'extern "C" __global__ void broken(float* y) {\n'
           '  napkin::TileC<16, 16> c;\n'
           '  napkin::fill(c, 0.f, 1);\n'
           '}\n')
    with pytest.raises(CodegenError) as info:
        nvcc_compile(bad, "sm_80", filename="broken.cu")
    text = str(info.value)
    assert "nvcc could not compile broken.cu for sm_80" in text
    assert "broken.cu(4): error" in text
    assert ">    4 |   napkin::fill(c, 0.f, 1);" in text
    assert "     1 | #include \"napkin.cuh\"" in text
