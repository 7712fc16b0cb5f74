"""Tensor checks and launch-argument handling that need no GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napkin.errors import LaunchError, NapkinError
from napkin.kernels import check_tensor
from napkin.kernels.launch import _check_dims, _dims, _kernel_arg, same_device


def test_check_tensor_wrong_dtype_names_the_argument():
    x = torch.zeros(4, 8, dtype=torch.float32)
    with pytest.raises(LaunchError, match=r"^q: dtype is torch.float32, expected torch.bfloat16$"):
        check_tensor(x, "q", dtype=torch.bfloat16)
    with pytest.raises(LaunchError, match="q: dtype is torch.float32, expected torch.float16"):
        check_tensor(x, "q", dtype="fp16")


def test_check_tensor_wrong_shape():
    x = torch.zeros(4, 8)
    with pytest.raises(LaunchError, match=r"k: shape is \(4, 8\), expected \(4, 9\)"):
        check_tensor(x, "k", shape=(4, 9))
    with pytest.raises(LaunchError, match=r"k: shape is \(4, 8\), expected \(4, 8, \*\)"):
        check_tensor(x, "k", shape=(4, 8, None))
    with pytest.raises(LaunchError, match=r"expected \(32,\)"):
        check_tensor(x, "k", shape=(32,))


def test_check_tensor_strided_views():
    x = torch.zeros(4, 8)
    with pytest.raises(LaunchError, match=r"v: is not contiguous .*strides \(1, 8\).*v.contiguous"):
        check_tensor(x.t(), "v")
    with pytest.raises(LaunchError, match=r"v: is not contiguous .*strides \(8, 2\)"):
        check_tensor(x[:, ::2], "v")


def test_check_tensor_cpu_tensor_is_refused_after_the_other_checks_pass():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(LaunchError, match=r"o: is a CPU tensor; kernels need CUDA tensors"):
        check_tensor(x, "o", dtype="bf16", shape=(4, -1))
    with pytest.raises(LaunchError, match="o: is a META tensor"):
        check_tensor(torch.empty(3, device="meta"), "o")


def test_check_tensor_alignment_and_type():
    x = torch.zeros(64)
    with pytest.raises(LaunchError, match="x: data pointer is not 16-byte aligned"):
        check_tensor(x[1:], "x", align=16)
    with pytest.raises(LaunchError, match="x: expected a torch tensor, got list"):
        check_tensor([1, 2], "x")
    assert issubclass(LaunchError, NapkinError)


def test_non_contiguous_allowed_when_asked():
    x = torch.zeros(4, 8)
    with pytest.raises(LaunchError, match="CPU tensor"):  # got past the stride check
        check_tensor(x.t(), "v", contiguous=False)


def test_device_matching():
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert same_device(cuda1, "cuda:1") and same_device(cuda1, 1)
    assert not same_device(cuda1, 0) and not same_device(cuda0, torch.device("cuda:1"))
    assert not same_device(torch.device("cpu"), "cuda:0")


def test_scalar_arguments_become_fixed_width_values():
    assert _kernel_arg(7, 0, 0, "k").dtype == np.int32
    assert _kernel_arg(-(2 ** 31), 0, 0, "k") == np.int32(-(2 ** 31))
    assert _kernel_arg(0.5, 0, 0, "k").dtype == np.float32
    assert _kernel_arg(True, 0, 0, "k").dtype == np.bool_
    assert _kernel_arg(np.int64(2 ** 40), 0, 0, "k").dtype == np.int64
    assert _kernel_arg(np.float16(1), 0, 0, "k").dtype == np.float16
    assert _kernel_arg(None, 0, 0, "k") == np.uint64(0)


def test_bad_arguments_are_launch_errors():
    with pytest.raises(LaunchError, match=r"k: argument 3 = 4294967296 does not fit a 32-bit int"):
        _kernel_arg(2 ** 32, 3, 0, "k")
    with pytest.raises(LaunchError, match="k: argument 1 is a CPU tensor"):
        _kernel_arg(torch.zeros(3), 1, 0, "k")
    with pytest.raises(LaunchError, match="argument 2 has unsupported type str"):
        _kernel_arg("text", 2, 0, "k")


def test_grid_and_block_validation():
    assert _dims(5, "grid") == (5, 1, 1)
    assert _dims((2, 3), "grid") == (2, 3, 1)
    for bad in (0, (1, 0), (1, 2, 3, 4), "x", ()):
        with pytest.raises(LaunchError):
            _dims(bad, "grid")
    _check_dims((1, 1, 1), (1024, 1, 1))
    with pytest.raises(LaunchError, match="1025 threads"):
        _check_dims((1, 1, 1), (1025, 1, 1))
    with pytest.raises(LaunchError, match="too large"):
        _check_dims((1, 70000, 1), (32, 1, 1))
