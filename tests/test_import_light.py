"""`import napkin`, `napkin --help` and `napkin list` stay light: no torch, no cupy.

Each check runs in a fresh interpreter (this one has long since imported torch) straight
from the checkout, and looks at ``sys.modules`` after the import or the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str, cwd: Path = ROOT) -> dict:
    """Run ``code`` in a new interpreter; it prints a JSON report on its last line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


REPORT = """
import json, sys
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy"))
print(json.dumps({"heavy": heavy, "code": code}))
"""


def _cli(args: list[str], cwd: Path = ROOT) -> dict:
    return _fresh(f"""
import sys
from napkin.cli import main
code = 0
try:
    main({args!r})
except SystemExit as e:
    code = e.code or 0
""" + REPORT, cwd)


@pytest.mark.parametrize("module", ["napkin", "napkin.diagrams", "napkin.cli", "napkin.cli_common",
                                    "napkin.errors", "napkin.dtypes"])
def test_import_does_not_load_torch_or_cupy(module):
    r = _fresh(f"import {module}\ncode = 0\n" + REPORT)
    assert r["heavy"] == [], f"import {module} loaded {r['heavy']}"


@pytest.mark.parametrize("args", [["--help"], ["list"], ["list", "--json"], ["show", "--help"],
                                  ["render", "--help"], ["show", "attention", "-s", "q=4096"], ["show", "nope"]],
                         ids=lambda a: " ".join(a))
def test_cli_commands_do_not_load_torch(args):
    r = _cli(args)
    assert r["heavy"] == [], f"napkin {' '.join(args)} loaded {r['heavy']}"
    assert r["code"] in (0, 2)


def test_render_does_not_load_torch(tmp_path):
    if not (ROOT / "napkin" / "diagrams" / "render.py").exists():
        pytest.skip("the SVG renderer is not in this checkout yet")
    r = _cli(["render", "attention", "-o", str(tmp_path / "a.svg")], cwd=tmp_path)
    assert r["code"] == 0 and r["heavy"] == []
    assert (tmp_path / "a.svg").exists()


def test_python_dash_m_napkin_help_from_checkout(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-m", "napkin", "--help"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Usage" in p.stdout and "napkin" in p.stdout and "list" in p.stdout


def test_reference_imports_torch_only_when_run():
    r = _fresh("""
from napkin.diagrams import library
d = library.get("softmax").bind(r=2, x=3)
import sys
before = "torch" in sys.modules
d.reference(seed=0)
code = 0 if (not before and "torch" in sys.modules) else 1
""" + REPORT)
    assert r["code"] == 0
