"""SIGKILL a real `lospmm run` mid-flight, then run again: it finishes, finished artifacts are
not recomputed, and nothing on disk is half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lospmm.flows.store import sidecar_path, valid_sidecar


def _cmd(root: Path) -> list[str]:
    return [sys.executable, "-m", "lospmm.cli", "run", "--zoo", "all", "--sparsity", "0.5", "0.9",
            "--until", "constrain", "--artifacts", str(root)]


def test_sigkill_then_resume(tmp_path):
    root = tmp_path / "artifacts"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # its own ephemeral API, not the test server
    proc = subprocess.Popen(_cmd(root), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((root / "02_pruned").glob("*.json")):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    finished = {}
    for parquet in root.glob("0*/*.parquet"):
        meta = valid_sidecar(parquet)
        # an artifact with a sidecar is whole; one without was caught before its sidecar landed
        assert meta is not None or not sidecar_path(parquet).exists(), parquet
        if meta is not None:
            finished[parquet] = parquet.stat().st_mtime_ns
    assert finished, "nothing had finished before the kill"

    done = subprocess.run(_cmd(root), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(sorted((root / "runs").glob("*.json"))[-1].read_text())
    assert record["status"] == "completed" and len(record["entries"]) == 4 * (1 + 2 * 3)
    for parquet, mtime in finished.items():
        assert parquet.stat().st_mtime_ns == mtime, f"{parquet} was recomputed"
    for e in record["entries"]:
        assert valid_sidecar(root / e["path"]) is not None
