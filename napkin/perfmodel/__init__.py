"""The performance model: schedules, their legality, their cost per memory level, canonical
optimal forms, and a CPU interpreter that runs a schedule and counts what it moves.

Importing this package does not import torch.

>>> from napkin.diagrams import library
>>> from napkin.perfmodel import Schedule, cost
>>> c = cost(Schedule.fused(library.get("attention"), groups={"q": None}, streams={"x": None}, gpu=None))
>>> c.H("L2")
2*d*q + 2*d*q*x/g_q
>>> c.M("SMEM")
2*d*g_q + 2*d*s_x
"""

from .canonical import (
                        CanonicalForm,
                        canonical_form,
                        canonical_form_of,
                        cluster_level_weight,
                        l2_effective_memory,
                        levels_from_gpu,
                        multilevel_time,
                        quantization_speedup,
)
from .cost import COMPUTE_KINDS, Cost, KernelCost, LevelCost, cost
from .hardware import GPU, Level, get_gpu, list_gpus
from .interpreter import InterpretResult, KernelRun, interpret
from .legality import (
                        KernelPlan,
                        TileConstraint,
                        analyze,
                        check_schedule,
                        tile_constraints,
)
from .schedule import LEVELS, Kernel, Relabel, Schedule

__all__ = [
                        "COMPUTE_KINDS",
                        "GPU",
                        "LEVELS",
                        "CanonicalForm",
                        "Cost",
                        "InterpretResult",
                        "Kernel",
                        "KernelCost",
                        "KernelPlan",
                        "KernelRun",
                        "Level",
                        "LevelCost",
                        "Relabel",
                        "Schedule",
                        "TileConstraint",
                        "analyze",
                        "canonical_form",
                        "canonical_form_of",
                        "check_schedule",
                        "cluster_level_weight",
                        "cost",
                        "get_gpu",
                        "interpret",
                        "l2_effective_memory",
                        "levels_from_gpu",
                        "list_gpus",
                        "multilevel_time",
                        "quantization_speedup",
                        "tile_constraints",
]
