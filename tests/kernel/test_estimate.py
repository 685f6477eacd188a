"""The estimate timer: labelled, finite where a launch is possible, and responsive to its inputs."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import pytest

from lospmm.stages.cluster import proxy_clusters
from lospmm.devices import DEVICES, device_named
from lospmm.stages.pad import proxy_launch
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles
from lospmm.kernel.estimate import EstimateTimer, estimated_timing, full_kernel_work, proxy_work
from lospmm.kernel.timing import LaunchUnderTest, Timing
from lospmm.status import Status

H100 = device_named("h100")


def _work(m=256, k=256, n=1024, m1=8, n1=128, sparsity=0.9, regs=32, seed=0):
    a = random_pruned(m, k, sparsity, np.random.default_rng(seed))
    return full_kernel_work(reordered_tiles(a, m1), m, k, n, n1, regs)


def test_estimate_is_labelled_and_finite():
    t = estimated_timing(_work(), H100)
    assert t.timer == "estimate" and t.status == "ok"
    assert 0 < t.time_us < 1e5 and t.active_blocks >= 1
    assert t.time_us >= max(t.compute_us, t.memory_us, t.latency_us)


def test_more_work_is_never_faster():
    base = estimated_timing(_work(n=1024), H100).time_us
    assert estimated_timing(_work(n=4096), H100).time_us >= base  # one wave either way: the longest block binds
    big = dict(m=1024, k=1024)
    assert estimated_timing(_work(n=16384, **big), H100).time_us > estimated_timing(_work(n=1024, **big), H100).time_us
    assert estimated_timing(_work(sparsity=0.5), H100).time_us > estimated_timing(_work(sparsity=0.95), H100).time_us


def test_spills_cost_time():
    w = _work()
    slow = estimated_timing(type(w)(**{**vars(w), "spill_bytes": 512}), H100)
    assert slow.time_us > estimated_timing(w, H100).time_us


def test_impossible_launch_is_a_row_not_an_exception():
    w = _work()
    too_many_regs = estimated_timing(type(w)(**{**vars(w), "registers": 300}), H100)
    assert too_many_regs.status == "error" and too_many_regs.time_us == float("inf")
    huge_block = estimated_timing(type(w)(**{**vars(w), "n1": 2048}), H100)
    assert huge_block.status == "error"


def test_proxy_padding_gives_the_full_kernels_occupancy():
    a = random_pruned(512, 256, 0.9, np.random.default_rng(1))
    tiles = reordered_tiles(a, 8)
    launch = proxy_launch(tiles.num_tiles, 4096, 8, 128, 32, H100)
    cl = proxy_clusters(a, tiles, 0.9, launch.num_atb)
    proxy = estimated_timing(proxy_work(cl, 512, 256, 4096, 128, registers=24, smem_bytes=launch.smem_bytes), H100)
    full = estimated_timing(full_kernel_work(tiles, 512, 256, 4096, 128, 32), H100)
    assert proxy.active_blocks == full.active_blocks == launch.num_atb


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_device_has_throughput_facts(name):
    d = DEVICES[name]
    assert d.clock_ghz > 0 and d.dram_gbps > 0 and d.l2_gbps >= d.dram_gbps and d.fp32_lanes_per_sm >= 32


def test_the_estimate_timer_times_proxies_and_full_kernels_through_one_interface():
    a = random_pruned(512, 256, 0.9, np.random.default_rng(1))
    tiles = reordered_tiles(a, 8)
    cl = proxy_clusters(a, tiles, 0.9, 4)
    timer = EstimateTimer(H100)
    full = timer.time(LaunchUnderTest(tiles, 512, 256, 4096, 128, 32))
    proxy = timer.time(LaunchUnderTest(tiles, 512, 256, 4096, 128, 24, smem_bytes=1024, clusters=cl))
    assert full.time_us == estimated_timing(full_kernel_work(tiles, 512, 256, 4096, 128, 32), H100).time_us
    assert proxy.time_us == estimated_timing(proxy_work(cl, 512, 256, 4096, 128, 24, 1024), H100).time_us
    assert full.time_us != proxy.time_us  # the proxy is timed as a proxy, not as the full kernel
    assert timer.name == "estimate" and not timer.measures and not timer.runs_binary
    dense = timer.dense(512, 256, 4096)
    assert dense.status == "skipped" and dense.time_us != dense.time_us  # NaN: a model has no baseline
    assert timer.checked(None, b"", a, 77) is None  # it runs nothing: the emitted kernel is checked on the host


def test_calibration_recovers_a_device_whose_parameters_it_was_not_told():
    """Measurements made with a 'true' model far from the datasheet: the fit starts from the
    datasheet and ends close to the truth on launches it was fitted to and on others."""
    from dataclasses import replace

    from lospmm.kernel.estimate import EstimateParams, calibrated_estimate

    true_device = replace(H100, l2_gbps=2500.0, mem_latency_cycles=900)
    true_params = replace(EstimateParams(), launch_us=6.0, fetch_bytes_per_sm_cycle=1.5)
    works = [_work(m=m, k=k, n=n, m1=m1, n1=n1, sparsity=s, seed=i)
             for i, (m, k, n, m1, n1, s) in enumerate([(256, 256, 1024, 8, 128, 0.9), (512, 256, 4096, 1, 128, 0.9),
                                                       (512, 512, 196, 2, 32, 0.8), (128, 512, 12544, 4, 256, 0.95),
                                                       (1024, 256, 784, 16, 64, 0.7), (256, 1024, 4096, 1, 256, 0.95),
                                                       (384, 64, 784, 2, 480, 0.9), (768, 768, 32, 1, 32, 0.9),
                                                       (64, 64, 50176, 2, 640, 0.9), (960, 160, 196, 1, 128, 0.9),
                                                       (2048, 512, 196, 2, 128, 0.9), (256, 2304, 784, 1, 832, 0.9)])]
    measured = [estimated_timing(w, true_device, true_params).time_us for w in works]
    fitted_device, fitted_params = calibrated_estimate(works[::2], measured[::2], H100)

    def error(device, params, ws, ms):
        return float(np.median([abs(np.log(estimated_timing(w, device, params).time_us / m)) for w, m in zip(ws, ms)]))

    before = error(H100, EstimateParams(), works, measured)
    assert before > 0.2
    assert error(fitted_device, fitted_params, works[::2], measured[::2]) < 0.05
    assert error(fitted_device, fitted_params, works[1::2], measured[1::2]) < before / 3  # launches it never saw


def test_a_calibration_stays_inside_the_physical_bounds():
    """Measurements no physical device makes (every launch 1000× slower than the model): the fit
    ends on the bounds, not beyond them (an issue rate above 4 per SM-cycle, say)."""
    from lospmm.kernel.estimate import CALIBRATED_DEVICE, CALIBRATED_PARAMS, PHYSICAL_BOUNDS, calibrated_estimate

    works = [_work(m=256, k=256, n=n, seed=i) for i, n in enumerate((256, 1024, 4096, 16384))]
    measured = [1000 * estimated_timing(w, H100).time_us for w in works]
    device, params = calibrated_estimate(works, measured, H100, starts=2)
    for name in CALIBRATED_PARAMS + CALIBRATED_DEVICE:
        _, low, high = PHYSICAL_BOUNDS[name]
        value = getattr(params if name in CALIBRATED_PARAMS else device, name)
        assert low * 0.999 <= value <= high * 1.001, name


def test_the_estimate_follows_the_kernel_design():
    """Fetch-bound (the datasheet's instruction supply slowed to the H100's measured rate): chained
    addresses and more columns per thread need fewer instructions, a looped block fetches a small
    tile's code once, and the grid's order is not modelled."""
    from dataclasses import replace

    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateParams

    params = replace(EstimateParams(), fetch_bytes_per_sm_cycle=1.0)

    def timed(design: str, model: EstimateParams = params):
        w = _work(m=1024, k=1024, n=16384, m1=2, n1=128)
        return estimated_timing(replace(w, design=design_named(design)), H100, model)

    base = timed("baseline").time_us
    assert timed("chained").time_us < base and timed("chained,v=4").time_us < timed("chained").time_us
    # 8 walks per fetch of a ~1 KB tile: an eighth of the code fetched (other terms may bind then)
    assert timed("chained,walks=8").fetch_us == pytest.approx(timed("chained").fetch_us / 8, rel=0.02)
    assert timed("chained,walks=8").time_us < timed("chained").time_us
    assert timed("chained,column-x").time_us == timed("chained").time_us
    no_tile_fits = replace(params, icache_bytes=1024)  # walking again fetches again
    assert timed("chained,walks=8", no_tile_fits).fetch_us == pytest.approx(timed("chained").fetch_us, rel=0.02)


def test_a_streamed_kernel_pays_its_columns_loads_in_sequence_and_through_the_load_store_units():
    """The H200's A/B measured the streamed kernels 1.4-9.5x slower than chained on the same tiles,
    where the estimate priced them alike: its loop waits a load's whole latency and its entry's per
    column (no load ahead across iterations) and issues M1 + 2 loads a column, one a cycle an SM."""
    from dataclasses import replace

    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateParams

    def timed(design: str, **shape):
        w = _work(**shape)
        return estimated_timing(replace(w, design=design_named(design)), H100, EstimateParams())

    small = dict(m=256, k=512, n=196, m1=4, n1=224)  # a latency-bound ResNet-50 layer4 GEMM at batch 4
    assert timed("streamed,chained", **small).latency_us > 1.8 * timed("chained", **small).latency_us
    wide = dict(m=768, k=768, n=4096, m1=48, n1=256)  # BERT's FFN tile: 50 loads a column
    w = _work(**wide)
    warps = -(-4096 // 256) * 256 // 32
    lsu_us = warps * float(w.tile_loads.sum()) * 50 / H100.sms / (H100.clock_ghz * 1e3)
    assert timed("streamed,chained", **wide).compute_us == pytest.approx(lsu_us, rel=1e-6)
    assert timed("streamed,chained,v=4", **wide).compute_us < lsu_us / 3  # the value loads serve 4 columns


def test_the_estimate_timer_uses_a_devices_calibration_where_it_has_one():
    from lospmm.kernel.estimate import CALIBRATIONS, EstimateParams, estimate_timer

    calibrated = estimate_timer(H100)
    assert calibrated.params != EstimateParams() and calibrated.device != H100
    assert calibrated.params.launch_us == dict(CALIBRATIONS["h100"].params)["launch_us"]
    assert calibrated.device.l2_gbps == dict(CALIBRATIONS["h100"].device)["l2_gbps"]
    assert calibrated.device.sms == H100.sms and calibrated.device.arch == H100.arch  # only throughput facts change
    assert calibrated.name == f"estimate:{CALIBRATIONS['h100'].label}"  # every row it times names the calibration
    assert estimate_timer(H100, calibrated=False) == EstimateTimer(H100)
    a100 = device_named("a100")
    assert "a100" not in CALIBRATIONS and estimate_timer(a100) == EstimateTimer(a100)


def test_a_noisy_measurement_is_measured_again_and_flagged_never_averaged_in():
    from lospmm.kernel.timing import settled

    calls = iter([(10.0, 0.30), (12.0, 0.04), (99.0, 0.0)])
    t = settled(lambda: next(calls), bound=0.10, attempts=3)
    assert (t.us, t.spread, t.attempts, t.flagged) == (12.0, 0.04, 2, False)  # the settled one alone, not a mean
    noisy = iter([(10.0, 0.30), (20.0, 0.25)])
    t = settled(lambda: next(noisy), bound=0.10, attempts=2)
    assert (t.us, t.attempts, t.flagged) == (20.0, 2, True)
    assert settled(lambda: (5.0, float("nan")), attempts=1).flagged  # no spread is no evidence of quiet


def _staged_pair(a, m1: int, per_block: int, n: int = 4096):
    """(chained at N1 = 32, staged) estimates of the same tiles, with the same registers."""
    from lospmm.kernel.design import design_named

    tiles = reordered_tiles(a, m1)
    out = []
    for label in ("chained", f"staged,tiles={per_block}"):
        work = full_kernel_work(tiles, *a.shape, n, 32, 48, design=design_named(label), matrix=a)
        out.append(estimated_timing(work, H100))
    return out


def test_a_staged_block_reads_its_tiles_shared_columns_of_b_once():
    # every row has the same columns: a block of 8 tiles copies each once, where 8 tiles read it 8 times
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    shared = sp.csr_matrix(np.tile((rng.random(1024) < 0.1) * rng.standard_normal(1024), (512, 1)).astype(np.float32))
    chained, staged = _staged_pair(shared, 4, 8)
    assert chained.status == staged.status == "ok"
    assert staged.memory_us < chained.memory_us / 3  # to the DRAM floor (B and C once)
    # disjoint columns: nothing is shared, so B's traffic is the same and the staged block only adds copies
    disjoint = sp.csr_matrix(sp.block_diag([np.ones((4, 8), np.float32)] * 128))
    chained, staged = _staged_pair(disjoint, 4, 8)
    assert staged.memory_us >= chained.memory_us * 0.99 and staged.compute_us > chained.compute_us


def test_a_staged_estimate_needs_the_layers_a_and_prices_a_proxy_by_the_full_kernels_copies():
    from dataclasses import replace

    from lospmm.kernel.design import design_named
    from lospmm.kernel.staging import staged_counts

    a = random_pruned(256, 512, 0.9, np.random.default_rng(1))
    tiles, design = reordered_tiles(a, 8), design_named("staged,tiles=8")
    timer = EstimateTimer(H100)
    without = timer.time(LaunchUnderTest(tiles, 256, 512, 1024, 32, 48, design=design))
    assert without.status == "error" and "needs the layer's A" in without.message
    full = timer.time(LaunchUnderTest(tiles, 256, 512, 1024, 32, 32, design=design, matrix=a))
    assert full.status == "ok" and np.isfinite(full.time_us)
    # a proxy whose clusters are the tiles themselves copies and walks what the full kernel does
    clusters = replace(proxy_clusters(a, tiles, 0.9, 10 ** 6), staged_counts=staged_counts(a, tiles, 8))
    proxy = timer.time(LaunchUnderTest(None, 256, 512, 1024, 32, 32, clusters=clusters, design=design))
    assert proxy.memory_us == pytest.approx(full.memory_us, rel=0.05)
    # a block of 8 warps at 32 registers: 8 fit an SM by registers and threads, fewer by the union it stages
    from lospmm.devices import resident_blocks

    assert clusters.shared_bytes > 24 * 1024
    assert full.active_blocks == proxy.active_blocks == resident_blocks(32, 256, clusters.shared_bytes, H100) \
        < resident_blocks(32, 256, 0, H100) == 8


def test_a_staged_tile_over_more_warps_fetches_its_code_once_for_as_many_columns():
    # the instruction supply the calibrations find binding: a block fetches its tiles' code once for its
    # N1 columns, so four warps a tile fetch a quarter of one warp's, with the same B traffic through L2
    from lospmm.kernel.design import design_named

    a = random_pruned(512, 768, 0.9, np.random.default_rng(2))
    tiles = reordered_tiles(a, 4)
    narrow, wide = (design_named(f"staged,tiles=4,warps={w}") for w in (1, 4))
    one, four = (estimated_timing(full_kernel_work(tiles, 512, 768, 4096, d.fixed_n1, 40, design=d, matrix=a), H100)
                 for d in (narrow, wide))
    assert four.fetch_us == pytest.approx(one.fetch_us / 4, rel=0.02)
    assert four.memory_us == pytest.approx(one.memory_us, rel=0.01)  # each union through L2 once either way
    assert one.compute_us < four.compute_us < 1.25 * one.compute_us  # the same work, more chunks' copies


def test_the_staged_model_by_hand_on_one_block():
    # one block of two tiles (10 and 20 loads, 15 and 30 multiply-adds, M1 = 2) over 64 columns (two column
    # blocks of 32), one chunk whose union is 25 columns: every term of staged_timing written out
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateParams, KernelWork

    p, d = EstimateParams(), H100
    work = KernelWork(4, 100, 64, 2, 32, np.array([10, 20]), np.array([15, 30]), 32, design=design_named("staged,tiles=2"),
                      staged_counts=np.array([[25]]))
    t = estimated_timing(work, d, p)
    walk = np.array([15 + 10, 30 + 20]) + p.store_instr * 2 + p.block_overhead_instr + p.call_instr
    chunk = 13 * p.staged_copy_instr + p.staged_chunk_instr  # each warp copies ceil(25 / 2) columns
    clock = d.clock_ghz * 1e9
    issue = 2 * (walk.sum() + 2 * chunk) / (d.sms * p.issue_per_sm_cycle)  # 2 column blocks, 2 warps' copies each
    smem = 2 * (30 + 25) / d.sms  # a load or a copy's store: one wavefront
    ffma = 2 * 45 / (d.sms * d.fp32_lanes_per_sm / 32)
    assert t.compute_us == pytest.approx(max(issue, smem, ffma) / clock * 1e6)
    l2 = 4 * 64 * (25 + 2 * 2)  # the union once for each 32 columns, and C
    dram = 4 * (100 * 64 + 4 * 64)
    assert t.memory_us == pytest.approx(max(dram / (d.dram_gbps * 1e9), l2 / (d.l2_gbps * 1e9)) * 1e6)
    path = 4 * d.mem_latency_cycles + chunk + (20 * p.smem_latency_cycles / 2 + walk[1])  # copies, then the slowest walk
    assert t.latency_us == pytest.approx(max(2 * path / (d.sms * t.active_blocks), path) / clock * 1e6)
    assert t.fetch_us == pytest.approx(16 * 2 * walk.sum() / (d.sms * p.fetch_bytes_per_sm_cycle * clock) * 1e6)


def test_a_staged_block_waits_on_each_chunks_slowest_warp():
    # two tiles of one block over two chunks: tile 0 walks 16 loads (24 multiply-adds) in chunk 0 and 4 (6)
    # in chunk 1, tile 1 the other way round; between a chunk's barriers the block waits on that chunk's
    # slowest warp, so its walk costs both heavy halves, not the slower tile's whole walk
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateParams, KernelWork

    p, d = EstimateParams(), H100
    loads, fmas = np.array([[16, 4], [4, 16]]), np.array([[24, 6], [6, 24]])
    common = dict(design=design_named("staged,tiles=2"), staged_counts=np.array([[18, 18]]))
    whole = KernelWork(4, 512, 32, 2, 32, loads.sum(1), fmas.sum(1), 32, **common)
    split = KernelWork(4, 512, 32, 2, 32, loads.sum(1), fmas.sum(1), 32, **common, chunk_loads=loads, chunk_fmas=fmas)
    rest = p.store_instr * 2 + p.block_overhead_instr + p.call_instr
    heavy = 16 * p.smem_latency_cycles / 2 + 16 + 24  # a chunk's slowest warp
    chunk = 9 * p.staged_copy_instr + p.staged_chunk_instr
    path = 2 * (3 * d.mem_latency_cycles + chunk) + 2 * heavy + rest  # each chunk's copies, then its slowest warp
    t = estimated_timing(split, d, p)
    assert t.latency_us == pytest.approx(path / (d.clock_ghz * 1e9) * 1e6)  # one block: its own path
    one_warp = 2 * (3 * d.mem_latency_cycles + chunk) + (20 * p.smem_latency_cycles / 2 + 20 + 30 + rest)
    assert estimated_timing(whole, d, p).latency_us == pytest.approx(one_warp / (d.clock_ghz * 1e9) * 1e6)
    assert t.latency_us > estimated_timing(whole, d, p).latency_us


def test_a_staged_kernels_work_splits_each_tiles_loads_by_chunk_and_its_proxy_by_its_clusters_columns():
    from lospmm.kernel.design import design_named
    from lospmm.kernel.staging import chunk_work
    from dataclasses import replace

    from lospmm.kernel.staging import design_counts

    from lospmm.stages.reorder import identity_tiles

    design = design_named("staged,tiles=2,warps=4")  # chunks of 64 rows
    # rows 0-1 (tile 0): columns 0, 1 (both rows), 70; rows 2-3 (tile 1): columns 65, 66, 130 (both rows)
    dense = np.zeros((4, 140), np.float32)
    dense[0, [0, 1, 70]] = dense[1, [0, 1]] = 1
    dense[2, [65, 66, 130]] = dense[3, [130]] = 1
    a = sp.csr_matrix(dense)
    loads, fmas = chunk_work(a, identity_tiles(a, 2), design.staged_rows)
    assert loads.tolist() == [[2, 1, 0], [0, 2, 1]] and fmas.tolist() == [[4, 1, 0], [0, 2, 2]]
    a = random_pruned(96, 600, 0.9, np.random.default_rng(7))
    tiles = reordered_tiles(a, 4)
    work = full_kernel_work(tiles, 96, 600, 512, 128, 48, design=design, matrix=a)
    assert work.chunk_loads.shape == (tiles.num_tiles, 10)
    assert (work.chunk_loads.sum(1) == tiles.tile_nnc).all() and (work.chunk_fmas.sum(1) == tiles.tile_nnz).all()
    clusters = proxy_clusters(a, tiles, 0.9, 2)
    clusters = replace(clusters, staged_counts=design_counts(a, tiles, design), staged_columns=128)
    proxy = proxy_work(clusters, 96, 600, 512, 128, 48, 0, design=design)
    c = clusters.cluster_of[0]  # tile 0's cluster: its columns' chunks, CPL multiply-adds each
    want = np.bincount(np.asarray(clusters.columns[c]) // 64, minlength=10)
    assert proxy.chunk_loads[0].tolist() == want.tolist()
    assert proxy.chunk_fmas[0].tolist() == (want * clusters.cpl[c]).tolist()


def test_the_overlapped_price_lies_between_the_largest_term_and_their_sum_and_never_under_the_longest_block():
    from lospmm.kernel.estimate import overlapped_us

    t = Timing("estimate", 6.0, compute_us=3.0, memory_us=4.0, latency_us=1.0, fetch_us=0.5)  # launch 2 + body 4
    assert overlapped_us(t, 2.0, math.inf) == 6.0  # the estimate itself
    assert overlapped_us(t, 2.0, 1.0) == pytest.approx(2.0 + 8.5)  # the terms' sum
    assert overlapped_us(t, 2.0, 2.0) == pytest.approx(2.0 + math.sqrt(9 + 16 + 1 + 0.25))
    longest = Timing("estimate", 12.0, compute_us=1.0, memory_us=1.0, latency_us=1.0, fetch_us=1.0)
    assert overlapped_us(longest, 2.0, 1.0) == 12.0  # a block's critical path (body 10) binds: the sum cannot undercut it
    assert overlapped_us(Timing("estimate", float("inf"), Status.ERROR), 2.0, 1.0) == math.inf
    assert overlapped_us(Timing("estimate", 7.0), 2.0, 1.0) == 7.0  # a model that fills no terms keeps its time


def test_a_designs_factor_is_its_geomean_of_measured_over_priced_and_the_pricing_applies_it_to_its_designs_only():
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import DesignPricing, design_factors

    t = Timing("estimate", 5.0, compute_us=1.0, memory_us=1.0, latency_us=1.0, fetch_us=1.0)  # summed: 1 + 4
    samples = [("a", 2.5, t), ("a", 10.0, t), ("b", 5.0, t), ("b", float("nan"), t)]
    assert design_factors(samples, 1.0, 1.0) == pytest.approx({"a": 1.0, "b": 1.0})
    assert design_factors([("a", 20.0, t)], 1.0, 1.0) == pytest.approx({"a": 4.0})
    chained, staged = design_named("chained"), design_named("staged,tiles=4")
    pricing = DesignPricing("x", "", "", 1.0, ((chained.label, 0.5),))
    assert pricing.price(t, chained, 1.0) == pytest.approx(2.5)
    assert pricing.price(t, staged, 1.0) is None  # no factor: no price (the layer compares by the estimate)
    assert pricing.price(Timing("estimate", float("inf"), Status.ERROR), chained, 1.0) is None


def test_the_h100s_estimate_prices_designs_with_its_fitted_pricing_and_a_device_without_one_by_the_estimate():
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import DESIGN_PRICINGS, estimate_timer, overlapped_us

    timer = estimate_timer(H100)
    assert timer.pricing == DESIGN_PRICINGS["h100"]
    t = Timing("estimate", 9.0, compute_us=2.0, memory_us=3.0, latency_us=1.0, fetch_us=1.0)
    chained = design_named("chained")
    factor = dict(DESIGN_PRICINGS["h100"].factors)[chained.label]
    assert timer.design_price(t, chained) == pytest.approx(overlapped_us(t, timer.params.launch_us, 1.0) * factor)
    for plain in (estimate_timer(H100, calibrated=False), estimate_timer(device_named("a100"))):
        assert plain.pricing is None and plain.design_price(t, chained) is None
