"""The embedded Prefect API of a `lospmm run`, started so that stopping the run is clean.

Prefect starts its ephemeral API (on first use) as a child in the caller's process group, so a
Ctrl-C in the terminal kills the API at once while the run goes on against a dead server, and a
SIGKILL of the run leaves the API running. `detach_embedded_api` has Prefect start it in a session
of its own (the terminal's Ctrl-C reaches only lospmm, which stops its work, records the run as
interrupted, and only then lets Prefect stop the API) and tells it to exit when its parent dies
(Linux PR_SET_PDEATHSIG, where the main thread starts it), so no server outlives its run. Its own output goes to `api_log()` (in
PREFECT_HOME), not the terminal: stopped while it flushes events (a run stopped on request), it
printed some 170 lines of tracebacks of its cancelled database writes after the run's last line.
It is started here, waiting up to `API_START_TIMEOUT_S` for it to answer: Prefect's own default (20 s)
is less than a fresh PREFECT_HOME's database set-up takes on a busy 2-core machine (CI saw it time out
there), and a slow start is not a failure. A timeout set in the profile or environment (other than Prefect's default) is kept.
With PREFECT_API_URL set (a real server) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import threading
from pathlib import Path

_PR_SET_PDEATHSIG = 1
API_LOG = "lospmm-embedded-api.log"
API_START_TIMEOUT_S = 120  # seconds; unless PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is set
API_LOG_LIMIT = 1 << 20  # bytes; past it the log starts afresh (the API logs only errors)
try:  # resolved here, not in the forked child (where only async-signal-safe work belongs)
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the API is still stopped on every exit but a SIGKILL
    _PRCTL = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class _DetachedSubprocess:
    """The `subprocess` module as Prefect's server module sees it, with Popen detached."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 (subprocess's own name)
        # PR_SET_PDEATHSIG fires when the forking *thread* ends: from another thread (lt.search in a worker
        # thread) the API would be stopped under the process with that thread, so only the main thread sets it
        main = threading.current_thread() is threading.main_thread()
        detached = dict(start_new_session=True, **({"preexec_fn": _die_with_parent} if main else {}))
        log = api_log()
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            fresh = not log.exists() or log.stat().st_size > API_LOG_LIMIT
            out = open(log, "w" if fresh else "a", encoding="utf-8")
        except OSError:  # an unwritable PREFECT_HOME: its output on the terminal, as Prefect has it
            return subprocess.Popen(*args, **detached, **kwargs)
        with out:  # the child holds its own copy
            return subprocess.Popen(*args, **detached, **{"stdout": out, "stderr": subprocess.STDOUT, **kwargs})


class ApiStartInOneLine(logging.Filter):
    """Prefect says that it starts its temporary server in two lines (the second points at its docs)
    and that it stops it, after the run's summary; a run says the start in one line, with where a
    server of the user's own goes, and not the stop (the run's own last line says how it ended)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Stopping temporary server on "):
            return False
        if message.startswith("Starting temporary server on "):
            address = message.splitlines()[0].rsplit(" ", 1)[-1]
            record.msg, record.args = (f"Starting the run's embedded Prefect API on {address} (PREFECT_API_URL "
                                       f"points runs at a Prefect server of your own)"), ()
        return True


def api_log() -> Path:
    """Where the embedded API's own output goes (its errors: it runs with --log-level error)."""
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()) / API_LOG


def api_start_timeout() -> int:
    """Seconds to wait for the embedded API to answer: the user's setting where it is not Prefect's default."""
    from prefect.settings import get_current_settings

    ephemeral = get_current_settings().server.ephemeral
    prefects = type(ephemeral).model_fields["startup_timeout_seconds"].default
    return API_START_TIMEOUT_S if ephemeral.startup_timeout_seconds == prefects else ephemeral.startup_timeout_seconds


def detach_embedded_api() -> bool:
    """Start Prefect's ephemeral API detached (see above), unless it runs already; Prefect's client
    then finds it running. Returns False when a real server is configured and nothing was changed."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return False
    from prefect.server.api import server as prefect_server

    if not isinstance(prefect_server.subprocess, _DetachedSubprocess):
        prefect_server.subprocess = _DetachedSubprocess()
    from lospmm.flows.execution.taskio import installed

    installed(ApiStartInOneLine, ("prefect",))  # the logger Prefect's server module says it on
    prefect_server.SubprocessASGIServer().start(timeout=api_start_timeout())  # Prefect's client's own instance
    return True


def api_start_failure(error: BaseException) -> str | None:
    """Prefect's error where its embedded API did not start (`Timed out while attempting to connect to
    ephemeral Prefect API server…`), with where the API's own output went (api_log: its reason,
    e.g. a locked or damaged database); None for any other error."""
    if not isinstance(error, RuntimeError) or "ephemeral Prefect API server" not in str(error):
        return None
    return f"{error} (the embedded API's own output: {api_log()})"
