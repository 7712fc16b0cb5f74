"""Fixtures the performance-model tests share: the built-in H100 and H200 profiles."""

import pytest

from napkin.perfmodel.hardware import get_gpu


@pytest.fixture(scope="module")
def h100():
    return get_gpu("h100")


@pytest.fixture(scope="module")
def h200():
    return get_gpu("h200")
