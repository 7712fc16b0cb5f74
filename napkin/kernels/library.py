"""The CUDA device library: where its headers live and how a kernel source takes them in.

Generated kernels start with ``#include "napkin.cuh"``. :func:`inline_library` replaces that
line (and the includes inside the headers) with the header text, so the kernel becomes one
self-contained ``.cu`` file that ``nvcc -cubin`` or NVRTC compiles as it stands. ``#line``
directives keep compiler messages pointing at the right file and line: a message about the kernel
names the kernel's own file, a message about the library names ``napkin/<header>.cuh``.

>>> src = '#include "napkin.cuh"\\nextern "C" __global__ void k() {}\\n'
>>> out = inline_library(src, line_directives=False)
>>> '#include "' in out, 'namespace napkin' in out, out.rstrip().endswith('void k() {}')
(False, True, True)
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

#: The library's entry header: the one file a generated kernel includes.
ENTRY_HEADER = "napkin.cuh"

#: The prefix under which library headers appear in compiler messages (``#line`` file names).
HEADER_PREFIX = "napkin/"

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*)?$')


def _cuda_dir():
    return resources.files("napkin.kernels").joinpath("cuda")


@cache
def header_names() -> tuple[str, ...]:
    """The file names of the library's headers (``napkin.cuh``, ``types.cuh``, ...), sorted."""
    return tuple(sorted(p.name for p in _cuda_dir().iterdir() if p.name.endswith(".cuh")))


def _header_key(name: str) -> str | None:
    """The library header an include names (``napkin.cuh``, ``napkin/mma.cuh``), or None."""
    base = name.removeprefix(HEADER_PREFIX)
    return base if base in header_names() else None


@cache
def header_text(name: str) -> str:
    """The text of one library header, by file name (``mma.cuh`` or ``napkin/mma.cuh``)."""
    key = _header_key(name)
    if key is None:
        raise KeyError(f"no header {name!r} in the napkin device library; have {header_names()}")
    return _cuda_dir().joinpath(key).read_text(encoding="utf-8")


def header_sources() -> dict[str, str]:
    """Every header's text keyed by the name compiler messages use for it (``napkin/<name>``)."""
    return {HEADER_PREFIX + n: header_text(n) for n in header_names()}


def _quote(filename: str) -> str:
    return filename.replace("\\", "\\\\").replace('"', '\\"')


def inline_library(source: str, *, filename: str = "kernel.cu",
                   line_directives: bool = True) -> str:
    """``source`` with every ``#include`` of a library header replaced by the header's text.

    Nested includes are followed; each header is taken in once (later includes of it vanish).
    Includes of anything else (``<cuda_fp16.h>``, a user's own file) stay as they are.
    ``filename`` is the name compiler messages should give the kernel's own lines; with
    ``line_directives`` each inlined header is framed by ``#line`` so messages keep pointing at
    the original file and line.
    """
    done: set[str] = set()
    out: list[str] = []

    def expand(text: str, fname: str) -> None:
        lines = text.splitlines()
        for number, line in enumerate(lines, start=1):
            m = _INCLUDE.match(line)
            key = _header_key(m.group(1)) if m else None
            if key is None:
                out.append(line)
                continue
            if key in done:
                out.append(f"// (napkin: {key} already included)")
                continue
            done.add(key)
            if line_directives:
                out.append(f'#line 1 "{_quote(HEADER_PREFIX + key)}"')
            expand(header_text(key), HEADER_PREFIX + key)
            if line_directives:
                out.append(f'#line {number + 1} "{_quote(fname)}"')

    expand(source, filename)
    return "\n".join(out) + "\n"


def library_source(*, line_directives: bool = False) -> str:
    """The whole device library as one text (``napkin.cuh`` with every include inlined)."""
    return inline_library(f'#include "{ENTRY_HEADER}"\n', filename="napkin_library.cu",
                          line_directives=line_directives)
