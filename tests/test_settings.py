"""napkin's settings: NAPKIN_DEVICE, NAPKIN_SYNC_LAUNCH, NAPKIN_LOG_LEVEL and the command line's
--verbose, --log-level and --device (napkin.settings, the root options of napkin.cli)."""

from __future__ import annotations

import logging

import pytest
from napkin_test_support import cli_invoke

from napkin import settings
from napkin.errors import HardwareError, NapkinError


@pytest.fixture(autouse=True)
def _restore_logger():
    logger = logging.getLogger("napkin")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_device_values(monkeypatch):
    assert settings.parse_device("3") == 3 and settings.parse_device(" cuda:2 ") == 2
    assert settings.parse_device(None) is None and settings.parse_device("  ") is None
    with pytest.raises(HardwareError, match=r"NAPKIN_DEVICE='gpu1' is not a CUDA device"):
        settings.parse_device("gpu1")
    monkeypatch.delenv("NAPKIN_DEVICE", raising=False)
    assert settings.cuda_device() is None and settings.use_cuda_device() is None
    monkeypatch.setenv("NAPKIN_DEVICE", "cuda:1")
    assert settings.cuda_device() == 1


def test_a_device_this_machine_lacks_is_refused(monkeypatch):
    import torch

    count = torch.cuda.device_count()
    monkeypatch.setenv("NAPKIN_DEVICE", str(count + 3))
    with pytest.raises(HardwareError, match=f"NAPKIN_DEVICE={count + 3}, but this machine has"):
        settings.use_cuda_device()


def test_sync_launches(monkeypatch):
    for value, want in (("1", True), ("yes", True), ("0", False), ("false", False), ("", False)):
        monkeypatch.setenv("NAPKIN_SYNC_LAUNCH", value)
        assert settings.sync_launches() is want, value
    monkeypatch.delenv("NAPKIN_SYNC_LAUNCH")
    assert settings.sync_launches() is False


def test_log_levels(monkeypatch):
    monkeypatch.delenv("NAPKIN_LOG_LEVEL", raising=False)
    assert settings.configure_logging() == logging.WARNING
    assert settings.configure_logging(verbose=1) == logging.INFO
    assert settings.configure_logging(verbose=2) == logging.DEBUG
    assert settings.configure_logging(verbose=2, level="error") == logging.ERROR
    monkeypatch.setenv("NAPKIN_LOG_LEVEL", "Debug")
    assert settings.configure_logging() == logging.DEBUG
    assert logging.getLogger("napkin").level == logging.DEBUG
    # one handler of its own, however often it is called
    assert sum(getattr(h, "_napkin_cli", False) for h in logging.getLogger("napkin").handlers) == 1
    monkeypatch.setenv("NAPKIN_LOG_LEVEL", "chatty")
    with pytest.raises(NapkinError, match="NAPKIN_LOG_LEVEL='chatty' is not one of debug, info, warning, error"):
        settings.configure_logging()


def test_the_handler_writes_log_lines_to_stderr(capsys, monkeypatch):
    monkeypatch.delenv("NAPKIN_LOG_LEVEL", raising=False)
    settings.configure_logging(verbose=1)
    logging.getLogger("napkin.codegen.api").info("compiled %s", "x")
    logging.getLogger("napkin.codegen.api").debug("not shown")
    err = capsys.readouterr().err
    assert "napkin INFO napkin.codegen.api: compiled x" in err and "not shown" not in err


def test_cli_verbosity_and_device_options(monkeypatch):
    monkeypatch.delenv("NAPKIN_LOG_LEVEL", raising=False)
    monkeypatch.delenv("NAPKIN_DEVICE", raising=False)
    code, out, _ = cli_invoke("-vv", "list", "--json")
    assert code == 0 and logging.getLogger("napkin").level == logging.DEBUG and out.lstrip().startswith("[")
    code, _, _ = cli_invoke("--log-level", "error", "list", "--json")
    assert code == 0 and logging.getLogger("napkin").level == logging.ERROR
    code, _, err = cli_invoke("--log-level", "loud", "list")
    assert code == 2 and "error: log level 'loud' is not one of debug, info, warning, error" in err
    code, _, err = cli_invoke("--device", "cuda:x", "list")
    assert code == 2 and "error: --device 'cuda:x' is not a CUDA device" in err
    code, _, _ = cli_invoke("--device", "cuda:1", "list", "--json")
    import os

    assert code == 0 and os.environ.get("NAPKIN_DEVICE") == "cuda:1"


def test_gpu_commands_use_the_device_named(monkeypatch):
    """verify asks for the GPU before anything else; NAPKIN_DEVICE past this machine's devices is
    one error line (on a machine without CUDA, the missing GPU is)."""
    import torch

    monkeypatch.setenv("NAPKIN_DEVICE", "97")
    code, _, err = cli_invoke("verify", "softmax", "-s", "r=4", "-s", "x=64")
    assert code == 2
    if torch.cuda.is_available():
        assert "NAPKIN_DEVICE=97, but this machine has" in err
    else:
        assert "needs a CUDA GPU" in err
