"""train-ranker's training set: the search's own candidates, timed by the run's Timer."""

from __future__ import annotations

import numpy as np

from lospmm.flows.training import candidate_rows, candidate_time
from lospmm.stages.constrain import layer_candidates
from lospmm.devices import device_named
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import FEATURES, SyntheticKernel, SyntheticParams
from lospmm.stages.reorder import tile_stats
from lospmm.search import layer_tiles
from lospmm.kernel.estimate import EstimateTimer
from lospmm.kernel.timing import LaunchUnderTest
from lospmm.stages.rank import SyntheticParams

H100 = device_named("h100")


def test_candidates_are_the_searchs_kept_ones_with_their_features():
    sk = SyntheticKernel(512, 256, 2048, 0.8, seed=5)
    rows = candidate_rows(sk, H100)
    a = random_pruned(sk.m, sk.k, sk.sparsity, np.random.default_rng(sk.seed))
    params = SyntheticParams()  # the training's own reorder (no partitioner), priced at the kernel's N
    tiles = layer_tiles(a, sk.n, params.m1, params.reorder)
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


def test_a_ranker_trains_on_a_devices_measured_launch_file_held_out_by_layer(tmp_path):
    """The committed H100 launch files: the full kernels' measured times, one group per (layer,
    sparsity), a layer held out at both sparsities, before/after figures in the metadata."""
    import json
    from pathlib import Path

    import numpy as np
    import pyarrow.parquet as pq

    from lospmm.flows.training import measured_ranker_name, train_measured_ranker
    from lospmm.stages.rank import RankerParams, held_out_groups, measured_rows

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-h100"
    files = [results / "b" / "launches-sample-0.9.parquet", results / "d" / "launches-sample-0.7.parquet"]
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    x, t, g, layer_of = measured_rows(rows)
    plain = [r for r in rows if r["role"] == "full" and not r["variant"]]
    assert len(t) == len(plain) == 194 and len(layer_of) == 20 and len(set(layer_of.values())) == 16
    first = next(r for r in plain if r["layer"] == "pooler.dense")
    row = x[int(np.flatnonzero(t == first["measured_us"])[0])]
    assert row[0] == len(first["tile_loads"]) and row[4] == sum(first["tile_loads"])  # num_a_tiles, nnc_sum
    held = held_out_groups(g, RankerParams(), layer_of)
    both = [gid for gid, lay in layer_of.items() if lay == ("resnet50", "layer1.0.conv1")]
    assert len(both) == 2 and (set(both) <= held or not set(both) & held)  # a layer's sparsities go together
    base, meta = train_measured_ranker(tmp_path / "measured", files)
    assert json.loads(base.with_suffix(".json").read_text())["version"] == meta["version"]
    assert meta["device"] == "NVIDIA H100 80GB HBM3" and meta["held_out_by"] == "layer"
    cv = meta["leave_one_layer_out"]
    assert cv["after"]["layers"] == 16 and all(0 <= cv[s]["ndcg_at_10"] <= 1 for s in ("before", "after"))
    # repeats of one measurement (b and c measured the same kernels) are one row each, at their median
    repeated = [r for f in (files[0], results / "c" / "launches-sample-0.9.parquet") for r in pq.read_table(f).to_pylist()]
    _, t2, g2, _ = measured_rows(repeated)
    assert len(t2) == 104 and len(np.unique(g2)) == 11
    # a file that is no measured launch list, and files from two devices, are refused in one line
    import shutil

    import pytest

    from lospmm.flows.training import measured_launches

    pq.write_table(pq.read_table(files[0]).drop(["tile_loads"]), tmp_path / "short.parquet")
    with pytest.raises(ValueError, match="short.parquet: not a measured launch file: no tile_loads column"):
        measured_launches([tmp_path / "short.parquet"])
    for name, gpu in (("x", "NVIDIA H100 80GB HBM3"), ("y", "NVIDIA H200")):
        (tmp_path / name).mkdir()
        shutil.copy(files[0], tmp_path / name / "l.parquet")
        (tmp_path / name / "env.json").write_text(json.dumps({"name": gpu, "nvidia_smi": f"{gpu}, 580.159.04"}))
    with pytest.raises(ValueError, match="measured on NVIDIA H200 .*train one ranker per device"):
        measured_launches([tmp_path / "x" / "l.parquet", tmp_path / "y" / "l.parquet"])
    assert measured_ranker_name({"device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04"}) == \
        "ranker-nvidia-h100-80gb-hbm3-580-159-04"
