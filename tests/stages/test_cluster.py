"""Stage 6, cluster: proxy block functions cover every tile, respect the iteration budget, and
group alike tiles; the proxy has as many block functions as the busiest candidate it stands for needs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from lospmm.stages.cluster import ClusterParams, cluster_count, proxy_active_blocks, proxy_clusters
from lospmm.stages.constrain import constrained_candidates
from lospmm.devices import device_named
from lospmm.devices import active_blocks_per_sm
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles, tile_stats

H100 = device_named("h100")


def _layer(m=96, k=64, s=0.8, seed=0):
    return random_pruned(m, k, s, np.random.default_rng(seed))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 120), k=st.integers(2, 80), s=st.floats(0.3, 0.95), m1=st.integers(1, 16),
       atb=st.integers(1, 32), seed=st.integers(0, 1000))
def test_clusters_cover_every_tile_and_respect_the_budget(m, k, s, m1, atb, seed):
    a = _layer(m, k, s, seed)
    tiles = reordered_tiles(a, m1)
    if tiles.num_tiles == 0:
        return
    cl = proxy_clusters(a, tiles, s, atb)
    assert len(cl.cluster_of) == tiles.num_tiles
    assert sorted(set(cl.cluster_of.tolist())) == list(range(cl.num_clusters))  # every cluster used
    assert cl.num_clusters <= cluster_count(tiles.num_tiles, atb)
    budget = int(np.ceil(300 / (1 - s)))
    for c in range(cl.num_clusters):
        assert cl.cluster_of[cl.medoid[c]] == c
        assert 1 <= cl.nnc_p[c] <= min(max(1, round(cl.centroid_nnc[c])), budget)
        assert len(cl.columns[c]) == cl.nnc_p[c] and len(set(cl.columns[c].tolist())) == cl.nnc_p[c]
        medoid_cols = set(a[tiles.tile(cl.medoid[c])].indices.tolist())
        assert set(cl.columns[c].tolist()) <= medoid_cols  # loads only columns its medoid really loads


def test_cluster_count_is_three_times_active_blocks_capped_by_tiles():
    assert cluster_count(100, 4) == 12 and cluster_count(5, 4) == 5
    assert cluster_count(100, 4, ClusterParams(clusters_per_active_block=1)) == 4


def test_similar_tiles_share_a_cluster():
    # two kinds of tiles: light (1 nnz per row) and heavy (dense rows)
    dense = np.zeros((64, 32), np.float32)
    dense[:32, 0] = 1
    dense[32:, :] = 1
    a = sp.csr_matrix(dense)
    tiles = reordered_tiles(a, 8)
    cl = proxy_clusters(a, tiles, 0.5, 1, ClusterParams(clusters_per_active_block=2))
    heavy = {t for t in range(tiles.num_tiles) if tiles.tile_nnz[t] > 8}
    assert cl.num_clusters == 2
    assert len({cl.cluster_of[t] for t in heavy}) == 1
    assert len({cl.cluster_of[t] for t in set(range(tiles.num_tiles)) - heavy}) == 1


def test_proxy_active_blocks_is_the_busiest_candidates_eq5():
    a = _layer(512, 256, 0.9)
    tiles = reordered_tiles(a, 8)
    cands = [c for c in constrained_candidates(4096, {8: tile_stats(tiles)}, H100) if c.kept]
    assert len(cands) >= 2
    each = [active_blocks_per_sm(c.block_num, c.pred_regs, c.n1, H100) for c in cands]
    assert len(set(each)) > 1  # the candidates differ, so the max is a real choice
    assert proxy_active_blocks(cands, H100) == max(each)
    rows = [vars(c) for c in cands]  # artifact rows work the same as candidate objects
    assert proxy_active_blocks(rows, H100) == max(each)
