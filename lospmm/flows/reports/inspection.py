"""Readable views of run records and artifacts for `lospmm inspect` (rich tables)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from lospmm.flows.dag import list_columns
from lospmm.flows.storage.runs import shown_status
from lospmm.flows.storage.store import read_artifact
from lospmm.stages.constrain import REMOVED_BY
from lospmm.status import Status

# What `inspect --stage S` shows by default; --all-columns shows every non-list column.
VIEW_COLUMNS = {
    "extract": ["layer", "op", "m", "n", "k", "repeat", "kh", "stride", "h_out", "status", "message"],
    "prune": ["layer", "m", "n", "k", "repeat", "sparsity_requested", "sparsity_achieved", "nnz", "status",
              "message", "seconds"],
    "reorder": ["layer", "sparsity", "m1", "num_tiles", "num_empty_rows", "identity_max_nnc", "reordered_max_nnc",
                "identity_mean_nnc", "reordered_mean_nnc", "identity_cov_nnz", "reordered_cov_nnz", "status",
                "seconds"],
    "constrain": ["layer", "m1", "n1", "block_num", "pred_regs", "block_regs", "cov_row", "waste_col", "kept",
                  "removed_by", "fallback"],
    "cluster": ["layer", "m1", "num_tiles", "max_active_blocks", "num_clusters", "status", "message", "seconds"],
    "pad": ["layer", "m1", "n1", "grid_x", "grid_y", "block", "pred_regs", "num_atb", "smem_bytes", "status"],
    "compile": ["layer", "m1", "kind", "status", "registers", "maxrregcount", "spill_stores", "compile_seconds",
                "from_cache", "source_bytes", "verified", "cubin_path"],
    "rank": ["layer", "m1", "n1", "block_num", "nnc_sum", "nnz_max", "score", "rank", "chosen", "ranker"],
    "time": ["layer", "m1", "n1", "timer", "time_us", "compute_us", "memory_us", "latency_us", "active_blocks",
             "registers", "smem_bytes", "status", "message"],
    "emit": ["layer", "dtype", "m1", "n1", "timer", "proxy_time_us", "full_time_us", "speedup_vs_dense", "registers",
             "spill_bytes", "compile_seconds", "check", "max_rel_error", "status", "kernel_dir"],
}


def runs_table(records: list[dict], damaged: list[tuple[Path, str]] = ()) -> Table:
    t = Table(title="runs")
    for c in ("run", "status", "started", "wall s", "models", "sparsities", "until", "tasks", "cached"):
        t.add_column(c)
    for path, why in damaged:  # a truncated record is listed, not taken for "no runs"
        t.add_row(path.stem, f"damaged record: {why}", "", "", "", "", "", "", "")
    for r in records:
        cfg, entries = r["config"], r.get("entries", [])
        models = list(cfg.get("zoo") or []) + ([Path(cfg["weights"]).name] if cfg.get("weights") else [])
        t.add_row(r["run_id"], shown_status(r), r.get("started", ""), _num(r.get("wall_seconds")), ", ".join(models),
                  " ".join(f"{s:g}" for s in cfg["sparsities"]), cfg["until"], str(len(entries)),
                  str(sum(e["state"] == "Cached" for e in entries)))
    return t


def run_table(record: dict) -> Table:
    t = Table(title=f"run {record['run_id']} — {shown_status(record)}"
              + (f", {record['wall_seconds']:.1f} s" if "wall_seconds" in record else ""))
    for c in ("stage", "model", "sparsity", "state", "rows", "compute s", "key", "artifact"):
        t.add_column(c, overflow="fold")
    for e in record.get("entries", []):
        state = e["state"] + (" (reused file)" if e.get("reused") and e["state"] != "Cached" else "")
        t.add_row(e["stage"], e.get("model", ""), _num(e.get("sparsity")), state, str(e.get("rows", "")),
                  _num(e.get("seconds")), e["key"][:12], e.get("path") or e.get("error", ""))
    return t


def problems_table(record: dict) -> Table | None:
    """Layers that failed or were left out (errors, layers pruned empty, candidates not timed), one
    row each, or None. Tensors extract skipped as no GEMM weight to search (biases, norms, lookup
    tables, depthwise convolutions: often hundreds, on a clean run too) are no problem:
    `skipped_line` counts them."""
    seen = {}
    for e in record.get("entries", []):
        for p in e.get("problems", []):
            if not _expected_skip(e, p):
                seen.setdefault((e.get("model", ""), p["layer"]), (e["stage"], p["status"], p["message"]))
    if not seen:
        return None
    t = Table(title="layers with problems (the other layers completed)")
    for c in ("model", "layer", "first seen in", "status", "message"):
        t.add_column(c, overflow="fold")
    for (model, layer), (stage, status, msg) in sorted(seen.items()):
        t.add_row(model, layer, stage, status, msg)
    return t


def skipped_line(record: dict) -> str | None:
    """One line counting the tensors extract did not search, by reason (per model where the run has
    several): `41 tensors not searched: 17 × depthwise convolution is not a GEMM, 20 × bias (1-D) (…)`."""
    by_model: dict[str, Counter] = {}
    for e in record.get("entries", []):
        for p in e.get("problems", []):
            if _expected_skip(e, p):
                by_model.setdefault(e.get("model", ""), Counter())[_skip_reason(p["message"])] += 1
    if not by_model:
        return None
    total = sum(sum(c.values()) for c in by_model.values())
    parts = "; ".join((f"{model}: " if len(by_model) > 1 else "")
                      + ", ".join(f"{n} × {reason}" for reason, n in c.most_common())
                      for model, c in sorted(by_model.items()))
    return (f"{total} tensor{'s' * (total > 1)} not searched: {parts} "
            f"(`lospmm inspect {record.get('run_id', 'RUN')} --stage extract` lists them)")


def _expected_skip(entry: dict, problem: dict) -> bool:
    # extract's skipped rows are the tensors that are no GEMM weight; later stages' are failures
    return entry["stage"] == "extract" and problem["status"] == Status.SKIPPED


def _skip_reason(message: str) -> str:
    # "name [shape]: excluded, <reason>" -> the reason without the node it names ("bias of Conv x",
    # "Conv x: not a 2-D convolution …") or a layer's own numbers (groups=8), so that reasons group
    reason = message.split(": excluded, ", 1)[-1]
    reason = reason.split(" of ", 1)[0] if " of " in reason else reason
    reason = re.sub(r"^[A-Z]\w* \S+: ", "", reason)
    return re.sub(r"groups=\d+(; )?", "", reason).replace(" ()", "")


def stage_tables(root: str, record: dict, stage: str, layer: str | None, rows: bool,
                 limit: int, all_columns: bool = False) -> Iterator[tuple[str, Table]]:
    entries = [e for e in record.get("entries", []) if e["stage"] == stage and e.get("path")]
    if not entries:
        yield f"run {record['run_id']} has no {stage} artifact", Table()
    for e in entries:
        path = Path(root) / e["path"]
        table = read_artifact(path)
        if layer:
            table = table.filter(pc.match_substring(table["layer"], layer))
        if stage == "constrain" and not rows:
            yield str(path), _reduction_table(table, e)
        else:
            cols = None if all_columns else VIEW_COLUMNS[stage]
            yield str(path), _plain_table(table, limit, f"{stage} {e.get('model', '')} {e.get('sparsity', '')}", cols)


def _reduction_table(table: pa.Table, entry: dict) -> Table:
    """Per layer: candidates left after each constraint (Fig. 3 in numbers), and the kept tiles."""
    t = Table(title=f"constrain {entry.get('model', '')} s={entry.get('sparsity', '')}: candidates left")
    for c in ("layer", "M", "N", "K", "total", *(f"-{r}" for r in REMOVED_BY), "kept", "kept (M1,N1) sample"):
        t.add_column(c, overflow="fold", no_wrap=c == "layer")
    for row_layer in dict.fromkeys(table.column("layer").to_pylist()):
        sub = table.filter(pc.equal(table["layer"], row_layer)).to_pylist()
        removed = [r["removed_by"] for r in sub]
        kept = [r for r in sub if r["kept"]]
        sample = ", ".join(f"({r['m1']},{r['n1']})" for r in kept[:6]) + (" …" if len(kept) > 6 else "")
        first = sub[0]
        t.add_row(row_layer, str(first["m"]), str(first["n"]), str(first["k"]), str(len(sub)),
                  *(str(removed.count(r)) for r in REMOVED_BY),
                  str(len(kept)) + (" (fallback)" if any(r.get("fallback") for r in kept) else ""),
                  sample if first["status"] != Status.ERROR else first["message"])
    return t


def _plain_table(table: pa.Table, limit: int, title: str, columns: list[str] | None) -> Table:
    cols = columns or [c for c in table.column_names if c not in list_columns()]
    t = Table(title=f"{title} ({table.num_rows} rows{', first ' + str(limit) if table.num_rows > limit else ''})")
    for c in cols:
        t.add_column(c, overflow="fold", no_wrap=c == "layer")
    for r in table.slice(0, limit).select(cols).to_pylist():
        t.add_row(*(_num(v) if isinstance(v, float) else str(v) for v in r.values()))
    return t


def _num(v) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary_table(artifacts: str, record: dict) -> Table | None:
    """The run's per-layer summary (summary/<run_id>.parquet), if the run reached it."""
    if not record.get("summary"):
        return None
    rows = read_artifact(Path(artifacts).resolve() / record["summary"]).to_pylist()
    t = Table(title="per layer: candidates after each step, chosen tile, the kernel's dtype, time (timer named per "
                    "row; 'estimate' = analytic model, not a measurement; vs cuBLAS in the kernel's dtype), search seconds")
    for c in ("model", "layer", "sparsity", "status", "cands", "constrain", "rank", "timed", "M1×N1", "dtype", "timer",
              "time µs", "vs cuBLAS", "compile s", "emit s", "search s"):
        # a long layer name wraps: cut short it would name no layer (other cells may shorten)
        t.add_column(c, overflow="fold" if c == "layer" else "ellipsis", min_width=12 if c == "layer" else None)
    for r in rows:
        fmt = lambda v, f="{}": "-" if v is None else f.format(v)  # noqa: E731
        t.add_row(r["model"], r["layer"], f"{r['sparsity']:g}", r["status"], fmt(r["candidates"]),
                  fmt(r["after_constrain"]), fmt(r["after_rank"]), fmt(r["timed"]),
                  f"{r['m1']}×{r['n1']}" if r["m1"] else "-", fmt(r.get("dtype")), fmt(r["timer"]),
                  fmt(r["time_us"], "{:.1f}"),
                  _speedup(r.get("speedup_vs_dense")), fmt(r["compile_seconds"], "{:.1f}"),
                  fmt(r["emit_seconds"], "{:.1f}"), f"{r['search_seconds']:.1f}")
    return t


def _speedup(v) -> str:
    """Measured speedup over cuBLAS (cuda timer only); '-' where nothing was measured."""
    return "-" if v is None or v != v else f"{v:.2f}×"
