"""08_compiled: each chosen M1's proxy compiled through the compile cache (compile); a row is a compile-cache result."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import BOOL, F64, I32, I64, LAYER_AT, STATUS, STR

# 08_compiled (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER_AT + [("design", STR)] + STATUS
    + [("kind", STR), ("kernel", STR), ("source_sha256", STR), ("compile_key", STR), ("arch", STR),
       ("maxrregcount", I32), ("registers", I32), ("spill_stores", I32), ("spill_loads", I32), ("thread_spill_bytes", I32),
       ("stack_bytes", I32), ("smem_bytes", I32), ("compile_seconds", F64), ("cost_seconds", F64), ("from_cache", BOOL),
       ("units", I32), ("units_compiled", I32), ("link_seconds", F64),
       ("source_bytes", I64), ("source_path", STR), ("cubin_path", STR),
       ("verified", STR), ("log", STR)]
)
RECORD = dict  # a compile-cache result (flows.compile_cache.cached_kernel)


def compile_row(result: dict, from_cache: bool) -> dict:
    """A compile-cache result as 08_compiled's columns."""
    return {"compile_key": result["key"], "registers": result["registers"], "spill_stores": result["spill_stores"],
            "spill_loads": result["spill_loads"],
            "thread_spill_bytes": result["thread_spill_bytes"], "stack_bytes": result["stack_bytes"],
            "smem_bytes": result["smem_bytes"], "compile_seconds": result["seconds"], "cost_seconds": result["cost_seconds"], "from_cache": from_cache,
            "units": result["units"], "units_compiled": result["units_compiled"],
            "link_seconds": result["link_seconds"], "source_path": result["paths"]["source"],
            "cubin_path": result["paths"]["cubin"], "log": result["log"][-4000:]}
