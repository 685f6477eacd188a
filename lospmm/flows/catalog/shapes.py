"""01_shapes: one row per GEMM layer of a model (extract); a row is a stages.extract.LayerShape."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.storage.schemas import I32, LAYER, STATUS, STR
from lospmm.stages.extract import LayerShape

# 01_shapes (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("layers", pa.list_(STR))]
    + [(f, I32) for f in ("cin", "cout", "kh", "kw", "stride", "pad", "groups", "h_in", "w_in", "h_out", "w_out",
                                  "dilation")]
    + [("source", STR), ("source_sha256", STR)] + STATUS + [("bias", STR), ("activation", STR)]
)
RECORD = LayerShape  # what a row stands for in the stages


def shape_row(s: LayerShape, source: str, source_sha256: str) -> dict:
    row = {f: getattr(s, f) for f in SCHEMA.names if hasattr(s, f)}
    return {**row, "layers": list(s.layers), "source": source, "source_sha256": source_sha256}


def shape_from_row(row: dict) -> LayerShape:
    fields = LayerShape.__dataclass_fields__
    return LayerShape(**{k: (tuple(v) if k == "layers" else v) for k, v in row.items() if k in fields})
