"""A kernel's units compiled as Prefect tasks on a real Dask cluster (two worker processes) through
prefect-dask: the units run on both workers and the linked cubin is byte-identical to the local one."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from lospmm.flows import units
from lospmm.flows.compile_cache import cached_kernel
from lospmm.stages.codegen import CodegenParams, full_kernel_source
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
