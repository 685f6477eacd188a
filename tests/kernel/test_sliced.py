"""The sliced design (k_slices, the K split across a block's warps): a tile's columns in W slices, each
walked by its own group of N1 threads over the same columns, the rows two slices touch summed through
shared memory. Against scipy on the host (every slice count, vector width, load and grid order, an
epilogue), its barrier and partial sums, its proxy, its label, launch, registers and estimate; its
implicit-im2col conv kernel against a reference convolution."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lospmm.devices import DEVICES
from lospmm.kernel.check import checked
from lospmm.kernel.choices import design_problem
from lospmm.kernel.design import SLICE_SHARED_BYTES, design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.host import HostKernel
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.render.sliced import column_slices, row_owners
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.kernel.timing import LaunchUnderTest
from lospmm.stages.constrain import constrained_candidates
from lospmm.stages.pad import proxy_dynamic_shared
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles, tile_stats
from tests.conftest import convolutions, host_run_wrong, proxy_on_host


@given(st.lists(st.integers(0, 9), max_size=40), st.sampled_from([2, 4, 8]))
def test_slices_keep_the_columns_in_order_and_share_the_work(counts, slices):
    columns = list(range(len(counts)))
    nonzeros = [[(0, "x")] * c for c in counts]
    parts = column_slices(columns, nonzeros, slices)
    assert len(parts) == slices
    assert [c for cols, _ in parts for c in cols] == columns
    assert [nz for _, nzs in parts for nz in nzs] == nonzeros
    weights = [sum(1 + len(nz) for nz in nzs) for _, nzs in parts]
    # a slice holds at most its share of the work and half a column more on each side
    heaviest = max((1 + c for c in counts), default=0)
    assert max(weights) <= sum(weights) / slices + heaviest


def test_a_row_two_slices_touch_is_reduced_and_owned_by_one_of_them():
    parts = [([0], [[(0, "a"), (1, "b")]]), ([1], [[(1, "c")]]), ([2], [[(1, "d"), (2, "e")]]), ([], [])]
    by_row, owner, reduced = row_owners(parts, 4)
    assert by_row == [[0], [0, 1, 2], [2], []]
    assert reduced == [1] and owner[1] in (0, 1, 2)
    assert owner[0] == 0 and owner[2] == 2 and owner[3] == 0  # a row none touches: slice 0 stores its zero


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 30), k=st.integers(1, 120), density=st.floats(0.05, 0.7), m1=st.integers(1, 6),
       slices=st.sampled_from([2, 4, 8]), v=st.sampled_from([1, 2, 4]), order=st.sampled_from(["tile-x", "column-x"]),
       n=st.sampled_from([1, 37, 200]), prefetch=st.integers(0, 2), seed=st.integers(0, 1000))
def test_a_sliced_kernel_computes_a_times_b_through_its_epilogue_on_the_host(m, k, density, m1, slices, v, order, n,
                                                                              prefetch, seed):
    # N up to 200 over N1 = 32·V: a partial last column block, whose threads past N still meet the barrier
    rng = np.random.default_rng(seed)
    a = random_pruned(m, k, 1 - density, rng)
    design = design_named(f"chained,{order},v={v},slices={slices}")
    epilogue = Epilogue(tuple(float(x) for x in rng.standard_normal(m)), "relu")
    kernel = kernel_source(a, reordered_tiles(a, m1), 32, CodegenParams(prefetch=prefetch, design=design), epilogue)
    assert kernel.spec.cooperative and kernel.spec.layout.groups == slices
    result = checked(HostKernel(kernel, True), a, n, seed)
    assert result.ok, (design.label, result.message)


def test_the_barrier_and_every_partial_sum_are_needed():
    a = random_pruned(16, 300, 0.6, np.random.default_rng(3))
    design = design_named("chained,slices=4")
    kernel = kernel_source(a, reordered_tiles(a, 8), 32, CodegenParams(design=design), Epilogue())
    text = kernel.source
    assert text.count("__syncthreads();") == 2 and "lospmm_part_st(" in text and "lospmm_part_ld(" in text
    assert checked(HostKernel(kernel, True), a, 70).ok
    # the host runs a block's threads in index order up to each barrier: without it, an owner of a low
    # slice reads the partials of higher slices before they are stored
    without_barrier = KernelSource(kernel.spec, tuple(u.replace("  __syncthreads();\n", "") for u in kernel.units))
    assert host_run_wrong(without_barrier, a, 70)
    # a partial left out (the first of each tile) loses that slice's share of its row
    dropped = tuple(re.sub(r"    lospmm_part_st\(mine, Pl, [^;]*;\n", "", u, count=1) for u in kernel.units)
    assert dropped != kernel.units
    assert host_run_wrong(KernelSource(kernel.spec, dropped), a, 70)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), m1=st.integers(1, 5), n1=st.sampled_from([1, 7, 32]), batch=st.integers(1, 3),
       slices=st.sampled_from([2, 4, 8]), v=st.sampled_from([1, 2, 4]), order=st.sampled_from(["tile-x", "column-x"]),
       prefetch=st.integers(0, 2), relu=st.booleans(), seed=st.integers(0, 1000))
def test_a_sliced_conv_kernel_equals_a_reference_convolution_on_the_host(conv, m1, n1, batch, slices, v, order,
                                                                         prefetch, relu, seed):
    """Every window, stride, padding and dilation: each slice loads its columns' window inputs (zero in
    the padding) for V pixels a thread, the shared rows are reduced, and a last block of pixels that fills
    only some threads and lanes still meets the barrier and stores nothing past Y (under ASan)."""
    a, geometry, bias = conv
    design = design_named(f"chained,{order},v={v},slices={slices}")
    assert design.conv_kernel == design and design.serves_conv
    kernel = kernel_source(a, reordered_tiles(a, m1), n1, CodegenParams(prefetch=prefetch, design=design),
                           Epilogue(bias, "relu" if relu else ""), geometry)
    spec = kernel.spec
    assert spec.form == "conv" and spec.cooperative and spec.layout.block() == slices * n1
    assert kernel.params == ("const float* X", "float* Y", "int batch") and spec.alignment == 4
    result = checked(HostKernel(kernel, True), a, batch, seed)
    assert result.ok, (design.label, result.message)


def test_the_sliced_conv_kernels_barrier_and_partial_sums_are_needed():
    geometry = ConvGeometry(cin=8, h=6, w=5, kh=3, kw=3, pad=1)
    a = random_pruned(16, geometry.k, 0.5, np.random.default_rng(3))
    kernel = kernel_source(a, reordered_tiles(a, 8), 8, CodegenParams(design=design_named("chained,v=2,slices=4")),
                           Epilogue(), geometry)
    assert "__syncthreads();" in kernel.source and "lospmm_part_st2(" in kernel.source
    assert "const float* p = " not in kernel.source  # window loads: no chained pointer into B
    assert checked(HostKernel(kernel, True), a, 2).ok
    without_barrier = KernelSource(kernel.spec, tuple(u.replace("  __syncthreads();\n", "") for u in kernel.units))
    assert host_run_wrong(without_barrier, a, 2)
    dropped = tuple(re.sub(r"    lospmm_part_st2\(mine, Pl, [^;]*;\n", "", u, count=1) for u in kernel.units)
    assert dropped != kernel.units and host_run_wrong(KernelSource(kernel.spec, dropped), a, 2)


def test_a_sliced_run_serves_a_convolution_with_its_sliced_conv_kernel():
    from lospmm.kernel.choices import served_options
    from lospmm.kernel.render.conv import conv_kernel
    from lospmm.stages.emit import served_form

    design = design_named("chained,v=2,slices=4")
    a = random_pruned(64, 576, 0.9, np.random.default_rng(0))
    tiles = reordered_tiles(a, 8)
    [served] = served_options(a, tiles, 64, 576, 4096, 64, design, DEVICES["h100"], conv=True, untiled=False)
    assert served.design == design and served_form(design, True) == "implicit-conv"
    # its lanes' windows at any V: the conv kernel's registers and ptxas level are the lanes' (compile.kernel_options)
    one_lane = design_named("chained,slices=4")
    assert one_lane.conv_lane_windows and not design_named("chained").conv_lane_windows
    assert predicted_registers(8, design=one_lane, conv=True) == predicted_registers(8, design=one_lane) + 12
    # its window loads are priced as the baked conv kernel's, not by the `chained` its name keeps (a review found
    # the label alone making it 1.5× cheaper on a 3×3 layer)
    from lospmm.kernel.estimate import EstimateParams, address_instructions, full_kernel_work

    params = EstimateParams()
    conv_work = full_kernel_work(tiles, 64, 576, 4096, 64, 64, design=design, matrix=a, conv=True)
    gemm_work = full_kernel_work(tiles, 64, 576, 4096, 64, 64, design=design, matrix=a)
    assert address_instructions(conv_work, params) == params.addr_instr_per_load
    assert address_instructions(gemm_work, params) == params.chained_addr_instr_per_load < params.addr_instr_per_load
    with pytest.raises(ValueError, match="sliced or staged one is its renderer's"):
        conv_kernel(a, tiles, 64, ConvGeometry(cin=64, h=4, w=4, kh=3, kw=3, pad=1),
                    params=CodegenParams(design=design))


def test_the_sliced_launch_is_w_groups_of_n1_threads_over_n1_columns():
    a = random_pruned(40, 256, 0.8, np.random.default_rng(0))
    kernel = kernel_source(a, reordered_tiles(a, 4), 64, CodegenParams(design=design_named("chained,v=2,slices=4")))
    spec = kernel.spec
    assert spec.layout.block() == 256 and spec.layout.columns_per_block() == 128
    assert spec.grid(300)[1] == 3  # ceil(300 / 128) column blocks
    facts = spec.facts()
    assert facts["launch"]["groups"] == 4 and facts["design"]["k_slices"] == 4
    assert "4 slices of K (64 threads each) share 128 columns" in facts["layout"]
    read = KernelSpec.of_facts(facts)
    assert (read.layout, read.design) == (spec.layout, spec.design)
    # a kernel.json written before the layout's groups had a name of their own reads back
    old = {**facts, "launch": {**{k: v for k, v in facts["launch"].items() if k != "groups"}, "tiles_per_block": 4}}
    assert KernelSpec.of_facts(old).layout == spec.layout
    assert "groups" not in kernel_source(a, reordered_tiles(a, 4), 64).spec.facts()["launch"]


def test_a_sliced_proxy_runs_in_bounds_with_its_partials_at_launch():
    design = design_named("chained,slices=4")
    kernel, clusters, out = proxy_on_host(design)
    assert "LOSPMM_PARTIALS(Ps)" in kernel.source and "__syncthreads();" in kernel.source
    assert kernel.spec.layout.block(32) == 128
    assert out.shape == (38, 150) and np.isfinite(out).all()
    # launched with its partial sums at least, however little Eq. 6 pads
    assert proxy_dynamic_shared(0, clusters, design, 64) == design.slice_shared_bytes(4, 64) == 4 * 4 * 4 * 64
    assert proxy_dynamic_shared(100_000, clusters, design, 64) == 100_000
    assert proxy_dynamic_shared(1000, clusters) == 1000  # other designs as before


def test_a_sliced_proxy_launched_short_of_its_partials_fails_on_the_host():
    """The host run gives a proxy exactly the dynamic shared memory it is launched with (a static array
    of 256 KB stood for it, so a launch short of its partial sums passed there and would fault on the
    GPU): one float short is an AddressSanitizer failure, and the flow's proxy check is launched so."""
    from lospmm.kernel.host import EmulationError, proxy_check

    design = design_named("chained,slices=2")
    least = design.slice_shared_bytes(4, 32)
    kernel, clusters, _ = proxy_on_host(design, least)
    # the bytes it reaches: past its highest slot (slot k of N1 = 32 lanes' floats) by a whole slot
    slots = [int(k) for k in re.findall(r"lospmm_part_st\(mine, Pl, (\d+) \*", kernel.source)]
    reached = (max(slots) + 1) * 32 * 4
    assert 0 < reached <= least
    proxy_on_host(design, reached)
    with pytest.raises(EmulationError, match="heap-buffer-overflow"):
        proxy_on_host(design, reached - 4)  # the last lane's float of the last slot
    with pytest.raises(EmulationError, match="launched with no dynamic shared memory for its partial sums"):
        proxy_on_host(design, 0)
    assert proxy_check(kernel, clusters.cluster_of, 70, 32, least) == "asan-ok"
    assert "heap-buffer-overflow" in proxy_check(kernel, clusters.cluster_of, 70, 32, reached - 4)


def test_the_sliced_design_reads_back_from_its_label_and_refuses_what_it_is_not():
    d = design_named("chained,v=2,slices=4")
    assert (d.k_slices, d.block_groups, d.block_threads(64)) == (4, 4, 256)
    assert design_named(d.label) == d and d.label.endswith(",slices=4")
    assert "k_slices" in d.facts() and "k_slices" not in design_named("chained").facts()
    assert d.code_key != design_named("chained,v=2").code_key
    for text in ("streamed,slices=2", "staged,slices=2", "walks=4,slices=2", "fp16,slices=2", "walks=4,split=64,slices=2",
                 "slices=2", "based,slices=2"):
        with pytest.raises(ValueError, match="slices=W"):
            design_named(text)
    with pytest.raises(ValueError, match="k_slices must be one of"):
        design_named("slices=3")
    # a convolution in a sliced run is served by its own sliced conv kernel (the implicit im2col)
    assert d.conv_kernel == d and d.serves_conv and d.conv_lanes == 2


def test_a_block_past_its_threads_or_shared_memory_is_refused_everywhere():
    d = design_named("chained,slices=4")
    assert d.block_problem(8, 256) == "" and "over 1024" in d.block_problem(8, 512)
    assert "bytes of partial sums" in d.block_problem(32, 128)  # 4 · 32 · 128 · 4 = 64 KiB
    assert d.slice_shared_bytes(32, 128) > SLICE_SHARED_BYTES
    a = random_pruned(64, 512, 0.9, np.random.default_rng(0))
    with pytest.raises(ValueError, match="partial sums"):
        kernel_source(a, reordered_tiles(a, 32), 128, CodegenParams(design=d))
    assert "over 1024" in design_problem(d, 8, 512, 1000, DEVICES["h100"])
    tiles = {m1: tile_stats(reordered_tiles(a, m1)) for m1 in (4, 32)}
    removed = {(c.m1, c.n1): c.removed_by for c in constrained_candidates(1024, tiles, DEVICES["h100"], design=d)}
    assert removed[(32, 128)] == "register" and removed[(4, 512)] == "register"
    timing = estimate_timer(DEVICES["h100"]).time(LaunchUnderTest(reordered_tiles(a, 32), 64, 512, 1024, 128, 40,
                                                                  design=d, matrix=a))
    assert timing.status.name == "ERROR" and "partial sums" in timing.message


def test_the_estimate_shortens_a_long_walk_and_pays_for_the_reduction():
    # a few long tiles over few columns (N = 196: ResNet-50's layer4 at batch 4): the longest walk binds,
    # and W slices shorten it; at a large N the issue bound is the same and the reduction costs
    a = random_pruned(256, 4608, 0.9, np.random.default_rng(0))
    tiles = reordered_tiles(a, 16)
    timer = estimate_timer(DEVICES["h100"])

    def timing(label, n):
        d = design_named(label)
        return timer.time(LaunchUnderTest(tiles, 256, 4608, n, 64, predicted_registers(16, design=d), design=d,
                                          matrix=a))

    assert timing("chained,slices=4", 196).time_us < 0.6 * timing("chained", 196).time_us
    assert timing("chained,slices=4", 196).time_us < timing("chained,slices=2", 196).time_us
    assert timing("chained,slices=4", 65536).compute_us > timing("chained", 65536).compute_us


def test_a_sliced_kernel_spills_nothing_at_its_predicted_registers_and_a_ranker_tells_it_apart():
    # one column a thread: its slice, shared address and test of N beside the sums (RegisterModel.slice_regs);
    # at the baked kernel's prediction this tile spilled 56 B
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.rank import DESIGN_FEATURES, SLICE_FEATURES, design_feature_names, ranks_designs

    a = random_pruned(256, 1024, 0.9, np.random.default_rng(0))
    design = design_named("chained,slices=4")
    kernel = kernel_source(a, reordered_tiles(a, 16), 64, CodegenParams(design=design), Epilogue())
    out = compiled_kernel(kernel, kernel_options("sm_90", 16, design=design))
    assert out.status.name == "OK" and out.thread_spill_bytes == 0 and out.smem_bytes > 0
    assert predicted_registers(16, design=design) == predicted_registers(16, design=design_named("chained")) + 4
    assert predicted_registers(8, design=design_named("chained,v=2,slices=8")) == \
        predicted_registers(8, design=design_named("chained,v=2"))
    designs = [design_named("chained"), design]
    assert design_feature_names(designs) == DESIGN_FEATURES + SLICE_FEATURES
    assert not ranks_designs(DESIGN_FEATURES, designs) and ranks_designs(DESIGN_FEATURES + SLICE_FEATURES, designs)
