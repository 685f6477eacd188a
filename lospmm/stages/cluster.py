"""Stage 6, cluster: the A_tiles of one M1 -> proxy block functions (§5.1.2–5.1.3).

Tiles are clustered on (memory accesses, multiply-adds) = (nnc, nnz) with agglomerative (Ward)
clustering into min(num_tiles, 3 · max NUM_ATB) clusters, NUM_ATB taken over the candidates the
proxy stands for. Each cluster becomes one proxy block function: NNC_p = min(NNC, 300 / (1 −
sparsity)) iterations of one B load and CPL multiply-adds, CPL = round(centroid nnz / centroid
nnc), loading an evenly spaced subset of its medoid tile's columns. A staged design's proxy also
copies, per block and chunk of K, as many columns of B as the full kernel's block does there: those
counts come from the real tiles (kernel.staging.staged_counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
from scipy.cluster.hierarchy import fcluster, linkage

from lospmm.devices import Device
from lospmm.devices import active_blocks_per_sm
from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.kernel.staging import design_counts, staged_shared_bytes
from lospmm.stages.reorder import Tiles


@dataclass(frozen=True)
class ClusterParams:
    """Defaults: clusters_per_active_block=3, iteration_budget=300 (§5.1.3's 300/(1 − sparsity))."""

    clusters_per_active_block: int = 3
    iteration_budget: float = 300.0


@dataclass(frozen=True)
class ProxyClusters:
    """Proxy block functions for one M1: tile t runs cluster `cluster_of[t]`."""

    m1: int
    cluster_of: np.ndarray  # int32 per tile
    medoid: np.ndarray  # int32 tile id per cluster
    centroid_nnc: np.ndarray  # float64 per cluster
    centroid_nnz: np.ndarray  # float64 per cluster
    nnc_p: np.ndarray  # int32 proxy iterations per cluster
    cpl: np.ndarray  # int32 multiply-adds per iteration per cluster
    columns: tuple[np.ndarray, ...]  # int32 B rows loaded by each cluster's proxy, NNC_p of them
    # a staged design's: columns of B each block of its tiles copies per chunk of K (blocks × chunks);
    # empty for every other design
    staged_counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))
    staged_columns: int = 32  # a staged block's N1: the floats of one staged column

    @property
    def num_clusters(self) -> int:
        return len(self.medoid)

    @property
    def shared_bytes(self) -> int:
        """Shared memory its proxy declares itself (a staged proxy's largest union; 0 for the others)."""
        return staged_shared_bytes(self.staged_counts, self.staged_columns)


def proxy_active_blocks(candidates, device: Device) -> int:
    """Max NUM_ATB (Eq. 5) over the (M1, N1) candidates one M1 proxy stands for: the proxy needs
    enough block functions to fill the busiest of them. `candidates`: objects or dicts with
    block_num, pred_regs and threads (a block's: N1, or a staged block's N1 per tile)."""
    get = (lambda c, f: c[f]) if candidates and isinstance(candidates[0], dict) else getattr
    return max(active_blocks_per_sm(get(c, "block_num"), get(c, "pred_regs"), get(c, "threads"), device)
               for c in candidates)


def chosen_proxy_clusters(matrix: sp.csr_matrix, tiles: Tiles, chosen, sparsity: float, device: Device,
                          params: ClusterParams = ClusterParams(), design: KernelDesign = BASELINE
                          ) -> tuple[ProxyClusters, int]:
    """The proxy of one M1 in `design` for its `chosen` candidates (objects or rows): its clusters,
    sized for the busiest candidate's active blocks (returned with them), and for a staged design
    each block's copies. The flow's cluster stage and search.layer_search both call this."""
    atb = proxy_active_blocks(chosen, device)
    clusters = proxy_clusters(matrix, tiles, sparsity, atb, params)
    if design.loads == "staged":
        clusters = replace(clusters, staged_counts=design_counts(matrix, tiles, design), staged_columns=design.fixed_n1)
    return clusters, atb


def cluster_count(num_tiles: int, max_active_blocks: int, params: ClusterParams = ClusterParams()) -> int:
    """3 · max(NUM_ATB), capped by the tile count."""
    return max(1, min(num_tiles, params.clusters_per_active_block * max(1, max_active_blocks)))


def proxy_clusters(matrix: sp.csr_matrix, tiles: Tiles, sparsity: float, max_active_blocks: int,
                   params: ClusterParams = ClusterParams()) -> ProxyClusters:
    """Cluster the tiles of `tiles` and derive each cluster's proxy block function."""
    if tiles.num_tiles == 0:
        raise ValueError("no tiles to cluster (the layer has no nonzero)")
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    features = np.column_stack([tiles.tile_nnc, tiles.tile_nnz]).astype(np.float64)
    k = cluster_count(tiles.num_tiles, max_active_blocks, params)
    if k >= tiles.num_tiles:
        labels = np.arange(tiles.num_tiles)
    else:
        labels = fcluster(linkage(features, method="ward"), t=k, criterion="maxclust") - 1
    # fcluster may return fewer clusters than asked (ties); renumber densely.
    _, labels = np.unique(labels, return_inverse=True)
    a = sp.csr_matrix(matrix)
    budget = int(np.ceil(params.iteration_budget / (1.0 - sparsity)))
    medoids, c_nnc, c_nnz, nnc_p, cpl, columns = [], [], [], [], [], []
    for c in range(labels.max() + 1):
        members = np.flatnonzero(labels == c)
        centroid = features[members].mean(axis=0)
        medoid = members[np.argmin(((features[members] - centroid) ** 2).sum(axis=1))]
        iters = max(1, min(int(round(centroid[0])), budget))
        cols = np.unique(a[tiles.tile(medoid)].indices)
        picks = cols[np.linspace(0, len(cols) - 1, num=min(iters, len(cols))).round().astype(int)]
        medoids.append(medoid)
        c_nnc.append(centroid[0])
        c_nnz.append(centroid[1])
        nnc_p.append(len(picks))
        cpl.append(max(1, int(round(centroid[1] / max(centroid[0], 1.0)))))
        columns.append(picks.astype(np.int32))
    return ProxyClusters(tiles.m1, labels.astype(np.int32), np.array(medoids, np.int32), np.array(c_nnc),
                         np.array(c_nnz), np.array(nnc_p, np.int32), np.array(cpl, np.int32), tuple(columns))
