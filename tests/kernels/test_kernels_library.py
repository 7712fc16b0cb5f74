"""The device library's headers and inlining them into a kernel source."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from napkin.kernels.library import (
    header_names,
    header_sources,
    header_text,
    inline_library,
    library_source,
)

HEADERS = {"napkin.cuh", "types.cuh", "memory.cuh", "reduce.cuh", "mma.cuh", "softmax.cuh",
           "hopper.cuh", "halfmath.cuh"}

KERNEL = """#include "napkin.cuh"
// a generated kernel
extern "C" __global__ void scale_rows(float* x, int n) {
  float v = napkin::warp_sum(x[threadIdx.x]);
  if (threadIdx.x == 0) x[0] = v;
}
"""


def line_map(text: str) -> list[tuple[str, int, str]]:
    """(file, line, text) for every non-directive line, following ``#line`` as a compiler does."""
    out = []
    current, number = "?", 0
    for raw in text.splitlines():
        m = re.match(r'#line (\d+) "([^"]+)"', raw)
        if m:
            number, current = int(m.group(1)) - 1, m.group(2)
            continue
        number += 1
        out.append((current, number, raw))
    return out


def test_all_headers_are_present_and_documented():
    assert set(header_names()) == HEADERS
    for name in header_names():
        text = header_text(name)
        first = text.splitlines()[0]
        assert first.startswith(f"// {name} — "), f"{name} must open with a comment naming it"
        for marker in ("TO" + "DO", "FIX" + "ME", "X" + "XX"):  # spelled apart: no marker here
            assert marker not in text, f"{name} has a {marker} comment"


def test_headers_include_no_host_standard_library():
    """NVRTC has no host headers: only cuda_fp16.h / cuda_bf16.h may be included with <>."""
    for name in header_names():
        for inc in re.findall(r'#\s*include\s*<([^>]+)>', header_text(name)):
            assert inc in ("cuda_fp16.h", "cuda_bf16.h"), f"{name} includes <{inc}>"
        for inc in re.findall(r'#\s*include\s*"([^"]+)"', header_text(name)):
            assert inc in HEADERS, f"{name} includes {inc!r}, not a library header"


def test_everything_lives_in_namespace_napkin():
    for name in header_names():
        text = header_text(name)
        if name != "napkin.cuh":
            assert "namespace napkin {" in text, name


def test_inline_replaces_includes_with_header_text_once():
    out = inline_library(KERNEL)
    assert '#include "' not in out
    assert out.count("#ifndef NAPKIN_TYPES_CUH") == 1
    assert out.count("#ifndef NAPKIN_MMA_CUH") == 1
    for name in HEADERS:
        assert f'#line 1 "napkin/{name}"' in out
    assert "napkin::warp_sum" in out


def test_line_directives_keep_kernel_and_header_lines():
    out = inline_library(KERNEL, filename="gen.cu")
    mapped = line_map(out)
    kernel_lines = KERNEL.splitlines()
    own = [(n, t) for f, n, t in mapped if f == "gen.cu"]
    # every kernel line but the include appears with its original number
    assert own == [(i + 1, t) for i, t in enumerate(kernel_lines) if i > 0]
    mma = header_text("mma.cuh").splitlines()
    for f, n, t in mapped:
        if f == "napkin/mma.cuh" and not t.startswith("// (napkin:"):
            assert mma[n - 1] == t


def test_nested_and_repeated_includes():
    src = '#include "mma.cuh"\n#include "napkin/reduce.cuh"\n#include "mma.cuh"\nint x;\n'
    out = inline_library(src, line_directives=False)
    assert out.count("#ifndef NAPKIN_REDUCE_CUH") == 1
    assert "#ifndef NAPKIN_TYPES_CUH" in out and "#ifndef NAPKIN_MEMORY_CUH" in out
    assert "#ifndef NAPKIN_SOFTMAX_CUH" not in out  # only what mma.cuh needs
    assert out.rstrip().endswith("int x;")
    assert "already included" in out


def test_other_includes_are_left_alone():
    src = '#include <cuda_fp16.h>\n#include "user_header.h"\n  #  include "napkin.cuh"  // lib\n'
    out = inline_library(src, line_directives=False)
    assert out.startswith('#include <cuda_fp16.h>\n#include "user_header.h"\n')
    assert '#  include "napkin.cuh"' not in out


def test_library_source_is_self_contained():
    text = library_source()
    assert '#include "' not in text
    for s in ("struct OnlineSoftmax", "ldmatrix_x4_trans", "cp_async16", "block_reduce",
              "mbarrier_init", "fence_proxy_async", "to_a"):
        assert s in text
    assert set(header_sources()) == {f"napkin/{n}" for n in HEADERS}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_inlined_kernel_compiles_with_bare_nvcc(tmp_path, arch):
    src = tmp_path / "gen.cu"
    src.write_text(inline_library(KERNEL, filename="gen.cu"))
    cc = arch[3:]
    proc = subprocess.run(
        [shutil.which("nvcc"), "-cubin", "-std=c++17", "-O3",
         f"-gencode=arch=compute_{cc},code={arch}", "-o", str(tmp_path / "gen.cubin"), str(src)],
        cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "gen.cubin").stat().st_size > 0
