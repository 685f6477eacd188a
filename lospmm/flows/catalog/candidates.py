"""04_candidates: every (M1, N1) of a layer with what the constraints looked at (constrain); a row is a stages.constrain.Candidate."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import BOOL, F64, I32, I64, LAYER, STATUS, STR
from lospmm.stages.constrain import Candidate

# 04_candidates (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("sparsity", F64), ("gpu", STR), ("arch", STR)]
    + [("m1", I32), ("n1", I32), ("num_a_tiles", I32), ("num_b_tiles", I32), ("block_num", I64),
       ("threads", I32), ("pred_regs", I32), ("block_regs", I64), ("cov_row", F64), ("waste_col", F64),
       ("nnc_sum", I64), ("nnz_max", I64), ("max_nnc", I64), ("kept", BOOL), ("removed_by", STR),
       ("fallback", BOOL), ("design", STR)]
    + STATUS
)
RECORD = Candidate  # what a row stands for in the stages
