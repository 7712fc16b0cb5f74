"""The notebooks run top to bottom on a CPU, match notebooks/build.py and are committed with outputs.

Each notebook is executed in a fresh python3 kernel with nbclient; any cell that raises (an
``assert`` on a paper value included) fails the test with the cell and its traceback.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def _build_module():
    spec = importlib.util.spec_from_file_location("napkin_notebooks_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _build_module()
NAMES = list(build.NOTEBOOKS)


def test_every_notebook_is_listed_in_the_readme():
    readme = (NB_DIR / "README.md").read_text("utf-8")
    for name in NAMES:
        assert f"({name}.ipynb)" in readme, f"notebooks/README.md does not list {name}"
    assert sorted(p.stem for p in NB_DIR.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_matches_build_and_has_outputs(name):
    path = NB_DIR / f"{name}.ipynb"
    assert path.exists(), f"{path.name} is missing: run python3 notebooks/build.py --execute"
    committed = nbformat.read(path, as_version=4)
    assert build.sources(committed) == build.sources(build.build(name)), (
        f"{path.name} differs from notebooks/build.py: run python3 notebooks/build.py --execute {name[:2]}")
    code_cells = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code_cells), f"{path.name} was committed without running it"
    errors = [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was committed with an error output: {errors[0].get('ename')}"
    kinds = {k for c in code_cells for o in c.outputs for k in o.get("data", {})}
    if name != "05_generate_and_benchmark":
        assert "image/svg+xml" in kinds or "image/png" in kinds, f"{path.name} shows no diagram or plot"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name):
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    try:
        build.execute(nb, timeout=600)
    except CellExecutionError as e:
        pytest.fail(f"{name}.ipynb failed:\n" + re.sub(r"\x1b\[[0-9;]*m", "", str(e))[-4000:], pytrace=False)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
