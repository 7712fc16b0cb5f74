"""The package's layers: no import cycles between modules, and no upward import.

Every module of ``napkin`` is parsed with :mod:`ast` (never imported); every ``import`` and
``from ... import`` counts, wherever it is: at module level, inside functions (lazy imports), in
``try`` blocks, and for the layers also under ``if TYPE_CHECKING:`` (a type-only import of a
higher layer still couples the layers). The cycle check leaves out ``if TYPE_CHECKING:`` imports
alone: they never run, and they are Python's way of naming a type without an import cycle.
Relative imports are resolved against the
module's package. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, and
to ``pkg`` itself when some imported name is not a module (an attribute of ``pkg/__init__.py``);
``import a.b.c`` is an edge to ``a.b.c``. The implicit import of a module's parent packages is not
an edge (every submodule would otherwise "import" its package).

Cycles (strict): any strongly connected set of two or more modules fails, package ``__init__``
modules included. The one exemption is the top-level ``napkin/__init__.py``, which may lazily
import anything and which every module may import (for ``__version__``): it is left out of the
graph.

Layers, lowest first; a module may import its own layer and the layers listed as below it:

- base: ``napkin.errors``, ``napkin.dtypes``, ``napkin.settings`` (the environment variables);
- diagrams: ``napkin.diagrams``;
- perfmodel: ``napkin.perfmodel`` (the model: it imports neither code generation nor the
  benchmarks, not even inside functions; fitting factors to measurements lives in
  ``napkin.bench.calibration``);
- kernels: ``napkin.kernels``, the CUDA device library with its compile, cache and launch code.
  codegen imports it (to inline the device library and compile), so it is a leaf library below
  codegen: it may import the base only;
- codegen: ``napkin.codegen`` (may import base, diagrams, perfmodel, kernels);
- bench: ``napkin.bench`` (may import everything below, codegen included);
- torch: ``napkin.torch``, the PyTorch operators, module and CUDA graphs (beside bench: it may
  import everything below it, codegen included, but not bench);
- cli: ``napkin.cli``, ``napkin.cli_common``, ``napkin.__main__`` (may import everything).

The intended order is diagrams → perfmodel → codegen → kernels/bench/torch → cli; kernels sits
below codegen because codegen compiles through it, and it imports nothing of napkin but the base.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "napkin"

#: layer name -> the module prefixes it holds (longest prefix wins)
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("napkin.errors", "napkin.dtypes", "napkin.settings"),
    "diagrams": ("napkin.diagrams",),
    "perfmodel": ("napkin.perfmodel",),
    "kernels": ("napkin.kernels",),
    "codegen": ("napkin.codegen",),
    "bench": ("napkin.bench",),
    "torch": ("napkin.torch",),
    "cli": ("napkin.cli", "napkin.cli_common", "napkin.__main__"),
}

#: layer -> the layers its modules may import
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "diagrams": frozenset({"base", "diagrams"}),
    "perfmodel": frozenset({"base", "diagrams", "perfmodel"}),
    "kernels": frozenset({"base", "kernels"}),
    "codegen": frozenset({"base", "diagrams", "perfmodel", "kernels", "codegen"}),
    "bench": frozenset({"base", "diagrams", "perfmodel", "kernels", "codegen", "bench"}),
    "torch": frozenset({"base", "diagrams", "perfmodel", "kernels", "codegen", "torch"}),
    "cli": frozenset(LAYERS),
}

#: Modules outside the graph: the top-level package may lazily import anything.
EXEMPT = frozenset({"napkin"})


# ----------------------------------------------------------------------------- the graph


def modules(package_dir: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``module name -> (file, is_package)`` for every ``.py`` file under ``package_dir``."""
    out = {}
    for p in sorted(package_dir.rglob("*.py")):
        rel = p.relative_to(package_dir.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[0] != package or any(not x.isidentifier() for x in parts):
            continue
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (p, is_pkg)
    return out


def _longest_module(name: str, mods: Mapping) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in mods:
            return cand
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside the body of an ``if TYPE_CHECKING:`` (not its else)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def import_graph(package_dir: Path = PACKAGE_DIR, package: str = "napkin", *,
                 type_checking: bool = True) -> dict[str, dict[str, int]]:
    """``module -> {imported module: first line}`` for every module of the package (imports of
    other packages are left out; ``type_checking=False``: imports under ``if TYPE_CHECKING:``
    too)."""
    mods = modules(package_dir, package)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = set() if type_checking else _type_checking_nodes(tree)
        here = name if is_pkg else name.rpartition(".")[0]
        out = graph.setdefault(name, {})

        def add(target: str | None, line: int) -> None:
            if target and target != name:
                out.setdefault(target, line)

        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package:
                        add(_longest_module(alias.name, mods), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    up = node.level - 1
                    if up >= len(base):
                        raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top package")
                    base = base[:len(base) - up]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != package:
                    continue
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                for s in subs:
                    add(s, node.lineno)
                if len(subs) < len(node.names) or not subs:
                    add(_longest_module(target, mods), node.lineno)
    return graph


def layer_of(module: str) -> str | None:
    best, best_len = None, -1
    for layer, prefixes in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def upward_imports(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Every import that goes against :data:`ALLOWED`, as ``"a (line n) imports b: ..."``."""
    out = []
    for mod, targets in sorted(graph.items()):
        if mod in EXEMPT:
            continue
        la = layer_of(mod)
        for tgt, line in sorted(targets.items()):
            if tgt in EXEMPT:
                continue
            lb = layer_of(tgt)
            if la is None or lb is None:
                continue  # test_every_module_has_a_layer reports these
            if lb not in ALLOWED[la]:
                out.append(f"{mod} (line {line}) imports {tgt}: layer {la} may not import layer {lb}")
    return out


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan), each as one concrete cycle
    ``[a, b, ..., a]`` through the set, then its other members."""
    nodes = [n for n in graph if n not in EXEMPT]
    adj = {n: [t for t in graph[n] if t in graph and t not in EXEMPT] for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # iterative Tarjan (no recursion limit on long chains)
        work = [(v, iter(adj[v]))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(adj[nxt])))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))

    for n in sorted(nodes):
        if n not in index:
            strong(n)
    out = []
    for comp in sorted(sccs):
        members = set(comp)
        start = comp[0]
        # shortest path from start back to start inside the set (BFS)
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt_frontier = []
            for u in frontier:
                for w in adj[u]:
                    if w not in members:
                        continue
                    if w == start:
                        found = u
                        break
                    if w not in prev:
                        prev[w] = u
                        nxt_frontier.append(w)
                if found is not None:
                    break
            frontier = nxt_frontier
        path = [start]
        if found is not None:
            back = [found]
            while back[-1] != start:
                back.append(prev[back[-1]])
            path = list(reversed(back)) + [start]
        out.append(path + sorted(members - set(path)))
    return out


def _describe_cycle(graph, cyc: list[str]) -> str:
    """``a -> b (a line 3) -> a (b line 9)``, then the rest of the set."""
    i = cyc.index(cyc[0], 1)
    loop, rest = cyc[:i + 1], cyc[i + 1:]
    steps = [loop[0]] + [f"{b} ({a}:{graph[a][b]})" for a, b in zip(loop, loop[1:])]
    text = " -> ".join(steps)
    return text + (f"; with {', '.join(rest)} in the same cycle set" if rest else "")


# ----------------------------------------------------------------------------- the tests


def test_the_graph_builder_on_a_small_package(tmp_path):
    """Relative imports, imports inside functions, ``from pkg import submodule`` and a cycle
    through a package __init__."""
    root = tmp_path / "pk"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from .b import x\n")
    (root / "b.py").write_text("def f():\n    from pk.sub import c\n")
    (root / "sub" / "__init__.py").write_text("from . import c\nfrom .c import y\n")
    (root / "sub" / "c.py").write_text("import os\nfrom .. import a\nfrom ..sub import d\n")
    (root / "sub" / "d.py").write_text("from .. import value_in_init\n"
                                       "from typing import TYPE_CHECKING\n"
                                       "if TYPE_CHECKING:\n    from . import c\nelse:\n    import pk.b\n")
    g = import_graph(root, "pk", type_checking=False)
    assert g["pk.sub.d"] == {"pk": 1, "pk.b": 6}
    assert import_graph(root, "pk")["pk.sub.d"] == {"pk": 1, "pk.sub.c": 4, "pk.b": 6}
    (root / "sub" / "d.py").write_text("from .. import value_in_init\n")
    g = import_graph(root, "pk")
    assert g["pk.a"] == {"pk.b": 1}
    assert g["pk.b"] == {"pk.sub.c": 2}
    assert g["pk.sub"] == {"pk.sub.c": 1}
    assert g["pk.sub.c"] == {"pk.a": 2, "pk.sub.d": 3}
    assert g["pk.sub.d"] == {"pk": 1}
    cyc = cycles(g)
    assert len(cyc) == 1 and set(cyc[0]) == {"pk.a", "pk.b", "pk.sub.c"} and cyc[0][0] == cyc[0][3]
    assert "pk.a -> pk.b (pk.a:1)" in _describe_cycle(g, cyc[0])


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if m not in EXEMPT and layer_of(m) is None]
    assert not missing, f"modules with no layer (add them to LAYERS in {__file__}): {', '.join(missing)}"


def test_no_upward_imports():
    bad = upward_imports(import_graph())
    assert not bad, f"{len(bad)} upward import(s):\n  " + "\n  ".join(bad)


def test_perfmodel_imports_neither_codegen_nor_bench():
    g = import_graph()
    bad = [f"{m} (line {line}) imports {t}" for m, ts in sorted(g.items()) if m.startswith("napkin.perfmodel")
           for t, line in sorted(ts.items()) if t.startswith(("napkin.codegen", "napkin.bench"))]
    assert not bad, "perfmodel must import neither codegen nor bench:\n  " + "\n  ".join(bad)


def test_no_import_cycles():
    g = import_graph(type_checking=False)
    found = cycles(g)
    assert not found, f"{len(found)} import cycle(s) between modules:\n  " + "\n  ".join(
        _describe_cycle(g, c) for c in found)
