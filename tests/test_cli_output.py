"""Where napkin's output goes, and what happens when it cannot go there (issue #16).

* stdout that fails (``> /dev/full``: ENOSPC; ``>&-``: closed) ends in one ``error:`` line on
  stderr and exit status 2, never a traceback and never exit 0 having written nothing; a reader
  that goes away (``| head``) ends quietly with 141, as SIGPIPE would;
* every output option (``render -o``, ``generate -o``, ``derive --svg``, ``calibrate -o``,
  ``bench --sweep --out``) is checked before any work, through one helper
  (:func:`napkin.cli_common.output_path`): a folder, a missing parent folder, an unwritable place
  are one ``error:`` line, ``-`` is stdout where a command can write there;
* ``render`` writes svg or dot and refuses other formats (``-o x.png`` used to get SVG text);
* ``calibrate`` checks its ``-o`` before measuring and writes strict JSON (no ``Infinity``).

Streams are tested as subprocesses (``python3 -m napkin``), the options in-process too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from napkin_test_support import cli_invoke

from napkin import cli_common
from napkin.cli_common import UsageError, output_dir, output_path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FORCE_COLOR", None)
    return env


invoke = cli_invoke


def shell(command: str, cwd: Path = ROOT, timeout: float = 120) -> tuple[int, str]:
    """Run ``command`` in bash with ``napkin`` meaning ``python3 -m napkin``; (status, stderr)."""
    napkin = f"{sys.executable} -m napkin"
    p = subprocess.run(["bash", "-c", command.replace("napkin ", napkin + " ")], cwd=cwd, env=_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stderr


def assert_one_error(code: int, err: str, *fragments: str) -> str:
    assert code == 2, (code, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- stdout that fails

STREAM_COMMANDS = [
    "napkin show attention",
    "napkin show attention --json",
    "napkin list",
    "napkin cost softmax -s r=64 -s x=64",
    "napkin derive softmax -s r=64 -s x=64 --json",
    "napkin generate softmax -s r=64 -s x=64 -o -",
    "napkin render softmax -o -",
    "napkin --help",
]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", STREAM_COMMANDS)
def test_stdout_on_a_full_device_is_one_error_line(command):
    code, err = shell(f"{command} > /dev/full")
    assert_one_error(code, err, "cannot write the output", "No space left on device")


@pytest.mark.parametrize("command", STREAM_COMMANDS)
def test_closed_stdout_is_one_error_line(command):
    code, err = shell(f"{command} >&-")
    assert_one_error(code, err, "standard output is closed")


@pytest.mark.skipif(os.name != "posix", reason="closes fd 1 in the child before exec")
def test_closed_stdout_without_a_shell():
    """The same without a shell: the child starts with fd 1 closed (Python sets sys.stdout to None)."""
    p = subprocess.run([sys.executable, "-m", "napkin", "show", "attention"], cwd=ROOT, env=_env(),
                       preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True, timeout=120)
    assert_one_error(p.returncode, p.stderr, "standard output is closed")


def test_a_closed_pipe_ends_quietly_with_141():
    """The reader of the pipe is gone before napkin writes (``| true``): no traceback, no
    'Exception ignored', status 141 (128 + SIGPIPE), as `yes | true` reports under pipefail."""
    for command in ("napkin list", "napkin show attention --json", "napkin generate transformer_block -o -"):
        p = subprocess.run(["bash", "-c", "set -o pipefail; " + command.replace("napkin ", f"{sys.executable} -m "
                            "napkin ") + " 2>/tmp/napkin_pipe_err_$$ | true; s=$?; cat /tmp/napkin_pipe_err_$$ >&2; "
                            "rm -f /tmp/napkin_pipe_err_$$; exit $s"],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 141), (command, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
        if command.endswith("-o -"):  # ~100 KiB: more than a pipe holds, so the write must fail
            assert p.returncode == 141, (command, p.stderr)


def test_stdout_failure_in_process_is_one_error_line(monkeypatch):
    """A stdout whose writes fail, in-process: the same one line (the check is in the command
    group, whichever way it is started)."""

    class Full:
        encoding = "utf-8"

        def write(self, s):
            raise OSError(28, "No space left on device")

        def flush(self):
            raise OSError(28, "No space left on device")

        def isatty(self):
            return False

        def fileno(self):
            raise OSError("no fd")

    import io

    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", Full())
    monkeypatch.setattr(sys, "stderr", err)
    from napkin.cli import main

    with pytest.raises(SystemExit) as e:
        main(["show", "attention", "--json"])
    assert e.value.code == 2
    assert_one_error(2, err.getvalue(), "cannot write the output", "No space left on device")


# ----------------------------------------------------------------------------- output options

def test_output_path_helper(tmp_path):
    assert output_path("render", "-o", "-") is None
    assert output_path("render", "-o", None, Path("a.svg")) == Path("a.svg")
    assert output_path("render", "-o", tmp_path / "x.svg") == tmp_path / "x.svg"
    assert output_path("render", "-o", tmp_path / "noext") == tmp_path / "noext"
    (tmp_path / "f").write_text("")
    (tmp_path / "dangling.svg").symlink_to(tmp_path / "no" / "x.svg")  # a link into a missing folder
    (tmp_path / "link.svg").symlink_to(tmp_path / "later.svg")  # a link to a file not written yet: fine
    assert output_path("render", "-o", tmp_path / "link.svg") == tmp_path / "link.svg"
    bad = [
        (("render", "-o", tmp_path / "dangling.svg"), {}, "it links to .*, in a folder that does not exist"),
        (("render", "-o", tmp_path), {}, "cannot write a folder"),
        (("render", "-o", str(tmp_path) + "/"), {}, "cannot write a folder"),
        (("render", "-o", tmp_path / "no" / "x.svg"), {}, "does not exist"),
        (("render", "-o", tmp_path / "f" / "x.svg"), {}, "is not a folder"),
        (("render", "-o", tmp_path / "x.png"), {"suffixes": (".svg",)}, "not .png"),
        (("derive", "--svg", "-"), {"stdout": False}, "cannot write that to stdout"),
        (("render", "-o", ""), {}, "not a file name"),
        (("render", "-o", "a\0b"), {}, "not a file name"),
        (("render", "-o", tmp_path / ("n" * 300)), {}, "cannot write"),
    ]
    for args, kw, fragment in bad:
        with pytest.raises(UsageError, match=fragment):
            output_path(*args, **kw)


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_output_path_unwritable_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(UsageError, match="not writable"):
            output_path("render", "-o", ro / "x.svg")
    finally:
        ro.chmod(0o700)


def test_output_dir_helper(tmp_path):
    assert output_dir("bench", "--out", tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        output_dir("bench", "--out", tmp_path / "f")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        output_dir("bench", "--out", tmp_path / "f" / "sub")


OPTION_CASES = [
    (["render", "attention", "-o", "{dir}"], ["render -o", "cannot write a folder", "attention.svg"]),
    (["render", "attention", "-o", "{dir}/no/x.svg"], ["render -o", "does not exist"]),
    (["generate", "softmax", "-o", "{dir}"], ["generate -o", "cannot write a folder", "softmax.cu"]),
    (["generate", "softmax", "-o", "{dir}/no/x.cu"], ["generate -o", "does not exist"]),
    (["derive", "softmax", "--svg", "{dir}"], ["derive --svg", "cannot write a folder"]),
    (["derive", "softmax", "--svg", "-"], ["derive --svg -", "stdout"]),
    (["derive", "softmax", "--svg", "{dir}/x.png"], ["derive --svg", ".svg", "not .png"]),
    (["calibrate", "-o", "{dir}"], ["calibrate -o", "cannot write a folder", "calibrated.json"]),
    (["calibrate", "-o", "{dir}/no/x.json"], ["calibrate -o", "does not exist"]),
    (["bench", "softmax", "--sweep", "--out", "{dir}/file"], ["bench --out", "is a file, not a folder"]),
]


@pytest.mark.parametrize("args, fragments", OPTION_CASES, ids=[" ".join(a) for a, _ in OPTION_CASES])
def test_output_options_are_checked_before_any_work(tmp_path, args, fragments):
    """The same checks for every output option, before planning, before the GPU check (so on a
    machine without a GPU, calibrate and bench report the path, not the missing GPU)."""
    (tmp_path / "file").write_text("")
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    code, out, err = invoke(*args)
    assert_one_error(code, err, *fragments)
    assert "needs a CUDA GPU" not in err


def test_generate_and_render_write_to_stdout_with_dash():
    code, out, err = invoke("generate", "softmax", "-s", "r=8", "-s", "x=64", "-o", "-")
    assert code == 0, err
    assert "__global__" in out
    assert not Path("-").exists()


def test_derive_svg_writes_the_file(tmp_path):
    code, out, err = invoke("derive", "softmax", "-s", "r=8", "-s", "x=64", "--svg", str(tmp_path / "p.svg"))
    assert code == 0, err
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<")


# ----------------------------------------------------------------------------- render formats

@pytest.mark.parametrize("args, fragments", [
    (["-o", "x.png"], ["x.png", "napkin draws svg or dot", "not png", ".svg or .dot"]),
    (["-o", "x.PDF"], ["not pdf"]),
    (["--format", "png", "-o", "x.png"], ["unknown format 'png'", "svg or dot"]),
    (["--format", "png"], ["unknown format 'png'"]),
    (["--format", "dot", "-o", "x.svg"], ["the suffix .svg says svg"]),
    (["--format", "svg", "-o", "x.dot"], ["the suffix .dot says dot"]),
])
def test_render_refuses_formats_it_does_not_draw(tmp_path, monkeypatch, args, fragments):
    """`render -o x.png` used to write SVG text into x.png and report success."""
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke("render", "attention", *args)
    assert_one_error(code, err, *fragments)
    assert not list(tmp_path.iterdir()), "nothing is written"


@pytest.mark.parametrize("args, fmt, name", [
    (["-o", "a.svg"], "svg", "a.svg"),
    (["-o", "a.SVG"], "svg", "a.SVG"),
    (["-o", "a.dot"], "dot", "a.dot"),
    (["-o", "a.gv"], "dot", "a.gv"),
    (["--format", "dot"], "dot", "attention.dot"),
    (["--format", "SVG", "-o", "a.svg"], "svg", "a.svg"),
    (["-o", "noext"], "svg", "noext"),
])
def test_render_format_from_option_or_suffix(tmp_path, monkeypatch, args, fmt, name):
    pytest.importorskip("graphviz") if fmt == "dot" else None
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke("render", "attention", *args)
    assert code == 0, err
    text = (tmp_path / name).read_text()
    assert text.lstrip().startswith("digraph" if fmt == "dot" else "<")


# ----------------------------------------------------------------------------- calibrate

def test_calibrate_checks_its_output_before_the_gpu_as_a_subprocess(tmp_path):
    """Without a GPU the path error comes first (it would otherwise come after minutes of
    measuring); a good path gets the GPU error. Never a traceback, never a file named '-'."""
    code, err = shell(f"napkin calibrate -o {tmp_path}", cwd=tmp_path)
    assert_one_error(code, err, "calibrate -o", "cannot write a folder")
    code, err = shell("napkin calibrate -o -", cwd=tmp_path)
    assert code in (0, 2) and "Traceback" not in err
    assert not (tmp_path / "-").exists()
    if code == 2:
        assert_one_error(code, err, "calibrate")


def test_calibrate_api_checks_its_output_before_measuring(tmp_path, monkeypatch):
    from napkin.errors import HardwareError
    from napkin.perfmodel import calibrate as C

    def no_gpu():
        raise AssertionError("measured before the output was checked")

    monkeypatch.setattr(C, "_require_cuda", no_gpu)
    with pytest.raises(HardwareError, match="is a folder"):
        C.calibrate(None, tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(HardwareError, match="is a file, not a folder"):
        C.calibrate(None, tmp_path / "f" / "x.json")


def test_check_output_of_calibrate(tmp_path):
    from napkin.perfmodel.calibrate import check_output

    assert check_output("-") is None
    assert check_output(tmp_path / "new" / "p.json") == tmp_path / "new" / "p.json"  # parents are created


def test_profile_json_is_strict_and_refuses_non_finite_numbers():
    from napkin.errors import HardwareError
    from napkin.perfmodel.calibrate import calibrated_profile, profile_json

    g = calibrated_profile("h100", {"copy_bandwidth": 3.0e12, "gemm_bf16": 7.0e14}, date="2025-01-01")
    text = profile_json(g)
    assert json.loads(text)["measured"]["copy_bandwidth"] == 3.0e12
    assert "Infinity" not in text and "NaN" not in text

    class Stub:  # a profile object whose numbers went wrong
        def to_dict(self):
            return {"levels": [{"name": "HBM", "bandwidth": float("inf")}], "measured": {"sfu_rate": float("nan")}}

    with pytest.raises(HardwareError, match=r"non-finite numbers \(levels\[0\]\.bandwidth = inf, "
                                            r"measured\.sfu_rate = nan\)"):
        profile_json(Stub())  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0])
def test_calibrated_profile_refuses_non_finite_measurements(value):
    from napkin.errors import HardwareError
    from napkin.perfmodel.calibrate import calibrated_profile

    with pytest.raises(HardwareError, match="finite positive number"):
        calibrated_profile("h100", {"gemm_bf16": value})


def test_write_profile_to_a_file_and_to_stdout(tmp_path, capsys):
    from napkin.perfmodel.calibrate import calibrated_profile, write_profile
    from napkin.perfmodel.hardware import GPU

    g = calibrated_profile("h200", {"copy_bandwidth": 4.2e12}, date="2025-01-01")
    out = write_profile(g, tmp_path / "sub" / "h200.json")
    assert out == tmp_path / "sub" / "h200.json"
    assert GPU.from_json(out.read_text()).hbm_bandwidth == 4.2e12
    assert write_profile(g, "-") is None
    assert json.loads(capsys.readouterr().out)["source"] == "calibrated: 2025-01-01"
    assert not Path("-").exists()


def test_print_json_is_strict():
    code = cli_common._finite({"a": [1.0, float("inf")], "b": float("nan"), "c": "x"})
    assert code == {"a": [1.0, None], "b": None, "c": "x"}
