"""10_kernels: each layer's emitted kernel and its directory (emit); a row describes a kernel directory's kernel.json."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import F64, I32, LAYER, STATUS, STR

# 10_kernels (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("sparsity", F64)] + STATUS
    + [("m1", I32), ("n1", I32), ("form", STR), ("dtype", STR), ("chosen_by", STR), ("timer", STR), ("proxy_time_us", F64),
       ("full_time_us", F64), ("unfold_us", F64), ("dense_time_us", F64), ("speedup_vs_dense", F64), ("kernel", STR),
       ("kernel_dir", STR), ("registers", I32), ("spill_bytes", I32), ("compile_seconds", F64), ("check", STR),
       ("max_rel_error", F64), ("candidates_timed", I32), ("seconds", F64), ("design", STR),
       ("design_estimate_us", F64), ("design_price_us", F64), ("runner_up", STR), ("runner_up_estimate_us", F64),
       ("runner_up_price_us", F64),
       ("designs_measured", STR), ("designs_priced", STR)]
)
RECORD = dict  # an emitted kernel directory's facts (its kernel.json)
