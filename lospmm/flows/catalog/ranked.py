"""05_ranked: the kept candidates scored and ranked, the top-K chosen (rank); a candidate's row plus its score."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.catalog.candidates import SCHEMA as CANDIDATES
from lospmm.flows.storage.schemas import BOOL, F64, I32, STR
from lospmm.stages.rank import RankedCandidate

# 05_ranked (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    list(zip(CANDIDATES.names, CANDIDATES.types))
    + [("score", F64), ("rank", I32), ("chosen", BOOL), ("ranker", STR), ("seconds", F64)]
)
RECORD = RankedCandidate  # what a row stands for in the stages
