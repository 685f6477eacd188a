import pytest
from hypothesis import given, settings, strategies as st

from lospmm.stages.constrain import (
    REMOVED_BY, ConstrainParams, constrained_candidates, layer_candidates, overshoot, n1_choices, predicted_registers,
    reduction_counts,
)
from lospmm.devices import DEVICES, device_named
from lospmm.stages.reorder import TileStats

H100 = device_named("h100")


def _stats(num_tiles=64, cov=0.0):
    return TileStats(num_tiles=num_tiles, max_nnc=10, mean_nnc=8.0, nnc_sum=8 * num_tiles, max_nnz=20, cov_nnz=cov)


def _one(cands, m1, n1):
    return next(c for c in cands if (c.m1, c.n1) == (m1, n1))


def test_n1_is_every_warp_multiple_up_to_the_block_limit():
    assert n1_choices(H100) == list(range(32, 1025, 32))


def test_register_prediction_matches_the_calibration():
    assert [predicted_registers(m1) for m1 in (2, 4, 8, 16, 32)] == [32, 32, 32, 40, 64]
    assert predicted_registers(128) == 128 + 64 + 16


def test_register_constraint_removes_tall_tiles_and_big_blocks():
    cands = constrained_candidates(4096, {192: _stats(), 128: _stats(), 8: _stats()}, H100)
    assert predicted_registers(192) > 255
    assert all(c.removed_by == "register" for c in cands if c.m1 == 192)
    # 208 registers: 208·32 = 6656 per warp; 9 warps would occupy 59904 of the 64K, but the launch
    # check rounds them to 12 (79872: the register file's 4 sub-partitions), so 8 warps is the most
    assert _one(cands, 128, 256).removed_by != "register"
    assert _one(cands, 128, 288).removed_by == "register"
    assert all(c.removed_by != "register" for c in cands if c.m1 == 8)


def test_utilisation_constraint_is_eq1_against_half_the_sms():
    cands = constrained_candidates(1024, {4: _stats(num_tiles=4)}, H100)
    # 4 A_tiles × ceil(1024/N1) blocks; H100 has 132 SMs, so at least 66 blocks are needed.
    assert _one(cands, 4, 32).block_num == 128 and _one(cands, 4, 32).removed_by is None
    assert _one(cands, 4, 64).block_num == 64 and _one(cands, 4, 64).removed_by == "utilisation"


def test_load_balance_removes_column_waste_and_row_imbalance():
    cands = constrained_candidates(100, {1: _stats(num_tiles=200)}, H100)
    assert _one(cands, 1, 32).waste_col == pytest.approx(28 / 128) and _one(cands, 1, 32).kept
    assert _one(cands, 1, 96).waste_col == pytest.approx(92 / 192) and _one(cands, 1, 96).removed_by == "load_balance"
    skewed = constrained_candidates(4096, {1: _stats(num_tiles=200, cov=0.3)}, H100)
    assert all(c.removed_by in ("load_balance", "register") for c in skewed)
    relaxed = constrained_candidates(4096, {1: _stats(num_tiles=200, cov=0.3)}, H100, ConstrainParams(th_row=0.5))
    assert any(c.kept for c in relaxed)


def test_empty_layer_removes_everything_as_empty():
    cands = constrained_candidates(4096, {1: _stats(num_tiles=0)}, H100)
    assert cands and all(c.removed_by == "empty" for c in cands)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60000), tiles=st.integers(0, 3000), cov=st.floats(0, 1), gpu=st.sampled_from(sorted(DEVICES)),
       m1s=st.lists(st.integers(1, 300), min_size=1, max_size=6, unique=True))
def test_every_candidate_is_kept_or_names_its_first_failing_constraint(n, tiles, cov, gpu, m1s):
    dev = DEVICES[gpu]
    cands = constrained_candidates(n, {m1: _stats(tiles, cov) for m1 in m1s}, dev)
    assert len(cands) == len(m1s) * len(n1_choices(dev))
    for c in cands:
        assert c.removed_by is None or c.removed_by in REMOVED_BY
        warps = -(-c.threads // 32)
        launch_checked = -(-warps // 4) * 4 * (c.block_regs // warps)  # warps rounded to 4 sub-partitions
        reg_fail = (c.pred_regs > dev.max_regs_per_thread or c.block_regs > dev.regs_per_sm
                    or launch_checked > dev.max_regs_per_block)
        util_fail = c.block_num < dev.sms / 2
        lb_fail = c.cov_row > 0.25 or c.waste_col > 0.25
        expected = ("empty" if tiles == 0 else "register" if reg_fail else "utilisation" if util_fail
                    else "load_balance" if lb_fail else None)
        assert c.removed_by == expected
    counts = reduction_counts(cands)
    steps = [counts[k] for k in ("total", "after_empty", "after_register", "after_utilisation", "after_load_balance")]
    assert steps == sorted(steps, reverse=True) and steps[-1] == sum(c.removed_by is None for c in cands)
    # a fallback only where nothing passed, only from utilisation / load-balance failures, at most 10
    fallback = [c for c in cands if c.fallback]
    assert counts["fallback"] == len(fallback) <= 10
    assert not fallback or (steps[-1] == 0 and {c.removed_by for c in fallback} <= {"utilisation", "load_balance"})
    assert sum(c.kept for c in cands) == steps[-1] + len(fallback)


def test_unknown_gpu_lists_the_table():
    with pytest.raises(ValueError, match="h100"):
        device_named("rtx9090")
    assert device_named("RTX 2080Ti").arch == "sm_75"


def test_an_all_zero_layer_stands_as_empty_candidates():
    cands = layer_candidates(4096, {8: _stats()}, H100, empty=True)
    assert cands and {c.removed_by for c in cands} == {"empty"} and {c.m1 for c in cands} == {1}
    assert not any(c.removed_by == "empty" for c in layer_candidates(4096, {8: _stats()}, H100))


def test_a_layer_below_every_n1_keeps_its_least_bad_candidates_as_a_fallback():
    # a CNN classifier at batch 4: N = 4 leaves 28 of 32 threads idle at the smallest N1
    stats = {m1: _stats(num_tiles=1000 // m1, cov=0.1) for m1 in (1, 4, 16, 64)}
    cands = constrained_candidates(4, stats, H100)
    fallback = [c for c in cands if c.fallback]
    assert not any(c.removed_by is None for c in cands) and len(fallback) == 10
    assert all(c.kept and c.removed_by in ("utilisation", "load_balance") for c in fallback)
    assert {c.n1 for c in fallback} >= {32}  # the least column waste
    worst_kept = max(overshoot(c, H100) for c in fallback)
    assert all(overshoot(c, H100) >= worst_kept for c in cands
               if not c.fallback and c.removed_by in ("utilisation", "load_balance"))
    assert not any(c.fallback for c in constrained_candidates(4, stats, H100, ConstrainParams(fallback_keep=0)))
    # a layer that passes keeps no fallback; an empty one (or one only registers remove) gets none
    assert not any(c.fallback for c in constrained_candidates(4096, {8: _stats()}, H100))
    assert not any(c.fallback for c in layer_candidates(4, {8: _stats()}, H100, empty=True))
    assert not any(c.kept for c in constrained_candidates(4, {256: _stats(num_tiles=4)}, H100))


def test_the_constraints_follow_the_kernel_design():
    """A block of N1 threads covers N1·V columns and walks W column blocks: fewer blocks, column
    waste on N1·V wide B tiles, and the design's registers (V-wide accumulators, the loop's)."""
    import numpy as np

    from lospmm.kernel.design import design_named
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles, tile_stats

    a = random_pruned(256, 256, 0.9, np.random.default_rng(0))
    stats = {8: tile_stats(reordered_tiles(a, 8))}
    base = {(c.m1, c.n1): c for c in constrained_candidates(1000, stats, H100)}
    wide = {(c.m1, c.n1): c for c in constrained_candidates(1000, stats, H100, design=design_named("v=4,walks=2"))}
    b, w = base[(8, 128)], wide[(8, 128)]
    assert b.num_b_tiles == 8 and w.num_b_tiles == 2  # ceil(1000 / 128) vs ceil(1000 / 512)
    assert w.block_num == b.num_a_tiles * 1  # two column blocks walked by one block
    assert w.waste_col == pytest.approx((2 * 512 - 1000) / 1024)
    assert w.pred_regs == predicted_registers(8, design=design_named("v=4,walks=2")) > b.pred_regs
    assert predicted_registers(8, design=design_named("walks=2")) > predicted_registers(8) >= 32


def test_the_design_is_a_search_dimension_each_with_its_own_constraints():
    from lospmm.kernel.design import BASELINE, design_named

    wide, streamed = design_named("chained,v=4,walks=4"), design_named("streamed,chained")
    stats = {8: _stats(num_tiles=200), 64: _stats(num_tiles=200)}
    both = layer_candidates(1000, stats, H100, designs=(BASELINE, wide, streamed))
    assert len(both) == 3 * len(layer_candidates(1000, stats, H100))
    for design in (BASELINE, wide, streamed):
        alone = layer_candidates(1000, stats, H100, design=design)
        # each design's candidates are what constraining it alone gives, naming it
        assert [c for c in both if c.design == design.label] == alone
        assert {c.design for c in alone} == {design.label}
    base, four = (_one([c for c in both if c.design == d.label], 8, 64) for d in (BASELINE, wide))
    # four columns a thread and four walks: B tiles 4× wider, blocks 16× fewer
    assert four.num_b_tiles == -(-1000 // 256) and base.num_b_tiles == -(-1000 // 64)
    assert four.pred_regs > base.pred_regs


def test_a_fallback_is_kept_only_when_no_design_has_a_candidate():
    from lospmm.kernel.design import BASELINE, design_named

    wide = design_named("chained,v=4")
    stats = {8: _stats(num_tiles=4)}
    # N = 4: nothing passes in any design, so the least-bad of all designs are kept
    both = layer_candidates(4, stats, H100, designs=(BASELINE, wide))
    assert 0 < sum(c.fallback for c in both) <= ConstrainParams().fallback_keep
    # at N = 4096 the baseline has candidates: the other design's failures stay removed
    assert not any(c.fallback for c in layer_candidates(4096, {8: _stats()}, H100, designs=(BASELINE, wide)))


def test_a_convolution_searches_the_designs_its_conv_kernel_has():
    from lospmm.kernel.choices import DESIGN_CANDIDATES
    from lospmm.kernel.design import design_named
    from lospmm.stages.constrain import searched_designs

    designs = tuple(design_named(d) for d in DESIGN_CANDIDATES)
    conv = searched_designs(designs, "conv")
    assert conv and all(d.serves_conv for d in conv) and len(set(conv)) == len(conv)
    assert {(d.order, d.column_walks, d.a_values) for d in conv} == {
        ("tile-x", 1, "baked"), ("tile-x", 4, "baked"), ("tile-x", 16, "baked"), ("column-x", 1, "baked"),
        ("tile-x", 1, "streamed")}
    # an im2col GEMM and a linear layer: as given
    assert searched_designs(designs, "conv", implicit_conv=False) == designs
    assert searched_designs(designs, "linear") == designs
    # one design (the default chained): its conv kernel, the grid's order and walks (a streamed one's
    # streamed, a half one's pair in its number format); the one design without one (the sparse tensor
    # cores' N:M kernel) leaves the convolution an im2col GEMM in it
    assert searched_designs((design_named("chained,walks=4"),), "conv") == (design_named("walks=4"),)
    streamed, half = design_named("streamed,chained,v=4"), design_named("fp16,chained")
    assert searched_designs((streamed,), "conv") == (design_named("streamed,v=4"),)
    staged = design_named("staged,tiles=4,warps=2")  # its conv kernel is its own: the copy gathers the windows
    assert searched_designs((staged,), "conv") == (staged,)
    assert searched_designs((half,), "conv") == (design_named("fp16"),)
    mma = design_named("nm,fp16,acc=mma")
    assert searched_designs((mma,), "conv") == (mma,)


def test_a_staged_design_is_tiled_at_n1_32_in_blocks_of_its_tiles():
    # a staged block's warps each walk one tile over the same warp's 32 columns: N1 is 32, a block is
    # 32 threads a tile, and blocks along A are the tiles over tiles_per_block (the proxy's launch too)
    from lospmm.kernel.design import design_named
    from lospmm.stages.pad import proxy_launch

    h100 = H100
    stats = {4: TileStats(100, 50, 40.0, 4000, 30, 0.1)}
    staged = design_named("staged,tiles=8")
    cands = constrained_candidates(4096, stats, h100, design=staged)
    assert [(c.n1, c.threads, c.num_b_tiles, c.block_num) for c in cands] == [(32, 256, 128, 13 * 128)]
    assert cands[0].block_regs == 8 * (cands[0].pred_regs * 32)
    launch = proxy_launch(100, 4096, 4, 32, cands[0].pred_regs, h100, staged)
    assert (launch.grid_x, launch.grid_y, launch.block) == (13, 128, 256)
    # four warps a tile: N1 = 128, a block of 4 tiles is 512 threads over 128 columns
    wide = design_named("staged,tiles=4,warps=4")
    (c,) = constrained_candidates(4096, stats, h100, design=wide)
    assert (c.n1, c.threads, c.num_b_tiles, c.block_num) == (128, 512, 32, 25 * 32)


def test_a_streamed_convolutions_candidates_carry_its_windows_registers():
    # served by the streamed conv kernel at one walk, a layer's candidates are constrained at its registers
    # (8 above the GEMM's): the search never keeps a block the SM cannot hold (32 × 1024 threads at M1 = 32)
    from lospmm.kernel.design import design_named

    stats = {32: TileStats(64, 300, 250.0, 16000, 900, 0.1)}
    streamed = design_named("streamed")
    gemm = {c.n1: c for c in layer_candidates(4096, stats, H100, design=streamed)}
    conv = {c.n1: c for c in layer_candidates(4096, stats, H100, design=streamed, conv=True)}
    assert conv[1024].pred_regs == gemm[1024].pred_regs + 8
    assert conv[1024].removed_by == "register" and gemm[1024].removed_by != "register"


def test_a_staged_launch_past_the_grids_y_limit_says_what_a_staged_design_can_change():
    from lospmm.kernel.layout import LaunchLayout

    layout = LaunchLayout(4, 256, 1, 1, "tile-x", 8)  # 8 tiles of 32 columns a block
    with pytest.raises(ValueError, match="a staged or sliced block walks once: more warps a tile"):
        layout.grid(32 * 70000)
