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

The host path is prepared once per device (:class:`_Runner`): each launch's parameters are packed
(:class:`~napkin.kernels.launch.PreparedLaunch`), tensor maps are cached per data pointer, and a
call whose tensors pass a cheap check (dtype, shape, device, contiguity, TMA alignment, compared
with what the runner expects) goes straight to the launches; anything else takes the checked path,
which names what is wrong. Plans are cached on disk beside the kernels
(:mod:`napkin.codegen.plancache`), so compiling a diagram a second time, in any process, costs
the cubin's load, not the planner's search.

``compile(..., dynamic={"q": (1, 8192)})`` returns a
:class:`~napkin.codegen.dynamic.DynamicDiagram` instead: one plan for the whole size range,
re-lowered per size, with the compiled kernels reused wherever the source does not change.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Mapping

from ..errors import LaunchError
from .calling import bind_inputs
from .program import Program

__all__ = ["compile", "CompiledDiagram"]

_log = logging.getLogger(__name__)


class CompiledDiagram:
    """A lowered, compiled diagram; call it with torch CUDA tensors.

    Attributes: ``diagram`` (bound), ``plan`` (what derive derived), ``program``, ``schedule``,
    ``family``, ``source`` (all kernels with the device library inlined: one self-contained .cu),
    ``arch``, ``gpu``, ``compile_seconds`` (what loading or compiling the kernels took; None
    before).
    """

    def __init__(self, program: Program, *, arch: str | None = None, gpu=None, kernels=None):
        self.program = program
        self.plan = program.plan
        # the caller's arrays: where the plan runs axes folded into one, their shapes are the
        # diagram's own (the bytes are the same, so the kernels take the tensors as they are)
        self.diagram = program.plan.interface if program.plan is not None else program.diagram
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
        self._input_order = self.diagram.input_names  # (the fast path orders inputs given by name)
        # the arrays as the kernels see them: where the plan folds axes, the program's shapes (same
        # bytes). A tensor map is made in these: a sum over (h, d) folded reads one K axis of h·d,
        # not rows of d
        folded = program.diagram
        self._kernel_shapes = {n: tuple(a.bound_size for a in v.axes)
                               for n, v in zip((*folded.input_names, *folded.output_names),
                                               (*folded.inputs, *folded.outputs))}
        # a family may store an array in another dtype than the diagram's (attention's saved
        # log-sum-exp in fp32): the launches' tensor arguments say what the kernels read and write
        for a in (a for k in program.launches for a in k.args if a.kind == "tensor" and a.dtype):
            for table in (self._dtypes, self._out_dtypes):
                if a.name in table:
                    table[a.name] = a.dtype
        self.compile_seconds: float | None = None
        self._runners: dict[int, _Runner] = {}
        self._last: _Runner | None = None  # the runner of the last call (the fast path's guess)
        self._lock = threading.Lock()

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
            from ..kernels import compile_kernel, default_cache

            stats = default_cache().stats
            misses = stats.misses
            start = time.perf_counter()
            src = self.program.source()
            kernels = [compile_kernel(src, k.name, arch=self.arch, filename=f"{self.diagram.name}.cu")
                       for k in self.program.launches]
            self.compile_seconds = time.perf_counter() - start
            self.arch = self.arch or (kernels[0].arch if kernels else None)
            how = "compiled" if stats.misses > misses else "loaded (cached)"
            _log.info("%s: %d kernel(s) %s for %s in %.3f s", self.diagram.name, len(kernels), how, self.arch,
                      self.compile_seconds)
            self._kernels = kernels
        return self._kernels

    def _runner(self, device: int) -> "_Runner":
        """The prepared launches on CUDA device ``device`` (made, and the kernels compiled, once)."""
        r = self._runners.get(device)
        if r is None:
            with self._lock:
                r = self._runners.get(device)
                if r is None:
                    r = self._runners[device] = _Runner(self, device)
        return r

    # ------------------------------------------------------------------ calling
    def _bind_inputs(self, tensors, by_name) -> dict:
        return bind_inputs(self.diagram.name, self.diagram.input_names, tensors, by_name)

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
        if out is None:
            r = self._last
            if r is not None:
                args = tensors if not by_name else self._by_position(tensors, by_name)
                res = r.fast(args) if args is not None else None
                if res is not None:
                    return res
        return self._call_checked(tensors, out, by_name)

    def _by_position(self, tensors, by_name):
        """The inputs given by name, in the diagram's order, when every one is given that way and
        nothing else is (None otherwise: the checked path binds them, or names what is wrong)."""
        order = self._input_order
        if tensors or len(by_name) != len(order):
            return None
        try:
            return tuple(by_name[n] for n in order)
        except KeyError:
            return None

    def _call_checked(self, tensors, out, by_name):
        """Every check, each failure one LaunchError naming the argument; then the launches."""
        import torch

        from ..kernels import check_tensor

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
        if not self._tma_can_read(env):  # an out tensor given that TMA cannot write
            return self.without_tma()(**{n: env[n] for n in self.input_names}, out=out)
        index = next((t.device.index for t in env.values()), None)
        if index is None:
            index = torch.cuda.current_device()
        runner = self._runner(index)
        inputs = [env[n] for n in self.input_names]
        given = [outs[n] for n in self.output_names]
        if index != torch.cuda.current_device():
            with torch.cuda.device(index):
                res = runner.run(inputs, given)
        else:
            res = runner.run(inputs, given)
            self._last = runner
        return res[0] if len(res) == 1 else tuple(res)

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
            schedule=None, family: str | None = None, plan=None, dynamic=None):
    """Derive ``diagram``'s plan (a Diagram or a library name) and compile it for the GPU at hand:
    :func:`napkin.codegen.planner.derive` followed by :func:`napkin.codegen.lower.build`.

    ``sizes`` binds axis sizes, ``dtype`` recasts every array, ``gpu`` names the profile the plan
    is ranked on (default: the GPU at hand). ``plan`` builds a plan derived before;
    ``schedule`` runs a hand-written schedule as given; ``family`` restricts the families the
    planner may use. Kernels compile at the first call (or here when a GPU exists): on
    ``NAPKIN_DEVICE`` when it is set, else on the current device. Derived plans are cached on
    disk (:mod:`napkin.codegen.plancache`).

    ``dynamic`` marks axes whose size changes from call to call (a sequence, a batch): a mapping
    ``{"q": (1, 8192)}`` of size ranges, or axis names whose range is 1 to their size in
    ``sizes``. The result is a :class:`~napkin.codegen.dynamic.DynamicDiagram`, which serves
    every size in the ranges with one plan (see there).
    """
    from ..perfmodel.plan import Plan
    from ..perfmodel.schedule import Schedule

    if plan is not None and not isinstance(plan, Plan):
        raise LaunchError(f"compile: plan= must be a napkin Plan (derive(...).plan), got {type(plan).__name__}")
    if schedule is not None and not isinstance(schedule, Schedule):
        raise LaunchError(f"compile: schedule= must be a napkin Schedule, got {type(schedule).__name__}")
    if dynamic is not None:
        from .dynamic import compile_dynamic

        if plan is not None:
            raise LaunchError("compile: give either plan= or dynamic=, not both (a plan is bound to its sizes)")
        return compile_dynamic(diagram, dynamic, compiled_type=CompiledDiagram, arch=local_arch(), gpu=gpu,
                               sizes=sizes, dtype=dtype, schedule=schedule, family=family)
    from ..perfmodel.hardware import check_arch
    from .lower import build
    from .planner import plan_schedule
    from .plancache import derive_cached
    from .prepare import prepare
    from .select import resolve_gpu

    gpu_p = resolve_gpu(gpu)
    arch = local_arch()
    if plan is None:
        d = prepare(diagram, sizes=sizes, dtype=dtype)
        if schedule is not None:
            plan = plan_schedule(d, schedule, gpu_p, family=family, arch=arch or gpu_p.arch)
        else:
            plan = derive_cached(d, gpu_p, dtype, arch=arch or gpu_p.arch, family=family)
    for note in plan.notes:  # a slow path is said aloud (the scalar fallback), as derive and generate do
        _log.warning("%s: %s", plan.diagram.name, note)
    program = build(plan, arch=check_arch(arch or plan.arch))
    cd = CompiledDiagram(program, arch=arch, gpu=gpu_p)
    if arch is not None:
        cd._compiled()
    return cd


def local_arch() -> str | None:
    """The compile target of ``NAPKIN_DEVICE`` (else the current CUDA device); None without a GPU."""
    try:
        from ..kernels.compile import detect_arch
        from ..settings import cuda_device

        return detect_arch(cuda_device())
    except Exception:  # noqa: BLE001 - no GPU here: lower for the profile's arch, compile later
        return None


#: The largest arena of per-call buffers a compiled diagram keeps per CUDA stream (a larger one,
#: whose kernels take far longer than its allocation, is allocated per call).
KEPT_ARENA_BYTES = 16 << 20

#: The alignment of each buffer inside a call's arena: cudaMalloc's (TMA needs 16 bytes, vector
#: loads up to 16; kernels never assume more than 256).
ARENA_ALIGN = 256


def arena_layout(sizes) -> tuple[tuple[int, ...], int]:
    """Offsets of buffers of ``sizes`` bytes laid end to end in one allocation, each rounded up
    to :data:`ARENA_ALIGN`, and the allocation's size.

    >>> arena_layout([10, 256, 1])
    ((0, 256, 512), 768)
    >>> arena_layout([])
    ((), 0)
    """
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += -(-int(n) // ARENA_ALIGN) * ARENA_ALIGN
    return tuple(offsets), at


class _Runner:
    """A compiled diagram's launches prepared on one CUDA device, and the cheap check in front
    of them.

    Slots of the environment: the inputs in ``diagram.inputs`` order, then the outputs, then the
    intermediate buffers. Each launch knows which slots its pointer and tensor-map parameters
    read. :meth:`fast` takes positional inputs and returns None (never raises a LaunchError)
    when anything differs from what the launches expect: a tensor's dtype, shape, device or
    contiguity, a TMA input off a 16-byte boundary, another current device; the caller then
    takes the checked path, which says what is wrong or handles it.

    The per-call buffers between kernels live in one allocation (:attr:`arena_bytes`, each at
    its offset in :attr:`buf_offsets`, 256-byte aligned as cudaMalloc's): the kernels take only
    their pointers, and one ``torch.empty`` costs what each of them did (7 µs of host time on the
    H100 host measured; a transformer block's backward has 30 such buffers). An arena of at most
    :data:`KEPT_ARENA_BYTES` is made once per CUDA stream and kept (:meth:`_arena`); a
    larger one is allocated per call.

    Persistent workspaces (``Buffer.zeroed``: a split's self-resetting arrival counters) come
    after the per-call buffers in the slots. They are zero-filled once per CUDA stream, on that
    stream, and kept: launches on one stream run in order, so each finds them zero again, while
    calls on two streams at once each have their own. A call captured into a CUDA graph gets a
    fresh arena and fresh workspaces from the graph's pool instead (:meth:`_fresh_buffers`).
    """

    __slots__ = ("device", "n_in", "in_specs", "out_specs", "buf_offsets", "arena_bytes", "zero_specs", "launches",
                 "tma_inputs",
                 "_torch", "_stream", "_current", "_capturing", "_tdevice", "_zeroed", "_arenas")

    def __init__(self, cd: CompiledDiagram, device: int):
        import torch

        from ..dtypes import torch_dtype
        from ..kernels.launch import POINTER
        from ..kernels.tma import TensorMapSlot

        kernels = cd._compiled()
        program = cd.program
        ins, outs = cd.input_names, cd.output_names
        per_call = [b for b in program.buffers if not b.zeroed]
        kept = [b for b in program.buffers if b.zeroed]
        names = list(ins) + list(outs) + [b.name for b in per_call + kept]
        index = {n: i for i, n in enumerate(names)}
        shapes = {**cd._shapes, **cd._out_shapes, **{b.name: tuple(b.shape) for b in program.buffers}}
        dtypes = {**cd._dtypes, **cd._out_dtypes, **{b.name: b.dtype for b in program.buffers}}
        map_shapes = {**shapes, **cd._kernel_shapes}
        self.device, self.n_in = int(device), len(ins)
        self.in_specs = tuple((torch_dtype(dtypes[n]), torch.Size(shapes[n])) for n in ins)
        # each output's sizes as torch.empty's positional arguments: ``empty(*sizes)`` parses
        # faster than ``empty(sizes)`` (a third of its host time on the H100 host measured); a
        # zero-dimensional output passes its empty shape as the one argument
        self.out_specs = tuple((tuple(shapes[n]) or ((),), torch_dtype(dtypes[n])) for n in outs)
        self.buf_offsets, self.arena_bytes = arena_layout(
            [math.prod(b.shape) * torch_dtype(b.dtype).itemsize for b in per_call])
        self.zero_specs = tuple((tuple(b.shape), torch_dtype(b.dtype)) for b in kept)
        self._zeroed: dict = {}  # CUDA stream -> (the zeroed tensors, their pointers)
        self._arenas: dict = {}  # CUDA stream -> (its kept arena, the buffers' pointers in it)
        launches = []
        tma = set()
        for k, launch in zip(kernels, program.launches):
            args, slots = [], []
            for a in launch.args:
                if a.kind == "tensor":
                    args.append(POINTER)
                    slots.append(index[a.name])
                elif a.kind == "tmap":
                    args.append(TensorMapSlot(dtypes[a.name], map_shapes[a.name], a.value, view=a.view))
                    slots.append(index[a.name])
                    tma.add(index[a.name])
                else:
                    args.append(a.scalar())
            launches.append(k.prepare(launch.grid, launch.block, args, launch.shared_bytes, device=device,
                                      sources=slots))
        self.launches = tuple(launches)
        self.tma_inputs = tuple(sorted(i for i in tma if i < self.n_in))
        self._torch = torch
        self._tdevice = torch.device("cuda", self.device)
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream = getter if getter is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)
        self._current = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
        self._capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)

    def fast(self, tensors):
        """The outputs of a call with positional ``tensors`` that pass the cheap check, else None."""
        specs = self.in_specs
        if len(tensors) != len(specs) or not specs:
            return None
        dev = self.device
        try:
            for t, (dt, shape) in zip(tensors, specs):
                if t.dtype is not dt or t.shape != shape or t.get_device() != dev or not t.is_contiguous():
                    return None
            ptrs = [t.data_ptr() for t in tensors]
        except AttributeError:  # not a tensor: the checked path names it
            return None
        for i in self.tma_inputs:
            if ptrs[i] & 15:
                return None
        if self._current() != dev:
            return None
        empty, tdev = self._torch.empty, self._tdevice
        outs = [empty(*sizes, dtype=dt, device=tdev) for sizes, dt in self.out_specs]
        ptrs += [t.data_ptr() for t in outs]
        self._launch(ptrs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, inputs, outs):
        """Allocate what is not given, launch every kernel on the current stream, return the outputs."""
        if outs is None:
            empty, dev = self._torch.empty, self._tdevice
            outs = [empty(*sizes, dtype=dt, device=dev) for sizes, dt in self.out_specs]
        self._launch([t.data_ptr() for t in (*inputs, *outs)])
        return outs

    def _launch(self, ptrs: list[int]) -> None:
        """Launch every kernel on the current stream with ``ptrs`` (the inputs' and outputs'
        pointers) followed by the per-call buffers' (one arena) and the persistent workspaces'."""
        stream = self._stream(self.device)
        if self.arena_bytes or self.zero_specs:
            # (``owner`` holds a buffer made for this call until every launch is queued)
            if self._capturing():
                # a CUDA graph being captured gets buffers of its own, from the graph's memory
                # pool: a kept buffer would be shared with calls outside the graph, and with
                # other graphs captured on the same stream, replayed on other streams
                owner, extra = self._fresh_buffers()
                ptrs += extra
            else:
                owner = None
                if self.arena_bytes:
                    owner, extra = self._arena(stream)
                    ptrs += extra
                if self.zero_specs:
                    ptrs += self._zeroed_ptrs(stream)
        for launch in self.launches:
            launch(ptrs, stream)

    def _arena(self, stream) -> tuple:
        """The arena the per-call buffers live in and their pointers: the stream's kept arena when
        it is at most KEPT_ARENA_BYTES (a call's kernels run after the previous call's on the same
        stream, so reusing it is safe, and a call saves a ``torch.empty``: 2–3 µs of host time on
        the H100 host measured, what a small program's kernels take), else an arena of this
        call's, which the caller holds until every launch is queued (then the caching
        allocator's stream order keeps it from being reused before they run)."""
        got = self._arenas.get(stream) if self.arena_bytes <= KEPT_ARENA_BYTES else None
        if got is None:
            got = self._new_arena()
            if self.arena_bytes <= KEPT_ARENA_BYTES:
                self._arenas[stream] = got
        return got

    def _new_arena(self) -> tuple:
        """A new arena (a uint8 tensor of :attr:`arena_bytes`) and the per-call buffers' pointers in it."""
        arena = self._torch.empty(self.arena_bytes, dtype=self._torch.uint8, device=self._tdevice)
        return arena, [arena.data_ptr() + off for off in self.buf_offsets]

    def _zeroed_ptrs(self, stream) -> list[int]:
        """The pointers of the persistent zeroed workspaces of ``stream``, made (zero-filled on
        the current stream, the one the launches go to) at its first call."""
        got = self._zeroed.get(stream)
        if got is None:
            got = self._zeroed[stream] = self._new_zeroed()
        return got[1]

    def _new_zeroed(self) -> tuple[tuple, list[int]]:
        """New zero-filled persistent workspaces (on the current stream) and their pointers."""
        zeros, dev = self._torch.zeros, self._tdevice
        tensors = tuple(zeros(shape, dtype=dt, device=dev) for shape, dt in self.zero_specs)
        return tensors, [t.data_ptr() for t in tensors]

    def _fresh_buffers(self) -> tuple[tuple, list[int]]:
        """A new arena and new zero-filled workspaces (tensors, pointers), for one call."""
        arena, ptrs = self._new_arena() if self.arena_bytes else (None, [])
        zeroed, zeroed_ptrs = self._new_zeroed()
        return (arena, *zeroed), ptrs + zeroed_ptrs
