"""Stopping a run on request: SIGINT (Ctrl-C) and SIGTERM stop it cleanly, for the CLI and for
`lospmm.torch.search` alike, and the record says how it ended."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from lospmm.flows.execution.taskio import POLLING_STOP, STOP, installed
from lospmm.flows.storage.runs import RunStatus, run_record, write_run_record


STOPPING = ("stopping: each stage stops at its next item and writes nothing unfinished (an item under way, such as "
            "one kernel's compile, finishes first); interrupt again to stop at once")


@contextmanager
def stops_cleanly(exit_code_on_second: int | None = None, on_second=None, said_on_first: str = STOPPING):
    """While the block runs, SIGINT and SIGTERM stop the run: tasks stop at their next item (a stage
    that did not finish writes nothing), the flow leaves once they did, and KeyboardInterrupt comes
    out of the block. The first signal our handler sees is answered at once on stderr's file descriptor
    (`said_on_first`: an item under way, one kernel's compile, can take a minute; a SIGTERM inside
    Prefect's flow is Prefect's, and a notebook shows the process's stderr in its log, not the cell).
    A second signal exits the process at once with `exit_code_on_second` (the CLI), after
    `on_second()` (the CLI records the run cancelled: else it would read as killed), or, where None,
    raises KeyboardInterrupt again (a notebook's second Ctrl-C). Off the main thread, where handlers
    cannot be set, only STOP is managed."""
    STOP.clear()
    if threading.current_thread() is not threading.main_thread():
        try:
            yield
        finally:
            STOP.clear()
        return

    received = []

    def handler(signum, frame):
        received.append(signum)
        if len(received) > 1:
            if exit_code_on_second is not None:
                try:
                    if on_second is not None:
                        on_second()
                finally:
                    os._exit(exit_code_on_second)
            raise KeyboardInterrupt
        STOP.set()
        if said_on_first:
            try:  # a plain write: the handler may run inside a print of the console's
                os.write(2, f"{said_on_first}\n".encode())
            except OSError:
                pass
        if not POLLING_STOP.is_set():  # else the flow's wait sees STOP and stops from a safe place
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt:
        STOP.set()  # a KeyboardInterrupt raised past the handler (Python's own): the tasks stop too
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        STOP.clear()  # a later run in this process (a notebook, a test session) starts afresh


class StoppedOnRequest(logging.Filter):
    """Prefect reports a run stopped on request as a crash: an ERROR `Crash detected!` for the flow and
    for each task that stopped at its next item, then `Finished in state Crashed(…)`, also an ERROR.
    While a stop is requested, the first is dropped and the second says `stopped on request` at INFO.
    Any other crash is left as Prefect reports it."""

    SIGNS = ("unexpected exception: Interrupted:",  # a task's stop (taskio.stop_requested)
             "Execution was aborted by an interrupt signal",  # the flow's, a signal's KeyboardInterrupt
             "Execution was aborted by a termination signal")  # Prefect's SIGTERM out of the flow

    def filter(self, record: logging.LogRecord) -> bool:
        if not STOP.is_set():
            return True
        message = record.getMessage()
        if not any(sign in message for sign in self.SIGNS):
            return True
        if message.startswith("Crash detected!"):
            return False
        record.msg, record.args, record.exc_info, record.exc_text = "stopped on request", (), None, None
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def stopped_quietly() -> None:
    """Install StoppedOnRequest on Prefect's flow- and task-run loggers (once)."""
    installed(StoppedOnRequest)


def record_ended(root: str | Path, run_id: str, status: RunStatus, error: str = "") -> bool:
    """Mark a run that did not finish (cancelled, or failed outside its flow) in its record, unless it
    already ended; False when it has none (stopped before the flow began)."""
    try:
        record = run_record(root, run_id)
    except LookupError:
        return False
    if record.get("status") != RunStatus.RUNNING:  # it finished before the signal took effect
        return True
    record.update(status=status, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **({"error": error} if error else {}))
    try:
        write_run_record(root, record, final=True)
    except OSError:  # a full disk: the record stays `running`, shown as `killed` once this process is gone
        pass
    return True
