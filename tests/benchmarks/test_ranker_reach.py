"""The ranker's reach on real layers (benchmarks.ranker_reach): the loss of the top-K's cheapest
against every kept candidate's, by the estimate."""

from __future__ import annotations

import numpy as np

from benchmarks import ranker_reach as rr
from lospmm.stages.rank import FEATURES


class _PrefersM1:
    """A ranker that scores a candidate by how close its M1 is to `m1` (the features' order is FEATURES)."""

    def __init__(self, m1: int):
        self.m1 = m1

    def predict(self, x):
        return -np.abs(np.asarray(x)[:, FEATURES.index("m1")] - self.m1)


def test_the_reach_loss_is_the_top_ks_cheapest_over_every_kept_candidates():
    rankers = {"one": (_PrefersM1(1), FEATURES), "tall": (_PrefersM1(64), FEATURES)}
    layer = ("layer4.0.conv1",)  # 512 x 1024, N 6272 at batch 32: the estimate's cheapest is a mid M1
    narrow = rr.reach_rows(["resnet50"], [0.9], [32], rankers, top_k=3, layers=layer)
    assert {r["ranker"] for r in narrow} == {"one", "tall"} and all(r["layer"] == layer[0] for r in narrow)
    for r in narrow:
        assert r["reach_loss"] == r["top_us"] / r["best_us"] - 1 >= 0
        assert set(r["top_m1s"]) == ({1} if r["ranker"] == "one" else {64})
        assert (r["reach_loss"] == 0) == (r["best_m1"] in r["top_m1s"])
    assert any(r["reach_loss"] > 0.05 for r in narrow)  # a ranker stuck at one M1 misses the cheapest
    # a top-K as large as the kept set reaches the cheapest, whatever the ranker
    wide = rr.reach_rows(["resnet50"], [0.9], [32], rankers, top_k=10_000, layers=layer)
    assert all(r["reach_loss"] == 0 for r in wide)
    table = rr.summary(narrow)
    assert [t["model"] for t in table] == ["resnet50", "resnet50", "all", "all"]
    assert table[-1]["worst loss"] == max(r["reach_loss"] for r in narrow if r["ranker"] == "tall")
