"""Code generation: a diagram and a schedule become CUDA kernels (Jinja templates), compiled at
run time and checked against PyTorch.

- :func:`compile` (``napkin.codegen.api``): diagram → :class:`CompiledDiagram` callable on
  torch CUDA tensors;
- :func:`derive` (``napkin.codegen.planner``): diagram → :class:`~napkin.perfmodel.plan.Plan`
  (the partition into kernels, each kernel's family, tiles and options; docs/architecture.md §6);
- :func:`build` (``napkin.codegen.lower``): plan → :class:`~napkin.codegen.program.Program`, and
  ``napkin.codegen.lower.lower``: a diagram planned and built;
- :func:`rank_candidates` (``napkin.codegen.select``): a family's configurations ranked by the
  one prediction function;
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
    "derive": "planner",
    "build": "lower",
    "generate_source": "generate",
    "verify_diagram": ("verify", "verify"),
    "VerifyReport": "verify",
    "Arg": "program",
    "Buffer": "program",
    "KernelLaunch": "program",
    "Program": "program",
    "Family": "program",
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
