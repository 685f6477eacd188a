"""Adapter of stage 6, cluster: 02_pruned, 03_reordered and 05_ranked -> 06_clusters (one row per
layer, chosen M1 and design)."""

from __future__ import annotations

import time

from lospmm.flows.execution.taskio import (RunContext, chosen_rows, failed_row, grouped, layer_fields, run_stage,
                                           stage_task, stoppable)
from lospmm.flows.catalog.clusters import SCHEMA, clusters_row
from lospmm.flows.catalog.pruned import matrices
from lospmm.flows.catalog.reordered import tiles_by_layer
from lospmm.stages.cluster import ClusterParams, chosen_proxy_clusters
from lospmm.devices import Device
from lospmm.kernel.design import design_named
from lospmm.status import Status


@stage_task("cluster")
def cluster(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, device: Device, sparsity: float,
            params: ClusterParams) -> dict:
    def compute():
        a, tiles = matrices(ctx, inputs["prune"]), tiles_by_layer(ctx, inputs["reorder"])
        rows = []
        # one proxy per layer, M1 and design: the chosen candidates of that M1 in that design
        for (layer, m1, design), group in stoppable(grouped(chosen_rows(ctx, inputs["rank"]), "layer", "m1",
                                                            "design").items()):
            base = {**layer_fields(group[0], "sparsity"), "m1": m1, "design": design}
            t0 = time.perf_counter()
            try:
                cl, atb = chosen_proxy_clusters(a[layer], tiles[layer][m1], group, sparsity, device, params,
                                                design_named(design))
                rows.append({**base, **clusters_row(cl), "status": Status.OK, "message": "",
                             "num_tiles": tiles[layer][m1].num_tiles, "max_active_blocks": atb,
                             "seconds": time.perf_counter() - t0})
            except Exception as e:
                rows.append(failed_row(base, f"{layer} M1={m1} ({design})", e))
        return rows

    return run_stage("cluster", SCHEMA, key, ctx, label, force, compute, inputs)
