"""Whole pipeline (stages 1–4) wall time: all four zoo models × five sparsities, cold (empty
artifact root) and cached re-run, each as a fresh `lospmm run` process on Prefect's ephemeral
API (so each includes the API's start-up).

    python -m benchmarks.pipeline_walltime [--artifacts /tmp/lospmm-bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="/tmp/lospmm-bench-artifacts")
    ap.add_argument("--sparsity", nargs="+", default=["0.5", "0.7", "0.8", "0.9", "0.95"])
    args = ap.parse_args()
    root = Path(args.artifacts)
    shutil.rmtree(root, ignore_errors=True)
    cmd = [sys.executable, "-m", "lospmm.cli", "run", "--zoo", "all", "--sparsity", *args.sparsity,
           "--until", "constrain", "--artifacts", str(root)]
    table = Table(title="stages 1–4, zoo=all, sparsities " + " ".join(args.sparsity))
    for c in ("pass", "process wall s", "flow wall s", "tasks", "Completed", "Cached", "artifact MB"):
        table.add_column(c)
    for name in ("cold", "cached re-run"):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            raise SystemExit(f"{name} run failed with exit code {proc.returncode}")
        record = json.loads(sorted((root / "runs").glob("*.json"))[-1].read_text())
        states = [e["state"] for e in record["entries"]]
        size = sum(p.stat().st_size for p in root.rglob("*.parquet")) / 2**20
        table.add_row(name, f"{wall:.1f}", f"{record['wall_seconds']:.1f}", str(len(states)),
                      str(states.count("Completed")), str(states.count("Cached")), f"{size:.0f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
