"""A kernel's units compiled as Prefect tasks on a real Dask cluster (two worker processes) through
prefect-dask: the units run on both workers and the linked cubin is byte-identical to the local one."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from lospmm.flows.execution import units
from lospmm.flows.storage.compile_cache import cached_kernel
from lospmm.kernel.render import CodegenParams, kernel_source as full_kernel_source
from lospmm.stages.compile import kernel_options
from lospmm.stages.reorder import reordered_tiles


def _kernel():
    a = sp.random(96, 256, density=0.2, format="csr", random_state=np.random.default_rng(5), dtype=np.float32)
    return full_kernel_source(a, reordered_tiles(a, 4), 64, CodegenParams(shard_nnz=200))


def test_units_compile_on_every_dask_worker_into_the_same_cubin(tmp_path, prefect_server):
    from distributed import LocalCluster
    from prefect import flow, task
    from prefect_dask import DaskTaskRunner

    kernel = _kernel()
    options = kernel_options("sm_90", 4)
    assert len(kernel.units) >= 12
    local, _ = cached_kernel(tmp_path / "local", kernel, options, units.threads(1))
    assert local["status"] == "ok"

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
        address = cluster.scheduler_address

        @task
        def compile_on_cluster(root: str) -> dict:
            # from a thread of the task's own, as the compile and emit stages call it
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(cached_kernel, root, kernel, options, units.on_dask(address)).result()[0]

        @flow(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
        def on_dask(root: str) -> dict:
            return compile_on_cluster.submit(root).result()

        result = on_dask(str(tmp_path / "dask"))
        workers = set(cluster.scheduler_info["workers"])
    assert result["status"] == "ok" and result["units_compiled"] == len(kernel.units)
    assert set(result["compiled_on"]) == workers and len(workers) == 2  # every worker compiled units
    assert result["key"] == local["key"]
    cubin = (tmp_path / "dask" / result["paths"]["cubin"]).read_bytes()
    assert cubin == (tmp_path / "local" / local["paths"]["cubin"]).read_bytes()


def _stage_like(root: str, address: str, seed: int) -> dict:
    """What the compile and emit tasks do on a worker: wait for their units, which run on the same cluster."""
    from lospmm.flows.execution.taskio import RunContext

    a = sp.random(64, 128, density=0.2, format="csr", random_state=np.random.default_rng(seed), dtype=np.float32)
    kernel = full_kernel_source(a, reordered_tiles(a, 4), 64, CodegenParams(shard_nnz=100))
    ctx = RunContext(root, dask=address)
    with units.waiting_on_units(ctx):
        return cached_kernel(root, kernel, kernel_options("sm_90", 4), units.run_compiler(ctx))[0]


def test_stage_tasks_waiting_on_units_leave_their_threads_to_the_units(tmp_path, prefect_server):
    # one worker thread and two stage tasks waiting on it: without giving the thread back, a deadlock
    from distributed import Client, LocalCluster
    from prefect.settings import PREFECT_API_URL

    env = {"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_HOME": prefect_server}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", env=env) as cluster:
        with Client(cluster) as client:
            futures = [client.submit(_stage_like, str(tmp_path), cluster.scheduler_address, seed, pure=False)
                       for seed in (1, 2)]
            results = [f.result(timeout=120) for f in futures]
    assert all(r["status"] == "ok" and r["units_compiled"] == r["units"] for r in results)
