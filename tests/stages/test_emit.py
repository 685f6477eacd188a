"""Stage 10, emit: the choice among timed proxies, the check column, the speedup rule, the kernel's form."""

from __future__ import annotations

import math

import pytest

from lospmm.kernel.check import CheckResult
from lospmm.kernel.design import design_named
from lospmm.stages.emit import EmitParams, check_column, chosen_by, emit_params, fastest_proxy, host_check_columns, speedup
from lospmm.stages.rank import RankParams


def _row(m1, n1, t, status="ok"):
    return {"m1": m1, "n1": n1, "time_us": t, "status": status}

def test_fastest_proxy_skips_failures_and_breaks_ties_by_a_stated_rule_not_by_noise():
    rows = [_row(8, 128, 5.0), _row(4, 256, 5.0), _row(2, 64, 1.0, "error"), _row(1, 32, math.inf),
            _row(16, 32, 7.0)]
    assert (fastest_proxy(rows)["m1"], fastest_proxy(rows)["n1"]) == (8, 128)  # an exact tie: the larger M1
    assert fastest_proxy([_row(8, 32, 2.0), _row(8, 64, 1.5)])["n1"] == 64
    assert fastest_proxy([_row(2, 64, 1.0, "error"), _row(1, 32, math.nan)]) is None
    assert fastest_proxy([]) is None
    # within the noise band: fewer spills first, then the larger M1, fewer registers, the time
    noisy = [{**_row(2, 64, 6.0), "registers": 40}, {**_row(4, 64, 6.2), "registers": 56},
             {**_row(4, 128, 6.25), "registers": 48}, {**_row(8, 32, 6.8), "registers": 30}]
    assert fastest_proxy(noisy)["m1"] == 2  # no band: the fastest time
    assert (fastest_proxy(noisy, 0.05)["m1"], fastest_proxy(noisy, 0.05)["n1"]) == (4, 128)  # 8 is 13% slower
    spilled = [{**noisy[0], "spill_bytes": 0}, {**noisy[2], "spill_bytes": 24}]
    assert fastest_proxy(spilled, 0.05)["m1"] == 2

def test_a_speedup_is_only_a_ratio_of_two_measurements():
    assert speedup(10.0, 4.0, measured=True) == 2.5
    assert math.isnan(speedup(10.0, 4.0, measured=False))
    assert math.isnan(speedup(math.nan, 4.0, measured=True))
    assert math.isnan(speedup(10.0, 0.0, measured=True))

def test_the_check_column_says_where_a_kernel_was_checked_and_whether_it_passed():
    good = CheckResult(3e-7, 1e-4, "max_rel_error", 67)
    bad = CheckResult(2e-4, 1e-4, "max_rel_error", 67, "wrong", "max rel error 2e-4 exceeds 1e-4")
    assert check_column("host", good) == (3e-7, "host-asan") and check_column("device", good) == (3e-7, "device")
    assert check_column("host", bad) == (2e-4, "host: FAILED") and check_column("device", bad)[1] == "device: FAILED"
    error, label = check_column("device", None)
    assert math.isnan(error) and label == "not run"
    # a record read back from kernel.json is the same verdict; one that could not run is a failure
    assert CheckResult.of_facts(good.facts()) == good and not CheckResult.of_facts({"status": "error", "message": "x"}).ok

def test_chosen_by_follows_the_rank_parameters():
    assert chosen_by(RankParams(top_k=7)) == "top-1 proxy of the ranker's top-7"
    assert chosen_by(RankParams(use_rank=False)) == "top-1 proxy of every kept candidate"
    assert emit_params(RankParams(top_k=3)).chosen_by == chosen_by(RankParams(top_k=3))

def test_host_check_covers_a_partial_column_block():
    for n1 in (32, 128, 1024):
        n = host_check_columns(n1)
        assert n > 2 * n1 and n % n1 != 0

def test_a_dense_convolution_with_its_geometry_gets_an_implicit_conv_kernel():
    from lospmm.stages.emit import kernel_form

    conv = {"op": "conv", "groups": 1, "h_in": 56}
    assert kernel_form(conv) == "implicit-conv"
    assert kernel_form(conv, EmitParams(implicit_conv=False)) == "gemm"  # --im2col
    assert kernel_form({**conv, "groups": 32}) == "implicit-conv"  # grouped: its block-diagonal dense form
    assert kernel_form({**conv, "h_in": 0}) == "gemm"  # no geometry (a plain checkpoint)
    assert kernel_form({"op": "linear", "groups": 0, "h_in": 0}) == "gemm"
    # the one design with no conv kernel and no N:M kernel on CUDA cores in its number format (the sparse
    # tensor cores'): the im2col GEMM the search searched; a baked or streamed one (chained, vector columns,
    # a half pair, a promoted half sum too) serves it by its conv form (the grid's order, the walks, baked or
    # streamed values), a staged one by its blocking, the N:M kernel (fp32 or half) by its own
    assert kernel_form(conv, design=design_named("nm,fp16,acc=mma")) == "gemm"
    assert kernel_form(conv, EmitParams(nm_kernel=False), design_named("fp16")) == "implicit-conv"
    for design in ("column-x", "chained", "chained,v=4,walks=4", "streamed,chained", "streamed,v=4,walks=4",
                   "staged,tiles=4,warps=2", "nm", "nm,fp16", "nm,bf16,acc=f32", "fp16", "bf16,chained",
                   "fp16,promote=4"):
        assert kernel_form(conv, design=design_named(design)) == "implicit-conv"
    assert emit_params(RankParams(), implicit_conv=False).implicit_conv is False


def test_cheapest_design_keeps_the_lowest_finite_estimate_and_names_the_runner_up():
    from lospmm.kernel.choices import NM_DESIGN, Served
    from lospmm.kernel.design import BASELINE
    from lospmm.stages.emit import cheapest_design

    baked, nm, broken = Served("12×128", 10.0, BASELINE), Served("nm", 8.0, NM_DESIGN), Served("x", float("inf"), BASELINE)
    assert cheapest_design([baked, nm, broken]) == (nm, baked)
    assert cheapest_design([broken, baked]) == (baked, broken)
    tie = Served("tie", 10.0, NM_DESIGN)
    assert cheapest_design([baked, tie]) == (baked, tie)  # the first wins a tie
    assert cheapest_design([baked]) == (baked, None)
    with pytest.raises(ValueError):
        cheapest_design([])


def test_a_designs_tiles_rank_by_the_estimate_and_the_designs_by_their_best_tiles_design_price():
    from lospmm.kernel.choices import NM_DESIGN, Served
    from lospmm.kernel.design import design_named
    from lospmm.stages.emit import cheapest_design, measured_contenders, ranked_designs

    baseline, chained, walks = design_named("baseline"), design_named("chained"), design_named("chained,walks=4")
    # the estimate prices both designs alike; the design price (fitted on measured designs) says chained
    base_a = Served("8×128", 10.0, baseline, m1=8, n1=128, price_us=12.0)
    base_b = Served("16×128", 11.0, baseline, m1=16, n1=128, price_us=9.0)  # a worse tile by the estimate
    chain_a = Served("8×128 chained", 10.0, chained, m1=8, n1=128, price_us=10.0)
    chain_b = Served("4×128 chained", 9.0, chained, m1=4, n1=128, price_us=20.0)
    nm = Served("nm 2:4", 15.0, NM_DESIGN, nm=object())  # untiled: no design price, merged by its estimate
    # chained's best tile by the estimate is 4×128 (9 µs), priced 20: baseline's best (8×128, 10 µs) is
    # priced 12, so baseline's designs lead; the N:M kernel (15 µs) goes after every tiled one estimated under it
    assert ranked_designs([base_a, base_b, chain_a, chain_b, nm]) == [base_a, chain_b, base_b, chain_a, nm]
    assert cheapest_design([base_a, chain_a]) == (chain_a, base_a)  # alike by the estimate, chained by price
    # the N:M kernel first exactly where it was before the design price: under every tiled kernel's estimate
    cheap_nm = Served("nm 4:32", 8.5, NM_DESIGN, nm=object())
    assert ranked_designs([base_a, chain_a, cheap_nm]) == [cheap_nm, chain_a, base_a]
    walked = Served("8×128 chained,walks=4", 10.5, walks, m1=8, n1=128, price_us=9.5)
    mid_nm = Served("nm 2:4", 11.0, NM_DESIGN, nm=object())
    # the price picks walks=4 (9.5), but the lowest tiled estimate (10, baseline's) is under the N:M kernel's 11
    assert cheapest_design([base_a, Served("x", 12.0, chained, m1=8, n1=128, price_us=9.9), walked, mid_nm])[0] == walked
    # the contenders a measuring timer times: tiled ones within a factor of the cheapest price, N:M by estimate
    assert [p.label for p in measured_contenders([base_a, chain_a, walked, mid_nm], 4, 1.15)] == \
        ["8×128 chained,walks=4", "8×128 chained", "nm 2:4"]  # baseline's 12 is over 1.15 × 9.5
    # a design without a price (a factor not fitted) puts every design of the layer on the estimate
    unpriced = Served("8×128 staged", 9.9, design_named("staged,tiles=4"), m1=8, n1=128)
    assert cheapest_design([base_a, chain_a, unpriced])[0] == unpriced
    assert cheapest_design([base_a, chain_a, Served("y", 10.1, walks, m1=8, n1=128)])[0] == base_a
    plain = [Served("a", 10.0, baseline), Served("b", 10.0, chained)]  # no price: the estimate, ties keep the earlier
    assert cheapest_design(plain) == (plain[0], plain[1])


def test_the_contenders_a_measuring_timer_times_are_the_estimates_cheapest_few_within_a_factor():
    from types import SimpleNamespace as Priced

    from lospmm.stages.emit import measured_contenders

    prices = [Priced(label=label, estimate_us=us) for label, us in
              (("run's", 10.0), ("a", 6.0), ("b", 8.0), ("c", float("inf")), ("d", 9.5), ("e", 6.0))]
    assert [p.label for p in measured_contenders(prices, 3, 1.5)] == ["a", "e", "b"]  # ties keep the earlier
    assert [p.label for p in measured_contenders(prices, 9, 1.5)] == ["a", "e", "b"]  # 9.5 is over 1.5 × 6
    assert [p.label for p in measured_contenders(prices, 9, 2.0)] == ["a", "e", "b", "d", "run's"]
    assert [p.label for p in measured_contenders(prices, 1, 2.0)] == ["a"]
    assert [p.label for p in measured_contenders([Priced(label="x", estimate_us=float("nan"))], 3, 1.5)] == ["x"]
    with pytest.raises(ValueError, match="no design priced"):
        measured_contenders([], 3, 1.5)


def test_the_fastest_measured_ties_within_the_band_go_to_the_lower_estimate():
    from lospmm.stages.emit import fastest_measured

    assert fastest_measured([10.0, 9.0, 12.0]) == 1
    assert fastest_measured([10.0, 9.8, 12.0], tie_band=0.05) == 0  # 2% apart: noise, the estimate's order stands
    assert fastest_measured([10.0, 9.0, 12.0], tie_band=0.05) == 1
    assert fastest_measured([None, float("inf"), 3.0]) == 2  # failed and unmeasured never win
    assert fastest_measured([None, float("nan")]) is None
