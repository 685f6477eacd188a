"""train-ranker's training set: the search's own candidates, timed by the run's Timer."""

from __future__ import annotations

import numpy as np

from lospmm.flows.training import candidate_rows, candidate_time
from lospmm.stages.constrain import layer_candidates
from lospmm.stages.devices import device_named
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import FEATURES, SyntheticKernel
from lospmm.stages.reorder import tile_stats
from lospmm.stages.search import layer_tiles
from lospmm.stages.timing import EstimateTimer, LaunchUnderTest

H100 = device_named("h100")


def test_candidates_are_the_searchs_kept_ones_with_their_features():
    sk = SyntheticKernel(512, 256, 2048, 0.8, seed=5)
    rows = candidate_rows(sk, H100)
    a = random_pruned(sk.m, sk.k, sk.sparsity, np.random.default_rng(sk.seed))
    tiles = layer_tiles(a, (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128))
    kept = [c for c in layer_candidates(sk.n, {m: tile_stats(t) for m, t in tiles.items()}, H100) if c.kept]
    assert [(r["m1"], r["n1"]) for r in rows] == [(c.m1, c.n1) for c in kept] and rows
    assert all(set(FEATURES) <= set(r) and r["sparsity"] == 0.8 and r["k"] == 256 for r in rows)


def test_candidates_are_timed_as_full_kernels_by_the_timer():
    sk = SyntheticKernel(256, 256, 1024, 0.9, seed=1)
    rows = candidate_rows(sk, H100)
    timer = EstimateTimer(H100)
    time_of = candidate_time(timer)
    for r in rows[:5]:
        expected = timer.time(LaunchUnderTest(r["_tiles"], sk.m, sk.k, sk.n, r["n1"], r["pred_regs"])).time_us
        assert time_of(sk, r) == expected
    assert len({time_of(sk, r) for r in rows}) > 1  # the tile matters
