"""Hostile inputs, case by case: every one ends in exit 2 with one ``error:`` line naming the problem
(the CLI) or a :class:`napkin.errors.NapkinError` naming it (the Python API), or in a correct result.

The random fuzz of the command line is tests/test_cli_fuzz.py and the random diagrams are
tests/test_heldout_diagrams.py; this file holds the cases a person would try first, each with the
words its message must contain:

- diagram specs: a missing file, a syntax error, a name that is not a diagram, a function that
  needs arguments or returns nothing, an unknown built-in;
- sizes ``-s``: zero, negative, 2^49, not an integer, an unknown axis, the same axis twice;
  2^40 plans (with a warning that the arrays do not fit) or is refused where no launch can hold it;
- unknown GPUs and dtypes, and fp8/fp64 where no family runs them;
- diagrams: unused inputs (also listed as an equal copy of the array), an output that is an input,
  two boxes with one name, a contraction over an axis one operand lacks, contradictory sizes,
  repeated axes, reductions over every axis (0-d outputs), 1-sized axes, a chain past the
  planner's limit, unicode and C-keyword names, a mask reading one axis twice;
- ``napkin.torch`` ops called with the wrong number or kind of arguments;
- a plan on the scalar fallback says so (``warning:`` on stderr) from derive and generate.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from napkin_test_support import cli_invoke

from napkin.diagrams import (Axis, Diagram, array, causal, contract, exp, library, map_fn, max_over, mean_over,
                             rmsnorm, softmax, sum_over)
from napkin.errors import DiagramError, LaunchError, NapkinError

GPU_COMMANDS = {"verify", "bench"}


def _has_gpu() -> bool:
    return bool(torch.cuda.is_available())


def _compile(*args, **kwargs):
    from napkin.codegen.api import compile

    return compile(*args, **kwargs)


def _derive(*args, **kwargs):
    from napkin.codegen import derive

    return derive(*args, explain=False, **kwargs)


def exit_2(args: list[str], *fragments: str) -> str:
    """Run ``napkin ARGS``: exit 2, one ``error:`` line (the last), no traceback, the fragments in it."""
    code, out, err = cli_invoke(*args)
    shown = f"napkin {' '.join(args)}\nexit {code}\nstdout {out[-1500:]!r}\nstderr {err[-1500:]!r}"
    assert code == 2, shown
    assert "Traceback" not in out + err, shown
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("…")]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], shown
    for f in fragments:
        assert f in errors[0], (f, shown)
    return errors[0]


def exit_0(args: list[str]) -> tuple[str, str]:
    code, out, err = cli_invoke(*args)
    assert code == 0 and "Traceback" not in out + err and "error:" not in err, (args, code, err[-2000:])
    return out, err


# ----------------------------------------------------------------------------- user files

USER = textwrap.dedent('''\
    from napkin.diagrams import (Axis, Diagram, array, contract, exp, layernorm, map_fn, max_over, mean_over,
                                 rename, softmax, sum_over)
    a, b, c = Axis("a", 8), Axis("b", 16), Axis("c", 4)
    X = array("X", a, b)
    mm = Diagram("mm", contract(X, array("B", b, c), over=b, name="C"))
    notdiag = 3
    def needs(n):
        return mm
    def nothing():
        return None
    def unused():
        return Diagram("unused", exp(X, name="Y"), inputs=[array("X", a, b), array("U", c)])
    def out_is_input():
        return Diagram("oi", (exp(X, name="Y"), X))
    def dup_names():
        return Diagram("dup", (exp(X, name="Y"), map_fn("tanh", X, name="Y")))
    def sum_all():
        return Diagram("sum_all", sum_over(X, over=(a, b), name="Y"))
    def max_all():
        return Diagram("max_all", max_over(X, over=(a, b), name="Y"))
    def mean_all():
        return Diagram("mean_all", mean_over(array("T", a, b, c), over=(a, b, c), name="Y"))
    def dot():
        return Diagram("dot", contract(array("u", b), array("v", b), over=b, name="Y"))
    def ones():
        return Diagram("ones", softmax(array("X", Axis("a", 1), Axis("b", 1)), over="b", name="P"))
    def norm_1d():
        return Diagram("norm_1d", layernorm(array("X", a), over=a, name="P"))
    def keywords():
        i, f = Axis("int", 8), Axis("float", 64)
        return Diagram("int", exp(array("void", i, f), name="return"))
    def chain():
        cur = X
        for n in range(300):
            cur = map_fn("tanh", cur, name=f"t{n}")
        return Diagram("chain", cur)
    def unicode_axis():
        return Diagram("u", exp(array("X", Axis("\\u00e4", 3)), name="Y"))
    def dash_name():
        return Diagram("a-b", exp(X, name="Y"))
    def cuda_name():
        return Diagram("d", exp(array("__global__", a), name="Y"))
    def contradict():
        return Diagram("c", contract(array("P", Axis("a", 4), b), array("Q", Axis("a", 5), b), over=b, name="Z"))
    def absent():
        return Diagram("ab", contract(X, array("Q", c), over=b, name="Z"))
    def repeated():
        return Diagram("rep", exp(array("R", a, a), name="Y"))
    def swapped():
        S = array("S", a, Axis("d", 8))
        return Diagram("swapped", softmax(rename(S, a="d", d="a"), over="d", name="Y"))
    def plus_transpose():
        S = array("S", a, Axis("d", 8))
        return Diagram("plus_t", map_fn("add", rename(S, a="d", d="a"), S, name="Y"))
''')


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "user.py").write_text(USER, encoding="utf-8")
    (d / "syntax.py").write_text("def (:\n", encoding="utf-8")
    return d


SPEC_COMMANDS = [["show"], ["render", "-o", "-"], ["cost"], ["derive"], ["generate", "-o", "-"],
                 ["verify"], ["bench"]]


def _cmd(command: list[str], spec: str, *more: str) -> list[str]:
    return [command[0], spec, *command[1:], *more]


@pytest.mark.parametrize("command", SPEC_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("spec, fragments", [
    ("missing.py:d", ["missing.py", "does not exist"]),
    ("syntax.py:d", ["failed to import", "SyntaxError"]),
    ("user.py:notdiag", ["notdiag", "not a napkin Diagram"]),
    ("user.py:needs", ["needs", "takes arguments"]),
    ("user.py:nothing", ["nothing", "returned a NoneType"]),
    ("user.py:nope", ["has no 'nope'"]),
    ("user.py:unicode_axis", ["axis name", "is not allowed"]),
    ("user.py:dash_name", ["diagram name 'a-b' is not allowed"]),
    ("user.py:cuda_name", ["array name '__global__' is not allowed"]),
    ("user.py:contradict", ["axis 'a' has size 4", "but 5"]),
    ("user.py:absent", ["lacks axis 'b'"]),
    ("user.py:repeated", ["axis 'a' appears twice"]),
])
def test_bad_diagram_specs_exit_2_naming_the_problem(user, command, spec, fragments):
    if command[0] in GPU_COMMANDS and _has_gpu():
        pytest.skip("verify and bench would run on this GPU")
    exit_2(_cmd(command, str(user / spec)), *fragments)


@pytest.mark.parametrize("command", ["cost", "derive", "generate"])
@pytest.mark.parametrize("args, fragments", [
    (["-s", "q=0"], ["axis 'q'", "positive", "0"]),
    (["-s", "q=-4"], ["axis 'q'", "positive", "-4"]),
    (["-s", f"q={2 ** 49}"], ["axis 'q'", "largest axis size"]),
    (["-s", "q=1.5"], ["'1.5'", "not an integer"]),
    (["-s", "q=1e3"], ["'1e3'", "not an integer"]),
    (["-s", "q=abc"], ["'abc'", "not an integer"]),
    (["-s", "q"], ["expected NAME=VALUE"]),
    (["-s", "zz=4"], ["no axis 'zz'"]),
    (["-s", "q=4", "-s", "q=8"], ["axis 'q' is given twice"]),
    (["--gpu", "h900"], ["unknown GPU 'h900'"]),
    (["--dtype", "int8"], ["unknown dtype 'int8'"]),
    (["--group", "q=0"], ["--group", "positive"]),
    (["--group", "zz=16"], ["no axis 'zz'"]),
    (["--group", "q=16", "--group", "q=32"], ["axis 'q' is relabelled twice"]),
    (["--stream", "x=16@XX"], ["unknown level 'XX'"]),
])
def test_bad_sizes_gpus_dtypes_and_tiles_exit_2(command, args, fragments):
    exit_2([command, "attention", *args, *(["-o", "-"] if command == "generate" else [])], *fragments)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_derive_top_must_be_positive(value):
    """--top 0 used to print one alternative anyway (the planner keeps at least one)."""
    exit_2(["derive", "attention", "--top", value], "--top")


@pytest.mark.parametrize("name, dtype, gpu, fragments", [
    ("softmax", "fp8", "h100", ["no kernel", "'P'", "fp8"]),
    ("layernorm", "fp8", "h100", ["no kernel", "fp8"]),
    ("matmul", "fp64", "h100", ["--dtype fp64", "no kernel in fp64"]),
    ("matmul", "float64", "h100", ["--dtype float64", "no kernel in fp64"]),
    ("matmul", "tf32", "h100", ["--dtype tf32", "no kernel in tf32"]),
    ("attention", "fp8", "a100", ["fp8 runs on Hopper's fp8 tensor cores (sm_90a)", "(sm_80) has none"]),
])
def test_a_dtype_no_family_runs_is_refused_naming_it(name, dtype, gpu, fragments):
    for command in (["cost"], ["derive"], ["generate", "-o", "-"]):
        exit_2(_cmd(command, name, "--dtype", dtype, "--gpu", gpu), *fragments)


@pytest.mark.parametrize("short, spellings", [("bf16", ["bfloat16", "BF16", "torch.bfloat16"]),
                                              ("fp32", ["float32", "float"]),
                                              ("fp16", ["half", "float16"])])
def test_every_spelling_of_a_dtype_plans_as_its_short_name(short, spellings):
    """--dtype bfloat16 planned another kernel than bf16 (the families compare the short names),
    and predicted another time: the CLI and the API now take any spelling as the short name."""
    import json

    from napkin.codegen import derive

    want, _ = exit_0(["cost", "attention", "--dtype", short, "--json"])
    sizes = dict(q=4096, d=128, x=4096)
    want_plan = derive("attention", "h200", short, sizes, explain=False).plan
    for spelt in spellings:
        got, _ = exit_0(["cost", "attention", "--dtype", spelt, "--json"])
        assert json.loads(got) == json.loads(want), spelt
        plan = derive("attention", "h200", spelt, sizes, explain=False).plan
        assert plan.to_dict() == want_plan.to_dict(), spelt


def test_huge_sizes_plan_with_a_warning_or_are_refused_by_the_launch_limits():
    """2^40 rows: cost and derive warn that the arrays do not fit in HBM and plan anyway (a
    prediction); generate refuses the grid no launch can have, naming it."""
    big = ["-s", f"r={2 ** 40}", "-s", "x=64"]
    _, err = exit_0(["cost", "softmax", *big])
    assert "warning:" in err and "GiB" in err
    exit_2(["generate", "softmax", *big, "-o", "-"], "grid", "beyond CUDA's limits")


@pytest.mark.parametrize("spec", ["sum_all", "max_all", "mean_all", "dot", "ones", "norm_1d", "keywords"])
def test_legal_corner_diagrams_run_through_every_cpu_command(user, spec):
    """0-d outputs (reductions over every axis, a dot product), 1-sized axes, a 1-d norm, and
    names that are C keywords: planned and generated like any other."""
    path = f"{user / 'user.py'}:{spec}"
    for command in (["show"], ["render", "-o", "-"], ["cost"], ["derive"], ["derive", "--grad"]):
        exit_0(_cmd(command, path))
    out, _ = exit_0(_cmd(["generate", "-o", "-"], path))
    assert "__global__" in out


@pytest.mark.parametrize("spec", ["swapped", "plus_transpose"])
def test_inputs_read_through_a_transposed_view_plan_cost_and_draw(user, spec, tmp_path):
    """softmax(rename(S, a↔d)) made cost refuse the plan (its placement named S, which the model
    did not count as read) and derive --pseudocode/--svg crash with a KeyError; S + its transpose
    made derive crash with an IndexError."""
    path = f"{user / 'user.py'}:{spec}"
    for command in (["cost"], ["derive", "--pseudocode"], ["derive", "--svg", str(tmp_path / "p.svg")], ["generate", "-o", "-"],
                    ["derive", "--grad"]):
        exit_0(_cmd(command, path))


def test_unused_input_listed_as_an_equal_copy_plans_and_its_gradient_is_zero(user):
    """``inputs=[array("X", a, b), ...]`` is an equal copy of the X the boxes read, not the same
    object: this used to end in a KeyError traceback from every command."""
    path = f"{user / 'user.py'}:unused"
    for command in (["show"], ["cost"], ["derive"], ["generate", "-o", "-"], ["derive", "--grad"]):
        exit_0(_cmd(command, path))
    a, b, c = Axis("a", 8), Axis("b", 16), Axis("c", 4)
    X = array("X", a, b)
    d = Diagram("unused", exp(X, name="Y"), inputs=[array("X", a, b), array("U", c)])
    assert d.input_names == ("X", "U")
    assert d.inputs[0] is X  # the copy stands for the array the boxes read
    g = d.grad().reference(dtype=torch.float64, seed=0)
    assert torch.count_nonzero(g["dU"]) == 0 and torch.count_nonzero(g["dX"]) > 0


def test_an_output_that_is_an_input(user):
    """Planned, an input passed through is refused (generated code computes every output); its
    gradient is refused with that reason too (it used to blame a name clash, dX)."""
    path = f"{user / 'user.py'}:out_is_input"
    exit_0(["show", path])
    for command in (["cost"], ["derive"], ["generate", "-o", "-"]):
        exit_2(_cmd(command, path), "inputs passed through")
    exit_2(["derive", path, "--grad"], "output 'X' is an input passed through")


def test_a_profile_file_is_reported_with_its_own_numbers(tmp_path, monkeypatch):
    """A plan names its GPU by key and the report looks the key up again: a copy of the h200
    profile with another latency printed the built-in's assumptions (twice: the second run reads
    the plan cache), and a profile with a key of its own was refused as an unknown GPU."""
    import json

    from napkin.perfmodel.hardware import get_gpu

    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path / "cache"))
    data = json.loads(get_gpu("h200").to_json())
    data["memory_latency_s"] = 5e-06
    (tmp_path / "slow.json").write_text(json.dumps(data))
    for _ in range(2):
        out, _ = exit_0(["cost", "matmul", "--gpu", str(tmp_path / "slow.json"), "--explain"])
        assert "memory_latency_s = 5e-06" in out
    data.update(key="mygpu", name="My GPU")
    (tmp_path / "mine.json").write_text(json.dumps(data))
    for command in (["cost"], ["derive"], ["generate", "-o", str(tmp_path / "out.cu")]):
        out, _ = exit_0([*command, "matmul", "--gpu", str(tmp_path / "mine.json")])
        assert command[0] == "generate" or "My GPU" in out


def test_the_size_hint_names_only_axes_that_can_be_set(tmp_path):
    """The transformer block's backward has an axis x that follows q's size: the hint asked for
    -s x=VALUE, which cannot be given on its own."""
    (tmp_path / "g.py").write_text("from napkin.diagrams import library\n"
                                   "tbg = library.get('transformer_block').grad()\n")
    err = exit_2(["cost", f"{tmp_path / 'g.py'}:tbg"], "-s q=VALUE", "-s f=VALUE")
    assert "-s x=VALUE" not in err


def test_two_outputs_with_one_name_are_one_error(user):
    """Two outputs both called Y are refused, naming the name: neither is merged with the other nor
    renamed in silence (a caller reads an output by its name)."""
    exit_2(["show", f"{user / 'user.py'}:dup_names", "--json"], "two different outputs are both named 'Y'")


def test_a_chain_past_the_planner_limit_is_refused_naming_the_limit(user):
    path = f"{user / 'user.py'}:chain"
    exit_0(["show", path])
    exit_2(["derive", path, "--grad"], "1000")


def test_a_plan_on_the_scalar_fallback_says_so():
    """A matmul whose rows pass 32-bit indices runs on the scalar fallback (its last resort: the
    contraction family indexes with 32 bits): derive and generate print a warning naming the
    kernel. (A softmax or norm over an outer axis no longer does: it is written out as
    reductions and maps.)"""
    for command in (["derive"], ["generate", "-o", "-"]):
        code, out, err = cli_invoke(*_cmd(command, "softmax", "-s", "r=7", "-s", "x=5"))
        assert code == 0
        assert not any("fallback" in ln for ln in err.splitlines() if ln.startswith("warning:"))
    for command in (["derive"], ["generate", "-o", "-"]):
        code, out, err = cli_invoke(*_cmd(command, "matmul", "-s", "a=2147483637", "-s", "b=64", "-s", "c=64"))
        assert code == 0, err
        warned = [ln for ln in err.splitlines() if ln.startswith("warning:") and "fallback" in ln]
        assert warned and "C" in warned[0] and "slow" in warned[0], err


# ----------------------------------------------------------------------------- the Python API

@pytest.mark.parametrize("build, fragments", [
    (lambda: Axis("a", 0), ["axis 'a'", "positive"]),
    (lambda: Axis("a", -3), ["axis 'a'", "positive"]),
    (lambda: Axis("a", 2 ** 60), ["largest axis size"]),
    (lambda: Axis("a", 2.5), ["not an integer"]),
    (lambda: Axis("a", True), ["not an integer"]),
    (lambda: Axis("a-b", 4), ["'a-b' is not allowed"]),
    (lambda: Axis("ä", 4), ["is not allowed"]),
    (lambda: array("__global__", Axis("a", 4)), ["'__global__' is not allowed"]),
    (lambda: library.get("nope"), ["unknown diagram 'nope'"]),
    (lambda: library.get("softmax").bind(zz=3), ["no axis 'zz'"]),
    (lambda: library.get("softmax").bind(r=0, x=3), ["axis 'r'", "positive"]),
    (lambda: library.get("softmax").bind(r=2.0, x=3), ["not an integer"]),
    (lambda: contract(array("X", Axis("a", 2), Axis("b", 3)), array("Y", Axis("c", 4)), over="b"),
     ["lacks axis 'b'"]),
    (lambda: sum_over(array("X", Axis("a", 2)), over=()), ["no axes"]),
    (lambda: sum_over(array("X", Axis("a", 2), Axis("b", 2)), over=("a", "a")), ["appears twice"]),
    (lambda: softmax(array("X", Axis("a", 2)), over="b"), ["no axis 'b'"]),
    (lambda: causal(array("S", Axis("q", 4), Axis("x", 4)), "q", "q"), ["appears twice"]),
    (lambda: Diagram("d", map_fn("add", array("S", Axis("i", 3)), array("S", Axis("i", 3)))),
     ["input S[i] is built twice", "build it once"]),
    (lambda: Diagram("d", map_fn("add", array("S", Axis("i", 3)), array("S", Axis("j", 3)))),
     ["two different inputs are both called 'S'"]),
    (lambda: Diagram("oi", array("X", Axis("a", 4))).grad(), ["is an input passed through"]),
    (lambda: library.get("softmax").grad(wrt=["nope"]), ["'nope' is not an input"]),
    (lambda: library.get("softmax").grad(save="P"), ["save must be a set of names"]),
    (lambda: library.get("softmax").bind(r=4, x=8).reference({"X": torch.ones(4, 9)}), ["axis 'x'", "9"]),
    (lambda: library.get("softmax").bind(r=4, x=8).reference({"X": torch.ones(4, 8, dtype=torch.int64)}),
     ["int64"]),
    # a bound diagram called on an array of another size (it took the new size, silently)
    (lambda: library.get("softmax").bind(r=4, x=4)(array("X", Axis("r", 4), Axis("x", 5))),
     ["axis 'x' of size 5", "bound to 4"]),
    # sizes and pins of the wrong kind (raw TypeError / ValueError before)
    (lambda: _compile("softmax", sizes=[1, 2]), ["sizes must be a mapping", "list"]),
    (lambda: _derive("attention", "h100", "bf16", dict(q=64, d=64, x=64), fixed={"q": "x"}),
     ["fixed['q']", "(size, level, kind)"]),
    # more values than the host can hold (a raw allocator error before)
    (lambda: library.get("softmax").bind(r=2 ** 24, x=2 ** 24).reference(), ["cannot make input X", "values"]),
])
def test_api_mistakes_raise_a_napkin_error_naming_them(build, fragments):
    with pytest.raises(NapkinError) as info:
        build()
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_a_diagram_with_a_keyword_name_and_axes_generates():
    from napkin.codegen.generate import generate_source

    d = Diagram("int", exp(array("float", Axis("void", 4), Axis("return", 64)), name="struct"))
    src = generate_source(d, gpu="h100")
    assert "__global__" in src


def test_map_with_the_same_index_axis_twice_is_refused():
    """causal(S, q, q) compared a position with itself: every element kept, whatever the user
    meant. Refused, naming the axes; two distinct axes still build."""
    S = array("S", Axis("q", 4), Axis("x", 4))
    with pytest.raises(DiagramError, match="appears twice"):
        map_fn("sliding_window", S, params=(2,), index_axes=("x", "x"))
    assert causal(S, "q", "x").op.index_axes == ("q", "x")


@pytest.fixture(scope="module")
def softmax_op():
    import napkin.torch as nt

    return nt.op("softmax", sizes={"r": 4, "x": 8}, dtype="fp32", gpu="h100")


@pytest.mark.parametrize("args, fragments", [
    (lambda: (torch.ones(4, 8), torch.ones(4, 8)), ["takes 1 tensor", "got 2"]),
    (lambda: (), ["takes 1 tensor", "got 0"]),
    (lambda: ([[1.0] * 8] * 4,), ["X", "expected a torch tensor", "list"]),
    (lambda: (2.0,), ["X", "expected a torch tensor", "float"]),
    (lambda: (torch.ones(4, 9),), ["X", "(4, 9)"]),
    (lambda: (torch.ones(4, 8, dtype=torch.float16),), ["X", "float16"]),
])
def test_torch_op_called_wrongly_raises_a_launch_error(softmax_op, args, fragments):
    """The wrong number of arguments used to reach torch's schema check (a RuntimeError)."""
    with pytest.raises(LaunchError) as info:
        softmax_op(*args())
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_torch_op_called_rightly_matches_the_reference(softmax_op):
    x = torch.randn(4, 8)
    torch.testing.assert_close(softmax_op(x), torch.softmax(x, dim=-1))


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(sizes={"r": 0, "x": 8}), ["axis 'r'", "positive"]),
    (dict(sizes={"r": 4, "x": 8}, dtype="fp5"), ["unknown dtype 'fp5'"]),
    (dict(sizes={"r": 4, "x": 8}, dtype="fp8"), ["no kernel", "fp8"]),
    (dict(sizes={"x": 8}, dynamic={"r": (10, 1)}), ["dynamic axis 'r'"]),
    (dict(sizes={"x": 8}, dynamic={"zz": (1, 10)}), ["dynamic axis 'zz'"]),
    (dict(), ["no size"]),
])
def test_torch_op_bad_construction_raises_a_napkin_error(kwargs, fragments):
    import napkin.torch as nt

    with pytest.raises(NapkinError) as info:
        nt.op("softmax", gpu="h100", **kwargs)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_reductions_over_every_axis_match_torch():
    """0-d outputs are values, not errors: sum, max and mean over every axis equal torch's."""
    a, b, c = Axis("a", 3), Axis("b", 5), Axis("c", 2)
    X = array("X", a, b, c)
    x = torch.randn(3, 5, 2, dtype=torch.float64)
    for build, want in ((sum_over, x.sum()), (max_over, x.max()), (mean_over, x.mean())):
        d = Diagram("r", build(X, over=(a, b, c), name="Y"))
        got = d.reference({"X": x}, dtype=torch.float64)["Y"]
        assert got.shape == () and torch.allclose(got, want), (build.__name__, got, want)


def test_the_python_api_says_the_fallback_aloud(caplog, tmp_path, monkeypatch):
    """napkin.codegen.compile (and so napkin.torch ops, verify, bench) logs a warning naming a
    kernel on the scalar fallback; a plan without one logs nothing of the kind. The verify report
    prints the note as a slow path."""
    import logging

    from napkin.codegen import compile as compile_diagram
    from napkin.codegen.verify import VerifyReport

    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path))  # the plan cache must keep the note too
    # rows past 32-bit indices: only the fallback (64-bit) runs it
    slow = library.get("matmul").bind(a=2 ** 31 - 10, b=64, c=64)
    fast = library.get("softmax").bind(r=13, x=40)
    for _ in range(2):  # derived, then read back from the plan cache
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="napkin"):
            cd = compile_diagram(slow, gpu="h100", dtype="bf16")
        assert cd.plan.uses_fallback
        said = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
        assert said and "matmul" in said[0] and "C" in said[0], caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="napkin"):
        compile_diagram(fast, gpu="h100", dtype="bf16")
    assert not [r for r in caplog.records if "fallback" in r.getMessage()], caplog.text
    report = VerifyReport("matmul", "bf16", notes=list(cd.plan.notes))
    assert "slow path: kernel(s) C run on the scalar fallback" in str(report)


@pytest.mark.parametrize("n", [0, 2])
def test_module_called_with_the_wrong_number_of_activations(n):
    """A napkin error like the operator's (it was a TypeError), naming the activations."""
    import napkin.torch as nt

    m = nt.Module(library.get("mlp").bind(a=4, b=8, c=8), weights=["W", "bias"], gpu="h100", dtype="fp32")
    with pytest.raises(LaunchError, match=r"forward takes 1 input\(s\) \(X\), got " + str(n)):
        m(*[torch.ones(4, 8)] * n)
    assert m(torch.ones(4, 8)).shape == (4, 8)


@pytest.mark.parametrize("sizes, fragments", [
    ({"r": 2.7, "x": 8}, ["axis 'r'", "integer", "2.7"]),
    ({"r": "4", "x": 8}, ["axis 'r'", "integer", "'4'"]),
    ({"r": None, "x": 8}, ["axis 'r'", "integer"]),
    ({"r": 0, "x": 8}, ["axis 'r'", "positive"]),
    ([4, 8], ["sizes must be a mapping"]),
])
def test_torch_op_sizes_that_are_not_integers_are_refused(sizes, fragments):
    """A fractional size used to be truncated for the operator's digest, so op(sizes r=2.7) gave
    back the operator built for r=2 when one existed."""
    import napkin.torch as nt

    nt.op("softmax", sizes={"r": 2, "x": 8}, gpu="h100", dtype="fp32")
    with pytest.raises(NapkinError) as info:
        nt.op("softmax", sizes=sizes, gpu="h100", dtype="fp32")
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))
    assert nt.op("softmax", sizes={"r": np_int(4), "x": 8}, gpu="h100", dtype="fp32").compiled.diagram.sizes == \
        {"r": 4, "x": 8}


def np_int(n: int):
    import numpy as np

    return np.int64(n)


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(plan=object()), ["plan= must be a napkin Plan", "object"]),
    (dict(schedule=3), ["schedule= must be a napkin Schedule", "int"]),
])
def test_compile_with_a_plan_or_schedule_that_is_not_one(kwargs, fragments):
    """Both used to end in an AttributeError inside the planner or the lowering."""
    from napkin.codegen import compile as compile_diagram

    with pytest.raises(LaunchError) as info:
        compile_diagram("softmax", sizes={"r": 4, "x": 8}, gpu="h100", **kwargs)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_a_contraction_over_no_axis_is_planned_as_a_pointwise_map():
    """contract(X, t, over=()) is an elementwise (or outer) product: the pointwise family runs it
    as the map x * t (a transposed, a 0-d and a broadcast factor alike), never the fallback."""
    from napkin.codegen.families import pointwise
    from napkin.codegen.planner import derive

    i, j = Axis("i", 8), Axis("j", 16)
    for other in (array("t", j, i), array("t"), array("t", Axis("k", 3))):
        d = Diagram("p", contract(array("X", i, j), other, over=(), name="Y"))
        assert pointwise.FAMILY.explain(d) is None
        plan = derive(d, "h100", "bf16", explain=False).plan
        assert plan.families == ("pointwise",) and not plan.notes, plan


def test_an_unknown_dtype_is_one_error_class_at_every_entry_point():
    """derive, compile and with_dtype all refuse an unknown dtype with a DiagramError naming it (derive
    raised a HardwareError)."""
    import napkin.codegen as cg
    from napkin.diagrams import library
    from napkin.errors import DiagramError

    sizes = {"q": 64, "x": 64, "d": 64}
    for call in (lambda: cg.derive(library.get("attention"), "h200", "zz", sizes=sizes),
                 lambda: cg.compile("attention", gpu="h200", dtype="zz", sizes=sizes),
                 lambda: library.get("attention").with_dtype("zz")):
        with pytest.raises(DiagramError, match="unknown dtype 'zz'"):
            call()


@pytest.mark.parametrize("pin, why", [(["--stream", "a=64"], "stream a=64: no box sums over axis 'a'"),
                                      (["--group", "b=64"], "group b=64: no box keeps axis 'b'")])
def test_a_pin_no_family_can_honour_says_why_first(pin, why):
    """A stream of an axis no box sums (or a group of one no box keeps) is one line naming that,
    not every family's refusal of the box."""
    err = exit_2(["cost", "matmul", "-s", "a=512,b=256,c=256", *pin], why)
    assert "rowwise:" not in err


def test_a_stream_longer_than_its_axis_is_named_first():
    """A pinned chunk longer than its axis (no family builds one) is named before the families'
    refusals, which alone read as a list of every configuration."""
    err = exit_2(["cost", "attention", "-s", "q=128,x=128,d=64", "--stream", "x=1000"],
                 "the pinned stream x=1000 is longer than axis x (128 values)")
    assert err.index("longer than axis x") < err.index("derive found no kernel")
