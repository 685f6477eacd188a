"""Kernels that faulted on the device, remembered under the artifact root (`faults.jsonl`).

A kernel that faults (an illegal address, a trap) loses its process's CUDA context, so every launch
after it in that process fails as well; those later failures are transient (lospmm.kernel.cuda) and
retried in a fresh process. Without a record, the retry would launch the faulting kernel first again
and never get past it. With it, the emit stage skips a kernel that faulted before, and says so.

One JSON line per fault, appended and flushed; a line cut off by a killed process is skipped when
read (its kernel faults again, once, and is recorded then)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

FILE = "faults.jsonl"
_LOCK = threading.Lock()  # emit's layers run on threads: one line at a time


def fault_key(model: str, layer: str, sparsity: float, label: str) -> str:
    """What identifies one way to serve one layer of one run's input."""
    return f"{model}|{layer}|{sparsity:g}|{label}"


def faulted(root: str | Path) -> dict[str, str]:
    """key -> the fault's message, for every fault recorded under `root`."""
    path = Path(root) / FILE
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            out[entry["key"]] = entry["message"]
        except (ValueError, KeyError, TypeError):  # cut off mid-write
            continue
    return out


def record_fault(root: str | Path, key: str, message: str) -> None:
    """Remember that the kernel `key` faulted with `message`."""
    path = Path(root) / FILE
    line = json.dumps({"key": key, "message": message[:500]}) + "\n"
    with _LOCK:
        with open(path, "a+b") as f:
            if f.seek(0, 2):  # not empty: after a line cut off, start a new one
                f.seek(-1, 2)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode("utf-8"))
            f.flush()
