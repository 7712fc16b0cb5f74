"""Compiling generated CUDA with NVRTC (through CuPy) into cached cubins.

``compile_kernel(source, name)`` inlines the device library into ``source``, compiles it for the
current GPU (``sm_90a`` on Hopper, so wgmma is allowed; ``sm_80`` on A100; ``sm_XY`` elsewhere),
keeps the cubin in the disk cache (:mod:`napkin.kernels.cache`) and returns a
:class:`~napkin.kernels.launch.CompiledKernel`. One compilation serves every kernel of a source:
asking for another name of the same source reuses the cubin.

A compile error raises :class:`~napkin.errors.CodegenError` whose message holds the compiler log
and, for each error, the numbered source lines around it (the kernel's own lines, or a library
header's).

CuPy and torch are imported only inside functions: importing this module needs neither.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from napkin.errors import CodegenError

from .cache import KernelCache, default_cache
from .library import header_sources, inline_library

#: Options every NVRTC compilation gets (before the caller's own).
BASE_OPTIONS = ("-std=c++17",)

_ARCH = re.compile(r"\Asm_(\d+)([af]?)\Z")
_DIAG = re.compile(
    r"^(?P<file>.*?)\((?P<line>\d+)\)(?:: | )(?P<kind>catastrophic error|error|warning)\b")


def check_arch(arch: str) -> str:
    """``arch`` if it names a real target (``sm_80``, ``sm_90a``), else a CodegenError."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise CodegenError(f"unknown GPU architecture {arch!r}; expected a name like 'sm_80' or "
                           f"'sm_90a'")
    return arch


def arch_for_capability(major: int, minor: int) -> str:
    """The compile target for a compute capability: the arch-specific ``sm_90a`` on Hopper
    (wgmma and setmaxnreg need it), the plain ``sm_XY`` elsewhere.

    >>> arch_for_capability(9, 0), arch_for_capability(8, 0), arch_for_capability(8, 9)
    ('sm_90a', 'sm_80', 'sm_89')
    """
    base = f"sm_{major}{minor}"
    return base + "a" if (major, minor) == (9, 0) else base


def detect_arch(device: int | None = None) -> str:
    """The compile target of a CUDA device (default: the current one)."""
    try:
        import torch

        if torch.cuda.is_available():
            index = torch.cuda.current_device() if device is None else int(device)
            return arch_for_capability(*torch.cuda.get_device_capability(index))
    except ImportError:
        pass
    try:
        import cupy

        dev = cupy.cuda.Device() if device is None else cupy.cuda.Device(int(device))
        cc = int(dev.compute_capability)
        return arch_for_capability(cc // 10, cc % 10)
    except Exception as e:
        raise CodegenError(f"cannot detect the GPU architecture (no CUDA device?): {e}") from e


# ---- error messages ------------------------------------------------------------------------

def _find_source(name: str, sources: Mapping[str, str]) -> tuple[str, str] | None:
    if name in sources:
        return name, sources[name]
    base = os.path.basename(name)
    for key, text in sources.items():
        if os.path.basename(key) == base or name.endswith("/" + key):
            return key, text
    return None


def source_excerpt(text: str, line: int, context: int = 3) -> str:
    """Lines ``line - context .. line + context`` of ``text``, numbered, the line itself marked.

    >>> print(source_excerpt("a\\nb\\nc\\nd", 2, context=1))
         1 | a
    >    2 | b
         3 | c
    """
    lines = text.splitlines()
    lo = max(1, line - context)
    hi = min(len(lines), line + context)
    width = max(5, len(str(hi)))
    out = []
    for n in range(lo, hi + 1):
        mark = ">" if n == line else " "
        out.append(f"{mark}{n:>{width}} | {lines[n - 1]}")
    return "\n".join(out)


def format_compile_error(log: str, sources: Mapping[str, str], *, title: str,
                         context: int = 3, max_errors: int = 10) -> str:
    """The message of a failed compilation: ``title``, the compiler ``log``, then for each error
    line the numbered lines of the file it names (looked up in ``sources``, file name -> text)."""
    parts = [title.rstrip(), "", log.strip() or "(the compiler printed no log)"]
    seen: set[tuple[str, int]] = set()
    for raw in log.splitlines():
        m = _DIAG.match(raw.strip())
        if not m or m.group("kind") == "warning":
            continue
        found = _find_source(m.group("file"), sources)
        line = int(m.group("line"))
        if found is None or (found[0], line) in seen:
            continue
        seen.add((found[0], line))
        if len(seen) > max_errors:
            parts.append(f"\n(further errors not shown; {max_errors} shown)")
            break
        key, text = found
        parts.append(f"\n{key}, line {line}: {m.group('kind')}")
        parts.append(source_excerpt(text, line, context))
    return "\n".join(parts)


# ---- NVRTC ---------------------------------------------------------------------------------

def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:
        try:
            from cupy.cuda import nvrtc  # older CuPy
        except ImportError as e:
            raise CodegenError("compiling kernels needs CuPy (pip install cupy-cuda13x)") from e
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC that CuPy loads."""
    return tuple(_nvrtc().getVersion())


def cuda_include_dirs() -> list[str]:
    """Directories holding cuda_fp16.h / cuda_bf16.h for NVRTC (which does not carry them).

    Looked for under ``$CUDA_PATH``, ``$CUDA_HOME``, CuPy's CUDA path, beside ``nvcc`` on the
    PATH, and ``/usr/local/cuda``.
    """
    roots: list[str] = [os.environ.get("CUDA_PATH", ""), os.environ.get("CUDA_HOME", "")]
    try:
        import cupy

        roots.append(cupy.cuda.get_cuda_path() or "")
    except Exception:  # noqa: BLE001 - CuPy missing or unable to say
        pass
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    for root in roots:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return [str(Path(root) / "include")]
    return []


def nvrtc_compile(source: str, *, arch: str, options: Iterable[str] = (),
                  filename: str = "kernel.cu") -> bytes:
    """Compile ``source`` (library includes inlined first) with NVRTC into a cubin for ``arch``,
    without the cache."""
    check_arch(arch)
    sources = {filename: source, **header_sources()}
    source = inline_library(source, filename=filename)
    nvrtc = _nvrtc()
    opts = [f"--gpu-architecture={arch}", *BASE_OPTIONS]
    opts += [f"-I{d}" for d in cuda_include_dirs()]
    opts += [str(o) for o in options]
    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CodegenError(format_compile_error(
                log or str(e), sources,
                title=f"NVRTC could not compile {filename} for {arch} "
                      f"(options: {' '.join(opts)}):")) from None
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


# ---- the cached entry points -----------------------------------------------------------------

_modules: dict[str, object] = {}  # cache key -> CompiledModule
_modules_lock = threading.Lock()


def compile_module(source: str, *, options: Iterable[str] = (), arch: str | None = None,
                   filename: str = "kernel.cu", cache: KernelCache | None = None):
    """Compile ``source`` (library includes inlined) once and return its
    :class:`~napkin.kernels.launch.CompiledModule`; repeated calls reuse it."""
    from .launch import CompiledModule

    arch = check_arch(arch) if arch is not None else detect_arch()
    options = tuple(str(o) for o in options)
    full = inline_library(source, filename=filename)
    cache = cache if cache is not None else default_cache()
    extra = ("nvrtc", *map(str, nvrtc_version()), *cuda_include_dirs())
    key = cache.key(full, options, arch, extra)
    with _modules_lock:
        module = _modules.get(key)
    if module is not None:
        return module
    cubin = cache.get_or_compile(
        full, options, arch,
        lambda: nvrtc_compile(source, arch=arch, options=options, filename=filename),
        extra)
    module = CompiledModule(cubin, arch=arch, key=key, filename=filename)
    with _modules_lock:
        return _modules.setdefault(key, module)


def compile_kernel(source: str, name: str, *, options: Iterable[str] = (),
                   arch: str | None = None, filename: str = "kernel.cu"):
    """Compile ``source`` and return its kernel ``name`` (declare kernels ``extern "C"`` so the
    name is not mangled) as a :class:`~napkin.kernels.launch.CompiledKernel`.

    Every kernel of one source shares one compilation (and one cache entry)."""
    if not name.startswith("_Z") and not re.search(rf"\b{re.escape(name)}\b", source):
        raise CodegenError(f"kernel {name!r} does not appear in the source it is compiled from")
    module = compile_module(source, options=options, arch=arch, filename=filename)
    return module.kernel(name)
