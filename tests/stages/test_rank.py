"""Rank stage: Table 1 features, graded relevance, NDCG, and a ranker that learns a known order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lospmm.flows.storage.ranker_store import load_ranker, save_ranker
from lospmm.stages.rank import (FEATURES, RankerParams, feature_matrix, ndcg_at, ranked, relevance,
                                synthetic_kernels, trained_ranker)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.1, 1e4), min_size=1, max_size=40))
def test_relevance_is_monotone_and_best_gets_top_grade(times):
    t = np.array(times)
    g = relevance(t)
    assert g[np.argmin(t)] == 7
    order = np.argsort(t)
    assert np.all(np.diff(g[order]) <= 0)  # slower never grades higher


def test_failed_launches_grade_zero():
    assert relevance(np.array([1.0, np.inf, 2.0])).tolist()[1] == 0
    assert relevance(np.array([np.inf, np.inf])).tolist() == [0, 0]


def test_ndcg_perfect_and_reversed():
    labels = np.array([7, 5, 3, 0])
    assert ndcg_at(np.array([4.0, 3, 2, 1]), labels) == 1.0
    assert ndcg_at(np.array([1.0, 2, 3, 4]), labels) < 0.7


def test_synthetic_kernels_follow_table3_with_any_n():
    ks = synthetic_kernels(200, seed=3)
    assert all(64 <= k.m <= 2048 and 64 <= k.k <= 2048 and 32 <= k.n <= 2**19 for k in ks)
    # N spans real layers' (a classifier's few columns to a batch-32 stem's 400k), not only powers of two
    assert min(k.n for k in ks) < 128 and max(k.n for k in ks) > 100_000
    assert sum(k.n & (k.n - 1) != 0 for k in ks) > 150
    assert all(0.5 <= k.sparsity <= 0.98 for k in ks)
    assert ks == synthetic_kernels(200, seed=3)


def _toy(groups=60, per=30, seed=0):
    """Candidates whose 'time' is a known function of two Table 1 features."""
    rng = np.random.default_rng(seed)
    rows, times, gids = [], [], []
    for g in range(groups):
        for _ in range(per):
            r = {f: float(rng.integers(1, 100)) for f in FEATURES}
            rows.append(r)
            times.append((r["m1"] - 30) ** 2 + 3 * r["n1"] + rng.uniform(0, 5))
            gids.append(g)
    return feature_matrix(rows), np.array(times), np.array(gids), rows


def test_ranker_learns_a_known_order_and_round_trips(tmp_path):
    x, t, g, rows = _toy()
    trained = trained_ranker(x, t, g, RankerParams(n_estimators=80))
    assert trained.metadata["heldout_ndcg_at_10"] > 0.8
    meta = save_ranker(tmp_path / "r", trained.booster, {**trained.metadata, "timer": "toy"})
    booster, back = load_ranker(tmp_path / "r")
    assert back["version"] == meta["version"] and back["timer"] == "toy"
    group = rows[:30]
    scores, ranks = ranked(group, booster, top_k=5)
    assert sorted(ranks.tolist()) == list(range(1, 31))
    true_best = int(np.argmin(t[:30]))
    assert ranks[true_best] <= 10


def test_shipped_ranker_loads_and_says_how_it_was_made():
    booster, meta = load_ranker()
    assert booster.num_feature() == len(FEATURES)
    for key in ("timer", "device", "samples", "heldout_ndcg_at_10", "version"):
        assert key in meta


def test_design_features_come_from_the_rows_design_label():
    from lospmm.kernel.design import BASELINE, design_named
    from lospmm.stages.rank import DESIGN_FEATURES, design_features, ranks_designs

    wide = design_named("chained,column-x,walks=4,v=4")
    assert design_features(wide.label) == {"columns_per_thread": 4, "column_walks": 4, "column_x": 1, "chained": 1,
                                           "streamed": 0, "tiles_per_block": 1, "tile_warps": 1, "section_fmas": 0,
                                           "k_slices": 1}
    assert design_features(design_named("streamed,chained").label)["streamed"] == 1
    assert design_features("") == design_features(BASELINE.label)
    rows = [{f: 1.0 for f in FEATURES} | {"design": wide.label}, {f: 1.0 for f in FEATURES}]
    x = feature_matrix(rows, FEATURES + DESIGN_FEATURES)
    assert x[0, len(FEATURES):].tolist() == [4, 4, 1, 1, 0] and x[1, len(FEATURES):].tolist() == [1, 1, 0, 0, 0]
    assert feature_matrix(rows).shape == (2, len(FEATURES))  # Table 1's alone by default
    assert ranks_designs(FEATURES + DESIGN_FEATURES) and not ranks_designs(FEATURES)
    # staged candidates need a ranker trained on their blocking
    from lospmm.stages.rank import STAGED_FEATURES, chosen_candidates

    staged = [design_named("chained"), design_named("staged,tiles=8")]
    assert not ranks_designs(FEATURES + DESIGN_FEATURES, staged)
    assert ranks_designs(FEATURES + DESIGN_FEATURES + STAGED_FEATURES, staged)
    staged_rows = [rows[0], {f: 1.0 for f in FEATURES} | {"design": design_named("staged,tiles=8").label}]
    with pytest.raises(ValueError, match="the candidates span staged, split or sliced designs and the ranker was trained without them"):
        chosen_candidates(staged_rows, None, features=FEATURES + DESIGN_FEATURES)


def test_a_design_aware_ranker_learns_which_design_is_faster(tmp_path):
    from lospmm.kernel.design import BASELINE, design_named
    from lospmm.stages.rank import DESIGN_FEATURES, RankParams, chosen_candidates, ranker_features

    wide = design_named("chained,v=4")
    rng = np.random.default_rng(1)
    rows, times, gids = [], [], []
    for g in range(60):
        for _ in range(30):
            design = wide if rng.random() < 0.5 else BASELINE
            r = {f: float(rng.integers(1, 100)) for f in FEATURES} | {"design": design.label}
            rows.append(r)
            # the same tile is 3× faster in the wide design: only the design features can tell
            times.append(((r["m1"] - 30) ** 2 + 3 * r["n1"] + 10) / (3 if design is wide else 1))
            gids.append(g)
    names = FEATURES + DESIGN_FEATURES
    trained = trained_ranker(feature_matrix(rows, names), np.array(times), np.array(gids),
                             RankerParams(n_estimators=80), names=names)
    save_ranker(tmp_path / "r", trained.booster, {**trained.metadata, "timer": "toy"})
    booster, meta = load_ranker(tmp_path / "r")
    assert ranker_features(meta) == names
    tile = {f: 50.0 for f in FEATURES} | {"m1": 30.0, "n1": 10.0}
    group = [tile | {"design": BASELINE.label}, tile | {"design": wide.label}]
    _, ranks, chosen = chosen_candidates(group, booster, RankParams(top_k=1), names)
    assert ranks.tolist() == [2, 1] and chosen.tolist() == [False, True]


def test_a_ranker_of_one_design_refuses_candidates_of_several():
    import pytest

    from lospmm.kernel.design import design_named
    from lospmm.stages.rank import RankParams, chosen_candidates

    booster, meta = load_ranker()
    rows = [{f: 8.0 for f in FEATURES} | {"design": d} for d in ("", design_named("chained,v=4").label)]
    with pytest.raises(ValueError, match="design-aware"):
        chosen_candidates(rows, booster, RankParams(top_k=1))
    # one design (or the ranker left out) is fine
    assert chosen_candidates(rows[:1], booster, RankParams(top_k=1))[2].tolist() == [True]
    assert chosen_candidates(rows, None, RankParams(use_rank=False))[2].tolist() == [True, True]
