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


@st.composite
def convolutions(draw):
    from lospmm.stages.codegen import ConvGeometry

    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dilation, stride, pad = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(0, 3))
    h = draw(st.integers(max(1, dilation * (kh - 1) + 1 - 2 * pad), 9))
    w = draw(st.integers(max(1, dilation * (kw - 1) + 1 - 2 * pad), 9))
    geometry = ConvGeometry(cin=draw(st.integers(1, 4)), h=h, w=w, kh=kh, kw=kw, stride=stride, pad=pad,
                            dilation=dilation)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cout = draw(st.integers(1, 9))
    a = sp.random(cout, geometry.k, density=draw(st.floats(0.0, 0.8)), format="csr", random_state=rng,
                  dtype=np.float32)
    a.data[:] = rng.standard_normal(a.nnz).astype(np.float32)
    a.eliminate_zeros()
    bias = tuple(rng.standard_normal(cout).tolist()) if draw(st.booleans()) else ()
    return a, geometry, bias


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), m1=st.integers(1, 5), n1=st.sampled_from([1, 7, 32]), batch=st.integers(1, 3),
       relu=st.booleans(), shard_nnz=st.sampled_from([1, 7, 4096]))
def test_the_conv_kernel_equals_a_reference_convolution_without_im2col(conv, m1, n1, batch, relu, shard_nnz):
    from lospmm.hostemu import checked_conv_against_reference
    from lospmm.stages.codegen import Epilogue, conv_kernel_source

    a, geometry, bias = conv
    epilogue = Epilogue(bias=bias, relu=relu)
    kernel = conv_kernel_source(a, reordered_tiles(a, m1), n1, geometry, epilogue, CodegenParams(shard_nnz=shard_nnz))
    assert kernel.k == geometry.k and kernel.params == ("const float* X", "float* Y", "int batch")
    assert checked_conv_against_reference(kernel, a, geometry, epilogue, batch=batch) < 1e-4


@pytest.mark.parametrize("name, cin, hw, window, stride, pad", [
    ("3×3, padding borders", 4, (7, 6), 3, 1, 1),
    ("3×3, stride 2", 4, (9, 9), 3, 2, 1),
    ("7×7 first layer, stride 2", 3, (16, 15), 7, 2, 3),
])
def test_conv_kernels_read_only_their_input_under_the_sanitizer(name, cin, hw, window, stride, pad):
    from lospmm.hostemu import checked_conv_against_reference
    from lospmm.stages.codegen import ConvGeometry, Epilogue, conv_kernel_source

    geometry = ConvGeometry(cin=cin, h=hw[0], w=hw[1], kh=window, kw=window, stride=stride, pad=pad)
    a = random_pruned(8, geometry.k, 0.6, np.random.default_rng(3))
    epilogue = Epilogue(bias=tuple(np.linspace(-1, 1, 8).tolist()), relu=True)
    kernel = conv_kernel_source(a, reordered_tiles(a, 2), 32, geometry, epilogue, CodegenParams(shard_nnz=64))
    assert checked_conv_against_reference(kernel, a, geometry, epilogue, batch=2, sanitize=True) < 1e-4


def test_a_conv_kernel_links_into_one_entry_without_spills_at_the_prediction():
    from lospmm.stages.codegen import ConvGeometry, Epilogue, conv_kernel_source

    geometry = ConvGeometry(cin=16, h=14, w=14, kh=3, kw=3, stride=1, pad=1)
    a = random_pruned(32, geometry.k, 0.8, np.random.default_rng(0))
    for m1 in (1, 16):
        kernel = conv_kernel_source(a, reordered_tiles(a, m1), 64, geometry, Epilogue(relu=True))
        out = nv.compiled_kernel(kernel, nv.kernel_options("sm_90", m1))
        assert out.status == "ok" and out.thread_spill_bytes == 0, out.log[-2000:]
        assert nv.entry_registers(out.cubin)[kernel.name] == out.registers  # the one entry point


def test_bad_conv_geometry_is_named():
    from lospmm.stages.codegen import ConvGeometry, conv_kernel_source

    with pytest.raises(ValueError, match="larger than the padded input"):
        ConvGeometry(cin=1, h=2, w=2, kh=5, kw=5)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ConvGeometry(cin=1, h=4, w=4, kh=3, kw=3, stride=0)
    a = random_pruned(4, 10, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="K=10 columns, the conv geometry needs cin·kh·kw = 9"):
        conv_kernel_source(a, reordered_tiles(a, 2), 32, ConvGeometry(cin=1, h=4, w=4, kh=3, kw=3))
