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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import CancelledRun
from prefect.states import Cancelled

from lospmm.flows.execution import progress
from lospmm.flows.config import RunConfig, RunPlan, resolved
from lospmm.flows.dag import DAG, Node, node_key
from lospmm.flows.storage.runs import RunStatus, process_fields, release_reserve, reserve_space, write_run_record
from lospmm.flows.storage.store import artifact_path, checked_sidecar, sidecar_path, valid_sidecar
from lospmm.flows.reports.summary import (layer_outcomes, publish_layer_summary, pruned_again_lines, scalar_artifacts,
                                          write_summary)
from lospmm.flows.execution.stopping import stopped_quietly
from lospmm.flows.execution.taskio import POLLING_STOP, STOP, Interrupted, RunContext, quiet_disk_errors, run_failure


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


# Plans the CLI validated, handed to the flow run of the same id (its Prefect parameters stay the
# user's options, as a deployment would pass them).
_PLANS: dict[str, RunPlan] = {}
STOPPED = "the run was asked to stop; its finished artifacts are kept"


def run_plan(plan: RunPlan, refresh: list[str] | None = None, run_id: str | None = None,
             before_flow: Callable[[], Any] | None = None) -> dict:
    """The flow on a plan already validated (the CLI's entry); a run whose every artifact is already
    there and intact is recorded from them without starting Prefect (`served_from_artifacts`).
    `before_flow` runs first where the flow does (the CLI detaches the API Prefect starts)."""
    run_id = run_id or new_run_id()
    if not refresh:
        served = served_from_artifacts(plan, run_id)
        if served is not None:
            return served
    if before_flow is not None:
        before_flow()
    _PLANS[run_id] = plan
    flow_ = pipeline
    if plan.config.dask:  # the same flow, its tasks on the user's Dask cluster
        from prefect_dask import DaskTaskRunner

        flow_ = pipeline.with_options(task_runner=DaskTaskRunner(address=plan.config.dask))
    try:
        return flow_(config=plan.config.as_dict(), refresh=refresh, run_id=run_id)
    except CancelledRun:  # the flow's Cancelled state, for a stop asked for (pipeline)
        raise Interrupted(STOPPED) from None
    finally:
        _PLANS.pop(run_id, None)


@dataclass(frozen=True)
class PlannedTask:
    """One node of the DAG for one source (and sparsity): its artifact's label and key, the
    parameters its task gets, and the labels of the inputs it reads (stage -> label)."""

    node: Node
    label: str
    key: str
    params: dict
    inputs: dict
    where: dict  # the record's model (and sparsity) fields

    def entry(self) -> dict:
        return {"stage": self.node.stage, "label": self.label, "key": self.key, **self.where}


def planned_tasks(plan: RunPlan) -> list[PlannedTask]:
    """Every task of the plan in submission order, its key derived from the DAG's declaration
    (dag.node_key of its parameters and its inputs' keys): the flow and the cached path agree."""
    out = []
    nodes = [n for n in DAG if n.stage in plan.stages]
    for source in plan.sources:
        done: dict[str, tuple[str, str]] = {}  # stage -> (label, key) for this source and sparsity
        for s in plan.sparsities:
            for node in nodes:
                if not node.per_sparsity and node.stage in done:
                    continue  # extract: once per source
                label = f"{source.label}-s{s:g}" if node.per_sparsity else source.label
                params = node.params(plan, source, s)
                key = node_key(node.stage, params, [done[i][1] for i in node.inputs])
                done[node.stage] = (label, key)
                out.append(PlannedTask(node, label, key, params, {i: done[i][0] for i in node.inputs},
                                       {"model": source.label} | ({"sparsity": s} if node.per_sparsity else {})))
    return out


def artifacts_left(record: dict, root: str | Path) -> list[dict] | None:
    """What a run that did not finish (cancelled, killed, or still running) has left under `root`: each
    task of its plan (its config planned again) as a record entry, `state` "kept" with its artifact's
    path, rows and seconds where that artifact is whole, else "not there". Its record lists tasks only
    once its flow ends. None where the plan cannot be made again (its weights file moved or changed)."""
    from dataclasses import replace

    try:
        plan = resolved(replace(RunConfig.from_dict(record["config"]), artifacts=str(root)))
    except Exception:  # a ConfigError, or anything a changed environment raises: nothing to say
        return None
    entries = []
    for t in planned_tasks(plan):
        path = artifact_path(plan.root, t.node.stage, t.label, t.key)
        meta = valid_sidecar(path)
        entries.append(t.entry() | ({"state": "kept", "path": str(path.relative_to(plan.root)), "rows": meta["rows"],
                                     "seconds": meta["seconds"]} if meta else {"state": "not there"}))
    return entries


def served_from_artifacts(plan: RunPlan, run_id: str) -> dict | None:
    """A run every artifact of which is already there and intact (valid_sidecar, kernel directories
    included): recorded as all Cached, with its summary, without starting Prefect's server (a
    cached run costs what reading the sidecars costs). None when any task has work to do."""
    root = plan.root
    entries = []
    for t in planned_tasks(plan):
        path = artifact_path(root, t.node.stage, t.label, t.key)
        meta = valid_sidecar(path)
        if meta is None:
            return None
        entries.append(t.entry() | {"state": "Cached", "path": str(path.relative_to(root)), "rows": meta["rows"],
                                    "seconds": meta["seconds"], "problems": meta.get("problems", []),
                                    "reused": True})
    record = {"run_id": run_id, "config": plan.config.as_dict(), "refresh": [], "status": RunStatus.COMPLETED,
              **process_fields(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "entries": entries,
              "served_from_artifacts": True}
    t_start = time.perf_counter()
    try:
        root.mkdir(parents=True, exist_ok=True)
        return _finished(root, record, t_start)
    except OSError as e:
        return {"run_id": run_id, "status": RunStatus.FAILED, "error": run_failure(e), "artifacts": str(root)}


def _flow_run_name() -> str:
    """The flow run's name in Prefect (its UI, its logs' `Flow run '…'`): the lospmm run id that `lospmm
    inspect` and the run record use, where the caller gave one (the CLI and lt.search do); else
    Prefect's two random words, as for a deployment's run."""
    from prefect.runtime import flow_run
    from prefect.utilities.names import generate_slug

    return flow_run.parameters.get("run_id") or generate_slug(2)


@flow(name="lospmm-pipeline", flow_run_name=_flow_run_name)
def pipeline(config: dict, refresh: list[str] | None = None, run_id: str | None = None) -> dict:
    """Stages 1–10 (until the config's last stage) for every zoo model / weights file × sparsity.

    `config`: a RunConfig as a dict (a deployment's parameters), validated here unless `run_plan`
    handed over its plan. `refresh` names stages to recompute even when cached (their dependants
    follow by key only if their inputs' keys change, so callers pass the downstream stages too)."""
    run_id = run_id or new_run_id()
    plan = _PLANS.get(run_id) or resolved(RunConfig.from_dict(config))
    _stop_on_sigterm()
    quiet_disk_errors()
    stopped_quietly()
    root = plan.root
    root.mkdir(parents=True, exist_ok=True)
    refresh = set(refresh or ())
    ctx = RunContext(str(root), run_id, plan.jobs, plan.config.dask)
    record = {"run_id": run_id, "config": plan.config.as_dict(), "refresh": sorted(refresh),
              "status": RunStatus.RUNNING, **process_fields(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "entries": []}
    try:
        write_run_record(root, record)
        reserve_space(root, run_id)  # so that the last record fits whatever fills the disk meanwhile
    except OSError as e:
        return _failed_run(root, record, run_failure(e))
    t_start = time.perf_counter()

    submitted: list[tuple[dict, Any]] = []
    futures: dict[tuple[str, str], Any] = {}  # (stage, label) -> future
    logger = get_run_logger()
    for t in planned_tasks(plan):
        stage = t.node.stage
        force = stage in refresh
        use_cache = not force and _reusable(artifact_path(root, stage, t.label, t.key), stage, t.label, logger)
        future = t.node.task.with_options(refresh_cache=not use_cache,
                                          result_storage=root / ".prefect-results").submit(
            key=t.key, ctx=ctx, label=t.label, inputs={i: futures[(i, label)] for i, label in t.inputs.items()},
            force=force, **t.params)
        futures[(stage, t.label)] = future
        submitted.append((t.entry(), future))

    if not _awaited(run_id, submitted, here=not plan.config.dask):  # (run_plan raises Interrupted to its caller)
        _cancelled(root, record)
        return Cancelled(message=STOPPED)
    for entry, fut in submitted:
        state = fut.state
        entry["state"] = state.name
        m = fut.result() if state.is_completed() else None
        if m is not None and m.get("failed"):  # a failure of the run, as a value (taskio.run_stage)
            entry.update(state="Failed", error=m["failed"])
        elif m is not None:
            entry.update(path=m["path"], rows=m["rows"], seconds=m["seconds"], problems=m["problems"],
                         reused=m["reused"])
        else:
            entry["error"] = _state_message(state)
        record["entries"].append(entry)
    record["status"] = (RunStatus.COMPLETED if all(e["state"] in ("Completed", "Cached") for e in record["entries"])
                        else RunStatus.FAILED)
    try:
        result = _finished(root, record, t_start)
    except OSError as e:
        return _failed_run(root, record, f"its record could not be written: {run_failure(e)}")
    publish_layer_summary(record, result.pop("rows"))
    _publish_summary(root, record)
    return result


def _finished(root: Path, record: dict, t_start: float) -> dict:
    """The run's end, written: its summary (summary/<run_id>.parquet), its layers' outcomes, the lines
    on weights pruned again, its record, in the room its reserve kept. OSError where the record cannot be written."""
    record.update(wall_seconds=time.perf_counter() - t_start, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    release_reserve(root, record["run_id"])  # the room set aside for what follows
    rows = []
    try:
        arts = scalar_artifacts(root, record)
        record["summary"], rows = write_summary(root, record, arts)
        record["layers"] = layer_outcomes(root, record, rows)
        record["pruned_again"] = pruned_again_lines(record, arts)
    except Exception as e:  # the stages' artifacts stand on their own; say why the summary is missing
        record["summary_error"] = run_failure(e) or f"{type(e).__name__}: {e}"
    write_run_record(root, record, final=True)
    return {k: record[k] for k in ("run_id", "status", "wall_seconds")} | {"artifacts": str(root), "rows": rows}


def _cancelled(root: Path, record: dict) -> None:
    """A run stopped on request, written so (as the CLI and lt.search would: a deployment's run too),
    its reserve freed; where the disk refuses, the record stays `running` and reads as `killed`."""
    record.update(status=RunStatus.CANCELLED, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        write_run_record(root, record, final=True)
    except OSError:
        pass


def _failed_run(root: Path, record: dict, line: str) -> dict:
    """The flow's result when the run itself cannot go on (the disk is full): its one line, written
    to the record where that still fits (with the reserve freed); else the record stays `running`
    and reads as `killed` once this process is gone."""
    record.update(status=RunStatus.FAILED, error=line, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        write_run_record(root, record, final=True)
    except OSError:
        pass
    get_run_logger().error("run %s failed: %s", record["run_id"], line)
    return {"run_id": record["run_id"], "status": RunStatus.FAILED, "error": line, "artifacts": str(root)}


def _reusable(path: Path, stage: str, label: str, logger) -> bool:
    """Whether the artifact at `path` may be served as cached; says why not when one is there."""
    if valid_sidecar(path) is not None:
        return True
    if sidecar_path(path).exists():
        meta, problem = checked_sidecar(path)
        why = ("the artifact was written incomplete (a layer failed in a way a retry may fix)"
               if meta is not None else problem or "the artifact fails its checksum")
        logger.warning("%s %s: %s; computing it again", stage, label, why)
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


def _awaited(run_id: str, submitted: list[tuple[dict, Any]], here: bool = True) -> bool:
    """Wait for every task, publishing progress (Prefect progress artifact and log) as they go. False
    when a stop was asked for: the tasks stopped at their next item, and the flow ends Cancelled
    (not Crashed, as a KeyboardInterrupt out of it would). `here`: the tasks run in this process, so
    they see the stop and are waited for; a Dask cluster's do not (its workers have their own STOP):
    the flow leaves at once, and the task runner's exit closes its client."""
    progress.started(run_id, [(e["stage"], e["label"]) for e, _ in submitted])
    publisher = progress.Publisher(run_id, get_run_logger())
    pending = list(submitted)
    stopped = False
    # Not prefect.futures.wait(…, timeout=): in the main thread it times out with SIGALRM, whose handler
    # raises wherever the thread is, 4 times a second here: inside a lock's release ("RuntimeError:
    # release unlocked lock" ended a run) or inside Prefect's own cancel scope (the handler then waited
    # on a lock the interrupted code held: the run hung). A done callback sets an event; the wait on it
    # is a plain timed wait.
    finished = threading.Event()
    for _, f in pending:
        f.add_done_callback(lambda _future: finished.set())
    POLLING_STOP.set()
    try:
        while pending and not stopped:
            stopped = STOP.is_set()  # a signal asked to stop: the tasks stop at their next item
            finished.wait(0.25)
            finished.clear()  # before the look: a task finishing after it sets the event again
            done = {f for _, f in pending if _future_done(f)}
            for entry, f in [p for p in pending if p[1] in done]:
                if not (f.state.is_crashed() or f.state.is_cancelled()):  # (a task that stopped is not finished)
                    progress.report(run_id, entry["stage"], entry["label"], 1, 1)  # cached tasks report nothing
            pending = [p for p in pending if p[1] not in done]
            publisher.push()
        if stopped and not here:
            return False
        for _, f in submitted:  # each to its end (a timed wait may return one before its final state is set)
            try:
                f.wait()
            except Interrupted:  # a task that stopped on request raises it out of its future
                stopped = True
        if not stopped:
            publisher.push(final=True)
        return not stopped
    finally:
        POLLING_STOP.clear()
        progress.finished(run_id)


def _future_done(future) -> bool:
    """Whether a task's future is done, without asking the API: its wrapped future's (a thread pool's or
    Dask's), else its state."""
    wrapped = getattr(future, "wrapped_future", None)
    return wrapped.done() if wrapped is not None else future.state.is_final()


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
