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
from lospmm.status import Status

SEARCH_STAGES = ("prune", "reorder", "rank", "cluster", "compile", "time", "emit")
SUMMARY = pa.schema(
    LAYER + [("sparsity", F64), ("status", STR), ("candidates", I32), ("after_constrain", I32),
             ("after_rank", I32), ("timed", I32), ("m1", I32), ("n1", I32), ("dtype", STR), ("timer", STR),
             ("time_us", F64), ("speedup_vs_dense", F64)]
    + [(f"{s}_seconds", F64) for s in SEARCH_STAGES]
    + [("search_seconds", F64), ("kernel_dir", STR)]
)
SCHEMAS = artifact_schemas()


def write_summary(root: Path, record: dict) -> tuple[str | None, list[dict]]:
    """Per layer: candidates at each step, search seconds by stage, chosen tile and its time; written
    to summary/<run_id>.parquet and published as a Prefect table artifact. Returns the file's path
    (None if nothing ran) and the rows."""
    from prefect.artifacts import create_table_artifact

    by = {}
    for e in artifacts_of(record):
        if "sparsity" in e:
            # the scalar columns only: the CSR and tile payloads are not needed here
            cols = schemas.scalar_columns(SCHEMAS[e["stage"]])
            by.setdefault((e["model"], e["sparsity"]), {})[e["stage"]] = \
                read_artifact(root / e["path"], columns=cols).to_pylist()
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
            status = em.get("status") or (Status.NO_CANDIDATE if not kept[name] and "constrain" in arts
                                          else Status.NOT_EMITTED)
            if status == Status.OK and name in fell_back:
                status = Status.FALLBACK
            row = {**layer_fields(lay), "sparsity": sparsity, "status": status, "candidates": total[name],
                   "after_constrain": kept[name], "after_rank": chosen.get(name) if "rank" in arts else None,
                   "timed": timed.get(name) if "time" in arts else None, "m1": em.get("m1"), "n1": em.get("n1"),
                   "dtype": em.get("dtype"),
                   "timer": em.get("timer"), "time_us": em.get("full_time_us"),
                   "speedup_vs_dense": em.get("speedup_vs_dense"), "kernel_dir": em.get("kernel_dir")}
            row.update({f"{s_}_seconds": seconds[s_].get(name) for s_ in stages})
            row["search_seconds"] = sum(row[f"{s_}_seconds"] or 0.0 for s_ in stages)
            rows.append(row)
    if not rows:
        return None, []
    path = root / "summary" / f"{record['run_id']}.parquet"
    write_artifact(path, schemas.table_from_rows(rows, SUMMARY),
                   {"stage": "summary", "key": record["run_id"], "label": record["run_id"], "seconds": 0.0})
    show = ("model", "layer", "sparsity", "status", "candidates", "after_constrain", "after_rank", "timed", "m1",
            "n1", "dtype", "timer", "time_us", "speedup_vs_dense", *(f"{s_}_seconds" for s_ in stages), "search_seconds")
    create_table_artifact(table=[{k: r[k] for k in show} for r in rows], key="lospmm-layer-summary",
                          description=f"lospmm run {record['run_id']}: per layer (time_us from the "
                                      f"timer named in each row; 'estimate…' rows are model estimates)")
    return str(path.relative_to(root)), rows


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
