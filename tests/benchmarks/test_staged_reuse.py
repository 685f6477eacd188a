"""benchmarks.staged_reuse: B's L2 traffic saved by staging a group of tiles' columns once (host only)."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from benchmarks.staged_reuse import traffic_ratio
from lospmm.stages.reorder import identity_tiles


def test_a_group_reads_each_column_of_its_union_once_a_chunk():
    a = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=np.float32))
    tiles = identity_tiles(a, 1)  # a row a tile: columns {0, 1}, {1, 2}, {3}
    ratio, largest = traffic_ratio(a, tiles, group=2, chunk=256)
    assert math.isclose(ratio, 5 / 4) and largest == 3  # tiles 0+1 share column 1: 4 reads become 3, then {3}
    ratio, largest = traffic_ratio(a, tiles, group=2, chunk=2)
    assert math.isclose(ratio, 5 / 4) and largest == 2  # chunks of 2 rows of K: {0, 1} and {2}, then {3}
    assert traffic_ratio(a, tiles, group=1, chunk=256)[0] == 1.0  # alone, nothing is shared


def test_the_estimate_table_prices_the_staged_kernel_against_the_chained_one_on_each_gpu():
    from benchmarks.staged_reuse import binding_term, estimate_rows
    from lospmm.kernel.timing import Timing

    assert binding_term(Timing("estimate", 9.0, compute_us=1.0, memory_us=5.0, latency_us=2.0, fetch_us=4.0)) == "memory"
    rows = estimate_rows(groups=(8,), gpus=("h100",))
    assert len(rows) == 11 and all(math.isfinite(r["h100: ×8 / chained"]) and r["h100: ×8 / chained"] > 0
                                   for r in rows)
    # BERT's pooler is tiled at N1 = 32 already: staging its tiles' columns can only save there
    pooler = next(r for r in rows if r["layer"] == "pooler.dense")
    assert pooler["h100: ×8 / chained"] < 1
