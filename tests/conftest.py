"""Shared fixtures: one Prefect test server per session, and the `gpu` marker's skip."""

from __future__ import annotations

import ctypes
import os
import tempfile

import pytest

# The CLI's console is 160 columns wide when piped unless COLUMNS says otherwise; pytest-xdist's
# workers inherit a COLUMNS of 80, which wrapped the tables the CLI tests read
os.environ.pop("COLUMNS", None)

try:  # torch before Prefect's stack: imported after it, torch 2.11 failed to import on the GPU machine
    import torch  # noqa: F401  (its debug_mode custom op's schema failed to parse)
except ImportError:
    pass


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


def run_directly(plan, sparsity: float, wrap=None, force: tuple[str, ...] = ()) -> dict[str, dict]:
    """Every node of the DAG for the plan's first source at one sparsity, each adapter called in
    this process without Prefect (keys derived as the flow derives them); stage -> manifest.
    `wrap(stage, call)` runs `call()` (e.g. under a profiler); `force` recomputes those stages."""
    from lospmm.flows.dag import DAG, node_key
    from lospmm.flows.execution.taskio import RunContext

    ctx = RunContext(str(plan.root), "", 1)
    src, done = plan.sources[0], {}
    for node in (n for n in DAG if n.stage in plan.stages):
        params = node.params(plan, src, sparsity)
        key = node_key(node.stage, params, [done[i]["key"] for i in node.inputs])
        fn, inputs = node.task.fn, {i: done[i] for i in node.inputs}
        label = f"{src.label}-s{sparsity:g}" if node.per_sparsity else src.label

        def call(fn=fn, key=key, inputs=inputs, params=params, label=label, stage=node.stage):
            return fn(key=key, ctx=ctx, label=label, inputs=inputs, force=stage in force, **params)

        done[node.stage] = wrap(node.stage, call) if wrap else call()
    return done
