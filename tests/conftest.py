"""Shared fixtures: one Prefect test server per session, and the `gpu` marker's skip."""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import strategies as st

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
def prefect_server(migrated_prefect_db):
    """A temporary Prefect API (SQLite) for the integration tests, PREFECT_HOME in a temp dir, its
    database a copy of the migrated one."""
    home = tempfile.mkdtemp(prefix="lospmm-prefect-home-")
    before = os.environ.get("PREFECT_HOME")
    os.environ["PREFECT_HOME"] = home
    from unittest import mock

    import prefect.testing.utilities as harness

    seeded = []

    def seeded_temp_dir() -> str:  # where the harness puts its database
        temp_dir = tempfile.mkdtemp()
        shutil.copyfile(migrated_prefect_db, Path(temp_dir) / "prefect-test.db")
        seeded.append(temp_dir)
        return temp_dir

    with mock.patch.object(harness, "mkdtemp", seeded_temp_dir), \
            harness.prefect_test_harness(server_startup_timeout=90):
        from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

        # a Prefect that puts it elsewhere would migrate a database of its own again (half a minute): say so
        url = PREFECT_SERVER_DATABASE_CONNECTION_URL.value() or ""
        assert seeded and url.endswith(f"{seeded[0]}/prefect-test.db"), \
            f"prefect_test_harness no longer uses the seeded database ({url}): mend tests/conftest.py"
        yield home
    # (the harness removes its database's folder itself, at exit): left behind, /tmp gathered a home per worker per run
    shutil.rmtree(home, ignore_errors=True)
    if before is None:
        os.environ.pop("PREFECT_HOME", None)
    else:
        os.environ["PREFECT_HOME"] = before


@pytest.fixture(scope="session")
def migrated_prefect_db(tmp_path_factory) -> Path:
    """A Prefect database migrated once for the whole test run, every xdist worker's: a fresh
    PREFECT_HOME's first API start spends about 17 s of its 24 migrating (2 cores), and each
    process-level test starts one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    template = shared / "prefect-template" / "prefect.db"
    with open(shared / "prefect-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker migrates; the other waits for it
        if not template.exists():
            building = Path(tempfile.mkdtemp(prefix="prefect-template-", dir=shared))
            env = {**os.environ, "PREFECT_HOME": str(building)}
            for name in [n for n in env if n.startswith(("PREFECT_API_DATABASE_", "PREFECT_SERVER_DATABASE_"))]:
                env.pop(name)  # this home's prefect.db, not a database the environment names
            env.pop("PREFECT_API_URL", None)
            done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and (building / "prefect.db").exists(), done.stdout[-2000:] + done.stderr[-2000:]
            building.rename(template.parent)  # whole, or not there
    return template


@pytest.fixture()
def fresh_prefect_home(tmp_path, migrated_prefect_db) -> Path:
    """An empty PREFECT_HOME of this test's own (tmp_path/prefect-home) whose database is already
    migrated: no flow runs in it, and its API starts in seconds rather than half a minute."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    shutil.copyfile(migrated_prefect_db, home / "prefect.db")
    return home


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


def host_run_wrong(kernel, a, n) -> bool:
    """Whether the host run of `kernel` on A (`a`) over `n` columns, under ASan, is wrong or stops: what a
    test of a kernel broken on purpose asserts."""
    from lospmm.kernel.check import checked
    from lospmm.kernel.host import HostKernel

    try:
        return not checked(HostKernel(kernel, True), a, n).ok
    except Exception:  # AddressSanitizer stopped it: a store past C
        return True


def proxy_on_host(design, smem_bytes: int | None = None):
    """The proxy of a 38×256 A at 0.6 in tiles of 4 rows (the last tile's rows past M guarded) in `design`,
    and its host run under ASan over 150 columns at N1 = 32, launched with `smem_bytes` of dynamic shared
    memory (default: the least any launch gives it, stages.pad.proxy_dynamic_shared): (its source, its
    clusters, its output)."""
    import numpy as np

    from lospmm.kernel.host import HostKernel
    from lospmm.kernel.render import CodegenParams, proxy_source
    from lospmm.stages.cluster import proxy_clusters
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a = random_pruned(38, 256, 0.6, np.random.default_rng(0))
    clusters = proxy_clusters(a, reordered_tiles(a, 4), 0.6, 2)
    kernel = proxy_source(38, 256, clusters, CodegenParams(design=design))
    from lospmm.stages.pad import proxy_dynamic_shared

    smem = proxy_dynamic_shared(0, clusters, design, 32) if smem_bytes is None else smem_bytes
    out = HostKernel(kernel, sanitize=True).run(np.ones((256, 150), np.float32), 32, {"cluster_of": clusters.cluster_of},
                                                smem)
    return kernel, clusters, out


@st.composite
def convolutions(draw):
    """A random convolution (any window, stride, padding and dilation on a small image; an input a window
    fits in) and its pruned weight (cout × cin·kh·kw, 0-80% dense) and bias or none: (A, geometry, bias)."""
    import numpy as np
    import scipy.sparse as sp

    from lospmm.kernel.geometry import ConvGeometry

    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dilation, stride, pad = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(0, 3))
    h = draw(st.integers(max(1, dilation * (kh - 1) + 1 - 2 * pad), 9))
    w = draw(st.integers(max(1, dilation * (kw - 1) + 1 - 2 * pad), 9))
    geometry = ConvGeometry(cin=draw(st.integers(1, 4)), h=h, w=w, kh=kh, kw=kw, stride=stride, pad=pad,
                            dilation=dilation)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cout = draw(st.integers(1, 9))
    a = sp.random(cout, geometry.k, density=draw(st.floats(0.0, 0.8)), format="csr", random_state=rng,
                  dtype=np.float32)
    a.data[:] = rng.standard_normal(a.nnz).astype(np.float32)
    a.eliminate_zeros()
    bias = tuple(rng.standard_normal(cout).tolist()) if draw(st.booleans()) else ()
    return a, geometry, bias

