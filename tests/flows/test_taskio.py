"""What task adapters share: fanning out in order, grouping, failed rows, writing or reusing a stage's artifact."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lospmm.flows.execution import progress
from lospmm.flows.storage import schemas
from lospmm.flows.storage.store import artifact_path
from lospmm.flows.catalog.launch import SCHEMA as LAUNCH
from lospmm.flows.execution.taskio import RunContext, failed_row, grouped, in_parallel, layer_fields, run_logger, run_stage
from lospmm.status import Status

_KEY = "ab" * 32


def _launch_row(layer, status=Status.OK, message=None, m1=8):
    """A row of the pad stage's artifact (LAUNCH), every column set."""
    row = {c: None for c in LAUNCH.names}
    return {**row, "model": "m", "layer": layer, "op": "conv", "m": 64, "n": 49, "k": 27, "repeat": 1,
            "sparsity": 0.9, "m1": m1, "n1": 32, "status": status, "message": message, "gpu": "h100",
            "grid_x": 8, "grid_y": 2, "block": 128, "pred_regs": 40, "num_atb": 3, "smem_bytes": 0}


@pytest.mark.parametrize("jobs", [1, 3])
def test_in_parallel_keeps_input_order_and_reports_every_item(jobs):
    items = list(range(7))
    calls = []

    def fn(x):
        time.sleep(0.002 * (len(items) - x))  # later items finish first when threaded
        return {"layer": f"l{x}", "x": x}

    out = in_parallel(fn, items, jobs, report=lambda done, total, row: calls.append((done, total, row["x"])))
    assert [r["x"] for r in out] == items
    assert [(d, t) for d, t, _ in calls] == [(d, len(items)) for d in range(1, len(items) + 1)]
    assert sorted(x for *_, x in calls) == items  # each item reported once, whatever the finishing order


def test_in_parallel_uses_threads_only_when_asked():
    seen = set()

    def fn(x):
        seen.add(threading.get_ident())
        time.sleep(0.01)  # long enough that one worker cannot take every item
        return x

    assert in_parallel(fn, range(6), jobs=1) == list(range(6))
    assert seen == {threading.get_ident()}
    seen.clear()
    assert in_parallel(fn, range(6), jobs=3) == list(range(6))
    assert threading.get_ident() not in seen and len(seen) > 1
    assert in_parallel(fn, [], jobs=3) == []


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_exception_in_fn_propagates(jobs):
    def fn(x):
        if x == 2:
            raise KeyError("boom")
        return x

    with pytest.raises(KeyError, match="boom"):
        in_parallel(fn, range(5), jobs)


def test_grouped_keeps_first_seen_order():
    rows = [{"layer": "b", "m1": 8}, {"layer": "a", "m1": 4}, {"layer": "b", "m1": 4}, {"layer": "a", "m1": 4}]
    by_layer = grouped(rows, "layer")
    assert list(by_layer) == ["b", "a"]
    assert by_layer["b"] == [rows[0], rows[2]] and by_layer["a"] == [rows[1], rows[3]]
    by_pair = grouped(rows, "layer", "m1")
    assert list(by_pair) == [("b", 8), ("a", 4), ("b", 4)]
    assert by_pair[("a", 4)] == [rows[1], rows[3]]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=20))
def test_grouped_is_a_stable_partition(pairs):
    rows = [{"a": a, "b": b, "i": i} for i, (a, b) in enumerate(pairs)]
    for cols in (("a",), ("a", "b")):
        groups = grouped(rows, *cols)
        keys = [r[cols[0]] if len(cols) == 1 else tuple(r[c] for c in cols) for r in rows]
        assert list(groups) == list(dict.fromkeys(keys))  # first-seen order of the keys
        for key, members in groups.items():
            assert [r["i"] for r in members] == [i for i, k in enumerate(keys) if k == key]  # input order inside


def test_failed_row_names_where_and_the_exception_type():
    base = {"layer": "conv1", "m1": 8, "status": Status.OK, "message": None}
    row = failed_row(base, "compile M1=8", ZeroDivisionError("division by zero"))
    assert row == {"layer": "conv1", "m1": 8, "status": "error",
                   "message": "compile M1=8: ZeroDivisionError: division by zero"}
    assert row["status"] is Status.ERROR and base["status"] == Status.OK  # the base row is not changed
    # an error that already names the layer first is not prefixed with it twice
    named = failed_row(base, "conv1", ValueError("conv1: K=30 is not a multiple of M=4"))
    assert named["message"] == "conv1: ValueError: K=30 is not a multiple of M=4"
    assert failed_row(base, "conv1", ValueError("conv10: odd"))["message"] == "conv1: ValueError: conv10: odd"


def test_layer_fields_copy_the_layer_columns_and_extras():
    row = _launch_row("conv1")
    assert layer_fields(row) == {c: row[c] for c in schemas.LAYER_COLUMNS}
    assert layer_fields(row, "sparsity", "m1") == {**{c: row[c] for c in schemas.LAYER_COLUMNS},
                                                   "sparsity": 0.9, "m1": 8}


def test_run_stage_writes_the_artifact_and_one_problem_per_layer(tmp_path):
    ctx = RunContext(root=str(tmp_path))
    rows = [_launch_row("a", m1=4), _launch_row("b", Status.ERROR, "pad: ValueError: x", m1=4),
            _launch_row("b", Status.ERROR, "pad: ValueError: x", m1=8), _launch_row("c", Status.SKIPPED, "depthwise"),
            _launch_row("d", None)]
    manifest = run_stage("pad", LAUNCH, _KEY, ctx, "m-s0.9", False, lambda: rows)
    assert manifest["path"] == str(artifact_path(tmp_path, "pad", "m-s0.9", _KEY).relative_to(tmp_path))
    assert (manifest["stage"], manifest["key"], manifest["label"], manifest["rows"], manifest["reused"]) == \
        ("pad", _KEY, "m-s0.9", 5, False)
    back = ctx.read(manifest)
    assert back.schema.names == LAUNCH.names
    assert back.to_pylist() == schemas.table_from_rows(rows, LAUNCH).to_pylist()
    assert back.column("status").to_pylist() == ["ok", "error", "error", "skipped", None]
    # OK and no status are not problems; b's repeated error counts once
    assert manifest["problems"] == [{"layer": "b", "status": "error", "message": "pad: ValueError: x"},
                                    {"layer": "c", "status": "skipped", "message": "depthwise"}]


def test_run_stage_reuses_a_whole_artifact_unless_forced(tmp_path):
    ctx = RunContext(root=str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return [_launch_row("a"), _launch_row("b", Status.ERROR, "boom")]

    first = run_stage("pad", LAUNCH, _KEY, ctx, "m", False, compute)
    again = run_stage("pad", LAUNCH, _KEY, ctx, "m", False, compute)
    assert len(calls) == 1 and again["reused"] is True
    assert {**again, "reused": False} == first  # the same manifest, problems included, from the sidecar
    forced = run_stage("pad", LAUNCH, _KEY, ctx, "m", True, compute)
    assert len(calls) == 2 and forced["reused"] is False
    run_stage("pad", LAUNCH, "cd" * 32, ctx, "m", False, compute)  # another key is another artifact
    assert len(calls) == 3


def test_run_stage_recomputes_a_corrupt_artifact(tmp_path):
    ctx = RunContext(root=str(tmp_path))
    first = run_stage("pad", LAUNCH, _KEY, ctx, "m", False, lambda: [_launch_row("a")])
    path = ctx.path(first)
    path.write_bytes(path.read_bytes()[:-10])  # e.g. a killed run's half-written file
    again = run_stage("pad", LAUNCH, _KEY, ctx, "m", False, lambda: [_launch_row("a"), _launch_row("b")])
    assert again["reused"] is False and ctx.read(again).num_rows == 2


def test_the_reporter_feeds_the_runs_progress():
    run_id = "test-taskio-reporter"
    progress.started(run_id, [("compile", "m"), ("emit", "m")])
    try:
        ctx = RunContext(root="unused", run_id=run_id)
        ctx.reporter("compile", "m")(1, 2, {"layer": "conv1", "m1": 8})
        assert progress.snapshot(run_id)[1] == "compile m: 1/2 (conv1 M1=8)"
        ctx.reporter("emit", "m")(1, 3, {"layer": "conv2", "m1": 8})  # emit's items are layers, not M1s
        assert progress.snapshot(run_id)[1] == "emit m: 1/3 (conv2)"
    finally:
        progress.finished(run_id)


def test_run_logger_works_outside_a_prefect_run():
    logger = run_logger()
    assert isinstance(logger, logging.Logger) and logger.name.endswith("lospmm")
    logger.info("run_logger outside a flow")  # must not raise


def test_two_writers_of_one_key_compute_it_once(tmp_path):
    """`--sparsity 0.9 0.9`, or two runs on one root: the second waits for the first and reuses it."""
    ctx = RunContext(root=str(tmp_path))
    calls, out = [], []
    started = threading.Event()

    def compute():
        calls.append(1)
        started.set()
        time.sleep(0.5)  # long enough for the other writer to arrive while this one computes
        return [_launch_row("a")]

    threads = [threading.Thread(target=lambda: out.append(run_stage("pad", LAUNCH, _KEY, ctx, "m", False, compute)))
               for _ in range(2)]
    threads[0].start()
    started.wait(5)
    threads[1].start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert sorted(m["reused"] for m in out) == [False, True] and out[0]["path"] == out[1]["path"]


def test_an_artifact_built_on_an_incomplete_one_is_incomplete_too(tmp_path):
    """A transient failure upstream (a proxy that failed to compile for lack of disk) must not leave
    a downstream artifact (its candidate skipped) that the next run would reuse."""
    from lospmm.flows.storage.store import valid_sidecar

    ctx = RunContext(root=str(tmp_path))
    built = run_stage("pad", LAUNCH, _KEY, ctx, "m", False, lambda: [_launch_row("a")],
                      {"compile": {"incomplete": True}})
    assert built["incomplete"] and valid_sidecar(tmp_path / built["path"]) is None
    clean = run_stage("pad", LAUNCH, "cd" * 32, ctx, "m", False, lambda: [_launch_row("a")],
                      {"compile": {"incomplete": False}})
    assert not clean["incomplete"] and valid_sidecar(tmp_path / clean["path"]) is not None


def test_a_log_filter_is_installed_once_on_each_run_logger():
    """The run's filters (a stop's crash report, a disk error's traceback, compile units' lines) are each
    installed by one helper: called at every run's set-up, it adds one filter of a kind, not one a run."""
    import logging

    from lospmm.flows.execution.taskio import RUN_LOGGERS, installed

    class Marker(logging.Filter):
        pass

    try:
        installed(Marker)
        installed(Marker)
        for name in RUN_LOGGERS:
            assert sum(isinstance(f, Marker) for f in logging.getLogger(name).filters) == 1
    finally:
        for name in RUN_LOGGERS:
            for f in [f for f in logging.getLogger(name).filters if isinstance(f, Marker)]:
                logging.getLogger(name).removeFilter(f)
