"""06_clusters: the proxy block functions of a layer's chosen M1 in one design (cluster); a row is a
stages.cluster.ProxyClusters (a staged design's copies per block and chunk of K in `staged_counts`,
`staged_chunks` a block; 0 and empty for the other designs)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lospmm.flows.storage.schemas import F64, I32, LAYER_AT, STATUS, STR, list_values
from lospmm.kernel.design import design_named
from lospmm.stages.cluster import ProxyClusters

# 06_clusters (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER_AT + [("design", STR)] + STATUS
    + [("num_tiles", I32), ("max_active_blocks", I32), ("num_clusters", I32),
       ("cluster_of", pa.list_(I32)), ("medoid", pa.list_(I32)), ("centroid_nnc", pa.list_(F64)),
       ("centroid_nnz", pa.list_(F64)), ("nnc_p", pa.list_(I32)), ("cpl", pa.list_(I32)),
       ("columns", pa.list_(I32)), ("staged_chunks", I32), ("staged_counts", pa.list_(I32)), ("seconds", F64)]
)
RECORD = ProxyClusters  # what a row stands for in the stages


def clusters_row(cl: ProxyClusters) -> dict:
    """A cluster.ProxyClusters as 06_clusters' columns (`columns` concatenated, split by nnc_p)."""
    return {"num_clusters": cl.num_clusters, "cluster_of": cl.cluster_of, "medoid": cl.medoid,
            "centroid_nnc": cl.centroid_nnc, "centroid_nnz": cl.centroid_nnz, "nnc_p": cl.nnc_p, "cpl": cl.cpl,
            "columns": np.concatenate(cl.columns), "staged_chunks": int(cl.staged_counts.shape[1]),
            "staged_counts": cl.staged_counts.ravel()}


def clusters_from_row(table, i: int) -> ProxyClusters:
    """Row i of a 06_clusters table as the cluster stage's ProxyClusters (`columns` split by nnc_p)."""
    lv = lambda c: list_values(table, c, i)  # noqa: E731
    nnc_p = lv("nnc_p").astype(np.int32)
    columns = tuple(np.split(lv("columns").astype(np.int32), np.cumsum(nnc_p)[:-1]))
    chunks = table.column("staged_chunks")[i].as_py() or 0
    staged = lv("staged_counts").astype(np.int32)
    # a staged column is the design's N1 floats (its row names the design)
    n1 = design_named(table.column("design")[i].as_py() or "baseline").fixed_n1 or 32
    return ProxyClusters(table.column("m1")[i].as_py(), lv("cluster_of").astype(np.int32),
                         lv("medoid").astype(np.int32), lv("centroid_nnc"), lv("centroid_nnz"), nnc_p,
                         lv("cpl").astype(np.int32), columns,
                         staged.reshape(-1, chunks) if chunks else np.zeros((0, 0), np.int32), n1)
