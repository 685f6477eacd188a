"""What every task adapter shares: the Prefect task options (the cache key is the artifact key),
reading upstream artifacts into stage inputs, one layer's failure kept to that layer, fanning out
over threads, and writing the artifact with its manifest."""

from __future__ import annotations

import contextvars
import errno
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
from prefect import task

from lospmm.flows.execution import progress
from lospmm.flows.storage import schemas
from lospmm.files import manifest_hash
from lospmm.flows.storage.store import (artifact_path, locked, read_artifact, valid_sidecar,
                                 write_artifact)
from lospmm.status import Status


# Set when the run is asked to stop (SIGINT, SIGTERM): tasks stop at their next item, and a stage
# that did not finish writes nothing, so a re-run resumes from the finished artifacts.
STOP = threading.Event()

# Set while the flow's thread waits on its tasks: it polls STOP there itself, so a signal handler
# must only set STOP. An exception raised by a handler inside a threading wait can release that
# wait's lock twice ("release unlocked lock") and turn a clean stop into a failed run.
POLLING_STOP = threading.Event()


class Interrupted(BaseException):
    """The run was asked to stop. A BaseException: no per-layer `except Exception` turns it into a row."""


def stop_requested() -> None:
    if STOP.is_set():
        raise Interrupted("the run was asked to stop")


def stoppable(items: Iterable):
    """`items`, checking for a stop request before each: a stage's loop over layers stops within one
    layer of a Ctrl-C or SIGTERM."""
    for item in items:
        stop_requested()
        yield item


@dataclass(frozen=True)
class RunContext:
    """What a task needs that is not part of any artifact's identity: where artifacts live, the
    run (for progress), how many threads compile and emit may use, and the Dask scheduler the
    flow runs on ("" when local)."""

    root: str
    run_id: str = ""
    jobs: int = 1
    dask: str = ""

    def path(self, manifest: dict) -> Path:
        return Path(self.root) / manifest["path"]

    def read(self, manifest: dict, columns: list[str] | None = None) -> pa.Table:
        return read_artifact(self.path(manifest), columns=columns)

    def reporter(self, stage: str, label: str) -> Callable[[int, int, dict], None]:
        """Progress callback for `in_parallel`: the flow's progress artifact counts items as they land."""
        def report(done: int, total: int, row: dict) -> None:
            progress.report(self.run_id, stage, label, done, total, _item(stage, row))
        return report

    def unit_reporter(self, stage: str, label: str, row: dict, items: int) -> Callable[[int, int], None]:
        """Progress callback for one item's unit compiles (`units.run_compiler`): its units count as
        they land, before the item (one of the task's `items`) finishes."""
        item = _item(stage, row)
        return lambda landed, total: progress.units(self.run_id, stage, label, item, landed, total, items)


def _item(stage: str, row: dict) -> str:
    """How progress names an item: its layer, and for per-M1 stages the M1."""
    return row.get("layer", "") + (f" M1={row['m1']}" if row.get("m1") and stage != "emit" else "")


def lock_wait_noted(line: str) -> None:
    """Say, once a lock has been waited on a while, who holds it (store.locked's `waiting`)."""
    run_logger().info(line)


def run_logger():
    """Prefect's logger for the task run, or a plain logger when an adapter is called directly."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_logger, get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return get_logger("lospmm")


def _cache_key(_context, parameters: dict[str, Any]) -> str:
    return parameters["key"]


def stage_task(stage: str):
    """A Prefect task for `stage` whose cache key is the `key` argument (the artifact key the flow
    derived from the DAG's declaration of this node) and whose result is the small manifest."""
    return task(name=stage, task_run_name=stage + ":{label}", cache_key_fn=_cache_key, persist_result=True,
                result_serializer="json")


def layer_fields(row: dict, *extra: str) -> dict:
    """The columns that identify a layer (plus `extra`), copied from an upstream row."""
    return {f: row[f] for f in schemas.LAYER_COLUMNS + extra}


def is_transient(error: BaseException) -> bool:
    """A failure that may pass on a retry — I/O (a full disk), memory, a time-out, a killed compiler —
    as against the layer's own bad data, which fails the same way every time."""
    return isinstance(error, (OSError, MemoryError, TimeoutError)) or bool(getattr(error, "transient", False))


def failed_row(base: dict, where: str, error: BaseException) -> dict:
    """One layer's (or candidate's) failure as a row: the others carry on. A transient failure is
    marked so: it is retried once, and an artifact holding one is never reused. An error that names
    `where` itself first (`layer: why`, as the stages' ValueErrors do) is not prefixed with it again."""
    text = str(error)
    said = text[len(where) + 2:] if where and text.startswith(f"{where}: ") else text
    return {**base, "status": Status.ERROR, "message": f"{where}: {type(error).__name__}: {said}",
            **({"transient": True} if is_transient(error) else {})}


def scalar_rows(ctx: RunContext, manifest: dict, schema) -> list[dict]:
    """An artifact's rows without its list payloads (CSR, tiles)."""
    return ctx.read(manifest, columns=schemas.scalar_columns(schema)).to_pylist()


def chosen_rows(ctx: RunContext, ranked: dict) -> list[dict]:
    """The candidates rank chose, in (layer, M1, N1) order."""
    table = ctx.read(ranked)
    return table.filter(table["chosen"]).to_pylist()


def grouped(rows: Iterable[dict], *cols: str) -> dict:
    """Rows grouped by the values of `cols`, first-seen order."""
    out: dict = {}
    for r in rows:
        out.setdefault(r[cols[0]] if len(cols) == 1 else tuple(r[c] for c in cols), []).append(r)
    return out


def in_parallel(fn: Callable, items, jobs: int, report: Callable[[int, int, dict], None] | None = None) -> list:
    """fn over items, results in order; threads when jobs > 1 (NVRTC and the host compiler release
    the GIL). `report(done, total, row)` is called as each item finishes."""
    items = list(items)
    report = report or (lambda done, total, row: None)
    fn = _retried_once(fn)
    if jobs <= 1 or len(items) <= 1:
        out = []
        for x in items:
            out.append(fn(x))
            report(len(out), len(items), out[-1])
        return out
    with ThreadPoolExecutor(min(jobs, len(items))) as pool:
        # each item in a copy of this thread's context: Prefect's run context (settings, the task
        # run) holds in the pool's threads too
        futures = [pool.submit(contextvars.copy_context().run, fn, x) for x in items]
        for done, f in enumerate(as_completed(futures), 1):
            report(done, len(items), f.result())
        return [f.result() for f in futures]


def _retried_once(fn: Callable) -> Callable:
    """fn, called again (after a second) when its row says the failure was transient."""
    def again(x):
        stop_requested()
        row = fn(x)
        if isinstance(row, dict) and row.get("transient"):
            stop_requested()  # a compiler killed by the terminal's Ctrl-C is no reason to retry
            time.sleep(1.0)
            stop_requested()
            row = fn(x)
        return row
    return again


def run_stage(stage: str, schema: pa.Schema, key: str, ctx: RunContext, label: str, force: bool,
              compute: Callable[[], list], upstream: dict | None = None) -> dict:
    """Reuse a whole artifact for `key` (e.g. left by a killed run without a cache record), else
    compute its rows, write it atomically with its sidecar, and return the manifest. A failure of the
    whole run (run_failure: the weights file changed, the disk is full) is a manifest with `failed`,
    its one line, and no artifact; so is a stage whose input failed. Neither is ever served as a
    result (the flow recomputes a key whose artifact is not there)."""
    stop_requested()
    failed = [m for m in (upstream or {}).values() if m.get("failed")]
    if failed:
        return _failed(stage, key, label, f"not run: {failed[0]['stage']} {failed[0]['label']} failed")
    path = artifact_path(ctx.root, stage, label, key)
    try:
        # another task or run on this key waits (saying who holds it), then reuses it
        with locked(path, check=stop_requested, waiting=lock_wait_noted):
            meta = None if force else valid_sidecar(path)
            if meta is not None:
                return _manifest(meta, ctx.root, path, reused=True)
            # built on an input that is to be recomputed (a transient failure upstream): so is this
            inherited = any(m.get("incomplete") for m in (upstream or {}).values())
            return _computed(stage, schema, key, ctx, label, path, compute, inherited)
    except Exception as e:
        line = run_failure(e)
        if line is None:
            raise
        return _failed(stage, key, label, line)


def run_failure(error: BaseException) -> str | None:
    """The one line of a failure that ends the run, not one layer: the weights file is not the one
    the run planned with, or the file system refuses a write (a full disk, a quota, a read-only
    file system); None for any other error (a bug: its traceback says where)."""
    from lospmm.flows.inputs.weights import WeightsChanged, WeightsFileError

    if isinstance(error, (WeightsChanged, WeightsFileError)):
        return str(error)
    if isinstance(error, OSError):
        return _os_error_line(error) + " (nothing of it is kept)"
    return None


def _os_error_line(error: OSError) -> str:
    what = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
            errno.EROFS: "read-only file system"}.get(error.errno, error.strerror or type(error).__name__)
    return what + (f" writing {error.filename}" if error.filename else "")


class DiskErrorsInOneLine(logging.Filter):
    """Prefect logs a task's cache record that it could not write (a full disk) with a traceback;
    the run's own line says what failed and the artifact's sidecar, not that record, decides reuse,
    so Prefect's message is kept to one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError):
            record.msg, record.args = (f"{record.getMessage()}: {_os_error_line(error)} (Prefect's cache record of the "
                                       f"task; its artifact's own sidecar decides reuse)"), ()
            record.exc_info, record.exc_text = None, None
        return True


RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def installed(kind: type[logging.Filter], loggers: tuple[str, ...] = RUN_LOGGERS) -> None:
    """A filter of `kind` on each of Prefect's run `loggers`, once: a logger that has one keeps it (a
    run's set-up called again in one process, a notebook or a test session, adds none)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


def quiet_disk_errors() -> None:
    """Install DiskErrorsInOneLine on Prefect's task and flow run loggers (once)."""
    installed(DiskErrorsInOneLine)


def _failed(stage: str, key: str, label: str, line: str) -> dict:
    return {"stage": stage, "key": key, "label": label, "failed": line}


def _computed(stage: str, schema: pa.Schema, key: str, ctx: RunContext, label: str, path: Path,
              compute: Callable[[], list], inherited: bool = False) -> dict:
    t0 = time.perf_counter()
    rows = compute()
    table = schemas.table_from_rows(rows, schema)
    problems = [{"layer": r["layer"], "status": str(r["status"]), "message": r["message"]}
                for r in rows if r.get("status") not in (Status.OK, None)]
    # One problem row per layer (reorder/constrain repeat the layer's status on each of its rows).
    problems = list({p["layer"]: p for p in problems}.values())
    # Directories beside the artifact (emit's kernels) are part of it: checked with it before reuse.
    attachments = {}
    for r in rows:
        if r.get("kernel_dir") and r.get("status") == Status.OK:
            rel = str(Path(ctx.root, r["kernel_dir"]).relative_to(path.parent))
            attachments[rel] = manifest_hash(path.parent / rel)
    meta = {"stage": stage, "key": key, "label": label, "seconds": time.perf_counter() - t0,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "problems": problems, "attachments": attachments,
            # a failure that may pass on a retry (I/O, memory, a killed compiler) is never served as a result
            "incomplete": inherited or any(r.get("transient") for r in rows)}
    return _manifest(write_artifact(path, table, meta), ctx.root, path, reused=False)


def _manifest(meta: dict, root: str, path: Path, reused: bool) -> dict:
    return {"stage": meta["stage"], "key": meta["key"], "label": meta["label"],
            "path": str(path.relative_to(root)), "rows": meta["rows"], "seconds": meta["seconds"],
            "problems": meta.get("problems", []), "reused": reused, "incomplete": bool(meta.get("incomplete"))}
