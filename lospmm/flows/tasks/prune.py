"""Adapter of stage 2, prune: 01_shapes (+ the weights file) -> 02_pruned."""

from __future__ import annotations

import time

import pyarrow as pa
import scipy.sparse as sp

from lospmm.flows.schemas import F32, F64, I32, I64, LAYER, STATUS, STR, list_values
from lospmm.flows.sources import Source
from lospmm.flows.taskio import RunContext, failed_row, layer_fields, run_stage, stage_task
from lospmm.flows.tasks.extract import shape_from_row
from lospmm.flows.onnx_model import graph_weight_matrix, is_onnx
from lospmm.flows.weights import load_tensor
from lospmm.stages.prune import PruneParams, global_magnitude_threshold, pruned_layer
from lospmm.stages.status import Status

# 02_pruned (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("sparsity_requested", F64), ("sparsity_achieved", F64), ("method", STR), ("nnz", I64)] + STATUS
    + [("indptr", pa.list_(I32)), ("indices", pa.list_(I32)), ("data", pa.list_(F32)), ("seconds", F64)]
)


@stage_task("prune")
def prune(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, source: Source, sparsity: float,
          params: PruneParams) -> dict:
    def weight_of(shape):
        if not (source.path and shape.ok):
            return None
        if is_onnx(source.path):
            return graph_weight_matrix(source.path, shape.layer)
        w = load_tensor(source.path, shape.layer)
        return w.reshape(w.shape[0], -1) if w.ndim == 4 else w  # a conv weight [Cout, Cin, kh, kw] is A (Cout × K)

    def one(row: dict, threshold: float | None) -> dict:
        shape = shape_from_row(row)
        t0 = time.perf_counter()
        base = {**layer_fields(row), "sparsity_requested": sparsity, "method": params.method, "nnz": 0}
        try:
            layer = pruned_layer(shape, sparsity, params, weight_of(shape), threshold)
        except Exception as e:  # one bad layer never sinks the others
            return {**failed_row(base, shape.layer, e), "seconds": time.perf_counter() - t0}
        a = layer.matrix
        return {**base, "sparsity_achieved": layer.sparsity_achieved, "nnz": layer.nnz, "status": layer.status,
                "message": layer.message,
                **({"indptr": a.indptr, "indices": a.indices, "data": a.data} if a is not None else {}),
                "seconds": time.perf_counter() - t0}

    def compute():
        rows = [r for r in ctx.read(inputs["extract"]).to_pylist() if r["status"] != Status.SKIPPED]
        threshold = None
        if params.method == "global":  # one threshold over every layer's weights (read twice, not held)
            threshold = global_magnitude_threshold(
                (w for w in (weight_of(shape_from_row(r)) for r in rows) if w is not None), sparsity)
        return [one(r, threshold) for r in rows]

    return run_stage("prune", SCHEMA, key, ctx, label, force, compute, inputs)


def csr_from_row(table, i: int) -> sp.csr_matrix:
    """Row i of a 02_pruned table as the layer's A (CSR)."""
    m, k = table.column("m")[i].as_py(), table.column("k")[i].as_py()
    return sp.csr_matrix((list_values(table, "data", i), list_values(table, "indices", i),
                          list_values(table, "indptr", i)), shape=(m, k))


def matrices(ctx: RunContext, pruned: dict) -> dict:
    """layer -> its pruned A (CSR), for the layers that pruned ok."""
    table = ctx.read(pruned)
    return {table.column("layer")[i].as_py(): csr_from_row(table, i)
            for i in range(table.num_rows) if table.column("status")[i].as_py() == Status.OK}
