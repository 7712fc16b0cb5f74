"""Offline builds with ``nvcc``: what each kernel costs in registers, shared memory and spills.

``nvcc_compile(source, arch)`` inlines the device library into ``source``, runs
``nvcc -cubin --resource-usage -std=c++17 -O3 -gencode=arch=compute_XY,code=sm_XY`` in a temporary
directory and parses ptxas's report into one :class:`KernelResources` per kernel. It needs no GPU,
only the compiler; compile errors raise :class:`~napkin.errors.CodegenError` with the log and the
source lines around each error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from napkin.errors import CodegenError

from .compile import check_arch, format_compile_error
from .library import header_sources, inline_library

NVCC_FLAGS = ("-cubin", "--resource-usage", "-std=c++17", "-O3")

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
                    r"(?P<loads>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<regs>\d+) registers")
_SMEM = re.compile(r"(?P<n>\d+) bytes smem")
_CMEM = re.compile(r"(?P<n>\d+) bytes cmem\[(?P<bank>\d+)\]")
_BARRIERS = re.compile(r"used (?P<n>\d+) barriers")


@dataclass
class KernelResources:
    """ptxas's report on one kernel."""

    name: str
    arch: str = ""
    registers: int = 0
    shared_bytes: int = 0  # static shared memory
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    constant_bytes: int = 0  # all cmem banks together
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass
class ResourceUsage:
    """The kernels of one nvcc build, by the name ptxas gives them (mangled unless extern "C")."""

    arch: str
    kernels: dict[str, KernelResources] = field(default_factory=dict)
    log: str = ""
    cubin: bytes = b""

    def __getitem__(self, name: str) -> KernelResources:
        if name in self.kernels:
            return self.kernels[name]
        matches = [k for k in self.kernels if name in k]
        if len(matches) == 1:
            return self.kernels[matches[0]]
        raise KeyError(f"no single kernel {name!r} in this build; have {sorted(self.kernels)}")

    def __contains__(self, name: str) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self):
        return iter(self.kernels.values())

    @property
    def spilling(self) -> list[KernelResources]:
        """The kernels that spill registers to local memory."""
        return [k for k in self.kernels.values() if k.spills]


def parse_resource_usage(log: str, arch: str = "") -> dict[str, KernelResources]:
    """Per-kernel resources from ptxas's ``--resource-usage`` / ``-v`` report."""
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = kernels.setdefault(m["name"], KernelResources(m["name"], m["arch"]))
            continue
        m = _PROPS.search(line)
        if m:
            name = m["name"]
            current = kernels.setdefault(name, KernelResources(name, arch))
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack_bytes = int(m["stack"])
            current.spill_stores = int(m["stores"])
            current.spill_loads = int(m["loads"])
            continue
        m = _USED.search(line)
        if m:
            current.registers = int(m["regs"])
            s = _SMEM.search(line)
            current.shared_bytes = int(s["n"]) if s else 0
            current.constant_bytes = sum(int(c["n"]) for c in _CMEM.finditer(line))
            b = _BARRIERS.search(line)
            current.barriers = int(b["n"]) if b else 0
    return kernels


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def nvcc_available() -> bool:
    """Whether ``nvcc`` is on the PATH."""
    return nvcc_path() is not None


def gencode(arch: str) -> str:
    """The ``-gencode`` flag for an arch: sm_80 -> arch=compute_80,code=sm_80, sm_90a likewise.

    >>> gencode("sm_90a")
    '-gencode=arch=compute_90a,code=sm_90a'
    """
    check_arch(arch)
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def nvcc_compile(source: str, arch: str = "sm_80", *, options: Iterable[str] = (),
                 filename: str = "kernel.cu", timeout: float = 600) -> ResourceUsage:
    """Build ``source`` (library includes inlined) with nvcc for ``arch`` and report resources."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CodegenError("nvcc is not on the PATH")
    full = inline_library(source, filename=filename)
    with tempfile.TemporaryDirectory(prefix="napkin-nvcc-") as tmp:
        src = Path(tmp) / filename
        out = Path(tmp) / "kernel.cubin"
        src.write_text(full, encoding="utf-8")
        cmd = [nvcc, *NVCC_FLAGS, gencode(arch), *map(str, options), "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as e:
            raise CodegenError(f"nvcc took longer than {timeout} s on {filename}") from e
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0:
            raise CodegenError(format_compile_error(
                log, {filename: source, **header_sources()},
                title=f"nvcc could not compile {filename} for {arch} "
                      f"(exit {proc.returncode}; {' '.join(cmd[1:-3])}):"))
        cubin = out.read_bytes() if out.exists() else b""
    return ResourceUsage(arch=arch, kernels=parse_resource_usage(log, arch), log=log, cubin=cubin)
