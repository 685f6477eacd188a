"""benchmarks.device without a GPU: the program's order, `status` from committed results alone, a
step's bundles prepared (built, packed with their hashes) and found again, stale ones named."""

from __future__ import annotations

import functools
import json

import pytest

from benchmarks import bundle, device


def test_the_program_runs_the_issues_steps_most_valuable_first():
    names = device.STEP_NAMES
    order = ["gate", "designs", "counters", "latency", "staged", "headline-shufflenetv2", "half", "serving", "table4-0.9", "h200-calibration"]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    assert all(s.device_seconds <= device.STEP_LIMIT_S for s in device.STEPS)  # each fits one device command
    assert len(set(names)) == len(names) and device.step_named("half").bundles[0].set == "half"
    with pytest.raises(SystemExit, match="no step 'nope'"):
        device.step_named("nope")


def test_status_reads_the_committed_results_alone(tmp_path):
    results = tmp_path / "results"
    (results / "h100" / "gate").mkdir(parents=True)
    (results / "h100" / "gate" / "done.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3"}))
    (results / "h100" / "designs").mkdir()
    (results / "h100" / "designs" / "ab.progress.jsonl").write_text("{}\n")
    said = []
    rows = {r["step"]: r for r in device.status(results, tmp_path / "home", tmp_path / "carry", said.append)}
    assert rows["gate"]["state"] == "h100: done" and rows["designs"]["state"] == "h100: partial"
    assert rows["counters"]["state"] == "not run" and "ab: missing" in rows["designs"]["bundles"]
    nxt = [line for line in said if line.startswith(">")]
    assert len(nxt) == 1 and nxt[0].split()[1] == "designs"  # the first step not done
    assert any("prepare designs" in line for line in said)
    # and where the targets stand, from the same results: nothing measured here
    assert said[-1].startswith("the issues' targets on the H100: 0 met, 0 not met, 0 met provisionally,")


def _tiny(monkeypatch, tmp_path):
    """A one-bundle step of two small kernels, in the program's place."""
    spec = device.BundleSpec("tiny", "micro", {"n": 1024})
    step = device.Step("tiny", "two micro kernels", "test", (spec,), device_seconds=60)
    monkeypatch.setattr(device, "STEPS", (step,))
    import benchmarks.sets as sets

    real = sets.set_jobs
    monkeypatch.setattr(sets, "set_jobs", lambda name, **o: [j for j in real(name, **o)
                                                             if j.planned.layer == "footprint-256"])
    # without SASS facts: CI has no nvdisasm (the bench extra), and a build that needs it stops at once
    monkeypatch.setattr(device.bundles, "build", functools.partial(device.bundles.build, sass=False))
    return step, spec


def test_a_steps_bundles_are_prepared_once_packed_with_their_hashes_and_found_again(tmp_path, monkeypatch):
    step, spec = _tiny(monkeypatch, tmp_path)
    home, carry = tmp_path / "home", tmp_path / "carry"
    assert device.bundle_state(spec, home, carry)["state"] == "missing"
    said = []
    (listing,) = device.prepare(step, jobs=1, home=home, carry=carry, say=said.append)
    assert json.loads(listing.read_text())["inputs"] == spec.inputs
    state = device.bundle_state(spec, home, carry)
    assert state["state"] == "ready" and state["carried"] and state["kernels"] == 2
    said.clear()
    device.prepare(step, jobs=1, home=home, carry=carry, say=said.append)  # nothing to build or pack again
    assert not any("planning" in line or "archive" in line for line in said)
    # on the GPU machine: the carried archives, checked and unpacked
    (folder,) = device.opened_bundle(spec, carry, tmp_path / "there", build=False, jobs=1, say=said.append)
    assert len(bundle.bundle_rows(folder)) == 2 and folder.parent == tmp_path / "there"


def test_a_build_on_the_gpu_machine_builds_the_launches_never_measured_first(tmp_path, monkeypatch):
    # a done step whose plan grew (the sliced A/B) rebuilds 110 measured kernels before its 33 new
    # ones otherwise: its build stops at a share of the call and measures what it built by then
    from benchmarks import sets

    spec = device.BundleSpec("grown", "micro", {"n": 5})
    ids = [j.planned.id for j in sets.set_jobs("micro", n=5)]
    built = {}
    monkeypatch.setattr(device, "built_within", lambda name, planned, *a, **k: built.setdefault(
        "order", [j.planned.id for j in planned]) and built.setdefault("sass", k["sass"]) is not None and tmp_path)
    said = []
    device.opened_bundle(spec, tmp_path / "carry", tmp_path / "there", build=True, jobs=1, say=said.append,
                         hard_at=1e18, measured=frozenset(ids[:3]))
    assert built["order"] == ids[3:] + ids[:3]
    assert f"grown: the {len(ids) - 3} kernels with launches never measured here first" in said
    # without nvdisasm there, the GPU's time goes on measuring: built without SASS facts, and said so
    from lospmm.kernel import sass

    def missing():
        raise sass.NvdisasmMissing("nvdisasm not found")

    monkeypatch.setattr(sass, "nvdisasm", missing)
    built.clear()
    device.opened_bundle(spec, tmp_path / "carry", tmp_path / "there", build=True, jobs=1, say=said.append,
                         hard_at=1e18)
    assert built["sass"] is False and any(line.startswith("grown: no nvdisasm on this machine") for line in said)


def test_a_bundle_built_from_other_code_is_stale_and_rebuilt(tmp_path, monkeypatch):
    step, spec = _tiny(monkeypatch, tmp_path)
    home, carry = tmp_path / "home", tmp_path / "carry"
    device.prepare(step, jobs=1, home=home, carry=carry, say=lambda *_: None)
    facts = json.loads((home / "tiny" / "bundle.json").read_text())
    (home / "tiny" / "bundle.json").write_text(json.dumps(facts | {"inputs": "0123456789abcdef"}))
    listing = carry / "tiny.parts.json"
    listing.write_text(json.dumps(json.loads(listing.read_text()) | {"inputs": "0123456789abcdef"}))
    state = device.bundle_state(spec, home, carry)
    assert state["state"] == "stale" and state["today"] == spec.inputs
    with pytest.raises(SystemExit, match="tiny: stale"):  # the device refuses yesterday's kernels
        device.opened_bundle(spec, carry, tmp_path / "there", build=False, jobs=1, say=lambda *_: None)
    said = []
    device.prepare(step, jobs=1, home=home, carry=carry, say=said.append)
    assert any("built from other code" in line for line in said)
    assert device.bundle_state(spec, home, carry)["state"] == "ready"


def test_a_devices_results_folder_is_named_for_its_kind():
    assert device.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert device.device_slug("NVIDIA H200") == "h200"
    assert device.device_slug("NVIDIA RTX 6000 Ada") == "nvidia-rtx-6000-ada"


def test_a_lost_cuda_context_starts_the_command_again_with_the_budget_left(monkeypatch):
    from benchmarks import device
    from benchmarks.measure import ContextLost

    started = []
    monkeypatch.setattr(device.os, "execv", lambda exe, args: started.append(args))
    monkeypatch.delenv(device.RESTARTS, raising=False)
    lost = ContextLost("cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS", "ab-12")
    device.restarted(["run", "designs", "--budget-s", "540", "--build"], 300.4, lost)
    assert started[-1][1:] == ["-m", "benchmarks.device", "run", "designs", "--build", "--budget-s", "300"]
    assert device.os.environ[device.RESTARTS] == "1"
    monkeypatch.setenv(device.RESTARTS, str(device.MAX_RESTARTS))
    with pytest.raises(SystemExit) as out:  # a kernel that keeps faulting does not loop: exit 75, go on by hand
        device.restarted(["next"], 300, lost)
    assert out.value.code == 75 and len(started) == 1
    monkeypatch.setenv(device.RESTARTS, "0")
    with pytest.raises(SystemExit):  # too little time left to start again
        device.restarted(["next"], 20, lost)


def test_counters_profile_each_part_of_a_bundle_that_travels_in_parts(tmp_path, monkeypatch):
    # the A/B bundle travels as 3 archives: the best and worst kernels are found in whichever part holds
    # them and their counters land in one table (the first device run unpacked 3 folders into 1 and failed)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks import kernel_counters
    from benchmarks.measure import Deadline

    out = tmp_path / "h200" / "counters"
    out.mkdir(parents=True)
    ids = [f"k{i}" for i in range(12)]
    rows = [{"id": i, "status": "ok", "ours_us": 1.0 + n, "sgemm_us": 10.0, "nnz": 100, "m": 8, "k": 8, "n": 8}
            for n, i in enumerate(ids)]
    (out.parent / "designs").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), out.parent / "designs" / "kernel-speed-ab.parquet")
    parts = []
    for p, chunk in enumerate((ids[:5], ids[5:9], ids[9:])):
        folder = tmp_path / f"part{p}"
        folder.mkdir()
        pq.write_table(pa.Table.from_pylist([{"id": i} for i in chunk]), folder / "launches.parquet")
        parts.append(folder)
    monkeypatch.setattr(device, "opened_bundle", lambda *a, **k: parts)
    monkeypatch.setattr(device, "CARRY", tmp_path / ".gpu")  # no listing: the bundle is here whole
    monkeypatch.setattr(device, "bundle_here", lambda *a, **k: True)
    asked = []

    def profile(argv):
        folder, there, listed = argv[1], argv[2], argv[argv.index("--ids") + 1:argv.index("--timeout-s")]
        held = {r["id"] for r in pq.read_table(f"{folder}/launches.parquet").to_pylist()}
        assert set(listed) <= held  # each part is asked only for the kernels it holds
        asked.extend(listed)
        kernel_counters.write_counters([kernel_counters._row(i, "k", "ok", "") for i in listed], tmp_path / there)

    monkeypatch.setattr(kernel_counters, "main", profile)
    assert device._counters(device.step_named("counters"), out, Deadline.after(100), print)
    assert sorted(asked) == sorted(ids[:5] + ids[-5:])  # the five worst and five best by efficiency
    assert sorted(r["id"] for r in pq.read_table(out / "counters.parquet").to_pylist()) == sorted(asked)


def test_next_goes_on_past_the_steps_this_kind_of_gpu_already_measured(tmp_path):
    # an H200 window after another: the gate and designs it measured are not run again; an H100 window
    # still runs them (the targets are the H100's). No bundles carried: the work tree's .gpu/ is not read
    results, carry = tmp_path / "results", tmp_path / "carry"
    for step in ("gate", "designs"):
        (results / "h200" / step).mkdir(parents=True)
        (results / "h200" / step / "done.json").write_text("{}")
    ran = []
    device.next_steps(1e6, here="h200", results=results, carry=carry,
                       run=lambda step, *a, **k: ran.append(step.name))
    assert ran[:2] == ["counters", "latency"] and "gate" not in ran and "designs" not in ran
    # issue 30's own steps first, the later issues' after them
    assert ran.index("h200-calibration") < ran.index("designs-held-out") < ran.index("reorder") < ran.index("nm")
    ran.clear()
    device.next_steps(1e6, here="h100", results=results, carry=carry,
                       run=lambda step, *a, **k: ran.append(step.name))
    assert ran[:3] == ["gate", "designs", "counters"]


def test_a_step_that_needs_the_wheels_installs_them_with_this_python_or_says_what_to_carry(tmp_path):
    # on the GPU image `pip` on PATH belonged to another Python: the install must be this one's
    import sys

    asked = []
    with pytest.raises(SystemExit, match="no wheels carried"):
        device.with_wheels(tmp_path, modules=("no_such_module_xyz",), install=asked.append)
    assert asked == []
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(SystemExit, match="left no_such_module_xyz"):
        device.with_wheels(tmp_path, modules=("no_such_module_xyz",), install=asked.append)
    (cmd,) = asked
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and "--no-index" in cmd and "lightgbm" in cmd
    device.with_wheels(tmp_path, modules=("json",), install=asked.append)  # nothing missing: nothing installed
    assert len(asked) == 1


def test_the_reports_group_rows_measured_before_they_carried_their_plan_columns():
    # the H200's reorder and nm-spmm rows of 2026-11-26 lack `order` and `prune`: the report crashed on them
    from benchmarks import analysis, sets

    plan = sets.reorder_plan()[:3]
    rows = [{"id": p.id, "set": "reorder", "role": "full", "model": p.model, "layer": p.layer, "ours_us": 10.0 + i,
             "spread": 0.01} for i, p in enumerate(plan)]
    filled = device.with_plan_columns(rows)
    assert [r["order"] for r in filled] == ["identity", "algorithm1", "kept"]
    (row,), _ = analysis.reorder_summary(filled, {})
    assert row["kept_over_alg1"] == 12.0 / 11.0
    nm = sets.nm_spmm_plan()[0]
    (filled,) = device.with_plan_columns([{"id": nm.id, "set": "nm-spmm"}])
    assert filled["prune"] == nm.prune and nm.prune.startswith("nm:")
    kept = {"id": nm.id, "set": "nm-spmm", "order": "x", "prune": "nm:4:32:32", "epilogue": ""}  # has them all
    assert device.with_plan_columns([kept]) == [kept]  # a row that has them keeps its own


def test_a_windows_calls_fit_the_carry_and_the_call_limit_and_say_what_they_leave_out(tmp_path, monkeypatch):
    # the first windows worked out by hand which bundles could travel together (ab and the wheels could
    # not): `window` plans the calls from what is prepared
    mib = 2**20
    specs = {n: device.BundleSpec(n, "micro", {"n": i}) for i, n in enumerate(("b1", "b2", "b3", "b4", "b5"), 1)}
    steps = (device.Step("s1", "", "", (specs["b1"], specs["b5"]), device_seconds=100),
             device.Step("s2", "", "", (specs["b2"],), device_seconds=100),
             device.Step("done-here", "", "", (specs["b3"],), device_seconds=100),
             device.Step("unprepared", "", "", (specs["b4"],), device_seconds=100),
             device.Step("wheeled", "", "", runner=lambda *a: True, device_seconds=100, needs=("wheels",)),
             device.Step("reader", "", "", runner=lambda *a: True, device_seconds=100, reads=("s1",), opens=("b1",)),
             device.Step("orphan", "", "", runner=lambda *a: True, device_seconds=100, reads=("unprepared",)),
             device.Step("long", "", "", runner=lambda *a: True, device_seconds=540))
    monkeypatch.setattr(device, "STEPS", steps)
    carry, results, wheels = tmp_path / ".gpu", tmp_path / "results", tmp_path / ".whl"
    carry.mkdir()
    for name, size in (("b1", 30), ("b2", 30), ("b3", 1), ("b5", 1)):
        (carry / f"{name}.tar.xz").write_bytes(b"")
        (carry / f"{name}.parts.json").write_text(json.dumps(
            {"inputs": specs[name].inputs, "parts": [{"file": f"{name}.tar.xz", "bytes": size * mib}]}))
    wheels.mkdir()
    (wheels / "w.whl").write_bytes(b"x" * (40 * mib))
    (results / "h200" / "done-here").mkdir(parents=True)
    (results / "h200" / "done-here" / "done.json").write_text("{}")
    (results / "h200" / "done-here" / "b3.progress.jsonl").write_text("".join(  # every launch today's code plans
        json.dumps({"row": {"id": i}}) + "\n" for i in device.planned_launches(specs["b3"], tmp_path / "home")))
    calls, left_out = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, wheels)
    assert [c.steps for c in calls] == [("s1",), ("s2",), ("wheeled",), ("reader",)]
    assert all(c.carry_bytes <= device.CARRY_LIMIT for c in calls)
    assert calls[0].carry == (".gpu/b1.parts.json", ".gpu/b1.tar.xz", ".gpu/b5.parts.json", ".gpu/b5.tar.xz")
    assert calls[2].carry == (".whl",)
    assert calls[3].carry == (".gpu/b1.parts.json", ".gpu/b1.tar.xz")  # the reader opens what it reads, only
    assert "run s1 --budget-s" in calls[0].command and "--pack $OUT/results.tgz" in calls[0].command
    # tar's exit 1 (a file changed as it read it) still keeps the archive, as it did before
    assert ("tar czf $OUT/results.tgz.part benchmarks/results; [ $? -le 1 ] && mv $OUT/results.tgz.part "
            "$OUT/results.tgz;") in calls[0].command
    said = "\n".join(left_out)
    assert "unprepared: prepare b4 first" in said and "orphan: reads unprepared" in said
    assert "long: about 540 s, past the window's 900 s" in said and "done-here" not in said
    again, _ = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, wheels,
                                   again=("done-here",))
    assert any("done-here" in c.steps for c in again)  # its kernels changed: measured again
    # a window with nothing prepared for a step can still build it on the GPU machine's cores
    built, left_out = device.window_calls("h200", 3000, 5 * mib, results, tmp_path / "home", carry, wheels,
                                          build_there=True)
    (call,) = [c for c in built if "unprepared" in c.steps]
    assert call.builds == ("unprepared",) and ".whl" in call.carry and not any("b4" in c for c in call.carry)
    assert "run unprepared --budget-s $(($(left) - 15)) --pack $OUT/results.tgz --build --jobs 16; pack" in call.command
    assert "run s1 --budget-s $(($(left) - 15)) --pack $OUT/results.tgz; pack" in built[0].command  # measured, not built
    assert not any("unprepared" in line for line in left_out)
    assert any("orphan" in c.steps for c in built)  # what it reads is in the window now


def test_a_window_counts_the_waits_between_its_calls(tmp_path, monkeypatch):
    """Idle time between calls counts against a window: calls that fit only without those waits are
    left out, the last first (the program's order keeps its first steps)."""
    mib = 2**20
    specs = [device.BundleSpec(f"b{i}", "micro", {"n": i}) for i in range(4)]
    monkeypatch.setattr(device, "STEPS", tuple(device.Step(f"s{i}", "", "", (b,), device_seconds=190)
                                               for i, b in enumerate(specs)))
    carry = tmp_path / ".gpu"
    carry.mkdir()
    for b in specs:  # each its own call: two do not fit one call's carry
        (carry / f"{b.name}.tar.xz").write_bytes(b"")
        (carry / f"{b.name}.parts.json").write_text(json.dumps(
            {"inputs": b.inputs, "parts": [{"file": f"{b.name}.tar.xz", "bytes": 40 * mib}]}))
    # 4 calls of 205 s: 40 + 820 = 860 s fits 900 without the waits, not with 3 × 20 s of them
    calls, left_out = device.window_calls("h100", 900, 5 * mib, tmp_path / "results", tmp_path / "home", carry,
                                          tmp_path / ".whl")
    assert [c.steps for c in calls] == [("s0",), ("s1",), ("s2",)]
    assert left_out == ["s3: its call (about 205 s) is past the window's 900 s with 20 s between calls"]


def test_a_step_whose_kernels_all_failed_to_compile_is_not_done():
    # a stand-in Prefect on the GPU machine made every kernel of the conv set an error, and the step
    # wrote done.json: next would never have run it again
    said = []
    failed = [{"row": {"id": f"k{i}", "status": "not compiled"}} for i in range(3)]
    assert device.none_compiled(failed, said.append) and "none of the 3 kernels compiled" in said[0]
    assert not device.none_compiled(failed + [{"row": {"id": "k3", "status": "ok"}}], said.append)
    assert not device.none_compiled([], said.append)


def test_a_bundle_too_large_for_one_call_goes_a_part_per_call_and_its_listing_names_each_parts_launches(
        tmp_path, monkeypatch):
    # the A/B bundle (56.7 MiB in 3 parts) and the grown checkout (7.2 MiB) no longer fit one call with
    # the micro bundle: the step is run in two calls, each measuring what it carries
    mib = 2**20
    spec = device.BundleSpec("big", "micro", {"n": 7})
    monkeypatch.setattr(device, "STEPS", (device.Step("big", "", "", (spec,), device_seconds=200),))
    carry = tmp_path / ".gpu"
    carry.mkdir()
    parts = [{"file": f"big-{i}of2.tar.xz", "bytes": 35 * mib, "launches": [[f"k{i}", "name"]]} for i in (1, 2)]
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    calls, left_out = device.window_calls("h100", 900, 5 * mib, tmp_path / "results", tmp_path / "home", carry,
                                          tmp_path / ".whl")
    assert [c.steps for c in calls] == [("big",), ("big",)] and not left_out
    assert calls[0].carry == (".gpu/big.parts.json", ".gpu/big-1of2.tar.xz")
    assert calls[1].carry == (".gpu/big.parts.json", ".gpu/big-2of2.tar.xz")
    assert all(c.carry_bytes <= device.CARRY_LIMIT for c in calls)
    assert device._listed_keys(carry / "big.parts.json") == {("k1", "name"), ("k2", "name")}


def test_a_packed_listing_names_each_parts_launches(tmp_path):
    from benchmarks import bundle, pack, sets

    jobs = [sets.planned_job(p) for p in sets.micro_plan(n=4096) if p.layer == "footprint-256"]
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    pack.packed_parts(folder, tmp_path / "carry", max_mib=0.005, ratio=1.0)  # a kernel a part
    listing = json.loads((tmp_path / "carry" / "b.parts.json").read_text())
    rows = bundle.bundle_rows(folder)
    assert sorted(tuple(k) for q in listing["parts"] for k in q["launches"]) == sorted((r["id"], r["kernel"]) for r in rows)
    assert all(len(q["launches"]) == 1 for q in listing["parts"])


def test_a_bundle_carried_part_by_part_is_complete_once_every_parts_launches_are_measured(tmp_path):
    spec = device.BundleSpec("big", "micro", {"n": 7})
    out, carry, later = tmp_path / "h100" / "designs", tmp_path / ".gpu", tmp_path / "next-call"
    out.mkdir(parents=True)
    carry.mkdir()
    later.mkdir()
    parts = [{"file": f"big-{i}of2.tar.xz", "bytes": 1, "launches": [[f"k{i}", f"kernel{i}"]]} for i in (1, 2)]
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    (carry / "big-1of2.tar.xz").write_bytes(b"")  # this call carries the first part only
    progress = out / "big.progress.jsonl"
    progress.write_text(json.dumps({"row": {"id": "k1", "kernel": "kernel1"}, "checks": []}) + "\n")
    assert not device.carried_complete(spec, out, carry)  # k2 is in the other part
    progress.write_text(progress.read_text() + json.dumps({"row": {"id": "k2", "kernel": "old"}, "checks": []}) + "\n")
    assert not device.carried_complete(spec, out, carry)  # k2 measured, but another kernel of it
    progress.write_text(progress.read_text() + json.dumps({"row": {"id": "k2", "kernel": "kernel2"}, "checks": []}) + "\n")
    assert device.carried_complete(spec, out, carry)
    assert device.carried_complete(spec, out, later)  # a later call carrying none of it reads what this one kept
    assert not device.carried_complete(spec, tmp_path / "elsewhere", later)  # nothing says what it holds


def test_a_window_call_whose_step_overruns_its_budget_still_packs_and_ends_at_the_calls_time(tmp_path):
    # on 2026-11-26 a build ran past its step's budget, the call hit its limit before `pack`, and 570 s
    # brought nothing back: each step now runs under `timeout` at the call's end
    import os
    import subprocess
    import tarfile
    import time

    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    # both steps overrun: the first past the call's end; the second, started with no time left (where
    # `timeout 0` would mean no limit), writes its result and overruns too
    fake = bin_dir / "python"
    fake.write_text('#!/bin/sh\ncase "$*" in *"run slow"*) sleep 60;; *) echo measured > benchmarks/results/late; '
                    'sleep 60;; esac\n')
    fake.chmod(0o755)
    call = device.DeviceCall(("slow", "late"), (), 0, 0.0)
    command = call.command.replace(f"B={int(device.STEP_LIMIT_S)};", "B=4;", 1)
    assert command != call.command
    started = time.monotonic()
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=False, timeout=50,
                   env=os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)})
    assert time.monotonic() - started < 20
    with tarfile.open(out / "results.tgz") as tar:  # packed after the second step too
        assert "benchmarks/results/late" in tar.getnames()


def test_a_build_on_the_gpu_machine_is_stopped_at_its_hard_time_with_what_it_finished_kept(tmp_path):
    # a kernel started before the soft stop once compiled for 400-500 s, past the command's limit:
    # the build runs in a child that is killed at its hard time, and what it finished is measured
    import dataclasses
    import time

    from benchmarks import sets

    jobs, said = [sets.planned_job(p) for p in sets.micro_plan(n=4096) if p.layer == "footprint-256"][:2], []

    def never_renders():
        time.sleep(600)

    stuck = dataclasses.replace(jobs[1], planned=dataclasses.replace(jobs[1].planned, id="stuck"),
                                source=never_renders)
    started = time.monotonic()  # the child builds the first kernel (seconds) beside the one that never ends
    folder = device.built_within("b", [jobs[0], stuck], tmp_path, 2, hard_at=started + 20, cache=tmp_path / "cache",
                                 sass=False, say=said.append, stop_at=started + 60)
    assert time.monotonic() - started < 45
    assert [r["id"] for r in bundle.bundle_rows(folder)] == [jobs[0].planned.id]  # the child's work, kept
    assert bundle.package_of(folder, bundle.bundle_rows(folder)[0]).cubin()[:4] == b"\x7fELF"
    assert bundle.bundle_facts(folder) == {}  # unfinished: the next build goes on
    assert any("stopping the kernels still compiling" in line for line in said)
    folder = device.built_within("b", jobs, tmp_path, 2, hard_at=time.monotonic() + 120, cache=tmp_path / "cache",
                                 sass=False, say=lambda *_: None)
    assert bundle.bundle_facts(folder)["kernels"] == 2  # a build that finishes in time is the whole bundle


def test_a_build_child_that_dies_leaves_what_it_finished_measured_and_says_so(tmp_path):
    import dataclasses
    import time

    from benchmarks import sets

    jobs, said = [sets.planned_job(p) for p in sets.micro_plan(n=4096) if p.layer == "footprint-256"][:2], []

    def dies():
        raise SystemExit("the child's end")  # not a kernel's failure (those are rows): the build itself stops

    dead = dataclasses.replace(jobs[1], planned=dataclasses.replace(jobs[1].planned, id="dead"), source=dies)
    folder = device.built_within("b", [jobs[0], dead], tmp_path, 1, hard_at=time.monotonic() + 120,
                                 cache=tmp_path / "cache", sass=False, say=said.append)
    assert any("stopped with exit code 1" in line for line in said)
    assert [r["id"] for r in bundle.bundle_rows(folder)] == [jobs[0].planned.id] and bundle.bundle_facts(folder) == {}


def test_a_steps_observed_time_is_its_last_finished_run_and_none_after_a_run_cut_off(tmp_path):
    # the H200's serving was cut off at 140 s of its 540 and `window` then planned it as a 155 s step
    step = device.Step("s", "", "", device_seconds=540)
    log = tmp_path / "h200" / "s" / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text("10:00:00 step s on NVIDIA H200: x\n10:09:00 step s: done\n"  # an older, longer run
                   "11:00:00 step s on NVIDIA H200: x\n11:00:20 a line\n11:00:30 step s: done\n")
    assert device.observed_seconds(step, tmp_path) == 30.0
    with log.open("a") as f:
        f.write("12:00:00 step s on NVIDIA H200: x\n12:02:20 step s: not finished in the budget; run it again\n")
    assert device.observed_seconds(step, tmp_path) is None


def test_the_serving_step_searches_its_models_on_the_estimate_and_keeps_what_a_cut_off_model_finished(
        tmp_path, monkeypatch):
    # BERT's search on the cuda timer compiles and times ten proxies a layer: more than one command
    import subprocess

    from benchmarks.measure import Deadline

    ran = []

    def fake_run(command, **kwargs):
        ran.append(command[2:])
        if "fp16" in command:
            raise subprocess.TimeoutExpired(command, kwargs["timeout"])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(device.subprocess, "run", fake_run)
    said = []
    assert device._serving(None, tmp_path, Deadline.after(100), said.append) is False  # fp16 cut off: not done
    assert ran[0][0] == "benchmarks.launch_overhead"
    assert all(args[0] != "benchmarks.end_to_end" or args[1:3] == ["--timer", "estimate"] for args in ran)
    assert len(ran) == 3 and any("stopped at the time budget" in line for line in said)


def test_a_step_never_run_is_expected_to_take_its_launches_at_the_measured_rate(tmp_path):
    # the planner took each headline step for its whole budget, and two ran 186 launches in 63 s
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = device.BundleSpec("b", "micro", {"n": 3})
    step = device.Step("s", "", "", (spec,), device_seconds=540)
    carry, results = tmp_path / ".gpu", tmp_path / "results"
    carry.mkdir()
    (results / "h200" / "other").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"set": "other", "seconds": 1.0 if i < 26 else 9.0} for i in range(30)]),
                   results / "h200" / "other" / "kernel-speed-x.parquet")
    assert device.expected_seconds(step, carry, results) == 540  # no listing: its budget
    parts = [{"file": "b.tar.xz", "launches": [[f"k{i}", "n"] for i in range(30)]}]
    (carry / "b.parts.json").write_text(json.dumps({"inputs": "another code's", "parts": parts}))
    assert device.expected_seconds(step, carry, results) == 540  # a stale listing: its budget
    (carry / "b.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    # a set never measured: every set's median (1 s), not their 90th percentile (9 s), which the slow
    # sweeps set (a Table 4 launch took 0.3 s where it planned 1.8)
    assert device.expected_seconds(step, carry, results) == 60 + 30 * 1.0
    pq.write_table(pa.Table.from_pylist([{"set": "micro", "seconds": 0.5} for _ in range(20)]),
                   results / "h200" / "other" / "kernel-speed-micro.parquet")
    assert device.expected_seconds(step, carry, results) == 60 + 30 * 0.5  # its own set's launches, measured
    parts[0]["launches"] = [[f"k{i}", "n"] for i in range(3000)]
    (carry / "b.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    assert device.expected_seconds(step, carry, results) == 540  # never more than its budget ...
    assert device.expected_seconds(step, carry, results, cap=False) == 60 + 3000 * 0.5  # ... but where asked
    runner = device.Step("r", "", "", runner=lambda *a: True, device_seconds=300)
    assert device.expected_seconds(runner, carry, results) == 300


def test_every_committed_steps_report_prints_its_tables(capsys):
    # a report that crashed on committed rows (KeyError 'order' once) hid the measured figures
    device.report()
    printed = capsys.readouterr().out
    for title in ("== designs on h200", "== designs on h100", "== headline-mobilenetv2 on h200", "== conv on h200",
                  "A/B: each design's time", "each design against the baseline", "the default by issue 30's rule: ",
                  "against cuBLAS", "by the estimate's largest term", "implicit-im2col convolutions",
                  "row orders, same tile and design", "NM-SpMM's shapes", "== counters on h100 (done): 10 kernels",
                  "== serving on h200 (partial): launch-overhead", "what the depth alone saves"):
        assert title in printed, title


def test_a_done_step_measured_again_and_cut_off_is_partial_again(tmp_path, monkeypatch):
    """A step run again (its kernels changed: window --again) keeps done.json only if it finishes:
    cut off, its folder holds old and new launches, and the verdict must not read it as finished."""
    monkeypatch.setattr(device, "env_facts", lambda: {"name": "NVIDIA H100 80GB HBM3"})
    finished = {"value": False}
    step = device.Step("again", "a step", "30", runner=lambda *a: finished["value"])
    folder = tmp_path / "h100" / "again"
    folder.mkdir(parents=True)
    (folder / "done.json").write_text("{}")
    device.run_step(step, budget_s=5, results=tmp_path)
    assert not (folder / "done.json").exists()
    finished["value"] = True
    device.run_step(step, budget_s=5, results=tmp_path)
    assert (folder / "done.json").exists()


def test_a_done_step_whose_plan_grew_is_not_done_before_its_bundle_is_prepared(tmp_path, monkeypatch):
    """Session 17 added three sliced designs to the A/B, whose step counted as done on both GPUs: the
    planner saw new launches only in a prepared bundle's listing, so a window on a fresh machine would
    have skipped them. Today's plan (ids, no compile; kept by its inputs hash) tells them."""
    from benchmarks import sets

    spec = device.BundleSpec("ab", "micro", {"n": 5})
    step = device.Step("designs", "", "", (spec,), device_seconds=100)
    monkeypatch.setattr(device, "STEPS", (step,))
    home, carry, results = tmp_path / "home", tmp_path / ".gpu", tmp_path / "results"
    planned = device.planned_launches(spec, home)
    assert planned == [j.planned.id for j in sets.set_jobs("micro", n=5)] and len(planned) > 2
    out = results / "h100" / "designs"
    out.mkdir(parents=True)
    (out / "done.json").write_text("{}")
    (out / "ab.progress.jsonl").write_text("".join(json.dumps({"row": {"id": i}}) + "\n" for i in planned[:-2]))
    said = []
    device.status(results, home, carry, say=said.append)
    assert said[0].startswith("> designs") and "h100: done, 2 launches new since" in said[0], said
    assert "prepare designs" in said[2]
    _, left_out = device.window_calls("h100", 900, 2**20, results, home, carry, tmp_path / ".whl")
    assert any(line.startswith("designs: prepare ab first") for line in left_out), left_out
    # the plan is kept: asked again, it is not made again; one plan a bundle (another code's goes)
    other = device.BundleSpec("ab", "micro", {"n": 3})
    device.planned_launches(other, home)
    assert sorted(p.name for p in (home / "plans").iterdir()) == [f"ab-{other.inputs}.json"]
    device.planned_launches(spec, home)
    monkeypatch.setattr(sets, "set_jobs", lambda *a, **k: pytest.fail("planned again"))
    assert device.planned_launches(spec, home) == planned
    (out / "ab.progress.jsonl").write_text("".join(json.dumps({"row": {"id": i}}) + "\n" for i in planned))
    said.clear()
    device.status(results, home, carry, say=said.append)
    assert "h100: done " in said[0] + " " and "every step is done" in said
    # a plan that cannot be made (today's code broken) is said, and status goes on from the results
    monkeypatch.setattr(sets, "set_jobs", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no tiles file")))
    monkeypatch.setattr(device, "STEPS", (device.Step("designs", "", "", (device.BundleSpec("ab", "micro", {"n": 6}),)),))
    said.clear()
    device.status(results, home, carry, say=said.append)
    assert "ab: today's plan could not be made (RuntimeError: no tiles file); its new launches are not told" in said
    assert "every step is done" in said


def test_a_step_done_on_older_kernels_is_planned_again_carrying_only_the_parts_it_has_not_measured(
        tmp_path, monkeypatch):
    # on 2026-11-27 the H200 window skipped ShuffleNetV2's and MobileNetV2's headline as done there,
    # measured on the ranker's old choices: the retrained ranker's kernels were never measured
    mib = 2**20
    spec = device.BundleSpec("big", "micro", {"n": 7})
    step = device.Step("big", "", "", (spec,), device_seconds=200)
    monkeypatch.setattr(device, "STEPS", (step,))
    carry, results = tmp_path / ".gpu", tmp_path / "results"
    carry.mkdir()
    parts = [{"file": f"big-{i}of3.tar.xz", "bytes": 35 * mib, "launches": [[f"k{i}", f"kernel{i}"]]} for i in (1, 2, 3)]
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    out = results / "h200" / "big"
    out.mkdir(parents=True)
    (out / "done.json").write_text("{}")
    rows = [{"id": "k1", "kernel": "kernel1"}, {"id": "k2", "kernel": "older"}, {"id": "k3", "kernel": "kernel3"}]
    (out / "big.progress.jsonl").write_text("".join(json.dumps({"row": r}) + "\n" for r in rows))
    window = lambda kind: device.window_calls(kind, 900, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    calls, _ = window("h200")
    assert [c.carry for c in calls] == [(".gpu/big.parts.json", ".gpu/big-2of3.tar.xz")]  # k2 alone changed
    assert device.unmeasured_parts(step, "h200", carry, results) == {"big": {1}}
    said = []
    device.status(results, tmp_path / "home", carry, say=said.append)
    assert "h200: done, on older kernels" in said[0]
    # once measured there, it is done again; a listing that names no launches tells nothing: done stays done
    (out / "big.progress.jsonl").write_text((out / "big.progress.jsonl").read_text()
                                            + json.dumps({"row": {"id": "k2", "kernel": "kernel2"}}) + "\n")
    assert window("h200")[0] == [] and device.unmeasured_parts(step, "h200", carry, results) == {"big": set()}
    # (by id, then, from today's plan: every one measured here)
    (out / "big.progress.jsonl").write_text("".join(json.dumps({"row": {"id": i}}) + "\n"
                                                    for i in device.planned_launches(spec, tmp_path / "home")))
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": [
        {"file": "big.tar.xz", "bytes": mib}]}))
    assert device.unmeasured_parts(step, "h200", carry, results) is None and window("h200")[0] == []
    # a step cut off (not done) carries the parts it has not measured, too; an H100 window all of them
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    (out / "done.json").unlink()
    (out / "big.progress.jsonl").write_text(json.dumps({"row": rows[0]}) + "\n")
    assert [c.carry for c in window("h200")[0]] == [(".gpu/big.parts.json", ".gpu/big-2of3.tar.xz"),
                                                    (".gpu/big.parts.json", ".gpu/big-3of3.tar.xz")]
    assert len(window("h100")[0]) == 3
    # every launch measured, the step not done (killed before its tables and done.json): it finishes
    # from its progress, carrying its smallest part, not nothing
    (out / "big.progress.jsonl").write_text("".join(json.dumps({"row": {"id": f"k{i}", "kernel": f"kernel{i}"}}) + "\n"
                                                    for i in (1, 2, 3)))
    parts[2]["bytes"] = mib
    (carry / "big.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    assert [c.carry for c in window("h200")[0]] == [(".gpu/big.parts.json", ".gpu/big-3of3.tar.xz")]


def test_a_step_packs_its_results_as_it_goes_so_a_killed_call_brings_back_what_it_measured(tmp_path, monkeypatch):
    # on 2026-11-27 a call whose device limit (480 s) was under its command's (540 s) was killed before
    # `pack`: 7 minutes of Table 4 launches came back as nothing
    import os
    import signal
    import subprocess
    import sys
    import tarfile
    import time

    results, dest = tmp_path / "benchmarks" / "results", tmp_path / "out" / "results.tgz"
    results.mkdir(parents=True)
    dest.parent.mkdir()
    script = ("import sys, time; from pathlib import Path; from benchmarks.device import ResultsPacker\n"
              f"results = Path({str(results)!r})\n"
              f"with ResultsPacker(Path({str(dest)!r}), results, every_s=0.2):\n"
              "    (results / 'measured').write_text('1'); print('written', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], cwd=device.ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written"
        deadline = time.monotonic() + 20
        while not dest.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        os.kill(child.pid, signal.SIGKILL)  # as the device tool kills a call at its limit: no `finally` runs
        child.wait()
    with tarfile.open(dest) as tar:  # a whole archive (never a part: each pack replaces it), with the file
        assert "results/measured" in tar.getnames()
    # a kill mid-pack leaves at most the one part beside the archive, under the name the shell's pack uses
    assert {p.name for p in dest.parent.iterdir()} <= {"results.tgz", "results.tgz.part"}
    # the last pack at the end holds what the step wrote last; no archive is asked for, none is written
    with device.ResultsPacker(dest, results, every_s=60):
        (results / "last").write_text("1")
    with tarfile.open(dest) as tar:
        assert "results/last" in tar.getnames()
    with device.ResultsPacker(None, results):
        pass
    # a pack that fails at the end says so and never stands in for the step's own error
    said = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: said.append(" ".join(map(str, a))))
    with pytest.raises(KeyError):
        with device.ResultsPacker(tmp_path / "no-such-folder" / "results.tgz", results, every_s=60):
            raise KeyError("the step's own error")
    assert said and said[0].startswith("packing the results into")


def test_the_window_says_the_device_tools_limit_each_call_needs(monkeypatch):
    call = device.DeviceCall(("s",), (), 0, 10.0)
    assert call.timeout_s > device.STEP_LIMIT_S and f"B={int(device.STEP_LIMIT_S)};" in call.command
    monkeypatch.setattr(device, "window_calls", lambda *a, **k: ([call], []))
    monkeypatch.setattr(device, "checkout_bytes", lambda: 0)
    said = []
    device.print_window("h100", 900, say=said.append)
    assert any(line.startswith(f"  timeout_s: {call.timeout_s} ") for line in said)


def test_the_headline_counters_profile_the_largest_layers_carrying_only_the_parts_that_hold_them(tmp_path, monkeypatch):
    # ncu on BERT's FFN and ResNet-50's layer4 at 0.9, batch 32: two of the 7 ResNet-50 parts travel
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks import kernel_counters
    from benchmarks.measure import Deadline

    mib = 2**20
    step = device.step_named("counters-headline")
    reads = [device.step_named(n) for n in step.reads]
    monkeypatch.setattr(device, "STEPS", (*reads, step))
    results, carry = tmp_path / "results", tmp_path / ".gpu"
    carry.mkdir()

    def launch(model, layer, sparsity=0.9, batch=32):
        return {"id": f"head-{model}-{layer}-{sparsity}-{batch}", "model": model, "layer": layer, "sparsity": sparsity,
                "batch": batch, "status": "ok", "sgemm_us": 100.0, "ours_us": 50.0}

    wanted = [launch(model, layer) for model, layer in device.LARGEST_LAYERS]
    others = [launch("resnet50", "layer1.0.conv1"), launch("resnet50", "layer4.0.conv2", batch=4),
              launch("bert-base", "encoder.layer.0.output.dense", sparsity=0.7)]
    by_step = {"headline-resnet50": [r for r in wanted + others if r["model"] == "resnet50"],
               "headline-bert-base": [r for r in wanted + others if r["model"] == "bert-base"]}
    for name, rows in by_step.items():
        spec = device.step_named(name).bundles[0]
        # a part per launch, the picked ones in the second and third of ResNet-50's and BERT's only part
        parts = [{"file": f"{name}-{i + 1}of{len(rows)}.tar.xz", "bytes": mib, "launches": [[r["id"], "k"]]}
                 for i, r in enumerate(sorted(rows, key=lambda r: r in wanted))]
        (carry / f"{spec.name}.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
        for q in parts:
            (carry / q["file"]).write_bytes(b"")
    # the headline planned in this window, not yet measured: nothing to pick from
    calls, left_out = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    assert not any("counters-headline" in c.steps for c in calls)
    assert any(line.startswith("counters-headline: picks its kernels from headline-resnet50, headline-bert-base")
               for line in left_out)
    for name, rows in by_step.items():  # measured there, every launch
        folder = results / "h200" / name
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), folder / f"kernel-speed-{name}.parquet")
        (folder / f"{name}.progress.jsonl").write_text("".join(json.dumps({"row": r | {"kernel": "k"}}) + "\n"
                                                               for r in rows))
        (folder / "done.json").write_text("{}")
    assert step.picks(results / "h200") == [r["id"] for r in wanted]  # in LARGEST_LAYERS' order
    # a read measured in part, to be measured further in this window: its picks would change by then
    (results / "h200" / "headline-bert-base" / "done.json").unlink()
    calls, left_out = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    assert not any("counters-headline" in c.steps for c in calls)
    (results / "h200" / "headline-bert-base" / "done.json").write_text("{}")
    calls, _ = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    assert {name for c in calls for name in c.steps} == {"counters-headline"}
    carried = [path for c in calls for path in c.carry]
    resnet_parts = [f".gpu/headline-resnet50-{i}of6.tar.xz" for i in range(3, 7)]  # the 4 layer4 launches, last
    assert set(carried) - {".gpu/headline-resnet50.parts.json", ".gpu/headline-bert-base.parts.json"} == {
        *resnet_parts, ".gpu/headline-bert-base-2of3.tar.xz", ".gpu/headline-bert-base-3of3.tar.xz"}
    # on the GPU machine: each carried part profiled for the picked kernels it holds, in one table
    out = results / "h200" / "counters-headline"
    out.mkdir()
    monkeypatch.setattr(device, "CARRY", carry)
    folders = {}
    for name, rows in by_step.items():
        folders[name] = tmp_path / name
        folders[name].mkdir()
        pq.write_table(pa.Table.from_pylist([{"id": r["id"]} for r in rows]), folders[name] / "launches.parquet")
    monkeypatch.setattr(device, "opened_bundle", lambda spec, *a, **k: [folders[spec.name]])
    asked = []

    def profile(argv):
        listed = argv[argv.index("--ids") + 1:argv.index("--timeout-s")]
        asked.extend(listed)
        kernel_counters.write_counters([kernel_counters._row(i, "k", "ok", "") for i in listed], tmp_path / argv[2])

    monkeypatch.setattr(kernel_counters, "main", profile)
    assert device._counters(step, out, Deadline.after(100), print)
    assert sorted(asked) == sorted(r["id"] for r in wanted)


def test_a_step_longer_than_one_call_is_planned_over_as_many_calls_each_within_the_call_limit(tmp_path, monkeypatch):
    # Table 4 at 0.9 (4452 launches) was planned as one 540 s call; it measured 2 of its 5 parts in 480 s
    import pyarrow as pa
    import pyarrow.parquet as pq

    mib = 2**20
    spec = device.BundleSpec("long", "sample", {"n": 1})
    monkeypatch.setattr(device, "STEPS", (device.Step("long", "", "", (spec,), device_seconds=540),))
    carry, results = tmp_path / ".gpu", tmp_path / "results"
    carry.mkdir()
    (results / "h200" / "other").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"set": "sample", "seconds": 0.5} for _ in range(20)]),
                   results / "h200" / "other" / "kernel-speed-x.parquet")
    # two parts: 2000 launches (1000 s, two calls of it alone) and 400 (200 s)
    parts = [{"file": f"long-{i + 1}of2.tar.xz", "bytes": 10 * mib, "launches": [[f"k{i}-{j}", "n"] for j in range(n)]}
             for i, n in enumerate((2000, 400))]
    (carry / "long.parts.json").write_text(json.dumps({"inputs": spec.inputs, "parts": parts}))
    calls, left_out = device.window_calls("h200", 5000, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    # the first part's 1062 s (its share of the 1275 s) over three calls, the second part joining its last
    assert [c.carry[1:] for c in calls] == [(".gpu/long-1of2.tar.xz",), (".gpu/long-1of2.tar.xz",),
                                            (".gpu/long-1of2.tar.xz", ".gpu/long-2of2.tar.xz")]
    assert all(c.seconds <= device.STEP_LIMIT_S for c in calls) and not left_out
    assert sum(c.seconds for c in calls) == pytest.approx(60 + 2400 * 0.5 + 15)
    short, left_out = device.window_calls("h200", 900, 5 * mib, results, tmp_path / "home", carry, tmp_path / ".whl")
    assert not short and left_out == ["long: about 1275 s in 3 calls, past the window's 900 s"]


def test_a_window_keeps_each_gpus_own_steps_and_gives_each_call_the_time_the_window_has_left(tmp_path, monkeypatch):
    mib = 2**20
    specs = [device.BundleSpec(f"b{i}", "micro", {"n": i}) for i in range(3)]
    monkeypatch.setattr(device, "STEPS", (device.Step("s0", "", "", (specs[0],), device_seconds=100),
                                          device.Step("s1", "", "", (specs[1],), device_seconds=100),
                                          device.Step("h200-only", "", "", (specs[2],), device_seconds=100,
                                                      device="h200")))
    carry = tmp_path / ".gpu"
    carry.mkdir()
    for b in specs:  # each its own call
        (carry / f"{b.name}.tar.xz").write_bytes(b"")
        (carry / f"{b.name}.parts.json").write_text(json.dumps(
            {"inputs": b.inputs, "parts": [{"file": f"{b.name}.tar.xz", "bytes": 40 * mib}]}))
    plan = lambda kind, budget: device.window_calls(kind, budget, 5 * mib, tmp_path / "results", tmp_path / "home",
                                                    carry, tmp_path / ".whl")
    calls, left_out = plan("h100", 900)
    assert [c.steps for c in calls] == [("s0",), ("s1",)] and "h200-only: runs on an H200 only" in left_out
    assert [c.steps for c in plan("h200", 900)[0]] == [("s0",), ("s1",), ("h200-only",)]
    # a 300 s window: the first call may take what is left after the start (300 - 40 - 20), the second
    # what is left after the first and the wait; the device tool's limit a little past each
    calls, _ = plan("h100", 300)
    assert [c.limit_s for c in calls] == [240, 240 - 115 - 20]
    assert [c.timeout_s for c in calls] == [260, 125] and "B=105;" in calls[1].command
