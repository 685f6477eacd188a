"""Adapter of stage 2, prune: 01_shapes (+ the weights file) -> 02_pruned."""

from __future__ import annotations

import time

from lospmm.flows.catalog.pruned import SCHEMA
from lospmm.flows.catalog.shapes import shape_from_row
from lospmm.flows.inputs.sources import Source
from lospmm.flows.execution.taskio import RunContext, failed_row, layer_fields, run_stage, stage_task, stoppable
from lospmm.flows.inputs.layers import layer_weight
from lospmm.flows.inputs.weights import planned_weights
from lospmm.stages.prune import PruneParams, global_magnitude_threshold, pruned_layer
from lospmm.status import Status


@stage_task("prune")
def prune(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, source: Source, sparsity: float,
          params: PruneParams) -> dict:
    def weight_of(shape, weights):
        return layer_weight(source, shape, weights)

    def one(row: dict, threshold: float | None, weights) -> dict:
        shape = shape_from_row(row)
        t0 = time.perf_counter()
        base = {**layer_fields(row), "sparsity_requested": sparsity, "method": params.method, "nnz": 0}
        try:
            layer = pruned_layer(shape, sparsity, params, weight_of(shape, weights), threshold)
        except Exception as e:  # one bad layer never sinks the others
            return {**failed_row(base, shape.layer, e), "seconds": time.perf_counter() - t0}
        a = layer.matrix
        return {**base, "sparsity_achieved": layer.sparsity_achieved, "nnz": layer.nnz, "status": layer.status,
                "nm": layer.pattern.method[3:] if layer.pattern else "",
                "message": layer.message, "zeros_before": layer.zeros_before,
                **({"indptr": a.indptr, "indices": a.indices, "data": a.data} if a is not None else {}),
                "seconds": time.perf_counter() - t0}

    def compute():
        rows = [r for r in ctx.read(inputs["extract"]).to_pylist() if r["status"] != Status.SKIPPED]
        if not source.path:
            return [one(r, None, None) for r in stoppable(rows)]
        # the file the run planned with, opened once (WeightsChanged fails the run otherwise)
        with planned_weights(source.path, source.sha256) as weights:
            threshold = None
            if params.method == "global":  # one threshold over every layer's weights (read twice, not held)
                threshold = global_magnitude_threshold(
                    (w for w in (weight_of(shape_from_row(r), weights) for r in stoppable(rows)) if w is not None),
                    sparsity)
            return [one(r, threshold, weights) for r in stoppable(rows)]

    return run_stage("prune", SCHEMA, key, ctx, label, force, compute, inputs)
