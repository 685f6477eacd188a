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
        assert r["best_m1"] not in r["top_m1s"] or r["reach_loss"] < 0.5  # a 3-candidate top-K at its M1
    assert any(r["reach_loss"] > 0.05 for r in narrow)  # a ranker stuck at one M1 misses the cheapest
    # a top-K as large as the kept set reaches the cheapest, whatever the ranker
    wide = rr.reach_rows(["resnet50"], [0.9], [32], rankers, top_k=10_000, layers=layer)
    assert all(r["reach_loss"] == 0 for r in wide)
    table = rr.summary(narrow)
    assert [t["model"] for t in table] == ["resnet50", "resnet50", "all", "all"]
    assert table[-1]["worst loss"] == max(r["reach_loss"] for r in narrow if r["ranker"] == "tall")


def test_auto_prices_every_candidate_in_its_own_design_and_defaults_to_the_design_aware_ranker():
    from lospmm.devices import device_named
    from lospmm.flows.config import run_designs
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.search import full_kernel_time, layer_tiles
    from lospmm.stages.extract import ZooParams, zoo_shapes
    from lospmm.stages.prune import pruned_layer

    device = device_named("h100")
    timer, designs = estimate_timer(device), run_designs("auto")
    shape = next(s for s in zoo_shapes("mobilenetv2", ZooParams(cnn_batch=4)) if s.layer == "features.18")
    kept, prices, _ = rr.layer_prices(shape, 0.9, device, timer, designs)
    assert len({c.design for c in kept}) > 3
    matrix = pruned_layer(shape, 0.9).matrix
    tiles = layer_tiles(matrix, shape.n)
    # one candidate of each design, priced again by hand in its own design
    for design in {c.design for c in kept}:
        i = next(i for i, c in enumerate(kept) if c.design == design)
        c = kept[i]
        assert prices[i] == full_kernel_time(timer, matrix, tiles[c.m1], shape.m, shape.k, shape.n, c.n1,
                                             design_named(design))
    assert list(rr.loaded_rankers(None, "auto")) == ["ranker-designs"]
    assert list(rr.loaded_rankers(None, "fp16,baked,based,tile-x,walks=1,v=2")) == ["ranker-half"]
    assert list(rr.loaded_rankers(None, "chained")) == ["ranker"]


def test_two_rankers_of_one_name_are_kept_apart(tmp_path):
    """A model and its copy under another folder (before and after a retraining) are two rankers in
    the table, not one that silently replaced the other."""
    import shutil

    from lospmm.flows.storage.ranker_store import SHIPPED

    copy = tmp_path / "old" / SHIPPED.name
    copy.parent.mkdir()
    for suffix in (".txt", ".json"):
        shutil.copy(SHIPPED.with_suffix(suffix), copy.with_suffix(suffix))
    loaded = rr.loaded_rankers([str(copy), str(SHIPPED)], "chained")
    assert len(loaded) == 2 and set(loaded) == {str(copy), str(SHIPPED)}
    assert list(rr.loaded_rankers([str(SHIPPED)], "chained")) == ["ranker"]
