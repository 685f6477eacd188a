"""The ways to serve a layer: the baked kernel of the searched tile, and the N:M kernel of an N:M A
in every blocking, each with its estimate."""

import numpy as np
import pytest

from lospmm.devices import DEVICES
from lospmm.kernel.choices import NM_DESIGN, served_options, untiled_served
from lospmm.kernel.design import BASELINE, design_named
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.nm import nm_tilings
from lospmm.stages.emit import cheapest_design
from lospmm.stages.prune import NMPattern, random_nm_pruned, random_pruned
from lospmm.stages.reorder import reordered_tiles

H100 = DEVICES["h100"]


def options(a, design=BASELINE, untiled=True):
    return served_options(a, reordered_tiles(a, 12), *a.shape, 4096, 128, design, H100, untiled)


def test_an_nm_layer_is_priced_both_ways_and_other_layers_one_way():
    a = random_nm_pruned(768, 768, NMPattern(16, 32, 8), np.random.default_rng(0))
    found = options(a)
    assert found[0].tiled and found[0].label == "12×128" and found[0].design == BASELINE
    assert [s.nm for s in found[1:]] == nm_tilings(16, 32, 8) and all(s.design == NM_DESIGN for s in found[1:])
    served, runner_up = cheapest_design(found)
    assert not served.tiled and served.estimate_us <= runner_up.estimate_us  # vector-wise 16:32 wins by the estimate
    assert len(options(a, untiled=False)) == 1  # --no-nm-kernel
    half = options(a, design_named("fp16,acc=f32"))  # a half run's N:M kernel sums as the run does
    assert [s.design.number for s in half[1:]] == [design_named("fp16,acc=f32").number] * (len(half) - 1) > []
    assert all(s.design.a_values == "nm" and s.design.half for s in half[1:])
    assert len(options(a, design_named("fp16,promote=8"))) == 1  # no promoted N:M kernel
    u = random_pruned(768, 768, 0.5, np.random.default_rng(0))
    assert len(options(u)) == 1  # unstructured: the baked kernel alone


def test_the_nm_design_forced_takes_its_cheapest_blocking_or_names_the_layer():
    a = random_nm_pruned(64, 256, NMPattern(4, 32, 16), np.random.default_rng(1))
    served = untiled_served(a, 4096, H100, NM_DESIGN, "fc")
    assert served.nm == min((s for s in options(a)[1:]), key=lambda s: s.estimate_us).nm
    u = random_pruned(64, 256, 0.875, np.random.default_rng(1))
    with pytest.raises(ValueError, match="fc: its A holds no N:M pattern"):
        untiled_served(u, 4096, H100, NM_DESIGN, "fc")
    with pytest.raises(ValueError, match="rendered on the search's tiles"):
        untiled_served(a, 4096, H100, BASELINE, "fc")


def test_design_auto_prices_the_tile_in_every_candidate_that_can_serve_it():
    from lospmm.kernel.choices import DESIGN_CANDIDATES

    a = random_pruned(768, 768, 0.9, np.random.default_rng(2))
    tiles = reordered_tiles(a, 8)
    found = served_options(a, tiles, 768, 768, 4096, 128, BASELINE, H100, designs=DESIGN_CANDIDATES)
    assert found[0].design == BASELINE and found[0].label == "8×128"  # the run's design first, its label the tile
    labels = {s.design.label for s in found}
    assert len(found) == len(DESIGN_CANDIDATES) == len(labels)  # each once (baseline is the run's)
    assert found[1].label == "8×128 " + found[1].design.label
    # each is priced against the others by the H100's fitted design pricing (its factor of the terms' sum)
    from lospmm.kernel.estimate import DESIGN_PRICINGS

    factors = dict(DESIGN_PRICINGS["h100"].factors)
    assert set(labels) <= set(factors)
    assert all(s.price_us is not None and s.design_price_us != s.estimate_us for s in found)
    a100 = served_options(a, tiles, 768, 768, 4096, 128, BASELINE, DEVICES["a100"], designs=DESIGN_CANDIDATES)
    assert all(s.design_price_us == s.estimate_us for s in a100)  # no pricing fitted there: the estimate
    # a convolution's implicit-im2col kernel takes the grid's order, the walks, the columns per thread and
    # baked or streamed values
    conv = served_options(a, tiles, 768, 768, 4096, 128, BASELINE, H100, designs=DESIGN_CANDIDATES, conv=True)
    assert all(s.design_price_us == s.estimate_us for s in conv)  # fitted on GEMM kernels: conv forms by the estimate
    assert [s.design.label for s in conv] == [design_named(d).label for d in (
        "baseline", "column-x", "walks=4", "walks=16", "v=2", "v=4", "v=4,walks=4", "streamed", "streamed,v=4")]
    # the streamed loop's lanes: each loads its own entry, each value from the data feeds V multiply-adds
    streamed = {s.design.label: s.estimate_us for s in conv if s.design.a_values == "streamed"}
    # (fewer instructions a pixel: priced below one pixel a thread on this 768×768 layer at 0.9, 111 against 195 µs)
    assert streamed[design_named("streamed,v=4").label] < 0.75 * streamed[design_named("streamed").label]
    # a lane loads its own pixel's input: V loads a column where the GEMM's V columns are one vector load
    gemm = {s.design.label: s.estimate_us for s in served_options(a, tiles, 768, 768, 4096, 128, BASELINE, H100,
                                                                  designs=("v=2", "v=4"))}
    priced = {s.design.label: s.estimate_us for s in conv}
    assert all(priced[label] > gemm[label] for label in (design_named("v=2").label, design_named("v=4").label))
    # a tile whose v=4 kernel needs more registers than the device has is not priced in it
    big = served_options(a, reordered_tiles(a, 64), 768, 768, 4096, 128, BASELINE, H100, designs=DESIGN_CANDIDATES)
    assert all(s.design.columns_per_thread < 4 for s in big)
    # a half run prices the half forms that exist (the baseline's grid, based or chained)
    half = served_options(a, tiles, 768, 768, 4096, 128, design_named("fp16"), H100, designs=DESIGN_CANDIDATES)
    assert {s.design.loads for s in half} == {"based", "chained"} and all(s.design.half for s in half)


def test_every_candidate_design_is_one_the_device_program_measures():
    from benchmarks.sets import AB_DESIGNS
    from lospmm.kernel.choices import DESIGN_CANDIDATES, PENDING_DESIGNS
    from lospmm.kernel.estimate import DESIGN_PRICINGS

    assert DESIGN_CANDIDATES + PENDING_DESIGNS == AB_DESIGNS
    # a design waits while no device has priced it; one with a factor is --design auto's
    priced = {label for pricing in DESIGN_PRICINGS.values() for label, _ in pricing.factors}
    assert not priced & {design_named(d).label for d in PENDING_DESIGNS}
    assert {design_named(d).label for d in DESIGN_CANDIDATES} <= priced


def test_a_streamed_run_serves_every_layer_in_its_design_and_a_convolution_in_its_conv_form():
    # the streamed kernels fuse a bias and an activation (the bias as data beside the rows), so a streamed
    # run serves a layer with one in its own design, as every other; a convolution by the streamed conv kernel
    a = random_pruned(256, 256, 0.9, np.random.default_rng(4))
    tiles = reordered_tiles(a, 8)
    streamed = design_named("streamed,chained")
    # a label names every design but the baseline: a tile alone is the baseline whatever the run's design
    # (a chained run's convolution, served by the baseline conv kernel, had read as chained)
    assert [(s.label, s.design) for s in served_options(a, tiles, 256, 256, 4096, 128, streamed, H100)] == [
        (f"8×128 {streamed.label}", streamed)]
    conv = served_options(a, tiles, 256, 256, 4096, 128, streamed, H100, designs=("baseline", "chained"), conv=True)
    assert [(s.label, s.design) for s in conv] == [(f"8×128 {design_named('streamed').label}", design_named("streamed")),
                                                   ("8×128", BASELINE)]  # baseline's and chained's conv form


def test_a_streamed_convolution_at_one_walk_is_priced_and_refused_at_its_own_registers():
    # it keeps its pixel's window across its loop: 8 registers above the GEMM's (64 -> 72 at M1 = 32), so
    # 1024 threads ask 73,728 a block where the SM has 65,536 (ptxas gave it 68, a launch that fails)
    from lospmm.kernel.choices import design_problem
    from lospmm.kernel.registers import predicted_registers

    streamed = design_named("streamed")
    assert predicted_registers(32, design=streamed, conv=True) == predicted_registers(32, design=streamed) + 8
    assert design_problem(streamed, 32, 1024, 4096, H100) == ""
    assert "72 registers predicted × 1024 threads" in design_problem(streamed, 32, 1024, 4096, H100, conv=True)
    looped = design_named("streamed,walks=4")  # its loop's registers cover the window
    assert predicted_registers(32, design=looped, conv=True) == predicted_registers(32, design=looped)


def test_a_design_whose_block_needs_more_registers_than_the_sm_has_cannot_serve_the_tile():
    # on the H200 5 A/B kernels failed at launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): BERT's FFN tile
    # (M1 = 48, N1 = 512) is fine in the baseline, but v=2 and v=4 ask more registers than a block may hold
    from lospmm.kernel.choices import design_problem
    from lospmm.kernel.design import BASELINE, design_named

    h100 = DEVICES["h100"]
    assert design_problem(BASELINE, 48, 512, 4096, h100) == ""
    # v=2: 174 registers a thread (the device's kernel had 174), allocated per warp in 256s: 90112; v=4: over 255
    assert "174 registers predicted × 512 threads: the launch checks 90112 a block, over 65536" in design_problem(
        design_named("chained,v=2"), 48, 512, 4096, h100)
    assert "over 255" in design_problem(design_named("chained,v=4"), 48, 512, 4096, h100)
    assert design_problem(design_named("chained,v=2"), 48, 128, 4096, h100) == ""  # fewer threads: it fits


def test_a_convolutions_nm_kernel_is_priced_beside_its_baked_conv_kernel():
    """An N:M convolution in an fp32 run: its implicit-im2col kernels are the baked conv kernel of the
    tile and the N:M conv kernel in every blocking (before, an implicit-conv layer had no N:M kernel);
    each priced as a convolution's (the N:M one above its GEMM form: it gathers)."""
    a = random_nm_pruned(256, 576, NMPattern(8, 32, 8), np.random.default_rng(3))
    tiles = reordered_tiles(a, 8)
    conv = served_options(a, tiles, 256, 576, 12544, 128, BASELINE, H100, conv=True)
    assert conv[0].tiled and [s.nm for s in conv[1:]] == nm_tilings(8, 32, 8)
    assert all(s.design == NM_DESIGN and s.design.conv_kernel == NM_DESIGN for s in conv[1:])
    gemm = served_options(a, tiles, 256, 576, 12544, 128, BASELINE, H100)
    assert all(c.estimate_us >= g.estimate_us for c, g in zip(conv[1:], gemm[1:]))
    assert any(c.estimate_us > g.estimate_us for c, g in zip(conv[1:], gemm[1:]))
    assert len(served_options(a, tiles, 256, 576, 12544, 128, BASELINE, H100, untiled=False, conv=True)) == 1
    forced = untiled_served(a, 12544, H100, NM_DESIGN, "conv", conv=True)
    assert forced.nm == min(conv[1:], key=lambda s: s.estimate_us).nm
    with pytest.raises(ValueError, match="conv: design fp16,acc=mma,nm.* has no implicit-im2col form"):
        untiled_served(a, 12544, H100, design_named("nm,fp16,acc=mma"), "conv", conv=True)


def test_a_half_convolution_is_served_by_the_tiled_or_nm_conv_kernel_or_an_im2col_gemm():
    """A convolution in a half run: the tiled half kernel in its implicit-im2col form (its pair two output
    pixels, each lane's input its own load: priced above its GEMM), the N:M kernel on CUDA cores in its
    conv form in the run's number format (priced with its gathers), and the sparse tensor cores' kernel as
    the im2col GEMM's; each option's form is its design's (stages.emit.served_form)."""
    from lospmm.kernel.design import design_in
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix
    from lospmm.kernel.sparse_mma import MMATiling
    from lospmm.stages.emit import served_form

    run = design_named("fp16")
    for pattern, tensor_cores in ((NMPattern(8, 32, 8), False), (NMPattern(2, 4, 1), True)):
        a = rounded_matrix(random_nm_pruned(256, 576, pattern, np.random.default_rng(3)), "fp16")[0]
        tiles = reordered_tiles(a, 8)
        conv = served_options(a, tiles, 256, 576, 12544, 128, run, H100, conv=True)
        gemm = served_options(a, tiles, 256, 576, 12544, 128, run, H100)
        assert conv[0].design == run == run.conv_kernel and served_form(conv[0].design, True) == "implicit-conv"
        assert conv[0].estimate_us > gemm[0].estimate_us  # two 16-bit loads a column where the GEMM has one
        on_cuda_cores = [s for s in conv[1:] if not isinstance(s.nm, MMATiling)]
        packed = design_in(NumberFormat.half("fp16", "packed"), NM_DESIGN)
        assert on_cuda_cores and all(s.design == packed and served_form(s.design, True) == "implicit-conv"
                                     for s in on_cuda_cores)
        # priced as a convolution's (its gathers): never below the same blocking's GEMM, above it where the
        # loop's issue bounds it (2:4 on CUDA cores is bound by B's traffic in most blockings)
        as_gemm = {s.nm: s.estimate_us for s in gemm[1:]}
        assert all(s.estimate_us >= as_gemm[s.nm] for s in on_cuda_cores)
        assert any(s.estimate_us > as_gemm[s.nm] for s in on_cuda_cores)
        on_tensor_cores = [s for s in conv[1:] if isinstance(s.nm, MMATiling)]
        assert bool(on_tensor_cores) == tensor_cores
        # an im2col GEMM beside kernels that read X: priced with the unfolding (two launches, B's traffic)
        unfold = estimate_timer(H100).unfold_us(576, 12544, 2)
        assert unfold > 2 * estimate_timer(H100).params.launch_us
        assert all(served_form(s.design, True) == "gemm" and s.estimate_us == pytest.approx(as_gemm[s.nm] + unfold)
                   for s in on_tensor_cores)
        forced = untiled_served(a, 12544, H100, packed, "conv", conv=True)
        assert forced.nm == min(on_cuda_cores, key=lambda s: s.estimate_us).nm


def test_a_forced_half_nm_design_takes_its_own_kernels_not_the_tensor_core_ones():
    """`lospmm kernel --design nm --dtype fp16` (packed sums) takes a CUDA-core blocking even where the
    tensor-core kernel is priced lower (it was once handed an mma.sp blocking its renderer refuses); with
    --accumulate mma, the tensor-core one."""
    from lospmm.kernel.design import design_in
    from lospmm.kernel.numbers import NumberFormat
    from lospmm.kernel.sparse_mma import MMATiling

    a = random_nm_pruned(512, 512, NMPattern(2, 4, 1), np.random.default_rng(0))
    packed = design_in(NumberFormat.half("fp16", "packed"), NM_DESIGN)
    half_run = served_options(a, reordered_tiles(a, 4), 512, 512, 4096, 128, design_named("fp16"), H100)
    assert isinstance(min(half_run[1:], key=lambda s: s.estimate_us).nm, MMATiling)
    served = untiled_served(a, 4096, H100, packed, "fc")
    assert served.design == packed and not isinstance(served.nm, MMATiling)
    mma = design_in(NumberFormat.half("fp16", "mma"), NM_DESIGN)
    assert isinstance(untiled_served(a, 4096, H100, mma, "fc").nm, MMATiling)
