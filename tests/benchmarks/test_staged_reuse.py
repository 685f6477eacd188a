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
