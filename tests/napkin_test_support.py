"""Helpers several test files share: the CLI run in-process, child Pythons for hostile inputs, and
which of a family's candidate schedules a GPU test runs.

``tests/`` is on ``sys.path`` while the tests run (``tests/conftest.py`` puts it there), so a test
file imports this module as ``from napkin_test_support import ...``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]

try:  # click < 8.2 mixes stderr into stdout unless told not to
    CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    RUNNER_KWARGS: dict = {"mix_stderr": False}
except TypeError:
    RUNNER_KWARGS = {}


def cli_invoke(*args: str) -> tuple[int, str, str]:
    """``napkin ARGS`` in this process: (exit status, stdout, stderr)."""
    from napkin.cli import app

    r = CliRunner(**RUNNER_KWARGS).invoke(app, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


#: Prepended to every child script: no more than 2 GiB of address space, so a read without bound
#: ends in MemoryError, not in a machine out of memory.
CHILD_LIMITS = """
import resource
try:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
except (ValueError, OSError):
    pass
"""


def child_env() -> dict:
    """The environment of a child Python that imports napkin from this checkout."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_child(script: str, *args: str, timeout: float, what: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh, memory-limited Python; a hang past ``timeout`` seconds fails the
    test, naming ``what`` hung."""
    try:
        return subprocess.run([sys.executable, "-c", CHILD_LIMITS + textwrap.dedent(script), *args],
                              env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} hung for more than {timeout} s")


def run_roles(worker: str, roles: list[str], *args: str, seconds: float, timeout: float, what: str) -> list[dict]:
    """Start one memory-limited child per role, all at once, as ``worker ROLE ARGS... N SECONDS``
    (N its index, SECONDS how long it works), wait for them, and return the JSON each printed last.
    A hang fails the test naming ``what``; a child that fails fails it with its stderr."""
    procs = [subprocess.Popen([sys.executable, "-c", CHILD_LIMITS + worker, role, *args, str(n), str(seconds)],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n, role in enumerate(roles)]
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a process hung on {what} (a FIFO or /dev/zero followed?)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    counts = []
    for role, p, (out, err) in zip(roles, procs, results):
        assert p.returncode == 0, f"{role} failed:\n{err[-3000:]}"
        counts.append(json.loads(out.strip().splitlines()[-1]))
    return counts


def spread_and_split_picks(cands) -> list[int]:
    """Indices of the candidate schedules a GPU test runs: the first, middle and last, and the first
    and last that split their reduction (``options.splits`` > 1)."""
    split = [i for i, sc in enumerate(cands) if (getattr(sc.kernels[0].options, "splits", 1) or 1) > 1]
    return sorted({0, len(cands) // 2, len(cands) - 1, *split[:1], *split[-1:]})
