"""The search in half precision (issue 23, item 4): a half design's constraints, proxies, estimate and
ranker describe the kernel it emits (one packed pair per thread, B and C in 2 bytes), so a half
kernel's tile is chosen among half candidates."""

import numpy as np
import pytest

from lospmm.kernel.host import proxy_check
from lospmm.kernel.design import BASELINE, KernelDesign, design_named, half_design
from lospmm.kernel.numbers import NumberFormat, rounded_matrix
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.stages.compile import compiled_kernel, kernel_options
from lospmm.stages.constrain import constrained_candidates, predicted_registers
from lospmm.devices import device_named
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles, tile_stats
from lospmm.search import SearchParams, layer_search, proxy_sources, proxy_timings
from lospmm.kernel.estimate import EstimateParams, estimate_timer, full_kernel_work, walk_instructions

H100 = device_named("h100")


def test_a_half_design_reads_back_from_its_label_and_leaves_the_fp32_designs_as_they_were():
    d = design_named("fp16,chained")
    assert (d.dtype, d.columns_per_thread, d.accumulate, d.loads) == ("fp16", 2, "packed", "chained")
    assert d.label == "fp16,baked,chained,tile-x,walks=1,v=2" and design_named(d.label) == d
    assert design_named("fp16,acc=packed") == design_named("fp16") == KernelDesign(dtype="fp16", columns_per_thread=2)
    f32 = design_named("bf16,acc=f32")
    assert f32.label.startswith("bf16,acc=f32,") and design_named(f32.label) == f32
    assert design_named("fp16,promote=8").promote_every == 8
    # the fp32 designs' labels and code keys (part of their kernels' names and cache keys) are unchanged
    assert BASELINE.label == "baked,based,tile-x,walks=1,v=1"
    assert BASELINE.code_key == ("tile-x", False, 1, "based", "baked")
    assert not BASELINE.number.is_half and f32.number == NumberFormat("bf16", "f32")
    assert half_design(NumberFormat("bf16", "f32"), design_named("chained")) == design_named("bf16,acc=f32,chained")
    for bad, why in (({"dtype": "fp16"}, "one packed pair per thread"),
                     ({"dtype": "fp16", "columns_per_thread": 2, "column_walks": 4}, "one packed pair per thread"),
                     ({"accumulate": "f32"}, "an fp32 design sums in fp32"),
                     ({"dtype": "fp16", "columns_per_thread": 2, "accumulate": "f32", "promote_every": 4},
                      "promote_every")):
        with pytest.raises(ValueError, match=why):
            KernelDesign(**bad)


def test_half_candidates_cover_two_columns_per_thread_and_count_a_register_per_packed_sum():
    a = random_pruned(256, 512, 0.9, np.random.default_rng(0))
    stats = {m1: tile_stats(reordered_tiles(a, m1)) for m1 in (4, 16)}
    fp32 = {(c.m1, c.n1): c for c in constrained_candidates(1000, stats, H100)}
    half = {(c.m1, c.n1): c for c in constrained_candidates(1000, stats, H100, design=design_named("fp16"))}
    assert fp32[(4, 64)].num_b_tiles == 16 and half[(4, 64)].num_b_tiles == 8  # ceil(1000 / 64) vs ceil(1000 / 128)
    assert half[(4, 64)].block_num == fp32[(4, 64)].block_num // 2
    # checked against ptxas (sm_90, -O1): the smallest caps without a spill at M1 = 8..64 were these or below
    assert [predicted_registers(m1, design=design_named("fp16")) for m1 in (8, 16, 32, 64)] == [32, 40, 64, 112]
    assert [predicted_registers(m1, design=design_named("fp16,acc=f32")) for m1 in (8, 16, 32)] == [42, 66, 114]
    assert [predicted_registers(m1, design=design_named("fp16,promote=8")) for m1 in (8, 16, 32)] == [52, 88, 160]
    assert predicted_registers(16, design=design_named("chained,v=2")) == 78  # the fp32 pair design's, unchanged


def test_the_estimate_counts_a_half_kernels_instructions_and_bytes():
    a = random_pruned(256, 512, 0.9, np.random.default_rng(1))
    tiles = reordered_tiles(a, 4)
    p = EstimateParams()
    fp32, packed, f32 = (full_kernel_work(tiles, 256, 512, 1024, 64, 32, design=design_named(d))
                         for d in ("chained", "fp16,chained", "fp16,acc=f32,chained"))
    fmas, loads = tiles.tile_nnz.astype(float), tiles.tile_nnc.astype(float)
    fixed = p.block_overhead_instr + p.call_instr
    # one HFMA2 per nonzero covers both columns: the same count as the fp32 kernel's one column
    assert np.allclose(walk_instructions(packed, p), fmas + 2 * loads + p.store_instr * 4 + fixed)
    assert np.allclose(walk_instructions(packed, p), walk_instructions(fp32, p))
    # fp32 sums: two FFMAs per nonzero, each B pair unpacked, each row's pair packed at the store
    assert np.allclose(walk_instructions(f32, p), 2 * fmas + 4 * loads + (p.store_instr + 1) * 4 + fixed)
    timer = estimate_timer(H100)
    from lospmm.kernel.timing import LaunchUnderTest

    def est(design: str, n1: int) -> float:
        d = design_named(design)
        return timer.time(LaunchUnderTest(tiles, 256, 512, 1024, n1, predicted_registers(4, design=d),
                                          design=d)).time_us
    # the packed pair walks each tile's code over half as many column blocks, and B and C are 2 bytes
    assert est("fp16,chained", 64) < est("chained", 64)
    assert est("fp16,chained", 64) < est("fp16,acc=f32,chained", 64)


def test_a_half_layer_is_searched_with_half_proxies_that_run_clean_and_spill_no_more_than_its_kernel():
    a, _ = rounded_matrix(random_pruned(96, 256, 0.8, np.random.default_rng(3)), "fp16")
    design = design_named("fp16,chained")
    from lospmm.flows.storage.ranker_store import load_ranker, shipped_ranker

    booster = load_ranker(shipped_ranker(half=True))[0]
    search = layer_search(a, 512, 0.8, H100, booster, SearchParams(m1s=(2, 8), design=design))
    assert search.chosen and all(c.num_b_tiles == -(-512 // (2 * c.n1)) for c in search.chosen)
    for (m1, _), proxy in proxy_sources(search, 96, 256).items():
        assert proxy.name.startswith("lospmm_half_proxy") and proxy.layout.columns_per_thread == 2
        assert proxy.params[0] == "const lospmm_h16* B"
        compiled = compiled_kernel(proxy, kernel_options("sm_90", m1, design=design))
        assert compiled.status == "ok", compiled.log[-500:]
        full = compiled_kernel(kernel_source(a, search.tiles[m1], 64, CodegenParams(design=design)),
                               kernel_options("sm_90", m1, design=design))
        assert compiled.thread_spill_bytes <= full.thread_spill_bytes == 0
        assert proxy_check(proxy, search.clusters[(m1, design.label)].cluster_of, 37, 32) == "asan-ok"
    timings = proxy_timings(search, 96, 256, 512, estimate_timer(H100))
    assert timings and all(np.isfinite(t.time_us) for t in timings.values())


def test_a_design_without_a_half_form_is_refused_by_name_not_rewritten():
    for design in ("v=4", "chained,v=2", "column-x", "chained,walks=4", "streamed"):
        with pytest.raises(ValueError, match="one packed pair per thread"):
            half_design(NumberFormat("fp16"), design_named(design))
    with pytest.raises(ValueError, match="is not fp16-packed"):
        half_design(NumberFormat("fp16"), design_named("fp16,acc=f32"))
    assert half_design(NumberFormat("bf16"), design_named("bf16")) == design_named("bf16")
