"""``napkin.codegen.compile``: a diagram in, a callable on torch CUDA tensors out.

>>> import napkin.codegen as cg                                  # doctest: +SKIP
>>> ln = cg.compile("layernorm", sizes={"r": 4096, "x": 4096})   # doctest: +SKIP
>>> Y = ln(X, gamma, beta)                                       # doctest: +SKIP

:func:`compile` binds the sizes, derives the plan (:func:`napkin.codegen.planner.derive`: the
partition into kernels, each kernel's family, tiles and options), builds it
(:func:`napkin.codegen.lower.build`) and compiles every
launch with :func:`napkin.kernels.compile_kernel` (one NVRTC compilation per program, cached on
disk). The :class:`CompiledDiagram` checks its tensors (dtype, shape from the bound axes,
device, contiguity; a :class:`~napkin.errors.LaunchError` names the argument), allocates the
intermediates and outputs (or writes into the ``out`` tensors given) and launches every kernel
on the current CUDA stream.
"""

from __future__ import annotations

import math
from typing import Mapping

from ..errors import LaunchError
from .program import Program

__all__ = ["compile", "CompiledDiagram"]


class CompiledDiagram:
    """A lowered, compiled diagram; call it with torch CUDA tensors.

    Attributes: ``diagram`` (bound), ``plan`` (what derive derived), ``program``, ``schedule``,
    ``family``, ``source`` (all kernels with the device library inlined: one self-contained .cu),
    ``arch``, ``gpu``.
    """

    def __init__(self, program: Program, *, arch: str | None = None, gpu=None, kernels=None):
        self.program = program
        self.plan = program.plan
        self.diagram = program.diagram
        self.schedule = program.schedule
        self.family = program.family
        self.gpu = gpu
        self.arch = arch
        self._kernels = kernels
        self._without_tma_program: CompiledDiagram | None = None
        self._shapes = {v.name: tuple(a.bound_size for a in v.axes) for v in self.diagram.inputs}
        self._dtypes = {v.name: v.dtype for v in self.diagram.inputs}
        self._out_shapes = {n: tuple(a.bound_size for a in v.axes)
                            for n, v in zip(self.diagram.output_names, self.diagram.outputs)}
        self._out_dtypes = {n: v.dtype for n, v in zip(self.diagram.output_names, self.diagram.outputs)}

    # ------------------------------------------------------------------ views
    @property
    def source(self) -> str:
        from ..kernels.library import inline_library

        return inline_library(self.program.source(), filename=f"{self.diagram.name}.cu", line_directives=False)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.diagram.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.diagram.output_names

    @property
    def launches(self):
        return self.program.launches

    def __repr__(self) -> str:
        return (f"CompiledDiagram({self.diagram.name!r}, family={self.family!r}, "
                f"{len(self.program.launches)} launch(es), arch={self.arch!r})")

    def _compiled(self):
        if self._kernels is None:
            from ..kernels import compile_kernel

            src = self.program.source()
            self._kernels = [compile_kernel(src, k.name, arch=self.arch, filename=f"{self.diagram.name}.cu")
                             for k in self.program.launches]
            self.arch = self.arch or (self._kernels[0].arch if self._kernels else None)
        return self._kernels

    # ------------------------------------------------------------------ calling
    def _bind_inputs(self, tensors, by_name) -> dict:
        names = self.diagram.input_names
        if len(tensors) > len(names):
            raise LaunchError(f"{self.diagram.name} takes {len(names)} input(s) ({', '.join(names)}), "
                              f"got {len(tensors)} by position")
        got = dict(zip(names, tensors))
        for n, t in by_name.items():
            if n not in names:
                raise LaunchError(f"{self.diagram.name} has no input {n!r}; inputs are {', '.join(names)}")
            if n in got:
                raise LaunchError(f"input {n} given twice (by position and by name)")
            got[n] = t
        missing = [n for n in names if n not in got]
        if missing:
            raise LaunchError(f"{self.diagram.name}: missing input(s) {', '.join(missing)} "
                              f"(inputs in order: {', '.join(names)})")
        return got

    def _outputs(self, out, device) -> dict:
        import torch

        from ..dtypes import torch_dtype
        from ..kernels import check_tensor

        names = self.output_names
        given: dict = {}
        if out is None:
            pass
        elif isinstance(out, torch.Tensor):
            if len(names) != 1:
                raise LaunchError(f"{self.diagram.name} has {len(names)} outputs; pass out as a tuple or dict")
            given = {names[0]: out}
        elif isinstance(out, Mapping):
            unknown = set(out) - set(names)
            if unknown:
                raise LaunchError(f"{self.diagram.name} has no output {sorted(unknown)}; outputs: {', '.join(names)}")
            given = dict(out)
        elif isinstance(out, (tuple, list)):
            seq = list(out)
            if len(seq) != len(names):
                raise LaunchError(f"out: expected {len(names)} tensor(s) ({', '.join(names)}), got {len(seq)}")
            given = dict(zip(names, seq))
        else:  # a NumPy array, a number: never iterated into rows
            raise LaunchError(f"out: expected a torch tensor, or a tuple, list or dict of them, got "
                              f"{type(out).__name__}")
        result = {}
        for n in names:
            if n in given:
                result[n] = check_tensor(given[n], f"out[{n}]", dtype=self._out_dtypes[n], shape=self._out_shapes[n],
                                         device=device)
            else:
                result[n] = torch.empty(self._out_shapes[n], dtype=torch_dtype(self._out_dtypes[n]), device=device)
        return result

    def __call__(self, *tensors, out=None, **by_name):
        """Run the diagram on torch CUDA tensors (by position in ``diagram.inputs`` order, or by
        name). Returns the output tensor, or a tuple of them in ``output_names`` order."""
        import numpy
        import torch

        from ..dtypes import torch_dtype
        from ..kernels import check_tensor
        from ..kernels.tma import tensor_map

        got = self._bind_inputs(tensors, by_name)
        first = next(iter(got.values()), None)
        device = first.device if isinstance(first, torch.Tensor) and first.is_cuda else "cuda"
        env = {}
        for n, t in got.items():
            env[n] = check_tensor(t, n, dtype=self._dtypes[n], shape=self._shapes[n], device=device)
        if not self._tma_can_read(env):
            return self.without_tma()(**env, out=out)
        outs = self._outputs(out, device)
        env.update(outs)
        for b in self.program.buffers:
            env[b.name] = torch.empty(b.shape, dtype=torch_dtype(b.dtype), device=device)
        kernels = self._compiled()
        for k, launch in zip(kernels, self.program.launches):
            args = []
            for a in launch.args:
                if a.kind == "tensor":
                    args.append(env[a.name])
                elif a.kind == "tmap":
                    args.append(tensor_map(env[a.name], a.value))
                elif a.kind == "i64":
                    args.append(numpy.int64(a.value))
                elif a.kind == "int":
                    args.append(int(a.value))
                else:
                    args.append(float(a.value))
            k(launch.grid, launch.block, args, launch.shared_bytes)
        res = tuple(outs[n] for n in self.output_names)
        return res[0] if len(res) == 1 else res

    def _tma_can_read(self, env) -> bool:
        """Whether every tensor the caller passed that the program copies with TMA starts on a 16-byte
        boundary (the buffers between kernels are napkin's own allocations, always aligned)."""
        return all(env[a.name].data_ptr() % 16 == 0 for k in self.program.launches for a in k.args
                   if a.kind == "tmap" and a.name in env)

    def without_tma(self) -> "CompiledDiagram":
        """The same diagram lowered with the model's best schedule whose kernels copy no tile with
        TMA (TMA needs 16-byte aligned operands; a contiguous view one element into its storage is
        still a valid argument, so it runs here instead)."""
        if self._without_tma_program is None:
            from ..errors import NapkinError
            from .lower import build
            from .planner import derive

            try:
                plan = derive(self.diagram, self.gpu, arch=self.arch, exclude_engines=("wgmma",),
                              families=sorted(set(self.plan.families)) if self.plan is not None else None,
                              explain=False).plan
                program = build(plan, arch=self.arch)
            except NapkinError as e:
                raise LaunchError(f"{self.diagram.name}: the inputs are not 16-byte aligned and no plan without "
                                  f"TMA copies exists ({e}); pass aligned tensors (.clone())") from None
            if any(a.kind == "tmap" for k in program.launches for a in k.args):
                raise LaunchError(f"{self.diagram.name}: the inputs are not 16-byte aligned and no plan without "
                                  "TMA copies exists; pass aligned tensors (.clone())")
            self._without_tma_program = CompiledDiagram(program, arch=self.arch, gpu=self.gpu)
        return self._without_tma_program

    def empty_outputs(self, device="cuda", fill: float | None = None) -> dict:
        """Output tensors of the right shapes and dtypes (filled with ``fill`` if given)."""
        import torch

        from ..dtypes import torch_dtype

        out = {}
        for n in self.output_names:
            t = torch.empty(self._out_shapes[n], dtype=torch_dtype(self._out_dtypes[n]), device=device)
            if fill is not None:
                t.fill_(fill)
            out[n] = t
        return out

    @property
    def hbm_bytes(self) -> int:
        """Bytes the inputs and outputs occupy (what a perfect kernel moves once)."""
        from ..dtypes import dtype as lookup

        d = self.diagram
        total = 0
        for v in (*d.inputs, *d.outputs):
            total += math.prod(a.bound_size for a in v.axes) * lookup(v.dtype).bytes
        return total


def compile(diagram, *, gpu=None, sizes: Mapping[str, int] | None = None, dtype: str | None = None,
            schedule=None, family: str | None = None, plan=None) -> CompiledDiagram:
    """Derive ``diagram``'s plan (a Diagram or a library name) and compile it for the GPU at hand:
    :func:`napkin.codegen.planner.derive` followed by :func:`napkin.codegen.lower.build`.

    ``sizes`` binds axis sizes, ``dtype`` recasts every array, ``gpu`` names the profile the plan
    is ranked on (default: the GPU at hand). ``plan`` builds a plan derived before;
    ``schedule`` runs a hand-written schedule as given; ``family`` restricts the families the
    planner may use. Kernels compile at the first call (or here when a GPU exists).
    """
    from ..perfmodel.hardware import check_arch
    from .lower import build
    from .planner import derive, plan_schedule
    from .prepare import prepare
    from .select import resolve_gpu

    gpu_p = resolve_gpu(gpu)
    arch = None
    try:
        from ..kernels.compile import detect_arch

        arch = detect_arch()
    except Exception:  # noqa: BLE001 - no GPU here: lower for the profile's arch, compile later
        arch = None
    if plan is None:
        d = prepare(diagram, sizes=sizes, dtype=dtype)
        if schedule is not None:
            plan = plan_schedule(d, schedule, gpu_p, family=family, arch=arch or gpu_p.arch)
        else:
            plan = derive(d, gpu_p, dtype, arch=arch or gpu_p.arch, explain=False,
                          families=[family] if family is not None else None).plan
    program = build(plan, arch=check_arch(arch or plan.arch))
    cd = CompiledDiagram(program, arch=arch, gpu=gpu_p)
    if arch is not None:
        cd._compiled()
    return cd
