"""The staged GEMM kernel (design loads="staged"): B through shared memory a block's tiles share. Its
CUDA text, run on the host as cooperative blocks under AddressSanitizer, equals scipy's A·B through
its epilogue (hypothesis over shapes, sparsity, tiles a block and N); a missing barrier is caught;
its design, layout and kernel.json hold together; what it cannot be is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings, strategies as st

from lospmm.kernel.check import checked
from lospmm.kernel.design import design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.host import HostKernel
from lospmm.kernel.render import CodegenParams, kernel_source, proxy_source
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.kernel.staging import STAGED_ROWS, design_counts, staged_counts
from lospmm.stages.cluster import chosen_proxy_clusters, proxy_clusters
from lospmm.stages.pad import proxy_dynamic_shared
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def staged_source(a, m1: int, tiles_per_block: int, epilogue=Epilogue(), warps: int = 1) -> KernelSource:
    design = design_named(f"staged,tiles={tiles_per_block},warps={warps}")
    return kernel_source(a, reordered_tiles(a, m1), design.fixed_n1, CodegenParams(design=design), epilogue)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(3, 40), k=st.sampled_from([7, 64, STAGED_ROWS + 45]), sparsity=st.sampled_from([0.5, 0.9]),
       m1=st.sampled_from([1, 2, 4]), per_block=st.sampled_from([2, 4, 8]), warps=st.sampled_from([1, 2, 4]),
       n=st.sampled_from([1, 33, 64, 200]), seed=st.integers(0, 1000))
# always: two and four warps a tile over several chunks of K (128 and 64 rows), a partial last block and
# a column block past N, rows with no nonzero at 0.9
@example(m=37, k=STAGED_ROWS + 45, sparsity=0.9, m1=2, per_block=4, warps=2, n=200, seed=3)
@example(m=29, k=STAGED_ROWS + 45, sparsity=0.9, m1=4, per_block=2, warps=4, n=129, seed=5)
def test_the_staged_kernel_computes_a_times_b_on_the_host(m, k, sparsity, m1, per_block, warps, n, seed):
    # a tile over 1, 2 or 4 warps (N1 of 32, 64, 128; chunks of K of 256, 128, 64 rows), N across blocks
    rng = np.random.default_rng(seed)
    a = random_pruned(m, k, sparsity, rng)
    bias = tuple(float(v) for v in rng.standard_normal(m))
    kernel = staged_source(a, m1, per_block, Epilogue(bias, "relu"), warps)
    assert kernel.spec.n1 == 32 * warps * per_block and kernel.spec.layout.columns_per_block() == 32 * warps
    result = checked(HostKernel(kernel, True), a, n, seed)
    assert result.ok, result


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cin=st.integers(1, 40), window=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2), pad=st.integers(0, 2),
       dilation=st.integers(1, 2), m=st.integers(3, 24), m1=st.sampled_from([1, 2, 4]),
       per_block=st.sampled_from([2, 4, 8]), warps=st.sampled_from([1, 2, 4]), batch=st.integers(1, 3),
       seed=st.integers(0, 1000))
# always: several chunks of K (40 channels × 9 = 360 rows at 4 warps a tile: 64-row chunks), padding
# on every border, a partial last block of pixels and rows with no nonzero
@example(cin=40, window=3, stride=1, pad=1, dilation=1, m=21, m1=2, per_block=4, warps=4, batch=3, seed=4)
def test_the_staged_conv_kernel_equals_a_reference_convolution(cin, window, stride, pad, dilation, m, m1, per_block,
                                                               warps, batch, seed):
    # the block's copy gathers each union column's input at the pixel's window (zero in the padding or
    # past the last pixel), its tiles' walks read it from shared memory, each row stored to Y's plane
    from lospmm.kernel.geometry import ConvGeometry

    size = dilation * (window - 1) + 1
    geometry = ConvGeometry(cin=cin, h=max(size, 6), w=max(size - 2 * pad, 5), kh=window, kw=window, stride=stride,
                            pad=pad, dilation=dilation)
    rng = np.random.default_rng(seed)
    a = random_pruned(m, geometry.k, 0.8, rng)
    epilogue = Epilogue(tuple(float(v) for v in rng.standard_normal(m)), "relu")
    design = design_named(f"staged,tiles={per_block},warps={warps}")
    kernel = kernel_source(a, reordered_tiles(a, m1), design.fixed_n1, CodegenParams(design=design), epilogue,
                           geometry)
    assert kernel.spec.form == "conv" and kernel.params == ("const float* X", "float* Y", "int batch")
    assert kernel.spec.design == design and design.serves_conv and design.conv_kernel == design
    result = checked(HostKernel(kernel, True), a, batch, seed)
    assert result.ok, result


def test_a_block_stages_its_tiles_union_once_a_chunk_and_covers_one_warps_columns():
    a = random_pruned(64, STAGED_ROWS * 2 + 10, 0.9, np.random.default_rng(1))
    kernel = staged_source(a, 2, 8)
    spec = kernel.spec
    tiles = reordered_tiles(a, 2)
    groups = -(-tiles.num_tiles // 8)
    assert spec.n1 == 256 and spec.layout.row_blocks == groups + (-(-len(tiles.empty_rows) // 2))
    assert spec.grid(1000) == (spec.layout.row_blocks, 32, 1)  # 32 columns a block, whatever its warps
    assert spec.cooperative and "__syncthreads" in "".join(kernel.units)
    text = "".join(kernel.units)
    assert text.count("for (int j = slot;") == sum(  # one copy loop per (group, chunk with columns)
        len({c // STAGED_ROWS for t in range(g * 8, min(g * 8 + 8, tiles.num_tiles))
             for c in a[tiles.tile(t)].indices}) for g in range(groups))
    again = KernelSpec.from_json(spec.to_json())
    assert again.design == spec.design and again.layout == spec.layout and again.grid(77) == spec.grid(77)


def test_a_missing_barrier_is_caught_on_the_host():
    a = random_pruned(32, 96, 0.7, np.random.default_rng(2))
    kernel = staged_source(a, 2, 4)
    unit = next(i for i, u in enumerate(kernel.units) if "for (int j = slot;" in u)
    units = list(kernel.units)
    units[unit] = units[unit].replace("  __syncthreads();\n  if (slot == ", "  if (slot == ", 1)
    broken = KernelSource(kernel.spec, tuple(units))
    assert checked(HostKernel(kernel, False), a, 40).ok
    assert not checked(HostKernel(broken, False), a, 40).ok


def test_the_staged_design_reads_back_from_its_label_and_refuses_what_it_is_not():
    d = design_named("staged")
    assert (d.loads, d.tiles_per_block) == ("staged", 8) and design_named(d.label) == d
    assert d.label == "baked,staged,tile-x,walks=1,v=1,tiles=8"
    assert "tiles_per_block" not in design_named("chained").facts()  # other designs' facts as before
    wide = design_named("staged,tiles=4,warps=4")
    assert (wide.fixed_n1, wide.staged_rows, wide.block_threads(wide.fixed_n1)) == (128, 64, 512)
    assert design_named(wide.label) == wide and wide.label.endswith(",tiles=4,warps=4")
    assert "tile_warps" not in d.facts() and wide.facts()["tile_warps"] == 4  # one warp a tile: facts as before
    for bad in ("staged,tiles=3", "staged,v=2", "staged,walks=4", "staged,column-x", "chained,tiles=4",
                "staged,streamed", "fp16,staged", "chained,warps=2", "staged,warps=3", "staged,tiles=16,warps=4"):
        with pytest.raises(ValueError):
            design_named(bad)
    a = random_pruned(16, 32, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="N1 must be 32"):
        kernel_source(a, reordered_tiles(a, 2), 64, CodegenParams(design=d))
    with pytest.raises(ValueError, match="N1 must be 128"):
        kernel_source(a, reordered_tiles(a, 2), 32, CodegenParams(design=wide))
    clusters = proxy_clusters(a, reordered_tiles(a, 2), 0.5, 2)  # no copies: not a staged design's clusters
    with pytest.raises(ValueError, match="needs the copies of each of its"):
        proxy_source(16, 32, clusters, CodegenParams(design=d))


def _staged_clusters(a, m1: int, per_block: int, warps: int = 1):
    from lospmm.devices import device_named
    from lospmm.stages.constrain import constrained_candidates
    from lospmm.stages.reorder import tile_stats

    tiles = reordered_tiles(a, m1)
    design = design_named(f"staged,tiles={per_block},warps={warps}")
    chosen = [c for c in constrained_candidates(64, {m1: tile_stats(tiles)}, device_named("h100"), design=design)]
    return tiles, design, chosen_proxy_clusters(a, tiles, chosen, 0.9, device_named("h100"), design=design)[0]


def test_staged_counts_are_the_unions_the_kernel_copies():
    # the estimate and the proxy read staged_counts; the kernel bakes the unions as copy tables: the same sizes
    import re

    a = random_pruned(70, STAGED_ROWS * 2 + 30, 0.85, np.random.default_rng(4))
    tiles = reordered_tiles(a, 3)
    counts = staged_counts(a, tiles, 4)
    assert counts.shape == (-(-tiles.num_tiles // 4), 3)
    for g in range(counts.shape[0]):
        rows = np.concatenate([tiles.tile(t) for t in range(4 * g, min(4 * g + 4, tiles.num_tiles))])
        union = np.unique(a[rows].indices)
        assert counts[g].tolist() == [int(np.sum(union // STAGED_ROWS == c)) for c in range(3)]
    for warps in (1, 2):  # two warps a tile: chunks of 128 rows
        design = design_named(f"staged,tiles=4,warps={warps}")
        counts = design_counts(a, tiles, design)
        assert counts.shape[1] == -(-a.shape[1] // design.staged_rows)
        kernel = staged_source(a, 3, 4, warps=warps)
        blocks = [u for u in kernel.units if "const int lospmm_staged_" in u]  # the units of block functions
        # per block one table (named by its first tile) of its chunks' unions, each chunk one copy loop over its own
        tables = {int(g): int(n) for u in blocks for g, n in re.findall(r"int lospmm_staged_(\d+)\[(\d+)\]", u)}
        assert tables == {4 * g: int(counts[g].sum()) for g in range(counts.shape[0])}
        loops = [[int(n) for n in re.findall(r"for \(int j = slot; j < (\d+);", part)]
                 for u in blocks for part in u.split("__device__ const int lospmm_staged_")[1:]]
        assert loops == [[int(c) for c in counts[g] if c] for g in range(counts.shape[0])]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(4, 48), k=st.sampled_from([40, STAGED_ROWS + 45]), m1=st.sampled_from([1, 2, 4]),
       per_block=st.sampled_from([2, 4, 8]), warps=st.sampled_from([1, 2, 4]), n=st.sampled_from([1, 33, 200]),
       seed=st.integers(0, 1000))
@example(m=45, k=STAGED_ROWS + 45, m1=2, per_block=4, warps=2, n=200, seed=1)
def test_the_staged_proxy_runs_its_blocks_copies_and_walks_within_bounds(m, k, m1, per_block, warps, n, seed):
    # a proxy's output is meaningless; its memory accesses and barriers are checked under ASan, with the
    # last block's slots past the tiles copying and meeting at the barriers too
    from lospmm.kernel.host import proxy_check

    a = random_pruned(m, k, 0.8, np.random.default_rng(seed))
    tiles, design, clusters = _staged_clusters(a, m1, per_block, warps=warps)
    kernel = proxy_source(m, k, clusters, CodegenParams(design=design))
    spec, n1 = kernel.spec, design.fixed_n1
    assert spec.cooperative and spec.layout.block(n1) == n1 * per_block
    assert spec.grid(n, n1) == (-(-tiles.num_tiles // per_block), -(-n // n1), 1)
    assert proxy_check(kernel, clusters.cluster_of, n, n1) == "asan-ok"
    if warps > 1:  # its code assumes its own N1: a launch at another is refused, not run with slots missing
        assert "runs at N1" in proxy_check(kernel, clusters.cluster_of, n, 32)


@pytest.mark.parametrize("warps", [1, 4])
def test_a_staged_proxy_copies_what_its_clusters_say_and_declares_the_full_kernels_shared_memory(warps):
    from dataclasses import replace

    a = random_pruned(64, STAGED_ROWS + 100, 0.9, np.random.default_rng(5))
    tiles, design, clusters = _staged_clusters(a, 2, 8 // warps, warps=warps)
    n1 = 32 * warps
    text = "".join(proxy_source(64, a.shape[1], clusters, CodegenParams(design=design)).units)
    assert f"Bs[{int(clusters.staged_counts.max()) * n1}]" in text and clusters.shared_bytes == \
        int(clusters.staged_counts.max()) * 4 * n1
    with pytest.raises(ValueError, match="sized for"):  # clusters of another N1 would misprice its shared memory
        proxy_source(64, a.shape[1], replace(clusters, staged_columns=n1 * 2), CodegenParams(design=design))
    assert ", ".join(map(str, clusters.staged_counts.ravel())) in text  # the block's copies, chunk by chunk
    # Eq. 6's padding less what the proxy declares, never below zero
    assert proxy_dynamic_shared(clusters.shared_bytes + 1000, clusters) == 1000
    assert proxy_dynamic_shared(10, clusters) == 0


def test_the_staged_kernel_package_round_trips_through_kernel_json():
    a = sp.csr_matrix(np.eye(8, 40, dtype=np.float32))
    spec = staged_source(a, 2, 2).spec
    facts = json.loads(spec.to_json())
    assert facts["launch"]["groups"] == 2 and facts["block"]["x"] == 64
    assert facts["grid"]["y"] == "ceil(N / 32)"
    wide = staged_source(sp.csr_matrix(np.eye(8, 40, dtype=np.float32)), 2, 2, warps=4).spec
    facts = json.loads(wide.to_json())
    assert facts["block"]["x"] == 256 and facts["grid"]["y"] == "ceil(N / 128)" and "share 128 columns" in facts["layout"]
    assert facts["design"]["tile_warps"] == 4 and KernelSpec.from_json(wide.to_json()).design == wide.design


def test_a_staged_kernels_register_cap_is_above_the_floor_and_its_layout_agrees_with_its_design():
    from dataclasses import replace

    from lospmm.kernel.registers import RegisterModel, predicted_registers
    from lospmm.kernel.spec import KernelSpecError

    staged, chained = design_named("staged,tiles=8"), design_named("chained")
    for m1 in (1, 4, 12, 48):  # at the floor of 32 a staged tile of 4 rows spilled
        assert predicted_registers(m1, design=staged) == predicted_registers(m1, design=chained) + RegisterModel.staged_regs
    spec = staged_source(sp.csr_matrix(np.eye(8, 40, dtype=np.float32)), 2, 2).spec
    with pytest.raises(KernelSpecError, match="2 groups of threads a block are not its design's 8"):
        replace(spec, design=staged)


def test_a_launch_over_48_kb_of_shared_memory_in_all_opts_in_first():
    # a staged proxy declares up to 32 KiB and launches with Eq. 6's rest: together past 48 KB the
    # function's dynamic limit must be raised first (without it the launch fails on the device)
    from lospmm.kernel.cuda import shared_opt_in

    assert shared_opt_in(32768, 44032, 0)  # M1 = 8, 8 tiles a block, 3 active blocks on an H100
    assert not shared_opt_in(0, 44032, 0) and shared_opt_in(0, 60000, 0)
    assert not shared_opt_in(32768, 44032, 44032)  # already raised to it
