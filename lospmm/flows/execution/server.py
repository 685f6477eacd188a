"""The embedded Prefect API of a `lospmm run`, started so that stopping the run is clean.

Prefect starts its ephemeral API (on first use) as a child in the caller's process group, so a
Ctrl-C in the terminal kills the API at once while the run goes on against a dead server, and a
SIGKILL of the run leaves the API running. `detach_embedded_api` has Prefect start it in a session
of its own (the terminal's Ctrl-C reaches only lospmm, which stops its work, records the run as
interrupted, and only then lets Prefect stop the API) and tells it to exit when its parent dies
(Linux PR_SET_PDEATHSIG, where the main thread starts it), so no server outlives its run. Its own output goes to `api_log()` (in
PREFECT_HOME), not the terminal: stopped while it flushes events (a run stopped on request), it
printed some 170 lines of tracebacks of its cancelled database writes after the run's last line.
With PREFECT_API_URL set (a real server) nothing changes.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import threading
from pathlib import Path

_PR_SET_PDEATHSIG = 1
API_LOG = "lospmm-embedded-api.log"
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


def api_log() -> Path:
    """Where the embedded API's own output goes (its errors: it runs with --log-level error)."""
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()) / API_LOG


def detach_embedded_api() -> bool:
    """Have Prefect's ephemeral API, if this process starts one, run detached (see above).
    Returns False when a real server is configured and nothing was changed."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return False
    from prefect.server.api import server as prefect_server

    if not isinstance(prefect_server.subprocess, _DetachedSubprocess):
        prefect_server.subprocess = _DetachedSubprocess()
    return True


def api_start_failure(error: BaseException) -> str | None:
    """Prefect's error where its embedded API did not start (`Timed out while attempting to connect to
    ephemeral Prefect API server…`), with where the API's own output went (api_log: its reason,
    e.g. a locked or damaged database); None for any other error."""
    if not isinstance(error, RuntimeError) or "ephemeral Prefect API server" not in str(error):
        return None
    return f"{error} (the embedded API's own output: {api_log()})"
