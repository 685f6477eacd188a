"""Whole-search cost per zoo model: search seconds per layer split by stage, and the candidates left
after constrain and after rank, read from the run summaries (`summary/<run_id>.parquet`) that
`lospmm run` writes. With `--run`, first runs each model (a fresh `lospmm run` process each) into
the artifact root.

    python -m benchmarks.zoo_search --run --models shufflenetv2 mobilenetv2 resnet50 bert-base
    python -m benchmarks.zoo_search --artifacts /tmp/lospmm-zoo-search      # report only
    python -m benchmarks.zoo_search --summary benchmarks/results/zoo_search-*.parquet

Stage seconds are per layer and summed over layers. With --jobs > 1 compile and emit run on
threads, so their sums are thread-seconds and can exceed the wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from lospmm.flows.storage.runs import RunStatus

STAGES = ("prune", "reorder", "rank", "cluster", "compile", "time", "emit")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="/tmp/lospmm-zoo-search")
    ap.add_argument("--run", action="store_true", help="run the models first")
    ap.add_argument("--models", nargs="+", default=["shufflenetv2", "mobilenetv2", "resnet50", "bert-base"])
    ap.add_argument("--sparsity", default="0.9")
    ap.add_argument("--summary", nargs="+", type=Path, help="summary Parquet files to report instead")
    args = ap.parse_args()
    root = Path(args.artifacts)
    walls: dict[str, float] = {}
    if args.run:
        for model in args.models:
            cmd = [sys.executable, "-m", "lospmm.cli", "run", "--zoo", model, "--sparsity", args.sparsity,
                   "--artifacts", str(root)]
            if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
                print(f"{model}: lospmm run failed", file=sys.stderr)
    files = args.summary
    if not files:
        files = []
        for rec in sorted((root / "runs").glob("*.json")):
            r = json.loads(rec.read_text())
            if r.get("status") == RunStatus.COMPLETED and r.get("summary"):
                files.append(root / r["summary"])
                walls[str(root / r["summary"])] = r["wall_seconds"]
    if not files:
        raise SystemExit(f"no completed run summaries under {root}; pass --run")
    console = Console(width=200)
    totals = Table(title="whole search per model (estimate timer unless stated): seconds summed over layers")
    for c in ("model", "sparsity", "layers", "emitted", "wall s", *STAGES, "search s"):
        totals.add_column(c)
    for f in files:
        rows = pq.read_table(f).to_pylist()
        per = Table(title=f"{f.name}: per layer")
        for c in ("layer", "M×K×N", "status", "cands", "constrain", "rank", "tile", *STAGES, "search s"):
            per.add_column(c)
        sums: dict[str, float] = defaultdict(float)
        for r in rows:
            for s in STAGES:
                sums[s] += r[f"{s}_seconds"] or 0.0
            per.add_row(r["layer"], f"{r['m']}×{r['k']}×{r['n']}", r["status"], str(r["candidates"]),
                        str(r["after_constrain"]), "-" if r["after_rank"] is None else str(r["after_rank"]),
                        f"{r['m1']}×{r['n1']}" if r["m1"] else "-",
                        *(f"{r[f'{s}_seconds'] or 0.0:.1f}" for s in STAGES), f"{r['search_seconds']:.1f}")
        console.print(per)
        wall = walls.get(str(f))
        totals.add_row(rows[0]["model"], f"{rows[0]['sparsity']:g}", str(len(rows)),
                       str(sum(r["status"] == "ok" for r in rows)), "-" if wall is None else f"{wall:.0f}",
                       *(f"{sums[s]:.1f}" for s in STAGES), f"{sum(sums.values()):.1f}")
    console.print(totals)


if __name__ == "__main__":
    main()
