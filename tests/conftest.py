"""Shared fixtures: one Prefect test server per session, and the `gpu` marker's skip."""

from __future__ import annotations

import ctypes
import os
import tempfile

import pytest


def _cuda_device_count() -> int:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except OSError:
        return 0


def pytest_collection_modifyitems(config, items):
    if _cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none found")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect API (SQLite) for the integration tests, PREFECT_HOME in a temp dir."""
    home = tempfile.mkdtemp(prefix="lospmm-prefect-home-")
    os.environ["PREFECT_HOME"] = home
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield home
