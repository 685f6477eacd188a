"""The Arrow building blocks every artifact schema is made of, and tables from rows.

Each artifact's schema is declared once, in its catalog module (`lospmm.flows.catalog.<layer>.SCHEMA`;
artifacts/README.md documents every column), which its writer and readers import, so that editing
one artifact's columns changes the code version of the stages that write or read it, never an
upstream one.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

I32, I64, F32, F64, STR, BOOL = pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.bool_()

LAYER_COLUMNS = ("model", "layer", "op", "m", "n", "k", "repeat")
LAYER = [("model", STR), ("layer", STR), ("op", STR), ("m", I64), ("n", I64), ("k", I64), ("repeat", I32)]
STATUS = [("status", STR), ("message", STR)]
LAYER_AT = LAYER + [("sparsity", F64), ("m1", I32)]  # a layer at one sparsity and tile height


def list_columns(schema: pa.Schema) -> set[str]:
    """The list-typed (payload) columns of a schema: CSR, tiles, clusters."""
    return {f.name for f in schema if pa.types.is_list(f.type)}


def scalar_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if not pa.types.is_list(f.type)]


def table_from_rows(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Build a table column by column; list columns from numpy arrays go in without copies per element."""
    columns = []
    for field in schema:
        values = [r.get(field.name) for r in rows]
        if pa.types.is_list(field.type) and not pa.types.is_string(field.type.value_type):
            columns.append(_list_array(values, field.type))
        else:
            columns.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _list_array(values: list, type_: pa.ListType) -> pa.Array:
    arrays = [np.asarray([] if v is None else v) for v in values]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    dtype = type_.value_type.to_pandas_dtype()
    flat = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    mask = pa.array([v is None for v in values], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=type_.value_type), mask=mask)


def list_values(table: pa.Table, column: str, i: int) -> np.ndarray:
    """Row i of a list column as a numpy array (zero-copy where Arrow allows)."""
    cell = table.column(column)[i]
    return np.asarray(cell.values.to_numpy(zero_copy_only=False)) if cell.is_valid else np.zeros(0)
