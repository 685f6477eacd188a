"""Plots and tables of one run over the paper's benchmark set (or any run), read from its artifacts:
the search-space funnel per model (candidates after each constraint, the ranker's picks, the emitted
kernel: Fig. 3's shape), compile seconds against nonzeros (proxies and full kernels), and a table
per model and sparsity (layers, outcomes, seconds by stage). PNGs land in <artifacts>/plots/.

    python -m benchmarks.paper_plots --artifacts artifacts [--run RUN_ID]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

CONSTRAINTS = ("register", "utilisation", "load_balance")  # constrain's order (removed_by: the first that failed)


def run_record(root: Path, run_id: str | None) -> dict:
    """The named run (an id or a unique prefix) or the latest, as `lospmm inspect` finds it."""
    from lospmm.flows.storage.runs import run_record as record_of

    try:
        return record_of(root, run_id)
    except LookupError as e:
        raise SystemExit(f"{root}: {e}") from None


def artifact_paths(root: Path, record: dict, stage: str) -> list[Path]:
    from lospmm.flows.storage.runs import artifacts_of

    return [root / e["path"] for e in artifacts_of(record, stage)]


def funnel(root: Path, record: dict) -> dict[str, list[int]]:
    """Per model: candidates, left after each constraint, chosen by the ranker, emitted."""
    steps: dict[str, Counter] = defaultdict(Counter)
    for path in artifact_paths(root, record, "constrain"):
        for row in pq.read_table(path, columns=["model", "removed_by"]).to_pylist():
            steps[row["model"]]["all"] += 1
            steps[row["model"]][row["removed_by"] or "kept"] += 1
    for path in artifact_paths(root, record, "rank"):
        for row in pq.read_table(path, columns=["model", "chosen"]).to_pylist():
            steps[row["model"]]["chosen"] += bool(row["chosen"])
    for path in artifact_paths(root, record, "emit"):
        for row in pq.read_table(path, columns=["model", "status"]).to_pylist():
            steps[row["model"]]["emitted"] += row["status"] == "ok"
    out = {}
    for model, c in steps.items():
        left, series = c["all"], [c["all"]]
        for name in CONSTRAINTS:
            left -= c[name]
            series.append(left)
        out[model] = series + [c["chosen"], c["emitted"]]
    return out


def compile_points(root: Path, record: dict) -> tuple[list, list]:
    """(nnz, seconds) of every proxy (08_compiled) and full kernel (10_kernels) compiled in the run
    (cache hits carry the seconds of their first compile)."""
    nnz = {}
    for path in artifact_paths(root, record, "prune"):
        for row in pq.read_table(path, columns=["model", "layer", "sparsity_requested", "nnz"]).to_pylist():
            nnz[(row["model"], row["layer"], round(row["sparsity_requested"], 4))] = row["nnz"]
    proxies, fulls = [], []
    for stage, dest in (("compile", proxies), ("emit", fulls)):
        for path in artifact_paths(root, record, stage):
            for row in pq.read_table(path, columns=["model", "layer", "sparsity", "status", "compile_seconds"]).to_pylist():
                n = nnz.get((row["model"], row["layer"], round(row["sparsity"], 4)))
                if row["status"] == "ok" and n and row["compile_seconds"]:
                    dest.append((n, row["compile_seconds"]))
    return proxies, fulls


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--run", default=None)
    ap.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: ARTIFACTS/plots)")
    args = ap.parse_args()
    root, record = args.artifacts, run_record(args.artifacts, args.run)
    out = args.out or root / "plots"
    out.mkdir(parents=True, exist_ok=True)

    steps = funnel(root, record)
    labels = ["all (M1, N1)", "after register", "after utilisation", "after load balance", "ranker top-k", "emitted"]
    fig, axes = plt.subplots(1, len(steps), figsize=(4 * len(steps), 3.6), sharey=True, squeeze=False)
    for ax, (model, series) in zip(axes[0], sorted(steps.items())):
        ax.bar(range(len(series)), series, color=["#777"] + ["#4a7"] * 3 + ["#47a", "#a74"])
        ax.set_yscale("log")
        ax.set_xticks(range(len(series)), labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(model, fontsize=10)
        for i, v in enumerate(series):
            ax.text(i, max(v, 1), str(v), ha="center", va="bottom", fontsize=7)
    axes[0][0].set_ylabel("candidates (all layers and sparsities)")
    fig.suptitle(f"search-space funnel, run {record['run_id']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "funnel.png", dpi=120)

    proxies, fulls = compile_points(root, record)
    fig, ax = plt.subplots(figsize=(6, 4))
    for pts, name, colour in ((proxies, "proxies", "#47a"), (fulls, "full kernels", "#a74")):
        if pts:
            x, y = np.array(pts, dtype=float).T
            ax.scatter(x, y, s=10, alpha=0.6, label=f"{name} ({len(pts)})", color=colour)
            if len(pts) > 3:
                slope, icept = np.polyfit(np.log(x), np.log(y), 1)
                xs = np.geomspace(x.min(), x.max(), 20)
                ax.plot(xs, np.exp(icept) * xs ** slope, color=colour, lw=1, label=f"{name} fit: exponent {slope:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("layer nonzeros")
    ax.set_ylabel("NVRTC + link seconds (sum over units)")
    ax.set_title(f"compile seconds against nnz, run {record['run_id']}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compile_vs_nnz.png", dpi=120)

    table = Table(title=f"run {record['run_id']}: {record['status']}, {record.get('wall_seconds', 0):.0f} s wall")
    for c in ("model", "sparsity", "layers", "ok", "fallback", "other", "compile s", "emit s", "search s"):
        table.add_column(c)
    summary = pq.read_table(root / record["summary"]).to_pylist() if record.get("summary") else []
    groups = defaultdict(list)
    for row in summary:
        groups[(row["model"], row["sparsity"])].append(row)
    for (model, s), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        status = Counter(r["status"] for r in rows)
        total = lambda col: sum(r[col] or 0 for r in rows)  # noqa: E731
        table.add_row(model, f"{s:g}" if s is not None else "-", str(len(rows)), str(status["ok"]),
                      str(status["fallback"]), str(len(rows) - status["ok"] - status["fallback"]),
                      f"{total('compile_seconds'):.0f}", f"{total('emit_seconds'):.0f}", f"{total('search_seconds'):.0f}")
    Console(width=140).print(table)
    print(f"plots: {out / 'funnel.png'}, {out / 'compile_vs_nnz.png'}")


if __name__ == "__main__":
    main()
