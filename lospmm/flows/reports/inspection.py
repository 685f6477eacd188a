"""Readable views of run records and artifacts for `lospmm inspect` (rich tables)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Group
from rich.table import Table
from rich.text import Text

from lospmm.flows.dag import list_columns
from lospmm.flows.reports.summary import grouped_summary
from lospmm.flows.storage.runs import RunStatus, shown_status
from lospmm.flows.storage.store import artifact_problem, intact_sidecar, read_artifact
from lospmm.kernel.design import short_design_label
from lospmm.stages.constrain import REMOVED_BY
from lospmm.status import Status

SCREENFUL = 40  # layers a summary or problem table lists one by one; past it, grouped

# emit's default view: a design's estimate and price in one cell ("16.4 / 11.2", one figure where they agree)
PRICED, RUNNER_UP_PRICED = "estimate / price µs", "runner-up estimate / price µs"
# a default view's cells made of an artifact's columns (_priced_designs): a view column, the columns it reads
DERIVED_COLUMNS = {"emit": {PRICED: ("design_estimate_us", "design_price_us"),
                            RUNNER_UP_PRICED: ("runner_up_estimate_us", "runner_up_price_us")}}

# What `inspect --stage S` shows by default; --all-columns shows every non-list column.
VIEW_COLUMNS = {
    "extract": ["layer", "op", "m", "n", "k", "repeat", "kh", "stride", "h_out", "status", "message"],
    "prune": ["layer", "m", "n", "k", "repeat", "sparsity_requested", "sparsity_achieved", "zeros_before", "method",
              "nm", "nnz", "status", "message", "seconds"],
    "reorder": ["layer", "sparsity", "m1", "num_tiles", "num_empty_rows", "order", "identity_nnc_sum",
                "reordered_nnc_sum", "identity_max_nnc", "reordered_max_nnc", "identity_cov_nnz", "reordered_cov_nnz",
                "status", "seconds"],
    "constrain": ["layer", "design", "m1", "n1", "block_num", "pred_regs", "block_regs", "cov_row", "waste_col", "kept",
                  "removed_by", "fallback"],
    "cluster": ["layer", "m1", "design", "num_tiles", "max_active_blocks", "num_clusters", "status", "message", "seconds"],
    "pad": ["layer", "m1", "n1", "design", "grid_x", "grid_y", "block", "pred_regs", "num_atb", "smem_bytes", "status"],
    "compile": ["layer", "m1", "design", "kind", "status", "registers", "maxrregcount", "spill_stores", "compile_seconds",
                "from_cache", "source_bytes", "verified", "cubin_path"],
    "rank": ["layer", "m1", "n1", "design", "block_num", "nnc_sum", "nnz_max", "score", "rank", "chosen", "ranker"],
    "time": ["layer", "m1", "n1", "design", "timer", "time_us", "compute_us", "memory_us", "latency_us", "active_blocks",
             "registers", "smem_bytes", "status", "message"],
    # the served kernel's `design` names its tile (M1×N1) or its N:M blocking; `form` whether a convolution
    # reads its NCHW input itself (implicit-conv) or an im2col B (gemm)
    # (the design's and runner-up's estimate and price in one cell each: _priced_designs)
    "emit": ["layer", "form", "dtype", "design", PRICED, "runner_up", RUNNER_UP_PRICED, "designs_measured", "timer",
             "full_time_us", "speedup_vs_dense", "registers", "spill_bytes", "compile_seconds", "check",
             "max_rel_error", "status"],  # (its kernel directory: --all-columns, or `lospmm kernel`)
}


def runs_table(records: list[dict], damaged: list[tuple[Path, str]] = ()) -> Table | Group:
    """The runs, one a row: the run id whole (it is what every other command takes), what was asked
    (models, sparsities, pruning, design, dtype) and how it went; fitted to the terminal
    (_fitted_table: what every run shares is said once)."""
    # the flow's own seconds: the embedded Prefect API's start (about 15–25 s) is before it
    headers = ("run", "status", "layers", "started", "flow s", "models", "sparsities", "prune", "design", "dtype", "until",
               "tasks", "cached")
    # a truncated record is listed, not taken for "no runs"
    rows = [(path.stem, f"damaged record: {why}", *[""] * (len(headers) - 2)) for path, why in damaged]
    for r in records:
        cfg, entries = r["config"], r.get("entries", [])
        models = list(cfg.get("zoo") or []) + ([Path(cfg["weights"]).name] if cfg.get("weights") else [])
        rows.append((r["run_id"], shown_status(r), _layers_cell(r), r.get("started", ""), _num(r.get("wall_seconds")),
                     ", ".join(models), " ".join(f"{s:g}" for s in cfg["sparsities"]), cfg.get("prune") or "default",
                     cfg.get("design") or "baseline", cfg.get("dtype") or "the weights' own", cfg["until"],
                     str(len(entries)), str(sum(e["state"] == "Cached" for e in entries))))
    return _fitted_table("runs", headers, rows, keep=("run", "status", "started"))


def run_outcome(record: dict) -> tuple[str, str]:
    """What a finished run gives, as `lospmm run`'s exit code and `lt.search` say it: ("ok", ""),
    ("layers", why) when some or all layers did not produce what was asked (the rest are kept), or
    ("failed", why) when the run itself failed (a task crashed, its summary not written), was
    cancelled or killed, or is still running (`inspect` on another process's run)."""
    status = shown_status(record)
    if status in (RunStatus.CANCELLED, RunStatus.KILLED, RunStatus.RUNNING):
        what = {RunStatus.CANCELLED: "was cancelled; its finished artifacts are kept",
                RunStatus.KILLED: "was killed (its process is gone); its finished artifacts are kept",
                RunStatus.RUNNING: "is still running"}[status]
        return "failed", f"run {record['run_id']} {what}"
    if record["status"] != RunStatus.COMPLETED:
        failed = [e for e in record["entries"] if e["state"] not in ("Completed", "Cached")]
        why = (f"{failed[0]['stage']} {failed[0]['label']}: {_first_line(failed[0].get('error') or failed[0]['state'])}"
               if failed else record.get("error", "see the table above"))
        return "failed", f"run {record['run_id']} failed: {why}"
    if record.get("summary_error"):
        return "failed", f"run {record['run_id']}: its summary could not be written: {record['summary_error']}"
    if "layers" not in record:  # a record older than the layers' outcomes (2026-11): nothing to say of them
        return "ok", ""
    layers = record["layers"]
    if not layers["total"]:
        return "layers", f"run {record['run_id']}: no layer to search (every tensor was skipped)"
    if layers["failed"]:
        # each with its reason where it has one (its message names the layer), as the problems table says it
        said = list(dict.fromkeys(_failure(f) for f in layers["failed"]))
        more = f"; and {len(said) - 3} more" if len(said) > 3 else ""
        return "layers", (f"{len(layers['failed'])} of {layers['total']} layers did not produce what was asked: "
                          f"{'; '.join(said[:3])}{more}")
    return "ok", ""


def _failure(failed: dict) -> str:
    """A failed layer as the outcome line names it: its message's first line, led by the layer's name."""
    message = _first_line(failed.get("message") or "")
    if not message:
        return f"{failed['layer']} ({failed['status']})"
    return message if message.startswith(failed["layer"]) else f"{failed['layer']}: {message}"


DEFAULT_ARTIFACTS = "artifacts"  # RunConfig's and the CLI's --artifacts default


def lospmm_command(record: dict, *words: str, root: str | Path | None = None) -> str:
    """A command a message asks the user to run about `record`'s run, as they can paste it: with
    its --artifacts (`root`, where the caller read the run; else the run's own) where that is not
    the default (else it looks under ./artifacts)."""
    root = str(root or (record.get("config") or {}).get("artifacts") or DEFAULT_ARTIFACTS)
    return " ".join(("lospmm", *words)) + ("" if root == DEFAULT_ARTIFACTS else f" --artifacts {root}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _layers_cell(record: dict) -> str:
    """The runs list's layers: how many the run was asked for, and how many did not produce what was asked."""
    layers = record.get("layers")
    if not layers:
        return ""
    return f"{len(layers['failed'])} of {layers['total']} failed" if layers["failed"] else str(layers["total"])


def run_table(record: dict, root: str | None = None) -> Table | Group:
    """The run's tasks: state, rows, seconds, artifact (its path holds its key). With `root`, each
    artifact is checked against its sidecar (inspect): one deleted or damaged since shows so, not as
    the state the run left. Fitted to the terminal (_fitted_table: one model's name said once)."""
    title = (f"run {record['run_id']} — {shown_status(record)}"
             + (f", {record['wall_seconds']:.1f} s" if "wall_seconds" in record else "")
             + (" (every artifact cached and intact: served from them, no Prefect flow run)"
                if record.get("served_from_artifacts") else ""))
    rows, changed = [], []
    for e in record.get("entries", []):
        state = e["state"] + (" (reused file)" if e.get("reused") and e["state"] != "Cached" else "")
        if root is not None and e.get("path"):
            artifact = Path(root) / e["path"]
            if not artifact.exists() or intact_sidecar(artifact) is None:
                state = ("deleted since the run" if not artifact.exists()
                         else f"damaged since the run: {artifact_problem(artifact) or 'fails its checksum'}")
                changed.append(e["stage"])
        rows.append((e["stage"], e.get("model", ""), _num(e.get("sparsity")), state, str(e.get("rows", "")),
                     _num(e.get("seconds")), e.get("path") or e.get("error", "")))
    notes = ()
    if changed:
        notes = (f"`{lospmm_command(record, 'rerun', '--stage', changed[0], record['run_id'])}` recomputes the "
                 f"{changed[0]} artifact and what follows from it (a later run recomputes any artifact that fails its "
                 f"checksum)",)
    # a model and the sparsities are said once where the run has one of each; stage, state and path stay
    return _fitted_table(title, ("stage", "model", "sparsity", "state", "rows", "compute s", "artifact"), rows,
                         keep=("stage", "sparsity", "state", "rows", "compute s", "artifact"), notes=notes)


def problems_table(record: dict, limit: int = SCREENFUL) -> Table | None:
    """Layers that failed or were left out (errors, layers pruned empty, candidates not timed), one
    row each up to `limit`, else grouped by model, stage, status and message (the layer's name taken
    out), or None. Tensors extract skipped as no GEMM weight to search (biases, norms, lookup
    tables, depthwise convolutions: often hundreds, on a clean run too) are no problem:
    `skipped_line` counts them."""
    seen = {}
    for e in record.get("entries", []):
        for p in e.get("problems", []):
            if not _expected_skip(e, p):
                seen.setdefault((e.get("model", ""), p["layer"]), (e["stage"], p["status"], p["message"]))
    if not seen:
        return None
    layers = record.get("layers") or {}
    others = ("no layer completed" if layers.get("total") and len(layers.get("failed", ())) >= layers["total"]
              else "the other layers completed")
    if len(seen) > limit:
        groups: dict[tuple, list[str]] = {}
        for (model, layer), (stage, status, msg) in seen.items():
            reason = msg[len(layer):].lstrip(" :") if msg.startswith(layer) else msg
            groups.setdefault((model, stage, status, reason), []).append(layer)
        t = Table(title=f"{len(seen)} layers with problems, grouped ({others}; "
                        f"`{lospmm_command(record, 'inspect', record['run_id'], '--stage STAGE --layer NAME')}` "
                        f"shows one)")
        for c in ("model", "first seen in", "status", "layers", "message", "e.g."):
            t.add_column(c, overflow="fold")
        ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        for (model, stage, status, reason), layers in ordered[:limit]:
            t.add_row(model, stage, status, str(len(layers)), reason, ", ".join(layers[:3]) + (" …" * (len(layers) > 3)))
        if len(ordered) > limit:
            rest = sum(len(v) for _, v in ordered[limit:])
            t.add_row("", "", "", str(rest), f"in {len(ordered) - limit} more groups", "")
        return t
    t = Table(title=f"layers with problems ({others})")
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
            f"(`{lospmm_command(record, 'inspect', record.get('run_id', 'RUN'), '--stage extract')}` lists them)")


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
                 limit: int, all_columns: bool = False) -> list[tuple[str, Table]]:
    """(title, table) of each of the run's `stage` artifacts, rows of layers containing `layer` only
    where given; LookupError when no layer of them contains it (naming a few that are there)."""
    entries = [e for e in record.get("entries", []) if e["stage"] == stage and e.get("path")]
    if not entries:
        return [(f"run {record['run_id']} has no {stage} artifact", Table())]
    out, names = [], []
    for e in entries:
        path = Path(root) / e["path"]
        table = read_artifact(path)
        if layer:
            names += table.column("layer").to_pylist()[:3]
            table = table.filter(pc.match_substring(table["layer"], layer))
            if not table.num_rows:
                continue
        if stage == "constrain" and not rows:
            out.append((str(path), _reduction_table(table, e)))
        elif stage == "reorder" and not rows and not all_columns and "order_strategy" in table.column_names:
            out.append((str(path), _orders_table(table, e, limit)))
        else:
            view = VIEW_COLUMNS[stage]
            if stage == "emit" and "design" not in table.column_names:  # a run before designs were chosen: its tile
                view = [*view[:2], "m1", "n1", *view[2:]]
            if stage == "emit" and not all_columns and "design_price_us" in table.column_names:
                table = _priced_designs(table)
            cols = None if all_columns else [c for c in view if c in table.column_names]
            out.append((str(path), _plain_table(table, limit, f"{stage} {e.get('model', '')} {e.get('sparsity', '')}",
                                                cols)))
    if layer and not out:
        raise LookupError(f"--layer {layer!r}: no layer of run {record['run_id']}'s {stage} artifacts contains it "
                          f"(layers there: {', '.join(dict.fromkeys(names))}, …)")
    return out


def _priced_designs(table: pa.Table) -> pa.Table:
    """10_kernels with emit's view cells: the served design's and the runner-up's estimate and price,
    each one cell ("16.4 / 11.2"; one figure where the price is the estimate)."""
    def cell(estimate, price) -> str:
        if estimate is None or estimate != estimate:
            return ""
        same = price is None or price != price or abs(price - estimate) <= 1e-9 * max(abs(estimate), 1.0)
        return _num(estimate) if same else f"{_num(estimate)} / {_num(price)}"

    for name, (estimate, price) in DERIVED_COLUMNS["emit"].items():
        cells = [cell(e, p) for e, p in zip(table.column(estimate).to_pylist(), table.column(price).to_pylist())]
        table = table.append_column(name, pa.array(cells, pa.string()))
    return table


def _reduction_table(table: pa.Table, entry: dict) -> Table:
    """Per layer: candidates left after each constraint (Fig. 3 in numbers), and the kept tiles."""
    t = Table(title=f"constrain {entry.get('model', '')} s={entry.get('sparsity', '')}: candidates left")
    # the counts each constraint removed in one column, and the sample at a width of its own: in 13
    # columns at 120 characters a count folded over two lines and the sample to a tile per two lines
    removed_by = "removed by " + " / ".join(r.replace("_", " ") for r in REMOVED_BY)
    for c in ("layer", "M", "N", "K", "designs", "total", removed_by, "kept", "kept (M1,N1) sample"):
        t.add_column(c, overflow="fold", no_wrap=c == "layer", min_width=16 if c.startswith("kept (") else None)
    for row_layer in dict.fromkeys(table.column("layer").to_pylist()):
        sub = table.filter(pc.equal(table["layer"], row_layer)).to_pylist()
        removed = [r["removed_by"] for r in sub]
        kept = [r for r in sub if r["kept"]]
        sample = ", ".join(f"({r['m1']},{r['n1']})" for r in kept[:6]) + (" …" if len(kept) > 6 else "")
        first = sub[0]
        designs = {r.get("design") for r in sub if r.get("design")}
        t.add_row(row_layer, str(first["m"]), str(first["n"]), str(first["k"]), str(len(designs) or 1), str(len(sub)),
                  " / ".join(str(removed.count(r)) for r in REMOVED_BY),
                  str(len(kept)) + (" (fallback)" if any(r.get("fallback") for r in kept) else ""),
                  sample if first["status"] != Status.ERROR else first["message"])
    return t


def _orders_table(table: pa.Table, entry: dict, limit: int) -> Table:
    """Per (layer, M1): every candidate order's Σ nnc, max nnc and estimate, the kept one marked, or
    why it was skipped or not eligible (the notes); Σ nnc of the kept order against the identity's."""
    t = Table(title=f"reorder {entry.get('model', '')} s={entry.get('sparsity', '')}: candidate orders "
                    f"(Σ nnc / max nnc / estimate µs; * kept)"
                    + (f", first {limit} of {table.num_rows}" if table.num_rows > limit else ""))
    strategies = list(dict.fromkeys(s for row in table.column("order_strategy").to_pylist() for s in row or ()))
    for c in ("layer", "M1", "tiles", *strategies, "kept / identity", "s"):
        t.add_column(c, overflow="fold", no_wrap=c == "layer")
    for r in table.slice(0, limit).to_pylist():
        if r["status"] != Status.OK:
            t.add_row(r["layer"], _num(r.get("m1")), "", *([""] * len(strategies)), f"{r['status']}: {r['message']}", "")
            continue
        cells = {}
        for s, total, top, est, chosen, note in zip(r["order_strategy"], r["order_nnc_sum"], r["order_max_nnc"],
                                                   r["order_estimate_us"], r["order_chosen"], r["order_note"]):
            cells[s] = (f"{'*' if chosen else ''}{total} / {top} / {est:.3g}" if total >= 0 else "") \
                + (f"\n{note}" if note else "")
        ratio = r["reordered_nnc_sum"] / r["identity_nnc_sum"] if r["identity_nnc_sum"] else 1.0
        t.add_row(r["layer"], str(r["m1"]), str(r["num_tiles"]), *(cells.get(s, "") for s in strategies),
                  f"{ratio:.3f} ({r['order']})", _num(r["seconds"]))
    return t


def _short_designs(text: str) -> str:
    """10_kernels' designs_measured or designs_priced ("label: figures; …") with each label short."""
    return "; ".join(f"{short_design_label(label)}: {rest}" if rest else short_design_label(label)
                     for label, _, rest in (entry.partition(": ") for entry in text.split("; ")))


# a stage's default view shows these columns short (`--all-columns` shows them whole): a path by its
# last part (the run's folder is the artifact's), a timer by its kind (its calibration is the run's), a
# design by what it does not share with the default (kernel.design.short_design_label)
SHORT_COLUMNS = {"kernel_dir": lambda v: Path(v).name, "cubin_path": lambda v: Path(v).name,
                 "timer": lambda v: v.split(":", 1)[0], "design": short_design_label, "runner_up": short_design_label,
                 "designs_measured": _short_designs, "designs_priced": _short_designs}


def _plain_table(table: pa.Table, limit: int, title: str, columns: list[str] | None) -> Table | Group:
    """An artifact's rows, `columns` of them (None: every column but the lists, as stored). A default
    view (`columns` given) fits a terminal (_fitted_table), its headers wrapping at their words
    (time_us as "time us")."""
    cols = columns or [c for c in table.column_names if c not in list_columns()]
    short = columns is not None
    rows = [tuple(_cell(c, v, short=short) for c, v in r.items()) for r in table.slice(0, limit).select(cols).to_pylist()]
    title = f"{title} ({table.num_rows} rows{', first ' + str(limit) if table.num_rows > limit else ''})"
    if not short:  # every column: too many for a row of a terminal, so each row is a record of its own
        t = Table(title=title, show_header=False)
        t.add_column("column", no_wrap=True, style="bold")
        t.add_column("value", overflow="fold")
        for i, row in enumerate(rows):
            if i:
                t.add_section()
            for c, cell in zip(cols, row):
                t.add_row(c, cell)
        return t
    headers = tuple(c.replace("_", " ") for c in cols)
    return _fitted_table(title, headers, rows, names=dict(zip(headers, cols)))


def _fitted_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]], keep: tuple[str, ...] = ("layer",),
                  names: dict | None = None, empty: tuple[str, ...] = ("",), column_options: dict | None = None,
                  notes: tuple[str, ...] = ()) -> Table | Group:
    """A table of string cells (`rows` under `headers`) made to fit a terminal: a column whose every
    cell is empty (one of `empty`), or (over two rows or more) that holds one value in all of them, is
    said once under the table instead, by its name in `names` (its header otherwise), at the console's
    width, not the table's; `keep` are never moved. `notes` follow those lines."""
    columns = dict(zip(headers, zip(*rows))) if rows else {}
    names, options, said = names or {}, column_options or {}, []
    blank = [c for c, v in columns.items() if c not in keep and all(x in empty for x in v)]
    same = [c for c, v in columns.items() if c not in keep and c not in blank and len(rows) > 1 and len(set(v)) == 1]
    if same:
        said.append("in every row shown: " + "; ".join(f"{names.get(c, c)} {columns[c][0]}" for c in same))
    if blank:
        said.append("empty in every row shown: " + ", ".join(names.get(c, c) for c in blank))
    shown = [i for i, c in enumerate(headers) if c not in blank and c not in same]
    t = Table(title=title)
    for i in shown:
        t.add_column(headers[i], **{"overflow": "fold", "no_wrap": headers[i] in keep, **options.get(headers[i], {})})
    for row in rows:
        t.add_row(*(row[i] for i in shown))
    said += list(notes)
    return Group(t, Text("\n".join(said))) if said else t


def _cell(column: str, value, short: bool = True) -> str:
    """A table cell: a number to 4 figures, nothing for a missing value (None, NaN), and in a default
    view a SHORT_COLUMNS column short."""
    if isinstance(value, str) and value and short and column in SHORT_COLUMNS:
        return SHORT_COLUMNS[column](value)
    if isinstance(value, float) and value != value:
        return ""
    return _num(value)


def _num(v) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary_table(artifacts: str, record: dict, limit: int = SCREENFUL, layer: str | None = None) -> Table | Group | None:
    """The run's per-layer summary (summary/<run_id>.parquet), if the run reached it: one row per
    layer up to `limit` layers, else grouped by model, sparsity and status (summary.grouped_summary).
    `layer`: only layers whose name contains it (LookupError where none does)."""
    if not record.get("summary"):
        if layer:
            raise LookupError(f"--layer {layer!r}: run {record['run_id']} has no per-layer summary; give --stage")
        return None
    rows = read_artifact(Path(artifacts).resolve() / record["summary"]).to_pylist()
    if layer:
        names = [r["layer"] for r in rows[:3]]
        rows = [r for r in rows if layer in r["layer"]]
        if not rows:
            raise LookupError(f"--layer {layer!r}: no layer of run {record['run_id']} contains it (layers there: "
                              f"{', '.join(names)}, …)")
    fmt = lambda v, f="{}": "-" if v is None else f.format(v)  # noqa: E731
    if len(rows) > limit:
        t = Table(title=f"{len(rows)} layers by model, sparsity and status (kernel time summed over the layers; "
                        f"every layer: {record['summary']}, or "
                        f"`{lospmm_command(record, 'inspect', record['run_id'], '--limit', str(len(rows)))}`)")
        for c in ("model", "sparsity", "status", "layers", "tiles chosen", "dtype", "timer", "time µs (sum)",
                  "vs cuBLAS (median)", "search s"):
            t.add_column(c, overflow="fold")
        for g in grouped_summary(rows):
            t.add_row(g["model"], f"{g['sparsity']:g}", g["status"], str(g["layers"]), g["tiles"] or "-",
                      fmt(g["dtype"]), fmt(g["timer"]), _time_cell(g["time_us"], g.get("unfold_us")),
                      _speedup(g["speedup_vs_dense"]), f"{g['search_seconds']:.1f}")
        return t
    headers = ("model", "layer", "sparsity", "pruned", "status", "cands", "constrain", "rank", "timed", "kernel", "dtype",
               "timer", "time µs", "vs cuBLAS", "compile s", "emit s", "search s")
    cells = [(r["model"], r["layer"], f"{r['sparsity']:g}", fmt(r.get("pruned")), r["status"], fmt(r["candidates"]),
              fmt(r["after_constrain"]), fmt(r["after_rank"]), fmt(r["timed"]), _served(r), fmt(r.get("dtype")),
              fmt(r["timer"]), _time_cell(r["time_us"], r.get("unfold_us")), _speedup(r.get("speedup_vs_dense")),
              fmt(r["compile_seconds"], "{:.1f}"), fmt(r["emit_seconds"], "{:.1f}"), f"{r['search_seconds']:.1f}")
             for r in rows]
    # no cell is cut short (56.3 cut to "5…" reads as another number): a count or seconds stays whole on
    # its line, and the words (layer, kernel, status) wrap where the terminal is narrow
    words = ("model", "layer", "pruned", "status", "kernel", "timer", "time µs")
    options = {c: {"no_wrap": c not in words} for c in headers}
    return _fitted_table(
        "per layer: candidates after each step, the kernel served, its time, search seconds", headers, cells,
        keep=("layer", "kernel", "time µs"), empty=("-", ""), column_options=options,
        notes=("kernel: its tile M1×N1, with its design when not the baseline, or the N:M kernel's blocking; time: the "
               "timer named per row ('estimate' = analytic model, not a measurement; '+… unfold (est.)': a convolution "
               "served as its im2col GEMM, and the estimated unfolding of X it pays first); vs cuBLAS in the kernel's "
               "dtype, measured on a GPU only",))


def _served(r: dict) -> str:
    """The kernel a layer is served by (10_kernels' `design`: its tile, with the design, short, when it
    is not the baseline, or the N:M kernel's pattern and blocking); its tile for a run before designs
    were chosen."""
    if r.get("design"):
        return short_design_label(r["design"])
    return f"{r['m1']}×{r['n1']}" if r["m1"] else "-"


def _time_cell(time_us, unfold_us) -> str:
    """A kernel's time, with the estimated unfolding of X after it where a convolution is served as
    its im2col GEMM (10_kernels' unfold_us: serving it pays that too, the kernel's time does not hold it)."""
    if time_us is None:
        return "-"
    extra = f" +{unfold_us:.1f} unfold (est.)" if unfold_us is not None and unfold_us == unfold_us else ""
    return f"{time_us:.1f}{extra}"


def _speedup(v) -> str:
    """Measured speedup over cuBLAS (cuda timer only); '-' where nothing was measured."""
    return "-" if v is None or v != v else f"{v:.2f}×"
