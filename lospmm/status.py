"""Every status a row of any artifact can carry, in one place."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    """A layer's (or a candidate's) outcome at one stage. StrEnum: equal to its text, so Parquet
    columns and JSON hold the plain words."""

    OK = "ok"
    SKIPPED = "skipped"  # not a GEMM (depthwise conv, 1-D tensor), or nothing to do at this stage
    EMPTY = "empty"  # the layer pruned to all zeros
    ERROR = "error"  # the layer's own bad data, or a failure at this stage; `message` says which
    FALLBACK = "fallback"  # emitted from a candidate kept although no candidate passed every constraint
    # the run summary's outcomes for a layer that has no emit row
    NO_CANDIDATE = "no kept candidate"  # the constraints removed every tile
    NOT_EMITTED = "not emitted"  # the run stopped before emit
