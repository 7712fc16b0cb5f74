"""Code generation: a diagram and a schedule become CUDA kernels (Jinja templates), compiled at
run time and checked against PyTorch.

- :func:`compile` (``napkin.codegen.api``): diagram → :class:`CompiledDiagram` callable on
  torch CUDA tensors;
- ``napkin.codegen.lower.lower``: diagram → :class:`~napkin.codegen.program.Program`
  (families tried in order: rowwise, contraction, attention, fallback);
- :func:`rank_candidates` (``napkin.codegen.select``): a family's schedules ranked by the
  performance model;
- :func:`generate_source` (``napkin.codegen.generate``): a self-contained ``.cu`` without a GPU;
- ``napkin.codegen.verify.verify``: compare kernels with the float64 reference
  (:func:`verify_diagram` here).

``lower`` and ``verify`` are also the names of submodules, so the package exports those
functions as :func:`lower_diagram` and :func:`verify_diagram`.

Importing this package loads neither torch nor CuPy (nor Jinja): every name is resolved lazily.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "compile": "api",
    "CompiledDiagram": "api",
    "lower_diagram": ("lower", "lower"),
    "prepare": "lower",
    "rank_candidates": "select",
    "choose_schedule": "select",
    "generate_source": "generate",
    "verify_diagram": ("verify", "verify"),
    "VerifyReport": "verify",
    "Arg": "plan",
    "Buffer": "plan",
    "KernelLaunch": "plan",
    "Program": "plan",
    "Family": "plan",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'napkin.codegen' has no attribute {name!r}")
    mod, attr = mod if isinstance(mod, tuple) else (mod, name)
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
