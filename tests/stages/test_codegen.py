"""The emitted kernel equals scipy's A·B, checked by running the exact CUDA text on the host."""

import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

from lospmm.hostemu import EmulationError, checked_against_scipy, host_program, run_on_host
from lospmm.stages import compile as nv
from lospmm.stages.cluster import proxy_clusters
from lospmm.stages.codegen import (CodegenParams, float_literal, full_kernel_source, proxy_kernel_source,
                                   proxy_tile_rows, shard_groups)
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import identity_tiles, reordered_tiles


@st.composite
def layers(draw):
    m, k = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = sp.random(m, k, density=draw(st.floats(0.0, 0.7)), format="csr", random_state=rng, dtype=np.float32)
    a.data[:] = rng.standard_normal(a.nnz).astype(np.float32)
    a.eliminate_zeros()
    return a


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 9), n1=st.sampled_from([1, 3, 32]), n=st.integers(1, 70),
       prefetch=st.integers(0, 3), reorder=st.booleans(), shard_nnz=st.sampled_from([1, 7, 4096]))
def test_emitted_kernel_equals_scipy(a, m1, n1, n, prefetch, reorder, shard_nnz):
    tiles = reordered_tiles(a, m1) if reorder else identity_tiles(a, m1)
    kernel = full_kernel_source(a, tiles, n1, CodegenParams(prefetch=prefetch, shard_nnz=shard_nnz))
    assert checked_against_scipy(kernel, a, n, seed=n) <= 1e-4


def test_empty_rows_are_zeroed_and_memory_stays_in_bounds():
    a = sp.csr_matrix(np.array([[0, 0, 0], [1.5, 0, -2], [0, 0, 0], [0, 3, 0], [0, 0, 0]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    assert "zero_0" in kernel.source and kernel.grid_x == 2 + 3
    checked_against_scipy(kernel, a, 33, sanitize=True)  # AddressSanitizer build


def test_all_zero_matrix_writes_zeros():
    a = sp.csr_matrix((4, 6), dtype=np.float32)
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 32)
    assert checked_against_scipy(kernel, a, 5) == 0.0


def test_an_unwritten_output_fails_the_check():
    a = sp.csr_matrix(np.eye(3, dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    broken = kernel.__class__(**{**vars(kernel), "grid_x": kernel.grid_x - 1})  # drop the last tile's block
    with pytest.raises(EmulationError, match="never written"):
        checked_against_scipy(broken, a, 4)


def test_out_of_bounds_access_is_caught_under_sanitizer():
    a = sp.csr_matrix(np.eye(3, dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    with pytest.raises(EmulationError, match="host run failed"):
        # B sized for 2 columns but the kernel told N = 4: reads past the end of B
        run_on_host(kernel, {"B": np.ones(3 * 2, np.float32), "C": np.empty(3 * 4, np.float32), "N": 4},
                    kernel.grid(4), 32, sanitize=True)


def test_source_shape_follows_algorithm_2():
    a = sp.csr_matrix(np.array([[1, 0, 2, 0], [0, 0, 3, 0]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 64)
    src = kernel.source
    assert src.count("lospmm_ld(Bn,") == 2  # columns 0 and 2 only: no load for an empty column
    assert len(re.findall(r"acc\d \+= b\d \* ", src)) == 3  # one multiply-add per nonzero
    assert "fmaf" not in src and "blockIdx.y * 64" in src and "if (n >= N) return;" in src
    assert re.fullmatch(r"lospmm_full_[0-9a-f]{16}", kernel.name)
    assert kernel.name in host_program(kernel)


def test_float_literals_round_trip_exactly():
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    values = np.concatenate([values, np.float32([1e-38, -3.4e38, 0.1, 1.0])])
    parsed = np.array([np.float32(float(s[:-1])) for s in float_literal(values)])
    assert np.array_equal(parsed, values)


def test_bad_tile_parameters_are_rejected():
    a = sp.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError, match="N1"):
        full_kernel_source(a, reordered_tiles(a, 1), 2048)
    with pytest.raises(ValueError, match="prefetch"):
        full_kernel_source(a, reordered_tiles(a, 1), 32, CodegenParams(prefetch=-1))


# --- proxies (§5.1) ---


def test_proxy_runs_in_bounds_under_host_emulation():
    a = random_pruned(96, 64, 0.8, np.random.default_rng(0))
    tiles = reordered_tiles(a, 8)
    cl = proxy_clusters(a, tiles, 0.8, 2)
    kernel = proxy_kernel_source(96, 64, cl)
    n, n1 = 100, 32
    out = run_on_host(kernel, {"B": np.ones(64 * n, np.float32), "C": np.empty(96 * n, np.float32), "N": n,
                               "cluster_of": cl.cluster_of, "tile_rows": proxy_tile_rows(tiles)},
                      (tiles.num_tiles, -(-n // n1), 1), n1, sanitize=True)["C"].reshape(96, n)
    written = np.unique(tiles.rows)
    assert np.isfinite(out[written]).all()  # every tile row stored, nothing out of bounds


def test_proxy_is_much_shorter_than_the_full_kernel_and_compiles():
    a = random_pruned(256, 256, 0.7, np.random.default_rng(0))
    tiles = reordered_tiles(a, 16)
    cl = proxy_clusters(a, tiles, 0.7, 1)
    proxy = proxy_kernel_source(256, 256, cl)
    full = full_kernel_source(a, tiles, 128)
    assert len(proxy.source) < len(full.source) / 3
    out = nv.compiled(proxy.source, proxy.name, nv.CompileOptions(maxrregcount=32))
    assert out.status == "ok", out.log


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 60))
def test_shard_groups_cover_every_function_once_in_order_within_the_budget(costs, budget):
    groups = shard_groups(costs, budget)
    assert [i for g in groups for i in g] == list(range(len(costs)))
    for g in groups:
        assert len(g) == 1 or sum(costs[i] for i in g) <= budget
    for g, nxt in zip(groups, groups[1:]):  # a group closes only when the next function would not fit
        assert sum(costs[i] for i in g) + costs[nxt[0]] > budget


def test_the_host_checked_text_is_the_units_compiled():
    a = random_pruned(64, 64, 0.8, np.random.default_rng(3))
    kernel = full_kernel_source(a, reordered_tiles(a, 8), 32, CodegenParams(shard_nnz=40))
    assert len(kernel.units) > 3 and kernel.source == "".join(kernel.units)
    assert kernel.name in kernel.units[-1] and all(kernel.name not in u for u in kernel.units[:-1])
    assert all(u.count("LOSPMM_TILE void tile_") >= 1 for u in kernel.units[:-1])
