"""Adapter of stage 3, reorder: 02_pruned -> 03_reordered (one row per layer and M1)."""

from __future__ import annotations

import time

from lospmm.flows.catalog.pruned import csr_from_row
from lospmm.flows.catalog.reordered import SCHEMA, prefixed, reordering_row
from lospmm.flows.storage.schemas import LAYER_COLUMNS
from lospmm.flows.execution.taskio import RunContext, failed_row, layer_fields, run_stage, stage_task, stoppable
from lospmm.stages.reorder import ReorderParams, layer_orders, tile_stats
from lospmm.status import Status


@stage_task("reorder")
def reorder(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, m1s: tuple[int, ...],
            params: ReorderParams, partitioner: str) -> dict:
    # `partitioner` (Mt-KaHyPar's version) is here for the cache key: a new partitioner may cut differently
    def compute():
        table = ctx.read(inputs["prune"])
        rows = []
        for i, info in enumerate(stoppable(table.select(list(LAYER_COLUMNS) + ["nnz", "status", "message",
                                                                                        "sparsity_requested"]).to_pylist())):
            base = {**layer_fields(info, "nnz"), "sparsity": info["sparsity_requested"], "m1": 0}
            if info["status"] != Status.OK:
                rows.append({**base, "status": info["status"], "message": info["message"]})
                continue
            try:
                matrix = csr_from_row(table, i)
                t0 = time.perf_counter()
                orders = layer_orders(matrix, m1s, info["n"], params)
                seconds = (time.perf_counter() - t0) / max(len(orders), 1)  # the layer's time, shared by its M1s
                for m1, reordering in orders.items():
                    rows.append({**base, **reordering_row(reordering), "status": Status.OK, "message": "",
                                 **prefixed("identity", reordering.identity),
                                 **prefixed("reordered", tile_stats(reordering.tiles)),
                                 "seconds": seconds})
            except Exception as e:
                rows.append(failed_row(base, info["layer"], e))
        return rows

    return run_stage("reorder", SCHEMA, key, ctx, label, force, compute, inputs)
