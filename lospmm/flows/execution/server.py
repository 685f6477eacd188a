"""The embedded Prefect API of a `lospmm run`, started so that stopping the run is clean.

Prefect starts its ephemeral API (on first use) as a child in the caller's process group, so a
Ctrl-C in the terminal kills the API at once while the run goes on against a dead server, and a
SIGKILL of the run leaves the API running. `detach_embedded_api` has Prefect start it in a session
of its own (the terminal's Ctrl-C reaches only lospmm, which stops its work, records the run as
interrupted, and only then lets Prefect stop the API) and tells it to exit when its parent dies
(Linux PR_SET_PDEATHSIG), so no server outlives its run. With PREFECT_API_URL set (a real server)
nothing changes.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
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
        return subprocess.Popen(*args, start_new_session=True, preexec_fn=_die_with_parent, **kwargs)


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
