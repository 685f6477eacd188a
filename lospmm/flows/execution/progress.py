"""Run progress: tasks report items done (proxies compiled, layers emitted); the flow turns that into
a Prefect progress artifact and a log line every few seconds.

Progress is a weighted share of the run's tasks. Compile and emit carry most of the weight because
they take most of the search time (MobileNetV2 at 0.9: 12% and 87% of the search seconds); within a
task, each item counts equally, and an item whose kernel compiles in units counts the share of its
units that have landed before it finishes. The figure is a share of work items, not a time estimate.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

STAGE_WEIGHTS = {"compile": 4.0, "time": 1.0, "emit": 10.0}
_OTHER_WEIGHT = 0.2


@dataclass
class _Run:
    weights: dict[tuple[str, str], float]
    fractions: dict[tuple[str, str], float] = field(default_factory=dict)
    # (task, item) -> the share of the task that item's landed units make, until the item finishes
    partial: dict[tuple[tuple[str, str], str], float] = field(default_factory=dict)
    latest: str = ""

    def percent(self) -> float:
        total = sum(self.weights.values())
        share = dict(self.fractions)
        for (t, _), p in self.partial.items():
            share[t] = share.get(t, 0.0) + p
        done = sum(w * min(1.0, share.get(t, 0.0)) for t, w in self.weights.items())
        return 100.0 * done / total if total else 100.0


_LOCK = threading.Lock()
_RUNS: dict[str, _Run] = {}


def started(run_id: str, tasks: list[tuple[str, str]]) -> None:
    """The flow submitted `tasks` ((stage, label) pairs): progress is measured against them."""
    with _LOCK:
        _RUNS[run_id] = _Run({t: STAGE_WEIGHTS.get(t[0], _OTHER_WEIGHT) for t in tasks})


def report(run_id: str, stage: str, label: str, done: int, total: int, item: str = "") -> None:
    """A task finished `done` of its `total` items (the last one being `item`)."""
    with _LOCK:
        run = _RUNS.get(run_id)
        if run is None:  # a task called outside a tracked run (tests calling task.fn())
            return
        key = (stage, label)
        run.fractions[key] = max(run.fractions.get(key, 0.0), done / total if total else 1.0)
        run.partial.pop((key, item), None)  # counted whole from now on
        run.latest = (f"{stage} {label}: {done}/{total}" + (f" ({item})" if item else "") if item or done < total
                      else f"{stage} {label} finished")


def units(run_id: str, stage: str, label: str, item: str, landed: int, total: int, items: int) -> None:
    """`landed` of the `total` units that `item` (one of the task's `items`) compiles have landed."""
    with _LOCK:
        run = _RUNS.get(run_id)
        if run is None or total < 1:
            return
        key = (stage, label)
        run.partial[(key, item)] = min(landed, total) / total / max(items, 1)
        run.latest = f"{stage} {label}: {item}, {landed}/{total} units compiled"


def snapshot(run_id: str) -> tuple[float, str]:
    """(percent, latest item line) of a tracked run; (100, "") once it is finished or unknown."""
    with _LOCK:
        run = _RUNS.get(run_id)
        return (run.percent(), run.latest) if run else (100.0, "")


def finished(run_id: str) -> None:
    with _LOCK:
        _RUNS.pop(run_id, None)


class Publisher:
    """Pushes a run's progress to a Prefect progress artifact and the log when it has moved, at most
    every `every_s` seconds, with a "still running" line after `quiet_s` without a change (a large
    kernel's compile can take many minutes). Called from the flow's thread only."""

    def __init__(self, run_id: str, logger, every_s: float = 10.0, quiet_s: float = 60.0):
        from prefect.artifacts import create_progress_artifact

        self.run_id, self.logger, self.every_s, self.quiet_s = run_id, logger, every_s, quiet_s
        self.artifact = create_progress_artifact(progress=0.0, key="lospmm-progress",
                                                 description=f"lospmm run {run_id}: share of work items done")
        self.last_push, self.last_percent = time.monotonic(), 0.0
        self.since = time.monotonic()  # when the percentage last changed

    def push(self, final: bool = False) -> None:
        from prefect.artifacts import update_progress_artifact

        percent, latest = snapshot(self.run_id)
        now = time.monotonic()
        moved = percent > self.last_percent
        if final:
            update_progress_artifact(self.artifact, min(100.0, percent))
        elif moved and now - self.last_push >= self.every_s:
            update_progress_artifact(self.artifact, min(100.0, percent))
            self.logger.info("progress %.0f%% — %s", percent, latest or "stages starting")
            self.since = now
        elif not moved and now - self.last_push >= self.quiet_s:
            self.logger.info("progress %.0f%% — still running, nothing finished for %.0f s (last: %s)", percent,
                             now - self.since, latest or "stages starting")
        else:
            return
        self.last_push, self.last_percent = now, max(percent, self.last_percent)
