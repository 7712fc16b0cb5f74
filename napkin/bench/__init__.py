"""Measuring napkin's kernels next to the baselines users would otherwise pick.

- :mod:`~napkin.bench.timing`: CUDA-event timing (warm-up, median of many runs, rotated inputs
  larger than L2, L2 flush), the measured copy rate, and a description of the device;
- :mod:`~napkin.bench.baselines`: cuBLAS, eager and compiled PyTorch, SDPA per backend,
  FlexAttention, the compiled PyTorch reference — each built from the same inputs as napkin's kernel;
- :mod:`~napkin.bench.suite`: the benchmark points (attention, matmul, MLP, row-wise ops), their
  FLOP and byte conventions, and the sweep that writes JSON;
- :mod:`~napkin.bench.autotune`: the fast configuration is found, not hand-picked: rank schedules
  with the model, measure the best few, keep the fastest, cache it; Spearman rank correlation;
- :mod:`~napkin.bench.calibration`: the recorded schedules resolved and re-predicted offline by
  the model as it is now, one efficiency factor per code-generation family fitted on them,
  leave-one-out errors (fitting to measurements is the benchmark's business: the model,
  :mod:`napkin.perfmodel`, imports neither codegen nor bench);
- :mod:`~napkin.bench.outofsample`: factors fitted on one GPU's results judged on another's;
- :mod:`~napkin.bench.report`: plots and ``BENCHMARKS.md`` from the JSON results.

Importing this package (or any of its modules) imports neither torch nor CuPy; they are loaded by
the functions that measure.
"""

from __future__ import annotations

__all__ = ["timing", "baselines", "suite", "report", "autotune", "calibration", "outofsample"]
