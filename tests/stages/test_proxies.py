"""Cluster, pad and proxy kernels (§5.1–5.2)."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from lospmm.hostemu import run_on_host
from lospmm.stages import compile as nv
from lospmm.stages.cluster import ClusterParams, cluster_count, proxy_clusters
from lospmm.stages.codegen import proxy_kernel_source, proxy_tile_rows
from lospmm.stages.devices import device_named
from lospmm.stages.pad import active_blocks_per_sm, blocks_fitting_smem, proxy_launch
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles

H100, V100 = device_named("h100"), device_named("v100")


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


@pytest.mark.parametrize("dev", [H100, V100])
@pytest.mark.parametrize("m1, n1, tiles, n", [(8, 128, 96, 4096), (32, 256, 24, 4096), (128, 512, 6, 512),
                                               (1, 32, 3072, 50176)])
def test_eq6_shared_memory_gives_the_full_kernels_occupancy(dev, m1, n1, tiles, n):
    regs = m1 + 16
    launch = proxy_launch(tiles, n, m1, n1, regs, dev)
    assert launch.grid_x == tiles and launch.grid_y == -(-n // n1) and launch.block == n1
    assert launch.num_atb == active_blocks_per_sm(tiles * launch.grid_y, regs, n1, dev)
    assert launch.smem_bytes <= dev.max_smem_per_block
    assert blocks_fitting_smem(launch.smem_bytes, dev) == launch.num_atb


def test_active_blocks_follow_eq5():
    # few blocks: ceil(NUM_TB / SMs) binds; many blocks: registers bind
    assert active_blocks_per_sm(132, 32, 128, H100) == 1
    assert active_blocks_per_sm(100000, 144, 256, H100) == 65536 // (8 * 144 * 32)


def test_proxy_runs_in_bounds_under_host_emulation():
    a = _layer(96, 64, 0.8)
    tiles = reordered_tiles(a, 8)
    cl = proxy_clusters(a, tiles, 0.8, 2)
    kernel = proxy_kernel_source(96, 64, cl)
    n, n1 = 100, 32
    out = run_on_host(kernel, {"B": np.ones(64 * n, np.float32), "C": np.empty(96 * n, np.float32), "N": n,
                               "cluster_of": cl.cluster_of, "tile_rows": proxy_tile_rows(tiles)},
                      (tiles.num_tiles, -(-n // n1), 1), n1, sanitize=True)["C"].reshape(96, n)
    written = np.unique(tiles.rows)
    assert np.isfinite(out[written]).all()  # every tile row stored, nothing out of bounds


@pytest.mark.skipif(not nv.available(), reason="NVRTC not installed")
def test_proxy_is_much_shorter_than_the_full_kernel_and_compiles():
    from lospmm.stages.codegen import full_kernel_source

    a = _layer(256, 256, 0.7)
    tiles = reordered_tiles(a, 16)
    cl = proxy_clusters(a, tiles, 0.7, 1)
    proxy = proxy_kernel_source(256, 256, cl)
    full = full_kernel_source(a, tiles, 128)
    assert len(proxy.source) < len(full.source) / 3
    out = nv.compiled(proxy.source, proxy.name, nv.CompileOptions(maxrregcount=32))
    assert out.status == "ok", out.log
