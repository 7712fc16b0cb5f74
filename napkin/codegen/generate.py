"""Generating a self-contained ``.cu`` without a GPU.

:func:`generate_source` lowers a diagram for a GPU profile's architecture and returns one file:
a header comment (the diagram, the schedule, every launch with its grid, block, shared memory
and arguments, the intermediate buffers), then every kernel with the device library inlined.
``nvcc -cubin -gencode=arch=compute_90a,code=sm_90a file.cu`` compiles it as it stands.

>>> src = generate_source("softmax", sizes={"r": 4, "x": 100})
>>> src.startswith("// napkin"), '#include "napkin.cuh"' in src
(True, False)
"""

from __future__ import annotations

from typing import Mapping

from .render import comment

__all__ = ["generate_source", "generate_program", "program_header"]


def _summary_lines(diagram) -> list[str]:
    """The diagram in lines built from checked names and op labels (never its description)."""
    return diagram.summary(description=False).splitlines()


def program_header(program, *, gpu_name: str = "", arch: str = "") -> str:
    """The header comment of a generated file (every line sanitised)."""
    lines = [f"napkin generated CUDA: diagram {program.diagram.name}, family {program.family}, "
             f"dtype {program.schedule.dtype}, gpu {gpu_name}, arch {arch}", ""]
    lines += _summary_lines(program.diagram)
    plan = program.plan
    if plan is not None:
        n = len(plan.kernels)
        lines += ["", f"plan ({n} kernel{'s' if n != 1 else ''}, {plan.seconds * 1e6:.1f} us predicted on "
                      f"{plan.gpu}; napkin derive --json prints the same plan):"]
        for pk in plan.kernels:
            k = pk.kernel
            rel = ", ".join(str(r) for r in k.relabels) or "no tiles"
            lines.append(f"  kernel {k.name} [{k.family}]: {' '.join(k.boxes)}  {pk.seconds * 1e6:.1f} us predicted, "
                         f"{pk.bound}-bound")
            lines.append(f"    tiles: {rel}")
            if k.options.to_dict():
                lines.append(f"    options: {k.options}")
            if k.placement:
                lines.append("    placement: " + ", ".join(f"{a}@{lvl}" for a, lvl in k.placement))
    lines += ["", f"launches, in order ({len(program.launches)}):"]
    for i, k in enumerate(program.launches, 1):
        lines.append(f"  {i}. {k.name}  grid ({k.grid[0]}, {k.grid[1]}, {k.grid[2]})  block "
                     f"({k.block[0]}, {k.block[1]}, {k.block[2]})  dynamic smem {k.shared_bytes} B  "
                     f"template {k.template}")
        args = []
        for a in k.args:
            if a.kind == "tensor":
                args.append(f"{a.name}: {a.dtype}[{','.join(a.axes)}]")
            elif a.kind == "tmap":
                seen = f", as [{']['.join(a.axes[i] for i in reversed(a.view))}]" if a.view else ""
                args.append(f"tensor map of {a.name}: {a.dtype}[{','.join(a.axes)}]{seen}, box {a.value}")
            else:
                args.append(f"{a.name}: {a.kind} = {a.value}")
        lines.append(f"     args: {', '.join(args)}")
        if k.tunables:
            lines.append("     tunables: " + ", ".join(f"{n}={v}" for n, v in k.tunables))
        if k.model_regs_per_thread is not None or k.model_smem_bytes is not None:
            lines.append(f"     model: {k.model_regs_per_thread} registers/thread, {k.model_smem_bytes} B "
                         "shared memory/block")
    if program.buffers:
        lines += ["", "intermediate buffers (HBM):"]
        for b in program.buffers:
            lines.append(f"  {b.name}: {b.dtype}[{','.join(b.axes)}] shape ({', '.join(map(str, b.shape))})")
    for n in program.notes:
        lines.append(f"note: {n}")
    lines += ["", f"build: nvcc -cubin -gencode=arch=compute_{arch[3:]},code={arch} <this file>"
              if arch.startswith("sm_") else ""]
    return "\n".join(("// " + comment(line)).rstrip() for line in lines) + "\n"


def generate_program(diagram, *, sizes: Mapping[str, int] | None = None, gpu: str = "h100",
                     dtype: str = "bf16", schedule=None, family: str | None = None, plan=None):
    """``(source, program)``: the self-contained ``.cu`` for ``diagram`` at ``sizes``, built from
    its derived plan (or ``plan``, or a hand-written ``schedule``) for ``gpu``'s architecture (no
    GPU needed), and the program it holds (``program.plan`` is the plan)."""
    from ..kernels.library import inline_library
    from ..perfmodel.hardware import check_arch, get_gpu
    from .lower import build, lower

    g = get_gpu(gpu)
    if plan is not None:
        program = build(plan, arch=check_arch(plan.arch))
    else:
        program = lower(diagram, schedule, gpu=g, dtype=dtype, sizes=sizes, family=family, arch=g.arch)
    arch = program.plan.arch if program.plan is not None else g.arch
    body = inline_library(program.source(), filename=f"{program.diagram.name}.cu", line_directives=False)
    return program_header(program, gpu_name=g.key, arch=arch) + "\n" + body, program


def generate_source(diagram, **kw) -> str:
    """A self-contained ``.cu`` for ``diagram`` (see :func:`generate_program`)."""
    return generate_program(diagram, **kw)[0]
