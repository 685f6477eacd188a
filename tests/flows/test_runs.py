"""Run records: written and read back, the latest by default, a run picked by a unique prefix, and the errors."""

from __future__ import annotations

import re

import pytest

from lospmm.flows.storage.runs import run_record, run_records, runs_dir, write_run_record

# run ids sort by time (pipeline.new_run_id: date-time then random hex)
_IDS = ["20250101-090000-aaaaaa", "20250101-100000-bbbbbb", "20250102-080000-bbcccc"]


def _write_all(root):
    for i, run_id in enumerate(_IDS):
        write_run_record(root, {"run_id": run_id, "status": "ok", "n": i, "config": {"sparsity": [0.9]}})


def test_records_round_trip_oldest_first_and_the_latest_is_the_default(tmp_path):
    _write_all(tmp_path)
    records = run_records(tmp_path)
    assert [r["run_id"] for r in records] == _IDS
    assert records[1] == {"run_id": _IDS[1], "status": "ok", "n": 1, "config": {"sparsity": [0.9]}}
    assert run_record(tmp_path)["run_id"] == _IDS[-1]
    assert sorted(p.name for p in runs_dir(tmp_path).iterdir()) == [f"{i}.json" for i in _IDS]  # no temp files


def test_rewriting_a_record_replaces_it(tmp_path):
    # a run writes its record when it starts and again when it ends
    write_run_record(tmp_path, {"run_id": _IDS[0], "status": "running"})
    path = write_run_record(tmp_path, {"run_id": _IDS[0], "status": "completed", "wall_seconds": 1.5})
    assert path == runs_dir(tmp_path) / f"{_IDS[0]}.json"
    assert run_records(tmp_path) == [{"run_id": _IDS[0], "status": "completed", "wall_seconds": 1.5}]


def test_a_unique_prefix_selects_a_run(tmp_path):
    _write_all(tmp_path)
    assert run_record(tmp_path, "20250101-09")["n"] == 0
    assert run_record(tmp_path, "20250102")["run_id"] == _IDS[2]
    assert run_record(tmp_path, _IDS[1])["n"] == 1  # a whole id is a prefix too


@pytest.mark.parametrize("prefix, matches", [("20250101", 2), ("2024", 0)])
def test_an_ambiguous_or_unknown_prefix_lists_recent_runs(tmp_path, prefix, matches):
    _write_all(tmp_path)
    with pytest.raises(LookupError, match=f"matches {matches} runs") as info:
        run_record(tmp_path, prefix)
    assert all(run_id in str(info.value) for run_id in _IDS)


def test_only_the_five_most_recent_runs_are_listed(tmp_path):
    ids = [f"20250101-0{i}0000-abcdef" for i in range(8)]
    for run_id in ids:
        write_run_record(tmp_path, {"run_id": run_id})
    with pytest.raises(LookupError) as info:
        run_record(tmp_path, "nope")
    assert [i for i in ids if i in str(info.value)] == ids[-5:]


def test_no_runs_names_the_runs_dir(tmp_path):
    with pytest.raises(LookupError, match=re.escape(str(tmp_path / "runs"))):
        run_record(tmp_path)
    runs_dir(tmp_path).mkdir()
    with pytest.raises(LookupError, match="no runs"):
        run_record(tmp_path, "2025")  # an empty dir says the same, even with a prefix


def test_an_unreadable_record_is_skipped(tmp_path):
    _write_all(tmp_path)
    (runs_dir(tmp_path) / "20250103-000000-ffffff.json").write_text('{"run_id": "20250103-')  # cut off mid-write
    (runs_dir(tmp_path) / "notes.txt").write_text("not a record")  # not *.json: never read
    assert [r["run_id"] for r in run_records(tmp_path)] == _IDS
    assert run_record(tmp_path)["run_id"] == _IDS[-1]


def test_a_truncated_record_is_named_not_taken_for_no_runs(tmp_path):
    from lospmm.flows.storage.runs import damaged_records

    write_run_record(tmp_path, {"run_id": "20260101-000000-aaaaaa", "status": "completed"})
    good = (runs_dir(tmp_path) / "20260101-000000-aaaaaa.json").read_text()
    (runs_dir(tmp_path) / "20260101-000000-aaaaaa.json").write_text(good[: len(good) // 2])
    with pytest.raises(LookupError, match="no readable run record.*20260101-000000-aaaaaa.json"):
        run_record(tmp_path)
    with pytest.raises(LookupError, match="its record .* is damaged"):
        run_record(tmp_path, "20260101-000000-aa")
    assert [p.name for p, _ in damaged_records(tmp_path)] == ["20260101-000000-aaaaaa.json"]


def test_an_exact_id_wins_over_a_longer_one_it_prefixes(tmp_path):
    write_run_record(tmp_path, {"run_id": "abc"})
    write_run_record(tmp_path, {"run_id": "abcd"})
    assert run_record(tmp_path, "abc")["run_id"] == "abc"


def test_a_run_left_running_by_a_process_that_is_gone_shows_as_killed():
    import os
    import socket
    import subprocess

    from lospmm.flows.storage.runs import RunStatus, process_fields, shown_status

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process now
    here = {"run_id": "r", "status": RunStatus.RUNNING, **process_fields()}
    assert here["pid"] == os.getpid() and shown_status(here) == RunStatus.RUNNING
    assert shown_status({**here, "pid": gone.pid}) == RunStatus.KILLED
    assert shown_status({**here, "pid": gone.pid, "host": socket.gethostname() + "-elsewhere"}) == RunStatus.RUNNING
    assert shown_status({**here, "pid": gone.pid, "status": RunStatus.COMPLETED}) == RunStatus.COMPLETED
    assert shown_status({"run_id": "old", "status": RunStatus.RUNNING}) == RunStatus.RUNNING  # older records


def test_a_records_artifacts_are_found_by_stage_model_and_sparsity():
    from lospmm.flows.storage.runs import artifacts_of

    record = {"entries": [{"stage": "extract", "model": "m", "path": "01/a"},
                          {"stage": "prune", "model": "m", "sparsity": 0.9, "path": "02/b"},
                          {"stage": "prune", "model": "m", "sparsity": 0.7, "path": "02/c"},
                          {"stage": "prune", "model": "n", "sparsity": 0.9, "path": None},  # failed: no artifact
                          {"stage": "emit", "model": "m", "sparsity": 0.9, "path": "10/d"}]}
    assert [e["path"] for e in artifacts_of(record)] == ["01/a", "02/b", "02/c", "10/d"]
    assert [e["path"] for e in artifacts_of(record, "prune", sparsity=0.9)] == ["02/b"]
    assert [e["path"] for e in artifacts_of(record, model="m", sparsity=None)] == ["01/a"]
    assert artifacts_of(record, "prune", model="n") == []


def test_why_a_run_has_no_artifact_of_a_stage_names_the_run_and_the_cause(tmp_path):
    """`lospmm kernel` and lt.sparsify on a run without the stage they read: cancelled before its end
    listed its artifacts, stopped by --until, failed, or simply without it."""
    from lospmm.flows.storage.runs import RunStatus, why_no_artifact

    base = {"run_id": "20260101-000000-abcdef", "entries": [], "config": {"until": "emit"}}
    cancelled = why_no_artifact({**base, "status": RunStatus.CANCELLED}, "emit")
    assert cancelled == ("run 20260101-000000-abcdef was cancelled, and its record lists no artifacts (a run's end "
                         "writes them): run its command again to finish it")
    stopped = {**base, "status": RunStatus.COMPLETED, "config": {"until": "prune"},
               "entries": [{"stage": "prune", "path": "02_pruned/x.parquet"}]}
    assert why_no_artifact(stopped, "reorder") == ("run 20260101-000000-abcdef stopped after prune (--until prune): "
                                                   "it has no reorder artifact")
    assert why_no_artifact(stopped, "prune") == "run 20260101-000000-abcdef has no prune artifact"
    failed = {**stopped, "status": RunStatus.FAILED, "config": {"until": "emit"}}
    assert why_no_artifact(failed, "emit") == "run 20260101-000000-abcdef failed: it has no emit artifact"
