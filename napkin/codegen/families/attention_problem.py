"""What the attention family reads off a diagram (:class:`AttentionProblem`).

A module of its own so that both of the family's kernels take it without importing each other:
``attention`` (the family, and the mma.sync template) builds it in ``analyze``, and
``attention_wgmma`` (the Hopper template) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...diagrams.ops import Value

__all__ = ["AttentionProblem", "MAX_WOVEN", "woven_reason"]

#: The most combinations of the woven axes one attention launch walks (along grid.y and, past its
#: 65535, on along grid.z in the same order: :func:`~napkin.codegen.program.fold_grid`, so a head's
#: query tiles still run side by side): every combination and its query tiles must number under
#: 2^31 (the kernels index them as ints), and grid.y x grid.z holds at most 65535^2. The families
#: refuse more at planning (``build_reason``), so that derive presents no plan that generate
#: cannot build.
MAX_WOVEN = 2 ** 31 - 1


def woven_reason(nz: int) -> str | None:
    """Why ``nz`` combinations of the woven axes do not fit one launch, or None.

    >>> woven_reason(65536) is None, woven_reason(2 ** 31)
    (True, '2147483648 woven combinations (heads x batch); a launch takes at most 2147483647')
    """
    return f"{nz} woven combinations (heads x batch); a launch takes at most {MAX_WOVEN}" if nz > MAX_WOVEN else None


@dataclass(frozen=True)
class AttentionProblem:
    """What the family read off a diagram: the arrays of ``O = Σ_x softmax_x(maps(Q·Kᵀ))·V``
    (``S`` the scores, ``maps`` the score chain between S and the softmax ``P``), the axes (``q``
    queries, ``x`` keys, ``d`` the head dimension of Q and K, ``dv`` that of V, ``woven`` the
    batch and head axes), the dtype, and ``lse``, the optional second output: the natural
    log-sum-exp of each row (fp32)."""

    Q: Value
    K: Value
    V: Value
    S: Value
    maps: tuple[Value, ...]
    P: Value
    O: Value
    q: str
    x: str
    d: str
    dv: str
    woven: tuple[str, ...]
    dtype: str
    lse: Value | None = None
