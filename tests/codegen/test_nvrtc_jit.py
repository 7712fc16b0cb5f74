"""Every template compiles under NVRTC, the compiler napkin's kernels meet at run time.

CI compiles every generated kernel with nvcc, but a GPU machine compiles it with NVRTC (through
CuPy), whose JIT mode refuses some things nvcc takes: a function with no execution-space
annotation is a host function there, and host functions are not allowed (a ``constexpr`` helper at
namespace scope in the fp32 template failed 75 GPU tests so, after nvcc had built it). Here the
kernel of every sanitizer case (``benchmarks/sanitize.py``: one planned kernel of every template at
edge shapes) is compiled with the NVRTC of the ``nvidia-cuda-nvrtc`` wheel, as
``napkin.kernels.compile.nvrtc_compile`` compiles it, on each target its case runs on.
"""

from __future__ import annotations

import pytest
from napkin_test_support import nvrtc_errors, nvrtc_library, sanitize_module

from napkin.kernels.compile import BASE_OPTIONS, cuda_include_dirs
from napkin.kernels.library import inline_library

pytestmark = pytest.mark.nvcc  # the CUDA headers come from the toolkit beside nvcc

SANITIZE = sanitize_module()
GPU_OF = {"sm_90a": "h200", "sm_80": "a100"}
CASES = [(c, arch) for c in SANITIZE.CASES for arch in c.archs]


@pytest.fixture(scope="module")
def nvrtc():
    lib = nvrtc_library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed (pip install -e '.[test]')")
    if not cuda_include_dirs():
        pytest.skip("no CUDA headers (cuda_fp16.h) beside nvcc or under CUDA_PATH")
    return lib


def _options(arch: str) -> list[str]:
    return [f"--gpu-architecture={arch}", *BASE_OPTIONS, *(f"-I{d}" for d in cuda_include_dirs())]


@pytest.mark.parametrize("case, arch", CASES, ids=[f"{c.template}-{c.name}-{c.dtype}-{a}" for c, a in CASES])
def test_the_kernel_of_every_template_compiles_under_nvrtc(nvrtc, case, arch):
    k = case.compile(gpu=GPU_OF[arch])
    filename = f"{case.name}.cu"
    log = nvrtc_errors(nvrtc, inline_library(k.program.source(), filename=filename), filename, _options(arch))
    assert log is None, log[:4000]


def test_nvrtc_refuses_a_function_with_no_execution_space(nvrtc):
    """What nvcc takes and NVRTC's JIT mode does not: the check can fail."""
    bad = "constexpr int twice(int x) { return 2 * x; }\n" \
          "extern \"C\" __global__ void k(int* y) { constexpr int n = twice(2); y[0] = n; }\n"
    log = nvrtc_errors(nvrtc, bad, "bad.cu", _options("sm_90a"))
    assert log is not None and "host function" in log
    good = bad.replace("constexpr int twice", "__device__ constexpr int twice")
    assert nvrtc_errors(nvrtc, good, "good.cu", _options("sm_90a")) is None
