"""The fallback family: any valid diagram as a chain of simple kernels, one per box.

Correct first, for every dtype (bf16, fp16, fp32) and every size:

- contraction: one thread per output element, looping over the contracted axes, fp32
  accumulation, any number of inputs and axes (``fallback_contract.cu.jinja``);
- elementwise map (any whitelisted function, index maps included) and copies: one thread per
  output element (``fallback_map.cu.jinja``);
- reduction (sum, max, min, mean): one warp per output element (``fallback_reduce.cu.jinja``);
- softmax, layernorm, rmsnorm: one warp per row, passes over the row (``fallback_row.cu.jinja``);
- rename: no kernel, a view (the consumer reads the array it renames with the axes renamed).

Broadcasting is by axis name: every kernel indexes each input through that input's own strides,
so an input that lacks an axis simply does not move along it. Intermediates live in HBM as fp32
:class:`~napkin.codegen.program.Buffer` s; inputs and outputs keep the diagram's dtype. All sizes
are compile-time constants and every index is 64-bit.
"""

from __future__ import annotations

import math

from ...diagrams.diagram import Diagram
from ...diagrams.functions import get_function
from ...diagrams.ops import Contract, Map, Norm, Reduce, Rename, Softmax, Value
from ...dtypes import dtype as lookup_dtype
from ...errors import CodegenError
from ...perfmodel.schedule import Kernel, KernelOptions, Schedule
from ..program import Arg, Buffer, KernelLaunch, Program
from ..render import Code, c_i64, comment, cuda_type, ident, map_expr, render
from . import in_registers

NAME = "fallback"
THREADS = 256           # threads per block (map, contract); 8 warps (reduce, rows)
WARPS = THREADS // 32
INTERMEDIATE_DTYPE = "fp32"
_SUPPORTED = ("bf16", "fp16", "fp32")
#: Footprint formula: registers of a thread (index math, one accumulator, per-input addresses).
BASE_REGS = 24
REGS_PER_INPUT = 4


def register_budget(need: int, threads: int = THREADS) -> int:
    """Registers per thread the kernel asks for (``__maxnreg__``) and the model assumes: the
    footprint ``need`` rounded up to the allocation unit (8) plus 8 of slack."""
    return min(255, -(-need // 8) * 8 + 8, (65536 // threads) // 8 * 8)


def fallback_schedule(diagram: Diagram, gpu=None, dtype: str | None = None) -> Schedule:
    """One kernel per non-rename box; a rename (a view) joins the kernel of the first box that
    reads it, or of the box it renames when nothing reads it (an output that is a view)."""
    d = diagram
    kernels: list[list[Value]] = []
    owner: dict[int, int] = {}
    pending: list[Value] = []
    for v in d.nodes:
        if isinstance(v.op, Rename):
            pending.append(v)
            continue
        kernels.append([])
        k = len(kernels) - 1
        for r in [r for r in pending if _reads(v, r)]:
            kernels[k].append(r)
            pending.remove(r)
            owner[id(r)] = k
        kernels[k].append(v)
        owner[id(v)] = k
    for r in pending:
        if not kernels:
            kernels.append([])
        src = r.args[0]
        while isinstance(src.op, Rename) and id(src) not in owner:
            src = src.args[0]
        k = owner.get(id(src), len(kernels) - 1)
        kernels[k].append(r)
        owner[id(r)] = k
    out = []
    for i, boxes in enumerate(kernels):
        real = [b for b in boxes if not isinstance(b.op, Rename)]
        label = d.name_of(real[-1]) if real else "view"
        # a thread reads its operands from HBM into registers: nothing is staged in SMEM
        out.append(Kernel(f"k{i}_{label}", tuple(d.name_of(b) for b in boxes),
                          placement=in_registers(d, boxes), family=NAME,
                          options=KernelOptions(engine="scalar", warps=WARPS)))
    key = getattr(gpu, "key", gpu)
    dts = sorted(d.dtypes)
    return Schedule(d, tuple(out), key if key is not None else "h100",
                    dtype or (dts[0] if len(dts) == 1 else "bf16"),
                    notes=("fallback: one kernel per box, intermediates in HBM (fp32)",))


def _reads(v: Value, target: Value) -> bool:
    """Whether box ``v`` reads ``target`` (through any chain of renames)."""
    stack = list(v.args)
    while stack:
        a = stack.pop()
        if a is target:
            return True
        if isinstance(a.op, Rename):
            stack.extend(a.args)
    return False


class _Tensor:
    """An array in HBM: its name, dtype and axes (memory order, contiguous)."""

    def __init__(self, name: str, dtype: str, axes: tuple[str, ...], sizes: dict):
        self.name = name
        self.dtype = dtype
        self.axes = axes
        self.shape = tuple(sizes[a] for a in axes)
        strides = {}
        s = 1
        for a in reversed(axes):
            strides[a] = s
            s *= sizes[a]
        self.strides = strides


class _Lowerer:
    def __init__(self, diagram: Diagram, schedule: Schedule, arch: str):
        self.d = diagram
        self.schedule = schedule
        self.arch = arch
        self.sizes = {n: a.bound_size for n, a in diagram.axes.items()}
        self.tensors: dict[str, _Tensor] = {}
        # id(value) -> (tensor name, axes of the tensor in the value's naming)
        self.view: dict[int, tuple[str, tuple[str, ...]]] = {}
        self.launches: list[KernelLaunch] = []
        self.buffers: list[Buffer] = []

    # ------------------------------------------------------------------ arrays
    def _size(self, axis: str) -> int:
        return self.sizes[axis]

    def add_tensor(self, name: str, dtype: str, axes: tuple[str, ...]) -> _Tensor:
        ident(name)  # refuses names that cannot reach CUDA
        t = _Tensor(name, dtype, axes, self.sizes)
        self.tensors[name] = t
        return t

    def offset(self, v: Value, index: dict[str, Code]) -> Code:
        """Element offset of value ``v`` (through its view) at the indices ``index`` (axis → var)."""
        tname, axes = self.view[id(v)]
        t = self.tensors[tname]
        parts = []
        for mem_axis, seen_as in zip(t.axes, axes):
            st = t.strides[mem_axis]
            var = index[seen_as]
            parts.append(Code(f"{var}" if st == 1 else f"{var} * {c_i64(st)}"))
        return Code(" + ".join(parts) if parts else "0")

    def stride(self, v: Value, axis: str) -> int:
        tname, axes = self.view[id(v)]
        t = self.tensors[tname]
        return t.strides[t.axes[axes.index(axis)]]

    # ------------------------------------------------------------------ lowering
    def run(self) -> Program:
        d = self.d
        out_name = {id(v): n for n, v in zip(d.output_names, d.outputs)}
        for v in d.inputs:
            self.add_tensor(v.name, v.dtype, v.axis_names)
            self.view[id(v)] = (v.name, v.axis_names)
        step = 0
        for v in d.nodes:
            name = d.name_of(v)
            if isinstance(v.op, Rename):
                tname, axes = self.view[id(v.args[0])]
                m = dict(v.op.mapping)
                self.view[id(v)] = (tname, tuple(m.get(a, a) for a in axes))
                continue
            if id(v) in out_name:
                self.add_tensor(name, v.dtype, v.axis_names)
            else:
                self.add_tensor(name, INTERMEDIATE_DTYPE, v.axis_names)
                t = self.tensors[name]
                self.buffers.append(Buffer(name, t.axes, t.shape, INTERMEDIATE_DTYPE))
            self.view[id(v)] = (name, v.axis_names)
            self.launches.append(self.kernel(step, v, name))
            step += 1
        # outputs that are views (renames) or inputs need a copy into their own tensor
        for n, v in zip(d.output_names, d.outputs):
            if self.view[id(v)][0] != n:
                self.add_tensor(n, v.dtype, v.axis_names)
                self.launches.append(self.copy_kernel(step, v, n))
                step += 1
        return Program(diagram=d, schedule=self.schedule, family=NAME, launches=tuple(self.launches),
                       buffers=tuple(self.buffers), sizes=dict(self.sizes))

    def kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        op = v.op
        if isinstance(op, Map):
            return self.map_kernel(step, v, name)
        if isinstance(op, Contract):
            return self.contract_kernel(step, v, name)
        if isinstance(op, Reduce):
            return self.reduce_kernel(step, v, name)
        if isinstance(op, (Softmax, Norm)):
            return self.row_kernel(step, v, name)
        raise CodegenError(f"fallback: no kernel for box {name} of kind {op.kind!r}")

    # ------------------------------------------------------------------ helpers
    def _kname(self, step: int, name: str) -> Code:
        return Code(f"{ident(self.d.name)}_{step}_{ident(name)}")

    def _params(self, reads: list[Value], out: str):
        """Kernel parameters: each distinct tensor read once (const), then the output."""
        params, args, seen = [], [], []
        for a in reads:
            tname = self.view[id(a)][0]
            if tname in seen:
                continue
            seen.append(tname)
            t = self.tensors[tname]
            params.append(Code(f"const {cuda_type(t.dtype)}* __restrict__ {ident(tname, 'in_')}"))
            args.append(Arg("tensor", tname, dtype=t.dtype, axes=t.axes))
        t = self.tensors[out]
        params.append(Code(f"{cuda_type(t.dtype)}* __restrict__ {ident(out, 'out_')}"))
        args.append(Arg("tensor", out, dtype=t.dtype, axes=t.axes))
        return params, tuple(args)

    def _load(self, a: Value, index: dict[str, Code]) -> Code:
        tname = self.view[id(a)][0]
        return Code(f"napkin::to_float({ident(tname, 'in_')}[{self.offset(a, index)}])")

    def _decompose(self, axes: tuple[str, ...], linear: str = "idx") -> list[tuple[Code, Code]]:
        """``const long long`` index variables of ``axes`` from a linear index (innermost first)."""
        out = []
        rem = Code(linear)
        for i, a in enumerate(reversed(axes)):
            var = ident(a, "i_")
            if i == len(axes) - 1:
                out.append((var, rem))
            else:
                n = self._size(a)
                out.append((var, Code(f"{rem} % {c_i64(n)}")))
                q = ident(a, "q_")
                out.append((q, Code(f"{rem} / {c_i64(n)}")))
                rem = q
        return out

    def _legend(self, v: Value, name: str, what: str) -> list[Code]:
        d = self.d
        args = ", ".join(f"{d.name_of(a)}[{','.join(a.axis_names)}]" for a in v.args)
        return [comment(f"box {name}[{','.join(v.axis_names)}] = {v.op.label()}({args})"),
                comment(what)]

    def _launch(self, step, name, template, ctx, grid_items, per_block, params, args, regs) -> KernelLaunch:
        kname = self._kname(step, name)
        budget = register_budget(regs)
        src = render(template, kernel=kname, params=params, arch=comment(self.arch),
                     diagram=comment(self.d.name), THREADS=THREADS, REGS=budget, **ctx)
        blocks = max(1, -(-grid_items // per_block))
        return KernelLaunch(name=str(kname), source=src, grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                            shared_bytes=0, args=args, template=template,
                            tunables=(("THREADS", THREADS),), model_smem_bytes=0,
                            model_regs_per_thread=budget)

    # ------------------------------------------------------------------ kernels
    def map_kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        op = v.op
        f = get_function(op.fn)
        index = {a: ident(a, "i_") for a in v.axis_names}
        loads = [(Code(f"x{j}"), self._load(a, index)) for j, a in enumerate(v.args)]
        idx = [index[a] for a in op.index_axes]
        ns = [self._size(a) for a in op.index_axes]
        expr = map_expr(f.name, [x for x, _ in loads], op.param_values(self.sizes), idx, ns)
        params, args = self._params(list(v.args), name)
        T = cuda_type(self.tensors[name].dtype)
        n = math.prod(self._size(a) for a in v.axis_names)
        legend = self._legend(v, name, f"output axes ({', '.join(v.axis_names) or 'none'}) -> one thread per "
                                       "element: idx = blockIdx.x * THREADS + threadIdx.x (grid.x), "
                                       "decomposed innermost first; inputs broadcast by their own strides")
        ctx = dict(legend=legend, N=c_i64(n), index=self._decompose(v.axis_names), loads=loads, expr=expr,
                   out=ident(name, "out_"), TOUT=T)
        return self._launch(step, name, "fallback_map.cu.jinja", ctx, n, THREADS, params, args,
                            BASE_REGS + REGS_PER_INPUT * len(v.args))

    def copy_kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        index = {a: ident(a, "i_") for a in v.axis_names}
        loads = [(Code("x0"), self._load(v, index))]
        params, args = self._params([v], name)
        n = math.prod(self._size(a) for a in v.axis_names)
        legend = [comment(f"output {name}[{','.join(v.axis_names)}]: a copy of the view it names"),
                  comment("one thread per element: idx = blockIdx.x * THREADS + threadIdx.x (grid.x)")]
        ctx = dict(legend=legend, N=c_i64(n), index=self._decompose(v.axis_names), loads=loads,
                   expr=Code("x0"), out=ident(name, "out_"), TOUT=cuda_type(self.tensors[name].dtype))
        return self._launch(step, name, "fallback_map.cu.jinja", ctx, n, THREADS, params, args,
                            BASE_REGS + REGS_PER_INPUT)

    def contract_kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        op = v.op
        over = tuple(op.over)
        index = {a: ident(a, "i_") for a in (*v.axis_names, *over)}
        loops = [(ident(a, "i_"), c_i64(self._size(a)), comment(a)) for a in over]
        product = " * ".join(self._load(a, index) for a in v.args)
        params, args = self._params(list(v.args), name)
        n = math.prod(self._size(a) for a in v.axis_names)
        legend = self._legend(v, name, f"output axes ({', '.join(v.axis_names) or 'none'}) -> one thread per "
                                       "element (grid.x); contracted axes "
                                       f"({', '.join(over) or 'none'}) -> sequential loops, fp32 accumulator")
        ctx = dict(legend=legend, N=c_i64(n), index=self._decompose(v.axis_names), loops=loops,
                   product=Code(product), out=ident(name, "out_"), TOUT=cuda_type(self.tensors[name].dtype))
        return self._launch(step, name, "fallback_contract.cu.jinja", ctx, n, THREADS, params, args,
                            BASE_REGS + REGS_PER_INPUT * len(v.args) + 2 * len(over))

    def reduce_kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        op = v.op
        (x,) = v.args
        index = {a: ident(a, "i_") for a in v.axis_names}
        index[op.over] = Code("0")
        base = self.offset(x, index)
        params, args = self._params([x], name)
        rows = math.prod(self._size(a) for a in v.axis_names)
        legend = self._legend(v, name, f"output axes ({', '.join(v.axis_names) or 'none'}) -> one warp per "
                                       f"element (grid.x * {WARPS} warps); {op.over} (reduced) -> lanes, "
                                       "warp reduction in fp32")
        ctx = dict(legend=legend, NROWS=c_i64(rows), index=self._decompose(v.axis_names, "row"), base=base,
                   inp=ident(self.view[id(x)][0], "in_"), STRIDE=c_i64(self.stride(x, op.over)),
                   R=c_i64(self._size(op.over)), how=op.how, out=ident(name, "out_"),
                   TOUT=cuda_type(self.tensors[name].dtype))
        return self._launch(step, name, "fallback_reduce.cu.jinja", ctx, rows, WARPS, params, args,
                            BASE_REGS + REGS_PER_INPUT)

    def row_kernel(self, step: int, v: Value, name: str) -> KernelLaunch:
        op = v.op
        (x,) = v.args
        over = op.over
        row_axes = tuple(a for a in v.axis_names if a != over)
        index = {a: ident(a, "i_") for a in row_axes}
        index[over] = Code("0")
        base_in = self.offset(x, index)
        base_out = self.offset_out(name, v, index)
        params, args = self._params([x], name)
        rows = math.prod(self._size(a) for a in row_axes)
        kind = "softmax" if isinstance(op, Softmax) else op.how
        legend = self._legend(v, name, f"rows ({', '.join(row_axes) or 'none'}) -> one warp per row "
                                       f"(grid.x * {WARPS} warps); {over} (normalised) -> lanes, passes over "
                                       "the row from HBM, fp32 statistics")
        ctx = dict(legend=legend, NROWS=c_i64(rows), index=self._decompose(row_axes, "row"),
                   base_in=base_in, base_out=base_out, inp=ident(self.view[id(x)][0], "in_"),
                   SIN=c_i64(self.stride(x, over)), SOUT=c_i64(self.tensors[name].strides[over]),
                   R=c_i64(self._size(over)), kind=kind, eps=float(getattr(op, "eps", 0.0)),
                   out=ident(name, "out_"), TOUT=cuda_type(self.tensors[name].dtype))
        return self._launch(step, name, "fallback_row.cu.jinja", ctx, rows, WARPS, params, args,
                            BASE_REGS + REGS_PER_INPUT)

    def offset_out(self, name: str, v: Value, index: dict[str, Code]) -> Code:
        t = self.tensors[name]
        parts = []
        for a in t.axes:
            st = t.strides[a]
            parts.append(Code(f"{index[a]}" if st == 1 else f"{index[a]} * {c_i64(st)}"))
        return Code(" + ".join(parts) if parts else "0")


#: Bytes one 32-byte sector costs a warp's 32 lanes: per lane, per access.
SECTOR_BYTES = 32


def scalar_loop_bytes(diagram: Diagram) -> float:
    """What the per-thread loops of contractions and reductions move through L2: one thread per
    output element walks every summed index and loads each input once per index. Lanes that read
    the same element (an input without the output's innermost axis) share one sector per warp;
    lanes that read consecutive elements (that axis contiguous in the input) share its lines;
    otherwise every lane's load is a sector of its own. A row kernel (softmax, a norm: one warp per
    row, lanes along the normalised axis) reads its row once per pass (three for softmax and
    layernorm, two for rmsnorm) and writes it once; where that axis is not innermost, every lane's
    access is a sector of its own. (Maps read each element once, which the cost model counts, as it
    counts one read and one write of a row kernel.)

    >>> from napkin.diagrams import library
    >>> d = library.get("matmul").bind(a=256, b=512, c=256)   # B[b,c]: c contiguous, A[a,b]: shared
    >>> scalar_loop_bytes(d) == 256 * 256 * 512 * (2 + SECTOR_BYTES / 32)
    True
    """
    total = 0.0
    for v in diagram.nodes:
        op = v.op
        if isinstance(op, (Softmax, Norm)):
            total += _row_pass_bytes(v)
            continue
        if op.kind not in ("contract", "reduce") or not v.axes:
            continue
        over = tuple(op.over) if isinstance(op.over, (tuple, list)) else (op.over,)
        steps = math.prod(diagram.axes[a].bound_size for a in over)
        if steps <= 1:
            continue
        inner = v.axis_names[-1]
        per = 0.0
        for x in v.args:
            elem = lookup_dtype(x.dtype).bytes
            if inner not in x.axis_names:
                per += SECTOR_BYTES / 32
            elif x.axis_names[-1] == inner:
                per += elem
            else:
                per += SECTOR_BYTES
        total += math.prod(a.bound_size for a in v.axes) * steps * per
    return total


def _row_pass_bytes(v: Value) -> float:
    """What a fallback row kernel moves beyond one read and one write of its array (see
    :func:`scalar_loop_bytes`).

    >>> from napkin.diagrams import Diagram, array, axes, softmax
    >>> a, b = axes("a b")
    >>> col = Diagram("c", softmax(array("X", a, b), a)).bind(a=64, b=128)    # strided rows
    >>> _row_pass_bytes(col.nodes[0]) == 64 * 128 * (3 * SECTOR_BYTES - 2 + SECTOR_BYTES - 2)
    True
    """
    (x,) = v.args
    over = v.op.over
    passes = 2 if isinstance(v.op, Norm) and v.op.how == "rmsnorm" else 3
    elem_in, elem_out = lookup_dtype(x.dtype).bytes, lookup_dtype(v.dtype).bytes
    read = elem_in if x.axis_names[-1] == over else SECTOR_BYTES
    write = elem_out if v.axis_names[-1] == over else SECTOR_BYTES
    n = math.prod(a.bound_size for a in v.axes)
    return float(n * (passes * read - elem_in + write - elem_out))


class FallbackFamily:
    """Any valid diagram: one simple kernel per box, intermediates in HBM."""

    name = NAME
    #: the :class:`~napkin.perfmodel.schedule.KernelOptions` fields this family's schedules carry and
    #: its templates read; lowering refuses a kernel that sets any other (it would not apply)
    options_read = frozenset({"engine", "warps"})

    def explain(self, diagram: Diagram) -> str | None:
        dts = {v.dtype for v in (*diagram.inputs, *diagram.nodes)}
        bad = sorted(dts - set(_SUPPORTED))
        if bad:
            return f"dtype {', '.join(bad)} is not supported (bf16, fp16, fp32)"
        if not diagram.is_bound:
            return "axis sizes are not bound"
        return None

    def matches(self, diagram: Diagram) -> bool:
        return self.explain(diagram) is None

    def candidates(self, diagram: Diagram, gpu, dtype: str | None = None) -> list[Schedule]:
        return [fallback_schedule(diagram, gpu, dtype)]

    def launch_estimate(self, diagram: Diagram, schedule: Schedule, gpu) -> dict:
        n = max((math.prod(a.bound_size for a in v.axes) for v in diagram.nodes), default=1)
        return dict(blocks=max(1, -(-n // THREADS)), threads=THREADS, regs=BASE_REGS + 8, smem=0,
                    extra_l2_bytes=scalar_loop_bytes(diagram))

    def lower(self, diagram: Diagram, schedule: Schedule, arch: str) -> Program:
        why = self.explain(diagram)
        if why:
            raise CodegenError(f"fallback family cannot run diagram {diagram.name!r}: {why}")
        return _Lowerer(diagram, schedule, arch).run()


FAMILY = FallbackFamily()
