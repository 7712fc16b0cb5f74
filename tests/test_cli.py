"""The command line, in-process (typer's CliRunner) and as a subprocess (``python3 -m napkin``).

Also: the shared option helpers of ``napkin.cli_common``, and the README's promises (the two
quick-start commands, ``.ci/run`` running the test command verbatim, the Python example).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from napkin_test_support import cli_invoke

from napkin import cli_common
from napkin.cli_common import parse_size, parse_sizes, resolve_sizes
from napkin.diagrams import library
from napkin.errors import DiagramError, NapkinError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/my_diagram.py"


invoke = cli_invoke


def run_module(*args: str, cwd: Path = ROOT, timeout: float = 120):
    """``python3 -m napkin ARGS`` straight from the checkout (no install needed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FORCE_COLOR", None)
    p = subprocess.run([sys.executable, "-m", "napkin", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def assert_user_error(code: int, out: str, err: str, *fragments: str):
    """Exit 2, exactly one line ``error: ...`` on stderr containing ``fragments``, no traceback."""
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in out + err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture
def user_files(tmp_path):
    """A directory of broken and working user files."""
    files = {
        "broken.py": """\
            from napkin.diagrams import axes
            raise RuntimeError("boom")
            """,
        "syntax.py": "def (:\n",
        "empty.py": "x = 1\n",
        "mismatch.py": """\
            from napkin.diagrams import Axis, Diagram, array, contract
            A = array("A", Axis("a"), Axis("d", 64))
            B = array("B", Axis("d", 128), Axis("c"))
            d = Diagram("d", contract(A, B, over="d"))
            """,
        "lacks.py": """\
            from napkin.diagrams import Diagram, array, axes, contract
            a, b, c = axes("a b c")
            d = Diagram("d", contract(array("A", a, b), array("B", c), over=b))
            """,
        "dtypes.py": """\
            from napkin.diagrams import Diagram, array, axes, contract
            q, x, d = axes("q x d")
            S = Diagram("S", contract(array("Q", q, d), array("K", x, d, dtype="fp32"), over=d))
            """,
        "good.py": """\
            from napkin.diagrams import Diagram, array, axes, contract
            a, b, c = axes("a b c")
            mm = Diagram("mm", contract(array("A", a, b), array("B", b, c), over=b, name="C"))
            """,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


# ----------------------------------------------------------------------------- list

def test_list_shows_every_library_diagram():
    code, out, err = invoke("list")
    assert code == 0, err
    for e in library.entries():
        assert e.name in out
    assert "C[a,c]" in out  # descriptions are printed as text, not read as rich markup
    assert "q=4096" in out and "contraction" in out and "attention" in out


def test_list_json():
    code, out, _ = invoke("list", "--json")
    assert code == 0
    data = json.loads(out)
    assert [d["name"] for d in data] == library.names()
    att = next(d for d in data if d["name"] == "attention")
    assert att["default_sizes"] == {"q": 4096, "x": 4096, "d": 128}
    assert att["family"] == "attention" and att["description"]


# ----------------------------------------------------------------------------- show

def test_show_symbolic():
    code, out, err = invoke("show", "attention")
    assert code == 0, err
    assert "diagram attention" in out and "softmax x" in out and "O[q,d]" in out
    assert "symbolic" in out


def test_show_with_sizes():
    code, out, err = invoke("show", "attention", "-s", "q=4096", "-s", "x=4096", "--size", "d=128")
    assert code == 0, err
    assert "sizes: q=4096 d=128 x=4096" in out


def test_show_partial_sizes_and_comma_form():
    code, out, _ = invoke("show", "mha", "-s", "q=64,d=32")
    assert code == 0
    assert "q=64" in out and "d=32" in out and "symbolic: h, x" in out


def test_show_json():
    code, out, _ = invoke("show", "gqa", "-s", "h=2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["name"] == "gqa" and data["sizes"]["h"] == 2 and data["sizes"]["q"] == "q"
    assert [i["name"] for i in data["inputs"]] == ["Q", "K", "V"]
    assert data["inputs"][0]["axes"] == ["h", "j", "q", "d"]
    assert data["outputs"][0]["name"] == "O"


def test_show_user_file():
    code, out, err = invoke("show", f"{ROOT / EXAMPLE}:swiglu", "-s", "a=64")
    assert code == 0, err
    assert "diagram swiglu" in out and "silu" in out and "a=64" in out
    code, out, err = invoke("show", f"{ROOT / EXAMPLE}:linear_attention")  # a function returning a Diagram
    assert code == 0, err
    assert "diagram linear_attention" in out


def test_show_every_library_diagram_at_default_sizes():
    for e in library.entries():
        args = [a for n, s in e.default_sizes.items() for a in ("-s", f"{n}={s}")]
        code, out, err = invoke("show", e.name, *args)
        assert code == 0, (e.name, err)
        assert "symbolic" not in out, e.name


# ----------------------------------------------------------------------------- render

def _svg_ok(text: str, name: str):
    root = ET.fromstring(text)  # well-formed XML
    assert root.tag.endswith("svg")
    assert name in text


def test_render_svg(tmp_path):
    pytest.importorskip("napkin.diagrams.render")
    out_file = tmp_path / "attention.svg"
    code, out, err = invoke("render", "attention", "-s", "q=4096", "-s", "x=4096", "-s", "d=128",
                            "-o", str(out_file))
    assert code == 0, err
    assert "wrote" in out
    text = out_file.read_text()
    _svg_ok(text, "attention")
    assert "4096" in text


def test_render_dot(tmp_path):
    pytest.importorskip("napkin.diagrams.dot")
    out_file = tmp_path / "mha.dot"
    code, _, err = invoke("render", "mha", "-o", str(out_file))  # format from the suffix
    assert code == 0, err
    text = out_file.read_text()
    assert text.lstrip().startswith("digraph") and "softmax" in text
    code, out, err = invoke("render", "mha", "--format", "dot", "-o", "-")
    assert code == 0, err
    assert out.lstrip().startswith("digraph")


def test_render_wiring_with_a_stub_renderer(tmp_path, monkeypatch):
    """The command calls diagram.to_svg() on the bound diagram and writes what it returns."""
    from napkin.diagrams.diagram import Diagram

    seen = {}

    def fake_to_svg(self, **options):
        seen["diagram"] = self
        return '<svg xmlns="http://www.w3.org/2000/svg"><title>stub</title></svg>'

    monkeypatch.setattr(Diagram, "to_svg", fake_to_svg)
    out_file = tmp_path / "x.svg"
    code, _, err = invoke("render", "softmax", "-s", "r=3", "-o", str(out_file))
    assert code == 0, err
    assert seen["diagram"] == library.get("softmax").bind(r=3)
    _svg_ok(out_file.read_text(), "stub")


def test_render_default_output_name(tmp_path, monkeypatch):
    pytest.importorskip("napkin.diagrams.render")
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("render", "matmul")
    assert code == 0, err
    _svg_ok((tmp_path / "matmul.svg").read_text(), "matmul")


def test_render_user_file(tmp_path):
    pytest.importorskip("napkin.diagrams.render")
    out_file = tmp_path / "la.svg"
    code, _, err = invoke("render", f"{ROOT / EXAMPLE}:linear_attention", "-o", str(out_file))
    assert code == 0, err
    _svg_ok(out_file.read_text(), "linear_attention")


# ----------------------------------------------------------------------------- bad input → exit 2

BAD_CASES = [
    (["show", "atention"], ["unknown diagram 'atention'"]),
    (["show", "attention", "-s", "zz=3"], ["no axis 'zz'", "attention"]),
    (["show", "attention", "-s", "q"], ["-s 'q'", "NAME=VALUE"]),
    (["show", "attention", "-s", "q=abc"], ["'abc'", "axis 'q'"]),
    (["show", "attention", "-s", "q=0"], ["axis 'q'", "positive"]),
    (["show", "attention", "-s", "q=-4"], ["axis 'q'", "positive"]),
    (["show", "attention", "-s", "q=1.5"], ["axis 'q'"]),
    (["show", "attention", "-s", "x;rm=3"], ["not an axis name"]),
    (["show", "attention", "-s", "q=1", "-s", "q=2"], ["axis 'q' is given twice"]),
    (["render", "attention", "--format", "png", "-o", "x.png"], ["unknown format 'png'"]),
    (["render", "nope"], ["unknown diagram 'nope'"]),
]


@pytest.mark.parametrize("args, fragments", BAD_CASES, ids=[" ".join(a) for a, _ in BAD_CASES])
def test_bad_input_in_process(args, fragments):
    assert_user_error(*invoke(*args), *fragments)


USER_FILE_CASES = [
    ("missing.py:d", ["does not exist"]),
    ("broken.py:d", ["failed to import", "RuntimeError: boom"]),
    ("syntax.py", ["failed to import", "SyntaxError"]),
    ("empty.py", ["holds no napkin Diagram"]),
    ("good.py:nope", ["has no 'nope'", "mm"]),
    ("mismatch.py:d", ["contract over d", "'d'", "64", "128"]),
    ("lacks.py:d", ["contract over b", "lacks axis 'b'"]),
    ("dtypes.py:S", ["contract over d", "bf16", "fp32"]),
]


@pytest.mark.parametrize("spec, fragments", USER_FILE_CASES, ids=[s for s, _ in USER_FILE_CASES])
def test_bad_user_files_in_process(user_files, spec, fragments):
    assert_user_error(*invoke("show", str(user_files / spec)), *fragments)


def test_good_user_file_with_unknown_axis(user_files):
    assert_user_error(*invoke("show", f"{user_files / 'good.py'}:mm", "-s", "q=3"), "no axis 'q'", "'mm'")
    code, out, err = invoke("show", f"{user_files / 'good.py'}:mm", "-s", "a=3")
    assert code == 0, err
    assert "a=3" in out


def test_render_to_an_unwritable_place(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "a.svg"
    pytest.importorskip("napkin.diagrams.render")
    assert_user_error(*invoke("render", "attention", "-o", str(target)), "cannot write")


def test_long_error_stays_on_one_line():
    line = assert_user_error(*invoke("show", "x" * 300))
    assert len(line) > 300


def test_unknown_command_and_option_exit_2():
    code, _, err = invoke("frobnicate")
    assert code == 2 and "Traceback" not in err
    code, _, err = invoke("show", "attention", "--bogus")
    assert code == 2 and "Traceback" not in err


def test_help_and_version():
    code, out, _ = invoke("--help")
    assert code == 0
    for cmd in ("list", "show", "render"):
        assert cmd in out
    code, out, _ = invoke("render", "--help")
    assert code == 0 and "--size" in out and "--format" in out and "--output" in out
    code, out, _ = invoke("--version")
    assert code == 0 and out.startswith("napkin ")


# ----------------------------------------------------------------------------- the plan: generate, pinned tiles

PINNED_BAD = [
    (["cost", "softmax", "--stream", "x=64"], "P", "softmax", "rowwise", "(stream x=64@SMEM); it builds g_r="),
    (["derive", "attention", "-s", "q=512", "-s", "x=512", "-s", "d=64", "--group", "d=32"], "S", "attention",
     "contraction", "(group d=32@SMEM); it builds g_q="),
    (["generate", "softmax", "-s", "r=8", "-s", "x=1000", "--group", "x=8", "-o", "-"], "P", "softmax",
     "rowwise", "(group x=8@SMEM)"),
]


def _pinned_error(err: str, box: str, diagram: str, family: str, tail: str) -> None:
    """Exactly one ``error:`` line (the last on stderr: derive's progress lines come before it),
    naming the box, the diagram and, per family, why none of its configurations fits the pins."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    line = errors[0]
    assert f"derive found no kernel that runs box {box!r} of {diagram!r} with the pinned tiling" in line, line
    assert f"{family}: none of its configurations has the pinned tiles " in line and tail in line, line
    assert "Traceback" not in err


@pytest.mark.parametrize("args, box, diagram, family, tail", PINNED_BAD, ids=[" ".join(a[:3]) for a, *_ in PINNED_BAD])
def test_pinned_tiles_no_configuration_has_exit_2_with_one_error_line(args, box, diagram, family, tail):
    code, out, err = invoke(*args)
    assert code == 2, (out, err)
    _pinned_error(err, box, diagram, family, tail)
    if "--json" not in args and args[0] == "cost":  # --json: no progress lines, the one line alone
        assert_user_error(*invoke(*args, "--json"), "derive found no kernel", tail)


def test_pinned_tiles_error_subprocess():
    args, box, diagram, family, tail = PINNED_BAD[0]
    code, out, err = run_module(*args)
    assert code == 2, (out, err)
    _pinned_error(err, box, diagram, family, tail)


def test_generate_json_is_the_plan_and_its_launches(tmp_path):
    """A plan of several kernels (fp32 layernorm rows of 32768: the norm on rowwise, the last
    elementwise box on the pointwise family): one launch per kernel, the intermediate in an HBM buffer."""
    target = tmp_path / "ln.cu"
    code, out, err = invoke("generate", "layernorm", "-s", "r=7", "-s", "x=32768", "--dtype", "fp32",
                            "-o", str(target), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"plan", "output", "launches", "buffers"}
    assert data["output"] == str(target) and target.exists()
    kernels = data["plan"]["kernels"]
    assert [k["family"] for k in kernels] == ["rowwise", "pointwise"]
    assert sorted(b for k in kernels for b in k["boxes"]) == ["N", "Y", "mul"]
    assert len(data["launches"]) == 2
    assert data["buffers"] == [kernels[0]["boxes"][-1]]  # the array the first kernel hands the second
    src = target.read_text()
    assert "family rowwise+pointwise" in src and "plan (2 kernels" in src
    assert "kernel N [rowwise]" in src and "kernel Y [pointwise]" in src
    # derive --json prints the same plan
    code, out, err = invoke("derive", "layernorm", "-s", "r=7", "-s", "x=32768", "--dtype", "fp32", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["kernels"] == kernels


# ----------------------------------------------------------------------------- subprocess: python3 -m napkin

def test_module_list_show_render(tmp_path):
    code, out, err = run_module("list")
    assert code == 0, err
    assert "attention_softcap" in out and "transformer_block" in out
    code, out, err = run_module("show", "attention", "-s", "q=4096", "-s", "x=4096", "-s", "d=128")
    assert code == 0, err
    assert "diagram attention" in out and "q=4096" in out
    if not (ROOT / "napkin" / "diagrams" / "render.py").exists():
        pytest.skip("the SVG renderer is not in this checkout yet")
    svg = tmp_path / "attention.svg"
    code, out, err = run_module("render", "attention", "-s", "q=4096", "-s", "x=4096", "-s", "d=128",
                                "-o", str(svg))
    assert code == 0, err
    _svg_ok(svg.read_text(), "attention")


def test_module_runs_from_another_directory(tmp_path):
    code, out, err = run_module("show", str(ROOT / EXAMPLE) + ":swiglu", cwd=tmp_path)
    assert code == 0, err
    assert "diagram swiglu" in out


SUBPROCESS_BAD = [
    ["show", "atention"],
    ["show", "attention", "-s", "zz=3"],
    ["show", "attention", "-s", "q=abc"],
    ["render", "attention", "--format", "png"],
]


@pytest.mark.parametrize("args", SUBPROCESS_BAD, ids=[" ".join(a) for a in SUBPROCESS_BAD])
def test_bad_input_subprocess(args):
    assert_user_error(*run_module(*args))


@pytest.mark.parametrize("spec", ["missing.py:d", "broken.py:d", "empty.py", "good.py:nope", "mismatch.py:d",
                                  "dtypes.py:S"])
def test_bad_user_files_subprocess(user_files, spec):
    assert_user_error(*run_module("show", str(user_files / spec)))


def test_subprocess_error_has_no_colour_codes_when_piped():
    code, out, err = run_module("show", "atention")
    assert "\x1b[" not in err


# ----------------------------------------------------------------------------- cli_common

def test_parse_size():
    assert parse_size("q=4096") == ("q", 4096)
    assert parse_size(" d = 128 ") == ("d", 128)
    assert parse_size("x=4_096") == ("x", 4096)
    for bad in ("q", "=3", "q=", "q=3=4", "q=abc", "q=0", "q=-1", "q=1e3", "1q=3", "q;x=3",
                "q=\u0663", "q=\uff14"):  # Arabic-Indic and fullwidth digits: int() takes them, -s does not
        with pytest.raises(NapkinError):
            parse_size(bad)


def test_parse_sizes():
    assert parse_sizes(None) == {}
    assert parse_sizes(["q=1", "x=2,d=3", "q=1"]) == {"q": 1, "x": 2, "d": 3}
    with pytest.raises(NapkinError, match="given twice"):
        parse_sizes(["q=1", "q=2"])


def test_resolve_sizes():
    att = library.entry("attention")
    assert resolve_sizes(att, {}, use_defaults=False) == {}
    assert resolve_sizes(att, ["q=7"], use_defaults=False) == {"q": 7}
    assert resolve_sizes(att, {"q": 7}, use_defaults=True) == {"q": 7, "d": 128, "x": 4096}
    assert resolve_sizes("attention", None, use_defaults=True) == {"q": 4096, "d": 128, "x": 4096}
    with pytest.raises(DiagramError, match="no axis 'zz'"):
        resolve_sizes(att, {"zz": 3}, use_defaults=True)
    with pytest.raises(DiagramError, match="no axis 'zz'"):
        resolve_sizes(att, {"zz": 3}, use_defaults=False)


def test_resolve_sizes_derived_axis():
    # transformer_block's key axis x is the query axis renamed: it takes q's size
    sizes = resolve_sizes(library.entry("transformer_block"), {"q": 100}, use_defaults=True)
    assert sizes["q"] == sizes["x"] == 100 and sizes["e"] == 1024


def test_resolve_sizes_user_diagram_needs_every_size():
    from napkin.diagrams import load_diagram

    d = load_diagram(f"{ROOT / EXAMPLE}:swiglu")
    with pytest.raises(DiagramError, match="-s b=VALUE -s f=VALUE"):
        resolve_sizes(d, {"a": 3}, use_defaults=True)
    assert resolve_sizes(d, {"a": 3, "b": 4, "f": 5}, use_defaults=True) == {"a": 3, "b": 4, "f": 5}
    # sizes already bound in the diagram act as defaults
    assert resolve_sizes(d.bind(b=8, f=9), {"a": 3}, use_defaults=True) == {"a": 3, "b": 8, "f": 9}


def test_gpu_and_dtype_helpers():
    assert cli_common.DEFAULT_GPU == "h100" and cli_common.DEFAULT_DTYPE == "bf16"
    assert cli_common.get_dtype("bfloat16").name == "bf16"
    with pytest.raises(NapkinError):
        cli_common.get_dtype("int7")
    gpu = cli_common.get_gpu(cli_common.DEFAULT_GPU)
    assert "H100" in str(getattr(gpu, "name", gpu)).upper()
    with pytest.raises(NapkinError):
        cli_common.get_gpu("nonexistent-gpu")


def test_handle_errors_wrapper_keeps_the_signature():
    import inspect

    import typer

    @cli_common.handle_errors
    def cmd(name: str, size: cli_common.SizesOpt = None):
        raise DiagramError("contract over d: axis 'd' mismatch")

    assert list(inspect.signature(cmd).parameters) == ["name", "size"]
    with pytest.raises(typer.Exit) as e:
        cmd("x")
    assert e.value.exit_code == 2


def test_pyproject_declares_the_console_script():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["napkin"] == "napkin.cli:main"


# ----------------------------------------------------------------------------- README and CI

def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _quick_start_commands() -> list[str]:
    text = _readme()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [b.strip() for b in blocks]


def test_readme_has_exactly_two_quick_start_commands():
    cmds = _quick_start_commands()
    assert len(cmds) == 2
    for c in cmds:
        assert "\n" not in c, "each quick-start command is one shell line"
        assert c.startswith('python3 -c "import torch" 2>/dev/null || python3 -m pip install torch==2.13.0;')
    main, tests = cmds
    assert "pip install -e " in main
    for step in ("show", "render", "cost", "derive", "generate"):
        assert f"napkin {step} attention" in main, step
    # verify and bench only where a CUDA GPU (and CuPy) is there
    gpu_part = main.split("; then ", 1)[1]
    assert "napkin verify attention" in gpu_part and "napkin bench attention" in gpu_part
    assert tests.endswith('python3 -m pip install -e ".[test]" && python3 -m pytest -q')
    assert "docs/img/attention.svg" in _readme()


def test_ci_runs_the_readme_test_command_verbatim():
    script = (ROOT / ".ci" / "run").read_text()
    assert script.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in script
    _, tests = _quick_start_commands()
    last = [ln for ln in script.splitlines() if ln.strip() and not ln.startswith("#")][-1]
    assert last == tests
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_ci_script_fails_when_the_test_command_fails(tmp_path):
    """The script's structure propagates a failing (or empty, exit 5) pytest run."""
    script = (ROOT / ".ci" / "run").read_text()
    _, tests = _quick_start_commands()
    for status in (1, 5):
        fake = script.replace(tests, f"true && (exit {status})")
        fake = fake.replace('cd "$(dirname "${BASH_SOURCE[0]}")/.."', "cd .")
        p = tmp_path / "run"
        p.write_text(fake)
        r = subprocess.run(["bash", str(p)], cwd=tmp_path, capture_output=True)
        assert r.returncode == status
    fake = script.replace(tests, "false && true").replace('cd "$(dirname "${BASH_SOURCE[0]}")/.."', "cd .")
    p.write_text(fake)
    assert subprocess.run(["bash", str(p)], cwd=tmp_path).returncode != 0


def test_readme_library_table_lists_every_diagram():
    text = _readme()
    for name in library.names():
        assert f"| `{name}` |" in text, name


def test_readme_python_example_runs():
    pytest.importorskip("torch")
    text = _readme()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


# ----------------------------------------------------------------------------- issue #16: user files

#: A user file of n small matmuls in a row: the example's chain (examples/matmul_chain.py), narrow.
CHAIN = f"""\
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
from matmul_chain import chain as _chain

def chain(n):
    return _chain(n, width=32, tokens=64)
"""

GOOD = """\
from napkin.diagrams import Diagram, array, axes, contract
a, b, c = axes("a b c")
mm = Diagram("mm", contract(array("A", a, b), array("B", b, c), over=b, name="C"))
"""


@pytest.mark.parametrize("folder", ["my.python", "a.py.d", "x.py"])
def test_user_file_in_a_folder_whose_name_holds_dot_py(tmp_path, folder):
    """The spec is split at the last ':' and the path must end in .py: a '.py' earlier in the path
    (a folder my.python/ or a.py.d/) is part of the path."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "f.py").write_text(GOOD)
    for spec in (f"{tmp_path / folder / 'f.py'}:mm", str(tmp_path / folder / "f.py")):
        code, out, err = invoke("show", spec, "-s", "a=3")
        assert code == 0, (spec, err)
        assert "diagram mm" in out and "a=3" in out


@pytest.mark.parametrize("tail, fragments", [
    (":1x", ["'1x'", "identifier"]),
    (":a.b", ["'a.b'", "identifier"]),
    (":", ["nothing", "identifier"]),
    (":mm:extra", ["does not end in .py"]),
])
def test_user_file_spec_with_a_bad_name_part(tmp_path, tail, fragments):
    (tmp_path / "f.py").write_text(GOOD)
    assert_user_error(*invoke("show", f"{tmp_path / 'f.py'}{tail}"), *fragments)


def test_a_spec_with_a_colon_but_no_py_file_is_named():
    assert_user_error(*invoke("show", "foo:bar"), "'foo:bar'", "does not end in .py")


def test_user_file_that_is_a_directory(tmp_path):
    (tmp_path / "d.py").mkdir()
    assert_user_error(*invoke("show", str(tmp_path / "d.py")), "is a directory")


EXITING = {
    "import_exit0.py": ("import sys\nsys.exit(0)\n", "import_exit0.py:d", ["failed to import at line 2",
                                                                            "SystemExit: 0"]),
    "import_exit.py": ("import sys\nsys.exit()\n", "import_exit.py:d", ["failed to import at line 2",
                                                                        "SystemExit"]),
    "fn_exit0.py": ("import sys\ndef d():\n    sys.exit(0)\n", "fn_exit0.py:d", ["d() failed: SystemExit: 0",
                                                                              "line 3"]),
    "fn_exit_str.py": ("def d():\n    raise SystemExit('bye')\n", "fn_exit_str.py:d", ["SystemExit: bye"]),
    "fn_base.py": ("class Odd(BaseException):\n    pass\ndef d():\n    raise Odd('x')\n", "fn_base.py:d",
                   ["d() failed: Odd: x", "line 4"]),
    "import_base.py": ("class Odd(BaseException):\n    pass\nraise Odd('y')\n", "import_base.py",
                       ["failed to import at line 3", "Odd: y"]),
    "gen_exit.py": ("raise GeneratorExit\n", "gen_exit.py", ["failed to import at line 1", "GeneratorExit"]),
    "bad_str.py": ("class E(Exception):\n    def __str__(self):\n        raise ValueError\ndef d():\n    raise E()\n",
                   "bad_str.py:d", ["d() failed: E: <unprintable message>"]),
    "type_error.py": ("def d():\n    return 1 + 'a'\n", "type_error.py:d", ["d() failed: TypeError"]),
    "returns_int.py": ("def d():\n    return 3\n", "returns_int.py:d", ["d() returned a int"]),
}


@pytest.mark.parametrize("name", sorted(EXITING))
def test_user_file_that_exits_or_raises_base_exceptions_is_an_error(tmp_path, name):
    """sys.exit(0) (any SystemExit) and the file's own BaseException classes, at import or in the
    diagram function, are errors naming the file, the line and the exception (exit 2), never a
    silent exit 0; a TypeError raised inside the function is reported, not read as 'takes
    arguments'."""
    text, spec, fragments = EXITING[name]
    (tmp_path / name).write_text(text)
    line = assert_user_error(*invoke("show", str(tmp_path / spec)), *fragments)
    assert name in line


def test_user_file_that_exits_as_a_subprocess(tmp_path):
    for name in ("import_exit0.py", "fn_exit0.py"):
        text, spec, fragments = EXITING[name]
        (tmp_path / name).write_text(text)
        assert_user_error(*run_module("show", str(tmp_path / spec)), *fragments)


def test_keyboard_interrupt_in_a_user_file_is_ctrl_c(tmp_path):
    """KeyboardInterrupt is not the file's failure but the user's Ctrl-C: exit 130, no traceback."""
    (tmp_path / "kb.py").write_text("def d():\n    raise KeyboardInterrupt\n")
    code, out, err = run_module("show", f"{tmp_path / 'kb.py'}:d")
    assert code == 130, (code, out, err)
    assert "Traceback" not in out + err


PRINTS = GOOD.replace('mm = ', 'print("hello from import")\nmm = ') + """
def make():
    print("hello from make")
    return mm
"""


@pytest.mark.parametrize("command", ["derive", "cost", "show"])
def test_user_file_prints_go_to_stderr_so_json_stays_json(tmp_path, command):
    (tmp_path / "p.py").write_text(PRINTS)
    args = [command, f"{tmp_path / 'p.py'}:make", "-s", "a=64", "-s", "b=64", "-s", "c=64", "--json"]
    for run in (invoke, run_module):
        code, out, err = run(*args)
        assert code == 0, err
        json.loads(out)
        assert "hello from import" in err and "hello from make" in err


def test_cost_explain_lists_each_kernels_launch_facts():
    """``--explain`` names, beside the profile's estimates, the launch facts each kernel's family
    states (a short batched product on mma.sync tiles: its ring's fill share, its epilogue phase),
    in text and in JSON."""
    args = ["cost", "batched_matmul", "-s", "n=2048", "-s", "a=64", "-s", "b=64", "-s", "c=64", "--gpu", "h200"]
    code, out, err = invoke(*args, "--explain")
    assert code == 0, err
    kernel = re.search(r"kernel\[(\w+)\]\.fill_share = ([\d.]+)", out)
    assert kernel and 0 < float(kernel.group(2)) <= 1, out
    assert f"kernel[{kernel.group(1)}].epilogue_hbm_bytes" in out and "FILL_LOCKED_BLOCKS = 2" in out
    code, out, err = invoke(*args, "--explain", "--json")
    assert code == 0, err
    names = {a["name"] for a in json.loads(out)["assumptions"]}
    assert f"kernel[{kernel.group(1)}].fill_share" in names and "memory_latency_s" in names


def test_user_file_can_define_a_dataclass(tmp_path):
    """The file's module is in sys.modules while it runs (dataclasses look it up there)."""
    (tmp_path / "dc.py").write_text("import dataclasses\n@dataclasses.dataclass\nclass P:\n    n: int = 1\n" + GOOD)
    code, out, err = invoke("show", str(tmp_path / "dc.py"))
    assert code == 0, err


# ----------------------------------------------------------------------------- issue #16: usage errors

USAGE_CASES = [
    (["nosuchcommand"], ["No such command 'nosuchcommand'", "napkin --help"]),
    (["show", "attention", "--bogus"], ["No such option: --bogus", "napkin show --help"]),
    (["show"], ["Missing argument", "napkin show --help"]),
    (["derive", "attention", "--top", "x"], ["'--top'", "napkin derive --help"]),
    (["render", "attention", "-o"], ["requires an argument"]),
    (["cost", "softmax", "--json", "extra"], ["unexpected extra argument", "extra"]),
]


@pytest.mark.parametrize("args, fragments", USAGE_CASES, ids=[" ".join(a) for a, _ in USAGE_CASES])
def test_usage_errors_are_one_error_line(args, fragments):
    """Click's usage errors: one `error:` line (not a boxed panel), exit 2, in-process and as a
    subprocess."""
    assert_user_error(*invoke(*args), *fragments)
    code, out, err = run_module(*args)
    assert_user_error(code, out, err, *fragments)
    assert "╭" not in err and "Usage:" not in err


def test_no_arguments_prints_the_help_and_exits_0():
    code, out, err = run_module()
    assert code == 0, err
    assert "Usage" in out and "derive" in out and not err.strip()
    code, out, err = run_module("derive", "--help")
    assert code == 0 and "--svg" in out and not err.strip()


# ----------------------------------------------------------------------------- issue #16: sizes

HUGE = "1" + "0" * 320


@pytest.mark.parametrize("command", ["show", "cost", "derive", "generate", "render"])
@pytest.mark.parametrize("value, fragments", [
    (HUGE, ["321-digit size", "2^48", str(cli_common.MAX_AXIS_SIZE)]),
    ("1" + "0" * 5000, ["5001-digit size", "2^48"]),
    (str(2 ** 48 + 1), [str(2 ** 48 + 1), "largest axis size 2^48"]),
    ("-" + HUGE, ["positive"]),
], ids=["1e320", "1e5000", "2^48+1", "-1e320"])
def test_axis_sizes_have_a_stated_upper_bound(command, value, fragments):
    args = [command, "attention", "-s", f"q={value}"] + (["-o", "-"] if command in ("generate", "render") else [])
    line = assert_user_error(*invoke(*args), "axis 'q'", *fragments)
    assert len(line) < 400  # a 5000-digit number is not echoed whole


def test_the_largest_axis_size_is_accepted():
    assert parse_size(f"q={2 ** 48}") == ("q", 2 ** 48)
    code, out, err = invoke("show", "attention", "-s", f"q={2 ** 48}")
    assert code == 0, err


def test_the_cli_bound_is_the_diagrams_bound():
    from napkin.diagrams import axes as axes_mod

    bound = getattr(axes_mod, "MAX_AXIS_SIZE", None)
    if bound is None:
        pytest.skip("napkin.diagrams.axes states no bound")
    assert bound == cli_common.MAX_AXIS_SIZE


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("warning: ")]


@pytest.mark.parametrize("command", ["cost", "derive", "generate"])
def test_arrays_beyond_the_gpus_memory_get_one_warning(command):
    """matmul with A[a,b] of 2^21·2^15 bf16 values: 128 GiB of input (129 GiB with B and C), more
    than an H100's 80 GiB."""
    args = [command, "matmul", "-s", f"a={2 ** 21}", "-s", f"b={2 ** 15}", "-s", "c=128"]
    if command == "generate":
        args += ["-o", os.devnull]
    code, out, err = invoke(*args)
    assert code == 0, err
    warnings = [w for w in _warnings(err) if "HBM" in w]
    assert len(warnings) == 1, err
    w = warnings[0]
    assert "'matmul' need 129 GiB at bf16" in w and "80 GiB of HBM" in w and "H100" in w
    assert ("assumes they fit" in w) or ("assume they fit" in w)
    code, out, err = invoke(*args, "--gpu", "h200")
    assert not [w for w in _warnings(err) if "HBM" in w], err  # 141 GB of HBM: fits


def test_arrays_that_fit_get_no_memory_warning():
    code, out, err = invoke("cost", "attention")
    assert code == 0 and not [w for w in _warnings(err) if "HBM" in w], err


def test_check_memory_refuses_for_commands_that_allocate():
    d = library.get("matmul").bind(a=2 ** 21, b=2 ** 15, c=128)
    assert cli_common.array_bytes(d, "bf16") == 2 * (2 ** 36 + 2 ** 22 + 2 ** 28)
    with pytest.raises(cli_common.UsageError, match="need 129 GiB at bf16, more than the 40 GiB of HBM of the "
                                                    "Test GPU; verify would not find room"):
        cli_common.check_memory(d, "bf16", capacity=40 * 2 ** 30, device="Test GPU", refuse=True,
                                consequence="verify would not find room for them")
    cli_common.check_memory(d, "bf16", capacity=200 * 2 ** 30, device="Test GPU", refuse=True, consequence="x")


# ----------------------------------------------------------------------------- issue #16: bounded search

def test_a_diagram_past_the_planners_limit_is_refused_fast(tmp_path):
    import time

    from napkin.codegen.planner import MAX_PLANNED_BOXES

    n = MAX_PLANNED_BOXES + 1
    (tmp_path / "chain.py").write_text(CHAIN + f"\ndef big():\n    return chain({n})\n")
    for command in ("derive", "cost", "generate"):
        start = time.perf_counter()
        args = [command, f"{tmp_path / 'chain.py'}:big"] + (["-o", "-"] if command == "generate" else [])
        line = assert_user_error(*invoke(*args), f"has {n} boxes", f"the {MAX_PLANNED_BOXES} derive plans",
                                 "split it")
        assert time.perf_counter() - start < 10, (command, line)


def test_the_planners_limit_applies_to_the_python_api():
    from napkin.codegen.planner import MAX_PLANNED_BOXES, SearchLimitError, derive

    ns: dict = {}
    exec(CHAIN, ns)
    with pytest.raises(SearchLimitError, match=f"{MAX_PLANNED_BOXES} derive plans"):
        derive(ns["chain"](MAX_PLANNED_BOXES + 1), "h100", "bf16")
    assert issubclass(SearchLimitError, NapkinError)


@pytest.mark.slow
def test_a_chain_of_200_still_derives(tmp_path):
    (tmp_path / "chain.py").write_text(CHAIN + "\ndef c200():\n    return chain(200)\n")
    code, out, err = invoke("derive", f"{tmp_path / 'chain.py'}:c200", "--json")
    assert code == 0, err
    assert len(json.loads(out)["plan"]["kernels"]) == 200
