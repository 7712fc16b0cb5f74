"""Compile-error messages, arch handling and the compile/cache glue (no GPU, no CuPy needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import napkin.kernels.compile as comp
from napkin.errors import CodegenError
from napkin.kernels import KernelCache, format_compile_error
from napkin.kernels.compile import arch_for_capability, check_arch, source_excerpt
from napkin.kernels.library import header_sources, header_text

REPO = Path(__file__).resolve().parents[2]

GENERATED = "\n".join(f"line {i} of the kernel" for i in range(1, 21)) + "\n"

FAKE_NVRTC_LOG = """\
kernel.cu(12): error: identifier "tile" is undefined
      tile[0] = 1;
      ^

kernel.cu(12): error: expected a ";"
kernel.cu(3): warning #177-D: variable "unused" was declared but never referenced
kernel.cu(19): error: too few arguments in function call
napkin/mma.cuh(40): error: no instance of overloaded function "napkin::mma" matches

3 errors detected in the compilation of "kernel.cu".
"""


def test_error_message_has_log_and_numbered_context():
    sources = {"kernel.cu": GENERATED, **header_sources()}
    msg = format_compile_error(FAKE_NVRTC_LOG, sources, title="NVRTC could not compile:")
    assert msg.startswith("NVRTC could not compile:")
    assert 'identifier "tile" is undefined' in msg  # the log itself
    block = msg.split("kernel.cu, line 12: error\n")[1].split("\n\n")[0].splitlines()
    assert block == [f"{'>' if i == 12 else ' '}{i:>5} | line {i} of the kernel"
                     for i in range(9, 16)]
    assert msg.count("kernel.cu, line 12") == 1  # one excerpt per line
    # near the end of the file the excerpt stops at the last line
    tail = msg.split("kernel.cu, line 19: error\n")[1].split("\n\n")[0].splitlines()
    assert tail[0].startswith("    16 |") and tail[-1].startswith("    20 |")
    assert tail[3].startswith(">   19 |")
    # warnings get no excerpt
    assert "kernel.cu, line 3" not in msg
    # a library header's error shows the header's own lines
    mma_line = header_text("mma.cuh").splitlines()[39]
    assert f">   40 | {mma_line}" in msg


def test_nvcc_style_paths_and_unknown_files():
    log = ("/tmp/napkin-nvcc-abc/gen.cu(2): error: oops\n"
           "/usr/include/whatever.h(7): error: not ours\n")
    msg = format_compile_error(log, {"gen.cu": "a\nb\nc\n"}, title="nvcc failed:")
    assert "gen.cu, line 2: error" in msg and ">    2 | b" in msg
    assert "whatever.h, line" not in msg


def test_catastrophic_error_and_empty_log():
    msg = format_compile_error('kernel.cu(1): catastrophic error: cannot open source file "x.h"',
                               {"kernel.cu": "#include \"x.h\"\n"}, title="t")
    assert '>    1 | #include "x.h"' in msg
    assert "printed no log" in format_compile_error("", {}, title="t")


def test_too_many_errors_are_cut():
    log = "\n".join(f"kernel.cu({i}): error: bad" for i in range(1, 21))
    msg = format_compile_error(log, {"kernel.cu": GENERATED}, title="t", max_errors=3)
    assert msg.count(", line ") == 3 and "further errors not shown" in msg


def test_source_excerpt_at_the_start():
    assert source_excerpt("only\n", 1) == ">    1 | only"
    assert source_excerpt("a\nb\nc\nd\ne\n", 1, context=2).splitlines()[-1] == "     3 | c"


def test_arch_names():
    assert arch_for_capability(9, 0) == "sm_90a"
    assert arch_for_capability(8, 0) == "sm_80"
    assert arch_for_capability(8, 6) == "sm_86"
    assert arch_for_capability(10, 0) == "sm_100"
    for good in ("sm_80", "sm_90a", "sm_100"):
        assert check_arch(good) == good
    for bad in ("sm80", "compute_80", "sm_9x", "", None):
        with pytest.raises(CodegenError, match="unknown GPU architecture"):
            check_arch(bad)


def test_importing_the_package_loads_neither_torch_nor_cupy():
    code = ("import sys, napkin.kernels, napkin.kernels.compile, napkin.kernels.launch, "
            "napkin.kernels.nvcc; "
            "bad = [m for m in ('torch', 'cupy') if m in sys.modules]; "
            "assert not bad, bad")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_kernel_name_must_be_in_the_source():
    with pytest.raises(CodegenError, match="'missing' does not appear"):
        comp.compile_kernel('extern "C" __global__ void present() {}', "missing", arch="sm_80")


@pytest.fixture
def fake_nvrtc(monkeypatch, tmp_path):
    """compile_module with NVRTC replaced by a recorder, and a private disk cache."""
    calls = []

    def fake(source, *, arch, options=(), filename="kernel.cu"):
        calls.append((source, arch, tuple(options), filename))
        return b"CUBIN:" + arch.encode() + b":" + source.encode()[-20:]

    monkeypatch.setattr(comp, "nvrtc_compile", fake)
    monkeypatch.setattr(comp, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(comp, "_modules", {})
    monkeypatch.setattr(comp, "default_cache", lambda: KernelCache(tmp_path))
    return calls


SOURCE = ('#include "napkin.cuh"\n'
          'extern "C" __global__ void first(float* x) { x[0] = 1; }\n'
          'extern "C" __global__ void second(float* x) { x[0] = 2; }\n')


def test_one_compilation_serves_every_kernel_of_a_source(fake_nvrtc, tmp_path):
    k1 = comp.compile_kernel(SOURCE, "first", arch="sm_80")
    k2 = comp.compile_kernel(SOURCE, "second", arch="sm_80")
    assert len(fake_nvrtc) == 1
    assert k1.module is k2.module and (k1.name, k2.name) == ("first", "second")
    assert k1.arch == "sm_80"
    # the compiler got the original source (it inlines the library itself), the arch and options
    source, arch, _options, filename = fake_nvrtc[0]
    assert (source, arch, filename) == (SOURCE, "sm_80", "kernel.cu")
    assert len(list(tmp_path.glob("*.cubin"))) == 1


def test_options_and_arch_make_new_compilations(fake_nvrtc):
    comp.compile_kernel(SOURCE, "first", arch="sm_80")
    comp.compile_kernel(SOURCE, "first", arch="sm_90a")
    comp.compile_kernel(SOURCE, "first", arch="sm_80", options=("-lineinfo",))
    assert [(c[1], c[2]) for c in fake_nvrtc] == [
        ("sm_80", ()), ("sm_90a", ()), ("sm_80", ("-lineinfo",))]


def test_disk_cache_is_used_by_a_new_process_state(fake_nvrtc, monkeypatch):
    first = comp.compile_kernel(SOURCE, "first", arch="sm_90a")
    monkeypatch.setattr(comp, "_modules", {})
    again = comp.compile_kernel(SOURCE, "first", arch="sm_90a")
    assert len(fake_nvrtc) == 1
    assert again.module is not first.module and again.module.cubin == first.module.cubin


def test_library_change_changes_the_key(fake_nvrtc, monkeypatch):
    comp.compile_kernel(SOURCE, "first", arch="sm_80")
    monkeypatch.setattr(comp, "inline_library",
                        lambda src, filename="kernel.cu": src + "// library v2\n")
    comp.compile_kernel(SOURCE, "first", arch="sm_80")
    assert len(fake_nvrtc) == 2


def test_compile_error_propagates_as_codegen_error(monkeypatch, tmp_path):
    def failing(source, *, arch, options=(), filename="kernel.cu"):
        raise CodegenError("NVRTC could not compile kernel.cu")

    monkeypatch.setattr(comp, "nvrtc_compile", failing)
    monkeypatch.setattr(comp, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(comp, "_modules", {})
    monkeypatch.setattr(comp, "default_cache", lambda: KernelCache(tmp_path))
    with pytest.raises(CodegenError, match="could not compile"):
        comp.compile_kernel(SOURCE, "first", arch="sm_80")
    assert not list(tmp_path.iterdir())
