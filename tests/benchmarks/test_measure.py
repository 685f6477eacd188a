"""benchmarks.measure without a GPU: the run of a bundle on the host backend (every kernel checked as
on the device, nothing timed), resumable, a failure a row."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from benchmarks import bundle, measure, sets


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("measure")
    jobs = [sets.planned_job(p) for p in sets.micro_plan(n=4096) if p.layer == "footprint-256"]
    jobs += [sets.planned_job(p) for p in sets.conv_plan(batch=2)[:1]]
    half = sets.half_plan(sparsities=(0.9,), batches=(4,), models=("mobilenetv2",),
                          layers=(("mobilenetv2", "features.1.conv.1"),), variants=("fp16,chained",))
    jobs += [sets.planned_job(p) for p in half]
    return bundle.build("m", jobs, tmp, cache=tmp / "cache", sass=False, with_source=True, say=lambda *_: None)


HOST = measure.RunOptions(backend="host", check_counts=(1, 33))


def test_every_kernel_of_a_bundle_is_checked_in_its_formats_metric_and_nothing_is_timed_on_the_host(built, tmp_path):
    tables = measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    rows = {r["id"]: r for r in pq.read_table(tables["kernel-speed"]).to_pylist()}
    assert all(r["status"] == "checked" and r["ours_us"] != r["ours_us"] for r in rows.values())  # NaN: not timed
    checks = pq.read_table(tables["checks"]).to_pylist()
    assert checks and all(c["status"] == "ok" for c in checks)
    half = [c for c in checks if c["metric"] == "normalised_error"]
    assert half and all(c["normalised_error"] <= c["bound"] for c in half)  # the half kernel: its bound
    conv = [c for c in checks if c["reference"].startswith("numpy conv2d")]
    assert sorted(c["batch"] for c in conv) == [1, 2, 3]  # batches 1, 3 and its own
    gemm = [c for c in checks if c["id"] == "micro-footprint-256-1"]
    assert sorted(c["n"] for c in gemm) == [1, 33, 4096]  # the check counts and its layer's N
    assert "half-precision" in tables and pq.read_table(tables["half-precision"]).num_rows == 1


def test_a_run_cut_off_goes_on_from_what_it_measured(built, tmp_path):
    said = []
    assert measure.run_bundle(built, tmp_path, "m", measure.Deadline.after(0), HOST, said.append) == {}
    assert "stopped at the time budget with 5 launches left" in said[-1]
    log = tmp_path / "m.progress.jsonl"
    measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    lines = log.read_text().splitlines()
    assert len(lines) == 5
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # killed mid-write of the third
    said.clear()
    tables = measure.run_bundle(built, tmp_path, "m", options=HOST, say=said.append)
    assert said[0] == "m: 5 launches, 2 measured before, 3 to go"
    assert pq.read_table(tables["kernel-speed"]).num_rows == 5


def test_a_kernel_that_did_not_compile_or_fails_its_check_is_a_row(built, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(built, broken)
    rows = bundle.bundle_rows(broken)
    pkg = broken / "kernels" / rows[0]["package"]
    text = (pkg / "kernel.cu").read_text().replace("lospmm_st(Cn, 0, N", "(void)(Cn, 0, N")  # row 0 never stored
    (pkg / "kernel.cu").write_text(text)
    from lospmm.files import write_manifest
    from lospmm.kernel.package import KERNEL_FILES

    write_manifest(pkg, KERNEL_FILES)  # a wrong kernel, whole: the check, not the manifest, must catch it
    import pyarrow as pa

    rows[1] |= {"status": "error", "message": "NVRTC failed"}
    pq.write_table(pa.Table.from_pylist(rows), broken / "launches.parquet")
    tables = measure.run_bundle(broken, tmp_path / "out", "m", options=HOST, say=lambda *_: None)
    got = {r["id"]: r for r in pq.read_table(tables["kernel-speed"]).to_pylist()}
    assert got[rows[0]["id"]]["status"] == "failed check" and "never written" in got[rows[0]["id"]]["message"]
    assert got[rows[1]["id"]]["status"] == "not compiled"
    assert sum(r["status"] == "checked" for r in got.values()) == 3


def test_progress_lines_hold_each_launch_and_its_checks(built, tmp_path):
    measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    first = json.loads((tmp_path / "m.progress.jsonl").read_text().splitlines()[0])
    assert set(first) == {"row", "checks"} and first["row"]["id"] == first["checks"][0]["id"]
    assert {"tile_loads", "tile_fmas", "estimate_us", "design", "m1", "n1"} <= set(first["row"])  # a calibration's inputs


def test_an_nm_kernel_of_a_bundle_is_checked_with_its_a_made_again(tmp_path):
    """The nm-spmm set's kernels carry no A: the measurement makes it again from its seed, fills the
    kernel's module data from it and checks the kernel (host backend here, as on the device)."""
    from lospmm.stages.prune import nm_pattern

    plan = sets.nm_spmm_plan(patterns=("nm:8:32:32",), shapes=((64, 128),), tokens=(40,))
    built = bundle.build("nm", [sets.planned_job(p) for p in plan], tmp_path, cache=tmp_path / "cache", sass=False,
                         with_source=True, say=lambda *_: None)
    assert not list((built / "a").iterdir())  # nothing carried
    tables = measure.run_bundle(built, tmp_path / "out", "nm", options=HOST, say=lambda *_: None)
    rows = pq.read_table(tables["kernel-speed"]).to_pylist()
    # the chosen blocking (a deeper stage, gathering B's rows), the 32-column one, that one copying whole
    # chunks, and 2:4 on sparse tensor cores (fp16): each checked with the A made again
    assert sorted(r["variant"] for r in rows) == sorted(p.variant for p in plan) == ["", "mma", "stage-32",
                                                                                     "whole-chunk"]
    for row in rows:
        assert row["status"] == "checked", row["message"]
        assert row["prune"] == ("nm:2:4" if row["variant"] == "mma" else "nm:8:32:32")
        assert row["order"] == "algorithm1"  # the plan's columns the reports group by
        assert sets.nm_tiling_from(nm_pattern(row["prune"]), row["nm"], row["design"]) == sets.nm_tiling_of(
            next(p for p in plan if p.id == row["id"]))  # the row names the blocking it measured
    checks = pq.read_table(tables["checks"]).to_pylist()
    assert sorted(c["n"] for c in checks) == [1] * 4 + [33] * 4 + [40] * 4 and all(c["status"] == "ok" for c in checks)


def test_a_kernel_that_loses_the_cuda_context_is_its_rows_failure_and_the_rest_waits_for_a_fresh_process(
        built, tmp_path, monkeypatch):
    """A kernel's fault (an illegal address, a trap) is sticky: every later launch in the process would
    fail too. Its row records the fault; the launches after it are not recorded as failures but left
    to a fresh process (benchmarks.device starts one), which goes on from there."""
    rows = bundle.bundle_rows(built)
    faulty = rows[1]["id"]
    real = measure.measured_launch
    lost = []

    def launch(bundle_, row, options, baselines):
        result, checks = real(bundle_, row, options, baselines)
        if row["id"] == faulty:
            lost.append("cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS")
            return result | {"status": "error", "ours_us": float("inf"),
                             "message": "CudaError: cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS"}, checks
        return result, checks

    monkeypatch.setattr(measure, "measured_launch", launch)
    monkeypatch.setattr(measure, "lost_context", lambda options, probe=False: lost[0] if lost else "")
    with pytest.raises(measure.ContextLost, match=f"{rows[2]['id']} and the launches after it need a fresh process"):
        measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    done = [d["row"] for d in measure.progress(tmp_path, "m")]
    assert [r["id"] for r in done] == [rows[0]["id"], faulty]
    assert "the CUDA context was lost: cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS" in done[1]["message"]
    lost.clear()  # a fresh process: the fault is this row's, measured; the rest goes on
    monkeypatch.setattr(measure, "measured_launch", real)
    tables = measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    assert [r["id"] for r in pq.read_table(tables["kernel-speed"]).to_pylist()] == [r["id"] for r in rows]


def test_a_sticky_cuda_error_marks_the_context_lost_and_every_later_one_transient(monkeypatch):
    from cuda.bindings import driver

    from lospmm.kernel import cuda

    monkeypatch.setattr(cuda, "_lost", [])
    with pytest.raises(cuda.CudaError) as bad_value:
        cuda._ck((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuMemAlloc")
    assert not bad_value.value.context_lost and not bad_value.value.transient and cuda.context_lost() == ""
    with pytest.raises(cuda.CudaError) as fault:
        cuda._ck((driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "cuCtxSynchronize")
    assert fault.value.context_lost and not fault.value.transient  # the kernel's own failure
    assert cuda.context_lost() == "cuCtxSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS"
    with pytest.raises(cuda.CudaError, match="lost before, at cuCtxSynchronize") as after:
        cuda._ck((driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "cuMemcpyDtoH")
    assert after.value.transient  # says nothing of what it ran: retried, never cached as a result
    from lospmm.flows.execution.taskio import is_transient

    assert is_transient(after.value) and not is_transient(fault.value)


def test_a_launch_whose_kernel_changed_is_measured_again_and_its_new_row_replaces_the_old(built, tmp_path):
    # a step run again after its kernels changed (the N:M kernel's gathered stages) would have kept the
    # old kernels' rows under the same ids: a launch is measured per (id, kernel name)
    measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    path = tmp_path / "m.progress.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    first = lines[0]["row"]["id"]
    lines[0]["row"]["kernel"] = "an_older_kernel"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    said = []
    tables = measure.run_bundle(built, tmp_path, "m", options=HOST, say=said.append)
    assert any("1 to go" in line for line in said)
    rows = pq.read_table(tables["kernel-speed"]).to_pylist()
    assert len(rows) == len(lines) and [r["id"] for r in rows].count(first) == 1
    assert next(r for r in rows if r["id"] == first)["kernel"] != "an_older_kernel"


def test_a_launch_that_did_not_compile_then_and_does_now_is_measured(built, tmp_path):
    # the same kernel name (its text did not change) but a build that failed before: measuring nothing
    # new would leave the step not done for ever
    measure.run_bundle(built, tmp_path, "m", options=HOST, say=lambda *_: None)
    path = tmp_path / "m.progress.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["row"]["status"] = "not compiled"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    said = []
    measure.run_bundle(built, tmp_path, "m", options=HOST, say=said.append)
    assert any("1 to go" in line for line in said)
