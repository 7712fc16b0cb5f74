"""Neural circuit diagrams as code: axes, arrays, boxes, weaving, composition.

>>> from napkin.diagrams import axes, array, contract, softmax, Diagram
>>> q, x, d = axes("q x d")
>>> Q, K, V = array("Q", q, d), array("K", x, d), array("V", x, d)
>>> S = contract(Q, K, over=d, name="S")
>>> P = softmax(S, over=x, name="P")
>>> O = contract(P, V, over=x, name="O")
>>> Diagram("attention", O)
Diagram('attention': Q[q,d], K[x,d], V[x,d] → O[q,d]; 3 boxes)
"""

from . import library
from .axes import Axis, axes
from .diagram import Diagram
from .functions import FUNCTIONS
from .ops import (Contract, InputOp, Map, Norm, Reduce, Rename, Softmax, Value, absolute, alibi, array, causal,
                  clamp, contract, elu, erf, exp, gelu, hardsigmoid, hardswish, hardtanh, layernorm, leaky_relu,
                  log, logsumexp, map_fn, max_over, maximum, mean_over, min_over, minimum, mish, power, reduce, relu,
                  rename, rmsnorm, rsqrt, scale, selu, sigmoid, silu, sliding_window, softcap, softmax, softplus, sqrt,
                  square, sum_over, tanh, tril, triu)
from .userfile import load_diagram

__all__ = [
    "Axis", "axes", "Diagram", "Value", "FUNCTIONS", "library", "load_diagram",
    "Contract", "InputOp", "Map", "Norm", "Reduce", "Rename", "Softmax",
    "absolute", "alibi", "array", "causal", "clamp", "contract", "elu", "erf", "exp", "gelu", "hardsigmoid",
    "hardswish", "hardtanh", "layernorm", "leaky_relu", "log", "logsumexp", "map_fn", "max_over", "maximum",
    "mean_over", "min_over", "minimum", "mish", "power", "reduce", "relu", "rename", "rmsnorm", "rsqrt", "scale", "selu",
    "sigmoid", "silu", "sliding_window", "softcap", "softmax", "softplus", "sqrt", "square", "sum_over", "tanh",
    "tril", "triu",
]
