"""Compiling a kernel's units as Prefect tasks: on threads of this process (`--jobs`), or on the
workers of the Dask cluster the flow runs on (`--dask ADDRESS`, prefect-dask's DaskTaskRunner),
through the same task. A unit task is pure (source in, NVRTC's output out, no files), so a worker
needs no access to the artifact root for it; the caller stores results in the compile cache."""

from __future__ import annotations

import contextvars
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from lospmm.stages.compile import CompileOptions, compiled

UnitJob = tuple[str, str, CompileOptions]  # source, name, options
UnitCompiler = Callable[[list[UnitJob]], list[dict]]


def compiled_unit(source: str, name: str, options: CompileOptions) -> dict:
    """NVRTC's output for one unit as a dict (Compiled's fields), with where it was compiled."""
    return {**asdict(compiled(source, name, options)), "compiled_on": _where()}


# Not cached by Prefect: the compile cache, keyed by content, is the one cache of compiled units.
compile_unit = task(compiled_unit, name="compile-unit", cache_policy=NO_CACHE, persist_result=False)


def _where() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}"


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slots(jobs: int) -> threading.BoundedSemaphore:
    """At most `jobs` units compile at once in this process, however many layers ask at once."""
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(jobs, threading.BoundedSemaphore(jobs))


def threads(jobs: int) -> UnitCompiler:
    """Units on `jobs` threads here; each a Prefect task run when called inside a flow run, else a
    plain call (benchmarks, `lospmm kernel`)."""
    jobs = max(1, jobs)

    def run(batch: list[UnitJob]) -> list[dict]:
        from prefect.context import FlowRunContext, TaskRunContext

        fn = compile_unit if (FlowRunContext.get() or TaskRunContext.get()) else compiled_unit
        slots = _slots(jobs)

        def one(job: UnitJob) -> dict:
            with slots:
                return fn(*job)

        if jobs == 1 or len(batch) == 1:
            return [one(job) for job in batch]
        with ThreadPoolExecutor(min(jobs, len(batch))) as pool:
            # each call in a copy of this context: the unit's task run belongs to the calling task's
            futures = [pool.submit(contextvars.copy_context().run, one, job) for job in batch]
            return [f.result() for f in futures]
    return run


def on_dask(batch: list[UnitJob]) -> list[dict]:
    """Units as Prefect task runs on the Dask cluster this task runs on (prefect-dask's client
    from inside a task running on a DaskTaskRunner)."""
    from prefect_dask import get_dask_client

    with get_dask_client() as client:
        futures = [client.submit(compile_unit, *job, pure=False) for job in batch]
        return client.gather(futures)


def run_compiler(ctx) -> UnitCompiler:
    """How a run (taskio.RunContext) compiles units: on its Dask cluster, or on its `jobs` threads."""
    return on_dask if ctx.dask else threads(ctx.jobs)
