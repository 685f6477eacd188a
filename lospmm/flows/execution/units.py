"""Compiling a kernel's units, each a Prefect task run (`compile-unit`) of the flow run: on `--jobs`
threads of this process, or on the workers of the Dask cluster the flow runs on (`--dask ADDRESS`,
prefect-dask's DaskTaskRunner). A unit compile is pure (source in, NVRTC's output out, no files),
so a worker needs no access to the artifact root for it; the caller stores results in the compile
cache. Outside a flow run (benchmarks, tests) a unit is a plain call.

A zoo run compiles ~2,500 units (about 3 ms of Prefect bookkeeping each); their task runs' INFO
lines ("Finished in state Completed()") are kept out of the run's log, their failures are not."""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from typing import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from lospmm.flows.execution.taskio import installed, stop_requested
from lospmm.stages.compile import CompileOptions, compiled

UnitJob = tuple[str, str, CompileOptions]  # source, name, options
# compile_units(batch, landed): compiles every job, calling landed(index, result) as each one lands,
# so the caller stores it at once and a killed compile resumes unit by unit.
UnitCompiler = Callable[[list[UnitJob], Callable[[int, dict], None]], None]


def compiled_unit(source: str, name: str, options: CompileOptions) -> dict:
    """NVRTC's output for one unit as a dict (Compiled's fields), with where it was compiled."""
    return {**asdict(compiled(source, name, options)), "compiled_on": _where()}


# Not cached by Prefect: the compile cache, keyed by content, is the one cache of compiled units.
UNIT_TASK = "compile-unit"
compile_unit = task(compiled_unit, name=UNIT_TASK, cache_policy=NO_CACHE, persist_result=False)


class _QuietUnits(logging.Filter):
    """Drops unit task runs' lines below WARNING from the run's log (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or getattr(record, "task_name", None) != UNIT_TASK


def _in_a_flow_run() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


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
    """Units on `jobs` threads here (NVRTC releases the GIL); each a task run of the flow run the
    caller is in, if any."""
    jobs = max(1, jobs)
    in_a_flow_run = _in_a_flow_run()
    if in_a_flow_run:
        installed(_QuietUnits, ("prefect.task_runs",))
    compile_one = compile_unit if in_a_flow_run else compiled_unit

    def run(batch: list[UnitJob], landed: Callable[[int, dict], None]) -> None:
        slots = _slots(jobs)

        def one(job: UnitJob) -> dict:
            stop_requested()  # a stopped run compiles none of the units still queued
            with slots:
                stop_requested()  # nor one that waited for a slot while the stop came
                return compile_one(*job)

        if jobs == 1 or len(batch) == 1:
            for i, job in enumerate(batch):
                landed(i, one(job))
            return
        pool = ThreadPoolExecutor(min(jobs, len(batch)))
        try:
            # each unit in a copy of this thread's context: its task run belongs to the flow run
            futures = {pool.submit(contextvars.copy_context().run, one, job): i for i, job in enumerate(batch)}
            for future in as_completed(futures):
                landed(futures[future], future.result())
        finally:  # on a failure or a stop, the units not started are dropped, not compiled for nothing
            pool.shutdown(wait=True, cancel_futures=True)
    return run


_CLIENTS: dict[str, object] = {}
_CLIENTS_LOCK = threading.Lock()


def on_dask(address: str) -> UnitCompiler:
    """Units as Prefect task runs (prefect-dask's client) on the Dask cluster at `address`, the one
    the flow's DaskTaskRunner runs on. Call it in the stage task's Prefect context: the units' task
    runs carry that context (the API to report to), whichever thread submits them."""
    captured = contextvars.copy_context()

    def run(batch: list[UnitJob], landed: Callable[[int, dict], None]) -> None:
        from distributed import as_completed as landing

        try:
            client = _client(address)
            # a copy per submission: one Context cannot be entered by two threads at once
            futures = {captured.copy().run(client.submit, compile_unit, *job, pure=False): i
                       for i, job in enumerate(batch)}
            arrivals = landing(list(futures), loop=client.loop)
        except Exception as e:
            raise ClusterError(f"Dask scheduler {address}: {type(e).__name__}: {e}") from e
        for future in arrivals:
            try:
                out = future.result()
            except Exception as e:  # a lost worker, a broken connection: not the unit's own result
                raise ClusterError(f"Dask scheduler {address}: {type(e).__name__}: {e}") from e
            landed(futures[future], out)
    return run


class ClusterError(RuntimeError):
    """The cluster could not compile a unit (NVRTC's own failures are results, not this): transient,
    so the layer is retried and never cached as failed."""

    transient = True


def _client(address: str):
    """One client per scheduler and process (a task may run on any thread of a worker, where
    prefect-dask's get_dask_client finds no client of its own)."""
    from prefect_dask import PrefectDaskClient

    with _CLIENTS_LOCK:
        client = _CLIENTS.get(address)
        if client is None or client.status not in ("running", "connecting", "newly-created"):
            client = _CLIENTS[address] = PrefectDaskClient(address, set_as_default=False)
        return client


@contextmanager
def waiting_on_units(ctx):
    """Around a stage task's wait for its units: on a Dask worker the task gives its thread back to
    the worker (distributed.secede) while it waits, so units can run there; else nothing. Without
    it, stage tasks waiting on every worker thread leave no thread for their units: a deadlock."""
    if not ctx.dask:
        yield
        return
    try:
        from distributed import get_worker, rejoin, secede

        get_worker()
    except (ImportError, ValueError):  # not in a task on a worker (a test, a local call)
        yield
        return
    secede()
    try:
        yield
    finally:
        rejoin()


def run_compiler(ctx, report: Callable[[int, int], None] | None = None) -> UnitCompiler:
    """How a run (taskio.RunContext) compiles units: on its Dask cluster, or on its `jobs` threads;
    `report(landed, total)` after each unit lands (progress counts units, not only kernels)."""
    compile_units = on_dask(ctx.dask) if ctx.dask else threads(ctx.jobs)
    if report is None:
        return compile_units

    def counted(batch: list[UnitJob], landed: Callable[[int, dict], None]) -> None:
        count = 0
        report(0, len(batch))

        def one_more(index: int, result: dict) -> None:
            nonlocal count  # `landed` is called from the submitting thread only, one unit at a time
            landed(index, result)
            count += 1
            report(count, len(batch))

        compile_units(batch, one_more)
    return counted
