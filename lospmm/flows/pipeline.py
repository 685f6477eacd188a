"""The Prefect flow: for every source × sparsity, each node of the DAG (`lospmm.flows.dag`) is
submitted as a task with the parameters the DAG declares and a cache key derived from them.

A re-run with nothing changed is all Cached; an artifact that is missing or fails its checksum is
recomputed; a task reuses a whole artifact that a killed run left without a Prefect cache record.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.futures import wait

from lospmm.flows.execution import progress
from lospmm.flows.config import RunConfig, RunPlan, resolved
from lospmm.flows.dag import DAG, node_key
from lospmm.flows.storage.runs import RunStatus, process_fields, write_run_record
from lospmm.flows.storage.store import artifact_path, intact_sidecar, sidecar_path, valid_sidecar
from lospmm.flows.reports.summary import layer_outcomes, write_summary
from lospmm.flows.execution.taskio import POLLING_STOP, STOP, RunContext


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


# Plans the CLI validated, handed to the flow run of the same id (its Prefect parameters stay the
# user's options, as a deployment would pass them).
_PLANS: dict[str, RunPlan] = {}


def run_plan(plan: RunPlan, refresh: list[str] | None = None, run_id: str | None = None) -> dict:
    """The flow on a plan already validated (the CLI's entry)."""
    run_id = run_id or new_run_id()
    _PLANS[run_id] = plan
    flow_ = pipeline
    if plan.config.dask:  # the same flow, its tasks on the user's Dask cluster
        from prefect_dask import DaskTaskRunner

        flow_ = pipeline.with_options(task_runner=DaskTaskRunner(address=plan.config.dask))
    try:
        return flow_(config=plan.config.as_dict(), refresh=refresh, run_id=run_id)
    finally:
        _PLANS.pop(run_id, None)


@flow(name="lospmm-pipeline")
def pipeline(config: dict, refresh: list[str] | None = None, run_id: str | None = None) -> dict:
    """Stages 1–10 (until the config's last stage) for every zoo model / weights file × sparsity.

    `config`: a RunConfig as a dict (a deployment's parameters), validated here unless `run_plan`
    handed over its plan. `refresh` names stages to recompute even when cached (their dependants
    follow by key only if their inputs' keys change, so callers pass the downstream stages too)."""
    run_id = run_id or new_run_id()
    plan = _PLANS.get(run_id) or resolved(RunConfig.from_dict(config))
    _stop_on_sigterm()
    root = plan.root
    root.mkdir(parents=True, exist_ok=True)
    refresh = set(refresh or ())
    ctx = RunContext(str(root), run_id, plan.jobs, plan.config.dask)
    record = {"run_id": run_id, "config": plan.config.as_dict(), "refresh": sorted(refresh),
              "status": RunStatus.RUNNING, **process_fields(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "entries": []}
    write_run_record(root, record)
    t_start = time.perf_counter()

    submitted: list[tuple[dict, Any]] = []
    logger = get_run_logger()
    nodes = [n for n in DAG if n.stage in plan.stages]
    for source in plan.sources:
        done: dict[str, tuple[str, Any]] = {}  # stage -> (key, future) for this source and sparsity
        for s in plan.sparsities:
            for node in nodes:
                if not node.per_sparsity and node.stage in done:
                    continue  # extract: once per source
                label = f"{source.label}-s{s:g}" if node.per_sparsity else source.label
                params = node.params(plan, source, s)
                key = node_key(node.stage, params, [done[i][0] for i in node.inputs])
                force = node.stage in refresh
                use_cache = not force and _reusable(artifact_path(root, node.stage, label, key), node.stage, label, logger)
                future = node.task.with_options(refresh_cache=not use_cache,
                                                result_storage=root / ".prefect-results").submit(
                    key=key, ctx=ctx, label=label, inputs={i: done[i][1] for i in node.inputs}, force=force,
                    **params)
                done[node.stage] = (key, future)
                where = {"model": source.label} | ({"sparsity": s} if node.per_sparsity else {})
                submitted.append(({"stage": node.stage, "label": label, "key": key, **where}, future))

    _awaited(run_id, submitted)
    for entry, fut in submitted:
        state = fut.state
        entry["state"] = state.name
        if state.is_completed():
            m = fut.result()
            entry.update(path=m["path"], rows=m["rows"], seconds=m["seconds"], problems=m["problems"],
                         reused=m["reused"])
        else:
            entry["error"] = _state_message(state)
        record["entries"].append(entry)
    record.update(status=RunStatus.COMPLETED if all(e["state"] in ("Completed", "Cached") for e in record["entries"])
                  else RunStatus.FAILED, wall_seconds=time.perf_counter() - t_start,
                  finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        record["summary"], rows = write_summary(root, record)
        record["layers"] = layer_outcomes(root, record, rows)
    except Exception as e:  # the stages' artifacts stand on their own; say why the summary is missing
        record["summary_error"] = f"{type(e).__name__}: {e}"
    write_run_record(root, record)
    _publish_summary(root, record)
    return {k: record[k] for k in ("run_id", "status", "wall_seconds")} | {"artifacts": str(root)}


def _reusable(path: Path, stage: str, label: str, logger) -> bool:
    """Whether the artifact at `path` may be served as cached; says why not when one is there."""
    if valid_sidecar(path) is not None:
        return True
    if sidecar_path(path).exists():
        why = ("was written incomplete (a layer failed in a way a retry may fix)" if intact_sidecar(path) is not None
               else "or a kernel directory it lists fails its checksum (damaged or edited)")
        logger.warning("%s %s: the artifact %s; computing it again", stage, label, why)
    return False


def _stop_on_sigterm() -> None:
    """Prefect replaces the SIGTERM handler for the length of a flow run (it raises its own
    TerminationSignal, and leaving the flow then waits for the running tasks to finish their whole
    stage). Chain a handler in front of Prefect's that first asks the tasks to stop at their next
    item; Prefect restores the previous handler when the flow run ends."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        STOP.set()
        if POLLING_STOP.is_set():  # the flow's wait sees STOP and stops from a safe place
            return
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _awaited(run_id: str, submitted: list[tuple[dict, Any]]) -> None:
    """Wait for every task, publishing progress (Prefect progress artifact and log) as they go."""
    progress.started(run_id, [(e["stage"], e["label"]) for e, _ in submitted])
    publisher = progress.Publisher(run_id, get_run_logger())
    pending = list(submitted)
    POLLING_STOP.set()
    try:
        while pending:
            if STOP.is_set():  # a signal asked to stop: the tasks stop at their next item
                raise KeyboardInterrupt
            done = wait([f for _, f in pending], timeout=0.25).done
            for entry, f in [p for p in pending if p[1] in done]:
                progress.report(run_id, entry["stage"], entry["label"], 1, 1)  # cached tasks report nothing
            pending = [p for p in pending if p[1] not in done]
            publisher.push()
        wait([f for _, f in submitted])  # a timed wait may return a future before its final state is set
        publisher.push(final=True)
    finally:
        POLLING_STOP.clear()
        progress.finished(run_id)


def _state_message(state) -> str:
    try:
        state.result()
    except BaseException as e:  # the task's own exception, for the record
        return "".join(traceback.format_exception_only(type(e), e)).strip()
    return state.message or state.name


def _publish_summary(root: Path, record: dict) -> None:
    lines = [f"# lospmm run `{record['run_id']}` — {record['status']}", "",
             "| stage | model | sparsity | state | rows | seconds | artifact |", "|---|---|---|---|---|---|---|"]
    for e in record["entries"]:
        link = f"[{e.get('path', '-')}]({(root / e['path']).as_uri()})" if e.get("path") else e.get("error", "-")
        lines.append(f"| {e['stage']} | {e.get('model', '')} | {e.get('sparsity', '')} | {e['state']} | "
                     f"{e.get('rows', '')} | {e.get('seconds', 0):.2f} | {link} |")
    problems = {(p["layer"], p["message"]) for e in record["entries"] for p in e.get("problems", [])}
    if problems:
        lines += ["", "## Layers with problems", ""] + [f"- `{layer}`: {msg}" for layer, msg in sorted(problems)]
    create_markdown_artifact(markdown="\n".join(lines), key="lospmm-run-summary",
                             description=f"lospmm run {record['run_id']}")
