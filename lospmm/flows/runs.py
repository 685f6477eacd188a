"""Run records: `<root>/runs/<run_id>.json`, written when a run starts and when it ends."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from lospmm.flows.store import atomic_write


class RunStatus(enum.StrEnum):
    """A run's state in its record (a layer's outcome is a lospmm.stages.status.Status)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


def runs_dir(root: str | Path) -> Path:
    return Path(root) / "runs"


def write_run_record(root: str | Path, record: dict[str, Any]) -> Path:
    path = runs_dir(root) / f"{record['run_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1, default=str)))
    return path


def run_records(root: str | Path) -> list[dict[str, Any]]:
    """All readable run records, oldest first."""
    out = []
    for p in sorted(runs_dir(root).glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def run_record(root: str | Path, run_id: str | None = None) -> dict[str, Any]:
    """The named run (a unique prefix will do), or the latest; LookupError if none matches."""
    records = run_records(root)
    if not records:
        raise LookupError(f"no runs under {Path(root) / 'runs'}")
    if run_id is None:
        return records[-1]
    matches = [r for r in records if r["run_id"].startswith(run_id)]
    if len(matches) != 1:
        known = ", ".join(r["run_id"] for r in records[-5:])
        raise LookupError(f"run {run_id!r} matches {len(matches)} runs; recent: {known}")
    return matches[0]
