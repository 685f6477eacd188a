"""The estimate's prefetch term against the H200's measured same-tile pairs (benchmarks/prefetch_fit.py)."""

import pyarrow.parquet as pq

from benchmarks import prefetch_fit
from lospmm.devices import DEVICES
from lospmm.kernel.estimate import EstimateParams, estimate_timer, load_wait


def test_depth_one_waits_as_before_and_exponent_one_is_the_old_model():
    assert load_wait(234.0, 1) == 117.0  # the flow's depth: unchanged whatever the exponent
    old = EstimateParams(prefetch_exponent=1.0)
    assert abs(load_wait(234.0, 4, old) - 234.0 / 5) < 1e-9 and abs(load_wait(234.0, 0, old) - 234.0) < 1e-9
    assert load_wait(234.0, 8) > load_wait(234.0, 8, old)  # deeper prefetch saves less than 1/(1 + P)


def test_the_shipped_exponent_is_the_one_the_committed_pairs_fit():
    rows = pq.read_table(prefetch_fit.RESULTS / "kernel-speed-prefetch-tiles.parquet").to_pylist()
    pairs = prefetch_fit.same_tile_pairs(rows)
    assert len(pairs) == 16 and {d["prefetch"] for d, _ in pairs} == {4, 8}
    timer = estimate_timer(DEVICES["h100"])
    shipped = EstimateParams().prefetch_exponent
    assert prefetch_fit.fitted_exponent(pairs, timer) == shipped
    assert prefetch_fit.log_error(pairs, timer, shipped) < prefetch_fit.log_error(pairs, timer, 1.0) / 10
