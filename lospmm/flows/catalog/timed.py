"""09_timed: each chosen candidate's proxy timed by the run's timer (time); a row is a stages.timing.Timing."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import F64, I32, LAYER_AT, STATUS, STR
from lospmm.kernel.timing import Timing

# 09_timed (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER_AT + [("n1", I32), ("design", STR)] + STATUS
    + [("kind", STR), ("timer", STR), ("time_us", F64), ("compute_us", F64), ("memory_us", F64),
       ("latency_us", F64), ("fetch_us", F64), ("active_blocks", I32), ("repeats", I32), ("registers", I32),
       ("spill_bytes", I32), ("smem_bytes", I32), ("rank", I32), ("seconds", F64)]
)
RECORD = Timing  # what a row stands for in the stages


def timing_row(t: Timing) -> dict:
    """A timing.Timing as 09_timed's columns."""
    return {"status": t.status, "time_us": t.time_us, "compute_us": t.compute_us, "memory_us": t.memory_us,
            "latency_us": t.latency_us, "fetch_us": t.fetch_us, "active_blocks": t.active_blocks, "repeats": t.repeats}
