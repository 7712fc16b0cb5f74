"""A hypothesis fuzz of the command line (issue #16): whatever the arguments and whatever a user
file does, ``napkin`` ends in one of two ways.

* **exit 0**, with no traceback and no ``error:`` line; or
* **exit 2**, with exactly one line starting with ``error: `` on stderr, and it is the last
  non-empty line. Lines before it may only be ``warning: `` lines, derive's progress lines
  (``… ``) and what a user file printed (which goes to stderr, never to stdout). Never a
  traceback.

Anything else (an uncaught exception, exit 1, a second error line, an exit 0 with an error)
fails the test. The runs are in-process, through typer's ``CliRunner`` on the real command
group (the same code path as the ``napkin`` script: :class:`napkin.cli_common.NapkinGroup`), so
that hypothesis gets through a few hundred examples in well under a minute; the real streams
(closed stdout, a full disk, a closed pipe) are tested as subprocesses in test_cli_output.py.

Every run is in a fresh working folder, and no generated value holds a '/', so whatever
``-o``/``--svg`` writes stays inside it. Commands that need a GPU (verify, bench, calibrate) end
quickly with exit 2 where there is none; on a GPU machine they are left out, so the fuzz never
allocates or measures anything.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from napkin_test_support import cli_invoke

from napkin.diagrams import library

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "my_diagram.py")
#: What the generated user files print (to stderr, where it is allowed).
PRINTED = "hello from the user file"


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


COMMANDS = ["list", "show", "render", "cost", "derive", "generate"] + ([] if _has_gpu() else
                                                                      ["verify", "bench", "calibrate"])

_counter = itertools.count()


@contextmanager
def _fresh_folder():
    """A new empty working folder for one run (with a subfolder ``sub`` to aim ``-o`` at)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="napkin_fuzz_") as d:
        os.chdir(d)
        (Path(d) / "sub").mkdir()
        try:
            yield Path(d)
        finally:
            os.chdir(old)


def run(args: list[str]) -> tuple[int, str, str]:
    return cli_invoke(*args)


def check_contract(args: list[str], code: int, out: str, err: str) -> None:
    """The contract of the module docstring."""
    shown = f"napkin {' '.join(map(repr, args))}\nexit {code}\nstdout: {out[-2000:]!r}\nstderr: {err[-3000:]!r}"
    assert "Traceback" not in out + err, shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if code == 0:
        assert not errors, shown
        return
    assert code == 2, shown
    assert len(errors) == 1 and lines[-1] == errors[0], shown
    for ln in lines[:-1]:
        assert ln.startswith(("warning: ", "… ")) or PRINTED in ln, shown


# ----------------------------------------------------------------------------- arguments

AXES = sorted({a for e in library.entries() for a in e.default_sizes} | {"q", "zz"})
JUNK_ALPHABET = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00")

junk = st.one_of(
    st.text(JUNK_ALPHABET, max_size=12),
    st.sampled_from(["", "-", "--", "-x", "--nope", "1e400", "-1e400", "nan", "inf", "-0", "0", "٣", "ẋ", "💥",
                     "=", "==", ",", "@", "q=", "=4", "..", ".", "x.py", "x.py:d", ":", "a:b", "--json", "-s",
                     "--help", "-h", "--version", "\n", " ", "\t", "x" * 3000, "1" + "0" * 400]),
)
numbers = st.one_of(
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70).map(str),
    st.sampled_from(["1e400", "1.5", "-1", "0", "+7", "1_024", "0x10", "٣", "", "1" + "0" * 320,
                     "1" + "0" * 5000, str(2 ** 48), str(2 ** 48 + 1), "64", "128", "4096"]),
)
sizes = st.one_of(
    st.builds(lambda a, v: f"{a}={v}", st.sampled_from(AXES), numbers),
    st.builds(lambda a, b, v, w: f"{a}={v},{b}={w}", st.sampled_from(AXES), st.sampled_from(AXES), numbers, numbers),
    st.builds(lambda a, v: f"{a}={v}", st.sampled_from(AXES),
              st.integers(min_value=1, max_value=2 ** 13).map(str)),  # sizes that plan: most runs get far
    junk,
)
tiles = st.one_of(
    st.builds(lambda a, v, lv: f"{a}={v}{lv}", st.sampled_from(AXES), numbers,
              st.sampled_from(["", "@SMEM", "@RF", "@HBM", "@L2", "@TC", "@nope", "@", "@@"])),
    junk,
)
names = st.one_of(
    st.sampled_from(library.names()),
    st.sampled_from([f"{EXAMPLE}:swiglu", f"{EXAMPLE}:linear_attention", EXAMPLE, f"{EXAMPLE}:nope",
                     f"{EXAMPLE}:1x", f"{EXAMPLE}:", "nosuch", "nosuch.py", "nosuch.py:d", "a:b", "ATTENTION"]),
    junk,
)
outputs = st.sampled_from(["-", "out.svg", "out.cu", "out.dot", "out.json", "x.png", "x.PDF", "sub", "sub/x.svg",
                           "missing/x.svg", "", ".", "..", "ü.svg", "n" * 300 + ".svg", "noext", "-o"])
OPTIONS = {
    "-s": sizes, "--size": sizes,
    "--gpu": st.one_of(st.sampled_from(["h100", "h200", "a100", "a100-80gb", "H100", "h900", "", "x.json",
                                        "nosuch.json"]), junk),
    "--dtype": st.one_of(st.sampled_from(["bf16", "fp16", "fp32", "fp8", "fp64", "bfloat16", "int8", ""]), junk),
    "--group": tiles, "-g": tiles, "--stream": tiles,
    "-o": outputs, "--output": outputs, "--svg": outputs, "--out": outputs,
    "--format": st.one_of(st.sampled_from(["svg", "dot", "png", "SVG", ""]), junk), "-f": junk,
    "--top": numbers, "--seed": numbers,
}
FLAGS = ["--json", "--symbolic", "--explain", "--pseudocode", "--sweep", "--quick", "--help", "--version"]

#: The options each command has (flags take no value); the fuzz mostly uses these, sometimes others.
CMD_OPTIONS = {
    "list": ["--json"],
    "show": ["-s", "--json"],
    "render": ["-s", "-o", "--format"],
    "cost": ["-s", "--gpu", "--dtype", "--group", "--stream", "--symbolic", "--explain", "--json"],
    "derive": ["-s", "--gpu", "--dtype", "--group", "--stream", "--top", "--json", "--svg", "--pseudocode"],
    "generate": ["-s", "--gpu", "--dtype", "--group", "--stream", "-o", "--json"],
    "verify": ["-s", "--gpu", "--dtype", "--seed", "--json"],
    "bench": ["-s", "--gpu", "--dtype", "--sweep", "--quick", "--out", "--json"],
    "calibrate": ["--gpu", "-o"],
}
USER_SPECS = [f"{EXAMPLE}:swiglu", f"{EXAMPLE}:linear_attention"]


def mostly(good, bad):
    """``good`` three times in four, ``bad`` otherwise: most runs get past parsing."""
    return st.integers(min_value=0, max_value=3).flatmap(lambda i: good if i else bad)


def _axes_of(name: str) -> list[str]:
    if name in library.names():
        return list(library.get(name).axes)
    return AXES


def _value(draw, option: str, axes: list[str]) -> str:
    axis = st.sampled_from(axes)
    small = st.integers(min_value=1, max_value=8192).map(str)
    if option in ("-s", "--size"):
        return draw(mostly(st.builds(lambda a, v: f"{a}={v}", axis, small), OPTIONS[option]))
    if option in ("--group", "-g", "--stream"):
        pow2 = st.sampled_from(["1", "8", "16", "32", "64", "128", "256", "3", "100000"])
        level = st.sampled_from(["", "", "@SMEM", "@RF"])
        return draw(mostly(st.builds(lambda a, v, lv: f"{a}={v}{lv}", axis, pow2, level), OPTIONS[option]))
    if option in ("--top", "--seed"):
        return draw(mostly(st.integers(min_value=0, max_value=20).map(str), OPTIONS[option]))
    if option in ("--gpu", "--dtype"):
        good = st.sampled_from(["h100", "h200", "a100"] if option == "--gpu" else ["bf16", "fp16", "fp32"])
        return draw(mostly(good, OPTIONS[option]))
    return draw(OPTIONS[option])


@st.composite
def command_lines(draw) -> list[str]:
    """A command (a junk one now and then), its diagram (mostly a real one), and up to six
    options, mostly the command's own with values that parse."""
    command = draw(st.sampled_from(COMMANDS) if draw(st.integers(min_value=0, max_value=9)) else junk)
    allowed = CMD_OPTIONS.get(command, sorted(OPTIONS))
    name = draw(mostly(st.sampled_from(library.names() + USER_SPECS), names))
    axes = _axes_of(name)
    args: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        kind = draw(st.integers(min_value=0, max_value=9))
        if kind <= 7:
            option = draw(st.sampled_from(allowed))
        elif kind == 8:
            option = draw(st.sampled_from(sorted(OPTIONS) + FLAGS))
        else:
            args.append(draw(junk))
            continue
        args += [option] if option in FLAGS else [option, _value(draw, option, axes)]
    if command not in ("list", "calibrate") and draw(st.integers(min_value=0, max_value=9)) > 0:
        args.insert(0 if draw(st.booleans()) else len(args), name)
    return [command, *args]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(args=command_lines())
def test_any_command_line_exits_0_or_2_with_one_error_line(args):
    with _fresh_folder():
        code, out, err = run(args)
    check_contract(args, code, out, err)


@st.composite
def planning_lines(draw) -> list[str]:
    """cost, derive and generate of a built-in diagram with sizes that all parse (up to 2^48),
    pinned tiles and every dtype and GPU: the runs that reach the planner and the code generator."""
    command = draw(st.sampled_from(["cost", "derive", "generate"]))
    name = draw(st.sampled_from(library.names()))
    axes = list(library.get(name).axes)
    args = [command, name, "--dtype", draw(st.sampled_from(["bf16", "fp16", "fp32", "fp64", "fp8"])),
            "--gpu", draw(st.sampled_from(["h100", "h200", "a100", "a100-80gb"]))]
    for axis in draw(st.lists(st.sampled_from(axes), unique=True)):
        value = draw(st.one_of(st.integers(min_value=1, max_value=2 ** 48), st.integers(min_value=1, max_value=300),
                               st.sampled_from([2 ** 31 - 1, 2 ** 31, 2 ** 32 + 1])))
        args += ["-s", f"{axis}={value}"]
    for axis in draw(st.lists(st.sampled_from(axes), max_size=2)):
        tile = draw(st.sampled_from([1, 2, 3, 16, 64, 128]))
        args += [draw(st.sampled_from(["--group", "--stream"])),
                 f"{axis}={tile}{draw(st.sampled_from(['', '@SMEM', '@RF']))}"]
    if command == "generate":
        args += ["-o", "-"]
    if command == "cost" and draw(st.booleans()):
        args += ["--symbolic", "--explain"]
    if draw(st.booleans()):
        args.append("--json")
    return args


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=planning_lines())
def test_any_planning_command_line_exits_0_or_2_with_one_error_line(args):
    with _fresh_folder():
        code, out, err = run(args)
    check_contract(args, code, out, err)
    if code == 0 and "--json" in args:
        import json

        json.loads(out)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=command_lines())
def test_a_few_command_lines_as_subprocesses(args):
    """The same contract through ``python3 -m napkin`` with real streams (the script's path)."""
    import subprocess
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with _fresh_folder() as d:
        p = subprocess.run([sys.executable, "-m", "napkin", *args], cwd=d, env=env, capture_output=True,
                           timeout=300)
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    check_contract(args, p.returncode, out, err)


# ----------------------------------------------------------------------------- user files

DIAGRAM = '''from napkin.diagrams import Diagram, array, axes, contract
a, b, c = axes("a b c")
mm = Diagram("mm", contract(array("A", a, b), array("B", b, c), over=b, name="C"))
'''

RAISED = [
    "ValueError('bad')", "RuntimeError('boom\\nsecond line')", "SystemExit(0)", "SystemExit(3)", "SystemExit()",
    "SystemExit('bye')", "SystemExit(None)", "GeneratorExit()", "StopIteration()", "AssertionError()",
    "MemoryError()", "RecursionError()", "NotImplementedError", "Odd('odd')", "BadStr()", "TypeError('t')",
    "ImportError('i')", "OSError(28, 'No space left on device')", "BrokenPipeError()", "UnicodeError('ü')",
    "ValueError('x' * 100000)", "Exception(object())", "__import__('napkin.errors').errors.DiagramError('d')",
]

HELPERS = '''class Odd(BaseException):
    pass
class BadStr(Exception):
    def __str__(self):
        raise ValueError("no str")
'''

BODIES = (
    [f"raise {e}\n" for e in RAISED]
    + [f"def d():\n    raise {e}\n" for e in RAISED]
    + [f"def d():\n    print({PRINTED!r})\n    raise {e}\n" for e in RAISED[:6]]
    + [
        DIAGRAM,
        DIAGRAM + "def d():\n    return mm\n",
        DIAGRAM + f"print({PRINTED!r})\ndef d():\n    print({PRINTED!r})\n    return mm\n",
        DIAGRAM + "mm2 = mm\n",  # two names, one diagram: still "several"
        DIAGRAM + "def d(x):\n    return mm\n",
        DIAGRAM + "def d(*args, **kw):\n    return mm\n",
        DIAGRAM + "d = lambda: mm\n",
        DIAGRAM + "class d:\n    pass\n",
        DIAGRAM + "def d():\n    yield mm\n",
        DIAGRAM + "d = print\n",
        DIAGRAM + "import sys\nd = sys.exit\n",
        DIAGRAM + "class C:\n    def __call__(self):\n        raise SystemExit(0)\nd = C()\n",
        DIAGRAM + "Diagram = None\n__name__ = None\nprint = None\n",
        DIAGRAM + "def d():\n    return d()\n",  # RecursionError
        DIAGRAM + "def d():\n    return 1 / 0\n",
        "def d():\n    return None\n", "def d():\n    return 3\n", "def d():\n    return 'mm'\n",
        "d = 3\n", "", "\n\n", "# only a comment\n", "def (:\n", "x = (\n", "\t\tindented = 1\n",
        "import nosuchmodule\n",
        "from napkin.diagrams import nosuchname\n", "\x00", "ü = 1\n", "'\\xff'\n",
        "from napkin.diagrams import axes, array, contract, Diagram\na, b = axes('a b')\n"
        "d = Diagram('d', contract(array('A', a, b), array('B', a, over=a)))\n",  # a mistake inside the builder
    ]
)
SPEC_TAILS = ["", ":d", ":mm", ":nope", ":1x", ":", ":d:d", ":a.b", ":__name__", ":print", ":Diagram", ":Odd"]
LAYOUTS = ["plain", "my.python", "a.py.d", "directory", "missing"]
USER_COMMANDS = [["show"], ["show", "--json"], ["render", "-o", "-"], ["cost", "--json"], ["derive"],
                 ["generate", "-o", "-"]]
SIZES = ["-s", "a=64", "-s", "b=64", "-s", "c=64"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.sampled_from(BODIES), helpers=st.booleans(), printed=st.booleans(), tail=st.sampled_from(SPEC_TAILS),
       layout=st.sampled_from(LAYOUTS), command=st.sampled_from(USER_COMMANDS), sized=st.booleans())
def test_any_user_file_exits_0_or_2_with_one_error_line(body, helpers, printed, tail, layout, command, sized):
    with _fresh_folder() as d:
        folder = d if layout in ("plain", "directory", "missing") else d / layout
        folder.mkdir(exist_ok=True)
        path = folder / f"user_{next(_counter)}.py"  # a new name each time: no stale bytecode
        text = (HELPERS if helpers else "") + (f"print({PRINTED!r})\n" if printed else "") + body
        if layout == "directory":
            path.mkdir()
        elif layout != "missing":
            path.write_text(text, encoding="utf-8")
        args = [*command[:1], f"{path}{tail}", *command[1:], *(SIZES if sized else [])]
        code, out, err = run(args)
    check_contract(args, code, out, err)
    assert PRINTED not in out, "a user file's prints reach stdout"
    if "--json" in args and code == 0:
        import json

        json.loads(out)


def test_the_contract_checker_rejects_what_it_should():
    """The checker itself: a traceback, exit 1, two error lines, an error line that is not last,
    noise before it, and an exit 0 with an error all fail."""
    bad = [(1, "", "error: x"), (2, "", "Traceback (most recent call last):\nerror: x"), (2, "", "error: a\nerror: b"),
           (2, "", "error: a\nwarning: b"), (2, "", "noise\nerror: a"), (0, "", "error: x"), (2, "", "")]
    for code, out, err in bad:
        with pytest.raises(AssertionError):
            check_contract(["x"], code, out, err)
    check_contract(["x"], 2, "", "… step\nwarning: w\nerror: e")
    check_contract(["x"], 0, "out", "warning: w")
