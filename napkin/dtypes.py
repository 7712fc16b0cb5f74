"""The value types napkin knows: bytes per value and their names in PyTorch and CUDA.

>>> DTYPES["bf16"].bytes
2
>>> dtype("float16").name
'fp16'
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DiagramError


@dataclass(frozen=True)
class DType:
    """One value type: its short name, size, and spellings in torch and CUDA C++."""

    name: str
    bytes: int
    torch_name: str
    cuda_type: str
    is_float: bool = True


DTYPES: dict[str, DType] = {
    "fp32": DType("fp32", 4, "float32", "float"),
    "tf32": DType("tf32", 4, "float32", "float"),
    "fp16": DType("fp16", 2, "float16", "__half"),
    "bf16": DType("bf16", 2, "bfloat16", "__nv_bfloat16"),
    "fp8": DType("fp8", 1, "float8_e4m3fn", "__nv_fp8_e4m3"),
    "fp64": DType("fp64", 8, "float64", "double"),
}

_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8", "fp8e4m3": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
    "float64": "fp64", "double": "fp64", "f64": "fp64",
}


def dtype(name: str | DType) -> DType:
    """Look a dtype up by any common spelling; unknown names raise one clear error."""
    if isinstance(name, DType):
        return name
    key = str(name).lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        known = ", ".join(sorted(DTYPES))
        raise DiagramError(f"unknown dtype {name!r}; known dtypes: {known}")  # one class at every entry point
    return DTYPES[key]


def canonical(name: str | DType | None) -> str | None:
    """The short name of a dtype given by any spelling (None stays None): every layer compares
    these names, so ``bfloat16`` must plan as ``bf16`` does.

    >>> canonical("bfloat16"), canonical("torch.float32"), canonical(None)
    ('bf16', 'fp32', None)
    """
    return None if name is None else dtype(name).name


def torch_dtype(name: str | DType):
    """The torch dtype for a napkin dtype name (imports torch only when called)."""
    import torch

    return getattr(torch, dtype(name).torch_name)
