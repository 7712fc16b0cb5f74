"""Shared test set-up: GPU tests skip cleanly where no GPU (or no CuPy) exists."""

import os
import shutil
import sys
from pathlib import Path

import pytest

# Run straight from a checkout (the GPU machine has no install of napkin); tests/ itself holds
# napkin_test_support, the helpers several test files share.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _gpu_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


HAS_GPU = _gpu_available()
HAS_NVCC = shutil.which("nvcc") is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU with CuPy here")
    skip_nvcc = pytest.mark.skip(reason="nvcc not on PATH")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)


@pytest.fixture(autouse=True)
def _isolated_kernel_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own cache so tests never see stale kernels."""
    if "NAPKIN_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernel-cache"))
