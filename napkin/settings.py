"""napkin's settings: where kernels are cached, synchronous launches, verbosity, the CUDA device.

Each is an environment variable, read when it is needed (never at import), so a process sets it
before the work it should change:

======================== ==================================================================
``NAPKIN_CACHE_DIR``     directory of the compiled-kernel cache, which also keeps derived plans
                         (default ``~/.cache/napkin/kernels``)
``NAPKIN_SYNC_LAUNCH``   ``1``: wait for every kernel after its launch, so a fault is reported
                         at the launch that caused it (debugging; slow). Read at each launch of
                         :meth:`napkin.kernels.CompiledKernel.__call__`, and when a compiled
                         diagram prepares its launches (its first call on a device)
``NAPKIN_LOG_LEVEL``     the command line's log level when neither ``--verbose`` nor
                         ``--log-level`` is given: ``debug``, ``info``, ``warning`` (default),
                         ``error``
``NAPKIN_DEVICE``        the CUDA device (an index, or ``cuda:N``) the commands ``verify``,
                         ``bench`` and ``calibrate`` run on, and that :func:`napkin.codegen.compile`
                         compiles for when no tensor says otherwise; a tensor's own device always
                         wins when a compiled diagram or op is called
======================== ==================================================================

napkin logs under the ``napkin`` logger (``napkin.kernels.cache``, ``napkin.codegen``,
``napkin.torch``); a program that uses napkin as a library configures Python's :mod:`logging` as
usual (``logging.getLogger("napkin").setLevel(logging.INFO)``), the command line through
:func:`configure_logging`.

>>> parse_device("cuda:1"), parse_device("0"), parse_device("")
(1, 0, None)
>>> parse_level("INFO"), parse_level("debug")
(20, 10)
"""

from __future__ import annotations

import logging
import os
import re
import sys

from .errors import HardwareError, NapkinError

__all__ = ["CACHE_DIR_ENV", "SYNC_ENV", "LOG_LEVEL_ENV", "DEVICE_ENV", "LEVELS", "sync_launches",
           "parse_device", "cuda_device", "use_cuda_device", "parse_level", "configure_logging"]

CACHE_DIR_ENV = "NAPKIN_CACHE_DIR"
SYNC_ENV = "NAPKIN_SYNC_LAUNCH"
LOG_LEVEL_ENV = "NAPKIN_LOG_LEVEL"
DEVICE_ENV = "NAPKIN_DEVICE"

#: The level names ``--log-level`` and ``NAPKIN_LOG_LEVEL`` take.
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

_FALSE = ("", "0", "false", "False", "no", "off")


class SettingsError(NapkinError):
    """A setting (an environment variable, ``--log-level``) holds a value napkin cannot use."""


def sync_launches() -> bool:
    """Whether ``NAPKIN_SYNC_LAUNCH`` asks for synchronous launches (anything but empty, 0, false,
    no, off)."""
    return os.environ.get(SYNC_ENV, "") not in _FALSE


def parse_device(text: str | None, what: str = DEVICE_ENV + "=") -> int | None:
    """A CUDA device index from ``N`` or ``cuda:N`` (None for an empty value); a HardwareError
    naming the value (``what``: where it came from) otherwise."""
    if text is None or not text.strip():
        return None
    m = re.fullmatch(r"\s*(?:cuda:)?(\d{1,4})\s*", text)
    if not m:
        raise HardwareError(f"{what}{text!r} is not a CUDA device; give an index (0) or cuda:N")
    return int(m.group(1))


def cuda_device() -> int | None:
    """The device ``NAPKIN_DEVICE`` names, or None when it is unset."""
    return parse_device(os.environ.get(DEVICE_ENV))


def use_cuda_device() -> int | None:
    """Make ``NAPKIN_DEVICE`` torch's current CUDA device (a HardwareError when this machine has
    no such device); returns it, or None when the variable is unset."""
    index = cuda_device()
    if index is None:
        return None
    import torch

    count = torch.cuda.device_count()
    if index >= count:
        raise HardwareError(f"{DEVICE_ENV}={index}, but this machine has {count} CUDA device"
                            f"{'s' if count != 1 else ''} (0 to {count - 1})" if count else
                            f"{DEVICE_ENV}={index}, but this machine has no CUDA device")
    torch.cuda.set_device(index)
    return index


def parse_level(text: str) -> int:
    """A logging level from its name (any case); a SettingsError naming the choices otherwise."""
    level = LEVELS.get(str(text).strip().lower())
    if level is None:
        raise SettingsError(f"log level {text!r} is not one of {', '.join(LEVELS)}")
    return level


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test runner swaps it)."""

    _napkin_cli = True  # marks the handler configure_logging owns

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(verbose: int = 0, level: str | None = None) -> int:
    """Send the ``napkin`` logger's records to stderr, one line each (``napkin INFO name: text``),
    at ``level`` when given, else INFO for one ``-v``, DEBUG for two or more, else
    ``NAPKIN_LOG_LEVEL``, else WARNING. Calling it again replaces its handler. Returns the level."""
    if level is not None:
        chosen = parse_level(level)
    elif verbose:
        chosen = logging.INFO if verbose == 1 else logging.DEBUG
    else:
        env = os.environ.get(LOG_LEVEL_ENV, "")
        try:
            chosen = parse_level(env) if env.strip() else logging.WARNING
        except SettingsError:
            raise SettingsError(f"{LOG_LEVEL_ENV}={env!r} is not one of {', '.join(LEVELS)}") from None
    logger = logging.getLogger("napkin")
    for h in list(logger.handlers):
        if getattr(h, "_napkin_cli", False):
            logger.removeHandler(h)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("napkin %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(chosen)
    return chosen
