"""07_launch: the proxy launch of each chosen candidate (pad, Eq. 5-6); a row is a stages.pad.ProxyLaunch."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import I32, LAYER_AT, STATUS, STR
from lospmm.stages.pad import ProxyLaunch

# 07_launch (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER_AT + [("n1", I32), ("design", STR)] + STATUS
    + [("gpu", STR), ("grid_x", I32), ("grid_y", I32), ("block", I32), ("pred_regs", I32),
       ("num_atb", I32), ("smem_bytes", I32), ("rank", I32)]
)
RECORD = ProxyLaunch  # what a row stands for in the stages
