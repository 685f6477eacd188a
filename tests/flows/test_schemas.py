"""Artifact schemas: the columns every stage shares, the list columns, and building tables from rows."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from lospmm.flows.storage import schemas
from lospmm.flows.dag import artifact_schemas, list_columns
from lospmm.flows.reports.summary import SUMMARY

SCHEMAS = artifact_schemas()
PRUNED, SHAPES, CLUSTERS = SCHEMAS["prune"], SCHEMAS["extract"], SCHEMAS["cluster"]

# Written out, not derived: a list column added or dropped must show up here.
_LISTS = {"layers", "indptr", "indices", "data", "empty_rows", "rows", "tile_ptr", "tile_nnz", "tile_nnc",
          "cluster_of", "medoid", "centroid_nnc", "centroid_nnz", "nnc_p", "cpl", "columns", "staged_counts",
          *(f"order_{c}" for c in ("strategy", "nnc_sum", "max_nnc", "cov_nnz", "estimate_us", "seconds", "chosen",
                                   "note"))}


def test_list_columns_round_trip_including_nulls():
    rows = [{"model": "m", "layer": "a", "indptr": np.array([0, 1, 3]), "indices": np.array([0, 2, 4]),
             "data": np.array([1.0, 2.0, 3.0], np.float32)},
            {"model": "m", "layer": "b", "indptr": None, "indices": None, "data": None, "status": "error"}]
    t = schemas.table_from_rows(rows, PRUNED)
    assert t.schema == PRUNED
    assert schemas.list_values(t, "indices", 0).tolist() == [0, 2, 4]
    assert t.column("indptr")[1].as_py() is None


def test_the_schemas_are_in_dag_order():
    from lospmm.stages import STAGES

    assert tuple(SCHEMAS) == STAGES


def test_every_stage_schema_starts_with_the_layer_columns_and_has_a_status():
    # taskio.layer_fields copies LAYER_COLUMNS from upstream rows; run_stage reads status and message
    layer_types = [SHAPES.field(c).type for c in schemas.LAYER_COLUMNS]
    for stage, schema in SCHEMAS.items():
        assert tuple(schema.names[:len(schemas.LAYER_COLUMNS)]) == schemas.LAYER_COLUMNS, stage
        assert [schema.field(c).type for c in schemas.LAYER_COLUMNS] == layer_types, stage
        assert {"status", "message"} <= set(schema.names), stage
        assert len(set(schema.names)) == len(schema.names), stage  # no column twice
    assert set(schemas.LAYER_COLUMNS) <= set(SUMMARY.names)  # not a stage artifact, still per layer


def test_list_columns_are_exactly_the_list_typed_fields_in_every_schema():
    assert list_columns() == _LISTS
    # scalar_rows drops LIST_COLUMNS by name from any stage: a name must not be a list in one schema and a
    # scalar in another
    for stage, schema in SCHEMAS.items():
        lists = {f.name for f in schema if pa.types.is_list(f.type)}
        assert lists == list_columns() & set(schema.names) == schemas.list_columns(schema), stage


def test_missing_keys_become_nulls_and_no_rows_give_an_empty_table():
    for stage, schema in SCHEMAS.items():
        t = schemas.table_from_rows([{"model": "m", "layer": "l"}, {"layer": "l2", "status": "ok"}], schema)
        assert t.schema == schema and t.num_rows == 2, stage
        assert t.column("model").to_pylist() == ["m", None]
        assert t.column("status").to_pylist() == [None, "ok"]
        for name in set(schema.names) - {"model", "layer", "status"}:
            assert t.column(name).null_count == 2, (stage, name)  # list columns too: null, not []
        empty = schemas.table_from_rows([], schema)
        assert empty.schema == schema and empty.num_rows == 0


def test_string_lists_and_float_lists_keep_their_values():
    t = schemas.table_from_rows([{"layers": ["a.weight", "b.weight"]}, {"layers": []}], SHAPES)
    assert t.column("layers").to_pylist() == [["a.weight", "b.weight"], []]
    t = schemas.table_from_rows([{"centroid_nnc": [0.5, 2.25]}, {"centroid_nnc": np.array([], np.float64)}],
                                CLUSTERS)
    assert schemas.list_values(t, "centroid_nnc", 0).tolist() == [0.5, 2.25]
    assert schemas.list_values(t, "centroid_nnc", 1).size == 0 and t.column("centroid_nnc")[1].is_valid


_int32_lists = st.lists(st.none() | st.lists(st.integers(-2**31, 2**31 - 1), max_size=6), max_size=8)


@settings(max_examples=60, deadline=None)
@given(_int32_lists, st.booleans())
def test_int32_list_columns_round_trip(values, as_numpy):
    # numpy arrays (int64, as stages make them) and plain lists both go in; empty lists stay valid, None is null
    cells = [None if v is None else (np.array(v, np.int64) if as_numpy else v) for v in values]
    t = schemas.table_from_rows([{"layer": str(i), "indices": c} for i, c in enumerate(cells)], PRUNED)
    buf = io.BytesIO()
    pq.write_table(t, buf)  # artifacts are Parquet: the nulls and empties must survive it too
    back = pq.read_table(io.BytesIO(buf.getvalue()))
    assert back.schema == PRUNED
    assert back.column("indices").to_pylist() == values
    for i, v in enumerate(values):
        got = schemas.list_values(back, "indices", i)
        assert got.tolist() == (v or [])
        if v is not None:
            assert got.dtype == np.int32
