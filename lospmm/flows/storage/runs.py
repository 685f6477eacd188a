"""Run records: `<root>/runs/<run_id>.json`, written when a run starts and when it ends."""

from __future__ import annotations

import enum
import json
import os
import socket
from pathlib import Path
from typing import Any

from lospmm.files import atomic_write


class RunStatus(enum.StrEnum):
    """A run's state in its record (a layer's outcome is a lospmm.status.Status)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped by SIGINT/SIGTERM; its finished artifacts are kept
    KILLED = "killed"  # never written: a record left `running` by a process that is gone (SIGKILL, a crash)


def process_fields() -> dict[str, Any]:
    """Who writes a run's record: with them a reader tells a running run from a killed one."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def shown_status(record: dict[str, Any]) -> str:
    """The record's status, or `killed` for a run recorded as running on this host whose process is
    gone (a SIGKILL or a crash leaves no chance to write the record's end)."""
    status = record.get("status", "")
    if status == "interrupted":  # a record written before 2026-11-25 names a cancelled run so
        return RunStatus.CANCELLED
    if status != RunStatus.RUNNING or record.get("host") != socket.gethostname() or not record.get("pid"):
        return status
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return RunStatus.KILLED
    except (OSError, ValueError):
        pass
    return status


def runs_dir(root: str | Path) -> Path:
    return Path(root) / "runs"


# Room kept for a run's last record: a disk that fills during the run (another process, the run's
# own kernels) still lets the record say how the run ended. Enough for 10,000 failed layers' names.
RESERVE_BYTES = 4 << 20


def reserve_path(root: str | Path, run_id: str) -> Path:
    return runs_dir(root) / f".{run_id}.reserve"


def reserve_space(root: str | Path, run_id: str) -> None:
    """Set RESERVE_BYTES aside for the run's last record (`write_run_record(final=True)` frees them
    first). Written, not sparse: a sparse file would reserve nothing. OSError when even that does not fit."""
    path = reserve_path(root, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "wb") as f:
            f.write(bytes(RESERVE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        raise


def release_reserve(root: str | Path, run_id: str) -> None:
    """Free the run's reserve: its summary and last record are written next."""
    reserve_path(root, run_id).unlink(missing_ok=True)


def write_run_record(root: str | Path, record: dict[str, Any], final: bool = False) -> Path:
    """Write the record atomically; `final`: the run's last, written after freeing its reserve."""
    path = runs_dir(root) / f"{record['run_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, default=str)
    if final:
        release_reserve(root, record["run_id"])
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def _read(path: Path) -> dict[str, Any]:
    record = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise ValueError("no run_id")
    return record


def run_records(root: str | Path) -> list[dict[str, Any]]:
    """All readable run records, oldest first (`damaged_records` lists the others)."""
    out = []
    for p in sorted(runs_dir(root).glob("*.json")):
        try:
            out.append(_read(p))
        except (OSError, ValueError):
            continue
    return out


def damaged_records(root: str | Path) -> list[tuple[Path, str]]:
    """Run record files that cannot be read (truncated, not JSON, no run id), with the reason."""
    out = []
    for p in sorted(runs_dir(root).glob("*.json")):
        try:
            _read(p)
        except (OSError, ValueError) as e:
            out.append((p, f"{type(e).__name__}: {e}"[:200]))
    return out


def run_record(root: str | Path, run_id: str | None = None) -> dict[str, Any]:
    """The named run (its id, or a unique prefix of it), or the latest; LookupError says why not,
    naming a damaged record file rather than reporting no runs."""
    records, damaged = run_records(root), damaged_records(root)
    exact = [r for r in records if r["run_id"] == run_id]
    matches = exact or [r for r in records if run_id is not None and r["run_id"].startswith(run_id)]
    bad = [(p, why) for p, why in damaged if run_id is not None and p.stem.startswith(run_id)]
    if bad and not matches:
        raise LookupError(f"run {run_id!r}: its record {bad[0][0]} is damaged ({bad[0][1]})")
    if not records:
        if damaged:
            raise LookupError(f"no readable run record under {runs_dir(root)}; damaged: "
                              + "; ".join(f"{p.name} ({why})" for p, why in damaged[:5]))
        raise LookupError(f"no runs under {runs_dir(root)}")
    if run_id is None:
        return records[-1]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(r["run_id"] for r in records[-5:])
    raise LookupError(f"run {run_id!r} matches {len(matches)} runs; recent: {known}")


_ANY = object()


def why_no_artifact(record: dict[str, Any], stage: str, again: str = "run its command again") -> str:
    """Why the run's record lists no `stage` artifact, in a few words naming the run: it stopped
    before its end wrote the record's artifacts (cancelled, killed, failed, still running), or its
    `--until` ends before `stage`; else that it has none. `again`: how the reader finishes a run."""
    from lospmm.stages import STAGES

    run_id, status = record.get("run_id", "?"), shown_status(record)
    ended = {RunStatus.CANCELLED: "was cancelled", RunStatus.KILLED: "was killed", RunStatus.RUNNING: "is still running",
             RunStatus.FAILED: "failed"}.get(status, f"is {status}" if status else "has no status")
    if status in (RunStatus.CANCELLED, RunStatus.KILLED, RunStatus.RUNNING) and not record.get("entries"):
        return f"run {run_id} {ended}, and its record lists no artifacts (a run's end writes them): {again} to finish it"
    until = (record.get("config") or {}).get("until")
    if until in STAGES and stage in STAGES and STAGES.index(until) < STAGES.index(stage):
        return f"run {run_id} stopped after {until} (--until {until}): it has no {stage} artifact"
    if status != RunStatus.COMPLETED:
        return f"run {run_id} {ended}: it has no {stage} artifact"
    return f"run {run_id} has no {stage} artifact"


def artifacts_of(record: dict[str, Any], stage: str | None = None, model: str | None = None,
                 sparsity: Any = _ANY) -> list[dict[str, Any]]:
    """The record's entries that wrote an artifact (those with a path), of `stage`, `model` and
    `sparsity` where given (sparsity None: the per-model stages, extract)."""
    return [e for e in record["entries"] if e.get("path") and (stage is None or e["stage"] == stage)
            and (model is None or e.get("model") == model) and (sparsity is _ANY or e.get("sparsity") == sparsity)]
