"""Issue 32's faults, each as it was reproduced: a weights file swapped under a run, a full disk, a
stop request in the middle of a stage, Ctrl-C in lospmm.torch.search, messages that pointed the
wrong way, a bare `lospmm run`, reading and summarising that did not scale, a cached run that
started Prefect's server."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from safetensors.numpy import save_file
from typer.testing import CliRunner

from lospmm.cli import app
from lospmm.flows.config import RunConfig, resolved
from lospmm.flows.execution.taskio import STOP, Interrupted, RunContext
from lospmm.flows.inputs.weights import WeightsChanged, WeightsFile
from lospmm.flows.storage.runs import RESERVE_BYTES, reserve_path, reserve_space, run_record, write_run_record
from tests.conftest import run_directly

runner = CliRunner()


def _weights(path: Path, names=("a", "b", "c"), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    save_file({n: rng.standard_normal((32 + 8 * i, 24)).astype(np.float32) for i, n in enumerate(names)}, str(path))
    return path


def _plan(tmp_path, weights: Path, until: str = "emit", **options):
    return resolved(RunConfig(zoo=(), weights=str(weights), tokens=256, m1s=(2,), top_k=1, until=until,
                              artifacts=str(tmp_path / "art"), **options))


# 1. The weights a run uses are the weights its key names.

def test_weights_replaced_after_the_run_was_planned_fail_it_and_nothing_is_cached(tmp_path):
    weights = _weights(tmp_path / "w.safetensors")
    original = weights.read_bytes()
    plan = _plan(tmp_path, weights, until="prune")  # hashed here, as `lospmm run` plans
    _weights(tmp_path / "w.safetensors", names=("x", "y"), seed=1)  # replaced before extract reads it
    done = run_directly(plan, 0.9)
    assert "changed since the run started" in done["extract"]["failed"] and str(weights) in done["extract"]["failed"]
    assert "not run: extract" in done["prune"]["failed"]
    assert not list((plan.root / "01_shapes").glob("*.parquet"))  # nothing stored under the old file's key
    weights.write_bytes(original)
    again = run_directly(plan, 0.9)
    layers = pq.read_table(plan.root / again["extract"]["path"]).column("layer").to_pylist()
    assert sorted(layers) == ["a", "b", "c"]  # the planned file's layers, not the replacement's


def test_weights_replaced_between_two_stages_fail_the_later_one(tmp_path):
    weights = _weights(tmp_path / "w.safetensors")
    plan = _plan(tmp_path, weights, until="prune")

    def swap_before_prune(stage, call):
        if stage == "prune":
            _weights(weights, seed=5)  # same names and shapes, other values: only the hash tells
        return call()

    done = run_directly(plan, 0.9, swap_before_prune)
    assert done["extract"].get("path") and "changed since the run started" in done["prune"]["failed"]
    assert not list((plan.root / "02_pruned").glob("*.parquet"))


def test_a_weights_file_written_to_while_it_is_read_is_refused(tmp_path):
    weights = _weights(tmp_path / "w.safetensors")
    f = WeightsFile(weights)
    f.tensor("a")
    with open(weights, "r+b") as out:  # edited in place (same inode): the fd sees the new bytes
        out.seek(-4, os.SEEK_END)
        out.write(b"\x00\x00\x80\x7f")
        os.utime(out.fileno(), ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(WeightsChanged, match="written to while the run read it"):
        f.close()


def test_prune_opens_the_weights_file_once_not_once_per_tensor(tmp_path, monkeypatch):
    import lospmm.flows.inputs.weights as weights_module

    names = tuple(f"layer{i}" for i in range(60))
    weights = _weights(tmp_path / "w.safetensors", names)
    plan = _plan(tmp_path, weights, until="extract")
    run_directly(plan, 0.9)
    pruning = _plan(tmp_path, weights, until="prune")  # planning reads the header: counted apart
    opened = []
    real_init = weights_module.WeightsFile.__init__
    monkeypatch.setattr(weights_module.WeightsFile, "__init__",
                        lambda self, *a, **k: (opened.append(a), real_init(self, *a, **k))[1])
    done = run_directly(pruning, 0.9)
    assert pq.read_table(plan.root / done["prune"]["path"]).num_rows == 60
    assert len(opened) == 1  # extract was cached; prune read 60 tensors through one open file


# 2. Out of space anywhere: a failed layer or run, one line, the record updated, nothing half-written trusted.

def test_the_reserve_is_freed_for_the_last_record(tmp_path):
    reserve_space(tmp_path, "20260101-000000-abcdef")
    assert reserve_path(tmp_path, "20260101-000000-abcdef").stat().st_size == RESERVE_BYTES
    write_run_record(tmp_path, {"run_id": "20260101-000000-abcdef", "status": "running"})
    assert reserve_path(tmp_path, "20260101-000000-abcdef").exists()  # a record written on the way keeps it
    write_run_record(tmp_path, {"run_id": "20260101-000000-abcdef", "status": "failed"}, final=True)
    assert not reserve_path(tmp_path, "20260101-000000-abcdef").exists()
    assert run_record(tmp_path)["status"] == "failed"


class _FillingDisk:
    """lospmm.files' temporary files on a disk that fills once the run starts writing kernel directories
    (another process filled it): every later write fails with ENOSPC until the run's reserve is freed,
    the space it had set aside."""

    def __init__(self, root: Path, made):
        self.root, self.made, self.full, self.refused = root, made, False, []

    def __call__(self, path: Path) -> Path:
        self.full = self.full or "10_kernels" in str(path.parent)
        reserved = any((self.root / "runs").glob(".*.reserve"))
        if self.full and reserved:
            self.refused.append(str(path.parent))
            raise OSError(errno.ENOSPC, "No space left on device", str(path.parent))
        return self.made(path)


def test_a_disk_that_fills_during_emit_fails_the_run_in_one_line_and_a_rerun_resumes(tmp_path, monkeypatch, capfd,
                                                                                       prefect_server):
    import lospmm.files

    weights = _weights(tmp_path / "w.safetensors")
    root = tmp_path / "art"
    args = ["run", "--weights", str(weights), "--tokens", "256", "--m1", "2", "--top-k", "1", "--artifacts", str(root)]
    made = lospmm.files._temporary_beside
    disk = _FillingDisk(root, made)
    monkeypatch.setattr(lospmm.files, "_temporary_beside", disk)
    result = runner.invoke(app, args)
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 1, out
    assert disk.refused and "Traceback" not in out
    failed = [line for line in out.splitlines() if "failed" in line and "no space left on device" in line]
    assert failed and "emit" in failed[-1], out[-3000:]
    record = run_record(root)
    assert record["status"] == "failed" and not list((root / "runs").glob(".*.reserve"))
    assert not list((root / "10_kernels").glob("*.parquet"))  # no emit artifact to trust later

    monkeypatch.setattr(lospmm.files, "_temporary_beside", made)  # space freed
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    entries = {e["stage"]: e["state"] for e in run_record(root)["entries"]}
    assert entries["emit"] == "Completed" and entries["time"] == "Cached"  # only what failed is computed again


# 3. Every stage checks for a stop between layers.

@pytest.mark.parametrize("stage", ["prune", "reorder", "constrain", "rank", "cluster", "pad"])
def test_a_stop_request_ends_the_stage_under_way(tmp_path, monkeypatch, stage):
    weights = _weights(tmp_path / "w.safetensors", tuple(f"layer{i}" for i in range(8)))
    plan = _plan(tmp_path, weights, until=stage)
    armed = threading.Event()
    real_read = RunContext.read

    def read_then_stop(self, *args, **kwargs):  # a Ctrl-C as the stage starts on its layers
        table = real_read(self, *args, **kwargs)
        if armed.is_set():
            STOP.set()
        return table

    def arm(name, call):
        if name == stage:
            armed.set()
        return call()

    monkeypatch.setattr(RunContext, "read", read_then_stop)
    try:
        with pytest.raises(Interrupted):
            run_directly(plan, 0.9, arm)
    finally:
        STOP.clear()
    stage_dir = {"prune": "02_pruned", "reorder": "03_reordered", "constrain": "04_candidates", "rank": "05_ranked",
                 "cluster": "06_clusters", "pad": "07_launch"}[stage]
    assert not list((plan.root / stage_dir).glob("*.parquet"))  # the stage stopped: it wrote nothing


# 4. Ctrl-C inside lospmm.torch.search stops the flow it started.

def test_ctrl_c_in_torch_search_stops_its_flow_and_records_it_cancelled(tmp_path, fresh_prefect_home):
    root = tmp_path / "art"
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch import nn
        import lospmm.torch as lt
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(40)])
        try:
            lt.search(model, torch.randn(64, 256), artifacts={str(root)!r}, until="compile", jobs=1)
            print("FINISHED")
        except KeyboardInterrupt as e:
            print("INTERRUPTED", e)
    """))
    env = {**os.environ, "PREFECT_HOME": str(fresh_prefect_home)}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 240
    while not list((root / "07_launch").glob("*.json")):  # compiling 40 layers' proxies takes a while
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert "INTERRUPTED" in out and "cancelled" in out and "FINISHED" not in out, out[-3000:]
    assert "Crash detected" not in out and "Finished in state Cancelled" in out, out[-3000:]
    assert time.time() - t0 < 30  # the flow's tasks stopped; before, compile ran on to its end
    record = json.loads(sorted((root / "runs").glob("*.json"))[-1].read_text())
    assert record["status"] == "cancelled"
    assert not list((root / "08_compiled").glob("*.parquet"))


@pytest.mark.parametrize("stop_asked", [True, False])
def test_prefect_s_crash_report_of_a_stop_reads_stopped_on_request(stop_asked):
    """A stop asked for is not reported as a crash; any other crash is, as Prefect has it."""
    from lospmm.flows.execution.stopping import StoppedOnRequest

    def record(message, level=logging.ERROR):
        return logging.LogRecord("prefect.task_runs", level, __file__, 1, message, (), None)

    stop = "Execution was interrupted by an unexpected exception: Interrupted: the run was asked to stop"
    crash, finished = record(f"Crash detected! {stop}"), record(f"Finished in state Crashed('{stop}')")
    other = record("Crash detected! Execution was interrupted by an unexpected exception: MemoryError: ")
    flow = record("Finished in state Crashed('Execution was aborted by an interrupt signal.')")
    quiet = StoppedOnRequest()
    if stop_asked:
        STOP.set()
    try:
        kept = [quiet.filter(r) for r in (crash, finished, other, flow)]
    finally:
        STOP.clear()
    if stop_asked:
        assert kept == [False, True, True, True]
        assert (finished.getMessage(), finished.levelno) == ("stopped on request", logging.INFO)
        assert (flow.getMessage(), flow.levelno) == ("stopped on request", logging.INFO)
    else:
        assert kept == [True] * 4 and finished.levelno == logging.ERROR and "Crashed" in finished.getMessage()
    assert other.levelno == logging.ERROR and "MemoryError" in other.getMessage()


def test_a_second_signal_during_a_stop_runs_on_second_and_exits_at_once(tmp_path):
    """stops_cleanly's two signals, in a process of their own: the first asks the flow's wait to stop
    (POLLING_STOP set: no KeyboardInterrupt), the second calls on_second and exits with the code given
    (the CLI's "cancelled at once", which the end-to-end test may see only when its stop is slow)."""
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        from lospmm.flows.execution.stopping import stops_cleanly
        from lospmm.flows.execution.taskio import POLLING_STOP, STOP
        with stops_cleanly(exit_code_on_second=130, on_second=lambda: print("second", flush=True)):
            POLLING_STOP.set()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("first: STOP", STOP.is_set(), flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        print("not reached", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stdout.split() == ["first:", "STOP", "True", "second"], done
    # the first is answered at once (a compile under way can take a minute before the stop shows), once
    from lospmm.flows.execution.stopping import STOPPING

    assert done.stderr.count(STOPPING) == 1 and "interrupt again to stop at once" in STOPPING, done.stderr


def test_an_embedded_api_that_did_not_start_points_at_its_log():
    """Its output goes to a log, not the terminal: Prefect's time-out then says where the reason is."""
    from lospmm.flows.execution.server import API_LOG, api_log, api_start_failure

    line = api_start_failure(RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server. "
                                          "Ephemeral server process exited with code 1."))
    assert line.endswith(f"exited with code 1. (the embedded API's own output: {api_log()})")
    assert api_log().name == API_LOG
    assert api_start_failure(RuntimeError("something else")) is None and api_start_failure(OSError("x")) is None



def test_the_embedded_api_is_given_time_to_start_unless_the_user_set_a_timeout(monkeypatch):
    """Prefect's 20 s default timed out in CI while a fresh database was set up on a busy machine."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    from lospmm.flows.execution.server import API_START_TIMEOUT_S, _DetachedSubprocess, detach_embedded_api

    waited = []
    monkeypatch.setattr(prefect_server.SubprocessASGIServer, "start", lambda self, timeout=None: waited.append(timeout))
    monkeypatch.setattr(prefect_server, "subprocess", prefect_server.subprocess)  # restored after the test
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS}):
        assert detach_embedded_api() and waited == [API_START_TIMEOUT_S] and API_START_TIMEOUT_S > 20
        assert isinstance(prefect_server.subprocess, _DetachedSubprocess)
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 45},
                            restore_defaults={PREFECT_API_URL}):
        assert detach_embedded_api() and waited[-1] == 45
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert not detach_embedded_api() and len(waited) == 2  # a real server: nothing started


def test_the_embedded_apis_start_is_one_line_and_its_stop_none(monkeypatch, caplog):
    """Prefect said "Starting temporary server on …" and a second line pointing at its docs, and
    "Stopping temporary server" after the run's summary; a run says the start in one line."""
    import logging

    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from lospmm.flows.execution.server import ApiStartInOneLine, detach_embedded_api

    def start(self, timeout=None):  # what Prefect's start and stop log, on its own logger
        prefect_server.subprocess_server_logger.info("Starting temporary server on http://127.0.0.1:8917\nSee "
                                                     "https://docs.prefect.io/v3/concepts/server for more.")
        prefect_server.subprocess_server_logger.info("Stopping temporary server on http://127.0.0.1:8917")

    monkeypatch.setattr(prefect_server.SubprocessASGIServer, "start", start)
    monkeypatch.setattr(prefect_server, "subprocess", prefect_server.subprocess)
    prefect_logger = logging.getLogger("prefect")
    monkeypatch.setattr(prefect_logger, "filters", list(prefect_logger.filters))  # restored after the test
    with temporary_settings(restore_defaults={PREFECT_API_URL}), caplog.at_level(logging.INFO, logger="prefect"):
        detach_embedded_api()
        detach_embedded_api()  # again in one process: one filter, not two
    said = [r.getMessage() for r in caplog.records if r.name == "prefect"]
    assert said == ["Starting the run's embedded Prefect API on http://127.0.0.1:8917 (PREFECT_API_URL points "
                    "runs at a Prefect server of your own)"] * 2
    assert sum(isinstance(f, ApiStartInOneLine) for f in prefect_logger.filters) == 1

# 5. Messages that name the file or layer and the problem.

def test_kernel_out_naming_an_existing_file_says_so(tmp_path):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    result = runner.invoke(app, ["kernel", "--layer", "a", "--m1", "2", "--n1", "32", "--out", str(existing),
                                 "--artifacts", str(tmp_path / "art")])
    assert result.exit_code == 2 and "notes.txt: a file is there" in result.output and "compile cache" not in result.output
    assert existing.read_text() == "mine"


def test_kernel_asks_for_a_tile_only_where_the_design_has_one(tmp_path):
    """A baked kernel needs --m1 and --n1 (its tile); the nm design picks its own blocking, so a tile given
    with it is refused rather than silently ignored; the served kernel takes no number format. All before
    any run is read."""
    art = str(tmp_path / "art")
    baked = runner.invoke(app, ["kernel", "--layer", "a", "--design", "chained", "--out", str(tmp_path / "k"),
                                "--artifacts", art])
    assert baked.exit_code == 2 and "--m1 and --n1: the tile of the kernel" in baked.output
    # no tile and no design: the kernel the run served, in its own number format
    served = runner.invoke(app, ["kernel", "--layer", "a", "--dtype", "fp16", "--out", str(tmp_path / "k"),
                                 "--artifacts", art])
    assert served.exit_code == 2 and "--dtype: the kernel the run served is in its own number format" in served.output
    nm = runner.invoke(app, ["kernel", "--layer", "a", "--design", "nm", "--m1", "4", "--n1", "32",
                             "--out", str(tmp_path / "k"), "--artifacts", art])
    assert nm.exit_code == 2 and "picks its own blocking; leave out --m1 and --n1" in nm.output
    assert not (tmp_path / "k").exists()


def test_an_overflowing_weight_fails_its_check_saying_which_weight_and_why():
    from lospmm.kernel.check import check_input, judged
    from lospmm.kernel.render import kernel_source
    from lospmm.stages.reorder import reordered_tiles

    dense = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    dense[3, 4] = 3e38
    a = sp.csr_matrix(dense)
    spec = kernel_source(a, reordered_tiles(a, 2), 32).spec
    b = check_input(spec, 8)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (a @ b).astype(np.float32)  # what an fp32 kernel computes: some sums overflow
    result = judged(spec, a, b, y)
    assert not result.ok and "fp32 sums overflow" in result.message and "3e+38 at row 3, column 4" in result.message


def _finished_run(tmp_path, names=("a", "b")) -> Path:
    """A run's artifacts and record, recorded as a cached run is (no Prefect server needed)."""
    from lospmm.flows.pipeline import served_from_artifacts

    plan = _plan(tmp_path, _weights(tmp_path / "w.safetensors", names))
    run_directly(plan, 0.9)
    assert served_from_artifacts(plan, "20260101-000000-abcdef") is not None
    return plan.root


def test_inspect_layer_that_names_no_layer_fails_naming_some_that_exist(tmp_path):
    root = _finished_run(tmp_path)
    for extra in ([], ["--stage", "prune"]):
        result = runner.invoke(app, ["inspect", run_record(root)["run_id"], "--layer", "nosuch", "--artifacts",
                                     str(root), *extra])
        assert result.exit_code == 2 and "--layer 'nosuch': no layer" in result.output and "a, b" in result.output


def test_inspect_marks_an_artifact_damaged_since_its_run(tmp_path):
    root = _finished_run(tmp_path)
    reordered = next((root / "03_reordered").glob("*.parquet"))
    with open(reordered, "ab") as f:
        f.write(b"junk")
    result = runner.invoke(app, ["inspect", run_record(root)["run_id"], "--artifacts", str(root)],
                           env={"COLUMNS": "250"})
    line = next(line for line in result.output.splitlines() if line.startswith("│ reorder"))
    assert "damaged since the run" in line and "does not match its checksum" in line and "Completed" not in line
    assert "lospmm rerun --stage reorder" in result.output
    # a kernel directory's file edited: its emit artifact is damaged, and the file at fault is named
    kernel_json = next((root / "10_kernels").glob("*/a-*/kernel.json"))
    kernel_json.write_text(kernel_json.read_text() + " ")
    shown = runner.invoke(app, ["inspect", run_record(root)["run_id"], "--artifacts", str(root)],
                          env={"COLUMNS": "400"})
    # (400 columns: the state cell on one line)
    assert f"damaged since the run: {kernel_json.parent.parent.name}/{kernel_json.parent.name}/kernel.json does " \
           "not match its checksum" in " ".join(shown.output.split()), shown.output
    emit = runner.invoke(app, ["inspect", run_record(root)["run_id"], "--stage", "emit", "--artifacts", str(root)])
    assert emit.exit_code == 1 and "kernel.json does not match its checksum" in " ".join(emit.output.split())
    # a kernel written from it: the damaged artifact named, the rerun that mends it, nothing written
    run_id = run_record(root)["run_id"]
    kernel = runner.invoke(app, ["kernel", run_id, "--layer", "a", "--m1", "2", "--n1", "32", "--out",
                                 str(tmp_path / "k"), "--artifacts", str(root)])
    assert kernel.exit_code == 1 and "03_reordered" in kernel.output and "ArtifactError" not in kernel.output
    assert f"lospmm rerun --stage reorder {run_id} --artifacts {root}` recomputes it" in " ".join(kernel.output.split())
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("design", ["tile-x,column-x", "baked,streamed", "v=2,v=4"])
def test_contradictory_design_tokens_are_refused_naming_them(tmp_path, design):
    result = runner.invoke(app, ["run", "--zoo", "bert-base", "--design", design, "--artifacts", str(tmp_path)])
    assert result.exit_code == 2 and f"design {design!r}" in result.output and "given twice" in result.output
    assert not (tmp_path / "runs").exists()


def test_a_bare_run_says_what_to_give_it_and_starts_nothing(tmp_path):
    result = runner.invoke(app, ["run", "--artifacts", str(tmp_path)])
    assert result.exit_code == 2 and "lospmm run needs a model: --weights FILE" in result.output
    assert not (tmp_path / "runs").exists()


def test_readme_exit_codes_say_what_a_file_with_no_gemm_gives(tmp_path):
    save_file({"bias": np.zeros(8, np.float32)}, str(tmp_path / "b.safetensors"))
    result = runner.invoke(app, ["run", "--weights", str(tmp_path / "b.safetensors"), "--artifacts", str(tmp_path)])
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    codes = readme[readme.index("**Exit codes**"):readme.index("**Stopping a run.**")]
    assert result.exit_code == 2 and "`2`\nbad input, nothing started (an unknown option, a file that is not a model, " \
        "a weights file with no GEMM\nweight among its tensors)" in codes


# 7. Reading, summarising and serving a cached run scale.

def test_a_run_of_many_layers_is_summarised_in_groups_with_the_full_table_in_the_artifact():
    from rich.console import Console

    from lospmm.flows.reports.inspection import SCREENFUL, problems_table, summary_table

    rows = [{"model": "m", "layer": f"layer{i}", "sparsity": 0.9, "status": "ok" if i % 4 else "error",
             "candidates": 10, "after_constrain": 3, "after_rank": 1, "timed": 1, "m1": 2, "n1": 64, "dtype": "fp32",
             "timer": "estimate", "time_us": 5.0, "speedup_vs_dense": None, "compile_seconds": 0.1,
             "emit_seconds": 0.1, "search_seconds": 0.5} for i in range(SCREENFUL + 1)]
    record = {"run_id": "r", "summary": "summary/r.parquet", "entries": [
        {"stage": "emit", "model": "m", "problems": [{"layer": r["layer"], "status": "error",
                                                      "message": f"{r['layer']} (2,64): host: FAILED"}
                                                     for r in rows if r["status"] == "error"] * 5}]}
    import lospmm.flows.reports.inspection as inspection

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inspection, "read_artifact", lambda path: type("T", (), {"to_pylist": lambda self: rows})())
        table = summary_table("art", record)
        shown = summary_table("art", record, limit=len(rows))
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert table.row_count == 2 and "41 layers" in text and "summary/r.parquet" in text  # ok and error groups
    # --limit shows every layer (the table, then what its rows share, said once)
    assert shown.renderables[0].row_count == len(rows) and "in every row shown: model m" in _text(shown)
    many = {**record, "entries": [{**record["entries"][0], "problems": [
        {"layer": f"layer{i}", "status": "error", "message": f"layer{i}: ValueError: bad"} for i in range(100)]}]}
    grouped = problems_table(many)
    assert grouped.row_count == 1  # 100 layers failing alike are one row


def _text(renderable) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_cached_run_is_served_from_its_artifacts_without_prefect(tmp_path, monkeypatch):
    import lospmm.flows.pipeline as pipeline

    weights = _weights(tmp_path / "w.safetensors")
    plan = _plan(tmp_path, weights)
    run_directly(plan, 0.9)  # every artifact of the plan, under the keys the flow derives

    def no_flow(*args, **kwargs):
        raise AssertionError("the flow (and Prefect's server) was started for a cached run")

    monkeypatch.setattr(pipeline, "pipeline", no_flow)
    result = pipeline.run_plan(plan)
    record = run_record(plan.root, result["run_id"])
    assert record["status"] == "completed" and record["served_from_artifacts"]
    assert {e["state"] for e in record["entries"]} == {"Cached"} and len(record["entries"]) == 10
    assert record["layers"] == {"total": 3, "failed": []}
    # one damaged artifact and the run is the flow's again
    emitted = next((plan.root / "10_kernels").glob("*.parquet"))
    emitted.write_bytes(emitted.read_bytes() + b"x")
    with pytest.raises(AssertionError, match="the flow"):
        pipeline.run_plan(plan)


def test_the_record_of_faulted_kernels_survives_a_line_cut_off(tmp_path):
    from lospmm.flows.storage.faults import FILE, fault_key, faulted, record_fault

    assert faulted(tmp_path) == {}
    first = fault_key("bert-base", "fc", 0.9, "8×128 v=4")
    record_fault(tmp_path, first, "CudaError: CUDA_ERROR_ILLEGAL_ADDRESS")
    with open(tmp_path / FILE, "a", encoding="utf-8") as f:
        f.write('{"key": "bert-base|q|0.9|nm 1')  # a process killed mid-write
    second = fault_key("bert-base", "q", 0.9, "nm 16:32:8,64x128,8x8")
    record_fault(tmp_path, second, "RuntimeError: trap")
    assert faulted(tmp_path) == {first: "CudaError: CUDA_ERROR_ILLEGAL_ADDRESS", second: "RuntimeError: trap"}
