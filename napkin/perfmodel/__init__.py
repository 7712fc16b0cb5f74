"""The performance model: schedules, their legality, their cost per memory level, canonical
optimal forms, and a CPU interpreter that runs a schedule and counts what it moves.

Importing this package does not import torch, and loads a submodule only when one of its names is
first used.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel import Schedule, cost
>>> c = cost(Schedule.fused(library.get("attention"), groups={"q": None}, streams={"x": None}, gpu=None))
>>> c.H("L2")
2*d*q + 2*d*q*x/g_q
>>> c.M("SMEM")
2*d*g_q + 2*d*s_x
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CanonicalForm": "canonical", "canonical_form": "canonical", "canonical_form_of": "canonical",
    "cluster_level_weight": "canonical", "l2_effective_memory": "canonical", "levels_from_gpu": "canonical",
    "multilevel_time": "canonical", "quantization_speedup": "canonical",
    "COMPUTE_KINDS": "cost", "Cost": "cost", "KernelCost": "cost", "LevelCost": "cost", "cost": "cost",
    "GPU": "hardware", "Level": "hardware", "get_gpu": "hardware", "list_gpus": "hardware",
    "InterpretResult": "interpreter", "KernelRun": "interpreter", "interpret": "interpreter",
    "KernelPlan": "legality", "TileConstraint": "legality", "analyze": "legality",
    "check_schedule": "legality", "tile_constraints": "legality",
    "LEVELS": "schedule", "Kernel": "schedule", "KernelOptions": "schedule", "Relabel": "schedule",
    "Schedule": "schedule",
    "Plan": "plan", "PlannedKernel": "plan",
    "explain_assumptions": "predict", "predict_schedule": "predict",
}

__all__ = sorted(_EXPORTS)

# The function ``cost`` shares its name with its module: bound lazily, the first
# ``import napkin.perfmodel.cost`` would set the package's ``cost`` to the module, and
# ``from napkin.perfmodel import cost`` would then depend on import order. Bound here, it is the
# function whatever was imported first.
from .cost import cost  # noqa: E402


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'napkin.perfmodel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
