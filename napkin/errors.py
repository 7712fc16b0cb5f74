"""The one exception family napkin raises for anything a user can get wrong.

Every error a user can cause (a bad diagram, an illegal schedule, an unknown GPU,
a tensor of the wrong shape) is a :class:`NapkinError`. Its message names what is
wrong and where; the CLI prints it without a traceback and exits with status 2.

>>> try:
...     raise DiagramError("contract: axis 'd' is not carried by any input")
... except NapkinError as e:
...     print(e)
contract: axis 'd' is not carried by any input
"""


class NapkinError(Exception):
    """Base of every user-facing napkin error (the CLI exits 2 on these)."""


class DiagramError(NapkinError):
    """A diagram is malformed: mismatched axis sizes, unknown axes, dtype clashes."""


class UserFileError(NapkinError):
    """A user diagram file (``path/file.py:name``) failed to load or holds no diagram."""


class ScheduleError(NapkinError):
    """A schedule is illegal: a group or stream the method forbids, a tile over capacity."""


class HardwareError(NapkinError):
    """An unknown GPU or dtype, or a profile file that cannot be read."""


class CodegenError(NapkinError):
    """A diagram or schedule cannot be lowered to CUDA, or the generated code failed to compile."""


class LaunchError(NapkinError):
    """Tensors passed to a compiled kernel have the wrong dtype, shape, device or strides."""
