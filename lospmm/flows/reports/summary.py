"""The run summary: one row per layer (candidates after each step, search seconds by stage, the
chosen tile and its time), written to summary/<run_id>.parquet and published as a Prefect table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from lospmm.flows.storage import schemas
from lospmm.flows.dag import artifact_schemas
from lospmm.flows.storage.schemas import F64, I32, LAYER, STR
from lospmm.flows.storage.runs import artifacts_of
from lospmm.flows.storage.store import read_artifact, write_artifact
from lospmm.flows.execution.taskio import layer_fields
from lospmm.stages.prune import pruned_again
from lospmm.status import Status

SEARCH_STAGES = ("prune", "reorder", "rank", "cluster", "compile", "time", "emit")
SUMMARY = pa.schema(
    LAYER + [("sparsity", F64), ("status", STR), ("candidates", I32), ("after_constrain", I32),
             ("after_rank", I32), ("timed", I32), ("m1", I32), ("n1", I32), ("dtype", STR), ("timer", STR),
             ("time_us", F64), ("unfold_us", F64), ("speedup_vs_dense", F64)]
    + [(f"{s}_seconds", F64) for s in SEARCH_STAGES]
    + [("search_seconds", F64), ("kernel_dir", STR), ("design", STR), ("pruned", STR)]
)
SCHEMAS = artifact_schemas()


def pruned_cell(prune_row: dict) -> str:
    """How a layer's A was pruned, as the summary says it: 02_pruned's method, with the N:M pattern its
    weights hold where the method did not impose it ("keep, 2:4 found"; "nm:2:4"; "magnitude")."""
    method, nm = prune_row.get("method") or "", prune_row.get("nm") or ""
    return f"{method}, {nm} found" if nm and not method.startswith("nm") else method


def scalar_artifacts(root: Path, record: dict) -> dict[tuple, dict[str, list[dict]]]:
    """(model, sparsity) -> stage -> the rows of the run's artifact, its scalar columns only (the CSR
    and tile payloads are not needed at the run's end): read once for write_summary and
    pruned_again_lines."""
    by = {}
    for e in artifacts_of(record):
        if "sparsity" in e:
            cols = schemas.scalar_columns(SCHEMAS[e["stage"]])
            by.setdefault((e["model"], e["sparsity"]), {})[e["stage"]] = \
                read_artifact(root / e["path"], columns=cols).to_pylist()
    return by


def pruned_again_lines(record: dict, by: dict[tuple, dict[str, list[dict]]]) -> list[str]:
    """A line for each model whose weights were pruned before the run pruned them again
    (stages.prune.pruned_again: a pruned checkpoint searched without `--prune keep`), from its 02_pruned
    rows in `by` (scalar_artifacts); none for the zoo or `keep`. Kept in the record: `run`, `inspect
    RUN` and lt.search show them."""
    weights = (record.get("config") or {}).get("weights") or []
    weights = [weights] if isinstance(weights, str) else list(weights)
    if not weights:  # the zoo: no weights read, nothing pruned before
        return []
    rows: dict[str, list[dict]] = {}
    for (model, _), arts in by.items():
        rows.setdefault(model, []).extend(arts.get("prune", []))
    out = []
    for model, model_rows in rows.items():
        again = pruned_again(model_rows)
        if again is not None:
            out.append(again.line(f"{model} ({weights[0]})" if len(weights) == 1 else model))
    return out


def write_summary(root: Path, record: dict, by: dict[tuple, dict[str, list[dict]]]) -> tuple[str | None, list[dict]]:
    """Per layer: candidates at each step, search seconds by stage, chosen tile and its time, from the
    run's artifacts (`by`: scalar_artifacts); written to summary/<run_id>.parquet
    (publish_layer_summary shows them in Prefect). Returns the file's path (None if nothing ran) and
    the rows."""
    stages = SEARCH_STAGES
    rows = []
    for (model, sparsity), arts in by.items():
        seconds = {s_: Counter() for s_ in stages}
        for s_ in stages:
            col = "compile_seconds" if s_ == "compile" else "seconds"
            for r in arts.get(s_, []):
                v = r.get(col)
                if v is not None and np.isfinite(v):
                    seconds[s_][r["layer"]] += float(v)
        # rank rows repeat the layer's ranking time on each candidate: count it once
        seconds["rank"] = Counter({r["layer"]: r["seconds"] for r in arts.get("rank", [])})
        total = Counter(r["layer"] for r in arts.get("constrain", []))
        kept = Counter(r["layer"] for r in arts.get("constrain", []) if r["kept"])
        chosen = Counter(r["layer"] for r in arts.get("rank", []) if r["chosen"])
        timed = Counter(r["layer"] for r in arts.get("time", []) if r["status"] == Status.OK)
        emitted = {r["layer"]: r for r in arts.get("emit", [])}
        fell_back = {r["layer"] for r in arts.get("constrain", []) if r.get("fallback")}
        for lay in (r for r in arts.get("prune", []) if r["status"] == Status.OK):
            name = lay["layer"]
            em = emitted.get(name, {})
            status = layer_status(em, kept[name] > 0, name in fell_back, "constrain" in arts)
            row = {**layer_fields(lay), "sparsity": sparsity, "status": status, "candidates": total[name],
                   "after_constrain": kept[name], "after_rank": chosen.get(name) if "rank" in arts else None,
                   "timed": timed.get(name) if "time" in arts else None, "m1": em.get("m1"), "n1": em.get("n1"),
                   "dtype": em.get("dtype"),
                   "timer": em.get("timer"), "time_us": em.get("full_time_us"), "unfold_us": em.get("unfold_us"),
                   "speedup_vs_dense": em.get("speedup_vs_dense"), "kernel_dir": em.get("kernel_dir"),
                   "design": em.get("design"), "pruned": pruned_cell(lay)}
            row.update({f"{s_}_seconds": seconds[s_].get(name) for s_ in stages})
            row["search_seconds"] = sum(row[f"{s_}_seconds"] or 0.0 for s_ in stages)
            rows.append(row)
    if not rows:
        return None, []
    path = root / "summary" / f"{record['run_id']}.parquet"
    write_artifact(path, schemas.table_from_rows(rows, SUMMARY),
                   {"stage": "summary", "key": record["run_id"], "label": record["run_id"], "seconds": 0.0})
    return str(path.relative_to(root)), rows


def layer_status(emitted: dict, kept: bool, fell_back: bool, constrained: bool) -> str:
    """A layer's status in the summary from its emit row (`emitted`, {} when none): emit's own, or
    no_candidate (nothing kept by constrain) / not_emitted; an emitted layer whose kept candidates
    failed a constraint (`fell_back`) is a fallback, unless what serves it is no candidate's tile but
    the N:M kernel (design "nm …"), which the constraints did not judge."""
    status = emitted.get("status") or (Status.NO_CANDIDATE if not kept and constrained else Status.NOT_EMITTED)
    if status == Status.OK and fell_back and not str(emitted.get("design") or "").startswith("nm "):
        return Status.FALLBACK
    return status


def publish_layer_summary(record: dict, rows: list[dict]) -> None:
    """The summary as a Prefect table artifact of the flow run: one row per layer, or past
    ARTIFACT_LAYERS grouped (Prefect refuses an event over 1 MB; every row is in the file)."""
    from prefect.artifacts import create_table_artifact

    if not rows:
        return
    if len(rows) <= ARTIFACT_LAYERS:
        show = ("model", "layer", "sparsity", "status", "candidates", "after_constrain", "after_rank", "timed", "m1",
                "n1", "dtype", "timer", "time_us", "speedup_vs_dense", *(f"{s_}_seconds" for s_ in SEARCH_STAGES),
                "search_seconds")
        create_table_artifact(table=[{k: r[k] for k in show} for r in rows], key="lospmm-layer-summary",
                              description=f"lospmm run {record['run_id']}: per layer (time_us from the "
                                          f"timer named in each row; 'estimate…' rows are model estimates)")
    else:
        create_table_artifact(table=grouped_summary(rows), key="lospmm-layer-summary",
                              description=f"lospmm run {record['run_id']}: {len(rows)} layers grouped by model, "
                                          f"sparsity and status; every layer in {record['summary']}")


ARTIFACT_LAYERS = 1000  # layers published one row each in the Prefect table artifact


def grouped_summary(rows: list[dict]) -> list[dict]:
    """The summary of a run of many layers on one screen: its rows grouped by model, sparsity,
    status, dtype and timer, with the count of layers, the tiles most chosen, the summed kernel time
    (a model's time per pass where each layer runs once) and apart from it the summed estimated
    unfolding of the convolutions served as im2col GEMMs, the median speedup over cuBLAS where it
    was measured, and the summed search seconds. First-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["sparsity"], r["status"], r.get("dtype"), r.get("timer")), []).append(r)
    out = []
    for (model, sparsity, status, dtype, timer), group in groups.items():
        tiles = Counter(f"{r['m1']}×{r['n1']}" for r in group if r.get("m1"))
        times = [r["time_us"] for r in group if r.get("time_us") is not None and np.isfinite(r["time_us"])]
        unfolds = [r["unfold_us"] for r in group if r.get("unfold_us") is not None and np.isfinite(r["unfold_us"])]
        speedups = [r["speedup_vs_dense"] for r in group
                    if r.get("speedup_vs_dense") is not None and np.isfinite(r["speedup_vs_dense"])]
        out.append({"model": model, "sparsity": sparsity, "status": status, "layers": len(group),
                    "tiles": ", ".join(f"{t} ({n})" for t, n in tiles.most_common(3))
                             + (f", {len(tiles) - 3} more" if len(tiles) > 3 else ""),
                    "dtype": dtype, "timer": timer, "time_us": float(sum(times)) if times else None,
                    "unfold_us": float(sum(unfolds)) if unfolds else None,
                    "speedup_vs_dense": float(np.median(speedups)) if speedups else None,
                    "search_seconds": float(sum(r["search_seconds"] for r in group))})
    return out


LAYER_STAGES = ("prune", "reorder", "constrain")  # whose problems are a layer's, not one candidate's


def layer_outcomes(root: Path, record: dict, rows: list[dict]) -> dict:
    """How many layers the run was asked for and which did not produce what was asked: a layer with
    an error or empty status at a layer-level stage, and, when the run went to emit, every layer
    left without an emitted kernel (`rows`: the run's summary). One candidate failing (a proxy that
    did not compile) is not a layer failing: emit says whether the layer got its kernel. The exit
    code follows from this."""
    until = record["config"].get("until")
    stages = ("extract",) if until == "extract" else LAYER_STAGES  # past extract, prune repeats its errors
    failed: dict[tuple, dict] = {}
    for e in record["entries"]:
        if e["stage"] not in stages:
            continue
        for p in e.get("problems", []):
            if p["status"] in (Status.ERROR, Status.EMPTY):
                failed.setdefault((e.get("model"), e.get("sparsity"), p["layer"]),
                                  {"model": e.get("model"), "sparsity": e.get("sparsity"), "layer": p["layer"],
                                   "status": p["status"], "message": p["message"]})
    if until == "extract":
        total = {(e["model"], None, r["layer"]) for e in artifacts_of(record, "extract")
                 for r in read_artifact(root / e["path"], columns=["layer", "status"]).to_pylist()
                 if r["status"] != Status.SKIPPED}
    else:
        total = {(r["model"], r["sparsity"], r["layer"]) for r in rows} | set(failed)
        if until == "emit":
            for r in rows:
                if r["status"] not in (Status.OK, Status.FALLBACK):
                    failed.setdefault((r["model"], r["sparsity"], r["layer"]),
                                      {"model": r["model"], "sparsity": r["sparsity"], "layer": r["layer"],
                                       "status": r["status"], "message": ""})
    return {"total": len(total), "failed": sorted(failed.values(), key=lambda f: (f["model"] or "", f["layer"]))}
