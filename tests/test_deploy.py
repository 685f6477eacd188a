"""deploy/prefect.yaml registers against a real local Prefect server and runs through a process
worker to completion (a small configuration passed as the run's parameters)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect(env, *args, timeout=180, check=True):
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"prefect {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture()
def server(tmp_path, fresh_prefect_home):
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(fresh_prefect_home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_CLI_PROMPT": "false",
           "COLUMNS": "250"}  # rich tables in the CLI output are not truncated
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if _healthy(port):
                break
            time.sleep(1)
        else:
            raise AssertionError("Prefect server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
        yield env
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def test_deployment_registers_and_runs_through_a_worker(server, tmp_path):
    env = server
    _prefect(env, "work-pool", "create", "lospmm-process", "--type", "process")
    out = _prefect(env, "--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--all")
    assert "nightly-zoo" in out.stdout
    # the schedule came from the file
    shown = _prefect(env, "deployment", "inspect", "lospmm-pipeline/nightly-zoo").stdout
    assert "0 2 * * *" in shown
    config = {"zoo": ["shufflenetv2"], "sparsities": [0.9], "until": "constrain",
              "artifacts": str(tmp_path / "artifacts")}
    run = _prefect(env, "deployment", "run", "lospmm-pipeline/nightly-zoo", "--params",
                   json.dumps({"config": config}))
    assert "Created flow run" in run.stdout
    _prefect(env, "worker", "start", "--pool", "lospmm-process", "--run-once", timeout=400)
    runs = _prefect(env, "flow-run", "ls").stdout
    assert "COMPLETED" in runs.upper(), runs
    assert list((tmp_path / "artifacts" / "04_candidates").glob("shufflenetv2-*.parquet"))
