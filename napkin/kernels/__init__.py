"""The CUDA device library that generated kernels call, and the runtime around it.

- :mod:`~napkin.kernels.library`: the headers (``napkin.cuh`` and its parts) and inlining them
  into a kernel source;
- :mod:`~napkin.kernels.compile`: NVRTC compilation through CuPy, for the GPU at hand, cached;
- :mod:`~napkin.kernels.cache`: the disk cache of cubins;
- :mod:`~napkin.kernels.launch`: launching on torch tensors and checking them;
- :mod:`~napkin.kernels.nvcc`: offline ``nvcc`` builds that report registers, shared memory and
  spills per kernel.

Importing this package imports neither torch nor CuPy; they are loaded when a kernel is compiled
or launched.
"""

from .cache import (
    KernelCache,
    KernelCacheWarning,
    cache_key,
    default_cache,
    default_cache_dir,
)
from .compile import (
    arch_for_capability,
    compile_kernel,
    compile_module,
    detect_arch,
    format_compile_error,
)
from .launch import CompiledKernel, CompiledModule, check_tensor, launch
from .library import header_names, header_text, inline_library, library_source
from .nvcc import KernelResources, ResourceUsage, nvcc_available, nvcc_compile

__all__ = [
    "CompiledKernel",
    "CompiledModule",
    "KernelCache",
    "KernelCacheWarning",
    "KernelResources",
    "ResourceUsage",
    "arch_for_capability",
    "cache_key",
    "check_tensor",
    "compile_kernel",
    "compile_module",
    "default_cache",
    "default_cache_dir",
    "detect_arch",
    "format_compile_error",
    "header_names",
    "header_text",
    "inline_library",
    "launch",
    "library_source",
    "nvcc_available",
    "nvcc_compile",
]
