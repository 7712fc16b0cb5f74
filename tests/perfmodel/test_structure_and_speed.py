"""The performance model's structure: no import cycles, and work that grows with the schedule
only as much as it must (counted in calls, not timed)."""

import ast
import pathlib
import random

import sympy

import napkin.perfmodel as perfmodel
from napkin.diagrams import Axis, array, contract
from napkin.diagrams.diagram import Diagram
from napkin.perfmodel import legality
from napkin.perfmodel.cost import _Sym, cost
from napkin.perfmodel.legality import check_schedule
from napkin.perfmodel.masks import _ranges, _visited_range, visited
from napkin.perfmodel.predict import predict_schedule
from napkin.perfmodel.schedule import RELABEL_LEVELS, Relabel, Schedule

PKG = pathlib.Path(perfmodel.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """perfmodel modules ``path`` imports anywhere (module level or inside functions), leaving out
    ``if TYPE_CHECKING:`` blocks (they never run)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    mods = {p.stem for p in PKG.glob("*.py")}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                out.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.module and node.module.startswith("napkin.perfmodel"):
                rest = node.module[len("napkin.perfmodel"):].lstrip(".")
                out.update([rest.split(".")[0]] if rest else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("napkin.perfmodel."))
    return {m for m in out if m in mods and m != path.stem}


def test_no_import_cycle_in_perfmodel():
    graph = {p.stem: _imports(p) for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert "cost" not in graph["legality"] and "schedule" not in graph["legality"]
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert legality.RELABEL_LEVELS == RELABEL_LEVELS


def _chain(n: int, size: int = 256) -> Diagram:
    axes = [Axis(f"a{i}", size) for i in range(n + 2)]
    x = array("X0", axes[0], axes[1])
    for i in range(1, n + 1):
        x = contract(x, array(f"W{i}", axes[i], axes[i + 1]), over=axes[i].name, out=(axes[0], axes[i + 1]),
                     name=f"Y{i}")
    return Diagram(f"chain{n}", x)


def _count_plans(monkeypatch) -> list:
    calls = []
    real = legality._plan_kernel

    def counting(*args, **kw):
        calls.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(legality, "_plan_kernel", counting)
    return calls


def test_one_schedule_is_analysed_once(monkeypatch):
    d = _chain(6)
    s = Schedule.unfused(d, gpu="h100")
    s = s.replace(kernels=tuple(k.replace(relabels=(Relabel("a0", 64), Relabel(f"a{i + 2}", 64),
                                                    Relabel(f"a{i + 1}", 32, kind="stream")))
                                for i, k in enumerate(s.kernels)))
    calls = _count_plans(monkeypatch)
    check_schedule(s, "h100")
    c = cost(s, "h100")
    predict_schedule(s, "h100", the_cost=c)
    assert sorted(calls) == list(range(6))     # every kernel planned once for check, cost and predict


def test_relabel_checks_analyse_only_the_kernel_they_change(monkeypatch):
    n = 12
    d = _chain(n)
    calls = _count_plans(monkeypatch)
    s = Schedule.unfused(d, groups={f"a{i}": 64 for i in range(n + 2)}, gpu="h100")
    relabels = n + 2
    assert len(calls) <= relabels * n          # one kernel per trial (was the whole schedule per trial)
    assert all(len(k.relabels) >= 1 for k in s.kernels)


def test_symbolic_maximum_drops_dominated_terms_without_solving():
    a, b, c = (sympy.Symbol(n, positive=True) for n in "abc")
    assert _Sym.max([a * b, a * b + c, c]) == a * b + c
    m = _Sym.max([a * b, b * c, a * c])
    assert isinstance(m, sympy.Max) and set(m.args) == {a * b, b * c, a * c}
    many = _Sym.max([sympy.Symbol(f"z{i}", positive=True) for i in range(40)])
    assert isinstance(many, sympy.Max) and len(many.args) == 40
    # a long unfused chain stays symbolic and exact: H adds up, M is a maximum over kernels
    sym = cost(Schedule.unfused(_chain(30), gpu=None), False, symbolic=True)
    assert sym.is_symbolic and len(sym.per_kernel) == 30


def test_masked_chunk_ranges_match_a_scan():
    rng = random.Random(0)
    for _ in range(400):
        nq, nx, sx, gq = rng.randint(1, 200), rng.randint(1, 200), rng.randint(1, 64), rng.randint(1, 64)
        fn = rng.choice(["causal", "sliding_window"])
        params = (float(rng.randint(-30, 30)),) if fn == "causal" else (rng.randint(1, 150) + rng.choice([0, 0.5]),)
        for qt in _ranges(nq, gq):
            ks = [k for k, xc in enumerate(_ranges(nx, sx)) if visited((fn, params), qt, xc)]
            lo, hi = _visited_range((fn, params), qt, nx, sx)
            assert (list(range(lo, hi + 1)) if hi >= lo else []) == ks


def test_unfused_chain_cost_and_prediction_are_numeric_and_linear(monkeypatch):
    d = _chain(40)
    s = Schedule.unfused(d, gpu="h100")
    calls = _count_plans(monkeypatch)
    c = cost(s, "h100")
    p = predict_schedule(s, "h100", the_cost=c, assume=None)
    assert len(calls) == 40 and len(p.kernels) == 40
    assert isinstance(c.H_bytes("HBM"), int) and isinstance(c.M_bytes("HBM"), int)
    # every weight and X0 live throughout; one intermediate written and the next read at a time
    assert c.M("HBM") == 256 * 256 * 41 + 2 * 256 * 256


def test_concurrent_split_breakpoints_are_every_least_factor_within_the_budget():
    """``cost._breakpoints(n, budget)``: every f ≤ budget that is the least factor giving its
    quotient ceil(n / f), checked against the definition, and for an axis of 2^48 (the CLI's
    largest size), whose walk now starts at the budget (from k = 1 it took 2·√n steps a call, and a
    fuzzed ``napkin cost`` line sat in it for over ten minutes)."""
    import random

    from napkin.perfmodel.cost import _breakpoints

    def by_definition(n, budget):
        least = {}
        for f in range(1, min(n, budget) + 1):
            least.setdefault(-(-n // f), f)
        return sorted(set(least.values()) | {1})

    rng = random.Random(7)
    cases = [(n, b) for n in (1, 2, 3, 7, 64, 100, 1000) for b in (1, 2, 3, 5, 64, 5000)]
    cases += [(rng.randint(1, 3000), rng.randint(1, 3500)) for _ in range(300)]
    for n, b in cases:
        assert _breakpoints(n, b) == by_definition(n, b), (n, b)
    assert _breakpoints(2 ** 48, 64) == list(range(1, 65))
    big = _breakpoints(2 ** 48 + 1, 4096)
    assert big[0] == 1 and big[-1] == 4096 and len(big) == 4096
