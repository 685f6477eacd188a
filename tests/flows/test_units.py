"""Unit compiles on threads, reported as they land (the Dask path is in test_dask.py)."""

from __future__ import annotations

import threading

import pytest

from lospmm.flows.execution import progress, units
from lospmm.flows.execution.taskio import RunContext
from lospmm.stages.compile import CompileOptions


def _fake_compile(monkeypatch):
    seen = []
    lock = threading.Lock()

    def fake(source, name, options):
        with lock:
            seen.append(name)
        return {"status": "ok", "name": name, "compiled_on": "here"}

    monkeypatch.setattr(units, "compiled_unit", fake)
    return seen


def test_every_unit_lands_once_and_is_counted_as_it_lands(monkeypatch):
    seen = _fake_compile(monkeypatch)
    counts, landed = [], {}
    compile_units = units.run_compiler(RunContext(root=".", jobs=3), lambda done, total: counts.append((done, total)))
    batch = [("src", f"u{i}", CompileOptions()) for i in range(7)]
    compile_units(batch, lambda i, result: landed.setdefault(i, result["name"]))
    assert sorted(seen) == sorted(f"u{i}" for i in range(7))
    assert landed == {i: f"u{i}" for i in range(7)}
    assert counts == [(i, 7) for i in range(8)]  # 0 first, then one more per unit, in order


def test_a_runs_progress_moves_with_each_unit_of_an_unfinished_kernel(monkeypatch):
    _fake_compile(monkeypatch)
    run = "test-units-progress"
    ctx = RunContext(root=".", run_id=run, jobs=1)
    progress.started(run, [("compile", "m")])
    try:
        seen = []
        report = ctx.unit_reporter("compile", "m", {"layer": "fc", "m1": 8}, items=1)
        compile_units = units.run_compiler(ctx, report)
        batch = [("src", f"u{i}", CompileOptions()) for i in range(4)]
        compile_units(batch, lambda i, result: seen.append(progress.snapshot(run)))
        percents = [p for p, _ in seen] + [progress.snapshot(run)[0]]
        assert percents == [0.0, 25.0, 50.0, 75.0, 100.0]
        assert progress.snapshot(run)[1] == "compile m: fc M1=8, 4/4 units compiled"
    finally:
        progress.finished(run)


@pytest.mark.usefixtures("prefect_server")
def test_in_a_flow_run_each_unit_is_a_task_run_of_it_and_its_info_lines_stay_out_of_the_log(monkeypatch):
    import logging

    from prefect import flow, task
    from prefect.context import FlowRunContext, TaskRunContext

    runs, lock, compiled = [], threading.Lock(), units.compiled

    def recorded(source, name, options):
        ctx = TaskRunContext.get()
        with lock:
            runs.append((ctx.task.name, ctx.task_run.flow_run_id) if ctx else None)
        return compiled(source, name, options)

    monkeypatch.setattr(units, "compiled", recorded)
    source = 'extern "C" __global__ void k(float* c) { c[threadIdx.x] = 1.0f; }\n'

    @task
    def stage() -> dict:
        landed = {}
        units.run_compiler(RunContext(root=".", jobs=2))([(source, f"u{i}", CompileOptions()) for i in range(5)],
                                                         lambda i, result: landed.setdefault(i, result["status"]))
        return landed

    @flow
    def a_flow():
        return FlowRunContext.get().flow_run.id, stage()

    flow_run_id, landed = a_flow()
    assert landed == {i: "ok" for i in range(5)}
    assert runs == [(units.UNIT_TASK, flow_run_id)] * 5
    filters = logging.getLogger("prefect.task_runs").filters
    record = logging.LogRecord("prefect.task_runs", logging.INFO, "", 0, "Finished in state Completed()", (), None)
    record.task_name = units.UNIT_TASK
    assert any(not f.filter(record) for f in filters)  # a unit's INFO line is dropped
    record.levelno = logging.ERROR
    assert all(f.filter(record) for f in filters)  # its failure is not
