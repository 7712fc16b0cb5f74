"""One compiled diagram for every size of its dynamic axes.

A model's sequence length and batch change from call to call; compiling a kernel per shape would
cost a compile at every new size. ``compile(diagram, sizes=..., dynamic={"q": (1, 8192)})``
returns a :class:`DynamicDiagram` instead:

1. **One plan for the range.** The diagram is planned (:func:`plan_for_range`) at the low end, the
   geometric middle and the high end of the ranges (and at the size given in ``sizes``, if any);
   each plan found is predicted at every one of those sizes, and the plan that loses the fewest
   seconds to the best plan of a size, at its worst size, is kept (the plan found at the largest
   size wins ties). Seconds rather than ratios: a plan 1.5× slower on a 10 µs call at the low
   end costs less than one 1.7× slower on a 250 µs call at the high end. The choice is cached on
   disk with the plans (:mod:`napkin.codegen.plancache`).
2. **Re-lowered per size, compiled once per source.** A call at new sizes builds the kept plan
   at those sizes (:func:`napkin.codegen.lower.build`: about a millisecond) and compiles it; the
   kernel cache is keyed by source, so a family that passes sizes as kernel arguments
   (contraction, attention: the same source at every size) compiles once and every size reuses
   that kernel. A family that writes a size into its source as a constant (row-wise: the row
   count; pointwise: the element count and the rows per split) gets a kernel per size, compiled
   once and then read from the disk cache. Which kernels of a diagram do so is found when it is
   made, by building the plan at a few sizes of the range (its ends, its middle and two odd sizes:
   :func:`probe_points`) and comparing the sources: they are :attr:`DynamicDiagram.specialized`,
   and a warning in the ``napkin.codegen.dynamic`` log says so.
3. **Per size, a compiled diagram.** Each size seen keeps its
   :class:`~napkin.codegen.api.CompiledDiagram` (prepared launches and all), so a repeated size
   costs one dictionary lookup on top of the fixed-size call.

>>> import napkin.codegen as cg
>>> mm = cg.compile("matmul", sizes={"b": 256, "c": 256}, dynamic={"a": (1, 4096)}, gpu="h100")
>>> mm.ranges, mm.specialized
({'a': (1, 4096)}, ())
>>> mm.at({"a": 100}).program.launches[0].source == mm.at({"a": 3000}).program.launches[0].source
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import numbers
import threading
import time
from collections.abc import Mapping, Sequence

from ..diagrams.diagram import Diagram
from ..errors import CodegenError, LaunchError, NapkinError
from .calling import bind_inputs

__all__ = ["DynamicDiagram", "compile_dynamic", "parse_dynamic", "sample_points", "plan_for_range",
           "probe_points", "specialized_kernels"]

_log = logging.getLogger(__name__)

#: Sizes kept per dynamic diagram (each holds a compiled diagram); past it the oldest half goes.
MAX_SIZES = 512


def parse_dynamic(diagram: Diagram, dynamic, sizes: Mapping[str, int] | None) -> dict[str, tuple[int, int]]:
    """``{axis: (low, high)}`` from ``dynamic``: a mapping of ranges, or axis names whose range is
    1 to their size in ``sizes``. Each name must be an axis of ``diagram`` that an input carries
    (its size is read from that input at each call).

    >>> from napkin.diagrams import library
    >>> parse_dynamic(library.get("softmax"), ["r"], {"r": 4096, "x": 1000})
    {'r': (1, 4096)}
    >>> parse_dynamic(library.get("softmax"), {"r": (8, 64)}, None)
    {'r': (8, 64)}
    """
    sizes = dict(sizes or {})
    if isinstance(dynamic, str):
        dynamic = [dynamic]
    if isinstance(dynamic, Mapping):
        items = list(dynamic.items())
    elif isinstance(dynamic, Sequence):
        items = []
        for n in dynamic:
            if not isinstance(n, str):
                raise CodegenError(f"dynamic: expected axis names or {{axis: (low, high)}}, got {n!r}")
            if n not in sizes:
                raise CodegenError(f"dynamic axis {n!r} needs a range: give dynamic={{{n!r}: (low, high)}}, or its "
                                   f"largest size in sizes (its range is then 1 to that size)")
            items.append((n, (1, sizes[n])))
    else:
        raise CodegenError(f"dynamic: expected axis names or {{axis: (low, high)}}, got {type(dynamic).__name__}")
    if not items:
        raise CodegenError("dynamic: no axis given")
    carried = {a.name for v in diagram.inputs for a in v.axes}
    out = {}
    for name, rng in items:
        if name not in diagram.axes:
            raise CodegenError(f"dynamic axis {name!r}: diagram {diagram.name!r} has no such axis; its axes are "
                               f"{list(diagram.axes)}")
        if name not in carried:
            raise CodegenError(f"dynamic axis {name!r} is carried by no input of {diagram.name!r}, so a call cannot "
                               "tell its size; bind it in sizes")
        try:
            low, high = (int(x) for x in rng)
            ok = all(float(x) == int(x) for x in rng)
        except (TypeError, ValueError):
            ok = False
        if not ok or not 1 <= low <= high:
            raise CodegenError(f"dynamic axis {name!r}: range {rng!r} is not (low, high) with 1 <= low <= high")
        if name in sizes and not low <= int(sizes[name]) <= high:
            raise CodegenError(f"dynamic axis {name!r}: size {sizes[name]} in sizes is outside its range "
                               f"{low}..{high}")
        out[name] = (low, high)
    return out


def _middle(lo: int, hi: int) -> int:
    """The geometric middle of a range, rounded into it."""
    return max(lo, min(hi, round(math.sqrt(lo * hi))))


def sample_points(ranges: Mapping[str, tuple[int, int]], typical: Mapping[str, int] | None = None) -> list[dict]:
    """The sizes a range is planned at: every axis at its low end, at the geometric middle, at
    the high end, and ``typical`` when given (distinct points, the least work first).

    >>> sample_points({"q": (1, 4096)})
    [{'q': 1}, {'q': 64}, {'q': 4096}]
    """
    points = [{n: lo for n, (lo, hi) in ranges.items()},
              {n: _middle(lo, hi) for n, (lo, hi) in ranges.items()},
              {n: hi for n, (lo, hi) in ranges.items()}]
    if typical:
        points.append({n: int(typical[n]) for n in ranges if n in typical} | {
            n: hi for n, (lo, hi) in ranges.items() if n not in typical})
    seen, out = set(), []
    for p in sorted(points, key=lambda p: (math.prod(p.values()), sorted(p.items()))):
        key = tuple(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _at(plan, diagram: Diagram, sizes: Mapping[str, int]):
    """``plan``'s kernels (tiles, options, families) on ``diagram`` bound to ``sizes`` (and written
    out as the plan's expanded boxes, if any)."""
    from ..diagrams.expand import expand
    from ..perfmodel.plan import Plan
    from .prepare import prepare

    d = prepare(diagram, sizes=dict(sizes))
    if plan.expanded:
        d = expand(d, plan.expanded)
    return Plan(d, plan.gpu, plan.arch, plan.dtype, plan.kernels, plan.notes, plan.expanded)


def plan_for_range(diagram: Diagram, ranges: Mapping[str, tuple[int, int]], gpu, dtype: str | None, arch: str, *,
                   family: str | None = None, schedule=None, typical: Mapping[str, int] | None = None):
    """The plan kept for the size ``ranges`` of ``diagram`` (every other axis bound) and what it
    was chosen from: ``(plan, table)``, ``table`` a list of ``{"planned_at", "points",
    "predicted_s", "worst_loss_s"}`` per candidate plan (predicted seconds at each sample point,
    and the most it loses to the best candidate of a point).

    A candidate must build at every :func:`probe_points` size (the ends of the ranges, their
    middle and two odd sizes): a configuration may hold only where a size has some residue (the
    ping-pong 128 x 192 wgmma tile needs output rows of 16-byte multiples). With ``schedule``,
    that schedule is the one candidate (checked the same way)."""
    from .lower import build
    from .plancache import derive_cached
    from .planner import plan_schedule
    from .prepare import prepare

    points = sample_points(ranges, typical)
    candidates = []
    for p in points:
        d = prepare(diagram, sizes=p, dtype=dtype)
        if schedule is not None:
            plan = plan_schedule(d, schedule.replace(diagram=d) if schedule.diagram != d else schedule, gpu,
                                 family=family, arch=arch)
            candidates = [(p, plan)]
            break
        plan = derive_cached(d, gpu, dtype, arch=arch, family=family, fold_axes=False)  # re-bound below
        if all(_kernels(plan) != _kernels(c) for _, c in candidates):
            candidates.append((p, plan))
    probes = probe_points(ranges)
    table, best = [], None
    for p, plan in candidates:
        try:
            for e in probes:
                build(_at(plan, diagram, e))
        except NapkinError as err:
            _log.info("%s: the plan found at %s does not build at %s (%s)", diagram.name, p, e, err)
            continue
        secs = []
        for q in points:
            if q == p:
                secs.append(plan.seconds)
                continue
            try:
                d = prepare(diagram, sizes=q, dtype=dtype)
                secs.append(plan_schedule(d, plan.schedule.replace(diagram=d), gpu, arch=arch).seconds)
            except NapkinError:
                secs.append(math.inf)
        table.append({"planned_at": dict(p), "points": [dict(q) for q in points], "predicted_s": secs,
                      "plan": plan})
    if not table:
        raise CodegenError(f"{diagram.name}: no plan found at the sample sizes {points} builds at every "
                           f"probed size {probes} of the dynamic ranges {dict(ranges)}; narrow the ranges")
    fastest = [min(row["predicted_s"][i] for row in table) for i in range(len(points))]
    for row in table:
        row["worst_loss_s"] = max((t - f if math.isfinite(t) else math.inf) for t, f in zip(row["predicted_s"], fastest))
    # the smallest worst loss; among equals the plan found at the largest sizes (most of the work)
    order = sorted(range(len(table)), key=lambda i: (table[i]["worst_loss_s"], -i))
    best = table[order[0]]["plan"]
    return best, [{k: v for k, v in row.items() if k != "plan"} for row in table]


def _kernels(plan) -> tuple:
    return tuple(pk.kernel for pk in plan.kernels)


def probe_points(ranges: Mapping[str, tuple[int, int]]) -> list[dict]:
    """The sizes :func:`specialized_kernels` builds a plan at: the ends of the ranges, the
    geometric middle, and two odd sizes (one past the middle, one short of the high end), since a
    family may choose by a size's residue (a row of 16-byte multiples, whole blocks) as well as by
    its magnitude.

    >>> probe_points({"q": (1, 4096)})
    [{'q': 1}, {'q': 4096}, {'q': 64}, {'q': 65}, {'q': 4095}]
    >>> probe_points({"q": (8, 8)})
    [{'q': 8}]
    """
    def at(f):  # every axis at f(lo, hi), kept in its range
        return {n: max(lo, min(hi, f(lo, hi))) for n, (lo, hi) in ranges.items()}

    points = [at(lambda lo, hi: lo), at(lambda lo, hi: hi), at(_middle), at(lambda lo, hi: _middle(lo, hi) | 1),
              at(lambda lo, hi: (hi - 1) | 1)]
    out = []
    for p in points:
        if p not in out:
            out.append(p)
    return out


def specialized_kernels(plan, diagram: Diagram, ranges: Mapping[str, tuple[int, int]]) -> tuple[tuple[str, str], ...]:
    """``(kernel, family)`` of each launch whose source differs between sizes of the ranges
    (:func:`probe_points`): a family that writes a dynamic size into the source, or chooses its
    code by one (it compiles per size, or per kind of size)."""
    from .lower import build

    first, *rest = [build(_at(plan, diagram, p)) for p in probe_points(ranges)]
    fam = {pk.name: pk.family for pk in plan.kernels}
    out = []
    for other in rest:
        if len(other.launches) != len(first.launches):
            return tuple((k.name, first.family) for k in first.launches)
        for a, b in zip(first.launches, other.launches):
            if (a.source != b.source or a.name != b.name) and a.name not in {n for n, _ in out}:
                owner = next((f for n, f in fam.items() if a.name.endswith(n) or n in a.name), first.family)
                out.append((a.name, owner))
    return tuple(out)


class DynamicDiagram:
    """A diagram compiled for every size of its dynamic axes in :attr:`ranges` (see the module
    docstring). Call it like a :class:`~napkin.codegen.api.CompiledDiagram`; :meth:`at` gives the
    compiled diagram of one size.

    Attributes: ``diagram`` (the fixed axes bound, the dynamic ones not), ``ranges``, ``plan`` (the
    plan kept, at the sizes it was found at), ``candidates`` (what it was chosen from),
    ``specialized`` (``(kernel, family)`` of the kernels compiled per size), ``gpu``, ``arch``,
    ``plan_seconds`` (choosing the plan took), ``sources`` (distinct kernel sources compiled so far).
    """

    def __init__(self, diagram: Diagram, ranges: Mapping[str, tuple[int, int]], plan, *, gpu, arch: str | None,
                 compiled_type, candidates=(), specialized: tuple = (), plan_seconds: float = 0.0):
        self.diagram = diagram
        self._compiled_type = compiled_type  # napkin.codegen.api.CompiledDiagram (api imports this module)
        self.ranges = dict(ranges)
        self.plan = plan
        self.gpu, self.arch = gpu, arch
        self.candidates = tuple(candidates)
        self.specialized = tuple(specialized)
        self.plan_seconds = plan_seconds
        self.family = "+".join(dict.fromkeys(plan.families))
        self._by_size: dict[tuple, object] = {}
        self._sources: set[str] = set()
        self._lock = threading.Lock()
        self._axes = tuple(self.ranges)
        where = []
        for n in self._axes:  # the first input that carries each dynamic axis, and which of its dims
            i, j = next((i, j) for i, v in enumerate(diagram.inputs) for j, a in enumerate(v.axes) if a.name == n)
            where.append((i, j))
        self._where = tuple(where)

    def __repr__(self) -> str:
        rng = ", ".join(f"{n}={lo}..{hi}" for n, (lo, hi) in self.ranges.items())
        return (f"DynamicDiagram({self.diagram.name!r}, {rng}, family={self.family!r}, "
                f"{len(self._by_size)} size(s) compiled)")

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.diagram.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.diagram.output_names

    @property
    def sources(self) -> int:
        return len(self._sources)

    def sizes_of(self, tensors: Sequence) -> dict[str, int]:
        """The dynamic sizes positional ``tensors`` carry (a LaunchError naming the input that
        cannot say, or a size outside its range)."""
        names = self.diagram.input_names
        if len(tensors) != len(names):
            raise LaunchError(f"{self.diagram.name} takes {len(names)} input(s) ({', '.join(names)}), "
                              f"got {len(tensors)}")
        out = {}
        for n, (i, j) in zip(self._axes, self._where):
            v = self.diagram.inputs[i]
            shape = getattr(tensors[i], "shape", None)
            if shape is None or len(shape) != len(v.axes):
                raise LaunchError(f"{v.name}: expected a torch tensor with axes ({', '.join(v.axis_names)}), got "
                                  f"{'shape ' + str(tuple(shape)) if shape is not None else type(tensors[i]).__name__}")
            out[n] = int(shape[j])
        return out

    def at(self, sizes: Mapping[str, int]):
        """The :class:`~napkin.codegen.api.CompiledDiagram` for these dynamic sizes (built, and
        compiled where its source is new, at the first call): a size for every dynamic axis and no
        other, each a whole number (a LaunchError names the axis otherwise)."""
        key = self._key(sizes)
        cd = self._by_size.get(key)
        if cd is not None:
            return cd
        for n, s in zip(self._axes, key):
            lo, hi = self.ranges[n]
            if not lo <= s <= hi:
                raise LaunchError(f"{self.diagram.name}: axis {n} has size {s}, outside the dynamic range {lo}..{hi} "
                                  "it was compiled for")
        return self._make(key)

    def _key(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The dynamic sizes of ``sizes`` in axis order, checked: a mapping naming every dynamic axis
        and no other, each size an integer (not a bool, not a float, however whole)."""
        if not isinstance(sizes, Mapping):
            raise LaunchError(f"{self.diagram.name}: at() takes a mapping of the dynamic axes "
                              f"({', '.join(self._axes)}) to sizes, got {type(sizes).__name__}")
        unknown = [str(n) for n in sizes if n not in self._axes]
        missing = [n for n in self._axes if n not in sizes]
        if unknown or missing:
            said = (f"unknown axis {', '.join(map(repr, unknown))}" if unknown else "") + \
                ("; " if unknown and missing else "") + (f"no size for {', '.join(missing)}" if missing else "")
            raise LaunchError(f"{self.diagram.name}: {said}; its dynamic axes are {', '.join(self._axes)}")
        key = []
        for n in self._axes:
            v = sizes[n]
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise LaunchError(f"{self.diagram.name}: axis {n} needs a whole number as its size, got {v!r}")
            key.append(int(v))
        return tuple(key)

    def _make(self, key: tuple):
        from .lower import build

        with self._lock:
            cd = self._by_size.get(key)
            if cd is not None:
                return cd
            start = time.perf_counter()
            sizes = dict(zip(self._axes, key))
            program = build(_at(self.plan, self.diagram, sizes))
            digest = hashlib.sha256(program.source().encode()).hexdigest()
            new = digest not in self._sources
            cd = self._compiled_type(program, arch=self.arch, gpu=self.gpu)
            if self.arch is not None:
                cd._compiled()
            self._sources.add(digest)
            if len(self._by_size) >= MAX_SIZES:
                for old in list(self._by_size)[: MAX_SIZES // 2]:
                    del self._by_size[old]
            self._by_size[key] = cd
            _log.debug("%s at %s: built in %.1f ms, %s", self.diagram.name, sizes, 1e3 * (time.perf_counter() - start),
                       "a new kernel source" if new else "the kernels of an earlier size")
            return cd

    def __call__(self, *tensors, out=None, **by_name):
        """Run at the sizes the inputs carry (by position or by name, as a compiled diagram)."""
        if by_name:
            names = self.diagram.input_names
            got = bind_inputs(self.diagram.name, names, tensors, by_name)
            tensors, by_name = tuple(got[n] for n in names), {}
        try:
            key = tuple(int(tensors[i].shape[j]) for i, j in self._where)
            cd = self._by_size.get(key)
        except (AttributeError, IndexError, TypeError):
            cd = None
        if cd is None:
            cd = self.at(self.sizes_of(tensors))
        return cd(*tensors, out=out)


def compile_dynamic(diagram, dynamic, *, compiled_type, arch: str | None, gpu=None,
                    sizes: Mapping[str, int] | None = None, dtype: str | None = None, schedule=None,
                    family: str | None = None) -> DynamicDiagram:
    """:func:`napkin.codegen.compile` with ``dynamic`` axes (see the module docstring): ``arch`` is
    the GPU's at hand (None: none here, kernels compile later), ``compiled_type`` the compiled
    diagram class each size is made as."""
    from ..perfmodel.hardware import check_arch
    from ..perfmodel.plan import Plan
    from .plancache import entry_key, plan_cache, plan_key
    from .prepare import prepare
    from .select import resolve_gpu

    if isinstance(diagram, str):
        from ..diagrams import library

        diagram = library.get(diagram)
    if not isinstance(diagram, Diagram):
        raise CodegenError(f"expected a Diagram or a library name, got {type(diagram).__name__}")
    sizes = dict(sizes or {})
    ranges = parse_dynamic(diagram, dynamic, sizes)
    typical = {n: sizes[n] for n in ranges if n in sizes}
    fixed = {n: s for n, s in sizes.items() if n not in ranges}
    base = diagram.bind(fixed) if fixed else diagram
    if dtype is not None:
        base = base.with_dtype(dtype)
    unbound = [n for n, a in base.axes.items() if not a.is_bound and n not in ranges
               and not any(getattr(a.size, "name", n) == r for r in ranges)]
    if unbound:
        raise CodegenError(f"diagram {base.name!r}: axes {', '.join(unbound)} have no size and are not dynamic; give "
                           "them in sizes or in dynamic")
    g = resolve_gpu(gpu)
    target = check_arch(arch or g.arch)
    start = time.perf_counter()
    cache = plan_cache()
    text = plan_key(base, g, dtype, target, [family] if family else None,
                    extra=json.dumps({"ranges": ranges, "typical": typical}, sort_keys=True))
    key = entry_key(cache, text, target)
    plan, table = None, ()
    if schedule is None:
        payload = cache.load(key)
        if payload is not None:
            try:
                data = json.loads(payload.decode("utf-8"))
                at = {n: int(v) for n, v in data["plan"]["sizes"].items() if n in ranges}
                plan = Plan.from_dict(prepare(base, sizes=at), data["plan"])
                table = tuple(data.get("candidates", ()))
            except (NapkinError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
                _log.info("%s: cached range plan does not read back (%s); planning again", base.name, e)
                plan = None
    if plan is None:
        plan, table = plan_for_range(base, ranges, g, dtype, target, family=family, schedule=schedule,
                                     typical=typical)
        if schedule is None:
            cache.store(key, json.dumps({"plan": plan.to_dict(), "candidates": table}).encode())
    plan = dataclasses.replace(plan, arch=target) if plan.arch != target else plan
    seconds = time.perf_counter() - start
    special = specialized_kernels(plan, base, ranges)
    if special:
        _log.warning("%s: %s write%s the size of %s into the source, or choose%s the code by it: compiled once "
                     "per size or kind of size (then read from the kernel cache)", base.name,
                     ", ".join(f"kernel {k} ({f})" for k, f in special), "s" if len(special) == 1 else "",
                     ", ".join(ranges), "s" if len(special) == 1 else "")
    _log.info("%s: plan for %s chosen in %.3f s from %d candidate(s)", base.name,
              ", ".join(f"{n}={lo}..{hi}" for n, (lo, hi) in ranges.items()), seconds, max(1, len(table)))
    return DynamicDiagram(base, ranges, plan, gpu=g, arch=arch, compiled_type=compiled_type, candidates=table,
                          specialized=special, plan_seconds=seconds)
