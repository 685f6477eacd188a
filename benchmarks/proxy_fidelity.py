"""Proxy fidelity, the shape of the paper's Table 4, on a finished run: for every layer, the tile the
proxies chose (fastest proxy in 09_timed) against the fastest full kernel among the same timed
candidates, and Spearman's rank correlation between proxy times and full-kernel times.

With `--timer estimate` (no GPU) the full kernels are estimated by the analytic model at the §3.2
register prediction, and the proxy times in 09_timed are estimates too: every figure is an ESTIMATE.
With `--timer cuda` (on a GPU) each candidate's full kernel is compiled and timed on the device; the
proxy times then come from a run made with the cuda timer.

    python -m benchmarks.proxy_fidelity --artifacts artifacts [--run RUN_ID] [--timer estimate]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

from lospmm.flows.config import resolved_timer
from lospmm.flows.execution.taskio import RunContext
from lospmm.flows.catalog.pruned import matrices
from lospmm.flows.catalog.reordered import tiles_by_layer
from lospmm.devices import device_named
from lospmm.kernel.design import design_named
from lospmm.search import full_kernel_time

from benchmarks.paper_plots import run_record


def full_time(timer, a, tiles, row: dict) -> float:
    """µs of the candidate's full kernel in its row's design (search.full_kernel_time: compiled and run
    when the timer runs binaries, else estimated at the register prediction, as the search assumes)."""
    return full_kernel_time(timer, a, tiles, row["m"], row["k"], row["n"], row["n1"],
                            design_named(row.get("design") or "baseline"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--run", default=None)
    ap.add_argument("--timer", default="estimate", choices=["estimate", "cuda"])
    args = ap.parse_args()
    root, record = args.artifacts, run_record(args.artifacts, args.run)
    timer = resolved_timer(args.timer, device_named(record["config"]["gpu"]))
    ctx = RunContext(str(root))
    by_source = defaultdict(dict)
    for e in record["entries"]:
        if e.get("path") and e["stage"] in ("prune", "reorder", "time"):
            by_source[(e["model"], e.get("sparsity"))][e["stage"]] = e
    rows = []
    for (model, sparsity), entries in sorted(by_source.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if len(entries) < 3:
            continue
        a, tiles = matrices(ctx, entries["prune"]), tiles_by_layer(ctx, entries["reorder"])
        timed = defaultdict(list)
        made_by = {r["timer"] for r in ctx.read(entries["time"]).to_pylist()}
        if not timer.measures and made_by - {timer.name}:
            # comparing one model's proxy times with another model's full-kernel times means nothing
            raise SystemExit(f"run {record['run_id']} timed {model}'s proxies with {', '.join(sorted(made_by))}; this "
                             f"script's estimate is {timer.name}: re-run the run's time stage first")
        for r in ctx.read(entries["time"]).to_pylist():
            if r["status"] == "ok" and np.isfinite(r["time_us"]):
                timed[r["layer"]].append(r)
        for layer, cands in timed.items():
            if layer not in a:
                continue
            proxy = np.array([c["time_us"] for c in cands])
            full = np.array([full_time(timer, a[layer], tiles[layer][c["m1"]], c) for c in cands])
            chosen, best = int(np.argmin(proxy)), int(np.argmin(full))
            rho = spearmanr(proxy, full).statistic if len(cands) >= 3 and np.ptp(proxy) > 0 and np.ptp(full) > 0 \
                else float("nan")
            rows.append({"model": model, "sparsity": sparsity, "layer": layer, "candidates": len(cands),
                         "chosen": f"{cands[chosen]['m1']}x{cands[chosen]['n1']}",
                         "best": f"{cands[best]['m1']}x{cands[best]['n1']}",
                         "loss": float(full[chosen] / full[best] - 1.0), "spearman": float(rho), "timer": timer.name})
    out = root / "plots"
    out.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / f"proxy_fidelity-{timer.name}.parquet")

    label = " (ESTIMATES: analytic model, no GPU)" if not timer.measures else ""
    table = Table(title=f"proxy-chosen tile vs best full kernel among the timed candidates, timer {timer.name}{label}")
    for c in ("model", "sparsity", "kernels", "chosen = best", "median loss", "max loss", "median Spearman ρ"):
        table.add_column(c)
    groups = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["sparsity"])].append(r)
    groups[("all", None)] = rows
    for (model, s), rs in groups.items():
        loss = np.array([r["loss"] for r in rs])
        rho = np.array([r["spearman"] for r in rs])
        table.add_row(model, "-" if s is None else f"{s:g}", str(len(rs)), f"{np.mean(loss == 0):.0%}",
                      f"{np.median(loss):.1%}", f"{loss.max():.1%}",
                      f"{np.nanmedian(rho):.2f}" if np.isfinite(rho).any() else "-")
    Console(width=150).print(table)
    print(f"per kernel: {out / f'proxy_fidelity-{timer.name}.parquet'}")


if __name__ == "__main__":
    main()
