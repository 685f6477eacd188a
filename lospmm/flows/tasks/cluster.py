"""Adapter of stage 6, cluster: 02_pruned, 03_reordered and 05_ranked -> 06_clusters (one row per
layer and chosen M1)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from lospmm.flows.schemas import F64, I32, LAYER_AT, STATUS, list_values
from lospmm.flows.taskio import RunContext, chosen_rows, failed_row, grouped, layer_fields, run_stage, stage_task
from lospmm.flows.tasks.prune import matrices
from lospmm.flows.tasks.reorder import tiles_by_layer
from lospmm.stages.cluster import ClusterParams, ProxyClusters, proxy_active_blocks, proxy_clusters
from lospmm.stages.devices import Device
from lospmm.stages.status import Status

# 06_clusters (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER_AT + STATUS
    + [("num_tiles", I32), ("max_active_blocks", I32), ("num_clusters", I32),
       ("cluster_of", pa.list_(I32)), ("medoid", pa.list_(I32)), ("centroid_nnc", pa.list_(F64)),
       ("centroid_nnz", pa.list_(F64)), ("nnc_p", pa.list_(I32)), ("cpl", pa.list_(I32)),
       ("columns", pa.list_(I32)), ("seconds", F64)]
)


@stage_task("cluster")
def cluster(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, device: Device, sparsity: float,
            params: ClusterParams) -> dict:
    def compute():
        a, tiles = matrices(ctx, inputs["prune"]), tiles_by_layer(ctx, inputs["reorder"])
        rows = []
        # rank's rows are in (layer, M1, N1) order, so the groups are too
        for (layer, m1), group in grouped(chosen_rows(ctx, inputs["rank"]), "layer", "m1").items():
            base = {**layer_fields(group[0], "sparsity"), "m1": m1}
            t0 = time.perf_counter()
            try:
                atb = proxy_active_blocks(group, device)
                cl = proxy_clusters(a[layer], tiles[layer][m1], sparsity, atb, params)
                rows.append({**base, **clusters_row(cl), "status": Status.OK, "message": "",
                             "num_tiles": tiles[layer][m1].num_tiles, "max_active_blocks": atb,
                             "seconds": time.perf_counter() - t0})
            except Exception as e:
                rows.append(failed_row(base, f"{layer} M1={m1}", e))
        return rows

    return run_stage("cluster", SCHEMA, key, ctx, label, force, compute, inputs)


def clusters_row(cl: ProxyClusters) -> dict:
    """A cluster.ProxyClusters as 06_clusters' columns (`columns` concatenated, split by nnc_p)."""
    return {"num_clusters": cl.num_clusters, "cluster_of": cl.cluster_of, "medoid": cl.medoid,
            "centroid_nnc": cl.centroid_nnc, "centroid_nnz": cl.centroid_nnz, "nnc_p": cl.nnc_p, "cpl": cl.cpl,
            "columns": np.concatenate(cl.columns)}


def clusters_from_row(table, i: int) -> ProxyClusters:
    """Row i of a 06_clusters table as the cluster stage's ProxyClusters (`columns` split by nnc_p)."""
    lv = lambda c: list_values(table, c, i)  # noqa: E731
    nnc_p = lv("nnc_p").astype(np.int32)
    columns = tuple(np.split(lv("columns").astype(np.int32), np.cumsum(nnc_p)[:-1]))
    return ProxyClusters(table.column("m1")[i].as_py(), lv("cluster_of").astype(np.int32),
                         lv("medoid").astype(np.int32), lv("centroid_nnc"), lv("centroid_nnz"), nnc_p,
                         lv("cpl").astype(np.int32), columns)
