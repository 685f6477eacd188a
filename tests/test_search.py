"""One layer's whole search (stages 3–7 and emit's choice), as train-ranker and the benchmarks call it."""

from __future__ import annotations

import numpy as np
import pytest

from lospmm.flows.storage.ranker_store import load_ranker
from lospmm.stages.cluster import proxy_active_blocks
from lospmm.devices import device_named
from lospmm.stages.pad import proxy_launch
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import RankParams
from lospmm.search import SearchParams, choice, layer_search, layer_tiles, proxy_sources, proxy_timings
from lospmm.status import Status
from lospmm.kernel.design import BASELINE
from lospmm.kernel.timing import Timing

H100 = device_named("h100")


@pytest.fixture(scope="module")
def layer():
    return random_pruned(768, 768, 0.9, np.random.default_rng(3))


def test_layer_search_composes_the_stages(layer):
    booster, _ = load_ranker()
    s = layer_search(layer, 4096, 0.9, H100, booster, SearchParams(m1s=(2, 8, 32), rank=RankParams(top_k=5)))
    assert set(s.tiles) == {2, 8, 32} and len(s.candidates) == 3 * 32
    assert [r.candidate for r in s.ranked] == s.kept and len(s.kept) > 5
    chosen = s.chosen
    assert len(chosen) == 5
    best = sorted(s.ranked, key=lambda r: -r.score)[:5]
    assert {(r.candidate.m1, r.candidate.n1) for r in best} == {(c.m1, c.n1) for c in chosen}
    label = BASELINE.label  # one design searched: every key names it
    assert set(s.clusters) == {(c.m1, label) for c in chosen}
    for (m1, _), cl in s.clusters.items():
        group = [c for c in chosen if c.m1 == m1]
        assert cl.num_clusters == min(s.tiles[m1].num_tiles, 3 * proxy_active_blocks(group, H100))
    assert set(s.launches) == {(c.m1, c.n1, label) for c in chosen}
    c = chosen[0]
    assert s.launches[(c.m1, c.n1, label)] == proxy_launch(c.num_a_tiles, 4096, c.m1, c.n1, c.pred_regs, H100)
    assert set(proxy_sources(s, 768, 768)) == set(s.clusters)


def test_without_the_ranker_every_kept_candidate_is_chosen(layer):
    s = layer_search(layer, 4096, 0.9, H100, None, SearchParams(m1s=(4, 16), rank=RankParams(use_rank=False)))
    assert s.chosen == s.kept


def test_an_all_zero_layer_has_no_candidates():
    import scipy.sparse as sp

    s = layer_search(sp.csr_matrix((64, 64), dtype=np.float32), 1024, 0.9, H100, None,
                     SearchParams(rank=RankParams(use_rank=False)))
    assert s.kept == [] and {c.removed_by for c in s.candidates} == {"empty"} and s.clusters == {}


def test_layer_tiles_keeps_each_distinct_m1_once(layer):
    few = random_pruned(5, 64, 0.5, np.random.default_rng(0))
    assert set(layer_tiles(few, 256, (1, 4, 8, 16))) == {1, 4, 5}


def test_choice_is_the_fastest_proxy_that_timed():
    t = {(8, 128, "a"): Timing("estimate", 5.0), (4, 64, "b"): Timing("estimate", 4.0),
         (2, 32, "a"): Timing("estimate", 1.0, Status.ERROR)}
    assert choice(t) == (4, 64, "b")
    assert choice({(2, 32, "a"): Timing("estimate", float("inf"), Status.ERROR)}) is None


def test_a_search_reports_seconds_per_stage(layer):
    booster, _ = load_ranker()
    params = SearchParams(m1s=(2, 8), rank=RankParams(top_k=5))
    first, second = (layer_search(layer, 4096, 0.9, H100, booster, params) for _ in range(2))
    assert list(first.seconds) == ["reorder", "constrain", "rank", "cluster", "pad"]
    assert all(s >= 0 for s in first.seconds.values()) and sum(first.seconds.values()) > 0
    assert [(c.m1, c.n1) for c in first.chosen] == [(c.m1, c.n1) for c in second.chosen]


def test_a_streamed_search_compiles_and_prices_its_own_proxies(layer):
    # the streamed design is searched like the baked ones: its proxies compile (no spill) and are timed
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateTimer

    design = design_named("streamed,chained")
    s = layer_search(layer, 4096, 0.9, H100, load_ranker()[0], SearchParams(m1s=(4, 16), design=design,
                                                                             rank=RankParams(top_k=4)))
    sources = proxy_sources(s, 768, 768)
    assert sources and all(k.name.startswith("lospmm_stream_proxy_") and k.spec.design == design
                           for k in sources.values())
    timings = proxy_timings(s, 768, 768, 4096, EstimateTimer(H100))
    assert set(timings) == {(c.m1, c.n1, design.label) for c in s.chosen}
    assert all(t.status == Status.OK and 0 < t.time_us < 1e4 for t in timings.values())
