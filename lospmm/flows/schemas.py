"""Arrow schemas of every artifact, defined once (artifacts/README.md documents each column), and
building tables from rows. No stage module is imported here: each stage's records are converted to
and from rows by the adapter of the stage that writes them (lospmm.flows.tasks.<stage>), so this
module, shared by every stage, does not tie their code versions together."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa


_i32, _i64, _f32, _f64, _str, _bool = pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.bool_()

LAYER_COLUMNS = ("model", "layer", "op", "m", "n", "k", "repeat")
_LAYER = [
    ("model", _str), ("layer", _str), ("op", _str), ("m", _i64), ("n", _i64), ("k", _i64),
    ("repeat", _i32),
]
_STATUS = [("status", _str), ("message", _str)]

SHAPES = pa.schema(
    _LAYER
    + [("layers", pa.list_(_str))]
    + [(f, _i32) for f in ("cin", "cout", "kh", "kw", "stride", "pad", "groups", "h_in", "w_in", "h_out", "w_out")]
    + [("source", _str), ("source_sha256", _str)]
    + _STATUS
)

PRUNED = pa.schema(
    _LAYER
    + [("sparsity_requested", _f64), ("sparsity_achieved", _f64), ("method", _str), ("nnz", _i64)]
    + _STATUS
    + [("indptr", pa.list_(_i32)), ("indices", pa.list_(_i32)), ("data", pa.list_(_f32)), ("seconds", _f64)]
)

_GROUPING_STATS = ["max_nnc", "mean_nnc", "nnc_sum", "max_nnz", "cov_nnz"]
REORDERED = pa.schema(
    _LAYER
    + [("sparsity", _f64), ("nnz", _i64), ("m1", _i32)]
    + _STATUS
    + [("num_tiles", _i32), ("num_empty_rows", _i32), ("empty_rows", pa.list_(_i32)),
       ("rows", pa.list_(_i32)), ("tile_ptr", pa.list_(_i32)),
       ("tile_nnz", pa.list_(_i32)), ("tile_nnc", pa.list_(_i32))]
    + [(f"{g}_{s}", _f64 if s in ("mean_nnc", "cov_nnz") else _i64)
       for g in ("identity", "reordered") for s in _GROUPING_STATS]
    + [("seconds", _f64)]
)

CANDIDATES = pa.schema(
    _LAYER
    + [("sparsity", _f64), ("gpu", _str), ("arch", _str)]
    + [("m1", _i32), ("n1", _i32), ("num_a_tiles", _i32), ("num_b_tiles", _i32), ("block_num", _i64),
       ("threads", _i32), ("pred_regs", _i32), ("block_regs", _i64), ("cov_row", _f64), ("waste_col", _f64),
       ("nnc_sum", _i64), ("nnz_max", _i64), ("max_nnc", _i64), ("kept", _bool), ("removed_by", _str)]
    + _STATUS
)

_LAYER_AT = _LAYER + [("sparsity", _f64), ("m1", _i32)]

CLUSTERS = pa.schema(
    _LAYER_AT + _STATUS
    + [("num_tiles", _i32), ("max_active_blocks", _i32), ("num_clusters", _i32),
       ("cluster_of", pa.list_(_i32)), ("medoid", pa.list_(_i32)), ("centroid_nnc", pa.list_(_f64)),
       ("centroid_nnz", pa.list_(_f64)), ("nnc_p", pa.list_(_i32)), ("cpl", pa.list_(_i32)),
       ("columns", pa.list_(_i32)), ("seconds", _f64)]
)

LAUNCH = pa.schema(
    _LAYER_AT + [("n1", _i32)] + _STATUS
    + [("gpu", _str), ("grid_x", _i32), ("grid_y", _i32), ("block", _i32), ("pred_regs", _i32),
       ("num_atb", _i32), ("smem_bytes", _i32)]
)

COMPILED = pa.schema(
    _LAYER_AT + _STATUS
    + [("kind", _str), ("kernel", _str), ("source_sha256", _str), ("compile_key", _str), ("arch", _str),
       ("maxrregcount", _i32), ("registers", _i32), ("spill_stores", _i32), ("spill_loads", _i32),
       ("stack_bytes", _i32), ("smem_bytes", _i32), ("compile_seconds", _f64), ("from_cache", _bool),
       ("source_bytes", _i64), ("source_path", _str), ("ptx_path", _str), ("cubin_path", _str),
       ("verified", _str), ("log", _str)]
)

RANKED = pa.schema(
    list(zip(CANDIDATES.names, CANDIDATES.types))
    + [("score", _f64), ("rank", _i32), ("chosen", _bool), ("ranker", _str), ("seconds", _f64)]
)

TIMED = pa.schema(
    _LAYER_AT + [("n1", _i32)] + _STATUS
    + [("kind", _str), ("timer", _str), ("time_us", _f64), ("compute_us", _f64), ("memory_us", _f64),
       ("latency_us", _f64), ("active_blocks", _i32), ("repeats", _i32), ("registers", _i32),
       ("spill_bytes", _i32), ("smem_bytes", _i32), ("rank", _i32), ("seconds", _f64)]
)

KERNELS = pa.schema(
    _LAYER + [("sparsity", _f64)] + _STATUS
    + [("m1", _i32), ("n1", _i32), ("chosen_by", _str), ("timer", _str), ("proxy_time_us", _f64),
       ("full_time_us", _f64), ("dense_time_us", _f64), ("speedup_vs_dense", _f64), ("kernel", _str),
       ("kernel_dir", _str), ("registers", _i32),
       ("spill_bytes", _i32), ("compile_seconds", _f64), ("check", _str), ("max_rel_error", _f64),
       ("candidates_timed", _i32), ("seconds", _f64)]
)

SUMMARY = pa.schema(
    _LAYER + [("sparsity", _f64), ("status", _str), ("candidates", _i32), ("after_constrain", _i32),
              ("after_rank", _i32), ("timed", _i32), ("m1", _i32), ("n1", _i32), ("timer", _str),
              ("time_us", _f64), ("speedup_vs_dense", _f64)]
    + [(f"{s}_seconds", _f64) for s in ("prune", "reorder", "rank", "cluster", "compile", "time", "emit")]
    + [("search_seconds", _f64), ("kernel_dir", _str)]
)

SCHEMAS = {"extract": SHAPES, "prune": PRUNED, "reorder": REORDERED, "constrain": CANDIDATES, "rank": RANKED,
           "cluster": CLUSTERS, "pad": LAUNCH, "compile": COMPILED, "time": TIMED, "emit": KERNELS}
LIST_COLUMNS = {name for s in SCHEMAS.values() for name in s.names if pa.types.is_list(s.field(name).type)}


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
