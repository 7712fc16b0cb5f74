"""Helpers several test files share: the CLI run in-process, child Pythons for hostile inputs,
which of a family's candidate schedules a GPU test runs, and diagrams several tests plan.

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



def skip_unless_hopper(what: str) -> None:
    """Skips the calling test unless a CUDA GPU of compute capability 9.x is here: wgmma, TMA
    multicast and thread-block clusters of napkin's templates are sm_90a's (``what`` names the
    template or path the test runs). torch is imported only when this is called."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(f"{what} needs an sm_90 GPU")

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


def sanitize_module():
    """``benchmarks/sanitize.py`` as a module: its ``CASES`` hold one planned kernel of every
    template at edge shapes (each naming the template it is there for)."""
    import importlib.util

    name = "napkin_sanitize"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "sanitize.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def nvrtc_library():
    """NVRTC from the ``nvidia-cuda-nvrtc`` wheel (a test dependency) through ctypes, or None where
    it is not installed. It is the compiler napkin's kernels meet at run time (through CuPy), whose
    JIT mode refuses what nvcc takes, such as a function with no ``__device__`` annotation."""
    import ctypes
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations if spec is not None else None) or ():
        for lib in sorted(Path(root).glob("cu*/lib/libnvrtc.so.*")):
            if ".alt." in lib.name:
                continue
            try:
                # NVRTC opens its builtins library by name at the first compile: loaded first,
                # globally, it is found without LD_LIBRARY_PATH
                for builtins in lib.parent.glob("libnvrtc-builtins.so.*"):
                    if ".alt." not in builtins.name:
                        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
                return ctypes.CDLL(str(lib))
            except OSError:
                continue
    return None


def nvrtc_errors(lib, source: str, filename: str, options: list[str]) -> str | None:
    """Compile ``source`` with NVRTC ``lib`` (:func:`nvrtc_library`): None when it compiles, else the
    compiler's log."""
    import ctypes

    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None)
    if rc != 0:
        return f"nvrtcCreateProgram failed with code {rc}"
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        if rc == 0:
            return None
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return log.value.decode(errors="replace") or f"nvrtcCompileProgram failed with code {rc}"
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def contraction_prediction(bd, cfg, gpu: str):
    """The contraction family's launch for configuration ``cfg`` of the bound diagram ``bd``, and the
    model's KernelPrediction of that kernel on profile ``gpu``: ``(LaunchShape, KernelPrediction)``."""
    from napkin.codegen.families.contraction import FAMILY
    from napkin.codegen.select import launch_shape
    from napkin.perfmodel.predict import predict_schedule

    s = FAMILY.schedule(bd, cfg, gpu=gpu).padded_view()
    shape = launch_shape(bd, FAMILY, s, gpu)
    return shape, predict_schedule(s, gpu, launch=shape, family="contraction").kernels[0]


def masked_softmax():
    """softmax over x of the scores S[h,q,x]·0.125 under a causal mask: a row-wise kernel whose
    prologue reads the column index (several test files' row-wise case)."""
    from napkin.diagrams import Axis, Diagram, array, causal, scale, softmax

    h, q, x = Axis("h"), Axis("q"), Axis("x")
    return Diagram("masked_softmax", softmax(causal(scale(array("S", h, q, x), 0.125), "q", "x"), over="x",
                                             name="P"))


def einsum_cases() -> dict:
    """Contractions of one operand, or of three or more: einsum forms no family takes whole, which
    :func:`napkin.diagrams.expand.expand` writes out (the value of each, unnamed)."""
    from napkin.diagrams import array, axes, contract

    i, j, k, n, z = axes("i j k n z")
    A, B, g, s = array("A", i, k), array("B", n, k), array("g", k), array("s", i)
    u, M, v = array("u", i), array("M", i, j), array("v", j)
    P, Q, R = array("P", z, i, k), array("Q", z, k, n), array("R", z, n, j)
    return {
        "three": contract(A, g, B, over=k, out=(i, n)),          # a row scale in the middle
        "three_t": contract(A, s, B, over=k, out=(n, i)),        # and the result transposed
        "one": contract(M, over=j, out=(i,)),                    # einsum "ij->i"
        "one_perm": contract(P, over=k, out=(i, z)),             # the kept axes in another order
        "quad": contract(u, M, v, over=(i, j), out=()),          # u·M·v to a scalar
        "chain": contract(P, Q, R, over=(k, n), out=(z, i, j)),  # (P·Q)·R, batched
        "private": contract(A, array("W", n, j), array("C", i, n), over=(k, j), out=(i, n)),
    }
